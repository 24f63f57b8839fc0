//! The CRUSH map model: devices, types, buckets, rules, tunables and device classes.
//!
//! Invariants (checked by [`CrushMap::validate`] and kept by the builder):
//! - bucket ids are negative; bucket `id` lives at `buckets[-1 - id]`;
//! - device ids are `0..max_devices`;
//! - every bucket's derived arrays (`sum_weights`, `node_weights`, `straws`) are consistent
//!   with its `item_weights`, computed exactly as Ceph's `builder.c` does;
//! - shadow (per-class) buckets are named `<bucket>~<class>` and listed in `class_bucket`.

use std::collections::BTreeMap;

/// `CRUSH_ITEM_NONE`: an `indep` slot that could not be filled (printed as 2147483647).
pub const ITEM_NONE: i32 = 0x7fff_ffff;
/// `CRUSH_ITEM_UNDEF`: a slot not yet decided during `indep` mapping.
pub(crate) const ITEM_UNDEF: i32 = 0x7fff_fffe;
/// A device weight (or reweight) of 1.0 in 16.16 fixed point.
pub const WEIGHT_ONE: u32 = 0x10000;
/// Rule type of replicated pools (`CEPH_PG_TYPE_REPLICATED`).
pub const RULE_TYPE_REPLICATED: u8 = 1;
/// Rule type of erasure-coded pools (`CEPH_PG_TYPE_ERASURE`).
pub const RULE_TYPE_ERASURE: u8 = 3;

/// Bucket algorithms, with Ceph's numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketAlg {
    Uniform = 1,
    List = 2,
    Tree = 3,
    Straw = 4,
    Straw2 = 5,
}

impl BucketAlg {
    pub fn name(self) -> &'static str {
        match self {
            BucketAlg::Uniform => "uniform",
            BucketAlg::List => "list",
            BucketAlg::Tree => "tree",
            BucketAlg::Straw => "straw",
            BucketAlg::Straw2 => "straw2",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "uniform" => BucketAlg::Uniform,
            "list" => BucketAlg::List,
            "tree" => BucketAlg::Tree,
            "straw" => BucketAlg::Straw,
            "straw2" => BucketAlg::Straw2,
            _ => return None,
        })
    }

    pub fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            1 => BucketAlg::Uniform,
            2 => BucketAlg::List,
            3 => BucketAlg::Tree,
            4 => BucketAlg::Straw,
            5 => BucketAlg::Straw2,
            _ => return None,
        })
    }
}

/// A bucket: an interior node of the hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Negative id.
    pub id: i32,
    /// Type id (e.g. host = 1).
    pub type_id: u16,
    pub alg: BucketAlg,
    /// Hash algorithm; only 0 (rjenkins1) exists.
    pub hash: u8,
    /// Total weight, 16.16 fixed point.
    pub weight: u32,
    /// Item ids in position order (devices >= 0, buckets < 0).
    pub items: Vec<i32>,
    /// Per-item weight, 16.16; for uniform buckets every entry is the uniform weight.
    pub item_weights: Vec<u32>,
    /// List buckets: running sums of `item_weights`.
    pub sum_weights: Vec<u32>,
    /// Tree buckets: node weights indexed by node label (`num_nodes` entries).
    pub node_weights: Vec<u32>,
    /// Straw (v1) buckets: straw lengths.
    pub straws: Vec<u32>,
}

impl Bucket {
    pub fn size(&self) -> usize {
        self.items.len()
    }
}

/// One rule step, with Ceph's op semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Noop,
    Take { item: i32 },
    Emit,
    ChooseFirstN { num: i32, type_id: i32 },
    ChooseIndep { num: i32, type_id: i32 },
    ChooseLeafFirstN { num: i32, type_id: i32 },
    ChooseLeafIndep { num: i32, type_id: i32 },
    SetChooseTries(i32),
    SetChooseLeafTries(i32),
    SetChooseLocalTries(i32),
    SetChooseLocalFallbackTries(i32),
    SetChooseLeafVaryR(i32),
    SetChooseLeafStable(i32),
}

impl Step {
    /// Ceph's op code, arg1, arg2 (as in the binary encoding).
    pub fn encode(self) -> (u32, i32, i32) {
        match self {
            Step::Noop => (0, 0, 0),
            Step::Take { item } => (1, item, 0),
            Step::ChooseFirstN { num, type_id } => (2, num, type_id),
            Step::ChooseIndep { num, type_id } => (3, num, type_id),
            Step::Emit => (4, 0, 0),
            Step::ChooseLeafFirstN { num, type_id } => (6, num, type_id),
            Step::ChooseLeafIndep { num, type_id } => (7, num, type_id),
            Step::SetChooseTries(v) => (8, v, 0),
            Step::SetChooseLeafTries(v) => (9, v, 0),
            Step::SetChooseLocalTries(v) => (10, v, 0),
            Step::SetChooseLocalFallbackTries(v) => (11, v, 0),
            Step::SetChooseLeafVaryR(v) => (12, v, 0),
            Step::SetChooseLeafStable(v) => (13, v, 0),
        }
    }

