//! Lane-parallel batch mapping: sixteen inputs are mapped at once.
//!
//! Mapping one input is a chain of straw2 choices, each a long dependency chain (hash,
//! log, divide) with little else to overlap. Here sixteen inputs ("lanes") advance together:
//! every step, each unfinished lane asks for one straw2 choice (its own bucket, x and r),
//! the sixteen choices are computed together by a step engine, and then each lane's state
//! machine (Ceph's
//! `crush_choose_firstn` or `crush_choose_indep`, including collisions, retries,
//! `chooseleaf` recursion, reweights, `vary_r`, `stable`, and indep's positional holes)
//! consumes its answer. A finished lane takes the next input.
//!
//! Scope: rules of the form `[set_*]* take B; choose|chooseleaf firstn|indep N type T; emit`
//! over straw2 buckets with `choose_local_tries` and `choose_local_fallback_tries` 0 (the
//! replicated rules of any current Ceph cluster). [`Plan::new`] returns `None` otherwise
//! and callers fall back to the per-input engines.
//!
//! Step engines: [`step_portable`] computes the eight choices with plain integer code
//! written as eight independent chains (the rjenkins hash is a ~35 ns dependency chain;
//! eight side by side keep the CPU busy), exactly as Ceph does; `simd::step_avx2` uses
//! 256-bit vectors and f64 draws with an exact re-check of near ties.

use crate::map::{BucketAlg, CrushMap, Step, ITEM_NONE, ITEM_UNDEF};
use crate::mapper::is_out;

pub(crate) const LANES: usize = 16;
/// Largest result size handled here (larger requests use the other engines).
pub(crate) const MAX_REP: usize = 32;

/// A rule compiled for lane-parallel mapping, with the map flattened for gathers.
pub(crate) struct Plan {
    pub(crate) root_index: usize,
    numrep: i32,
    type_id: i32,
    leaf: bool,
    /// `indep` (positional, erasure-coded pools) rather than `firstn`.
    indep: bool,
    tries: u32,
    recurse_tries: u32,
    vary_r: u32,
    stable: bool,
    /// All straw2 buckets' items and weights back to back; bucket index -> (offset, size).
    pub(crate) flat_items: Vec<i32>,
    pub(crate) flat_weights: Vec<u32>,
    pub(crate) spans: Vec<(u32, u32)>,
    /// Bucket index -> type id (-1 if missing).
    bucket_types: Vec<i32>,
}

