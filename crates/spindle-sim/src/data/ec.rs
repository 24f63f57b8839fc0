//! Erasure-coded pools in the data simulator (`spindle sim --data --ec`).
//!
//! A child module of `data`: it extends [`DataWorld`] with the erasure-coded write, read
//! and recovery paths of the daemon (`crates/spindle-osd/src/ec.rs`), over the same real
//! stores, network, faults and clients. What is real: every shard is a slot object in the
//! daemon's real `spindle_store::Store` under the shard's stored group id
//! (`shard_pg(g, Some(pos))`, bytes + the real 16-byte trailer of `spindle_map::ec`);
//! coding is the real Reed-Solomon of `spindle_map::ec::EcLayout` (`spindle_ec`); slot
//! names and the recovery decision are `spindle_pg::ec` (`slot_name`, `split_slot`,
//! `decide_slot`). What is a model (as the daemon does it, shorter):
//! - writes: the primary picks the slot not holding the current version, assigns the
//!   group's next version, sends every up shard its segment; acknowledged when every up
//!   shard is durable and at least `min_size` shards are up; then the old slot is deleted
//!   everywhere (trim, a replicated delete with its own version); a failed shard write
//!   re-peers the group. One operation per object at a time (the daemon's object lock:
//!   here a second operation gets "busy" and the client retries). The client sends the
//!   object's bytes and the primary encodes (the daemon's client encodes); partial writes
//!   and truncates are sent as whole-object writes of the resulting bytes.
//! - deletes: old slot, then current slot, each replicated with its own version.
//! - reads: the primary's own copy names the current slot and version; it pulls that slot
//!   from every up shard and decodes from the first k at that version.
//! - peering: the primary lists every member's shard copy (slot names, versions, whether
//!   the copy existed before: `rules::established`); every slot whose listings differ is
//!   recovered, one at a time: pull every member's state of it (a pull without an answer,
//!   or with an invalid trailer, is `Unknown`), `decide_slot`, then rebuild and push
//!   (`recover_object`), roll back (delete everywhere), or wait and pull again. The group
//!   serves clients once every slot is settled (the daemon serves at once and recovers
//!   an object before an operation on it: the same for the checked histories).
//! - no strays: this simulator never marks a daemon out, so positions do not move (a
//!   down daemon is a hole, its position kept).
//!
//! Shard requests travel on the ordered per-pair stream and go through the copy's store
//! queue (pulls and listings too: they answer after the writes queued before them).

use super::*;
use spindle_map::ec::{parse_trailer, trailer, EcLayout, TRAILER_BYTES};
use spindle_map::{shard_pg, PoolKind};
use spindle_pg::ec::{decide_slot, slot_name, split_slot, ShardAnswer, SlotDecision, SlotView};

/// The erasure-coded pool of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcShape {
    pub k: u32,
    pub m: u32,
    /// None: the default of `spindle pool create --erasure` (k + 1, at most k + m).
    pub min_size: Option<u32>,
}

impl Default for EcShape {
    fn default() -> EcShape {
        EcShape {
            k: 2,
            m: 1,
            min_size: None,
        }
    }
}

impl EcShape {
    pub fn min_size(&self) -> u32 {
        self.min_size.unwrap_or((self.k + 1).min(self.k + self.m))
    }
}

const STRIPE_UNIT: u32 = 4096;

/// A shard copy's state of a slot object: bytes with trailer, and version.
type Shard = Option<(Vec<u8>, Ver)>;

/// Requests of an erasure-coded primary to a shard copy.
#[derive(Clone, Debug)]
pub(super) enum EcReq {
    /// Write (`Some`: whole slot bytes with trailer) or delete (`None`) a slot.
    Write {
        pg: u32,
        name: String,
        version: Ver,
        data: Option<Vec<u8>>,
    },
    List {
        pg: u32,
    },
    Pull {
        pg: u32,
        name: String,
    },
    Push {
        pg: u32,
        name: String,
        state: Shard,
    },
}

#[derive(Clone, Debug)]
pub(super) enum EcAns {
    Done,
    /// Slot objects (name, version) and whether the copy existed before (it has a version).
    Listing(Vec<(String, Ver)>, Ver),
    State(Shard),
}

#[derive(Clone, Debug)]
pub(super) enum EcMsg {
    Req {
        epoch: u64,
        tag: u64,
        req: EcReq,
    },
    Reply {
        tag: u64,
        result: Result<EcAns, String>,
    },
}

impl EcMsg {
    pub(super) fn code(&self) -> u64 {
        match self {
            EcMsg::Req { .. } => 1,
            EcMsg::Reply { .. } => 2,
        }
    }
}

#[derive(Debug)]
pub(super) enum EcEv {
    Timeout {
        osd: u32,
        inc: u64,
        tag: u64,
    },
    Retry {
        osd: u32,
        inc: u64,
        pg: u32,
        gen: u64,
    },
}

/// A store transaction of a shard copy (queued like every other).
#[derive(Debug)]
pub(super) struct EcTxn {
    pgid: PgId,
    req: EcReq,
}

#[derive(Debug)]
pub(super) struct EcThen {
    to: u32,
    tag: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Peering,
    Recovering,
    Active,
}

/// What a primary's outstanding request is for.
#[derive(Clone, Debug)]
enum Pend {
    List,
    Pull,
    Push,
    OpWrite { op: u64 },
    OpRead { op: u64 },
}

struct Pending {
    pg: u32,
    gen: u64,
    pos: usize,
    osd: u32,
    what: Pend,
}

/// One slot being recovered.
struct SlotJob {
    name: String,
    /// Per position: None = not answered yet; Some(Err) = the pull failed.
    answers: Vec<Option<Result<Shard, String>>>,
    pulls_left: usize,
    pushes_left: usize,
}

/// One step of a client operation: replicate a slot write or delete.
struct Step {
    slot: String,
    /// Per position: the slot bytes (with trailer); None: delete.
    data: Option<Vec<Vec<u8>>>,
}

/// A read: the version read, the shard segments at that version per position, and how
/// many answers are still awaited.
type ReadState = (Ver, Vec<Option<Vec<u8>>>, usize);

struct EcOp {
    client: u32,
    op: u64,
    attempt: u32,
    name: String,
    /// Replication steps left (writes, deletes, trims).
    steps: VecDeque<Step>,
    /// The client is answered once this many steps are done.
    ack_after: usize,
    done_steps: usize,
    /// The slot and version of the step in flight.
    step: Option<(String, Ver)>,
    replied: bool,
    result: State,
    waiting: BTreeSet<usize>,
    /// Reads: the version read and the shards at that version.
    read: Option<ReadState>,
}

