//! Requests name their reply type.
//!
//! Every request message (a struct of [`crate::msg::typed`]) implements [`Request`], whose
//! `Reply` is what the receiver answers with (any request may instead be answered with
//! `Error`). [`crate::net::RpcConn::request`] sends one and returns the typed reply; an
//! `Error` reply becomes [`CallError::Remote`] (its [`ErrorCode`] kept) and a reply of
//! another kind [`CallError::Unexpected`], so callers no longer match
//! `other => "unexpected ..."` by hand. [`reply_to`] does the same for callers that sent
//! the message themselves (retry loops).

use crate::msg::{typed, ErrorCode, Msg, MsgKind};
use crate::net::NetError;

/// A reply type: built from the received message, or that message given back when it is
/// of another kind.
pub trait Reply: Sized {
    /// What was expected, for [`CallError::Unexpected`].
    const EXPECTED: &'static str;
    /// The message given back is as large as any message: moving it is the point.
    #[allow(clippy::result_large_err)]
    fn from_msg(msg: Msg) -> Result<Self, Msg>;
}

/// A request message and the type of its reply.
pub trait Request: Into<Msg> {
    type Reply: Reply;
}

/// An administrative command: it travels as its argument list (`Msg::Command { args }`)
/// and is answered with JSON in `CommandReply`, which deserializes into `Reply`
/// (implemented by `spindle_mon::Admin<R>`, which pairs each command with its answer).
pub trait AdminRequest {
    type Reply;
    fn args(&self) -> Vec<String>;
}

/// An `Error` reply from the peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RemoteError {
    pub code: ErrorCode,
    pub message: String,
    /// The newer map with `StaleMap` (else empty).
    pub map: Vec<u8>,
}

/// Why a typed call did not produce its reply.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CallError {
    /// No reply (connection, timeout, bad frame).
    #[error(transparent)]
    Net(#[from] NetError),
    /// The peer answered with an error.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The peer answered with a message of the wrong kind (a protocol error).
    #[error("protocol error: expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
}

impl CallError {
    /// The error code of a [`CallError::Remote`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CallError::Remote(e) => Some(e.code),
            _ => None,
        }
    }
}

/// The typed reply of request type `R` from the message received for it.
pub fn reply_to<R: Request>(msg: Msg) -> Result<R::Reply, CallError> {
    match msg {
        Msg::Error { code, message, map } => {
            Err(CallError::Remote(RemoteError { code, message, map }))
        }
        other => R::Reply::from_msg(other).map_err(|m| CallError::Unexpected {
            expected: R::Reply::EXPECTED,
            got: m.name(),
        }),
    }
}

macro_rules! replies {
    ($($kind:ident),* $(,)?) => {$(
        impl Reply for typed::$kind {
            const EXPECTED: &'static str = stringify!($kind);
            fn from_msg(msg: Msg) -> Result<Self, Msg> {
                typed::$kind::try_from(msg)
            }
        }
    )*};
}

// The message kinds that are replies.
replies!(
    MapUpdate,
    AuthTicket,
    HeartbeatAck,
    CommandReply,
    ObjReply,
    PgInfo,
    ObjState,
    ScrubResult,
    ScrubMap,
    MonRaftReply,
    PeerPong,
    Ok
);

/// The reply to `GetMap` without `subscribe`: the map if newer than the caller's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapReply {
    /// The encoded map (newer than `have_epoch`).
    Newer(Vec<u8>),
    /// The caller's epoch is current.
    Current,
}

impl Reply for MapReply {
    const EXPECTED: &'static str = "MapUpdate or Ok";
    fn from_msg(msg: Msg) -> Result<Self, Msg> {
        match msg {
            Msg::MapUpdate { map } => Ok(MapReply::Newer(map)),
            Msg::Ok => Ok(MapReply::Current),
            other => Err(other),
        }
    }
}

macro_rules! requests {
    ($($req:ident => $reply:ty),* $(,)?) => {
        $( impl Request for typed::$req {
            type Reply = $reply;
        } )*

        /// The reply kind of each request kind (None: not a request). `GetMap` is answered
        /// with `MapUpdate` (or `Ok` when the caller is current).
        pub fn reply_kind(kind: MsgKind) -> Option<&'static str> {
            match kind {
                $( MsgKind::$req => Some(<$reply as Reply>::EXPECTED), )*
                _ => None,
            }
        }
    };
}

requests! {
    // Monitor protocol.
    OsdBoot => typed::MapUpdate,
    Heartbeat => typed::HeartbeatAck,
    GetMap => MapReply,
    Command => typed::CommandReply,
    MonRaft => typed::MonRaftReply,
    PeerPing => typed::PeerPong,
    AuthTicketGet => typed::AuthTicket,
    // Client protocol.
    ObjRequest => typed::ObjReply,
    ScrubPg => typed::ScrubResult,
    // Replication protocol.
    RepWrite => typed::Ok,
    // Peering and recovery protocol.
    PgQuery => typed::PgInfo,
    PgList => typed::ObjReply,
    PgMark => typed::Ok,
    ObjPull => typed::ObjState,
    ObjState => typed::Ok,
    PgSetLog => typed::Ok,
    PgCleanQuery => typed::Ok,
    // Erasure-code shard protocol.
    ShardRead => typed::ObjReply,
    ShardExec => typed::ObjReply,
    // Scrub protocol.
    ScrubQuery => typed::ScrubMap,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_the_right_kind_is_typed_an_error_keeps_its_code() {
        let r = reply_to::<typed::PgQuery>(Msg::PgInfo {
            last_version: Default::default(),
            log_tail: Default::default(),
            log: vec![],
            incomplete: true,
        })
        .unwrap();
        assert!(r.incomplete);
        let e = reply_to::<typed::ObjPull>(Msg::Error {
            code: ErrorCode::StaleMap,
            message: "newer".into(),
            map: vec![7],
        })
        .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::StaleMap));
        match e {
            CallError::Remote(r) => assert_eq!(r.map, vec![7]),
            other => panic!("{other:?}"),
        }
        let e = reply_to::<typed::ScrubQuery>(Msg::Ok).unwrap_err();
        assert!(
            matches!(
                e,
                CallError::Unexpected {
                    expected: "ScrubMap",
                    got: "ok"
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            reply_to::<typed::GetMap>(Msg::Ok).unwrap(),
            MapReply::Current
        );
        assert_eq!(
            reply_to::<typed::GetMap>(Msg::MapUpdate { map: vec![1] }).unwrap(),
            MapReply::Newer(vec![1])
        );
    }

    #[test]
    fn requests_and_replies_are_different_kinds() {
        let requests: Vec<MsgKind> = MsgKind::ALL
            .iter()
            .copied()
            .filter(|k| reply_kind(*k).is_some())
            .collect();
        assert_eq!(requests.len(), 20);
        for k in [
            MsgKind::Ok,
            MsgKind::Error,
            MsgKind::MapUpdate,
            MsgKind::PgInfo,
            MsgKind::MonRaftReply,
            MsgKind::PeerPong,
            MsgKind::AuthTicket,
        ] {
            assert_eq!(reply_kind(k), None, "{k:?}");
        }
        assert_eq!(reply_kind(MsgKind::MonRaft), Some("MonRaftReply"));
        assert_eq!(reply_kind(MsgKind::ShardRead), Some("ObjReply"));
        assert_eq!(reply_kind(MsgKind::AuthTicketGet), Some("AuthTicket"));
    }
}
