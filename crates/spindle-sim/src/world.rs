//! The simulated cluster: the real monitor node ([`spindle_mon::MonNode`]: the core and
//! its map store, the request handling `spindle_mon::Monitor` runs over TCP), storage daemons'
//! monitor sessions, and map-following clients, all exchanging real protocol messages
//! (encoded and decoded with `spindle_proto`) over the simulated network, on one thread,
//! in simulated time, with faults.
//!
//! The daemons' monitor sessions run the real session core
//! (`spindle_map::session::DaemonSession`, the one `spindle_osd::Osd::mon_loop` executes);
//! the client's map follower is still a model here (subscribe, ask for a newer map every
//! second).

use crate::net::{NetConfig, Network, Node};
use crate::queue::EventQueue;
use crate::rng::SimRng;
use crate::trace::TraceHash;
use spindle_map::session::{DaemonSession, SessionAction, SessionState, SessionTiming};
use spindle_map::ClusterMap;
use spindle_mon::{
    AdminCommand, Handled, InitSpec, MemMapStore, MonCore, MonNode, MonTiming, OsdVerb,
};
use spindle_proto::Msg;
use std::collections::{BTreeMap, BTreeSet};

/// Heartbeat interval of a daemon (`OsdConfig::heartbeat_ms`).
const HEARTBEAT_MS: u64 = 400;

/// The daemons' session timing: the one `Osd::mon_loop` uses for its configured
/// heartbeat.
fn session_timing() -> SessionTiming {
    SessionTiming::with_heartbeat(HEARTBEAT_MS)
}
/// The monitor's ticker (`check_heartbeats`).
const MON_TICK_MS: u64 = 200;
/// A client asks the monitor for a newer map this often.
const CLIENT_POLL_MS: u64 = 1_000;

/// What one run does.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    pub seed: u64,
    pub daemons: u32,
    pub clients: u32,
    /// Faults are injected during the first `fault_window_ms` of simulated time.
    pub fault_window_ms: u64,
    /// At least this many faults are injected (spread over the window).
    pub faults: u32,
    /// After the faults stop, everything must have converged within this long.
    pub settle_ms: u64,
    pub timing: MonTiming,
    /// Print the run's decisions (commits, boots, faults) to stderr.
    pub verbose: bool,
}

impl WorldConfig {
    pub fn new(seed: u64) -> WorldConfig {
        WorldConfig {
            seed,
            daemons: 3,
            clients: 2,
            fault_window_ms: 120_000,
            faults: 24,
            settle_ms: 40_000,
            timing: MonTiming {
                down_after_ms: 2_000,
                out_after_ms: 30_000,
            },
            verbose: false,
        }
    }
}

/// What a run found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WorldReport {
    pub seed: u64,
    pub trace_hash: String,
    pub sim_time_ms: u64,
    pub events: u64,
    pub faults: u64,
    pub epochs: u64,
    pub messages: crate::net::NetStats,
    /// Violated invariants (empty: the run passed).
    pub failures: Vec<String>,
}

#[derive(Debug)]
enum Ev {
    /// A frame: the sender's map epoch rides in the header, as on the wire.
    Deliver {
        from: Node,
        to: Node,
        epoch: u64,
        /// Matches a reply to its request; 0 = unsolicited.
        request_id: u64,
        kind: u16,
        payload: Vec<u8>,
    },
    MonTick,
    MonRestart,
    OsdTimer {
        osd: u32,
        incarnation: u64,
    },
    /// A daemon process starts; `by_fault`: the restart a crash fault scheduled (dropped
    /// once the faults are over: everything was restarted then).
    OsdRestart {
        osd: u32,
        by_fault: bool,
    },
    ClientPoll(u32),
    Fault,
    Heal(Heal),
    EndOfFaults,
    Check,
}

#[derive(Debug)]
enum Heal {
    Partition(Node, Node),
    /// The end of a lossy period: back to the clean network (overlapping periods end at
    /// the first end).
    Network,
}

/// The monitor: the real node (None while it is down), its durable map store (survives a
/// crash), and its map subscribers (connections: lost when it crashes).
struct MonShell {
    node: Option<MonNode>,
    store: MemMapStore,
    subscribers: BTreeSet<Node>,
}

