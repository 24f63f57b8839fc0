//! Object -> placement group -> daemons, computed from the map (never looked up).

use crate::ClusterMap;
use spindle_crush::{Workspace, ITEM_NONE};
use std::collections::BTreeMap;

/// Stable 32-bit hash of an object name: FNV-1a 64 folded to 32 bits. Stable across
/// versions and machines (it decides where data lives, so it must never change).
fn name_hash(name: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ (h >> 32)) as u32
}

/// The part of an object name that decides its placement: the text between the first
/// `{` and the next `}` when that is not empty (as Redis Cluster's hash tags), else the
/// whole name. Objects whose names share a placement key share a placement group, so one
/// program run (`ObjOp::Exec`) can see them together: `ssb.lineorder.{rg7}.revenue` and
/// `ssb.lineorder.{rg7}.custkey` live on the same daemons. Image and snapshot names
/// cannot contain braces, so no name Spindle builds itself has a key.
pub fn placement_key(name: &str) -> &str {
    if let Some(open) = name.find('{') {
        if let Some(len) = name[open + 1..].find('}') {
            if len > 0 {
                return &name[open + 1..open + 1 + len];
            }
        }
    }
    name
}

/// Placement group of `name` in a pool of `pg_count` (a power of two) groups (by its
/// [`placement_key`]).
pub fn object_pg(name: &str, pg_count: u32) -> u32 {
    debug_assert!(pg_count.is_power_of_two());
    name_hash(placement_key(name)) & (pg_count - 1)
}

/// The CRUSH input of a placement group: Ceph's `hashpspool` mixing of the group and the
/// pool id, so pools with the same pg count do not share a layout.
pub fn pg_crush_input(pool: u32, pg: u32) -> i32 {
    spindle_crush::hash::hash32_2(pg, pool) as i32
}

/// Where one placement group lives at one epoch.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PgMapping {
    /// CRUSH result with reweights applied (out daemons excluded), in CRUSH order.
    pub raw: Vec<u32>,
    /// `raw` without the daemons that are down: the acting set.
    pub up: Vec<u32>,
    /// Erasure-coded pools only: daemon of each shard position (`size` entries; None where
    /// CRUSH left a hole or the daemon is down). Empty for replicated pools.
    pub shards: Vec<Option<u32>>,
}

impl PgMapping {
    pub fn primary(&self) -> Option<u32> {
        self.up.first().copied()
    }
    /// Shard position of `osd` in an erasure-coded group (None if not a member, or for a
    /// replicated pool).
    pub fn shard_of(&self, osd: u32) -> Option<u8> {
        self.shards
            .iter()
            .position(|&d| d == Some(osd))
            .map(|p| p as u8)
    }
}

pub use spindle_types::{shard_pg, split_shard_pg, PgId};

/// Every placement group of every pool, computed once per epoch.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub epoch: u64,
    pgs: BTreeMap<(u32, u32), PgMapping>,
}

