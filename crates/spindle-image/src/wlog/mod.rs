//! LineFS's persist-and-publish for a block image: a client-local, checksummed,
//! group-committed write log in front of the block layer.
//!
//! ```text
//!  write ──> appender ──> writer thread: one O_DIRECT|O_DSYNC write per batch (group
//!            commit) ──> overlay insert ──> acknowledged
//!                                       └──> publisher: chunks of records, overwrites
//!                                            coalesced, written through the block layer
//!                                            (durable on every copy), then the
//!                                            superblock's published position moves and
//!                                            the ring space is free again
//!  read ──> overlay (unpublished writes) over the block layer
//!  flush / FUA ──> wait until everything before is published
//! ```
//!
//! Invariants:
//! - a write is acknowledged only once its records are durable in the log file, and its
//!   bytes are in the overlay before that (reads after the acknowledgement see them);
//! - records are published in seq order, and a chunk's extents leave the overlay only
//!   after the block layer acknowledged them (durable on every copy);
//! - ring space is reused only behind the *durable* published position (the superblock),
//!   so a replay after a crash finds every unpublished record;
//! - a replay applies the valid records from the published position in seq order and
//!   stops at the first record that is missing, torn or fails its checksum; nothing after
//!   it is applied (`ReplayReport` says what was dropped and why).
//!
//! A full ring makes writes wait for the publisher (backpressure), never fail. The file is
//! preallocated at creation, so a full file system cannot fail a log write later.
//! File layout: [`format`].

pub mod agent;
pub mod format;
pub mod overlay;

use crate::block::BlockLayer;
use crate::image::{ImageError, ObjectBackend};
use bytes::Bytes;
use format::{Header, Super, BLOCK_BYTES, HEADER_BYTES, RECORD_DATA_BYTES_MAX, RING_START};
use overlay::{Overlay, Piece};
use spindle_io::IoBuf;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Writes at least this large go around the log, straight through the block layer (once
/// any unpublished record under them is published): a large write costs the log its bytes
/// once more on the same disk and gains little (it is one request either way); measured
/// 512 KiB sequential writes at 0.28-0.38x of write-through through the log
/// (docs/benchmarks.md).
pub const WRITE_THROUGH_BYTES_MIN: usize = 256 << 10;
/// Default ring size of a write log (`spindle nbd --write-log-size`).
pub const WRITE_LOG_BYTES_DEFAULT: u64 = 1 << 30;
/// Smallest ring: room for a few of the largest records at once.
pub const WRITE_LOG_BYTES_MIN: u64 = 32 << 20;
/// Most bytes one group commit writes (the writer takes whatever is queued, up to this).
const BATCH_BYTES_MAX: u64 = 8 << 20;
/// Most bytes the publisher takes as one chunk.
pub(super) const CHUNK_BYTES_MAX: u64 = 16 << 20;
/// Bytes per write when a new ring is written once at creation.
const ZERO_FILL_BYTES: u64 = 8 << 20;
/// Object writes in flight at once while a log is replayed at open.
const REPLAY_WRITES_IN_FLIGHT: usize = 32;
/// Chunks published at once (see `publisher_loop`).
pub(super) const PUBLISH_CHUNKS_IN_FLIGHT: usize = 3;
/// How long a failing publish waits before it tries again.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);
/// Publishing is lazy: it starts once the ring is this full (as a fraction: used * 4 >=
/// ring), when a FLUSH or FUA waits for it, or when no write came for `PUBLISH_IDLE`. A
/// burst then costs only the log appends (the publishing work, three copies' worth, does
/// not compete with it for the same cores), and more overwrites coalesce.
pub(super) const PUBLISH_FILL_QUARTERS: u64 = 1;
pub(super) const PUBLISH_IDLE: Duration = Duration::from_millis(50);

const _: () = assert!(WRITE_LOG_BYTES_MIN >= 4 * (RECORD_DATA_BYTES_MAX as u64 + BLOCK_BYTES));
const _: () = assert!(BATCH_BYTES_MAX <= WRITE_LOG_BYTES_MIN / 2);

/// Errors of the write log.
#[derive(Debug, thiserror::Error)]
pub enum WriteLogError {
    #[error("write log {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("write log {path}: {0}", path = .1.display())]
    Invalid(String, PathBuf),
    /// The log holds unpublished writes of a client that lost the image to another since.
    #[error(
        "write log {path}: holds {records} unpublished writes of client {log_client:016x}, \
         but the image was locked by {since} after it; replaying them would put older data \
         over newer. Move {path} away to discard them (or serve the image without \
         --write-log)",
        path = .path.display()
    )]
    Foreign {
        path: PathBuf,
        records: usize,
        log_client: u64,
        since: String,
    },
}

impl From<WriteLogError> for ImageError {
    fn from(e: WriteLogError) -> ImageError {
        ImageError::WriteLog(e.to_string())
    }
}

/// Where the log lives and how large its ring is.
#[derive(Clone, Debug)]
pub struct WriteLogConfig {
    /// The directory; the log of `pool/image` is `DIR/pool.image.wlog`.
    pub dir: PathBuf,
    pub ring_bytes: u64,
    /// For tests: no publisher runs, so records stay in the log (a stalled publisher).
    pub publish_paused: bool,
    /// Publish through an offload agent (`spindle agent` on this directory; see
    /// [`agent`]): this process only appends. None: if an agent serves the directory
    /// when the log opens ([`agent::agent_serving`]).
    pub agent: Option<bool>,
    /// The client id the agent's writes carry (the front end's, so that fencing it
    /// fences them too).
    pub client_id: u64,
    /// The cluster the image lives in (`ClusterMap::cluster_id`; the agent checks it).
    pub cluster_id: u64,
    /// Who held the image lock just before this opener took it: `Some(None)` nobody,
    /// `Some(Some(c))` client `c`; None: not known (not checked). A log whose unpublished
    /// records belong to another client than that is refused ([`WriteLogError::Foreign`]):
    /// someone else had the image in between, and replaying would go back in time.
    pub previous_lock_client: Option<Option<u64>>,
    /// Writes of at least this many bytes go around the log (`WRITE_THROUGH_BYTES_MIN`;
    /// `usize::MAX`: none).
    pub write_through_bytes_min: usize,
}

impl WriteLogConfig {
    /// A log in `dir` with a ring of `ring_bytes`.
    pub fn new(dir: impl Into<PathBuf>, ring_bytes: u64) -> WriteLogConfig {
        WriteLogConfig {
            dir: dir.into(),
            ring_bytes,
            publish_paused: false,
            agent: None,
            client_id: 0,
            cluster_id: 0,
            previous_lock_client: None,
            write_through_bytes_min: WRITE_THROUGH_BYTES_MIN,
        }
    }
}

/// What a replay found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records applied to the image (acknowledged writes not yet published at the crash).
    pub records_applied: u64,
    pub bytes_applied: u64,
    /// Why the scan stopped, when it was not the clean end of the log: a torn record of a
    /// batch never acknowledged, or a damaged one (then `records_refused` counts the valid
    /// records found after it, which are not applied).
    pub stopped: Option<String>,
    pub records_refused: u64,
}

