//! Reads racing with writes: never a false corruption, never a mix of two versions, and a
//! read after a resolved commit sees that commit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

#[test]
fn readers_see_whole_versions_only() {
    let dir = std::env::temp_dir().join(format!(
        "spindle-store-races-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Arc::new(Store::open(StoreConfig::new(&dir)).unwrap());
    let pg = PgId { pool: 5, pg: 5 };
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    store
        .apply(
            pg,
            "hot",
            Version { epoch: 1, seq: 1 },
            Mutation::WriteFull(vec![2; 10_000]),
        )
        .wait()
        .unwrap();
    acked.store(1, Ordering::SeqCst);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            let stop = stop.clone();
            let acked = acked.clone();
            rt.spawn(async move {
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let floor = acked.load(Ordering::SeqCst);
                    let data = store.read(pg, "hot", 0, u64::MAX).await.unwrap();
                    let b = data[0];
                    assert!(data.iter().all(|x| *x == b), "mixed versions in one read");
                    // Version v writes byte v % 250 + 1 over the whole object; a read
                    // started after v was acknowledged sees v or newer.
                    assert!(!data.is_empty());
                    let latest = acked.load(Ordering::SeqCst) + 1;
                    assert!(
                        (floor..=latest).any(|v| (v % 250) as u8 + 1 == b),
                        "read saw byte {b}, acknowledged range {floor}..={latest}"
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let mut size = 10_000usize;
    for seq in 2..1500u64 {
        let byte = (seq % 250) as u8 + 1;
        let m = if seq % 3 == 0 {
            // Overwrite the whole object in place (partial-block CRC path when unaligned).
            Mutation::Write {
                offset: 0,
                data: vec![byte; size],
            }
        } else {
            size = 4096 * (1 + (seq % 5) as usize) + (seq % 7) as usize * 100;
            Mutation::WriteFull(vec![byte; size])
        };
        store
            .apply(pg, "hot", Version { epoch: 1, seq }, m)
            .wait()
            .unwrap();
        acked.store(seq, Ordering::SeqCst);
        // Read-your-writes after the commit resolved.
        let got = rt.block_on(store.read(pg, "hot", 0, u64::MAX)).unwrap();
        assert_eq!(got, vec![byte; size]);
        assert_eq!(store.stat(pg, "hot").unwrap().version.seq, seq);
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for r in readers {
        total += rt.block_on(r).unwrap();
    }
    println!("{total} concurrent reads");
    assert!(total > 0);
    assert_eq!(store.stats().corruptions_detected, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
