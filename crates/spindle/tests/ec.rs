//! Erasure-coded pools with real processes on 127.0.0.1: client-side encoding, degraded
//! reads after losing m daemons, recovery of the shards a returning daemon missed, no
//! mixed stripes after SIGKILLs during overwrites, and a corrupt shard repaired on read.

mod common;

use common::{run_ok, spindle, walk, Cluster};
use spindle_client::{Client, ClientError};
use std::collections::BTreeMap;
use std::time::Duration;

const EC_POOL: &str = "ec";

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
    /// Log-uniform size in [1, max].
    fn size(&mut self, max: u64) -> usize {
        let bits = 64 - max.leading_zeros() as u64;
        let b = self.below(bits) + 1;
        (1 + self.below(1u64 << b).min(max - 1)) as usize
    }
}

fn create_ec_pool(c: &Cluster, profile: &str) {
    run_ok(
        spindle()
            .args(["pool", "create", EC_POOL, "--pg-count", "16", "--erasure"])
            .arg(profile)
            .arg("--dir")
            .arg(&c.dir),
    );
    c.wait_clean();
}

/// Applies a write at `offset` to the model.
fn model_write(model: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if model.len() < offset + data.len() {
        model.resize(offset + data.len(), 0);
    }
    model[offset..offset + data.len()].copy_from_slice(data);
}

async fn verify(client: &Client, model: &BTreeMap<String, Vec<u8>>, when: &str) {
    let mut bad = Vec::new();
    for (name, want) in model {
        match client.read_full(EC_POOL, name).await {
            Ok(got) if &got == want => {}
            Ok(got) => bad.push(format!(
                "{name}: {} bytes, expected {} (first difference at {:?})",
                got.len(),
                want.len(),
                got.iter().zip(want).position(|(a, b)| a != b)
            )),
            Err(e) => bad.push(format!("{name}: {e}")),
        }
        let st = client.stat(EC_POOL, name).await;
        match st {
            Ok(s) if s.size_bytes == want.len() as u64 => {}
            other => bad.push(format!("{name}: stat {other:?}, expected {}", want.len())),
        }
    }
    assert!(
        bad.is_empty(),
        "{when}: {} of {} objects wrong: {:?}",
        bad.len(),
        model.len(),
        &bad[..bad.len().min(10)]
    );
}

/// Random whole writes, then random partial overwrites (inside, across and past the
/// end), truncates, and a few deletes.
async fn mutate_randomly(
    client: &Client,
    model: &mut BTreeMap<String, Vec<u8>>,
    rng: &mut Rng,
    ops: usize,
) {
    let names: Vec<String> = model.keys().cloned().collect();
    for _ in 0..ops {
        let name = &names[rng.below(names.len() as u64) as usize];
        let cur = model.get(name).map_or(0, Vec::len);
        match rng.below(10) {
            0 => {
                let size = rng.below(cur as u64 + 1) as usize;
                client.truncate(EC_POOL, name, size as u64).await.unwrap();
                let m = model.entry(name.clone()).or_default();
                m.resize(size, 0);
            }
            1 if model.len() > 10 => {
                if model.contains_key(name) {
                    client.delete(EC_POOL, name).await.unwrap();
                    model.remove(name);
                }
            }
            _ => {
                let offset = rng.below(cur as u64 + 20_000) as usize;
                let len = rng.size(70_000);
                let data = rng.bytes(len);
                client
                    .write(EC_POOL, name, offset as u64, data.clone())
                    .await
                    .unwrap();
                model_write(model.entry(name.clone()).or_default(), offset, &data);
            }
        }
    }
}

async fn write_objects(client: &Client, n: usize, rng: &mut Rng) -> BTreeMap<String, Vec<u8>> {
    let mut model = BTreeMap::new();
    let objects: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let len = rng.size(300_000);
            (format!("ec-{i:05}"), rng.bytes(len))
        })
        .collect();
    let writes = objects.iter().map(|(name, data)| async move {
        client
            .write_full(EC_POOL, name, data.clone())
            .await
            .unwrap_or_else(|e| panic!("write_full {name}: {e}"));
    });
    futures::stream::iter(writes)
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    model.extend(objects);
    model
}

use futures::StreamExt;