/// Counters of a write log.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteLogStats {
    pub appended_records: u64,
    pub appended_bytes: u64,
    pub group_commits: u64,
    pub published_records: u64,
    pub published_bytes: u64,
    /// Object writes the publisher sent (one multi-extent write per data object per chunk).
    pub publish_writes: u64,
    /// Extents those writes carried (after coalescing overwrites and adjacent writes).
    pub publish_extents: u64,
    pub publish_chunks: u64,
    /// Appends that waited for ring space.
    pub full_waits: u64,
    /// Large writes that went around the log (`WRITE_THROUGH_BYTES_MIN`).
    pub written_through: u64,
    pub overlay_bytes: u64,
    pub ring_used_bytes: u64,
    pub ring_bytes: u64,
}

#[derive(Default)]
struct Counters {
    appended_records: AtomicU64,
    appended_bytes: AtomicU64,
    group_commits: AtomicU64,
    published_records: AtomicU64,
    published_bytes: AtomicU64,
    publish_writes: AtomicU64,
    publish_extents: AtomicU64,
    publish_chunks: AtomicU64,
    full_waits: AtomicU64,
    written_through: AtomicU64,
}

/// A record durable in the log, on its way to the publisher.
pub(super) struct Logged {
    pub(super) seq: u64,
    pub(super) offset: u64,
    pub(super) data: Bytes,
    /// LSN just past this record (and any pad before it).
    pub(super) end_lsn: u64,
}

/// One append for the writer thread.
struct Append {
    offset: u64,
    data: Bytes,
    done: oneshot::Sender<Result<u64, String>>,
}

/// Ring space shared by the writer (which fills it) and the publisher (which frees it).
struct Ring {
    /// The durable published LSN (what the superblock says).
    durable_published_lsn: Mutex<u64>,
    freed: Condvar,
    closing: AtomicBool,
}

/// State shared by the parts of the log.
struct Shared {
    path: PathBuf,
    name: String,
    log_id: u64,
    ring_bytes: u64,
    overlay: Mutex<Overlay>,
    ring: Ring,
    counters: Counters,
    /// Highest seq acknowledged to a writer.
    acked_seq: AtomicU64,
    /// Highest seq durable in the cluster (the publisher's progress; flushes wait on it).
    published_tx: watch::Sender<u64>,
    /// Set once publishing failed for good (e.g. fenced): flushes report it.
    failed: Mutex<Option<String>>,
    /// The LSN the writer appends at next (for `ring_used_bytes`).
    head_lsn: AtomicU64,
    /// Flushes (and FUA writes) waiting for the publisher, which then publishes at once.
    flush_waiters: AtomicU64,
    /// Wakes the publisher (a waiter arrived, or the ring filled up).
    wake_publisher: tokio::sync::Notify,
    /// When the last append was acknowledged (for `PUBLISH_IDLE`).
    last_append: Mutex<std::time::Instant>,
    /// The writer thread's kernel thread id (0 until it runs): moved to the offload
    /// agent's CPUs when one publishes.
    writer_tid: std::sync::atomic::AtomicI32,
    /// An offload agent (or this process for it, from the file) publishes.
    agent_mode: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The write log of one image (see the module documentation).
pub struct WriteLog<B: ObjectBackend> {
    shared: Arc<Shared>,
    layer: Arc<BlockLayer<B>>,
    appends: std::sync::mpsc::Sender<Append>,
    writer: Option<std::thread::JoinHandle<()>>,
    publisher: tokio::task::JoinHandle<()>,
    /// The control page shared with the offload agent, when one publishes.
    ctl: Option<Arc<agent::Ctl>>,
    write_through_bytes_min: usize,
    /// One FLUSH-style drain at a time (trim and write-zeroes go around the log).
    drain: tokio::sync::Mutex<()>,
}

impl<B: ObjectBackend> Drop for WriteLog<B> {
    fn drop(&mut self) {
        self.shared.ring.closing.store(true, Ordering::SeqCst);
        self.shared.ring.freed.notify_all();
        self.publisher.abort();
        if let Some(ctl) = &self.ctl {
            // The agent detaches once it sees this (everything asked for is published by
            // then after a clean close); a later opening makes a new page.
            ctl.set(agent::F::Stop, 1);
            let _ = std::fs::remove_file(ctl.path());
        }
        // The writer thread ends when the append channel closes (this value's sender).
        if let Some(w) = self.writer.take() {
            drop(std::mem::replace(
                &mut self.appends,
                std::sync::mpsc::channel().0,
            ));
            let _ = w.join();
        }
    }
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> WriteLogError {
    let path = path.to_path_buf();
    move |source| WriteLogError::Io { path, what, source }
}

/// The log file of `pool/image` in `dir`.
pub fn log_path(dir: &Path, pool: &str, image: &str) -> PathBuf {
    dir.join(format!("{pool}.{image}.wlog"))
}

/// The `pool/image` the log at `log` belongs to (from its superblock).
pub fn log_name(log: &Path) -> Result<String, WriteLogError> {
    let f = File::open(log).map_err(io_err(log, "open"))?;
    Ok(read_super(&f, log)?.name)
}

/// Where `spindle nbd` publishes a log's counters (`<log>.stats.json`, every 500 ms).
pub fn stats_path(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".stats.json");
    PathBuf::from(p)
}

/// Opens for direct, synchronous writes.
fn open_direct(path: &Path) -> Result<File, WriteLogError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(path)
        .map_err(io_err(path, "open (O_DIRECT | O_DSYNC)"))
}

fn write_super(file: &File, path: &Path, s: &Super) -> Result<(), WriteLogError> {
    let bytes = s.encode();
    let buf = IoBuf::aligned_copy(&bytes, bytes.len(), BLOCK_BYTES as usize);
    file.write_all_at(&buf, s.slot() * BLOCK_BYTES)
        .map_err(io_err(path, "superblock write"))
}

/// Creates a new log file: preallocated, both superblock slots written.
fn create(path: &Path, name: &str, ring_bytes: u64) -> Result<Super, WriteLogError> {
    let tmp = path.with_extension("wlog.new");
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err(&tmp, "create"))?;
        let len = RING_START + ring_bytes;
        // SAFETY: fallocate on a file we own, with valid arguments.
        let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, len as i64) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&tmp);
            return Err(WriteLogError::Io {
                path: tmp,
                what: "preallocate the ring (is the file system full?)",
                source: e,
            });
        }
        f.sync_all().map_err(io_err(&tmp, "sync"))?;
    }
    {
        // Write the ring once: a synchronous write into a preallocated (unwritten) extent
        // also commits the file system's journal to convert it, which made each group
        // commit several times slower than an overwrite on this machine's ext4.
        let f = open_direct(&tmp)?;
        let zeros = IoBuf::aligned(ZERO_FILL_BYTES as usize, BLOCK_BYTES as usize);
        let mut at = 0;
        while at < ring_bytes {
            let n = (ring_bytes - at).min(ZERO_FILL_BYTES) as usize;
            f.write_all_at(&zeros[..n], RING_START + at)
                .map_err(io_err(&tmp, "write the ring once"))?;
            at += n as u64;
        }
    }
    let mut s = Super {
        log_id: rand::random::<u64>() | 1,
        ring_bytes,
        published_seq: 0,
        published_lsn: 0,
        generation: 0,
        name: name.to_string(),
        client_id: 0,
    };
    {
        let f = open_direct(&tmp)?;
        write_super(&f, &tmp, &s)?;
        s.generation = 1;
        write_super(&f, &tmp, &s)?;
    }
    std::fs::rename(&tmp, path).map_err(io_err(path, "rename into place"))?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(s)
}

