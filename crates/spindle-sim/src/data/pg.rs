//! A daemon's primary role: intervals, peering rounds (`PgCore`), activation, recovery
//! (`RecoveryCore`), client operations and replication (`ReplicationCore`), and the
//! ordered daemon-to-daemon streams.

use super::*;

impl DataWorld {
    /// The daemon learned of epoch `e`: new intervals for the groups it is primary of.
    pub(super) fn osd_new_epoch(&mut self, id: u32, e: u64) {
        let cur = self.current().0.epoch;
        let e = e.min(cur);
        if e <= self.daemons[&id].epoch {
            return;
        }
        self.daemons.get_mut(&id).expect("daemon exists").epoch = e;
        let m = self.map_at(e);
        let (map, placement) = (&m.0, &m.1);
        for pg in 0..self.cfg.pgs.next_power_of_two() {
            let acting = placement
                .pg(self.pool, pg)
                .map(|p| p.up.clone())
                .unwrap_or_default();
            let ident: Vec<(u32, u64)> = acting
                .iter()
                .map(|o| (*o, map.osds.get(o).map_or(0, |i| i.up_from)))
                .collect();
            let primary = acting.first() == Some(&id);
            let d = self.daemons.get_mut(&id).expect("daemon exists");
            let same = d.primaries.get(&pg).is_some_and(|p| p.ident == ident);
            if primary && same {
                // Same interval: keep serving at the new epoch (replicas take writes of
                // their own epoch only, so writes in flight of the old one are dropped).
                let min_size = self.min_size;
                let mut dropped = Vec::new();
                let mut ops = BTreeMap::new();
                if let Some(p) = d.primaries.get_mut(&pg) {
                    p.epoch = e;
                    if p.rep.is_active() {
                        let last = p.rep.last_version();
                        let iv = RepInterval {
                            epoch: e,
                            me: id,
                            acting: p.acting.clone(),
                            min_size,
                        };
                        dropped = p.rep.activate(iv, last);
                        ops = p.ops.clone();
                    }
                }
                self.rep_actions_with(id, pg, dropped, &ops);
                continue;
            }
            // Interval change: writes in flight are dropped unacknowledged.
            if let Some(mut old) = d.primaries.remove(&pg) {
                let actions = old.rep.interval_changed(None);
                let ops = std::mem::take(&mut old.ops);
                self.rep_actions_with(id, pg, actions, &ops);
            }
            if primary {
                let mut p = Primary {
                    ident,
                    epoch: e,
                    acting,
                    peering: PgCore::new(),
                    gen: 0,
                    rep: ReplicationCore::new(),
                    recovery: None,
                    job: None,
                    completing: BTreeSet::new(),
                    awaiting: BTreeSet::new(),
                    ops: BTreeMap::new(),
                };
                p.rep
                    .set_broken_ack_before_replicas(self.cfg.mutant == Mutant::AckBeforeReplicas);
                self.daemons
                    .get_mut(&id)
                    .expect("daemon exists")
                    .primaries
                    .insert(pg, p);
                self.restart_peering(id, pg);
            }
        }
        self.ec_new_epoch(id, e); // EC hook
    }

