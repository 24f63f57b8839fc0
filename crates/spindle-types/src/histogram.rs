//! A latency histogram of plain atomics, for layers that do not depend on the metrics
//! crate (the image layer): observing is two relaxed adds. `spindle-metrics` exports it
//! with the same buckets as its own latency histograms.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bound of the first bucket: 10 us.
pub const LATENCY_BUCKET_MIN_NS: u64 = 10_000;
/// Finite buckets, each bound twice the last (10 us to ~10.5 s); one more counts the rest.
pub const LATENCY_BUCKETS: usize = 21;

/// Counts of latencies per bucket and their sum.
#[derive(Default)]
pub struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// A copy of a [`LatencyHistogram`]: `counts[i]` latencies in bucket `i` (not cumulative),
/// the last beyond every bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub counts: [u64; LATENCY_BUCKETS + 1],
    pub sum_ns: u64,
}

impl LatencySnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Upper bound of bucket `i` in nanoseconds (None for the last).
pub fn bucket_bound_ns(i: usize) -> Option<u64> {
    (i < LATENCY_BUCKETS).then(|| LATENCY_BUCKET_MIN_NS << i)
}

/// The bucket of a latency of `ns`: the first whose bound is at least `ns`.
pub fn bucket_of(ns: u64) -> usize {
    let q = ns.saturating_sub(1) / LATENCY_BUCKET_MIN_NS;
    ((u64::BITS - q.leading_zeros()) as usize).min(LATENCY_BUCKETS)
}

impl LatencyHistogram {
    pub fn observe_ns(&self, ns: u64) {
        self.counts[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_the_first_bucket_whose_bound_holds_them() {
        for i in 0..LATENCY_BUCKETS {
            let bound = bucket_bound_ns(i).unwrap();
            assert_eq!(bucket_of(bound), i, "bound of {i}");
            assert_eq!(bucket_of(bound + 1), i + 1, "just past {i}");
            if i > 0 {
                assert_eq!(bucket_of(bucket_bound_ns(i - 1).unwrap() + 1), i);
            }
        }
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS);
        let h = LatencyHistogram::default();
        h.observe_ns(5_000);
        h.observe_ns(15_000);
        h.observe_ns(u64::MAX / 2);
        let s = h.snapshot();
        assert_eq!(s.count(), 3);
        assert_eq!(
            (s.counts[0], s.counts[1], s.counts[LATENCY_BUCKETS]),
            (1, 1, 1)
        );
    }
}
