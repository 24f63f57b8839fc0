//! `spindle-client`: the object API of a Spindle cluster.
//!
//! The client keeps the newest cluster map (subscribed at the monitor), computes placement
//! locally (object name -> placement group -> CRUSH -> primary), keeps one multiplexed
//! connection per daemon and retries across map changes: a daemon that answers with a
//! newer map (`StaleMap`) teaches us that map; one that is behind (`NeedMap`) is sent ours;
//! `NotPrimary`, `Again` (peering) and connection failures wait for the next map and retry
//! until the operation's timeout.

use spindle_map::{object_pg, ClusterMap};
use spindle_proto::msg::typed;
use spindle_proto::msg::{Mutation, ObjOp, ObjectListing, Ver};
use spindle_proto::net::{Incoming, NetError, Prepared, RpcConn};
use spindle_proto::request::{reply_to, AdminRequest, CallError, MapReply, RemoteError, Request};
use spindle_proto::{ErrorCode, MonAddrs, Msg};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

pub use spindle_proto::msg::{ObjectListing as Listing, Ver as Version};

mod lock;
mod stats;
pub use lock::{lock_acquire_args, lock_args, LockGrant};

/// Largest object the object API accepts (bigger data belongs in an image):
/// `spindle_types::limits::OBJECT_BYTES_MAX`.
pub const OBJECT_BYTES_MAX: u64 = spindle_types::limits::OBJECT_BYTES_MAX;

#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no such object: {0}")]
    NotFound(String),
    #[error("no such pool: {0}")]
    NoSuchPool(String),
    #[error("{0}")]
    Invalid(String),
    #[error("data is corrupt on every reachable copy: {0}")]
    Corrupt(String),
    #[error("operation timed out after {ms} ms (last error: {last})")]
    Timeout { ms: u64, last: String },
    #[error("cannot reach the monitor at {addr}: {reason}")]
    Monitor { addr: String, reason: String },
    #[error("command failed: {0}")]
    Command(String),
    #[error("daemon error: {0}")]
    Daemon(String),
    #[error("the object changed during a read-modify-write: {0}")]
    Conflict(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    /// This client was fenced: another client took over an image lock it held, and the
    /// daemons refuse its writes. Final: stop using the image.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A peer answered with a message of the wrong kind, or a command's answer does not
    /// parse as its reply type.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The cluster refused this client's credentials (no key, a wrong key, an unknown
    /// entity).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The client's capabilities do not allow the operation.
    #[error("permission denied: {0}")]
    Denied(String),
    /// A write to an image's data object carried a snapshot guard other than the image's
    /// newest snapshot (see [`with_snap_guard`]): preserve the object for it, then retry.
    #[error("image snapshot changed: {0}")]
    SnapChanged(String),
    /// A pushdown program was refused by the daemon (it does not load or verify) or
    /// stopped by a limit or a fault; the message says which.
    #[error("program failed: {0}")]
    Program(String),
}

tokio::task_local! {
    /// The snapshot guard of the image write running in this task ([`with_snap_guard`]).
    static SNAP_GUARD: u64;
}

/// Runs `fut` with `guard` as the snapshot guard of every object write it sends
/// (`ObjRequest::snap_guard`): the id of the image's newest snapshot for which the caller
/// preserved the object's old content (0: the image has no snapshot). The image layer
/// (`spindle_image`) sets it around each data object write; a write without it carries 0,
/// which daemons refuse for data objects of an image with snapshots (`SnapChanged`). A
/// task-local rather than a parameter of every write method: only the image layer knows
/// the guard, and the write methods are shared with every other caller.
pub async fn with_snap_guard<F: std::future::Future>(guard: u64, fut: F) -> F::Output {
    SNAP_GUARD.scope(guard, fut).await
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub mon_addr: String,
    /// Total time an operation may take across retries.
    pub op_timeout_ms: u64,
    /// TCP, or an in-process network in tests.
    pub net: spindle_proto::transport::Net,
    /// The id this client's writes carry (what fencing names); None: a random one. A
    /// write log's offload agent takes its front end's id, so that fencing the front end
    /// fences the agent's writes too.
    pub client_id: Option<u64>,
    /// The entity and key this client authenticates with (None: a cluster without
    /// authentication).
    pub auth: Option<spindle_proto::auth::Identity>,
    /// Serve this client's Prometheus metrics on this address (`/metrics`;
    /// `127.0.0.1:0` picks a port, [`Client::metrics_addr`] tells which). None: no
    /// endpoint (the counters are kept regardless).
    pub metrics_listen: Option<String>,
}

impl ClientConfig {
    pub fn new(mon_addr: impl Into<String>) -> Self {
        ClientConfig {
            mon_addr: mon_addr.into(),
            op_timeout_ms: 30_000,
            net: spindle_proto::transport::Net::Tcp,
            client_id: None,
            auth: None,
            metrics_listen: None,
        }
    }

    /// Authenticates as `entity` with its key from the keyring file at `path`, if that
    /// file exists (a cluster without authentication has none); a keyring without that
    /// entity, or one others can read, is an error.
    pub fn with_keyring(
        mut self,
        path: &std::path::Path,
        entity: &str,
    ) -> Result<Self, ClientError> {
        if path.exists() {
            let k = spindle_proto::auth::Keyring::load(path)
                .map_err(|e| ClientError::Auth(e.to_string()))?;
            self.auth = Some(
                k.identity(entity)
                    .map_err(|e| ClientError::Auth(e.to_string()))?,
            );
        }
        Ok(self)
    }
}

/// Result of [`Client::scrub`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubStats {
    pub pgs: u64,
    /// Objects compared.
    pub objects: u64,
    /// Bad object copies found (missing, extra, checksum or content mismatch).
    pub inconsistent: u64,
    /// Bad copies repaired from a good one.
    pub repaired: u64,
    /// Objects with no intact copy (fewer than k intact shards on erasure-coded pools):
    /// not repairable, reads of them fail. By placement group, then name.
    pub damaged: Vec<DamagedObject>,
}

/// An object scrub found with no intact copy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DamagedObject {
    pub pg: spindle_map::PgId,
    pub name: String,
}

/// A pushdown program (`spindle-prog`): its object file and id (the file's BLAKE3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramCode {
    pub id: [u8; 32],
    pub elf: Arc<Vec<u8>>,
}

impl ProgramCode {
    pub fn new(elf: Vec<u8>) -> ProgramCode {
        ProgramCode {
            id: *blake3::hash(&elf).as_bytes(),
            elf: Arc::new(elf),
        }
    }

