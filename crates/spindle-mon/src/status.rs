//! The `spindle status` document and the health checks, computed from the monitor's core.

use crate::core::{counter, MonCore, MON_CLOCK_DRIFT_ALLOWED_MS};
use crate::reply::{
    ClusterRecovery, ErasureStatus, HealthCheck, HealthReport, ImageReport, InconsistentPg,
    MonClock, OsdStatus, PgStatus, PoolRecovery, PoolStatus, Status,
};
use spindle_map::{OsdInfo, PgId, PoolKind};
use spindle_proto::msg::{PgReport, PgStateCode};
use std::collections::{BTreeMap, HashMap};

/// The `spindle status` document.
pub fn status(st: &MonCore) -> Status {
    const STATES: usize = PgStatus::ALL.len();
    let map = &st.map;
    let mut report_of: HashMap<(u32, u32, u32), (u64, &PgReport)> = HashMap::new();
    for (osd, (epoch, reports)) in &st.reports {
        for r in reports {
            report_of.insert((*osd, r.pool, r.pg), (*epoch, r));
        }
    }
    let mut totals = [0u64; STATES];
    // (group, objects with no intact copy) as the group's current primary reports it.
    let mut damaged: Vec<(PgId, u64)> = Vec::new();
    let (mut missing_objects_total, mut missing_bytes_total) = (0u64, 0u64);
    let mut pools = Vec::new();
    let mut objects_total = 0u64;
    for pool in map.pools.values() {
        let mut counts = [0u64; STATES];
        let (mut objects, mut missing_objects, mut missing_bytes) = (0u64, 0u64, 0u64);
        for pg in 0..pool.pg_count {
            let Some(mapping) = st.placement.pg(pool.id, pg) else {
                continue;
            };
            let serving = if pool.is_erasure() {
                pool.read_size()
            } else {
                pool.min_size()
            };
            let report = mapping
                .up
                .first()
                .and_then(|primary| report_of.get(&(*primary, pool.id, pg)));
            let damaged_objects = report.map_or(0, |(_, r)| r.damaged_objects);
            if damaged_objects > 0 {
                damaged.push((PgId { pool: pool.id, pg }, damaged_objects));
            }
            let state = if (mapping.up.len() as u32) < serving {
                PgStatus::Inactive
            } else {
                match report {
                    Some((e, r)) if *e >= map.epoch => {
                        objects += r.objects;
                        missing_objects += r.missing_objects;
                        missing_bytes += r.missing_bytes;
                        match r.state {
                            PgStateCode::Clean
                            | PgStateCode::Degraded
                            | PgStateCode::Recovering
                            | PgStateCode::Backfilling
                                if damaged_objects > 0 =>
                            {
                                PgStatus::Inconsistent
                            }
                            PgStateCode::Clean if mapping.up.len() as u32 >= pool.size() => {
                                PgStatus::Clean
                            }
                            PgStateCode::Clean | PgStateCode::Degraded => PgStatus::Degraded,
                            PgStateCode::Recovering => PgStatus::Recovering,
                            PgStateCode::Backfilling => PgStatus::Backfilling,
                            PgStateCode::Peering => PgStatus::Peering,
                            PgStateCode::Incomplete => PgStatus::Incomplete,
                            PgStateCode::Inactive => PgStatus::Inactive,
                        }
                    }
                    _ => PgStatus::Peering,
                }
            };
            let slot = state as usize;
            counts[slot] += 1;
        }
        for i in 0..counts.len() {
            totals[i] += counts[i];
        }
        objects_total += objects;
        missing_objects_total += missing_objects;
        missing_bytes_total += missing_bytes;
        pools.push(PoolStatus {
            id: pool.id,
            name: pool.name.clone(),
            kind: if pool.is_erasure() {
                "erasure"
            } else {
                "replicated"
            }
            .to_string(),
            erasure: match pool.kind {
                PoolKind::Erasure {
                    k,
                    m,
                    matrix,
                    stripe_unit_bytes,
                    ..
                } => Some(ErasureStatus {
                    k,
                    m,
                    matrix: spindle_map::EC_MATRIX_NAMES
                        .get(matrix as usize)
                        .map(|n| n.to_string()),
                    stripe_unit: stripe_unit_bytes,
                }),
                PoolKind::Replicated { .. } => None,
            },
            size: pool.size(),
            min_size: pool.min_size(),
            pg_count: pool.pg_count,
            crush_rule: pool.crush_rule,
            objects,
            pgs: by_state(counts),
            recovery: PoolRecovery {
                objects_left: missing_objects,
                bytes_left: missing_bytes,
            },
        });
    }
    let osds: Vec<_> = map
        .osds
        .values()
        .map(|o| {
            let counters: BTreeMap<String, u64> = st
                .counters
                .get(&o.id)
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            let get = |k: &str| counters.get(k).copied();
            OsdStatus {
                id: o.id,
                addr: o.addr.clone(),
                pid: o.pid,
                up: o.up,
                in_cluster: o.in_cluster,
                weight: o.weight as f64 / 65536.0,
                crush_weight: crush_weight(&map.crush, o.id),
                up_from: o.up_from,
                total_bytes: get("fs_total_bytes"),
                used_bytes: get("fs_used_bytes"),
                avail_bytes: get("fs_avail_bytes"),
                nearfull: o.nearfull,
                full: o.full,
                healthy: get("store_failed").is_none_or(|f| f == 0),
                host: spindle_map::host_of(&map.crush, o.id),
                metrics_addr: st.metrics_addrs.get(&o.id).cloned(),
                counters,
            }
        })
        .collect();
    let (bytes_per_sec, objects_per_sec) =
        match (st.recovery_samples.front(), st.recovery_samples.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                let secs = (b.0 - a.0) as f64 / 1000.0;
                (
                    b.1.saturating_sub(a.1) as f64 / secs,
                    b.2.saturating_sub(a.2) as f64 / secs,
                )
            }
            _ => (0.0, 0.0),
        };
    let mut health = Health::default();
    let down: Vec<String> = map
        .osds
        .values()
        .filter(|o| o.in_cluster && !o.up)
        .map(|o| format!("osd.{}", o.id))
        .collect();
    if !down.is_empty() {
        health.add(
            "OSD_DOWN",
            Severity::Warn,
            format!("{} daemon(s) down: {}", down.len(), down.join(", ")),
        );
    }
    let not_active = totals[4] + totals[5] + totals[6];
    if not_active > 0 {
        health.add(
            "PG_AVAILABILITY",
            Severity::Warn,
            format!("{not_active} placement group(s) peering, incomplete or inactive"),
        );
    }
    let degraded = totals[1] + totals[2] + totals[3];
    if degraded > 0 {
        health.add(
            "PG_DEGRADED",
            Severity::Warn,
            format!("{degraded} placement group(s) degraded or recovering"),
        );
    }
    space_health(st, &mut health);
    slow_ops_health(st, &mut health);
    clock_health(st, &mut health);
    if !damaged.is_empty() {
        health.add("PG_DAMAGED", Severity::Err, damage_message(&damaged));
    }
    let inconsistent_pgs = damaged
        .iter()
        .map(|(pg, n)| InconsistentPg {
            pg: pg.to_string(),
            damaged_objects: *n,
        })
        .collect();
    Status {
        cluster_id: format!("{:016x}", map.cluster_id),
        epoch: map.epoch,
        nearfull_ratio: map.nearfull_ratio_ppm as f64 / 1e6,
        full_ratio: map.full_ratio_ppm as f64 / 1e6,
        health: health.report(),
        osds,
        pools,
        objects: objects_total,
        pgs: by_state(totals),
        inconsistent_pgs,
        events: st.events.iter().cloned().collect(),
        service_metrics_addrs: st
            .service_metrics
            .iter()
            .map(|(name, (addr, _, _))| (name.clone(), addr.clone()))
            .collect(),
        images: {
            let mut images: Vec<ImageReport> = st
                .service_metrics
                .iter()
                .flat_map(|(name, (_, _, images))| {
                    images.iter().map(move |i| ImageReport {
                        served_by: name.clone(),
                        ..i.clone()
                    })
                })
                .collect();
            images.sort_by(|a, b| {
                (&a.pool, &a.image, &a.served_by).cmp(&(&b.pool, &b.image, &b.served_by))
            });
            images
        },
        mon_metrics_addrs: st
            .mon_metrics
            .iter()
            .filter(|(_, (addr, _, _))| addr != crate::NO_METRICS_ADDR)
            .map(|(id, (addr, _, _))| (*id, addr.clone()))
            .collect(),
        mon_clock: st
            .mon_metrics
            .iter()
            .filter_map(|(id, (_, _, c))| {
                c.map(|c| {
                    (
                        *id,
                        MonClock {
                            skew_ms: c.skew_ms,
                            rtt_ms: c.rtt_ms,
                        },
                    )
                })
            })
            .collect(),
        recovery: ClusterRecovery {
            objects_left: missing_objects_total,
            bytes_left: missing_bytes_total,
            bytes_per_sec,
            objects_per_sec,
        },
    }
}

