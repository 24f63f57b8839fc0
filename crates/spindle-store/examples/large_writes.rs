//! Throughput and mean commit latency of whole-object writes large enough for the store's
//! direct path (a file of their own), `SIZE` bytes each, `QD` in flight, over 64 object
//! names (so files are freed and reused in place, as whole-object overwrites do).
//!
//! `SIZE=4194304 QD=4 N=300 cargo run --release -p spindle-store --example large_writes -- [dir]`
//!
//! Used for the A/B of writing a direct write's data together with its journal record
//! (docs/benchmarks.md, 2026-11-27): compare two builds in alternating runs.

use std::collections::VecDeque;
use std::time::Instant;

use spindle_store::{Commit, Mutation, PgId, Store, StoreConfig, Version};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}={v:?}: {e}")))
        .unwrap_or(default)
}

fn main() {
    let size = env("SIZE", 4 << 20) as usize;
    let qd = env("QD", 4).max(1) as usize;
    let n = env("N", 300);
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/var/tmp/spindle-large-writes".into()),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(StoreConfig::new(&dir)).expect("open the store");
    let pg = PgId { pool: 1, pg: 0 };
    let mut in_flight: VecDeque<(Instant, Commit)> = VecDeque::new();
    let mut commit_seconds = 0f64;
    let start = Instant::now();
    for i in 0..n {
        if in_flight.len() >= qd {
            if let Some((t, c)) = in_flight.pop_front() {
                c.wait().expect("write");
                commit_seconds += t.elapsed().as_secs_f64();
            }
        }
        let data = vec![(i % 251) as u8; size];
        let v = Version {
            epoch: 1,
            seq: i + 1,
        };
        let name = format!("o{}", i % 64);
        in_flight.push_back((
            Instant::now(),
            store.apply(pg, &name, v, Mutation::WriteFull(data)),
        ));
    }
    for (t, c) in in_flight {
        c.wait().expect("write");
        commit_seconds += t.elapsed().as_secs_f64();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "size {size} B, {qd} in flight, {n} writes: {:.0} MB/s, mean commit {:.0} us, {} flushes, {} files reused",
        n as f64 * size as f64 / secs / 1e6,
        commit_seconds / n as f64 * 1e6,
        store.stats().flushes,
        store.stats().files_reused
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
