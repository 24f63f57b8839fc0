//! x86_64 split-nibble kernels (SSSE3 `pshufb`, AVX2 `vpshufb`).
//!
//! Multiplying a byte x by a constant c is `low[x & 15] ^ high[x >> 4]`, two 16-entry table
//! lookups that `pshufb` does for 16 (SSSE3) or 32 (AVX2) bytes at once. A *group* of up to
//! four destination rows is computed per pass over the sources: for each block of `LANES`
//! vectors, every source is loaded once, split into nibbles once, and multiplied into all the
//! accumulators of the group, which stay in registers (ISA-L's `gf_Nvect_dot_prod` idea, here
//! with two to four vectors per source and row to amortise the table loads). The accumulators
//! are stored once per block.
//!
//! The AVX2 kernel writes chunks of at least [`super::STREAM_MIN_BYTES`] with non-temporal
//! stores (no read-for-ownership of destination lines that would not stay cached anyway).
//!
//! Tails: a kernel needs at least one full block; the last block of a region is placed to end
//! exactly at the region's end, overlapping the previous one. Recomputing the overlap writes
//! the same bytes again, which is harmless because destinations never alias sources. Regions
//! shorter than one vector go to the scalar kernel.
//!
//! AVX-512 and GFNI (`gf2p8mulb`/`gf2p8affineqb`) kernels are not written: the development
//! and benchmark machine (AMD Zen 3) has neither, and untested kernels are not shipped.

use std::arch::x86_64::*;

use super::{for_each_column_block, scalar, DotProduct, NibbleTable};

/// Most destination rows computed per pass (accumulators held in registers).
const GROUP_ROWS_MAX: usize = 4;

/// Target bytes of source data per column block when a job needs several passes (more than
/// [`GROUP_ROWS_MAX`] rows): small enough that later passes read the sources from L1/L2.
const MULTI_PASS_SOURCE_BYTES: usize = 24 * 1024;

/// Splits `rows` into `ceil(rows / group_rows_max)` groups of as equal size as possible,
/// returned as `(first_row, row_count)`.
pub(super) fn row_groups(
    rows: usize,
    group_rows_max: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let groups = rows.div_ceil(group_rows_max).max(1);
    (0..groups).map(move |g| {
        let first = g * rows / groups;
        let end = (g + 1) * rows / groups;
        (first, end - first)
    })
}

/// Shared driver: splits rows into groups and columns into blocks when more than one pass is
/// needed, and calls `group(sub_job, offset, len)` for every (group, block).
pub(super) fn drive(
    job: &DotProduct<'_>,
    group_rows_max: usize,
    mut group: impl FnMut(&DotProduct<'_>, usize, usize),
) {
    let rows = job.dst.len();
    if rows <= group_rows_max {
        group(job, 0, job.len);
        return;
    }
    let block = (MULTI_PASS_SOURCE_BYTES / job.sources()).max(256) & !63;
    for_each_column_block(job.len, block, 256, |offset, len| {
        for (first, count) in row_groups(rows, group_rows_max) {
            group(&job.rows(first, count), offset, len);
        }
    });
}

/// AVX2 dot product of a whole job.
///
/// # Safety
/// AVX2 must be available and the pointer contract of [`DotProduct::new`] must hold.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot_product_avx2(job: &DotProduct<'_>) {
    drive(job, GROUP_ROWS_MAX, |group, offset, len| {
        // SAFETY: AVX2 present (caller); `group` is a row subset of `job` and
        // `offset + len <= job.len`, so the pointer contract carries over.
        unsafe {
            match group.dst.len() {
                1 => avx2_group::<1, 4>(group, offset, len),
                2 => avx2_group::<2, 3>(group, offset, len),
                3 => avx2_group::<3, 2>(group, offset, len),
                4 => avx2_group::<4, 2>(group, offset, len),
                n => unreachable!("row group of {n} rows"),
            }
        }
    });
}

/// Picks the widest kernel that fits the region, falling back to one vector per step and
/// then to scalar code for regions shorter than a vector.
#[target_feature(enable = "avx2")]
unsafe fn avx2_group<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    // SAFETY (all three): contract forwarded from the caller; each kernel's length
    // precondition is checked by the branch that selects it.
    unsafe {
        if len >= 32 * LANES {
            avx2_kernel::<ROWS, LANES>(job, offset, len);
        } else if len >= 32 {
            avx2_kernel::<ROWS, 1>(job, offset, len);
        } else {
            scalar::dot_product_range(job, offset, len);
        }
    }
}

