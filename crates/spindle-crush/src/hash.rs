//! Robert Jenkins' 96-bit mix as CRUSH uses it (`CRUSH_HASH_RJENKINS1`, hash id 0).
//!
//! Invariant: every function here is a pure function of its 32-bit inputs and must stay
//! bit-identical to Ceph's `crush_hash32_rjenkins1_*`; the batch (SIMD) path in
//! `batch.rs` mirrors these lane by lane and is tested against them.

/// Seed XORed into every hash (Ceph's `crush_hash_seed`).
pub const HASH_SEED: u32 = 1_315_423_911;

/// The only hash algorithm CRUSH defines.
pub const HASH_RJENKINS1: u8 = 0;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 13);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 8);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 13);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 12);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 16);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 5);
    *a = a.wrapping_sub(*b).wrapping_sub(*c) ^ (*c >> 3);
    *b = b.wrapping_sub(*c).wrapping_sub(*a) ^ (*a << 10);
    *c = c.wrapping_sub(*a).wrapping_sub(*b) ^ (*b >> 15);
}

const X0: u32 = 231_232;
const Y0: u32 = 1232;

/// Hash of one value.
#[inline]
pub fn hash32_1(a: u32) -> u32 {
    let mut a = a;
    let mut hash = HASH_SEED ^ a;
    let mut b = a;
    let (mut x, mut y) = (X0, Y0);
    mix(&mut b, &mut x, &mut hash);
    mix(&mut y, &mut a, &mut hash);
    hash
}

/// Hash of two values (used by the reweight `is_out` test).
#[inline(always)]
pub fn hash32_2(a: u32, b: u32) -> u32 {
    let (mut a, mut b) = (a, b);
    let mut hash = HASH_SEED ^ a ^ b;
    let (mut x, mut y) = (X0, Y0);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut x, &mut a, &mut hash);
    mix(&mut b, &mut y, &mut hash);
    hash
}

/// Hash of three values (straw, straw2, uniform permutations).
#[inline(always)]
pub fn hash32_3(a: u32, b: u32, c: u32) -> u32 {
    let (mut a, mut b, mut c) = (a, b, c);
    let mut hash = HASH_SEED ^ a ^ b ^ c;
    let (mut x, mut y) = (X0, Y0);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut c, &mut x, &mut hash);
    mix(&mut y, &mut a, &mut hash);
    mix(&mut b, &mut x, &mut hash);
    mix(&mut y, &mut c, &mut hash);
    hash
}

/// `hash32_3(a[i], b[i], c[i])` for N lanes at once. The rjenkins mix is one long
/// dependency chain (about 135 cycles of latency for 5 mixes); computing N independent
/// chains side by side lets the CPU overlap them (and lets the compiler use vectors).
/// Bit-identical to N calls of [`hash32_3`].
#[inline(always)]
pub fn hash32_3_lanes<const N: usize>(a: [u32; N], b: [u32; N], c: [u32; N]) -> [u32; N] {
    let (mut av, mut bv, mut cv) = (a, b, c);
    let mut hash = [0u32; N];
    for i in 0..N {
        hash[i] = HASH_SEED ^ a[i] ^ b[i] ^ c[i];
    }
    let mut x = [X0; N];
    let mut y = [Y0; N];
    for i in 0..N {
        mix(&mut av[i], &mut bv[i], &mut hash[i]);
    }
    for i in 0..N {
        mix(&mut cv[i], &mut x[i], &mut hash[i]);
    }
    for i in 0..N {
        mix(&mut y[i], &mut av[i], &mut hash[i]);
    }
    for i in 0..N {
        mix(&mut bv[i], &mut x[i], &mut hash[i]);
    }
    for i in 0..N {
        mix(&mut y[i], &mut cv[i], &mut hash[i]);
    }
    hash
}

/// Hash of four values (list and tree buckets).
#[inline(always)]
pub fn hash32_4(a: u32, b: u32, c: u32, d: u32) -> u32 {
    let (mut a, mut b, mut c, mut d) = (a, b, c, d);
    let mut hash = HASH_SEED ^ a ^ b ^ c ^ d;
    let (mut x, mut y) = (X0, Y0);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut c, &mut d, &mut hash);
    mix(&mut a, &mut x, &mut hash);
    mix(&mut y, &mut b, &mut hash);
    mix(&mut c, &mut x, &mut hash);
    mix(&mut y, &mut d, &mut hash);
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_deterministic_and_input_sensitive() {
        assert_eq!(hash32_3(1, 2, 3), hash32_3(1, 2, 3));
        assert_ne!(hash32_3(1, 2, 3), hash32_3(1, 2, 4));
        assert_ne!(hash32_2(0, 1), hash32_2(1, 0));
        assert_ne!(hash32_4(0, 0, 0, 0), hash32_4(0, 0, 0, 1));
        assert_ne!(hash32_1(0), hash32_1(1));
    }

    #[test]
    fn four_way_hash_equals_single() {
        for seed in 0..1000u32 {
            let b = [
                seed,
                seed.wrapping_mul(7),
                u32::MAX - seed,
                seed ^ 0xdead_beef,
            ];
            let got = hash32_3_lanes([seed.wrapping_mul(31); 4], b, [seed % 7; 4]);
            for i in 0..4 {
                assert_eq!(got[i], hash32_3(seed.wrapping_mul(31), b[i], seed % 7));
            }
        }
    }
}
