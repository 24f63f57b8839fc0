//! Device classes: per-class "shadow" copies of the hierarchy, built as Ceph's
//! `CrushWrapper::populate_classes` / `device_class_clone` build them, so that shadow
//! bucket ids, weights and therefore mappings of `step take <root> class <c>` match.
//!
//! Invariant: a shadow bucket `<name>~<class>` contains, in the original item order, the
//! devices of that class and the shadow copies of child buckets (even empty ones).

use std::collections::{BTreeMap, BTreeSet};

use crate::builder::{add_bucket, make_bucket};
use crate::error::CrushError;
use crate::map::{BucketAlg, CrushMap};

/// Builds the shadow trees of every class under every non-shadow root. `preset` gives
/// shadow ids to reuse (from `id -N class C` lines of a text map).
///
/// Like Ceph, the pass stops at the first bucket that cannot be cloned (a uniform bucket
/// with weighted items); shadows built before it stay. The text compiler ignores that
/// error as `crushtool -c` does, and a rule that needs a missing shadow then fails.
pub fn populate_classes(
    map: &mut CrushMap,
    preset: &BTreeMap<i32, BTreeMap<i32, i32>>,
) -> Result<(), CrushError> {
    let used_ids: BTreeSet<i32> = preset.values().flat_map(|m| m.values().copied()).collect();
    let mut children = BTreeSet::new();
    for bucket in map.buckets.iter().flatten() {
        children.extend(bucket.items.iter().copied().filter(|&i| i < 0));
    }
    let roots: Vec<i32> = map
        .buckets
        .iter()
        .flatten()
        .map(|b| b.id)
        .filter(|id| !children.contains(id) && !map.is_shadow(*id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let classes: Vec<i32> = map.class_names.keys().copied().collect();
    for root in roots {
        for &class in &classes {
            clone_for_class(map, root, class, preset, &used_ids)?;
        }
    }
    Ok(())
}

fn clone_for_class(
    map: &mut CrushMap,
    original_id: i32,
    class: i32,
    preset: &BTreeMap<i32, BTreeMap<i32, i32>>,
    used_ids: &BTreeSet<i32>,
) -> Result<i32, CrushError> {
    let item_name = map
        .item_names
        .get(&original_id)
        .cloned()
        .ok_or_else(|| CrushError::Invalid(format!("bucket {original_id} has no name")))?;
    let class_name = map
        .class_names
        .get(&class)
        .cloned()
        .ok_or_else(|| CrushError::Invalid(format!("class {class} has no name")))?;
    let copy_name = format!("{item_name}~{class_name}");
    if let Some(existing) = map.item_id(&copy_name) {
        return Ok(existing);
    }
    let original = map
        .bucket(original_id)
        .cloned()
        .ok_or_else(|| CrushError::Invalid(format!("bucket {original_id} does not exist")))?;
    let mut items = Vec::new();
    let mut weights = Vec::new();
    for (pos, &item) in original.items.iter().enumerate() {
        if item >= 0 {
            if map.class_map.get(&item) == Some(&class) {
                items.push(item);
                weights.push(item_weight_at(&original, pos));
            }
        } else {
            let child = clone_for_class(map, item, class, preset, used_ids)?;
            let child_weight = map.bucket(child).map_or(0, |b| b.weight);
            items.push(child);
            weights.push(child_weight);
        }
        if original.alg == BucketAlg::Uniform && weights.last().is_some_and(|&w| w != 0) {
            // Ceph creates the shadow uniform bucket with item weight 0 and adds items one
            // by one; it refuses the first item whose weight differs, so the clone (and the
            // rest of the pass) fails right there, after the children cloned so far.
            return Err(CrushError::Invalid(format!(
                "cannot build the '{class_name}' shadow of uniform bucket '{item_name}'"
            )));
        }
    }
    let mut bucket = make_bucket(
        original.alg,
        original.hash,
        original.type_id,
        &items,
        &weights,
        map.tunables.straw_calc_version,
    )?;
    if original.alg == BucketAlg::Uniform {
        // Ceph grows shadow uniform buckets item by item: the weight is the sum and the
        // per-item weight stays 0.
        bucket.weight = weights.iter().fold(0u32, |a, &w| a.wrapping_add(w));
        bucket.item_weights = vec![0; items.len()];
    }
    let bno = match preset.get(&original_id).and_then(|m| m.get(&class)) {
        Some(&id) => id,
        None => {
            let mut bno = -1i32;
            while map.bucket(bno).is_some() || used_ids.contains(&bno) {
                bno -= 1;
            }
            bno
        }
    };
    let id = add_bucket(map, bno, bucket)?;
    map.class_map.insert(id, class);
    map.item_names.insert(id, copy_name);
    map.class_bucket
        .entry(original_id)
        .or_default()
        .insert(class, id);
    Ok(id)
}

/// Weight of the item at `pos` as Ceph's `crush_get_bucket_item_weight` reports it.
pub fn item_weight_at(bucket: &crate::map::Bucket, pos: usize) -> u32 {
    match bucket.alg {
        BucketAlg::Tree => bucket
            .node_weights
            .get(crate::builder::tree_leaf_node(pos))
            .copied()
            .unwrap_or(0),
        _ => bucket.item_weights.get(pos).copied().unwrap_or(0),
    }
}
