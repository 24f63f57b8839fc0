//! The monitor's decisions, without I/O: which map comes next.
//!
//! [`MonCore`] holds the current cluster map and what the monitor knows about the daemons
//! (last heartbeat, placement-group reports, counters, since when each has been down). It
//! takes events — a daemon boots, a heartbeat arrives, time passes, an administrative
//! command — with the time as an argument (`now_ms`, milliseconds on any monotonic clock)
//! and answers with the *next map* to commit, if any. It owns no socket, file, thread or
//! clock: the shell (`Monitor`) persists a proposed map (`MapStore::save`), then
//! [`MonCore::install`]s it and publishes it. A simulator drives the same core with
//! simulated time.
//!
//! Invariants:
//! - a proposal is the current map with exactly the requested change and `epoch + 1`; an
//!   unchanged map is never proposed (no empty epochs);
//! - `install` takes only the successor epoch of the installed map;
//! - a daemon is marked down only after `down_after_ms` without a heartbeat, out only after
//!   `out_after_ms` down (0 = never), and every daemon gets a full grace period when the
//!   core starts or the daemon joins the map;
//! - a daemon the core marked out (`OsdInfo::auto_out`, kept in the map so every leader
//!   knows) is marked in again when it boots, as Ceph's `mon_osd_auto_mark_auto_out_in`;
//!   one an administrator marked out (`osd out`) stays out until `osd in`.

use crate::command::{AdminCommand, ClockSample, OsdVerb};
use crate::reply::{AdminReply, CrushSet, OsdAdded, OsdMarked, PoolCreated, PoolRemoved, RatioSet};
use spindle_map::{ClusterMap, OsdInfo, Placement, PoolKind};
use spindle_proto::msg::PgReport;
use std::collections::{BTreeMap, VecDeque};

/// When daemons are marked down and out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonTiming {
    /// A daemon that sends no heartbeat for this long is marked down.
    pub down_after_ms: u64,
    /// A daemon down (and in) for this long is marked out (0 = never).
    pub out_after_ms: u64,
}

/// Window over which the recovery rate in `status` is computed.
pub(crate) const RATE_WINDOW_MS: u64 = 5_000;

/// A map change the core asks the shell to commit, with why (for the log).
#[derive(Clone, Debug)]
pub struct MapChange {
    pub next: ClusterMap,
    pub reason: String,
}

/// A monitor re-registers its metrics address every [`crate::MON_METRICS_REGISTER_MS`];
/// one silent for this long is dropped from `status`.
pub const MON_METRICS_FORGET_MS: u64 = 30_000;
/// Map changes the leader remembers for `status` (a dashboard shows the last ones).
pub const EVENTS_KEPT: usize = 50;
/// Metrics endpoints of other processes the leader lists at most.
pub const SERVICES_KEPT: usize = 1024;
/// Image reports the leader keeps from all processes together (about 250 bytes each).
pub const IMAGES_KEPT: usize = 4096;
/// A monitor whose clock is further than this from the leader's is reported
/// (`MON_CLOCK_SKEW`): Ceph's `mon_clock_drift_allowed`, 0.05 s. Leases, tickets and
/// events are timed by the clocks of several monitors.
pub const MON_CLOCK_DRIFT_ALLOWED_MS: u64 = 50;
const _: () = assert!(crate::MON_METRICS_REGISTER_MS * 3 <= MON_METRICS_FORGET_MS);

/// The monitor's state and decisions (see the module documentation).
pub struct MonCore {
    pub(crate) map: ClusterMap,
    pub(crate) placement: Placement,
    timing: MonTiming,
    last_heartbeat_ms: BTreeMap<u32, u64>,
    /// Latest placement-group reports per daemon, with the epoch they were made at.
    pub(crate) reports: BTreeMap<u32, (u64, Vec<PgReport>)>,
    /// Latest counters per daemon.
    pub(crate) counters: BTreeMap<u32, Vec<(String, u64)>>,
    /// Where each daemon serves its metrics (from its latest heartbeat).
    pub(crate) metrics_addrs: BTreeMap<u32, String>,
    /// Where each monitor serves its metrics, and when it last said so.
    /// With its clock against this leader's (`MON_CLOCK_SKEW`).
    pub(crate) mon_metrics: BTreeMap<u64, (String, u64, Option<ClockSample>)>,
    /// Where other processes (`spindle nbd`) serve their metrics, by name, and when they
    /// last said so (at most [`SERVICES_KEPT`]).
    /// With the images each serves.
    pub(crate) service_metrics: BTreeMap<String, (String, u64, Vec<crate::reply::ImageReport>)>,
    /// The last map changes this leader committed, oldest first (at most
    /// [`EVENTS_KEPT`]; a new leader starts empty).
    pub(crate) events: std::collections::VecDeque<crate::reply::MapEvent>,
    /// Since when each down (and still in) daemon has been down, for `out_after_ms`.
    down_since_ms: BTreeMap<u32, u64>,
    /// Recovery rate: (when, total recovered bytes, total recovered objects) samples.
    pub(crate) recovery_samples: VecDeque<(u64, u64, u64)>,
    /// The lease of every image lock in the map (`crate::locks`).
    pub(crate) leases: BTreeMap<(u32, String), crate::locks::Lease>,
}

