//! Batch mapping: many inputs through one rule in one call, with a SIMD engine.
//!
//! The batch API is what the client's placement kernel calls (one call per batch of
//! placement groups), and the unit an accelerator engine would take over. Two engines:
//! - `Scalar`: the reference [`crate::mapper::do_rule`] in a loop;
//! - `Avx2` (x86_64, chosen at run time when the CPU has AVX2): for the common replicated
//!   rule shape over straw2 buckets, eight inputs advance in lock step and each step makes
//!   eight straw2 choices in one pass of vectors (`simt.rs`); other rules keep the scalar
//!   control flow with straw2 buckets drawing eight items at a time (`simd.rs`). Both
//!   compute draws in f64 and re-check near ties with Ceph's integer code, so results
//!   stay bit-identical.
//!
//! Invariant: both engines return identical results for every input (property-tested).

use crate::map::CrushMap;
use crate::mapper::{do_rule_with, Straw2Engine, Workspace};

/// Which implementation maps a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEngine {
    /// Pick the fastest engine this CPU supports.
    Auto,
    Scalar,
    Avx2,
}

impl BatchEngine {
    /// The engine `Auto` resolves to on this machine.
    pub fn detect() -> BatchEngine {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return BatchEngine::Avx2;
            }
        }
        BatchEngine::Scalar
    }

    fn resolve(self) -> Result<Straw2Engine, crate::CrushError> {
        #[cfg(target_arch = "x86_64")]
        let avx2 = std::is_x86_feature_detected!("avx2");
        match self {
            BatchEngine::Auto => BatchEngine::detect().resolve(),
            BatchEngine::Scalar => Ok(Straw2Engine::Scalar),
            #[cfg(target_arch = "x86_64")]
            BatchEngine::Avx2 if avx2 => Ok(Straw2Engine::Avx2),
            BatchEngine::Avx2 => Err(crate::CrushError::Invalid(
                "this CPU has no AVX2".to_string(),
            )),
        }
    }
}

/// Results of a batch: `len(inputs)` rows of up to `num_rep` items each, stored flat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchResult {
    pub num_rep: usize,
    /// `items[i * num_rep ..][.. lens[i]]` is the mapping of input i.
    pub items: Vec<i32>,
    pub lens: Vec<u8>,
}

impl BatchResult {
    pub fn get(&self, index: usize) -> &[i32] {
        let start = index * self.num_rep;
        &self.items[start..start + self.lens[index] as usize]
    }

    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
}

/// Maps every input through `rule_id`. Reuses `out` (no allocation once it has grown).
#[allow(clippy::too_many_arguments)] // mirrors `do_rule`'s parameters plus the batch ones
pub fn map_batch(
    map: &CrushMap,
    rule_id: i32,
    inputs: &[i32],
    num_rep: usize,
    weights: &[u32],
    engine: BatchEngine,
    workspace: &mut Workspace,
    out: &mut BatchResult,
) -> Result<(), crate::CrushError> {
    if map.rule(rule_id).is_none() {
        return Err(crate::CrushError::NoSuchRule(rule_id));
    }
    if num_rep > 255 {
        return Err(crate::CrushError::Invalid(format!(
            "num_rep {num_rep} exceeds 255"
        )));
    }
    let straw2 = engine.resolve()?;
    out.num_rep = num_rep;
    out.items.clear();
    out.items.resize(inputs.len() * num_rep, crate::ITEM_NONE);
    out.lens.clear();
    out.lens.resize(inputs.len(), 0);
    if let Some(plan) = crate::lanes::Plan::new(map, rule_id, num_rep) {
        let (items, lens) = (&mut out.items, &mut out.lens);
        match straw2 {
            Straw2Engine::Scalar => crate::lanes::map_lanes(
                map,
                &plan,
                inputs,
                num_rep,
                weights,
                items,
                lens,
                crate::lanes::step_portable,
            ),
            #[cfg(target_arch = "x86_64")]
            Straw2Engine::Avx2 => crate::lanes::map_lanes(
                map,
                &plan,
                inputs,
                num_rep,
                weights,
                items,
                lens,
                |p, r| {
                    // SAFETY: `Straw2Engine::Avx2` is only resolved after AVX2 was detected.
                    unsafe { crate::simd::step_avx2(map, p, r) }
                },
            ),
        }
        return Ok(());
    }
    let mut row = Vec::with_capacity(num_rep);
    for (i, &x) in inputs.iter().enumerate() {
        let n = do_rule_with(
            map, rule_id, x, &mut row, num_rep, weights, workspace, straw2,
        );
        out.items[i * num_rep..i * num_rep + n].copy_from_slice(&row[..n]);
        out.lens[i] = n as u8;
    }
    Ok(())
}

/// [`map_batch`] spread over `threads` OS threads (contiguous slices of `inputs`, one
/// workspace per thread, the map shared read-only; no locks). Results are identical to the
/// single-threaded call. `threads == 0` means one per available core.
#[allow(clippy::too_many_arguments)] // mirrors `map_batch`
pub fn map_batch_parallel(
    map: &CrushMap,
    rule_id: i32,
    inputs: &[i32],
    num_rep: usize,
    weights: &[u32],
    engine: BatchEngine,
    threads: usize,
    out: &mut BatchResult,
) -> Result<(), crate::CrushError> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    // Below a few thousand inputs per thread, spawning costs more than it saves.
    let threads = threads.min(inputs.len() / 2048).max(1);
    if threads == 1 {
        return map_batch(
            map,
            rule_id,
            inputs,
            num_rep,
            weights,
            engine,
            &mut Workspace::new(),
            out,
        );
    }
    if map.rule(rule_id).is_none() {
        return Err(crate::CrushError::NoSuchRule(rule_id));
    }
    out.num_rep = num_rep;
    out.items.clear();
    out.items.resize(inputs.len() * num_rep, crate::ITEM_NONE);
    out.lens.clear();
    out.lens.resize(inputs.len(), 0);
    let per_thread = inputs.len().div_ceil(threads);
    let results: Vec<Result<BatchResult, crate::CrushError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .chunks(per_thread)
            .map(|part| {
                scope.spawn(move || {
                    let mut local = BatchResult::default();
                    map_batch(
                        map,
                        rule_id,
                        part,
                        num_rep,
                        weights,
                        engine,
                        &mut Workspace::new(),
                        &mut local,
                    )
                    .map(|()| local)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(crate::CrushError::Invalid("mapping thread panicked".into()))
                })
            })
            .collect()
    });
    let mut at = 0;
    for result in results {
        let local = result?;
        let n = local.lens.len();
        out.items[at * num_rep..(at + n) * num_rep].copy_from_slice(&local.items);
        out.lens[at..at + n].copy_from_slice(&local.lens);
        at += n;
    }
    debug_assert_eq!(at, inputs.len());
    Ok(())
}
