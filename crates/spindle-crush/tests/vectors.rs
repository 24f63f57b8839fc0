//! Every public golden case (maps and mappings computed by Ceph's crushtool 16.2.15)
//! must be reproduced exactly, through the text map, the binary map, the scalar mapper and
//! the batch (SIMD) mapper.

mod common;

use spindle_crush::batch::{map_batch, map_batch_parallel, BatchEngine, BatchResult};
use spindle_crush::tester::{reweight_16_16, run_test, TestOptions};
use spindle_crush::{binary, text, Workspace};

struct Case {
    name: String,
    map_txt: String,
    map_bin: Vec<u8>,
    rule: i32,
    num_rep: usize,
    reweights: Vec<(i32, f32)>,
    mappings: String,
}

fn cases() -> Vec<Case> {
    let root = common::shared_dir().join("crush/vectors/public");
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .expect("vector dir")
        .map(|e| {
            e.expect("entry")
                .file_name()
                .into_string()
                .expect("utf-8 name")
        })
        .collect();
    names.sort();
    assert!(
        names.len() >= 14,
        "expected the 14 public cases, found {}",
        names.len()
    );
    names
        .into_iter()
        .map(|name| {
            let dir = root.join(&name);
            let case: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap())
                    .unwrap();
            let reweights = case["reweights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    let w = &r["weight"];
                    let w = w
                        .as_f64()
                        .or_else(|| w.as_str().and_then(|s| s.parse().ok()))
                        .unwrap();
                    (r["osd"].as_i64().unwrap() as i32, w as f32)
                })
                .collect();
            Case {
                map_txt: std::fs::read_to_string(dir.join("map.txt")).unwrap(),
                map_bin: std::fs::read(dir.join("map.bin")).unwrap(),
                rule: case["rule_id"].as_i64().unwrap() as i32,
                num_rep: case["num_rep"].as_u64().unwrap() as usize,
                reweights,
                mappings: std::fs::read_to_string(dir.join("mappings.txt")).unwrap(),
                name,
            }
        })
        .collect()
}

#[test]
fn text_maps_round_trip_exactly() {
    for case in cases() {
        let map = text::parse_text(&case.map_txt).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            text::print_text(&map),
            case.map_txt,
            "{}: decompile differs",
            case.name
        );
    }
}

#[test]
fn binary_maps_decode_to_the_text_map_and_encode_back() {
    for case in cases() {
        let from_text = text::parse_text(&case.map_txt).unwrap();
        let from_bin =
            binary::decode(&case.map_bin).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            from_bin, from_text,
            "{}: binary and text maps differ",
            case.name
        );
        assert_eq!(
            binary::encode(&from_text),
            case.map_bin,
            "{}: encoding differs from crushtool -c",
            case.name
        );
    }
}

#[test]
fn crushtool_test_output_is_reproduced() {
    for case in cases() {
        let map = text::parse_text(&case.map_txt).unwrap();
        let options = TestOptions {
            rule: Some(case.rule),
            num_rep: Some(case.num_rep as i32),
            min_x: Some(0),
            max_x: Some(9999),
            weights: case.reweights.clone(),
            show_mappings: true,
            ..TestOptions::default()
        };
        let mut out = String::new();
        run_test(&map, &options, &mut out);
        if out != case.mappings {
            let first = out.lines().zip(case.mappings.lines()).find(|(a, b)| a != b);
            panic!(
                "{}: first difference (ours, crushtool): {first:?}",
                case.name
            );
        }
    }
}

#[test]
fn batch_engines_reproduce_the_vectors() {
    let inputs: Vec<i32> = (0..10_000).collect();
    for case in cases() {
        let map = binary::decode(&case.map_bin).unwrap();
        let mut weights = map.default_reweights();
        for &(osd, w) in &case.reweights {
            weights[osd as usize] = reweight_16_16(w);
        }
        let expected: Vec<&str> = case.mappings.lines().collect();
        for (engine, threads) in [
            (BatchEngine::Scalar, 1),
            (BatchEngine::Auto, 1),
            (BatchEngine::Auto, 3),
        ] {
            let mut out = BatchResult::default();
            let mut ws = Workspace::new();
            if threads == 1 {
                map_batch(
                    &map,
                    case.rule,
                    &inputs,
                    case.num_rep,
                    &weights,
                    engine,
                    &mut ws,
                    &mut out,
                )
                .unwrap();
            } else {
                map_batch_parallel(
                    &map,
                    case.rule,
                    &inputs,
                    case.num_rep,
                    &weights,
                    engine,
                    threads,
                    &mut out,
                )
                .unwrap();
            }
            for (x, line) in expected.iter().enumerate() {
                let items: Vec<String> = out.get(x).iter().map(|i| i.to_string()).collect();
                let ours = format!("CRUSH rule {} x {x} [{}]", case.rule, items.join(","));
                assert_eq!(
                    &ours, line,
                    "{} engine {engine:?} threads {threads}",
                    case.name
                );
            }
        }
    }
}
