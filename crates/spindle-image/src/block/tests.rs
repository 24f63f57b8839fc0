//! Block layer tests over the in-memory backend (latency injected with tokio sleeps).

use super::*;
use crate::image::MemoryBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const POOL: &str = "p";

async fn layer(
    backend: MemoryBackend,
    size_bytes: u64,
    object_size_bytes: u64,
    config: BlockConfig,
) -> (Arc<MemoryBackend>, Arc<BlockLayer<MemoryBackend>>) {
    let b = Arc::new(backend);
    let img = Image::create(b.clone(), POOL, "vol", size_bytes, object_size_bytes)
        .await
        .unwrap();
    let bl = BlockLayer::new(Arc::new(img), config).unwrap();
    (b, Arc::new(bl))
}

fn no_coalesce(cache_capacity_bytes: u64, cache_extent_bytes: u64) -> BlockConfig {
    BlockConfig {
        cache_capacity_bytes,
        cache_extent_bytes,
        coalesce_enabled: false,
        ..BlockConfig::default()
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(1..=255u8)).collect()
}

#[tokio::test]
async fn cache_hits_and_evictions_at_capacity() {
    let (b, bl) = layer(
        MemoryBackend::new(),
        64 << 10,
        16 << 10,
        no_coalesce(4 * 4096, 4096),
    )
    .await;
    bl.write(0, &pattern(1, 64 << 10)).await.unwrap();
    let reads0 = b.counts().reads;
    for e in 0..4u64 {
        bl.read(e * 4096, 4096).await.unwrap();
    }
    assert_eq!(b.counts().reads - reads0, 4);
    for e in 0..4u64 {
        bl.read(e * 4096 + 100, 200).await.unwrap();
    }
    let s = bl.stats();
    assert_eq!((s.cache_hits, s.cache_misses, s.cache_evictions), (4, 4, 0));
    assert_eq!(s.cache_bytes, 4 * 4096);
    assert_eq!(
        b.counts().reads - reads0,
        4,
        "hits do not reach the backend"
    );
    // A fifth extent evicts the least recently used one (extent 0).
    bl.read(5 * 4096, 10).await.unwrap();
    let s = bl.stats();
    assert_eq!(
        (s.cache_misses, s.cache_evictions, s.cache_bytes),
        (5, 1, 4 * 4096)
    );
    bl.read(4096, 10).await.unwrap();
    assert_eq!(bl.stats().cache_hits, 5);
    bl.read(0, 10).await.unwrap();
    assert_eq!(bl.stats().cache_misses, 6);
    // A read spanning extents returns the right bytes from hits and misses.
    let all = pattern(1, 64 << 10);
    assert_eq!(bl.read(1000, 30_000).await.unwrap(), all[1000..31_000]);
}

#[tokio::test]
async fn cache_disabled_and_write_invalidates() {
    let (_b, bl) = layer(
        MemoryBackend::new(),
        64 << 10,
        16 << 10,
        BlockConfig::default(),
    )
    .await;
    bl.write(0, &[1; 8192]).await.unwrap();
    assert_eq!(bl.read(0, 8192).await.unwrap(), vec![1; 8192]);
    bl.write(100, &[2; 10]).await.unwrap();
    let r = bl.read(0, 8192).await.unwrap();
    assert_eq!(&r[100..110], &[2; 10]);
    assert_eq!(r[99], 1);
    let (b2, off) = layer(
        MemoryBackend::new(),
        64 << 10,
        16 << 10,
        no_coalesce(0, 4096),
    )
    .await;
    off.write(0, &[3; 4096]).await.unwrap();
    off.read(0, 4096).await.unwrap();
    off.read(0, 4096).await.unwrap();
    let s = off.stats();
    assert_eq!((s.cache_hits, s.cache_misses, s.cache_bytes), (0, 0, 0));
    assert_eq!(b2.counts().reads, 2);
}

