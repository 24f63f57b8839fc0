//! The monitor's Prometheus metrics (`/metrics`, issue #22). Every monitor exports whether
//! it leads and the epoch it applied; the leader also exports the cluster as `spindle
//! status` shows it (health and its checks, daemons up and in with their space, placement
//! groups per pool and state, objects, recovery), from a status it refreshes every
//! [`STATUS_REFRESH_MS`] so a scrape never waits for the node thread.

use crate::reply::Status;
use spindle_metrics::Sample;

/// How often the leader refreshes the status its metrics show (a scraper polling faster
/// sees the same figures twice).
pub const STATUS_REFRESH_MS: u64 = 2000;

/// `HEALTH_OK` 0, `HEALTH_WARN` 1, `HEALTH_ERR` 2 (Ceph's `ceph_health_status`).
pub fn health_value(status: &str) -> f64 {
    match status {
        "HEALTH_OK" => 0.0,
        "HEALTH_WARN" => 1.0,
        _ => 2.0,
    }
}

/// What every monitor exports about itself.
pub fn monitor_samples(id: u64, leader: bool, epoch: u64) -> Vec<Sample> {
    vec![
        Sample::gauge(
            "spindle_mon_leader",
            "1 if this monitor leads the monitors' Raft group",
            if leader { 1.0 } else { 0.0 },
        )
        .label("mon", id.to_string()),
        Sample::gauge(
            "spindle_mon_map_epoch",
            "Epoch of the cluster map this monitor applied",
            epoch as f64,
        )
        .label("mon", id.to_string()),
    ]
}

/// The cluster as the leader sees it (see the module comment).
pub fn cluster_samples(s: &Status) -> Vec<Sample> {
    let mut out = vec![
        Sample::gauge(
            "spindle_health_status",
            "Cluster health: 0 HEALTH_OK, 1 HEALTH_WARN, 2 HEALTH_ERR",
            health_value(&s.health.status),
        ),
        Sample::gauge(
            "spindle_cluster_map_epoch",
            "Epoch of the cluster map",
            s.epoch as f64,
        ),
        Sample::gauge(
            "spindle_cluster_objects",
            "Objects in the cluster (one per object, not per copy)",
            s.objects as f64,
        ),
        Sample::gauge(
            "spindle_cluster_recovery_objects_left",
            "Objects some copy still misses",
            s.recovery.objects_left as f64,
        ),
        Sample::gauge(
            "spindle_cluster_recovery_bytes_left",
            "Bytes some copy still misses",
            s.recovery.bytes_left as f64,
        ),
        Sample::gauge(
            "spindle_cluster_recovery_bytes_per_second",
            "Recovery rate over the last minute",
            s.recovery.bytes_per_sec,
        ),
    ];
    for c in &s.health.checks {
        out.push(
            Sample::gauge(
                "spindle_health_check",
                "1 for each active health check (name and severity as `spindle health` shows)",
                1.0,
            )
            .label("name", c.name.clone())
            .label("severity", c.severity.clone()),
        );
    }
    for (id, c) in &s.mon_clock {
        out.push(
            Sample::gauge(
                "spindle_mon_clock_skew_seconds",
                "Each monitor's clock against the leader's (positive: ahead), last measured",
                c.skew_ms as f64 / 1000.0,
            )
            .label("mon", id.to_string()),
        );
    }
    for (state, n) in &s.pgs {
        out.push(
            Sample::gauge(
                "spindle_cluster_pgs",
                "Placement groups by state",
                *n as f64,
            )
            .label("state", state.clone()),
        );
    }
    let (mut total, mut used) = (0u64, 0u64);
    for o in &s.osds {
        let osd = o.id.to_string();
        let host = o.host.clone().unwrap_or_default();
        let with = |sample: Sample| sample.label("osd", osd.clone()).label("host", host.clone());
        out.push(with(Sample::gauge(
            "spindle_cluster_osd_up",
            "1 if the storage daemon is up",
            f64::from(u8::from(o.up)),
        )));
        out.push(with(Sample::gauge(
            "spindle_cluster_osd_in",
            "1 if the storage daemon holds data (in)",
            f64::from(u8::from(o.in_cluster)),
        )));
        if let (Some(t), Some(u)) = (o.total_bytes, o.used_bytes) {
            out.push(with(Sample::gauge(
                "spindle_cluster_osd_total_bytes",
                "Size of the daemon's file system (last heartbeat)",
                t as f64,
            )));
            out.push(with(Sample::gauge(
                "spindle_cluster_osd_used_bytes",
                "Used bytes of the daemon's file system (last heartbeat)",
                u as f64,
            )));
            if o.up && o.in_cluster {
                total += t;
                used += u;
            }
        }
    }
    out.push(Sample::gauge(
        "spindle_cluster_total_bytes",
        "Capacity of the daemons up and in",
        total as f64,
    ));
    out.push(Sample::gauge(
        "spindle_cluster_used_bytes",
        "Used bytes of the daemons up and in",
        used as f64,
    ));
    for p in &s.pools {
        let pool = p.name.clone();
        out.push(
            Sample::gauge("spindle_pool_objects", "Objects per pool", p.objects as f64)
                .label("pool", pool.clone()),
        );
        out.push(
            Sample::gauge(
                "spindle_pool_recovery_objects_left",
                "Objects of the pool some copy still misses",
                p.recovery.objects_left as f64,
            )
            .label("pool", pool.clone()),
        );
        for (state, n) in &p.pgs {
            out.push(
                Sample::gauge(
                    "spindle_pool_pgs",
                    "Placement groups per pool and state",
                    *n as f64,
                )
                .label("pool", pool.clone())
                .label("state", state.clone()),
            );
        }
    }
    out
}
