//! Image snapshots: the monitor's decisions, without I/O.
//!
//! A snapshot lives in the cluster map (`ClusterMap::image_snaps`) because every primary
//! checks each write to an image's data object against the image's newest snapshot: the
//! writer must have preserved the object's content for it first (client-side
//! copy-on-write, `spindle_image::snap`). Creating or removing a snapshot is one map change.
//!
//! Invariants: snapshot ids of an image only grow (`ImageSnaps::seq`, kept after every
//! snapshot is removed, dropped only by `forget` when the image is removed); names are
//! unique per image; a protected snapshot cannot be removed; at most
//! `IMAGE_SNAPS_MAX` per image and `CLUSTER_SNAPS_MAX` in the map.

use crate::command::SnapVerb;
use crate::core::{propose, MonCore};
use crate::reply::{AdminReply, SnapDone};
use spindle_map::{ImageSnaps, SnapInfo};
use spindle_types::limits::{
    CLUSTER_CLONES_MAX, CLUSTER_SNAPS_MAX, IMAGE_NAME_BYTES_MAX, IMAGE_SNAPS_MAX,
    SNAP_CHILDREN_MAX, SNAP_NAME_BYTES_MAX,
};

/// The naming rule of snapshots (as image names: `[A-Za-z0-9._-]`, 1..=64 bytes).
pub fn check_snap_name(name: &str) -> Result<(), String> {
    if spindle_types::limits::is_simple_name(name, SNAP_NAME_BYTES_MAX) {
        Ok(())
    } else {
        Err(format!(
            "invalid snapshot name {name:?}: 1..={SNAP_NAME_BYTES_MAX} characters of [A-Za-z0-9._-]"
        ))
    }
}

impl MonCore {
    /// `snap VERB POOL IMAGE SNAP SIZE`: see the module documentation.
    pub(crate) fn snap_command(
        &self,
        now_unix_secs: u64,
        verb: SnapVerb,
        pool: &str,
        image: &str,
        snap: &str,
        size_bytes: u64,
    ) -> Result<(AdminReply, Option<spindle_map::ClusterMap>), String> {
        let pool_id = self.pool_id(pool)?;
        if image.is_empty() || image.len() > IMAGE_NAME_BYTES_MAX || image.contains('@') {
            return Err(format!("bad image name {image:?}"));
        }
        let key = (pool_id, image.to_string());
        let current = self.map.image_snaps.get(&key).cloned().unwrap_or_default();
        if verb != SnapVerb::Forget {
            check_snap_name(snap)?;
        }
        let found = current.by_name(snap).map(|(id, s)| (id, s.clone()));
        let mut next_snaps: ImageSnaps = current.clone();
        let id = match verb {
            SnapVerb::Create => {
                if found.is_some() {
                    return Err(format!("snapshot {image}@{snap} already exists"));
                }
                if current.snaps.len() >= IMAGE_SNAPS_MAX {
                    return Err(format!(
                        "image {image} has {IMAGE_SNAPS_MAX} snapshots, its limit: remove one first"
                    ));
                }
                let total: usize = self.map.image_snaps.values().map(|s| s.snaps.len()).sum();
                if total >= CLUSTER_SNAPS_MAX {
                    return Err(format!(
                        "the cluster holds {CLUSTER_SNAPS_MAX} snapshots, its limit"
                    ));
                }
                let id = current.seq + 1;
                next_snaps.seq = id;
                next_snaps.snaps.insert(
                    id,
                    SnapInfo {
                        name: snap.to_string(),
                        size_bytes,
                        created_unix_secs: now_unix_secs,
                        protected: false,
                        children: Default::default(),
                    },
                );
                id
            }
            SnapVerb::Rm => {
                let (id, info) = found.ok_or_else(|| format!("no snapshot {image}@{snap}"))?;
                if info.protected {
                    return Err(format!(
                        "snapshot {image}@{snap} is protected: unprotect it first (it may have clones)"
                    ));
                }
                next_snaps.snaps.remove(&id);
                next_snaps.removals += 1;
                id
            }
            SnapVerb::Protect | SnapVerb::Unprotect => {
                let (id, info) = found.ok_or_else(|| format!("no snapshot {image}@{snap}"))?;
                if verb == SnapVerb::Unprotect && !info.children.is_empty() {
                    let names: Vec<String> = info
                        .children
                        .iter()
                        .take(3)
                        .map(|(p, c)| format!("{}/{c}", self.pool_name(*p)))
                        .collect();
                    return Err(format!(
                        "snapshot {image}@{snap} has {} clone(s) ({}{}): flatten or remove them first",
                        info.children.len(),
                        names.join(", "),
                        if info.children.len() > 3 { ", ..." } else { "" }
                    ));
                }
                if let Some(s) = next_snaps.snaps.get_mut(&id) {
                    s.protected = verb == SnapVerb::Protect;
                }
                id
            }
            SnapVerb::Forget => {
                if !current.snaps.is_empty() {
                    return Err(format!(
                        "image {image} has {} snapshots: remove them first",
                        current.snaps.len()
                    ));
                }
                0
            }
        };
        let (_, next) = propose(&self.map, |m| {
            if verb == SnapVerb::Forget {
                m.image_snaps.remove(&key);
            } else {
                m.image_snaps.insert(key.clone(), next_snaps.clone());
            }
            Ok(())
        })?;
        let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
        Ok((AdminReply::SnapDone(SnapDone { epoch, id }), next))
    }
}

