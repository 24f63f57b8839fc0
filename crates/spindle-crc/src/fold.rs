//! CRC32C by carry-less multiplication folding on 512-bit vectors (AVX-512F + VPCLMULQDQ),
//! finished with the SSE4.2 `crc32` instruction.
//!
//! Representation: a 128-bit lane of message bytes, loaded little-endian, is the polynomial
//! `Q0 * x^64 + Q1` where `Q0` (the first 8 bytes) and `Q1` are 64-bit reflected values (bit
//! i is the coefficient of x^(63-i)). Moving a lane D bits further down the message
//! multiplies it by x^D; modulo P that is `clmul(Q0, x^(D+31)) ^ clmul(Q1, x^(D-33))`, both
//! constants reduced to 32 bits (a reflected carry-less product contributes one extra factor
//! x, and a 32-bit constant in the low half of a qword stands for itself times x^32).
//! The folded remainder R of a message has the same CRC as the message, and
//! `crc32_u64(crc32_u64(0, R.q0), R.q1)` computes it (`R * x^32 mod P`).
//!
//! Invariant of every accumulator: it is congruent modulo P to the message consumed so far
//! (plus the initial register), positioned to end where the accumulator ends. Only
//! congruence matters, so accumulators need never be fully reduced until the end.
//!
//! The same folding step serves the fused encode + CRC kernel ([`Stream`]): one accumulator
//! per chunk, folded by 512 bits per 64-byte block.

use std::arch::x86_64::*;

use super::{multiply_mod, x_inverse_pow, x_pow};

/// Lane constants `(x^(D+31), x^(D-33))` for a fold distance of D bits.
const fn fold_pair(distance_bits: u64) -> (u64, u64) {
    (
        x_pow(distance_bits + 31) as u64,
        x_pow(distance_bits - 33) as u64,
    )
}

const FOLD_512: (u64, u64) = fold_pair(512);
const FOLD_2048: (u64, u64) = fold_pair(2048);
const FOLD_384: (u64, u64) = fold_pair(384);
const FOLD_256: (u64, u64) = fold_pair(256);
const FOLD_128: (u64, u64) = fold_pair(128);

/// Initial accumulator for a fresh CRC (register 0xFFFFFFFF): a virtual 64-byte block just
/// before the message whose fold by 512 bits puts the register over the message's first 4
/// bytes, i.e. `0xFFFFFFFF * x^-32 mod P` in the last 32 bits of the block.
const FRESH_INIT: u32 = multiply_mod(u32::MAX, x_inverse_pow(32));

/// Buffers shorter than this use the `crc32` instruction alone.
pub(super) const FOLD_MIN_BYTES: usize = 256;

#[inline]
#[target_feature(enable = "avx512f")]
fn broadcast_pair(pair: (u64, u64)) -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi64x(pair.1 as i64, pair.0 as i64))
}

/// `acc * x^D ^ data` per 128-bit lane, with `constants` from [`fold_pair`] for D.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold(acc: __m512i, constants: __m512i, data: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<0x96>(
        _mm512_clmulepi64_epi128::<0x00>(acc, constants),
        _mm512_clmulepi64_epi128::<0x11>(acc, constants),
        data,
    )
}

#[inline]
#[target_feature(enable = "pclmulqdq,sse2")]
fn fold128(lane: __m128i, pair: (u64, u64)) -> __m128i {
    let constants = _mm_set_epi64x(pair.1 as i64, pair.0 as i64);
    _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(lane, constants),
        _mm_clmulepi64_si128::<0x11>(lane, constants),
    )
}

/// The CRC register of the message an accumulator stands for.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
fn reduce(acc: __m512i) -> u32 {
    let lanes = [
        _mm512_extracti32x4_epi32::<0>(acc),
        _mm512_extracti32x4_epi32::<1>(acc),
        _mm512_extracti32x4_epi32::<2>(acc),
        _mm512_extracti32x4_epi32::<3>(acc),
    ];
    let folded = _mm_xor_si128(
        _mm_xor_si128(fold128(lanes[0], FOLD_384), fold128(lanes[1], FOLD_256)),
        _mm_xor_si128(fold128(lanes[2], FOLD_128), lanes[3]),
    );
    let low = _mm_cvtsi128_si64(folded) as u64;
    let high = _mm_extract_epi64::<1>(folded) as u64;
    _mm_crc32_u64(_mm_crc32_u64(0, low), high) as u32
}

