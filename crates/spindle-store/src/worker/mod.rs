//! The worker thread: group commit, apply, checkpoint, and replay at open.
//!
//! Order of operations for each batch (see `docs/on-disk-format.md`):
//! 1. validate every queued transaction in order (version checks, inline or file-backed,
//!    file-id allocation);
//! 2. encode the valid ones as journal records into one aligned buffer; one O_DSYNC write
//!    (a blocking pwrite on this thread: no hand-off to a ring thread);
//! 3. apply each record to the data files (buffered pwrite on this thread) or, for inline
//!    objects, to their in-memory bytes, and to the in-memory metadata;
//! 4. resolve the commits.
//!
//! Files: this one holds the worker's state, `open` and the `run` loop (batching: take
//! everything queued, up to `BATCH_TXNS_MAX` / `BATCH_BYTES_MAX`; the timed checkpoint);
//! `batch.rs` group commit and the journal write, `apply.rs` validation against the
//! batch's overlay and applying records, `inline.rs` inline objects, `direct.rs` large
//! whole-object writes straight to their file, `checkpoint.rs`, `replay.rs` (open),
//! `space.rs` full mode, the reserve file and preallocation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_io::IoBuf;

use crate::commit::CommitTx;
use crate::disk::{read_exact_at, Disk, FileRef, OpenHow};
use crate::error::{is_no_space, StoreError};
use crate::journal::{self, DirectCheck, Parsed, Record};
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_TXNS_MAX, BLOCK_BYTES, DIRECT_UNCACHED_BYTES_MIN,
    DIRECT_WRITE_BYTES_MIN, INLINE_BYTES_MAX, JOURNAL_ALIGN, JOURNAL_ZERO_CHUNK_BYTES,
    SYNCS_IN_FLIGHT_MAX,
};
use crate::meta::{self, Super};
use crate::state::{append_zeros, block_count, block_len, crcs_of, zero_crc, ObjEntry, ObjState};
use crate::store::Shared;
use crate::types::*;

mod apply;
mod batch;
mod checkpoint;
mod direct;
mod inline;
mod replay;
mod space;

/// The change of a `TxnKind::Apply`.
pub(crate) enum TxnMutation {
    Plain(Mutation),
    /// A whole-object write of bytes that others read at the same time (the replication
    /// of the same object): written from the shared buffer when it is large enough.
    FullShared(Arc<Vec<u8>>),
}

pub(crate) enum TxnKind {
    Apply {
        pg: PgId,
        name: String,
        version: Version,
        mutation: TxnMutation,
        /// CRC32C of each block of a whole-object write's data, computed by the caller
        /// from the same buffer (empty: the store computes them).
        block_crcs: Vec<u32>,
    },
    Recover {
        pg: PgId,
        name: String,
        state: Option<(Vec<u8>, Version)>,
    },
    SetPgLog {
        pg: PgId,
        entries: Vec<LogEntry>,
        last_version: Version,
        log_tail: Version,
    },
    RemovePg {
        pg: PgId,
    },
    PgMark {
        pg: PgId,
        incomplete: bool,
    },
}

pub(crate) struct Txn {
    pub kind: TxnKind,
    pub done: CommitTx,
}

pub(crate) enum Msg {
    Txn(Txn),
    /// Flush, checkpoint and stop; the result goes back on the channel.
    Shutdown(mpsc::Sender<Result<(), StoreError>>),
    /// Flush what is queued and stop (drop).
    Stop,
    /// Flush what is queued, then checkpoint now; the result goes back on the channel.
    Checkpoint(mpsc::Sender<Result<(), StoreError>>),
}

