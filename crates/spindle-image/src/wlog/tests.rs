//! The write log against a byte model of the image, over the in-memory object backend:
//! reads see unpublished writes, FLUSH publishes, a crash (the log dropped without a
//! flush) loses no acknowledged write after replay, a damaged record stops the replay
//! with everything after it refused, and a full ring makes writes wait.

use super::*;
use crate::block::BlockConfig;
use crate::image::{Image, MemoryBackend};
use rand::{Rng, SeedableRng};

const POOL: &str = "p";
const MIB: u64 = 1 << 20;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let base = std::env::var_os("SPINDLE_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let d = base.join(format!(
        "spindle-wlog-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

async fn create_image(b: &Arc<MemoryBackend>, size: u64) {
    Image::create(b.clone(), POOL, "vol", size, 4 * MIB)
        .await
        .unwrap();
}

async fn layer(b: &Arc<MemoryBackend>) -> Arc<BlockLayer<MemoryBackend>> {
    let img = Image::open(b.clone(), POOL, "vol").await.unwrap();
    Arc::new(BlockLayer::new(Arc::new(img), BlockConfig::default()).unwrap())
}

/// Opens the log of image "vol" in `dir` (a 32 MiB ring) in front of a new block layer;
/// `paused`: no publisher (records stay in the log).
async fn open(
    dir: &Path,
    b: &Arc<MemoryBackend>,
    paused: bool,
) -> (WriteLog<MemoryBackend>, ReplayReport) {
    let mut config = WriteLogConfig::new(dir, 32 * MIB);
    config.publish_paused = paused;
    // Large writes here test the log itself (tests of the write-through path say so).
    config.write_through_bytes_min = usize::MAX;
    WriteLog::open(&config, POOL, "vol", layer(b).await)
        .await
        .unwrap()
}

async fn read(log: &WriteLog<MemoryBackend>, off: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for p in log.read_pieces(off, len).await.unwrap() {
        out.extend_from_slice(&p);
    }
    out
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_unpublished_writes_and_flush_publishes_them() {
    let d = dir("basic");
    let b = Arc::new(MemoryBackend::with_latency(200, 200, 1));
    create_image(&b, 64 * MIB).await;
    let (log, report) = open(&d.0, &b, true).await;
    assert_eq!(report, ReplayReport::default());
    let data = pattern(1, 3 * 4096 + 100);
    log.write(4096 * 5 + 7, data.clone(), false).await.unwrap();
    // Visible at once, not yet in the image.
    assert_eq!(read(&log, 4096 * 5 + 7, data.len() as u64).await, data);
    assert_eq!(read(&log, 4096 * 5, 7).await, vec![0; 7]);
    assert!(b.object_names(POOL).iter().all(|n| n.ends_with("header")));
    drop(log);

    // A publishing log: FLUSH returns once the image has it.
    let (log, report) = open(&d.0, &b, false).await;
    assert_eq!(report.records_applied, 1, "{report:?}");
    let more = pattern(2, 8192);
    log.write(0, more.clone(), false).await.unwrap();
    log.flush().await.unwrap();
    let image = layer(&b).await;
    assert_eq!(image.read(0, 8192).await.unwrap(), more);
    assert_eq!(
        image.read(4096 * 5 + 7, data.len() as u64).await.unwrap(),
        data
    );
    let s = log.stats();
    assert_eq!((s.appended_records, s.published_records), (1, 1));
    assert_eq!(s.overlay_bytes, 0);
}

/// Writes of random sizes at random places, some FUA, with crashes (the log dropped with
/// no flush, the publisher cut off mid-chunk) at random points and a ring small enough to
/// wrap many times: after each reopen, the image (through the log) holds every
/// acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_is_lost_across_crashes_and_ring_wraps() {
    for seed in 0..4u64 {
        let d = dir("crash");
        let size = 48 * MIB;
        let b = Arc::new(MemoryBackend::with_latency(300, 600, seed));
        create_image(&b, size).await;
        let mut model = vec![0u8; size as usize];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut appended = 0u64;
        for round in 0..6 {
            let (log, report) = open(&d.0, &b, false).await;
            assert_eq!(
                report.stopped, None,
                "seed {seed} round {round}: {report:?}"
            );
            // The image through the log equals the model.
            for _ in 0..8 {
                let off = rng.gen_range(0..size - 1);
                let len = rng.gen_range(1..(size - off).min(3 * MIB));
                let got = read(&log, off, len).await;
                assert!(
                    got == model[off as usize..(off + len) as usize],
                    "seed {seed} round {round}: read {off}+{len} differs"
                );
            }
            let writes = rng.gen_range(20..120);
            let mut pending = Vec::new();
            for w in 0..writes {
                let len = if rng.gen_bool(0.3) {
                    rng.gen_range(1..6) * MIB as usize
                } else {
                    rng.gen_range(1..64) * 4096
                };
                let off = rng.gen_range(0..(size - len as u64) / 4096) * 4096;
                let data = pattern(seed * 1_000_000 + round * 1000 + w, len);
                model[off as usize..off as usize + len].copy_from_slice(&data);
                appended += len as u64;
                pending.push(log.write(off, data, rng.gen_bool(0.05)));
                if pending.len() >= 8 {
                    for p in pending.drain(..) {
                        p.await.unwrap();
                    }
                }
            }
            for p in pending.drain(..) {
                p.await.unwrap();
            }
            drop(pending);
            // Crash after a random pause (the publisher is somewhere in its work).
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..30))).await;
            drop(log);
        }
        assert!(
            appended > 3 * 32 * MIB,
            "the ring wrapped only {appended} bytes"
        );
        let (log, _) = open(&d.0, &b, false).await;
        log.flush().await.unwrap();
        drop(log);
        let image = layer(&b).await;
        for off in (0..size).step_by(4 * MIB as usize) {
            let got = image.read(off, 4 * MIB).await.unwrap();
            assert!(
                got == model[off as usize..(off + 4 * MIB) as usize],
                "seed {seed}: object at {off} differs"
            );
        }
    }
}