/// `change` applied to a copy of `map`: the change's result, and the next map (epoch + 1)
/// if anything changed.
pub fn propose<T>(
    map: &ClusterMap,
    change: impl FnOnce(&mut ClusterMap) -> Result<T, String>,
) -> Result<(T, Option<ClusterMap>), String> {
    let mut next = map.clone();
    let out = change(&mut next)?;
    next.epoch = map.epoch;
    if next.encode() == map.encode() {
        return Ok((out, None));
    }
    next.epoch = map.epoch + 1;
    Ok((out, Some(next)))
}

impl MonCore {
    /// A core serving `map` from `now_ms` on: every daemon the map knows gets a full grace
    /// period before it can be marked down.
    pub fn new(map: ClusterMap, timing: MonTiming, now_ms: u64) -> MonCore {
        let last_heartbeat_ms = map.osds.keys().map(|&id| (id, now_ms)).collect();
        let mut core = MonCore {
            placement: Placement::compute(&map),
            map,
            timing,
            last_heartbeat_ms,
            reports: BTreeMap::new(),
            counters: BTreeMap::new(),
            metrics_addrs: BTreeMap::new(),
            mon_metrics: BTreeMap::new(),
            service_metrics: BTreeMap::new(),
            events: Default::default(),
            down_since_ms: BTreeMap::new(),
            recovery_samples: VecDeque::new(),
            leases: BTreeMap::new(),
        };
        core.sync_leases(now_ms);
        core
    }

    /// When daemons are marked down and out.
    pub fn timing(&self) -> &MonTiming {
        &self.timing
    }

