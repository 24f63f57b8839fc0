//! Shared test helpers: an in-memory model of the store and a full comparison.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};

use spindle_store::{LogEntry, LogOp, Mutation, ObjectMeta, PgId, PgInfo, Store, Version};

#[derive(Default, Clone, Debug)]
pub struct ModelPg {
    pub objects: BTreeMap<String, (Vec<u8>, Version)>,
    pub log: VecDeque<LogEntry>,
    pub last: Version,
    pub tail: Version,
}

#[derive(Default, Clone, Debug)]
pub struct Model {
    pub pgs: BTreeMap<PgId, ModelPg>,
    pub log_max: usize,
}

impl Model {
    pub fn new(log_max: usize) -> Model {
        Model {
            pgs: BTreeMap::new(),
            log_max,
        }
    }

    pub fn apply(&mut self, pg: PgId, name: &str, version: Version, m: &Mutation) {
        let p = self.pgs.entry(pg).or_default();
        let op = match m {
            Mutation::Delete => {
                p.objects.remove(name);
                LogOp::Delete
            }
            other => {
                let obj = p
                    .objects
                    .entry(name.to_string())
                    .or_insert((Vec::new(), version));
                match other {
                    Mutation::WriteFull(d) => obj.0 = d.clone(),
                    Mutation::Write { offset, data } => {
                        let end = *offset as usize + data.len();
                        if obj.0.len() < end {
                            obj.0.resize(end, 0);
                        }
                        obj.0[*offset as usize..end].copy_from_slice(data);
                    }
                    Mutation::Truncate { size_bytes } => obj.0.resize(*size_bytes as usize, 0),
                    Mutation::WriteExtents { .. } => {
                        obj.0 = other.apply_to(Some(&obj.0)).unwrap_or_default();
                    }
                    Mutation::Delete => unreachable!(),
                }
                obj.1 = version;
                LogOp::Modify
            }
        };
        p.last = version;
        p.log.push_back(LogEntry {
            version,
            name: name.to_string(),
            op,
        });
        while p.log.len() > self.log_max {
            let e = p.log.pop_front().unwrap();
            p.tail = p.tail.max(e.version);
        }
    }

    pub fn last_version(&self, pg: PgId) -> Version {
        self.pgs.get(&pg).map_or(Version::ZERO, |p| p.last)
    }

    pub fn remove_pg(&mut self, pg: PgId) {
        self.pgs.remove(&pg);
    }

    pub fn recover(&mut self, pg: PgId, name: &str, state: Option<(Vec<u8>, Version)>) {
        let p = self.pgs.entry(pg).or_default();
        match state {
            Some(s) => {
                p.objects.insert(name.to_string(), s);
            }
            None => {
                p.objects.remove(name);
            }
        }
    }

    pub fn set_log(&mut self, pg: PgId, entries: Vec<LogEntry>, last: Version, tail: Version) {
        let p = self.pgs.entry(pg).or_default();
        p.log = entries.into();
        p.last = last;
        p.tail = tail;
        while p.log.len() > self.log_max {
            let e = p.log.pop_front().unwrap();
            p.tail = p.tail.max(e.version);
        }
    }

    fn nonempty_pgs(&self) -> Vec<PgId> {
        self.pgs
            .iter()
            .filter(|(_, p)| !p.objects.is_empty() || !p.log.is_empty() || p.last != Version::ZERO)
            .map(|(id, _)| *id)
            .collect()
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Asserts that the store equals the model: PG set, infos, logs, listings, object bytes
/// (read whole and verified).
/// `Store::stats`' object count and data bytes (kept as objects change, not walked) are
/// the model's.
pub fn assert_stats_match(store: &Store, model: &Model) {
    let s = store.stats();
    let objects: u64 = model.pgs.values().map(|p| p.objects.len() as u64).sum();
    let bytes: u64 = model
        .pgs
        .values()
        .flat_map(|p| p.objects.values())
        .map(|(d, _)| d.len() as u64)
        .sum();
    assert_eq!(
        (s.objects, s.data_bytes),
        (objects, bytes),
        "stats: (objects, data_bytes)"
    );
}

pub fn assert_matches(store: &Store, model: &Model, rt: &tokio::runtime::Runtime) {
    assert_eq!(store.pgs(), model.nonempty_pgs(), "pgs()");
    assert_stats_match(store, model);
    for (pg, mp) in &model.pgs {
        assert_eq!(
            store.pg_info(*pg),
            PgInfo {
                last_version: mp.last,
                log_tail: mp.tail,
                object_count: mp.objects.len() as u64,
                incomplete: false,
            },
            "pg_info {pg:?}"
        );
        assert_eq!(
            store.pg_log(*pg),
            Vec::from(mp.log.clone()),
            "pg_log {pg:?}"
        );
        let listed = store.list(*pg);
        let expect: Vec<(String, ObjectMeta)> = mp
            .objects
            .iter()
            .map(|(n, (d, v))| {
                (
                    n.clone(),
                    ObjectMeta {
                        size_bytes: d.len() as u64,
                        version: *v,
                    },
                )
            })
            .collect();
        assert_eq!(listed, expect, "list {pg:?}");
        for (name, (data, v)) in &mp.objects {
            let got = rt
                .block_on(store.read(*pg, name, 0, u64::MAX))
                .unwrap_or_else(|e| panic!("read {pg:?}/{name}: {e}"));
            assert!(
                got == *data,
                "content of {pg:?}/{name}: len {} vs {}",
                got.len(),
                data.len()
            );
            let meta = rt.block_on(store.verify(*pg, name)).unwrap();
            assert_eq!(meta.version, *v);
        }
    }
}
