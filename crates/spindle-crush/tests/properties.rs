//! Statistical and stability properties of straw2, checked on random buckets.

use proptest::prelude::*;
use spindle_crush::builder::MapBuilder;
use spindle_crush::{do_rule, BucketAlg, CrushMap, Step, Workspace};

const INPUTS: i32 = 100_000;

/// A flat straw2 root over devices with the given 16.16 weights and a rule that picks one
/// device.
fn flat_map(weights: &[u32]) -> (CrushMap, i32) {
    let mut b = MapBuilder::new();
    b.add_type(0, "osd").add_type(1, "root");
    let mut items = Vec::new();
    for (id, &w) in weights.iter().enumerate() {
        b.add_device(id as i32, &format!("osd.{id}"), None).unwrap();
        items.push((id as i32, w));
    }
    let root = b
        .add_bucket("root", "root", BucketAlg::Straw2, &items)
        .unwrap();
    let rule = b
        .add_rule(
            "one",
            1,
            vec![
                Step::Take { item: root },
                Step::ChooseFirstN { num: 1, type_id: 0 },
                Step::Emit,
            ],
        )
        .unwrap();
    (b.build(), rule)
}

fn map_all(map: &CrushMap, rule: i32) -> Vec<i32> {
    let weights = map.default_reweights();
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    (0..INPUTS)
        .map(|x| {
            do_rule(map, rule, x, &mut out, 1, &weights, &mut ws);
            assert_eq!(out.len(), 1, "one device per input");
            out[0]
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Each device receives a share of inputs proportional to its weight. Tolerance: the
    /// binomial standard deviation times 5, plus 0.2% of the inputs for the fixed-point
    /// log's approximation.
    #[test]
    fn straw2_share_is_proportional_to_weight(weights in prop::collection::vec(0x2000u32..0x50000, 2..16)) {
        let (map, rule) = flat_map(&weights);
        let placed = map_all(&map, rule);
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        for (dev, &w) in weights.iter().enumerate() {
            let observed = placed.iter().filter(|&&d| d == dev as i32).count() as f64;
            let p = f64::from(w) / total;
            let expected = p * f64::from(INPUTS);
            let sigma = (f64::from(INPUTS) * p * (1.0 - p)).sqrt();
            let tolerance = 5.0 * sigma + 0.002 * f64::from(INPUTS);
            prop_assert!(
                (observed - expected).abs() <= tolerance,
                "device {dev} weight {w:#x}: {observed} inputs, expected {expected:.0} +- {tolerance:.0}"
            );
        }
    }

    /// Changing one device's weight moves inputs only to it (weight up) or only away from
    /// it (weight down); every other input keeps its device.
    #[test]
    fn reweighting_one_device_moves_only_its_inputs(
        weights in prop::collection::vec(0x4000u32..0x40000, 3..12),
        victim_seed in any::<usize>(),
        factor in prop::sample::select(vec![0.0f64, 0.25, 0.5, 1.5, 3.0]),
    ) {
        let victim = victim_seed % weights.len();
        let mut changed = weights.clone();
        changed[victim] = (f64::from(weights[victim]) * factor) as u32;
        let (before_map, rule) = flat_map(&weights);
        let (after_map, _) = flat_map(&changed);
        let before = map_all(&before_map, rule);
        let after = map_all(&after_map, rule);
        let mut moved = 0;
        for (x, (&b, &a)) in before.iter().zip(&after).enumerate() {
            if a == b {
                continue;
            }
            moved += 1;
            if changed[victim] > weights[victim] {
                prop_assert_eq!(a, victim as i32, "input {} moved {} -> {} but only moves to the heavier device are allowed", x, b, a);
            } else {
                prop_assert_eq!(b, victim as i32, "input {} moved {} -> {} but only moves away from the lighter device are allowed", x, b, a);
            }
        }
        if changed[victim] != weights[victim] {
            prop_assert!(moved > 0, "a weight change must move something");
        }
    }
}

/// Reweighting (the OSDMap "in" fraction) a device to 0 removes it from every mapping and
/// leaves inputs that did not use it where they were.
#[test]
fn marking_a_device_out_moves_only_its_inputs() {
    let (map, rule) = flat_map(&[0x10000, 0x20000, 0x18000, 0x10000, 0x30000]);
    let all_in = map.default_reweights();
    let mut one_out = all_in.clone();
    one_out[2] = 0;
    let mut ws = Workspace::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in 0..INPUTS {
        do_rule(&map, rule, x, &mut a, 1, &all_in, &mut ws);
        do_rule(&map, rule, x, &mut b, 1, &one_out, &mut ws);
        assert_ne!(b[0], 2, "an out device is never chosen");
        if a[0] != 2 {
            assert_eq!(a, b, "input {x} did not use device 2 and must not move");
        }
    }
}
