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
use spindle_proto::net::{Prepared, Replier, BULK_SPARE_BYTES};

// A received whole shard takes its trailer without moving.
const _: () = assert!(TRAILER_BYTES as usize <= BULK_SPARE_BYTES);
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{Mutation, PgId, StoreError};
use spindle_trace::Stage;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

use spindle_map::ec::delta::{DeltaSlot, DELTA_EXTENTS_MAX, DELTA_PAYLOAD_BYTES_MAX};
use spindle_map::ec::parse_any_trailer;
use spindle_pg::ec::SLOT_POSITIONS;
pub(crate) use spindle_pg::ec::{
    all_slot_names, delta_slot_name, is_delta_slot, slot_name, split_slot,
};

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
    /// A delta slot (`o\0d` + position) rather than a whole shard.
    delta: bool,
    version: Ver,
    stored_bytes: u64,
}

impl Current {
    /// The slot object's stored name.
    fn stored(&self, name: &str) -> String {
        if self.delta {
            delta_slot_name(name, self.slot)
        } else {
            slot_name(name, self.slot)
        }
    }
}

/// The logical bytes of a slot: for a whole-shard slot its stored bytes (shard, then
/// trailer); for a delta slot the shard's bytes (its base's with the changed ranges laid
/// over them) followed by a whole-shard trailer, i.e. what a whole-shard slot at the same
/// version would hold.
struct SlotRead {
    data: Vec<u8>,
    /// Logical size of the slot (shard size + trailer).
    logical_bytes: u64,
    version: Ver,
}

/// An erasure-coded write, encoded: each shard position's bytes for shard range
/// `[shard_offset, shard_offset + shard_len)` in a buffer of its own (moved into the
/// message or the local store write, never copied), with room for a slot trailer.
struct EncodedWrite {
    object_size: u64,
    shard_offset: u64,
    shard_len: u64,
    /// Replaces the object (no base version).
    full: bool,
    /// The version the write is based on (a partial write).
    expect: Option<Ver>,
    shards: Vec<Vec<u8>>,
}