/// The positions that have a daemon: (position, daemon).
fn members(shards: &[Option<u32>]) -> Vec<(usize, u32)> {
    shards
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.map(|o| (i, o)))
        .collect()
}

struct EcPrimary {
    ident: Vec<Option<(u32, u64)>>,
    epoch: u64,
    shards: Vec<Option<u32>>,
    gen: u64,
    phase: Phase,
    last: Ver,
    lists: BTreeMap<usize, Vec<(String, Ver)>>,
    established: Vec<u32>,
    todo: VecDeque<String>,
    job: Option<SlotJob>,
    busy: BTreeSet<String>,
    ops: BTreeMap<u64, EcOp>,
    next_op: u64,
    /// Slots whose write failed in this interval: recovered at the next peering whatever
    /// the listings say (the daemon's `PgState::unsettled`: a copy may apply the write
    /// after it answered the listing, and the next write of the object must not go out
    /// before the failed version is settled).
    unsettled: BTreeSet<String>,
}

#[derive(Default)]
struct EcDaemon {
    primaries: BTreeMap<u32, EcPrimary>,
    pending: BTreeMap<u64, Pending>,
    next_tag: u64,
    /// Round numbers, unique across this daemon's primaries (a late answer to a round of
    /// a previous interval's primary matches nothing).
    next_gen: u64,
}

/// The erasure-coded part of a world.
pub(super) struct EcState {
    pub(super) pool: u32,
    shape: EcShape,
    layout: EcLayout,
    daemons: BTreeMap<u32, EcDaemon>,
    /// Per object: the slot and version of its last acknowledged write (none after an
    /// acknowledged delete), as its primary answered the client.
    acked: BTreeMap<String, (String, Ver)>,
}

/// Adds the erasure-coded pool to the first map (before placement is computed).
pub(super) fn add_pool(
    cfg: &DataConfig,
    map: &mut ClusterMap,
) -> Result<Option<Box<EcState>>, DataError> {
    let Some(shape) = cfg.ec else {
        return Ok(None);
    };
    if shape.k == 0 || shape.m == 0 || shape.k + shape.m > cfg.daemons {
        return Err(DataError::Config(format!(
            "erasure code k={} m={} needs k, m >= 1 and k + m <= {} daemons",
            shape.k, shape.m, cfg.daemons
        )));
    }
    let min_size = shape.min_size();
    if min_size < shape.k || min_size > shape.k + shape.m {
        return Err(DataError::Config(format!(
            "min_size {min_size} outside k..=k+m"
        )));
    }
    let kind = PoolKind::Erasure {
        k: shape.k,
        m: shape.m,
        min_size,
        matrix: 0,
        stripe_unit_bytes: STRIPE_UNIT,
    };
    let pool = map
        .add_pool(
            "ec",
            kind,
            cfg.pgs.next_power_of_two(),
            spindle_map::EMBEDDED_ERASURE_RULE,
        )
        .map_err(|e| DataError::Map(e.to_string()))?;
    let layout = map
        .pools
        .get(&pool)
        .and_then(EcLayout::for_pool)
        .ok_or_else(|| DataError::Map("the erasure-coded pool has no layout".into()))?
        .map_err(|e| DataError::Map(e.to_string()))?;
    Ok(Some(Box::new(EcState {
        pool,
        shape,
        layout,
        daemons: BTreeMap::new(),
        acked: BTreeMap::new(),
    })))
}

/// The store side of a shard transaction (listings and pulls are read after it, when the
/// transactions queued before them are applied).
pub(super) fn store_txn(store: &Store, t: &EcTxn) -> Result<(), String> {
    match &t.req {
        EcReq::Write {
            name,
            version,
            data,
            ..
        } => {
            let m = match data {
                Some(d) => Mutation::WriteFull(d.clone()),
                None => Mutation::Delete,
            };
            store
                .apply(t.pgid, name, *version, m)
                .wait()
                .map_err(|e| e.to_string())
        }
        EcReq::Push { name, state, .. } => store
            .recover_object(t.pgid, name, state.clone())
            .wait()
            .map_err(|e| e.to_string()),
        EcReq::List { .. } | EcReq::Pull { .. } => Ok(()),
    }
}

/// A slot's state in a copy (None: absent).
fn read_slot(store: &Store, pgid: PgId, name: &str) -> Result<Shard, String> {
    let Some(meta) = store.stat(pgid, name) else {
        return Ok(None);
    };
    match at_once(store.read(pgid, name, 0, u64::MAX)) {
        Some(Ok(data)) => Ok(Some((data, meta.version))),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("read did not complete".into()),
    }
}

/// Splits a slot's bytes into (shard segment, object size) when its trailer is valid.
fn split_trailer(data: &[u8]) -> Option<(Vec<u8>, u64)> {
    let cut = data.len().checked_sub(TRAILER_BYTES as usize)?;
    let size = parse_trailer(&data[cut..])?;
    Some((data[..cut].to_vec(), size))
}

impl DataWorld {
    fn ecs(&self) -> &EcState {
        self.ec.as_deref().expect("erasure-coded run")
    }

    fn ecs_mut(&mut self) -> &mut EcState {
        self.ec.as_deref_mut().expect("erasure-coded run")
    }

    fn ec_primary(&mut self, id: u32, pg: u32) -> Option<&mut EcPrimary> {
        self.ec
            .as_deref_mut()?
            .daemons
            .get_mut(&id)?
            .primaries
            .get_mut(&pg)
    }

    /// The pool the clients' objects live in.
    pub(super) fn client_pool(&self) -> u32 {
        self.ec.as_deref().map_or(self.pool, |e| e.pool)
    }

    fn ec_pgid(&self, pg: u32, pos: usize) -> PgId {
        PgId {
            pool: self.ecs().pool,
            pg: shard_pg(pg, Some(pos as u8)),
        }
    }

    /// Erasure-coded runs write whole objects: the bytes a partial write or truncate
    /// leaves (the daemon's client reads, patches and re-encodes the touched stripes).
    pub(super) fn ec_shape_op(&self, what: ClientOp, last: &State) -> ClientOp {
        match what {
            ClientOp::Write(m) if self.ec.is_some() && !matches!(m, Mutation::Delete) => {
                ClientOp::Write(Mutation::WriteFull(
                    m.apply_to(last.as_deref()).unwrap_or_default(),
                ))
            }
            other => other,
        }
    }

