//! Engine counters and the latency histogram. All updates are relaxed atomics: counters are
//! for observation, never for synchronisation.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sub-buckets per power of two in the latency histogram (relative error <= 1/8).
const SUB_BUCKETS: usize = 8;
/// Powers of two covered: 1 ns .. 2^40 ns (~18 minutes); larger values land in the last bucket.
const POWERS: usize = 41;
const BUCKETS: usize = POWERS * SUB_BUCKETS;

/// Log-linear latency histogram in nanoseconds (lock-free, fixed size).
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn bucket_of(ns: u64) -> usize {
        if ns < SUB_BUCKETS as u64 {
            return ns as usize;
        }
        let power = 63 - ns.leading_zeros() as usize; // >= 3
        let sub = ((ns >> (power - 3)) & (SUB_BUCKETS as u64 - 1)) as usize;
        ((power - 2) * SUB_BUCKETS + sub).min(BUCKETS - 1)
    }

    /// Upper bound (inclusive) of a bucket, in ns.
    fn bucket_high(index: usize) -> u64 {
        if index < SUB_BUCKETS {
            return index as u64;
        }
        let power = index / SUB_BUCKETS + 2;
        let sub = (index % SUB_BUCKETS) as u64;
        ((SUB_BUCKETS as u64 + sub + 1) << (power - 3)) - 1
    }

    pub(crate) fn record(&self, ns: u64) {
        self.buckets[Self::bucket_of(ns)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| -> u64 {
            if total == 0 {
                return 0;
            }
            let rank = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Self::bucket_high(i);
                }
            }
            Self::bucket_high(BUCKETS - 1)
        };
        let count = self.count.load(Relaxed);
        LatencySnapshot {
            count,
            mean_ns: self.sum_ns.load(Relaxed).checked_div(count).unwrap_or(0),
            p50_ns: quantile(0.50),
            p99_ns: quantile(0.99),
            p999_ns: quantile(0.999),
            max_bucket_ns: counts
                .iter()
                .rposition(|&c| c > 0)
                .map_or(0, Self::bucket_high),
        }
    }
}

/// Latency figures from submit to completion, in nanoseconds (bucket upper bounds, so
/// quantiles overestimate by at most 12.5%).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub count: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_bucket_ns: u64,
}

/// Engine-wide counters.
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) resubmitted: AtomicU64,
    pub(crate) latency: Histogram,
}

impl Counters {
    pub(crate) fn new() -> Counters {
        Counters {
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            resubmitted: AtomicU64::new(0),
            latency: Histogram::new(),
        }
    }
}

/// Per-ring (per-queue for the thread backend) figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Requests waiting in the staging queue.
    pub queue_depth: usize,
    /// Requests handed to the kernel (or a worker) and not yet completed.
    pub in_flight: usize,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Requests accepted by `submit`.
    pub submitted: u64,
    /// Requests finished (success or error).
    pub completed: u64,
    /// Resubmissions of the remainder of short reads/writes.
    pub resubmitted: u64,
    /// Submitted and not yet completed (`submitted - completed`).
    pub in_flight: u64,
    pub rings: Vec<RingStats>,
    pub latency: LatencySnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_cover_values() {
        let mut last = 0;
        for ns in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            100,
            1000,
            123_456,
            10_000_000_000,
        ] {
            let b = Histogram::bucket_of(ns);
            assert!(b >= last);
            last = b;
            assert!(Histogram::bucket_high(b) >= ns, "{ns}");
            if b > 0 {
                assert!(Histogram::bucket_high(b - 1) < ns, "{ns}");
            }
        }
    }

    #[test]
    fn quantiles() {
        let h = Histogram::new();
        for ns in 1..=1000u64 {
            h.record(ns * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 1000);
        assert!(s.p50_ns >= 500_000 && s.p50_ns <= 570_000, "{s:?}");
        assert!(s.p99_ns >= 990_000 && s.p99_ns <= 1_120_000, "{s:?}");
        assert_eq!(s.mean_ns, 500_500);
    }
}
