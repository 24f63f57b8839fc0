//! `spindle-trace`: stage clocks, the measurement behind `spindle bench stages`.
//!
//! A request crosses many stages between fio and the disk: the NBD server's reader and its
//! spawned task, the block layer, the client's connection writer, the socket, the daemon's
//! reader, its handler, the store, its reply writer and back. Each stage that a process
//! runs adds its duration to one pair of counters (`count`, `sum_ns`) here; a stage that
//! starts in one task and ends in another (a hand-off) carries its start [`Instant`] along.
//! The breakdown of a request is then the per-stage mean from every process, side by side
//! (a daemon's stages from the daemons' files, the NBD server's from its own).
//!
//! Off by default, and then one relaxed atomic load per stage point ([`now`] returns
//! `None`, [`record`] does nothing). [`init_from_env`] turns it on when the
//! `SPINDLE_STAGES_DIR` environment variable names a directory: a thread then rewrites
//! `DIR/ROLE-PID.txt` every 200 ms with the cumulative counters (one line per stage:
//! `name count sum_ns`), which a benchmark reads before and after a measurement window.
//! Children started by a process inherit the variable, so `SPINDLE_STAGES_DIR=D spindle up`
//! traces a whole cluster.
//!
//! This crate depends on nothing and is used from the protocol up; it is not a tracing
//! framework (no spans, no allocation per event).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

macro_rules! stages {
    ($($(#[doc = $doc:literal])* $name:ident = $label:literal,)*) => {
        /// A stage of a request's path (see the crate documentation).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Stage { $($(#[doc = $doc])* $name,)* }

        impl Stage {
            /// Every stage, in path order.
            pub const ALL: &'static [Stage] = &[$(Stage::$name,)*];

            /// The stage's name in the counter files and tables.
            pub fn label(self) -> &'static str {
                match self { $(Stage::$name => $label,)* }
            }
        }
    };
}

stages! {
    /// NBD: request decoded by the connection's reader -> its task starts running.
    NbdDispatch = "nbd.dispatch",
    /// NBD: the device's read call (block layer + client + cluster), whole.
    NbdDeviceRead = "nbd.device_read",
    /// NBD: the device's write call, whole.
    NbdDeviceWrite = "nbd.device_write",
    /// NBD: reply produced -> the connection's writer takes it.
    NbdReplyQueue = "nbd.reply_queue",
    /// NBD: the writer writes and flushes one batch of replies (per reply).
    NbdSend = "nbd.send",
    /// Client: an object read request queued -> its reply handed back (round trip).
    ClientReadRpc = "client.read_rpc",
    /// Client: an object write request queued -> its reply handed back (round trip).
    ClientWriteRpc = "client.write_rpc",
    /// RPC (any process): a frame queued -> the connection's writer takes it.
    RpcWriterQueue = "rpc.writer_queue",
    /// RPC (any process): writing one batch of frames to the socket (per frame).
    RpcWrite = "rpc.write",
    /// RPC (any process): a frame's first byte seen -> the frame read and verified.
    RpcRead = "rpc.read",
    /// RPC client side: a reply decoded by the connection's reader -> the waiting task
    /// resumes with it.
    RpcReplyWake = "rpc.reply_wake",
    /// Daemon: a client read decoded -> its task starts running (the checks of the map
    /// and the group included).
    OsdDispatch = "osd.dispatch",
    /// Daemon: the store's read of a client read (checksums verified).
    OsdStoreRead = "osd.store_read",
    /// Daemon: a client request decoded -> its reply queued (everything in the daemon
    /// except the reply's writing).
    OsdRequest = "osd.request",
    /// Primary of an erasure-coded group: waiting for the object's operation lock.
    EcLockWait = "osd.ec_lock_wait",
    /// Primary of an erasure-coded group: one slot write on every up shard, sent to durable.
    EcWrite = "osd.ec_write",
    /// Primary of an erasure-coded group: trimming the old slot after an acknowledged write.
    EcTrim = "osd.ec_trim",
    /// Primary of an erasure-coded group: reading the stripes an overwrite touches
    /// (read-modify-write).
    EcRmwRead = "osd.ec_rmw_read",
    /// Shard copy: composing a shard write (reading the base slot of a partial write).
    EcShardCompose = "osd.ec_shard_compose",
    /// Shard copy: a shard write's store transaction, submitted to durable.
    EcShardCommit = "osd.ec_shard_commit",
}

const STAGE_COUNT: usize = Stage::ALL.len();

static ENABLED: AtomicBool = AtomicBool::new(false);
static COUNTS: [AtomicU64; STAGE_COUNT] = [const { AtomicU64::new(0) }; STAGE_COUNT];
static SUMS_NS: [AtomicU64; STAGE_COUNT] = [const { AtomicU64::new(0) }; STAGE_COUNT];
static MAXES_NS: [AtomicU64; STAGE_COUNT] = [const { AtomicU64::new(0) }; STAGE_COUNT];

/// The environment variable that turns stage clocks on (a directory for the counter files).
pub const STAGES_DIR_ENV: &str = "SPINDLE_STAGES_DIR";
/// How often a traced process rewrites its counter file.
pub const DUMP_INTERVAL: Duration = Duration::from_millis(200);

/// Whether stage clocks are on in this process.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// The start of a stage: `Some(now)` when stage clocks are on, else `None` (no clock read).
#[inline]
pub fn now() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Adds the time since `start` to `stage` (nothing when `start` is `None`).
#[inline]
pub fn record(stage: Stage, start: Option<Instant>) {
    if let Some(start) = start {
        add(stage, 1, start.elapsed());
    }
}

/// Adds `count` occurrences taking `elapsed` in all to `stage`.
#[inline]
pub fn add(stage: Stage, count: u64, elapsed: Duration) {
    let i = stage as usize;
    let elapsed_ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    COUNTS[i].fetch_add(count, Relaxed);
    SUMS_NS[i].fetch_add(elapsed_ns, Relaxed);
    MAXES_NS[i].fetch_max(elapsed_ns, Relaxed);
}

/// The longest single recording of each stage since the process started (ns), in
/// [`Stage::ALL`] order: where the tail of a stage is, which a mean hides.
pub fn maxes_ns() -> Vec<u64> {
    Stage::ALL
        .iter()
        .map(|&s| MAXES_NS[s as usize].load(Relaxed))
        .collect()
}

/// The cumulative counters: `(stage, count, sum_ns)` for every stage.
pub fn snapshot() -> Vec<(Stage, u64, u64)> {
    Stage::ALL
        .iter()
        .map(|&s| {
            (
                s,
                COUNTS[s as usize].load(Relaxed),
                SUMS_NS[s as usize].load(Relaxed),
            )
        })
        .collect()
}

/// The counter file's text: one `name count sum_ns` line per stage, followed by
/// `max_ns` (the longest single recording, whole process) when `maxes_ns` is given.
pub fn render(snapshot: &[(Stage, u64, u64)], maxes_ns: Option<&[u64]>) -> String {
    let mut s = String::new();
    for (i, (stage, count, sum_ns)) in snapshot.iter().enumerate() {
        match maxes_ns.and_then(|m| m.get(i)) {
            Some(max_ns) => s.push_str(&format!("{} {count} {sum_ns} {max_ns}\n", stage.label())),
            None => s.push_str(&format!("{} {count} {sum_ns}\n", stage.label())),
        }
    }
    s
}

/// Parses a counter file: `(name, count, sum_ns)` per line (a trailing `max_ns` field is
/// accepted and left out); malformed lines are an error.
pub fn parse(text: &str) -> Result<Vec<(String, u64, u64)>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [name, count, sum] | [name, count, sum, _] => Ok((
                    (*name).to_string(),
                    count.parse().map_err(|e| format!("{l:?}: {e}"))?,
                    sum.parse().map_err(|e| format!("{l:?}: {e}"))?,
                )),
                _ => Err(format!("malformed stage line {l:?}")),
            }
        })
        .collect()
}

