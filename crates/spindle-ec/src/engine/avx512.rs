//! x86_64 AVX-512 kernels, 64 bytes per vector:
//! - `Gfni` (AVX512F + AVX512BW + GFNI): multiplication by a constant is one
//!   `vgf2p8affineqb` with the constant's 8x8 bit matrix ([`crate::gf::affine_matrix`]),
//!   broadcast from memory; two products and the accumulator are combined by one
//!   `vpternlogq` (three-way xor).
//! - `Avx512` (AVX512F + AVX512BW): the split-nibble `vpshufb` method of the AVX2 kernel on
//!   512-bit vectors, for AVX-512 CPUs without GFNI; `vpternlogq` merges the two lookups into
//!   the accumulator in one instruction.
//!
//! Row groups and column blocks are shared with the AVX2 kernels ([`super::x86::drive`]).
//! Chunks of at least [`super::STREAM_MIN_BYTES`] are written with non-temporal stores
//! (they would not stay in cache anyway, and this saves reading every destination line
//! before overwriting it).
//!
//! Tails: a final full step placed to end at the region's end (overlapping the previous
//! step, harmless because destinations never alias sources); regions shorter than one vector
//! use masked loads and stores.

use std::arch::x86_64::*;

use super::x86::drive;
use super::DotProduct;

/// Most destination rows per pass over the sources (32 vector registers).
pub(super) const GROUP_ROWS_MAX: usize = 8;

/// `vpternlogq` immediate for `a ^ b ^ c`.
pub(super) const XOR3: i32 = 0x96;

/// GFNI dot product of a whole job.
///
/// # Safety
/// AVX512F, AVX512BW and GFNI must be available; pointer contract of [`DotProduct::new`].
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(crate) unsafe fn dot_product_gfni(job: &DotProduct<'_>) {
    drive(job, GROUP_ROWS_MAX, |group, offset, len| {
        // SAFETY: features present (caller); `group` is a row subset of `job` and the
        // region is inside it, so the pointer contract carries over.
        unsafe { gfni_region(group, offset, len) }
    });
}

/// GFNI dot product of bytes `offset..offset + len` for a group of at most
/// [`GROUP_ROWS_MAX`] rows.
///
/// # Safety
/// AVX512F, AVX512BW and GFNI available; pointer contract of [`DotProduct::new`];
/// `offset + len <= job.len`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn gfni_region(group: &DotProduct<'_>, offset: usize, len: usize) {
    // SAFETY: forwarded; the arm matches the group's row count.
    unsafe {
        match group.dst.len() {
            1 => gfni_group::<1, 4>(group, offset, len),
            2 => gfni_group::<2, 4>(group, offset, len),
            3 => gfni_group::<3, 4>(group, offset, len),
            4 => gfni_group::<4, 4>(group, offset, len),
            5 => gfni_group::<5, 2>(group, offset, len),
            6 => gfni_group::<6, 2>(group, offset, len),
            7 => gfni_group::<7, 2>(group, offset, len),
            8 => gfni_group::<8, 2>(group, offset, len),
            n => unreachable!("row group of {n} rows"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn gfni_group<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    // SAFETY: contract forwarded; each kernel's length precondition is checked here.
    unsafe {
        if len >= 64 * LANES {
            gfni_kernel::<ROWS, LANES>(job, offset, len);
        } else if len >= 64 {
            gfni_kernel::<ROWS, 1>(job, offset, len);
        } else if len > 0 {
            gfni_short::<ROWS>(job, offset, len);
        }
    }
}

/// Product of 64 bytes with the coefficient whose affine matrix is at `matrix`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) fn gf_mul(data: __m512i, matrix: u64) -> __m512i {
    _mm512_gf2p8affine_epi64_epi8::<0>(data, _mm512_set1_epi64(matrix as i64))
}

/// # Safety
/// Features available, pointer contract, `job.dst.len() == ROWS`, `len >= 64 * LANES`,
/// `offset + len <= job.len`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn gfni_kernel<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    let step = 64 * LANES;
    assert!(job.dst.len() == ROWS && len >= step && offset + len <= job.len);
    let k = job.sources();
    let matrices = job.affine;
    let stream = len >= super::STREAM_MIN_BYTES;
    let last = offset + len - step;
    let mut pos = offset;
    loop {
        let mut acc = [[_mm512_setzero_si512(); LANES]; ROWS];
        let mut j = 0;
        // Two sources per round: acc ^= a * x ^ b * y in one ternary-logic instruction.
        while j + 2 <= k {
            let (first, second) = (job.src[j], job.src[j + 1]);
            let mut x = [_mm512_setzero_si512(); LANES];
            let mut y = [_mm512_setzero_si512(); LANES];
            for lane in 0..LANES {
                // SAFETY: `pos + step <= job.len`; sources are readable for `job.len` bytes.
                unsafe {
                    x[lane] = _mm512_loadu_si512(first.add(pos + 64 * lane).cast());
                    y[lane] = _mm512_loadu_si512(second.add(pos + 64 * lane).cast());
                }
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                let (a, b) = (matrices[r * k + j], matrices[r * k + j + 1]);
                for lane in 0..LANES {
                    row_acc[lane] = _mm512_ternarylogic_epi64::<XOR3>(
                        row_acc[lane],
                        gf_mul(x[lane], a),
                        gf_mul(y[lane], b),
                    );
                }
            }
            j += 2;
        }
        if j < k {
            let source = job.src[j];
            let mut x = [_mm512_setzero_si512(); LANES];
            for (lane, value) in x.iter_mut().enumerate() {
                // SAFETY: as above.
                *value = unsafe { _mm512_loadu_si512(source.add(pos + 64 * lane).cast()) };
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                let a = matrices[r * k + j];
                for lane in 0..LANES {
                    row_acc[lane] = _mm512_xor_si512(row_acc[lane], gf_mul(x[lane], a));
                }
            }
        }
        for (row_acc, &dst) in acc.iter().zip(job.dst) {
            for (lane, &value) in row_acc.iter().enumerate() {
                // SAFETY: destinations are writable for `job.len >= pos + step` bytes.
                unsafe { store(dst.add(pos + 64 * lane), value, stream) };
            }
        }
        if pos == last {
            break;
        }
        pos = (pos + step).min(last);
    }
    if stream {
        // Orders the non-temporal stores before whatever the caller does next.
        _mm_sfence();
    }
}

