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
    CLUSTER_SNAPS_MAX, IMAGE_NAME_BYTES_MAX, IMAGE_SNAPS_MAX, SNAP_NAME_BYTES_MAX,
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
        let pool_id = self
            .map
            .pool_by_name(pool)
            .ok_or_else(|| format!("no pool named '{pool}'"))?
            .id;
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
                id
            }
            SnapVerb::Protect | SnapVerb::Unprotect => {
                let (id, _) = found.ok_or_else(|| format!("no snapshot {image}@{snap}"))?;
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
        assert_eq!(c.map().newest_snap(pool, "vm"), 2);
        run(&mut c, SnapVerb::Protect, "a").unwrap();
        assert!(run(&mut c, SnapVerb::Rm, "a")
            .unwrap_err()
            .contains("protected"));
        run(&mut c, SnapVerb::Rm, "b").unwrap();
        assert_eq!(c.map().newest_snap(pool, "vm"), 1);
        // Ids are never reused: the next one is 3.
        assert_eq!(run(&mut c, SnapVerb::Create, "c").unwrap().id, 3);
        assert!(run(&mut c, SnapVerb::Forget, "")
            .unwrap_err()
            .contains("remove them"));
        run(&mut c, SnapVerb::Unprotect, "a").unwrap();
        run(&mut c, SnapVerb::Rm, "a").unwrap();
        run(&mut c, SnapVerb::Rm, "c").unwrap();
        assert!(run(&mut c, SnapVerb::Rm, "c")
            .unwrap_err()
            .contains("no snapshot"));
        run(&mut c, SnapVerb::Forget, "").unwrap();
        assert!(c.map().image_snaps.is_empty());
    }
}
