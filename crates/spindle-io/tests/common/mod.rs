#![allow(dead_code)]
//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use spindle_io::{BackendChoice, BackendKind, Config, Engine, RingThreads};

/// Every engine flavour the tests run against.
pub fn flavours() -> Vec<(&'static str, Config)> {
    let uring1 = Config {
        backend: BackendChoice::IoUring,
        // Exercise the ring thread's poll-before-sleep path (other tests use the default 0).
        idle_spin: std::time::Duration::from_micros(20),
        ..Config::default()
    };
    let uring2 = Config {
        backend: BackendChoice::IoUring,
        ring_threads: RingThreads::Two,
        rings: 2,
        ..Config::default()
    };
    let pool = Config {
        backend: BackendChoice::ThreadPool,
        rings: 2,
        ..Config::default()
    };
    vec![
        ("uring-1thread", uring1),
        ("uring-2thread", uring2),
        ("pool", pool),
    ]
}

pub fn engine(config: Config) -> Engine {
    let expect_pool = config.backend == BackendChoice::ThreadPool;
    let engine = Engine::new(config).expect("engine");
    if expect_pool {
        assert_eq!(engine.backend(), BackendKind::ThreadPool);
    } else {
        assert_eq!(engine.backend(), BackendKind::IoUring);
    }
    engine
}

/// A fresh scratch directory under the target dir (removed by the caller if wanted).
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir().join(format!(
        "spindle-io-test-{}-{}-{}",
        std::process::id(),
        name,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&base).expect("scratch dir");
    base
}

/// Deterministic test bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
