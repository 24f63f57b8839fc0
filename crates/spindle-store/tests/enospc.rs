//! A full file system (issue #16): ENOSPC fails only the operations that needed the space,
//! deletes work on a full store, writes work again once space is free, and every object
//! acknowledged before the disk filled is intact (live and after reopening).
//!
//! Runs on a real small file system: a tmpfs mount with a size limit (needs root; the test
//! fails, it does not skip, when it cannot mount). O_DIRECT is refused by tmpfs, so this
//! also covers the store's buffered fallback.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

/// A tmpfs of `size_mib` mounted on a fresh directory; unmounted (lazily) on drop, also
/// when the test panics.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(tag: &str, size_mib: u32) -> Tmpfs {
        let dir = std::env::temp_dir().join(format!(
            "spindle-enospc-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs a small real file system: `mount -t tmpfs` failed (run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn pattern(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(31) as usize + j * 7) as u8)
        .collect()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn verify(store: &Store, acked: &BTreeMap<String, (PgId, Vec<u8>)>) {
    for (name, (pg, data)) in acked {
        let got = block_on(store.read(*pg, name, 0, data.len() as u64))
            .unwrap_or_else(|e| panic!("{name}: acknowledged object unreadable: {e}"));
        assert!(got == *data, "{name}: acknowledged bytes differ");
    }
}

/// Sizes cycle through the store's three write paths: inline (8 KiB), buffered file
/// (96 KiB) and direct large write (1 MiB).
const SIZES: [usize; 3] = [8 << 10, 96 << 10, 1 << 20];

fn fill(
    store: &Store,
    acked: &mut BTreeMap<String, (PgId, Vec<u8>)>,
    seq: &mut u64,
    tag: &str,
) -> String {
    for i in 0..100_000u64 {
        let pg = PgId {
            pool: 1,
            pg: (i % 4) as u32,
        };
        *seq += 1;
        let v = Version {
            epoch: 1,
            seq: *seq,
        };
        let name = format!("{tag}-{i}");
        let data = pattern(*seq, SIZES[i as usize % SIZES.len()]);
        match store
            .apply(pg, &name, v, Mutation::WriteFull(data.clone()))
            .wait()
        {
            Ok(()) => {
                acked.insert(name, (pg, data));
            }
            Err(e) => return e.to_string(),
        }
    }
    panic!("the file system never filled");
}

#[test]
fn full_file_system_fails_writes_only_and_recovers_without_reopen() {
    let fs = Tmpfs::mount("store", 96);
    let dir = fs.dir.join("store");
    let store = Store::open(StoreConfig::new(&dir)).unwrap();
    let mut acked = BTreeMap::new();
    let mut seq = 0u64;

    // 1. Fill until a write fails: the error says why (no space), not "I/O error".
    let err = fill(&store, &mut acked, &mut seq, "a");
    assert!(
        err.to_lowercase().contains("no space"),
        "a write on a full file system must fail with a no-space error, got: {err}"
    );
    assert!(acked.len() > 20, "only {} objects fit", acked.len());
    // Later writes fail the same way (the store refuses new data while full)...
    seq += 1;
    let pg0 = PgId { pool: 1, pg: 0 };
    let again = store
        .apply(
            pg0,
            "late",
            Version { epoch: 1, seq },
            Mutation::WriteFull(vec![1; 4096]),
        )
        .wait();
    let again = again.expect_err("a write to a full store must fail");
    assert!(
        again.to_string().to_lowercase().contains("no space"),
        "{again}"
    );
    // ...while every acknowledged object is intact.
    verify(&store, &acked);

    // 2. Deletes and truncates work on the full store (this is how space is freed).
    let names: Vec<String> = acked.keys().cloned().collect();
    let mut deleted = 0;
    for (k, name) in names.iter().enumerate() {
        let pg = acked[name].0;
        seq += 1;
        let v = Version { epoch: 1, seq };
        if k % 3 != 0 {
            store
                .apply(pg, name, v, Mutation::Delete)
                .wait()
                .unwrap_or_else(|e| panic!("delete of {name} on a full store failed: {e}"));
            acked.remove(name);
            deleted += 1;
        } else if k % 6 == 0 {
            store
                .apply(pg, name, v, Mutation::Truncate { size_bytes: 4096 })
                .wait()
                .unwrap_or_else(|e| panic!("truncate of {name} on a full store failed: {e}"));
            if let Some((_, d)) = acked.get_mut(name) {
                d.resize(4096, 0);
            }
        }
    }
    assert!(deleted > 10);

    // 3. Writes work again once space is free, without reopening the store.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0u64;
    let written_again = loop {
        seq += 1;
        let pg = PgId { pool: 1, pg: 1 };
        let data = pattern(seq, 96 << 10);
        let name = format!("b-{n}");
        match store
            .apply(
                pg,
                &name,
                Version { epoch: 1, seq },
                Mutation::WriteFull(data.clone()),
            )
            .wait()
        {
            Ok(()) => {
                acked.insert(name, (pg, data));
                break true;
            }
            Err(e) if Instant::now() < deadline => {
                assert!(e.to_string().to_lowercase().contains("no space"), "{e}");
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("writes still fail 10 s after space was freed: {e}"),
        }
    };
    assert!(written_again);
    // Fill a second time: the store goes full and recovers repeatedly.
    let err2 = fill(&store, &mut acked, &mut seq, "c");
    assert!(err2.to_lowercase().contains("no space"), "{err2}");
    verify(&store, &acked);

    // 4. Everything acknowledged survives a reopen (journal replay on a full disk).
    store.shutdown().ok();
    let store = Store::open(StoreConfig::new(&dir)).expect("reopen a full store");
    verify(&store, &acked);
    drop(store);
}