    pub(super) fn ec_restart(&mut self, osd: u32) {
        if let Some(e) = self.ec.as_deref_mut() {
            e.daemons.remove(&osd);
        }
    }

    pub(super) fn ec_event(&mut self, ev: EcEv) {
        match ev {
            EcEv::Timeout { osd, inc, tag } => {
                if !self.live(osd, inc) {
                    return;
                }
                let Some(copy) = self
                    .ecs()
                    .daemons
                    .get(&osd)
                    .and_then(|d| d.pending.get(&tag))
                    .map(|p| p.osd)
                else {
                    return;
                };
                // Reconnect: the stream to that copy starts over.
                if let Some(d) = self.daemons.get_mut(&osd) {
                    d.out_streams.remove(&copy);
                }
                self.ec_answer(osd, tag, Err("timed out".into()));
            }
            EcEv::Retry { osd, inc, pg, gen } => {
                if !self.live(osd, inc) {
                    return;
                }
                let Some(p) = self.ec_primary(osd, pg) else {
                    return;
                };
                if p.gen != gen {
                    return;
                }
                match p.phase {
                    Phase::Peering => self.ec_peer(osd, pg),
                    Phase::Recovering => self.ec_pull_slot(osd, pg),
                    Phase::Active => {}
                }
            }
        }
    }

    // ---- the copy side ----

    pub(super) fn ec_receive(&mut self, id: u32, from: Node, msg: EcMsg) {
        let Node::Osd(src) = from else { return };
        match msg {
            EcMsg::Req { epoch, tag, req } => self.ec_copy_request(id, src, epoch, tag, req),
            EcMsg::Reply { tag, result } => self.ec_answer(id, tag, result),
        }
    }

    fn ec_copy_request(&mut self, id: u32, from: u32, epoch: u64, tag: u64, req: EcReq) {
        let mine = self.daemons[&id].epoch;
        let refuse = if epoch < mine {
            Some(format!("stale epoch {epoch}, mine is {mine}"))
        } else if epoch > mine {
            self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
            Some(format!("need map {epoch}, mine is {mine}"))
        } else {
            None
        };
        if let Some(e) = refuse {
            self.ec_reply(id, from, tag, Err(e));
            return;
        }
        let pg = match &req {
            EcReq::Write { pg, .. }
            | EcReq::List { pg }
            | EcReq::Pull { pg, .. }
            | EcReq::Push { pg, .. } => *pg,
        };
        let pgid = PgId {
            pool: self.ecs().pool,
            pg,
        };
        self.enqueue(
            id,
            Txn {
                pg,
                kind: TxnKind::Ec(EcTxn { pgid, req }),
                then: Then::Ec(EcThen { to: from, tag }),
            },
        );
    }

    /// A shard transaction was applied (or failed): answer the primary.
    pub(super) fn ec_txn_done(
        &mut self,
        id: u32,
        then: EcThen,
        kind: TxnKind,
        result: Result<(), String>,
    ) {
        let TxnKind::Ec(t) = kind else { return };
        let result = result.and_then(|()| {
            let store = self.daemons[&id].store.as_ref().ok_or("no store")?;
            Ok(match &t.req {
                EcReq::Write { .. } | EcReq::Push { .. } => EcAns::Done,
                EcReq::List { .. } => {
                    let l = store
                        .list(t.pgid)
                        .into_iter()
                        .filter(|(n, _)| split_slot(n).is_some())
                        .map(|(n, m)| (n, m.version))
                        .collect();
                    EcAns::Listing(l, store.pg_info(t.pgid).last_version)
                }
                EcReq::Pull { name, .. } => EcAns::State(read_slot(store, t.pgid, name)?),
            })
        });
        self.ec_reply(id, then.to, then.tag, result);
    }

    fn ec_reply(&mut self, id: u32, to: u32, tag: u64, result: Result<EcAns, String>) {
        if to == id {
            self.ec_answer(id, tag, result);
        } else {
            self.send(
                Node::Osd(id),
                Node::Osd(to),
                DMsg::Ec(EcMsg::Reply { tag, result }),
            );
        }
    }

    // ---- the primary side ----

    /// The daemon learned of epoch `e`: new intervals of the erasure-coded groups.
    pub(super) fn ec_new_epoch(&mut self, id: u32, e: u64) {
        if self.ec.is_none() {
            return;
        }
        let m = self.map_at(e);
        let (map, placement) = (&m.0, &m.1);
        let pool = self.ecs().pool;
        for pg in 0..self.cfg.pgs.next_power_of_two() {
            let Some(mapping) = placement.pg(pool, pg) else {
                continue;
            };
            let shards = mapping.shards.clone();
            let ident: Vec<Option<(u32, u64)>> = shards
                .iter()
                .map(|s| s.map(|o| (o, map.osds.get(&o).map_or(0, |i| i.up_from))))
                .collect();
            let primary = mapping.primary() == Some(id);
            let ed = self.ecs_mut().daemons.entry(id).or_default();
            let same = ed.primaries.get(&pg).is_some_and(|p| p.ident == ident);
            if primary && same {
                if let Some(p) = ed.primaries.get_mut(&pg) {
                    p.epoch = e;
                }
                continue;
            }
            let old = ed.primaries.remove(&pg);
            if let Some(mut old) = old {
                self.ec_fail_ops(id, &mut old, "interval changed");
            }
            if primary {
                let p = EcPrimary {
                    ident,
                    epoch: e,
                    shards,
                    gen: 0,
                    phase: Phase::Peering,
                    last: Ver { epoch: e, seq: 0 },
                    lists: BTreeMap::new(),
                    established: Vec::new(),
                    todo: VecDeque::new(),
                    job: None,
                    busy: BTreeSet::new(),
                    ops: BTreeMap::new(),
                    next_op: 1,
                    unsettled: BTreeSet::new(),
                };
                self.ecs_mut()
                    .daemons
                    .entry(id)
                    .or_default()
                    .primaries
                    .insert(pg, p);
                self.log(|| format!("osd.{id}: ec pg {pg}: new interval at epoch {e}"));
                self.ec_peer(id, pg);
            }
        }
    }

    /// Answers every client operation of `p` with an error (the client retries).
    fn ec_fail_ops(&mut self, id: u32, p: &mut EcPrimary, why: &str) {
        let ops = std::mem::take(&mut p.ops);
        p.busy.clear();
        for (_, o) in ops {
            if !o.replied {
                self.ec_send_client(id, o.client, o.op, o.attempt, Err(why.to_string()));
            }
        }
    }

