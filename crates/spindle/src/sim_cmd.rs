//! `spindle sim`: the deterministic cluster simulator (`spindle-sim`) from the command
//! line. One seed replays one run exactly; a seed range sweeps and names every failing
//! seed with the command that replays it.

use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;

#[derive(Args)]
pub struct SimArgs {
    /// One seed to run (replay a failure with the seed it printed).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// A sweep: `A..B`, both included.
    #[arg(long)]
    seeds: Option<String>,
    /// Storage daemons in the simulated cluster.
    #[arg(long, default_value_t = 3)]
    daemons: u32,
    /// Clients (default 2 map followers; with --data 3 clients running the workload).
    #[arg(long)]
    clients: Option<u32>,
    /// Faults injected per seed (crashes, restarts, partitions, lossy network; default
    /// 24, with --data 8).
    #[arg(long)]
    faults: Option<u32>,
    /// Simulated seconds during which faults are injected (default 120, with --data 20).
    #[arg(long)]
    fault_seconds: Option<u64>,
    /// Print the run's decisions (commits, boots, faults) to stderr.
    #[arg(long)]
    verbose: bool,
    /// Print one JSON document (per-seed results, seeds per minute) instead of lines.
    #[arg(long)]
    json: bool,
    /// The data simulator: real stores over simulated disks, the placement-group cores,
    /// clients writing and reading a replicated pool, faults and checkers.
    #[arg(long)]
    data: bool,
    /// (--data) Client operations per seed.
    #[arg(long, default_value_t = 10_000)]
    ops: u64,
}

pub fn run(args: SimArgs) -> Result<()> {
    let seeds = match (&args.seed, &args.seeds) {
        (Some(s), None) => *s..=*s,
        (None, Some(r)) => spindle_sim::parse_seeds(r).map_err(anyhow::Error::msg)?,
        (None, None) => 1..=1,
        (Some(_), Some(_)) => bail!("give --seed or --seeds, not both"),
    };
    if args.daemons == 0 || args.daemons > 64 {
        bail!("--daemons must be 1..=64");
    }
    if args.data {
        return run_data(&args, seeds);
    }
    let (clients, faults, fault_seconds) = (
        args.clients.unwrap_or(2),
        args.faults.unwrap_or(24),
        args.fault_seconds.unwrap_or(120),
    );
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut failing = Vec::new();
    let count = seeds.clone().count();
    for seed in seeds {
        let mut cfg = spindle_sim::WorldConfig::new(seed);
        cfg.daemons = args.daemons;
        cfg.clients = clients;
        cfg.faults = faults;
        cfg.fault_window_ms = fault_seconds * 1000;
        cfg.verbose = args.verbose;
        let t = Instant::now();
        let report = spindle_sim::run(cfg);
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let replay = format!(
            "spindle sim --seed {seed} --daemons {} --clients {} --faults {} --fault-seconds {}",
            args.daemons, clients, faults, fault_seconds
        );
        if !args.json {
            let verdict = if report.failures.is_empty() {
                "ok"
            } else {
                "FAILED"
            };
            println!(
                "seed {seed}: {verdict}  trace {}  {} events  {} faults  {} epochs  {:.1} s simulated  {wall_ms:.1} ms",
                report.trace_hash,
                report.events,
                report.faults,
                report.epochs,
                report.sim_time_ms as f64 / 1e3
            );
            for f in &report.failures {
                println!("  {f}");
            }
            if !report.failures.is_empty() {
                println!("  replay: {replay}");
            }
        }
        if !report.failures.is_empty() {
            failing.push((seed, replay));
        }
        reports.push((report, wall_ms));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let events: u64 = reports.iter().map(|(r, _)| r.events).sum();
    let sim_s: f64 = reports
        .iter()
        .map(|(r, _)| r.sim_time_ms as f64 / 1e3)
        .sum();
    if args.json {
        let doc = serde_json::json!({
            "seeds": count,
            "failed": failing.iter().map(|(s, r)| serde_json::json!({"seed": s, "replay": r})).collect::<Vec<_>>(),
            "wall_seconds": wall_s,
            "seeds_per_minute": count as f64 / wall_s * 60.0,
            "events_per_second": events as f64 / wall_s,
            "simulated_seconds_per_wall_second": sim_s / wall_s,
            "runs": reports.iter().map(|(r, ms)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["wall_ms"] = serde_json::json!(ms);
                v
            }).collect::<Vec<_>>(),
        });
        println!("{doc:#}");
    } else {
        println!(
            "{count} seed(s), {} failed, {wall_s:.2} s wall, {:.0} seeds/min, {:.0} events/s, {:.0}x real time",
            failing.len(),
            count as f64 / wall_s * 60.0,
            events as f64 / wall_s,
            sim_s / wall_s
        );
    }
    if !failing.is_empty() {
        for (seed, replay) in &failing {
            eprintln!("spindle sim: seed {seed} failed; replay: {replay}");
        }
        bail!("{} of {count} seed(s) failed", failing.len());
    }
    Ok(())
}

