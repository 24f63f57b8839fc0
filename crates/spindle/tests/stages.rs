//! `spindle bench stages` end to end: stage clocks on in every process of a real cluster
//! (monitor, daemons, `spindle nbd`) and fio driving reads; the breakdown it reports must be
//! consistent with how the stages nest.

mod common;

use common::{spindle, unique_dir};

#[test]
fn stage_clocks_see_every_process_and_nest() {
    let dir = unique_dir("stages");
    let out = spindle()
        .args(["bench", "stages", "--dir"])
        .arg(&dir)
        .args([
            "--size",
            "64M",
            "--runtime-seconds",
            "1",
            "--ramp-seconds",
            "0",
            "--point",
            "4k:randread:1",
            "--json",
        ])
        .output()
        .expect("spawn spindle");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "bench stages failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let point = &v["points"][0];
    assert!(point["ios"].as_u64().unwrap() > 100, "{point}");
    let stage = |side: &str, name: &str| -> (f64, f64) {
        let row = point["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["side"] == side && r["stage"] == name)
            .unwrap_or_else(|| panic!("no {side} {name} in {point}"));
        (
            row["per_io"].as_f64().unwrap(),
            row["mean_us"].as_f64().unwrap(),
        )
    };
    // Once per fio read in the NBD server; at most once per read in the client and the
    // daemons (fio's 4k reads each fall inside one object; the block layer's cache answers
    // some of them without a round trip).
    let device = stage("nbd", "nbd.device_read");
    assert!((0.95..=1.05).contains(&device.0), "{device:?}");
    let rpc = stage("nbd", "client.read_rpc");
    let request = stage("osd", "osd.request");
    let store = stage("osd", "osd.store_read");
    for (what, s) in [("rpc", rpc), ("request", request), ("store", store)] {
        assert!((0.3..=1.05).contains(&s.0), "{what}: {s:?}");
        assert!(s.1 > 0.0, "{what}: {s:?}");
    }
    // Nesting, as time per fio I/O: the device calls contain the client's round trips,
    // which contain the daemons' handling, which contains their store reads.
    let per_io = |s: (f64, f64)| s.0 * s.1;
    assert!(
        per_io(device) >= per_io(rpc),
        "device {device:?} < rpc {rpc:?}"
    );
    assert!(
        per_io(rpc) >= per_io(request),
        "rpc {rpc:?} < request {request:?}"
    );
    assert!(
        per_io(request) >= per_io(store),
        "request {request:?} < store {store:?}"
    );
    // fio's latency contains the NBD server's part.
    let clat = point["fio"]["clat_mean_us"].as_f64().unwrap();
    assert!(
        clat >= per_io(device),
        "fio clat {clat} < device {device:?}"
    );
}

/// The bench removes its scratch directory: a `--dir` that holds anything else is refused
/// and left as it was.
#[test]
fn a_directory_that_is_not_its_scratch_is_refused() {
    let dir = unique_dir("stages-refuse");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keep"), b"data").unwrap();
    let out = spindle()
        .args(["bench", "stages", "--dir"])
        .arg(&dir)
        .output()
        .expect("spawn spindle");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a scratch directory"));
    assert_eq!(std::fs::read(dir.join("keep")).unwrap(), b"data");
    let _ = std::fs::remove_dir_all(&dir);
}
