//! CRC32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final xor
//! 0xFFFFFFFF — the checksum of iSCSI, ext4, Ceph and Spindle's wire frames.
//! `crc32c(b"123456789") == 0xE3069283`. ISA-L's `crc32_iscsi(buf, len, 0xFFFFFFFF) ^
//! 0xFFFFFFFF` computes the same value.
//!
//! Implementations ([`CrcEngine`]):
//! - `Avx512` (x86_64 with AVX512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2): carry-less
//!   multiplication folding of 512-bit vectors, four accumulators (256 bytes per round),
//!   finished with the `crc32` instruction (see `fold.rs`). Buffers under 256 bytes take the
//!   `Sse42` path.
//! - `Avx2Vpclmul` (x86_64 with AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2, e.g. AMD Zen 3): the
//!   same folding on 256-bit vectors, 128 bytes per round.
//! - `Sse42` (x86_64 with SSE4.2 and PCLMULQDQ): the `crc32` instruction on three independent
//!   lanes of one buffer (it has a 3-cycle latency and a throughput of one per cycle), the
//!   lanes joined with two carry-less multiplications by precomputed constants `x^(8L-33)`.
//! - `ArmCrc` (aarch64 with the CRC extension): the `crc32cx` instruction, one lane.
//! - `Scalar`: slicing-by-8 tables, the portable fallback and test reference.
//!
//! Internally the functions work on the raw register ("state", the bitwise complement of a
//! finished CRC); the public functions take and return finished CRC values.

#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(target_arch = "x86_64")]
/// The 512-bit folding kernel's streaming state, for fused kernels in other crates
/// (`spindle-ec` folds the CRC of every chunk while it encodes).
pub mod fold;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Reflected CRC32C polynomial.
pub const POLYNOMIAL: u32 = 0x82F6_3B78;

/// `crc32c(b"123456789")`, the standard check value.
pub const CHECK_VALUE: u32 = 0xE306_9283;

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// CRC32C of the concatenation `previous ‖ data`, given `crc = crc32c(previous)`
/// (`crc32c_append(0, data) == crc32c(data)`).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c_append_with(CrcEngine::best_available(), crc, data)
}

/// Like [`crc32c_append`] with a given implementation; an implementation that is not
/// available on this CPU falls back to `Scalar` (all give the same value).
pub fn crc32c_append_with(engine: CrcEngine, crc: u32, data: &[u8]) -> u32 {
    !update(engine, !crc, data)
}

/// CRC32C of `a ‖ b` from `crc_a = crc32c(a)`, `crc_b = crc32c(b)` and `len_b = b.len()`.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    multiply_mod(crc_a, x_pow_8n(len_b as u64)) ^ crc_b
}

/// `crc32c_combine(a, b, len)` for one fixed `len`, by table lookup: shifting a CRC over
/// `len` zero bytes is multiplication by the constant `x^(8 len) mod P`, which is linear in
/// the CRC, so it is the xor of four per-byte tables (4 lookups instead of 64 steps of
/// [`crc32c_combine`]).
pub struct Crc32cShift {
    tables: [[u32; 256]; 4],
}

impl Crc32cShift {
    /// Tables for combining with a second part of `len_bytes` bytes.
    pub const fn new(len_bytes: u64) -> Crc32cShift {
        let constant = x_pow_8n(len_bytes);
        let mut tables = [[0u32; 256]; 4];
        let mut t = 0;
        while t < 4 {
            let mut byte = 0;
            while byte < 256 {
                tables[t][byte] = multiply_mod((byte as u32) << (8 * t), constant);
                byte += 1;
            }
            t += 1;
        }
        Crc32cShift { tables }
    }

    /// CRC32C of `a ‖ b` from `crc32c(a)` and `crc32c(b)`, `b` being `len_bytes` long.
    #[inline]
    pub fn combine(&self, crc_a: u32, crc_b: u32) -> u32 {
        let t = &self.tables;
        t[0][(crc_a & 0xFF) as usize]
            ^ t[1][((crc_a >> 8) & 0xFF) as usize]
            ^ t[2][((crc_a >> 16) & 0xFF) as usize]
            ^ t[3][(crc_a >> 24) as usize]
            ^ crc_b
    }
}

/// Block size of [`crc32c_blocks`]: the block checksums of Spindle's object store.
pub const CRC_BLOCK_BYTES: usize = 4096;

static SHIFT_BLOCK: Crc32cShift = Crc32cShift::new(CRC_BLOCK_BYTES as u64);

