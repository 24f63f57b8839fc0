//! `spindle bench recovery`: how fast redundancy comes back after a daemon is lost, and
//! what that costs the clients.
//!
//! On a fresh embedded cluster in a scratch directory (never the user's cluster: daemons
//! are killed): fill it with 1 MiB objects, then
//! 1. without client load: kill a daemon, mark it out, time recovery to clean -> recovery
//!    MB/s, compared with the disk's own sequential O_DIRECT write bandwidth measured in
//!    the same run (target: at least 50 %);
//! 2. with a 4 KiB random-write client load (N in flight): measure ops/s and p99 before,
//!    kill a second daemon and mark it out, measure during recovery and after it (target:
//!    ops/s during recovery at least 70 % of before).

use crate::common::{print_report, BenchResult};
use clap::Args;
use spindle_client::Client;
use spindle_cluster::{self as cluster_cmd, admin, SettingsArgs, Target, UpArgs};
use spindle_mon::{Admin, OsdVerb, Status};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BenchRecoveryArgs {
    /// Scratch directory for the benchmark's own cluster (removed afterwards unless --keep).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// Storage daemons of the benchmark cluster.
    #[arg(long, default_value_t = 5)]
    pub osds: u32,
    /// Data written before the failures (1 MiB objects, 3 copies each).
    #[arg(long, default_value_t = 3072)]
    pub fill_mib: u64,
    /// Length of the before and after windows of the loaded run.
    #[arg(long, default_value_t = 8)]
    pub phase_seconds: u64,
    /// Client operations in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Background recovery: objects each daemon recovers at once.
    #[arg(long, default_value_t = 2)]
    pub recovery_ops_max: usize,
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
}

const PAGE: usize = 4096;

/// Sequential O_DIRECT write bandwidth of the file system holding `dir` (MB/s), with
/// 1 MiB writes from 2 threads and a final fdatasync: the disk's ceiling for recovery.
fn disk_write_mbps(dir: &Path, total_bytes: u64) -> anyhow::Result<f64> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let threads = 2u64;
    let per_thread = total_bytes / threads;
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let path = dir.join(format!("disk-probe-{t}"));
            std::thread::spawn(move || -> std::io::Result<()> {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&path)?;
                let block = 1usize << 20;
                let layout = std::alloc::Layout::from_size_align(block, PAGE)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                // SAFETY: layout is non-zero sized; freed below with the same layout.
                let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                if ptr.is_null() {
                    return Err(std::io::Error::other("out of memory"));
                }
                // SAFETY: ptr points to `block` initialised bytes owned here.
                let buf = unsafe { std::slice::from_raw_parts_mut(ptr, block) };
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = (i as u64 * 31 + t) as u8);
                let mut off = 0u64;
                let mut result = Ok(());
                while off < per_thread {
                    if let Err(e) = f.write_all_at(buf, off) {
                        result = Err(e);
                        break;
                    }
                    off += block as u64;
                }
                // SAFETY: allocated above with this layout.
                unsafe { std::alloc::dealloc(ptr, layout) };
                result?;
                f.sync_data()?;
                drop(f);
                std::fs::remove_file(&path)
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("disk probe thread panicked"))??;
    }
    Ok(total_bytes as f64 / start.elapsed().as_secs_f64() / 1e6)
}

fn recovered_bytes(status: &Status) -> u64 {
    status
        .osds
        .iter()
        .map(|o| o.counters.get("recovered_bytes").copied().unwrap_or(0))
        .sum()
}

fn clean(status: &Status) -> bool {
    let pgs = status.pools.first().map_or(0, |p| p.pg_count as u64);
    status.pgs.get("clean").copied() == Some(pgs) && status.recovery.objects_left == 0
}

