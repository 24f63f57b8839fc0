//! CRUSH's fixed-point logarithm, `crush_ln(x) ~ 2^44 * log2(x + 1)`, used by straw2.
//!
//! Invariant: bit-identical to Ceph's `crush_ln` for every input in `0..=0xffff`
//! (the only inputs straw2 passes); the tables are Ceph's constants (see `ln_tables.rs`).

use crate::ln_tables::{LL_TBL, RH_LH_TBL};

/// Returns `2^44 * log2(xin + 1)` in CRUSH's fixed-point approximation.
/// `xin` must be at most 0xffff (straw2 masks its hash to 16 bits).
#[inline]
pub fn crush_ln(xin: u32) -> u64 {
    debug_assert!(xin <= 0xffff, "crush_ln input out of range: {xin:#x}");
    let mut x = xin + 1;
    // Normalize so that bit 15 or 16 is set.
    let mut iexpon: u64 = 15;
    if x & 0x18000 == 0 {
        let shift = x.leading_zeros() - 16; // brings the top bit to position 15
        x <<= shift;
        iexpon -= u64::from(shift);
    }
    let index1 = ((x >> 8) << 1) as usize;
    let rh = RH_LH_TBL[index1 - 256] as u64;
    let lh = RH_LH_TBL[index1 + 1 - 256] as u64;
    let xl64 = u64::from(x).wrapping_mul(rh) >> 48;
    let x1 = xl64 as u32;
    let mut result = iexpon << 44;
    let index2 = (x1 & 0xff) as usize;
    let ll = LL_TBL[index2] as u64;
    let lh = lh.wrapping_add(ll) >> (48 - 12 - 32);
    result = result.wrapping_add(lh);
    result
}

/// `crush_ln(u) - 2^48` for every 16-bit `u` (the numerator of every straw2 draw),
/// computed once from [`crush_ln`]: one 512 KiB table load replaces the normalization,
/// three table lookups and the multiply on the hot path.
pub fn ln_minus_one_table() -> &'static [i64; 65536] {
    static TABLE: std::sync::OnceLock<Box<[i64; 65536]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Box::new([0i64; 65536]);
        for (u, slot) in table.iter_mut().enumerate() {
            *slot = crush_ln(u as u32) as i64 - 0x1_0000_0000_0000;
        }
        table
    })
}

/// The straw2 draw of one item: `(crush_ln(u) - 2^48) / weight`, or `i64::MIN` for a
/// zero weight. `u` is the 16-bit hash.
#[inline]
pub fn straw2_draw(u: u32, weight: u32) -> i64 {
    if weight == 0 {
        return i64::MIN;
    }
    let ln = crush_ln(u) as i64 - 0x1_0000_0000_0000;
    ln / i64::from(weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crush_ln_is_monotonic_and_bounded() {
        let mut previous = crush_ln(0);
        assert_eq!(previous, 0, "log2(1) is 0");
        // Ceph's approximation is monotonic up to 0xfffe; at 0xffff (input 2^16) it takes
        // the exact power-of-two path and lands a hair below its neighbour.
        for x in 1..=0xfffe {
            let v = crush_ln(x);
            assert!(v >= previous, "crush_ln must not decrease at {x}");
            previous = v;
        }
        // log2(65536) = 16 -> 16 * 2^44 = 2^48.
        let top = crush_ln(0xffff);
        assert!(
            (top as i64 - (1i64 << 48)).abs() < (1 << 30),
            "got {top:#x}"
        );
    }

    #[test]
    fn table_equals_the_function() {
        let table = ln_minus_one_table();
        for u in 0..=0xffffu32 {
            assert_eq!(table[u as usize], crush_ln(u) as i64 - (1 << 48));
        }
    }

    #[test]
    fn straw2_draw_prefers_heavier_items() {
        assert_eq!(straw2_draw(5, 0), i64::MIN);
        assert!(straw2_draw(1000, 0x20000) > straw2_draw(1000, 0x10000));
    }
}
