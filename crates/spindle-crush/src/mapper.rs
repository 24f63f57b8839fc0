//! The CRUSH mapping algorithm (`crush_do_rule`), bit-compatible with Ceph 16.
//!
//! Invariants:
//! - results equal Ceph's for the same map, rule, input, result size and reweights
//!   (tested against `crushtool` on the public vectors and on random maps);
//! - no allocation per mapping in steady state: callers reuse a [`Workspace`];
//! - a malformed map (dangling bucket references, empty buckets) never panics here: the
//!   affected replica is skipped or left as a hole, as Ceph does.

use crate::hash::{hash32_2, hash32_3, hash32_4};
use crate::map::{
    Bucket, BucketAlg, CrushMap, Step, ITEM_NONE, ITEM_UNDEF, MAX_DEPTH, MAX_RESULT, MAX_TRIES,
    WEIGHT_ONE,
};

/// Per-bucket state of the lazily computed permutation (uniform buckets and the legacy
/// local fallback search), valid for one `do_rule` call (`generation`).
#[derive(Debug, Clone, Default)]
struct PermState {
    generation: u64,
    perm_x: u32,
    perm_n: u32,
    perm: Vec<u32>,
}

/// Reusable scratch memory for mapping: keep one per thread and pass it to every call.
#[derive(Debug, Clone, Default)]
pub struct Workspace {
    scratch: Vec<i32>,
    perms: Vec<PermState>,
    generation: u64,
}

impl Workspace {
    pub fn new() -> Self {
        Workspace::default()
    }

    fn begin(&mut self, map: &CrushMap, result_max: usize) {
        self.generation += 1;
        if self.perms.len() < map.buckets.len() {
            self.perms.resize(map.buckets.len(), PermState::default());
        }
        if self.scratch.len() < 3 * result_max {
            self.scratch.resize(3 * result_max, 0);
        }
    }
}

/// Implementation of the straw2 draw used by a mapping (results are identical).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Straw2Engine {
    Scalar,
    /// Only constructed after runtime detection of AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

struct Ctx<'a> {
    map: &'a CrushMap,
    straw2: Straw2Engine,
    weights: &'a [u32],
    perms: &'a mut [PermState],
    generation: u64,
}

/// Maps input `x` through rule `rule_id` into at most `result_max` items (clamped to
/// [`MAX_RESULT`]), writing them to
/// `result` (cleared first). `weights` are per-device reweights in 16.16 (0 = out,
/// 0x10000 = in); devices past its end count as out. Returns the number of items; for
/// `indep` rules unfilled slots hold [`ITEM_NONE`]. A missing rule gives an empty result.
pub fn do_rule(
    map: &CrushMap,
    rule_id: i32,
    x: i32,
    result: &mut Vec<i32>,
    result_max: usize,
    weights: &[u32],
    workspace: &mut Workspace,
) -> usize {
    do_rule_with(
        map,
        rule_id,
        x,
        result,
        result_max,
        weights,
        workspace,
        Straw2Engine::Scalar,
    )
}

