//! `spindle nbd` end to end: a real 3-daemon cluster, `spindle nbd` as a child process,
//! and the standard NBD tools (nbdinfo, qemu-img, qemu-io, nbdcopy, fio) as clients.
//! A missing tool fails the test (scripts/setup.sh installs them).
//!
//! The tests take a process-wide lock so only one cluster runs at a time (2-core machines
//! would otherwise starve heartbeats).

mod common;

use common::{run_ok, spindle, Cluster, NbdProc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: u64 = 1 << 20;

/// Runs an external tool; panics (naming the tool) if it is missing or fails.
fn tool(cmd: &mut Command) -> String {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run `{program}` ({e}): is it installed? (scripts/setup.sh installs it)")
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn create_image(c: &Cluster, name: &str, size: &str) {
    run_ok(
        spindle()
            .args(["image", "create", name, "--size", size, "--dir"])
            .arg(&c.dir),
    );
}

/// Deterministic pseudo-random bytes.
fn random_file(path: &Path, len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len as usize);
    while (data.len() as u64) < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len as usize);
    std::fs::write(path, &data).expect("write source file");
    data
}

fn assert_same_file(path: &Path, want: &[u8], what: &str) {
    let got = std::fs::read(path).expect("read copy");
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", uri]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    let out = tool(&mut cmd);
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("failed:"),
        "qemu-io {cmds:?}: {out}"
    );
    let reads = cmds.iter().filter(|c| c.starts_with("read")).count();
    assert_eq!(
        out.matches("read ").count(),
        reads,
        "qemu-io {cmds:?}: every read must complete: {out}"
    );
    out
}

