//! Erasure-coded groups: slot names and the recovery rule for one slot object.
//!
//! A shard of object `o` lives in slot objects at three positions, each either a whole
//! shard (`o\0` + digit) or a delta over a whole-shard slot (`o\0d` + digit); a write
//! always fills a position holding neither the current version nor the base of a current
//! delta, so the previous version stays intact on every shard until the new one is
//! acknowledged (a write is acknowledged only when every up shard is durable and at least
//! `min_size` shards are up). Slot objects are written once and deleted later, never
//! changed in place.
//!
//! Recovering a slot ([`decide_slot`]): take the newest version any shard (member or
//! stray copy of a position) holds; with at least k positions holding it, rebuild the
//! others from k of them (roll forward); with fewer, roll it back (delete the slot
//! everywhere) **only if** the positions holding it plus every position nobody can speak
//! for (a hole, a member that did not answer or whose copy is unreadable, a new member
//! with no stray copy of its position) stay below `min_size`: then no write of that
//! version could have been acknowledged. Otherwise wait for more shards.
//!
//! Invariant: a version that was acknowledged (held by at least `min_size` positions) is
//! never rolled back, whatever subset of shards answers (checked by a seeded randomized
//! test in `tests/sim.rs`).

use spindle_proto::msg::Ver;

/// Slot positions of an object: a write fills a position holding neither the current
/// version nor the base a current delta slot is written over, so both stay intact until
/// the write is acknowledged.
pub const SLOT_POSITIONS: u8 = 3;

/// Stored name of the whole-shard slot at `slot` of object `name` (`name\0` + digit).
pub fn slot_name(name: &str, slot: u8) -> String {
    assert!(
        slot < SLOT_POSITIONS,
        "an object has {SLOT_POSITIONS} slot positions, not {slot}"
    );
    format!("{name}\0{slot}")
}

/// Stored name of the delta slot at `slot` of object `name` (`name\0d` + digit): a slot
/// that stores only the changed ranges of the shard over a whole-shard base slot
/// (`spindle_map::ec::DeltaSlot`).
pub fn delta_slot_name(name: &str, slot: u8) -> String {
    assert!(
        slot < SLOT_POSITIONS,
        "an object has {SLOT_POSITIONS} slot positions, not {slot}"
    );
    format!("{name}\0d{slot}")
}

/// Every stored name an object's shard may have, whole-shard slots first.
pub fn all_slot_names(name: &str) -> Vec<String> {
    (0..SLOT_POSITIONS)
        .map(|s| slot_name(name, s))
        .chain((0..SLOT_POSITIONS).map(|s| delta_slot_name(name, s)))
        .collect()
}

/// (object name, slot position) of a stored slot name, whole-shard or delta.
pub fn split_slot(stored: &str) -> Option<(&str, u8)> {
    let (name, slot) = stored.rsplit_once('\0')?;
    let digit = slot.strip_prefix('d').unwrap_or(slot);
    match digit {
        "0" => Some((name, 0)),
        "1" => Some((name, 1)),
        "2" => Some((name, 2)),
        _ => None,
    }
}

/// Whether a stored slot name is a delta slot.
pub fn is_delta_slot(stored: &str) -> bool {
    stored
        .rsplit_once('\0')
        .is_some_and(|(_, s)| s.len() == 2 && s.starts_with('d'))
        && split_slot(stored).is_some()
}

/// What one shard copy said about a slot object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardAnswer {
    /// The copy does not hold the slot.
    Absent,
    /// The copy holds the slot at this version (trailer valid).
    Present(Ver),
    /// The copy could not say: unreachable, or its bytes are unreadable or invalid. It
    /// may hold any version.
    Unknown,
}

/// Everything [`decide_slot`] needs about one slot object of a group.
#[derive(Clone, Debug)]
pub struct SlotView {
    /// Data shards.
    pub k: usize,
    /// Data + parity shards (positions).
    pub total: usize,
    /// Shards that must be up for a write to be acknowledged.
    pub min_size: u32,
    /// Per position: its member (None: a hole) and what the member's copy said.
    pub members: Vec<Option<(u32, ShardAnswer)>>,
    /// Copies of positions held by daemons that are no longer at that position:
    /// (position, what the copy said).
    pub strays: Vec<(usize, ShardAnswer)>,
    /// Members whose copy existed before this interval (an empty new copy cannot tell
    /// whether a version was ever written).
    pub established: Vec<u32>,
    /// Members that were sent the newest version's write: the member of their position
    /// without a break since an epoch no later than the version's (`vouch_by_membership`).
    /// An erasure-coded write is acknowledged only once every member it was sent to has
    /// it durable, so one of these that answered without it proves the version was never
    /// acknowledged.
    pub witnesses: Vec<u32>,
}

