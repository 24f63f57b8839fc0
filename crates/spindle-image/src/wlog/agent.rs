//! The offload agent's half of a write log: publishing from the log *file*, driven by a
//! control page shared with the front end (LineFS's publisher on its own cores).
//!
//! ```text
//!  front end (spindle nbd --write-log-agent)        agent (spindle agent --cpus LIST)
//!   group commit ──> head (seq, lsn) ──┐            reads records from the log file,
//!   FLUSH waiting ──> flush_seq ───────┤  <log>.ctl validates their checksums,
//!   overlay/cache drop <── published ──┤  (4 KiB,   coalesces, sends multi-extent
//!   ring space freed  <── (seq, lsn) ──┘  mmap)     writes, writes the superblock,
//!                                                    then moves `published`
//! ```
//!
//! The control page ([`Ctl`]) is one 4 KiB file mapped shared by both processes: a few
//! 64-bit words, each written by one side only. Who publishes is decided by a
//! compare-and-swap of `agent_pid`; a front end whose agent never attaches, or whose
//! agent's process is gone, publishes from the file itself, with the same code
//! ([`publish_from_file`]). An agent that exists but stopped beating is waited for, never
//! published over: its requests could still land after newer ones. An agent lets go when
//! its front end stops beating: a front end that comes back takes over; one that crashed
//! is replayed by the next, and the agent's writes carry the front end's client id, so
//! fencing the front end (a takeover of the image lock) fences its agent too.
//!
//! Invariants: `published` moves only after the superblock saying so is durable; the
//! front end drops a record from its overlay (and the cached extents it touches) only
//! after `published` covers it; records are read, checked and published in seq order,
//! and a write to an object waits for the previous chunk's write to it.

use super::format::{self, Super, BLOCK_BYTES, HEADER_BYTES, RING_START};
use super::{
    finish_super, read_super, start_chunk, ChunkDone, Logged, CHUNK_BYTES_MAX,
    PUBLISH_CHUNKS_IN_FLIGHT, PUBLISH_FILL_QUARTERS, PUBLISH_IDLE,
};
use crate::block::BlockLayer;
use crate::image::ObjectBackend;
use bytes::Bytes;
use spindle_io::IoBuf;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the control page.
const CTL_BYTES: usize = 4096;
const CTL_MAGIC: u64 = u64::from_le_bytes(*b"SPNDWCTL");
/// A side whose heartbeat is older than this is gone.
pub const BEAT_STALE: Duration = Duration::from_secs(3);
/// How often each side writes its heartbeat.
pub const BEAT_EVERY: Duration = Duration::from_millis(100);
/// How often the publisher looks at the control page for new records.
pub(super) const POLL: Duration = Duration::from_millis(1);

/// The words of the control page (index x 8 = byte offset). Each is written by one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum F {
    /// `SPNDWCTL`, written last at creation.
    Magic = 0,
    /// The log generation (the superblock's `log_id`) this page belongs to.
    LogId,
    /// The front end's client id: the agent's writes carry it (fencing).
    ClientId,
    /// Front end: its pid and heartbeat (unix ms).
    FrontPid,
    FrontBeatMs,
    /// Whoever publishes: pid (0 = nobody) and heartbeat.
    AgentPid,
    AgentBeatMs,
    /// Front end: the last record durable in the log (seq) and the LSN past it.
    HeadSeq,
    HeadLsn,
    /// Publisher: every record up to this seq is durable on every copy, and the
    /// superblock says so; the LSN past it.
    PublishedSeq,
    PublishedLsn,
    /// Front end: publish up to this seq now (a FLUSH or FUA waits).
    FlushSeq,
    /// Publisher: 1 once publishing failed for good (e.g. fenced).
    Failed,
    /// Front end: 1 when it closes the log (the agent detaches).
    Stop,
    /// Front end: the cluster its image lives in (`ClusterMap::cluster_id`): an agent
    /// connected to another cluster must not publish there.
    ClusterId,
    /// Publisher: the CPUs it runs on (bit i = CPU i, for CPUs below 64; 0 = unknown). The
    /// front end moves its log writer thread there, so that the application's CPUs only
    /// hand records over.
    AgentCpus,
}

/// Parses a CPU list like `1` or `0,2-3` (numbers below `CPU_SETSIZE`).
pub fn parse_cpus(list: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let num = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("bad CPU number {x:?} in {list:?}"))
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b || b >= libc::CPU_SETSIZE as usize {
            return Err(format!("bad CPU range {part:?} in {list:?}"));
        }
        out.extend(a..=b);
    }
    if out.is_empty() {
        return Err(format!("empty CPU list {list:?}"));
    }
    Ok(out)
}

