//! The data simulator: storage daemons running the real store ([`spindle_store::Store`],
//! each over its own [`SimDisk`]) and the real placement-group cores
//! ([`spindle_pg::PgCore`] peering, [`spindle_pg::TxnGate`], [`spindle_pg::RecoveryCore`],
//! [`spindle_pg::ReplicationCore`]), clients running a seeded workload on a replicated
//! pool, faults, and checkers; one thread, one seed, simulated time.
//!
//! What is a model here (see `docs/simulator.md`): the monitor (marks a daemon down when
//! it has not heard from it for [`DOWN_AFTER_MS`], up again when it hears from it; every
//! change is a new epoch of a real `ClusterMap` with real CRUSH placement), message
//! contents (Rust values, not `spindle_proto` frames), and the replication connection
//! (an ordered stream per pair of daemons: a lost message breaks it, later ones are
//! dropped until the sender reconnects, as over TCP).
//!
//! Every store transaction of a daemon goes through its queue and is applied in order,
//! synchronously (`apply(..).wait()`), after a seeded delay; the store never checkpoints
//! by wall clock (`StoreConfig::timed_checkpoints = false`) but when the seed says.

use crate::net::{NetConfig, NetStats, Network, Node};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::trace::TraceHash;
use spindle_map::{ClusterMap, Placement};
use spindle_pg::peering::{Action as PgAction, Event as PgEvent, Interval};
use spindle_pg::recovery::{Begin, Next, RecoveryEvent};
use spindle_pg::rules::{ListedObject, Listing};
use spindle_pg::{
    LogInfo, PgCore, RecoveryCore, RepAction, RepEvent, RepInterval, ReplicationCore, Round,
    TxnGate,
};
use spindle_proto::msg::{LogEntryMsg, Mutation as WireMutation, Ver};
use spindle_store::{LogOp, Mutation, PgId, SimDisk, Store, StoreConfig};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

// Erasure-coded pools (hooks below are marked "EC hook").
#[path = "data_ec.rs"]
mod ec;
pub use ec::EcShape;

/// The monitor marks a daemon down after this long without a heartbeat.
pub const DOWN_AFTER_MS: u64 = 2_000;
const HEARTBEAT_MS: u64 = 400;
const MON_TICK_MS: u64 = 200;
const CLIENT_POLL_MS: u64 = 1_000;
/// A client retries an operation without an answer after this long (longer than the
/// largest network delay, so a request never arrives after its retry was answered).
const CLIENT_TIMEOUT_MS: u64 = 2_500;
/// A primary fails a write whose replica did not answer in this long.
const REPLICA_TIMEOUT_MS: u64 = 1_500;
/// A peering query, listing, mark, pull or push without an answer fails after this long.
const PEER_TIMEOUT_MS: u64 = 1_500;
const PEER_RETRY_MS: u64 = 300;
const CHECK_EVERY_MS: u64 = 250;
/// Largest network delay during a bad-network fault.
const BAD_DELAY_MS_MAX: u64 = 600;

/// A deliberately broken rule (to check that the checkers catch it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutant {
    #[default]
    None,
    /// The primary answers the client once its own copy is durable.
    AckBeforeReplicas,
    /// A copy answers a log query before its queued transactions are applied.
    UngatedLogQuery,
    /// Erasure-coded recovery counts a shard whose pull failed (or a hole) as not holding
    /// the slot (the old rule of issue #17 (b)).
    EcFailedPullAsAbsent,
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct DataConfig {
    pub seed: u64,
    pub daemons: u32,
    pub clients: u32,
    /// Client operations (reads and writes) completed over the run.
    pub ops: u64,
    /// Placement groups of the pool.
    pub pgs: u32,
    /// Objects each client owns (writes and reads).
    pub objects_per_client: u32,
    /// Faults injected (at least), spread over the fault window.
    pub faults: u32,
    pub fault_window_ms: u64,
    /// After faults stop and the workload ends, every group must be clean within this.
    pub settle_ms: u64,
    pub mutant: Mutant,
    pub verbose: bool,
    /// The clients' objects live in an erasure-coded pool of this shape (None: the
    /// replicated pool).
    pub ec: Option<EcShape>,
}

impl DataConfig {
    pub fn new(seed: u64) -> DataConfig {
        DataConfig {
            seed,
            daemons: 3,
            clients: 3,
            ops: 10_000,
            pgs: 8,
            objects_per_client: 4,
            faults: 8,
            fault_window_ms: 20_000,
            settle_ms: 30_000,
            mutant: Mutant::None,
            verbose: false,
            ec: None,
        }
    }

    /// The command that replays this run.
    pub fn replay(&self) -> String {
        let mut s = format!(
            "spindle sim --data --seed {} --ops {} --daemons {} --clients {} --faults {} --fault-seconds {}",
            self.seed,
            self.ops,
            self.daemons,
            self.clients,
            self.faults,
            self.fault_window_ms / 1000
        );
        if let Some(e) = self.ec {
            // EC hook
            let min = e.min_size();
            s.push_str(&format!(
                " --ec --ec-k {} --ec-m {} --ec-min-size {min}",
                e.k, e.m
            ));
        }
        if self.mutant != Mutant::None {
            s.push_str(&format!("  (mutant {:?})", self.mutant));
        }
        s
    }
}

/// What a run found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DataReport {
    pub seed: u64,
    pub trace_hash: String,
    pub sim_time_ms: u64,
    pub events: u64,
    pub ops_done: u64,
    pub writes_acked: u64,
    pub reads_checked: u64,
    pub retries: u64,
    pub faults: u64,
    pub crashes: u64,
    pub epochs: u64,
    pub peerings: u64,
    pub objects_recovered: u64,
    pub store_txns: u64,
    pub messages: NetStats,
    /// Violated invariants (empty: passed); each names the replay command.
    pub failures: Vec<String>,
}

/// Why a data simulation cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataError {
    Config(String),
    Map(String),
    Store(String),
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataError::Config(m) => write!(f, "bad configuration: {m}"),
            DataError::Map(m) => write!(f, "the first map is invalid: {m}"),
            DataError::Store(m) => write!(f, "a store does not open on an empty disk: {m}"),
        }
    }
}

impl std::error::Error for DataError {}

/// An object's content (None: absent).
type State = Option<Vec<u8>>;

#[derive(Clone, Debug)]
enum ClientOp {
    Write(Mutation),
    Read,
}

/// Messages (Rust values: the data path does not use `spindle_proto` frames).
#[derive(Clone, Debug)]
enum DMsg {
    Heartbeat,
    /// The monitor's current epoch (the map itself is looked up by epoch: every map of an
    /// epoch is the one the monitor published).
    MapEpoch(u64),
    GetMap,
    ObjRequest {
        op: u64,
        attempt: u32,
        epoch: u64,
        pg: u32,
        name: String,
        what: ClientOp,
    },
    ObjReply {
        op: u64,
        attempt: u32,
        result: Result<State, String>,
    },
    /// A daemon-to-daemon request on the ordered connection `(conn, seq)` (a model of
    /// TCP: in order, a lost message breaks the connection until the sender reconnects).
    Stream {
        conn: u64,
        seq: u64,
        inner: Box<DMsg>,
    },
    /// Replication (on a stream).
    RepWrite {
        epoch: u64,
        pg: u32,
        version: Ver,
        name: String,
        mutation: Mutation,
    },
    RepReply {
        pg: u32,
        version: Ver,
        result: Result<(), String>,
    },
    /// Peering and recovery requests from a primary, answered with `PeerReply`.
    Peer {
        epoch: u64,
        pg: u32,
        tag: u64,
        req: PeerReq,
    },
    PeerReply {
        pg: u32,
        tag: u64,
        result: Result<PeerAns, String>,
    },
    /// Erasure-coded shard requests and replies (EC hook).
    Ec(ec::EcMsg),
}

#[derive(Clone, Debug)]
enum PeerReq {
    Query,
    List,
    Mark {
        incomplete: bool,
    },
    Pull {
        name: String,
    },
    Push {
        name: String,
        state: Option<(Vec<u8>, Ver)>,
    },
}

#[derive(Clone, Debug)]
enum PeerAns {
    Log(LogInfo),
    Listing(Listing),
    Done,
    Object(Option<(Vec<u8>, Ver)>),
}

impl DMsg {
    fn code(&self) -> u64 {
        match self {
            DMsg::Heartbeat => 1,
            DMsg::MapEpoch(_) => 2,
            DMsg::GetMap => 3,
            DMsg::ObjRequest { .. } => 4,
            DMsg::ObjReply { .. } => 5,
            DMsg::RepWrite { .. } => 6,
            DMsg::RepReply { .. } => 7,
            DMsg::Peer { .. } => 8,
            DMsg::PeerReply { .. } => 9,
            DMsg::Stream { inner, .. } => 100 + inner.code(),
            DMsg::Ec(m) => 200 + m.code(),
        }
    }

    /// Datagram-like messages may be delivered twice; requests that change state travel
    /// on connections (no duplicates), as over TCP.
    fn may_duplicate(&self) -> bool {
        matches!(
            self,
            DMsg::Heartbeat | DMsg::MapEpoch(_) | DMsg::GetMap | DMsg::ObjReply { .. }
        ) || matches!(
            self,
            DMsg::PeerReply {
                result: Ok(PeerAns::Log(_) | PeerAns::Listing(_)),
                ..
            }
        )
    }
}

