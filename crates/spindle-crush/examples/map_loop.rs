//! Profiling aid: maps N inputs of a map (text or binary) through a rule, scalar or batch.
//! `cargo run --release --example map_loop -- MAP RULE NUM_REP INPUTS [scalar|batch|batch-scalar]`

use spindle_crush::batch::{map_batch, BatchEngine, BatchResult};
use spindle_crush::{do_rule, load_map, Workspace};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        return Err("usage: map_loop MAP RULE NUM_REP INPUTS [scalar|batch|batch-scalar]".into());
    }
    let map = load_map(&std::fs::read(&args[1])?)?;
    let rule: i32 = args[2].parse()?;
    let num_rep: usize = args[3].parse()?;
    let inputs: i32 = args[4].parse()?;
    let mode = args.get(5).map_or("scalar", String::as_str);
    let batch = mode.starts_with("batch");
    let engine = if mode == "batch-scalar" {
        BatchEngine::Scalar
    } else {
        BatchEngine::Auto
    };
    let weights = map.default_reweights();
    let mut ws = Workspace::new();
    let start = std::time::Instant::now();
    let mut sum = 0i64;
    if batch {
        let xs: Vec<i32> = (0..inputs).collect();
        let mut out = BatchResult::default();
        for part in xs.chunks(4096) {
            map_batch(
                &map, rule, part, num_rep, &weights, engine, &mut ws, &mut out,
            )?;
            sum += out.items.iter().map(|&i| i64::from(i)).sum::<i64>();
        }
    } else {
        let mut row = Vec::new();
        for x in 0..inputs {
            do_rule(&map, rule, x, &mut row, num_rep, &weights, &mut ws);
            sum += row.iter().map(|&i| i64::from(i)).sum::<i64>();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{} mappings/s (checksum {sum})", f64::from(inputs) / secs);
    Ok(())
}
