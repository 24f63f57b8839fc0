//! A full disk end to end (issue #16, item 2): a real 3-daemon cluster whose storage
//! daemons live on small real file systems (osd.0 on a loop-mounted ext4 image, osd.1
//! and osd.2 on size-limited tmpfs mounts; the monitor stays on the normal disk), filled
//! through `spindle put` and through NBD (`spindle nbd` + qemu-io). Checks that the
//! failures are clear no-space errors (not timeouts, hangs or EIO), that `spindle status`
//! reports the full daemons and the health checks, that deletes work on the full cluster,
//! that writes work again once space is freed, all without restarting any process, and
//! that every object and image write acknowledged before the disks filled is intact.
//!
//! Needs root (mount, loop devices), qemu-io and nbdcopy: the test fails with a clear
//! message, it does not skip, when they are missing. `SPINDLE_TEST_BIN` runs it against
//! another build of `spindle` (see tests/common).

mod common;

use common::{content, run_ok, spindle, unique_dir, Cluster, NbdProc};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Size of each daemon's file system.
const FS_MIB: u64 = 240;
/// Object sizes of the `put` fill, cycled: whole-object (direct) writes, a buffered file,
/// and small objects (journal / inline).
const SIZES: [usize; 5] = [
    4 << 20,
    4 << 20,
    (2 << 20) + 4097,
    (96 << 10) + 1,
    (8 << 10) + 3,
];
/// NBD fill: chunks of this size, written one `qemu-io` command each.
const CHUNK: u64 = 4 * MIB;

/// The test's directory (cluster, put sources, ext4 image); removed on drop unless the
/// test failed (then kept for inspection, with the daemons' logs copied out of the
/// small file systems).
struct TestDir(PathBuf);

