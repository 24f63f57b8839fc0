//! Block images: a byte-addressed volume striped over objects of a pool.
//!
//! Layout in the cluster (all in the image's pool):
//! - `img.<name>.header`: a JSON [`ImageHeader`] (format version, size, object size,
//!   creation time), written whole with `write_full`.
//! - `img.<name>.<index>` (index = 16 lower-case hex digits): the data of bytes
//!   `[index * object_size_bytes, (index + 1) * object_size_bytes)` of the image.
//!
//! Invariants:
//! - Thin: a data object exists only if some byte of its range was written (with non-zero
//!   intent); reads of missing objects and of bytes past an object's end return zeros.
//!   Zeroing never creates an object.
//! - No object holds data at or past the image end *that a later grow could expose*: a
//!   shrink deletes/truncates the objects past the new end, and a grow first clears the
//!   newly exposed range (repairing what a shrink interrupted by a crash left behind).
//! - An image name is 1..=64 bytes of `[A-Za-z0-9._-]`, so object names are unambiguous:
//!   a data object's suffix after `img.<name>.` is exactly 16 hex digits, a header's is
//!   `header`.
//! - Every write the backend acknowledged is durable (the cluster acks after all up
//!   replicas journaled it), so [`Image::flush`] only waits for writes in flight.
//!
//! Concurrency: operations on disjoint byte ranges may run concurrently from any number
//! of tasks. Concurrent operations on overlapping ranges have no defined order (as on a
//! disk); [`crate::block::BlockLayer`] orders them. [`Image::resize`] must not race with
//! I/O to the range it removes or adds.

use serde::{Deserialize, Serialize};
use spindle_client::{Client, ClientError};
use std::collections::BTreeSet;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Notify;

/// Current header format version.
pub const IMAGE_FORMAT_VERSION: u32 = 1;
/// Header format version of a clone (a header with a parent): a build that does not know
/// clones refuses it, instead of reading zeros where the parent has data.
pub const CLONE_FORMAT_VERSION: u32 = 2;
/// Default size of one data object.
pub const OBJECT_SIZE_BYTES_DEFAULT: u64 = 4 << 20;
/// Default data object size on erasure-coded pools: a small write there is stored as a
/// delta slot, but after a few writes to one object (12 KiB of changes) its shard
/// (object_size / k bytes) is rewritten whole, so objects are kept small; every object
/// write is a round of shard writes and slot trims, so sequential I/O wants them large.
/// Measured with `spindle bench fio --quick --pool EC` (k=2, m=1, against Ceph RBD EC
/// 2+1), before delta slots: 4 MiB objects: 4k random writes 82 IOPS; 64 KiB: 1,165 IOPS
/// (3.8x Ceph) but 512k writes 106 MB/s (0.58x) and reads 407 MB/s; 256 KiB: 787 IOPS
/// (2.6x), 512k writes 195 MB/s (1.07x) and reads 769 MB/s (2.3x). With delta slots
/// (2026-11-27, one run each): 1 MiB: 4k random writes 782 IOPS, 512k writes 226 MB/s;
/// 256 KiB: 1,504 IOPS, 161 MB/s.
pub const OBJECT_SIZE_BYTES_DEFAULT_ERASURE: u64 = 256 << 10;

/// The default object size for an image on `pool` (None: no such pool).
pub fn default_object_size(map: &spindle_map::ClusterMap, pool: &str) -> Option<u64> {
    map.pool_by_name(pool).map(|p| {
        if p.is_erasure() {
            OBJECT_SIZE_BYTES_DEFAULT_ERASURE
        } else {
            OBJECT_SIZE_BYTES_DEFAULT
        }
    })
}
/// Smallest allowed data object.
pub const OBJECT_SIZE_BYTES_MIN: u64 = 4 << 10;
/// Largest allowed data object (the object API's limit).
pub const OBJECT_SIZE_BYTES_MAX: u64 = spindle_client::OBJECT_BYTES_MAX;
/// Image sizes are multiples of this (the block device sector).
pub const SECTOR_BYTES: u64 = 512;
/// Largest image (keeps every offset computation far from u64 overflow).
pub const IMAGE_SIZE_BYTES_MAX: u64 = 1 << 60;
/// Longest image name (`spindle_types::limits::IMAGE_NAME_BYTES_MAX`).
pub const IMAGE_NAME_BYTES_MAX: usize = spindle_types::limits::IMAGE_NAME_BYTES_MAX;
/// Object operations one image call keeps in flight at most.
pub const PARALLEL_OPS_MAX: usize = 32;
/// Above this many objects in a range, removal lists the pool to find the objects that
/// exist instead of deleting every index blindly.
pub const BLIND_DELETE_OBJECTS_MAX: u64 = 1024;

const _: () = assert!(OBJECT_SIZE_BYTES_MIN.is_power_of_two());
const _: () = assert!(OBJECT_SIZE_BYTES_MAX.is_power_of_two());
const _: () = assert!(OBJECT_SIZE_BYTES_DEFAULT >= OBJECT_SIZE_BYTES_MIN);
const _: () = assert!(OBJECT_SIZE_BYTES_DEFAULT <= OBJECT_SIZE_BYTES_MAX);

/// Errors of image operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The range `[offset, offset + len)` is not inside the image.
    #[error("range {offset}+{len} is outside the image (size {size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// No image of that name in the pool.
    #[error("no such image: {0}")]
    NotFound(String),
    /// `create` found an image of that name.
    #[error("image already exists: {0}")]
    Exists(String),
    /// The name breaks the naming rule.
    #[error("invalid image name {0:?}: 1..=64 characters of [A-Za-z0-9._-]")]
    InvalidName(String),
    /// A size that is not a multiple of 512 or too large.
    #[error("invalid image size {0} bytes: must be a multiple of 512 and at most 2^60")]
    InvalidSize(u64),
    /// An object size that is not a power of two in 4 KiB..=32 MiB.
    #[error("invalid object size {0} bytes: must be a power of two in 4 KiB..=32 MiB")]
    InvalidObjectSize(u64),
    /// The header object cannot be decoded or has an unknown format version.
    #[error("corrupt image header of {name}: {reason}")]
    CorruptHeader { name: String, reason: String },
    /// The object layer failed.
    #[error(transparent)]
    Backend(#[from] ClientError),
    /// A block layer configuration value is out of its range.
    #[error("invalid block layer configuration: {0}")]
    InvalidConfig(String),
    /// An internal task died (a bug).
    #[error("internal task failed: {0}")]
    Task(String),
    /// Another client holds the image's exclusive lock (the monitor's refusal, naming it).
    #[error("{0}")]
    Locked(String),
    /// This process lost the image's lock (taken over, or fenced): it serves the image no
    /// more.
    #[error("image lock lost, not serving the image any more: {0}")]
    Fenced(String),
    /// The client write log failed (`crate::wlog`).
    #[error("{0}")]
    WriteLog(String),
    /// A write to a read-only view (a snapshot).
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// A snapshot operation was refused (a bad name, a protected snapshot, ...).
    #[error("{0}")]
    Snapshot(String),
    /// No snapshot of that name (`IMAGE@SNAP`).
    #[error("no snapshot {0}")]
    NoSnapshot(String),
    /// An image setting is refused (`spindle image config`).
    #[error("invalid setting: {0}")]
    InvalidSetting(String),
}

impl ImageError {
    /// A copy of this error (for handing one backend failure to several waiters).
    pub fn duplicate(&self) -> ImageError {
        match self {
            ImageError::OutOfRange { offset, len, size } => ImageError::OutOfRange {
                offset: *offset,
                len: *len,
                size: *size,
            },
            ImageError::NotFound(s) => ImageError::NotFound(s.clone()),
            ImageError::Exists(s) => ImageError::Exists(s.clone()),
            ImageError::InvalidName(s) => ImageError::InvalidName(s.clone()),
            ImageError::InvalidSize(s) => ImageError::InvalidSize(*s),
            ImageError::InvalidObjectSize(s) => ImageError::InvalidObjectSize(*s),
            ImageError::CorruptHeader { name, reason } => ImageError::CorruptHeader {
                name: name.clone(),
                reason: reason.clone(),
            },
            ImageError::Backend(e) => ImageError::Backend(e.clone()),
            ImageError::InvalidConfig(s) => ImageError::InvalidConfig(s.clone()),
            ImageError::Task(s) => ImageError::Task(s.clone()),
            ImageError::Locked(s) => ImageError::Locked(s.clone()),
            ImageError::Fenced(s) => ImageError::Fenced(s.clone()),
            ImageError::WriteLog(s) => ImageError::WriteLog(s.clone()),
            ImageError::ReadOnly(s) => ImageError::ReadOnly(s.clone()),
            ImageError::Snapshot(s) => ImageError::Snapshot(s.clone()),
            ImageError::NoSnapshot(s) => ImageError::NoSnapshot(s.clone()),
            ImageError::InvalidSetting(s) => ImageError::InvalidSetting(s.clone()),
        }
    }
}

