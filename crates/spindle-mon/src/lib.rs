//! `spindle-mon`: the monitor. It owns the cluster map, bumps its epoch on every change,
//! persists it before anyone sees it ([`MapStore`]), pushes each new epoch to subscribers,
//! marks daemons down when they miss heartbeats for `down_after_ms`, and answers
//! administrative commands (`status`, `pool create|rm|ls`, `osd out|in|down`, `crush set`).
//!
//! Every decision is made by [`MonCore`] (no I/O: events in, next map out); `Monitor` is
//! the shell that persists each proposed map, installs it in the core, publishes it and
//! answers over the network.
//!
//! Invariants:
//! - an epoch is visible (replied, pushed) only after `MapStore::save` returned, so a
//!   monitor restart never goes back in time;
//! - epochs strictly increase by one per change;
//! - malformed requests get an error reply; the monitor never panics on input.

pub mod command;
pub mod core;
pub mod reply;
mod status;
mod store;

pub use command::{AdminCommand, OsdVerb};
pub use core::{propose, MapChange, MonCore, MonTiming};
pub use reply::{
    Admin, AdminReply, ClusterRecovery, CrushSet, ErasureStatus, HealthCheck, HealthReport,
    InconsistentPg, OsdAdded, OsdMarked, OsdStatus, PoolCreated, PoolRecovery, PoolRemoved,
    PoolStatus, RatioSet, Status,
};
pub use status::{status, Health, Severity};
pub use store::{MapStore, MapStoreError, RedbMapStore};

use spindle_map::{ClusterMap, OsdInfo, PoolKind};
use spindle_proto::net::{accept_loop, Incoming, Replier, Service};
use spindle_proto::{ErrorCode, Msg};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
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
}

impl MonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MonConfig {
            dir: dir.into(),
            listen: "127.0.0.1:0".to_string(),
            down_after_ms: 2000,
            out_after_ms: 30_000,
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

struct State {
    core: MonCore,
    store: Box<dyn MapStore>,
}

/// A running monitor (shared by its tasks).
pub struct Monitor {
    state: Mutex<State>,
    map_tx: watch::Sender<Arc<Vec<u8>>>,
    /// The core's clock: milliseconds since the monitor started.
    started: Instant,
}

impl Monitor {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a bug panicked mid-update; keep serving the last state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn epoch(&self) -> u64 {
        self.lock().core.epoch()
    }

    /// Persists `next` (a proposal of the core), installs it and publishes it. An epoch is
    /// visible only after `MapStore::save` returned.
    fn commit(&self, st: &mut MutexGuard<'_, State>, next: ClusterMap) -> Result<u64, String> {
        st.store.save(&next).map_err(|e| e.to_string())?;
        let now_ms = self.now_ms();
        st.core.install(next, now_ms);
        let bytes = Arc::new(st.core.map().encode());
        self.map_tx.send_replace(bytes);
        Ok(st.core.epoch())
    }

    /// Commits what the core proposes; returns the current epoch.
    fn commit_change(&self, change: Option<MapChange>, st: &mut MutexGuard<'_, State>) -> u64 {
        if let Some(MapChange { next, reason }) = change {
            match self.commit(st, next) {
                Ok(e) => tracing::info!("{reason} (epoch {e})"),
                Err(e) => tracing::error!("cannot commit a map change ({reason}): {e}"),
            }
        }
        st.core.epoch()
    }