    /// Starts (or restarts) peering: list every member's shard copy.
    fn ec_peer(&mut self, id: u32, pg: u32) {
        self.report.peerings += 1;
        let gen = self.ec_next_gen(id);
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        p.gen = gen;
        p.phase = Phase::Peering;
        p.lists.clear();
        p.todo.clear();
        p.job = None;
        p.established.clear();
        let members = members(&p.shards);
        let ops = std::mem::take(&mut p.ops);
        p.busy.clear();
        for (_, o) in ops {
            if !o.replied {
                self.ec_send_client(id, o.client, o.op, o.attempt, Err("re-peering".into()));
            }
        }
        // Fewer than k shards up: the group neither peers nor serves (the daemon's
        // `rules::serve_floor`) until its membership changes.
        if members.len() < self.ecs().shape.k as usize {
            self.log(|| format!("osd.{id}: ec pg {pg}: fewer than k shards up, inactive"));
            return;
        }
        for (pos, osd) in members {
            let pgid = self.ec_pgid(pg, pos);
            self.ec_request(id, pg, pos, osd, Pend::List, EcReq::List { pg: pgid.pg });
        }
    }

    fn ec_send_client(
        &mut self,
        id: u32,
        client: u32,
        op: u64,
        attempt: u32,
        result: Result<State, String>,
    ) {
        self.send(
            Node::Osd(id),
            Node::Client(client),
            DMsg::ObjReply {
                op,
                attempt,
                result,
            },
        );
    }

    /// Sends a request to the copy of position `pos` on `osd` (this daemon's own copy
    /// goes through its own queue the same way).
    fn ec_request(&mut self, id: u32, pg: u32, pos: usize, osd: u32, what: Pend, req: EcReq) {
        let (gen, epoch) = match self.ec_primary(id, pg) {
            Some(p) => (p.gen, p.epoch),
            None => return,
        };
        let timeout = if matches!(what, Pend::OpWrite { .. }) {
            REPLICA_TIMEOUT_MS
        } else {
            PEER_TIMEOUT_MS
        };
        let inc = self.daemons[&id].inc;
        let ed = self.ecs_mut().daemons.entry(id).or_default();
        ed.next_tag += 1;
        // Unique across restarts: a late answer to an earlier incarnation matches nothing.
        let tag = inc << 32 | ed.next_tag;
        ed.pending.insert(
            tag,
            Pending {
                pg,
                gen,
                pos,
                osd,
                what,
            },
        );
        self.at(timeout, Ev::Ec(EcEv::Timeout { osd: id, inc, tag }));
        if osd == id {
            self.ec_copy_request(id, id, epoch, tag, req);
        } else {
            self.send_stream(id, osd, DMsg::Ec(EcMsg::Req { epoch, tag, req }));
        }
    }

    /// An answer (or a failure) of a request this daemon sent as a primary.
    fn ec_answer(&mut self, id: u32, tag: u64, result: Result<EcAns, String>) {
        let Some(pend) = self
            .ec
            .as_deref_mut()
            .and_then(|e| e.daemons.get_mut(&id))
            .and_then(|d| d.pending.remove(&tag))
        else {
            return;
        };
        let pg = pend.pg;
        let current = self.ec_primary(id, pg).is_some_and(|p| p.gen == pend.gen);
        if !current {
            return;
        }
        match pend.what {
            Pend::List => self.ec_listed(id, pg, pend.pos, result),
            Pend::Pull => self.ec_pulled(id, pg, pend.pos, result),
            Pend::Push => self.ec_pushed(id, pg, result),
            Pend::OpWrite { op } => self.ec_op_written(id, pg, op, pend.pos, result),
            Pend::OpRead { op } => self.ec_op_read(id, pg, op, pend.pos, result),
        }
    }

    fn ec_next_gen(&mut self, id: u32) -> u64 {
        let ed = self.ecs_mut().daemons.entry(id).or_default();
        ed.next_gen += 1;
        ed.next_gen
    }

    fn ec_retry_later(&mut self, id: u32, pg: u32) {
        let gen = self.ec_next_gen(id);
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        p.gen = gen;
        let inc = self.daemons[&id].inc;
        self.at(
            PEER_RETRY_MS,
            Ev::Ec(EcEv::Retry {
                osd: id,
                inc,
                pg,
                gen,
            }),
        );
    }

    fn ec_listed(&mut self, id: u32, pg: u32, pos: usize, result: Result<EcAns, String>) {
        let (list, last) = match result {
            Ok(EcAns::Listing(l, last)) => (l, last),
            other => {
                self.log(|| format!("osd.{id}: ec pg {pg}: listing shard {pos}: {other:?}"));
                // Peering needs every member: try again.
                if let Some(p) = self.ec_primary(id, pg) {
                    p.phase = Phase::Peering;
                }
                self.ec_retry_later(id, pg);
                return;
            }
        };
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        if let Some(Some(d)) = p.shards.get(pos).copied() {
            if last > Ver::default() {
                p.established.push(d);
            }
        }
        p.last = p.last.max(last);
        for (_, v) in &list {
            p.last = p.last.max(*v);
        }
        p.lists.insert(pos, list);
        let members = p.shards.iter().flatten().count();
        if p.lists.len() < members {
            return;
        }
        // Every slot some member lists differently is recovered.
        let mut all: BTreeMap<String, BTreeSet<(usize, Ver)>> = BTreeMap::new();
        for (pos, l) in &p.lists {
            for (n, v) in l {
                all.entry(n.clone()).or_default().insert((*pos, *v));
            }
        }
        let mut todo: VecDeque<String> = all
            .into_iter()
            .filter(|(_, have)| {
                have.len() < members
                    || have.iter().map(|(_, v)| v).collect::<BTreeSet<_>>().len() > 1
            })
            .map(|(n, _)| n)
            .collect();
        for slot in std::mem::take(&mut p.unsettled) {
            if !todo.contains(&slot) {
                todo.push_back(slot);
            }
        }
        let e = p.epoch;
        if p.last.epoch < e {
            p.last = Ver { epoch: e, seq: 0 };
        }
        p.todo = todo;
        p.phase = Phase::Recovering;
        let n = p.todo.len();
        self.log(|| format!("osd.{id}: ec pg {pg}: peered, {n} slots to recover"));
        self.ec_next_slot(id, pg);
    }

