//! The bookkeeping of one group's recovery on its primary ([`RecoveryCore`]): which
//! objects which copies still miss, which are being recovered, what to recover next, and
//! when the recovered copies may be marked complete. Sans-I/O: the daemon moves the bytes
//! (pull from the source, push object states), paces and yields, and reports each
//! object's outcome with [`RecoveryEvent`].
//!
//! Invariants (asserted):
//! - an object leaves the missing set only when its recovery finished successfully, i.e.
//!   every copy that missed it acknowledged the authoritative state durably (writes to a
//!   missing object wait, so a replica never applies a partial write to a stale base);
//! - an object is handed out to at most one recoverer at a time ([`Begin::Wait`] for the
//!   others); a failed recovery leaves it missing, to be retried;
//! - the copies marked incomplete are marked complete only once nothing is missing.

use crate::peering::RecoveryPlan;
use std::collections::{BTreeMap, HashSet};

/// One missing object: the copies missing it and its size (pacing and progress only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub copies: Vec<u32>,
    pub size_bytes: u64,
}

/// What happened to an object handed out by [`RecoveryCore::begin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryEvent {
    /// Every copy in its `copies` has the authoritative state, durably.
    Recovered { name: String },
    /// Something failed (pull, push, map change): it stays missing.
    Failed { name: String },
}

/// Answer of [`RecoveryCore::begin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Nothing misses the object.
    Done,
    /// Someone is recovering it: wait for its outcome, then ask again.
    Wait,
    /// Recover it now on `copies`, pulling from `source` if the primary is one of them.
    Recover { copies: Vec<u32>, source: u32 },
}

/// Answer of [`RecoveryCore::next`] (background recovery).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing is missing: mark the copies complete ([`RecoveryCore::completion_marks`]).
    Finished,
    /// Every missing object is being recovered (on demand) right now.
    AllInProgress,
    /// Recover this object next (name order).
    Object { name: String, size_bytes: u64 },
}

/// Objects some copies of a group still miss (see the module docs).
#[derive(Clone, Debug)]
pub struct RecoveryCore {
    /// Pull source of objects the primary misses (the authoritative copy, or scrub's
    /// reference).
    source: u32,
    /// At least one copy is backfilled (reported as `backfilling`).
    backfill: bool,
    missing: BTreeMap<String, Missing>,
    in_progress: HashSet<String>,
    /// Copies marked incomplete for this recovery (marked complete at the end).
    incomplete: Vec<u32>,
}

impl RecoveryCore {
    pub fn new(
        source: u32,
        backfill: bool,
        missing: BTreeMap<String, Missing>,
        incomplete: Vec<u32>,
    ) -> Self {
        for (name, m) in &missing {
            assert!(!m.copies.is_empty(), "{name:?} is missing on no copy");
        }
        RecoveryCore {
            source,
            backfill,
            missing,
            in_progress: HashSet::new(),
            incomplete,
        }
    }

    /// From peering's plan; `size_of` resolves sizes no listing gave (0 if unknown).
    pub fn from_plan(plan: RecoveryPlan, size_of: impl Fn(&str) -> Option<u64>) -> Self {
        let missing = plan
            .missing
            .into_iter()
            .map(|(name, m)| {
                let size_bytes = m.size_bytes.or_else(|| size_of(&name)).unwrap_or(0);
                (
                    name,
                    Missing {
                        copies: m.copies,
                        size_bytes,
                    },
                )
            })
            .collect();
        Self::new(plan.source, plan.backfill, missing, plan.incomplete)
    }

    pub fn source(&self) -> u32 {
        self.source
    }
    pub fn backfill(&self) -> bool {
        self.backfill
    }
    pub fn incomplete(&self) -> &[u32] {
        &self.incomplete
    }
    pub fn is_done(&self) -> bool {
        self.missing.is_empty()
    }

    /// Adds `copies` to the copies missing `name` (an object whose state is unsettled: an
    /// erasure-coded write that failed on some shards, settled by its next recovery). Not
    /// while `name` is being recovered (its outcome would not cover the new copies).
    pub fn add_missing(&mut self, name: &str, copies: &[u32], size_bytes: u64) {
        assert!(!copies.is_empty(), "{name:?} added as missing on no copy");
        assert!(
            !self.in_progress.contains(name),
            "{name:?} added as missing while being recovered"
        );
        let m = self.missing.entry(name.to_string()).or_insert(Missing {
            copies: Vec::new(),
            size_bytes,
        });
        for &c in copies {
            if !m.copies.contains(&c) {
                m.copies.push(c);
            }
        }
        m.size_bytes = m.size_bytes.max(size_bytes);
    }

    /// Whether `name` is missing on some copy (`on`: on that copy only).
    pub fn is_missing(&self, name: &str, on: Option<u32>) -> bool {
        self.missing
            .get(name)
            .is_some_and(|m| on.is_none_or(|c| m.copies.contains(&c)))
    }

    /// Object copies still missing.
    pub fn missing_copies(&self) -> u64 {
        self.missing.values().map(|m| m.copies.len() as u64).sum()
    }