    /// Starts peering (again) for a group this daemon is primary of.
    pub(super) fn restart_peering(&mut self, id: u32, pg: u32) {
        self.report.peerings += 1;
        let min_size = self.min_size;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        p.gen += 1;
        p.recovery = None;
        p.job = None;
        p.completing.clear();
        let dropped = p.rep.interval_changed(Some(RepInterval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            min_size,
        }));
        let iv = Interval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            serve_floor: min_size,
        };
        // The same core: a new round number, so late replies of earlier rounds are
        // ignored by it; requests of earlier rounds (and recovery) are forgotten here.
        let (epoch, acting) = (p.epoch, p.acting.clone());
        let members = self.members(pg, epoch, &acting);
        self.log(|| format!("osd.{id}: pg {pg}: peering at epoch {epoch}, members {members:?}"));
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        p.peering.set_members(members);
        let actions = p.peering.on_event(PgEvent::IntervalChanged(iv));
        if let Some(d) = self.daemons.get_mut(&id) {
            d.pending.retain(|_, (g, _)| *g != pg);
        }
        self.rep_actions(id, pg, dropped);
        self.pg_actions(id, pg, actions);
    }

    /// For each acting copy: the epochs (up to `epoch`) at which it was in the group's
    /// acting set, from the map history.
    pub(super) fn members(
        &self,
        pg: u32,
        epoch: u64,
        acting: &[u32],
    ) -> spindle_pg::rules::MemberEpochs {
        let first = self.maps[0].0.epoch;
        acting
            .iter()
            .map(|&c| {
                let mut ranges: Vec<std::ops::RangeInclusive<u64>> = Vec::new();
                for e in first..=epoch {
                    let m = self.map_at(e);
                    if !m.1.pg(self.pool, pg).is_some_and(|x| x.up.contains(&c)) {
                        continue;
                    }
                    match ranges.last_mut() {
                        Some(r) if *r.end() + 1 == e => *r = *r.start()..=e,
                        _ => ranges.push(e..=e),
                    }
                }
                (c, ranges)
            })
            .collect()
    }

    pub(super) fn new_tag(&mut self, id: u32, pg: u32, what: Pending) -> u64 {
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        let tag = d.next_tag;
        d.next_tag += 1;
        d.pending.insert(tag, (pg, what));
        let inc = d.inc;
        self.at(
            PEER_TIMEOUT_MS,
            Ev::PeerTimeout {
                osd: id,
                inc,
                pg,
                tag,
            },
        );
        tag
    }

    /// Sends a peering / recovery request to `copy` (itself: through its own queue).
    pub(super) fn peer_send(&mut self, id: u32, pg: u32, copy: u32, what: Pending, req: PeerReq) {
        let tag = self.new_tag(id, pg, what);
        let epoch = self.daemons[&id].primaries.get(&pg).map_or(0, |p| p.epoch);
        if copy == id {
            self.peer_request(id, None, epoch, pg, tag, req);
        } else {
            self.send_stream(
                id,
                copy,
                DMsg::Peer {
                    epoch,
                    pg,
                    tag,
                    req,
                },
            );
        }
    }

    pub(super) fn pg_actions(&mut self, id: u32, pg: u32, actions: Vec<PgAction>) {
        for a in actions {
            match a {
                PgAction::QueryLog { round, copy } => {
                    self.peer_send(id, pg, copy, Pending::Query { round, copy }, PeerReq::Query)
                }
                PgAction::ListObjects { round, copy } => {
                    self.peer_send(id, pg, copy, Pending::List { round, copy }, PeerReq::List)
                }
                PgAction::MarkIncomplete { round, copy } => self.peer_send(
                    id,
                    pg,
                    copy,
                    Pending::Mark { round, copy },
                    PeerReq::Mark { incomplete: true },
                ),
                PgAction::Activate(act) => self.activate(id, pg, act),
                PgAction::Inactive { .. } => {}
                PgAction::WaitForCompleteCopy { .. } | PgAction::RoundFailed { .. } => {
                    let Some(p) = self.daemons[&id].primaries.get(&pg) else {
                        return;
                    };
                    let (gen, inc) = (p.gen, self.daemons[&id].inc);
                    self.log(|| format!("osd.{id}: pg {pg}: {a:?}"));
                    let delay = PEER_RETRY_MS + self.rng.range(0, PEER_RETRY_MS);
                    self.at(
                        delay,
                        Ev::PeerRetry {
                            osd: id,
                            inc,
                            pg,
                            gen,
                        },
                    );
                }
            }
        }
    }

    pub(super) fn activate(&mut self, id: u32, pg: u32, act: spindle_pg::Activation) {
        let min_size = self.min_size;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let iv = RepInterval {
            epoch: p.epoch,
            me: id,
            acting: p.acting.clone(),
            min_size,
        };
        let dropped = p.rep.activate(iv, act.last_version);
        p.recovery = act
            .recovery
            .clone()
            .map(|plan| RecoveryCore::from_plan(plan, |_| None));
        let ops = p.ops.clone();
        let epoch = p.epoch;
        self.check_activation(id, pg, epoch, act.last_version);
        self.log(|| {
            format!(
                "osd.{id}: pg {pg} active at epoch {epoch}, last {:?}, recovery {:?}",
                act.last_version,
                act.recovery.as_ref().map(|r| r.missing.len())
            )
        });
        self.rep_actions_with(id, pg, dropped, &ops);
        self.recovery_pump(id, pg);
    }

    /// Background recovery: one object at a time, then the completion marks.
    pub(super) fn recovery_pump(&mut self, id: u32, pg: u32) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if p.job.is_some() || !p.completing.is_empty() {
            return;
        }
        let Some(rec) = p.recovery.as_mut() else {
            return;
        };
        match rec.next() {
            Next::AllInProgress => {}
            Next::Finished => {
                let marks: Vec<u32> = rec.completion_marks().unwrap_or(&[]).to_vec();
                if marks.is_empty() {
                    p.recovery = None;
                    return;
                }
                p.completing = marks.iter().copied().collect();
                for copy in marks {
                    self.peer_send(
                        id,
                        pg,
                        copy,
                        Pending::Complete { copy },
                        PeerReq::Mark { incomplete: false },
                    );
                }
            }
            Next::Object { name, .. } => match rec.begin(&name) {
                Begin::Done | Begin::Wait => {}
                Begin::Recover { copies, source } => {
                    p.job = Some(RecJob {
                        name: name.clone(),
                        copies,
                        pushes_left: BTreeSet::new(),
                    });
                    self.peer_send(
                        id,
                        pg,
                        source,
                        Pending::Pull {
                            name: name.clone(),
                            copy: source,
                        },
                        PeerReq::Pull { name },
                    );
                }
            },
        }
    }

    pub(super) fn recovery_failed(&mut self, id: u32, pg: u32) {
        let inc = self.daemons[&id].inc;
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if let (Some(job), Some(rec)) = (p.job.take(), p.recovery.as_mut()) {
            rec.on_event(RecoveryEvent::Failed { name: job.name });
        }
        p.completing.clear();
        let gen = p.gen;
        self.at(
            PEER_RETRY_MS,
            Ev::RecoveryKick {
                osd: id,
                inc,
                pg,
                gen,
            },
        );
    }

    /// An answer (or failure) of a peering / recovery request.
    pub(super) fn peer_answer(
        &mut self,
        id: u32,
        pg: u32,
        tag: u64,
        result: Result<PeerAns, String>,
    ) {
        let Some((pgx, what)) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.pending.remove(&tag))
        else {
            return;
        };
        if pgx != pg || !self.daemons[&id].primaries.contains_key(&pg) {
            return;
        }
        let ev = match (what, result) {
            (Pending::Query { round, copy }, Ok(PeerAns::Log(info))) => PgEvent::LogInfo {
                round,
                from: copy,
                info,
            },
            (Pending::Query { round, copy }, r) => PgEvent::QueryFailed {
                round,
                from: copy,
                reason: format!("{:?}", r.err()),
            },
            (Pending::List { round, copy }, Ok(PeerAns::Listing(listing))) => PgEvent::Listing {
                round,
                from: copy,
                listing,
            },
            (Pending::List { round, copy }, r) => PgEvent::ListFailed {
                round,
                from: copy,
                reason: format!("{:?}", r.err()),
            },
            (Pending::Mark { round, copy }, Ok(_)) => PgEvent::Marked { round, copy },
            (Pending::Mark { round, copy }, Err(reason)) => PgEvent::MarkFailed {
                round,
                copy,
                reason,
            },
            (Pending::Pull { name, .. }, Ok(PeerAns::Object(state))) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                let Some(job) = p.job.as_mut().filter(|j| j.name == name) else {
                    return;
                };
                let copies = job.copies.clone();
                job.pushes_left = copies.iter().copied().collect();
                for copy in copies {
                    self.peer_send(
                        id,
                        pg,
                        copy,
                        Pending::Push {
                            name: name.clone(),
                            copy,
                        },
                        PeerReq::Push {
                            name: name.clone(),
                            state: state.clone(),
                        },
                    );
                }
                return;
            }
            (Pending::Push { name, copy }, Ok(_)) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                let Some(job) = p.job.as_mut().filter(|j| j.name == name) else {
                    return;
                };
                job.pushes_left.remove(&copy);
                if job.pushes_left.is_empty() {
                    p.job = None;
                    if let Some(rec) = p.recovery.as_mut() {
                        rec.on_event(RecoveryEvent::Recovered { name });
                    }
                    self.report.objects_recovered += 1;
                    self.recovery_pump(id, pg);
                }
                return;
            }
            (Pending::Complete { copy }, Ok(_)) => {
                let Some(p) = self
                    .daemons
                    .get_mut(&id)
                    .and_then(|d| d.primaries.get_mut(&pg))
                else {
                    return;
                };
                if p.completing.remove(&copy) && p.completing.is_empty() {
                    p.recovery = None;
                }
                return;
            }
            (Pending::Pull { .. } | Pending::Push { .. } | Pending::Complete { .. }, _) => {
                self.recovery_failed(id, pg);
                return;
            }
        };
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let actions = p.peering.on_event(ev);
        self.pg_actions(id, pg, actions);
    }

    // ---- client operations at the primary ----

    #[allow(clippy::too_many_arguments)]
    pub(super) fn client_op(
        &mut self,
        id: u32,
        client: u32,
        op: u64,
        attempt: u32,
        epoch: u64,
        pg: u32,
        name: &str,
        what: ClientOp,
    ) -> Option<Result<State, String>> {
        if self.ec.is_some() {
            // EC hook
            return self.ec_client_op(id, client, op, attempt, epoch, pg, name, what);
        }
        let d = &self.daemons[&id];
        if epoch < d.epoch {
            return Some(Err(format!("stale map: epoch {epoch}, mine {}", d.epoch)));
        }
        let Some(p) = d.primaries.get(&pg) else {
            return Some(Err("not primary".into()));
        };
        if !p.rep.is_active() {
            return Some(Err("not active".into()));
        }
        if p.recovery
            .as_ref()
            .is_some_and(|r| r.is_missing(name, None))
        {
            // Operations on an object some copy misses wait for its recovery.
            return Some(Err("object is being recovered".into()));
        }
        match what {
            ClientOp::Read => {
                let pgid = self.pgid(pg);
                let store = d.store.as_ref()?;
                let state = match store.stat(pgid, name) {
                    None => None,
                    Some(_) => match at_once(store.read(pgid, name, 0, u64::MAX)) {
                        Some(Ok(data)) => Some(data),
                        Some(Err(e)) => return Some(Err(e.to_string())),
                        None => return Some(Err("read did not complete".into())),
                    },
                };
                Some(Ok(state))
            }
            ClientOp::Write(m) => {
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let rep_op = d.next_rep_op;
                d.next_rep_op += 1;
                let p = d.primaries.get_mut(&pg)?;
                p.ops.insert(rep_op, (client, op, attempt));
                let actions = p.rep.submit(rep_op, name, WireMutation::from(m.clone()));
                self.rep_actions(id, pg, actions);
                None
            }
        }
    }

    pub(super) fn rep_event(&mut self, id: u32, pg: u32, ev: RepEvent) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        let actions = p.rep.on_event(ev);
        self.rep_actions(id, pg, actions);
    }

    pub(super) fn rep_timeout(&mut self, id: u32, pg: u32, version: Ver, copy: u32) {
        let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        else {
            return;
        };
        if !p.awaiting.remove(&(version, copy)) {
            return;
        }
        // Reconnect: the stream to that copy starts over.
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        d.out_streams.remove(&copy);
        self.rep_event(
            id,
            pg,
            RepEvent::ReplicaFailed {
                version,
                from: copy,
                reason: "timed out".into(),
            },
        );
    }

    pub(super) fn rep_actions(&mut self, id: u32, pg: u32, actions: Vec<RepAction>) {
        let ops = self.daemons[&id]
            .primaries
            .get(&pg)
            .map(|p| p.ops.clone())
            .unwrap_or_default();
        self.rep_actions_with(id, pg, actions, &ops);
    }

    /// The primary `id` of `pg` waits for `copy` to answer for `version`.
    fn await_copy(&mut self, id: u32, pg: u32, version: Ver, copy: u32) {
        if let Some(p) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.primaries.get_mut(&pg))
        {
            p.awaiting.insert((version, copy));
        }
    }

    pub(super) fn rep_actions_with(
        &mut self,
        id: u32,
        pg: u32,
        actions: Vec<RepAction>,
        ops: &BTreeMap<u64, (u32, u64, u32)>,
    ) {
        let inc = self.daemons[&id].inc;
        for a in actions {
            match a {
                RepAction::ApplyLocal {
                    version,
                    name,
                    mutation,
                } => {
                    let Ok(mutation) = Mutation::try_from(mutation) else {
                        continue;
                    };
                    self.await_copy(id, pg, version, id);
                    self.enqueue(
                        id,
                        Txn {
                            pg,
                            kind: TxnKind::Apply {
                                name,
                                version,
                                mutation,
                            },
                            then: Then::LocalWrite,
                        },
                    );
                }
                RepAction::Replicate {
                    to,
                    epoch,
                    version,
                    name,
                    mutation,
                } => {
                    let Ok(mutation) = Mutation::try_from(mutation) else {
                        continue;
                    };
                    self.await_copy(id, pg, version, to);
                    self.at(
                        REPLICA_TIMEOUT_MS,
                        Ev::RepTimeout {
                            osd: id,
                            inc,
                            pg,
                            version,
                            copy: to,
                        },
                    );
                    self.send_stream(
                        id,
                        to,
                        DMsg::RepWrite {
                            epoch,
                            pg,
                            version,
                            name,
                            mutation,
                        },
                    );
                }
                RepAction::Reply { op, result } => {
                    let Some(&(client, cop, attempt)) = ops.get(&op) else {
                        continue;
                    };
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.ops.remove(&op);
                    }
                    self.log(|| {
                        format!("osd.{id}: pg {pg}: reply to client.{client} op {cop}: {result:?}")
                    });
                    if let Ok(version) = &result {
                        self.check_ack(id, pg, *version);
                    }
                    let result = result.map(|_| None).map_err(|e| format!("{e:?}"));
                    // A write's reply carries no data: Ok(None) means "done".
                    self.send(
                        Node::Osd(id),
                        Node::Client(client),
                        DMsg::ObjReply {
                            op: cop,
                            attempt,
                            result,
                        },
                    );
                }
                RepAction::Repeer { reason } => {
                    self.log(|| format!("osd.{id}: pg {pg}: repeer: {reason}"));
                    if self.daemons[&id].primaries.contains_key(&pg) {
                        self.restart_peering(id, pg);
                    }
                }
            }
        }
    }

    /// A request over the ordered stream to `to`.
    pub(super) fn send_stream(&mut self, id: u32, to: u32, msg: DMsg) {
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        let inc = d.inc;
        if !d.out_streams.contains_key(&to) {
            let conn = inc << 32 | d.next_conn;
            d.next_conn += 1;
            d.out_streams.insert(to, (conn, 0, 0));
        }
        let st = d.out_streams.get_mut(&to).expect("just inserted");
        let (conn, seq) = (st.0, st.1);
        st.1 += 1;
        let last = st.2;
        let delays = self.net.route(&mut self.rng, Node::Osd(id), Node::Osd(to));
        let Some(&d0) = delays.first() else {
            return;
        };
        // In order: never before the previous message of the stream.
        let at = (self.now_ms + d0).max(last);
        if let Some(st) = self
            .daemons
            .get_mut(&id)
            .and_then(|d| d.out_streams.get_mut(&to))
        {
            st.2 = at;
        }
        self.queue.push(
            at,
            Ev::Deliver {
                from: Node::Osd(id),
                to: Node::Osd(to),
                msg: DMsg::Stream {
                    conn,
                    seq,
                    inner: Box::new(msg),
                },
            },
        );
    }
}
