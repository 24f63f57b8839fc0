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