/// [`do_rule`] with a chosen straw2 engine (see [`crate::batch`]).
#[allow(clippy::too_many_arguments)]
pub fn do_rule_with(
    map: &CrushMap,
    rule_id: i32,
    x: i32,
    result: &mut Vec<i32>,
    result_max: usize,
    weights: &[u32],
    workspace: &mut Workspace,
    straw2: Straw2Engine,
) -> usize {
    result.clear();
    let Some(rule) = map.rule(rule_id) else {
        return 0;
    };
    if result_max == 0 {
        return 0;
    }
    let result_max = result_max.min(MAX_RESULT);
    workspace.begin(map, result_max);
    let generation = workspace.generation;
    let (a, rest) = workspace.scratch.split_at_mut(result_max);
    let (b, rest) = rest.split_at_mut(result_max);
    let c = &mut rest[..result_max];
    let mut ctx = Ctx {
        map,
        straw2,
        weights,
        perms: &mut workspace.perms,
        generation,
    };

    let tunables = &map.tunables;
    // The original choose_total_tries counted retries, not tries: add one.
    // Tries are clamped to MAX_TRIES even for maps built without validation, so that no
    // map can make a mapping run (practically) forever.
    let clamp = |v: i32| v.clamp(0, MAX_TRIES as i32);
    let mut choose_tries = clamp(tunables.choose_total_tries.min(MAX_TRIES) as i32 + 1);
    let mut choose_leaf_tries = 0i32;
    let mut choose_local_retries = clamp(tunables.choose_local_tries.min(MAX_TRIES) as i32);
    let mut choose_local_fallback_retries =
        clamp(tunables.choose_local_fallback_tries.min(MAX_TRIES) as i32);
    let mut vary_r = i32::from(tunables.chooseleaf_vary_r);
    let mut stable = i32::from(tunables.chooseleaf_stable);

    // `w` is the working set, `o` the output of the current step; they swap after each
    // choose step. `w_is_a` tells which scratch array holds `w`.
    let mut w_is_a = true;
    let mut wsize = 0usize;
    for step in &rule.steps {
        let (w, o): (&mut [i32], &mut [i32]) = if w_is_a {
            (&mut *a, &mut *b)
        } else {
            (&mut *b, &mut *a)
        };
        match *step {
            Step::Take { item } => {
                let valid_device = item >= 0 && item < map.max_devices;
                let valid_bucket = item < 0 && map.bucket(item).is_some();
                if valid_device || valid_bucket {
                    w[0] = item;
                    wsize = 1;
                }
            }
            Step::SetChooseTries(v) => {
                if v > 0 {
                    choose_tries = clamp(v);
                }
            }
            Step::SetChooseLeafTries(v) => {
                if v > 0 {
                    choose_leaf_tries = clamp(v);
                }
            }
            Step::SetChooseLocalTries(v) => {
                if v >= 0 {
                    choose_local_retries = clamp(v);
                }
            }
            Step::SetChooseLocalFallbackTries(v) => {
                if v >= 0 {
                    choose_local_fallback_retries = clamp(v);
                }
            }
            Step::SetChooseLeafVaryR(v) => {
                if v >= 0 {
                    vary_r = v;
                }
            }
            Step::SetChooseLeafStable(v) => {
                if v >= 0 {
                    stable = v;
                }
            }
            Step::ChooseFirstN { num, type_id }
            | Step::ChooseLeafFirstN { num, type_id }
            | Step::ChooseIndep { num, type_id }
            | Step::ChooseLeafIndep { num, type_id } => {
                if wsize == 0 {
                    continue;
                }
                let firstn = matches!(
                    step,
                    Step::ChooseFirstN { .. } | Step::ChooseLeafFirstN { .. }
                );
                let recurse_to_leaf = matches!(
                    step,
                    Step::ChooseLeafFirstN { .. } | Step::ChooseLeafIndep { .. }
                );
                let mut osize = 0usize;
                for &w_item in w.iter().take(wsize) {
                    let mut numrep = num;
                    if numrep <= 0 {
                        numrep = numrep.saturating_add(result_max as i32);
                        if numrep <= 0 {
                            continue;
                        }
                    }
                    let Some(bucket) = map.bucket(w_item) else {
                        continue; // probably ITEM_NONE from an indep step
                    };
                    if firstn {
                        let recurse_tries = if choose_leaf_tries != 0 {
                            choose_leaf_tries
                        } else if tunables.chooseleaf_descend_once != 0 {
                            1
                        } else {
                            choose_tries
                        };
                        let params = FirstNParams {
                            tries: choose_tries as u32,
                            recurse_tries: recurse_tries as u32,
                            local_retries: choose_local_retries as u32,
                            local_fallback_retries: choose_local_fallback_retries as u32,
                            vary_r: vary_r as u32,
                            stable: stable as u32,
                        };
                        let got = choose_firstn(
                            &mut ctx,
                            bucket,
                            x,
                            numrep,
                            type_id,
                            &mut o[osize..],
                            0,
                            result_max - osize,
                            &params,
                            recurse_to_leaf,
                            if recurse_to_leaf {
                                Some(&mut c[osize..])
                            } else {
                                None
                            },
                            0,
                        );
                        osize += got;
                    } else {
                        let out_size = (numrep as usize).min(result_max - osize);
                        choose_indep(
                            &mut ctx,
                            bucket,
                            x,
                            out_size,
                            numrep,
                            type_id,
                            &mut o[osize..],
                            0,
                            choose_tries as u32,
                            if choose_leaf_tries != 0 {
                                choose_leaf_tries as u32
                            } else {
                                1
                            },
                            recurse_to_leaf,
                            if recurse_to_leaf {
                                Some(&mut c[osize..])
                            } else {
                                None
                            },
                            0,
                        );
                        osize += out_size;
                    }
                }
                if recurse_to_leaf {
                    o[..osize].copy_from_slice(&c[..osize]);
                }
                w_is_a = !w_is_a;
                wsize = osize;
            }
            Step::Emit => {
                for &item in &w[..wsize] {
                    if result.len() >= result_max {
                        break;
                    }
                    result.push(item);
                }
                wsize = 0;
            }
            Step::Noop => {}
        }
    }
    result.len()
}