pub(crate) struct Worker {
    /// Data files freed since the last checkpoint, (id, size): not reusable yet, journal
    /// replay may still write into them by id.
    freed_this_epoch: Vec<(u64, u64)>,
    /// Data files freed before the last checkpoint: a direct write of exactly their size
    /// overwrites one in place (blocks already allocated and written: no allocation, no
    /// extent conversion, no metadata for `fdatasync` to commit).
    reusable: Vec<(u64, u64)>,
    /// Removes unreferenced data files on a thread of its own once `run` started (inline
    /// before: replay and orphan removal at open).
    unlinker: Option<mpsc::Sender<std::path::PathBuf>>,
    sh: Arc<Shared>,
    journal: FileRef,
    /// Next write offset in the journal (multiple of JOURNAL_ALIGN).
    journal_pos: u64,
    /// Journal bytes known to be allocated and written (zeros or records): O_DSYNC writes
    /// below this need no file-system metadata update.
    journal_zeroed: u64,
    epoch: u64,
    next_seq: u64,
    next_file_id: u64,
    removed_pgs: BTreeSet<PgId>,
    dirty_files: HashSet<u64>,
    last_checkpoint: Instant,
    /// Objects with `writing` raised during the current batch.
    touched: Vec<Arc<ObjEntry>>,
    /// Objects touched during replay (their CRCs are recomputed at the end). Filled only
    /// while `replaying`: on the live path the CRCs are known, and a set that only replay
    /// drains would grow with every object ever written.
    replayed: BTreeSet<(PgId, String)>,
    /// Direct records replayed with their checksums: (PG, name, file id, size); the file
    /// is cut to size after replay (a padded O_DIRECT write may have landed before its cut).
    replayed_direct: Vec<(PgId, String, u64, u64)>,
    /// True while the journal is being replayed at open.
    replaying: bool,
    /// Large payloads of the batch being built: (new file id, data), written directly.
    direct: Vec<DirectWrite>,
    /// CRCs of the direct writes of the current batch, by file id.
    direct_crcs: HashMap<u64, Vec<u32>>,
    /// Set after a failed write (a real I/O error, not ENOSPC): the store refuses further
    /// transactions.
    failed: Option<String>,
    /// Full mode (mirrored in `Shared::full`): an ENOSPC / EDQUOT was seen and the reserve
    /// file released; only space-freeing transactions are accepted until `check_space`
    /// finds room again and re-creates the reserve.
    full: bool,
    /// Until when the file system is known to have ample room (see [`PREALLOC_SKIP_AVAIL_BYTES_MIN`]).
    roomy_until: Option<Instant>,
    /// When full mode next looks at the free space.
    space_check_at: Instant,
    /// After a checkpoint failed for lack of space: not retried before this.
    checkpoint_retry_at: Option<Instant>,
    /// Data files created (and preallocated) for the batch being built: removed again if
    /// the batch fails before its journal write, so a failed batch leaves no space used.
    batch_new_files: Vec<u64>,
    /// Reusable files taken by the batch being built: given back if the batch fails.
    batch_reused: Vec<(u64, u64)>,
    /// Bytes of inline objects changed (held in memory) since the last checkpoint, counted
    /// once per change: a checkpoint is due when this exceeds `checkpoint_journal_bytes`
    /// (small writes to large inline objects would otherwise hold far more memory than
    /// they journal).
    inline_mem: u64,
}