    fn handle(self: &Arc<Self>, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        match inc.msg {
            Msg::OsdBoot { osd_id, addr, pid } => {
                let now_ms = self.now_ms();
                let mut st = self.lock();
                let res = st
                    .core
                    .boot(now_ms, osd_id, &addr, pid)
                    .and_then(|next| match next {
                        Some(next) => self.commit(&mut st, next),
                        None => Ok(st.core.epoch()),
                    });
                match res {
                    Ok(e) => {
                        drop(st);
                        tracing::info!("osd.{osd_id} booted at {addr} (pid {pid}), epoch {e}");
                        let map = self.map_tx.borrow().as_ref().clone();
                        reply.send(rid, e, &Msg::MapUpdate { map });
                    }
                    Err(msg) => {
                        let e = st.core.epoch();
                        drop(st);
                        reply.send(rid, e, &Msg::error(ErrorCode::Invalid, msg));
                    }
                }
            }
            Msg::Heartbeat {
                osd_id,
                reports,
                counters,
            } => {
                let now_ms = self.now_ms();
                let mut st = self.lock();
                let change = st
                    .core
                    .heartbeat(now_ms, osd_id, inc.epoch, reports, counters);
                let epoch = self.commit_change(change, &mut st);
                drop(st);
                reply.send(rid, epoch, &Msg::HeartbeatAck { epoch });
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                let mut rx = self.map_tx.subscribe();
                let current = rx.borrow_and_update().clone();
                let epoch = self.epoch();
                if !subscribe {
                    if have_epoch < epoch {
                        reply.send(
                            rid,
                            epoch,
                            &Msg::MapUpdate {
                                map: current.to_vec(),
                            },
                        );
                    } else {
                        reply.send(rid, epoch, &Msg::Ok);
                    }
                    return;
                }
                let me = self.clone();
                tokio::spawn(async move {
                    let mut have = have_epoch;
                    let mut bytes = current;
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
                        // Ends with the connection, not at the next epoch.
                        tokio::select! {
                            changed = rx.changed() => if changed.is_err() {
                                return;
                            },
                            () = reply.closed() => return,
                        }
                        bytes = rx.borrow_and_update().clone();
                    }
                });
                // The subscription itself is acknowledged so the caller knows it is live.
                let _ = rid;
            }
            Msg::Command { args } => {
                let mut st = self.lock();
                let res = AdminCommand::parse(&args)
                    .and_then(|cmd| st.core.execute(&cmd))
                    .and_then(|(out, next)| match next {
                        Some(next) => self.commit(&mut st, next).map(|_| out),
                        None => Ok(out),
                    })
                    .and_then(|out| serde_json::to_string(&out).map_err(|e| e.to_string()));
                let (ok, output) = match res {
                    Ok(json) => (true, json),
                    Err(e) => (false, e),
                };
                let epoch = st.core.epoch();
                drop(st);
                reply.send(rid, epoch, &Msg::CommandReply { ok, output });
            }
            other => {
                reply.send(
                    rid,
                    self.epoch(),
                    &Msg::error(
                        ErrorCode::Invalid,
                        format!("the monitor does not handle {}", other.name()),
                    ),
                );
            }
        }
    }

    /// The `spindle status` document.
    pub fn status(&self) -> Status {
        status::status(&self.lock().core)
    }

    /// Marks down (then out) the daemons the core finds due.
    fn check_heartbeats(&self) {
        let now_ms = self.now_ms();
        let mut st = self.lock();
        // One change per call of `tick`; a bounded number per tick (down, then out).
        for _ in 0..4 {
            let Some(MapChange { next, reason }) = st.core.tick(now_ms) else {
                break;
            };
            match self.commit(&mut st, next) {
                Ok(e) => tracing::warn!("{reason} (epoch {e})"),
                Err(e) => {
                    tracing::error!("cannot commit a map change ({reason}): {e}");
                    break;
                }
            }
        }
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
    pub addr: std::net::SocketAddr,
    listener: TcpListener,
    mon: Arc<Monitor>,
}

impl BoundMonitor {
    /// Loads the map from `config.dir` and binds the listener.
    pub async fn bind(config: MonConfig) -> Result<BoundMonitor, MonError> {
        let store = RedbMapStore::open(&config.db_path())?;
        let map = store
            .load()?
            .ok_or_else(|| MonError::NotInitialized(config.dir.clone()))?;
        let listener = TcpListener::bind(&config.listen).await?;
        let addr = listener.local_addr()?;
        let (map_tx, _) = watch::channel(Arc::new(map.encode()));
        tracing::info!(
            "monitor listening on {addr}, cluster {:016x}, epoch {}",
            map.cluster_id,
            map.epoch
        );
        let mon = Arc::new(Monitor {
            // Every daemon the map calls up gets a full grace period after a monitor restart.
            state: Mutex::new(State {
                core: MonCore::new(
                    map,
                    MonTiming {
                        down_after_ms: config.down_after_ms,
                        out_after_ms: config.out_after_ms,
                    },
                    0,
                ),
                store: Box::new(store),
            }),
            map_tx,
            started: Instant::now(),
        });
        Ok(BoundMonitor {
            addr,
            listener,
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
        let accept = accept_loop(self.listener, "monitor", MonService(mon.clone()));
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        ticker.abort();
        Ok(())
    }
}
