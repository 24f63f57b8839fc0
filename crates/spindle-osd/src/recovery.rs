//! Peering and recovery of the placement groups this daemon is primary of.
//!
//! Peering (per interval, i.e. per change of the up set) gathers every copy's log,
//! picks the newest *complete* copy as authoritative, and computes for every other copy
//! the objects it misses: from the logs when they overlap (log-based catch-up), from full
//! listings otherwise (backfill). Copies that miss anything are first marked `incomplete`
//! (persisted in their store), then the group becomes **active** at once: client I/O does
//! not wait for recovery. Recovery then runs in the background, throttled, one object at a
//! time per group; a client operation on an object that some copy still misses recovers
//! that object first (on demand). When nothing is missing, every recovered copy is marked
//! complete again (which resets its log: it may have gaps where objects arrived by state).
//!
//! The decisions are `spindle-pg`'s: `PgCore` runs the peering round (this file executes
//! its actions and feeds the replies back), `RecoveryCore` keeps the missing sets. What
//! stays here is I/O: queries, listings, marks, pulls and pushes, pacing and retries.
//!
//! Invariants:
//! - an incomplete copy is never authoritative, and is always compared by listing;
//! - an object is removed from the missing set only after every copy that missed it
//!   acknowledged the authoritative state durably; writes to an object wait while it is
//!   missing anywhere, so a replica never applies a partial write to a stale base;
//! - a copy is marked complete only after all its missing objects were recovered, on the
//!   same connection (after the pushes), so the mark never overtakes data;
//! - a copy outside the up set (a stray) is removed only after the group's primary says
//!   the group is clean at the same epoch.

use crate::counters::OsdCounters;
use crate::{Osd, PgState, Phase};
use spindle_proto::msg::typed;
use spindle_store::PgId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use spindle_pg::peering::{Action as PgAction, Activation, Event as PgEvent, Interval};
use spindle_pg::recovery::{Begin, Next, RecoveryEvent};
use spindle_pg::rules::{ListedObject, Listing};
use spindle_pg::{CopyId, LogInfo, PgCore, RecoveryCore};

/// Objects some copies of a placement group still miss (on its primary): the
/// bookkeeping is `spindle_pg::RecoveryCore`; here only what the I/O needs.
pub(crate) struct Recovery {
    /// Missing sets, objects in progress, order, completion (sans-I/O).
    pub core: RecoveryCore,
    /// Woken whenever an object's recovery ends (it leaves the in-progress set).
    pub notify: Arc<Notify>,
    /// Erasure-coded groups: other daemons holding a copy of some shard position (copies
    /// left from before a position moved), usable as decode sources: (position, daemon).
    pub ec_strays: Vec<(usize, u32)>,
    /// Erasure-coded groups: members whose shard copy existed before this interval (an
    /// empty, new copy cannot tell whether a version was ever written).
    pub ec_established: Vec<u32>,
}

/// Global pacing of background recovery: at most `ops` objects at once and
/// `bytes_per_sec` (0 = unlimited).
pub(crate) struct Throttle {
    pub permits: tokio::sync::Semaphore,
    pub bytes_per_sec: u64,
    next_free: std::sync::Mutex<Instant>,
}

impl Throttle {
    pub fn new(ops: usize, bytes_per_sec: u64) -> Throttle {
        Throttle {
            permits: tokio::sync::Semaphore::new(ops.max(1)),
            bytes_per_sec,
            next_free: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Waits until `bytes` more may be recovered under the rate limit.
    pub async fn pace(&self, bytes: u64) {
        if self.bytes_per_sec == 0 {
            return;
        }
        let start = {
            let mut next = self.next_free.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64);
            start
        };
        tokio::time::sleep_until(start.into()).await;
    }
}

/// While clients are active, background recovery pauses this many times as long as each
/// object took (so it keeps about a fifth of its unloaded rate and the clients the rest).
const RECOVERY_YIELD_FACTOR: u32 = 4;
const RECOVERY_YIELD_MAX_MS: u64 = 200;

enum Step {
    Done,
    Wait(Arc<Notify>),
    Recover { osds: Vec<u32>, source: u32 },
}

impl Osd {
    /// The group's state if it is still active in the interval that began at `since`.
    fn pg_entry_valid(
        pgs: &mut HashMap<(u32, u32), PgState>,
        pgid: PgId,
        since: u64,
    ) -> Option<&mut PgState> {
        pgs.get_mut(&(pgid.pool, pgid.pg))
            .filter(|st| st.since == since && st.phase == Phase::Active)
    }

