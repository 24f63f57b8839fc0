//! `spindle crush compile | decompile | test`: crushtool-compatible map tools.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use spindle_crush::tester::{reweight_16_16, run_test, TestOptions};
use spindle_crush::{binary, load_map, text, CrushMap, ITEM_NONE};

/// The map `spindle crush test` uses when no `-i` is given.
pub const EXAMPLE_MAP: &str = include_str!("../../spindle-crush/maps/example.txt");

#[derive(Subcommand)]
pub enum CrushCommand {
    /// Compile a text map into Ceph's binary format (identical to `crushtool -c`).
    Compile {
        /// Text map (as written by `crushtool -d`).
        input: PathBuf,
        /// Where to write the compiled map.
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
    },
    /// Print a binary or text map in the text format of `crushtool -d`.
    Decompile {
        input: PathBuf,
        /// Output file (default: standard output).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Map inputs through rules like `crushtool --test`, with the same flags and output.
    Test(TestArgs),
    /// Print the running cluster's CRUSH map (crushtool text format).
    GetMap {
        /// Output file (default: standard output).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Load a CRUSH map (Ceph text or binary) into the running cluster: a new epoch, data
    /// placed by the new map. Every daemon must be a device of the map and every pool's rule
    /// must exist in it.
    SetMap {
        input: PathBuf,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
}

#[derive(Args)]
pub struct TestArgs {
    /// Map to test (text or binary); default: Spindle's bundled example map.
    #[arg(short = 'i', long = "infn")]
    input: Option<PathBuf>,
    /// Accepted for crushtool compatibility (testing is what this command does).
    #[arg(long)]
    test: bool,
    /// Rule id to test (default: every rule).
    #[arg(long = "rule")]
    rule: Option<i32>,
    /// Result size (default: each size from the rule's min_size to max_size).
    #[arg(long = "num-rep", alias = "num_rep")]
    num_rep: Option<i32>,
    /// First input (both --min-x and --max-x are needed, else 0..1023 as in crushtool).
    #[arg(long = "min-x", alias = "min_x", allow_hyphen_values = true)]
    min_x: Option<i32>,
    #[arg(long = "max-x", alias = "max_x", allow_hyphen_values = true)]
    max_x: Option<i32>,
    /// Test a single input (sets both --min-x and --max-x).
    #[arg(long = "x")]
    x: Option<i32>,
    /// Reweight a device (0 = out, 1 = in), as `ceph osd reweight` does; repeatable.
    #[arg(long = "weight", num_args = 2, value_names = ["DEV", "WEIGHT"], action = clap::ArgAction::Append, allow_hyphen_values = true)]
    weight: Vec<String>,
    /// Print every mapping: `CRUSH rule R x X [a,b,c]`.
    #[arg(long = "show-mappings", alias = "show_mappings")]
    show_mappings: bool,
    /// Print the distribution of result sizes.
    #[arg(long = "show-statistics", alias = "show_statistics")]
    show_statistics: bool,
    /// Print how many inputs each device received (implies --show-statistics, as in crushtool).
    #[arg(long = "show-utilization", alias = "show_utilization")]
    show_utilization: bool,
    /// Print inputs that got fewer items than asked for, or holes.
    #[arg(long = "show-bad-mappings", alias = "show_bad_mappings")]
    show_bad_mappings: bool,
}

pub fn run(command: CrushCommand) -> anyhow::Result<()> {
    match command {
        CrushCommand::GetMap { output, target } => spindle_cluster::runtime()?.block_on(async {
            let client = target.client().await?;
            let text = spindle_cluster::admin(&client, spindle_mon::Admin::crush_get()).await?;
            match output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => print!("{text}"),
            }
            Ok(())
        }),
        CrushCommand::SetMap { input, target } => {
            let map = read_map(&input)?;
            let text = text::print_text(&map);
            spindle_cluster::runtime()?.block_on(async {
                let client = target.client().await?;
                let r =
                    spindle_cluster::admin(&client, spindle_mon::Admin::crush_set(&text)).await?;
                println!("loaded {} (epoch {})", input.display(), r.epoch);
                Ok(())
            })
        }
        CrushCommand::Compile { input, output } => {
            let map = read_map(&input)?;
            std::fs::write(&output, binary::encode(&map))
                .with_context(|| format!("writing {}", output.display()))?;
            Ok(())
        }
        CrushCommand::Decompile { input, output } => {
            let map = read_map(&input)?;
            let text = text::print_text(&map);
            match output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => print!("{text}"),
            }
            Ok(())
        }
        CrushCommand::Test(args) => test(args),
    }
}

fn read_map(path: &PathBuf) -> anyhow::Result<CrushMap> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    load_map(&bytes).with_context(|| format!("{}", path.display()))
}

