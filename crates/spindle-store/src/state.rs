//! In-memory state: PGs, objects (metadata + per-block CRCs), PG logs.
//!
//! Invariants:
//! - Only the store's worker thread changes this state; readers take short locks.
//! - A file-backed object (`file_id != 0`) has a data file of exactly `size` bytes once the
//!   writes of the current batch completed, and `crcs[i]` is the CRC32C of block `i`'s real
//!   bytes.
//! - An inline object (`file_id == 0`) has no data file. Its bytes are in `inline` (exactly
//!   `size` bytes) if it changed since the last checkpoint (or was loaded by the worker),
//!   else only in the metadata database's `inline` table; the CRCs are kept the same way.
//! - While a batch is writing an object, `writing > 0`; every change of data or CRCs bumps
//!   `gen` (at the start and at the end of the write), so a reader whose CRC check fails can
//!   tell a race (gen changed: retry) from corruption (gen unchanged).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::limits::BLOCK_BYTES;
use crate::types::{LogEntry, ObjectMeta, Version};

#[derive(Debug, Clone)]
pub(crate) struct ObjState {
    /// Data file id; 0 = inline object.
    pub file_id: u64,
    /// In-memory bytes of an inline object (`None`: read them from the metadata database).
    pub inline: Option<Arc<Vec<u8>>>,
    pub size: u64,
    pub version: Version,
    pub crcs: Vec<u32>,
    pub writing: u32,
    pub gen: u64,
}

impl ObjState {
    /// Sets the object's size, keeping `total` (the store's `Counters::data_bytes`: the
    /// sizes of every object in the PG map) in step. Only for objects in the map; a removed
    /// object's size is taken out of `total` by whoever removes it.
    pub fn set_size(&mut self, new: u64, total: &AtomicU64) {
        let old = self.size;
        if new > old {
            total.fetch_add(new - old, Relaxed);
        } else if old > new {
            let before = total.fetch_sub(old - new, Relaxed);
            debug_assert!(before >= old - new, "data_bytes below an object's size");
        }
        self.size = new;
    }

    pub fn is_inline(&self) -> bool {
        self.file_id == 0
    }
    pub fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            size_bytes: self.size,
            version: self.version,
        }
    }
}

pub(crate) struct ObjEntry {
    pub st: Mutex<ObjState>,
    pub notify: Notify,
}

impl ObjEntry {
    pub fn new(st: ObjState) -> Arc<ObjEntry> {
        Arc::new(ObjEntry {
            st: Mutex::new(st),
            notify: Notify::new(),
        })
    }
    pub fn lock(&self) -> MutexGuard<'_, ObjState> {
        // A poisoned lock means a bug panicked while holding it; the data is still usable.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
pub(crate) struct PgState {
    pub objects: BTreeMap<String, Arc<ObjEntry>>,
    pub log: VecDeque<LogEntry>,
    pub last_version: Version,
    pub log_tail: Version,
    /// This copy misses objects its log does not account for (being backfilled).
    pub incomplete: bool,
    /// Checkpoint bookkeeping: object names changed since the last checkpoint.
    pub ck_dirty_objects: BTreeSet<String>,
    /// The persisted log must be replaced wholesale at the next checkpoint.
    pub ck_log_reset: bool,
    /// Log entries with a version <= this are persisted.
    pub ck_log_persisted: Version,
    /// last_version / log_tail / log changed since the last checkpoint.
    pub ck_dirty: bool,
}

impl PgState {
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
            && self.log.is_empty()
            && self.last_version == Version::ZERO
            && !self.incomplete
    }

    /// Appends `entry` and trims the log to `max` entries (advancing `log_tail`).
    pub fn push_log(&mut self, entry: LogEntry, max: usize) {
        self.last_version = entry.version;
        self.log.push_back(entry);
        self.trim(max);
        self.ck_dirty = true;
    }

    pub fn trim(&mut self, max: usize) {
        while self.log.len() > max {
            if let Some(e) = self.log.pop_front() {
                self.log_tail = self.log_tail.max(e.version);
            }
        }
    }
}

/// Number of CRC blocks of an object of `size` bytes.
pub(crate) fn block_count(size: u64) -> u64 {
    size.div_ceil(BLOCK_BYTES)
}

/// Real bytes of block `b` in an object of `size` bytes.
pub(crate) fn block_len(size: u64, b: u64) -> u64 {
    let start = b * BLOCK_BYTES;
    size.saturating_sub(start).min(BLOCK_BYTES)
}

static ZEROS: [u8; BLOCK_BYTES as usize] = [0; BLOCK_BYTES as usize];

/// CRC32C of `n <= BLOCK_BYTES` zero bytes.
pub(crate) fn zero_crc(n: u64) -> u32 {
    let n = n.min(BLOCK_BYTES) as usize;
    spindle_types::crc::crc32c(&ZEROS[..n])
}

/// CRC32C of `prev_crc`'s bytes followed by `n` zero bytes.
pub(crate) fn append_zeros(prev_crc: u32, n: u64) -> u32 {
    let n = n.min(BLOCK_BYTES) as usize;
    spindle_types::crc::crc32c_append(prev_crc, &ZEROS[..n])
}

/// Per-block CRCs of `data` (the object's whole content).
pub(crate) fn crcs_of(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK_BYTES as usize)
        .map(spindle_types::crc::crc32c)
        .collect()
}
