//! Driving `PgCore` by events, as the daemon does, without I/O: in-order, reordered,
//! repeated, late and failed replies.

use spindle_pg::rules::{ListedObject, Listing};
use spindle_pg::{Action, Event, Interval, LogInfo, PgCore, Round};
use spindle_proto::msg::{LogEntryMsg, Ver};

fn v(epoch: u64, seq: u64) -> Ver {
    Ver { epoch, seq }
}

fn log(entries: &[(u64, u64, &str)], tail: Ver) -> LogInfo {
    let log: Vec<LogEntryMsg> = entries
        .iter()
        .map(|&(e, s, n)| LogEntryMsg {
            version: v(e, s),
            name: n.to_string(),
            delete: false,
        })
        .collect();
    LogInfo {
        last_version: log.last().map_or(tail, |e| e.version),
        log_tail: tail,
        log,
        incomplete: false,
    }
}

fn interval(acting: &[u32]) -> Interval {
    Interval {
        epoch: 7,
        me: acting[0],
        acting: acting.to_vec(),
        serve_floor: 2,
    }
}

fn start(core: &mut PgCore, acting: &[u32]) -> Round {
    let acts = core.on_event(Event::IntervalChanged(interval(acting)));
    let round = core.round();
    let want: Vec<Action> = acting
        .iter()
        .map(|&copy| Action::QueryLog { round, copy })
        .collect();
    assert_eq!(acts, want, "every copy is queried, the primary first");
    round
}

fn info(core: &mut PgCore, round: Round, from: u32, info: &LogInfo) -> Vec<Action> {
    core.on_event(Event::LogInfo {
        round,
        from,
        info: info.clone(),
    })
}

fn activation(acts: &[Action]) -> &spindle_pg::Activation {
    match acts {
        [Action::Activate(a)] => a,
        other => panic!("expected one activation, got {other:?}"),
    }
}

#[test]
fn copies_in_sync_activate_without_recovery() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1, 2]);
    let same = log(&[(1, 1, "a"), (1, 2, "b")], Ver::default());
    assert!(info(&mut core, r, 0, &same).is_empty());
    assert!(info(&mut core, r, 1, &same).is_empty());
    let acts = info(&mut core, r, 2, &same);
    let a = activation(&acts);
    assert_eq!(a.authoritative, 0);
    assert_eq!(a.last_version, v(1, 2));
    assert_eq!(a.recovery, None);
    assert!(core.is_active());
}

#[test]
fn a_lagging_copy_is_marked_before_activation_and_recovered_from_the_authority() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1, 2]);
    let full = log(&[(1, 1, "a"), (1, 2, "b"), (2, 3, "c")], Ver::default());
    let behind = log(&[(1, 1, "a")], Ver::default());
    // Replies in reverse order, one repeated.
    assert!(info(&mut core, r, 2, &behind).is_empty());
    assert!(
        info(&mut core, r, 2, &full).is_empty(),
        "a repeated reply is ignored"
    );
    assert!(info(&mut core, r, 1, &full).is_empty());
    let acts = info(&mut core, r, 0, &behind);
    assert_eq!(
        acts,
        vec![
            Action::MarkIncomplete { round: r, copy: 0 },
            Action::MarkIncomplete { round: r, copy: 2 }
        ]
    );
    // Not active until every mark is durable.
    assert!(core
        .on_event(Event::Marked { round: r, copy: 2 })
        .is_empty());
    assert!(!core.is_active());
    let acts = core.on_event(Event::Marked { round: r, copy: 0 });
    let a = activation(&acts);
    assert_eq!(a.authoritative, 1);
    let rec = a.recovery.as_ref().expect("copies miss objects");
    assert_eq!(
        rec.source, 1,
        "the primary pulls from the authoritative copy"
    );
    assert!(!rec.backfill);
    assert_eq!(rec.incomplete, vec![0, 2]);
    let names: Vec<&str> = rec.missing.keys().map(String::as_str).collect();
    assert_eq!(names, ["b", "c"]);
    assert_eq!(rec.missing["b"].copies, vec![0, 2]);
    assert_eq!(rec.missing["c"].copies, vec![0, 2]);
}

