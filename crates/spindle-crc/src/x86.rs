//! x86_64 CRC32C with the SSE4.2 `crc32` instruction and PCLMULQDQ.
//!
//! One buffer: split into three lanes of L bytes processed in an interleaved loop (three
//! independent dependency chains hide the instruction's 3-cycle latency), then joined:
//! `state = reduce(a * x^(16L-33) ^ b * x^(8L-33)) ^ c`, where `reduce(v) = crc32_u64(0, v)`
//! computes `v * x^32 mod P` and the reflected carry-less product contributes one extra
//! factor x (hence the -33). L is a multiple of 64 up to [`LANE_MAX_BYTES`], chosen per round
//! from the remaining length, with one precomputed constant pair per possible L.
//!
//! Several buffers ([`update_streams`]): their registers are independent chains already, so
//! three to five buffers are advanced in one interleaved loop with no joining at all.

use std::arch::x86_64::*;

use super::x_pow;

/// Granularity of the lane length.
const LANE_GRANULE_BYTES: usize = 64;
/// Longest lane; longer buffers take several rounds.
const LANE_MAX_BYTES: usize = 8192;
const LANE_LENGTHS: usize = LANE_MAX_BYTES / LANE_GRANULE_BYTES;

/// `JOIN[i] = (x^(16L-33), x^(8L-33))` for `L = 64 * (i + 1)`.
static JOIN: [(u64, u64); LANE_LENGTHS] = {
    let mut table = [(0u64, 0u64); LANE_LENGTHS];
    let mut i = 0;
    while i < LANE_LENGTHS {
        let lane_bits = (LANE_GRANULE_BYTES * (i + 1) * 8) as u64;
        table[i] = (
            x_pow(2 * lane_bits - 33) as u64,
            x_pow(lane_bits - 33) as u64,
        );
        i += 1;
    }
    table
};

#[inline(always)]
unsafe fn read_u64(pointer: *const u8) -> u64 {
    // SAFETY: the caller guarantees 8 readable bytes.
    unsafe { pointer.cast::<u64>().read_unaligned() }
}

/// Carry-less product of two values below 2^32 (the product fits in 63 bits).
#[inline]
#[target_feature(enable = "pclmulqdq")]
fn clmul_low(a: u64, b: u64) -> u64 {
    let product = _mm_clmulepi64_si128(_mm_cvtsi64_si128(a as i64), _mm_cvtsi64_si128(b as i64), 0);
    _mm_cvtsi128_si64(product) as u64
}

/// Advances the raw register over `data`.
///
/// # Safety
/// SSE4.2 and PCLMULQDQ must be available.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn update(state: u32, data: &[u8]) -> u32 {
    let mut state = state as u64;
    let mut rest = data;
    while rest.len() >= 3 * LANE_GRANULE_BYTES {
        let lane = (rest.len() / 3 / LANE_GRANULE_BYTES * LANE_GRANULE_BYTES).min(LANE_MAX_BYTES);
        let base = rest.as_ptr();
        let (mut a, mut b, mut c) = (state, 0u64, 0u64);
        let mut offset = 0;
        while offset < lane {
            // SAFETY: `offset + 8 <= lane` and `3 * lane <= rest.len()`.
            unsafe {
                a = _mm_crc32_u64(a, read_u64(base.add(offset)));
                b = _mm_crc32_u64(b, read_u64(base.add(lane + offset)));
                c = _mm_crc32_u64(c, read_u64(base.add(2 * lane + offset)));
            }
            offset += 8;
        }
        let (k_two_lanes, k_one_lane) = JOIN[lane / LANE_GRANULE_BYTES - 1];
        let folded = clmul_low(a, k_two_lanes) ^ clmul_low(b, k_one_lane);
        state = _mm_crc32_u64(0, folded) ^ c;
        rest = &rest[3 * lane..];
    }
    let mut words = rest.chunks_exact(8);
    for word in &mut words {
        // SAFETY: `word` has 8 bytes.
        state = _mm_crc32_u64(state, unsafe { read_u64(word.as_ptr()) });
    }
    let mut state = state as u32;
    for &byte in words.remainder() {
        state = _mm_crc32_u8(state, byte);
    }
    state
}

/// Advances `states[i]` over `len` bytes at `buffers[i]`, three to five streams per loop.
///
/// # Safety
/// SSE4.2 and PCLMULQDQ must be available; every buffer must be readable for `len` bytes.
#[target_feature(enable = "sse4.2,pclmulqdq")]
pub(super) unsafe fn update_streams(states: &mut [u32], buffers: &[*const u8], len: usize) {
    assert_eq!(states.len(), buffers.len());
    let total = states.len();
    let mut first = 0;
    while first < total {
        let remaining = total - first;
        let take = if remaining >= 6 { 3 } else { remaining };
        let states = &mut states[first..first + take];
        let buffers = &buffers[first..first + take];
        // SAFETY: contract forwarded; each arm gets exactly `take` streams.
        unsafe {
            match take {
                3 => interleaved::<3>(states, buffers, len),
                4 => interleaved::<4>(states, buffers, len),
                5 => interleaved::<5>(states, buffers, len),
                _ => {
                    for (state, &buffer) in states.iter_mut().zip(buffers) {
                        *state = update(*state, std::slice::from_raw_parts(buffer, len));
                    }
                }
            }
        }
        first += take;
    }
}

/// # Safety
/// SSE4.2 available, `states.len() == buffers.len() == N`, buffers readable for `len` bytes.
#[target_feature(enable = "sse4.2")]
unsafe fn interleaved<const N: usize>(states: &mut [u32], buffers: &[*const u8], len: usize) {
    assert!(states.len() == N && buffers.len() == N);
    let mut registers = [0u64; N];
    let mut pointers = [std::ptr::null::<u8>(); N];
    for i in 0..N {
        registers[i] = states[i] as u64;
        pointers[i] = buffers[i];
    }
    let words = len / 8;
    for w in 0..words {
        for i in 0..N {
            // SAFETY: `8 * w + 8 <= len`.
            registers[i] = _mm_crc32_u64(registers[i], unsafe { read_u64(pointers[i].add(8 * w)) });
        }
    }
    for i in 0..N {
        let mut state = registers[i] as u32;
        for b in 8 * words..len {
            // SAFETY: `b < len`.
            state = _mm_crc32_u8(state, unsafe { *pointers[i].add(b) });
        }
        states[i] = state;
    }
}