impl Worker {
    /// Opens the directory, loads the checkpoint, replays the journal and checkpoints.
    pub fn open(
        disk: Arc<dyn Disk>,
        config: StoreConfig,
    ) -> Result<(Arc<Shared>, Worker), StoreError> {
        disk.create_dir_all(&config.dir.join("objects"))?;
        let db_path = config.dir.join("meta.redb");
        let journal_path = config.dir.join("journal");
        let journal_existed = disk.exists(&journal_path)?;
        let db = meta::open_db(&*disk, &db_path, config.meta_cache_bytes)?;
        let loaded = meta::load(&db)?;
        let (sup, pgs, fresh) = match loaded {
            Some(l) => (l.sup, l.pgs, false),
            None if !journal_existed => {
                let sup = Super {
                    epoch: 1,
                    next_seq: 1,
                    next_file_id: 1,
                };
                meta::save(&db, sup, &BTreeMap::new(), &BTreeSet::new())?;
                (sup, BTreeMap::new(), true)
            }
            None => {
                return Err(StoreError::BadFormat(format!(
                    "{} has no superblock but a journal exists",
                    db_path.display()
                )))
            }
        };
        let sh = Arc::new(Shared::new(config, disk.clone(), db, pgs));
        let journal = disk.open(&journal_path, OpenHow::Journal)?;
        // The names of a new journal and database must be durable before anything is
        // acknowledged: records in a journal whose name a power loss undoes are lost.
        // (Also on every open: cheap, and it covers a crash between create and sync.)
        disk.sync_dir(&sh.config.dir)?;
        let journal_len = journal.len_bytes()?;
        let mut w = Worker {
            sh: sh.clone(),
            journal,
            journal_pos: 0,
            journal_zeroed: 0,
            epoch: sup.epoch,
            next_seq: sup.next_seq,
            next_file_id: sup.next_file_id,
            removed_pgs: BTreeSet::new(),
            dirty_files: HashSet::new(),
            last_checkpoint: Instant::now(),
            touched: Vec::new(),
            replayed: BTreeSet::new(),
            replayed_direct: Vec::new(),
            replaying: false,
            direct: Vec::new(),
            direct_crcs: HashMap::new(),
            roomy_until: None,
            failed: None,
            full: false,
            space_check_at: Instant::now(),
            checkpoint_retry_at: None,
            batch_new_files: Vec::new(),
            batch_reused: Vec::new(),
            inline_mem: 0,
            unlinker: None,
            freed_this_epoch: Vec::new(),
            reusable: Vec::new(),
        };
        w.journal_zeroed = journal_len - journal_len % JOURNAL_ALIGN as u64;
        // The sizes of the objects loaded from the metadata database; replay and every
        // write after it keep the total (`ObjState::set_size`, removals).
        sh.counters
            .data_bytes
            .store(walk_data_bytes(&sh.pgs_read()), Relaxed);
        let replayed = if fresh { 0 } else { w.replay()? };
        w.remove_orphans()?;
        if let Err(e) = w.checkpoint() {
            // A full file system must not keep the daemon from starting: release the
            // reserve (that is what it is for) and try once more.
            let StoreError::NoSpace(msg) = e else {
                return Err(e);
            };
            w.enter_full(&msg);
            w.checkpoint()?;
        }
        if !w.full && w.sh.config.reserve_bytes > 0 {
            if let Err(e) = w.create_reserve() {
                w.enter_full(&format!("cannot create the space reserve: {e}"));
            }
        }
        let (objects, pg_count) = {
            let pgs = sh.pgs_read();
            let data_bytes = walk_data_bytes(&pgs);
            debug_assert_eq!(
                sh.counters.data_bytes.load(Relaxed),
                data_bytes,
                "data_bytes kept through replay differs from the objects' sizes"
            );
            sh.counters.data_bytes.store(data_bytes, Relaxed);
            (
                pgs.values().map(|p| p.objects.len()).sum::<usize>(),
                pgs.len(),
            )
        };
        tracing::info!(
            dir = %sh.config.dir.display(),
            replayed_records = replayed,
            objects,
            pgs = pg_count,
            "spindle-store opened"
        );
        Ok((sh, w))
    }

