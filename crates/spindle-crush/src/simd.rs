//! AVX2 straw2 draw (x86_64 only; callers check for AVX2 at run time).
//!
//! Eight items are drawn per step: the rjenkins1 hash in 32-bit lanes, CRUSH's fixed-point
//! log as a gather from a 64 Ki-entry table of its exact values, and `ln / weight` as an
//! f64 division. The f64 quotient
//! is within 2^-5 of the exact rational value (|ln| < 2^48, weight >= 1, one correctly
//! rounded division), and Ceph's integer draw is that value truncated toward zero. So the
//! exact winner's approximate draw is within 1 + 2^-4 of the largest approximate draw;
//! every item inside that margin is re-drawn with the exact scalar integer code, in item
//! order, with Ceph's "first strictly greater wins" rule. Items outside the margin have a
//! strictly smaller exact draw and cannot win or tie. Result: bit-identical to scalar.

use std::arch::x86_64::*;

use crate::hash::{hash32_3, HASH_SEED};
use crate::ln::straw2_draw;
use crate::map::Bucket;

/// Largest bucket drawn with SIMD; bigger buckets use the scalar draw.
const MAX_SIMD_ITEMS: usize = 256;
/// Margin below the best approximate draw inside which exact re-checks happen.
pub(crate) const EXACT_MARGIN: f64 = 1.0625;

#[inline(always)] // only called from `#[target_feature(enable = "avx2")]` functions
unsafe fn mix(a: &mut __m256i, b: &mut __m256i, c: &mut __m256i) {
    macro_rules! step {
        ($x:expr, $y:expr, $z:expr, $shift:ident, $n:literal) => {
            *$x = _mm256_xor_si256(
                _mm256_sub_epi32(_mm256_sub_epi32(*$x, *$y), *$z),
                $shift::<$n>(*$z),
            );
        };
    }
    step!(a, b, c, _mm256_srli_epi32, 13);
    step!(b, c, a, _mm256_slli_epi32, 8);
    step!(c, a, b, _mm256_srli_epi32, 13);
    step!(a, b, c, _mm256_srli_epi32, 12);
    step!(b, c, a, _mm256_slli_epi32, 16);
    step!(c, a, b, _mm256_srli_epi32, 5);
    step!(a, b, c, _mm256_srli_epi32, 3);
    step!(b, c, a, _mm256_slli_epi32, 10);
    step!(c, a, b, _mm256_srli_epi32, 15);
}

/// `hash32_3(a, b, c)` lane by lane.
#[inline(always)] // only called from `#[target_feature(enable = "avx2")]` functions
pub(crate) unsafe fn hash32_3_x8(a: __m256i, b: __m256i, c: __m256i) -> __m256i {
    let (mut a, mut b, mut c) = (a, b, c);
    let mut hash = _mm256_xor_si256(
        _mm256_set1_epi32(HASH_SEED as i32),
        _mm256_xor_si256(a, _mm256_xor_si256(b, c)),
    );
    let mut xv = _mm256_set1_epi32(231_232);
    let mut yv = _mm256_set1_epi32(1232);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut c, &mut xv, &mut hash);
    mix(&mut yv, &mut a, &mut hash);
    mix(&mut b, &mut xv, &mut hash);
    mix(&mut yv, &mut c, &mut hash);
    hash
}

/// Exact conversion of u32 values (zero-extended to 64-bit lanes) to f64.
#[inline(always)] // only called from `#[target_feature(enable = "avx2")]` functions
unsafe fn u32_to_f64(v: __m128i) -> __m256d {
    const MAGIC: f64 = 4_503_599_627_370_496.0; // 2^52
    let magic_bits = _mm256_castpd_si256(_mm256_set1_pd(MAGIC));
    let wide = _mm256_cvtepu32_epi64(v);
    _mm256_sub_pd(
        _mm256_castsi256_pd(_mm256_or_si256(wide, magic_bits)),
        _mm256_set1_pd(MAGIC),
    )
}

/// `crush_ln(u) - 2^48` as f64 for every 16-bit `u` (exact: the values are integers
/// below 2^49). 512 KiB, built once from the integer function.
pub(crate) fn ln_f64_table() -> &'static [f64; 65536] {
    static TABLE: std::sync::OnceLock<Box<[f64; 65536]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let ints = crate::ln::ln_minus_one_table();
        let mut table = Box::new([0f64; 65536]);
        for (slot, &v) in table.iter_mut().zip(ints.iter()) {
            *slot = v as f64;
        }
        table
    })
}

