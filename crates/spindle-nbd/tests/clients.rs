//! Interoperability with real NBD clients: libnbd's nbdinfo/nbdcopy, qemu-img, qemu-io,
//! and fio's nbd engine. Every tool must be installed; a missing tool fails the test.

mod common;

use std::sync::Arc;

use common::{random_bytes, require_tool, run, scratch_dir, TestServer};
use spindle_nbd::{MemoryDevice, MemoryExports};

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_lists_exports_and_reports_flags() {
    let exports = MemoryExports::new();
    let sizes = [
        ("alpha", MIB),
        ("beta", 3 * MIB + 512),
        ("gamma-odd", 12_345_679),
    ];
    for (name, size) in sizes {
        exports.insert(
            name,
            &format!("{name} test disk"),
            Arc::new(MemoryDevice::new(size)),
        );
    }
    let srv = TestServer::start(exports);

    let out = run(
        "nbdinfo",
        &["--list", &format!("nbd://127.0.0.1:{}", srv.port)],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for (name, size) in sizes {
        let block = text
            .split("export=")
            .find(|b| b.starts_with(&format!("\"{name}\"")))
            .unwrap_or_else(|| panic!("export {name} missing from nbdinfo --list:\n{text}"));
        assert!(
            block.contains(&format!("export-size: {size}")),
            "export {name}: expected size {size} in:\n{block}"
        );
    }

    let out = run("nbdinfo", &["--json", &srv.uri("beta")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &v["exports"][0];
    assert_eq!(v["protocol"], "newstyle-fixed");
    assert_eq!(v["structured"], true);
    assert_eq!(e["export-name"], "beta");
    assert_eq!(e["description"], "beta test disk");
    assert_eq!(e["export-size"], 3 * MIB + 512);
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB);
    for flag in [
        "can_multi_conn",
        "can_trim",
        "can_zero",
        "can_fua",
        "can_flush",
        "can_fast_zero",
        "can_df",
        "can_cache",
    ] {
        assert_eq!(e[flag], true, "{flag} in {e}");
    }
    assert_eq!(e["is_read_only"], false);
    assert_eq!(e["contexts"][0], "base:allocation");

    // Unknown export: nbdinfo must fail (server answers NBD_REP_ERR_UNKNOWN).
    require_tool("nbdinfo");
    let st = std::process::Command::new("nbdinfo")
        .arg(srv.uri("nope"))
        .output()
        .unwrap();
    assert!(!st.status.success(), "nbdinfo on unknown export succeeded");
    srv.stop();
}

/// A 64 MiB source with random data, a zero hole (exercises zero detection /
/// WRITE_ZEROES in the clients) and a tail that is not a multiple of 64 KiB.
fn source_image(seed: u64) -> Vec<u8> {
    let mut data = random_bytes((64 * MIB) as usize, seed);
    data[(20 * MIB) as usize..(28 * MIB) as usize].fill(0);
    data[(40 * MIB + 12_288) as usize..(40 * MIB + 20_480) as usize].fill(0);
    data
}

fn roundtrip(tool: &str, seed: u64) {
    let dir = scratch_dir(tool);
    let src = dir.join("src.raw");
    let dst = dir.join("dst.raw");
    let data = source_image(seed);
    std::fs::write(&src, &data).unwrap();

    let exports = MemoryExports::new();
    let dev = Arc::new(MemoryDevice::new(64 * MIB));
    // Pre-fill with garbage so zero ranges must really be written as zeros.
    dev.write_sync(0, 64 * MIB, Some(&vec![0x5a; (64 * MIB) as usize]))
        .unwrap();
    exports.insert("img", "", dev.clone());
    let srv = TestServer::start(exports);
    let uri = srv.uri("img");
    let (src_s, dst_s) = (src.to_str().unwrap(), dst.to_str().unwrap());

    match tool {
        "qemu-img" => {
            run(
                "qemu-img",
                &["convert", "-n", "-f", "raw", "-O", "raw", src_s, &uri],
            );
            run(
                "qemu-img",
                &["convert", "-f", "raw", "-O", "raw", &uri, dst_s],
            );
        }
        "nbdcopy" => {
            run("nbdcopy", &[src_s, &uri]);
            run("nbdcopy", &[&uri, dst_s]);
        }
        _ => unreachable!(),
    }
    assert!(
        dev.read_sync(0, 64 * MIB).unwrap() == data,
        "{tool}: device contents differ from source"
    );
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len(), data.len(), "{tool}: output size");
    assert!(
        back == data,
        "{tool}: bytes read back differ from the source file"
    );
    let stats = srv.server.stats();
    eprintln!("{tool}: {stats:?}");
    assert_eq!(
        (stats.error_replies, stats.protocol_errors),
        (0, 0),
        "{stats:?}"
    );
    assert!(
        stats.bytes_written > 0 && stats.bytes_read >= 40 * MIB,
        "{stats:?}"
    );
    srv.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qemu_img_convert_roundtrip_64mib() {
    roundtrip("qemu-img", 0x1234_5678);
}

#[test]
fn nbdcopy_roundtrip_64mib() {
    roundtrip("nbdcopy", 0x9abc_def0);
}

#[test]
fn qemu_io_trim_and_write_zeroes_read_back_as_zeros() {
    let exports = MemoryExports::new();
    exports.insert("disk", "", Arc::new(MemoryDevice::new(4 * MIB)));
    let srv = TestServer::start(exports);
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &srv.uri("disk"),
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -z 4096 8192",
            "-c",
            "discard 65536 65536",
            "-c",
            "write -P 0xcd -f 1M 4096", // FUA write
            "-c",
            "flush",
            "-c",
            "read -P 0xab 0 4096",
            "-c",
            "read -P 0 4096 8192",
            "-c",
            "read -P 0xab 12288 53248",
            "-c",
            "read -P 0 65536 65536",
            "-c",
            "read -P 0xab 131072 917504",
            "-c",
            "read -P 0xcd 1M 4096",
            "-c",
            "read -P 0 1052672 3141632",
            "-c",
            "read -v 4194300 4",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains("Pattern verification failed")
            && !stderr.contains("Pattern verification failed"),
        "qemu-io pattern mismatch:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("failed") && !stderr.contains("failed"),
        "qemu-io error:\n{stdout}\n{stderr}"
    );
    assert_eq!(
        stdout.matches("read ").count(),
        8,
        "all reads ran:\n{stdout}"
    );
    let stats = srv.server.stats();
    assert!(
        stats.requests_trim >= 1 && stats.requests_write_zeroes >= 1 && stats.requests_flush >= 1,
        "{stats:?}"
    );

    // Reading past the end must fail cleanly, and the server keeps serving.
    require_tool("qemu-io");
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &srv.uri("disk"), "-c", "read 4194304 512"])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("failed") || !out.status.success(),
        "read past end succeeded: {all}"
    );
    srv.stop();
}