/// Ten writes, each its own group commit, with the publisher stalled; then a byte of one
/// record is flipped in the file. Replay applies the records before it and refuses it and
/// everything after it, saying so; the ones refused are not in the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_stops_the_replay_and_everything_after_it_is_refused() {
    // (record, damaged rather than torn, byte flipped within the record: data or header seq)
    for (victim, damaged, at) in [
        (4u64, true, HEADER_BYTES as u64 + 100),
        (4, true, 10),
        (9, false, HEADER_BYTES as u64 + 100),
    ] {
        let d = dir("flip");
        let b = Arc::new(MemoryBackend::new());
        create_image(&b, 16 * MIB).await;
        let (log, _) = open(&d.0, &b, true).await;
        for i in 0..10u64 {
            log.write(i * 8192, vec![i as u8 + 1; 8192], false)
                .await
                .unwrap();
        }
        drop(log);
        // Record i is at LSN i * 12 KiB (64-byte header + 8 KiB, padded).
        let path = log_path(&d.0, POOL, "vol");
        let rec = format::record_bytes(8192);
        let h = record_header_at(&path, victim * rec).unwrap();
        assert_eq!(h.offset, victim * 8192);
        {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let at = RING_START + victim * rec + at;
            let mut byte = [0u8; 1];
            f.read_exact_at(&mut byte, at).unwrap();
            f.write_all_at(&[byte[0] ^ 0x20], at).unwrap();
        }
        let (log, report) = open(&d.0, &b, false).await;
        assert_eq!(report.records_applied, victim, "{report:?}");
        assert_eq!(report.records_refused, 9 - victim, "{report:?}");
        let why = report.stopped.clone().unwrap();
        assert!(
            why.contains("damaged") == damaged
                && why.contains("torn") != damaged
                && why.contains(&format!("seq {}", victim + 1)),
            "{why}"
        );
        for i in 0..10u64 {
            let want = if i < victim { i as u8 + 1 } else { 0 };
            assert_eq!(
                read(&log, i * 8192, 8192).await,
                vec![want; 8192],
                "block {i} ({why})"
            );
        }
        // The log goes on: new writes after the refused tail replay fine.
        log.write(0, vec![0xee; 4096], false).await.unwrap();
        drop(log);
        let (log, report) = open(&d.0, &b, false).await;
        assert_eq!(report.stopped, None, "{report:?}");
        assert_eq!(read(&log, 0, 4096).await, vec![0xee; 4096]);
    }
}

