//! Which objects a stale copy of a placement group must fetch to match the authoritative
//! one, computed from the two PG logs (pure logic, unit-tested).
//!
//! Invariants:
//! - an incomplete copy is never authoritative (asserted), and is always backfilled: its
//!   log says nothing about the objects it misses;
//! - log-based catch-up names the objects of every entry after the last common one, on
//!   either side, so entries only the stale copy has (divergent) are rolled back to the
//!   authoritative state too.

use spindle_proto::msg::{LogEntryMsg, Ver};
use std::collections::{BTreeSet, HashSet};

/// A copy's log as reported by `PgQuery`.
#[derive(Clone, Debug, Default)]
pub struct LogInfo {
    pub last_version: Ver,
    pub log_tail: Ver,
    pub log: Vec<LogEntryMsg>,
    /// The copy misses objects its log does not account for (an unfinished recovery).
    pub incomplete: bool,
}

/// What must happen to bring `stale` level with `auth`.
#[derive(Debug, PartialEq, Eq)]
pub enum SyncPlan {
    /// Same history: nothing to copy.
    InSync,
    /// Copy these objects' current state from the authoritative copy (log-based catch-up:
    /// entries after the last common one on either side, divergent entries included).
    Objects(BTreeSet<String>),
    /// The authoritative log does not reach back to where `stale` stopped: compare full
    /// object listings (backfill).
    Backfill,
}

pub fn plan(auth: &LogInfo, stale: &LogInfo) -> SyncPlan {
    assert!(
        !auth.incomplete,
        "an incomplete copy is never authoritative"
    );
    if stale.incomplete {
        // Its log says nothing about what it misses: compare full listings.
        return SyncPlan::Backfill;
    }
    if stale.last_version == auth.last_version {
        return SyncPlan::InSync;
    }
    let auth_versions: HashSet<Ver> = auth.log.iter().map(|e| e.version).collect();
    // The newest point both histories share.
    let mut common = if stale.log_tail >= auth.log_tail {
        stale.log_tail
    } else {
        Ver::default()
    };
    for e in &stale.log {
        if auth_versions.contains(&e.version) || e.version <= auth.log_tail {
            common = common.max(e.version);
        }
    }
    if stale.log.is_empty() && stale.last_version <= auth.log_tail {
        common = common.max(stale.last_version);
    }
    if common < auth.log_tail {
        return SyncPlan::Backfill;
    }
    let names: BTreeSet<String> = auth
        .log
        .iter()
        .chain(stale.log.iter())
        .filter(|e| e.version > common)
        .map(|e| e.name.clone())
        .collect();
    SyncPlan::Objects(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(epoch: u64, seq: u64) -> Ver {
        Ver { epoch, seq }
    }
    fn e(epoch: u64, seq: u64, name: &str) -> LogEntryMsg {
        LogEntryMsg {
            version: v(epoch, seq),
            name: name.to_string(),
            delete: false,
        }
    }
    fn info(log: Vec<LogEntryMsg>, tail: Ver) -> LogInfo {
        LogInfo {
            last_version: log.last().map_or(tail, |e| e.version),
            log_tail: tail,
            log,
            incomplete: false,
        }
    }

    #[test]
    fn equal_logs_are_in_sync() {
        let a = info(vec![e(1, 1, "a"), e(1, 2, "b")], Ver::default());
        assert_eq!(plan(&a, &a.clone()), SyncPlan::InSync);
    }

    #[test]
    fn lagging_copy_fetches_only_missed_objects() {
        let auth = info(
            vec![e(1, 1, "a"), e(1, 2, "b"), e(3, 3, "c"), e(3, 4, "b")],
            v(0, 0),
        );
        let stale = info(vec![e(1, 1, "a"), e(1, 2, "b")], v(0, 0));
        assert_eq!(
            plan(&auth, &stale),
            SyncPlan::Objects(["b".to_string(), "c".to_string()].into())
        );
    }

    #[test]
    fn divergent_entries_are_rolled_back_too() {
        // stale wrote (1,3) "x" that nobody else has; auth moved on in epoch 4.
        let auth = info(vec![e(1, 1, "a"), e(1, 2, "b"), e(4, 3, "c")], v(0, 0));
        let stale = info(vec![e(1, 1, "a"), e(1, 2, "b"), e(1, 3, "x")], v(0, 0));
        assert_eq!(
            plan(&auth, &stale),
            SyncPlan::Objects(["c".to_string(), "x".to_string()].into())
        );
    }

    #[test]
    fn trimmed_authoritative_log_means_backfill() {
        let auth = info(vec![e(2, 50, "a"), e(2, 51, "b")], v(2, 49));
        let stale = info(vec![e(1, 1, "a"), e(1, 2, "b")], v(0, 0));
        assert_eq!(plan(&auth, &stale), SyncPlan::Backfill);
        let empty = info(vec![], v(0, 0));
        assert_eq!(plan(&auth, &empty), SyncPlan::Backfill);
        let fresh = info(vec![e(1, 1, "a")], v(0, 0));
        assert_eq!(
            plan(&fresh, &empty),
            SyncPlan::Objects(["a".to_string()].into())
        );
    }

    #[test]
    fn incomplete_copy_is_always_backfilled() {
        let auth = info(vec![e(1, 1, "a"), e(1, 2, "b")], v(0, 0));
        let mut stale = auth.clone();
        stale.incomplete = true;
        assert_eq!(plan(&auth, &stale), SyncPlan::Backfill);
    }
}