struct OsdNode {
    alive: bool,
    /// Bumped at every restart; stale timers of an earlier incarnation are ignored.
    incarnation: u64,
    pid: u32,
    map: Option<ClusterMap>,
    /// The daemon's real session core (`spindle_map::session`), as `Osd::mon_loop` runs it.
    session: DaemonSession,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CmdKind {
    Create,
    Remove,
    Other,
}

struct Command {
    kind: CmdKind,
    pool: String,
}

/// What the commands about one pool were told: an acknowledged create that was never
/// followed by a remove must leave the pool in the map; an acknowledged remove must not.
#[derive(Default)]
struct PoolFate {
    create_acked: bool,
    remove_sent: bool,
    remove_acked: bool,
}

struct ClientNode {
    map: Option<ClusterMap>,
}

pub struct World {
    cfg: WorldConfig,
    now_ms: u64,
    rng: SimRng,
    queue: EventQueue<Ev>,
    net: Network,
    trace: TraceHash,
    mon: MonShell,
    osds: BTreeMap<u32, OsdNode>,
    clients: BTreeMap<u32, ClientNode>,
    /// Every published epoch's map bytes: all observers must agree on each epoch.
    published: BTreeMap<u64, Vec<u8>>,
    /// Administrative commands sent and not answered yet, by request id.
    commands: BTreeMap<u64, Command>,
    /// Pools created by commands during the run, and what their commands were told.
    pools: BTreeMap<String, PoolFate>,
    next_request_id: u64,
    faults_injected: u64,
    faults_over: bool,
    events: u64,
    failures: Vec<String>,
}

impl World {
    pub fn new(cfg: WorldConfig) -> World {
        let mut rng = SimRng::new(cfg.seed);
        let spec = InitSpec {
            osd_count: cfg.daemons,
            osd_hosts: Vec::new(),
            default_pool: Some(("default".into(), 3.min(cfg.daemons), 1, 16)),
        };
        let first = spindle_mon::first_map(&spec, rng.next_u64()).expect("valid first map");
        let mut published = BTreeMap::new();
        published.insert(first.epoch, first.encode());
        let store = MemMapStore::with(first.clone());
        let mon = MonShell {
            node: Some(MonNode::new(
                MonCore::new(first, cfg.timing, 0),
                Box::new(store.clone()),
            )),
            store,
            subscribers: BTreeSet::new(),
        };
        let osds = (0..cfg.daemons)
            .map(|id| {
                (
                    id,
                    OsdNode {
                        alive: true,
                        incarnation: 0,
                        pid: 1000 + id,
                        map: None,
                        session: DaemonSession::start(session_timing(), 0).0,
                    },
                )
            })
            .collect();
        let clients = (0..cfg.clients)
            .map(|id| (id, ClientNode { map: None }))
            .collect();
        World {
            net: Network::new(NetConfig::default()),
            now_ms: 0,
            queue: EventQueue::default(),
            trace: TraceHash::default(),
            mon,
            osds,
            clients,
            published,
            commands: BTreeMap::new(),
            pools: BTreeMap::new(),
            next_request_id: 1,
            faults_injected: 0,
            faults_over: false,
            events: 0,
            failures: Vec::new(),
            rng,
            cfg,
        }
    }

