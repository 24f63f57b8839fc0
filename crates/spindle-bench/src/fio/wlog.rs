//! `spindle bench fio --write-log DIR`: the client write log (LineFS's persist and
//! publish) against write-through, beside nbdkit memory and the log's disk, in one run.
//!
//! Order: a local 4 KiB `O_DIRECT` write + `fdatasync` on a file in DIR (the log's disk);
//! nbdkit memory, 4k randwrite QD16 for the burst length (the NBD ceiling); then
//! `spindle nbd` write-through and `spindle nbd --write-log` (a fresh log in a temporary
//! directory under DIR, removed afterwards), each on the same points:
//!
//! - burst: 4k randwrite QD16 for `--burst-seconds` (10), from an empty log;
//! - 4k randwrite QD1 and 512k sequential write QD16 for the burst length;
//! - FLUSH: 4k randwrite QD1 with a FLUSH after every 8 writes (fio `fsync=8`): the
//!   FLUSH latency (with the log: every logged write published and durable on every copy);
//! - sustained: 4k randwrite QD16 for `--sustained-seconds` (120; with a 256 MiB log the
//!   ring wraps many times), with the log's publish rate over the same window (from the
//!   counters `spindle nbd` writes to `<log>.stats.json`).
//!
//! With the log, every point starts from an empty log (the bench waits until the
//! publisher has drained it), so a burst figure is a burst, not the tail of the point
//! before.

use super::*;
use anyhow::{bail, Context};
use serde::Serialize;

/// Most seconds the bench waits for a log to drain between points.
const DRAIN_WAIT_SECONDS_MAX: u64 = 600;
/// FLUSH every this many writes in the FLUSH point.
const FLUSH_EVERY_WRITES: u32 = 8;

/// One side (write-through or log) of the report.
#[derive(Debug, Clone, Serialize)]
struct Side {
    burst_qd16: Figures,
    qd1: Figures,
    seq_512k: Figures,
    flush_mean_us: f64,
    flush_p99_us: f64,
    sustained_qd16: Figures,
    /// Published bytes per second over the sustained window (log only).
    publish_mb_per_s: Option<f64>,
    /// Appended (logged) bytes per second over the same window (log only).
    append_mb_per_s: Option<f64>,
    /// Object writes the publisher sent per second, and extents per object write.
    publish_object_writes_per_s: Option<f64>,
    publish_extents_per_write: Option<f64>,
    /// Seconds the log took to drain after the sustained run.
    drain_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    log_bytes: u64,
    burst_seconds: u64,
    sustained_seconds: u64,
    local_fdatasync_4k_us: f64,
    nbdkit_memory_4k_randwrite_qd16: Option<Figures>,
    write_through: Side,
    write_log: Side,
    offload: Option<offload::Offload>,
    results: Vec<crate::common::BenchResult>,
}

/// The log's counters (`<log>.stats.json`).
#[derive(Debug, Clone, Copy, Default)]
struct LogStats {
    unix_ms: u64,
    appended_bytes: u64,
    published_bytes: u64,
    publish_writes: u64,
    publish_extents: u64,
    ring_used_bytes: u64,
    overlay_bytes: u64,
}

fn read_stats(path: &Path) -> Option<LogStats> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let g = |k: &str| v[k].as_u64().unwrap_or(0);
    Some(LogStats {
        unix_ms: g("unix_ms"),
        appended_bytes: g("appended_bytes"),
        published_bytes: g("published_bytes"),
        publish_writes: g("publish_writes"),
        publish_extents: g("publish_extents"),
        ring_used_bytes: g("ring_used_bytes"),
        overlay_bytes: g("overlay_bytes"),
    })
}

