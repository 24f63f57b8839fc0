//! What the monitor does with a request or a tick, without sockets, tasks or clocks: the
//! core ([`MonCore`]) and its durable map store ([`MapStore`]). [`crate::Monitor`] runs it
//! over TCP; the simulator (`spindle-sim`) runs the same code over its simulated network,
//! so neither has a copy of the request handling.
//!
//! Invariant: a map is installed in the core (and so visible) only after
//! [`MapStore::save`] returned; a failed save leaves the core at its epoch.

use crate::{AdminCommand, MapChange, MapStore, MonCore};
use spindle_map::ClusterMap;
use spindle_proto::{ErrorCode, Msg};
use std::sync::Arc;

/// A map the node saved and installed: every subscriber is to get it.
#[derive(Clone, Debug)]
pub struct Committed {
    pub epoch: u64,
    pub bytes: Arc<Vec<u8>>,
    /// Why the map changed (for the log).
    pub reason: String,
}

/// What the shell is to do after a request or a tick, in this order: publish `committed`
/// (oldest first), send `reply` to the requester stamped with `epoch`, and, with
/// `subscribe`, push every epoch newer than the given one on the requester's connection
/// until it closes.
#[derive(Debug, Default)]
pub struct Handled {
    pub committed: Vec<Committed>,
    pub reply: Option<Msg>,
    pub subscribe: Option<u64>,
    /// The node's epoch after handling.
    pub epoch: u64,
    /// Map changes the core proposed that could not be saved (logged by the shell).
    pub failed: Vec<String>,
}

/// The monitor without I/O: a core and the store of its map.
pub struct MonNode {
    core: MonCore,
    store: Box<dyn MapStore>,
}

/// Map changes a tick commits at most (down, then out, for a few daemons at once).
const TICK_CHANGES_MAX: usize = 4;

impl MonNode {
    pub fn new(core: MonCore, store: Box<dyn MapStore>) -> MonNode {
        MonNode { core, store }
    }

    pub fn core(&self) -> &MonCore {
        &self.core
    }

    pub fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    /// The current map, encoded.
    pub fn map_bytes(&self) -> Vec<u8> {
        self.core.map().encode()
    }

    /// Saves, then installs a proposal of the core.
    fn commit(
        &mut self,
        now_ms: u64,
        next: ClusterMap,
        reason: String,
        out: &mut Handled,
    ) -> Result<u64, String> {
        if let Err(e) = self.store.save(&next) {
            let msg = format!("cannot commit a map change ({reason}): {e}");
            out.failed.push(msg.clone());
            return Err(msg);
        }
        self.core.install(next, now_ms);
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.core
            .record_event(unix_ms, self.core.epoch(), reason.clone());
        out.committed.push(Committed {
            epoch: self.core.epoch(),
            bytes: Arc::new(self.map_bytes()),
            reason,
        });
        Ok(self.core.epoch())
    }

    fn commit_change(&mut self, now_ms: u64, change: Option<MapChange>, out: &mut Handled) {
        if let Some(MapChange { next, reason }) = change {
            let _ = self.commit(now_ms, next, reason, out);
        }
    }

