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

pub mod auth;
pub mod command;
pub mod core;
mod locks;
mod metrics;
pub mod node;
pub mod raft;
pub mod reply;
pub mod snaps;
mod status;
mod store;

pub use auth::{AuthChange, AuthDb, AuthEntity};
pub use command::{AdminCommand, OsdVerb};
pub use command::{ClockSample, IMAGE_REPORTS_MAX};
pub use core::{propose, MapChange, MonCore, MonTiming};
pub use node::{Committed, Handled, MonNode};
pub use reply::{
    Admin, AdminReply, AuthEntry, ClusterRecovery, CrushSet, ErasureStatus, HealthCheck,
    HealthReport, ImageLocked, ImageReport, InconsistentPg, LockReleased, LockRenewed, MonClock,
    MonList, MonMember, OsdAdded, OsdMarked, OsdStatus, PoolCreated, PoolRecovery, PoolRemoved,
    PoolStatus, RatioSet, Status,
};
pub use spindle_proto::mons::MONITORS_MAX;
pub use status::{status, Health, Severity};
pub use store::{MapStore, MapStoreError, MemMapStore, RedbMapStore};

use raft::{Boot, LogStore, MonRaft, Outcome, Proposal, RaftDb, StateMachine};
use spindle_map::{ClusterMap, OsdInfo, PoolKind};
use spindle_proto::net::{accept_loop_via, Incoming, Replier, RpcConn, Service};
use spindle_proto::transport::{Net, NetListener};
use spindle_proto::{ErrorCode, Msg};
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    #[error("monitor: {0}")]
    Raft(String),
}

/// The default of [`MonConfig::down_after_ms`].
pub const DOWN_AFTER_MS_DEFAULT: u64 = 2_000;

// A daemon with the default session timing leaves a silently cut-off monitor and reaches
// another one before the leader marks it down (`spindle_map::session`'s invariant).
const _: () = assert!(spindle_map::session::SessionTiming::with_heartbeat(
    spindle_map::session::HEARTBEAT_MS_DEFAULT
)
.fits_down_after(DOWN_AFTER_MS_DEFAULT));

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
    /// Timings of the monitors' Raft group.
    pub raft: raft::RaftTiming,
    /// Encrypt the payloads of every authenticated session this monitor serves
    /// (ChaCha20-Poly1305; `spindle_proto::auth`). Without authentication it has no effect.
    pub encrypt: bool,
    /// Serve Prometheus metrics on this address (`/metrics`; `127.0.0.1:0` picks a
    /// port); None: no endpoint.
    pub metrics_listen: Option<String>,
}

impl MonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MonConfig {
            dir: dir.into(),
            listen: "127.0.0.1:0".to_string(),
            down_after_ms: DOWN_AFTER_MS_DEFAULT,
            out_after_ms: 30_000,
            net: Net::Tcp,
            raft: raft::RaftTiming::default(),
            encrypt: false,
            metrics_listen: None,
        }
    }
}

