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
use crate::journal::{self, Parsed, Record};
use crate::limits::{
    BATCH_BYTES_MAX, BATCH_TXNS_MAX, BLOCK_BYTES, DIRECT_WRITE_BYTES_MIN, INLINE_BYTES_MAX,
    JOURNAL_ALIGN, JOURNAL_ZERO_CHUNK_BYTES, SYNCS_IN_FLIGHT_MAX,
};
use crate::meta::{self, Super};
use crate::state::{append_zeros, block_count, block_len, crcs_of, zero_crc, ObjEntry, ObjState};
use crate::store::Shared;
use crate::types::*;

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

    /// Replays the journal records of the current epoch; returns how many were applied.
    fn replay(&mut self) -> Result<u64, StoreError> {
        self.replaying = true;
        let file_len = self.journal.len_bytes()?;
        let mut base = 0u64; // file offset of buf[0]
        let mut buf: Vec<u8> = Vec::new();
        let mut pos = 0u64;
        let mut count = 0u64;
        let chunk = 16usize << 20;
        let reader = self
            .sh
            .disk
            .open(&self.sh.config.dir.join("journal"), OpenHow::Read)?;
        loop {
            let in_buf = (pos - base) as usize;
            let eof = base + buf.len() as u64 >= file_len;
            match journal::parse(
                &buf[in_buf.min(buf.len())..],
                eof,
                self.epoch,
                self.next_seq,
            ) {
                Parsed::Record { record, bytes } => {
                    self.exec(record)?;
                    self.next_seq += 1;
                    count += 1;
                    pos += bytes as u64;
                }
                Parsed::NeedBytes(n) => {
                    // Slide the window to `pos` and read at least `n` bytes.
                    let want = n.max(chunk);
                    let avail = file_len.saturating_sub(pos);
                    let len = (want as u64).min(avail) as usize;
                    let mut nb = vec![0u8; len];
                    read_exact_at(&*reader, &mut nb, pos)?;
                    base = pos;
                    buf = nb;
                }
                Parsed::Invalid => {
                    let aligned = pos.next_multiple_of(JOURNAL_ALIGN as u64);
                    if aligned != pos {
                        pos = aligned;
                        if pos > base + buf.len() as u64 {
                            base = pos;
                            buf.clear();
                        }
                        continue;
                    }
                    break;
                }
            }
        }
        self.finish_batch();
        // Recompute the CRCs of every replayed object from its file.
        self.replaying = false;
        let replayed = std::mem::take(&mut self.replayed);
        for (pg, name) in replayed {
            let entry = self
                .sh
                .pgs_read()
                .get(&pg)
                .and_then(|p| p.objects.get(&name).cloned());
            if let Some(entry) = entry {
                if entry.lock().is_inline() {
                    let data = self.inline_data(pg, &name, &entry)?;
                    entry.lock().crcs = crcs_of(&data);
                    continue;
                }
                let mut st = entry.lock();
                let file = self.sh.file(st.file_id, true)?;
                if file.len_bytes()? != st.size {
                    file.set_len(st.size)?;
                }
                st.crcs = crcs_of_file(&*file, st.size)?;
            }
        }
        tracing::info!(records = count, journal_bytes = pos, "journal replayed");
        Ok(count)
    }

    /// Removes data files that no object references (left by crashes before journaling).
    fn remove_orphans(&mut self) -> Result<(), StoreError> {
        let referenced: HashSet<u64> = self
            .sh
            .pgs_read()
            .values()
            .flat_map(|p| p.objects.values().map(|e| e.lock().file_id))
            .collect();
        let mut removed = 0u64;
        for name in self.sh.disk.read_dir(&self.sh.objects_dir)? {
            let Some(id) = name.to_str().and_then(|n| u64::from_str_radix(n, 16).ok()) else {
                continue;
            };
            if name.len() == 16 && !referenced.contains(&id) {
                self.unlink(id)?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(files = removed, "removed unreferenced data files");
        }
        Ok(())
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
            if !batch.is_empty() {
                let mut ov = Overlay::default();
                if let Some(f) = self.submit_batch(batch, &mut ov) {
                    self.complete(f);
                }
            }
            // Also when freed files pile up while few are reusable: a checkpoint is what
            // makes them reusable (whole-object overwrites then find one in place).
            let refill = self.freed_this_epoch.len() >= REUSABLE_FILES_MAX / 2
                && self.reusable.len() < REUSABLE_FILES_MAX / 4;
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

    /// Full mode ends when the file system has room for the reserve twice over and the
    /// reserve could be created again.
    fn check_space(&mut self) {
        if !self.full || Instant::now() < self.space_check_at {
            return;
        }
        self.space_check_at = Instant::now() + SPACE_CHECK_INTERVAL;
        let Ok(crate::disk::DiskSpace { avail_bytes, .. }) =
            self.sh.disk.space(&self.sh.config.dir)
        else {
            return;
        };
        let want_bytes = self
            .sh
            .config
            .reserve_bytes
            .saturating_mul(2)
            .max(SPACE_FREE_MIN_BYTES);
        if avail_bytes < want_bytes {
            return;
        }
        if self.sh.config.reserve_bytes > 0 {
            if let Err(e) = self.create_reserve() {
                tracing::debug!(error = %e, "space reserve not re-created yet");
                return;
            }
        }
        self.full = false;
        self.sh.full.store(false, Relaxed);
        self.checkpoint_retry_at = None;
        tracing::info!(
            avail_bytes,
            "file system has room again; store accepts writes"
        );
    }

    /// Enters full mode (once): releases the reserve so that deletes, truncates and
    /// checkpoints find room, and refuses new data from now on.
    fn enter_full(&mut self, why: &str) {
        self.space_check_at = Instant::now() + SPACE_CHECK_INTERVAL;
        if self.full {
            return;
        }
        self.full = true;
        self.sh.full.store(true, Relaxed);
        let released = remove_file_if_present(&*self.sh.disk, &self.reserve_path());
        self.drop_kept_files();
        tracing::warn!(
            error = %why,
            reserve_released = released.is_ok(),
            "file system full: store refuses new data (deletes and truncates still work) \
             until space is free"
        );
    }

    /// Freed files kept for reuse hold their space: give it back (no record refers to
    /// them; replay re-creates a file an earlier record writes into, as for deletes).
    fn drop_kept_files(&mut self) {
        let kept: Vec<(u64, u64)> = self
            .reusable
            .drain(..)
            .chain(self.freed_this_epoch.drain(..))
            .collect();
        if !kept.is_empty() {
            tracing::info!(
                files = kept.len(),
                bytes = kept.iter().map(|k| k.1).sum::<u64>(),
                "file system tight: removing the freed data files kept for reuse"
            );
        }
        for (id, _) in kept {
            self.remove_unreferenced(id);
        }
    }

    fn reserve_path(&self) -> std::path::PathBuf {
        self.sh.config.dir.join("reserve")
    }

    /// Creates (or completes) the reserve file of `reserve_bytes` allocated bytes; a
    /// partial one is removed on failure (it would only hold space).
    fn create_reserve(&mut self) -> Result<(), StoreError> {
        let path = self.reserve_path();
        let want = self.sh.config.reserve_bytes;
        let made = (|| -> Result<(), StoreError> {
            let file = self.sh.disk.open(&path, OpenHow::Data { create: true })?;
            if file.len_bytes()? >= want {
                return Ok(());
            }
            file.allocate(0, want, false)?;
            if file.len_bytes()? < want {
                // No fallocate here (EOPNOTSUPP): write the zeros.
                let chunk = vec![0u8; 1 << 20];
                let mut pos = 0;
                while pos < want {
                    let n = (want - pos).min(chunk.len() as u64) as usize;
                    file.write_all_at(&chunk[..n], pos)?;
                    pos += n as u64;
                }
            }
            file.sync_all()?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = remove_file_if_present(&*self.sh.disk, &path);
            return Err(e.classify());
        }
        Ok(())
    }

    /// Validates a batch (against the state plus the batch's earlier transactions, `ov`),
    /// writes its direct payloads and its journal record. `None` if nothing is left to
    /// journal.
    fn submit_batch(&mut self, batch: Vec<Txn>, ov: &mut Overlay) -> Option<Committed> {
        if let Some(f) = &self.failed {
            for t in batch {
                let _ = t.done.send(Err(StoreError::Failed(f.clone())));
            }
            return None;
        }
        let batch = self.admit(batch);
        let mut records = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        let mut hint = 0;
        for t in batch {
            match self.validate(ov, t.kind) {
                Ok(r) => {
                    hint += r.encoded_bytes_hint();
                    records.push(r);
                    waiters.push(t.done);
                }
                Err(e) => {
                    if let StoreError::NoSpace(msg) = &e {
                        self.enter_full(msg);
                    }
                    let _ = t.done.send(Err(e));
                }
            }
        }
        if records.is_empty() {
            return None;
        }
        let seq_before = self.next_seq;
        let submitted = self
            .write_direct()
            .and_then(|_| self.journal_submit(&records, hint));
        match submitted.map_err(StoreError::classify) {
            Ok(padded) => {
                self.batch_new_files.clear();
                self.batch_reused.clear();
                Some(Committed {
                    padded,
                    records,
                    waiters,
                })
            }
            // Nothing of the batch is in the journal (or it was zeroed again) and nothing
            // was applied: undo what validation reserved and fail just this batch.
            Err(StoreError::NoSpace(msg)) => {
                self.abort_batch(seq_before);
                self.enter_full(&msg);
                for w in waiters {
                    let _ = w.send(Err(StoreError::NoSpace(msg.clone())));
                }
                None
            }
            Err(e) => {
                self.fail(&e);
                for w in waiters {
                    let _ = w.send(Err(e.duplicate()));
                }
                None
            }
        }
    }

    /// Journal space for the batch, before anything is validated, and full-mode
    /// admission: returns the transactions to validate (the others are answered
    /// `NoSpace`).
    fn admit(&mut self, batch: Vec<Txn>) -> Vec<Txn> {
        if !self.full {
            let need: usize = batch.iter().map(|t| self.journal_bytes_max(&t.kind)).sum();
            match self.reserve_journal(need) {
                Ok(()) => return batch,
                Err(StoreError::NoSpace(msg)) => self.enter_full(&msg),
                // Other errors surface at the journal write (and latch there).
                Err(_) => return batch,
            }
        }
        let mut keep = Vec::with_capacity(batch.len());
        for t in batch {
            if frees_space(&t.kind) {
                keep.push(t);
            } else {
                let _ = t.done.send(Err(StoreError::NoSpace(FULL_MESSAGE.into())));
            }
        }
        let need: usize = keep.iter().map(|t| self.journal_bytes_max(&t.kind)).sum();
        if let Err(e) = self.reserve_journal(need) {
            if matches!(e, StoreError::NoSpace(_)) {
                for t in keep {
                    let _ = t.done.send(Err(e.duplicate()));
                }
                return Vec::new();
            }
        }
        keep
    }

    /// Makes sure the journal has `need` bytes of records (padded) allocated ahead of the
    /// write position.
    fn reserve_journal(&mut self, need: usize) -> Result<(), StoreError> {
        if need == 0 {
            return Ok(());
        }
        let end = self.journal_pos + journal::batch_padded_len(need) as u64;
        self.extend_journal(end).map_err(StoreError::classify)
    }

    /// An upper bound of the journal bytes `kind`'s record takes (data of direct writes
    /// excluded: it goes to its own file).
    fn journal_bytes_max(&self, kind: &TxnKind) -> usize {
        let data = |len: usize, may_be_direct: bool| {
            if may_be_direct && len >= DIRECT_WRITE_BYTES_MIN && !self.fits_inline(len as u64) {
                0
            } else {
                len
            }
        };
        RECORD_BYTES_MAX_OVERHEAD
            + match kind {
                TxnKind::Apply { name, mutation, .. } => {
                    name.len()
                        + match mutation {
                            TxnMutation::FullShared(d) => data(d.len(), true),
                            TxnMutation::Plain(Mutation::WriteFull(d)) => data(d.len(), true),
                            TxnMutation::Plain(Mutation::Write { data: d, .. }) => d.len(),
                            TxnMutation::Plain(_) => 0,
                        }
                }
                TxnKind::Recover { name, state, .. } => {
                    name.len() + state.as_ref().map_or(0, |(d, _)| data(d.len(), true))
                }
                TxnKind::SetPgLog { entries, .. } => {
                    entries.iter().map(|e| 32 + e.name.len()).sum::<usize>()
                }
                TxnKind::RemovePg { .. } | TxnKind::PgMark { .. } => 0,
            }
    }

    /// Undoes what validation did for a batch that failed before its journal write
    /// (sequence numbers, files created for it, reusable files taken).
    fn abort_batch(&mut self, seq_before: u64) {
        self.next_seq = seq_before;
        self.direct.clear();
        self.direct_crcs.clear();
        for id in std::mem::take(&mut self.batch_new_files) {
            self.remove_new_file(id);
        }
        self.reusable.append(&mut self.batch_reused);
    }

    /// Removes an unreferenced data file (through the unlink thread when running).
    fn remove_unreferenced(&mut self, file_id: u64) {
        let path = self.sh.file_path(file_id);
        let path = match &self.unlinker {
            Some(tx) => match tx.send(path) {
                Ok(()) => return,
                Err(mpsc::SendError(path)) => path,
            },
            None => path,
        };
        if let Err(e) = remove_file_if_present(&*self.sh.disk, &path) {
            tracing::warn!(file_id, error = %e, "cannot remove an unreferenced data file");
        }
    }

    /// Removes a data file created for the batch being built (not journaled).
    fn remove_new_file(&mut self, file_id: u64) {
        self.batch_new_files.retain(|&id| id != file_id);
        self.batch_reused.retain(|&(id, _)| id != file_id);
        self.sh.forget_file(file_id);
        self.dirty_files.remove(&file_id);
        if let Err(e) = remove_file_if_present(&*self.sh.disk, &self.sh.file_path(file_id)) {
            tracing::warn!(file_id, error = %e, "cannot remove an unjournaled data file");
        }
    }

    /// Allocates the blocks of `[offset, offset + len)` of data file `file_id` (created if
    /// missing; size unchanged), so that applying the record after its journal write
    /// cannot fail for lack of space.
    fn preallocate(&mut self, file_id: u64, offset: u64, len: u64) -> Result<(), StoreError> {
        if len == 0 || self.roomy() {
            return Ok(());
        }
        let file = self.sh.file(file_id, true)?;
        file.allocate(offset, len, true)
            .map_err(|e| StoreError::Io(e).classify())
    }

    /// The file system has at least [`PREALLOC_SKIP_AVAIL_BYTES_MIN`] available (asked at
    /// most every [`ROOM_CHECK_INTERVAL`]): buffered writes then skip their preallocation
    /// (an `fallocate` per 4 KiB write cost 8-25% of 4k random writes QD16).
    fn roomy(&mut self) -> bool {
        if self.full {
            return false;
        }
        let now = Instant::now();
        if self.roomy_until.is_some_and(|t| now < t) {
            return true;
        }
        let roomy = self
            .sh
            .disk
            .space(&self.sh.config.dir)
            .is_ok_and(|s| s.avail_bytes >= PREALLOC_SKIP_AVAIL_BYTES_MIN);
        self.roomy_until = roomy.then(|| now + ROOM_CHECK_INTERVAL);
        roomy
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

    /// The file a direct write of `size` bytes goes to: a reusable file of exactly that
    /// size (overwritten in place) or a new one. `(file id, reused)`.
    fn direct_target(&mut self, size: u64) -> (u64, bool) {
        match self.reusable.iter().position(|&(_, s)| s == size) {
            Some(i) => {
                let taken = self.reusable.swap_remove(i);
                self.batch_reused.push(taken);
                (taken.0, true)
            }
            None => (self.alloc_file(), false),
        }
    }

    /// Opens the target of a direct write before its batch is journaled: a reusable file
    /// as is, else a new one. Not preallocated: the direct write itself runs before the
    /// batch's journal write (`submit_batch`), so an ENOSPC there aborts the batch with
    /// nothing journaled, and a preallocated (unwritten) extent would cost an extent
    /// conversion at the write's completion (512k writes QD16 ran ~20% slower with it).
    /// `(file, created)`.
    fn open_direct_target(
        &mut self,
        file_id: u64,
        reuse: bool,
    ) -> Result<(FileRef, bool), StoreError> {
        let path = self.sh.file_path(file_id);
        if reuse {
            if let Ok(f) = self.sh.disk.open(&path, OpenHow::DirectExisting) {
                return Ok((f, false));
            }
        }
        let opened = self
            .sh
            .disk
            .open(&path, OpenHow::DirectNew)
            .map_err(StoreError::from);
        match opened {
            Ok(f) => Ok((f, true)),
            Err(e) => {
                self.remove_new_file(file_id);
                Err(e.classify())
            }
        }
    }

    /// Checks a transaction against the state (plus the earlier ones of the batch) and turns
    /// it into a journal record.
    fn validate(&mut self, ov: &mut Overlay, kind: TxnKind) -> Result<Record, StoreError> {
        if self.full && !frees_space(&kind) {
            return Err(StoreError::NoSpace(FULL_MESSAGE.into()));
        }
        Ok(match kind {
            TxnKind::Apply {
                pg,
                name,
                version,
                mutation,
                block_crcs,
            } => {
                let have = match ov.last.get(&pg) {
                    Some(v) => *v,
                    None => self
                        .sh
                        .pgs_read()
                        .get(&pg)
                        .map_or(Version::ZERO, |p| p.last_version),
                };
                if version <= have {
                    return Err(StoreError::VersionNotNewer {
                        pg,
                        have,
                        got: version,
                    });
                }
                ov.last.insert(pg, version);
                let direct_size =
                    |len: usize| len >= DIRECT_WRITE_BYTES_MIN && !self.fits_inline(len as u64);
                // Whole-object writes large enough for a file of their own bypass the
                // journal; everything else is an ordinary mutation.
                let full = match mutation {
                    TxnMutation::FullShared(d) => Ok(DirectData::Shared(d)),
                    TxnMutation::Plain(Mutation::WriteFull(d)) if direct_size(d.len()) => {
                        Ok(DirectData::Owned(d))
                    }
                    TxnMutation::Plain(m) => Err(m),
                };
                let mutation = match full {
                    Ok(data) if direct_size(data.len()) => {
                        let size = data.len() as u64;
                        let (file_id, reuse) = self.direct_target(size);
                        let (file, created) = match self.open_direct_target(file_id, reuse) {
                            Ok(f) => f,
                            Err(e) => {
                                ov.last.insert(pg, have);
                                return Err(e);
                            }
                        };
                        ov.objects.insert((pg, name.clone()), Some((file_id, size)));
                        let block_crcs =
                            (block_crcs.len() as u64 == block_count(size)).then_some(block_crcs);
                        self.direct.push(DirectWrite {
                            file_id,
                            data,
                            file,
                            created,
                            block_crcs,
                        });
                        return Ok(Record::ApplyDirect {
                            pg,
                            name,
                            version,
                            file_id,
                            size,
                        });
                    }
                    // A shared payload too small for a file of its own.
                    Ok(data) => Mutation::WriteFull(data.into_vec()),
                    Err(m) => m,
                };
                let existing = self.exists(ov, pg, &name);
                let cur_size = existing.map_or(0, |(_, size)| size);
                let new_size = match &mutation {
                    Mutation::WriteFull(d) => d.len() as u64,
                    Mutation::Write { offset, data } => {
                        cur_size.max(offset.saturating_add(data.len() as u64))
                    }
                    Mutation::Truncate { size_bytes } => *size_bytes,
                    Mutation::Delete => 0,
                };
                let whole = matches!(mutation, Mutation::WriteFull(_));
                let file_id = match (&mutation, existing) {
                    (Mutation::Delete, e) => e.map_or(0, |(id, _)| id),
                    // Small: a new object, an inline one, or a file-backed one replaced
                    // whole is (or becomes) inline.
                    (_, e)
                        if self.fits_inline(new_size)
                            && (whole || e.is_none_or(|(id, _)| id == 0)) =>
                    {
                        0
                    }
                    (_, Some((id, _))) if id != 0 => id,
                    // A new large object, or an inline object growing past the threshold.
                    _ => self.alloc_file(),
                };
                if file_id != 0 && !matches!(mutation, Mutation::Delete) {
                    // The blocks the record's application writes are allocated now, before
                    // the journal write: applying a durable record never meets ENOSPC.
                    let relocating = existing.map(|(id, _)| id) != Some(file_id);
                    let (start, end) = match &mutation {
                        Mutation::WriteFull(d) => (0, d.len() as u64),
                        Mutation::Write { offset, data } if relocating => {
                            (0, cur_size.max(offset + data.len() as u64))
                        }
                        Mutation::Write { offset, data } => (*offset, offset + data.len() as u64),
                        Mutation::Truncate { size_bytes } if relocating => {
                            (0, cur_size.min(*size_bytes))
                        }
                        Mutation::Truncate { .. } | Mutation::Delete => (0, 0),
                    };
                    if let Err(e) = self.preallocate(file_id, start, end - start) {
                        if relocating {
                            self.remove_new_file(file_id);
                        }
                        ov.last.insert(pg, have);
                        return Err(e);
                    }
                }
                let after = (!matches!(mutation, Mutation::Delete)).then_some((file_id, new_size));
                ov.objects.insert((pg, name.clone()), after);
                Record::Apply {
                    pg,
                    name,
                    version,
                    file_id,
                    mutation,
                }
            }
            TxnKind::Recover { pg, name, state } => {
                let state = match state {
                    Some((data, version))
                        if data.len() >= DIRECT_WRITE_BYTES_MIN
                            && !self.fits_inline(data.len() as u64) =>
                    {
                        let size = data.len() as u64;
                        let (file_id, reuse) = self.direct_target(size);
                        let (file, created) = self.open_direct_target(file_id, reuse)?;
                        ov.objects.insert((pg, name.clone()), Some((file_id, size)));
                        self.direct.push(DirectWrite {
                            file_id,
                            data: DirectData::Owned(data),
                            file,
                            created,
                            block_crcs: None,
                        });
                        return Ok(Record::RecoverDirect {
                            pg,
                            name,
                            version,
                            file_id,
                            size,
                        });
                    }
                    other => other,
                };
                let existing = self.exists(ov, pg, &name);
                let file_id = match (&state, existing) {
                    (None, e) => e.map_or(0, |(id, _)| id),
                    (Some((d, _)), _) if self.fits_inline(d.len() as u64) => 0,
                    (Some(_), Some((id, _))) if id != 0 => id,
                    (Some(_), _) => self.alloc_file(),
                };
                if let (Some((d, _)), true) = (&state, file_id != 0) {
                    if let Err(e) = self.preallocate(file_id, 0, d.len() as u64) {
                        if existing.map(|(id, _)| id) != Some(file_id) {
                            self.remove_new_file(file_id);
                        }
                        return Err(e);
                    }
                }
                let after = state.as_ref().map(|(d, _)| (file_id, d.len() as u64));
                ov.objects.insert((pg, name.clone()), after);
                Record::Recover {
                    pg,
                    name,
                    file_id,
                    state,
                }
            }
            TxnKind::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            } => {
                ov.last.insert(pg, last_version);
                Record::SetPgLog {
                    pg,
                    entries,
                    last_version,
                    log_tail,
                }
            }
            TxnKind::RemovePg { pg } => {
                ov.last.insert(pg, Version::ZERO);
                ov.removed.insert(pg);
                ov.objects.retain(|(p, _), _| *p != pg);
                Record::RemovePg { pg }
            }
            TxnKind::PgMark { pg, incomplete } => Record::PgMark { pg, incomplete },
        })
    }

    /// Writes the batch's large payloads to their new files (O_DIRECT, in parallel), syncs
    /// them and the objects directory. Must complete before their records are journaled.
    fn write_direct(&mut self) -> Result<(), StoreError> {
        if self.direct.is_empty() {
            return Ok(());
        }
        let direct = std::mem::take(&mut self.direct);
        let mut files = Vec::with_capacity(direct.len());
        let mut crcs_of_batch = Vec::with_capacity(direct.len());
        let mut created = false;
        let sh = self.sh.clone();
        // Each write is submitted as soon as its buffer is ready, so copying and
        // checksumming the next one overlaps the previous one's I/O (engine on a real disk).
        let mut writes = direct.into_iter().map(
            |DirectWrite {
                 file_id,
                 data,
                 file,
                 created: new_file,
                 block_crcs,
             }| {
                created |= new_file;
                if !new_file {
                    sh.counters.files_reused.fetch_add(1, Relaxed);
                }
                let size_bytes = data.len() as u64;
                let bytes = data.as_slice();
                let aligned = (bytes.as_ptr() as usize).is_multiple_of(JOURNAL_ALIGN)
                    && bytes.len().is_multiple_of(JOURNAL_ALIGN);
                let padded_len = bytes.len().next_multiple_of(JOURNAL_ALIGN);
                let (buf, crcs) = match (aligned, block_crcs) {
                    // Already O_DIRECT-ready (the daemon's allocator page-aligns large
                    // blocks, and received payloads are allocated at their exact size):
                    // write the buffer itself, with the block checksums computed while the
                    // frame it came in was verified.
                    (true, Some(crcs)) => (data.into_iobuf(), crcs),
                    (true, None) => {
                        let crcs = bytes
                            .chunks(BLOCK_BYTES as usize)
                            .map(spindle_types::crc::crc32c)
                            .collect();
                        (data.into_iobuf(), crcs)
                    }
                    (false, Some(crcs)) => {
                        (IoBuf::aligned_copy(bytes, padded_len, JOURNAL_ALIGN), crcs)
                    }
                    // One pass over the data: copy into an aligned buffer and checksum each
                    // block.
                    (false, None) => {
                        let mut crcs =
                            Vec::with_capacity(bytes.len().div_ceil(BLOCK_BYTES as usize));
                        let buf = IoBuf::aligned_copy_inspect(
                            bytes,
                            padded_len,
                            JOURNAL_ALIGN,
                            BLOCK_BYTES as usize,
                            |block| crcs.push(spindle_types::crc::crc32c(block)),
                        );
                        (buf, crcs)
                    }
                };
                if aligned {
                    sh.counters.direct_writes_adopted.fetch_add(1, Relaxed);
                }
                assert_eq!(crcs.len() as u64, block_count(size_bytes));
                crcs_of_batch.push((file_id, crcs));
                files.push((file.clone(), size_bytes));
                (file, 0, buf)
            },
        );
        let written = sh.disk.write_batch(&mut writes);
        drop(writes);
        for (file_id, crcs) in crcs_of_batch {
            self.direct_crcs.insert(file_id, crcs);
        }
        written?;
        for (file, size) in &files {
            if !size.is_multiple_of(JOURNAL_ALIGN as u64) {
                file.set_len(*size)?;
            }
        }
        let len = files.len();
        let mut each = files.into_iter().map(|(f, _)| Ok(f));
        self.sh.disk.sync_data_each(&mut each, len)?;
        // New names must be durable before a record refers to them; a reused file's name
        // already is (it was synced when the file was created).
        if created {
            self.sh.disk.sync_dir(&self.sh.objects_dir)?;
        }
        Ok(())
    }

    /// Points an object at its freshly written direct file (and unlinks the old file).
    fn exec_direct(
        &mut self,
        pg: PgId,
        name: &str,
        version: Version,
        file_id: u64,
        size: u64,
    ) -> Result<(), StoreError> {
        self.next_file_id = self.next_file_id.max(file_id + 1);
        let e = self.get_or_create(pg, name, file_id);
        self.begin_write(&e);
        let crcs = match self.direct_crcs.remove(&file_id) {
            Some(c) => c,
            None => {
                // Replay: the CRCs are recomputed from the file after replay.
                debug_assert!(self.replaying, "a live direct write without its CRCs");
                self.replayed.insert((pg, name.to_string()));
                vec![0; block_count(size) as usize]
            }
        };
        let old = {
            let mut st = e.lock();
            let old = st.file_id;
            st.file_id = file_id;
            st.inline = None;
            st.size = size;
            st.crcs = crcs;
            st.version = version;
            old
        };
        if old != file_id && old != 0 {
            self.unlink(old)?;
        }
        Ok(())
    }

    /// Encodes `records` into one aligned buffer and writes it (O_DSYNC) at the journal end.
    /// Returns the padded length written. On a failure nothing of the batch is valid in
    /// the journal when the error is ENOSPC (a partly written batch is zeroed again and
    /// the sequence numbers are given back by the caller); other errors latch the store.
    fn journal_submit(&mut self, records: &[Record], hint: usize) -> Result<u64, StoreError> {
        let mut bytes = Vec::with_capacity(hint);
        for r in records {
            r.encode(self.epoch, self.next_seq, &mut bytes);
            self.next_seq += 1;
        }
        let padded = journal::batch_padded_len(bytes.len());
        let mut buf = IoBuf::aligned(padded, JOURNAL_ALIGN);
        buf[..bytes.len()].copy_from_slice(&bytes);
        drop(bytes);
        self.extend_journal(self.journal_pos + padded as u64)
            .map_err(StoreError::classify)?;
        // A blocking write on this thread rather than a request to the I/O engine: the
        // worker waits for its (single) journal write anyway, and going through the
        // engine's ring thread (and the kernel's io-wq worker an O_DSYNC direct write is
        // punted to) added three thread hand-offs per commit; measured on 4 KiB random
        // writes, docs/benchmarks.md. A failed or short write fails the batch.
        match self.journal.write_all_at(&buf, self.journal_pos) {
            Ok(()) => {
                self.journal_pos += padded as u64;
                Ok(padded as u64)
            }
            // The region was allocated by `extend_journal`, so this is not expected; if it
            // happens, a prefix of the batch's records may be on disk and valid: zero the
            // region again so that replay never accepts them (later batches reuse these
            // sequence numbers), else latch.
            Err(e) if is_no_space(&e) => {
                let zeros = IoBuf::aligned(padded, JOURNAL_ALIGN);
                match self.journal.write_all_at(&zeros, self.journal_pos) {
                    Ok(()) => Err(StoreError::NoSpace(format!("journal write: {e}"))),
                    Err(z) => {
                        self.journal_pos += padded as u64;
                        Err(StoreError::Failed(format!(
                            "journal write failed ({e}) and the partial batch could not be \
                             erased ({z})"
                        )))
                    }
                }
            }
            Err(e) => {
                self.journal_pos += padded as u64;
                Err(StoreError::Io(e))
            }
        }
    }

    /// Makes sure the journal is allocated and written (with zeros) up to `end`, in chunks,
    /// so that batch writes overwrite allocated blocks and the O_DSYNC write needs no
    /// metadata commit.
    fn extend_journal(&mut self, end: u64) -> Result<(), StoreError> {
        while self.journal_zeroed < end {
            // Full: only what is needed (the space left may be less than a chunk).
            let chunk = if self.full {
                end - self.journal_zeroed
            } else {
                JOURNAL_ZERO_CHUNK_BYTES.max(end - self.journal_zeroed)
            };
            let buf = IoBuf::aligned(chunk as usize, JOURNAL_ALIGN);
            let journal = self.journal.clone();
            let mut write = std::iter::once((journal, self.journal_zeroed, buf));
            self.sh.disk.write_batch(&mut write)?;
            self.journal_zeroed += chunk;
        }
        Ok(())
    }

    /// Ends the current batch: lets readers in again.
    fn finish_batch(&mut self) {
        for e in self.touched.drain(..) {
            {
                let mut st = e.lock();
                st.writing -= 1;
                st.gen += 1;
            }
            e.notify.notify_waiters();
        }
    }

    /// Marks `e` as being written (readers wait or retry).
    fn begin_write(&mut self, e: &Arc<ObjEntry>) {
        {
            let mut st = e.lock();
            st.writing += 1;
            st.gen += 1;
        }
        self.touched.push(e.clone());
    }

    /// The entry of `name` in `pg`, created (with `file_id`) if missing.
    fn get_or_create(&mut self, pg: PgId, name: &str, file_id: u64) -> Arc<ObjEntry> {
        let mut pgs = self.sh.pgs_write();
        let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
        p.ck_dirty_objects.insert(name.to_string());
        let e = p
            .objects
            .entry(name.to_string())
            .or_insert_with(|| {
                ObjEntry::new(ObjState {
                    file_id,
                    inline: (file_id == 0).then(|| Arc::new(Vec::new())),
                    size: 0,
                    version: Version::ZERO,
                    crcs: Vec::new(),
                    writing: 0,
                    gen: 0,
                })
            })
            .clone();
        drop(pgs);
        e
    }

    /// Removes `name` from `pg` (if present) and unlinks its file.
    fn delete_object(&mut self, pg: PgId, name: &str) -> Result<(), StoreError> {
        let removed = {
            let mut pgs = self.sh.pgs_write();
            let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
            p.ck_dirty_objects.insert(name.to_string());
            p.objects.remove(name)
        };
        if let Some(e) = removed {
            self.begin_write(&e);
            let id = e.lock().file_id;
            if id != 0 {
                self.unlink(id)?;
            }
        }
        Ok(())
    }

    /// Drops a data file no object references any more (called only once that is durable
    /// or, at open, known): removed by the unlink thread while `run` is going, else here.
    fn unlink(&mut self, file_id: u64) -> Result<(), StoreError> {
        self.sh.forget_file(file_id);
        self.dirty_files.remove(&file_id);
        let path = self.sh.file_path(file_id);
        // Keep whole, block-aligned large files for in-place reuse (only while running:
        // at open, unreferenced files are removed).
        if self.unlinker.is_some()
            && !self.full
            && !self.sh.space_tight.load(Relaxed)
            && self.freed_this_epoch.len() + self.reusable.len() < REUSABLE_FILES_MAX
        {
            if let Ok(size) = self.sh.disk.file_len(&path) {
                if size >= DIRECT_WRITE_BYTES_MIN as u64
                    && size.is_multiple_of(JOURNAL_ALIGN as u64)
                {
                    self.freed_this_epoch.push((file_id, size));
                    return Ok(());
                }
            }
        }
        let path = match &self.unlinker {
            Some(tx) => match tx.send(path) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(path)) => {
                    self.unlinker = None;
                    path
                }
            },
            None => path,
        };
        Ok(remove_file_if_present(&*self.sh.disk, &path)?)
    }

    fn submit_write(
        &mut self,
        file: &FileRef,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        if data.is_empty() {
            return Ok(());
        }
        file.write_all_at(&data, offset)?;
        Ok(())
    }

    /// Reads `[start, start + len)` of `file` (zeros past its end).
    fn read_old(&mut self, file: &FileRef, start: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let mut buf = vec![0u8; len as usize];
        if len == 0 {
            return Ok(buf);
        }
        let (n, buf) = self
            .sh
            .disk
            .read_start(file, start, IoBuf::from(std::mem::take(&mut buf)))
            .wait()?;
        let mut buf = buf.into_vec();
        buf.truncate(n);
        buf.resize(len as usize, 0);
        Ok(buf)
    }

    /// Grows `st` to `new` bytes of zeros (CRCs only; the file grows by the caller).
    fn grow_crcs(st: &mut ObjState, new: u64) {
        let old = st.size;
        if new <= old {
            return;
        }
        if !old.is_multiple_of(BLOCK_BYTES) {
            let b = old / BLOCK_BYTES;
            let cur = block_len(old, b);
            let next = block_len(new, b);
            if let Some(c) = st.crcs.get_mut(b as usize) {
                *c = append_zeros(*c, next - cur);
            }
        }
        for b in block_count(old)..block_count(new) {
            st.crcs.push(zero_crc(block_len(new, b)));
        }
        st.size = new;
    }

    fn write_at(
        &mut self,
        e: &Arc<ObjEntry>,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        let end = offset + data.len() as u64;
        let new = old.max(end);
        let mut new_crcs = Vec::new();
        if !data.is_empty() {
            for b in offset / BLOCK_BYTES..=(end - 1) / BLOCK_BYTES {
                let bs = b * BLOCK_BYTES;
                let be = bs + block_len(new, b);
                let crc = if offset <= bs && end >= be {
                    spindle_types::crc::crc32c(
                        &data[(bs - offset) as usize..(be - offset) as usize],
                    )
                } else {
                    let old_end = old.min(be).max(bs);
                    let mut block = self.read_old(&file, bs, old_end - bs)?;
                    block.resize((be - bs) as usize, 0);
                    let from = offset.max(bs);
                    let to = end.min(be);
                    block[(from - bs) as usize..(to - bs) as usize]
                        .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                    spindle_types::crc::crc32c(&block)
                };
                new_crcs.push((b, crc));
            }
        }
        {
            let mut st = e.lock();
            Self::grow_crcs(&mut st, new);
            for (b, crc) in new_crcs {
                if let Some(c) = st.crcs.get_mut(b as usize) {
                    *c = crc;
                }
            }
        }
        if data.is_empty() && new > old {
            file.set_len(new)?;
        }
        self.submit_write(&file, offset, data)
    }

    fn truncate(&mut self, e: &Arc<ObjEntry>, new: u64) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        if new < old && !new.is_multiple_of(BLOCK_BYTES) {
            let b = new / BLOCK_BYTES;
            let bs = b * BLOCK_BYTES;
            let block = self.read_old(&file, bs, new - bs)?;
            let crc = spindle_types::crc::crc32c(&block);
            let mut st = e.lock();
            st.crcs.truncate(b as usize);
            st.crcs.push(crc);
            st.size = new;
        } else if new < old {
            let mut st = e.lock();
            st.crcs.truncate(block_count(new) as usize);
            st.size = new;
        } else {
            Self::grow_crcs(&mut e.lock(), new);
        }
        file.set_len(new)?;
        Ok(())
    }

    fn write_full(&mut self, e: &Arc<ObjEntry>, data: Vec<u8>) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        let new = data.len() as u64;
        if new < old {
            file.set_len(new)?;
        }
        {
            let mut st = e.lock();
            st.crcs = crcs_of(&data);
            st.size = new;
        }
        self.submit_write(&file, 0, data)
    }

    /// The bytes of inline object `e` (`name` in `pg`): the in-memory copy, else loaded from
    /// the metadata database (and kept in memory: the caller is about to change them).
    /// Missing or wrong-length stored bytes are taken as zeros / cut to the size, as a
    /// missing or short data file is by the file path (reads still detect it by CRC).
    fn inline_data(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
    ) -> Result<Arc<Vec<u8>>, StoreError> {
        if let Some(d) = &e.lock().inline {
            return Ok(d.clone());
        }
        let mut data = meta::load_inline(&*self.sh.db()?, pg, name)?.unwrap_or_default();
        let mut st = e.lock();
        data.resize(usize::try_from(st.size).unwrap_or(usize::MAX), 0);
        let data = Arc::new(data);
        st.inline = Some(data.clone());
        Ok(data)
    }

    /// Moves object `e` to `target` (0: inline, else that data file) if it is elsewhere.
    /// `whole`: the caller replaces all the bytes next, so they need not be carried over.
    fn relocate(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
        target: u64,
        whole: bool,
    ) -> Result<(), StoreError> {
        let (cur, size) = {
            let st = e.lock();
            (st.file_id, st.size)
        };
        if cur == target {
            return Ok(());
        }
        if target == 0 {
            // File -> inline (a WriteFull / recover of a small object): drop the file.
            let data = if whole {
                Vec::new()
            } else {
                let file = self.sh.file(cur, true)?;
                let mut d = self.read_old(&file, 0, size)?;
                d.truncate(usize::try_from(size).unwrap_or(usize::MAX));
                d
            };
            {
                let mut st = e.lock();
                st.file_id = 0;
                st.inline = Some(Arc::new(data));
            }
            return self.unlink(cur);
        }
        if cur != 0 {
            e.lock().file_id = target;
            return Ok(());
        }
        // Inline -> file (the object grows past the threshold): the new file starts as a
        // copy of the inline bytes. Replay may find the file left by an earlier run: reset it.
        let data = if whole {
            None
        } else {
            Some(self.inline_data(pg, name, e)?)
        };
        {
            let mut st = e.lock();
            st.file_id = target;
            st.inline = None;
        }
        let file = self.sh.file(target, true)?;
        self.dirty_files.insert(target);
        file.set_len(0)?;
        if let Some(d) = data {
            file.set_len(d.len() as u64)?;
            self.submit_write(&file, 0, d.as_ref().clone())?;
        }
        Ok(())
    }

    /// Applies `m` to inline object `e` (in memory; persisted at the next checkpoint).
    fn apply_inline(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
        m: Mutation,
    ) -> Result<(), StoreError> {
        let too_large = || StoreError::InvalidArgument("inline object too large".into());
        // The byte range the mutation rewrites (its blocks get new CRCs).
        let (data, changed) = match m {
            Mutation::WriteFull(d) => {
                let n = d.len();
                (d, 0..n)
            }
            Mutation::Delete => return Ok(()),
            Mutation::Write { offset, data: part } => {
                let from = usize::try_from(offset).map_err(|_| too_large())?;
                let to = from.checked_add(part.len()).ok_or_else(too_large)?;
                let mut d = self.take_inline(pg, name, e)?;
                if d.len() < to {
                    d.resize(to, 0);
                }
                d[from..to].copy_from_slice(&part);
                (d, from..to)
            }
            Mutation::Truncate { size_bytes } => {
                let n = usize::try_from(size_bytes).map_err(|_| too_large())?;
                let mut d = self.take_inline(pg, name, e)?;
                d.resize(n, 0);
                (d, 0..0)
            }
        };
        self.inline_mem += data.len() as u64;
        let mut st = e.lock();
        let (old, new) = (st.size, data.len() as u64);
        // Like the file path: a block keeps its CRC unless the mutation changed its bytes or
        // its length, so damage to untouched stored bytes stays detectable.
        let crcs = data
            .chunks(BLOCK_BYTES as usize)
            .enumerate()
            .map(|(b, chunk)| {
                let (bs, be) = (b * BLOCK_BYTES as usize, (b + 1) * BLOCK_BYTES as usize);
                let b = b as u64;
                let touched = changed.start < be && changed.end > bs;
                let same_len = block_len(old, b) == block_len(new, b);
                match st.crcs.get(b as usize) {
                    Some(c) if !touched && same_len => *c,
                    _ => spindle_types::crc::crc32c(chunk),
                }
            })
            .collect();
        st.crcs = crcs;
        st.size = new;
        st.inline = Some(Arc::new(data));
        Ok(())
    }

    /// The inline bytes of `e`, taken out of the object for changing (copied only if a
    /// reader still holds them).
    fn take_inline(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
    ) -> Result<Vec<u8>, StoreError> {
        let old = self.inline_data(pg, name, e)?;
        e.lock().inline = None;
        Ok(Arc::try_unwrap(old).unwrap_or_else(|a| a.as_ref().clone()))
    }

    /// Applies one journaled record to the data files and the in-memory state.
    fn exec(&mut self, record: Record) -> Result<(), StoreError> {
        let max = self.sh.config.pg_log_max_entries;
        match record {
            Record::Apply {
                pg,
                name,
                version,
                file_id,
                mutation,
            } => {
                self.next_file_id = self.next_file_id.max(file_id + 1);
                let op = if matches!(mutation, Mutation::Delete) {
                    self.delete_object(pg, &name)?;
                    LogOp::Delete
                } else {
                    let e = self.get_or_create(pg, &name, file_id);
                    self.begin_write(&e);
                    let whole = matches!(mutation, Mutation::WriteFull(_));
                    self.relocate(pg, &name, &e, file_id, whole)?;
                    if file_id == 0 {
                        self.apply_inline(pg, &name, &e, mutation)?;
                    } else {
                        match mutation {
                            Mutation::WriteFull(data) => self.write_full(&e, data)?,
                            Mutation::Write { offset, data } => self.write_at(&e, offset, data)?,
                            Mutation::Truncate { size_bytes } => self.truncate(&e, size_bytes)?,
                            Mutation::Delete => {}
                        }
                    }
                    e.lock().version = version;
                    if self.replaying {
                        self.replayed.insert((pg, name.clone()));
                    }
                    LogOp::Modify
                };
                let mut pgs = self.sh.pgs_write();
                if let Some(p) = pgs.get_mut(&pg) {
                    p.push_log(LogEntry { version, name, op }, max);
                }
            }
            Record::Recover {
                pg,
                name,
                file_id,
                state,
            } => {
                self.next_file_id = self.next_file_id.max(file_id + 1);
                match state {
                    None => self.delete_object(pg, &name)?,
                    Some((data, version)) => {
                        let e = self.get_or_create(pg, &name, file_id);
                        self.begin_write(&e);
                        self.relocate(pg, &name, &e, file_id, true)?;
                        if file_id == 0 {
                            self.apply_inline(pg, &name, &e, Mutation::WriteFull(data))?;
                        } else {
                            self.write_full(&e, data)?;
                        }
                        e.lock().version = version;
                        if self.replaying {
                            self.replayed.insert((pg, name));
                        }
                    }
                }
            }
            Record::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            } => {
                let mut pgs = self.sh.pgs_write();
                let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
                p.log = entries.into();
                p.last_version = last_version;
                p.log_tail = log_tail;
                p.trim(max);
                p.ck_log_reset = true;
                p.ck_dirty = true;
            }
            Record::ApplyDirect {
                pg,
                name,
                version,
                file_id,
                size,
            } => {
                self.exec_direct(pg, &name, version, file_id, size)?;
                let mut pgs = self.sh.pgs_write();
                if let Some(p) = pgs.get_mut(&pg) {
                    let op = LogOp::Modify;
                    p.push_log(LogEntry { version, name, op }, max);
                }
            }
            Record::RecoverDirect {
                pg,
                name,
                version,
                file_id,
                size,
            } => self.exec_direct(pg, &name, version, file_id, size)?,
            Record::PgMark { pg, incomplete } => {
                let mut pgs = self.sh.pgs_write();
                let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
                p.incomplete = incomplete;
                if !incomplete {
                    // Complete again: the log may have gaps (objects recovered by state),
                    // so it is dropped; everything up to last_version is present.
                    p.log.clear();
                    p.log_tail = p.last_version;
                    p.ck_log_reset = true;
                }
                p.ck_dirty = true;
            }
            Record::RemovePg { pg } => {
                let removed = self.sh.pgs_write().remove(&pg);
                self.removed_pgs.insert(pg);
                if let Some(p) = removed {
                    for (name, e) in p.objects {
                        self.begin_write(&e);
                        let id = e.lock().file_id;
                        if id != 0 {
                            self.unlink(id)?;
                        }
                        self.replayed.remove(&(pg, name));
                    }
                }
            }
        }
        Ok(())
    }

    /// Syncs dirty data files, stores the metadata durably and restarts the journal.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        // At most SYNCS_IN_FLIGHT_MAX syncs (and open descriptors) at a time: a random
        // write workload over a large image dirties one file per write, tens of thousands
        // per checkpoint (see `Disk::sync_data_each`).
        // Kept dirty until the checkpoint commits: a checkpoint that fails (for lack of
        // space, in the database commit) is retried with the same files.
        let dirty: Vec<u64> = self.dirty_files.iter().copied().collect();
        let sh = &self.sh;
        let mut files = dirty.into_iter().filter_map(|id| match sh.file(id, false) {
            Ok(f) => Some(Ok(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e)),
        });
        sh.disk.sync_data_each(&mut files, SYNCS_IN_FLIGHT_MAX)?;
        sh.disk.sync_dir(&sh.objects_dir)?;
        let sup = Super {
            epoch: self.epoch + 1,
            next_seq: self.next_seq,
            next_file_id: self.next_file_id,
        };
        let saved = {
            let pgs = self.sh.pgs_read();
            self.sh
                .db()
                .and_then(|db| meta::save(&db, sup, &pgs, &self.removed_pgs))
        };
        if let Err(e) = saved {
            // redb refuses every operation after a failed write until reopened; the
            // previous commit is intact on disk (commits are atomic). Only a lack of
            // space is retried: after any other error (a failed fsync above all) the page
            // cache may hold pages that never reach the disk, and a database reopened on
            // them would write a header that points at them (after a power loss redb then
            // finds a corrupt tree); the store latches instead and recovers at restart.
            if matches!(e, StoreError::NoSpace(_)) {
                if let Err(r) = self.sh.reopen_db() {
                    tracing::warn!(error = %r, "cannot reopen the metadata database yet");
                }
            }
            return Err(e);
        }
        self.dirty_files.clear();
        {
            let mut pgs = self.sh.pgs_write();
            pgs.retain(|_, p| !p.is_empty());
            for p in pgs.values_mut() {
                // The inline bytes are durable in the database now: drop the memory copies.
                for name in &p.ck_dirty_objects {
                    if let Some(e) = p.objects.get(name) {
                        e.lock().inline = None;
                    }
                }
                p.ck_dirty_objects.clear();
                p.ck_dirty = false;
                p.ck_log_reset = false;
                p.ck_log_persisted = p.log.back().map_or(Version::ZERO, |e| e.version);
            }
        }
        self.removed_pgs.clear();
        // No journal record from before this checkpoint is ever replayed again: files freed
        // until now can be overwritten.
        self.reusable.append(&mut self.freed_this_epoch);
        self.epoch = sup.epoch;
        self.journal_pos = 0;
        self.inline_mem = 0;
        self.last_checkpoint = Instant::now();
        self.sh.counters.checkpoints.fetch_add(1, Relaxed);
        Ok(())
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

/// Most freed data files kept for reuse (each holds its disk space until reused or the
/// daemon restarts: 64 x 4 MiB objects = 256 MiB per daemon at most).
const REUSABLE_FILES_MAX: usize = 64;

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
