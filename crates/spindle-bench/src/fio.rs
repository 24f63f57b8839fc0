//! `spindle bench fio`: block images over NBD measured with fio's `nbd` engine on the
//! DeLiBA matrix (bs 4k/64k/128k/512k x read/write/randread/randwrite x iodepth 1/16,
//! job parameters of `baselines/fio/bench.fio`), beside anchors measured in the same run
//! on the same machine:
//!
//! - `nbdkit memory` (fio `nbd` engine): the ceiling of any NBD server here
//!   (`--no-nbdkit` skips it);
//! - the disk: fio `io_uring`, `direct=1`, on a file of min(`--size`, 4 GiB) in the
//!   cluster's data directory (`--dir` when it exists, else the system temp directory),
//!   written sequentially first like the prefill and removed afterwards (`--no-disk`
//!   skips it);
//! - with `--ceph`, a real Ceph 16 started by `shared/baselines/ceph/up.sh` ([`ceph`]):
//!   RBD replicated x3 (`rbd/rep`), or RBD on an EC 2+1 data pool (`ecmeta/ec`) when the
//!   Spindle image's pool is erasure-coded, images of `--size`, prefilled the same way and
//!   measured with fio's `rbd` engine and the same job parameters, then stopped with
//!   `down.sh` (also on errors and Ctrl-C).
//!
//! Without `--ceph` the rows carry Ceph's published figures (embedded below), measured on
//! another machine kind: the report labels them so (`ceph_same_sitting: false`), and the
//! targets against Ceph are not evaluated, as those ratios mean nothing.
//!
//! Order: the Spindle matrix, then nbdkit, then the disk, then Ceph (up, prefill, matrix,
//! down). Ceph comes last so that its daemons (1.5 GiB memory target per OSD, background
//! work) are not running while Spindle is measured; the Spindle cluster stays up but
//! idle while the others run.
//!
//! CPU per I/O: around every fio invocation (one matrix point) the bench samples the
//! user + system time of each server process (`/proc/PID/stat`: `spindle nbd`, the
//! monitor and storage daemons of the cluster; for Ceph its monitor, manager and OSDs
//! from `$CEPH_DIR/pids`; for nbdkit the nbdkit process) and of the bench's reaped
//! children (`getrusage(RUSAGE_CHILDREN)`: fio and its job process, with librbd's threads
//! for the `rbd` engine). The window is the whole fio invocation: setup (for rbd: connect
//! and open the image), ramp, measured runtime, teardown. fio does not count the I/Os of
//! its ramp, so the window's I/Os are estimated as fio's measured I/Os + IOPS x ramp
//! seconds. Setup and teardown are charged to the I/Os, which overstates the figure by
//! their CPU divided by the I/Os (small when a point does thousands of I/Os). Server is
//! the sum over the server processes, client is fio's.
//!
//! The bench creates (or reuses) an image on the cluster named by `--dir`/`--mon`,
//! prefills it like `baselines/fio/prefill.fio`, starts its own `spindle nbd` and
//! `nbdkit memory` children on free ports, and stops them when done.

pub(crate) mod ceph;
mod published;
mod targets;
mod wlog;

use crate::common::BenchResult;
use crate::proc_cpu;
use anyhow::{bail, Context};
use ceph::{CephCluster, CephScripts};
use clap::Args;
use published::published_ceph;
use serde::Serialize;
use spindle_cluster::runtime;
use spindle_cluster::Target;
use spindle_image::image::OBJECT_SIZE_BYTES_DEFAULT;
use spindle_image::{Image, ImageError};
use spindle_map::{ClusterMap, PoolKind};
use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use targets::{targets, Bound, TargetCheck, TargetContext};

const BLOCK_SIZES: [&str; 4] = ["4k", "64k", "128k", "512k"];
const PATTERNS: [&str; 4] = ["read", "write", "randread", "randwrite"];
const DEPTHS: [u32; 2] = [1, 16];
/// `--quick`: the points behind the headline targets.
const QUICK: [(&str, &str, u32); 6] = [
    ("4k", "randwrite", 16),
    ("4k", "randread", 16),
    ("4k", "randwrite", 1),
    ("4k", "randread", 1),
    ("512k", "write", 16),
    ("512k", "read", 16),
];
const CEPH_NAME: &str = "Ceph 16 RBD replicated x3";
const CEPH_EC_NAME: &str = "Ceph 16 RBD EC 2+1";
/// The disk file is at most this large (bounds the time and space to write it; `direct=1`
/// keeps the page cache out at any size).
const DISK_FILE_BYTES_MAX: u64 = 4 << 30;
/// How the CPU-per-I/O window is taken (copied into the JSON report).
const CPU_WINDOW: &str = "user+system time over the whole fio invocation (setup, ramp, \
    runtime, teardown) / (fio's measured I/Os + IOPS x ramp seconds); server: /proc/PID/stat \
    of the server processes, client: getrusage(RUSAGE_CHILDREN) of fio";

/// The Ceph anchor's name for an image on a replicated or an erasure-coded pool.
fn ceph_name(erasure: bool) -> &'static str {
    if erasure {
        CEPH_EC_NAME
    } else {
        CEPH_NAME
    }
}

/// What the Ceph figures of the report are: measured now, or the embedded tables.
fn ceph_anchor_label(erasure: bool, same_sitting: bool) -> String {
    let name = ceph_name(erasure);
    if same_sitting {
        format!("{name}, measured in this run")
    } else {
        format!(
            "{name}: published figures from another machine kind (not a same-sitting ratio; \
             shared/baselines/ceph.md)"
        )
    }
}

