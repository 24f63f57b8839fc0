//! `spindle bench soak`: a long-running process must hold its descriptors and memory flat.
//!
//! Runs a mixed workload of many short-lived clients against a running embedded cluster:
//! each client connects (monitor connection and map subscription, then connections to the
//! daemons), writes a small object under a name never used before, reads it back and
//! checks it, stats it, deletes the object written a window of clients earlier, asks the
//! monitor for the cluster status, and disconnects. After a warm-up (caches, logs and
//! allocator pools reach their size) it samples the descriptors and resident memory of the
//! monitor, every storage daemon and, when `DIR/nbd.pid` names one, the NBD server, once a
//! second, and at the end prints their growth per 1,000 operations (descriptors: end minus
//! warm-up; memory: the least-squares slope of RSS over operations) beside the target
//! (issue #16: zero descriptors, under 1 KiB of memory per 1,000 operations).

use crate::common::{print_report, BenchResult};
use anyhow::{bail, Context};
use clap::Args;
use spindle_client::{Client, ClientConfig};
use spindle_cluster::Target;
use spindle_mon::Admin;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BenchSoakArgs {
    /// Pool to write into. Default: a scratch pool of `--pg-count` groups, created for the
    /// run and removed after it (few groups, so that their logs, a bounded cache of 4,096
    /// entries per group, are full before the warm-up ends).
    #[arg(long)]
    pub pool: Option<String>,
    /// Placement groups of the scratch pool.
    #[arg(long, default_value_t = 4)]
    pub pg_count: u32,
    /// Total running time (the first fifth, at least 5 s, is warm-up).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Short-lived clients running at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Size of each object written.
    #[arg(long, default_value_t = 4096)]
    pub object_bytes: usize,
    /// Objects kept alive: each client deletes the object written this many clients ago.
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// Target of the issue: resident memory growth per 1,000 operations after warm-up.
const RSS_GROWTH_KIB_PER_1000_OPS_TARGET: f64 = 1.0;

#[derive(Clone, Debug)]
struct Proc {
    name: String,
    pid: i32,
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    fds: u64,
    rss_kib: u64,
}

fn sample(pid: i32) -> anyhow::Result<Sample> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("cannot read the descriptors of pid {pid}"))?
        .count() as u64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(Sample { fds, rss_kib })
}

fn read_pid(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The processes of the embedded cluster in `--dir` (monitor, daemons, NBD server).
async fn processes(client: &Client, target: &Target) -> anyhow::Result<Vec<Proc>> {
    let mut procs = Vec::new();
    match read_pid(&target.dir.join("mon").join("pid")) {
        Some(pid) => procs.push(Proc {
            name: "mon".into(),
            pid,
        }),
        None => bail!(
            "no monitor pid in {}: bench soak measures the processes of an embedded cluster \
             (spindle up --dir DIR)",
            target.dir.display()
        ),
    }
    for osd in client.map().osds.values() {
        if osd.up && osd.pid != 0 {
            procs.push(Proc {
                name: format!("osd.{}", osd.id),
                pid: osd.pid as i32,
            });
        }
    }
    if let Some(pid) = read_pid(&target.dir.join("nbd.pid")) {
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            procs.push(Proc {
                name: "nbd".into(),
                pid,
            });
        }
    }
    Ok(procs)
}