/// A ring far smaller than what is written, and a slow cluster: writers wait for space
/// (counted), none fails, and everything is there in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_makes_writes_wait_not_fail() {
    let d = dir("full");
    let b = Arc::new(MemoryBackend::with_latency(3000, 1000, 5));
    create_image(&b, 64 * MIB).await;
    let (log, _) = open(&d.0, &b, false).await;
    let log = Arc::new(log);
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let log = log.clone();
            tokio::spawn(async move {
                for i in 0..24u64 {
                    let off = (t * 16 + (i % 16)) * MIB;
                    log.write(off, vec![(t * 31 + i) as u8; MIB as usize], false)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    log.flush().await.unwrap();
    let s = log.stats();
    assert!(s.full_waits > 0, "{s:?}");
    assert_eq!(s.appended_bytes, 96 * MIB);
    let image = layer(&b).await;
    for t in 0..4u64 {
        for j in 0..16u64 {
            // The last write to block j of task t was i = 16 + j (when j < 8) or j.
            let i = if j < 8 { 16 + j } else { j };
            let got = image.read((t * 16 + j) * MIB, 4096).await.unwrap();
            assert_eq!(got, vec![(t * 31 + i) as u8; 4096], "task {t} block {j}");
        }
    }
}

/// A bad record inside the *last* group commit, with valid records of the same commit
/// after it: the commit never completed (nothing in it was acknowledged), so the replay
/// calls it torn, not damage, and drops the rest of that commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_record_in_the_last_group_commit_is_a_torn_tail() {
    let d = dir("torn");
    let b = Arc::new(MemoryBackend::new());
    create_image(&b, 16 * MIB).await;
    let (log, _) = open(&d.0, &b, true).await;
    // Many writes at once: the writer thread takes the queued ones as one commit.
    for _ in 0..5 {
        let writes = (0..16u64).map(|i| log.write(i * 8192, vec![i as u8 + 1; 8192], false));
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
    }
    drop(log);
    let path = log_path(&d.0, POOL, "vol");
    let rec = format::record_bytes(8192);
    let headers: Vec<Header> = (0..80u64)
        .map(|i| record_header_at(&path, i * rec).unwrap())
        .collect();
    let last_first = headers.last().unwrap().batch_first;
    let victim = headers.iter().position(|h| h.seq == last_first).unwrap() as u64;
    assert!(
        victim < 79,
        "the last commit holds one record: {:?}",
        &headers[70..]
    );
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let at = RING_START + victim * rec + 10;
        f.write_all_at(&[0xff], at).unwrap();
    }
    let (_log, report) = open(&d.0, &b, false).await;
    let why = report.stopped.clone().unwrap();
    assert!(why.contains("torn"), "{why}");
    assert_eq!(report.records_applied, victim);
    assert_eq!(report.records_refused, 79 - victim);
}