/// CRC32C of each [`CRC_BLOCK_BYTES`] block of `data` (the last may be shorter), appended
/// to `blocks`, and the CRC32C of all of `data`, combined from them: one pass gives both a
/// message checksum and the per-block checksums a store keeps.
pub fn crc32c_blocks(data: &[u8], blocks: &mut Vec<u32>) -> u32 {
    let engine = CrcEngine::best_available();
    let mut whole = 0;
    blocks.reserve(data.len().div_ceil(CRC_BLOCK_BYTES));
    for block in data.chunks(CRC_BLOCK_BYTES) {
        let crc = crc32c_append_with(engine, 0, block);
        blocks.push(crc);
        whole = if block.len() == CRC_BLOCK_BYTES {
            SHIFT_BLOCK.combine(whole, crc)
        } else {
            crc32c_combine(whole, crc, block.len())
        };
    }
    whole
}

/// CRC32C of data of `len_bytes` bytes from the CRC32C of each of its [`CRC_BLOCK_BYTES`]
/// blocks (as [`crc32c_blocks`] gives them); None if the counts do not match.
pub fn crc32c_of_blocks(blocks: &[u32], len_bytes: usize) -> Option<u32> {
    if blocks.len() != len_bytes.div_ceil(CRC_BLOCK_BYTES) {
        return None;
    }
    let mut whole = 0;
    for (i, &crc) in blocks.iter().enumerate() {
        let block_len = (len_bytes - i * CRC_BLOCK_BYTES).min(CRC_BLOCK_BYTES);
        whole = if block_len == CRC_BLOCK_BYTES {
            SHIFT_BLOCK.combine(whole, crc)
        } else {
            crc32c_combine(whole, crc, block_len)
        };
    }
    Some(whole)
}

/// A CRC32C implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrcEngine {
    Scalar,
    /// x86_64 AVX-512 VPCLMULQDQ folding.
    Avx512,
    /// x86_64 AVX2 + VPCLMULQDQ folding on 256-bit vectors (e.g. AMD Zen 3).
    Avx2Vpclmul,
    /// x86_64 SSE4.2 `crc32` + PCLMULQDQ lane joining.
    Sse42,
    /// aarch64 CRC extension.
    ArmCrc,
}

impl CrcEngine {
    /// Whether this implementation runs on this CPU.
    pub fn is_available(self) -> bool {
        match self {
            CrcEngine::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            CrcEngine::Sse42 => {
                std::is_x86_feature_detected!("sse4.2")
                    && std::is_x86_feature_detected!("pclmulqdq")
            }
            #[cfg(target_arch = "x86_64")]
            CrcEngine::Avx2Vpclmul => {
                CrcEngine::Sse42.is_available()
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("vpclmulqdq")
            }
            #[cfg(target_arch = "x86_64")]
            CrcEngine::Avx512 => {
                CrcEngine::Sse42.is_available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("vpclmulqdq")
            }
            #[cfg(target_arch = "aarch64")]
            CrcEngine::ArmCrc => std::arch::is_aarch64_feature_detected!("crc"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest implementation available here.
    pub fn best_available() -> CrcEngine {
        [
            CrcEngine::Avx512,
            CrcEngine::Avx2Vpclmul,
            CrcEngine::Sse42,
            CrcEngine::ArmCrc,
        ]
        .into_iter()
        .find(|engine| engine.is_available())
        .unwrap_or(CrcEngine::Scalar)
    }
}

/// Advances the raw register `state` over `data`.
/// Raw-register update (the register is the complement of a finished CRC), for fused
/// kernels in other crates; [`crc32c_append_with`] is the finished-value form.
pub fn update(engine: CrcEngine, state: u32, data: &[u8]) -> u32 {
    match engine {
        #[cfg(target_arch = "x86_64")]
        CrcEngine::Avx512 if engine.is_available() => {
            // SAFETY: AVX512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2 were detected just above.
            unsafe { fold::update(state, data) }
        }
        #[cfg(target_arch = "x86_64")]
        CrcEngine::Avx2Vpclmul if engine.is_available() => {
            // SAFETY: AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2 were detected just above.
            unsafe { fold::update_avx2(state, data) }
        }
        #[cfg(target_arch = "x86_64")]
        CrcEngine::Sse42 if engine.is_available() => {
            // SAFETY: SSE4.2 and PCLMULQDQ were detected just above.
            unsafe { x86::update(state, data) }
        }
        #[cfg(target_arch = "aarch64")]
        CrcEngine::ArmCrc if engine.is_available() => {
            // SAFETY: the CRC extension was detected just above.
            unsafe { arm::update(state, data) }
        }
        _ => update_scalar(state, data),
    }
}

/// Advances `states[i]` over `len` bytes at `buffers[i]` for every i, interleaving the
/// independent streams so that the CRC unit is kept busy.
///
/// # Safety
/// Every pointer in `buffers` must be valid for reads of `len` bytes.
pub unsafe fn update_streams(
    engine: CrcEngine,
    states: &mut [u32],
    buffers: &[*const u8],
    len: usize,
) {
    assert_eq!(states.len(), buffers.len());
    match engine {
        #[cfg(target_arch = "x86_64")]
        CrcEngine::Avx512 | CrcEngine::Avx2Vpclmul
            if engine.is_available() && len >= fold::FOLD_MIN_BYTES =>
        {
            for (state, &buffer) in states.iter_mut().zip(buffers) {
                // SAFETY: `buffer` is readable for `len` bytes (contract).
                let data = unsafe { std::slice::from_raw_parts(buffer, len) };
                *state = update(engine, *state, data);
            }
        }
        #[cfg(target_arch = "x86_64")]
        CrcEngine::Sse42 | CrcEngine::Avx512 | CrcEngine::Avx2Vpclmul
            if CrcEngine::Sse42.is_available() =>
        {
            // SAFETY: features detected above; buffer contract forwarded.
            unsafe { x86::update_streams(states, buffers, len) }
        }
        _ => {
            for (state, &buffer) in states.iter_mut().zip(buffers) {
                // SAFETY: `buffer` is readable for `len` bytes (contract).
                let data = unsafe { std::slice::from_raw_parts(buffer, len) };
                *state = update(engine, *state, data);
            }
        }
    }
}

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut n = 0;
    while n < 256 {
        let mut crc = n as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLYNOMIAL
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][n] = crc;
        n += 1;
    }
    let mut t = 1;
    while t < 8 {
        let mut n = 0;
        while n < 256 {
            let previous = tables[t - 1][n];
            tables[t][n] = (previous >> 8) ^ tables[0][(previous & 0xff) as usize];
            n += 1;
        }
        t += 1;
    }
    tables
}

/// Slicing-by-8 tables: `TABLES[t][b]` is the register after byte b followed by t zero bytes.
static TABLES: [[u32; 256]; 8] = build_tables();

/// Portable slicing-by-8 update of the raw register.
pub(crate) fn update_scalar(mut state: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let low = u32::from_le_bytes([word[0], word[1], word[2], word[3]]) ^ state;
        let high = u32::from_le_bytes([word[4], word[5], word[6], word[7]]);
        state = TABLES[7][(low & 0xff) as usize]
            ^ TABLES[6][((low >> 8) & 0xff) as usize]
            ^ TABLES[5][((low >> 16) & 0xff) as usize]
            ^ TABLES[4][(low >> 24) as usize]
            ^ TABLES[3][(high & 0xff) as usize]
            ^ TABLES[2][((high >> 8) & 0xff) as usize]
            ^ TABLES[1][((high >> 16) & 0xff) as usize]
            ^ TABLES[0][(high >> 24) as usize];
    }
    for &byte in words.remainder() {
        state = (state >> 8) ^ TABLES[0][((state ^ byte as u32) & 0xff) as usize];
    }
    state
}

