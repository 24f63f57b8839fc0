//! Errors the engine itself returns (I/O results are `std::io::Error` with the OS code).

use crate::op::Op;

/// Engine construction failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(&'static str),
    #[error("cannot create io_uring instance {index}: {source}")]
    RingSetup {
        index: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start an engine thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A submission that was not accepted; the op (with its buffers) is handed back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    #[error("the engine is shut down")]
    ShutDown(Op),
    #[error("invalid operation: {reason}")]
    Invalid { reason: &'static str, op: Op },
}

impl SubmitError {
    /// Takes the rejected op back.
    pub fn into_op(self) -> Op {
        match self {
            SubmitError::ShutDown(op) | SubmitError::Invalid { op, .. } => op,
        }
    }
}