/// fio job arguments shared by a write run and its later `--verify_only` run: 4 jobs
/// (one NBD connection each) on disjoint 32 MiB regions, bs 4k..512k, iodepth 16.
fn fio_job(uri: &str, rw: &str) -> Vec<String> {
    [
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        &format!("--rw={rw}"),
        "--bsrange=4k-512k",
        "--blockalign=4k",
        "--numjobs=4",
        "--size=32m",
        "--offset_increment=32m",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--randseed=20261122",
        "--group_reporting=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn fio(args: &[String]) -> String {
    let out = tool(Command::new("fio").args(args));
    let job_error = out
        .lines()
        .any(|l| l.contains("err=") && !l.contains("err= 0"));
    assert!(
        !out.contains("verify: bad") && !job_error,
        "fio reported errors: {out}"
    );
    out
}

fn tmp_file(c: &Cluster, name: &str) -> PathBuf {
    c.dir.join(name)
}

#[test]
fn nbd_tools_list_copy_trim_and_fio_verify() {
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start("nbd-tools", 3, 16);
    create_image(&c, "disk-a", "256M");
    create_image(&c, "disk-b", "64M");
    let nbd = NbdProc::start(&c);

    // nbdinfo --list shows both images with their sizes.
    let listing =
        tool(Command::new("nbdinfo").args(["--list", "--json", &format!("nbd://{}", nbd.addr)]));
    let v: serde_json::Value = serde_json::from_str(&listing).expect("nbdinfo JSON");
    let exports = v["exports"].as_array().expect("exports");
    let size_of = |name: &str| {
        exports
            .iter()
            .find(|e| e["export-name"] == name)
            .and_then(|e| e["export-size"].as_u64())
    };
    assert_eq!(size_of("disk-a"), Some(256 * MIB), "{listing}");
    assert_eq!(size_of("disk-b"), Some(64 * MIB), "{listing}");
    assert_eq!(exports.len(), 2, "{listing}");
    assert_eq!(exports[0]["can_multi_conn"], true, "{listing}");

    // qemu-img convert in and out.
    let src = tmp_file(&c, "src.raw");
    let data = random_file(&src, 256 * MIB, 0x1234_5678);
    tool(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(nbd.uri("disk-a")),
    );
    let out = tmp_file(&c, "out.raw");
    tool(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(nbd.uri("disk-a"))
            .arg(&out),
    );
    assert_same_file(&out, &data, "qemu-img round trip");
    std::fs::remove_file(&out).expect("rm");

    // nbdcopy of different data in and out.
    let data = random_file(&src, 256 * MIB, 0xfeed_beef);
    tool(
        Command::new("nbdcopy")
            .arg("--flush")
            .arg(&src)
            .arg(nbd.uri("disk-a")),
    );
    tool(Command::new("nbdcopy").arg(nbd.uri("disk-a")).arg(&out));
    assert_same_file(&out, &data, "nbdcopy round trip");
    std::fs::remove_file(&out).expect("rm");
    std::fs::remove_file(&src).expect("rm");
    drop(data);

    // TRIM and WRITE_ZEROES read back as zeros; the rest keeps its data.
    qemu_io(
        &nbd.uri("disk-b"),
        &[
            "write -P 0xab 0 2M",
            "discard 0 1M",
            "write -z 1M 512k",
            "read -P 0 0 1536k",
            "read -P 0xab 1536k 512k",
        ],
    );

    // fio with crc32c verification: random and sequential, 4 connections at once.
    fio(&fio_job(&nbd.uri("disk-a"), "randwrite"));
    fio(&fio_job(&nbd.uri("disk-a"), "write"));
    drop(nbd);
    eprintln!("nbd_tools: {:?}", started.elapsed());
}

#[test]
fn nbd_fio_verify_survives_nbd_and_osd_restart() {
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start("nbd-restart", 3, 16);
    create_image(&c, "disk", "128M");
    let mut nbd = NbdProc::start(&c);
    let job = fio_job(&nbd.uri("disk"), "randwrite");

    // Write phase; a storage daemon is killed and restarted while fio runs.
    let mut fio_child = Command::new("fio")
        .args(&job)
        .arg("--do_verify=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run fio: is it installed?");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        fio_child.try_wait().expect("fio").is_none(),
        "the write phase ended before the daemon restart: make it larger"
    );
    c.kill_osd(1);
    std::thread::sleep(Duration::from_millis(1500));
    c.start_osd(1);
    let out = fio_child.wait_with_output().expect("fio");
    assert!(
        out.status.success(),
        "fio write phase failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Restart the NBD server (SIGKILL: acknowledged writes are durable without a flush)
    // and, once more, a storage daemon; then verify everything fio wrote.
    nbd.kill9();
    c.kill_osd(2);
    c.start_osd(2);
    c.wait_clean();
    let nbd = NbdProc::start(&c);
    let mut verify = fio_job(&nbd.uri("disk"), "randwrite");
    verify.push("--verify_only".into());
    let out = fio(&verify);
    assert!(out.contains("verify"), "{out}");
    drop(nbd);
    eprintln!("nbd_restart: {:?}", started.elapsed());
}

#[test]
fn nbd_flushed_writes_survive_sigkill_of_every_process() {
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start("nbd-crash", 3, 16);
    create_image(&c, "disk", "64M");
    let mut nbd = NbdProc::start(&c);
    qemu_io(
        &nbd.uri("disk"),
        &[
            "write -P 0x5a 0 4M",
            "write -P 0xc3 8M 1M",
            "write -z 512k 64k",
            "flush",
        ],
    );

    nbd.kill9();
    for id in 0..c.osds {
        c.kill_osd(id);
    }
    c.kill_mon();
    c.up();

    let mut nbd = NbdProc::start(&c);
    qemu_io(
        &nbd.uri("disk"),
        &[
            "read -P 0x5a 0 512k",
            "read -P 0 512k 64k",
            "read -P 0x5a 576k 3520k",
            "read -P 0 4M 4M",
            "read -P 0xc3 8M 1M",
        ],
    );
    // A graceful stop exits 0 after flushing.
    nbd.terminate();
    eprintln!("nbd_crash: {:?}", started.elapsed());
}