    /// Handles one request that arrived stamped with the sender's `sender_epoch`.
    pub fn on_request(&mut self, now_ms: u64, sender_epoch: u64, msg: Msg) -> Handled {
        let mut out = Handled::default();
        match msg {
            Msg::OsdBoot { osd_id, addr, pid } => {
                let auto_out = self
                    .core
                    .map()
                    .osds
                    .get(&osd_id)
                    .is_some_and(|o| o.auto_out);
                let res = self
                    .core
                    .boot(now_ms, osd_id, &addr, pid)
                    .and_then(|next| match next {
                        Some(next) => self.commit(
                            now_ms,
                            next,
                            if auto_out {
                                format!(
                                    "osd.{osd_id} booted at {addr} (pid {pid}); marked in \
                                     again (the monitor had marked it out)"
                                )
                            } else {
                                format!("osd.{osd_id} booted at {addr} (pid {pid})")
                            },
                            &mut out,
                        ),
                        None => Ok(self.core.epoch()),
                    });
                out.reply = Some(match res {
                    Ok(_) => Msg::MapUpdate {
                        map: self.map_bytes(),
                    },
                    Err(msg) => Msg::error(ErrorCode::Invalid, msg),
                });
            }
            Msg::Heartbeat {
                osd_id,
                reports,
                counters,
                metrics_addr,
            } => {
                // Scrub findings become events (the dashboard's and `status`'s).
                let findings = self.core.scrub_findings(osd_id, &reports, &counters);
                if !findings.is_empty() {
                    let unix_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    for f in findings {
                        self.core.record_event(unix_ms, self.core.epoch(), f);
                    }
                }
                let change = self
                    .core
                    .heartbeat(now_ms, osd_id, sender_epoch, reports, counters);
                self.core.set_metrics_addr(osd_id, metrics_addr);
                self.commit_change(now_ms, change, &mut out);
                out.reply = Some(Msg::HeartbeatAck {
                    epoch: self.core.epoch(),
                });
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                if subscribe {
                    // The subscription sends the current map if it is newer, then every
                    // later epoch; no reply of its own.
                    out.subscribe = Some(have_epoch);
                } else if have_epoch < self.core.epoch() {
                    out.reply = Some(Msg::MapUpdate {
                        map: self.map_bytes(),
                    });
                } else {
                    out.reply = Some(Msg::Ok);
                }
            }
            Msg::Command { args }
                if args.get(..2) == Some(&["mon".into(), "metrics".into()])
                    || args.get(..2) == Some(&["metrics".into(), "register".into()]) =>
            {
                let done = Msg::CommandReply {
                    ok: true,
                    output: "null".into(),
                };
                out.reply = Some(match AdminCommand::parse(&args) {
                    Ok(AdminCommand::MonMetrics { id, addr, clock }) => {
                        self.core.set_mon_metrics(now_ms, id, addr, clock);
                        // The leader's clock, for the monitor's next clock sample.
                        let unix_ms = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64);
                        Msg::CommandReply {
                            ok: true,
                            output: unix_ms.to_string(),
                        }
                    }
                    Ok(AdminCommand::MetricsRegister { name, addr, images }) => {
                        self.core.set_service_metrics(now_ms, name, addr, images);
                        done
                    }
                    Ok(_) => Msg::CommandReply {
                        ok: false,
                        output: "not a metrics registration".into(),
                    },
                    Err(output) => Msg::CommandReply { ok: false, output },
                });
            }
            Msg::Command { args } => {
                let now_unix_secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let res = AdminCommand::parse(&args)
                    .and_then(|cmd| self.core.execute_at(now_ms, now_unix_secs, &cmd))
                    .and_then(|(answer, next)| match next {
                        Some(next) => self
                            .commit(now_ms, next, args.join(" "), &mut out)
                            .map(|_| answer),
                        None => Ok(answer),
                    })
                    .and_then(|answer| serde_json::to_string(&answer).map_err(|e| e.to_string()));
                out.reply = Some(match res {
                    Ok(output) => Msg::CommandReply { ok: true, output },
                    Err(output) => Msg::CommandReply { ok: false, output },
                });
            }
            other => {
                out.reply = Some(Msg::error(
                    ErrorCode::Invalid,
                    format!("the monitor does not handle {}", other.name()),
                ));
            }
        }
        out.epoch = self.core.epoch();
        out
    }

    /// Marks down (then out) the daemons the core finds due: a bounded number of changes.
    pub fn on_tick(&mut self, now_ms: u64) -> Handled {
        let mut out = Handled::default();
        for _ in 0..TICK_CHANGES_MAX {
            let Some(MapChange { next, reason }) = self.core.tick(now_ms) else {
                break;
            };
            if self.commit(now_ms, next, reason, &mut out).is_err() {
                break;
            }
        }
        out.epoch = self.core.epoch();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{first_map, InitSpec, MemMapStore, MonTiming};

    fn node(store: &MemMapStore) -> MonNode {
        let spec = InitSpec {
            osd_count: 3,
            osd_hosts: Vec::new(),
            default_pool: Some(("rbd".into(), 3, 2, 8)),
        };
        let map = first_map(&spec, 7).unwrap();
        MonNode::new(
            MonCore::new(
                map,
                MonTiming {
                    down_after_ms: 1_000,
                    out_after_ms: 0,
                },
                0,
            ),
            Box::new(store.clone()),
        )
    }

    fn command(n: &mut MonNode, args: &[&str]) -> Handled {
        n.on_request(
            0,
            0,
            Msg::Command {
                args: args.iter().map(|s| s.to_string()).collect(),
            },
        )
    }

    #[test]
    fn a_change_is_saved_before_it_is_visible_and_a_failed_save_changes_nothing() {
        let store = MemMapStore::default();
        let mut n = node(&store);
        let before = n.epoch();
        let h = command(&mut n, &["pool", "create", "p", "3", "2", "8"]);
        assert!(
            matches!(&h.reply, Some(Msg::CommandReply { ok: true, .. })),
            "{h:?}"
        );
        assert_eq!(h.committed.len(), 1);
        assert_eq!(h.epoch, before + 1);
        assert_eq!(store.load().unwrap().unwrap().epoch, before + 1);
        assert_eq!(
            *h.committed[0].bytes,
            store.load().unwrap().unwrap().encode()
        );
        store.fail_saves(true);
        let h = command(&mut n, &["pool", "create", "q", "3", "2", "8"]);
        assert!(
            matches!(&h.reply, Some(Msg::CommandReply { ok: false, output }) if output.contains("saves fail")),
            "{h:?}"
        );
        assert!(h.committed.is_empty());
        assert_eq!(h.failed.len(), 1);
        assert_eq!(n.epoch(), before + 1);
    }

    #[test]
    fn requests_get_their_answers() {
        let store = MemMapStore::default();
        let mut n = node(&store);
        let e = n.epoch();
        let h = n.on_request(
            0,
            0,
            Msg::GetMap {
                have_epoch: 0,
                subscribe: false,
            },
        );
        assert!(matches!(h.reply, Some(Msg::MapUpdate { .. })));
        let h = n.on_request(
            0,
            0,
            Msg::GetMap {
                have_epoch: e,
                subscribe: false,
            },
        );
        assert!(matches!(h.reply, Some(Msg::Ok)));
        let h = n.on_request(
            0,
            0,
            Msg::GetMap {
                have_epoch: 3,
                subscribe: true,
            },
        );
        assert!(h.reply.is_none());
        assert_eq!(h.subscribe, Some(3));
        let h = command(&mut n, &["bogus"]);
        assert!(matches!(h.reply, Some(Msg::CommandReply { ok: false, .. })));
        let h = n.on_request(0, 0, Msg::Ok);
        assert!(
            matches!(
                &h.reply,
                Some(Msg::Error {
                    code: ErrorCode::Invalid,
                    ..
                })
            ),
            "{h:?}"
        );
        assert_eq!(n.epoch(), e);
    }

    #[test]
    fn a_daemon_that_stops_heartbeating_is_marked_down_by_a_tick() {
        let store = MemMapStore::default();
        let mut n = node(&store);
        let id = *n
            .core()
            .map()
            .osds
            .keys()
            .next()
            .expect("the default map has daemons");
        let h = n.on_request(
            0,
            0,
            Msg::OsdBoot {
                osd_id: id,
                addr: "127.0.0.1:1".into(),
                pid: 9,
            },
        );
        assert!(matches!(h.reply, Some(Msg::MapUpdate { .. })), "{h:?}");
        assert!(n.core().map().osds[&id].up);
        assert!(n.on_tick(500).committed.is_empty());
        let h = n.on_tick(5_000);
        assert!(!h.committed.is_empty());
        assert!(!n.core().map().osds[&id].up);
        assert_eq!(store.load().unwrap().unwrap().epoch, n.epoch());
    }
}