    /// Runs the whole scenario and returns what it found.
    pub fn run(mut self) -> WorldReport {
        self.queue.push(0, Ev::MonTick);
        for id in 0..self.cfg.daemons {
            let at = self.rng.range(0, 300);
            self.queue.push(
                at,
                Ev::OsdRestart {
                    osd: id,
                    by_fault: false,
                },
            );
        }
        for id in 0..self.cfg.clients {
            let at = self.rng.range(0, 300);
            self.queue.push(at, Ev::ClientPoll(id));
        }
        let spacing = (self.cfg.fault_window_ms / self.cfg.faults.max(1) as u64).max(1);
        for i in 0..self.cfg.faults as u64 {
            let at = 1_000 + i * spacing + self.rng.below(spacing);
            self.queue.push(at.min(self.cfg.fault_window_ms), Ev::Fault);
        }
        let end_of_faults = self.cfg.fault_window_ms + 1;
        self.queue.push(end_of_faults, Ev::EndOfFaults);
        self.queue
            .push(end_of_faults + self.cfg.settle_ms, Ev::Check);
        let deadline = end_of_faults + self.cfg.settle_ms;
        while let Some((at, ev)) = self.queue.pop() {
            debug_assert!(at >= self.now_ms, "time never goes back");
            self.now_ms = at;
            self.events += 1;
            self.trace.u64(at);
            let stop = matches!(ev, Ev::Check);
            self.step(ev);
            if stop || at > deadline {
                break;
            }
        }
        WorldReport {
            seed: self.cfg.seed,
            trace_hash: format!("{:016x}", self.trace.value()),
            sim_time_ms: self.now_ms,
            events: self.events,
            faults: self.faults_injected,
            epochs: self.published.keys().next_back().copied().unwrap_or(0),
            messages: self.net.stats,
            failures: self.failures,
        }
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.cfg.verbose {
            eprintln!("{:>9} ms  {}", self.now_ms, what());
        }
    }

    fn fail(&mut self, what: String) {
        if self.failures.len() < 20 {
            self.failures.push(format!("t={} ms: {what}", self.now_ms));
        }
    }

    fn epoch_of(&self, node: Node) -> u64 {
        match node {
            Node::Mon => self.mon.node.as_ref().map_or(0, |n| n.epoch()),
            Node::Osd(id) => self
                .osds
                .get(&id)
                .and_then(|o| o.map.as_ref())
                .map_or(0, |m| m.epoch),
            Node::Client(id) => self
                .clients
                .get(&id)
                .and_then(|c| c.map.as_ref())
                .map_or(0, |m| m.epoch),
        }
    }

    fn send(&mut self, from: Node, to: Node, msg: &Msg) {
        self.send_rid(from, to, 0, msg);
    }

    fn send_rid(&mut self, from: Node, to: Node, request_id: u64, msg: &Msg) {
        let (kind, payload) = (msg.kind(), msg.encode());
        let epoch = self.epoch_of(from);
        for delay in self.net.route(&mut self.rng, from, to) {
            self.queue.push(
                self.now_ms + delay,
                Ev::Deliver {
                    from,
                    to,
                    epoch,
                    request_id,
                    kind,
                    payload: payload.clone(),
                },
            );
        }
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver {
                from,
                to,
                epoch,
                request_id,
                kind,
                payload,
            } => {
                self.trace.u64(from.code());
                self.trace.u64(epoch);
                self.trace.u64(request_id);
                self.trace.u64(to.code());
                self.trace.u64(kind as u64);
                self.trace.bytes(&payload);
                let msg = match Msg::decode(kind, &payload) {
                    Ok(m) => m,
                    Err(e) => {
                        return self.fail(format!("{from:?} sent an undecodable {kind}: {e}"))
                    }
                };
                match to {
                    Node::Mon => self.mon_receive(from, epoch, request_id, msg),
                    Node::Osd(id) => self.osd_receive(id, msg),
                    Node::Client(id) => self.client_receive(id, request_id, msg),
                }
            }
            Ev::MonTick => {
                self.trace.u64(1);
                self.mon_tick();
                self.queue.push(self.now_ms + MON_TICK_MS, Ev::MonTick);
            }
            Ev::MonRestart => {
                self.trace.u64(2);
                if self.mon.node.is_none() {
                    self.mon_restart();
                }
            }
            Ev::OsdTimer { osd, incarnation } => {
                self.trace.u64(3);
                self.osd_timer(osd, incarnation);
            }
            Ev::OsdRestart { osd, by_fault } => {
                self.trace.u64(4);
                if !(by_fault && self.faults_over) {
                    self.osd_start(osd);
                }
            }
            Ev::ClientPoll(id) => {
                self.trace.u64(5);
                let have = self.clients[&id].map.as_ref().map_or(0, |m| m.epoch);
                self.send(
                    Node::Client(id),
                    Node::Mon,
                    &Msg::GetMap {
                        have_epoch: have,
                        subscribe: false,
                    },
                );
                self.queue
                    .push(self.now_ms + CLIENT_POLL_MS, Ev::ClientPoll(id));
            }
            Ev::Fault => {
                self.trace.u64(6);
                if !self.faults_over {
                    self.inject_fault();
                }
            }
            Ev::Heal(h) => {
                self.trace.u64(7);
                match h {
                    Heal::Partition(a, b) => self.net.heal(a, b),
                    Heal::Network => self.net.config = NetConfig::default(),
                }
            }
            Ev::EndOfFaults => {
                self.trace.u64(8);
                self.end_faults();
            }
            Ev::Check => {
                self.trace.u64(9);
                self.check_converged();
            }
        }
    }

