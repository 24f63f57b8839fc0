//! Prometheus metrics of every process (issue #22), against a real cluster, a real
//! `spindle nbd` and real fio: every endpoint listed by `spindle status --json` answers,
//! `promtool check metrics` accepts each, counters only grow across a workload, and the
//! figures agree with fio's own counts, with each other (NBD requests, image operations,
//! daemon operations) and with `spindle status --json`; the leader's cluster metrics show
//! a stopped daemon and the health warning within 10 s.

mod common;

use common::{run_ok, spindle, Cluster, NbdProc};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The body of `GET http://addr/path`.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{addr}{path}: {head}");
    body.to_string()
}

/// One sample: name and labels.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    name: String,
    labels: BTreeMap<String, String>,
}

/// Parses the text format: every sample line, labels sorted.
fn parse(text: &str) -> BTreeMap<Key, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').expect("closing brace");
                let labels = inner
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once('=').expect("label=value");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (name.to_string(), labels)
            }
        };
        out.insert(Key { name, labels }, value);
    }
    out
}

/// Sum of the samples named `name` whose labels include `with`.
fn sum(m: &BTreeMap<Key, f64>, name: &str, with: &[(&str, &str)]) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            k.name == name
                && with
                    .iter()
                    .all(|(l, v)| k.labels.get(*l).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

fn has(m: &BTreeMap<Key, f64>, name: &str) -> bool {
    m.keys().any(|k| k.name == name)
}

/// `promtool check metrics` (from Debian's `prometheus`, installed by scripts/setup.sh).
fn promtool_check(what: &str, text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): scripts/setup.sh installs Debian's prometheus")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused {what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// fio over NBD: `ios` operations of `rw` (4 KiB, queue depth 8); the number it did.
fn fio(uri: &str, rw: &str, ios: u64) -> u64 {
    let out = Command::new("fio")
        .args([
            "--name=metrics",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            "--bs=4k",
            "--iodepth=8",
            "--size=64m",
            &format!("--number_ios={ios}"),
            "--randseed=22",
            "--output-format=json",
        ])
        .output()
        .expect("fio (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fio may print notes before its JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find("\n{").map_or(0, |i| i + 1)..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON ({e}): {text}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let dir = if rw.contains("read") { "read" } else { "write" };
    job[dir]["total_ios"].as_u64().expect("total_ios")
}

/// Every metrics endpoint the cluster lists, plus the NBD server's: (name, address).
fn endpoints(c: &Cluster, nbd: &NbdProc) -> Vec<(String, String)> {
    let s = c.status();
    let mut out: Vec<(String, String)> = s["mon_metrics_addrs"]
        .as_object()
        .expect("monitors' metrics addresses")
        .iter()
        .map(|(id, a)| (format!("mon.{id}"), a.as_str().unwrap().to_string()))
        .collect();
    for o in s["osds"].as_array().unwrap() {
        out.push((
            format!("osd.{}", o["id"]),
            o["metrics_addr"]
                .as_str()
                .expect("osd metrics addr")
                .to_string(),
        ));
    }
    // The NBD server registered itself (`nbd.HOST.PID`) at the address its banner names.
    let services = s["service_metrics_addrs"].as_object().expect("services");
    let banner = nbd
        .metrics_addr
        .clone()
        .expect("spindle nbd serves metrics");
    assert_eq!(services.len(), 1, "{services:?}");
    let (name, addr) = services.iter().next().unwrap();
    assert!(name.starts_with("nbd."), "{name}");
    assert_eq!(addr.as_str(), Some(banner.as_str()));
    out.push(("nbd".into(), banner));
    out
}

type Scrape = BTreeMap<String, BTreeMap<Key, f64>>;

fn scrape(eps: &[(String, String)]) -> Scrape {
    eps.iter()
        .map(|(name, addr)| (name.clone(), parse(&http_get(addr, "/metrics"))))
        .collect()
}

#[test]
fn every_process_serves_metrics_that_agree_with_fio_and_status() {
    let c = Cluster::start("metrics", 3, 16);
    run_ok(
        spindle()
            .args(["image", "create", "m", "--size", "256M", "--dir"])
            .arg(&c.dir),
    );
    let nbd = NbdProc::start(&c);
    // Daemons report their address with their heartbeats, monitors register theirs.
    c.wait_for("every metrics address", Duration::from_secs(15), |s| {
        s["mon_metrics_addrs"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
            && s["service_metrics_addrs"]
                .as_object()
                .is_some_and(|m| !m.is_empty())
            && s["osds"]
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o["metrics_addr"].is_string())
    });
    let eps = endpoints(&c, &nbd);
    assert_eq!(eps.len(), 1 + 3 + 1, "{eps:?}");
    for (name, addr) in &eps {
        promtool_check(name, &http_get(addr, "/metrics"));
    }

    let before = scrape(&eps);
    let uri = nbd.uri("m");
    let writes = fio(&uri, "randwrite", 3000);
    let reads = fio(&uri, "randread", 1000);
    assert_eq!((writes, reads), (3000, 1000));
    // Quiet now: a heartbeat (500 ms) and the leader's status refresh (2 s) pass.
    std::thread::sleep(Duration::from_millis(2500));
    let after = scrape(&eps);

    // Counters and histograms only grow.
    for (ep, m) in &before {
        for (k, v) in m {
            let cumulative = ["_total", "_count", "_sum", "_bucket"]
                .iter()
                .any(|s| k.name.ends_with(s));
            if cumulative {
                let now = after[ep].get(k).copied().unwrap_or(0.0);
                assert!(now >= *v, "{ep}: {k:?} went from {v} to {now}");
            }
        }
    }
    // The Grafana dashboard in the repository asks only for metrics the processes serve.
    let served: std::collections::BTreeSet<String> = after
        .values()
        .flat_map(|m| m.keys().map(|k| k.name.clone()))
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/grafana/spindle-cluster.json"
        ))
        .expect("docs/grafana/spindle-cluster.json"),
    )
    .expect("the dashboard is JSON");
    let mut asked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                // Present only while a check fails (asserted further down).
                let only_when_failing = word == "spindle_health_check";
                if word.starts_with("spindle_") && !only_when_failing {
                    asked += 1;
                    assert!(
                        served.contains(word),
                        "the dashboard's panel {:?} asks for {word}, which no process serves",
                        panel["title"]
                    );
                }
            }
        }
    }
    assert!(asked >= 20, "the dashboard names {asked} metrics");

    let d = |ep: &str, name: &str, with: &[(&str, &str)]| {
        sum(&after[ep], name, with) - sum(&before[ep], name, with)
    };

    // The NBD server counted exactly fio's requests.
    let nbd_writes = d("nbd", "spindle_nbd_requests_total", &[("op", "write")]);
    let nbd_reads = d("nbd", "spindle_nbd_requests_total", &[("op", "read")]);
    assert_eq!((nbd_writes, nbd_reads), (writes as f64, reads as f64));
    assert_eq!(
        d("nbd", "spindle_nbd_payload_bytes_total", &[("op", "write")]),
        (writes * 4096) as f64
    );
    // The image saw the same operations (its "write" kind also counts flushes and
    // trims), with one latency observation each.
    let image = [("pool", "default"), ("image", "m")];
    let img = |name: &str, op: &str| {
        let mut with = image.to_vec();
        with.push(("op", op));
        d("nbd", name, &with)
    };
    let other: f64 = ["flush", "trim", "write_zeroes"]
        .iter()
        .map(|op| d("nbd", "spindle_nbd_requests_total", &[("op", op)]))
        .sum();
    assert_eq!(img("spindle_image_ops_total", "write"), nbd_writes + other);
    assert_eq!(img("spindle_image_ops_total", "read"), nbd_reads);
    assert_eq!(
        img("spindle_image_op_duration_seconds_count", "write"),
        img("spindle_image_ops_total", "write")
    );
    assert_eq!(
        img("spindle_image_bytes_total", "write"),
        (writes * 4096) as f64
    );
    // The daemons (as primaries) served the object operations the image's scheduler
    // issued: within 2% (a retried operation counts twice at a daemon).
    let backend = d(
        "nbd",
        "spindle_image_sched_backend_ops_total",
        &[("image", "m")],
    );
    let osd_names: Vec<&String> = after.keys().filter(|k| k.starts_with("osd.")).collect();
    let osd_ops: f64 = osd_names
        .iter()
        .map(|ep| {
            d(ep, "spindle_osd_ops_total", &[("op", "write")])
                + d(ep, "spindle_osd_ops_total", &[("op", "read")])
        })
        .sum();
    assert!(backend >= 1000.0, "backend operations {backend}");
    assert!(
        (osd_ops - backend).abs() <= backend * 0.02 + 10.0,
        "daemons served {osd_ops} operations, the image issued {backend}"
    );
    let osd_latency_count: f64 = osd_names
        .iter()
        .map(|ep| {
            d(
                ep,
                "spindle_osd_op_duration_seconds_count",
                &[("op", "write")],
            )
        })
        .sum();
    let osd_writes: f64 = osd_names
        .iter()
        .map(|ep| d(ep, "spindle_osd_ops_total", &[("op", "write")]))
        .sum();
    assert_eq!(osd_latency_count, osd_writes);
    let osd_bytes: f64 = osd_names
        .iter()
        .map(|ep| d(ep, "spindle_osd_op_bytes_total", &[("op", "write")]))
        .sum();
    assert!(
        osd_bytes >= (writes * 4096) as f64,
        "daemons received {osd_bytes} bytes of writes"
    );

    // `spindle status --json` shows the same counters (quiet cluster, fresh heartbeats).
    let s = c.status();
    for o in s["osds"].as_array().unwrap() {
        let ep = format!("osd.{}", o["id"]);
        let now = parse(&http_get(o["metrics_addr"].as_str().unwrap(), "/metrics"));
        for (counter, metric) in [
            ("client_ops", "spindle_osd_client_ops_total"),
            ("objects", "spindle_osd_objects"),
            ("transactions", "spindle_osd_transactions_total"),
        ] {
            let status_value = o["counters"][counter].as_f64().expect(counter);
            let metric_value = sum(&now, metric, &[]);
            assert!(
                (metric_value - status_value).abs() <= 0.01 * status_value + 2.0,
                "{ep}: status {counter} {status_value}, metrics {metric} {metric_value}"
            );
        }
    }

    // The leader's view of the cluster.
    let (mon, mon_addr) = eps.iter().find(|(n, _)| n.starts_with("mon.")).unwrap();
    let m = parse(&http_get(mon_addr, "/metrics"));
    assert_eq!(sum(&m, "spindle_mon_leader", &[]), 1.0, "{mon} leads");
    // Healthy (a test machine's full disk may add OSD_NEARFULL: a warning).
    let status = c.status();
    assert!(common::healthy_but_for_disk_usage(&status), "{status}");
    let want = match status["health"]["status"].as_str() {
        Some("HEALTH_OK") => 0.0,
        _ => 1.0,
    };
    assert_eq!(sum(&m, "spindle_health_status", &[]), want);
    assert_eq!(sum(&m, "spindle_cluster_osd_up", &[]), 3.0);
    assert_eq!(
        sum(&m, "spindle_cluster_pgs", &[("state", "clean")]),
        16.0,
        "every group clean"
    );
    assert_eq!(
        sum(
            &m,
            "spindle_pool_pgs",
            &[("pool", "default"), ("state", "clean")]
        ),
        16.0
    );
    assert!(has(&m, "spindle_cluster_used_bytes"));

    // `spindle status --watch` shows the status again and again.
    let mut watch = spindle()
        .args(["status", "--watch", "1", "--dir"])
        .arg(&c.dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.matches("health: ").count() >= 2,
        "status --watch printed: {text}"
    );

    // A daemon stopped: its metrics say so within 10 s, with the health check.
    c.kill_osd(2);
    let stopped = Instant::now();
    loop {
        let m = parse(&http_get(mon_addr, "/metrics"));
        let down = sum(&m, "spindle_cluster_osd_up", &[("osd", "2")]) == 0.0
            && sum(
                &m,
                "spindle_health_check",
                &[("name", "OSD_DOWN"), ("severity", "HEALTH_WARN")],
            ) == 1.0
            && sum(&m, "spindle_health_status", &[]) == 1.0;
        if down {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "the leader's metrics did not show osd.2 down within 10 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "osd.2 down in the leader's metrics after {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    let text = run_ok(spindle().args(["health", "--dir"]).arg(&c.dir));
    assert!(text.starts_with("HEALTH_WARN\n"), "{text}");
    assert!(
        text.contains("HEALTH_WARN OSD_DOWN: 1 daemon(s) down: osd.2"),
        "{text}"
    );

    // Back: the daemon restarted, health returns to OK (the command and the metrics).
    c.up();
    c.wait_clean();
    let restarted = Instant::now();
    loop {
        let json = run_ok(spindle().args(["health", "--json", "--dir"]).arg(&c.dir));
        let h: serde_json::Value = serde_json::from_str(&json).expect("health JSON");
        let m = parse(&http_get(mon_addr, "/metrics"));
        let want = match h["status"].as_str() {
            Some("HEALTH_OK") => 0.0,
            _ => 1.0,
        };
        if common::healthy_but_for_disk_usage(&serde_json::json!({ "health": h }))
            && sum(&m, "spindle_health_status", &[]) == want
            && sum(&m, "spindle_health_check", &[("name", "OSD_DOWN")]) == 0.0
            && sum(&m, "spindle_cluster_osd_up", &[]) == 3.0
        {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "health did not return to OK: {h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The client library serves its own metrics when its configuration asks
/// (`ClientConfig::metrics_listen`; `SPINDLE_CLIENT_METRICS` for the CLI): its requests
/// by type, errors, bytes and latencies match what the test did exactly, `promtool`
/// accepts them, and the endpoint ends with the client.
#[test]
fn a_client_serves_its_metrics_when_asked() {
    let c = Cluster::start("climetrics", 3, 16);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = rt.block_on(async {
        let mut cfg = c.client_config();
        cfg.metrics_listen = Some("127.0.0.1:0".into());
        let client = spindle_client::Client::connect(cfg).await.expect("connect");
        let addr = client.metrics_addr().expect("an endpoint").to_string();
        for i in 0..50u32 {
            client
                .write_full("default", &format!("c{i}"), vec![i as u8; 4096])
                .await
                .unwrap();
        }
        for i in 0..50u32 {
            assert_eq!(
                client
                    .read_full("default", &format!("c{i}"))
                    .await
                    .unwrap()
                    .len(),
                4096
            );
        }
        assert!(client.read_full("default", "missing").await.is_err());
        let text = http_get(&addr, "/metrics");
        promtool_check("the client's metrics", &text);
        let m = parse(&text);
        let w = [("op", "write")];
        let r = [("op", "read")];
        assert_eq!(sum(&m, "spindle_client_requests_total", &w), 50.0, "{text}");
        assert_eq!(sum(&m, "spindle_client_requests_total", &r), 51.0, "{text}");
        assert_eq!(sum(&m, "spindle_client_request_errors_total", &r), 1.0);
        assert_eq!(sum(&m, "spindle_client_request_errors_total", &w), 0.0);
        assert_eq!(
            sum(&m, "spindle_client_sent_bytes_total", &w),
            50.0 * 4096.0
        );
        assert_eq!(
            sum(&m, "spindle_client_received_bytes_total", &r),
            50.0 * 4096.0
        );
        assert_eq!(
            sum(&m, "spindle_client_request_duration_seconds_count", &w),
            50.0
        );
        assert!(sum(&m, "spindle_client_request_duration_seconds_sum", &w) > 0.0);
        assert!(sum(&m, "spindle_client_map_epoch", &[]) >= 1.0);
        assert!(sum(&m, "spindle_client_osd_connections", &[]) >= 1.0);
        // `status --json` lists it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = c.status();
            let listed = s["service_metrics_addrs"].as_object().is_some_and(|m| {
                m.iter()
                    .any(|(k, v)| k.starts_with("client.") && v == &addr)
            });
            if listed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the client's metrics are not listed: {s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        drop(client);
        addr
    });
    // The endpoint went with the client.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "{addr} still serves after the client is gone"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(rt);
    // The CLI's clients, when asked.
    let out = spindle()
        .args(["ls", "--dir"])
        .arg(&c.dir)
        .env("SPINDLE_CLIENT_METRICS", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("client metrics: http://127.0.0.1:"), "{err}");
}