    /// Peers a placement group at `epoch`: on success it is active (maybe recovering).
    ///
    /// One round of `spindle_pg::PgCore`: this shell executes its actions (log queries,
    /// listings, marks) over the network and the local store, one at a time in the order
    /// the core gives them, and feeds the results back as events. A failed round returns
    /// `Err` and `peer_until_done` retries it after a backoff.
    pub(crate) async fn peer(&self, pool: u32, pg: u32, epoch: u64) -> Result<(), String> {
        let pgid = PgId { pool, pg };
        let acting = {
            let pgs = crate::lock(&self.inner.pgs);
            match pgs.get(&(pool, pg)) {
                Some(st)
                    if st.epoch == epoch
                        && matches!(st.phase, Phase::Peering | Phase::Incomplete) =>
                {
                    st.acting.clone()
                }
                _ => return Ok(()),
            }
        };
        let me = self.inner.id;
        if acting.first() != Some(&me) {
            return Err("not the primary of this placement group".into());
        }
        let mut core = PgCore::new();
        // When each copy was an acting member (conservative: only unbroken runs of epochs
        // this daemon installed), so that a complete copy that was a member throughout can
        // be the authority over an incomplete copy holding never-acknowledged writes.
        let members = {
            let shard_of = self.map_state().and_then(|ms| {
                ms.placement
                    .pg(pool, pg)
                    .filter(|m| !m.shards.is_empty())
                    .map(|m| m.shards.clone())
            });
            let copies = acting.iter().map(|&osd| CopyId {
                osd,
                shard: shard_of.as_ref().map(|shards| {
                    shards
                        .iter()
                        .position(|&d| d == Some(osd))
                        .map_or(u8::MAX, |p| p as u8)
                }),
            });
            crate::lock(&self.inner.members).member_epochs(&(pool, pg), copies)
        };
        core.set_members(members);
        // The floor was checked when the phase was set (on_new_epoch): not Inactive.
        let mut actions: VecDeque<PgAction> = core
            .on_event(PgEvent::IntervalChanged(Interval {
                epoch,
                me,
                acting,
                serve_floor: 1,
            }))
            .into();
        while let Some(action) = actions.pop_front() {
            let event = match action {
                PgAction::QueryLog { round, copy } => match self.query_log(pgid, epoch, copy).await
                {
                    Ok(info) => PgEvent::LogInfo {
                        round,
                        from: copy,
                        info,
                    },
                    Err(reason) => PgEvent::QueryFailed {
                        round,
                        from: copy,
                        reason,
                    },
                },
                PgAction::ListObjects { round, copy } => {
                    match self.listing_sizes(copy, epoch, pgid).await {
                        Ok(listing) => PgEvent::Listing {
                            round,
                            from: copy,
                            listing,
                        },
                        Err(reason) => PgEvent::ListFailed {
                            round,
                            from: copy,
                            reason,
                        },
                    }
                }
                PgAction::MarkIncomplete { round, copy } => {
                    match self.mark_copy(copy, epoch, pgid, true).await {
                        Ok(()) => PgEvent::Marked { round, copy },
                        Err(reason) => PgEvent::MarkFailed {
                            round,
                            copy,
                            reason,
                        },
                    }
                }
                PgAction::RoundFailed { reason, .. } => return Err(reason),
                PgAction::Inactive { up, floor } => {
                    return Err(format!("{up} copies up, {floor} needed"));
                }
                PgAction::WaitForCompleteCopy { .. } => {
                    let mut pgs = crate::lock(&self.inner.pgs);
                    if let Some(st) = pgs.get_mut(&(pool, pg)) {
                        if st.epoch == epoch {
                            st.phase = Phase::Incomplete;
                        }
                    }
                    return Err("no complete copy is up (waiting for one to return)".into());
                }
                PgAction::Activate(activation) => {
                    let infos = core.infos();
                    return self.activate(pgid, epoch, activation, &infos).await;
                }
            };
            actions.extend(core.on_event(event));
        }
        Err("peering stopped without a decision".into())
    }