/// The newest valid superblock of `file`.
pub(super) fn read_super(file: &File, path: &Path) -> Result<Super, WriteLogError> {
    let mut best: Option<Super> = None;
    let mut why = Vec::new();
    for slot in 0..2u64 {
        let mut b = vec![0u8; BLOCK_BYTES as usize];
        file.read_exact_at(&mut b, slot * BLOCK_BYTES)
            .map_err(io_err(path, "superblock read"))?;
        match Super::decode(&b) {
            Ok(s) if best.as_ref().is_none_or(|b| s.generation > b.generation) => best = Some(s),
            Ok(_) => {}
            Err(e) => why.push(format!("slot {slot}: {e}")),
        }
    }
    best.ok_or_else(|| {
        WriteLogError::Invalid(
            format!("no valid superblock ({})", why.join("; ")),
            path.to_path_buf(),
        )
    })
}

/// Reads the records after the published position: the valid ones in seq order, and why
/// the scan stopped.
fn scan(file: &File, path: &Path, s: &Super) -> Result<(Vec<Logged>, ReplayReport), WriteLogError> {
    let mut out = Vec::new();
    let mut report = ReplayReport::default();
    let mut lsn = s.published_lsn;
    let mut seq = s.published_seq + 1;
    let limit = s.published_lsn + s.ring_bytes;
    let mut head = vec![0u8; BLOCK_BYTES as usize];
    let read_at = |buf: &mut [u8], lsn: u64| -> Result<(), WriteLogError> {
        file.read_exact_at(buf, RING_START + lsn % s.ring_bytes)
            .map_err(io_err(path, "ring read"))
    };
    while lsn < limit {
        read_at(&mut head, lsn)?;
        // `None`: the record at `lsn` is what the scan expects; else why not.
        let (h, problem) = match format::decode_header(&head) {
            None => (None, Some("no record header")),
            Some(h) if h.log_id != s.log_id || h.seq != seq => {
                (Some(h), Some("not the next record"))
            }
            Some(h)
                if lsn % s.ring_bytes + h.record_bytes > s.ring_bytes
                    || lsn + h.record_bytes > limit =>
            {
                (Some(h), Some("a record running past the ring"))
            }
            Some(h) => (Some(h), None),
        };
        let mut rec = Vec::new();
        let checked = match (h, problem) {
            (Some(h), None) => {
                rec = vec![0u8; h.record_bytes as usize];
                if !h.pad {
                    read_at(&mut rec, lsn)?;
                } else {
                    rec[..BLOCK_BYTES as usize].copy_from_slice(&head);
                }
                if format::record_ok(&rec, &h, &rec[HEADER_BYTES..HEADER_BYTES + h.data_len]) {
                    None
                } else {
                    Some("a checksum mismatch")
                }
            }
            (_, p) => p,
        };
        if let Some(what) = checked {
            // The end of the log, a torn tail (a group commit that never completed: none
            // of it was acknowledged) or damage (records of a later commit follow).
            let followers = successor(file, path, s, lsn, seq, limit)?;
            let torn_here = what == "a checksum mismatch";
            if let Some((next_lsn, next)) = followers {
                let (after, later) = count_valid_after(file, path, s, next_lsn, next.seq, limit)?;
                let later_batch = later || next.batch_first > seq;
                report.records_refused = after;
                report.stopped = Some(if later_batch {
                    format!(
                        "record seq {seq} at log offset {lsn} is damaged ({what}): it and the {after} \
                         valid records after it are refused; acknowledged writes from seq {seq} on are lost"
                    )
                } else {
                    format!(
                        "record seq {seq} at log offset {lsn} is torn ({what}; its group commit never \
                         completed, so nothing in it was acknowledged): it and the {after} records \
                         after it are dropped"
                    )
                });
            } else if torn_here {
                report.stopped = Some(format!(
                    "record seq {seq} at log offset {lsn} is torn ({what}; the last group commit \
                     never completed, so it was not acknowledged): dropped"
                ));
            }
            break;
        }
        let Some(h) = h else { break };
        lsn += h.record_bytes;
        if !h.pad {
            out.push(Logged {
                seq,
                offset: h.offset,
                data: Bytes::copy_from_slice(&rec[HEADER_BYTES..HEADER_BYTES + h.data_len]),
                end_lsn: lsn,
            });
        }
        seq += 1;
    }
    Ok((out, report))
}

/// The first record of this log after the one expected at `lsn` (seq `seq`) that the scan
/// could not take: a header of this log id with a higher seq, at a block boundary within
/// the longest record's reach, or at the ring's start (after a pad). Records of earlier
/// laps have lower seqs, so only records written after the expected one are found.
fn successor(
    file: &File,
    path: &Path,
    s: &Super,
    lsn: u64,
    seq: u64,
    limit: u64,
) -> Result<Option<(u64, Header)>, WriteLogError> {
    let reach = format::record_bytes(RECORD_DATA_BYTES_MAX);
    let mut candidates: Vec<u64> = (1..=reach / BLOCK_BYTES)
        .map(|i| lsn + i * BLOCK_BYTES)
        .filter(|l| *l < limit && l / s.ring_bytes == lsn / s.ring_bytes)
        .collect();
    let next_lap = (lsn / s.ring_bytes + 1) * s.ring_bytes;
    if next_lap < limit {
        candidates.push(next_lap);
    }
    let mut head = vec![0u8; BLOCK_BYTES as usize];
    for l in candidates {
        file.read_exact_at(&mut head, RING_START + l % s.ring_bytes)
            .map_err(io_err(path, "ring read"))?;
        if let Some(h) = format::decode_header(&head) {
            if h.log_id == s.log_id && h.seq > seq {
                return Ok(Some((l, h)));
            }
        }
    }
    Ok(None)
}

