//! Typed errors of every fallible operation of the crate. Bad parameters are always reported
//! through these, never by a panic; a panic in this crate means a bug (a failed `assert!`).

use crate::MAX_TOTAL_CHUNKS;

/// Errors of matrix construction, encoding, decoding and the engine interface.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    #[error("the number of data chunks k must be at least 1")]
    NoDataChunks,
    #[error("the number of parity chunks m must be at least 1")]
    NoParityChunks,
    #[error(
        "k + m = {data_chunks} + {parity_chunks} exceeds the limit of {MAX_TOTAL_CHUNKS} chunks"
    )]
    TooManyChunks {
        data_chunks: usize,
        parity_chunks: usize,
    },
    #[error("expected {expected} {what} buffers, got {actual}")]
    BufferCount {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("chunk {index} is {actual_bytes} bytes long, expected {expected_bytes} bytes")]
    ChunkLength {
        index: usize,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    #[error("only {present} chunks are present, at least {needed} are needed to decode")]
    TooFewChunks { present: usize, needed: usize },
    #[error("chunk index {index} is out of range for a code with {total} chunks")]
    ChunkIndex { index: usize, total: usize },
    #[error("chunk index {index} is listed twice")]
    DuplicateChunk { index: usize },
    #[error("more than {parity_chunks} chunks are erased ({erased})")]
    TooManyErasures { erased: usize, parity_chunks: usize },
    #[error("the matrix is singular: these chunks cannot be rebuilt from the survivors")]
    SingularMatrix,
    #[error("matrix is {rows}x{cols}, expected a square matrix")]
    NotSquare { rows: usize, cols: usize },
    #[error("coding engine {0:?} is not available on this CPU or build")]
    EngineUnavailable(crate::EngineKind),
    #[error("unknown coding engine name {0:?} (expected auto, scalar, ssse3, avx2, avx512, gfni or neon)")]
    UnknownEngine(String),
    #[error("the engine queue is full ({in_flight} jobs in flight, limit {limit})")]
    QueueFull { in_flight: usize, limit: usize },
}
