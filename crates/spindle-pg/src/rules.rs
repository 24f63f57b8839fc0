//! The small decisions of peering and recovery (pure, unit-tested): which copy is
//! authoritative, what a backfilled copy misses, whether a group may serve, whether a
//! map change starts a new interval, and which object background recovery takes next.
//!
//! Invariants:
//! - the authoritative copy is complete and has the newest `last_version` of all complete
//!   copies (ties: the earliest in the caller's order, i.e. the primary first);
//! - with no complete copy there is no authoritative one: the group waits (incomplete).

use crate::sync::LogInfo;
use spindle_map::Pool;
use spindle_proto::msg::Ver;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The authoritative copy among `infos` (in the caller's order, primary first): the
/// *complete* copy with the newest `last_version`; on a tie the earlier one. `None` when
/// every copy is incomplete, or when an incomplete copy is newer than every complete one:
/// the group must wait for a complete copy.
///
/// Why the second case: an incomplete copy newer than the complete ones saw writes (maybe
/// acknowledged) that the complete copies missed, while the complete copy it was being
/// recovered from is not up. Taking the older complete copy would roll those writes back
/// (found by the data simulator: a copy being caught up after a replica timeout, its
/// source crashed, and a copy that had been down for the whole interval became the
/// authority).
pub fn authoritative(infos: &[(u32, LogInfo)]) -> Option<usize> {
    authoritative_with(infos, None)
}

/// For each copy, the epochs at which it was a member of the group's acting set (from
/// the map history), as inclusive ranges.
pub type MemberEpochs = BTreeMap<u32, Vec<std::ops::RangeInclusive<u64>>>;

/// Whether `copy` was an acting member at `epoch` according to `m`.
pub fn was_member(m: &MemberEpochs, copy: u32, epoch: u64) -> bool {
    m.get(&copy)
        .is_some_and(|ranges| ranges.iter().any(|r| r.contains(&epoch)))
}

/// [`authoritative`] knowing when each copy was an acting member (`members`). A write is
/// acknowledged only once every acting copy of its epoch has it, so an entry of an
/// incomplete copy newer than the complete copy `C`, written at an epoch where `C` was a
/// member, was never acknowledged (`C` does not have it). When every such newer entry is of
/// that kind (and the incomplete copy's log reaches back to `C`'s version), `C` is the
/// authority and those entries are rolled back; otherwise, or without `members`, the group
/// waits, as in [`authoritative`].
pub fn authoritative_with(
    infos: &[(u32, LogInfo)],
    members: Option<&MemberEpochs>,
) -> Option<usize> {
    let newest = infos
        .iter()
        .filter(|(_, info)| !info.incomplete)
        .map(|(_, info)| info.last_version)
        .max();
    // Among the newest complete copies (in the caller's order: the primary first), the
    // first that no newer incomplete copy contradicts.
    let chosen = infos
        .iter()
        .enumerate()
        .filter(|(_, (_, info))| !info.incomplete && Some(info.last_version) == newest)
        .map(|(i, _)| i)
        .find(|&i| {
            let (id, best) = (infos[i].0, &infos[i].1);
            infos.iter().all(|(_, x)| {
                if !x.incomplete || x.last_version <= best.last_version {
                    return true;
                }
                // Newer, incomplete: only unacknowledged entries may be newer.
                let Some(m) = members else {
                    return false;
                };
                x.log_tail <= best.last_version
                    && x.log
                        .iter()
                        .filter(|e| e.version > best.last_version)
                        .all(|e| was_member(m, id, e.version.epoch))
                    && was_member(m, id, x.last_version.epoch)
            })
        });
    if let Some(i) = chosen {
        assert!(
            !infos[i].1.incomplete,
            "an incomplete copy is never authoritative"
        );
        assert!(
            infos
                .iter()
                .filter(|(_, x)| !x.incomplete)
                .all(|(_, x)| x.last_version <= infos[i].1.last_version),
            "the authoritative copy is the newest complete one"
        );
    }
    chosen
}

/// One object of a listing (backfill compares them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListedObject {
    pub version: Ver,
    pub size_bytes: u64,
}

