//! The simulator in CI: a sweep of seeds with faults must pass, and a seed must replay
//! exactly.

use spindle_sim::{run, WorldConfig};

/// Seeds swept in CI (the issue asks for at least 200; a seed takes a few milliseconds).
const CI_SEEDS: u64 = 400;

#[test]
fn a_sweep_of_seeds_with_faults_passes() {
    let mut failed = Vec::new();
    for seed in 1..=CI_SEEDS {
        let r = run(WorldConfig::new(seed));
        assert!(
            r.faults >= 20,
            "seed {seed}: only {} faults were injected",
            r.faults
        );
        assert!(
            r.epochs >= 5,
            "seed {seed}: the map barely changed ({} epochs)",
            r.epochs
        );
        if !r.failures.is_empty() {
            failed.push(format!(
                "seed {seed} (replay: spindle sim --seed {seed}):\n  {}",
                r.failures.join("\n  ")
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn one_seed_replays_exactly_and_seeds_differ() {
    for seed in [1, 77, 4242] {
        let a = run(WorldConfig::new(seed));
        let b = run(WorldConfig::new(seed));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.events, b.events);
        assert_eq!(a.sim_time_ms, b.sim_time_ms);
    }
    let hashes: std::collections::BTreeSet<String> = (1..=20)
        .map(|s| run(WorldConfig::new(s)).trace_hash)
        .collect();
    assert_eq!(hashes.len(), 20, "different seeds must give different runs");
}

#[test]
fn more_daemons_and_no_faults_also_converge() {
    for seed in 1..=20 {
        let mut cfg = WorldConfig::new(seed);
        cfg.daemons = 7;
        cfg.clients = 4;
        let r = run(cfg);
        assert!(r.failures.is_empty(), "seed {seed}: {:?}", r.failures);
        let mut quiet = WorldConfig::new(seed);
        quiet.faults = 0;
        let r = run(quiet);
        assert!(r.failures.is_empty(), "seed {seed}: {:?}", r.failures);
        assert_eq!(r.faults, 0);
    }
}
