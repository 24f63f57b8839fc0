//! Fused encode + CRC32C with AVX-512, GFNI and VPCLMULQDQ: one pass over the stripe in
//! which every 64-byte block of every data chunk is loaded once into a register, multiplied
//! into the parity accumulators (GFNI) and folded into its chunk's CRC accumulator
//! (VPCLMULQDQ); each finished parity block is folded into its own CRC accumulator before it
//! is stored. No chunk is read a second time for its checksum.
//!
//! The CRC accumulators (one 512-bit [`Stream`] per chunk) live in a small array in L1; the
//! last `len % 64` bytes of every chunk are encoded with masked GFNI steps and checksummed
//! with the `crc32` instruction after the accumulators are reduced.

use std::arch::x86_64::*;

use super::avx512::{gf_mul, gfni_region, store, GROUP_ROWS_MAX, XOR3};
use super::x86::row_groups;
use super::DotProduct;
use crate::crc32c::fold::Stream;
use crate::MAX_TOTAL_CHUNKS;

/// Encodes `job` (k sources, m parity destinations) and writes the CRC32C of the k data and
/// m parity chunks to `crcs`.
///
/// # Safety
/// AVX512F, AVX512BW, GFNI, VPCLMULQDQ, PCLMULQDQ and SSE4.2 must be available; pointer
/// contract of [`DotProduct::new`].
#[target_feature(enable = "avx512f,avx512bw,gfni,vpclmulqdq,pclmulqdq,sse4.2")]
pub(crate) unsafe fn encode_with_crc(job: &DotProduct<'_>, crcs: &mut [u32]) {
    let (k, m, len) = (job.sources(), job.dst.len(), job.len);
    assert_eq!(crcs.len(), k + m);
    let body = len / 64 * 64;
    let mut streams = [Stream::fresh(); MAX_TOTAL_CHUNKS];
    let (source_streams, parity_streams) = streams.split_at_mut(k);
    for (g, (first, count)) in row_groups(m, GROUP_ROWS_MAX).enumerate() {
        let group = job.rows(first, count);
        let parity = &mut parity_streams[first..first + count];
        // Only the first pass over the data feeds the data CRCs.
        let sources = if g == 0 {
            Some(&mut *source_streams)
        } else {
            None
        };
        // SAFETY: features present (caller); `group` is a row subset of `job`; `body <= len`.
        unsafe {
            match count {
                1 => fused_group::<1, 4>(&group, sources, parity, body),
                2 => fused_group::<2, 4>(&group, sources, parity, body),
                3 => fused_group::<3, 2>(&group, sources, parity, body),
                4 => fused_group::<4, 2>(&group, sources, parity, body),
                5 => fused_group::<5, 2>(&group, sources, parity, body),
                6 => fused_group::<6, 2>(&group, sources, parity, body),
                7 => fused_group::<7, 2>(&group, sources, parity, body),
                8 => fused_group::<8, 2>(&group, sources, parity, body),
                n => unreachable!("row group of {n} rows"),
            }
            if body < len {
                gfni_region(&group, body, len - body);
            }
        }
    }
    let chunks = job
        .src
        .iter()
        .copied()
        .chain(job.dst.iter().map(|&d| d.cast_const()));
    for ((crc, stream), chunk) in crcs.iter_mut().zip(&streams[..k + m]).zip(chunks) {
        // SAFETY: every chunk is readable for `len` bytes, and the parity tails were written
        // just above (no other reference to them is live).
        let tail = unsafe { std::slice::from_raw_parts(chunk.add(body), len - body) };
        *crc = !crate::crc32c::update(crate::crc32c::CrcEngine::Sse42, stream.register(), tail);
    }
}

