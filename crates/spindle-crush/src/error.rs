//! Typed errors of the CRUSH crate.

use thiserror::Error;

/// Everything that can go wrong loading, building or using a CRUSH map.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CrushError {
    /// Text map syntax or semantic error, with its 1-based line number.
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    /// A compiled (binary) map is truncated or malformed.
    #[error("binary crush map: {0}")]
    Binary(String),
    /// Item weights add up past what 16.16 fixed point can hold.
    #[error("bucket weights overflow (bucket with {items} items)")]
    WeightOverflow { items: usize },
    /// A request or map that is structurally invalid.
    #[error("{0}")]
    Invalid(String),
    #[error("rule {0} does not exist")]
    NoSuchRule(i32),
}
