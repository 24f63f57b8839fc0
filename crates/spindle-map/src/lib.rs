//! `spindle-map`: the cluster map every Spindle process agrees on, one epoch at a time.
//!
//! The monitor owns it and bumps `epoch` on every change; storage daemons and clients
//! receive each new epoch and compute placement locally from it:
//!
//! ```text
//! object name --stable hash--> placement group --CRUSH (pool rule, reweights)--> raw set
//!   raw set --drop daemons that are down--> up set; primary = first of the up set
//! ```
//!
//! Invariants (checked by [`ClusterMap::decode`], so a map from the wire or disk that
//! breaks them is rejected instead of mis-placing data):
//! - every pool's CRUSH rule exists, `1 <= min_size <= size`, `pg_count` is a power of
//!   two between 1 and [`PG_COUNT_MAX`];
//! - every daemon id is a CRUSH device of the map;
//! - the map's CRUSH map passes [`spindle_crush::CrushMap::validate`].

mod codec;
mod placement;
mod view;

pub mod session;

pub mod ec;
pub use codec::MapDecodeError;
pub use placement::{
    object_pg, pg_crush_input, placement_key, shard_pg, split_shard_pg, PgId, PgMapping, Placement,
};
pub use view::{MapRejected, MapView};

use spindle_crush::CrushMap;
use std::collections::{BTreeMap, BTreeSet};

/// Largest number of placement groups in one pool.
pub const PG_COUNT_MAX: u32 = spindle_types::limits::PG_COUNT_MAX;
/// Largest replication factor / number of shards.
pub const POOL_SIZE_MAX: u32 = spindle_types::limits::POOL_SIZE_MAX;
/// Longest pool name.
pub const POOL_NAME_MAX: usize = spindle_types::limits::POOL_NAME_BYTES_MAX;
// The kernel crate cannot see the shared limits: they must agree.
const _: () = assert!(spindle_types::limits::EC_CHUNKS_MAX == spindle_ec::MAX_TOTAL_CHUNKS);

/// One storage daemon as the map sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsdInfo {
    pub id: u32,
    /// `ip:port` the daemon serves on (empty until it first booted).
    pub addr: String,
    /// Process id reported at boot (0 if unknown); lets embedded-cluster tooling find it.
    pub pid: u32,
    /// Up: alive and answering heartbeats. Down daemons are skipped by placement.
    pub up: bool,
    /// In: holds data. Out daemons get CRUSH reweight 0, so their data moves elsewhere.
    pub in_cluster: bool,
    /// CRUSH weight, 16.16 fixed point (0x10000 = 1.0).
    pub weight: u32,
    /// Epoch at which the daemon was last marked up (distinguishes restarts).
    pub up_from: u64,
    /// Its file system is above the nearfull ratio (a warning only).
    pub nearfull: bool,
    /// Its file system is above the full ratio, or its store refuses new data: clients
    /// and primaries refuse new writes to pools placed on it (deletes still work).
    pub full: bool,
    /// Out because the monitor marked it out after it was down too long (not by an
    /// administrator): the monitor marks it in again when it boots.
    pub auto_out: bool,
}

impl OsdInfo {
    /// A daemon as it enters the map (a new cluster, `spindle osd add`): not booted yet
    /// (down, no address), in, reweight 1.
    pub fn joining(id: u32) -> OsdInfo {
        OsdInfo {
            id,
            addr: String::new(),
            pid: 0,
            up: false,
            in_cluster: true,
            weight: 0x10000,
            up_from: 0,
            nearfull: false,
            full: false,
            auto_out: false,
        }
    }
}

/// How a pool stores its objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `size` full copies; writes proceed while at least `min_size` are up.
    Replicated { size: u32, min_size: u32 },
    /// Reed-Solomon: `k` data and `m` parity shards per object, placed positionally (CRUSH
    /// `indep`: shard i on the i-th daemon of the result). Reads need `k` shards up, writes
    /// `min_size`. `matrix` is a `spindle_ec::MatrixKind` code ([`EC_MATRIX_NAMES`]),
    /// `stripe_unit_bytes` the bytes of one shard per stripe.
    Erasure {
        k: u32,
        m: u32,
        min_size: u32,
        matrix: u8,
        stripe_unit_bytes: u32,
    },
}