/// Settings of a new cluster.
#[derive(Clone, Debug)]
pub struct InitSpec {
    pub osd_count: u32,
    /// The host of each daemon (by id; the CRUSH failure domain). Empty: every daemon
    /// its own host (one machine).
    pub osd_hosts: Vec<String>,
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
        crush: if spec.osd_hosts.is_empty() {
            spindle_map::embedded_crush_map(&ids)?
        } else {
            if spec.osd_hosts.len() != ids.len() {
                return Err(MonError::Raft(format!(
                    "{} daemons but {} hosts given",
                    ids.len(),
                    spec.osd_hosts.len()
                )));
            }
            let daemons: Vec<spindle_map::CrushDaemon> = ids
                .iter()
                .zip(&spec.osd_hosts)
                .map(|(&id, h)| spindle_map::CrushDaemon {
                    id,
                    weight: 0x10000,
                    host: h.clone(),
                })
                .collect();
            spindle_map::crush_map_of_hosts(&daemons)?
        },
        nearfull_ratio_ppm: spindle_map::NEARFULL_RATIO_PPM_DEFAULT,
        full_ratio_ppm: spindle_map::FULL_RATIO_PPM_DEFAULT,
        image_locks: Default::default(),
        fenced: Default::default(),
        image_snaps: Default::default(),
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

/// The monitor's database file (Raft log, state machine, and what a new monitor starts
/// from).
pub const RAFT_DB: &str = "raft.redb";

/// Creates the first map of a new single-monitor cluster in `dir` (a directory that
/// already holds a monitor keeps it: its map is returned).
pub fn init(dir: &Path, spec: &InitSpec) -> Result<ClusterMap, MonError> {
    init_monitors(&[(dir.to_path_buf(), String::new())], spec)
}

/// Creates the monitors of a new cluster: directory `i` becomes monitor `i`, and each
/// gets the members (id, address) and the first map, which whichever monitor leads first
/// proposes. A single monitor's address may be empty (it takes the address it binds). A
/// first directory that already holds a monitor keeps it: its map is returned and nothing
/// is written.
pub fn init_monitors(mons: &[(PathBuf, String)], spec: &InitSpec) -> Result<ClusterMap, MonError> {
    init_monitors_auth(mons, spec, None)
}

/// The file of a monitor's (or daemon's) directory that holds its key: with it, the
/// process authenticates and requires authentication.
pub const KEYRING: &str = "keyring";

/// Writes `mon.`'s entry of `keyring` into the monitor directory `dir` (mode 0600).
fn write_mon_keyring(dir: &Path, keyring: &spindle_proto::auth::Keyring) -> Result<(), MonError> {
    let entry = keyring
        .get("mon.")
        .ok_or_else(|| MonError::Raft("the keyring has no key for mon.".into()))?;
    spindle_proto::auth::Keyring {
        entries: vec![entry.clone()],
    }
    .save(&dir.join(KEYRING))
    .map_err(|e| MonError::Raft(e.to_string()))
}

/// [`init_monitors`] for a cluster that authenticates: every monitor gets `mon.`'s key
/// from `auth` (in `DIR/keyring`) and the first key database is made from it (every
/// entry but `mon.`; see [`AuthDb::from_keyring`]).
pub fn init_monitors_auth(
    mons: &[(PathBuf, String)],
    spec: &InitSpec,
    auth: Option<&spindle_proto::auth::Keyring>,
) -> Result<ClusterMap, MonError> {
    let Some((first_dir, _)) = mons.first() else {
        return Err(MonError::Raft(
            "a cluster needs at least one monitor".into(),
        ));
    };
    if mons.len() > spindle_proto::mons::MONITORS_MAX {
        return Err(MonError::Raft(format!(
            "at most {} monitors",
            spindle_proto::mons::MONITORS_MAX
        )));
    }
    if let Some(existing) = existing_map(first_dir)? {
        return Ok(existing);
    }
    let map = first_map(spec, rand::random())?;
    let members: Vec<(u64, String)> = mons
        .iter()
        .enumerate()
        .map(|(i, (_, a))| (i as u64, a.clone()))
        .collect();
    let auth_seed = auth
        .map(|k| AuthDb::from_keyring(k).map(|d| d.encode()))
        .transpose()
        .map_err(|e| MonError::Raft(e.to_string()))?;
    for (i, (dir, _)) in mons.iter().enumerate() {
        std::fs::create_dir_all(dir)?;
        if let Some(k) = auth {
            write_mon_keyring(dir, k)?;
        }
        let db = RaftDb::open(&dir.join(RAFT_DB)).map_err(MonError::Raft)?;
        db.set_boot(&Boot {
            id: i as u64,
            members: members.clone(),
            seed: Some(map.encode()),
            auth_seed: auth_seed.clone(),
        })
        .map_err(MonError::Raft)?;
    }
    Ok(map)
}

/// Prepares the directory of monitor `id` of a group of `members` (id, address) whose
/// first map is `first` (a multi-host cluster: every host computes the same first map
/// from the configuration file). A directory that holds a monitor already is left alone.
pub fn init_member(
    dir: &Path,
    id: u64,
    members: &[(u64, String)],
    first: &ClusterMap,
    auth: Option<&spindle_proto::auth::Keyring>,
) -> Result<(), MonError> {
    std::fs::create_dir_all(dir)?;
    let db = RaftDb::open(&dir.join(RAFT_DB)).map_err(MonError::Raft)?;
    if db.boot().map_err(MonError::Raft)?.is_some() {
        return Ok(());
    }
    // Only the first member seeds the key database (it initializes the group); every
    // member needs the monitors' key.
    let first_member = members.first().map(|m| m.0) == Some(id);
    let auth_seed = match auth {
        Some(k) => {
            write_mon_keyring(dir, k)?;
            if first_member {
                Some(
                    AuthDb::from_keyring(k)
                        .map_err(|e| MonError::Raft(e.to_string()))?
                        .encode(),
                )
            } else {
                None
            }
        }
        None => None,
    };
    if !members.iter().any(|(m, _)| *m == id) {
        return Err(MonError::Raft(format!(
            "monitor {id} is not among the members"
        )));
    }
    db.set_boot(&Boot {
        id,
        members: members.to_vec(),
        seed: Some(first.encode()),
        auth_seed,
    })
    .map_err(MonError::Raft)
}

/// Prepares a directory for a monitor that joins a running cluster as `id` (it waits to
/// be added with `spindle mon add`, then catches up from the leader). A directory that
/// holds a monitor already is left alone.
pub fn prepare_join(dir: &Path, id: u64) -> Result<(), MonError> {
    std::fs::create_dir_all(dir)?;
    if dir.join("mon.redb").exists() {
        // A single-monitor database of an earlier version: `BoundMonitor::bind` converts
        // it (a join database written here would hide it).
        return Ok(());
    }
    let db = RaftDb::open(&dir.join(RAFT_DB)).map_err(MonError::Raft)?;
    if db.boot().map_err(MonError::Raft)?.is_none() {
        db.set_boot(&Boot {
            id,
            members: Vec::new(),
            seed: None,
            auth_seed: None,
        })
        .map_err(MonError::Raft)?;
    }
    Ok(())
}

/// The map a monitor directory holds: applied, else the first map it was given, else
/// the map of a single-monitor database of an earlier version (`mon.redb`).
fn existing_map(dir: &Path) -> Result<Option<ClusterMap>, MonError> {
    let path = dir.join(RAFT_DB);
    if path.exists() {
        let db = RaftDb::open(&path).map_err(MonError::Raft)?;
        let sm = StateMachine::open(db.clone()).map_err(MonError::Raft)?;
        if let Some(a) = sm.current() {
            return Ok(Some(
                ClusterMap::decode(&a.bytes).map_err(|e| MonError::Raft(e.to_string()))?,
            ));
        }
        if let Some(seed) = db.boot().map_err(MonError::Raft)?.and_then(|b| b.seed) {
            return Ok(Some(
                ClusterMap::decode(&seed).map_err(|e| MonError::Raft(e.to_string()))?,
            ));
        }
        return Ok(None);
    }
    let old = dir.join("mon.redb");
    if old.exists() {
        return Ok(RedbMapStore::open(&old)?.load()?);
    }
    Ok(None)
}

/// How long the leader waits for a map change to commit (a leader cut off from the
/// other monitors waits this long, then answers with an error).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a follower waits for the leader's answer to a request it passed on.
const FORWARD_TIMEOUT_MS: u64 = 15_000;
/// The leader's tick: heartbeat deadlines (down, out) and lock leases.
const TICK: Duration = Duration::from_millis(200);

/// The leader's map store: a save is a Raft proposal, done once it is committed and
/// applied (on a majority of monitors' disks).
struct RaftMapStore {
    raft: MonRaft,
    rt: tokio::runtime::Handle,
}

impl RaftMapStore {
    fn propose(&self, p: Proposal) -> Result<Outcome, MapStoreError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let raft = self.raft.clone();
        self.rt.spawn(async move {
            let _ = tx.send(raft.client_write(p).await.map(|r| r.data));
        });
        match rx.recv_timeout(COMMIT_TIMEOUT) {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(MapStoreError::Db(format!("not committed: {e}"))),
            Err(_) => Err(MapStoreError::Db(format!(
                "not committed within {} s (no majority of monitors reachable?)",
                COMMIT_TIMEOUT.as_secs()
            ))),
        }
    }
}