#[test]
fn divergent_entries_are_rolled_back_and_new_versions_sort_after_them() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1]);
    let auth = log(&[(1, 1, "a"), (4, 2, "c")], Ver::default());
    // osd.1 was primary at epoch 3 and wrote (3, 9) "x" that nobody else has; its copy
    // is incomplete so it cannot be authoritative. (An incomplete copy *newer* than every
    // complete one makes the group wait instead: `rules::authoritative`.)
    let mut div = log(&[(1, 1, "a"), (3, 9, "x")], Ver::default());
    div.last_version = v(4, 1);
    div.incomplete = true;
    info(&mut core, r, 0, &auth);
    let acts = info(&mut core, r, 1, &div);
    // An incomplete copy is backfilled: both copies are listed.
    assert_eq!(
        acts,
        vec![
            Action::ListObjects { round: r, copy: 0 },
            Action::ListObjects { round: r, copy: 1 }
        ]
    );
    let o = |e, s| ListedObject {
        version: v(e, s),
        size_bytes: 10,
    };
    let la: Listing = [("a".into(), o(1, 1)), ("c".into(), o(4, 2))].into();
    let lb: Listing = [("a".into(), o(1, 1)), ("x".into(), o(3, 9))].into();
    assert!(core
        .on_event(Event::Listing {
            round: r,
            from: 1,
            listing: lb
        })
        .is_empty());
    let acts = core.on_event(Event::Listing {
        round: r,
        from: 0,
        listing: la,
    });
    assert_eq!(acts, vec![Action::MarkIncomplete { round: r, copy: 1 }]);
    let acts = core.on_event(Event::Marked { round: r, copy: 1 });
    let a = activation(&acts);
    assert_eq!(a.authoritative, 0);
    assert_eq!(
        a.last_version,
        v(4, 2),
        "new writes sort after every copy's version"
    );
    let rec = a.recovery.as_ref().expect("osd.1 misses objects");
    assert!(rec.backfill);
    let names: Vec<&str> = rec.missing.keys().map(String::as_str).collect();
    assert_eq!(names, ["c", "x"], "c fetched, x (divergent) rolled back");
    assert_eq!(rec.missing["c"].size_bytes, Some(10));
}

#[test]
fn a_failed_query_fails_the_round_and_late_replies_are_ignored() {
    let mut core = PgCore::new();
    let r1 = start(&mut core, &[0, 1, 2]);
    let same = log(&[(1, 1, "a")], Ver::default());
    info(&mut core, r1, 0, &same);
    let acts = core.on_event(Event::QueryFailed {
        round: r1,
        from: 1,
        reason: "timed out".into(),
    });
    assert!(matches!(&acts[..], [Action::RoundFailed { round, reason }]
        if *round == r1 && reason.contains("timed out")));
    // The late replies of the failed round change nothing.
    assert!(info(&mut core, r1, 1, &same).is_empty());
    assert!(info(&mut core, r1, 2, &same).is_empty());
    assert!(!core.is_active());
    // The retry timer starts a new round; replies of the old one are still ignored.
    let acts = core.on_event(Event::Retry);
    let r2 = core.round();
    assert!(r2 > r1);
    assert_eq!(acts.len(), 3);
    assert!(info(&mut core, r1, 0, &same).is_empty());
    info(&mut core, r2, 0, &same);
    info(&mut core, r2, 2, &same);
    // A reply from a daemon outside the acting set is ignored.
    assert!(info(&mut core, r2, 9, &same).is_empty());
    let acts = info(&mut core, r2, 1, &same);
    assert_eq!(activation(&acts).recovery, None);
    // Retry while active does nothing.
    assert!(core.on_event(Event::Retry).is_empty());
}

