//! Clones: an image that starts as a copy of a protected snapshot of another image (its
//! parent) and copies nothing up front.
//!
//! Layout: the clone's header names the parent snapshot (`ImageHeader::parent`: pool,
//! image, snapshot name and id, and the overlap: how many of the clone's first bytes read
//! through to the parent), with format version [`crate::image::CLONE_FORMAT_VERSION`] so
//! that a build without clones refuses it instead of reading zeros. The parent snapshot
//! lists its clones in the cluster map (`SnapInfo::children`): the monitor registers a
//! clone only of a protected snapshot and refuses to unprotect a snapshot with clones, so
//! a parent cannot go away under a clone.
//!
//! Reading object `i` of a clone: the clone's own data object if it exists, else the
//! parent snapshot's bytes of the same image range (zeros past the overlap).
//!
//! Writing: before the first change of object `i` inside the overlap (a write, a zeroing,
//! a delete), the writer *copies up*: if the clone has no object `i`, it writes the
//! parent's bytes of that range as the clone's object `i` (nothing when they are all
//! zeros). A copy-up changes nothing the clone reads, so it needs no snapshot copy of its
//! own; the change after it is preserved for the clone's snapshots as usual
//! (`crate::snap`), and the preserved content is then the clone's own object, parent data
//! included. Inside the overlap an object is never deleted (it would read the parent's
//! data again): it is replaced by an empty one.
//!
//! One writer per image (the image's lock), so the copied-up set and the per-object locks
//! live in the writer's memory; every mutation of an object takes its lock for the
//! copy-up, so a copy-up never overwrites a newer write.
//!
//! Flatten copies up every object of the overlap, then drops the parent from the header,
//! then unregisters the clone from the snapshot (run again after a crash, it finishes).

