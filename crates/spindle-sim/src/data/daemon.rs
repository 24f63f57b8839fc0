//! The monitor model and the daemons: messages, peering and recovery requests at a copy,
//! the store transaction queue (with the copy-side gate) and its disk.

use super::*;

impl DataWorld {
    // ---- monitor (a model: liveness by heartbeats, real maps and placement) ----

    pub(super) fn mon_receive(&mut self, from: Node, msg: DMsg) {
        if let (Node::Osd(id), DMsg::Heartbeat) = (from, &msg) {
            self.mon_heard.insert(id, self.now_ms);
        }
        let epoch = self.current().0.epoch;
        self.send(Node::Mon, from, DMsg::MapEpoch(epoch));
    }

    pub(super) fn mon_tick(&mut self) {
        let cur = self.current();
        let mut next = cur.0.clone();
        let mut changed = Vec::new();
        for (id, info) in next.osds.iter_mut() {
            let heard = self.mon_heard.get(id).copied();
            let recent = heard.is_some_and(|t| self.now_ms.saturating_sub(t) < DOWN_AFTER_MS);
            if info.up && !recent && self.now_ms >= DOWN_AFTER_MS {
                info.up = false;
                changed.push(format!("osd.{id} down"));
            } else if !info.up && recent {
                info.up = true;
                info.up_from = cur.0.epoch + 1;
                changed.push(format!("osd.{id} up"));
            }
        }
        if changed.is_empty() {
            return;
        }
        next.epoch = cur.0.epoch + 1;
        let placement = Placement::compute(&next);
        self.log(|| format!("mon: epoch {}: {}", next.epoch, changed.join(", ")));
        self.trace.u64(20 + next.epoch);
        let epoch = next.epoch;
        self.maps.push(Arc::new((next, placement)));
        for id in 0..self.cfg.daemons {
            self.send(Node::Mon, Node::Osd(id), DMsg::MapEpoch(epoch));
        }
        for c in 0..self.cfg.clients {
            self.send(Node::Mon, Node::Client(c), DMsg::MapEpoch(epoch));
        }
    }

    // ---- daemons ----

