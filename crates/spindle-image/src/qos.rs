//! Per-image quality of service: IOPS and bytes-per-second limits (read, write, total),
//! each with a burst, enforced where the image is served, and the per-image I/O
//! statistics `spindle image stats` shows.
//!
//! Limits live in the image header (`ImageHeader::qos`), like rbd's `rbd_qos_*` image
//! settings: `spindle image config set IMAGE qos.iops=500`, read again by the serving
//! process every second (`ImageExports::housekeeping`), so changes apply live.
//!
//! Shaping ([`Throttle`], sans-I/O): one token bucket per configured limit, kept as a
//! GCRA "theoretical arrival time" in nanoseconds. An operation costs one token of each
//! IOPS bucket of its kind and its length in bytes of each bytes bucket (discards and
//! zeroing cost one operation and no bytes). It may start at the latest of the times its
//! buckets allow (immediately while the buckets hold a burst), and it charges every bucket
//! at that start. Operations wait in arrival order of their admission; a limited image's
//! waiting operations occupy no daemon, so other images keep their throughput.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The limits of one image (None: unlimited). A burst is in the limit's unit (operations
/// or bytes) and defaults to one second's worth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps_burst: Option<u64>,
}

/// The settable keys (`qos.KEY`), in display order.
pub const QOS_KEYS: [&str; 12] = [
    "iops",
    "iops_burst",
    "read_iops",
    "read_iops_burst",
    "write_iops",
    "write_iops_burst",
    "bps",
    "bps_burst",
    "read_bps",
    "read_bps_burst",
    "write_bps",
    "write_bps_burst",
];

impl QosSpec {
    fn slot(&mut self, key: &str) -> Option<&mut Option<u64>> {
        Some(match key {
            "iops" => &mut self.iops,
            "iops_burst" => &mut self.iops_burst,
            "read_iops" => &mut self.read_iops,
            "read_iops_burst" => &mut self.read_iops_burst,
            "write_iops" => &mut self.write_iops,
            "write_iops_burst" => &mut self.write_iops_burst,
            "bps" => &mut self.bps,
            "bps_burst" => &mut self.bps_burst,
            "read_bps" => &mut self.read_bps,
            "read_bps_burst" => &mut self.read_bps_burst,
            "write_bps" => &mut self.write_bps,
            "write_bps_burst" => &mut self.write_bps_burst,
            _ => return None,
        })
    }

    /// The value of `key` (`qos.` prefix optional).
    pub fn get(&self, key: &str) -> Option<u64> {
        let key = key.strip_prefix("qos.").unwrap_or(key);
        self.clone().slot(key).and_then(|v| *v)
    }