impl MapStore for RaftMapStore {
    fn load(&self) -> Result<Option<ClusterMap>, MapStoreError> {
        Ok(None)
    }

    fn save(&mut self, map: &ClusterMap) -> Result<(), MapStoreError> {
        let p = Proposal::Map {
            base_epoch: map.epoch.saturating_sub(1),
            map: map.encode(),
        };
        match self.propose(p)? {
            Outcome::Applied { epoch } if epoch == map.epoch => Ok(()),
            Outcome::Refused { reason } => Err(MapStoreError::Db(format!("refused: {reason}"))),
            other => Err(MapStoreError::Db(format!("unexpected outcome {other:?}"))),
        }
    }
}

/// A request for the leader's node.
struct ActorMsg {
    sender_epoch: u64,
    msg: Msg,
    reply: tokio::sync::oneshot::Sender<Msg>,
}

fn no_leader(why: impl Into<String>) -> Msg {
    Msg::error(ErrorCode::NoLeader, why.into())
}

/// What the node thread needs.
struct NodeThread {
    id: u64,
    raft: MonRaft,
    sm: StateMachine,
    metrics: watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    rt: tokio::runtime::Handle,
    timing: MonTiming,
    seed: Option<Vec<u8>>,
    auth_seed: Option<Vec<u8>>,
    started: Instant,
}

