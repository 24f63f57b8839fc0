//! `spindle bench prog`: how fast pushdown programs (issue #23) scan a column, in the
//! interpreter and the JIT, against the same scan compiled natively in this process (the
//! anchor: what the daemon's own code would do), in one run on one machine. Programs are
//! the examples shipped in `crates/spindle-prog/programs/`, compiled here with clang.

use crate::common::{print_report, BenchResult};
use clap::Args;
use spindle_prog::{compile_c, Engine, Limits, Program, EXAMPLES};
use std::time::Instant;

#[derive(Args)]
pub struct BenchProgArgs {
    /// Size of the column scanned, MiB of u32 values.
    #[arg(long, default_value_t = 64)]
    mib: u64,
    /// Runs of each configuration (the best is reported).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Best seconds of `rounds` runs of `f`, and its last result.
fn best<T>(rounds: u32, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    (best, last.expect("one round at least"))
}

pub fn run(args: BenchProgArgs) -> anyhow::Result<()> {
    let n = (args.mib << 20) / 4;
    let mut x = 0x9e37_79b9_u32;
    let values: Vec<u32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % 1_000_000
        })
        .collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (a, b) = (100_000u32, 299_999u32);
    let range_args: Vec<u8> = [a, b].iter().flat_map(|v| v.to_le_bytes()).collect();
    let limits = Limits {
        instructions: 50 * n + 1_000_000,
        scratch_bytes: n.div_ceil(8) + 4096,
        ..Limits::default()
    };
    let gbps = |secs: f64| data.len() as f64 / secs / 1e9;

    // The native anchors.
    let (sum_native_s, sum) = best(args.rounds, || {
        values.iter().map(|&v| v as u64).sum::<u64>()
    });
    let (range_native_s, count) = best(args.rounds, || {
        values.iter().filter(|&&v| (a..=b).contains(&v)).count() as u64
    });

    let mut results = Vec::new();
    for (name, source) in EXAMPLES {
        let elf = compile_c(source).map_err(anyhow::Error::msg)?;
        let p = Program::load(&elf)?;
        let (native_s, what) = match name {
            "column_sum" => (sum_native_s, "sum"),
            _ => (range_native_s, "range count"),
        };
        for engine in [Engine::Jit, Engine::Interpreter] {
            let prog_args: &[u8] = if name == "column_sum" {
                &[]
            } else {
                &range_args
            };
            let (secs, out) = best(args.rounds, || p.run(engine, &data, prog_args, &limits));
            let out = out?;
            // Same answer as native, or the figure means nothing.
            match name {
                "column_sum" => anyhow::ensure!(
                    out.output == sum.to_le_bytes() && out.ret == n,
                    "{name} ({engine:?}) disagrees with the native sum"
                ),
                _ => anyhow::ensure!(
                    out.ret == count,
                    "{name} ({engine:?}) counted {} values, native {count}",
                    out.ret
                ),
            }
            results.push(BenchResult::higher_is_better(
                format!("{name} {engine:?} ({} MiB u32 {what})", args.mib),
                "GB/s",
                gbps(secs),
                "native Rust, same scan",
                gbps(native_s),
            ));
        }
    }
    print_report("prog", &results, args.json)
}