/// Valid-looking records (right id, increasing seq) from `lsn` on, stopping at the first
/// gap, and whether one of them belongs to a group commit after the one of seq `seq - 1`.
fn count_valid_after(
    file: &File,
    path: &Path,
    s: &Super,
    mut lsn: u64,
    mut seq: u64,
    limit: u64,
) -> Result<(u64, bool), WriteLogError> {
    let bad = seq - 1;
    let mut later_batch = false;
    let mut n = 0;
    let mut head = vec![0u8; BLOCK_BYTES as usize];
    while lsn < limit {
        file.read_exact_at(&mut head, RING_START + lsn % s.ring_bytes)
            .map_err(io_err(path, "ring read"))?;
        let Some(h) = format::decode_header(&head) else {
            break;
        };
        if h.log_id != s.log_id || h.seq != seq {
            break;
        }
        n += u64::from(!h.pad);
        later_batch |= h.batch_first > bad;
        lsn += h.record_bytes;
        seq += 1;
    }
    Ok((n, later_batch))
}

impl<B: ObjectBackend> WriteLog<B> {
    /// Opens (or creates) the log of `pool/image` in front of `layer`: replays whatever a
    /// crash left unpublished into the image (before anything is served), then starts the
    /// writer thread and the publisher. The caller holds the image's lock.
    pub async fn open(
        config: &WriteLogConfig,
        pool: &str,
        image: &str,
        layer: Arc<BlockLayer<B>>,
    ) -> Result<(WriteLog<B>, ReplayReport), ImageError> {
        if config.ring_bytes < WRITE_LOG_BYTES_MIN || !config.ring_bytes.is_multiple_of(BLOCK_BYTES)
        {
            return Err(ImageError::InvalidConfig(format!(
                "write log size must be a multiple of 4 KiB and at least {} MiB",
                WRITE_LOG_BYTES_MIN >> 20
            )));
        }
        std::fs::create_dir_all(&config.dir)
            .map_err(io_err(&config.dir, "create the directory"))?;
        let path = log_path(&config.dir, pool, image);
        let name = format!("{pool}/{image}");
        let mut sup = if path.exists() {
            let f = File::open(&path).map_err(io_err(&path, "open"))?;
            let s = read_super(&f, &path)?;
            if s.name != name {
                return Err(WriteLogError::Invalid(
                    format!("belongs to {}, not {name}", s.name),
                    path,
                )
                .into());
            }
            s
        } else {
            create(&path, &name, config.ring_bytes)?
        };
        if sup.ring_bytes != config.ring_bytes {
            tracing::warn!(
                "write log {}: keeps its ring of {} MiB (asked for {} MiB; remove the log after a clean stop to change it)",
                path.display(),
                sup.ring_bytes >> 20,
                config.ring_bytes >> 20
            );
        }
        // Replay: every valid unpublished record, in order, through the block layer.
        let (records, mut report) = {
            let f = File::open(&path).map_err(io_err(&path, "open"))?;
            scan(&f, &path, &sup)?
        };
        if let (false, Some(before)) = (records.is_empty(), config.previous_lock_client) {
            if sup.client_id != 0 && before != Some(sup.client_id) {
                return Err(WriteLogError::Foreign {
                    path,
                    records: records.len(),
                    log_client: sup.client_id,
                    since: match before {
                        Some(c) => format!("client {c:016x}"),
                        None => "nobody (the lock was released)".into(),
                    },
                }
                .into());
            }
        }
        if let Some(why) = &report.stopped {
            tracing::warn!("write log {}: {why}", path.display());
        }
        let mut end_lsn = sup.published_lsn;
        let mut end_seq = sup.published_seq;
        if !records.is_empty() {
            tracing::info!(
                "write log {}: replaying {} unpublished records into {name}",
                path.display(),
                records.len()
            );
        }
        // In chunks, as the publisher sends them: coalesced, one write per data object
        // (objects in parallel, chunks in order).
        let mut at = 0;
        while at < records.len() {
            let mut end = at;
            let mut bytes = 0u64;
            while end < records.len() && (end == at || bytes < CHUNK_BYTES_MAX) {
                bytes += records[end].data.len() as u64;
                end += 1;
            }
            let chunk = &records[at..end];
            let mut merged = Overlay::default();
            for r in chunk {
                merged.insert(r.offset, r.seq, r.data.clone());
            }
            let writes = layer.object_writes(&coalesce(&merged, chunk))?;
            use futures::stream::{StreamExt, TryStreamExt};
            let ops = writes.into_iter().map(|w| {
                let layer = layer.clone();
                async move { layer.write_object(&w).await }
            });
            futures::stream::iter(ops)
                .buffer_unordered(REPLAY_WRITES_IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await?;
            for r in chunk {
                report.records_applied += 1;
                report.bytes_applied += r.data.len() as u64;
                end_lsn = r.end_lsn;
                end_seq = r.seq;
            }
            at = end;
        }
        layer.flush().await?;
        // Past the last valid record (also past a refused tail: its space is reused), under
        // a new log id: records of this and earlier openings (a refused tail, earlier laps)
        // can never be taken for new ones, whatever lands where they were.
        sup.published_lsn = end_lsn;
        sup.published_seq = end_seq;
        sup.log_id = rand::random::<u64>() | 1;
        sup.client_id = config.client_id;
        sup.generation += 1;
        {
            let f = open_direct(&path)?;
            write_super(&f, &path, &sup)?;
        }

        let (published_tx, _) = watch::channel(sup.published_seq);
        let shared = Arc::new(Shared {
            path: path.clone(),
            name,
            log_id: sup.log_id,
            ring_bytes: sup.ring_bytes,
            overlay: Mutex::new(Overlay::default()),
            ring: Ring {
                durable_published_lsn: Mutex::new(sup.published_lsn),
                freed: Condvar::new(),
                closing: AtomicBool::new(false),
            },
            counters: Counters::default(),
            acked_seq: AtomicU64::new(sup.published_seq),
            published_tx,
            failed: Mutex::new(None),
            head_lsn: AtomicU64::new(sup.published_lsn),
            flush_waiters: AtomicU64::new(0),
            wake_publisher: tokio::sync::Notify::new(),
            last_append: Mutex::new(std::time::Instant::now()),
            writer_tid: std::sync::atomic::AtomicI32::new(0),
            agent_mode: AtomicBool::new(false),
        });
        let (appends_tx, appends_rx) = std::sync::mpsc::channel::<Append>();
        let (logged_tx, logged_rx) = mpsc::unbounded_channel::<Logged>();
        let writer = {
            let shared = shared.clone();
            let file = open_direct(&path)?;
            let (seq, lsn) = (sup.published_seq + 1, sup.published_lsn);
            std::thread::Builder::new()
                .name("spindle-wlog".into())
                .spawn(move || writer_loop(shared, file, appends_rx, logged_tx, seq, lsn))
                .map_err(|e| ImageError::Task(format!("cannot start the write log thread: {e}")))?
        };
        let use_agent = config
            .agent
            .unwrap_or_else(|| agent::agent_serving(&config.dir));
        let ctl = if use_agent && !config.publish_paused {
            let pid = agent::own_pid();
            let ctl = agent::Ctl::create(
                &agent::ctl_path(&path),
                &[
                    (agent::F::LogId, sup.log_id),
                    (agent::F::ClientId, config.client_id),
                    (agent::F::ClusterId, config.cluster_id),
                    (agent::F::FrontPid, pid),
                    (agent::F::FrontBeatMs, agent::now_ms()),
                    (agent::F::HeadSeq, sup.published_seq),
                    (agent::F::HeadLsn, sup.published_lsn),
                    (agent::F::PublishedSeq, sup.published_seq),
                    (agent::F::PublishedLsn, sup.published_lsn),
                ],
            )
            .map_err(io_err(
                &agent::ctl_path(&path),
                "create the agent control page",
            ))?;
            tracing::info!(
                "write log {}: publishing through the offload agent of {}",
                path.display(),
                config.dir.display()
            );
            Some(Arc::new(ctl))
        } else {
            None
        };
        let publisher = {
            let (shared, layer) = (shared.clone(), layer.clone());
            let file = open_direct(&path)?;
            if let Some(ctl) = &ctl {
                drop(file);
                shared.agent_mode.store(true, Ordering::SeqCst);
                tokio::spawn(agent_watcher(
                    shared,
                    layer,
                    ctl.clone(),
                    logged_rx,
                    path.clone(),
                ))
            } else if config.publish_paused {
                tokio::spawn(async move {
                    let _keep = logged_rx;
                    std::future::pending::<()>().await
                })
            } else {
                tokio::spawn(publisher_loop(shared, layer, file, sup, logged_rx))
            }
        };
        Ok((
            WriteLog {
                shared,
                layer,
                appends: appends_tx,
                writer: Some(writer),
                publisher,
                ctl,
                write_through_bytes_min: config.write_through_bytes_min,
                drain: tokio::sync::Mutex::new(()),
            },
            report,
        ))
    }

    /// Logs `data` at `offset`; returns once it is durable in the log (and visible to
    /// reads). `fua`: also wait until it is published. A write of at least
    /// `write_through_bytes_min` goes around the log instead (`WRITE_THROUGH_BYTES_MIN`).
    pub async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), ImageError> {
        self.check_failed()?;
        if data.len() >= self.write_through_bytes_min {
            // Unpublished records under the range reach the cluster first: publishing them
            // later, or replaying them after a crash, would put older bytes over these.
            let newest = lock(&self.shared.overlay).newest_seq_in(offset, data.len() as u64);
            if let Some(seq) = newest {
                self.wait_published(seq).await?;
            }
            self.shared
                .counters
                .written_through
                .fetch_add(1, Ordering::Relaxed);
            // Durable on every copy when it returns (FUA needs nothing more).
            return self.layer.write_owned(offset, data).await;
        }
        let data = Bytes::from(data);
        let mut waits = Vec::with_capacity(data.len().div_ceil(RECORD_DATA_BYTES_MAX));
        let mut at = 0usize;
        while at < data.len() {
            let n = (data.len() - at).min(RECORD_DATA_BYTES_MAX);
            let (done, rx) = oneshot::channel();
            self.appends
                .send(Append {
                    offset: offset + at as u64,
                    data: data.slice(at..at + n),
                    done,
                })
                .map_err(|_| ImageError::Task("the write log thread is gone".into()))?;
            waits.push(rx);
            at += n;
        }
        let mut last = 0;
        for rx in waits {
            match rx.await {
                Ok(Ok(seq)) => last = last.max(seq),
                Ok(Err(e)) => return Err(ImageError::WriteLog(e)),
                Err(_) => return Err(ImageError::Task("the write log thread is gone".into())),
            }
        }
        if fua {
            self.wait_published(last).await?;
        }
        Ok(())
    }

