//! AVX2 straw2 draw (x86_64 only; callers check for AVX2 at run time).
//!
//! Eight items are drawn per step: the rjenkins1 hash in 32-bit lanes, CRUSH's fixed-point
//! log with 64-bit table gathers, and `ln / weight` as an f64 division. The f64 quotient
//! is within 2^-5 of the exact rational value (|ln| < 2^48, weight >= 1, one correctly
//! rounded division), and Ceph's integer draw is that value truncated toward zero. So the
//! exact winner's approximate draw is within 1 + 2^-4 of the largest approximate draw;
//! every item inside that margin is re-drawn with the exact scalar integer code, in item
//! order, with Ceph's "first strictly greater wins" rule. Items outside the margin have a
//! strictly smaller exact draw and cannot win or tie. Result: bit-identical to scalar.

use std::arch::x86_64::*;

use crate::hash::{hash32_3, HASH_SEED};
use crate::ln::straw2_draw;
use crate::ln_tables::{LL_TBL, RH_LH_TBL};
use crate::map::Bucket;

/// Largest bucket drawn with SIMD; bigger buckets use the scalar draw.
const MAX_SIMD_ITEMS: usize = 256;
/// Margin below the best approximate draw inside which exact re-checks happen.
const EXACT_MARGIN: f64 = 1.0625;

#[inline(always)]
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

/// `hash32_3(x, item, r)` for eight items.
#[inline(always)]
unsafe fn hash32_3_x8(x: u32, items: __m256i, r: u32) -> __m256i {
    let mut a = _mm256_set1_epi32(x as i32);
    let mut b = items;
    let mut c = _mm256_set1_epi32(r as i32);
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

/// `crush_ln(u) - 2^48` for four 64-bit lanes given the normalized input and exponent.
#[inline(always)]
unsafe fn ln_minus_one_x4(xn: __m128i, iexpon: __m128i) -> __m256i {
    let xn64 = _mm256_cvtepu32_epi64(xn);
    let index1 = _mm256_sub_epi64(
        _mm256_slli_epi64::<1>(_mm256_srli_epi64::<8>(xn64)),
        _mm256_set1_epi64x(256),
    );
    let base = RH_LH_TBL.as_ptr();
    let rh = _mm256_i64gather_epi64::<8>(base, index1);
    let lh = _mm256_i64gather_epi64::<8>(base.add(1), index1);
    // xn < 2^17 and rh < 2^49 with a product < 2^64: two 32x32 multiplies suffice.
    let lo = _mm256_mul_epu32(xn64, rh);
    let hi = _mm256_slli_epi64::<32>(_mm256_mul_epu32(xn64, _mm256_srli_epi64::<32>(rh)));
    let xl = _mm256_srli_epi64::<48>(_mm256_add_epi64(lo, hi));
    let index2 = _mm256_and_si256(xl, _mm256_set1_epi64x(0xff));
    let ll = _mm256_i64gather_epi64::<8>(LL_TBL.as_ptr(), index2);
    let exponent = _mm256_slli_epi64::<44>(_mm256_cvtepu32_epi64(iexpon));
    let ln = _mm256_add_epi64(exponent, _mm256_srli_epi64::<4>(_mm256_add_epi64(lh, ll)));
    _mm256_sub_epi64(ln, _mm256_set1_epi64x(1 << 48))
}

/// Exact conversion of i64 lanes in [-2^51, 2^51] to f64.
#[inline(always)]
unsafe fn i64_to_f64(v: __m256i) -> __m256d {
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 2^52 + 2^51
    let magic_bits = _mm256_castpd_si256(_mm256_set1_pd(MAGIC));
    _mm256_sub_pd(
        _mm256_castsi256_pd(_mm256_add_epi64(v, magic_bits)),
        _mm256_set1_pd(MAGIC),
    )
}

/// Exact conversion of u32 values (zero-extended to 64-bit lanes) to f64.
#[inline(always)]
unsafe fn u32_to_f64(v: __m128i) -> __m256d {
    const MAGIC: f64 = 4_503_599_627_370_496.0; // 2^52
    let magic_bits = _mm256_castpd_si256(_mm256_set1_pd(MAGIC));
    let wide = _mm256_cvtepu32_epi64(v);
    _mm256_sub_pd(
        _mm256_castsi256_pd(_mm256_or_si256(wide, magic_bits)),
        _mm256_set1_pd(MAGIC),
    )
}

/// Approximate straw2 draws of eight items (-inf for zero weights).
#[inline(always)]
unsafe fn draws_x8(x: u32, r: u32, items: &[i32; 8], weights: &[u32; 8], out: &mut [f64; 8]) {
    let items_v = _mm256_loadu_si256(items.as_ptr().cast());
    let u = _mm256_and_si256(hash32_3_x8(x, items_v, r), _mm256_set1_epi32(0xffff));
    let xv = _mm256_add_epi32(u, _mm256_set1_epi32(1));
    // floor(log2(x)) from the exponent of the exactly converted float.
    let exp = _mm256_sub_epi32(
        _mm256_srli_epi32::<23>(_mm256_castps_si256(_mm256_cvtepi32_ps(xv))),
        _mm256_set1_epi32(127),
    );
    let shift = _mm256_max_epi32(
        _mm256_sub_epi32(_mm256_set1_epi32(15), exp),
        _mm256_setzero_si256(),
    );
    let xn = _mm256_sllv_epi32(xv, shift);
    let iexpon = _mm256_sub_epi32(_mm256_set1_epi32(15), shift);
    let w = _mm256_loadu_si256(weights.as_ptr().cast());
    let zero_w = _mm256_cmpeq_epi32(w, _mm256_setzero_si256());
    let neg_inf = _mm256_set1_pd(f64::NEG_INFINITY);
    for half in 0..2 {
        let (xn_h, ie_h, w_h, z_h) = if half == 0 {
            (
                _mm256_castsi256_si128(xn),
                _mm256_castsi256_si128(iexpon),
                _mm256_castsi256_si128(w),
                _mm256_castsi256_si128(zero_w),
            )
        } else {
            (
                _mm256_extracti128_si256::<1>(xn),
                _mm256_extracti128_si256::<1>(iexpon),
                _mm256_extracti128_si256::<1>(w),
                _mm256_extracti128_si256::<1>(zero_w),
            )
        };
        let ln = i64_to_f64(ln_minus_one_x4(xn_h, ie_h));
        let draw = _mm256_div_pd(ln, u32_to_f64(w_h));
        let mask = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(z_h));
        let draw = _mm256_blendv_pd(draw, neg_inf, mask);
        _mm256_storeu_pd(out.as_mut_ptr().add(half * 4), draw);
    }
}

/// straw2 choice with AVX2; identical to `mapper::straw2_choose`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn straw2_choose_avx2(bucket: &Bucket, x: u32, r: u32) -> i32 {
    let size = bucket.size();
    if size > MAX_SIMD_ITEMS || size < 4 {
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
