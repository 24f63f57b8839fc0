//! The peering state machine of one placement group on its primary ([`PgCore`]).
//!
//! Sans-I/O: [`PgCore::on_event`] takes an [`Event`] (a new interval, a copy's log, a
//! listing, a failed query, a durable mark, a retry timer) and returns the [`Action`]s the
//! caller must execute (query a copy, list a copy, mark a copy incomplete, activate,
//! wait). It owns no socket, file, thread or clock, so it is driven by unit tests and a
//! seeded randomized test exactly as the daemon drives it.
//!
//! One round of peering:
//! 1. `QueryLog` every copy of the acting set, the primary first. A copy answers only
//!    after its already-queued store transactions for the group are applied
//!    ([`crate::gate::TxnGate`]), so a write the old primary may still acknowledge is in
//!    the logs compared here.
//! 2. When every copy answered: the complete copy with the newest `last_version` is
//!    authoritative ([`crate::rules::authoritative`]); none -> `WaitForCompleteCopy`.
//! 3. Per other copy, [`crate::sync::plan`]: in sync, log-based catch-up, or backfill
//!    (then `ListObjects` the authoritative copy and that copy, and diff the listings).
//! 4. `MarkIncomplete` every copy that misses something; when all marks are durable,
//!    `Activate` with the recovery plan (source = the authoritative copy).
//!
//! Any failed query, listing or mark fails the round (`RoundFailed`); the caller retries
//! later with [`Event::Retry`], which starts a new round. Replies carry their round:
//! replies of an older round, of a copy outside the acting set, or repeated are ignored.
//!
//! Invariants (asserted):
//! - `Activate` only with every acting copy's log, an authoritative copy that is complete
//!   and the newest complete one, and every copy that misses something durably marked
//!   incomplete;
//! - recovery always pulls from the authoritative copy, and `last_version` of the
//!   activation is at least every copy's `last_version` (new writes sort after anything
//!   a copy holds, divergent entries included);
//! - at most one activation per interval.

use crate::rules::{authoritative_with, listing_diff, Listing};
use crate::sync::{plan, LogInfo, SyncPlan};
use spindle_proto::msg::Ver;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A peering round of one interval (replies of other rounds are ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Round(pub u64);

/// An interval of the group: its up (acting) set at some epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Epoch at which the interval was computed.
    pub epoch: u64,
    /// This daemon (the primary: the first of `acting`).
    pub me: u32,
    /// Copies that are up, primary first.
    pub acting: Vec<u32>,
    /// Fewest copies up for the group to serve ([`crate::rules::serve_floor`]).
    pub serve_floor: u32,
}

/// What happened (input of [`PgCore::on_event`]).
#[derive(Clone, Debug)]
pub enum Event {
    /// The map gave the group a new interval (or peering must start over).
    IntervalChanged(Interval),
    /// A copy's log (`PgInfo`), answered after its queued transactions were applied.
    LogInfo {
        round: Round,
        from: u32,
        info: LogInfo,
    },
    /// A log query failed or timed out.
    QueryFailed {
        round: Round,
        from: u32,
        reason: String,
    },
    /// A copy's full listing (backfill).
    Listing {
        round: Round,
        from: u32,
        listing: Listing,
    },
    ListFailed {
        round: Round,
        from: u32,
        reason: String,
    },
    /// A copy's `incomplete` mark is durable.
    Marked { round: Round, copy: u32 },
    MarkFailed {
        round: Round,
        copy: u32,
        reason: String,
    },
    /// The caller's retry timer: start a new round of the current interval.
    Retry,
}

/// What the caller must do (output of [`PgCore::on_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask `copy` for its log (`PgQuery`; for the primary itself: its local log, after its
    /// own queued transactions for the group are applied).
    QueryLog { round: Round, copy: u32 },
    /// Fetch `copy`'s full listing (names, versions, sizes).
    ListObjects { round: Round, copy: u32 },
    /// Mark `copy` incomplete, durably, before the group serves.
    MarkIncomplete { round: Round, copy: u32 },
    /// Serve client I/O; recover in the background if `activation.recovery` is set.
    Activate(Activation),
    /// Too few copies up: do not serve.
    Inactive { up: usize, floor: u32 },
    /// No complete copy is up: do not serve; retry later (a complete copy may return).
    WaitForCompleteCopy { round: Round },
    /// The round failed (a copy did not answer, ...): retry later with [`Event::Retry`].
    RoundFailed { round: Round, reason: String },
}

