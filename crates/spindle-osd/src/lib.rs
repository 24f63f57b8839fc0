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
//! Where things are: `handle_request` (below) checks the sender's map epoch and routes by
//! protocol to `client.rs` (client operations on the primary), `replication.rs` (replica
//! writes), `ec.rs` (erasure-coded operations and shard writes/reads), `peering.rs` (the
//! copy side of peering and recovery), `recovery.rs` (the primary side: peering rounds over
//! `spindle_pg::PgCore`, recovery, stray removal), `scrub.rs`; `fanout.rs` waits for the
//! copies of a write; `counters.rs` holds every event count.
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

mod client;
mod counters;
pub mod cpu_budget;
mod metrics;
use counters::OsdCounters;
mod ec;
mod exec;
mod fanout;
mod lease;
mod peering;
mod recovery;
mod replication;
mod scrub;
mod slow;
pub use slow::SLOW_OP_MS_DEFAULT;

/// The pure peering decisions moved to `spindle-pg`; re-exported for compatibility.
pub use spindle_pg::{plan, LogInfo, SyncPlan};

use spindle_map::session::{DaemonSession, SessionAction, SessionState, SessionTiming};
use spindle_map::{ClusterMap, PgMapping};
use spindle_pg::rules::IntervalChange;
use spindle_pg::{CopyId, MemberHistory, RepInterval, ReplicationCore, TxnGate};
use spindle_proto::msg::typed;
use spindle_proto::msg::{
    LogEntryMsg, Mutation as WireMutation, ObjOp, ObjectListing, PgReport, PgStateCode, Ver,
};
use spindle_proto::net::{
    accept_loop_via, Incoming, NetError, PendingReply, Prepared, Replier, RpcConn, Service,
};
use spindle_proto::request::{reply_to, MapReply, Request};
use spindle_proto::transport::Net;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{LogEntry, LogOp, Mutation, PgId, Store, StoreConfig, StoreError, Version};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
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
    /// TCP, or an in-process network in tests.
    pub net: Net,
    /// Serve Prometheus metrics on this address (`/metrics`; `127.0.0.1:0` picks a
    /// port); None: no endpoint.
    pub metrics_listen: Option<String>,
    /// Encrypt the payloads of every authenticated session this daemon serves
    /// (ChaCha20-Poly1305; `spindle_proto::auth`). Without authentication it has no effect.
    pub encrypt: bool,
    /// A client operation unanswered this long is slow (`SLOW_OPS` health check).
    pub slow_op_ms: u64,
    /// Threads that run pushdown programs (`exec.rs`), at a lower priority than I/O.
    pub exec_threads: usize,
    /// Bytes of object data kept for repeated program runs (`exec.rs`, `DataCache`).
    pub exec_cache_bytes: u64,
    /// Share of one CPU the execution threads may use together, in percent
    /// (`cpu_budget.rs`): a busy program never takes more, so I/O keeps its latency.
    pub exec_cpu_percent: u32,
}

/// Default `OsdConfig::exec_threads`: one, so programs leave the other cores to I/O.
pub const EXEC_THREADS_DEFAULT: usize = 1;
/// Default `OsdConfig::exec_cache_bytes`.
pub const EXEC_CACHE_BYTES_DEFAULT: u64 = 256 << 20;

impl OsdConfig {
    pub fn new(id: u32, dir: impl Into<PathBuf>, mon_addr: impl Into<String>) -> Self {
        OsdConfig {
            id,
            dir: dir.into(),
            mon_addr: mon_addr.into(),
            listen: "127.0.0.1:0".to_string(),
            heartbeat_ms: spindle_map::session::HEARTBEAT_MS_DEFAULT,
            replica_timeout_ms: 10_000,
            recovery_ops_max: 2,
            recovery_bytes_per_sec: 0,
            stray_check_ms: 2000,
            scrub_interval_ms: 24 * 3600 * 1000,
            net: Net::Tcp,
            metrics_listen: None,
            encrypt: false,
            slow_op_ms: SLOW_OP_MS_DEFAULT,
            exec_threads: EXEC_THREADS_DEFAULT,
            exec_cache_bytes: EXEC_CACHE_BYTES_DEFAULT,
            exec_cpu_percent: cpu_budget::EXEC_CPU_PERCENT_DEFAULT,
        }
    }
}

/// Whole-object writes at least this large are replicated from the buffer the local
/// store writes too (see `start_write`): those the store writes straight from the buffer
/// (smaller ones it copies into its journal anyway).
const SHARED_WRITE_BYTES_MIN: usize = spindle_store::DIRECT_WRITE_BYTES_MIN;

/// The store's form of a replicated mutation; `None` for the erasure-coded ones (they are
/// applied through the shard path, `ec.rs`): callers refuse those with
/// [`not_replicated`].
/// The refusal of an erasure-coded mutation sent to a replicated group.
fn not_replicated() -> Msg {
    Msg::error(
        ErrorCode::Invalid,
        "an erasure-coded write to a replicated group",
    )
}

