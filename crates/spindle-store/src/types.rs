//! Public value types of the store: identifiers, versions, mutations, PG logs, stats, config.

use std::path::PathBuf;

/// Store configuration. `StoreConfig::new(dir)` gives the defaults.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Directory holding the journal, the metadata database and the object files.
    pub dir: PathBuf,
    /// Per-PG log length; older entries are trimmed (and `log_tail` advances).
    pub pg_log_max_entries: usize,
    /// Checkpoint when the journal holds more than this many bytes.
    pub checkpoint_journal_bytes: u64,
    /// Checkpoint at least this often while there are journaled changes.
    pub checkpoint_interval_ms: u64,
    /// Whether `checkpoint_interval_ms` applies. `false`: checkpoints happen only when the
    /// journal (or the inline bytes held in memory) outgrows `checkpoint_journal_bytes`,
    /// and when [`crate::Store::checkpoint_now`] asks, so that the disk operations depend
    /// only on the transactions (deterministic simulation), never on the wall clock.
    pub timed_checkpoints: bool,
    /// Objects of at most this many bytes are stored inline (in the journal, then in the
    /// metadata database at checkpoint) instead of in a data file of their own; 0 disables.
    /// Capped at 16 MiB.
    pub inline_max_bytes: u64,
    /// Open data-file descriptors kept cached (each of the two caches: buffered and
    /// O_DIRECT). Default: a third of the open-file limit left after a reserve of 256.
    pub fd_cache_entries: usize,
    /// Page cache of the metadata database (checkpointed metadata and inline object bytes).
    pub meta_cache_bytes: u64,
    /// Size of the space reserve file (`<dir>/reserve`), released when the file system
    /// fills so that deletes, truncates and checkpoints can always be written (see "Full
    /// file system" in `docs/on-disk-format.md`). 0: no reserve.
    pub reserve_bytes: u64,
}

/// Default `reserve_bytes`: room for the journal records of deletes and for checkpoints
/// (redb rewrites the changed pages) while the file system is otherwise full.
pub const RESERVE_BYTES_DEFAULT: u64 = 16 << 20;

/// Space of the store's file system and the store's own condition (`Store::space`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceInfo {
    /// Usable size of the file system as `df` counts it: used (`f_blocks - f_bfree`) plus
    /// available; blocks reserved for root are excluded.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users (statvfs `f_bavail * f_frsize`).
    pub avail_bytes: u64,
    /// The store is in full mode (only space-freeing transactions are accepted).
    pub full: bool,
    /// A real I/O error latched the store (it refuses everything until reopened).
    pub failed: Option<String>,
}

/// Default `meta_cache_bytes`: enough for the metadata of millions of objects' hot part,
/// small next to a daemon's budget for payloads in flight.
pub const META_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Default `inline_max_bytes`. Inline objects cost no file, but a read of one whose bytes
/// are only in the database (after a checkpoint) is a database lookup and copy of the whole
/// object, and every checkpoint rewrites the changed ones into the database. Measured with
/// an image on an erasure-coded pool (64 KiB objects: 32 KiB shards), 64 KiB -> 16 KiB, two
/// runs: 4k random reads QD16 8.3k -> 16.5k-18.2k IOPS, 512k reads 248 -> 407-522 MB/s, 4k
/// random writes 730 -> 1,121-1,165 IOPS; 512k writes unchanged within noise (115 -> 106-126
/// MB/s; docs/nbd.md, "Session 8"). 4 KiB objects stay inline.
pub const INLINE_BYTES_DEFAULT: u64 = 16 << 10;

impl StoreConfig {
    /// Defaults: 4096 log entries per PG, checkpoint at 256 MiB of journal or every 5 s,
    /// objects of up to 16 KiB inline, descriptor caches sized by the open-file limit.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            dir: dir.into(),
            pg_log_max_entries: 4096,
            checkpoint_journal_bytes: 256 << 20,
            checkpoint_interval_ms: 5000,
            timed_checkpoints: true,
            inline_max_bytes: INLINE_BYTES_DEFAULT,
            fd_cache_entries: crate::fdcache::default_entries(),
            meta_cache_bytes: META_CACHE_BYTES_DEFAULT,
            reserve_bytes: RESERVE_BYTES_DEFAULT,
        }
    }
}

/// A placement group (the cluster's one PG id type; prints as `1.1f`, a stored
/// erasure-code shard as `1.1fs2`).
pub use spindle_types::PgId;
/// Placement-group version: ordered by (epoch, seq) (the cluster's one version type).
pub use spindle_types::Version;

/// What a PG log entry did to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogOp {
    Modify,
    Delete,
}

/// One PG log entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub version: Version,
    pub name: String,
    pub op: LogOp,
}

/// Object metadata visible to callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub size_bytes: u64,
    pub version: Version,
}

/// A change to one object (defined in `spindle-types`: the protocol carries it too).
pub use spindle_types::{Extent, Mutation};

/// Summary of a placement group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgInfo {
    /// Version of the newest applied log entry (or set by `set_pg_log`); ZERO if none.
    pub last_version: Version,
    /// Every entry with version > log_tail is still in the log (ZERO if never trimmed).
    pub log_tail: Version,
    pub object_count: u64,
    /// Set by `mark_pg(.., true)`: this copy misses objects (recovery in progress) and
    /// must not be used as the authoritative copy.
    pub incomplete: bool,
}

/// Counters (since open, except `objects` and `data_bytes`, which are current totals).
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    pub transactions: u64,
    pub flushes: u64,
    pub journal_bytes: u64,
    pub checkpoints: u64,
    pub corruptions_detected: u64,
    /// Reads of data files served from the page cache on the caller's thread.
    pub file_reads_cached: u64,
    /// Reads of data files that needed the disk (through the I/O engine).
    pub file_reads_engine: u64,
    /// Of `file_reads_engine`, the large ones read with O_DIRECT (bypassing the page cache).
    pub file_reads_direct: u64,
    /// Direct whole-object writes that overwrote a freed data file in place.
    pub files_reused: u64,
    /// Direct whole-object writes made from the caller's buffer itself (it was already
    /// page aligned), without an aligned copy.
    pub direct_writes_adopted: u64,
    /// Journal records dropped at open because their batch's direct data had not landed
    /// (a crash during the batch's write: never acknowledged; see `journal::DirectCheck`).
    pub replay_records_discarded: u64,
    pub objects: u64,
    pub data_bytes: u64,
}