/// A copy's full listing: object name -> version and size.
pub type Listing = HashMap<String, ListedObject>;

/// Backfill: the objects `stale` must fetch to match `auth` (absent or at another
/// version there), plus the objects only `stale` has (to be deleted).
pub fn listing_diff(auth: &Listing, stale: &Listing) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = auth
        .iter()
        .filter(|(name, a)| stale.get(*name).map(|s| s.version) != Some(a.version))
        .map(|(name, _)| name.clone())
        .collect();
    names.extend(stale.keys().filter(|n| !auth.contains_key(*n)).cloned());
    names
}

/// Fewest copies (shards) up for a group of `pool` to be peered and serve: `min_size`
/// for replicated pools; k for erasure-coded ones (reads need k shards; writes check
/// `min_size` themselves, [`may_write`]).
pub fn serve_floor(pool: &Pool) -> u32 {
    if pool.is_erasure() {
        pool.read_size()
    } else {
        pool.min_size()
    }
}

/// Whether a write may be acknowledged with `up` copies (shards) up.
pub fn may_write(pool: &Pool, up: usize) -> bool {
    may_write_with(pool.min_size(), up)
}

/// [`may_write`] with the pool's `min_size` (`u32::MAX` when the pool is unknown: never).
pub fn may_write_with(min_size: u32, up: usize) -> bool {
    up as u64 >= u64::from(min_size)
}

/// What a new map does to a group this daemon is primary of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntervalChange {
    /// Same interval and the group is active: keep serving (recovery goes on).
    Keep,
    /// Too few copies up: stop serving, forget recovery.
    Inactive,
    /// A new interval (or the last peering did not finish): peer again.
    Peer,
}

/// The identity of a group's interval, compared by [`interval_change`]: each acting
/// member with its `up_from` (a restarted daemon starts a new interval). Replicated groups
/// (`shards` empty): the up set in order. Erasure-coded groups: every shard position's
/// daemon, a hole as `(u32::MAX, 0)`, because a daemon that moves to another position
/// (CRUSH moves survivors when a daemon goes out) stores that position under another
/// group id: its copy there is new (empty until recovered) even when the up set, in the
/// same order, did not change. Without the positions such a map kept the interval, the
/// group never peered, and its primary answered "no such object" from the empty copy.
pub fn interval_identity(
    up: &[u32],
    shards: &[Option<u32>],
    up_from: impl Fn(u32) -> u64,
) -> Vec<(u32, u64)> {
    if shards.is_empty() {
        up.iter().map(|&d| (d, up_from(d))).collect()
    } else {
        shards
            .iter()
            .map(|d| d.map_or((u32::MAX, 0), |d| (d, up_from(d))))
            .collect()
    }
}

/// `old` / `new`: the interval identity (up set with each member's `up_from`); `active`:
/// whether the group is active now; `up` copies up, `floor` = [`serve_floor`].
pub fn interval_change(
    old: &[(u32, u64)],
    new: &[(u32, u64)],
    active: bool,
    up: usize,
    floor: u32,
) -> IntervalChange {
    if (up as u64) < u64::from(floor) {
        IntervalChange::Inactive
    } else if old == new && active {
        IntervalChange::Keep
    } else {
        IntervalChange::Peer
    }
}

/// Recovery order: the first missing object (in name order) that nobody is recovering
/// right now. `None` when every missing object is in progress (or none is missing).
pub fn next_to_recover<'a, V>(
    missing: &'a std::collections::BTreeMap<String, V>,
    in_progress: &std::collections::HashSet<String>,
) -> Option<(&'a String, &'a V)> {
    missing.iter().find(|(n, _)| !in_progress.contains(*n))
}