/// The CPUs of a bit set (bit i = CPU i).
pub fn mask_cpus(mask: u64) -> Vec<usize> {
    (0..64).filter(|c| mask & (1 << c) != 0).collect()
}

/// This thread's CPUs below 64 as a bit set (0 if it has none there).
pub fn own_cpu_mask() -> u64 {
    // SAFETY: sched_getaffinity fills a zeroed cpu_set_t of the size given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return 0;
    }
    (0..64).fold(0u64, |m, c| {
        // SAFETY: CPU_ISSET reads inside `set` (c < CPU_SETSIZE).
        if unsafe { libc::CPU_ISSET(c, &set) } {
            m | 1 << c
        } else {
            m
        }
    })
}

/// Moves thread `tid` (0: the calling thread) to `cpus` (each below `CPU_SETSIZE`, as
/// [`parse_cpus`] returns them). Allocates nothing: callable between fork and exec.
pub fn pin_thread(tid: i32, cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it for numbers
    // below CPU_SETSIZE (larger ones are skipped); sched_setaffinity only reads it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The control page of the log at `log`: `<log>.ctl`.
pub fn ctl_path(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// A mapped control page.
pub struct Ctl {
    base: *mut u8,
    path: PathBuf,
}

// SAFETY: the mapping is only accessed through `AtomicU64`s (see `word`), which are safe
// to share between threads (and processes); `base` stays valid until `drop`.
unsafe impl Send for Ctl {}
// SAFETY: as above.
unsafe impl Sync for Ctl {}

impl Ctl {
    fn map(file: &File, path: &Path) -> std::io::Result<Ctl> {
        use std::os::fd::AsRawFd;
        // SAFETY: a shared read-write mapping of a file descriptor we own, of the file's
        // length (checked by the callers to be CTL_BYTES); checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CTL_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Ctl {
            base: p.cast(),
            path: path.to_path_buf(),
        })
    }

    /// Creates a fresh page at `path` (replacing any: an agent mapping the old one sees
    /// its front end stop beating) with `init` set, the magic last.
    pub fn create(path: &Path, init: &[(F, u64)]) -> std::io::Result<Ctl> {
        let tmp = path.with_extension("ctl.tmp");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.set_len(CTL_BYTES as u64)?;
        let ctl = Ctl::map(&file, path)?;
        for &(f, v) in init {
            ctl.set(f, v);
        }
        ctl.set(F::Magic, CTL_MAGIC);
        std::fs::rename(&tmp, path)?;
        Ok(ctl)
    }

    /// Maps the page at `path`; None if it is not (yet) a control page.
    pub fn open(path: &Path) -> std::io::Result<Option<Ctl>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        if file.metadata()?.len() != CTL_BYTES as u64 {
            return Ok(None);
        }
        let ctl = Ctl::map(&file, path)?;
        Ok((ctl.get(F::Magic) == CTL_MAGIC).then_some(ctl))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, f: F) -> &AtomicU64 {
        let i = f as usize;
        debug_assert!((i + 1) * 8 <= CTL_BYTES);
        // SAFETY: `base` is a live, page-aligned mapping of CTL_BYTES bytes; word `i` is
        // 8-byte aligned and inside it; every access to the page goes through atomics.
        unsafe { &*(self.base.add(i * 8) as *const AtomicU64) }
    }

    pub fn get(&self, f: F) -> u64 {
        self.word(f).load(Ordering::SeqCst)
    }

    pub fn set(&self, f: F, v: u64) {
        self.word(f).store(v, Ordering::SeqCst)
    }

    pub fn fetch_max(&self, f: F, v: u64) {
        self.word(f).fetch_max(v, Ordering::SeqCst);
    }

    /// Sets `f` to `new` if it holds `old`.
    pub fn swap_if(&self, f: F, old: u64, new: u64) -> bool {
        self.word(f)
            .compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Whether the side with pid word `pid` and heartbeat word `beat` is alive: its
    /// process exists and it beat within `BEAT_STALE`.
    pub fn alive(&self, pid: F, beat: F) -> bool {
        let p = self.get(pid);
        p != 0
            && process_exists(p)
            && now_ms().saturating_sub(self.get(beat)) < BEAT_STALE.as_millis() as u64
    }

    /// Whether the publisher named by `AgentPid` is gone: nobody, or a process that no
    /// longer exists. A publisher that exists but stopped beating (stalled) is *not* gone:
    /// its requests may still land, so nobody else may publish until it is.
    pub fn publisher_gone(&self) -> bool {
        let p = self.get(F::AgentPid);
        p == 0 || !process_exists(p)
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference outlives `self`.
        unsafe { libc::munmap(self.base.cast(), CTL_BYTES) };
    }
}

