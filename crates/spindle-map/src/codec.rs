//! Binary encoding of [`ClusterMap`] (for the wire and the monitor's store).
//!
//! Layout (little endian, [`spindle_proto::codec`] fields):
//! `u32 MAP_FORMAT | u64 cluster_id | u64 epoch | u32 n_osds | n x osd | u32 n_pools |
//!  n x pool | bytes crush (Ceph binary CRUSH encoding)`; format 2 appends
//! `u32 nearfull_ratio_ppm | u32 full_ratio_ppm | u32 n | n x (u32 osd id, u8 flags)`
//! (flags bit 0 nearfull, bit 1 full, bit 2 marked out by the monitor: `auto_out`; builds
//! before bit 2 ignore it); format 3 appends the image locks and the fenced
//! clients: `u32 n | n x (u32 pool, str image, u64 client, u64 generation, str holder,
//! u64 since) | u32 n | n x (u64 client, u64 fenced_at)`. Format 1 maps decode with the
//! default ratios and no flags; formats 1 and 2 with no locks and no fenced clients.
//! Format 4 appends the image snapshots: `u32 n | n x (u32 pool, str image, u64 seq,
//! u32 count | count x (u64 id, str name, u64 size_bytes, u64 created, u8 protected))`.
//! Format 5 appends to each snapshot its clones: `u32 n | n x (u32 pool, str image)`.
//! Format 6 appends to each snapshotted image its trimming counters: `u64 removals |
//! u64 trimmed`.
//! The frame or store record around it carries the CRC.

use crate::{ClusterMap, ImageLock, OsdInfo, Pool, PoolKind, PG_COUNT_MAX};
use spindle_proto::{CodecError, Reader, Writer};
use spindle_types::limits::{
    CLUSTER_CLONES_MAX, CLUSTER_SNAPS_MAX, IMAGE_LOCK_HOLDER_BYTES_MAX, IMAGE_NAME_BYTES_MAX,
    IMAGE_SNAPS_MAX, SNAP_CHILDREN_MAX, SNAP_NAME_BYTES_MAX,
};

