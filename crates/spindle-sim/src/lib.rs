//! `spindle-sim`: the deterministic cluster simulator.
//!
//! One process, one thread, one seed: the real decision cores run over a simulated
//! network ([`net`]) and clock (the event queue's time), with faults injected from the
//! seed. The same seed gives the same run; [`WorldReport::trace_hash`] fingerprints every
//! executed event so that two runs of one seed can be compared.
//!
//! What runs today: the monitor's core (`spindle_mon::MonCore`) behind a shell that mirrors
//! the real one, the daemons' and clients' map sessions, real protocol messages (encoded and
//! decoded by `spindle_proto`), faults (daemon and monitor crashes and restarts, partitions,
//! loss, duplication, delay). Checkers: epochs are published once each and never go back
//! across monitor restarts, every observer's map for an epoch is the one published, and
//! after the faults stop every daemon is up and everyone has the current map within the
//! settle time. See `docs/simulator.md` for what is still outside.
//!
//! [`data`]: the data simulator: daemons running the real store over simulated disks and
//! the real placement-group cores (peering, the transaction gate, recovery, the primary's
//! replication rules), clients writing and reading a replicated pool or (with
//! [`DataConfig::ec`]) an erasure-coded one (real shards, real Reed-Solomon, the real
//! `spindle_pg::ec::decide_slot`), faults, and checkers (acknowledged writes read back, no
//! stale reads, clean after faults, identical copies or decodable shards).

pub mod data;
pub mod net;
pub mod queue;
pub mod rng;
pub mod trace;
pub mod world;

pub use data::{run_data, DataConfig, DataError, DataReport, DataWorld, EcShape, Mutant};
pub use world::{World, WorldConfig, WorldReport};

/// Runs one seed.
pub fn run(cfg: WorldConfig) -> WorldReport {
    World::new(cfg).run()
}

/// Parses `A..B` (both included) or a single seed.
pub fn parse_seeds(s: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|_| format!("'{t}' is not a seed (a number)"))
    };
    match s.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
            if a > b {
                return Err(format!("empty seed range {s}"));
            }
            Ok(a..=b)
        }
        None => {
            let a = num(s)?;
            Ok(a..=a)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_include_both_ends() {
        assert_eq!(parse_seeds("1..100").unwrap(), 1..=100);
        assert_eq!(parse_seeds("7").unwrap(), 7..=7);
        assert!(parse_seeds("9..3").is_err());
        assert!(parse_seeds("x..3").is_err());
    }
}
