//! Multiply-accumulate kernels ("dot products" over GF(2^8)) and their selection.
//!
//! Every kernel computes, for `r` in `0..rows` and `b` in `0..len`:
//! `dst[r][b] = XOR_j table(coeff[r][j]) * src[j][b]`, where the coefficients are given as
//! split-nibble tables ([`crate::gf::nibble_table`], 64 bytes each, row-major `[r * k + j]`).
//! All kernels write exactly the same bytes; the SIMD ones only differ in speed.
//!
//! Invariants every kernel relies on (checked by [`DotProduct::new`] and the safe callers):
//! - `src` has `k` pointers, each readable for `len` bytes; `dst` has `rows` pointers, each
//!   writable for `len` bytes; no destination overlaps a source or another destination.
//! - `tables.len() == rows * k`.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod fused;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;

use crate::gf::NIBBLE_TABLE_BYTES;
use crate::EcError;

/// Regions at least this long are written with non-temporal (cache-bypassing) stores by the
/// AVX2 and AVX-512 kernels: 256 KiB chunks and larger do not stay in L1/L2 anyway, and
/// streaming stores save the read-for-ownership of every destination line (about +30 % at
/// 1 MiB chunks, measured).
pub(crate) const STREAM_MIN_BYTES: usize = 256 * 1024;

/// Name of the environment variable that overrides [`EngineKind::Auto`].
pub const ENGINE_ENV_VAR: &str = "SPINDLE_EC_ENGINE";

/// Which implementation of the coding kernels to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// The engine named by `SPINDLE_EC_ENGINE` if set, otherwise the fastest one the CPU
    /// supports (GFNI, AVX-512, AVX2, then SSSE3 on x86_64; NEON on aarch64; scalar
    /// otherwise).
    Auto,
    /// Portable table-driven code: the reference every other engine is tested against.
    Scalar,
    /// x86_64 SSSE3: 128-bit `pshufb` split-nibble tables.
    Ssse3,
    /// x86_64 AVX2: 256-bit `vpshufb` split-nibble tables, 64 bytes per step.
    Avx2,
    /// x86_64 AVX-512 (F + BW): 512-bit `vpshufb` split-nibble tables.
    Avx512,
    /// x86_64 AVX-512 (F + BW) with GFNI: one `vgf2p8affineqb` per 64-byte product.
    Gfni,
    /// aarch64 NEON: 128-bit `tbl` split-nibble tables.
    Neon,
}