    fn check_failed(&self) -> Result<(), ImageError> {
        match lock(&self.shared.failed).clone() {
            Some(why) => Err(ImageError::WriteLog(why)),
            None => Ok(()),
        }
    }

    /// Waits until every record up to `seq` is durable in the cluster.
    async fn wait_published(&self, seq: u64) -> Result<(), ImageError> {
        let mut rx = self.shared.published_tx.subscribe();
        if *rx.borrow_and_update() >= seq {
            return Ok(());
        }
        // Counted while waiting: the publisher does not hold back while someone waits.
        struct Waiting<'a>(&'a Shared);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.flush_waiters.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.shared.flush_waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.shared);
        self.shared.wake_publisher.notify_one();
        loop {
            if *rx.borrow_and_update() >= seq {
                return Ok(());
            }
            self.check_failed()?;
            if rx.changed().await.is_err() {
                return Err(ImageError::Task("the write log publisher is gone".into()));
            }
        }
    }

    /// Reads `len` bytes at `offset`: unpublished writes over the block layer.
    pub async fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Bytes>, ImageError> {
        let pieces = {
            let o = lock(&self.shared.overlay);
            if o.is_empty() {
                None
            } else {
                Some(o.pieces(offset, len))
            }
        };
        let Some(pieces) = pieces else {
            return self.layer.read_pieces(offset, len).await;
        };
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            match p {
                Piece::Logged(b) => out.push(b),
                Piece::Gap { offset, len } => {
                    out.extend(self.layer.read_pieces(offset, len).await?)
                }
            }
        }
        Ok(out)
    }

    /// Waits until everything acknowledged before this call is published, then flushes
    /// the block layer (NBD FLUSH).
    pub async fn flush(&self) -> Result<(), ImageError> {
        let _one = self.drain.lock().await;
        let seq = self.shared.acked_seq.load(Ordering::SeqCst);
        self.wait_published(seq).await?;
        self.layer.flush().await
    }

    /// Zeroes a range: the log is drained first, so the zeroing is ordered after every
    /// logged write (trims are rare; they go around the log).
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        self.flush().await?;
        self.layer.write_zeroes(offset, len).await
    }

    pub fn stats(&self) -> WriteLogStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let durable = *lock(&self.shared.ring.durable_published_lsn);
        WriteLogStats {
            appended_records: g(&c.appended_records),
            appended_bytes: g(&c.appended_bytes),
            group_commits: g(&c.group_commits),
            published_records: g(&c.published_records),
            published_bytes: g(&c.published_bytes),
            publish_writes: g(&c.publish_writes),
            publish_extents: g(&c.publish_extents),
            publish_chunks: g(&c.publish_chunks),
            full_waits: g(&c.full_waits),
            written_through: g(&c.written_through),
            overlay_bytes: lock(&self.shared.overlay).bytes(),
            ring_used_bytes: self
                .shared
                .head_lsn
                .load(Ordering::Relaxed)
                .saturating_sub(durable),
            ring_bytes: self.shared.ring_bytes,
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }
}

