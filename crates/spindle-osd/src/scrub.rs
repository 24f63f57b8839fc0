//! Scrub: compare every copy of a placement group (versions, sizes, whole-object CRC32C
//! digests, and each copy's own block checksums) and repair bad copies from a good one.
//!
//! Runs on the primary, periodically (`scrub_interval_ms`) and on demand (`ScrubPg`, sent
//! by `spindle scrub`). Repairs go through the recovery machinery: a bad copy is entered
//! in the group's missing set, so client writes to that object wait until it is repaired
//! and a repair never overwrites a newer write.

use crate::counters::OsdCounters;
use crate::ec::split_slot;
use crate::recovery::Recovery;
use crate::{Osd, Phase};
use spindle_map::{Pool, PoolKind};
use spindle_pg::recovery::Missing;
use spindle_pg::scrub::{classify, unsettled_names, Rule, Verdict};
use spindle_pg::RecoveryCore;
use spindle_proto::msg::{ScrubEntry, Ver};
use spindle_proto::net::Replier;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{PgId, StoreError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// What one scrub of a group found and did.
struct ScrubOutcome {
    objects: u64,
    /// Bad copies found (those of damaged objects included).
    inconsistent: u64,
    /// Bad copies repaired.
    repaired: u64,
    /// Objects with no intact copy (client names, sorted).
    damaged: Vec<String>,
}

/// How long an on-demand scrub waits for its repairs before answering.
const REPAIR_WAIT_MS: u64 = 60_000;

impl Osd {
    /// The scrub protocol: `ScrubPg` (scrub a group now, on its primary) and `ScrubQuery` (this copy's scrub map).
    pub(crate) fn serve_scrub(&self, msg: Msg, rid: u64, epoch: u64, reply: Replier) {
        match msg {
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
            other => crate::not_handled(&reply, rid, epoch, &other),
        }
    }

    /// This copy's scrub entries for `names` (every object if empty).
    pub(crate) async fn scrub_entries(&self, pgid: PgId, names: &[String]) -> Vec<ScrubEntry> {
        let store = &self.inner.store;
        let names: Vec<String> = if names.is_empty() {
            store.list(pgid).into_iter().map(|(n, _)| n).collect()
        } else {
            names.to_vec()
        };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some(meta) = store.stat(pgid, &name) else {
                continue;
            };
            let mut size_bytes = meta.size_bytes;
            let (digest, ok) = match store.read(pgid, &name, 0, meta.size_bytes).await {
                // A delta slot of a shard copy: compared by the size of the shard it
                // stands for (copies may hold a delta or a whole-shard delta).
                Ok(data)
                    if spindle_map::split_shard_pg(pgid.pg).1.is_some()
                        && crate::ec::is_delta_slot(&name) =>
                {
                    match spindle_map::ec::delta::DeltaSlot::parse(&data) {
                        Ok((d, _)) => {
                            size_bytes = d.shard_size + spindle_map::ec::TRAILER_BYTES;
                            (spindle_ec::crc32c::crc32c(&data), true)
                        }
                        Err(e) => {
                            tracing::error!(
                                "osd.{}: scrub: pg {pgid}: {name:?}: {e}",
                                self.inner.id
                            );
                            (0, false)
                        }
                    }
                }
                Ok(data) => (spindle_ec::crc32c::crc32c(&data), true),
                Err(StoreError::NotFound) => continue,
                Err(e) => {
                    tracing::error!("osd.{}: scrub: pg {pgid}: {name}: {e}", self.inner.id);
                    (0, false)
                }
            };
            out.push(ScrubEntry {
                name,
                version: meta.version,
                size_bytes,
                digest,
                ok,
            });
        }
        out
    }

    async fn scrub_maps(
        &self,
        pgid: PgId,
        epoch: u64,
        copies: &[u32],
        names: &[String],
    ) -> Result<Vec<(u32, BTreeMap<String, ScrubEntry>)>, String> {
        let mut maps = Vec::with_capacity(copies.len());
        for &osd in copies {
            let copy = self.copy_pgid(pgid, osd);
            let entries = if osd == self.inner.id {
                self.scrub_entries(copy, names).await
            } else {
                let query = spindle_proto::msg::typed::ScrubQuery {
                    pool: copy.pool,
                    pg: copy.pg,
                    names: names.to_vec(),
                };
                self.request_peer(osd, epoch, query).await?.entries
            };
            maps.push((
                osd,
                entries.into_iter().map(|e| (e.name.clone(), e)).collect(),
            ));
        }
        Ok(maps)
    }

    /// Scrubs one placement group this daemon is primary of (reply `ScrubResult`).
    pub(crate) async fn scrub_pg(&self, pgid: PgId, epoch: u64) -> Msg {
        match self.scrub_pg_inner(pgid, epoch).await {
            Ok(o) => Msg::ScrubResult {
                objects: o.objects,
                inconsistent: o.inconsistent,
                repaired: o.repaired,
                damaged: o.damaged,
            },
            Err(e) => Msg::error(ErrorCode::Again, e),
        }
    }

    async fn scrub_pg_inner(&self, pgid: PgId, epoch: u64) -> Result<ScrubOutcome, String> {
        let me = self.inner.id;
        let (copies, since) = {
            let pgs = crate::lock(&self.inner.pgs);
            let st = pgs
                .get(&(pgid.pool, pgid.pg))
                .filter(|st| st.epoch == epoch)
                .ok_or("not the primary of this placement group at this epoch")?;
            if st.phase != Phase::Active || st.recovery.is_some() {
                return Err("placement group is peering or recovering; scrub later".into());
            }
            (st.acting.clone(), st.since)
        };
        // Shards of an erasure-coded group differ by design: compare versions, sizes and
        // each shard's own checksums, not digests; an object needs k intact shards.
        let k_shards = self
            .map_state()
            .and_then(|ms| match ms.map.pools.get(&pgid.pool) {
                Some(Pool {
                    kind: PoolKind::Erasure { k, .. },
                    ..
                }) => Some(*k),
                _ => None,
            });
        let rule = match k_shards {
            Some(k) => Rule {
                compare_digests: false,
                intact_needed: k as usize,
            },
            _ => Rule {
                compare_digests: true,
                intact_needed: 1,
            },
        };
        let mut maps = self.scrub_maps(pgid, epoch, &copies, &[]).await?;
        // Objects whose versions differ may have a write in flight: look again once.
        let unsettled: Vec<String> = unsettled_names(&maps);
        if !unsettled.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let again = self.scrub_maps(pgid, epoch, &copies, &unsettled).await?;
            for ((_, map), (_, fresh)) in maps.iter_mut().zip(again) {
                for n in &unsettled {
                    map.remove(n);
                }
                map.extend(fresh);
            }
        }
        let all: BTreeSet<&String> = maps.iter().flat_map(|(_, m)| m.keys()).collect();
        let mut bad: BTreeMap<String, (Vec<u32>, u64)> = BTreeMap::new();
        // Objects with no intact copy, with the version of the primary's copy when scrub
        // read it (None: absent on the primary).
        let mut damaged: BTreeMap<String, Option<Ver>> = BTreeMap::new();
        let mut inconsistent = 0u64;
        let mut source: Option<u32> = None;
        for name in &all {
            match classify(name, me, &maps, rule) {
                Verdict::Consistent => {}
                Verdict::Damaged { bad: on, intact } => {
                    tracing::error!(
                        "osd.{me}: scrub: pg {pgid}: {name} has no intact copy \
                         ({intact} intact, {} needed; bad or missing on {on:?})",
                        rule.intact_needed
                    );
                    inconsistent += on.len() as u64;
                    let mine = maps
                        .iter()
                        .find(|(o, _)| *o == me)
                        .and_then(|(_, m)| m.get(*name))
                        .map(|e| e.version);
                    damaged.insert((*name).clone(), mine);
                }
                Verdict::Repair {
                    wrong,
                    reference,
                    size_bytes,
                } => {
                    inconsistent += wrong.len() as u64;
                    if wrong.contains(&me) {
                        // The primary's copy is bad or missing: recover it from the
                        // reference too (one source per repair round).
                        match source {
                            None => source = Some(reference),
                            Some(s) if s == reference => {}
                            Some(_) => continue, // needs another source: next scrub
                        }
                    }
                    tracing::warn!(
                        "osd.{me}: scrub: pg {pgid}: {name} is inconsistent on {wrong:?}"
                    );
                    bad.insert((*name).clone(), (wrong, size_bytes));
                }
            }
        }
        let damaged_names = self.set_damaged(pgid, since, damaged);
        let objects = all.len() as u64;
        let repairable: u64 = bad.values().map(|(o, _)| o.len() as u64).sum();
        let c = &self.inner.counters;
        OsdCounters::add(&c.scrubbed_objects, objects);
        OsdCounters::add(&c.scrub_inconsistent, inconsistent);
        let mut outcome = ScrubOutcome {
            objects,
            inconsistent,
            repaired: 0,
            damaged: damaged_names,
        };
        if bad.is_empty() {
            return Ok(outcome);
        }
        // Repair through recovery (writes to these objects wait for it).
        let names: Vec<String> = bad.keys().cloned().collect();
        let started = {
            let mut pgs = crate::lock(&self.inner.pgs);
            match pgs
                .get_mut(&(pgid.pool, pgid.pg))
                .filter(|st| st.since == since && st.phase == Phase::Active)
            {
                Some(st) if st.recovery.is_none() => {
                    let missing = bad
                        .into_iter()
                        .map(|(name, (copies, size_bytes))| (name, Missing { copies, size_bytes }))
                        .collect();
                    st.recovery = Some(Recovery {
                        core: RecoveryCore::new(source.unwrap_or(me), false, missing, Vec::new()),
                        notify: Arc::new(Notify::new()),
                        ec_strays: Vec::new(),
                        ec_established: copies.clone(),
                    });
                    true
                }
                _ => false,
            }
        };
        if !started {
            return Ok(outcome);
        }
        let osd = self.clone();
        tokio::spawn(async move { osd.recovery_loop(pgid, since).await });
        // Wait for the repairs (bounded), then count what was repaired.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REPAIR_WAIT_MS);
        loop {
            let left = {
                let pgs = crate::lock(&self.inner.pgs);
                match pgs
                    .get(&(pgid.pool, pgid.pg))
                    .filter(|st| st.since == since)
                    .and_then(|st| st.recovery.as_ref())
                {
                    Some(rec) => names
                        .iter()
                        .filter(|n| rec.core.is_missing(n, None))
                        .count(),
                    None => 0,
                }
            };
            if left == 0
                || tokio::time::Instant::now() >= deadline
                || !self.interval_is(pgid, since)
            {
                outcome.repaired = if left == 0 { repairable } else { 0 };
                OsdCounters::add(&c.scrub_repaired, outcome.repaired);
                return Ok(outcome);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replaces the group's set of damaged objects with what a whole-group scrub found
    /// (objects found intact again, or gone, leave it). An object a client overwrote or
    /// deleted since scrub read it (its local version changed) is left out. Returns the
    /// damaged object names as clients know them (erasure-coded slot suffixes removed).
    fn set_damaged(
        &self,
        pgid: PgId,
        since: u64,
        found: BTreeMap<String, Option<Ver>>,
    ) -> Vec<String> {
        let own = self.copy_pgid(pgid, self.inner.id);
        let mut pgs = crate::lock(&self.inner.pgs);
        let Some(st) = pgs
            .get_mut(&(pgid.pool, pgid.pg))
            .filter(|st| st.since == since)
        else {
            return Vec::new();
        };
        let store = &self.inner.store;
        st.damaged = found
            .into_iter()
            .filter(|(name, seen)| store.stat(own, name).map(|m| m.version) == *seen)
            .map(|(name, _)| name)
            .collect();
        let names: BTreeSet<String> = st
            .damaged
            .iter()
            .map(|n| split_slot(n).map_or(n.as_str(), |(obj, _)| obj).to_string())
            .collect();
        names.into_iter().collect()
    }

    /// A client replaced or deleted `name` (the stored name): it is no longer damaged.
    pub(crate) fn clear_damaged(&self, pgid: PgId, name: &str) {
        let mut pgs = crate::lock(&self.inner.pgs);
        if let Some(st) = pgs.get_mut(&(pgid.pool, pgid.pg)) {
            if st.damaged.remove(name) {
                tracing::info!(
                    "osd.{}: pg {pgid}: damaged object {name:?} replaced by a client write",
                    self.inner.id
                );
            }
        }
    }

    /// Periodic scrub of every group this daemon is primary of.
    pub(crate) async fn scrub_loop(&self) {
        let interval_ms = self.inner.config.scrub_interval_ms;
        if interval_ms == 0 {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
            let epoch = self.epoch();
            let mine: Vec<(u32, u32)> = crate::lock(&self.inner.pgs)
                .iter()
                .filter(|(_, st)| st.epoch == epoch && st.phase == Phase::Active)
                .map(|(k, _)| *k)
                .collect();
            for (pool, pg) in mine {
                let pgid = PgId { pool, pg };
                if let Msg::Error { message, .. } = self.scrub_pg(pgid, epoch).await {
                    tracing::debug!(
                        "osd.{}: scheduled scrub of pg {pgid}: {message}",
                        self.inner.id
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use spindle_store::PgId;

    /// One PG id format everywhere: the store's (logs, store errors) and the map's (CLI,
    /// status, client errors) print alike.
    #[test]
    fn pg_ids_print_the_same_in_the_store_and_the_map() {
        for (pool, pg) in [
            (1, 0x16),
            (1, 22),
            (3, 0),
            (2, spindle_map::shard_pg(0x1f, Some(2))),
        ] {
            let store = PgId { pool, pg }.to_string();
            assert_eq!(store, spindle_map::PgId { pool, pg }.to_string());
            assert!(!store.contains("{"), "{store}");
        }
        assert_eq!(PgId { pool: 1, pg: 22 }.to_string(), "1.16");
    }
}
