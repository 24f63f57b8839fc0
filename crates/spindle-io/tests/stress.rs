//! Many threads, many rings, many mixed requests: every request completes exactly once and
//! every byte read is the byte last written there.

mod common;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use common::scratch_dir;
use spindle_io::{BackendChoice, Config, Engine, IoBuf, Op, RingThreads};

const BLOCK_BYTES: usize = 4096;
const BLOCKS_PER_THREAD: usize = 64;
const WINDOW: usize = 32;

fn run(config: Config, threads: usize, requests_per_thread: usize) {
    let engine = Arc::new(Engine::new(config).unwrap());
    let dir = scratch_dir("stress");
    let file = Arc::new(
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("data"))
            .unwrap(),
    );
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let engine = engine.clone();
            let file = file.clone();
            std::thread::spawn(move || {
                let fd = file.as_raw_fd();
                let base = (t * BLOCKS_PER_THREAD * BLOCK_BYTES) as u64;
                // Model: the version last written to each block (0 = never written: zeros).
                let mut versions = vec![0u32; BLOCKS_PER_THREAD];
                let mut rng = 0x1234_5678_9abc_def1u64 ^ (t as u64).wrapping_mul(0x9e37_79b9);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let content = |block: usize, version: u32| -> Vec<u8> {
                    let mut v = vec![0u8; BLOCK_BYTES];
                    if version > 0 {
                        for (i, b) in v.iter_mut().enumerate() {
                            *b = (i as u32 ^ version.wrapping_mul(31) ^ (block as u32) << 8) as u8;
                        }
                    }
                    v
                };
                let mut done = 0usize;
                let mut window = Vec::with_capacity(WINDOW);
                let mut kinds = Vec::with_capacity(WINDOW);
                while done < requests_per_thread {
                    let n = WINDOW.min(requests_per_thread - done);
                    // Distinct blocks per window so the outcome does not depend on order.
                    let start = (next() as usize) % BLOCKS_PER_THREAD;
                    for i in 0..n {
                        let block = (start + i * 2) % BLOCKS_PER_THREAD;
                        let offset = base + (block * BLOCK_BYTES) as u64;
                        // 40% writes, 30% reads, 10% readv, ~19% nop, ~1% fdatasync.
                        let kind = match next() % 100 {
                            0..=39 => 0,
                            40..=69 => 4,
                            70..=79 => 7,
                            80..=98 => 8,
                            _ => 9,
                        };
                        let op = match kind {
                            0..=3 => {
                                versions[block] += 1;
                                Op::write(fd, offset, content(block, versions[block]))
                            }
                            4..=6 => Op::read(fd, offset, vec![0u8; BLOCK_BYTES]),
                            7 => Op::Readv {
                                fd,
                                offset: Some(offset),
                                bufs: vec![IoBuf::zeroed(1000), IoBuf::zeroed(BLOCK_BYTES - 1000)],
                            },
                            8 => Op::Nop,
                            _ => Op::Fdatasync { fd },
                        };
                        window.push(engine.submit(op).unwrap());
                        kinds.push((kind, block));
                    }
                    engine.block_on(&window);
                    assert_eq!(engine.poll(&window), n);
                    for (mut req, (kind, block)) in window.drain(..).zip(kinds.drain(..)) {
                        let c = req.try_take().expect("completion present exactly once");
                        assert!(req.try_take().is_none(), "completion taken twice");
                        let want = content(block, versions[block]);
                        match kind {
                            0..=3 => assert_eq!(c.result.unwrap(), BLOCK_BYTES),
                            4..=6 => {
                                // A never-written block inside the file reads zeros; past the
                                // end of the file it is a short read (EOF).
                                let got = c.result.unwrap();
                                let buf = c.buf.unwrap();
                                assert!(buf[..got] == want[..got], "thread {t} block {block}");
                                if got < BLOCK_BYTES {
                                    assert_eq!(versions[block], 0);
                                }
                            }
                            7 => {
                                let got = c.result.unwrap();
                                let bytes: Vec<u8> =
                                    c.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                                assert!(bytes[..got] == want[..got], "thread {t} block {block}");
                            }
                            _ => assert_eq!(c.result.unwrap(), 0),
                        }
                    }
                    done += n;
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = (threads * requests_per_thread) as u64;
    let stats = engine.stats();
    assert_eq!(stats.submitted, total);
    assert_eq!(stats.completed, total);
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.latency.count, total);
    eprintln!(
        "{total} requests in {:?}: {:?} p50 {} ns p99 {} ns",
        t0.elapsed(),
        engine.backend(),
        stats.latency.p50_ns,
        stats.latency.p99_ns
    );
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The scenario: 16 threads, 100k requests each, 4 rings.
#[test]
fn sixteen_threads_four_rings_one_thread_per_ring() {
    let config = Config {
        rings: 4,
        backend: BackendChoice::IoUring,
        ..Config::default()
    };
    run(config, 16, 100_000);
}

#[test]
fn sixteen_threads_four_rings_two_threads_per_ring() {
    let config = Config {
        rings: 4,
        ring_threads: RingThreads::Two,
        backend: BackendChoice::IoUring,
        ..Config::default()
    };
    run(config, 16, 20_000);
}

#[test]
fn sixteen_threads_thread_pool() {
    let config = Config {
        rings: 4,
        backend: BackendChoice::ThreadPool,
        ..Config::default()
    };
    run(config, 16, 10_000);
}