const MAP_FORMAT: u32 = 6;
const OSD_NEARFULL: u8 = 1;
const OSD_FULL: u8 = 2;
const OSD_AUTO_OUT: u8 = 4;
const OSDS_MAX: u32 = 1 << 16;
const POOLS_MAX: u32 = 1 << 16;
const ADDR_MAX: usize = 256;
const CRUSH_MAX: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum MapDecodeError {
    #[error("cluster map: {0}")]
    Codec(#[from] CodecError),
    #[error("cluster map format {0} is not supported (this build reads {MAP_FORMAT})")]
    Format(u32),
    #[error("cluster map: CRUSH map: {0}")]
    Crush(#[from] spindle_crush::CrushError),
    #[error("cluster map is inconsistent: {0}")]
    Invalid(String),
}

impl ClusterMap {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(MAP_FORMAT).u64(self.cluster_id).u64(self.epoch);
        w.u32(self.osds.len() as u32);
        for osd in self.osds.values() {
            w.u32(osd.id)
                .str(&osd.addr)
                .u32(osd.pid)
                .u8(osd.up as u8)
                .u8(osd.in_cluster as u8)
                .u32(osd.weight)
                .u64(osd.up_from);
        }
        w.u32(self.pools.len() as u32);
        for pool in self.pools.values() {
            w.u32(pool.id).str(&pool.name);
            match pool.kind {
                PoolKind::Replicated { size, min_size } => {
                    w.u8(0).u32(size).u32(min_size);
                }
                PoolKind::Erasure {
                    k,
                    m,
                    min_size,
                    matrix,
                    stripe_unit_bytes,
                } => {
                    w.u8(1)
                        .u32(k)
                        .u32(m)
                        .u32(min_size)
                        .u8(matrix)
                        .u32(stripe_unit_bytes);
                }
            }
            w.u32(pool.pg_count).i32(pool.crush_rule);
        }
        w.bytes(&spindle_crush::binary::encode(&self.crush));
        w.u32(self.nearfull_ratio_ppm).u32(self.full_ratio_ppm);
        let flagged: Vec<&OsdInfo> = self
            .osds
            .values()
            .filter(|o| o.nearfull || o.full || o.auto_out)
            .collect();
        w.u32(flagged.len() as u32);
        for o in flagged {
            let flags = if o.nearfull { OSD_NEARFULL } else { 0 }
                | if o.full { OSD_FULL } else { 0 }
                | if o.auto_out { OSD_AUTO_OUT } else { 0 };
            w.u32(o.id).u8(flags);
        }
        w.u32(self.image_locks.len() as u32);
        for ((pool, image), l) in &self.image_locks {
            w.u32(*pool)
                .str(image)
                .u64(l.client)
                .u64(l.generation)
                .str(&l.holder)
                .u64(l.since_unix_secs);
        }
        w.u32(self.fenced.len() as u32);
        for (client, at) in &self.fenced {
            w.u64(*client).u64(*at);
        }
        w.u32(self.image_snaps.len() as u32);
        for ((pool, image), s) in &self.image_snaps {
            w.u32(*pool).str(image).u64(s.seq).u32(s.snaps.len() as u32);
            for (id, snap) in &s.snaps {
                w.u64(*id)
                    .str(&snap.name)
                    .u64(snap.size_bytes)
                    .u64(snap.created_unix_secs)
                    .u8(u8::from(snap.protected))
                    .u32(snap.children.len() as u32);
                for (pool, child) in &snap.children {
                    w.u32(*pool).str(child);
                }
            }
            w.u64(s.removals).u64(s.trimmed);
        }
        w.finish()
    }

    /// Decodes and validates a map; never panics on bad input.
    pub fn decode(bytes: &[u8]) -> Result<ClusterMap, MapDecodeError> {
        let mut r = Reader::new(bytes);
        let format = r.u32("format")?;
        if !(1..=MAP_FORMAT).contains(&format) {
            return Err(MapDecodeError::Format(format));
        }
        let cluster_id = r.u64("cluster_id")?;
        let epoch = r.u64("epoch")?;
        let n_osds = r.u32("osd count")?;
        if n_osds > OSDS_MAX {
            return Err(MapDecodeError::Invalid(format!("{n_osds} daemons")));
        }
        let mut osds = std::collections::BTreeMap::new();
        for _ in 0..n_osds {
            let osd = OsdInfo {
                id: r.u32("osd id")?,
                addr: r.str("osd addr", ADDR_MAX)?.to_string(),
                pid: r.u32("osd pid")?,
                up: r.u8("osd up")? != 0,
                in_cluster: r.u8("osd in")? != 0,
                weight: r.u32("osd weight")?,
                up_from: r.u64("osd up_from")?,
                nearfull: false,
                full: false,
                auto_out: false,
            };
            if osds.insert(osd.id, osd).is_some() {
                return Err(MapDecodeError::Invalid("duplicate daemon id".into()));
            }
        }
        let n_pools = r.u32("pool count")?;
        if n_pools > POOLS_MAX {
            return Err(MapDecodeError::Invalid(format!("{n_pools} pools")));
        }
        let mut pools = std::collections::BTreeMap::new();
        for _ in 0..n_pools {
            let id = r.u32("pool id")?;
            let name = r.str("pool name", crate::POOL_NAME_MAX)?.to_string();
            let kind = match r.u8("pool kind")? {
                0 => PoolKind::Replicated {
                    size: r.u32("pool size")?,
                    min_size: r.u32("pool min_size")?,
                },
                1 => PoolKind::Erasure {
                    k: r.u32("pool k")?,
                    m: r.u32("pool m")?,
                    min_size: r.u32("pool min_size")?,
                    matrix: r.u8("pool matrix")?,
                    stripe_unit_bytes: r.u32("pool stripe unit")?,
                },
                k => {
                    return Err(MapDecodeError::Codec(CodecError::Invalid {
                        what: "pool kind",
                        value: k as u64,
                    }))
                }
            };
            let pg_count = r.u32("pg count")?;
            let crush_rule = r.i32("crush rule")?;
            let pool = Pool {
                id,
                name,
                kind,
                pg_count,
                crush_rule,
            };
            if pools.insert(id, pool).is_some() {
                return Err(MapDecodeError::Invalid("duplicate pool id".into()));
            }
        }
        let crush_bytes = r.bytes("crush map", CRUSH_MAX)?;
        let (mut nearfull_ratio_ppm, mut full_ratio_ppm) = (
            crate::NEARFULL_RATIO_PPM_DEFAULT,
            crate::FULL_RATIO_PPM_DEFAULT,
        );
        if format >= 2 {
            nearfull_ratio_ppm = r.u32("nearfull ratio")?;
            full_ratio_ppm = r.u32("full ratio")?;
            let n = r.u32("flagged daemon count")?;
            if n > OSDS_MAX {
                return Err(MapDecodeError::Invalid(format!("{n} flagged daemons")));
            }
            for _ in 0..n {
                let id = r.u32("flagged osd id")?;
                let flags = r.u8("osd flags")?;
                let Some(o) = osds.get_mut(&id) else {
                    return Err(MapDecodeError::Invalid(format!(
                        "flags for unknown osd.{id}"
                    )));
                };
                o.nearfull = flags & OSD_NEARFULL != 0;
                o.full = flags & OSD_FULL != 0;
                o.auto_out = flags & OSD_AUTO_OUT != 0;
            }
        }
        let mut image_locks = std::collections::BTreeMap::new();
        let mut fenced = std::collections::BTreeMap::new();
        if format >= 3 {
            let n = r.u32("image lock count")?;
            if n as usize > crate::IMAGE_LOCKS_MAX {
                return Err(MapDecodeError::Invalid(format!("{n} image locks")));
            }
            for _ in 0..n {
                let pool = r.u32("lock pool")?;
                let image = r.str("lock image", IMAGE_NAME_BYTES_MAX)?.to_string();
                let lock = ImageLock {
                    client: r.u64("lock client")?,
                    generation: r.u64("lock generation")?,
                    holder: r
                        .str("lock holder", IMAGE_LOCK_HOLDER_BYTES_MAX)?
                        .to_string(),
                    since_unix_secs: r.u64("lock since")?,
                };
                if image_locks.insert((pool, image), lock).is_some() {
                    return Err(MapDecodeError::Invalid("duplicate image lock".into()));
                }
            }
            let n = r.u32("fenced client count")?;
            if n as usize > crate::FENCED_CLIENTS_MAX {
                return Err(MapDecodeError::Invalid(format!("{n} fenced clients")));
            }
            for _ in 0..n {
                let client = r.u64("fenced client")?;
                let at = r.u64("fenced at")?;
                if fenced.insert(client, at).is_some() {
                    return Err(MapDecodeError::Invalid("duplicate fenced client".into()));
                }
            }
        }
        let mut image_snaps = std::collections::BTreeMap::new();
        if format >= 4 {
            let n = r.u32("snapshotted image count")?;
            let mut total = 0usize;
            let mut clones = 0usize;
            for _ in 0..n {
                let pool = r.u32("snap pool")?;
                let image = r.str("snap image", IMAGE_NAME_BYTES_MAX)?.to_string();
                let seq = r.u64("snap seq")?;
                let count = r.u32("snap count")? as usize;
                total += count;
                if count > IMAGE_SNAPS_MAX || total > CLUSTER_SNAPS_MAX {
                    return Err(MapDecodeError::Invalid(format!(
                        "{count} snapshots of {image} ({total} in the map)"
                    )));
                }
                let mut snaps = std::collections::BTreeMap::new();
                for _ in 0..count {
                    let id = r.u64("snap id")?;
                    let mut info = crate::SnapInfo {
                        name: r.str("snap name", SNAP_NAME_BYTES_MAX)?.to_string(),
                        size_bytes: r.u64("snap size")?,
                        created_unix_secs: r.u64("snap created")?,
                        protected: r.u8("snap protected")? != 0,
                        children: Default::default(),
                    };
                    if format >= 5 {
                        let n = r.u32("clone count")? as usize;
                        clones += n;
                        if n > SNAP_CHILDREN_MAX || clones > CLUSTER_CLONES_MAX {
                            return Err(MapDecodeError::Invalid(format!(
                                "{n} clones of a snapshot of {image} ({clones} in the map)"
                            )));
                        }
                        for _ in 0..n {
                            let pool = r.u32("clone pool")?;
                            let child = r.str("clone image", IMAGE_NAME_BYTES_MAX)?.to_string();
                            if !info.children.insert((pool, child)) {
                                return Err(MapDecodeError::Invalid(format!(
                                    "duplicate clone of a snapshot of {image}"
                                )));
                            }
                        }
                    }
                    if id == 0 || id > seq || snaps.insert(id, info).is_some() {
                        return Err(MapDecodeError::Invalid(format!(
                            "snapshot id {id} of {image} (seq {seq})"
                        )));
                    }
                }
                let (removals, trimmed) = if format >= 6 {
                    (r.u64("snap removals")?, r.u64("snaps trimmed")?)
                } else {
                    (0, 0)
                };
                if trimmed > removals {
                    return Err(MapDecodeError::Invalid(format!(
                        "snapshots of {image}: {trimmed} removals trimmed of {removals}"
                    )));
                }
                let entry = crate::ImageSnaps {
                    seq,
                    snaps,
                    removals,
                    trimmed,
                };
                if image_snaps.insert((pool, image), entry).is_some() {
                    return Err(MapDecodeError::Invalid(
                        "duplicate snapshotted image".into(),
                    ));
                }
            }
        }
        r.finish()?;
        let crush = spindle_crush::binary::decode(crush_bytes)?;
        crush.validate()?;
        let map = ClusterMap {
            cluster_id,
            epoch,
            osds,
            pools,
            crush,
            nearfull_ratio_ppm,
            full_ratio_ppm,
            image_locks,
            fenced,
            image_snaps,
        };
        for pool in map.pools.values() {
            map.check_pool(pool)
                .map_err(|e| MapDecodeError::Invalid(format!("pool {}: {e}", pool.id)))?;
            debug_assert!(pool.pg_count <= PG_COUNT_MAX);
        }
        for id in map.osds.keys() {
            if *id as i64 >= map.crush.max_devices as i64 {
                return Err(MapDecodeError::Invalid(format!(
                    "osd.{id} is not a CRUSH device"
                )));
            }
        }
        Ok(map)
    }
}