/// What to do with one slot object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotDecision {
    /// No shard holds it: it is deleted; make the targets agree (push "absent"). Only
    /// when the positions nobody can speak for stay below `min_size` (else [`Wait`],
    /// with the default version: an acknowledged version may be on them).
    ///
    /// [`Wait`]: SlotDecision::Wait
    Deleted,
    /// Roll forward: decode from the k positions `sources` (all at `version`) and push
    /// the result to the member positions `targets` (those not holding `version`).
    Rebuild {
        version: Ver,
        sources: Vec<usize>,
        targets: Vec<usize>,
    },
    /// `version` can never have been acknowledged: delete the slot on every member (the
    /// other slot, the previous version, is current again).
    RollBack { version: Ver },
    /// Fewer than k positions hold `version` but it may have been acknowledged: wait for
    /// more shards to answer.
    Wait { version: Ver, holding: usize },
}

/// The recovery rule for one slot object (see the module docs). Pure.
pub fn decide_slot(view: &SlotView) -> SlotDecision {
    assert_eq!(
        view.members.len(),
        view.total,
        "one member entry per position"
    );
    assert!(view.k >= 1 && view.k <= view.total, "k in 1..=total");
    let Some(version) = newest_version(view) else {
        // Nobody that answered holds it; the silent positions may (an acknowledged write
        // with the answering shards' copies lagging or down): deleting it on their word
        // would make the previous slot current again.
        if unknown_positions(view) as u64 >= u64::from(view.min_size) {
            return SlotDecision::Wait {
                version: Ver::default(),
                holding: 0,
            };
        }
        return SlotDecision::Deleted;
    };
    let member_has =
        |p: usize| matches!(view.members[p], Some((_, ShardAnswer::Present(v))) if v == version);
    let stray_has = |p: usize| {
        view.strays
            .iter()
            .any(|(sp, a)| *sp == p && *a == ShardAnswer::Present(version))
    };
    let holding: Vec<usize> = (0..view.total)
        .filter(|&p| member_has(p) || stray_has(p))
        .collect();
    if holding.len() >= view.k {
        let sources: Vec<usize> = holding.iter().copied().take(view.k).collect();
        let targets: Vec<usize> = (0..view.total)
            .filter(|&p| view.members[p].is_some() && !member_has(p))
            .collect();
        return SlotDecision::Rebuild {
            version,
            sources,
            targets,
        };
    }
    // A witness that answered without the version: it was sent the write and the write
    // is acknowledged only once every member it went to has it, so it never was. (Only
    // after the roll-forward check: rolling forward is right either way.)
    let witnessed_absent = view.members.iter().enumerate().any(|(p, m)| {
        matches!(m, Some((d, a)) if *a != ShardAnswer::Unknown
            && view.witnesses.contains(d)
            && !member_has(p))
    });
    if witnessed_absent {
        return SlotDecision::RollBack { version };
    }
    let unknown = unknown_positions(view);
    if (holding.len() + unknown) as u64 >= u64::from(view.min_size) {
        return SlotDecision::Wait {
            version,
            holding: holding.len(),
        };
    }
    SlotDecision::RollBack { version }
}

/// The newest version any member or stray copy holds (the version [`decide_slot`] settles).
pub fn newest_version(view: &SlotView) -> Option<Ver> {
    view.members
        .iter()
        .flatten()
        .map(|(_, a)| *a)
        .chain(view.strays.iter().map(|(_, a)| *a))
        .filter_map(|a| match a {
            ShardAnswer::Present(v) => Some(v),
            _ => None,
        })
        .max()
}

/// Adds to `view.established` every member that has been the member of its position,
/// without a break, since an epoch no later than that of the newest version
/// (`member_since(position, osd)`, from the primary's `MemberHistory`). Such a member was
/// sent that write, and an erasure-coded write is acknowledged only once every up shard
/// has it durable: its "absent" is an answer even if its copy has no version or log yet.
/// Without this, a new group whose first write failed on some shards (a map change
/// answered `StaleMap`) left those shards "not established", the rule counted them as
/// positions that may hold the version, and the slot waited for more shards forever
/// (`tests/netns.rs` (b), in its healthy baseline). Pure.
///
/// The same members are the version's witnesses (`SlotView::witnesses`): one that
/// answered without the version proves it unacknowledged. (Tried in session 21 and taken
/// out: a second write to the object could then go out before a failed version was
/// settled and overwrite the witness's copy; since session 22 a failed version is settled
/// before the object's next operation, `PgState::unsettled`.)
pub fn vouch_by_membership(view: &mut SlotView, member_since: impl Fn(usize, u32) -> Option<u64>) {
    let Some(newest) = newest_version(view) else {
        return;
    };
    for (pos, member) in view.members.iter().enumerate() {
        let Some((d, answer)) = member else { continue };
        if *answer == ShardAnswer::Unknown {
            continue;
        }
        if member_since(pos, *d).is_some_and(|since| since <= newest.epoch) {
            if !view.established.contains(d) {
                view.established.push(*d);
            }
            if !view.witnesses.contains(d) {
                view.witnesses.push(*d);
            }
        }
    }
}

