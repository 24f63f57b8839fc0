//! Arbitrary bytes as a CRUSH map (binary or text): loading must never panic, and a map that
//! loads must map inputs through every rule without panicking or hanging.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spindle_crush::{do_rule, load_map, Workspace};

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = load_map(data) {
        let weights = map.default_reweights();
        let mut ws = Workspace::new();
        let mut out = Vec::new();
        for rule in 0..map.rules.len() as i32 {
            for x in 0..8 {
                do_rule(&map, rule, x, &mut out, 4, &weights, &mut ws);
            }
        }
        let _ = spindle_crush::text::print_text(&map);
    }
});