/// Arguments of `spindle bench fio`.
#[derive(Args)]
pub struct BenchFioArgs {
    /// Seconds measured per matrix point.
    #[arg(long, default_value_t = 5)]
    pub runtime_seconds: u64,
    /// Seconds of warm-up (not measured) before each point.
    #[arg(long, default_value_t = 1)]
    pub ramp_seconds: u64,
    /// Only 4k randwrite/randread QD16 and QD1, and 512k write/read QD16.
    #[arg(long)]
    pub quick: bool,
    /// Pool of the benchmark image.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Benchmark image (created if missing, grown if smaller than --size; kept afterwards).
    #[arg(long, default_value = "fio-bench")]
    pub image: String,
    /// Size of the benchmark image, of the nbdkit memory disk and of the Ceph images.
    #[arg(long, value_parser = spindle_cluster::parse_size_bytes, default_value = "4G")]
    pub size: u64,
    /// Object size of the benchmark image when it is created (default: the pool's, as
    /// `spindle image create`: 4 MiB, or 256 KiB on an erasure-coded pool).
    #[arg(long, value_parser = spindle_cluster::parse_size_bytes)]
    pub object_size: Option<u64>,
    /// Skip the sequential prefill (reads then hit never-written, all-zero ranges).
    #[arg(long)]
    pub no_prefill: bool,
    /// Skip the nbdkit memory comparison.
    #[arg(long)]
    pub no_nbdkit: bool,
    /// Skip the disk comparison (fio io_uring, O_DIRECT, on a file in the data directory).
    #[arg(long)]
    pub no_disk: bool,
    /// Start a real Ceph 16 with shared/baselines/ceph/up.sh after the other runs, measure
    /// its RBD image matching the pool kind with fio's rbd engine, stop it with down.sh.
    #[arg(long)]
    pub ceph: bool,
    /// Directory of up.sh and down.sh (default: $SPINDLE_SHARED_DIR/baselines/ceph, else
    /// ../shared/baselines/ceph).
    #[arg(long)]
    pub ceph_scripts: Option<PathBuf>,
    /// Data directory of the Ceph cluster (down.sh removes it; it must be under /tmp or
    /// /var/tmp for that).
    #[arg(long, env = "CEPH_DIR", default_value = "/var/tmp/cephanchor")]
    pub ceph_dir: PathBuf,
    /// Start `spindle nbd` with `--no-coalesce` (no hold/merge of adjacent requests).
    #[arg(long)]
    pub no_coalesce: bool,
    /// Start `spindle nbd` with `--no-readahead` (no fetching ahead of sequential readers).
    #[arg(long)]
    pub no_readahead: bool,
    /// The client write log's report instead of the matrix: `spindle nbd` with and
    /// without `--write-log` (logs in a temporary directory under DIR, removed afterwards)
    /// on 4k randwrite QD16 (burst and sustained), 4k randwrite QD1, 512k write QD16 and
    /// FLUSH latency, beside nbdkit memory and a local 4k write + fdatasync in DIR.
    #[arg(long, value_name = "DIR")]
    pub write_log: Option<PathBuf>,
    /// `--write-log-size` of that log.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub write_log_size: String,
    /// With `--write-log`: seconds of each burst point (measured from an empty log).
    #[arg(long, default_value_t = 10)]
    pub burst_seconds: u64,
    /// With `--write-log`: seconds of the sustained 4k randwrite QD16 run (long enough for
    /// the log to wrap several times).
    #[arg(long, default_value_t = 120)]
    pub sustained_seconds: u64,
    /// With `--write-log`: also measure offloading (LineFS): a CPU-bound co-runner on the
    /// application CPUs beside a rate-limited 4k randwrite stream, write-through against
    /// the log with `spindle agent` on these CPUs (the cluster's daemons run there too).
    #[arg(long, value_name = "LIST")]
    pub agent_cpus: Option<String>,
    /// With `--agent-cpus`: the application CPUs (`spindle nbd`, fio and the co-runner).
    #[arg(long, value_name = "LIST", default_value = "0")]
    pub app_cpus: String,
    /// With `--agent-cpus`: the 4k randwrite stream's rate (both sides sustain it).
    #[arg(long, default_value_t = 2000)]
    pub stream_iops: u64,

    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// One matrix point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub bs: String,
    pub rw: String,
    pub iodepth: u32,
}

impl Point {
    pub(crate) fn label(&self) -> String {
        format!("{} {} QD{}", self.bs, self.rw, self.iodepth)
    }

    fn is(&self, bs: &str, rw: &str, iodepth: u32) -> bool {
        self.bs == bs && self.rw == rw && self.iodepth == iodepth
    }
}

/// What fio measured at one point.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figures {
    pub iops: f64,
    pub mb_per_s: f64,
    pub clat_mean_us: f64,
    pub clat_p99_us: f64,
}

/// CPU time per I/O of one system at one point (see the module docs for the window).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuPerIo {
    /// Server processes (Spindle: `spindle nbd` + monitor + storage daemons; Ceph:
    /// monitor + manager + OSDs; nbdkit: nbdkit).
    pub server_us_per_io: f64,
    /// fio (with librbd for Ceph).
    pub client_us_per_io: f64,
}

impl CpuPerIo {
    fn total_us_per_io(&self) -> f64 {
        self.server_us_per_io + self.client_us_per_io
    }
}

/// I/Os of a whole fio invocation: fio counts none during the ramp, so the ramp is
/// assumed to run at the measured rate.
fn ios_in_window(measured_ios: u64, iops: f64, ramp_seconds: u64) -> f64 {
    measured_ios as f64 + iops.max(0.0) * ramp_seconds as f64
}

/// CPU microseconds of a window divided by its I/Os (None without I/Os).
fn cpu_per_io(server_cpu_us: u64, client_cpu_us: u64, ios: f64) -> Option<CpuPerIo> {
    (ios.is_finite() && ios > 0.0).then(|| CpuPerIo {
        server_us_per_io: server_cpu_us as f64 / ios,
        client_us_per_io: client_cpu_us as f64 / ios,
    })
}

/// One point measured on one system.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Measured {
    pub(crate) figures: Figures,
    cpu: Option<CpuPerIo>,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub point: Point,
    pub spindle: Figures,
    pub spindle_cpu: Option<CpuPerIo>,
    pub nbdkit_memory: Option<Figures>,
    pub nbdkit_cpu: Option<CpuPerIo>,
    /// fio io_uring, O_DIRECT, on a file of the data directory's file system.
    pub disk: Option<Figures>,
    /// Measured in this run with `--ceph`, else the published figures (see `ceph_anchor`).
    pub ceph: Option<Figures>,
    /// Only when Ceph was measured in this run.
    pub ceph_cpu: Option<CpuPerIo>,
    /// Spindle / Ceph (IOPS).
    pub iops_vs_ceph: Option<f64>,
    /// Spindle / Ceph (MB/s).
    pub mbs_vs_ceph: Option<f64>,
    /// Ceph / Spindle (mean completion latency): above 1 = Spindle is faster.
    pub latency_vs_ceph: Option<f64>,
    /// Ceph / Spindle (CPU µs per I/O, server + client): above 1 = Spindle uses less.
    pub cpu_vs_ceph: Option<f64>,
    /// Spindle / nbdkit memory (IOPS).
    pub iops_vs_nbdkit: Option<f64>,
    /// Spindle / disk (MB/s).
    pub mbs_vs_disk: Option<f64>,
}

