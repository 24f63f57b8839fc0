//! The cluster with real processes on 127.0.0.1: replication, daemon crashes (SIGKILL),
//! catch-up from placement-group logs, corruption repair, hostile frames, monitor restart.

mod common;

use common::{
    content, size_log_uniform, verify_all, verify_on_every_replica, walk, write_all, Cluster, POOL,
};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn stop(c: &Cluster) {
    common::run_ok(common::spindle().arg("down").arg("--dir").arg(&c.dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_survive_a_daemon_crash_and_it_catches_up_from_the_logs() {
    let c = Cluster::start("survive", 3, 32);
    let client = c.client().await;
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut objects = BTreeMap::new();
    for i in 0..1000 {
        objects.insert(
            format!("obj-{i}"),
            (0u64, size_log_uniform(&mut rng, 8 << 20)),
        );
    }
    write_all(&client, &objects).await;
    verify_all(&client, &objects).await;
    assert_eq!(client.list(POOL).await.unwrap().len(), 1000);

    c.kill_osd(1);
    // Every object still reads back (the client retries until the map marks osd.1 down).
    verify_all(&client, &objects).await;
    c.wait_osd_up(1, false);
    // New writes succeed with one copy down: overwrite a tenth, add a few.
    let mut changed = BTreeMap::new();
    for i in (0..1000).step_by(10) {
        changed.insert(
            format!("obj-{i}"),
            (1u64, size_log_uniform(&mut rng, 1 << 20)),
        );
    }
    for i in 1000..1050 {
        changed.insert(
            format!("obj-{i}"),
            (1u64, size_log_uniform(&mut rng, 1 << 20)),
        );
    }
    write_all(&client, &changed).await;
    objects.extend(changed);
    verify_all(&client, &objects).await;
    let s = c.status();
    assert!(s["pgs"]["degraded"].as_u64().unwrap() > 0, "{s}");

    c.start_osd(1);
    c.wait_clean();
    verify_all(&client, &objects).await;
    // Catch-up came from the PG logs: objects were recovered, nothing was backfilled.
    let s = c.status();
    let sum = |k: &str| -> u64 {
        s["osds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["counters"][k].as_u64().unwrap_or(0))
            .sum()
    };
    assert!(sum("log_recoveries") > 0, "no log-based catch-up: {s}");
    assert!(sum("recovered_objects") >= 150, "too little recovered: {s}");
    assert_eq!(sum("backfills"), 0, "a backfill happened: {s}");
    drop(client);
    stop(&c);
    verify_on_every_replica(&c, &objects, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_repeated_sigkill_under_load() {
    let c = Cluster::start("killload", 3, 32);
    let client = c.client().await;
    // Each writer owns 20 names and writes them in turn: per name the order is known.
    let acked: Arc<Mutex<BTreeMap<String, (u64, usize)>>> = Default::default();
    let stop_flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let client = client.clone();
        let acked = acked.clone();
        let stop_flag = stop_flag.clone();
        writers.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w + 1);
            let mut generation = 0u64;
            while !stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
                generation += 1;
                let name = format!("w{w}-{}", generation % 20);
                let len = size_log_uniform(&mut rng, 256 << 10);
                client
                    .write_full(POOL, &name, content(&name, generation, len))
                    .await
                    .unwrap_or_else(|e| panic!("write {name} not acknowledged: {e}"));
                acked.lock().unwrap().insert(name, (generation, len));
            }
        }));
    }
    let mut rng = 0xdead_beef_u64;
    for round in 0..6 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(300 + rng % 1200)).await;
        let victim = (rng % 3) as u32;
        eprintln!("round {round}: SIGKILL osd.{victim}");
        c.kill_osd(victim);
        tokio::time::sleep(Duration::from_millis(rng % 2500)).await;
        c.start_osd(victim);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_flag.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    c.wait_clean();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 100, "too few writes: {}", acked.len());
    verify_all(&client, &acked).await;
    drop(client);
    stop(&c);
    verify_on_every_replica(&c, &acked, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_copy_is_detected_served_from_a_replica_and_repaired() {
    let c = Cluster::start("corrupt", 3, 32);
    let client = c.client().await;
    let name = "victim";
    let data = content(name, 7, 1 << 20);
    client.write_full(POOL, name, data.clone()).await.unwrap();
    let map = client.map();
    let pg = spindle_map::object_pg(name, 32);
    let placement = spindle_map::Placement::compute(&map);
    let primary = placement.pg(1, pg).unwrap().primary().unwrap();
    // The only object of the cluster: flip a byte in every data file of the primary.
    let objects_dir = c.osd_dir(primary).join("store").join("objects");
    let mut flipped = 0;
    for entry in walk(&objects_dir) {
        let mut bytes = std::fs::read(&entry).unwrap();
        if bytes.len() > 5000 {
            bytes[4321] ^= 0x5a;
            std::fs::write(&entry, &bytes).unwrap();
            flipped += 1;
        }
    }
    assert!(
        flipped > 0,
        "no data file found under {}",
        objects_dir.display()
    );
    let got = client.read_full(POOL, name).await.unwrap();
    assert!(got == data, "corrupt data was served");
    c.wait_for("corruption reported", Duration::from_secs(10), |s| {
        s["osds"][primary as usize]["counters"]["corruptions_repaired"] == 1
    });
    let log = std::fs::read_to_string(c.osd_dir(primary).join("log")).unwrap();
    assert!(log.contains("checksum mismatch"), "corruption not logged");
    // The local copy was rewritten: the next read is served locally without repair.
    let again = client.read_full(POOL, name).await.unwrap();
    assert!(again == data);
    let s = c.status();
    assert_eq!(
        s["osds"][primary as usize]["counters"]["corruptions_repaired"],
        1
    );
}

fn frame(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    spindle_proto::encode_frame(kind, 1, 0, payload, &mut out);
    out
}

/// Sends `bytes`, then reads until the peer closes (or 3 s pass); returns what came back.
fn exchange(addr: &str, bytes: &[u8], half_close: bool) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn decode_all(bytes: &[u8]) -> Vec<spindle_proto::Msg> {
    let mut d = spindle_proto::FrameDecoder::new(64 << 20);
    d.push(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = d.next_frame() {
        out.push(spindle_proto::Msg::decode(f.kind, &f.payload).expect("reply decodes"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_and_oversized_frames_get_errors_and_daemons_stay_up() {
    // The frame layer's answers to bad bytes; without authentication, so that a whole
    // frame whose body does not decode reaches the message layer (with authentication
    // the first frame must be a hello: `tests/auth.rs`).
    let c = Cluster::start_with("garbage", 3, 8, &["--no-auth"]);
    assert!(!c.dir.join("keyring").exists());
    let client = c.client().await;
    client
        .write_full(POOL, "before", b"x".to_vec())
        .await
        .unwrap();
    let map = client.map();
    let targets = vec![c.mon_addr(), map.osds[&0].addr.clone()];
    for addr in &targets {
        // Garbage: an error frame comes back, then the connection closes.
        let reply = decode_all(&exchange(addr, &[0xAB; 1000], false));
        assert!(
            matches!(reply.first(), Some(spindle_proto::Msg::Error { .. })),
            "{addr}: no error for garbage: {reply:?}"
        );
        // Oversized: a valid header announcing 1 GiB.
        let mut big = frame(4, &[]);
        big[28..32].copy_from_slice(&(1u32 << 30).to_le_bytes());
        let crc = spindle_ec::crc32c::crc32c(&big[..36]);
        big[36..40].copy_from_slice(&crc.to_le_bytes());
        let reply = decode_all(&exchange(addr, &big, false));
        assert!(
            matches!(reply.first(), Some(spindle_proto::Msg::Error { message, .. }) if message.contains("too large") || message.contains("exceeds") || message.contains("large")),
            "{addr}: no error for an oversized frame: {reply:?}"
        );
        // Truncated: half a frame, then end of stream.
        let whole = frame(4, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let reply = decode_all(&exchange(addr, &whole[..45], true));
        assert!(
            matches!(reply.first(), Some(spindle_proto::Msg::Error { .. })),
            "{addr}: no error for a truncated frame: {reply:?}"
        );
        // A whole frame with a body that does not decode: error reply, connection lives on.
        let mut bytes = frame(20, &[0xff; 7]);
        bytes.extend(frame(
            4,
            &spindle_proto::Msg::GetMap {
                have_epoch: 0,
                subscribe: false,
            }
            .encode(),
        ));
        let reply = decode_all(&exchange(addr, &bytes, true));
        assert!(
            matches!(
                reply.first(),
                Some(spindle_proto::Msg::Error {
                    code: spindle_proto::ErrorCode::Invalid,
                    ..
                })
            ),
            "{addr}: {reply:?}"
        );
        assert_eq!(
            reply.len(),
            2,
            "{addr}: the connection did not carry on: {reply:?}"
        );
    }
    // Everyone is still up and serving.
    assert_eq!(client.read_full(POOL, "before").await.unwrap(), b"x");
    client
        .write_full(POOL, "after", b"y".to_vec())
        .await
        .unwrap();
    let s = c.status();
    assert!(
        s["osds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["up"] == true),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_restart_keeps_the_map_and_clients_carry_on() {
    let c = Cluster::start("monrestart", 3, 16);
    let client = c.client().await;
    common::run_ok(
        common::spindle()
            .args([
                "pool",
                "create",
                "extra",
                "--size",
                "2",
                "--pg-count",
                "8",
                "--dir",
            ])
            .arg(&c.dir),
    );
    for i in 0..20 {
        client
            .write_full(POOL, &format!("m{i}"), content("m", i, 1000 + i as usize))
            .await
            .unwrap();
    }
    c.wait_clean();
    let before = c.status();
    c.kill_mon();
    // Clients keep working with the map they have.
    for i in 0..20 {
        let got = client.read_full(POOL, &format!("m{i}")).await.unwrap();
        assert_eq!(got, content("m", i, 1000 + i as usize));
    }
    c.up();
    let after = c.status();
    assert_eq!(after["epoch"], before["epoch"], "{before}\n{after}");
    assert_eq!(after["pools"].as_array().unwrap().len(), 2);
    for key in ["id", "name", "size", "min_size", "pg_count"] {
        for p in 0..2 {
            assert_eq!(after["pools"][p][key], before["pools"][p][key]);
        }
    }
    for o in 0..3 {
        for key in ["id", "addr", "pid", "up", "in"] {
            assert_eq!(after["osds"][o][key], before["osds"][o][key]);
        }
    }
    for i in 20..40 {
        client
            .write_full(POOL, &format!("m{i}"), content("m", i, 1000 + i as usize))
            .await
            .unwrap();
    }
    assert_eq!(client.list(POOL).await.unwrap().len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ceph_crush_map_loaded_into_the_cluster_places_like_crushtool() {
    let c = Cluster::start("crushmap", 3, 32);
    let client = c.client().await;
    let dir = &c.dir;
    let text = common::run_ok(
        common::spindle()
            .args(["crush", "get-map", "--dir"])
            .arg(dir),
    );
    assert!(text.contains("rule replicated_rule"), "{text}");
    // Make host-0 three times heavier, compile with Ceph's own tool, load the binary map.
    let changed = text.replacen("item host-0 weight 1.000", "item host-0 weight 3.000", 1);
    assert_ne!(changed, text, "root bucket item not found:\n{text}");
    std::fs::write(dir.join("m.txt"), &changed).unwrap();
    let out = std::process::Command::new("/usr/bin/crushtool")
        .arg("-c")
        .arg(dir.join("m.txt"))
        .arg("-o")
        .arg(dir.join("m.bin"))
        .output()
        .expect("crushtool is installed by scripts/setup.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let epoch_before = c.status()["epoch"].as_u64().unwrap();
    common::run_ok(
        common::spindle()
            .args(["crush", "set-map"])
            .arg(dir.join("m.bin"))
            .arg("--dir")
            .arg(dir),
    );
    assert!(client.wait_for_epoch(epoch_before + 1, 10_000).await);
    let map = client.map();
    let placement = spindle_map::Placement::compute(&map);
    // crushtool's --min-x/--max-x parser takes no negative numbers: check the PGs whose
    // CRUSH input is non-negative (about half of them).
    let mut checked = 0;
    for pg in 0..32 {
        let x = spindle_map::pg_crush_input(1, pg);
        if x < 0 {
            continue;
        }
        checked += 1;
        let out = std::process::Command::new("/usr/bin/crushtool")
            .arg("-i")
            .arg(dir.join("m.bin"))
            .args(["--test", "--rule", "0", "--num-rep", "3", "--show-mappings"])
            .args(["--min-x", &x.to_string(), "--max-x", &x.to_string()])
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let ours = placement.pg(1, pg).unwrap().raw.clone();
        let want = format!(
            "CRUSH rule 0 x {x} [{}]",
            ours.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(line, want, "pg {pg}");
    }
    assert!(checked >= 8, "only {checked} PGs checked");
    c.wait_clean();
    client
        .write_full(POOL, "after-map", b"ok".to_vec())
        .await
        .unwrap();
    assert_eq!(client.read_full(POOL, "after-map").await.unwrap(), b"ok");
    // A map that lacks a daemon is refused, and the epoch does not move.
    let without = changed.replace("device 2 osd.2\n", "");
    std::fs::write(dir.join("bad.txt"), without).unwrap();
    let out = common::spindle()
        .args(["crush", "set-map"])
        .arg(dir.join("bad.txt"))
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(c.status()["epoch"].as_u64().unwrap(), epoch_before + 1);
}

/// The multi-extent write (what a write log's publisher sends): on a replicated pool one
/// request is one version, applied whole on every copy, also while a daemon is down and
/// after it caught up; on an erasure-coded pool the client splits it. Every object equals
/// the reference model throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_extent_writes_are_one_version_on_every_copy_through_a_daemon_crash() {
    use spindle_store::{Extent, Mutation};
    let c = Cluster::start("extents", 3, 32);
    common::run_ok(
        common::spindle()
            .args([
                "pool",
                "create",
                "ec",
                "--pg-count",
                "8",
                "--erasure",
                "k=2,m=1,min-size=2",
                "--dir",
            ])
            .arg(&c.dir),
    );
    c.wait_clean();
    let client = c.client().await;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut models: BTreeMap<(&str, String), Vec<u8>> = BTreeMap::new();
    for pool in [POOL, "ec"] {
        for round in 0..60u64 {
            if pool == POOL && round == 30 {
                c.kill_osd(1);
            }
            let name = format!("ext-{}", next(6));
            let mut extents = Vec::new();
            let mut at = next(64 << 10);
            for _ in 0..1 + next(40) {
                let big = next(4) == 0;
                let len_bytes = 1 + next(if big { 256 << 10 } else { 8192 }) as u32;
                extents.push(Extent {
                    offset: at,
                    len_bytes,
                });
                at += len_bytes as u64 + next(32 << 10);
            }
            let total: usize = extents.iter().map(|e| e.len_bytes as usize).sum();
            let data: Vec<u8> = (0..total).map(|i| (i as u64 * 31 + round) as u8).collect();
            let key = (pool, name.clone());
            let m = Mutation::WriteExtents {
                extents: extents.clone(),
                data: data.clone(),
            };
            let want = m.apply_to(models.get(&key).map(|v| v.as_slice())).unwrap();
            let before = client.stat(pool, &name).await.ok().map(|s| s.version);
            client
                .write_extents(pool, &name, extents.clone(), data)
                .await
                .unwrap_or_else(|e| panic!("{pool}/{name} round {round}: {e}"));
            let after = client.stat(pool, &name).await.unwrap();
            assert_eq!(after.size_bytes, want.len() as u64, "{pool}/{name}");
            // One request, one version (writes here are sequential; a new interval starts
            // a new epoch, so only same-epoch versions are compared).
            if let (POOL, Some(b)) = (pool, before) {
                if b.epoch == after.version.epoch {
                    assert_eq!(after.version.seq, b.seq + 1, "{pool}/{name}: one version");
                }
            }
            models.insert(key, want);
        }
    }
    // A bad extent list is refused before anything is sent.
    let bad = client
        .write_extents(
            POOL,
            "ext-0",
            vec![
                Extent {
                    offset: 10,
                    len_bytes: 4,
                },
                Extent {
                    offset: 12,
                    len_bytes: 1,
                },
            ],
            vec![0; 5],
        )
        .await;
    assert!(
        matches!(bad, Err(spindle_client::ClientError::Invalid(_))),
        "{bad:?}"
    );
    for ((pool, name), want) in &models {
        let got = client.read(pool, name, 0, u64::MAX).await.unwrap();
        assert!(got == *want, "{pool}/{name} differs from the model");
    }
    c.start_osd(1);
    c.wait_clean();
    for ((pool, name), want) in &models {
        let got = client.read(pool, name, 0, u64::MAX).await.unwrap();
        assert!(
            got == *want,
            "{pool}/{name} differs from the model after recovery"
        );
    }
    drop(client);
    stop(&c);
    // Every copy of every replicated object holds the model's bytes.
    for ((pool, name), want) in &models {
        if *pool != POOL {
            continue;
        }
        let mut copies = 0;
        for id in 0..c.osds {
            let store = spindle_store::Store::open(spindle_store::StoreConfig::new(
                c.osd_dir(id).join("store"),
            ))
            .unwrap();
            let pgid = spindle_store::PgId {
                pool: 1,
                pg: spindle_map::object_pg(name, 32),
            };
            if store.stat(pgid, name).is_some() {
                let got = store.read(pgid, name, 0, u64::MAX / 2).await.unwrap();
                assert!(got == *want, "osd.{id}: {name} differs from the model");
                copies += 1;
            }
            store.shutdown().unwrap();
        }
        assert_eq!(copies, 3, "{name}: copies");
    }
}
