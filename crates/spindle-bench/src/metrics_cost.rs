//! `spindle bench metrics`: the cost of metrics (issue #22). The same fio runs over NBD
//! (4k randwrite and 4k randread at QD16) on fresh scratch clusters, one with every
//! `/metrics` endpoint on and a scraper polling all of them every second, one with every
//! endpoint off (`--metrics false`, `spindle nbd --metrics-listen off`), alternated so
//! drift of the machine hits both alike; the better run of each counts. Then, on a
//! cluster with 100 images open in one `spindle nbd`, each endpoint's scrape time and
//! size. Target: metrics cost at most 2% of either figure.

use crate::common::{print_report, BenchResult};
use crate::fio::{fio_json, parse_figures, spindle_nbd_child, Engine, Point};
use anyhow::Context;
use clap::Args;
use spindle_cluster::{SettingsArgs, Target};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// At most this share of IOPS may go to metrics.
const METRICS_COST_MAX: f64 = 0.02;
const IMAGE_BYTES: u64 = 1 << 30;

#[derive(Args)]
pub struct BenchMetricsArgs {
    /// Seconds of each fio run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Clusters of each kind (metrics on, off), alternated; the better run counts.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Images open in `spindle nbd` when scrape times and sizes are measured.
    #[arg(long, default_value_t = 100)]
    pub images: u32,
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
}

fn progress(line: &str) {
    eprintln!("bench metrics: {line}");
}

/// The body of `GET http://addr/metrics` and how long it took.
fn scrape(addr: &str) -> anyhow::Result<(String, Duration)> {
    let start = Instant::now();
    let mut s =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let took = start.elapsed();
    let (head, body) = out
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr}: not an HTTP answer"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{addr}: {head}");
    Ok((body.to_string(), took))
}

/// Every metrics endpoint the cluster lists (monitors, daemons).
fn cluster_endpoints(target: &Target) -> anyhow::Result<Vec<(String, String)>> {
    let s = spindle_cluster::runtime()?.block_on(async {
        let client = target.client().await?;
        spindle_cluster::admin(&client, spindle_mon::Admin::status()).await
    })?;
    let mut out: Vec<(String, String)> = s
        .mon_metrics_addrs
        .iter()
        .map(|(id, a)| (format!("mon.{id}"), a.clone()))
        .collect();
    out.extend(
        s.osds
            .iter()
            .filter_map(|o| Some((format!("osd.{}", o.id), o.metrics_addr.clone()?))),
    );
    Ok(out)
}

/// A free TCP address on 127.0.0.1.
fn free_addr() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

struct Cluster {
    target: Target,
}

fn start(scratch: &Path, metrics: bool) -> anyhow::Result<Cluster> {
    let target = crate::common::up_scratch(
        scratch,
        32,
        SettingsArgs {
            metrics: Some(metrics),
            ..SettingsArgs::default()
        },
    )?;
    Ok(Cluster { target })
}

/// fio 4k at QD16 over `uri` for `seconds`: IOPS.
fn fio_iops(uri: &str, rw: &str, seconds: u64) -> anyhow::Result<f64> {
    let p = Point {
        bs: "4k".into(),
        rw: rw.into(),
        iodepth: 16,
    };
    let mut a: Vec<String> = vec!["--name=metrics-cost".into()];
    a.extend(Engine::nbd(uri).engine_args().iter().cloned());
    a.extend([
        "--bs=4k".to_string(),
        format!("--rw={rw}"),
        "--iodepth=16".into(),
        "--numjobs=1".into(),
        "--direct=1".into(),
        "--time_based=1".into(),
        format!("--runtime={seconds}"),
        "--ramp_time=2".into(),
        "--size=512m".into(),
        "--randseed=22".into(),
        "--group_reporting=1".into(),
    ]);
    let v = fio_json(&a, &[])?;
    Ok(parse_figures(&v, &p)?.0.iops)
}

