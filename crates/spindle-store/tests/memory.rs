//! Long-running memory: a store's resident memory must not grow with the number of distinct
//! objects ever written, only with the objects that exist (issue #16, item 5).
//!
//! The workload writes 200,000 distinct small objects and deletes each one a little later
//! (a rolling window of live objects, like a long-running daemon whose data set stays the
//! same size while names change). After warm-up (PG logs full, allocator pools grown) the
//! resident set must stay flat: before the fix the worker kept every written name in a set
//! that only journal replay drained, about 100 bytes per object for ever.

use std::path::PathBuf;

use spindle_store::{Mutation, PgId, Store, StoreConfig, Version};

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "spindle-store-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Resident set size of this process in bytes (`/proc/self/statm`, second field).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn trim() {
    // Hand freed heap pages back so the figure is what is really in use.
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: glibc's malloc_trim only releases free memory; it takes no pointers.
    unsafe {
        malloc_trim(0);
    }
}

const PGS: u32 = 8;
/// Objects alive at once: each name is deleted this many writes after it was written.
const WINDOW: u64 = 2_000;
const OBJECTS: u64 = 200_000;
const WARMUP_OBJECTS: u64 = 50_000;
/// Resident memory is read after every this many objects once warm-up is over.
const SAMPLE_EVERY_OBJECTS: u64 = 10_000;
/// Names are long-ish (as image objects are) so that a per-name leak is visible.
fn name(i: u64) -> String {
    format!("rbd_data.memory-test-image.{i:016x}")
}

#[test]
fn resident_memory_is_flat_with_distinct_objects_written() {
    let dir = tempdir("memory");
    let mut cfg = StoreConfig::new(&dir);
    cfg.pg_log_max_entries = 1024;
    // Small enough to be full after warm-up: a cache is allowed to grow to its bound.
    cfg.meta_cache_bytes = 4 << 20;
    // Names changed since the last checkpoint are remembered until it runs (at most 5 s of
    // writes by default): checkpoint often so the run covers many checkpoints.
    cfg.checkpoint_interval_ms = 100;
    let store = Store::open(cfg).unwrap();
    let payload = vec![0x5au8; 512];
    let mut seq = 0u64;
    let next = |seq: &mut u64| {
        *seq += 1;
        Version {
            epoch: 1,
            seq: *seq,
        }
    };
    // (objects written, resident bytes) after warm-up.
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let batch = 500u64;
    let mut i = 0u64;
    while i < OBJECTS {
        let mut commits = Vec::with_capacity(2 * batch as usize);
        for j in i..i + batch {
            let pg = PgId {
                pool: 1,
                pg: (j % PGS as u64) as u32,
            };
            commits.push(store.apply(
                pg,
                &name(j),
                next(&mut seq),
                Mutation::WriteFull(payload.clone()),
            ));
            if j >= WINDOW {
                let old = j - WINDOW;
                let pg = PgId {
                    pool: 1,
                    pg: (old % PGS as u64) as u32,
                };
                commits.push(store.apply(pg, &name(old), next(&mut seq), Mutation::Delete));
            }
        }
        for c in commits {
            c.wait().unwrap();
        }
        i += batch;
        if i >= WARMUP_OBJECTS && i.is_multiple_of(SAMPLE_EVERY_OBJECTS) {
            trim();
            samples.push((i as f64, rss_bytes() as f64));
        }
    }
    let live: usize = (0..PGS)
        .map(|pg| store.list(PgId { pool: 1, pg }).len())
        .sum();
    assert_eq!(live as u64, WINDOW, "the rolling window of live objects");
    // One reading swings by about 1 MiB either way (allocator pools, redb's cache churning
    // within its bound), so a first-versus-last comparison is noise-dominated. The slope of a
    // least-squares line through all readings is not: a per-name leak is a steady climb.
    let per_object = slope(&samples);
    let first = samples.first().map_or(0.0, |s| s.1);
    let last = samples.last().map_or(0.0, |s| s.1);
    println!(
        "rss after warm-up {:.1} MiB, at the end {:.1} MiB, {} readings: slope {per_object:.1} \
         bytes per distinct object written",
        first / 1048576.0,
        last / 1048576.0,
        samples.len()
    );
    // A leak of one small record per name is ~100 bytes per object (the bug this test was
    // written for leaked 144); the fitted slope of a flat run stays within a few bytes.
    assert!(
        per_object < 20.0,
        "resident memory grows with the number of distinct objects written: {per_object:.1} \
         bytes per object over {} objects (readings: {samples:?})",
        OBJECTS - WARMUP_OBJECTS
    );
    store.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    assert!(points.len() >= 2, "at least two readings");
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    cov / var
}
