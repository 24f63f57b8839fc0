//! Whole-image operations that touch the cluster's bookkeeping (the image's lock, its
//! snapshot record, its parent's list of clones), shared by the `spindle image` commands
//! and the Python bindings so both keep the same rules.

use crate::image::{read_header_of, Image, ImageError};
use crate::lock::{holder_description, ImageLock, LockOptions};
use spindle_client::Client;
use std::future::Future;
use std::sync::Arc;

/// Runs `work` holding `image`'s exclusive lock as `program` (refused while a live holder
/// has it: someone serves the image), then releases the lock, whatever `work` returned.
pub async fn with_lock<T>(
    client: &Arc<Client>,
    pool: &str,
    image: &str,
    program: &str,
    work: impl Future<Output = T>,
) -> Result<T, ImageError> {
    let lock = ImageLock::acquire(
        client.clone(),
        pool,
        image,
        &holder_description(program),
        &LockOptions::default(),
    )
    .await?;
    let out = work.await;
    lock.release().await;
    Ok(out)
}

/// Removes image `name` of `pool` as `program`: refused while it has snapshots or someone
/// serves it (its lock is taken first, so no writer has data pulled from under it); then its
/// data objects and header, the copies its removed snapshots left, its snapshot record, and
/// its entry in its parent snapshot's list of clones. `progress(done, total)` counts data
/// objects.
pub async fn remove(
    client: &Arc<Client>,
    pool: &str,
    name: &str,
    program: &str,
    progress: impl FnMut(u64, u64) + Send,
) -> Result<(), ImageError> {
    let snaps = crate::snap::list(client, pool, name);
    if let Some(first) = snaps.first() {
        return Err(ImageError::Snapshot(format!(
            "image {name} has {} snapshots: remove them first (`spindle image snap rm {name}@{}`)",
            snaps.len(),
            first.name
        )));
    }
    // A clone leaves its parent snapshot's list once it is gone.
    let parent = match read_header_of(&**client, pool, name).await {
        Ok(h) => h.parent,
        Err(ImageError::NotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let work = Image::remove(client.clone(), pool, name, progress);
    with_lock(client, pool, name, program, work).await??;
    // Copies left by removed snapshots, then the image's snapshot entry.
    if client.image_snaps(pool, name).is_some() {
        crate::snap::trim(&**client, pool, name, |_, _| {}).await?;
        client.snap_command("forget", pool, name, "", 0).await?;
    }
    if let Some(parent) = parent {
        crate::clone::unregister(client, &parent, pool, name).await?;
    }
    Ok(())
}
