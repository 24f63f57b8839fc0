//! The real store over `SimDisk`: seeded random transactions checked against a BTreeMap
//! model, through crashes (torn, unsynced data and names lost), a dying device, failed
//! fsyncs, a full disk and bit flips.
//!
//! Checked after every crash and reopen:
//! - every acknowledged transaction is there, exactly;
//! - a transaction that failed with an I/O error is entirely there or entirely absent,
//!   and after such an error the store acknowledges nothing more (it latches);
//! - `NoSpace` leaves the object unchanged (nothing was journaled) and never latches;
//! - a flipped bit in a data file is reported as `Corrupt`, never returned as data.
//!
//! Replay a failing seed: `SIM_DISK_SEED=<seed> cargo test -p spindle-store --test sim_disk`;
//! more seeds: `SIM_DISK_SEEDS=<count>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spindle_store::{
    Mutation, PgId, SimDisk, SimRng, Store, StoreConfig, StoreError, Version,
    DIRECT_WRITE_BYTES_MIN,
};

/// Seeds run by default (each a few crash epochs).
const SEEDS_DEFAULT: u64 = 96;
const EPOCHS: usize = 4;
const OPS_PER_EPOCH_MAX: u64 = 60;
const PGS: u32 = 3;
const OBJECTS: u64 = 5;

type Key = (u32, String);
/// The model: the acknowledged content of every object.
type Model = BTreeMap<Key, Vec<u8>>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn store_dir() -> PathBuf {
    PathBuf::from("/store")
}

fn config(rng: &mut SimRng) -> StoreConfig {
    let mut c = StoreConfig::new(store_dir());
    c.pg_log_max_entries = 8;
    // Small, so that checkpoints happen (and crash) in the middle of the workload; never
    // by time, so that the sequence of disk operations depends only on the seed.
    c.checkpoint_journal_bytes = [32 << 10, 256 << 10, 1 << 20][rng.below(3) as usize];
    c.checkpoint_interval_ms = 3_600_000;
    c.inline_max_bytes = [0, 4096, 16 << 10][rng.below(3) as usize];
    c.fd_cache_entries = 4;
    c.meta_cache_bytes = 1 << 20;
    c.reserve_bytes = 256 << 10;
    c
}

