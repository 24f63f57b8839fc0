//! Health checks that need a process stalled or a clock moved (issue #22), on real
//! clusters: `SLOW_OPS` while a daemon is stopped (SIGSTOP) under writes, and
//! `MON_CLOCK_SKEW` for a monitor run with a clock 2 s ahead (Debian's libfaketime).
//! Each check names the right process, shows in `spindle health`, `status --json` and the
//! metrics, and clears once the cause is gone.

mod common;

use common::{content, run_ok, spindle, Cluster};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const POOL: &str = "default";

/// The body of `GET http://addr/metrics`.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{addr}: {head}");
    body.to_string()
}

/// The value of the first sample line starting with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The health check named `name` in a status document, if raised.
fn check<'a>(status: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    status["health"]["checks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) of a daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// A daemon stopped with SIGSTOP (its monitor session long enough not to be marked down)
/// leaves the writes of the groups it holds a copy of waiting at their primaries: after
/// the complaint time (`--slow-op-ms 300`) `SLOW_OPS` names those primaries, never the
/// stopped daemon, in Ceph's words; the daemons' metrics count them. Once continued, every
/// write completes and the check clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_held_up_by_a_stopped_daemon_raise_slow_ops_until_it_continues() {
    let c = Cluster::start_with(
        "slowops",
        3,
        16,
        &["--slow-op-ms", "300", "--down-after-ms", "30000"],
    );
    let client = c.client().await;
    let status = c.status();
    assert!(check(&status, "SLOW_OPS").is_none(), "{status}");
    let stopped = Cluster::pid(&c.osd_dir(0)).expect("osd.0 pid");
    signal(stopped, libc::SIGSTOP);
    // Writes to every group: with 3 daemons and 3 copies, osd.0 holds a copy of each, so
    // the writes primaried elsewhere wait for it.
    let writes: Vec<_> = (0..16u64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .write_full(POOL, &format!("slow-{i}"), content("slow", i, 4096))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (message, named) = loop {
        let s = c.status();
        if let Some(chk) = check(&s, "SLOW_OPS") {
            let msg = chk["message"].as_str().unwrap_or_default().to_string();
            assert_eq!(chk["severity"], "HEALTH_WARN", "{chk}");
            let named: Vec<u32> = (1..3)
                .filter(|i| msg.contains(&format!("osd.{i}")))
                .collect();
            break (msg, named);
        }
        assert!(
            Instant::now() < deadline,
            "no SLOW_OPS while osd.0 is stopped: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("SLOW_OPS: {message}");
    assert!(
        message.contains(" slow ops, oldest one blocked for ")
            && message.ends_with(" have slow ops."),
        "{message}"
    );
    assert!(
        !message.contains("osd.0"),
        "the stopped daemon reports nothing: {message}"
    );
    assert!(!named.is_empty(), "no primary named: {message}");
    let health = run_ok(spindle().args(["health", "--dir"]).arg(&c.dir));
    assert!(
        health.starts_with("HEALTH_WARN") && health.contains("SLOW_OPS"),
        "{health}"
    );
    // The named daemon's metrics show them in flight.
    let addr = c.status()["osds"][named[0] as usize]["metrics_addr"]
        .as_str()
        .expect("metrics address")
        .to_string();
    let text = scrape(&addr);
    let now_slow = sample(&text, "spindle_osd_slow_ops{").expect("spindle_osd_slow_ops");
    let oldest = sample(&text, "spindle_osd_slow_op_oldest_seconds{").expect("oldest");
    eprintln!("osd.{}: {now_slow} slow ops, oldest {oldest} s", named[0]);
    assert!(now_slow >= 1.0 && oldest >= 0.3, "{now_slow} {oldest}");

    signal(stopped, libc::SIGCONT);
    for w in writes {
        w.await
            .expect("write task")
            .expect("every write completes once osd.0 continues");
    }
    for i in 0..16u64 {
        let got = client.read_full(POOL, &format!("slow-{i}")).await.unwrap();
        assert_eq!(got, content("slow", i, 4096));
    }
    c.wait_for("SLOW_OPS to clear", Duration::from_secs(15), |s| {
        check(s, "SLOW_OPS").is_none()
    });
    let finished = sample(&scrape(&addr), "spindle_osd_slow_ops_finished_total{")
        .expect("spindle_osd_slow_ops_finished_total");
    assert!(finished >= 1.0, "{finished}");
    let text = scrape(&addr);
    assert_eq!(sample(&text, "spindle_osd_slow_ops{"), Some(0.0));
}

/// libfaketime's multi-threaded library, from Debian's `faketime` package.
fn libfaketime() -> std::path::PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    found.expect("libfaketimeMT.so.1 (Debian's faketime package; scripts/setup.sh installs it)")
}

/// Restarts monitor `id` with its clock `offset` ahead (libfaketime; empty: the real one).
fn restart_mon(c: &Cluster, id: u64, offset: &str) {
    c.kill_mon_id(id);
    let mut up = spindle();
    up.arg("up")
        .arg("--dir")
        .arg(&c.dir)
        .args(["--wait-seconds", "90"]);
    if !offset.is_empty() {
        up.env("LD_PRELOAD", libfaketime())
            .env("FAKETIME", offset)
            // Timers and Raft run on the monotonic clock: only the wall clock moves.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_NO_CACHE", "1");
    }
    run_ok(&mut up);
}

/// A monitor restarted with its wall clock 2 s ahead: within seconds `MON_CLOCK_SKEW`
/// names it (and only it), `status --json` and the leader's metrics give its offset within
/// the measurement's round trip, and the cluster still works; restarted with the true
/// clock, the check clears.
#[test]
fn a_monitor_with_a_skewed_clock_raises_mon_clock_skew_until_fixed() {
    let c = Cluster::start_with("clockskew", 3, 16, &["--mons", "3"]);
    let leader_of = |s: &serde_json::Value| -> Option<String> {
        let map = s["mon_metrics_addrs"].as_object()?;
        // The leader exports the cluster metrics: the monitor whose scrape has them.
        map.values()
            .filter_map(|a| a.as_str())
            .find(|a| scrape(a).contains("spindle_health_status "))
            .map(str::to_string)
    };
    c.wait_for(
        "every monitor's clock sample",
        Duration::from_secs(20),
        |s| s["mon_clock"].as_object().is_some_and(|m| m.len() == 3),
    );
    let s = c.status();
    assert!(check(&s, "MON_CLOCK_SKEW").is_none(), "{s}");
    for (id, clock) in s["mon_clock"].as_object().unwrap() {
        let skew = clock["skew_ms"].as_i64().unwrap();
        assert!(skew.abs() < 50, "mon.{id}: {clock}");
    }

    restart_mon(&c, 2, "+2s");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (s, message) = loop {
        let s = c.status();
        if let Some(chk) = check(&s, "MON_CLOCK_SKEW") {
            let m = chk["message"].as_str().unwrap_or_default().to_string();
            if m.contains("mon.2") {
                break (s, m);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no MON_CLOCK_SKEW for mon.2: {s}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!("MON_CLOCK_SKEW: {message}");
    // mon.2 came back as a follower: the leader measures against it, so mon.2 alone is off.
    assert!(
        !message.contains("mon.0") && !message.contains("mon.1"),
        "{message}"
    );
    let clock = &s["mon_clock"]["2"];
    let (skew, rtt) = (
        clock["skew_ms"].as_i64().unwrap(),
        clock["rtt_ms"].as_i64().unwrap(),
    );
    assert!((skew - 2000).abs() <= 200 + rtt, "{clock}");
    let health = run_ok(spindle().args(["health", "--dir"]).arg(&c.dir));
    assert!(health.contains("MON_CLOCK_SKEW"), "{health}");
    // The leader's metrics show it from their next refresh (every 2 s).
    let leader = leader_of(&s).expect("a leader with metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&leader);
        let exported = sample(&text, "spindle_mon_clock_skew_seconds{mon=\"2\"}")
            .expect("spindle_mon_clock_skew_seconds of mon.2");
        if (exported - 2.0).abs() < 0.5 {
            break;
        }
        assert!(Instant::now() < deadline, "exported skew {exported}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The cluster works meanwhile: a map change through the monitors.
    run_ok(
        spindle()
            .args(["pool", "create", "skewed", "--pg-count", "8", "--dir"])
            .arg(&c.dir),
    );

    restart_mon(&c, 2, "");
    c.wait_for("MON_CLOCK_SKEW to clear", Duration::from_secs(30), |s| {
        check(s, "MON_CLOCK_SKEW").is_none()
            && s["mon_clock"]["2"]["skew_ms"]
                .as_i64()
                .is_some_and(|v| v.abs() < 50)
    });
}