/// Erasure-code matrices by wire code (index): the names `spindle ec` and pools use.
pub const EC_MATRIX_NAMES: [&str; 3] = ["isal-rs", "isal-cauchy", "jerasure-van"];
/// Largest stripe unit of an erasure-coded pool.
pub const STRIPE_UNIT_MAX: u32 = spindle_types::limits::STRIPE_UNIT_BYTES_MAX;
/// CRUSH rule of the embedded map used by erasure-coded pools (chooseleaf indep over hosts).
pub const EMBEDDED_ERASURE_RULE: i32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub id: u32,
    pub name: String,
    pub kind: PoolKind,
    /// Number of placement groups (a power of two).
    pub pg_count: u32,
    /// CRUSH rule id used to place this pool's placement groups.
    pub crush_rule: i32,
}

impl Pool {
    /// Number of daemons each placement group maps to.
    pub fn size(&self) -> u32 {
        match self.kind {
            PoolKind::Replicated { size, .. } => size,
            PoolKind::Erasure { k, m, .. } => k + m,
        }
    }
    pub fn min_size(&self) -> u32 {
        match self.kind {
            PoolKind::Replicated { min_size, .. } | PoolKind::Erasure { min_size, .. } => min_size,
        }
    }
    /// Fewest copies (shards) up for reads: 1 for replicated pools, k for erasure-coded.
    pub fn read_size(&self) -> u32 {
        match self.kind {
            PoolKind::Replicated { .. } => 1,
            PoolKind::Erasure { k, .. } => k,
        }
    }
    pub fn is_erasure(&self) -> bool {
        matches!(self.kind, PoolKind::Erasure { .. })
    }
}

/// The whole cluster map at one epoch.
#[derive(Clone, Debug)]
pub struct ClusterMap {
    /// Random id chosen when the cluster was created; daemons refuse maps of another cluster.
    pub cluster_id: u64,
    pub epoch: u64,
    pub osds: BTreeMap<u32, OsdInfo>,
    pub pools: BTreeMap<u32, Pool>,
    pub crush: CrushMap,
    /// Used/total ratio of a daemon's file system above which it is `nearfull`, in parts
    /// per million (Ceph's default 0.85).
    pub nearfull_ratio_ppm: u32,
    /// Ratio above which a daemon is `full` (Ceph's default 0.95).
    pub full_ratio_ppm: u32,
    /// Exclusive image locks, by (pool id, image name). Leases live in the monitor's
    /// memory, not here: the map changes only when a lock is taken, taken over or
    /// released.
    pub image_locks: BTreeMap<(u32, String), ImageLock>,
    /// Fenced clients (client id -> when fenced, unix seconds): primaries refuse their
    /// writes (`ErrorCode::Fenced`). Entries are dropped after
    /// `spindle_types::limits::FENCE_KEEP_SECS`.
    pub fenced: BTreeMap<u64, u64>,
    /// Snapshots of images, by (pool id, image name). In the map because every primary
    /// checks a write to an image's data object against the image's newest snapshot (the
    /// writer must have preserved the object's old content first), and that check must
    /// see the same snapshots as the writer (see `docs/images.md`, snapshots).
    pub image_snaps: BTreeMap<(u32, String), ImageSnaps>,
}

/// The image and object index of an image data object's name (`img.NAME.` + 16 lower-case
/// hex digits), or None for any other object (headers, snapshot copies, plain objects).
/// Image names never contain `@`, so a snapshot copy (`...@` + 16 digits) is not one.
pub fn image_data_object(object: &str) -> Option<(&str, u64)> {
    let rest = object.strip_prefix("img.")?;
    if rest.len() < 18 {
        return None;
    }
    let (image, tail) = rest.split_at(rest.len() - 17);
    let hex = tail.strip_prefix('.')?;
    if image.is_empty() || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    Some((image, u64::from_str_radix(hex, 16).ok()?))
}

/// The snapshots of one image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageSnaps {
    /// The last snapshot id handed out (ids are never reused while the image exists, so a
    /// removed snapshot's leftover copies can never be mistaken for a new one's).
    pub seq: u64,
    /// Live snapshots by id (ascending = oldest first).
    pub snaps: BTreeMap<u64, SnapInfo>,
    /// Snapshot removals so far. A removal leaves the copies only it read; the leader
    /// monitor's trimmer deletes them in the background and then records the count it
    /// trimmed up to in `trimmed` (`snap trimmed`).
    pub removals: u64,
    /// The `removals` count the last finished trim started from (never above it).
    pub trimmed: u64,
}

