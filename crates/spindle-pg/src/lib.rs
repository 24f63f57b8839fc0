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
//! - [`sync`]: [`plan`], log catch-up vs backfill, divergent entries.
//! - [`rules`]: the authoritative copy, backfill listing diff, serve / write floors
//!   (min_size, k), interval changes, recovery order, EC "established" copies.
//! - [`ec`]: slot names and [`ec::decide_slot`], the roll-forward / roll-back rule of
//!   erasure-coded recovery (an acknowledged write is never rolled back).
//! - [`scrub`]: [`scrub::classify`], consistent / repair / damaged per object.
//!
//! What still lives in the daemon (`spindle-osd/src/recovery.rs`, `ec.rs`, `scrub.rs`):
//! running the rounds (retry with backoff, the epoch check before activating, gathering
//! the EC stray copies of each position), the background and on-demand recovery loop
//! (throttle, yielding to clients, the per-object in-progress set and its wake-ups,
//! marking copies complete at the end), the per-object transfers of EC recovery (reading
//! shards, decoding, pushing), scrub's gathering and repair, and stray removal.

pub mod ec;
pub mod gate;
pub mod peering;
pub mod rules;
pub mod scrub;
pub mod sync;

pub use gate::TxnGate;
pub use peering::{
    Action, Activation, Event, Interval, MissingObject, PgCore, RecoveryPlan, Round,
};
pub use sync::{plan, LogInfo, SyncPlan};