#[derive(Debug)]
enum Ev {
    Deliver {
        from: Node,
        to: Node,
        msg: DMsg,
    },
    DiskStep {
        osd: u32,
        inc: u64,
    },
    OsdTick {
        osd: u32,
        inc: u64,
    },
    Checkpoint {
        osd: u32,
        inc: u64,
    },
    Restart {
        osd: u32,
    },
    RepTimeout {
        osd: u32,
        inc: u64,
        pg: u32,
        version: Ver,
        copy: u32,
    },
    PeerTimeout {
        osd: u32,
        inc: u64,
        pg: u32,
        tag: u64,
    },
    PeerRetry {
        osd: u32,
        inc: u64,
        pg: u32,
        gen: u64,
    },
    RecoveryKick {
        osd: u32,
        inc: u64,
        pg: u32,
        gen: u64,
    },
    MonTick,
    ClientTick {
        client: u32,
    },
    ClientIssue {
        client: u32,
    },
    ClientTimeout {
        client: u32,
        op: u64,
        attempt: u32,
    },
    ClientRetry {
        client: u32,
        op: u64,
    },
    Fault,
    HealPair(Node, Node),
    HealNet,
    EndOfFaults,
    Check,
    /// Erasure-coded timers (EC hook).
    Ec(ec::EcEv),
}

/// A store transaction waiting in a daemon's queue.
#[derive(Debug)]
enum TxnKind {
    Apply {
        name: String,
        version: Ver,
        mutation: Mutation,
    },
    Recover {
        name: String,
        state: Option<(Vec<u8>, Ver)>,
    },
    Mark {
        incomplete: bool,
    },
    /// An erasure-coded shard write, push, listing or pull (EC hook).
    Ec(ec::EcTxn),
}

#[derive(Debug)]
enum Then {
    /// The primary's own write: feed the replication core.
    LocalWrite,
    /// Answer a replica write.
    RepReply { to: u32 },
    /// Answer a peering / recovery request.
    PeerReply { to: u32, tag: u64 },
    /// A request of this daemon's own primary role, answered locally.
    SelfReply { tag: u64 },
    /// An erasure-coded shard request: answer the primary (EC hook).
    Ec(ec::EcThen),
}

#[derive(Debug)]
struct Txn {
    pg: u32,
    kind: TxnKind,
    then: Then,
}

/// A log query or listing waiting at the gate.
#[derive(Debug)]
struct Waiter {
    to: Option<u32>,
    tag: u64,
    list: bool,
}

/// What a primary's outstanding peer request is for.
#[derive(Clone, Debug)]
enum Pending {
    Query { round: Round, copy: u32 },
    List { round: Round, copy: u32 },
    Mark { round: Round, copy: u32 },
    Pull { name: String, copy: u32 },
    Push { name: String, copy: u32 },
    Complete { copy: u32 },
}

impl Pending {
    /// The copy the request went to.
    fn copy(&self) -> Option<u32> {
        match self {
            Pending::Query { copy, .. }
            | Pending::List { copy, .. }
            | Pending::Mark { copy, .. }
            | Pending::Push { copy, .. }
            | Pending::Pull { copy, .. }
            | Pending::Complete { copy } => Some(*copy),
        }
    }
}

/// One object being recovered by a primary.
#[derive(Debug)]
struct RecJob {
    name: String,
    copies: Vec<u32>,
    pushes_left: BTreeSet<u32>,
}

/// A group this daemon is primary of.
struct Primary {
    /// (daemon, up_from) of each acting copy at the interval's epoch.
    ident: Vec<(u32, u64)>,
    epoch: u64,
    acting: Vec<u32>,
    peering: PgCore,
    /// Bumped at each new round or repeer: stale retry timers are ignored.
    gen: u64,
    rep: ReplicationCore,
    recovery: Option<RecoveryCore>,
    job: Option<RecJob>,
    completing: BTreeSet<u32>,
    /// (version, copy) answers still awaited.
    awaiting: BTreeSet<(Ver, u32)>,
    /// Replication core op id -> (client, client op, attempt).
    ops: BTreeMap<u64, (u32, u64, u32)>,
}

struct Daemon {
    alive: bool,
    inc: u64,
    disk: SimDisk,
    store: Option<Store>,
    epoch: u64,
    queue: VecDeque<Txn>,
    disk_busy: bool,
    gate: TxnGate<u32, Waiter>,
    primaries: BTreeMap<u32, Primary>,
    pending: BTreeMap<u64, (u32, Pending)>,
    next_tag: u64,
    next_rep_op: u64,
    /// Outgoing replication streams: peer -> (connection id, next seq, last delivery time).
    out_streams: BTreeMap<u32, (u64, u64, u64)>,
    /// Incoming: sender -> (connection id, next seq expected, broken).
    in_streams: BTreeMap<u32, (u64, u64, bool)>,
    next_conn: u64,
}

struct InFlightOp {
    obj: usize,
    what: ClientOp,
    start_ms: u64,
    attempt: u32,
}

struct Client {
    epoch: u64,
    inflight: BTreeMap<u64, InFlightOp>,
    busy: BTreeSet<usize>,
    owned: Vec<usize>,
    issued: u64,
    quota: u64,
}

/// The checker's model of one object.
#[derive(Default)]
struct ObjModel {
    /// Acknowledged states in acknowledgement order, with the time the client learned it.
    history: Vec<(u64, State)>,
    /// The state an unacknowledged write in flight would produce.
    pending: Option<State>,
}

pub struct DataWorld {
    cfg: DataConfig,
    now_ms: u64,
    rng: SimRng,
    queue: EventQueue<Ev>,
    net: Network,
    clean_net: NetConfig,
    trace: TraceHash,
    maps: Vec<Arc<(ClusterMap, Placement)>>,
    pool: u32,
    min_size: u32,
    mon_heard: BTreeMap<u32, u64>,
    daemons: BTreeMap<u32, Daemon>,
    clients: BTreeMap<u32, Client>,
    objects: Vec<String>,
    models: Vec<ObjModel>,
    next_op: u64,
    faults_over: bool,
    workload_done_ms: Option<u64>,
    settle_deadline_ms: Option<u64>,
    finished: bool,
    report: DataReport,
    ec: Option<Box<ec::EcState>>,
}

fn store_config() -> StoreConfig {
    let mut c = StoreConfig::new("/store");
    c.timed_checkpoints = false;
    c.checkpoint_journal_bytes = 512 << 10;
    c.pg_log_max_entries = 48;
    c.fd_cache_entries = 8;
    c.meta_cache_bytes = 1 << 20;
    c.reserve_bytes = 0;
    c
}

/// Polls a future once: the store over a `SimDisk` never waits (every transaction is
/// applied before anyone reads), so its reads complete at the first poll.
fn at_once<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

fn to_store(m: &Mutation) -> Mutation {
    m.clone()
}

fn wire(m: &Mutation) -> WireMutation {
    match m {
        Mutation::WriteFull(d) => WireMutation::WriteFull(d.clone()),
        Mutation::Write { offset, data } => WireMutation::Write {
            offset: *offset,
            data: data.clone(),
        },
        Mutation::Truncate { size_bytes } => WireMutation::Truncate {
            size_bytes: *size_bytes,
        },
        Mutation::Delete => WireMutation::Delete,
    }
}

fn from_wire(m: WireMutation) -> Option<Mutation> {
    Some(match m {
        WireMutation::WriteFull(d) => Mutation::WriteFull(d),
        WireMutation::Write { offset, data } => Mutation::Write { offset, data },
        WireMutation::Truncate { size_bytes } => Mutation::Truncate { size_bytes },
        WireMutation::Delete => Mutation::Delete,
        _ => return None,
    })
}

/// The object's content after `m`.
fn applied(old: &State, m: &Mutation) -> State {
    match m {
        Mutation::Delete => None,
        Mutation::WriteFull(d) => Some(d.clone()),
        Mutation::Write { offset, data } => {
            let mut v = old.clone().unwrap_or_default();
            let end = *offset as usize + data.len();
            if v.len() < end {
                v.resize(end, 0);
            }
            v[*offset as usize..end].copy_from_slice(data);
            Some(v)
        }
        Mutation::Truncate { size_bytes } => {
            let mut v = old.clone().unwrap_or_default();
            v.resize(*size_bytes as usize, 0);
            Some(v)
        }
    }
}

fn describe(s: &State) -> String {
    match s {
        None => "absent".into(),
        Some(d) => {
            let mut h = TraceHash::default();
            h.bytes(d);
            format!("{} bytes #{:08x}", d.len(), h.value() as u32)
        }
    }
}