fn fio(srv: &TestServer, export: &str, rw: &str, extra: &[&str]) {
    let uri = format!("--uri={}", srv.uri(export));
    let mut args = vec![
        "--name=verify",
        "--ioengine=nbd",
        &uri,
        "--bsrange=4k-512k",
        "--size=8M",
        "--numjobs=4",
        "--offset_increment=8M",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0", // else fio drops *.state files into the cwd
        "--do_verify=1",
        "--group_reporting",
        "--output-format=terse",
    ];
    let rw_arg = format!("--rw={rw}");
    args.push(&rw_arg);
    args.extend_from_slice(extra);
    let out = run("fio", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.to_lowercase().contains("verify: bad"),
        "fio verification failed:\n{text}"
    );
    assert!(
        !text.contains("fio: pid="),
        "fio reported an error:\n{text}"
    );
}

#[test]
fn fio_random_and_sequential_writes_verify() {
    let exports = MemoryExports::new();
    exports.insert("fio", "", Arc::new(MemoryDevice::new(32 * MIB)));
    let srv = TestServer::start(exports);
    fio(&srv, "fio", "randwrite", &[]);
    fio(&srv, "fio", "write", &[]);
    fio(&srv, "fio", "randwrite", &["--bs=4k", "--iodepth=32"]);
    let stats = srv.server.stats();
    assert!(stats.bytes_written >= 3 * 32 * MIB, "{stats:?}");
    assert_eq!(stats.error_replies, 0, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
    srv.stop();
}

#[test]
fn unix_socket_with_nbdinfo_and_qemu_io() {
    let dir = scratch_dir("unix");
    let sock = dir.join("nbd.sock");
    let exports = MemoryExports::new();
    exports.insert("u", "unix disk", Arc::new(MemoryDevice::new(2 * MIB)));
    let srv = TestServer::start_unix(exports, &sock);
    let uri = format!("nbd+unix:///u?socket={}", sock.display());
    let out = run("nbdinfo", &["--json", &uri]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exports"][0]["export-size"], 2 * MIB);
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 0 64k",
            "-c",
            "read -P 0x11 0 64k",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert_eq!(&srv.device("u").read_sync(0, 4).unwrap(), &[0x11; 4]);
    srv.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}
