//! Erasure-coded placement groups.
//!
//! The client encodes (`spindle_map::ec::EcLayout`); the primary orders, distributes and
//! reads shards. Each position i of a group's CRUSH result (`indep`) stores shard i of
//! every object under its own stored group id (`shard_pg`), so a daemon that changes
//! position never serves an old shard as a new one.
//!
//! **Consistency: versioned shard slots.** A shard of object `o` lives in one of two
//! slot objects, `o\0` + `0` or `o\0` + `1`. A write (full or partial) never changes the
//! current slot: every shard writes the *other* slot (a partial write copies the current
//! slot's bytes locally and patches the touched stripes into the copy), at the write's
//! version. After every up shard acknowledged, the primary deletes the old slot (trim).
//! So until a write is acknowledged, the previous version is intact on every shard, and a
//! crash at any point leaves each shard with the old version, the new one, or both - never
//! a stripe mixing them. Readers name the version they read (`ShardRead`), so a shard at
//! another version is an erasure, never mixed in. Peering treats slot objects like any
//! object (logs, missing sets); recovering a slot rebuilds the missing shards by decoding
//! k shards of the authoritative version, or - when fewer than k shards of that version
//! exist and fewer than `min_size` could ever have held it, i.e. the write was never
//! acknowledged - rolls it back by deleting that slot everywhere (the other slot, the
//! previous version, is then current).
//!
//! Every operation on an object is serialized on the primary (a per-object lock), so a
//! write's base slot is settled when the next write copies it.
//!
//! Each copy applies shard writes of a group strictly in arrival (= version) order: they
//! go through one queue per stored group, whose task reads a base slot if needed and
//! submits the store transaction before taking the next one.

use crate::counters::OsdCounters;
use crate::{store_error_reply, InflightGuard, Osd, Phase};
use spindle_map::ec::{parse_trailer, trailer, EcLayout, TRAILER_BYTES};
use spindle_map::{shard_pg, ClusterMap, PgMapping};
use spindle_pg::ec::{decide_slot, ShardAnswer, SlotDecision, SlotView};
use spindle_proto::msg::{Mutation as WireMutation, ObjOp, ObjectListing, Ver};
use spindle_proto::net::Replier;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{Mutation, PgId, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

pub(crate) use spindle_pg::ec::{slot_name, split_slot};

/// One shard write queued on a copy.
pub(crate) struct ShardJob {
    pub name: String,
    pub version: Ver,
    pub mutation: WireMutation,
    pub guard: InflightGuard,
    pub done: tokio::sync::oneshot::Sender<Msg>,
}

/// A shard copy's state of a slot object: its bytes (with trailer) and version.
type ShardState = Option<(Vec<u8>, Ver)>;

/// Per-object operation locks of the primary.
pub(crate) type ObjectLocks =
    std::collections::HashMap<(PgId, String), Arc<tokio::sync::Mutex<()>>>;

/// The slot holding an object's current version on one copy.
#[derive(Clone, Copy, Debug)]
struct Current {
    slot: u8,
    version: Ver,
    stored_bytes: u64,
}

fn err(code: ErrorCode, m: impl Into<String>) -> Msg {
    Msg::error(code, m)
}

/// The erasure-coded group an operation runs in, at one epoch.
#[derive(Clone, Copy)]
struct EcGroup<'a> {
    epoch: u64,
    pgid: PgId,
    mapping: &'a PgMapping,
    layout: &'a EcLayout,
}

/// A byte range of one version of a shard slot object.
#[derive(Clone, Copy)]
struct ShardSlice<'a> {
    /// The slot object's stored name.
    stored: &'a str,
    version: Ver,
    offset: u64,
    len: u64,
}

impl Osd {
    /// The erasure-coded shard protocol, copy side: shard writes (through the group's ordered queue) and shard reads.
    pub(crate) fn serve_shard(&self, msg: Msg, rid: u64, epoch: u64, reply: Replier) {
        match msg {
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
            other => crate::not_handled(&reply, rid, epoch, &other),
        }
    }

    /// Stored group id of `osd`'s copy of group `pgid` at the current map (the group
    /// itself for replicated pools).
    pub(crate) fn copy_pgid(&self, pgid: PgId, osd: u32) -> PgId {
        let Some(ms) = self.map_state() else {
            return pgid;
        };
        let shard = ms
            .placement
            .pg(pgid.pool, pgid.pg)
            .and_then(|m| m.shard_of(osd));
        PgId {
            pool: pgid.pool,
            pg: shard_pg(pgid.pg, shard),
        }
    }

    pub(crate) fn ec_layout_of(&self, map: &ClusterMap, pool: u32) -> Option<EcLayout> {
        let def = map.pools.get(&pool)?;
        if !def.is_erasure() {
            return None;
        }
        let mut cache = crate::lock(&self.inner.ec_layouts);
        if let Some(l) = cache.get(&pool) {
            return Some(l.clone());
        }
        let layout = EcLayout::for_pool(def)?.ok()?;
        cache.insert(pool, layout.clone());
        Some(layout)
    }

    // ------------------------------------------------------------ copy side