impl NodeThread {
    fn is_leader(&self) -> bool {
        let m = self.metrics.borrow();
        m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// The leader's decisions, one request or tick at a time, on a thread of their own:
    /// a map change blocks here until it is committed. The node exists only while this
    /// monitor leads, rebuilt from the applied map whenever it gains the lead (every
    /// daemon and lock then gets a full grace period, as after a restart).
    fn run(self, rx: std::sync::mpsc::Receiver<ActorMsg>) {
        use std::sync::mpsc::RecvTimeoutError;
        let mut node: Option<MonNode> = None;
        let mut next_tick = Instant::now() + TICK;
        loop {
            let msg = match rx.recv_timeout(next_tick.saturating_duration_since(Instant::now())) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => {
                    next_tick = Instant::now() + TICK;
                    None
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let now_ms = self.started.elapsed().as_millis() as u64;
            if !self.is_leader() {
                node = None;
                if let Some(m) = msg {
                    let _ = m
                        .reply
                        .send(no_leader("this monitor stopped leading; retry"));
                }
                continue;
            }
            let Some(applied) = self.sm.current() else {
                if let Some(seed) = &self.seed {
                    let store = RaftMapStore {
                        raft: self.raft.clone(),
                        rt: self.rt.clone(),
                    };
                    match store.propose(Proposal::Map {
                        base_epoch: 0,
                        map: seed.clone(),
                    }) {
                        Ok(o) => tracing::info!("proposed the first map: {o:?}"),
                        Err(e) => tracing::warn!("proposing the first map: {e}"),
                    }
                }
                if let Some(m) = msg {
                    let _ = m
                        .reply
                        .send(Msg::error(ErrorCode::Again, "the cluster has no map yet"));
                }
                continue;
            };
            if let (Some(seed), None) = (&self.auth_seed, self.sm.auth()) {
                let store = RaftMapStore {
                    raft: self.raft.clone(),
                    rt: self.rt.clone(),
                };
                match store.propose(Proposal::Auth {
                    base_version: 0,
                    db: seed.clone(),
                }) {
                    Ok(o) => tracing::info!("proposed the first key database: {o:?}"),
                    Err(e) => tracing::warn!("proposing the first key database: {e}"),
                }
            }
            if node.as_ref().is_none_or(|n| n.epoch() != applied.epoch) {
                match ClusterMap::decode(&applied.bytes) {
                    Ok(map) => {
                        tracing::info!(
                            "monitor {} leads at epoch {} (cluster {:016x})",
                            self.id,
                            map.epoch,
                            map.cluster_id
                        );
                        node = Some(MonNode::new(
                            MonCore::new(map, self.timing, now_ms),
                            Box::new(RaftMapStore {
                                raft: self.raft.clone(),
                                rt: self.rt.clone(),
                            }),
                        ));
                    }
                    Err(e) => {
                        tracing::error!("the applied map does not decode: {e}");
                        node = None;
                    }
                }
            }
            let Some(n) = node.as_mut() else {
                if let Some(m) = msg {
                    let _ = m.reply.send(Msg::error(
                        ErrorCode::Internal,
                        "the applied map does not decode",
                    ));
                }
                continue;
            };
            match msg {
                Some(m) => {
                    let h = n.on_request(now_ms, m.sender_epoch, m.msg);
                    log_handled(&h, false);
                    let _ = m.reply.send(h.reply.unwrap_or(Msg::Ok));
                }
                None => log_handled(&n.on_tick(now_ms), true),
            }
        }
    }
}

/// Logs what the node committed (`warn`: changes nobody asked for, such as a daemon
/// marked down) and what it could not.
fn log_handled(h: &Handled, warn: bool) {
    for c in &h.committed {
        if warn {
            tracing::warn!("{} (epoch {})", c.reason, c.epoch);
        } else {
            tracing::info!("{} (epoch {})", c.reason, c.epoch);
        }
    }
    for f in &h.failed {
        tracing::error!("{f}");
    }
}

/// A running monitor (shared by its tasks).
pub struct Monitor {
    id: u64,
    raft: MonRaft,
    sm: StateMachine,
    metrics: watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    node: std::sync::mpsc::Sender<ActorMsg>,
    net: Net,
    /// The monitors' key (`mon.`), if the cluster authenticates.
    mon_key: Option<spindle_proto::auth::Key>,
    /// How this monitor authenticates to the others.
    peer_auth: spindle_proto::auth::ConnectAuth,
    /// Sessions it serves encrypt their payloads.
    encrypt: bool,
    /// The connection requests are passed on over, to the leader.
    leader_conn: tokio::sync::Mutex<Option<Arc<RpcConn>>>,
}

impl Monitor {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The epoch of the map this monitor applied.
    pub fn epoch(&self) -> u64 {
        self.sm.current().map_or(0, |a| a.epoch)
    }

    /// The latest map this monitor applied (None before the first).
    pub fn current_map(&self) -> Option<Result<ClusterMap, String>> {
        self.sm
            .current()
            .map(|a| ClusterMap::decode(&a.bytes).map_err(|e| e.to_string()))
    }

    /// How this monitor's own clients authenticate (as `mon.`; None: the cluster runs
    /// without authentication).
    pub fn identity(&self) -> Option<spindle_proto::auth::Identity> {
        self.mon_key
            .as_ref()
            .map(|k| spindle_proto::auth::Identity {
                entity: "mon.".to_string(),
                key: k.clone(),
            })
    }

    pub fn is_leader(&self) -> bool {
        let m = self.metrics.borrow();
        m.state == openraft::ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Runs `msg` on the leader's node thread (this monitor must lead).
    async fn on_node(&self, msg: Msg) -> Option<Msg> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.node
            .send(ActorMsg {
                sender_epoch: self.epoch(),
                msg,
                reply: tx,
            })
            .ok()?;
        rx.await.ok()
    }

    /// The cluster status as the leader's node computes it (None on a follower).
    async fn leader_status(&self) -> Option<Status> {
        if !self.is_leader() {
            return None;
        }
        let msg = Msg::Command {
            args: AdminCommand::Status.to_args(),
        };
        match self.on_node(msg).await? {
            Msg::CommandReply { ok: true, output } => serde_json::from_str(&output).ok(),
            _ => None,
        }
    }

    /// Tells the leader (itself, or through [`Monitor::forward`]) where this monitor
    /// serves its metrics, with the clock sample of the previous registration; returns
    /// this one's (the leader answers with its clock: see [`ClockSample`]).
    async fn register_metrics(
        &self,
        addr: &str,
        clock: Option<ClockSample>,
    ) -> Option<ClockSample> {
        let msg = Msg::Command {
            args: AdminCommand::MonMetrics {
                id: self.id,
                addr: addr.to_string(),
                clock,
            }
            .to_args(),
        };
        let sent_ms = unix_ms();
        let answer = if self.is_leader() {
            self.on_node(msg).await
        } else {
            Some(self.forward(self.epoch(), msg).await)
        };
        let back_ms = unix_ms();
        match answer {
            Some(Msg::CommandReply { ok: true, output }) => {
                let leader_ms: i64 = output.trim().parse().ok()?;
                let rtt_ms = back_ms.checked_sub(sent_ms)?;
                let midpoint_ms = sent_ms + rtt_ms / 2;
                Some(ClockSample {
                    skew_ms: midpoint_ms as i64 - leader_ms,
                    rtt_ms,
                })
            }
            Some(Msg::CommandReply { ok: false, output }) => {
                tracing::debug!("mon.{}: registering metrics: {output}", self.id);
                None
            }
            _ => None,
        }
    }

    /// The leader this monitor follows, with its address.
    pub fn leader(&self) -> Option<(u64, String)> {
        let m = self.metrics.borrow();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, addr))
    }

    /// The monitors as this one sees them.
    pub fn mon_list(&self) -> MonList {
        let m = self.metrics.borrow();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        MonList {
            answered_by: self.id,
            leader: m.current_leader,
            term: m.current_term,
            epoch: self.epoch(),
            mons: membership
                .nodes()
                .map(|(id, n)| MonMember {
                    id: *id,
                    addr: n.addr.clone(),
                    voter: voters.contains(id),
                })
                .collect(),
        }
    }

