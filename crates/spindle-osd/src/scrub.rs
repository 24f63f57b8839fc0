//! Scrub: compare every copy of a placement group (versions, sizes, whole-object CRC32C
//! digests, and each copy's own block checksums) and repair bad copies from a good one.
//!
//! Runs on the primary, periodically (`scrub_interval_ms`) and on demand (`ScrubPg`, sent
//! by `spindle scrub`). Repairs go through the recovery machinery: a bad copy is entered
//! in the group's missing set, so client writes to that object wait until it is repaired
//! and a repair never overwrites a newer write.

use crate::ec::split_slot;
use crate::recovery::Recovery;
use crate::{ver, Osd, Phase};
use spindle_map::{Pool, PoolKind};
use spindle_proto::msg::{ScrubEntry, Ver};
use spindle_proto::{ErrorCode, Msg};
use spindle_store::{PgId, StoreError};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
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
                    tracing::error!("osd.{}: scrub: pg {pgid}: {name}: {e}", self.inner.id);
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
        let c = &self.inner.scrub;
        c.objects.fetch_add(objects, Ordering::Relaxed);
        c.inconsistent.fetch_add(inconsistent, Ordering::Relaxed);
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
                        .filter(|n| rec.missing.contains_key(*n))
                        .count(),
                    None => 0,
                }
            };
            if left == 0
                || tokio::time::Instant::now() >= deadline
                || !self.interval_is(pgid, since)
            {
                outcome.repaired = if left == 0 { repairable } else { 0 };
                c.repaired.fetch_add(outcome.repaired, Ordering::Relaxed);
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
            .filter(|(name, seen)| store.stat(own, name).map(|m| ver(m.version)) == *seen)
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

/// How scrub compares the copies of a group's objects.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    /// Replicated copies must have equal digests; erasure-code shards differ by design.
    pub compare_digests: bool,
    /// Intact copies an object needs to be readable and repairable: 1, or k shards.
    pub intact_needed: usize,
}

/// What scrub concluded about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every copy is present, verified and agrees with the others.
    Consistent,
    /// Copies `wrong` are bad, missing, stale or extra (a delete left them): repair them
    /// from `reference`'s state (an intact copy; the primary's absence for a leftover).
    Repair {
        wrong: Vec<u32>,
        reference: u32,
        size_bytes: u64,
    },
    /// Fewer intact copies than `Rule::intact_needed`: nothing to repair from; the
    /// object stays damaged until a client overwrites or deletes it.
    Damaged { bad: Vec<u32>, intact: usize },
}

