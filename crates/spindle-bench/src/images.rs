//! `spindle bench images`: what snapshots cost (issue #21).
//!
//! On a fresh embedded cluster (1 monitor, 3 daemons, pool `default` with 3 copies) in a
//! scratch directory, one image of `--size` (4 MiB objects) served by `spindle nbd`:
//! 1. prefill (every object exists), then fio 4k randwrite QD16 over NBD: no snapshot;
//! 2. a snapshot taken while fio runs (its creation latency under load);
//! 3. every object written once after it (the first write after a snapshot copies the
//!    object: that first-write cost is timed per object with the image library, beside a
//!    second write to the same object), then fio again: 1 snapshot;
//! 4. nine more snapshots, each followed by a first write to every object, then fio: 10
//!    snapshots. Target: at most 10% slower with 10 snapshots than with none.
//!
//! Not measured yet (not built): clone read latency, export/import beside `rbd`.

use crate::common::{print_report, BenchResult};
use crate::fio::{fio_json, parse_figures, spindle_nbd_child, Engine, Point};
use clap::Args;
use spindle_cluster::{SettingsArgs, Target, UpArgs};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BenchImagesArgs {
    /// Scratch directory for the benchmark's own cluster (removed afterwards unless --keep).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
    /// Seconds of each fio run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Image size in MiB (objects of 4 MiB: every one is copied once per snapshot).
    #[arg(long, default_value_t = 256)]
    pub size_mib: u64,
}

/// With 10 snapshots, 4k random writes keep at least this share of their IOPS.
const TEN_SNAPSHOTS_KEEP_MIN: f64 = 0.90;
const OBJECT_BYTES: u64 = 4 << 20;

fn progress(line: &str) {
    let mut err = std::io::stderr();
    let _ = writeln!(err, "images: {line}");
}

pub fn run(args: BenchImagesArgs) -> anyhow::Result<()> {
    if args.size_mib < 8 || args.seconds == 0 {
        anyhow::bail!("--size-mib must be at least 8 and --seconds at least 1");
    }
    let mut results = Vec::new();
    crate::common::in_scratch_cluster("images", args.scratch.clone(), args.keep, |scratch| {
        results = run_in(&args, scratch)?;
        Ok(())
    })?;
    print_report("images", &results, args.json)
}

fn fio_args(engine: &Engine, bs: &str, rw: &str, seconds: u64, size_mib: u64) -> Vec<String> {
    let mut a: Vec<String> = vec!["--name=images".into()];
    a.extend(engine.engine_args().iter().cloned());
    a.extend([
        format!("--bs={bs}"),
        format!("--rw={rw}"),
        "--iodepth=16".into(),
        "--numjobs=1".into(),
        "--direct=1".into(),
        format!("--size={size_mib}m"),
        "--randseed=21".into(),
        "--group_reporting=1".into(),
    ]);
    if seconds > 0 {
        a.extend([
            "--time_based=1".into(),
            format!("--runtime={seconds}"),
            "--ramp_time=1".into(),
        ]);
    }
    a
}