    fn handle(self: &Arc<Self>, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        if let Some(peer) = &inc.peer {
            if let Some(why) = auth::refusal(peer, &inc.msg) {
                spindle_proto::auth::log_refusal("monitor", &why);
                reply.send(rid, self.epoch(), &Msg::error(ErrorCode::Denied, why));
                return;
            }
        }
        if let Msg::Command { args } = &inc.msg {
            if args.first().map(String::as_str) == Some("auth") {
                let me = self.clone();
                let args = args.clone();
                let peer = inc.peer.clone();
                tokio::spawn(async move {
                    let msg = me.auth_command(peer.as_deref(), &args).await;
                    reply.send(rid, me.epoch(), &msg);
                });
                return;
            }
        }
        match inc.msg {
            Msg::AuthTicketGet => {
                let msg = match (&inc.peer, self.sm.auth()) {
                    (Some(p), Some(db)) if p.kind == spindle_proto::auth::EntityKind::Mon => {
                        match &self.mon_key {
                            Some(k) => db.ticket_for_monitor(k, spindle_proto::auth::unix_ms()),
                            None => Msg::error(ErrorCode::AuthFailed, "no monitors' key here"),
                        }
                    }
                    (Some(p), Some(db)) => db
                        .ticket_for(&p.entity, spindle_proto::auth::unix_ms())
                        .unwrap_or_else(|e| Msg::error(ErrorCode::AuthFailed, e)),
                    (Some(_), None) => {
                        Msg::error(ErrorCode::Again, "this monitor has no key database yet")
                    }
                    (None, _) => Msg::error(
                        ErrorCode::Invalid,
                        "this cluster runs without authentication: no tickets",
                    ),
                };
                reply.send(rid, self.epoch(), &msg);
            }
            Msg::MonRaft { rpc, body } => {
                let me = self.clone();
                tokio::spawn(async move {
                    let msg = match raft::serve_rpc(&me.raft, rpc, &body).await {
                        Ok(body) => Msg::MonRaftReply { body },
                        Err(e) => Msg::error(ErrorCode::Invalid, format!("raft request: {e}")),
                    };
                    reply.send(rid, me.epoch(), &msg);
                });
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                if subscribe {
                    // The current map if newer, then every later epoch; no reply of its own.
                    self.subscribe(have_epoch, reply);
                } else {
                    let msg = match self.sm.current() {
                        Some(a) if a.epoch > have_epoch => Msg::MapUpdate {
                            map: a.bytes.to_vec(),
                        },
                        _ => Msg::Ok,
                    };
                    reply.send(rid, self.epoch(), &msg);
                }
            }
            msg @ (Msg::OsdBoot { .. } | Msg::Heartbeat { .. } | Msg::Command { .. }) => {
                if let Msg::Command { args } = &msg {
                    if let Ok(
                        cmd @ (AdminCommand::MonLs
                        | AdminCommand::MonAdd { .. }
                        | AdminCommand::MonRm { .. }),
                    ) = AdminCommand::parse(args)
                    {
                        if matches!(cmd, AdminCommand::MonLs) || self.is_leader() {
                            let me = self.clone();
                            tokio::spawn(async move {
                                let msg = me.mon_command(cmd).await;
                                reply.send(rid, me.epoch(), &msg);
                            });
                            return;
                        }
                    }
                }
                if self.is_leader() {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let m = ActorMsg {
                        sender_epoch: inc.epoch,
                        msg,
                        reply: tx,
                    };
                    if self.node.send(m).is_err() {
                        reply.send(rid, self.epoch(), &no_leader("monitor stopping"));
                        return;
                    }
                    let me = self.clone();
                    tokio::spawn(async move {
                        let msg = rx.await.unwrap_or_else(|_| no_leader("monitor stopping"));
                        reply.send(rid, me.epoch(), &msg);
                    });
                } else {
                    let me = self.clone();
                    let epoch = inc.epoch;
                    tokio::spawn(async move {
                        let msg = me.forward(epoch, msg).await;
                        reply.send(rid, me.epoch(), &msg);
                    });
                }
            }
            other => {
                let msg = Msg::error(
                    ErrorCode::Invalid,
                    format!("the monitor does not handle {}", other.name()),
                );
                reply.send(rid, self.epoch(), &msg);
            }
        }
    }

    /// Passes a request that needs the leader on to it and returns its answer.
    async fn forward(&self, epoch: u64, msg: Msg) -> Msg {
        let Some((leader, addr)) = self.leader() else {
            return no_leader("no monitor leader elected (yet)");
        };
        if leader == self.id {
            return no_leader("leadership is changing; retry");
        }
        let conn = {
            let mut g = self.leader_conn.lock().await;
            match &*g {
                Some(c) if c.peer() == addr && !c.is_closed() => c.clone(),
                _ => match RpcConn::connect_auth(&self.net, &addr, 1000, None, &self.peer_auth)
                    .await
                {
                    Ok(c) => {
                        *g = Some(c.clone());
                        c
                    }
                    Err(e) => {
                        return no_leader(format!("leader monitor {leader} unreachable: {e}"))
                    }
                },
            }
        };
        match conn.call(epoch, &msg, FORWARD_TIMEOUT_MS).await {
            Ok(inc) => inc.msg,
            Err(e) => no_leader(format!("leader monitor {leader} did not answer: {e}")),
        }
    }

    /// `auth ...`: run at the monitor that got it (keys are sealed for the asking entity
    /// here); a change is passed on to the leader sealed under the monitors' key.
    async fn auth_command(&self, peer: Option<&spindle_proto::auth::Peer>, args: &[String]) -> Msg {
        let res = self.auth_command_inner(peer, args).await;
        match res {
            Ok(output) => Msg::CommandReply { ok: true, output },
            Err(output) => Msg::CommandReply { ok: false, output },
        }
    }