/// Least-squares slope of y over x (0 with fewer than two distinct x).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// Deterministic content of object number `i`.
fn content(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn object_name(run: u64, i: u64) -> String {
    format!("soak.{run:016x}.{i:012}")
}

struct Shared {
    args_pool: String,
    object_bytes: usize,
    window: usize,
    run: u64,
    /// Monitors and identity of every client.
    config: ClientConfig,
    next: AtomicU64,
    ops: AtomicU64,
    clients: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
    /// Objects written and not yet deleted, oldest first.
    live: Mutex<VecDeque<u64>>,
    first_error: Mutex<Option<String>>,
}

/// One short-lived client's work; returns the operations it did.
async fn one_client(sh: &Shared) -> anyhow::Result<u64> {
    let client = Client::connect(sh.config.clone()).await?;
    let i = sh.next.fetch_add(1, Ordering::Relaxed);
    let name = object_name(sh.run, i);
    let data = content(i, sh.object_bytes);
    client
        .write_full(&sh.args_pool, &name, data.clone())
        .await?;
    let back = client
        .read(&sh.args_pool, &name, 0, sh.object_bytes as u64)
        .await?;
    if back != data {
        bail!("{name}: read back different bytes");
    }
    client.stat(&sh.args_pool, &name).await?;
    let old = {
        let mut live = sh.live.lock().unwrap_or_else(|p| p.into_inner());
        live.push_back(i);
        if live.len() > sh.window {
            live.pop_front()
        } else {
            None
        }
    };
    let mut ops = 3;
    if let Some(old) = old {
        client
            .delete(&sh.args_pool, &object_name(sh.run, old))
            .await?;
        ops += 1;
    }
    spindle_cluster::admin(&client, Admin::status()).await?;
    Ok(ops + 1)
}

pub fn run(args: BenchSoakArgs) -> anyhow::Result<()> {
    let rt = spindle_cluster::runtime()?;
    rt.block_on(run_async(args))
}

async fn run_async(args: BenchSoakArgs) -> anyhow::Result<()> {
    if args.seconds < 10 {
        bail!("--seconds must be at least 10 (the first fifth is warm-up)");
    }
    let config = args.target.client_config()?;
    let probe = Client::connect(config.clone()).await?;
    let scratch = args.pool.is_none();
    let pool = match &args.pool {
        Some(p) => {
            if !probe.map().pools.values().any(|x| &x.name == p) {
                bail!("no pool named {p}");
            }
            p.clone()
        }
        None => {
            let name = format!("soak-{}", std::process::id());
            let r = spindle_cluster::admin(&probe, Admin::pool_create(&name, 3, 2, args.pg_count))
                .await
                .context("cannot create the scratch pool")?;
            probe.wait_for_epoch(r.epoch, 10_000).await;
            // Wait until its groups are active (a write would wait for them anyway).
            tokio::time::sleep(Duration::from_secs(2)).await;
            name
        }
    };
    let procs = processes(&probe, &args.target).await?;
    let result = soak(&args, config, pool.clone(), procs).await;
    if scratch {
        if let Err(e) = spindle_cluster::admin(&probe, Admin::pool_rm(&pool)).await {
            eprintln!("bench soak: could not remove the scratch pool {pool}: {e}");
        }
    }
    result
}

async fn soak(
    args: &BenchSoakArgs,
    config: ClientConfig,
    pool: String,
    procs: Vec<Proc>,
) -> anyhow::Result<()> {
    let sh = Arc::new(Shared {
        args_pool: pool.clone(),
        object_bytes: args.object_bytes,
        window: args.window.max(1),
        // Names unique to this run: pid and start time.
        run: (std::process::id() as u64) << 32
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() & 0xffff_ffff),
        config,
        next: AtomicU64::new(0),
        ops: AtomicU64::new(0),
        clients: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        live: Mutex::new(VecDeque::new()),
        first_error: Mutex::new(None),
    });
    let start_samples: Vec<Sample> = procs
        .iter()
        .map(|p| sample(p.pid))
        .collect::<anyhow::Result<_>>()?;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let sh = sh.clone();
        workers.spawn(async move {
            while !sh.stop.load(Ordering::Relaxed) {
                match one_client(&sh).await {
                    Ok(n) => {
                        sh.ops.fetch_add(n, Ordering::Relaxed);
                        sh.clients.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        sh.errors.fetch_add(1, Ordering::Relaxed);
                        let mut first = sh.first_error.lock().unwrap_or_else(|p| p.into_inner());
                        first.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
        });
    }
    let total = Duration::from_secs(args.seconds);
    let warmup = (total / 5).max(Duration::from_secs(5));
    let t_start = Instant::now();
    let progress = |msg: String| {
        if !args.json {
            eprintln!("bench soak: {msg}");
        }
    };
    progress(format!(
        "{} processes, {} clients at once, warm-up {} s of {} s",
        procs.len(),
        args.concurrency,
        warmup.as_secs(),
        args.seconds
    ));
    tokio::time::sleep(warmup).await;
    let ops_warm = sh.ops.load(Ordering::Relaxed);
    let warm_samples: Vec<Sample> = procs
        .iter()
        .map(|p| sample(p.pid))
        .collect::<anyhow::Result<_>>()?;
    let mut next_report = Instant::now() + Duration::from_secs(10);
    // (operations so far, RSS of each process) once a second after warm-up: the growth is
    // the least-squares slope over all of them, so bounded caches that fill and drain (and
    // the heap trims after churn) do not make two unlucky end points look like a leak.
    let mut series: Vec<(f64, Vec<f64>)> = Vec::new();
    let mut next_sample = Instant::now();
    while t_start.elapsed() < total {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let ops = sh.ops.load(Ordering::Relaxed) as f64;
            let rss: Vec<f64> = procs
                .iter()
                .map(|p| sample(p.pid).map_or(f64::NAN, |s| s.rss_kib as f64))
                .collect();
            series.push((ops, rss));
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(10);
            progress(format!(
                "{:.0} s: {} clients, {} operations, {} errors",
                t_start.elapsed().as_secs_f64(),
                sh.clients.load(Ordering::Relaxed),
                sh.ops.load(Ordering::Relaxed),
                sh.errors.load(Ordering::Relaxed)
            ));
        }
    }
    sh.stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}
    let ops_end = sh.ops.load(Ordering::Relaxed);
    let elapsed_s = t_start.elapsed().as_secs_f64();
    // Let the servers notice the last disconnects before sampling.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end_samples: Vec<Sample> = procs
        .iter()
        .map(|p| sample(p.pid))
        .collect::<anyhow::Result<_>>()?;
    // Clean up the objects still alive (not measured).
    if let Ok(client) = Client::connect(sh.config.clone()).await {
        let live: Vec<u64> = sh
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for i in live {
            let _ = client.delete(&pool, &object_name(sh.run, i)).await;
        }
    }

    let measured_ops = ops_end.saturating_sub(ops_warm).max(1) as f64;
    let errors = sh.errors.load(Ordering::Relaxed);
    if !args.json {
        println!(
            "{} short-lived clients, {} operations in {:.1} s ({:.0} ops/s), {} errors",
            sh.clients.load(Ordering::Relaxed),
            ops_end,
            elapsed_s,
            ops_end as f64 / elapsed_s,
            errors
        );
        println!(
            "{:<8} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>16}",
            "process",
            "fds start",
            "fds warm",
            "fds end",
            "RSS start",
            "RSS warm",
            "RSS end",
            "KiB/1000 ops (fit)"
        );
    }
    let mut results = Vec::new();
    for (idx, ((p, s0), (w, e))) in procs
        .iter()
        .zip(&start_samples)
        .zip(warm_samples.iter().zip(&end_samples))
        .enumerate()
    {
        let fd_growth = e.fds as f64 - w.fds as f64;
        let points: Vec<(f64, f64)> = series
            .iter()
            .map(|(ops, rss)| (*ops, rss[idx]))
            .filter(|(_, r)| r.is_finite())
            .collect();
        let rss_growth_per_1000 = slope(&points) * 1000.0;
        if !args.json {
            println!(
                "{:<8} {:>9} {:>9} {:>9} {:>9} KiB {:>8} KiB {:>8} KiB {:>16.3}",
                p.name, s0.fds, w.fds, e.fds, s0.rss_kib, w.rss_kib, e.rss_kib, rss_growth_per_1000
            );
        }
        results.push(BenchResult {
            name: format!("{} descriptor growth after warm-up", p.name),
            unit: "descriptors".into(),
            spindle: fd_growth,
            reference: "target: no growth".into(),
            reference_value: 0.0,
            // 1 when there is no growth, below 1 as it grows.
            ratio: 1.0 / (1.0 + fd_growth.max(0.0)),
        });
        results.push(BenchResult {
            name: format!("{} RSS growth per 1000 ops after warm-up", p.name),
            unit: "KiB".into(),
            spindle: rss_growth_per_1000,
            reference: "target: under 1 KiB".into(),
            reference_value: RSS_GROWTH_KIB_PER_1000_OPS_TARGET,
            // Growth of at most one page over the run counts as none.
            ratio: RSS_GROWTH_KIB_PER_1000_OPS_TARGET
                / rss_growth_per_1000.max(4.0 / measured_ops * 1000.0),
        });
    }
    if !args.json {
        println!();
    }
    print_report("soak", &results, args.json)?;
    if errors > 0 {
        let first = sh
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        bail!("{errors} client runs failed; the first: {first}");
    }
    Ok(())
}
