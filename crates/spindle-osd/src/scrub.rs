//! Scrub: compare every copy of a placement group (versions, sizes, whole-object CRC32C
//! digests, and each copy's own block checksums) and repair bad copies from a good one.
//!
//! Runs on the primary, periodically (`scrub_interval_ms`) and on demand (`ScrubPg`, sent
//! by `spindle scrub`). Repairs go through the recovery machinery: a bad copy is entered
//! in the group's missing set, so client writes to that object wait until it is repaired
//! and a repair never overwrites a newer write.

use crate::recovery::Recovery;
use crate::{ver, Osd, Phase};
use spindle_proto::msg::ScrubEntry;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{PgId, StoreError};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct ScrubCounters {
    pub objects: AtomicU64,
    pub inconsistent: AtomicU64,
    pub repaired: AtomicU64,
}

/// How long an on-demand scrub waits for its repairs before answering.
const REPAIR_WAIT_MS: u64 = 60_000;

impl Osd {
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
            let (digest, ok) = match store.read(pgid, &name, 0, meta.size_bytes).await {
                Ok(data) => (spindle_ec::crc32c::crc32c(&data), true),
                Err(StoreError::NotFound) => continue,
                Err(e) => {
                    tracing::error!(
                        "osd.{}: scrub: {name} in pg {}.{:x}: {e}",
                        self.inner.id,
                        pgid.pool,
                        pgid.pg
                    );
                    (0, false)
                }
            };
            out.push(ScrubEntry {
                name,
                version: ver(meta.version),
                size_bytes: meta.size_bytes,
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
                let msg = Msg::ScrubQuery {
                    pool: copy.pool,
                    pg: copy.pg,
                    names: names.to_vec(),
                };
                match self.call_peer(osd, epoch, &msg).await? {
                    Msg::ScrubMap { entries } => entries,
                    other => return Err(format!("osd.{osd}: unexpected {}", other.name())),
                }
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
            Ok((objects, inconsistent, repaired)) => Msg::ScrubResult {
                objects,
                inconsistent,
                repaired,
            },
            Err(e) => Msg::error(ErrorCode::Again, e),
        }
    }

    async fn scrub_pg_inner(&self, pgid: PgId, epoch: u64) -> Result<(u64, u64, u64), String> {
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
        // each shard's own checksums, not digests.
        let erasure = self
            .map_state()
            .is_some_and(|ms| ms.map.pools.get(&pgid.pool).is_some_and(|p| p.is_erasure()));
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
        let mut source: Option<u32> = None;
        for name in &all {
            let mine = maps
                .iter()
                .find(|(o, _)| *o == me)
                .and_then(|(_, m)| m.get(*name));
            // The reference: my copy if it is intact, else an intact copy with the newest
            // version among the others.
            let reference = match mine {
                Some(e) if e.ok => Some((me, e)),
                _ => maps
                    .iter()
                    .filter_map(|(o, m)| m.get(*name).filter(|e| e.ok).map(|e| (*o, e)))
                    .max_by_key(|(_, e)| e.version),
            };
            let Some((ref_osd, reference)) = reference else {
                tracing::error!(
                    "osd.{me}: scrub: {name} in pg {}.{:x} has no intact copy",
                    pgid.pool,
                    pgid.pg
                );
                continue;
            };
            let mut wrong = Vec::new();
            for (osd, m) in &maps {
                let fine = match m.get(*name) {
                    Some(e) => {
                        e.ok && e.version == reference.version
                            && e.size_bytes == reference.size_bytes
                            && (erasure || e.digest == reference.digest)
                    }
                    None => false,
                };
                if !fine {
                    wrong.push(*osd);
                }
            }
            let holders = maps.len() - wrong.len();
            if mine.is_none() && holders * 2 <= maps.len() {
                // Absent on the primary and on at least half of the copies: the absence
                // is authoritative (a delete that reached the primary); the copies that
                // still have it are wrong and get the "absent" state (deleted).
                wrong = maps
                    .iter()
                    .filter(|(_, m)| m.contains_key(*name))
                    .map(|(o, _)| *o)
                    .collect();
            } else if wrong.contains(&me) {
                // The primary's copy is bad or missing while a majority agrees on a good
                // one: recover the primary from it too.
                match source {
                    None => source = Some(ref_osd),
                    Some(s) if s == ref_osd => {}
                    Some(_) => continue, // needs another source: next scrub
                }
            }
            if !wrong.is_empty() {
                tracing::warn!(
                    "osd.{me}: scrub: {name} in pg {}.{:x} is inconsistent on {:?}",
                    pgid.pool,
                    pgid.pg,
                    wrong
                );
                bad.insert((*name).clone(), (wrong, reference.size_bytes));
            }
        }
        let objects = all.len() as u64;
        let inconsistent: u64 = bad.values().map(|(o, _)| o.len() as u64).sum();
        let c = &self.inner.scrub;
        c.objects.fetch_add(objects, Ordering::Relaxed);
        c.inconsistent.fetch_add(inconsistent, Ordering::Relaxed);
        if bad.is_empty() {
            return Ok((objects, 0, 0));
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
                    st.recovery = Some(Recovery {
                        source: source.unwrap_or(me),
                        backfill: false,
                        missing: bad,
                        in_progress: HashSet::new(),
                        incomplete: Vec::new(),
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
            return Ok((objects, inconsistent, 0));
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
                        .filter(|n| rec.missing.contains_key(*n))
                        .count(),
                    None => 0,
                }
            };
            if left == 0
                || tokio::time::Instant::now() >= deadline
                || !self.interval_is(pgid, since)
            {
                let repaired = if left == 0 { inconsistent } else { 0 };
                c.repaired.fetch_add(repaired, Ordering::Relaxed);
                return Ok((objects, inconsistent, repaired));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
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
                if let Msg::Error { message, .. } = self.scrub_pg(PgId { pool, pg }, epoch).await {
                    tracing::debug!(
                        "osd.{}: scheduled scrub of {pool}.{pg:x}: {message}",
                        self.inner.id
                    );
                }
            }
        }
    }
}

/// Names whose versions are not the same on every copy that has them.
fn unsettled_names(maps: &[(u32, BTreeMap<String, ScrubEntry>)]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for (_, m) in maps {
        for (n, e) in m {
            if maps
                .iter()
                .any(|(_, o)| o.get(n).is_some_and(|x| x.version != e.version))
            {
                names.insert(n.clone());
            }
        }
    }
    names.into_iter().collect()
}