    async fn auth_command_inner(
        &self,
        peer: Option<&spindle_proto::auth::Peer>,
        args: &[String],
    ) -> Result<String, String> {
        use spindle_proto::auth::{open, seal, Key};
        let cmd = AdminCommand::parse(args)?;
        let (Some(mon_key), Some(peer)) = (&self.mon_key, peer) else {
            return Err("this cluster runs without authentication: no keys to manage".into());
        };
        let db = self
            .sm
            .auth()
            .ok_or("this monitor has no key database yet; retry")?;
        // The asking entity's key: what keys are sealed under, both ways.
        let asker_key = if peer.kind == spindle_proto::auth::EntityKind::Mon {
            mon_key.clone()
        } else {
            db.key_of(&peer.entity)
                .ok_or_else(|| format!("{} is no longer in the key database", peer.entity))?
        };
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let unhex = |s: &str| -> Result<Vec<u8>, String> {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string()))
                .collect()
        };
        let entry = |entity: &str, caps: &str, key: Option<&Key>| AuthEntry {
            entity: entity.to_string(),
            caps: caps.to_string(),
            key_sealed: key.map(|k| hex(&seal(&asker_key, AUTH_KEY_PURPOSE, &k.0))),
        };
        let change = match cmd {
            AdminCommand::AuthLs => {
                let list: Vec<AuthEntry> = db
                    .entities
                    .iter()
                    .map(|(e, v)| entry(e, &v.caps, None))
                    .collect();
                return json(&list);
            }
            AdminCommand::AuthGet { entity } => {
                let e = db
                    .entities
                    .get(&entity)
                    .ok_or_else(|| format!("no entity {entity}"))?;
                return json(&entry(&entity, &e.caps, Some(&Key(e.key))));
            }
            AdminCommand::AuthAdd {
                entity,
                caps,
                key_sealed,
            } => {
                let key = match key_sealed {
                    Some(s) => {
                        let plain = open(&asker_key, AUTH_KEY_PURPOSE, &unhex(&s)?)
                            .map_err(|e| format!("the key given does not open: {e}"))?;
                        Key(plain
                            .try_into()
                            .map_err(|_| "the key given is not 32 bytes")?)
                    }
                    None => Key::random(),
                };
                AuthChange::Add {
                    entity,
                    key: key.0,
                    caps,
                }
            }
            AdminCommand::AuthCaps { entity, caps } => AuthChange::SetCaps { entity, caps },
            AdminCommand::AuthRm { entity } => AuthChange::Remove { entity },
            AdminCommand::AuthApply { sealed } => {
                if peer.kind != spindle_proto::auth::EntityKind::Mon {
                    return Err("auth apply is for monitors".into());
                }
                let plain = open(mon_key, AUTH_CHANGE_PURPOSE, &unhex(&sealed)?)
                    .map_err(|e| format!("auth apply: {e}"))?;
                let change: AuthChange = raft::decode(&plain)?;
                let after = self.apply_auth_change(&change).await?;
                return json(&after);
            }
            _ => return Err("not an auth command".into()),
        };
        let after = if self.is_leader() {
            self.apply_auth_change(&change).await?
        } else {
            let sealed = hex(&seal(mon_key, AUTH_CHANGE_PURPOSE, &raft::encode(&change)));
            match self
                .forward(
                    0,
                    Msg::Command {
                        args: AdminCommand::AuthApply { sealed }.to_args(),
                    },
                )
                .await
            {
                Msg::CommandReply { ok: true, output } => {
                    serde_json::from_str(&output).map_err(|e| e.to_string())?
                }
                Msg::CommandReply { ok: false, output } => return Err(output),
                Msg::Error { message, .. } => return Err(message),
                other => return Err(format!("unexpected answer {}", other.name())),
            }
        };
        // The key of an added entity goes back sealed for the asker.
        let key = match &change {
            AuthChange::Add { key, .. } => Some(Key(*key)),
            _ => None,
        };
        json(&entry(&after.entity, &after.caps, key.as_ref()))
    }

    /// The leader applies a change to the latest key database (a few tries if other
    /// changes commit in between) and answers with the entity after it.
    async fn apply_auth_change(&self, change: &AuthChange) -> Result<AuthEntry, String> {
        for _ in 0..5 {
            if !self.is_leader() {
                return Err("this monitor stopped leading; retry".into());
            }
            let db = self.sm.auth().ok_or("no key database yet; retry")?;
            let next = change.apply(&db)?;
            let entity = match change {
                AuthChange::Add { entity, .. }
                | AuthChange::SetCaps { entity, .. }
                | AuthChange::Remove { entity } => entity.clone(),
            };
            let caps = next
                .entities
                .get(&entity)
                .or_else(|| db.entities.get(&entity))
                .map(|e| e.caps.clone())
                .unwrap_or_default();
            let result = AuthEntry {
                entity,
                caps,
                key_sealed: None,
            };
            if next == *db {
                return Ok(result);
            }
            let p = Proposal::Auth {
                base_version: db.version,
                db: next.encode(),
            };
            let outcome = tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(p))
                .await
                .map_err(|_| "not committed within 5 s (no majority of monitors?)".to_string())?
                .map_err(|e| format!("not committed: {e}"))?
                .data;
            match outcome {
                Outcome::AuthApplied { .. } => {
                    tracing::info!("key database: {change:?}", change = redact(change));
                    return Ok(result);
                }
                Outcome::Refused { reason } => tracing::debug!("auth change retried: {reason}"),
                other => return Err(format!("unexpected outcome {other:?}")),
            }
        }
        Err("the key database kept changing; retry".into())
    }

    /// `mon ls|add|rm`: membership of the Raft group.
    async fn mon_command(&self, cmd: AdminCommand) -> Msg {
        let res: Result<(), String> = match cmd {
            AdminCommand::MonLs => Ok(()),
            AdminCommand::MonAdd { id, addr } => self.add_monitor(id, addr).await,
            AdminCommand::MonRm { id } => self.remove_monitor(id).await,
            _ => Err("not a monitor command".into()),
        };
        match res.and_then(|()| serde_json::to_string(&self.mon_list()).map_err(|e| e.to_string()))
        {
            Ok(output) => Msg::CommandReply { ok: true, output },
            Err(output) => Msg::CommandReply { ok: false, output },
        }
    }

    fn voters(&self) -> std::collections::BTreeSet<u64> {
        self.metrics
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    async fn add_monitor(&self, id: u64, addr: String) -> Result<(), String> {
        let mut voters = self.voters();
        if voters.contains(&id) {
            return Err(format!("monitor {id} is a member already"));
        }
        if voters.len() >= spindle_proto::mons::MONITORS_MAX {
            return Err(format!(
                "at most {} monitors",
                spindle_proto::mons::MONITORS_MAX
            ));
        }
        tracing::info!("adding monitor {id} at {addr}: catching up as a learner");
        tokio::time::timeout(
            Duration::from_secs(60),
            self.raft
                .add_learner(id, openraft::BasicNode::new(addr.clone()), true),
        )
        .await
        .map_err(|_| {
            format!("monitor {id} at {addr} did not catch up within 60 s (is it running?)")
        })?
        .map_err(|e| format!("adding monitor {id}: {e}"))?;
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| format!("making monitor {id} a voter: {e}"))?;
        tracing::info!("monitor {id} at {addr} is a voter");
        Ok(())
    }

    async fn remove_monitor(&self, id: u64) -> Result<(), String> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(format!("monitor {id} is not a voter"));
        }
        if voters.is_empty() {
            return Err("cannot remove the last monitor".into());
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| format!("removing monitor {id}: {e}"))?;
        tracing::info!("monitor {id} removed");
        Ok(())
    }

    /// Pushes the current map if newer than `have_epoch`, then every later epoch, until
    /// the connection closes.
    fn subscribe(self: &Arc<Self>, have_epoch: u64, reply: Replier) {
        let mut rx = self.sm.subscribe();
        tokio::spawn(async move {
            let mut have = have_epoch;
            loop {
                let cur = rx.borrow_and_update().clone();
                if let Some(a) = cur {
                    if a.epoch > have {
                        if !reply.send(
                            0,
                            a.epoch,
                            &Msg::MapUpdate {
                                map: a.bytes.to_vec(),
                            },
                        ) {
                            return;
                        }
                        have = a.epoch;
                    }
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() {
                        return;
                    },
                    () = reply.closed() => return,
                }
            }
        });
    }
}