#[tokio::test]
async fn holes_read_zeros_and_zeroing_reads_back_zeros() {
    let (b, bl) = layer(
        MemoryBackend::new(),
        256 << 10,
        16 << 10,
        BlockConfig::default(),
    )
    .await;
    assert_eq!(bl.read(0, 256 << 10).await.unwrap(), vec![0; 256 << 10]);
    let data = pattern(2, 100_000);
    bl.write(5000, &data).await.unwrap();
    // Cache it, then zero pieces of it: interior, whole objects, object tails.
    assert_eq!(bl.read(5000, 100_000).await.unwrap(), data);
    bl.write_zeroes(6000, 50_000).await.unwrap();
    bl.discard(70_000, 35_000).await.unwrap();
    let mut model = vec![0u8; 256 << 10];
    model[5000..105_000].copy_from_slice(&data);
    model[6000..56_000].fill(0);
    model[70_000..105_000].fill(0);
    assert_eq!(bl.read(0, 256 << 10).await.unwrap(), model);
    bl.discard(0, 256 << 10).await.unwrap();
    assert_eq!(bl.read(0, 256 << 10).await.unwrap(), vec![0; 256 << 10]);
    assert_eq!(b.object_names(POOL), ["img.vol.header"]);
}

#[tokio::test]
async fn out_of_range_errors() {
    let (_b, bl) = layer(MemoryBackend::new(), 8192, 4096, BlockConfig::default()).await;
    assert!(matches!(
        bl.read(8000, 200).await,
        Err(ImageError::OutOfRange {
            offset: 8000,
            len: 200,
            size: 8192
        })
    ));
    assert!(matches!(
        bl.write(8192, &[1]).await,
        Err(ImageError::OutOfRange { .. })
    ));
    assert!(bl.write_zeroes(u64::MAX, 2).await.is_err());
    assert!(bl.discard(0, 8193).await.is_err());
    assert!(BlockLayer::new(
        bl.image().clone(),
        BlockConfig {
            cache_extent_bytes: 1000,
            ..BlockConfig::default()
        }
    )
    .is_err());
}

#[tokio::test]
async fn resize_shrink_then_grow_reads_zeros_beyond_old_end() {
    let (_b, bl) = layer(
        MemoryBackend::new(),
        64 << 10,
        16 << 10,
        BlockConfig::default(),
    )
    .await;
    bl.write(0, &[9; 64 << 10]).await.unwrap();
    assert_eq!(bl.read(0, 64 << 10).await.unwrap(), vec![9; 64 << 10]);
    bl.resize(20 << 10).await.unwrap();
    assert!(bl.read(20 << 10, 1).await.is_err());
    bl.resize(64 << 10).await.unwrap();
    let r = bl.read(0, 64 << 10).await.unwrap();
    assert_eq!(&r[..20 << 10], &vec![9; 20 << 10][..]);
    assert!(r[20 << 10..].iter().all(|&x| x == 0));
}