impl ImageSnaps {
    /// Whether removed snapshots left copies not trimmed yet.
    pub fn trim_pending(&self) -> bool {
        self.removals > self.trimmed
    }

    /// The id of the newest live snapshot (0: none).
    pub fn newest(&self) -> u64 {
        self.snaps.keys().next_back().copied().unwrap_or(0)
    }

    /// The snapshot guard a write to a data object must carry (`ObjRequest::snap_guard`):
    /// the last id handed out while any snapshot is live, else 0. The writer preserves
    /// an object under this id before changing it.
    ///
    /// Not the newest *live* id: after the newest snapshot is removed, the copy it left
    /// (`i@n`) still holds the data of older live snapshots, while the writer would look
    /// for `i@m` (m, the newest live), miss it and copy the changed head there, where
    /// snapshot m would read it. Ids only grow, so copies made after any point carry an
    /// id at least the `seq` of that point (what a snapshot reader relies on).
    pub fn guard(&self) -> u64 {
        if self.snaps.is_empty() {
            0
        } else {
            self.seq
        }
    }

    /// The live snapshot named `name`.
    pub fn by_name(&self, name: &str) -> Option<(u64, &SnapInfo)> {
        self.snaps
            .iter()
            .find(|(_, s)| s.name == name)
            .map(|(id, s)| (*id, s))
    }
}

/// One snapshot of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapInfo {
    pub name: String,
    /// The image's size when the snapshot was taken.
    pub size_bytes: u64,
    /// Seconds since the Unix epoch.
    pub created_unix_secs: u64,
    /// A protected snapshot cannot be removed (clones read from it).
    pub protected: bool,
    /// Its clones, (pool id, image name): while any exists it cannot be unprotected.
    pub children: BTreeSet<(u32, String)>,
}

impl ClusterMap {
    /// The snapshot guard of image `image` in pool `pool` ([`ImageSnaps::guard`]; 0: no
    /// live snapshot).
    pub fn snap_guard(&self, pool: u32, image: &str) -> u64 {
        if self.image_snaps.is_empty() {
            return 0;
        }
        self.image_snaps
            .get(&(pool, image.to_string()))
            .map_or(0, |s| s.guard())
    }
}

/// Who holds an image's exclusive lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLock {
    /// The holder's client id (random per client instance; carried by its requests).
    pub client: u64,
    /// Counts takeovers of this image's lock (1 for the first holder).
    pub generation: u64,
    /// Who the holder is, for people: host, process id and program.
    pub holder: String,
    /// When the holder took the lock, unix seconds.
    pub since_unix_secs: u64,
}

/// Most image locks in one map (`spindle_types::limits::IMAGE_LOCKS_MAX`).
pub const IMAGE_LOCKS_MAX: usize = spindle_types::limits::IMAGE_LOCKS_MAX;
/// Most fenced clients in one map (`spindle_types::limits::FENCED_CLIENTS_MAX`).
pub const FENCED_CLIENTS_MAX: usize = spindle_types::limits::FENCED_CLIENTS_MAX;

/// Default `nearfull_ratio_ppm` (0.85, as Ceph's `mon_osd_nearfull_ratio`).
pub const NEARFULL_RATIO_PPM_DEFAULT: u32 = 850_000;
/// Default `full_ratio_ppm` (0.95, as Ceph's `mon_osd_full_ratio`).
pub const FULL_RATIO_PPM_DEFAULT: u32 = 950_000;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MapError {
    #[error("pool '{0}' already exists")]
    PoolExists(String),
    #[error("no pool named '{0}'")]
    NoSuchPool(String),
    #[error("no storage daemon osd.{0}")]
    NoSuchOsd(u32),
    #[error("invalid pool: {0}")]
    InvalidPool(String),
    #[error("invalid CRUSH map: {0}")]
    InvalidCrush(String),
}

