//! One fan-out helper for every write sent to several copies (replicated writes,
//! erasure-coded shard writes; Garage's `rpc_helper` is the model): the requests are all
//! started first (queued on each copy's ordered connection), then every answer is awaited
//! and classified the same way, so the two write paths differ only in what they do with a
//! failure.

use spindle_proto::msg::typed;
use spindle_proto::net::PendingReply;
use spindle_proto::request::{reply_to, CallError, RemoteError};
use spindle_proto::ErrorCode;

/// Why one copy did not acknowledge.
#[derive(Debug)]
pub(crate) enum CopyFailure {
    /// The copy's disk is full (it refused before applying).
    NoSpace(String),
    /// The copy has a newer map (attached): the sender installs it; the write is retried.
    NewerMap(Vec<u8>),
    /// Any other error reply from the copy.
    Refused { code: ErrorCode, message: String },
    /// A reply that is not an answer to a write.
    Unexpected(&'static str),
    /// No reply: timeout or connection lost.
    Transport(String),
}

impl std::fmt::Display for CopyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyFailure::NoSpace(m) => write!(f, "{m}"),
            CopyFailure::NewerMap(_) => write!(f, "has a newer map"),
            CopyFailure::Refused { code, message } => write!(f, "{code:?}: {message}"),
            CopyFailure::Unexpected(name) => write!(f, "answered {name}"),
            CopyFailure::Transport(e) => write!(f, "{e}"),
        }
    }
}

/// The answers of one fan-out: the copies that did not acknowledge, in the order the
/// requests were sent.
pub(crate) struct FanOut<K> {
    pub(crate) failures: Vec<(K, CopyFailure)>,
}

/// Waits for every copy's answer to requests already started (the wait lasts as long as
/// the slowest copy, each bounded by `timeout_ms`).
pub(crate) async fn wait_all<K>(pending: Vec<(K, PendingReply)>, timeout_ms: u64) -> FanOut<K> {
    let mut failures = Vec::new();
    for (key, reply) in pending {
        let failure = match reply.wait(timeout_ms).await {
            Ok(inc) => match reply_to::<typed::RepWrite>(inc.msg) {
                Ok(typed::Ok {}) => continue,
                Err(CallError::Remote(RemoteError {
                    code: ErrorCode::NoSpace,
                    message,
                    ..
                })) => CopyFailure::NoSpace(message),
                Err(CallError::Remote(RemoteError {
                    code: ErrorCode::StaleMap,
                    map,
                    ..
                })) => CopyFailure::NewerMap(map),
                Err(CallError::Remote(RemoteError { code, message, .. })) => {
                    CopyFailure::Refused { code, message }
                }
                Err(CallError::Unexpected { got, .. }) => CopyFailure::Unexpected(got),
                Err(e @ CallError::Net(_)) => CopyFailure::Transport(e.to_string()),
            },
            Err(e) => CopyFailure::Transport(e.to_string()),
        };
        failures.push((key, failure));
    }
    FanOut { failures }
}