#[tokio::test]
async fn scheduler_merges_adjacent_concurrent_writes() {
    let backend = MemoryBackend::with_latency(4000, 0, 1);
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        hold_us_max: 2000,
        sequential_hold_us_max: 4000,
        ..BlockConfig::default()
    };
    let (b, bl) = layer(backend, 4 << 20, 1 << 20, config).await;
    // Learn the latency first (no hold before a latency was observed).
    bl.write(2 << 20, &[1; 4096]).await.unwrap();
    assert!(bl.stats().sched_hold_us > 0);
    let writes0 = b.counts().writes;
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let bl = bl.clone();
        tasks.push(tokio::spawn(async move {
            bl.write(i * 4096, &[i as u8 + 1; 4096]).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = bl.stats();
    let backend_writes = b.counts().writes - writes0;
    assert_eq!(s.sched_requests, 65);
    assert!(s.sched_merges >= 32, "{s:?}");
    assert!(s.sched_backend_ops <= 1 + 32, "{s:?}");
    assert!(backend_writes <= 32, "backend writes {backend_writes}");
    assert!(s.sched_merged_requests >= 33);
    assert!(s.sched_delay_total_us > 0);
    // No request waited much longer than the hold bound (sequential writes: 4 ms here),
    // plus scheduling slack: 20 ms on average. With the whole suite running on 2 cores the
    // average once reached 9.8 ms (CI, 2026-11-29); a hold far past its bound still fails.
    assert!(s.sched_delay_total_us <= 64 * (4000 + 20_000), "{s:?}");
    let r = bl.read(0, 64 * 4096).await.unwrap();
    for i in 0..64usize {
        assert!(r[i * 4096..(i + 1) * 4096]
            .iter()
            .all(|&x| x == i as u8 + 1));
    }
}

#[tokio::test]
async fn disabled_scheduler_adds_no_delay() {
    let backend = MemoryBackend::with_latency(2000, 0, 1);
    let (b, bl) = layer(backend, 4 << 20, 1 << 20, no_coalesce(0, 4096)).await;
    bl.write(0, &[1; 4096]).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let bl = bl.clone();
        tasks.push(tokio::spawn(async move {
            bl.write(i * 4096, &[2; 4096]).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s = bl.stats();
    assert_eq!(s.sched_hold_us, 0);
    assert_eq!(s.sched_delay_total_us, 0);
    assert_eq!(s.sched_merges, 0);
    assert_eq!(s.sched_backend_ops, 17);
    assert_eq!(b.counts().writes, 1 + 17);
}

/// Overlapping writes keep submission order, and a read overlapping a held write sees
/// it, with and without coalescing.
#[tokio::test]
async fn ordering_of_overlapping_requests() {
    for coalesce_enabled in [true, false] {
        let backend = MemoryBackend::with_latency(2000, 1500, 7);
        let config = BlockConfig {
            cache_capacity_bytes: 0,
            coalesce_enabled,
            // DeLiBA's plain hold, so that every round exercises held batches.
            adaptive_hold: false,
            ..BlockConfig::default()
        };
        let (_b, bl) = layer(backend, 1 << 20, 64 << 10, config).await;
        bl.write(0, &[1; 4096]).await.unwrap();
        for round in 0..20u8 {
            let a = vec![round.wrapping_mul(2) | 1; 8192];
            let c = vec![round.wrapping_mul(2).wrapping_add(2) | 1; 8192];
            let (ra, rc, read) =
                tokio::join!(bl.write(0, &a), bl.write(4096, &c), bl.read(0, 12_288));
            ra.unwrap();
            rc.unwrap();
            let read = read.unwrap();
            assert_eq!(&read[..4096], &a[..4096], "read sees the held write");
            assert_eq!(&read[4096..], &c[..], "later write wins");
        }
        if coalesce_enabled {
            assert!(bl.stats().sched_merges > 0);
        }
    }
}

/// Random concurrent writes/zeroing/reads from several tasks against a model. Each task
/// owns every `TASKS`-th 512-byte sector, so tasks share cache extents and objects: a
/// fill racing with another task's write would be caught when that task reads back.
async fn random_race(seed: u64, config: BlockConfig) -> BlockStats {
    const TASKS: u64 = 6;
    const SECTOR: u64 = 512;
    const SIZE: u64 = 128 << 10;
    let backend = MemoryBackend::with_latency(300, 1200, seed);
    let (b, bl) = layer(backend, SIZE, 16 << 10, config).await;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let bl = bl.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed * 1000 + t);
            let sectors = SIZE / SECTOR;
            let mine: Vec<u64> = (0..sectors).filter(|s| s % TASKS == t).collect();
            let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
            for step in 0..150u32 {
                let s = mine[rng.gen_range(0..mine.len())];
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let v = vec![rng.gen_range(1..=255u8); SECTOR as usize];
                        bl.write(s * SECTOR, &v).await.unwrap();
                        model.insert(s, v);
                    }
                    4 => {
                        bl.write_zeroes(s * SECTOR, SECTOR).await.unwrap();
                        model.remove(&s);
                    }
                    _ => {
                        let start = rng.gen_range(0..sectors);
                        let n = rng.gen_range(1..=(sectors - start).min(80));
                        let r = bl.read(start * SECTOR, n * SECTOR).await.unwrap();
                        for i in start..start + n {
                            if i % TASKS != t {
                                continue;
                            }
                            let got = &r[((i - start) * SECTOR) as usize..][..SECTOR as usize];
                            let want = model.get(&i).map_or(&[0u8; 512][..], |v| &v[..]);
                            assert!(
                                got == want,
                                "seed {seed} task {t} step {step} sector {i}: got {} want {}",
                                got[0],
                                want[0]
                            );
                        }
                    }
                }
            }
            model
        }));
    }
    let mut model = vec![0u8; SIZE as usize];
    for t in tasks {
        for (s, v) in t.await.unwrap() {
            model[(s * SECTOR) as usize..][..SECTOR as usize].copy_from_slice(&v);
        }
    }
    bl.flush().await.unwrap();
    assert_eq!(
        bl.read(0, SIZE).await.unwrap(),
        model,
        "seed {seed}: via cache"
    );
    assert_eq!(
        bl.image().read(0, SIZE).await.unwrap(),
        model,
        "seed {seed}: image"
    );
    let direct = Image::open(b.clone(), POOL, "vol").await.unwrap();
    assert_eq!(direct.read(0, SIZE).await.unwrap(), model);
    bl.stats()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_reads_under_random_concurrency() {
    let mut rejected = 0;
    let mut merges = 0;
    for seed in 0..4 {
        let config = BlockConfig {
            cache_capacity_bytes: 16 * 4096,
            cache_extent_bytes: 4096,
            ..BlockConfig::default()
        };
        let s = random_race(seed, config).await;
        rejected += s.cache_fills_rejected;
        merges += s.sched_merges;
        assert!(s.cache_hits > 0 && s.cache_evictions > 0, "{s:?}");
        // DeLiBA's plain hold (every write held): more merges racing with fills.
        let big_extents = BlockConfig {
            cache_extent_bytes: 16 << 10,
            adaptive_hold: false,
            ..BlockConfig::default()
        };
        let s = random_race(seed + 100, big_extents).await;
        merges += s.sched_merges;
        random_race(seed + 200, no_coalesce(8 * 4096, 4096)).await;
    }
    // The races the test is about did happen. Merges in the random races depend on
    // timing (only writes merge, and only adjacent ones arriving within a hold), so
    // `merged_writes_race_with_reads` below guarantees them; these are a bonus.
    assert!(rejected > 0, "no fill ever raced with a write");
    eprintln!("random races: {merges} merges");
}

