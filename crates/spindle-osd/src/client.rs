//! The client protocol on a group's primary: `ObjRequest` (writes, partial writes,
//! truncates, deletes, reads, stats, listings). A replicated write is the shell of the
//! group's `spindle_pg::ReplicationCore` (`PgState::rep`): the core gives the next
//! version, the write is applied locally and sent to every other acting copy in version
//! order (`start_write`), and the answers go back to the core, which acknowledges once
//! every copy has it durable (`finish_write`, over `fanout`), or refuses it and asks for a
//! new peering round. Erasure-coded pools' operations continue in `ec.rs`.

use super::*;
use spindle_pg::{RepError, RepEvent};
use spindle_trace::Stage;

/// One client request (`ObjRequest`) as the handlers take it.
pub(crate) struct ClientOp {
    /// The request id the reply carries.
    pub rid: u64,
    pub pgid: PgId,
    pub name: String,
    pub op: ObjOp,
    /// Block checksums of the frame's bulk bytes (a whole-object write's data), verified
    /// when the frame arrived: the store keeps them instead of checksumming again.
    pub block_crcs: Vec<u32>,
    /// BLAKE3 of the frame's bulk bytes if its MAC was checked: replication frames that
    /// carry the same bytes are MACed with it instead of hashing them again.
    pub bulk_hash: Option<[u8; 32]>,
    /// When the request was decoded, if stage clocks are on (`spindle_trace`).
    pub received: Option<std::time::Instant>,
}

impl Osd {
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