    // ---- the monitor's shell (what `spindle_mon::Monitor` does with a `Handled`) ----

    /// Publishes what the node committed, then answers the requester.
    fn mon_apply(&mut self, to: Option<(Node, u64)>, h: Handled) {
        for f in &h.failed {
            self.fail(format!("the monitor could not save a map: {f}"));
        }
        for c in h.committed {
            self.log(|| format!("mon: commit epoch {} ({})", c.epoch, c.reason));
            let newest = self.published.keys().next_back().copied().unwrap_or(0);
            if c.epoch != newest + 1 {
                self.fail(format!(
                    "the monitor committed epoch {} after epoch {newest}",
                    c.epoch
                ));
            }
            let bytes = c.bytes.to_vec();
            if let Some(prev) = self.published.insert(c.epoch, bytes.clone()) {
                if prev != bytes {
                    self.fail(format!(
                        "epoch {} was published twice with different maps",
                        c.epoch
                    ));
                }
            }
            let subscribers: Vec<Node> = self.mon.subscribers.iter().copied().collect();
            for s in subscribers {
                self.send(Node::Mon, s, &Msg::MapUpdate { map: bytes.clone() });
            }
        }
        let Some((from, request_id)) = to else {
            return;
        };
        match h.reply {
            // Nothing here sends the monitor a request it must refuse.
            Some(Msg::Error { message, .. }) => self.fail(format!(
                "the monitor refused a request of {from:?}: {message}"
            )),
            Some(reply) => self.send_rid(Node::Mon, from, request_id, &reply),
            None => {}
        }
        if let Some(have) = h.subscribe {
            self.mon.subscribers.insert(from);
            if let Some(node) = self.mon.node.as_ref() {
                if have < node.epoch() {
                    let map = node.map_bytes();
                    self.send(Node::Mon, from, &Msg::MapUpdate { map });
                }
            }
        }
    }

    fn mon_receive(&mut self, from: Node, epoch: u64, request_id: u64, msg: Msg) {
        let now = self.now_ms;
        let Some(node) = self.mon.node.as_mut() else {
            return; // down: the message is lost with the connection
        };
        let h = node.on_request(now, epoch, msg);
        self.mon_apply(Some((from, request_id)), h);
    }

    fn mon_tick(&mut self) {
        let now = self.now_ms;
        let Some(node) = self.mon.node.as_mut() else {
            return;
        };
        let h = node.on_tick(now);
        self.mon_apply(None, h);
    }

    fn mon_restart(&mut self) {
        self.log(|| "mon: restart".into());
        let saved = match spindle_mon::MapStore::load(&self.mon.store) {
            Ok(Some(map)) => map,
            other => return self.fail(format!("the monitor's store lost its map: {other:?}")),
        };
        let core = MonCore::new(saved, self.cfg.timing, self.now_ms);
        let newest = self.published.keys().next_back().copied().unwrap_or(0);
        if core.epoch() < newest {
            self.fail(format!(
                "the monitor restarted at epoch {} but epoch {newest} had been published",
                core.epoch()
            ));
        }
        self.mon.node = Some(MonNode::new(core, Box::new(self.mon.store.clone())));
    }

    // ---- storage daemons' monitor sessions (model of `Osd::mon_loop`) ----

    fn osd_start(&mut self, id: u32) {
        let now = self.now_ms;
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        o.alive = true;
        o.incarnation += 1;
        o.pid += 100;
        o.map = None;
        let incarnation = o.incarnation;
        let (session, actions) = DaemonSession::start(session_timing(), now);
        o.session = session;
        self.osd_act(id, actions);
        self.queue.push(
            now + HEARTBEAT_MS,
            Ev::OsdTimer {
                osd: id,
                incarnation,
            },
        );
    }

