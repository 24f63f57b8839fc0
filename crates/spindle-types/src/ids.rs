//! Identifiers and versions.

/// A storage daemon's id (`osd.N`).
pub type OsdId = u32;
/// A pool's id (assigned by the monitor, never reused).
pub type PoolId = u32;
/// A cluster-map epoch: every map change increments it by one.
pub type Epoch = u64;
/// A position in an erasure-coded group's shard list (0..k+m).
pub type ShardPos = u8;

/// Shard positions are folded into the high byte of a stored group number: groups stay
/// below this bound.
pub const PG_NUMBER_LIMIT: u32 = 1 << 24;

/// A placement group, as every log line, error, CLI output and `spindle status` names it:
/// `pool.pg` with the group number in lower-case hexadecimal (Ceph's format: `1.1f`). A
/// stored shard of an erasure-coded group ([`shard_pg`]) prints with Ceph's shard suffix,
/// `1.1fs2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PgId {
    pub pool: PoolId,
    /// The group number, or for a stored erasure-code shard the [`shard_pg`] encoding.
    pub pg: u32,
}

impl PgId {
    /// (group, shard position) of this id ([`split_shard_pg`]).
    pub fn split(self) -> (u32, Option<ShardPos>) {
        split_shard_pg(self.pg)
    }
}

impl std::fmt::Display for PgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match split_shard_pg(self.pg) {
            (pg, None) => write!(f, "{}.{pg:x}", self.pool),
            (pg, Some(shard)) => write!(f, "{}.{pg:x}s{shard}", self.pool),
        }
    }
}

/// Placement-group id under which a daemon stores its copy: the group itself for
/// replicated pools; for erasure-coded pools the shard position is folded into the high
/// byte (`pg | (shard + 1) << 24`), so a daemon that moves to another position of a group
/// never mistakes its old shard for the new one.
pub fn shard_pg(pg: u32, shard: Option<ShardPos>) -> u32 {
    debug_assert!(pg < PG_NUMBER_LIMIT);
    match shard {
        None => pg,
        Some(s) => pg | ((s as u32 + 1) << 24),
    }
}

/// Inverse of [`shard_pg`]: (group, shard position).
pub fn split_shard_pg(stored: u32) -> (u32, Option<ShardPos>) {
    let high = stored >> 24;
    if high == 0 {
        (stored, None)
    } else {
        (stored & (PG_NUMBER_LIMIT - 1), Some((high - 1) as ShardPos))
    }
}

/// An object's version within its placement group, ordered by (epoch, seq): the primary
/// assigns `(its map epoch, last seq + 1)`, so a new interval's writes sort after anything
/// left over from an older one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    pub epoch: Epoch,
    pub seq: u64,
}

impl Version {
    /// Before any write.
    pub const ZERO: Version = Version { epoch: 0, seq: 0 };
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}'{}", self.epoch, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_ids_print_as_ceph_does() {
        assert_eq!(PgId { pool: 1, pg: 0x1f }.to_string(), "1.1f");
        let stored = PgId {
            pool: 1,
            pg: shard_pg(0x1f, Some(2)),
        };
        assert_eq!(stored.to_string(), "1.1fs2");
        assert_eq!(stored.split(), (0x1f, Some(2)));
    }

    #[test]
    fn shard_encoding_round_trips() {
        for pg in [0, 1, 5, PG_NUMBER_LIMIT - 1] {
            for shard in [None, Some(0), Some(3), Some(254)] {
                assert_eq!(split_shard_pg(shard_pg(pg, shard)), (pg, shard));
            }
        }
    }

    #[test]
    fn versions_order_by_epoch_then_seq() {
        let a = Version { epoch: 3, seq: 900 };
        let b = Version { epoch: 4, seq: 1 };
        assert!(Version::ZERO < a && a < b);
        assert_eq!(a.to_string(), "3'900");
    }
}
