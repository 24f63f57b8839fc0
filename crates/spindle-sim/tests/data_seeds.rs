//! The data simulator in CI: real stores over simulated disks, the real placement-group
//! cores, clients, faults and checkers. A sweep of seeds must pass, one seed must replay
//! exactly, and deliberately broken rules must be caught.

use spindle_sim::{run_data, DataConfig, Mutant};

/// Seeds swept in CI (the issue asks for at least 200).
const CI_SEEDS: u64 = 200;
/// Client operations per seed in the sweep.
const CI_OPS: u64 = 300;

fn cfg(seed: u64, ops: u64) -> DataConfig {
    let mut c = DataConfig::new(seed);
    c.ops = ops;
    c
}

#[test]
fn a_sweep_of_seeds_with_faults_passes() {
    let mut failed = Vec::new();
    let (mut faults, mut crashes, mut recovered, mut acked) = (0, 0, 0, 0);
    for seed in 1..=CI_SEEDS {
        let r = run_data(cfg(seed, CI_OPS));
        assert_eq!(r.ops_done, CI_OPS, "seed {seed}: {:?}", r.failures);
        faults += r.faults;
        crashes += r.crashes;
        recovered += r.objects_recovered;
        acked += r.writes_acked;
        if !r.failures.is_empty() {
            failed.push(format!("seed {seed}:\n  {}", r.failures.join("\n  ")));
        }
    }
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    // The sweep exercised what it claims to.
    assert!(faults >= CI_SEEDS * 5, "{faults} faults");
    assert!(crashes >= CI_SEEDS / 2, "{crashes} crashes");
    assert!(recovered > 0, "no object was ever recovered");
    assert!(
        acked >= CI_SEEDS * CI_OPS / 2,
        "{acked} writes acknowledged"
    );
}

#[test]
fn one_seed_replays_exactly_and_seeds_differ() {
    for seed in [3, 41] {
        let a = run_data(cfg(seed, 400));
        let b = run_data(cfg(seed, 400));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.events, b.events, "seed {seed}");
        assert_eq!(a.sim_time_ms, b.sim_time_ms, "seed {seed}");
        assert_eq!(a.store_txns, b.store_txns, "seed {seed}");
    }
    let a = run_data(cfg(5, 200));
    let b = run_data(cfg(6, 200));
    assert_ne!(a.trace_hash, b.trace_hash);
}

/// Replays one seed with its decisions on stderr: `DATA_SEED=17 cargo test -p spindle-sim
/// --test data_seeds replay -- --nocapture` (does nothing without `DATA_SEED`).
#[test]
fn replay() {
    let Some(seed) = std::env::var("DATA_SEED").ok().and_then(|s| s.parse().ok()) else {
        return;
    };
    let ops = std::env::var("DATA_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CI_OPS);
    let mut c = cfg(seed, ops);
    c.verbose = true;
    let r = run_data(c);
    eprintln!("{r:#?}");
}