    /// Executes `cmd` at `now_ms` (monotonic) and `now_unix_secs` (wall clock, for lock and
    /// fence times): the image lock commands need both and change lease state; every other
    /// command is [`MonCore::execute`].
    pub fn execute_at(
        &mut self,
        now_ms: u64,
        now_unix_secs: u64,
        cmd: &AdminCommand,
    ) -> Result<(AdminReply, Option<ClusterMap>), String> {
        match cmd {
            AdminCommand::LockAcquire {
                pool,
                image,
                client,
                lease_ms,
                holder,
                take_over,
            } => self.lock_acquire(
                now_ms,
                now_unix_secs,
                pool,
                image,
                *client,
                *lease_ms,
                holder,
                *take_over,
            ),
            AdminCommand::LockRenew {
                pool,
                image,
                client,
            } => self.lock_renew(now_ms, pool, image, *client),
            AdminCommand::LockRelease {
                pool,
                image,
                client,
            } => self.lock_release(pool, image, *client),
            AdminCommand::Snap {
                verb,
                pool,
                image,
                snap,
                size_bytes,
            } => self.snap_command(now_unix_secs, *verb, pool, image, snap, *size_bytes),
            AdminCommand::SnapChild {
                add,
                pool,
                image,
                snap,
                child_pool,
                child,
            } => self.snap_child(*add, pool, image, snap, child_pool, child),
            AdminCommand::SnapTrimmed {
                pool,
                image,
                removals,
            } => self.snap_trimmed(pool, image, *removals),
            other => self.execute(other),
        }
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    pub fn epoch(&self) -> u64 {
        self.map.epoch
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Makes `next` (a proposal of this core, saved by the shell) the current map. Daemons
    /// new to the map get a full grace period from `now_ms`.
    pub fn install(&mut self, next: ClusterMap, now_ms: u64) {
        assert_eq!(
            next.epoch,
            self.map.epoch + 1,
            "maps are installed one epoch at a time"
        );
        for id in next.osds.keys() {
            self.last_heartbeat_ms.entry(*id).or_insert(now_ms);
        }
        self.last_heartbeat_ms
            .retain(|id, _| next.osds.contains_key(id));
        self.placement = Placement::compute(&next);
        self.map = next;
        self.sync_leases(now_ms);
    }

    /// A daemon boots (or re-registers): the next map marks it up at its new address (and
    /// in again if the monitor had marked it out, `auto_out`), or None when nothing
    /// changes (the same process re-registering after a monitor restart: no new epoch, no
    /// re-peering). Counts as a heartbeat.
    pub fn boot(
        &mut self,
        now_ms: u64,
        osd_id: u32,
        addr: &str,
        pid: u32,
    ) -> Result<Option<ClusterMap>, String> {
        let (_, next) = propose(&self.map, |m| {
            let next_epoch = m.epoch + 1;
            let osd = m
                .osds
                .get_mut(&osd_id)
                .ok_or_else(|| format!("osd.{osd_id} is not part of this cluster"))?;
            if !(osd.up && osd.addr == addr && osd.pid == pid) {
                osd.addr = addr.to_string();
                osd.pid = pid;
                osd.up = true;
                osd.up_from = next_epoch;
            }
            if osd.auto_out {
                osd.auto_out = false;
                osd.in_cluster = true;
            }
            Ok(())
        })?;
        self.last_heartbeat_ms.insert(osd_id, now_ms);
        Ok(next)
    }

    /// Remembers where process `name` serves its metrics, as [`Self::set_mon_metrics`];
    /// a new name past [`SERVICES_KEPT`] is not kept (the table stays bounded).
    pub fn set_service_metrics(
        &mut self,
        now_ms: u64,
        name: String,
        addr: String,
        images: Vec<crate::reply::ImageReport>,
    ) {
        self.service_metrics
            .retain(|_, (_, at, _)| now_ms.saturating_sub(*at) <= MON_METRICS_FORGET_MS);
        if self.service_metrics.len() < SERVICES_KEPT || self.service_metrics.contains_key(&name) {
            // Images past IMAGES_KEPT in all are not kept (the table stays bounded).
            let others: usize = self
                .service_metrics
                .iter()
                .filter(|(n, _)| **n != name)
                .map(|(_, (_, _, i))| i.len())
                .sum();
            let mut images = images;
            images.truncate(IMAGES_KEPT.saturating_sub(others));
            self.service_metrics.insert(name, (addr, now_ms, images));
        }
    }

    /// Remembers a committed map change (`spindle status` and the dashboard list them).
    pub fn record_event(&mut self, unix_ms: u64, epoch: u64, reason: String) {
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(crate::reply::MapEvent {
            unix_ms,
            epoch,
            what: reason,
        });
    }

    /// Remembers where monitor `id` serves its metrics; forgets monitors that have not
    /// said so for [`MON_METRICS_FORGET_MS`] (removed or stopped).
    pub fn set_mon_metrics(
        &mut self,
        now_ms: u64,
        id: u64,
        addr: String,
        clock: Option<ClockSample>,
    ) {
        // A registration without a clock sample (its first) keeps the last one.
        let clock = clock.or_else(|| self.mon_metrics.get(&id).and_then(|m| m.2));
        self.mon_metrics.insert(id, (addr, now_ms, clock));
        self.mon_metrics
            .retain(|_, (_, at, _)| now_ms.saturating_sub(*at) <= MON_METRICS_FORGET_MS);
    }

    /// Remembers where daemon `osd_id` serves its metrics (empty: nowhere).
    pub fn set_metrics_addr(&mut self, osd_id: u32, addr: String) {
        if !self.map.osds.contains_key(&osd_id) {
            return;
        }
        if addr.is_empty() {
            self.metrics_addrs.remove(&osd_id);
        } else {
            self.metrics_addrs.insert(osd_id, addr);
        }
    }

    /// A heartbeat (sent at the daemon's map `epoch`): remembers its reports and counters;
    /// returns the next map when the daemon's nearfull / full flags change.
    /// What a heartbeat tells that scrub found since the daemon's previous one: groups it
    /// leads with objects newly without an intact copy (or no longer), and bad copies it
    /// repaired. Call before [`Self::heartbeat`] stores the new reports.
    pub fn scrub_findings(
        &self,
        osd_id: u32,
        reports: &[PgReport],
        counters: &[(String, u64)],
    ) -> Vec<String> {
        let mut out = Vec::new();
        let before: BTreeMap<(u32, u32), u64> = self
            .reports
            .get(&osd_id)
            .map(|(_, r)| {
                r.iter()
                    .map(|p| ((p.pool, p.pg), p.damaged_objects))
                    .collect()
            })
            .unwrap_or_default();
        for r in reports {
            let was = before.get(&(r.pool, r.pg)).copied().unwrap_or(0);
            let pg = spindle_map::PgId {
                pool: r.pool,
                pg: r.pg,
            };
            if r.damaged_objects > was {
                out.push(format!(
                    "scrub (osd.{osd_id}): pg {pg} has {} object(s) with no intact copy",
                    r.damaged_objects
                ));
            } else if was > 0 && r.damaged_objects == 0 {
                out.push(format!(
                    "pg {pg}: no object without an intact copy any more (osd.{osd_id})"
                ));
            }
        }
        if let Some(prev) = self.counters.get(&osd_id) {
            let grown = |name: &str| {
                counter(counters, name)
                    .unwrap_or(0)
                    .saturating_sub(counter(prev, name).unwrap_or(0))
            };
            let (found, repaired) = (grown("scrub_inconsistent"), grown("scrub_repaired"));
            if found > 0 || repaired > 0 {
                out.push(format!(
                    "scrub (osd.{osd_id}): {found} inconsistent object(s) found, {repaired} repaired"
                ));
            }
        }
        out
    }

    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        osd_id: u32,
        epoch: u64,
        reports: Vec<PgReport>,
        counters: Vec<(String, u64)>,
    ) -> Option<MapChange> {
        if !self.map.osds.contains_key(&osd_id) {
            return None;
        }
        self.last_heartbeat_ms.insert(osd_id, now_ms);
        self.reports.insert(osd_id, (epoch, reports));
        let (nearfull, full) = space_flags(&self.map, &counters);
        self.counters.insert(osd_id, counters);
        let (bytes, objects) = self.counters.values().fold((0, 0), |acc, c| {
            (
                acc.0 + counter(c, "recovered_bytes").unwrap_or(0),
                acc.1 + counter(c, "recovered_objects").unwrap_or(0),
            )
        });
        self.recovery_samples.push_back((now_ms, bytes, objects));
        while self
            .recovery_samples
            .front()
            .is_some_and(|(t, _, _)| now_ms.saturating_sub(*t) > RATE_WINDOW_MS)
        {
            self.recovery_samples.pop_front();
        }
        let o = self.map.osds.get(&osd_id)?;
        if o.nearfull == nearfull && o.full == full {
            return None;
        }
        // Flags are in the map so clients and primaries refuse writes to a full pool
        // without asking anyone.
        let (_, next) = propose(&self.map, |m| {
            if let Some(o) = m.osds.get_mut(&osd_id) {
                o.nearfull = nearfull;
                o.full = full;
            }
            Ok(())
        })
        .ok()?;
        next.map(|next| MapChange {
            reason: format!("osd.{osd_id}: nearfull={nearfull} full={full}"),
            next,
        })
    }

    /// Time passed: the next map marking daemons down (no heartbeat for `down_after_ms`)
    /// or, once none is due, out (down for `out_after_ms`). Call again after installing a
    /// change: one change per call.
    pub fn tick(&mut self, now_ms: u64) -> Option<MapChange> {
        let down_after_ms = self.timing.down_after_ms;
        let stale: Vec<u32> = self
            .map
            .osds
            .values()
            .filter(|o| o.up)
            .filter(|o| {
                self.last_heartbeat_ms
                    .get(&o.id)
                    .is_none_or(|t| now_ms.saturating_sub(*t) > down_after_ms)
            })
            .map(|o| o.id)
            .collect();
        if !stale.is_empty() {
            let (_, next) = propose(&self.map, |m| {
                for id in &stale {
                    if let Some(o) = m.osds.get_mut(id) {
                        o.up = false;
                    }
                }
                Ok(())
            })
            .ok()?;
            for id in &stale {
                self.down_since_ms.entry(*id).or_insert(now_ms);
            }
            return next.map(|next| MapChange {
                reason: format!("marked {stale:?} down after {down_after_ms} ms without heartbeat"),
                next,
            });
        }
        self.out_due(now_ms)
    }

    fn out_due(&mut self, now_ms: u64) -> Option<MapChange> {
        let out_after_ms = self.timing.out_after_ms;
        if out_after_ms == 0 {
            return None;
        }
        let down: Vec<u32> = self
            .map
            .osds
            .values()
            .filter(|o| !o.up && o.in_cluster)
            .map(|o| o.id)
            .collect();
        // Forget daemons that came back or were taken out; start the clock for daemons
        // found down otherwise (marked by hand, or down when the monitor started).
        self.down_since_ms.retain(|id, _| down.contains(id));
        for id in &down {
            self.down_since_ms.entry(*id).or_insert(now_ms);
        }
        let due: Vec<u32> = self
            .down_since_ms
            .iter()
            .filter(|(_, t)| now_ms.saturating_sub(**t) >= out_after_ms)
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return None;
        }
        let (_, next) = propose(&self.map, |m| {
            for id in &due {
                if let Some(o) = m.osds.get_mut(id) {
                    if !o.up {
                        o.in_cluster = false;
                        // Marked in again when it boots (not so after `osd out`).
                        o.auto_out = true;
                    }
                }
            }
            Ok(())
        })
        .ok()?;
        next.map(|next| MapChange {
            reason: format!(
                "marked {due:?} out after {out_after_ms} ms down; their data is being \
                 re-created on the other daemons"
            ),
            next,
        })
    }

