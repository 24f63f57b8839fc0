//! `crushtool --test` compatible runs: the same defaults, the same weight handling and
//! byte-for-byte the same `--show-mappings`, `--show-statistics` and `--show-utilization`
//! lines, so `spindle crush test` and `crushtool` outputs diff clean.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::map::{CrushMap, ITEM_NONE};
use crate::mapper::{do_rule, Workspace};

/// What to run and print; `None` fields take crushtool's defaults.
#[derive(Debug, Clone, Default)]
pub struct TestOptions {
    pub rule: Option<i32>,
    pub num_rep: Option<i32>,
    pub min_x: Option<i32>,
    pub max_x: Option<i32>,
    /// `--weight DEV W` overrides, in order.
    pub weights: Vec<(i32, f32)>,
    pub show_mappings: bool,
    pub show_statistics: bool,
    pub show_utilization: bool,
    pub show_bad_mappings: bool,
}

/// crushtool's conversion of a `--weight` value: `(int)(w * 0x10000)` clamped to 0..=1.
pub fn reweight_16_16(weight: f32) -> u32 {
    let w = (weight * 65536.0f32) as i32;
    w.clamp(0, 0x10000) as u32
}

/// Runs the test and writes the lines crushtool would print to `out`.
pub fn run_test(map: &CrushMap, options: &TestOptions, out: &mut String) {
    // crushtool turns statistics on whenever utilization is asked for.
    let options = &TestOptions {
        show_statistics: options.show_statistics || options.show_utilization,
        ..options.clone()
    };
    let (min_rule, max_rule) = match options.rule {
        Some(r) if r >= 0 => (r, r),
        _ => (0, map.rules.len() as i32 - 1),
    };
    let (mut min_x, mut max_x) = (options.min_x.unwrap_or(-1), options.max_x.unwrap_or(-1));
    if min_x < 0 || max_x < 0 {
        min_x = 0;
        max_x = 1023;
    }
    let mut weights = map.default_reweights();
    let overrides: BTreeMap<i32, u32> = options
        .weights
        .iter()
        .map(|&(dev, w)| (dev, reweight_16_16(w)))
        .collect();
    for (dev, w) in &overrides {
        if *dev >= 0 && (*dev as usize) < weights.len() {
            weights[*dev as usize] = *w;
        }
    }
    let mut workspace = Workspace::new();
    let mut result = Vec::new();
    for r in min_rule..=max_rule {
        let Some(rule) = map.rule(r) else {
            if options.show_statistics {
                let _ = writeln!(out, "rule {r} dne");
            }
            continue;
        };
        let (minr, maxr) = match options.num_rep {
            Some(n) if n >= 0 => (n, n),
            _ => (i32::from(rule.min_size), i32::from(rule.max_size)),
        };
        let rule_name = map.rule_names.get(&r).cloned().unwrap_or_default();
        if options.show_statistics {
            let _ = writeln!(
                out,
                "rule {r} ({rule_name}), x = {min_x}..{max_x}, numrep = {minr}..{maxr}"
            );
        }
        for nr in minr..=maxr {
            let total_weight: u64 = weights.iter().map(|&w| u64::from(w)).sum();
            if total_weight == 0 {
                continue;
            }
            let mut per = vec![0u64; weights.len()];
            let mut sizes: BTreeMap<usize, u64> = BTreeMap::new();
            for x in min_x..=max_x {
                do_rule(
                    map,
                    r,
                    x,
                    &mut result,
                    nr.max(0) as usize,
                    &weights,
                    &mut workspace,
                );
                if options.show_mappings {
                    out.push_str("CRUSH rule ");
                    let _ = write!(out, "{r} x {x} [");
                    for (i, item) in result.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{item}");
                    }
                    out.push_str("]\n");
                }
                let mut has_none = false;
                for &item in &result {
                    if item == ITEM_NONE {
                        has_none = true;
                    } else if let Some(slot) = per.get_mut(item as usize) {
                        *slot += 1;
                    }
                }
                *sizes.entry(result.len()).or_default() += 1;
                if options.show_bad_mappings && (result.len() != nr as usize || has_none) {
                    let _ = write!(out, "bad mapping rule {r} x {x} num_rep {nr} result [");
                    for (i, item) in result.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{item}");
                    }
                    out.push_str("]\n");
                }
            }
            if options.show_statistics {
                for (size, count) in &sizes {
                    let _ = writeln!(
                        out,
                        "rule {r} ({rule_name}) num_rep {nr} result size == {size}:\t{count}/{}",
                        max_x - min_x + 1
                    );
                }
                if options.show_utilization {
                    let num_objects = (max_x - min_x + 1) as f32;
                    let expected_objects =
                        nr.min(maximum_affected_by_rule(map, r)) as f32 * num_objects;
                    for (i, count) in per.iter().enumerate() {
                        let proportional = weights[i] as f32 / total_weight as f32;
                        let expected = proportional * expected_objects;
                        if expected > 0.0 && *count > 0 {
                            let _ = writeln!(
                                out,
                                "  device {i}:\t\t stored : {count}\t expected : {}",
                                format_g6(f64::from(expected))
                            );
                        }
                    }
                }
            }
        }
    }
}

