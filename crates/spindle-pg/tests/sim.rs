//! Seeded randomized runs of the peering machine and of the EC slot rule, with their own
//! PRNG (no dependency): histories with lagging, trimmed, divergent and incomplete
//! copies; replies reordered, repeated, late (older rounds) and failed. Invariants checked
//! from the outside (the machine also asserts its own):
//! - never active without an authoritative complete copy that is the newest complete one;
//! - recovery always from the authoritative copy, never from an older one;
//! - every acknowledged write survives: the authority holds it, and every copy that
//!   lacks an object the authority has is told to fetch it;
//! - EC: an acknowledged slot version is never rolled back.
//!
//! A failing seed is printed; rerun it with `SPINDLE_PG_SEED=<seed>`.

use spindle_pg::ec::{decide_slot, ShardAnswer, SlotDecision, SlotView};
use spindle_pg::rules::{ListedObject, Listing};
use spindle_pg::{Action, Event, Interval, LogInfo, PgCore};
use spindle_proto::msg::{LogEntryMsg, Ver};
use std::collections::{BTreeMap, BTreeSet};

/// splitmix64: small, seedable, good enough for test inputs.
struct Prng(u64);

impl Prng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn seeds(default_count: u64) -> Vec<u64> {
    match std::env::var("SPINDLE_PG_SEED") {
        Ok(s) => vec![s.parse().expect("SPINDLE_PG_SEED is a number")],
        Err(_) => (0..default_count).collect(),
    }
}

/// One copy in the model: its full history (entries it applied) and what it reports.
#[derive(Clone, Debug)]
struct Copy {
    id: u32,
    /// Every entry it applied, in order (global prefix + divergent tail).
    entries: Vec<LogEntryMsg>,
    /// Length of the global-history prefix it holds.
    prefix: usize,
    info: LogInfo,
}

fn entry(epoch: u64, seq: u64, name: String) -> LogEntryMsg {
    LogEntryMsg {
        version: Ver { epoch, seq },
        name,
        delete: false,
    }
}

/// The object states of a copy: name -> version of its newest entry.
fn listing(c: &Copy) -> Listing {
    let mut l = Listing::new();
    for e in &c.entries {
        l.insert(
            e.name.clone(),
            ListedObject {
                version: e.version,
                size_bytes: 1,
            },
        );
    }
    l
}

struct Scenario {
    copies: Vec<Copy>,
    /// Global-history entries every old-interval copy acknowledged.
    acked: usize,
    history: Vec<LogEntryMsg>,
}

fn scenario(rng: &mut Prng) -> Scenario {
    // A global history in epoch blocks.
    let mut history = Vec::new();
    let mut seq = 0;
    let mut boundaries = vec![0usize];
    for epoch in 1..=1 + rng.below(4) {
        for _ in 0..1 + rng.below(6) {
            seq += 1;
            history.push(entry(epoch, seq, format!("o{}", rng.below(8))));
        }
        boundaries.push(history.len());
    }
    let n_copies = 2 + rng.below(3) as usize;
    let mut copies = Vec::new();
    for i in 0..n_copies {
        let mut prefix = rng.below(history.len() as u64 + 1) as usize;
        if rng.chance(30) {
            prefix = history.len();
        }
        let mut entries: Vec<LogEntryMsg> = history[..prefix].to_vec();
        // A divergent tail: writes of an old epoch's primary that the copies of the
        // next epoch never saw (only possible where a newer epoch took over). They are
        // that primary's sequence: copies holding some of them hold a prefix of it.
        if rng.chance(25) && prefix > 0 && boundaries[1..boundaries.len() - 1].contains(&prefix) {
            let last = history[prefix - 1].version;
            for d in 0..1 + rng.below(2) {
                entries.push(entry(
                    last.epoch,
                    last.seq + 1 + d,
                    format!("d{prefix}_{d}"),
                ));
            }
        }
        // Log trimming: the first t entries are only summarized by the tail. A log is
        // trimmed from its old end while the copy keeps receiving writes, so divergent
        // entries (the copy's newest, written just before it fell out) are never trimmed.
        let t = if rng.chance(30) {
            rng.below(prefix as u64 + 1) as usize
        } else {
            0
        };
        let tail = if t == 0 {
            Ver::default()
        } else {
            entries[t - 1].version
        };
        let info = LogInfo {
            last_version: entries.last().map_or(Ver::default(), |e| e.version),
            log_tail: tail,
            log: entries[t..].to_vec(),
            incomplete: rng.chance(15),
        };
        copies.push(Copy {
            id: i as u32 * 3 + 1,
            entries,
            prefix,
            info,
        });
    }
    // What was acknowledged: reached every complete copy (writes go to every up copy).
    let acked = copies
        .iter()
        .filter(|c| !c.info.incomplete)
        .map(|c| c.prefix)
        .min()
        .unwrap_or(0);
    Scenario {
        copies,
        acked,
        history,
    }
}

