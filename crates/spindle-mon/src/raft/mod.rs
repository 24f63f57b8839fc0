//! Replicated monitors: the cluster map as the state machine of a Raft group, on the
//! `openraft` library (consensus is not written here). Every map change is one committed
//! log entry; the leader's [`crate::MonNode`] decides changes and proposes them; the
//! other monitors apply them and serve maps, and pass requests that change the map on to
//! the leader.
//!
//! - `storage.rs`: the log and the state machine in one redb database.
//! - this file: the type configuration, the timings, and the Raft RPCs over Spindle's own
//!   protocol (`Msg::MonRaft`, so monitors talk over the same framed, checksummed
//!   connections as everything else).

pub mod storage;

use openraft::error::{
    Fatal, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Snapshot, SnapshotMeta, Vote};
use serde::{Deserialize, Serialize};
use spindle_proto::net::RpcConn;
use spindle_proto::transport::Net;
use spindle_proto::{typed, CallError};
use std::io::Cursor;
use std::sync::Arc;
pub use storage::{decode, encode, Applied, Boot, LogStore, RaftDb, StateMachine};

/// An entry of the monitors' log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proposal {
    /// "The map after epoch `base_epoch` is `map`" (an encoded `ClusterMap`).
    Map { base_epoch: u64, map: Vec<u8> },
    /// "The key database after version `base_version` is `db`" (an encoded
    /// [`crate::auth::AuthDb`]; small, so every change carries all of it).
    Auth { base_version: u64, db: Vec<u8> },
}

/// What applying an entry did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A blank or membership entry.
    Nothing,
    Applied {
        epoch: u64,
    },
    /// The key database is at `version`.
    AuthApplied {
        version: u64,
    },
    /// The proposal was not based on the applied map (a deposed leader's, or a race).
    Refused {
        reason: String,
    },
}

openraft::declare_raft_types!(
    /// The monitors' Raft group: entries are map proposals, nodes are monitor addresses.
    pub MonRaftTypes:
        D = Proposal,
        R = Outcome,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<MonRaftTypes>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type MonRaft = openraft::Raft<MonRaftTypes>;

/// Timings of the monitors' Raft group.
#[derive(Clone, Copy, Debug)]
pub struct RaftTiming {
    /// The leader's heartbeat to the others.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in [min, max) starts an
    /// election. Failover takes about `election_min_ms` plus one round trip and one commit.
    pub election_min_ms: u64,
    pub election_max_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        // Failover is about one election timeout after the leader's last heartbeat
        // (openraft's followers also refuse votes for that long, the leader's lease), plus
        // one round of votes and the commit of the new leader's first entry: 0.5-1 s keeps
        // it under the 3 s target; 100 ms heartbeats are five per timeout, so a monitor
        // sharing two busy cores with daemons does not miss enough of them to start
        // needless elections.
        RaftTiming {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
        }
    }
}

/// Log entries after which a snapshot (the map) replaces them; followers that lag
/// further get the snapshot.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 200;
/// Entries kept behind a snapshot (so a follower a little behind needs no snapshot).
pub const ENTRIES_KEPT_BEHIND_SNAPSHOT: u64 = 50;
/// Entries in one append request (each is a whole map; the receiver-side limit still
/// applies, and a batch that does not fit is split by `PayloadTooLarge`).
pub const APPEND_ENTRIES_MAX: u64 = 64;

pub fn raft_config(t: RaftTiming) -> Result<openraft::Config, String> {
    let c = openraft::Config {
        cluster_name: "spindle-mon".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_min_ms,
        election_timeout_max: t.election_max_ms,
        max_payload_entries: APPEND_ENTRIES_MAX,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES),
        max_in_snapshot_log_to_keep: ENTRIES_KEPT_BEHIND_SNAPSHOT,
        install_snapshot_timeout: 5000,
        ..Default::default()
    };
    c.validate().map_err(|e| e.to_string())
}

const RPC_APPEND: u32 = 1;
const RPC_VOTE: u32 = 2;
const RPC_SNAPSHOT: u32 = 3;

/// Makes the connections to the other monitors.
#[derive(Clone)]
pub struct Network {
    pub net: Net,
    /// How monitors authenticate to each other (the shared `mon.` key).
    pub auth: spindle_proto::auth::ConnectAuth,
}

impl RaftNetworkFactory<MonRaftTypes> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            net: self.net.clone(),
            auth: self.auth.clone(),
            conn: None,
            down_since: None,
        }
    }
}

/// One other monitor, over one connection (re-opened when it breaks).
pub struct Peer {
    target: u64,
    addr: String,
    net: Net,
    auth: spindle_proto::auth::ConnectAuth,
    conn: Option<Arc<RpcConn>>,
    /// Set while the peer is unreachable: logged once when it goes, once when it comes
    /// back (openraft retries every half second; its own logging is off by default).
    down_since: Option<std::time::Instant>,
}

#[derive(Debug, thiserror::Error)]
#[error("monitor {addr}: {reason}")]
struct PeerError {
    addr: String,
    reason: String,
}

enum CallFail {
    /// Could not connect, or the connection broke: back off.
    Unreachable(PeerError),
    /// The peer refused the request (too large), or its answer did not decode.
    Other(PeerError),
    TooLarge,
}

