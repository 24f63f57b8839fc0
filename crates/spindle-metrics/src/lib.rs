//! Prometheus metrics of every Spindle process (issue #22): the shapes they share (latency
//! histograms in seconds, constant metrics read from a process's own counters at scrape
//! time) and the HTTP endpoint that serves them.
//!
//! Metrics follow the Prometheus conventions: base units (seconds, bytes), counters end in
//! `_total` (the encoder adds it), labels for what varies (`op`, `pool`, `state`,
//! `image`). The text is the OpenMetrics format of `prometheus-client`, which Prometheus
//! and `promtool check metrics` read.
//!
//! A process keeps its own counters where they are cheapest to bump (plain atomics); a
//! [`Snapshot`] collector turns them into metrics on each scrape, so scraping costs the
//! data path nothing. Only latencies need new state on the data path: one histogram
//! observation per operation.

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;

pub use prometheus_client;

/// Content type of what [`encode`] writes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of what [`encode_prometheus_text`] writes.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Smallest latency bucket: 10 us (a cached read on a daemon).
pub const LATENCY_BUCKET_MIN_S: f64 = spindle_types::histogram::LATENCY_BUCKET_MIN_NS as f64 / 1e9;
/// Latency buckets, each twice the last: 10 us to ~10.5 s (a write waiting out a failover
/// lands in the last; slower ones only in `+Inf`); the same as
/// [`spindle_types::histogram`]'s.
pub const LATENCY_BUCKETS: u16 = spindle_types::histogram::LATENCY_BUCKETS as u16;

/// A latency histogram with Spindle's buckets (seconds).
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        LATENCY_BUCKET_MIN_S,
        2.0,
        LATENCY_BUCKETS,
    ))
}

/// The registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; a collector's own error would leave a partial
    // text, which a scraper rejects (`# EOF` missing) rather than misreads.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!("encoding metrics failed: {e}");
    }
    out
}

/// The registry in the Prometheus text format (0.0.4), for scrapers that do not ask for
/// OpenMetrics (`promtool check metrics`, `curl`): the same samples, with a counter's
/// `HELP` and `TYPE` naming it with its `_total` (as its samples are), and no `# UNIT` or
/// `# EOF` lines.
pub fn encode_prometheus_text(registry: &Registry) -> String {
    openmetrics_to_prometheus_text(&encode(registry))
}

fn openmetrics_to_prometheus_text(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Whether a value is a counter (only grows), a gauge (goes up and down) or a
/// histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One value read at scrape time: `name` (without `_total`; the encoder adds it to
/// counters), help text, kind, labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub labels: Vec<(String, String)>,
    /// The value; for a histogram, the sum of its observations.
    pub value: f64,
    /// A histogram's buckets: (upper bound, observations in it, not cumulative), the last
    /// bound infinite.
    pub buckets: Vec<(f64, u64)>,
}

impl Sample {
    pub fn counter(name: impl Into<String>, help: impl Into<String>, value: u64) -> Sample {
        Sample {
            name: name.into(),
            help: help.into(),
            kind: Kind::Counter,
            labels: Vec::new(),
            value: value as f64,
            buckets: Vec::new(),
        }
    }

    pub fn gauge(name: impl Into<String>, help: impl Into<String>, value: f64) -> Sample {
        Sample {
            name: name.into(),
            help: help.into(),
            kind: Kind::Gauge,
            labels: Vec::new(),
            value,
            buckets: Vec::new(),
        }
    }

    /// A latency histogram (seconds) from a [`spindle_types::histogram`] snapshot.
    pub fn latency(
        name: impl Into<String>,
        help: impl Into<String>,
        snap: &spindle_types::histogram::LatencySnapshot,
    ) -> Sample {
        let buckets = snap
            .counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let bound = spindle_types::histogram::bucket_bound_ns(i)
                    .map_or(f64::INFINITY, |ns| ns as f64 / 1e9);
                (bound, n)
            })
            .collect();
        Sample {
            name: name.into(),
            help: help.into(),
            kind: Kind::Histogram,
            labels: Vec::new(),
            value: snap.sum_ns as f64 / 1e9,
            buckets,
        }
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Sample {
        self.labels.push((key.into(), value.into()));
        self
    }
}

/// A collector that reads a process's own state on each scrape: `read` returns samples;
/// samples of one name are grouped under one descriptor (their first help text and kind).
pub struct Snapshot<F> {
    read: F,
}

impl<F> Snapshot<F>
where
    F: Fn() -> Vec<Sample> + Send + Sync + 'static,
{
    pub fn new(read: F) -> Snapshot<F> {
        Snapshot { read }
    }
}

impl<F> std::fmt::Debug for Snapshot<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Snapshot")
    }
}

