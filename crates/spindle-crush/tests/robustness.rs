//! Bad input never panics: corrupted binary maps and mangled text maps either fail with an
//! error or load into a map that can be mapped through every rule without panicking.

use proptest::prelude::*;
use spindle_crush::batch::{map_batch, BatchEngine, BatchResult};
use spindle_crush::{binary, do_rule, text, CrushMap, Workspace};

const MAP_TXT: &str = include_str!("../maps/example.txt");

fn exercise(map: &CrushMap) {
    let weights = map.default_reweights();
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let inputs: Vec<i32> = (0..16).collect();
    for rule in 0..map.rules.len() as i32 + 1 {
        for num_rep in [1, 3, 6] {
            for &x in &inputs {
                do_rule(map, rule, x, &mut out, num_rep, &weights, &mut ws);
                assert!(out.len() <= num_rep);
            }
            for engine in [BatchEngine::Scalar, BatchEngine::Auto] {
                let mut batch = BatchResult::default();
                let _ = map_batch(
                    map, rule, &inputs, num_rep, &weights, engine, &mut ws, &mut batch,
                );
            }
        }
    }
    // Whatever loaded must also print and re-encode.
    let _ = text::print_text(map);
    let _ = binary::encode(map);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn mangled_text_maps_do_not_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), "[ -~\n]{0,6}"), 1..5)) {
        let mut text_map = MAP_TXT.to_string();
        for (index, insert) in edits {
            let mut at = index.index(text_map.len() + 1);
            while !text_map.is_char_boundary(at) {
                at -= 1;
            }
            text_map.insert_str(at, &insert);
        }
        if let Ok(map) = text::parse_text(&text_map) {
            exercise(&map);
        }
    }
}

/// Every single-byte corruption of a compiled map (three values per position): either an
/// error or a usable map. Both outcomes must occur, or the test proves nothing.
#[test]
fn corrupted_binary_maps_do_not_panic() {
    let original = binary::encode(&text::parse_text(MAP_TXT).unwrap());
    let (mut loaded, mut rejected) = (0, 0);
    for i in 0..original.len() {
        for value in [0x00, 0xff, original[i] ^ 0x01] {
            let mut bytes = original.clone();
            bytes[i] = value;
            match binary::decode(&bytes) {
                Ok(map) => {
                    loaded += 1;
                    exercise(&map);
                }
                Err(_) => rejected += 1,
            }
        }
    }
    // Truncation: the format has optional trailing sections (older encodings end after
    // the names or after any tunable), so a cut there loads; anywhere else it is an error.
    let mut truncated_loaded = 0;
    for len in 0..original.len() {
        if let Ok(map) = binary::decode(&original[..len]) {
            truncated_loaded += 1;
            exercise(&map);
        }
    }
    assert!(
        truncated_loaded < 12,
        "{truncated_loaded} truncated maps loaded"
    );
    assert!(
        loaded > 100 && rejected > 100,
        "loaded {loaded}, rejected {rejected}"
    );
}