    pub(super) fn osd_receive(&mut self, id: u32, from: Node, msg: DMsg) {
        match msg {
            DMsg::Ec(m) => self.ec_receive(id, from, m), // EC hook
            DMsg::MapEpoch(e) => self.osd_new_epoch(id, e),
            DMsg::ObjRequest {
                op,
                attempt,
                epoch,
                pg,
                name,
                what,
            } => {
                let Node::Client(c) = from else { return };
                let my_epoch = self.daemons[&id].epoch;
                if epoch > my_epoch {
                    // The client knows a newer map: never serve on an older placement.
                    self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
                    let result = Err(format!("need map {epoch}, mine is {my_epoch}"));
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::ObjReply {
                            op,
                            attempt,
                            result,
                        },
                    );
                    return;
                }
                let result = self.client_op(id, c, op, attempt, epoch, pg, &name, what);
                if let Some(result) = result {
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::ObjReply {
                            op,
                            attempt,
                            result,
                        },
                    );
                }
            }
            DMsg::Stream { conn, seq, inner } => {
                let Node::Osd(src) = from else { return };
                // The ordered stream: a gap means the connection broke.
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let st = d.in_streams.entry(src).or_insert((0, 0, true));
                if conn < st.0 {
                    return;
                }
                if conn > st.0 {
                    *st = (conn, 0, false);
                }
                if st.2 || seq != st.1 {
                    st.2 = true;
                    return;
                }
                st.1 += 1;
                self.osd_receive(id, from, *inner);
            }
            DMsg::RepWrite {
                epoch,
                pg,
                version,
                name,
                mutation,
            } => {
                let Node::Osd(src) = from else { return };
                let my_epoch = self.daemons[&id].epoch;
                if epoch != my_epoch {
                    if epoch > my_epoch {
                        self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
                    }
                    self.send(
                        Node::Osd(id),
                        from,
                        DMsg::RepReply {
                            pg,
                            version,
                            result: Err(format!("epoch {epoch}, mine is {my_epoch}")),
                        },
                    );
                    return;
                }
                self.enqueue(
                    id,
                    Txn {
                        pg,
                        kind: TxnKind::Apply {
                            name,
                            version,
                            mutation,
                        },
                        then: Then::RepReply { to: src },
                    },
                );
            }
            DMsg::RepReply {
                pg,
                version,
                result,
            } => {
                let Node::Osd(src) = from else { return };
                let ev = match result {
                    Ok(()) => RepEvent::ReplicaAcked { version, from: src },
                    Err(reason) => RepEvent::ReplicaFailed {
                        version,
                        from: src,
                        reason,
                    },
                };
                if self.daemons[&id]
                    .primaries
                    .get(&pg)
                    .is_some_and(|p| p.awaiting.contains(&(version, src)))
                {
                    if let Some(p) = self
                        .daemons
                        .get_mut(&id)
                        .and_then(|d| d.primaries.get_mut(&pg))
                    {
                        p.awaiting.remove(&(version, src));
                    }
                    self.rep_event(id, pg, ev);
                }
            }
            DMsg::Peer {
                epoch,
                pg,
                tag,
                req,
            } => {
                let Node::Osd(src) = from else { return };
                self.peer_request(id, Some(src), epoch, pg, tag, req);
            }
            DMsg::PeerReply { pg, tag, result } => self.peer_answer(id, pg, tag, result),
            DMsg::Heartbeat | DMsg::GetMap | DMsg::ObjReply { .. } => {}
        }
    }

    /// A peering / recovery request at a copy (`src` None: this daemon's own primary role).
    pub(super) fn peer_request(
        &mut self,
        id: u32,
        src: Option<u32>,
        epoch: u64,
        pg: u32,
        tag: u64,
        req: PeerReq,
    ) {
        let my_epoch = self.daemons[&id].epoch;
        let reply_err = |w: &mut DataWorld, e: String| match src {
            Some(s) => w.send(
                Node::Osd(id),
                Node::Osd(s),
                DMsg::PeerReply {
                    pg,
                    tag,
                    result: Err(e),
                },
            ),
            None => w.peer_answer(id, pg, tag, Err(e)),
        };
        if epoch != my_epoch {
            if epoch > my_epoch {
                self.send(Node::Osd(id), Node::Mon, DMsg::GetMap);
            }
            reply_err(self, format!("epoch {epoch}, mine is {my_epoch}"));
            return;
        }
        let then = match src {
            Some(to) => Then::PeerReply { to, tag },
            None => Then::SelfReply { tag },
        };
        match req {
            PeerReq::Query | PeerReq::List => {
                let waiter = Waiter {
                    to: src,
                    tag,
                    list: matches!(req, PeerReq::List),
                };
                let ungated = self.cfg.mutant == Mutant::UngatedLogQuery;
                let d = self.daemons.get_mut(&id).expect("daemon exists");
                let released = if ungated {
                    Some(waiter)
                } else {
                    d.gate.log_query(pg, waiter)
                };
                if let Some(w) = released {
                    self.answer_waiter(id, pg, w);
                }
            }
            PeerReq::Mark { incomplete } => self.enqueue(
                id,
                Txn {
                    pg,
                    kind: TxnKind::Mark { incomplete },
                    then,
                },
            ),
            // As in the daemon, a pull reads the store now (what is applied), not after
            // the queued transactions.
            PeerReq::Pull { name } => {
                let pgid = self.pgid(pg);
                let Some(store) = self.daemons[&id].store.as_ref() else {
                    return;
                };
                let result = match store.stat(pgid, &name) {
                    None => Ok(PeerAns::Object(None)),
                    Some(meta) => match at_once(store.read(pgid, &name, 0, u64::MAX)) {
                        Some(Ok(data)) => Ok(PeerAns::Object(Some((data, meta.version)))),
                        Some(Err(e)) => Err(e.to_string()),
                        None => Err("read did not complete at once".into()),
                    },
                };
                match then {
                    Then::PeerReply { to, tag } => self.send(
                        Node::Osd(id),
                        Node::Osd(to),
                        DMsg::PeerReply { pg, tag, result },
                    ),
                    _ => self.peer_answer(id, pg, tag, result),
                }
            }
            PeerReq::Push { name, state } => self.enqueue(
                id,
                Txn {
                    pg,
                    kind: TxnKind::Recover { name, state },
                    then,
                },
            ),
        }
    }

    pub(super) fn answer_waiter(&mut self, id: u32, pg: u32, w: Waiter) {
        let pgid = self.pgid(pg);
        let Some(store) = self.daemons[&id].store.as_ref() else {
            return;
        };
        let ans = if w.list {
            PeerAns::Listing(
                store
                    .list(pgid)
                    .into_iter()
                    .map(|(n, m)| {
                        (
                            n,
                            ListedObject {
                                version: m.version,
                                size_bytes: m.size_bytes,
                            },
                        )
                    })
                    .collect(),
            )
        } else {
            let info = store.pg_info(pgid);
            let log = store
                .pg_log(pgid)
                .into_iter()
                .map(|e| LogEntryMsg {
                    version: e.version,
                    name: e.name,
                    delete: e.op == LogOp::Delete,
                })
                .collect();
            self.log(|| {
                format!(
                    "osd.{id}: pg {pg}: log query of {:?} answered: last {:?} incomplete {}",
                    w.to, info.last_version, info.incomplete
                )
            });
            PeerAns::Log(LogInfo {
                last_version: info.last_version,
                log_tail: info.log_tail,
                log,
                incomplete: info.incomplete,
            })
        };
        match w.to {
            Some(to) => self.send(
                Node::Osd(id),
                Node::Osd(to),
                DMsg::PeerReply {
                    pg,
                    tag: w.tag,
                    result: Ok(ans),
                },
            ),
            None => self.peer_answer(id, pg, w.tag, Ok(ans)),
        }
    }

    pub(super) fn enqueue(&mut self, id: u32, txn: Txn) {
        let pg = txn.pg;
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        d.gate.txn_queued(pg);
        d.queue.push_back(txn);
        if !d.disk_busy {
            d.disk_busy = true;
            let inc = d.inc;
            let delay = self.disk_delay_ms(id);
            self.at(delay, Ev::DiskStep { osd: id, inc });
        }
    }

    /// Applies the daemon's next queued store transaction, synchronously.
    pub(super) fn disk_step(&mut self, id: u32) {
        // A stalled disk completes nothing until the stall ends.
        if let Some(d) = self.daemons.get(&id) {
            if self.now_ms < d.stall_until_ms {
                let (wait, inc) = (d.stall_until_ms - self.now_ms, d.inc);
                self.at(wait, Ev::DiskStep { osd: id, inc });
                return;
            }
        }
        let pgid_of = |w: &DataWorld, pg| w.pgid(pg);
        let Some(txn) = self.daemons.get_mut(&id).and_then(|d| d.queue.pop_front()) else {
            if let Some(d) = self.daemons.get_mut(&id) {
                d.disk_busy = false;
            }
            return;
        };
        let pgid = pgid_of(self, txn.pg);
        if let TxnKind::Recover { name, state } = &txn.kind {
            let v = state.as_ref().map(|s| s.1);
            self.log(|| format!("osd.{id}: pg {}: recover {name} to {v:?}", txn.pg));
        }
        let Some(store) = self.daemons[&id].store.as_ref() else {
            return;
        };
        let result: Result<(), String> = match &txn.kind {
            TxnKind::Apply {
                name,
                version,
                mutation,
            } => store
                .apply(pgid, name, *version, mutation.clone())
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Recover { name, state } => store
                .recover_object(pgid, name, state.clone())
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Mark { incomplete } => store
                .mark_pg(pgid, *incomplete)
                .wait()
                .map_err(|e| e.to_string()),
            TxnKind::Ec(t) => ec::store_txn(store, t),
        };
        self.trace.u64(u64::from(result.is_ok()));
        if let TxnKind::Mark { incomplete } = &txn.kind {
            self.log(|| {
                format!(
                    "osd.{id}: pg {}: marked incomplete={incomplete} ({:?})",
                    txn.pg, txn.then
                )
            });
        }
        if let Err(e) = &result {
            self.log(|| format!("osd.{id}: store {:?} failed: {e}", txn.kind));
            if matches!(txn.kind, TxnKind::Mark { .. } | TxnKind::Recover { .. }) {
                self.fail(format!("osd.{id}: a recovery transaction failed: {e}"));
            }
        }
        // The gate: queries waiting for this group's queued transactions.
        let released = self
            .daemons
            .get_mut(&id)
            .map(|d| d.gate.txn_applied(txn.pg))
            .unwrap_or_default();
        match txn.then {
            Then::LocalWrite => {
                if let TxnKind::Apply { version, .. } = txn.kind {
                    let awaited = self.daemons[&id]
                        .primaries
                        .get(&txn.pg)
                        .is_some_and(|p| p.awaiting.contains(&(version, id)));
                    if awaited {
                        if let Some(p) = self
                            .daemons
                            .get_mut(&id)
                            .and_then(|d| d.primaries.get_mut(&txn.pg))
                        {
                            p.awaiting.remove(&(version, id));
                        }
                        self.rep_event(id, txn.pg, RepEvent::LocalCommitted { version, result });
                    }
                }
            }
            Then::RepReply { to } => {
                if let TxnKind::Apply { version, .. } = txn.kind {
                    self.send(
                        Node::Osd(id),
                        Node::Osd(to),
                        DMsg::RepReply {
                            pg: txn.pg,
                            version,
                            result,
                        },
                    );
                }
            }
            Then::PeerReply { to, tag } => {
                let result = result.map(|()| PeerAns::Done);
                self.send(
                    Node::Osd(id),
                    Node::Osd(to),
                    DMsg::PeerReply {
                        pg: txn.pg,
                        tag,
                        result,
                    },
                );
            }
            Then::SelfReply { tag } => {
                let result = result.map(|()| PeerAns::Done);
                self.peer_answer(id, txn.pg, tag, result);
            }
            Then::Ec(then) => self.ec_txn_done(id, then, txn.kind, result),
        }
        for w in released {
            self.answer_waiter(id, txn.pg, w);
        }
        if !self.live_id(id) {
            return;
        }
        let d = self.daemons.get_mut(&id).expect("daemon exists");
        if d.queue.is_empty() {
            d.disk_busy = false;
        } else {
            let inc = d.inc;
            let delay = self.disk_delay_ms(id);
            self.at(delay, Ev::DiskStep { osd: id, inc });
        }
    }

    /// How long the next store transaction of daemon `id` takes: mostly a few ms,
    /// sometimes a slow one; longer during a slow-disk fault (a stalled disk: `disk_step`).
    pub(super) fn disk_delay_ms(&mut self, id: u32) -> u64 {
        let (slow_until, (lo, hi)) = self
            .daemons
            .get(&id)
            .map_or((0, (0, 0)), |d| (d.slow_until_ms, d.slow_ms));
        if self.now_ms < slow_until {
            self.rng.range(lo, hi)
        } else if self.rng.below(50) == 0 {
            self.rng.range(20, 300)
        } else {
            self.rng.range(0, 3)
        }
    }

    pub(super) fn live_id(&self, id: u32) -> bool {
        self.daemons.get(&id).is_some_and(|d| d.alive)
    }
}