    /// The id in hex (how programs are named in a pool: [`PROGRAM_OBJECT_PREFIX`]).
    pub fn id_hex(&self) -> String {
        self.id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Objects holding programs: `.prog.` + the id in hex holds the object file; `.prog.name.`
/// + a name holds the id in hex of the program loaded under that name.
pub const PROGRAM_OBJECT_PREFIX: &str = ".prog.";
const PROGRAM_NAME_PREFIX: &str = ".prog.name.";

/// How a program runs ([`Client::exec`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// The JIT (else the interpreter).
    pub jit: bool,
    /// Read the objects through the daemon's data cache (and fill it).
    pub cache: bool,
    /// On an erasure-coded pool, run once per data shard, on the daemon holding it, over
    /// that shard's part of the objects (`in->part` of `in->parts`; a missing shard's part
    /// is decoded and run on the primary); the result has one part per shard. Ignored on
    /// replicated pools (one run over whole objects).
    pub shards: bool,
}

/// What a program run gave back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// `spindle_main`'s return value (of a shard-local run: the sum of the parts').
    pub ret: u64,
    /// The bytes the program emitted (of a shard-local run: the parts' back to back).
    pub output: Vec<u8>,
    /// The objects it ran against, with the sizes and versions it saw.
    pub objects: Vec<ObjectListing>,
    /// A shard-local run's result per data shard, in shard order: (return value, output
    /// bytes as a range of `output`). Empty for a whole-object run.
    pub parts: Vec<(u64, std::ops::Range<usize>)>,
}

impl ExecResult {
    /// Each part's (return value, output): one for a whole-object run.
    pub fn each_part(&self) -> Vec<(u64, &[u8])> {
        if self.parts.is_empty() {
            return vec![(self.ret, &self.output[..])];
        }
        self.parts
            .iter()
            .map(|(ret, r)| (*ret, &self.output[r.clone()]))
            .collect()
    }
}

/// Size and version of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStat {
    pub size_bytes: u64,
    pub version: Ver,
}

/// The map as this client knows it, with placement precomputed.
type MapState = spindle_map::MapView;

struct Inner {
    config: ClientConfig,
    /// The monitors (`config.mon_addr` parsed) and which one is in use.
    mons: MonAddrs,
    /// Random per client instance, never 0: carried by every object request, and what an
    /// image lock is held by (and fenced by).
    client_id: u64,
    map: RwLock<Arc<MapState>>,
    map_tx: watch::Sender<u64>,
    mon: Mutex<Option<Arc<RpcConn>>>,
    osds: Mutex<HashMap<u32, Arc<RpcConn>>>,
    push_tx: mpsc::UnboundedSender<Incoming>,
    /// Identity and ticket, with authentication.
    creds: Option<Arc<Credentials>>,
    /// What this client did (`stats.rs`).
    stats: stats::ClientStats,
    /// The `/metrics` endpoint, if the configuration asked for one.
    metrics: std::sync::OnceLock<spindle_metrics::Endpoint>,
}

use spindle_proto::tickets::Credentials;

impl Inner {
    /// The epoch of the map this client uses.
    fn epoch(&self) -> u64 {
        self.map.read().unwrap_or_else(|p| p.into_inner()).map.epoch
    }
}

fn mon_auth(creds: &Option<Arc<Credentials>>) -> spindle_proto::auth::ConnectAuth {
    creds
        .as_ref()
        .map_or_else(Default::default, |c| c.mon_auth())
}

/// A monitor connection failure as a client error (an authentication failure is final).
fn mon_error(mons: &MonAddrs, e: NetError) -> ClientError {
    match e {
        NetError::Auth(why) => ClientError::Auth(why),
        e => ClientError::Monitor {
            addr: mons.joined(),
            reason: e.to_string(),
        },
    }
}

/// How often a client serving metrics registers them with the leader monitor (as the
/// monitors and `spindle nbd` do: one silent for 30 s is dropped).
const METRICS_REGISTER_MS: u64 = 2000;

/// A connection to a cluster. Cheap to clone; use from any number of tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

use spindle_types::sync::lock;

/// Result of one attempt.
/// First pause before a request answered `Busy` is sent again, in microseconds (doubled
/// at each `Busy` up to [`BUSY_RETRY_US_MAX`], plus up to as much again at random).
const BUSY_RETRY_US_MIN: u64 = 1_000;
/// Longest pause before a `Busy` request is sent again, in microseconds (before the
/// random part). The first pauses are short (a queue of short runs drains in
/// milliseconds); this bound keeps requests waiting behind long runs to at most 20 tries a
/// second each.
const BUSY_RETRY_US_MAX: u64 = 50_000;
const _: () = assert!(BUSY_RETRY_US_MIN > 0 && BUSY_RETRY_US_MIN <= BUSY_RETRY_US_MAX);

enum Attempt {
    Done(Msg),
    Retry(String),
    /// Retry after a short pause: the daemon is well but its queue for this kind of work
    /// is full (`Busy`). The map is not in question, so it is neither awaited nor fetched.
    RetrySoon(String),
    /// Retry, but the primary may have applied the operation: it answered `Again` (for a
    /// write: "not acknowledged", some copies failed after it applied the write
    /// locally) or its reply was lost.
    RetryMaybeApplied(String),
}

