//! Arithmetic in GF(2^8) with the primitive polynomial 0x11d (x^8 + x^4 + x^3 + x^2 + 1) and
//! generator 2: the field of ISA-L and of Jerasure/gf-complete with w = 8.
//!
//! Invariants:
//! - `EXP[i] = 2^i` for `i` in `0..510` (doubled so that `EXP[log a + log b]` needs no modulo).
//! - `LOG[EXP[i]] = i` for `i` in `0..255`; `LOG[0]` is unused (0 has no logarithm).
//! - Every table is computed at compile time by `const fn`s, so there is no start-up cost and
//!   no lazy initialisation to race on.

/// The primitive polynomial, including the x^8 term.
pub const POLYNOMIAL: u16 = 0x11d;

/// Number of non-zero field elements, the order of the multiplicative group.
const GROUP_ORDER: usize = 255;

const fn build_exp() -> [u8; 2 * GROUP_ORDER] {
    let mut exp = [0u8; 2 * GROUP_ORDER];
    let mut value: u16 = 1;
    let mut i = 0;
    while i < 2 * GROUP_ORDER {
        exp[i] = value as u8;
        value <<= 1;
        if value & 0x100 != 0 {
            value ^= POLYNOMIAL;
        }
        i += 1;
    }
    exp
}

const fn build_log(exp: &[u8; 2 * GROUP_ORDER]) -> [u8; 256] {
    let mut log = [0u8; 256];
    let mut i = 0;
    while i < GROUP_ORDER {
        log[exp[i] as usize] = i as u8;
        i += 1;
    }
    log
}

/// `EXP[i] = 2^i`, doubled.
pub(crate) static EXP: [u8; 2 * GROUP_ORDER] = build_exp();
/// Discrete logarithm base 2 of every non-zero element.
pub(crate) static LOG: [u8; 256] = build_log(&build_exp());

// The generator must have order 255 (the polynomial is primitive): 2^255 = 1 and no earlier
// power wraps to 1.
const _: () = {
    let exp = build_exp();
    assert!(exp[0] == 1 && exp[GROUP_ORDER] == 1);
    let mut i = 1;
    while i < GROUP_ORDER {
        assert!(exp[i] != 1);
        i += 1;
    }
};

/// Product of two field elements.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// Multiplicative inverse; `inv(0)` is defined as 0 (as in ISA-L's `gf_inv`), callers that
/// divide must check for zero themselves.
#[inline]
pub fn inv(a: u8) -> u8 {
    if a == 0 {
        return 0;
    }
    EXP[GROUP_ORDER - LOG[a as usize] as usize]
}

/// `base` raised to `exponent` (with `0^0 = 1`, as in a Vandermonde matrix).
pub fn pow(base: u8, exponent: usize) -> u8 {
    if exponent == 0 {
        return 1;
    }
    if base == 0 {
        return 0;
    }
    let log = (LOG[base as usize] as usize * (exponent % GROUP_ORDER)) % GROUP_ORDER;
    EXP[log]
}

/// Carry-less "Russian peasant" multiplication: slow, independent of the tables, used by
/// tests as the reference.
pub fn mul_slow(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= (POLYNOMIAL & 0xff) as u8;
        }
        b >>= 1;
    }
    product
}

/// Size in bytes of the split-nibble table of one coefficient (see [`nibble_table`]).
pub const NIBBLE_TABLE_BYTES: usize = 64;

/// The split-nibble multiplication table of coefficient `c`, laid out for the SIMD kernels:
/// bytes `0..16` and `16..32` both hold `c * n` for `n` in `0..16` (low nibble products, twice
/// so that one 32-byte load fills both 128-bit lanes of a 256-bit register), bytes `32..48` and
/// `48..64` both hold `c * (n << 4)` (high nibble products). Then
/// `c * x = table[x & 15] ^ table[32 + (x >> 4)]`.
pub fn nibble_table(c: u8) -> [u8; NIBBLE_TABLE_BYTES] {
    let mut table = [0u8; NIBBLE_TABLE_BYTES];
    for n in 0..16u8 {
        let low = mul(c, n);
        let high = mul(c, n << 4);
        table[n as usize] = low;
        table[16 + n as usize] = low;
        table[32 + n as usize] = high;
        table[48 + n as usize] = high;
    }
    table
}

/// The GFNI affine matrix of "multiply by c" for `gf2p8affineqb`: multiplication by a constant
/// is linear over GF(2), so it is an 8x8 bit matrix whatever the polynomial (GFNI's own
/// `gf2p8mulb` is fixed to the AES polynomial 0x11b and cannot be used). Byte `7 - i` of the
/// result is the row producing output bit i: its bit j is bit i of `c * 2^j`.
pub fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    for i in 0..8 {
        let mut row = 0u8;
        for j in 0..8 {
            if mul(c, 1 << j) & (1 << i) != 0 {
                row |= 1 << j;
            }
        }
        matrix |= (row as u64) << (8 * (7 - i));
    }
    matrix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_matches_reference_for_all_pairs() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn inverse_is_inverse() {
        assert_eq!(inv(0), 0);
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "a = {a}");
        }
    }

    #[test]
    fn pow_matches_repeated_mul() {
        for base in [0u8, 1, 2, 3, 29, 200, 255] {
            let mut expected = 1u8;
            for e in 0..600 {
                assert_eq!(pow(base, e), expected, "{base}^{e}");
                expected = mul(expected, base);
            }
        }
    }

    /// Software model of `gf2p8affineqb` with b = 0.
    fn affine(matrix: u64, x: u8) -> u8 {
        let mut out = 0u8;
        for i in 0..8 {
            let row = (matrix >> (8 * (7 - i))) as u8;
            if (row & x).count_ones() % 2 == 1 {
                out |= 1 << i;
            }
        }
        out
    }

    #[test]
    fn affine_matrix_multiplies() {
        for c in 0..=255u8 {
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(affine(matrix, x), mul(c, x), "{c} * {x}");
            }
        }
    }

    #[test]
    fn nibble_table_multiplies() {
        for c in [0u8, 1, 2, 71, 255] {
            let t = nibble_table(c);
            for x in 0..=255u8 {
                let via_table = t[(x & 15) as usize] ^ t[32 + (x >> 4) as usize];
                assert_eq!(via_table, mul(c, x));
            }
        }
    }
}