fn log_to_wire(log: &[LogEntry]) -> Vec<LogEntryMsg> {
    log.iter()
        .map(|e| LogEntryMsg {
            version: e.version,
            name: e.name.clone(),
            delete: e.op == LogOp::Delete,
        })
        .collect()
}
fn log_from_wire(log: &[LogEntryMsg]) -> Vec<LogEntry> {
    log.iter()
        .map(|e| LogEntry {
            version: e.version,
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
type MapState = spindle_map::MapView;

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
    /// Identity of the interval: up set (erasure-coded: each shard position's daemon)
    /// and each member's `up_from` (`spindle_pg::rules::interval_identity`).
    interval: Vec<(u32, u64)>,
    phase: Phase,
    /// Erasure-coded groups: last version handed out (valid while Active). Replicated
    /// groups' versions are `rep`'s.
    last: Ver,
    /// Replicated groups: the write rules (`spindle_pg::ReplicationCore`: versions,
    /// `min_size`, acknowledge only when every acting copy has a write, re-peer on a
    /// failure, drop writes in flight at an interval change); `client.rs` is its shell.
    rep: ReplicationCore,
    acting: Vec<u32>,
    size: u32,
    min_size: u32,
    /// Objects some copies still miss (while Active); None = all copies complete.
    recovery: Option<recovery::Recovery>,
    /// Stored names of objects the last whole-group scrub found with no intact copy (fewer
    /// than k intact shards): the group is `inconsistent` while this is not empty. Kept
    /// across intervals while this daemon stays primary; in memory only (a restart or a
    /// new primary finds them again at the next scrub). Cleared per object by a client's
    /// whole-object write or delete, and replaced by every later whole-group scrub.
    damaged: BTreeSet<String>,
    /// Erasure-coded slots whose write failed on some shards since the group last
    /// activated: settled (rolled forward or back, `ec_recover`) before the object's next
    /// operation. A copy may apply such a write after it answered peering's log query (a
    /// re-peer keeps the epoch, so the copy cannot refuse it as stale), so the log-based
    /// missing set alone can miss it; activation adds these to the missing set.
    unsettled: BTreeSet<String>,
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
    /// The monitors (`config.mon_addr` parsed) and which one is in use.
    mons: spindle_proto::MonAddrs,
    /// This daemon's identity, ticket and the service key (with authentication: a
    /// keyring in its directory).
    creds: Option<Arc<Credentials>>,
    /// Checks the tickets of connecting entities (with authentication).
    verifier: Option<Arc<dyn spindle_proto::auth::Verifier>>,
    /// Read leases granted to this daemon as a primary, and promised by it as a copy.
    leases: Mutex<lease::Leases>,
    /// Peers with a ping in flight (one at a time each).
    pinging: Mutex<std::collections::HashSet<u32>>,
    push_tx: mpsc::UnboundedSender<Incoming>,
    throttle: recovery::Throttle,
    /// Stray groups being removed: requests for them get `Again`.
    removing: Mutex<HashSet<PgId>>,
    /// Every event count, reported with each heartbeat.
    counters: OsdCounters,
    /// Client operations by type, observed as each is answered (`metrics.rs`).
    op_metrics: metrics::OpMetrics,
    /// Client operations in flight, for slow-request reports (`slow.rs`).
    in_flight: slow::InFlight,
    /// Where this daemon serves `/metrics` (reported with each heartbeat), once bound.
    metrics_addr: std::sync::OnceLock<String>,
    /// This daemon's file system is above the map's full ratio (updated with every
    /// heartbeat): new client writes are refused with `NoSpace`, deletes are not.
    over_full_ratio: std::sync::atomic::AtomicBool,
    /// Local store transactions queued but not yet applied, per PG (writes and recovery
    /// pushes), and the log queries waiting for them (`spindle_pg::TxnGate`). A PG's log
    /// is only reported once they drained: peering must see every write that may still
    /// be acknowledged.
    inflight: Mutex<TxnGate<PgId, tokio::sync::oneshot::Sender<()>>>,
    /// Since when each copy of every group has been an acting member without a break,
    /// from the maps this daemon installed (`spindle_pg::MemberHistory`): peering passes it
    /// to `PgCore::set_members`. In memory: a restarted daemon vouches only for the epochs
    /// since it booted.
    members: Mutex<MemberHistory<(u32, u32)>>,
    /// Identifies each replicated write to its group's `ReplicationCore` (`OpId`).
    next_write_op: std::sync::atomic::AtomicU64,
    /// Coding of erasure-coded pools (by pool id).
    ec_layouts: Mutex<HashMap<u32, spindle_map::ec::EcLayout>>,
    /// Per stored erasure-coded group: the queue applying its shard writes in order.
    shard_queues: Mutex<HashMap<PgId, mpsc::UnboundedSender<ec::ShardJob>>>,
    /// Per object of an erasure-coded group this daemon is primary of: one operation at a
    /// time.
    ec_locks: Mutex<ec::ObjectLocks>,
    /// Pushdown programs (`exec.rs`): loaded programs, object data kept for repeated runs,
    /// and the threads runs go to.
    exec_programs: Mutex<exec::ProgramCache>,
    exec_data: Mutex<exec::DataCache>,
    exec_pool: exec::ExecPool,
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

use spindle_proto::tickets::Credentials;

/// A storage daemon's verifier: a connecting entity shows a ticket sealed with the service
/// key (which this daemon got from the monitors) and proves its session key.
struct OsdVerifier {
    creds: Arc<Credentials>,
    encrypt: bool,
}

impl spindle_proto::auth::Verifier for OsdVerifier {
    fn encrypt(&self) -> bool {
        self.encrypt
    }
    fn ready(&self, _entity: &str) -> Result<(), String> {
        match self.creds.service_key() {
            Some(_) => Ok(()),
            None => Err("this daemon has no service key yet (booting)".into()),
        }
    }

    fn accept(
        &self,
        entity: &str,
        ticket: &[u8],
    ) -> Result<
        (spindle_proto::auth::Key, Arc<spindle_proto::auth::Peer>),
        spindle_proto::auth::AuthError,
    > {
        use spindle_proto::auth::{parse_entity, unix_ms, AuthError, Caps, Peer, Ticket};
        let kind = parse_entity(entity)?;
        let service = self.creds.service_key().ok_or_else(|| {
            AuthError("this daemon has no service key yet (booting); retry".into())
        })?;
        if ticket.is_empty() {
            return Err(AuthError(
                "a storage daemon needs a ticket from the monitors".into(),
            ));
        }
        let t = Ticket::open(&service, ticket, unix_ms())?;
        if t.entity != entity {
            return Err(AuthError(format!(
                "the ticket is {}'s, not {entity}'s",
                t.entity
            )));
        }
        let caps = Caps::parse(&t.caps)?;
        Ok((
            t.session_key,
            Arc::new(Peer {
                entity: t.entity,
                kind,
                caps,
            }),
        ))
    }
}

/// Whether a client (not a daemon) may send `msg`, given the map `ms`: None if so.
fn client_refusal(peer: &spindle_proto::auth::Peer, msg: &Msg, ms: &MapState) -> Option<String> {
    use spindle_proto::auth::Access;
    let who = &peer.entity;
    let pool_name = |pool: u32| {
        ms.map
            .pools
            .get(&pool)
            .map_or_else(|| format!("#{pool}"), |p| p.name.clone())
    };
    match msg {
        Msg::ObjRequest { pool, name, op, .. } => {
            let access = match op {
                ObjOp::Mutate(_) => Access::Write,
                _ => Access::Read,
            };
            let p = pool_name(*pool);
            // A program run reads every object it names.
            let more: &[String] = match op {
                ObjOp::Exec(e) => &e.more,
                _ => &[],
            };
            let name = std::iter::once(name)
                .chain(more)
                .find(|n| !peer.caps.osd_allows(&p, n, access))?;
            Some({
                let what = if matches!(access, Access::Write) {
                    "write"
                } else {
                    "read"
                };
                if name.starts_with(spindle_proto::auth::IMAGE_OBJECT_PREFIX) {
                    format!("{who} may not {what} image object {name} in pool {p} (needs `images`)")
                } else {
                    format!("{who} may not {what} {name} in pool {p}")
                }
            })
        }
        Msg::ScrubPg { pool, .. } => {
            let p = pool_name(*pool);
            (!peer.caps.osd_allows(&p, "", Access::Admin))
                .then(|| format!("{who} may not scrub pool {p} (needs `osd allow *`)"))
        }
        // A client offers its newer map: taken from the monitors instead (see below).
        Msg::MapUpdate { .. } => None,
        other => Some(format!("{who} may not send {}", other.name())),
    }
}

impl Service for Osd {
    fn epoch(&self) -> u64 {
        self.map_state().map_or(0, |m| m.map.epoch)
    }
    fn verifier(&self) -> Option<Arc<dyn spindle_proto::auth::Verifier>> {
        self.inner.verifier.clone()
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        self.handle_request(inc, reply)
    }
}

/// Longest wait for a PG's in-flight store transactions before peering retries.
const INFLIGHT_DRAIN_MS: u64 = 10_000;

use spindle_types::sync::lock;

impl Osd {
    /// Opens the store, binds the listener, boots with the monitor and serves until
    /// `shutdown` resolves.
    pub async fn run(
        config: OsdConfig,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), OsdError> {
        let mons = spindle_proto::MonAddrs::parse(&config.mon_addr).map_err(OsdError::Boot)?;
        let store_dir = config.dir.join("store");
        let store = tokio::task::spawn_blocking(move || Store::open(StoreConfig::new(store_dir)))
            .await
            .map_err(|e| OsdError::Boot(e.to_string()))??;
        // With a keyring in its directory, the daemon authenticates as osd.N and requires
        // authentication.
        let keyring_path = config.dir.join("keyring");
        let creds = if keyring_path.exists() {
            let k = spindle_proto::auth::Keyring::load(&keyring_path)
                .map_err(|e| OsdError::Boot(e.to_string()))?;
            let id = k
                .identity(&format!("osd.{}", config.id))
                .map_err(|e| OsdError::Boot(e.to_string()))?;
            Some(Credentials::new(id))
        } else {
            None
        };
        let verifier = creds.as_ref().map(|c| {
            Arc::new(OsdVerifier {
                creds: c.clone(),
                encrypt: config.encrypt,
            }) as Arc<dyn spindle_proto::auth::Verifier>
        });
        let (listener, addr) = config.net.bind(&config.listen).await?;
        let net = config.net.clone();
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let (map_tx, _) = watch::channel(0u64);
        let mut registry = spindle_metrics::prometheus_client::registry::Registry::default();
        let labeled =
            registry.sub_registry_with_label(("osd".into(), config.id.to_string().into()));
        let op_metrics = metrics::OpMetrics::register(labeled);
        let osd = Osd {
            inner: Arc::new(Inner {
                mons,
                creds,
                verifier,
                leases: Mutex::new(lease::Leases::default()),
                pinging: Mutex::new(Default::default()),
                id: config.id,
                addr: addr.clone(),
                store: Arc::new(store),
                map: RwLock::new(None),
                map_tx,
                pgs: Mutex::new(HashMap::new()),
                peers: Mutex::new(HashMap::new()),
                mon: Mutex::new(None),
                push_tx,
                throttle: recovery::Throttle::new(
                    config.recovery_ops_max,
                    config.recovery_bytes_per_sec,
                ),
                removing: Mutex::new(HashSet::new()),
                counters: OsdCounters::default(),
                op_metrics,
                in_flight: slow::InFlight::new(config.slow_op_ms.max(1)),
                exec_programs: Mutex::new(exec::ProgramCache::default()),
                exec_data: Mutex::new(exec::DataCache::new(config.exec_cache_bytes)),
                exec_pool: exec::ExecPool::new(
                    config.exec_threads,
                    config.exec_cpu_percent,
                    config.id,
                ),
                metrics_addr: Default::default(),
                over_full_ratio: Default::default(),
                inflight: Mutex::new(TxnGate::new()),
                members: Mutex::new(MemberHistory::new()),
                next_write_op: Default::default(),
                ec_layouts: Mutex::new(HashMap::new()),
                shard_queues: Mutex::new(HashMap::new()),
                ec_locks: Mutex::new(HashMap::new()),
                config,
            }),
        };
        tracing::info!("osd.{} listening on {addr}", osd.inner.id);
        let metrics_endpoint = match osd.inner.config.metrics_listen.clone() {
            None => None,
            Some(listen) => {
                let o = osd.clone();
                registry
                    .sub_registry_with_label(("osd".into(), o.inner.id.to_string().into()))
                    .register_collector(metrics::collector(move || o.metric_samples()));
                let e = spindle_metrics::serve(&listen, Arc::new(registry), None)
                    .await
                    .map_err(|e| OsdError::Boot(format!("metrics endpoint on {listen}: {e}")))?;
                tracing::info!(
                    "osd.{} serves metrics on http://{}/metrics",
                    osd.inner.id,
                    e.addr
                );
                let _ = osd.inner.metrics_addr.set(e.addr.to_string());
                Some(e)
            }
        };
        let server = {
            let osd = osd.clone();
            tokio::spawn(async move { accept_loop_via(&net, listener, "osd", osd).await })
        };
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
        let pinger = {
            let osd = osd.clone();
            tokio::spawn(async move { osd.ping_loop().await })
        };
        shutdown.await;
        tracing::info!("osd.{} shutting down", osd.inner.id);
        server.abort();
        monitor_link.abort();
        pusher.abort();
        strays.abort();
        scrubber.abort();
        pinger.abort();
        drop(metrics_endpoint);
        Ok(())
    }

    fn epoch(&self) -> u64 {
        self.map_state().map_or(0, |m| m.map.epoch)
    }

    /// Why a write to `osd` in flight is abandoned: the newest map marks it down (or no
    /// longer lists it). `None` while it is up. For `fanout::wait_all`.
    fn marked_down(&self, osd: u32) -> Option<String> {
        let ms = self.map_state()?;
        match ms.map.osds.get(&osd) {
            Some(o) if o.up => None,
            _ => Some(format!("osd.{osd} marked down at epoch {}", ms.map.epoch)),
        }
    }

    /// Resolves once an installed map marks `osd` down: a request in flight to it is
    /// abandoned then, not waited for until the replica timeout (a daemon cut off never
    /// answers; `fanout::wait_all` does the same for writes).
    async fn until_marked_down(&self, osd: u32) -> String {
        let mut maps = self.inner.map_tx.subscribe();
        loop {
            if let Some(why) = self.marked_down(osd) {
                return why;
            }
            if maps.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    fn map_state(&self) -> Option<Arc<MapState>> {
        self.inner
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    // ------------------------------------------------------------------ monitor link

    /// The daemon's session with the monitor: the shell of
    /// [`spindle_map::session::DaemonSession`], which decides when to boot, subscribe,
    /// heartbeat, fetch a map and boot again; this executes its actions over a real
    /// connection (a fresh one for every boot) and feeds the answers back.
    async fn mon_loop(&self) {
        let hb = Duration::from_millis(self.inner.config.heartbeat_ms);
        // Heartbeats are given up after `answer_timeout_ms` (two intervals): a silently
        // cut-off monitor is left for the next one well before the leader's down interval
        // (the invariant in `spindle_map::session`).
        let timing = SessionTiming::with_heartbeat(self.inner.config.heartbeat_ms);
        let answer_timeout = Duration::from_millis(timing.answer_timeout_ms);
        let started = tokio::time::Instant::now();
        let now_ms = || started.elapsed().as_millis() as u64;
        let (mut session, mut actions) = DaemonSession::start(timing, now_ms());
        let mut conn: Option<Arc<RpcConn>> = None;
        loop {
            let mut queue: std::collections::VecDeque<SessionAction> = actions.into();
            while let Some(action) = queue.pop_front() {
                let more = match action {
                    SessionAction::Boot => {
                        *lock(&self.inner.mon) = None;
                        conn = None;
                        match self.connect_and_boot(timing.boot_timeout_ms).await {
                            Ok(c) => {
                                *lock(&self.inner.mon) = Some(c.clone());
                                conn = Some(c);
                                session.on_boot_answered(now_ms(), self.epoch())
                            }
                            Err(e) => {
                                tracing::warn!("osd.{}: boot failed: {e}", self.inner.id);
                                session.on_boot_failed(now_ms())
                            }
                        }
                    }
                    SessionAction::Subscribe { have_epoch } => {
                        if let Some(c) = &conn {
                            let _ = c.send_oneway(
                                have_epoch,
                                &Msg::GetMap {
                                    have_epoch,
                                    subscribe: true,
                                },
                            );
                        }
                        Vec::new()
                    }
                    SessionAction::Heartbeat => match &conn {
                        None => session.on_link_failed(now_ms()),
                        Some(c) => {
                            if let Some(creds) = &self.inner.creds {
                                if creds.needs_ticket() {
                                    match tokio::time::timeout(
                                        answer_timeout,
                                        creds.fetch_ticket(c),
                                    )
                                    .await
                                    {
                                        Ok(Ok(())) => {}
                                        Ok(Err(e)) => tracing::warn!(
                                            "osd.{}: renewing the ticket: {e}",
                                            self.inner.id
                                        ),
                                        Err(_) => {
                                            tracing::warn!(
                                                "osd.{}: monitor {} did not answer a ticket \
                                                 renewal within {} ms; trying another monitor",
                                                self.inner.id,
                                                c.peer(),
                                                timing.answer_timeout_ms
                                            );
                                            self.inner.mons.failed(c.peer());
                                            queue.extend(session.on_link_failed(now_ms()));
                                            continue;
                                        }
                                    }
                                }
                            }
                            let beat = typed::Heartbeat {
                                osd_id: self.inner.id,
                                reports: self.pg_reports(),
                                counters: self.counters(),
                                metrics_addr: self
                                    .inner
                                    .metrics_addr
                                    .get()
                                    .cloned()
                                    .unwrap_or_default(),
                            };
                            match c
                                .request(self.epoch(), beat, timing.answer_timeout_ms)
                                .await
                            {
                                Ok(typed::HeartbeatAck { epoch: mon_epoch }) => {
                                    session.on_heartbeat_answered(now_ms(), mon_epoch, self.epoch())
                                }
                                Err(spindle_proto::CallError::Remote(e))
                                    if e.code == spindle_proto::ErrorCode::NoLeader =>
                                {
                                    // This monitor has no leader to pass the heartbeat
                                    // to: boot again through another one.
                                    tracing::warn!(
                                        "osd.{}: {e}; trying another monitor",
                                        self.inner.id
                                    );
                                    self.inner.mons.failed(c.peer());
                                    session.on_link_failed(now_ms())
                                }
                                Err(spindle_proto::CallError::Remote(e)) => {
                                    // Answered, with a refusal: the link is fine.
                                    tracing::warn!("osd.{}: heartbeat refused: {e}", self.inner.id);
                                    Vec::new()
                                }
                                Err(e) => {
                                    tracing::warn!("osd.{}: monitor link lost: {e}", self.inner.id);
                                    self.inner.mons.failed(c.peer());
                                    session.on_link_failed(now_ms())
                                }
                            }
                        }
                    },
                    SessionAction::FetchMap { .. } => {
                        if let Some(c) = &conn {
                            self.fetch_map(c).await;
                        }
                        Vec::new()
                    }
                };
                queue.extend(more);
            }
            tokio::time::sleep(hb).await;
            let me = self.inner.id;
            let marked_down = self
                .map_state()
                .is_some_and(|ms| ms.map.osds.get(&me).is_some_and(|o| !o.up));
            if marked_down && matches!(session.state(), SessionState::Active { .. }) {
                tracing::warn!("osd.{me}: map says I am down; booting again");
            }
            actions = session.on_tick(now_ms(), marked_down);
        }
    }

    /// Connects to the monitor and boots over the new connection.
    async fn connect_and_boot(&self, boot_timeout_ms: u64) -> Result<Arc<RpcConn>, String> {
        let conn = self
            .inner
            .mons
            .connect(
                &self.inner.config.net,
                2000,
                Some(self.inner.push_tx.clone()),
                &self
                    .inner
                    .creds
                    .as_ref()
                    .map_or_else(Default::default, |c| c.mon_auth()),
            )
            .await
            .map_err(|e| format!("monitor unreachable: {e}"))?;
        if let Some(c) = &self.inner.creds {
            // The service key comes with the ticket: needed before serving anyone.
            if let Err(e) = c.fetch_ticket(&conn).await {
                self.inner.mons.failed(conn.peer());
                return Err(e);
            }
        }
        if let Err(e) = self.boot(&conn, boot_timeout_ms).await {
            // The next boot tries the next monitor (this one has no leader, or failed).
            self.inner.mons.failed(conn.peer());
            return Err(e);
        }
        Ok(conn)
    }

    async fn boot(&self, conn: &RpcConn, timeout_ms: u64) -> Result<(), String> {
        let boot = typed::OsdBoot {
            osd_id: self.inner.id,
            addr: self.inner.addr.clone(),
            pid: std::process::id(),
        };
        match conn.request(self.epoch(), boot, timeout_ms).await {
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
        {
            let mut guard = self.inner.map.write().unwrap_or_else(|p| p.into_inner());
            match MapState::accept(guard.as_deref(), bytes).map_err(|e| e.to_string())? {
                Some(view) => {
                    // In install order (under the map's lock): the history sees every
                    // epoch this daemon installs, and only those.
                    self.record_members(&view);
                    *guard = Some(Arc::new(view));
                }
                None => return Ok(()),
            }
        }
        let epoch = self.epoch();
        self.inner.map_tx.send_replace(epoch);
        self.on_new_epoch();
        Ok(())
    }

    /// Adds the acting sets of a newly installed map to the membership history (every
    /// group, not only those this daemon is primary of: it may become their primary).
    fn record_members(&self, view: &MapState) {
        let groups = view.placement.iter().map(|(&group, mapping)| {
            let copies: Vec<CopyId> = if mapping.shards.is_empty() {
                mapping
                    .up
                    .iter()
                    .map(|&osd| CopyId::replicated(osd))
                    .collect()
            } else {
                mapping
                    .shards
                    .iter()
                    .enumerate()
                    .filter_map(|(i, d)| {
                        d.map(|osd| CopyId {
                            osd,
                            shard: Some(i as u8),
                        })
                    })
                    .collect()
            };
            (group, copies)
        });
        lock(&self.inner.members).record(view.map.epoch, groups);
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
                // Erasure-coded: with each shard's position (a daemon that moved holds
                // another, empty, stored copy: the group must peer).
                let interval =
                    spindle_pg::rules::interval_identity(&mapping.up, &mapping.shards, |id| {
                        ms.map.osds.get(&id).map_or(0, |o| o.up_from)
                    });
                // Erasure-coded groups serve reads with k shards (writes check min_size).
                let floor = spindle_pg::rules::serve_floor(pool);
                let entry = pgs.entry((pool_id, pg)).or_insert_with(|| PgState {
                    epoch: 0,
                    since: 0,
                    interval: Vec::new(),
                    phase: Phase::Peering,
                    last: Ver::default(),
                    rep: ReplicationCore::new(),
                    acting: Vec::new(),
                    size: pool.size(),
                    min_size: pool.min_size(),
                    recovery: None,
                    damaged: BTreeSet::new(),
                    unsettled: BTreeSet::new(),
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
                entry.min_size = pool.min_size();
                // Writes in flight: kept within the interval; dropped at a change (each
                // write's task answers its own client, so the core's replies are not used).
                if change == IntervalChange::Keep {
                    entry.rep.new_epoch(ms.map.epoch);
                } else {
                    entry.rep.interval_changed(Some(RepInterval {
                        epoch: ms.map.epoch,
                        me,
                        acting: mapping.up.clone(),
                        min_size: pool.min_size(),
                    }));
                }
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

    /// The heartbeat's counters; also applies what the file system's space means for new
    /// writes (the full ratio, the store's reuse of freed files).
    fn counters(&self) -> Vec<(String, u64)> {
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
        let mut counters = self.counter_values(&space);
        counters.extend(self.inner.op_metrics.heartbeat_counters());
        counters
    }

    /// Every counter of the daemon, its store and its file system's `space` (no effects:
    /// also what a metrics scrape reads).
    fn counter_values(&self, space: &spindle_store::SpaceInfo) -> Vec<(String, u64)> {
        let s = self.inner.store.stats();
        let mut counters: Vec<(String, u64)> = self
            .inner
            .counters
            .snapshot()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect();
        counters.extend([
            ("corruptions_detected".to_string(), s.corruptions_detected),
            ("transactions".to_string(), s.transactions),
            ("flushes".to_string(), s.flushes),
            ("objects".to_string(), s.objects),
            ("data_bytes".to_string(), s.data_bytes),
            ("checkpoints".to_string(), s.checkpoints),
            ("files_reused".to_string(), s.files_reused),
        ]);
        // Space of the data directory's file system and the store's condition: the
        // monitor derives nearfull / full (map flags) and OSD_UNHEALTHY from these.
        let used = space.total_bytes.saturating_sub(space.avail_bytes);
        counters.extend([
            ("fs_total_bytes".to_string(), space.total_bytes),
            ("fs_used_bytes".to_string(), used),
            ("fs_avail_bytes".to_string(), space.avail_bytes),
            ("store_full".to_string(), space.full as u64),
            ("store_failed".to_string(), space.failed.is_some() as u64),
        ]);
        let slow = self.inner.in_flight.report(Instant::now());
        counters.extend([
            ("slow_ops".to_string(), slow.slow_now),
            ("slow_op_oldest_ms".to_string(), slow.oldest_ms),
            ("slow_ops_finished".to_string(), slow.slow_finished),
            (
                "exec_cache_bytes".to_string(),
                lock(&self.inner.exec_data).bytes(),
            ),
        ]);
        counters
    }

    /// What a metrics scrape shows (`metrics.rs`).
    fn metric_samples(&self) -> Vec<spindle_metrics::Sample> {
        let counters = self.counter_values(&self.inner.store.space());
        let states: Vec<(u32, &'static str)> = self
            .pg_reports()
            .iter()
            .map(|r| (r.pool, metrics::state_name(r.state)))
            .collect();
        metrics::snapshot_samples(
            &counters,
            &states,
            self.epoch(),
            spindle_proto::net::default_limits()
                .connections_open
                .load(Ordering::Relaxed),
        )
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
            last_version: info.last_version,
            log_tail: info.log_tail,
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
        Ok(state.version.map(|v| (state.data, v)))
    }

    // ------------------------------------------------------------------ read leases

    /// The other daemons of a group's acting set (shards included).
    fn other_copies(&self, mapping: &PgMapping) -> Vec<u32> {
        let mut v: Vec<u32> = mapping
            .up
            .iter()
            .copied()
            .chain(mapping.shards.iter().flatten().copied())
            .filter(|&o| o != self.inner.id)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether this daemon, primary of `mapping` at `epoch`, may serve a read now.
    pub(crate) fn may_read(&self, mapping: &PgMapping, epoch: u64) -> Result<(), String> {
        let peers = self.other_copies(mapping);
        lock(&self.inner.leases).may_read(peers, epoch, Instant::now())
    }

    /// Waits until no read lease this copy granted to another daemon at an older epoch
    /// is running, before it answers the peering of `primary` at `epoch` (bounded by the
    /// lease length).
    pub(crate) async fn lease_hold_back(&self, primary: Option<u32>, epoch: u64) {
        let who = lease::primary_name(primary);
        // No primary: every promise made at an older epoch holds the answer back.
        let primary = primary.unwrap_or(u32::MAX);
        let mut logged = false;
        loop {
            let now = Instant::now();
            let Some(until) = lock(&self.inner.leases).held_back_until(primary, epoch, now) else {
                return;
            };
            if !logged {
                tracing::info!(
                    "osd.{}: peering of {who} waits {} ms for a read lease granted at an older epoch",
                    self.inner.id,
                    until.saturating_duration_since(now).as_millis()
                );
                logged = true;
            }
            // Short steps: a ping at the new epoch from the old primary ends it early.
            tokio::time::sleep(
                until
                    .saturating_duration_since(now)
                    .min(Duration::from_millis(10)),
            )
            .await;
        }
    }

    /// Pings the other copies of every group this daemon is primary of, every
    /// `lease::PING_INTERVAL` and at once on each new map.
    async fn ping_loop(&self) {
        let mut epochs = self.inner.map_tx.subscribe();
        loop {
            if let Some(ms) = self.map_state() {
                let epoch = ms.map.epoch;
                let me = self.inner.id;
                let mut peers: Vec<u32> = ms
                    .placement
                    .iter()
                    .filter(|(_, m)| m.primary() == Some(me))
                    .flat_map(|(_, m)| self.other_copies(m))
                    .collect();
                peers.sort_unstable();
                peers.dedup();
                lock(&self.inner.leases).retain(|p| ms.map.osds.contains_key(&p), Instant::now());
                for peer in peers {
                    if !lock(&self.inner.pinging).insert(peer) {
                        continue;
                    }
                    let osd = self.clone();
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        let res = match osd.peer_conn(peer).await {
                            Ok(c) => c
                                .request(
                                    epoch,
                                    typed::PeerPing { osd_id: me },
                                    lease::LEASE.as_millis() as u64,
                                )
                                .await
                                .map_err(|e| e.to_string()),
                            Err(e) => Err(e),
                        };
                        lock(&osd.inner.pinging).remove(&peer);
                        if let Ok(typed::PeerPong { epoch: theirs }) = res {
                            lock(&osd.inner.leases).answered(peer, sent, theirs);
                            if theirs > osd.epoch() {
                                osd.kick_map_fetch();
                            }
                        }
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(lease::PING_INTERVAL) => {}
                changed = epochs.changed() => if changed.is_err() {
                    return;
                },
            }
        }
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
        let auth = match &self.inner.creds {
            None => Default::default(),
            Some(c) => c.self_ticket().ok_or("no service key yet (not booted)")?,
        };
        let conn = RpcConn::connect_auth(&self.inner.config.net, &addr, 2000, None, &auth)
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
            let reply = tokio::select! {
                r = conn.call(epoch, msg, self.inner.config.replica_timeout_ms) => {
                    r.map_err(|e| format!("osd.{osd}: {e}"))?
                }
                why = self.until_marked_down(osd) => return Err(why),
            };
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
        if let Some(peer) = inc.peer.as_deref().filter(|p| !p.is_daemon()) {
            if let Some(why) = client_refusal(peer, &inc.msg, &ms) {
                spindle_proto::auth::log_refusal(&format!("osd.{}", self.inner.id), &why);
                reply.send(rid, epoch, &Msg::error(ErrorCode::Denied, why));
                return;
            }
            if let Msg::MapUpdate { .. } = inc.msg {
                // Maps come from the monitors and other daemons only: a client's offer
                // says a newer one exists.
                self.kick_map_fetch();
                reply.send(rid, epoch, &Msg::Ok);
                return;
            }
        }
        if let Msg::PeerPing { osd_id } = inc.msg {
            lock(&self.inner.leases).pinged(osd_id, inc.epoch, epoch, Instant::now());
            if inc.epoch > epoch {
                self.kick_map_fetch();
            }
            reply.send(rid, epoch, &Msg::PeerPong { epoch });
            return;
        }
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
            | Msg::ShardExec { .. }
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
            | Msg::ShardExec { pool, pg, .. }
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
        let bulk_hash = inc.bulk_hash;
        let in_bytes = inc.msg.bulk().len() as u64;
        match inc.msg {
            Msg::ObjRequest {
                pool,
                pg,
                name,
                op,
                client,
                snap_guard,
            } => {
                // Tracked until answered, whichever path answers (slow requests), and
                // counted and timed then (only with metrics on).
                let reply = {
                    let kind = metrics::OpKind::of(&op);
                    let started = Instant::now();
                    let ticket = self.inner.in_flight.begin(started);
                    let inner = self.inner.clone();
                    reply.on_done(move |outcome| {
                        let now = Instant::now();
                        inner.in_flight.end(ticket, now);
                        if inner.config.metrics_listen.is_some() {
                            inner.op_metrics.done(
                                kind,
                                in_bytes,
                                now.saturating_duration_since(started),
                                outcome,
                            )
                        }
                    })
                };
                // A write to an image's data object must come from a writer that preserved
                // the object for the image's snapshot guard (client-side copy-on-write,
                // `docs/images.md`): checked against this daemon's map, which a sender with
                // an older map cannot get past (`StaleMap` above).
                if matches!(op, ObjOp::Mutate(_)) && !ms.map.image_snaps.is_empty() {
                    if let Some((image, _)) = spindle_map::image_data_object(&name) {
                        let guard = ms.map.snap_guard(pool, image);
                        if guard != snap_guard {
                            OsdCounters::bump(&self.inner.counters.snap_guard_refused);
                            reply.send(
                                rid,
                                epoch,
                                &Msg::error(
                                    ErrorCode::SnapChanged,
                                    format!(
                                        "{name}: image {image}'s snapshot guard is {guard} at epoch {epoch}, the write was guarded for {snap_guard}"
                                    ),
                                ),
                            );
                            return;
                        }
                    }
                }
                // A fenced client (its image lock was taken over) writes nothing more. Its
                // writes this daemon accepted before it had the fencing map are ordered
                // before the new holder's: the new holder's requests carry that epoch.
                if matches!(op, ObjOp::Mutate(_))
                    && client != 0
                    && ms.map.fenced.contains_key(&client)
                {
                    OsdCounters::bump(&self.inner.counters.fenced_writes_refused);
                    reply.send(
                        rid,
                        epoch,
                        &Msg::error(
                            ErrorCode::Fenced,
                            format!(
                                "client {client:016x} is fenced (another client took over its image lock at or before epoch {epoch}); write to {name} refused"
                            ),
                        ),
                    );
                    return;
                }
                let req = client::ClientOp {
                    rid,
                    pgid: PgId { pool, pg },
                    name,
                    op,
                    block_crcs,
                    bulk_hash,
                    received: inc.received,
                };
                self.client_op(&ms, req, reply)
            }
            // Erasure-coded groups' shard copies have shard group numbers.
            msg @ Msg::RepWrite { pg, .. } if spindle_map::split_shard_pg(pg).1.is_some() => {
                self.serve_shard(msg, rid, epoch, reply)
            }
            msg @ Msg::RepWrite { .. } => {
                self.serve_replication(msg, rid, epoch, block_crcs, reply)
            }
            msg @ Msg::ShardRead { .. } => self.serve_shard(msg, rid, epoch, reply),
            msg @ Msg::ShardExec { .. } => self.serve_shard_exec(msg, rid, epoch, reply),
            msg @ (Msg::PgQuery { .. }
            | Msg::PgList { .. }
            | Msg::PgMark { .. }
            | Msg::PgCleanQuery { .. }
            | Msg::ObjPull { .. }
            | Msg::ObjState { .. }
            | Msg::PgSetLog { .. }) => self.serve_peering(msg, rid, epoch, reply),
            msg @ (Msg::ScrubPg { .. } | Msg::ScrubQuery { .. }) => {
                self.serve_scrub(msg, rid, epoch, reply)
            }
            other => not_handled(&reply, rid, epoch, &other),
        }
    }

    fn kick_map_fetch(&self) {
        let conn = lock(&self.inner.mon).clone();
        if let Some(conn) = conn {
            let osd = self.clone();
            tokio::spawn(async move { osd.fetch_map(&conn).await });
        }
    }
}

/// The answer to a store transaction: `Ok` once it is durable, else the store's error. The
/// PG's in-flight count (`guard`, when the transaction holds one) is released first, so
/// that a log query waiting for it sees the transaction applied.
fn commit_reply(committed: Result<(), StoreError>, guard: Option<InflightGuard>) -> Msg {
    drop(guard);
    match committed {
        Ok(()) => Msg::Ok,
        Err(e) => store_error_reply(&e),
    }
}

/// Replies to `rid` with [`commit_reply`] when `commit` completes.
fn reply_on_commit(
    reply: Replier,
    rid: u64,
    epoch: u64,
    commit: spindle_store::Commit,
    guard: Option<InflightGuard>,
) {
    tokio::spawn(async move {
        let msg = commit_reply(commit.await, guard);
        reply.send(rid, epoch, &msg);
    });
}

/// The answer to a message this daemon's protocols do not include (or a message routed to
/// the wrong protocol's handler).
fn not_handled(reply: &Replier, rid: u64, epoch: u64, msg: &Msg) {
    reply.send(
        rid,
        epoch,
        &Msg::error(
            ErrorCode::Invalid,
            format!("a storage daemon does not handle {}", msg.name()),
        ),
    );
}

/// The typed reply of request type `R` from `osd` (an `Error` reply, if [`Osd::call_peer`]
/// did not already turn it into an error, and a reply of another kind are errors).
fn expect_reply<R: Request>(osd: u32, msg: Msg) -> Result<R::Reply, String> {
    reply_to::<R>(msg).map_err(|e| format!("osd.{osd}: {e}"))
}