/// Stores 64 bytes, bypassing the caches if `stream` and the address is 64-byte aligned.
///
/// # Safety
/// `pointer` must be writable for 64 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store(pointer: *mut u8, value: __m512i, stream: bool) {
    // SAFETY: the caller guarantees 64 writable bytes; the streaming store is used only at
    // 64-byte aligned addresses, as it requires.
    unsafe {
        if stream && (pointer as usize).is_multiple_of(64) {
            _mm512_stream_si512(pointer.cast(), value);
        } else {
            _mm512_storeu_si512(pointer.cast(), value);
        }
    }
}

/// Fewer than 64 bytes: one masked step (masked-off bytes are neither read nor written).
///
/// # Safety
/// Features available, pointer contract, `job.dst.len() == ROWS`, `0 < len < 64`,
/// `offset + len <= job.len`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn gfni_short<const ROWS: usize>(job: &DotProduct<'_>, offset: usize, len: usize) {
    assert!(job.dst.len() == ROWS && len > 0 && len < 64 && offset + len <= job.len);
    let mask: __mmask64 = (1u64 << len) - 1;
    let k = job.sources();
    let mut acc = [_mm512_setzero_si512(); ROWS];
    for (j, &source) in job.src.iter().enumerate() {
        // SAFETY: only the `len` bytes selected by `mask` are read, all inside the source.
        let x = unsafe { _mm512_maskz_loadu_epi8(mask, source.add(offset).cast()) };
        for (r, row_acc) in acc.iter_mut().enumerate() {
            *row_acc = _mm512_xor_si512(*row_acc, gf_mul(x, job.affine[r * k + j]));
        }
    }
    for (value, &dst) in acc.iter().zip(job.dst) {
        // SAFETY: only the `len` bytes selected by `mask` are written, inside the destination.
        unsafe { _mm512_mask_storeu_epi8(dst.add(offset).cast(), mask, *value) };
    }
}

