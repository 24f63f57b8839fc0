//! Slow requests (issue #22): client operations still unanswered after the complaint time.
//! The heartbeat reports how many there are and how old the oldest is; the monitor turns
//! them into Ceph's `SLOW_OPS` health check. Always on: one small lock per operation.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ceph's `osd_op_complaint_time` (30 s): an operation unanswered this long is slow.
pub const SLOW_OP_MS_DEFAULT: u64 = 30_000;

/// What the heartbeat reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlowReport {
    /// Operations in flight for longer than the complaint time.
    pub slow_now: u64,
    /// Age of the oldest of them (0: none).
    pub oldest_ms: u64,
    /// Operations answered after more than the complaint time, ever.
    pub slow_finished: u64,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Start of every operation in flight, by id: ids grow with start times, so the first
    /// entry is the oldest.
    started: BTreeMap<u64, Instant>,
    slow_finished: u64,
}

/// The operations a daemon has in flight.
pub(crate) struct InFlight {
    complaint: Duration,
    state: Mutex<State>,
}

impl InFlight {
    pub fn new(complaint_ms: u64) -> InFlight {
        assert!(
            complaint_ms > 0,
            "a zero complaint time makes every op slow"
        );
        InFlight {
            complaint: Duration::from_millis(complaint_ms),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An operation arrived at `now`: its ticket for [`Self::end`].
    pub fn begin(&self, now: Instant) -> u64 {
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.started.insert(id, now);
        id
    }

    /// Operation `id` was answered (or dropped) at `now`.
    pub fn end(&self, id: u64, now: Instant) {
        let mut s = self.lock();
        if let Some(start) = s.started.remove(&id) {
            if now.saturating_duration_since(start) > self.complaint {
                s.slow_finished += 1;
            }
        }
    }

    pub fn report(&self, now: Instant) -> SlowReport {
        let s = self.lock();
        let mut out = SlowReport {
            slow_finished: s.slow_finished,
            ..Default::default()
        };
        for start in s.started.values() {
            let age = now.saturating_duration_since(*start);
            if age <= self.complaint {
                break; // every later one started later
            }
            if out.slow_now == 0 {
                out.oldest_ms = age.as_millis() as u64;
            }
            out.slow_now += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_operations_older_than_the_complaint_time_are_slow() {
        let t0 = Instant::now();
        let f = InFlight::new(1000);
        let a = f.begin(t0);
        let b = f.begin(t0 + Duration::from_millis(500));
        let c = f.begin(t0 + Duration::from_millis(1500));
        assert_eq!(
            f.report(t0 + Duration::from_millis(900)),
            SlowReport::default()
        );
        let r = f.report(t0 + Duration::from_millis(1600));
        assert_eq!((r.slow_now, r.oldest_ms, r.slow_finished), (2, 1600, 0));
        f.end(a, t0 + Duration::from_millis(1700));
        f.end(c, t0 + Duration::from_millis(1800));
        let r = f.report(t0 + Duration::from_millis(1800));
        assert_eq!((r.slow_now, r.oldest_ms, r.slow_finished), (1, 1300, 1));
        f.end(b, t0 + Duration::from_millis(1900));
        f.end(b, t0 + Duration::from_millis(1900)); // twice: counted once
        let r = f.report(t0 + Duration::from_secs(60));
        assert_eq!((r.slow_now, r.oldest_ms, r.slow_finished), (0, 0, 2));
    }
}
