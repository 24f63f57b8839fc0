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

/// A minimal NBD client for the stress test: fixed newstyle, `NBD_OPT_EXPORT_NAME`, simple
/// replies (the protocol itself is tested in `spindle-nbd/tests/protocol.rs`).
mod raw_nbd {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const REQUEST_MAGIC: u32 = 0x2560_9513;
    const REPLY_MAGIC: u32 = 0x6744_6698;
    pub const CMD_READ: u16 = 0;
    pub const CMD_WRITE: u16 = 1;
    pub const CMD_DISC: u16 = 2;
    pub const CMD_FLUSH: u16 = 3;

    /// Connects and negotiates `export`: the stream and the export's size.
    pub async fn connect(addr: &str, export: &str) -> std::io::Result<(TcpStream, u64)> {
        let mut s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).await?;
        assert_eq!(&hello[..8], b"NBDMAGIC");
        assert_eq!(&hello[8..16], b"IHAVEOPT");
        // Fixed newstyle + no zeroes.
        s.write_all(&3u32.to_be_bytes()).await?;
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        s.write_all(&opt).await?;
        let mut info = [0u8; 10];
        s.read_exact(&mut info).await?;
        let size = u64::from_be_bytes(info[..8].try_into().unwrap());
        Ok((s, size))
    }

    /// Sends one request (with `data` for a write) and reads its simple reply: the error
    /// number and, for a read, `len` bytes.
    pub async fn request(
        s: &mut TcpStream,
        cmd: u16,
        handle: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<(u32, Vec<u8>)> {
        let mut req = Vec::with_capacity(28 + data.len());
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&cmd.to_be_bytes());
        req.extend_from_slice(&handle.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(data);
        s.write_all(&req).await?;
        if cmd == CMD_DISC {
            return Ok((0, Vec::new()));
        }
        let mut head = [0u8; 16];
        s.read_exact(&mut head).await?;
        assert_eq!(
            u32::from_be_bytes(head[..4].try_into().unwrap()),
            REPLY_MAGIC
        );
        let errno = u32::from_be_bytes(head[4..8].try_into().unwrap());
        assert_eq!(u64::from_be_bytes(head[8..].try_into().unwrap()), handle);
        let mut body = Vec::new();
        if cmd == CMD_READ && errno == 0 {
            body.resize(len as usize, 0);
            s.read_exact(&mut body).await?;
        }
        Ok((errno, body))
    }
}

