//! `Store`: the public handle, shared state and the read path.
//!
//! Writes are queued to the worker thread (`worker.rs`), which journals, applies and then
//! acknowledges them. Reads run on the caller's task: they snapshot an object's metadata,
//! read the blocks through the I/O engine and check every block CRC; a mismatch is reported
//! as corruption only if no write touched the object meanwhile (else the read is retried).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use spindle_io::IoBuf;

use crate::commit::Commit;
use crate::disk::{Disk, FileRef, OpenHow, RealDisk};
use crate::error::StoreError;
use crate::fdcache::FdCache;
use crate::limits::{
    BLOCK_BYTES, DIRECT_READ_BYTES_MIN, MUTATION_BYTES_MAX, NAME_BYTES_MAX, OBJECT_BYTES_MAX,
};
use crate::meta;
use crate::state::{ObjEntry, PgState};
use crate::types::*;
use crate::worker::{Msg, Txn, TxnKind, TxnMutation, Worker};

#[derive(Default)]
pub(crate) struct Counters {
    pub transactions: AtomicU64,
    pub flushes: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub checkpoints: AtomicU64,
    pub corruptions: AtomicU64,
    pub file_reads_cached: AtomicU64,
    pub file_reads_engine: AtomicU64,
    pub file_reads_direct: AtomicU64,
    pub files_reused: AtomicU64,
    pub direct_writes_adopted: AtomicU64,
    pub replay_records_discarded: AtomicU64,
    /// Sizes of every object in the PG map together (`ObjState::set_size`, removals; set
    /// from a walk at open): what `Store::stats` reports without walking every object.
    pub data_bytes: AtomicU64,
}

/// State shared by the handle, readers and the worker thread.
pub(crate) struct Shared {
    pub config: StoreConfig,
    pub objects_dir: PathBuf,
    /// Every file-system operation goes through this (see `disk.rs`).
    pub disk: Arc<dyn Disk>,
    /// The metadata database (checkpoints; inline object bytes are read from it). `None`
    /// only while it is being reopened after a failed commit (redb refuses every later
    /// operation after an I/O error, e.g. ENOSPC, until reopened).
    db: RwLock<Option<Arc<redb::Database>>>,
    /// The store is in *full mode*: an ENOSPC / EDQUOT was seen and the space reserve is
    /// released; only transactions that free space (or change no data) are accepted
    /// until the file system has room again (see `docs/on-disk-format.md`).
    pub full: AtomicBool,
    /// The file system is tight (the daemon is above its nearfull ratio,
    /// [`Store::set_space_tight`]): freed data files are not kept for reuse.
    pub space_tight: AtomicBool,
    /// Set when a real I/O error (not ENOSPC) latched the store: its message.
    pub failed: std::sync::Mutex<Option<String>>,
    pub pgs: RwLock<BTreeMap<PgId, PgState>>,
    fds: FdCache,
    /// Read-only O_DIRECT descriptors of data files, for large reads that miss the page
    /// cache (a descriptor's O_DIRECT flag is fixed, so these are separate from `fds`).
    direct_fds: FdCache,
    /// Set once the file system refused O_DIRECT (tmpfs): large reads stay buffered.
    direct_reads_unsupported: AtomicBool,
    pub counters: Counters,
}

