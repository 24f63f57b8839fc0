//! Building buckets exactly as Ceph's `builder.c` does: list running sums, tree node
//! weights, straw (v1) straw lengths for `straw_calc_version` 0 and 1.
//!
//! Invariant: the derived arrays depend only on (alg, item weights, straw_calc_version),
//! so a bucket built here maps identically to one compiled by `crushtool`.

use crate::error::CrushError;
use crate::map::{Bucket, BucketAlg, CrushMap, Rule, Step};

/// Limits Ceph's compiler enforces on text weights.
pub const MAX_DEVICE_WEIGHT_16_16: u64 = 100 * 0x10000;
pub const MAX_BUCKET_WEIGHT_16_16: u64 = 65535 * 0x10000;

/// Builds a bucket (not yet inserted in a map). `weights` are 16.16 per item; for a
/// uniform bucket only the first weight is used, as in Ceph.
pub fn make_bucket(
    alg: BucketAlg,
    hash: u8,
    type_id: u16,
    items: &[i32],
    weights: &[u32],
    straw_calc_version: u8,
) -> Result<Bucket, CrushError> {
    assert_eq!(items.len(), weights.len(), "one weight per item");
    let size = items.len();
    let mut bucket = Bucket {
        id: 0,
        type_id,
        alg,
        hash,
        weight: 0,
        items: items.to_vec(),
        item_weights: weights.to_vec(),
        sum_weights: Vec::new(),
        node_weights: Vec::new(),
        straws: Vec::new(),
    };
    let overflow = || CrushError::WeightOverflow { items: items.len() };
    match alg {
        BucketAlg::Uniform => {
            let item_weight = weights.first().copied().unwrap_or(0);
            bucket.item_weights = vec![item_weight; size];
            bucket.weight =
                u32::try_from(u64::from(item_weight) * size as u64).map_err(|_| overflow())?;
        }
        BucketAlg::List => {
            let mut sum = 0u32;
            for &w in weights {
                sum = sum.checked_add(w).ok_or_else(overflow)?;
                bucket.sum_weights.push(sum);
            }
            bucket.weight = sum;
        }
        BucketAlg::Tree => {
            bucket.node_weights = tree_node_weights(weights).ok_or_else(overflow)?;
            bucket.weight = bucket
                .node_weights
                .get(bucket.node_weights.len() / 2)
                .copied()
                .unwrap_or(0);
        }
        BucketAlg::Straw => {
            bucket.weight = checked_sum(weights).ok_or_else(overflow)?;
            bucket.straws = calc_straws(weights, straw_calc_version);
        }
        BucketAlg::Straw2 => {
            bucket.weight = checked_sum(weights).ok_or_else(overflow)?;
        }
    }
    Ok(bucket)
}

fn checked_sum(weights: &[u32]) -> Option<u32> {
    weights.iter().try_fold(0u32, |acc, &w| acc.checked_add(w))
}

/// Depth of the tree holding `size` leaves (Ceph's `calc_depth`).
fn tree_depth(size: usize) -> u32 {
    if size == 0 {
        return 0;
    }
    let mut depth = 1;
    let mut t = size - 1;
    while t != 0 {
        t >>= 1;
        depth += 1;
    }
    depth
}

/// Node label of leaf `i`: leaves are the odd labels 1, 3, 5, ...
pub(crate) fn tree_leaf_node(i: usize) -> usize {
    ((i + 1) << 1) - 1
}

fn tree_height(n: usize) -> u32 {
    n.trailing_zeros()
}

fn tree_parent(n: usize) -> usize {
    let h = tree_height(n);
    if n & (1 << (h + 1)) != 0 {
        n - (1 << h)
    } else {
        n + (1 << h)
    }
}