    /// Inverse of [`Step::encode`]; `None` for an unknown op.
    pub fn decode(op: u32, arg1: i32, arg2: i32) -> Option<Step> {
        Some(match op {
            0 => Step::Noop,
            1 => Step::Take { item: arg1 },
            2 => Step::ChooseFirstN {
                num: arg1,
                type_id: arg2,
            },
            3 => Step::ChooseIndep {
                num: arg1,
                type_id: arg2,
            },
            4 => Step::Emit,
            6 => Step::ChooseLeafFirstN {
                num: arg1,
                type_id: arg2,
            },
            7 => Step::ChooseLeafIndep {
                num: arg1,
                type_id: arg2,
            },
            8 => Step::SetChooseTries(arg1),
            9 => Step::SetChooseLeafTries(arg1),
            10 => Step::SetChooseLocalTries(arg1),
            11 => Step::SetChooseLocalFallbackTries(arg1),
            12 => Step::SetChooseLeafVaryR(arg1),
            13 => Step::SetChooseLeafStable(arg1),
            _ => return None,
        })
    }
}

/// A placement rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Rule type: 1 replicated, 3 erasure (other values are kept as they are).
    pub rule_type: u8,
    /// Deprecated size bounds, kept for format compatibility; mapping ignores them.
    pub min_size: u8,
    pub max_size: u8,
    pub steps: Vec<Step>,
}

/// Map-wide tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    pub choose_local_tries: u32,
    pub choose_local_fallback_tries: u32,
    pub choose_total_tries: u32,
    pub chooseleaf_descend_once: u32,
    pub chooseleaf_vary_r: u8,
    pub chooseleaf_stable: u8,
    pub straw_calc_version: u8,
    pub allowed_bucket_algs: u32,
}

/// Largest retry count (tunable or rule step) a map may ask for. Ceph's defaults are 50
/// and 100; a corrupted or hostile map asking for billions would make mapping hang.
pub const MAX_TRIES: u32 = 10_000;
/// Largest device count a map may declare (16 Mi devices).
pub const MAX_DEVICES: i32 = 1 << 24;
/// Largest result size a mapping produces; larger requests are clamped (no CRUSH rule can
/// place more distinct items than this usefully, and scratch memory is 3x this).
pub const MAX_RESULT: usize = 1024;
/// Deepest bucket hierarchy a descent follows before giving up on an item.
pub const MAX_DEPTH: usize = 64;

/// Bucket algorithms allowed by legacy maps (uniform, list, straw).
pub const LEGACY_ALLOWED_BUCKET_ALGS: u32 = (1 << 1) | (1 << 2) | (1 << 4);
/// Bucket algorithms allowed since hammer (adds tree and straw2).
pub const V4_ALLOWED_BUCKET_ALGS: u32 = LEGACY_ALLOWED_BUCKET_ALGS | (1 << 3) | (1 << 5);

impl Tunables {
    /// "argonaut": what a text map without `tunable` lines compiles to.
    pub const LEGACY: Tunables = Tunables {
        choose_local_tries: 2,
        choose_local_fallback_tries: 5,
        choose_total_tries: 19,
        chooseleaf_descend_once: 0,
        chooseleaf_vary_r: 0,
        chooseleaf_stable: 0,
        straw_calc_version: 0,
        allowed_bucket_algs: LEGACY_ALLOWED_BUCKET_ALGS,
    };
    pub const BOBTAIL: Tunables = Tunables {
        choose_local_tries: 0,
        choose_local_fallback_tries: 0,
        choose_total_tries: 50,
        chooseleaf_descend_once: 1,
        ..Tunables::LEGACY
    };
    pub const FIREFLY: Tunables = Tunables {
        chooseleaf_vary_r: 1,
        ..Tunables::BOBTAIL
    };
    pub const HAMMER: Tunables = Tunables {
        allowed_bucket_algs: V4_ALLOWED_BUCKET_ALGS,
        ..Tunables::FIREFLY
    };
    pub const JEWEL: Tunables = Tunables {
        chooseleaf_stable: 1,
        ..Tunables::HAMMER
    };
    /// Ceph's current defaults ("optimal" = jewel, with straw_calc_version 1).
    pub const DEFAULT: Tunables = Tunables {
        straw_calc_version: 1,
        ..Tunables::JEWEL
    };

