//! A cluster from a configuration file with three hosts (each started by its own `spindle
//! host start --host hN`, as each machine would), all on 127.0.0.1 here: the CRUSH
//! hierarchy is root -> host -> daemon and every copy (and every erasure-coded shard) of a
//! group is on a different host; a whole host lost (its monitor and daemons SIGKILLed)
//! leaves the data readable and writable; `osd add --host` puts a daemon in a host.
//! (Hosts as network namespaces, with links cut, are the next step.)

mod common;

use common::{content, run_ok, spindle, unique_dir, POOL};
use spindle_client::{Client, ClientConfig};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const HOSTS: [&str; 3] = ["h1", "h2", "h3"];

struct Hosts {
    dir: PathBuf,
    config: PathBuf,
    mons: String,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in HOSTS {
            let _ = spindle()
                .args(["host", "stop", "--host", h, "--config"])
                .arg(&self.config)
                .output();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("keeping {} for inspection", self.dir.display());
        }
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let l: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    l.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// `out_after_ms`: 0 never marks a down daemon out.
fn write_config(dir: &Path, out_after_ms: u64) -> (PathBuf, String) {
    let ports = free_ports(9);
    let mut text = format!(
        "cluster_id = \"0123456789abcdef\"\npg_count = 16\nout_after_ms = {out_after_ms}\nkeyring = \"{}\"\n",
        dir.join("keyring").display()
    );
    let mut mons = Vec::new();
    for (i, h) in HOSTS.iter().enumerate() {
        let addr = format!("127.0.0.1:{}", ports[i]);
        text.push_str(&format!(
            "[[mon]]\nid = {i}\nhost = \"{h}\"\naddr = \"{addr}\"\ndir = \"{}\"\n",
            dir.join(format!("{h}/mon.{i}")).display()
        ));
        mons.push(addr);
    }
    for id in 0..6 {
        let h = HOSTS[id / 2];
        text.push_str(&format!(
            "[[osd]]\nid = {id}\nhost = \"{h}\"\naddr = \"127.0.0.1:{}\"\ndir = \"{}\"\n",
            ports[3 + id],
            dir.join(format!("{h}/osd.{id}")).display()
        ));
    }
    let config = dir.join("cluster.toml");
    std::fs::write(&config, text).unwrap();
    // The cluster's keys, made once and read by every host.
    run_ok(
        spindle()
            .args(["host", "keygen", "--config"])
            .arg(&config)
            .arg("--out")
            .arg(dir.join("keyring")),
    );
    (config, mons.join(","))
}

fn start_host(c: &Hosts, h: &str) -> String {
    run_ok(
        spindle()
            .args(["host", "start", "--host", h, "--config"])
            .arg(&c.config),
    )
}

async fn wait_clean(client: &Client) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = client.admin(&spindle_mon::Admin::status()).await.unwrap();
        let up = s.osds.iter().filter(|o| o.up).count();
        if up == s.osds.len() && spindle_mon::reply::unsettled_pgs(&s.pgs) == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "not clean: {:?}", s.pgs);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every group of `pool` has its copies on `want` different hosts.
