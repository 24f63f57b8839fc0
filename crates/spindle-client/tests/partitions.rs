//! A whole cluster in one process (the real monitor, three real storage daemons with their
//! stores on disk, the real client) over the in-process stream network
//! (`spindle_proto::transport::mem`), so that hosts can be partitioned from each other,
//! which separate processes on one machine's loopback cannot be. Every acknowledged write
//! is read back exactly after the partition heals and the cluster is clean, and scrub
//! finds every copy identical.

use spindle_client::{Client, ClientConfig};
use spindle_mon::reply::unsettled_pgs;
use spindle_mon::{Admin, BoundMonitor, InitSpec, MonConfig, Status};
use spindle_osd::{Osd, OsdConfig};
use spindle_proto::transport::mem::{MemNet, MemNetConfig};
use spindle_proto::transport::Net;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const DAEMONS: u32 = 3;
const POOL: &str = "default";
const MON: &str = "mon:6789";

/// Removes the cluster's directory however the test ends.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Cluster {
    net: MemNet,
    client: Client,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: Scratch,
}

fn hosts() -> Vec<String> {
    let mut h = vec![
        "mon".to_string(),
        "client".to_string(),
        "reader".to_string(),
    ];
    h.extend((0..DAEMONS).map(|i| format!("osd.{i}")));
    h
}

