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
    /// The file system is full (ENOSPC) or the quota is exhausted (EDQUOT). Fails only the
    /// transaction (or batch) that needed the space; nothing is latched, and writes work
    /// again once space is free (see "Full file system" in `docs/on-disk-format.md`).
    #[error("no space left on the store's file system: {0}")]
    NoSpace(String),
    /// An earlier write or flush failed with a real I/O error (not ENOSPC); the store
    /// refuses service until reopened.
    #[error("store failed earlier and must be reopened: {0}")]
    Failed(String),
}

/// Whether `e` says the file system or the quota is full.
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
}

impl StoreError {
    /// `Io` errors that are ENOSPC / EDQUOT become `NoSpace`; everything else unchanged.
    pub(crate) fn classify(self) -> StoreError {
        match self {
            StoreError::Io(e) if is_no_space(&e) => StoreError::NoSpace(e.to_string()),
            other => other,
        }
    }
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
            StoreError::NoSpace(s) => StoreError::NoSpace(s.clone()),
            StoreError::Failed(s) => StoreError::Failed(s.clone()),
        }
    }
}

/// Maps any redb error to `StoreError::Meta`.
/// (An ENOSPC / EDQUOT from the database's file becomes `NoSpace`.)
pub(crate) fn meta_err<E: Into<redb::Error>>(e: E) -> StoreError {
    match e.into() {
        redb::Error::Io(io) if is_no_space(&io) => {
            StoreError::NoSpace(format!("metadata database: {io}"))
        }
        e => StoreError::Meta(e.to_string()),
    }
}