/// Node weights of a tree bucket: each leaf's weight is added to every ancestor.
fn tree_node_weights(weights: &[u32]) -> Option<Vec<u32>> {
    let size = weights.len();
    if size == 0 {
        return Some(Vec::new());
    }
    let depth = tree_depth(size);
    let num_nodes = 1usize << depth;
    // Ceph stores num_nodes in a u8 in the binary format; 128 leaves is the practical max.
    let mut node_weights = vec![0u32; num_nodes];
    for (i, &w) in weights.iter().enumerate() {
        let mut node = tree_leaf_node(i);
        node_weights[node] = w;
        for _ in 1..depth {
            node = tree_parent(node);
            node_weights[node] = node_weights[node].checked_add(w)?;
        }
    }
    Some(node_weights)
}

/// Straw lengths of a straw (v1) bucket, Ceph's `crush_calc_straw`, including the
/// historical quirks of version 0.
pub fn calc_straws(weights: &[u32], straw_calc_version: u8) -> Vec<u32> {
    let size = weights.len();
    let mut straws = vec![0u32; size];
    // Indices sorted by weight, stable (insertion sort as in Ceph: equal weights keep order).
    let mut reverse: Vec<usize> = Vec::with_capacity(size);
    for i in 0..size {
        let pos = reverse
            .iter()
            .position(|&r| weights[i] < weights[r])
            .unwrap_or(reverse.len());
        reverse.insert(pos, i);
    }
    let mut numleft = size as i64;
    let mut straw = 1.0f64;
    let mut wbelow = 0.0f64;
    let mut lastw = 0.0f64;
    let mut i = 0;
    while i < size {
        if straw_calc_version == 0 {
            if weights[reverse[i]] == 0 {
                straws[reverse[i]] = 0;
                i += 1;
                continue;
            }
            straws[reverse[i]] = (straw * 65536.0) as u32;
            i += 1;
            if i == size {
                break;
            }
            if weights[reverse[i]] == weights[reverse[i - 1]] {
                continue;
            }
            wbelow += (f64::from(weights[reverse[i - 1]]) - lastw) * numleft as f64;
            for j in i..size {
                if weights[reverse[j]] == weights[reverse[i]] {
                    numleft -= 1;
                } else {
                    break;
                }
            }
            // Ceph computes this product in 32-bit unsigned arithmetic.
            let wnext = f64::from(
                (numleft as u32)
                    .wrapping_mul(weights[reverse[i]].wrapping_sub(weights[reverse[i - 1]])),
            );
            let pbelow = wbelow / (wbelow + wnext);
            straw *= (1.0 / pbelow).powf(1.0 / numleft as f64);
            lastw = f64::from(weights[reverse[i - 1]]);
        } else {
            if weights[reverse[i]] == 0 {
                straws[reverse[i]] = 0;
                i += 1;
                numleft -= 1;
                continue;
            }
            straws[reverse[i]] = (straw * 65536.0) as u32;
            i += 1;
            if i == size {
                break;
            }
            wbelow += (f64::from(weights[reverse[i - 1]]) - lastw) * numleft as f64;
            numleft -= 1;
            // Ceph computes this product in 32-bit unsigned arithmetic.
            let wnext = f64::from(
                (numleft as u32)
                    .wrapping_mul(weights[reverse[i]].wrapping_sub(weights[reverse[i - 1]])),
            );
            let pbelow = wbelow / (wbelow + wnext);
            straw *= (1.0 / pbelow).powf(1.0 / numleft as f64);
            lastw = f64::from(weights[reverse[i - 1]]);
        }
    }
    straws
}