impl DataWorld {
    pub fn new(cfg: DataConfig) -> Result<DataWorld, DataError> {
        if cfg.daemons == 0 || cfg.daemons > 64 {
            return Err(DataError::Config(format!(
                "{} daemons (1..=64 supported)",
                cfg.daemons
            )));
        }
        if cfg.clients == 0 || cfg.clients > 64 || cfg.ops == 0 {
            return Err(DataError::Config(format!(
                "{} clients, {} operations (1..=64 clients, at least one operation)",
                cfg.clients, cfg.ops
            )));
        }
        if cfg.pgs == 0 || cfg.pgs > 1024 || cfg.objects_per_client == 0 {
            return Err(DataError::Config(format!(
                "{} placement groups, {} objects per client",
                cfg.pgs, cfg.objects_per_client
            )));
        }
        let mut rng = SimRng::new(cfg.seed ^ 0xDA7A_0000_0000_0000);
        let size = 3.min(cfg.daemons);
        let min_size = 2.min(size);
        let spec = spindle_mon::InitSpec {
            osd_count: cfg.daemons,
            default_pool: Some(("data".into(), size, min_size, cfg.pgs.next_power_of_two())),
        };
        let mut map = match spindle_mon::first_map(&spec, rng.next_u64()) {
            Ok(m) => m,
            Err(e) => return Err(DataError::Map(e.to_string())),
        };
        map.epoch = 2;
        for o in map.osds.values_mut() {
            o.up = true;
            o.up_from = 2;
        }
        let pool = map.pools.keys().next().copied().unwrap_or(1);
        let ec = ec::add_pool(&cfg, &mut map)?; // EC hook
        let placement = Placement::compute(&map);
        let maps = vec![Arc::new((map, placement))];
        let mut daemons = BTreeMap::new();
        for id in 0..cfg.daemons {
            let disk = SimDisk::new(rng.next_u64());
            let store = Store::open_on(Arc::new(disk.clone()), store_config())
                .map_err(|e| DataError::Store(e.to_string()))?;
            daemons.insert(
                id,
                Daemon {
                    alive: true,
                    inc: 1,
                    disk,
                    store: Some(store),
                    epoch: 0,
                    queue: VecDeque::new(),
                    disk_busy: false,
                    gate: TxnGate::new(),
                    primaries: BTreeMap::new(),
                    pending: BTreeMap::new(),
                    next_tag: 1,
                    next_rep_op: 1,
                    out_streams: BTreeMap::new(),
                    in_streams: BTreeMap::new(),
                    next_conn: 1,
                },
            );
        }
        let per_client = cfg.objects_per_client.max(1) as usize;
        let nobj = per_client * cfg.clients as usize;
        let objects: Vec<String> = (0..nobj).map(|i| format!("obj-{i}")).collect();
        let clients = (0..cfg.clients)
            .map(|c| {
                let quota = cfg.ops / cfg.clients as u64
                    + u64::from((c as u64) < cfg.ops % cfg.clients as u64);
                (
                    c,
                    Client {
                        epoch: 0,
                        inflight: BTreeMap::new(),
                        busy: BTreeSet::new(),
                        owned: (0..nobj)
                            .filter(|i| i % cfg.clients as usize == c as usize)
                            .collect(),
                        issued: 0,
                        quota,
                    },
                )
            })
            .collect();
        let models = (0..nobj)
            .map(|_| ObjModel {
                history: vec![(0, None)],
                pending: None,
            })
            .collect();
        let clean_net = NetConfig {
            delay_ms_min: 1,
            delay_ms_max: 8,
            loss_ppm: 0,
            duplicate_ppm: 0,
        };
        Ok(DataWorld {
            net: Network::new(clean_net),
            clean_net,
            now_ms: 0,
            queue: EventQueue::default(),
            trace: TraceHash::default(),
            maps,
            pool,
            min_size,
            mon_heard: BTreeMap::new(),
            daemons,
            clients,
            objects,
            models,
            next_op: 1,
            faults_over: false,
            workload_done_ms: None,
            settle_deadline_ms: None,
            finished: false,
            report: DataReport {
                seed: cfg.seed,
                ..DataReport::default()
            },
            rng,
            cfg,
            ec,
        })
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.cfg.verbose {
            eprintln!("[{:>8} ms] {}", self.now_ms, what());
        }
    }

    fn fail(&mut self, what: String) {
        let msg = format!("{what} (replay: {})", self.cfg.replay());
        self.log(|| format!("FAILURE: {msg}"));
        if self.report.failures.len() < 20 {
            self.report.failures.push(msg);
        }
    }

    fn at(&mut self, delay_ms: u64, ev: Ev) {
        self.queue.push(self.now_ms + delay_ms, ev);
    }

    fn current(&self) -> Arc<(ClusterMap, Placement)> {
        self.maps[self.maps.len() - 1].clone()
    }

    fn map_at(&self, epoch: u64) -> Arc<(ClusterMap, Placement)> {
        let first = self.maps[0].0.epoch;
        let i = epoch.saturating_sub(first) as usize;
        self.maps[i.min(self.maps.len() - 1)].clone()
    }

    fn pgid(&self, pg: u32) -> PgId {
        PgId {
            pool: self.pool,
            pg,
        }
    }

    fn pg_of(&self, name: &str) -> u32 {
        spindle_map::object_pg(name, self.cfg.pgs.next_power_of_two())
    }