/// Kills daemon `id` of the scratch cluster (SIGKILL) and marks it out; returns when the
/// monitor has published the change.
async fn fail_daemon(client: &Client, dir: &Path, id: u32) -> anyhow::Result<()> {
    let pid: i32 = std::fs::read_to_string(dir.join(format!("osd.{id}")).join("pid"))?
        .trim()
        .parse()?;
    // SAFETY: kill(2) of a daemon of the benchmark's own scratch cluster.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    admin(client, Admin::osd(OsdVerb::Out, id)).await?;
    admin(client, Admin::osd(OsdVerb::Down, id)).await?;
    Ok(())
}

/// Waits for clean; returns (seconds, recovered bytes) since `t0` / `bytes0`.
async fn wait_recovered(
    client: &Client,
    t0: Instant,
    bytes0: u64,
    timeout: Duration,
) -> anyhow::Result<(f64, u64)> {
    // Heartbeats carry the state every 400 ms: a status from before the failure reached
    // the primaries can still say clean, so first wait until recovery is seen (placement
    // groups not clean, or recovered bytes moving), then until clean.
    let mut started = false;
    loop {
        let s = admin(client, Admin::status()).await?;
        let moved = recovered_bytes(&s) > bytes0;
        if !started && (!clean(&s) || moved) {
            started = true;
        }
        if started && clean(&s) {
            return Ok((t0.elapsed().as_secs_f64(), recovered_bytes(&s) - bytes0));
        }
        if t0.elapsed() > timeout {
            anyhow::bail!(
                "recovery did not finish in {} s: {}",
                timeout.as_secs(),
                serde_json::to_string(&s.pgs)?
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Latencies (µs) of completed client writes, per phase.
struct Load {
    stop: AtomicBool,
    phase: AtomicUsize,
    lat_us: Mutex<[Vec<u64>; 3]>,
}

fn p99_ms(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1);
    v.get(i).copied().unwrap_or(0) as f64 / 1000.0
}

pub fn run(args: BenchRecoveryArgs) -> anyhow::Result<()> {
    if args.osds < 5 {
        anyhow::bail!("--osds must be at least 5 (two daemons are lost, 3 copies are kept)");
    }
    crate::common::in_scratch_cluster("recovery", args.scratch.clone(), args.keep, |scratch| {
        run_in(&args, scratch)
    })
}

fn run_in(args: &BenchRecoveryArgs, scratch: &Path) -> anyhow::Result<()> {
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("bench recovery: {msg}");
            let _ = std::io::stderr().flush();
        }
    };
    progress("measuring the disk's sequential write bandwidth");
    let disk_mbps = disk_write_mbps(scratch, 512 << 20)?;
    progress("starting a scratch cluster");
    cluster_cmd::up_quiet(UpArgs {
        no_auth: false,
        mons: Some(1),
        osds: args.osds,
        pg_count: 64,
        wait_seconds: 60,
        settings: SettingsArgs {
            out_after_ms: Some(0),
            down_after_ms: None,
            recovery_ops_max: Some(args.recovery_ops_max),
            recovery_bytes_per_sec: Some(0),
            scrub_interval_ms: Some(0),
            encrypt: None,
            metrics: None,
            ..SettingsArgs::default()
        },
        target: Target {
            dir: scratch.to_path_buf(),
            mon: None,
            keyring: None,
            entity: "client.admin".into(),
        },
    })?;
    let target = Target {
        dir: scratch.to_path_buf(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    let rt = spindle_cluster::runtime()?;
    rt.block_on(async {
        let client = target.client().await?;
        progress(&format!("writing {} MiB of 1 MiB objects", args.fill_mib));
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let client = client.clone();
            let next = next.clone();
            let n = args.fill_mib as usize;
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return anyhow::Ok(());
                    }
                    let data = vec![(i % 251) as u8; 1 << 20];
                    client
                        .write_full("default", &format!("fill-{i}"), data)
                        .await?;
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        let timeout = Duration::from_secs(300);
        // 1. No client load.
        progress("failing osd.1 without client load");
        let b0 = recovered_bytes(&admin(&client, Admin::status()).await?);
        let t0 = Instant::now();
        fail_daemon(&client, scratch, 1).await?;
        let (idle_secs, idle_bytes) = wait_recovered(&client, t0, b0, timeout).await?;
        let idle_mbps = idle_bytes as f64 / idle_secs / 1e6;
        // 2. With a 4 KiB random-write load.
        let load = Arc::new(Load {
            stop: AtomicBool::new(false),
            phase: AtomicUsize::new(0),
            lat_us: Mutex::new([Vec::new(), Vec::new(), Vec::new()]),
        });
        let mut workers = Vec::new();
        for w in 0..args.concurrency {
            let client = client.clone();
            let load = load.clone();
            workers.push(tokio::spawn(async move {
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ ((w as u64 + 1) << 40);
                let data = vec![w as u8; 4096];
                while !load.stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let t = Instant::now();
                    client
                        .write_full("default", &format!("load-{}", x % 20_000), data.clone())
                        .await?;
                    let us = t.elapsed().as_micros() as u64;
                    let phase = load.phase.load(Ordering::Relaxed);
                    if let Ok(mut l) = load.lat_us.lock() {
                        l[phase].push(us);
                    }
                }
                anyhow::Ok(())
            }));
        }
        progress(&format!(
            "client load: {} s before the failure",
            args.phase_seconds
        ));
        let t_before = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.phase_seconds)).await;
        let b1 = recovered_bytes(&admin(&client, Admin::status()).await?);
        progress("failing osd.2 under client load");
        let t1 = Instant::now();
        load.phase.store(1, Ordering::Relaxed);
        fail_daemon(&client, scratch, 2).await?;
        let before_secs = t1.duration_since(t_before).as_secs_f64();
        let (busy_secs, busy_bytes) = wait_recovered(&client, t1, b1, timeout).await?;
        load.phase.store(2, Ordering::Relaxed);
        progress(&format!(
            "recovered in {busy_secs:.1} s; {} s after",
            args.phase_seconds
        ));
        let t2 = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.phase_seconds)).await;
        load.stop.store(true, Ordering::Relaxed);
        let after_secs = t2.elapsed().as_secs_f64();
        for w in workers {
            w.await??;
        }
        let mut lat = load
            .lat_us
            .lock()
            .map_err(|_| anyhow::anyhow!("latency lock poisoned"))?
            .clone();
        let secs = [before_secs, busy_secs, after_secs];
        let ops: Vec<f64> = lat
            .iter()
            .zip(secs)
            .map(|(l, s)| l.len() as f64 / s.max(1e-9))
            .collect();
        let p99: Vec<f64> = lat.iter_mut().map(|l| p99_ms(l)).collect();
        let busy_mbps = busy_bytes as f64 / busy_secs / 1e6;
        let results = vec![
            BenchResult::higher_is_better(
                "recovery MB/s, no client load",
                "MB/s",
                idle_mbps,
                "disk sequential O_DIRECT write (target ratio >= 0.5)",
                disk_mbps,
            ),
            BenchResult::lower_is_better(
                "time to clean, no client load",
                "s",
                idle_secs,
                "(no reference)",
                f64::NAN,
            ),
            BenchResult::higher_is_better(
                "client 4k write ops/s during recovery",
                "ops/s",
                ops[1],
                "same load before the failure (target ratio >= 0.7)",
                ops[0],
            ),
            BenchResult::higher_is_better(
                "client 4k write ops/s after recovery",
                "ops/s",
                ops[2],
                "same load before the failure",
                ops[0],
            ),
            BenchResult::lower_is_better(
                "client 4k write p99 during recovery",
                "ms",
                p99[1],
                "p99 before the failure",
                p99[0],
            ),
            BenchResult::lower_is_better(
                "client 4k write p99 after recovery",
                "ms",
                p99[2],
                "p99 before the failure",
                p99[0],
            ),
            BenchResult::higher_is_better(
                "recovery MB/s under client load",
                "MB/s",
                busy_mbps,
                "recovery MB/s without load",
                idle_mbps,
            ),
            BenchResult::lower_is_better(
                "time to clean under client load",
                "s",
                busy_secs,
                "time to clean without load",
                idle_secs,
            ),
        ];
        print_report("recovery", &results, args.json)
    })
}
