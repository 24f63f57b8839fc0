//! Test 1: basic semantics against an in-memory model, with reopen (shutdown and drop).

mod common;

use common::{assert_matches, rt, Model};
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
        (0u64..20000).prop_map(MutSpec::Truncate),
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

fn config(dir: &std::path::Path, ckpt_bytes: u64) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.pg_log_max_entries = 6;
    c.checkpoint_journal_bytes = ckpt_bytes;
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(steps in prop::collection::vec(step_strategy(), 1..60), ckpt in prop_oneof![Just(16u64 << 10), Just(1u64 << 30)]) {
        let dir = tempdir();
        let rt = rt();
        let mut model = Model::new(6);
        let mut store = Some(Store::open(config(&dir, ckpt)).unwrap());
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
                    store = Some(Store::open(config(&dir, ckpt)).unwrap());
                }
            }
        }
        assert_matches(store.as_ref().unwrap(), &model, &rt);
        drop(store.take());
        let store = Store::open(config(&dir, ckpt)).unwrap();
        assert_matches(&store, &model, &rt);
        store.shutdown().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
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
