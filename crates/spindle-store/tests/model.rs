//! Test 1: basic semantics against an in-memory model, with reopen (shutdown and drop).

mod common;

use common::{assert_matches, assert_stats_match, rt, Model};
use proptest::prelude::*;
use spindle_store::{Mutation, PgId, Store, StoreConfig, StoreError, Version};

#[derive(Debug, Clone)]
enum Step {
    Apply {
        pg: u32,
        obj: u8,
        m: MutSpec,
    },
    Stale {
        pg: u32,
        obj: u8,
    },
    Read {
        pg: u32,
        obj: u8,
        offset: u64,
        len: u64,
    },
    Reopen {
        shutdown: bool,
    },
}

#[derive(Debug, Clone)]
enum MutSpec {
    Full(usize, u8),
    Write(u64, usize, u8),
    Truncate(u64),
    Delete,
}

fn mut_strategy() -> impl Strategy<Value = MutSpec> {
    prop_oneof![
        (
            prop_oneof![4 => 0usize..12000, 1 => 262_144usize..300_000],
            any::<u8>()
        )
            .prop_map(|(l, b)| MutSpec::Full(l, b)),
        (0u64..20000, 0usize..9000, any::<u8>()).prop_map(|(o, l, b)| MutSpec::Write(o, l, b)),
        // Any size, and sizes on a checksum block's edge (a path of their own).
        prop_oneof![3 => 0u64..20000, 1 => (0u64..5).prop_map(|b| b * 4096)]
            .prop_map(MutSpec::Truncate),
        Just(MutSpec::Delete),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u32..3, 0u8..4, mut_strategy()).prop_map(|(pg, obj, m)| Step::Apply { pg, obj, m }),
        1 => (0u32..3, 0u8..4).prop_map(|(pg, obj)| Step::Stale { pg, obj }),
        2 => (0u32..3, 0u8..4, 0u64..22000, 0u64..10000)
            .prop_map(|(pg, obj, offset, len)| Step::Read { pg, obj, offset, len }),
        1 => any::<bool>().prop_map(|shutdown| Step::Reopen { shutdown }),
    ]
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn name(obj: u8) -> String {
    // Names with characters that are not file-name safe.
    format!("obj/{obj} ünï\u{0}code")
}

fn config(dir: &std::path::Path, ckpt_bytes: u64, inline: u64) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.pg_log_max_entries = 6;
    c.checkpoint_journal_bytes = ckpt_bytes;
    c.inline_max_bytes = inline;
    // Far fewer cached descriptors than objects: most accesses evict one.
    c.fd_cache_entries = 2;
    c
}

/// Data files in the store directory.
fn file_count(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("objects")).unwrap().count()
}

