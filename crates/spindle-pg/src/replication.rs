//! The primary's side of a client mutation on a replicated placement group
//! ([`ReplicationCore`]), without I/O.
//!
//! The rules (`spindle-osd`'s replicated write path is the shell of this core:
//! `client.rs` `start_write` / `finish_write`; the data simulator runs it too):
//! - a group takes writes only while it is active (peering finished in the current
//!   interval) and at least `min_size` copies are up ([`crate::rules::may_write_with`]);
//! - every mutation gets the next version: `(epoch, last.seq + 1)`, where `epoch` is the
//!   interval's, moved on by maps that leave the interval unchanged
//!   ([`ReplicationCore::new_epoch`]: the daemon stamps writes with its current map), `last`
//!   starts at the activation's `last_version` (so new writes sort after everything any
//!   copy holds) and grows with every assigned version;
//! - the primary applies it locally and sends it to every other acting copy, in version
//!   order;
//! - the client is answered when *every* acting copy (the primary included) has the write
//!   durable; a replica's failure or timeout, or a local failure, answers the client with
//!   an error and asks for a new peering round (copies may now differ); the group takes no
//!   new write until it is activated again;
//! - an interval change (new epoch with another acting set) drops every write in flight:
//!   its client is told to retry ([`RepError::IntervalChanged`]), never acknowledged.
//!
//! The caller executes [`RepAction`]s and feeds back [`RepEvent`]s. On the hot path the
//! same rules come without allocation: [`ReplicationCore::begin`] (the version; the caller
//! applies and sends the mutation it holds to [`ReplicationCore::replicas`]) and
//! [`ReplicationCore::step`] (one answer in, a [`Decision`] out).

use crate::rules::may_write_with;
use spindle_proto::msg::{Mutation, Ver};
use std::collections::VecDeque;

/// The caller's handle of one client request (echoed in the reply).
pub type OpId = u64;

/// The group's current interval, as far as writes are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepInterval {
    /// The map epoch writes are stamped with: the interval's first epoch, moved on by
    /// [`ReplicationCore::new_epoch`] when a later map leaves the interval unchanged.
    pub epoch: u64,
    /// This daemon: the primary, first of `acting`.
    pub me: u32,
    /// Acting copies, primary first (at most [`ACTING_MAX`]).
    pub acting: Vec<u32>,
    /// The pool's `min_size`.
    pub min_size: u32,
}

/// Most acting copies a group can have here (one bit each in a write's waiting set;
/// `spindle_types::limits::POOL_SIZE_MAX` is 16).
pub const ACTING_MAX: usize = 64;

/// Why a write was not acknowledged. Every one of them means "retry" to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepError {
    /// Not active (peering, or waiting for a new round after a failure).
    Inactive,
    /// Fewer than `min_size` copies are up.
    BelowMinSize { up: usize, min_size: u32 },
    /// Not a mutation of a replicated group (erasure-code shard writes).
    Invalid(String),
    /// A replica failed or timed out.
    Replica { copy: u32, reason: String },
    /// The local store failed.
    Local(String),
    /// The interval changed while the write was in flight.
    IntervalChanged,
}

/// What happened.
#[derive(Clone, Debug)]
pub enum RepEvent {
    /// The local store has `version` durable (or failed it).
    LocalCommitted {
        version: Ver,
        result: Result<(), String>,
    },
    /// A replica has `version` durable.
    ReplicaAcked { version: Ver, from: u32 },
    /// A replica refused `version`, or did not answer in time.
    ReplicaFailed {
        version: Ver,
        from: u32,
        reason: String,
    },
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepAction {
    /// Apply the mutation to the local store at `version` (in the order given).
    ApplyLocal {
        version: Ver,
        name: String,
        mutation: Mutation,
    },
    /// Send the mutation to `to` (stamped with the interval's epoch), in the order given.
    Replicate {
        to: u32,
        epoch: u64,
        version: Ver,
        name: String,
        mutation: Mutation,
    },
    /// Answer the client.
    Reply {
        op: OpId,
        result: Result<Ver, RepError>,
    },
    /// Copies may differ now: run a new peering round, then [`ReplicationCore::activate`].
    Repeer { reason: String },
}

/// A write [`ReplicationCore::begin`] accepted: the caller applies it locally at
/// `version` and sends it, stamped with `epoch`, to every copy of
/// [`ReplicationCore::replicas`], in that order, then feeds the answers back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begun {
    pub version: Ver,
    pub epoch: u64,
}