/// Adjacent writes submitted in order while reads of the same range come in between:
/// the writes merge into held batches (deterministically: each request touches the open
/// batch), every read returns either nothing newer than what completed before it started
/// or data a write in flight put there, and the end state is every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_writes_race_with_reads() {
    const SECTOR: usize = 512;
    let backend = MemoryBackend::with_latency(2000, 0, 9);
    let config = BlockConfig {
        cache_capacity_bytes: 64 << 10,
        cache_extent_bytes: 4096,
        ..BlockConfig::default()
    };
    let (_b, bl) = layer(backend, 1 << 20, 64 << 10, config).await;
    // Learn the latency (no hold before one is known).
    bl.write(512 << 10, &[1; SECTOR]).await.unwrap();
    for round in 0..4u8 {
        let value = |i: usize| round * 40 + i as u8 + 2;
        let bufs: Vec<Vec<u8>> = (0..32usize).map(|i| vec![value(i); SECTOR]).collect();
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        for (i, buf) in bufs.iter().enumerate() {
            writes.push(bl.write((i * SECTOR) as u64, buf));
            if i % 8 == 7 {
                reads.push(bl.read(0, (32 * SECTOR) as u64));
            }
        }
        // join_all polls in order: the requests reach the scheduler in offset order.
        let (w, r) = tokio::join!(
            futures::future::join_all(writes),
            futures::future::join_all(reads)
        );
        for x in w {
            x.unwrap();
        }
        for data in r {
            let data = data.unwrap();
            for i in 0..32usize {
                let b = data[i * SECTOR];
                let old = if round == 0 {
                    0
                } else {
                    (round - 1) * 40 + i as u8 + 2
                };
                assert!(b == old || b == value(i), "round {round} sector {i}: {b}");
                assert!(
                    data[i * SECTOR..][..SECTOR].iter().all(|&x| x == b),
                    "torn sector {i}"
                );
            }
        }
        let all = bl.read(0, (32 * SECTOR) as u64).await.unwrap();
        for i in 0..32usize {
            assert!(
                all[i * SECTOR..][..SECTOR].iter().all(|&x| x == value(i)),
                "round {round} sector {i}"
            );
        }
    }
    let s = bl.stats();
    assert!(s.sched_merges >= 32, "{s:?}");
}