/// Inserts a bucket under `id` (or the first free negative id when `id` is 0, as Ceph's
/// `crush_add_bucket` does) and returns the id used.
pub fn add_bucket(map: &mut CrushMap, id: i32, mut bucket: Bucket) -> Result<i32, CrushError> {
    let id = if id == 0 {
        let free = map
            .buckets
            .iter()
            .position(Option::is_none)
            .unwrap_or(map.buckets.len());
        -1 - free as i32
    } else {
        id
    };
    if id >= 0 {
        return Err(CrushError::Invalid(format!(
            "bucket id {id} must be negative"
        )));
    }
    let index = (-1 - i64::from(id)) as usize;
    if index >= 1 << 20 {
        return Err(CrushError::Invalid(format!(
            "bucket id {id} is out of range"
        )));
    }
    if map.buckets.len() <= index {
        // Ceph grows the bucket array to 8, then by doubling; `max_buckets` is visible in
        // the binary format and in automatic shadow bucket ids.
        let mut new_len = if map.buckets.is_empty() {
            8
        } else {
            map.buckets.len() * 2
        };
        while index >= new_len {
            new_len *= 2;
        }
        map.buckets.resize(new_len, None);
    }
    if map.buckets[index].is_some() {
        return Err(CrushError::Invalid(format!("duplicate bucket id {id}")));
    }
    bucket.id = id;
    map.buckets[index] = Some(bucket);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_weights_sum_to_root() {
        let weights = [0x10000, 0x20000, 0x8000, 0x30000, 0x1000];
        let b = make_bucket(BucketAlg::Tree, 0, 1, &[0, 1, 2, 3, 4], &weights, 1).unwrap();
        let total: u32 = weights.iter().sum();
        assert_eq!(b.weight, total);
        assert_eq!(b.node_weights.len(), 16);
        assert_eq!(b.node_weights[8], total);
        for (i, w) in weights.iter().enumerate() {
            assert_eq!(b.node_weights[tree_leaf_node(i)], *w);
        }
    }

    #[test]
    fn equal_weights_get_equal_straws() {
        for version in [0, 1] {
            let straws = calc_straws(&[0x10000; 5], version);
            assert!(straws.iter().all(|&s| s == 0x10000), "{straws:?}");
        }
    }

    #[test]
    fn heavier_items_get_longer_straws_and_zero_gets_zero() {
        let straws = calc_straws(&[0x10000, 0x20000, 0, 0x40000], 1);
        assert_eq!(straws[2], 0);
        assert!(straws[0] < straws[1] && straws[1] < straws[3], "{straws:?}");
    }

    #[test]
    fn list_sums_accumulate() {
        let b = make_bucket(BucketAlg::List, 0, 1, &[0, 1, 2], &[1, 2, 3], 1).unwrap();
        assert_eq!(b.sum_weights, vec![1, 3, 6]);
        assert_eq!(b.weight, 6);
    }
}

/// Programmatic construction of a map (what the monitor uses to describe a cluster).
///
/// ```
/// use spindle_crush::builder::MapBuilder;
/// use spindle_crush::{BucketAlg, Step};
/// let mut b = MapBuilder::new();
/// b.add_type(0, "osd").add_type(1, "host").add_type(2, "root");
/// for id in 0..4 {
///     b.add_device(id, &format!("osd.{id}"), None).unwrap();
/// }
/// let h0 = b.add_bucket("h0", "host", BucketAlg::Straw2, &[(0, 0x10000), (1, 0x10000)]).unwrap();
/// let h1 = b.add_bucket("h1", "host", BucketAlg::Straw2, &[(2, 0x10000), (3, 0x10000)]).unwrap();
/// let root = b.add_bucket("default", "root", BucketAlg::Straw2, &[(h0, 0), (h1, 0)]).unwrap();
/// let rule = b.add_replicated_rule("replicated", root, "host").unwrap();
/// let map = b.build();
/// assert_eq!(map.map_input(rule, 7, 2, &map.default_reweights()).len(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct MapBuilder {
    map: CrushMap,
}

impl Default for MapBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl MapBuilder {
    /// An empty map with Ceph's current default tunables.
    pub fn new() -> Self {
        MapBuilder {
            map: CrushMap::default(),
        }
    }

    pub fn with_tunables(mut self, tunables: crate::map::Tunables) -> Self {
        self.map.tunables = tunables;
        self
    }

    pub fn add_type(&mut self, id: i32, name: &str) -> &mut Self {
        self.map.type_names.insert(id, name.to_string());
        self
    }

