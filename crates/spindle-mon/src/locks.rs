//! Exclusive image locks and fencing: the monitor's decisions, without I/O.
//!
//! A lock lives in the cluster map (`ClusterMap::image_locks`), so it survives monitor
//! restarts and every daemon and client sees who holds it. Its *lease* lives here, in
//! memory: renewals change no map. A monitor that starts (or restarts) gives every lock in
//! its map a full lease, as it gives every daemon a full heartbeat grace.
//!
//! Taking over a lock another client holds — because its lease ran out, or because the
//! caller asked to (`--break-lock`) — fences that client in the same map change
//! (`ClusterMap::fenced`). A primary refuses the writes of a fenced client. The new holder
//! talks to daemons at that epoch or later, and a daemon serves no request of a newer
//! epoch before it has the map (`NeedMap`), so every write of the old holder that a daemon
//! accepted is ordered before anything the new holder does there.
//!
//! Invariants: at most one holder per image; a takeover always fences the previous
//! holder; the fenced list stays within `FENCED_CLIENTS_MAX`, oldest first out, and
//! entries older than `FENCE_KEEP_SECS` are dropped when a new one is added.

use crate::core::{propose, MonCore};
use crate::reply::{AdminReply, ImageLocked, LockReleased, LockRenewed};
use spindle_map::{ClusterMap, ImageLock};
use spindle_types::limits::{
    FENCED_CLIENTS_MAX, FENCE_KEEP_SECS, IMAGE_LOCKS_MAX, IMAGE_LOCK_HOLDER_BYTES_MAX,
    IMAGE_LOCK_LEASE_MS_DEFAULT, IMAGE_NAME_BYTES_MAX,
};

/// The lease of one lock, in the monitor's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub client: u64,
    pub lease_ms: u64,
    pub until_ms: u64,
}

type Key = (u32, String);

fn key(map: &ClusterMap, pool: &str, image: &str) -> Result<Key, String> {
    let pool_id = map
        .pool_by_name(pool)
        .ok_or_else(|| format!("no pool named '{pool}'"))?
        .id;
    if image.is_empty() || image.len() > IMAGE_NAME_BYTES_MAX {
        return Err(format!(
            "image name must be 1..={IMAGE_NAME_BYTES_MAX} bytes"
        ));
    }
    Ok((pool_id, image.to_string()))
}

/// Adds `client` to the fenced list at `now_unix_secs`, dropping expired entries and, past
/// the limit, the oldest.
fn fence(map: &mut ClusterMap, client: u64, now_unix_secs: u64) {
    map.fenced
        .retain(|_, at| now_unix_secs.saturating_sub(*at) < FENCE_KEEP_SECS);
    map.fenced.insert(client, now_unix_secs);
    while map.fenced.len() > FENCED_CLIENTS_MAX {
        let oldest = map
            .fenced
            .iter()
            .min_by_key(|(c, at)| (**at, **c))
            .map(|(c, _)| *c);
        match oldest {
            Some(c) if c != client => {
                map.fenced.remove(&c);
            }
            _ => break,
        }
    }
    debug_assert!(map.fenced.len() <= FENCED_CLIENTS_MAX);
}

impl MonCore {
    /// Leases for the locks of the map just installed: every lock without one gets a full
    /// default lease from `now_ms`; leases of locks gone (or now someone else's) are dropped.
    pub(crate) fn sync_leases(&mut self, now_ms: u64) {
        let locks = &self.map.image_locks;
        self.leases
            .retain(|k, l| locks.get(k).is_some_and(|lock| lock.client == l.client));
        for (k, lock) in locks {
            self.leases.entry(k.clone()).or_insert(Lease {
                client: lock.client,
                lease_ms: IMAGE_LOCK_LEASE_MS_DEFAULT,
                until_ms: now_ms + IMAGE_LOCK_LEASE_MS_DEFAULT,
            });
        }
    }