/// Whether process `pid` exists (a zombie does not).
pub fn process_exists(pid: u64) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // A zombie (exited, not reaped) is gone.
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        if let Some(state) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
        {
            return state != "Z" && state != "X";
        }
    }
    // SAFETY: kill(2) with signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This process's pid.
pub fn own_pid() -> u64 {
    std::process::id() as u64
}

/// Reads the records of the log from `lsn` (seq `seq`) up to `head_lsn`, at most about
/// `max_bytes` of data: each checked (header, log id, seq order, checksum). Returns them
/// and the position after the last one read (pads are skipped).
#[allow(clippy::too_many_arguments)]
fn read_records(
    file: &File,
    path: &Path,
    sup: &Super,
    mut lsn: u64,
    mut seq: u64,
    head_lsn: u64,
    max_bytes: u64,
) -> Result<(Vec<Logged>, u64, u64), String> {
    let ring = sup.ring_bytes;
    let mut out = Vec::new();
    let mut bytes = 0u64;
    let mut head = IoBuf::aligned(BLOCK_BYTES as usize, BLOCK_BYTES as usize);
    let bad = |lsn: u64, seq: u64, what: &str| {
        format!(
            "write log {}: record seq {seq} at log offset {lsn}: {what}; publishing stops (the \
             front end's replay at its next start reports the damage)",
            path.display()
        )
    };
    while lsn < head_lsn && bytes < max_bytes {
        let at = RING_START + lsn % ring;
        file.read_exact_at(&mut head, at)
            .map_err(|e| bad(lsn, seq, &format!("read failed: {e}")))?;
        let h = format::decode_header(&head).ok_or_else(|| bad(lsn, seq, "no record header"))?;
        if h.log_id != sup.log_id || h.seq != seq {
            return Err(bad(lsn, seq, "not the next record of this log"));
        }
        if lsn % ring + h.record_bytes > ring || lsn + h.record_bytes > head_lsn {
            return Err(bad(lsn, seq, "runs past the ring or the durable head"));
        }
        if h.pad {
            if !format::record_ok(&head, &h, &[]) {
                return Err(bad(lsn, seq, "checksum mismatch"));
            }
        } else {
            let mut rec = IoBuf::aligned(h.record_bytes as usize, BLOCK_BYTES as usize);
            file.read_exact_at(&mut rec, at)
                .map_err(|e| bad(lsn, seq, &format!("read failed: {e}")))?;
            let data = &rec[HEADER_BYTES..HEADER_BYTES + h.data_len];
            if !format::record_ok(&rec, &h, data) {
                return Err(bad(lsn, seq, "checksum mismatch"));
            }
            bytes += h.data_len as u64;
            out.push(Logged {
                seq,
                offset: h.offset,
                data: Bytes::copy_from_slice(data),
                end_lsn: lsn + h.record_bytes,
            });
        }
        lsn += h.record_bytes;
        seq += 1;
    }
    Ok((out, lsn, seq))
}

/// Why [`publish_from_file`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The front end closed the log (everything it asked for is published).
    Closed,
    /// The front end stopped beating (crashed): its next start replays the log.
    FrontGone,
    /// Another publisher took the page over.
    Replaced,
}

/// Publishes the log at `log` as its control page asks, as publisher `pid` (already
/// swapped into `AgentPid`): reads records from the file, checks them, coalesces, sends
/// one multi-extent write per object (pipelined), writes the superblock, then moves
/// `PublishedSeq`/`PublishedLsn`. Err: publishing failed for good (`Failed` is set).
pub async fn publish_from_file<B: ObjectBackend>(
    log: &Path,
    ctl: Arc<Ctl>,
    layer: Arc<BlockLayer<B>>,
    pid: u64,
) -> Result<Stopped, String> {
    let r = publish_inner(log, &ctl, layer, pid).await;
    if r.is_err() {
        ctl.set(F::Failed, 1);
    }
    // Let go, so that the front end (or another agent) can publish: a stalled front end
    // that comes back finds nobody publishing and takes over.
    ctl.swap_if(F::AgentPid, pid, 0);
    r
}

