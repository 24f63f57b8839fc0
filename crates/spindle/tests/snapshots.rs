//! Image snapshots against a real cluster: a snapshot taken with the real CLI while a
//! writer runs is crash-consistent (it equals the image after some prefix of the writer's
//! writes, every write acknowledged before the command started included, none issued after
//! it returned), read through `spindle nbd IMAGE@SNAP` with `qemu-img compare` and refused
//! for writes; rollback restores it; removal frees the copies (in the background, by the
//! monitors); erasure-coded pools, a
//! daemon SIGKILLed with snapshots present, and bad input.

mod common;

use common::{fails, ok, qemu_img_compare, run_ok, spindle, wait_trimmed, Cluster, NbdProc};
use spindle_image::snap::parse_snap_object;
use spindle_image::Image;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

const POOL: &str = "default";
const EC_POOL: &str = "ec";
const BLOCK: usize = 4096;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The content of write `seq` (4 KiB, distinct per write).
fn block_of(seq: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seq.wrapping_mul(0x9e37_79b9) ^ i as u64).to_le_bytes());
    }
    out
}

/// How many snapshot copies image `image` of `POOL` has.
async fn snap_copies(client: &spindle_client::Client, image: &str) -> usize {
    client
        .list(POOL)
        .await
        .unwrap()
        .iter()
        .filter(|o| parse_snap_object(image, &o.name).is_some())
        .count()
}

/// The image's bytes after writes `0..k` of `log` (offset, seq) over zeros.
fn state_after(size: usize, log: &[(u64, u64)], k: usize) -> Vec<u8> {
    let mut out = vec![0u8; size];
    for &(offset, seq) in &log[..k] {
        out[offset as usize..offset as usize + BLOCK].copy_from_slice(&block_of(seq));
    }
    out
}

fn write_file(path: &std::path::Path, data: &[u8]) {
    std::fs::write(path, data).expect("write reference");
}