/// What one event decided ([`ReplicationCore::step`], the allocation-free form of
/// [`ReplicationCore::on_event`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Answer this client (its write is no longer in flight).
    pub reply: Option<(OpId, Result<Ver, RepError>)>,
    /// Copies may differ: peer again (the group takes no write until activated).
    pub repeer: bool,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    version: Ver,
    op: OpId,
    /// Positions in the acting set (bit i = `acting[i]`, the primary included) whose
    /// durable answer is still awaited.
    waiting: u64,
}

/// One replicated group's writes on its primary.
///
/// Memory: the writes in flight, in version order in a ring that keeps its capacity, so a
/// steady stream of writes allocates nothing here ([`ReplicationCore::begin`] and
/// [`ReplicationCore::step`]; [`ReplicationCore::submit`] and
/// [`ReplicationCore::on_event`] build action lists for callers that want them).
#[derive(Debug, Default)]
pub struct ReplicationCore {
    interval: Option<RepInterval>,
    active: bool,
    last: Ver,
    inflight: VecDeque<InFlight>,
    /// Test-only mutation switch (a deliberately broken rule, to check the checkers):
    /// acknowledge once the local copy is durable, without waiting for the replicas.
    ack_before_replicas: bool,
}

impl ReplicationCore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A BROKEN rule, for checking that a simulator's checkers catch it: the client is
    /// answered as soon as the primary's own copy is durable. Never use outside tests.
    pub fn set_broken_ack_before_replicas(&mut self, broken: bool) {
        self.ack_before_replicas = broken;
    }

    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The newest version assigned (or the activation's).
    pub fn last_version(&self) -> Ver {
        self.last
    }

    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// The interval writes are taken in (`None` before the first).
    pub fn interval(&self) -> Option<&RepInterval> {
        self.interval.as_ref()
    }

    /// The copies a write goes to besides the primary, in acting order.
    pub fn replicas(&self) -> &[u32] {
        self.interval.as_ref().map_or(&[], |iv| &iv.acting[1..])
    }

    /// Peering finished for `interval`; `last_version`: the activation's (at least every
    /// copy's). Writes of an earlier interval still in flight are dropped.
    pub fn activate(&mut self, interval: RepInterval, last_version: Ver) -> Vec<RepAction> {
        assert_eq!(
            interval.acting.first(),
            Some(&interval.me),
            "writes are taken by the primary, the first of the acting set"
        );
        assert!(interval.acting.len() <= ACTING_MAX, "acting set too large");
        let mut out = Vec::new();
        if self.interval.as_ref() != Some(&interval) {
            out = self.drop_inflight();
        }
        self.interval = Some(interval);
        self.active = true;
        self.last = self.last.max(last_version);
        out
    }

    /// A new interval (or this daemon is no longer primary: `None`): writes in flight are
    /// dropped unacknowledged; no write is taken until [`ReplicationCore::activate`].
    pub fn interval_changed(&mut self, interval: Option<RepInterval>) -> Vec<RepAction> {
        let changed = self.interval != interval;
        self.active = false;
        if !changed {
            return Vec::new();
        }
        self.interval = interval;
        self.drop_inflight()
    }

    /// A newer map left the interval as it was (same acting set): writes in flight go on,
    /// and later writes carry `epoch`.
    pub fn new_epoch(&mut self, epoch: u64) {
        if let Some(iv) = self.interval.as_mut() {
            iv.epoch = iv.epoch.max(epoch);
        }
    }

    fn drop_inflight(&mut self) -> Vec<RepAction> {
        self.inflight
            .drain(..)
            .map(|w| RepAction::Reply {
                op: w.op,
                result: Err(RepError::IntervalChanged),
            })
            .collect()
    }

    /// A client's mutation (the caller holds it): refused, or given the next version and
    /// put in flight. The caller then applies it locally and sends it to
    /// [`ReplicationCore::replicas`] (what [`ReplicationCore::submit`]'s actions say).
    pub fn begin(&mut self, op: OpId) -> Result<Begun, RepError> {
        let Some(iv) = self.interval.as_ref().filter(|_| self.active) else {
            return Err(RepError::Inactive);
        };
        if !may_write_with(iv.min_size, iv.acting.len()) {
            return Err(RepError::BelowMinSize {
                up: iv.acting.len(),
                min_size: iv.min_size,
            });
        }
        let version = Ver {
            epoch: iv.epoch,
            seq: self.last.seq + 1,
        };
        assert!(version > self.last, "versions strictly increase");
        self.last = version;
        let waiting = if iv.acting.len() == ACTING_MAX {
            u64::MAX
        } else {
            (1u64 << iv.acting.len()) - 1
        };
        self.inflight.push_back(InFlight {
            version,
            op,
            waiting,
        });
        Ok(Begun {
            version,
            epoch: iv.epoch,
        })
    }

    /// A client's mutation of `name`, as actions ([`ReplicationCore::begin`] plus the
    /// local apply and one replication per other acting copy, each with its own copy of
    /// the mutation).
    pub fn submit(&mut self, op: OpId, name: &str, mutation: Mutation) -> Vec<RepAction> {
        if matches!(
            mutation,
            Mutation::EcWrite { .. } | Mutation::EcPatch { .. }
        ) {
            let e = RepError::Invalid("erasure-coded write to a replicated pool".into());
            return vec![RepAction::Reply { op, result: Err(e) }];
        }
        let Begun { version, epoch } = match self.begin(op) {
            Ok(b) => b,
            Err(e) => return vec![RepAction::Reply { op, result: Err(e) }],
        };
        let mut out = vec![RepAction::ApplyLocal {
            version,
            name: name.to_string(),
            mutation: mutation.clone(),
        }];
        for &to in self.replicas() {
            out.push(RepAction::Replicate {
                to,
                epoch,
                version,
                name: name.to_string(),
                mutation: mutation.clone(),
            });
        }
        out
    }

    /// [`ReplicationCore::step`] as actions.
    pub fn on_event(&mut self, ev: RepEvent) -> Vec<RepAction> {
        let version = match &ev {
            RepEvent::LocalCommitted { version, .. }
            | RepEvent::ReplicaAcked { version, .. }
            | RepEvent::ReplicaFailed { version, .. } => *version,
        };
        let d = self.step(ev);
        let mut out = Vec::new();
        let failure = match &d.reply {
            Some((_, Err(e))) => Some(format!("{e:?}")),
            _ => None,
        };
        if let Some((op, result)) = d.reply {
            out.push(RepAction::Reply { op, result });
        }
        if d.repeer {
            out.push(RepAction::Repeer {
                reason: format!(
                    "write {}.{}: {}",
                    version.epoch,
                    version.seq,
                    failure.unwrap_or_default()
                ),
            });
        }
        out
    }

    /// One answer about a write in flight: whether its client can be answered now
    /// (acknowledged once every acting copy has it durable; refused at the first failure)
    /// and whether the group must peer again. Answers about writes no longer in flight
    /// (answered, or dropped at an interval change) decide nothing.
    pub fn step(&mut self, ev: RepEvent) -> Decision {
        let Some(me) = self.interval.as_ref().map(|iv| iv.me) else {
            return Decision::default();
        };
        match ev {
            RepEvent::LocalCommitted {
                version,
                result: Ok(()),
            } => {
                if self.ack_before_replicas {
                    if let Some(i) = self.position(version) {
                        let w = self.inflight.remove(i).expect("position is in range");
                        return Decision {
                            reply: Some((w.op, Ok(version))),
                            repeer: false,
                        };
                    }
                }
                self.answered(version, me)
            }
            RepEvent::ReplicaAcked { version, from } if from != me => self.answered(version, from),
            RepEvent::ReplicaAcked { .. } => Decision::default(),
            RepEvent::LocalCommitted {
                version,
                result: Err(reason),
            } => self.failed(version, RepError::Local(reason)),
            RepEvent::ReplicaFailed {
                version,
                from,
                reason,
            } => self.failed(version, RepError::Replica { copy: from, reason }),
        }
    }

    /// Where `version` is among the writes in flight (they are in version order).
    fn position(&self, version: Ver) -> Option<usize> {
        self.inflight
            .binary_search_by(|w| w.version.cmp(&version))
            .ok()
    }

    fn answered(&mut self, version: Ver, copy: u32) -> Decision {
        let Some(bit) = self
            .interval
            .as_ref()
            .and_then(|iv| iv.acting.iter().position(|&c| c == copy))
        else {
            return Decision::default();
        };
        let Some(i) = self.position(version) else {
            return Decision::default();
        };
        let w = &mut self.inflight[i];
        w.waiting &= !(1u64 << bit);
        if w.waiting != 0 {
            return Decision::default();
        }
        let op = w.op;
        self.inflight.remove(i);
        Decision {
            reply: Some((op, Ok(version))),
            repeer: false,
        }
    }

    fn failed(&mut self, version: Ver, e: RepError) -> Decision {
        let Some(i) = self.position(version) else {
            return Decision::default();
        };
        let w = self.inflight.remove(i).expect("position is in range");
        let was_active = self.active;
        self.active = false;
        Decision {
            reply: Some((w.op, Err(e))),
            repeer: was_active,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(epoch: u64, acting: &[u32]) -> RepInterval {
        RepInterval {
            epoch,
            me: acting[0],
            acting: acting.to_vec(),
            min_size: 2,
        }
    }

    fn v(epoch: u64, seq: u64) -> Ver {
        Ver { epoch, seq }
    }

    fn w(b: u8) -> Mutation {
        Mutation::WriteFull(vec![b; 4])
    }

    fn replies(out: &[RepAction]) -> Vec<(OpId, Result<Ver, RepError>)> {
        out.iter()
            .filter_map(|a| match a {
                RepAction::Reply { op, result } => Some((*op, result.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_write_is_acknowledged_only_when_every_copy_has_it() {
        let mut c = ReplicationCore::new();
        assert!(c.activate(iv(5, &[1, 2, 3]), v(4, 9)).is_empty());
        let out = c.submit(7, "a", w(1));
        assert_eq!(
            out[0],
            RepAction::ApplyLocal {
                version: v(5, 10),
                name: "a".into(),
                mutation: w(1)
            }
        );
        let sent: Vec<u32> = out
            .iter()
            .filter_map(|a| match a {
                RepAction::Replicate { to, epoch: 5, .. } => Some(*to),
                _ => None,
            })
            .collect();
        assert_eq!(sent, vec![2, 3]);
        let ver = v(5, 10);
        assert!(c
            .on_event(RepEvent::ReplicaAcked {
                version: ver,
                from: 3
            })
            .is_empty());
        assert!(c
            .on_event(RepEvent::LocalCommitted {
                version: ver,
                result: Ok(())
            })
            .is_empty());
        // A repeated answer changes nothing.
        assert!(c
            .on_event(RepEvent::ReplicaAcked {
                version: ver,
                from: 3
            })
            .is_empty());
        let out = c.on_event(RepEvent::ReplicaAcked {
            version: ver,
            from: 2,
        });
        assert_eq!(replies(&out), vec![(7, Ok(ver))]);
        assert_eq!(c.inflight(), 0);
    }

    #[test]
    fn versions_increase_from_the_activation_and_carry_the_epoch() {
        let mut c = ReplicationCore::new();
        c.activate(iv(8, &[2, 0]), v(6, 41));
        let versions: Vec<Ver> = (0..3)
            .map(|i| match &c.submit(i, "x", w(0))[0] {
                RepAction::ApplyLocal { version, .. } => *version,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(versions, vec![v(8, 42), v(8, 43), v(8, 44)]);
        assert_eq!(c.last_version(), v(8, 44));
    }

    #[test]
    fn no_write_below_min_size_or_before_activation() {
        let mut c = ReplicationCore::new();
        assert_eq!(
            replies(&c.submit(1, "a", w(1))),
            vec![(1, Err(RepError::Inactive))]
        );
        c.activate(iv(3, &[0]), Ver::default());
        assert_eq!(
            replies(&c.submit(2, "a", w(1))),
            vec![(2, Err(RepError::BelowMinSize { up: 1, min_size: 2 }))]
        );
        let ec = Mutation::EcWrite {
            object_size: 1,
            shard_offset: 0,
            shard_len: 0,
            full: true,
            expect: None,
            data: Vec::new(),
        };
        c.activate(iv(3, &[0, 1]), Ver::default());
        assert!(matches!(
            replies(&c.submit(3, "a", ec))[0].1,
            Err(RepError::Invalid(_))
        ));
    }

    #[test]
    fn a_replica_failure_answers_with_an_error_and_stops_writes_until_peered() {
        let mut c = ReplicationCore::new();
        c.activate(iv(2, &[0, 1, 2]), v(1, 1));
        c.submit(1, "a", w(1));
        c.submit(2, "b", w(2));
        let out = c.on_event(RepEvent::ReplicaFailed {
            version: v(2, 2),
            from: 1,
            reason: "timeout".into(),
        });
        assert!(matches!(
            replies(&out)[..],
            [(1, Err(RepError::Replica { copy: 1, .. }))]
        ));
        assert!(out.iter().any(|a| matches!(a, RepAction::Repeer { .. })));
        assert_eq!(
            replies(&c.submit(3, "c", w(3))),
            vec![(3, Err(RepError::Inactive))]
        );
        // The other write may still complete: every copy has it.
        for from in [0, 1, 2] {
            let out = c.on_event(RepEvent::ReplicaAcked {
                version: v(2, 3),
                from,
            });
            if from == 0 {
                assert!(out.is_empty(), "the primary's own answer is LocalCommitted");
            }
        }
        let out = c.on_event(RepEvent::LocalCommitted {
            version: v(2, 3),
            result: Ok(()),
        });
        assert_eq!(replies(&out), vec![(2, Ok(v(2, 3)))]);
        // Activated again after peering: writes go on after every version so far.
        c.activate(iv(2, &[0, 1, 2]), v(2, 3));
        assert!(matches!(
            &c.submit(4, "d", w(4))[0],
            RepAction::ApplyLocal { version, .. } if *version == v(2, 4)
        ));
    }

    #[test]
    fn an_interval_change_drops_writes_in_flight_unacknowledged() {
        let mut c = ReplicationCore::new();
        c.activate(iv(2, &[0, 1, 2]), v(1, 1));
        c.submit(1, "a", w(1));
        let out = c.interval_changed(Some(iv(3, &[0, 2])));
        assert_eq!(replies(&out), vec![(1, Err(RepError::IntervalChanged))]);
        // Late answers of the old interval acknowledge nothing.
        for a in [
            RepEvent::LocalCommitted {
                version: v(2, 2),
                result: Ok(()),
            },
            RepEvent::ReplicaAcked {
                version: v(2, 2),
                from: 1,
            },
            RepEvent::ReplicaAcked {
                version: v(2, 2),
                from: 2,
            },
        ] {
            assert!(replies(&c.on_event(a)).is_empty());
        }
        assert_eq!(
            replies(&c.submit(2, "a", w(1))),
            vec![(2, Err(RepError::Inactive))]
        );
        c.activate(iv(3, &[0, 2]), v(2, 2));
        assert!(matches!(
            &c.submit(3, "a", w(1))[0],
            RepAction::ApplyLocal { version, .. } if *version == v(3, 3)
        ));
    }

    #[test]
    fn a_newer_map_in_the_same_interval_keeps_writes_and_stamps_later_ones() {
        let mut c = ReplicationCore::new();
        c.activate(iv(4, &[0, 1, 2]), v(3, 7));
        let first = c.begin(1).unwrap();
        assert_eq!(
            first,
            Begun {
                version: v(4, 8),
                epoch: 4
            }
        );
        assert_eq!(c.replicas(), &[1, 2]);
        c.new_epoch(6);
        let second = c.begin(2).unwrap();
        assert_eq!(
            second,
            Begun {
                version: v(6, 9),
                epoch: 6
            }
        );
        // Answers in any order; each write is acknowledged once all three copies have it.
        for (ver, from) in [(v(6, 9), 2), (v(4, 8), 1), (v(6, 9), 1), (v(4, 8), 2)] {
            assert_eq!(
                c.step(RepEvent::ReplicaAcked { version: ver, from }),
                Decision::default()
            );
        }
        let d = c.step(RepEvent::LocalCommitted {
            version: v(6, 9),
            result: Ok(()),
        });
        assert_eq!(d.reply, Some((2, Ok(v(6, 9)))));
        let d = c.step(RepEvent::LocalCommitted {
            version: v(4, 8),
            result: Ok(()),
        });
        assert_eq!(d.reply, Some((1, Ok(v(4, 8)))));
        assert_eq!(c.inflight(), 0);
        // An older epoch never moves the stamp back.
        c.new_epoch(5);
        assert_eq!(c.begin(3).unwrap().epoch, 6);
    }

    #[test]
    fn a_copy_outside_the_acting_set_acknowledges_nothing() {
        let mut c = ReplicationCore::new();
        c.activate(iv(2, &[0, 1]), Ver::default());
        let b = c.begin(9).unwrap();
        let ev = |from| RepEvent::ReplicaAcked {
            version: b.version,
            from,
        };
        assert_eq!(c.step(ev(7)), Decision::default());
        let ok = RepEvent::LocalCommitted {
            version: b.version,
            result: Ok(()),
        };
        assert_eq!(c.step(ok), Decision::default());
        assert_eq!(c.step(ev(1)).reply, Some((9, Ok(b.version))));
    }

    #[test]
    fn the_broken_switch_acknowledges_early() {
        let mut c = ReplicationCore::new();
        c.set_broken_ack_before_replicas(true);
        c.activate(iv(2, &[0, 1, 2]), v(1, 1));
        c.submit(1, "a", w(1));
        let out = c.on_event(RepEvent::LocalCommitted {
            version: v(2, 2),
            result: Ok(()),
        });
        assert_eq!(replies(&out), vec![(1, Ok(v(2, 2)))]);
    }
}