/// Purpose of keys sealed in `auth` command answers and arguments.
pub const AUTH_KEY_PURPOSE: &str = "auth key";
/// Purpose of changes a follower passes on to the leader.
const AUTH_CHANGE_PURPOSE: &str = "auth change";

/// A change as the log shows it (no key).
fn redact(c: &AuthChange) -> String {
    match c {
        AuthChange::Add { entity, caps, .. } => format!("added {entity} ({caps})"),
        AuthChange::SetCaps { entity, caps } => format!("{entity} caps now {caps}"),
        AuthChange::Remove { entity } => format!("removed {entity}"),
    }
}

/// The JSON of a command's answer.
fn json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| e.to_string())
}

#[derive(Clone)]
struct MonService(Arc<Monitor>, Option<Arc<dyn spindle_proto::auth::Verifier>>);

impl Service for MonService {
    fn epoch(&self) -> u64 {
        self.0.epoch()
    }
    fn verifier(&self) -> Option<Arc<dyn spindle_proto::auth::Verifier>> {
        self.1.clone()
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
    /// The `/metrics` endpoint, if configured.
    metrics: Option<spindle_metrics::Endpoint>,
    /// The cluster status the leader's metrics show (refreshed while it runs).
    status_cache: Arc<std::sync::Mutex<Option<Status>>>,
}

/// How often a monitor tells the leader where it serves metrics.
pub const MON_METRICS_REGISTER_MS: u64 = metrics::STATUS_REFRESH_MS;

impl BoundMonitor {
    /// Opens the database in `config.dir`, binds the listener and starts the monitor's
    /// Raft (a new cluster's first monitor initializes the group).
    pub async fn bind(config: MonConfig) -> Result<BoundMonitor, MonError> {
        let path = config.dir.join(RAFT_DB);
        if !path.exists() {
            // A single-monitor database of an earlier version becomes a group of one.
            let old = config.dir.join("mon.redb");
            let map = if old.exists() {
                RedbMapStore::open(&old)?.load()?
            } else {
                None
            };
            let Some(map) = map else {
                return Err(MonError::NotInitialized(config.dir.clone()));
            };
            let db = RaftDb::open(&path).map_err(MonError::Raft)?;
            db.set_boot(&Boot {
                id: 0,
                members: vec![(0, String::new())],
                seed: Some(map.encode()),
                auth_seed: None,
            })
            .map_err(MonError::Raft)?;
            tracing::info!(
                "converted the single-monitor database at epoch {}",
                map.epoch
            );
        }
        let db = RaftDb::open(&path).map_err(MonError::Raft)?;
        let boot = db
            .boot()
            .map_err(MonError::Raft)?
            .ok_or_else(|| MonError::NotInitialized(config.dir.clone()))?;
        let fresh = !db.has_raft_state().map_err(MonError::Raft)?;
        // With a keyring, the monitor authenticates and requires authentication.
        let keyring_path = config.dir.join(KEYRING);
        let mon_key = if keyring_path.exists() {
            let k = spindle_proto::auth::Keyring::load(&keyring_path)
                .map_err(|e| MonError::Raft(e.to_string()))?;
            Some(
                k.identity("mon.")
                    .map_err(|e| MonError::Raft(e.to_string()))?
                    .key,
            )
        } else {
            None
        };
        let peer_auth = match &mon_key {
            Some(k) => {
                spindle_proto::auth::ConnectAuth::Key(Arc::new(spindle_proto::auth::Identity {
                    entity: "mon.".into(),
                    key: k.clone(),
                }))
            }
            None => spindle_proto::auth::ConnectAuth::None,
        };
        let (listener, addr) = config.net.bind(&config.listen).await?;
        let sm = StateMachine::open(db.clone()).map_err(MonError::Raft)?;
        let raft_config = raft::raft_config(config.raft).map_err(MonError::Raft)?;
        let raft = MonRaft::new(
            boot.id,
            Arc::new(raft_config),
            raft::Network {
                net: config.net.clone(),
                auth: peer_auth.clone(),
            },
            LogStore::new(db.clone()),
            sm.clone(),
        )
        .await
        .map_err(|e| MonError::Raft(e.to_string()))?;
        if fresh && boot.members.first().map(|m| m.0) == Some(boot.id) {
            let members: std::collections::BTreeMap<u64, openraft::BasicNode> = boot
                .members
                .iter()
                .map(|(id, a)| {
                    let a = if a.is_empty() {
                        addr.clone()
                    } else {
                        a.clone()
                    };
                    (*id, openraft::BasicNode::new(a))
                })
                .collect();
            tracing::info!("starting a group of {} monitors", members.len());
            if let Err(e) = raft.initialize(members).await {
                tracing::warn!("initializing the monitor group: {e}");
            }
        }
        let metrics = raft.metrics();
        tracing::info!(
            "monitor {} listening on {addr}, epoch {}",
            boot.id,
            sm.current().map_or(0, |a| a.epoch)
        );
        let session = spindle_map::session::SessionTiming::default();
        if !session.fits_down_after(config.down_after_ms) {
            tracing::warn!(
                "down_after_ms {} is too short for daemons with the default heartbeat \
                 ({} ms): one whose monitor is cut off needs up to {} ms to reach another \
                 one, and would be marked down meanwhile",
                config.down_after_ms,
                session.heartbeat_ms,
                session.silent_monitor_ms() + spindle_map::session::RECONNECT_MS
            );
        }
        let (node_tx, node_rx) = std::sync::mpsc::channel();
        let thread = NodeThread {
            id: boot.id,
            raft: raft.clone(),
            sm: sm.clone(),
            metrics: metrics.clone(),
            rt: tokio::runtime::Handle::current(),
            timing: MonTiming {
                down_after_ms: config.down_after_ms,
                out_after_ms: config.out_after_ms,
            },
            seed: boot.seed.clone(),
            auth_seed: boot.auth_seed.clone(),
            started: Instant::now(),
        };
        std::thread::Builder::new()
            .name(format!("mon.{}", boot.id))
            .spawn(move || thread.run(node_rx))?;
        let mon = Arc::new(Monitor {
            id: boot.id,
            raft,
            sm,
            metrics,
            node: node_tx,
            net: config.net.clone(),
            mon_key: mon_key.clone(),
            peer_auth,
            encrypt: config.encrypt,
            leader_conn: tokio::sync::Mutex::new(None),
        });
        let status_cache = Arc::new(std::sync::Mutex::new(None));
        let metrics = match &config.metrics_listen {
            None => None,
            Some(listen) => {
                let mut registry =
                    spindle_metrics::prometheus_client::registry::Registry::default();
                let (m, cache) = (mon.clone(), status_cache.clone());
                registry.register_collector(Box::new(spindle_metrics::Snapshot::new(move || {
                    let leader = m.is_leader();
                    let mut out = metrics::monitor_samples(m.id, leader, m.epoch());
                    if leader {
                        let cached = cache.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(s) = cached.as_ref() {
                            out.extend(metrics::cluster_samples(s));
                        }
                    }
                    out
                })));
                // The dashboard: a page that polls the leader's status.
                let (m, cache) = (mon.clone(), status_cache.clone());
                let routes = spindle_metrics::Routes::default()
                    .page(
                        "/",
                        "text/html; charset=utf-8",
                        include_str!("dashboard.html"),
                    )
                    .json("/api/status", move || {
                        if !m.is_leader() {
                            let leader = m
                                .leader()
                                .map_or("none elected yet".to_string(), |(id, _)| {
                                    format!("mon.{id}")
                                });
                            return Err((
                                503,
                                format!(
                                    "mon.{} does not lead (leader: {leader}): open the leader's dashboard (`spindle status` prints it)",
                                    m.id
                                ),
                            ));
                        }
                        let cached = cache.lock().unwrap_or_else(|p| p.into_inner());
                        match cached.as_ref() {
                            Some(s) => serde_json::to_string(s).map_err(|e| (500, e.to_string())),
                            None => Err((503, "no status yet (the monitor just started)".into())),
                        }
                    });
                let e = spindle_metrics::serve(listen, Arc::new(registry), Some(routes))
                    .await
                    .map_err(|e| MonError::Raft(format!("metrics endpoint on {listen}: {e}")))?;
                tracing::info!(
                    "mon.{} serves metrics on http://{}/metrics and its dashboard on http://{}/",
                    mon.id,
                    e.addr,
                    e.addr
                );
                Some(e)
            }
        };
        Ok(BoundMonitor {
            addr,
            listener,
            net: config.net.clone(),
            mon,
            metrics,
            status_cache,
        })
    }