    /// `lock acquire`: see the module documentation.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lock_acquire(
        &mut self,
        now_ms: u64,
        now_unix_secs: u64,
        pool: &str,
        image: &str,
        client: u64,
        lease_ms: u64,
        holder: &str,
        take_over: bool,
    ) -> Result<(AdminReply, Option<ClusterMap>), String> {
        let k = key(&self.map, pool, image)?;
        if holder.len() > IMAGE_LOCK_HOLDER_BYTES_MAX {
            return Err(format!(
                "holder description is longer than {IMAGE_LOCK_HOLDER_BYTES_MAX} bytes"
            ));
        }
        if self.map.fenced.contains_key(&client) {
            return Err(format!(
                "client {client:016x} is fenced; a fenced client cannot take a lock"
            ));
        }
        let current = self.map.image_locks.get(&k).cloned();
        let lease = Lease {
            client,
            lease_ms,
            until_ms: now_ms + lease_ms,
        };
        let (reply, next) = match current {
            Some(l) if l.client == client => {
                // Already ours: a renewal.
                (
                    ImageLocked {
                        epoch: self.map.epoch,
                        generation: l.generation,
                        taken_from: None,
                    },
                    None,
                )
            }
            Some(l) => {
                let left_ms = self
                    .leases
                    .get(&k)
                    .filter(|le| le.client == l.client)
                    .map_or(0, |le| le.until_ms.saturating_sub(now_ms));
                if left_ms > 0 && !take_over {
                    // "is locked by" is what `spindle_image::lock` recognises a refusal by
                    // (pinned by spindle-client's tests/admin.rs and spindle's tests/nbd.rs).
                    return Err(format!(
                        "image {pool}/{image} is locked by {} (client {:016x}, lock generation {}); \
                         its lease is live ({left_ms} ms left). Stop that client, or take the lock \
                         over with --break-lock: the holder is then fenced and its writes are refused",
                        l.holder, l.client, l.generation
                    ));
                }
                let generation = l.generation + 1;
                let (_, next) = propose(&self.map, |m| {
                    fence(m, l.client, now_unix_secs);
                    m.image_locks.insert(
                        k.clone(),
                        ImageLock {
                            client,
                            generation,
                            holder: holder.to_string(),
                            since_unix_secs: now_unix_secs,
                        },
                    );
                    Ok(())
                })?;
                let why = if left_ms > 0 {
                    "broken"
                } else {
                    "lease expired"
                };
                (
                    ImageLocked {
                        epoch: self.map.epoch + 1,
                        generation,
                        taken_from: Some(format!(
                            "{} (client {:016x}, {why}; fenced)",
                            l.holder, l.client
                        )),
                    },
                    next,
                )
            }
            None => {
                if self.map.image_locks.len() >= IMAGE_LOCKS_MAX {
                    return Err(format!(
                        "the cluster holds {IMAGE_LOCKS_MAX} image locks, its limit"
                    ));
                }
                let (_, next) = propose(&self.map, |m| {
                    m.image_locks.insert(
                        k.clone(),
                        ImageLock {
                            client,
                            generation: 1,
                            holder: holder.to_string(),
                            since_unix_secs: now_unix_secs,
                        },
                    );
                    Ok(())
                })?;
                (
                    ImageLocked {
                        epoch: self.map.epoch + 1,
                        generation: 1,
                        taken_from: None,
                    },
                    next,
                )
            }
        };
        // The lease counts from now; if the shell fails to commit the map, `sync_leases`
        // drops it at the next install.
        self.leases.insert(k, lease);
        Ok((AdminReply::ImageLocked(reply), next))
    }

    /// `lock renew`: extends the lease of a lock the caller holds; an error says the lock
    /// is no longer the caller's (taken over, or released).
    pub(crate) fn lock_renew(
        &mut self,
        now_ms: u64,
        pool: &str,
        image: &str,
        client: u64,
    ) -> Result<(AdminReply, Option<ClusterMap>), String> {
        let k = key(&self.map, pool, image)?;
        match self.map.image_locks.get(&k) {
            Some(l) if l.client == client => {
                let lease_ms = self
                    .leases
                    .get(&k)
                    .filter(|le| le.client == client)
                    .map_or(IMAGE_LOCK_LEASE_MS_DEFAULT, |le| le.lease_ms);
                self.leases.insert(
                    k,
                    Lease {
                        client,
                        lease_ms,
                        until_ms: now_ms + lease_ms,
                    },
                );
                Ok((AdminReply::LockRenewed(LockRenewed { lease_ms }), None))
            }
            Some(l) => Err(format!(
                "lock lost: image {pool}/{image} is now locked by {} (client {:016x})",
                l.holder, l.client
            )),
            None => Err(format!("lock lost: image {pool}/{image} is not locked")),
        }
    }

    /// `lock release`: drops the lock if the caller holds it.
    pub(crate) fn lock_release(
        &mut self,
        pool: &str,
        image: &str,
        client: u64,
    ) -> Result<(AdminReply, Option<ClusterMap>), String> {
        let k = key(&self.map, pool, image)?;
        let (_, next) = propose(&self.map, |m| {
            if m.image_locks.get(&k).is_some_and(|l| l.client == client) {
                m.image_locks.remove(&k);
            }
            Ok(())
        })?;
        let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
        Ok((AdminReply::LockReleased(LockReleased { epoch }), next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{first_map, InitSpec, MonTiming};

    fn core(now_ms: u64) -> MonCore {
        let spec = InitSpec {
            osd_count: 3,
            osd_hosts: Vec::new(),
            default_pool: Some(("rbd".into(), 3, 2, 8)),
        };
        let map = first_map(&spec, 7).expect("first map");
        MonCore::new(
            map,
            MonTiming {
                down_after_ms: 5_000,
                out_after_ms: 0,
            },
            now_ms,
        )
    }

    fn commit(c: &mut MonCore, next: Option<ClusterMap>, now_ms: u64) {
        if let Some(next) = next {
            c.install(next, now_ms);
        }
    }

    fn locked(r: AdminReply) -> ImageLocked {
        match r {
            AdminReply::ImageLocked(l) => l,
            other => panic!("not a lock reply: {other:?}"),
        }
    }

    #[test]
    fn a_live_lock_refuses_a_second_client_until_broken_and_the_holder_is_fenced() {
        let mut c = core(0);
        let (r, next) = c
            .lock_acquire(0, 100, "rbd", "vm", 0xa, 9_000, "A", false)
            .unwrap();
        assert_eq!(locked(r).generation, 1);
        commit(&mut c, next, 0);
        // Idempotent for the holder: no new epoch.
        let epoch = c.epoch();
        let (_, next) = c
            .lock_acquire(10, 100, "rbd", "vm", 0xa, 9_000, "A", false)
            .unwrap();
        assert!(next.is_none());
        assert_eq!(c.epoch(), epoch);
        // Another client, lease live: refused with the holder named.
        let e = c
            .lock_acquire(1_000, 101, "rbd", "vm", 0xb, 9_000, "B", false)
            .unwrap_err();
        assert!(
            e.contains("locked by A") && e.contains("--break-lock"),
            "{e}"
        );
        assert!(c.map().fenced.is_empty());
        // Broken: B holds it, A is fenced, in one new epoch.
        let (r, next) = c
            .lock_acquire(1_000, 101, "rbd", "vm", 0xb, 9_000, "B", true)
            .unwrap();
        let r = locked(r);
        assert_eq!((r.generation, r.epoch), (2, epoch + 1));
        assert!(r.taken_from.unwrap().contains("broken"));
        commit(&mut c, next, 1_000);
        let pool = c.map().pool_by_name("rbd").unwrap().id;
        assert_eq!(c.map().image_locks[&(pool, "vm".into())].client, 0xb);
        assert_eq!(c.map().fenced.get(&0xa), Some(&101));
        // A learns it lost the lock; a fenced client cannot take a lock again.
        let e = c.lock_renew(1_100, "rbd", "vm", 0xa).unwrap_err();
        assert!(e.starts_with("lock lost"), "{e}");
        let e = c
            .lock_acquire(1_100, 101, "rbd", "vm", 0xa, 9_000, "A", true)
            .unwrap_err();
        assert!(e.contains("fenced"), "{e}");
    }

    #[test]
    fn an_expired_lease_is_taken_over_without_breaking_and_renewals_keep_it_alive() {
        let mut c = core(0);
        let (_, next) = c
            .lock_acquire(0, 5, "rbd", "vm", 0xa, 3_000, "A", false)
            .unwrap();
        commit(&mut c, next, 0);
        // Renewals every second keep the lease live far past its length.
        for t in (1_000..10_000).step_by(1_000) {
            c.lock_renew(t, "rbd", "vm", 0xa).unwrap();
        }
        assert!(c
            .lock_acquire(11_999, 6, "rbd", "vm", 0xb, 3_000, "B", false)
            .is_err());
        // No renewal for longer than the lease: B takes it over, A fenced.
        let (r, next) = c
            .lock_acquire(12_001, 6, "rbd", "vm", 0xb, 3_000, "B", false)
            .unwrap();
        assert!(locked(r).taken_from.unwrap().contains("lease expired"));
        commit(&mut c, next, 12_001);
        assert!(c.map().fenced.contains_key(&0xa));
        // Release by a non-holder changes nothing; by the holder drops the lock.
        let (_, next) = c.lock_release("rbd", "vm", 0xa).unwrap();
        assert!(next.is_none());
        let (_, next) = c.lock_release("rbd", "vm", 0xb).unwrap();
        commit(&mut c, next, 12_002);
        assert!(c.map().image_locks.is_empty());
    }

    #[test]
    fn a_restarted_monitor_gives_every_lock_a_full_lease() {
        let mut c = core(0);
        let (_, next) = c
            .lock_acquire(0, 5, "rbd", "vm", 0xa, 3_000, "A", false)
            .unwrap();
        commit(&mut c, next, 0);
        // The same map in a new core, long after: the lease restarts from the core's start.
        let mut again = MonCore::new(c.map().clone(), *c.timing(), 1_000_000);
        assert!(again
            .lock_acquire(1_000_001, 6, "rbd", "vm", 0xb, 3_000, "B", false)
            .is_err());
        assert!(again
            .lock_acquire(
                1_000_000 + IMAGE_LOCK_LEASE_MS_DEFAULT + 1,
                6,
                "rbd",
                "vm",
                0xb,
                3_000,
                "B",
                false
            )
            .is_ok());
    }

    #[test]
    fn the_fenced_list_is_bounded_and_expires() {
        let mut m = core(0).map().clone();
        for c in 1..=(FENCED_CLIENTS_MAX as u64 + 10) {
            fence(&mut m, c, 1_000 + c);
        }
        assert_eq!(m.fenced.len(), FENCED_CLIENTS_MAX);
        assert!(!m.fenced.contains_key(&1), "the oldest went first");
        fence(&mut m, 0xffff_ffff, 1_000 + FENCE_KEEP_SECS + 20_000);
        assert_eq!(m.fenced.len(), 1, "expired entries dropped");
    }
}