impl MonCore {
    /// `snap trimmed POOL IMAGE REMOVALS`: the trimmer freed what the first `removals`
    /// removals left (it read the live snapshots from a map with that count). A removal
    /// since keeps the trim pending; an image gone since changes nothing.
    pub(crate) fn snap_trimmed(
        &self,
        pool: &str,
        image: &str,
        removals: u64,
    ) -> Result<(AdminReply, Option<spindle_map::ClusterMap>), String> {
        let pool_id = self.pool_id(pool)?;
        let key = (pool_id, image.to_string());
        let Some(current) = self.map.image_snaps.get(&key) else {
            let reply = AdminReply::SnapDone(SnapDone {
                epoch: self.map.epoch,
                id: 0,
            });
            return Ok((reply, None));
        };
        if removals > current.removals {
            return Err(format!(
                "{image} has had {} snapshot removals, not {removals}",
                current.removals
            ));
        }
        let (_, next) = propose(&self.map, |m| {
            if let Some(s) = m.image_snaps.get_mut(&key) {
                s.trimmed = s.trimmed.max(removals);
            }
            Ok(())
        })?;
        let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
        Ok((AdminReply::SnapDone(SnapDone { epoch, id: 0 }), next))
    }

    fn pool_id(&self, pool: &str) -> Result<u32, String> {
        self.map
            .pool_by_name(pool)
            .map(|p| p.id)
            .ok_or_else(|| format!("no pool named '{pool}'"))
    }

    fn pool_name(&self, id: u32) -> String {
        self.map
            .pools
            .get(&id)
            .map_or_else(|| format!("pool#{id}"), |p| p.name.clone())
    }

