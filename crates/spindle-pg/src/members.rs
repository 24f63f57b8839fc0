//! A daemon's membership history ([`MemberHistory`]): for each placement group, since
//! which epoch each copy has been an acting member *without a break*, from the maps this
//! daemon installed. It gives peering the [`MemberEpochs`] of
//! [`crate::rules::authoritative_with`] (`PgCore::set_members`).
//!
//! The rule is conservative: claiming that a copy was a member at an epoch where it was
//! not could roll back an acknowledged write, so a copy counts as a member only over the
//! run of *consecutive* epochs, all of them seen by this daemon, that ends at the newest
//! epoch seen, in every one of which it was in the group's acting set (erasure-coded
//! groups: at the same shard position). Anything else is "not a member":
//! - an epoch this daemon never installed (maps skipped while it followed the monitor,
//!   epochs before it booted): the run of every copy restarts after the gap;
//! - an epoch where the copy was not acting (down, out, moved): its run restarts when it
//!   is acting again. A copy that left the acting set may have been removed as a stray and
//!   come back empty; an unbroken run guarantees its copy is the one that acknowledged
//!   every write of the run;
//! - a group absent from a map (pool removed): forgotten.
//!
//! Memory: one start epoch per acting copy of each group (the current runs only); ended
//! runs are dropped when a map ends them, so nothing needs trimming and the structure does
//! not grow with the number of epochs. The price: a copy whose membership was broken
//! (or a daemon that restarted, or skipped an epoch) cannot vouch for the epochs before
//! the break, and a group that would need them waits for a complete copy as new as the
//! incomplete one (liveness, not safety).

use crate::rules::MemberEpochs;
use std::collections::HashMap;
use std::hash::Hash;

/// One copy of a group: the daemon and, for erasure-coded groups, its shard position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyId {
    pub osd: u32,
    pub shard: Option<u8>,
}

impl CopyId {
    pub fn replicated(osd: u32) -> Self {
        CopyId { osd, shard: None }
    }
}

/// Unbroken acting-set membership per group, from consecutive maps (see the module
/// documentation). `G` identifies a group (the daemon uses `(pool, pg)`).
#[derive(Clone, Debug)]
pub struct MemberHistory<G> {
    /// The newest epoch recorded.
    last: Option<u64>,
    /// Per group: each acting copy of the newest epoch with the first epoch of its run.
    groups: HashMap<G, Vec<(CopyId, u64)>>,
}

impl<G> Default for MemberHistory<G> {
    fn default() -> Self {
        MemberHistory {
            last: None,
            groups: HashMap::new(),
        }
    }
}