    /// A copy's log, answered after its queued store transactions for the group were
    /// applied (this daemon's own copy: the same wait, locally).
    async fn query_log(&self, pgid: PgId, epoch: u64, copy: u32) -> Result<LogInfo, String> {
        let stored = self.copy_pgid(pgid, copy);
        if copy == self.inner.id {
            self.inflight_drain(stored).await?;
            return Ok(self.local_log_info(stored));
        }
        let query = typed::PgQuery {
            pool: stored.pool,
            pg: stored.pg,
        };
        let info = self.request_peer(copy, epoch, query).await?;
        Ok(LogInfo {
            last_version: info.last_version,
            log_tail: info.log_tail,
            log: info.log,
            incomplete: info.incomplete,
        })
    }

    /// Executes the core's activation: the group serves, recovery starts in the background
    /// (only if nothing changed meanwhile).
    async fn activate(
        &self,
        pgid: PgId,
        epoch: u64,
        activation: Activation,
        infos: &[(u32, LogInfo)],
    ) -> Result<(), String> {
        let me = self.inner.id;
        let (pool, pg) = (pgid.pool, pgid.pg);
        let auth_id = activation.authoritative;
        let mut recovery = match activation.recovery {
            None => None,
            Some(plan) => {
                // Erasure-coded: which members had a copy before, and which other daemons
                // still hold a shard of some position (decode sources while positions move).
                let (ec_strays, ec_established) = self.ec_peer_sources(pgid, epoch, infos).await;
                let own = self.copy_pgid(pgid, me);
                // Sizes only pace and report recovery: from the authoritative listing,
                // else my own copy when I am the authority, else 0.
                let (backfill, incomplete) = (plan.backfill, plan.incomplete.clone());
                let core = RecoveryCore::from_plan(plan, |name| {
                    (auth_id == me)
                        .then(|| self.inner.store.stat(own, name))
                        .flatten()
                        .map(|meta| meta.size_bytes)
                });
                if backfill {
                    OsdCounters::bump(&self.inner.counters.backfills);
                } else {
                    OsdCounters::bump(&self.inner.counters.log_recoveries);
                }
                tracing::info!(
                    "osd.{me}: pg {pgid} epoch {epoch}: {} object copies to recover on {:?} \
                     from osd.{auth_id} ({})",
                    core.missing_copies(),
                    incomplete,
                    if backfill { "backfill" } else { "log" }
                );
                Some(Recovery {
                    core,
                    notify: Arc::new(Notify::new()),
                    ec_strays,
                    ec_established,
                })
            }
        };
        let since;
        let start_task = {
            let mut pgs = crate::lock(&self.inner.pgs);
            let Some(st) = pgs.get_mut(&(pool, pg)) else {
                return Ok(());
            };
            if st.epoch != epoch || !matches!(st.phase, Phase::Peering | Phase::Incomplete) {
                return Ok(());
            }
            st.phase = Phase::Active;
            st.last = activation.last_version;
            // Replicated writes resume after every version any copy holds (writes of
            // this interval still in flight go on: the interval is the same).
            let interval = spindle_pg::RepInterval {
                epoch,
                me,
                acting: st.acting.clone(),
                min_size: st.min_size,
            };
            st.rep.activate(interval, activation.last_version);
            since = st.since;
            // Slots whose erasure-coded write failed since the last activation: missing
            // on every member until settled (`PgState::unsettled`).
            let unsettled = std::mem::take(&mut st.unsettled);
            if !unsettled.is_empty() && !st.acting.is_empty() {
                let rec = recovery.get_or_insert_with(|| Recovery {
                    core: RecoveryCore::new(me, false, BTreeMap::new(), Vec::new()),
                    notify: Arc::new(Notify::new()),
                    ec_strays: Vec::new(),
                    ec_established: st.acting.clone(),
                });
                for stored in &unsettled {
                    rec.core.add_missing(stored, &st.acting, 0);
                }
                tracing::info!(
                    "osd.{me}: pg {pgid} epoch {epoch}: settling {} slot(s) whose write \
                     failed: {unsettled:?}",
                    unsettled.len()
                );
            }
            let start = recovery.is_some();
            st.recovery = recovery;
            start
        };
        if start_task {
            let osd = self.clone();
            tokio::spawn(async move { osd.recovery_loop(pgid, since).await });
        }
        Ok(())
    }