/// The result of a successful peering round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activation {
    pub round: Round,
    /// The authoritative copy.
    pub authoritative: u32,
    /// Newest version any copy holds: the next write's version must sort after it.
    pub last_version: Ver,
    /// `None`: every copy is in sync.
    pub recovery: Option<RecoveryPlan>,
}

/// Objects some copies miss after peering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Pull source of objects the primary misses: always the authoritative copy.
    pub source: u32,
    /// At least one copy is compared by listing (backfill) rather than caught up by log.
    pub backfill: bool,
    /// Object name -> copies missing it and its size when a listing said so (else the
    /// caller looks it up where it can, or counts 0).
    pub missing: BTreeMap<String, MissingObject>,
    /// Copies marked incomplete (to be marked complete when everything is recovered).
    pub incomplete: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingObject {
    pub copies: Vec<u32>,
    pub size_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// No interval yet.
    Idle,
    Inactive,
    /// Waiting for every copy's log.
    GatheringLogs,
    /// Waiting for the listings of the authoritative copy and the backfilled copies.
    Listing,
    /// Waiting for the `incomplete` marks.
    Marking,
    /// The round ended without activation (failed, or no complete copy).
    Stopped,
    Active,
}

/// Peering of one placement group (see the module docs).
#[derive(Debug)]
pub struct PgCore {
    interval: Option<Interval>,
    round: Round,
    phase: Phase,
    /// Logs received this round.
    infos: HashMap<u32, LogInfo>,
    /// Listings wanted (None = not received yet) this round.
    listings: HashMap<u32, Option<Listing>>,
    /// Index into the acting order of the authoritative copy (once chosen).
    auth: Option<u32>,
    /// Marks not yet durable this round.
    marks_pending: BTreeSet<u32>,
    /// The plan awaiting the marks.
    pending: Option<Activation>,
    /// Activations issued in the current interval (at most one).
    activations: u32,
    /// When each copy was an acting member (optional: see
    /// [`crate::rules::authoritative_with`]).
    members: Option<crate::rules::MemberEpochs>,
}

impl Default for PgCore {
    fn default() -> Self {
        Self::new()
    }
}

impl PgCore {
    pub fn new() -> Self {
        PgCore {
            interval: None,
            round: Round(0),
            phase: Phase::Idle,
            infos: HashMap::new(),
            listings: HashMap::new(),
            auth: None,
            marks_pending: BTreeSet::new(),
            pending: None,
            activations: 0,
            members: None,
        }
    }

    /// The current round.
    /// Tells the core at which epochs each copy was an acting member (from the map
    /// history), so that a complete copy can be the authority although an incomplete copy
    /// holds newer writes that were provably never acknowledged. Without it such a group
    /// waits for a complete copy at least as new.
    pub fn set_members(&mut self, members: crate::rules::MemberEpochs) {
        self.members = Some(members);
    }

    pub fn round(&self) -> Round {
        self.round
    }

    /// Whether the group is active (serving) in the current interval.
    pub fn is_active(&self) -> bool {
        self.phase == Phase::Active
    }

    /// The logs gathered this round in acting order (primary first).
    pub fn infos(&self) -> Vec<(u32, LogInfo)> {
        let Some(iv) = &self.interval else {
            return Vec::new();
        };
        iv.acting
            .iter()
            .filter_map(|c| self.infos.get(c).map(|i| (*c, i.clone())))
            .collect()
    }

