//! Three monitors and three storage daemons in one process over the in-process stream
//! network, where a host can be cut off silently (bytes wait, connections stay open, new
//! ones hang: no reset), as a dropped link does. A follower monitor that every daemon and
//! the client talk to is cut off: the daemons move to another monitor before the leader
//! would mark them down, and an administrative command moves on well before the old 30 s.

use spindle_client::{Client, ClientConfig};
use spindle_mon::{BoundMonitor, InitSpec, MonConfig, Status};
use spindle_osd::{Osd, OsdConfig};
use spindle_proto::transport::mem::{MemNet, MemNetConfig};
use spindle_proto::transport::Net;
use std::time::{Duration, Instant};

const DAEMONS: u32 = 3;
const MONS: u64 = 3;

struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mon_addr(i: u64) -> String {
    format!("mon{i}:6789")
}

fn all_hosts() -> Vec<String> {
    let mut h: Vec<String> = (0..MONS).map(|i| format!("mon{i}")).collect();
    h.push("client".into());
    h.push("watcher".into());
    h.extend((0..DAEMONS).map(|i| format!("osd.{i}")));
    h
}

async fn status(client: &Client) -> Status {
    client.admin(&spindle_mon::Admin::status()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_follower_monitor_marks_no_daemon_down_and_commands_move_on() {
    let dir =
        Scratch(std::env::temp_dir().join(format!("spindle-silent-mon-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let net = MemNet::new(MemNetConfig {
        seed: 11,
        delay_ms_min: 0,
        delay_ms_max: 1,
        ..MemNetConfig::default()
    });
    let mons: Vec<(std::path::PathBuf, String)> = (0..MONS)
        .map(|i| (dir.0.join(format!("mon{i}")), mon_addr(i)))
        .collect();
    let spec = InitSpec {
        osd_count: DAEMONS,
        osd_hosts: Vec::new(),
        default_pool: Some(("default".into(), 3, 2, 8)),
    };
    spindle_mon::init_monitors(&mons, &spec).unwrap();
    let (mut stops, mut tasks) = (Vec::new(), Vec::new());
    for (i, (mdir, addr)) in mons.iter().enumerate() {
        let mut config = MonConfig::new(mdir);
        config.listen = addr.clone();
        config.net = Net::Mem(net.host(&format!("mon{i}")));
        config.out_after_ms = 0;
        let mon = BoundMonitor::bind(config).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(tx);
        tasks.push(tokio::spawn(async move {
            mon.run(async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        }));
    }
    // Wait for a leader; every daemon and the client talk to a follower first.
    let all: String = (0..MONS).map(mon_addr).collect::<Vec<_>>().join(",");
    let mut cc = ClientConfig::new(&all);
    cc.net = Net::Mem(net.host("watcher"));
    let probe = Client::connect(cc).await.unwrap();
    let start = Instant::now();
    let leader = loop {
        if let Ok(v) = probe.command(&["mon", "ls"]).await {
            if let Some(l) = v["leader"].as_u64() {
                break l;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(probe);
    let follower = (0..MONS).find(|&i| i != leader).unwrap();
    let others: Vec<String> = (0..MONS).filter(|&i| i != follower).map(mon_addr).collect();
    let list = format!("{},{}", mon_addr(follower), others.join(","));
    for id in 0..DAEMONS {
        let mut c = OsdConfig::new(id, dir.0.join(format!("osd.{id}")), list.as_str());
        c.listen = format!("osd.{id}:6800");
        c.net = Net::Mem(net.host(&format!("osd.{id}")));
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
    let mut cc = ClientConfig::new(&list);
    cc.net = Net::Mem(net.host("client"));
    let client = Client::connect(cc).await.unwrap();
    // The watcher talks to the leader.
    let mut cc = ClientConfig::new(format!("{},{}", mon_addr(leader), all));
    cc.net = Net::Mem(net.host("watcher"));
    let watcher = Client::connect(cc).await.unwrap();
    let start = Instant::now();
    loop {
        let s = status(&client).await;
        if s.osds.iter().filter(|o| o.up).count() as u32 == DAEMONS {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{:?}", s.osds);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A test machine's nearly full disk must not change the map during the test (the
    // daemons' nearfull flags would): the ratios go to the top first, and the flags
    // settle.
    client
        .admin(&spindle_mon::Admin::set_ratio(true, 1_000_000))
        .await
        .unwrap();
    client
        .admin(&spindle_mon::Admin::set_ratio(false, 1_000_000))
        .await
        .unwrap();
    loop {
        let s = status(&client).await;
        if s.osds.iter().all(|o| !o.nearfull && !o.full) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{:?}", s.osds);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let epoch = status(&watcher).await.epoch;

    // Cut the follower off from every other host, silently.
    let cut = format!("mon{follower}");
    for h in all_hosts().iter().filter(|h| **h != cut) {
        net.partition(&cut, h);
    }
    // For 5 s (2.5 down intervals), nobody is marked down.
    let cut_at = Instant::now();
    while cut_at.elapsed() < Duration::from_secs(5) {
        let s = status(&watcher).await;
        let down: Vec<u32> = s.osds.iter().filter(|o| !o.up).map(|o| o.id).collect();
        assert!(
            down.is_empty(),
            "{down:?} marked down {:?} after the monitor was cut",
            cut_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = status(&watcher).await;
    assert_eq!(s.epoch, epoch, "no map change: {:?}", s.osds);

    // The client's connection is to the silent monitor: its command moves on after the
    // attempt timeout, not after 30 s.
    let asked = Instant::now();
    let s = status(&client).await;
    let took = asked.elapsed();
    eprintln!("status through a silent monitor took {took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(s.osds.iter().all(|o| o.up));

    for h in all_hosts().iter().filter(|h| **h != cut) {
        net.heal(&cut, h);
    }
    for s in stops {
        let _ = s.send(());
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
}