    /// Executes the session core's actions as `Osd::mon_loop` does, over the simulated
    /// network.
    fn osd_act(&mut self, id: u32, actions: Vec<SessionAction>) {
        for action in actions {
            let msg = match action {
                SessionAction::Boot => {
                    let Some(o) = self.osds.get(&id) else {
                        return;
                    };
                    let pid = o.pid;
                    self.log(|| format!("osd.{id}: boot (pid {pid})"));
                    Msg::OsdBoot {
                        osd_id: id,
                        addr: format!("10.0.0.{id}:6800"),
                        pid,
                    }
                }
                SessionAction::Subscribe { have_epoch } => Msg::GetMap {
                    have_epoch,
                    subscribe: true,
                },
                SessionAction::Heartbeat => Msg::Heartbeat {
                    osd_id: id,
                    reports: Vec::new(),
                    counters: Vec::new(),
                    metrics_addr: String::new(),
                },
                SessionAction::FetchMap { have_epoch } => Msg::GetMap {
                    have_epoch,
                    subscribe: false,
                },
            };
            self.send(Node::Osd(id), Node::Mon, &msg);
        }
    }

    fn osd_receive(&mut self, id: u32, msg: Msg) {
        let now = self.now_ms;
        let Some(o) = self.osds.get(&id) else {
            return;
        };
        if !o.alive {
            return;
        }
        let actions = match msg {
            Msg::MapUpdate { map } => {
                // The boot's answer is the map that marks the daemon up (the simulated
                // network has no request ids for daemons: any map while not active
                // answers the boot, as a late reply to an abandoned boot does for real).
                let booting = !matches!(o.session.state(), SessionState::Active { .. });
                self.install(Node::Osd(id), &map);
                let Some(o) = self.osds.get_mut(&id) else {
                    return;
                };
                let have = o.map.as_ref().map_or(0, |m| m.epoch);
                if booting {
                    o.session.on_boot_answered(now, have)
                } else {
                    Vec::new()
                }
            }
            Msg::HeartbeatAck { epoch } => {
                let have = o.map.as_ref().map_or(0, |m| m.epoch);
                let Some(o) = self.osds.get_mut(&id) else {
                    return;
                };
                o.session.on_heartbeat_answered(now, epoch, have)
            }
            other => {
                self.fail(format!("osd.{id} got an unexpected {}", other.name()));
                return;
            }
        };
        self.osd_act(id, actions);
    }

    fn osd_timer(&mut self, id: u32, incarnation: u64) {
        let now = self.now_ms;
        let Some(o) = self.osds.get_mut(&id) else {
            return;
        };
        if !o.alive || o.incarnation != incarnation {
            return;
        }
        let marked_down = o
            .map
            .as_ref()
            .and_then(|m| m.osds.get(&id))
            .is_some_and(|i| !i.up);
        let actions = o.session.on_tick(now, marked_down);
        self.osd_act(id, actions);
        self.queue.push(
            now + HEARTBEAT_MS,
            Ev::OsdTimer {
                osd: id,
                incarnation,
            },
        );
    }

    // ---- clients ----

    fn client_receive(&mut self, id: u32, request_id: u64, msg: Msg) {
        match msg {
            Msg::MapUpdate { map } => self.install(Node::Client(id), &map),
            // The answer to a poll when the client's map is current (`MapReply::Current`).
            Msg::Ok => {}
            Msg::CommandReply { ok, output } => {
                // A duplicated reply finds its command already answered.
                let Some(cmd) = self.commands.remove(&request_id) else {
                    return;
                };
                if let Some(fate) = self.pools.get_mut(&cmd.pool) {
                    match (cmd.kind, ok) {
                        (CmdKind::Create, true) => fate.create_acked = true,
                        (CmdKind::Remove, true) => fate.remove_acked = true,
                        _ => {}
                    }
                }
                // Refusals are fine (a duplicate create finds the pool); anything else
                // that fails must say why.
                if !ok && output.is_empty() {
                    self.fail(format!("client.{id}: a command failed without a reason"));
                }
            }
            other => self.fail(format!("client.{id} got an unexpected {}", other.name())),
        }
    }