impl Shared {
    pub fn new(
        config: StoreConfig,
        disk: Arc<dyn Disk>,
        db: redb::Database,
        pgs: BTreeMap<PgId, PgState>,
    ) -> Shared {
        Shared {
            objects_dir: config.dir.join("objects"),
            fds: FdCache::new(config.fd_cache_entries),
            direct_fds: FdCache::new(config.fd_cache_entries),
            config,
            disk,
            db: RwLock::new(Some(Arc::new(db))),
            full: AtomicBool::new(false),
            space_tight: AtomicBool::new(false),
            failed: std::sync::Mutex::new(None),
            pgs: RwLock::new(pgs),
            direct_reads_unsupported: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// The metadata database.
    pub fn db(&self) -> Result<Arc<redb::Database>, StoreError> {
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Meta("metadata database is being reopened".into()))
    }

    /// Closes and reopens the metadata database (after a failed commit: redb latches I/O
    /// errors). Waits up to 5 s for readers that hold the old handle.
    pub fn reopen_db(&self) -> Result<(), StoreError> {
        let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut old = old;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still) if std::time::Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(still) => {
                        *slot = Some(still);
                        return Err(StoreError::Meta(
                            "metadata database still in use; not reopened".into(),
                        ));
                    }
                }
            }
        }
        let db = meta::open_db(
            &*self.disk,
            &self.config.dir.join("meta.redb"),
            self.config.meta_cache_bytes,
        )?;
        *slot = Some(Arc::new(db));
        Ok(())
    }

    pub fn pgs_read(&self) -> RwLockReadGuard<'_, BTreeMap<PgId, PgState>> {
        self.pgs.read().unwrap_or_else(|p| p.into_inner())
    }
    pub fn pgs_write(&self) -> RwLockWriteGuard<'_, BTreeMap<PgId, PgState>> {
        self.pgs.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn file_path(&self, file_id: u64) -> PathBuf {
        self.objects_dir.join(format!("{file_id:016x}"))
    }

    /// The data file `file_id`, from the cache or opened (created if `create`).
    pub fn file(&self, file_id: u64, create: bool) -> io::Result<FileRef> {
        self.fds.get_or_open(file_id, || {
            self.disk
                .open(&self.file_path(file_id), OpenHow::Data { create })
        })
    }

    /// A read-only O_DIRECT descriptor of data file `file_id` (cached), or `None` when
    /// the file system does not support O_DIRECT or the open failed (the caller then
    /// reads buffered, which reports real errors).
    pub fn direct_file(&self, file_id: u64) -> Option<FileRef> {
        if self.direct_reads_unsupported.load(Relaxed) {
            return None;
        }
        let opened = self.direct_fds.get_or_open(file_id, || {
            self.disk
                .open(&self.file_path(file_id), OpenHow::DirectRead)
        });
        match opened {
            Ok(f) => Some(f),
            Err(e) => {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    self.direct_reads_unsupported.store(true, Relaxed);
                }
                None
            }
        }
    }

    pub fn forget_file(&self, file_id: u64) {
        self.fds.remove(file_id);
        self.direct_fds.remove(file_id);
    }
}

/// Where a read finds an object's bytes (snapshotted with its generation).
enum Src {
    File(u64),
    /// Inline, changed since the last checkpoint: the worker's in-memory copy.
    Mem(Arc<Vec<u8>>),
    /// Inline, unchanged since the last checkpoint: the metadata database.
    Db,
}

/// The object store. `Send + Sync`; share it as `Arc<Store>`.
pub struct Store {
    sh: Arc<Shared>,
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

fn check_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() {
        return Err(StoreError::InvalidName("empty name".into()));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(StoreError::InvalidName(format!(
            "name is {} bytes, the limit is {NAME_BYTES_MAX}",
            name.len()
        )));
    }
    Ok(())
}

fn check_mutation(m: &Mutation) -> Result<(), StoreError> {
    let (end, len) = match m {
        Mutation::WriteFull(d) => (d.len() as u64, d.len()),
        Mutation::Write { offset, data } => (
            offset
                .checked_add(data.len() as u64)
                .ok_or_else(|| StoreError::InvalidArgument("offset + length overflows".into()))?,
            data.len(),
        ),
        Mutation::Truncate { size_bytes } => (*size_bytes, 0),
        Mutation::Delete => (0, 0),
        Mutation::WriteExtents { extents, data } => (
            spindle_types::check_extents(extents, data.len())
                .map_err(|e| StoreError::InvalidArgument(e.to_string()))?,
            data.len(),
        ),
    };
    check_sizes(end, len)
}