    /// Recovers the next slot, or activates the group.
    fn ec_next_slot(&mut self, id: u32, pg: u32) {
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        p.job = None;
        let Some(name) = p.todo.front().cloned() else {
            p.phase = Phase::Active;
            self.log(|| format!("osd.{id}: ec pg {pg}: active"));
            return;
        };
        let total = p.shards.len();
        p.job = Some(SlotJob {
            name,
            answers: vec![None; total],
            pulls_left: 0,
            pushes_left: 0,
        });
        self.ec_pull_slot(id, pg);
    }

    /// Pulls every member's state of the current slot.
    fn ec_pull_slot(&mut self, id: u32, pg: u32) {
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        let members = members(&p.shards);
        let Some(job) = p.job.as_mut() else {
            return;
        };
        let name = job.name.clone();
        job.answers.iter_mut().for_each(|a| *a = None);
        job.pulls_left = members.len();
        job.pushes_left = 0;
        for (pos, osd) in members {
            let pgid = self.ec_pgid(pg, pos);
            let req = EcReq::Pull {
                pg: pgid.pg,
                name: name.clone(),
            };
            self.ec_request(id, pg, pos, osd, Pend::Pull, req);
        }
    }

    fn ec_pulled(&mut self, id: u32, pg: u32, pos: usize, result: Result<EcAns, String>) {
        let Some(job) = self.ec_primary(id, pg).and_then(|p| p.job.as_mut()) else {
            return;
        };
        let a = match result {
            Ok(EcAns::State(s)) => Ok(s),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(e),
        };
        if job.answers[pos].is_none() {
            job.answers[pos] = Some(a);
            job.pulls_left = job.pulls_left.saturating_sub(1);
        }
        if job.pulls_left == 0 {
            self.ec_decide_slot(id, pg);
        }
    }

    /// Every member answered (or failed): the rule decides.
    fn ec_decide_slot(&mut self, id: u32, pg: u32) {
        let (k, total, min_size) = {
            let e = self.ecs();
            (e.shape.k as usize, e.layout.total(), e.shape.min_size())
        };
        let mutant = self.cfg.mutant == Mutant::EcFailedPullAsAbsent;
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        let Some(job) = p.job.as_ref() else {
            return;
        };
        let mut view = SlotView {
            k,
            total,
            min_size,
            members: vec![None; total],
            strays: Vec::new(),
            established: p.established.clone(),
            witnesses: Vec::new(),
        };
        let mut at: Vec<Option<(Vec<u8>, Ver)>> = vec![None; total];
        for (pos, slot) in at.iter_mut().enumerate() {
            let Some(d) = p.shards[pos] else { continue };
            let a = match &job.answers[pos] {
                Some(Ok(None)) => ShardAnswer::Absent,
                Some(Ok(Some((data, v)))) if split_trailer(data).is_some() => {
                    *slot = Some((data.clone(), *v));
                    ShardAnswer::Present(*v)
                }
                _ => ShardAnswer::Unknown,
            };
            view.members[pos] = Some((d, a));
        }
        let name = job.name.clone();
        let shards = p.shards.clone();
        // The map history (the daemon does not keep it yet): a member that was the up
        // member of its position at the epoch of the newest version was sent that write,
        // and its acknowledgement needed every up shard: its "absent" is an answer even
        // if its copy has no version yet (a group whose first write reached one shard).
        // So is the member of a position that was a hole at that epoch: no shard of that
        // position was written (a copy built by recovery pushes has no log, so the
        // daemon's `rules::established` does not count it).
        let newest = view
            .members
            .iter()
            .flatten()
            .filter_map(|(_, a)| match a {
                ShardAnswer::Present(v) => Some(*v),
                _ => None,
            })
            .max();
        if let Some(v) = newest {
            let pool = self.ecs().pool;
            let then = self.map_at(v.epoch);
            if let Some(m) = then.1.pg(pool, pg) {
                for (pos, d) in shards.iter().enumerate() {
                    if let Some(d) = d {
                        let then = m.shards.get(pos).copied().flatten();
                        if (then.is_none() || then == Some(*d)) && !view.established.contains(d) {
                            view.established.push(*d);
                        }
                    }
                }
            }
            // Witnesses (as the daemon's `vouch_by_membership`): the member of its
            // position in every map from the version's epoch to this interval's was sent
            // that write, and lacking it proves it unacknowledged.
            let now = self.ec_primary(id, pg).map_or(0, |p| p.epoch);
            for (pos, d) in shards.iter().enumerate() {
                let Some(d) = d else { continue };
                let always = (v.epoch..=now).all(|e| {
                    self.map_at(e)
                        .1
                        .pg(pool, pg)
                        .is_some_and(|m| m.shards.get(pos).copied().flatten() == Some(*d))
                });
                let any = self.cfg.mutant == Mutant::EcWitnessWithoutHistory;
                if any || (always && now >= v.epoch) {
                    view.witnesses.push(*d);
                }
            }
        }
        let decision = if mutant {
            spindle_pg::mutants::ec_decide_counting_failed_pulls_as_absent(&view)
        } else {
            decide_slot(&view)
        };
        self.log(|| format!("osd.{id}: ec pg {pg}: {name:?} {view:?} -> {decision:?}"));
        self.trace.u64(match &decision {
            SlotDecision::Deleted => 1,
            SlotDecision::Rebuild { .. } => 2,
            SlotDecision::RollBack { .. } => 3,
            SlotDecision::Wait { .. } => 4,
        });
        if let SlotDecision::RollBack { version } = &decision {
            // The rule's invariant, checked where it matters: the version of an object's
            // last acknowledged write is never rolled back while it is the newest version
            // of the object the primary holds (an older, superseded version may be: a trim
            // that did not reach every shard; and so may one that a newer write in the
            // other slot replaces, settled by that slot's own recovery).
            let (object, slot) = split_slot(&name)
                .map(|(o, s)| (o.to_string(), s))
                .unwrap_or_default();
            let me = shards.iter().position(|s| *s == Some(id));
            let newer = me
                .and_then(|pos| self.ec_current(id, pg, pos, &object))
                .is_some_and(|(s, v)| s != slot && v > *version);
            if !newer && self.ecs().acked.get(&object) == Some(&(name.clone(), *version)) {
                self.fail(format!(
                    "osd.{id}: ec pg {pg}: recovery rolled back {name:?} {version:?}, the \
                     acknowledged last write of {object} ({view:?})"
                ));
            }
        }
        let pushes: Vec<(usize, Shard)> = match decision {
            SlotDecision::Wait { .. } => {
                self.ec_retry_later(id, pg);
                return;
            }
            // Nobody that answered holds it and the silent positions cannot hold an
            // acknowledged version: deleted on every member, like a roll-back (the daemon
            // pushes "absent" to the copies of its missing set only, so a silent copy that
            // listed the slot keeps it until a later peering looks at it again).
            SlotDecision::Deleted => (0..total)
                .filter(|&pos| shards[pos].is_some())
                .map(|pos| (pos, None))
                .collect(),
            // Never acknowledged: deleted on every member.
            // Only the copies at the rolled-back version (as the daemon): a member with an
            // older version of this slot keeps it, it may be the object's current one.
            SlotDecision::RollBack { version } => (0..total)
                .filter(|&pos| {
                    shards[pos].is_some() && at[pos].as_ref().is_some_and(|(_, v)| *v == version)
                })
                .map(|pos| (pos, None))
                .collect(),
            SlotDecision::Rebuild {
                version,
                sources,
                targets,
            } => {
                let layout = self.ecs().layout.clone();
                let mut segs: Vec<Option<Vec<u8>>> = vec![None; total];
                let mut tail = Vec::new();
                for &s in &sources {
                    let Some((data, v)) = &at[s] else { continue };
                    if *v != version {
                        continue;
                    }
                    let cut = data.len() - TRAILER_BYTES as usize;
                    tail = data[cut..].to_vec();
                    segs[s] = Some(data[..cut].to_vec());
                }
                if let Err(e) = layout.reconstruct(&mut segs) {
                    self.fail(format!(
                        "osd.{id}: ec pg {pg}: decoding {name:?} from {sources:?} failed: {e}"
                    ));
                    return;
                }
                self.report.objects_recovered += targets.len() as u64;
                targets
                    .iter()
                    .map(|&t| {
                        let mut d = segs[t].clone().unwrap_or_default();
                        d.extend_from_slice(&tail);
                        (t, Some((d, version)))
                    })
                    .collect()
            }
        };
        if let Some(job) = self.ec_primary(id, pg).and_then(|p| p.job.as_mut()) {
            job.pushes_left = pushes.len();
        }
        if pushes.is_empty() {
            self.ec_slot_done(id, pg);
            return;
        }
        for (pos, state) in pushes {
            let Some(osd) = shards[pos] else { continue };
            let pgid = self.ec_pgid(pg, pos);
            let req = EcReq::Push {
                pg: pgid.pg,
                name: name.clone(),
                state,
            };
            self.ec_request(id, pg, pos, osd, Pend::Push, req);
        }
    }

