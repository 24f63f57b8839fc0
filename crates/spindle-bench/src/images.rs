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
//! 5. a clone of the first snapshot: 4k random reads QD1 of the clone (nothing written:
//!    every read goes through to the parent snapshot) beside the same reads of the parent;
//! 6. export of the (full) image to a file and import of that file as a new image,
//!    throughput; with `--ceph`, a real Ceph 16 started by `shared/baselines/ceph/up.sh`
//!    in the same sitting does `rbd import` and `rbd export` of the same file.

use crate::common::{print_report, BenchResult};
use crate::fio::{fio_json, parse_figures, spindle_nbd_child, Engine, Point};
use clap::Args;
use spindle_cluster::SettingsArgs;
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
    /// Also start Ceph 16 (shared/baselines/ceph/up.sh) after the Spindle runs and time
    /// `rbd import` and `rbd export` of the same file.
    #[arg(long)]
    pub ceph: bool,
    /// Data directory of that Ceph cluster (down.sh removes it).
    #[arg(long, env = "CEPH_DIR", default_value = "/var/tmp/cephanchor")]
    pub ceph_dir: PathBuf,
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
    // Everything --ceph needs is checked before the long Spindle run.
    let ceph_scripts = if args.ceph {
        let shared = std::env::var_os("SPINDLE_SHARED_DIR").map(PathBuf::from);
        let dir = crate::fio::ceph::scripts_dir(None, shared.as_deref());
        let scripts = crate::fio::ceph::CephScripts::find(&dir)?;
        crate::fio::ceph::check_free(&args.ceph_dir)?;
        Some(scripts)
    } else {
        None
    };
    let mut results = Vec::new();
    let mut export_file = None;
    crate::common::in_scratch_cluster("images", args.scratch.clone(), args.keep, |scratch| {
        results = run_in(&args, scratch)?;
        // The exported file outlives the scratch cluster for Ceph's runs.
        if let Some(scripts) = &ceph_scripts {
            let file = std::env::temp_dir()
                .join(format!("spindle-bench-images-{}.raw", std::process::id()));
            std::fs::rename(scratch.join("export.raw"), &file)
                .or_else(|_| std::fs::copy(scratch.join("export.raw"), &file).map(|_| ()))?;
            export_file = Some((scripts.clone(), file));
        }
        Ok(())
    })?;
    if let Some((scripts, file)) = export_file {
        let r = rbd_transfer(&scripts, &args.ceph_dir, &file);
        let _ = std::fs::remove_file(&file);
        let (import_mbps, export_mbps) = r?;
        let spindle = |label: &str| {
            results
                .iter()
                .find(|r| r.name.starts_with(label))
                .map(|r| r.spindle)
                .unwrap_or(0.0)
        };
        let (ours_export, ours_import) = (spindle("export of"), spindle("import of"));
        results.push(BenchResult::higher_is_better(
            "export of a full image to a file, same sitting (MB/s; reference: rbd export on Ceph 16)",
            "MB/s",
            ours_export,
            "rbd export",
            export_mbps,
        ));
        results.push(BenchResult::higher_is_better(
            "import of that file as a new image, same sitting (MB/s; reference: rbd import on Ceph 16)",
            "MB/s",
            ours_import,
            "rbd import",
            import_mbps,
        ));
    }
    print_report("images", &results, args.json)
}

