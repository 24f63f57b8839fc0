//! `spindle-osd`: the storage daemon.
//!
//! It boots with the monitor, follows every map epoch, and for each placement group it is
//! the primary of: peers (queries the other copies' PG logs, brings every copy level with
//! the newest one by log-based catch-up or backfill), then serves client operations. A
//! write gets the next PG version, is applied to the local store (group-committed) and
//! forwarded to the other up copies in the same order, and is acknowledged once every up
//! copy has it durable. A read that fails its checksum locally is served from another
//! copy and the local copy is repaired.
//!
//! Invariants:
//! - a placement group serves client I/O only after peering completed at the current
//!   epoch and only while at least `min_size` copies are up;
//! - versions in a PG strictly increase; replication messages leave in version order on
//!   one connection per peer, and a replica applies them in arrival order;
//! - a request from a sender with an older map gets the newer map back (`StaleMap`); a
//!   sender with a newer map is asked to push it (`NeedMap`) — never served on a stale
//!   placement;
//! - bad requests get error replies; nothing a peer sends can panic the daemon.

mod ec;
mod fanout;
mod recovery;
mod scrub;

/// The pure peering decisions moved to `spindle-pg`; re-exported for compatibility.
pub use spindle_pg::{plan, LogInfo, SyncPlan};

use spindle_map::{ClusterMap, PgMapping, Placement};
use spindle_pg::rules::IntervalChange;
use spindle_pg::TxnGate;
use spindle_proto::msg::typed;
use spindle_proto::msg::{
    LogEntryMsg, Mutation as WireMutation, ObjOp, ObjectListing, PgReport, PgStateCode, Ver,
};
use spindle_proto::net::{
    accept_loop, Incoming, NetError, PendingReply, Prepared, Replier, RpcConn, Service,
};
use spindle_proto::request::{reply_to, MapReply, Request};
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{LogEntry, LogOp, Mutation, PgId, Store, StoreConfig, StoreError, Version};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