/// A whole-object write encoded into all its shards (replaces the object: no read). The
/// error is the reply, like every helper here (the async ones are not linted for it).
#[allow(clippy::result_large_err)]
fn ec_encode_whole(layout: &EcLayout, data: &[u8]) -> Result<EncodedWrite, Msg> {
    let size = data.len() as u64;
    if size > spindle_proto::msg::DATA_MAX as u64 {
        return Err(err(
            ErrorCode::Invalid,
            "object larger than the largest object",
        ));
    }
    let stripes = layout.stripes(size);
    let shards = layout
        .encode_shards(data, stripes, TRAILER_BYTES as usize)
        .map_err(|e| err(ErrorCode::Invalid, e.to_string()))?;
    Ok(EncodedWrite {
        object_size: size,
        shard_offset: 0,
        shard_len: stripes * layout.stripe_unit_bytes,
        full: true,
        expect: None,
        shards,
    })
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
    /// The group's interval id when the operation looked at the object
    /// (`PgState::since`, which a re-peer bumps): its write is refused if the group
    /// re-peered since, because its view of the object's current slot may predate the
    /// settling of a failed write.
    since: u64,
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
        while let Some(mut job) = rx.recv().await {
            let store = self.inner.store.clone();
            let compose_start = spindle_trace::now();
            let composed = self.compose_shard(stored, &mut job).await;
            spindle_trace::record(Stage::EcShardCompose, compose_start);
            let commit_start = spindle_trace::now();
            let commit = match composed {
                Ok(m) => store.apply(stored, &job.name, job.version, m),
                Err(msg) => {
                    let _ = job.done.send(msg);
                    continue;
                }
            };
            let (guard, done) = (job.guard, job.done);
            tokio::spawn(async move {
                // The shard's writer may have given up meanwhile: nobody to tell.
                let committed = commit.await;
                spindle_trace::record(Stage::EcShardCommit, commit_start);
                let _ = done.send(crate::commit_reply(committed, Some(guard)));
            });
        }
    }

    /// The store mutation for a shard write (reading the base slot of a partial write).
    /// A whole shard's bytes move into the mutation (taken from the job).
    async fn compose_shard(&self, stored: PgId, job: &mut ShardJob) -> Result<Mutation, Msg> {
        match &mut job.mutation {
            WireMutation::Delete => Ok(Mutation::Delete),
            WireMutation::EcPatch {
                base,
                object_size,
                shard_size,
                shard_offset,
                delta_base,
                data,
            } => {
                let (base, delta_base): (&Option<Ver>, &Option<u8>) = (base, delta_base);
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
                let (name, _) = split_slot(&job.name)
                    .ok_or_else(|| err(ErrorCode::Invalid, "not a shard slot name"))?;
                if is_delta_slot(&job.name) != delta_base.is_some()
                    || delta_base.is_some_and(|p| p >= SLOT_POSITIONS)
                {
                    return Err(err(
                        ErrorCode::Invalid,
                        "a delta slot takes a delta write and a whole-shard slot a whole shard",
                    ));
                }
                // The slot holding the version the write is based on (any position).
                let found = match base {
                    None => None,
                    Some(bv) => Some(self.slot_at_version(stored, name, *bv).ok_or_else(|| {
                        err(
                            ErrorCode::Conflict,
                            format!("{name}: no slot at the expected version {bv}"),
                        )
                    })?),
                };
                if let (Some(p), Some(bv), Some(cur)) = (delta_base, base, found.as_ref()) {
                    if let Some(raw) = self
                        .compose_delta(
                            stored,
                            name,
                            *p,
                            *bv,
                            cur,
                            *object_size,
                            *shard_size,
                            *shard_offset,
                            data,
                        )
                        .await?
                    {
                        OsdCounters::bump(&self.inner.counters.ec_delta_writes);
                        return Ok(Mutation::WriteFull(raw));
                    }
                }
                // A whole shard: the base's logical bytes (if any), patched.
                let mut content = match (base, found) {
                    (Some(bv), Some(cur)) => {
                        let logical = self.read_slot(stored, &cur, Some(*bv), 0, u64::MAX).await?;
                        let mut bytes = logical.data;
                        let keep = logical.logical_bytes.saturating_sub(TRAILER_BYTES);
                        bytes.truncate(keep.min(*shard_size) as usize);
                        bytes
                    }
                    _ => Vec::new(),
                };
                if base.is_none() && *shard_offset == 0 && end == *shard_size {
                    // A whole shard: its own buffer, which has room for the trailer (see
                    // `encode_shards` and the frame reader's spare capacity).
                    content = std::mem::take(data);
                    content.reserve_exact(TRAILER_BYTES as usize);
                } else {
                    content.resize(*shard_size as usize, 0);
                    content[*shard_offset as usize..end as usize].copy_from_slice(data);
                }
                if delta_base.is_some() {
                    // This copy cannot write a delta over the base the primary named: a
                    // delta covering the whole shard (needs no base).
                    OsdCounters::bump(&self.inner.counters.ec_delta_fallbacks);
                    return Ok(Mutation::WriteFull(
                        DeltaSlot::whole(*object_size, *shard_size).encode(&content),
                    ));
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

    /// A delta slot over the whole-shard slot at position `p`, if this copy can write one:
    /// the slot at `bv` (`cur`) is that whole shard, or a delta over it; the shard keeps
    /// its size. None: write a whole shard instead.
    #[allow(clippy::too_many_arguments)]
    async fn compose_delta(
        &self,
        stored: PgId,
        name: &str,
        p: u8,
        bv: Ver,
        cur: &str,
        object_size: u64,
        shard_size: u64,
        shard_offset: u64,
        data: &[u8],
    ) -> Result<Option<Vec<u8>>, Msg> {
        let store = &self.inner.store;
        let Some(meta) = store.stat(stored, cur) else {
            return Ok(None);
        };
        if !is_delta_slot(cur) {
            let same = split_slot(cur).is_some_and(|(_, pos)| pos == p)
                && meta.size_bytes == shard_size + TRAILER_BYTES;
            if !same {
                return Ok(None);
            }
            let d = DeltaSlot::over(
                (p, bv),
                object_size,
                shard_size,
                shard_offset,
                data.len() as u64,
            );
            if data.is_empty() {
                return Ok(None);
            }
            return Ok(Some(d.encode(data)));
        }
        let raw = store
            .read(stored, cur, 0, meta.size_bytes)
            .await
            .map_err(|e| store_error_reply(&e))?;
        let Ok((d, payload)) = DeltaSlot::parse(&raw) else {
            return Ok(None);
        };
        let base_ok = match d.base {
            Some((bp, bver)) => {
                bp == p
                    && store.stat(stored, &slot_name(name, bp)).is_some_and(|m| {
                        m.version == bver && m.size_bytes == shard_size + TRAILER_BYTES
                    })
            }
            None => false,
        };
        if !base_ok || d.shard_size != shard_size || d.extents.len() >= DELTA_EXTENTS_MAX {
            return Ok(None);
        }
        let (nd, np) = d.with_patch(payload, object_size, shard_offset, data);
        Ok(Some(nd.encode(&np)))
    }

    /// The stored name of the slot of `name` at version `v` on copy `own`.
    fn slot_at_version(&self, own: PgId, name: &str, v: Ver) -> Option<String> {
        let store = &self.inner.store;
        all_slot_names(name)
            .into_iter()
            .find(|n| store.stat(own, n).is_some_and(|m| m.version == v))
    }

    /// Logical bytes `[offset, offset + len)` (clipped to the slot) of slot `stored` on
    /// copy `own`, which must be at version `want` if given. A delta slot whose base is
    /// not here at the version it names answers `Conflict` (this copy cannot say).
    async fn read_slot(
        &self,
        own: PgId,
        stored: &str,
        want: Option<Ver>,
        offset: u64,
        len: u64,
    ) -> Result<SlotRead, Msg> {
        let store = &self.inner.store;
        let Some(meta) = store.stat(own, stored) else {
            return Err(err(
                ErrorCode::NotFound,
                format!("{stored:?}: no such shard"),
            ));
        };
        if want.is_some_and(|w| w != meta.version) {
            return Err(err(ErrorCode::Conflict, "shard is at another version"));
        }
        if !is_delta_slot(stored) {
            let start = offset.min(meta.size_bytes);
            let n = len.min(meta.size_bytes - start);
            let data = store
                .read(own, stored, start, n)
                .await
                .map_err(|e| store_error_reply(&e))?;
            return Ok(SlotRead {
                data,
                logical_bytes: meta.size_bytes,
                version: meta.version,
            });
        }
        let raw = store
            .read(own, stored, 0, meta.size_bytes)
            .await
            .map_err(|e| store_error_reply(&e))?;
        let (d, payload) = DeltaSlot::parse(&raw)
            .map_err(|e| err(ErrorCode::Corrupt, format!("{stored:?}: {e}")))?;
        let logical_bytes = d.shard_size + TRAILER_BYTES;
        let start = offset.min(logical_bytes);
        let n = len.min(logical_bytes - start);
        let mut out = vec![0u8; n as usize];
        // The shard part: the base's bytes, then the changed ranges over them.
        let shard_end = (start + n).min(d.shard_size);
        if let Some((bp, bver)) = d.base {
            if start < shard_end {
                let (name, _) = split_slot(stored)
                    .ok_or_else(|| err(ErrorCode::Invalid, "not a shard slot name"))?;
                let base_name = slot_name(name, bp);
                let base = store.stat(own, &base_name).filter(|m| m.version == bver);
                let Some(base) = base else {
                    return Err(err(
                        ErrorCode::Conflict,
                        format!("{stored:?}: the base of this delta is not here"),
                    ));
                };
                let base_shard = base.size_bytes.saturating_sub(TRAILER_BYTES);
                let b_end = shard_end.min(base_shard);
                if start < b_end {
                    let bytes = store
                        .read(own, &base_name, start, b_end - start)
                        .await
                        .map_err(|e| store_error_reply(&e))?;
                    out[..bytes.len()].copy_from_slice(&bytes);
                }
            }
        }
        d.overlay(
            payload,
            start,
            &mut out[..(shard_end.max(start) - start) as usize],
        );
        // The trailer part.
        let t = trailer(d.object_size);
        for (i, b) in out.iter_mut().enumerate() {
            let at = start + i as u64;
            if at >= d.shard_size {
                *b = t[(at - d.shard_size) as usize];
            }
        }
        Ok(SlotRead {
            data: out,
            logical_bytes,
            version: meta.version,
        })
    }

    /// `ObjPull` of a slot object of a shard copy: its logical bytes (a delta slot comes
    /// back as the whole shard it stands for).
    pub(crate) async fn pull_slot_state(&self, own: PgId, stored: &str) -> Msg {
        match self.read_slot(own, stored, None, 0, u64::MAX).await {
            Ok(r) => Msg::ObjState {
                pool: own.pool,
                pg: own.pg,
                name: stored.to_string(),
                version: Some(r.version),
                data: r.data,
            },
            Err(Msg::Error {
                code: ErrorCode::NotFound,
                ..
            }) => Msg::ObjState {
                pool: own.pool,
                pg: own.pg,
                name: stored.to_string(),
                version: None,
                data: Vec::new(),
            },
            Err(m) => m,
        }
    }

    /// `ShardRead`: a byte range of a slot at an exact version (logical bytes).
    pub(crate) async fn shard_read(
        &self,
        stored: PgId,
        name: &str,
        want: Ver,
        offset: u64,
        len: u64,
    ) -> Msg {
        match self.read_slot(stored, name, Some(want), offset, len).await {
            Ok(r) => Msg::ObjReply {
                version: want,
                size_bytes: r.logical_bytes,
                data: r.data,
                listing: Vec::new(),
            },
            Err(m) => m,
        }
    }

    // ------------------------------------------------------------ primary side

    /// The newest slot of `name` on this daemon's copy.
    fn current_slot(&self, own: PgId, name: &str) -> Option<Current> {
        let store = &self.inner.store;
        (0..SLOT_POSITIONS)
            .flat_map(|slot| [(slot, false), (slot, true)])
            .filter_map(|(slot, delta)| {
                let stored = if delta {
                    delta_slot_name(name, slot)
                } else {
                    slot_name(name, slot)
                };
                store.stat(own, &stored).map(|m| Current {
                    slot,
                    delta,
                    version: m.version,
                    stored_bytes: m.size_bytes,
                })
            })
            .max_by_key(|c| c.version)
    }

    /// Slot objects of `name` on this daemon's copy other than `keep`.
    fn other_slots(&self, own: PgId, name: &str, keep: &[String]) -> Vec<String> {
        let store = &self.inner.store;
        all_slot_names(name)
            .into_iter()
            .filter(|n| !keep.contains(n) && store.stat(own, n).is_some())
            .collect()
    }

    /// Where a write of `shard_len` bytes per shard at the current slot `c` goes:
    /// (target stored name, `delta_base`, the slots to keep after it is acknowledged).
    /// A small overwrite of a shard that keeps its size becomes a delta slot over the
    /// current whole shard, or a cumulative delta over the current delta's base while the
    /// changed bytes stay under `DELTA_PAYLOAD_BYTES_MAX`; anything else a whole shard.
    /// The target is a position holding neither the current slot nor its base.
    async fn plan_write(
        &self,
        own: PgId,
        name: &str,
        current: Option<Current>,
        partial: bool,
        shard_size: u64,
        shard_len: u64,
    ) -> Result<(String, Option<u8>, Vec<String>), Msg> {
        let Some(c) = current else {
            return Ok((slot_name(name, 0), None, vec![slot_name(name, 0)]));
        };
        // The current delta's base position (its header, a small read).
        let mut cur_delta = None;
        if c.delta {
            let stored = c.stored(name);
            let raw = self
                .inner
                .store
                .read(own, &stored, 0, c.stored_bytes)
                .await
                .map_err(|e| store_error_reply(&e))?;
            match DeltaSlot::parse(&raw) {
                Ok((d, _)) => cur_delta = Some(d),
                Err(e) => {
                    // Without its base position the target could overwrite that base:
                    // refuse, and rebuild this copy's slot from the others.
                    let osd = self.clone();
                    let (me, pgid) = (
                        self.inner.id,
                        PgId {
                            pool: own.pool,
                            pg: spindle_map::split_shard_pg(own.pg).0,
                        },
                    );
                    tokio::spawn(async move {
                        if let Err(e) = osd.ec_recover(pgid, &stored, &[me]).await {
                            tracing::error!("repairing {stored:?} failed: {e}");
                        }
                    });
                    return Err(err(
                        ErrorCode::Again,
                        format!("{name}: current delta slot unreadable ({e}); repairing"),
                    ));
                }
            }
        }
        let base_pos = cur_delta.as_ref().and_then(|d| d.base.map(|(p, _)| p));
        let target_pos = (0..SLOT_POSITIONS)
            .find(|&p| p != c.slot && Some(p) != base_pos)
            .ok_or_else(|| err(ErrorCode::Internal, "no free slot position"))?;
        let delta_base = if !partial || shard_size <= DELTA_PAYLOAD_BYTES_MAX {
            None
        } else {
            match &cur_delta {
                None if c.stored_bytes == shard_size + TRAILER_BYTES
                    && shard_len <= DELTA_PAYLOAD_BYTES_MAX =>
                {
                    Some(c.slot)
                }
                Some(d)
                    if d.base.is_some()
                        && d.shard_size == shard_size
                        && d.extents.len() + 1 < DELTA_EXTENTS_MAX
                        && d.payload_bytes() + shard_len <= DELTA_PAYLOAD_BYTES_MAX =>
                {
                    base_pos
                }
                _ => None,
            }
        };
        Ok(match delta_base {
            Some(p) => (
                delta_slot_name(name, target_pos),
                Some(p),
                vec![delta_slot_name(name, target_pos), slot_name(name, p)],
            ),
            None => (
                slot_name(name, target_pos),
                None,
                vec![slot_name(name, target_pos)],
            ),
        })
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
        // A program runs on a decoded copy of each object (read under its lock, one at a
        // time), outside the locks.
        if let ObjOp::Exec(exec) = op {
            let source = crate::exec::Source::Ec {
                mapping: mapping.clone(),
                layout: layout.clone(),
            };
            let msg = self
                .exec_op(epoch, pgid, name.to_string(), exec, source)
                .await;
            reply.send_owned(rid, epoch, msg);
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
        let lock = self.ec_object_lock(pgid, name);
        {
            let wait_start = spindle_trace::now();
            let _held = lock.lock().await;
            spindle_trace::record(Stage::EcLockWait, wait_start);
            let (msg, trim) = self
                .ec_locked_op(epoch, pgid, mapping, layout, name, op)
                .await;
            // The client has its answer; the old slots go while the object stays locked
            // (the next write would otherwise target one of them).
            reply.send_owned(rid, epoch, msg);
            let trim_start = spindle_trace::now();
            for old in &trim {
                if let Err(m) = self
                    .ec_replicate(epoch, pgid, mapping, None, old, |_| WireMutation::Delete)
                    .await
                {
                    tracing::info!(
                        "osd.{}: trimming the old slot {old:?} failed: {m:?}",
                        self.inner.id
                    );
                    break;
                }
            }
            if !trim.is_empty() {
                spindle_trace::record(Stage::EcTrim, trim_start);
            }
        }
        self.ec_object_unlock(pgid, name, lock);
    }

    /// The current version of an object of an erasure-coded group (as its primary's
    /// shard knows it), None if it does not exist.
    pub(crate) fn ec_current_version(&self, pgid: PgId, name: &str) -> Option<Ver> {
        let own = self.copy_pgid(pgid, self.inner.id);
        self.current_slot(own, name).map(|c| c.version)
    }

    /// Reads a whole object of an erasure-coded group, under its lock (a program run's
    /// input).
    pub(crate) async fn ec_read_whole(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &EcLayout,
        name: &str,
    ) -> Msg {
        let read = ObjOp::Read {
            offset: 0,
            len: spindle_types::limits::OBJECT_BYTES_MAX,
        };
        self.ec_op_locked(epoch, pgid, mapping, layout, name, read)
            .await
    }

    /// For a shard-local program run: the object's current slot object (its stored
    /// name), size and version. The size and version are settled under the object's lock
    /// (never a write in progress; the group active, the object recovered on every copy);
    /// the slot named after it must still be at that version, else `Again`.
    pub(crate) async fn ec_exec_slot(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &EcLayout,
        name: &str,
    ) -> Result<(String, u64, Ver), Msg> {
        match self
            .ec_op_locked(epoch, pgid, mapping, layout, name, ObjOp::Stat)
            .await
        {
            Msg::ObjReply {
                version,
                size_bytes,
                ..
            } => {
                let own = self.copy_pgid(pgid, self.inner.id);
                match self.current_slot(own, name) {
                    Some(c) if c.version == version => Ok((c.stored(name), size_bytes, version)),
                    _ => Err(err(ErrorCode::Again, format!("{name}: changed, try again"))),
                }
            }
            other => Err(other),
        }
    }

    /// A read or stat of an object of an erasure-coded group, under its lock, for a
    /// program run (a name no object can have is `NotFound`).
    async fn ec_op_locked(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &EcLayout,
        name: &str,
        op: ObjOp,
    ) -> Msg {
        if name.contains('\0') || name.len() > spindle_types::limits::EC_OBJECT_NAME_BYTES_MAX {
            return err(ErrorCode::NotFound, format!("{name}: no such object"));
        }
        let lock = self.ec_object_lock(pgid, name);
        let msg = {
            let _held = lock.lock().await;
            self.ec_locked_op(epoch, pgid, mapping, layout, name, op)
                .await
                .0
        };
        self.ec_object_unlock(pgid, name, lock);
        msg
    }

    /// The primary's operation lock of an object (made on first use).
    fn ec_object_lock(&self, pgid: PgId, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = crate::lock(&self.inner.ec_locks);
        locks
            .entry((pgid, name.to_string()))
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone()
    }

    /// Gives `lock` back, dropping the entry when no one else holds or waits for it.
    fn ec_object_unlock(&self, pgid: PgId, name: &str, lock: Arc<tokio::sync::Mutex<()>>) {
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
    ) -> (Msg, Vec<String>) {
        // Not while the group peers (a failed write re-peers it: its recovery state, which
        // says what is missing, is rebuilt at activation).
        let active = crate::lock(&self.inner.pgs)
            .get(&(pgid.pool, pgid.pg))
            .is_some_and(|st| st.phase == Phase::Active);
        if !active {
            return (
                err(ErrorCode::Again, format!("pg {pgid} is peering")),
                Vec::new(),
            );
        }
        // Every slot must be present on every copy that should have it.
        let since = self.interval_of(pgid).unwrap_or(0);
        for stored in all_slot_names(name) {
            if self.object_missing(pgid, &stored, false) {
                if let Err(e) = self.ensure_recovered(pgid, since, &stored).await {
                    return (err(ErrorCode::Again, e), Vec::new());
                }
            }
        }
        let own = self.copy_pgid(pgid, self.inner.id);
        let current = self.current_slot(own, name);
        // Plain overwrites and truncates are encoded here (read-modify-write of the
        // touched stripes under the object's lock: no version race, no client round trip).
        let g = EcGroup {
            epoch,
            pgid,
            mapping,
            layout,
            since,
        };
        let encoded = match op {
            ObjOp::Mutate(WireMutation::Write { offset, ref data }) => Some(
                self.ec_encode_update(g, name, current, Some((offset, data)), None)
                    .await,
            ),
            ObjOp::Mutate(WireMutation::WriteFull(ref data)) => Some(ec_encode_whole(layout, data)),
            ObjOp::Mutate(WireMutation::Truncate { size_bytes }) => Some(
                self.ec_encode_update(g, name, current, None, Some(size_bytes))
                    .await,
            ),
            _ => None,
        };
        if let Some(encoded) = encoded {
            return match encoded {
                Ok(w) => self.ec_write_encoded(g, name, own, current, w).await,
                Err(m) => (m, Vec::new()),
            };
        }
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
                Some(c) => self.ec_read(g, name, c, None, offset, len).await,
            },
            ObjOp::List => self.ec_list(pgid).await,
            ObjOp::Mutate(WireMutation::Delete) => {
                let Some(c) = current else {
                    return (
                        err(ErrorCode::NotFound, format!("{name}: no such object")),
                        Vec::new(),
                    );
                };
                // A current delta needs its base: deleting either first could leave a
                // delta without a base, or resurrect the base's older version, if the
                // daemon crashed in between. Rewrite the object as a whole shard first.
                let c = if c.delta {
                    match self.ec_materialize(g, name, own, c).await {
                        Ok(c) => c,
                        Err(m) => return (m, Vec::new()),
                    }
                } else {
                    c
                };
                // The old slots first, the current (whole-shard) one last: a crash in
                // between leaves the object intact.
                let cur = c.stored(name);
                let mut order = self.other_slots(own, name, std::slice::from_ref(&cur));
                order.sort_by_key(|n| std::cmp::Reverse(is_delta_slot(n)));
                order.push(cur);
                for stored in order {
                    if let Err(m) = self
                        .ec_replicate(epoch, pgid, mapping, Some(since), &stored, |_| {
                            WireMutation::Delete
                        })
                        .await
                    {
                        return (m, Vec::new());
                    }
                }
                Msg::ObjReply {
                    version: c.version,
                    size_bytes: 0,
                    data: Vec::new(),
                    listing: Vec::new(),
                }
            }
            // Sender-encoded shards (`EcWrite`) included: the primary encodes, so that
            // the shards it writes are always its own encoding of the bytes it was sent.
            ObjOp::Exec(_) => err(ErrorCode::Internal, "a program run reached the object lock"),
            ObjOp::Mutate(_) => err(
                ErrorCode::Invalid,
                "this pool is erasure-coded: objects take whole writes, writes, truncates \
                 and deletes (send the object's bytes: the primary encodes them)",
            ),
        };
        (msg, Vec::new())
    }

    /// Writes an encoded write as a new slot on every up shard (a delta slot where it
    /// pays off, see `plan_write`), then names the slots to trim.
    async fn ec_write_encoded(
        &self,
        g: EcGroup<'_>,
        name: &str,
        own: PgId,
        current: Option<Current>,
        w: EncodedWrite,
    ) -> (Msg, Vec<String>) {
        let EncodedWrite {
            object_size,
            shard_offset,
            shard_len,
            full,
            expect,
            shards,
        } = w;
        let layout = g.layout;
        if !full && expect != current.map(|c| c.version) {
            return (
                err(
                    ErrorCode::Conflict,
                    format!("{name} changed since the version the write is based on"),
                ),
                Vec::new(),
            );
        }
        let su = layout.stripe_unit_bytes;
        let shard_size = layout.shard_size(object_size);
        let valid = object_size <= spindle_proto::msg::DATA_MAX as u64
            && shard_offset % su == 0
            && shard_len % su == 0
            && shards.len() == layout.total()
            && shards.iter().all(|b| b.len() as u64 == shard_len)
            && shard_offset + shard_len <= shard_size
            && (!full || (shard_offset == 0 && shard_len == shard_size));
        if !valid {
            let m = err(
                ErrorCode::Invalid,
                format!(
                    "erasure-coded write does not match the pool's layout {layout:?} \
                     (object {object_size} bytes, shard range {shard_offset}+{shard_len}, \
                     {} shard buffers)",
                    shards.len()
                ),
            );
            return (m, Vec::new());
        }
        let base = if full {
            None
        } else {
            current.map(|c| c.version)
        };
        let planned = self
            .plan_write(own, name, current, base.is_some(), shard_size, shard_len)
            .await;
        let (stored, delta_base, keep) = match planned {
            Ok(p) => p,
            Err(m) => return (m, Vec::new()),
        };
        let write_start = spindle_trace::now();
        let mut shards: Vec<Option<Vec<u8>>> = shards.into_iter().map(Some).collect();
        let written = self
            .ec_replicate(g.epoch, g.pgid, g.mapping, Some(g.since), &stored, |pos| {
                WireMutation::EcPatch {
                    base,
                    object_size,
                    shard_size,
                    shard_offset,
                    delta_base,
                    // Each position is asked for once.
                    data: shards
                        .get_mut(pos)
                        .and_then(Option::take)
                        .unwrap_or_default(),
                }
            })
            .await;
        spindle_trace::record(Stage::EcWrite, write_start);
        let v = match written {
            Ok(v) => v,
            Err(m) => return (m, Vec::new()),
        };
        let reply = Msg::ObjReply {
            version: v,
            size_bytes: object_size,
            data: Vec::new(),
            listing: Vec::new(),
        };
        // Acknowledged everywhere: every other slot goes (deltas first).
        let mut trim = self.other_slots(own, name, &keep);
        trim.sort_by_key(|n| std::cmp::Reverse(is_delta_slot(n)));
        (reply, trim)
    }

    /// Rewrites object `name`, whose current slot `c` is a delta, as a whole shard at a
    /// new version (the same bytes); returns the new current slot.
    async fn ec_materialize(
        &self,
        g: EcGroup<'_>,
        name: &str,
        own: PgId,
        c: Current,
    ) -> Result<Current, Msg> {
        let EcGroup {
            epoch,
            pgid,
            mapping,
            layout,
            since,
        } = g;
        let size = self.ec_object_size(epoch, pgid, mapping, name, c).await?;
        let shard_size = layout.shard_size(size);
        let (stored, delta_base, _) = self
            .plan_write(own, name, Some(c), false, shard_size, 0)
            .await?;
        debug_assert!(delta_base.is_none());
        self.ec_replicate(epoch, pgid, mapping, Some(since), &stored, |_| {
            WireMutation::EcPatch {
                base: Some(c.version),
                object_size: size,
                shard_size,
                shard_offset: 0,
                delta_base: None,
                data: Vec::new(),
            }
        })
        .await?;
        self.current_slot(own, name)
            .filter(|n| !n.delta)
            .ok_or_else(|| {
                err(
                    ErrorCode::Again,
                    format!("{name}: rewriting it whole failed"),
                )
            })
    }

    /// The encoded write (conditional on the current version) of writing
    /// `write` = (offset, bytes) into object `name`, or of truncating it to `truncate_to`:
    /// only the touched stripes, read back first unless the write covers them whole.
    async fn ec_encode_update(
        &self,
        g: EcGroup<'_>,
        name: &str,
        current: Option<Current>,
        write: Option<(u64, &[u8])>,
        truncate_to: Option<u64>,
    ) -> Result<EncodedWrite, Msg> {
        let layout = g.layout;
        let w = layout.stripe_width();
        let su = layout.stripe_unit_bytes;
        let old_size = match current {
            Some(c) => {
                self.ec_object_size(g.epoch, g.pgid, g.mapping, name, c)
                    .await?
            }
            None => 0,
        };
        let (first, end, new_size) = match (write, truncate_to) {
            (Some((offset, data)), _) => {
                let end_byte = offset
                    .checked_add(data.len() as u64)
                    .filter(|&e| e <= spindle_proto::msg::DATA_MAX as u64)
                    .ok_or_else(|| err(ErrorCode::Invalid, "write beyond the largest object"))?;
                let (f, e) = layout.stripe_range(offset, data.len() as u64);
                (f, e, old_size.max(end_byte))
            }
            (None, Some(size)) => {
                if size > spindle_proto::msg::DATA_MAX as u64 {
                    return Err(err(
                        ErrorCode::Invalid,
                        "truncate beyond the largest object",
                    ));
                }
                // Only the stripe holding the new end changes when shrinking into it.
                if size < old_size && size % w != 0 {
                    (size / w, size / w + 1, size)
                } else {
                    let f = layout.stripes(size.min(old_size));
                    (f, f, size)
                }
            }
            (None, None) => return Err(err(ErrorCode::Internal, "nothing to encode")),
        };
        let span = ((end - first) * w) as usize;
        // The stripes' current bytes, unless the write replaces all of them (from a stripe
        // start to a stripe end or past the object's end).
        let covered = match write {
            Some((offset, data)) => {
                let e = offset + data.len() as u64;
                offset == first * w && (e == end * w || e >= old_size)
            }
            None => false,
        };
        let mut stripes = match current {
            Some(c) if span > 0 && !covered && first * w < old_size => {
                let read_start = spindle_trace::now();
                let read = self
                    .ec_read(g, name, c, Some(old_size), first * w, span as u64)
                    .await;
                spindle_trace::record(Stage::EcRmwRead, read_start);
                match read {
                    Msg::ObjReply { data, .. } => data,
                    other => return Err(other),
                }
            }
            _ => Vec::new(),
        };
        stripes.resize(span, 0);
        match (write, truncate_to) {
            (Some((offset, data)), _) if !data.is_empty() => {
                let at = (offset - first * w) as usize;
                stripes[at..at + data.len()].copy_from_slice(data);
            }
            (None, Some(size)) => {
                // Bytes past the new end of the stripe become zeros.
                let keep = size.saturating_sub(first * w).min(span as u64) as usize;
                stripes[keep..].fill(0);
            }
            _ => {}
        }
        let shards = layout
            .encode_shards(&stripes, end - first, TRAILER_BYTES as usize)
            .map_err(|e| err(ErrorCode::Invalid, e.to_string()))?;
        Ok(EncodedWrite {
            object_size: new_size,
            shard_offset: first * su,
            shard_len: (end - first) * su,
            full: false,
            expect: current.map(|c| c.version),
            shards,
        })
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
        since: Option<u64>,
        stored: &str,
        mut make: impl FnMut(usize) -> WireMutation,
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
                .filter(|s| {
                    s.phase == Phase::Active
                        && s.epoch == epoch
                        && since.is_none_or(|since| s.since == since)
                })
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
                // The shard's buffer moves into the frame (no copy).
                match conn.start_prepared(epoch, &Prepared::from_msg(msg)) {
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
        for (d, f) in
            crate::fanout::wait_all(pending, timeout, self.inner.map_tx.subscribe(), |d| {
                self.marked_down(*d)
            })
            .await
            .failures
        {
            if let crate::fanout::CopyFailure::NewerMap(map) = &f {
                let _ = self.install_map(map);
            }
            failure = Some(format!("osd.{d}: {f}"));
        }
        if let Some(f) = failure {
            tracing::info!(
                "osd.{me}: shard write {stored:?} v{v:?} in pg {pgid} failed: {f}; re-peering"
            );
            self.repeer(pgid, Some(stored));
            return Err(err(ErrorCode::Again, f));
        }
        if replaces {
            self.clear_damaged(pgid, stored);
        }
        Ok(v)
    }

    /// Starts peering again at the group's current epoch (after a failed erasure-coded
    /// write: some shards may hold its new slot, others not), as the replicated write
    /// path does, and records the failed slot `unsettled` so that the next activation
    /// settles it. The group's epoch may be newer than the write's: a copy that answered
    /// `StaleMap` gave this daemon a newer map, which kept the interval. Peering must
    /// still follow: otherwise the slot stays on fewer than k shards with nobody
    /// recovering it or rolling it back, and every later read or write of the object
    /// answers `Again` until the client times out (EIO through NBD).
    pub(crate) fn repeer(&self, pgid: PgId, unsettled: Option<&str>) {
        let epoch = {
            let mut pgs = crate::lock(&self.inner.pgs);
            let Some(st) = pgs.get_mut(&(pgid.pool, pgid.pg)) else {
                return;
            };
            // The failed slot is settled before the object's next operation, whatever
            // the phase (`PgState::unsettled`): under the same lock as the phase change,
            // so no operation gets in between.
            if let Some(stored) = unsettled {
                st.unsettled.insert(stored.to_string());
            }
            if st.phase != Phase::Active {
                return;
            }
            st.phase = Phase::Peering;
            st.recovery = None;
            // A new interval id: recovery tasks of the old one stop.
            st.since = st.since.max(st.epoch) + 1_000_000_000;
            st.epoch
        };
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
            tokio::select! {
                r = conn.call(epoch, &msg, self.inner.config.replica_timeout_ms) => match r {
                    Ok(inc) => inc.msg,
                    Err(e) => return Err((ErrorCode::Again, format!("osd.{osd}: {e}"))),
                },
                why = self.until_marked_down(osd) => return Err((ErrorCode::Again, why)),
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
        let stored = c.stored(name);
        // Mine first: the current slot is on this copy, and its stored trailer (whole
        // shard or delta) names the object size.
        let own = self.copy_pgid(pgid, self.inner.id);
        let at = c.stored_bytes.saturating_sub(TRAILER_BYTES);
        if let Ok(t) = self.inner.store.read(own, &stored, at, TRAILER_BYTES).await {
            if let Some(size) = parse_any_trailer(&t) {
                return Ok(size);
            }
        }
        // Else any shard's logical trailer: at the same offset on every copy for a whole
        // shard; a delta slot's logical size is its shard size + trailer, so read it whole.
        let (at, len) = if c.delta {
            (0, u64::MAX)
        } else {
            (at, TRAILER_BYTES)
        };
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
                        len,
                    },
                )
                .await
            {
                Ok(t) => {
                    match parse_trailer(&t[t.len().saturating_sub(TRAILER_BYTES as usize)..]) {
                        Some(size) => return Ok(size),
                        None => last = format!("osd.{d}: bad shard trailer"),
                    }
                }
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
    async fn ec_read(
        &self,
        g: EcGroup<'_>,
        name: &str,
        c: Current,
        known_size: Option<u64>,
        offset: u64,
        len: u64,
    ) -> Msg {
        let size = match known_size {
            Some(s) => s,
            None if !c.delta => {
                // A whole shard holds at most k shard lengths of object: read up to that
                // while the trailer is read (two disk reads at once instead of one after
                // the other when neither is cached), then cut at the object's size.
                let bound = c.stored_bytes.saturating_sub(TRAILER_BYTES) * g.layout.k as u64;
                let (size, read) = futures::join!(
                    self.ec_object_size(g.epoch, g.pgid, g.mapping, name, c),
                    self.ec_read_sized(g, name, c, bound, offset, len)
                );
                let size = match size {
                    Ok(s) => s,
                    Err(m) => return m,
                };
                return match read {
                    Msg::ObjReply {
                        version,
                        mut data,
                        listing,
                        ..
                    } => {
                        let keep = size.saturating_sub(offset.min(size)).min(len);
                        data.truncate(keep as usize);
                        Msg::ObjReply {
                            version,
                            size_bytes: size,
                            data,
                            listing,
                        }
                    }
                    other => other,
                };
            }
            None => match self
                .ec_object_size(g.epoch, g.pgid, g.mapping, name, c)
                .await
            {
                Ok(s) => s,
                Err(m) => return m,
            },
        };
        self.ec_read_sized(g, name, c, size, offset, len).await
    }

    /// `ec_read` of an object of `size` bytes.
    async fn ec_read_sized(
        &self,
        g: EcGroup<'_>,
        name: &str,
        c: Current,
        size: u64,
        offset: u64,
        len: u64,
    ) -> Msg {
        let EcGroup {
            epoch,
            pgid,
            mapping,
            layout,
            since: _,
        } = g;
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
        let stored = c.stored(name);
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
                Ok(t) => parse_any_trailer(&t).unwrap_or(0),
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
            witnesses: Vec::new(),
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
        // Members that were sent the newest version's write vouch for its absence and
        // witness that a version they lack was never acknowledged (`vouch_by_membership`).
        {
            let history = crate::lock(&self.inner.members);
            spindle_pg::ec::vouch_by_membership(&mut view, |pos, d| {
                history.member_since(
                    &(pgid.pool, pgid.pg),
                    spindle_pg::CopyId {
                        osd: d,
                        shard: Some(pos as u8),
                    },
                )
            });
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
                // Never acknowledged (it could not have reached min_size shards, or a
                // member it was sent to lacks it).
                tracing::warn!(
                    "osd.{me}: pg {pgid}: rolling back unacknowledged {stored:?} v{version:?}"
                );
                // Only the copies that hold `version`. A member with an older version of
                // this slot keeps it: that version may be the object's current one (a write
                // that failed on some shards made the next write to the object pick this
                // slot, the one holding the acknowledged version); deleting the slot on
                // every member lost acknowledged data (`tests/netns.rs` (c), 2026-11-28:
                // fio read zeros). A member that did not answer is settled when it does.
                for (pos, d, s) in &states {
                    if s.as_ref().is_some_and(|(_, v)| *v == version) {
                        self.push_shard(epoch, copy_of(*pos), *d, stored, None)
                            .await?;
                    }
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
        // Logical bytes (a delta slot as the whole shard it stands for).
        match self.read_slot(copy, stored, None, 0, u64::MAX).await {
            Ok(r) => Ok(Some((r.data, r.version))),
            Err(Msg::Error {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(None),
            Err(m) => Err(format!("reading my shard {stored:?}: {m:?}")),
        }
    }

    async fn push_shard(
        &self,
        epoch: u64,
        copy: PgId,
        osd: u32,
        stored: &str,
        state: Option<(Vec<u8>, Ver)>,
    ) -> Result<(), String> {
        // Recovery moves logical bytes (whole shard + trailer); a delta slot is stored as
        // a delta covering the whole shard.
        let state = match state {
            Some((data, v)) if is_delta_slot(stored) => {
                let cut = data.len().saturating_sub(TRAILER_BYTES as usize);
                let size = parse_trailer(&data[cut..])
                    .ok_or_else(|| format!("{stored:?}: bad shard trailer"))?;
                let shard = &data[..cut];
                let d = DeltaSlot::whole(size, shard.len() as u64);
                Some((d.encode(shard), v))
            }
            other => other,
        };
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
