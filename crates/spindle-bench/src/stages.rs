//! `spindle bench stages`: where the time of a block read goes, stage by stage.
//!
//! Starts its own scratch cluster (3 daemons) and `spindle nbd` with stage clocks on
//! (`SPINDLE_STAGES_DIR`, see `spindle-trace`), prefills an image, and for each point
//! (4k randread QD1 and 512k read QD16 by default) runs fio's `nbd` engine while every
//! process counts the time its stages take. It prints, per point, fio's mean completion
//! latency beside the mean of every stage (per occurrence, and how often it occurs per
//! fio I/O) in path order, and three derived rows: the time outside the NBD server (fio,
//! the kernel and the NBD socket), the block layer (the device call minus the client's
//! round trips), and the network (the client's round trip minus everything the two
//! processes' clocks saw of it: socket transfer and wake-ups).
//!
//! Stage clocks cost a clock read per stage point; the fio figures printed here are for
//! reading the breakdown, `spindle bench fio` gives the speed.

use crate::fio::{
    measure, prefill, require_tool, spindle_nbd_child, Engine, Figures, Point, Timing,
};
use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use spindle_cluster::{self as cluster, runtime, SettingsArgs, Target, UpArgs};
use spindle_image::Image;
use spindle_trace::Stage;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Arguments of `spindle bench stages`.
#[derive(Args)]
pub struct BenchStagesArgs {
    /// Scratch directory of the benchmark's own cluster (removed first and afterwards).
    #[arg(long, default_value = "/var/tmp/spindle-bench-stages")]
    pub dir: PathBuf,
    /// Size of the benchmark image.
    #[arg(long, value_parser = spindle_cluster::parse_size_bytes, default_value = "1G")]
    pub size: u64,
    /// Seconds measured per point.
    #[arg(long, default_value_t = 5)]
    pub runtime_seconds: u64,
    /// Seconds of warm-up before each point (its requests are counted by the stage
    /// clocks too; the means are per request either way).
    #[arg(long, default_value_t = 1)]
    pub ramp_seconds: u64,
    /// Points as BS:RW:QD (default: 4k:randread:1 and 512k:read:16).
    #[arg(long = "point", value_parser = parse_point)]
    pub points: Vec<Point>,
    /// Keep the scratch cluster running afterwards (for a look at it).
    #[arg(long)]
    pub keep: bool,
    /// One JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// A file in the scratch directory that marks it as this bench's (safe to remove).
const SCRATCH_MARKER: &str = ".spindle-bench-stages";

fn parse_point(text: &str) -> Result<Point, String> {
    let f: Vec<&str> = text.split(':').collect();
    match f.as_slice() {
        [bs, rw, qd] => {
            if !["read", "write", "randread", "randwrite"].contains(rw) {
                return Err(format!("{rw}: not read, write, randread or randwrite"));
            }
            let iodepth = qd
                .parse::<u32>()
                .ok()
                .filter(|&q| q > 0)
                .ok_or_else(|| format!("{qd}: not a queue depth"))?;
            Ok(Point {
                bs: (*bs).to_string(),
                rw: (*rw).to_string(),
                iodepth,
            })
        }
        _ => Err(format!("{text}: expected BS:RW:QD, e.g. 4k:randread:1")),
    }
}

/// Which processes' counters a row sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The NBD server (block layer and client inside).
    Nbd,
    /// The storage daemons (summed).
    Osd,
}

/// Cumulative counters of every traced process: `(side, stage label) -> (count, sum_ns)`.
type Counters = BTreeMap<(Side, String), (u64, u64)>;

fn read_counters(dir: &Path) -> anyhow::Result<Counters> {
    let mut out = Counters::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !file.ends_with(".txt") {
            continue;
        }
        let side = if file.starts_with("nbd-") {
            Side::Nbd
        } else if file.starts_with("osd.") {
            Side::Osd
        } else {
            continue;
        };
        let text = std::fs::read_to_string(&path)?;
        for (name, count, sum_ns) in
            spindle_trace::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        {
            let e = out.entry((side, name)).or_default();
            e.0 += count;
            e.1 += sum_ns;
        }
    }
    Ok(out)
}

/// One stage's figures over a measurement window.
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    pub side: Side,
    pub stage: String,
    /// Occurrences per fio I/O.
    pub per_io: f64,
    /// Mean duration of one occurrence (µs).
    pub mean_us: f64,
}

/// The breakdown of one point.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    #[serde(flatten)]
    pub point: Point,
    pub fio: Figures,
    /// fio I/Os in the window (ramp included, as the stage clocks count it).
    pub ios: u64,
    pub stages: Vec<StageRow>,
    /// fio clat minus the NBD server's stages: fio, the kernel, the NBD socket.
    pub outside_nbd_us: f64,
    /// The device call minus the client's round trips (per I/O).
    pub block_layer_us: f64,
    /// The client's round trip minus what both sides' clocks saw of it.
    pub network_us: f64,
}