fn randwrite_iops(engine: &Engine, seconds: u64, size_mib: u64) -> anyhow::Result<f64> {
    let p = Point {
        bs: "4k".into(),
        rw: "randwrite".into(),
        iodepth: 16,
    };
    let v = fio_json(&fio_args(engine, "4k", "randwrite", seconds, size_mib), &[])?;
    Ok(parse_figures(&v, &p)?.0.iops)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn run_in(args: &BenchImagesArgs, scratch: &Path) -> anyhow::Result<Vec<BenchResult>> {
    let target = Target {
        dir: scratch.to_path_buf(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    spindle_cluster::up_quiet(UpArgs {
        no_auth: false,
        mons: Some(1),
        osds: 3,
        pg_count: 32,
        wait_seconds: 60,
        settings: SettingsArgs::default(),
        target: target.clone(),
    })?;
    let size_bytes = args.size_mib << 20;
    let objects = size_bytes / OBJECT_BYTES;
    let rt = spindle_cluster::runtime()?;
    let client = rt.block_on(async {
        let client = Arc::new(target.client().await?);
        spindle_image::Image::create(client.clone(), "default", "bench", size_bytes, OBJECT_BYTES)
            .await?;
        anyhow::Ok(client)
    })?;
    let (_nbd, uri) = spindle_nbd_child(&target, "default", "bench", &[], "nbd-images")?;
    let engine = Engine::nbd(&uri);
    progress("prefill");
    fio_json(&fio_args(&engine, "1m", "write", 0, args.size_mib), &[])?;
    let iops0 = randwrite_iops(&engine, args.seconds, args.size_mib)?;
    progress(&format!("no snapshot: 4k randwrite QD16 {iops0:.0} IOPS"));

    // A snapshot under load: fio in the background, the snapshot in the middle.
    let fio = {
        let a = fio_args(&engine, "4k", "randwrite", args.seconds, args.size_mib);
        std::thread::spawn(move || fio_json(&a, &[]))
    };
    std::thread::sleep(Duration::from_secs(args.seconds / 2 + 1));
    let started = Instant::now();
    rt.block_on(spindle_image::snap::create(
        &client, "default", "bench", "s0",
    ))?;
    let create_ms = started.elapsed().as_secs_f64() * 1e3;
    let during = fio
        .join()
        .map_err(|_| anyhow::anyhow!("fio thread panicked"))??;
    let during_iops = parse_figures(
        &during,
        &Point {
            bs: "4k".into(),
            rw: "randwrite".into(),
            iodepth: 16,
        },
    )?
    .0
    .iops;
    progress(&format!(
        "snapshot created under load in {create_ms:.0} ms (fio {during_iops:.0} IOPS across it)"
    ));

    // First writes after a snapshot (a fresh snapshot, so every object is copied first).
    let (first_ms, second_ms) = rt.block_on(async {
        spindle_image::snap::create(&client, "default", "bench", "s1").await?;
        let img = spindle_image::Image::open(client.clone(), "default", "bench").await?;
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for i in 0..objects {
            let t = Instant::now();
            img.write(i * OBJECT_BYTES + 4096, &[0x5a; 4096]).await?;
            first.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            img.write(i * OBJECT_BYTES + 8192, &[0xa5; 4096]).await?;
            second.push(t.elapsed().as_secs_f64() * 1e3);
        }
        anyhow::Ok((median(first), median(second)))
    })?;
    progress(&format!(
        "first 4k write to an object after a snapshot {first_ms:.2} ms (median of {objects}), \
         the next one {second_ms:.2} ms"
    ));
    let iops1 = randwrite_iops(&engine, args.seconds, args.size_mib)?;
    progress(&format!("2 snapshots: 4k randwrite QD16 {iops1:.0} IOPS"));

    // Up to 10 snapshots, every object copied after each.
    rt.block_on(async {
        let img = spindle_image::Image::open(client.clone(), "default", "bench").await?;
        for n in 2..10 {
            spindle_image::snap::create(&client, "default", "bench", &format!("s{n}")).await?;
            for i in 0..objects {
                img.write(i * OBJECT_BYTES, &[n as u8; 4096]).await?;
            }
        }
        anyhow::Ok(())
    })?;
    let iops10 = randwrite_iops(&engine, args.seconds, args.size_mib)?;
    progress(&format!("10 snapshots: 4k randwrite QD16 {iops10:.0} IOPS"));

    Ok(vec![
        BenchResult::higher_is_better(
            "4k randwrite QD16 over NBD with 10 snapshots, each object already copied (IOPS; reference: no snapshot)",
            "IOPS",
            iops10,
            "no snapshot",
            iops0,
        ),
        BenchResult::higher_is_better(
            "4k randwrite QD16 over NBD with 2 snapshots, each object already copied (IOPS; reference: no snapshot)",
            "IOPS",
            iops1,
            "no snapshot",
            iops0,
        ),
        BenchResult::higher_is_better(
            "4k IOPS kept with 10 snapshots (target: at least 0.90)",
            "ratio",
            iops10 / iops0,
            "target",
            TEN_SNAPSHOTS_KEEP_MIN,
        ),
        BenchResult::lower_is_better(
            "first 4k write to a 4 MiB object after a snapshot, QD1 (ms, median; reference: the next write to it)",
            "ms",
            first_ms,
            "next write",
            second_ms,
        ),
        BenchResult::lower_is_better(
            "snapshot create under 4k randwrite QD16 load (ms; reference: 1 s)",
            "ms",
            create_ms,
            "1 s",
            1000.0,
        ),
        BenchResult::higher_is_better(
            "4k randwrite QD16 across a snapshot's creation and the copies after it (IOPS; reference: no snapshot)",
            "IOPS",
            during_iops,
            "no snapshot",
            iops0,
        ),
    ])
}