/// Positions nobody can speak for: a hole without a stray copy that answered (or with
/// one that did not), a member that did not answer (or whose stray copy did not), a new
/// member with no stray copy of its position.
///
/// A hole whose position's previous holder answered as a stray is spoken for, as a new
/// member's position is: no write reached that position since (a hole gets none). Before,
/// every hole counted as unknown: with three hosts, one cut off, a survivor that CRUSH
/// moved to the cut host's position leaves its old position a hole (`[0,2,4]` ->
/// `[2,-,4]`), so the new position and the hole made two unknowns = `min_size` 2 and a
/// slot nobody holds (an older slot trimmed after a later write) waited for more shards
/// forever; the primary recovers every missing slot of an object before serving it, so
/// reads of such objects answered `Again` until the client's 30 s timeout (EIO over NBD,
/// `tests/netns.rs` (b)).
fn unknown_positions(view: &SlotView) -> usize {
    (0..view.total)
        .filter(|&p| match view.members[p] {
            None => {
                let mut strays = view.strays.iter().filter(|(sp, _)| *sp == p).peekable();
                strays.peek().is_none() || strays.any(|(_, a)| *a == ShardAnswer::Unknown)
            }
            Some((_, ShardAnswer::Unknown)) => true,
            Some((d, _)) => {
                view.strays
                    .iter()
                    .any(|(sp, a)| *sp == p && *a == ShardAnswer::Unknown)
                    || (!view.established.contains(&d)
                        && !view.strays.iter().any(|(sp, _)| *sp == p))
            }
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(seq: u64) -> Ver {
        Ver { epoch: 2, seq }
    }

    /// k = 2, m = 1, min_size = 3 (every shard must be up for a write).
    fn view(members: [Option<ShardAnswer>; 3]) -> SlotView {
        SlotView {
            k: 2,
            total: 3,
            min_size: 3,
            members: members
                .iter()
                .enumerate()
                .map(|(p, a)| a.map(|a| (p as u32 + 10, a)))
                .collect(),
            strays: Vec::new(),
            established: vec![10, 11, 12],
            witnesses: Vec::new(),
        }
    }

    /// `tests/netns.rs` (c): 2+1, min_size 2, a write reached position 0 only before the
    /// host of position 2 was cut off. Position 1's member was sent it (a witness) and
    /// lacks it: never acknowledged, rolled back, instead of waiting for the cut host
    /// (every operation on the object answered `Again` until it returned).
    #[test]
    fn a_witness_without_the_version_proves_it_unacknowledged() {
        use ShardAnswer::*;
        let mut w = view([Some(Present(v(5))), Some(Present(v(4))), Some(Unknown)]);
        w.min_size = 2;
        assert_eq!(
            decide_slot(&w),
            SlotDecision::Wait {
                version: v(5),
                holding: 1
            }
        );
        w.witnesses = vec![11];
        assert_eq!(decide_slot(&w), SlotDecision::RollBack { version: v(5) });
        // Absent counts the same; a witness that did not answer proves nothing.
        w.members[1] = Some((11, Absent));
        assert_eq!(decide_slot(&w), SlotDecision::RollBack { version: v(5) });
        w.members[1] = Some((11, Unknown));
        assert!(matches!(decide_slot(&w), SlotDecision::Wait { .. }));
        // Enough holders: rolled forward whatever a witness says.
        let mut f = view([Some(Present(v(5))), Some(Absent), Some(Present(v(5)))]);
        f.witnesses = vec![10, 11, 12];
        assert!(matches!(decide_slot(&f), SlotDecision::Rebuild { .. }));
        // vouch_by_membership: members since the version's epoch (2) are witnesses, a
        // newer member or one that did not answer is not.
        let mut m = view([Some(Present(v(5))), Some(Absent), Some(Absent)]);
        m.established.clear();
        vouch_by_membership(&mut m, |pos, _| Some(if pos == 2 { 3 } else { 1 }));
        assert_eq!(m.witnesses, vec![10, 11]);
        assert_eq!(m.established, vec![10, 11]);
    }

    #[test]
    fn slot_names_round_trip() {
        assert_eq!(split_slot(&slot_name("obj", 1)), Some(("obj", 1)));
        assert_eq!(split_slot(&slot_name("a\0b", 0)), Some(("a\0b", 0)));
        assert_eq!(split_slot(&slot_name("obj", 2)), Some(("obj", 2)));
        assert_eq!(split_slot(&delta_slot_name("obj", 2)), Some(("obj", 2)));
        assert!(is_delta_slot(&delta_slot_name("a\0b", 0)));
        assert!(!is_delta_slot(&slot_name("a\0b", 0)));
        assert!(!is_delta_slot("plain"));
        assert_eq!(split_slot("plain"), None);
        assert_eq!(split_slot("x\x003"), None);
        assert_eq!(split_slot("x\x00d3"), None);
        assert_eq!(split_slot("x\x00dd1"), None);
        let all = all_slot_names("o");
        assert_eq!(all.len(), 2 * SLOT_POSITIONS as usize);
        assert!(all
            .iter()
            .all(|n| split_slot(n) == Some(("o", split_slot(n).unwrap().1))));
    }

    #[test]
    fn nobody_holding_the_slot_means_deleted() {
        let d = decide_slot(&view([Some(ShardAnswer::Absent); 3]));
        assert_eq!(d, SlotDecision::Deleted);
    }

    /// Found by the data simulator (`spindle sim --data --ec --ec-min-size 2 --seed 212`):
    /// a version acknowledged on two of three shards (the third down), the daemon holding
    /// it down, the other holder's pull lost: nobody that answered holds it, but the two
    /// silent positions may (they did). Deleting it would bring the previous slot back.
    #[test]
    fn nobody_answering_with_it_is_not_deleted_while_silent_positions_may_hold_it() {
        use ShardAnswer::*;
        let mut w = view([None, Some(Absent), Some(Unknown)]);
        w.min_size = 2;
        assert_eq!(
            decide_slot(&w),
            SlotDecision::Wait {
                version: Ver::default(),
                holding: 0
            }
        );
        // With min_size 3 the two silent positions cannot have acknowledged it alone.
        let d = decide_slot(&view([None, Some(Absent), Some(Unknown)]));
        assert_eq!(d, SlotDecision::Deleted);
    }

    /// `tests/netns.rs` (b): three hosts, 2+1, min_size 2, the host of position 0 cut
    /// off; CRUSH moves the survivor of position 1 (osd 11) to position 0 (a new, empty
    /// copy) and leaves position 1 a hole, whose old copy on osd 11 is now a stray. A slot
    /// nobody holds (trimmed) must be deleted, not waited for: the only position nobody
    /// can speak for is 0 (its old holder is down), and one position cannot hold an
    /// acknowledged version when min_size is 2. Before, the hole counted as unknown too
    /// (two unknowns = min_size: wait forever, and reads of the object timed out).
    #[test]
    fn a_hole_whose_stray_answered_is_spoken_for() {
        use ShardAnswer::*;
        let w = SlotView {
            k: 2,
            total: 3,
            min_size: 2,
            members: vec![Some((11, Absent)), None, Some((12, Absent))],
            strays: vec![(1, Absent)],
            established: vec![12],
            witnesses: Vec::new(),
        };
        assert_eq!(decide_slot(&w), SlotDecision::Deleted);
        // The slot at a version the stray and the other member hold: rebuilt on the new
        // copy from them.
        let mut r = w.clone();
        r.members = vec![Some((11, Absent)), None, Some((12, Present(v(5))))];
        r.strays = vec![(1, Present(v(5)))];
        assert_eq!(
            decide_slot(&r),
            SlotDecision::Rebuild {
                version: v(5),
                sources: vec![1, 2],
                targets: vec![0]
            }
        );
        // A hole whose stray did not answer, or with no stray at all, stays unknown.
        let mut u = w.clone();
        u.strays = vec![(1, Unknown)];
        assert!(matches!(decide_slot(&u), SlotDecision::Wait { .. }));
        let mut n = w.clone();
        n.strays.clear();
        assert!(matches!(decide_slot(&n), SlotDecision::Wait { .. }));
        // One holder, one silent position: it may have been acknowledged (min_size 2).
        let mut one = w.clone();
        one.members = vec![Some((11, Absent)), None, Some((12, Present(v(5))))];
        assert_eq!(
            decide_slot(&one),
            SlotDecision::Wait {
                version: v(5),
                holding: 1
            }
        );
    }

    #[test]
    fn k_shards_roll_forward_to_the_others() {
        use ShardAnswer::*;
        let d = decide_slot(&view([
            Some(Present(v(5))),
            Some(Absent),
            Some(Present(v(5))),
        ]));
        assert_eq!(
            d,
            SlotDecision::Rebuild {
                version: v(5),
                sources: vec![0, 2],
                targets: vec![1]
            }
        );
        // An older version on a copy is a target too.
        let d = decide_slot(&view([
            Some(Present(v(5))),
            Some(Present(v(4))),
            Some(Present(v(5))),
        ]));
        assert!(matches!(d, SlotDecision::Rebuild { ref targets, .. } if targets == &vec![1]));
    }

    #[test]
    fn a_version_below_min_size_is_rolled_back() {
        use ShardAnswer::*;
        // One shard of three has it, the other two answered "absent": never acknowledged.
        let d = decide_slot(&view([Some(Present(v(5))), Some(Absent), Some(Absent)]));
        assert_eq!(d, SlotDecision::RollBack { version: v(5) });
    }

    #[test]
    fn positions_nobody_can_speak_for_block_a_roll_back() {
        use ShardAnswer::*;
        // The third shard did not answer: it may hold v5, and 1 + 1 + ... could have been
        // acknowledged only with all three; one answered absent so 1 + 1 < 3: roll back.
        let d = decide_slot(&view([Some(Present(v(5))), Some(Absent), Some(Unknown)]));
        assert_eq!(d, SlotDecision::RollBack { version: v(5) });
        // With min_size 2, the unknown shard could complete an acknowledged write: wait.
        let mut w = view([Some(Present(v(5))), Some(Absent), Some(Unknown)]);
        w.min_size = 2;
        assert_eq!(
            decide_slot(&w),
            SlotDecision::Wait {
                version: v(5),
                holding: 1
            }
        );
        // A hole counts like an unknown position.
        let mut h = view([Some(Present(v(5))), Some(Absent), None]);
        h.min_size = 2;
        assert!(matches!(decide_slot(&h), SlotDecision::Wait { .. }));
        // A new member (not established) with no stray copy of its position too.
        let mut n = view([Some(Present(v(5))), Some(Absent), Some(Absent)]);
        n.min_size = 2;
        n.established = vec![10, 11];
        assert!(matches!(decide_slot(&n), SlotDecision::Wait { .. }));
        // ...unless a stray copy of that position answered that it does not hold it.
        n.strays = vec![(2, Absent)];
        assert_eq!(decide_slot(&n), SlotDecision::RollBack { version: v(5) });
    }

    #[test]
    fn members_since_the_versions_epoch_vouch_for_absence() {
        use ShardAnswer::*;
        // A new group's first write (epoch 2) reached one shard of three; the others have
        // no version or log (not established). min_size 2: without membership the two
        // empty members are unknown and the slot waits forever.
        let mut n = view([Some(Present(v(1))), Some(Absent), Some(Absent)]);
        n.min_size = 2;
        n.established = vec![];
        assert!(matches!(decide_slot(&n), SlotDecision::Wait { .. }));
        // Members since epoch 1 (before the write): their absence is an answer.
        let mut m = n.clone();
        vouch_by_membership(&mut m, |_, _| Some(1));
        assert_eq!(m.established, vec![10, 11, 12]);
        assert_eq!(decide_slot(&m), SlotDecision::RollBack { version: v(1) });
        // Members only since epoch 3 (after the write: they may have joined empty after
        // it was acknowledged): no vouching, still waiting.
        let mut late = n.clone();
        vouch_by_membership(&mut late, |_, _| Some(3));
        assert!(late.established.is_empty());
        assert!(matches!(decide_slot(&late), SlotDecision::Wait { .. }));
        // An unknown answer is never vouched for; no history, no vouching.
        let mut u = view([Some(Present(v(1))), Some(Unknown), Some(Absent)]);
        u.established = vec![];
        vouch_by_membership(&mut u, |pos, _| (pos != 2).then_some(1));
        assert_eq!(u.established, vec![10]);
    }

    #[test]
    fn stray_copies_count_as_holders() {
        use ShardAnswer::*;
        let mut s = view([Some(Present(v(5))), Some(Absent), Some(Absent)]);
        s.strays = vec![(1, Present(v(5)))];
        assert_eq!(
            decide_slot(&s),
            SlotDecision::Rebuild {
                version: v(5),
                sources: vec![0, 1],
                targets: vec![1, 2]
            }
        );
    }
}