/// Ceph 16 in this sitting: `rbd import FILE` then `rbd export` of it to another file,
/// each timed (MB/s); down.sh afterwards (also on failure: the guard).
fn rbd_transfer(
    scripts: &crate::fio::ceph::CephScripts,
    ceph_dir: &Path,
    file: &Path,
) -> anyhow::Result<(f64, f64)> {
    progress("starting Ceph 16 with up.sh (about a minute)");
    let size = std::fs::metadata(file)?.len();
    let mut cluster = crate::fio::ceph::CephCluster::start(scripts, ceph_dir, size)?;
    let conf = cluster.conf();
    let rbd = |args: &[&str]| -> anyhow::Result<f64> {
        let started = Instant::now();
        let out = std::process::Command::new("rbd")
            .args(args)
            .env("CEPH_CONF", &conf)
            .output()?;
        if !out.status.success() {
            anyhow::bail!(
                "rbd {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(started.elapsed().as_secs_f64())
    };
    let back = file.with_extension("rbd-export");
    let _ = std::fs::remove_file(&back);
    let file_arg = file.to_string_lossy().to_string();
    let back_arg = back.to_string_lossy().to_string();
    let r = (|| {
        let import_s = rbd(&["import", "--no-progress", &file_arg, "rbd/imported"])?;
        let export_s = rbd(&["export", "--no-progress", "rbd/imported", &back_arg])?;
        anyhow::Ok((size as f64 / 1e6 / import_s, size as f64 / 1e6 / export_s))
    })();
    let _ = std::fs::remove_file(&back);
    progress("stopping Ceph (down.sh)");
    cluster.stop()?;
    let (import_mbps, export_mbps) = r?;
    progress(&format!(
        "Ceph: rbd import {import_mbps:.0} MB/s, rbd export {export_mbps:.0} MB/s"
    ));
    Ok((import_mbps, export_mbps))
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

/// Mean completion latency of 4k random reads at queue depth 1 (us).
fn randread_qd1_us(engine: &Engine, seconds: u64, size_mib: u64) -> anyhow::Result<f64> {
    let mut args = fio_args(engine, "4k", "randread", seconds, size_mib);
    for a in args.iter_mut() {
        if a.starts_with("--iodepth=") {
            *a = "--iodepth=1".into();
        }
    }
    let v = fio_json(&args, &[])?;
    let p = Point {
        bs: "4k".into(),
        rw: "randread".into(),
        iodepth: 1,
    };
    Ok(parse_figures(&v, &p)?.0.clat_mean_us)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn run_in(args: &BenchImagesArgs, scratch: &Path) -> anyhow::Result<Vec<BenchResult>> {
    let target = crate::common::up_scratch(scratch, 32, SettingsArgs::default())?;
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
    let seq = |rw: &str| Point {
        bs: "1m".into(),
        rw: rw.into(),
        iodepth: 16,
    };
    let prefill = fio_json(&fio_args(&engine, "1m", "write", 0, args.size_mib), &[])?;
    let seq_write_mbps = parse_figures(&prefill, &seq("write"))?.0.mb_per_s;
    let read = fio_json(&fio_args(&engine, "1m", "read", 0, args.size_mib), &[])?;
    let seq_read_mbps = parse_figures(&read, &seq("read"))?.0.mb_per_s;
    progress(&format!(
        "1M QD16 over NBD: sequential writes {seq_write_mbps:.0} MB/s, reads {seq_read_mbps:.0} MB/s"
    ));
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

    // A clone of s0, nothing written: every read goes through to the parent snapshot.
    rt.block_on(async {
        spindle_image::snap::protect(&client, "default", "bench", "s0", true).await?;
        spindle_image::clone::clone(&client, "default", "bench", "s0", "default", "clone", None)
            .await?;
        anyhow::Ok(())
    })?;
    let clone_engine = Engine::nbd(&uri.replace("/bench", "/clone"));
    let parent_lat = randread_qd1_us(&engine, args.seconds, args.size_mib)?;
    let clone_lat = randread_qd1_us(&clone_engine, args.seconds, args.size_mib)?;
    progress(&format!(
        "4k random read QD1: clone {clone_lat:.0} us, its parent {parent_lat:.0} us"
    ));

    // Export and import of the full image (every object exists after the prefill).
    let file = scratch.join("export.raw");
    let (export_mbps, import_mbps) = rt.block_on(async {
        let img = spindle_image::Image::open(client.clone(), "default", "bench").await?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)?;
        let started = Instant::now();
        let stats = spindle_image::transfer::export(&img, &mut f, true, |_, _| {}).await?;
        f.set_len(stats.size_bytes)?;
        // Timed like `rbd export`, which does not sync its file (`spindle image export`
        // does, after this point).
        let export_s = started.elapsed().as_secs_f64();
        f.sync_all()?;
        let copy = spindle_image::Image::create(
            client.clone(),
            "default",
            "imported",
            size_bytes,
            OBJECT_BYTES,
        )
        .await?;
        let mut input = std::io::BufReader::new(std::fs::File::open(&file)?);
        let started = Instant::now();
        spindle_image::transfer::import(&copy, &mut input, size_bytes, |_, _| {}).await?;
        let import_s = started.elapsed().as_secs_f64();
        anyhow::Ok((
            size_bytes as f64 / 1e6 / export_s,
            size_bytes as f64 / 1e6 / import_s,
        ))
    })?;
    progress(&format!(
        "export {export_mbps:.0} MB/s, import {import_mbps:.0} MB/s ({} MiB)",
        args.size_mib
    ));

    Ok(vec![
        BenchResult::higher_is_better(
            "export of a full image to a file (MB/s; reference: fio 1M sequential reads QD16 of it over NBD)",
            "MB/s",
            export_mbps,
            "fio 1M reads over NBD",
            seq_read_mbps,
        ),
        BenchResult::higher_is_better(
            "import of that file as a new image (MB/s; reference: fio 1M sequential writes QD16 over NBD)",
            "MB/s",
            import_mbps,
            "fio 1M writes over NBD",
            seq_write_mbps,
        ),
        BenchResult::lower_is_better(
            "4k random read QD1 over NBD of a clone with nothing written (us, mean; reference: its parent)",
            "us",
            clone_lat,
            "parent",
            parent_lat,
        ),
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
