//! `spindle-types`: the vocabulary every cluster layer shares.
//!
//! - [`ids`]: placement-group ids ([`PgId`], with the stored-shard encoding of erasure-coded
//!   groups), object versions ([`Version`]), and the named integer ids ([`OsdId`],
//!   [`PoolId`], [`Epoch`], [`ShardPos`]).
//! - [`limits`]: every limit that more than one crate relies on, each with its reason, and
//!   compile-time assertions of how they relate (an object fits a message, a message fits a
//!   frame, one name limit for the protocol and the store, ...).
//! - [`Mutation`]: a change to one object (what the store applies and replication carries).
//! - [`ErrorCode`]: the error codes carried on the wire.
//! - [`crc`]: CRC32C (the `spindle-crc` kernel), block checksums and their combination.
//! - [`sync::lock`]: the one poison-tolerant lock helper.
//!
//! Layering: this crate sits right above the kernels (it re-exports `spindle-crc`) and below
//! every cluster crate (`spindle-proto`, `spindle-store`, `spindle-map`, the daemons and the
//! client). It does no I/O and holds no state.

pub mod error_code;
pub mod histogram;
pub mod ids;
pub mod limits;
pub mod mutation;
pub mod sync;

/// CRC32C: `crc32c`, `crc32c_append`, `crc32c_combine`, the 4 KiB block checksums
/// (`crc32c_blocks`, `crc32c_of_blocks`, `CRC_BLOCK_BYTES`) and the engines.
pub use spindle_crc as crc;

pub use error_code::ErrorCode;
pub use ids::{shard_pg, split_shard_pg, Epoch, OsdId, PgId, PoolId, ShardPos, Version};
pub use mutation::{check_extents, extent_pieces, Extent, ExtentsError, Mutation};
