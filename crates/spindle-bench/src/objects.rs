//! `spindle bench objects`: like `rados bench`. Writes then reads 4 MiB and 4 KiB objects
//! with N operations in flight and prints ops/s, MiB/s, mean and p99 latency and the CPU
//! time of the cluster's daemons per operation, beside Ceph 16's figures measured on this
//! kind of machine (`shared/baselines/ceph.md`).

use crate::common::{print_report, BenchResult};
use clap::Args;
use spindle_client::Client;
use spindle_cluster::Target;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// Reference figures from shared/baselines/ceph.md (Ceph 16.2.15, 3 BlueStore OSDs on one
// node of this machine kind): rados bench 4 MiB x 16 (MiB/s, mean latency ms), fio rbd
// 4k randwrite/randread at QD16 (IOPS), OSD CPU per 4k replicated write (µs).
const CEPH_RADOS_WRITE_4M_MIBS: f64 = 238.059;
const CEPH_RADOS_WRITE_4M_LAT_MS: f64 = 268.8;
const CEPH_RADOS_READ_4M_MIBS: f64 = 942.239;
const CEPH_RADOS_READ_4M_LAT_MS: f64 = 66.3;
const CEPH_RBD_4K_RANDWRITE_QD16_IOPS: f64 = 626.0;
const CEPH_RBD_4K_RANDREAD_QD16_IOPS: f64 = 3521.0;
const CEPH_OSD_CPU_US_PER_4K_WRITE: f64 = 2638.9;
const CEPH_OSD_CPU_US_PER_4K_READ: f64 = 235.1;
// Erasure-coded anchors (same page, Ceph RBD on an EC 2+1 pool, fio rbd QD16): Ceph has
// no rados bench figure for its EC pool, so the large-object anchors are its largest
// sequential transfers (512k, MB/s converted to MiB/s).
const CEPH_EC_WRITE_512K_QD16_MIBS: f64 = 182.2e6 / 1_048_576.0;
const CEPH_EC_READ_512K_QD16_MIBS: f64 = 331.3e6 / 1_048_576.0;
const CEPH_EC_4K_RANDWRITE_QD16_IOPS: f64 = 307.0;
const CEPH_EC_4K_RANDREAD_QD16_IOPS: f64 = 1335.0;
const CEPH_EC_OSD_CPU_US_PER_4K_WRITE: f64 = 6220.4;