/// Approximate straw2 draws (`(crush_ln(u) - 2^48) / w` in f64, -inf for zero weights)
/// of eight (x, item, r, weight) lanes, as two halves of four.
#[inline(always)] // only called from `#[target_feature(enable = "avx2")]` functions
pub(crate) unsafe fn approx_draws_x8(
    ln_table: &[f64; 65536],
    x: __m256i,
    items: __m256i,
    r: __m256i,
    w: __m256i,
) -> (__m256d, __m256d) {
    let u = _mm256_and_si256(hash32_3_x8(x, items, r), _mm256_set1_epi32(0xffff));
    let zero_w = _mm256_cmpeq_epi32(w, _mm256_setzero_si256());
    let neg_inf = _mm256_set1_pd(f64::NEG_INFINITY);
    let base = ln_table.as_ptr();
    let ln_lo = _mm256_i32gather_pd::<8>(base, _mm256_castsi256_si128(u));
    let ln_hi = _mm256_i32gather_pd::<8>(base, _mm256_extracti128_si256::<1>(u));
    let draw_lo = _mm256_div_pd(ln_lo, u32_to_f64(_mm256_castsi256_si128(w)));
    let draw_hi = _mm256_div_pd(ln_hi, u32_to_f64(_mm256_extracti128_si256::<1>(w)));
    let z_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(zero_w)));
    let z_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(zero_w)));
    (
        _mm256_blendv_pd(draw_lo, neg_inf, z_lo),
        _mm256_blendv_pd(draw_hi, neg_inf, z_hi),
    )
}

/// Approximate straw2 draws of eight items of one bucket for one (x, r).
#[inline(always)] // only called from `#[target_feature(enable = "avx2")]` functions
unsafe fn draws_x8(x: u32, r: u32, items: &[i32; 8], weights: &[u32; 8], out: &mut [f64; 8]) {
    let (lo, hi) = approx_draws_x8(
        ln_f64_table(),
        _mm256_set1_epi32(x as i32),
        _mm256_loadu_si256(items.as_ptr().cast()),
        _mm256_set1_epi32(r as i32),
        _mm256_loadu_si256(weights.as_ptr().cast()),
    );
    _mm256_storeu_pd(out.as_mut_ptr(), lo);
    _mm256_storeu_pd(out.as_mut_ptr().add(4), hi);
}

/// straw2 choice with AVX2; identical to `mapper::straw2_choose`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn straw2_choose_avx2(bucket: &Bucket, x: u32, r: u32) -> i32 {
    let size = bucket.size();
    if !(4..=MAX_SIMD_ITEMS).contains(&size) {
        return crate::mapper::straw2_choose(bucket, x, r);
    }
    let mut approx = [f64::NEG_INFINITY; MAX_SIMD_ITEMS];
    let mut best = f64::NEG_INFINITY;
    let mut start = 0;
    while start < size {
        let n = (size - start).min(8);
        let mut items = [0i32; 8];
        let mut weights = [0u32; 8];
        items[..n].copy_from_slice(&bucket.items[start..start + n]);
        weights[..n].copy_from_slice(&bucket.item_weights[start..start + n]);
        let mut out = [0f64; 8];
        draws_x8(x, r, &items, &weights, &mut out);
        for (slot, &d) in approx[start..start + n].iter_mut().zip(&out[..n]) {
            *slot = d;
            if d > best {
                best = d;
            }
        }
        start += n;
    }
    if best == f64::NEG_INFINITY {
        return bucket.items[0]; // every weight is zero: Ceph keeps the first item
    }
    let threshold = best - EXACT_MARGIN;
    let mut high: Option<(usize, i64)> = None;
    for (i, &a) in approx[..size].iter().enumerate() {
        if a < threshold {
            continue;
        }
        let u = hash32_3(x, bucket.items[i] as u32, r) & 0xffff;
        let draw = straw2_draw(u, bucket.item_weights[i]);
        match high {
            Some((_, h)) if draw <= h => {}
            _ => high = Some((i, draw)),
        }
    }
    let (index, _) = high.expect("the best approximate draw is always a candidate");
    bucket.items[index]
}

/// Running best/runner-up/index of one group of eight lanes (two halves of four f64).
#[derive(Clone, Copy)]
struct Best8 {
    best: [__m256d; 2],
    second: [__m256d; 2],
    index: [__m256d; 2],
}

/// The requests of one group of eight lanes: bucket span, x and r per lane.
#[derive(Clone, Copy)]
struct Lanes8 {
    offsets: __m256i,
    sizes: __m256i,
    x: __m256i,
    r: __m256i,
}