/// Compile-time check: the futures are `Send` over the real client (the NBD server runs
/// them on a multi-threaded runtime).
#[allow(dead_code)]
fn futures_are_send(
    bl: &BlockLayer<spindle_client::Client>,
    img: &Image<spindle_client::Client>,
    client: Arc<spindle_client::Client>,
) {
    fn is_send<T: Send>(_: &T) {}
    is_send(&bl.read(0, 1));
    is_send(&bl.write(0, &[]));
    is_send(&bl.write_zeroes(0, 1));
    is_send(&bl.discard(0, 1));
    is_send(&bl.flush());
    is_send(&bl.resize(0));
    is_send(&img.read(0, 1));
    is_send(&img.resize(0));
    is_send(&Image::create(client.clone(), "p", "n", 512, 4096));
    is_send(&Image::list(&*client, "p"));
    is_send(&Image::remove(client, "p", "n", |_, _| {}));
}

/// The adaptive hold never delays a lone request (queue depth 1: nothing can merge with
/// it), while DeLiBA's plain rule holds every request once a latency is known.
#[tokio::test]
async fn adaptive_hold_does_not_delay_a_lone_request() {
    for adaptive_hold in [true, false] {
        let backend = MemoryBackend::with_latency(2000, 0, 3);
        let config = BlockConfig {
            cache_capacity_bytes: 0,
            adaptive_hold,
            ..BlockConfig::default()
        };
        let (_b, bl) = layer(backend, 1 << 20, 64 << 10, config).await;
        for i in 0..10u64 {
            bl.write(i * 4096, &[7; 4096]).await.unwrap();
        }
        let s = bl.stats();
        assert_eq!(s.sched_merges, 0);
        if adaptive_hold {
            assert_eq!(s.sched_delay_total_us, 0, "{s:?}");
        } else {
            assert!(s.sched_delay_total_us > 0, "{s:?}");
        }
    }
}