/// Turns stage clocks on if [`STAGES_DIR_ENV`] is set, naming this process `role` (e.g.
/// `osd.2`, `nbd`); returns the counter file's path. Idempotent per process (the first
/// role wins).
pub fn init_from_env(role: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(STAGES_DIR_ENV)?;
    init(Path::new(&dir), role)
}

/// Turns stage clocks on, writing `dir/ROLE-PID.txt` every [`DUMP_INTERVAL`].
pub fn init(dir: &Path, role: &str) -> Option<PathBuf> {
    if ENABLED.swap(true, Relaxed) {
        return None;
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("stage clocks: cannot create {}: {e}", dir.display());
        return None;
    }
    let path = dir.join(format!("{role}-{}.txt", std::process::id()));
    let file = path.clone();
    let spawned = std::thread::Builder::new()
        .name("stage-clocks".into())
        .spawn(move || loop {
            let tmp = file.with_extension("tmp");
            if std::fs::write(&tmp, render(&snapshot(), Some(&maxes_ns()))).is_ok() {
                let _ = std::fs::rename(&tmp, &file);
            }
            std::thread::sleep(DUMP_INTERVAL);
        });
    if let Err(e) = spawned {
        eprintln!("stage clocks: cannot start the writer thread: {e}");
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique_and_parse_back() {
        let mut labels: Vec<_> = Stage::ALL.iter().map(|s| s.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Stage::ALL.len());
        let snap: Vec<_> = Stage::ALL
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, i as u64, 1000 * i as u64))
            .collect();
        let parsed = parse(&render(&snap, None)).unwrap();
        let maxes: Vec<u64> = (0..snap.len() as u64).collect();
        assert_eq!(parse(&render(&snap, Some(&maxes))).unwrap(), parsed);
        assert_eq!(parsed.len(), Stage::ALL.len());
        for ((s, c, n), (name, pc, pn)) in snap.iter().zip(&parsed) {
            assert_eq!((s.label(), *c, *n), (name.as_str(), *pc, *pn));
        }
        assert!(parse("nbd.send 1").is_err());
        assert!(parse("nbd.send x 2").is_err());
        assert!(parse("nbd.send 1 2 3 4").is_err());
    }

    #[test]
    fn off_by_default_then_counts() {
        // Off: no clock read, nothing recorded.
        assert!(now().is_none() || enabled());
        let dir = std::env::temp_dir().join(format!("spindle-trace-{}", std::process::id()));
        let path = init(&dir, "test").unwrap();
        let before = snapshot()[Stage::OsdStoreRead as usize];
        let t = now();
        assert!(t.is_some());
        std::thread::sleep(Duration::from_millis(2));
        record(Stage::OsdStoreRead, t);
        let after = snapshot()[Stage::OsdStoreRead as usize];
        assert_eq!(after.1, before.1 + 1);
        assert!(after.2 - before.2 >= 2_000_000);
        assert!(maxes_ns()[Stage::OsdStoreRead as usize] >= 2_000_000);
        // The writer thread publishes the counters.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let lines = parse(&text).unwrap();
                if lines
                    .iter()
                    .any(|(n, c, _)| n == "osd.store_read" && *c >= 1)
                {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no counter file at {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
