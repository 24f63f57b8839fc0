//! Error codes carried on the wire (`ErrorReply` in `spindle-proto`).

/// Why a request failed, as the receiver tells the sender. The numeric values are the
/// wire encoding (a `u16`) and never change meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u16)]
pub enum ErrorCode {
    /// The object does not exist.
    #[error("not found")]
    NotFound = 1,
    /// The sender's map is older than the receiver's: the newer map is attached; retry.
    #[error("stale map")]
    StaleMap = 2,
    /// The receiver's map is older than the sender's: push it the map, then retry.
    #[error("receiver needs the newer map")]
    NeedMap = 3,
    /// The receiver is not the primary of that placement group at the sender's epoch.
    #[error("not the primary")]
    NotPrimary = 4,
    /// Temporarily unable (peering, recovering, too few copies up): retry later.
    #[error("try again")]
    Again = 5,
    /// Stored data failed its checksum and no good copy was found.
    #[error("corrupt")]
    Corrupt = 6,
    /// The request is malformed or not allowed.
    #[error("invalid request")]
    Invalid = 7,
    /// An I/O error on the daemon.
    #[error("I/O error")]
    Io = 8,
    /// No such pool or placement group.
    #[error("no such pool")]
    NoSuchPool = 9,
    /// Anything else.
    #[error("internal error")]
    Internal = 10,
    /// The object changed since the version a conditional write was based on: re-read and
    /// retry.
    #[error("conflict")]
    Conflict = 11,
    /// The daemon's disk (or the pool) is full: free space (deletes always work) and retry.
    #[error("no space left")]
    NoSpace = 12,
    /// The receiver is out of its budget for incoming payloads: retry after a short wait.
    #[error("busy")]
    Busy = 13,
    /// The sender is fenced: another client took over the image lock it held, and its
    /// writes are refused. Final: the sender must stop serving the image.
    #[error("fenced")]
    Fenced = 14,
    /// The monitor that got the request is not the leader of the monitors and could not
    /// pass it on (no leader elected, or the leader unreachable): try another monitor.
    #[error("no monitor leader")]
    NoLeader = 15,
    /// Authentication failed: no key, a wrong key, an unknown entity, an expired ticket or
    /// a replayed handshake. Final: the connection is closed.
    #[error("authentication failed")]
    AuthFailed = 16,
    /// The authenticated entity's capabilities do not allow this request.
    #[error("permission denied")]
    Denied = 17,
    /// A write to an image's data object carried another snapshot guard than the image's
    /// newest snapshot in the daemon's map: the writer must preserve the object's content
    /// for that snapshot first, then retry (not retried by the client library: the image
    /// layer decides).
    #[error("image snapshot changed")]
    SnapChanged = 18,
    /// The daemon does not hold the program a run names: send the run again with the
    /// program's object file (the client library does).
    #[error("program not loaded")]
    ProgramUnknown = 19,
    /// The program was refused (it does not load or verify) or stopped by a limit or a
    /// fault: the message says which. Final for this run.
    #[error("program failed")]
    ProgramFailed = 20,
}

impl ErrorCode {
    /// Every code, in wire order.
    pub const ALL: [ErrorCode; 20] = [
        Self::NotFound,
        Self::StaleMap,
        Self::NeedMap,
        Self::NotPrimary,
        Self::Again,
        Self::Corrupt,
        Self::Invalid,
        Self::Io,
        Self::NoSuchPool,
        Self::Internal,
        Self::Conflict,
        Self::NoSpace,
        Self::Busy,
        Self::Fenced,
        Self::NoLeader,
        Self::AuthFailed,
        Self::Denied,
        Self::SnapChanged,
        Self::ProgramUnknown,
        Self::ProgramFailed,
    ];

    /// The code with wire value `v`, None for a value no version of Spindle sends.
    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| *c as u16 == v)
    }

    /// Whether the sender should retry the same request (after refreshing its map where the
    /// code says so) rather than report the error.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::StaleMap | Self::NeedMap | Self::NotPrimary | Self::Again | Self::Busy
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_unknown_values_are_refused() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(*c as u16, i as u16 + 1);
            assert_eq!(ErrorCode::from_u16(*c as u16), Some(*c));
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::from_u16(21), None);
    }
}