    pub fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let interval = Duration::from_millis(self.sh.config.checkpoint_interval_ms.max(1));
        // Unlinking a replaced 4 MiB data file took 1-7 ms of ext4 work (strace, three
        // daemons on one disk) on the path of every whole-object overwrite; the file is
        // unreferenced once its replacement's record is durable, so another thread removes
        // it. A crash before that leaves an orphan, removed at the next open.
        // A deterministic (simulated) disk is used from this thread only.
        let mut unlink_thread = None;
        if self.sh.disk.concurrent() {
            let (unlink_tx, unlink_rx) = mpsc::channel::<std::path::PathBuf>();
            let disk = self.sh.disk.clone();
            let spawned = std::thread::Builder::new()
                .name("spindle-unlink".into())
                .spawn(move || {
                    for path in unlink_rx {
                        if let Err(e) = remove_file_if_present(&*disk, &path) {
                            tracing::warn!(path = %path.display(), error = %e,
                                "cannot remove an unreferenced data file (removed at next open)");
                        }
                    }
                });
            match spawned {
                Ok(t) => {
                    self.unlinker = Some(unlink_tx);
                    unlink_thread = Some(t);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no unlink thread; data files are removed inline");
                }
            }
        }
        loop {
            // Block for work (or until a checkpoint is due). Transactions that arrive while
            // a batch is being committed queue up and become the next batch: group commit
            // with no polling (a 50 us poll while a write was in flight was most of the
            // context switches of a 4 KiB random-write load on two cores).
            // With nothing journaled no checkpoint is due: sleep a whole interval (waking
            // every millisecond once the last checkpoint was older than the interval cost
            // an idle daemon ~900 context switches a second).
            let mut wait = if self.journal_pos > 0 {
                interval
                    .saturating_sub(self.last_checkpoint.elapsed())
                    .max(Duration::from_millis(1))
            } else {
                interval
            };
            if self.full {
                wait = wait.min(SPACE_CHECK_INTERVAL);
            }
            // Without timed checkpoints (and outside full mode) nothing is due by time:
            // block until a message comes.
            let timed = self.sh.config.timed_checkpoints;
            let first = if timed || self.full {
                match rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Some(Msg::Stop),
                }
            } else {
                Some(rx.recv().unwrap_or(Msg::Stop))
            };
            let mut batch = Vec::new();
            let mut bytes = 0usize;
            let mut control = None;
            let mut next = first;
            while let Some(m) = next {
                match m {
                    Msg::Txn(t) => {
                        bytes += txn_bytes_hint(&t.kind);
                        batch.push(t);
                    }
                    other => {
                        control = Some(other);
                        break;
                    }
                }
                if batch.len() >= BATCH_TXNS_MAX || bytes >= BATCH_BYTES_MAX {
                    break;
                }
                next = rx.try_recv().ok();
            }
            while !batch.is_empty() {
                let mut ov = Overlay::default();
                let (committed, deferred) = self.submit_batch(batch, &mut ov);
                if let Some(f) = committed {
                    self.complete(f);
                }
                batch = deferred;
            }
            // Also when freed files pile up while few are reusable: a checkpoint is what
            // makes them reusable (whole-object overwrites then find one in place).
            let refill = kept_bytes(&self.freed_this_epoch) >= REUSABLE_BYTES_MAX / 2
                && kept_bytes(&self.reusable) < REUSABLE_BYTES_MAX / 4;
            let mut due = self.journal_pos > self.sh.config.checkpoint_journal_bytes
                || self.inline_mem > self.sh.config.checkpoint_journal_bytes
                || (timed && self.journal_pos > 0 && self.last_checkpoint.elapsed() >= interval)
                || refill;
            match control {
                Some(Msg::Shutdown(reply)) => {
                    let r = match &self.failed {
                        Some(f) => Err(StoreError::Failed(f.clone())),
                        None => self.checkpoint(),
                    };
                    // Every removal queued so far is done when shutdown returns.
                    self.unlinker = None;
                    if let Some(t) = unlink_thread.take() {
                        let _ = t.join();
                    }
                    let _ = reply.send(r);
                    return;
                }
                Some(Msg::Stop) => return,
                Some(Msg::Checkpoint(reply)) => {
                    let r = match &self.failed {
                        Some(f) => Err(StoreError::Failed(f.clone())),
                        None => self.checkpoint(),
                    };
                    let _ = reply.send(r);
                    // Just done: not due again in this round.
                    due = false;
                }
                _ => {}
            }
            let retry_ok = self.checkpoint_retry_at.is_none_or(|t| Instant::now() >= t);
            if due && self.failed.is_none() && retry_ok {
                match self.checkpoint() {
                    Ok(()) => self.checkpoint_retry_at = None,
                    // Nothing is lost: the journal still holds everything since the last
                    // checkpoint. Retried once space is free (full mode released the
                    // reserve, so usually at once).
                    Err(StoreError::NoSpace(msg)) => {
                        tracing::warn!(error = %msg, "checkpoint needs space; retried later");
                        self.enter_full(&msg);
                        self.checkpoint_retry_at = Some(Instant::now() + SPACE_CHECK_INTERVAL);
                    }
                    Err(e) => self.fail(&StoreError::Failed(format!("checkpoint failed: {e}"))),
                }
            }
            self.check_space();
            // The daemon is above its nearfull ratio: kept files must not hold space.
            if self.sh.space_tight.load(Relaxed)
                && !(self.reusable.is_empty() && self.freed_this_epoch.is_empty())
            {
                self.drop_kept_files();
            }
        }
    }

    /// Latches the failure: no further transaction is accepted.
    fn fail(&mut self, e: &StoreError) {
        if self.failed.is_none() {
            tracing::error!(error = %e, "write failed; store stops accepting writes");
            let msg = match e {
                StoreError::Failed(m) => m.clone(),
                e => e.to_string(),
            };
            *self.sh.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg.clone());
            self.failed = Some(msg);
        }
        self.direct.clear();
        self.direct_crcs.clear();
    }

    /// After a batch's journal write: applies its records and acknowledges them.
    fn complete(&mut self, f: Committed) {
        let result = match &self.failed {
            Some(msg) => Err(StoreError::Failed(msg.clone())),
            None => {
                self.sh.counters.flushes.fetch_add(1, Relaxed);
                self.sh.counters.journal_bytes.fetch_add(f.padded, Relaxed);
                let mut r = Ok(());
                for rec in f.records {
                    if let Err(e) = self.exec(rec) {
                        r = Err(e);
                        break;
                    }
                }
                self.finish_batch();
                r
            }
        };
        match result {
            Ok(()) => {
                self.sh
                    .counters
                    .transactions
                    .fetch_add(f.waiters.len() as u64, Relaxed);
                for w in f.waiters {
                    let _ = w.send(Ok(()));
                }
            }
            Err(e) => {
                self.fail(&e);
                self.finish_batch();
                for w in f.waiters {
                    let _ = w.send(Err(e.duplicate()));
                }
            }
        }
    }

    /// (file id, size) of the object after the validated transactions (file id 0: inline).
    fn exists(&self, ov: &Overlay, pg: PgId, name: &str) -> Option<(u64, u64)> {
        if let Some(v) = ov.objects.get(&(pg, name.to_string())) {
            return *v;
        }
        if ov.removed.contains(&pg) {
            return None;
        }
        let pgs = self.sh.pgs_read();
        let e = pgs.get(&pg)?.objects.get(name)?;
        let st = e.lock();
        Some((st.file_id, st.size))
    }

    /// Whether an object of `size` bytes may be stored inline.
    fn fits_inline(&self, size: u64) -> bool {
        let max = self.sh.config.inline_max_bytes.min(INLINE_BYTES_MAX);
        max > 0 && size <= max
    }

    fn alloc_file(&mut self) -> u64 {
        let id = self.next_file_id;
        self.next_file_id += 1;
        self.batch_new_files.push(id);
        id
    }
}

