//! `spindle bench crush`: mappings per second of the scalar and batch (SIMD) mappers,
//! against Ceph's own `crushtool` on the same map and inputs, in the same run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use spindle_crush::batch::{map_batch, map_batch_parallel, BatchEngine, BatchResult};
use spindle_crush::{binary, do_rule, text, Workspace};

use crate::common::{print_report, BenchResult};

/// The benchmark map: root straw2 -> 8 hosts straw2 x 4 devices, unequal weights
/// (the public vector `h8x4_straw2`, made with crushtool 16.2.15).
const H8X4_MAP: &str = include_str!("../../spindle-crush/maps/h8x4_straw2.txt");

#[derive(Args)]
pub struct BenchCrushArgs {
    /// Number of inputs mapped per measurement.
    #[arg(long, default_value_t = 1_000_000)]
    inputs: i32,
    /// Rule id.
    #[arg(long, default_value_t = 0)]
    rule: i32,
    /// Result size.
    #[arg(long = "num-rep", default_value_t = 3)]
    num_rep: usize,
    /// Rough bound on the total running time.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchCrushArgs) -> anyhow::Result<()> {
    if args.inputs <= 0 {
        bail!("--inputs must be positive");
    }
    let map = text::parse_text(H8X4_MAP).context("benchmark map")?;
    if map.rule(args.rule).is_none() {
        bail!("rule {} does not exist in the benchmark map", args.rule);
    }
    let crushtool = which_crushtool()?;
    let dir = std::env::temp_dir().join(format!("spindle-bench-crush-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let map_bin = dir.join("h8x4_straw2.bin");
    std::fs::write(&map_bin, binary::encode(&map))?;

    let weights = map.default_reweights();
    let inputs: Vec<i32> = (0..args.inputs).collect();
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds.max(1.0));
    let rounds = 5;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best = [f64::INFINITY; 6]; // per-input, batch portable, batch simd, crushtool x2, batch simd all cores
    let mut checksum_scalar = 0u64;
    let mut checksum_batch = [0u64; 2];
    let mut workspace = Workspace::new();
    let mut row = Vec::new();
    let mut batch = BatchResult::default();
    let chunk = 4096;
    for round in 0..rounds {
        if round > 0 && Instant::now() > deadline {
            break;
        }
        // Scalar reference path, one input at a time.
        let start = Instant::now();
        let mut sum = 0u64;
        for &x in &inputs {
            do_rule(
                &map,
                args.rule,
                x,
                &mut row,
                args.num_rep,
                &weights,
                &mut workspace,
            );
            sum = sum.wrapping_add(row.iter().map(|&i| i as u64).sum::<u64>());
        }
        best[0] = best[0].min(start.elapsed().as_secs_f64());
        checksum_scalar = sum;
        // Batch paths, 4096 inputs per call: portable lanes, then the best SIMD engine.
        for (slot, engine) in [(1, BatchEngine::Scalar), (2, BatchEngine::Auto)] {
            let start = Instant::now();
            let mut sum = 0u64;
            for part in inputs.chunks(chunk) {
                map_batch(
                    &map,
                    args.rule,
                    part,
                    args.num_rep,
                    &weights,
                    engine,
                    &mut workspace,
                    &mut batch,
                )?;
                for i in 0..batch.len() {
                    sum = sum.wrapping_add(batch.get(i).iter().map(|&i| i as u64).sum::<u64>());
                }
            }
            best[slot] = best[slot].min(start.elapsed().as_secs_f64());
            checksum_batch[slot - 1] = sum;
        }
        // Batch SIMD over every core (one thread per core, disjoint inputs, shared map).
        let start = Instant::now();
        map_batch_parallel(
            &map,
            args.rule,
            &inputs,
            args.num_rep,
            &weights,
            BatchEngine::Auto,
            threads,
            &mut batch,
        )?;
        best[5] = best[5].min(start.elapsed().as_secs_f64());
        let sum: u64 = (0..batch.len())
            .map(|i| batch.get(i).iter().map(|&i| i as u64).sum::<u64>())
            .fold(0, u64::wrapping_add);
        if sum != checksum_scalar {
            bail!("parallel batch mappings differ from the scalar ones");
        }
        // crushtool, minus its start-up (same command with a single input).
        for (slot, flag) in [(3, "--show-mappings"), (4, "--show-statistics")] {
            let full = time_crushtool(
                &crushtool,
                &map_bin,
                flag,
                args.rule,
                args.num_rep,
                args.inputs - 1,
            )?;
            let startup = time_crushtool(&crushtool, &map_bin, flag, args.rule, args.num_rep, 0)?;
            best[slot] = best[slot].min((full - startup).max(1e-9));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if checksum_batch.iter().any(|&c| c != checksum_scalar) {
        bail!(
            "batch and scalar mappings differ (checksums {checksum_scalar} vs {checksum_batch:?})"
        );
    }
    let n = f64::from(args.inputs);
    let rate = |t: f64| n / t;
    let engine = format!("{:?}", BatchEngine::detect()).to_lowercase();
    let anchor = rate(best[4].min(best[3]));
    let anchor_name = "crushtool 16 --test, faster of --show-mappings/--show-statistics, 1 thread";
    let results = vec![
        BenchResult::higher_is_better(
            "crush per-input do_rule h8x4_straw2 r3",
            "mappings/s",
            rate(best[0]),
            anchor_name,
            anchor,
        ),
        BenchResult::higher_is_better(
            "crush batch scalar (portable lanes)",
            "mappings/s",
            rate(best[1]),
            anchor_name,
            anchor,
        ),
        BenchResult::higher_is_better(
            format!("crush batch {engine} lanes"),
            "mappings/s",
            rate(best[2]),
            anchor_name,
            anchor,
        ),
        BenchResult::higher_is_better(
            format!("crush batch {engine} lanes, {threads} threads"),
            "mappings/s",
            rate(best[5]),
            anchor_name,
            anchor,
        ),
        BenchResult::higher_is_better(
            "crushtool --show-mappings (for reference)",
            "mappings/s",
            rate(best[3]),
            "crushtool --show-statistics",
            rate(best[4]),
        ),
    ];
    print_report("crush", &results, args.json)
}

fn which_crushtool() -> anyhow::Result<std::path::PathBuf> {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = std::path::Path::new(dir).join("crushtool");
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("crushtool not found: install the Debian package ceph-base (scripts/setup.sh does)")
}

fn time_crushtool(
    crushtool: &std::path::Path,
    map: &std::path::Path,
    flag: &str,
    rule: i32,
    num_rep: usize,
    max_x: i32,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let status = Command::new(crushtool)
        .arg("-i")
        .arg(map)
        .args([
            "--test",
            flag,
            "--rule",
            &rule.to_string(),
            "--num-rep",
            &num_rep.to_string(),
        ])
        .args(["--min-x", "0", "--max-x", &max_x.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running crushtool")?;
    if !status.success() {
        bail!("crushtool failed: {status}");
    }
    Ok(start.elapsed().as_secs_f64())
}
