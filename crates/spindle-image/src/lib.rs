//! `spindle-image`: block images on the object store.
//!
//! - [`admin`]: whole-image operations with the cluster's bookkeeping (lock, snapshot
//!   record, clone lists): removal, work under the image's lock.
//! - [`image`]: an image is a header object and data objects of a fixed size
//!   (`img.NAME.header`, `img.NAME.%016x`), thin, resizable; [`Image`] is generic over an
//!   [`ObjectBackend`] (the cluster client, or `MemoryBackend` in tests).
//! - [`block`]: the block layer over an image (DeLiBA's LRU cache and coalescing
//!   scheduler, write ordering and flush).
//! - [`lock`]: the exclusive lock of an image opened for writing (lease, takeover,
//!   fencing).
//! - [`nbd`]: the images of a pool as NBD exports (`spindle nbd`).
//! - [`qos`]: per-image limits (IOPS, bytes/s, bursts) and I/O statistics where an image
//!   is served.
//! - [`snap`]: snapshots (client-side copy-on-write of whole objects, guarded by the
//!   daemons), their reading, removal and rollback.
//! - [`clone`]: clones of snapshots (a child reading what it has not written from its
//!   parent snapshot, copy-up before its first change of an object), flatten.
//! - [`diff`]: changed extents between snapshots (from the snapshot copies), and the
//!   checksummed diff stream of `export-diff` / `import-diff`.
//! - [`transfer`]: raw export and import (holes stay holes), and space accounting.
//!
//! Layering: above `spindle-client` (objects) and `spindle-nbd` (the NBD server, generic
//! over a block-device trait); the `spindle` binary uses it.

pub mod admin;
pub mod block;
pub mod clone;
pub mod diff;
pub mod image;
pub mod lock;
pub mod nbd;
pub mod qos;
pub mod snap;
pub mod transfer;
pub mod wlog;

pub use block::{BlockConfig, BlockLayer, BlockStats};
pub use image::{Image, ImageError, ImageInfo, ObjectBackend, ObjectWrite};