impl Peer {
    async fn call(
        &mut self,
        rpc: u32,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, CallFail> {
        let res = self.call_once(rpc, body, timeout_ms).await;
        match (&res, self.down_since) {
            (Err(CallFail::Unreachable(e)), None) => {
                tracing::warn!("monitor {} unreachable: {e}", self.target);
                self.down_since = Some(std::time::Instant::now());
            }
            (Ok(_), Some(t)) => {
                tracing::info!(
                    "monitor {} reachable again after {:.1} s",
                    self.target,
                    t.elapsed().as_secs_f64()
                );
                self.down_since = None;
            }
            _ => {}
        }
        res
    }

    async fn call_once(
        &mut self,
        rpc: u32,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, CallFail> {
        let err = |reason: String| PeerError {
            addr: self.addr.clone(),
            reason,
        };
        if body.len() > spindle_proto::msg::RAFT_MAX {
            return Err(CallFail::TooLarge);
        }
        let conn = match &self.conn {
            Some(c) if !c.is_closed() => c.clone(),
            _ => {
                let c = RpcConn::connect_auth(
                    &self.net,
                    &self.addr,
                    timeout_ms.min(1000),
                    None,
                    &self.auth,
                )
                .await
                .map_err(|e| CallFail::Unreachable(err(e.to_string())))?;
                self.conn = Some(c.clone());
                c
            }
        };
        match conn
            .request(0, typed::MonRaft { rpc, body }, timeout_ms)
            .await
        {
            Ok(typed::MonRaftReply { body }) => Ok(body),
            Err(CallError::Net(e)) => {
                self.conn = None;
                Err(CallFail::Unreachable(err(e.to_string())))
            }
            Err(e) => Err(CallFail::Other(err(e.to_string()))),
        }
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        f: CallFail,
        entries: usize,
    ) -> RPCError<u64, BasicNode, E> {
        match f {
            CallFail::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallFail::Other(e) => RPCError::Network(NetworkError::new(&e)),
            CallFail::TooLarge => RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(
                (entries as u64 / 2).max(1),
            )),
        }
    }

    fn decode_reply<T: for<'de> Deserialize<'de>>(&self, body: &[u8]) -> Result<T, PeerError> {
        decode(body).map_err(|e| PeerError {
            addr: self.addr.clone(),
            reason: format!("bad raft reply: {e}"),
        })
    }
}

impl RaftNetwork<MonRaftTypes> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MonRaftTypes>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let n = rpc.entries.len();
        let timeout_ms = option.hard_ttl().as_millis() as u64;
        let body = self
            .call(RPC_APPEND, encode(&rpc), timeout_ms.max(100))
            .await
            .map_err(|f| self.rpc_error(f, n))?;
        let res: Result<AppendEntriesResponse<u64>, RaftError<u64>> = self
            .decode_reply(&body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let timeout_ms = option.hard_ttl().as_millis() as u64;
        let body = self
            .call(RPC_VOTE, encode(&rpc), timeout_ms.max(100))
            .await
            .map_err(|f| self.rpc_error(f, 1))?;
        let res: Result<VoteResponse<u64>, RaftError<u64>> = self
            .decode_reply(&body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<MonRaftTypes>,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<MonRaftTypes, Fatal<u64>>> {
        let timeout_ms = option.hard_ttl().as_millis() as u64;
        let req = encode(&(vote, &snapshot.meta, snapshot.snapshot.get_ref()));
        let body = match self.call(RPC_SNAPSHOT, req, timeout_ms.max(1000)).await {
            Ok(b) => b,
            Err(CallFail::Unreachable(e)) => {
                return Err(StreamingError::Unreachable(Unreachable::new(&e)))
            }
            Err(CallFail::Other(e)) => return Err(StreamingError::Network(NetworkError::new(&e))),
            Err(CallFail::TooLarge) => {
                let e = PeerError {
                    addr: self.addr.clone(),
                    reason: "snapshot larger than a raft message".into(),
                };
                return Err(StreamingError::Network(NetworkError::new(&e)));
            }
        };
        let res: Result<SnapshotResponse<u64>, Fatal<u64>> = self
            .decode_reply(&body)
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| StreamingError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// Answers a `MonRaft` request from another monitor (an error for a malformed one).
pub async fn serve_rpc(raft: &MonRaft, rpc: u32, body: &[u8]) -> Result<Vec<u8>, String> {
    match rpc {
        RPC_APPEND => {
            let req: AppendEntriesRequest<MonRaftTypes> = decode(body)?;
            Ok(encode(&raft.append_entries(req).await))
        }
        RPC_VOTE => {
            let req: VoteRequest<u64> = decode(body)?;
            Ok(encode(&raft.vote(req).await))
        }
        RPC_SNAPSHOT => {
            let (vote, meta, data): (Vote<u64>, SnapshotMeta<u64, BasicNode>, Vec<u8>) =
                decode(body)?;
            let snapshot = Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            };
            Ok(encode(&raft.install_full_snapshot(vote, snapshot).await))
        }
        other => Err(format!("unknown raft rpc {other}")),
    }
}