/// The writer thread: takes whatever appends are queued (group commit), waits for ring
/// space, writes them with one direct, synchronous write (two when the batch wraps), then
/// makes them visible and acknowledges them.
fn writer_loop(
    shared: Arc<Shared>,
    file: File,
    rx: std::sync::mpsc::Receiver<Append>,
    logged: mpsc::UnboundedSender<Logged>,
    mut seq: u64,
    mut lsn: u64,
) {
    let ring = shared.ring_bytes;
    // SAFETY: gettid(2) has no preconditions.
    shared
        .writer_tid
        .store(unsafe { libc::gettid() }, Ordering::SeqCst);
    // One aligned buffer for every group commit: the largest batch, plus a pad's block.
    let mut scratch = IoBuf::aligned(
        (BATCH_BYTES_MAX + format::record_bytes(RECORD_DATA_BYTES_MAX) + BLOCK_BYTES) as usize,
        BLOCK_BYTES as usize,
    );
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let mut bytes = format::record_bytes(batch[0].data.len());
        while bytes < BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(a) => {
                    bytes += format::record_bytes(a.data.len());
                    batch.push(a);
                }
                Err(_) => break,
            }
        }
        // Lay the batch out: records in order, a pad where one would straddle the end.
        let mut layout: Vec<(u64, u64, Option<usize>)> = Vec::new(); // (lsn, bytes, append index)
        let mut at = lsn;
        for (i, a) in batch.iter().enumerate() {
            let n = format::record_bytes(a.data.len());
            let room = ring - at % ring;
            if n > room {
                layout.push((at, room, None));
                at += room;
            }
            layout.push((at, n, Some(i)));
            at += n;
        }
        let need = at - lsn;
        // Wait for the publisher to free enough of the ring (durably).
        let mut waited = false;
        {
            let mut published = lock(&shared.ring.durable_published_lsn);
            while at - *published > ring {
                if shared.ring.closing.load(Ordering::SeqCst) {
                    return;
                }
                waited = true;
                published = shared
                    .ring
                    .freed
                    .wait_timeout(published, Duration::from_millis(100))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        if waited {
            shared.counters.full_waits.fetch_add(1, Ordering::Relaxed);
        }
        debug_assert!(need <= ring);
        // Encode into the reused buffer, in order; `parts` are its contiguous pieces of
        // the ring (two when the batch wraps: the pad's header block ends the first).
        let mut parts: Vec<(u64, std::ops::Range<usize>)> = Vec::with_capacity(2);
        let mut seqs = Vec::with_capacity(batch.len());
        let batch_first = seq;
        let mut used = 0usize;
        for &(l, n, idx) in &layout {
            let off = l % ring;
            match parts.last_mut() {
                Some((start, r)) if *start + r.len() as u64 == off => {}
                _ => parts.push((off, used..used)),
            }
            let written = if idx.is_some() { n } else { BLOCK_BYTES } as usize;
            debug_assert!(used + written <= scratch.len());
            let out = &mut scratch[used..used + written];
            match idx {
                None => {
                    // A pad: only its header block is written.
                    format::encode_pad(out, seq, batch_first, shared.log_id, n);
                }
                Some(i) => {
                    let a = &batch[i];
                    format::encode_write(out, seq, batch_first, shared.log_id, a.offset, &a.data);
                    seqs.push((seq, l + n));
                }
            }
            seq += 1;
            used += written;
            if let Some((_, r)) = parts.last_mut() {
                r.end = used;
            }
            if idx.is_none() && n > BLOCK_BYTES {
                // The rest of the pad is not written: the next piece starts elsewhere.
                parts.push((u64::MAX, used..used));
            }
        }
        parts.retain(|(start, r)| *start != u64::MAX || !r.is_empty());
        let mut result = Ok(());
        for (off, r) in &parts {
            debug_assert!(*off != u64::MAX);
            if let Err(e) = file.write_all_at(&scratch[r.clone()], RING_START + off) {
                result = Err(format!(
                    "write log {}: write failed: {e}",
                    shared.path.display()
                ));
                break;
            }
        }
        if let Err(e) = result {
            // Nothing of this batch is acknowledged; the log refuses everything after it
            // (a later batch must not be durable after a hole).
            *lock(&shared.failed) = Some(e.clone());
            for a in batch {
                let _ = a.done.send(Err(e.clone()));
            }
            while let Ok(a) = rx.recv() {
                let _ = a.done.send(Err(e.clone()));
            }
            return;
        }
        lsn = at;
        shared.head_lsn.store(lsn, Ordering::Relaxed);
        *lock(&shared.last_append) = std::time::Instant::now();
        shared
            .counters
            .group_commits
            .fetch_add(1, Ordering::Relaxed);
        let c = &shared.counters;
        for (a, (s, end_lsn)) in batch.into_iter().zip(seqs) {
            c.appended_records.fetch_add(1, Ordering::Relaxed);
            c.appended_bytes
                .fetch_add(a.data.len() as u64, Ordering::Relaxed);
            lock(&shared.overlay).insert(a.offset, s, a.data.clone());
            let _ = logged.send(Logged {
                seq: s,
                offset: a.offset,
                data: a.data,
                end_lsn,
            });
            shared.acked_seq.fetch_max(s, Ordering::SeqCst);
            let _ = a.done.send(Ok(s));
        }
        // (An offload agent watches the fill itself: waking this process for it would
        // cost the application's CPU on every commit.)
        if !shared.agent_mode.load(Ordering::Relaxed)
            && (lsn - *lock(&shared.ring.durable_published_lsn)) * 4 >= ring * PUBLISH_FILL_QUARTERS
        {
            shared.wake_publisher.notify_one();
        }
    }
}

/// Whether the publisher should publish now (see `PUBLISH_FILL_QUARTERS`).
fn publish_due(shared: &Shared) -> bool {
    let used = shared
        .head_lsn
        .load(Ordering::Relaxed)
        .saturating_sub(*lock(&shared.ring.durable_published_lsn));
    used * 4 >= shared.ring_bytes * PUBLISH_FILL_QUARTERS
        || shared.flush_waiters.load(Ordering::SeqCst) > 0
        || lock(&shared.last_append).elapsed() >= PUBLISH_IDLE
}