    /// Feeds one event; returns the actions to execute, in order.
    pub fn on_event(&mut self, ev: Event) -> Vec<Action> {
        match ev {
            Event::IntervalChanged(iv) => self.on_interval(iv),
            Event::Retry => match self.phase {
                Phase::Stopped => self.start_round(),
                _ => Vec::new(),
            },
            Event::LogInfo { round, from, info } => {
                if !self.accepts(round, Phase::GatheringLogs, from)
                    || self.infos.contains_key(&from)
                {
                    return Vec::new();
                }
                self.infos.insert(from, info);
                self.after_logs()
            }
            Event::Listing {
                round,
                from,
                listing,
            } => {
                if !self.accepts(round, Phase::Listing, from)
                    || !matches!(self.listings.get(&from), Some(None))
                {
                    return Vec::new();
                }
                self.listings.insert(from, Some(listing));
                self.after_listings()
            }
            Event::Marked { round, copy } => {
                if !self.accepts(round, Phase::Marking, copy) || !self.marks_pending.remove(&copy) {
                    return Vec::new();
                }
                self.after_marks()
            }
            Event::QueryFailed {
                round,
                from,
                reason,
            } => self.fail(round, Phase::GatheringLogs, from, reason),
            Event::ListFailed {
                round,
                from,
                reason,
            } => self.fail(round, Phase::Listing, from, reason),
            Event::MarkFailed {
                round,
                copy,
                reason,
            } => self.fail(round, Phase::Marking, copy, reason),
        }
    }