struct FirstNParams {
    tries: u32,
    recurse_tries: u32,
    local_retries: u32,
    local_fallback_retries: u32,
    vary_r: u32,
    stable: u32,
}

/// Ceph's `is_out`: a device is rejected when its reweight is 0, or with probability
/// `1 - reweight` decided by a hash of (x, device).
#[inline]
pub(crate) fn is_out(weights: &[u32], item: i32, x: i32) -> bool {
    let Some(&weight) = weights.get(item as usize) else {
        return true;
    };
    if weight >= WEIGHT_ONE {
        return false;
    }
    if weight == 0 {
        return true;
    }
    (hash32_2(x as u32, item as u32) & 0xffff) >= weight
}

/// Type of an item: 0 for devices, the bucket's type otherwise; `None` for a dangling
/// bucket reference.
#[inline]
fn item_type(map: &CrushMap, item: i32) -> Option<i32> {
    if item >= 0 {
        Some(0)
    } else {
        map.bucket(item).map(|b| i32::from(b.type_id))
    }
}

#[allow(clippy::too_many_arguments)]
fn choose_firstn(
    ctx: &mut Ctx<'_>,
    bucket: &Bucket,
    x: i32,
    numrep: i32,
    type_id: i32,
    out: &mut [i32],
    mut outpos: usize,
    out_size: usize,
    params: &FirstNParams,
    recurse_to_leaf: bool,
    mut out2: Option<&mut [i32]>,
    parent_r: i32,
) -> usize {
    let map = ctx.map;
    let mut count = out_size;
    let mut rep: i32 = if params.stable != 0 { 0 } else { outpos as i32 };
    while rep < numrep && count > 0 {
        let mut ftotal: u32 = 0;
        let mut skip_rep = false;
        let mut item = 0i32;
        'descent: loop {
            let mut retry_descent = false;
            let mut in_bucket = bucket;
            let mut flocal: u32 = 0;
            let mut depth = 0usize;
            'bucket: loop {
                let mut collide = false;
                let mut retry_bucket = false;
                let r = rep.wrapping_add(parent_r).wrapping_add(ftotal as i32);
                let mut reject;
                'choose: {
                    if in_bucket.size() == 0 {
                        reject = true;
                        break 'choose;
                    }
                    item = if params.local_fallback_retries > 0
                        && flocal >= (in_bucket.size() as u32 >> 1)
                        && flocal > params.local_fallback_retries
                    {
                        perm_choose(ctx, in_bucket, x, r)
                    } else {
                        bucket_choose(ctx, in_bucket, x, r)
                    };
                    if item >= map.max_devices {
                        skip_rep = true;
                        break 'descent;
                    }
                    let Some(itemtype) = item_type(map, item) else {
                        skip_rep = true;
                        break 'descent;
                    };
                    if itemtype != type_id {
                        match map.bucket(item) {
                            Some(next) if item < 0 => {
                                in_bucket = next;
                                depth += 1;
                                if depth > MAX_DEPTH {
                                    skip_rep = true; // deeper than any valid map: treat as a bad item
                                    break 'descent;
                                }
                                continue 'bucket;
                            }
                            _ => {
                                skip_rep = true;
                                break 'descent;
                            }
                        }
                    }
                    collide = out[..outpos].contains(&item);
                    reject = false;
                    if !collide && recurse_to_leaf {
                        if item < 0 {
                            let sub_r = if params.vary_r != 0 {
                                r.checked_shr(params.vary_r - 1).unwrap_or(0)
                            } else {
                                0
                            };
                            let child = map.bucket(item).expect("checked above");
                            let leaf_out = out2.as_deref_mut().expect("chooseleaf has out2");
                            let sub_params = FirstNParams {
                                tries: params.recurse_tries,
                                recurse_tries: 0,
                                ..*params
                            };
                            let got = choose_firstn(
                                ctx,
                                child,
                                x,
                                if params.stable != 0 {
                                    1
                                } else {
                                    outpos as i32 + 1
                                },
                                0,
                                leaf_out,
                                outpos,
                                count,
                                &sub_params,
                                false,
                                None,
                                sub_r,
                            );
                            if got <= outpos {
                                reject = true; // no leaf found
                            }
                        } else if let Some(leaf_out) = out2.as_deref_mut() {
                            leaf_out[outpos] = item; // already a leaf
                        }
                    }
                    if !reject && itemtype == 0 {
                        reject = is_out(ctx.weights, item, x);
                    }
                }
                if reject || collide {
                    ftotal += 1;
                    flocal += 1;
                    let local_retry = collide && flocal <= params.local_retries;
                    let fallback_retry = params.local_fallback_retries > 0
                        && flocal <= in_bucket.size() as u32 + params.local_fallback_retries;
                    if local_retry || fallback_retry {
                        retry_bucket = true;
                    } else if ftotal < params.tries {
                        retry_descent = true;
                    } else {
                        skip_rep = true;
                    }
                }
                if !retry_bucket {
                    break;
                }
            }
            if !retry_descent {
                break;
            }
        }
        if !skip_rep {
            out[outpos] = item;
            outpos += 1;
            count -= 1;
        }
        rep += 1;
    }
    outpos
}