/// Reference figures for one kind of pool.
struct Anchors {
    write_4m: (&'static str, f64),
    read_4m: (&'static str, f64),
    write_4k: (&'static str, f64),
    read_4k: (&'static str, f64),
    cpu_write_4k: (&'static str, f64),
}

const REPLICATED_ANCHORS: Anchors = Anchors {
    write_4m: ("Ceph 16 rados bench write 4M t16", CEPH_RADOS_WRITE_4M_MIBS),
    read_4m: ("Ceph 16 rados bench seq t16", CEPH_RADOS_READ_4M_MIBS),
    write_4k: (
        "Ceph 16 RBD 4k randwrite QD16",
        CEPH_RBD_4K_RANDWRITE_QD16_IOPS,
    ),
    read_4k: (
        "Ceph 16 RBD 4k randread QD16",
        CEPH_RBD_4K_RANDREAD_QD16_IOPS,
    ),
    cpu_write_4k: (
        "Ceph 16 OSD CPU per 4k rep. write",
        CEPH_OSD_CPU_US_PER_4K_WRITE,
    ),
};

const ERASURE_ANCHORS: Anchors = Anchors {
    write_4m: (
        "Ceph 16 RBD EC2+1 512k write QD16",
        CEPH_EC_WRITE_512K_QD16_MIBS,
    ),
    read_4m: (
        "Ceph 16 RBD EC2+1 512k read QD16",
        CEPH_EC_READ_512K_QD16_MIBS,
    ),
    write_4k: (
        "Ceph 16 RBD EC2+1 4k randwrite QD16",
        CEPH_EC_4K_RANDWRITE_QD16_IOPS,
    ),
    read_4k: (
        "Ceph 16 RBD EC2+1 4k randread QD16",
        CEPH_EC_4K_RANDREAD_QD16_IOPS,
    ),
    cpu_write_4k: (
        "Ceph 16 OSD CPU per 4k EC write",
        CEPH_EC_OSD_CPU_US_PER_4K_WRITE,
    ),
};

/// Microseconds of this thread's CPU to encode `bytes` of objects with `layout` (the
/// client-side kernel alone, same run: what the client CPU per MiB is compared with).
fn encode_us_per_mib(layout: &spindle_map::ec::EcLayout) -> f64 {
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 2_654_435_761) as u8).collect();
    let stripes = layout.stripes(data.len() as u64);
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < Duration::from_millis(300) || rounds < 3 {
        let out = layout.encode_stripes(&data, stripes).unwrap_or_default();
        std::hint::black_box(out);
        rounds += 1;
    }
    start.elapsed().as_secs_f64() * 1e6 / (rounds as f64 * 4.0)
}

#[derive(Args)]
pub struct BenchObjectsArgs {
    /// Pool to write into.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Total running time, split over the four phases.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Operations in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Object sizes to run: "4m", "4k" or both (default).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["4m".to_string(), "4k".to_string()])]
    pub sizes: Vec<String>,
    /// Keep the benchmark objects afterwards (default: delete them).
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

struct Phase {
    ops: u64,
    bytes: u64,
    secs: f64,
    lat_us: Vec<u64>,
    daemon_cpu_us: f64,
    client_cpu_us: f64,
}

impl Phase {
    fn mean_ms(&self) -> f64 {
        self.lat_us.iter().sum::<u64>() as f64 / self.lat_us.len().max(1) as f64 / 1000.0
    }
    fn p99_ms(&mut self) -> f64 {
        self.lat_us.sort_unstable();
        let i = ((self.lat_us.len() as f64 * 0.99).ceil() as usize).saturating_sub(1);
        self.lat_us.get(i).copied().unwrap_or(0) as f64 / 1000.0
    }
}

/// utime + stime of a process, in µs (0 if it cannot be read).
fn cpu_us(pid: u32) -> f64 {
    crate::proc_cpu::process_cpu_us(pid).map_or(0.0, |us| us as f64)
}

async fn daemon_pids(client: &Client) -> Vec<u32> {
    let map = client.map();
    map.osds
        .values()
        .map(|o| o.pid)
        .filter(|&p| p > 0)
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    client: &Client,
    pool: &str,
    size: usize,
    write: bool,
    objects: u64,
    concurrency: usize,
    duration: Duration,
    pids: &[u32],
) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let cpu0: f64 = pids.iter().map(|&p| cpu_us(p)).sum();
    let me = std::process::id();
    let client_cpu0 = cpu_us(me);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let client = client.clone();
        let pool = pool.to_string();
        let stop = stop.clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut ops = 0u64;
            let mut bytes = 0u64;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (worker as u64) << 32;
            let mut data = vec![0u8; size];
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i as u64 ^ seed) as u8;
            }
            while !stop.load(Ordering::Relaxed) {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                if write {
                    if n >= objects {
                        break;
                    }
                    data[0] = n as u8;
                    client
                        .write_full(&pool, &format!("bench-{size}-{n}"), data.clone())
                        .await?;
                    bytes += size as u64;
                } else {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let k = seed % objects.max(1);
                    let got = client
                        .read_full(&pool, &format!("bench-{size}-{k}"))
                        .await?;
                    if got.len() != size {
                        anyhow::bail!(
                            "bench-{size}-{k}: read {} bytes, expected {size}",
                            got.len()
                        );
                    }
                    bytes += got.len() as u64;
                }
                lat.push(t.elapsed().as_micros() as u64);
                ops += 1;
            }
            anyhow::Ok((ops, bytes, lat))
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut phase = Phase {
        ops: 0,
        bytes: 0,
        secs: 0.0,
        lat_us: Vec::new(),
        daemon_cpu_us: 0.0,
        client_cpu_us: 0.0,
    };
    for t in tasks {
        let (ops, bytes, lat) = t.await??;
        phase.ops += ops;
        phase.bytes += bytes;
        phase.lat_us.extend(lat);
    }
    phase.secs = start.elapsed().as_secs_f64();
    phase.daemon_cpu_us = pids.iter().map(|&p| cpu_us(p)).sum::<f64>() - cpu0;
    phase.client_cpu_us = cpu_us(me) - client_cpu0;
    Ok(phase)
}

pub fn run(args: BenchObjectsArgs) -> anyhow::Result<()> {
    let rt = spindle_cluster::runtime()?;
    rt.block_on(async {
        let client = args.target.client().await?;
        if client.map().pool_by_name(&args.pool).is_none() {
            anyhow::bail!("no pool '{}' (see `spindle pool ls`)", args.pool);
        }
        let pids = daemon_pids(&client).await;
        let map = client.map();
        let pool_def = map.pool_by_name(&args.pool).cloned();
        let layout = pool_def
            .as_ref()
            .and_then(spindle_map::ec::EcLayout::for_pool)
            .transpose()?;
        let anchors = if layout.is_some() {
            &ERASURE_ANCHORS
        } else {
            &REPLICATED_ANCHORS
        };
        let sizes: Vec<(usize, &str)> =
            [(4usize << 20, "4 MiB", "4m"), (4usize << 10, "4 KiB", "4k")]
                .into_iter()
                .filter(|(_, _, key)| args.sizes.iter().any(|s| s.eq_ignore_ascii_case(key)))
                .map(|(size, label, _)| (size, label))
                .collect();
        if sizes.is_empty() {
            anyhow::bail!("--sizes takes 4m, 4k or both");
        }
        let phases = 2 * sizes.len() as u64;
        let quarter = Duration::from_secs_f64((args.seconds.max(phases) as f64) / phases as f64);
        let mut results = Vec::new();
        let mut cleanup = Vec::new();
        for (size, label) in sizes {
            if !args.json {
                eprintln!(
                    "writing {label} objects for {:.1} s ...",
                    quarter.as_secs_f64()
                );
            }
            let mut w = run_phase(
                &client,
                &args.pool,
                size,
                true,
                u64::MAX,
                args.concurrency,
                quarter,
                &pids,
            )
            .await?;
            let written = w.ops;
            if !args.json {
                eprintln!(
                    "reading {label} objects for {:.1} s ...",
                    quarter.as_secs_f64()
                );
            }
            let mut r = run_phase(
                &client,
                &args.pool,
                size,
                false,
                written,
                args.concurrency,
                quarter,
                &pids,
            )
            .await?;
            cleanup.push((size, written));
            let mibs = |p: &Phase| p.bytes as f64 / (1 << 20) as f64 / p.secs;
            let iops = |p: &Phase| p.ops as f64 / p.secs;
            let cpu_per_op = |p: &Phase| p.daemon_cpu_us / p.ops.max(1) as f64;
            if size == 4 << 20 {
                results.push(BenchResult::higher_is_better(
                    "write 4 MiB",
                    "MiB/s",
                    mibs(&w),
                    anchors.write_4m.0,
                    anchors.write_4m.1,
                ));
                if let Some(layout) = &layout {
                    let mib = w.bytes as f64 / (1 << 20) as f64;
                    results.push(BenchResult::lower_is_better(
                        "client CPU per MiB written (encode+send)",
                        "us",
                        w.client_cpu_us / mib.max(1.0),
                        "encode kernel alone, same run",
                        encode_us_per_mib(layout),
                    ));
                }
                results.push(BenchResult::lower_is_better(
                    "write 4 MiB mean latency",
                    "ms",
                    w.mean_ms(),
                    if layout.is_some() {
                        "(no Ceph EC figure)"
                    } else {
                        "Ceph 16 rados bench write 4M t16"
                    },
                    if layout.is_some() {
                        f64::NAN
                    } else {
                        CEPH_RADOS_WRITE_4M_LAT_MS
                    },
                ));
                results.push(BenchResult::lower_is_better(
                    "write 4 MiB p99 latency",
                    "ms",
                    w.p99_ms(),
                    "(no Ceph p99 in baselines)",
                    f64::NAN,
                ));
                results.push(BenchResult::higher_is_better(
                    "read 4 MiB",
                    "MiB/s",
                    mibs(&r),
                    anchors.read_4m.0,
                    anchors.read_4m.1,
                ));
                results.push(BenchResult::lower_is_better(
                    "read 4 MiB mean latency",
                    "ms",
                    r.mean_ms(),
                    if layout.is_some() {
                        "(no Ceph EC figure)"
                    } else {
                        "Ceph 16 rados bench seq t16"
                    },
                    if layout.is_some() {
                        f64::NAN
                    } else {
                        CEPH_RADOS_READ_4M_LAT_MS
                    },
                ));
                results.push(BenchResult::lower_is_better(
                    "read 4 MiB p99 latency",
                    "ms",
                    r.p99_ms(),
                    "(no Ceph p99 in baselines)",
                    f64::NAN,
                ));
            } else {
                results.push(BenchResult::higher_is_better(
                    "write 4 KiB",
                    "ops/s",
                    iops(&w),
                    anchors.write_4k.0,
                    anchors.write_4k.1,
                ));
                results.push(BenchResult::lower_is_better(
                    "write 4 KiB mean latency",
                    "ms",
                    w.mean_ms(),
                    "(QD16 mean not in baselines)",
                    f64::NAN,
                ));
                results.push(BenchResult::lower_is_better(
                    "write 4 KiB p99 latency",
                    "ms",
                    w.p99_ms(),
                    "(QD16 p99 not in baselines)",
                    f64::NAN,
                ));
                results.push(BenchResult::lower_is_better(
                    "daemon CPU per 4 KiB write",
                    "us",
                    cpu_per_op(&w),
                    anchors.cpu_write_4k.0,
                    anchors.cpu_write_4k.1,
                ));
                results.push(BenchResult::lower_is_better(
                    "client CPU per 4 KiB write",
                    "us",
                    w.client_cpu_us / w.ops.max(1) as f64,
                    "(not measured for Ceph)",
                    f64::NAN,
                ));
                results.push(BenchResult::higher_is_better(
                    "read 4 KiB",
                    "ops/s",
                    iops(&r),
                    anchors.read_4k.0,
                    anchors.read_4k.1,
                ));
                results.push(BenchResult::lower_is_better(
                    "read 4 KiB mean latency",
                    "ms",
                    r.mean_ms(),
                    "(QD16 mean not in baselines)",
                    f64::NAN,
                ));
                results.push(BenchResult::lower_is_better(
                    "read 4 KiB p99 latency",
                    "ms",
                    r.p99_ms(),
                    "(QD16 p99 not in baselines)",
                    f64::NAN,
                ));
                results.push(BenchResult::lower_is_better(
                    "daemon CPU per 4 KiB read",
                    "us",
                    cpu_per_op(&r),
                    if layout.is_some() {
                        "(no Ceph EC figure)"
                    } else {
                        "Ceph 16 OSD CPU per 4k rep. read"
                    },
                    if layout.is_some() {
                        f64::NAN
                    } else {
                        CEPH_OSD_CPU_US_PER_4K_READ
                    },
                ));
            }
        }
        if !args.keep {
            if !args.json {
                eprintln!("deleting benchmark objects ...");
            }
            let mut handles = Vec::new();
            let stride = args.concurrency.max(1) as u64;
            for (size, n) in cleanup {
                for chunk in 0..stride {
                    let client = client.clone();
                    let pool = args.pool.clone();
                    handles.push(tokio::spawn(async move {
                        let mut i = chunk;
                        while i < n {
                            let _ = client.delete(&pool, &format!("bench-{size}-{i}")).await;
                            i += stride;
                        }
                    }));
                }
            }
            for h in handles {
                let _ = h.await;
            }
        }
        print_report("objects", &results, args.json)
    })
}