    /// Queues a shard write on this daemon's copy `stored` (applied in call order).
    pub(crate) fn queue_shard_write(
        &self,
        stored: PgId,
        name: String,
        version: Ver,
        mutation: WireMutation,
    ) -> tokio::sync::oneshot::Receiver<Msg> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let guard = self.inflight_begin(stored);
        let job = ShardJob {
            name,
            version,
            mutation,
            guard,
            done,
        };
        let mut queues = crate::lock(&self.inner.shard_queues);
        let tx = queues.entry(stored).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let osd = self.clone();
            tokio::spawn(async move { osd.shard_queue(stored, rx).await });
            tx
        });
        if let Err(mpsc::error::SendError(job)) = tx.send(job) {
            let _ = job
                .done
                .send(err(ErrorCode::Internal, "shard queue stopped"));
        }
        rx
    }

    async fn shard_queue(&self, stored: PgId, mut rx: mpsc::UnboundedReceiver<ShardJob>) {
        while let Some(job) = rx.recv().await {
            let store = self.inner.store.clone();
            let commit = match self.compose_shard(stored, &job).await {
                Ok(m) => store.apply(stored, &job.name, job.version, m),
                Err(msg) => {
                    let _ = job.done.send(msg);
                    continue;
                }
            };
            let (guard, done) = (job.guard, job.done);
            tokio::spawn(async move {
                // The shard's writer may have given up meanwhile: nobody to tell.
                let _ = done.send(crate::commit_reply(commit.await, Some(guard)));
            });
        }
    }

    /// The store mutation for a shard write (reading the base slot of a partial write).
    async fn compose_shard(&self, stored: PgId, job: &ShardJob) -> Result<Mutation, Msg> {
        match &job.mutation {
            WireMutation::Delete => Ok(Mutation::Delete),
            WireMutation::EcPatch {
                base,
                object_size,
                shard_size,
                shard_offset,
                data,
            } => {
                if *shard_size > spindle_proto::msg::DATA_MAX as u64 {
                    return Err(err(
                        ErrorCode::Invalid,
                        format!("shard of {shard_size} bytes is larger than any object"),
                    ));
                }
                let end = shard_offset
                    .checked_add(data.len() as u64)
                    .filter(|&e| e <= *shard_size)
                    .ok_or_else(|| err(ErrorCode::Invalid, "shard patch beyond the shard"))?;
                debug_assert!(end <= *shard_size);
                let mut content = match base {
                    None => Vec::new(),
                    Some(bv) => {
                        let (name, slot) = split_slot(&job.name)
                            .ok_or_else(|| err(ErrorCode::Invalid, "not a shard slot name"))?;
                        let other = slot_name(name, 1 - slot);
                        let store = &self.inner.store;
                        let meta = store.stat(stored, &other).ok_or_else(|| {
                            err(ErrorCode::Conflict, format!("base slot of {name} missing"))
                        })?;
                        if meta.version != *bv {
                            return Err(err(
                                ErrorCode::Conflict,
                                format!("base slot of {name} is not at the expected version"),
                            ));
                        }
                        let keep = meta.size_bytes.saturating_sub(TRAILER_BYTES);
                        store
                            .read(stored, &other, 0, keep.min(*shard_size))
                            .await
                            .map_err(|e| store_error_reply(&e))?
                    }
                };
                if base.is_none() && *shard_offset == 0 && end == *shard_size {
                    // A whole shard: no copy.
                    content = data.clone();
                } else {
                    content.resize(*shard_size as usize, 0);
                    content[*shard_offset as usize..end as usize].copy_from_slice(data);
                }
                content.extend_from_slice(&trailer(*object_size));
                Ok(Mutation::WriteFull(content))
            }
            other => Err(err(
                ErrorCode::Invalid,
                format!(
                    "a shard of an erasure-coded group takes shard patches and deletes, not {:?}",
                    std::mem::discriminant(other)
                ),
            )),
        }
    }

    /// `ShardRead`: a byte range of a slot at an exact version.
    pub(crate) async fn shard_read(
        &self,
        stored: PgId,
        name: &str,
        want: Ver,
        offset: u64,
        len: u64,
    ) -> Msg {
        let store = &self.inner.store;
        let Some(meta) = store.stat(stored, name) else {
            return err(ErrorCode::NotFound, format!("{name}: no such shard"));
        };
        if meta.version != want {
            return err(ErrorCode::Conflict, "shard is at another version");
        }
        match store.read(stored, name, offset, len).await {
            Ok(data) => Msg::ObjReply {
                version: want,
                size_bytes: meta.size_bytes,
                data,
                listing: Vec::new(),
            },
            Err(e) => store_error_reply(&e),
        }
    }

    // ------------------------------------------------------------ primary side

    /// The newest slot of `name` on this daemon's copy.
    fn current_slot(&self, own: PgId, name: &str) -> Option<Current> {
        let store = &self.inner.store;
        (0..2u8)
            .filter_map(|slot| {
                store.stat(own, &slot_name(name, slot)).map(|m| Current {
                    slot,
                    version: m.version,
                    stored_bytes: m.size_bytes,
                })
            })
            .max_by_key(|c| c.version)
    }

    /// A client operation on an object of an erasure-coded group (this daemon is primary
    /// and the group is active).
    pub(crate) async fn ec_client_op(
        &self,
        epoch: u64,
        mapping: &PgMapping,
        layout: &EcLayout,
        req: crate::client::ClientOp,
        reply: Replier,
    ) {
        let crate::client::ClientOp {
            rid,
            pgid,
            name,
            op,
            ..
        } = req;
        let name = name.as_str();
        if let ObjOp::List = op {
            reply.send_owned(rid, epoch, self.ec_list(pgid).await);
            return;
        }
        if name.contains('\0') || name.len() > spindle_types::limits::EC_OBJECT_NAME_BYTES_MAX {
            let msg = err(
                ErrorCode::Invalid,
                format!(
                    "object names of erasure-coded pools must be NUL-free and at most {} bytes",
                    spindle_types::limits::EC_OBJECT_NAME_BYTES_MAX
                ),
            );
            reply.send_owned(rid, epoch, msg);
            return;
        }
        // One operation per object at a time.
        let lock = {
            let mut locks = crate::lock(&self.inner.ec_locks);
            locks
                .entry((pgid, name.to_string()))
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
                .clone()
        };
        {
            let _held = lock.lock().await;
            let (msg, trim) = self
                .ec_locked_op(epoch, pgid, mapping, layout, name, op)
                .await;
            // The client has its answer; the old slot goes while the object stays locked
            // (the next write would otherwise target it).
            reply.send_owned(rid, epoch, msg);
            if let Some(slot) = trim {
                let old = slot_name(name, slot);
                if let Err(m) = self
                    .ec_replicate(epoch, pgid, mapping, &old, |_| WireMutation::Delete)
                    .await
                {
                    tracing::info!(
                        "osd.{}: trimming the old slot of {name} failed: {m:?}",
                        self.inner.id
                    );
                }
            }
        }
        let mut locks = crate::lock(&self.inner.ec_locks);
        if Arc::strong_count(&lock) == 2 {
            locks.remove(&(pgid, name.to_string()));
        }
    }

    async fn ec_locked_op(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &EcLayout,
        name: &str,
        op: ObjOp,
    ) -> (Msg, Option<u8>) {
        // Both slots must be present on every copy that should have them.
        let since = self.interval_of(pgid).unwrap_or(0);
        for slot in 0..2u8 {
            let stored = slot_name(name, slot);
            if self.object_missing(pgid, &stored, false) {
                if let Err(e) = self.ensure_recovered(pgid, since, &stored).await {
                    return (err(ErrorCode::Again, e), None);
                }
            }
        }
        let own = self.copy_pgid(pgid, self.inner.id);
        let current = self.current_slot(own, name);
        let msg = match op {
            ObjOp::Stat => match current {
                None => err(ErrorCode::NotFound, format!("{name}: no such object")),
                Some(c) => match self.ec_object_size(epoch, pgid, mapping, name, c).await {
                    Ok(size) => Msg::ObjReply {
                        version: c.version,
                        size_bytes: size,
                        data: Vec::new(),
                        listing: Vec::new(),
                    },
                    Err(m) => m,
                },
            },
            ObjOp::Read { offset, len } => match current {
                None => err(ErrorCode::NotFound, format!("{name}: no such object")),
                Some(c) => {
                    let g = EcGroup {
                        epoch,
                        pgid,
                        mapping,
                        layout,
                    };
                    self.ec_read(g, name, c, offset, len).await
                }
            },
            ObjOp::List => self.ec_list(pgid).await,
            ObjOp::Mutate(WireMutation::Delete) => {
                let Some(c) = current else {
                    return (
                        err(ErrorCode::NotFound, format!("{name}: no such object")),
                        None,
                    );
                };
                // The old slot first, the current one last: a crash in between leaves
                // the object intact.
                for slot in [1 - c.slot, c.slot] {
                    let stored = slot_name(name, slot);
                    if let Err(m) = self
                        .ec_replicate(epoch, pgid, mapping, &stored, |_| WireMutation::Delete)
                        .await
                    {
                        return (m, None);
                    }
                }
                Msg::ObjReply {
                    version: c.version,
                    size_bytes: 0,
                    data: Vec::new(),
                    listing: Vec::new(),
                }
            }
            ObjOp::Mutate(WireMutation::EcWrite {
                object_size,
                shard_offset,
                shard_len,
                full,
                expect,
                data,
            }) => {
                if !full && expect != current.map(|c| c.version) {
                    return (
                        err(
                            ErrorCode::Conflict,
                            format!("{name} changed since the version the write is based on"),
                        ),
                        None,
                    );
                }
                let su = layout.stripe_unit_bytes;
                let shard_size = layout.shard_size(object_size);
                let total = layout.total() as u64;
                let valid = object_size <= spindle_proto::msg::DATA_MAX as u64
                    && shard_offset % su == 0
                    && shard_len % su == 0
                    && data.len() as u64 == shard_len * total
                    && shard_offset + shard_len <= shard_size
                    && (!full || (shard_offset == 0 && shard_len == shard_size));
                if !valid {
                    let m = err(
                        ErrorCode::Invalid,
                        format!(
                            "erasure-coded write does not match the pool's layout {layout:?} \
                             (object {object_size} bytes, shard range {shard_offset}+{shard_len}, \
                             {} bytes of shards)",
                            data.len()
                        ),
                    );
                    return (m, None);
                }
                let target = current.map_or(0, |c| 1 - c.slot);
                let base = if full {
                    None
                } else {
                    current.map(|c| c.version)
                };
                let stored = slot_name(name, target);
                let seg = shard_len as usize;
                let written = self
                    .ec_replicate(epoch, pgid, mapping, &stored, |pos| {
                        let part = data[pos * seg..(pos + 1) * seg].to_vec();
                        WireMutation::EcPatch {
                            base,
                            object_size,
                            shard_size,
                            shard_offset,
                            data: part,
                        }
                    })
                    .await;
                let v = match written {
                    Ok(v) => v,
                    Err(m) => return (m, None),
                };
                // Acknowledged everywhere: the previous version's slot can go.
                let reply = Msg::ObjReply {
                    version: v,
                    size_bytes: object_size,
                    data: Vec::new(),
                    listing: Vec::new(),
                };
                return (reply, current.map(|c| c.slot));
            }
            ObjOp::Mutate(_) => err(
                ErrorCode::Invalid,
                "this pool is erasure-coded: writes must come encoded by the client \
                 (write_full / write / truncate of the spindle client library)",
            ),
        };
        (msg, None)
    }

    /// Writes one slot object on every up shard: assigns the version, queues the local
    /// write and sends each other copy its own mutation, in version order. Ok once every
    /// up copy (at least `min_size`) has it durable; on a failure the group re-peers (a
    /// half-applied write is rolled forward or back there).
    async fn ec_replicate(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        stored: &str,
        make: impl Fn(usize) -> WireMutation,
    ) -> Result<Ver, Msg> {
        let me = self.inner.id;
        let members: Vec<(usize, u32)> = mapping
            .shards
            .iter()
            .enumerate()
            .filter_map(|(pos, d)| d.map(|d| (pos, d)))
            .collect();
        let min_size = self
            .map_state()
            .and_then(|ms| ms.map.pools.get(&pgid.pool).map(|p| p.min_size()))
            .unwrap_or(u32::MAX);
        if !spindle_pg::rules::may_write_with(min_size, members.len()) {
            return Err(err(
                ErrorCode::Again,
                format!(
                    "only {} shards up, writes need min_size {min_size}",
                    members.len()
                ),
            ));
        }
        let mut conns = Vec::new();
        for &(_, d) in members.iter().filter(|(_, d)| *d != me) {
            match self.peer_conn(d).await {
                Ok(c) => conns.push((d, c)),
                Err(e) => return Err(err(ErrorCode::Again, e)),
            }
        }
        let mut pending = Vec::new();
        let local;
        let v;
        // A whole-object write (a new slot) or a delete: clears scrub's damage verdict.
        let mut replaces = false;
        {
            let mut pgs = crate::lock(&self.inner.pgs);
            let st = pgs
                .get_mut(&(pgid.pool, pgid.pg))
                .filter(|s| s.phase == Phase::Active && s.epoch == epoch)
                .ok_or_else(|| err(ErrorCode::Again, "placement group changed"))?;
            v = Ver {
                epoch,
                seq: st.last.seq + 1,
            };
            let mut mine = None;
            for &(pos, d) in &members {
                let m = make(pos);
                replaces |= matches!(
                    m,
                    WireMutation::Delete | WireMutation::EcPatch { base: None, .. }
                );
                if d == me {
                    mine = Some((pos, m));
                    continue;
                }
                let Some((_, conn)) = conns.iter().find(|(o, _)| *o == d) else {
                    return Err(err(ErrorCode::Internal, "no connection"));
                };
                let msg = Msg::RepWrite {
                    pool: pgid.pool,
                    pg: shard_pg(pgid.pg, Some(pos as u8)),
                    name: stored.to_string(),
                    version: v,
                    mutation: m,
                };
                match conn.start(epoch, &msg) {
                    Ok(p) => pending.push((d, p)),
                    Err(e) => return Err(err(ErrorCode::Again, e.to_string())),
                }
            }
            st.last = v;
            local = mine.map(|(pos, m)| {
                let own = PgId {
                    pool: pgid.pool,
                    pg: shard_pg(pgid.pg, Some(pos as u8)),
                };
                self.queue_shard_write(own, stored.to_string(), v, m)
            });
        }
        let timeout = self.inner.config.replica_timeout_ms;
        let mut failure = None;
        if let Some(rx) = local {
            match rx.await {
                Ok(Msg::Ok) => {}
                Ok(other) => failure = Some(format!("local shard: {other:?}")),
                Err(_) => failure = Some("local shard write dropped".to_string()),
            }
        }
        for (d, f) in crate::fanout::wait_all(pending, timeout).await.failures {
            if let crate::fanout::CopyFailure::NewerMap(map) = &f {
                let _ = self.install_map(map);
            }
            failure = Some(format!("osd.{d}: {f}"));
        }
        if let Some(f) = failure {
            tracing::info!(
                "osd.{me}: shard write {stored:?} v{v:?} in pg {pgid} failed: {f}; re-peering"
            );
            self.repeer(pgid, epoch);
            return Err(err(ErrorCode::Again, f));
        }
        if replaces {
            self.clear_damaged(pgid, stored);
        }
        Ok(v)
    }

    /// Starts peering again in the current epoch (after a failed erasure-coded write).
    pub(crate) fn repeer(&self, pgid: PgId, epoch: u64) {
        {
            let mut pgs = crate::lock(&self.inner.pgs);
            let Some(st) = pgs.get_mut(&(pgid.pool, pgid.pg)) else {
                return;
            };
            if st.epoch != epoch || st.phase != Phase::Active {
                return;
            }
            st.phase = Phase::Peering;
            st.recovery = None;
            // A new interval id: recovery tasks of the old one stop.
            st.since = st.since.max(epoch) + 1_000_000_000;
        }
        let osd = self.clone();
        tokio::spawn(async move { osd.peer_until_done(pgid.pool, pgid.pg, epoch).await });
    }

    /// Reads `slice` of shard `pos` from daemon `osd`, which holds that shard.
    async fn fetch_shard(
        &self,
        epoch: u64,
        pgid: PgId,
        pos: usize,
        osd: u32,
        slice: ShardSlice<'_>,
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        let ShardSlice {
            stored,
            version: want,
            offset,
            len,
        } = slice;
        let copy = PgId {
            pool: pgid.pool,
            pg: shard_pg(pgid.pg, Some(pos as u8)),
        };
        let reply = if osd == self.inner.id {
            self.shard_read(copy, stored, want, offset, len).await
        } else {
            let msg = Msg::ShardRead {
                pool: copy.pool,
                pg: copy.pg,
                name: stored.to_string(),
                version: want,
                offset,
                len,
            };
            let conn = self
                .peer_conn(osd)
                .await
                .map_err(|e| (ErrorCode::Again, e))?;
            match conn
                .call(epoch, &msg, self.inner.config.replica_timeout_ms)
                .await
            {
                Ok(inc) => inc.msg,
                Err(e) => return Err((ErrorCode::Again, format!("osd.{osd}: {e}"))),
            }
        };
        use spindle_proto::request::{reply_to, CallError};
        match reply_to::<spindle_proto::msg::typed::ShardRead>(reply) {
            Ok(r) => Ok(r.data),
            Err(CallError::Remote(e)) => Err((e.code, format!("osd.{osd}: {}", e.message))),
            Err(e) => Err((ErrorCode::Internal, format!("osd.{osd}: {e}"))),
        }
    }

    /// The object's size from a shard trailer (mine, else any other shard's).
    async fn ec_object_size(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        name: &str,
        c: Current,
    ) -> Result<u64, Msg> {
        let stored = slot_name(name, c.slot);
        let at = c.stored_bytes.saturating_sub(TRAILER_BYTES);
        let mut last = String::from("no shard up");
        for (pos, d) in mapping.shards.iter().enumerate() {
            let Some(d) = *d else { continue };
            match self
                .fetch_shard(
                    epoch,
                    pgid,
                    pos,
                    d,
                    ShardSlice {
                        stored: &stored,
                        version: c.version,
                        offset: at,
                        len: TRAILER_BYTES,
                    },
                )
                .await
            {
                Ok(t) => match parse_trailer(&t) {
                    Some(size) => return Ok(size),
                    None => last = format!("osd.{d}: bad shard trailer"),
                },
                Err((_, e)) => last = e,
            }
        }
        Err(err(
            ErrorCode::Corrupt,
            format!("{name}: no readable shard trailer ({last})"),
        ))
    }

    /// Reads `len` bytes at `offset` of object `name` (current slot `c`) of group `g`:
    /// only the data shards the range touches, decoding from parity when one is missing,
    /// stale or corrupt.
    async fn ec_read(&self, g: EcGroup<'_>, name: &str, c: Current, offset: u64, len: u64) -> Msg {
        let EcGroup {
            epoch,
            pgid,
            mapping,
            layout,
        } = g;
        let size = match self.ec_object_size(epoch, pgid, mapping, name, c).await {
            Ok(s) => s,
            Err(m) => return m,
        };
        let reply = |data: Vec<u8>| Msg::ObjReply {
            version: c.version,
            size_bytes: size,
            data,
            listing: Vec::new(),
        };
        let start = offset.min(size);
        let len = len.min(size - start);
        if len == 0 {
            return reply(Vec::new());
        }
        let su = layout.stripe_unit_bytes;
        let (first, end) = layout.stripe_range(start, len);
        let seg_off = first * su;
        let seg_len = (end - first) * su;
        // Data shards whose units the range touches.
        let needed: Vec<usize> = if end - first > 1 {
            (0..layout.k).collect()
        } else {
            let w = layout.stripe_width();
            let c0 = ((start % w) / su) as usize;
            let c1 = (((start + len - 1) % w) / su) as usize;
            (c0..=c1).collect()
        };
        let stored = slot_name(name, c.slot);
        let total = layout.total();
        let mut segs: Vec<Option<Vec<u8>>> = vec![None; total];
        let mut failed: Vec<(usize, u32, ErrorCode)> = Vec::new();
        let fetch = |pos: usize| {
            let stored = stored.clone();
            async move {
                let r = match mapping.shards.get(pos).copied().flatten() {
                    None => Err((ErrorCode::Again, "shard is down".to_string())),
                    Some(d) => self
                        .fetch_shard(
                            epoch,
                            pgid,
                            pos,
                            d,
                            ShardSlice {
                                stored: &stored,
                                version: c.version,
                                offset: seg_off,
                                len: seg_len,
                            },
                        )
                        .await
                        .map_err(|e| (e.0, e.1)),
                };
                (pos, r)
            }
        };
        for (pos, r) in futures::future::join_all(needed.iter().map(|&p| fetch(p))).await {
            match r {
                Ok(d) if d.len() as u64 == seg_len => segs[pos] = Some(d),
                Ok(_) => failed.push((pos, u32::MAX, ErrorCode::Io)),
                Err((code, e)) => {
                    tracing::debug!("osd.{}: shard {pos} of {name}: {e}", self.inner.id);
                    failed.push((pos, mapping.shards[pos].unwrap_or(u32::MAX), code))
                }
            }
        }
        if !failed.is_empty() {
            // Degraded: read other shards of the same stripes until k are at hand.
            let others: Vec<usize> = (0..total).filter(|p| !needed.contains(p)).collect();
            for (pos, r) in futures::future::join_all(others.iter().map(|&p| fetch(p))).await {
                match r {
                    Ok(d) if d.len() as u64 == seg_len => segs[pos] = Some(d),
                    Ok(_) => {}
                    Err((code, _)) => {
                        failed.push((pos, mapping.shards[pos].unwrap_or(u32::MAX), code))
                    }
                }
            }
            let present = segs.iter().filter(|s| s.is_some()).count();
            if present < layout.k {
                return err(
                    ErrorCode::Again,
                    format!(
                        "{name}: only {present} of the {} shards needed are readable",
                        layout.k
                    ),
                );
            }
            // Keep exactly k (reconstruct rebuilds at most m).
            let mut kept = 0;
            for s in segs.iter_mut() {
                if s.is_some() {
                    kept += 1;
                    if kept > layout.k {
                        *s = None;
                    }
                }
            }
            if let Err(e) = layout.reconstruct(&mut segs) {
                return err(ErrorCode::Corrupt, format!("{name}: decoding failed: {e}"));
            }
            // Corrupt shards get rebuilt (through recovery) in the background.
            let corrupt: Vec<u32> = failed
                .iter()
                .filter(|(_, d, code)| *code == ErrorCode::Corrupt && *d != u32::MAX)
                .map(|(_, d, _)| *d)
                .collect();
            if !corrupt.is_empty() {
                tracing::warn!(
                    "osd.{}: {name} in pg {pgid}: corrupt shard on {corrupt:?}; decoded, repairing",
                    self.inner.id
                );
                let osd = self.clone();
                let stored = stored.clone();
                tokio::spawn(async move {
                    match osd.ec_recover(pgid, &stored, &corrupt).await {
                        Ok(_) => {
                            OsdCounters::add(
                                &osd.inner.counters.corruptions_repaired,
                                corrupt.len() as u64,
                            );
                        }
                        Err(e) => tracing::error!("repairing {stored:?} failed: {e}"),
                    }
                });
            }
        }
        let data_segs: Vec<&[u8]> = segs[..layout.k]
            .iter()
            .map(|s| s.as_deref().unwrap_or(&[]))
            .collect();
        let mut out = Vec::with_capacity(len as usize);
        layout.gather(&data_segs, first, start, len, &mut out);
        reply(out)
    }

    /// Objects of the group (from this daemon's copy) with their sizes.
    async fn ec_list(&self, pgid: PgId) -> Msg {
        if self.primary_misses_objects(pgid).is_some() {
            return err(
                ErrorCode::Again,
                "the primary is still recovering its shards",
            );
        }
        let own = self.copy_pgid(pgid, self.inner.id);
        let store = &self.inner.store;
        let mut newest: BTreeMap<String, (Ver, String, u64)> = BTreeMap::new();
        for (stored, meta) in store.list(own) {
            let Some((name, _)) = split_slot(&stored) else {
                continue;
            };
            let v = meta.version;
            if newest.get(name).is_none_or(|(have, _, _)| *have < v) {
                newest.insert(name.to_string(), (v, stored.clone(), meta.size_bytes));
            }
        }
        let mut listing = Vec::with_capacity(newest.len());
        for (name, (v, stored, bytes)) in newest {
            let at = bytes.saturating_sub(TRAILER_BYTES);
            let size = match store.read(own, &stored, at, TRAILER_BYTES).await {
                Ok(t) => parse_trailer(&t).unwrap_or(0),
                Err(StoreError::NotFound) => continue,
                Err(_) => 0,
            };
            listing.push(ObjectListing {
                name,
                size_bytes: size,
                version: v,
            });
        }
        Msg::ObjReply {
            version: Ver::default(),
            size_bytes: 0,
            data: Vec::new(),
            listing,
        }
    }

    // ------------------------------------------------------------ recovery

    /// Peering of an erasure-coded group: (other daemons holding a shard copy of some
    /// position, members whose copy existed before). Empty for replicated groups.
    pub(crate) async fn ec_peer_sources(
        &self,
        pgid: PgId,
        epoch: u64,
        infos: &[(u32, spindle_pg::LogInfo)],
    ) -> (Vec<(usize, u32)>, Vec<u32>) {
        let Some(ms) = self.map_state() else {
            return (Vec::new(), Vec::new());
        };
        if !ms.map.pools.get(&pgid.pool).is_some_and(|p| p.is_erasure()) {
            return (Vec::new(), Vec::new());
        }
        let Some(mapping) = ms.placement.pg(pgid.pool, pgid.pg) else {
            return (Vec::new(), Vec::new());
        };
        let established = spindle_pg::rules::established(infos);
        let mut strays = Vec::new();
        let up: Vec<u32> = ms
            .map
            .osds
            .values()
            .filter(|o| o.up)
            .map(|o| o.id)
            .collect();
        for pos in 0..mapping.shards.len() {
            for &d in &up {
                if mapping.shards[pos] == Some(d) {
                    continue;
                }
                let copy = shard_pg(pgid.pg, Some(pos as u8));
                let has = if d == self.inner.id {
                    let info = self.inner.store.pg_info(PgId {
                        pool: pgid.pool,
                        pg: copy,
                    });
                    info.object_count > 0
                } else {
                    let q = spindle_proto::msg::typed::PgQuery {
                        pool: pgid.pool,
                        pg: copy,
                    };
                    matches!(
                        self.request_peer(d, epoch, q).await,
                        Ok(info) if info.last_version > Ver::default()
                    )
                };
                if has {
                    strays.push((pos, d));
                }
            }
        }
        (strays, established)
    }

    /// Rebuilds slot `stored` on the copies of `osds` from the other shards at the
    /// authoritative (newest) version, or rolls an unacknowledgeable version back.
    /// Returns the bytes written per copy.
    pub(crate) async fn ec_recover(
        &self,
        pgid: PgId,
        stored: &str,
        osds: &[u32],
    ) -> Result<u64, String> {
        let me = self.inner.id;
        let ms = self.map_state().ok_or("no map")?;
        let epoch = ms.map.epoch;
        let pool = ms.map.pools.get(&pgid.pool).ok_or("pool gone")?;
        let layout = self
            .ec_layout_of(&ms.map, pgid.pool)
            .ok_or("not an erasure-coded pool")?;
        let mapping = ms
            .placement
            .pg(pgid.pool, pgid.pg)
            .ok_or("no such group")?
            .clone();
        let members: Vec<(usize, u32)> = mapping
            .shards
            .iter()
            .enumerate()
            .filter_map(|(p, d)| d.map(|d| (p, d)))
            .collect();
        // Every up shard's state of the slot - the targets' too: a copy listed as missing
        // may hold the version already (its log lags after an earlier recovery), and then
        // it counts towards the k shards. An unreadable shard counts as absent.
        let mut states: Vec<(usize, u32, ShardState)> = Vec::new();
        // Positions whose member could not answer (unreachable, or its copy unreadable):
        // they may hold any version, so they never count as "does not have it".
        let mut unanswered: Vec<usize> = Vec::new();
        for &(pos, d) in &members {
            let copy = PgId {
                pool: pgid.pool,
                pg: shard_pg(pgid.pg, Some(pos as u8)),
            };
            let state = match self.shard_state(epoch, copy, d, stored).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::info!("osd.{me}: shard {pos} of {stored:?} on osd.{d}: {e}");
                    unanswered.push(pos);
                    None
                }
            };
            let valid = |data: &Vec<u8>| {
                parse_trailer(&data[data.len().saturating_sub(TRAILER_BYTES as usize)..]).is_some()
            };
            if state.as_ref().is_some_and(|(data, _)| !valid(data)) {
                unanswered.push(pos);
            }
            let state = state.filter(|(data, _)| valid(data));
            states.push((pos, d, state));
        }
        // Copies of positions held elsewhere (left from before a position moved).
        let (strays, established) = {
            let pgs = crate::lock(&self.inner.pgs);
            match pgs
                .get(&(pgid.pool, pgid.pg))
                .and_then(|st| st.recovery.as_ref())
            {
                Some(r) => (r.ec_strays.clone(), r.ec_established.clone()),
                None => (Vec::new(), members.iter().map(|(_, d)| *d).collect()),
            }
        };
        let mut stray_states: Vec<(usize, ShardState)> = Vec::new();
        let mut stray_failed: Vec<bool> = Vec::new();
        for &(pos, d) in &strays {
            let copy = PgId {
                pool: pgid.pool,
                pg: shard_pg(pgid.pg, Some(pos as u8)),
            };
            let state = match self.shard_state(epoch, copy, d, stored).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::info!("osd.{me}: stray shard {pos} of {stored:?} on osd.{d}: {e}");
                    unanswered.push(pos);
                    stray_failed.push(true);
                    stray_states.push((pos, None));
                    continue;
                }
            };
            stray_failed.push(false);
            stray_states.push((pos, state));
        }
        // The decision is spindle_pg's (roll forward, roll back, wait); here only the
        // bytes move.
        let answer = |s: &ShardState| match s {
            None => ShardAnswer::Absent,
            Some((_, v)) => ShardAnswer::Present(*v),
        };
        let mut view = SlotView {
            k: layout.k,
            total: layout.total(),
            min_size: pool.min_size(),
            members: vec![None; layout.total()],
            strays: Vec::new(),
            established: established.clone(),
        };
        for (pos, d, s) in &states {
            let a = if unanswered.contains(pos) && s.is_none() {
                ShardAnswer::Unknown
            } else {
                answer(s)
            };
            if let Some(slot) = view.members.get_mut(*pos) {
                *slot = Some((*d, a));
            }
        }
        // A stray that failed: its position is unknown (like the original `unanswered`).
        for (i, (pos, s)) in stray_states.iter().enumerate() {
            let failed = stray_failed.get(i).copied().unwrap_or(false);
            view.strays.push((
                *pos,
                if failed {
                    ShardAnswer::Unknown
                } else {
                    answer(s)
                },
            ));
        }
        let copy_of = |pos: usize| PgId {
            pool: pgid.pool,
            pg: shard_pg(pgid.pg, Some(pos as u8)),
        };
        let (v, sources, targets) = match decide_slot(&view) {
            SlotDecision::Deleted => {
                // Nobody has it: it is deleted; make sure the targets agree.
                for &(pos, d) in members.iter().filter(|(_, d)| osds.contains(d)) {
                    self.push_shard(epoch, copy_of(pos), d, stored, None)
                        .await?;
                }
                return Ok(0);
            }
            SlotDecision::Wait { version, holding } => {
                return Err(format!(
                    "{stored:?} v{version:?}: only {holding} shards reachable, {} needed; \
                     waiting for more",
                    layout.k
                ));
            }
            SlotDecision::RollBack { version } => {
                // Never acknowledged (it could not have reached min_size shards).
                tracing::warn!(
                    "osd.{me}: pg {pgid}: rolling back unacknowledged {stored:?} v{version:?}"
                );
                for &(pos, d) in &members {
                    self.push_shard(epoch, copy_of(pos), d, stored, None)
                        .await?;
                }
                return Ok(0);
            }
            SlotDecision::Rebuild {
                version,
                sources,
                targets,
            } => (version, sources, targets),
        };
        // Per position, a copy at version v (the member's own, else a stray's).
        let mut at_v: Vec<Option<Vec<u8>>> = vec![None; layout.total()];
        for (pos, _, s) in states.iter_mut() {
            if let Some((data, sv)) = s.take() {
                if sv == v {
                    at_v[*pos] = Some(data);
                }
            }
        }
        for (pos, s) in stray_states {
            if let Some((data, sv)) = s {
                if sv == v && at_v[pos].is_none() {
                    at_v[pos] = Some(data);
                }
            }
        }
        // Decode the shards every other member needs from k good ones.
        let mut segs: Vec<Option<Vec<u8>>> = vec![None; layout.total()];
        let mut trailer_bytes = Vec::new();
        for &pos in &sources {
            if let Some(mut data) = at_v[pos].take() {
                let cut = data.len().saturating_sub(TRAILER_BYTES as usize);
                trailer_bytes = data.split_off(cut);
                segs[pos] = Some(data);
            }
        }
        if parse_trailer(&trailer_bytes).is_none() {
            return Err(format!("{stored:?}: bad shard trailer"));
        }
        layout
            .reconstruct(&mut segs)
            .map_err(|e| format!("decoding {stored:?}: {e}"))?;
        let mut bytes = 0;
        for &(pos, d) in members.iter().filter(|(p, _)| targets.contains(p)) {
            let mut data = segs[pos].clone().unwrap_or_default();
            data.extend_from_slice(&trailer_bytes);
            bytes = data.len() as u64;
            self.push_shard(epoch, copy_of(pos), d, stored, Some((data, v)))
                .await?;
        }
        Ok(bytes)
    }

    /// The state of slot `stored` in copy `copy` on `osd` (this daemon's store, or pulled);
    /// Err when that copy cannot say (unreachable, or unreadable).
    async fn shard_state(
        &self,
        epoch: u64,
        copy: PgId,
        osd: u32,
        stored: &str,
    ) -> Result<ShardState, String> {
        if osd != self.inner.id {
            return self.pull(osd, epoch, copy, stored).await;
        }
        let Some(meta) = self.inner.store.stat(copy, stored) else {
            return Ok(None);
        };
        let data = self
            .inner
            .store
            .read(copy, stored, 0, meta.size_bytes)
            .await
            .map_err(|e| format!("reading my shard {stored:?}: {e}"))?;
        Ok(Some((data, meta.version)))
    }

    async fn push_shard(
        &self,
        epoch: u64,
        copy: PgId,
        osd: u32,
        stored: &str,
        state: Option<(Vec<u8>, Ver)>,
    ) -> Result<(), String> {
        if osd == self.inner.id {
            let guard = self.inflight_begin(copy);
            let r = self
                .inner
                .store
                .recover_object(copy, stored, state)
                .await
                .map_err(|e| format!("recovering {stored:?} locally: {e}"));
            drop(guard);
            return r;
        }
        let (version, data) = match state {
            Some((d, v)) => (Some(v), d),
            None => (None, Vec::new()),
        };
        let req = spindle_proto::msg::typed::ObjState {
            pool: copy.pool,
            pg: copy.pg,
            name: stored.to_string(),
            version,
            data,
        };
        self.request_peer(osd, epoch, req).await.map(|_| ())
    }
}
