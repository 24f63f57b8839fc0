//! `spindle bench zarr` (issue #24): Zarr arrays through the Python package's
//! `SpindleStore` beside zarr's `LocalStore` on the same disk, and a whole-array sum
//! pushed down to the daemons against read-and-sum. The measuring is Python's own
//! (`python -m spindle.bench`, `python/spindle/bench.py`): this command starts a scratch
//! cluster (3 daemons, 3-way replicated pool), runs it with `.venv`'s Python (or
//! `SPINDLE_PYTHON`) and stops the cluster however it ends. Its output, a table or with
//! `--json` the JSON object every `spindle bench` prints, is the Python module's.

use anyhow::Context;

#[derive(clap::Args)]
pub struct BenchZarrArgs {
    /// Size of the array, in GiB.
    #[arg(long, default_value_t = 4.0)]
    size_gib: f64,
    /// Chunk sizes in KiB, comma-separated.
    #[arg(long, default_value = "1024,64")]
    chunk_kib: String,
    /// Share of one CPU each daemon's execution threads may use (`spindle up
    /// --exec-cpu-percent`). Default 100, as `spindle bench ssb`: a cluster whose job is
    /// the arrays; a cluster also serving other I/O keeps the default of 25.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=6400))]
    exec_cpu_percent: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the scratch directory.
    #[arg(long)]
    keep: bool,
}

pub fn run(args: BenchZarrArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.size_gib > 0.0 && args.size_gib <= 64.0,
        "--size-gib: between 0 and 64"
    );
    let python = crate::ssb::python()?;
    crate::common::in_scratch_cluster("zarr", None, args.keep, |scratch| {
        crate::common::up_scratch(
            scratch,
            64,
            spindle_cluster::SettingsArgs {
                exec_cpu_percent: Some(u64::from(args.exec_cpu_percent)),
                ..Default::default()
            },
        )?;
        eprintln!(
            "bench zarr: daemons' execution threads: {} % of a CPU each (--exec-cpu-percent)",
            args.exec_cpu_percent
        );
        let local = scratch.join("local");
        std::fs::create_dir_all(&local)?;
        let mut cmd = std::process::Command::new(&python);
        cmd.args(["-m", "spindle.bench", "--dir"])
            .arg(scratch)
            .arg("--size-gib")
            .arg(args.size_gib.to_string())
            .arg("--chunk-kib")
            .arg(&args.chunk_kib)
            .arg("--scratch")
            .arg(&local);
        if args.json {
            cmd.arg("--json");
        }
        let status = cmd
            .status()
            .with_context(|| format!("running {}", python.display()))?;
        anyhow::ensure!(
            status.success(),
            "python -m spindle.bench failed ({status}); is the package installed in {}? \
             (scripts/test.sh builds it into .venv; or pip install ./python)",
            python.display()
        );
        Ok(())
    })
}
