//! `spindle-mon`: the monitor. It owns the cluster map, bumps its epoch on every change,
//! persists it before anyone sees it ([`MapStore`]), pushes each new epoch to subscribers,
//! marks daemons down when they miss heartbeats for `down_after_ms`, and answers
//! administrative commands (`status`, `pool create|rm|ls`, `osd out|in|down`, `crush set`).
//!
//! Every decision is made by [`MonCore`] (no I/O: events in, next map out); [`MonNode`]
//! (the core and its map store) turns a request or a tick into the maps to publish and
//! the reply; `Monitor` is the shell that runs it over the network (the simulator runs
//! the same node over its simulated one).
//!
//! Invariants:
//! - an epoch is visible (replied, pushed) only after `MapStore::save` returned, so a
//!   monitor restart never goes back in time;
//! - epochs strictly increase by one per change;
//! - malformed requests get an error reply; the monitor never panics on input.

pub mod command;
pub mod core;
mod locks;
pub mod node;
pub mod reply;
mod status;
mod store;

pub use command::{AdminCommand, OsdVerb};
pub use core::{propose, MapChange, MonCore, MonTiming};
pub use node::{Committed, Handled, MonNode};
pub use reply::{
    Admin, AdminReply, ClusterRecovery, CrushSet, ErasureStatus, HealthCheck, HealthReport,
    ImageLocked, InconsistentPg, LockReleased, LockRenewed, OsdAdded, OsdMarked, OsdStatus,
    PoolCreated, PoolRecovery, PoolRemoved, PoolStatus, RatioSet, Status,
};
pub use status::{status, Health, Severity};
pub use store::{MapStore, MapStoreError, MemMapStore, RedbMapStore};

use spindle_map::{ClusterMap, OsdInfo, PoolKind};
use spindle_proto::net::{accept_loop_via, Incoming, Replier, Service};
use spindle_proto::transport::{Net, NetListener};
use spindle_proto::Msg;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum MonError {
    #[error(transparent)]
    Store(#[from] MapStoreError),
    #[error("monitor: {0}")]
    Io(#[from] std::io::Error),
    #[error("monitor: {0}")]
    Map(#[from] spindle_map::MapError),
    #[error("monitor has no cluster map in {0}; run `spindle up` (or `spindle mon init`) first")]
    NotInitialized(PathBuf),
}

#[derive(Clone, Debug)]
pub struct MonConfig {
    /// Directory of the monitor's database.
    pub dir: PathBuf,
    /// Address to listen on (`127.0.0.1:0` picks a port).
    pub listen: String,
    /// A daemon that sends no heartbeat for this long is marked down.
    pub down_after_ms: u64,
    /// A daemon down for this long is marked out, so its data is re-created elsewhere
    /// (0 = never).
    pub out_after_ms: u64,
    /// TCP, or an in-process network in tests.
    pub net: Net,
}

impl MonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MonConfig {
            dir: dir.into(),
            listen: "127.0.0.1:0".to_string(),
            down_after_ms: 2000,
            out_after_ms: 30_000,
            net: Net::Tcp,
        }
    }
    fn db_path(&self) -> PathBuf {
        self.dir.join("mon.redb")
    }
}

/// Settings of a new cluster.
#[derive(Clone, Debug)]
pub struct InitSpec {
    pub osd_count: u32,
    /// Default pool created with the cluster: (name, size, min_size, pg_count).
    pub default_pool: Option<(String, u32, u32, u32)>,
}

/// The first map (epoch 1) of a new cluster with id `cluster_id`: `spec.osd_count`
/// daemons (down, in, weight 1) under the embedded CRUSH map, and the default pool.
pub fn first_map(spec: &InitSpec, cluster_id: u64) -> Result<ClusterMap, MonError> {
    let ids: Vec<u32> = (0..spec.osd_count).collect();
    let mut map = ClusterMap {
        cluster_id,
        epoch: 1,
        osds: ids.iter().map(|&id| (id, OsdInfo::joining(id))).collect(),
        pools: Default::default(),
        crush: spindle_map::embedded_crush_map(&ids)?,
        nearfull_ratio_ppm: spindle_map::NEARFULL_RATIO_PPM_DEFAULT,
        full_ratio_ppm: spindle_map::FULL_RATIO_PPM_DEFAULT,
        image_locks: Default::default(),
        fenced: Default::default(),
    };
    if let Some((name, size, min_size, pg_count)) = &spec.default_pool {
        map.add_pool(
            name,
            PoolKind::Replicated {
                size: *size,
                min_size: *min_size,
            },
            *pg_count,
            0,
        )?;
    }
    Ok(map)
}

/// Creates the first map of a new cluster in `dir` (fails if one exists).
pub fn init(dir: &std::path::Path, spec: &InitSpec) -> Result<ClusterMap, MonError> {
    std::fs::create_dir_all(dir)?;
    let mut store = RedbMapStore::open(&dir.join("mon.redb"))?;
    if let Some(existing) = store.load()? {
        return Ok(existing);
    }
    let map = first_map(spec, rand::random())?;
    store.save(&map)?;
    Ok(map)
}

/// A running monitor (shared by its tasks).
pub struct Monitor {
    node: Mutex<MonNode>,
    map_tx: watch::Sender<Arc<Vec<u8>>>,
    /// The core's clock: milliseconds since the monitor started.
    started: Instant,
}

impl Monitor {
    fn lock(&self) -> MutexGuard<'_, MonNode> {
        // A poisoned lock means a bug panicked mid-update; keep serving the last state.
        self.node.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch()
    }

    /// Publishes what the node committed (under its lock, so epochs go out in order) and
    /// logs it (`warn`: changes nobody asked for, such as a daemon marked down).
    fn publish(&self, h: &Handled, warn: bool) {
        for c in &h.committed {
            if warn {
                tracing::warn!("{} (epoch {})", c.reason, c.epoch);
            } else {
                tracing::info!("{} (epoch {})", c.reason, c.epoch);
            }
            self.map_tx.send_replace(c.bytes.clone());
        }
        for f in &h.failed {
            tracing::error!("{f}");
        }
    }

    fn handle(self: &Arc<Self>, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        let h = {
            let mut node = self.lock();
            let h = node.on_request(self.now_ms(), inc.epoch, inc.msg);
            self.publish(&h, false);
            h
        };
        if let Some(msg) = &h.reply {
            reply.send(rid, h.epoch, msg);
        }
        if let Some(have_epoch) = h.subscribe {
            self.subscribe(have_epoch, reply);
        }
    }

    /// Pushes the current map if newer than `have_epoch`, then every later epoch, until
    /// the connection closes (not merely until the next epoch).
    fn subscribe(self: &Arc<Self>, have_epoch: u64, reply: Replier) {
        let mut rx = self.map_tx.subscribe();
        let mut bytes = rx.borrow_and_update().clone();
        let me = self.clone();
        tokio::spawn(async move {
            let mut have = have_epoch;
            loop {
                let e = me.epoch();
                if have < e {
                    if !reply.send(
                        0,
                        e,
                        &Msg::MapUpdate {
                            map: bytes.to_vec(),
                        },
                    ) {
                        return;
                    }
                    have = e;
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() {
                        return;
                    },
                    () = reply.closed() => return,
                }
                bytes = rx.borrow_and_update().clone();
            }
        });
    }

    /// The `spindle status` document.
    pub fn status(&self) -> Status {
        status::status(self.lock().core())
    }

    /// Marks down (then out) the daemons the core finds due.
    fn check_heartbeats(&self) {
        let mut node = self.lock();
        let h = node.on_tick(self.now_ms());
        self.publish(&h, true);
    }
}