/// Number of descriptors `pid` holds.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Thousands of NBD connections open at once, each writing and reading back its own region
/// with a size from 512 B to 128 KiB, on a multi-threaded client: every byte reads back,
/// and the server's descriptors return to where they were once the clients leave.
#[test]
fn thousands_of_connections_with_mixed_sizes() {
    const CONNECTIONS: u64 = 2000;
    const REGION_BYTES: u64 = 128 << 10;
    let _serial = serial();
    // The test process holds every client socket at once.
    // SAFETY: plain getrlimit/setrlimit on this process's own limit.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        assert!(
            lim.rlim_max >= 3 * CONNECTIONS,
            "the hard descriptor limit ({}) is too low for this test",
            lim.rlim_max
        );
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let c = Cluster::start("nbd-stress", 3, 16);
    create_image(&c, "stress", "256M");
    let nbd = NbdProc::start(&c);
    let pid = nbd.child.id();
    let fds_before = fd_count(pid);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = nbd.addr.clone();
    let (connected_max, bad) = rt.block_on(async move {
        let all_in = std::sync::Arc::new(tokio::sync::Barrier::new(CONNECTIONS as usize));
        let open = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let max_open = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tasks: Vec<_> = (0..CONNECTIONS)
            .map(|i| {
                let (addr, all_in, open, max_open) =
                    (addr.clone(), all_in.clone(), open.clone(), max_open.clone());
                tokio::spawn(async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let connected = tokio::time::timeout(
                        Duration::from_secs(120),
                        raw_nbd::connect(&addr, "stress"),
                    )
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::other("connect timed out")));
                    if connected.is_ok() {
                        let now = open.fetch_add(1, SeqCst) + 1;
                        max_open.fetch_max(now, SeqCst);
                    }
                    // Everybody connected (or failed to) before anybody writes: all
                    // sessions are open at once.
                    all_in.wait().await;
                    let (mut s, size) = connected?;
                    assert_eq!(size, 256 * MIB);
                    let sizes = [512u32, 4096, 8192, 65536, 131072, 1536, 20480];
                    let len = sizes[(i % sizes.len() as u64) as usize];
                    let offset = i * REGION_BYTES + (i % 7) * 512;
                    let offset = offset.min((i + 1) * REGION_BYTES - len as u64);
                    let data: Vec<u8> = (0..len)
                        .map(|b| (b as u64 ^ i.wrapping_mul(0x9e37)) as u8)
                        .collect();
                    let (e, _) =
                        raw_nbd::request(&mut s, raw_nbd::CMD_WRITE, 1, offset, len, &data).await?;
                    assert_eq!(e, 0, "write {i}");
                    let (e, back) =
                        raw_nbd::request(&mut s, raw_nbd::CMD_READ, 2, offset, len, &[]).await?;
                    assert_eq!(e, 0, "read {i}");
                    let (e, _) = raw_nbd::request(&mut s, raw_nbd::CMD_FLUSH, 3, 0, 0, &[]).await?;
                    assert_eq!(e, 0, "flush {i}");
                    raw_nbd::request(&mut s, raw_nbd::CMD_DISC, 4, 0, 0, &[]).await?;
                    open.fetch_sub(1, SeqCst);
                    Ok::<bool, std::io::Error>(back == data)
                })
            })
            .collect();
        let mut bad = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => bad.push(format!("connection {i}: wrong bytes read back")),
                Ok(Err(e)) => bad.push(format!("connection {i}: {e}")),
                Err(e) => bad.push(format!("connection {i}: task failed: {e}")),
            }
        }
        (max_open.load(std::sync::atomic::Ordering::SeqCst), bad)
    });
    assert!(
        bad.is_empty(),
        "{} connections failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(
        connected_max, CONNECTIONS,
        "not every session was open at once"
    );
    // Every region reads back through one more, fresh connection (after all the flushes).
    rt.block_on(async {
        let (mut s, _) = raw_nbd::connect(&nbd.addr, "stress").await.unwrap();
        for i in (0..CONNECTIONS).step_by(97) {
            let sizes = [512u32, 4096, 8192, 65536, 131072, 1536, 20480];
            let len = sizes[(i % sizes.len() as u64) as usize];
            let offset =
                (i * REGION_BYTES + (i % 7) * 512).min((i + 1) * REGION_BYTES - len as u64);
            let want: Vec<u8> = (0..len)
                .map(|b| (b as u64 ^ i.wrapping_mul(0x9e37)) as u8)
                .collect();
            let (e, got) = raw_nbd::request(&mut s, raw_nbd::CMD_READ, i, offset, len, &[])
                .await
                .unwrap();
            assert_eq!(e, 0);
            assert!(got == want, "region {i} differs on a fresh connection");
        }
        raw_nbd::request(&mut s, raw_nbd::CMD_DISC, 0, 0, 0, &[])
            .await
            .unwrap();
    });
    // The server lets go of every socket.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = fd_count(pid);
        if now <= fds_before + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spindle nbd holds {now} descriptors after the clients left ({fds_before} before)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(nbd);
}

