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

/// A checkpoint syncs every data file written since the last one. With more dirty files
/// than the I/O engine has request slots (8,192), submitting all syncs before waiting for
/// any deadlocked the store's worker (found with an erasure-coded image whose shards were
/// files; a random write workload over an image of more than 32 GiB does the same). The
/// syncs now go in a bounded window.
#[test]
fn checkpoint_syncs_more_dirty_files_than_the_engine_has_request_slots() {
    let dir = tempdir("many-files");
    let mut cfg = StoreConfig::new(&dir);
    cfg.inline_max_bytes = 0; // every object gets a data file
    cfg.checkpoint_interval_ms = 3_600_000; // only the checkpoint of the shutdown
    cfg.checkpoint_journal_bytes = 1 << 40;
    const FILES: u64 = 9_000;
    let pg = PgId { pool: 1, pg: 0 };
    let data = |i: u64| vec![(i % 251) as u8; 4096];
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker_cfg = cfg.clone();
    std::thread::spawn(move || {
        let store = Store::open(worker_cfg).unwrap();
        let at_open = store.stats().checkpoints;
        let commits: Vec<_> = (0..FILES)
            .map(|i| {
                let v = Version {
                    epoch: 1,
                    seq: i + 1,
                };
                store.apply(pg, &format!("f{i}"), v, Mutation::WriteFull(data(i)))
            })
            .collect();
        for c in commits {
            c.wait().unwrap();
        }
        let checkpoints = store.stats().checkpoints - at_open;
        store.shutdown().unwrap();
        done_tx.send(checkpoints).unwrap();
    });
    let checkpoints_before_shutdown = done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("writing and checkpointing 9,000 files did not finish: the checkpoint hangs");
    assert_eq!(
        checkpoints_before_shutdown, 0,
        "the shutdown must be the checkpoint that syncs all the files"
    );
    assert_eq!(
        std::fs::read_dir(dir.join("objects")).unwrap().count() as u64,
        FILES
    );
    // Everything is there after a reopen (from the checkpoint, not a journal replay).
    let store = Store::open(cfg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for i in (0..FILES).step_by(97).chain([FILES - 1]) {
        let got = rt
            .block_on(store.read(pg, &format!("f{i}"), 0, 4096))
            .unwrap();
        assert_eq!(got, data(i), "object f{i}");
    }
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