impl Cluster {
    async fn start(name: &str) -> Cluster {
        let dir = Scratch(
            std::env::temp_dir().join(format!("spindle-partitions-{name}-{}", std::process::id())),
        );
        let _ = std::fs::remove_dir_all(&dir.0);
        let net = MemNet::new(MemNetConfig {
            seed: 7,
            delay_ms_min: 0,
            delay_ms_max: 1,
            ..MemNetConfig::default()
        });
        let mon_dir = dir.0.join("mon");
        let spec = InitSpec {
            osd_count: DAEMONS,
            osd_hosts: Vec::new(),
            default_pool: Some((POOL.into(), 3, 2, 8)),
        };
        spindle_mon::init(&mon_dir, &spec).unwrap();
        let mut config = MonConfig::new(&mon_dir);
        config.listen = MON.into();
        config.net = Net::Mem(net.host("mon"));
        config.down_after_ms = 1_500;
        config.out_after_ms = 0;
        let mon = BoundMonitor::bind(config).await.unwrap();
        let (mut stops, mut tasks) = (Vec::new(), Vec::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(tx);
        tasks.push(tokio::spawn(async move {
            mon.run(async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        }));
        for id in 0..DAEMONS {
            let mut c = OsdConfig::new(id, dir.0.join(format!("osd.{id}")), MON);
            c.listen = format!("osd.{id}:6800");
            c.net = Net::Mem(net.host(&format!("osd.{id}")));
            c.heartbeat_ms = 200;
            c.replica_timeout_ms = 1_000;
            std::fs::create_dir_all(&c.dir).unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stops.push(tx);
            tasks.push(tokio::spawn(async move {
                Osd::run(c, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            }));
        }
        let mut cc = ClientConfig::new(MON);
        cc.net = Net::Mem(net.host("client"));
        let client = Client::connect(cc).await.unwrap();
        let cluster = Cluster {
            net,
            client,
            stops,
            tasks,
            _dir: dir,
        };
        cluster.wait_clean(Duration::from_secs(30)).await;
        cluster
    }

    async fn status(&self) -> Status {
        self.client.admin(&Admin::status()).await.unwrap()
    }

    /// Waits until every daemon is up and every group is settled (active and clean).
    async fn wait_clean(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            let s = self.status().await;
            let up = s.osds.iter().filter(|o| o.up).count() as u32;
            let clean = s.pgs.get("clean").copied().unwrap_or(0);
            let pgs: u64 = s.pools.iter().map(|p| p.pg_count as u64).sum();
            if up == DAEMONS && unsettled_pgs(&s.pgs) == 0 && clean == pgs {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "not clean after {limit:?}: {up} daemons up, groups {:?}",
                s.pgs
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the monitor has marked daemon `id` down.
    async fn wait_down(&self, id: u32) {
        let start = Instant::now();
        while self.status().await.osds.iter().any(|o| o.id == id && o.up) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "osd.{id} is still up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Cuts `host` off from every other host (connections stall, connects hang).
    fn isolate(&self, host: &str) {
        for h in hosts().iter().filter(|h| *h != host) {
            self.net.partition(host, h);
        }
    }

    fn rejoin(&self, host: &str) {
        for h in hosts().iter().filter(|h| *h != host) {
            self.net.heal(host, h);
        }
    }

    async fn stop(self) {
        for s in self.stops {
            let _ = s.send(());
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

fn content(object: usize, generation: u32) -> Vec<u8> {
    let len = 1_000 + object * 997 % 20_000;
    (0..len)
        .map(|j| (object as u32 * 131 + generation * 17 + j as u32) as u8)
        .collect()
}

/// Writes generation `g` of objects `0..n`, all at once; returns how long it took.
async fn write_all(
    client: &Client,
    n: usize,
    g: u32,
    acked: &mut BTreeMap<usize, Vec<u8>>,
) -> Duration {
    write_pool(client, POOL, n, g, acked).await
}

async fn write_pool(
    client: &Client,
    pool: &str,
    n: usize,
    g: u32,
    acked: &mut BTreeMap<usize, Vec<u8>>,
) -> Duration {
    let start = Instant::now();
    let writes = (0..n).map(|i| {
        let client = client.clone();
        async move {
            let data = content(i, g);
            client
                .write_full(pool, &format!("obj-{i}"), data.clone())
                .await
                .map(|_| (i, data))
        }
    });
    for r in futures::future::join_all(writes).await {
        let (i, data) = r.unwrap_or_else(|e| panic!("generation {g}: a write failed: {e}"));
        acked.insert(i, data);
    }
    start.elapsed()
}

/// Every acknowledged write reads back exactly, and scrub finds every copy identical.
async fn check(cluster: &Cluster, acked: &BTreeMap<usize, Vec<u8>>) {
    check_pool(cluster, POOL, acked).await
}

async fn check_pool(cluster: &Cluster, pool: &str, acked: &BTreeMap<usize, Vec<u8>>) {
    check_reads(cluster, pool, acked).await;
    let scrub = cluster.client.scrub(pool).await.unwrap();
    assert_eq!(scrub.objects, acked.len() as u64, "{scrub:?}");
    assert_eq!(scrub.inconsistent, 0, "{scrub:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_everyone_is_marked_down_and_writes_go_on() {
    let cluster = Cluster::start("replica").await;
    let mut acked = BTreeMap::new();
    write_all(&cluster.client, 24, 0, &mut acked).await;
    cluster.isolate("osd.2");
    // The monitor marks it down after 1.5 s; groups re-peer without it (size 3, min 2).
    let took = write_all(&cluster.client, 24, 1, &mut acked).await;
    eprintln!("writes with osd.2 cut off took {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    cluster.wait_down(2).await;
    cluster.rejoin("osd.2");
    cluster.wait_clean(Duration::from_secs(60)).await;
    write_all(&cluster.client, 24, 2, &mut acked).await;
    check(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_cut_off_from_the_monitor_only_loses_no_acknowledged_write() {
    let cluster = Cluster::start("monitor").await;
    let mut acked = BTreeMap::new();
    write_all(&cluster.client, 24, 0, &mut acked).await;
    // osd.0 still talks to the other daemons and the client, but the monitor marks it
    // down: its groups move to new primaries while it may still act on its old map.
    cluster.net.partition("osd.0", "mon");
    let took = write_all(&cluster.client, 24, 1, &mut acked).await;
    eprintln!("writes with osd.0 cut from the monitor took {took:?}");
    cluster.wait_down(0).await;
    let took = write_all(&cluster.client, 24, 2, &mut acked).await;
    eprintln!("writes with osd.0 cut from the monitor and marked down took {took:?}");
    cluster.net.heal("osd.0", "mon");
    cluster.wait_clean(Duration::from_secs(60)).await;
    check(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_that_cannot_talk_stall_their_groups_until_healed_and_lose_nothing() {
    let cluster = Cluster::start("pair").await;
    let mut acked = BTreeMap::new();
    write_all(&cluster.client, 24, 0, &mut acked).await;
    // Both still heartbeat to the monitor, so neither is marked down: groups holding both
    // cannot replicate until the link heals (daemons do not report failed peers yet).
    cluster.net.partition("osd.0", "osd.1");
    let net = cluster.net.clone();
    let healer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        net.heal("osd.0", "osd.1");
    });
    let took = write_all(&cluster.client, 24, 1, &mut acked).await;
    eprintln!("writes with osd.0 and osd.1 unable to talk took {took:?}");
    healer.await.unwrap();
    cluster.wait_clean(Duration::from_secs(60)).await;
    check(&cluster, &acked).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_coded_pool_keeps_writing_with_a_shard_cut_off_and_heals() {
    let cluster = Cluster::start("ec").await;
    // k=2, m=1 on three daemons; min_size 2, so one shard may be missing.
    cluster
        .client
        .admin(&Admin::pool_create_ec("ec", 2, 1, 2, 0, 4096, 8))
        .await
        .unwrap();
    cluster.wait_clean(Duration::from_secs(30)).await;
    let mut acked = BTreeMap::new();
    write_pool(&cluster.client, "ec", 16, 0, &mut acked).await;
    cluster.isolate("osd.1");
    let took = write_pool(&cluster.client, "ec", 16, 1, &mut acked).await;
    eprintln!("EC writes with osd.1 cut off took {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Reads decode from the two shards left.
    check_reads(&cluster, "ec", &acked).await;
    cluster.rejoin("osd.1");
    cluster.wait_clean(Duration::from_secs(60)).await;
    check_pool(&cluster, "ec", &acked).await;
    cluster.stop().await;
}

/// A client on host "reader" (operations time out after `op_timeout_ms`) that has read
/// obj-0, and obj-0's primary.
async fn reader_and_primary(cluster: &Cluster, op_timeout_ms: u64) -> (Client, u32) {
    let mut cc = ClientConfig::new(MON);
    cc.net = Net::Mem(cluster.net.host("reader"));
    cc.op_timeout_ms = op_timeout_ms;
    let reader = Client::connect(cc).await.unwrap();
    assert_eq!(
        reader.read_full(POOL, "obj-0").await.unwrap(),
        content(0, 0)
    );
    let map = reader.map();
    let pool = map.pool_by_name(POOL).unwrap();
    let pg = spindle_map::object_pg("obj-0", pool.pg_count);
    let view = spindle_map::MapView::decode(&map.encode()).unwrap();
    let primary = view.placement.pg(pool.id, pg).unwrap().primary().unwrap();
    (reader, primary)
}

/// Cuts daemon `primary` and the reader off from every other host (the two still reach
/// each other: the reader keeps the old map and can ask only the old primary).
fn cut_off_with_reader(cluster: &Cluster, primary: u32) {
    let p = format!("osd.{primary}");
    for h in hosts().iter().filter(|h| **h != p && *h != "reader") {
        cluster.net.partition(&p, h);
        cluster.net.partition("reader", h);
    }
}

fn heal_with_reader(cluster: &Cluster, primary: u32) {
    let p = format!("osd.{primary}");
    for h in hosts() {
        cluster.net.heal(&p, &h);
        cluster.net.heal("reader", &h);
    }
}

/// A primary cut off from the monitor, its copies and the writer, while a reader with the
/// old map still reaches it (and nothing else): the monitor marks it down, a new primary
/// takes a write, and the old primary must not answer the reader with the data the write
/// replaced (its read lease from the copies ran out; `spindle-osd/src/lease.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_primary_serves_no_stale_read_to_a_client_with_the_old_map() {
    let cluster = Cluster::start("lease").await;
    let mut acked = BTreeMap::new();
    write_all(&cluster.client, 8, 0, &mut acked).await;
    let (reader, primary) = reader_and_primary(&cluster, 6_000).await;
    cut_off_with_reader(&cluster, primary);
    cluster.wait_down(primary).await;
    let took = write_all(&cluster.client, 1, 1, &mut acked).await;
    eprintln!("write through the new primary took {took:?}");
    let started = Instant::now();
    let r = reader.read_full(POOL, "obj-0").await;
    eprintln!(
        "the reader on the old map got {:?} after {:?}",
        r.as_ref().map(|d| d.len()),
        started.elapsed()
    );
    // The reader reaches nothing that has the new data: the only right answers are the
    // new data (impossible here) or an error.
    if let Ok(data) = r {
        assert!(
            data == content(0, 1),
            "a stale read: the old primary returned the data the acknowledged write replaced"
        );
    }
    heal_with_reader(&cluster, primary);
    cluster.wait_clean(Duration::from_secs(60)).await;
    // It was the lease that refused: the old primary counted the reads it turned away.
    let s = cluster.status().await;
    let refused = s.osds[primary as usize]
        .counters
        .get("reads_without_lease")
        .copied()
        .unwrap_or(0);
    assert!(
        refused > 0,
        "osd.{primary} refused no read: {:?}",
        s.osds[primary as usize].counters
    );
    check(&cluster, &acked).await;
    assert_eq!(
        reader.read_full(POOL, "obj-0").await.unwrap(),
        content(0, 1)
    );
    cluster.stop().await;
}

/// The same, but the primary is moved by an administrator (`osd out`) the moment it is
/// cut off, so the new primary could take writes at once while the old one still holds
/// a read lease: the copies hold back the new primary's peering until that lease ran out,
/// so the write is acknowledged only after the old primary stopped serving reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_moved_by_an_administrator_waits_out_the_old_primary_s_read_lease() {
    let cluster = Cluster::start("lease-out").await;
    let mut acked = BTreeMap::new();
    write_all(&cluster.client, 8, 0, &mut acked).await;
    let (reader, primary) = reader_and_primary(&cluster, 3_000).await;
    cut_off_with_reader(&cluster, primary);
    let cut = Instant::now();
    cluster
        .client
        .admin(&Admin::osd(spindle_mon::OsdVerb::Out, primary))
        .await
        .unwrap();
    write_all(&cluster.client, 1, 1, &mut acked).await;
    let acked_after = cut.elapsed();
    let r = reader.read_full(POOL, "obj-0").await;
    eprintln!(
        "write acknowledged {acked_after:?} after the cut; the reader on the old map got {:?}",
        r.as_ref().map(|d| d.len())
    );
    if let Ok(data) = r {
        assert!(
            data == content(0, 1),
            "a stale read: the old primary returned the data the acknowledged write replaced"
        );
    }
    heal_with_reader(&cluster, primary);
    cluster
        .client
        .admin(&Admin::osd(spindle_mon::OsdVerb::In, primary))
        .await
        .unwrap();
    cluster.wait_clean(Duration::from_secs(60)).await;
    check(&cluster, &acked).await;
    cluster.stop().await;
}

async fn check_reads(cluster: &Cluster, pool: &str, acked: &BTreeMap<usize, Vec<u8>>) {
    for (i, want) in acked {
        let got = cluster
            .client
            .read_full(pool, &format!("obj-{i}"))
            .await
            .unwrap();
        assert!(
            got == *want,
            "obj-{i}: the acknowledged write is not what reads return"
        );
    }
}

/// Large whole-object writes (512 KiB: the stores' direct path) while the connections
/// between the daemons and the client's are reset in the middle of transfers (a primary's
/// forward to its replicas is cut mid-frame), and while the client gives up on some writes
/// after a few milliseconds (the future dropped: cancelled in flight). An acknowledged
/// write must read back exactly; an unacknowledged one leaves its object as one of the
/// writes issued since the last acknowledged one (or that one), never a mix; and once the
/// cluster is clean, scrub finds every copy identical: a write is durable on all copies and
/// acknowledged, or not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_and_cancellation_in_the_middle_of_large_writes_lose_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const OBJECTS: usize = 6;
    const GENERATIONS: u32 = 30;
    let cluster = Cluster::start("cut").await;
    let connections_before = cluster.net.connections();
    let big = |i: usize, g: u32| -> Vec<u8> {
        let seed = (i as u32 * 7919) ^ (g * 104_729);
        (0..(512usize << 10))
            .map(|j| (seed.wrapping_add(j as u32 / 3) ^ (j as u32 >> 11)) as u8)
            .collect()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (net, stop) = (cluster.net.clone(), stop.clone());
        tokio::spawn(async move {
            let links = [
                ("osd.0", "osd.1"),
                ("osd.1", "osd.2"),
                ("osd.0", "osd.2"),
                ("client", "osd.0"),
                ("client", "osd.1"),
                ("client", "osd.2"),
            ];
            let mut resets = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(25 + resets % 7 * 10)).await;
                let (a, b) = links[(resets * 5 % links.len() as u64) as usize];
                net.reset(a, b);
                resets += 1;
            }
            resets
        })
    };
    // Per object: the contents a read may return (None: absent).
    let mut allowed: BTreeMap<usize, Vec<Option<Vec<u8>>>> =
        (0..OBJECTS).map(|i| (i, vec![None])).collect();
    let (mut acked, mut cancelled, mut failed) = (0u32, 0u32, 0u32);
    for g in 0..GENERATIONS {
        let writes = (0..OBJECTS).map(|i| {
            let client = cluster.client.clone();
            let data = big(i, g);
            async move {
                let name = format!("big-{i}");
                let write = client.write_full(POOL, &name, data.clone());
                // Every third write is given up after 1-8 ms: cancelled in flight.
                let outcome = if (i + g as usize).is_multiple_of(3) {
                    let limit = Duration::from_millis(1 + (i as u64 * 3 + g as u64) % 8);
                    match tokio::time::timeout(limit, write).await {
                        Ok(r) => r.map(|_| true).map_err(|e| e.to_string()),
                        Err(_) => Ok(false),
                    }
                } else {
                    write.await.map(|_| true).map_err(|e| e.to_string())
                };
                (i, data, outcome)
            }
        });
        for (i, data, outcome) in futures::future::join_all(writes).await {
            let a = allowed.entry(i).or_default();
            match outcome {
                Ok(true) => {
                    acked += 1;
                    *a = vec![Some(data)];
                }
                Ok(false) => {
                    cancelled += 1;
                    a.push(Some(data));
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("generation {g}: big-{i} not acknowledged: {e}");
                    a.push(Some(data));
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let resets = resetter.await.unwrap();
    // Connections the resets broke were made again.
    let reconnects = cluster.net.connections() - connections_before;
    eprintln!(
        "{acked} acknowledged, {cancelled} cancelled, {failed} failed; {resets} resets, \
         {reconnects} new connections"
    );
    assert!(resets >= 40, "only {resets} resets");
    assert!(
        reconnects >= 10,
        "only {reconnects} connections were made again"
    );
    assert!(cancelled > 0, "no write was cancelled in flight");
    assert!(
        acked >= GENERATIONS * OBJECTS as u32 / 2,
        "only {acked} acknowledged"
    );
    cluster.wait_clean(Duration::from_secs(60)).await;
    let mut present = 0u64;
    for (i, allowed) in &allowed {
        let got = match cluster.client.read_full(POOL, &format!("big-{i}")).await {
            Ok(d) => Some(d),
            Err(e) if e.to_string().contains("not found") || e.to_string().contains("NotFound") => {
                None
            }
            Err(e) => panic!("big-{i}: read failed: {e}"),
        };
        present += u64::from(got.is_some());
        assert!(
            allowed.contains(&got),
            "big-{i}: reads return {:?} bytes, which is none of the {} writes allowed",
            got.as_ref().map(Vec::len),
            allowed.len()
        );
    }
    let scrub = cluster.client.scrub(POOL).await.unwrap();
    assert_eq!(scrub.objects, present, "{scrub:?}");
    assert_eq!(scrub.inconsistent, 0, "{scrub:?}");
    cluster.stop().await;
}

/// Fencing at the daemons: once client B takes over the image lock client A held, every
/// primary refuses A's writes (`Fenced`, final: not retried until the timeout), while B
/// writes on; A's refused write changed nothing.
///
/// B writes each object before A tries: B's requests carry the fencing epoch, so the
/// primary has that map before A's write reaches it. (Without that, a primary still on the
/// older map may apply A's write, and A's attempt fail only later, when a replica with the
/// newer map refuses the copy; the retry is then refused as fenced, the write stays,
/// ordered before B's, and the client's error says that it may have landed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_client_writes_nothing() {
    let cluster = Cluster::start("fenced").await;
    let a = &cluster.client;
    let mut cc = ClientConfig::new(MON);
    cc.net = Net::Mem(cluster.net.host("client"));
    let b = Client::connect(cc).await.unwrap();
    a.lock_acquire(POOL, "vm", 30_000, "A", false)
        .await
        .unwrap();
    for i in 0..8 {
        a.write_full(POOL, &format!("img.vm.{i:016x}"), vec![0xa; 8192])
            .await
            .unwrap();
    }
    b.lock_acquire(POOL, "vm", 30_000, "B", true).await.unwrap();
    for i in 0..8 {
        let name = format!("img.vm.{i:016x}");
        b.write(POOL, &name, 4096, vec![0xb; 4096]).await.unwrap();
        let started = Instant::now();
        let e = a.write(POOL, &name, 0, vec![0xee; 4096]).await.unwrap_err();
        assert!(
            matches!(&e, spindle_client::ClientError::Fenced(m) if !m.contains("may have")),
            "{name}: {e:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "not retried");
        b.write(POOL, &name, 8192, vec![0xb; 4096]).await.unwrap();
        let got = b.read_full(POOL, &name).await.unwrap();
        assert_eq!(
            &got[..4096],
            &[0xa; 4096][..],
            "{name}: the fenced write landed"
        );
        assert_eq!(&got[4096..], &[0xb; 8192][..]);
    }
    // The daemons count them (reported with their next heartbeats).
    let started = Instant::now();
    loop {
        let refused: u64 = cluster
            .status()
            .await
            .osds
            .iter()
            .filter_map(|o| o.counters.get("fenced_writes_refused").copied())
            .sum();
        if refused >= 8 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "daemons counted {refused} refused writes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop().await;
}
