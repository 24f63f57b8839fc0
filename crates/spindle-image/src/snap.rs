//! Image snapshots: client-side copy-on-write at object granularity, guarded by the
//! daemons.
//!
//! Layout: the snapshot list lives in the cluster map (`ClusterMap::image_snaps`: ids that
//! only grow, names, the image's size at the snapshot); the snapshot's data is the head
//! objects plus *snapshot copies* `img.NAME.%016x@%016x` (object index, snapshot id), ordinary
//! objects of the pool (replicated or erasure-coded, recovered and scrubbed like any).
//!
//! Copy-on-write: before the first change of data object `i` after snapshot `s` (the
//! image's newest), the writer copies the object's current content to `i@s` (a zero-length
//! copy when the object does not exist: it read as zeros), then writes with *guard* `s`.
//! Every primary refuses a write to a data object whose guard is not the image's newest
//! snapshot in its map (`SnapChanged`), and the snapshot command returns only after every
//! primary of the pool has the map with the new snapshot (`Client::map_barrier`). So:
//! - a write issued after `snap create` returned is refused until its object was copied:
//!   it is never in the snapshot;
//! - a write acknowledged before `snap create` started was applied before any copy of its
//!   object (the copy reads the object after the writer learned of the snapshot), so it
//!   is in the snapshot;
//! - crash consistency: the writer learns of the snapshot once (its map), and only then
//!   copies; a write it issues after another was acknowledged is either before the
//!   snapshot in both objects or after it in the second.
//!
//! Reading object `i` at snapshot `s`: the copy `i@c` with the smallest `c >= s`, else the
//! head (unchanged since `s`). A copy is made only for the newest snapshot at the time
//! (`c` = newest), so after reading a head the reader checks that no copy `i@n` for a live
//! snapshot `n >= s` appeared meanwhile (the writer copies before it changes the head).
//!
//! Why copies of whole objects and why by the client: an object written after a snapshot
//! is copied once (4 MiB by default, 256 KiB on erasure-coded pools), then written in
//! place at full speed; the copy is an ordinary object, so replication, erasure coding,
//! recovery, scrub and space accounting need nothing new; the daemons only check a guard.
//! Ceph clones inside the OSD (a clone per object in the same placement group); that
//! needs a clone operation in every replication and recovery path.
//!
//! One writer at a time (the image's exclusive lock): the preserved set and the per-object
//! copy locks are in the writer's memory; a new writer finds existing copies by `stat`.

use crate::image::{ImageError, ObjectBackend};
use spindle_client::ClientError;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Name of the snapshot copy of data object `index` of image `image` for snapshot `snap`.
pub fn snap_object_name(image: &str, index: u64, snap: u64) -> String {
    format!("img.{image}.{index:016x}@{snap:016x}")
}

/// (object index, snapshot id) of a snapshot copy of image `image`, None for any other
/// object.
pub fn parse_snap_object(image: &str, object: &str) -> Option<(u64, u64)> {
    let rest = object.strip_prefix("img.")?.strip_prefix(image)?;
    let rest = rest.strip_prefix('.')?;
    let (index, snap) = rest.split_once('@')?;
    let hex16 = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    Some((hex16(index)?, hex16(snap)?))
}

/// Guard retries before a write gives up (each recomputes the guard from the map; more
/// than a few means the map keeps changing under the write).
const GUARD_RETRIES_MAX: u32 = 64;

/// The writer's copy-on-write state of one open image.
#[derive(Default)]
pub(crate) struct Cow {
    /// Objects already preserved for snapshot `.0` (cleared when the newest changes).
    preserved: Mutex<(u64, HashSet<u64>)>,
    /// One lock per object being preserved, so two writes never copy it twice (the second
    /// copy would read the first write's data).
    copying: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
}

impl Cow {
    fn is_preserved(&self, snap: u64, index: u64) -> bool {
        let p = spindle_types::sync::lock(&self.preserved);
        p.0 == snap && p.1.contains(&index)
    }

    fn mark_preserved(&self, snap: u64, index: u64) {
        let mut p = spindle_types::sync::lock(&self.preserved);
        if p.0 != snap {
            *p = (snap, HashSet::new());
        }
        p.1.insert(index);
    }