impl Plan {
    pub(crate) fn new(map: &CrushMap, rule_id: i32, result_max: usize) -> Option<Plan> {
        if result_max == 0 || result_max > MAX_REP || map.validate().is_err() {
            return None;
        }
        let rule = map.rule(rule_id)?;
        let t = &map.tunables;
        let mut choose_tries = t.choose_total_tries as i32 + 1;
        let mut choose_leaf_tries = 0i32;
        let mut local = t.choose_local_tries as i32;
        let mut fallback = t.choose_local_fallback_tries as i32;
        let mut vary_r = i32::from(t.chooseleaf_vary_r);
        let mut stable = i32::from(t.chooseleaf_stable);
        let mut take = None;
        let mut choose = None;
        let mut emitted = false;
        let mut indep = false;
        for step in &rule.steps {
            if emitted {
                return None;
            }
            match *step {
                Step::SetChooseTries(v) if take.is_none() => {
                    choose_tries = if v > 0 { v } else { choose_tries }
                }
                Step::SetChooseLeafTries(v) if take.is_none() => {
                    choose_leaf_tries = if v > 0 { v } else { choose_leaf_tries }
                }
                Step::SetChooseLocalTries(v) if take.is_none() => {
                    local = if v >= 0 { v } else { local }
                }
                Step::SetChooseLocalFallbackTries(v) if take.is_none() => {
                    fallback = if v >= 0 { v } else { fallback }
                }
                Step::SetChooseLeafVaryR(v) if take.is_none() => {
                    vary_r = if v >= 0 { v } else { vary_r }
                }
                Step::SetChooseLeafStable(v) if take.is_none() => {
                    stable = if v >= 0 { v } else { stable }
                }
                Step::Take { item } if take.is_none() => take = Some(item),
                Step::ChooseFirstN { num, type_id } if take.is_some() && choose.is_none() => {
                    choose = Some((num, type_id, false))
                }
                Step::ChooseLeafFirstN { num, type_id } if take.is_some() && choose.is_none() => {
                    choose = Some((num, type_id, true))
                }
                Step::ChooseIndep { num, type_id } if take.is_some() && choose.is_none() => {
                    indep = true;
                    choose = Some((num, type_id, false))
                }
                Step::ChooseLeafIndep { num, type_id } if take.is_some() && choose.is_none() => {
                    indep = true;
                    choose = Some((num, type_id, true))
                }
                Step::Emit if choose.is_some() => emitted = true,
                _ => return None,
            }
        }
        if !emitted || local != 0 || fallback != 0 {
            return None;
        }
        let (num, type_id, leaf) = choose?;
        let root = take?;
        let root_bucket = map.bucket(root)?;
        let numrep = if num <= 0 {
            num + result_max as i32
        } else {
            num
        };
        if numrep <= 0 {
            return None;
        }
        let mut spans = vec![(0u32, 0u32); map.buckets.len()];
        let mut bucket_types = vec![-1i32; map.buckets.len()];
        let mut flat_items = Vec::new();
        let mut flat_weights = Vec::new();
        for (index, bucket) in map.buckets.iter().enumerate() {
            let Some(b) = bucket else { continue };
            if b.alg != BucketAlg::Straw2 || b.item_weights.len() != b.items.len() {
                return None;
            }
            spans[index] = (flat_items.len() as u32, b.size() as u32);
            bucket_types[index] = i32::from(b.type_id);
            flat_items.extend_from_slice(&b.items);
            flat_weights.extend_from_slice(&b.item_weights);
        }
        // Padding so a masked-off gather never indexes past the end.
        flat_items.push(0);
        flat_weights.push(0);
        let recurse_tries = if indep {
            // crush_do_rule: indep leaf searches get chooseleaf_tries, or 1.
            if choose_leaf_tries != 0 {
                choose_leaf_tries
            } else {
                1
            }
        } else if choose_leaf_tries != 0 {
            choose_leaf_tries
        } else if t.chooseleaf_descend_once != 0 {
            1
        } else {
            choose_tries
        };
        Some(Plan {
            root_index: (-1 - i64::from(root_bucket.id)) as usize,
            numrep,
            type_id,
            leaf,
            indep,
            tries: choose_tries as u32,
            recurse_tries: recurse_tries as u32,
            vary_r: vary_r as u32,
            stable: stable != 0,
            flat_items,
            flat_weights,
            spans,
            bucket_types,
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Descending from the take bucket toward an item of the wanted type.
    Outer,
    /// Inside `chooseleaf`: descending from the chosen bucket toward a device.
    Leaf,
    Idle,
}

#[derive(Clone, Copy)]
struct Lane {
    phase: Phase,
    input: usize,
    x: i32,
    /// Bucket index the next choice is made in.
    bucket: usize,
    rep: i32,
    outpos: usize,
    count: usize,
    ftotal: u32,
    /// The outer item (a bucket) chosen while the leaf search runs.
    outer_item: i32,
    /// `rep + parent_r` base of the leaf search (Ceph: `stable ? 0 : outpos`, plus sub_r).
    leaf_r_base: i32,
    leaf_ftotal: u32,
    /// r advances by `stride * ftotal` (1 for firstn, numrep for indep).
    stride: i32,
    out: [i32; MAX_REP],
    out2: [i32; MAX_REP],
}

impl Lane {
    const IDLE: Lane = Lane {
        phase: Phase::Idle,
        input: 0,
        x: 0,
        bucket: 0,
        rep: 0,
        outpos: 0,
        count: 0,
        ftotal: 0,
        outer_item: 0,
        leaf_r_base: 0,
        leaf_ftotal: 0,
        stride: 1,
        out: [0; MAX_REP],
        out2: [0; MAX_REP],
    };

    /// The r of the choice this lane asks for next.
    fn r(&self) -> i32 {
        match self.phase {
            Phase::Leaf => self
                .leaf_r_base
                .wrapping_add(self.stride.wrapping_mul(self.leaf_ftotal as i32)),
            _ => self
                .rep
                .wrapping_add(self.stride.wrapping_mul(self.ftotal as i32)),
        }
    }
}

struct Driver<'a> {
    map: &'a CrushMap,
    plan: &'a Plan,
    weights: &'a [u32],
}

impl Driver<'_> {
    fn bucket_index(item: i32) -> usize {
        (-1 - i64::from(item)) as usize
    }

    /// Type of an item: 0 for devices, the bucket's type, or `None` for a dangling id.
    fn item_type(&self, item: i32) -> Option<i32> {
        if item >= 0 {
            Some(0)
        } else if self.bucket_exists(item) {
            Some(self.plan.bucket_types[Self::bucket_index(item)])
        } else {
            None
        }
    }

    fn bucket_exists(&self, item: i32) -> bool {
        item < 0
            && self
                .plan
                .bucket_types
                .get(Self::bucket_index(item))
                .is_some_and(|&t| t >= 0)
    }

    /// Starts input `x` in `lane`.
    fn start(&self, lane: &mut Lane, input: usize, x: i32, result_max: usize) {
        if self.plan.indep {
            self.start_indep(lane, input, x, result_max);
            return;
        }
        lane.stride = 1;
        lane.phase = Phase::Outer;
        lane.input = input;
        lane.x = x;
        lane.rep = 0;
        lane.outpos = 0;
        lane.count = result_max;
        self.begin_rep(lane);
    }

    /// Begins repetition `lane.rep`, or finishes the lane.
    fn begin_rep(&self, lane: &mut Lane) {
        if lane.rep >= self.plan.numrep || lane.count == 0 {
            lane.phase = Phase::Idle;
            return;
        }
        lane.ftotal = 0;
        self.begin_descent(lane);
    }

    fn begin_descent(&self, lane: &mut Lane) {
        lane.phase = Phase::Outer;
        lane.bucket = self.plan.root_index;
        self.skip_empty(lane);
    }

    /// An empty bucket rejects without a choice (Ceph: `in->size == 0`).
    fn skip_empty(&self, lane: &mut Lane) {
        loop {
            if lane.phase == Phase::Idle || self.plan.spans[lane.bucket].1 != 0 {
                return;
            }
            match lane.phase {
                Phase::Outer => {
                    if !self.outer_reject(lane) {
                        return;
                    }
                }
                Phase::Leaf => {
                    if !self.leaf_reject(lane) {
                        return;
                    }
                }
                Phase::Idle => return,
            }
        }
    }

    /// Outer reject or collision: retry the descent or give up this repetition. Returns
    /// true when a new choice was set up (the caller re-checks for empty buckets).
    fn outer_reject(&self, lane: &mut Lane) -> bool {
        lane.ftotal += 1;
        if lane.ftotal < self.plan.tries {
            lane.phase = Phase::Outer;
            lane.bucket = self.plan.root_index;
        } else {
            lane.rep += 1;
            self.begin_rep_inner(lane);
        }
        true
    }

    fn begin_rep_inner(&self, lane: &mut Lane) {
        if lane.rep >= self.plan.numrep || lane.count == 0 {
            lane.phase = Phase::Idle;
            return;
        }
        lane.ftotal = 0;
        lane.phase = Phase::Outer;
        lane.bucket = self.plan.root_index;
    }

    /// A failed leaf attempt: retry inside the leaf bucket, or fail the leaf search (which
    /// rejects the outer choice).
    fn leaf_reject(&self, lane: &mut Lane) -> bool {
        lane.leaf_ftotal += 1;
        if lane.leaf_ftotal < self.plan.recurse_tries {
            lane.bucket = Self::bucket_index(lane.outer_item);
        } else {
            self.outer_reject(lane);
        }
        true
    }

    fn accept_outer(&self, lane: &mut Lane, item: i32) {
        lane.out[lane.outpos] = item;
        lane.outpos += 1;
        lane.count -= 1;
        lane.rep += 1;
        self.begin_rep_inner(lane);
    }

    /// Consumes the choice `item` made for `lane`.
    fn advance(&self, lane: &mut Lane, item: i32) {
        if self.plan.indep {
            self.advance_indep(lane, item);
            return;
        }
        let map = self.map;
        match lane.phase {
            Phase::Outer => {
                if item >= map.max_devices {
                    lane.rep += 1; // bad item: skip this repetition
                    self.begin_rep_inner(lane);
                } else {
                    let itemtype = self.item_type(item);
                    match itemtype {
                        None => {
                            lane.rep += 1;
                            self.begin_rep_inner(lane);
                        }
                        Some(t) if t != self.plan.type_id => {
                            if item >= 0 {
                                lane.rep += 1;
                                self.begin_rep_inner(lane);
                            } else {
                                lane.bucket = Self::bucket_index(item);
                            }
                        }
                        Some(t) => {
                            let collide = lane.out[..lane.outpos].contains(&item);
                            if collide {
                                self.outer_reject(lane);
                            } else if self.plan.leaf && item < 0 {
                                // chooseleaf: one repetition of a firstn search for a
                                // device under `item`, with its own retry budget.
                                let r = lane.rep.wrapping_add(lane.ftotal as i32);
                                let sub_r = if self.plan.vary_r != 0 {
                                    r.checked_shr(self.plan.vary_r - 1).unwrap_or(0)
                                } else {
                                    0
                                };
                                let leaf_rep = if self.plan.stable {
                                    0
                                } else {
                                    lane.outpos as i32
                                };
                                lane.outer_item = item;
                                lane.leaf_r_base = leaf_rep.wrapping_add(sub_r);
                                lane.leaf_ftotal = 0;
                                lane.phase = Phase::Leaf;
                                lane.bucket = Self::bucket_index(item);
                                if self.plan.recurse_tries == 0 {
                                    self.outer_reject(lane);
                                }
                            } else {
                                if self.plan.leaf {
                                    lane.out2[lane.outpos] = item; // already a leaf
                                }
                                if t == 0 && is_out(self.weights, item, lane.x) {
                                    self.outer_reject(lane);
                                } else {
                                    self.accept_outer(lane, item);
                                }
                            }
                        }
                    }
                }
            }
            Phase::Leaf => {
                if item >= map.max_devices {
                    // The leaf search skips its only repetition: no leaf found.
                    self.outer_reject(lane);
                } else if item < 0 {
                    if self.bucket_exists(item) {
                        lane.bucket = Self::bucket_index(item); // keep descending
                    } else {
                        self.outer_reject(lane);
                    }
                } else {
                    let collide = lane.out2[..lane.outpos].contains(&item);
                    if collide || is_out(self.weights, item, lane.x) {
                        self.leaf_reject(lane);
                    } else {
                        lane.out2[lane.outpos] = item;
                        let outer = lane.outer_item;
                        lane.phase = Phase::Outer;
                        self.accept_outer(lane, outer);
                    }
                }
            }
            Phase::Idle => {}
        }
        if lane.phase != Phase::Idle {
            self.skip_empty(lane);
        }
    }

    // ---- indep (Ceph's crush_choose_indep): rounds over ftotal, positions in order ----

    fn start_indep(&self, lane: &mut Lane, input: usize, x: i32, result_max: usize) {
        let out_size = (self.plan.numrep as usize).min(result_max);
        lane.input = input;
        lane.x = x;
        lane.stride = self.plan.numrep;
        lane.outpos = out_size; // fixed width: every position is returned
        lane.count = out_size; // "left": positions still undecided
        lane.out[..out_size].fill(ITEM_UNDEF);
        lane.out2[..out_size].fill(ITEM_UNDEF);
        lane.ftotal = 0;
        lane.rep = -1;
        self.next_position(lane);
    }

    /// Moves to the next undecided position of this round, or to the next round, or
    /// finishes the lane (holes become ITEM_NONE).
    fn next_position(&self, lane: &mut Lane) {
        let out_size = lane.outpos;
        loop {
            if lane.count == 0 || lane.ftotal >= self.plan.tries {
                for slot in 0..out_size {
                    if lane.out[slot] == ITEM_UNDEF {
                        lane.out[slot] = ITEM_NONE;
                    }
                    if lane.out2[slot] == ITEM_UNDEF {
                        lane.out2[slot] = ITEM_NONE;
                    }
                }
                lane.phase = Phase::Idle;
                return;
            }
            lane.rep += 1;
            if lane.rep as usize >= out_size {
                lane.ftotal += 1;
                lane.rep = -1;
                continue;
            }
            if lane.out[lane.rep as usize] != ITEM_UNDEF {
                continue;
            }
            lane.phase = Phase::Outer;
            lane.bucket = self.plan.root_index;
            if self.plan.spans[lane.bucket].1 == 0 {
                continue; // empty bucket: this position fails this round
            }
            return;
        }
    }

    /// The position gets a hole for good.
    fn indep_none(&self, lane: &mut Lane) {
        let rep = lane.rep as usize;
        lane.out[rep] = ITEM_NONE;
        if self.plan.leaf {
            lane.out2[rep] = ITEM_NONE;
        }
        lane.count -= 1;
        self.next_position(lane);
    }

    /// A leaf attempt failed: retry inside the chosen bucket or give up for this round.
    fn indep_leaf_retry(&self, lane: &mut Lane) {
        lane.leaf_ftotal += 1;
        let child = Self::bucket_index(lane.outer_item);
        if lane.leaf_ftotal < self.plan.recurse_tries && self.plan.spans[child].1 != 0 {
            lane.bucket = child;
        } else if lane.leaf_ftotal < self.plan.recurse_tries {
            self.indep_leaf_retry(lane); // empty bucket: that attempt fails too
        } else {
            // The leaf search placed nothing: out2 becomes NONE, the outer position
            // stays undecided for the next round.
            lane.out2[lane.rep as usize] = ITEM_NONE;
            self.next_position(lane);
        }
    }

    fn advance_indep(&self, lane: &mut Lane, item: i32) {
        let rep = lane.rep as usize;
        match lane.phase {
            Phase::Outer => {
                if item >= self.map.max_devices {
                    return self.indep_none(lane);
                }
                let itemtype = self.item_type(item);
                let Some(t) = itemtype else {
                    return self.indep_none(lane);
                };
                if t != self.plan.type_id {
                    if item >= 0 {
                        return self.indep_none(lane);
                    }
                    lane.bucket = Self::bucket_index(item);
                    if self.plan.spans[lane.bucket].1 == 0 {
                        self.next_position(lane);
                    }
                    return;
                }
                if lane.out[..lane.outpos].contains(&item) {
                    return self.next_position(lane); // collision: retried next round
                }
                if self.plan.leaf {
                    if item < 0 {
                        lane.out2[rep] = ITEM_UNDEF;
                        lane.outer_item = item;
                        lane.leaf_r_base = lane.r();
                        lane.leaf_r_base = (rep as i32).wrapping_add(lane.leaf_r_base);
                        lane.leaf_ftotal = 0;
                        lane.phase = Phase::Leaf;
                        lane.bucket = Self::bucket_index(item);
                        if self.plan.recurse_tries == 0 {
                            lane.out2[rep] = ITEM_NONE;
                            return self.next_position(lane);
                        }
                        if self.plan.spans[lane.bucket].1 == 0 {
                            lane.leaf_ftotal = 0;
                            self.indep_leaf_retry(lane);
                        }
                        return;
                    }
                    lane.out2[rep] = item;
                }
                if t == 0 && is_out(self.weights, item, lane.x) {
                    return self.next_position(lane);
                }
                lane.out[rep] = item;
                lane.count -= 1;
                self.next_position(lane);
            }
            Phase::Leaf => {
                if item >= self.map.max_devices {
                    lane.out2[rep] = ITEM_NONE;
                    return self.next_position(lane);
                }
                if item < 0 {
                    if !self.bucket_exists(item) {
                        lane.out2[rep] = ITEM_NONE;
                        return self.next_position(lane);
                    }
                    lane.bucket = Self::bucket_index(item);
                    if self.plan.spans[lane.bucket].1 == 0 {
                        self.indep_leaf_retry(lane);
                    }
                    return;
                }
                if is_out(self.weights, item, lane.x) {
                    return self.indep_leaf_retry(lane);
                }
                lane.out2[rep] = item;
                lane.out[rep] = lane.outer_item;
                lane.count -= 1;
                self.next_position(lane);
            }
            Phase::Idle => {}
        }
    }
}

/// One lane's request for a straw2 choice: bucket index, x and r.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Request {
    pub(crate) active: bool,
    pub(crate) bucket: usize,
    pub(crate) x: i32,
    pub(crate) r: i32,
}