impl<F> Collector for Snapshot<F>
where
    F: Fn() -> Vec<Sample> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut samples = (self.read)();
        // Stable order; one descriptor per name (the format wants a family's samples
        // together).
        samples.sort_by(|a, b| a.name.cmp(&b.name));
        let mut at = 0;
        while at < samples.len() {
            let end = at
                + samples[at..]
                    .iter()
                    .take_while(|s| s.name == samples[at].name)
                    .count();
            let first = &samples[at];
            let metric_type = match first.kind {
                Kind::Counter => ConstCounter::new(0u64).metric_type(),
                Kind::Gauge => ConstGauge::new(0i64).metric_type(),
                Kind::Histogram => MetricType::Histogram,
            };
            let mut family =
                encoder.encode_descriptor(&first.name, &first.help, None, metric_type)?;
            if end == at + 1 && first.labels.is_empty() {
                // One sample without labels: `name value`, not `name{} value`.
                encode_sample(first, family)?;
            } else {
                for s in &samples[at..end] {
                    let labels: Vec<(&str, &str)> = s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    encode_sample(s, family.encode_family(&labels)?)?;
                }
            }
            at = end;
        }
        Ok(())
    }
}

/// Whole numbers below 2^53 print as integers.
fn integral(v: f64) -> Option<i64> {
    (v.fract() == 0.0 && v.abs() < (1u64 << 53) as f64).then_some(v as i64)
}

fn encode_sample(
    s: &Sample,
    mut m: prometheus_client::encoding::MetricEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    match s.kind {
        Kind::Histogram => {
            let count = s.buckets.iter().map(|(_, n)| n).sum();
            m.encode_histogram::<NoLabelSet>(s.value, count, &s.buckets, None)
        }
        Kind::Counter => match integral(s.value).filter(|v| *v >= 0) {
            Some(v) => ConstCounter::new(v as u64).encode(m),
            None => ConstCounter::new(s.value).encode(m),
        },
        Kind::Gauge => match integral(s.value) {
            Some(v) => ConstGauge::new(v).encode(m),
            None => ConstGauge::new(s.value).encode(m),
        },
    }
}

/// More routes of an endpoint: fixed pages and JSON made on each request (the monitor's
/// dashboard).
#[derive(Default)]
pub struct Routes {
    router: axum::Router,
}