/// Sends SIGSTOP or SIGCONT to `pid`.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) of a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// Two `spindle nbd` processes on one image: the second is refused (the holder named)
/// while the first holds the image's lock; `image info` shows the holder. With
/// `--break-lock` a second server takes over from a first one stalled by SIGSTOP, which
/// is fenced: once continued, its write (sent while it was stopped) fails, and the image
/// keeps what the new holder wrote. A server killed with SIGKILL is taken over by the next
/// one on this host without `--break-lock`.
#[test]
fn a_second_nbd_server_is_refused_and_break_lock_fences_a_stalled_first() {
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start("nbd-lock", 3, 16);
    create_image(&c, "disk", "16M");
    let first = NbdProc::start(&c);
    qemu_io(&first.uri("disk"), &["write -P 0x11 0 1M", "flush"]);

    let info: serde_json::Value = serde_json::from_str(&run_ok(
        spindle()
            .args(["image", "info", "disk", "--json", "--dir"])
            .arg(&c.dir),
    ))
    .expect("image info --json");
    let holder = info["lock"]["holder"].as_str().expect("a lock holder");
    assert!(
        holder.contains(&format!("pid {} ", first.child.id())),
        "{holder}"
    );
    assert_eq!(info["lock"]["generation"], 1);

    // A second server, no --break-lock: the export is refused, with the holder named.
    let second = NbdProc::start(&c);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &second.uri("disk"), "-c", "read 0 4k"])
        .output()
        .expect("qemu-io");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(second.log().contains("is locked by"), "{}", second.log());
    drop(second);

    // The first server, with a write queued on its socket, stalls (SIGSTOP).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut conn, _) = rt
        .block_on(raw_nbd::connect(&first.addr, "disk"))
        .expect("connect to the first server");
    let pid = first.child.id();
    signal(pid, libc::SIGSTOP);
    rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        // A write of 0x77 over the first MiB, sent (not answered) while stopped.
        let mut req = Vec::new();
        req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&raw_nbd::CMD_WRITE.to_be_bytes());
        req.extend_from_slice(&9u64.to_be_bytes());
        req.extend_from_slice(&0u64.to_be_bytes());
        req.extend_from_slice(&(1u32 << 20).to_be_bytes());
        req.extend(std::iter::repeat_n(0x77u8, 1 << 20));
        conn.write_all(&req).await.expect("queue the write");
    });

    // A third server breaks the lock and writes 0x22.
    let third = NbdProc::start_with(&c, &["--break-lock"]);
    qemu_io(&third.uri("disk"), &["write -P 0x22 0 1M", "flush"]);
    assert!(
        third.log().contains("took the lock over"),
        "{}",
        third.log()
    );

    // The first server continues: its queued write fails (fenced), and the data is the
    // new holder's.
    signal(pid, libc::SIGCONT);
    let errno = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let mut head = [0u8; 16];
        conn.read_exact(&mut head)
            .await
            .expect("reply to the queued write");
        assert_eq!(u64::from_be_bytes(head[8..].try_into().unwrap()), 9);
        u32::from_be_bytes(head[4..8].try_into().unwrap())
    });
    assert_ne!(errno, 0, "a fenced server's write must fail");
    // Later requests fail too: a fenced server serves nothing, not even reads.
    let (e, _) = rt
        .block_on(raw_nbd::request(
            &mut conn,
            raw_nbd::CMD_READ,
            10,
            0,
            4096,
            &[],
        ))
        .expect("read reply");
    assert_ne!(e, 0, "a fenced server must not serve reads");
    qemu_io(&third.uri("disk"), &["read -P 0x22 0 1M"]);
    let info: serde_json::Value = serde_json::from_str(&run_ok(
        spindle()
            .args(["image", "info", "disk", "--json", "--dir"])
            .arg(&c.dir),
    ))
    .unwrap();
    assert_eq!(info["lock"]["generation"], 2);
    drop(first);

    // SIGKILL the holder: the next server on this host takes over without --break-lock.
    let mut third = third;
    third.kill9();
    let fourth = NbdProc::start(&c);
    qemu_io(
        &fourth.uri("disk"),
        &["read -P 0x22 0 1M", "write -P 0x33 0 4k"],
    );
    // A graceful stop releases the lock.
    let mut fourth = fourth;
    fourth.terminate();
    let info: serde_json::Value = serde_json::from_str(&run_ok(
        spindle()
            .args(["image", "info", "disk", "--json", "--dir"])
            .arg(&c.dir),
    ))
    .unwrap();
    assert!(info["lock"].is_null(), "{info}");
    eprintln!("nbd_lock: {:?}", started.elapsed());
}