    /// A daemon or client installs a map it received: only newer epochs; every epoch must
    /// be exactly the map the monitor published for it.
    fn install(&mut self, who: Node, bytes: &[u8]) {
        let map = match ClusterMap::decode(bytes) {
            Ok(m) => m,
            Err(e) => return self.fail(format!("{who:?} got a map that does not decode: {e}")),
        };
        match self.published.get(&map.epoch) {
            Some(p) if p.as_slice() == bytes => {}
            Some(_) => {
                return self.fail(format!(
                    "{who:?} got a different map for epoch {}",
                    map.epoch
                ))
            }
            None => {
                return self.fail(format!(
                    "{who:?} got epoch {} that was never published",
                    map.epoch
                ))
            }
        }
        let slot = match who {
            Node::Osd(id) => self.osds.get_mut(&id).map(|o| &mut o.map),
            Node::Client(id) => self.clients.get_mut(&id).map(|c| &mut c.map),
            Node::Mon => None,
        };
        if let Some(slot) = slot {
            if slot.as_ref().is_none_or(|m| m.epoch < map.epoch) {
                *slot = Some(map);
            }
        }
    }

    // ---- faults ----

    fn inject_fault(&mut self) {
        self.faults_injected += 1;
        let daemons = self.cfg.daemons.max(1) as u64;
        let kind = self.rng.below(8);
        self.log(|| format!("fault kind {kind}"));
        match kind {
            0 | 1 => {
                // Crash a daemon; it restarts (new process) after up to 40 s.
                let id = self.rng.below(daemons) as u32;
                if let Some(o) = self.osds.get_mut(&id) {
                    if o.alive {
                        o.alive = false;
                        if self.cfg.verbose {
                            eprintln!("{:>9} ms  crash osd.{id}", self.now_ms);
                        }
                        o.map = None;
                        self.mon.subscribers.remove(&Node::Osd(id));
                        let back = self.rng.range(500, 40_000);
                        self.queue.push(
                            self.now_ms + back,
                            Ev::OsdRestart {
                                osd: id,
                                by_fault: true,
                            },
                        );
                    }
                }
            }
            2 => {
                // Crash the monitor; it restarts from its saved map.
                if self.mon.node.take().is_some() {
                    self.mon.subscribers.clear();
                    let back = self.rng.range(200, 5_000);
                    self.queue.push(self.now_ms + back, Ev::MonRestart);
                }
            }
            3 => {
                // Cut a daemon off from the monitor.
                let id = self.rng.below(daemons) as u32;
                self.net.partition(Node::Osd(id), Node::Mon);
                self.log(|| format!("partition osd.{id} from mon"));
                let heal = self.rng.range(1_000, 20_000);
                self.queue.push(
                    self.now_ms + heal,
                    Ev::Heal(Heal::Partition(Node::Osd(id), Node::Mon)),
                );
            }
            4 => {
                // A lossy, duplicating, slow network for a while.
                self.net.config = NetConfig {
                    delay_ms_min: 1,
                    delay_ms_max: self.rng.range(20, 800),
                    loss_ppm: self.rng.range(0, 300_000) as u32,
                    duplicate_ppm: self.rng.range(0, 200_000) as u32,
                };
                let heal = self.rng.range(1_000, 10_000);
                self.queue.push(self.now_ms + heal, Ev::Heal(Heal::Network));
            }
            6 | 7 => self.admin_command(),
            _ => {
                // Cut a client off from the monitor.
                if self.cfg.clients > 0 {
                    let id = self.rng.below(self.cfg.clients as u64) as u32;
                    self.net.partition(Node::Client(id), Node::Mon);
                    let heal = self.rng.range(1_000, 20_000);
                    self.queue.push(
                        self.now_ms + heal,
                        Ev::Heal(Heal::Partition(Node::Client(id), Node::Mon)),
                    );
                }
            }
        }
    }