impl Routes {
    /// `GET path` answers `body` as `content_type`.
    pub fn page(self, path: &str, content_type: &'static str, body: &'static str) -> Routes {
        let get = axum::routing::get(move || async move {
            (
                [
                    (CONTENT_TYPE, content_type),
                    (axum::http::header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
        });
        Routes {
            router: self.router.route(path, get),
        }
    }

    /// `GET path` answers what `make` returns: JSON text, or an HTTP status and a message
    /// (sent as `{"error": message}`).
    pub fn json<F>(self, path: &str, make: F) -> Routes
    where
        F: Fn() -> Result<String, (u16, String)> + Clone + Send + Sync + 'static,
    {
        let get = axum::routing::get(move || {
            let make = make.clone();
            async move {
                let (status, body) = match make() {
                    Ok(json) => (axum::http::StatusCode::OK, json),
                    Err((code, message)) => (
                        axum::http::StatusCode::from_u16(code)
                            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
                        format!("{{\"error\":{}}}", json_string(&message)),
                    ),
                };
                (
                    status,
                    [
                        (CONTENT_TYPE, "application/json"),
                        (axum::http::header::CACHE_CONTROL, "no-store"),
                    ],
                    body,
                )
                    .into_response()
            }
        });
        Routes {
            router: self.router.route(path, get),
        }
    }
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Connections an endpoint serves at once; more are closed at once (a scraper needs one,
/// a dashboard one per open page): descriptors stay bounded whoever connects.
pub const CONNECTIONS_MAX: usize = 32;
/// Longest a connection stays open (a scrape takes milliseconds; scrapers that keep
/// connections alive open a new one): idle connections do not hold slots for ever.
pub const CONNECTION_MS_MAX: u64 = 30_000;

/// Serves `app` on `listener`: HTTP/1.1, at most [`CONNECTIONS_MAX`] connections, each
/// for at most [`CONNECTION_MS_MAX`].
async fn accept_loop(listener: tokio::net::TcpListener, app: axum::Router) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, for instance: back off instead of spinning.
                tracing::debug!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        // Every slot taken: the connection is closed (dropped) at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let limit = std::time::Duration::from_millis(CONNECTION_MS_MAX);
            let _ = tokio::time::timeout(limit, connection).await;
            drop(slot);
        });
    }
}

/// A running `/metrics` endpoint.
pub struct Endpoint {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `GET /metrics` (the registry, encoded on each request) and the routes of
/// `extra` on `listen` (`127.0.0.1:0` picks a port), until the returned [`Endpoint`] is
/// dropped.
pub async fn serve(
    listen: &str,
    registry: Arc<Registry>,
    extra: Option<Routes>,
) -> std::io::Result<Endpoint> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    // OpenMetrics for scrapers that ask for it (Prometheus does), else the classic text.
    let metrics = axum::routing::get(move |headers: axum::http::HeaderMap| {
        let registry = registry.clone();
        async move {
            let openmetrics = headers
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/openmetrics-text"));
            if openmetrics {
                (
                    [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                    encode(&registry),
                )
                    .into_response()
            } else {
                (
                    [(CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE)],
                    encode_prometheus_text(&registry),
                )
                    .into_response()
            }
        }
    });
    let mut app = axum::Router::new().route("/metrics", metrics);
    if let Some(extra) = extra {
        app = app.merge(extra.router);
    }
    let task = tokio::spawn(accept_loop(listener, app));
    Ok(Endpoint { addr, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_group_names_and_encode_counters_with_total() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Snapshot::new(|| {
            vec![
                Sample::gauge("spindle_x_bytes", "bytes", 5.0).label("pool", "b"),
                Sample::counter("spindle_ops", "ops", 7).label("op", "read"),
                Sample::gauge("spindle_x_bytes", "bytes", 6.5).label("pool", "a"),
                Sample::counter("spindle_ops", "ops", 9).label("op", "write"),
            ]
        })));
        let text = encode(&r);
        assert!(text.contains("# TYPE spindle_ops counter"), "{text}");
        assert!(text.contains("spindle_ops_total{op=\"read\"} 7"), "{text}");
        assert!(text.contains("spindle_ops_total{op=\"write\"} 9"), "{text}");
        assert_eq!(
            text.matches("# TYPE spindle_x_bytes gauge").count(),
            1,
            "{text}"
        );
        assert!(text.contains("spindle_x_bytes{pool=\"a\"} 6.5"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn atomic_histograms_encode_like_the_library_s() {
        let lib = latency_histogram();
        let ours = spindle_types::histogram::LatencyHistogram::default();
        for us in [3u64, 10, 11, 250, 4000, 90_000_000] {
            lib.observe(us as f64 / 1e6);
            ours.observe_ns(us * 1000);
        }
        let mut a = Registry::default();
        a.register("lat_seconds", "l", lib);
        let mut b = Registry::default();
        let snap = ours.snapshot();
        b.register_collector(Box::new(Snapshot::new(move || {
            vec![Sample::latency("lat_seconds", "l", &snap)]
        })));
        let (ta, tb) = (encode(&a), encode(&b));
        let buckets = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.contains("_bucket") || l.contains("_count"))
                .map(String::from)
                .collect()
        };
        assert_eq!(buckets(&ta), buckets(&tb), "{ta}\n{tb}");
        assert!(tb.contains("lat_seconds_bucket{le=\"+Inf\"} 6"), "{tb}");
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }

    #[test]
    fn the_classic_text_names_counters_with_their_total() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Snapshot::new(|| {
            vec![
                Sample::counter("spindle_ops", "ops", 7),
                Sample::gauge("spindle_objects", "objects", 3.0),
            ]
        })));
        let text = encode_prometheus_text(&r);
        assert!(text.contains("# HELP spindle_ops_total ops"), "{text}");
        assert!(text.contains("# TYPE spindle_ops_total counter"), "{text}");
        assert!(text.contains("\nspindle_ops_total 7\n"), "{text}");
        assert!(text.contains("# TYPE spindle_objects gauge"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[tokio::test]
    async fn the_endpoint_serves_the_registry_and_stops_when_dropped() {
        let mut r = Registry::default();
        let h = latency_histogram();
        h.observe(0.003);
        r.register("spindle_op_duration_seconds", "latency", h);
        let e = serve("127.0.0.1:0", Arc::new(r), None).await.unwrap();
        let get = |addr: SocketAddr| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            std::io::Result::Ok(out)
        };
        let body = get(e.addr).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("text/plain; version=0.0.4"), "{body}");
        assert!(!body.contains("# EOF"), "{body}");
        assert!(
            body.contains("spindle_op_duration_seconds_bucket{le=\"0.00512\"} 1"),
            "{body}"
        );
        // Connections past the limit are closed at once; those within it are served, and
        // a scrape still works once the crowd is gone.
        let mut crowd = Vec::new();
        for _ in 0..CONNECTIONS_MAX + 20 {
            crowd.push(tokio::net::TcpStream::connect(e.addr).await.unwrap());
        }
        let mut closed = 0;
        for s in &mut crowd {
            use tokio::io::AsyncReadExt;
            let mut b = [0u8; 1];
            let read =
                tokio::time::timeout(std::time::Duration::from_millis(50), s.read(&mut b)).await;
            if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
                closed += 1;
            }
        }
        assert_eq!(closed, 20, "connections past the limit are closed");
        drop(crowd);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(get(e.addr).await.unwrap().starts_with("HTTP/1.1 200"));
        let addr = e.addr;
        drop(e);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(get(addr).await.is_err(), "the endpoint stopped");
    }
}