fn copies_on_distinct_hosts(client: &Client, pool: &str, want: usize) {
    let map = client.map();
    let ids: Vec<u32> = map.osds.keys().copied().collect();
    let layout = spindle_map::embedded_layout(&map.crush, &ids).expect("Spindle's own hierarchy");
    let host_of = |o: u32| layout.iter().find(|d| d.id == o).unwrap().host.clone();
    let view = spindle_map::MapView::decode(&map.encode()).unwrap();
    let p = map.pool_by_name(pool).unwrap();
    for pg in 0..p.pg_count {
        let m = view.placement.pg(p.id, pg).unwrap();
        let daemons: Vec<u32> = if m.shards.is_empty() {
            m.up.clone()
        } else {
            m.shards.iter().flatten().copied().collect()
        };
        let hosts: BTreeSet<String> = daemons.iter().map(|&o| host_of(o)).collect();
        assert_eq!(daemons.len(), want, "{pool} pg {pg}: {daemons:?}");
        assert_eq!(
            hosts.len(),
            want,
            "{pool} pg {pg}: {daemons:?} on {hosts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_from_a_configuration_file_keep_copies_apart_and_survive_a_host() {
    let dir = unique_dir("hosts");
    std::fs::create_dir_all(&dir).unwrap();
    let (config, mons) = write_config(&dir, 0);
    let c = Hosts { dir, config, mons };
    let check = run_ok(spindle().args(["host", "check", "--config"]).arg(&c.config));
    assert!(
        check.contains("3 copies (min 2) on distinct hosts"),
        "{check}"
    );
    for h in HOSTS {
        let out = start_host(&c, h);
        assert!(out.contains("mon."), "{out}");
    }
    let mut cfg = ClientConfig::new(c.mons.clone())
        .with_keyring(&c.dir.join("keyring"), "client.admin")
        .unwrap();
    assert!(cfg.auth.is_some(), "the keyring was made");
    cfg.op_timeout_ms = 60_000;
    let client = Client::connect(cfg).await.unwrap();
    wait_clean(&client).await;
    let status = client.admin(&spindle_mon::Admin::status()).await.unwrap();
    for o in &status.osds {
        assert_eq!(o.host.as_deref(), Some(HOSTS[o.id as usize / 2]), "{o:?}");
    }
    let out = run_ok(
        spindle()
            .env("SPINDLE_KEYRING", c.dir.join("keyring"))
            .args(["status", "--mon"])
            .arg(&c.mons),
    );
    assert!(out.contains("mons: 3 (leader mon."), "{out}");
    copies_on_distinct_hosts(&client, POOL, 3);
    client
        .admin(&spindle_mon::Admin::pool_create_ec(
            "ec", 2, 1, 2, 0, 4096, 16,
        ))
        .await
        .unwrap();
    wait_clean(&client).await;
    copies_on_distinct_hosts(&client, "ec", 3);
    for i in 0..20u64 {
        client
            .write_full(POOL, &format!("r{i}"), content("r", i, 5000))
            .await
            .unwrap();
        client
            .write_full("ec", &format!("e{i}"), content("e", i, 9000))
            .await
            .unwrap();
    }

    // The host of the leader monitor is lost: its monitor and both its daemons.
    let leader = client
        .admin(&spindle_mon::Admin::mon_ls())
        .await
        .unwrap()
        .leader
        .unwrap() as usize;
    let lost = HOSTS[leader];
    for d in [
        format!("{lost}/mon.{leader}"),
        format!("{lost}/osd.{}", 2 * leader),
        format!("{lost}/osd.{}", 2 * leader + 1),
    ] {
        let pid: i32 = std::fs::read_to_string(c.dir.join(d).join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: kill(2) of a daemon this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let started = Instant::now();
    for i in 0..20u64 {
        assert_eq!(
            client.read_full(POOL, &format!("r{i}")).await.unwrap(),
            content("r", i, 5000)
        );
        assert_eq!(
            client.read_full("ec", &format!("e{i}")).await.unwrap(),
            content("e", i, 9000)
        );
        client
            .write_full(POOL, &format!("r{i}"), content("r", i + 100, 5000))
            .await
            .unwrap();
    }
    eprintln!(
        "reads and writes with host {lost} (the leader monitor's) lost took {:?}",
        started.elapsed()
    );
    // The two monitors left mark the lost daemons down.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = client.admin(&spindle_mon::Admin::status()).await.unwrap();
        if s.osds.iter().filter(|o| o.up).count() == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", s.osds);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // It comes back; a new daemon joins host h1.
    start_host(&c, lost);
    wait_clean(&client).await;
    let out = run_ok(
        spindle()
            .env("SPINDLE_KEYRING", c.dir.join("keyring"))
            .args(["osd", "add", "--host", "h1", "--no-start", "--mon"])
            .arg(&c.mons),
    );
    assert!(
        out.contains("added osd.6") && out.contains("on host h1") && out.contains("[osd.6]"),
        "{out}"
    );
    let map = client.map();
    let ids: Vec<u32> = map.osds.keys().copied().collect();
    let layout = spindle_map::embedded_layout(&map.crush, &ids).unwrap();
    let h1: Vec<u32> = layout
        .iter()
        .filter(|d| d.host == "h1")
        .map(|d| d.id)
        .collect();
    assert_eq!(h1, vec![0, 1, 6]);
    for i in 0..20u64 {
        assert_eq!(
            client.read_full(POOL, &format!("r{i}")).await.unwrap(),
            content("r", i + 100, 5000)
        );
    }
    // A bad host name is refused with a clear error.
    let out = spindle()
        .env("SPINDLE_KEYRING", c.dir.join("keyring"))
        .args(["osd", "add", "--host", "9bad", "--no-start", "--mon"])
        .arg(&c.mons)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad host name"));
}

fn kill_daemon(c: &Hosts, daemon_dir: &str) {
    let pid: i32 = std::fs::read_to_string(c.dir.join(daemon_dir).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) of a daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// A whole host lost past the out interval: CRUSH (`chooseleaf indep` over three hosts)
/// then moves surviving shards to other positions of some groups while the up set, in
/// order, stays the same. Such a map used to keep the group's interval (the identity was
/// the up set without positions): the group did not peer, the moved daemon's copy at its
/// new position stayed empty, and a primary that moved answered "no such object" (NBD:
/// zeros) for objects it held at its old position. Every object must read back
/// byte-identical while the host is out, and after it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_coded_objects_read_back_while_a_host_is_out() {
    let dir = unique_dir("hosts-ec-out");
    std::fs::create_dir_all(&dir).unwrap();
    let (config, mons) = write_config(&dir, 3000);
    let c = Hosts { dir, config, mons };
    for h in HOSTS {
        start_host(&c, h);
    }
    let mut cfg = ClientConfig::new(c.mons.clone())
        .with_keyring(&c.dir.join("keyring"), "client.admin")
        .unwrap();
    cfg.op_timeout_ms = 60_000;
    let client = Client::connect(cfg).await.unwrap();
    wait_clean(&client).await;
    client
        .admin(&spindle_mon::Admin::pool_create_ec(
            "ec", 2, 1, 2, 0, 4096, 16,
        ))
        .await
        .unwrap();
    wait_clean(&client).await;
    const OBJECTS: u64 = 40;
    const SIZE: usize = 256 << 10;
    for i in 0..OBJECTS {
        client
            .write_full("ec", &format!("o{i}"), content("o", i, SIZE))
            .await
            .unwrap();
    }
    let read_all = |when: &'static str| {
        let client = &client;
        async move {
            let mut bad = Vec::new();
            for i in 0..OBJECTS {
                match client.read_full("ec", &format!("o{i}")).await {
                    Ok(d) if d == content("o", i, SIZE) => {}
                    Ok(d) => bad.push(format!("o{i}: {} bytes, wrong data", d.len())),
                    Err(e) => bad.push(format!("o{i}: {e}")),
                }
            }
            assert!(
                bad.is_empty(),
                "{when}: {} of {OBJECTS} bad: {bad:?}",
                bad.len()
            );
        }
    };
    read_all("clean").await;
    // Every group's primary counts the objects of its own copy.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = client.admin(&spindle_mon::Admin::status()).await.unwrap();
        let n = s.pools.iter().find(|p| p.name == "ec").unwrap().objects;
        if n == OBJECTS {
            break;
        }
        assert!(Instant::now() < deadline, "clean pool counts {n} objects");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Host h3 is lost (its monitor and daemons; two monitors keep the quorum), and its
    // daemons are marked out.
    for d in ["h3/mon.2", "h3/osd.4", "h3/osd.5"] {
        kill_daemon(&c, d);
    }
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = client.admin(&spindle_mon::Admin::status()).await.unwrap();
        if s.osds.iter().filter(|o| o.in_cluster).count() == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "not marked out: {:?}", s.osds);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("host h3 marked out after {:?}", started.elapsed());
    read_all("host h3 out").await;

    // It returns: every object still reads back.
    start_host(&c, "h3");
    for id in [4, 5] {
        client
            .admin(&spindle_mon::Admin::osd(spindle_mon::OsdVerb::In, id))
            .await
            .unwrap();
    }
    wait_clean(&client).await;
    read_all("host h3 back").await;
}