use crate::image::{data_object_name, Image, ImageError, ObjectBackend};
use spindle_client::ClientError;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Guard retries before a copy-up gives up (as `crate::snap`'s writes).
const GUARD_RETRIES_MAX: u32 = 64;

/// A clone's parent snapshot and its copy-up state (one per open image).
pub(crate) struct CloneLink<B: ObjectBackend> {
    /// The parent snapshot, read-only (itself perhaps a clone).
    pub parent: Arc<Image<B>>,
    /// Objects known to exist in the clone (copied up, or found), so each is checked once.
    present: Mutex<HashSet<u64>>,
    /// One lock per object being copied up.
    copying: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// Objects a read found missing in the clone (read from the parent straight away),
    /// kept only when nobody else can create them: this handle is the image's only
    /// writer, or it is a snapshot view (an object created in the head after the
    /// snapshot is a copy-up, which reads the same, or a change, which is preserved in a
    /// snapshot copy the view reads first). A copy-up drops its object from here.
    absent: Mutex<Option<HashSet<u64>>>,
    /// Copy-ups so far: a read's "missing" counts only if none happened while it ran.
    copy_ups: std::sync::atomic::AtomicU64,
}

impl<B: ObjectBackend> CloneLink<B> {
    pub fn new(parent: Arc<Image<B>>) -> Self {
        CloneLink {
            parent,
            present: Mutex::new(HashSet::new()),
            copying: Mutex::new(HashMap::new()),
            absent: Mutex::new(None),
            copy_ups: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Lets reads remember missing objects (see `absent`).
    pub fn cache_absent(&self) {
        let mut a = spindle_types::sync::lock(&self.absent);
        if a.is_none() {
            *a = Some(HashSet::new());
        }
    }

    /// Ok if object `index` is known to be missing in the clone; else the copy-up count
    /// to hand to [`CloneLink::note_absent`] if the read finds it missing.
    pub fn absent_since(&self, index: u64) -> Result<(), u64> {
        let generation = self.copy_ups.load(std::sync::atomic::Ordering::Acquire);
        match &*spindle_types::sync::lock(&self.absent) {
            Some(set) if set.contains(&index) => Ok(()),
            _ => Err(generation),
        }
    }

    /// Remembers that object `index` was missing, unless a copy-up ran since the read
    /// began (`generation`), or this writer ever changed the object (a copy-up that found
    /// only zeros writes nothing; the change after it creates the object).
    pub fn note_absent(&self, index: u64, generation: u64) {
        if self.is_present(index) {
            return;
        }
        let mut a = spindle_types::sync::lock(&self.absent);
        if let Some(set) = a.as_mut() {
            if self.copy_ups.load(std::sync::atomic::Ordering::Acquire) == generation {
                set.insert(index);
            }
        }
    }

    fn forget_absent(&self, index: u64) {
        let mut a = spindle_types::sync::lock(&self.absent);
        self.copy_ups
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if let Some(set) = a.as_mut() {
            set.remove(&index);
        }
    }

    fn is_present(&self, index: u64) -> bool {
        spindle_types::sync::lock(&self.present).contains(&index)
    }

    /// Makes sure object `index` of clone `image` exists if the parent has data for it
    /// (see the module documentation); nothing outside the overlap.
    pub async fn copy_up(
        &self,
        backend: &B,
        pool: &str,
        image: &str,
        index: u64,
        object_size_bytes: u64,
        overlap_bytes: u64,
    ) -> Result<(), ImageError> {
        let start = index * object_size_bytes;
        if start >= overlap_bytes || self.is_present(index) {
            return Ok(());
        }
        let lock = spindle_types::sync::lock(&self.copying)
            .entry(index)
            .or_default()
            .clone();
        let result = {
            let _held = lock.lock().await;
            if self.is_present(index) {
                Ok(())
            } else {
                // From here on the object may exist: no read may remember it missing.
                self.forget_absent(index);
                let len = object_size_bytes.min(overlap_bytes - start);
                self.copy_object(backend, pool, image, index, start, len)
                    .await
            }
        };
        {
            let mut copying = spindle_types::sync::lock(&self.copying);
            if Arc::strong_count(&lock) == 2 {
                copying.remove(&index);
            }
        }
        result?;
        spindle_types::sync::lock(&self.present).insert(index);
        // Again after the copy: a read that found the object missing while it was being
        // written must not remember it (the count moved on).
        self.forget_absent(index);
        Ok(())
    }

    async fn copy_object(
        &self,
        backend: &B,
        pool: &str,
        image: &str,
        index: u64,
        start: u64,
        len: u64,
    ) -> Result<(), ImageError> {
        let object = data_object_name(image, index);
        match backend.stat_object(pool, &object).await {
            Ok(_) => return Ok(()),
            Err(ClientError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let mut data = self.parent.read(start, len).await?;
        // Trailing zeros read as zeros anyway (reads past an object's end are zeros).
        let used = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        if used == 0 {
            // Nothing to copy: the range reads as zeros through the parent too.
            return Ok(());
        }
        data.truncate(used);
        // Written under the image's snapshot guard without preserving first: the
        // clone reads the same bytes before and after.
        let mut attempts = 0u32;
        loop {
            let guard = backend.snap_guard(pool, image);
            let write = backend.write_full_object(pool, &object, data.clone());
            match backend.with_guard(guard, write).await {
                Err(ClientError::SnapChanged(m)) => {
                    attempts += 1;
                    if attempts >= GUARD_RETRIES_MAX {
                        return Err(ClientError::SnapChanged(m).into());
                    }
                    if attempts > 2 {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                }
                r => return r.map_err(ImageError::Backend),
            }
        }
    }
}

/// Clones snapshot `parent`@`snap` (in `parent_pool`) as image `child` in `child_pool`:
/// registers the clone with the snapshot (which must be protected), then writes its
/// header. `object_size_bytes`: the clone's (None: the parent's).
pub async fn clone(
    client: &Arc<spindle_client::Client>,
    parent_pool: &str,
    parent: &str,
    snap: &str,
    child_pool: &str,
    child: &str,
    object_size_bytes: Option<u64>,
) -> Result<(), ImageError> {
    crate::image::check_image_name(child)?;
    let at = Image::open_snap(client.clone(), parent_pool, parent, snap).await?;
    match crate::image::read_header_of(&**client, child_pool, child).await {
        Ok(_) => return Err(ImageError::Exists(child.to_string())),
        Err(ImageError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    client
        .snap_child(true, parent_pool, parent, snap, child_pool, child)
        .await
        .map_err(crate::snap::snap_error)?;
    let os = object_size_bytes.unwrap_or_else(|| at.object_size_bytes());
    match Image::create_clone(client.clone(), child_pool, child, &at, os).await {
        Ok(_) => Ok(()),
        Err(e) => {
            // Not a clone after all: let the snapshot go again.
            let _ = client
                .snap_child(false, parent_pool, parent, snap, child_pool, child)
                .await;
            Err(e)
        }
    }
}

/// Flattens clone `image`: copies what it reads from its parent, drops the parent, and
/// unregisters it from the parent snapshot. The caller holds the image's lock.
/// `progress(done, total)` per object.
pub async fn flatten(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    progress: impl FnMut(u64, u64) + Send,
) -> Result<(), ImageError> {
    let img = Image::open(client.clone(), pool, image).await?;
    let Some(parent) = img.parent() else {
        return Err(ImageError::Snapshot(format!("{image} is not a clone")));
    };
    img.flatten(progress).await?;
    unregister(client, &parent, pool, image).await
}

/// Drops clone `pool`/`image` from its parent snapshot's clones (after a flatten or a
/// removal; nothing if it is not registered).
pub async fn unregister(
    client: &spindle_client::Client,
    parent: &crate::image::ParentSpec,
    pool: &str,
    image: &str,
) -> Result<(), ImageError> {
    client
        .snap_child(
            false,
            &parent.pool,
            &parent.image,
            &parent.snap,
            pool,
            image,
        )
        .await
        .map_err(crate::snap::snap_error)?;
    Ok(())
}

/// The clones of snapshot `image`@`snap` as `POOL/IMAGE`, from the map.
pub fn children(
    client: &spindle_client::Client,
    pool: &str,
    image: &str,
    snap: &str,
) -> Result<Vec<String>, ImageError> {
    let map = client.map();
    let snaps = client.image_snaps(pool, image).unwrap_or_default();
    let (_, info) = snaps
        .by_name(snap)
        .ok_or_else(|| ImageError::NoSnapshot(format!("{image}@{snap}")))?;
    Ok(info
        .children
        .iter()
        .map(|(p, c)| {
            let pool = map
                .pools
                .get(p)
                .map_or_else(|| format!("pool#{p}"), |p| p.name.clone());
            format!("{pool}/{c}")
        })
        .collect())
}

/// Drops registered clones of `image`@`snap` that do not exist (a clone interrupted between
/// its registration and its header, or a removal interrupted after its header went) or
/// that name another parent. Returns how many went.
pub async fn prune_children(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    snap: &str,
) -> Result<u64, ImageError> {
    let map = client.map();
    let snaps = client.image_snaps(pool, image).unwrap_or_default();
    let Some((id, info)) = snaps.by_name(snap) else {
        return Ok(0);
    };
    let mut pruned = 0;
    for (child_pool_id, child) in info.children.clone() {
        let Some(child_pool) = map.pools.get(&child_pool_id).map(|p| p.name.clone()) else {
            continue;
        };
        let stale = match crate::image::read_header_of(&**client, &child_pool, &child).await {
            Err(ImageError::NotFound(_)) => true,
            Err(e) => return Err(e),
            Ok(h) => h
                .parent
                .is_none_or(|p| p.pool != pool || p.image != image || p.snap_id != id),
        };
        if stale {
            client
                .snap_child(false, pool, image, snap, &child_pool, &child)
                .await
                .map_err(crate::snap::snap_error)?;
            pruned += 1;
        }
    }
    Ok(pruned)
}