impl ClusterMap {
    /// Whether pool `pool_id` is full: some daemon it can place data on (in the cluster,
    /// weight > 0) is marked full. New writes to it are refused; deletes are not.
    pub fn pool_full(&self, pool_id: u32) -> bool {
        self.pools.contains_key(&pool_id)
            && self
                .osds
                .values()
                .any(|o| o.full && o.in_cluster && o.weight > 0)
    }

    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }

    /// CRUSH reweights for this epoch: 0x10000 for daemons that are in, 0 for out ones and
    /// for CRUSH devices the map does not know.
    pub fn reweights(&self) -> Vec<u32> {
        let mut weights = vec![0u32; self.crush.max_devices.max(0) as usize];
        for osd in self.osds.values() {
            if let Some(w) = weights.get_mut(osd.id as usize) {
                *w = if osd.in_cluster { 0x10000 } else { 0 };
            }
        }
        weights
    }

    pub fn is_up(&self, osd: u32) -> bool {
        self.osds.get(&osd).is_some_and(|o| o.up)
    }

    /// Checks a pool definition against this map (rule exists, sizes sane).
    pub fn check_pool(&self, pool: &Pool) -> Result<(), MapError> {
        if pool.name.is_empty() || pool.name.len() > POOL_NAME_MAX {
            return Err(MapError::InvalidPool(format!(
                "name must be 1..={POOL_NAME_MAX} bytes"
            )));
        }
        if !pool.pg_count.is_power_of_two() || pool.pg_count > PG_COUNT_MAX {
            return Err(MapError::InvalidPool(format!(
                "pg count {} must be a power of two <= {PG_COUNT_MAX}",
                pool.pg_count
            )));
        }
        let (size, min_size) = (pool.size(), pool.min_size());
        if size == 0 || size > POOL_SIZE_MAX || min_size == 0 || min_size > size {
            return Err(MapError::InvalidPool(format!(
                "need 1 <= min_size ({min_size}) <= size ({size}) <= {POOL_SIZE_MAX}"
            )));
        }
        let Some(rule) = self.crush.rule(pool.crush_rule) else {
            return Err(MapError::InvalidPool(format!(
                "CRUSH rule {} does not exist",
                pool.crush_rule
            )));
        };
        if let PoolKind::Erasure {
            k,
            m,
            min_size,
            matrix,
            stripe_unit_bytes,
        } = pool.kind
        {
            if k < 1 || m < 1 || min_size < k {
                return Err(MapError::InvalidPool(format!(
                    "erasure code needs k >= 1, m >= 1 and k <= min_size ({min_size}) <= k + m"
                )));
            }
            if matrix as usize >= EC_MATRIX_NAMES.len() {
                return Err(MapError::InvalidPool(format!(
                    "unknown matrix code {matrix}"
                )));
            }
            if stripe_unit_bytes == 0
                || stripe_unit_bytes > STRIPE_UNIT_MAX
                || stripe_unit_bytes % 512 != 0
            {
                return Err(MapError::InvalidPool(format!(
                    "stripe unit {stripe_unit_bytes} must be a multiple of 512 up to {STRIPE_UNIT_MAX}"
                )));
            }
            let indep = rule.steps.iter().any(|s| {
                matches!(
                    s,
                    spindle_crush::Step::ChooseIndep { .. }
                        | spindle_crush::Step::ChooseLeafIndep { .. }
                )
            });
            if !indep {
                return Err(MapError::InvalidPool(format!(
                    "CRUSH rule {} is not an indep rule (erasure-coded shards are positional)",
                    pool.crush_rule
                )));
            }
        }
        Ok(())
    }

    /// Adds a pool with the next free id; returns the id.
    pub fn add_pool(
        &mut self,
        name: &str,
        kind: PoolKind,
        pg_count: u32,
        crush_rule: i32,
    ) -> Result<u32, MapError> {
        if self.pool_by_name(name).is_some() {
            return Err(MapError::PoolExists(name.to_string()));
        }
        let id = self.pools.keys().next_back().map_or(1, |last| last + 1);
        let pool = Pool {
            id,
            name: name.to_string(),
            kind,
            pg_count,
            crush_rule,
        };
        self.check_pool(&pool)?;
        self.pools.insert(id, pool);
        Ok(id)
    }

    pub fn remove_pool(&mut self, name: &str) -> Result<u32, MapError> {
        let id = self
            .pool_by_name(name)
            .map(|p| p.id)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))?;
        self.pools.remove(&id);
        // Its images are gone with it: so are their locks (a later pool may get the id).
        self.image_locks.retain(|(pool, _), _| *pool != id);
        self.image_snaps.retain(|(pool, _), _| *pool != id);
        Ok(id)
    }
}

