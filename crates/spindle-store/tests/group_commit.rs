//! Test 2: group commit (many concurrent transactions share one flush), plus a small
//! throughput measurement printed with `--nocapture`.

use std::sync::Arc;
use std::time::Instant;

use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "spindle-store-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn concurrent_appliers_share_flushes() {
    let dir = tempdir("gc");
    let store = Arc::new(Store::open(StoreConfig::new(&dir)).unwrap());
    let before = store.stats();
    let threads: Vec<_> = (0..64u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let pg = PgId { pool: 1, pg: t };
                for i in 0..200u64 {
                    let v = Version {
                        epoch: 1,
                        seq: i + 1,
                    };
                    let name = format!("o{}", i % 8);
                    store
                        .apply(
                            pg,
                            &name,
                            v,
                            Mutation::Write {
                                offset: (i % 4) * 4096,
                                data: vec![t as u8; 4096],
                            },
                        )
                        .wait()
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = store.stats();
    let txns = s.transactions - before.transactions;
    let flushes = s.flushes - before.flushes;
    println!("64x200 writes: {txns} transactions, {flushes} flushes");
    assert_eq!(txns, 64 * 200);
    assert!(flushes * 4 < txns, "flushes {flushes} transactions {txns}");
    for t in 0..64u32 {
        let info = store.pg_info(PgId { pool: 1, pg: t });
        assert_eq!(info.last_version, Version { epoch: 1, seq: 200 });
        assert_eq!(info.object_count, 8);
    }
    Arc::try_unwrap(store).ok().unwrap().shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn throughput(size: usize, total: usize, in_flight: usize) {
    let dir = tempdir("bench");
    let store = Store::open(StoreConfig::new(&dir)).unwrap();
    let pg = PgId { pool: 1, pg: 0 };
    let data = vec![0x5au8; size];
    let start = Instant::now();
    let before = store.stats();
    let mut window = std::collections::VecDeque::new();
    for i in 0..total {
        let v = Version {
            epoch: 1,
            seq: i as u64 + 1,
        };
        let name = format!("obj{}", i % 64);
        window.push_back(store.apply(pg, &name, v, Mutation::WriteFull(data.clone())));
        if window.len() >= in_flight {
            window.pop_front().unwrap().wait().unwrap();
        }
    }
    for c in window {
        c.wait().unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let s = store.stats();
    println!(
        "{size} B x {total} at {in_flight} in flight: {:.0} tx/s, {:.1} MB/s, {} flushes",
        total as f64 / secs,
        (size * total) as f64 / secs / 1e6,
        s.flushes - before.flushes
    );
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn throughput_4k_and_4m() {
    throughput(4096, 20000, 16);
    throughput(4 << 20, 200, 16);
}
