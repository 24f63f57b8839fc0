//! Clients: a seeded workload on owned objects, retries, and the read checker.

use super::*;

impl DataWorld {
    // ---- clients ----

    pub(super) fn client_receive(&mut self, id: u32, msg: DMsg) {
        match msg {
            DMsg::MapEpoch(e) => {
                let c = self.clients.get_mut(&id).expect("client exists");
                c.epoch = c.epoch.max(e);
            }
            DMsg::ObjReply {
                op,
                attempt,
                result,
            } => {
                let current = self.clients[&id]
                    .inflight
                    .get(&op)
                    .is_some_and(|o| o.attempt == attempt);
                if !current {
                    return;
                }
                match result {
                    Ok(state) => self.client_done(id, op, state),
                    Err(e) => {
                        self.log(|| format!("client.{id}: op {op} attempt {attempt}: {e}"));
                        self.send(Node::Client(id), Node::Mon, DMsg::GetMap);
                        let delay = self.rng.range(30, 200);
                        // The next attempt gets a new number: this one is over.
                        if let Some(o) = self
                            .clients
                            .get_mut(&id)
                            .and_then(|c| c.inflight.get_mut(&op))
                        {
                            o.attempt += 1;
                        }
                        self.at(delay, Ev::ClientRetry { client: id, op });
                    }
                }
            }
            _ => {}
        }
    }

    pub(super) fn client_done(&mut self, id: u32, op: u64, state: State) {
        let Some(o) = self
            .clients
            .get_mut(&id)
            .and_then(|c| c.inflight.remove(&op))
        else {
            return;
        };
        let c = self.clients.get_mut(&id).expect("client exists");
        c.busy.remove(&o.obj);
        self.report.ops_done += 1;
        let now = self.now_ms;
        match &o.what {
            ClientOp::Write(m) => {
                self.report.writes_acked += 1;
                let model = &mut self.models[o.obj];
                let last = model.history.last().map(|h| h.1.clone()).unwrap_or(None);
                let new = m.apply_to(last.as_deref());
                let mut h = TraceHash::default();
                h.bytes(new.as_deref().unwrap_or(&[]));
                self.trace.u64(h.value());
                let name = &self.objects[o.obj];
                if self.cfg.verbose {
                    eprintln!(
                        "[{now:>8} ms] client.{id}: op {op} write of {name} acknowledged: {}",
                        describe(&new)
                    );
                }
                model.history.push((now, new));
                model.pending = None;
            }
            ClientOp::Read => {
                self.report.reads_checked += 1;
                let mut h = TraceHash::default();
                h.bytes(state.as_deref().unwrap_or(&[]));
                self.trace.u64(h.value());
                let model = &self.models[o.obj];
                // The last state acknowledged before the read started, or a later one (or
                // the state of a write in flight).
                let from = model
                    .history
                    .iter()
                    .rposition(|(t, _)| *t < o.start_ms)
                    .unwrap_or(0);
                let ok = model.history[from..].iter().any(|(_, s)| *s == state)
                    || model.pending.as_ref() == Some(&state);
                if !ok {
                    let want = describe(&model.history[from].1);
                    let got = describe(&state);
                    let name = self.objects[o.obj].clone();
                    self.fail(format!(
                        "client.{id}: read of {name} started at {} ms returned {got}, \
                         but {want} was acknowledged before",
                        o.start_ms
                    ));
                }
            }
        }
        let delay = self.rng.range(0, 20) + self.client_pause_ms();
        self.at(delay, Ev::ClientIssue { client: id });
    }

    /// Clients work in bursts: now and then (one operation in five) a pause, scaled so
    /// that the workload spans the fault window (faults hit writes in flight and queued
    /// transactions, whatever the number of operations): 0-240 ms with the default
    /// workload (3 clients x 4 objects, 10,000 operations), 0-4 s with 300 operations.
    pub(super) fn client_pause_ms(&mut self) -> u64 {
        if self.rng.below(5) != 0 {
            return 0;
        }
        let per_client = (self.cfg.ops / u64::from(self.cfg.clients)).max(1);
        let slots = u64::from(self.cfg.objects_per_client);
        let mean = self.cfg.fault_window_ms * 5 * slots / per_client;
        self.rng.range(0, 2 * mean.min(10_000))
    }

