//! Test 3: crash safety with real SIGKILL.
//!
//! The parent re-executes this test binary in "writer" mode (env `SPINDLE_CRASH_DIR`):
//! the child applies the deterministic transaction stream T(start), T(start+1), ... with
//! up to 32 in flight and prints `ACK i` after T(i) resolved. The parent kills it with
//! SIGKILL after a random delay, reopens the store and checks that the store equals the
//! model after exactly the prefix T(0..=k) where k is derived from the PG last_versions,
//! that every acknowledged transaction is inside that prefix, and that every object reads
//! back with valid CRCs.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_matches, rt, Model};
use rand::{Rng, SeedableRng};
use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

const PGS: u32 = 4;
const OBJECTS: u64 = 50;
const LOG_MAX: usize = 64;

fn config(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::new(dir);
    c.pg_log_max_entries = LOG_MAX;
    c.checkpoint_journal_bytes = 512 << 10;
    c.checkpoint_interval_ms = 30;
    // Sizes in the stream (0..30,000 B, and 300,000 B) straddle this: objects are inline,
    // file-backed, and move between the two.
    c.inline_max_bytes = 8 << 10;
    c
}

/// Transaction `i` of the stream: (pg, name, version, mutation), a pure function of `i`.
fn txn(i: u64) -> (PgId, String, Version, Mutation) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let pg = PgId {
        pool: 3,
        pg: (i % PGS as u64) as u32,
    };
    let obj = rng.gen_range(0..OBJECTS);
    let name = format!("object:{obj}");
    let version = Version {
        epoch: 7,
        seq: i + 1,
    };
    let byte = (i % 251) as u8;
    let m = match rng.gen_range(0..10) {
        0..=2 => {
            let len = if rng.gen_range(0..20) == 0 {
                // Large: written directly to a data file. A block-aligned size makes the
                // file reusable in place once freed (overwritten by a later direct write
                // of the same size, after a checkpoint), an unaligned one does not.
                if rng.gen_bool(0.5) {
                    294_912
                } else {
                    300_000
                }
            } else {
                rng.gen_range(0..20_000)
            };
            Mutation::WriteFull(vec![byte; len])
        }
        3..=6 => Mutation::Write {
            offset: rng.gen_range(0..30_000),
            data: vec![byte; rng.gen_range(1..10_000)],
        },
        7..=8 => Mutation::Truncate {
            size_bytes: rng.gen_range(0..30_000),
        },
        _ => Mutation::Delete,
    };
    (pg, name, version, m)
}

#[test]
fn crash_writer_child() {
    let Ok(dir) = std::env::var("SPINDLE_CRASH_DIR") else {
        return; // normal test runs: nothing to do
    };
    let start: u64 = std::env::var("SPINDLE_CRASH_START")
        .unwrap()
        .parse()
        .unwrap();
    let store = Store::open(config(std::path::Path::new(&dir))).unwrap();
    let mut window = std::collections::VecDeque::new();
    let mut out = std::io::stdout().lock();
    writeln!(out, "OPEN").unwrap();
    out.flush().unwrap();
    for i in start.. {
        let (pg, name, v, m) = txn(i);
        window.push_back((i, store.apply(pg, &name, v, m)));
        if window.len() >= 32 {
            let (j, c) = window.pop_front().unwrap();
            c.wait().unwrap();
            writeln!(out, "ACK {j} {}", store.stats().checkpoints).unwrap();
            out.flush().unwrap();
        }
    }
}

#[test]
fn sigkill_at_random_moments() {
    if std::env::var("SPINDLE_CRASH_DIR").is_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "spindle-store-crash-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let rt = rt();
    let mut model = Model::new(LOG_MAX);
    let mut applied: u64 = 0; // transactions 0..applied are in the model
    let mut rng = rand::thread_rng();
    let rounds = 12;
    let mut total_child_ckpts = 0;
    let (mut saw_inline, mut saw_files) = (false, false);
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_writer_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("SPINDLE_CRASH_DIR", &dir)
            .env("SPINDLE_CRASH_START", applied.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let max_acked: Arc<Mutex<Option<u64>>> = Arc::new(Mutex::new(None));
        let child_ckpts = Arc::new(Mutex::new(0u64));
        let opened = Arc::new(Mutex::new(false));
        let reader = {
            let max_acked = max_acked.clone();
            let opened = opened.clone();
            let child_ckpts = child_ckpts.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.ends_with("OPEN") {
                        *opened.lock().unwrap() = true;
                    } else if let Some(n) = line.strip_prefix("ACK ") {
                        let mut it = n.split_whitespace();
                        let n: u64 = it.next().unwrap().parse().unwrap();
                        let c: u64 = it.next().unwrap().parse().unwrap();
                        *max_acked.lock().unwrap() = Some(n);
                        *child_ckpts.lock().unwrap() = c;
                    }
                }
            })
        };
        // Wait until the child opened the store (replay done), then a random delay.
        let t0 = Instant::now();
        while !*opened.lock().unwrap() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let delay = rng.gen_range(20..400);
        std::thread::sleep(Duration::from_millis(delay));
        unsafe {
            libc::kill(child.id() as i32, libc::SIGKILL);
        }
        let _ = child.wait();
        reader.join().unwrap();
        let acked = *max_acked.lock().unwrap();
        total_child_ckpts += *child_ckpts.lock().unwrap();

        let store = Store::open(config(&dir)).unwrap();
        // The store holds T(0..=k): k from the newest PG version.
        let k = (0..PGS)
            .map(|pg| store.pg_info(PgId { pool: 3, pg }).last_version.seq)
            .max()
            .unwrap();
        let now_applied = k; // versions are i + 1, so k transactions in total
        assert!(
            now_applied >= applied,
            "round {round}: store went back from {applied} to {now_applied}"
        );
        if let Some(a) = acked {
            assert!(
                now_applied > a,
                "round {round}: acked T({a}) but store only has {now_applied} txns"
            );
        }
        for i in applied..now_applied {
            let (pg, name, v, m) = txn(i);
            model.apply(pg, &name, v, &m);
        }
        applied = now_applied;
        assert_matches(&store, &model, &rt);
        // Both kinds of objects exist: inline ones (no file) and file-backed ones.
        let objects: usize = model.pgs.values().map(|p| p.objects.len()).sum();
        let files = std::fs::read_dir(dir.join("objects")).unwrap().count();
        let small = model
            .pgs
            .values()
            .flat_map(|p| p.objects.values())
            .filter(|(d, _)| d.len() <= 8 << 10)
            .count();
        assert!(files <= objects, "{files} files for {objects} objects");
        if applied > 500 {
            saw_inline |= files < objects;
            saw_files |= files > 0 && small > 0;
        }
        eprintln!("round {round}: delay {delay} ms, acked {acked:?}, store has {applied} txns, checkpoints {}", store.stats().checkpoints);
        if round % 2 == 0 {
            store.shutdown().unwrap();
        } else {
            drop(store);
        }
    }
    assert!(applied > 100, "too few transactions ran: {applied}");
    assert!(
        saw_inline && saw_files,
        "inline {saw_inline}, files {saw_files}"
    );
    // The children checkpointed while writing, so kills also hit checkpoints.
    eprintln!("checkpoints in killed children: {total_child_ckpts}");
    assert!(
        total_child_ckpts > 2 * rounds,
        "children checkpointed {total_child_ckpts} times"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
