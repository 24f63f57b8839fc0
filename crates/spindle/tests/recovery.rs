//! Recovery, rebalancing and scrub with real processes on 127.0.0.1: a lost daemon's
//! data is re-created on the survivors, a new daemon takes its share, a returning daemon
//! catches up by log (or is backfilled), scrub finds and repairs a corrupt replica, and
//! daemons killed during recovery lose nothing.

mod common;

use common::{
    content, run_ok, size_log_uniform, spindle, verify_all, verify_on_replicas, walk, write_all,
    Cluster, POOL,
};
use std::collections::BTreeMap;
use std::time::Duration;

fn random_objects(n: usize, max_bytes: u64, seed: u64) -> BTreeMap<String, (u64, usize)> {
    let mut rng = seed | 1;
    (0..n)
        .map(|i| {
            let len = size_log_uniform(&mut rng, max_bytes);
            (format!("obj-{seed}-{i:05}"), (seed, len))
        })
        .collect()
}

fn counter_sum(s: &serde_json::Value, name: &str) -> u64 {
    s["osds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| o["counters"][name].as_u64().unwrap_or(0))
        .sum()
}

/// Object copies held by the daemons that are up (a down daemon's counters are stale).
fn copies_on_up_daemons(s: &serde_json::Value) -> u64 {
    s["osds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["up"] == true)
        .map(|o| o["counters"]["objects"].as_u64().unwrap_or(0))
        .sum()
}

fn counter(s: &serde_json::Value, osd: u32, name: &str) -> u64 {
    s["osds"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["id"] == osd)
        .map(|o| o["counters"][name].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

fn osd_cmd(c: &Cluster, args: &[&str]) -> String {
    run_ok(spindle().arg("osd").args(args).arg("--dir").arg(&c.dir))
}

fn start(tag: &str, osds: u32, extra: &[&str]) -> Cluster {
    Cluster::start_with(tag, osds, 32, extra)
}

/// 4 daemons, 3 copies: lose one (SIGKILL + out), recovery re-creates every copy on the 3
/// survivors (checked on disk); then lose a second one: everything still reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_daemon_is_replaced_and_a_second_loss_loses_nothing() {
    let c = start("replace", 4, &["--out-after-ms", "0"]);
    let client = c.client().await;
    let objects = random_objects(1000, 64 << 10, 11);
    write_all(&client, &objects).await;
    let victim = 1;
    c.kill_osd(victim);
    osd_cmd(&c, &["out", &victim.to_string()]);
    c.wait_clean();
    let s = c.status();
    assert!(
        counter_sum(&s, "recovered_objects") > 0,
        "nothing was recovered: {s}"
    );
    verify_all(&client, &objects).await;
    let second = 2;
    c.kill_osd(second);
    verify_all(&client, &objects).await;
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    // Every object has 3 good copies on the daemons that survived the first loss.
    verify_on_replicas(&c, &[0, 2, 3], 32, &objects, 3).await;
}

/// A fifth daemon joins: about a fifth of the copies move to it, the old copies are
/// removed, nothing is lost, the cluster returns to clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_daemon_takes_its_share_and_old_copies_are_removed() {
    let c = start("add", 4, &[]);
    let client = c.client().await;
    let objects = random_objects(600, 16 << 10, 22);
    write_all(&client, &objects).await;
    let out = osd_cmd(&c, &["add"]);
    assert!(out.contains("added osd.4"), "{out}");
    let total = 3 * objects.len() as u64;
    // Clean, and the stray copies left behind on the old daemons are gone.
    c.wait_for(
        "clean with exactly 3 copies of everything",
        Duration::from_secs(90),
        |s| {
            s["pgs"]["clean"] == 32
                && s["osds"].as_array().is_some_and(|a| a.len() == 5)
                && copies_on_up_daemons(s) == total
        },
    );
    let s = c.status();
    let share = counter(&s, 4, "objects") as f64 / total as f64;
    // Equal weights: 1/5 expected; CRUSH over 32 PGs is lumpy, so allow a wide band.
    assert!(
        (0.08..=0.35).contains(&share),
        "osd.4 holds {:.1}% of the copies: {s}",
        share * 100.0
    );
    assert!(counter_sum(&s, "strays_removed") > 0, "{s}");
    verify_all(&client, &objects).await;
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    verify_on_replicas(&c, &[0, 1, 2, 3, 4], 32, &objects, 3).await;
}

/// A daemon stopped briefly catches up from the placement-group logs (no backfill); one
/// that missed more than the log holds is backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_absence_catches_up_by_log_long_absence_is_backfilled() {
    let c = start("catchup", 3, &["--out-after-ms", "0"]);
    run_ok(
        spindle()
            .args(["pool", "create", "one", "--size", "3", "--pg-count", "1"])
            .arg("--dir")
            .arg(&c.dir),
    );
    let client = c.client().await;
    let before = random_objects(50, 8 << 10, 33);
    write_all(&client, &before).await;
    // From a clean cluster: a copy still being recovered when it stops is marked incomplete
    // and is backfilled whatever the length of its absence (seen under load, when the
    // first writes raced the daemons' first peering).
    c.wait_clean();
    // Short: a few writes while osd.2 is away.
    c.kill_osd(2);
    c.wait_osd_up(2, false);
    let short = random_objects(40, 8 << 10, 34);
    write_all(&client, &short).await;
    let s0 = c.status();
    c.start_osd(2);
    c.wait_clean();
    let s1 = c.status();
    assert_eq!(
        counter_sum(&s1, "backfills"),
        counter_sum(&s0, "backfills"),
        "a short absence caused a backfill: {s1}"
    );
    assert!(counter_sum(&s1, "log_recoveries") > counter_sum(&s0, "log_recoveries"));
    verify_all(&client, &short).await;
    // Long: more writes to the single-PG pool than its log keeps (4096 entries).
    c.kill_osd(2);
    c.wait_osd_up(2, false);
    let many: Vec<String> = (0..4200).map(|i| format!("many-{i}")).collect();
    let mut tasks = Vec::new();
    for chunk in many.chunks(many.len() / 8 + 1) {
        let client = client.clone();
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            for n in chunk {
                client
                    .write_full("one", &n, content(&n, 1, 64))
                    .await
                    .unwrap_or_else(|e| panic!("write {n}: {e}"));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let s2 = c.status();
    c.start_osd(2);
    c.wait_clean();
    let s3 = c.status();
    assert!(
        counter_sum(&s3, "backfills") > counter_sum(&s2, "backfills"),
        "a long absence did not backfill: {s3}"
    );
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    // osd.2 has every object of both pools again.
    let mut one = BTreeMap::new();
    for n in &many {
        one.insert(n.clone(), (1u64, 64usize));
    }
    let store =
        spindle_store::Store::open(spindle_store::StoreConfig::new(c.osd_dir(2).join("store")))
            .unwrap();
    let pool_one = 2; // created after "default" (id 1)
    for (n, (g, len)) in &one {
        let pgid = spindle_store::PgId {
            pool: pool_one,
            pg: 0,
        };
        let data = store
            .read(pgid, n, 0, 1 << 20)
            .await
            .unwrap_or_else(|e| panic!("osd.2 lacks {n}: {e}"));
        assert!(data == content(n, *g, *len), "{n} differs on osd.2");
    }
    store.shutdown().unwrap();
    let mut all = before.clone();
    all.extend(short.clone());
    verify_on_replicas(&c, &[0, 1, 2], 32, &all, 3).await;
}

/// Bytes flipped in one replica's data file: scrub finds the bad copy and repairs it, and
/// the replica then holds correct data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_finds_and_repairs_a_corrupt_replica() {
    let c = Cluster::start("scrub", 3, 32);
    let client = c.client().await;
    let name = "scrubbed";
    let data = content(name, 9, 1 << 20);
    client.write_full(POOL, name, data.clone()).await.unwrap();
    let clean = run_ok(spindle().args(["scrub", "--json", "--dir"]).arg(&c.dir));
    let v: serde_json::Value = serde_json::from_str(&clean).unwrap();
    assert_eq!(v[0]["objects"], 1, "{clean}");
    assert_eq!(v[0]["inconsistent"], 0, "{clean}");
    let pg = spindle_map::object_pg(name, 32);
    let mapping = spindle_map::Placement::compute(&client.map())
        .pg(1, pg)
        .unwrap()
        .clone();
    let replica = mapping.up[1];
    let mut flipped = 0;
    for f in walk(&c.osd_dir(replica).join("store").join("objects")) {
        let mut bytes = std::fs::read(&f).unwrap();
        if bytes.len() > 5000 {
            bytes[777] ^= 0xff;
            std::fs::write(&f, &bytes).unwrap();
            flipped += 1;
        }
    }
    assert_eq!(flipped, 1, "expected one data file on osd.{replica}");
    let out = run_ok(
        spindle()
            .args(["scrub", "default", "--json", "--dir"])
            .arg(&c.dir),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["inconsistent"], 1, "{out}");
    assert_eq!(v[0]["repaired"], 1, "{out}");
    let primary = mapping.up[0];
    c.wait_for("scrub counters", Duration::from_secs(10), |s| {
        counter(s, primary, "scrub_repaired") == 1 && counter(s, primary, "scrub_inconsistent") == 1
    });
    // A second scrub finds nothing.
    let again = run_ok(spindle().args(["scrub", "--json", "--dir"]).arg(&c.dir));
    let v: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(v[0]["inconsistent"], 0, "{again}");
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    // The replica's own copy is good again.
    let store = spindle_store::Store::open(spindle_store::StoreConfig::new(
        c.osd_dir(replica).join("store"),
    ))
    .unwrap();
    let got = store
        .read(spindle_store::PgId { pool: 1, pg }, name, 0, 2 << 20)
        .await
        .unwrap_or_else(|e| panic!("osd.{replica} copy still bad: {e}"));
    assert!(got == data);
    store.shutdown().unwrap();
}

/// Flips one byte of every data file under `osd`'s store that is exactly `len` bytes long
/// (a data file holds exactly its object's bytes, so distinct sizes name the object);
/// returns how many it changed.
fn corrupt_files_of_len(c: &Cluster, osd: u32, len: u64) -> usize {
    let mut flipped = 0;
    for f in walk(&c.osd_dir(osd).join("store").join("objects")) {
        if std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0) == len {
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[4097] ^= 0x3c;
            std::fs::write(&f, &bytes).unwrap();
            flipped += 1;
        }
    }
    flipped
}

fn health_check<'a>(s: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    s["health"]["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
}