#[allow(clippy::too_many_arguments)]
fn choose_indep(
    ctx: &mut Ctx<'_>,
    bucket: &Bucket,
    x: i32,
    left: usize,
    numrep: i32,
    type_id: i32,
    out: &mut [i32],
    outpos: usize,
    tries: u32,
    recurse_tries: u32,
    recurse_to_leaf: bool,
    mut out2: Option<&mut [i32]>,
    parent_r: i32,
) {
    let map = ctx.map;
    let endpos = outpos + left;
    let mut left = left;
    for rep in outpos..endpos {
        out[rep] = ITEM_UNDEF;
        if let Some(o2) = out2.as_deref_mut() {
            o2[rep] = ITEM_UNDEF;
        }
    }
    let mut ftotal: u32 = 0;
    while left > 0 && ftotal < tries {
        for rep in outpos..endpos {
            if out[rep] != ITEM_UNDEF {
                continue;
            }
            let mut in_bucket = bucket;
            let mut depth = 0usize;
            loop {
                let mut r = (rep as i32).wrapping_add(parent_r);
                if in_bucket.alg == BucketAlg::Uniform && in_bucket.size() as i32 % numrep == 0 {
                    r = r.wrapping_add(numrep.wrapping_add(1).wrapping_mul(ftotal as i32));
                } else {
                    r = r.wrapping_add(numrep.wrapping_mul(ftotal as i32));
                }
                if in_bucket.size() == 0 {
                    break;
                }
                let item = bucket_choose(ctx, in_bucket, x, r);
                let bad = |out: &mut [i32], out2: &mut Option<&mut [i32]>| {
                    out[rep] = ITEM_NONE;
                    if let Some(o2) = out2.as_deref_mut() {
                        o2[rep] = ITEM_NONE;
                    }
                };
                if item >= map.max_devices {
                    bad(out, &mut out2);
                    left -= 1;
                    break;
                }
                let Some(itemtype) = item_type(map, item) else {
                    bad(out, &mut out2);
                    left -= 1;
                    break;
                };
                if itemtype != type_id {
                    match map.bucket(item) {
                        Some(next) if item < 0 => {
                            in_bucket = next;
                            depth += 1;
                            if depth > MAX_DEPTH {
                                bad(out, &mut out2); // deeper than any valid map: treat as a bad item
                                left -= 1;
                                break;
                            }
                            continue;
                        }
                        _ => {
                            bad(out, &mut out2);
                            left -= 1;
                            break;
                        }
                    }
                }
                if out[outpos..endpos].contains(&item) {
                    break; // collision
                }
                if recurse_to_leaf {
                    let leaf_out = out2.as_deref_mut().expect("chooseleaf has out2");
                    if item < 0 {
                        let child = map.bucket(item).expect("checked above");
                        choose_indep(
                            ctx,
                            child,
                            x,
                            1,
                            numrep,
                            0,
                            leaf_out,
                            rep,
                            recurse_tries,
                            0,
                            false,
                            None,
                            r,
                        );
                        if leaf_out[rep] == ITEM_NONE {
                            break; // placed nothing; no leaf
                        }
                    } else {
                        leaf_out[rep] = item;
                    }
                }
                if itemtype == 0 && is_out(ctx.weights, item, x) {
                    break;
                }
                out[rep] = item;
                left -= 1;
                break;
            }
        }
        ftotal += 1;
    }
    for rep in outpos..endpos {
        if out[rep] == ITEM_UNDEF {
            out[rep] = ITEM_NONE;
        }
        if let Some(o2) = out2.as_deref_mut() {
            if o2[rep] == ITEM_UNDEF {
                o2[rep] = ITEM_NONE;
            }
        }
    }
}