/// AVX-512 split-nibble dot product of a whole job.
///
/// # Safety
/// AVX512F and AVX512BW must be available; pointer contract of [`DotProduct::new`].
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn dot_product_avx512(job: &DotProduct<'_>) {
    drive(job, GROUP_ROWS_MAX, |group, offset, len| {
        // SAFETY: as in `dot_product_gfni`.
        unsafe {
            match group.dst.len() {
                1 => shuffle_group::<1, 4>(group, offset, len),
                2 => shuffle_group::<2, 4>(group, offset, len),
                3 => shuffle_group::<3, 2>(group, offset, len),
                4 => shuffle_group::<4, 2>(group, offset, len),
                5 => shuffle_group::<5, 2>(group, offset, len),
                6 => shuffle_group::<6, 2>(group, offset, len),
                7 => shuffle_group::<7, 1>(group, offset, len),
                8 => shuffle_group::<8, 1>(group, offset, len),
                n => unreachable!("row group of {n} rows"),
            }
        }
    });
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn shuffle_group<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    // SAFETY: contract forwarded; each kernel's length precondition is checked here.
    unsafe {
        if len >= 64 * LANES {
            shuffle_kernel::<ROWS, LANES, false>(job, offset, len);
        } else if len >= 64 {
            shuffle_kernel::<ROWS, 1, false>(job, offset, len);
        } else if len > 0 {
            shuffle_kernel::<ROWS, 1, true>(job, offset, len);
        }
    }
}

/// # Safety
/// Features available, pointer contract, `job.dst.len() == ROWS`, `offset + len <= job.len`,
/// and `len >= 64 * LANES` unless `SHORT` (then `LANES == 1` and `0 < len < 64`: one masked
/// step).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn shuffle_kernel<const ROWS: usize, const LANES: usize, const SHORT: bool>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    let step = 64 * LANES;
    if SHORT {
        assert!(LANES == 1 && len > 0 && len < 64);
    } else {
        assert!(len >= step);
    }
    assert!(job.dst.len() == ROWS && offset + len <= job.len);
    let mask: __mmask64 = if SHORT { (1u64 << len) - 1 } else { u64::MAX };
    let stream = !SHORT && len >= super::STREAM_MIN_BYTES;
    let k = job.sources();
    let nibble_mask = _mm512_set1_epi8(0x0f);
    let last = if SHORT { offset } else { offset + len - step };
    let mut pos = offset;
    loop {
        let mut acc = [[_mm512_setzero_si512(); LANES]; ROWS];
        for (j, &source) in job.src.iter().enumerate() {
            let mut low = [_mm512_setzero_si512(); LANES];
            let mut high = [_mm512_setzero_si512(); LANES];
            for lane in 0..LANES {
                // SAFETY: `pos + step <= job.len`, or in the short case only the `len` masked
                // bytes are read.
                let data =
                    unsafe { _mm512_maskz_loadu_epi8(mask, source.add(pos + 64 * lane).cast()) };
                low[lane] = _mm512_and_si512(data, nibble_mask);
                high[lane] = _mm512_and_si512(_mm512_srli_epi64::<4>(data), nibble_mask);
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r * k + j < tables.len()`; each table has 64 bytes, low products
                // at 0..16 and high products at 32..48.
                let (table_low, table_high) = unsafe {
                    let table = job.tables.as_ptr().add(r * k + j).cast::<u8>();
                    (
                        _mm512_broadcast_i32x4(_mm_loadu_si128(table.cast())),
                        _mm512_broadcast_i32x4(_mm_loadu_si128(table.add(32).cast())),
                    )
                };
                for lane in 0..LANES {
                    row_acc[lane] = _mm512_ternarylogic_epi64::<XOR3>(
                        row_acc[lane],
                        _mm512_shuffle_epi8(table_low, low[lane]),
                        _mm512_shuffle_epi8(table_high, high[lane]),
                    );
                }
            }
        }
        for (row_acc, &dst) in acc.iter().zip(job.dst) {
            for (lane, &value) in row_acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe {
                    if SHORT {
                        _mm512_mask_storeu_epi8(dst.add(pos + 64 * lane).cast(), mask, value);
                    } else {
                        store(dst.add(pos + 64 * lane), value, stream);
                    }
                }
            }
        }
        if pos == last {
            break;
        }
        pos = (pos + step).min(last);
    }
    if stream {
        _mm_sfence();
    }
}