async fn publish_inner<B: ObjectBackend>(
    log: &Path,
    ctl: &Arc<Ctl>,
    layer: Arc<BlockLayer<B>>,
    pid: u64,
) -> Result<Stopped, String> {
    use futures::stream::{FuturesOrdered, StreamExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(log)
        .map_err(|e| format!("write log {}: cannot open: {e}", log.display()))?;
    let mut sup = {
        let f = File::open(log)
            .map_err(|e| format!("write log {}: cannot open: {e}", log.display()))?;
        read_super(&f, log).map_err(|e| e.to_string())?
    };
    if sup.log_id != ctl.get(F::LogId) {
        return Err(format!(
            "write log {}: the control page belongs to another opening of the log",
            log.display()
        ));
    }
    let name = sup.name.clone();
    let file = Arc::new(file);
    // The superblock is the truth: a publisher that died between writing it and the
    // control page left the page behind it (never ahead).
    if sup.published_seq < ctl.get(F::PublishedSeq) {
        return Err(format!(
            "write log {}: the control page is ahead of the superblock",
            log.display()
        ));
    }
    ctl.set(F::PublishedLsn, sup.published_lsn);
    ctl.set(F::PublishedSeq, sup.published_seq);
    // Where reading continues (ahead of the durable published position while chunks are
    // in flight).
    let (mut lsn, mut seq) = (sup.published_lsn, sup.published_seq + 1);
    let mut in_flight = FuturesOrdered::new();
    let mut tails: HashMap<u64, tokio::sync::oneshot::Receiver<()>> = HashMap::new();
    let mut last_beat = Instant::now() - BEAT_EVERY;
    let (mut seen_head, mut head_changed) = (0u64, Instant::now());
    loop {
        if last_beat.elapsed() >= BEAT_EVERY {
            last_beat = Instant::now();
            if ctl.get(F::AgentPid) != pid {
                return Ok(Stopped::Replaced);
            }
            ctl.set(F::AgentBeatMs, now_ms());
            if !ctl.alive(F::FrontPid, F::FrontBeatMs) && ctl.get(F::Stop) == 0 {
                return Ok(Stopped::FrontGone);
            }
        }
        let head_seq = ctl.get(F::HeadSeq);
        let head_lsn = ctl.get(F::HeadLsn);
        if head_seq != seen_head {
            (seen_head, head_changed) = (head_seq, Instant::now());
        }
        let published = ctl.get(F::PublishedSeq);
        if ctl.get(F::Stop) != 0 && in_flight.is_empty() && published >= head_seq {
            return Ok(Stopped::Closed);
        }
        let due = head_lsn > lsn
            && in_flight.len() < PUBLISH_CHUNKS_IN_FLIGHT
            && (ctl.get(F::FlushSeq) > published
                || ctl.get(F::Stop) != 0
                || head_lsn.saturating_sub(ctl.get(F::PublishedLsn)) * 4
                    >= sup.ring_bytes * PUBLISH_FILL_QUARTERS
                || head_changed.elapsed() >= PUBLISH_IDLE);
        if due {
            let (records, next_lsn, next_seq) = {
                let (f, p, s) = (file.clone(), log.to_path_buf(), sup.clone());
                tokio::task::spawn_blocking(move || {
                    read_records(&f, &p, &s, lsn, seq, head_lsn, CHUNK_BYTES_MAX)
                })
                .await
                .map_err(|e| format!("write log reader task: {e}"))??
            };
            (lsn, seq) = (next_lsn, next_seq);
            if !records.is_empty() {
                let bytes = records.iter().map(|r| r.data.len() as u64).sum();
                in_flight.push_back(start_chunk(&name, &layer, records, bytes, &mut tails)?);
            }
            continue;
        }
        tokio::select! {
            done = in_flight.next(), if !in_flight.is_empty() => {
                let Some(done) = done else { continue };
                let done: ChunkDone = done?;
                finish_from_file(&file, log, &mut sup, ctl, &done).await?;
                tails.retain(|_, t| !matches!(t.try_recv(), Ok(())));
            }
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// A chunk published from the file: the superblock moves past it (durably), then the
/// control page says so.
async fn finish_from_file(
    file: &Arc<File>,
    log: &Path,
    sup: &mut Super,
    ctl: &Ctl,
    done: &ChunkDone,
) -> Result<(), String> {
    let Some(last) = done.records.last() else {
        return Ok(());
    };
    finish_super(file, log, sup, last.seq, last.end_lsn).await?;
    ctl.set(F::PublishedLsn, last.end_lsn);
    ctl.set(F::PublishedSeq, last.seq);
    Ok(())
}

/// The lock file an agent holds on its directory (one agent per directory).
pub fn agent_lock_path(dir: &Path) -> PathBuf {
    dir.join("agent.lock")
}

/// Whether an agent serves `dir`: something holds its lock file.
pub fn agent_serving(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = File::open(agent_lock_path(dir)) else {
        return false;
    };
    // SAFETY: flock(2) on a descriptor we own; a shared, non-blocking try.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if r == 0 {
        // SAFETY: as above; releases the lock just taken.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        return false;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

#[cfg(test)]
mod tests {
    use super::{mask_cpus, parse_cpus};

    #[test]
    fn cpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_cpus("1").unwrap(), vec![1]);
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(mask_cpus(0b1101), vec![0, 2, 3]);
        for bad in ["", "3-1", "x", "99999", "1-"] {
            assert!(parse_cpus(bad).is_err(), "{bad:?}");
        }
    }
}
