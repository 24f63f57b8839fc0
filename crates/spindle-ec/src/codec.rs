//! The Reed-Solomon codec: encode, fused encode + CRC32C, decode with cached decode tables.
//!
//! Invariants:
//! - `1 <= k`, `1 <= m`, `k + m <= MAX_TOTAL_CHUNKS` (checked by [`ReedSolomon::new`]).
//! - `encode_tables[r * k + j]` is the nibble table of `coding_matrix[r][j]`.
//! - A cached [`DecodePlan`] is a pure function of its key (survivor set, rebuilt set) and of
//!   the encode matrix, so a cache hit can never return stale tables.
//! - Every public entry point validates buffer counts and lengths before any kernel runs;
//!   kernels see raw pointers only through [`DotProduct`], whose contract is established here.

use std::sync::{Arc, Mutex};

use crate::crc32c::{self, CrcEngine};
use crate::engine::{for_each_column_block, CoefficientTables, DotProduct, EngineKind};
use crate::matrix::{self, Matrix, MatrixKind};
use crate::{EcError, MAX_TOTAL_CHUNKS};

/// Most decode plans kept per codec (one per distinct erasure pattern seen recently).
pub const DECODE_CACHE_ENTRIES_MAX: usize = 64;

/// Bytes of source data per column block in [`ReedSolomon::encode_with_crc`]: the block of
/// every data and parity chunk is checksummed right after it is encoded, while it is still
/// in the L1/L2 cache.
const FUSED_SOURCE_BYTES: usize = 16 * 1024;

/// Rebuild recipe for one erasure pattern: `targets[t] = sum_s coefficient(t, s) *
/// chunk[survivors[s]]`, with `tables[t * k + s]` the nibble table of that coefficient.
#[derive(Debug)]
struct DecodePlan {
    survivors: Vec<usize>,
    targets: Vec<usize>,
    tables: CoefficientTables,
}

/// Bitmask key of a decode plan: bit i of `survivors` / `targets` is chunk i.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    survivors: u64,
    targets: u64,
}

/// A small least-recently-used cache of decode plans.
#[derive(Debug, Default)]
struct DecodeCache {
    entries: Vec<(PlanKey, Arc<DecodePlan>, u64)>,
    clock: u64,
    misses: u64,
}

impl DecodeCache {
    fn get(&mut self, key: PlanKey) -> Option<Arc<DecodePlan>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries
            .iter_mut()
            .find(|(k, _, _)| *k == key)
            .map(|entry| {
                entry.2 = clock;
                Arc::clone(&entry.1)
            })
    }

    fn insert(&mut self, key: PlanKey, plan: Arc<DecodePlan>) {
        self.clock += 1;
        self.misses += 1;
        if self.entries.len() >= DECODE_CACHE_ENTRIES_MAX {
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.2)
                .map(|(i, _)| i)
            {
                self.entries.swap_remove(oldest);
            }
        }
        self.entries.push((key, plan, self.clock));
        assert!(self.entries.len() <= DECODE_CACHE_ENTRIES_MAX);
    }
}

// A codec is shared between threads (encode and decode take `&self`).
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ReedSolomon>();
};

/// A systematic Reed-Solomon code over GF(2^8) with k data and m parity chunks.
///
/// Chunk i < k is data chunk i; chunk k + r is parity row r. All chunks of a stripe have the
/// same length, any length (including 0 and lengths that are not multiples of the vector
/// width). The codec is `Sync`: encode and decode take `&self` (the decode cache is behind a
/// mutex held only for the lookup).
#[derive(Debug)]
pub struct ReedSolomon {
    data_chunks: usize,
    parity_chunks: usize,
    matrix_kind: MatrixKind,
    engine: EngineKind,
    crc_engine: CrcEngine,
    encode_matrix: Matrix,
    encode_tables: CoefficientTables,
    decode_cache: Mutex<DecodeCache>,
}