/// Issue #16, "scrub tells the truth": every copy of one object corrupted on disk (and one
/// copy of another). Before the fix scrub skipped the object with no intact copy: it said
/// "0 bad copies found" for it, exited 0 and the group stayed clean. Now scrub lists it
/// and fails, the group is `inconsistent` with a HEALTH_ERR check naming it, the single
/// bad copy of the other object is repaired, and overwriting the object clears it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_reports_an_object_with_no_intact_copy_until_it_is_rewritten() {
    let c = Cluster::start("damaged", 3, 32);
    let client = c.client().await;
    let (lost, lost_len) = ("lost", 300_000usize);
    let (hurt, hurt_len) = ("hurt", 200_000usize);
    client
        .write_full(POOL, lost, content(lost, 1, lost_len))
        .await
        .unwrap();
    client
        .write_full(POOL, hurt, content(hurt, 1, hurt_len))
        .await
        .unwrap();
    for i in 0..4 {
        let n = format!("small-{i}");
        client
            .write_full(POOL, &n, content(&n, 1, 1000))
            .await
            .unwrap();
    }
    let s = c.status();
    assert!(common::healthy_but_for_disk_usage(&s), "{}", s["health"]);
    let placement = spindle_map::Placement::compute(&client.map());
    let lost_pg = spindle_map::object_pg(lost, 32);
    let lost_pgid = format!("1.{lost_pg:x}");
    for &osd in &placement.pg(1, lost_pg).unwrap().up {
        let n = corrupt_files_of_len(&c, osd, lost_len as u64);
        assert_eq!(n, 1, "osd.{osd}: data files of {lost}");
    }
    let hurt_replica = placement
        .pg(1, spindle_map::object_pg(hurt, 32))
        .unwrap()
        .up[1];
    assert_eq!(corrupt_files_of_len(&c, hurt_replica, hurt_len as u64), 1);

    // Scrub: fails, lists exactly the lost object, repairs the other one.
    let out = spindle()
        .args(["scrub", "--json", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "scrub must fail: {stdout}\n{stderr}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["objects"], 6, "{stdout}");
    assert_eq!(v[0]["damaged_objects"], 1, "{stdout}");
    assert_eq!(
        v[0]["damaged"],
        serde_json::json!([{"pg": lost_pgid, "name": lost}]),
        "{stdout}"
    );
    assert_eq!(
        v[0]["inconsistent"], 4,
        "3 copies of {lost} + 1 of {hurt}: {stdout}"
    );
    assert_eq!(v[0]["repaired"], 1, "{stdout}");
    assert!(
        stderr.contains("1 object(s) have no intact copy"),
        "{stderr}"
    );
    // Text output: one line per damaged object, `pool/pg name`; the repaired copy stays
    // repaired (only the lost object's copies are bad now).
    let out = spindle()
        .args(["scrub", POOL, "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let listed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("no intact copy"))
        .collect();
    assert_eq!(
        listed,
        [format!("no intact copy: {POOL}/{lost_pgid} {lost}")],
        "{text}"
    );
    assert!(
        text.contains("3 bad copies found, 0 repaired, 1 objects with no intact copy"),
        "{text}"
    );
    // Reads refuse (no intact copy to serve).
    assert!(client.read_full(POOL, lost).await.is_err());

    // Status: the group is inconsistent, HEALTH_ERR names it.
    c.wait_for("inconsistent pg", Duration::from_secs(10), |s| {
        s["pgs"]["inconsistent"] == 1
    });
    let s = c.status();
    assert_eq!(s["health"]["status"], "HEALTH_ERR", "{s}");
    let check = health_check(&s, "PG_DAMAGED").unwrap_or_else(|| panic!("no PG_DAMAGED: {s}"));
    assert_eq!(check["severity"], "HEALTH_ERR");
    let msg = check["message"].as_str().unwrap();
    assert!(msg.contains(&format!("{lost_pgid} (1)")), "{msg}");
    assert!(msg.contains("1 object(s) with no intact copy"), "{msg}");
    assert_eq!(
        s["inconsistent_pgs"],
        serde_json::json!([{"pg": lost_pgid, "damaged_objects": 1}])
    );
    assert_eq!(s["pools"][0]["pgs"]["inconsistent"], 1, "{s}");
    let text = run_ok(spindle().args(["status", "--dir"]).arg(&c.dir));
    assert!(text.contains("HEALTH_ERR PG_DAMAGED"), "{text}");
    assert!(text.contains("1 inconsistent"), "{text}");
    // `spindle health` says the same, first word first.
    let text = run_ok(spindle().args(["health", "--dir"]).arg(&c.dir));
    assert!(text.starts_with("HEALTH_ERR\n"), "{text}");
    assert!(text.contains("HEALTH_ERR PG_DAMAGED"), "{text}");
    // The finding is an event (the dashboard's last events).
    let events = s["events"].to_string();
    assert!(
        events.contains(&format!(
            "pg {lost_pgid} has 1 object(s) with no intact copy"
        )),
        "{events}"
    );
    assert!(events.contains("inconsistent object(s) found"), "{events}");

    // Overwriting the object resolves it (no scrub needed), and a scrub agrees.
    let fresh = content(lost, 2, lost_len);
    client.write_full(POOL, lost, fresh.clone()).await.unwrap();
    c.wait_for(
        "health OK after the overwrite",
        Duration::from_secs(10),
        |s| common::healthy_but_for_disk_usage(s) && s["pgs"]["inconsistent"] == 0,
    );
    let again = run_ok(spindle().args(["scrub", "--json", "--dir"]).arg(&c.dir));
    let v: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(v[0]["damaged_objects"], 0, "{again}");
    assert_eq!(v[0]["inconsistent"], 0, "{again}");
    let s = c.status();
    assert_eq!(s["pgs"]["clean"], 32);
    assert!(
        s["events"].to_string().contains(&format!(
            "pg {lost_pgid}: no object without an intact copy any more"
        )),
        "{}",
        s["events"]
    );
    assert!(client.read_full(POOL, lost).await.unwrap() == fresh);
}

/// Daemons SIGKILLed (and restarted) at random moments while recovery runs: no object is
/// lost and recovery finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_killed_during_recovery_lose_nothing() {
    // Throttled so that recovery lasts long enough to be interrupted.
    let c = start(
        "chaos",
        5,
        &[
            "--out-after-ms",
            "0",
            "--recovery-bytes-per-sec",
            "4000000",
            "--recovery-ops-max",
            "1",
        ],
    );
    let client = c.client().await;
    let objects = random_objects(800, 64 << 10, 55);
    write_all(&client, &objects).await;
    c.kill_osd(0);
    osd_cmd(&c, &["out", "0"]);
    let mut rng = 0x5eed_u64;
    for round in 0..4 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(200 + rng % 800)).await;
        let victim = 1 + (rng % 4) as u32;
        eprintln!("round {round}: killing osd.{victim}");
        c.kill_osd(victim);
        tokio::time::sleep(Duration::from_millis(300 + (rng >> 8) % 700)).await;
        c.start_osd(victim);
        c.wait_osd_up(victim, true);
    }
    c.wait_clean();
    verify_all(&client, &objects).await;
    let total = 3 * objects.len() as u64;
    c.wait_for("stray copies removed", Duration::from_secs(60), |s| {
        copies_on_up_daemons(s) == total
    });
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    verify_on_replicas(&c, &[1, 2, 3, 4], 32, &objects, 3).await;
}