/// One daemon of Spindle's own CRUSH hierarchy (root `default` -> host -> daemon).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrushDaemon {
    pub id: u32,
    /// CRUSH weight, 16.16 fixed point (0x10000 = 1.0).
    pub weight: u32,
    /// The host bucket it is in: the failure domain of the embedded rules.
    pub host: String,
}

/// The host bucket of daemon `id` in a single-machine embedded cluster: one per daemon,
/// so that the failure domain "host" separates copies even on one machine.
pub fn own_host(id: u32) -> String {
    format!("host-{id}")
}

/// Whether `name` can be a host bucket's name (letters, digits, `.`, `_`, `-`; at most 64
/// bytes; not starting with a digit, so that it never reads as an id).
pub fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The CRUSH map of an embedded cluster: one host bucket per daemon (so that the failure
/// domain "host" separates copies even on one machine, and daemons can be added later),
/// under root `default`, rule 0 `replicated_rule` = chooseleaf firstn over hosts and rule 1
/// `erasure_rule` = chooseleaf indep over hosts (Ceph's erasure-rule defaults: choose tries
/// 100, chooseleaf tries 5).
pub fn embedded_crush_map(osd_ids: &[u32]) -> Result<CrushMap, MapError> {
    let weighted: Vec<(u32, u32)> = osd_ids.iter().map(|&id| (id, 0x10000)).collect();
    embedded_crush_map_weighted(&weighted)
}

/// The embedded cluster's CRUSH map with a CRUSH weight (16.16) per daemon, each daemon
/// its own host.
pub fn embedded_crush_map_weighted(osds: &[(u32, u32)]) -> Result<CrushMap, MapError> {
    let daemons: Vec<CrushDaemon> = osds
        .iter()
        .map(|&(id, weight)| CrushDaemon {
            id,
            weight,
            host: own_host(id),
        })
        .collect();
    crush_map_of_hosts(&daemons)
}

/// Spindle's CRUSH hierarchy for daemons on hosts: a straw2 host bucket per host (in the
/// order hosts first appear in `daemons`) holding its daemons, a straw2 root `default`
/// over the hosts, and the two rules over the failure domain `host` (see
/// [`embedded_crush_map`]).
pub fn crush_map_of_hosts(daemons: &[CrushDaemon]) -> Result<CrushMap, MapError> {
    use spindle_crush::builder::MapBuilder;
    use spindle_crush::BucketAlg;
    let err = |e: spindle_crush::CrushError| MapError::InvalidCrush(e.to_string());
    let mut b = MapBuilder::new();
    b.add_type(0, "osd")
        .add_type(1, "host")
        .add_type(10, "root");
    let mut order: Vec<&str> = Vec::new();
    for d in daemons {
        if !valid_host_name(&d.host) {
            return Err(MapError::InvalidCrush(format!(
                "bad host name {:?} (letters, digits, '.', '_', '-'; at most 64)",
                d.host
            )));
        }
        if !order.contains(&d.host.as_str()) {
            order.push(&d.host);
        }
        b.add_device(d.id as i32, &format!("osd.{}", d.id), None)
            .map_err(err)?;
    }
    let mut hosts = Vec::new();
    for h in order {
        let items: Vec<(i32, u32)> = daemons
            .iter()
            .filter(|d| d.host == h)
            .map(|d| (d.id as i32, d.weight))
            .collect();
        let host = b
            .add_bucket(h, "host", BucketAlg::Straw2, &items)
            .map_err(err)?;
        hosts.push((host, 0));
    }
    let root = b
        .add_bucket("default", "root", BucketAlg::Straw2, &hosts)
        .map_err(err)?;
    b.add_replicated_rule("replicated_rule", root, "host")
        .map_err(err)?;
    let host_type = 1;
    let erasure = b
        .add_rule(
            "erasure_rule",
            spindle_crush::map::RULE_TYPE_ERASURE,
            vec![
                spindle_crush::Step::SetChooseLeafTries(5),
                spindle_crush::Step::SetChooseTries(100),
                spindle_crush::Step::Take { item: root },
                spindle_crush::Step::ChooseLeafIndep {
                    num: 0,
                    type_id: host_type,
                },
                spindle_crush::Step::Emit,
            ],
        )
        .map_err(err)?;
    debug_assert_eq!(erasure, EMBEDDED_ERASURE_RULE);
    Ok(b.build())
}

/// If `crush` is exactly Spindle's own hierarchy of `osd_ids` (as built by
/// [`crush_map_of_hosts`]), each daemon with its weight and host; None for a map an
/// operator loaded by hand.
pub fn embedded_layout(crush: &CrushMap, osd_ids: &[u32]) -> Option<Vec<CrushDaemon>> {
    let mut daemons = Vec::with_capacity(osd_ids.len());
    for &id in osd_ids {
        let (host, weight) = crush.buckets.iter().flatten().find_map(|b| {
            let i = b.items.iter().position(|&it| it == id as i32)?;
            Some((
                crush.item_names.get(&b.id)?.clone(),
                *b.item_weights.get(i)?,
            ))
        })?;
        daemons.push(CrushDaemon { id, weight, host });
    }
    let rebuilt = crush_map_of_hosts(&daemons).ok()?;
    (spindle_crush::text::print_text(&rebuilt) == spindle_crush::text::print_text(crush))
        .then_some(daemons)
}

/// The name of the bucket of type `host` that holds daemon `id`, if any.
pub fn host_of(crush: &CrushMap, id: u32) -> Option<String> {
    let host_type = crush.type_id("host")?;
    crush
        .buckets
        .iter()
        .flatten()
        .find(|b| i32::from(b.type_id) == host_type && b.items.contains(&(id as i32)))
        .and_then(|b| crush.item_names.get(&b.id).cloned())
}

/// [`embedded_layout`] as (id, weight) pairs, for maps where every daemon is its own host.
pub fn embedded_weights(crush: &CrushMap, osd_ids: &[u32]) -> Option<Vec<(u32, u32)>> {
    let layout = embedded_layout(crush, osd_ids)?;
    Some(layout.iter().map(|d| (d.id, d.weight)).collect())
}

#[cfg(test)]
mod hierarchy_tests {
    use super::*;

    fn d(id: u32, host: &str) -> CrushDaemon {
        CrushDaemon {
            id,
            weight: 0x10000,
            host: host.into(),
        }
    }

    #[test]
    fn hosts_group_daemons_and_the_layout_is_recognised() {
        let daemons = vec![d(0, "h1"), d(1, "h2"), d(2, "h1"), d(3, "h3")];
        let crush = crush_map_of_hosts(&daemons).unwrap();
        let h1 = crush.bucket(crush.item_id("h1").unwrap()).unwrap();
        assert_eq!(h1.items, [0, 2]);
        assert_eq!(
            embedded_layout(&crush, &[0, 1, 2, 3]),
            Some(daemons.clone())
        );
        // Adding a daemon to an existing host keeps the other hosts' bucket ids.
        let mut more = daemons.clone();
        more.push(d(4, "h2"));
        let grown = crush_map_of_hosts(&more).unwrap();
        for h in ["h1", "h2", "h3"] {
            assert_eq!(grown.item_id(h), crush.item_id(h), "{h}");
        }
        // One host per daemon is the single-machine map.
        let own = embedded_crush_map(&[0, 1]).unwrap();
        assert_eq!(
            embedded_layout(&own, &[0, 1]).unwrap(),
            vec![d(0, "host-0"), d(1, "host-1")]
        );
        // A map that is not Spindle's own is not recognised (a daemon missing from it).
        assert_eq!(embedded_layout(&crush, &[0, 1, 2, 3, 9]), None);
        // Bad host names are refused.
        assert!(crush_map_of_hosts(&[d(0, "7up")]).is_err());
        assert!(crush_map_of_hosts(&[d(0, "a b")]).is_err());
        assert!(valid_host_name("rack1.h-2_x"));
        assert_eq!(host_of(&crush, 2).as_deref(), Some("h1"));
        assert_eq!(host_of(&crush, 9), None);
    }
}
