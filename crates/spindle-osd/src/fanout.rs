//! One fan-out helper for every write sent to several copies (replicated writes,
//! erasure-coded shard writes; Garage's `rpc_helper` is the model): the requests are all
//! started first (queued on each copy's ordered connection), then every answer is awaited
//! and classified the same way, so the two write paths differ only in what they do with a
//! failure.

use spindle_proto::msg::typed;
use spindle_proto::net::PendingReply;
use spindle_proto::request::{reply_to, CallError, RemoteError};
use spindle_proto::ErrorCode;
use tokio::sync::watch;

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
///
/// A copy that a newer map marks down fails at once (`gone` says why, checked whenever
/// `maps` announces an installed map) instead of holding the write until `timeout_ms`:
/// a host cut off held every write in flight to its daemons for the whole replica timeout
/// (10 s) although the monitors had marked them down after 2 s (`tests/netns.rs` (b)).
/// Failing early is as safe as the timeout: the write is not acknowledged, and the group
/// re-peers, which settles a copy that applied it anyway.
pub(crate) async fn wait_all<K>(
    pending: Vec<(K, PendingReply)>,
    timeout_ms: u64,
    mut maps: watch::Receiver<u64>,
    gone: impl Fn(&K) -> Option<String>,
) -> FanOut<K> {
    let mut failures = Vec::new();
    for (key, reply) in pending {
        // A map installed before this wait (before the caller subscribed, or while an
        // earlier copy was awaited) counts too: look at `gone` once first (an answer
        // already in wins: the select is biased towards it).
        maps.mark_changed();
        let wait = reply.wait(timeout_ms);
        tokio::pin!(wait);
        let mut watching = true;
        let answer = loop {
            tokio::select! {
                biased;
                r = &mut wait => break r,
                changed = maps.changed(), if watching => {
                    // The daemon never drops its sender while writes run; if it did, the
                    // timeout still bounds the wait.
                    watching = changed.is_ok();
                    if let Some(why) = gone(&key) {
                        break Err(spindle_proto::net::NetError::Closed(why));
                    }
                }
            }
        };
        let failure = match answer {
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
