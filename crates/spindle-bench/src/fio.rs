//! `spindle bench fio`: block images over NBD measured with fio's `nbd` engine on the
//! DeLiBA matrix (bs 4k/64k/128k/512k x read/write/randread/randwrite x iodepth 1/16,
//! job parameters of `baselines/fio/bench.fio`), beside Ceph RBD replicated x3, or Ceph
//! RBD EC 2+1 when the image's pool is erasure-coded (the published baselines, embedded
//! below), and `nbdkit memory` measured in the same run (the ceiling of any NBD server on
//! this machine).
//!
//! The bench creates (or reuses) an image on the cluster named by `--dir`/`--mon`,
//! prefills it like `baselines/fio/prefill.fio`, starts its own `spindle nbd` and
//! `nbdkit memory` children on free ports, and stops them when done.

use crate::common::BenchResult;
use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use spindle_cluster::runtime;
use spindle_cluster::Target;
use spindle_image::image::OBJECT_SIZE_BYTES_DEFAULT;
use spindle_image::{Image, ImageError};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ceph 16.2.15 RBD, replicated x3, 3 BlueStore OSDs on 127.0.0.1, fio 3.33 `rbd` engine,
/// numjobs 1, 10 s after 3 s ramp. Source: `/work/shared/baselines/ceph.md`, "Appendix:
/// every matrix point" rows "Ceph RBD replicated x3" (measured 2026-11-22).
/// (bs, rw, iodepth, IOPS, MB/s, mean clat µs, p99 clat µs)
const CEPH_REP3: [(&str, &str, u32, f64, f64, f64, f64); 32] = [
    ("4k", "read", 1, 503.0, 2.1, 1893.2, 10289.2),
    ("4k", "write", 1, 196.0, 0.8, 5001.5, 13434.9),
    ("4k", "randread", 1, 1157.0, 4.7, 802.3, 2867.2),
    ("4k", "randwrite", 1, 121.0, 0.5, 8038.1, 21364.7),
    ("64k", "read", 1, 634.0, 41.6, 1495.4, 6193.2),
    ("64k", "write", 1, 254.0, 16.7, 3856.4, 8847.4),
    ("64k", "randread", 1, 947.0, 62.0, 1017.2, 3129.3),
    ("64k", "randwrite", 1, 156.0, 10.2, 6235.2, 17432.6),
    ("128k", "read", 1, 774.0, 101.4, 1233.5, 5996.5),
    ("128k", "write", 1, 240.0, 31.4, 4071.7, 9764.9),
    ("128k", "randread", 1, 407.0, 53.4, 2309.2, 8716.3),
    ("128k", "randwrite", 1, 232.0, 30.5, 4202.5, 8159.2),
    ("512k", "read", 1, 444.0, 232.6, 2209.7, 6848.5),
    ("512k", "write", 1, 177.0, 92.7, 5489.8, 11075.6),
    ("512k", "randread", 1, 443.0, 232.5, 2211.8, 5996.5),
    ("512k", "randwrite", 1, 155.0, 81.2, 6265.2, 13434.9),
    ("4k", "read", 16, 3591.0, 14.7, 4412.1, 11993.1),
    ("4k", "write", 16, 2492.0, 10.2, 6399.5, 13303.8),
    ("4k", "randread", 16, 3521.0, 14.4, 4494.7, 16056.3),
    ("4k", "randwrite", 16, 626.0, 2.6, 25444.2, 55312.4),
    ("64k", "read", 16, 1273.0, 83.5, 12497.5, 36962.3),
    ("64k", "write", 16, 1317.0, 86.4, 12102.7, 22151.2),
    ("64k", "randread", 16, 1970.0, 129.2, 8058.2, 25559.0),
    ("64k", "randwrite", 16, 450.0, 29.6, 35335.9, 77070.3),
    ("128k", "read", 16, 1520.0, 199.4, 10464.8, 28966.9),
    ("128k", "write", 16, 685.0, 90.0, 23281.8, 47972.4),
    ("128k", "randread", 16, 1937.0, 254.0, 8209.1, 23199.7),
    ("128k", "randwrite", 16, 440.0, 57.9, 36092.4, 76021.8),
    ("512k", "read", 16, 601.0, 315.8, 26524.1, 83361.8),
    ("512k", "write", 16, 362.0, 190.4, 43896.6, 76021.8),
    ("512k", "randread", 16, 797.0, 418.7, 20013.8, 60031.0),
    ("512k", "randwrite", 16, 323.0, 170.0, 48889.9, 99090.4),
];