/// Classifies `name` from every copy's scrub map (`me` is the primary). Pure: decides,
/// does nothing.
///
/// The reference is the primary's copy if it is intact, else the intact copy with the
/// newest version; a copy is fine when it is intact and matches the reference's version,
/// size (and digest, for replicated pools). An object absent on the primary and on at
/// least half of the copies is a delete's leftover: the copies holding it are wrong (they
/// get the primary's state: absent), intact or not.
pub(crate) fn classify(
    name: &str,
    me: u32,
    maps: &[(u32, BTreeMap<String, ScrubEntry>)],
    rule: Rule,
) -> Verdict {
    let mine = maps
        .iter()
        .find(|(o, _)| *o == me)
        .and_then(|(_, m)| m.get(name));
    let holding: Vec<u32> = maps
        .iter()
        .filter(|(_, m)| m.contains_key(name))
        .map(|(o, _)| *o)
        .collect();
    let reference = match mine {
        Some(e) if e.ok => Some((me, e)),
        _ => maps
            .iter()
            .filter_map(|(o, m)| m.get(name).filter(|e| e.ok).map(|e| (*o, e)))
            .max_by_key(|(_, e)| e.version),
    };
    let Some((ref_osd, reference)) = reference else {
        if mine.is_none() && holding.len() * 2 <= maps.len() {
            // A delete's leftover whose copies are all bad as well.
            return Verdict::Repair {
                wrong: holding,
                reference: me,
                size_bytes: 0,
            };
        }
        return Verdict::Damaged {
            bad: maps.iter().map(|(o, _)| *o).collect(),
            intact: 0,
        };
    };
    let wrong: Vec<u32> = maps
        .iter()
        .filter(|(_, m)| {
            !m.get(name).is_some_and(|e| {
                e.ok && e.version == reference.version
                    && e.size_bytes == reference.size_bytes
                    && (!rule.compare_digests || e.digest == reference.digest)
            })
        })
        .map(|(o, _)| *o)
        .collect();
    let fine = maps.len() - wrong.len();
    if mine.is_none() && fine * 2 <= maps.len() {
        // Absent on the primary and on at least half of the copies: the absence is
        // authoritative (a delete that reached the primary).
        return Verdict::Repair {
            wrong: holding,
            reference: me,
            size_bytes: reference.size_bytes,
        };
    }
    if fine < rule.intact_needed {
        return Verdict::Damaged {
            bad: wrong,
            intact: fine,
        };
    }
    if wrong.is_empty() {
        return Verdict::Consistent;
    }
    Verdict::Repair {
        wrong,
        reference: ref_osd,
        size_bytes: reference.size_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLICATED: Rule = Rule {
        compare_digests: true,
        intact_needed: 1,
    };
    const EC_2_1: Rule = Rule {
        compare_digests: false,
        intact_needed: 2,
    };

    fn entry(seq: u64, digest: u32, ok: bool) -> ScrubEntry {
        ScrubEntry {
            name: "x".into(),
            version: Ver { epoch: 3, seq },
            size_bytes: 100,
            digest,
            ok,
        }
    }

    /// Copy maps of osd.0 (the primary), osd.1, osd.2 for object "x" (None = absent).
    fn maps(copies: [Option<ScrubEntry>; 3]) -> Vec<(u32, BTreeMap<String, ScrubEntry>)> {
        copies
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    i as u32,
                    e.map(|e| ("x".to_string(), e)).into_iter().collect(),
                )
            })
            .collect()
    }

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

    #[test]
    fn agreeing_intact_copies_are_consistent() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 7, true)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(classify("x", 0, &m, REPLICATED), Verdict::Consistent);
    }

    #[test]
    fn one_corrupt_replica_is_repaired_from_the_primary() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn a_corrupt_primary_is_repaired_from_an_intact_replica() {
        let m = maps([
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![0, 1],
                reference: 2,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn a_digest_mismatch_is_wrong_on_replicated_pools_only() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 8, true)),
            Some(entry(1, 7, true)),
        ]);
        assert!(matches!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair { .. }
        ));
        assert_eq!(classify("x", 0, &m, EC_2_1), Verdict::Consistent);
    }

    /// The original failure: every copy corrupt was skipped (and reported as nothing).
    #[test]
    fn no_intact_copy_is_damaged_not_skipped() {
        let m = maps([
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Damaged {
                bad: vec![0, 1, 2],
                intact: 0
            }
        );
    }

    #[test]
    fn absent_on_the_primary_and_corrupt_elsewhere_is_damaged() {
        // The primary lost it; both replicas hold only corrupt copies: data loss, not a
        // delete's leftover (a majority holds it).
        let m = maps([None, Some(entry(1, 0, false)), Some(entry(1, 0, false))]);
        assert!(matches!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Damaged { intact: 0, .. }
        ));
    }

    #[test]
    fn a_delete_leftover_is_removed_even_when_corrupt() {
        let m = maps([None, Some(entry(1, 0, false)), None]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 0
            }
        );
        let m = maps([None, Some(entry(1, 7, true)), None]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn erasure_coded_objects_need_k_intact_shards() {
        // k = 2: one corrupt shard is repairable (decoded from the other two)...
        let m = maps([
            Some(entry(1, 1, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 3, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
        // ...two are not, although one shard is still intact.
        let m = maps([
            Some(entry(1, 1, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
        ]);
        assert_eq!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Damaged {
                bad: vec![1, 2],
                intact: 1
            }
        );
        // A stale shard does not count as intact.
        let m = maps([
            Some(entry(2, 1, true)),
            Some(entry(1, 2, true)),
            Some(entry(2, 0, false)),
        ]);
        assert!(matches!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Damaged { intact: 1, .. }
        ));
    }
}