/// Runs one peering to its end, with faults; returns the final action.
fn drive(rng: &mut Prng, sc: &Scenario) -> Action {
    let acting: Vec<u32> = sc.copies.iter().map(|c| c.id).collect();
    let by_id = |id: u32| {
        sc.copies
            .iter()
            .find(|c| c.id == id)
            .expect("only acting copies are asked")
    };
    let mut core = PgCore::new();
    let mut queue: Vec<Action> = core.on_event(Event::IntervalChanged(Interval {
        epoch: 10,
        me: acting[0],
        acting: acting.clone(),
        serve_floor: 1,
    }));
    let mut old_events: Vec<Event> = Vec::new();
    let mut failures_left = rng.below(3);
    for _step in 0..10_000 {
        if queue.is_empty() {
            panic!("the machine stopped without a final action");
        }
        // Execute a random pending action (replies arrive in any order).
        let i = rng.below(queue.len() as u64) as usize;
        let act = queue.swap_remove(i);
        let fail = failures_left > 0 && rng.chance(20);
        let ev = match act {
            Action::QueryLog { round, copy } if fail => Event::QueryFailed {
                round,
                from: copy,
                reason: "injected".into(),
            },
            Action::QueryLog { round, copy } => Event::LogInfo {
                round,
                from: copy,
                info: by_id(copy).info.clone(),
            },
            Action::ListObjects { round, copy } if fail => Event::ListFailed {
                round,
                from: copy,
                reason: "injected".into(),
            },
            Action::ListObjects { round, copy } => Event::Listing {
                round,
                from: copy,
                listing: listing(by_id(copy)),
            },
            Action::MarkIncomplete { round, copy } if fail => Event::MarkFailed {
                round,
                copy,
                reason: "injected".into(),
            },
            Action::MarkIncomplete { round, copy } => Event::Marked { round, copy },
            Action::RoundFailed { .. } => {
                // Late replies of the failed round may still arrive, then the retry.
                for a in queue.drain(..) {
                    if let Action::QueryLog { round, copy } = a {
                        old_events.push(Event::LogInfo {
                            round,
                            from: copy,
                            info: by_id(copy).info.clone(),
                        });
                    }
                }
                Event::Retry
            }
            done @ (Action::Activate(_)
            | Action::WaitForCompleteCopy { .. }
            | Action::Inactive { .. }) => {
                assert!(queue.is_empty() || matches!(done, Action::Activate(_)));
                return done;
            }
        };
        if fail {
            failures_left -= 1;
        }
        // Sometimes a late reply of an older round, or a repeat, arrives first.
        if !old_events.is_empty() && rng.chance(30) {
            let j = rng.below(old_events.len() as u64) as usize;
            let late = old_events.swap_remove(j);
            assert!(core.on_event(late).is_empty(), "a late reply is ignored");
        }
        let repeat = rng.chance(10).then(|| ev.clone());
        queue.extend(core.on_event(ev));
        if let Some(r) = repeat {
            if !matches!(r, Event::Retry) {
                queue.extend(core.on_event(r));
            }
        }
    }
    panic!("peering did not finish");
}

fn check(sc: &Scenario, end: &Action) {
    let complete: Vec<&Copy> = sc.copies.iter().filter(|c| !c.info.incomplete).collect();
    let a = match end {
        Action::WaitForCompleteCopy { .. } => {
            assert!(complete.is_empty(), "waited although a complete copy is up");
            return;
        }
        Action::Activate(a) => a,
        other => panic!("unexpected end {other:?}"),
    };
    let auth = sc
        .copies
        .iter()
        .find(|c| c.id == a.authoritative)
        .expect("the authority is an acting copy");
    assert!(!auth.info.incomplete, "active without a complete authority");
    for c in &complete {
        assert!(
            c.info.last_version <= auth.info.last_version,
            "osd.{} is newer than the authority",
            c.id
        );
    }
    assert!(
        auth.prefix >= sc.acked,
        "the authority lost an acknowledged write"
    );
    for c in &sc.copies {
        assert!(c.info.last_version <= a.last_version);
    }
    // Convergence: every copy whose object state differs from the authority's is told to
    // fetch (or drop) that object, from the authority.
    let auth_state = listing(auth);
    let missing: BTreeMap<String, BTreeSet<u32>> =
        a.recovery.as_ref().map_or_else(BTreeMap::new, |r| {
            assert_eq!(
                r.source, a.authoritative,
                "recovery from a copy other than the authority"
            );
            r.missing
                .iter()
                .map(|(n, m)| (n.clone(), m.copies.iter().copied().collect()))
                .collect()
        });
    for c in sc.copies.iter().filter(|c| c.id != auth.id) {
        let mine = listing(c);
        let names: BTreeSet<&String> = mine.keys().chain(auth_state.keys()).collect();
        for n in names {
            if mine.get(n).map(|o| o.version) != auth_state.get(n).map(|o| o.version) {
                assert!(
                    missing.get(n).is_some_and(|s| s.contains(&c.id)),
                    "osd.{} differs on {n} but is not told to recover it",
                    c.id
                );
            }
        }
    }
    let _ = &sc.history;
}