/// Erasure-coded groups: the members whose copy existed before this interval (it has a
/// version or a log). An empty new copy cannot tell whether a version was ever written.
pub fn established(infos: &[(u32, LogInfo)]) -> Vec<u32> {
    infos
        .iter()
        .filter(|(_, i)| i.last_version > Ver::default() || !i.log.is_empty())
        .map(|(d, _)| *d)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_map::PoolKind;
    use std::collections::{BTreeMap, HashSet};

    fn info(seq: u64, incomplete: bool) -> LogInfo {
        LogInfo {
            last_version: Ver { epoch: 1, seq },
            incomplete,
            ..LogInfo::default()
        }
    }

    #[test]
    fn the_newest_complete_copy_is_authoritative() {
        let infos = vec![(0, info(3, false)), (1, info(4, true)), (2, info(5, false))];
        assert_eq!(authoritative(&infos), Some(2));
        // Ties prefer the earlier copy (the primary).
        let infos = vec![(0, info(5, false)), (1, info(5, false))];
        assert_eq!(authoritative(&infos), Some(0));
    }

    #[test]
    fn an_incomplete_copy_newer_than_every_complete_one_means_wait() {
        // Copy 1 was being caught up when its source went down: it has writes the
        // complete copies never saw; taking copy 2 would roll them back.
        let infos = vec![(0, info(3, false)), (1, info(9, true)), (2, info(5, false))];
        assert_eq!(authoritative(&infos), None);
        // Once a complete copy at least as new is back, it is the authority.
        let infos9 = vec![(0, info(9, false)), (1, info(9, true)), (2, info(5, false))];
        assert_eq!(authoritative(&infos9), Some(0));
        // Copy 1's newer entries were written at epoch 4, when copy 2 was a member and did
        // not get them: never acknowledged, copy 2 is the authority.
        let newer = |epoch| {
            let mut x = info(9, true);
            x.last_version = Ver { epoch, seq: 9 };
            x.log = (6..=9)
                .map(|seq| spindle_proto::msg::LogEntryMsg {
                    version: Ver { epoch, seq },
                    name: format!("o{seq}"),
                    delete: false,
                })
                .collect();
            x
        };
        let infos = vec![(0, info(3, false)), (1, newer(4)), (2, info(5, false))];
        let members: MemberEpochs =
            [(0, vec![1..=4]), (1, vec![1..=4]), (2, vec![1..=1, 4..=4])].into();
        assert_eq!(authoritative_with(&infos, Some(&members)), Some(2));
        // Copy 2 was not a member at epoch 4 (down): the entries may be acknowledged: wait.
        let members: MemberEpochs = [(0, vec![1..=4]), (1, vec![1..=4]), (2, vec![1..=3])].into();
        assert_eq!(authoritative_with(&infos, Some(&members)), None);
        // Without the history: wait.
        assert_eq!(authoritative_with(&infos, None), None);
        // Two complete copies at the same version: the one that was a member at epoch 4
        // is the authority, even if the other comes first.
        let infos = vec![(0, info(5, false)), (1, newer(4)), (2, info(5, false))];
        let members: MemberEpochs = [(0, vec![1..=3]), (1, vec![1..=4]), (2, vec![1..=4])].into();
        assert_eq!(authoritative_with(&infos, Some(&members)), Some(2));
    }

    #[test]
    fn no_complete_copy_means_no_authority() {
        let infos = vec![(0, info(3, true)), (1, info(9, true))];
        assert_eq!(authoritative(&infos), None);
        assert_eq!(authoritative(&[]), None);
    }

    #[test]
    fn backfill_diff_names_missing_stale_and_extra_objects() {
        let o = |seq, size_bytes| ListedObject {
            version: Ver { epoch: 1, seq },
            size_bytes,
        };
        let auth: Listing = [
            ("a".into(), o(1, 10)),
            ("b".into(), o(2, 20)),
            ("c".into(), o(3, 30)),
        ]
        .into_iter()
        .collect();
        let stale: Listing = [
            ("a".into(), o(1, 10)),
            ("b".into(), o(1, 20)),
            ("z".into(), o(1, 1)),
        ]
        .into_iter()
        .collect();
        let want: BTreeSet<String> = ["b", "c", "z"].iter().map(|s| s.to_string()).collect();
        assert_eq!(listing_diff(&auth, &stale), want);
        assert!(listing_diff(&auth, &auth).is_empty());
    }

    fn pool(kind: PoolKind) -> Pool {
        Pool {
            id: 1,
            name: "p".into(),
            kind,
            pg_count: 8,
            crush_rule: 0,
        }
    }

    #[test]
    fn serving_needs_min_size_or_k_shards() {
        let rep = pool(PoolKind::Replicated {
            size: 3,
            min_size: 2,
        });
        assert_eq!(serve_floor(&rep), 2);
        assert!(may_write(&rep, 2) && !may_write(&rep, 1));
        let ec = pool(PoolKind::Erasure {
            k: 4,
            m: 2,
            min_size: 5,
            matrix: 0,
            stripe_unit_bytes: 4096,
        });
        assert_eq!(serve_floor(&ec), 4);
        assert!(may_write(&ec, 5) && !may_write(&ec, 4));
    }

    #[test]
    fn an_erasure_coded_interval_changes_when_a_shard_moves_to_another_position() {
        let from = |d: u32| u64::from(d) + 10;
        // Replicated: the up set in order.
        assert_eq!(
            interval_identity(&[0, 2], &[], from),
            vec![(0, 10), (2, 12)]
        );
        // osd.2 moves from position 1 to position 2 (osd.4 went out): the up set [0, 2]
        // is the same, the interval is not.
        let before = interval_identity(&[0, 2], &[Some(0), Some(2), None], from);
        let after = interval_identity(&[0, 2], &[Some(0), None, Some(2)], from);
        assert_ne!(before, after);
        assert_eq!(
            interval_change(&before, &after, true, 2, 2),
            IntervalChange::Peer
        );
        // The primary itself moves.
        let before = interval_identity(&[2, 1], &[None, Some(2), Some(1)], from);
        let after = interval_identity(&[2, 1], &[Some(2), None, Some(1)], from);
        assert_eq!(
            interval_change(&before, &after, true, 2, 2),
            IntervalChange::Peer
        );
        // Same positions: kept.
        assert_eq!(
            interval_change(&after, &after, true, 2, 2),
            IntervalChange::Keep
        );
    }

    #[test]
    fn interval_changes() {
        let a = [(0, 1), (1, 1), (2, 1)];
        let b = [(0, 1), (1, 7), (2, 1)]; // osd.1 restarted: a new interval
        assert_eq!(interval_change(&a, &a, true, 3, 2), IntervalChange::Keep);
        assert_eq!(interval_change(&a, &a, false, 3, 2), IntervalChange::Peer);
        assert_eq!(interval_change(&a, &b, true, 3, 2), IntervalChange::Peer);
        assert_eq!(
            interval_change(&a, &a[..1], true, 1, 2),
            IntervalChange::Inactive
        );
    }

    #[test]
    fn recovery_takes_the_first_object_not_in_progress() {
        let missing: BTreeMap<String, u64> = [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
            .into_iter()
            .collect();
        let mut busy = HashSet::new();
        assert_eq!(
            next_to_recover(&missing, &busy).map(|(n, _)| n.as_str()),
            Some("a")
        );
        busy.insert("a".to_string());
        busy.insert("b".to_string());
        assert_eq!(
            next_to_recover(&missing, &busy).map(|(n, _)| n.as_str()),
            Some("c")
        );
        busy.insert("c".to_string());
        assert_eq!(next_to_recover(&missing, &busy), None);
    }

    #[test]
    fn established_copies_have_a_version_or_a_log() {
        let empty = LogInfo::default();
        let infos = vec![(0, empty), (1, info(4, false))];
        assert_eq!(established(&infos), vec![1]);
    }
}