/// The object operations an image needs. Implemented for [`Client`]; tests use
/// [`MemoryBackend`]. Semantics follow the object API: writes create the object and
/// gaps read as zeros; reads are short at the end of the object; `read_object`,
/// `delete_object` and `stat_object` fail with [`ClientError::NotFound`] when the object
/// does not exist.
pub trait ObjectBackend: Send + Sync + 'static {
    /// Reads up to `len` bytes at `offset`.
    fn read_object(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, ClientError>> + Send;
    /// Writes `data` at `offset` (creates the object).
    fn write_object(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// Writes several extents of the object as one operation (`data`: their bytes one
    /// after the other; extents sorted, not overlapping). The default sends one write per
    /// extent, in order (backends without a multi-extent operation, e.g. test doubles).
    fn write_object_extents(
        &self,
        pool: &str,
        name: &str,
        extents: Vec<spindle_types::Extent>,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(), ClientError>> + Send {
        async move {
            for (offset, piece) in spindle_types::extent_pieces(&extents, &data) {
                self.write_object(pool, name, offset, piece.to_vec())
                    .await?;
            }
            Ok(())
        }
    }
    /// Replaces the whole object.
    fn write_full_object(
        &self,
        pool: &str,
        name: &str,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// Sets the object's size (bytes past it are dropped).
    fn truncate_object(
        &self,
        pool: &str,
        name: &str,
        size_bytes: u64,
    ) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// Deletes the object.
    fn delete_object(
        &self,
        pool: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// The object's size in bytes.
    fn stat_object(
        &self,
        pool: &str,
        name: &str,
    ) -> impl Future<Output = Result<u64, ClientError>> + Send;
    /// Names of every object of the pool.
    fn list_objects(
        &self,
        pool: &str,
    ) -> impl Future<Output = Result<Vec<String>, ClientError>> + Send;
    /// The snapshot guard of `image` in this backend's view of the cluster map
    /// (`spindle_map::ImageSnaps::guard`; 0: no live snapshot). Backends without snapshots
    /// keep the default.
    fn snap_guard(&self, _pool: &str, _image: &str) -> u64 {
        0
    }
    /// The snapshots of `image` in this backend's view (None: none ever taken).
    fn image_snaps(&self, _pool: &str, _image: &str) -> Option<spindle_map::ImageSnaps> {
        None
    }
    /// Runs `fut` (writes of one data object) with snapshot guard `guard`
    /// (`spindle_client::with_snap_guard`). The default ignores it.
    fn with_guard<F: Future + Send>(
        &self,
        _guard: u64,
        fut: F,
    ) -> impl Future<Output = F::Output> + Send {
        fut
    }
}

impl ObjectBackend for Client {
    fn read_object(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<u8>, ClientError>> + Send {
        Client::read(self, pool, name, offset, len)
    }

    async fn write_object(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<(), ClientError> {
        Client::write(self, pool, name, offset, data)
            .await
            .map(|_| ())
    }

    async fn write_full_object(
        &self,
        pool: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<(), ClientError> {
        Client::write_full(self, pool, name, data).await.map(|_| ())
    }

    fn write_object_extents(
        &self,
        pool: &str,
        name: &str,
        extents: Vec<spindle_types::Extent>,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(), ClientError>> + Send {
        Client::write_extents(self, pool, name, extents, data)
    }

    async fn truncate_object(
        &self,
        pool: &str,
        name: &str,
        size_bytes: u64,
    ) -> Result<(), ClientError> {
        Client::truncate(self, pool, name, size_bytes)
            .await
            .map(|_| ())
    }

    fn delete_object(
        &self,
        pool: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), ClientError>> + Send {
        Client::delete(self, pool, name)
    }

    async fn stat_object(&self, pool: &str, name: &str) -> Result<u64, ClientError> {
        Client::stat(self, pool, name).await.map(|s| s.size_bytes)
    }

    async fn list_objects(&self, pool: &str) -> Result<Vec<String>, ClientError> {
        Client::list(self, pool)
            .await
            .map(|l| l.into_iter().map(|o| o.name).collect())
    }

    fn snap_guard(&self, pool: &str, image: &str) -> u64 {
        Client::snap_guard(self, pool, image)
    }

    fn image_snaps(&self, pool: &str, image: &str) -> Option<spindle_map::ImageSnaps> {
        Client::image_snaps(self, pool, image)
    }

    fn with_guard<F: Future + Send>(
        &self,
        guard: u64,
        fut: F,
    ) -> impl Future<Output = F::Output> + Send {
        spindle_client::with_snap_guard(guard, fut)
    }
}

/// The header record (`img.<name>.header`), JSON-encoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHeader {
    /// [`IMAGE_FORMAT_VERSION`] of the writer; unknown versions are refused.
    pub format_version: u32,
    /// Size of the volume.
    pub size_bytes: u64,
    /// Size of one data object (power of two).
    pub object_size_bytes: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix_secs: u64,
    /// A clone's parent snapshot ([`CLONE_FORMAT_VERSION`] headers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentSpec>,
    /// Limits where the image is served (`crate::qos`); a build that does not know them
    /// serves the image unlimited.
    #[serde(default, skip_serializing_if = "crate::qos::QosSpec::is_unlimited")]
    pub qos: crate::qos::QosSpec,
}

/// Where a clone reads the ranges it has not written: snapshot `snap` (id `snap_id`) of
/// image `image` in pool `pool`, for the image's first `overlap_bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentSpec {
    pub pool: String,
    pub image: String,
    pub snap: String,
    pub snap_id: u64,
    /// Bytes of the image that read through to the parent where the clone has no data
    /// object (the snapshot's size at clone time, cut by later shrinks).
    pub overlap_bytes: u64,
}

impl ImageHeader {
    fn decode(name: &str, data: &[u8]) -> Result<ImageHeader, ImageError> {
        let corrupt = |reason: String| ImageError::CorruptHeader {
            name: name.to_string(),
            reason,
        };
        let h: ImageHeader = serde_json::from_slice(data).map_err(|e| corrupt(e.to_string()))?;
        let expected = if h.parent.is_some() {
            CLONE_FORMAT_VERSION
        } else {
            IMAGE_FORMAT_VERSION
        };
        if h.format_version != expected {
            return Err(corrupt(format!(
                "format version {} (this build reads {IMAGE_FORMAT_VERSION}, and \
                 {CLONE_FORMAT_VERSION} for clones)",
                h.format_version
            )));
        }
        h.qos.check().map_err(|e| corrupt(format!("qos: {e}")))?;
        if let Some(p) = &h.parent {
            if p.overlap_bytes > h.size_bytes || p.snap_id == 0 {
                return Err(corrupt(format!("bad parent {p:?}")));
            }
        }
        check_object_size(h.object_size_bytes).map_err(|e| corrupt(e.to_string()))?;
        check_size(h.size_bytes).map_err(|e| corrupt(e.to_string()))?;
        Ok(h)
    }

    fn encode(&self) -> Vec<u8> {
        // Serializing a struct of integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What `ls`/`info` show about an image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImageInfo {
    pub name: String,
    pub pool: String,
    pub size_bytes: u64,
    pub object_size_bytes: u64,
    /// Data objects the image spans (not how many exist: images are thin).
    pub object_count: u64,
    pub created_unix_secs: u64,
    pub format_version: u32,
    /// A clone's parent snapshot, `POOL/IMAGE@SNAP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Bytes a clone reads from its parent where it has no data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_bytes: Option<u64>,
    /// Limits where it is served.
    #[serde(skip_serializing_if = "crate::qos::QosSpec::is_unlimited")]
    pub qos: crate::qos::QosSpec,
}

/// Checks the image naming rule.
pub fn check_image_name(name: &str) -> Result<(), ImageError> {
    if spindle_types::limits::is_simple_name(name, IMAGE_NAME_BYTES_MAX) {
        Ok(())
    } else {
        Err(ImageError::InvalidName(name.to_string()))
    }
}

fn check_object_size(object_size_bytes: u64) -> Result<(), ImageError> {
    if object_size_bytes.is_power_of_two()
        && (OBJECT_SIZE_BYTES_MIN..=OBJECT_SIZE_BYTES_MAX).contains(&object_size_bytes)
    {
        Ok(())
    } else {
        Err(ImageError::InvalidObjectSize(object_size_bytes))
    }
}

/// Checks an image size (a multiple of 512, at most 2^60).
pub fn check_size_bytes(size_bytes: u64) -> Result<(), ImageError> {
    check_size(size_bytes)
}

fn check_size(size_bytes: u64) -> Result<(), ImageError> {
    if size_bytes.is_multiple_of(SECTOR_BYTES) && size_bytes <= IMAGE_SIZE_BYTES_MAX {
        Ok(())
    } else {
        Err(ImageError::InvalidSize(size_bytes))
    }
}

/// Name of the header object of image `name`.
pub fn header_object_name(name: &str) -> String {
    format!("img.{name}.header")
}

/// Name of data object `index` of image `name`.
pub fn data_object_name(name: &str, index: u64) -> String {
    format!("img.{name}.{index:016x}")
}

/// Index of a data object of image `name`, or None if `object` is not one.
fn parse_data_object(name: &str, object: &str) -> Option<u64> {
    let suffix = object.strip_prefix("img.")?.strip_prefix(name)?;
    let hex = suffix.strip_prefix('.')?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn now_unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One piece of an image range that lies inside one data object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    object_index: u64,
    /// Offset inside the object.
    offset: u64,
    len: u64,
    /// Offset of this piece inside the caller's buffer.
    buf_offset: u64,
    /// Bytes of the object that lie inside the image (the object's logical end).
    object_extent_bytes: u64,
}

/// One data object's share of a batch of writes ([`Image::object_writes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectWrite {
    /// The data object's index in the image.
    pub index: u64,
    /// Where the object starts in the image (extents are relative to it).
    pub object_offset: u64,
    /// Sorted, non-overlapping ranges inside the object.
    pub extents: Vec<spindle_types::Extent>,
    /// The extents' bytes one after the other.
    pub data: Vec<u8>,
}

/// Splits `[offset, offset + len)` of an image of `size_bytes` into per-object chunks.
fn chunks(offset: u64, len: u64, object_size_bytes: u64, size_bytes: u64) -> Vec<Chunk> {
    debug_assert!(offset + len <= size_bytes);
    let mut out = Vec::new();
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let object_index = pos / object_size_bytes;
        let object_start = object_index * object_size_bytes;
        let object_end = (object_start + object_size_bytes).min(size_bytes);
        let piece_end = end.min(object_end);
        out.push(Chunk {
            object_index,
            offset: pos - object_start,
            len: piece_end - pos,
            buf_offset: pos - offset,
            object_extent_bytes: object_end - object_start,
        });
        pos = piece_end;
    }
    debug_assert_eq!(out.iter().map(|c| c.len).sum::<u64>(), len);
    out
}

/// Runs `futures` with at most [`PARALLEL_OPS_MAX`] in flight; results in input order;
/// stops at the first error.
async fn run_bounded<T, F>(futures: Vec<F>) -> Result<Vec<T>, ImageError>
where
    F: Future<Output = Result<T, ImageError>>,
{
    use futures::stream::{self, StreamExt, TryStreamExt};
    stream::iter(futures)
        .buffered(PARALLEL_OPS_MAX)
        .try_collect()
        .await
}

/// Tracks mutations in flight so `flush` can wait for those started before it.
#[derive(Default)]
struct WriteTracker {
    state: Mutex<TrackerState>,
    done: Notify,
}

#[derive(Default)]
struct TrackerState {
    next_ticket: u64,
    in_flight: BTreeSet<u64>,
}

/// Holds one ticket; dropping it (after every task of the mutation ended) releases it.
struct Ticket {
    tracker: Arc<WriteTracker>,
    ticket: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let removed = lock(&self.tracker.state).in_flight.remove(&self.ticket);
        debug_assert!(removed, "ticket released twice");
        self.tracker.done.notify_waiters();
    }
}

impl WriteTracker {
    fn begin(self: &Arc<Self>) -> Arc<Ticket> {
        let mut s = lock(&self.state);
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.in_flight.insert(ticket);
        Arc::new(Ticket {
            tracker: self.clone(),
            ticket,
        })
    }

    /// Waits until every ticket issued before this call is released.
    async fn wait_issued(&self) {
        let target = lock(&self.state).next_ticket;
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pending = lock(&self.state)
                .in_flight
                .first()
                .is_some_and(|&t| t < target);
            if !pending {
                return;
            }
            notified.await;
        }
    }
}

use spindle_types::sync::lock;

/// The future of a read (boxed: a clone's reads go through its parent's).
type BoxedRead<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<u8>, ImageError>> + Send + 'a>>;

/// An open block image. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Image<B: ObjectBackend> {
    backend: Arc<B>,
    pool: Arc<str>,
    name: Arc<str>,
    header: RwLock<ImageHeader>,
    writes: Arc<WriteTracker>,
    /// The writer's copy-on-write state (`crate::snap`).
    cow: Arc<crate::snap::Cow>,
    /// Set for a snapshot opened read-only ([`Image::open_snap`]).
    snap: Option<Arc<crate::snap::SnapView>>,
    /// A clone's parent snapshot and copy-up state (`crate::clone`); None once flattened.
    link: RwLock<Option<Arc<crate::clone::CloneLink<B>>>>,
}

impl<B: ObjectBackend> Image<B> {
    /// Creates image `name` of `size_bytes` in `pool` (no data object is written).
    /// Fails with [`ImageError::Exists`] if the header exists. Not atomic against a
    /// concurrent `create` of the same name (the object API has no exclusive create).
    pub async fn create(
        backend: Arc<B>,
        pool: &str,
        name: &str,
        size_bytes: u64,
        object_size_bytes: u64,
    ) -> Result<Image<B>, ImageError> {
        check_image_name(name)?;
        check_size(size_bytes)?;
        check_object_size(object_size_bytes)?;
        let header_name = header_object_name(name);
        match backend.stat_object(pool, &header_name).await {
            Ok(_) => return Err(ImageError::Exists(name.to_string())),
            Err(ClientError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let header = ImageHeader {
            format_version: IMAGE_FORMAT_VERSION,
            size_bytes,
            object_size_bytes,
            created_unix_secs: now_unix_secs(),
            parent: None,
            qos: Default::default(),
        };
        backend
            .write_full_object(pool, &header_name, header.encode())
            .await?;
        Ok(Image::from_header(backend, pool, name, header))
    }

    /// Opens an existing image (a clone with its parent snapshot).
    pub async fn open(backend: Arc<B>, pool: &str, name: &str) -> Result<Image<B>, ImageError> {
        Self::open_at(backend, pool.into(), name.into(), None, 0, true).await
    }

    /// Opens image `name` without its parent (removal: a clone's data objects are deleted
    /// as they are, not replaced by empty ones).
    async fn open_unlinked(
        backend: Arc<B>,
        pool: &str,
        name: &str,
    ) -> Result<Image<B>, ImageError> {
        Self::open_at(backend, pool.into(), name.into(), None, 0, false).await
    }

    /// Opens image `name` (at snapshot `snap`, read-only), with its parent snapshot if
    /// it is a clone and `linked` (recursively: a parent may be a clone itself).
    fn open_at(
        backend: Arc<B>,
        pool: String,
        name: String,
        snap: Option<String>,
        depth: usize,
        linked: bool,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Image<B>, ImageError>> + Send>> {
        Box::pin(async move {
            let mut header = read_header(&*backend, &pool, &name).await?;
            let view = match &snap {
                None => None,
                Some(snap) => {
                    let view = crate::snap::SnapView::load(&*backend, &pool, &name, snap).await?;
                    header.size_bytes = view.size_bytes;
                    Some(Arc::new(view))
                }
            };
            let link = match header.parent.clone() {
                Some(p) if linked => {
                    if depth >= spindle_types::limits::CLONE_DEPTH_MAX {
                        return Err(ImageError::Snapshot(format!(
                            "{name}: clone chain deeper than {}",
                            spindle_types::limits::CLONE_DEPTH_MAX
                        )));
                    }
                    let parent = Self::open_at(
                        backend.clone(),
                        p.pool.clone(),
                        p.image.clone(),
                        Some(p.snap.clone()),
                        depth + 1,
                        true,
                    )
                    .await
                    .map_err(|e| {
                        ImageError::Snapshot(format!(
                            "clone {pool}/{name}: its parent {}/{}@{} cannot be opened: {e}",
                            p.pool, p.image, p.snap
                        ))
                    })?;
                    if parent.snapshot().map(|(id, _)| id) != Some(p.snap_id) {
                        return Err(ImageError::Snapshot(format!(
                            "clone {pool}/{name}: its parent snapshot {}/{}@{} (id {}) is gone",
                            p.pool, p.image, p.snap, p.snap_id
                        )));
                    }
                    let link = crate::clone::CloneLink::new(Arc::new(parent));
                    if snap.is_some() {
                        link.cache_absent();
                    }
                    Some(Arc::new(link))
                }
                _ => None,
            };
            let mut image = Image::from_header(backend, &pool, &name, header);
            image.snap = view;
            image.link = RwLock::new(link);
            Ok(image)
        })
    }

    fn from_header(backend: Arc<B>, pool: &str, name: &str, header: ImageHeader) -> Image<B> {
        Image {
            backend,
            pool: pool.into(),
            name: name.into(),
            header: RwLock::new(header),
            writes: Arc::new(WriteTracker::default()),
            cow: Arc::new(crate::snap::Cow::default()),
            snap: None,
            link: RwLock::new(None),
        }
    }

    /// Opens snapshot `snap` of image `name` read-only: reads see the image as it was when
    /// the snapshot was taken (its size too); writes fail with [`ImageError::ReadOnly`].
    pub async fn open_snap(
        backend: Arc<B>,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<Image<B>, ImageError> {
        Self::open_at(
            backend,
            pool.into(),
            name.into(),
            Some(snap.into()),
            0,
            true,
        )
        .await
    }

    /// Creates clone `name` of `parent` (a snapshot opened with [`Image::open_snap`]) in
    /// `pool`: a header naming the parent, no data object. The caller registered the
    /// clone with the snapshot (`crate::clone::clone`).
    pub async fn create_clone(
        backend: Arc<B>,
        pool: &str,
        name: &str,
        parent: &Image<B>,
        object_size_bytes: u64,
    ) -> Result<Image<B>, ImageError> {
        check_image_name(name)?;
        check_object_size(object_size_bytes)?;
        let Some((snap_id, snap)) = parent.snapshot() else {
            return Err(ImageError::Snapshot(format!(
                "{}: a clone's parent must be a snapshot",
                parent.name()
            )));
        };
        let header_name = header_object_name(name);
        match backend.stat_object(pool, &header_name).await {
            Ok(_) => return Err(ImageError::Exists(name.to_string())),
            Err(ClientError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let size_bytes = parent.size_bytes();
        let header = ImageHeader {
            format_version: CLONE_FORMAT_VERSION,
            size_bytes,
            object_size_bytes,
            created_unix_secs: now_unix_secs(),
            parent: Some(ParentSpec {
                pool: parent.pool().to_string(),
                image: parent.name().to_string(),
                snap: snap.to_string(),
                snap_id,
                overlap_bytes: size_bytes,
            }),
            qos: Default::default(),
        };
        backend
            .write_full_object(pool, &header_name, header.encode())
            .await?;
        Self::open(backend, pool, name).await
    }

    /// The image's limits as its header says now (read again: another process may have
    /// changed them).
    pub async fn read_qos(&self) -> Result<crate::qos::QosSpec, ImageError> {
        Ok(read_header(&*self.backend, &self.pool, &self.name)
            .await?
            .qos)
    }

    /// Changes the image's limits (a header rewrite; the serving process picks them up
    /// within a second). `changes`: (key, value or None to remove).
    pub async fn update_qos(
        backend: &B,
        pool: &str,
        name: &str,
        changes: &[(String, Option<u64>)],
    ) -> Result<crate::qos::QosSpec, ImageError> {
        let mut h = read_header(backend, pool, name).await?;
        for (key, value) in changes {
            h.qos.set(key, *value).map_err(ImageError::InvalidSetting)?;
        }
        h.qos.check().map_err(ImageError::InvalidSetting)?;
        backend
            .write_full_object(pool, &header_object_name(name), h.encode())
            .await?;
        Ok(h.qos)
    }

    /// The clone's link to its parent, if it is a clone (and not flattened).
    fn link(&self) -> Option<Arc<crate::clone::CloneLink<B>>> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Declares this handle the image's only writer (it holds the image's lock): a clone
    /// may then remember which objects it does not have and read those from the parent
    /// straight away (a snapshot view always may: see `CloneLink`).
    pub fn set_sole_writer(&self) {
        if let Some(l) = self.link() {
            l.cache_absent();
        }
    }

    /// The parent snapshot of a clone (None for other images, and once flattened).
    pub fn parent(&self) -> Option<ParentSpec> {
        self.header_snapshot().parent
    }

    /// Bytes of the image a clone reads from its parent where it has no data (0: none).
    fn overlap_bytes(&self) -> u64 {
        match (self.link(), self.header_snapshot().parent) {
            (Some(_), Some(p)) => p.overlap_bytes,
            _ => 0,
        }
    }

    /// A clone: makes sure data object `index` exists in the clone before it changes
    /// (copy-up, `crate::clone::copy_up`); nothing for other images.
    fn copy_up(&self, index: u64) -> impl Future<Output = Result<(), ImageError>> + Send + 'static {
        let job = self.link().map(|link| {
            (
                link,
                self.backend.clone(),
                self.pool.clone(),
                self.name.clone(),
                self.object_size_bytes(),
                self.overlap_bytes(),
            )
        });
        async move {
            match job {
                None => Ok(()),
                Some((link, backend, pool, name, os, overlap)) => {
                    link.copy_up(&*backend, &pool, &name, index, os, overlap)
                        .await
                }
            }
        }
    }

    /// Makes a clone independent of its parent: copies every object it still reads from
    /// the parent (`progress(done, total)`), then drops the parent from its header. The
    /// caller then unregisters it from the parent snapshot (`crate::clone::flatten`).
    pub async fn flatten(
        &self,
        mut progress: impl FnMut(u64, u64) + Send,
    ) -> Result<(), ImageError> {
        self.writable()?;
        if self.link().is_none() {
            return Err(ImageError::Snapshot(format!(
                "{} is not a clone",
                self.name
            )));
        }
        let _ticket = self.writes.begin();
        let count = self.overlap_bytes().div_ceil(self.object_size_bytes());
        progress(0, count);
        let mut index = 0u64;
        while index < count {
            let end = (index + PARALLEL_OPS_MAX as u64 * 4).min(count);
            let jobs: Vec<_> = (index..end).map(|i| self.copy_up(i)).collect();
            run_bounded(jobs).await?;
            index = end;
            progress(index, count);
        }
        let mut h = self.header_snapshot();
        h.parent = None;
        h.format_version = IMAGE_FORMAT_VERSION;
        self.write_header(&h).await?;
        *self.link.write().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// The snapshot this image was opened at ([`Image::open_snap`]): (id, name).
    pub fn snapshot(&self) -> Option<(u64, &str)> {
        self.snap.as_ref().map(|v| (v.id, v.name.as_str()))
    }

    fn writable(&self) -> Result<(), ImageError> {
        match &self.snap {
            None => Ok(()),
            Some(v) => Err(ImageError::ReadOnly(format!(
                "{}@{} is a snapshot",
                self.name, v.name
            ))),
        }
    }

    /// Every image of `pool`, sorted by name (lists the pool, then reads each header).
    pub async fn list(backend: &B, pool: &str) -> Result<Vec<ImageInfo>, ImageError> {
        let mut names: Vec<String> = backend
            .list_objects(pool)
            .await?
            .into_iter()
            .filter_map(|o| {
                let n = o.strip_prefix("img.")?.strip_suffix(".header")?;
                check_image_name(n).ok()?;
                Some(n.to_string())
            })
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            match read_header(backend, pool, &name).await {
                Ok(h) => out.push(info_of(pool, &name, &h)),
                // Removed while we listed.
                Err(ImageError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Deletes image `name`: its data objects (missing ones are fine), then its header.
    /// `progress(done_objects, total_objects)` is called as data objects go.
    pub async fn remove(
        backend: Arc<B>,
        pool: &str,
        name: &str,
        mut progress: impl FnMut(u64, u64) + Send,
    ) -> Result<(), ImageError> {
        let image = Image::open_unlinked(backend.clone(), pool, name).await?;
        let h = image.header_snapshot();
        let count = h.size_bytes.div_ceil(h.object_size_bytes);
        let existing = image.existing_objects(0..count).await?;
        let total = existing.len() as u64;
        progress(0, total);
        let mut done = 0u64;
        for batch in existing.chunks(PARALLEL_OPS_MAX * 4) {
            let futures: Vec<_> = batch
                .iter()
                .map(|&index| image.delete_data_object(index))
                .collect();
            run_bounded(futures).await?;
            done += batch.len() as u64;
            progress(done, total);
        }
        match backend
            .delete_object(pool, &crate::qos::stats_object_name(name))
            .await
        {
            Ok(()) | Err(ClientError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        match backend.delete_object(pool, &header_object_name(name)).await {
            Ok(()) | Err(ClientError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn header_snapshot(&self) -> ImageHeader {
        self.header
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Name, pool and geometry.
    pub fn info(&self) -> ImageInfo {
        info_of(&self.pool, &self.name, &self.header_snapshot())
    }

    /// Current size of the volume.
    pub fn size_bytes(&self) -> u64 {
        self.header_snapshot().size_bytes
    }

    /// Size of one data object.
    pub fn object_size_bytes(&self) -> u64 {
        self.header_snapshot().object_size_bytes
    }

    /// The image name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool holding the image.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<ImageHeader, ImageError> {
        let h = self.header_snapshot();
        match offset.checked_add(len) {
            Some(end) if end <= h.size_bytes => Ok(h),
            _ => Err(ImageError::OutOfRange {
                offset,
                len,
                size: h.size_bytes,
            }),
        }
    }

    /// Reads `len` bytes at `offset`; never-written bytes read as zeros.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
        self.read_boxed(offset, len).await
    }

    /// [`Image::read`] as a named future type: a clone's read calls its parent's.
    fn read_boxed(&self, offset: u64, len: u64) -> BoxedRead<'_> {
        Box::pin(self.read_inner(offset, len))
    }

    async fn read_inner(&self, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
        let h = self.check_range(offset, len)?;
        let pieces = chunks(offset, len, h.object_size_bytes, h.size_bytes);
        let futures: Vec<_> = pieces
            .iter()
            .map(|c| {
                let backend = self.backend.clone();
                let pool = self.pool.clone();
                let object = data_object_name(&self.name, c.object_index);
                let (off, piece_len) = (c.offset, c.len);
                let at_snap = self
                    .snap
                    .clone()
                    .map(|v| (v, self.name.clone(), c.object_index));
                // A clone reads what it has not written from its parent, up to the overlap.
                let image_offset = c.object_index * h.object_size_bytes + c.offset;
                let index = c.object_index;
                let parent = self.link().and_then(|l| {
                    let overlap = self.overlap_bytes();
                    (image_offset < overlap)
                        .then(|| (l.clone(), (overlap - image_offset).min(piece_len)))
                });
                // Known to read through (`CloneLink::absent_since`): straight to the parent.
                let absent = parent.as_ref().map(|(l, _)| l.absent_since(index));
                async move {
                    if let (Some((link, len)), Some(Ok(()))) = (&parent, &absent) {
                        let mut data = link.parent.read_boxed(image_offset, *len).await?;
                        data.resize(piece_len as usize, 0);
                        return Ok(data);
                    }
                    let r = match at_snap {
                        None => backend.read_object(&pool, &object, off, piece_len).await,
                        Some((view, image, index)) => {
                            view.read(&*backend, &pool, &image, index, off, piece_len)
                                .await
                        }
                    };
                    match r {
                        Ok(mut data) => {
                            debug_assert!(data.len() as u64 <= piece_len);
                            data.resize(piece_len as usize, 0);
                            Ok(data)
                        }
                        Err(ClientError::NotFound(_)) => match parent {
                            None => Ok(vec![0; piece_len as usize]),
                            Some((link, len)) => {
                                if let Some(Err(generation)) = absent {
                                    link.note_absent(index, generation);
                                }
                                let mut data = link.parent.read_boxed(image_offset, len).await?;
                                data.resize(piece_len as usize, 0);
                                Ok(data)
                            }
                        },
                        Err(e) => Err(ImageError::Backend(e)),
                    }
                }
            })
            .collect();
        let parts = run_bounded(futures).await?;
        if parts.len() == 1 {
            if let Some(only) = parts.into_iter().next() {
                return Ok(only);
            }
            return Err(ImageError::Task("missing result".to_string()));
        }
        let mut out = Vec::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        debug_assert_eq!(out.len() as u64, len);
        Ok(out)
    }

    /// Writes `data` at `offset`; acknowledged when durable on every up replica.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        self.writable()?;
        let h = self.check_range(offset, data.len() as u64)?;
        let pieces = chunks(offset, data.len() as u64, h.object_size_bytes, h.size_bytes);
        if pieces.len() == 1 {
            return self.write_owned(offset, data.to_vec()).await;
        }
        self.write_pieces(&h, &pieces, data).await
    }

    /// [`Image::write`] taking the buffer: a write inside one object (every batch of the
    /// block layer) sends it without copying.
    pub async fn write_owned(&self, offset: u64, data: Vec<u8>) -> Result<(), ImageError> {
        self.writable()?;
        let h = self.check_range(offset, data.len() as u64)?;
        let pieces = chunks(offset, data.len() as u64, h.object_size_bytes, h.size_bytes);
        if let [c] = pieces.as_slice() {
            let ticket = self.writes.begin();
            let object = data_object_name(&self.name, c.object_index);
            let whole_object = c.offset == 0 && data.len() as u64 == h.object_size_bytes;
            let backend = &*self.backend;
            if let Err(e) = self.copy_up(c.object_index).await {
                drop(ticket);
                return Err(e);
            }
            let r = crate::snap::guarded(
                backend,
                &self.cow,
                &self.pool,
                &self.name,
                c.object_index,
                h.object_size_bytes,
                || {
                    // Each attempt sends its own copy: a write refused for a new snapshot
                    // is sent again after the object was preserved.
                    let data = data.clone();
                    let (pool, object) = (&*self.pool, &object);
                    async move {
                        if whole_object {
                            backend.write_full_object(pool, object, data).await
                        } else {
                            backend.write_object(pool, object, c.offset, data).await
                        }
                    }
                },
            )
            .await;
            drop(ticket);
            return r;
        }
        self.write_pieces(&h, &pieces, &data).await
    }

    /// Writes `data` (at the offset `pieces` were cut from) object piece by object piece,
    /// in parallel.
    async fn write_pieces(
        &self,
        h: &ImageHeader,
        pieces: &[Chunk],
        data: &[u8],
    ) -> Result<(), ImageError> {
        let ticket = self.writes.begin();
        let futures: Vec<_> = pieces
            .iter()
            .map(|c| {
                let backend = self.backend.clone();
                let pool = self.pool.clone();
                let object = data_object_name(&self.name, c.object_index);
                let start = c.buf_offset as usize;
                let buf = data[start..start + c.len as usize].to_vec();
                let off = c.offset;
                let ticket = ticket.clone();
                let whole_object = off == 0 && buf.len() as u64 == h.object_size_bytes;
                let (cow, image, index, os) = (
                    self.cow.clone(),
                    self.name.clone(),
                    c.object_index,
                    h.object_size_bytes,
                );
                let copy_up = self.copy_up(index);
                async move {
                    if let Err(e) = copy_up.await {
                        drop(ticket);
                        return Err(e);
                    }
                    // A whole object is replaced, not patched: the daemons write it straight
                    // to a fresh file instead of through their journal.
                    let r = crate::snap::guarded(&*backend, &cow, &pool, &image, index, os, || {
                        let (backend, pool, object, buf) = (&backend, &pool, &object, buf.clone());
                        async move {
                            if whole_object {
                                backend.write_full_object(pool, object, buf).await
                            } else {
                                backend.write_object(pool, object, off, buf).await
                            }
                        }
                    })
                    .await;
                    drop(ticket);
                    r
                }
            })
            .collect();
        drop(ticket);
        run_bounded(futures).await.map(|_| ())
    }

    /// Splits many ranges of the image, `runs` of (image offset, bytes), into one write per
    /// data object (a write log's publishing): the pieces that fall into one object become
    /// one multi-extent write (more than `WRITE_EXTENTS_MAX` extents: several, in order).
    /// Runs are sorted here; overlapping runs make an extent list the daemons refuse.
    pub fn object_writes(&self, runs: &[(u64, Vec<u8>)]) -> Result<Vec<ObjectWrite>, ImageError> {
        let h = self.header_snapshot();
        let mut per_object: std::collections::BTreeMap<u64, (Vec<spindle_types::Extent>, Vec<u8>)> =
            std::collections::BTreeMap::new();
        let mut sorted: Vec<&(u64, Vec<u8>)> = runs.iter().filter(|r| !r.1.is_empty()).collect();
        sorted.sort_unstable_by_key(|r| r.0);
        for (offset, data) in sorted {
            self.check_range(*offset, data.len() as u64)?;
            for c in chunks(
                *offset,
                data.len() as u64,
                h.object_size_bytes,
                h.size_bytes,
            ) {
                let (extents, bytes) = per_object.entry(c.object_index).or_default();
                let piece = &data[c.buf_offset as usize..(c.buf_offset + c.len) as usize];
                // Touching pieces become one extent.
                match extents.last_mut() {
                    Some(last)
                        if last.offset + last.len_bytes as u64 == c.offset
                            && (last.len_bytes as u64 + c.len) <= u32::MAX as u64 =>
                    {
                        last.len_bytes += c.len as u32;
                    }
                    _ => extents.push(spindle_types::Extent {
                        offset: c.offset,
                        len_bytes: c.len as u32,
                    }),
                }
                bytes.extend_from_slice(piece);
            }
        }
        let mut out = Vec::with_capacity(per_object.len());
        for (index, (extents, bytes)) in per_object {
            let mut at = 0usize;
            for head in extents.chunks(spindle_types::limits::WRITE_EXTENTS_MAX) {
                let len: usize = head.iter().map(|e| e.len_bytes as usize).sum();
                out.push(ObjectWrite {
                    index,
                    object_offset: index * h.object_size_bytes,
                    extents: head.to_vec(),
                    data: bytes[at..at + len].to_vec(),
                });
                at += len;
            }
        }
        Ok(out)
    }

    /// Sends one [`ObjectWrite`] (a single extent as a plain write); returns once it is
    /// durable on every copy. Counted by [`Image::flush`] like any write.
    pub async fn write_object(&self, w: &ObjectWrite) -> Result<(), ImageError> {
        self.writable()?;
        let ticket = self.writes.begin();
        let object = data_object_name(&self.name, w.index);
        let backend = &*self.backend;
        let (pool, object) = (&*self.pool, &object);
        if let Err(e) = self.copy_up(w.index).await {
            drop(ticket);
            return Err(e);
        }
        let r = crate::snap::guarded(
            backend,
            &self.cow,
            pool,
            &self.name,
            w.index,
            self.object_size_bytes(),
            || async move {
                if let [e] = w.extents.as_slice() {
                    backend
                        .write_object(pool, object, e.offset, w.data.clone())
                        .await
                } else {
                    backend
                        .write_object_extents(pool, object, w.extents.clone(), w.data.clone())
                        .await
                }
            },
        )
        .await;
        drop(ticket);
        r
    }

    /// Makes `[offset, offset + len)` read as zeros without creating objects: whole
    /// objects are deleted, an object's tail is truncated, interior pieces of existing
    /// objects are overwritten with zeros.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        self.writable()?;
        let h = self.check_range(offset, len)?;
        self.zero_range(offset, len, h.object_size_bytes, h.size_bytes)
            .await
    }

    /// Deallocates `[offset, offset + len)`; it reads as zeros afterwards (same as
    /// [`Image::write_zeroes`]: no old data stays readable).
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        self.write_zeroes(offset, len).await
    }

    /// Waits until every write, zeroing and resize started before this call completed.
    /// (Completed writes are already durable: the cluster acks only durable writes.)
    pub async fn flush(&self) -> Result<(), ImageError> {
        self.writes.wait_issued().await;
        Ok(())
    }

    /// Changes the size. Shrinking deletes/truncates the data past the new end; growing
    /// first clears the newly exposed range, so it always reads as zeros.
    pub async fn resize(&self, new_size_bytes: u64) -> Result<(), ImageError> {
        self.writable()?;
        check_size(new_size_bytes)?;
        let _ticket = self.writes.begin();
        let mut h = self.header_snapshot();
        let old_size_bytes = h.size_bytes;
        let os = h.object_size_bytes;
        if new_size_bytes < old_size_bytes {
            // A clone reads its parent only up to its size: the overlap shrinks with it.
            // Not while the clone has snapshots: they read the parent up to the overlap.
            if let Some(p) = h
                .parent
                .as_mut()
                .filter(|p| new_size_bytes < p.overlap_bytes)
            {
                if self.link().is_some() && self.backend.snap_guard(&self.pool, &self.name) != 0 {
                    return Err(ImageError::Snapshot(format!(
                        "{} is a clone with snapshots: it cannot shrink below what it reads \
                         from its parent ({} bytes); flatten it or remove its snapshots first",
                        self.name, p.overlap_bytes
                    )));
                }
                p.overlap_bytes = new_size_bytes;
            }
            h.size_bytes = new_size_bytes;
            self.write_header(&h).await?;
            // Offsets past the new end, with object extents of the old geometry.
            self.zero_range(
                new_size_bytes,
                old_size_bytes - new_size_bytes,
                os,
                old_size_bytes,
            )
            .await?;
        } else if new_size_bytes > old_size_bytes {
            // Clear leftovers (e.g. of a shrink interrupted by a crash) before exposing.
            self.zero_range(
                old_size_bytes,
                new_size_bytes - old_size_bytes,
                os,
                new_size_bytes,
            )
            .await?;
            h.size_bytes = new_size_bytes;
            self.write_header(&h).await?;
        }
        Ok(())
    }

    async fn write_header(&self, h: &ImageHeader) -> Result<(), ImageError> {
        self.backend
            .write_full_object(&self.pool, &header_object_name(&self.name), h.encode())
            .await?;
        *self.header.write().unwrap_or_else(|p| p.into_inner()) = h.clone();
        Ok(())
    }

    /// For reading the whole image (an export): the indices of objects that may hold data
    /// (data objects and, for a snapshot, copies of this image), from one listing of the
    /// pool; None (read them all) for images of at most `BLIND_DELETE_OBJECTS_MAX` objects.
    pub async fn objects_with_data(&self) -> Result<Option<BTreeSet<u64>>, ImageError> {
        let h = self.header_snapshot();
        if h.size_bytes.div_ceil(h.object_size_bytes) <= BLIND_DELETE_OBJECTS_MAX {
            return Ok(None);
        }
        let found = self
            .backend
            .list_objects(&self.pool)
            .await?
            .iter()
            .filter_map(|o| {
                parse_data_object(&self.name, o).or_else(|| {
                    self.snap
                        .as_ref()
                        .and(crate::snap::parse_snap_object(&self.name, o).map(|(i, _)| i))
                })
            })
            .collect();
        Ok(Some(found))
    }

    /// Indices in `range` of data objects that may exist: all of them for small ranges,
    /// the listed ones for large ranges.
    async fn existing_objects(&self, range: Range<u64>) -> Result<Vec<u64>, ImageError> {
        if range.end - range.start <= BLIND_DELETE_OBJECTS_MAX {
            return Ok(range.collect());
        }
        let mut found: Vec<u64> = self
            .backend
            .list_objects(&self.pool)
            .await?
            .iter()
            .filter_map(|o| parse_data_object(&self.name, o))
            .filter(|i| range.contains(i))
            .collect();
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// Deletes data object `index`, so that it reads as zeros. Within a clone's overlap it
    /// is replaced by an empty object instead (a missing one would read the parent's data).
    fn delete_data_object(
        &self,
        index: u64,
    ) -> impl Future<Output = Result<(), ImageError>> + Send + 'static {
        let backend = self.backend.clone();
        let pool = self.pool.clone();
        let object = data_object_name(&self.name, index);
        let (cow, image, os) = (
            self.cow.clone(),
            self.name.clone(),
            self.object_size_bytes(),
        );
        let keep_empty = index * os < self.overlap_bytes();
        let copy_up = self.copy_up(index);
        async move {
            copy_up.await?;
            crate::snap::guarded(&*backend, &cow, &pool, &image, index, os, || {
                let (backend, pool, object) = (&backend, &pool, &object);
                async move {
                    if keep_empty {
                        return backend.write_full_object(pool, object, Vec::new()).await;
                    }
                    match backend.delete_object(pool, object).await {
                        Ok(()) | Err(ClientError::NotFound(_)) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            })
            .await
        }
    }

    /// Zeroes `[offset, offset + len)` of an image whose geometry is
    /// (`object_size_bytes`, `size_bytes`) for the purpose of object extents.
    async fn zero_range(
        &self,
        offset: u64,
        len: u64,
        object_size_bytes: u64,
        size_bytes: u64,
    ) -> Result<(), ImageError> {
        if len == 0 {
            return Ok(());
        }
        let ticket = self.writes.begin();
        let pieces = chunks(offset, len, object_size_bytes, size_bytes);
        let (whole, partial): (Vec<Chunk>, Vec<Chunk>) = pieces
            .into_iter()
            .partition(|c| c.offset == 0 && c.len == c.object_extent_bytes);
        // Whole objects: delete (only the existing ones for large ranges).
        let whole_indices: Vec<u64> = match (whole.first(), whole.last()) {
            (Some(first), Some(last)) => {
                // Whole chunks of one range are consecutive objects.
                debug_assert_eq!(
                    last.object_index - first.object_index + 1,
                    whole.len() as u64
                );
                self.existing_objects(first.object_index..last.object_index + 1)
                    .await?
            }
            _ => Vec::new(),
        };
        let mut futures: Vec<std::pin::Pin<Box<dyn Future<Output = _> + Send>>> = Vec::new();
        for index in whole_indices {
            let delete = self.delete_data_object(index);
            let ticket = ticket.clone();
            futures.push(Box::pin(async move {
                let r = delete.await;
                drop(ticket);
                r
            }));
        }
        for c in partial {
            let backend = self.backend.clone();
            let pool = self.pool.clone();
            let object = data_object_name(&self.name, c.object_index);
            let ticket = ticket.clone();
            let (cow, image) = (self.cow.clone(), self.name.clone());
            let copy_up = self.copy_up(c.object_index);
            futures.push(Box::pin(async move {
                if let Err(e) = copy_up.await {
                    drop(ticket);
                    return Err(e);
                }
                let r = crate::snap::guarded(
                    &*backend,
                    &cow,
                    &pool,
                    &image,
                    c.object_index,
                    object_size_bytes,
                    || zero_partial(&*backend, &pool, &object, c),
                )
                .await;
                drop(ticket);
                r
            }));
        }
        drop(ticket);
        run_bounded(futures).await.map(|_| ())
    }
}

/// Zeroes part of one object without ever creating it.
async fn zero_partial<B: ObjectBackend>(
    backend: &B,
    pool: &str,
    object: &str,
    c: Chunk,
) -> Result<(), ClientError> {
    let size_bytes = match backend.stat_object(pool, object).await {
        Ok(s) => s,
        Err(ClientError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    if size_bytes <= c.offset {
        // Everything from offset on already reads as zeros.
        return Ok(());
    }
    let end = c.offset + c.len;
    if end >= c.object_extent_bytes {
        // The range reaches the object's logical end: nothing after it can be written
        // concurrently, so cutting the object is exact.
        backend.truncate_object(pool, object, c.offset).await?;
    } else {
        let zero_len = end.min(size_bytes) - c.offset;
        backend
            .write_object(pool, object, c.offset, vec![0; zero_len as usize])
            .await?;
    }
    Ok(())
}

/// Reads and checks the header of image `name` (`NotFound` when there is none).
pub async fn read_header_of<B: ObjectBackend>(
    backend: &B,
    pool: &str,
    name: &str,
) -> Result<ImageHeader, ImageError> {
    read_header(backend, pool, name).await
}

async fn read_header<B: ObjectBackend>(
    backend: &B,
    pool: &str,
    name: &str,
) -> Result<ImageHeader, ImageError> {
    check_image_name(name)?;
    match backend
        .read_object(pool, &header_object_name(name), 0, 1 << 16)
        .await
    {
        Ok(data) => ImageHeader::decode(name, &data),
        Err(ClientError::NotFound(_)) => Err(ImageError::NotFound(name.to_string())),
        Err(e) => Err(e.into()),
    }
}

fn info_of(pool: &str, name: &str, h: &ImageHeader) -> ImageInfo {
    ImageInfo {
        name: name.to_string(),
        pool: pool.to_string(),
        size_bytes: h.size_bytes,
        object_size_bytes: h.object_size_bytes,
        object_count: h.size_bytes.div_ceil(h.object_size_bytes),
        created_unix_secs: h.created_unix_secs,
        format_version: h.format_version,
        parent: h
            .parent
            .as_ref()
            .map(|p| format!("{}/{}@{}", p.pool, p.image, p.snap)),
        overlap_bytes: h.parent.as_ref().map(|p| p.overlap_bytes),
        qos: h.qos.clone(),
    }
}

#[cfg(any(test, feature = "testing"))]
pub use memory::{MemoryBackend, MemoryOpCounts};

#[cfg(any(test, feature = "testing"))]
mod memory {
    use super::{lock, ObjectBackend};
    use spindle_client::ClientError;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Object operations a [`MemoryBackend`] served.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct MemoryOpCounts {
        pub reads: u64,
        /// Writes of every kind (partial and whole-object).
        pub writes: u64,
        /// Whole-object writes (`write_full_object`).
        pub write_fulls: u64,
        pub truncates: u64,
        pub deletes: u64,
        pub stats: u64,
        pub lists: u64,
    }

    #[derive(Default)]
    struct State {
        objects: BTreeMap<(String, String), Vec<u8>>,
        /// Snapshot lists (the cluster map's, for tests): no guard is checked here.
        snaps: BTreeMap<(String, String), spindle_map::ImageSnaps>,
        counts: MemoryOpCounts,
        rng: u64,
    }

    /// An in-memory object store with injectable latency, for tests. Each operation
    /// sleeps about half its latency, takes effect, then sleeps the rest, so operations
    /// overlap like on a real cluster.
    #[derive(Default)]
    pub struct MemoryBackend {
        state: Mutex<State>,
        latency_us: u64,
        jitter_us: u64,
    }

    impl MemoryBackend {
        /// No latency.
        pub fn new() -> MemoryBackend {
            MemoryBackend::default()
        }

        /// Every operation takes `latency_us` plus up to `jitter_us` (pseudo-random).
        pub fn with_latency(latency_us: u64, jitter_us: u64, seed: u64) -> MemoryBackend {
            MemoryBackend {
                state: Mutex::new(State {
                    rng: seed | 1,
                    ..State::default()
                }),
                latency_us,
                jitter_us,
            }
        }

        /// Adds snapshot `name` of `image` (what the monitor's `snap create` does to the
        /// map); returns its id. The image layer preserves objects for it from now on.
        pub fn add_snapshot(&self, pool: &str, image: &str, name: &str, size_bytes: u64) -> u64 {
            let mut s = lock(&self.state);
            let snaps = s.snaps.entry(key(pool, image)).or_default();
            snaps.seq += 1;
            let id = snaps.seq;
            snaps.snaps.insert(
                id,
                spindle_map::SnapInfo {
                    name: name.to_string(),
                    size_bytes,
                    created_unix_secs: 0,
                    protected: true,
                    children: Default::default(),
                },
            );
            id
        }

        /// Removes snapshot `name` of `image` (what the monitor's `snap rm` does to the
        /// map; its copies stay until `snap::trim`). Returns whether it existed.
        pub fn remove_snapshot(&self, pool: &str, image: &str, name: &str) -> bool {
            let mut s = lock(&self.state);
            let Some(snaps) = s.snaps.get_mut(&key(pool, image)) else {
                return false;
            };
            let id = snaps.by_name(name).map(|(id, _)| id);
            id.is_some_and(|id| snaps.snaps.remove(&id).is_some())
        }

        /// Operation counts so far.
        pub fn counts(&self) -> MemoryOpCounts {
            lock(&self.state).counts.clone()
        }

        /// Size of object `name` of `pool`, None if it does not exist.
        pub fn object_len(&self, pool: &str, name: &str) -> Option<u64> {
            lock(&self.state)
                .objects
                .get(&key(pool, name))
                .map(|o| o.len() as u64)
        }

        /// Names of the objects of `pool`.
        pub fn object_names(&self, pool: &str) -> Vec<String> {
            lock(&self.state)
                .objects
                .keys()
                .filter(|(p, _)| p == pool)
                .map(|(_, n)| n.clone())
                .collect()
        }

        fn half_delay(&self) -> Duration {
            if self.latency_us == 0 && self.jitter_us == 0 {
                return Duration::ZERO;
            }
            let mut s = lock(&self.state);
            s.rng ^= s.rng << 13;
            s.rng ^= s.rng >> 7;
            s.rng ^= s.rng << 17;
            let jitter = if self.jitter_us == 0 {
                0
            } else {
                s.rng % (self.jitter_us + 1)
            };
            Duration::from_micros((self.latency_us + jitter) / 2)
        }

        async fn around<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
            let d = self.half_delay();
            if !d.is_zero() {
                tokio::time::sleep(d).await;
            }
            let out = f(&mut lock(&self.state));
            let d = self.half_delay();
            if !d.is_zero() {
                tokio::time::sleep(d).await;
            }
            out
        }
    }

    fn key(pool: &str, name: &str) -> (String, String) {
        (pool.to_string(), name.to_string())
    }

    impl ObjectBackend for MemoryBackend {
        fn snap_guard(&self, pool: &str, image: &str) -> u64 {
            lock(&self.state)
                .snaps
                .get(&key(pool, image))
                .map_or(0, |s| s.guard())
        }

        fn image_snaps(&self, pool: &str, image: &str) -> Option<spindle_map::ImageSnaps> {
            lock(&self.state).snaps.get(&key(pool, image)).cloned()
        }

        async fn read_object(
            &self,
            pool: &str,
            name: &str,
            offset: u64,
            len: u64,
        ) -> Result<Vec<u8>, ClientError> {
            self.around(|s| {
                s.counts.reads += 1;
                let obj = s
                    .objects
                    .get(&key(pool, name))
                    .ok_or_else(|| ClientError::NotFound(name.to_string()))?;
                let start = (offset as usize).min(obj.len());
                let end = (offset.saturating_add(len) as usize).min(obj.len());
                Ok(obj[start..end].to_vec())
            })
            .await
        }

        async fn write_object(
            &self,
            pool: &str,
            name: &str,
            offset: u64,
            data: Vec<u8>,
        ) -> Result<(), ClientError> {
            self.around(|s| {
                s.counts.writes += 1;
                let obj = s.objects.entry(key(pool, name)).or_default();
                let end = offset as usize + data.len();
                if obj.len() < end {
                    obj.resize(end, 0);
                }
                obj[offset as usize..end].copy_from_slice(&data);
                Ok(())
            })
            .await
        }

        async fn write_full_object(
            &self,
            pool: &str,
            name: &str,
            data: Vec<u8>,
        ) -> Result<(), ClientError> {
            self.around(|s| {
                s.counts.writes += 1;
                s.counts.write_fulls += 1;
                s.objects.insert(key(pool, name), data);
                Ok(())
            })
            .await
        }

        async fn truncate_object(
            &self,
            pool: &str,
            name: &str,
            size_bytes: u64,
        ) -> Result<(), ClientError> {
            self.around(|s| {
                s.counts.truncates += 1;
                s.objects
                    .entry(key(pool, name))
                    .or_default()
                    .resize(size_bytes as usize, 0);
                Ok(())
            })
            .await
        }

        async fn delete_object(&self, pool: &str, name: &str) -> Result<(), ClientError> {
            self.around(|s| {
                s.counts.deletes += 1;
                s.objects
                    .remove(&key(pool, name))
                    .map(|_| ())
                    .ok_or_else(|| ClientError::NotFound(name.to_string()))
            })
            .await
        }

        async fn stat_object(&self, pool: &str, name: &str) -> Result<u64, ClientError> {
            self.around(|s| {
                s.counts.stats += 1;
                s.objects
                    .get(&key(pool, name))
                    .map(|o| o.len() as u64)
                    .ok_or_else(|| ClientError::NotFound(name.to_string()))
            })
            .await
        }

        async fn list_objects(&self, pool: &str) -> Result<Vec<String>, ClientError> {
            self.around(|s| {
                s.counts.lists += 1;
                Ok(s.objects
                    .keys()
                    .filter(|(p, _)| p == pool)
                    .map(|(_, n)| n.clone())
                    .collect())
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: &str = "p";

    async fn image(size: u64, os: u64) -> (Arc<MemoryBackend>, Image<MemoryBackend>) {
        let b = Arc::new(MemoryBackend::new());
        let img = Image::create(b.clone(), POOL, "vol", size, os)
            .await
            .unwrap();
        (b, img)
    }

    #[test]
    fn names() {
        assert!(check_image_name("a-b_c.1").is_ok());
        assert!(check_image_name("").is_err());
        assert!(check_image_name("a/b").is_err());
        assert!(check_image_name(&"x".repeat(65)).is_err());
        assert_eq!(data_object_name("v", 10), "img.v.000000000000000a");
        assert_eq!(parse_data_object("v", "img.v.000000000000000a"), Some(10));
        assert_eq!(parse_data_object("v", "img.v.header"), None);
        assert_eq!(parse_data_object("v", "img.v.x.000000000000000a"), None);
        assert_eq!(parse_data_object("v.x", "img.v.000000000000000a"), None);
    }

    #[test]
    fn chunking() {
        let c = chunks(4000, 200, 4096, 10_000);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].object_index, c[0].offset, c[0].len), (0, 4000, 96));
        assert_eq!((c[1].object_index, c[1].offset, c[1].len), (1, 0, 104));
        assert_eq!(c[1].buf_offset, 96);
        let c = chunks(8192, 1808, 4096, 10_000);
        assert_eq!(c[0].object_extent_bytes, 1808);
    }

    #[tokio::test]
    async fn create_open_list_exists() {
        let (b, img) = image(1 << 20, 4096).await;
        assert_eq!(img.info().object_count, 256);
        assert!(matches!(
            Image::create(b.clone(), POOL, "vol", 4096, 4096).await,
            Err(ImageError::Exists(_))
        ));
        assert!(matches!(
            Image::create(b.clone(), POOL, "bad/name", 4096, 4096).await,
            Err(ImageError::InvalidName(_))
        ));
        assert!(matches!(
            Image::create(b.clone(), POOL, "x", 4096, 3000).await,
            Err(ImageError::InvalidObjectSize(3000))
        ));
        assert!(matches!(
            Image::create(b.clone(), POOL, "x", 1000, 4096).await,
            Err(ImageError::InvalidSize(1000))
        ));
        Image::create(b.clone(), POOL, "other", 8192, 4096)
            .await
            .unwrap();
        let l = Image::list(&*b, POOL).await.unwrap();
        let names: Vec<_> = l.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["other", "vol"]);
        let o = Image::open(b.clone(), POOL, "vol").await.unwrap();
        assert_eq!(o.size_bytes(), 1 << 20);
        assert!(matches!(
            Image::open(b.clone(), POOL, "nope").await,
            Err(ImageError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn read_write_thin_and_zeroes() {
        let (b, img) = image(64 << 10, 4096).await;
        assert_eq!(img.read(0, 64 << 10).await.unwrap(), vec![0; 64 << 10]);
        assert_eq!(b.object_names(POOL).len(), 1, "only the header");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        img.write(3000, &data).await.unwrap();
        assert_eq!(img.read(3000, 10_000).await.unwrap(), data);
        assert_eq!(b.object_names(POOL).len(), 1 + 4);
        // Interior zeroing, whole-object delete, tail truncate.
        img.write_zeroes(3500, 6000).await.unwrap();
        let mut model = vec![0u8; 64 << 10];
        model[3000..13_000].copy_from_slice(&data);
        model[3500..9500].fill(0);
        assert_eq!(img.read(0, 64 << 10).await.unwrap(), model);
        img.discard(0, 64 << 10).await.unwrap();
        assert_eq!(img.read(0, 64 << 10).await.unwrap(), vec![0; 64 << 10]);
        assert_eq!(b.object_names(POOL).len(), 1);
        // Zeroing never-written ranges creates nothing.
        img.write_zeroes(100, 5000).await.unwrap();
        assert_eq!(b.object_names(POOL).len(), 1);
        img.flush().await.unwrap();
    }

    #[tokio::test]
    async fn out_of_range() {
        let (_b, img) = image(8192, 4096).await;
        assert!(matches!(
            img.read(8000, 193).await,
            Err(ImageError::OutOfRange {
                offset: 8000,
                len: 193,
                size: 8192
            })
        ));
        assert!(img.write(u64::MAX, &[1]).await.is_err());
        assert!(img.write_zeroes(0, 8193).await.is_err());
        assert!(img.read(8192, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn resize_shrink_grow_reads_zeros() {
        let (b, img) = image(40960, 4096).await;
        img.write(0, &vec![7; 40960]).await.unwrap();
        img.resize(10240).await.unwrap();
        assert!(img.read(10240, 1).await.is_err());
        assert_eq!(b.object_names(POOL).len(), 1 + 3);
        img.resize(40960).await.unwrap();
        let r = img.read(0, 40960).await.unwrap();
        assert_eq!(&r[..10240], &vec![7; 10240][..]);
        assert!(r[10240..].iter().all(|&x| x == 0));
        let reopened = Image::open(b.clone(), POOL, "vol").await.unwrap();
        assert_eq!(reopened.size_bytes(), 40960);
    }

    #[tokio::test]
    async fn remove_tolerates_missing() {
        let (b, img) = image(1 << 20, 4096).await;
        img.write(4096 * 3, &[1; 10]).await.unwrap();
        let mut last = (0, 0);
        Image::remove(b.clone(), POOL, "vol", |d, t| last = (d, t))
            .await
            .unwrap();
        assert_eq!(last, (256, 256));
        assert!(b.object_names(POOL).is_empty());
        assert!(matches!(
            Image::remove(b.clone(), POOL, "vol", |_, _| {}).await,
            Err(ImageError::NotFound(_))
        ));
    }

    /// Checks that no data object holds bytes at or past the image end.
    fn check_nothing_past_end(b: &MemoryBackend, img: &Image<MemoryBackend>) {
        let (size, os) = (img.size_bytes(), img.object_size_bytes());
        for name in b.object_names(POOL) {
            if let Some(index) = parse_data_object("vol", &name) {
                let start = index * os;
                assert!(start < size, "{name} past the end {size}");
                let len = b.object_len(POOL, &name).unwrap_or(0);
                assert!(start + len <= size, "{name} holds bytes past {size}");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random writes, zeroing, discards and resizes against a `Vec` model.
        #[test]
        fn model_based(ops in proptest::collection::vec(
            (0u8..5, 0u64..70_000, 0u64..20_000, 1u8..=255), 1..30)) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (b, img) = image(64 << 10, 4096).await;
                let mut model = vec![0u8; 64 << 10];
                for (kind, off, len, byte) in ops {
                    let size = model.len() as u64;
                    let off = off % (size + 1);
                    let len = len.min(size - off);
                    let (o, l) = (off as usize, len as usize);
                    match kind {
                        0 | 1 => {
                            img.write(off, &vec![byte; l]).await.unwrap();
                            model[o..o + l].fill(byte);
                        }
                        2 => {
                            img.write_zeroes(off, len).await.unwrap();
                            model[o..o + l].fill(0);
                        }
                        3 => {
                            img.discard(off, len).await.unwrap();
                            model[o..o + l].fill(0);
                        }
                        _ => {
                            let new_size = (off + len) / 512 * 512;
                            img.resize(new_size).await.unwrap();
                            model.resize(new_size as usize, 0);
                        }
                    }
                    assert_eq!(img.read(0, model.len() as u64).await.unwrap(), model);
                    check_nothing_past_end(&b, &img);
                }
            });
        }
    }

    /// A snapshot view whose snapshot was removed (and its copies trimmed) refuses to
    /// read: the copy it would read is gone, and the head is not the snapshot.
    #[tokio::test]
    async fn a_removed_snapshot_is_never_read_as_the_head() {
        let b = Arc::new(MemoryBackend::new());
        let img = Image::create(b.clone(), POOL, "vm", 64 << 10, 4096)
            .await
            .unwrap();
        img.write(0, &[1; 4096]).await.unwrap();
        b.add_snapshot(POOL, "vm", "s", 64 << 10);
        let listed_before = Image::open_snap(b.clone(), POOL, "vm", "s").await.unwrap();
        img.write(0, &[2; 4096]).await.unwrap();
        let listed_after = Image::open_snap(b.clone(), POOL, "vm", "s").await.unwrap();
        for view in [&listed_before, &listed_after] {
            assert_eq!(view.read(0, 4096).await.unwrap(), vec![1; 4096]);
        }
        assert!(b.remove_snapshot(POOL, "vm", "s"));
        crate::snap::trim(&*b, POOL, "vm", |_, _| {}).await.unwrap();
        for view in [&listed_before, &listed_after] {
            let e = view.read(0, 4096).await.unwrap_err();
            assert!(
                matches!(e, ImageError::Backend(ClientError::SnapChanged(_))),
                "{e}"
            );
        }
    }

    /// Asserts `got == want`, naming the first differing byte (not printing both).
    fn same(got: &[u8], want: &[u8], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!("{what}: byte {at} is {}, want {}", got[at], want[at]);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]
        /// Snapshots against `Vec` models: random writes, zeroing and discards of the head,
        /// snapshots taken and removed (any of them, the newest too), copies trimmed at
        /// random points; every live snapshot reads as it was taken, after every step.
        #[test]
        fn snapshots_model_based(ops in proptest::collection::vec(
            (0u8..8, 0u64..40_000, 0u64..12_000, 1u8..=255), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let size = 40u64 << 10;
                let b = Arc::new(MemoryBackend::new());
                let img = Image::create(b.clone(), POOL, "vm", size, 4096).await.unwrap();
                let mut model = vec![0u8; size as usize];
                let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
                let mut taken = 0usize;
                for (kind, off, len, byte) in ops {
                    let off = off % size;
                    let len = len.min(size - off);
                    let (o, l) = (off as usize, len as usize);
                    match kind {
                        0..=2 => {
                            img.write(off, &vec![byte; l]).await.unwrap();
                            model[o..o + l].fill(byte);
                        }
                        3 => {
                            img.discard(off, len).await.unwrap();
                            model[o..o + l].fill(0);
                        }
                        4 | 5 => {
                            let name = format!("s{taken}");
                            taken += 1;
                            b.add_snapshot(POOL, "vm", &name, size);
                            snaps.push((name, model.clone()));
                        }
                        6 if !snaps.is_empty() => {
                            // Any snapshot; the newest one as often as the others.
                            let (name, _) = snaps.remove(byte as usize % snaps.len());
                            assert!(b.remove_snapshot(POOL, "vm", &name));
                        }
                        _ => {
                            crate::snap::trim(&*b, POOL, "vm", |_, _| {}).await.unwrap();
                        }
                    }
                    same(&img.read(0, size).await.unwrap(), &model, "head");
                    for (name, want) in &snaps {
                        let view = Image::open_snap(b.clone(), POOL, "vm", name).await.unwrap();
                        same(&view.read(0, size).await.unwrap(), want, name);
                    }
                }
                // With every snapshot gone, trimming leaves no copy behind.
                for (name, _) in snaps.drain(..) {
                    assert!(b.remove_snapshot(POOL, "vm", &name));
                }
                crate::snap::trim(&*b, POOL, "vm", |_, _| {}).await.unwrap();
                assert!(b.object_names(POOL).iter().all(|n| !n.contains('@')));
            });
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// A clone of a snapshot against a `Vec` model: random writes, zeroing, resizes,
        /// snapshots of the clone (checked at the end) and a flatten, while the parent's
        /// head keeps changing (the snapshot must not).
        #[test]
        fn clone_model_based(
            parent_ops in proptest::collection::vec((0u64..40_000, 1u64..9_000, 1u8..=255), 1..8),
            ops in proptest::collection::vec((0u8..8, 0u64..70_000, 0u64..20_000, 1u8..=255), 1..30),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let b = Arc::new(MemoryBackend::new());
                let size = 40u64 << 10;
                let parent = Image::create(b.clone(), POOL, "golden", size, 4096).await.unwrap();
                let mut parent_model = vec![0u8; size as usize];
                for (off, len, byte) in parent_ops {
                    let off = off % size;
                    let len = len.min(size - off);
                    parent.write(off, &vec![byte; len as usize]).await.unwrap();
                    parent_model[off as usize..(off + len) as usize].fill(byte);
                }
                b.add_snapshot(POOL, "golden", "base", size);
                let at = Image::open_snap(b.clone(), POOL, "golden", "base").await.unwrap();
                // Objects of 8 KiB: two of the parent's per clone object.
                let img = Image::create_clone(b.clone(), POOL, "vm", &at, 8192).await.unwrap();
                img.set_sole_writer();
                assert_eq!(img.read(0, size).await.unwrap(), parent_model);
                let mut model = parent_model.clone();
                let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
                let mut flattened = false;
                for (kind, off, len, byte) in ops {
                    let size = model.len() as u64;
                    let off = off % (size + 1);
                    let len = len.min(size - off);
                    let (o, l) = (off as usize, len as usize);
                    match kind {
                        0..=2 => {
                            img.write(off, &vec![byte; l]).await.unwrap();
                            model[o..o + l].fill(byte);
                        }
                        3 => {
                            img.discard(off, len).await.unwrap();
                            model[o..o + l].fill(0);
                        }
                        4 => {
                            let new_size = (off + len + 512) / 512 * 512;
                            match img.resize(new_size).await {
                                Ok(()) => model.resize(new_size as usize, 0),
                                Err(ImageError::Snapshot(m)) => {
                                    assert!(!snaps.is_empty() && m.contains("snapshots"), "{m}");
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        5 => {
                            let name = format!("s{}", snaps.len());
                            b.add_snapshot(POOL, "vm", &name, size);
                            snaps.push((name, model.clone()));
                        }
                        6 if !flattened => {
                            img.flatten(|_, _| {}).await.unwrap();
                            flattened = true;
                            assert!(img.parent().is_none());
                        }
                        _ => {
                            // The parent's head changes; its snapshot does not.
                            parent.write(off % 40_000, &[byte; 512]).await.unwrap();
                        }
                    }
                    assert_eq!(img.read(0, model.len() as u64).await.unwrap(), model);
                }
                // A new opener (no in-memory copy-up state) reads the same.
                let again = Image::open(b.clone(), POOL, "vm").await.unwrap();
                assert_eq!(again.read(0, model.len() as u64).await.unwrap(), model);
                for (name, want) in &snaps {
                    let view = Image::open_snap(b.clone(), POOL, "vm", name).await.unwrap();
                    assert_eq!(&view.read(0, want.len() as u64).await.unwrap(), want, "{name}");
                }
                assert_eq!(at.read(0, size).await.unwrap(), parent_model);
            });
        }
    }

    #[tokio::test]
    async fn clone_headers_refuse_old_readers_and_bad_parents() {
        let b = Arc::new(MemoryBackend::new());
        let parent = Image::create(b.clone(), POOL, "golden", 1 << 20, 4096)
            .await
            .unwrap();
        assert!(matches!(
            Image::create_clone(b.clone(), POOL, "c", &parent, 4096).await,
            Err(ImageError::Snapshot(_))
        ));
        b.add_snapshot(POOL, "golden", "base", 1 << 20);
        let at = Image::open_snap(b.clone(), POOL, "golden", "base")
            .await
            .unwrap();
        let c = Image::create_clone(b.clone(), POOL, "c", &at, 4096)
            .await
            .unwrap();
        assert_eq!(c.info().parent.as_deref(), Some("p/golden@base"));
        assert!(matches!(
            Image::create_clone(b.clone(), POOL, "c", &at, 4096).await,
            Err(ImageError::Exists(_))
        ));
        // The header is format 2: a format-1 header with a parent is corrupt, and so is
        // an overlap past the image's end.
        let raw = b
            .read_object(POOL, "img.c.header", 0, 1 << 16)
            .await
            .unwrap();
        let mut h: ImageHeader = serde_json::from_slice(&raw).unwrap();
        assert_eq!(h.format_version, CLONE_FORMAT_VERSION);
        h.format_version = IMAGE_FORMAT_VERSION;
        assert!(ImageHeader::decode("c", &h.encode()).is_err());
        h.format_version = CLONE_FORMAT_VERSION;
        h.parent.as_mut().unwrap().overlap_bytes = h.size_bytes + 1;
        assert!(ImageHeader::decode("c", &h.encode()).is_err());
        // A parent snapshot that is gone: opening the clone says so.
        let mut h2: ImageHeader = serde_json::from_slice(&raw).unwrap();
        h2.parent.as_mut().unwrap().snap = "nope".into();
        b.write_full_object(POOL, "img.c.header", h2.encode())
            .await
            .unwrap();
        let e = Image::open(b.clone(), POOL, "c")
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("parent") && e.contains("nope"), "{e}");
        // Removal does not need the parent.
        Image::remove(b.clone(), POOL, "c", |_, _| {})
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn large_discard_lists_instead_of_blind_deletes() {
        let (b, img) = image(8 << 20, 4096).await;
        img.write(5 << 20, &[9; 8192]).await.unwrap();
        img.discard(0, 8 << 20).await.unwrap();
        let c = b.counts();
        assert_eq!(c.lists, 1);
        assert_eq!(c.deletes, 2);
        assert_eq!(b.object_names(POOL).len(), 1);
    }
}