    async fn mark_copy(
        &self,
        osd: u32,
        epoch: u64,
        pgid: PgId,
        incomplete: bool,
    ) -> Result<(), String> {
        let pgid = self.copy_pgid(pgid, osd);
        if osd == self.inner.id {
            return self
                .inner
                .store
                .mark_pg(pgid, incomplete)
                .await
                .map_err(|e| e.to_string());
        }
        let req = typed::PgMark {
            pool: pgid.pool,
            pg: pgid.pg,
            incomplete,
        };
        self.request_peer(osd, epoch, req)
            .await
            .map(|typed::Ok {}| ())
    }

    /// Listing with versions and sizes (of this daemon or a peer).
    async fn listing_sizes(&self, osd: u32, epoch: u64, pgid: PgId) -> Result<Listing, String> {
        let pgid = self.copy_pgid(pgid, osd);
        if osd == self.inner.id {
            return Ok(self
                .inner
                .store
                .list(pgid)
                .into_iter()
                .map(|(n, m)| {
                    let o = ListedObject {
                        version: m.version,
                        size_bytes: m.size_bytes,
                    };
                    (n, o)
                })
                .collect());
        }
        let req = typed::PgList {
            pool: pgid.pool,
            pg: pgid.pg,
        };
        let reply = self.request_peer(osd, epoch, req).await?;
        Ok(reply
            .listing
            .into_iter()
            .map(|l| {
                let o = ListedObject {
                    version: l.version,
                    size_bytes: l.size_bytes,
                };
                (l.name, o)
            })
            .collect())
    }

    /// Whether some copy of the group misses `name` (so an operation on it must wait).
    pub(crate) fn object_missing(&self, pgid: PgId, name: &str, me_only: bool) -> bool {
        let pgs = crate::lock(&self.inner.pgs);
        pgs.get(&(pgid.pool, pgid.pg))
            .and_then(|st| st.recovery.as_ref())
            .is_some_and(|r| r.core.is_missing(name, me_only.then_some(self.inner.id)))
    }

    /// Whether this daemon (the primary) misses any object of the group.
    pub(crate) fn primary_misses_objects(&self, pgid: PgId) -> Option<u32> {
        let pgs = crate::lock(&self.inner.pgs);
        let rec = pgs.get(&(pgid.pool, pgid.pg))?.recovery.as_ref()?;
        rec.core
            .incomplete()
            .contains(&self.inner.id)
            .then_some(rec.core.source())
    }

    /// Makes sure no copy misses `name` any more (recovering it now if needed).
    pub(crate) async fn ensure_recovered(
        &self,
        pgid: PgId,
        since: u64,
        name: &str,
    ) -> Result<(), String> {
        loop {
            let step = {
                let mut pgs = crate::lock(&self.inner.pgs);
                let st =
                    Self::pg_entry_valid(&mut pgs, pgid, since).ok_or("placement group changed")?;
                match st.recovery.as_mut() {
                    None => Step::Done,
                    Some(rec) => match rec.core.begin(name) {
                        Begin::Done => Step::Done,
                        Begin::Wait => Step::Wait(rec.notify.clone()),
                        Begin::Recover { copies, source } => Step::Recover {
                            osds: copies,
                            source,
                        },
                    },
                }
            };
            match step {
                Step::Done => return Ok(()),
                Step::Wait(notify) => {
                    // Bounded wait: a lost wake-up costs at most the timeout.
                    let _ =
                        tokio::time::timeout(Duration::from_millis(50), notify.notified()).await;
                }
                Step::Recover { osds, source } => {
                    let result = self.recover_copies(pgid, name, &osds, source).await;
                    let mut pgs = crate::lock(&self.inner.pgs);
                    if let Some(rec) = pgs
                        .get_mut(&(pgid.pool, pgid.pg))
                        .filter(|st| st.since == since)
                        .and_then(|st| st.recovery.as_mut())
                    {
                        let outcome = match result {
                            Ok(_) => RecoveryEvent::Recovered {
                                name: name.to_string(),
                            },
                            Err(_) => RecoveryEvent::Failed {
                                name: name.to_string(),
                            },
                        };
                        let left = rec.core.on_event(outcome);
                        if let (Ok(bytes), Some(_)) = (&result, left) {
                            let bytes = *bytes;
                            let c = &self.inner.counters;
                            OsdCounters::add(&c.recovered_objects, osds.len() as u64);
                            OsdCounters::add(&c.recovered_bytes, bytes * osds.len() as u64);
                        }
                        rec.notify.notify_waiters();
                    }
                    return result.map(|_| ());
                }
            }
        }
    }

