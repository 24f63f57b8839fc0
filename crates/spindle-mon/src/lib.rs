//! `spindle-mon`: the monitor. It owns the cluster map, bumps its epoch on every change,
//! persists it before anyone sees it ([`MapStore`]), pushes each new epoch to subscribers,
//! marks daemons down when they miss heartbeats for `down_after_ms`, and answers
//! administrative commands (`status`, `pool create|rm|ls`, `osd out|in|down`, `crush set`).
//!
//! Invariants:
//! - an epoch is visible (replied, pushed) only after `MapStore::save` returned, so a
//!   monitor restart never goes back in time;
//! - epochs strictly increase by one per change;
//! - malformed requests get an error reply; the monitor never panics on input.

mod store;

pub use store::{MapStore, MapStoreError, RedbMapStore};

use serde_json::json;
use spindle_map::{ClusterMap, OsdInfo, Placement, PoolKind};
use spindle_proto::msg::{PgReport, PgStateCode};
use spindle_proto::net::{accept_loop, Incoming, Replier, Service};
use spindle_proto::{ErrorCode, Msg};
use std::collections::HashMap;
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
}

impl MonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MonConfig {
            dir: dir.into(),
            listen: "127.0.0.1:0".to_string(),
            down_after_ms: 2000,
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

/// Creates the first map of a new cluster in `dir` (fails if one exists).
pub fn init(dir: &std::path::Path, spec: &InitSpec) -> Result<ClusterMap, MonError> {
    std::fs::create_dir_all(dir)?;
    let mut store = RedbMapStore::open(&dir.join("mon.redb"))?;
    if let Some(existing) = store.load()? {
        return Ok(existing);
    }
    let ids: Vec<u32> = (0..spec.osd_count).collect();
    let mut map = ClusterMap {
        cluster_id: rand::random(),
        epoch: 1,
        osds: ids
            .iter()
            .map(|&id| {
                (
                    id,
                    OsdInfo {
                        id,
                        addr: String::new(),
                        pid: 0,
                        up: false,
                        in_cluster: true,
                        weight: 0x10000,
                        up_from: 0,
                    },
                )
            })
            .collect(),
        pools: Default::default(),
        crush: spindle_map::embedded_crush_map(&ids)?,
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
    store.save(&map)?;
    Ok(map)
}

struct State {
    map: ClusterMap,
    placement: Placement,
    store: Box<dyn MapStore>,
    last_heartbeat: HashMap<u32, Instant>,
    /// Latest placement-group reports per daemon, with the epoch they were made at.
    reports: HashMap<u32, (u64, Vec<PgReport>)>,
    /// Latest counters per daemon.
    counters: HashMap<u32, Vec<(String, u64)>>,
}

/// A running monitor (shared by its tasks).
pub struct Monitor {
    state: Mutex<State>,
    map_tx: watch::Sender<Arc<Vec<u8>>>,
    config: MonConfig,
}

impl Monitor {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a bug panicked mid-update; keep serving the last state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn epoch(&self) -> u64 {
        self.lock().map.epoch
    }

    /// Applies `change` to a copy of the map; if it changed anything, bumps the epoch,
    /// persists, then publishes. Returns the (possibly unchanged) epoch.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut ClusterMap) -> Result<T, String>,
    ) -> Result<(T, u64), String> {
        let mut st = self.lock();
        let mut next = st.map.clone();
        let out = change(&mut next)?;
        let before = st.map.encode();
        next.epoch = st.map.epoch;
        if next.encode() == before {
            return Ok((out, st.map.epoch));
        }
        next.epoch = st.map.epoch + 1;
        st.store.save(&next).map_err(|e| e.to_string())?;
        st.placement = Placement::compute(&next);
        st.map = next;
        let bytes = Arc::new(st.map.encode());
        let epoch = st.map.epoch;
        drop(st);
        self.map_tx.send_replace(bytes);
        Ok((out, epoch))
    }

    fn handle(self: &Arc<Self>, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        let epoch = self.epoch();
        match inc.msg {
            Msg::OsdBoot { osd_id, addr, pid } => {
                let res = self.update(|m| {
                    let next_epoch = m.epoch + 1;
                    let osd = m
                        .osds
                        .get_mut(&osd_id)
                        .ok_or_else(|| format!("osd.{osd_id} is not part of this cluster"))?;
                    // A daemon re-registering after a monitor restart (same process, same
                    // address) changes nothing: no new epoch, no re-peering.
                    if !(osd.up && osd.addr == addr && osd.pid == pid) {
                        osd.addr = addr.clone();
                        osd.pid = pid;
                        osd.up = true;
                        osd.up_from = next_epoch;
                    }
                    Ok(())
                });
                match res {
                    Ok((_, e)) => {
                        self.lock().last_heartbeat.insert(osd_id, Instant::now());
                        tracing::info!("osd.{osd_id} booted at {addr} (pid {pid}), epoch {e}");
                        let map = self.map_tx.borrow().as_ref().clone();
                        reply.send(rid, e, &Msg::MapUpdate { map });
                    }
                    Err(msg) => {
                        reply.send(rid, epoch, &Msg::error(ErrorCode::Invalid, msg));
                    }
                }
            }
            Msg::Heartbeat {
                osd_id,
                reports,
                counters,
            } => {
                let mut st = self.lock();
                if st.map.osds.contains_key(&osd_id) {
                    st.last_heartbeat.insert(osd_id, Instant::now());
                    st.reports.insert(osd_id, (inc.epoch, reports));
                    st.counters.insert(osd_id, counters);
                }
                let epoch = st.map.epoch;
                drop(st);
                reply.send(rid, epoch, &Msg::HeartbeatAck { epoch });
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                let mut rx = self.map_tx.subscribe();
                let current = rx.borrow_and_update().clone();
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
                        if rx.changed().await.is_err() {
                            return;
                        }
                        bytes = rx.borrow_and_update().clone();
                    }
                });
                // The subscription itself is acknowledged so the caller knows it is live.
                let _ = rid;
            }
            Msg::Command { args } => {
                let (ok, output) = match self.command(&args) {
                    Ok(v) => (true, v.to_string()),
                    Err(e) => (false, e),
                };
                reply.send(rid, self.epoch(), &Msg::CommandReply { ok, output });
            }
            other => {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(
                        ErrorCode::Invalid,
                        format!("the monitor does not handle {}", other.name()),
                    ),
                );
            }
        }
    }

    fn command(&self, args: &[String]) -> Result<serde_json::Value, String> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let parse_u32 = |s: &str, what: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("{what} must be a number, got '{s}'"))
        };
        match a.as_slice() {
            ["status"] => Ok(self.status()),
            ["pool", "ls"] => Ok(self.status()["pools"].clone()),
            ["pool", "create", name, size, min_size, pg_count] => {
                let (size, min_size, pg_count) = (
                    parse_u32(size, "size")?,
                    parse_u32(min_size, "min_size")?,
                    parse_u32(pg_count, "pg count")?,
                );
                let name = name.to_string();
                let (id, epoch) = self.update(|m| {
                    m.add_pool(
                        &name,
                        PoolKind::Replicated { size, min_size },
                        pg_count,
                        0,
                    )
                    .map_err(|e| e.to_string())
                })?;
                Ok(json!({"pool": name, "id": id, "epoch": epoch}))
            }
            ["pool", "rm", name] => {
                let name = name.to_string();
                let (id, epoch) =
                    self.update(|m| m.remove_pool(&name).map_err(|e| e.to_string()))?;
                Ok(json!({"removed": name, "id": id, "epoch": epoch}))
            }
            ["osd", verb @ ("out" | "in" | "down"), id] => {
                let id = parse_u32(id, "osd id")?;
                let verb = verb.to_string();
                let ((), epoch) = self.update(|m| {
                    let osd = m
                        .osds
                        .get_mut(&id)
                        .ok_or_else(|| format!("no storage daemon osd.{id}"))?;
                    match verb.as_str() {
                        "out" => osd.in_cluster = false,
                        "in" => osd.in_cluster = true,
                        _ => osd.up = false,
                    }
                    Ok(())
                })?;
                Ok(json!({"osd": id, "done": verb, "epoch": epoch}))
            }
            ["crush", "set", text] => {
                let crush = spindle_crush::text::parse_text(text)
                    .map_err(|e| format!("CRUSH map does not parse: {e}"))?;
                crush
                    .validate()
                    .map_err(|e| format!("CRUSH map is invalid: {e}"))?;
                let ((), epoch) = self.update(|m| {
                    let mut next = m.clone();
                    next.crush = crush;
                    for id in next.osds.keys() {
                        if (*id as i64) >= next.crush.max_devices as i64 {
                            return Err(format!("osd.{id} is not a device of the new map"));
                        }
                    }
                    for pool in next.pools.values() {
                        next.check_pool(pool).map_err(|e| e.to_string())?;
                    }
                    *m = next;
                    Ok(())
                })?;
                Ok(json!({"epoch": epoch}))
            }
            ["crush", "get"] => Ok(json!(spindle_crush::text::print_text(&self.lock().map.crush))),
            _ => Err(format!(
                "unknown command '{}' (known: status, pool ls|create|rm, osd out|in|down, crush get|set)",
                a.join(" ")
            )),
        }
    }

    /// The `spindle status` document.
    pub fn status(&self) -> serde_json::Value {
        let st = self.lock();
        let map = &st.map;
        let mut report_of: HashMap<(u32, u32, u32), (u64, PgStateCode, u64)> = HashMap::new();
        for (osd, (epoch, reports)) in &st.reports {
            for r in reports {
                report_of.insert((*osd, r.pool, r.pg), (*epoch, r.state, r.objects));
            }
        }
        let mut totals = [0u64; 5]; // clean, degraded, recovering, inactive, peering
        let mut pools = Vec::new();
        let mut objects_total = 0u64;
        for pool in map.pools.values() {
            let mut counts = [0u64; 5];
            let mut objects = 0u64;
            for pg in 0..pool.pg_count {
                let Some(mapping) = st.placement.pg(pool.id, pg) else {
                    continue;
                };
                let slot = if (mapping.up.len() as u32) < pool.min_size() {
                    3
                } else {
                    let primary = mapping.up[0];
                    match report_of.get(&(primary, pool.id, pg)) {
                        Some((e, state, n)) if *e >= map.epoch => {
                            objects += n;
                            match state {
                                PgStateCode::Clean if mapping.up.len() as u32 >= pool.size() => 0,
                                PgStateCode::Clean | PgStateCode::Degraded => 1,
                                PgStateCode::Recovering => 2,
                                PgStateCode::Inactive => 3,
                            }
                        }
                        _ => 4,
                    }
                };
                counts[slot] += 1;
            }
            for i in 0..5 {
                totals[i] += counts[i];
            }
            objects_total += objects;
            pools.push(json!({
                "id": pool.id,
                "name": pool.name,
                "type": "replicated",
                "size": pool.size(),
                "min_size": pool.min_size(),
                "pg_count": pool.pg_count,
                "crush_rule": pool.crush_rule,
                "objects": objects,
                "pgs": {"clean": counts[0], "degraded": counts[1], "recovering": counts[2],
                        "inactive": counts[3], "peering": counts[4]},
            }));
        }
        let osds: Vec<_> = map
            .osds
            .values()
            .map(|o| {
                let counters: serde_json::Map<String, serde_json::Value> = st
                    .counters
                    .get(&o.id)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                json!({"id": o.id, "addr": o.addr, "pid": o.pid, "up": o.up,
                       "in": o.in_cluster, "weight": o.weight as f64 / 65536.0,
                       "up_from": o.up_from, "counters": counters})
            })
            .collect();
        json!({
            "cluster_id": format!("{:016x}", map.cluster_id),
            "epoch": map.epoch,
            "osds": osds,
            "pools": pools,
            "objects": objects_total,
            "pgs": {"clean": totals[0], "degraded": totals[1], "recovering": totals[2],
                    "inactive": totals[3], "peering": totals[4]},
        })
    }

    fn check_heartbeats(&self) {
        let down_after = Duration::from_millis(self.config.down_after_ms);
        let now = Instant::now();
        let stale: Vec<u32> = {
            let st = self.lock();
            st.map
                .osds
                .values()
                .filter(|o| o.up)
                .filter(|o| {
                    st.last_heartbeat
                        .get(&o.id)
                        .is_none_or(|t| now.duration_since(*t) > down_after)
                })
                .map(|o| o.id)
                .collect()
        };
        if stale.is_empty() {
            return;
        }
        match self.update(|m| {
            for id in &stale {
                if let Some(o) = m.osds.get_mut(id) {
                    o.up = false;
                }
            }
            Ok(())
        }) {
            Ok((_, e)) => tracing::warn!(
                "marked {:?} down after {} ms without heartbeat (epoch {e})",
                stale,
                self.config.down_after_ms
            ),
            Err(e) => tracing::error!("cannot mark daemons down: {e}"),
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
        let now = Instant::now();
        // Every daemon the map calls up gets a full grace period after a monitor restart.
        let last_heartbeat = map.osds.keys().map(|&id| (id, now)).collect();
        let (map_tx, _) = watch::channel(Arc::new(map.encode()));
        tracing::info!(
            "monitor listening on {addr}, cluster {:016x}, epoch {}",
            map.cluster_id,
            map.epoch
        );
        let mon = Arc::new(Monitor {
            state: Mutex::new(State {
                placement: Placement::compute(&map),
                map,
                store: Box::new(store),
                last_heartbeat,
                reports: HashMap::new(),
                counters: HashMap::new(),
            }),
            map_tx,
            config,
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