    /// Adds a device with an optional device class.
    pub fn add_device(
        &mut self,
        id: i32,
        name: &str,
        class: Option<&str>,
    ) -> Result<(), CrushError> {
        if id < 0 {
            return Err(CrushError::Invalid(format!("device id {id} must be >= 0")));
        }
        if self.map.item_names.contains_key(&id) || self.map.item_id(name).is_some() {
            return Err(CrushError::Invalid(format!(
                "device {id} ({name}) already exists"
            )));
        }
        self.map.item_names.insert(id, name.to_string());
        if let Some(class) = class {
            let cid = match self.map.class_id(class) {
                Some(c) => c,
                None => {
                    let c = self.map.class_names.keys().next_back().map_or(0, |l| l + 1);
                    self.map.class_names.insert(c, class.to_string());
                    c
                }
            };
            self.map.class_map.insert(id, cid);
        }
        Ok(())
    }

    /// Adds a bucket of `items` (id, 16.16 weight). A weight of 0 for a bucket item means
    /// "that bucket's own total weight". Returns the new (negative) id.
    pub fn add_bucket(
        &mut self,
        name: &str,
        type_name: &str,
        alg: BucketAlg,
        items: &[(i32, u32)],
    ) -> Result<i32, CrushError> {
        let type_id = self
            .map
            .type_id(type_name)
            .ok_or_else(|| CrushError::Invalid(format!("type '{type_name}' is not defined")))?;
        if self.map.item_id(name).is_some() {
            return Err(CrushError::Invalid(format!("item '{name}' already exists")));
        }
        let mut ids = Vec::with_capacity(items.len());
        let mut weights = Vec::with_capacity(items.len());
        for &(id, weight) in items {
            let weight = if id < 0 && weight == 0 {
                self.map
                    .bucket(id)
                    .ok_or_else(|| CrushError::Invalid(format!("bucket {id} does not exist")))?
                    .weight
            } else {
                weight
            };
            if id >= 0 && !self.map.item_names.contains_key(&id) {
                return Err(CrushError::Invalid(format!("device {id} does not exist")));
            }
            ids.push(id);
            weights.push(weight);
        }
        let bucket = make_bucket(
            alg,
            0,
            type_id as u16,
            &ids,
            &weights,
            self.map.tunables.straw_calc_version,
        )?;
        let id = add_bucket(&mut self.map, 0, bucket)?;
        self.map.item_names.insert(id, name.to_string());
        Ok(id)
    }

    /// Adds a rule with explicit steps; returns its id.
    pub fn add_rule(
        &mut self,
        name: &str,
        rule_type: u8,
        steps: Vec<Step>,
    ) -> Result<i32, CrushError> {
        if self.map.rule_id(name).is_some() {
            return Err(CrushError::Invalid(format!("rule '{name}' already exists")));
        }
        let id = self
            .map
            .rules
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.map.rules.len());
        if id > 255 {
            return Err(CrushError::Invalid("too many rules".to_string()));
        }
        if id == self.map.rules.len() {
            self.map.rules.push(None);
        }
        self.map.rules[id] = Some(Rule {
            rule_type,
            min_size: 1,
            max_size: 100,
            steps,
        });
        self.map.rule_names.insert(id as i32, name.to_string());
        Ok(id as i32)
    }

    /// The rule Ceph creates for replicated pools: one device under each `failure_domain`.
    pub fn add_replicated_rule(
        &mut self,
        name: &str,
        root: i32,
        failure_domain: &str,
    ) -> Result<i32, CrushError> {
        let type_id = self.map.type_id(failure_domain).ok_or_else(|| {
            CrushError::Invalid(format!("type '{failure_domain}' is not defined"))
        })?;
        let steps = vec![
            Step::Take { item: root },
            if type_id == 0 {
                Step::ChooseFirstN { num: 0, type_id }
            } else {
                Step::ChooseLeafFirstN { num: 0, type_id }
            },
            Step::Emit,
        ];
        self.add_rule(name, crate::map::RULE_TYPE_REPLICATED, steps)
    }

    /// Finishes the map: builds the per-class shadow trees and computes `max_devices`.
    pub fn build(mut self) -> CrushMap {
        let _ = crate::classes::populate_classes(&mut self.map, &std::collections::BTreeMap::new());
        self.map.finalize();
        self.map
    }
}