/// Fresh counters: written after `after_ms` (the file is rewritten every 500 ms).
fn fresh_stats(path: &Path, after_ms: u64) -> anyhow::Result<Option<LogStats>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match read_stats(path) {
            Some(s) if s.unix_ms > after_ms => return Ok(Some(s)),
            None if !path.exists() && Instant::now() > deadline => return Ok(None),
            _ if Instant::now() > deadline => {
                bail!("{} is not being updated", path.display())
            }
            _ => {}
        }
        check_interrupted()?;
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits until the log is empty (everything published); returns the seconds it took.
fn wait_drained(stats: &Path) -> anyhow::Result<f64> {
    let start = Instant::now();
    loop {
        match fresh_stats(stats, now_ms())? {
            // No counters yet: nothing was ever written through this server.
            None => return Ok(0.0),
            Some(s) if s.ring_used_bytes == 0 && s.overlay_bytes == 0 => {
                return Ok(start.elapsed().as_secs_f64())
            }
            Some(_) if start.elapsed() > Duration::from_secs(DRAIN_WAIT_SECONDS_MAX) => {
                bail!("the write log did not drain in {DRAIN_WAIT_SECONDS_MAX} s")
            }
            Some(_) => {}
        }
    }
}

/// Mean microseconds of a 4 KiB `O_DIRECT` write + `fdatasync` on a file in `dir`.
fn local_fdatasync_us(dir: &Path, seconds: u64) -> anyhow::Result<f64> {
    let file = dir.join(format!(
        "spindle-bench-fdatasync-{}.dat",
        std::process::id()
    ));
    let args: Vec<String> = vec![
        "--name=fdatasync".into(),
        format!("--filename={}", file.display()),
        "--size=64M".into(),
        "--ioengine=psync".into(),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--direct=1".into(),
        "--fdatasync=1".into(),
        "--time_based=1".into(),
        format!("--runtime={seconds}"),
    ];
    let v = fio_json(&args, &[]);
    let _ = std::fs::remove_file(&file);
    let v = v?;
    let j = &v["jobs"][0];
    let write = j["write"]["clat_ns"]["mean"].as_f64().unwrap_or(f64::NAN);
    let sync = j["sync"]["lat_ns"]["mean"].as_f64().unwrap_or(f64::NAN);
    if !(write + sync).is_finite() {
        bail!("fio reported no write or fdatasync latency: {v}");
    }
    Ok((write + sync) / 1e3)
}

fn point(bs: &str, rw: &str, iodepth: u32) -> Point {
    Point {
        bs: bs.into(),
        rw: rw.into(),
        iodepth,
    }
}

/// FLUSH latency (mean, p99 µs) of 4k randwrite QD1 with a FLUSH every few writes.
fn flush_latency(engine: &Engine, seconds: u64) -> anyhow::Result<(f64, f64)> {
    let mut args: Vec<String> = vec!["--name=flush".into()];
    args.extend(engine.args.iter().cloned());
    args.extend([
        "--bs=4k".into(),
        "--rw=randwrite".into(),
        "--iodepth=1".into(),
        "--direct=1".into(),
        format!("--fsync={FLUSH_EVERY_WRITES}"),
        "--time_based=1".into(),
        format!("--runtime={seconds}"),
        "--norandommap=1".into(),
        "--randrepeat=0".into(),
    ]);
    let v = fio_json(&args, &engine.env)?;
    let sync = &v["jobs"][0]["sync"]["lat_ns"];
    let mean = sync["mean"].as_f64().unwrap_or(f64::NAN) / 1e3;
    let p99 = sync["percentile"]["99.000000"].as_f64().unwrap_or(f64::NAN) / 1e3;
    if !mean.is_finite() || v["jobs"][0]["sync"]["total_ios"].as_u64().unwrap_or(0) == 0 {
        bail!("fio reported no FLUSH: {v}");
    }
    Ok((mean, p99))
}