    /// Makes sure data object `index` is preserved for the image's newest snapshot;
    /// returns that snapshot's id, the guard its next write carries (0: no snapshot).
    pub(crate) async fn prepare<B: ObjectBackend>(
        &self,
        backend: &B,
        pool: &str,
        image: &str,
        index: u64,
        object_size_bytes: u64,
    ) -> Result<u64, ClientError> {
        let snap = backend.snap_guard(pool, image);
        if snap == 0 || self.is_preserved(snap, index) {
            return Ok(snap);
        }
        let lock = spindle_types::sync::lock(&self.copying)
            .entry(index)
            .or_default()
            .clone();
        let result = {
            let _held = lock.lock().await;
            if self.is_preserved(snap, index) {
                Ok(())
            } else {
                preserve(backend, pool, image, index, snap, object_size_bytes).await
            }
        };
        {
            let mut copying = spindle_types::sync::lock(&self.copying);
            if Arc::strong_count(&lock) == 2 {
                copying.remove(&index);
            }
        }
        result?;
        self.mark_preserved(snap, index);
        Ok(snap)
    }
}

/// Copies data object `index` to its copy for snapshot `snap`, unless the copy exists (an
/// earlier writer made it; the head may have changed since, so it is never made again).
async fn preserve<B: ObjectBackend>(
    backend: &B,
    pool: &str,
    image: &str,
    index: u64,
    snap: u64,
    object_size_bytes: u64,
) -> Result<(), ClientError> {
    let copy = snap_object_name(image, index, snap);
    match backend.stat_object(pool, &copy).await {
        Ok(_) => return Ok(()),
        Err(ClientError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let head = crate::image::data_object_name(image, index);
    let data = match backend.read_object(pool, &head, 0, object_size_bytes).await {
        Ok(d) => d,
        Err(ClientError::NotFound(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    backend.write_full_object(pool, &copy, data).await
}

/// Runs `op` (one write, truncate or delete of data object `index`) with the snapshot
/// guard: preserves the object for the newest snapshot first, and when a daemon's map has
/// another newest snapshot (`SnapChanged`), does it again for that one.
pub(crate) async fn guarded<B, T, F, Fut>(
    backend: &B,
    cow: &Cow,
    pool: &str,
    image: &str,
    index: u64,
    object_size_bytes: u64,
    mut op: F,
) -> Result<T, ImageError>
where
    B: ObjectBackend,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>> + Send,
{
    let mut attempts = 0u32;
    loop {
        let guard = cow
            .prepare(backend, pool, image, index, object_size_bytes)
            .await?;
        match backend.with_guard(guard, op()).await {
            Err(ClientError::SnapChanged(m)) => {
                attempts += 1;
                if attempts >= GUARD_RETRIES_MAX {
                    return Err(ImageError::Backend(ClientError::SnapChanged(m)));
                }
                // The daemon had the newer map: ours is at least as new now (it answered
                // `StaleMap` first otherwise); give a map still on its way a moment.
                if attempts > 2 {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            r => return r.map_err(ImageError::Backend),
        }
    }
}

/// Where the data of object `index` at snapshot `snap` is: the copy with the smallest id
/// at least `snap` among `copies` (sorted), else the head (None).
pub fn source_at(copies: &[u64], snap: u64) -> Option<u64> {
    copies.iter().copied().find(|&c| c >= snap)
}

/// Which snapshot copies can go once the live snapshots are `live` (sorted), read from a
/// map whose last handed-out id was `seq`: a copy `c` of an object serves the live
/// snapshots in `(previous copy, c]`; none: it can go. A copy above `seq` is for a
/// snapshot newer than that map (the listing can be newer than the map): it stays.
/// `copies` sorted.
pub fn unneeded_copies(copies: &[u64], live: &[u64], seq: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut previous = 0u64;
    for &c in copies {
        if c > seq {
            break;
        }
        let serves = live.iter().any(|&s| s > previous && s <= c);
        if !serves {
            out.push(c);
        }
        previous = c;
    }
    out
}

/// A snapshot opened for reading: which copies each object has (listed at open, listed
/// again when many snapshots were taken since).
pub struct SnapView {
    pub id: u64,
    pub name: String,
    /// The image's size when the snapshot was taken.
    pub size_bytes: u64,
    listing: Mutex<Arc<Listing>>,
}

/// The snapshot copies of one image at one time.
struct Listing {
    /// The image's `ImageSnaps::seq` just before the listing: every copy made after it
    /// has an id at least this (copies are made under the guard, which is the `seq` of
    /// its time).
    seq: u64,
    /// Per object index: the snapshot copies listed (sorted ids).
    copies: HashMap<u64, Vec<u64>>,
}

/// Ids handed out since a view's listing beyond which a read that found no listed copy
/// lists the copies again instead of probing one name per id.
const VIEW_PROBES_MAX: u64 = 8;

async fn list_copies<B: ObjectBackend>(
    backend: &B,
    pool: &str,
    image: &str,
) -> Result<Listing, ClientError> {
    let seq = backend.image_snaps(pool, image).map_or(0, |s| s.seq);
    let mut copies: HashMap<u64, Vec<u64>> = HashMap::new();
    for object in backend.list_objects(pool).await? {
        if let Some((index, c)) = parse_snap_object(image, &object) {
            copies.entry(index).or_default().push(c);
        }
    }
    for ids in copies.values_mut() {
        ids.sort_unstable();
    }
    Ok(Listing { seq, copies })
}

impl SnapView {
    /// Finds snapshot `snap` of `image` in the backend's map and lists the pool's copies.
    pub async fn load<B: ObjectBackend>(
        backend: &B,
        pool: &str,
        image: &str,
        snap: &str,
    ) -> Result<SnapView, ImageError> {
        let snaps = backend.image_snaps(pool, image).unwrap_or_default();
        let (id, info) = snaps
            .by_name(snap)
            .ok_or_else(|| ImageError::NoSnapshot(format!("{image}@{snap}")))?;
        let listing = list_copies(backend, pool, image).await?;
        Ok(SnapView {
            id,
            name: info.name.clone(),
            size_bytes: info.size_bytes,
            listing: Mutex::new(Arc::new(listing)),
        })
    }

    /// Reads `len` bytes at `offset` of data object `index` as it was at this snapshot
    /// (short at the object's end, like `read_object`; `NotFound`: it did not exist).
    pub(crate) async fn read<B: ObjectBackend>(
        &self,
        backend: &B,
        pool: &str,
        image: &str,
        index: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClientError> {
        // A removed snapshot's copies may be trimmed at any time: reading on would give
        // the head's bytes (or zeros) as the snapshot's. Refused instead.
        let gone = || {
            ClientError::SnapChanged(format!(
                "snapshot {image}@{} (id {}) was removed",
                self.name, self.id
            ))
        };
        let live = || {
            backend
                .image_snaps(pool, image)
                .is_some_and(|s| s.snaps.contains_key(&self.id))
        };
        if !live() {
            return Err(gone());
        }
        let mut listing = spindle_types::sync::lock(&self.listing).clone();
        let seq_now = backend.image_snaps(pool, image).map_or(0, |s| s.seq);
        if seq_now.saturating_sub(listing.seq) >= VIEW_PROBES_MAX {
            listing = Arc::new(list_copies(backend, pool, image).await?);
            *spindle_types::sync::lock(&self.listing) = listing.clone();
        }
        let listed = listing.copies.get(&index).map_or(&[][..], |v| v.as_slice());
        if let Some(c) = source_at(listed, self.id) {
            // A listed copy that is gone was trimmed: no live snapshot read it, so this
            // one was removed meanwhile (never "absent": that reads as zeros).
            return match backend
                .read_object(pool, &snap_object_name(image, index, c), offset, len)
                .await
            {
                Err(ClientError::NotFound(_)) => Err(gone()),
                r => r,
            };
        }
        let head = backend
            .read_object(
                pool,
                &crate::image::data_object_name(image, index),
                offset,
                len,
            )
            .await;
        // A copy made since the listing means the head changed after the snapshot (the
        // writer copies first): read the copy instead; the smallest one holds this
        // snapshot's data. Its id is the guard of its time: at least the listing's `seq`,
        // or - from a writer whose map (and primary's) still lacked a snapshot being
        // created while this view listed - an older id, which a live snapshot from this
        // one on covers. Probed after the head was read, so a change the head read saw
        // has its copy in place.
        let mut candidates: Vec<u64> = Vec::new();
        let seq_now = match backend.image_snaps(pool, image) {
            Some(s) => {
                candidates.extend(s.snaps.keys().copied().filter(|&n| n >= self.id));
                s.seq
            }
            None => 0,
        };
        candidates.extend(listing.seq.max(self.id)..=seq_now);
        candidates.sort_unstable();
        candidates.dedup();
        for n in candidates {
            let copy = snap_object_name(image, index, n);
            match backend.read_object(pool, &copy, offset, len).await {
                Ok(data) => return Ok(data),
                Err(ClientError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // Removed meanwhile: a copy this read needed may have been trimmed already.
        if !live() {
            return Err(gone());
        }
        head
    }
}

/// One snapshot as `spindle image snap ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapEntry {
    pub id: u64,
    pub name: String,
    pub size_bytes: u64,
    pub created_unix_secs: u64,
    pub protected: bool,
}

/// The snapshots of `image`, oldest first.
pub fn list(client: &spindle_client::Client, pool: &str, image: &str) -> Vec<SnapEntry> {
    client
        .image_snaps(pool, image)
        .map(|s| {
            s.snaps
                .iter()
                .map(|(id, i)| SnapEntry {
                    id: *id,
                    name: i.name.clone(),
                    size_bytes: i.size_bytes,
                    created_unix_secs: i.created_unix_secs,
                    protected: i.protected,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Takes snapshot `snap` of `image`: crash-consistent with the writes running (see the
/// module documentation); returns its id once every primary of the pool enforces it.
pub async fn create(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    snap: &str,
) -> Result<u64, ImageError> {
    let img = crate::Image::open(client.clone(), pool, image).await?;
    // A writer that acknowledges from a client write log may hold acknowledged writes
    // only in its log: the snapshot would miss them.
    if let Some(h) = crate::lock::write_log_holder(client, pool, image) {
        return Err(ImageError::Snapshot(format!(
            "{image} is served with a client write log ({h}): a snapshot would miss the \
             acknowledged writes still in the log; serve it without --write-log (or stop \
             serving it) to take snapshots"
        )));
    }
    let done = client
        .snap_command("create", pool, image, snap, img.size_bytes())
        .await
        .map_err(snap_error)?;
    Ok(done.id)
}

/// Protects or unprotects snapshot `snap` (a protected snapshot cannot be removed).
pub async fn protect(
    client: &spindle_client::Client,
    pool: &str,
    image: &str,
    snap: &str,
    protected: bool,
) -> Result<(), ImageError> {
    let verb = if protected { "protect" } else { "unprotect" };
    client
        .snap_command(verb, pool, image, snap, 0)
        .await
        .map_err(snap_error)?;
    Ok(())
}

/// A monitor's refusal of an image command as an image error (other failures as they are).
pub(crate) fn snap_error(e: ClientError) -> ImageError {
    match e {
        ClientError::Command(m) => ImageError::Snapshot(m),
        e => ImageError::Backend(e),
    }
}

/// Removes snapshot `snap`. The copies only it read are freed in the background by the
/// leader monitor's trimmer (or at once by [`trim`]); returns the image's removal count
/// with this one (`ImageSnaps::trimmed` reaches it once they are freed).
pub async fn remove(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    snap: &str,
) -> Result<u64, ImageError> {
    client
        .snap_command("rm", pool, image, snap, 0)
        .await
        .map_err(snap_error)?;
    // The command returned once this client's map has the removal.
    Ok(client.image_snaps(pool, image).map_or(0, |s| s.removals))
}

/// Deletes the snapshot copies of `image` that no live snapshot reads (left by removed
/// snapshots), judged by the backend's map. Returns how many went.
pub async fn trim<B: ObjectBackend>(
    client: &B,
    pool: &str,
    image: &str,
    progress: impl FnMut(u64, u64) + Send,
) -> Result<u64, ImageError> {
    let snaps = client.image_snaps(pool, image).unwrap_or_default();
    trim_for(client, pool, image, &snaps, progress).await
}

/// [`trim`] judged by `snaps`, the image's snapshots in some map (an older map than the
/// listing is safe: removals only add copies to delete, and copies newer than its `seq`
/// stay).
pub async fn trim_for<B: ObjectBackend>(
    client: &B,
    pool: &str,
    image: &str,
    snaps: &spindle_map::ImageSnaps,
    mut progress: impl FnMut(u64, u64) + Send,
) -> Result<u64, ImageError> {
    let live: Vec<u64> = snaps.snaps.keys().copied().collect();
    let mut copies: HashMap<u64, Vec<u64>> = HashMap::new();
    for object in client.list_objects(pool).await? {
        if let Some((index, c)) = parse_snap_object(image, &object) {
            copies.entry(index).or_default().push(c);
        }
    }
    let mut doomed = Vec::new();
    for (index, ids) in copies.iter_mut() {
        ids.sort_unstable();
        for c in unneeded_copies(ids, &live, snaps.seq) {
            doomed.push(snap_object_name(image, *index, c));
        }
    }
    let total = doomed.len() as u64;
    progress(0, total);
    let mut done = 0u64;
    for batch in doomed.chunks(crate::image::PARALLEL_OPS_MAX) {
        let futures = batch.iter().map(|name| async move {
            match client.delete_object(pool, name).await {
                Ok(()) | Err(ClientError::NotFound(_)) => Ok(()),
                Err(e) => Err(ImageError::Backend(e)),
            }
        });
        for r in futures::future::join_all(futures).await {
            r?;
        }
        done += batch.len() as u64;
        progress(done, total);
    }
    Ok(total)
}

/// Rolls `image` back to snapshot `snap`: its size and every object's content become the
/// snapshot's (through the normal write path, so newer snapshots keep theirs). The caller
/// holds the image's lock. `progress(done, total)` per object.
pub async fn rollback(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    snap: &str,
    mut progress: impl FnMut(u64, u64) + Send,
) -> Result<(), ImageError> {
    let head = crate::Image::open(client.clone(), pool, image).await?;
    let at = crate::Image::open_snap(client.clone(), pool, image, snap).await?;
    let size = at.size_bytes();
    if head.size_bytes() != size {
        head.resize(size).await?;
    }
    let os = head.object_size_bytes();
    let count = size.div_ceil(os);
    progress(0, count);
    let mut index = 0u64;
    while index < count {
        let end = (index + crate::image::PARALLEL_OPS_MAX as u64).min(count);
        let jobs = (index..end).map(|i| {
            let (head, at) = (&head, &at);
            async move {
                let offset = i * os;
                let len = os.min(size - offset);
                let data = at.read(offset, len).await?;
                if data.iter().all(|&b| b == 0) {
                    head.write_zeroes(offset, len).await
                } else {
                    head.write(offset, &data).await
                }
            }
        });
        for r in futures::future::join_all(jobs).await {
            r?;
        }
        index = end;
        progress(index, count);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_not_data_objects() {
        let n = snap_object_name("vm.1", 0x2a, 7);
        assert_eq!(n, "img.vm.1.000000000000002a@0000000000000007");
        assert_eq!(parse_snap_object("vm.1", &n), Some((0x2a, 7)));
        assert_eq!(parse_snap_object("vm", &n), None);
        assert_eq!(spindle_map::image_data_object(&n), None);
        assert_eq!(
            spindle_map::image_data_object("img.vm.1.000000000000002a"),
            Some(("vm.1", 0x2a))
        );
        assert_eq!(spindle_map::image_data_object("img.vm.header"), None);
    }

    #[test]
    fn a_snapshot_reads_the_first_copy_at_or_after_it() {
        assert_eq!(source_at(&[], 3), None);
        assert_eq!(source_at(&[2, 5, 9], 1), Some(2));
        assert_eq!(source_at(&[2, 5, 9], 3), Some(5));
        assert_eq!(source_at(&[2, 5, 9], 5), Some(5));
        assert_eq!(source_at(&[2, 5, 9], 10), None);
    }

    #[test]
    fn copies_go_when_no_live_snapshot_reads_them() {
        // Copies for 2, 5, 9; live snapshots 1 and 7: copy 2 serves 1, copy 9 serves 7,
        // copy 5 serves nothing.
        assert_eq!(unneeded_copies(&[2, 5, 9], &[1, 7], 9), vec![5]);
        assert_eq!(unneeded_copies(&[2, 5, 9], &[], 9), vec![2, 5, 9]);
        assert_eq!(
            unneeded_copies(&[2, 5, 9], &[2, 5, 9], 9),
            Vec::<u64>::new()
        );
        // A snapshot newer than every copy reads the head: all copies below it may go if
        // nothing older is live.
        assert_eq!(unneeded_copies(&[2, 5], &[8], 8), vec![2, 5]);
        // Copies for snapshots newer than the map judged by stay (snapshot 9 may be live
        // in a newer map and read copy 9).
        assert_eq!(unneeded_copies(&[2, 5, 9], &[1], 7), vec![5]);
        assert_eq!(unneeded_copies(&[2, 5, 9], &[], 4), vec![2]);
    }
}