impl Row {
    fn new(
        point: Point,
        spindle: Measured,
        nbdkit: Option<Measured>,
        disk: Option<Figures>,
        ceph: Option<Measured>,
    ) -> Row {
        let s = spindle.figures;
        let n = nbdkit.map(|m| m.figures);
        let c = ceph.map(|m| m.figures);
        let ceph_cpu = ceph.and_then(|m| m.cpu);
        Row {
            point,
            spindle: s,
            spindle_cpu: spindle.cpu,
            nbdkit_memory: n,
            nbdkit_cpu: nbdkit.and_then(|m| m.cpu),
            disk,
            ceph: c,
            ceph_cpu,
            iops_vs_ceph: c.and_then(|c| ratio(s.iops, c.iops)),
            mbs_vs_ceph: c.and_then(|c| ratio(s.mb_per_s, c.mb_per_s)),
            latency_vs_ceph: c.and_then(|c| ratio(c.clat_mean_us, s.clat_mean_us)),
            cpu_vs_ceph: ceph_cpu
                .zip(spindle.cpu)
                .and_then(|(c, s)| ratio(c.total_us_per_io(), s.total_us_per_io())),
            iops_vs_nbdkit: n.and_then(|n| ratio(s.iops, n.iops)),
            mbs_vs_disk: disk.and_then(|d| ratio(s.mb_per_s, d.mb_per_s)),
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    bench: &'static str,
    /// The Ceph figures the rows are compared with.
    ceph_anchor: String,
    /// True when Ceph ran in this sitting (`--ceph`); false: published figures from
    /// another machine kind, whose ratios are not valid comparisons.
    ceph_same_sitting: bool,
    image_bytes: u64,
    runtime_seconds: u64,
    ramp_seconds: u64,
    /// The file the disk was measured on (removed afterwards), if it was.
    disk_file: Option<String>,
    disk_file_bytes: Option<u64>,
    /// How CPU per I/O is computed.
    cpu_window: &'static str,
    /// The processes whose CPU is Spindle's server side (`name pid`).
    spindle_server_processes: Vec<String>,
    /// Ceph's server processes, when it ran.
    ceph_server_processes: Vec<String>,
    rows: &'a [Row],
    targets: &'a [TargetCheck],
    results: &'a [BenchResult],
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

/// Set by SIGINT/SIGTERM: the bench stops after the current fio run (whose children got
/// the same Ctrl-C) and its guards stop the servers and Ceph.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn note_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                signal,
                note_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

fn check_interrupted() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A process whose CPU time is sampled.
#[derive(Debug, Clone)]
pub(crate) struct Proc {
    name: String,
    pid: u32,
}

impl Proc {
    fn describe(procs: &[Proc]) -> Vec<String> {
        procs
            .iter()
            .map(|p| format!("{} {}", p.name, p.pid))
            .collect()
    }
}

/// Sum of the CPU time of `procs`, in µs (None, with a warning, if one is gone).
fn cpu_sum_us(procs: &[Proc]) -> Option<u64> {
    let mut sum = 0;
    for p in procs {
        match proc_cpu::process_cpu_us(p.pid) {
            Ok(us) => sum += us,
            Err(e) => {
                eprintln!(
                    "bench fio: no CPU figure: {} (pid {}): {e:#}",
                    p.name, p.pid
                );
                return None;
            }
        }
    }
    Some(sum)
}

/// A child process that is stopped (SIGTERM, then SIGKILL after 15 s) when dropped.
pub(crate) struct ChildGuard {
    child: Child,
    what: String,
}

impl ChildGuard {
    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Spawns `cmd` (stdout discarded, stderr to the log file `log_name`), named `what` in
    /// messages.
    pub(crate) fn start(
        mut cmd: Command,
        what: &str,
        log_name: &str,
    ) -> anyhow::Result<ChildGuard> {
        let (log_path, log) = log_file(log_name)?;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        Ok(ChildGuard {
            child,
            what: format!("{what} (log {})", log_path.display()),
        })
    }

    pub(crate) fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) of a child this process started and has not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("bench fio: {} ignored SIGTERM; killing it", self.what);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until `addr` accepts TCP connections (or the child exits / 60 s pass).
    fn wait_listening(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}) before listening on {addr}", self.what);
            }
            if Instant::now() > deadline {
                bail!("{} is not listening on {addr} after 60 s", self.what);
            }
            check_interrupted()?;
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn proc(&self, name: &str) -> Proc {
        Proc {
            name: name.into(),
            pid: self.child.id(),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The file the disk is measured on; removed when dropped.
struct DiskFile {
    path: PathBuf,
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("bench fio: cannot remove {}: {e}", self.path.display());
            }
        }
    }
}

/// Where the disk file goes: the cluster's data directory when it exists, else the
/// system temp directory.
fn disk_dir(target: &Target) -> PathBuf {
    if target.dir.is_dir() {
        target.dir.clone()
    } else {
        std::env::temp_dir()
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr()?)
}

fn log_file(name: &str) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let path = std::env::temp_dir().join(format!("spindle-bench-fio-{name}.log"));
    let f = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    Ok((path, f))
}

pub(crate) fn require_tool(tool: &str) -> anyhow::Result<()> {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        bail!("`{tool}` is not installed (scripts/setup.sh installs fio and nbdkit)");
    }
    Ok(())
}

/// How fio reaches one system under test: the engine options, fio's environment and
/// the bytes to use.
pub(crate) struct Engine {
    /// `--ioengine=...` and the options naming the target.
    args: Vec<String>,
    /// Environment of fio (`CEPH_CONF` for the rbd engine).
    env: Vec<(String, OsString)>,
    /// Bytes of a file target; None: the whole device (`--size=100%` for the prefill).
    size_bytes: Option<u64>,
}

impl Engine {
    pub(crate) fn nbd(uri: &str) -> Engine {
        Engine {
            args: vec!["--ioengine=nbd".into(), format!("--uri={uri}")],
            env: Vec::new(),
            size_bytes: None,
        }
    }

    fn rbd(conf: &Path, pool: &str, image: &str) -> Engine {
        Engine {
            args: vec![
                "--ioengine=rbd".into(),
                "--clientname=admin".into(),
                format!("--pool={pool}"),
                format!("--rbdname={image}"),
            ],
            env: vec![("CEPH_CONF".into(), conf.as_os_str().to_owned())],
            size_bytes: None,
        }
    }