/// Every point against one `spindle nbd` (`stats`: its log's counters file, if any).
fn measure_side(
    who: &str,
    engine: &Engine,
    stats: Option<&Path>,
    args: &BenchFioArgs,
) -> anyhow::Result<Side> {
    let burst = Timing {
        runtime_seconds: args.burst_seconds,
        ramp_seconds: 0,
    };
    let drain = |what: &str| -> anyhow::Result<()> {
        if let Some(stats) = stats {
            let s = wait_drained(stats)?;
            if s > 1.0 && !args.json {
                eprintln!("bench fio: {who}: the log drained in {s:.1} s before {what}");
            }
        }
        Ok(())
    };
    let say = |what: &str| {
        if !args.json {
            eprintln!("bench fio: {who}: {what}");
        }
    };
    let one = |what: &str, p: Point, t: Timing| -> anyhow::Result<Figures> {
        drain(what)?;
        say(what);
        Ok(measure(engine, &p, t, None)
            .with_context(|| format!("{who}: {what}"))?
            .figures)
    };
    let burst_qd16 = one(
        "4k randwrite QD16 (burst)",
        point("4k", "randwrite", 16),
        burst,
    )?;
    let qd1 = one("4k randwrite QD1", point("4k", "randwrite", 1), burst)?;
    let seq_512k = one("512k write QD16", point("512k", "write", 16), burst)?;
    drain("FLUSH")?;
    say("4k randwrite QD1 with FLUSH");
    let (flush_mean_us, flush_p99_us) =
        flush_latency(engine, args.burst_seconds).with_context(|| format!("{who}: FLUSH"))?;
    drain("sustained")?;
    say(&format!(
        "4k randwrite QD16 sustained for {} s",
        args.sustained_seconds
    ));
    let before = match stats {
        Some(p) => fresh_stats(p, now_ms())?,
        None => None,
    };
    let sustained_qd16 = measure(
        engine,
        &point("4k", "randwrite", 16),
        Timing {
            runtime_seconds: args.sustained_seconds,
            ramp_seconds: 0,
        },
        None,
    )
    .with_context(|| format!("{who}: sustained"))?
    .figures;
    let after = match stats {
        Some(p) => fresh_stats(p, now_ms())?,
        None => None,
    };
    let mut side = Side {
        burst_qd16,
        qd1,
        seq_512k,
        flush_mean_us,
        flush_p99_us,
        sustained_qd16,
        publish_mb_per_s: None,
        append_mb_per_s: None,
        publish_object_writes_per_s: None,
        publish_extents_per_write: None,
        drain_seconds: None,
    };
    if let (Some(b), Some(a), Some(p)) = (before, after, stats) {
        let secs = (a.unix_ms.saturating_sub(b.unix_ms)) as f64 / 1e3;
        let writes = a.publish_writes.saturating_sub(b.publish_writes) as f64;
        side.publish_mb_per_s =
            Some(a.published_bytes.saturating_sub(b.published_bytes) as f64 / 1e6 / secs);
        side.append_mb_per_s =
            Some(a.appended_bytes.saturating_sub(b.appended_bytes) as f64 / 1e6 / secs);
        side.publish_object_writes_per_s = Some(writes / secs);
        side.publish_extents_per_write =
            Some(a.publish_extents.saturating_sub(b.publish_extents) as f64 / writes.max(1.0));
        side.drain_seconds = Some(wait_drained(p)?);
    }
    Ok(side)
}