/// crushtool's upper bound on how many distinct items a rule can return
/// (`CrushTester::get_maximum_affected_by_rule`), used for the expected utilization.
fn maximum_affected_by_rule(map: &CrushMap, rule_id: i32) -> i32 {
    let Some(rule) = map.rule(rule_id) else {
        return 0;
    };
    let mut affected_types = Vec::new();
    let mut replications_by_type: BTreeMap<i32, i32> = BTreeMap::new();
    for step in &rule.steps {
        let (op, arg1, arg2) = step.encode();
        if op >= 2 && op != 4 {
            affected_types.push(arg2);
            replications_by_type.insert(arg2, arg1);
        }
    }
    let mut max_of_type: BTreeMap<i32, i32> = BTreeMap::new();
    for t in &affected_types {
        for id in map.item_names.keys() {
            if map.bucket(*id).is_some_and(|b| i32::from(b.type_id) == *t) {
                *max_of_type.entry(*t).or_default() += 1;
            }
        }
    }
    for t in &affected_types {
        let wanted = replications_by_type.get(t).copied().unwrap_or(0);
        let have = max_of_type.entry(*t).or_default();
        if wanted > 0 && wanted < *have {
            *have = wanted;
        }
    }
    let mut max_affected = map.max_buckets().max(map.max_devices);
    for t in &affected_types {
        let have = max_of_type.get(t).copied().unwrap_or(0);
        if have > 0 && have < max_affected {
            max_affected = have;
        }
    }
    max_affected
}

/// Formats like C++ `ostream << double` with default flags: `%g` with 6 significant digits.
pub fn format_g6(value: f64) -> String {
    if value == 0.0 {
        return "0".to_string();
    }
    let exponent = value.abs().log10().floor() as i32;
    // Round to 6 significant digits first; rounding can bump the exponent.
    let sci = format!("{:.5e}", value);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(exponent);
    if !(-4..6).contains(&exp) {
        let mantissa = trim_zeros(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let decimals = (5 - exp).max(0) as usize;
    trim_zeros(&format!("{value:.decimals$}")).to_string()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::format_g6;

    #[test]
    fn g6_matches_cpp_stream_output() {
        assert_eq!(format_g6(170.66667), "170.667");
        assert_eq!(format_g6(1024.0), "1024");
        assert_eq!(format_g6(0.5), "0.5");
        assert_eq!(format_g6(123456.7), "123457");
        assert_eq!(format_g6(1234567.0), "1.23457e+06");
        assert_eq!(format_g6(0.0001234), "0.0001234");
    }
}
