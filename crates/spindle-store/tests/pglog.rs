//! Test 5: PG log trimming, set_pg_log, recover_object and remove_pg, across reopen.

mod common;

use std::path::PathBuf;

use common::{assert_matches, rt, Model};
use spindle_store::{LogEntry, LogOp, Mutation, PgId, Store, StoreConfig, Version};

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "spindle-store-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn v(seq: u64) -> Version {
    Version { epoch: 2, seq }
}

fn cfg(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.pg_log_max_entries = 16;
    c
}

#[test]
fn log_trims_and_recovery_operations_persist() {
    let dir = tempdir("pglog");
    let rt = rt();
    let a = PgId { pool: 1, pg: 1 };
    let b = PgId { pool: 1, pg: 2 };
    let mut model = Model::new(16);
    let store = Store::open(cfg(&dir)).unwrap();
    for i in 1..=40u64 {
        let m = if i % 7 == 0 {
            Mutation::Delete
        } else {
            Mutation::Write {
                offset: i * 10,
                data: vec![i as u8; 50],
            }
        };
        model.apply(a, &format!("n{}", i % 5), v(i), &m);
        store
            .apply(a, &format!("n{}", i % 5), v(i), m)
            .wait()
            .unwrap();
    }
    let log = store.pg_log(a);
    assert_eq!(log.len(), 16);
    assert_eq!(log.first().unwrap().version, v(25));
    assert_eq!(log.last().unwrap().version, v(40));
    assert_eq!(log[(35 - 25) as usize].op, LogOp::Delete);
    assert_eq!(store.pg_info(a).log_tail, v(24));
    assert_eq!(store.pg_info(a).last_version, v(40));
    assert_matches(&store, &model, &rt);
    drop(store);
    let store = Store::open(cfg(&dir)).unwrap();
    assert_matches(&store, &model, &rt);

    // Recovery operations on PG b.
    store
        .recover_object(b, "r1", Some((vec![9; 5000], v(100))))
        .wait()
        .unwrap();
    store
        .recover_object(b, "r2", Some((vec![8; 10], v(90))))
        .wait()
        .unwrap();
    store.recover_object(b, "r2", None).wait().unwrap();
    let big: Vec<u8> = (0..300_001u32).map(|i| (i % 251) as u8).collect();
    store
        .recover_object(b, "big", Some((big.clone(), v(99))))
        .wait()
        .unwrap();
    store
        .recover_object(b, "big", Some((big[..290_000].to_vec(), v(99))))
        .wait()
        .unwrap();
    model.recover(b, "big", Some((big[..290_000].to_vec(), v(99))));
    model.recover(b, "r1", Some((vec![9; 5000], v(100))));
    model.recover(b, "r2", Some((vec![8; 10], v(90))));
    model.recover(b, "r2", None);
    assert_eq!(store.pg_info(b).last_version, Version::ZERO);
    assert!(store.pg_log(b).is_empty());
    let entries: Vec<LogEntry> = (95..=100)
        .map(|s| LogEntry {
            version: v(s),
            name: format!("r{}", s % 2),
            op: LogOp::Modify,
        })
        .collect();
    store
        .set_pg_log(b, entries.clone(), v(100), v(94))
        .wait()
        .unwrap();
    model.set_log(b, entries, v(100), v(94));
    assert_matches(&store, &model, &rt);
    // Stale version after set_pg_log is refused.
    assert!(store
        .apply(b, "r1", v(100), Mutation::Delete)
        .wait()
        .is_err());
    store
        .apply(b, "r1", v(101), Mutation::Truncate { size_bytes: 10 })
        .wait()
        .unwrap();
    model.apply(b, "r1", v(101), &Mutation::Truncate { size_bytes: 10 });
    store.shutdown().unwrap();

    let store = Store::open(cfg(&dir)).unwrap();
    assert_matches(&store, &model, &rt);
    // remove_pg, then re-create the PG in the same checkpoint period.
    store.remove_pg(a).wait().unwrap();
    model.remove_pg(a);
    assert_eq!(store.pgs(), vec![b]);
    assert!(store.list(a).is_empty());
    assert_eq!(store.pg_info(a), Default::default());
    store
        .apply(a, "fresh", v(1), Mutation::WriteFull(vec![1; 3]))
        .wait()
        .unwrap();
    model.apply(a, "fresh", v(1), &Mutation::WriteFull(vec![1; 3]));
    assert_matches(&store, &model, &rt);
    drop(store);
    let store = Store::open(cfg(&dir)).unwrap();
    assert_matches(&store, &model, &rt);
    store.remove_pg(a).wait().unwrap();
    model.remove_pg(a);
    store.shutdown().unwrap();
    let store = Store::open(cfg(&dir)).unwrap();
    assert_matches(&store, &model, &rt);
    assert_eq!(store.pgs(), vec![b]);
    // Only PG b's file-backed object ("big", 290,000 B) has a file: "r1" (5000 B) is inline
    // (default threshold 64 KiB), and the removed PG's objects left nothing behind.
    let files = std::fs::read_dir(dir.join("objects")).unwrap().count();
    assert_eq!(files, 1);
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mark_pg`: the incomplete flag survives journal replay and checkpoints; marking the
/// copy complete again drops its (gappy) log and moves `log_tail` to the newest write
/// applied before the mark - including writes still queued when it was submitted.
#[test]
fn incomplete_mark_persists_and_completion_resets_the_log() {
    let a = PgId { pool: 3, pg: 7 };
    let e = PgId { pool: 3, pg: 8 };
    for checkpoint in [false, true] {
        let dir = tempdir("pgmark");
        {
            let store = Store::open(cfg(&dir)).unwrap();
            store.mark_pg(a, true).wait().unwrap();
            // An empty PG that is incomplete must not vanish at a checkpoint.
            store.mark_pg(e, true).wait().unwrap();
            store
                .apply(a, "x", v(1), Mutation::WriteFull(vec![1; 10]))
                .wait()
                .unwrap();
            assert!(store.pg_info(a).incomplete);
            if checkpoint {
                store.shutdown().unwrap();
            }
        }
        let store = Store::open(cfg(&dir)).unwrap();
        assert!(store.pg_info(a).incomplete, "checkpoint={checkpoint}");
        assert!(store.pg_info(e).incomplete, "checkpoint={checkpoint}");
        assert_eq!(store.pg_log(a).len(), 1);
        // Queue a write and the completion mark without waiting in between.
        let w = store.apply(a, "y", v(2), Mutation::WriteFull(vec![2; 10]));
        let m = store.mark_pg(a, false);
        w.wait().unwrap();
        m.wait().unwrap();
        let info = store.pg_info(a);
        assert!(!info.incomplete);
        assert_eq!(info.last_version, v(2));
        assert_eq!(info.log_tail, v(2));
        assert!(store.pg_log(a).is_empty());
        store.shutdown().unwrap();
        let store = Store::open(cfg(&dir)).unwrap();
        let info = store.pg_info(a);
        assert!(!info.incomplete);
        assert_eq!((info.last_version, info.log_tail), (v(2), v(2)));
        assert_eq!(store.stat(a, "x").unwrap().size_bytes, 10);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