/// Runs the fused kernel over `0..body` (a multiple of 64): `LANES` vectors per step, then
/// single vectors for the remainder.
///
/// # Safety
/// As for [`encode_with_crc`]; `group.dst.len() == ROWS == parity.len()`,
/// `sources.len() == group.sources()` when given, `body % 64 == 0`, `body <= group.len`.
#[target_feature(enable = "avx512f,avx512bw,gfni,vpclmulqdq")]
unsafe fn fused_group<const ROWS: usize, const LANES: usize>(
    group: &DotProduct<'_>,
    mut sources: Option<&mut [Stream]>,
    parity: &mut [Stream],
    body: usize,
) {
    assert!(body.is_multiple_of(64) && body <= group.len);
    let wide = body / (64 * LANES) * (64 * LANES);
    // SAFETY: forwarded; both ranges are whole steps inside `0..body`.
    unsafe {
        fused_kernel::<ROWS, LANES>(group, sources.as_deref_mut(), parity, 0, wide);
        fused_kernel::<ROWS, 1>(group, sources, parity, wide, body);
    }
}

/// # Safety
/// As for [`fused_group`]; `(end - start) % (64 * LANES) == 0`, `end <= group.len`.
#[target_feature(enable = "avx512f,avx512bw,gfni,vpclmulqdq")]
unsafe fn fused_kernel<const ROWS: usize, const LANES: usize>(
    group: &DotProduct<'_>,
    mut sources: Option<&mut [Stream]>,
    parity: &mut [Stream],
    start: usize,
    end: usize,
) {
    let step = 64 * LANES;
    let k = group.sources();
    assert!(group.dst.len() == ROWS && parity.len() == ROWS);
    assert!((end - start).is_multiple_of(step) && end <= group.len);
    assert!(sources.as_ref().is_none_or(|s| s.len() == k));
    let matrices = group.affine;
    let fold_constants = Stream::constants();
    let stream_stores = group.len >= super::STREAM_MIN_BYTES;
    let mut pos = start;
    while pos < end {
        let mut acc = [[_mm512_setzero_si512(); LANES]; ROWS];
        let mut j = 0;
        while j < k {
            let pair = j + 1 < k;
            let mut x = [_mm512_setzero_si512(); LANES];
            let mut y = [_mm512_setzero_si512(); LANES];
            for lane in 0..LANES {
                // SAFETY: `pos + step <= end <= group.len`; sources are readable for
                // `group.len` bytes.
                unsafe {
                    x[lane] = _mm512_loadu_si512(group.src[j].add(pos + 64 * lane).cast());
                    if pair {
                        y[lane] = _mm512_loadu_si512(group.src[j + 1].add(pos + 64 * lane).cast());
                    }
                }
            }
            if let Some(streams) = sources.as_deref_mut() {
                for lane in 0..LANES {
                    streams[j].consume(x[lane], fold_constants);
                    if pair {
                        streams[j + 1].consume(y[lane], fold_constants);
                    }
                }
            }
            for (r, row_acc) in acc.iter_mut().enumerate() {
                if pair {
                    let (a, b) = (matrices[r * k + j], matrices[r * k + j + 1]);
                    for lane in 0..LANES {
                        row_acc[lane] = _mm512_ternarylogic_epi64::<XOR3>(
                            row_acc[lane],
                            gf_mul(x[lane], a),
                            gf_mul(y[lane], b),
                        );
                    }
                } else {
                    let a = matrices[r * k + j];
                    for lane in 0..LANES {
                        row_acc[lane] = _mm512_xor_si512(row_acc[lane], gf_mul(x[lane], a));
                    }
                }
            }
            j += if pair { 2 } else { 1 };
        }
        for ((row_acc, &dst), stream) in acc.iter().zip(group.dst).zip(parity.iter_mut()) {
            for (lane, &value) in row_acc.iter().enumerate() {
                stream.consume(value, fold_constants);
                // SAFETY: destinations are writable for `group.len >= pos + step` bytes.
                unsafe { store(dst.add(pos + 64 * lane), value, stream_stores) };
            }
        }
        pos += step;
    }
    if stream_stores {
        _mm_sfence();
    }
}