    /// Copies the authoritative state of `name` to every daemon in `osds` (pulling it to
    /// myself first if I am one of them). Returns the object's size.
    async fn recover_copies(
        &self,
        pgid: PgId,
        name: &str,
        osds: &[u32],
        source: u32,
    ) -> Result<u64, String> {
        if self
            .map_state()
            .is_some_and(|ms| ms.map.pools.get(&pgid.pool).is_some_and(|p| p.is_erasure()))
        {
            return self.ec_recover(pgid, name, osds).await;
        }
        let me = self.inner.id;
        let store = &self.inner.store;
        // Messages carry the current epoch: the interval (same up set) may span several.
        let epoch = self.epoch();
        if osds.contains(&me) {
            let state = self.pull(source, epoch, pgid, name).await?;
            store
                .recover_object(pgid, name, state)
                .await
                .map_err(|e| format!("recovering {name} locally: {e}"))?;
        }
        let (state, bytes) = match store.stat(pgid, name) {
            None => ((None, Vec::new()), 0),
            Some(meta) => {
                let data = store
                    .read(pgid, name, 0, meta.size_bytes)
                    .await
                    .map_err(|e| format!("reading {name} to push: {e}"))?;
                ((Some(meta.version), data), meta.size_bytes)
            }
        };
        let peers: Vec<u32> = osds.iter().copied().filter(|&o| o != me).collect();
        if !peers.is_empty() {
            // One message (the object's bytes) for every peer.
            let msg = spindle_proto::Msg::from(typed::ObjState {
                pool: pgid.pool,
                pg: pgid.pg,
                name: name.to_string(),
                version: state.0,
                data: state.1,
            });
            let msg = &msg;
            let calls = peers.iter().map(|&p| async move {
                crate::expect_reply::<typed::ObjState>(p, self.call_peer(p, epoch, msg).await?)
            });
            for r in futures::future::join_all(calls).await {
                r?;
            }
        }
        Ok(bytes)
    }