/// Ceph 16.2.15 RBD on an erasure-coded 2+1 data pool, same setup and columns as
/// `CEPH_REP3`. Source: `/work/shared/baselines/ceph.md`, "Appendix: every matrix point"
/// rows "Ceph RBD EC 2+1" (IOPS, MB/s, mean and p99 clat), measured 2026-11-22.
const CEPH_EC21: [(&str, &str, u32, f64, f64, f64, f64); 32] = [
    ("4k", "read", 1, 1004.0, 4.1, 960.3, 2703.4),
    ("4k", "write", 1, 101.0, 0.4, 9728.6, 25034.8),
    ("4k", "randread", 1, 668.0, 2.7, 1442.5, 4948.0),
    ("4k", "randwrite", 1, 144.0, 0.6, 6771.5, 13303.8),
    ("64k", "read", 1, 280.0, 18.4, 3428.3, 13041.7),
    ("64k", "write", 1, 160.0, 10.5, 6114.5, 14876.7),
    ("64k", "randread", 1, 300.0, 19.6, 3191.6, 9240.6),
    ("64k", "randwrite", 1, 109.0, 7.2, 8940.9, 23199.7),
    ("128k", "read", 1, 677.0, 88.8, 1438.9, 4554.8),
    ("128k", "write", 1, 194.0, 25.4, 5010.2, 10420.2),
    ("128k", "randread", 1, 682.0, 89.4, 1430.8, 3457.0),
    ("128k", "randwrite", 1, 144.0, 18.9, 6742.3, 14483.5),
    ("512k", "read", 1, 423.0, 221.8, 2318.8, 5668.9),
    ("512k", "write", 1, 174.0, 91.0, 5522.8, 9502.7),
    ("512k", "randread", 1, 372.0, 195.2, 2634.7, 5865.5),
    ("512k", "randwrite", 1, 142.0, 74.2, 6760.5, 12910.6),
    ("4k", "read", 16, 1600.0, 6.6, 9941.3, 26869.8),
    ("4k", "write", 16, 1778.0, 7.3, 8978.7, 19529.7),
    ("4k", "randread", 16, 1335.0, 5.5, 11924.0, 36962.3),
    ("4k", "randwrite", 16, 307.0, 1.3, 51866.4, 108527.6),
    ("64k", "read", 16, 941.0, 61.7, 16925.1, 42729.5),
    ("64k", "write", 16, 1199.0, 78.7, 13301.0, 25296.9),
    ("64k", "randread", 16, 1343.0, 88.1, 11855.8, 38535.2),
    ("64k", "randwrite", 16, 340.0, 22.4, 46770.1, 107479.0),
    ("128k", "read", 16, 1100.0, 144.4, 14470.1, 35389.4),
    ("128k", "write", 16, 927.0, 121.7, 17201.1, 34865.2),
    ("128k", "randread", 16, 1169.0, 153.4, 13631.8, 40108.0),
    ("128k", "randwrite", 16, 332.0, 43.7, 47844.6, 120062.0),
    ("512k", "read", 16, 630.0, 331.3, 25284.7, 59506.7),
    ("512k", "write", 16, 346.0, 182.2, 45968.7, 99090.4),
    ("512k", "randread", 16, 682.0, 358.2, 23423.6, 62128.1),
    ("512k", "randwrite", 16, 242.0, 127.5, 65317.4, 130547.7),
];

const BLOCK_SIZES: [&str; 4] = ["4k", "64k", "128k", "512k"];
const PATTERNS: [&str; 4] = ["read", "write", "randread", "randwrite"];
const DEPTHS: [u32; 2] = [1, 16];
/// `--quick`: the points behind the headline targets.
const QUICK: [(&str, &str, u32); 5] = [
    ("4k", "randwrite", 16),
    ("4k", "randread", 16),
    ("4k", "randwrite", 1),
    ("512k", "write", 16),
    ("512k", "read", 16),
];
const CEPH_NAME: &str = "Ceph 16 RBD replicated x3";
const CEPH_EC_NAME: &str = "Ceph 16 RBD EC 2+1";