/// A writer at queue depth 1 writes 4 KiB blocks at random offsets (so each write is
/// acknowledged before the next is issued) while `spindle image snap create` runs. Crash
/// consistency: the snapshot equals the image after exactly `k` writes for some `k`
/// between the writes acknowledged before the command started and those issued before it
/// returned. Then the snapshot is served read-only over NBD and compared with
/// `qemu-img compare`; a write to it is refused; rollback makes the image that state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_under_writes_is_crash_consistent_and_rollback_restores_it() {
    let c = Cluster::start("snap", 3, 16);
    let size = 16usize << 20;
    ok(
        &c,
        &[
            "image",
            "create",
            "vol",
            "--size",
            "16M",
            "--object-size",
            "256K",
        ],
    );
    let client = Arc::new(c.client().await);
    let img = Arc::new(Image::open(client.clone(), POOL, "vol").await.unwrap());

    // The writer: (offset, seq, issued, acknowledged).
    let writer = {
        let img = img.clone();
        tokio::spawn(async move {
            let mut rng = Rng(0x5eed);
            let mut log = Vec::new();
            let started = Instant::now();
            let mut seq = 0u64;
            while started.elapsed().as_millis() < 6_000 {
                let offset = (rng.next() % (size / BLOCK) as u64) * BLOCK as u64;
                let issued = Instant::now();
                img.write(offset, &block_of(seq)).await.expect("write");
                log.push((offset, seq, issued, Instant::now()));
                seq += 1;
            }
            log
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
    let dir = c.dir.clone();
    let (snap_start, snap_end, out) = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let out = run_ok(
            spindle()
                .args(["image", "snap", "create", "vol@s1", "--dir"])
                .arg(&dir),
        );
        (start, Instant::now(), out)
    })
    .await
    .unwrap();
    assert!(out.contains("created snapshot vol@s1"), "{out}");
    let log = writer.await.unwrap();
    let acked_before = log.iter().filter(|w| w.3 < snap_start).count();
    let issued_before = log.iter().filter(|w| w.2 < snap_end).count();
    assert!(
        acked_before > 20 && log.len() > issued_before + 20,
        "the writer ran before and after the snapshot: {acked_before} acknowledged before, \
         {issued_before} issued before the end, {} in all",
        log.len()
    );
    let plain: Vec<(u64, u64)> = log.iter().map(|w| (w.0, w.1)).collect();

    // The snapshot through the library: some k in [acked_before, issued_before].
    let at = Image::open_snap(client.clone(), POOL, "vol", "s1")
        .await
        .unwrap();
    let snap_bytes = at.read(0, size as u64).await.unwrap();
    let k = (acked_before..=issued_before)
        .find(|&k| state_after(size, &plain, k) == snap_bytes)
        .unwrap_or_else(|| {
            panic!(
                "the snapshot is not the image after any prefix of writes in \
                 {acked_before}..={issued_before}"
            )
        });
    eprintln!(
        "snapshot = the image after {k} writes ({acked_before} acknowledged before the \
         command, {issued_before} issued before it returned, {} in all); create took {:?}",
        log.len(),
        snap_end - snap_start
    );
    // The head has every write.
    assert_eq!(
        img.read(0, size as u64).await.unwrap(),
        state_after(size, &plain, log.len()),
        "the image has every acknowledged write"
    );

    // Served read-only over NBD, compared by qemu-img; writes refused.
    let reference = c.dir.join("s1.raw");
    write_file(&reference, &state_after(size, &plain, k));
    let nbd = NbdProc::start(&c);
    let (same, why) = qemu_img_compare(&reference, &nbd.uri("vol@s1"));
    assert!(same, "qemu-img compare of vol@s1: {why}");
    let (same, _) = qemu_img_compare(&reference, &nbd.uri("vol"));
    assert!(!same, "the head differs from the snapshot");
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write 0 4k"])
        .arg(nbd.uri("vol@s1"))
        .output()
        .expect("spawn qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() || text.contains("failed") || text.contains("ermission"),
        "a write to a snapshot export is refused: {text}"
    );
    drop(nbd);

    // Snapshot copies exist for the objects written after the snapshot only.
    let copies: Vec<(u64, u64)> = client
        .list(POOL)
        .await
        .unwrap()
        .iter()
        .filter_map(|o| parse_snap_object("vol", &o.name))
        .collect();
    let objects_after: std::collections::BTreeSet<u64> = plain[k..]
        .iter()
        .map(|(off, _)| off / (256 << 10))
        .collect();
    assert!(!copies.is_empty() && copies.len() <= objects_after.len());
    assert!(copies
        .iter()
        .all(|(i, s)| *s == 1 && objects_after.contains(i)));

    // Rollback (the test's writer is done; the CLI takes the lock).
    drop(img);
    ok(&c, &["image", "snap", "rollback", "vol@s1"]);
    let head = Image::open(client.clone(), POOL, "vol").await.unwrap();
    assert_eq!(
        head.read(0, size as u64).await.unwrap(),
        state_after(size, &plain, k),
        "rollback restores the snapshot exactly"
    );
    let nbd = NbdProc::start(&c);
    let (same, why) = qemu_img_compare(&reference, &nbd.uri("vol"));
    assert!(same, "qemu-img compare of the rolled-back image: {why}");
    drop(nbd);

    // Listing, removal frees the copies, the image goes once its snapshots are gone.
    let ls: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "snap", "ls", "vol", "--json"])).unwrap();
    assert_eq!(ls[0]["name"], "s1");
    assert_eq!(ls[0]["size_bytes"], size as u64);
    fails(&c, &["image", "rm", "vol"], "has 1 snapshots");
    let copies_before = snap_copies(&client, "vol").await;
    assert!(copies_before > 0);
    let out = ok(&c, &["image", "snap", "rm", "vol@s1"]);
    assert!(
        out.contains("removed snapshot vol@s1") && out.contains("background"),
        "{out}"
    );
    // The monitors free the copies in the background, and record it in the map.
    wait_trimmed(&client, POOL, "vol", 1).await;
    let du: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "du", "vol", "--json"])).unwrap();
    assert_eq!(du[0]["trimming_bytes"], 0, "{du}");
    let left = snap_copies(&client, "vol").await;
    assert_eq!(left, 0, "removing the only snapshot frees every copy");
    ok(&c, &["image", "rm", "vol"]);
    fails(&c, &["image", "snap", "ls", "vol"], "no such image");
    // The image's entry left the map with it (ids start over for a new image "vol").
    let fresh = c.client().await;
    assert!(fresh.image_snaps(POOL, "vol").is_none());
}