    /// Background recovery of one placement group at `epoch` (stops when it changes).
    pub(crate) async fn recovery_loop(&self, pgid: PgId, since: u64) {
        let me = self.inner.id;
        let mut delay_ms = 50;
        loop {
            let next = {
                let mut pgs = crate::lock(&self.inner.pgs);
                let Some(st) = Self::pg_entry_valid(&mut pgs, pgid, since) else {
                    return;
                };
                let Some(rec) = st.recovery.as_ref() else {
                    return;
                };
                rec.core.next()
            };
            let (name, size) = match next {
                Next::Finished => break,
                Next::AllInProgress => {
                    // Everything left is being recovered on demand right now.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                Next::Object { name, size_bytes } => (name, size_bytes),
            };
            let permit = match self.inner.throttle.permits.acquire().await {
                Ok(p) => p,
                Err(_) => return,
            };
            self.inner.throttle.pace(size.max(4096)).await;
            let client_ops_before = OsdCounters::get(&self.inner.counters.client_ops);
            let started = Instant::now();
            let r = self.ensure_recovered(pgid, since, &name).await;
            // Yield to clients: while client operations arrive, each recovery slot keeps a
            // duty cycle of 1 / (1 + RECOVERY_YIELD_FACTOR) (the slot stays taken while it
            // pauses, so other groups cannot fill the gap).
            if OsdCounters::get(&self.inner.counters.client_ops) != client_ops_before {
                let pause = started.elapsed() * RECOVERY_YIELD_FACTOR;
                tokio::time::sleep(pause.min(Duration::from_millis(RECOVERY_YIELD_MAX_MS))).await;
            }
            drop(permit);
            if let Err(e) = r {
                if !self.interval_is(pgid, since) {
                    return;
                }
                tracing::info!("osd.{me}: pg {pgid}: recovering {name} failed: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                delay_ms = (delay_ms * 2).min(2000);
            } else {
                delay_ms = 50;
            }
        }
        // Everything recovered: mark the copies complete (after their pushes, in order).
        let incomplete = {
            let pgs = crate::lock(&self.inner.pgs);
            match pgs
                .get(&(pgid.pool, pgid.pg))
                .filter(|st| st.since == since)
                .and_then(|st| st.recovery.as_ref())
            {
                Some(rec) => match rec.core.completion_marks() {
                    Some(marks) => marks.to_vec(),
                    None => return,
                },
                None => return,
            }
        };
        for id in incomplete {
            let mut delay_ms = 50;
            loop {
                match self.mark_copy(id, self.epoch(), pgid, false).await {
                    Ok(()) => break,
                    Err(e) => {
                        if !self.interval_is(pgid, since) {
                            return;
                        }
                        tracing::info!("osd.{me}: marking osd.{id} complete failed: {e}");
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                        delay_ms = (delay_ms * 2).min(2000);
                    }
                }
            }
        }
        let mut pgs = crate::lock(&self.inner.pgs);
        if let Some(st) = pgs
            .get_mut(&(pgid.pool, pgid.pg))
            .filter(|st| st.since == since)
        {
            if st.recovery.as_ref().is_some_and(|r| r.core.is_done()) {
                st.recovery = None;
                tracing::info!("osd.{me}: pg {pgid} recovered (interval from epoch {since})");
            }
        }
    }

    /// Whether the group is still in the interval that began at `since`.
    pub(crate) fn interval_is(&self, pgid: PgId, since: u64) -> bool {
        crate::lock(&self.inner.pgs)
            .get(&(pgid.pool, pgid.pg))
            .is_some_and(|st| st.since == since)
    }

    /// The start of the group's current interval, if this daemon is its primary.
    pub(crate) fn interval_of(&self, pgid: PgId) -> Option<u64> {
        crate::lock(&self.inner.pgs)
            .get(&(pgid.pool, pgid.pg))
            .map(|st| st.since)
    }

    /// Whether this daemon, as primary, has the group clean at `epoch`.
    pub(crate) fn pg_is_clean(&self, pgid: PgId, epoch: u64) -> bool {
        let pgs = crate::lock(&self.inner.pgs);
        pgs.get(&(pgid.pool, pgid.pg)).is_some_and(|st| {
            st.epoch == epoch
                && st.phase == Phase::Active
                && st.recovery.is_none()
                && st.acting.len() as u32 >= st.size
        })
    }

    /// Periodically removes copies of groups this daemon no longer belongs to, once
    /// their primary reports the group clean.
    pub(crate) async fn stray_loop(&self) {
        loop {
            tokio::time::sleep(Duration::from_millis(self.inner.config.stray_check_ms)).await;
            if let Err(e) = self.remove_strays().await {
                tracing::debug!("osd.{}: stray check: {e}", self.inner.id);
            }
        }
    }

    async fn remove_strays(&self) -> Result<(), String> {
        let me = self.inner.id;
        for pgid in self.inner.store.pgs() {
            let Some(ms) = self.map_state() else {
                return Ok(());
            };
            let epoch = ms.map.epoch;
            let (group, shard) = spindle_map::split_shard_pg(pgid.pg);
            let member = |m: &spindle_map::PgMapping| match shard {
                None => m.up.contains(&me) || m.raw.contains(&me),
                // A shard copy belongs only at its own position.
                Some(s) => m.shard_of(me) == Some(s),
            };
            let primary = match ms.placement.pg(pgid.pool, group) {
                // The pool is gone: nothing can ever need this copy.
                None if !ms.map.pools.contains_key(&pgid.pool) => None,
                None => continue,
                Some(m) if member(m) => continue,
                Some(m) => match m.primary() {
                    Some(p) => Some(p),
                    None => continue,
                },
            };
            if let Some(primary) = primary {
                let query = typed::PgCleanQuery {
                    pool: pgid.pool,
                    pg: group,
                };
                if self.request_peer(primary, epoch, query).await.is_err() {
                    continue;
                }
            }
            // Re-check right before removing: still a stray at the same epoch.
            {
                let Some(ms) = self.map_state() else {
                    return Ok(());
                };
                if ms.map.epoch != epoch {
                    continue;
                }
                if let Some(m) = ms.placement.pg(pgid.pool, group) {
                    if member(m) {
                        continue;
                    }
                }
                crate::lock(&self.inner.removing).insert(pgid);
            }
            let objects = self.inner.store.pg_info(pgid).object_count;
            let r = self.inner.store.remove_pg(pgid).await;
            crate::lock(&self.inner.removing).remove(&pgid);
            match r {
                Ok(()) => {
                    OsdCounters::bump(&self.inner.counters.strays_removed);
                    tracing::info!("osd.{me}: removed stray copy of pg {pgid} ({objects} objects)");
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
}
