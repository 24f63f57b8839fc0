//! Read leases: a primary serves reads only while every other copy of the group has told
//! it, recently, that it is at the same map epoch; and a copy that told a primary so does
//! not help a *different* primary of a newer epoch take over (it holds back its peering
//! answer) until that promise ran out. So a primary that was cut off and replaced cannot
//! serve stale data to clients that still have its map (Ceph's read leases, between the
//! primary and its replicas; the monitors are not needed, so reads go on while every
//! monitor is down).
//!
//! Timeline: the primary P sends `PeerPing` at time s (its clock) at epoch E; a copy R at
//! epoch E answers at r >= s and promises "until r + LEASE_MS". P counts the lease from s:
//! until s + LEASE_MS <= r + LEASE_MS. A new primary Q of epoch E+1 peers with the copies
//! (itself included) before it takes writes; R answers Q's `PgQuery` only after its
//! promise to P ran out, or once P pinged at a newer epoch (then P no longer reads at E),
//! so P's lease has lapsed before Q accepts any write. Clock rates are assumed equal to
//! within the margin between the two ends (monotonic clocks on one host or NTP-disciplined
//! hosts).
//!
//! Decisions only (no I/O): `Osd` sends the pings (`ping_loop`), records the answers, and
//! asks before serving a read and before answering a peering query.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an answered ping lets a primary serve reads, and how long a copy's promise
/// holds. A copy that crashed stops reads of the groups it is in for at most this long
/// before the map marks it down (`down_after_ms`, 2 s, plus the map's way to the primary).
pub const LEASE: Duration = Duration::from_millis(2000);
/// How often a primary pings the copies of its groups (eight pings per lease: a few
/// slow answers under load do not let a lease lapse).
pub const PING_INTERVAL: Duration = Duration::from_millis(250);
const _: () = assert!(PING_INTERVAL.as_millis() * 4 <= LEASE.as_millis());

#[derive(Default)]
pub struct Leases {
    /// As a primary: per peer daemon, the latest answer (when the ping was sent, the
    /// peer's epoch then).
    acks: HashMap<u32, (Instant, u64)>,
    /// As a copy: per daemon that pinged, (its epoch, the promise's end).
    promises: HashMap<u32, (u64, Instant)>,
}

impl Leases {
    /// A peer answered a ping sent at `sent` with its epoch.
    pub fn answered(&mut self, peer: u32, sent: Instant, peer_epoch: u64) {
        let e = self.acks.entry(peer).or_insert((sent, peer_epoch));
        if sent >= e.0 {
            *e = (sent, peer_epoch);
        }
    }