pub(super) fn run(args: &BenchFioArgs) -> anyhow::Result<()> {
    let Some(log_parent) = &args.write_log else {
        bail!("--write-log DIR is required for the write log report");
    };
    if args.burst_seconds == 0 || args.sustained_seconds == 0 {
        bail!("--burst-seconds and --sustained-seconds must be > 0");
    }
    let log_bytes = spindle_cluster::parse_size_bytes(&args.write_log_size)
        .map_err(|e| anyhow::anyhow!("--write-log-size {}: {e}", args.write_log_size))?;
    std::fs::create_dir_all(log_parent)
        .with_context(|| format!("cannot create {}", log_parent.display()))?;
    let log_dir = TempDir(log_parent.join(format!("spindle-bench-wlog-{}", std::process::id())));
    std::fs::create_dir_all(&log_dir.0)
        .with_context(|| format!("cannot create {}", log_dir.0.display()))?;
    catch_interrupts();
    let (shape, cluster_procs) = runtime()?.block_on(ensure_image(args))?;
    if shape.erasure && !args.json {
        eprintln!("bench fio: the image's pool is erasure-coded (the log publishes partial writes one extent at a time there)");
    }

    if !args.json {
        eprintln!(
            "bench fio: local 4k O_DIRECT write + fdatasync in {}",
            log_parent.display()
        );
    }
    let fdatasync_us = local_fdatasync_us(log_parent, args.burst_seconds.min(5))?;

    let nbdkit = if args.no_nbdkit {
        None
    } else {
        let (mut kit, addr) = start_nbdkit(args.size)?;
        if !args.json {
            eprintln!("bench fio: nbdkit memory: 4k randwrite QD16");
        }
        let m = measure(
            &Engine::nbd(&format!("nbd://{addr}")),
            &point("4k", "randwrite", 16),
            Timing {
                runtime_seconds: args.burst_seconds,
                ramp_seconds: 0,
            },
            None,
        )?;
        kit.stop();
        Some(m.figures)
    };

    // Write-through (prefilled first, so both sides write over existing objects).
    let mut flags = Vec::new();
    if args.no_coalesce {
        flags.push("--no-coalesce");
    }
    let (mut nbd, uri) = spindle_nbd_child(&args.target, &args.pool, &args.image, &flags, "nbd")?;
    let engine = Engine::nbd(&uri);
    if !args.no_prefill {
        if !args.json {
            eprintln!("bench fio: prefilling {uri}");
        }
        prefill(&engine).context("prefill of the Spindle image")?;
    }
    let write_through = measure_side("write-through", &engine, None, args)?;
    nbd.stop();

    let dir_arg = log_dir.0.to_string_lossy().into_owned();
    let mut log_flags = flags.clone();
    log_flags.extend([
        "--write-log",
        &dir_arg,
        "--write-log-size",
        &args.write_log_size,
    ]);
    let (mut nbd, uri) = spindle_nbd_child(
        &args.target,
        &args.pool,
        &args.image,
        &log_flags,
        "nbd-wlog",
    )?;
    let stats = spindle_image::wlog::stats_path(&spindle_image::wlog::log_path(
        &log_dir.0,
        &args.pool,
        &args.image,
    ));
    let write_log = measure_side("write log", &Engine::nbd(&uri), Some(&stats), args)?;
    nbd.stop();

    let offload = match &args.agent_cpus {
        Some(agent_cpus) => Some(offload::measure(
            args,
            agent_cpus,
            log_parent,
            &cluster_procs,
        )?),
        None => None,
    };
    let mut results = results(&write_log, &write_through, nbdkit.as_ref(), fdatasync_us);
    if let Some(o) = &offload {
        results.push(crate::common::BenchResult::lower_is_better(
            "write log + agent: co-runner slowdown",
            "%",
            o.slowdown_log_pct,
            "write-through",
            o.slowdown_write_through_pct,
        ));
    }
    let report = Report {
        offload: offload.clone(),
        bench: "fio --write-log",
        log_bytes,
        burst_seconds: args.burst_seconds,
        sustained_seconds: args.sustained_seconds,
        local_fdatasync_4k_us: fdatasync_us,
        nbdkit_memory_4k_randwrite_qd16: nbdkit,
        write_through,
        write_log,
        results,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("bench fio: cannot remove {}: {e}", self.0.display());
        }
    }
}

fn results(
    log: &Side,
    wt: &Side,
    nbdkit: Option<&Figures>,
    fdatasync_us: f64,
) -> Vec<crate::common::BenchResult> {
    use crate::common::BenchResult;
    let mut r = Vec::new();
    if let Some(k) = nbdkit {
        r.push(BenchResult::higher_is_better(
            "write log: 4k randwrite QD16 burst",
            "IOPS",
            log.burst_qd16.iops,
            "nbdkit memory",
            k.iops,
        ));
    }
    r.push(BenchResult::higher_is_better(
        "write log: 4k randwrite QD16 sustained",
        "IOPS",
        log.sustained_qd16.iops,
        "write-through",
        wt.sustained_qd16.iops,
    ));
    r.push(BenchResult::lower_is_better(
        "write log: 4k randwrite QD1 mean latency",
        "us",
        log.qd1.clat_mean_us,
        "local 4k write + fdatasync",
        fdatasync_us,
    ));
    r
}

