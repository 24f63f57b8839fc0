//! Scrub decisions: which copies of an object are consistent, which must be repaired from
//! which reference, and which objects are damaged (pure, unit-tested; the daemon's
//! `scrub.rs` gathers the copies' scrub maps and repairs through recovery).
//!
//! Invariants:
//! - a reference copy is always intact (its own block checksums verified);
//! - an object with fewer intact copies than the rule needs (1 replica, or k shards at the
//!   reference version) is damaged, never "repaired" from a bad copy;
//! - an object absent on the primary and on at least half of the copies is a delete's
//!   leftover: the copies holding it are removed, intact or not.

use spindle_proto::msg::ScrubEntry;
use std::collections::{BTreeMap, BTreeSet};

/// One copy's scrub map: object name -> its scrub entry, by daemon id.
pub type ScrubMaps = [(u32, BTreeMap<String, ScrubEntry>)];

/// Names whose versions are not the same on every copy that has them.
pub fn unsettled_names(maps: &ScrubMaps) -> Vec<String> {
    let mut names = BTreeSet::new();
    for (_, m) in maps {
        for (n, e) in m {
            if maps
                .iter()
                .any(|(_, o)| o.get(n).is_some_and(|x| x.version != e.version))
            {
                names.insert(n.clone());
            }
        }
    }
    names.into_iter().collect()
}

/// How scrub compares the copies of a group's objects.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// Replicated copies must have equal digests; erasure-code shards differ by design.
    pub compare_digests: bool,
    /// Intact copies an object needs to be readable and repairable: 1, or k shards.
    pub intact_needed: usize,
}

/// What scrub concluded about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every copy is present, verified and agrees with the others.
    Consistent,
    /// Copies `wrong` are bad, missing, stale or extra (a delete left them): repair them
    /// from `reference`'s state (an intact copy; the primary's absence for a leftover).
    Repair {
        wrong: Vec<u32>,
        reference: u32,
        size_bytes: u64,
    },
    /// Fewer intact copies than `Rule::intact_needed`: nothing to repair from; the
    /// object stays damaged until a client overwrites or deletes it.
    Damaged { bad: Vec<u32>, intact: usize },
}

