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
    let (shape, _) = runtime()?.block_on(ensure_image(args))?;
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
        .arg(args.size.to_string());
        let mut kit = ChildGuard::start(cmd, "nbdkit memory", "nbdkit")?;
        kit.wait_listening(addr)?;
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

    let results = results(&write_log, &write_through, nbdkit.as_ref(), fdatasync_us);
    let report = Report {
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
}