fn print_report(r: &Report) {
    let log = &r.write_log;
    let wt = &r.write_through;
    println!(
        "spindle bench fio --write-log: log of {} MiB, bursts of {} s, sustained {} s",
        r.log_bytes >> 20,
        r.burst_seconds,
        r.sustained_seconds
    );
    println!();
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        "point", "write-through", "write log", "log/wt"
    );
    let row = |name: &str, a: f64, b: f64, unit: &str| {
        println!(
            "{:<34} {:>11.0} {unit:<2} {:>11.0} {unit:<2} {:>7.2}x",
            name,
            a,
            b,
            b / a
        );
    };
    row(
        "4k randwrite QD16 burst IOPS",
        wt.burst_qd16.iops,
        log.burst_qd16.iops,
        "",
    );
    row(
        "4k randwrite QD16 sustained IOPS",
        wt.sustained_qd16.iops,
        log.sustained_qd16.iops,
        "",
    );
    row(
        "4k randwrite QD1 mean us",
        wt.qd1.clat_mean_us,
        log.qd1.clat_mean_us,
        "",
    );
    row("4k randwrite QD1 IOPS", wt.qd1.iops, log.qd1.iops, "");
    row(
        "512k write QD16 MB/s",
        wt.seq_512k.mb_per_s,
        log.seq_512k.mb_per_s,
        "",
    );
    row(
        "FLUSH mean us (every 8 writes)",
        wt.flush_mean_us,
        log.flush_mean_us,
        "",
    );
    row("FLUSH p99 us", wt.flush_p99_us, log.flush_p99_us, "");
    println!();
    if let (Some(p), Some(a), Some(w), Some(e), Some(d)) = (
        log.publish_mb_per_s,
        log.append_mb_per_s,
        log.publish_object_writes_per_s,
        log.publish_extents_per_write,
        log.drain_seconds,
    ) {
        println!(
            "publishing over the sustained run: {p:.1} MB/s published for {a:.1} MB/s logged; \
             {w:.0} object writes/s, {e:.1} extents per write; drained {d:.1} s after it"
        );
    }
    println!(
        "local 4k O_DIRECT write + fdatasync: {:.0} us",
        r.local_fdatasync_4k_us
    );
    if let Some(k) = &r.nbdkit_memory_4k_randwrite_qd16 {
        println!("nbdkit memory 4k randwrite QD16: {:.0} IOPS", k.iops);
    }
    println!();
    println!("targets (issue: persist and publish):");
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    if let Some(k) = &r.nbdkit_memory_4k_randwrite_qd16 {
        let x = log.burst_qd16.iops / k.iops;
        println!(
            "  burst 4k randwrite QD16 >= 0.30 x nbdkit memory: {x:.3} x  {}",
            verdict(x >= 0.30)
        );
    }
    let x = log.sustained_qd16.iops / wt.sustained_qd16.iops;
    println!(
        "  sustained >= 1.5 x write-through:                {x:.2} x  {}",
        verdict(x >= 1.5)
    );
    let x = log.qd1.clat_mean_us / r.local_fdatasync_4k_us;
    println!(
        "  QD1 write latency <= 2 x local write+fdatasync:  {x:.2} x  {}",
        verdict(x <= 2.0)
    );
    if let Some(o) = &r.offload {
        println!(
            "  co-runner slowdown with agent <= 1/2 write-through's: {:.1} % vs {:.1} %  {}",
            o.slowdown_log_pct,
            o.slowdown_write_through_pct,
            verdict(o.slowdown_log_pct <= o.slowdown_write_through_pct / 2.0)
        );
        println!();
        println!(
            "offload (app CPUs {}, agent + daemons on CPUs {}, stream {} IOPS 4k randwrite QD16, {} s):",
            o.app_cpus, o.agent_cpus, o.stream_iops, o.seconds
        );
        println!(
            "  co-runner alone {:.0} loops/s; with write-through {:.0} ({:.1} % slower); with the log + agent {:.0} ({:.1} % slower)",
            o.corunner_alone_per_s,
            o.corunner_write_through_per_s,
            o.slowdown_write_through_pct,
            o.corunner_log_per_s,
            o.slowdown_log_pct
        );
        println!(
            "  spindle nbd CPU per write: write-through {:.1} us, log {:.1} us (its NBD thread, on the application CPUs: {:.1} / {:.1} us; the log writer thread runs on the agent's CPUs); agent {:.1} us per write",
            o.nbd_cpu_us_per_write_write_through,
            o.nbd_cpu_us_per_write_log,
            o.nbd_main_thread_us_per_write_write_through,
            o.nbd_main_thread_us_per_write_log,
            o.agent_cpu_us_per_write,
        );
        println!(
            "  stream achieved {:.0} (write-through) / {:.0} (log) IOPS",
            o.stream_iops_write_through, o.stream_iops_log
        );
    }
}