    /// Whether this daemon, primary at `epoch`, may serve a read of a group whose other
    /// copies are `peers`: Err names a copy without a fresh answer at that epoch.
    pub fn may_read(
        &self,
        peers: impl IntoIterator<Item = u32>,
        epoch: u64,
        now: Instant,
    ) -> Result<(), String> {
        for p in peers {
            match self.acks.get(&p) {
                None => return Err(format!("no read lease yet from osd.{p}")),
                Some((sent, e)) if *e != epoch => {
                    return Err(format!(
                        "osd.{p} is at epoch {e}, this primary at {epoch} (sent {} ms ago)",
                        now.saturating_duration_since(*sent).as_millis()
                    ))
                }
                Some((sent, _)) if *sent + LEASE <= now => {
                    return Err(format!(
                        "read lease from osd.{p} ran out (last answer to a ping sent {} ms ago)",
                        now.saturating_duration_since(*sent).as_millis()
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// A ping from `from` at `their_epoch` arrived at a copy at `my_epoch`: promise when
    /// the epochs agree (a later ping at a newer epoch replaces the promise: the pinger
    /// reads at that epoch only).
    pub fn pinged(&mut self, from: u32, their_epoch: u64, my_epoch: u64, now: Instant) {
        if their_epoch == my_epoch {
            self.promises.insert(from, (their_epoch, now + LEASE));
        } else if their_epoch > my_epoch {
            // The pinger moved on: what it was promised at an older epoch no longer binds.
            self.promises.remove(&from);
        }
    }

    /// The latest end of a promise that stops this copy, at `my_epoch`, from answering the
    /// peering of `primary`: a promise still running to another daemon made at an older
    /// epoch (it may still read as that epoch's primary).
    pub fn held_back_until(&self, primary: u32, my_epoch: u64, now: Instant) -> Option<Instant> {
        self.promises
            .iter()
            .filter(|(from, (e, until))| **from != primary && *e < my_epoch && *until > now)
            .map(|(_, (_, until))| *until)
            .max()
    }

    /// Drops what no longer matters (daemons gone from the map, expired promises).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool, now: Instant) {
        self.acks.retain(|p, _| keep(*p));
        self.promises
            .retain(|p, (_, until)| keep(*p) && *until > now);
    }
}

/// A group's primary for the log: `osd.N`, or `none` (no primary at that epoch).
pub fn primary_name(primary: Option<u32>) -> String {
    primary.map_or_else(|| "none".to_string(), |p| format!("osd.{p}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_primary_is_named_none_not_a_placeholder_id() {
        assert_eq!(primary_name(Some(4)), "osd.4");
        assert_eq!(primary_name(None), "none");
    }

    #[test]
    fn a_primary_reads_only_with_fresh_answers_at_its_epoch() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        assert!(
            l.may_read([], 5, t0).is_ok(),
            "no other copy: nothing to ask"
        );
        assert!(l.may_read([2], 5, t0).is_err(), "no answer yet");
        l.answered(2, t0, 5);
        l.answered(3, t0, 6);
        assert!(l.may_read([2], 5, t0 + Duration::from_millis(100)).is_ok());
        let e = l.may_read([2, 3], 5, t0).unwrap_err();
        assert!(e.contains("osd.3 is at epoch 6"), "{e}");
        let e = l.may_read([2], 5, t0 + LEASE).unwrap_err();
        assert!(e.contains("ran out"), "{e}");
        // An older answer arriving late does not replace a newer one.
        l.answered(2, t0 + Duration::from_millis(500), 5);
        l.answered(2, t0, 5);
        assert!(l.may_read([2], 5, t0 + LEASE).is_ok());
    }

    #[test]
    fn a_copy_holds_back_a_new_primary_until_its_promise_to_the_old_one_ran_out() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        // osd.1 was primary at epoch 7 and pinged; the copy is at 7.
        l.pinged(1, 7, 7, t0);
        // The map moves to 8 with osd.2 as primary: its peering waits for the promise.
        assert_eq!(l.held_back_until(2, 8, t0), Some(t0 + LEASE));
        // Not for osd.1 itself (primary again at 8), nor after the promise ran out.
        assert_eq!(l.held_back_until(1, 8, t0), None);
        assert_eq!(l.held_back_until(2, 8, t0 + LEASE), None);
        // osd.1 pings at epoch 8: it no longer reads at 7, nothing holds osd.2 back.
        l.pinged(1, 8, 8, t0 + Duration::from_millis(10));
        assert_eq!(
            l.held_back_until(2, 8, t0 + Duration::from_millis(10)),
            None
        );
        // A pinger ahead of the copy drops its old promise too.
        let mut l = Leases::default();
        l.pinged(1, 7, 7, t0);
        l.pinged(1, 9, 8, t0);
        assert_eq!(l.held_back_until(2, 8, t0), None);
        // A pinger behind the copy gets no promise.
        let mut l = Leases::default();
        l.pinged(1, 6, 7, t0);
        assert_eq!(l.held_back_until(2, 7, t0), None);
    }

    #[test]
    fn the_primary_s_lease_ends_before_the_copy_s_promise() {
        // P sends at s, R answers at r >= s: P stops reading at s + LEASE, R holds back
        // until r + LEASE.
        let s = Instant::now();
        let r = s + Duration::from_millis(30);
        let (mut p, mut copy) = (Leases::default(), Leases::default());
        copy.pinged(1, 4, 4, r);
        p.answered(2, s, 4);
        let until = copy.held_back_until(3, 5, r).unwrap();
        assert!(p.may_read([2], 4, until).is_err());
    }

    #[test]
    fn retain_forgets_daemons_gone_and_expired_promises() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.answered(2, t0, 1);
        l.answered(3, t0, 1);
        l.pinged(4, 1, 1, t0);
        l.pinged(5, 1, 1, t0);
        l.retain(|p| p != 3 && p != 5, t0);
        assert!(l.may_read([2], 1, t0).is_ok());
        assert!(l.may_read([3], 1, t0).is_err());
        assert!(l.held_back_until(9, 2, t0).is_some());
        l.retain(|_| true, t0 + LEASE);
        assert!(l.held_back_until(9, 2, t0 + LEASE).is_none());
    }
}
