//! The copy side of peering step 1: a copy answers a log query (or a listing) for a group
//! only after the store transactions for that group that were already queued when the
//! query arrived (writes and recovery pushes of the previous interval) are applied.
//!
//! Why: the old primary may still acknowledge a write whose local apply is queued. If the
//! copy answered with its log before the apply, peering would not see that write, and an
//! acknowledged write could be missing on the copy that returns (found by the fresh-clone
//! CI run). [`TxnGate`] keeps, per group, the number of queued transactions and the
//! queries waiting for them; the daemon feeds it events and answers the released queries.
//!
//! Invariants: a query is released only when its group has no queued transaction (it may
//! wait for transactions queued after it too: the group must drain, as before); the count
//! never goes below zero (asserted); every waiting query is released exactly once.

use std::collections::HashMap;
use std::hash::Hash;

/// Per group `K`: queued store transactions and log queries `Q` waiting for them.
#[derive(Debug)]
pub struct TxnGate<K, Q> {
    groups: HashMap<K, Waiting<Q>>,
}

#[derive(Debug)]
struct Waiting<Q> {
    /// Store transactions queued and not yet applied.
    txns_queued: u64,
    /// Queries that arrived while transactions were queued, in arrival order.
    queries: Vec<Q>,
}

impl<K: Hash + Eq + Copy, Q> Default for TxnGate<K, Q> {
    fn default() -> Self {
        TxnGate {
            groups: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Copy, Q> TxnGate<K, Q> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store transaction for `group` was queued.
    pub fn txn_queued(&mut self, group: K) {
        let w = self.groups.entry(group).or_insert(Waiting {
            txns_queued: 0,
            queries: Vec::new(),
        });
        w.txns_queued += 1;
    }

    /// A store transaction for `group` was applied (or failed: it is no longer queued).
    /// Returns the queries that may be answered now (in arrival order).
    pub fn txn_applied(&mut self, group: K) -> Vec<Q> {
        let Some(w) = self.groups.get_mut(&group) else {
            panic!("txn_applied without txn_queued");
        };
        assert!(w.txns_queued > 0, "txn_applied without txn_queued");
        w.txns_queued -= 1;
        if w.txns_queued > 0 {
            return Vec::new();
        }
        self.groups
            .remove(&group)
            .map(|w| w.queries)
            .unwrap_or_default()
    }

    /// A log query for `group` arrived: `Some(query)` = answer it now; `None` = it waits
    /// and a later [`TxnGate::txn_applied`] returns it.
    pub fn log_query(&mut self, group: K, query: Q) -> Option<Q> {
        match self.groups.get_mut(&group) {
            None => Some(query),
            Some(w) => {
                assert!(w.txns_queued > 0, "a waiting group has queued transactions");
                w.queries.push(query);
                None
            }
        }
    }

    /// Whether `group` has store transactions queued.
    pub fn busy(&self, group: K) -> bool {
        self.groups.contains_key(&group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_group_answers_at_once() {
        let mut g: TxnGate<u32, &str> = TxnGate::new();
        assert_eq!(g.log_query(1, "q"), Some("q"));
    }

    /// The bug: a query answered while a write of the previous interval was still queued
    /// missed that write. The query must wait for the apply.
    #[test]
    fn a_query_waits_for_queued_transactions() {
        let mut g: TxnGate<u32, &str> = TxnGate::new();
        g.txn_queued(1);
        g.txn_queued(1);
        g.txn_queued(2);
        assert_eq!(g.log_query(1, "q1"), None);
        assert_eq!(g.log_query(1, "q2"), None);
        assert_eq!(g.log_query(2, "r"), None);
        assert!(g.txn_applied(1).is_empty(), "one transaction still queued");
        assert_eq!(g.txn_applied(2), vec!["r"]);
        assert_eq!(g.txn_applied(1), vec!["q1", "q2"]);
        assert!(!g.busy(1));
        assert_eq!(g.log_query(1, "q3"), Some("q3"));
    }

    #[test]
    #[should_panic(expected = "txn_applied without txn_queued")]
    fn applying_more_than_was_queued_is_a_bug() {
        let mut g: TxnGate<u32, ()> = TxnGate::new();
        g.txn_applied(1);
    }
}