/// A copy holding a write that was never acknowledged (it reached that copy only) and
/// marked incomplete, whose source then crashes: the other copies are complete but older.
/// The daemons' membership history shows that a complete copy was an acting member at the
/// epoch of that write throughout (so the write cannot have been acknowledged): that copy
/// is the authority, the write is rolled back, and the group serves again at once instead
/// of waiting for ever for the crashed source (the data simulator's seed 17 case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_copy_with_an_unacknowledged_write_does_not_stop_the_group() {
    use spindle_proto::msg::{typed, Mutation, Ver};
    use spindle_proto::net::RpcConn;
    let c = start("members", 3, &["--out-after-ms", "0"]);
    run_ok(
        spindle()
            .args(["pool", "create", "one", "--size", "3", "--pg-count", "1"])
            .arg("--dir")
            .arg(&c.dir),
    );
    let pool_one = 2; // created after "default" (id 1)
    let client = c.client().await;
    let mut objects = BTreeMap::new();
    for i in 0..20 {
        let n = format!("obj-{i}");
        client
            .write_full("one", &n, content(&n, 1, 4096))
            .await
            .unwrap();
        objects.insert(n, (1u64, 4096usize));
    }
    c.wait_clean();
    let epoch = c.status()["epoch"].as_u64().expect("epoch in status");
    assert!(client.wait_for_epoch(epoch, 10_000).await);
    let map = client.map();
    assert_eq!(map.epoch, epoch);
    let up = spindle_map::Placement::compute(&map)
        .pg(pool_one, 0)
        .unwrap()
        .up
        .clone();
    assert_eq!(up.len(), 3, "{up:?}");
    let (primary, x) = (up[0], up[1]);
    // Act as the primary towards copy x only: one more write at the current epoch (the
    // third copy never gets it, so it could never have been acknowledged), then x is
    // marked incomplete, as a copy being caught up is.
    // With the primary's own key: its ticket (and the service key) from the monitors,
    // then a ticket of its own, as the daemon makes for its peers.
    let primary_key = spindle_proto::auth::Keyring::load(&c.osd_dir(primary).join("keyring"))
        .unwrap()
        .identity(&format!("osd.{primary}"))
        .unwrap();
    let creds = spindle_proto::tickets::Credentials::new(primary_key);
    let mon = RpcConn::connect_auth(
        &spindle_proto::transport::Tcp,
        &c.mon_addr_of(0),
        2000,
        None,
        &creds.mon_auth(),
    )
    .await
    .unwrap();
    creds.fetch_ticket(&mon).await.unwrap();
    let conn = RpcConn::connect_auth(
        &spindle_proto::transport::Tcp,
        &map.osds[&x].addr,
        2000,
        None,
        &creds.self_ticket().expect("a daemon gets the service key"),
    )
    .await
    .unwrap();
    let info = conn
        .request(
            epoch,
            typed::PgQuery {
                pool: pool_one,
                pg: 0,
            },
            5000,
        )
        .await
        .unwrap();
    let ghost = Ver {
        epoch,
        seq: info.last_version.seq + 1,
    };
    conn.request(
        epoch,
        typed::RepWrite {
            pool: pool_one,
            pg: 0,
            name: "ghost".into(),
            version: ghost,
            mutation: Mutation::WriteFull(b"never acknowledged".to_vec()),
        },
        5000,
    )
    .await
    .unwrap();
    conn.request(
        epoch,
        typed::PgMark {
            pool: pool_one,
            pg: 0,
            incomplete: true,
        },
        5000,
    )
    .await
    .unwrap();
    // The source of the catch-up (the primary) crashes.
    c.kill_osd(primary);
    c.wait_osd_up(primary, false);
    // The group serves again: a write is acknowledged (without the membership history it
    // waited, incomplete, for the crashed copy).
    tokio::time::timeout(
        Duration::from_secs(30),
        client.write_full("one", "after", content("after", 1, 100)),
    )
    .await
    .expect("the group serves again with its primary down")
    .unwrap();
    objects.insert("after".to_string(), (1, 100));
    assert!(
        client.read_full("one", "ghost").await.is_err(),
        "the unacknowledged write was rolled back"
    );
    c.start_osd(primary);
    c.wait_clean();
    for (n, (g, len)) in &objects {
        let data = client.read_full("one", n).await.unwrap();
        assert!(data == content(n, *g, *len), "{n} differs");
    }
    run_ok(spindle().arg("down").arg("--dir").arg(&c.dir));
    for osd in 0..3 {
        let store = spindle_store::Store::open(spindle_store::StoreConfig::new(
            c.osd_dir(osd).join("store"),
        ))
        .unwrap();
        let pgid = spindle_store::PgId {
            pool: pool_one,
            pg: 0,
        };
        assert!(
            store.stat(pgid, "ghost").is_none(),
            "osd.{osd} still holds the rolled-back write"
        );
        for n in objects.keys() {
            assert!(store.stat(pgid, n).is_some(), "osd.{osd} lacks {n}");
        }
        store.shutdown().unwrap();
    }
}
