//! `spindle-store`: the storage daemon's local object store.
//!
//! Objects live in placement groups (`PgId`). Every change is a transaction that is first
//! appended to a checksummed write-ahead journal, many transactions per flush (group
//! commit: one O_DIRECT + O_DSYNC write per batch, on the worker thread), then applied
//! to per-object data files (page cache) and to the in-memory metadata, and only then
//! acknowledged. Small objects (`StoreConfig::inline_max_bytes`) have no data file: they
//! are kept in memory after their journal write and stored in the redb database at the next
//! checkpoint. A periodic checkpoint syncs the dirty object files, stores metadata, inline
//! object bytes and PG logs in a redb database and restarts the journal. Every read checks
//! the CRC32C of each 4 KiB block it touches. On-disk format and crash analysis: `docs/on-disk-format.md`.

mod commit;
mod disk;
mod error;
mod fdcache;
mod journal;
mod limits;
mod meta;
mod sim_disk;
mod state;
mod store;
mod types;
mod worker;

pub use commit::Commit;
pub use disk::{
    read_exact_at, Disk, DiskBackend, DiskFile, DiskRead, DiskSpace, FileRef, OpenHow, RealDisk,
};
pub use error::StoreError;
pub use limits::DIRECT_WRITE_BYTES_MIN;
pub use sim_disk::{SimDisk, SimRng, SIM_BLOCK_BYTES, SIM_TORN_SECTOR_BYTES_DEFAULT};
pub use store::Store;
pub use types::{
    Extent, LogEntry, LogOp, Mutation, ObjectMeta, PgId, PgInfo, SpaceInfo, StoreConfig,
    StoreStats, Version, RESERVE_BYTES_DEFAULT,
};
