//! Throughput of 4 KiB `WriteFull`s of new objects (distinct names), 16 in flight, and the
//! process CPU time (getrusage, user + system) per transaction.
//!
//! `cargo run --release -p spindle-store --example small_writes -- [dir] [count] [inline_max]`

use std::collections::VecDeque;
use std::time::Instant;

use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

fn cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "/tmp/spindle-small-writes".into());
    let count: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let inline: Option<u64> = args.next().and_then(|s| s.parse().ok());
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = StoreConfig::new(&dir);
    if let Some(i) = inline {
        cfg.inline_max_bytes = i;
    }
    let store = Store::open(cfg).expect("open");
    let data = vec![0x5Au8; 4096];
    let mut window = VecDeque::new();
    let t0 = Instant::now();
    let c0 = cpu_us();
    for i in 0..count {
        let pg = PgId {
            pool: 1,
            pg: (i % 32) as u32,
        };
        let v = Version {
            epoch: 1,
            seq: i / 32 + 1,
        };
        let name = format!("obj-{i}");
        window.push_back(store.apply(pg, &name, v, Mutation::WriteFull(data.clone())));
        if window.len() >= 16 {
            if let Some(c) = window.pop_front() {
                c.wait().expect("apply");
            }
        }
    }
    for c in window {
        c.wait().expect("apply");
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_us() - c0;
    let checkpoints = store.stats().checkpoints;
    store.shutdown().expect("shutdown");
    let cpu_all = cpu_us() - c0;
    println!(
        "{count} new 4 KiB objects: {:.0} writes/s, CPU {:.1} us/txn ({:.1} with the final checkpoint), checkpoints {checkpoints}",
        count as f64 / secs,
        cpu / count as f64,
        cpu_all / count as f64,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