impl EngineKind {
    /// Every concrete engine (not `Auto`).
    pub const CONCRETE: [EngineKind; 4] = [
        EngineKind::Scalar,
        EngineKind::Ssse3,
        EngineKind::Avx2,
        EngineKind::Neon,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Scalar => "scalar",
            EngineKind::Ssse3 => "ssse3",
            EngineKind::Avx2 => "avx2",
            EngineKind::Avx512 => "avx512",
            EngineKind::Gfni => "gfni",
            EngineKind::Neon => "neon",
        }
    }

    /// Whether this engine can run on this CPU and build (`Auto` always can).
    pub fn is_available(self) -> bool {
        match self {
            EngineKind::Auto | EngineKind::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            EngineKind::Ssse3 => std::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "x86_64")]
            EngineKind::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            EngineKind::Avx512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            EngineKind::Gfni => {
                EngineKind::Avx512.is_available() && std::is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "aarch64")]
            EngineKind::Neon => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The CRC32C implementation of the same CPU class, used by the fused encode + CRC of
    /// this engine: `Scalar` with the scalar engine, SSE4.2 with SSSE3, 256-bit VPCLMULQDQ
    /// folding (else SSE4.2) with AVX2 (what a CPU without AVX-512, e.g. AMD Zen 3, has),
    /// AVX-512 folding with the AVX-512 engines, the ARMv8 CRC instructions with NEON; each
    /// falling back to the best one available.
    pub fn crc_engine(self) -> crate::crc32c::CrcEngine {
        use crate::crc32c::CrcEngine;
        let preferred = match self {
            EngineKind::Scalar => return CrcEngine::Scalar,
            EngineKind::Ssse3 => CrcEngine::Sse42,
            EngineKind::Avx2 if CrcEngine::Avx2Vpclmul.is_available() => CrcEngine::Avx2Vpclmul,
            EngineKind::Avx2 => CrcEngine::Sse42,
            EngineKind::Avx512 | EngineKind::Gfni => CrcEngine::Avx512,
            EngineKind::Neon => CrcEngine::ArmCrc,
            EngineKind::Auto => CrcEngine::best_available(),
        };
        if preferred.is_available() {
            preferred
        } else {
            CrcEngine::best_available()
        }
    }

    /// The fastest engine available here, ignoring the environment.
    pub fn best_available() -> EngineKind {
        [
            EngineKind::Gfni,
            EngineKind::Avx512,
            EngineKind::Avx2,
            EngineKind::Neon,
            EngineKind::Ssse3,
        ]
        .into_iter()
        .find(|kind| kind.is_available())
        .unwrap_or(EngineKind::Scalar)
    }

    /// The concrete engine this kind stands for: `Auto` is resolved through the environment
    /// variable and CPU detection; a concrete kind must be available.
    pub fn resolve(self) -> Result<EngineKind, EcError> {
        let kind = match self {
            EngineKind::Auto => match std::env::var(ENGINE_ENV_VAR) {
                Ok(name) if !name.trim().is_empty() => name.parse::<EngineKind>()?,
                _ => EngineKind::best_available(),
            },
            concrete => concrete,
        };
        let kind = if kind == EngineKind::Auto {
            EngineKind::best_available()
        } else {
            kind
        };
        if kind.is_available() {
            Ok(kind)
        } else {
            Err(EcError::EngineUnavailable(kind))
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = EcError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(EngineKind::Auto),
            "scalar" => Ok(EngineKind::Scalar),
            "ssse3" => Ok(EngineKind::Ssse3),
            "avx2" => Ok(EngineKind::Avx2),
            "avx512" => Ok(EngineKind::Avx512),
            "gfni" => Ok(EngineKind::Gfni),
            "neon" => Ok(EngineKind::Neon),
            _ => Err(EcError::UnknownEngine(name.to_string())),
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `pass(offset, len)` over `0..total` in column blocks of about `block` bytes, never
/// leaving a final block shorter than `min_block` unless the whole range is.
pub(crate) fn for_each_column_block(
    total: usize,
    block: usize,
    min_block: usize,
    mut pass: impl FnMut(usize, usize),
) {
    assert!(block >= min_block);
    let mut offset = 0;
    while offset < total {
        let mut len = block.min(total - offset);
        if total - offset - len < min_block {
            len = total - offset;
        }
        pass(offset, len);
        offset += len;
    }
}

/// One split-nibble table per coefficient.
pub(crate) type NibbleTable = [u8; NIBBLE_TABLE_BYTES];

/// The coefficients of a rows x k matrix in the forms the kernels use, row-major
/// (`[r * k + j]`): split-nibble tables (scalar, SSSE3, AVX2, AVX-512, NEON) and GFNI affine
/// matrices ([`crate::gf::affine_matrix`]).
#[derive(Debug, Clone)]
pub(crate) struct CoefficientTables {
    pub rows: usize,
    pub cols: usize,
    pub nibble: Vec<NibbleTable>,
    pub affine: Vec<u64>,
}

impl CoefficientTables {
    pub fn new(matrix: &crate::Matrix) -> CoefficientTables {
        let coefficients = (0..matrix.rows()).flat_map(|r| matrix.row(r).iter().copied());
        let nibble: Vec<NibbleTable> = coefficients.clone().map(crate::gf::nibble_table).collect();
        let affine: Vec<u64> = coefficients.map(crate::gf::affine_matrix).collect();
        assert_eq!(nibble.len(), matrix.rows() * matrix.cols());
        CoefficientTables {
            rows: matrix.rows(),
            cols: matrix.cols(),
            nibble,
            affine,
        }
    }
}

/// A validated dot-product job over raw pointers: the only way kernels are called.
pub(crate) struct DotProduct<'a> {
    pub tables: &'a [NibbleTable],
    pub affine: &'a [u64],
    pub src: &'a [*const u8],
    pub dst: &'a [*mut u8],
    pub len: usize,
}

impl<'a> DotProduct<'a> {
    /// # Safety
    /// Every `src` pointer must be valid for reads of `len` bytes and every `dst` pointer for
    /// writes of `len` bytes for the lifetime of the job; destinations must not overlap each
    /// other or any source.
    pub unsafe fn new(
        tables: &'a CoefficientTables,
        src: &'a [*const u8],
        dst: &'a [*mut u8],
        len: usize,
    ) -> Self {
        assert_eq!(tables.cols, src.len(), "one table column per source");
        assert_eq!(tables.rows, dst.len(), "one table row per destination");
        assert!(!src.is_empty() && src.len() <= crate::MAX_TOTAL_CHUNKS);
        assert!(dst.len() <= crate::MAX_TOTAL_CHUNKS);
        DotProduct {
            tables: &tables.nibble,
            affine: &tables.affine,
            src,
            dst,
            len,
        }
    }

    /// Number of sources (k).
    pub fn sources(&self) -> usize {
        self.src.len()
    }

    /// The sub-job computing destination rows `first..first + count`.
    pub fn rows(&self, first: usize, count: usize) -> DotProduct<'a> {
        let k = self.src.len();
        DotProduct {
            tables: &self.tables[first * k..(first + count) * k],
            affine: &self.affine[first * k..(first + count) * k],
            src: self.src,
            dst: &self.dst[first..first + count],
            len: self.len,
        }
    }

    /// Runs the job with the given engine and writes the CRC32C of every source and
    /// destination to `crcs` in one pass, if the engine has a fused kernel; returns false
    /// (doing nothing) otherwise.
    pub fn run_with_crc(&self, engine: EngineKind, crcs: &mut [u32]) -> bool {
        assert_eq!(crcs.len(), self.src.len() + self.dst.len());
        match engine {
            #[cfg(target_arch = "x86_64")]
            EngineKind::Gfni if crate::crc32c::CrcEngine::Avx512.is_available() => {
                assert!(engine.is_available());
                // SAFETY: GFNI/AVX-512 (asserted) and VPCLMULQDQ, PCLMULQDQ, SSE4.2 (checked
                // by the guard) are present; pointer contract established by `new`.
                unsafe { fused::encode_with_crc(self, crcs) };
                true
            }
            _ => false,
        }
    }

    /// Runs the job with the given concrete engine.
    pub fn run(&self, engine: EngineKind) {
        if self.len == 0 || self.dst.is_empty() {
            return;
        }
        match engine {
            #[cfg(target_arch = "x86_64")]
            EngineKind::Gfni => {
                assert!(engine.is_available());
                // SAFETY: AVX512F/BW and GFNI are present (asserted above); the pointer
                // contract was established by `DotProduct::new`.
                unsafe { avx512::dot_product_gfni(self) }
            }
            #[cfg(target_arch = "x86_64")]
            EngineKind::Avx512 => {
                assert!(engine.is_available());
                // SAFETY: AVX512F/BW are present; pointer contract as above.
                unsafe { avx512::dot_product_avx512(self) }
            }
            #[cfg(target_arch = "x86_64")]
            EngineKind::Avx2 => {
                assert!(std::is_x86_feature_detected!("avx2"));
                // SAFETY: AVX2 is present (asserted above); the pointer contract was
                // established by `DotProduct::new`.
                unsafe { x86::dot_product_avx2(self) }
            }
            #[cfg(target_arch = "x86_64")]
            EngineKind::Ssse3 => {
                assert!(std::is_x86_feature_detected!("ssse3"));
                // SAFETY: SSSE3 is present; the pointer contract holds (see `new`).
                unsafe { x86::dot_product_ssse3(self) }
            }
            #[cfg(target_arch = "aarch64")]
            EngineKind::Neon => {
                // SAFETY: NEON is part of the aarch64 baseline; pointer contract as above.
                unsafe { neon::dot_product_neon(self) }
            }
            _ => {
                // SAFETY: pointer contract established by `DotProduct::new`.
                unsafe { scalar::dot_product(self) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_blocks_cover_range() {
        for total in [0usize, 1, 255, 256, 257, 1000, 4096, 4097, 10_000] {
            let mut next = 0;
            for_each_column_block(total, 1024, 256, |offset, len| {
                assert_eq!(offset, next);
                assert!(len >= 256 || len == total);
                next += len;
            });
            assert_eq!(next, total);
        }
    }
}