/// A sequential write stream at queue depth 16 (fio's 512 KiB sequential job) grows its
/// batches to whole objects, which the daemons write once instead of through their
/// journal; every byte reads back.
#[tokio::test]
async fn sequential_stream_batches_grow_to_whole_objects() {
    let backend = MemoryBackend::with_latency(20_000, 0, 5);
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        ..BlockConfig::default()
    };
    let object = 4u64 << 20;
    let (b, bl) = layer(backend, 16 * object, object, config).await;
    let request = 512u64 << 10;
    let requests = 8 * object / request;
    let depth = Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = Vec::new();
    for i in 0..requests {
        // In offset order, a new request whenever one completes (as fio submits).
        let permit = depth.clone().acquire_owned().await.unwrap();
        let bl = bl.clone();
        tasks.push(tokio::spawn(async move {
            bl.write(i * request, &pattern(i, request as usize))
                .await
                .unwrap();
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counts = b.counts();
    let s = bl.stats();
    // The first 16 requests (objects 0 and 1) go one by one: no latency is known yet.
    // From then on batches fill whole objects.
    assert!(counts.write_fulls >= 5, "{counts:?} {s:?}");
    assert!(s.sched_backend_ops <= 16 + 8, "{s:?}");
    let data = bl.read(0, 8 * object).await.unwrap();
    for i in 0..requests {
        let at = (i * request) as usize;
        assert!(
            data[at..at + request as usize] == pattern(i, request as usize)[..],
            "request {i}"
        );
    }
}

/// A sequential stream that goes idle between objects (the client sends one object's worth
/// of requests, waits for all of them, sends the next): the first request of each round
/// finds nothing running and is still held briefly, so every object is written whole, in
/// one operation, and the batch goes as soon as it reaches the object's end.
#[tokio::test]
async fn idle_sequential_rounds_are_written_as_whole_objects() {
    // Long enough that one backend latency per round and two are far apart on a loaded
    // machine (the bound below sits half a latency above one).
    let latency_us = 50_000;
    let backend = MemoryBackend::with_latency(latency_us, 0, 7);
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        ..BlockConfig::default()
    };
    let object = 4u64 << 20;
    let (b, bl) = layer(backend, 8 * object, object, config).await;
    let request = 512u64 << 10;
    let per_object = object / request;
    // Round 0 writes the last request of object 0, so that round 1 continues a stream.
    bl.write(object - request, &pattern(99, request as usize))
        .await
        .unwrap();
    let rounds = 6u64;
    // Made up front: the requests of a round must arrive together, as fio's do.
    let data: Vec<Vec<u8>> = (0..(rounds + 1) * per_object)
        .map(|n| pattern(n, request as usize))
        .collect();
    let before = b.counts();
    let started = Instant::now();
    for round in 1..=rounds {
        let writes: Vec<_> = (0..per_object)
            .map(|i| {
                let n = round * per_object + i;
                let bl = bl.clone();
                let data = data[n as usize].clone();
                tokio::spawn(async move { bl.write_owned(n * request, data).await.unwrap() })
            })
            .collect();
        for w in writes {
            w.await.unwrap();
        }
    }
    let elapsed = started.elapsed();
    let s = bl.stats();
    let counts = b.counts();
    assert_eq!(s.sched_whole_object_writes, rounds, "{s:?}");
    assert_eq!(
        counts.write_fulls - before.write_fulls,
        rounds,
        "{counts:?}"
    );
    // No partial object writes (`writes` counts whole ones too).
    assert_eq!(
        counts.writes - counts.write_fulls,
        before.writes - before.write_fulls,
        "{counts:?}"
    );
    assert_eq!(s.sched_backend_ops, rounds + 1, "{s:?}");
    // One backend latency per round plus the short idle hold, not a second latency for
    // a split-off remainder or for a hold that waits for neighbours that cannot come: the
    // bound is half a latency above one latency and the holds (CI ran one at 32.5 ms per
    // round against a bound of 31 ms with 20 ms latencies; two latencies would be >= 100
    // ms per round here).
    let bound =
        Duration::from_micros(rounds * (latency_us + latency_us / 2 + 3 * HOLD_US_MAX_DEFAULT));
    assert!(elapsed < bound, "{elapsed:?} >= {bound:?}");
    for round in 1..=rounds {
        for i in 0..per_object {
            let n = round * per_object + i;
            let got = bl.read(n * request, request).await.unwrap();
            assert!(got == data[n as usize], "request {n}");
        }
    }
}

/// A sequential writer at queue depth 1 gains nothing from the idle hold (no neighbour can
/// arrive while it waits for its reply): after a few such holds they stop, except for
/// rare probes.
#[tokio::test]
async fn idle_hold_stops_for_a_queue_depth_one_writer() {
    let backend = MemoryBackend::with_latency(2_000, 0, 8);
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        ..BlockConfig::default()
    };
    let object = 1u64 << 20;
    let (_b, bl) = layer(backend, 128 * object, object, config).await;
    let request = 256u64 << 10;
    let requests = 64 * object / request;
    for n in 0..requests {
        bl.write(n * request, &[n as u8; 256 << 10]).await.unwrap();
    }
    let s = bl.stats();
    // 64 object starts (the chances of an idle hold): at most IDLE_HOLD_MISSES_MAX holds
    // plus one probe per HOLD_PROBE_EVERY chances, each up to a hold plus timer slack.
    // The slack is 10 ms a hold: the whole suite on 2 cores once took 3.7 ms per 2 ms
    // hold (33.1 ms for 9 holds). Holds that never stopped would take at least 64 full
    // holds (a timer never fires early), which the bound stays below.
    let holds = u64::from(IDLE_HOLD_MISSES_MAX) + 64 / HOLD_PROBE_EVERY + 1;
    let bound = holds * (HOLD_US_MAX_DEFAULT + 10_000);
    assert!(
        bound < 64 * HOLD_US_MAX_DEFAULT,
        "the bound must tell stopping from not"
    );
    assert!(s.sched_delay_total_us <= bound, "{s:?} bound {bound}");
    assert_eq!(s.sched_merges, 0, "{s:?}");
    // The writer switches to rounds of one whole object at a time (fio at a deeper queue):
    // a probe within HOLD_PROBE_EVERY rounds finds neighbours joining, and from then on
    // every round is one whole-object write again.
    let per_object = object / request;
    let rounds = HOLD_PROBE_EVERY + 6;
    let mut whole_before_last = 0;
    for round in 0..rounds {
        if round == rounds - 3 {
            whole_before_last = bl.stats().sched_whole_object_writes;
        }
        let first = requests + round * per_object;
        let writes: Vec<_> = (first..first + per_object)
            .map(|n| {
                let bl = bl.clone();
                let data = vec![n as u8; request as usize];
                tokio::spawn(async move { bl.write_owned(n * request, data).await.unwrap() })
            })
            .collect();
        for w in writes {
            w.await.unwrap();
        }
    }
    let s = bl.stats();
    assert_eq!(
        s.sched_whole_object_writes - whole_before_last,
        3,
        "the last 3 rounds: {s:?}"
    );
}

/// A sequential stream whose queue depth cannot fill an object is not held until the
/// hold expires: when nothing is running, held batches go at once.
#[tokio::test]
async fn shallow_sequential_stream_is_not_held_for_nothing() {
    let latency_us = 20_000;
    let backend = MemoryBackend::with_latency(latency_us, 0, 6);
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        ..BlockConfig::default()
    };
    let (_b, bl) = layer(backend, 64 << 20, 4 << 20, config).await;
    let request = 64u64 << 10;
    // Queue depth 2: one running, one held; the held one must go when the running
    // one completes, not after a whole mean latency more.
    let started = Instant::now();
    for pair in 0..10u64 {
        let a = bl.write(2 * pair * request, &[1; 64 << 10]);
        let c = bl.write((2 * pair + 1) * request, &[2; 64 << 10]);
        let (ra, rc) = tokio::join!(a, c);
        ra.unwrap();
        rc.unwrap();
    }
    let elapsed_us = started.elapsed().as_micros() as u64;
    // Each pair: at most two backend latencies (one if merged) plus slack; holding the
    // second request for a full mean latency after the first completed would add 20 ms.
    assert!(
        elapsed_us < 10 * (2 * latency_us + 8_000),
        "{elapsed_us} us"
    );
}