/// The whole life of an erasure-coded pool with k + m daemons: writes and overwrites,
/// m daemons SIGKILLed (degraded reads), overwrites while degraded, the daemons restart
/// and recover the shards they missed, then m *other* daemons are killed: everything must
/// decode from the recovered shards.
async fn lose_recover_lose(tag: &str, k: u32, m: u32, seed: u64) {
    let n = k + m;
    let c = Cluster::start_with(tag, n, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, &format!("k={k},m={m},min-size={k}"));
    let client = c.client().await;
    let mut rng = Rng(seed);
    let mut model = write_objects(&client, 1000, &mut rng).await;
    mutate_randomly(&client, &mut model, &mut rng, 300).await;
    verify(&client, &model, "after writes").await;

    // Lose m daemons.
    let first: Vec<u32> = (0..m).map(|i| (seed as u32 + i) % n).collect();
    for &d in &first {
        c.kill_osd(d);
    }
    for &d in &first {
        c.wait_osd_up(d, false);
    }
    verify(&client, &model, &format!("with {first:?} down")).await;
    // Writes go on with k shards up (min_size = k).
    mutate_randomly(&client, &mut model, &mut rng, 150).await;
    verify(&client, &model, "after degraded writes").await;

    // They return and recover what they missed.
    for &d in &first {
        c.start_osd(d);
    }
    c.wait_clean();
    let s = c.status();
    let recovered: u64 = s["osds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["counters"]["recovered_objects"].as_u64().unwrap_or(0))
        .sum();
    assert!(recovered > 0, "nothing was recovered: {s}");
    verify(&client, &model, "after recovery").await;

    // Lose m others: the returned daemons' shards must be complete.
    let second: Vec<u32> = (0..n)
        .filter(|d| !first.contains(d))
        .take(m as usize)
        .collect();
    for &d in &second {
        c.kill_osd(d);
    }
    for &d in &second {
        c.wait_osd_up(d, false);
    }
    verify(
        &client,
        &model,
        &format!("with {second:?} down after recovery"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs_2_1_on_3_daemons_survives_loss_recovery_and_loss() {
    lose_recover_lose("ec21", 2, 1, 0x2101).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs_4_2_on_6_daemons_survives_loss_recovery_and_loss() {
    lose_recover_lose("ec42", 4, 2, 0x4202).await;
}

/// A daemon marked out: its shards are rebuilt from k survivors onto the daemon CRUSH
/// picks instead, and reads no longer need the lost one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_of_an_out_daemon_are_rebuilt_elsewhere() {
    let c = Cluster::start_with("ecout", 4, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1,matrix=isal-cauchy,stripe-unit=8192");
    let client = c.client().await;
    let mut rng = Rng(0x0e7);
    let model = write_objects(&client, 300, &mut rng).await;
    c.kill_osd(3);
    c.wait_osd_up(3, false);
    run_ok(spindle().args(["osd", "out", "3", "--dir"]).arg(&c.dir));
    c.wait_clean();
    verify(&client, &model, "after rebuilding osd.3's shards").await;
    // Any one more daemon may fail now.
    c.kill_osd(0);
    c.wait_osd_up(0, false);
    verify(&client, &model, "after rebuild and losing osd.0").await;
}

/// SIGKILL of daemons at random moments under concurrent partial overwrites: every
/// acknowledged write reads back exactly, and an unacknowledged one is all there or not
/// at all (never a stripe mixing old and new data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_overwrites_never_mixes_stripes() {
    let c = Cluster::start_with("ecchaos", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1,min-size=2,stripe-unit=4096");
    let client = c.client().await;
    let mut rng = Rng(0xc4a05);
    // Each object: the possible contents (exactly one when the last write was acked).
    let mut model = write_objects(&client, 40, &mut rng).await;
    // Writers give up after 1.5 s (instead of retrying through a whole failover), so
    // some writes end unacknowledged with an unknown outcome.
    let impatient = {
        let mut cfg = c.client_config();
        cfg.op_timeout_ms = 1500;
        Client::connect(cfg).await.expect("client connects")
    };
    let mut candidates: BTreeMap<String, Vec<Vec<u8>>> = model
        .iter()
        .map(|(n, d)| (n.clone(), vec![d.clone()]))
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chaos = {
        let stop = stop.clone();
        let dir = c.dir.clone();
        std::thread::spawn(move || {
            let mut r = Rng(0x5151);
            let mut kills = 0;
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && round < 5 {
                std::thread::sleep(Duration::from_millis(300 + r.below(700)));
                let first = r.below(3) as u32;
                // Round 1 kills two daemons (below min_size) for longer than the impatient
                // client waits, so some writes certainly end unacknowledged - possibly
                // applied on the one daemon left - and the old-or-new check below runs
                // however fast failover is. The other rounds kill one daemon.
                let victims = if round == 1 {
                    vec![first, (first + 1) % 3]
                } else {
                    vec![first]
                };
                for victim in &victims {
                    if let Some(pid) = Cluster::pid(&dir.join(format!("osd.{victim}"))) {
                        // SAFETY: kill(2) of a daemon this test started.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        kills += 1;
                    }
                }
                let down_ms = if round == 1 { 2500 } else { 200 + r.below(600) };
                std::thread::sleep(Duration::from_millis(down_ms));
                for victim in &victims {
                    run_ok(
                        spindle()
                            .args(["osd", "start", &victim.to_string(), "--dir"])
                            .arg(&dir),
                    );
                }
                round += 1;
            }
            kills
        })
    };
    // Writers: one task per object group, overwriting stripes across unit boundaries.
    let names: Vec<String> = model.keys().cloned().collect();
    let mut acked = 0u64;
    let mut failed = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(12);
    while std::time::Instant::now() < deadline {
        let batch: Vec<(String, u64, Vec<u8>)> = (0..8)
            .map(|i| {
                let name = names[(rng.below(5) as usize) * 8 + i].clone();
                let len = model[&name].len() as u64;
                let offset = rng.below(len + 5000);
                let len = 1 + rng.below(20_000) as usize;
                (name, offset, rng.bytes(len))
            })
            .collect();
        let results = futures::future::join_all(batch.iter().map(|(name, offset, data)| {
            let client = impatient.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(20),
                    client.write(EC_POOL, name, *offset, data.clone()),
                )
                .await
            }
        }))
        .await;
        for ((name, offset, data), r) in batch.into_iter().zip(results) {
            let before = model[&name].clone();
            let mut after = before.clone();
            model_write(&mut after, offset as usize, &data);
            let ok = matches!(r, Ok(Ok(_)));
            let cands = candidates.get_mut(&name).unwrap();
            if ok {
                acked += 1;
                *cands = vec![after.clone()];
                model.insert(name, after);
            } else {
                failed += 1;
                // Unknown outcome: the object is the old or the new content; later writes
                // build on whichever it is, so re-read it to continue from the truth.
                let mut next: Vec<Vec<u8>> = cands.clone();
                next.push(after.clone());
                let now = loop {
                    match client.read_full(EC_POOL, &name).await {
                        Ok(d) => break d,
                        Err(ClientError::NotFound(_)) => break Vec::new(),
                        Err(e) => {
                            eprintln!("re-read {name}: {e}");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                };
                assert!(
                    next.contains(&now),
                    "{name}: after a failed write the object is neither the old nor the new \
                     content ({} bytes read)",
                    now.len()
                );
                *cands = vec![now.clone()];
                model.insert(name, now);
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = chaos.join().unwrap();
    eprintln!("{acked} writes acknowledged, {failed} failed, {kills} daemons killed");
    assert!(kills >= 3, "the chaos thread killed only {kills} daemons");
    assert!(acked > 50, "only {acked} writes acknowledged");
    assert!(
        failed > 0,
        "no write ended unacknowledged: the mixed-stripe check did not run"
    );
    c.up();
    c.wait_clean();
    verify(&client, &model, "after the chaos").await;
}

/// Sum of one daemon counter over every daemon in a status report.
fn counter_sum_in(s: &serde_json::Value, name: &str) -> u64 {
    s["osds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["counters"][name].as_u64().unwrap_or(0))
        .sum()
}

/// Sum of one daemon counter over every daemon (as last reported to the monitor).
fn counter_sum(c: &Cluster, name: &str) -> u64 {
    counter_sum_in(&c.status(), name)
}

/// Small overwrites of an object, as an image makes them: 512 B .. 8 KiB anywhere.
async fn small_overwrites(
    client: &Client,
    model: &mut BTreeMap<String, Vec<u8>>,
    rng: &mut Rng,
    ops: usize,
) {
    let names: Vec<String> = model.keys().cloned().collect();
    for _ in 0..ops {
        let name = &names[rng.below(names.len() as u64) as usize];
        let size = model[name].len() as u64;
        let len = 512 + rng.below(8 * 1024 - 512) as usize;
        let offset = rng.below(size - len as u64);
        let data = rng.bytes(len);
        client
            .write(EC_POOL, name, offset, data.clone())
            .await
            .unwrap_or_else(|e| panic!("write {name} at {offset}: {e}"));
        model_write(model.get_mut(name).unwrap(), offset as usize, &data);
    }
}

/// Small overwrites of large objects are stored as delta slots over a whole-shard base
/// (cumulative until they grow too large, then a whole shard again), and such objects
/// read, survive a daemon loss (degraded reads decode through deltas), recover on a
/// returning daemon (which gets whole-shard deltas and then falls back to them for later
/// writes), scrub clean and decode from the recovered shards after another loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_overwrites_become_deltas_that_survive_loss_recovery_and_scrub() {
    let c = Cluster::start_with("ecdelta", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1,min-size=2,stripe-unit=4096");
    let client = c.client().await;
    let mut rng = Rng(0xde17a);
    let mut model = BTreeMap::new();
    for i in 0..24 {
        let name = format!("img-{i:02}");
        let data = rng.bytes(256 << 10);
        client
            .write_full(EC_POOL, &name, data.clone())
            .await
            .unwrap();
        model.insert(name, data);
    }
    small_overwrites(&client, &mut model, &mut rng, 150).await;
    verify(&client, &model, "after small overwrites").await;
    // 150 writes x 3 shards; a write whose deltas would exceed the limit is whole.
    // (Daemons report counters with their heartbeats: wait for the report.)
    c.wait_for(
        "150+ delta shard writes reported",
        Duration::from_secs(20),
        |s| counter_sum_in(s, "ec_delta_writes") >= 150,
    );
    assert_eq!(counter_sum(&c, "ec_delta_fallbacks"), 0);

    // One daemon down: degraded reads and writes through deltas.
    let victim = 1;
    c.kill_osd(victim);
    c.wait_osd_up(victim, false);
    verify(&client, &model, "with one daemon down").await;
    small_overwrites(&client, &mut model, &mut rng, 100).await;
    verify(&client, &model, "after degraded small overwrites").await;

    // It returns and recovers what it missed.
    c.start_osd(victim);
    c.wait_clean();
    verify(&client, &model, "after recovery").await;
    small_overwrites(&client, &mut model, &mut rng, 100).await;
    verify(&client, &model, "after overwrites of recovered objects").await;
    // Deleting objects whose current slot is a delta (rewritten whole first).
    for name in ["img-03", "img-11", "img-17"] {
        client.delete(EC_POOL, name).await.unwrap();
        model.remove(name);
        assert!(
            matches!(
                client.read_full(EC_POOL, name).await,
                Err(ClientError::NotFound(_))
            ),
            "{name} still readable after its delete"
        );
    }
    verify(&client, &model, "after deletes").await;
    let out = run_ok(
        spindle()
            .args(["scrub", EC_POOL, "--json", "--dir"])
            .arg(&c.dir),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["inconsistent"], 0, "{out}");
    assert_eq!(v[0]["damaged_objects"], 0, "{out}");

    eprintln!(
        "shard writes stored as deltas: {}, whole-shard deltas after recovery: {}, recovered objects: {}",
        counter_sum(&c, "ec_delta_writes"),
        counter_sum(&c, "ec_delta_fallbacks"),
        counter_sum(&c, "recovered_objects")
    );
    c.wait_for("recovered slots reported", Duration::from_secs(20), |s| {
        counter_sum_in(s, "recovered_objects") > 0
    });
    // Another daemon lost: everything decodes from the returned daemon's shards.
    let other = 2;
    c.kill_osd(other);
    c.wait_osd_up(other, false);
    verify(&client, &model, "with another daemon down after recovery").await;
}

/// Corrupting one shard on disk: reads still return the right data (decoded from the
/// other shards) and the bad shard is rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_shard_is_decoded_around_and_repaired() {
    let c = Cluster::start_with("eccorrupt", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1");
    let client = c.client().await;
    let name = "corrupted";
    let data = Rng(77).bytes(1 << 20);
    client
        .write_full(EC_POOL, name, data.clone())
        .await
        .unwrap();
    let map = client.map();
    let pool = map.pool_by_name(EC_POOL).unwrap().clone();
    let pg = spindle_map::object_pg(name, pool.pg_count);
    let mapping = spindle_map::Placement::compute(&map)
        .pg(pool.id, pg)
        .unwrap()
        .clone();
    // Corrupt data shard 0 (on the primary: the read path must decode around its own
    // shard) - then data shard 1 on another daemon after repair.
    for shard in [0usize, 1] {
        let victim = mapping.shards[shard].unwrap();
        // Flipped under the running daemon (its block checksums are in memory).
        let mut flipped = 0;
        for f in walk(&c.osd_dir(victim).join("store").join("objects")) {
            let mut bytes = std::fs::read(&f).unwrap();
            if bytes.len() > 100_000 {
                bytes[4096 * 3 + 5] ^= 0x5a;
                std::fs::write(&f, &bytes).unwrap();
                flipped += 1;
            }
        }
        assert_eq!(flipped, 1, "expected one shard file on osd.{victim}");
        let got = client.read_full(EC_POOL, name).await.unwrap();
        assert!(
            got == data,
            "shard {shard} corrupt: read returned wrong data"
        );
        // The shard is repaired: scrub finds the group consistent.
        c.wait_for("repair", Duration::from_secs(30), |s| {
            s["osds"][victim as usize]["up"] == true
                && s["osds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o["counters"]["corruptions_repaired"].as_u64().unwrap_or(0))
                    .sum::<u64>()
                    > shard as u64
        });
        let out = run_ok(
            spindle()
                .args(["scrub", EC_POOL, "--json", "--dir"])
                .arg(&c.dir),
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v[0]["inconsistent"], 0, "shard {shard}: {out}");
    }
    // Both repaired shards plus parity: losing the parity daemon still reads right.
    c.kill_osd(mapping.shards[2].unwrap());
    let got = client.read_full(EC_POOL, name).await.unwrap();
    assert!(got == data);
}

/// Two of three shards (k = 2) of an object corrupted on disk: too few intact shards to
/// decode, so scrub lists the object (by its name, not its shard slot) and fails, and the
/// group is inconsistent with a HEALTH_ERR check until the object is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_reports_an_object_with_fewer_than_k_intact_shards_until_deleted() {
    let c = Cluster::start_with("ecdamaged", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1");
    let client = c.client().await;
    let name = "undecodable";
    client
        .write_full(EC_POOL, name, Rng(5).bytes(1 << 20))
        .await
        .unwrap();
    client
        .write_full(EC_POOL, "fine", Rng(6).bytes(1000))
        .await
        .unwrap();
    let map = client.map();
    let pool = map.pool_by_name(EC_POOL).unwrap().clone();
    let pg = spindle_map::object_pg(name, pool.pg_count);
    let pgid = spindle_map::PgId { pool: pool.id, pg }.to_string();
    let mapping = spindle_map::Placement::compute(&map)
        .pg(pool.id, pg)
        .unwrap()
        .clone();
    for shard in [0usize, 2] {
        let victim = mapping.shards[shard].unwrap();
        let mut flipped = 0;
        for f in walk(&c.osd_dir(victim).join("store").join("objects")) {
            let mut bytes = std::fs::read(&f).unwrap();
            if bytes.len() > 100_000 {
                bytes[4096 * 2 + 9] ^= 0xa5;
                std::fs::write(&f, &bytes).unwrap();
                flipped += 1;
            }
        }
        assert_eq!(flipped, 1, "expected one shard file on osd.{victim}");
    }
    let out = spindle()
        .args(["scrub", EC_POOL, "--json", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v[0]["damaged"],
        serde_json::json!([{"pg": pgid, "name": name}]),
        "{stdout}"
    );
    assert_eq!(v[0]["inconsistent"], 2, "{stdout}");
    c.wait_for("inconsistent pg", Duration::from_secs(10), |s| {
        s["pgs"]["inconsistent"] == 1 && s["health"]["status"] == "HEALTH_ERR"
    });
    // Deleting the object resolves it.
    client.delete(EC_POOL, name).await.unwrap();
    c.wait_for("health OK after the delete", Duration::from_secs(10), |s| {
        s["pgs"]["inconsistent"] == 0 && common::healthy_but_for_disk_usage(s)
    });
    let out = run_ok(
        spindle()
            .args(["scrub", EC_POOL, "--json", "--dir"])
            .arg(&c.dir),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["damaged_objects"], 0, "{out}");
    assert_eq!(v[0]["inconsistent"], 0, "{out}");
}

/// A block image on an erasure-coded pool: created with the pool's default object size
/// (256 KiB), random writes of 512 B..128 KiB (across object boundaries), zeroing and
/// discard read back exactly, also with one daemon down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_on_an_erasure_coded_pool_reads_back_its_writes() {
    let c = Cluster::start_with("ecimg", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1,min-size=2");
    let out = run_ok(
        spindle()
            .args([
                "image", "create", "disk", "--size", "32M", "--pool", EC_POOL, "--dir",
            ])
            .arg(&c.dir),
    );
    assert!(out.contains("256 KiB"), "default object size on EC: {out}");
    let client = std::sync::Arc::new(c.client().await);
    let img = spindle_image::Image::open(client.clone(), EC_POOL, "disk")
        .await
        .unwrap();
    let size = 32usize << 20;
    let mut model = vec![0u8; size];
    let mut rng = Rng(0x1a6e);
    for round in 0..300 {
        let len = (1 + rng.below(256) as usize) * 512;
        let off = (rng.below(((size - len) / 512) as u64) as usize) * 512;
        if round % 25 == 24 {
            img.write_zeroes(off as u64, len as u64).await.unwrap();
            model[off..off + len].fill(0);
        } else {
            let data = rng.bytes(len);
            img.write(off as u64, &data).await.unwrap();
            model[off..off + len].copy_from_slice(&data);
        }
    }
    let check = |got: Vec<u8>, when: &str| {
        assert!(
            got == model,
            "{when}: image differs at byte {:?}",
            got.iter().zip(&model).position(|(a, b)| a != b)
        );
    };
    check(img.read(0, size as u64).await.unwrap(), "all up");
    c.kill_osd(1);
    c.wait_osd_up(1, false);
    check(img.read(0, size as u64).await.unwrap(), "osd.1 down");
}

/// Map changes that keep every group's interval (other pools created and removed) while
/// erasure-coded overwrites are in flight. A shard write that a copy refuses because it
/// already has the newer map (`StaleMap`) leaves the new slot on some shards only; the
/// primary installs the copy's map (same interval: the group stays active) and must peer
/// again. It used to re-peer only when the group's epoch was still the write's, i.e. never
/// in this case: the slot stayed on fewer than k shards and every later read or write of
/// the object answered `Again` until the client gave up (30 s, EIO through NBD); peering
/// much later rolled the write back as unacknowledged. Every operation must succeed well
/// within the client's timeout and every object must read back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_coded_writes_go_on_across_map_changes_that_keep_the_interval() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let c = Cluster::start_with("ecepochs", 3, 8, &["--out-after-ms", "0"]);
    create_ec_pool(&c, "k=2,m=1,min-size=2");
    let mut cfg = c.client_config();
    cfg.op_timeout_ms = 20_000;
    let client = Arc::new(Client::connect(cfg).await.unwrap());
    const WRITERS: u64 = 4;
    const PER_WRITER: u64 = 2;
    const SIZE: usize = 64 << 10;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (client, stop) = (client.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9 + w);
            let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for o in 0..PER_WRITER {
                let name = format!("w{w}o{o}");
                let data = rng.bytes(SIZE);
                client
                    .write_full(EC_POOL, &name, data.clone())
                    .await
                    .unwrap();
                model.insert(name, data);
            }
            let (mut ops, mut slowest) = (0u64, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}o{}", rng.below(PER_WRITER));
                let offset = rng.below(SIZE as u64 / 4096) as usize * 4096;
                let data = rng.bytes(4096);
                let started = std::time::Instant::now();
                if let Err(e) = client
                    .write(EC_POOL, &name, offset as u64, data.clone())
                    .await
                {
                    panic!("write {name} at {offset} after {ops} writes: {e}");
                }
                slowest = slowest.max(started.elapsed());
                model_write(model.get_mut(&name).unwrap(), offset, &data);
                ops += 1;
            }
            (model, ops, slowest)
        }));
    }
    // Map changes that move no group of the erasure-coded pool.
    let admin = c.client().await;
    for i in 0..20 {
        let name = format!("tmp{i}");
        admin
            .admin(&spindle_mon::Admin::pool_create(&name, 3, 2, 8))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        admin
            .admin(&spindle_mon::Admin::pool_rm(&name))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut model = BTreeMap::new();
    for t in tasks {
        let (m, ops, slowest) = t.await.unwrap();
        eprintln!("writer: {ops} writes, slowest {slowest:?}");
        assert!(
            slowest < Duration::from_secs(10),
            "a write took {slowest:?}"
        );
        model.extend(m);
    }
    verify(&client, &model, "after the map changes").await;
}