    /// Serves one client operation (this daemon must be the group's primary and the group
    /// active at the current epoch, else the client is told why and retries).
    pub(crate) fn client_op(&self, ms: &Arc<MapState>, req: ClientOp, reply: Replier) {
        let epoch = ms.map.epoch;
        let ClientOp {
            rid,
            pgid,
            name,
            op,
            block_crcs,
            bulk_hash,
            received,
        } = req;
        let (pool, pg) = (pgid.pool, pgid.pg);
        OsdCounters::bump(&self.inner.counters.client_ops);
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
        // One look at the group: its phase, and whether the object is missing on some copy
        // (operations on it wait for its recovery; reads and stats only when this daemon
        // itself misses it).
        let (phase, missing) = {
            let pgs = lock(&self.inner.pgs);
            match pgs.get(&(pool, pg)) {
                None => (Phase::Peering, false),
                Some(st) => {
                    let me_only = match &op {
                        ObjOp::Mutate(_) => Some(false),
                        ObjOp::Read { .. } | ObjOp::Stat | ObjOp::Exec(_) => Some(true),
                        ObjOp::List => None,
                    };
                    let missing = me_only.is_some_and(|me_only| {
                        st.recovery.as_ref().is_some_and(|r| {
                            r.core.is_missing(&name, me_only.then_some(self.inner.id))
                        })
                    });
                    (st.phase, missing)
                }
            }
        };
        if phase != Phase::Active {
            reply.send(
                rid,
                epoch,
                &Msg::error(ErrorCode::Again, format!("pg {pgid} is {phase:?}")),
            );
            return;
        }
        // Reads only under a read lease from every other copy (`lease.rs`): a primary cut
        // off from its copies may have been replaced by a map this client has not seen.
        if !matches!(op, ObjOp::Mutate(_)) {
            if let Err(why) = self.may_read(mapping, epoch) {
                OsdCounters::bump(&self.inner.counters.reads_without_lease);
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(ErrorCode::Again, format!("pg {pgid}: {why}")),
                );
                return;
            }
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
        // A program run: every object it names must be of this group.
        if let ObjOp::Exec(e) = &op {
            if let Some(why) = exec_refusal(&ms.map, pgid, &name, e) {
                reply.send(rid, epoch, &Msg::error(ErrorCode::Invalid, why));
                return;
            }
        }
        let osd = self.clone();
        if let Some(layout) = self.ec_layout_of(&ms.map, pool) {
            let mapping = mapping.clone();
            tokio::spawn(async move {
                let req = ClientOp {
                    rid,
                    pgid,
                    name,
                    op,
                    block_crcs: Vec::new(),
                    bulk_hash: None,
                    received,
                };
                osd.ec_client_op(epoch, &mapping, &layout, req, reply).await
            });
            return;
        }
        if matches!(&op, ObjOp::Mutate(m) if m.is_shard()) {
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
        if missing {
            let ms = ms.clone();
            let since = self.interval_of(pgid).unwrap_or(0);
            tokio::spawn(async move {
                if let Err(e) = osd.ensure_recovered(pgid, since, &name).await {
                    reply.send(rid, epoch, &Msg::error(ErrorCode::Again, e));
                    return;
                }
                let req = ClientOp {
                    rid,
                    pgid,
                    name,
                    op,
                    block_crcs,
                    bulk_hash,
                    received,
                };
                osd.client_op(&ms, req, reply);
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
                        let started = self.start_write(
                            epoch,
                            pgid,
                            &name,
                            m,
                            (block_crcs, bulk_hash),
                            &replicas,
                            &conns,
                        );
                        tokio::spawn(async move {
                            let msg = osd.finish_write(started).await;
                            reply.send(rid, epoch, &msg);
                        });
                    }
                    None => {
                        tokio::spawn(async move {
                            let mut conns = Vec::new();
                            for &o in &replicas {
                                match osd.peer_conn(o).await {
                                    Ok(c) => conns.push(c),
                                    Err(e) => {
                                        reply.send(rid, epoch, &Msg::error(ErrorCode::Again, e));
                                        return;
                                    }
                                }
                            }
                            let started = osd.start_write(
                                epoch,
                                pgid,
                                &name,
                                m,
                                (block_crcs, bulk_hash),
                                &replicas,
                                &conns,
                            );
                            let msg = osd.finish_write(started).await;
                            reply.send(rid, epoch, &msg);
                        });
                    }
                }
            }
            ObjOp::Exec(exec) => {
                let peers: Vec<u32> = mapping
                    .up
                    .iter()
                    .copied()
                    .filter(|&o| o != self.inner.id)
                    .collect();
                tokio::spawn(async move {
                    let source = crate::exec::Source::Replicated { peers };
                    let msg = osd.exec_op(epoch, pgid, name, exec, source).await;
                    reply.send_owned(rid, epoch, msg);
                });
            }
            ObjOp::Read { offset, len } => {
                let peers: Vec<u32> = mapping
                    .up
                    .iter()
                    .copied()
                    .filter(|&o| o != self.inner.id)
                    .collect();
                tokio::spawn(async move {
                    spindle_trace::record(Stage::OsdDispatch, received);
                    let msg = osd.read(epoch, pgid, &name, offset, len, &peers).await;
                    reply.send_owned(rid, epoch, msg);
                    spindle_trace::record(Stage::OsdRequest, received);
                });
            }
            ObjOp::Stat => {
                let msg = match self.inner.store.stat(pgid, &name) {
                    Some(meta) => Msg::ObjReply {
                        version: meta.version,
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

    /// Starts a replicated write, atomically per PG (one lock): the group's
    /// `ReplicationCore` assigns the version and puts the write in flight; the body is
    /// queued to every other acting copy (`replicas`, whose connections are `conns`), in
    /// version order, and the local store transaction is queued.
    /// (The error is the reply to send; replies are built once, not boxed.)
    #[allow(clippy::result_large_err, clippy::too_many_arguments)]
    fn start_write(
        &self,
        epoch: u64,
        pgid: PgId,
        name: &str,
        m: WireMutation,
        (block_crcs, bulk_hash): (Vec<u32>, Option<[u8; 32]>),
        replicas: &[u32],
        conns: &[Arc<RpcConn>],
    ) -> Result<StartedWrite, Msg> {
        if matches!(m, WireMutation::Delete) && self.inner.store.stat(pgid, name).is_none() {
            return Err(Msg::error(
                ErrorCode::NotFound,
                format!("{name}: no such object"),
            ));
        }
        // Refused before a version exists (client_op already sends these elsewhere).
        if m.is_shard() {
            return Err(not_replicated());
        }
        let replaces = matches!(m, WireMutation::WriteFull(_) | WireMutation::Delete);
        let op = self.inner.next_write_op.fetch_add(1, Ordering::Relaxed);
        let mut pgs = lock(&self.inner.pgs);
        let changed = || Msg::error(ErrorCode::Again, "placement group changed");
        let st = pgs
            .get_mut(&(pgid.pool, pgid.pg))
            .filter(|s| s.phase == Phase::Active && s.epoch == epoch)
            .ok_or_else(changed)?;
        // The core's interval is the one the connections were chosen for.
        if !st
            .rep
            .interval()
            .is_some_and(|iv| iv.epoch == epoch && iv.acting.get(1..) == Some(replicas))
        {
            return Err(changed());
        }
        if st
            .recovery
            .as_ref()
            .is_some_and(|r| r.core.is_missing(name, None))
        {
            // Never reached through client_op (it recovers first); kept as a guard.
            return Err(Msg::error(ErrorCode::Again, "object is being recovered"));
        }
        let v = match st.rep.begin(op) {
            Ok(begun) => begun.version,
            Err(RepError::Inactive) => return Err(changed()),
            Err(e) => return Err(Msg::error(ErrorCode::Again, format!("pg {pgid}: {e:?}"))),
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
        // The replicas get the client's bytes unchanged: their MACs cover the hash the
        // client's frame was checked with.
        let prepared = match bulk_hash {
            Some(h) => prepared.with_bulk_hash(h),
            None => prepared,
        };
        let Msg::RepWrite { mutation: m, .. } = rep else {
            unreachable!("built as a RepWrite above")
        };
        let mut pending = Vec::with_capacity(conns.len());
        let mut refused = None;
        for (&copy, c) in replicas.iter().zip(conns) {
            match c.start_prepared(epoch, &prepared) {
                Ok(p) => pending.push((copy, p)),
                Err(e) => {
                    refused = Some(RepEvent::ReplicaFailed {
                        version: v,
                        from: copy,
                        reason: e.to_string(),
                    });
                    break;
                }
            }
        }
        // The store's form; `None` only for shard mutations, refused above.
        let local = match (&shared, refused) {
            (_, Some(failed)) => Err(failed),
            (Some(_), None) => Ok(None),
            (None, None) => match Mutation::try_from(m) {
                Ok(mutation) => Ok(Some(mutation)),
                Err(_) => Err(RepEvent::LocalCommitted {
                    version: v,
                    result: Err("not a replicated mutation".into()),
                }),
            },
        };
        let local = match local {
            Ok(local) => local,
            Err(failed) => {
                // Not applied here; a copy may have it: the core refuses the write and
                // asks for a new peering round.
                let decision = st.rep.step(failed);
                let peer_at = decision.repeer.then(|| Self::repeer_locked(st)).flatten();
                drop(pgs);
                if let Some(epoch) = peer_at {
                    self.spawn_peering(pgid, epoch);
                }
                return Err(Msg::error(
                    ErrorCode::Again,
                    format!("write {v:?} not sent to every copy"),
                ));
            }
        };
        let inflight = self.inflight_begin(pgid);
        let commit = match (shared, local) {
            (Some(data), _) => self
                .inner
                .store
                .apply_full_shared(pgid, name, v, data, block_crcs),
            (None, Some(mutation)) => self
                .inner
                .store
                .apply_with_block_crcs(pgid, name, v, mutation, block_crcs),
            (None, None) => unreachable!("a mutation or a shared buffer"),
        };
        drop(pgs);
        Ok(StartedWrite {
            op,
            version: v,
            commit,
            inflight,
            pending,
            pgid,
            name: name.to_string(),
            replaces,
        })
    }

    /// The group must peer again (its `ReplicationCore` said copies may differ): with the
    /// PG's lock held, stops serving and returns the epoch to peer at (`None` if it is not
    /// active: a round is already due, and its activation re-activates the core).
    fn repeer_locked(st: &mut PgState) -> Option<u64> {
        if st.phase != Phase::Active {
            return None;
        }
        st.phase = Phase::Peering;
        st.recovery = None;
        // A new interval id: recovery tasks of the old one stop.
        st.since = st.since.max(st.epoch) + 1_000_000_000;
        Some(st.epoch)
    }

    fn spawn_peering(&self, pgid: PgId, epoch: u64) {
        let osd = self.clone();
        tokio::spawn(async move { osd.peer_until_done(pgid.pool, pgid.pg, epoch).await });
    }

    /// Waits for the local commit and every replica's answer, then feeds them to the
    /// group's `ReplicationCore` (one lock), which decides: acknowledged (every acting
    /// copy has it), refused (and re-peer), or dropped (the interval changed).
    async fn finish_write(&self, started: Result<StartedWrite, Msg>) -> Msg {
        let w = match started {
            Ok(w) => w,
            Err(msg) => return msg,
        };
        let timeout = self.inner.config.replica_timeout_ms;
        let local = w.commit.await;
        drop(w.inflight);
        let answers = fanout::wait_all(w.pending, timeout, self.inner.map_tx.subscribe(), |d| {
            self.marked_down(*d)
        })
        .await;
        let mut failure = None;
        let mut no_space = None;
        for (_, f) in &answers.failures {
            match f {
                fanout::CopyFailure::NoSpace(message) => {
                    no_space = Some(format!("replica: {message}"));
                }
                fanout::CopyFailure::NewerMap(map) => {
                    let _ = self.install_map(map);
                    failure = Some("a replica has a newer map".to_string());
                }
                other => failure = Some(format!("replica: {other}")),
            }
        }
        let (decided, peer_at) = {
            let mut pgs = lock(&self.inner.pgs);
            match pgs.get_mut(&(w.pgid.pool, w.pgid.pg)) {
                // No longer primary: the write was dropped with the group's state.
                None => (None, None),
                Some(st) => {
                    let mut decided = None;
                    let mut repeer = false;
                    let mut feed = |rep: &mut ReplicationCore, ev| {
                        let d = rep.step(ev);
                        repeer |= d.repeer;
                        if let Some((op, result)) = d.reply {
                            if op == w.op {
                                decided = Some(result.is_ok());
                            }
                        }
                    };
                    let result = local.as_ref().map(|_| ()).map_err(|e| e.to_string());
                    feed(
                        &mut st.rep,
                        RepEvent::LocalCommitted {
                            version: w.version,
                            result,
                        },
                    );
                    for i in 0..st.rep.replicas().len() {
                        let copy = st.rep.replicas()[i];
                        let ev = match answers.failures.iter().find(|(c, _)| *c == copy) {
                            Some((_, f)) => RepEvent::ReplicaFailed {
                                version: w.version,
                                from: copy,
                                reason: f.to_string(),
                            },
                            None => RepEvent::ReplicaAcked {
                                version: w.version,
                                from: copy,
                            },
                        };
                        feed(&mut st.rep, ev);
                    }
                    if decided == Some(true) && w.replaces && st.damaged.remove(&w.name) {
                        tracing::info!(
                            "osd.{}: pg {}: damaged object {:?} replaced by a client write",
                            self.inner.id,
                            w.pgid,
                            w.name
                        );
                    }
                    (decided, repeer.then(|| Self::repeer_locked(st)).flatten())
                }
            }
        };
        // Some copies may have applied the write and others not: peering again compares
        // the logs and recovers the object on the copies that miss it (or lack the space).
        if let Some(epoch) = peer_at {
            self.spawn_peering(w.pgid, epoch);
        }
        if decided == Some(true) {
            let size_bytes = self
                .inner
                .store
                .stat(w.pgid, &w.name)
                .map_or(0, |m| m.size_bytes);
            return Msg::ObjReply {
                version: w.version,
                size_bytes,
                data: Vec::new(),
                listing: Vec::new(),
            };
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
        let f = failure.unwrap_or_else(|| "placement group changed".to_string());
        tracing::info!(
            "osd.{}: write {} in pg {} not acknowledged: {f}",
            self.inner.id,
            w.name,
            w.pgid
        );
        Msg::error(ErrorCode::Again, f)
    }

    /// Reads locally; on a checksum failure reads the object from another copy, repairs
    /// the local one and serves the good data.
    pub(crate) async fn read(
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
        let store_start = spindle_trace::now();
        let read = store.read(pgid, name, offset, len).await;
        spindle_trace::record(Stage::OsdStoreRead, store_start);
        match read {
            Ok(data) => Msg::ObjReply {
                version: meta.version,
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
                                    OsdCounters::bump(&self.inner.counters.corruptions_repaired);
                                    tracing::warn!(
                                        "osd.{}: repaired {name} in pg {pgid} from osd.{peer}",
                                        self.inner.id
                                    );
                                }
                                Err(e) => tracing::error!("repair of {name} failed: {e}"),
                            }
                            return Msg::ObjReply {
                                version: v,
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

/// Why a program run cannot be served by group `pgid`: too many objects, an object of
/// another group, or an object file that is too large.
fn exec_refusal(
    map: &ClusterMap,
    pgid: PgId,
    name: &str,
    e: &spindle_proto::msg::ExecOp,
) -> Option<String> {
    let max = spindle_types::limits::EXEC_OBJECTS_MAX;
    if 1 + e.more.len() > max {
        return Some(format!("a program run names at most {max} objects"));
    }
    if e.elf.len() > spindle_types::limits::PROGRAM_BYTES_MAX {
        return Some(format!(
            "program object file of {} bytes: at most {}",
            e.elf.len(),
            spindle_types::limits::PROGRAM_BYTES_MAX
        ));
    }
    let pg_count = map.pools.get(&pgid.pool)?.pg_count;
    e.more
        .iter()
        .find(|n| spindle_map::object_pg(n, pg_count) != pgid.pg)
        .map(|n| {
            format!(
                "{n} is not in the placement group of {name}: objects of one run must share a \
                 placement key ({{key}} in their names)"
            )
        })
}

struct StartedWrite {
    /// The write's identity in the group's `ReplicationCore`.
    op: u64,
    version: Ver,
    commit: spindle_store::Commit,
    /// Held until the local commit resolved (peering waits for it).
    inflight: InflightGuard,
    /// Each replica's pending answer, in acting order.
    pending: Vec<(u32, PendingReply)>,
    pgid: PgId,
    name: String,
    /// A whole-object write or a delete: once acknowledged, the object is no longer
    /// damaged (scrub's verdict is replaced).
    replaces: bool,
}