/// `spindle nbd --write-log`: writes are acknowledged from a local log and published in
/// the background. Eight connections write 4 KiB-128 KiB pieces of their own regions (each
/// 4 KiB block stamped with the write's id) with an occasional FLUSH, and the NBD server
/// is killed with SIGKILL at a random point, twenty times. After every restart (the log is
/// replayed first), every block holds its last acknowledged write, or the write that was
/// in flight on it when the server died; never an older one, never another.
#[test]
fn the_write_log_loses_no_acknowledged_write_across_sigkills() {
    write_log_survives_sigkills("nbd-wlog", 20, false);
}

/// The same with the publisher in `spindle agent` (pinned to CPU 1): the agent is killed
/// with the NBD server, or alone in the middle of a round (the NBD server then publishes
/// itself), ten times.
#[test]
fn the_write_log_with_an_offload_agent_loses_no_acknowledged_write_across_sigkills() {
    write_log_survives_sigkills("nbd-wlog-agent", 10, true);
}

/// A running `spindle agent` (killed with SIGKILL when dropped).
struct AgentProc {
    child: std::process::Child,
}

impl AgentProc {
    fn start(c: &Cluster, log_dir: &std::path::Path) -> AgentProc {
        use std::io::BufRead;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(c.dir.join("agent.log"))
            .expect("agent log");
        let mut child = spindle()
            .args(["agent", "--cpus", "1", "--write-log"])
            .arg(log_dir)
            .arg("--dir")
            .arg(&c.dir)
            .stdout(std::process::Stdio::piped())
            .stderr(out)
            .spawn()
            .expect("spawn spindle agent");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("agent banner");
        assert!(
            line.starts_with("spindle agent: serving"),
            "agent said {line:?}"
        );
        // The rest of its output goes to the log.
        let log = c.dir.join("agent.log");
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(log).ok();
            for l in stdout.lines().map_while(Result::ok) {
                if let Some(f) = f.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{l}");
                }
            }
        });
        AgentProc { child }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn write_log_survives_sigkills(tag: &str, kills: u32, with_agent: bool) {
    const REGIONS: u64 = 8;
    const REGION_BYTES: u64 = 4 * MIB;
    const BLOCK: u64 = 4096;
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start(tag, 3, 16);
    create_image(&c, "disk", "32M");
    let log_dir = c.dir.join("wlog");
    let log_arg = log_dir.to_string_lossy().into_owned();
    let args = ["--write-log", &log_arg, "--write-log-size", "32M"];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Per block: the write ids it may hold (the last acknowledged one, then possibly the
    // one in flight at the kill). 0 = never written (zeros).
    let blocks = (REGIONS * REGION_BYTES / BLOCK) as usize;
    let mut allowed: Vec<Vec<u64>> = vec![vec![0]; blocks];
    let mut rng = 0x5eed_u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut write_id = 1u64;
    let mut acked_total = 0u64;
    let mut agent: Option<AgentProc> = None;
    for round in 0..=kills {
        if with_agent && agent.is_none() {
            agent = Some(AgentProc::start(&c, &log_dir));
        }
        let mut nbd = NbdProc::start_with(&c, &args);
        // Check every block, then settle the ambiguous ones to what they hold.
        let addr = nbd.addr.clone();
        let image = rt.block_on(async move {
            let (mut s, _) = raw_nbd::connect(&addr, "disk").await.expect("connect");
            let mut all = Vec::new();
            for off in (0..REGIONS * REGION_BYTES).step_by(MIB as usize) {
                let (e, b) = raw_nbd::request(&mut s, raw_nbd::CMD_READ, 1, off, MIB as u32, &[])
                    .await
                    .expect("read");
                assert_eq!(e, 0, "read at {off}");
                all.extend(b);
            }
            let _ = raw_nbd::request(&mut s, raw_nbd::CMD_DISC, 2, 0, 0, &[]).await;
            all
        });
        for (i, ok) in allowed.iter_mut().enumerate() {
            let b = &image[i * BLOCK as usize..(i + 1) * BLOCK as usize];
            let id = u64::from_le_bytes(b[..8].try_into().unwrap());
            let at = u64::from_le_bytes(b[8..16].try_into().unwrap());
            assert!(
                ok.contains(&id) && (id == 0 || at == i as u64 * BLOCK),
                "round {round}: block {i} holds write {id} (stamped for {at}), expected one of {ok:?}; log: {}",
                nbd.log()
            );
            *ok = vec![id];
        }
        if round == 0 {
            // The image is open with a write log (its lock says so): a snapshot would
            // miss writes acknowledged only in the log, so it is refused.
            common::fails(&c, &["image", "snap", "create", "disk@s"], "write log");
        }
        if round == kills {
            nbd.terminate();
            break;
        }
        // Writers: each owns a region, one write at a time, FLUSH now and then.
        let plans: Vec<Vec<(u64, u64, u64, bool)>> = (0..REGIONS)
            .map(|r| {
                (0..400)
                    .map(|_| {
                        let len = (1 + next(32)) * BLOCK;
                        let off = r * REGION_BYTES + next((REGION_BYTES - len) / BLOCK + 1) * BLOCK;
                        let id = write_id;
                        write_id += 1;
                        (off, len, id, next(20) == 0)
                    })
                    .collect()
            })
            .collect();
        let kill_after = Duration::from_millis(150 + next(600));
        // Every third round a storage daemon dies too, while the publisher works.
        let osd_down = (round % 3 == 1).then_some(round % c.osds);
        let addr = nbd.addr.clone();
        let pid = nbd.child.id();
        let osd_dir = c.dir.clone();
        // With an agent: every other round it dies alone, half way (the NBD server then
        // publishes itself), else with the NBD server.
        let agent_pid = agent.as_ref().map(|a| a.child.id() as i32);
        let agent_alone = round % 2 == 1;
        let outcome = rt.block_on(async move {
            let tasks: Vec<_> = plans
                .into_iter()
                .map(|plan| {
                    let addr = addr.clone();
                    tokio::spawn(async move {
                        // (acknowledged writes in order, the one in flight when it failed)
                        let mut acked = Vec::new();
                        let Ok((mut s, _)) = raw_nbd::connect(&addr, "disk").await else {
                            return (acked, None);
                        };
                        for (off, len, id, flush) in plan {
                            let mut data = vec![0u8; len as usize];
                            for (k, b) in data.chunks_mut(BLOCK as usize).enumerate() {
                                b[..8].copy_from_slice(&id.to_le_bytes());
                                b[8..16].copy_from_slice(&(off + k as u64 * BLOCK).to_le_bytes());
                                b[16] = (id * 7) as u8;
                            }
                            match raw_nbd::request(
                                &mut s,
                                raw_nbd::CMD_WRITE,
                                id,
                                off,
                                len as u32,
                                &data,
                            )
                            .await
                            {
                                Ok((0, _)) => acked.push((off, len, id)),
                                _ => return (acked, Some((off, len, id))),
                            }
                            if flush
                                && !matches!(
                                    raw_nbd::request(&mut s, raw_nbd::CMD_FLUSH, id, 0, 0, &[])
                                        .await,
                                    Ok((0, _))
                                )
                            {
                                return (acked, None);
                            }
                        }
                        (acked, None)
                    })
                })
                .collect();
            if let Some(osd) = osd_down {
                tokio::time::sleep(kill_after / 3).await;
                let pidfile = osd_dir.join(format!("osd.{osd}/pid"));
                if let Ok(p) = std::fs::read_to_string(&pidfile) {
                    if let Ok(p) = p.trim().parse::<i32>() {
                        // SAFETY: kill(2) of a daemon this test's cluster started.
                        unsafe { libc::kill(p, libc::SIGKILL) };
                    }
                }
            }
            if let (Some(a), true) = (agent_pid, agent_alone) {
                tokio::time::sleep(kill_after / 2).await;
                // SAFETY: kill(2) of the test's own child.
                unsafe { libc::kill(a, libc::SIGKILL) };
                tokio::time::sleep(kill_after / 2).await;
            } else {
                tokio::time::sleep(kill_after).await;
            }
            // SAFETY: kill(2) of the test's own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            if let (Some(a), false) = (agent_pid, agent_alone) {
                // SAFETY: as above.
                unsafe { libc::kill(a, libc::SIGKILL) };
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("writer task"));
            }
            out
        });
        nbd.kill9();
        if let Some(mut a) = agent.take() {
            a.kill9();
        }
        if let Some(osd) = osd_down {
            c.start_osd(osd);
            c.wait_clean();
        }
        for (acked, in_flight) in outcome {
            acked_total += acked.len() as u64;
            for (off, len, id) in acked {
                for b in off / BLOCK..(off + len) / BLOCK {
                    allowed[b as usize] = vec![id];
                }
            }
            if let Some((off, len, id)) = in_flight {
                for b in off / BLOCK..(off + len) / BLOCK {
                    allowed[b as usize].push(id);
                }
            }
        }
    }
    assert!(
        acked_total > 1000,
        "only {acked_total} writes were acknowledged"
    );
    if with_agent {
        let agent_log = std::fs::read_to_string(c.dir.join("agent.log")).unwrap_or_default();
        let nbd_log = std::fs::read_to_string(c.dir.join("nbd.log")).unwrap_or_default();
        assert!(
            agent_log.contains("publishing default/disk"),
            "the agent never published: {agent_log}"
        );
        assert!(
            nbd_log.contains("publishing through the offload agent"),
            "the NBD server never used the agent: {nbd_log}"
        );
        assert!(
            nbd_log.contains("the offload agent stopped; publishing in this process"),
            "the NBD server never took over from a dead agent: {nbd_log}"
        );
    }
    eprintln!(
        "{tag}: {acked_total} acknowledged writes, {:?}",
        started.elapsed()
    );
}