    /// Looks up a named profile as `ceph osd crush tunables <profile>` knows them.
    pub fn profile(name: &str) -> Option<Tunables> {
        Some(match name {
            "legacy" | "argonaut" => Tunables::LEGACY,
            "bobtail" => Tunables::BOBTAIL,
            "firefly" => Tunables::FIREFLY,
            "hammer" => Tunables::HAMMER,
            "jewel" | "optimal" | "default" => Tunables::DEFAULT,
            _ => return None,
        })
    }
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables::DEFAULT
    }
}

/// A complete CRUSH map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrushMap {
    /// `buckets[-1 - id]` is bucket `id`.
    pub buckets: Vec<Option<Bucket>>,
    /// `rules[id]`.
    pub rules: Vec<Option<Rule>>,
    /// One more than the largest device id in use (Ceph's `max_devices`).
    pub max_devices: i32,
    pub tunables: Tunables,
    /// Type id -> name.
    pub type_names: BTreeMap<i32, String>,
    /// Item id (device or bucket) -> name.
    pub item_names: BTreeMap<i32, String>,
    /// Rule id -> name.
    pub rule_names: BTreeMap<i32, String>,
    /// Class id -> class name.
    pub class_names: BTreeMap<i32, String>,
    /// Item id -> class id (devices, and shadow buckets).
    pub class_map: BTreeMap<i32, i32>,
    /// Original bucket id -> class id -> shadow bucket id.
    pub class_bucket: BTreeMap<i32, BTreeMap<i32, i32>>,
}

impl Default for CrushMap {
    fn default() -> Self {
        CrushMap {
            buckets: Vec::new(),
            rules: Vec::new(),
            max_devices: 0,
            tunables: Tunables::DEFAULT,
            type_names: BTreeMap::new(),
            item_names: BTreeMap::new(),
            rule_names: BTreeMap::new(),
            class_names: BTreeMap::new(),
            class_map: BTreeMap::new(),
            class_bucket: BTreeMap::new(),
        }
    }
}

impl CrushMap {
    /// The bucket with this (negative) id, if it exists.
    #[inline]
    pub fn bucket(&self, id: i32) -> Option<&Bucket> {
        if id >= 0 {
            return None;
        }
        let index = (-1 - i64::from(id)) as usize;
        self.buckets.get(index).and_then(Option::as_ref)
    }

    pub fn max_buckets(&self) -> i32 {
        self.buckets.len() as i32
    }

