//! One counters struct for the daemon: every event count it keeps, in one place, with one
//! snapshot that the heartbeat reports to the monitor (`Heartbeat { counters }`, read by
//! `spindle status` and the benchmarks by name).
//!
//! Counters only ever grow (monotonic since the daemon started); the monitor derives rates
//! from successive heartbeats. Space figures and the store's own counters are gauges read
//! from the store when the heartbeat is built, not kept here.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Event counts of one storage daemon.
#[derive(Debug, Default)]
pub(crate) struct OsdCounters {
    /// Client operations received (recovery yields while this moves).
    pub client_ops: AtomicU64,
    /// Bad copies found by a read and repaired from a good copy (replicated and EC).
    pub corruptions_repaired: AtomicU64,
    /// Objects copied to a lagging copy by recovery, and their bytes.
    pub recovered_objects: AtomicU64,
    pub recovered_bytes: AtomicU64,
    /// Peering rounds that needed a backfill (listing diff) / only log catch-up.
    pub backfills: AtomicU64,
    pub log_recoveries: AtomicU64,
    /// Stray group copies removed after their group moved elsewhere.
    pub strays_removed: AtomicU64,
    /// Scrub: objects compared, found inconsistent, and repaired.
    pub scrubbed_objects: AtomicU64,
    pub scrub_inconsistent: AtomicU64,
    pub scrub_repaired: AtomicU64,
    /// Erasure-coded shard writes stored as a delta slot over a whole-shard base, and
    /// those asked for as a delta that this copy wrote as a delta covering the whole shard
    /// (its base was not at hand).
    pub ec_delta_writes: AtomicU64,
    pub ec_delta_fallbacks: AtomicU64,
    /// Writes refused because their client is fenced (its image lock was taken over).
    pub fenced_writes_refused: AtomicU64,
    /// Writes to an image's data object refused because their snapshot guard was not the
    /// image's newest snapshot (the writer preserves the object first, then retries).
    pub snap_guard_refused: AtomicU64,
    /// Reads refused (`Again`) because the primary held no read lease from every other
    /// copy of the group (`lease.rs`).
    pub reads_without_lease: AtomicU64,
    /// Pushdown program runs asked for, those the program failed (refused, or stopped by
    /// a limit or a fault), programs loaded, instructions run, object bytes the programs
    /// read, and objects served from the data cache (`exec.rs`).
    pub exec_runs: AtomicU64,
    pub exec_failed: AtomicU64,
    pub exec_programs_loaded: AtomicU64,
    pub exec_instructions: AtomicU64,
    pub exec_bytes_in: AtomicU64,
    pub exec_cache_hits: AtomicU64,
    /// Shard-local runs (`ExecOp::shards`): parts run on a data shard this daemon holds,
    /// and parts run on a decoded copy because the shard's daemon was down or failed.
    pub exec_shard_runs: AtomicU64,
    pub exec_shard_decoded: AtomicU64,
}

impl OsdCounters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        Self::add(counter, 1);
    }

    /// Current value of `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }

    /// Every counter by its reported name, in a fixed order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = Self::get;
        vec![
            ("client_ops", g(&self.client_ops)),
            ("corruptions_repaired", g(&self.corruptions_repaired)),
            ("recovered_objects", g(&self.recovered_objects)),
            ("recovered_bytes", g(&self.recovered_bytes)),
            ("backfills", g(&self.backfills)),
            ("log_recoveries", g(&self.log_recoveries)),
            ("strays_removed", g(&self.strays_removed)),
            ("scrubbed_objects", g(&self.scrubbed_objects)),
            ("scrub_inconsistent", g(&self.scrub_inconsistent)),
            ("scrub_repaired", g(&self.scrub_repaired)),
            ("ec_delta_writes", g(&self.ec_delta_writes)),
            ("ec_delta_fallbacks", g(&self.ec_delta_fallbacks)),
            ("fenced_writes_refused", g(&self.fenced_writes_refused)),
            ("snap_guard_refused", g(&self.snap_guard_refused)),
            ("reads_without_lease", g(&self.reads_without_lease)),
            ("exec_runs", g(&self.exec_runs)),
            ("exec_failed", g(&self.exec_failed)),
            ("exec_programs_loaded", g(&self.exec_programs_loaded)),
            ("exec_instructions", g(&self.exec_instructions)),
            ("exec_bytes_in", g(&self.exec_bytes_in)),
            ("exec_cache_hits", g(&self.exec_cache_hits)),
            ("exec_shard_runs", g(&self.exec_shard_runs)),
            ("exec_shard_decoded", g(&self.exec_shard_decoded)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn snapshot_names_are_unique_and_values_follow_the_counters() {
        let c = OsdCounters::default();
        OsdCounters::bump(&c.client_ops);
        OsdCounters::add(&c.recovered_bytes, 4096);
        OsdCounters::add(&c.scrub_repaired, 3);
        let snap = c.snapshot();
        let names: BTreeSet<_> = snap.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), snap.len(), "a counter name is reported twice");
        let value = |name: &str| snap.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        assert_eq!(value("client_ops"), Some(1));
        assert_eq!(value("recovered_bytes"), Some(4096));
        assert_eq!(value("scrub_repaired"), Some(3));
        assert_eq!(value("backfills"), Some(0));
    }
}