fn test(args: TestArgs) -> anyhow::Result<()> {
    let (map, map_name) = match &args.input {
        Some(path) => (read_map(path)?, path.display().to_string()),
        None => (
            text::parse_text(EXAMPLE_MAP).context("bundled example map")?,
            "bundled example map (2 racks x 3 hosts x 3 devices, classes ssd/hdd)".to_string(),
        ),
    };
    let mut weights = Vec::new();
    for pair in args.weight.chunks(2) {
        let dev: i32 = pair[0]
            .parse()
            .with_context(|| format!("--weight: bad device id '{}'", pair[0]))?;
        let w: f32 = pair[1]
            .parse()
            .with_context(|| format!("--weight: bad weight '{}'", pair[1]))?;
        if !(0.0..=1.0).contains(&w) {
            eprintln!("spindle: warning: --weight {dev} {w} clamped to 0..1 as crushtool does");
        }
        weights.push((dev, w));
    }
    if let Some(rule) = args.rule {
        if map.rule(rule).is_none() {
            bail!("rule {rule} does not exist in {map_name}");
        }
    }
    if let Some(n) = args.num_rep {
        if !(0..=spindle_crush::map::MAX_RESULT as i32).contains(&n) {
            bail!(
                "--num-rep {n} is out of range 0..={}",
                spindle_crush::map::MAX_RESULT
            );
        }
    }
    let (min_x, max_x) = match args.x {
        Some(x) => (Some(x), Some(x)),
        None => (args.min_x, args.max_x),
    };
    let options = TestOptions {
        rule: args.rule,
        num_rep: args.num_rep,
        min_x,
        max_x,
        weights,
        show_mappings: args.show_mappings,
        show_statistics: args.show_statistics,
        show_utilization: args.show_utilization,
        show_bad_mappings: args.show_bad_mappings,
    };
    let any_output = args.show_mappings
        || args.show_statistics
        || args.show_utilization
        || args.show_bad_mappings;
    if !any_output {
        print_summary(&map, &map_name, &options);
        return Ok(());
    }
    let mut out = String::new();
    run_test(&map, &options, &mut out);
    print!("{out}");
    Ok(())
}

/// Human summary when no crushtool display flag is given: per rule, how inputs spread
/// over devices compared with their CRUSH weight.
fn print_summary(map: &CrushMap, map_name: &str, options: &TestOptions) {
    let inputs = 10_000;
    println!("CRUSH map: {map_name}");
    println!(
        "{} devices, {} buckets, {} rules; mapping {inputs} inputs per rule (use --show-mappings for crushtool output)",
        map.max_devices,
        map.buckets.iter().flatten().filter(|b| !map.is_shadow(b.id)).count(),
        map.rules.iter().flatten().count()
    );
    let mut weights = map.default_reweights();
    for &(dev, w) in &options.weights {
        if dev >= 0 && (dev as usize) < weights.len() {
            weights[dev as usize] = reweight_16_16(w);
        }
    }
    let mut workspace = spindle_crush::Workspace::new();
    let mut result = Vec::new();
    for (rule_id, rule) in map.rules.iter().enumerate() {
        let Some(rule) = rule else { continue };
        let rule_id = rule_id as i32;
        if options.rule.is_some_and(|r| r != rule_id) {
            continue;
        }
        let num_rep = options.num_rep.unwrap_or(3).max(1) as usize;
        let mut per_device = vec![0u64; map.max_devices as usize];
        let mut holes = 0u64;
        let mut short = 0u64;
        for x in 0..inputs {
            spindle_crush::do_rule(
                map,
                rule_id,
                x,
                &mut result,
                num_rep,
                &weights,
                &mut workspace,
            );
            if result.len() < num_rep {
                short += 1;
            }
            for &item in &result {
                if item == ITEM_NONE {
                    holes += 1;
                } else if let Some(c) = per_device.get_mut(item as usize) {
                    *c += 1;
                }
            }
        }
        let name = map.rule_names.get(&rule_id).cloned().unwrap_or_default();
        let kind = if rule.rule_type == spindle_crush::map::RULE_TYPE_ERASURE {
            "erasure"
        } else {
            "replicated"
        };
        println!("\nrule {rule_id} ({name}, {kind}), {num_rep} per input: {short} short results, {holes} holes");
        let total: u64 = per_device.iter().sum();
        println!("  {:>8}  {:>8}  {:>7}", "device", "inputs", "share");
        for (dev, count) in per_device.iter().enumerate() {
            if *count > 0 {
                let dev_name = map
                    .item_names
                    .get(&(dev as i32))
                    .cloned()
                    .unwrap_or_default();
                println!(
                    "  {dev_name:>8}  {count:>8}  {:>6.2}%",
                    100.0 * *count as f64 / total.max(1) as f64
                );
            }
        }
    }
}