/// Sequential readers are served ahead (fewer backend reads, same bytes), and a write
/// from another task (another NBD connection) is never hidden by a chunk fetched before
/// it: after the write is acknowledged, every read sees it. Seeded: random write positions
/// inside and around the readahead window, random backend latencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_serves_streams_and_never_returns_stale_data() {
    for seed in 0..12u64 {
        let backend = MemoryBackend::with_latency(300, 600, seed + 1);
        let config = BlockConfig {
            cache_capacity_bytes: 0,
            readahead_bytes: 2 << 20,
            ..BlockConfig::default()
        };
        let size = 16u64 << 20;
        let (b, bl) = layer(backend, size, 1 << 20, config).await;
        let mut model = pattern(seed, size as usize);
        bl.write(0, &model).await.unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let step = 64u64 << 10;
        // A clean stream over the first half: served in 1 MiB chunks fetched ahead, not in
        // 64 KiB requests.
        let reads_before = b.counts().reads;
        for pos in (0..size / 2).step_by(step as usize) {
            let got = bl.read(pos, step).await.unwrap();
            assert!(
                got == model[pos as usize..(pos + step) as usize],
                "seed {seed} at {pos}"
            );
        }
        let reads = b.counts().reads - reads_before;
        assert!(
            reads <= 128 / 5,
            "seed {seed}: {reads} backend reads for 128 requests: {:?}",
            bl.stats()
        );
        // Then the whole image again, with writes racing the reader.
        let mut pos = 0u64;
        let mut writes = 0;
        while pos + step <= size {
            // Now and then another task writes somewhere near the reader (often inside the
            // window fetched ahead) and waits for the acknowledgement.
            if rng.gen_range(0..4) == 0 {
                let at = (pos + rng.gen_range(0..(3u64 << 20))).min(size - 4096);
                let len = rng.gen_range(1..=8192u64).min(size - at);
                let data = pattern(seed * 1000 + writes, len as usize);
                let writer = bl.clone();
                let d = data.clone();
                tokio::spawn(async move { writer.write(at, &d).await })
                    .await
                    .unwrap()
                    .unwrap();
                model[at as usize..(at + len) as usize].copy_from_slice(&data);
                writes += 1;
            }
            let got = bl.read(pos, step).await.unwrap();
            assert!(
                got == model[pos as usize..(pos + step) as usize],
                "seed {seed}: stale or wrong bytes at {pos} (after {writes} writes)"
            );
            pos += step;
        }
        let st = bl.stats();
        assert!(writes > 0, "seed {seed}: no write raced the stream");
        assert!(st.readahead_hits > 200, "seed {seed}: {st:?}");
        // A random read cancels; the data is still right.
        let at = rng.gen_range(0..size - 4096);
        assert!(bl.read(at, 4096).await.unwrap() == model[at as usize..at as usize + 4096]);
        assert!(bl.stats().readahead_cancelled >= 1 || st.readahead_cancelled >= 1);
    }
}