/// (randwrite IOPS, randread IOPS, scrapes done) of one cluster; with metrics on, every
/// endpoint (and the NBD server's) is scraped every second meanwhile.
fn measure(scratch: &Path, metrics: bool, seconds: u64) -> anyhow::Result<(f64, f64, u64)> {
    let c = start(scratch, metrics)?;
    spindle_cluster::runtime()?.block_on(async {
        let client = Arc::new(c.target.client().await?);
        spindle_image::Image::create(client, "default", "bench", IMAGE_BYTES, 4 << 20).await?;
        anyhow::Ok(())
    })?;
    let nbd_metrics = free_addr()?;
    let flags: Vec<&str> = if metrics {
        vec!["--metrics-listen", &nbd_metrics]
    } else {
        vec!["--metrics-listen", "off"]
    };
    let (_nbd, uri) = spindle_nbd_child(&c.target, "default", "bench", &flags, "nbd-metrics")?;
    let mut endpoints = if metrics {
        cluster_endpoints(&c.target)?
    } else {
        Vec::new()
    };
    if metrics {
        anyhow::ensure!(
            endpoints.len() >= 4,
            "expected a monitor's and three daemons' endpoints, got {endpoints:?}"
        );
        endpoints.push(("nbd".into(), nbd_metrics.clone()));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let scraper = {
        let (stop, scrapes) = (stop.clone(), scrapes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (_, addr) in &endpoints {
                    if scrape(addr).is_ok() {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let write = fio_iops(&uri, "randwrite", seconds);
    let read = fio_iops(&uri, "randread", seconds);
    stop.store(true, Ordering::Relaxed);
    let _ = scraper.join();
    Ok((write?, read?, scrapes.load(Ordering::Relaxed)))
}

/// Scrape time (median of 10) and size of every endpoint with `images` images open in
/// one `spindle nbd`.
fn scrape_sizes(scratch: &Path, images: u32) -> anyhow::Result<Vec<BenchResult>> {
    let c = start(scratch, true)?;
    spindle_cluster::runtime()?.block_on(async {
        let client = Arc::new(c.target.client().await?);
        for i in 0..images {
            spindle_image::Image::create(
                client.clone(),
                "default",
                &format!("i{i:03}"),
                64 << 20,
                4 << 20,
            )
            .await?;
        }
        anyhow::Ok(())
    })?;
    let nbd_metrics = free_addr()?;
    let (_nbd, uri) = spindle_nbd_child(
        &c.target,
        "default",
        "i000",
        &["--metrics-listen", &nbd_metrics],
        "nbd-metrics-images",
    )?;
    // Open every image: one short NBD connection each.
    let base = uri.trim_end_matches("i000");
    for i in 0..images {
        let out = std::process::Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("{base}i{i:03}"))
            .output()
            .context("nbdinfo (scripts/setup.sh installs libnbd-bin)")?;
        anyhow::ensure!(out.status.success(), "nbdinfo failed on image i{i:03}");
    }
    // The server refreshes its list of open images every second.
    std::thread::sleep(Duration::from_millis(1500));
    let mut endpoints = cluster_endpoints(&c.target)?;
    endpoints.push(("spindle nbd".into(), nbd_metrics));
    let mut results = Vec::new();
    for (name, addr) in endpoints
        .iter()
        .filter(|(n, _)| n.starts_with("mon.") || n == "osd.0" || n == "spindle nbd")
    {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..10 {
            let (body, took) = scrape(addr)?;
            size = body.len();
            times.push(took.as_secs_f64() * 1000.0);
        }
        if name == "spindle nbd" {
            anyhow::ensure!(
                body_mentions_images(&scrape(addr)?.0) >= images as usize,
                "the NBD server's metrics do not cover {images} images"
            );
        }
        times.sort_by(f64::total_cmp);
        progress(&format!(
            "{name}: scrape {:.2} ms (median of 10), {size} bytes",
            times[times.len() / 2]
        ));
        results.push(BenchResult::lower_is_better(
            format!("{name} /metrics scrape time with {images} images open (median of 10)"),
            "ms",
            times[times.len() / 2],
            "one second (the scrape interval)",
            1000.0,
        ));
        results.push(BenchResult::lower_is_better(
            format!("{name} /metrics size with {images} images open"),
            "KiB",
            size as f64 / 1024.0,
            "1 MiB",
            1024.0,
        ));
    }
    Ok(results)
}

/// Distinct `image` labels in a scrape.
fn body_mentions_images(body: &str) -> usize {
    body.lines()
        .filter_map(|l| l.split("image=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

pub fn run(args: BenchMetricsArgs) -> anyhow::Result<()> {
    // Best (write, read) IOPS with metrics on and off.
    let mut best = [(0.0f64, 0.0f64); 2];
    for round in 0..args.rounds.max(1) {
        for (i, on) in [true, false].into_iter().enumerate() {
            let name = if on { "metrics-on" } else { "metrics-off" };
            let mut got = (0.0, 0.0, 0);
            crate::common::in_scratch_cluster(name, None, args.keep, |scratch| {
                got = measure(scratch, on, args.seconds)?;
                Ok(())
            })?;
            progress(&format!(
                "round {}: {name}: 4k randwrite QD16 {:.0} IOPS, 4k randread QD16 {:.0} IOPS{}",
                round + 1,
                got.0,
                got.1,
                if on {
                    format!(", {} scrapes meanwhile", got.2)
                } else {
                    String::new()
                }
            ));
            if on && got.2 == 0 {
                anyhow::bail!("no scrape succeeded while metrics were on");
            }
            best[i].0 = best[i].0.max(got.0);
            best[i].1 = best[i].1.max(got.1);
        }
    }
    let [on, off] = best;
    let mut results = vec![
        BenchResult::higher_is_better(
            "4k randwrite QD16 over NBD, metrics on and scraped every second (IOPS)",
            "IOPS",
            on.0,
            "metrics off",
            off.0,
        ),
        BenchResult::higher_is_better(
            "4k randread QD16 over NBD, metrics on and scraped every second (IOPS)",
            "IOPS",
            on.1,
            "metrics off",
            off.1,
        ),
        BenchResult::higher_is_better(
            "4k IOPS kept with metrics, the worse of write and read (target: at least 0.98)",
            "ratio",
            (on.0 / off.0).min(on.1 / off.1),
            "target",
            1.0 - METRICS_COST_MAX,
        ),
    ];
    crate::common::in_scratch_cluster("metrics-images", None, args.keep, |scratch| {
        results.extend(scrape_sizes(scratch, args.images)?);
        Ok(())
    })?;
    print_report("metrics", &results, args.json)
}