    /// Sets `key` (`qos.KEY`) to `value`, or removes it (`value` None or 0). Refuses
    /// unknown keys; [`QosSpec::check`] the whole spec once every change is made.
    pub fn set(&mut self, key: &str, value: Option<u64>) -> Result<(), String> {
        let name = key
            .strip_prefix("qos.")
            .ok_or_else(|| format!("unknown setting {key:?}: settings are qos.KEY"))?;
        let slot = self.slot(name).ok_or_else(|| {
            format!(
                "unknown setting {key:?}: one of {}",
                QOS_KEYS
                    .iter()
                    .map(|k| format!("qos.{k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        *slot = value.filter(|&v| v > 0);
        Ok(())
    }

    /// A burst needs its limit, and is at least the limit's one-operation cost.
    pub fn check(&self) -> Result<(), String> {
        for (limit, burst, name) in [
            (self.iops, self.iops_burst, "iops"),
            (self.read_iops, self.read_iops_burst, "read_iops"),
            (self.write_iops, self.write_iops_burst, "write_iops"),
            (self.bps, self.bps_burst, "bps"),
            (self.read_bps, self.read_bps_burst, "read_bps"),
            (self.write_bps, self.write_bps_burst, "write_bps"),
        ] {
            if burst.is_some() && limit.is_none() {
                return Err(format!("qos.{name}_burst needs qos.{name}"));
            }
        }
        Ok(())
    }

    pub fn is_unlimited(&self) -> bool {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bps,
            self.read_bps,
            self.write_bps,
        ]
        .iter()
        .all(Option::is_none)
    }

    /// `key=value` pairs of the settings that are set.
    pub fn pairs(&self) -> Vec<(String, u64)> {
        QOS_KEYS
            .iter()
            .filter_map(|k| self.get(k).map(|v| (format!("qos.{k}"), v)))
            .collect()
    }
}

/// What an operation is, for the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// Discard or zeroing: a write operation of no bytes.
    Other,
}

/// One token bucket as a GCRA state.
#[derive(Clone, Debug)]
struct Bucket {
    /// Nanoseconds one unit (operation or byte) stands for: 1e9 / rate.
    ns_per_unit: f64,
    /// The burst as a time: burst * ns_per_unit.
    tolerance_ns: f64,
    /// Theoretical arrival time of the next unit.
    tat_ns: f64,
}

impl Bucket {
    fn new(rate: u64, burst: Option<u64>) -> Bucket {
        debug_assert!(rate > 0);
        let ns_per_unit = 1e9 / rate as f64;
        let burst = burst.unwrap_or(rate).max(1);
        Bucket {
            ns_per_unit,
            tolerance_ns: burst.saturating_sub(1) as f64 * ns_per_unit,
            tat_ns: 0.0,
        }
    }

    /// The earliest start (ns) at which `cost` units may begin at `now`.
    fn earliest(&self, now: f64) -> f64 {
        (self.tat_ns.max(now) - self.tolerance_ns).max(now)
    }

    fn charge(&mut self, start: f64, cost: u64) {
        self.tat_ns = self.tat_ns.max(start) + cost as f64 * self.ns_per_unit;
    }
}

/// The buckets of one image's limits (sans-I/O: the caller passes the time and waits).
#[derive(Clone, Debug, Default)]
pub struct Throttle {
    /// (kinds it applies to: read, write; counts bytes?, bucket)
    buckets: Vec<(bool, bool, bool, Bucket)>,
}

impl Throttle {
    pub fn new(spec: &QosSpec) -> Throttle {
        let mut buckets = Vec::new();
        for (limit, burst, read, write, bytes) in [
            (spec.iops, spec.iops_burst, true, true, false),
            (spec.read_iops, spec.read_iops_burst, true, false, false),
            (spec.write_iops, spec.write_iops_burst, false, true, false),
            (spec.bps, spec.bps_burst, true, true, true),
            (spec.read_bps, spec.read_bps_burst, true, false, true),
            (spec.write_bps, spec.write_bps_burst, false, true, true),
        ] {
            if let Some(rate) = limit.filter(|&r| r > 0) {
                buckets.push((read, write, bytes, Bucket::new(rate, burst)));
            }
        }
        Throttle { buckets }
    }

    /// Admits an operation arriving at `now_ns`: returns when it may start (ns, at least
    /// `now_ns`) and charges the buckets at that start.
    pub fn admit(&mut self, now_ns: u64, kind: IoKind, bytes: u64) -> u64 {
        let now = now_ns as f64;
        let applies = |read: bool, write: bool| match kind {
            IoKind::Read => read,
            IoKind::Write | IoKind::Other => write,
        };
        let cost = |counts_bytes: bool| match (counts_bytes, kind) {
            (false, _) => 1,
            (true, IoKind::Other) => 0,
            (true, _) => bytes,
        };
        let mut start = now;
        for (read, write, b, bucket) in &self.buckets {
            if applies(*read, *write) && cost(*b) > 0 {
                start = start.max(bucket.earliest(now));
            }
        }
        for (read, write, b, bucket) in &mut self.buckets {
            let c = cost(*b);
            if applies(*read, *write) && c > 0 {
                bucket.charge(start, c);
            }
        }
        debug_assert!(start >= now);
        start as u64
    }
}

/// The limits of one served image, changeable live.
pub struct Qos {
    epoch: Instant,
    enabled: AtomicBool,
    state: Mutex<(QosSpec, Throttle)>,
    throttled_ops: AtomicU64,
    throttled_ns: AtomicU64,
}

impl Default for Qos {
    fn default() -> Self {
        Qos {
            epoch: Instant::now(),
            enabled: AtomicBool::new(false),
            state: Mutex::new((QosSpec::default(), Throttle::default())),
            throttled_ops: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
        }
    }
}

impl Qos {
    /// Applies `spec` (a change resets the buckets: a full burst is available again).
    pub fn set(&self, spec: &QosSpec) {
        let mut st = spindle_types::sync::lock(&self.state);
        if st.0 != *spec {
            *st = (spec.clone(), Throttle::new(spec));
            self.enabled.store(!spec.is_unlimited(), Ordering::Release);
        }
    }

    pub fn spec(&self) -> QosSpec {
        spindle_types::sync::lock(&self.state).0.clone()
    }

    /// Waits until an operation of `kind` and `bytes` may start.
    pub async fn admit(&self, kind: IoKind, bytes: u64) {
        if !self.enabled.load(Ordering::Acquire) {
            return;
        }
        let now_ns = self.epoch.elapsed().as_nanos() as u64;
        let start_ns = spindle_types::sync::lock(&self.state)
            .1
            .admit(now_ns, kind, bytes);
        if start_ns > now_ns {
            self.throttled_ops.fetch_add(1, Ordering::Relaxed);
            self.throttled_ns
                .fetch_add(start_ns - now_ns, Ordering::Relaxed);
            tokio::time::sleep_until((self.epoch + Duration::from_nanos(start_ns)).into()).await;
        }
    }

    /// Operations delayed so far, and their total delay.
    pub fn throttled(&self) -> (u64, u64) {
        (
            self.throttled_ops.load(Ordering::Relaxed),
            self.throttled_ns.load(Ordering::Relaxed),
        )
    }
}

/// Cumulative I/O counters of one served image (as its clients see it: latency includes
/// the time a limit held an operation back).
#[derive(Default)]
pub struct IoStats {
    read_ops: AtomicU64,
    write_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_latency_ns: AtomicU64,
    write_latency_ns: AtomicU64,
    in_flight: AtomicU64,
    /// Latencies by bucket (reads; writes and the rest), for Prometheus histograms.
    read_latency: spindle_types::histogram::LatencyHistogram,
    write_latency: spindle_types::histogram::LatencyHistogram,
}

/// A copy of [`IoStats`] at one time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTotals {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_latency_ns: u64,
    pub write_latency_ns: u64,
    pub in_flight: u64,
}

/// Rates over an interval, as `spindle image stats` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IoRates {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    /// Mean latency of the operations completed in the interval.
    pub read_latency_us: f64,
    pub write_latency_us: f64,
    /// Mean operations in flight (Little's law: latency time completed / interval).
    pub queue_depth: f64,
}

impl IoTotals {
    /// Rates from `earlier` to `self` over `interval`.
    pub fn rates_since(&self, earlier: &IoTotals, interval: Duration) -> IoRates {
        let secs = interval.as_secs_f64().max(1e-3);
        let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
        let (r, w) = (
            d(self.read_ops, earlier.read_ops),
            d(self.write_ops, earlier.write_ops),
        );
        let (rl, wl) = (
            d(self.read_latency_ns, earlier.read_latency_ns),
            d(self.write_latency_ns, earlier.write_latency_ns),
        );
        IoRates {
            read_iops: r / secs,
            write_iops: w / secs,
            read_bytes_per_sec: d(self.read_bytes, earlier.read_bytes) / secs,
            write_bytes_per_sec: d(self.write_bytes, earlier.write_bytes) / secs,
            read_latency_us: if r > 0.0 { rl / r / 1e3 } else { 0.0 },
            write_latency_us: if w > 0.0 { wl / w / 1e3 } else { 0.0 },
            queue_depth: (rl + wl) / 1e9 / secs,
        }
    }
}

/// One operation being counted: completes on drop.
pub struct IoTimer<'a> {
    stats: &'a IoStats,
    kind: IoKind,
    bytes: u64,
    started: Instant,
}