/// The offload measurement (LineFS): a co-runner's slowdown beside a write stream.
mod offload {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::sync::atomic::AtomicU64;

    #[derive(Debug, Clone, Serialize)]
    pub(super) struct Offload {
        pub(super) app_cpus: String,
        pub(super) agent_cpus: String,
        pub(super) stream_iops: u64,
        pub(super) seconds: u64,
        pub(super) corunner_alone_per_s: f64,
        pub(super) corunner_write_through_per_s: f64,
        pub(super) corunner_log_per_s: f64,
        pub(super) slowdown_write_through_pct: f64,
        pub(super) slowdown_log_pct: f64,
        pub(super) nbd_cpu_us_per_write_write_through: f64,
        pub(super) nbd_cpu_us_per_write_log: f64,
        pub(super) nbd_main_thread_us_per_write_write_through: f64,
        pub(super) nbd_main_thread_us_per_write_log: f64,
        pub(super) agent_cpu_us_per_write: f64,
        pub(super) stream_iops_write_through: f64,
        pub(super) stream_iops_log: f64,
    }

    use spindle_image::wlog::agent::{parse_cpus, pin_thread};

    fn parse(list: &str) -> anyhow::Result<Vec<usize>> {
        parse_cpus(list).map_err(|e| anyhow::anyhow!(e))
    }