    /// `snap child add|rm POOL IMAGE SNAP CHILD_POOL CHILD`: registers or drops a clone of
    /// a snapshot. Registering needs the snapshot protected (so it cannot be removed while
    /// the clone reads it); dropping what is not registered changes nothing (a clone's
    /// flatten or removal may run again after a crash).
    pub(crate) fn snap_child(
        &self,
        add: bool,
        pool: &str,
        image: &str,
        snap: &str,
        child_pool: &str,
        child: &str,
    ) -> Result<(AdminReply, Option<spindle_map::ClusterMap>), String> {
        let pool_id = self.pool_id(pool)?;
        let child_pool_id = self.pool_id(child_pool)?;
        for name in [image, child] {
            if !spindle_types::limits::is_simple_name(name, IMAGE_NAME_BYTES_MAX) {
                return Err(format!("bad image name {name:?}"));
            }
        }
        let key = (pool_id, image.to_string());
        let child_key = (child_pool_id, child.to_string());
        let unchanged = || {
            Ok((
                AdminReply::SnapDone(SnapDone {
                    epoch: self.map.epoch,
                    id: 0,
                }),
                None,
            ))
        };
        let Some(current) = self.map.image_snaps.get(&key) else {
            return if add {
                Err(format!("no snapshot {image}@{snap}"))
            } else {
                unchanged()
            };
        };
        let Some((id, info)) = current.by_name(snap) else {
            return if add {
                Err(format!("no snapshot {image}@{snap}"))
            } else {
                unchanged()
            };
        };
        if add {
            if child_key == key {
                return Err(format!("{image} cannot be a clone of itself"));
            }
            if !info.protected {
                return Err(format!(
                    "snapshot {image}@{snap} is not protected: protect it first \
                     (`spindle image snap protect {image}@{snap}`)"
                ));
            }
            if info.children.contains(&child_key) {
                return Err(format!(
                    "{child_pool}/{child} is already a clone of {image}@{snap}"
                ));
            }
            if info.children.len() >= SNAP_CHILDREN_MAX {
                return Err(format!(
                    "{image}@{snap} has {SNAP_CHILDREN_MAX} clones, its limit"
                ));
            }
            let total: usize = self
                .map
                .image_snaps
                .values()
                .flat_map(|s| s.snaps.values())
                .map(|s| s.children.len())
                .sum();
            if total >= CLUSTER_CLONES_MAX {
                return Err(format!(
                    "the cluster holds {CLUSTER_CLONES_MAX} clones, its limit"
                ));
            }
        } else if !info.children.contains(&child_key) {
            return unchanged();
        }
        let (_, next) = propose(&self.map, |m| {
            if let Some(s) = m
                .image_snaps
                .get_mut(&key)
                .and_then(|s| s.snaps.get_mut(&id))
            {
                if add {
                    s.children.insert(child_key.clone());
                } else {
                    s.children.remove(&child_key);
                }
            }
            Ok(())
        })?;
        let epoch = next.as_ref().map_or(self.map.epoch, |n| n.epoch);
        Ok((AdminReply::SnapDone(SnapDone { epoch, id }), next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{first_map, InitSpec, MonTiming};

    fn core() -> MonCore {
        let spec = InitSpec {
            osd_count: 3,
            osd_hosts: Vec::new(),
            default_pool: Some(("default".into(), 3, 2, 8)),
        };
        let map = first_map(&spec, 7).expect("first map");
        MonCore::new(
            map,
            MonTiming {
                down_after_ms: 5_000,
                out_after_ms: 0,
            },
            0,
        )
    }

    fn run(c: &mut MonCore, verb: SnapVerb, snap: &str) -> Result<SnapDone, String> {
        let (reply, next) = c.snap_command(100, verb, "default", "vm", snap, 1 << 20)?;
        if let Some(m) = next {
            c.install(m, 0);
        }
        match reply {
            AdminReply::SnapDone(d) => Ok(d),
            other => Err(format!("unexpected {other:?}")),
        }
    }

    #[test]
    fn a_trim_records_only_the_removals_it_judged_by() {
        let mut c = core();
        for n in ["a", "b", "c"] {
            run(&mut c, SnapVerb::Create, n).unwrap();
        }
        let pool = c.map().pool_by_name("default").unwrap().id;
        let snaps = |c: &MonCore| c.map().image_snaps[&(pool, "vm".to_string())].clone();
        assert!(!snaps(&c).trim_pending());
        run(&mut c, SnapVerb::Rm, "a").unwrap();
        assert_eq!((snaps(&c).removals, snaps(&c).trimmed), (1, 0));
        // A trimmer judged by the map with one removal; a second removal came meanwhile.
        run(&mut c, SnapVerb::Rm, "b").unwrap();
        let trimmed = |c: &mut MonCore, n: u64| {
            let (_, next) = c.snap_trimmed("default", "vm", n)?;
            if let Some(m) = next {
                c.install(m, 0);
            }
            Ok::<_, String>(())
        };
        trimmed(&mut c, 1).unwrap();
        assert_eq!((snaps(&c).removals, snaps(&c).trimmed), (2, 1));
        assert!(snaps(&c).trim_pending());
        // A late report of an older trim does not move it back; one from the future is
        // refused.
        trimmed(&mut c, 2).unwrap();
        trimmed(&mut c, 1).unwrap();
        assert_eq!(snaps(&c).trimmed, 2);
        assert!(!snaps(&c).trim_pending());
        assert!(trimmed(&mut c, 3).unwrap_err().contains("removals"));
        // An image gone since: nothing to record.
        run(&mut c, SnapVerb::Rm, "c").unwrap();
        run(&mut c, SnapVerb::Forget, "").unwrap();
        trimmed(&mut c, 3).unwrap();
        assert!(c.map().image_snaps.is_empty());
    }

    #[test]
    fn ids_grow_names_are_unique_and_protected_snapshots_stay() {
        let mut c = core();
        let a = run(&mut c, SnapVerb::Create, "a").unwrap();
        let b = run(&mut c, SnapVerb::Create, "b").unwrap();
        assert_eq!((a.id, b.id), (1, 2));
        assert!(b.epoch > a.epoch);
        assert!(run(&mut c, SnapVerb::Create, "a")
            .unwrap_err()
            .contains("exists"));
        assert!(run(&mut c, SnapVerb::Create, "bad@name").is_err());
        let pool = c.map().pool_by_name("default").unwrap().id;
        assert_eq!(c.map().image_snaps[&(pool, "vm".into())].newest(), 2);
        run(&mut c, SnapVerb::Protect, "a").unwrap();
        assert!(run(&mut c, SnapVerb::Rm, "a")
            .unwrap_err()
            .contains("protected"));
        run(&mut c, SnapVerb::Rm, "b").unwrap();
        assert_eq!(c.map().image_snaps[&(pool, "vm".into())].newest(), 1);
        // The guard stays at the last id handed out while any snapshot is live.
        assert_eq!(c.map().snap_guard(pool, "vm"), 2);
        // Ids are never reused: the next one is 3.
        assert_eq!(run(&mut c, SnapVerb::Create, "c").unwrap().id, 3);
        assert!(run(&mut c, SnapVerb::Forget, "")
            .unwrap_err()
            .contains("remove them"));
        run(&mut c, SnapVerb::Unprotect, "a").unwrap();
        run(&mut c, SnapVerb::Rm, "a").unwrap();
        run(&mut c, SnapVerb::Rm, "c").unwrap();
        assert_eq!(c.map().snap_guard(pool, "vm"), 0);
        assert!(run(&mut c, SnapVerb::Rm, "c")
            .unwrap_err()
            .contains("no snapshot"));
        run(&mut c, SnapVerb::Forget, "").unwrap();
        assert!(c.map().image_snaps.is_empty());
    }

    #[test]
    fn clones_need_a_protected_snapshot_and_keep_it_protected() {
        let mut c = core();
        run(&mut c, SnapVerb::Create, "base").unwrap();
        let child = |c: &mut MonCore, add: bool, name: &str| {
            let (reply, next) = c.snap_child(add, "default", "vm", "base", "default", name)?;
            if let Some(m) = next {
                c.install(m, 0);
            }
            Ok::<_, String>(reply)
        };
        assert!(child(&mut c, true, "c1")
            .unwrap_err()
            .contains("not protected"));
        run(&mut c, SnapVerb::Protect, "base").unwrap();
        child(&mut c, true, "c1").unwrap();
        assert!(child(&mut c, true, "c1").unwrap_err().contains("already"));
        assert!(child(&mut c, true, "vm").unwrap_err().contains("itself"));
        child(&mut c, true, "c2").unwrap();
        let err = run(&mut c, SnapVerb::Unprotect, "base").unwrap_err();
        assert!(
            err.contains("2 clone(s)") && err.contains("default/c1"),
            "{err}"
        );
        assert!(run(&mut c, SnapVerb::Rm, "base").is_err());
        child(&mut c, false, "c1").unwrap();
        let epoch = c.map().epoch;
        // Dropping what is not registered changes nothing.
        child(&mut c, false, "c1").unwrap();
        child(&mut c, false, "never").unwrap();
        assert_eq!(c.map().epoch, epoch);
        child(&mut c, false, "c2").unwrap();
        run(&mut c, SnapVerb::Unprotect, "base").unwrap();
        run(&mut c, SnapVerb::Rm, "base").unwrap();
        assert!(child(&mut c, true, "c3")
            .unwrap_err()
            .contains("no snapshot"));
    }
}