/// Maps `inputs` with `plan`, calling `step` once per round for the eight lanes' straw2
/// choices. Rows of `num_rep` items go to `items`, their lengths to `lens`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn map_lanes(
    map: &CrushMap,
    plan: &Plan,
    inputs: &[i32],
    num_rep: usize,
    weights: &[u32],
    items: &mut [i32],
    lens: &mut [u8],
    mut step: impl FnMut(&Plan, &[Request; LANES]) -> [i32; LANES],
) {
    let driver = Driver { map, plan, weights };
    let mut lanes = [Lane::IDLE; LANES];
    let mut next = 0usize;
    let finish = |lane: &Lane, items: &mut [i32], lens: &mut [u8]| {
        let row = &mut items[lane.input * num_rep..(lane.input + 1) * num_rep];
        let src = if plan.leaf { &lane.out2 } else { &lane.out };
        let n = lane.outpos.min(num_rep);
        row[..n].copy_from_slice(&src[..n]);
        lens[lane.input] = n as u8;
    };
    for lane in lanes.iter_mut() {
        while next < inputs.len() && lane.phase == Phase::Idle {
            driver.start(lane, next, inputs[next], num_rep);
            if lane.phase == Phase::Idle {
                finish(lane, items, lens);
            }
            next += 1;
        }
    }
    loop {
        let mut requests = [Request::default(); LANES];
        let mut any = false;
        for (request, lane) in requests.iter_mut().zip(&lanes) {
            if lane.phase != Phase::Idle {
                *request = Request {
                    active: true,
                    bucket: lane.bucket,
                    x: lane.x,
                    r: lane.r(),
                };
                any = true;
            }
        }
        if !any {
            break;
        }
        let chosen = step(plan, &requests);
        for (l, lane) in lanes.iter_mut().enumerate() {
            if !requests[l].active {
                continue;
            }
            driver.advance(lane, chosen[l]);
            while lane.phase == Phase::Idle {
                finish(lane, items, lens);
                if next >= inputs.len() {
                    break;
                }
                driver.start(lane, next, inputs[next], num_rep);
                next += 1;
            }
        }
    }
}

