//! Typed administrative commands against an in-process monitor: the answer deserializes
//! into the command's reply type; a failed command is `ClientError::Command`; an answer
//! read as the wrong type is `ClientError::Protocol`.

use spindle_client::{Client, ClientConfig, ClientError};
use spindle_mon::{Admin, BoundMonitor, InitSpec, MonConfig, OsdVerb, PoolCreated, Status};

/// Removes the monitor's directory however the test ends.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Served = tokio::task::JoinHandle<Result<(), spindle_mon::MonError>>;

/// A new monitor (3 daemons in its map, pool `default`) served in this process: its
/// directory, address, stop switch and task.
async fn monitor(tag: &str) -> (Scratch, String, tokio::sync::oneshot::Sender<()>, Served) {
    let dir =
        Scratch(std::env::temp_dir().join(format!("spindle-client-{tag}-{}", std::process::id())));
    let spec = InitSpec {
        osd_count: 3,
        osd_hosts: Vec::new(),
        default_pool: Some(("default".into(), 3, 2, 8)),
    };
    spindle_mon::init(&dir.0, &spec).unwrap();
    let mon = BoundMonitor::bind(MonConfig::new(&dir.0)).await.unwrap();
    let addr = mon.addr.to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(mon.run(async move {
        let _ = stop_rx.await;
    }));
    (dir, addr, stop_tx, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_answers_are_typed() {
    let (_dir, addr, stop_tx, served) = monitor("admin").await;
    let client = Client::connect(ClientConfig::new(addr)).await.unwrap();

    let status: Status = client.admin(&Admin::status()).await.unwrap();
    assert_eq!(status.osds.len(), 3);
    assert_eq!(status.pools[0].name, "default");
    assert_eq!(status.pools[0].kind, "replicated");

    let created = client
        .admin(&Admin::pool_create("typed", 2, 1, 4))
        .await
        .unwrap();
    assert_eq!(created.pool, "typed");
    assert_eq!(created.epoch, status.epoch + 1);
    let pools = client.admin(&Admin::pool_ls()).await.unwrap();
    assert!(pools.iter().any(|p| p.name == "typed" && p.pg_count == 4));

    let marked = client.admin(&Admin::osd(OsdVerb::Out, 2)).await.unwrap();
    assert_eq!((marked.osd, marked.done), (2, OsdVerb::Out));

    // A command the monitor refuses: its message, as a command error.
    let e = client
        .admin(&Admin::pool_rm("no-such-pool"))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Command(_)), "{e:?}");
    // The status document read as a pool creation: a protocol error, not a default value.
    let e = client
        .command_as::<PoolCreated>(Admin::status().args())
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Protocol(_)), "{e:?}");

    let _ = stop_tx.send(());
    served.await.unwrap().unwrap();
}

/// The client's lock commands are the monitor's (`Admin::lock_*` builds the same
/// arguments), and two clients against a real monitor: the second is refused while the
/// first holds a live lease, takes over with `take_over`, and the first then learns at its
/// next renewal that it lost the lock (`Fenced`); the map lists it as fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_locks_between_two_clients() {
    assert_eq!(
        spindle_client::lock_acquire_args("p", "i", 0xab, 15_000, "h", true),
        Admin::lock_acquire("p", "i", 0xab, 15_000, "h", true).args()
    );
    assert_eq!(
        spindle_client::lock_args("renew", "p", "i", 7),
        Admin::lock_renew("p", "i", 7).args()
    );
    assert_eq!(
        spindle_client::lock_args("release", "p", "i", 7),
        Admin::lock_release("p", "i", 7).args()
    );

    let (_dir, addr, stop_tx, served) = monitor("locks").await;
    let a = Client::connect(ClientConfig::new(addr.clone()))
        .await
        .unwrap();
    let b = Client::connect(ClientConfig::new(addr)).await.unwrap();
    assert_ne!(a.client_id(), b.client_id());

    let grant = a
        .lock_acquire("default", "vm", 30_000, "A", false)
        .await
        .unwrap();
    assert_eq!((grant.generation, grant.taken_from.as_deref()), (1, None));
    assert!(a.epoch() >= grant.epoch);
    a.lock_renew("default", "vm").await.unwrap();

    let e = b
        .lock_acquire("default", "vm", 30_000, "B", false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Command(m) if m.contains("locked by A")),
        "{e:?}"
    );
    let grant = b
        .lock_acquire("default", "vm", 30_000, "B", true)
        .await
        .unwrap();
    assert_eq!(grant.generation, 2);
    assert!(grant.taken_from.unwrap().contains("A"));
    assert!(b.map().fenced.contains_key(&a.client_id()));

    let e = a.lock_renew("default", "vm").await.unwrap_err();
    assert!(matches!(e, ClientError::Fenced(_)), "{e:?}");
    // Releasing a lock one does not hold changes nothing; the holder's release frees it.
    a.lock_release("default", "vm").await.unwrap();
    assert_eq!(b.map().image_locks.len(), 1);
    b.lock_release("default", "vm").await.unwrap();
    assert!(b.wait_for_epoch(grant.epoch + 1, 5_000).await);
    assert!(b.map().image_locks.is_empty());

    let _ = stop_tx.send(());
    served.await.unwrap().unwrap();
}

/// A monitor directory of the single-monitor version (`mon.redb`, no Raft) becomes a group
/// of one at its next start and goes on from its epoch; preparing it to "join" (what
/// `spindle mon start` does for a directory without a Raft database) does not hide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_monitor_database_of_the_earlier_version_is_converted() {
    use spindle_mon::MapStore;
    let dir = Scratch(
        std::env::temp_dir().join(format!("spindle-client-convert-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let spec = InitSpec {
        osd_count: 3,
        osd_hosts: Vec::new(),
        default_pool: Some(("default".into(), 3, 2, 8)),
    };
    let mut map = spindle_mon::first_map(&spec, 0xfeed).unwrap();
    map.epoch = 41;
    spindle_mon::RedbMapStore::open(&dir.0.join("mon.redb"))
        .unwrap()
        .save(&map)
        .unwrap();
    spindle_mon::prepare_join(&dir.0, 0).unwrap();
    let mon = BoundMonitor::bind(MonConfig::new(&dir.0)).await.unwrap();
    let addr = mon.addr.to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(mon.run(async move {
        let _ = stop_rx.await;
    }));
    let client = Client::connect(ClientConfig::new(addr)).await.unwrap();
    assert_eq!(client.epoch(), 41);
    assert_eq!(client.map().cluster_id, 0xfeed);
    let created = client
        .admin(&Admin::pool_create("after", 2, 1, 4))
        .await
        .unwrap();
    assert_eq!(created.epoch, 42);
    let _ = stop_tx.send(());
    served.await.unwrap().unwrap();
}