    /// Where this monitor serves `/metrics`, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|e| e.addr)
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
        let verifier: Option<Arc<dyn spindle_proto::auth::Verifier>> =
            mon.mon_key.as_ref().map(|k| {
                Arc::new(auth::MonVerifier {
                    mon_key: k.clone(),
                    sm: mon.sm.clone(),
                    encrypt: mon.encrypt,
                }) as Arc<dyn spindle_proto::auth::Verifier>
            });
        let accept = accept_loop_via(
            &self.net,
            self.listener,
            "monitor",
            MonService(mon.clone(), verifier),
        );
        // The leader refreshes the status its metrics show; every monitor tells the
        // leader where it serves them (`status` lists it; `-` without metrics) and how its
        // clock compares (`MON_CLOCK_SKEW`, with or without metrics).
        let refresher = {
            let addr = self
                .metrics
                .as_ref()
                .map_or_else(|| NO_METRICS_ADDR.to_string(), |e| e.addr.to_string());
            let with_metrics = self.metrics.is_some();
            let (mon, cache) = (mon.clone(), self.status_cache.clone());
            tokio::spawn(async move {
                let mut clock = None;
                loop {
                    if with_metrics {
                        let status = mon.leader_status().await;
                        *cache.lock().unwrap_or_else(|p| p.into_inner()) = status;
                    }
                    clock = mon.register_metrics(&addr, clock).await;
                    tokio::time::sleep(Duration::from_millis(MON_METRICS_REGISTER_MS)).await;
                }
            })
        };
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        refresher.abort();
        let _ = mon.raft.shutdown().await;
        Ok(())
    }
}

/// The address a monitor without metrics registers (for its clock sample only).
pub const NO_METRICS_ADDR: &str = "-";

/// Wall-clock time in milliseconds since the Unix epoch (0 before it).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