/// Classifies `name` from every copy's scrub map (`me` is the primary). Pure: decides,
/// does nothing.
///
/// The reference is the primary's copy if it is intact, else the intact copy with the
/// newest version; a copy is fine when it is intact and matches the reference's version,
/// size (and digest, for replicated pools). An object absent on the primary and on at
/// least half of the copies is a delete's leftover: the copies holding it are wrong (they
/// get the primary's state: absent), intact or not.
pub fn classify(name: &str, me: u32, maps: &ScrubMaps, rule: Rule) -> Verdict {
    let mine = maps
        .iter()
        .find(|(o, _)| *o == me)
        .and_then(|(_, m)| m.get(name));
    let holding: Vec<u32> = maps
        .iter()
        .filter(|(_, m)| m.contains_key(name))
        .map(|(o, _)| *o)
        .collect();
    let reference = match mine {
        Some(e) if e.ok => Some((me, e)),
        _ => maps
            .iter()
            .filter_map(|(o, m)| m.get(name).filter(|e| e.ok).map(|e| (*o, e)))
            .max_by_key(|(_, e)| e.version),
    };
    let Some((ref_osd, reference)) = reference else {
        if mine.is_none() && holding.len() * 2 <= maps.len() {
            // A delete's leftover whose copies are all bad as well.
            return Verdict::Repair {
                wrong: holding,
                reference: me,
                size_bytes: 0,
            };
        }
        return Verdict::Damaged {
            bad: maps.iter().map(|(o, _)| *o).collect(),
            intact: 0,
        };
    };
    let wrong: Vec<u32> = maps
        .iter()
        .filter(|(_, m)| {
            !m.get(name).is_some_and(|e| {
                e.ok && e.version == reference.version
                    && e.size_bytes == reference.size_bytes
                    && (!rule.compare_digests || e.digest == reference.digest)
            })
        })
        .map(|(o, _)| *o)
        .collect();
    let fine = maps.len() - wrong.len();
    if mine.is_none() && fine * 2 <= maps.len() {
        // Absent on the primary and on at least half of the copies: the absence is
        // authoritative (a delete that reached the primary).
        return Verdict::Repair {
            wrong: holding,
            reference: me,
            size_bytes: reference.size_bytes,
        };
    }
    if fine < rule.intact_needed {
        return Verdict::Damaged {
            bad: wrong,
            intact: fine,
        };
    }
    if wrong.is_empty() {
        return Verdict::Consistent;
    }
    Verdict::Repair {
        wrong,
        reference: ref_osd,
        size_bytes: reference.size_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_proto::msg::Ver;

    const REPLICATED: Rule = Rule {
        compare_digests: true,
        intact_needed: 1,
    };
    const EC_2_1: Rule = Rule {
        compare_digests: false,
        intact_needed: 2,
    };

    fn entry(seq: u64, digest: u32, ok: bool) -> ScrubEntry {
        ScrubEntry {
            name: "x".into(),
            version: Ver { epoch: 3, seq },
            size_bytes: 100,
            digest,
            ok,
        }
    }

    /// Copy maps of osd.0 (the primary), osd.1, osd.2 for object "x" (None = absent).
    fn maps(copies: [Option<ScrubEntry>; 3]) -> Vec<(u32, BTreeMap<String, ScrubEntry>)> {
        copies
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    i as u32,
                    e.map(|e| ("x".to_string(), e)).into_iter().collect(),
                )
            })
            .collect()
    }

    #[test]
    fn agreeing_intact_copies_are_consistent() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 7, true)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(classify("x", 0, &m, REPLICATED), Verdict::Consistent);
    }

    #[test]
    fn one_corrupt_replica_is_repaired_from_the_primary() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn a_corrupt_primary_is_repaired_from_an_intact_replica() {
        let m = maps([
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
            Some(entry(1, 7, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![0, 1],
                reference: 2,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn a_digest_mismatch_is_wrong_on_replicated_pools_only() {
        let m = maps([
            Some(entry(1, 7, true)),
            Some(entry(1, 8, true)),
            Some(entry(1, 7, true)),
        ]);
        assert!(matches!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair { .. }
        ));
        assert_eq!(classify("x", 0, &m, EC_2_1), Verdict::Consistent);
    }

    /// The original failure: every copy corrupt was skipped (and reported as nothing).
    #[test]
    fn no_intact_copy_is_damaged_not_skipped() {
        let m = maps([
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
        ]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Damaged {
                bad: vec![0, 1, 2],
                intact: 0
            }
        );
    }

    #[test]
    fn absent_on_the_primary_and_corrupt_elsewhere_is_damaged() {
        // The primary lost it; both replicas hold only corrupt copies: data loss, not a
        // delete's leftover (a majority holds it).
        let m = maps([None, Some(entry(1, 0, false)), Some(entry(1, 0, false))]);
        assert!(matches!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Damaged { intact: 0, .. }
        ));
    }

    #[test]
    fn a_delete_leftover_is_removed_even_when_corrupt() {
        let m = maps([None, Some(entry(1, 0, false)), None]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 0
            }
        );
        let m = maps([None, Some(entry(1, 7, true)), None]);
        assert_eq!(
            classify("x", 0, &m, REPLICATED),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
    }

    #[test]
    fn erasure_coded_objects_need_k_intact_shards() {
        // k = 2: one corrupt shard is repairable (decoded from the other two)...
        let m = maps([
            Some(entry(1, 1, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 3, true)),
        ]);
        assert_eq!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Repair {
                wrong: vec![1],
                reference: 0,
                size_bytes: 100
            }
        );
        // ...two are not, although one shard is still intact.
        let m = maps([
            Some(entry(1, 1, true)),
            Some(entry(1, 0, false)),
            Some(entry(1, 0, false)),
        ]);
        assert_eq!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Damaged {
                bad: vec![1, 2],
                intact: 1
            }
        );
        // A stale shard does not count as intact.
        let m = maps([
            Some(entry(2, 1, true)),
            Some(entry(1, 2, true)),
            Some(entry(2, 0, false)),
        ]);
        assert!(matches!(
            classify("x", 0, &m, EC_2_1),
            Verdict::Damaged { intact: 1, .. }
        ));
    }
}