    fn ec_pushed(&mut self, id: u32, pg: u32, result: Result<EcAns, String>) {
        if let Err(e) = result {
            self.log(|| format!("osd.{id}: ec pg {pg}: push failed: {e}; re-peering"));
            if let Some(p) = self.ec_primary(id, pg) {
                p.phase = Phase::Peering;
            }
            self.ec_retry_later(id, pg);
            return;
        }
        let Some(job) = self.ec_primary(id, pg).and_then(|p| p.job.as_mut()) else {
            return;
        };
        job.pushes_left = job.pushes_left.saturating_sub(1);
        if job.pushes_left == 0 {
            self.ec_slot_done(id, pg);
        }
    }

    fn ec_slot_done(&mut self, id: u32, pg: u32) {
        if let Some(p) = self.ec_primary(id, pg) {
            p.todo.pop_front();
        }
        self.ec_next_slot(id, pg);
    }

    // ---- client operations at the primary ----

    /// The current slot of `name` in this daemon's own shard copy: (slot, version).
    fn ec_current(&self, id: u32, pg: u32, pos: usize, name: &str) -> Option<(u8, Ver)> {
        let store = self.daemons[&id].store.as_ref()?;
        let pgid = self.ec_pgid(pg, pos);
        (0..2u8)
            .filter_map(|s| {
                store
                    .stat(pgid, &slot_name(name, s))
                    .map(|m| (s, m.version))
            })
            .max_by_key(|(_, v)| *v)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn ec_client_op(
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
        let my_epoch = self.daemons[&id].epoch;
        if epoch < my_epoch {
            return Some(Err(format!("stale map: epoch {epoch}, mine {my_epoch}")));
        }
        let (k, min_size, layout) = {
            let e = self.ecs();
            (e.shape.k as usize, e.shape.min_size(), e.layout.clone())
        };
        let Some(p) = self.ec_primary(id, pg) else {
            return Some(Err("not primary".into()));
        };
        if p.phase != Phase::Active {
            return Some(Err("not active".into()));
        }
        if p.busy.contains(name) {
            return Some(Err("another operation on the object is in progress".into()));
        }
        let shards = p.shards.clone();
        let Some(me) = shards.iter().position(|s| *s == Some(id)) else {
            return Some(Err("not a member".into()));
        };
        let members = members(&shards);
        let current = self.ec_current(id, pg, me, name);
        let mut o = EcOp {
            client,
            op,
            attempt,
            name: name.to_string(),
            steps: VecDeque::new(),
            ack_after: 0,
            done_steps: 0,
            step: None,
            replied: false,
            result: None,
            waiting: BTreeSet::new(),
            read: None,
        };
        match what {
            ClientOp::Read => {
                let Some((slot, v)) = current else {
                    return Some(Ok(None));
                };
                if members.len() < k {
                    return Some(Err(format!(
                        "only {} shards up, reads need {k}",
                        members.len()
                    )));
                }
                o.read = Some((v, vec![None; shards.len()], members.len()));
                let stored = slot_name(name, slot);
                let p = self.ec_primary(id, pg)?;
                let opid = p.next_op;
                p.next_op += 1;
                p.busy.insert(name.to_string());
                p.ops.insert(opid, o);
                for (pos, osd) in members {
                    let pgid = self.ec_pgid(pg, pos);
                    let req = EcReq::Pull {
                        pg: pgid.pg,
                        name: stored.clone(),
                    };
                    self.ec_request(id, pg, pos, osd, Pend::OpRead { op: opid }, req);
                }
                None
            }
            ClientOp::Write(m) => {
                if !spindle_pg::rules::may_write_with(min_size, members.len()) {
                    return Some(Err(format!(
                        "only {} shards up, writes need min_size {min_size}",
                        members.len()
                    )));
                }
                match m {
                    Mutation::Delete => {
                        let Some((slot, _)) = current else {
                            return Some(Ok(None));
                        };
                        // The old slot first, the current one last.
                        for s in [1 - slot, slot] {
                            o.steps.push_back(Step {
                                slot: slot_name(name, s),
                                data: None,
                            });
                        }
                        o.ack_after = 2;
                    }
                    Mutation::WriteFull(data) => {
                        let target = current.map_or(0, |(s, _)| 1 - s);
                        let size = data.len() as u64;
                        let stripes = layout.stripes(size);
                        let buf = match layout.encode_stripes(&data, stripes) {
                            Ok(b) => b,
                            Err(e) => return Some(Err(format!("encoding: {e}"))),
                        };
                        let seg = (stripes * layout.stripe_unit_bytes) as usize;
                        let t = trailer(size);
                        let per_pos: Vec<Vec<u8>> = (0..layout.total())
                            .map(|i| {
                                let mut v = buf[i * seg..(i + 1) * seg].to_vec();
                                v.extend_from_slice(&t);
                                v
                            })
                            .collect();
                        o.steps.push_back(Step {
                            slot: slot_name(name, target),
                            data: Some(per_pos),
                        });
                        o.ack_after = 1;
                        o.result = Some(data);
                        if let Some((old, _)) = current {
                            // Trim once acknowledged.
                            o.steps.push_back(Step {
                                slot: slot_name(name, old),
                                data: None,
                            });
                        }
                    }
                    other => {
                        return Some(Err(format!(
                            "erasure-coded writes are whole objects, not {other:?}"
                        )))
                    }
                }
                let p = self.ec_primary(id, pg)?;
                let opid = p.next_op;
                p.next_op += 1;
                p.busy.insert(name.to_string());
                p.ops.insert(opid, o);
                self.ec_op_step(id, pg, opid);
                None
            }
        }
    }

    /// Starts the next replication step of a write (or finishes the operation).
    fn ec_op_step(&mut self, id: u32, pg: u32, opid: u64) {
        let min_size = self.ecs().shape.min_size();
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        let members = members(&p.shards);
        let Some(o) = p.ops.get_mut(&opid) else {
            return;
        };
        let Some(step) = o.steps.pop_front() else {
            let o = p.ops.remove(&opid).expect("op exists");
            p.busy.remove(&o.name);
            return;
        };
        if !spindle_pg::rules::may_write_with(min_size, members.len()) {
            // A trim that cannot run now stays for recovery (it is harmless).
            let o = p.ops.remove(&opid).expect("op exists");
            p.busy.remove(&o.name);
            return;
        }
        let v = Ver {
            epoch: p.epoch,
            seq: p.last.seq + 1,
        };
        p.last = v;
        o.step = Some((step.slot.clone(), v));
        o.waiting = members.iter().map(|(pos, _)| *pos).collect();
        let name = o.name.clone();
        if step.data.is_none() {
            // A client delete of the current slot is under way: from now on the object
            // may be absent (the model's pending state).
            let e = self.ecs_mut();
            if e.acked.get(&name).is_some_and(|(s, _)| *s == step.slot) {
                e.acked.remove(&name);
            }
        }
        for (pos, osd) in members {
            let pgid = self.ec_pgid(pg, pos);
            let req = EcReq::Write {
                pg: pgid.pg,
                name: step.slot.clone(),
                version: v,
                data: step.data.as_ref().map(|d| d[pos].clone()),
            };
            self.ec_request(id, pg, pos, osd, Pend::OpWrite { op: opid }, req);
        }
    }

    fn ec_op_written(
        &mut self,
        id: u32,
        pg: u32,
        opid: u64,
        pos: usize,
        result: Result<EcAns, String>,
    ) {
        if let Err(e) = result {
            // A failed shard write: the group re-peers (the write is rolled forward or
            // back there); the client retries.
            self.log(|| format!("osd.{id}: ec pg {pg}: shard {pos} write failed: {e}; re-peering"));
            if self.cfg.mutant != Mutant::EcNoUnsettled {
                if let Some(p) = self.ec_primary(id, pg) {
                    if let Some((slot, _)) = p.ops.get(&opid).and_then(|o| o.step.clone()) {
                        p.unsettled.insert(slot);
                    }
                }
            }
            self.ec_peer(id, pg);
            return;
        }
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        let Some(o) = p.ops.get_mut(&opid) else {
            return;
        };
        o.waiting.remove(&pos);
        if !o.waiting.is_empty() {
            return;
        }
        o.done_steps += 1;
        if o.done_steps == o.ack_after && !o.replied {
            o.replied = true;
            let (c, op, attempt, r) = (o.client, o.op, o.attempt, o.result.clone());
            let (name, step) = (o.name.clone(), o.step.clone());
            let e = self.ecs_mut();
            match (&r, step) {
                (Some(_), Some(step)) => {
                    e.acked.insert(name, step);
                }
                _ => {
                    e.acked.remove(&name);
                }
            }
            self.ec_send_client(id, c, op, attempt, Ok(r));
        }
        self.ec_op_step(id, pg, opid);
    }

    fn ec_op_read(
        &mut self,
        id: u32,
        pg: u32,
        opid: u64,
        pos: usize,
        result: Result<EcAns, String>,
    ) {
        let layout = self.ecs().layout.clone();
        let k = layout.k;
        let Some(p) = self.ec_primary(id, pg) else {
            return;
        };
        let Some(o) = p.ops.get_mut(&opid) else {
            return;
        };
        let Some((want, segs, left)) = o.read.as_mut() else {
            return;
        };
        *left = left.saturating_sub(1);
        let mut size = None;
        if let Ok(EcAns::State(Some((data, v)))) = result {
            if v == *want {
                if let Some((seg, s)) = split_trailer(&data) {
                    segs[pos] = Some(seg);
                    size = Some(s);
                }
            }
        }
        let have = segs.iter().flatten().count();
        let reply = if have >= k && size.is_some() {
            // Decode from the k shards at hand.
            let mut use_segs: Vec<Option<Vec<u8>>> = segs.clone();
            let mut n = 0;
            for s in use_segs.iter_mut() {
                if s.is_some() {
                    n += 1;
                    if n > k {
                        *s = None;
                    }
                }
            }
            let size = size.unwrap_or(0);
            Some(match layout.reconstruct(&mut use_segs) {
                Ok(()) => {
                    let data: Vec<&[u8]> = use_segs[..k]
                        .iter()
                        .map(|s| s.as_deref().unwrap_or(&[]))
                        .collect();
                    let mut out = Vec::new();
                    layout.gather(&data, 0, 0, size, &mut out);
                    Ok(Some(out))
                }
                Err(e) => Err(format!("decoding: {e}")),
            })
        } else if *left == 0 {
            Some(Err(format!(
                "only {have} shards at the version, reads need {k}"
            )))
        } else {
            None
        };
        let Some(r) = reply else {
            return;
        };
        let o = p.ops.remove(&opid).expect("op exists");
        p.busy.remove(&o.name);
        self.ec_send_client(id, o.client, o.op, o.attempt, r);
    }

    // ---- checkers ----

    /// Erasure-coded groups that are not clean: every position up, the primary active at
    /// the current epoch with nothing in flight, every position listing the same slots at
    /// the same versions.
    pub(super) fn ec_unclean(&self) -> Vec<String> {
        let Some(e) = self.ec.as_deref() else {
            return Vec::new();
        };
        let cur = self.current();
        let mut out = Vec::new();
        for pg in 0..self.cfg.pgs.next_power_of_two() {
            let Some(m) = cur.1.pg(e.pool, pg) else {
                continue;
            };
            if m.shards.iter().any(Option::is_none) {
                out.push(format!("ec pg {pg}: holes {:?}", m.shards));
                continue;
            }
            let Some(primary) = m.primary() else {
                out.push(format!("ec pg {pg}: no shard up"));
                continue;
            };
            let d = &self.daemons[&primary];
            let p = e
                .daemons
                .get(&primary)
                .and_then(|ed| ed.primaries.get(&pg))
                .filter(|_| d.epoch == cur.0.epoch);
            let Some(p) = p else {
                out.push(format!(
                    "ec pg {pg}: osd.{primary} has not taken it at the current epoch"
                ));
                continue;
            };
            if p.phase != Phase::Active || !p.ops.is_empty() {
                out.push(format!(
                    "ec pg {pg}: {:?} with {} operations in flight",
                    p.phase,
                    p.ops.len()
                ));
                continue;
            }
            let mut listings = BTreeSet::new();
            for (pos, o) in m.shards.iter().enumerate() {
                let Some(s) = o.and_then(|o| self.daemons[&o].store.as_ref()) else {
                    out.push(format!("ec pg {pg}: shard {pos} has no store"));
                    continue;
                };
                let l: Vec<(String, Ver)> = s
                    .list(self.ec_pgid(pg, pos))
                    .into_iter()
                    .map(|(n, m)| (n, m.version))
                    .collect();
                listings.insert(l);
            }
            if listings.len() > 1 {
                out.push(format!("ec pg {pg}: {} different listings", listings.len()));
            }
        }
        out
    }

    /// After clean: every position holds its own shard of the last acknowledged state at
    /// the current slot (the same version everywhere), and every k of them decode to it.
    pub(super) fn ec_final_check(&mut self) {
        let e = self.ecs();
        let layout = e.layout.clone();
        let pool = e.pool;
        let cur = self.current();
        let mut problems = Vec::new();
        for (i, name) in self.objects.iter().enumerate() {
            let pg = self.pg_of(name);
            let model = &self.models[i];
            let acked = model.history.last().map(|h| h.1.clone()).unwrap_or(None);
            let Some(m) = cur.1.pg(pool, pg) else {
                continue;
            };
            let mut states: Vec<Option<(Vec<u8>, Ver)>> = Vec::new();
            for (pos, o) in m.shards.iter().enumerate() {
                let Some(store) = o.and_then(|o| self.daemons[&o].store.as_ref()) else {
                    problems.push(format!("{name}: shard {pos} has no daemon or store"));
                    continue;
                };
                let pgid = self.ec_pgid(pg, pos);
                let cur_slot = (0..2u8)
                    .filter_map(|s| {
                        store
                            .stat(pgid, &slot_name(name, s))
                            .map(|m| (s, m.version))
                    })
                    .max_by_key(|(_, v)| *v);
                match cur_slot {
                    None => states.push(None),
                    Some((s, _)) => match read_slot(store, pgid, &slot_name(name, s)) {
                        Ok(st) => states.push(st),
                        Err(e) => problems.push(format!("{name}: shard {pos} unreadable: {e}")),
                    },
                }
            }
            if states.len() != layout.total() {
                continue;
            }
            let versions: BTreeSet<Option<Ver>> =
                states.iter().map(|s| s.as_ref().map(|x| x.1)).collect();
            if versions.len() > 1 {
                problems.push(format!("{name}: shards at different versions {versions:?}"));
                continue;
            }
            let got: State = match &states[0] {
                None => None,
                Some(_) => {
                    let parts: Vec<Option<(Vec<u8>, u64)>> = states
                        .iter()
                        .map(|s| s.as_ref().and_then(|(d, _)| split_trailer(d)))
                        .collect();
                    if parts.iter().any(Option::is_none) {
                        problems.push(format!("{name}: a shard has an invalid trailer"));
                        continue;
                    }
                    let size = parts[0].as_ref().map_or(0, |p| p.1);
                    let data: Vec<&[u8]> = parts[..layout.k]
                        .iter()
                        .map(|p| p.as_ref().map_or(&[][..], |p| &p.0[..]))
                        .collect();
                    let mut out = Vec::new();
                    layout.gather(&data, 0, 0, size, &mut out);
                    // Each position holds its own shard of those bytes.
                    let stripes = layout.stripes(size);
                    match layout.encode_stripes(&out, stripes) {
                        Ok(buf) => {
                            let seg = (stripes * layout.stripe_unit_bytes) as usize;
                            for (pos, p) in parts.iter().enumerate() {
                                let own = p.as_ref().map(|p| &p.0[..]);
                                if own != Some(&buf[pos * seg..(pos + 1) * seg])
                                    || p.as_ref().map(|p| p.1) != Some(size)
                                {
                                    problems.push(format!(
                                        "{name}: shard {pos} is not the shard of the decoded object"
                                    ));
                                }
                            }
                        }
                        Err(e) => problems.push(format!("{name}: encoding: {e}")),
                    }
                    Some(out)
                }
            };
            let ok = got == acked || model.pending.as_ref() == Some(&got);
            if !ok {
                problems.push(format!(
                    "{name} decodes to {} but the last acknowledged state is {}",
                    describe(&got),
                    describe(&acked)
                ));
            }
        }
        for p in problems {
            self.fail(format!("after clean: {p}"));
        }
    }
}