fn pg(n: u32) -> PgId {
    PgId { pool: 1, pg: n }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = SimRng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

fn random_mutation(rng: &mut SimRng) -> Mutation {
    match rng.below(11) {
        10 => {
            // A multi-extent write: sorted, non-overlapping extents (some share a block).
            let mut extents = Vec::new();
            let mut at = rng.below(8_000);
            for _ in 0..1 + rng.below(6) {
                let len_bytes = 1 + rng.below(3_000) as u32;
                extents.push(spindle_store::Extent {
                    offset: at,
                    len_bytes,
                });
                at += len_bytes as u64 + rng.below(5_000);
            }
            let total = extents.iter().map(|e| e.len_bytes as usize).sum();
            Mutation::WriteExtents {
                extents,
                data: pattern(total, rng.next_u64()),
            }
        }
        0..=2 => {
            let len = if rng.below(5) == 0 {
                DIRECT_WRITE_BYTES_MIN + rng.below(80_000) as usize
            } else {
                rng.below(12_000) as usize
            };
            Mutation::WriteFull(pattern(len, rng.next_u64()))
        }
        3..=6 => {
            let offset = rng.below(24_000);
            let len = rng.below(9_000) as usize;
            Mutation::Write {
                offset,
                data: pattern(len, rng.next_u64()),
            }
        }
        7 | 8 => Mutation::Truncate {
            size_bytes: rng.below(24_000),
        },
        _ => Mutation::Delete,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Power loss after the workload: nothing failed, acknowledged data must survive.
    Crash,
    /// The device dies after a random number of operations, then power loss.
    DeadDevice,
    /// One fsync (or O_DSYNC write) fails, then power loss.
    FsyncError,
    /// The disk fills up, then power loss.
    Full,
    /// Clean shutdown, one bit flipped in a data file, reopen.
    BitFlip,
}

/// A change of one object; kept when its transaction failed with an I/O error (either
/// state is then allowed).
struct Uncertain {
    key: Key,
    old: Option<Vec<u8>>,
    new: Option<Vec<u8>>,
}

struct Run {
    seed: u64,
    rng: SimRng,
    rt: tokio::runtime::Runtime,
    model: Model,
    uncertain: Vec<Uncertain>,
    seq: u64,
    /// Newest acknowledged version per PG.
    last_acked: BTreeMap<u32, Version>,
    cfg: StoreConfig,
    /// Counters of what the run exercised (asserted over all seeds).
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Stats {
    acked: u64,
    io_errors: u64,
    no_space: u64,
    corrupt: u64,
    crashes: u64,
    /// Journal records replay dropped because their batch's direct data had not landed.
    discarded: u64,
}

impl Run {
    fn fail(&self, msg: String) -> String {
        format!("seed {}: {msg}", self.seed)
    }

    fn read_all(&self, store: &Store, key: &Key) -> Result<Option<Vec<u8>>, StoreError> {
        match self.rt.block_on(store.read(pg(key.0), &key.1, 0, u64::MAX)) {
            Ok(d) => Ok(Some(d)),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Random transactions until `ops` are done or the store refuses (after an I/O error).
    fn workload(&mut self, store: &Store, disk: &SimDisk, ops: u64) -> Result<(), String> {
        for _ in 0..ops {
            let key: Key = (
                self.rng.below(PGS.into()) as u32,
                format!("o{}", self.rng.below(OBJECTS)),
            );
            if self.rng.below(5) == 0 && !disk.failed() {
                // A read of an acknowledged object returns exactly its bytes (or, once the
                // device died, an error).
                match self.read_all(store, &key) {
                    Ok(got) if got.as_ref() == self.model.get(&key) => {}
                    Ok(got) => {
                        return Err(self.fail(format!(
                            "read of {key:?} returned {:?} bytes, model has {:?}",
                            got.map(|g| g.len()),
                            self.model.get(&key).map(Vec::len)
                        )))
                    }
                    Err(e) if disk.failed() || disk.syncs_failed() > 0 => {
                        let _ = e;
                    }
                    Err(e) => return Err(self.fail(format!("read of {key:?} failed: {e}"))),
                }
            }
            self.seq += 1;
            let v = Version {
                epoch: 1,
                seq: self.seq,
            };
            // Every object the transaction changes (old and new state).
            let mut changes: Vec<Uncertain> = Vec::new();
            let mut delete = false;
            let mut removes_pg = false;
            let mut is_apply = false;
            let full_before = store.is_full();
            let commit = match self.rng.below(40) {
                0 => {
                    // The whole PG goes (recovery's stray removal).
                    removes_pg = true;
                    for (k, d) in self.model.range((key.0, String::new())..) {
                        if k.0 != key.0 {
                            break;
                        }
                        changes.push(Uncertain {
                            key: k.clone(),
                            old: Some(d.clone()),
                            new: None,
                        });
                    }
                    store.remove_pg(pg(key.0))
                }
                1..=3 => {
                    // Recovery installs a state (or removes the object): no log entry.
                    let state = (self.rng.below(4) != 0).then(|| {
                        let len = if self.rng.below(3) == 0 {
                            DIRECT_WRITE_BYTES_MIN + self.rng.below(10_000) as usize
                        } else {
                            self.rng.below(12_000) as usize
                        };
                        pattern(len, self.rng.next_u64())
                    });
                    let old = self.model.get(&key).cloned();
                    changes.push(Uncertain {
                        key: key.clone(),
                        old,
                        new: state.clone(),
                    });
                    store.recover_object(pg(key.0), &key.1, state.map(|d| (d, v)))
                }
                _ => {
                    let m = random_mutation(&mut self.rng);
                    let old = self.model.get(&key).cloned();
                    let new = m.apply_to(old.as_deref());
                    delete = matches!(m, Mutation::Delete);
                    is_apply = true;
                    changes.push(Uncertain {
                        key: key.clone(),
                        old,
                        new,
                    });
                    store.apply(pg(key.0), &key.1, v, m)
                }
            };
            match commit.wait() {
                Ok(()) => {
                    self.stats.acked += 1;
                    if removes_pg {
                        self.last_acked.remove(&key.0);
                    } else if is_apply {
                        // An apply sets the PG's last_version (a recover does not).
                        let last = self.last_acked.entry(key.0).or_insert(Version::ZERO);
                        *last = (*last).max(v);
                    }
                    for c in changes {
                        match c.new {
                            Some(d) => self.model.insert(c.key, d),
                            None => self.model.remove(&c.key),
                        };
                    }
                }
                Err(StoreError::NoSpace(e)) if delete && full_before => {
                    return Err(self.fail(format!(
                        "a delete was refused in full mode ({e}); full mode must accept it"
                    )))
                }
                Err(StoreError::NoSpace(_)) => self.stats.no_space += 1,
                Err(e) => {
                    self.stats.io_errors += 1;
                    if removes_pg {
                        self.last_acked.remove(&key.0);
                    }
                    self.uncertain.append(&mut changes);
                    // Latched: nothing more is acknowledged.
                    self.seq += 1;
                    let v = Version {
                        epoch: 1,
                        seq: self.seq,
                    };
                    let again = store
                        .apply(pg(0), "after-error", v, Mutation::WriteFull(vec![1; 10]))
                        .wait();
                    if again.is_ok() {
                        return Err(self.fail(format!(
                            "the store acknowledged a write after an I/O error ({e})"
                        )));
                    }
                    if store.space().failed.is_none() && !disk.failed() {
                        return Err(self.fail(format!(
                            "I/O error ({e}) did not latch the store (space().failed is None)"
                        )));
                    }
                    self.uncertain.push(Uncertain {
                        key: (0, "after-error".into()),
                        old: self.model.get(&(0, "after-error".to_string())).cloned(),
                        new: Some(vec![1; 10]),
                    });
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Every object is as the model (and the uncertain list) says.
    fn check(&mut self, store: &Store, what: &str) -> Result<(), String> {
        for (&p, &v) in &self.last_acked {
            let have = store.pg_info(pg(p)).last_version;
            if have < v {
                return Err(self.fail(format!(
                    "{what}: PG {p} last_version {have:?} is older than the acknowledged {v:?}"
                )));
            }
        }
        let mut keys: Vec<Key> = self.model.keys().cloned().collect();
        keys.extend(self.uncertain.iter().map(|u| u.key.clone()));
        for p in 0..PGS {
            for (name, _) in store.list(pg(p)) {
                keys.push((p, name));
            }
        }
        keys.sort();
        keys.dedup();
        for key in keys {
            let got = self
                .read_all(store, &key)
                .map_err(|e| self.fail(format!("{what}: read of {key:?} failed: {e}")))?;
            let want = self.model.get(&key);
            if got.as_ref() == want {
                continue;
            }
            let allowed = self
                .uncertain
                .iter()
                .filter(|u| u.key == key)
                .any(|u| got == u.old || got == u.new);
            if !allowed {
                return Err(self.fail(format!(
                    "{what}: {key:?} has {:?} bytes (first differing at {:?}), the model {:?}",
                    got.as_ref().map(Vec::len),
                    first_difference(got.as_deref(), want.map(Vec::as_slice)),
                    want.map(Vec::len)
                )));
            }
            // Resolve: the store's state is the truth from now on.
            match got {
                Some(d) => self.model.insert(key.clone(), d),
                None => self.model.remove(&key),
            };
        }
        self.uncertain.clear();
        // The totals `stats` keeps as objects change (not walked) are the model's.
        let s = store.stats();
        let bytes: u64 = self.model.values().map(|d| d.len() as u64).sum();
        if (s.objects, s.data_bytes) != (self.model.len() as u64, bytes) {
            return Err(self.fail(format!(
                "{what}: stats say {} objects of {} bytes, the model {} of {bytes}",
                s.objects,
                s.data_bytes,
                self.model.len()
            )));
        }
        Ok(())
    }

    fn open(&self, disk: &SimDisk, what: &str) -> Result<Store, String> {
        Store::open_on(Arc::new(disk.clone()), self.cfg.clone())
            .map_err(|e| self.fail(format!("{what}: reopen failed: {e}")))
    }
}

fn first_difference(a: Option<&[u8]>, b: Option<&[u8]>) -> Option<usize> {
    let (a, b) = (a?, b?);
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn data_files(disk: &SimDisk) -> Vec<PathBuf> {
    let objects = store_dir().join("objects");
    disk.files()
        .into_iter()
        .filter(|p| p.parent() == Some(Path::new(&objects)))
        .collect()
}

fn run_seed(seed: u64) -> Result<Stats, String> {
    let mut rng = SimRng::new(seed);
    let cfg = config(&mut rng);
    let mut run = Run {
        seed,
        rng,
        rt: rt(),
        model: Model::new(),
        uncertain: Vec::new(),
        seq: 0,
        last_acked: BTreeMap::new(),
        cfg,
        stats: Stats::default(),
    };
    let mut disk = SimDisk::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut store = run.open(&disk, "first open")?;
    for epoch in 0..EPOCHS {
        let fault = match run.rng.below(5) {
            0 => Fault::Crash,
            1 => Fault::DeadDevice,
            2 => Fault::FsyncError,
            3 => Fault::Full,
            _ => Fault::BitFlip,
        };
        let what = format!("epoch {epoch} ({fault:?})");
        let ops = 10 + run.rng.below(OPS_PER_EPOCH_MAX);
        match fault {
            Fault::DeadDevice => disk.fail_after_ops(run.rng.below(ops * 6)),
            Fault::FsyncError => disk.fail_sync_after(run.rng.below(ops)),
            Fault::Full => {
                let room = 256 * 1024 + run.rng.below(2 << 20);
                disk.set_capacity_bytes(disk.used_bytes() + room);
            }
            Fault::Crash | Fault::BitFlip => {}
        }
        let (no_space_before, io_errors_before) = (run.stats.no_space, run.stats.io_errors);
        run.workload(&store, &disk, ops)?;
        if fault == Fault::Full && run.stats.io_errors > io_errors_before {
            return Err(run.fail(format!(
                "{what}: a full disk gave an I/O error instead of NoSpace ({:?})",
                store.space().failed
            )));
        }
        if fault == Fault::Full && run.stats.no_space > no_space_before && !store.is_full() {
            // Full mode ends only by a space check; with nothing freed it must still hold.
            let room = store.space().avail_bytes;
            if room < 2 * run.cfg.reserve_bytes {
                return Err(run.fail(format!("{what}: NoSpace seen but not in full mode")));
            }
        }
        if fault == Fault::BitFlip {
            store
                .shutdown()
                .map_err(|e| run.fail(format!("{what}: shutdown: {e}")))?;
            let files = data_files(&disk);
            let mut flipped = None;
            if !files.is_empty() {
                let f = &files[run.rng.below(files.len() as u64) as usize];
                let len = disk.contents(f).map(|c| c.len() as u64).unwrap_or(0);
                if len > 0 {
                    disk.flip_bit(f, run.rng.below(len * 8))
                        .map_err(|e| run.fail(format!("flip: {e}")))?;
                    flipped = Some(f.clone());
                }
            }
            store = run.open(&disk, &what)?;
            let still_there = flipped.as_ref().is_some_and(|f| disk.contents(f).is_ok());
            // Exactly the object in the flipped file reads as corrupt; all others exact.
            let mut corrupt = Vec::new();
            let keys: Vec<Key> = run.model.keys().cloned().collect();
            for key in keys {
                match run.read_all(&store, &key) {
                    Ok(got) if got.as_ref() == run.model.get(&key) => {}
                    Ok(_) => {
                        return Err(
                            run.fail(format!("{what}: {key:?} returned flipped bytes as data"))
                        )
                    }
                    Err(StoreError::Corrupt { .. }) => corrupt.push(key),
                    Err(e) => return Err(run.fail(format!("{what}: read {key:?}: {e}"))),
                }
            }
            if still_there && corrupt.len() != 1 {
                return Err(run.fail(format!(
                    "{what}: flipped a bit in {flipped:?}; corrupt objects: {corrupt:?}"
                )));
            }
            run.stats.corrupt += corrupt.len() as u64;
            // Repair: rewrite the damaged objects (their bytes are known to the model).
            for key in corrupt {
                run.seq += 1;
                let v = Version {
                    epoch: 1,
                    seq: run.seq,
                };
                let data = run.model[&key].clone();
                store
                    .apply(pg(key.0), &key.1, v, Mutation::WriteFull(data))
                    .wait()
                    .map_err(|e| run.fail(format!("{what}: repair of {key:?}: {e}")))?;
            }
            continue;
        }
        // Let the worker finish what it started after the last acknowledgment (a
        // checkpoint may be running): a transaction that fails validation is answered
        // only after it, and leaves nothing due. The crash point then depends on the seed
        // only (crashes inside a checkpoint come from DeadDevice epochs).
        let barrier = store
            .apply(pg(0), "barrier", Version::ZERO, Mutation::Delete)
            .wait();
        assert!(
            barrier.is_err(),
            "seed {seed}: a version-0 delete was accepted"
        );
        // Power loss, then the reboot finds the crash image.
        let image = disk.crash();
        if std::env::var_os("SIM_DISK_DEBUG").is_some() {
            eprintln!(
                "{what}: files before {:?}\nafter {:?}",
                disk.files(),
                image.files()
            );
        }
        drop(store);
        run.stats.crashes += 1;
        image.set_capacity_bytes(1 << 40);
        disk = image;
        store = run.open(&disk, &what)?;
        run.stats.discarded += store.stats().replay_records_discarded;
        run.check(&store, &what)?;
    }
    store
        .shutdown()
        .map_err(|e| run.fail(format!("final shutdown: {e}")))?;
    let store = run.open(&disk, "final reopen")?;
    run.check(&store, "final reopen")?;
    drop(store);
    Ok(run.stats)
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?} is not a number: {e}"),
    }
}

#[test]
fn store_over_sim_disk_survives_crashes_and_faults() {
    let seeds: Vec<u64> = match env_u64("SIM_DISK_SEED") {
        Some(s) => vec![s],
        None => (0..env_u64("SIM_DISK_SEEDS").unwrap_or(SEEDS_DEFAULT)).collect(),
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    for &seed in &seeds {
        let outcome = std::panic::catch_unwind(|| run_seed(seed));
        match outcome {
            Ok(Ok(s)) => {
                total.acked += s.acked;
                total.io_errors += s.io_errors;
                total.no_space += s.no_space;
                total.corrupt += s.corrupt;
                total.crashes += s.crashes;
                total.discarded += s.discarded;
            }
            Ok(Err(msg)) => panic!(
                "{msg}\nreplay: SIM_DISK_SEED={seed} cargo test -p spindle-store --test sim_disk"
            ),
            Err(_) => panic!(
                "seed {seed} panicked (see above)\nreplay: SIM_DISK_SEED={seed} cargo test -p \
                 spindle-store --test sim_disk"
            ),
        }
    }
    eprintln!(
        "{} seeds in {:?}: {total:?}",
        seeds.len(),
        started.elapsed()
    );
    // The run must have exercised what it claims to test.
    if seeds.len() as u64 >= SEEDS_DEFAULT {
        assert!(total.acked > 100, "{total:?}");
        assert!(total.crashes > 20, "{total:?}");
        assert!(total.io_errors > 5, "{total:?}");
        assert!(total.no_space > 5, "{total:?}");
        assert!(total.corrupt > 2, "{total:?}");
        // Crashes while a batch's direct data was still being written, its record durable.
        assert!(total.discarded > 0, "{total:?}");
    }
}

/// A seed replays: the store's disk operations run on its worker thread only (the unlink
/// thread is off on a SimDisk, checkpoints are never due by time), so the same seed makes
/// the same decisions, faults and crash images.
#[test]
fn a_seed_replays_identically() {
    for seed in [1u64, 48, 77] {
        let a = run_seed(seed).expect("first run");
        let b = run_seed(seed).expect("second run");
        assert_eq!(a, b, "seed {seed} ran differently twice");
        assert!(a.acked > 0 && a.crashes > 0, "{a:?}");
    }
}

/// With `timed_checkpoints` off, a checkpoint happens only when asked
/// (`Store::checkpoint_now`) or by journal size: the disk operations of a run then depend on
/// its transactions only, whatever the wall clock does. Two runs of one script leave
/// byte-identical disks.
#[test]
fn untimed_checkpoints_happen_only_when_asked_and_runs_repeat_exactly() {
    fn one_run() -> (u64, Vec<(PathBuf, Vec<u8>)>, u64) {
        let disk = SimDisk::new(11);
        let mut c = StoreConfig::new(store_dir());
        c.checkpoint_interval_ms = 1;
        c.timed_checkpoints = false;
        c.reserve_bytes = 0;
        c.fd_cache_entries = 4;
        c.meta_cache_bytes = 1 << 20;
        let store = Store::open_on(Arc::new(disk.clone()), c).expect("open");
        let at_open = store.stats().checkpoints;
        for i in 0..20u64 {
            let data = pattern(3000 + i as usize * 100, i);
            let v = Version {
                epoch: 1,
                seq: i + 1,
            };
            store
                .apply(pg(0), &format!("o{}", i % 4), v, Mutation::WriteFull(data))
                .wait()
                .expect("apply");
            // Far longer than the interval: a timed checkpoint would have happened.
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        assert_eq!(store.stats().checkpoints, at_open, "no checkpoint by time");
        store.checkpoint_now().expect("checkpoint");
        let checkpoints = store.stats().checkpoints - at_open;
        assert_eq!(checkpoints, 1, "one checkpoint, when asked");
        let files: Vec<(PathBuf, Vec<u8>)> = disk
            .files()
            .into_iter()
            .map(|f| {
                let bytes = disk.contents(&f).expect("contents");
                (f, bytes)
            })
            .collect();
        let ops = disk.ops();
        drop(store);
        (ops, files, checkpoints)
    }
    let a = one_run();
    let b = one_run();
    assert_eq!(a.0, b.0, "same number of disk operations");
    assert!(a.1 == b.1, "byte-identical disks");
}

/// A direct (large whole-object) write is written together with its journal record, and
/// replay checks the data of the journal's last batch against the record's checksums. A
/// later change of the same object must therefore never share the direct write's batch:
/// it would change the file, and after a power loss the acknowledged batch would fail
/// the check and be dropped. Pairs (direct write, then a small write to the same object)
/// are queued back to back so that the worker takes many into one batch; every
/// acknowledged pair must survive the power loss that follows, with nothing dropped.
#[test]
fn a_direct_write_and_a_later_change_of_its_object_survive_power_loss() {
    let rt = rt();
    let mut disk = SimDisk::new(5);
    let mut c = StoreConfig::new(store_dir());
    c.timed_checkpoints = false;
    c.checkpoint_journal_bytes = 64 << 20;
    c.inline_max_bytes = 0;
    c.reserve_bytes = 0;
    let mut seq = 0u64;
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for round in 0..6u64 {
        let store = Store::open_on(Arc::new(disk.clone()), c.clone()).expect("open");
        assert_eq!(store.stats().replay_records_discarded, 0, "round {round}");
        for (name, want) in &model {
            let got = rt.block_on(store.read(pg(0), name, 0, u64::MAX));
            assert_eq!(
                got.as_ref().ok(),
                Some(want),
                "round {round}: {name} after power loss"
            );
        }
        let mut commits = Vec::new();
        for i in 0..12u64 {
            let name = format!("r{round}-{i}");
            let mut data = pattern(
                DIRECT_WRITE_BYTES_MIN + 4096 * (i as usize % 3),
                round * 100 + i,
            );
            let patch = Mutation::Write {
                offset: 5000,
                data: vec![round as u8 + 1; 300],
            };
            for m in [Mutation::WriteFull(data.clone()), patch] {
                seq += 1;
                let v = Version { epoch: 1, seq };
                commits.push(store.apply(pg(0), &name, v, m));
            }
            data[5000..5300].fill(round as u8 + 1);
            model.insert(name, data);
        }
        for commit in commits {
            commit.wait().expect("acknowledged");
        }
        // Power loss: only what was durable survives.
        disk = disk.crash();
        drop(store);
    }
}

/// Replay takes a direct write's block checksums from its journal record (they were
/// computed from the data before it was written), so a bit that rots in the file before
/// the replay is found by the next read instead of being checksummed as data.
#[test]
fn rot_in_a_direct_write_before_replay_is_detected_not_adopted() {
    let rt = rt();
    let disk = SimDisk::new(9);
    let mut c = StoreConfig::new(store_dir());
    c.timed_checkpoints = false;
    c.checkpoint_journal_bytes = 64 << 20;
    c.reserve_bytes = 0;
    let store = Store::open_on(Arc::new(disk.clone()), c.clone()).expect("open");
    let big = pattern(DIRECT_WRITE_BYTES_MIN * 2, 1);
    let v = |seq| Version { epoch: 1, seq };
    store
        .apply(pg(0), "big", v(1), Mutation::WriteFull(big.clone()))
        .wait()
        .expect("big");
    // A later batch: the direct write's batch is not the journal's last one.
    store
        .apply(pg(0), "small", v(2), Mutation::WriteFull(vec![7; 100]))
        .wait()
        .expect("small");
    let image = disk.crash();
    drop(store);
    let files = data_files(&image);
    assert_eq!(files.len(), 1, "only the big object has a file: {files:?}");
    image.flip_bit(&files[0], 8 * 70_000 + 3).expect("flip");
    let store = Store::open_on(Arc::new(image.clone()), c).expect("reopen");
    match rt.block_on(store.read(pg(0), "big", 0, u64::MAX)) {
        Err(StoreError::Corrupt { block, .. }) => assert_eq!(block, 70_000 / 4096),
        Ok(d) => panic!(
            "rotten bytes returned as data (equal to the original: {})",
            d == big
        ),
        Err(e) => panic!("unexpected error {e}"),
    }
    let small = rt.block_on(store.read(pg(0), "small", 0, u64::MAX));
    assert_eq!(small.ok(), Some(vec![7; 100]));
    assert_eq!(store.stats().replay_records_discarded, 0);
}