/// Checks that every buffer has `expected_bytes`, reporting the first that does not.
fn check_lengths(
    lengths: impl Iterator<Item = usize>,
    first_index: usize,
    expected_bytes: usize,
) -> Result<(), EcError> {
    for (i, actual_bytes) in lengths.enumerate() {
        if actual_bytes != expected_bytes {
            return Err(EcError::ChunkLength {
                index: first_index + i,
                expected_bytes,
                actual_bytes,
            });
        }
    }
    Ok(())
}

impl ReedSolomon {
    /// A code with the engine chosen by [`EngineKind::Auto`] (environment, then CPU).
    pub fn new(
        data_chunks: usize,
        parity_chunks: usize,
        matrix_kind: MatrixKind,
    ) -> Result<Self, EcError> {
        Self::with_engine(data_chunks, parity_chunks, matrix_kind, EngineKind::Auto)
    }

    /// A code running on the given engine (an error if it is not available here).
    pub fn with_engine(
        data_chunks: usize,
        parity_chunks: usize,
        matrix_kind: MatrixKind,
        engine: EngineKind,
    ) -> Result<Self, EcError> {
        let engine = engine.resolve()?;
        let encode_matrix = matrix::encode_matrix(matrix_kind, data_chunks, parity_chunks)?;
        let coding_rows: Vec<usize> = (data_chunks..data_chunks + parity_chunks).collect();
        let encode_tables = CoefficientTables::new(&encode_matrix.select_rows(&coding_rows));
        let crc_engine = engine.crc_engine();
        Ok(ReedSolomon {
            data_chunks,
            parity_chunks,
            matrix_kind,
            engine,
            crc_engine,
            encode_matrix,
            encode_tables,
            decode_cache: Mutex::new(DecodeCache::default()),
        })
    }

    /// k.
    pub fn data_chunks(&self) -> usize {
        self.data_chunks
    }

    /// m.
    pub fn parity_chunks(&self) -> usize {
        self.parity_chunks
    }

    /// k + m.
    pub fn total_chunks(&self) -> usize {
        self.data_chunks + self.parity_chunks
    }

    pub fn matrix_kind(&self) -> MatrixKind {
        self.matrix_kind
    }

    /// The concrete engine in use (never `Auto`).
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    /// The (k+m) x k encode matrix `[I ; C]`.
    pub fn encode_matrix(&self) -> &Matrix {
        &self.encode_matrix
    }

    /// Number of decode plans built so far (cache misses), for tests and metrics.
    pub fn decode_plans_built(&self) -> u64 {
        self.decode_cache.lock().map_or(0, |cache| cache.misses)
    }

    /// Validates a stripe given as k data and m parity buffers and returns the chunk length.
    fn check_stripe<D: AsRef<[u8]>, P: AsMut<[u8]>>(
        &self,
        data: &[D],
        parity: &mut [P],
    ) -> Result<usize, EcError> {
        if data.len() != self.data_chunks {
            return Err(EcError::BufferCount {
                what: "data",
                expected: self.data_chunks,
                actual: data.len(),
            });
        }
        if parity.len() != self.parity_chunks {
            return Err(EcError::BufferCount {
                what: "parity",
                expected: self.parity_chunks,
                actual: parity.len(),
            });
        }
        let chunk_bytes = data[0].as_ref().len();
        check_lengths(data.iter().map(|d| d.as_ref().len()), 0, chunk_bytes)?;
        check_lengths(
            parity.iter_mut().map(|p| p.as_mut().len()),
            self.data_chunks,
            chunk_bytes,
        )?;
        Ok(chunk_bytes)
    }

    /// Computes the m parity chunks of k data chunks.
    pub fn encode<D: AsRef<[u8]>, P: AsMut<[u8]>>(
        &self,
        data: &[D],
        parity: &mut [P],
    ) -> Result<(), EcError> {
        let chunk_bytes = self.check_stripe(data, parity)?;
        let mut src = [std::ptr::null::<u8>(); MAX_TOTAL_CHUNKS];
        let mut dst = [std::ptr::null_mut::<u8>(); MAX_TOTAL_CHUNKS];
        for (slot, d) in src.iter_mut().zip(data) {
            *slot = d.as_ref().as_ptr();
        }
        for (slot, p) in dst.iter_mut().zip(parity.iter_mut()) {
            *slot = p.as_mut().as_mut_ptr();
        }
        // SAFETY: `check_stripe` verified k sources and m destinations of `chunk_bytes` bytes
        // each; the destinations are distinct `&mut` buffers, so they overlap neither each
        // other nor the shared data buffers.
        let job = unsafe {
            DotProduct::new(
                &self.encode_tables,
                &src[..self.data_chunks],
                &dst[..self.parity_chunks],
                chunk_bytes,
            )
        };
        job.run(self.engine);
        Ok(())
    }