/// The Ceph anchor's name for an image on a replicated or an erasure-coded pool.
fn ceph_name(erasure: bool) -> &'static str {
    if erasure {
        CEPH_EC_NAME
    } else {
        CEPH_NAME
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
    /// Only 4k randwrite/randread QD16, 4k randwrite QD1 and 512k write/read QD16.
    #[arg(long)]
    pub quick: bool,
    /// Pool of the benchmark image.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Benchmark image (created if missing, grown if smaller than --size; kept afterwards).
    #[arg(long, default_value = "fio-bench")]
    pub image: String,
    /// Size of the benchmark image and of the nbdkit memory disk.
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
    /// Start `spindle nbd` with `--no-coalesce` (no hold/merge of adjacent requests).
    #[arg(long)]
    pub no_coalesce: bool,
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
}

/// What fio measured at one point.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Figures {
    pub iops: f64,
    pub mb_per_s: f64,
    pub clat_mean_us: f64,
    pub clat_p99_us: f64,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub point: Point,
    pub spindle: Figures,
    pub nbdkit_memory: Option<Figures>,
    pub ceph: Option<Figures>,
    /// Spindle / Ceph (IOPS).
    pub iops_vs_ceph: Option<f64>,
    /// Spindle / Ceph (MB/s).
    pub mbs_vs_ceph: Option<f64>,
    /// Ceph / Spindle (mean completion latency): above 1 = Spindle is faster.
    pub latency_vs_ceph: Option<f64>,
    /// Spindle / nbdkit memory (IOPS).
    pub iops_vs_nbdkit: Option<f64>,
}

/// A headline target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub name: String,
    pub value: f64,
    pub required: f64,
    pub met: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    bench: &'static str,
    /// The Ceph figures the rows are compared with.
    ceph_anchor: &'static str,
    image_bytes: u64,
    runtime_seconds: u64,
    ramp_seconds: u64,
    rows: &'a [Row],
    targets: &'a [TargetCheck],
    results: &'a [BenchResult],
}