/// Placement groups per state name.
fn by_state(counts: [u64; PgStatus::ALL.len()]) -> BTreeMap<String, u64> {
    PgStatus::ALL
        .iter()
        .zip(counts)
        .map(|(s, v)| (s.name().to_string(), v))
        .collect()
}

/// CRUSH weight of a daemon (sum over the map's buckets holding it), as a float.
fn crush_weight(crush: &spindle_crush::CrushMap, id: u32) -> f64 {
    crush
        .buckets
        .iter()
        .flatten()
        .flat_map(|b| b.items.iter().zip(&b.item_weights))
        .filter(|(item, _)| **item == id as i32)
        .map(|(_, w)| *w as f64 / 65536.0)
        .sum()
}

/// Longest list of PG ids named in one health message.
const HEALTH_PGS_NAMED_MAX: usize = 16;

/// The `PG_DAMAGED` message (Ceph's "Possible data damage"): how many groups and objects,
/// and which groups (the first [`HEALTH_PGS_NAMED_MAX`]).
fn damage_message(damaged: &[(PgId, u64)]) -> String {
    let objects: u64 = damaged.iter().map(|(_, n)| n).sum();
    let mut named: Vec<String> = damaged
        .iter()
        .take(HEALTH_PGS_NAMED_MAX)
        .map(|(pg, n)| format!("{pg} ({n})"))
        .collect();
    if damaged.len() > HEALTH_PGS_NAMED_MAX {
        named.push(format!("and {} more", damaged.len() - HEALTH_PGS_NAMED_MAX));
    }
    format!(
        "Possible data damage: {} placement group(s) inconsistent, {objects} object(s) with \
         no intact copy: {}",
        damaged.len(),
        named.join(", ")
    )
}

