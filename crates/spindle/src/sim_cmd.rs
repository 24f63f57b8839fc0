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
    /// (--data) The workload runs on an erasure-coded pool (k=2, m=1 unless --ec-k/--ec-m)
    /// instead of the replicated one.
    #[arg(long)]
    ec: bool,
    /// (--data --ec) Data shards.
    #[arg(long, default_value_t = 2)]
    ec_k: u32,
    /// (--data --ec) Parity shards.
    #[arg(long, default_value_t = 1)]
    ec_m: u32,
    /// (--data --ec) Shards up for a write (default: the pool default, k + 1 at most k + m).
    #[arg(long)]
    ec_min_size: Option<u32>,
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
    sweep(&args, seeds, "spindle sim", |seed| {
        let mut cfg = spindle_sim::WorldConfig::new(seed);
        cfg.daemons = args.daemons;
        cfg.clients = clients;
        cfg.faults = faults;
        cfg.fault_window_ms = fault_seconds * 1000;
        cfg.verbose = args.verbose;
        let replay = format!(
            "spindle sim --seed {seed} --daemons {} --clients {} --faults {} --fault-seconds {}",
            args.daemons, clients, faults, fault_seconds
        );
        (spindle_sim::run(cfg), replay)
    })
}

/// `spindle sim --data`: the data simulator over a seed range.
fn run_data(args: &SimArgs, seeds: std::ops::RangeInclusive<u64>) -> Result<()> {
    if args.clients.is_some_and(|c| c == 0 || c > 64) {
        bail!("--clients must be 1..=64");
    }
    if args.ops == 0 {
        bail!("--ops must be at least 1");
    }
    sweep(args, seeds, "spindle sim --data", |seed| {
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
        if args.ec {
            cfg.ec = Some(spindle_sim::EcShape {
                k: args.ec_k,
                m: args.ec_m,
                min_size: args.ec_min_size,
            });
        }
        let replay = cfg.replay();
        (spindle_sim::run_data(cfg), replay)
    })
}

/// What a sweep needs of one simulator's report.
trait SeedReport: serde::Serialize {
    fn failures(&self) -> &[String];
    fn sim_time_ms(&self) -> u64;
    /// The work a seed did, and its name in the rates (events, or client operations).
    fn work(&self) -> u64;
    const WORK_RATE_KEY: &'static str;
    const WORK_RATE_NAME: &'static str;
    /// The one-line summary of a seed.
    fn line(&self) -> String;
}

impl SeedReport for spindle_sim::WorldReport {
    fn failures(&self) -> &[String] {
        &self.failures
    }
    fn sim_time_ms(&self) -> u64 {
        self.sim_time_ms
    }
    fn work(&self) -> u64 {
        self.events
    }
    const WORK_RATE_KEY: &'static str = "events_per_second";
    const WORK_RATE_NAME: &'static str = "events/s";
    fn line(&self) -> String {
        format!(
            "trace {}  {} events  {} faults  {} epochs",
            self.trace_hash, self.events, self.faults, self.epochs
        )
    }
}

impl SeedReport for spindle_sim::DataReport {
    fn failures(&self) -> &[String] {
        &self.failures
    }
    fn sim_time_ms(&self) -> u64 {
        self.sim_time_ms
    }
    fn work(&self) -> u64 {
        self.ops_done
    }
    const WORK_RATE_KEY: &'static str = "client_ops_per_second";
    const WORK_RATE_NAME: &'static str = "simulated client ops/s";
    fn line(&self) -> String {
        format!(
            "trace {}  {} ops ({} writes acked, {} reads checked, {} retries)  {} faults ({} crashes)  {} epochs  {} peerings  {} objects recovered",
            self.trace_hash,
            self.ops_done,
            self.writes_acked,
            self.reads_checked,
            self.retries,
            self.faults,
            self.crashes,
            self.epochs,
            self.peerings,
            self.objects_recovered
        )
    }
}

/// Runs `run_one` (report, replay command) for every seed: a line per seed (or one JSON
/// document), every failing seed with its replay command, and an error if any failed.
fn sweep<R: SeedReport>(
    args: &SimArgs,
    seeds: std::ops::RangeInclusive<u64>,
    command: &str,
    mut run_one: impl FnMut(u64) -> (R, String),
) -> Result<()> {
    let count = seeds.clone().count();
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut failing = Vec::new();
    for seed in seeds {
        let t = Instant::now();
        let (report, replay) = run_one(seed);
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let failed = !report.failures().is_empty();
        if !args.json {
            let verdict = if failed { "FAILED" } else { "ok" };
            println!(
                "seed {seed}: {verdict}  {}  {:.1} s simulated  {wall_ms:.1} ms",
                report.line(),
                report.sim_time_ms() as f64 / 1e3
            );
            for f in report.failures() {
                println!("  {f}");
            }
            if failed {
                println!("  replay: {replay}");
            }
        }
        if failed {
            failing.push((seed, replay));
        }
        reports.push((report, wall_ms));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let work: u64 = reports.iter().map(|(r, _)| r.work()).sum();
    let sim_s: f64 = reports
        .iter()
        .map(|(r, _)| r.sim_time_ms() as f64 / 1e3)
        .sum();
    let seeds_per_minute = count as f64 / wall_s * 60.0;
    let work_per_second = work as f64 / wall_s;
    if args.json {
        let mut doc = serde_json::json!({
            "seeds": count,
            "failed": failing.iter().map(|(s, r)| serde_json::json!({"seed": s, "replay": r})).collect::<Vec<_>>(),
            "wall_seconds": wall_s,
            "seeds_per_minute": seeds_per_minute,
            "simulated_seconds_per_wall_second": sim_s / wall_s,
            "runs": reports.iter().map(|(r, ms)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["wall_ms"] = serde_json::json!(ms);
                v
            }).collect::<Vec<_>>(),
        });
        doc[R::WORK_RATE_KEY] = serde_json::json!(work_per_second);
        println!("{doc:#}");
    } else {
        println!(
            "{count} seed(s), {} failed, {wall_s:.2} s wall, {seeds_per_minute:.1} seeds/min, {work_per_second:.0} {}, {:.1}x real time",
            failing.len(),
            R::WORK_RATE_NAME,
            sim_s / wall_s
        );
    }
    if !failing.is_empty() {
        for (seed, replay) in &failing {
            eprintln!("{command}: seed {seed} failed; replay: {replay}");
        }
        bail!("{} of {count} seed(s) failed", failing.len());
    }
    Ok(())
}