    /// Runs the whole scenario.
    pub fn run(mut self) -> DataReport {
        self.queue.push(0, Ev::MonTick);
        for id in 0..self.cfg.daemons {
            let at = self.rng.range(0, 50);
            let inc = self.daemons[&id].inc;
            self.queue.push(at, Ev::OsdTick { osd: id, inc });
            let at = self.rng.range(200, 2_000);
            self.queue.push(at, Ev::Checkpoint { osd: id, inc });
        }
        for c in 0..self.cfg.clients {
            self.queue
                .push(self.rng.range(0, 50), Ev::ClientTick { client: c });
            for _ in 0..4 {
                let at = self.rng.range(100, 400);
                self.queue.push(at, Ev::ClientIssue { client: c });
            }
        }
        let faults = self.cfg.faults;
        if faults > 0 {
            for _ in 0..faults {
                let at = self.rng.range(500, self.cfg.fault_window_ms.max(501));
                self.queue.push(at, Ev::Fault);
            }
        }
        self.queue.push(self.cfg.fault_window_ms, Ev::EndOfFaults);
        self.queue.push(CHECK_EVERY_MS, Ev::Check);
        // A bound on simulated time: a run that never ends is a failure, not a hang.
        let limit_ms = self.cfg.fault_window_ms
            + self.cfg.settle_ms
            + 200_000
            + self.cfg.ops * 200 / self.cfg.clients.max(1) as u64;
        while let Some((at, ev)) = self.queue.pop() {
            if self.finished {
                break;
            }
            if at > limit_ms {
                self.fail(format!(
                    "the run did not finish within {limit_ms} simulated ms ({} of {} operations done)",
                    self.report.ops_done, self.cfg.ops
                ));
                break;
            }
            self.now_ms = at;
            self.report.events += 1;
            self.trace.u64(at);
            self.step(ev);
        }
        self.report.sim_time_ms = self.now_ms;
        self.report.trace_hash = format!("{:016x}", self.trace.value());
        self.report.messages = self.net.stats;
        self.report.epochs = self.maps.len() as u64;
        self.report.store_txns = self
            .daemons
            .values()
            .filter_map(|d| d.store.as_ref())
            .map(|s| s.stats().transactions)
            .sum();
        // Stop the stores' worker threads.
        for d in self.daemons.values_mut() {
            d.store = None;
        }
        self.report
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { from, to, msg } => {
                self.trace.u64(from.code());
                self.trace.u64(to.code());
                self.trace.u64(msg.code());
                self.deliver(from, to, msg);
            }
            Ev::DiskStep { osd, inc } => {
                self.trace.u64(10);
                if self.live(osd, inc) {
                    self.disk_step(osd);
                }
            }
            Ev::OsdTick { osd, inc } => {
                if self.live(osd, inc) {
                    self.send(Node::Osd(osd), Node::Mon, DMsg::Heartbeat);
                    self.at(HEARTBEAT_MS, Ev::OsdTick { osd, inc });
                }
            }
            Ev::Checkpoint { osd, inc } => {
                if self.live(osd, inc) {
                    self.trace.u64(11);
                    if let Some(s) = self.daemons.get(&osd).and_then(|d| d.store.as_ref()) {
                        if let Err(e) = s.checkpoint_now() {
                            let e = e.to_string();
                            self.fail(format!("osd.{osd}: checkpoint failed: {e}"));
                        }
                    }
                    let next = self.rng.range(200, 3_000);
                    self.at(next, Ev::Checkpoint { osd, inc });
                }
            }
            Ev::Restart { osd } => self.restart(osd),
            Ev::RepTimeout {
                osd,
                inc,
                pg,
                version,
                copy,
            } => {
                if self.live(osd, inc) {
                    self.rep_timeout(osd, pg, version, copy);
                }
            }
            Ev::PeerTimeout { osd, inc, pg, tag } => {
                if self.live(osd, inc) {
                    let copy = self.daemons[&osd].pending.get(&tag).map(|(_, w)| w.copy());
                    if let Some(copy) = copy.flatten() {
                        // Reconnect: the stream to that copy starts over.
                        if let Some(d) = self.daemons.get_mut(&osd) {
                            d.out_streams.remove(&copy);
                        }
                    }
                    self.peer_answer(osd, pg, tag, Err("timed out".into()));
                }
            }
            Ev::PeerRetry { osd, inc, pg, gen } => {
                if self.live(osd, inc) {
                    let ok = self.daemons[&osd]
                        .primaries
                        .get(&pg)
                        .is_some_and(|p| p.gen == gen);
                    if ok {
                        self.restart_peering(osd, pg);
                    }
                }
            }
            Ev::RecoveryKick { osd, inc, pg, gen } => {
                if self.live(osd, inc)
                    && self.daemons[&osd]
                        .primaries
                        .get(&pg)
                        .is_some_and(|p| p.gen == gen)
                {
                    self.recovery_pump(osd, pg);
                }
            }
            Ev::MonTick => {
                self.mon_tick();
                self.at(MON_TICK_MS, Ev::MonTick);
            }
            Ev::ClientTick { client } => {
                self.send(Node::Client(client), Node::Mon, DMsg::GetMap);
                self.at(CLIENT_POLL_MS, Ev::ClientTick { client });
            }
            Ev::ClientIssue { client } => self.client_issue(client),
            Ev::ClientTimeout {
                client,
                op,
                attempt,
            } => {
                let current = self.clients[&client]
                    .inflight
                    .get(&op)
                    .is_some_and(|o| o.attempt == attempt);
                if current {
                    self.report.retries += 1;
                    self.client_send(client, op);
                }
            }
            Ev::ClientRetry { client, op } => {
                if self.clients[&client].inflight.contains_key(&op) {
                    self.report.retries += 1;
                    self.client_send(client, op);
                }
            }
            Ev::Fault => self.inject_fault(),
            Ev::HealPair(a, b) => {
                if !self.faults_over {
                    self.net.heal(a, b);
                }
            }
            Ev::HealNet => self.net.config = self.clean_net,
            Ev::EndOfFaults => self.end_faults(),
            Ev::Check => self.check(),
            Ev::Ec(e) => {
                self.trace.u64(30);
                self.ec_event(e);
            }
        }
    }

    fn live(&self, osd: u32, inc: u64) -> bool {
        self.daemons
            .get(&osd)
            .is_some_and(|d| d.alive && d.inc == inc)
    }

    // ---- network ----

    fn send(&mut self, from: Node, to: Node, msg: DMsg) {
        let delays = self.net.route(&mut self.rng, from, to);
        let n = if msg.may_duplicate() {
            delays.len()
        } else {
            delays.len().min(1)
        };
        for d in delays.into_iter().take(n) {
            self.at(
                d,
                Ev::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    fn deliver(&mut self, from: Node, to: Node, msg: DMsg) {
        match to {
            Node::Mon => self.mon_receive(from, msg),
            Node::Osd(id) => {
                if self.daemons.get(&id).is_some_and(|d| d.alive) {
                    self.osd_receive(id, from, msg);
                }
            }
            Node::Client(id) => self.client_receive(id, msg),
        }
    }

    // ---- monitor (a model: liveness by heartbeats, real maps and placement) ----

    fn mon_receive(&mut self, from: Node, msg: DMsg) {
        if let (Node::Osd(id), DMsg::Heartbeat) = (from, &msg) {
            self.mon_heard.insert(id, self.now_ms);
        }
        let epoch = self.current().0.epoch;
        self.send(Node::Mon, from, DMsg::MapEpoch(epoch));
    }

    fn mon_tick(&mut self) {
        let cur = self.current();
        let mut next = cur.0.clone();
        let mut changed = Vec::new();
        for (id, info) in next.osds.iter_mut() {
            let heard = self.mon_heard.get(id).copied();
            let recent = heard.is_some_and(|t| self.now_ms.saturating_sub(t) < DOWN_AFTER_MS);
            if info.up && !recent && self.now_ms >= DOWN_AFTER_MS {
                info.up = false;
                changed.push(format!("osd.{id} down"));
            } else if !info.up && recent {
                info.up = true;
                info.up_from = cur.0.epoch + 1;
                changed.push(format!("osd.{id} up"));
            }
        }
        if changed.is_empty() {
            return;
        }
        next.epoch = cur.0.epoch + 1;
        let placement = Placement::compute(&next);
        self.log(|| format!("mon: epoch {}: {}", next.epoch, changed.join(", ")));
        self.trace.u64(20 + next.epoch);
        let epoch = next.epoch;
        self.maps.push(Arc::new((next, placement)));
        for id in 0..self.cfg.daemons {
            self.send(Node::Mon, Node::Osd(id), DMsg::MapEpoch(epoch));
        }
        for c in 0..self.cfg.clients {
            self.send(Node::Mon, Node::Client(c), DMsg::MapEpoch(epoch));
        }
    }

    // ---- daemons ----

    fn osd_receive(&mut self, id: u32, from: Node, msg: DMsg) {
        match msg {
            DMsg::Ec(m) => self.ec_receive(id, from, m), // EC hook
            DMsg::MapEpoch(e) => self.osd_new_epoch(id, e),
            DMsg::ObjRequest {
                op,
                attempt,
                epoch,
                pg,
                name,
                what,
            } => {
                let Node::Client(c) = from else { return };
                let my_epoch = self.daemons[&id].epoch;
                if epoch > my_epoch {
                    // The client knows a newer map: never serve on an older placement.
                    self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
                    let result = Err(format!("need map {epoch}, mine is {my_epoch}"));
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::ObjReply {
                            op,
                            attempt,
                            result,
                        },
                    );
                    return;
                }
                let result = self.client_op(id, c, op, attempt, epoch, pg, &name, what);
                if let Some(result) = result {
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::ObjReply {
                            op,
                            attempt,
                            result,
                        },
                    );
                }
            }
            DMsg::Stream { conn, seq, inner } => {
                let Node::Osd(src) = from else { return };
                // The ordered stream: a gap means the connection broke.
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let st = d.in_streams.entry(src).or_insert((0, 0, true));
                if conn < st.0 {
                    return;
                }
                if conn > st.0 {
                    *st = (conn, 0, false);
                }
                if st.2 || seq != st.1 {
                    st.2 = true;
                    return;
                }
                st.1 += 1;
                self.osd_receive(id, from, *inner);
            }
            DMsg::RepWrite {
                epoch,
                pg,
                version,
                name,
                mutation,
            } => {
                let Node::Osd(src) = from else { return };
                let my_epoch = self.daemons[&id].epoch;
                if epoch != my_epoch {
                    if epoch > my_epoch {
                        self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
                    }
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::RepReply {
                            pg,
                            version,
                            result: Err(format!("epoch {epoch}, mine is {my_epoch}")),
                        },
                    );
                    return;
                }
                self.enqueue(
                    id,
                    Txn {
                        pg,
                        kind: TxnKind::Apply {
                            name,
                            version,
                            mutation,
                        },
                        then: Then::RepReply { to: src },
                    },
                );
            }
            DMsg::RepReply {
                pg,
                version,
                result,
            } => {
                let Node::Osd(src) = from else { return };
                let ev = match result {
                    Ok(()) => RepEvent::ReplicaAcked { version, from: src },
                    Err(reason) => RepEvent::ReplicaFailed {
                        version,
                        from: src,
                        reason,
                    },
                };
                if self.daemons[&id]
                    .primaries
                    .get(&pg)
                    .is_some_and(|p| p.awaiting.contains(&(version, src)))
                {
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.awaiting.remove(&(version, src));
                    }
                    self.rep_event(id, pg, ev);
                }
            }
            DMsg::Peer {
                epoch,
                pg,
                tag,
                req,
            } => {
                let Node::Osd(src) = from else { return };
                self.peer_request(id, Some(src), epoch, pg, tag, req);
            }
            DMsg::PeerReply { pg, tag, result } => self.peer_answer(id, pg, tag, result),
            DMsg::Heartbeat | DMsg::GetMap | DMsg::ObjReply { .. } => {}
        }
    }

    /// A peering / recovery request at a copy (`src` None: this daemon's own primary role).
    fn peer_request(
        &mut self,
        id: u32,
        src: Option<u32>,
        epoch: u64,
        pg: u32,
        tag: u64,
        req: PeerReq,
    ) {
        let my_epoch = self.daemons[&id].epoch;
        let reply_err = |w: &mut DataWorld, e: String| match src {
            Some(s) => w.send(
                Node::Osd(id),
                Node::Osd(s),
                DMsg::PeerReply {
                    pg,
                    tag,
                    result: Err(e),
                },
            ),
            None => w.peer_answer(id, pg, tag, Err(e)),
        };
        if epoch != my_epoch {
            if epoch > my_epoch {
                self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
            }
            reply_err(self, format!("epoch {epoch}, mine is {my_epoch}"));
            return;
        }
        let then = match src {
            Some(to) => Then::PeerReply { to, tag },
            None => Then::SelfReply { tag },
        };
        match req {
            PeerReq::Query | PeerReq::List => {
                let waiter = Waiter {
                    to: src,
                    tag,
                    list: matches!(req, PeerReq::List),
                };
                let ungated = self.cfg.mutant == Mutant::UngatedLogQuery;
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let released = if ungated {
                    Some(waiter)
                } else {
                    d.gate.log_query(pg, waiter)
                };
                if let Some(w) = released {
                    self.answer_waiter(id, pg, w);
                }
            }
            PeerReq::Mark { incomplete } => self.enqueue(
                id,
                Txn {
                    pg,
                    kind: TxnKind::Mark { incomplete },
                    then,
                },
            ),
            // As in the daemon, a pull reads the store now (what is applied), not after
            // the queued transactions.
            PeerReq::Pull { name } => {
                let pgid = self.pgid(pg);
                let Some(store) = self.daemons[&id].store.as_ref() else {
                    return;
                };
                let result = match store.stat(pgid, &name) {
                    None => Ok(PeerAns::Object(None)),
                    Some(meta) => match at_once(store.read(pgid, &name, 0, u64::MAX)) {
                        Some(Ok(data)) => Ok(PeerAns::Object(Some((data, meta.version)))),
                        Some(Err(e)) => Err(e.to_string()),
                        None => Err("read did not complete at once".into()),
                    },
                };
                match then {
                    Then::PeerReply { to, tag } => self.send(
                        Node::Osd(id),
                        Node::Osd(to),
                        DMsg::PeerReply { pg, tag, result },
                    ),
                    _ => self.peer_answer(id, pg, tag, result),
                }
            }
            PeerReq::Push { name, state } => self.enqueue(
                id,
                Txn {
                    pg,
                    kind: TxnKind::Recover { name, state },
                    then,
                },
            ),
        }
    }

    fn answer_waiter(&mut self, id: u32, pg: u32, w: Waiter) {
        let pgid = self.pgid(pg);
        let Some(store) = self.daemons[&id].store.as_ref() else {
            return;
        };
        let ans = if w.list {
            PeerAns::Listing(
                store
                    .list(pgid)
                    .into_iter()
                    .map(|(n, m)| {
                        (
                            n,
                            ListedObject {
                                version: m.version,
                                size_bytes: m.size_bytes,
                            },
                        )
                    })
                    .collect(),
            )
        } else {
            let info = store.pg_info(pgid);
            let log = store
                .pg_log(pgid)
                .into_iter()
                .map(|e| LogEntryMsg {
                    version: e.version,
                    name: e.name,
                    delete: e.op == LogOp::Delete,
                })
                .collect();
            self.log(|| {
                format!(
                    "osd.{id}: pg {pg}: log query of {:?} answered: last {:?} incomplete {}",
                    w.to, info.last_version, info.incomplete
                )
            });
            PeerAns::Log(LogInfo {
                last_version: info.last_version,
                log_tail: info.log_tail,
                log,
                incomplete: info.incomplete,
            })
        };
        match w.to {
            Some(to) => self.send(
                Node::Osd(id),
                Node::Osd(to),
                DMsg::PeerReply {
                    pg,
                    tag: w.tag,
                    result: Ok(ans),
                },
            ),
            None => self.peer_answer(id, pg, w.tag, Ok(ans)),
        }
    }

    fn enqueue(&mut self, id: u32, txn: Txn) {
        let pg = txn.pg;
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        d.gate.txn_queued(pg);
        d.queue.push_back(txn);
        if !d.disk_busy {
            d.disk_busy = true;
            let inc = d.inc;
            let delay = self.disk_delay_ms();
            self.at(delay, Ev::DiskStep { osd: id, inc });
        }
    }

    /// Applies the daemon's next queued store transaction, synchronously.
    fn disk_step(&mut self, id: u32) {
        let pgid_of = |w: &DataWorld, pg| w.pgid(pg);
        let Some(txn) = self.daemons.get_mut(&id).and_then(|d| d.queue.pop_front()) else {
            if let Some(d) = self.daemons.get_mut(&id) {
                d.disk_busy = false;
            }
            return;
        };
        let pgid = pgid_of(self, txn.pg);
        if let TxnKind::Recover { name, state } = &txn.kind {
            let v = state.as_ref().map(|s| s.1);
            self.log(|| format!("osd.{id}: pg {}: recover {name} to {v:?}", txn.pg));
        }
        let Some(store) = self.daemons[&id].store.as_ref() else {
            return;
        };
        let result: Result<(), String> = match &txn.kind {
            TxnKind::Apply {
                name,
                version,
                mutation,
            } => store
                .apply(pgid, name, *version, to_store(mutation))
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Recover { name, state } => store
                .recover_object(pgid, name, state.clone())
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Mark { incomplete } => store
                .mark_pg(pgid, *incomplete)
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Ec(t) => ec::store_txn(store, t),
        };
        self.trace.u64(u64::from(result.is_ok()));
        if let TxnKind::Mark { incomplete } = &txn.kind {
            self.log(|| {
                format!(
                    "osd.{id}: pg {}: marked incomplete={incomplete} ({:?})",
                    txn.pg, txn.then
                )
            });
        }
        if let Err(e) = &result {
            self.log(|| format!("osd.{id}: store {:?} failed: {e}", txn.kind));
            if matches!(txn.kind, TxnKind::Mark { .. } | TxnKind::Recover { .. }) {
                self.fail(format!("osd.{id}: a recovery transaction failed: {e}"));
            }
        }
        // The gate: queries waiting for this group's queued transactions.
        let released = self
            .daemons
            .get_mut(&id)
            .map(|d| d.gate.txn_applied(txn.pg))
            .unwrap_or_default();
        match txn.then {
            Then::LocalWrite => {
                if let TxnKind::Apply { version, .. } = txn.kind {
                    let awaited = self.daemons[&id]
                        .primaries
                        .get(&txn.pg)
                        .is_some_and(|p| p.awaiting.contains(&(version, id)));
                    if awaited {
                        if let Some(p) = self
                            .daemons
                            .get_mut(&id)
                            .and_then(|d| d.primaries.get_mut(&txn.pg))
                        {
                            p.awaiting.remove(&(version, id));
                        }
                        self.rep_event(id, txn.pg, RepEvent::LocalCommitted { version, result });
                    }
                }
            }
            Then::RepReply { to } => {
                if let TxnKind::Apply { version, .. } = txn.kind {
                    self.send(
                        Node::Osd(id),
                        Node::Osd(to),
                        DMsg::RepReply {
                            pg: txn.pg,
                            version,
                            result,
                        },
                    );
                }
            }
            Then::PeerReply { to, tag } => {
                let result = result.map(|()| PeerAns::Done);
                self.send(
                    Node::Osd(id),
                    Node::Osd(to),
                    DMsg::PeerReply {
                        pg: txn.pg,
                        tag,
                        result,
                    },
                );
            }
            Then::SelfReply { tag } => {
                let result = result.map(|()| PeerAns::Done);
                self.peer_answer(id, txn.pg, tag, result);
            }
            Then::Ec(then) => self.ec_txn_done(id, then, txn.kind, result),
        }
        for w in released {
            self.answer_waiter(id, txn.pg, w);
        }
        if !self.live_id(id) {
            return;
        }
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        if d.queue.is_empty() {
            d.disk_busy = false;
        } else {
            let inc = d.inc;
            let delay = self.disk_delay_ms();
            self.at(delay, Ev::DiskStep { osd: id, inc });
        }
    }

    /// How long the next store transaction takes: mostly a few ms, sometimes a slow disk.
    fn disk_delay_ms(&mut self) -> u64 {
        if self.rng.below(50) == 0 {
            self.rng.range(20, 300)
        } else {
            self.rng.range(0, 3)
        }
    }

    fn live_id(&self, id: u32) -> bool {
        self.daemons.get(&id).is_some_and(|d| d.alive)
    }

    /// The daemon learned of epoch `e`: new intervals for the groups it is primary of.
    fn osd_new_epoch(&mut self, id: u32, e: u64) {
        let cur = self.current().0.epoch;
        let e = e.min(cur);
        if e <= self.daemons[&id].epoch {
            return;
        }
        self.daemons.get_mut(&id).expect("daemon exists").epoch = e;
        let m = self.map_at(e);
        let (map, placement) = (&m.0, &m.1);
        for pg in 0..self.cfg.pgs.next_power_of_two() {
            let acting = placement
                .pg(self.pool, pg)
                .map(|p| p.up.clone())
                .unwrap_or_default();
            let ident: Vec<(u32, u64)> = acting
                .iter()
                .map(|o| (*o, map.osds.get(o).map_or(0, |i| i.up_from)))
                .collect();
            let primary = acting.first() == Some(&id);
            let d = self.daemons.get_mut(&id).expect("daemon exists");
            let same = d.primaries.get(&pg).is_some_and(|p| p.ident == ident);
            if primary && same {
                // Same interval: keep serving at the new epoch (replicas take writes of
                // their own epoch only, so writes in flight of the old one are dropped).
                let min_size = self.min_size;
                let mut dropped = Vec::new();
                let mut ops = BTreeMap::new();
                if let Some(p) = d.primaries.get_mut(&pg) {
                    p.epoch = e;
                    if p.rep.is_active() {
                        let last = p.rep.last_version();
                        let iv = RepInterval {
                            epoch: e,
                            me: id,
                            acting: p.acting.clone(),
                            min_size,
                        };
                        dropped = p.rep.activate(iv, last);
                        ops = p.ops.clone();
                    }
                }
                self.rep_actions_with(id, pg, dropped, &ops);
                continue;
            }
            // Interval change: writes in flight are dropped unacknowledged.
            if let Some(mut old) = d.primaries.remove(&pg) {
                let actions = old.rep.interval_changed(None);
                let ops = std::mem::take(&mut old.ops);
                self.rep_actions_with(id, pg, actions, &ops);
            }
            if primary {
                let mut p = Primary {
                    ident,
                    epoch: e,
                    acting,
                    peering: PgCore::new(),
                    gen: 0,
                    rep: ReplicationCore::new(),
                    recovery: None,
                    job: None,
                    completing: BTreeSet::new(),
                    awaiting: BTreeSet::new(),
                    ops: BTreeMap::new(),
                };
                p.rep
                    .set_broken_ack_before_replicas(self.cfg.mutant == Mutant::AckBeforeReplicas);
                self.daemons
                    .get_mut(&id)
                    .expect("daemon exists")
                    .primaries
                    .insert(pg, p);
                self.restart_peering(id, pg);
            }
        }
        self.ec_new_epoch(id, e); // EC hook
    }

    /// Starts peering (again) for a group this daemon is primary of.
    fn restart_peering(&mut self, id: u32, pg: u32) {
        self.report.peerings += 1;
        let min_size = self.min_size;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        p.gen += 1;
        p.recovery = None;
        p.job = None;
        p.completing.clear();
        let dropped = p.rep.interval_changed(Some(RepInterval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            min_size,
        }));
        let iv = Interval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            serve_floor: min_size,
        };
        // The same core: a new round number, so late replies of earlier rounds are
        // ignored by it; requests of earlier rounds (and recovery) are forgotten here.
        let (epoch, acting) = (p.epoch, p.acting.clone());
        let members = self.members(pg, epoch, &acting);
        self.log(|| format!("osd.{id}: pg {pg}: peering at epoch {epoch}, members {members:?}"));
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        p.peering.set_members(members);
        let actions = p.peering.on_event(PgEvent::IntervalChanged(iv));
        if let Some(d) = self.daemons.get_mut(&id) {
            d.pending.retain(|_, (g, _)| *g != pg);
        }
        self.rep_actions(id, pg, dropped);
        self.pg_actions(id, pg, actions);
    }

    /// For each acting copy: the epochs (up to `epoch`) at which it was in the group's
    /// acting set, from the map history.
    fn members(&self, pg: u32, epoch: u64, acting: &[u32]) -> spindle_pg::rules::MemberEpochs {
        let first = self.maps[0].0.epoch;
        acting
            .iter()
            .map(|&c| {
                let mut ranges: Vec<std::ops::RangeInclusive<u64>> = Vec::new();
                for e in first..=epoch {
                    let m = self.map_at(e);
                    if !m.1.pg(self.pool, pg).is_some_and(|x| x.up.contains(&c)) {
                        continue;
                    }
                    match ranges.last_mut() {
                        Some(r) if *r.end() + 1 == e => *r = *r.start()..=e,
                        _ => ranges.push(e..=e),
                    }
                }
                (c, ranges)
            })
            .collect()
    }

    fn new_tag(&mut self, id: u32, pg: u32, what: Pending) -> u64 {
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        let tag = d.next_tag;
        d.next_tag += 1;
        d.pending.insert(tag, (pg, what));
        let inc = d.inc;
        self.at(
            PEER_TIMEOUT_MS,
            Ev::PeerTimeout {
                osd: id,
                inc,
                pg,
                tag,
            },
        );
        tag
    }

    /// Sends a peering / recovery request to `copy` (itself: through its own queue).
    fn peer_send(&mut self, id: u32, pg: u32, copy: u32, what: Pending, req: PeerReq) {
        let tag = self.new_tag(id, pg, what);
        let epoch = self.daemons[&id].primaries.get(&pg).map_or(0, |p| p.epoch);
        if copy == id {
            self.peer_request(id, None, epoch, pg, tag, req);
        } else {
            self.send_stream(
                id,
                copy,
                DMsg::Peer {
                    epoch,
                    pg,
                    tag,
                    req,
                },
            );
        }
    }

    fn pg_actions(&mut self, id: u32, pg: u32, actions: Vec<PgAction>) {
        for a in actions {
            match a {
                PgAction::QueryLog { round, copy } => {
                    self.peer_send(id, pg, copy, Pending::Query { round, copy }, PeerReq::Query)
                }
                PgAction::ListObjects { round, copy } => {
                    self.peer_send(id, pg, copy, Pending::List { round, copy }, PeerReq::List)
                }
                PgAction::MarkIncomplete { round, copy } => self.peer_send(
                    id,
                    pg,
                    copy,
                    Pending::Mark { round, copy },
                    PeerReq::Mark { incomplete: true },
                ),
                PgAction::Activate(act) => self.activate(id, pg, act),
                PgAction::Inactive { .. } => {}
                PgAction::WaitForCompleteCopy { .. } | PgAction::RoundFailed { .. } => {
                    let Some(p) = self.daemons[&id].primaries.get(&pg) else {
                        return;
                    };
                    let (gen, inc) = (p.gen, self.daemons[&id].inc);
                    self.log(|| format!("osd.{id}: pg {pg}: {a:?}"));
                    let delay = PEER_RETRY_MS + self.rng.range(0, PEER_RETRY_MS);
                    self.at(
                        delay,
                        Ev::PeerRetry {
                            osd: id,
                            inc,
                            pg,
                            gen,
                        },
                    );
                }
            }
        }
    }

    fn activate(&mut self, id: u32, pg: u32, act: spindle_pg::Activation) {
        let min_size = self.min_size;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let iv = RepInterval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            min_size,
        };
        let dropped = p.rep.activate(iv, act.last_version);
        p.recovery = act
            .recovery
            .clone()
            .map(|plan| RecoveryCore::from_plan(plan, |_| None));
        let ops = p.ops.clone();
        let epoch = p.epoch;
        self.log(|| {
            format!(
                "osd.{id}: pg {pg} active at epoch {epoch}, last {:?}, recovery {:?}",
                act.last_version,
                act.recovery.as_ref().map(|r| r.missing.len())
            )
        });
        self.rep_actions_with(id, pg, dropped, &ops);
        self.recovery_pump(id, pg);
    }

    /// Background recovery: one object at a time, then the completion marks.
    fn recovery_pump(&mut self, id: u32, pg: u32) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if p.job.is_some() || !p.completing.is_empty() {
            return;
        }
        let Some(rec) = p.recovery.as_mut() else {
            return;
        };
        match rec.next() {
            Next::AllInProgress => {}
            Next::Finished => {
                let marks: Vec<u32> = rec.completion_marks().unwrap_or(&[]).to_vec();
                if marks.is_empty() {
                    p.recovery = None;
                    return;
                }
                p.completing = marks.iter().copied().collect();
                for copy in marks {
                    self.peer_send(
                        id,
                        pg,
                        copy,
                        Pending::Complete { copy },
                        PeerReq::Mark { incomplete: false },
                    );
                }
            }
            Next::Object { name, .. } => match rec.begin(&name) {
                Begin::Done | Begin::Wait => {}
                Begin::Recover { copies, source } => {
                    p.job = Some(RecJob {
                        name: name.clone(),
                        copies,
                        pushes_left: BTreeSet::new(),
                    });
                    self.peer_send(
                        id,
                        pg,
                        source,
                        Pending::Pull {
                            name: name.clone(),
                            copy: source,
                        },
                        PeerReq::Pull { name },
                    );
                }
            },
        }
    }

    fn recovery_failed(&mut self, id: u32, pg: u32) {
        let inc = self.daemons[&id].inc;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if let (Some(job), Some(rec)) = (p.job.take(), p.recovery.as_mut()) {
            rec.on_event(RecoveryEvent::Failed { name: job.name });
        }
        p.completing.clear();
        let gen = p.gen;
        self.at(
            PEER_RETRY_MS,
            Ev::RecoveryKick {
                osd: id,
                inc,
                pg,
                gen,
            },
        );
    }

    /// An answer (or failure) of a peering / recovery request.
    fn peer_answer(&mut self, id: u32, pg: u32, tag: u64, result: Result<PeerAns, String>) {
        let Some((pgx, what)) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.pending.remove(&tag))
        else {
            return;
        };
        if pgx != pg || !self.daemons[&id].primaries.contains_key(&pg) {
            return;
        }
        let ev = match (what, result) {
            (Pending::Query { round, copy }, Ok(PeerAns::Log(info))) => PgEvent::LogInfo {
                round,
                from: copy,
                info,
            },
            (Pending::Query { round, copy }, r) => PgEvent::QueryFailed {
                round,
                from: copy,
                reason: format!("{:?}", r.err()),
            },
            (Pending::List { round, copy }, Ok(PeerAns::Listing(listing))) => PgEvent::Listing {
                round,
                from: copy,
                listing,
            },
            (Pending::List { round, copy }, r) => PgEvent::ListFailed {
                round,
                from: copy,
                reason: format!("{:?}", r.err()),
            },
            (Pending::Mark { round, copy }, Ok(_)) => PgEvent::Marked { round, copy },
            (Pending::Mark { round, copy }, Err(reason)) => PgEvent::MarkFailed {
                round,
                copy,
                reason,
            },
            (Pending::Pull { name, .. }, Ok(PeerAns::Object(state))) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                let Some(job) = p.job.as_mut().filter(|j| j.name == name) else {
                    return;
                };
                let copies = job.copies.clone();
                job.pushes_left = copies.iter().copied().collect();
                for copy in copies {
                    self.peer_send(
                        id,
                        pg,
                        copy,
                        Pending::Push {
                            name: name.clone(),
                            copy,
                        },
                        PeerReq::Push {
                            name: name.clone(),
                            state: state.clone(),
                        },
                    );
                }
                return;
            }
            (Pending::Push { name, copy }, Ok(_)) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                let Some(job) = p.job.as_mut().filter(|j| j.name == name) else {
                    return;
                };
                job.pushes_left.remove(&copy);
                if job.pushes_left.is_empty() {
                    p.job = None;
                    if let Some(rec) = p.recovery.as_mut() {
                        rec.on_event(RecoveryEvent::Recovered { name });
                    }
                    self.report.objects_recovered += 1;
                    self.recovery_pump(id, pg);
                }
                return;
            }
            (Pending::Complete { copy }, Ok(_)) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                if p.completing.remove(&copy) && p.completing.is_empty() {
                    p.recovery = None;
                }
                return;
            }
            (Pending::Pull { .. } | Pending::Push { .. } | Pending::Complete { .. }, _) => {
                self.recovery_failed(id, pg);
                return;
            }
        };
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let actions = p.peering.on_event(ev);
        self.pg_actions(id, pg, actions);
    }

    // ---- client operations at the primary ----

    #[allow(clippy::too_many_arguments)]
    fn client_op(
        &mut self,
        id: u32,
        client: u32,
        op: u64,
        attempt: u32,
        epoch: u64,
        pg: u32,
        name: &str,
        what: ClientOp,
    ) -> Option<Result<State, String>> {
        if self.ec.is_some() {
            // EC hook
            return self.ec_client_op(id, client, op, attempt, epoch, pg, name, what);
        }
        let d = &self.daemons[&id];
        if epoch < d.epoch {
            return Some(Err(format!("stale map: epoch {epoch}, mine {}", d.epoch)));
        }
        let Some(p) = d.primaries.get(&pg) else {
            return Some(Err("not primary".into()));
        };
        if !p.rep.is_active() {
            return Some(Err("not active".into()));
        }
        if p.recovery
            .as_ref()
            .is_some_and(|r| r.is_missing(name, None))
        {
            // Operations on an object some copy misses wait for its recovery.
            return Some(Err("object is being recovered".into()));
        }
        match what {
            ClientOp::Read => {
                let pgid = self.pgid(pg);
                let store = d.store.as_ref()?;
                let state = match store.stat(pgid, name) {
                    None => None,
                    Some(_) => match at_once(store.read(pgid, name, 0, u64::MAX)) {
                        Some(Ok(data)) => Some(data),
                        Some(Err(e)) => return Some(Err(e.to_string())),
                        None => return Some(Err("read did not complete".into())),
                    },
                };
                Some(Ok(state))
            }
            ClientOp::Write(m) => {
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let rep_op = d.next_rep_op;
                d.next_rep_op += 1;
                let p = d.primaries.get_mut(&pg)?;
                p.ops.insert(rep_op, (client, op, attempt));
                let actions = p.rep.submit(rep_op, name, wire(&m));
                self.rep_actions(id, pg, actions);
                None
            }
        }
    }

    fn rep_event(&mut self, id: u32, pg: u32, ev: RepEvent) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let actions = p.rep.on_event(ev);
        self.rep_actions(id, pg, actions);
    }

    fn rep_timeout(&mut self, id: u32, pg: u32, version: Ver, copy: u32) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if !p.awaiting.remove(&(version, copy)) {
            return;
        }
        // Reconnect: the stream to that copy starts over.
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        d.out_streams.remove(&copy);
        self.rep_event(
            id,
            pg,
            RepEvent::ReplicaFailed {
                version,
                from: copy,
                reason: "timed out".into(),
            },
        );
    }

    fn rep_actions(&mut self, id: u32, pg: u32, actions: Vec<RepAction>) {
        let ops = self.daemons[&id]
            .primaries
            .get(&pg)
            .map(|p| p.ops.clone())
            .unwrap_or_default();
        self.rep_actions_with(id, pg, actions, &ops);
    }

    fn rep_actions_with(
        &mut self,
        id: u32,
        pg: u32,
        actions: Vec<RepAction>,
        ops: &BTreeMap<u64, (u32, u64, u32)>,
    ) {
        let inc = self.daemons[&id].inc;
        for a in actions {
            match a {
                RepAction::ApplyLocal {
                    version,
                    name,
                    mutation,
                } => {
                    let Some(mutation) = from_wire(mutation) else {
                        continue;
                    };
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.awaiting.insert((version, id));
                    }
                    self.enqueue(
                        id,
                        Txn {
                            pg,
                            kind: TxnKind::Apply {
                                name,
                                version,
                                mutation,
                            },
                            then: Then::LocalWrite,
                        },
                    );
                }
                RepAction::Replicate {
                    to,
                    epoch,
                    version,
                    name,
                    mutation,
                } => {
                    let Some(mutation) = from_wire(mutation) else {
                        continue;
                    };
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.awaiting.insert((version, to));
                    }
                    self.at(
                        REPLICA_TIMEOUT_MS,
                        Ev::RepTimeout {
                            osd: id,
                            inc,
                            pg,
                            version,
                            copy: to,
                        },
                    );
                    self.send_stream(
                        id,
                        to,
                        DMsg::RepWrite {
                            epoch,
                            pg,
                            version,
                            name,
                            mutation,
                        },
                    );
                }
                RepAction::Reply { op, result } => {
                    let Some(&(client, cop, attempt)) = ops.get(&op) else {
                        continue;
                    };
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.ops.remove(&op);
                    }
                    self.log(|| {
                        format!("osd.{id}: pg {pg}: reply to client.{client} op {cop}: {result:?}")
                    });
                    let result = result.map(|_| None).map_err(|e| format!("{e:?}"));
                    // A write's reply carries no data: Ok(None) means "done".
                    self.send(
                        Node::Osd(id),
                        Node::Client(client),
                        DMsg::ObjReply {
                            op: cop,
                            attempt,
                            result,
                        },
                    );
                }
                RepAction::Repeer { reason } => {
                    self.log(|| format!("osd.{id}: pg {pg}: repeer: {reason}"));
                    if self.daemons[&id].primaries.contains_key(&pg) {
                        self.restart_peering(id, pg);
                    }
                }
            }
        }
    }

    /// A request over the ordered stream to `to`.
    fn send_stream(&mut self, id: u32, to: u32, msg: DMsg) {
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        let inc = d.inc;
        if !d.out_streams.contains_key(&to) {
            let conn = inc << 32 | d.next_conn;
            d.next_conn += 1;
            d.out_streams.insert(to, (conn, 0, 0));
        }
        let st = d.out_streams.get_mut(&to).expect("just inserted");
        let (conn, seq) = (st.0, st.1);
        st.1 += 1;
        let last = st.2;
        let delays = self.net.route(&mut self.rng, Node::Osd(id), Node::Osd(to));
        let Some(&d0) = delays.first() else {
            return;
        };
        // In order: never before the previous message of the stream.
        let at = (self.now_ms + d0).max(last);
        if let Some(st) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.out_streams.get_mut(&to))
        {
            st.2 = at;
        }
        self.queue.push(
            at,
            Ev::Deliver {
                from: Node::Osd(id),
                to: Node::Osd(to),
                msg: DMsg::Stream {
                    conn,
                    seq,
                    inner: Box::new(msg),
                },
            },
        );
    }

    // ---- clients ----

    fn client_receive(&mut self, id: u32, msg: DMsg) {
        match msg {
            DMsg::MapEpoch(e) => {
                let c = self.clients.get_mut(&id).expect("client exists");
                c.epoch = c.epoch.max(e);
            }
            DMsg::ObjReply {
                op,
                attempt,
                result,
            } => {
                let current = self.clients[&id]
                    .inflight
                    .get(&op)
                    .is_some_and(|o| o.attempt == attempt);
                if !current {
                    return;
                }
                match result {
                    Ok(state) => self.client_done(id, op, state),
                    Err(e) => {
                        self.log(|| format!("client.{id}: op {op} attempt {attempt}: {e}"));
                        self.send(Node::Client(id), Node::Mon, DMsg::GetMap);
                        let delay = self.rng.range(30, 200);
                        // The next attempt gets a new number: this one is over.
                        if let Some(o) = self
                            .clients
                            .get_mut(&id)
                            .and_then(|c| c.inflight.get_mut(&op))
                        {
                            o.attempt += 1;
                        }
                        self.at(delay, Ev::ClientRetry { client: id, op });
                    }
                }
            }
            _ => {}
        }
    }

    fn client_done(&mut self, id: u32, op: u64, state: State) {
        let Some(o) = self
            .clients
            .get_mut(&id)
            .and_then(|c| c.inflight.remove(&op))
        else {
            return;
        };
        let c = self.clients.get_mut(&id).expect("client exists");
        c.busy.remove(&o.obj);
        self.report.ops_done += 1;
        let now = self.now_ms;
        match &o.what {
            ClientOp::Write(m) => {
                self.report.writes_acked += 1;
                let model = &mut self.models[o.obj];
                let last = model.history.last().map(|h| h.1.clone()).unwrap_or(None);
                let new = applied(&last, m);
                let mut h = TraceHash::default();
                h.bytes(new.as_deref().unwrap_or(&[]));
                self.trace.u64(h.value());
                let name = &self.objects[o.obj];
                if self.cfg.verbose {
                    eprintln!(
                        "[{now:>8} ms] client.{id}: op {op} write of {name} acknowledged: {}",
                        describe(&new)
                    );
                }
                model.history.push((now, new));
                model.pending = None;
            }
            ClientOp::Read => {
                self.report.reads_checked += 1;
                let mut h = TraceHash::default();
                h.bytes(state.as_deref().unwrap_or(&[]));
                self.trace.u64(h.value());
                let model = &self.models[o.obj];
                // The last state acknowledged before the read started, or a later one (or
                // the state of a write in flight).
                let from = model
                    .history
                    .iter()
                    .rposition(|(t, _)| *t < o.start_ms)
                    .unwrap_or(0);
                let ok = model.history[from..].iter().any(|(_, s)| *s == state)
                    || model.pending.as_ref() == Some(&state);
                if !ok {
                    let want = describe(&model.history[from].1);
                    let got = describe(&state);
                    let name = self.objects[o.obj].clone();
                    self.fail(format!(
                        "client.{id}: read of {name} started at {} ms returned {got}, \
                         but {want} was acknowledged before",
                        o.start_ms
                    ));
                }
            }
        }
        let delay = self.rng.range(0, 20);
        self.at(delay, Ev::ClientIssue { client: id });
    }

    fn client_issue(&mut self, id: u32) {
        let c = &self.clients[&id];
        if c.issued >= c.quota {
            return;
        }
        let free: Vec<usize> = c
            .owned
            .iter()
            .copied()
            .filter(|o| !c.busy.contains(o))
            .collect();
        if free.is_empty() {
            return;
        }
        let obj = free[self.rng.below(free.len() as u64) as usize];
        let last = self.models[obj]
            .history
            .last()
            .map(|h| h.1.clone())
            .unwrap_or(None);
        let what = if self.rng.below(100) < 30 {
            ClientOp::Read
        } else {
            ClientOp::Write(self.random_mutation(&last))
        };
        let what = self.ec_shape_op(what, &last); // EC hook
        if let ClientOp::Write(m) = &what {
            self.models[obj].pending = Some(applied(&last, m));
        }
        let op = self.next_op;
        self.next_op += 1;
        let c = self.clients.get_mut(&id).expect("client exists");
        c.issued += 1;
        c.busy.insert(obj);
        c.inflight.insert(
            op,
            InFlightOp {
                obj,
                what,
                start_ms: self.now_ms,
                attempt: 0,
            },
        );
        self.client_send(id, op);
    }

    fn random_mutation(&mut self, _last: &State) -> Mutation {
        let r = &mut self.rng;
        let bytes = |r: &mut SimRng, len: u64| -> Vec<u8> {
            let seed = r.next_u64();
            let mut g = SimRng::new(seed);
            (0..len).map(|_| g.next_u64() as u8).collect()
        };
        match r.below(10) {
            0..=3 => {
                let len = if r.below(8) == 0 {
                    r.range(16_385, 40_000)
                } else {
                    r.range(0, 12_000)
                };
                Mutation::WriteFull(bytes(r, len))
            }
            4..=6 => {
                let offset = r.below(20_000);
                let len = r.range(1, 6_000);
                Mutation::Write {
                    offset,
                    data: bytes(r, len),
                }
            }
            7 | 8 => Mutation::Truncate {
                size_bytes: r.below(24_000),
            },
            _ => Mutation::Delete,
        }
    }

    fn client_send(&mut self, id: u32, op: u64) {
        let epoch = self.clients[&id].epoch;
        let Some(o) = self
            .clients
            .get_mut(&id)
            .and_then(|c| c.inflight.get_mut(&op))
        else {
            return;
        };
        o.attempt += 1;
        let (attempt, obj, what) = (o.attempt, o.obj, o.what.clone());
        let name = self.objects[obj].clone();
        let pg = self.pg_of(&name);
        let primary = (epoch > 0)
            .then(|| {
                self.map_at(epoch)
                    .1
                    .pg(self.client_pool(), pg) // EC hook
                    .and_then(|m| m.primary())
            })
            .flatten();
        self.at(
            CLIENT_TIMEOUT_MS,
            Ev::ClientTimeout {
                client: id,
                op,
                attempt,
            },
        );
        match primary {
            Some(p) => self.send(
                Node::Client(id),
                Node::Osd(p),
                DMsg::ObjRequest {
                    op,
                    attempt,
                    epoch,
                    pg,
                    name,
                    what,
                },
            ),
            None => {
                // No map yet, or no copy up: ask again soon.
                self.send(Node::Client(id), Node::Mon, DMsg::GetMap);
            }
        }
    }

    // ---- faults ----

    fn inject_fault(&mut self) {
        if self.faults_over {
            return;
        }
        self.report.faults += 1;
        let n = self.cfg.daemons;
        match self.rng.below(10) {
            0..=2 => {
                // Crash: unsynced data is lost; the process restarts later.
                let osd = self.rng.below(n as u64) as u32;
                if !self.daemons[&osd].alive {
                    return;
                }
                let alive = self.daemons.values().filter(|d| d.alive).count();
                if alive <= 1 {
                    return;
                }
                self.report.crashes += 1;
                self.log(|| format!("FAULT: osd.{osd} crashes"));
                let d = self.daemons.get_mut(&osd).expect("daemon exists");
                d.alive = false;
                d.store = None;
                d.disk = d.disk.crash();
                let back = self.rng.range(500, 6_000);
                self.at(back, Ev::Restart { osd });
            }
            3..=4 => {
                // A daemon cut off from everyone.
                let osd = self.rng.below(n as u64) as u32;
                let len = self.rng.range(1_000, 8_000);
                self.log(|| format!("FAULT: osd.{osd} isolated for {len} ms"));
                let mut others = vec![Node::Mon];
                others.extend((0..n).filter(|&o| o != osd).map(Node::Osd));
                others.extend((0..self.cfg.clients).map(Node::Client));
                for other in others {
                    self.net.partition(Node::Osd(osd), other);
                    self.at(len, Ev::HealPair(Node::Osd(osd), other));
                }
            }
            5 => {
                // A daemon cut off from the monitor only: marked down while it still
                // serves at its old epoch (a deposed primary that does not know it).
                let osd = self.rng.below(n as u64) as u32;
                let len = self.rng.range(2_000, 8_000);
                self.log(|| format!("FAULT: osd.{osd} cut from the monitor for {len} ms"));
                self.net.partition(Node::Osd(osd), Node::Mon);
                self.at(len, Ev::HealPair(Node::Osd(osd), Node::Mon));
            }
            6 => {
                // Two daemons cannot talk (both still reach the monitor).
                let a = self.rng.below(n as u64) as u32;
                let b = self.rng.below(n as u64) as u32;
                if a == b {
                    return;
                }
                let len = self.rng.range(500, 5_000);
                self.log(|| format!("FAULT: osd.{a} <-> osd.{b} cut for {len} ms"));
                self.net.partition(Node::Osd(a), Node::Osd(b));
                self.at(len, Ev::HealPair(Node::Osd(a), Node::Osd(b)));
            }
            _ => {
                let len = self.rng.range(1_000, 8_000);
                self.net.config = NetConfig {
                    delay_ms_min: 1,
                    delay_ms_max: self.rng.range(20, BAD_DELAY_MS_MAX),
                    loss_ppm: self.rng.range(0, 100_000) as u32,
                    duplicate_ppm: self.rng.range(0, 100_000) as u32,
                };
                let cfg = self.net.config;
                self.log(|| format!("FAULT: bad network for {len} ms: {cfg:?}"));
                self.at(len, Ev::HealNet);
            }
        }
    }

    fn restart(&mut self, osd: u32) {
        let Some(d) = self.daemons.get_mut(&osd) else {
            return;
        };
        if d.alive {
            return;
        }
        let store = match Store::open_on(Arc::new(d.disk.clone()), store_config()) {
            Ok(s) => s,
            Err(e) => {
                let e = e.to_string();
                self.fail(format!(
                    "osd.{osd}: the store does not reopen after a crash: {e}"
                ));
                return;
            }
        };
        self.log(|| format!("osd.{osd} restarts"));
        let d = self.daemons.get_mut(&osd).expect("daemon exists");
        d.alive = true;
        d.inc += 1;
        d.store = Some(store);
        d.epoch = 0;
        d.queue.clear();
        d.disk_busy = false;
        d.gate = TxnGate::new();
        d.primaries.clear();
        d.pending.clear();
        d.out_streams.clear();
        d.in_streams.clear();
        let inc = d.inc;
        self.ec_restart(osd); // EC hook
        self.at(0, Ev::OsdTick { osd, inc });
        let at = self.rng.range(200, 2_000);
        self.at(at, Ev::Checkpoint { osd, inc });
    }

    fn end_faults(&mut self) {
        self.faults_over = true;
        self.net.heal_all();
        self.net.config = self.clean_net;
        let dead: Vec<u32> = self
            .daemons
            .iter()
            .filter(|(_, d)| !d.alive)
            .map(|(id, _)| *id)
            .collect();
        for osd in dead {
            self.restart(osd);
        }
        self.log(|| "faults over".into());
    }

    // ---- checkers ----

    fn check(&mut self) {
        self.at(CHECK_EVERY_MS, Ev::Check);
        let workload_done = self
            .clients
            .values()
            .all(|c| c.issued >= c.quota && c.inflight.is_empty());
        if !(workload_done && self.faults_over) {
            return;
        }
        let now = self.now_ms;
        let deadline = *self
            .settle_deadline_ms
            .get_or_insert(now + self.cfg.settle_ms);
        self.workload_done_ms.get_or_insert(now);
        let unclean = self.unclean_pgs();
        if unclean.is_empty() {
            self.final_check();
            self.finished = true;
            return;
        }
        if now >= deadline {
            self.fail(format!(
                "not clean {} ms after the faults and the workload ended: {}",
                self.cfg.settle_ms,
                unclean.join("; ")
            ));
            self.finished = true;
        }
    }

    /// Groups that are not clean: every acting copy up, at the current epoch, the primary
    /// active with no recovery left, every copy complete and at the same last version.
    fn unclean_pgs(&self) -> Vec<String> {
        let cur = self.current();
        let mut out = Vec::new();
        for pg in 0..self.cfg.pgs.next_power_of_two() {
            let Some(m) = cur.1.pg(self.pool, pg) else {
                continue;
            };
            let Some(primary) = m.primary() else {
                out.push(format!("pg {pg}: no copy up"));
                continue;
            };
            if m.up.len() < self.cfg.daemons.min(3) as usize {
                out.push(format!("pg {pg}: only {:?} up", m.up));
                continue;
            }
            let d = &self.daemons[&primary];
            let Some(p) = d.primaries.get(&pg).filter(|_| d.epoch == cur.0.epoch) else {
                out.push(format!(
                    "pg {pg}: osd.{primary} has not taken it at the current epoch"
                ));
                continue;
            };
            if !p.rep.is_active() || p.recovery.is_some() || p.rep.inflight() > 0 {
                out.push(format!(
                    "pg {pg}: active {} recovering {} in flight {}",
                    p.rep.is_active(),
                    p.recovery.is_some(),
                    p.rep.inflight()
                ));
                continue;
            }
            // Every copy complete, holding the same objects at the same versions. (A copy
            // caught up by log-based recovery keeps its older PG `last_version` until the
            // next write, as in the daemon: `recover_object` writes no log entry.)
            let mut listings = BTreeSet::new();
            let mut incomplete = Vec::new();
            for o in &m.up {
                let Some(s) = self.daemons[o].store.as_ref() else {
                    incomplete.push(*o);
                    continue;
                };
                let pgid = self.pgid(pg);
                if s.pg_info(pgid).incomplete {
                    incomplete.push(*o);
                }
                let l: Vec<(String, Ver, u64)> = s
                    .list(pgid)
                    .into_iter()
                    .map(|(n, m)| (n, m.version, m.size_bytes))
                    .collect();
                listings.insert(l);
            }
            if listings.len() > 1 || !incomplete.is_empty() {
                out.push(format!(
                    "pg {pg}: {} different listings, incomplete copies {incomplete:?}",
                    listings.len()
                ));
            }
        }
        out.extend(self.ec_unclean()); // EC hook
        out
    }

    /// After clean: every copy of every object is identical and equals the model (the
    /// last acknowledged state; nothing is in flight any more).
    fn final_check(&mut self) {
        if self.ec.is_some() {
            return self.ec_final_check(); // EC hook
        }
        let mut problems = Vec::new();
        let cur = self.current();
        for (i, name) in self.objects.iter().enumerate() {
            let pg = self.pg_of(name);
            let pgid = self.pgid(pg);
            let model = &self.models[i];
            let acked = model.history.last().map(|h| h.1.clone()).unwrap_or(None);
            // The acting copies (other daemons may keep a stray copy of an older interval:
            // stray removal is not modeled).
            let acting: Vec<u32> = cur
                .1
                .pg(self.pool, pg)
                .map(|m| m.up.clone())
                .unwrap_or_default();
            for (id, d) in self.daemons.iter().filter(|(id, _)| acting.contains(id)) {
                let Some(store) = d.store.as_ref() else {
                    problems.push(format!("osd.{id} has no store at the end"));
                    continue;
                };
                let got: State = match store.stat(pgid, name) {
                    None => None,
                    Some(_) => match at_once(store.read(pgid, name, 0, u64::MAX)) {
                        Some(Ok(data)) => Some(data),
                        other => {
                            problems.push(format!("osd.{id}: {name} unreadable: {other:?}"));
                            continue;
                        }
                    },
                };
                let ok = got == acked || model.pending.as_ref() == Some(&got);
                if !ok {
                    problems.push(format!(
                        "osd.{id}: {name} is {} but the last acknowledged state is {}",
                        describe(&got),
                        describe(&acked)
                    ));
                }
            }
            // All copies identical (versions too).
            let versions: BTreeSet<Option<Ver>> = self
                .daemons
                .iter()
                .filter(|(id, _)| acting.contains(id))
                .filter_map(|(_, d)| d.store.as_ref())
                .map(|s| s.stat(pgid, name).map(|m| m.version))
                .collect();
            if versions.len() > 1 {
                problems.push(format!("{name}: copies at different versions {versions:?}"));
            }
        }
        for p in problems {
            self.fail(format!("after clean: {p}"));
        }
    }
}

/// Runs one seed of the data simulator.
pub fn run_data(cfg: DataConfig) -> DataReport {
    let seed = cfg.seed;
    match DataWorld::new(cfg) {
        Ok(w) => w.run(),
        Err(e) => DataReport {
            seed,
            failures: vec![format!("cannot set the simulation up: {e}")],
            ..DataReport::default()
        },
    }
}