#[derive(Clone)]
struct MonService(Arc<Monitor>);

impl Service for MonService {
    fn epoch(&self) -> u64 {
        self.0.epoch()
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        self.0.handle(inc, reply)
    }
}

/// A bound, loaded monitor, ready to serve.
pub struct BoundMonitor {
    /// The address clients and daemons use (a TCP port 0 became the port picked).
    pub addr: String,
    listener: NetListener,
    net: Net,
    mon: Arc<Monitor>,
}

impl BoundMonitor {
    /// Loads the map from `config.dir` and binds the listener.
    pub async fn bind(config: MonConfig) -> Result<BoundMonitor, MonError> {
        let store = RedbMapStore::open(&config.db_path())?;
        let map = store
            .load()?
            .ok_or_else(|| MonError::NotInitialized(config.dir.clone()))?;
        let (listener, addr) = config.net.bind(&config.listen).await?;
        let (map_tx, _) = watch::channel(Arc::new(map.encode()));
        tracing::info!(
            "monitor listening on {addr}, cluster {:016x}, epoch {}",
            map.cluster_id,
            map.epoch
        );
        let mon = Arc::new(Monitor {
            // Every daemon the map calls up gets a full grace period after a monitor restart.
            // Every daemon the map calls up gets a full grace period after a monitor restart.
            node: Mutex::new(MonNode::new(
                MonCore::new(
                    map,
                    MonTiming {
                        down_after_ms: config.down_after_ms,
                        out_after_ms: config.out_after_ms,
                    },
                    0,
                ),
                Box::new(store),
            )),
            map_tx,
            started: Instant::now(),
        });
        Ok(BoundMonitor {
            addr,
            listener,
            net: config.net.clone(),
            mon,
        })
    }

    pub fn monitor(&self) -> Arc<Monitor> {
        self.mon.clone()
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), MonError> {
        let mon = self.mon.clone();
        let ticker = tokio::spawn({
            let mon = mon.clone();
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    mon.check_heartbeats();
                }
            }
        });
        let accept = accept_loop_via(&self.net, self.listener, "monitor", MonService(mon.clone()));
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        ticker.abort();
        Ok(())
    }
}