impl<G: Hash + Eq> MemberHistory<G> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The newest epoch recorded.
    pub fn last_epoch(&self) -> Option<u64> {
        self.last
    }

    /// Records the map of `epoch`: `groups` lists every group of that map with its acting
    /// copies. A map not newer than the last recorded one is ignored; a map that does not
    /// follow it directly (epochs were skipped) restarts every run.
    pub fn record<C>(&mut self, epoch: u64, groups: impl IntoIterator<Item = (G, C)>)
    where
        C: IntoIterator<Item = CopyId>,
    {
        if self.last.is_some_and(|last| epoch <= last) {
            return;
        }
        let contiguous = self.last.is_some_and(|last| last + 1 == epoch);
        let mut previous = std::mem::take(&mut self.groups);
        let mut next = HashMap::with_capacity(previous.len());
        for (group, copies) in groups {
            let before = if contiguous {
                previous.remove(&group)
            } else {
                None
            };
            let runs: Vec<(CopyId, u64)> = copies
                .into_iter()
                .map(|c| {
                    let since = before
                        .as_ref()
                        .and_then(|b| b.iter().find(|(pc, _)| *pc == c))
                        .map_or(epoch, |&(_, since)| since);
                    (c, since)
                })
                .collect();
            next.insert(group, runs);
        }
        self.groups = next;
        self.last = Some(epoch);
    }

    /// The first epoch of `copy`'s unbroken membership of `group`, which lasts until
    /// [`MemberHistory::last_epoch`]; `None` if it is not acting at the newest epoch.
    pub fn member_since(&self, group: &G, copy: CopyId) -> Option<u64> {
        self.groups
            .get(group)?
            .iter()
            .find(|(c, _)| *c == copy)
            .map(|&(_, since)| since)
    }

    /// The membership to give peering (`PgCore::set_members`) for `copies` of `group`:
    /// each copy's unbroken run (`since..=last`), or no epoch at all.
    pub fn member_epochs(
        &self,
        group: &G,
        copies: impl IntoIterator<Item = CopyId>,
    ) -> MemberEpochs {
        copies
            .into_iter()
            .map(|c| {
                let ranges = match (self.member_since(group, c), self.last) {
                    (Some(since), Some(last)) => vec![since..=last],
                    _ => Vec::new(),
                };
                (c.osd, ranges)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::was_member;

    fn r(ids: &[u32]) -> Vec<CopyId> {
        ids.iter().map(|&o| CopyId::replicated(o)).collect()
    }

    fn record(h: &mut MemberHistory<u32>, epoch: u64, acting: &[u32]) {
        h.record(epoch, [(7u32, r(acting))]);
    }

    #[test]
    fn a_copy_is_a_member_over_its_unbroken_run_only() {
        let mut h = MemberHistory::new();
        record(&mut h, 3, &[0, 1, 2]);
        record(&mut h, 4, &[0, 1, 2]);
        record(&mut h, 5, &[0, 2]); // osd.1 down
        record(&mut h, 6, &[0, 1, 2]); // back
        assert_eq!(h.member_since(&7, CopyId::replicated(0)), Some(3));
        assert_eq!(h.member_since(&7, CopyId::replicated(2)), Some(3));
        assert_eq!(h.member_since(&7, CopyId::replicated(1)), Some(6));
        let m = h.member_epochs(&7, r(&[0, 1, 2, 3]));
        assert!(was_member(&m, 0, 3) && was_member(&m, 0, 6));
        // Before the history began: unknown, so not a member.
        assert!(!was_member(&m, 0, 2));
        // osd.1 was acting at 3 and 4, but its run broke: it cannot vouch for them.
        assert!(!was_member(&m, 1, 4) && !was_member(&m, 1, 5));
        assert!(was_member(&m, 1, 6));
        // Never a member; nor at an epoch after the newest seen.
        assert!(!was_member(&m, 3, 6));
        assert!(!was_member(&m, 0, 7));
        assert_eq!(m[&3], Vec::new());
    }

    #[test]
    fn a_skipped_epoch_restarts_every_run() {
        let mut h = MemberHistory::new();
        record(&mut h, 3, &[0, 1]);
        record(&mut h, 4, &[0, 1]);
        // Epoch 5 was never installed here: osd.1 may have been out of the group in it.
        record(&mut h, 6, &[0, 1]);
        let m = h.member_epochs(&7, r(&[0, 1]));
        assert!(!was_member(&m, 1, 4) && !was_member(&m, 1, 5));
        assert!(was_member(&m, 1, 6) && was_member(&m, 0, 6));
        assert!(!was_member(&m, 0, 3));
        record(&mut h, 7, &[0, 1]);
        assert_eq!(h.member_since(&7, CopyId::replicated(1)), Some(6));
    }

    #[test]
    fn old_or_repeated_maps_change_nothing() {
        let mut h = MemberHistory::new();
        record(&mut h, 3, &[0, 1]);
        record(&mut h, 4, &[0, 1]);
        record(&mut h, 4, &[0]);
        record(&mut h, 2, &[0]);
        assert_eq!(h.last_epoch(), Some(4));
        assert_eq!(h.member_since(&7, CopyId::replicated(1)), Some(3));
    }

    #[test]
    fn ended_runs_and_removed_groups_are_dropped() {
        let mut h = MemberHistory::new();
        h.record(1, [(1u32, r(&[0, 1, 2])), (2, r(&[1, 2, 3]))]);
        h.record(2, [(1u32, r(&[0, 1]))]); // group 2 gone (pool removed), osd.2 left group 1
        assert_eq!(h.groups.len(), 1);
        assert_eq!(h.groups[&1].len(), 2);
        assert_eq!(h.member_since(&2, CopyId::replicated(1)), None);
        // A group that reappears starts from scratch.
        h.record(3, [(1u32, r(&[0, 1])), (2, r(&[1, 2, 3]))]);
        assert_eq!(h.member_since(&2, CopyId::replicated(1)), Some(3));
        assert_eq!(h.member_since(&1, CopyId::replicated(0)), Some(1));
        // Memory stays one entry per acting copy, however many epochs go by.
        for e in 4..1000 {
            h.record(e, [(1u32, r(&[0, 1])), (2, r(&[1, 2, 3]))]);
        }
        assert_eq!(h.groups.values().map(Vec::len).sum::<usize>(), 5);
        assert_eq!(h.member_since(&1, CopyId::replicated(0)), Some(1));
    }

    #[test]
    fn an_erasure_coded_copy_that_moved_position_starts_a_new_run() {
        let mut h = MemberHistory::new();
        let ec = |v: &[(u32, u8)]| {
            v.iter()
                .map(|&(osd, s)| CopyId {
                    osd,
                    shard: Some(s),
                })
                .collect::<Vec<_>>()
        };
        h.record(1, [(0u32, ec(&[(4, 0), (5, 1), (6, 2)]))]);
        h.record(2, [(0u32, ec(&[(5, 0), (4, 1), (6, 2)]))]);
        let at = |osd, shard| CopyId {
            osd,
            shard: Some(shard),
        };
        assert_eq!(h.member_since(&0, at(6, 2)), Some(1));
        assert_eq!(h.member_since(&0, at(4, 1)), Some(2));
        assert_eq!(h.member_since(&0, at(4, 0)), None);
        let m = h.member_epochs(&0, [at(4, 1), at(6, 2)]);
        assert!(!was_member(&m, 4, 1) && was_member(&m, 4, 2) && was_member(&m, 6, 1));
    }
}