/// Per-block CRCs of the first `size` bytes of `file` (zeros past its end), read in chunks.
/// The state of `pg`, created dirty (and with its log marked for reset if the PG was
/// removed since the last checkpoint) when missing.
fn remove_file_if_present(disk: &dyn Disk, path: &std::path::Path) -> io::Result<()> {
    match disk.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn pg_entry(
    pgs: &mut std::collections::BTreeMap<PgId, crate::state::PgState>,
    pg: PgId,
    recreated: bool,
) -> &mut crate::state::PgState {
    pgs.entry(pg).or_insert_with(|| crate::state::PgState {
        ck_log_reset: recreated,
        ck_dirty: true,
        ..Default::default()
    })
}

/// The sizes of every object in the PG map together (a walk of every object: at open only).
fn walk_data_bytes(pgs: &BTreeMap<PgId, crate::state::PgState>) -> u64 {
    pgs.values()
        .flat_map(|p| p.objects.values())
        .map(|e| e.lock().size)
        .sum()
}

fn crcs_of_file(file: &dyn crate::disk::DiskFile, size: u64) -> io::Result<Vec<u32>> {
    const CHUNK: u64 = 1 << 20;
    let mut crcs = Vec::with_capacity(block_count(size) as usize);
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pos = 0;
    while pos < size {
        let len = (size - pos).min(CHUNK) as usize;
        buf[..len].fill(0);
        file.read_at(&mut buf[..len], pos)?;
        crcs.extend(crcs_of(&buf[..len]));
        pos += len as u64;
    }
    Ok(crcs)
}

fn txn_bytes_hint(k: &TxnKind) -> usize {
    match k {
        TxnKind::Apply { mutation, .. } => match mutation {
            TxnMutation::Plain(Mutation::WriteFull(d) | Mutation::Write { data: d, .. }) => {
                d.len() + 64
            }
            TxnMutation::Plain(Mutation::WriteExtents { extents, data }) => {
                data.len() + extents.len() * 12 + 64
            }
            TxnMutation::FullShared(d) => d.len() + 64,
            TxnMutation::Plain(_) => 64,
        },
        TxnKind::Recover { state, .. } => state.as_ref().map_or(64, |(d, _)| d.len() + 64),
        TxnKind::SetPgLog { entries, .. } => entries.len() * 32 + 64,
        TxnKind::RemovePg { .. } | TxnKind::PgMark { .. } => 64,
    }
}

/// A large whole-object write of the current batch, written before its journal record.
/// The bytes of a direct whole-object write.
enum DirectData {
    Owned(Vec<u8>),
    /// Read by others too (replication of the same object).
    Shared(Arc<Vec<u8>>),
}

impl DirectData {
    fn as_slice(&self) -> &[u8] {
        match self {
            DirectData::Owned(v) => v,
            DirectData::Shared(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            DirectData::Owned(v) => v,
            DirectData::Shared(v) => Arc::try_unwrap(v).unwrap_or_else(|v| v.to_vec()),
        }
    }

    /// The buffer itself as an engine buffer (no copy).
    fn into_iobuf(self) -> IoBuf {
        match self {
            DirectData::Owned(v) => IoBuf::from(v),
            DirectData::Shared(v) => IoBuf::shared(v),
        }
    }
}

struct DirectWrite {
    file_id: u64,
    data: DirectData,
    /// The target, opened (and, when new, preallocated) at validation.
    file: FileRef,
    /// A new file (else a reusable file of exactly `data.len()` bytes, overwritten in
    /// place): the objects directory is synced after the batch's direct writes.
    created: bool,
    /// Block CRCs the caller computed from `data` (see `TxnKind::Apply`), of the right
    /// count; None: computed here.
    block_crcs: Option<Vec<u32>>,
}

/// A batch's direct writes, ready to go out together with its journal write.
struct PreparedDirect {
    /// (file, offset, buffer) of each data write.
    writes: Vec<(FileRef, u64, IoBuf)>,
    /// Files written padded to 4 KiB: cut to their size and synced after the write.
    fix_len: Vec<(FileRef, u64)>,
    /// A file of the batch is new: the objects directory is synced before the acknowledgement.
    created: bool,
}

/// How often full mode looks at the free space.
const SPACE_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// With at least this much available, buffered writes are not preallocated before their
/// journal write: one batch is at most `BATCH_BYTES_MAX` (64 MiB), so the file system
/// cannot run out within [`ROOM_CHECK_INTERVAL`] unless something else writes ~10 GB/s.
/// Below it every write's blocks are allocated first, so that applying a durable record
/// never meets ENOSPC (which would latch the store).
const PREALLOC_SKIP_AVAIL_BYTES_MIN: u64 = 1 << 30;
const ROOM_CHECK_INTERVAL: Duration = Duration::from_millis(100);
const _: () = assert!(PREALLOC_SKIP_AVAIL_BYTES_MIN >= 8 * crate::limits::BATCH_BYTES_MAX as u64);

/// Full mode ends only with at least this much space free (and twice the reserve).
const SPACE_FREE_MIN_BYTES: u64 = 4 << 20;

/// Bytes of a journal record besides its name and data (header 32, fixed body fields,
/// alignment padding), rounded up generously.
const RECORD_BYTES_MAX_OVERHEAD: usize = 128;

const FULL_MESSAGE: &str =
    "store is full: only deletes and truncates are accepted until space is free";

/// Whether a transaction is accepted in full mode: it frees space or writes no data
/// (deletes, truncates, removals, PG metadata).
fn frees_space(kind: &TxnKind) -> bool {
    match kind {
        TxnKind::Apply { mutation, .. } => matches!(
            mutation,
            TxnMutation::Plain(Mutation::Delete | Mutation::Truncate { .. })
        ),
        TxnKind::Recover { state, .. } => state.is_none(),
        TxnKind::SetPgLog { .. } | TxnKind::RemovePg { .. } | TxnKind::PgMark { .. } => true,
    }
}

/// Most bytes of freed data files kept for reuse per store (each holds its disk space
/// until reused or the daemon restarts): 64 files of 4 MiB objects, or 2,048
/// erasure-coded shards of 128 KiB. In bytes, not files: a checkpoint is what makes freed
/// files reusable, and one is started when half of this waits (see `run`), so a count
/// would checkpoint 32 times as often for 128 KiB shards as for 4 MiB objects.
const REUSABLE_BYTES_MAX: u64 = 256 << 20;
/// Most freed files kept (bounds the search for a file of the right size).
const REUSABLE_FILES_MAX: usize = (REUSABLE_BYTES_MAX / DIRECT_WRITE_BYTES_MIN as u64) as usize;
const _: () = assert!(REUSABLE_FILES_MAX <= 4096);

/// Bytes of the kept files `(id, size)`.
fn kept_bytes(files: &[(u64, u64)]) -> u64 {
    files.iter().map(|&(_, size)| size).sum()
}

/// A batch whose journal write was done and that is not applied yet.
struct Committed {
    padded: u64,
    records: Vec<Record>,
    waiters: Vec<CommitTx>,
}

/// Effects of the batch's validated transactions, not applied yet.
#[derive(Default)]
struct Overlay {
    last: HashMap<PgId, Version>,
    /// (file id, size) after the validated transactions; None: deleted.
    objects: HashMap<(PgId, String), Option<(u64, u64)>>,
    removed: HashSet<PgId>,
}