fn window(before: &Counters, after: &Counters, ios: u64) -> Vec<StageRow> {
    let mut rows = Vec::new();
    for side in [Side::Nbd, Side::Osd] {
        for stage in Stage::ALL {
            let key = (side, stage.label().to_string());
            let (c1, s1) = after.get(&key).copied().unwrap_or_default();
            let (c0, s0) = before.get(&key).copied().unwrap_or_default();
            let (count, sum_ns) = (c1.saturating_sub(c0), s1.saturating_sub(s0));
            if count == 0 {
                continue;
            }
            rows.push(StageRow {
                side,
                stage: stage.label().to_string(),
                per_io: count as f64 / ios.max(1) as f64,
                mean_us: sum_ns as f64 / count as f64 / 1e3,
            });
        }
    }
    rows
}

/// Per-I/O time of a stage (mean × occurrences per I/O); 0 if it did not occur.
fn per_io_us(rows: &[StageRow], side: Side, stage: Stage) -> f64 {
    rows.iter()
        .find(|r| r.side == side && r.stage == stage.label())
        .map_or(0.0, |r| r.mean_us * r.per_io)
}

fn derive(point: Point, fio: Figures, ios: u64, stages: Vec<StageRow>) -> Breakdown {
    let s = |side, stage| per_io_us(&stages, side, stage);
    let read = point.rw.contains("read");
    let device = if read {
        Stage::NbdDeviceRead
    } else {
        Stage::NbdDeviceWrite
    };
    let rpc = if read {
        Stage::ClientReadRpc
    } else {
        Stage::ClientWriteRpc
    };
    let nbd = s(Side::Nbd, Stage::NbdDispatch)
        + s(Side::Nbd, device)
        + s(Side::Nbd, Stage::NbdReplyQueue)
        + s(Side::Nbd, Stage::NbdSend);
    let seen = s(Side::Nbd, Stage::RpcWriterQueue)
        + s(Side::Nbd, Stage::RpcWrite)
        + s(Side::Osd, Stage::RpcRead)
        + s(Side::Osd, Stage::OsdRequest)
        + s(Side::Osd, Stage::RpcWriterQueue)
        + s(Side::Osd, Stage::RpcWrite)
        + s(Side::Nbd, Stage::RpcReplyWake);
    Breakdown {
        outside_nbd_us: fio.clat_mean_us - nbd,
        block_layer_us: s(Side::Nbd, device) - s(Side::Nbd, rpc),
        network_us: s(Side::Nbd, rpc) - seen,
        point,
        fio,
        ios,
        stages,
    }
}

/// Waits two dump intervals so every process has written its counters since `now`.
fn settle() {
    std::thread::sleep(spindle_trace::DUMP_INTERVAL * 3);
}

pub fn run(args: BenchStagesArgs) -> anyhow::Result<()> {
    require_tool("fio")?;
    if args.runtime_seconds == 0 {
        bail!("--runtime-seconds must be > 0");
    }
    let points = if args.points.is_empty() {
        vec![
            parse_point("4k:randread:1").map_err(anyhow::Error::msg)?,
            parse_point("512k:read:16").map_err(anyhow::Error::msg)?,
        ]
    } else {
        args.points.clone()
    };
    let scratch = args.dir.clone();
    let target = Target {
        dir: scratch.clone(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    // Only a directory this bench made (it holds the marker) is removed: `--dir` pointing
    // at anything else that is not empty is refused.
    let marker = scratch.join(SCRATCH_MARKER);
    let not_empty = std::fs::read_dir(&scratch).is_ok_and(|mut d| d.next().is_some());
    if not_empty && !marker.exists() {
        bail!(
            "{} is not empty and is not a scratch directory of `spindle bench stages`; \
             give --dir a new or empty directory",
            scratch.display()
        );
    }
    let _ = cluster::down_quiet(target.clone());
    let _ = std::fs::remove_dir_all(&scratch);
    let stages_dir = scratch.join("stages");
    std::fs::create_dir_all(&stages_dir)
        .with_context(|| format!("creating {}", stages_dir.display()))?;
    std::fs::write(&marker, b"").with_context(|| format!("creating {}", marker.display()))?;
    // Every process started from here on (daemons, monitor, `spindle nbd`) inherits it.
    // Set before any thread of this command exists.
    std::env::set_var(spindle_trace::STAGES_DIR_ENV, &stages_dir);
    let say = |m: String| {
        if !args.json {
            eprintln!("bench stages: {m}");
        }
    };
    say(format!(
        "starting a scratch cluster in {}",
        scratch.display()
    ));
    cluster::up_quiet(UpArgs {
        no_auth: false,
        mons: Some(1),
        osds: 3,
        pg_count: 64,
        wait_seconds: 60,
        settings: SettingsArgs::default(),
        target: target.clone(),
    })?;
    let result = measure_points(&args, &target, &points, &stages_dir, &say);
    if !args.keep {
        let _ = cluster::down_quiet(target);
        let _ = std::fs::remove_dir_all(&scratch);
    }
    let breakdowns = result?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "bench": "stages",
                "points": breakdowns,
            }))?
        );
    } else {
        for b in &breakdowns {
            print_breakdown(b);
        }
    }
    Ok(())
}