    /// Encodes and returns the CRC32C of every chunk in `crcs` (k data CRCs, then m parity
    /// CRCs), reading the data once: the stripe is processed in column blocks, and each block
    /// of every chunk is checksummed right after the block is encoded, while it is in cache.
    pub fn encode_with_crc<D: AsRef<[u8]>, P: AsMut<[u8]>>(
        &self,
        data: &[D],
        parity: &mut [P],
        crcs: &mut [u32],
    ) -> Result<(), EcError> {
        let chunk_bytes = self.check_stripe(data, parity)?;
        let (k, m) = (self.data_chunks, self.parity_chunks);
        if crcs.len() != k + m {
            return Err(EcError::BufferCount {
                what: "crc",
                expected: k + m,
                actual: crcs.len(),
            });
        }
        let mut src = [std::ptr::null::<u8>(); MAX_TOTAL_CHUNKS];
        let mut dst = [std::ptr::null_mut::<u8>(); MAX_TOTAL_CHUNKS];
        for (slot, d) in src.iter_mut().zip(data) {
            *slot = d.as_ref().as_ptr();
        }
        for (slot, p) in dst.iter_mut().zip(parity.iter_mut()) {
            *slot = p.as_mut().as_mut_ptr();
        }
        // SAFETY: as in `encode`: k sources and m distinct destinations of `chunk_bytes`.
        let whole =
            unsafe { DotProduct::new(&self.encode_tables, &src[..k], &dst[..m], chunk_bytes) };
        if whole.run_with_crc(self.engine, crcs) {
            return Ok(());
        }
        let mut states = [u32::MAX; MAX_TOTAL_CHUNKS];
        let block_bytes = (FUSED_SOURCE_BYTES / k).clamp(512, 8192) & !63;
        for_each_column_block(chunk_bytes, block_bytes, 64, |offset, len| {
            let mut block_src = [std::ptr::null::<u8>(); MAX_TOTAL_CHUNKS];
            let mut block_dst = [std::ptr::null_mut::<u8>(); MAX_TOTAL_CHUNKS];
            let mut all = [std::ptr::null::<u8>(); MAX_TOTAL_CHUNKS];
            for j in 0..k {
                // SAFETY: `offset + len <= chunk_bytes`, the length of every buffer.
                block_src[j] = unsafe { src[j].add(offset) };
                all[j] = block_src[j];
            }
            for r in 0..m {
                // SAFETY: as above.
                block_dst[r] = unsafe { dst[r].add(offset) };
                all[k + r] = block_dst[r];
            }
            // SAFETY: sub-ranges of the buffers validated by `check_stripe`; destinations are
            // distinct `&mut` buffers.
            let job = unsafe {
                DotProduct::new(&self.encode_tables, &block_src[..k], &block_dst[..m], len)
            };
            job.run(self.engine);
            // SAFETY: every pointer is readable for `len` bytes (same ranges as above).
            unsafe {
                crc32c::update_streams(self.crc_engine, &mut states[..k + m], &all[..k + m], len)
            };
        });
        for (crc, state) in crcs.iter_mut().zip(&states[..k + m]) {
            *crc = !state;
        }
        Ok(())
    }

