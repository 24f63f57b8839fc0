//! `spindle-pg`: the sans-I/O placement-group core.
//!
//! Everything here decides; nothing here does I/O. No tokio, sockets, files, threads or
//! clock: replies, store completions and timers come in as events or arguments, and the
//! daemon (`spindle-osd`) executes the resulting actions over the network and its store.
//! So every rule can be tested by driving events, including a seeded randomized run.
//!
//! - [`peering`]: [`PgCore`], the peering state machine of one group on its primary
//!   (`on_event(Event) -> Vec<Action>`): query every copy's log, choose the authoritative
//!   copy, compute missing sets (log catch-up or backfill by listings), mark the copies
//!   that miss something incomplete, activate.
//! - [`gate`]: [`TxnGate`], the copy side of peering: a log query for a group is answered
//!   only after that group's already-queued store transactions are applied.
//! - [`members`]: [`MemberHistory`], a daemon's record of since when each copy has been an
//!   acting member without a break (from consecutive maps it installed): the membership
//!   [`rules::authoritative_with`] needs, claimed conservatively.
//! - [`sync`]: [`plan`], log catch-up vs backfill, divergent entries.
//! - [`rules`]: the authoritative copy, backfill listing diff, serve / write floors
//!   (min_size, k), interval changes, recovery order, EC "established" copies.
//! - [`ec`]: slot names and [`ec::decide_slot`], the roll-forward / roll-back rule of
//!   erasure-coded recovery (an acknowledged write is never rolled back).
//! - [`replication`]: [`ReplicationCore`], the primary's side of a client mutation on a
//!   replicated group: write floor, version assignment, local apply and replication,
//!   acknowledgement only when every acting copy has it, interval changes.
//! - [`recovery`]: [`RecoveryCore`], one group's recovery bookkeeping: the missing set,
//!   one recoverer per object, the background order, when copies may be marked complete.
//! - [`scrub`]: [`scrub::classify`], consistent / repair / damaged per object.
//!
//! What still lives in the daemon (`spindle-osd/src/recovery.rs`, `ec.rs`, `scrub.rs`,
//! `lib.rs`), as I/O shells around these decisions:
//! - running a peering round: `Osd::peer` creates a `PgCore` per attempt, executes its
//!   actions one at a time in order and feeds the replies back; the retry with backoff
//!   (`peer_until_done`, instead of [`Event::Retry`]), the epoch/phase check before
//!   activating, and the per-PG `PgState` (phase, interval, `last`) stay there;
//! - EC stray discovery at activation (`ec_peer_sources`: which up daemons hold a copy of
//!   each position: O(daemons) queries);
//! - recovery I/O around [`RecoveryCore`]: the background loop's global throttle, pacing
//!   and yielding to clients, waking on-demand waiters, the retries of failed objects and
//!   of completion marks, pulling/pushing objects, and EC shard reads, decoding and
//!   pushes around [`ec::decide_slot`];
//! - scrub's gathering of scrub maps, the recheck of unsettled objects and repairs;
//! - the replicated write path's I/O around [`ReplicationCore`] (`client.rs`: encoding
//!   and sending the body, the local store transaction, waiting for the answers, which
//!   are fed back under the group's lock in one go, and error codes from the failures);
//! - stray removal, other client operations, the map-driven interval check (it uses
//!   [`rules::interval_change`] and [`rules::serve_floor`]).

pub mod ec;
pub mod gate;
pub mod members;
pub mod mutants;
pub mod peering;
pub mod recovery;
pub mod replication;
pub mod rules;
pub mod scrub;
pub mod sync;

pub use gate::TxnGate;
pub use members::{CopyId, MemberHistory};
pub use peering::{
    Action, Activation, Event, Interval, MissingObject, PgCore, RecoveryPlan, Round,
};
pub use recovery::RecoveryCore;
pub use replication::{
    Begun, Decision, RepAction, RepError, RepEvent, RepInterval, ReplicationCore,
};
pub use sync::{plan, LogInfo, SyncPlan};