#[test]
fn no_complete_copy_means_waiting_not_serving() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1]);
    let mut inc = log(&[(1, 1, "a")], Ver::default());
    inc.incomplete = true;
    info(&mut core, r, 0, &inc);
    let acts = info(&mut core, r, 1, &inc);
    assert_eq!(acts, vec![Action::WaitForCompleteCopy { round: r }]);
    assert!(!core.is_active());
    // A retry queries again; this time osd.1 is complete.
    core.on_event(Event::Retry);
    let r2 = core.round();
    info(&mut core, r2, 0, &inc);
    let acts = info(&mut core, r2, 1, &log(&[(1, 1, "a")], Ver::default()));
    assert_eq!(
        acts,
        vec![
            Action::ListObjects { round: r2, copy: 1 },
            Action::ListObjects { round: r2, copy: 0 }
        ]
    );
}

#[test]
fn a_failed_mark_or_listing_fails_the_round() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1]);
    info(
        &mut core,
        r,
        0,
        &log(&[(1, 1, "a"), (1, 2, "b")], Ver::default()),
    );
    info(&mut core, r, 1, &log(&[(1, 1, "a")], Ver::default()));
    let acts = core.on_event(Event::MarkFailed {
        round: r,
        copy: 1,
        reason: "io".into(),
    });
    assert!(matches!(&acts[..], [Action::RoundFailed { .. }]));
    assert!(core
        .on_event(Event::Marked { round: r, copy: 1 })
        .is_empty());
    assert!(!core.is_active());

    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1]);
    info(&mut core, r, 0, &log(&[(2, 50, "a")], v(2, 49)));
    let acts = info(&mut core, r, 1, &log(&[(1, 1, "a")], Ver::default()));
    assert_eq!(acts.len(), 2, "trimmed log: backfill by listings");
    let acts = core.on_event(Event::ListFailed {
        round: r,
        from: 1,
        reason: "gone".into(),
    });
    assert!(matches!(&acts[..], [Action::RoundFailed { .. }]));
}

#[test]
fn too_few_copies_up_is_inactive() {
    let mut core = PgCore::new();
    let acts = core.on_event(Event::IntervalChanged(interval(&[4])));
    assert_eq!(acts, vec![Action::Inactive { up: 1, floor: 2 }]);
    assert!(core.on_event(Event::Retry).is_empty());
    let r = core.round();
    assert!(info(&mut core, r, 4, &log(&[], Ver::default())).is_empty());
    assert!(!core.is_active());
}

/// Peering step 1 with the copy side: osd.1 still has a write of the previous interval
/// queued (the old primary may acknowledge it) when the query arrives. Through the gate,
/// its answer waits for the apply, so the write is in the logs peering compares and the
/// primary, which missed it, is told to fetch it.
#[test]
fn a_copy_answers_only_after_its_queued_write_is_applied() {
    let mut core = PgCore::new();
    let r = start(&mut core, &[0, 1]);
    let mut gate: spindle_pg::TxnGate<u32, Round> = spindle_pg::TxnGate::new();
    let before = log(&[(1, 1, "a")], Ver::default());
    let after = log(&[(1, 1, "a"), (1, 2, "b")], Ver::default());
    gate.txn_queued(1); // the write of "b" at (1, 2), not applied yet
    assert!(info(&mut core, r, 0, &before).is_empty());
    assert_eq!(
        gate.log_query(1, r),
        None,
        "the query waits for the queued write"
    );
    // The write applies; the waiting query is answered with the log that has it.
    let released = gate.txn_applied(1);
    assert_eq!(released, vec![r]);
    let acts = info(&mut core, released[0], 1, &after);
    assert_eq!(acts, vec![Action::MarkIncomplete { round: r, copy: 0 }]);
    let acts = core.on_event(Event::Marked { round: r, copy: 0 });
    let a = activation(&acts);
    assert_eq!(a.authoritative, 1);
    assert_eq!(a.last_version, v(1, 2));
    let rec = a.recovery.as_ref().expect("the primary misses b");
    assert_eq!(rec.missing["b"].copies, vec![0]);
}
