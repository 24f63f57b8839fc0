//! aarch64 CRC32C with the ARMv8 CRC extension (`crc32cx`/`crc32cb`), one lane.
//!
//! Not executed on the development machine (x86_64 only); kept minimal and selected only
//! when `is_aarch64_feature_detected!("crc")` says the instructions exist.

use std::arch::aarch64::{__crc32cb, __crc32cd};

/// Advances the raw register over `data`.
///
/// # Safety
/// The CRC extension must be available.
#[target_feature(enable = "crc")]
pub(super) unsafe fn update(mut state: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let value = u64::from_le_bytes([
            word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
        ]);
        // SAFETY: the CRC extension is available (caller's contract).
        state = unsafe { __crc32cd(state, value) };
    }
    for &byte in words.remainder() {
        // SAFETY: as above.
        state = unsafe { __crc32cb(state, byte) };
    }
    state
}
