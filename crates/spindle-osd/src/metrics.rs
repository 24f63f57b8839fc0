//! The daemon's Prometheus metrics (`/metrics`, issue #22): client operations by type
//! (counts, errors, bytes, latency histograms) observed when each request is done, and
//! everything else read at scrape time from the counters the heartbeat already reports
//! (`counters.rs`, the store's statistics, the file system's space) and from the
//! placement groups this daemon leads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use spindle_metrics::{Sample, Snapshot};
use spindle_proto::msg::ObjOp;
use spindle_proto::net::ReplyOutcome;
use std::time::Duration;

/// Client operation types, as the `op` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read,
    Write,
    Stat,
    List,
    Exec,
}

impl OpKind {
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Stat,
        OpKind::List,
        OpKind::Exec,
    ];

    pub fn of(op: &ObjOp) -> OpKind {
        match op {
            ObjOp::Read { .. } => OpKind::Read,
            ObjOp::Mutate(_) => OpKind::Write,
            ObjOp::Stat => OpKind::Stat,
            ObjOp::List => OpKind::List,
            ObjOp::Exec(_) => OpKind::Exec,
        }
    }

    fn label(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Stat => "stat",
            OpKind::List => "list",
            OpKind::Exec => "exec",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

/// Per operation type: one counter or histogram each, taken from their families once so
/// the data path touches only atomics (and the histogram's lock).
struct PerOp<M> {
    by_kind: [M; OpKind::ALL.len()],
}

impl<M: Clone> PerOp<M> {
    fn new<C: Fn() -> M>(family: &Family<OpLabel, M, C>) -> PerOp<M>
    where
        M: spindle_metrics::prometheus_client::metrics::TypedMetric,
    {
        PerOp {
            by_kind: OpKind::ALL.map(|k| family.get_or_create(&OpLabel { op: k.label() }).clone()),
        }
    }
}

/// The metrics a daemon updates as operations finish.
pub(crate) struct OpMetrics {
    ops: PerOp<Counter>,
    errors: PerOp<Counter>,
    bytes: PerOp<Counter>,
    latency: PerOp<Histogram>,
    /// Sum of latencies in microseconds per type (the heartbeat reports it: the monitor's
    /// dashboard derives mean latencies from two reports).
    latency_us: [std::sync::atomic::AtomicU64; OpKind::ALL.len()],
}

impl OpMetrics {
    /// Registers the families in `registry` and returns their handles.
    pub fn register(registry: &mut Registry) -> OpMetrics {
        let ops = Family::<OpLabel, Counter>::default();
        let errors = Family::<OpLabel, Counter>::default();
        let bytes = Family::<OpLabel, Counter>::default();
        let latency = Family::<OpLabel, Histogram>::new_with_constructor(
            spindle_metrics::latency_histogram as fn() -> Histogram,
        );
        let m = OpMetrics {
            ops: PerOp::new(&ops),
            errors: PerOp::new(&errors),
            bytes: PerOp::new(&bytes),
            latency: PerOp::new(&latency),
            latency_us: Default::default(),
        };
        registry.register(
            "spindle_osd_ops",
            "Client operations this daemon served as primary, by type",
            ops,
        );
        registry.register(
            "spindle_osd_op_errors",
            "Client operations answered with an error (including retry-later answers), by type",
            errors,
        );
        registry.register(
            "spindle_osd_op_bytes",
            "Data bytes of client operations: written (received) or read (sent), by type",
            bytes,
        );
        registry.register(
            "spindle_osd_op_duration_seconds",
            "Time from a client operation's arrival to its answer, by type",
            latency,
        );
        m
    }

    /// One client operation of `kind` is done: it carried `in_bytes` of data and took
    /// `took`.
    pub fn done(&self, kind: OpKind, in_bytes: u64, took: Duration, outcome: ReplyOutcome) {
        let i = kind.index();
        self.ops.by_kind[i].inc();
        if outcome.error || !outcome.replied {
            self.errors.by_kind[i].inc();
        }
        self.bytes.by_kind[i].inc_by(in_bytes + outcome.bulk_bytes);
        self.latency.by_kind[i].observe(took.as_secs_f64());
        self.latency_us[i].fetch_add(
            took.as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Reads and writes done, their bytes and summed latency, as heartbeat counters
    /// (`op_read`, `op_read_bytes`, `op_read_latency_us`, the same for writes).
    pub fn heartbeat_counters(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(6);
        for k in [OpKind::Read, OpKind::Write] {
            let i = k.index();
            let name = k.label();
            out.push((format!("op_{name}"), self.ops.by_kind[i].get()));
            out.push((format!("op_{name}_bytes"), self.bytes.by_kind[i].get()));
            out.push((
                format!("op_{name}_latency_us"),
                self.latency_us[i].load(std::sync::atomic::Ordering::Relaxed),
            ));
        }
        out
    }
}

/// Counters the heartbeat reports that only grow (the rest are gauges).
const GAUGES: [(&str, &str); 10] = [
    ("objects", "Objects in this daemon's store"),
    ("data_bytes", "Object data bytes in this daemon's store"),
    (
        "fs_total_bytes",
        "Size of the file system of this daemon's data directory",
    ),
    ("fs_used_bytes", "Used bytes of that file system"),
    ("fs_avail_bytes", "Available bytes of that file system"),
    (
        "store_full",
        "1 while the store refuses new data (out of space)",
    ),
    (
        "store_failed",
        "1 once the store refused I/O after a disk error",
    ),
    (
        "slow_ops",
        "Client operations in flight for longer than the complaint time (--slow-op-ms)",
    ),
    (
        "slow_op_oldest_ms",
        "Age of the oldest slow operation in flight (0: none)",
    ),
    (
        "exec_cache_bytes",
        "Object bytes kept for repeated program runs",
    ),
];

/// Help text of the heartbeat counters (by name; a name missing here gets a generic
/// text, so a new counter is exported before it is described).
fn counter_help(name: &str) -> &'static str {
    match name {
        "client_ops" => "Client operations received",
        "corruptions_repaired" => "Bad copies found by a read and repaired from a good one",
        "recovered_objects" => "Objects copied to a lagging copy by recovery",
        "recovered_bytes" => "Bytes copied to lagging copies by recovery",
        "backfills" => "Peering rounds that needed a backfill",
        "log_recoveries" => "Peering rounds that needed only log catch-up",
        "strays_removed" => "Stray group copies removed after their group moved",
        "scrubbed_objects" => "Objects compared by scrub",
        "scrub_inconsistent" => "Objects scrub found inconsistent",
        "scrub_repaired" => "Objects scrub repaired",
        "ec_delta_writes" => "Erasure-coded shard writes stored as a delta",
        "ec_delta_fallbacks" => "Erasure-coded delta writes stored whole",
        "fenced_writes_refused" => "Writes refused from fenced clients",
        "snap_guard_refused" => "Image writes refused for a stale snapshot guard",
        "reads_without_lease" => "Reads refused for lack of a read lease",
        "corruptions_detected" => "Checksum mismatches the store detected",
        "transactions" => "Store transactions applied",
        "flushes" => "Store journal flushes",
        "checkpoints" => "Store checkpoints",
        "files_reused" => "Freed object files the store reused",
        "slow_ops_finished" => "Client operations answered after the complaint time",
        "exec_runs" => "Pushdown program runs asked for",
        "exec_failed" => "Program runs refused or stopped by a limit or fault",
        "exec_programs_loaded" => "Programs loaded and verified",
        "exec_instructions" => "Program instructions run",
        "exec_bytes_in" => "Object bytes programs ran against",
        "exec_cache_hits" => "Objects programs read from the data cache",
        "exec_shard_runs" => "Shard-local program parts run on a data shard held here",
        "exec_shard_decoded" => "Shard-local program parts run on a decoded copy",
        _ => "A storage daemon counter",
    }
}

/// The scrape-time samples of a daemon: its heartbeat counters, its groups by state, its
/// map epoch and open connections.
pub(crate) fn snapshot_samples(
    counters: &[(String, u64)],
    pg_states: &[(u32, &'static str)],
    epoch: u64,
    connections_open: u64,
) -> Vec<Sample> {
    let mut out = Vec::with_capacity(counters.len() + pg_states.len() + 2);
    for (name, value) in counters {
        match GAUGES.iter().find(|(g, _)| g == name) {
            // Base units: a gauge in milliseconds is exported in seconds.
            Some((_, help)) => out.push(match name.strip_suffix("_ms") {
                Some(stem) => Sample::gauge(
                    format!("spindle_osd_{stem}_seconds"),
                    *help,
                    *value as f64 / 1000.0,
                ),
                None => Sample::gauge(format!("spindle_osd_{name}"), *help, *value as f64),
            }),
            None => out.push(Sample::counter(
                format!("spindle_osd_{name}"),
                counter_help(name),
                *value,
            )),
        }
    }
    let mut by_state: std::collections::BTreeMap<(u32, &str), u64> = Default::default();
    for (pool, state) in pg_states {
        *by_state.entry((*pool, state)).or_default() += 1;
    }
    for ((pool, state), n) in by_state {
        out.push(
            Sample::gauge(
                "spindle_osd_primary_pgs",
                "Placement groups this daemon is primary of, by pool and state",
                n as f64,
            )
            .label("pool", pool.to_string())
            .label("state", state),
        );
    }
    out.push(Sample::gauge(
        "spindle_osd_map_epoch",
        "Epoch of the cluster map this daemon runs on",
        epoch as f64,
    ));
    out.push(Sample::gauge(
        "spindle_osd_connections_open",
        "Connections this daemon serves now (clients and other daemons)",
        connections_open as f64,
    ));
    out
}

/// The `state` label of a group's state.
pub(crate) fn state_name(code: spindle_proto::msg::PgStateCode) -> &'static str {
    use spindle_proto::msg::PgStateCode as C;
    match code {
        C::Clean => "clean",
        C::Degraded => "degraded",
        C::Recovering => "recovering",
        C::Inactive => "inactive",
        C::Backfilling => "backfilling",
        C::Incomplete => "incomplete",
        C::Peering => "peering",
    }
}

/// A collector of `read` (see [`snapshot_samples`]).
pub(crate) fn collector<F>(read: F) -> Box<Snapshot<F>>
where
    F: Fn() -> Vec<Sample> + Send + Sync + 'static,
{
    Box::new(Snapshot::new(read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_snapshots_encode_as_prometheus_metrics() {
        let mut r = Registry::default();
        let ops = OpMetrics::register(&mut r);
        ops.done(
            OpKind::Write,
            4096,
            Duration::from_micros(300),
            ReplyOutcome {
                bulk_bytes: 0,
                error: false,
                replied: true,
            },
        );
        ops.done(
            OpKind::Read,
            0,
            Duration::from_millis(2),
            ReplyOutcome {
                bulk_bytes: 8192,
                error: true,
                replied: true,
            },
        );
        let counters = vec![("client_ops".to_string(), 2), ("objects".to_string(), 10)];
        r.register_collector(collector(move || {
            snapshot_samples(
                &counters,
                &[(1, "clean"), (1, "clean"), (2, "degraded")],
                7,
                3,
            )
        }));
        let text = spindle_metrics::encode(&r);
        for want in [
            "spindle_osd_ops_total{op=\"write\"} 1",
            "spindle_osd_op_bytes_total{op=\"write\"} 4096",
            "spindle_osd_op_bytes_total{op=\"read\"} 8192",
            "spindle_osd_op_errors_total{op=\"read\"} 1",
            "spindle_osd_op_errors_total{op=\"write\"} 0",
            "spindle_osd_op_duration_seconds_count{op=\"read\"} 1",
            "# TYPE spindle_osd_ops counter",
            "spindle_osd_ops_total{op=\"list\"} 0",
            "# TYPE spindle_osd_objects gauge",
            "spindle_osd_objects 10",
            "spindle_osd_client_ops_total 2",
            "spindle_osd_primary_pgs{pool=\"1\",state=\"clean\"} 2",
            "spindle_osd_primary_pgs{pool=\"2\",state=\"degraded\"} 1",
            "spindle_osd_map_epoch 7",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
