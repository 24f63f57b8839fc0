//! The peering and recovery protocol, copy side: log queries (answered only after the
//! group's queued transactions are applied: `spindle_pg::TxnGate`), listings, object pulls
//! and pushes, log replacement, completeness marks and the clean query. The primary side
//! (rounds, recovery) is `recovery.rs` over `spindle_pg`.

use crate::{log_from_wire, reply_on_commit, store_error_reply, Osd};
use spindle_proto::msg::{ObjectListing, Ver};
use spindle_proto::net::Replier;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::PgId;

impl Osd {
    /// Every object of a placement group with size and version.
    pub(crate) fn listing_reply(&self, pgid: PgId) -> Msg {
        let listing = self
            .inner
            .store
            .list(pgid)
            .into_iter()
            .map(|(name, m)| ObjectListing {
                name,
                size_bytes: m.size_bytes,
                version: m.version,
            })
            .collect();
        Msg::ObjReply {
            version: Ver::default(),
            size_bytes: 0,
            data: Vec::new(),
            listing,
        }
    }

    /// Answers one peering or recovery request about a group this daemon holds a copy of.
    pub(crate) fn serve_peering(&self, msg: Msg, rid: u64, epoch: u64, reply: Replier) {
        match msg {
            Msg::PgQuery { pool, pg } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let primary = osd
                        .map_state()
                        .and_then(|ms| ms.placement.pg(pool, pg).and_then(|m| m.primary()));
                    osd.lease_hold_back(primary, epoch).await;
                    let msg = match osd.inflight_drain(pgid).await {
                        Ok(()) => {
                            let info = osd.local_log_info(pgid);
                            Msg::PgInfo {
                                last_version: info.last_version,
                                log_tail: info.log_tail,
                                log: info.log,
                                incomplete: info.incomplete,
                            }
                        }
                        Err(e) => Msg::error(ErrorCode::Again, e),
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::PgMark {
                pool,
                pg,
                incomplete,
            } => {
                let commit = self.inner.store.mark_pg(PgId { pool, pg }, incomplete);
                reply_on_commit(reply, rid, epoch, commit, None);
            }
            Msg::PgCleanQuery { pool, pg } => {
                let msg = if self.pg_is_clean(PgId { pool, pg }, epoch) {
                    Msg::Ok
                } else {
                    Msg::error(ErrorCode::Again, "not clean")
                };
                reply.send(rid, epoch, &msg);
            }
            Msg::PgList { pool, pg } => {
                let osd = self.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let msg = match osd.inflight_drain(pgid).await {
                        Ok(()) => osd.listing_reply(pgid),
                        Err(e) => Msg::error(ErrorCode::Again, e),
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ObjPull { pool, pg, name }
                if spindle_map::split_shard_pg(pg).1.is_some()
                    && crate::ec::is_delta_slot(&name) =>
            {
                // A delta slot of a shard copy: its logical bytes (the whole shard).
                let osd = self.clone();
                tokio::spawn(async move {
                    let msg = osd.pull_slot_state(PgId { pool, pg }, &name).await;
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ObjPull { pool, pg, name } => {
                let store = self.inner.store.clone();
                tokio::spawn(async move {
                    let pgid = PgId { pool, pg };
                    let msg = match store.stat(pgid, &name) {
                        None => Msg::ObjState {
                            pool,
                            pg,
                            name,
                            version: None,
                            data: Vec::new(),
                        },
                        Some(meta) => match store.read(pgid, &name, 0, meta.size_bytes).await {
                            Ok(data) => Msg::ObjState {
                                pool,
                                pg,
                                name,
                                version: Some(meta.version),
                                data,
                            },
                            Err(e) => store_error_reply(&e),
                        },
                    };
                    reply.send_owned(rid, epoch, msg);
                });
            }
            Msg::ObjState {
                pool,
                pg,
                name,
                version: v,
                data,
            } => {
                let guard = self.inflight_begin(PgId { pool, pg });
                let commit =
                    self.inner
                        .store
                        .recover_object(PgId { pool, pg }, &name, v.map(|v| (data, v)));
                reply_on_commit(reply, rid, epoch, commit, Some(guard));
            }
            Msg::PgSetLog {
                pool,
                pg,
                last_version,
                log_tail,
                log,
            } => {
                let commit = self.inner.store.set_pg_log(
                    PgId { pool, pg },
                    log_from_wire(&log),
                    last_version,
                    log_tail,
                );
                reply_on_commit(reply, rid, epoch, commit, None);
            }
            other => crate::not_handled(&reply, rid, epoch, &other),
        }
    }
}