    pub fn rule(&self, id: i32) -> Option<&Rule> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.rules.get(i))
            .and_then(Option::as_ref)
    }

    /// Id of the item (device or bucket) with this name.
    pub fn item_id(&self, name: &str) -> Option<i32> {
        self.item_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id)
    }

    pub fn type_id(&self, name: &str) -> Option<i32> {
        self.type_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id)
    }

    pub fn class_id(&self, name: &str) -> Option<i32> {
        self.class_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id)
    }

    pub fn rule_id(&self, name: &str) -> Option<i32> {
        self.rule_names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| *id)
    }

    /// True if the device appears in some bucket (crushtool gives absent devices weight 0).
    pub fn device_in_hierarchy(&self, device: i32) -> bool {
        self.buckets
            .iter()
            .flatten()
            .any(|b| b.items.contains(&device))
    }

    /// True for a shadow (per-class) bucket.
    pub fn is_shadow(&self, id: i32) -> bool {
        self.item_names.get(&id).is_some_and(|n| n.contains('~'))
    }

    /// Splits a shadow bucket id into (original bucket id, class id).
    pub fn split_shadow(&self, id: i32) -> Option<(i32, i32)> {
        self.class_bucket.iter().find_map(|(orig, by_class)| {
            by_class
                .iter()
                .find(|(_, shadow)| **shadow == id)
                .map(|(class, _)| (*orig, *class))
        })
    }

    /// Recomputes `max_devices` as Ceph's `finalize()` does: one past the largest device id
    /// found in a bucket or among the named items.
    pub fn finalize(&mut self) {
        let mut max_devices = 0i32;
        for bucket in self.buckets.iter().flatten() {
            for &item in &bucket.items {
                if item >= max_devices {
                    max_devices = item + 1;
                }
            }
        }
        if let Some((&id, _)) = self.item_names.iter().next_back() {
            if id >= max_devices {
                max_devices = id + 1;
            }
        }
        self.max_devices = max_devices;
    }

    /// Checks the limits that keep mapping finite and bounded: retry counts up to
    /// [`MAX_TRIES`], `vary_r` below 32, at most [`MAX_DEVICES`] devices, an acyclic bucket
    /// graph no deeper than [`MAX_DEPTH`], and consistent per-bucket arrays.
    pub fn validate(&self) -> Result<(), crate::CrushError> {
        let invalid = |m: String| Err(crate::CrushError::Invalid(m));
        let t = &self.tunables;
        for (name, v) in [
            ("choose_total_tries", t.choose_total_tries),
            ("choose_local_tries", t.choose_local_tries),
            ("choose_local_fallback_tries", t.choose_local_fallback_tries),
        ] {
            if v > MAX_TRIES {
                return invalid(format!("tunable {name} {v} exceeds {MAX_TRIES}"));
            }
        }
        if t.chooseleaf_vary_r > 31 {
            return invalid(format!(
                "tunable chooseleaf_vary_r {} exceeds 31",
                t.chooseleaf_vary_r
            ));
        }
        if !(0..=MAX_DEVICES).contains(&self.max_devices) {
            return invalid(format!("max_devices {} is out of range", self.max_devices));
        }
        for (id, rule) in self.rules.iter().enumerate() {
            let Some(rule) = rule else { continue };
            for step in &rule.steps {
                let (v, what) = match *step {
                    Step::SetChooseTries(v) => (v, "set_choose_tries"),
                    Step::SetChooseLeafTries(v) => (v, "set_chooseleaf_tries"),
                    Step::SetChooseLocalTries(v) => (v, "set_choose_local_tries"),
                    Step::SetChooseLocalFallbackTries(v) => (v, "set_choose_local_fallback_tries"),
                    Step::SetChooseLeafVaryR(v) if v > 31 => {
                        return invalid(format!("rule {id}: set_chooseleaf_vary_r {v} exceeds 31"))
                    }
                    _ => continue,
                };
                if v > MAX_TRIES as i32 {
                    return invalid(format!("rule {id}: {what} {v} exceeds {MAX_TRIES}"));
                }
            }
        }
        for bucket in self.buckets.iter().flatten() {
            let n = bucket.items.len();
            let consistent = bucket.item_weights.len() == n
                && match bucket.alg {
                    BucketAlg::List => bucket.sum_weights.len() == n,
                    BucketAlg::Straw => bucket.straws.len() == n,
                    BucketAlg::Tree => n == 0 || bucket.node_weights.len() >= 2 * n,
                    BucketAlg::Uniform | BucketAlg::Straw2 => true,
                };
            if !consistent {
                return invalid(format!("bucket {} has inconsistent item arrays", bucket.id));
            }
        }
        self.check_acyclic()
    }

    /// Depth-first walk of the bucket graph: no cycles, no path deeper than `MAX_DEPTH`.
    fn check_acyclic(&self) -> Result<(), crate::CrushError> {
        // 0 = unvisited, 1 = on the current path, 2 = done; depth memoized per bucket.
        let mut state = vec![0u8; self.buckets.len()];
        let mut depth = vec![0usize; self.buckets.len()];
        for start in 0..self.buckets.len() {
            if self.buckets[start].is_none() || state[start] == 2 {
                continue;
            }
            // Iterative DFS: (bucket index, next child position).
            let mut stack = vec![(start, 0usize)];
            state[start] = 1;
            while let Some(&mut (index, ref mut pos)) = stack.last_mut() {
                let items = self.buckets[index]
                    .as_ref()
                    .map_or(&[][..], |b| &b.items[..]);
                if let Some(&item) = items.get(*pos) {
                    *pos += 1;
                    if item >= 0 {
                        continue;
                    }
                    let child = (-1 - i64::from(item)) as usize;
                    if child >= self.buckets.len() || self.buckets[child].is_none() {
                        continue; // dangling: the mapper skips it
                    }
                    match state[child] {
                        1 => {
                            return Err(crate::CrushError::Invalid(format!(
                                "bucket {} is part of a cycle",
                                -1 - child as i64
                            )))
                        }
                        0 => {
                            state[child] = 1;
                            stack.push((child, 0));
                        }
                        _ => {}
                    }
                } else {
                    let d = 1 + items
                        .iter()
                        .filter(|&&i| i < 0)
                        .map(|&i| (-1 - i64::from(i)) as usize)
                        .filter(|&c| c < depth.len())
                        .map(|c| depth[c])
                        .max()
                        .unwrap_or(0);
                    if d > MAX_DEPTH {
                        return Err(crate::CrushError::Invalid(format!(
                            "bucket hierarchy deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    depth[index] = d;
                    state[index] = 2;
                    stack.pop();
                }
            }
        }
        Ok(())
    }

    /// A per-device reweight vector with every device present in the hierarchy at 1.0 and
    /// absent ones at 0, as crushtool builds it.
    pub fn default_reweights(&self) -> Vec<u32> {
        let mut present = vec![false; self.max_devices.max(0) as usize];
        for bucket in self.buckets.iter().flatten() {
            for &item in &bucket.items {
                if item >= 0 && (item as usize) < present.len() {
                    present[item as usize] = true;
                }
            }
        }
        present
            .into_iter()
            .map(|p| if p { WEIGHT_ONE } else { 0 })
            .collect()
    }
}