/// `spindle sim --data`: the data simulator over a seed range.
fn run_data(args: &SimArgs, seeds: std::ops::RangeInclusive<u64>) -> Result<()> {
    if args.clients.is_some_and(|c| c == 0 || c > 64) {
        bail!("--clients must be 1..=64");
    }
    if args.ops == 0 {
        bail!("--ops must be at least 1");
    }
    let count = seeds.clone().count();
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut failing = Vec::new();
    for seed in seeds {
        let mut cfg = spindle_sim::DataConfig::new(seed);
        cfg.daemons = args.daemons;
        cfg.ops = args.ops;
        cfg.verbose = args.verbose;
        if let Some(c) = args.clients {
            cfg.clients = c;
        }
        if let Some(f) = args.faults {
            cfg.faults = f;
        }
        if let Some(s) = args.fault_seconds {
            cfg.fault_window_ms = s * 1000;
        }
        let replay = cfg.replay();
        let t = Instant::now();
        let report = spindle_sim::run_data(cfg);
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        if !args.json {
            let verdict = if report.failures.is_empty() {
                "ok"
            } else {
                "FAILED"
            };
            println!(
                "seed {seed}: {verdict}  trace {}  {} ops ({} writes acked, {} reads checked, {} retries)  {} faults ({} crashes)  {} epochs  {} peerings  {} objects recovered  {:.1} s simulated  {wall_ms:.0} ms",
                report.trace_hash,
                report.ops_done,
                report.writes_acked,
                report.reads_checked,
                report.retries,
                report.faults,
                report.crashes,
                report.epochs,
                report.peerings,
                report.objects_recovered,
                report.sim_time_ms as f64 / 1e3
            );
            for f in &report.failures {
                println!("  {f}");
            }
        }
        if !report.failures.is_empty() {
            failing.push((seed, replay));
        }
        reports.push((report, wall_ms));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let ops: u64 = reports.iter().map(|(r, _)| r.ops_done).sum();
    let sim_s: f64 = reports
        .iter()
        .map(|(r, _)| r.sim_time_ms as f64 / 1e3)
        .sum();
    let seeds_per_minute = count as f64 / wall_s * 60.0;
    let ops_per_second = ops as f64 / wall_s;
    if args.json {
        let doc = serde_json::json!({
            "seeds": count,
            "failed": failing.iter().map(|(s, r)| serde_json::json!({"seed": s, "replay": r})).collect::<Vec<_>>(),
            "wall_seconds": wall_s,
            "seeds_per_minute": seeds_per_minute,
            "client_ops_per_second": ops_per_second,
            "simulated_seconds_per_wall_second": sim_s / wall_s,
            "runs": reports.iter().map(|(r, ms)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["wall_ms"] = serde_json::json!(ms);
                v
            }).collect::<Vec<_>>(),
        });
        println!("{doc:#}");
    } else {
        println!(
            "{count} seed(s), {} failed, {wall_s:.2} s wall, {seeds_per_minute:.1} seeds/min, {ops_per_second:.0} simulated client ops/s, {:.1}x real time",
            failing.len(),
            sim_s / wall_s
        );
    }
    if !failing.is_empty() {
        for (seed, replay) in &failing {
            eprintln!("spindle sim --data: seed {seed} failed; replay: {replay}");
        }
        bail!("{} of {count} seed(s) failed", failing.len());
    }
    Ok(())
}
