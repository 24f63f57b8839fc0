//! `spindle sim` as a user runs it: the JSON sweep, replay of one seed across processes,
//! and argument errors.

use std::process::Command;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

#[test]
fn a_json_sweep_reports_every_seed_and_the_rate() {
    let out = spindle()
        .args(["sim", "--seeds", "1..30", "--json"])
        .output()
        .expect("run spindle sim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["seeds"], 30);
    assert_eq!(doc["failed"].as_array().map(Vec::len), Some(0));
    assert!(doc["seeds_per_minute"].as_f64().unwrap_or(0.0) > 0.0);
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 30);
    assert!(runs.iter().all(|r| r["faults"].as_u64() >= Some(20)));
}

#[test]
fn a_seed_replays_with_the_same_trace_in_another_process() {
    let trace = |seed: &str| {
        let out = spindle()
            .args(["sim", "--seed", seed, "--json"])
            .output()
            .expect("run spindle sim");
        assert!(out.status.success());
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        doc["runs"][0]["trace_hash"]
            .as_str()
            .expect("trace hash")
            .to_string()
    };
    assert_eq!(trace("12"), trace("12"));
    assert_ne!(trace("12"), trace("13"));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = spindle().args(["sim", "--seeds", "9..3"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty seed range"));
    let out = spindle().args(["sim", "--daemons", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--daemons"));
}

/// `spindle sim --data`: the data simulator's JSON (seeds per minute, simulated client
/// operations per second) and a seed that replays in another process.
#[test]
fn the_data_simulator_reports_its_rates_and_replays_across_processes() {
    let run = |seeds: &str| {
        let out = spindle()
            .args(["sim", "--data", "--ops", "120", "--seeds", seeds, "--json"])
            .output()
            .expect("run spindle sim --data");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        doc
    };
    let doc = run("1..2");
    assert_eq!(doc["seeds"], 2);
    assert_eq!(doc["failed"].as_array().map(Vec::len), Some(0));
    assert!(doc["seeds_per_minute"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(doc["client_ops_per_second"].as_f64().unwrap_or(0.0) > 0.0);
    let runs = doc["runs"].as_array().expect("runs");
    assert!(runs.iter().all(|r| r["ops_done"].as_u64() == Some(120)));
    let again = run("2..2");
    assert_eq!(doc["runs"][1]["trace_hash"], again["runs"][0]["trace_hash"]);
    let out = spindle()
        .args(["sim", "--data", "--ops", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ops"));
}
