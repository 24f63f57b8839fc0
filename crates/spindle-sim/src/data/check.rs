//! Checkers: peering saw every acknowledged write, clean after faults, and after clean.

use super::*;

impl DataWorld {
    // ---- checkers ----

    pub(super) fn check(&mut self) {
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

    /// Peering saw every acknowledged write: an activation at epoch `epoch` starts from a
    /// last version at least that of every write acknowledged at an older epoch (the
    /// authoritative copy holds them). Checked at the activation, and at each later
    /// acknowledgement (an old primary that does not know the new map yet may still
    /// acknowledge a write whose replicas were queried before they applied it).
    pub(super) fn check_activation(&mut self, id: u32, pg: u32, epoch: u64, last: Ver) {
        self.activations
            .entry(pg)
            .or_default()
            .push((epoch, last, id));
        let missed = self.acked_versions.get(&pg).and_then(|acked| {
            acked
                .range(..Ver { epoch, seq: 0 })
                .next_back()
                .filter(|v| **v > last)
                .copied()
        });
        if let Some(v) = missed {
            self.fail(format!(
                "pg {pg}: osd.{id} activated at epoch {epoch} from last version {last:?}, \
                 but write {v:?} was acknowledged (peering missed it)"
            ));
        }
    }

    pub(super) fn check_ack(&mut self, id: u32, pg: u32, v: Ver) {
        self.acked_versions.entry(pg).or_default().insert(v);
        let missed = self.activations.get(&pg).and_then(|a| {
            a.iter()
                .find(|(epoch, last, _)| *epoch > v.epoch && *last < v)
                .copied()
        });
        if let Some((epoch, last, by)) = missed {
            self.fail(format!(
                "pg {pg}: osd.{id} acknowledged write {v:?} after osd.{by} activated at epoch \
                 {epoch} from last version {last:?} (peering missed it)"
            ));
        }
    }

    /// Groups that are not clean: every acting copy up, at the current epoch, the primary
    /// active with no recovery left, every copy complete and at the same last version.
    pub(super) fn unclean_pgs(&self) -> Vec<String> {
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
    pub(super) fn final_check(&mut self) {
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