impl Drop for IoTimer<'_> {
    fn drop(&mut self) {
        let s = self.stats;
        let ns = self.started.elapsed().as_nanos() as u64;
        let (ops, bytes, lat, hist) = match self.kind {
            IoKind::Read => (
                &s.read_ops,
                &s.read_bytes,
                &s.read_latency_ns,
                &s.read_latency,
            ),
            IoKind::Write | IoKind::Other => (
                &s.write_ops,
                &s.write_bytes,
                &s.write_latency_ns,
                &s.write_latency,
            ),
        };
        ops.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(self.bytes, Ordering::Relaxed);
        lat.fetch_add(ns, Ordering::Relaxed);
        hist.observe_ns(ns);
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl IoStats {
    /// Starts counting an operation (`bytes`: counted as moved; 0 for discards).
    pub fn begin(&self, kind: IoKind, bytes: u64) -> IoTimer<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        IoTimer {
            stats: self,
            kind,
            bytes: if kind == IoKind::Other { 0 } else { bytes },
            started: Instant::now(),
        }
    }

    /// Latency histograms: (reads, writes and the rest).
    pub fn latencies(
        &self,
    ) -> (
        spindle_types::histogram::LatencySnapshot,
        spindle_types::histogram::LatencySnapshot,
    ) {
        (self.read_latency.snapshot(), self.write_latency.snapshot())
    }

    pub fn totals(&self) -> IoTotals {
        IoTotals {
            read_ops: self.read_ops.load(Ordering::Relaxed),
            write_ops: self.write_ops.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            read_latency_ns: self.read_latency_ns.load(Ordering::Relaxed),
            write_latency_ns: self.write_latency_ns.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }
}

/// What a serving process publishes about one image each second (`img.NAME.stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageIoReport {
    pub image: String,
    pub pool: String,
    /// Who serves it (the lock holder description).
    pub served_by: String,
    /// When this was measured, ms since the Unix epoch.
    pub unix_ms: u64,
    pub interval_ms: u64,
    pub rates: IoRates,
    pub totals: IoTotals,
    /// The limits in force.
    pub qos: QosSpec,
    /// Operations a limit held back so far, and their total wait.
    pub throttled_ops: u64,
    pub throttled_ms: u64,
}