/// `ROWS` destination rows, `LANES` 32-byte vectors per step, over `offset..offset + len`.
///
/// # Safety
/// AVX2 available, pointer contract of [`DotProduct::new`], `job.dst.len() == ROWS`,
/// `len >= 32 * LANES` and `offset + len <= job.len`.
#[target_feature(enable = "avx2")]
unsafe fn avx2_kernel<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    let step = 32 * LANES;
    assert!(job.dst.len() == ROWS && len >= step && offset + len <= job.len);
    let k = job.sources();
    let tables: *const NibbleTable = job.tables.as_ptr();
    let mask = _mm256_set1_epi8(0x0f);
    let stream = len >= super::STREAM_MIN_BYTES;
    let last = offset + len - step;
    let mut pos = offset;
    loop {
        let mut acc = [[_mm256_setzero_si256(); LANES]; ROWS];
        for (j, &src) in job.src.iter().enumerate() {
            let mut low = [_mm256_setzero_si256(); LANES];
            let mut high = [_mm256_setzero_si256(); LANES];
            for lane in 0..LANES {
                // SAFETY: `pos + step <= offset + len <= job.len` and `src` is readable for
                // `job.len` bytes.
                let data = unsafe { _mm256_loadu_si256(src.add(pos + 32 * lane).cast()) };
                low[lane] = _mm256_and_si256(data, mask);
                high[lane] = _mm256_and_si256(_mm256_srli_epi64::<4>(data), mask);
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r * k + j < ROWS * k == tables.len()`; each table is 64 bytes.
                let (table_low, table_high) = unsafe {
                    let table = tables.add(r * k + j).cast::<u8>();
                    (
                        _mm256_loadu_si256(table.cast()),
                        _mm256_loadu_si256(table.add(32).cast()),
                    )
                };
                for lane in 0..LANES {
                    row_acc[lane] =
                        _mm256_xor_si256(row_acc[lane], _mm256_shuffle_epi8(table_low, low[lane]));
                    row_acc[lane] = _mm256_xor_si256(
                        row_acc[lane],
                        _mm256_shuffle_epi8(table_high, high[lane]),
                    );
                }
            }
        }
        for (row_acc, &dst) in acc.iter().zip(job.dst) {
            for (lane, &value) in row_acc.iter().enumerate() {
                let pointer = dst.wrapping_add(pos + 32 * lane);
                // SAFETY: `dst` is writable for `job.len >= pos + step` bytes; the streaming
                // store is used only at 32-byte aligned addresses, as it requires.
                unsafe {
                    if stream && (pointer as usize).is_multiple_of(32) {
                        _mm256_stream_si256(pointer.cast(), value);
                    } else {
                        _mm256_storeu_si256(pointer.cast(), value);
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
        // Orders the non-temporal stores before whatever the caller does next.
        _mm_sfence();
    }
}

/// SSSE3 dot product of a whole job.
///
/// # Safety
/// SSSE3 must be available and the pointer contract of [`DotProduct::new`] must hold.
#[target_feature(enable = "ssse3")]
pub(crate) unsafe fn dot_product_ssse3(job: &DotProduct<'_>) {
    drive(job, GROUP_ROWS_MAX, |group, offset, len| {
        // SAFETY: as in `dot_product_avx2`, with SSSE3 present.
        unsafe {
            match group.dst.len() {
                1 => ssse3_group::<1, 4>(group, offset, len),
                2 => ssse3_group::<2, 3>(group, offset, len),
                3 => ssse3_group::<3, 2>(group, offset, len),
                4 => ssse3_group::<4, 2>(group, offset, len),
                n => unreachable!("row group of {n} rows"),
            }
        }
    });
}

#[target_feature(enable = "ssse3")]
unsafe fn ssse3_group<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    // SAFETY: as in `avx2_group`.
    unsafe {
        if len >= 16 * LANES {
            ssse3_kernel::<ROWS, LANES>(job, offset, len);
        } else if len >= 16 {
            ssse3_kernel::<ROWS, 1>(job, offset, len);
        } else {
            scalar::dot_product_range(job, offset, len);
        }
    }
}

/// The 128-bit twin of [`avx2_kernel`]; tables use bytes 0..16 (low) and 32..48 (high).
///
/// # Safety
/// SSSE3 available, pointer contract of [`DotProduct::new`], `job.dst.len() == ROWS`,
/// `len >= 16 * LANES` and `offset + len <= job.len`.
#[target_feature(enable = "ssse3")]
unsafe fn ssse3_kernel<const ROWS: usize, const LANES: usize>(
    job: &DotProduct<'_>,
    offset: usize,
    len: usize,
) {
    let step = 16 * LANES;
    assert!(job.dst.len() == ROWS && len >= step && offset + len <= job.len);
    let k = job.sources();
    let tables: *const NibbleTable = job.tables.as_ptr();
    let mask = _mm_set1_epi8(0x0f);
    let last = offset + len - step;
    let mut pos = offset;
    loop {
        let mut acc = [[_mm_setzero_si128(); LANES]; ROWS];
        for (j, &src) in job.src.iter().enumerate() {
            let mut low = [_mm_setzero_si128(); LANES];
            let mut high = [_mm_setzero_si128(); LANES];
            for lane in 0..LANES {
                // SAFETY: `pos + step <= job.len`; `src` readable for `job.len` bytes.
                let data = unsafe { _mm_loadu_si128(src.add(pos + 16 * lane).cast()) };
                low[lane] = _mm_and_si128(data, mask);
                high[lane] = _mm_and_si128(_mm_srli_epi64::<4>(data), mask);
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r * k + j < tables.len()`; each table is 64 bytes.
                let (table_low, table_high) = unsafe {
                    let table = tables.add(r * k + j).cast::<u8>();
                    (
                        _mm_loadu_si128(table.cast()),
                        _mm_loadu_si128(table.add(32).cast()),
                    )
                };
                for lane in 0..LANES {
                    row_acc[lane] =
                        _mm_xor_si128(row_acc[lane], _mm_shuffle_epi8(table_low, low[lane]));
                    row_acc[lane] =
                        _mm_xor_si128(row_acc[lane], _mm_shuffle_epi8(table_high, high[lane]));
                }
            }
        }
        for (row_acc, &dst) in acc.iter().zip(job.dst) {
            for (lane, &value) in row_acc.iter().enumerate() {
                // SAFETY: `dst` is writable for `job.len >= pos + step` bytes.
                unsafe { _mm_storeu_si128(dst.add(pos + 16 * lane).cast(), value) };
            }
        }
        if pos == last {
            break;
        }
        pos = (pos + step).min(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_groups_cover_all_rows() {
        for rows in 1..=64 {
            let groups: Vec<_> = row_groups(rows, GROUP_ROWS_MAX).collect();
            let mut next = 0;
            for &(first, count) in &groups {
                assert_eq!(first, next);
                assert!((1..=GROUP_ROWS_MAX).contains(&count));
                next += count;
            }
            assert_eq!(next, rows);
        }
    }
}