    pub(super) fn client_issue(&mut self, id: u32) {
        let c = &self.clients[&id];
        if c.issued >= c.quota {
            return;
        }
        let free: Vec<usize> = c
            .owned
            .iter()
            .copied()
            .filter(|o| !c.busy.contains(o))
            .collect();
        if free.is_empty() {
            return;
        }
        let obj = free[self.rng.below(free.len() as u64) as usize];
        let last = self.models[obj]
            .history
            .last()
            .map(|h| h.1.clone())
            .unwrap_or(None);
        let what = if self.rng.below(100) < 30 {
            ClientOp::Read
        } else {
            ClientOp::Write(self.random_mutation(&last))
        };
        let what = self.ec_shape_op(what, &last); // EC hook
        if let ClientOp::Write(m) = &what {
            self.models[obj].pending = Some(m.apply_to(last.as_deref()));
        }
        let op = self.next_op;
        self.next_op += 1;
        let c = self.clients.get_mut(&id).expect("client exists");
        c.issued += 1;
        c.busy.insert(obj);
        c.inflight.insert(
            op,
            InFlightOp {
                obj,
                what,
                start_ms: self.now_ms,
                attempt: 0,
            },
        );
        self.client_send(id, op);
    }

    pub(super) fn random_mutation(&mut self, _last: &State) -> Mutation {
        let r = &mut self.rng;
        let bytes = |r: &mut SimRng, len: u64| -> Vec<u8> {
            let seed = r.next_u64();
            let mut g = SimRng::new(seed);
            (0..len).map(|_| g.next_u64() as u8).collect()
        };
        match r.below(10) {
            0..=3 => {
                let len = if r.below(8) == 0 {
                    r.range(16_385, 40_000)
                } else {
                    r.range(0, 12_000)
                };
                Mutation::WriteFull(bytes(r, len))
            }
            4 => {
                // A multi-extent write (what a write log's publisher sends).
                let mut extents = Vec::new();
                let mut at = r.below(8_000);
                for _ in 0..r.range(1, 5) {
                    let len_bytes = r.range(1, 3_000) as u32;
                    extents.push(spindle_types::Extent {
                        offset: at,
                        len_bytes,
                    });
                    at += len_bytes as u64 + r.below(4_000);
                }
                let total = extents.iter().map(|e| e.len_bytes as u64).sum();
                Mutation::WriteExtents {
                    extents,
                    data: bytes(r, total),
                }
            }
            5 | 6 => {
                let offset = r.below(20_000);
                let len = r.range(1, 6_000);
                Mutation::Write {
                    offset,
                    data: bytes(r, len),
                }
            }
            7 | 8 => Mutation::Truncate {
                size_bytes: r.below(24_000),
            },
            _ => Mutation::Delete,
        }
    }

    pub(super) fn client_send(&mut self, id: u32, op: u64) {
        let epoch = self.clients[&id].epoch;
        let Some(o) = self
            .clients
            .get_mut(&id)
            .and_then(|c| c.inflight.get_mut(&op))
        else {
            return;
        };
        o.attempt += 1;
        let (attempt, obj, what) = (o.attempt, o.obj, o.what.clone());
        let name = self.objects[obj].clone();
        let pg = self.pg_of(&name);
        let primary = (epoch > 0)
            .then(|| {
                self.map_at(epoch)
                    .1
                    .pg(self.client_pool(), pg) // EC hook
                    .and_then(|m| m.primary())
            })
            .flatten();
        self.at(
            CLIENT_TIMEOUT_MS,
            Ev::ClientTimeout {
                client: id,
                op,
                attempt,
            },
        );
        match primary {
            Some(p) => self.send(
                Node::Client(id),
                Node::Osd(p),
                DMsg::ObjRequest {
                    op,
                    attempt,
                    epoch,
                    pg,
                    name,
                    what,
                },
            ),
            None => {
                // No map yet, or no copy up: ask again soon.
                self.send(Node::Client(id), Node::Mon, DMsg::GetMap);
            }
        }
    }
}