/// `end`: the object's size after the write (at least); `len`: bytes the write carries.
fn check_sizes(end: u64, len: usize) -> Result<(), StoreError> {
    if end > OBJECT_BYTES_MAX {
        return Err(StoreError::InvalidArgument(format!(
            "object would be {end} bytes, the limit is {OBJECT_BYTES_MAX}"
        )));
    }
    if len > MUTATION_BYTES_MAX {
        return Err(StoreError::InvalidArgument(format!(
            "mutation carries {len} bytes, the limit is {MUTATION_BYTES_MAX}"
        )));
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the store in `config.dir`, replaying the journal.
    pub fn open(config: StoreConfig) -> Result<Store, StoreError> {
        Store::open_on(Arc::new(RealDisk::new()?), config)
    }

    /// Opens (or creates) the store in `config.dir` of `disk` (e.g. a [`crate::SimDisk`]),
    /// replaying the journal. [`Store::open`] is this over a [`RealDisk`].
    pub fn open_on(disk: Arc<dyn Disk>, config: StoreConfig) -> Result<Store, StoreError> {
        let (sh, worker) = Worker::open(disk, config)?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("spindle-store".into())
            .spawn(move || worker.run(rx))?;
        Ok(Store {
            sh,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    fn submit(&self, kind: TxnKind) -> Commit {
        let (done, commit) = Commit::pair();
        match &self.tx {
            Some(tx) => {
                if let Err(mpsc::SendError(Msg::Txn(t))) = tx.send(Msg::Txn(Txn { kind, done })) {
                    let _ = t.done.send(Err(StoreError::Closed));
                }
            }
            None => {
                let _ = done.send(Err(StoreError::Closed));
            }
        }
        commit
    }

    /// A client write on PG `pg`: applies `mutation` to object `name`, sets the object's
    /// version to `version`, appends `LogEntry { version, name, op }` to the PG log and sets
    /// the PG's last_version. Transactions are applied in call order; `version` must be
    /// newer than the PG's last_version (else `VersionNotNewer`).
    pub fn apply(&self, pg: PgId, name: &str, version: Version, mutation: Mutation) -> Commit {
        self.apply_with_block_crcs(pg, name, version, mutation, Vec::new())
    }

    /// [`Store::apply`] with the CRC32C of each `BLOCK_BYTES` block of a `WriteFull`'s
    /// data, computed by the caller from the same buffer (e.g. while verifying the network
    /// frame it arrived in), so that the store does not read the bytes once more. A list
    /// of the wrong length is ignored (the store computes them).
    pub fn apply_with_block_crcs(
        &self,
        pg: PgId,
        name: &str,
        version: Version,
        mutation: Mutation,
        block_crcs: Vec<u32>,
    ) -> Commit {
        if let Err(e) = check_name(name).and_then(|_| check_mutation(&mutation)) {
            return Commit::ready(Err(e));
        }
        self.submit(TxnKind::Apply {
            pg,
            name: name.to_string(),
            version,
            mutation: TxnMutation::Plain(mutation),
            block_crcs,
        })
    }

    /// A whole-object write (`Mutation::WriteFull`) of bytes that others read at the same
    /// time (the primary replicates the same buffer): a large object is written from the
    /// shared buffer itself when it is page aligned, without a copy. `block_crcs` as in
    /// [`Store::apply_with_block_crcs`].
    pub fn apply_full_shared(
        &self,
        pg: PgId,
        name: &str,
        version: Version,
        data: Arc<Vec<u8>>,
        block_crcs: Vec<u32>,
    ) -> Commit {
        let checked = check_name(name).and_then(|_| check_sizes(data.len() as u64, data.len()));
        if let Err(e) = checked {
            return Commit::ready(Err(e));
        }
        self.submit(TxnKind::Apply {
            pg,
            name: name.to_string(),
            version,
            mutation: TxnMutation::FullShared(data),
            block_crcs,
        })
    }

    /// Recovery: install the authoritative full state of an object (`Some((data, version))`)
    /// or remove it (`None`). No log entry; the PG's last_version is unchanged.
    pub fn recover_object(
        &self,
        pg: PgId,
        name: &str,
        state: Option<(Vec<u8>, Version)>,
    ) -> Commit {
        let checked = check_name(name).and_then(|_| match &state {
            Some((d, _)) if d.len() > MUTATION_BYTES_MAX => {
                Err(StoreError::InvalidArgument(format!(
                    "object is {} bytes, the limit is {MUTATION_BYTES_MAX}",
                    d.len()
                )))
            }
            _ => Ok(()),
        });
        if let Err(e) = checked {
            return Commit::ready(Err(e));
        }
        self.submit(TxnKind::Recover {
            pg,
            name: name.to_string(),
            state,
        })
    }

    /// Recovery: replace the PG's whole log and last_version / log_tail.
    pub fn set_pg_log(
        &self,
        pg: PgId,
        entries: Vec<LogEntry>,
        last_version: Version,
        log_tail: Version,
    ) -> Commit {
        if entries.len() > crate::limits::LOG_ENTRIES_MAX {
            return Commit::ready(Err(StoreError::InvalidArgument(
                "too many log entries".into(),
            )));
        }
        if let Some(Err(e)) = entries
            .iter()
            .map(|e| check_name(&e.name))
            .find(|r| r.is_err())
        {
            return Commit::ready(Err(e));
        }
        self.submit(TxnKind::SetPgLog {
            pg,
            entries,
            last_version,
            log_tail,
        })
    }

    /// Recovery: mark this PG copy incomplete (it misses objects its log does not account
    /// for), or complete again, which also drops the log and sets `log_tail` to the PG's
    /// last_version (the log may have gaps where objects were recovered by state).
    /// Executed in transaction order, so it sees every earlier `apply`.
    pub fn mark_pg(&self, pg: PgId, incomplete: bool) -> Commit {
        self.submit(TxnKind::PgMark { pg, incomplete })
    }

    /// Remove a PG and all its objects.
    pub fn remove_pg(&self, pg: PgId) -> Commit {
        self.submit(TxnKind::RemovePg { pg })
    }

    fn entry(&self, pg: PgId, name: &str) -> Option<Arc<ObjEntry>> {
        self.sh.pgs_read().get(&pg)?.objects.get(name).cloned()
    }

    /// Reads `[offset, offset + len)` clipped to the object (all of it if `len` is None),
    /// checking every block CRC, from one consistent version.
    async fn read_inner(
        &self,
        pg: PgId,
        name: &str,
        offset: u64,
        len: Option<u64>,
    ) -> Result<(Vec<u8>, ObjectMeta), StoreError> {
        loop {
            let entry = self.entry(pg, name).ok_or(StoreError::NotFound)?;
            let mut notified = std::pin::pin!(entry.notify.notified());
            notified.as_mut().enable();
            let snap = {
                let st = entry.lock();
                (st.writing == 0).then(|| {
                    let src = match (&st.inline, st.is_inline()) {
                        (_, false) => Src::File(st.file_id),
                        (Some(d), true) => Src::Mem(d.clone()),
                        (None, true) => Src::Db,
                    };
                    (st.gen, src, st.meta())
                })
            };
            let Some((gen, src, meta)) = snap else {
                notified.await;
                continue;
            };
            let size = meta.size_bytes;
            let end = match len {
                None => size,
                Some(len) => offset.saturating_add(len).min(size),
            };
            if offset >= end {
                return Ok((Vec::new(), meta));
            }
            let first_block = offset / BLOCK_BYTES;
            let last_block = (end - 1) / BLOCK_BYTES;
            let crcs: Vec<u32> = {
                let st = entry.lock();
                if st.gen != gen {
                    continue;
                }
                st.crcs
                    .get(first_block as usize..=last_block as usize)
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default()
            };
            let read_start = first_block * BLOCK_BYTES;
            let read_end = ((last_block + 1) * BLOCK_BYTES).min(size);
            let want = usize::try_from(read_end - read_start)
                .map_err(|_| StoreError::InvalidArgument("read too large".into()))?;
            // An inline object's bytes must be exactly `size` long (else: corrupt).
            let slice_inline = |d: &[u8]| {
                (d.len() as u64 == size)
                    .then(|| d.get(read_start as usize..read_end as usize))
                    .flatten()
                    .map(<[u8]>::to_vec)
            };
            let data = match src {
                Src::Mem(d) => slice_inline(&d),
                Src::Db => {
                    meta::load_inline(&*self.sh.db()?, pg, name)?.and_then(|d| slice_inline(&d))
                }
                Src::File(file_id) => match self.sh.file(file_id, false) {
                    Ok(file) => 'read: {
                        // Data in the page cache is copied here, on the caller's thread:
                        // a request to the engine's ring thread costs two thread
                        // hand-offs, the largest cost of a cached 4 KiB read.
                        // A large read that is not entirely cached goes O_DIRECT (see
                        // `DIRECT_READ_BYTES_MIN`): the start is block aligned, the length
                        // is rounded up to whole blocks (the file ends at or before it: a
                        // short read). It is decided with `cachestat`, not by trying
                        // `RWF_NOWAIT`: a missing page makes that start a readahead, and
                        // the disk would then read the same blocks twice.
                        let direct = (want >= DIRECT_READ_BYTES_MIN
                            && file.fully_cached(read_start, want) == Some(false))
                        .then(|| self.sh.direct_file(file_id))
                        .flatten();
                        if direct.is_none() {
                            if let Some(buf) = file.read_cached(read_start, want) {
                                self.sh.counters.file_reads_cached.fetch_add(1, Relaxed);
                                break 'read Some(buf);
                            }
                        }
                        self.sh.counters.file_reads_engine.fetch_add(1, Relaxed);
                        let (fd_file, buf) = match direct {
                            Some(d) => {
                                self.sh.counters.file_reads_direct.fetch_add(1, Relaxed);
                                let rounded = want.next_multiple_of(BLOCK_BYTES as usize);
                                (d, IoBuf::aligned(rounded, BLOCK_BYTES as usize))
                            }
                            None => (file, IoBuf::zeroed(want)),
                        };
                        let read = self.sh.disk.read_start(&fd_file, read_start, buf);
                        let (n, buf) = read.done().await?;
                        drop(fd_file);
                        let n = n.min(want);
                        let mut buf = buf.into_vec();
                        buf.truncate(n);
                        buf.resize(want, 0);
                        Some(buf)
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e.into()),
                },
            };
            let bad_block = match &data {
                None => Some(first_block),
                Some(buf) => buf
                    .chunks(BLOCK_BYTES as usize)
                    .zip(crcs.iter().chain(std::iter::repeat(&0)))
                    .position(|(chunk, crc)| spindle_types::crc::crc32c(chunk) != *crc)
                    .map(|i| first_block + i as u64)
                    .or((crcs.len() as u64 != last_block - first_block + 1).then_some(first_block)),
            };
            match (bad_block, data) {
                (None, Some(buf)) => {
                    let from = (offset - read_start) as usize;
                    let to = (end - read_start) as usize;
                    let out = if from == 0 && to == buf.len() {
                        buf
                    } else {
                        buf[from..to].to_vec()
                    };
                    return Ok((out, meta));
                }
                (bad, _) => {
                    let raced = {
                        let st = entry.lock();
                        st.gen != gen || st.writing > 0
                    };
                    let still_there = self
                        .entry(pg, name)
                        .is_some_and(|e| Arc::ptr_eq(&e, &entry));
                    if raced || !still_there {
                        continue;
                    }
                    self.sh.counters.corruptions.fetch_add(1, Relaxed);
                    return Err(StoreError::Corrupt {
                        pg,
                        name: name.to_string(),
                        block: bad.unwrap_or(first_block),
                    });
                }
            }
        }
    }

    /// Read up to `len` bytes at `offset` (clipped to the object size; empty if
    /// `offset >= size`). Verifies the CRC of every block it touches.
    pub async fn read(
        &self,
        pg: PgId,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, StoreError> {
        check_name(name)?;
        Ok(self.read_inner(pg, name, offset, Some(len)).await?.0)
    }

    /// Metadata of an object, if it exists.
    pub fn stat(&self, pg: PgId, name: &str) -> Option<ObjectMeta> {
        Some(self.entry(pg, name)?.lock().meta())
    }

    /// Objects of a PG, sorted by name.
    pub fn list(&self, pg: PgId) -> Vec<(String, ObjectMeta)> {
        let pgs = self.sh.pgs_read();
        match pgs.get(&pg) {
            Some(p) => p
                .objects
                .iter()
                .map(|(n, e)| (n.clone(), e.lock().meta()))
                .collect(),
            None => Vec::new(),
        }
    }

    /// PGs that have objects or a log.
    pub fn pgs(&self) -> Vec<PgId> {
        self.sh
            .pgs_read()
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Summary of a PG (all ZERO for unknown PGs).
    pub fn pg_info(&self, pg: PgId) -> PgInfo {
        match self.sh.pgs_read().get(&pg) {
            Some(p) => PgInfo {
                last_version: p.last_version,
                log_tail: p.log_tail,
                object_count: p.objects.len() as u64,
                incomplete: p.incomplete,
            },
            None => PgInfo::default(),
        }
    }

    /// The PG log, oldest first.
    pub fn pg_log(&self, pg: PgId) -> Vec<LogEntry> {
        match self.sh.pgs_read().get(&pg) {
            Some(p) => p.log.iter().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// Scrub: read the whole object and check every block CRC.
    pub async fn verify(&self, pg: PgId, name: &str) -> Result<ObjectMeta, StoreError> {
        check_name(name)?;
        Ok(self.read_inner(pg, name, 0, None).await?.1)
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        let c = &self.sh.counters;
        // Per PG, not per object: this runs with every heartbeat, and a walk of a million
        // objects would hold the PG map (and stall writes) for tens of milliseconds.
        let objects = self
            .sh
            .pgs_read()
            .values()
            .map(|p| p.objects.len() as u64)
            .sum();
        StoreStats {
            transactions: c.transactions.load(Relaxed),
            flushes: c.flushes.load(Relaxed),
            journal_bytes: c.journal_bytes.load(Relaxed),
            checkpoints: c.checkpoints.load(Relaxed),
            corruptions_detected: c.corruptions.load(Relaxed),
            file_reads_cached: c.file_reads_cached.load(Relaxed),
            file_reads_engine: c.file_reads_engine.load(Relaxed),
            file_reads_direct: c.file_reads_direct.load(Relaxed),
            files_reused: c.files_reused.load(Relaxed),
            direct_writes_adopted: c.direct_writes_adopted.load(Relaxed),
            replay_records_discarded: c.replay_records_discarded.load(Relaxed),
            objects,
            data_bytes: c.data_bytes.load(Relaxed),
        }
    }

    /// Size and free space of the store's file system, and whether the store is full or
    /// latched by an I/O error.
    pub fn space(&self) -> SpaceInfo {
        let space = self.sh.disk.space(&self.sh.config.dir).unwrap_or_default();
        let (total_bytes, avail_bytes) = (space.total_bytes, space.avail_bytes);
        SpaceInfo {
            total_bytes,
            avail_bytes,
            full: self.sh.full.load(Relaxed),
            failed: self
                .sh
                .failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Whether the store is in full mode (new data is refused with `NoSpace`).
    pub fn is_full(&self) -> bool {
        self.sh.full.load(Relaxed)
    }

    /// Tells the store whether its file system is tight (the daemon sets this when its
    /// used ratio is above the nearfull ratio). While tight, freed data files are removed
    /// instead of kept for in-place reuse, and the ones kept so far are removed (at the
    /// worker's next round, at most a checkpoint interval later): a kept file holds its
    /// space, so deleting objects would not bring the used ratio down and a daemon above
    /// the full ratio (which refuses the writes that would reuse them) would stay full
    /// until restarted.
    pub fn set_space_tight(&self, tight: bool) {
        self.sh.space_tight.store(tight, Relaxed);
    }

    /// Checkpoints now (after every transaction submitted before this call), and returns
    /// when the checkpoint is done. With `StoreConfig::timed_checkpoints` off this and the
    /// journal-size threshold are the only checkpoints: a simulation calls it at the times
    /// its seed chooses.
    pub fn checkpoint_now(&self) -> Result<(), StoreError> {
        let (reply_tx, reply_rx) = mpsc::channel();
        let Some(tx) = &self.tx else {
            return Err(StoreError::Closed);
        };
        if tx.send(Msg::Checkpoint(reply_tx)).is_err() {
            return Err(StoreError::Closed);
        }
        reply_rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Flush + checkpoint + stop the worker thread.
    pub fn shutdown(mut self) -> Result<(), StoreError> {
        let (reply_tx, reply_rx) = mpsc::channel();
        let Some(tx) = self.tx.take() else {
            return Err(StoreError::Closed);
        };
        let sent = tx.send(Msg::Shutdown(reply_tx)).is_ok();
        drop(tx);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !sent {
            return Err(StoreError::Closed);
        }
        reply_rx.recv().unwrap_or(Err(StoreError::Closed))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG: PgId = PgId { pool: 7, pg: 1 };

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "spindle-store-inline-corrupt-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn expect_corrupt(r: Result<Vec<u8>, StoreError>, want_block: u64) {
        match r {
            Err(StoreError::Corrupt { pg, name, block }) => {
                assert_eq!((pg, name.as_str(), block), (PG, "x", want_block));
            }
            other => panic!("expected Corrupt in block {want_block}, got {other:?}"),
        }
    }

    /// Corrupted inline bytes (in memory before a checkpoint, in the metadata database after
    /// one) are detected by the per-block CRCs and never returned.
    #[test]
    fn corrupt_inline_bytes_are_detected() {
        let dir = tempdir();
        let rt = rt();
        let cfg = StoreConfig::new(&dir);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let v = |seq| Version { epoch: 1, seq };
        let store = Store::open(cfg.clone()).unwrap();
        store
            .apply(PG, "x", v(1), Mutation::WriteFull(data.clone()))
            .wait()
            .unwrap();
        assert_eq!(std::fs::read_dir(dir.join("objects")).unwrap().count(), 0);
        // 1. The in-memory copy (changed since the last checkpoint): flip a byte of block 1.
        {
            let e = store.entry(PG, "x").unwrap();
            let mut st = e.lock();
            assert!(st.is_inline());
            let d = Arc::make_mut(st.inline.as_mut().unwrap());
            d[5000] ^= 0x40;
        }
        assert_eq!(
            rt.block_on(store.read(PG, "x", 0, 4096)).unwrap(),
            data[..4096]
        );
        expect_corrupt(rt.block_on(store.read(PG, "x", 4000, 200)), 1);
        assert!(matches!(
            rt.block_on(store.verify(PG, "x")),
            Err(StoreError::Corrupt { block: 1, .. })
        ));
        assert_eq!(store.stats().corruptions_detected, 2);
        // Rewriting repairs it.
        store
            .apply(PG, "x", v(2), Mutation::WriteFull(data.clone()))
            .wait()
            .unwrap();
        assert_eq!(
            rt.block_on(store.verify(PG, "x")).unwrap().size_bytes,
            10_000
        );
        store.shutdown().unwrap();

        // 2. After the checkpoint the bytes are read from the database: corrupt them there.
        let store = Store::open(cfg.clone()).unwrap();
        assert!(store.entry(PG, "x").unwrap().lock().inline.is_none());
        assert_eq!(rt.block_on(store.read(PG, "x", 0, u64::MAX)).unwrap(), data);
        let mut bad = data.clone();
        bad[9000] ^= 1;
        meta::put_inline(&store.sh.db().unwrap(), PG, "x", &bad).unwrap();
        assert_eq!(
            rt.block_on(store.read(PG, "x", 0, 8192)).unwrap(),
            data[..8192]
        );
        expect_corrupt(rt.block_on(store.read(PG, "x", 8192, 100)), 2);
        // Wrong length in the database (truncated value): corrupt as well.
        meta::put_inline(&store.sh.db().unwrap(), PG, "x", &data[..9000]).unwrap();
        expect_corrupt(rt.block_on(store.read(PG, "x", 0, 10)), 0);
        // A partial write loads the stored bytes; it must not re-checksum the damaged,
        // untouched block 2 (no laundering), only the block it writes.
        meta::put_inline(&store.sh.db().unwrap(), PG, "x", &bad).unwrap();
        store
            .apply(
                PG,
                "x",
                v(3),
                Mutation::Write {
                    offset: 0,
                    data: vec![9; 10],
                },
            )
            .wait()
            .unwrap();
        let mut want = data.clone();
        want[..10].fill(9);
        assert_eq!(
            rt.block_on(store.read(PG, "x", 0, 8192)).unwrap(),
            want[..8192]
        );
        expect_corrupt(rt.block_on(store.read(PG, "x", 8192, 100)), 2);
        assert_eq!(store.stats().corruptions_detected, 3); // since this open
        store.shutdown().unwrap();
        // Still detected after a restart (the checkpoint keeps the CRCs, not the bad bytes).
        let store = Store::open(cfg).unwrap();
        expect_corrupt(rt.block_on(store.read(PG, "x", 9000, 10)), 2);
        store
            .apply(PG, "x", v(4), Mutation::WriteFull(vec![3; 100]))
            .wait()
            .unwrap();
        assert_eq!(
            rt.block_on(store.read(PG, "x", 0, 1000)).unwrap(),
            vec![3; 100]
        );
        store.shutdown().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A multi-extent write is one record: applied to inline and file-backed objects alike,
    /// equal to the reference model, and the same after a replay of the journal.
    #[test]
    fn write_extents_matches_the_model_and_survives_replay() {
        use spindle_types::Extent;
        let dir = tempdir();
        let rt = rt();
        let cfg = StoreConfig::new(&dir);
        let v = |seq| Version { epoch: 1, seq };
        let store = Store::open(cfg.clone()).unwrap();
        let mut model: std::collections::BTreeMap<&str, Vec<u8>> = Default::default();
        let mut seq = 0;
        for (name, base_len) in [("small", 3000usize), ("large", 3 << 20)] {
            let base: Vec<u8> = (0..base_len).map(|i| (i % 251) as u8).collect();
            seq += 1;
            store
                .apply(PG, name, v(seq), Mutation::WriteFull(base.clone()))
                .wait()
                .unwrap();
            model.insert(name, base);
            // Two extents in one block, one across a block boundary, one past the end.
            let extents = vec![
                Extent {
                    offset: 10,
                    len_bytes: 5,
                },
                Extent {
                    offset: 100,
                    len_bytes: 7,
                },
                Extent {
                    offset: 4090,
                    len_bytes: 20,
                },
                Extent {
                    offset: base_len as u64 + 5000,
                    len_bytes: 3,
                },
            ];
            let data: Vec<u8> = (0..35u8).map(|i| 200 + i).collect();
            let m = Mutation::WriteExtents { extents, data };
            let want = m.apply_to(model.get(name).map(|d| d.as_slice())).unwrap();
            seq += 1;
            store.apply(PG, name, v(seq), m).wait().unwrap();
            model.insert(name, want);
        }
        let check = |store: &Store| {
            for (name, want) in &model {
                let got = rt.block_on(store.read(PG, name, 0, u64::MAX)).unwrap();
                assert_eq!(got.len(), want.len(), "{name}");
                assert!(got == *want, "{name}: bytes differ from the model");
                assert_eq!(
                    rt.block_on(store.verify(PG, name)).unwrap().size_bytes,
                    want.len() as u64
                );
            }
        };
        check(&store);
        // A bad extent list is refused before anything is written.
        let bad = Mutation::WriteExtents {
            extents: vec![
                Extent {
                    offset: 10,
                    len_bytes: 5,
                },
                Extent {
                    offset: 12,
                    len_bytes: 1,
                },
            ],
            data: vec![1; 6],
        };
        assert!(matches!(
            store.apply(PG, "small", v(seq + 1), bad).wait(),
            Err(StoreError::InvalidArgument(_))
        ));
        // Crash (no checkpoint): the journal replays the records.
        drop(store);
        let store = Store::open(cfg).unwrap();
        check(&store);
        store.shutdown().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
