//! Store errors.

use crate::types::{PgId, Version};

/// Errors of the store. `Corrupt` (checksum mismatch) is distinct from `Io`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("object not found")]
    NotFound,
    #[error("checksum mismatch in pg {pg} object {name:?} block {block}")]
    Corrupt { pg: PgId, name: String, block: u64 },
    #[error("invalid object name: {0}")]
    InvalidName(String),
    #[error("version {got:?} is not newer than pg {pg} last_version {have:?}")]
    VersionNotNewer {
        pg: PgId,
        have: Version,
        got: Version,
    },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("store is shut down")]
    Closed,
    /// The metadata database failed or holds data this version cannot read.
    #[error("metadata database error: {0}")]
    Meta(String),
    /// On-disk state is inconsistent (not a data checksum error: structure/format).
    #[error("corrupt store metadata: {0}")]
    BadFormat(String),
    /// A request argument is out of range (e.g. offset + len overflows, object too large).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An earlier write or flush failed; the store refuses service until reopened.
    #[error("store failed earlier and must be reopened: {0}")]
    Failed(String),
}

impl StoreError {
    /// A copy of the error for fanning one failure out to many waiters.
    pub(crate) fn duplicate(&self) -> StoreError {
        match self {
            StoreError::NotFound => StoreError::NotFound,
            StoreError::Corrupt { pg, name, block } => StoreError::Corrupt {
                pg: *pg,
                name: name.clone(),
                block: *block,
            },
            StoreError::InvalidName(s) => StoreError::InvalidName(s.clone()),
            StoreError::VersionNotNewer { pg, have, got } => StoreError::VersionNotNewer {
                pg: *pg,
                have: *have,
                got: *got,
            },
            StoreError::Io(e) => StoreError::Io(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
            StoreError::Closed => StoreError::Closed,
            StoreError::Meta(s) => StoreError::Meta(s.clone()),
            StoreError::BadFormat(s) => StoreError::BadFormat(s.clone()),
            StoreError::InvalidArgument(s) => StoreError::InvalidArgument(s.clone()),
            StoreError::Failed(s) => StoreError::Failed(s.clone()),
        }
    }
}

/// Maps any redb error to `StoreError::Meta`.
pub(crate) fn meta_err<E: Into<redb::Error>>(e: E) -> StoreError {
    StoreError::Meta(e.into().to_string())
}
