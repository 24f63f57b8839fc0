//! Output convention shared by every `spindle bench <what>` command (SYSTEM.md §5):
//! a human table by default, one JSON object with `--json`.

use serde::Serialize;

/// One measured figure compared with its anchor.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub name: String,
    pub unit: String,
    pub spindle: f64,
    /// What the figure is compared to, e.g. "crushtool 16.2.15 --test".
    pub reference: String,
    pub reference_value: f64,
    /// Greater than 1 means Spindle is better.
    pub ratio: f64,
}

impl BenchResult {
    fn with_ratio(
        name: impl Into<String>,
        unit: impl Into<String>,
        spindle: f64,
        reference: impl Into<String>,
        reference_value: f64,
        ratio: f64,
    ) -> Self {
        BenchResult {
            name: name.into(),
            unit: unit.into(),
            spindle,
            reference: reference.into(),
            reference_value,
            ratio,
        }
    }

    /// Builds a result where a larger value is better (throughput).
    pub fn higher_is_better(
        name: impl Into<String>,
        unit: impl Into<String>,
        spindle: f64,
        reference: impl Into<String>,
        reference_value: f64,
    ) -> Self {
        let ratio = if reference_value > 0.0 {
            spindle / reference_value
        } else {
            f64::NAN
        };
        Self::with_ratio(name, unit, spindle, reference, reference_value, ratio)
    }

    /// Builds a result where a smaller value is better (latency, CPU time): the ratio is
    /// reference / spindle, so above 1 still means Spindle is better.
    pub fn lower_is_better(
        name: impl Into<String>,
        unit: impl Into<String>,
        spindle: f64,
        reference: impl Into<String>,
        reference_value: f64,
    ) -> Self {
        let ratio = if spindle > 0.0 {
            reference_value / spindle
        } else {
            f64::NAN
        };
        Self::with_ratio(name, unit, spindle, reference, reference_value, ratio)
    }
}

#[derive(Serialize)]
struct BenchReport<'a> {
    bench: &'a str,
    results: &'a [BenchResult],
}

/// Prints the results as a table, or as the JSON object of the convention.
pub fn print_report(bench: &str, results: &[BenchResult], json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(&BenchReport { bench, results })?
        );
        return Ok(());
    }
    let name_width = results
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let ref_width = results
        .iter()
        .map(|r| r.reference.len())
        .max()
        .unwrap_or(9)
        .max(9);
    println!(
        "{:<name_width$}  {:>14}  {:<ref_width$}  {:>14}  {:>7}  unit",
        "name", "spindle", "reference", "ref value", "ratio"
    );
    for r in results {
        println!(
            "{:<name_width$}  {:>14.3}  {:<ref_width$}  {:>14.3}  {:>7.2}  {}",
            r.name, r.spindle, r.reference, r.reference_value, r.ratio, r.unit
        );
    }
    Ok(())
}

/// Runs a benchmark that kills daemons on its own cluster in a scratch directory (never
/// the user's: `scratch`, else a new one under the temporary directory named after
/// `bench`): refuses a directory that already holds a cluster, stops the cluster however
/// `run` ends, and removes the directory unless `keep`.
pub fn in_scratch_cluster(
    bench: &str,
    scratch: Option<std::path::PathBuf>,
    keep: bool,
    run: impl FnOnce(&std::path::Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let scratch = scratch.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("spindle-bench-{bench}-{}", std::process::id()))
    });
    if scratch.join("cluster.json").exists() {
        anyhow::bail!(
            "{} already holds a cluster; give an empty --scratch directory",
            scratch.display()
        );
    }
    std::fs::create_dir_all(&scratch)?;
    let result = run(&scratch);
    let _ = spindle_cluster::down_quiet(spindle_cluster::Target {
        dir: scratch.clone(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    });
    if !keep {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    result
}

/// Starts an embedded cluster of one monitor and three daemons (with authentication) in
/// `scratch`, with `pg_count` placement groups in its pool and daemon `settings`; the
/// target to reach it. Pair it with [`in_scratch_cluster`], which stops it.
pub fn up_scratch(
    scratch: &std::path::Path,
    pg_count: u32,
    settings: spindle_cluster::SettingsArgs,
) -> anyhow::Result<spindle_cluster::Target> {
    let target = spindle_cluster::Target {
        dir: scratch.to_path_buf(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    spindle_cluster::up_quiet(spindle_cluster::UpArgs {
        no_auth: false,
        mons: Some(1),
        osds: 3,
        pg_count,
        wait_seconds: 90,
        settings,
        target: target.clone(),
    })?;
    Ok(target)
}