fn ceph(p: &Point, erasure: bool) -> Option<Figures> {
    let table = if erasure { &CEPH_EC21 } else { &CEPH_REP3 };
    table
        .iter()
        .find(|(bs, rw, qd, ..)| *bs == p.bs && *rw == p.rw && *qd == p.iodepth)
        .map(
            |&(_, _, _, iops, mb_per_s, clat_mean_us, clat_p99_us)| Figures {
                iops,
                mb_per_s,
                clat_mean_us,
                clat_p99_us,
            },
        )
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// A child process that is stopped (SIGTERM, then SIGKILL after 15 s) when dropped.
pub(crate) struct ChildGuard {
    pub(crate) child: Child,
    pub(crate) what: String,
}

impl ChildGuard {
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
    pub(crate) fn wait_listening(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
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
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr()?)
}

pub(crate) fn log_file(name: &str) -> anyhow::Result<(PathBuf, std::fs::File)> {
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

/// Runs fio with `args` (plus the JSON output flag) and returns its parsed report.
fn fio_json(args: &[String]) -> anyhow::Result<serde_json::Value> {
    let out = Command::new("fio")
        .args(args)
        .arg("--output-format=json")
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
    // fio may print notes before the JSON document.
    let start = stdout.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&stdout[start..]).context("cannot parse fio's JSON output")
}

pub(crate) fn prefill(uri: &str) -> anyhow::Result<()> {
    let args: Vec<String> = [
        "--name=prefill",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--bs=4m",
        "--rw=write",
        "--iodepth=16",
        "--numjobs=1",
        "--direct=1",
        "--time_based=0",
        "--size=100%",
        "--group_reporting=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    fio_json(&args).map(|_| ())
}

pub(crate) fn measure(uri: &str, p: &Point, runtime: u64, ramp: u64) -> anyhow::Result<Figures> {
    let args: Vec<String> = vec![
        "--name=bench".into(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        format!("--bs={}", p.bs),
        format!("--rw={}", p.rw),
        format!("--iodepth={}", p.iodepth),
        "--numjobs=1".into(),
        "--direct=1".into(),
        "--time_based=1".into(),
        format!("--runtime={runtime}"),
        format!("--ramp_time={ramp}"),
        "--norandommap=1".into(),
        "--randrepeat=0".into(),
        "--group_reporting=1".into(),
        "--percentile_list=50:90:99:99.9:99.99".into(),
    ];
    let v = fio_json(&args)?;
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
    if j["total_ios"].as_u64() == Some(0) || !figures.iops.is_finite() {
        bail!("fio reported no {dir} I/O for {}: {v}", p.label());
    }
    let errors = v["jobs"][0]["error"].as_i64().unwrap_or(0);
    if errors != 0 {
        bail!("fio reported error {errors} for {}", p.label());
    }
    Ok(figures)
}

/// Creates the benchmark image (or reuses it, growing it to `size` if smaller); returns
/// whether its pool is erasure-coded (the Ceph anchor is then Ceph's EC 2+1 image).
async fn ensure_image(args: &BenchFioArgs) -> anyhow::Result<bool> {
    let client = Arc::new(args.target.client().await?);
    let erasure = client
        .map()
        .pool_by_name(&args.pool)
        .is_some_and(|p| p.is_erasure());
    match Image::create(
        client.clone(),
        &args.pool,
        &args.image,
        args.size,
        args.object_size
            .or_else(|| spindle_image::image::default_object_size(&client.map(), &args.pool))
            .unwrap_or(OBJECT_SIZE_BYTES_DEFAULT),
    )
    .await
    {
        Ok(_) => Ok(erasure),
        Err(ImageError::Exists(_)) => {
            let img = Image::open(client, &args.pool, &args.image).await?;
            if img.size_bytes() < args.size {
                img.resize(args.size).await?;
            }
            Ok(erasure)
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

/// Runs every point against one NBD URI.
fn run_matrix(
    who: &str,
    uri: &str,
    pts: &[Point],
    args: &BenchFioArgs,
) -> anyhow::Result<Vec<Figures>> {
    let mut out = Vec::with_capacity(pts.len());
    for p in pts {
        if !args.json {
            eprintln!("bench fio: {who}: {}", p.label());
        }
        out.push(
            measure(uri, p, args.runtime_seconds, args.ramp_seconds)
                .with_context(|| format!("{who}: {}", p.label()))?,
        );
    }
    Ok(out)
}

/// The headline targets. They are defined against the replicated anchor; on an
/// erasure-coded pool the same ratios are computed against the EC 2+1 anchor and the
/// labels say so.
fn targets(rows: &[Row], erasure: bool) -> Vec<TargetCheck> {
    let ceph = if erasure { "Ceph EC 2+1" } else { "Ceph" };
    let find = |bs: &str, rw: &str, qd: u32| {
        rows.iter()
            .find(|r| r.point.bs == bs && r.point.rw == rw && r.point.iodepth == qd)
    };
    let mut t = Vec::new();
    let mut push = |name: &str, value: Option<f64>, required: f64| {
        if let Some(value) = value {
            t.push(TargetCheck {
                name: name.into(),
                value,
                required,
                met: value >= required,
            });
        }
    };
    push(
        &format!("4k randwrite QD16 IOPS / {ceph}"),
        find("4k", "randwrite", 16).and_then(|r| r.iops_vs_ceph),
        5.0,
    );
    push(
        &format!("4k randread QD16 IOPS / {ceph}"),
        find("4k", "randread", 16).and_then(|r| r.iops_vs_ceph),
        5.0,
    );
    push(
        &format!("4k randwrite QD1 latency: {ceph} / Spindle"),
        find("4k", "randwrite", 1).and_then(|r| r.latency_vs_ceph),
        3.0,
    );
    if let Some(r) = find("4k", "randread", 1) {
        push(
            &format!("4k randread QD1 latency: {ceph} / Spindle"),
            r.latency_vs_ceph,
            3.0,
        );
    }
    push(
        &format!("512k write QD16 MB/s / {ceph}"),
        find("512k", "write", 16).and_then(|r| r.mbs_vs_ceph),
        2.0,
    );
    push(
        &format!("512k read QD16 MB/s / {ceph}"),
        find("512k", "read", 16).and_then(|r| r.mbs_vs_ceph),
        2.0,
    );
    push(
        "4k randwrite QD16 IOPS / nbdkit memory",
        find("4k", "randwrite", 16).and_then(|r| r.iops_vs_nbdkit),
        0.3,
    );
    t
}

fn opt(x: Option<f64>, prec: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.prec$}"),
        _ => "-".into(),
    }
}

fn print_table(rows: &[Row], targets: &[TargetCheck], erasure: bool) {
    let ceph_label = ceph_name(erasure);
    println!(
        "{:<18} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>7} {:>7} | {:>6} {:>6} {:>7} {:>7} | {:>6} {:>6} {:>6} {:>6}",
        "", "Spindle", "", "", "", "nbdkit", "memory", "", "", "Ceph RBD", if erasure { "EC 2+1" } else { "rep3" }, "", "", "S/Ceph", "S/Ceph", "Ceph/S", "S/nbdk"
    );
    println!(
        "{:<18} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>7} {:>7} | {:>6} {:>6} {:>7} {:>7} | {:>6} {:>6} {:>6} {:>6}",
        "point", "IOPS", "MB/s", "clat µs", "p99 µs", "IOPS", "MB/s", "clat", "p99", "IOPS", "MB/s", "clat", "p99", "IOPS", "MB/s", "lat", "IOPS"
    );
    for r in rows {
        let s = &r.spindle;
        let n = r.nbdkit_memory;
        let c = r.ceph;
        println!(
            "{:<18} | {:>8.0} {:>8.1} {:>8.1} {:>8.1} | {:>8} {:>8} {:>7} {:>7} | {:>6} {:>6} {:>7} {:>7} | {:>6} {:>6} {:>6} {:>6}",
            r.point.label(),
            s.iops,
            s.mb_per_s,
            s.clat_mean_us,
            s.clat_p99_us,
            opt(n.map(|f| f.iops), 0),
            opt(n.map(|f| f.mb_per_s), 1),
            opt(n.map(|f| f.clat_mean_us), 0),
            opt(n.map(|f| f.clat_p99_us), 0),
            opt(c.map(|f| f.iops), 0),
            opt(c.map(|f| f.mb_per_s), 1),
            opt(c.map(|f| f.clat_mean_us), 0),
            opt(c.map(|f| f.clat_p99_us), 0),
            opt(r.iops_vs_ceph, 2),
            opt(r.mbs_vs_ceph, 2),
            opt(r.latency_vs_ceph, 2),
            opt(r.iops_vs_nbdkit, 2),
        );
    }
    println!(
        "(Ceph: {ceph_label}, /work/shared/baselines/ceph.md; clat = mean completion latency)"
    );
    println!("targets:");
    for t in targets {
        println!(
            "  {:<49} {:>8.2}  (need >= {:.2})  {}",
            t.name,
            t.value,
            t.required,
            if t.met { "met" } else { "NOT met" }
        );
    }
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
    let erasure = runtime()?.block_on(ensure_image(&args))?;
    let pts = points(args.quick);

    // Spindle over its own `spindle nbd`.
    let addr = free_port()?;
    let exe = std::env::current_exe().context("cannot find the spindle binary")?;
    let (log_path, log) = log_file("nbd")?;
    let mut cmd = Command::new(&exe);
    cmd.arg("nbd")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--pool")
        .arg(&args.pool)
        .arg("--dir")
        .arg(&args.target.dir);
    if args.no_coalesce {
        cmd.arg("--no-coalesce");
    }
    if let Some(mon) = &args.target.mon {
        cmd.arg("--mon").arg(mon);
    }
    let mut nbd = ChildGuard {
        child: cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start spindle nbd")?,
        what: format!("spindle nbd (log {})", log_path.display()),
    };
    nbd.wait_listening(addr)?;
    let uri = format!("nbd://{addr}/{}", args.image);
    if !args.no_prefill {
        if !args.json {
            eprintln!("bench fio: prefilling {uri}");
        }
        prefill(&uri).context("prefill of the Spindle image")?;
    }
    let spindle = run_matrix("spindle", &uri, &pts, &args)?;
    nbd.stop();

    // nbdkit memory, the NBD ceiling.
    let nbdkit = if args.no_nbdkit {
        None
    } else {
        let addr = free_port()?;
        let (log_path, log) = log_file("nbdkit")?;
        let mut kit = ChildGuard {
            child: Command::new("nbdkit")
                .args([
                    "--foreground",
                    "--exit-with-parent",
                    "--ipaddr",
                    "127.0.0.1",
                ])
                .arg("--port")
                .arg(addr.port().to_string())
                .arg("memory")
                .arg(args.size.to_string())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("cannot start nbdkit")?,
            what: format!("nbdkit memory (log {})", log_path.display()),
        };
        kit.wait_listening(addr)?;
        let uri = format!("nbd://{addr}");
        if !args.no_prefill {
            prefill(&uri).context("prefill of nbdkit memory")?;
        }
        let figures = run_matrix("nbdkit memory", &uri, &pts, &args)?;
        kit.stop();
        Some(figures)
    };

    let rows: Vec<Row> = pts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = spindle[i];
            let c = ceph(p, erasure);
            let n = nbdkit.as_ref().map(|v| v[i]);
            Row {
                point: p.clone(),
                spindle: s,
                nbdkit_memory: n,
                ceph: c,
                iops_vs_ceph: c.and_then(|c| ratio(s.iops, c.iops)),
                mbs_vs_ceph: c.and_then(|c| ratio(s.mb_per_s, c.mb_per_s)),
                latency_vs_ceph: c.and_then(|c| ratio(c.clat_mean_us, s.clat_mean_us)),
                iops_vs_nbdkit: n.and_then(|n| ratio(s.iops, n.iops)),
            }
        })
        .collect();
    let targets = targets(&rows, erasure);
    let ceph_anchor = ceph_name(erasure);
    let mut results = Vec::new();
    for r in &rows {
        if let Some(c) = r.ceph {
            results.push(BenchResult::higher_is_better(
                format!("{} IOPS", r.point.label()),
                "IOPS",
                r.spindle.iops,
                ceph_anchor,
                c.iops,
            ));
            results.push(BenchResult::lower_is_better(
                format!("{} clat mean", r.point.label()),
                "µs",
                r.spindle.clat_mean_us,
                ceph_anchor,
                c.clat_mean_us,
            ));
        }
    }
    if args.json {
        let report = Report {
            bench: "fio",
            ceph_anchor,
            image_bytes: args.size,
            runtime_seconds: args.runtime_seconds,
            ramp_seconds: args.ramp_seconds,
            rows: &rows,
            targets: &targets,
            results: &results,
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_table(&rows, &targets, erasure);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both Ceph tables have every point of the matrix exactly once.
    #[test]
    fn ceph_tables_cover_the_matrix() {
        for (name, table) in [("rep3", &CEPH_REP3), ("ec21", &CEPH_EC21)] {
            for p in points(false) {
                let n = table
                    .iter()
                    .filter(|(bs, rw, qd, ..)| *bs == p.bs && *rw == p.rw && *qd == p.iodepth)
                    .count();
                assert_eq!(n, 1, "{name}: {} appears {n} times", p.label());
            }
        }
        // Spot checks against shared/baselines/ceph.md.
        let ec = |bs: &str, rw: &str, qd: u32| {
            let p = Point {
                bs: bs.into(),
                rw: rw.into(),
                iodepth: qd,
            };
            ceph(&p, true).map(|f| (f.iops, f.mb_per_s))
        };
        assert_eq!(ec("4k", "randwrite", 16), Some((307.0, 1.3)));
        assert_eq!(ec("512k", "write", 16), Some((346.0, 182.2)));
        assert_eq!(ec("4k", "randread", 16), Some((1335.0, 5.5)));
    }

    /// On an erasure-coded pool the Ceph targets are labelled with the EC 2+1 anchor.
    #[test]
    fn ec_targets_name_the_ec_anchor() {
        let row = Row {
            point: Point {
                bs: "4k".into(),
                rw: "randwrite".into(),
                iodepth: 16,
            },
            spindle: Figures::default(),
            nbdkit_memory: None,
            ceph: None,
            iops_vs_ceph: Some(6.0),
            mbs_vs_ceph: None,
            latency_vs_ceph: None,
            iops_vs_nbdkit: None,
        };
        let rows = [row];
        let ec = targets(&rows, true);
        assert_eq!(ec.len(), 1);
        assert_eq!(ec[0].name, "4k randwrite QD16 IOPS / Ceph EC 2+1");
        assert!(ec[0].met);
        assert_eq!(
            targets(&rows, false)[0].name,
            "4k randwrite QD16 IOPS / Ceph"
        );
    }
}
