//! `spindle-serve`: what every Spindle server shares, written once. The cluster protocol's
//! servers (`spindle_proto::net`) and the NBD server (`spindle_nbd`, which depends on no
//! cluster crate) both use it; it depends on tokio only.
//!
//! - [`PayloadBudget`]: a byte budget for request payloads held in memory. A payload is
//!   charged before it is read (the connection waits, and TCP slows its sender, while the
//!   budget is exhausted) and released when its permit is dropped.
//! - [`AcceptBackoff`]: an accept loop's reaction to failures (e.g. `EMFILE`): back off
//!   exponentially instead of spinning, and log at most once per interval with a count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accounting unit of a [`PayloadBudget`] (semaphore permits are u32 counts of these).
pub const BUDGET_UNIT_BYTES: u64 = 1024;

/// A byte budget: a semaphore counting [`BUDGET_UNIT_BYTES`] units.
pub struct PayloadBudget {
    sem: Arc<tokio::sync::Semaphore>,
    units_total: u32,
    /// Most units in use since the last [`PayloadBudget::take_peak_bytes`].
    peak_units: AtomicU64,
}

impl PayloadBudget {
    /// A budget of `bytes` (rounded down to whole units, at least one).
    pub fn new(bytes: u64) -> PayloadBudget {
        let units_total = (bytes / BUDGET_UNIT_BYTES).clamp(1, u32::MAX as u64 / 2) as u32;
        PayloadBudget {
            sem: Arc::new(tokio::sync::Semaphore::new(units_total as usize)),
            units_total,
            peak_units: AtomicU64::new(0),
        }
    }

    /// Waits until `bytes` of the budget are free and takes them (released when the permit
    /// is dropped). A request larger than the whole budget takes the whole budget.
    pub async fn acquire(&self, bytes: u64) -> tokio::sync::OwnedSemaphorePermit {
        let units = (bytes.div_ceil(BUDGET_UNIT_BYTES).max(1)).min(self.units_total as u64) as u32;
        let permit = match self.sem.clone().acquire_many_owned(units).await {
            Ok(p) => p,
            Err(_) => unreachable!("the payload budget's semaphore is never closed"),
        };
        self.peak_units
            .fetch_max(self.in_use_units(), Ordering::Relaxed);
        permit
    }

    fn in_use_units(&self) -> u64 {
        (self.units_total as usize - self.sem.available_permits()) as u64
    }

    pub fn total_bytes(&self) -> u64 {
        self.units_total as u64 * BUDGET_UNIT_BYTES
    }

    pub fn in_use_bytes(&self) -> u64 {
        self.in_use_units() * BUDGET_UNIT_BYTES
    }

    /// Most bytes in use since the previous call (then restarts from what is in use now).
    pub fn take_peak_bytes(&self) -> u64 {
        let now = self.in_use_units();
        self.peak_units.swap(now, Ordering::Relaxed) * BUDGET_UNIT_BYTES
    }
}

/// Shortest and longest pause after a failed `accept` (doubling in between).
pub const ACCEPT_BACKOFF_MS_MIN: u64 = 10;
pub const ACCEPT_BACKOFF_MS_MAX: u64 = 1_000;
/// At most one log line per this interval about failing accepts (with a count).
pub const ACCEPT_LOG_INTERVAL_MS: u64 = 10_000;

/// The state of an accept loop's backoff.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    backoff_ms: u64,
    failures_unlogged: u64,
    last_log: Option<Instant>,
}

impl AcceptBackoff {
    pub fn new() -> AcceptBackoff {
        AcceptBackoff::default()
    }

    /// A connection was accepted: the next failure starts from the shortest pause.
    pub fn accepted(&mut self) {
        self.backoff_ms = 0;
    }

    /// An accept failed: logs (rate-limited) and returns how long to pause.
    pub fn failed(&mut self, label: &str, error: &std::io::Error) -> Duration {
        self.failures_unlogged += 1;
        let due = self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(ACCEPT_LOG_INTERVAL_MS));
        if due {
            tracing::warn!(
                "{label}: accept failed ({} time(s) since the last report): {error}",
                self.failures_unlogged
            );
            self.failures_unlogged = 0;
            self.last_log = Some(Instant::now());
        }
        self.backoff_ms = (self.backoff_ms * 2).clamp(ACCEPT_BACKOFF_MS_MIN, ACCEPT_BACKOFF_MS_MAX);
        Duration::from_millis(self.backoff_ms)
    }

    /// [`AcceptBackoff::failed`], then the pause.
    pub async fn pause_after(&mut self, label: &str, error: &std::io::Error) {
        let pause = self.failed(label, error);
        tokio::time::sleep(pause).await;
    }
}

/// Giving free heap memory back to the system after a burst (a server calls [`heap::release`]
/// once a burst of payloads or connections is over). The process's allocator decides how:
/// a binary with its own global allocator installs its release function at start
/// ([`heap::set_release`]); otherwise glibc's `malloc_trim`.
pub mod heap {
    use std::sync::OnceLock;

    static RELEASE: OnceLock<fn()> = OnceLock::new();

    /// Installs the function that returns the global allocator's free memory (first call
    /// wins).
    pub fn set_release(release: fn()) {
        let _ = RELEASE.set(release);
    }

    /// Returns free heap memory to the system.
    pub fn release() {
        match RELEASE.get() {
            Some(release) => release(),
            None => glibc_trim(),
        }
    }

    /// glibc `malloc_trim`; nothing elsewhere.
    pub fn glibc_trim() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            extern "C" {
                fn malloc_trim(pad: usize) -> i32;
            }
            // SAFETY: malloc_trim takes no pointers and only releases free memory.
            unsafe {
                malloc_trim(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_restarts_after_an_accept() {
        let mut b = AcceptBackoff::new();
        let e = std::io::Error::from_raw_os_error(24); // EMFILE
        let pauses: Vec<u64> = (0..10)
            .map(|_| b.failed("test", &e).as_millis() as u64)
            .collect();
        assert_eq!(pauses[..4], [10, 20, 40, 80]);
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MS_MAX);
        b.accepted();
        assert_eq!(
            b.failed("test", &e).as_millis() as u64,
            ACCEPT_BACKOFF_MS_MIN
        );
    }

    #[tokio::test]
    async fn the_budget_charges_whole_units_and_tracks_its_peak() {
        let budget = PayloadBudget::new(8 * BUDGET_UNIT_BYTES);
        assert_eq!(budget.total_bytes(), 8 * BUDGET_UNIT_BYTES);
        let a = budget.acquire(1).await; // one unit
        let b = budget.acquire(3 * BUDGET_UNIT_BYTES + 1).await; // four units
        assert_eq!(budget.in_use_bytes(), 5 * BUDGET_UNIT_BYTES);
        drop(a);
        drop(b);
        assert_eq!(budget.in_use_bytes(), 0);
        assert_eq!(budget.take_peak_bytes(), 5 * BUDGET_UNIT_BYTES);
        assert_eq!(budget.take_peak_bytes(), 0, "restarts from what is in use");
        // Larger than the whole budget: takes all of it instead of waiting for ever.
        let all = budget.acquire(100 * BUDGET_UNIT_BYTES).await;
        assert_eq!(budget.in_use_bytes(), budget.total_bytes());
        drop(all);
    }
}