    /// An administrative command given as its arguments: its answer as JSON (see
    /// [`MonCore::execute`] for the typed one) and the next map to commit, if it changes
    /// the map (the answer's `epoch` is that map's).
    pub fn command(
        &self,
        args: &[String],
    ) -> Result<(serde_json::Value, Option<ClusterMap>), String> {
        let (reply, next) = self.execute(&AdminCommand::parse(args)?)?;
        let json = serde_json::to_value(&reply).map_err(|e| e.to_string())?;
        Ok((json, next))
    }

    /// A typed administrative command: its typed answer and the next map, if it changes
    /// it (the answer's `epoch` is that map's).
    pub fn execute(&self, cmd: &AdminCommand) -> Result<(AdminReply, Option<ClusterMap>), String> {
        match cmd {
            AdminCommand::LockAcquire { .. }
            | AdminCommand::LockRenew { .. }
            | AdminCommand::LockRelease { .. } => {
                Err("image lock commands change lease state: run them with execute_at".to_string())
            }
            AdminCommand::Snap { .. }
            | AdminCommand::SnapChild { .. }
            | AdminCommand::SnapTrimmed { .. } => {
                Err("snapshot commands need the wall clock: run them with execute_at".to_string())
            }
            AdminCommand::MonMetrics { .. } | AdminCommand::MetricsRegister { .. } => {
                Err("metrics registrations are kept by the monitor node".to_string())
            }
            AdminCommand::MonLs | AdminCommand::MonAdd { .. } | AdminCommand::MonRm { .. } => Err(
                "monitor membership is Raft state: the monitor shell runs mon commands".to_string(),
            ),
            AdminCommand::AuthLs
            | AdminCommand::AuthGet { .. }
            | AdminCommand::AuthAdd { .. }
            | AdminCommand::AuthCaps { .. }
            | AdminCommand::AuthRm { .. }
            | AdminCommand::AuthApply { .. } => Err(
                "the key database is Raft state: the monitor shell runs auth commands".to_string(),
            ),
            AdminCommand::Status => Ok((
                AdminReply::Status(Box::new(crate::status::status(self))),
                None,
            )),
            AdminCommand::PoolLs => {
                Ok((AdminReply::PoolLs(crate::status::status(self).pools), None))
            }
            AdminCommand::PoolCreate {
                name,
                size,
                min_size,
                pg_count,
            } => {
                let (size, min_size, pg_count) = (*size, *min_size, *pg_count);
                let name = name.clone();
                let (id, next) = propose(&self.map, |m| {
                    m.add_pool(&name, PoolKind::Replicated { size, min_size }, pg_count, 0)
                        .map_err(|e| e.to_string())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((
                    AdminReply::PoolCreated(PoolCreated {
                        pool: name,
                        id,
                        epoch,
                    }),
                    next,
                ))
            }
            AdminCommand::PoolCreateEc {
                name,
                k,
                m,
                min_size,
                matrix,
                stripe_unit_bytes,
                pg_count,
            } => {
                let (k, m, min_size, matrix, stripe_unit_bytes, pg_count) =
                    (*k, *m, *min_size, *matrix, *stripe_unit_bytes, *pg_count);
                let name = name.clone();
                let (id, next) = propose(&self.map, |map| {
                    // The first rule placing positionally (the embedded map's erasure_rule).
                    let rule = (0..map.crush.rules.len() as i32)
                        .find(|&r| {
                            map.crush.rule(r).is_some_and(|rule| {
                                rule.steps.iter().any(|s| {
                                    matches!(
                                        s,
                                        spindle_crush::Step::ChooseIndep { .. }
                                            | spindle_crush::Step::ChooseLeafIndep { .. }
                                    )
                                })
                            })
                        })
                        .ok_or("the CRUSH map has no indep rule for erasure-coded pools")?;
                    map.add_pool(
                        &name,
                        PoolKind::Erasure {
                            k,
                            m,
                            min_size,
                            matrix,
                            stripe_unit_bytes,
                        },
                        pg_count,
                        rule,
                    )
                    .map_err(|e| e.to_string())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((
                    AdminReply::PoolCreated(PoolCreated {
                        pool: name,
                        id,
                        epoch,
                    }),
                    next,
                ))
            }
            AdminCommand::PoolRm { name } => {
                let name = name.clone();
                let (id, next) = propose(&self.map, |m| {
                    m.remove_pool(&name).map_err(|e| e.to_string())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((
                    AdminReply::PoolRemoved(PoolRemoved {
                        removed: name,
                        id,
                        epoch,
                    }),
                    next,
                ))
            }
            AdminCommand::Osd { verb, id } => {
                let (verb, id) = (*verb, *id);
                let ((), next) = propose(&self.map, |m| {
                    let osd = m
                        .osds
                        .get_mut(&id)
                        .ok_or_else(|| format!("no storage daemon osd.{id}"))?;
                    match verb {
                        // An administrator's decision: stays out until `osd in`.
                        OsdVerb::Out => {
                            osd.in_cluster = false;
                            osd.auto_out = false;
                        }
                        OsdVerb::In => {
                            osd.in_cluster = true;
                            osd.auto_out = false;
                        }
                        OsdVerb::Down => osd.up = false,
                    }
                    Ok(())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((
                    AdminReply::OsdMarked(OsdMarked {
                        osd: id,
                        done: verb,
                        epoch,
                    }),
                    next,
                ))
            }
            AdminCommand::CrushSet { text } => {
                let crush = spindle_crush::text::parse_text(text)
                    .map_err(|e| format!("CRUSH map does not parse: {e}"))?;
                crush
                    .validate()
                    .map_err(|e| format!("CRUSH map is invalid: {e}"))?;
                let ((), next) = propose(&self.map, |m| {
                    let mut next = m.clone();
                    next.crush = crush;
                    for id in next.osds.keys() {
                        if (*id as i64) >= next.crush.max_devices as i64 {
                            return Err(format!("osd.{id} is not a device of the new map"));
                        }
                    }
                    for pool in next.pools.values() {
                        next.check_pool(pool).map_err(|e| e.to_string())?;
                    }
                    *m = next;
                    Ok(())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((AdminReply::CrushSet(CrushSet { epoch }), next))
            }
            AdminCommand::OsdAdd { weight, host } => {
                let weight = *weight;
                let (id, next) = propose(&self.map, |m| {
                    let ids: Vec<u32> = m.osds.keys().copied().collect();
                    let mut daemons = spindle_map::embedded_layout(&m.crush, &ids).ok_or(
                        "the CRUSH map was set by hand: add the new daemon to it \
                         (`spindle crush set-map`) instead",
                    )?;
                    let id = ids.iter().max().map_or(0, |x| x + 1);
                    daemons.push(spindle_map::CrushDaemon {
                        id,
                        weight: (weight * 65536.0) as u32,
                        host: host.clone().unwrap_or_else(|| spindle_map::own_host(id)),
                    });
                    let crush =
                        spindle_map::crush_map_of_hosts(&daemons).map_err(|e| e.to_string())?;
                    m.crush = crush;
                    m.osds.insert(id, OsdInfo::joining(id));
                    Ok(id)
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((AdminReply::OsdAdded(OsdAdded { osd: id, epoch }), next))
            }
            AdminCommand::SetRatio { full, ratio_ppm } => {
                let (full, ppm) = (*full, *ratio_ppm);
                let verb = if full {
                    "set-full-ratio"
                } else {
                    "set-nearfull-ratio"
                };
                let ((), next) = propose(&self.map, |m| {
                    let (nearfull_ppm, full_ppm) = if full {
                        (m.nearfull_ratio_ppm, ppm)
                    } else {
                        (ppm, m.full_ratio_ppm)
                    };
                    if nearfull_ppm > full_ppm {
                        return Err(format!(
                            "nearfull ratio {} would be above full ratio {}",
                            nearfull_ppm as f64 / 1e6,
                            full_ppm as f64 / 1e6
                        ));
                    }
                    m.nearfull_ratio_ppm = nearfull_ppm;
                    m.full_ratio_ppm = full_ppm;
                    Ok(())
                })?;
                let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
                Ok((
                    AdminReply::RatioSet(RatioSet {
                        done: verb.to_string(),
                        ratio: ppm as f64 / 1e6,
                        epoch,
                    }),
                    next,
                ))
            }
            AdminCommand::CrushGet => Ok((
                AdminReply::CrushMap(spindle_crush::text::print_text(&self.map.crush)),
                None,
            )),
        }
    }
}

/// The value of counter `name` in a daemon's heartbeat counters.
pub(crate) fn counter(c: &[(String, u64)], name: &str) -> Option<u64> {
    c.iter().find(|(n, _)| n == name).map(|x| x.1)
}

/// (nearfull, full) of a daemon from its heartbeat counters: its file system's used
/// ratio against the map's ratios, or its store refusing new data (full mode).
pub(crate) fn space_flags(map: &ClusterMap, c: &[(String, u64)]) -> (bool, bool) {
    let store_full = counter(c, "store_full").unwrap_or(0) != 0;
    let (total, used) = (
        counter(c, "fs_total_bytes").unwrap_or(0),
        counter(c, "fs_used_bytes").unwrap_or(0),
    );
    let ratio_ppm = if total == 0 {
        0
    } else {
        (used as u128 * 1_000_000 / total as u128) as u64
    };
    let full = store_full || ratio_ppm >= map.full_ratio_ppm as u64;
    let nearfull = full || ratio_ppm >= map.nearfull_ratio_ppm as u64;
    (nearfull, full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{first_map, InitSpec};

    const TIMING: MonTiming = MonTiming {
        down_after_ms: 2_000,
        out_after_ms: 30_000,
    };

    fn core_with(osds: u32, timing: MonTiming) -> MonCore {
        let spec = InitSpec {
            osd_count: osds,
            osd_hosts: Vec::new(),
            default_pool: Some(("default".into(), 3, 2, 8)),
        };
        let map = first_map(&spec, 7).expect("first map");
        MonCore::new(map, timing, 0)
    }

    /// Applies every change the core proposes, as the shell does after saving it.
    fn commit(core: &mut MonCore, next: Option<ClusterMap>, now_ms: u64) {
        if let Some(next) = next {
            core.install(next, now_ms);
        }
    }

    fn boot_all(core: &mut MonCore, now_ms: u64) {
        let ids: Vec<u32> = core.map().osds.keys().copied().collect();
        for id in ids {
            let next = core.boot(now_ms, id, &format!("127.0.0.1:{}", 7000 + id), 100 + id);
            commit(core, next.expect("known daemon"), now_ms);
        }
    }

    fn heartbeat_all(core: &mut MonCore, now_ms: u64, except: &[u32]) {
        let ids: Vec<u32> = core.map().osds.keys().copied().collect();
        for id in ids.into_iter().filter(|i| !except.contains(i)) {
            let epoch = core.epoch();
            let change = core.heartbeat(now_ms, id, epoch, Vec::new(), Vec::new());
            assert!(change.is_none(), "no counters, no flag change");
        }
    }

    /// Runs ticks (and installs what they propose) until the core proposes nothing.
    fn settle(core: &mut MonCore, now_ms: u64) -> Vec<String> {
        let mut reasons = Vec::new();
        while let Some(MapChange { next, reason }) = core.tick(now_ms) {
            core.install(next, now_ms);
            reasons.push(reason);
            assert!(reasons.len() < 8, "tick keeps proposing: {reasons:?}");
        }
        reasons
    }

    #[test]
    fn booting_marks_up_once_and_a_re_registration_changes_nothing() {
        let mut core = core_with(3, TIMING);
        assert_eq!(core.epoch(), 1);
        boot_all(&mut core, 10);
        assert_eq!(core.epoch(), 4, "one epoch per daemon that came up");
        let o = &core.map().osds[&1];
        assert!(o.up && o.up_from == 3, "{o:?}");
        // The same process registering again (monitor restart): no epoch.
        assert!(matches!(core.boot(20, 1, "127.0.0.1:7001", 101), Ok(None)));
        // A restarted process (new pid): a new epoch and a new up_from.
        let next = core.boot(30, 1, "127.0.0.1:7001", 999).unwrap().unwrap();
        assert_eq!(next.epoch, 5);
        assert_eq!(next.osds[&1].up_from, 5);
        assert!(
            core.boot(30, 9, "x", 1).is_err(),
            "unknown daemons are refused"
        );
    }

    #[test]
    fn a_silent_daemon_is_marked_down_after_the_grace_period_then_out() {
        let mut core = core_with(3, TIMING);
        boot_all(&mut core, 0);
        let booted = core.epoch();
        for now in (500..=2_000).step_by(500) {
            heartbeat_all(&mut core, now, &[2]);
            assert!(
                settle(&mut core, now).is_empty(),
                "nobody is late at {now} ms"
            );
        }
        heartbeat_all(&mut core, 2_001, &[2]);
        let reasons = settle(&mut core, 2_001);
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(!core.map().osds[&2].up && core.map().osds[&2].in_cluster);
        assert_eq!(core.epoch(), booted + 1);
        // Out only once down for out_after_ms (the others keep beating).
        for now in (2_500..2_001 + 30_000).step_by(500) {
            heartbeat_all(&mut core, now, &[2]);
            assert!(settle(&mut core, now).is_empty(), "{now}");
        }
        heartbeat_all(&mut core, 32_001, &[2]);
        assert_eq!(settle(&mut core, 32_001).len(), 1);
        assert!(!core.map().osds[&2].in_cluster, "marked out");
        assert!(core.map().osds[&0].in_cluster && core.map().osds[&0].up);
    }

    #[test]
    fn a_daemon_that_comes_back_is_not_marked_out_and_out_zero_means_never() {
        let mut core = core_with(2, TIMING);
        boot_all(&mut core, 0);
        heartbeat_all(&mut core, 2_500, &[1]);
        assert_eq!(settle(&mut core, 2_500).len(), 1, "osd.1 down");
        // Back before out_after_ms: the clock is forgotten.
        let back = core.boot(10_000, 1, "127.0.0.1:7001", 55).unwrap();
        commit(&mut core, back, 10_000);
        heartbeat_all(&mut core, 40_000, &[]);
        assert!(settle(&mut core, 40_000).is_empty());
        assert!(core.map().osds[&1].in_cluster && core.map().osds[&1].up);

        let mut never = core_with(
            2,
            MonTiming {
                down_after_ms: 2_000,
                out_after_ms: 0,
            },
        );
        boot_all(&mut never, 0);
        heartbeat_all(&mut never, 3_000, &[1]);
        assert_eq!(settle(&mut never, 3_000).len(), 1);
        heartbeat_all(&mut never, 10_000_000, &[1]);
        assert!(settle(&mut never, 10_000_000).is_empty());
        assert!(never.map().osds[&1].in_cluster);
    }

    #[test]
    fn a_daemon_marked_out_for_being_down_is_marked_in_when_it_boots_but_not_after_osd_out() {
        let mut core = core_with(3, TIMING);
        boot_all(&mut core, 0);
        heartbeat_all(&mut core, 2_500, &[1, 2]);
        assert_eq!(settle(&mut core, 2_500).len(), 1, "osd.1 and osd.2 down");
        // osd.2 is taken out by hand while down: the administrator's decision.
        let (_, next) = core
            .command(&["osd".into(), "out".into(), "2".into()])
            .unwrap();
        commit(&mut core, next, 3_000);
        heartbeat_all(&mut core, 33_000, &[1, 2]);
        assert_eq!(settle(&mut core, 33_000).len(), 1, "osd.1 out");
        let o = &core.map().osds[&1];
        assert!(!o.in_cluster && o.auto_out, "{o:?}");
        let o = &core.map().osds[&2];
        assert!(!o.in_cluster && !o.auto_out, "{o:?}");

        // A new leader (a core on the committed map) knows which is which.
        let mut core = MonCore::new(core.map().clone(), TIMING, 40_000);
        let back = core.boot(40_100, 1, "127.0.0.1:7001", 201).unwrap();
        let back = back.expect("up and in again");
        assert!(back.osds[&1].up && back.osds[&1].in_cluster && !back.osds[&1].auto_out);
        commit(&mut core, Some(back), 40_100);
        let back = core
            .boot(40_200, 2, "127.0.0.1:7002", 202)
            .unwrap()
            .unwrap();
        assert!(back.osds[&2].up && !back.osds[&2].in_cluster, "stays out");
        commit(&mut core, Some(back), 40_200);
        // A re-registration changes nothing; `osd in` brings osd.2 back.
        assert!(matches!(
            core.boot(40_300, 1, "127.0.0.1:7001", 201),
            Ok(None)
        ));
        let (_, next) = core
            .command(&["osd".into(), "in".into(), "2".into()])
            .unwrap();
        assert!(next.unwrap().osds[&2].in_cluster);

        // Marked out by the monitor, then `osd out` by hand: the administrator wins.
        let mut core = core_with(2, TIMING);
        boot_all(&mut core, 0);
        heartbeat_all(&mut core, 2_500, &[1]);
        settle(&mut core, 2_500);
        heartbeat_all(&mut core, 33_000, &[1]);
        settle(&mut core, 33_000);
        assert!(core.map().osds[&1].auto_out);
        let (_, next) = core
            .command(&["osd".into(), "out".into(), "1".into()])
            .unwrap();
        commit(&mut core, next, 34_000);
        let back = core
            .boot(35_000, 1, "127.0.0.1:7001", 301)
            .unwrap()
            .unwrap();
        assert!(back.osds[&1].up && !back.osds[&1].in_cluster);
    }

    #[test]
    fn a_new_core_and_a_new_daemon_get_a_full_grace_period() {
        let mut core = core_with(2, TIMING);
        boot_all(&mut core, 0);
        let map = core.map().clone();
        // A monitor restart at t = 1 h: nobody is down before 2 s of silence.
        let mut restarted = MonCore::new(map, TIMING, 3_600_000);
        assert!(settle(&mut restarted, 3_601_999).is_empty());
        assert_eq!(settle(&mut restarted, 3_602_001).len(), 1, "both at once");
        // `osd add` at t = 5 s: the new daemon is not marked down 1 ms later.
        let (out, next) = core
            .command(&["osd".into(), "add".into(), "1".into()])
            .unwrap();
        assert_eq!(out["osd"], 2);
        commit(&mut core, next, 5_000);
        heartbeat_all(&mut core, 5_001, &[]);
        assert!(settle(&mut core, 5_001).is_empty());
    }

    #[test]
    fn proposals_carry_exactly_one_change_and_empty_changes_make_no_epoch() {
        let core = core_with(3, TIMING);
        let (_, none) = propose(core.map(), |_| Ok(())).unwrap();
        assert!(none.is_none());
        let (out, next) = core
            .command(&["osd".into(), "out".into(), "1".into()])
            .unwrap();
        let next = next.expect("a change");
        assert_eq!(next.epoch, core.epoch() + 1);
        assert_eq!(out["epoch"], next.epoch);
        assert!(!next.osds[&1].in_cluster && next.osds[&0].in_cluster);
        // Reading commands never propose.
        assert!(core.command(&["status".into()]).unwrap().1.is_none());
        assert!(core.command(&["bogus".into()]).is_err());
        assert!(core
            .command(&["pool".into(), "rm".into(), "nope".into()])
            .is_err());
    }

    #[test]
    #[should_panic(expected = "one epoch at a time")]
    fn installing_a_map_that_skips_an_epoch_is_a_bug() {
        let mut core = core_with(1, TIMING);
        let mut next = core.map().clone();
        next.epoch += 2;
        core.install(next, 0);
    }

    #[test]
    fn full_flags_follow_the_heartbeat_counters() {
        let mut core = core_with(2, TIMING);
        boot_all(&mut core, 0);
        let counters = |used: u64| {
            vec![
                ("fs_total_bytes".to_string(), 1000),
                ("fs_used_bytes".to_string(), used),
            ]
        };
        let e = core.epoch();
        assert!(core.heartbeat(1, 0, e, vec![], counters(500)).is_none());
        let nearfull = core.heartbeat(2, 0, e, vec![], counters(900)).unwrap();
        assert!(nearfull.next.osds[&0].nearfull && !nearfull.next.osds[&0].full);
        core.install(nearfull.next, 2);
        let full = core.heartbeat(3, 0, e, vec![], counters(960)).unwrap();
        assert!(full.next.osds[&0].full);
        core.install(full.next, 3);
        assert!(core.map().pool_full(1));
        let back = core.heartbeat(4, 0, e, vec![], counters(100)).unwrap();
        assert!(!back.next.osds[&0].nearfull && !back.next.osds[&0].full);
    }
}