#[test]
fn seeded_peering_keeps_its_invariants() {
    for seed in seeds(20_000) {
        let mut rng = Prng(seed);
        let sc = scenario(&mut rng);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let end = drive(&mut rng, &sc);
            check(&sc, &end);
        }));
        if let Err(e) = result {
            eprintln!(
                "failing seed: SPINDLE_PG_SEED={seed}; acked prefix {}",
                sc.acked
            );
            for c in &sc.copies {
                eprintln!("osd.{} prefix {}: {:?}", c.id, c.prefix, c.info);
            }
            std::panic::resume_unwind(e);
        }
    }
}

/// EC: an acknowledged version (durable on at least min_size positions) is never rolled
/// back, whichever shards answer; a rebuild only decodes from holders of its version.
#[test]
fn seeded_ec_recovery_never_rolls_back_an_acknowledged_write() {
    let ack = Ver { epoch: 3, seq: 7 };
    let newer = Ver { epoch: 3, seq: 8 };
    for seed in seeds(20_000) {
        let mut rng = Prng(seed ^ 0xEC);
        let k = 1 + rng.below(4) as usize;
        let m = 1 + rng.below(3) as usize;
        let total = k + m;
        let min_size = (k + rng.below(m as u64 + 1) as usize) as u32;
        // Which positions hold the version: acknowledged (>= min_size) or not.
        let acked = rng.chance(50);
        let holders = if acked {
            min_size as usize + rng.below((total - min_size as usize) as u64 + 1) as usize
        } else {
            rng.below(total as u64 + 1) as usize
        };
        let version = if acked { ack } else { newer };
        let mut order: Vec<usize> = (0..total).collect();
        for i in (1..total).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let holds: BTreeSet<usize> = order[..holders].iter().copied().collect();
        let mut view = SlotView {
            k,
            total,
            min_size,
            members: Vec::new(),
            strays: Vec::new(),
            established: Vec::new(),
        };
        for p in 0..total {
            let truth = if holds.contains(&p) {
                ShardAnswer::Present(version)
            } else {
                ShardAnswer::Absent
            };
            let member = 100 + p as u32;
            match rng.below(6) {
                // The member answers the truth.
                0..=2 => {
                    view.members.push(Some((member, truth)));
                    view.established.push(member);
                }
                // It does not answer.
                3 => {
                    view.members.push(Some((member, ShardAnswer::Unknown)));
                    view.established.push(member);
                }
                // The position is a hole now.
                4 => view.members.push(None),
                // A new daemon took the position; the old holder may answer as a stray.
                _ => {
                    view.members.push(Some((member + 50, ShardAnswer::Absent)));
                    match rng.below(3) {
                        0 => view.strays.push((p, truth)),
                        1 => view.strays.push((p, ShardAnswer::Unknown)),
                        _ => {}
                    }
                }
            }
        }
        let d = decide_slot(&view);
        if acked {
            assert_ne!(
                d,
                SlotDecision::RollBack { version: ack },
                "seed {seed}: rolled back an acknowledged write: {view:?}"
            );
        }
        if let SlotDecision::Rebuild {
            version: rv,
            sources,
            targets,
        } = &d
        {
            assert_eq!(*rv, version, "seed {seed}");
            assert_eq!(sources.len(), k, "seed {seed}");
            for s in sources {
                assert!(holds.contains(s), "seed {seed}: decoding from a non-holder");
            }
            for t in targets {
                assert!(view.members[*t].is_some(), "seed {seed}: pushing to a hole");
            }
        }
        if holders == 0 {
            assert_eq!(d, SlotDecision::Deleted, "seed {seed}");
        }
    }
}