impl TestDir {
    fn new() -> TestDir {
        let dir = unique_dir("full-disk");
        std::fs::create_dir_all(&dir).expect("create test dir");
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A small file system mounted on `dir`: tmpfs with a size limit, or an ext4 image on a
/// loop device. Unmounted (lazily, so a daemon that is still dying cannot block it) on
/// drop, also when the test panics.
struct SmallFs {
    dir: PathBuf,
    image: Option<PathBuf>,
}

fn must_run(cmd: &mut Command, why: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{why}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{why}: {cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl SmallFs {
    fn tmpfs(dir: &Path, mib: u64) -> SmallFs {
        std::fs::create_dir_all(dir).expect("mount point");
        must_run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(dir),
            "this test needs small real file systems (run it as root)",
        );
        SmallFs {
            dir: dir.to_path_buf(),
            image: None,
        }
    }

    fn ext4(dir: &Path, image: &Path, mib: u64) -> SmallFs {
        std::fs::create_dir_all(dir).expect("mount point");
        std::fs::File::create(image)
            .and_then(|f| f.set_len(mib * MIB))
            .expect("create the ext4 image");
        // -m 0: no blocks reserved for root (the daemons run as root and would otherwise
        // write on after statvfs reports nothing available).
        must_run(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0"])
                .arg(image),
            "this test needs mkfs.ext4 (e2fsprogs)",
        );
        must_run(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(image)
                .arg(dir),
            "this test needs a loop-mounted ext4 file system (run it as root, with loop devices)",
        );
        SmallFs {
            dir: dir.to_path_buf(),
            image: Some(image.to_path_buf()),
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The daemon's log lives on this file system: keep a copy beside it.
            let name = self
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(parent) = self.dir.parent() {
                let _ = std::fs::copy(self.dir.join("log"), parent.join(format!("{name}.log")));
            }
        }
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

/// A finished command.
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `cmd`; a command that does not finish within `limit` is killed and fails the
/// test (a full disk must give an answer, not a hang).
fn run_timed(cmd: &mut Command, limit: Duration) -> Out {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} ({e}): is it installed?"));
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(o)) => Out {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            took: started.elapsed(),
        },
        Ok(Err(e)) => panic!("{cmd:?}: {e}"),
        Err(_) => {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{cmd:?} hung: no answer in {limit:?}");
        }
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// `spindle put NAME` of `content(name, 0, len)` (the source file is removed after).
fn put(c: &Cluster, name: &str, len: usize) -> Out {
    let src = c.dir.join("src").join(name);
    std::fs::write(&src, content(name, 0, len)).expect("write put source");
    let out = run_timed(
        spindle()
            .args(["put", name])
            .arg(&src)
            .arg("--dir")
            .arg(&c.dir),
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_file(&src);
    out
}

/// A no-space failure: non-zero exit, says so, and is none of the other failures.
fn assert_no_space(out: &Out, what: &str) {
    assert!(!out.ok, "{what}: expected a no-space failure, it succeeded");
    let err = out.stderr.to_lowercase();
    assert!(
        err.contains("no space left"),
        "{what}: the error must say 'no space left', got: {}",
        out.stderr
    );
    for bad in ["i/o error", "timed out", "timeout", "input/output"] {
        assert!(
            !err.contains(bad),
            "{what}: a no-space failure must not be reported as '{bad}': {}",
            out.stderr
        );
    }
    assert!(
        out.took < Duration::from_secs(20),
        "{what}: a write to a full cluster must fail promptly, it took {:?}",
        out.took
    );
}

fn rm(c: &Cluster, name: &str) {
    let out = run_timed(
        spindle().args(["rm", name, "--dir"]).arg(&c.dir),
        Duration::from_secs(60),
    );
    assert!(
        out.ok,
        "spindle rm {name} must work on a full cluster (it frees space): {}{}",
        out.stdout, out.stderr
    );
}

fn set_ratio(c: &Cluster, verb: &str, ratio: f64) {
    run_ok(
        spindle()
            .args(["osd", verb, &ratio.to_string(), "--dir"])
            .arg(&c.dir),
    );
}

fn status(c: &Cluster) -> serde_json::Value {
    let out = run_timed(
        spindle().args(["status", "--json", "--dir"]).arg(&c.dir),
        Duration::from_secs(30),
    );
    assert!(out.ok, "spindle status --json: {}", out.stderr);
    serde_json::from_str(&out.stdout).expect("status JSON")
}

fn check_names(s: &serde_json::Value) -> Vec<String> {
    s["health"]["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

fn any_osd(s: &serde_json::Value, flag: &str) -> bool {
    s["osds"]
        .as_array()
        .is_some_and(|a| a.iter().any(|o| o[flag] == true))
}

/// One line of each daemon's used/available MiB and flags (for the test's log).
fn space_line(s: &serde_json::Value) -> String {
    s["osds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            format!(
                "osd.{}: {} MiB used, {} MiB avail{}{}",
                o["id"],
                o["used_bytes"].as_u64().unwrap_or(0) / MIB,
                o["avail_bytes"].as_u64().unwrap_or(0) / MIB,
                if o["full"] == true { " full" } else { "" },
                if o["nearfull"] == true {
                    " nearfull"
                } else {
                    ""
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether the monitor logged a daemon turning full after the last event named `since`.
fn flagged_full_since(s: &serde_json::Value, since: &str) -> bool {
    let events: Vec<&str> = s["events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["what"].as_str()).collect())
        .unwrap_or_default();
    match events.iter().rposition(|w| *w == since) {
        Some(i) => events[i + 1..].iter().any(|w| w.ends_with(" full=true")),
        None => false,
    }
}

/// Polls `spindle status --json` until `pred` holds (panics with the last status).
fn wait_status(
    c: &Cluster,
    what: &str,
    limit: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let s = status(c);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Daemon pids (monitor, then osd.0..) from their pid files and the status.
fn daemon_pids(c: &Cluster) -> Vec<i64> {
    let mon = Cluster::pid(&c.dir.join("mon")).expect("monitor pid") as i64;
    let s = status(c);
    let mut pids = vec![mon];
    for id in 0..c.osds as usize {
        let pid = s["osds"][id]["pid"]
            .as_i64()
            .unwrap_or_else(|| panic!("osd.{id} pid in status: {s}"));
        assert_eq!(
            Cluster::pid(&c.osd_dir(id as u32)).map(i64::from),
            Some(pid),
            "osd.{id}: pid file and status disagree"
        );
        pids.push(pid);
    }
    pids
}

/// Pattern byte of NBD chunk `k`.
fn pattern(k: u64) -> u64 {
    0x10 + k % 200
}

/// Runs qemu-io commands against `uri` (it runs every command even after one failed).
fn qemu_io(uri: &str, cmds: &[String]) -> Out {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", uri]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    run_timed(&mut cmd, Duration::from_secs(120))
}

/// Writes chunks `ks` through qemu-io; returns (acknowledged chunks, failure messages).
fn nbd_write_chunks(uri: &str, ks: &[u64]) -> (Vec<u64>, Vec<String>) {
    let cmds: Vec<String> = ks
        .iter()
        .map(|k| format!("write -P {} {} {}", pattern(*k), k * CHUNK, CHUNK))
        .collect();
    let out = qemu_io(uri, &cmds);
    let mut acked = Vec::new();
    let mut failed = Vec::new();
    for l in out.stdout.lines().chain(out.stderr.lines()) {
        if let Some(off) = l
            .strip_prefix(&format!("wrote {CHUNK}/{CHUNK} bytes at offset "))
            .and_then(|o| o.trim().parse::<u64>().ok())
        {
            acked.push(off / CHUNK);
        } else if l.contains("failed") {
            failed.push(l.to_string());
        }
    }
    assert_eq!(
        acked.len() + failed.len(),
        ks.len(),
        "qemu-io: every write must either complete or fail:\n{}{}",
        out.stdout,
        out.stderr
    );
    (acked, failed)
}

#[test]
fn full_disk_put_and_nbd_fail_with_no_space_delete_and_write_again() {
    let started = Instant::now();
    let t = TestDir::new();
    // Declared before the cluster: dropped (unmounted) after its daemons are killed.
    let _fs = [
        SmallFs::ext4(&t.0.join("osd.0"), &t.0.join("osd.0.ext4"), FS_MIB + 16),
        SmallFs::tmpfs(&t.0.join("osd.1"), FS_MIB),
        SmallFs::tmpfs(&t.0.join("osd.2"), FS_MIB),
    ];
    std::fs::create_dir_all(t.0.join("src")).expect("src dir");
    let c = Cluster {
        dir: t.0.clone(),
        osds: 3,
    };
    c.up_with(&["--osds", "3", "--pg-count", "16"]);
    let pids = daemon_pids(&c);
    run_ok(
        spindle()
            .args(["image", "create", "disk0", "--size", "16M", "--dir"])
            .arg(&c.dir),
    );
    run_ok(
        spindle()
            .args(["image", "create", "disk1", "--size", "1G", "--dir"])
            .arg(&c.dir),
    );
    let mut nbd = NbdProc::start(&c);

    // Image data written before any disk fills (read back at the end).
    let disk0 = content("disk0", 7, 16 * MIB as usize);
    let disk0_src = c.dir.join("disk0.raw");
    std::fs::write(&disk0_src, &disk0).expect("disk0 source");
    let out = run_timed(
        Command::new("nbdcopy")
            .arg("--flush")
            .arg(&disk0_src)
            .arg(nbd.uri("disk0")),
        Duration::from_secs(60),
    );
    assert!(out.ok, "nbdcopy to disk0: {}{}", out.stdout, out.stderr);
    eprintln!(
        "full_disk: cluster up, images written: {:?}",
        started.elapsed()
    );

    let mut acked: BTreeMap<String, (usize, [u8; 32])> = BTreeMap::new();
    let mut acked_bytes = 0u64;
    let mut deleted = Vec::new();
    let mut i = 0usize;

    // 0. Full by ratio, what large disks meet first (the full ratio stops writes long
    // before ENOSPC): fill to about half, lower the ratios below the daemons' usage; puts
    // are refused; deleting data must bring the daemons back under the ratio (the space
    // of deleted objects must really be given back) and puts work again.
    while acked_bytes < FS_MIB * MIB / 2 {
        let name = format!("fill-{i:04}");
        let len = SIZES[i % SIZES.len()];
        let out = put(&c, &name, len);
        assert!(out.ok, "put {name} on a half-empty cluster: {}", out.stderr);
        acked.insert(name.clone(), (len, sha256(&content(&name, 0, len))));
        acked_bytes += len as u64;
        i += 1;
    }
    let (nearfull_ratio, full_ratio) = (0.3, 0.4);
    set_ratio(&c, "set-nearfull-ratio", nearfull_ratio);
    set_ratio(&c, "set-full-ratio", full_ratio);
    let s = wait_status(
        &c,
        "every daemon full by ratio",
        Duration::from_secs(10),
        |s| {
            s["osds"]
                .as_array()
                .is_some_and(|a| a.iter().all(|o| o["full"] == true))
                && check_names(s).iter().any(|n| n == "POOL_FULL")
        },
    );
    eprintln!("full_disk: full by ratio {full_ratio}: {}", space_line(&s));
    assert_no_space(
        &put(&c, "ratio-late", 4 << 20),
        "a put to a pool full by ratio",
    );
    // Delete until every daemon would be well under the full ratio (2% under nearfull).
    let to_free = s["osds"]
        .as_array()
        .expect("osds")
        .iter()
        .map(|o| {
            let total = o["total_bytes"].as_u64().unwrap_or(0) as f64;
            let used = o["used_bytes"].as_u64().unwrap_or(0) as f64;
            (used - (nearfull_ratio - 0.02) * total).max(0.0) as u64
        })
        .max()
        .unwrap_or(0);
    let mut freed = 0u64;
    let names: Vec<String> = acked.keys().cloned().collect();
    for name in &names {
        if freed >= to_free {
            break;
        }
        rm(&c, name);
        freed += acked[name].0 as u64;
        acked.remove(name);
        deleted.push(name.clone());
    }
    assert!(freed >= to_free, "not enough data to delete");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = put(&c, "ratio-after", 4 << 20);
        if out.ok {
            break;
        }
        assert_no_space(&out, "a put while the daemons go under the full ratio");
        assert!(
            Instant::now() < deadline,
            "puts still fail 30 s after deleting {} MiB (enough to go under the full ratio \
             {full_ratio}): {}; {}",
            freed / MIB,
            out.stderr,
            space_line(&status(&c))
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    acked.insert(
        "ratio-after".into(),
        (4 << 20, sha256(&content("ratio-after", 0, 4 << 20))),
    );
    let s = wait_status(
        &c,
        "ratio full flags to clear",
        Duration::from_secs(15),
        // Not nearfull: below the full ratio a store keeps freed files for reuse, so
        // usage may stay above nearfull after the deletes (seen under load: 35.5% used
        // against a 30% nearfull ratio); the full flags are what refuse writes.
        |s| !any_osd(s, "full"),
    );
    eprintln!(
        "full_disk: {} MiB deleted, under the ratio again ({:?}): {}",
        freed / MIB,
        started.elapsed(),
        space_line(&s)
    );
    set_ratio(&c, "set-full-ratio", 0.95);
    set_ratio(&c, "set-nearfull-ratio", 0.85);
    acked_bytes = acked.values().map(|(len, _)| *len as u64).sum();

    // 1. Fill through `spindle put` until a put fails; that failure must be no-space.
    let fail = loop {
        let name = format!("fill-{i:04}");
        let len = SIZES[i % SIZES.len()];
        let out = put(&c, &name, len);
        if !out.ok {
            break out;
        }
        acked.insert(name.clone(), (len, sha256(&content(&name, 0, len))));
        acked_bytes += len as u64;
        assert!(
            acked_bytes < 2 * FS_MIB * MIB,
            "{acked_bytes} bytes acknowledged on {FS_MIB} MiB file systems: they never filled"
        );
        i += 1;
    };
    eprintln!(
        "full_disk: put #{i} failed after {} objects, {} MiB ({:?}): {}",
        acked.len(),
        acked_bytes / MIB,
        started.elapsed(),
        fail.stderr.trim()
    );
    assert_no_space(&fail, "the put that filled the disks");
    assert!(
        acked_bytes > FS_MIB * MIB / 2,
        "only {} MiB fit on {FS_MIB} MiB file systems",
        acked_bytes / MIB
    );
    // Later writes are refused the same way (large and small).
    assert_no_space(&put(&c, "late-big", 4 << 20), "a later 4 MiB put");
    assert_no_space(&put(&c, "late-small", 100), "a later 100-byte put");

    // 2. The status shows the full daemons, their space and the health checks.
    let s = wait_status(
        &c,
        "a full daemon and OSD_FULL",
        Duration::from_secs(10),
        |s| any_osd(s, "full") && check_names(s).iter().any(|n| n == "OSD_FULL"),
    );
    eprintln!("full_disk: full: {}", space_line(&s));
    let checks = check_names(&s);
    assert_eq!(s["health"]["status"], "HEALTH_ERR", "{s}");
    assert!(checks.iter().any(|n| n == "POOL_FULL"), "{s}");
    for (id, o) in s["osds"].as_array().expect("osds").iter().enumerate() {
        let total = o["total_bytes"].as_u64().unwrap_or(0);
        let used = o["used_bytes"].as_u64().unwrap_or(0);
        let avail = o["avail_bytes"].as_u64().unwrap_or(u64::MAX);
        assert!(
            total > (FS_MIB - 16) * MIB && total <= (FS_MIB + 16) * MIB,
            "osd.{id}: file system size {total} (a {FS_MIB} MiB file system): {s}"
        );
        assert!(
            used + avail <= total && used > total / 2,
            "osd.{id}: used {used} avail {avail} of {total}: {s}"
        );
        assert_eq!(
            o["healthy"], true,
            "osd.{id}: a full disk is not an I/O error: {s}"
        );
    }
    let text = run_ok(spindle().args(["status", "--dir"]).arg(&c.dir));
    assert!(
        text.contains("HEALTH_ERR") && text.contains("OSD_FULL") && text.contains("POOL_FULL"),
        "{text}"
    );
    assert!(
        text.contains("MiB used") && text.contains("MiB available") && text.contains("full"),
        "spindle status must show each daemon's used/available space: {text}"
    );

    // 3. Deletes work on the full cluster: remove about half of the data.
    let names: Vec<String> = acked.keys().cloned().collect();
    let mut freed = 0u64;
    for name in &names {
        if freed >= acked_bytes / 2 {
            break;
        }
        rm(&c, name);
        freed += acked[name].0 as u64;
        acked.remove(name);
        deleted.push(name.clone());
    }
    eprintln!(
        "full_disk: {} deletes on the full cluster ({} MiB): {:?}",
        deleted.len(),
        freed / MIB,
        started.elapsed()
    );

    // 4. Writes work again, without restarting anything, once the daemons see the space.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let out = put(&c, "after-0", 4 << 20);
        if out.ok {
            break;
        }
        assert_no_space(&out, "a put while the full flag clears");
        assert!(
            Instant::now() < deadline,
            "puts still fail 30 s after {} MiB were deleted: {}",
            freed / MIB,
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    acked.insert(
        "after-0".into(),
        (4 << 20, sha256(&content("after-0", 0, 4 << 20))),
    );
    eprintln!(
        "full_disk: puts work again after {attempts} attempt(s): {:?}",
        started.elapsed()
    );
    let s = wait_status(&c, "full flags to clear", Duration::from_secs(15), |s| {
        !any_osd(s, "full")
            && !check_names(s)
                .iter()
                .any(|n| n == "OSD_FULL" || n == "POOL_FULL")
    });
    assert_ne!(s["health"]["status"], "HEALTH_ERR", "{s}");
    eprintln!("full_disk: after the deletes: {}", space_line(&s));

    // 5. Fill through NBD: qemu-io writes 4 MiB chunks of image disk1 until the disks
    // are full. The NBD client must see ENOSPC, never EIO. The full ratio is 0.99 here so
    // that the stores surely meet the real ENOSPC (preallocation failure, full mode,
    // reserve released) rather than the ratio alone.
    set_ratio(&c, "set-full-ratio", 0.99);
    let ks: Vec<u64> = (0..96).collect();
    let (nbd_acked, failed) = nbd_write_chunks(&nbd.uri("disk1"), &ks);
    eprintln!(
        "full_disk: NBD fill: {} chunks written, {} failed ({:?}); first failure: {:?}",
        nbd_acked.len(),
        failed.len(),
        started.elapsed(),
        failed.first()
    );
    assert!(
        !failed.is_empty(),
        "{} MiB written through NBD without filling the disks",
        nbd_acked.len() as u64 * CHUNK / MIB
    );
    assert!(
        nbd_acked.len() >= 4,
        "only {} NBD chunks fit after freeing {} MiB",
        nbd_acked.len(),
        freed / MIB
    );
    for f in &failed {
        assert!(
            f.contains("No space left on device"),
            "NBD writes to a full cluster must fail with ENOSPC: {f}"
        );
    }
    // `spindle nbd` says why writes failed, once per burst (not once per request).
    let log = nbd.log();
    let logged: Vec<&str> = log.lines().filter(|l| l.contains("write failed")).collect();
    eprintln!("full_disk: spindle nbd logged: {logged:?}");
    assert!(
        !logged.is_empty(),
        "spindle nbd must log why writes failed: {log}"
    );
    assert!(
        logged
            .iter()
            .all(|l| l.to_lowercase().contains("no space") && l.contains("errno 28")),
        "{log}"
    );
    assert!(
        logged.len() <= 1 + failed.len() / 4,
        "{} log lines for {} failed writes: the log must not have a line per request: {log}",
        logged.len(),
        failed.len()
    );
    // A store that met ENOSPC flags itself full; once the failed writes have given their
    // space back it may drop under the ratio again before we look, so the monitor's event
    // log (a `full=true` after the ratio went to 0.99) counts as well as the current flag.
    let s = wait_status(
        &c,
        "a full daemon after the NBD fill",
        Duration::from_secs(10),
        |s| any_osd(s, "full") || flagged_full_since(s, "osd set-full-ratio 0.99"),
    );
    eprintln!("full_disk: full after the NBD fill: {}", space_line(&s));

    // Delete more objects; NBD writes succeed again (same `spindle nbd`, same connection
    // settings, nothing restarted). Every remaining fill object goes: the NBD writes that
    // failed were refused by one store but kept by the others, and recovery copies them
    // to the store that refused them as soon as it has room. That backlog (up to a few
    // chunks per store) takes its share of the freed space before new writes do; half of
    // the fill objects once left too little for it (CI, 2026-11-29).
    let names: Vec<String> = acked
        .keys()
        .filter(|n| n.starts_with("fill-"))
        .cloned()
        .collect();
    let mut freed2 = 0u64;
    for name in &names {
        rm(&c, name);
        freed2 += acked[name].0 as u64;
        acked.remove(name);
        deleted.push(name.clone());
    }
    let first_failed = *ks
        .iter()
        .find(|k| !nbd_acked.contains(k))
        .expect("a failed chunk");
    // The daemons learn of the freed space within a second or two; until then a write may
    // still meet ENOSPC (and only ENOSPC). Two chunks must then be written, each within
    // the deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut nbd_acked = nbd_acked;
    for k in [first_failed, first_failed + 1] {
        loop {
            let (ok, failed) = nbd_write_chunks(&nbd.uri("disk1"), &[k]);
            if !ok.is_empty() {
                nbd_acked.extend(ok);
                break;
            }
            assert!(
                failed.iter().all(|f| f.contains("No space left on device")),
                "{failed:?}"
            );
            assert!(
                Instant::now() < deadline,
                "NBD writes of chunk {k} still fail 30 s after {} MiB more were deleted: \
                 {failed:?}",
                freed2 / MIB
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    set_ratio(&c, "set-full-ratio", 0.95);
    // The stores met the real ENOSPC (full mode) and left full mode without a restart.
    let logs: Vec<String> = (0..c.osds)
        .map(|id| std::fs::read_to_string(c.osd_dir(id).join("log")).unwrap_or_default())
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("file system full: store refuses new data")),
        "no store met ENOSPC (full mode): the test did not fill the file systems"
    );
    for (id, l) in logs.iter().enumerate() {
        let entered = l
            .matches("file system full: store refuses new data")
            .count();
        let left = l.matches("file system has room again").count();
        assert_eq!(
            entered, left,
            "osd.{id}: entered full mode {entered} times, left it {left} times"
        );
    }
    assert!(
        nbd.log().contains("writes succeed again"),
        "spindle nbd must log that writes recovered: {}",
        nbd.log()
    );
    eprintln!(
        "full_disk: NBD writes work again after deleting {} MiB more: {:?}",
        freed2 / MIB,
        started.elapsed()
    );

    // 6. Every acknowledged object is intact; deleted ones are gone.
    let got = c.dir.join("got");
    for (name, (len, sum)) in &acked {
        let out = run_timed(
            spindle()
                .args(["get", name])
                .arg(&got)
                .arg("--dir")
                .arg(&c.dir),
            Duration::from_secs(60),
        );
        assert!(out.ok, "get {name}: {}", out.stderr);
        let data = std::fs::read(&got).expect("read got");
        assert_eq!(data.len(), *len, "{name}: size");
        assert!(
            sha256(&data) == *sum,
            "{name}: content differs from the acknowledged put"
        );
    }
    for name in deleted.iter().step_by(7) {
        let out = run_timed(
            spindle()
                .args(["get", name])
                .arg(&got)
                .arg("--dir")
                .arg(&c.dir),
            Duration::from_secs(60),
        );
        assert!(!out.ok, "{name} was deleted but can still be read");
    }
    // Image data: disk0 (written before the fill) and every acknowledged disk1 chunk.
    let out = run_timed(
        Command::new("nbdcopy").arg(nbd.uri("disk0")).arg(&got),
        Duration::from_secs(60),
    );
    assert!(out.ok, "nbdcopy from disk0: {}", out.stderr);
    assert!(
        std::fs::read(&got).expect("read disk0 copy") == disk0,
        "disk0 differs from what was written before the disks filled"
    );
    let reads: Vec<String> = nbd_acked
        .iter()
        .map(|k| format!("read -P {} {} {}", pattern(*k), k * CHUNK, CHUNK))
        .collect();
    let out = qemu_io(&nbd.uri("disk1"), &reads);
    assert!(
        out.ok
            && !out.stdout.contains("Pattern verification failed")
            && out.stdout.matches("read ").count() == reads.len(),
        "acknowledged NBD writes must read back: {}{}",
        out.stdout,
        out.stderr
    );

    // Nothing was restarted: same daemons, same NBD server.
    assert_eq!(
        daemon_pids(&c),
        pids,
        "daemon pids changed: something restarted"
    );
    for pid in &pids {
        // SAFETY: kill with signal 0 only checks for existence.
        assert_eq!(
            unsafe { libc::kill(*pid as i32, 0) },
            0,
            "pid {pid} is gone"
        );
    }
    assert!(
        nbd.child.try_wait().expect("nbd wait").is_none(),
        "spindle nbd exited"
    );
    let s = status(&c);
    assert!(
        s["osds"]
            .as_array()
            .is_some_and(|a| a.iter().all(|o| o["up"] == true && o["healthy"] == true)),
        "{s}"
    );
    eprintln!("full_disk: done in {:?}", started.elapsed());
}