/// The publisher: takes the logged records in chunks, coalesces overwrites within a chunk,
/// cuts the result into one multi-extent write per data object and sends those; up to
/// `PUBLISH_CHUNKS_IN_FLIGHT` chunks are on their way at once (LineFS's pipeline: while
/// one chunk's writes travel to the copies, the next is coalesced and sent). A write to an
/// object starts only after the previous chunk's write to that object was acknowledged
/// (per-object order survives retries). Chunks complete in order: each then leaves the
/// overlay and moves the superblock's published position (which frees ring space).
async fn publisher_loop<B: ObjectBackend>(
    shared: Arc<Shared>,
    layer: Arc<BlockLayer<B>>,
    file: File,
    mut sup: Super,
    mut rx: mpsc::UnboundedReceiver<Logged>,
) {
    use futures::stream::{FuturesOrdered, StreamExt};
    let file = Arc::new(file);
    let mut in_flight = FuturesOrdered::new();
    // The last write sent to each data object: the next one to it waits for it.
    let mut tails: HashMap<u64, oneshot::Receiver<()>> = HashMap::new();
    let mut pending: Option<Logged> = None;
    let mut rx_open = true;
    loop {
        let start = in_flight.len() < PUBLISH_CHUNKS_IN_FLIGHT && publish_due(&shared);
        if let Some(first) = pending.take_if(|_| start) {
            let mut chunk = vec![first];
            let mut bytes = chunk[0].data.len() as u64;
            while bytes < CHUNK_BYTES_MAX {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += r.data.len() as u64;
                        chunk.push(r);
                    }
                    Err(_) => break,
                }
            }
            match start_chunk(&shared.name, &layer, chunk, bytes, &mut tails) {
                Ok(f) => in_flight.push_back(f),
                Err(why) => return fail(&shared, why),
            }
            continue;
        }
        if !rx_open && pending.is_none() && in_flight.is_empty() {
            return;
        }
        let waiting = pending.is_some() && in_flight.len() < PUBLISH_CHUNKS_IN_FLIGHT;
        tokio::select! {
            done = in_flight.next(), if !in_flight.is_empty() => {
                let Some(done) = done else { continue };
                match done {
                    Ok(done) => {
                        finish_chunk(&shared, &file, &mut sup, done).await;
                        tails.retain(|_, t| !matches!(t.try_recv(), Ok(())));
                    }
                    Err(why) => return fail(&shared, why),
                }
            }
            r = rx.recv(), if rx_open && pending.is_none() => match r {
                Some(r) => pending = Some(r),
                None => rx_open = false,
            },
            _ = tokio::time::timeout(PUBLISH_IDLE / 5, shared.wake_publisher.notified()), if waiting => {}
        }
    }
}

/// How often the front end looks at the control page when nobody waits for publishing.
const WATCH_IDLE: Duration = Duration::from_millis(10);

/// Whether the ring is (nearly) full: writers wait for publishing.
fn ring_full(shared: &Shared) -> bool {
    let used = shared
        .head_lsn
        .load(Ordering::Relaxed)
        .saturating_sub(*lock(&shared.ring.durable_published_lsn));
    used + BATCH_BYTES_MAX >= shared.ring_bytes
}

/// How long a front end waits for the agent to attach before it publishes itself.
const AGENT_ATTACH_WAIT: Duration = Duration::from_secs(5);

/// Aborts a task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The front end's side of publishing through an agent: moves the control page's head as
/// records become durable, asks for publishing when a FLUSH waits, beats, and when the
/// published position moves drops those records from the overlay (and the cached extents
/// they touch: the agent wrote around this process's cache) and frees their ring space.
/// When no agent attaches in `AGENT_ATTACH_WAIT`, or the agent stops beating, this
/// process publishes from the file itself ([`agent::publish_from_file`]).
async fn agent_watcher<B: ObjectBackend>(
    shared: Arc<Shared>,
    layer: Arc<BlockLayer<B>>,
    ctl: Arc<agent::Ctl>,
    mut rx: mpsc::UnboundedReceiver<Logged>,
    log: PathBuf,
) {
    use agent::F;
    let mut pending: std::collections::VecDeque<(u64, u64, u64)> = Default::default();
    let mut published = ctl.get(F::PublishedSeq);
    let front_cpus = agent::own_cpu_mask();
    let started = std::time::Instant::now();
    let mut local: Option<AbortOnDrop<Result<agent::Stopped, String>>> = None;
    let mut last_beat = started - agent::BEAT_EVERY;
    let mut stalled_warned = false;
    let mut writer_on: u64 = 0;
    loop {
        // Quick while someone waits for publishing (a FLUSH, or writes on a full ring),
        // else slow: the agent publishes lazily, and every wake-up costs the
        // application's CPU.
        let waiting = shared.flush_waiters.load(Ordering::SeqCst) > 0 || ring_full(&shared);
        let wait = if waiting { agent::POLL } else { WATCH_IDLE };
        let _ = tokio::time::timeout(wait, shared.wake_publisher.notified()).await;
        while let Ok(r) = rx.try_recv() {
            pending.push_back((r.seq, r.offset, r.data.len() as u64));
            ctl.set(F::HeadLsn, r.end_lsn);
            ctl.set(F::HeadSeq, r.seq);
        }
        if shared.flush_waiters.load(Ordering::SeqCst) > 0 {
            ctl.fetch_max(F::FlushSeq, shared.acked_seq.load(Ordering::SeqCst));
        }
        if last_beat.elapsed() >= agent::BEAT_EVERY {
            last_beat = std::time::Instant::now();
            ctl.set(F::FrontBeatMs, agent::now_ms());
            // The log writer thread goes where the agent runs (the application's CPUs
            // then only hand records over); back to this process's CPUs without one.
            let want = match ctl.get(F::AgentPid) {
                p if p != 0 && p != agent::own_pid() => ctl.get(F::AgentCpus),
                _ => 0,
            };
            let tid = shared.writer_tid.load(Ordering::SeqCst);
            if want != writer_on && tid != 0 {
                let mask = if want != 0 { want } else { front_cpus };
                match agent::pin_thread(tid, &agent::mask_cpus(mask)) {
                    Ok(()) => writer_on = want,
                    Err(e) => tracing::debug!("cannot move the log writer thread: {e}"),
                }
            }
            let holder = ctl.get(F::AgentPid);
            let waited = started.elapsed() >= AGENT_ATTACH_WAIT;
            if local.is_none()
                && ctl.publisher_gone()
                && (holder != 0 || waited)
                && ctl.swap_if(F::AgentPid, holder, agent::own_pid())
            {
                tracing::warn!(
                    "write log {}: {}; publishing in this process",
                    shared.name,
                    if holder == 0 {
                        "no offload agent attached"
                    } else {
                        "the offload agent stopped"
                    }
                );
                ctl.set(F::AgentBeatMs, agent::now_ms());
                stalled_warned = false;
                let (log, ctl, layer) = (log.clone(), ctl.clone(), layer.clone());
                local = Some(AbortOnDrop(tokio::spawn(async move {
                    agent::publish_from_file(&log, ctl, layer, agent::own_pid()).await
                })));
            } else if local.is_none()
                && holder != 0
                && !stalled_warned
                && !ctl.alive(F::AgentPid, F::AgentBeatMs)
            {
                // Alive but silent: its requests may still land, so this process must not
                // publish over it; writes wait (a full ring) until it goes on or is gone.
                stalled_warned = true;
                tracing::warn!(
                    "write log {}: the offload agent (pid {holder}) stopped beating; waiting \
                     for it (kill it to publish from this process)",
                    shared.name
                );
            }
        }
        if let Some(h) = &mut local {
            if h.0.is_finished() {
                let why = match (&mut h.0).await {
                    Ok(Ok(stopped)) => format!("the publisher stopped ({stopped:?})"),
                    Ok(Err(why)) => why,
                    Err(e) => format!("the publisher task failed: {e}"),
                };
                local = None;
                if ctl.get(F::Failed) == 0 {
                    tracing::warn!("write log {}: {why}", shared.name);
                } else {
                    return fail(&shared, why);
                }
            }
        }
        if ctl.get(F::Failed) != 0 && local.is_none() {
            return fail(
                &shared,
                format!(
                    "write log {}: the offload agent could not publish (see its log); writes \
                     stay in the log and are replayed at the next start",
                    shared.name
                ),
            );
        }
        let p = ctl.get(F::PublishedSeq);
        if p > published {
            let plsn = ctl.get(F::PublishedLsn);
            let (mut records, mut bytes) = (0u64, 0u64);
            while let Some(&(seq, offset, len)) = pending.front() {
                if seq > p {
                    break;
                }
                // The cache first: a read between the two finds the overlay still.
                layer.invalidate(offset, len);
                lock(&shared.overlay).remove_published(offset, len, p);
                pending.pop_front();
                records += 1;
                bytes += len;
            }
            let c = &shared.counters;
            c.published_records.fetch_add(records, Ordering::Relaxed);
            c.published_bytes.fetch_add(bytes, Ordering::Relaxed);
            published = p;
            shared.published_tx.send_replace(p);
            *lock(&shared.ring.durable_published_lsn) = plsn;
            shared.ring.freed.notify_all();
        }
    }
}