    /// A client sends an administrative command (map changes while everything else goes
    /// on): create a pool, remove one created earlier, take a daemon out or put it in.
    fn admin_command(&mut self) {
        if self.cfg.clients == 0 {
            return;
        }
        let client = self.rng.below(self.cfg.clients as u64) as u32;
        let (kind, pool, cmd) = match self.rng.below(4) {
            0 | 1 => {
                let name = format!("sim{}", self.pools.len());
                self.pools.insert(name.clone(), PoolFate::default());
                let cmd = AdminCommand::PoolCreate {
                    name: name.clone(),
                    size: 3.min(self.cfg.daemons),
                    min_size: 1,
                    pg_count: 8,
                };
                (CmdKind::Create, name, cmd)
            }
            2 => {
                let created: Vec<String> = self
                    .pools
                    .iter()
                    .filter(|(_, f)| !f.remove_sent)
                    .map(|(n, _)| n.clone())
                    .collect();
                if created.is_empty() {
                    return;
                }
                let name = created[self.rng.below(created.len() as u64) as usize].clone();
                if let Some(f) = self.pools.get_mut(&name) {
                    f.remove_sent = true;
                }
                let cmd = AdminCommand::PoolRm { name: name.clone() };
                (CmdKind::Remove, name, cmd)
            }
            _ => {
                let id = self.rng.below(self.cfg.daemons.max(1) as u64) as u32;
                let verb = if self.rng.below(2) == 0 {
                    OsdVerb::Out
                } else {
                    OsdVerb::In
                };
                (
                    CmdKind::Other,
                    String::new(),
                    AdminCommand::Osd { verb, id },
                )
            }
        };
        let args = cmd.to_args();
        self.log(|| format!("client.{client}: {}", args.join(" ")));
        let rid = self.next_request_id;
        self.next_request_id += 1;
        self.commands.insert(rid, Command { kind, pool });
        self.send_rid(Node::Client(client), Node::Mon, rid, &Msg::Command { args });
    }

    /// Faults stop: partitions heal, the network is clean, crashed processes restart.
    fn end_faults(&mut self) {
        self.faults_over = true;
        self.net.heal_all();
        self.net.config = NetConfig::default();
        if self.mon.node.is_none() {
            self.queue.push(self.now_ms + 1, Ev::MonRestart);
        }
        let down: Vec<u32> = self
            .osds
            .iter()
            .filter(|(_, o)| !o.alive)
            .map(|(id, _)| *id)
            .collect();
        for id in down {
            // Restarts the crash faults scheduled for later are dropped.
            self.queue.push(
                self.now_ms + 1,
                Ev::OsdRestart {
                    osd: id,
                    by_fault: false,
                },
            );
        }
    }

    /// After the faults stopped and `settle_ms` passed: the monitor is up, every daemon is
    /// up in its map, and every daemon and client has its current map.
    fn check_converged(&mut self) {
        let Some(node) = self.mon.node.as_ref() else {
            return self.fail("the monitor is not running after the faults stopped".into());
        };
        let map = node.core().map().clone();
        for (id, o) in &self.osds {
            if !map.osds.get(id).is_some_and(|i| i.up) {
                self.failures.push(format!(
                    "t={} ms: osd.{id} is alive but not up in the monitor's map (epoch {})",
                    self.now_ms, map.epoch
                ));
            }
            if o.map.as_ref().map(|m| m.epoch) != Some(map.epoch) {
                self.failures.push(format!(
                    "t={} ms: osd.{id} has epoch {:?}, the monitor {}",
                    self.now_ms,
                    o.map.as_ref().map(|m| m.epoch),
                    map.epoch
                ));
            }
        }
        for (name, fate) in &self.pools {
            let exists = map.pools.values().any(|p| &p.name == name);
            if fate.create_acked && !fate.remove_sent && !exists {
                self.failures.push(format!(
                    "t={} ms: pool {name} was created (acknowledged) and never removed, but \
                     the monitor's map (epoch {}) does not have it",
                    self.now_ms, map.epoch
                ));
            }
            if fate.remove_acked && exists {
                self.failures.push(format!(
                    "t={} ms: pool {name} was removed (acknowledged) but is in the map",
                    self.now_ms
                ));
            }
        }
        for (id, c) in &self.clients {
            if c.map.as_ref().map(|m| m.epoch) != Some(map.epoch) {
                self.failures.push(format!(
                    "t={} ms: client.{id} has epoch {:?}, the monitor {}",
                    self.now_ms,
                    c.map.as_ref().map(|m| m.epoch),
                    map.epoch
                ));
            }
        }
    }
}