/// Advances the raw register over `data` by folding, 256 bytes per round in four
/// independent accumulators; the last `< 64` bytes go through the `crc32` instruction.
///
/// # Safety
/// AVX512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2 must be available.
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
pub(super) unsafe fn update(state: u32, data: &[u8]) -> u32 {
    if data.len() < FOLD_MIN_BYTES {
        // SAFETY: SSE4.2 and PCLMULQDQ are available (contract).
        return unsafe { super::x86::update(state, data) };
    }
    let pointer = data.as_ptr();
    // SAFETY (every `load` below): it reads 64 bytes at an offset `o` with
    // `o + 64 <= data.len()`, as the loop conditions ensure.
    #[inline(always)]
    unsafe fn load_at(pointer: *const u8, offset: usize) -> __m512i {
        // SAFETY: forwarded to the caller.
        unsafe { _mm512_loadu_si512(pointer.add(offset).cast()) }
    }
    let load = |offset: usize| unsafe { load_at(pointer, offset) };
    let mut acc = [
        _mm512_xor_si512(
            load(0),
            _mm512_zextsi128_si512(_mm_cvtsi32_si128(state as i32)),
        ),
        load(64),
        load(128),
        load(192),
    ];
    let mut offset = 256;
    let constants = broadcast_pair(FOLD_2048);
    while offset + 256 <= data.len() {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = fold(*a, constants, load(offset + 64 * i));
        }
        offset += 256;
    }
    let constants = broadcast_pair(FOLD_512);
    let mut total = fold(acc[0], constants, acc[1]);
    total = fold(total, constants, acc[2]);
    total = fold(total, constants, acc[3]);
    while offset + 64 <= data.len() {
        total = fold(total, constants, load(offset));
        offset += 64;
    }
    let state = reduce(total);
    // SAFETY: SSE4.2 and PCLMULQDQ are available.
    unsafe { super::x86::update(state, &data[offset..]) }
}

/// `acc * x^D ^ data` per 128-bit lane of a 256-bit vector.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, constants: __m256i, data: __m256i) -> __m256i {
    _mm256_xor_si256(
        _mm256_xor_si256(
            _mm256_clmulepi64_epi128::<0x00>(acc, constants),
            _mm256_clmulepi64_epi128::<0x11>(acc, constants),
        ),
        data,
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn broadcast_pair256(pair: (u64, u64)) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_set_epi64x(pair.1 as i64, pair.0 as i64))
}

/// The 256-bit twin of [`update`] for CPUs with VPCLMULQDQ but no AVX-512 (AMD Zen 3):
/// four 32-byte accumulators, 128 bytes per round.
///
/// # Safety
/// AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2 must be available.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub(super) unsafe fn update_avx2(state: u32, data: &[u8]) -> u32 {
    if data.len() < FOLD_MIN_BYTES {
        // SAFETY: SSE4.2 and PCLMULQDQ are available (contract).
        return unsafe { super::x86::update(state, data) };
    }
    let pointer = data.as_ptr();
    #[inline(always)]
    unsafe fn load_at(pointer: *const u8, offset: usize) -> __m256i {
        // SAFETY: forwarded to the caller.
        unsafe { _mm256_loadu_si256(pointer.add(offset).cast()) }
    }
    // SAFETY (every `load` below): it reads 32 bytes at an offset `o` with
    // `o + 32 <= data.len()`, as the loop conditions ensure.
    let load = |offset: usize| unsafe { load_at(pointer, offset) };
    let mut acc = [
        _mm256_xor_si256(
            load(0),
            _mm256_zextsi128_si256(_mm_cvtsi32_si128(state as i32)),
        ),
        load(32),
        load(64),
        load(96),
    ];
    let mut offset = 128;
    let constants = broadcast_pair256(fold_pair(1024));
    while offset + 128 <= data.len() {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = fold256(*a, constants, load(offset + 32 * i));
        }
        offset += 128;
    }
    let constants = broadcast_pair256(fold_pair(256));
    let mut total = fold256(acc[0], constants, acc[1]);
    total = fold256(total, constants, acc[2]);
    total = fold256(total, constants, acc[3]);
    while offset + 32 <= data.len() {
        total = fold256(total, constants, load(offset));
        offset += 32;
    }
    let folded = _mm_xor_si128(
        fold128(_mm256_extracti128_si256::<0>(total), FOLD_128),
        _mm256_extracti128_si256::<1>(total),
    );
    let low = _mm_cvtsi128_si64(folded) as u64;
    let high = _mm_extract_epi64::<1>(folded) as u64;
    let state = _mm_crc32_u64(_mm_crc32_u64(0, low), high) as u32;
    // SAFETY: SSE4.2 and PCLMULQDQ are available.
    unsafe { super::x86::update(state, &data[offset..]) }
}

/// The folding CRC state of one chunk inside the fused encode + CRC kernel.
#[derive(Clone, Copy)]
pub struct Stream(__m512i);

impl Stream {
    /// A fresh CRC32C (register 0xFFFFFFFF).
    ///
    /// # Safety
    /// The CPU must have the features this function enables (callers check
    /// `CrcEngine::Avx512.is_available()` first).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn fresh() -> Stream {
        Stream(_mm512_inserti32x4::<3>(
            _mm512_setzero_si512(),
            _mm_set_epi32(FRESH_INIT as i32, 0, 0, 0),
        ))
    }

    /// Consumes the next 64 bytes of the chunk.
    ///
    /// # Safety
    /// The CPU must have the features this function enables (callers check
    /// `CrcEngine::Avx512.is_available()` first).
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub fn consume(&mut self, block: __m512i, constants: __m512i) {
        self.0 = fold(self.0, constants, block);
    }

    /// The constants `consume` needs (512-bit fold), to be kept in a register.
    ///
    /// # Safety
    /// The CPU must have the features this function enables (callers check
    /// `CrcEngine::Avx512.is_available()` first).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn constants() -> __m512i {
        broadcast_pair(FOLD_512)
    }

    /// The CRC register after the bytes consumed so far.
    ///
    /// # Safety
    /// The CPU must have the features this function enables (callers check
    /// `CrcEngine::Avx512.is_available()` first).
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
    pub fn register(&self) -> u32 {
        reduce(self.0)
    }
}