/// Publishing stopped for good (e.g. this client was fenced): flushes report `why`.
fn fail(shared: &Shared, why: String) {
    tracing::error!("{why}");
    *lock(&shared.failed) = Some(why);
    shared.published_tx.send_modify(|_| {});
}

/// A chunk whose writes are all durable on every copy.
pub(super) struct ChunkDone {
    pub(super) records: Vec<Logged>,
    bytes: u64,
    object_writes: u64,
    extents: u64,
}

/// Coalesces a chunk and starts its object writes (each chained behind the previous
/// write to its object); the future resolves once all are acknowledged. Err: a write
/// failed for good (fenced), or the chunk does not fit the image (never for records the
/// log accepted).
#[allow(clippy::type_complexity)]
pub(super) fn start_chunk<B: ObjectBackend>(
    name: &str,
    layer: &Arc<BlockLayer<B>>,
    records: Vec<Logged>,
    bytes: u64,
    tails: &mut HashMap<u64, oneshot::Receiver<()>>,
) -> Result<
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ChunkDone, String>> + Send>>,
    String,
> {
    // Coalesce: the chunk's final bytes per range (later records win).
    let mut merged = Overlay::default();
    for r in &records {
        merged.insert(r.offset, r.seq, r.data.clone());
    }
    let runs = coalesce(&merged, &records);
    let extents = runs.len() as u64;
    let writes = layer
        .object_writes(&runs)
        .map_err(|e| format!("write log {name}: cannot publish: {e}"))?;
    let object_writes = writes.len() as u64;
    let mut ops = Vec::with_capacity(writes.len());
    for w in writes {
        let prev = tails.remove(&w.index);
        let (tx, rx) = oneshot::channel();
        tails.insert(w.index, rx);
        let (layer, name) = (layer.clone(), name.to_string());
        ops.push(async move {
            if let Some(prev) = prev {
                prev.await
                    .map_err(|_| "an earlier write to the same object failed".to_string())?;
            }
            loop {
                match layer.write_object(&w).await {
                    Ok(()) => break,
                    Err(ImageError::Backend(spindle_client::ClientError::Fenced(m))) => {
                        return Err(format!("write log {name}: publishing refused: {m}"));
                    }
                    Err(e) => {
                        tracing::warn!("write log {name}: publishing failed (retrying): {e}");
                        tokio::time::sleep(PUBLISH_RETRY).await;
                    }
                }
            }
            let _ = tx.send(());
            Ok::<(), String>(())
        });
    }
    Ok(Box::pin(async move {
        for r in futures::future::join_all(ops).await {
            r?;
        }
        Ok(ChunkDone {
            records,
            bytes,
            object_writes,
            extents,
        })
    }))
}

/// A published chunk leaves the overlay; the superblock's published position moves past it
/// (durably), which frees its ring space.
async fn finish_chunk(shared: &Shared, file: &Arc<File>, sup: &mut Super, done: ChunkDone) {
    let last = done
        .records
        .last()
        .map(|r| (r.seq, r.end_lsn))
        .unwrap_or_default();
    let c = &shared.counters;
    c.publish_chunks.fetch_add(1, Ordering::Relaxed);
    c.publish_writes
        .fetch_add(done.object_writes, Ordering::Relaxed);
    c.publish_extents.fetch_add(done.extents, Ordering::Relaxed);
    c.published_records
        .fetch_add(done.records.len() as u64, Ordering::Relaxed);
    c.published_bytes.fetch_add(done.bytes, Ordering::Relaxed);
    {
        let mut o = lock(&shared.overlay);
        for r in &done.records {
            o.remove_published(r.offset, r.data.len() as u64, last.0);
        }
    }
    shared.published_tx.send_replace(last.0);
    match finish_super(file, &shared.path, sup, last.0, last.1).await {
        Ok(()) => {
            *lock(&shared.ring.durable_published_lsn) = last.1;
            shared.ring.freed.notify_all();
        }
        Err(e) => tracing::warn!("{e} (the ring space stays in use until the next one)"),
    }
}

/// Moves the superblock's published position to (`seq`, `lsn`), durably.
pub(super) async fn finish_super(
    file: &Arc<File>,
    path: &Path,
    sup: &mut Super,
    seq: u64,
    lsn: u64,
) -> Result<(), String> {
    sup.published_seq = seq;
    sup.published_lsn = lsn;
    sup.generation += 1;
    let (f, s, path) = (file.clone(), sup.clone(), path.to_path_buf());
    match tokio::task::spawn_blocking(move || write_super(&f, &path, &s)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("write log superblock task: {e}")),
    }
}

/// The byte ranges a chunk covers, merged into runs, with their final bytes.
fn coalesce(merged: &Overlay, chunk: &[Logged]) -> Vec<(u64, Vec<u8>)> {
    let mut ranges: Vec<(u64, u64)> = chunk
        .iter()
        .map(|r| (r.offset, r.offset + r.data.len() as u64))
        .collect();
    ranges.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match runs.last_mut() {
            Some((_, end)) if s <= *end => *end = (*end).max(e),
            _ => runs.push((s, e)),
        }
    }
    runs.into_iter()
        .map(|(s, e)| {
            let mut data = Vec::with_capacity((e - s) as usize);
            for p in merged.pieces(s, e - s) {
                if let Piece::Logged(b) = p {
                    data.extend_from_slice(&b);
                }
            }
            debug_assert_eq!(data.len() as u64, e - s);
            (s, data)
        })
        .collect()
}

#[cfg(test)]
mod tests;

/// For tests: the header of the record at `lsn` of the log at `path`.
#[cfg(test)]
fn record_header_at(path: &Path, lsn: u64) -> Option<Header> {
    let f = File::open(path).ok()?;
    let s = read_super(&f, path).ok()?;
    let mut b = vec![0u8; BLOCK_BYTES as usize];
    f.read_exact_at(&mut b, RING_START + lsn % s.ring_bytes)
        .ok()?;
    format::decode_header(&b)
}