impl Placement {
    pub fn compute(map: &ClusterMap) -> Placement {
        let weights = map.reweights();
        let mut workspace = Workspace::new();
        let mut result = Vec::new();
        let mut pgs = BTreeMap::new();
        for pool in map.pools.values() {
            let size = pool.size() as usize;
            for pg in 0..pool.pg_count {
                spindle_crush::do_rule(
                    &map.crush,
                    pool.crush_rule,
                    pg_crush_input(pool.id, pg),
                    &mut result,
                    size,
                    &weights,
                    &mut workspace,
                );
                let raw: Vec<u32> = result
                    .iter()
                    .filter(|&&d| d != ITEM_NONE && d >= 0)
                    .map(|&d| d as u32)
                    .collect();
                let up = raw.iter().copied().filter(|&d| map.is_up(d)).collect();
                let shards = if pool.is_erasure() {
                    (0..size)
                        .map(|i| {
                            result
                                .get(i)
                                .filter(|&&d| d != ITEM_NONE && d >= 0)
                                .map(|&d| d as u32)
                                .filter(|&d| map.is_up(d))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                pgs.insert((pool.id, pg), PgMapping { raw, up, shards });
            }
        }
        Placement {
            epoch: map.epoch,
            pgs,
        }
    }

    pub fn pg(&self, pool: u32, pg: u32) -> Option<&PgMapping> {
        self.pgs.get(&(pool, pg))
    }

    /// All placement groups, in (pool, pg) order.
    pub fn iter(&self) -> impl Iterator<Item = (&(u32, u32), &PgMapping)> {
        self.pgs.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{embedded_crush_map, OsdInfo, PoolKind};

    fn map(n: u32) -> ClusterMap {
        let ids: Vec<u32> = (0..n).collect();
        let mut m = ClusterMap {
            cluster_id: 7,
            epoch: 3,
            osds: ids
                .iter()
                .map(|&id| {
                    (
                        id,
                        OsdInfo {
                            id,
                            addr: format!("127.0.0.1:{}", 7000 + id),
                            pid: 0,
                            up: true,
                            in_cluster: true,
                            weight: 0x10000,
                            up_from: 1,
                            nearfull: false,
                            full: false,
                            auto_out: false,
                        },
                    )
                })
                .collect(),
            pools: Default::default(),
            crush: embedded_crush_map(&ids).unwrap(),
            nearfull_ratio_ppm: crate::NEARFULL_RATIO_PPM_DEFAULT,
            full_ratio_ppm: crate::FULL_RATIO_PPM_DEFAULT,
            image_locks: Default::default(),
            fenced: Default::default(),
            image_snaps: Default::default(),
        };
        m.add_pool(
            "default",
            PoolKind::Replicated {
                size: 3,
                min_size: 2,
            },
            64,
            0,
        )
        .unwrap();
        m
    }

    #[test]
    fn every_pg_gets_three_distinct_daemons() {
        let m = map(4);
        let p = Placement::compute(&m);
        let mut primaries = [0u32; 4];
        for (_, mapping) in p.iter() {
            assert_eq!(mapping.up.len(), 3);
            let mut s = mapping.up.clone();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), 3);
            primaries[mapping.up[0] as usize] += 1;
        }
        assert!(primaries.iter().all(|&c| c > 5), "{primaries:?}");
    }

    #[test]
    fn down_daemons_leave_the_up_set_out_daemons_leave_crush() {
        let mut m = map(4);
        let before = Placement::compute(&m);
        m.osds.get_mut(&1).unwrap().up = false;
        let down = Placement::compute(&m);
        for ((k, a), (_, b)) in before.iter().zip(down.iter()) {
            assert_eq!(a.raw, b.raw, "{k:?}");
            assert!(!b.up.contains(&1));
        }
        m.osds.get_mut(&1).unwrap().in_cluster = false;
        let out = Placement::compute(&m);
        for (_, b) in out.iter() {
            assert!(!b.raw.contains(&1));
            assert_eq!(b.raw.len(), 3);
        }
    }

    #[test]
    fn map_round_trips_and_rejects_garbage() {
        let m = map(3);
        let bytes = m.encode();
        let back = ClusterMap::decode(&bytes).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.pools, m.pools);
        assert_eq!(back.osds, m.osds);
        for cut in [0, 1, 10, bytes.len() / 2, bytes.len() - 1] {
            assert!(ClusterMap::decode(&bytes[..cut]).is_err());
        }
        // A format from the future.
        let mut bad = bytes.clone();
        bad[0] ^= 0x80;
        assert!(ClusterMap::decode(&bad).is_err());
        // A daemon the monitor marked out (auto_out) keeps the mark through the codec.
        let mut out = map(3);
        let o = out.osds.get_mut(&2).unwrap();
        o.in_cluster = false;
        o.auto_out = true;
        let back = ClusterMap::decode(&out.encode()).unwrap();
        assert!(back.osds[&2].auto_out && !back.osds[&2].in_cluster);
        assert!(!back.osds[&1].auto_out);
        assert_eq!(back.encode(), out.encode());
    }

    /// Image locks and fenced clients travel in format 3; a format-2 map (what earlier
    /// builds stored) still decodes, with neither.
    #[test]
    fn locks_and_fences_round_trip_and_format_2_maps_still_decode() {
        let mut m = map(3);
        let pool_id = *m.pools.keys().next().unwrap();
        m.image_locks.insert(
            (pool_id, "vm1".into()),
            crate::ImageLock {
                client: 0xfeed,
                generation: 3,
                holder: "host-a pid 42 spindle nbd".into(),
                since_unix_secs: 1_700_000_000,
            },
        );
        m.fenced.insert(0xbeef, 1_700_000_001);
        let bytes = m.encode();
        let back = ClusterMap::decode(&bytes).unwrap();
        assert_eq!(back.image_locks, m.image_locks);
        assert_eq!(back.fenced, m.fenced);
        assert_eq!(back.encode(), bytes);
        // A removed pool takes its images' locks with it (fenced clients stay fenced).
        let mut gone = back.clone();
        let pool = gone.pools.values().next().unwrap().name.clone();
        gone.remove_pool(&pool).unwrap();
        assert!(gone.image_locks.is_empty() && gone.fenced.len() == 1);

        // The same map as format 2: the format word, and no lock or fence sections.
        let plain = map(3).encode();
        let mut v2 = plain[..plain.len() - 12].to_vec();
        v2[..4].copy_from_slice(&2u32.to_le_bytes());
        let old = ClusterMap::decode(&v2).unwrap();
        assert!(old.image_locks.is_empty() && old.fenced.is_empty());
        assert_eq!(old.osds, m.osds);
        // A format this build does not know is refused by name.
        let mut v9 = plain.clone();
        v9[..4].copy_from_slice(&9u32.to_le_bytes());
        assert!(ClusterMap::decode(&v9)
            .unwrap_err()
            .to_string()
            .contains("format 9"));
    }

    /// Image snapshots travel in format 4, their clones in 5; format-3 and -4 maps still
    /// decode, without them;
    /// impossible snapshot ids are refused.
    #[test]
    fn snapshots_round_trip_and_format_3_and_4_maps_still_decode() {
        let mut m = map(3);
        let pool_id = *m.pools.keys().next().unwrap();
        let mut snaps = crate::ImageSnaps {
            seq: 7,
            ..Default::default()
        };
        for (id, name) in [(2, "monday"), (7, "tuesday")] {
            snaps.snaps.insert(
                id,
                crate::SnapInfo {
                    name: name.into(),
                    size_bytes: 1 << 30,
                    created_unix_secs: 1_700_000_000 + id,
                    protected: id == 2,
                    children: if id == 2 {
                        [(pool_id, "child1".to_string()), (pool_id + 1, "c2".into())].into()
                    } else {
                        Default::default()
                    },
                },
            );
        }
        m.image_snaps.insert((pool_id, "vm1".into()), snaps.clone());
        let mut trimming = snaps.clone();
        (trimming.removals, trimming.trimmed) = (5, 3);
        m.image_snaps.insert((pool_id, "vm3".into()), trimming);
        let bytes = m.encode();
        let back = ClusterMap::decode(&bytes).unwrap();
        assert_eq!(back.image_snaps, m.image_snaps);
        assert!(back.image_snaps[&(pool_id, "vm3".into())].trim_pending());
        assert!(!back.image_snaps[&(pool_id, "vm1".into())].trim_pending());
        // More trimmed than removed cannot be.
        let mut bad = m.clone();
        bad.image_snaps
            .get_mut(&(pool_id, "vm3".into()))
            .unwrap()
            .trimmed = 6;
        assert!(ClusterMap::decode(&bad.encode()).is_err());
        m.image_snaps.remove(&(pool_id, "vm3".into()));
        assert_eq!(back.image_snaps[&(pool_id, "vm1".into())].newest(), 7);
        assert_eq!(back.snap_guard(pool_id, "vm1"), 7);
        assert_eq!(back.snap_guard(pool_id, "vm2"), 0);
        assert_eq!(snaps.by_name("monday").map(|(id, _)| id), Some(2));
        // Format 4: no clones (and format 5's trimming counters are 0).
        let mut v4 = m.clone();
        for s in v4
            .image_snaps
            .values_mut()
            .flat_map(|s| s.snaps.values_mut())
        {
            s.children.clear();
        }
        let plain4 = v4.encode();
        let mut old = Vec::new();
        // Re-encode without the clone counts: drop each snapshot's trailing u32 0.
        {
            let back = ClusterMap::decode(&plain4).unwrap();
            assert_eq!(back.image_snaps, v4.image_snaps);
            // The snapshot section ends the map: where a map without snapshots ends it
            // with its count (0).
            let mut empty = v4.clone();
            empty.image_snaps.clear();
            let snaps_at = empty.encode().len() - 4;
            old.extend_from_slice(&plain4[..snaps_at]);
            let mut r = spindle_proto::Reader::new(&plain4[snaps_at..]);
            let mut w = spindle_proto::Writer::new();
            let n = r.u32("n").unwrap();
            w.u32(n);
            for _ in 0..n {
                w.u32(r.u32("pool").unwrap())
                    .str(r.str("image", 64).unwrap())
                    .u64(r.u64("seq").unwrap());
                let count = r.u32("count").unwrap();
                w.u32(count);
                for _ in 0..count {
                    w.u64(r.u64("id").unwrap())
                        .str(r.str("name", 64).unwrap())
                        .u64(r.u64("size").unwrap())
                        .u64(r.u64("created").unwrap())
                        .u8(r.u8("protected").unwrap());
                    assert_eq!(r.u32("clones").unwrap(), 0);
                }
                assert_eq!(r.u64("removals").unwrap(), 0);
                assert_eq!(r.u64("trimmed").unwrap(), 0);
            }
            old.extend_from_slice(&w.finish());
            old[..4].copy_from_slice(&4u32.to_le_bytes());
        }
        assert_eq!(
            ClusterMap::decode(&old).unwrap().image_snaps,
            v4.image_snaps
        );
        // Format 3: no snapshot section.
        let plain = map(3).encode();
        let mut v3 = plain[..plain.len() - 4].to_vec();
        v3[..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(ClusterMap::decode(&v3).unwrap().image_snaps.is_empty());
        // An id above the image's seq cannot have been handed out.
        let mut bad = m.clone();
        bad.image_snaps
            .get_mut(&(pool_id, "vm1".into()))
            .unwrap()
            .seq = 5;
        assert!(ClusterMap::decode(&bad.encode()).is_err());
        // A removed pool takes its snapshots with it.
        let pool = back.pools.values().next().unwrap().name.clone();
        let mut gone = back;
        gone.remove_pool(&pool).unwrap();
        assert!(gone.image_snaps.is_empty());
    }

    #[test]
    fn placement_keys_group_objects() {
        assert_eq!(placement_key("lo.{rg7}.revenue"), "rg7");
        assert_eq!(placement_key("{a}{b}"), "a");
        assert_eq!(placement_key("x{}y"), "x{}y");
        assert_eq!(placement_key("x{y"), "x{y");
        assert_eq!(placement_key("x}y{"), "x}y{");
        assert_eq!(placement_key("plain"), "plain");
        for pg_count in [1u32, 8, 128, 4096] {
            let groups: std::collections::BTreeSet<u32> = ["revenue", "custkey", "orderdate"]
                .iter()
                .map(|c| object_pg(&format!("ssb.{{rg12}}.{c}"), pg_count))
                .collect();
            assert_eq!(groups.len(), 1);
            assert_eq!(
                object_pg("ssb.{rg12}.x", pg_count),
                object_pg("rg12", pg_count)
            );
        }
        // Without braces, names are placed as before (the hash is stable).
        assert_eq!(
            object_pg("ssb.rg12.x", 4096),
            name_hash("ssb.rg12.x") & 4095
        );
    }

    #[test]
    fn object_pg_is_stable() {
        // Pinned values: placement of existing data depends on them never changing.
        assert_eq!(object_pg("", 64), name_hash("") & 63);
        assert_eq!(name_hash("a"), {
            let h: u64 = (0xcbf2_9ce4_8422_2325u64 ^ 0x61).wrapping_mul(0x0000_0100_0000_01b3);
            (h ^ (h >> 32)) as u32
        });
        let counts =
            (0..6400)
                .map(|i| object_pg(&format!("obj-{i}"), 64))
                .fold([0u32; 64], |mut c, pg| {
                    c[pg as usize] += 1;
                    c
                });
        assert!(counts.iter().all(|&c| c > 50 && c < 160), "{counts:?}");
    }
}
#[cfg(test)]
mod ec_tests {
    use super::*;
    use crate::{embedded_crush_map, OsdInfo, PoolKind};

    /// Erasure-coded groups get `size` positions from the indep rule; a position whose
    /// daemon is down is a hole, and the others keep their positions.
    #[test]
    fn erasure_positions_keep_holes_for_down_daemons() {
        let ids: Vec<u32> = (0..4).collect();
        let osd = |id| OsdInfo {
            id,
            addr: String::new(),
            pid: 0,
            up: true,
            in_cluster: true,
            weight: 0x10000,
            up_from: 1,
            nearfull: false,
            full: false,
            auto_out: false,
        };
        let mut m = ClusterMap {
            cluster_id: 7,
            epoch: 3,
            osds: ids.iter().map(|&id| (id, osd(id))).collect(),
            pools: Default::default(),
            crush: embedded_crush_map(&ids).unwrap(),
            nearfull_ratio_ppm: crate::NEARFULL_RATIO_PPM_DEFAULT,
            full_ratio_ppm: crate::FULL_RATIO_PPM_DEFAULT,
            image_locks: Default::default(),
            fenced: Default::default(),
            image_snaps: Default::default(),
        };
        let kind = PoolKind::Erasure {
            k: 2,
            m: 1,
            min_size: 2,
            matrix: 0,
            stripe_unit_bytes: 4096,
        };
        m.add_pool("ec", kind, 16, crate::EMBEDDED_ERASURE_RULE)
            .unwrap();
        let all = Placement::compute(&m);
        m.osds.get_mut(&3).unwrap().up = false;
        let down = Placement::compute(&m);
        for pg in 0..16 {
            let a = all.pg(1, pg).unwrap();
            let b = down.pg(1, pg).unwrap();
            assert_eq!(a.shards.len(), 3);
            assert!(a.shards.iter().all(Option::is_some), "{a:?}");
            for (x, y) in a.shards.iter().zip(&b.shards) {
                if *x == Some(3) {
                    assert_eq!(*y, None);
                } else {
                    assert_eq!(x, y, "pg {pg}: a survivor moved while osd.3 is only down");
                }
            }
            assert_eq!(b.primary(), b.shards.iter().flatten().next().copied());
        }
        assert_eq!(shard_pg(5, Some(2)), 5 | 3 << 24);
        assert_eq!(split_shard_pg(shard_pg(5, Some(2))), (5, Some(2)));
        assert_eq!(split_shard_pg(5), (5, None));
        assert_eq!(PgId { pool: 1, pg: 0x1f }.to_string(), "1.1f");
        assert_eq!(PgId { pool: 12, pg: 22 }.to_string(), "12.16");
        assert_eq!(
            PgId {
                pool: 2,
                pg: shard_pg(0x1f, Some(2))
            }
            .to_string(),
            "2.1fs2"
        );
    }
}