/// The write log on an erasure-coded image (k=2, m=1): fio writes 4 KiB-512 KiB pieces with
/// crc32c verification through the log, the NBD server is killed with SIGKILL right after
/// (what was not yet published is only in the log), a storage daemon too; the restarted
/// server replays the log into the erasure-coded objects and fio verifies every block.
#[test]
fn the_write_log_publishes_and_replays_on_an_erasure_coded_image() {
    let _serial = serial();
    let started = Instant::now();
    let c = Cluster::start("nbd-wlog-ec", 3, 16);
    run_ok(
        spindle()
            .args(["pool", "create", "ec", "--pg-count", "16", "--erasure"])
            .arg("k=2,m=1,min-size=2")
            .arg("--dir")
            .arg(&c.dir),
    );
    c.wait_clean();
    run_ok(
        spindle()
            .args([
                "image", "create", "disk", "--size", "128M", "--pool", "ec", "--dir",
            ])
            .arg(&c.dir),
    );
    let log_dir = c.dir.join("wlog");
    let log_arg = log_dir.to_string_lossy().into_owned();
    let args = [
        "--pool",
        "ec",
        "--write-log",
        &log_arg,
        "--write-log-size",
        "64M",
    ];
    let mut nbd = NbdProc::start_with(&c, &args);
    let mut write = fio_job(&nbd.uri("disk"), "randwrite");
    write.push("--do_verify=0".into());
    fio(&write);
    nbd.kill9();
    // The killed server's log may hold acknowledged writes: nothing but a server with a
    // write log (which replays it) takes the image's lock until then.
    common::fails(&c, &["image", "rm", "disk", "--pool", "ec"], "write log");
    c.kill_osd(2);
    c.start_osd(2);
    let nbd = NbdProc::start_with(&c, &args);
    let mut verify = fio_job(&nbd.uri("disk"), "randwrite");
    verify.push("--verify_only".into());
    let out = fio(&verify);
    assert!(out.contains("verify"), "{out}");
    let log = nbd.log();
    eprintln!(
        "nbd_wlog_ec: replayed after the kill: {}; {:?}",
        log.contains("replaying"),
        started.elapsed()
    );
    drop(nbd);
}