/// How bad a health check is (Ceph's HEALTH_WARN / HEALTH_ERR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warn,
    Err,
}

/// OSD_NEARFULL, OSD_FULL, POOL_FULL and OSD_UNHEALTHY (a store latched by an I/O error).
fn space_health(st: &MonCore, health: &mut Health) {
    let map = &st.map;
    let list = |f: &dyn Fn(&OsdInfo) -> bool| -> Vec<String> {
        map.osds
            .values()
            .filter(|o| f(o))
            .map(|o| format!("osd.{}", o.id))
            .collect()
    };
    let full = list(&|o| o.full);
    let nearfull = list(&|o| o.nearfull && !o.full);
    let unhealthy = list(&|o| {
        o.up && st
            .counters
            .get(&o.id)
            .is_some_and(|c| counter(c, "store_failed").unwrap_or(0) != 0)
    });
    if !nearfull.is_empty() {
        health.add(
            "OSD_NEARFULL",
            Severity::Warn,
            format!(
                "{} daemon(s) nearfull (above {}): {}",
                nearfull.len(),
                map.nearfull_ratio_ppm as f64 / 1e6,
                nearfull.join(", ")
            ),
        );
    }
    if !full.is_empty() {
        health.add(
            "OSD_FULL",
            Severity::Err,
            format!(
                "{} daemon(s) full (above {} or out of space): {}",
                full.len(),
                map.full_ratio_ppm as f64 / 1e6,
                full.join(", ")
            ),
        );
    }
    let pools: Vec<&str> = map
        .pools
        .values()
        .filter(|p| map.pool_full(p.id))
        .map(|p| p.name.as_str())
        .collect();
    if !pools.is_empty() {
        health.add(
            "POOL_FULL",
            Severity::Err,
            format!(
                "{} pool(s) full, new writes are refused (deletes work): {}",
                pools.len(),
                pools.join(", ")
            ),
        );
    }
    if !unhealthy.is_empty() {
        health.add(
            "OSD_UNHEALTHY",
            Severity::Err,
            format!(
                "{} daemon(s) refuse I/O after a disk error (restart to recover): {}",
                unhealthy.len(),
                unhealthy.join(", ")
            ),
        );
    }
}

/// MON_CLOCK_SKEW: monitors whose clock is surely (beyond the measurement's round trip)
/// further than [`MON_CLOCK_DRIFT_ALLOWED_MS`] from the leader's.
fn clock_health(st: &MonCore, health: &mut Health) {
    let skewed: Vec<String> = st
        .mon_metrics
        .iter()
        .filter_map(|(id, (_, _, c))| {
            let c = c.as_ref()?;
            clock_skewed(c.skew_ms, c.rtt_ms).then(|| format!("mon.{id} ({:+} ms)", c.skew_ms))
        })
        .collect();
    if !skewed.is_empty() {
        health.add(
            "MON_CLOCK_SKEW",
            Severity::Warn,
            format!(
                "clock skew detected on {} (against the leader's; allowed {} ms)",
                skewed.join(", "),
                MON_CLOCK_DRIFT_ALLOWED_MS
            ),
        );
    }
}