    fn file(path: &Path, size_bytes: u64) -> Engine {
        Engine {
            args: vec![
                "--ioengine=io_uring".into(),
                format!("--filename={}", path.display()),
            ],
            env: Vec::new(),
            size_bytes: Some(size_bytes),
        }
    }

    /// `--ioengine=...` and the options naming the target.
    pub(crate) fn engine_args(&self) -> &[String] {
        &self.args
    }

    fn size_arg(&self) -> String {
        match self.size_bytes {
            Some(bytes) => format!("--size={bytes}"),
            None => "--size=100%".into(),
        }
    }
}

/// Runs fio with `args` (plus the JSON output flag) and returns its parsed report.
pub(crate) fn fio_json(
    args: &[String],
    env: &[(String, OsString)],
) -> anyhow::Result<serde_json::Value> {
    let out = Command::new("fio")
        .args(args)
        .arg("--output-format=json")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .context("cannot run fio")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "fio {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    check_interrupted()?;
    // fio may print notes before the JSON document.
    let start = stdout.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&stdout[start..]).context("cannot parse fio's JSON output")
}

/// Writes the whole target once, sequentially (`baselines/fio/prefill.fio`).
pub(crate) fn prefill(engine: &Engine) -> anyhow::Result<()> {
    let mut args: Vec<String> = vec!["--name=prefill".into()];
    args.extend(engine.args.iter().cloned());
    args.extend(
        [
            "--bs=4m",
            "--rw=write",
            "--iodepth=16",
            "--numjobs=1",
            "--direct=1",
            "--time_based=0",
            "--group_reporting=1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.push(engine.size_arg());
    fio_json(&args, &engine.env).map(|_| ())
}

/// The figures of one point from fio's JSON report, and the I/Os it counted.
pub(crate) fn parse_figures(v: &serde_json::Value, p: &Point) -> anyhow::Result<(Figures, u64)> {
    let dir = if p.rw.contains("read") {
        "read"
    } else {
        "write"
    };
    let j = &v["jobs"][0][dir];
    let num = |x: &serde_json::Value| x.as_f64().unwrap_or(f64::NAN);
    let figures = Figures {
        iops: num(&j["iops"]),
        mb_per_s: num(&j["bw_bytes"]) / 1e6,
        clat_mean_us: num(&j["clat_ns"]["mean"]) / 1e3,
        clat_p99_us: num(&j["clat_ns"]["percentile"]["99.000000"]) / 1e3,
    };
    let ios = j["total_ios"].as_u64().unwrap_or(0);
    if ios == 0 || !figures.iops.is_finite() {
        bail!("fio reported no {dir} I/O for {}: {v}", p.label());
    }
    let errors = v["jobs"][0]["error"].as_i64().unwrap_or(0);
    if errors != 0 {
        bail!("fio reported error {errors} for {}", p.label());
    }
    Ok((figures, ios))
}

/// Seconds per point.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) runtime_seconds: u64,
    pub(crate) ramp_seconds: u64,
}

/// Measures one point with `engine`, and the CPU per I/O of `servers` and fio when
/// `servers` is given (see the module docs for the window).
pub(crate) fn measure(
    engine: &Engine,
    p: &Point,
    timing: Timing,
    servers: Option<&[Proc]>,
) -> anyhow::Result<Measured> {
    let mut args: Vec<String> = vec!["--name=bench".into()];
    args.extend(engine.args.iter().cloned());
    if engine.size_bytes.is_some() {
        args.push(engine.size_arg());
    }
    args.extend([
        format!("--bs={}", p.bs),
        format!("--rw={}", p.rw),
        format!("--iodepth={}", p.iodepth),
        "--numjobs=1".into(),
        "--direct=1".into(),
        "--time_based=1".into(),
        format!("--runtime={}", timing.runtime_seconds),
        format!("--ramp_time={}", timing.ramp_seconds),
        "--norandommap=1".into(),
        "--randrepeat=0".into(),
        "--group_reporting=1".into(),
        "--percentile_list=50:90:99:99.9:99.99".into(),
    ]);
    let server_before_us = servers.and_then(cpu_sum_us);
    let client_before_us = proc_cpu::reaped_children_cpu_us()?;
    let v = fio_json(&args, &engine.env)?;
    let client_after_us = proc_cpu::reaped_children_cpu_us()?;
    let server_after_us = servers.and_then(cpu_sum_us);
    let (figures, ios) = parse_figures(&v, p)?;
    let cpu = server_before_us
        .zip(server_after_us)
        .and_then(|(before, after)| {
            cpu_per_io(
                after.saturating_sub(before),
                client_after_us.saturating_sub(client_before_us),
                ios_in_window(ios, figures.iops, timing.ramp_seconds),
            )
        });
    Ok(Measured { figures, cpu })
}

/// The image's pool: erasure-coded or not, and the bytes written to disks per byte
/// written to the image (copies, or (k+m)/k).
#[derive(Debug, Clone, Copy)]
struct PoolShape {
    erasure: bool,
    write_amplification: f64,
}

fn pool_shape(kind: &PoolKind) -> PoolShape {
    match *kind {
        PoolKind::Replicated { size, .. } => PoolShape {
            erasure: false,
            write_amplification: f64::from(size.max(1)),
        },
        PoolKind::Erasure { k, m, .. } => PoolShape {
            erasure: true,
            write_amplification: f64::from(k + m) / f64::from(k.max(1)),
        },
    }
}

/// The cluster's processes running here: the monitor (`DIR/mon/pid`) and the storage
/// daemons (the pids the map reports and `DIR/osd.N/pid`), those alive and running
/// spindle.
fn cluster_processes(map: &ClusterMap, dir: &Path) -> Vec<Proc> {
    let mut found: Vec<Proc> = Vec::new();
    let mut add = |name: String, pid: u32| {
        let is_spindle = proc_cpu::cmdline(pid).is_some_and(|c| c.contains("spindle"));
        if pid > 0 && is_spindle && !found.iter().any(|p| p.pid == pid) {
            found.push(Proc { name, pid });
        }
    };
    if let Some(pid) = spindle_cluster::read_pid(&dir.join("mon")) {
        add("mon".into(), pid);
    }
    for osd in map.osds.values().filter(|o| o.up) {
        add(format!("osd.{}", osd.id), osd.pid);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("osd."))
            .collect();
        names.sort();
        for name in names {
            if let Some(pid) = spindle_cluster::read_pid(&dir.join(&name)) {
                add(name, pid);
            }
        }
    }
    found
}