/// The image read through NBD at `uri` (with `qemu-img convert`).
fn read_through_nbd(c: &Cluster, uri: &str, name: &str) -> Vec<u8> {
    let path = c.dir.join(name);
    let _ = std::fs::remove_file(&path);
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw", uri])
            .arg(&path),
    );
    let data = std::fs::read(&path).expect("read the converted image");
    let _ = std::fs::remove_file(&path);
    data
}

/// Leading blocks that are not all zeros.
fn written_prefix(data: &[u8]) -> usize {
    data.chunks(BLOCK)
        .position(|b| b.iter().all(|&x| x == 0))
        .unwrap_or(data.len() / BLOCK)
}

/// The same crash consistency with fio as the writer (through `spindle nbd`): fio writes
/// the image once, sequentially, 4 KiB at queue depth 1 (each write acknowledged before
/// the next is issued), while the CLI takes a snapshot. The snapshot must be a prefix of
/// fio's writes: its first `k` blocks are what fio wrote there and the rest are zeros (no
/// hole, no later write). Bounds on `k` from reading the head just before the command
/// (its first unwritten block `p0`: blocks before `p0 - 1` were acknowledged) and just
/// after it returned (`p1`: nothing past the block in flight then). `qemu-img compare`
/// checks the snapshot against a reference built from that prefix; rollback restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_under_fio_load_holds_a_prefix_of_its_writes() {
    let c = Cluster::start("snapfio", 3, 16);
    let size = 8usize << 20;
    let blocks = size / BLOCK;
    ok(
        &c,
        &[
            "image",
            "create",
            "vol",
            "--size",
            "8M",
            "--object-size",
            "256K",
        ],
    );
    let nbd = NbdProc::start(&c);
    let uri = nbd.uri("vol");
    let fio = Command::new("fio")
        .args([
            "--name=seq",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=write",
            "--bs=4k",
            "--iodepth=1",
            "--size=8m",
            "--rate_iops=400",
            "--refill_buffers",
            "--randseed=20261128",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn fio");
    tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
    let p0 = written_prefix(&read_through_nbd(&c, &uri, "before.raw"));
    let started = Instant::now();
    ok(&c, &["image", "snap", "create", "vol@s1"]);
    let took = started.elapsed();
    let p1 = written_prefix(&read_through_nbd(&c, &uri, "after.raw"));
    let out = fio.wait_with_output().expect("wait for fio");
    assert!(
        out.status.success(),
        "fio: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let head = read_through_nbd(&c, &uri, "head.raw");
    assert_eq!(written_prefix(&head), blocks, "fio wrote every block");
    let snap = read_through_nbd(&c, &nbd.uri("vol@s1"), "snap.raw");
    let k = written_prefix(&snap);
    eprintln!("fio snapshot: p0 {p0}, k {k}, p1 {p1} of {blocks} blocks; create took {took:?}");
    assert!(p0 >= 2, "fio was writing before the snapshot ({p0} blocks)");
    assert!(
        snap[k * BLOCK..].iter().all(|&b| b == 0),
        "the snapshot is a prefix: nothing after its first unwritten block {k}"
    );
    assert!(
        snap[..k * BLOCK] == head[..k * BLOCK],
        "the snapshot's blocks are what fio wrote there"
    );
    assert!(
        p0 - 1 <= k && k <= p1 + 1,
        "every write acknowledged before the command (>= {}) and none issued after it \
         returned (<= {}): k = {k}",
        p0 - 1,
        p1 + 1
    );
    let mut reference = vec![0u8; size];
    reference[..k * BLOCK].copy_from_slice(&head[..k * BLOCK]);
    let reference_path = c.dir.join("fio-s1.raw");
    write_file(&reference_path, &reference);
    let (same, why) = qemu_img_compare(&reference_path, &nbd.uri("vol@s1"));
    assert!(same, "qemu-img compare of vol@s1: {why}");
    drop(nbd);
    ok(&c, &["image", "snap", "rollback", "vol@s1"]);
    let nbd = NbdProc::start(&c);
    let (same, why) = qemu_img_compare(&reference_path, &nbd.uri("vol"));
    assert!(same, "qemu-img compare after rollback: {why}");
}

/// The monitors' background trimmer under churn: 30 rounds of snapshot, writes, removal
/// while the leader frees copies; it frees every copy, and the monitor's descriptors stay
/// flat (its trimmer keeps one client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trimmer_frees_every_copy_under_churn_with_flat_descriptors() {
    const ROUNDS: u64 = 30;
    let c = Cluster::start("snaptrim", 3, 16);
    ok(
        &c,
        &[
            "image",
            "create",
            "vol",
            "--size",
            "4M",
            "--object-size",
            "256K",
        ],
    );
    let client = Arc::new(c.client().await);
    let img = Image::open(client.clone(), POOL, "vol").await.unwrap();
    let mon = Cluster::pid(&c.dir.join("mon")).expect("monitor pid");
    let fds = |pid: i32| std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let mut warm = 0;
    for round in 0..ROUNDS {
        let name = format!("s{round}");
        spindle_image::snap::create(&client, POOL, "vol", &name)
            .await
            .unwrap();
        for i in 0..4u64 {
            img.write(i * (256 << 10) + round * 512, &block_of(round * 4 + i))
                .await
                .unwrap();
        }
        spindle_image::snap::remove(&client, POOL, "vol", &name)
            .await
            .unwrap();
        if round == 4 {
            wait_trimmed(&client, POOL, "vol", round + 1).await;
            warm = fds(mon);
        }
    }
    wait_trimmed(&client, POOL, "vol", ROUNDS).await;
    let left = snap_copies(&client, "vol").await;
    assert_eq!(left, 0, "every copy freed once no snapshot is left");
    let end = fds(mon);
    eprintln!("monitor descriptors: {warm} after 5 rounds, {end} after {ROUNDS}");
    assert!(
        warm > 0 && end <= warm + 2,
        "the monitor's descriptors grew from {warm} to {end}"
    );
}

/// Snapshots of an image on an erasure-coded pool, several snapshots reading their own
/// state, a daemon SIGKILLed and marked out with snapshots present (recovery rebuilds the
/// copies like any object), and bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_on_erasure_coded_pools_survive_a_daemon_loss_and_bad_input_is_refused() {
    let c = Cluster::start_with("snapec", 4, 8, &["--out-after-ms", "2000"]);
    run_ok(
        spindle()
            .args(["pool", "create", EC_POOL, "--pg-count", "8", "--erasure"])
            .arg("k=2,m=1,min-size=2")
            .arg("--dir")
            .arg(&c.dir),
    );
    c.wait_clean();
    let size = 4usize << 20;
    ok(
        &c,
        &["image", "create", "disk", "--size", "4M", "--pool", EC_POOL],
    );
    let client = Arc::new(c.client().await);
    let img = Image::open(client.clone(), EC_POOL, "disk").await.unwrap();
    // Three generations, a snapshot after each of the first two.
    let mut states = Vec::new();
    let mut rng = Rng(0xec);
    let mut model = vec![0u8; size];
    let mut seq = 0u64;
    for generation in 0..3 {
        for _ in 0..40 {
            let offset = (rng.next() % (size / BLOCK) as u64) as usize * BLOCK;
            let b = block_of(seq);
            seq += 1;
            img.write(offset as u64, &b).await.unwrap();
            model[offset..offset + BLOCK].copy_from_slice(&b);
        }
        if generation < 2 {
            let name = format!("g{generation}");
            ok(
                &c,
                &[
                    "image",
                    "snap",
                    "create",
                    &format!("disk@{name}"),
                    "--pool",
                    EC_POOL,
                ],
            );
            states.push((name, model.clone()));
        }
    }
    // Discard a range after the snapshots: they keep it.
    img.discard(0, 1 << 20).await.unwrap();
    model[..1 << 20].fill(0);

    // A daemon dies and is marked out; recovery re-creates its shards (copies included).
    c.kill_osd(1);
    c.wait_osd_up(1, false);
    c.wait_clean();
    for (name, state) in &states {
        let at = Image::open_snap(client.clone(), EC_POOL, "disk", name)
            .await
            .unwrap();
        assert_eq!(
            at.read(0, size as u64).await.unwrap(),
            *state,
            "snapshot {name} after the loss of osd.1"
        );
    }
    assert_eq!(img.read(0, size as u64).await.unwrap(), model);

    // Bad input: each refused with a clear error, nothing changed.
    let pool = ["--pool", EC_POOL];
    let with_pool = |args: &[&'static str]| -> Vec<&'static str> {
        let mut v = args.to_vec();
        v.extend_from_slice(&pool);
        v
    };
    fails(
        &c,
        &with_pool(&["image", "snap", "create", "disk@g0"]),
        "already exists",
    );
    fails(
        &c,
        &with_pool(&["image", "snap", "create", "disk"]),
        "IMAGE@SNAP",
    );
    fails(
        &c,
        &with_pool(&["image", "snap", "create", "disk@bad/name"]),
        "invalid snapshot name",
    );
    fails(
        &c,
        &with_pool(&["image", "snap", "create", "nope@x"]),
        "no such image",
    );
    fails(
        &c,
        &with_pool(&["image", "snap", "rm", "disk@nope"]),
        "no snapshot",
    );
    ok(&c, &with_pool(&["image", "snap", "protect", "disk@g0"]));
    fails(
        &c,
        &with_pool(&["image", "snap", "rm", "disk@g0"]),
        "protected",
    );
    fails(&c, &with_pool(&["image", "rm", "disk"]), "snapshots");
    // A raw write to a data object of an image with snapshots is refused by the daemon
    // (it would change the snapshots' data without a copy).
    let err = client
        .write(
            EC_POOL,
            &spindle_image::image::data_object_name("disk", 0),
            0,
            vec![1; 16],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, spindle_client::ClientError::SnapChanged(_)),
        "raw write: {err}"
    );
    for (name, state) in &states {
        let at = Image::open_snap(client.clone(), EC_POOL, "disk", name)
            .await
            .unwrap();
        assert_eq!(
            at.read(0, size as u64).await.unwrap(),
            *state,
            "{name} unchanged"
        );
    }
    // Removing g1 keeps what g0 needs, once the trimmer is done too.
    ok(&c, &with_pool(&["image", "snap", "unprotect", "disk@g0"]));
    ok(&c, &with_pool(&["image", "snap", "rm", "disk@g1"]));
    wait_trimmed(&client, EC_POOL, "disk", 1).await;
    let at = Image::open_snap(client.clone(), EC_POOL, "disk", "g0")
        .await
        .unwrap();
    assert_eq!(at.read(0, size as u64).await.unwrap(), states[0].1);
    c.start_osd(1);
}