fn measure_points(
    args: &BenchStagesArgs,
    target: &Target,
    points: &[Point],
    stages_dir: &Path,
    say: &dyn Fn(String),
) -> anyhow::Result<Vec<Breakdown>> {
    let image = "stages";
    runtime()?.block_on(async {
        let client = Arc::new(target.client().await?);
        Image::create(
            client,
            "default",
            image,
            args.size,
            spindle_image::image::OBJECT_SIZE_BYTES_DEFAULT,
        )
        .await?;
        anyhow::Ok(())
    })?;
    let (mut nbd, uri) = spindle_nbd_child(target, "default", image, &[], "stages-nbd")?;
    say(format!("prefilling {uri}"));
    let engine = Engine::nbd(&uri);
    prefill(&engine).context("prefill")?;
    let mut out = Vec::new();
    for p in points {
        say(p.label());
        settle();
        let before = read_counters(stages_dir)?;
        let timing = Timing {
            runtime_seconds: args.runtime_seconds,
            ramp_seconds: args.ramp_seconds,
        };
        let fio = measure(&engine, p, timing, None)?.figures;
        settle();
        let after = read_counters(stages_dir)?;
        // Requests the stage clocks saw: the window's NBD requests of the point's kind.
        let device = if p.rw.contains("read") {
            Stage::NbdDeviceRead
        } else {
            Stage::NbdDeviceWrite
        };
        let key = (Side::Nbd, device.label().to_string());
        let ios = after.get(&key).map_or(0, |c| c.0) - before.get(&key).map_or(0, |c| c.0);
        if ios == 0 {
            bail!(
                "the NBD server counted no {} requests: are stage clocks on? (files in {})",
                device.label(),
                stages_dir.display()
            );
        }
        out.push(derive(p.clone(), fio, ios, window(&before, &after, ios)));
    }
    nbd.stop();
    Ok(out)
}

fn print_breakdown(b: &Breakdown) {
    println!(
        "\n{}: fio {:.0} IOPS, {:.1} MB/s, clat mean {:.1} µs (stage means per occurrence; x = occurrences per I/O)",
        b.point.label(),
        b.fio.iops,
        b.fio.mb_per_s,
        b.fio.clat_mean_us
    );
    println!(
        "  {:<5} {:<20} {:>6} {:>10} {:>10}",
        "where", "stage", "x", "mean µs", "µs per I/O"
    );
    for r in &b.stages {
        let side = match r.side {
            Side::Nbd => "nbd",
            Side::Osd => "osd",
        };
        println!(
            "  {:<5} {:<20} {:>6.2} {:>10.1} {:>10.1}",
            side,
            r.stage,
            r.per_io,
            r.mean_us,
            r.mean_us * r.per_io
        );
    }
    println!("  derived:");
    println!(
        "    outside the NBD server (fio, kernel, NBD socket) {:>8.1} µs",
        b.outside_nbd_us
    );
    println!(
        "    block layer (device call - client round trips)   {:>8.1} µs",
        b.block_layer_us
    );
    println!(
        "    network (round trip - what both clocks saw)      {:>8.1} µs",
        b.network_us
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_or_explain() {
        let p = parse_point("512k:read:16").unwrap();
        assert_eq!(
            (p.bs.as_str(), p.rw.as_str(), p.iodepth),
            ("512k", "read", 16)
        );
        assert!(parse_point("4k:scan:1").is_err());
        assert!(parse_point("4k:read:0").is_err());
        assert!(parse_point("4k:read").is_err());
    }

    #[test]
    fn the_window_is_the_difference_and_derived_rows_add_up() {
        let key = |side, s: Stage| (side, s.label().to_string());
        let mut before = Counters::new();
        before.insert(key(Side::Nbd, Stage::NbdDeviceRead), (10, 1_000_000));
        let mut after = before.clone();
        // 100 reads of 300 µs in the device call, of which 200 µs client round trip.
        after.insert(key(Side::Nbd, Stage::NbdDeviceRead), (110, 31_000_000));
        after.insert(key(Side::Nbd, Stage::ClientReadRpc), (100, 20_000_000));
        after.insert(key(Side::Osd, Stage::OsdRequest), (100, 5_000_000));
        after.insert(key(Side::Nbd, Stage::NbdSend), (100, 1_000_000));
        let rows = window(&before, &after, 100);
        assert_eq!(rows.len(), 4);
        assert!((per_io_us(&rows, Side::Nbd, Stage::NbdDeviceRead) - 300.0).abs() < 1e-9);
        let fio = Figures {
            clat_mean_us: 400.0,
            ..Figures::default()
        };
        let b = derive(parse_point("4k:randread:1").unwrap(), fio, 100, rows);
        assert!((b.block_layer_us - 100.0).abs() < 1e-9);
        assert!((b.outside_nbd_us - (400.0 - 300.0 - 10.0)).abs() < 1e-9);
        assert!((b.network_us - (200.0 - 50.0)).abs() < 1e-9);
    }
}