/// The portable step: eight exact straw2 choices with integer arithmetic, hashes computed
/// as eight interleaved chains. Bit-identical to `mapper::straw2_choose`.
pub(crate) fn step_portable(plan: &Plan, requests: &[Request; LANES]) -> [i32; LANES] {
    let mut offsets = [0usize; LANES];
    let mut sizes = [0usize; LANES];
    let mut xs = [0u32; LANES];
    let mut rs = [0u32; LANES];
    let mut max_size = 0;
    for (l, req) in requests.iter().enumerate() {
        if req.active {
            let (offset, size) = plan.spans[req.bucket];
            offsets[l] = offset as usize;
            sizes[l] = size as usize;
            xs[l] = req.x as u32;
            rs[l] = req.r as u32;
            max_size = max_size.max(size as usize);
        }
    }
    let pad = plan.flat_items.len() - 1;
    // Exact `crush_ln(u) - 2^48` for every u: one load instead of the normalization and
    // three small-table lookups (measured ~15 % faster here with the 2 MiB L2).
    let ln_table = crate::ln::ln_minus_one_table();
    let mut best = [i64::MIN; LANES];
    let mut best_index = [0usize; LANES];
    for i in 0..max_size {
        let mut items = [0u32; LANES];
        let mut weights = [0u32; LANES];
        for l in 0..LANES {
            let index = if i < sizes[l] { offsets[l] + i } else { pad };
            items[l] = plan.flat_items[index] as u32;
            weights[l] = plan.flat_weights[index];
        }
        let mut hashes = [0u32; LANES];
        for g in 0..LANES / 8 {
            let part =
                |a: &[u32; LANES]| -> [u32; 8] { a[8 * g..8 * g + 8].try_into().expect("8 lanes") };
            hashes[8 * g..8 * g + 8].copy_from_slice(&crate::hash::hash32_3_lanes(
                part(&xs),
                part(&items),
                part(&rs),
            ));
        }
        for l in 0..LANES {
            let w = weights[l];
            let draw = if w == 0 {
                i64::MIN
            } else {
                ln_table[(hashes[l] & 0xffff) as usize] / i64::from(w)
            };
            // Ceph: the first strictly greater draw wins; padding has weight 0 (i64::MIN).
            if draw > best[l] {
                best[l] = draw;
                best_index[l] = i;
            }
        }
    }
    let mut chosen = [0i32; LANES];
    for l in 0..LANES {
        if requests[l].active && sizes[l] > 0 {
            chosen[l] = plan.flat_items[offsets[l] + best_index[l]];
        }
    }
    chosen
}