/// True if an offset measured as `skew_ms` over a round trip of `rtt_ms` is surely beyond
/// the allowed drift: the true offset lies within `skew_ms ± rtt_ms / 2`.
fn clock_skewed(skew_ms: i64, rtt_ms: u64) -> bool {
    skew_ms.unsigned_abs().saturating_sub(rtt_ms.div_ceil(2)) > MON_CLOCK_DRIFT_ALLOWED_MS
}

/// SLOW_OPS: client operations a daemon has left unanswered for longer than its
/// complaint time (`--slow-op-ms`), as reported with its last heartbeat.
fn slow_ops_health(st: &MonCore, health: &mut Health) {
    let mut total = 0u64;
    let mut oldest_ms = 0u64;
    let mut daemons = Vec::new();
    for o in st.map.osds.values().filter(|o| o.up) {
        let Some(c) = st.counters.get(&o.id) else {
            continue;
        };
        let n = counter(c, "slow_ops").unwrap_or(0);
        if n > 0 {
            total += n;
            oldest_ms = oldest_ms.max(counter(c, "slow_op_oldest_ms").unwrap_or(0));
            daemons.push(format!("osd.{}", o.id));
        }
    }
    if total > 0 {
        health.add(
            "SLOW_OPS",
            Severity::Warn,
            slow_ops_message(total, oldest_ms, &daemons),
        );
    }
}

/// Ceph's wording: "3 slow ops, oldest one blocked for 31 sec, daemons [osd.1] have slow
/// ops." (tenths of a second below 10 s: complaint times may be short).
fn slow_ops_message(total: u64, oldest_ms: u64, daemons: &[String]) -> String {
    let oldest = if oldest_ms < 10_000 {
        format!("{:.1}", oldest_ms as f64 / 1000.0)
    } else {
        (oldest_ms / 1000).to_string()
    };
    format!(
        "{total} slow ops, oldest one blocked for {oldest} sec, daemons [{}] have slow ops.",
        daemons.join(",")
    )
}

/// The cluster's health: named checks, each with a severity and a one-line message, as
/// Ceph reports them (`HEALTH_OK` when there are none). Shown by `spindle status`.
#[derive(Clone, Debug, Default)]
pub struct Health {
    checks: Vec<(&'static str, Severity, String)>,
}

impl Health {
    pub fn add(&mut self, name: &'static str, severity: Severity, message: String) {
        self.checks.push((name, severity, message));
    }

    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`: the worst check decides.
    pub fn status(&self) -> &'static str {
        match self.checks.iter().map(|c| c.1).max() {
            None => "HEALTH_OK",
            Some(Severity::Warn) => "HEALTH_WARN",
            Some(Severity::Err) => "HEALTH_ERR",
        }
    }

    /// The health part of the status document.
    pub fn report(&self) -> HealthReport {
        let checks = self
            .checks
            .iter()
            .map(|(name, sev, msg)| HealthCheck {
                name: name.to_string(),
                severity: match sev {
                    Severity::Warn => "HEALTH_WARN",
                    Severity::Err => "HEALTH_ERR",
                }
                .to_string(),
                message: msg.clone(),
            })
            .collect();
        HealthReport {
            status: self.status().to_string(),
            checks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_is_skewed_only_beyond_the_round_trips_uncertainty() {
        assert!(!clock_skewed(0, 0));
        assert!(!clock_skewed(50, 0));
        assert!(clock_skewed(51, 0));
        assert!(clock_skewed(-52, 1));
        assert!(!clock_skewed(-51, 1));
        assert!(!clock_skewed(-80, 60));
        assert!(clock_skewed(2000, 3));
    }

    #[test]
    fn the_slow_ops_check_speaks_like_ceph() {
        assert_eq!(
            slow_ops_message(3, 31_900, &["osd.1".into(), "osd.4".into()]),
            "3 slow ops, oldest one blocked for 31 sec, daemons [osd.1,osd.4] have slow ops."
        );
        assert_eq!(
            slow_ops_message(1, 450, &["osd.0".into()]),
            "1 slow ops, oldest one blocked for 0.5 sec, daemons [osd.0] have slow ops."
        );
    }

    #[test]
    fn the_damage_check_names_groups_and_counts_objects() {
        let m = damage_message(&[
            (PgId { pool: 1, pg: 0x1f }, 2),
            (PgId { pool: 2, pg: 3 }, 1),
        ]);
        assert_eq!(
            m,
            "Possible data damage: 2 placement group(s) inconsistent, 3 object(s) with no \
             intact copy: 1.1f (2), 2.3 (1)"
        );
        let many: Vec<(PgId, u64)> = (0..20).map(|pg| (PgId { pool: 1, pg }, 1)).collect();
        let m = damage_message(&many);
        assert!(m.contains("20 placement group(s)"), "{m}");
        assert!(m.ends_with("1.f (1), and 4 more"), "{m}");
    }
}