/// `read_pieces` (what the NBD server sends without joining) holds exactly the bytes of
/// the range in order, whichever path assembled it: one buffer per object read, slices of
/// readahead chunks, or the cache; a request spanning objects comes in several pieces.
#[tokio::test]
async fn read_pieces_are_the_range_in_order_on_every_path() {
    let size = 8u64 << 20;
    let object = 256u64 << 10;
    for (label, config) in [
        (
            "objects",
            BlockConfig {
                readahead_bytes: 0,
                ..no_coalesce(0, 4096)
            },
        ),
        (
            "readahead",
            BlockConfig {
                cache_capacity_bytes: 0,
                readahead_bytes: 1 << 20,
                ..BlockConfig::default()
            },
        ),
        (
            "cache",
            BlockConfig {
                readahead_bytes: 0,
                ..no_coalesce(4 << 20, 4096)
            },
        ),
    ] {
        let (_b, bl) = layer(MemoryBackend::new(), size, object, config).await;
        let model = pattern(7, size as usize);
        bl.write(0, &model).await.unwrap();
        let mut most_pieces = 0;
        // In order (a readahead stream starts after 256 KiB; 96 KiB requests start inside
        // its chunks and some span two), then across objects at odd offsets.
        let mut ranges: Vec<(u64, u64)> = (0..40).map(|i| (i * (96 << 10), 96 << 10)).collect();
        ranges.extend([
            (object - 4096, 8192),
            (3 * object + 123, 2 * object),
            (0, 4096),
        ]);
        for (at, len) in ranges {
            let pieces = bl.read_pieces(at, len).await.unwrap();
            most_pieces = most_pieces.max(pieces.len());
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert!(
                joined == model[at as usize..(at + len) as usize],
                "{label}: wrong bytes for {len} at {at} ({} pieces)",
                pieces.len()
            );
        }
        if label != "cache" {
            assert!(most_pieces > 1, "{label}: no read came in pieces");
        }
        if label == "readahead" {
            assert!(bl.stats().readahead_hits > 20, "{label}: {:?}", bl.stats());
        }
        // `read` joins the same pieces.
        let (at, len) = (3 * object + 123, 2 * object);
        let whole = bl.read(at, len).await.unwrap();
        assert!(
            whole == model[at as usize..(at + len) as usize],
            "{label}: read differs"
        );
    }
}