/// Name of the statistics object of image `image`.
pub fn stats_object_name(image: &str) -> String {
    format!("img.{image}.stats")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pairs: &[(&str, u64)]) -> QosSpec {
        let mut s = QosSpec::default();
        for (k, v) in pairs {
            s.set(&format!("qos.{k}"), Some(*v)).unwrap();
        }
        s.check().unwrap();
        s
    }

    /// Runs `ops` operations arriving back to back (each when the previous was admitted,
    /// a closed loop of one): returns the time the last one started, in seconds.
    fn run(t: &mut Throttle, ops: u64, kind: IoKind, bytes: u64) -> f64 {
        let mut now = 0u64;
        for _ in 0..ops {
            now = t.admit(now, kind, bytes);
        }
        now as f64 / 1e9
    }

    #[test]
    fn a_limit_holds_its_rate_after_the_burst() {
        let mut t = Throttle::new(&spec(&[("iops", 100), ("iops_burst", 10)]));
        // 10 at once (the burst), then 100 per second: 1010 operations take 10 s.
        assert!(run(&mut t.clone(), 10, IoKind::Write, 4096) < 1e-9);
        let secs = run(&mut t, 1010, IoKind::Write, 4096);
        assert!((secs - 10.0).abs() < 0.02, "{secs}");
    }

    #[test]
    fn bytes_limits_count_bytes_and_kinds_apply_separately() {
        let mut t = Throttle::new(&spec(&[("write_bps", 1 << 20), ("read_iops", 50)]));
        // 1 MiB/s of writes: 64 writes of 64 KiB after the first second's burst (16
        // writes) and the one that starts at 4 s.
        let secs = run(&mut t, 16 + 65, IoKind::Write, 64 << 10);
        assert!((secs - 4.0).abs() < 0.05, "{secs}");
        // Reads are limited by operations only; discards by no bytes limit.
        let secs = run(&mut t, 50 + 100, IoKind::Read, 1 << 20);
        assert!((secs - 2.0).abs() < 0.05, "{secs}");
        assert!(run(&mut t, 1000, IoKind::Other, 1 << 30) < 1e-9);
    }

    #[test]
    fn the_tightest_of_several_limits_wins() {
        let mut t = Throttle::new(&spec(&[
            ("iops", 1000),
            ("write_iops", 200),
            ("bps", 100 << 20),
        ]));
        let secs = run(&mut t, 200 + 400, IoKind::Write, 4096);
        assert!((secs - 2.0).abs() < 0.05, "{secs}");
    }

    #[test]
    fn settings_are_checked() {
        let mut s = QosSpec::default();
        assert!(s.set("iops", Some(5)).is_err(), "needs the qos. prefix");
        assert!(s.set("qos.nope", Some(5)).is_err());
        s.set("qos.iops_burst", Some(5)).unwrap();
        assert!(s.check().is_err(), "a burst needs its limit");
        s.set("qos.iops", Some(100)).unwrap();
        s.check().unwrap();
        assert_eq!(
            s.pairs(),
            vec![("qos.iops".into(), 100), ("qos.iops_burst".into(), 5)]
        );
        s.set("qos.iops_burst", None).unwrap();
        s.set("qos.iops", Some(0)).unwrap();
        assert!(s.is_unlimited() && s.pairs().is_empty());
    }

    #[test]
    fn rates_follow_littles_law() {
        let a = IoTotals::default();
        let b = IoTotals {
            write_ops: 1000,
            write_bytes: 4096 * 1000,
            write_latency_ns: 1000 * 4_000_000, // 4 ms each
            ..IoTotals::default()
        };
        let r = b.rates_since(&a, Duration::from_secs(2));
        assert_eq!(r.write_iops, 500.0);
        assert_eq!(r.write_latency_us, 4000.0);
        assert!((r.queue_depth - 2.0).abs() < 1e-9);
    }
}