    /// Bytes still to copy (sizes as far as known).
    pub fn missing_bytes(&self) -> u64 {
        self.missing
            .values()
            .map(|m| m.size_bytes * m.copies.len() as u64)
            .sum()
    }

    /// Hands `name` out for recovery (on demand or from [`RecoveryCore::next`]).
    pub fn begin(&mut self, name: &str) -> Begin {
        let Some(m) = self.missing.get(name) else {
            return Begin::Done;
        };
        if self.in_progress.contains(name) {
            return Begin::Wait;
        }
        let copies = m.copies.clone();
        self.in_progress.insert(name.to_string());
        Begin::Recover {
            copies,
            source: self.source,
        }
    }

    /// The outcome of a recovery handed out by [`RecoveryCore::begin`]. Returns the
    /// object's entry when it left the missing set (for the counters).
    pub fn on_event(&mut self, ev: RecoveryEvent) -> Option<Missing> {
        match ev {
            RecoveryEvent::Recovered { name } => {
                assert!(
                    self.in_progress.remove(&name),
                    "{name:?} recovered without being handed out"
                );
                self.missing.remove(&name)
            }
            RecoveryEvent::Failed { name } => {
                assert!(
                    self.in_progress.remove(&name),
                    "{name:?} failed without being handed out"
                );
                None
            }
        }
    }

    /// What background recovery does next: the first missing object (name order) that
    /// nobody is recovering.
    pub fn next(&self) -> Next {
        if self.missing.is_empty() {
            return Next::Finished;
        }
        match crate::rules::next_to_recover(&self.missing, &self.in_progress) {
            None => Next::AllInProgress,
            Some((name, m)) => Next::Object {
                name: name.clone(),
                size_bytes: m.size_bytes,
            },
        }
    }

    /// The copies to mark complete, once nothing is missing (`None` before).
    pub fn completion_marks(&self) -> Option<&[u32]> {
        self.missing.is_empty().then_some(&self.incomplete[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core() -> RecoveryCore {
        let m = |copies: &[u32], size_bytes| Missing {
            copies: copies.to_vec(),
            size_bytes,
        };
        let missing: BTreeMap<String, Missing> = [
            ("a".to_string(), m(&[2], 10)),
            ("b".to_string(), m(&[1, 2], 5)),
        ]
        .into();
        RecoveryCore::new(0, false, missing, vec![1, 2])
    }

    #[test]
    fn objects_leave_the_missing_set_only_when_recovered() {
        let mut r = core();
        assert_eq!(r.missing_copies(), 3);
        assert_eq!(r.missing_bytes(), 20);
        assert!(r.is_missing("b", Some(1)) && !r.is_missing("a", Some(1)));
        assert_eq!(
            r.begin("a"),
            Begin::Recover {
                copies: vec![2],
                source: 0
            }
        );
        assert_eq!(r.begin("a"), Begin::Wait, "one recoverer per object");
        assert_eq!(r.on_event(RecoveryEvent::Failed { name: "a".into() }), None);
        assert!(
            r.is_missing("a", None),
            "a failed recovery leaves it missing"
        );
        assert!(matches!(r.begin("a"), Begin::Recover { .. }));
        assert!(r
            .on_event(RecoveryEvent::Recovered { name: "a".into() })
            .is_some());
        assert_eq!(r.begin("a"), Begin::Done);
        assert_eq!(r.completion_marks(), None, "b is still missing");
    }

    #[test]
    fn background_order_and_completion() {
        let mut r = core();
        assert_eq!(
            r.next(),
            Next::Object {
                name: "a".into(),
                size_bytes: 10
            }
        );
        r.begin("a");
        assert!(matches!(r.next(), Next::Object { ref name, .. } if name == "b"));
        r.begin("b");
        assert_eq!(r.next(), Next::AllInProgress);
        r.on_event(RecoveryEvent::Recovered { name: "b".into() });
        r.on_event(RecoveryEvent::Recovered { name: "a".into() });
        assert_eq!(r.next(), Next::Finished);
        assert_eq!(r.completion_marks(), Some(&[1, 2][..]));
    }

    #[test]
    fn unsettled_objects_join_the_missing_set() {
        let mut r = core();
        r.add_missing("b", &[2, 3], 7);
        r.add_missing("c", &[1], 0);
        assert_eq!(r.missing_copies(), 1 + 3 + 1);
        assert!(r.is_missing("b", Some(3)) && r.is_missing("c", Some(1)));
        assert_eq!(
            r.begin("b"),
            Begin::Recover {
                copies: vec![1, 2, 3],
                source: 0
            }
        );
    }

    #[test]
    #[should_panic(expected = "while being recovered")]
    fn adding_to_an_object_being_recovered_is_a_bug() {
        let mut r = core();
        r.begin("a");
        r.add_missing("a", &[1], 0);
    }

    #[test]
    #[should_panic(expected = "without being handed out")]
    fn an_outcome_for_an_object_nobody_recovers_is_a_bug() {
        core().on_event(RecoveryEvent::Recovered { name: "a".into() });
    }
}