/// Creates the benchmark image (or reuses it, growing it to `size` if smaller); returns
/// its pool's shape (on an erasure-coded pool the Ceph anchor is Ceph's EC 2+1 image)
/// and the cluster's processes.
async fn ensure_image(args: &BenchFioArgs) -> anyhow::Result<(PoolShape, Vec<Proc>)> {
    let client = Arc::new(args.target.client().await?);
    let map = client.map();
    let Some(pool) = map.pool_by_name(&args.pool) else {
        bail!("no pool '{}' (see `spindle pool ls`)", args.pool);
    };
    let shape = pool_shape(&pool.kind);
    let procs = cluster_processes(&map, &args.target.dir);
    match Image::create(
        client.clone(),
        &args.pool,
        &args.image,
        args.size,
        args.object_size
            .or_else(|| spindle_image::image::default_object_size(&map, &args.pool))
            .unwrap_or(OBJECT_SIZE_BYTES_DEFAULT),
    )
    .await
    {
        Ok(_) => Ok((shape, procs)),
        Err(ImageError::Exists(_)) => {
            let img = Image::open(client, &args.pool, &args.image).await?;
            if img.size_bytes() < args.size {
                img.resize(args.size).await?;
            }
            Ok((shape, procs))
        }
        Err(e) => Err(e.into()),
    }
}

fn points(quick: bool) -> Vec<Point> {
    let mk = |bs: &str, rw: &str, iodepth: u32| Point {
        bs: bs.into(),
        rw: rw.into(),
        iodepth,
    };
    if quick {
        return QUICK.iter().map(|&(b, r, q)| mk(b, r, q)).collect();
    }
    let mut v = Vec::new();
    for qd in DEPTHS {
        for bs in BLOCK_SIZES {
            for rw in PATTERNS {
                v.push(mk(bs, rw, qd));
            }
        }
    }
    v
}

/// Runs every point against one engine.
fn run_matrix(
    who: &str,
    engine: &Engine,
    pts: &[Point],
    args: &BenchFioArgs,
    servers: Option<&[Proc]>,
) -> anyhow::Result<Vec<Measured>> {
    let timing = Timing {
        runtime_seconds: args.runtime_seconds,
        ramp_seconds: args.ramp_seconds,
    };
    let mut out = Vec::with_capacity(pts.len());
    for p in pts {
        check_interrupted()?;
        if !args.json {
            eprintln!("bench fio: {who}: {}", p.label());
        }
        out.push(
            measure(engine, p, timing, servers).with_context(|| format!("{who}: {}", p.label()))?,
        );
    }
    Ok(out)
}

fn opt(x: Option<f64>, prec: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.prec$}"),
        _ => "-".into(),
    }
}

/// A group title over `width` columns of the table.
fn group(title: &str, width: usize) -> String {
    let title: String = title.chars().take(width).collect();
    format!("{title:<width$}")
}

/// What the disk anchor was, for the table's notes.
struct DiskNote {
    path: PathBuf,
    size_bytes: u64,
}

fn print_table(
    rows: &[Row],
    targets: &[TargetCheck],
    ceph_anchor: &str,
    erasure: bool,
    ceph_same_sitting: bool,
    disk: Option<&DiskNote>,
) {
    let ceph_group = match (erasure, ceph_same_sitting) {
        (true, true) => "Ceph EC 2+1, this run",
        (false, true) => "Ceph rep3, this run",
        (true, false) => "Ceph EC 2+1, PUBLISHED (*)",
        (false, false) => "Ceph rep3, PUBLISHED (*)",
    };
    if !ceph_same_sitting {
        println!("(*) {ceph_anchor}");
    }
    println!(
        "{:<18} | {} | {} | {} | {} | {}",
        "",
        group("Spindle", 35),
        group("nbdkit memory", 16),
        group("disk (io_uring)", 25),
        group(ceph_group, 31),
        group("ratios", 27),
    );
    println!(
        "{:<18} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>7} | {:>8} {:>8} {:>7} | {:>7} {:>7} {:>7} {:>7} | {:>6} {:>6} {:>6} {:>6}",
        "point", "IOPS", "MB/s", "clat µs", "p99 µs", "IOPS", "clat", "IOPS", "MB/s", "clat", "IOPS", "MB/s", "clat", "p99", "S/Ceph", "Ceph/S", "S/nbdk", "S/disk"
    );
    println!(
        "{:<18} | {:35} | {:16} | {:25} | {:31} | {:>6} {:>6} {:>6} {:>6}",
        "", "", "", "", "", "IOPS", "lat", "IOPS", "MB/s"
    );
    for r in rows {
        let s = &r.spindle;
        let n = r.nbdkit_memory;
        let d = r.disk;
        let c = r.ceph;
        println!(
            "{:<18} | {:>8.0} {:>8.1} {:>8.1} {:>8.1} | {:>8} {:>7} | {:>8} {:>8} {:>7} | {:>7} {:>7} {:>7} {:>7} | {:>6} {:>6} {:>6} {:>6}",
            r.point.label(),
            s.iops,
            s.mb_per_s,
            s.clat_mean_us,
            s.clat_p99_us,
            opt(n.map(|f| f.iops), 0),
            opt(n.map(|f| f.clat_mean_us), 0),
            opt(d.map(|f| f.iops), 0),
            opt(d.map(|f| f.mb_per_s), 1),
            opt(d.map(|f| f.clat_mean_us), 0),
            opt(c.map(|f| f.iops), 0),
            opt(c.map(|f| f.mb_per_s), 1),
            opt(c.map(|f| f.clat_mean_us), 0),
            opt(c.map(|f| f.clat_p99_us), 0),
            opt(r.iops_vs_ceph, 2),
            opt(r.latency_vs_ceph, 2),
            opt(r.iops_vs_nbdkit, 2),
            opt(r.mbs_vs_disk, 2),
        );
    }
    println!("(Ceph: {ceph_anchor}; clat = mean completion latency, µs)");
    if let Some(d) = disk {
        println!(
            "(disk: fio io_uring, direct=1, on a {} MiB file, {}, removed afterwards)",
            d.size_bytes >> 20,
            d.path.display()
        );
    }
    if rows
        .iter()
        .any(|r| r.spindle_cpu.is_some() || r.ceph_cpu.is_some())
    {
        println!();
        println!("CPU µs per I/O (server: spindle nbd + monitor + daemons / Ceph mon + mgr + OSDs / nbdkit; client: fio, with librbd for Ceph;");
        println!(" whole fio invocation incl. setup and ramp / (measured I/Os + IOPS x ramp))");
        println!(
            "{:<18} | {} | {} | {} | {:>6}",
            "",
            group("Spindle", 26),
            group("nbdkit memory", 17),
            group(ceph_group, 26),
            "Ceph/S"
        );
        println!(
            "{:<18} | {:>8} {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>6}",
            "point",
            "server",
            "client",
            "total",
            "server",
            "client",
            "server",
            "client",
            "total",
            "total"
        );
        for r in rows {
            let s = r.spindle_cpu;
            let n = r.nbdkit_cpu;
            let c = r.ceph_cpu;
            println!(
                "{:<18} | {:>8} {:>8} {:>8} | {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>6}",
                r.point.label(),
                opt(s.map(|x| x.server_us_per_io), 1),
                opt(s.map(|x| x.client_us_per_io), 1),
                opt(s.map(|x| x.total_us_per_io()), 1),
                opt(n.map(|x| x.server_us_per_io), 1),
                opt(n.map(|x| x.client_us_per_io), 1),
                opt(c.map(|x| x.server_us_per_io), 1),
                opt(c.map(|x| x.client_us_per_io), 1),
                opt(c.map(|x| x.total_us_per_io()), 1),
                opt(r.cpu_vs_ceph, 2),
            );
        }
    }
    println!("targets:");
    for t in targets {
        let need = match t.bound {
            Bound::AtLeast => ">=",
            Bound::AtMost => "<=",
        };
        println!(
            "  {:<49} {:>8.2}  (need {need} {:.2})  {}",
            t.name,
            t.value,
            t.required,
            if t.met { "met" } else { "NOT met" }
        );
    }
    if !ceph_same_sitting {
        println!("  (targets against Ceph need --ceph: the embedded figures are from another machine kind)");
    }
}