    fn on_interval(&mut self, iv: Interval) -> Vec<Action> {
        assert_eq!(
            iv.acting.first(),
            Some(&iv.me),
            "peering runs on the primary, the first of the acting set"
        );
        let distinct: BTreeSet<u32> = iv.acting.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            iv.acting.len(),
            "acting set without duplicates"
        );
        let (up, floor) = (iv.acting.len(), iv.serve_floor);
        self.interval = Some(iv);
        self.activations = 0;
        if (up as u64) < u64::from(floor) {
            self.reset_round();
            self.phase = Phase::Inactive;
            return vec![Action::Inactive { up, floor }];
        }
        self.start_round()
    }

    fn reset_round(&mut self) {
        self.round = Round(self.round.0 + 1);
        self.infos.clear();
        self.listings.clear();
        self.auth = None;
        self.marks_pending.clear();
        self.pending = None;
    }

    fn start_round(&mut self) -> Vec<Action> {
        self.reset_round();
        self.phase = Phase::GatheringLogs;
        let round = self.round;
        let acting = self
            .interval
            .as_ref()
            .map(|iv| iv.acting.clone())
            .unwrap_or_default();
        assert!(!acting.is_empty(), "a round needs an interval");
        acting
            .into_iter()
            .map(|copy| Action::QueryLog { round, copy })
            .collect()
    }

    /// Whether a reply of `round` from `from` belongs to the current round in `phase`.
    fn accepts(&self, round: Round, phase: Phase, from: u32) -> bool {
        round == self.round
            && self.phase == phase
            && self
                .interval
                .as_ref()
                .is_some_and(|iv| iv.acting.contains(&from))
    }

    fn fail(&mut self, round: Round, phase: Phase, from: u32, reason: String) -> Vec<Action> {
        if !self.accepts(round, phase, from) {
            return Vec::new();
        }
        self.phase = Phase::Stopped;
        vec![Action::RoundFailed {
            round,
            reason: format!("osd.{from}: {reason}"),
        }]
    }

    fn after_logs(&mut self) -> Vec<Action> {
        let infos = self.infos();
        let Some(iv) = &self.interval else {
            return Vec::new();
        };
        if infos.len() < iv.acting.len() {
            return Vec::new();
        }
        let round = self.round;
        let Some(a) = authoritative_with(&infos, self.members.as_ref()) else {
            self.phase = Phase::Stopped;
            return vec![Action::WaitForCompleteCopy { round }];
        };
        let auth_id = infos[a].0;
        self.auth = Some(auth_id);
        let mut wanted: Vec<u32> = Vec::new();
        for (id, info) in infos.iter().filter(|(id, _)| *id != auth_id) {
            if plan(&infos[a].1, info) == SyncPlan::Backfill {
                if wanted.is_empty() {
                    wanted.push(auth_id);
                }
                wanted.push(*id);
            }
        }
        if wanted.is_empty() {
            return self.plan_and_mark();
        }
        self.phase = Phase::Listing;
        for &c in &wanted {
            self.listings.insert(c, None);
        }
        wanted
            .into_iter()
            .map(|copy| Action::ListObjects { round, copy })
            .collect()
    }

    fn after_listings(&mut self) -> Vec<Action> {
        if self.listings.values().any(Option::is_none) {
            return Vec::new();
        }
        self.plan_and_mark()
    }

    /// Every log (and listing) is in: compute the missing sets, then mark.
    fn plan_and_mark(&mut self) -> Vec<Action> {
        let infos = self.infos();
        let Some(auth_id) = self.auth else {
            return Vec::new();
        };
        let auth = infos
            .iter()
            .find(|(id, _)| *id == auth_id)
            .map(|(_, i)| i.clone())
            .unwrap_or_default();
        let auth_listing = self.listings.get(&auth_id).cloned().flatten();
        let mut missing: BTreeMap<String, MissingObject> = BTreeMap::new();
        let mut backfill = false;
        let mut last_version = auth.last_version;
        for (id, info) in infos.iter().filter(|(id, _)| *id != auth_id) {
            last_version = last_version.max(info.last_version);
            let names: BTreeSet<String> = match plan(&auth, info) {
                SyncPlan::InSync => continue,
                SyncPlan::Objects(names) => names,
                SyncPlan::Backfill => {
                    backfill = true;
                    match (&auth_listing, self.listings.get(id)) {
                        (Some(a), Some(Some(s))) => listing_diff(a, s),
                        _ => unreachable!("every backfilled copy was listed"),
                    }
                }
            };
            for name in names {
                let size_bytes = auth_listing
                    .as_ref()
                    .and_then(|a| a.get(&name).map(|o| o.size_bytes));
                missing
                    .entry(name)
                    .or_insert(MissingObject {
                        copies: Vec::new(),
                        size_bytes,
                    })
                    .copies
                    .push(*id);
            }
        }
        // Copies that miss something, and copies still marked incomplete by an earlier
        // interval whose recovery finished before its completion marks (their listing
        // matches now): those must be marked complete at the end of this recovery, or
        // they would stay incomplete (never authoritative) for ever (found by the data
        // simulator).
        let incomplete: Vec<u32> = missing
            .values()
            .flat_map(|m| m.copies.iter().copied())
            .chain(
                infos
                    .iter()
                    .filter(|(id, info)| *id != auth_id && info.incomplete)
                    .map(|(id, _)| *id),
            )
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        let round = self.round;
        self.pending = Some(Activation {
            round,
            authoritative: auth_id,
            last_version,
            recovery: (!incomplete.is_empty()).then(|| RecoveryPlan {
                source: auth_id,
                backfill,
                missing,
                incomplete: incomplete.clone(),
            }),
        });
        self.marks_pending = incomplete.iter().copied().collect();
        self.phase = Phase::Marking;
        if incomplete.is_empty() {
            return self.after_marks();
        }
        incomplete
            .into_iter()
            .map(|copy| Action::MarkIncomplete { round, copy })
            .collect()
    }

    fn after_marks(&mut self) -> Vec<Action> {
        if !self.marks_pending.is_empty() {
            return Vec::new();
        }
        let Some(act) = self.pending.take() else {
            return Vec::new();
        };
        self.check_activation(&act);
        self.phase = Phase::Active;
        self.activations += 1;
        assert_eq!(self.activations, 1, "at most one activation per interval");
        vec![Action::Activate(act)]
    }

    /// The activation invariants (see the module docs).
    fn check_activation(&self, act: &Activation) {
        let infos = self.infos();
        let acting = self.interval.as_ref().map_or(0, |iv| iv.acting.len());
        assert_eq!(
            infos.len(),
            acting,
            "activation with every acting copy's log"
        );
        let auth = infos
            .iter()
            .find(|(id, _)| *id == act.authoritative)
            .map(|(_, i)| i);
        let Some(auth) = auth else {
            panic!("the authoritative copy is an acting copy");
        };
        assert!(
            !auth.incomplete,
            "an incomplete copy is never authoritative"
        );
        for (_, i) in &infos {
            assert!(
                i.incomplete || i.last_version <= auth.last_version,
                "the authoritative copy is the newest complete one"
            );
            assert!(
                i.last_version <= act.last_version,
                "new versions sort after every copy"
            );
        }
        if let Some(r) = &act.recovery {
            assert_eq!(
                r.source, act.authoritative,
                "recovery pulls from the authority"
            );
            assert!(
                !r.incomplete.contains(&act.authoritative),
                "the authoritative copy misses nothing"
            );
            assert!(
                self.marks_pending.is_empty(),
                "marks are durable before serving"
            );
        }
    }
}