/// Unmounts (lazily) and removes a mount point however the test ends.
struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The log's file system is full: the ring was preallocated and written at creation, so
/// logged writes go on (waiting for the publisher when the ring is full), none fails and
/// none is lost; a new log that cannot get its space is refused with a clear error.
/// Needs root (a size-limited tmpfs mount); fails, does not skip, without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_system_under_the_log_makes_writes_wait_not_fail() {
    let d = dir("fsfull");
    let mnt = Mount(d.0.join("mnt"));
    std::fs::create_dir_all(&mnt.0).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(&mnt.0)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "this test needs to mount a tmpfs (run it as root)");
    let b = Arc::new(MemoryBackend::with_latency(500, 500, 3));
    create_image(&b, 64 * MIB).await;
    let (log, _) = open(&mnt.0, &b, false).await;
    // Fill the file system.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.0.join("filler")).unwrap();
        let chunk = vec![7u8; MIB as usize];
        while f.write_all(&chunk).is_ok() {}
    }
    assert!(
        std::fs::File::create(mnt.0.join("x"))
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(&[0u8; 65536]).and_then(|_| f.sync_all())
            })
            .is_err(),
        "the file system is not full"
    );
    let mut model = vec![0u8; 64 * MIB as usize];
    for i in 0..96u64 {
        let off = (i * 7 % 60) * MIB;
        let data = pattern(i, MIB as usize);
        model[off as usize..(off + MIB) as usize].copy_from_slice(&data);
        log.write(off, data, false).await.unwrap();
    }
    log.flush().await.unwrap();
    // The ring was reused several times over on the full file system.
    let s = log.stats();
    assert!(s.appended_bytes > 2 * s.ring_bytes, "{s:?}");
    let image = layer(&b).await;
    let got = image.read(0, 64 * MIB).await.unwrap();
    assert!(got == model, "the image differs from what was written");
    // A second image's log cannot get its ring: a clear error at open.
    Image::create(b.clone(), POOL, "vol2", 16 * MIB, 4 * MIB)
        .await
        .unwrap();
    let img2 = Image::open(b.clone(), POOL, "vol2").await.unwrap();
    let layer2 = Arc::new(BlockLayer::new(Arc::new(img2), BlockConfig::default()).unwrap());
    let e = match WriteLog::open(&WriteLogConfig::new(&mnt.0, 32 * MIB), POOL, "vol2", layer2).await
    {
        Ok(_) => panic!("a log was created on a full file system"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("file system full"), "{e}");
    drop(log);
}

/// A large write goes around the log, but only after the unpublished records under it are
/// published: neither the publisher nor a replay after a crash puts their older bytes over
/// it. Records elsewhere stay in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_goes_around_the_log_after_the_records_under_it() {
    let d = dir("through");
    let b = Arc::new(MemoryBackend::with_latency(500, 500, 7));
    create_image(&b, 64 * MIB).await;
    let mut config = WriteLogConfig::new(&d.0, 32 * MIB);
    config.write_through_bytes_min = 256 << 10;
    let (log, _) = WriteLog::open(&config, POOL, "vol", layer(&b).await)
        .await
        .unwrap();
    log.write(100 << 10, vec![1; 4096], false).await.unwrap();
    log.write(8 * MIB, vec![2; 4096], false).await.unwrap();
    log.write(0, vec![3; 512 << 10], false).await.unwrap();
    let s = log.stats();
    assert_eq!(s.written_through, 1, "{s:?}");
    assert_eq!(s.appended_records, 2, "{s:?}");
    assert_eq!(read(&log, 100 << 10, 4096).await, vec![3; 4096]);
    assert_eq!(read(&log, 8 * MIB, 4096).await, vec![2; 4096]);
    // The block layer alone already has the large write (it is durable in the cluster).
    let image = layer(&b).await;
    assert_eq!(image.read(100 << 10, 4096).await.unwrap(), vec![3; 4096]);
    // A crash and a replay: whatever of the log is replayed, the large write stays.
    drop(log);
    let (log, report) = WriteLog::open(&config, POOL, "vol", layer(&b).await)
        .await
        .unwrap();
    assert_eq!(report.stopped, None, "{report:?}");
    assert_eq!(read(&log, 0, 512 << 10).await, vec![3; 512 << 10]);
    assert_eq!(read(&log, 8 * MIB, 4096).await, vec![2; 4096]);
    log.flush().await.unwrap();
    let image = layer(&b).await;
    assert_eq!(image.read(0, 512 << 10).await.unwrap(), vec![3; 512 << 10]);
    assert_eq!(image.read(8 * MIB, 4096).await.unwrap(), vec![2; 4096]);
}