/// Chooses an item of `bucket` for (x, r) with the bucket's own algorithm.
#[inline]
fn bucket_choose(ctx: &mut Ctx<'_>, bucket: &Bucket, x: i32, r: i32) -> i32 {
    debug_assert!(bucket.size() > 0);
    let (x, ru) = (x as u32, r as u32);
    match bucket.alg {
        BucketAlg::Uniform => perm_choose(ctx, bucket, x as i32, r),
        BucketAlg::List => {
            for i in (0..bucket.size()).rev() {
                let mut w =
                    u64::from(hash32_4(x, bucket.items[i] as u32, ru, bucket.id as u32) & 0xffff);
                w = (w * u64::from(bucket.sum_weights[i])) >> 16;
                if w < u64::from(bucket.item_weights[i]) {
                    return bucket.items[i];
                }
            }
            bucket.items[0]
        }
        BucketAlg::Tree => {
            let num_nodes = bucket.node_weights.len();
            let mut n = num_nodes >> 1;
            while n & 1 == 0 {
                let w = u64::from(bucket.node_weights[n]);
                let t = (u64::from(hash32_4(x, n as u32, ru, bucket.id as u32)) * w) >> 32;
                let h = n.trailing_zeros();
                let l = n - (1 << (h - 1));
                n = if t < u64::from(bucket.node_weights[l]) {
                    l
                } else {
                    n + (1 << (h - 1))
                };
            }
            bucket.items.get(n >> 1).copied().unwrap_or(bucket.items[0])
        }
        BucketAlg::Straw => {
            let mut high = 0usize;
            let mut high_draw = 0u64;
            for i in 0..bucket.size() {
                let draw = u64::from(hash32_3(x, bucket.items[i] as u32, ru) & 0xffff)
                    * u64::from(bucket.straws[i]);
                if i == 0 || draw > high_draw {
                    high = i;
                    high_draw = draw;
                }
            }
            bucket.items[high]
        }
        BucketAlg::Straw2 => match ctx.straw2 {
            Straw2Engine::Scalar => straw2_choose(bucket, x, ru),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Straw2Engine::Avx2` is only built after AVX2 was detected at run time.
            Straw2Engine::Avx2 => unsafe { crate::simd::straw2_choose_avx2(bucket, x, ru) },
        },
    }
}

/// straw2: every item draws `ln(hash) / weight`; the largest draw wins (the first one on
/// ties). Hashes are computed four at a time so their long dependency chains overlap.
#[inline]
pub(crate) fn straw2_choose(bucket: &Bucket, x: u32, r: u32) -> i32 {
    let items = &bucket.items;
    let weights = &bucket.item_weights;
    let size = items.len().min(weights.len());
    let ln_table = crate::ln::ln_minus_one_table();
    let draw_of = |u: u32, w: u32| {
        if w == 0 {
            i64::MIN
        } else {
            ln_table[(u & 0xffff) as usize] / i64::from(w)
        }
    };
    // Starting from (0, i64::MIN) with a strict `>` is Ceph's `i == 0 || draw > high`.
    let mut high = 0usize;
    let mut high_draw = i64::MIN;
    let mut i = 0;
    while i + 4 <= size {
        let b = [
            items[i] as u32,
            items[i + 1] as u32,
            items[i + 2] as u32,
            items[i + 3] as u32,
        ];
        let h = crate::hash::hash32_3_lanes([x; 4], b, [r; 4]);
        let mut draws = [0i64; 4];
        for k in 0..4 {
            draws[k] = draw_of(h[k], weights[i + k]);
        }
        for (k, &draw) in draws.iter().enumerate() {
            if draw > high_draw {
                high = i + k;
                high_draw = draw;
            }
        }
        i += 4;
    }
    while i < size {
        let draw = draw_of(hash32_3(x, items[i] as u32, r), weights[i]);
        if draw > high_draw {
            high = i;
            high_draw = draw;
        }
        i += 1;
    }
    items[high]
}

/// Ceph's `bucket_perm_choose`: the r-th element of a pseudo-random permutation of the
/// bucket, computed lazily and cached for the current input.
fn perm_choose(ctx: &mut Ctx<'_>, bucket: &Bucket, x: i32, r: i32) -> i32 {
    let size = bucket.size() as u32;
    let pr = (r as u32) % size;
    let index = (-1 - i64::from(bucket.id)) as usize;
    let state = &mut ctx.perms[index];
    if state.perm.len() < size as usize {
        state.perm.resize(size as usize, 0);
    }
    let x_u = x as u32;
    if state.generation != ctx.generation {
        state.generation = ctx.generation;
        state.perm_n = 0;
    }
    let s;
    if state.perm_x != x_u || state.perm_n == 0 {
        state.perm_x = x_u;
        if pr == 0 {
            s = hash32_3(x_u, bucket.id as u32, 0) % size;
            state.perm[0] = s;
            state.perm_n = 0xffff; // only perm[0] is valid
            return bucket.items[s as usize];
        }
        for i in 0..size {
            state.perm[i as usize] = i;
        }
        state.perm_n = 0;
    } else if state.perm_n == 0xffff {
        // Expand the r = 0 shortcut into a real partial permutation.
        for i in 1..size {
            state.perm[i as usize] = i;
        }
        let first = state.perm[0] as usize;
        state.perm[first] = 0;
        state.perm_n = 1;
    }
    while state.perm_n <= pr {
        let p = state.perm_n;
        if p < size - 1 {
            let i = hash32_3(x_u, bucket.id as u32, p) % (size - p);
            if i != 0 {
                state.perm.swap((p + i) as usize, p as usize);
            }
        }
        state.perm_n += 1;
    }
    s = state.perm[pr as usize];
    bucket.items[s as usize]
}

impl CrushMap {
    /// Convenience wrapper over [`do_rule`] that allocates its own workspace.
    pub fn map_input(&self, rule_id: i32, x: i32, num_rep: usize, weights: &[u32]) -> Vec<i32> {
        let mut result = Vec::with_capacity(num_rep);
        let mut workspace = Workspace::new();
        do_rule(
            self,
            rule_id,
            x,
            &mut result,
            num_rep,
            weights,
            &mut workspace,
        );
        result
    }
}