/// Starts `spindle nbd` for the image and returns it with its URI.
fn start_spindle_nbd(args: &BenchFioArgs) -> anyhow::Result<(ChildGuard, String)> {
    let mut flags = Vec::new();
    if args.no_coalesce {
        flags.push("--no-coalesce");
    }
    if args.no_readahead {
        flags.push("--no-readahead");
    }
    spindle_nbd_child(&args.target, &args.pool, &args.image, &flags, "nbd")
}

/// Starts a `spindle nbd` child (this executable) on a free port for the cluster of
/// `target`, serving `pool`, with extra `flags`; waits until it listens and returns it
/// with the URI of `image`. Its log is `log_name` in the temp directory.
pub(crate) fn spindle_nbd_child(
    target: &Target,
    pool: &str,
    image: &str,
    flags: &[&str],
    log_name: &str,
) -> anyhow::Result<(ChildGuard, String)> {
    let addr = free_port()?;
    let exe = std::env::current_exe().context("cannot find the spindle binary")?;
    let mut cmd = Command::new(&exe);
    cmd.arg("nbd")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--pool")
        .arg(pool)
        .arg("--dir")
        .arg(&target.dir)
        .args(flags);
    if let Some(mon) = &target.mon {
        cmd.arg("--mon").arg(mon);
    }
    let mut nbd = ChildGuard::start(cmd, "spindle nbd", log_name)?;
    nbd.wait_listening(addr)?;
    Ok((nbd, format!("nbd://{addr}/{image}")))
}

/// Starts `nbdkit memory` of `size_bytes` on a free port; returns it and its address.
fn start_nbdkit(size_bytes: u64) -> anyhow::Result<(ChildGuard, SocketAddr)> {
    let addr = free_port()?;
    let mut cmd = Command::new("nbdkit");
    cmd.args([
        "--foreground",
        "--exit-with-parent",
        "--ipaddr",
        "127.0.0.1",
    ])
    .arg("--port")
    .arg(addr.port().to_string())
    .arg("memory")
    .arg(size_bytes.to_string());
    let mut kit = ChildGuard::start(cmd, "nbdkit memory", "nbdkit")?;
    kit.wait_listening(addr)?;
    Ok((kit, addr))
}

/// nbdkit memory, the NBD ceiling.
fn run_nbdkit(args: &BenchFioArgs, pts: &[Point]) -> anyhow::Result<Vec<Measured>> {
    let (mut kit, addr) = start_nbdkit(args.size)?;
    let engine = Engine::nbd(&format!("nbd://{addr}"));
    if !args.no_prefill {
        prefill(&engine).context("prefill of nbdkit memory")?;
    }
    let servers = [kit.proc("nbdkit")];
    let figures = run_matrix("nbdkit memory", &engine, pts, args, Some(&servers))?;
    kit.stop();
    Ok(figures)
}

/// The disk: fio io_uring, O_DIRECT, on a file written sequentially first (always, the
/// reads need real extents), removed afterwards.
fn run_disk(args: &BenchFioArgs, pts: &[Point], note: &DiskNote) -> anyhow::Result<Vec<Measured>> {
    let file = DiskFile {
        path: note.path.clone(),
    };
    let engine = Engine::file(&file.path, note.size_bytes);
    if !args.json {
        eprintln!(
            "bench fio: writing the disk file {} ({} MiB)",
            file.path.display(),
            note.size_bytes >> 20
        );
    }
    prefill(&engine).with_context(|| format!("writing {}", file.path.display()))?;
    run_matrix("disk", &engine, pts, args, None)
}

/// Ceph 16 in this sitting: up.sh, prefill, the matrix with the rbd engine, down.sh
/// (also when anything fails: the guard). Returns the figures and the daemons sampled.
fn run_ceph(
    scripts: &CephScripts,
    args: &BenchFioArgs,
    erasure: bool,
    pts: &[Point],
) -> anyhow::Result<(Vec<Measured>, Vec<Proc>)> {
    if !args.json {
        eprintln!(
            "bench fio: starting Ceph 16 in {} with up.sh (about a minute; log {})",
            args.ceph_dir.display(),
            ceph::log_path().display()
        );
    }
    let mut cluster = CephCluster::start(scripts, &args.ceph_dir, args.size)?;
    check_interrupted()?;
    let daemons: Vec<Proc> = cluster
        .daemons()?
        .into_iter()
        .map(|(name, pid)| Proc { name, pid })
        .collect();
    let (pool, image) = ceph::rbd_image(erasure);
    let engine = Engine::rbd(&cluster.conf(), pool, image);
    if !args.no_prefill {
        if !args.json {
            eprintln!("bench fio: prefilling Ceph {pool}/{image}");
        }
        prefill(&engine).with_context(|| format!("prefill of Ceph {pool}/{image}"))?;
    }
    let figures = run_matrix(ceph_name(erasure), &engine, pts, args, Some(&daemons))?;
    if !args.json {
        eprintln!("bench fio: stopping Ceph (down.sh)");
    }
    cluster
        .stop()
        .with_context(|| format!("log {}", cluster.log_path().display()))?;
    Ok((figures, daemons))
}

