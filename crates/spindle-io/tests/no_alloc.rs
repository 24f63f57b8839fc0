//! Steady state allocates nothing: after a warm-up, reads and writes that reuse the buffers
//! handed back in their completions make zero heap allocations, in the whole process (the
//! counting allocator sees every thread, the engine's included).

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use spindle_io::{BackendChoice, Config, Engine, FixedBuf, IoBuf, LocalRing, Op, RingThreads};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn steady_state(engine: &Engine, fd: i32) -> u64 {
    let mut bufs: Vec<IoBuf> = (0..16).map(|_| IoBuf::aligned(4096, 4096)).collect();
    let mut requests = Vec::with_capacity(16);
    let mut round = |bufs: &mut Vec<IoBuf>| {
        for (i, buf) in bufs.drain(..).enumerate() {
            let op = if i % 2 == 0 {
                Op::write(fd, (i * 4096) as u64, buf)
            } else {
                Op::read(fd, (i * 4096) as u64, buf)
            };
            requests.push(engine.submit(op).unwrap());
        }
        engine.block_on(&requests);
        for mut r in requests.drain(..) {
            let c = r.try_take().unwrap();
            assert_eq!(c.result.unwrap(), 4096);
            bufs.push(c.buf.unwrap());
        }
    };
    for _ in 0..200 {
        round(&mut bufs);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..2000 {
        round(&mut bufs);
    }
    ALLOCS.load(Ordering::SeqCst) - before
}

/// Registered buffers through a registered file, each request with a (generous) deadline:
/// linked timeouts and fixed ops allocate nothing either.
fn steady_state_fixed(engine: &Engine, fd: i32) -> u64 {
    let pool = engine.register_buffers(16, 4096).unwrap();
    let file = engine.register_files(&[fd]).unwrap()[0];
    let mut bufs: Vec<FixedBuf> = (0..16).map(|_| pool.take().unwrap()).collect();
    let mut requests = Vec::with_capacity(16);
    let mut round = |bufs: &mut Vec<FixedBuf>| {
        for (i, buf) in bufs.drain(..).enumerate() {
            let op = if i % 2 == 0 {
                Op::write_fixed(file, (i * 4096) as u64, buf)
            } else {
                Op::read_fixed(file, (i * 4096) as u64, buf)
            };
            let deadline = Duration::from_secs(30);
            requests.push(engine.submit_with_timeout(op, deadline).unwrap());
        }
        engine.block_on(&requests);
        for mut r in requests.drain(..) {
            let c = r.try_take().unwrap();
            assert_eq!(c.result.unwrap(), 4096);
            bufs.push(c.fixed_buf.unwrap());
        }
    };
    for _ in 0..200 {
        round(&mut bufs);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..1000 {
        round(&mut bufs);
    }
    ALLOCS.load(Ordering::SeqCst) - before
}

/// The same on a `LocalRing`.
fn steady_state_local(fd: i32) -> u64 {
    let mut ring = LocalRing::builder(16).defer_taskrun(true).build().unwrap();
    let pool = ring.register_buffers(16, 4096).unwrap();
    let file = ring.register_files(&[fd]).unwrap()[0];
    let mut bufs: Vec<FixedBuf> = (0..16).map(|_| pool.take().unwrap()).collect();
    let round = |ring: &mut LocalRing, bufs: &mut Vec<FixedBuf>| {
        for (i, buf) in bufs.drain(..).enumerate() {
            let op = if i % 2 == 0 {
                Op::write_fixed(file, (i * 4096) as u64, buf)
            } else {
                Op::read_fixed(file, (i * 4096) as u64, buf)
            };
            ring.push_with_timeout(op, Duration::from_secs(30)).unwrap();
        }
        ring.wait(16).unwrap();
        while let Some((_, c)) = ring.pop() {
            assert_eq!(c.result.unwrap(), 4096);
            bufs.push(c.fixed_buf.unwrap());
        }
    };
    for _ in 0..200 {
        round(&mut ring, &mut bufs);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..1000 {
        round(&mut ring, &mut bufs);
    }
    ALLOCS.load(Ordering::SeqCst) - before
}

#[test]
fn no_allocation_per_request_in_steady_state() {
    let path = std::env::temp_dir().join(format!("spindle-io-noalloc-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    file.set_len(16 * 4096).unwrap();
    let fd = file.as_raw_fd();
    for (name, config) in [
        (
            "uring-1",
            Config {
                rings: 2,
                backend: BackendChoice::IoUring,
                ..Config::default()
            },
        ),
        (
            "uring-2",
            Config {
                rings: 2,
                ring_threads: RingThreads::Two,
                backend: BackendChoice::IoUring,
                ..Config::default()
            },
        ),
        (
            "pool",
            Config {
                rings: 2,
                backend: BackendChoice::ThreadPool,
                ..Config::default()
            },
        ),
    ] {
        let engine = Engine::new(config).unwrap();
        let allocs = steady_state(&engine, fd);
        assert_eq!(allocs, 0, "{name}: {allocs} allocations for 32000 requests");
        let allocs = steady_state_fixed(&engine, fd);
        assert_eq!(
            allocs, 0,
            "{name}: {allocs} allocations for 16000 fixed requests with deadlines"
        );
        drop(engine);
    }
    let allocs = steady_state_local(fd);
    assert_eq!(
        allocs, 0,
        "LocalRing: {allocs} allocations for 16000 fixed requests with deadlines"
    );
    drop(file);
    std::fs::remove_file(path).unwrap();
}