/// Product of two polynomials modulo P in the reflected representation (bit 31 is the
/// coefficient of x^0, bit 0 that of x^31).
pub(crate) const fn multiply_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut power = 0;
    while power < 32 {
        if a & (0x8000_0000 >> power) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 {
            (b >> 1) ^ POLYNOMIAL
        } else {
            b >> 1
        };
        power += 1;
    }
    product
}

/// `X_POW_2N[i] = x^(2^i) mod P`, reflected; 67 entries so that `x^(8 * n)` for any `u64`
/// byte count `n` (bit i of n selects entry i + 3) needs no overflowing multiplication.
const X_POW_2N: [u32; 67] = {
    let mut table = [0u32; 67];
    table[0] = 0x4000_0000; // x^1
    let mut i = 1;
    while i < 67 {
        table[i] = multiply_mod(table[i - 1], table[i - 1]);
        i += 1;
    }
    table
};

/// `x^(8 * bytes) mod P`: the factor that advances a register over `bytes` zero bytes.
pub(crate) const fn x_pow_8n(bytes: u64) -> u32 {
    let mut result = 0x8000_0000; // x^0
    let mut n = bytes;
    let mut i = 3;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply_mod(result, X_POW_2N[i]);
        }
        n >>= 1;
        i += 1;
    }
    result
}

/// `x^-1 mod P`, reflected: P = x * Q + 1, so x * Q = 1 (mod P) and Q = x^-1. In the
/// reflected form Q is P without its x^0 and x^32 terms divided by x (a left shift), plus x^31.
const X_INVERSE: u32 = ((POLYNOMIAL & 0x7FFF_FFFF) << 1) | 1;

/// `x^-n mod P`, reflected.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn x_inverse_pow(n: u64) -> u32 {
    let mut result = 0x8000_0000; // x^0
    let mut factor = X_INVERSE;
    let mut n = n;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply_mod(result, factor);
        }
        factor = multiply_mod(factor, factor);
        n >>= 1;
    }
    result
}

/// `x^bits mod P`, reflected.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const fn x_pow(bits: u64) -> u32 {
    let mut result = 0x8000_0000; // x^0
    let mut n = bits;
    let mut i = 0;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply_mod(result, X_POW_2N[i]);
        }
        n >>= 1;
        i += 1;
    }
    result
}

#[cfg(test)]
mod tests;