    /// Rebuilds the chunks listed in `erasures` in place from the other chunks of `chunks`
    /// (all k + m chunks, same length; the contents of erased buffers are ignored and
    /// overwritten). At most m chunks may be erased. Decode tables are cached per erasure
    /// pattern. The survivors used are the k lowest-numbered chunks not erased.
    pub fn decode<C: AsMut<[u8]>>(
        &self,
        chunks: &mut [C],
        erasures: &[usize],
    ) -> Result<(), EcError> {
        let total = self.total_chunks();
        if chunks.len() != total {
            return Err(EcError::BufferCount {
                what: "chunk",
                expected: total,
                actual: chunks.len(),
            });
        }
        let mut erased_mask = 0u64;
        for &index in erasures {
            if index >= total {
                return Err(EcError::ChunkIndex { index, total });
            }
            if erased_mask & (1 << index) != 0 {
                return Err(EcError::DuplicateChunk { index });
            }
            erased_mask |= 1 << index;
        }
        if erasures.len() > self.parity_chunks {
            return Err(EcError::TooManyErasures {
                erased: erasures.len(),
                parity_chunks: self.parity_chunks,
            });
        }
        let chunk_bytes = chunks[0].as_mut().len();
        check_lengths(chunks.iter_mut().map(|c| c.as_mut().len()), 0, chunk_bytes)?;
        if erasures.is_empty() {
            return Ok(());
        }
        let survivors_mask = (0..total)
            .filter(|i| erased_mask & (1 << i) == 0)
            .take(self.data_chunks)
            .fold(0u64, |mask, i| mask | (1 << i));
        let plan = self.decode_plan(PlanKey {
            survivors: survivors_mask,
            targets: erased_mask,
        })?;
        let mut src = [std::ptr::null::<u8>(); MAX_TOTAL_CHUNKS];
        let mut dst = [std::ptr::null_mut::<u8>(); MAX_TOTAL_CHUNKS];
        for (slot, &i) in src.iter_mut().zip(&plan.survivors) {
            *slot = chunks[i].as_mut().as_ptr();
        }
        for (slot, &i) in dst.iter_mut().zip(&plan.targets) {
            *slot = chunks[i].as_mut().as_mut_ptr();
        }
        // SAFETY: all chunks have `chunk_bytes` bytes (checked); survivors and targets are
        // disjoint sets of distinct chunk buffers, so no destination overlaps anything.
        let job = unsafe {
            DotProduct::new(
                &plan.tables,
                &src[..plan.survivors.len()],
                &dst[..plan.targets.len()],
                chunk_bytes,
            )
        };
        job.run(self.engine);
        Ok(())
    }

    fn decode_plan(&self, key: PlanKey) -> Result<Arc<DecodePlan>, EcError> {
        if let Ok(mut cache) = self.decode_cache.lock() {
            if let Some(plan) = cache.get(key) {
                return Ok(plan);
            }
        }
        let plan = Arc::new(self.build_decode_plan(key)?);
        if let Ok(mut cache) = self.decode_cache.lock() {
            cache.insert(key, Arc::clone(&plan));
        }
        Ok(plan)
    }

    /// Inverts the survivors' rows of the encode matrix: `data = B^-1 * survivors`, so a lost
    /// data chunk i is row i of `B^-1` and a lost parity row r is `C[r] * B^-1`.
    fn build_decode_plan(&self, key: PlanKey) -> Result<DecodePlan, EcError> {
        let total = self.total_chunks();
        let survivors: Vec<usize> = (0..total)
            .filter(|i| key.survivors & (1 << i) != 0)
            .collect();
        let targets: Vec<usize> = (0..total).filter(|i| key.targets & (1 << i) != 0).collect();
        if survivors.len() < self.data_chunks {
            return Err(EcError::TooFewChunks {
                present: survivors.len(),
                needed: self.data_chunks,
            });
        }
        assert_eq!(survivors.len(), self.data_chunks);
        assert_eq!(
            key.survivors & key.targets,
            0,
            "a chunk cannot be both survivor and target"
        );
        let inverse = self.encode_matrix.select_rows(&survivors).invert()?;
        let target_rows = self.encode_matrix.select_rows(&targets);
        let rebuild = target_rows.mul(&inverse).ok_or(EcError::SingularMatrix)?;
        Ok(DecodePlan {
            survivors,
            targets,
            tables: CoefficientTables::new(&rebuild),
        })
    }
}