impl Client {
    /// Connects to a monitor, fetches the map and subscribes to new epochs.
    /// `config.mon_addr` may list several monitors (`a,b,c`): the first that answers is
    /// used, and the client moves to another when it fails. While the monitors elect a
    /// leader or have no map yet, this waits (up to the operation timeout, at most 30 s);
    /// when no monitor accepts a connection at all, it fails at once.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let client_id = config
            .client_id
            .unwrap_or_else(|| rand::random::<u64>() | 1);
        let mons = MonAddrs::parse(&config.mon_addr).map_err(|reason| ClientError::Monitor {
            addr: config.mon_addr.clone(),
            reason,
        })?;
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let creds = config.auth.clone().map(Credentials::new);
        let deadline = Instant::now() + Duration::from_millis(config.op_timeout_ms.min(30_000));
        let (mon, map) = loop {
            let mon = match mons
                .connect(&config.net, 3000, Some(push_tx.clone()), &mon_auth(&creds))
                .await
            {
                Ok(m) => m,
                // Answered, but not ready to authenticate anyone yet: wait.
                Err(NetError::Closed(why)) if Instant::now() < deadline => {
                    tracing::debug!("monitors not ready: {why}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => return Err(mon_error(&mons, e)),
            };
            let reply = mon
                .request(
                    0,
                    typed::GetMap {
                        have_epoch: 0,
                        subscribe: false,
                    },
                    10_000,
                )
                .await;
            let why = match reply {
                Ok(MapReply::Newer(map)) => match &creds {
                    None => break (mon, map),
                    Some(c) => match c.fetch_ticket(&mon).await {
                        Ok(()) => break (mon, map),
                        Err(e) => {
                            mons.failed(mon.peer());
                            e
                        }
                    },
                },
                Ok(MapReply::Current) => "the monitor has no map yet".to_string(),
                Err(CallError::Remote(e))
                    if matches!(e.code, ErrorCode::Denied | ErrorCode::AuthFailed) =>
                {
                    return Err(ClientError::Denied(e.message));
                }
                Err(e) => {
                    mons.failed(mon.peer());
                    e.to_string()
                }
            };
            if Instant::now() > deadline {
                return Err(ClientError::Monitor {
                    addr: mons.joined(),
                    reason: why,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let state = MapState::decode(&map).map_err(|e| ClientError::Monitor {
            addr: mon.peer().to_string(),
            reason: e.to_string(),
        })?;
        let (map_tx, _) = watch::channel(state.map.epoch);
        let client = Client {
            inner: Arc::new(Inner {
                config,
                mons,
                client_id,
                map: RwLock::new(Arc::new(state)),
                map_tx,
                mon: Mutex::new(None),
                osds: Mutex::new(HashMap::new()),
                push_tx,
                creds,
                stats: Default::default(),
                metrics: Default::default(),
            }),
        };
        if let Some(listen) = client.inner.config.metrics_listen.clone() {
            client.serve_metrics(&listen).await?;
        }
        client.subscribe(&mon);
        *lock(&client.inner.mon) = Some(mon);
        {
            // Weak: the background tasks must not keep a dropped client alive.
            let weak = Arc::downgrade(&client.inner);
            tokio::spawn(async move { push_loop(weak, push_rx).await });
            let weak = Arc::downgrade(&client.inner);
            tokio::spawn(async move { mon_keeper(weak).await });
        }
        Ok(client)
    }

    fn subscribe(&self, mon: &RpcConn) {
        let have = self.epoch();
        let _ = mon.send_oneway(
            have,
            &Msg::GetMap {
                have_epoch: have,
                subscribe: true,
            },
        );
    }

    pub fn epoch(&self) -> u64 {
        self.state().map.epoch
    }

    /// Starts this client's `/metrics` endpoint (a weak reference: it does not keep the
    /// client alive).
    async fn serve_metrics(&self, listen: &str) -> Result<(), ClientError> {
        let weak = Arc::downgrade(&self.inner);
        let mut registry = spindle_metrics::prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(spindle_metrics::Snapshot::new(move || match weak
            .upgrade()
        {
            Some(inner) => {
                let epoch = inner.epoch();
                let conns = lock(&inner.osds).len();
                inner.stats.samples(epoch, conns)
            }
            None => Vec::new(),
        })));
        let endpoint = spindle_metrics::serve(listen, Arc::new(registry), None)
            .await
            .map_err(|e| ClientError::Invalid(format!("cannot serve metrics on {listen}: {e}")))?;
        let addr = endpoint.addr;
        let _ = self.inner.metrics.set(endpoint);
        // Registered with the leader like `spindle nbd` (`status --json` lists it), as
        // `client.HOST.PID.ID`, while the client lives; a client without `mon allow rw`
        // is refused, and serves its metrics all the same.
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(64)
                .collect();
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                let name = format!(
                    "client.{host}.{}.{:x}",
                    std::process::id(),
                    client.inner.client_id
                );
                let args = vec![
                    "metrics".to_string(),
                    "register".to_string(),
                    name,
                    addr.to_string(),
                ];
                if let Err(e) = client.command_as::<serde_json::Value>(args).await {
                    tracing::debug!("registering the client's metrics: {e}");
                }
                drop(client);
                tokio::time::sleep(Duration::from_millis(METRICS_REGISTER_MS)).await;
            }
        });
        Ok(())
    }

    /// Where this client serves its metrics, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.metrics.get().map(|e| e.addr)
    }

    /// This client's id (random per instance, never 0): what its requests carry, what an
    /// image lock it takes is held by, and what fencing refuses.
    /// The snapshot guard of image `image` in pool `pool` in this client's map
    /// (`ImageSnaps::guard`; 0: no live snapshot, or no such pool).
    pub fn snap_guard(&self, pool: &str, image: &str) -> u64 {
        let ms = self.state();
        ms.map
            .pool_by_name(pool)
            .map_or(0, |p| ms.map.snap_guard(p.id, image))
    }

    /// The snapshots of image `image` of `pool` in this client's map (None: none ever
    /// taken, or no such pool).
    pub fn image_snaps(&self, pool: &str, image: &str) -> Option<spindle_map::ImageSnaps> {
        let ms = self.state();
        let id = ms.map.pool_by_name(pool)?.id;
        ms.map.image_snaps.get(&(id, image.to_string())).cloned()
    }

