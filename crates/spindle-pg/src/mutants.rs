//! Deliberately broken rules, kept to prove that the seeded tests and the simulators catch
//! them (issue #17's re-introduced bugs). Never called by a daemon.

use crate::ec::{decide_slot, ShardAnswer, SlotDecision, SlotView};

/// The EC rule before the fix (issue #17 (b)): a position whose pull failed (no answer, a
/// hole, a daemon new at the position) counted as not holding the version, so a map change
/// during recovery could roll back an acknowledged write.
pub fn ec_decide_counting_failed_pulls_as_absent(view: &SlotView) -> SlotDecision {
    let mut seen = view.clone();
    for (p, m) in seen.members.iter_mut().enumerate() {
        match m {
            None => *m = Some((900 + p as u32, ShardAnswer::Absent)),
            Some((_, a @ ShardAnswer::Unknown)) => *a = ShardAnswer::Absent,
            _ => {}
        }
    }
    for (_, a) in seen.strays.iter_mut() {
        if *a == ShardAnswer::Unknown {
            *a = ShardAnswer::Absent;
        }
    }
    seen.established = seen.members.iter().flatten().map(|(d, _)| *d).collect();
    decide_slot(&seen)
}