/// `spindle bench fio`.
pub fn run(args: BenchFioArgs) -> anyhow::Result<()> {
    require_tool("fio")?;
    if !args.no_nbdkit {
        require_tool("nbdkit")?;
    }
    if args.runtime_seconds == 0 {
        bail!("--runtime-seconds must be > 0");
    }
    if args.write_log.is_some() {
        return wlog::run(&args);
    }
    // Everything --ceph needs is checked before the long Spindle run.
    let ceph_scripts = if args.ceph {
        let shared = std::env::var_os("SPINDLE_SHARED_DIR").map(PathBuf::from);
        let dir = ceph::scripts_dir(args.ceph_scripts.as_deref(), shared.as_deref());
        let scripts = CephScripts::find(&dir)?;
        ceph::check_free(&args.ceph_dir)?;
        Some(scripts)
    } else {
        None
    };
    catch_interrupts();
    let (shape, cluster_procs) = runtime()?.block_on(ensure_image(&args))?;
    let erasure = shape.erasure;
    let pts = points(args.quick);

    // Spindle over its own `spindle nbd`.
    let (mut nbd, uri) = start_spindle_nbd(&args)?;
    let mut spindle_servers = vec![nbd.proc("spindle nbd")];
    spindle_servers.extend(cluster_procs);
    if spindle_servers.len() == 1 {
        eprintln!(
            "bench fio: no monitor or daemon process of the cluster found in {}: the server \
             CPU is that of spindle nbd alone",
            args.target.dir.display()
        );
    }
    let engine = Engine::nbd(&uri);
    if !args.no_prefill {
        if !args.json {
            eprintln!("bench fio: prefilling {uri}");
        }
        prefill(&engine).context("prefill of the Spindle image")?;
    }
    let spindle = run_matrix("spindle", &engine, &pts, &args, Some(&spindle_servers))?;
    nbd.stop();

    let nbdkit = if args.no_nbdkit {
        None
    } else {
        Some(run_nbdkit(&args, &pts)?)
    };

    let disk_note = (!args.no_disk).then(|| DiskNote {
        path: disk_dir(&args.target)
            .join(format!("spindle-bench-fio-disk-{}.dat", std::process::id())),
        size_bytes: args.size.min(DISK_FILE_BYTES_MAX),
    });
    let disk = match &disk_note {
        Some(note) => Some(run_disk(&args, &pts, note)?),
        None => None,
    };

    let (ceph_measured, ceph_procs) = match &ceph_scripts {
        Some(scripts) => {
            let (figures, procs) = run_ceph(scripts, &args, erasure, &pts)?;
            (Some(figures), procs)
        }
        None => (None, Vec::new()),
    };
    let ceph_same_sitting = ceph_measured.is_some();

    let rows: Vec<Row> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ceph = match &ceph_measured {
                Some(m) => Some(m[i]),
                None => published_ceph(p, erasure).map(|figures| Measured { figures, cpu: None }),
            };
            Row::new(
                p.clone(),
                spindle[i],
                nbdkit.as_ref().map(|v| v[i]),
                disk.as_ref().map(|v| v[i].figures),
                ceph,
            )
        })
        .collect();
    let targets = targets(
        &rows,
        TargetContext {
            pool: shape,
            ceph_same_sitting,
        },
    );
    let ceph_anchor = ceph_anchor_label(erasure, ceph_same_sitting);
    let results = results(&rows, &ceph_anchor);
    if args.json {
        let report = Report {
            bench: "fio",
            ceph_anchor,
            ceph_same_sitting,
            image_bytes: args.size,
            runtime_seconds: args.runtime_seconds,
            ramp_seconds: args.ramp_seconds,
            disk_file: disk_note.as_ref().map(|d| d.path.display().to_string()),
            disk_file_bytes: disk_note.as_ref().map(|d| d.size_bytes),
            cpu_window: CPU_WINDOW,
            spindle_server_processes: Proc::describe(&spindle_servers),
            ceph_server_processes: Proc::describe(&ceph_procs),
            rows: &rows,
            targets: &targets,
            results: &results,
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_table(
        &rows,
        &targets,
        &ceph_anchor,
        erasure,
        ceph_same_sitting,
        disk_note.as_ref(),
    );
    Ok(())
}

/// The convention's results: Spindle against Ceph (IOPS, latency, and CPU per I/O when
/// Ceph ran in this sitting) and against the disk (MB/s).
fn results(rows: &[Row], ceph_anchor: &str) -> Vec<BenchResult> {
    let mut results = Vec::new();
    for r in rows {
        let label = r.point.label();
        if let Some(c) = r.ceph {
            results.push(BenchResult::higher_is_better(
                format!("{label} IOPS"),
                "IOPS",
                r.spindle.iops,
                ceph_anchor,
                c.iops,
            ));
            results.push(BenchResult::lower_is_better(
                format!("{label} clat mean"),
                "µs",
                r.spindle.clat_mean_us,
                ceph_anchor,
                c.clat_mean_us,
            ));
        }
        if let (Some(s), Some(c)) = (r.spindle_cpu, r.ceph_cpu) {
            results.push(BenchResult::lower_is_better(
                format!("{label} CPU per I/O (server + client)"),
                "µs",
                s.total_us_per_io(),
                ceph_anchor,
                c.total_us_per_io(),
            ));
        }
        if let Some(d) = r.disk {
            results.push(BenchResult::higher_is_better(
                format!("{label} MB/s"),
                "MB/s",
                r.spindle.mb_per_s,
                "disk: fio io_uring, direct=1, this run",
                d.mb_per_s,
            ));
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(bs: &str, rw: &str, iodepth: u32) -> Point {
        Point {
            bs: bs.into(),
            rw: rw.into(),
            iodepth,
        }
    }

    /// The quick points are matrix points, 4k randread QD1 among them.
    #[test]
    fn quick_points_are_in_the_matrix() {
        let all = points(false);
        for p in points(true) {
            assert!(
                all.iter().any(|q| q.is(&p.bs, &p.rw, p.iodepth)),
                "{}",
                p.label()
            );
        }
        assert!(points(true).iter().any(|p| p.is("4k", "randread", 1)));
    }

    #[test]
    fn anchor_label_says_where_ceph_was_measured() {
        assert_eq!(
            ceph_anchor_label(false, true),
            "Ceph 16 RBD replicated x3, measured in this run"
        );
        assert_eq!(
            ceph_anchor_label(true, true),
            "Ceph 16 RBD EC 2+1, measured in this run"
        );
        let published = ceph_anchor_label(true, false);
        assert!(published.starts_with("Ceph 16 RBD EC 2+1: "));
        assert!(published.contains("published figures from another machine kind"));
        assert!(published.contains("not a same-sitting ratio"));
    }

    #[test]
    fn cpu_per_io_divides_the_window_by_its_ios() {
        // 3 s measured at 1,000 IOPS after a 1 s ramp: 4,000 I/Os in the window.
        let ios = ios_in_window(3000, 1000.0, 1);
        assert_eq!(ios, 4000.0);
        let cpu = cpu_per_io(8_000_000, 400_000, ios);
        assert_eq!(
            cpu,
            Some(CpuPerIo {
                server_us_per_io: 2000.0,
                client_us_per_io: 100.0
            })
        );
        assert_eq!(cpu.map(|c| c.total_us_per_io()), Some(2100.0));
        assert_eq!(ios_in_window(500, 250.0, 0), 500.0);
        assert_eq!(cpu_per_io(1, 1, 0.0), None);
        assert_eq!(cpu_per_io(1, 1, f64::NAN), None);
    }

    #[test]
    fn fio_json_figures_parse() {
        let v = serde_json::json!({"jobs": [{"error": 0, "read": {
            "iops": 2000.5, "bw_bytes": 8_194_048, "total_ios": 6001,
            "clat_ns": {"mean": 480_000.0, "percentile": {"99.000000": 1_200_000}}},
            "write": {"iops": 0.0, "total_ios": 0}}]});
        let parsed = parse_figures(&v, &point("4k", "randread", 1)).ok();
        let (f, ios) = parsed.unwrap_or_default();
        assert_eq!(ios, 6001);
        assert_eq!(f.iops, 2000.5);
        assert_eq!(f.mb_per_s, 8.194048);
        assert_eq!(f.clat_mean_us, 480.0);
        assert_eq!(f.clat_p99_us, 1200.0);
        // The write side of that report did nothing: an error, not a zero row.
        assert!(parse_figures(&v, &point("4k", "randwrite", 1)).is_err());
        let failed = serde_json::json!({"jobs": [{"error": 5, "read": {"iops": 1.0,
            "total_ios": 1}}]});
        assert!(parse_figures(&failed, &point("4k", "read", 1)).is_err());
        assert!(parse_figures(&serde_json::json!({}), &point("4k", "read", 1)).is_err());
    }

    #[test]
    fn pool_shape_gives_the_write_amplification() {
        let rep = pool_shape(&PoolKind::Replicated {
            size: 3,
            min_size: 2,
        });
        assert!(!rep.erasure);
        assert_eq!(rep.write_amplification, 3.0);
        let ec = pool_shape(&PoolKind::Erasure {
            k: 2,
            m: 1,
            min_size: 2,
            matrix: 0,
            stripe_unit_bytes: 4096,
        });
        assert!(ec.erasure);
        assert_eq!(ec.write_amplification, 1.5);
    }

    /// The JSON report says where the Ceph figures come from and carries the new fields.
    #[test]
    fn json_report_labels_the_anchor() {
        let p = point("4k", "randread", 1);
        let spindle = Measured {
            figures: Figures {
                iops: 4000.0,
                mb_per_s: 16.4,
                clat_mean_us: 240.0,
                clat_p99_us: 400.0,
            },
            cpu: cpu_per_io(400_000, 100_000, 4000.0),
        };
        let ceph = published_ceph(&p, false).map(|figures| Measured { figures, cpu: None });
        let rows = [Row::new(p, spindle, None, None, ceph)];
        let targets = [TargetCheck {
            name: "x".into(),
            value: 2.0,
            required: 3.0,
            bound: Bound::AtMost,
            met: true,
        }];
        let report = Report {
            bench: "fio",
            ceph_anchor: ceph_anchor_label(false, false),
            ceph_same_sitting: false,
            image_bytes: 1 << 30,
            runtime_seconds: 3,
            ramp_seconds: 1,
            disk_file: None,
            disk_file_bytes: None,
            cpu_window: CPU_WINDOW,
            spindle_server_processes: vec!["spindle nbd 12".into()],
            ceph_server_processes: Vec::new(),
            rows: &rows,
            targets: &targets,
            results: &results(&rows, &ceph_anchor_label(false, false)),
        };
        let v = serde_json::to_value(&report).unwrap_or_default();
        assert_eq!(v["ceph_same_sitting"], false);
        assert!(v["ceph_anchor"]
            .as_str()
            .is_some_and(|a| a.contains("published figures from another machine kind")));
        assert_eq!(v["rows"][0]["spindle_cpu"]["server_us_per_io"], 100.0);
        assert_eq!(v["rows"][0]["ceph_cpu"], serde_json::Value::Null);
        assert_eq!(v["rows"][0]["ceph"]["iops"], 1157.0);
        assert_eq!(v["rows"][0]["bs"], "4k");
        assert_eq!(v["targets"][0]["bound"], "at_most");
        assert!(v["results"][0]["reference"]
            .as_str()
            .is_some_and(|r| r.contains("not a same-sitting ratio")));
    }

    #[test]
    fn engines_name_their_target() {
        let rbd = Engine::rbd(Path::new("/var/tmp/c/ceph.conf"), "rbd", "rep");
        assert_eq!(
            rbd.args,
            [
                "--ioengine=rbd",
                "--clientname=admin",
                "--pool=rbd",
                "--rbdname=rep"
            ]
        );
        assert_eq!(rbd.env.len(), 1);
        assert_eq!(rbd.size_arg(), "--size=100%");
        let file = Engine::file(Path::new("/tmp/d.dat"), 1 << 30);
        assert_eq!(file.args, ["--ioengine=io_uring", "--filename=/tmp/d.dat"]);
        assert_eq!(file.size_arg(), "--size=1073741824");
        assert_eq!(Engine::nbd("nbd://x").args[1], "--uri=nbd://x");
    }
}
