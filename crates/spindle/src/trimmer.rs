//! The snapshot trimmer: the leader monitor frees, in the background, the snapshot copies
//! that removed snapshots left (`spindle image snap rm` returns once the map has the
//! removal).
//!
//! The map says which images have copies to free (`ImageSnaps::trim_pending`: more
//! removals than trims recorded). For each, the trimmer deletes the copies no live
//! snapshot of that map reads (`spindle_image::snap::trim_for`, through an ordinary
//! client authenticated as `mon.`), then records the removal count it judged by
//! (`snap trimmed`). Judging by the map it read is safe while writers and snapshot
//! commands run: a later removal only adds copies to free (the trim stays pending for it)
//! and copies newer than that map's `seq` are never touched.
//!
//! Only the leader trims; a new leader finds the same pending images in the map, so a
//! trim cut short by a failover is redone (deleting a copy twice finds it gone).

use spindle_client::{Client, ClientConfig};
use spindle_mon::Monitor;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the leader looks for images to trim: the delay between `snap rm` and the
/// first copy freed, at most (a map read, no I/O, when nothing is pending).
pub const TRIM_POLL_MS: u64 = 1_000;
/// Longest wait before retrying an image whose trim failed (doubling from the poll
/// interval): a pool that is down is not hammered, and comes back within a minute.
pub const TRIM_RETRY_MAX_MS: u64 = 60_000;

/// Runs the trimmer of monitor `mon`, reachable at `addr`, forever.
pub async fn run(mon: Arc<Monitor>, addr: String) {
    let mut client: Option<Arc<Client>> = None;
    // Per (pool id, image): failures in a row and when to try again.
    let mut backoff: HashMap<(u32, String), (u32, Instant)> = HashMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(TRIM_POLL_MS)).await;
        if !mon.is_leader() {
            client = None;
            backoff.clear();
            continue;
        }
        let map = match mon.current_map() {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::error!("snapshot trimmer: the applied map does not decode: {e}");
                continue;
            }
            None => continue,
        };
        let now = Instant::now();
        let pending: Vec<_> = map
            .image_snaps
            .iter()
            .filter(|(key, s)| {
                s.trim_pending() && backoff.get(*key).is_none_or(|(_, at)| *at <= now)
            })
            .map(|(key, s)| (key.clone(), s.clone()))
            .collect();
        backoff.retain(|key, _| map.image_snaps.get(key).is_some_and(|s| s.trim_pending()));
        if pending.is_empty() {
            continue;
        }
        let c = match &client {
            Some(c) => c.clone(),
            None => {
                let mut config = ClientConfig::new(addr.clone());
                config.auth = mon.identity();
                match Client::connect(config).await {
                    Ok(c) => {
                        let c = Arc::new(c);
                        client = Some(c.clone());
                        c
                    }
                    Err(e) => {
                        tracing::warn!("snapshot trimmer: cannot connect: {e}");
                        continue;
                    }
                }
            }
        };
        for (key, snaps) in pending {
            let Some(pool) = map.pools.get(&key.0).map(|p| p.name.clone()) else {
                continue;
            };
            let image = &key.1;
            let started = Instant::now();
            let result =
                match spindle_image::snap::trim_for(&*c, &pool, image, &snaps, |_, _| {}).await {
                    Ok(freed) => c
                        .snap_trimmed(&pool, image, snaps.removals)
                        .await
                        .map(|()| freed)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
            match result {
                Ok(freed) => {
                    backoff.remove(&key);
                    tracing::info!(
                        "snapshot trimmer: freed {freed} copies of {pool}/{image} in {:?}",
                        started.elapsed()
                    );
                }
                Err(e) => {
                    let failures = backoff.get(&key).map_or(0, |(n, _)| *n) + 1;
                    let wait_ms = (TRIM_POLL_MS << failures.min(16)).min(TRIM_RETRY_MAX_MS);
                    tracing::warn!(
                        "snapshot trimmer: {pool}/{image}: {e} (failure {failures}; next try in {wait_ms} ms)"
                    );
                    backoff.insert(
                        key,
                        (failures, Instant::now() + Duration::from_millis(wait_ms)),
                    );
                }
            }
        }
    }
}
