//! What a client did (issue #22): requests by type with errors, bytes and latency, and
//! retries; always counted (relaxed atomics), served as Prometheus metrics when the
//! configuration asks for an endpoint ([`crate::ClientConfig::metrics_listen`]).

use spindle_proto::msg::{Msg, ObjOp};
use spindle_types::histogram::LatencyHistogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Request types, as the `op` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Read,
    Write,
    Stat,
    List,
    /// Pushdown program runs.
    Exec,
    /// Scrub, lock and other group requests.
    Other,
}

impl ReqKind {
    pub const ALL: [ReqKind; 6] = [
        ReqKind::Read,
        ReqKind::Write,
        ReqKind::Stat,
        ReqKind::List,
        ReqKind::Exec,
        ReqKind::Other,
    ];

    pub fn of(msg: &Msg) -> ReqKind {
        match msg {
            Msg::ObjRequest { op, .. } => match op {
                ObjOp::Read { .. } => ReqKind::Read,
                ObjOp::Mutate(_) => ReqKind::Write,
                ObjOp::Stat => ReqKind::Stat,
                ObjOp::List => ReqKind::List,
                ObjOp::Exec(_) => ReqKind::Exec,
            },
            _ => ReqKind::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ReqKind::Read => "read",
            ReqKind::Write => "write",
            ReqKind::Stat => "stat",
            ReqKind::List => "list",
            ReqKind::Exec => "exec",
            ReqKind::Other => "other",
        }
    }
}

#[derive(Default)]
struct PerKind {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    latency: LatencyHistogram,
}

/// A client's counters.
#[derive(Default)]
pub(crate) struct ClientStats {
    by_kind: [PerKind; ReqKind::ALL.len()],
    /// Attempts sent again (a new map, a primary that moved, `Again`).
    retries: AtomicU64,
}

impl ClientStats {
    /// One request of `kind` is over: it sent `sent` and got `received` bulk bytes, took
    /// `took`, and failed (`error`) or not.
    pub fn done(&self, kind: ReqKind, sent: u64, received: u64, took: Duration, error: bool) {
        let k = &self.by_kind[kind as usize];
        k.requests.fetch_add(1, Ordering::Relaxed);
        if error {
            k.errors.fetch_add(1, Ordering::Relaxed);
        }
        k.bytes_sent.fetch_add(sent, Ordering::Relaxed);
        k.bytes_received.fetch_add(received, Ordering::Relaxed);
        k.latency
            .observe_ns(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }

    pub fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus samples of these counters, with the map epoch and open daemon
    /// connections.
    pub fn samples(&self, epoch: u64, osd_connections: usize) -> Vec<spindle_metrics::Sample> {
        use spindle_metrics::Sample;
        let mut out = Vec::new();
        for kind in ReqKind::ALL {
            let k = &self.by_kind[kind as usize];
            let op = kind.label();
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
            out.push(
                Sample::counter(
                    "spindle_client_requests",
                    "Requests to storage daemons this client completed (each counted once, \
                     however often retried), by type",
                    load(&k.requests),
                )
                .label("op", op),
            );
            out.push(
                Sample::counter(
                    "spindle_client_request_errors",
                    "Requests that ended in an error, by type",
                    load(&k.errors),
                )
                .label("op", op),
            );
            out.push(
                Sample::counter(
                    "spindle_client_sent_bytes",
                    "Data bytes sent with requests (written), by type",
                    load(&k.bytes_sent),
                )
                .label("op", op),
            );
            out.push(
                Sample::counter(
                    "spindle_client_received_bytes",
                    "Data bytes received with answers (read), by type",
                    load(&k.bytes_received),
                )
                .label("op", op),
            );
            out.push(
                Sample::latency(
                    "spindle_client_request_duration_seconds",
                    "Time from a request's start to its answer, retries included, by type",
                    &k.latency.snapshot(),
                )
                .label("op", op),
            );
        }
        out.push(Sample::counter(
            "spindle_client_retries",
            "Request attempts sent again (new map, moved primary, retry-later answers)",
            self.retries.load(Ordering::Relaxed),
        ));
        out.push(Sample::gauge(
            "spindle_client_map_epoch",
            "Epoch of the cluster map this client uses",
            epoch as f64,
        ));
        out.push(Sample::gauge(
            "spindle_client_osd_connections",
            "Connections to storage daemons this client holds",
            osd_connections as f64,
        ));
        out
    }
}
