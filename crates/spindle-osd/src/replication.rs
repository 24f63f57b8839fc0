//! The replication protocol, copy side: `RepWrite` from the primary of a replicated group
//! (the primary side is `client.rs`, `start_write` / `finish_write`). Erasure-coded shard
//! writes travel as `RepWrite` too but are routed to `ec.rs` (`serve_shard`).

use crate::{reply_on_commit, Osd};
use spindle_proto::net::Replier;
use spindle_proto::Msg;
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
            Msg::RepWrite {
                pool,
                pg,
                name,
                version: v,
                mutation,
            } => {
                let Ok(mutation) = spindle_store::Mutation::try_from(mutation) else {
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
                reply_on_commit(reply, rid, epoch, commit, Some(guard));
            }
            other => crate::not_handled(&reply, rid, epoch, &other),
        }
    }
}