/// A log whose unpublished records belong to a client that lost the image to another is
/// refused at open (replaying would put older data over newer), naming both; the same
/// log opened by its own client's successor (who took the lock over from it) replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_left_by_a_client_that_lost_the_image_is_refused() {
    let d = dir("foreign");
    let b = Arc::new(MemoryBackend::with_latency(200, 200, 9));
    create_image(&b, 64 * MIB).await;
    let mut config = WriteLogConfig::new(&d.0, 32 * MIB);
    config.publish_paused = true;
    config.client_id = 0xa1;
    let (log, _) = WriteLog::open(&config, POOL, "vol", layer(&b).await)
        .await
        .unwrap();
    log.write(0, vec![5; 4096], false).await.unwrap();
    drop(log); // a crash: the record stays unpublished
    let mut next = WriteLogConfig::new(&d.0, 32 * MIB);
    next.client_id = 0xb2;
    for before in [Some(0xc3), None] {
        next.previous_lock_client = Some(before);
        let e = match WriteLog::open(&next, POOL, "vol", layer(&b).await).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a foreign log was replayed (lock held before by {before:?})"),
        };
        assert!(
            e.contains("00000000000000a1") && e.contains("older data over newer"),
            "{e}"
        );
        // Nothing was applied.
        assert_eq!(layer(&b).await.read(0, 4096).await.unwrap(), vec![0; 4096]);
    }
    // Taken over from the client that wrote it: replayed.
    next.previous_lock_client = Some(Some(0xa1));
    let (log, report) = WriteLog::open(&next, POOL, "vol", layer(&b).await)
        .await
        .unwrap();
    assert_eq!(report.records_applied, 1, "{report:?}");
    assert_eq!(read(&log, 0, 4096).await, vec![5; 4096]);
}

/// Publishing through the offload path with no agent: the front end waits for one, then
/// publishes from the log *file* itself (what an agent does), checking every record; a
/// record damaged in the file before it is published stops publishing with the reason,
/// and nothing of it reaches the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_from_the_file_checks_every_record() {
    let d = dir("fromfile");
    let b = Arc::new(MemoryBackend::with_latency(200, 200, 11));
    create_image(&b, 64 * MIB).await;
    let mut config = WriteLogConfig::new(&d.0, 32 * MIB);
    config.agent = Some(true);
    config.write_through_bytes_min = usize::MAX;
    let (log, _) = WriteLog::open(&config, POOL, "vol", layer(&b).await)
        .await
        .unwrap();
    assert!(agent::ctl_path(log.path()).exists());
    for i in 0..8u64 {
        log.write(i * MIB, pattern(i, 64 << 10), false)
            .await
            .unwrap();
    }
    log.flush().await.unwrap();
    let image = layer(&b).await;
    for i in 0..8u64 {
        assert_eq!(
            image.read(i * MIB, 64 << 10).await.unwrap(),
            pattern(i, 64 << 10)
        );
    }
    // Damage the next record in the file right after it is acknowledged (publishing is
    // lazy: it waits 50 ms of quiet first).
    let lsn = log.shared.head_lsn.load(Ordering::SeqCst);
    log.write(20 * MIB, vec![9; 4096], false).await.unwrap();
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(log.path())
            .unwrap();
        let at = RING_START + lsn % (32 * MIB) + HEADER_BYTES as u64 + 10;
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, at).unwrap();
        f.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
        f.sync_all().unwrap();
    }
    let e = log
        .flush()
        .await
        .expect_err("a damaged record was published");
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    assert_eq!(
        layer(&b).await.read(20 * MIB, 4096).await.unwrap(),
        vec![0; 4096]
    );
}