/// One group of eight lanes for item position `i`: draw and fold into the running best.
#[inline(always)] // only called from `step_avx2`
unsafe fn fold_group(
    acc: &mut Best8,
    ln_table: &[f64; 65536],
    plan: &crate::lanes::Plan,
    lanes: &Lanes8,
    i: i32,
) {
    let Lanes8 {
        offsets,
        sizes,
        x,
        r,
    } = *lanes;
    let i_v = _mm256_set1_epi32(i);
    let active = _mm256_cmpgt_epi32(sizes, i_v);
    let index = _mm256_and_si256(_mm256_add_epi32(offsets, i_v), active);
    let item_v = _mm256_mask_i32gather_epi32::<4>(
        _mm256_setzero_si256(),
        plan.flat_items.as_ptr(),
        index,
        active,
    );
    let w_v = _mm256_mask_i32gather_epi32::<4>(
        _mm256_setzero_si256(),
        plan.flat_weights.as_ptr().cast(),
        index,
        active,
    );
    let (lo, hi) = approx_draws_x8(ln_table, x, item_v, r, w_v);
    let i_f = _mm256_set1_pd(f64::from(i));
    for (h, draw) in [lo, hi].into_iter().enumerate() {
        // A tie also lands in the runner-up, so a near tie always goes to the exact code.
        let better = _mm256_cmp_pd::<_CMP_GT_OQ>(draw, acc.best[h]);
        acc.second[h] = _mm256_blendv_pd(_mm256_max_pd(acc.second[h], draw), acc.best[h], better);
        acc.best[h] = _mm256_blendv_pd(acc.best[h], draw, better);
        acc.index[h] = _mm256_blendv_pd(acc.index[h], i_f, better);
    }
}

/// The AVX2 step of the lane engine: one straw2 choice per lane (each lane in its own
/// bucket), computed for two groups of eight lanes side by side so that their hash chains
/// overlap, with an exact scalar re-check of any lane whose best draw does not lead its
/// runner-up by `EXACT_MARGIN`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn step_avx2(
    map: &crate::map::CrushMap,
    plan: &crate::lanes::Plan,
    requests: &[crate::lanes::Request; crate::lanes::LANES],
) -> [i32; crate::lanes::LANES] {
    const N: usize = crate::lanes::LANES;
    const _: () = assert!(N == 16, "step_avx2 handles two groups of eight lanes");
    let ln_table = ln_f64_table();
    let mut offsets = [0i32; N];
    let mut sizes = [0i32; N];
    let mut xs = [0i32; N];
    let mut rs = [0i32; N];
    let mut max_size = 0i32;
    for (l, req) in requests.iter().enumerate() {
        if req.active {
            let (offset, size) = plan.spans[req.bucket];
            offsets[l] = offset as i32;
            sizes[l] = size as i32;
            xs[l] = req.x;
            rs[l] = req.r;
            max_size = max_size.max(size as i32);
        }
    }
    let load = |a: &[i32; N], g: usize| _mm256_loadu_si256(a.as_ptr().add(8 * g).cast());
    let group = |g: usize| Lanes8 {
        offsets: load(&offsets, g),
        sizes: load(&sizes, g),
        x: load(&xs, g),
        r: load(&rs, g),
    };
    let (lanes0, lanes1) = (group(0), group(1));
    let neg_inf = _mm256_set1_pd(f64::NEG_INFINITY);
    let init = Best8 {
        best: [neg_inf; 2],
        second: [neg_inf; 2],
        index: [_mm256_setzero_pd(); 2],
    };
    let (mut g0, mut g1) = (init, init);
    for i in 0..max_size {
        fold_group(&mut g0, ln_table, plan, &lanes0, i);
        fold_group(&mut g1, ln_table, plan, &lanes1, i);
    }
    let mut best = [0f64; N];
    let mut second = [0f64; N];
    let mut idx = [0f64; N];
    for (g, acc) in [g0, g1].iter().enumerate() {
        for h in 0..2 {
            let at = 8 * g + 4 * h;
            _mm256_storeu_pd(best.as_mut_ptr().add(at), acc.best[h]);
            _mm256_storeu_pd(second.as_mut_ptr().add(at), acc.second[h]);
            _mm256_storeu_pd(idx.as_mut_ptr().add(at), acc.index[h]);
        }
    }
    let mut chosen = [0i32; N];
    for l in 0..N {
        let req = &requests[l];
        if !req.active || sizes[l] == 0 {
            continue;
        }
        chosen[l] = if best[l] - second[l] > EXACT_MARGIN {
            plan.flat_items[offsets[l] as usize + idx[l] as usize]
        } else if let Some(bucket) = map.buckets.get(req.bucket).and_then(Option::as_ref) {
            // Near tie, all-zero weights or a single item: Ceph's integer code decides.
            crate::mapper::straw2_choose(bucket, req.x as u32, req.r as u32)
        } else {
            plan.flat_items[offsets[l] as usize]
        };
    }
    chosen
}