#[derive(Debug, thiserror::Error)]
pub enum OsdError {
    #[error("osd: store: {0}")]
    Store(#[from] StoreError),
    #[error("osd: {0}")]
    Io(#[from] std::io::Error),
    #[error("osd: {0}")]
    Net(#[from] NetError),
    #[error("osd: {0}")]
    Boot(String),
}

#[derive(Clone, Debug)]
pub struct OsdConfig {
    pub id: u32,
    pub dir: PathBuf,
    pub mon_addr: String,
    pub listen: String,
    pub heartbeat_ms: u64,
    /// How long the primary waits for a replica before failing the write (the client
    /// retries on the next map).
    pub replica_timeout_ms: u64,
    /// Background recovery: objects recovered at once by this daemon (as primary).
    pub recovery_ops_max: usize,
    /// Background recovery: bytes per second (0 = unlimited).
    pub recovery_bytes_per_sec: u64,
    /// How often copies of groups this daemon no longer belongs to are checked for removal.
    pub stray_check_ms: u64,
    /// Each placement group this daemon is primary of is scrubbed this often (0 = never;
    /// `spindle scrub` works regardless).
    pub scrub_interval_ms: u64,
}

impl OsdConfig {
    pub fn new(id: u32, dir: impl Into<PathBuf>, mon_addr: impl Into<String>) -> Self {
        OsdConfig {
            id,
            dir: dir.into(),
            mon_addr: mon_addr.into(),
            listen: "127.0.0.1:0".to_string(),
            heartbeat_ms: 400,
            replica_timeout_ms: 10_000,
            recovery_ops_max: 2,
            recovery_bytes_per_sec: 0,
            stray_check_ms: 2000,
            scrub_interval_ms: 24 * 3600 * 1000,
        }
    }
}

fn ver(v: Version) -> Ver {
    Ver {
        epoch: v.epoch,
        seq: v.seq,
    }
}
fn version(v: Ver) -> Version {
    Version {
        epoch: v.epoch,
        seq: v.seq,
    }
}
/// Whole-object writes at least this large are replicated from the buffer the local
/// store writes too (see `start_write`): those the store writes straight from the buffer
/// (smaller ones it copies into its journal anyway).
const SHARED_WRITE_BYTES_MIN: usize = spindle_store::DIRECT_WRITE_BYTES_MIN;

fn to_store_mutation(m: WireMutation) -> Mutation {
    match m {
        WireMutation::WriteFull(d) => Mutation::WriteFull(d),
        WireMutation::Write { offset, data } => Mutation::Write { offset, data },
        WireMutation::Truncate { size_bytes } => Mutation::Truncate { size_bytes },
        WireMutation::Delete => Mutation::Delete,
        // Never reaches a replicated copy (client_op and the RepWrite handler refuse it);
        // an empty truncate of offset 0 would be wrong, so make it an invalid write.
        WireMutation::EcWrite { .. } | WireMutation::EcPatch { .. } => Mutation::Write {
            offset: u64::MAX,
            data: vec![0],
        },
    }
}

fn is_shard_mutation(m: &WireMutation) -> bool {
    matches!(
        m,
        WireMutation::EcWrite { .. } | WireMutation::EcPatch { .. }
    )
}
fn log_to_wire(log: &[LogEntry]) -> Vec<LogEntryMsg> {
    log.iter()
        .map(|e| LogEntryMsg {
            version: ver(e.version),
            name: e.name.clone(),
            delete: e.op == LogOp::Delete,
        })
        .collect()
}
fn log_from_wire(log: &[LogEntryMsg]) -> Vec<LogEntry> {
    log.iter()
        .map(|e| LogEntry {
            version: version(e.version),
            name: e.name.clone(),
            op: if e.delete {
                LogOp::Delete
            } else {
                LogOp::Modify
            },
        })
        .collect()
}
fn store_error_reply(e: &StoreError) -> Msg {
    let code = match e {
        StoreError::NotFound => ErrorCode::NotFound,
        StoreError::Corrupt { .. } => ErrorCode::Corrupt,
        StoreError::InvalidName(_) | StoreError::InvalidArgument(_) => ErrorCode::Invalid,
        StoreError::VersionNotNewer { .. } => ErrorCode::Again,
        StoreError::NoSpace(_) => ErrorCode::NoSpace,
        _ => ErrorCode::Io,
    };
    Msg::error(code, e.to_string())
}

/// The map as this daemon knows it, with placement precomputed.
struct MapState {
    map: ClusterMap,
    placement: Placement,
    encoded: Arc<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Peering / recovering at `epoch`: client I/O waits.
    Peering,
    /// Serving.
    Active,
    /// Too few copies up.
    Inactive,
    /// No complete copy reachable: waiting for one (not serving).
    Incomplete,
}

/// Per placement group state on its primary.
struct PgState {
    /// Epoch the state was computed for.
    epoch: u64,
    /// Epoch at which the current interval (same up set) began; recovery and scrub tasks
    /// belong to an interval, not to an epoch (a map change elsewhere keeps them going).
    since: u64,
    /// Identity of the interval: up set and each member's `up_from`.
    interval: Vec<(u32, u64)>,
    phase: Phase,
    /// Last version handed out (valid while Active).
    last: Ver,
    acting: Vec<u32>,
    size: u32,
    /// Objects some copies still miss (while Active); None = all copies complete.
    recovery: Option<recovery::Recovery>,
    /// Stored names of objects the last whole-group scrub found with no intact copy (fewer
    /// than k intact shards): the group is `inconsistent` while this is not empty. Kept
    /// across intervals while this daemon stays primary; in memory only (a restart or a
    /// new primary finds them again at the next scrub). Cleared per object by a client's
    /// whole-object write or delete, and replaced by every later whole-group scrub.
    damaged: BTreeSet<String>,
}

struct Inner {
    id: u32,
    config: OsdConfig,
    addr: String,
    store: Arc<Store>,
    map: RwLock<Option<Arc<MapState>>>,
    map_tx: watch::Sender<u64>,
    pgs: Mutex<HashMap<(u32, u32), PgState>>,
    peers: Mutex<HashMap<u32, Arc<RpcConn>>>,
    mon: Mutex<Option<Arc<RpcConn>>>,
    push_tx: mpsc::UnboundedSender<Incoming>,
    repaired: AtomicU64,
    throttle: recovery::Throttle,
    /// Stray groups being removed: requests for them get `Again`.
    removing: Mutex<HashSet<PgId>>,
    recovered_objects: AtomicU64,
    recovered_bytes: AtomicU64,
    backfills: AtomicU64,
    log_recoveries: AtomicU64,
    strays_removed: AtomicU64,
    scrub: scrub::ScrubCounters,
    /// Client operations received (recovery yields while this moves).
    client_ops: AtomicU64,
    /// This daemon's file system is above the map's full ratio (updated with every
    /// heartbeat): new client writes are refused with `NoSpace`, deletes are not.
    over_full_ratio: std::sync::atomic::AtomicBool,
    /// Local store transactions queued but not yet applied, per PG (writes and recovery
    /// pushes), and the log queries waiting for them (`spindle_pg::TxnGate`). A PG's log
    /// is only reported once they drained: peering must see every write that may still
    /// be acknowledged.
    inflight: Mutex<TxnGate<PgId, tokio::sync::oneshot::Sender<()>>>,
    /// Coding of erasure-coded pools (by pool id).
    ec_layouts: Mutex<HashMap<u32, spindle_map::ec::EcLayout>>,
    /// Per stored erasure-coded group: the queue applying its shard writes in order.
    shard_queues: Mutex<HashMap<PgId, mpsc::UnboundedSender<ec::ShardJob>>>,
    /// Per object of an erasure-coded group this daemon is primary of: one operation at a
    /// time.
    ec_locks: Mutex<ec::ObjectLocks>,
}

/// Counts one in-flight store transaction of a PG until dropped.
struct InflightGuard {
    inner: Arc<Inner>,
    pgid: PgId,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let released = lock(&self.inner.inflight).txn_applied(self.pgid);
        for waiter in released {
            // The query may have timed out meanwhile: nobody to tell.
            let _ = waiter.send(());
        }
    }
}

/// A running storage daemon.
#[derive(Clone)]
pub struct Osd {
    inner: Arc<Inner>,
}

impl Service for Osd {
    fn epoch(&self) -> u64 {
        self.map_state().map_or(0, |m| m.map.epoch)
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        self.handle_request(inc, reply)
    }
}

/// Longest wait for a PG's in-flight store transactions before peering retries.
const INFLIGHT_DRAIN_MS: u64 = 10_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Osd {
    /// Opens the store, binds the listener, boots with the monitor and serves until
    /// `shutdown` resolves.
    pub async fn run(
        config: OsdConfig,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), OsdError> {
        let store_dir = config.dir.join("store");
        let store = tokio::task::spawn_blocking(move || Store::open(StoreConfig::new(store_dir)))
            .await
            .map_err(|e| OsdError::Boot(e.to_string()))??;
        let listener = TcpListener::bind(&config.listen).await?;
        let addr = listener.local_addr()?.to_string();
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let (map_tx, _) = watch::channel(0u64);
        let osd = Osd {
            inner: Arc::new(Inner {
                id: config.id,
                addr: addr.clone(),
                store: Arc::new(store),
                map: RwLock::new(None),
                map_tx,
                pgs: Mutex::new(HashMap::new()),
                peers: Mutex::new(HashMap::new()),
                mon: Mutex::new(None),
                push_tx,
                repaired: Default::default(),
                throttle: recovery::Throttle::new(
                    config.recovery_ops_max,
                    config.recovery_bytes_per_sec,
                ),
                removing: Mutex::new(HashSet::new()),
                recovered_objects: Default::default(),
                recovered_bytes: Default::default(),
                backfills: Default::default(),
                log_recoveries: Default::default(),
                strays_removed: Default::default(),
                scrub: Default::default(),
                client_ops: Default::default(),
                over_full_ratio: Default::default(),
                inflight: Mutex::new(TxnGate::new()),
                ec_layouts: Mutex::new(HashMap::new()),
                shard_queues: Mutex::new(HashMap::new()),
                ec_locks: Mutex::new(HashMap::new()),
                config,
            }),
        };
        tracing::info!("osd.{} listening on {addr}", osd.inner.id);
        let server = tokio::spawn(accept_loop(listener, "osd", osd.clone()));
        let pusher = {
            let osd = osd.clone();
            tokio::spawn(async move { osd.push_loop(push_rx).await })
        };
        let monitor_link = {
            let osd = osd.clone();
            tokio::spawn(async move { osd.mon_loop().await })
        };
        let strays = {
            let osd = osd.clone();
            tokio::spawn(async move { osd.stray_loop().await })
        };
        let scrubber = {
            let osd = osd.clone();
            tokio::spawn(async move { osd.scrub_loop().await })
        };
        shutdown.await;
        tracing::info!("osd.{} shutting down", osd.inner.id);
        server.abort();
        monitor_link.abort();
        pusher.abort();
        strays.abort();
        scrubber.abort();
        Ok(())
    }

    fn epoch(&self) -> u64 {
        self.map_state().map_or(0, |m| m.map.epoch)
    }

    fn map_state(&self) -> Option<Arc<MapState>> {
        self.inner
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    // ------------------------------------------------------------------ monitor link

    /// Keeps a connection to the monitor: boot, subscribe to maps, heartbeat. Reconnects
    /// (and boots again) whenever the monitor goes away.
    async fn mon_loop(&self) {
        let hb = Duration::from_millis(self.inner.config.heartbeat_ms);
        loop {
            let conn = match RpcConn::connect(
                &self.inner.config.mon_addr,
                2000,
                Some(self.inner.push_tx.clone()),
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("osd.{}: monitor unreachable: {e}", self.inner.id);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if let Err(e) = self.boot(&conn).await {
                tracing::warn!("osd.{}: boot failed: {e}", self.inner.id);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            let have = self.epoch();
            let _ = conn.send_oneway(
                have,
                &Msg::GetMap {
                    have_epoch: have,
                    subscribe: true,
                },
            );
            *lock(&self.inner.mon) = Some(conn.clone());
            loop {
                tokio::time::sleep(hb).await;
                let reports = self.pg_reports();
                let epoch = self.epoch();
                let beat = typed::Heartbeat {
                    osd_id: self.inner.id,
                    reports,
                    counters: self.counters(),
                };
                match conn.request(epoch, beat, 5000).await {
                    Ok(typed::HeartbeatAck { epoch: mon_epoch }) => {
                        if mon_epoch > self.epoch() {
                            self.fetch_map(&conn).await;
                        }
                    }
                    Err(spindle_proto::CallError::Remote(e)) => {
                        tracing::warn!("osd.{}: heartbeat refused: {e}", self.inner.id);
                    }
                    Err(e) => {
                        tracing::warn!("osd.{}: monitor link lost: {e}", self.inner.id);
                        break;
                    }
                }
                // Wrongly marked down (e.g. after a stall): boot again.
                if let Some(ms) = self.map_state() {
                    if ms.map.osds.get(&self.inner.id).is_some_and(|o| !o.up) {
                        tracing::warn!("osd.{}: map says I am down; booting again", self.inner.id);
                        break;
                    }
                }
            }
            *lock(&self.inner.mon) = None;
        }
    }

    async fn boot(&self, conn: &RpcConn) -> Result<(), String> {
        let boot = typed::OsdBoot {
            osd_id: self.inner.id,
            addr: self.inner.addr.clone(),
            pid: std::process::id(),
        };
        match conn.request(self.epoch(), boot, 10_000).await {
            Ok(typed::MapUpdate { map }) => {
                self.install_map(&map)?;
                tracing::info!("osd.{} booted at epoch {}", self.inner.id, self.epoch());
                Ok(())
            }
            Err(spindle_proto::CallError::Remote(e)) => Err(e.message),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn fetch_map(&self, conn: &RpcConn) {
        let have = self.epoch();
        let req = typed::GetMap {
            have_epoch: have,
            subscribe: false,
        };
        if let Ok(MapReply::Newer(map)) = conn.request(have, req, 5000).await {
            if let Err(e) = self.install_map(&map) {
                tracing::warn!("osd.{}: {e}", self.inner.id);
            }
        }
    }

    /// Unsolicited frames: map pushes from the monitor subscription.
    async fn push_loop(&self, mut rx: mpsc::UnboundedReceiver<Incoming>) {
        while let Some(inc) = rx.recv().await {
            if let Msg::MapUpdate { map } = inc.msg {
                if let Err(e) = self.install_map(&map) {
                    tracing::warn!("osd.{}: {e}", self.inner.id);
                }
            }
        }
    }

    /// Installs a newer map and starts peering where placement changed.
    fn install_map(&self, bytes: &[u8]) -> Result<(), String> {
        let map = ClusterMap::decode(bytes).map_err(|e| format!("rejecting map: {e}"))?;
        {
            let mut guard = self.inner.map.write().unwrap_or_else(|p| p.into_inner());
            if let Some(cur) = guard.as_ref() {
                if cur.map.cluster_id != map.cluster_id {
                    return Err(format!(
                        "rejecting map of cluster {:016x} (mine is {:016x})",
                        map.cluster_id, cur.map.cluster_id
                    ));
                }
                if map.epoch <= cur.map.epoch {
                    return Ok(());
                }
            }
            let placement = Placement::compute(&map);
            *guard = Some(Arc::new(MapState {
                encoded: Arc::new(bytes.to_vec()),
                map,
                placement,
            }));
        }
        let epoch = self.epoch();
        self.inner.map_tx.send_replace(epoch);
        self.on_new_epoch();
        Ok(())
    }

    /// Recomputes the state of every placement group this daemon is primary of.
    fn on_new_epoch(&self) {
        let Some(ms) = self.map_state() else { return };
        let me = self.inner.id;
        let mut to_peer = Vec::new();
        {
            let mut pgs = lock(&self.inner.pgs);
            let mut seen = BTreeSet::new();
            for (&(pool_id, pg), mapping) in ms.placement.iter() {
                if mapping.primary() != Some(me) {
                    continue;
                }
                let Some(pool) = ms.map.pools.get(&pool_id) else {
                    continue;
                };
                seen.insert((pool_id, pg));
                let interval: Vec<(u32, u64)> = mapping
                    .up
                    .iter()
                    .map(|id| (*id, ms.map.osds.get(id).map_or(0, |o| o.up_from)))
                    .collect();
                // Erasure-coded groups serve reads with k shards (writes check min_size).
                let floor = spindle_pg::rules::serve_floor(pool);
                let entry = pgs.entry((pool_id, pg)).or_insert_with(|| PgState {
                    epoch: 0,
                    since: 0,
                    interval: Vec::new(),
                    phase: Phase::Peering,
                    last: Ver::default(),
                    acting: Vec::new(),
                    size: pool.size(),
                    recovery: None,
                    damaged: BTreeSet::new(),
                });
                let change = spindle_pg::rules::interval_change(
                    &entry.interval,
                    &interval,
                    entry.phase == Phase::Active,
                    mapping.up.len(),
                    floor,
                );
                entry.epoch = ms.map.epoch;
                entry.acting = mapping.up.clone();
                entry.size = pool.size();
                match change {
                    IntervalChange::Keep => {}
                    IntervalChange::Inactive => {
                        entry.phase = Phase::Inactive;
                        entry.interval = interval;
                        entry.recovery = None;
                        entry.since = ms.map.epoch;
                    }
                    IntervalChange::Peer => {
                        entry.phase = Phase::Peering;
                        entry.interval = interval;
                        entry.recovery = None;
                        entry.since = ms.map.epoch;
                        to_peer.push((pool_id, pg));
                    }
                }
            }
            pgs.retain(|k, _| seen.contains(k));
        }
        for (pool, pg) in to_peer {
            let osd = self.clone();
            let epoch = ms.map.epoch;
            tokio::spawn(async move { osd.peer_until_done(pool, pg, epoch).await });
        }
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let s = self.inner.store.stats();
        let i = &self.inner;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counters = vec![
            ("corruptions_repaired".to_string(), get(&i.repaired)),
            ("recovered_objects".to_string(), get(&i.recovered_objects)),
            ("recovered_bytes".to_string(), get(&i.recovered_bytes)),
            ("backfills".to_string(), get(&i.backfills)),
            ("log_recoveries".to_string(), get(&i.log_recoveries)),
            ("strays_removed".to_string(), get(&i.strays_removed)),
            ("scrubbed_objects".to_string(), get(&i.scrub.objects)),
            ("scrub_inconsistent".to_string(), get(&i.scrub.inconsistent)),
            ("scrub_repaired".to_string(), get(&i.scrub.repaired)),
            ("corruptions_detected".to_string(), s.corruptions_detected),
            ("transactions".to_string(), s.transactions),
            ("flushes".to_string(), s.flushes),
            ("objects".to_string(), s.objects),
            ("data_bytes".to_string(), s.data_bytes),
        ];
        // Space of the data directory's file system and the store's condition: the
        // monitor derives nearfull / full (map flags) and OSD_UNHEALTHY from these.
        let space = self.inner.store.space();
        let used = space.total_bytes.saturating_sub(space.avail_bytes);
        if let Some(ms) = self.map_state() {
            let over = |ratio_ppm: u32| {
                space.total_bytes > 0
                    && (used as u128 * 1_000_000) >= (ratio_ppm as u128 * space.total_bytes as u128)
            };
            self.inner
                .over_full_ratio
                .store(over(ms.map.full_ratio_ppm), Ordering::Relaxed);
            // Above the full ratio the store keeps no freed files for reuse (they hold
            // space: deleting objects would not bring a full daemon back under the ratio).
            // Not from nearfull on: reuse is what makes whole-object overwrites fast (512k
            // writes QD16 ran ~20% slower on a nearfull daemon without it).
            self.inner
                .store
                .set_space_tight(over(ms.map.full_ratio_ppm));
        }
        if let Some(f) = &space.failed {
            tracing::error!(
                "osd.{}: store refuses I/O after an error: {f}",
                self.inner.id
            );
        }
        counters.extend([
            ("fs_total_bytes".to_string(), space.total_bytes),
            ("fs_used_bytes".to_string(), used),
            ("fs_avail_bytes".to_string(), space.avail_bytes),
            ("store_full".to_string(), space.full as u64),
            ("store_failed".to_string(), space.failed.is_some() as u64),
        ]);
        counters
    }

    /// Why a new client write to `mapping` must be refused for lack of space (before a
    /// version is assigned, so no copy applies it): this daemon's store is full or its
    /// file system is above the full ratio, or the map marks a copy's daemon full.
    fn refuse_for_space(&self, map: &ClusterMap, mapping: &PgMapping) -> Option<String> {
        let me = self.inner.id;
        if self.inner.store.is_full() {
            return Some(format!("osd.{me}: store is full"));
        }
        if self.inner.over_full_ratio.load(Ordering::Relaxed) {
            return Some(format!(
                "osd.{me}: file system above the full ratio {}",
                map.full_ratio_ppm as f64 / 1e6
            ));
        }
        mapping
            .up
            .iter()
            .find(|o| map.osds.get(o).is_some_and(|i| i.full))
            .map(|o| format!("osd.{o} is full"))
    }

    fn pg_reports(&self) -> Vec<PgReport> {
        let pgs = lock(&self.inner.pgs);
        pgs.iter()
            .map(|(&(pool, pg), st)| PgReport {
                pool,
                pg,
                state: match (st.phase, &st.recovery) {
                    (Phase::Active, Some(r)) if r.core.backfill() => PgStateCode::Backfilling,
                    (Phase::Active, Some(_)) => PgStateCode::Recovering,
                    (Phase::Active, None) if st.acting.len() as u32 >= st.size => {
                        PgStateCode::Clean
                    }
                    (Phase::Active, None) => PgStateCode::Degraded,
                    (Phase::Peering, _) => PgStateCode::Peering,
                    (Phase::Inactive, _) => PgStateCode::Inactive,
                    (Phase::Incomplete, _) => PgStateCode::Incomplete,
                },
                objects: self
                    .inner
                    .store
                    .pg_info(self.copy_pgid(PgId { pool, pg }, self.inner.id))
                    .object_count,
                missing_objects: st.recovery.as_ref().map_or(0, |r| r.core.missing_copies()),
                missing_bytes: st.recovery.as_ref().map_or(0, |r| r.core.missing_bytes()),
                damaged_objects: st.damaged.len() as u64,
            })
            .collect()
    }

    // ------------------------------------------------------------------ peering

    async fn peer_until_done(&self, pool: u32, pg: u32, epoch: u64) {
        let mut delay_ms = 100;
        loop {
            if self.epoch() != epoch {
                return; // a newer epoch started its own peering
            }
            match self.peer(pool, pg, epoch).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::info!(
                        "osd.{}: pg {} peering at epoch {epoch} failed: {e}; retrying",
                        self.inner.id,
                        PgId { pool, pg }
                    );
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    delay_ms = (delay_ms * 2).min(2000);
                }
            }
        }
    }

    fn inflight_begin(&self, pgid: PgId) -> InflightGuard {
        lock(&self.inner.inflight).txn_queued(pgid);
        InflightGuard {
            inner: self.inner.clone(),
            pgid,
        }
    }

    /// Waits until no store transaction of `pgid` is in flight (bounded).
    async fn inflight_drain(&self, pgid: PgId) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if lock(&self.inner.inflight).log_query(pgid, tx).is_some() {
            return Ok(());
        }
        match tokio::time::timeout(Duration::from_millis(INFLIGHT_DRAIN_MS), rx).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(format!(
                "pg {pgid}: store transactions still in flight after {INFLIGHT_DRAIN_MS} ms"
            )),
        }
    }

    fn local_log_info(&self, pgid: PgId) -> LogInfo {
        let info = self.inner.store.pg_info(pgid);
        LogInfo {
            last_version: ver(info.last_version),
            log_tail: ver(info.log_tail),
            log: log_to_wire(&self.inner.store.pg_log(pgid)),
            incomplete: info.incomplete,
        }
    }

    async fn pull(
        &self,
        osd: u32,
        epoch: u64,
        pgid: PgId,
        name: &str,
    ) -> Result<Option<(Vec<u8>, Version)>, String> {
        let req = typed::ObjPull {
            pool: pgid.pool,
            pg: pgid.pg,
            name: name.to_string(),
        };
        let state = self.request_peer(osd, epoch, req).await?;
        Ok(state.version.map(|v| (state.data, version(v))))
    }

    // ------------------------------------------------------------------ peers

    async fn peer_conn(&self, osd: u32) -> Result<Arc<RpcConn>, String> {
        if let Some(c) = lock(&self.inner.peers).get(&osd) {
            if c.is_reusable() {
                return Ok(c.clone());
            }
        }
        let ms = self.map_state().ok_or("no map yet")?;
        let addr = ms
            .map
            .osds
            .get(&osd)
            .map(|o| o.addr.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("osd.{osd} has no address"))?;
        let conn = RpcConn::connect(&addr, 2000, None)
            .await
            .map_err(|e| e.to_string())?;
        lock(&self.inner.peers).insert(osd, conn.clone());
        Ok(conn)
    }

    /// A typed request to another daemon (see [`Osd::call_peer`]): its typed reply; a
    /// reply of another kind is an error naming both.
    async fn request_peer<R: Request>(
        &self,
        osd: u32,
        epoch: u64,
        req: R,
    ) -> Result<R::Reply, String> {
        let reply = self.call_peer(osd, epoch, &req.into()).await?;
        expect_reply::<R>(osd, reply)
    }

    /// A request to another daemon; pushes our map first if it has an older one.
    async fn call_peer(&self, osd: u32, epoch: u64, msg: &Msg) -> Result<Msg, String> {
        for _ in 0..3 {
            let conn = self.peer_conn(osd).await?;
            let reply = conn
                .call(epoch, msg, self.inner.config.replica_timeout_ms)
                .await
                .map_err(|e| format!("osd.{osd}: {e}"))?;
            match reply.msg {
                Msg::Error {
                    code: ErrorCode::NeedMap,
                    ..
                } => {
                    self.push_map_to(&conn);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Msg::Error {
                    code: ErrorCode::StaleMap,
                    map,
                    ..
                } => {
                    let _ = self.install_map(&map);
                    return Err(format!("osd.{osd} has a newer map"));
                }
                Msg::Error { code, message, .. } => {
                    return Err(format!("osd.{osd}: {code:?}: {message}"))
                }
                other => return Ok(other),
            }
        }
        Err(format!("osd.{osd} keeps asking for the map"))
    }

    fn push_map_to(&self, conn: &RpcConn) {
        if let Some(ms) = self.map_state() {
            let _ = conn.send_oneway(
                ms.map.epoch,
                &Msg::MapUpdate {
                    map: ms.encoded.to_vec(),
                },
            );
        }
    }

    // ------------------------------------------------------------------ requests

    /// Called in arrival order for every request on a connection.
    fn handle_request(&self, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        let Some(ms) = self.map_state() else {
            reply.send(rid, 0, &Msg::error(ErrorCode::Again, "daemon is booting"));
            return;
        };
        let epoch = ms.map.epoch;
        // Map exchange first: never act on a placement the sender or we have outdated.
        match &inc.msg {
            Msg::MapUpdate { map } => {
                if let Err(e) = self.install_map(map) {
                    tracing::warn!("osd.{}: {e}", self.inner.id);
                }
                reply.send(rid, self.epoch(), &Msg::Ok);
                return;
            }
            Msg::ObjRequest { .. }
            | Msg::RepWrite { .. }
            | Msg::PgQuery { .. }
            | Msg::PgList { .. }
            | Msg::ObjPull { .. }
            | Msg::ObjState { .. }
            | Msg::PgSetLog { .. }
            | Msg::PgMark { .. }
            | Msg::PgCleanQuery { .. }
            | Msg::ScrubPg { .. }
            | Msg::ShardRead { .. }
            | Msg::ScrubQuery { .. } => {
                if inc.epoch < epoch {
                    reply.send(
                        rid,
                        epoch,
                        &Msg::Error {
                            code: ErrorCode::StaleMap,
                            message: format!("sender epoch {} < {epoch}", inc.epoch),
                            map: ms.encoded.to_vec(),
                        },
                    );
                    return;
                }
                if inc.epoch > epoch {
                    // Ask the monitor too, in case the sender never pushes it.
                    self.kick_map_fetch();
                    reply.send(
                        rid,
                        epoch,
                        &Msg::error(ErrorCode::NeedMap, format!("my epoch is {epoch}")),
                    );
                    return;
                }
            }
            _ => {}
        }
        // A stray copy being removed answers nothing about itself.
        let target = match &inc.msg {
            Msg::RepWrite { pool, pg, .. }
            | Msg::PgQuery { pool, pg }
            | Msg::PgList { pool, pg }
            | Msg::ObjPull { pool, pg, .. }
            | Msg::ObjState { pool, pg, .. }
            | Msg::PgSetLog { pool, pg, .. }
            | Msg::PgMark { pool, pg, .. }
            | Msg::ShardRead { pool, pg, .. }
            | Msg::ScrubQuery { pool, pg, .. } => Some(PgId {
                pool: *pool,
                pg: *pg,
            }),
            _ => None,
        };
        if let Some(pgid) = target {
            if lock(&self.inner.removing).contains(&pgid) {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(ErrorCode::Again, "this copy is being removed"),
                );
                return;
            }
        }
        // Block checksums of the frame's bulk bytes: for a whole-object write the bulk is
        // the object, and the store keeps them instead of checksumming it again.
        let block_crcs = inc.bulk_block_crcs;
        match inc.msg {
            Msg::ObjRequest { pool, pg, name, op } => {
                self.client_op(&ms, rid, pool, pg, name, op, block_crcs, reply)
            }
            Msg::RepWrite {
                pool,
                pg,
                name,
                version: v,
                mutation,
            } if spindle_map::split_shard_pg(pg).1.is_some() => {
                // A shard of an erasure-coded group: through the group's ordered queue.
                let done = self.queue_shard_write(PgId { pool, pg }, name, v, mutation);
                tokio::spawn(async move {
                    let msg = done
                        .await
                        .unwrap_or_else(|_| Msg::error(ErrorCode::Internal, "shard write dropped"));
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ShardRead {
                pool,
                pg,
                name,
                version: want,
                offset,
                len,
            } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let msg = osd
                        .shard_read(PgId { pool, pg }, &name, want, offset, len)
                        .await;
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::RepWrite { ref mutation, .. } if is_shard_mutation(mutation) => {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(ErrorCode::Invalid, "shard write to a replicated group"),
                );
            }
            Msg::RepWrite {
                pool,
                pg,
                name,
                version: v,
                mutation,
            } => {
                let guard = self.inflight_begin(PgId { pool, pg });
                let commit = self.inner.store.apply_with_block_crcs(
                    PgId { pool, pg },
                    &name,
                    version(v),
                    to_store_mutation(mutation),
                    block_crcs,
                );
                tokio::spawn(async move {
                    let committed = commit.await;
                    drop(guard);
                    let msg = match committed {
                        Ok(()) => Msg::Ok,
                        Err(e) => store_error_reply(&e),
                    };
                    reply.send(rid, epoch, &msg);
                });
            }
            Msg::PgQuery { pool, pg } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let msg = match osd.inflight_drain(pgid).await {
                        Ok(()) => {
                            let info = osd.local_log_info(pgid);
                            Msg::PgInfo {
                                last_version: info.last_version,
                                log_tail: info.log_tail,
                                log: info.log,
                                incomplete: info.incomplete,
                            }
                        }
                        Err(e) => Msg::error(ErrorCode::Again, e),
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::PgMark {
                pool,
                pg,
                incomplete,
            } => {
                let commit = self.inner.store.mark_pg(PgId { pool, pg }, incomplete);
                tokio::spawn(async move {
                    let msg = match commit.await {
                        Ok(()) => Msg::Ok,
                        Err(e) => store_error_reply(&e),
                    };
                    reply.send(rid, epoch, &msg);
                });
            }
            Msg::PgCleanQuery { pool, pg } => {
                let msg = if self.pg_is_clean(PgId { pool, pg }, epoch) {
                    Msg::Ok
                } else {
                    Msg::error(ErrorCode::Again, "not clean")
                };
                reply.send(rid, epoch, &msg);
            }
            Msg::ScrubPg { pool, pg } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let msg = osd.scrub_pg(PgId { pool, pg }, epoch).await;
                    reply.send(rid, epoch, &msg);
                });
            }
            Msg::ScrubQuery { pool, pg, names } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let entries = osd.scrub_entries(PgId { pool, pg }, &names).await;
                    reply.send_owned(rid, epoch, Msg::ScrubMap { entries });
                });
            }
            Msg::PgList { pool, pg } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let msg = match osd.inflight_drain(pgid).await {
                        Ok(()) => osd.listing_reply(pgid),
                        Err(e) => Msg::error(ErrorCode::Again, e),
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ObjPull { pool, pg, name } => {
                let store = self.inner.store.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let msg = match store.stat(pgid, &name) {
                        None => Msg::ObjState {
                            pool,
                            pg,
                            name,
                            version: None,
                            data: Vec::new(),
                        },
                        Some(meta) => match store.read(pgid, &name, 0, meta.size_bytes).await {
                            Ok(data) => Msg::ObjState {
                                pool,
                                pg,
                                name,
                                version: Some(ver(meta.version)),
                                data,
                            },
                            Err(e) => store_error_reply(&e),
                        },
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ObjState {
                pool,
                pg,
                name,
                version: v,
                data,
            } => {
                let guard = self.inflight_begin(PgId { pool, pg });
                let commit = self.inner.store.recover_object(
                    PgId { pool, pg },
                    &name,
                    v.map(|v| (data, version(v))),
                );
                tokio::spawn(async move {
                    let committed = commit.await;
                    drop(guard);
                    let msg = match committed {
                        Ok(()) => Msg::Ok,
                        Err(e) => store_error_reply(&e),
                    };
                    reply.send(rid, epoch, &msg);
                });
            }
            Msg::PgSetLog {
                pool,
                pg,
                last_version,
                log_tail,
                log,
            } => {
                let commit = self.inner.store.set_pg_log(
                    PgId { pool, pg },
                    log_from_wire(&log),
                    version(last_version),
                    version(log_tail),
                );
                tokio::spawn(async move {
                    let msg = match commit.await {
                        Ok(()) => Msg::Ok,
                        Err(e) => store_error_reply(&e),
                    };
                    reply.send(rid, epoch, &msg);
                });
            }
            other => {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(
                        ErrorCode::Invalid,
                        format!("a storage daemon does not handle {}", other.name()),
                    ),
                );
            }
        }
    }

    /// Every object of a placement group with size and version.
    fn listing_reply(&self, pgid: PgId) -> Msg {
        let listing = self
            .inner
            .store
            .list(pgid)
            .into_iter()
            .map(|(name, m)| ObjectListing {
                name,
                size_bytes: m.size_bytes,
                version: ver(m.version),
            })
            .collect();
        Msg::ObjReply {
            version: Ver::default(),
            size_bytes: 0,
            data: Vec::new(),
            listing,
        }
    }

    fn kick_map_fetch(&self) {
        let conn = lock(&self.inner.mon).clone();
        if let Some(conn) = conn {
            let osd = self.clone();
            tokio::spawn(async move { osd.fetch_map(&conn).await });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn client_op(
        &self,
        ms: &Arc<MapState>,
        rid: u64,
        pool: u32,
        pg: u32,
        name: String,
        op: ObjOp,
        block_crcs: Vec<u32>,
        reply: Replier,
    ) {
        let epoch = ms.map.epoch;
        let pgid = PgId { pool, pg };
        self.inner.client_ops.fetch_add(1, Ordering::Relaxed);
        let Some(mapping) = ms.placement.pg(pool, pg) else {
            reply.send(
                rid,
                epoch,
                &Msg::error(ErrorCode::NoSuchPool, format!("no pg {pgid}")),
            );
            return;
        };
        if mapping.primary() != Some(self.inner.id) {
            reply.send(
                rid,
                epoch,
                &Msg::error(
                    ErrorCode::NotPrimary,
                    format!("osd.{} is not primary", self.inner.id),
                ),
            );
            return;
        }
        let phase = lock(&self.inner.pgs)
            .get(&(pool, pg))
            .map_or(Phase::Peering, |s| s.phase);
        if phase != Phase::Active {
            reply.send(
                rid,
                epoch,
                &Msg::error(ErrorCode::Again, format!("pg {pgid} is {phase:?}")),
            );
            return;
        }
        // New data is refused before anything is assigned or sent; deletes and truncates
        // always go through (they are how space is freed).
        let adds_data = match &op {
            ObjOp::Mutate(m) => !matches!(m, WireMutation::Delete | WireMutation::Truncate { .. }),
            _ => false,
        };
        if adds_data {
            if let Some(why) = self.refuse_for_space(&ms.map, mapping) {
                reply.send(rid, epoch, &Msg::error(ErrorCode::NoSpace, why));
                return;
            }
        }
        let osd = self.clone();
        if let Some(layout) = self.ec_layout_of(&ms.map, pool) {
            let mapping = mapping.clone();
            tokio::spawn(async move {
                osd.ec_client_op(epoch, pgid, mapping, layout, name, op, reply, rid)
                    .await
            });
            return;
        }
        if matches!(&op, ObjOp::Mutate(m) if is_shard_mutation(m)) {
            reply.send(
                rid,
                epoch,
                &Msg::error(
                    ErrorCode::Invalid,
                    "erasure-coded write to a replicated pool",
                ),
            );
            return;
        }
        // Operations on an object some copy still misses wait for its recovery (reads and
        // stats only when this daemon itself misses it).
        let wait_for = match &op {
            ObjOp::Mutate(_) => self.object_missing(pgid, &name, false),
            ObjOp::Read { .. } | ObjOp::Stat => self.object_missing(pgid, &name, true),
            ObjOp::List => false,
        };
        if wait_for {
            let ms = ms.clone();
            let since = self.interval_of(pgid).unwrap_or(0);
            tokio::spawn(async move {
                if let Err(e) = osd.ensure_recovered(pgid, since, &name).await {
                    reply.send(rid, epoch, &Msg::error(ErrorCode::Again, e));
                    return;
                }
                osd.client_op(&ms, rid, pool, pg, name, op, block_crcs, reply);
            });
            return;
        }
        match op {
            ObjOp::Mutate(m) => {
                // Fast path: all replica connections exist, so the version is assigned and
                // the replication frames are queued right now, in arrival order.
                let replicas: Vec<u32> = mapping
                    .up
                    .iter()
                    .copied()
                    .filter(|&o| o != self.inner.id)
                    .collect();
                let conns: Option<Vec<Arc<RpcConn>>> = {
                    let peers = lock(&self.inner.peers);
                    replicas
                        .iter()
                        .map(|o| peers.get(o).filter(|c| c.is_reusable()).cloned())
                        .collect()
                };
                match conns {
                    Some(conns) => {
                        let started = self.start_write(epoch, pgid, &name, m, block_crcs, &conns);
                        tokio::spawn(async move {
                            let msg = osd.finish_write(started).await;
                            reply.send(rid, epoch, &msg);
                        });
                    }
                    None => {
                        tokio::spawn(async move {
                            let mut conns = Vec::new();
                            for o in replicas {
                                match osd.peer_conn(o).await {
                                    Ok(c) => conns.push(c),
                                    Err(e) => {
                                        reply.send(rid, epoch, &Msg::error(ErrorCode::Again, e));
                                        return;
                                    }
                                }
                            }
                            let started =
                                osd.start_write(epoch, pgid, &name, m, block_crcs, &conns);
                            let msg = osd.finish_write(started).await;
                            reply.send(rid, epoch, &msg);
                        });
                    }
                }
            }
            ObjOp::Read { offset, len } => {
                let peers: Vec<u32> = mapping
                    .up
                    .iter()
                    .copied()
                    .filter(|&o| o != self.inner.id)
                    .collect();
                tokio::spawn(async move {
                    let msg = osd.read(epoch, pgid, &name, offset, len, &peers).await;
                    reply.send_owned(rid, epoch, msg);
                });
            }
            ObjOp::Stat => {
                let msg = match self.inner.store.stat(pgid, &name) {
                    Some(meta) => Msg::ObjReply {
                        version: ver(meta.version),
                        size_bytes: meta.size_bytes,
                        data: Vec::new(),
                        listing: Vec::new(),
                    },
                    None => Msg::error(ErrorCode::NotFound, format!("{name}: no such object")),
                };
                reply.send(rid, epoch, &msg);
            }
            ObjOp::List => match self.primary_misses_objects(pgid) {
                None => {
                    reply.send(rid, epoch, &self.listing_reply(pgid));
                }
                // Still recovering myself: the authoritative copy has the full listing.
                Some(source) => {
                    tokio::spawn(async move {
                        let msg = match osd
                            .request_peer(source, epoch, typed::PgList { pool, pg })
                            .await
                        {
                            Ok(listing) => Msg::from(listing),
                            Err(e) => Msg::error(ErrorCode::Again, format!("listing: {e}")),
                        };
                        reply.send_owned(rid, epoch, msg);
                    });
                }
            },
        }
    }

    /// Assigns the version, applies locally and queues replication, atomically per PG.
    /// (The error is the reply to send; replies are built once, not boxed.)
    #[allow(clippy::result_large_err)]
    fn start_write(
        &self,
        epoch: u64,
        pgid: PgId,
        name: &str,
        m: WireMutation,
        block_crcs: Vec<u32>,
        conns: &[Arc<RpcConn>],
    ) -> Result<StartedWrite, Msg> {
        if matches!(m, WireMutation::Delete) && self.inner.store.stat(pgid, name).is_none() {
            return Err(Msg::error(
                ErrorCode::NotFound,
                format!("{name}: no such object"),
            ));
        }
        let replaces = matches!(m, WireMutation::WriteFull(_) | WireMutation::Delete);
        let mut pgs = lock(&self.inner.pgs);
        let st = pgs
            .get_mut(&(pgid.pool, pgid.pg))
            .filter(|s| s.phase == Phase::Active && s.epoch == epoch)
            .ok_or_else(|| Msg::error(ErrorCode::Again, "placement group changed"))?;
        if st
            .recovery
            .as_ref()
            .is_some_and(|r| r.core.is_missing(name, None))
        {
            // Never reached through client_op (it recovers first); kept as a guard.
            return Err(Msg::error(ErrorCode::Again, "object is being recovered"));
        }
        let v = Ver {
            epoch,
            seq: st.last.seq + 1,
        };
        // A large whole-object write: the replicas' body and the local write share one
        // buffer (no copy), and the body's checksum is combined from the block checksums
        // computed when the client's frame was verified (no pass over the bytes).
        let (m, shared) = match m {
            WireMutation::WriteFull(data) if data.len() >= SHARED_WRITE_BYTES_MIN => {
                (WireMutation::WriteFull(Vec::new()), Some(Arc::new(data)))
            }
            other => (other, None),
        };
        let rep = Msg::RepWrite {
            pool: pgid.pool,
            pg: pgid.pg,
            name: name.to_string(),
            version: v,
            mutation: m,
        };
        // One encoding (and checksum) of the body for every replica.
        let prepared = match &shared {
            Some(data) => {
                let bulk_crc = spindle_ec::crc32c::crc32c_of_blocks(&block_crcs, data.len());
                Prepared::with_shared_bulk(&rep, data.clone(), bulk_crc)
            }
            None => Prepared::new(&rep),
        };
        let m = match rep {
            Msg::RepWrite { mutation, .. } => mutation,
            _ => {
                return Err(Msg::error(
                    ErrorCode::Internal,
                    "replication message mismatch",
                ))
            }
        };
        let mut pending = Vec::with_capacity(conns.len());
        for c in conns {
            match c.start_prepared(epoch, &prepared) {
                Ok(p) => pending.push(p),
                Err(e) => return Err(Msg::error(ErrorCode::Again, e.to_string())),
            }
        }
        st.last = v;
        let inflight = self.inflight_begin(pgid);
        let commit = match shared {
            Some(data) => {
                self.inner
                    .store
                    .apply_full_shared(pgid, name, version(v), data, block_crcs)
            }
            None => self.inner.store.apply_with_block_crcs(
                pgid,
                name,
                version(v),
                to_store_mutation(m),
                block_crcs,
            ),
        };
        drop(pgs);
        Ok(StartedWrite {
            version: v,
            commit,
            inflight,
            pending,
            pgid,
            name: name.to_string(),
            replaces,
        })
    }

    async fn finish_write(&self, started: Result<StartedWrite, Msg>) -> Msg {
        let w = match started {
            Ok(w) => w,
            Err(msg) => return msg,
        };
        let timeout = self.inner.config.replica_timeout_ms;
        let local = w.commit.await;
        drop(w.inflight);
        let answers =
            fanout::wait_all(w.pending.into_iter().map(|p| ((), p)).collect(), timeout).await;
        let mut failure = None;
        let mut no_space = None;
        let mut replica_error = false;
        for ((), f) in answers.failures {
            replica_error |= f.copy_refused();
            match f {
                fanout::CopyFailure::NoSpace(message) => {
                    no_space = Some(format!("replica: {message}"));
                }
                fanout::CopyFailure::NewerMap(map) => {
                    let _ = self.install_map(&map);
                    failure = Some("a replica has a newer map".to_string());
                }
                other => failure = Some(format!("replica: {other}")),
            }
        }
        // Some copies may have applied the write and others not: peering again compares
        // the logs and recovers the object on the copies that miss it (or lack the space).
        if replica_error || local.is_err() {
            self.repeer(w.pgid, w.version.epoch);
        }
        if let Err(e) = local {
            if matches!(e, StoreError::NoSpace(_)) {
                tracing::warn!("osd.{}: write {} refused: {e}", self.inner.id, w.name);
            } else {
                tracing::error!("osd.{}: local write failed: {e}", self.inner.id);
            }
            return store_error_reply(&e);
        }
        if let Some(f) = no_space {
            tracing::warn!(
                "osd.{}: write {} in pg {}.{:x} not acknowledged: {f}",
                self.inner.id,
                w.name,
                w.pgid.pool,
                w.pgid.pg
            );
            return Msg::error(ErrorCode::NoSpace, f);
        }
        if let Some(f) = failure {
            tracing::info!(
                "osd.{}: write {} in pg {} not acknowledged: {f}",
                self.inner.id,
                w.name,
                w.pgid
            );
            return Msg::error(ErrorCode::Again, f);
        }
        if w.replaces {
            self.clear_damaged(w.pgid, &w.name);
        }
        let size_bytes = self
            .inner
            .store
            .stat(w.pgid, &w.name)
            .map_or(0, |m| m.size_bytes);
        Msg::ObjReply {
            version: w.version,
            size_bytes,
            data: Vec::new(),
            listing: Vec::new(),
        }
    }

    /// Reads locally; on a checksum failure reads the object from another copy, repairs
    /// the local one and serves the good data.
    async fn read(
        &self,
        epoch: u64,
        pgid: PgId,
        name: &str,
        offset: u64,
        len: u64,
        peers: &[u32],
    ) -> Msg {
        let store = &self.inner.store;
        let Some(meta) = store.stat(pgid, name) else {
            return Msg::error(ErrorCode::NotFound, format!("{name}: no such object"));
        };
        match store.read(pgid, name, offset, len).await {
            Ok(data) => Msg::ObjReply {
                version: ver(meta.version),
                size_bytes: meta.size_bytes,
                data,
                listing: Vec::new(),
            },
            Err(e @ StoreError::Corrupt { .. }) => {
                tracing::error!("osd.{}: {e}; reading another copy", self.inner.id);
                for &peer in peers {
                    match self.pull(peer, epoch, pgid, name).await {
                        Ok(Some((data, v))) if v == meta.version => {
                            let start = (offset.min(data.len() as u64)) as usize;
                            let end = (offset.saturating_add(len)).min(data.len() as u64) as usize;
                            let part = data[start..end].to_vec();
                            match store.recover_object(pgid, name, Some((data, v))).await {
                                Ok(()) => {
                                    self.inner
                                        .repaired
                                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    tracing::warn!(
                                        "osd.{}: repaired {name} in pg {pgid} from osd.{peer}",
                                        self.inner.id
                                    );
                                }
                                Err(e) => tracing::error!("repair of {name} failed: {e}"),
                            }
                            return Msg::ObjReply {
                                version: ver(v),
                                size_bytes: meta.size_bytes,
                                data: part,
                                listing: Vec::new(),
                            };
                        }
                        Ok(_) => continue,
                        Err(e) => tracing::warn!("osd.{}: {e}", self.inner.id),
                    }
                }
                Msg::error(ErrorCode::Corrupt, format!("{e}; no good copy reachable"))
            }
            Err(e) => store_error_reply(&e),
        }
    }
}

struct StartedWrite {
    version: Ver,
    commit: spindle_store::Commit,
    /// Held until the local commit resolved (peering waits for it).
    inflight: InflightGuard,
    pending: Vec<PendingReply>,
    pgid: PgId,
    name: String,
    /// A whole-object write or a delete: once acknowledged, the object is no longer
    /// damaged (scrub's verdict is replaced).
    replaces: bool,
}

/// The typed reply of request type `R` from `osd` (an `Error` reply, if [`Osd::call_peer`]
/// did not already turn it into an error, and a reply of another kind are errors).
fn expect_reply<R: Request>(osd: u32, msg: Msg) -> Result<R::Reply, String> {
    reply_to::<R>(msg).map_err(|e| format!("osd.{osd}: {e}"))
}
