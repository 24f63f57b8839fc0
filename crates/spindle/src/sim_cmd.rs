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
    /// Map-following clients.
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// Faults injected per seed (crashes, restarts, partitions, lossy network).
    #[arg(long, default_value_t = 24)]
    faults: u32,
    /// Simulated seconds during which faults are injected.
    #[arg(long, default_value_t = 120)]
    fault_seconds: u64,
    /// Print the run's decisions (commits, boots, faults) to stderr.
    #[arg(long)]
    verbose: bool,
    /// Print one JSON document (per-seed results, seeds per minute) instead of lines.
    #[arg(long)]
    json: bool,
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
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut failing = Vec::new();
    let count = seeds.clone().count();
    for seed in seeds {
        let mut cfg = spindle_sim::WorldConfig::new(seed);
        cfg.daemons = args.daemons;
        cfg.clients = args.clients;
        cfg.faults = args.faults;
        cfg.fault_window_ms = args.fault_seconds * 1000;
        cfg.verbose = args.verbose;
        let t = Instant::now();
        let report = spindle_sim::run(cfg);
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let replay = format!(
            "spindle sim --seed {seed} --daemons {} --clients {} --faults {} --fault-seconds {}",
            args.daemons, args.clients, args.faults, args.fault_seconds
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
