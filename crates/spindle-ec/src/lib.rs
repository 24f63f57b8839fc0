//! `spindle-ec`: Spindle's coding kernels.
//!
//! - [`ReedSolomon`]: systematic Reed-Solomon over GF(2^8) (polynomial 0x11d), k data and m
//!   parity chunks with `k + m <= MAX_TOTAL_CHUNKS` (64), with the coding matrices of ISA-L
//!   (`gf_gen_rs_matrix`, `gf_gen_cauchy1_matrix`) and Jerasure (`reed_sol_van`, w = 8)
//!   reproduced byte for byte ([`MatrixKind`]); encode, decode of any pattern of up to m
//!   erasures with decode tables cached per pattern, and a fused encode + CRC32C.
//! - [`crc32c`]: hardware-accelerated CRC32C (the `spindle-crc` kernel crate, re-exported
//!   here for the fused encode + CRC kernel and its callers).
//! - Engines ([`EngineKind`]): scalar reference, SSSE3, AVX2, NEON; chosen at run time from
//!   the CPU, overridable in code or with `SPINDLE_EC_ENGINE`.
//! - [`accel`]: the submit/poll [`accel::CodingEngine`] trait for accelerators, implemented by
//!   [`accel::CpuEngine`].
//!
//! Layering: this crate depends on no Spindle crate but the `spindle-crc` kernel; the
//! client and the storage daemon depend on it (the protocol and the store only need
//! checksums and take them from `spindle-types`). It never does I/O and never allocates per byte of data.

pub mod accel;
mod codec;
pub use spindle_crc as crc32c;
mod engine;
mod error;
pub mod gf;
pub mod matrix;

pub use codec::{ReedSolomon, DECODE_CACHE_ENTRIES_MAX};
pub use engine::{EngineKind, ENGINE_ENV_VAR};
pub use error::EcError;
pub use matrix::{Matrix, MatrixKind};

/// Most chunks (k + m) in one stripe. Erasure patterns are 64-bit masks; ISA-L itself allows
/// up to 255 but no storage system here uses more than a few dozen.
pub const MAX_TOTAL_CHUNKS: usize = 64;

const _: () = assert!(MAX_TOTAL_CHUNKS <= u64::BITS as usize);