    /// Makes sure every daemon that is the primary of a group of `pool` has this client's
    /// map, at least epoch `epoch`: one request to each (a stat in one of its groups),
    /// which a daemon with an older map answers `NeedMap` and this client then pushes it.
    /// After it, no primary of the pool accepts a request of an older epoch (`StaleMap`).
    pub async fn map_barrier(&self, pool: &str, epoch: u64) -> Result<(), ClientError> {
        if !self.wait_for_epoch(epoch, 10_000).await {
            return Err(ClientError::Timeout {
                ms: 10_000,
                last: format!("waiting for map epoch {epoch}"),
            });
        }
        let ms = self.state();
        let pool_def = ms
            .map
            .pool_by_name(pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for pg in 0..pool_def.pg_count {
            let Some(primary) = ms.placement.pg(pool_def.id, pg).and_then(|p| p.primary()) else {
                continue;
            };
            if seen.insert(primary) {
                // Any answer (the object does not exist) comes from a daemon at our epoch.
                self.op(pool, "spindle.map-barrier", ObjOp::Stat, Some(pg))
                    .await?;
            }
        }
        Ok(())
    }

    pub fn client_id(&self) -> u64 {
        self.inner.client_id
    }

    /// The current cluster map.
    pub fn map(&self) -> ClusterMap {
        self.state().map.clone()
    }

    fn state(&self) -> Arc<MapState> {
        self.inner
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn install(&self, bytes: &[u8]) {
        install(&self.inner, bytes)
    }

    /// The monitor connection, reconnecting (to the next monitor that answers) and
    /// re-subscribing if it was lost.
    async fn mon(&self) -> Result<Arc<RpcConn>, ClientError> {
        mon_conn(&self.inner).await
    }

    /// Drops the monitor connection after `conn` failed (or its monitor had no leader):
    /// the next call connects to the monitor after it.
    fn mon_failed(&self, conn: &RpcConn) {
        self.inner.mons.failed(conn.peer());
        let mut g = lock(&self.inner.mon);
        if g.as_ref().is_some_and(|c| c.peer() == conn.peer()) {
            *g = None;
        }
    }

    /// Asks the monitor for a newer map (used when placement looks wrong).
    async fn refresh_map(&self) {
        let Ok(mon) = self.mon().await else { return };
        let have = self.epoch();
        let req = typed::GetMap {
            have_epoch: have,
            subscribe: false,
        };
        if let Ok(MapReply::Newer(map)) = mon.request(have, req, 5000).await {
            self.install(&map);
        }
    }

    /// Runs an administrative command on the monitor; returns its JSON output (see
    /// [`Client::admin`] for typed answers).
    pub async fn command(&self, args: &[&str]) -> Result<serde_json::Value, ClientError> {
        self.command_as(args.iter().map(|s| s.to_string()).collect())
            .await
    }

    /// Runs a typed administrative command (e.g. `spindle_mon::Admin::status()`) and
    /// returns its typed answer (`spindle_mon::Status`). An answer that does not parse as
    /// the reply type is a [`ClientError::Protocol`].
    pub async fn admin<A>(&self, req: &A) -> Result<A::Reply, ClientError>
    where
        A: AdminRequest,
        A::Reply: serde::de::DeserializeOwned,
    {
        self.command_as(req.args()).await
    }

    /// Runs an administrative command given as its argument list and deserializes its
    /// answer into `R` (for arguments the monitor is to check as given).
    pub async fn command_as<R: serde::de::DeserializeOwned>(
        &self,
        args: Vec<String>,
    ) -> Result<R, ClientError> {
        // A monitor without a leader (an election running, or cut off from the others)
        // answers NoLeader, and one silently cut off answers nothing: try the next one
        // (after the command's attempt timeout) until the operation timeout.
        let deadline = Instant::now() + Duration::from_millis(self.inner.config.op_timeout_ms);
        let attempt_ms = command_attempt_ms(&args);
        loop {
            let mon = self.mon().await?;
            let reply = mon
                .request(
                    self.epoch(),
                    typed::Command { args: args.clone() },
                    attempt_ms,
                )
                .await;
            let why = match reply {
                Ok(typed::CommandReply { ok: true, output }) => {
                    return serde_json::from_str(&output).map_err(|e| {
                        ClientError::Protocol(format!("bad answer from the monitor: {e}"))
                    })
                }
                Ok(typed::CommandReply { ok: false, output }) => {
                    return Err(ClientError::Command(output))
                }
                Err(CallError::Remote(e)) if e.code == ErrorCode::NoLeader => {
                    self.mon_failed(&mon);
                    e.message
                }
                Err(CallError::Remote(e))
                    if matches!(e.code, ErrorCode::Denied | ErrorCode::AuthFailed) =>
                {
                    return Err(ClientError::Denied(e.message))
                }
                Err(CallError::Remote(e)) => return Err(ClientError::Command(e.message)),
                Err(e @ CallError::Unexpected { .. }) => {
                    return Err(ClientError::Protocol(e.to_string()))
                }
                Err(CallError::Net(e)) => {
                    self.mon_failed(&mon);
                    e.to_string()
                }
            };
            if Instant::now() > deadline {
                return Err(ClientError::Monitor {
                    addr: mon.peer().to_string(),
                    reason: why,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the map's epoch is at least `epoch` (e.g. after a command).
    pub async fn wait_for_epoch(&self, epoch: u64, timeout_ms: u64) -> bool {
        let mut rx = self.inner.map_tx.subscribe();
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            if self.epoch() >= epoch {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if tokio::time::timeout(left.min(Duration::from_millis(200)), rx.changed())
                .await
                .is_err()
            {
                self.refresh_map().await;
            }
        }
    }

    async fn osd_conn(&self, osd: u32, addr: &str) -> Result<Arc<RpcConn>, NetError> {
        if let Some(c) = lock(&self.inner.osds).get(&osd) {
            if c.is_reusable() && c.peer() == addr {
                return Ok(c.clone());
            }
        }
        let auth = match &self.inner.creds {
            None => Default::default(),
            Some(c) => {
                if c.needs_ticket() {
                    let mon = self
                        .mon()
                        .await
                        .map_err(|e| NetError::Auth(format!("no ticket: {e}")))?;
                    if let Err(e) = c.fetch_ticket(&mon).await {
                        self.mon_failed(&mon);
                        return Err(NetError::Auth(format!("no ticket: {e}")));
                    }
                }
                c.osd_auth()
                    .ok_or_else(|| NetError::Auth("no ticket".into()))?
            }
        };
        let conn = RpcConn::connect_auth(&self.inner.config.net, addr, 2000, None, &auth)
            .await
            .inspect_err(|e| {
                if let (NetError::Auth(_), Some(c)) = (e, &self.inner.creds) {
                    // Refused: perhaps expired, or made before the daemon's key changed.
                    c.forget_ticket();
                }
            })?;
        lock(&self.inner.osds).insert(osd, conn.clone());
        Ok(conn)
    }

    /// Sends `op` on object `name` (or, for `List`, on placement group `pg_override`) to
    /// the primary, retrying across map changes until the timeout.
    async fn op(
        &self,
        pool: &str,
        name: &str,
        op: ObjOp,
        pg_override: Option<u32>,
    ) -> Result<Msg, ClientError> {
        let client = self.inner.client_id;
        let request = |pool_id, pg| Msg::ObjRequest {
            pool: pool_id,
            pg,
            name: name.to_string(),
            op,
            client,
            snap_guard: 0,
        };
        self.request(pool, name, pg_override, request).await
    }

    /// Sends the message `make(pool id, pg)` to the primary of the object's placement
    /// group (or of `pg_override`), retrying across map changes until the timeout.
    async fn request(
        &self,
        pool: &str,
        name: &str,
        pg_override: Option<u32>,
        make: impl FnOnce(u32, u32) -> Msg,
    ) -> Result<Msg, ClientError> {
        self.request_noting(pool, name, pg_override, make, &mut false)
            .await
    }

    /// [`Client::request`]; sets `maybe_applied` if an attempt that was retried may have
    /// been applied by its primary ([`Attempt::RetryMaybeApplied`]).
    async fn request_noting(
        &self,
        pool: &str,
        name: &str,
        pg_override: Option<u32>,
        make: impl FnOnce(u32, u32) -> Msg,
        maybe_applied: &mut bool,
    ) -> Result<Msg, ClientError> {
        let started = Instant::now();
        let mut counted: Option<(stats::ReqKind, u64)> = None;
        let r = self
            .request_attempts(pool, name, pg_override, make, maybe_applied, &mut counted)
            .await;
        if let Some((kind, sent)) = counted {
            let (received, error) = match &r {
                Ok(reply) => (
                    reply.bulk().len() as u64,
                    matches!(reply, Msg::Error { .. }),
                ),
                Err(_) => (0, true),
            };
            self.inner
                .stats
                .done(kind, sent, received, started.elapsed(), error);
        }
        r
    }

    /// The attempts of [`Client::request_noting`]; sets `counted` to the request's type
    /// and bulk bytes once it is built.
    async fn request_attempts(
        &self,
        pool: &str,
        name: &str,
        pg_override: Option<u32>,
        make: impl FnOnce(u32, u32) -> Msg,
        maybe_applied: &mut bool,
        counted: &mut Option<(stats::ReqKind, u64)>,
    ) -> Result<Msg, ClientError> {
        let mut timeout_ms = self.inner.config.op_timeout_ms;
        let started = Instant::now();
        let mut deadline = started + Duration::from_millis(timeout_ms);
        let mut backoff_ms = 5u64;
        let mut busy_us = BUSY_RETRY_US_MIN;
        // Encoded (and checksummed) once; retries only change the frame header.
        let mut msg: Option<Prepared> = None;
        let mut make = Some(make);
        loop {
            let ms = self.state();
            let pool_def = ms
                .map
                .pool_by_name(pool)
                .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
            let pool_id = pool_def.id;
            let pg = pg_override.unwrap_or_else(|| object_pg(name, pool_def.pg_count));
            let m = match (&mut msg, make.take()) {
                (Some(m), _) => m,
                (slot, Some(make)) => {
                    let built = make(pool_id, pg);
                    let kind = stats::ReqKind::of(&built);
                    if kind == stats::ReqKind::Exec {
                        // A program run may take minutes; the daemon stops it at
                        // EXEC_WALL_MS and answers.
                        timeout_ms = timeout_ms.max(spindle_types::limits::EXEC_REPLY_TIMEOUT_MS);
                        deadline = started + Duration::from_millis(timeout_ms);
                    }
                    *counted = Some((kind, built.bulk().len() as u64));
                    slot.insert(Prepared::from_msg(built))
                }
                (None, None) => {
                    return Err(ClientError::Daemon("request was not built".into()));
                }
            };
            let attempt = match ms.placement.pg(pool_id, pg).and_then(|p| p.primary()) {
                None => Attempt::Retry(format!(
                    "pg {} has no daemon up",
                    spindle_map::PgId { pool: pool_id, pg }
                )),
                Some(primary) => {
                    let addr = ms
                        .map
                        .osds
                        .get(&primary)
                        .map(|o| o.addr.clone())
                        .unwrap_or_default();
                    let pg = spindle_map::PgId { pool: pool_id, pg };
                    self.attempt(&ms, pg, primary, &addr, m, deadline).await
                }
            };
            let mut soon = false;
            let last = match attempt {
                Attempt::Done(reply) => return Ok(reply),
                Attempt::Retry(why) => why,
                Attempt::RetrySoon(why) => {
                    soon = true;
                    why
                }
                Attempt::RetryMaybeApplied(why) => {
                    *maybe_applied = true;
                    why
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(ClientError::Timeout {
                    ms: timeout_ms,
                    last,
                });
            }
            tracing::debug!("retrying {name}: {last}");
            self.inner.stats.retried();
            if soon {
                // 1 to 2 ms, growing to 50 to 100: runs ahead of this one mostly end in
                // milliseconds; the random half spreads the retries of a batch out.
                let pause_us = busy_us + rand::random::<u64>() % busy_us;
                tokio::time::sleep(Duration::from_micros(pause_us).min(deadline - now)).await;
                busy_us = (busy_us * 2).min(BUSY_RETRY_US_MAX);
                continue;
            }
            let epoch = ms.map.epoch;
            if self.epoch() == epoch {
                // Wait a little for a new map, then ask for one.
                let mut rx = self.inner.map_tx.subscribe();
                let wait = Duration::from_millis(backoff_ms).min(deadline - now);
                let _ = tokio::time::timeout(wait, rx.changed()).await;
                if self.epoch() == epoch && backoff_ms >= 100 {
                    self.refresh_map().await;
                }
                backoff_ms = (backoff_ms * 2).min(500);
            }
        }
    }

    /// Resolves once a map newer than `epoch` no longer has `primary` as the primary of
    /// `pg`: a request in flight there is to be sent again to the new primary (as Ceph's
    /// clients resend on a map change), not waited for until the operation's deadline (a
    /// primary that vanished without closing its connections, or is partitioned away,
    /// never answers).
    async fn primary_moved(&self, pg: spindle_map::PgId, primary: u32, epoch: u64) -> String {
        let mut rx = self.inner.map_tx.subscribe();
        loop {
            let ms = self.state();
            let now_primary = ms.placement.pg(pg.pool, pg.pg).and_then(|p| p.primary());
            if ms.map.epoch > epoch && now_primary != Some(primary) {
                return format!(
                    "osd.{primary} is no longer the primary of pg {pg} at epoch {}",
                    ms.map.epoch
                );
            }
            if rx.changed().await.is_err() {
                // The client is going away; the reply's own timeout ends the wait.
                std::future::pending::<()>().await;
            }
        }
    }

    async fn attempt(
        &self,
        ms: &MapState,
        pg: spindle_map::PgId,
        primary: u32,
        addr: &str,
        msg: &Prepared,
        deadline: Instant,
    ) -> Attempt {
        let conn = match self.osd_conn(primary, addr).await {
            Ok(c) => c,
            Err(e) => return Attempt::Retry(format!("osd.{primary}: {e}")),
        };
        let left_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        let sent = conn.start_prepared(ms.map.epoch, msg);
        let reply = tokio::select! {
            r = async { sent?.wait(left_ms.max(1)).await } => match r {
                Ok(r) => r,
                Err(e) => {
                    lock(&self.inner.osds).remove(&primary);
                    return Attempt::RetryMaybeApplied(format!("osd.{primary}: {e}"));
                }
            },
            why = self.primary_moved(pg, primary, ms.map.epoch) => {
                // A daemon marked down may hold a dead connection: open a new one later.
                if !self.state().map.osds.get(&primary).is_some_and(|o| o.up) {
                    lock(&self.inner.osds).remove(&primary);
                }
                return Attempt::RetryMaybeApplied(why);
            }
        };
        match reply.msg {
            Msg::Error {
                code: ErrorCode::StaleMap,
                map,
                ..
            } => {
                self.install(&map);
                Attempt::Retry("daemon has a newer map".into())
            }
            Msg::Error {
                code: ErrorCode::NeedMap,
                ..
            } => {
                let _ = conn.send_oneway(
                    ms.map.epoch,
                    &Msg::MapUpdate {
                        map: ms.encoded.to_vec(),
                    },
                );
                Attempt::Retry("daemon needed our map".into())
            }
            Msg::Error {
                code: ErrorCode::Again,
                message,
                ..
            } => Attempt::RetryMaybeApplied(format!("osd.{primary}: Again: {message}")),
            Msg::Error {
                code: ErrorCode::Busy,
                message,
                ..
            } => Attempt::RetrySoon(format!("osd.{primary}: Busy: {message}")),
            Msg::Error {
                code: code @ ErrorCode::NotPrimary,
                message,
                ..
            } => Attempt::Retry(format!("osd.{primary}: {code:?}: {message}")),
            other => Attempt::Done(other),
        }
    }

    /// The typed reply to a request of kind `R` on object `name`: an `Error` reply as
    /// the client error of its code, a reply of another kind as a protocol error.
    fn reply<R: Request>(reply: Msg, name: &str) -> Result<R::Reply, ClientError> {
        reply_to::<R>(reply).map_err(|e| match e {
            CallError::Remote(RemoteError { code, message, .. }) => match code {
                ErrorCode::NotFound => ClientError::NotFound(name.to_string()),
                ErrorCode::Corrupt => ClientError::Corrupt(message),
                ErrorCode::Invalid => ClientError::Invalid(message),
                ErrorCode::NoSuchPool => ClientError::NoSuchPool(message),
                ErrorCode::Conflict => ClientError::Conflict(message),
                ErrorCode::NoSpace => ClientError::NoSpace(message),
                ErrorCode::Fenced => ClientError::Fenced(message),
                ErrorCode::Denied | ErrorCode::AuthFailed => ClientError::Denied(message),
                ErrorCode::SnapChanged => ClientError::SnapChanged(message),
                ErrorCode::ProgramFailed => ClientError::Program(message),
                _ => ClientError::Daemon(format!("{code:?}: {message}")),
            },
            e @ CallError::Unexpected { .. } => ClientError::Protocol(e.to_string()),
            CallError::Net(e) => ClientError::Daemon(e.to_string()),
        })
    }

    async fn mutate(&self, pool: &str, name: &str, m: Mutation) -> Result<Ver, ClientError> {
        self.mutate_noting(pool, name, m, &mut false).await
    }

    /// [`Client::mutate`], noting whether a retried attempt may have been applied.
    async fn mutate_noting(
        &self,
        pool: &str,
        name: &str,
        m: Mutation,
        maybe_applied: &mut bool,
    ) -> Result<Ver, ClientError> {
        check_name(name)?;
        let client = self.inner.client_id;
        let snap_guard = SNAP_GUARD.try_with(|g| *g).unwrap_or(0);
        let request = |pool_id, pg| Msg::ObjRequest {
            pool: pool_id,
            pg,
            name: name.to_string(),
            op: ObjOp::Mutate(m),
            client,
            snap_guard,
        };
        let start = spindle_trace::now();
        let reply = self
            .request_noting(pool, name, None, request, maybe_applied)
            .await;
        spindle_trace::record(spindle_trace::Stage::ClientWriteRpc, start);
        match Self::reply::<typed::ObjRequest>(reply?, name) {
            Ok(r) => Ok(r.version),
            // An attempt cut short before this client was fenced may have been applied by
            // a primary that did not have the fencing map yet: such a write is ordered
            // before the new holder's, but "refused" would not be the whole truth.
            Err(ClientError::Fenced(m)) if *maybe_applied => Err(ClientError::Fenced(format!(
                "{m}; an earlier attempt of this write was cut short before the fence reached \
                 its primary and may have been applied there (ordered before the new holder's \
                 writes)"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Replaces the whole object (creates it).
    pub async fn write_full(
        &self,
        pool: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<Ver, ClientError> {
        check_size(0, data.len() as u64)?;
        self.refuse_if_full(pool)?;
        // On an erasure-coded pool the primary encodes it (the shards it sends on are
        // 1 + m/k times the object: encoding here would carry those bytes twice).
        self.mutate(pool, name, Mutation::WriteFull(data)).await
    }

    /// `NoSpace` if the map marks `pool` full (a daemon it places data on is above the
    /// full ratio): new writes are refused before they are sent. Deletes and truncates
    /// are never refused (they free space).
    fn refuse_if_full(&self, pool: &str) -> Result<(), ClientError> {
        let ms = self.state();
        let def = ms
            .map
            .pool_by_name(pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        if ms.map.pool_full(def.id) {
            let full: Vec<String> = ms
                .map
                .osds
                .values()
                .filter(|o| o.full)
                .map(|o| format!("osd.{}", o.id))
                .collect();
            return Err(ClientError::NoSpace(format!(
                "pool {pool} is full ({} full); delete data or add capacity",
                full.join(", ")
            )));
        }
        Ok(())
    }

    /// Writes `data` at `offset` (creates the object; gaps read as zeros).
    pub async fn write(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Ver, ClientError> {
        check_size(offset, data.len() as u64)?;
        self.refuse_if_full(pool)?;
        // Erasure-coded pools too: the primary reads, patches and encodes the touched
        // stripes under the object's lock (one round trip, no version race).
        self.mutate(pool, name, Mutation::Write { offset, data })
            .await
    }

    /// Writes several extents of one object as one operation: `data` holds their bytes one
    /// after the other; extents sorted and not overlapping. On a replicated pool this is one
    /// request, one version and one journal record per copy (`Mutation::WriteExtents`); an
    /// erasure-coded pool takes one partial write per extent (in parallel: they are
    /// disjoint). Returns once every extent is durable on every copy.
    pub async fn write_extents(
        &self,
        pool: &str,
        name: &str,
        extents: Vec<spindle_types::Extent>,
        data: Vec<u8>,
    ) -> Result<(), ClientError> {
        let end = spindle_types::check_extents(&extents, data.len())
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        check_size(end, 0)?;
        self.refuse_if_full(pool)?;
        let erasure = self
            .state()
            .map
            .pool_by_name(pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?
            .is_erasure();
        if erasure {
            let writes = spindle_types::extent_pieces(&extents, &data).map(|(offset, piece)| {
                self.mutate(
                    pool,
                    name,
                    Mutation::Write {
                        offset,
                        data: piece.to_vec(),
                    },
                )
            });
            for r in futures::future::join_all(writes).await {
                r?;
            }
            return Ok(());
        }
        self.mutate(pool, name, Mutation::WriteExtents { extents, data })
            .await
            .map(|_| ())
    }

    pub async fn truncate(
        &self,
        pool: &str,
        name: &str,
        size_bytes: u64,
    ) -> Result<Ver, ClientError> {
        check_size(size_bytes, 0)?;
        self.mutate(pool, name, Mutation::Truncate { size_bytes })
            .await
    }

    pub async fn delete(&self, pool: &str, name: &str) -> Result<(), ClientError> {
        let mut maybe_applied = false;
        match self
            .mutate_noting(pool, name, Mutation::Delete, &mut maybe_applied)
            .await
        {
            // An earlier attempt may have deleted the object: its primary applied the
            // delete, then a copy failed it (e.g. a replica with a newer map, frequent
            // while full flags change) and the primary answered "not acknowledged"; the
            // primary checks existence before it assigns a version, so NotFound on the
            // retry means the object is gone, which is what was asked. Without this,
            // `spindle rm` failed with "no such object" after removing the object.
            Err(ClientError::NotFound(_)) if maybe_applied => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    pub async fn read(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        check_name(name)?;
        let len = len.min(OBJECT_BYTES_MAX);
        let start = spindle_trace::now();
        let reply = self.op(pool, name, ObjOp::Read { offset, len }, None).await;
        spindle_trace::record(spindle_trace::Stage::ClientReadRpc, start);
        Ok(Self::reply::<typed::ObjRequest>(reply?, name)?.data)
    }

    /// Reads the whole object.
    pub async fn read_full(&self, pool: &str, name: &str) -> Result<Vec<u8>, ClientError> {
        self.read(pool, name, 0, OBJECT_BYTES_MAX).await
    }

    pub async fn stat(&self, pool: &str, name: &str) -> Result<ObjectStat, ClientError> {
        check_name(name)?;
        let reply = self.op(pool, name, ObjOp::Stat, None).await?;
        let r = Self::reply::<typed::ObjRequest>(reply, name)?;
        Ok(ObjectStat {
            size_bytes: r.size_bytes,
            version: r.version,
        })
    }

    /// Runs `program` on the daemon holding `objects` (one object, or up to
    /// `spindle_types::limits::EXEC_OBJECTS_MAX` of one placement group: names sharing a
    /// placement key, `{key}`), with `args`. The program's object file travels only to a
    /// daemon that does not hold it yet.
    pub async fn exec(
        &self,
        pool: &str,
        objects: &[&str],
        program: &ProgramCode,
        args: &[u8],
        opts: ExecOptions,
    ) -> Result<ExecResult, ClientError> {
        let Some((first, more)) = objects.split_first() else {
            return Err(ClientError::Invalid("a program run needs an object".into()));
        };
        for n in objects {
            check_name(n)?;
        }
        if args.len() > spindle_proto::msg::EXEC_ARGS_MAX {
            return Err(ClientError::Invalid(format!(
                "program arguments of {} bytes: at most {}",
                args.len(),
                spindle_proto::msg::EXEC_ARGS_MAX
            )));
        }
        for send_elf in [false, true] {
            let op = ObjOp::Exec(spindle_proto::msg::ExecOp {
                program: program.id,
                jit: opts.jit,
                cache: opts.cache,
                shards: opts.shards,
                args: args.to_vec(),
                more: more.iter().map(|n| n.to_string()).collect(),
                elf: if send_elf {
                    program.elf.to_vec()
                } else {
                    Vec::new()
                },
            });
            let reply = self.op(pool, first, op, None).await?;
            if !send_elf {
                if let Msg::Error {
                    code: ErrorCode::ProgramUnknown,
                    ..
                } = reply
                {
                    continue;
                }
            }
            if let Msg::ExecParts {
                rets,
                lens,
                data,
                listing,
                ..
            } = reply
            {
                let mut parts = Vec::with_capacity(rets.len());
                let mut at = 0usize;
                for (ret, len) in rets.iter().zip(&lens) {
                    let end = at.saturating_add(*len as usize);
                    parts.push((*ret, at..end));
                    at = end;
                }
                if rets.len() != lens.len() || at != data.len() {
                    return Err(ClientError::Daemon(format!(
                        "a shard-local run's answer does not add up: {} returns, {} lengths \
                         for {} of {} bytes",
                        rets.len(),
                        lens.len(),
                        at,
                        data.len()
                    )));
                }
                return Ok(ExecResult {
                    ret: rets.iter().fold(0u64, |a, r| a.wrapping_add(*r)),
                    output: data,
                    objects: listing,
                    parts,
                });
            }
            let r = Self::reply::<typed::ObjRequest>(reply, first)?;
            return Ok(ExecResult {
                ret: r.size_bytes,
                output: r.data,
                objects: r.listing,
                parts: Vec::new(),
            });
        }
        Err(ClientError::Daemon(
            "the daemon does not take the program's object file".into(),
        ))
    }

    /// Stores `elf` in `pool` as program `name` (content-addressed: the object file under
    /// its id, and the name pointing at the id). Check it first with `spindle-prog`: the
    /// daemons verify it again before running it.
    pub async fn program_store(
        &self,
        pool: &str,
        name: &str,
        elf: Vec<u8>,
    ) -> Result<ProgramCode, ClientError> {
        if elf.len() > spindle_types::limits::PROGRAM_BYTES_MAX {
            return Err(ClientError::Invalid(format!(
                "program object file of {} bytes: at most {}",
                elf.len(),
                spindle_types::limits::PROGRAM_BYTES_MAX
            )));
        }
        let code = ProgramCode::new(elf);
        let id = code.id_hex();
        self.write_full(
            pool,
            &format!("{PROGRAM_OBJECT_PREFIX}{id}"),
            code.elf.to_vec(),
        )
        .await?;
        self.write_full(
            pool,
            &format!("{PROGRAM_NAME_PREFIX}{name}"),
            id.into_bytes(),
        )
        .await?;
        Ok(code)
    }

    /// Program `name` (or an id in hex) as stored in `pool` by [`Client::program_store`];
    /// its object file is checked against its id.
    pub async fn program(&self, pool: &str, name: &str) -> Result<ProgramCode, ClientError> {
        let id = match self
            .read_full(pool, &format!("{PROGRAM_NAME_PREFIX}{name}"))
            .await
        {
            Ok(id) => String::from_utf8(id)
                .map_err(|_| ClientError::Corrupt(format!("program name {name}: not an id")))?,
            Err(ClientError::NotFound(_))
                if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                name.to_ascii_lowercase()
            }
            Err(ClientError::NotFound(_)) => {
                return Err(ClientError::NotFound(format!(
                    "program {name} in pool {pool} (load it with `spindle prog load`)"
                )))
            }
            Err(e) => return Err(e),
        };
        let elf = self
            .read_full(pool, &format!("{PROGRAM_OBJECT_PREFIX}{id}"))
            .await?;
        let code = ProgramCode::new(elf);
        if code.id_hex() != id {
            return Err(ClientError::Corrupt(format!(
                "program {name}: its object file does not hash to its id {id}"
            )));
        }
        Ok(code)
    }

    /// Scrubs every placement group of `pool` now: each primary compares all copies of
    /// its objects (versions, sizes, checksums) and repairs bad copies from good ones;
    /// objects with no intact copy are listed in [`ScrubStats::damaged`].
    pub async fn scrub(&self, pool: &str) -> Result<ScrubStats, ClientError> {
        self.scrub_with_progress(pool, |_, _| {}).await
    }

    /// [`Self::scrub`], calling `progress(groups done, groups)` after each group.
    pub async fn scrub_with_progress(
        &self,
        pool: &str,
        mut progress: impl FnMut(u64, u64) + Send,
    ) -> Result<ScrubStats, ClientError> {
        let (pool_id, pg_count) = self
            .state()
            .map
            .pool_by_name(pool)
            .map(|p| (p.id, p.pg_count))
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        let mut total = ScrubStats::default();
        for pg in 0..pg_count {
            let reply = self
                .request(pool, "", Some(pg), |pool, pg| Msg::ScrubPg { pool, pg })
                .await?;
            let r = Self::reply::<typed::ScrubPg>(reply, "")?;
            total.objects += r.objects;
            total.inconsistent += r.inconsistent;
            total.repaired += r.repaired;
            total.pgs += 1;
            total
                .damaged
                .extend(r.damaged.into_iter().map(|name| DamagedObject {
                    pg: spindle_map::PgId { pool: pool_id, pg },
                    name,
                }));
            progress(u64::from(pg) + 1, u64::from(pg_count));
        }
        Ok(total)
    }

    /// Every object of the pool, sorted by name (asks each placement group's primary).
    pub async fn list(&self, pool: &str) -> Result<Vec<ObjectListing>, ClientError> {
        let pg_count = self
            .state()
            .map
            .pool_by_name(pool)
            .map(|p| p.pg_count)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        let mut all = Vec::new();
        for pg in 0..pg_count {
            let reply = self.op(pool, "", ObjOp::List, Some(pg)).await?;
            all.extend(Self::reply::<typed::ObjRequest>(reply, "")?.listing);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }
}

fn check_name(name: &str) -> Result<(), ClientError> {
    if name.is_empty() || name.len() > spindle_proto::msg::NAME_MAX {
        return Err(ClientError::Invalid(format!(
            "object names must be 1..={} bytes",
            spindle_proto::msg::NAME_MAX
        )));
    }
    if name.contains('\0') {
        return Err(ClientError::Invalid(
            "object names must not contain NUL bytes".into(),
        ));
    }
    Ok(())
}

fn check_size(offset: u64, len: u64) -> Result<(), ClientError> {
    match offset.checked_add(len) {
        Some(end) if end <= OBJECT_BYTES_MAX => Ok(()),
        _ => Err(ClientError::Invalid(format!(
            "objects are limited to {} MiB (offset {offset} + {len} bytes); store larger data in an image",
            OBJECT_BYTES_MAX >> 20
        ))),
    }
}

fn install(inner: &Inner, bytes: &[u8]) {
    let mut guard = inner.map.write().unwrap_or_else(|p| p.into_inner());
    let view = match MapState::accept(Some(&guard), bytes) {
        Ok(Some(view)) => view,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("ignoring a map: {e}");
            return;
        }
    };
    let epoch = view.map.epoch;
    *guard = Arc::new(view);
    drop(guard);
    inner.map_tx.send_replace(epoch);
}

/// How long one attempt of an administrative command waits for the monitor's answer before
/// the client tries the next monitor (one silently cut off never answers). Most commands
/// are answered at once or after a map change commits, which the leader waits for at most
/// 5 s (`spindle_mon`'s `COMMIT_TIMEOUT`, then it answers with an error), plus the way
/// through a follower monitor: [`COMMAND_ATTEMPT_MS`]. `mon add` waits up to 60 s for the
/// new monitor to catch up, then for the membership change: [`MON_ADD_ATTEMPT_MS`]; `mon rm`
/// waits for a membership change: [`MON_RM_ATTEMPT_MS`].
pub fn command_attempt_ms(args: &[String]) -> u64 {
    match (
        args.first().map(String::as_str),
        args.get(1).map(String::as_str),
    ) {
        (Some("mon"), Some("add")) => MON_ADD_ATTEMPT_MS,
        (Some("mon"), Some("rm")) => MON_RM_ATTEMPT_MS,
        _ => COMMAND_ATTEMPT_MS,
    }
}

/// See [`command_attempt_ms`].
pub const COMMAND_ATTEMPT_MS: u64 = 8_000;
/// See [`command_attempt_ms`].
pub const MON_ADD_ATTEMPT_MS: u64 = 75_000;
/// See [`command_attempt_ms`].
pub const MON_RM_ATTEMPT_MS: u64 = 15_000;

/// The monitor connection of `inner`, reconnecting and re-subscribing if it was lost.
async fn mon_conn(inner: &Arc<Inner>) -> Result<Arc<RpcConn>, ClientError> {
    if let Some(c) = lock(&inner.mon).clone() {
        if !c.is_closed() {
            return Ok(c);
        }
    }
    let conn = inner
        .mons
        .connect(
            &inner.config.net,
            3000,
            Some(inner.push_tx.clone()),
            &mon_auth(&inner.creds),
        )
        .await
        .map_err(|e| mon_error(&inner.mons, e))?;
    let have = inner.epoch();
    let _ = conn.send_oneway(
        have,
        &Msg::GetMap {
            have_epoch: have,
            subscribe: true,
        },
    );
    *lock(&inner.mon) = Some(conn.clone());
    Ok(conn)
}

/// How often a client checks that its monitor connection (and so its map subscription)
/// is alive, and reconnects to another monitor if not.
const MON_CHECK_MS: u64 = 250;

/// Keeps the map subscription alive across monitor failures: a lost connection is
/// replaced by one to the next monitor that answers, which pushes the current map.
async fn mon_keeper(weak: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(Duration::from_millis(MON_CHECK_MS)).await;
        let Some(inner) = weak.upgrade() else { return };
        let lost = lock(&inner.mon).as_ref().is_none_or(|c| c.is_closed());
        if lost {
            if let Some(c) = lock(&inner.mon).as_ref() {
                inner.mons.failed(c.peer());
            }
            let _ = mon_conn(&inner).await;
        }
        // Renew the ticket at half its life, while the old one still works.
        if let Some(c) = &inner.creds {
            if c.needs_ticket() {
                if let Ok(mon) = mon_conn(&inner).await {
                    if let Err(e) = c.fetch_ticket(&mon).await {
                        tracing::warn!("renewing the ticket of {}: {e}", c.entity());
                    }
                }
            }
        }
    }
}

async fn push_loop(inner: std::sync::Weak<Inner>, mut rx: mpsc::UnboundedReceiver<Incoming>) {
    while let Some(inc) = rx.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        if let Msg::MapUpdate { map } = inc.msg {
            install(&inner, &map);
        }
    }
}

#[cfg(test)]
mod command_timeout_tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn commands_give_up_on_a_silent_monitor_well_before_the_old_30_s() {
        // Map changes: the leader answers within its 5 s commit timeout.
        for cmd in [
            &["status"][..],
            &["osd", "out", "1"],
            &["pool", "create", "p", "3", "2", "8"],
            &["auth", "ls"],
            &["mon", "ls"],
        ] {
            let ms = command_attempt_ms(&args(cmd));
            assert!((5_000..=10_000).contains(&ms), "{cmd:?}: {ms}");
        }
        // `mon add` waits up to 60 s for the new monitor to catch up.
        assert!(command_attempt_ms(&args(&["mon", "add", "3", "h:6789"])) > 60_000);
        assert!(command_attempt_ms(&args(&["mon", "rm", "3"])) > COMMAND_ATTEMPT_MS);
        assert_eq!(command_attempt_ms(&[]), COMMAND_ATTEMPT_MS);
    }
}
