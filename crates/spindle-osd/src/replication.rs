//! The replication protocol, copy side: `RepWrite` from the primary of a replicated group
//! (the primary side is `client.rs`, `start_write` / `finish_write`). Erasure-coded shard
//! writes travel as `RepWrite` too but are routed to `ec.rs` (`serve_shard`).

use crate::{is_shard_mutation, store_error_reply, Osd};
use spindle_proto::net::Replier;
use spindle_proto::{ErrorCode, Msg};
use spindle_store::PgId;

impl Osd {
    /// Applies a replicated write in arrival order (versions arrive in order on the primary's one connection) and acknowledges it once durable.
    pub(crate) fn serve_replication(
        &self,
        msg: Msg,
        rid: u64,
        epoch: u64,
        block_crcs: Vec<u32>,
        reply: Replier,
    ) {
        match msg {
            Msg::RepWrite { ref mutation, .. } if is_shard_mutation(mutation) => {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(ErrorCode::Invalid, "shard write to a replicated group"),
                );
            }
            Msg::RepWrite {
                pool,
                pg,
                name,
                version: v,
                mutation,
            } => {
                let Some(mutation) = crate::to_store_mutation(mutation) else {
                    reply.send(rid, epoch, &crate::not_replicated());
                    return;
                };
                let guard = self.inflight_begin(PgId { pool, pg });
                let commit = self.inner.store.apply_with_block_crcs(
                    PgId { pool, pg },
                    &name,
                    v,
                    mutation,
                    block_crcs,
                );
                tokio::spawn(async move {
                    let committed = commit.await;
                    drop(guard);
                    let msg = match committed {
                        Ok(()) => Msg::Ok,
                        Err(e) => store_error_reply(&e),
                    };
                    reply.send(rid, epoch, &msg);
                });
            }
            other => crate::not_handled(&reply, rid, epoch, &other),
        }
    }
}