    /// Pins every thread of process `pid` to `cpus`.
    fn pin_process(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let tid: i32 = t?.file_name().to_string_lossy().parse()?;
            // A thread that just exited fails harmlessly.
            let _ = pin_thread(tid, cpus);
        }
        Ok(())
    }

    /// A command that starts pinned to `cpus` (every thread it makes inherits the mask).
    fn pinned(mut cmd: Command, cpus: &[usize]) -> Command {
        let cpus = cpus.to_vec();
        // SAFETY: the closure runs between fork and exec; `pin_thread` allocates nothing
        // and only calls sched_setaffinity(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || pin_thread(0, &cpus));
        }
        cmd
    }

    /// The co-runner: a fixed compute loop on `cpus` for `seconds`; loops per second.
    fn corunner(
        cpus: Vec<usize>,
        seconds: f64,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<f64> {
        std::thread::spawn(move || {
            if let Err(e) = pin_thread(0, &cpus) {
                eprintln!("bench fio: cannot pin the co-runner to {cpus:?}: {e}");
            }
            let loops = AtomicU64::new(0);
            let start = Instant::now();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            while start.elapsed().as_secs_f64() < seconds && !stop.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                }
                loops.fetch_add(1, Ordering::Relaxed);
            }
            std::hint::black_box(x);
            loops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
        })
    }

    /// What one side of the offload measurement found.
    struct SideCpu {
        corunner_per_s: f64,
        iops: f64,
        /// The whole `spindle nbd` process, and its main thread (the one that serves NBD:
        /// it stays on the application's CPUs).
        nbd_us_per_write: f64,
        nbd_main_us_per_write: f64,
        agent_us_per_write: f64,
    }

    /// User + system time of process `pid`'s main thread.
    fn main_thread_cpu_us(pid: u32) -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat"))?;
        let ticks = proc_cpu::stat_cpu_ticks(&stat)?;
        Ok(proc_cpu::ticks_to_us(
            ticks,
            proc_cpu::clock_ticks_per_second(),
        ))
    }

    /// The stream beside the co-runner.
    fn side(
        args: &BenchFioArgs,
        app: &[usize],
        uri: &str,
        nbd_pid: u32,
        agent_pid: Option<u32>,
        seconds: u64,
    ) -> anyhow::Result<SideCpu> {
        let cpu = |pid: Option<u32>| pid.map_or(Ok(0), proc_cpu::process_cpu_us);
        let (nbd0, agent0) = (cpu(Some(nbd_pid))?, cpu(agent_pid)?);
        let main0 = main_thread_cpu_us(nbd_pid)?;
        let stop = Arc::new(AtomicBool::new(false));
        let co = corunner(app.to_vec(), seconds as f64 + 1.0, stop.clone());
        std::thread::sleep(Duration::from_millis(500));
        let cpus_allowed = app
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let fio_args: Vec<String> = vec![
            "--name=stream".into(),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--bs=4k".into(),
            "--rw=randwrite".into(),
            "--iodepth=16".into(),
            "--direct=1".into(),
            format!("--rate_iops={}", args.stream_iops),
            format!("--cpus_allowed={cpus_allowed}"),
            "--time_based=1".into(),
            format!("--runtime={seconds}"),
            "--norandommap=1".into(),
            "--randrepeat=0".into(),
        ];
        let v = fio_json(&fio_args, &[]);
        stop.store(true, Ordering::Relaxed);
        let loops_per_s = co
            .join()
            .map_err(|_| anyhow::anyhow!("co-runner panicked"))?;
        let v = v?;
        let w = &v["jobs"][0]["write"];
        let ios = w["total_ios"].as_u64().unwrap_or(0) as f64;
        let iops = w["iops"].as_f64().unwrap_or(f64::NAN);
        if ios == 0.0 {
            bail!("the stream wrote nothing: {v}");
        }
        let (nbd1, agent1) = (cpu(Some(nbd_pid))?, cpu(agent_pid)?);
        let main1 = main_thread_cpu_us(nbd_pid)?;
        Ok(SideCpu {
            corunner_per_s: loops_per_s,
            iops,
            nbd_us_per_write: nbd1.saturating_sub(nbd0) as f64 / ios,
            nbd_main_us_per_write: main1.saturating_sub(main0) as f64 / ios,
            agent_us_per_write: agent1.saturating_sub(agent0) as f64 / ios,
        })
    }

    fn nbd_cmd(args: &BenchFioArgs, addr: SocketAddr, extra: &[&str]) -> anyhow::Result<Command> {
        let exe = std::env::current_exe().context("cannot find the spindle binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg("nbd")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--pool")
            .arg(&args.pool)
            .arg("--dir")
            .arg(&args.target.dir)
            .args(extra);
        if let Some(mon) = &args.target.mon {
            cmd.arg("--mon").arg(mon);
        }
        Ok(cmd)
    }

    pub(super) fn measure(
        args: &BenchFioArgs,
        agent_cpus: &str,
        log_parent: &Path,
        cluster: &[Proc],
    ) -> anyhow::Result<Offload> {
        let (app, agent) = (parse(&args.app_cpus)?, parse(agent_cpus)?);
        if app.iter().any(|c| agent.contains(c)) {
            bail!("--app-cpus and --agent-cpus overlap");
        }
        let seconds = args.burst_seconds.max(10);
        // The cluster stands for the remote side: its daemons move to the agent's CPUs
        // (and back to every CPU afterwards).
        for p in cluster {
            pin_process(p.pid, &agent)?;
        }
        let all: Vec<usize> =
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        let restore = || {
            for p in cluster {
                let _ = pin_process(p.pid, &all);
            }
        };
        let r = (|| -> anyhow::Result<Offload> {
            if !args.json {
                eprintln!(
                    "bench fio: offload: the co-runner alone on CPUs {}",
                    args.app_cpus
                );
            }
            let alone = corunner(
                app.clone(),
                seconds as f64,
                Arc::new(AtomicBool::new(false)),
            )
            .join()
            .map_err(|_| anyhow::anyhow!("co-runner panicked"))?;

            if !args.json {
                eprintln!("bench fio: offload: write-through stream + co-runner");
            }
            let addr = free_port()?;
            let mut nbd = ChildGuard::start(
                pinned(nbd_cmd(args, addr, &[])?, &app),
                "spindle nbd",
                "nbd-offload",
            )?;
            nbd.wait_listening(addr)?;
            let uri = format!("nbd://{addr}/{}", args.image);
            let wt = side(args, &app, &uri, nbd.child.id(), None, seconds)?;
            nbd.stop();

            if !args.json {
                eprintln!("bench fio: offload: write log + agent stream + co-runner");
            }
            let dir =
                TempDir(log_parent.join(format!("spindle-bench-agent-{}", std::process::id())));
            std::fs::create_dir_all(&dir.0)?;
            let exe = std::env::current_exe().context("cannot find the spindle binary")?;
            let mut agent_cmd = Command::new(exe);
            agent_cmd
                .arg("agent")
                .arg("--write-log")
                .arg(&dir.0)
                .arg("--cpus")
                .arg(agent_cpus)
                .arg("--dir")
                .arg(&args.target.dir);
            if let Some(mon) = &args.target.mon {
                agent_cmd.arg("--mon").arg(mon);
            }
            let mut agent_proc = ChildGuard::start(agent_cmd, "spindle agent", "agent")?;
            let lock = spindle_image::wlog::agent::agent_lock_path(&dir.0);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !spindle_image::wlog::agent::agent_serving(&dir.0) {
                if Instant::now() > deadline {
                    bail!("spindle agent did not take {} in 30 s", lock.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let dir_arg = dir.0.to_string_lossy().into_owned();
            let addr = free_port()?;
            let mut nbd = ChildGuard::start(
                pinned(
                    nbd_cmd(
                        args,
                        addr,
                        &[
                            "--write-log",
                            &dir_arg,
                            "--write-log-size",
                            &args.write_log_size,
                        ],
                    )?,
                    &app,
                ),
                "spindle nbd",
                "nbd-offload-log",
            )?;
            nbd.wait_listening(addr)?;
            let uri = format!("nbd://{addr}/{}", args.image);
            let lg = side(
                args,
                &app,
                &uri,
                nbd.child.id(),
                Some(agent_proc.child.id()),
                seconds,
            )?;
            nbd.stop();
            agent_proc.stop();
            let slow = |x: f64| 100.0 * (1.0 - x / alone);
            Ok(Offload {
                app_cpus: args.app_cpus.clone(),
                agent_cpus: agent_cpus.to_string(),
                stream_iops: args.stream_iops,
                seconds,
                corunner_alone_per_s: alone,
                corunner_write_through_per_s: wt.corunner_per_s,
                corunner_log_per_s: lg.corunner_per_s,
                slowdown_write_through_pct: slow(wt.corunner_per_s),
                slowdown_log_pct: slow(lg.corunner_per_s),
                nbd_cpu_us_per_write_write_through: wt.nbd_us_per_write,
                nbd_cpu_us_per_write_log: lg.nbd_us_per_write,
                nbd_main_thread_us_per_write_write_through: wt.nbd_main_us_per_write,
                nbd_main_thread_us_per_write_log: lg.nbd_main_us_per_write,
                agent_cpu_us_per_write: lg.agent_us_per_write,
                stream_iops_write_through: wt.iops,
                stream_iops_log: lg.iops,
            })
        })();
        restore();
        r
    }
}