/// Data files in the store directory once the unlink thread has caught up: replaced and
/// deleted objects' files are removed off the commit path, shortly after the ack. Waits
/// (up to 10 s) for the count to reach `expected`, then returns the count.
fn settled_file_count(dir: &std::path::Path, expected: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n = file_count(dir);
        if n == expected || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    // Objects of <= `inline` bytes are stored inline: 8 KiB (sizes in the steps straddle it:
    // writes, truncates and WriteFulls move objects between inline and file-backed), or 0
    // (disabled). `inline2` is the threshold after a reopen (a configuration change: objects
    // stay where they are until rewritten).
    fn store_matches_model(
        steps in prop::collection::vec(step_strategy(), 1..60),
        ckpt in prop_oneof![Just(16u64 << 10), Just(1u64 << 30)],
        inline in prop_oneof![3 => Just(8u64 << 10), 1 => Just(0u64)],
        inline2 in prop_oneof![3 => Just(8u64 << 10), 1 => Just(0u64), 1 => Just(64u64 << 10)],
    ) {
        let dir = tempdir();
        let rt = rt();
        let mut model = Model::new(6);
        let mut store = Some(Store::open(config(&dir, ckpt, inline)).unwrap());
        let mut cur_inline = inline;
        for step in steps {
            let s = store.as_ref().unwrap();
            match step {
                Step::Apply { pg, obj, m } => {
                    let pg = PgId { pool: 1, pg };
                    let v = model.last_version(pg);
                    let v = Version { epoch: v.epoch.max(1), seq: v.seq + 1 };
                    let m = match m {
                        MutSpec::Full(l, b) => Mutation::WriteFull(data(l, b)),
                        MutSpec::Write(o, l, b) => Mutation::Write { offset: o, data: data(l, b) },
                        MutSpec::Truncate(n) => Mutation::Truncate { size_bytes: n },
                        MutSpec::Delete => Mutation::Delete,
                    };
                    model.apply(pg, &name(obj), v, &m);
                    s.apply(pg, &name(obj), v, m).wait().unwrap();
                    assert_stats_match(s, &model);
                }
                Step::Stale { pg, obj } => {
                    let pg = PgId { pool: 1, pg };
                    let v = model.last_version(pg);
                    let r = s.apply(pg, &name(obj), v, Mutation::Truncate { size_bytes: 1 }).wait();
                    let is_stale = matches!(r, Err(StoreError::VersionNotNewer { .. }));
                    prop_assert!(is_stale, "{:?}", r);
                }
                Step::Read { pg, obj, offset, len } => {
                    let pg = PgId { pool: 1, pg };
                    let got = rt.block_on(s.read(pg, &name(obj), offset, len));
                    match model.pgs.get(&pg).and_then(|p| p.objects.get(&name(obj))) {
                        None => prop_assert!(matches!(got, Err(StoreError::NotFound)), "{:?}", got),
                        Some((d, _)) => {
                            let start = (offset as usize).min(d.len());
                            let end = (offset.saturating_add(len) as usize).min(d.len());
                            prop_assert_eq!(got.unwrap(), d[start..end.max(start)].to_vec());
                        }
                    }
                }
                Step::Reopen { shutdown } => {
                    let s = store.take().unwrap();
                    if shutdown { s.shutdown().unwrap(); } else { drop(s); }
                    cur_inline = if cur_inline == inline { inline2 } else { inline };
                    store = Some(Store::open(config(&dir, ckpt, cur_inline)).unwrap());
                }
            }
        }
        assert_matches(store.as_ref().unwrap(), &model, &rt);
        drop(store.take());
        let store = Store::open(config(&dir, ckpt, cur_inline)).unwrap();
        assert_matches(&store, &model, &rt);
        // Unreferenced files are removed at open: at most one file per object; without
        // inline objects exactly one.
        let objects: usize = model.pgs.values().map(|p| p.objects.len()).sum();
        if inline == 0 && inline2 == 0 {
            prop_assert_eq!(settled_file_count(&dir, objects), objects);
        } else {
            prop_assert!(file_count(&dir) <= objects);
        }
        store.shutdown().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every transition between inline and file-backed storage, each checked through the
/// in-memory copy, after a checkpoint (bytes in the database), after a replay (drop without
/// checkpoint) and with the files counted.
#[test]
fn inline_transitions() {
    let dir = tempdir();
    let rt = rt();
    let cfg = config(&dir, 1 << 30, 8 << 10);
    let pg = PgId { pool: 4, pg: 4 };
    let mut model = Model::new(6);
    let mut seq = 0;
    let steps: Vec<(&str, Mutation, usize)> = vec![
        // (object, mutation, data files expected afterwards)
        ("a", Mutation::WriteFull(data(5000, 1)), 0), // new inline
        ("b", Mutation::Truncate { size_bytes: 8192 }, 0), // new inline, exactly the threshold
        (
            "a",
            Mutation::Write {
                offset: 100,
                data: data(300, 2),
            },
            0,
        ), // inline partial write
        (
            "a",
            Mutation::Write {
                offset: 8000,
                data: data(500, 3),
            },
            1,
        ), // inline -> file
        ("b", Mutation::Truncate { size_bytes: 8193 }, 2), // inline -> file by truncate
        ("b", Mutation::Truncate { size_bytes: 10 }, 2), // shrinks: stays a file
        ("a", Mutation::WriteFull(data(4096, 4)), 1), // file -> inline (WriteFull)
        ("c", Mutation::WriteFull(data(300_000, 5)), 2), // large direct write: file
        ("c", Mutation::WriteFull(data(7000, 6)), 1), // direct file -> inline
        ("a", Mutation::WriteFull(data(300_000, 7)), 2), // inline -> direct file
        (
            "c",
            Mutation::Write {
                offset: 9000,
                data: data(10, 8),
            },
            3,
        ), // inline -> file (gap)
        ("c", Mutation::Delete, 2),
        ("d", Mutation::WriteFull(Vec::new()), 2), // empty inline object
        ("d", Mutation::Delete, 2),                // deleting inline touches no file
        (
            "e",
            Mutation::Write {
                offset: 20,
                data: data(30, 9),
            },
            2,
        ),
    ];
    for round in 0..3 {
        let store = Store::open(cfg.clone()).unwrap();
        assert_matches(&store, &model, &rt);
        for (obj, m, files) in &steps {
            seq += 1;
            let v = Version { epoch: 1, seq };
            model.apply(pg, obj, v, m);
            store.apply(pg, obj, v, m.clone()).wait().unwrap();
            if round == 0 {
                assert_eq!(
                    settled_file_count(&dir, *files),
                    *files,
                    "after {obj} {m:?}"
                );
            }
            assert_matches(&store, &model, &rt);
        }
        match round {
            0 => drop(store),               // replay from the journal
            1 => store.shutdown().unwrap(), // from the checkpoint
            _ => {
                // Checkpoint (bytes move to the database), then read from there.
                store.shutdown().unwrap();
                let store = Store::open(cfg.clone()).unwrap();
                assert_matches(&store, &model, &rt);
                let got = rt.block_on(store.read(pg, "e", 10, 100)).unwrap();
                let mut want = vec![0u8; 10];
                want.extend(data(30, 9));
                assert_eq!(got, want);
                store.shutdown().unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_names_are_rejected() {
    let dir = tempdir();
    let store = Store::open(StoreConfig::new(&dir)).unwrap();
    let pg = PgId { pool: 0, pg: 0 };
    let v = Version { epoch: 1, seq: 1 };
    assert!(matches!(
        store.apply(pg, "", v, Mutation::Delete).wait(),
        Err(StoreError::InvalidName(_))
    ));
    let long = "x".repeat(1025);
    assert!(matches!(
        store.apply(pg, &long, v, Mutation::Delete).wait(),
        Err(StoreError::InvalidName(_))
    ));
    let ok = "é".repeat(512); // exactly 1024 bytes
    store
        .apply(pg, &ok, v, Mutation::WriteFull(vec![1, 2, 3]))
        .wait()
        .unwrap();
    assert_eq!(store.stat(pg, &ok).unwrap().size_bytes, 3);
    assert!(matches!(
        store
            .apply(
                pg,
                "a",
                Version { epoch: 1, seq: 2 },
                Mutation::Write {
                    offset: u64::MAX,
                    data: vec![1]
                }
            )
            .wait(),
        Err(StoreError::InvalidArgument(_))
    ));
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "spindle-store-model-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn store_and_read_future_are_send() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let dir = tempdir();
    let store = Store::open(StoreConfig::new(&dir)).unwrap();
    send_sync(&store);
    let pg = PgId { pool: 0, pg: 0 };
    let read = store.read(pg, "x", 0, 1);
    send(&read);
    let verify = store.verify(pg, "x");
    send(&verify);
    let commit = store.apply(pg, "x", Version { epoch: 1, seq: 1 }, Mutation::Delete);
    send(&commit);
    drop((read, verify));
    commit.wait().unwrap();
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
