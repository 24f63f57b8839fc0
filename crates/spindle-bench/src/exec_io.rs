//! `spindle bench exec-io`: programs beside I/O (issue #23). For each CPU budget of the
//! daemons' execution threads (`--exec-cpu-percent`), a fresh scratch cluster: fio 4 KiB
//! random writes at QD 4 through `spindle nbd`, alone and then while programs spin over
//! 32 MiB objects on every daemon (runs stopped by their instruction budget, back to back).
//! Reported: fio's p99 and IOPS with programs against alone (same cluster, same run), and
//! the CPU the execution threads got meanwhile (from `/proc`), so the trade between I/O
//! latency and program throughput is visible budget by budget.

use crate::common::{print_report, BenchResult};
use crate::fio::{fio_json, parse_figures, spindle_nbd_child, Engine, Figures, Point};
use clap::Args;
use spindle_client::{ExecOptions, ProgramCode};
use spindle_cluster::SettingsArgs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Objects the programs scan, and their size: big enough that a scan is real work, spread
/// over the primaries.
const OBJECTS: usize = 6;
const OBJECT_BYTES: usize = 32 << 20;

/// Scans its object again and again until the instruction budget stops it.
const SPIN: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    const uint64_t *v = (const uint64_t *)in->data;
    uint64_t n = in->data_len / 8, s = 0;
    for (uint64_t pass = 0; ; pass++)
        for (uint64_t i = 0; i < n; i++) s += v[i] ^ pass;
    return s;
}
"#;

#[derive(Args)]
pub struct BenchExecIoArgs {
    /// Seconds of each fio run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// CPU budgets to measure, in percent of a CPU per daemon.
    #[arg(long, value_delimiter = ',', default_values_t = [10u32, 25, 50, 100],
          value_parser = clap::value_parser!(u32).range(1..=6400))]
    pub budgets: Vec<u32>,
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
}

fn progress(line: &str) {
    eprintln!("bench exec-io: {line}");
}

/// fio 4k randwrite at QD4 over `uri` for `seconds`.
fn fio_write(uri: &str, seconds: u64) -> anyhow::Result<Figures> {
    let p = Point {
        bs: "4k".into(),
        rw: "randwrite".into(),
        iodepth: 4,
    };
    let mut a: Vec<String> = vec!["--name=exec-io".into()];
    a.extend(Engine::nbd(uri).engine_args().iter().cloned());
    a.extend([
        "--bs=4k".to_string(),
        "--rw=randwrite".into(),
        "--iodepth=4".into(),
        "--numjobs=1".into(),
        "--time_based=1".into(),
        format!("--runtime={seconds}"),
        "--ramp_time=1".into(),
        "--size=64m".into(),
        "--randseed=7".into(),
        "--group_reporting=1".into(),
    ]);
    let v = fio_json(&a, &[])?;
    Ok(parse_figures(&v, &p)?.0)
}

/// CPU seconds the execution threads (`osdN-execM`) of processes `pids` have used.
fn exec_threads_cpu_s(pids: &[u32]) -> anyhow::Result<f64> {
    let tps = crate::proc_cpu::clock_ticks_per_second();
    let mut ticks = 0;
    for pid in pids {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.contains("-exec") {
                let stat = std::fs::read_to_string(t.path().join("stat"))?;
                ticks += crate::proc_cpu::stat_cpu_ticks(&stat)?;
            }
        }
    }
    Ok(ticks as f64 / tps as f64)
}

/// One budget's figures: fio alone, fio with programs, execution threads' CPU share.
struct Measured {
    alone: Figures,
    with: Figures,
    /// CPU seconds per second the execution threads of all daemons used meanwhile.
    exec_cpus: f64,
}

fn measure(scratch: &Path, budget: u32, seconds: u64) -> anyhow::Result<Measured> {
    let target = crate::common::up_scratch(
        scratch,
        32,
        SettingsArgs {
            exec_cpu_percent: Some(u64::from(budget)),
            ..SettingsArgs::default()
        },
    )?;
    let rt = spindle_cluster::runtime()?;
    let spin = ProgramCode::new(spindle_prog::compile_c(SPIN).map_err(anyhow::Error::msg)?);
    let (client, pids) = rt.block_on(async {
        let client = Arc::new(target.client().await?);
        spindle_image::Image::create(client.clone(), "default", "bench", 256 << 20, 4 << 20)
            .await?;
        for i in 0..OBJECTS {
            let data: Vec<u8> = (0..OBJECT_BYTES).map(|j| (j as u8) ^ (i as u8)).collect();
            client
                .write_full("default", &format!("big{i}"), data)
                .await?;
        }
        let s = spindle_cluster::admin(&client, spindle_mon::Admin::status()).await?;
        let pids: Vec<u32> = s.osds.iter().map(|o| o.pid).collect();
        anyhow::Ok((client, pids))
    })?;
    let (_nbd, uri) = spindle_nbd_child(&target, "default", "bench", &[], "nbd-exec-io")?;
    let alone = fio_write(&uri, seconds)?;
    let flood: Vec<_> = (0..OBJECTS)
        .map(|i| {
            let (client, spin) = (client.clone(), spin.clone());
            rt.spawn(async move {
                let name = format!("big{i}");
                loop {
                    let r = client
                        .exec(
                            "default",
                            &[name.as_str()],
                            &spin,
                            &[],
                            ExecOptions {
                                jit: true,
                                cache: true,
                                shards: false,
                            },
                        )
                        .await;
                    match r {
                        Err(spindle_client::ClientError::Program(m))
                            if m.contains("instruction budget") => {}
                        other => return Err::<(), _>(anyhow::anyhow!("{name}: {other:?}")),
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, t0) = (exec_threads_cpu_s(&pids)?, Instant::now());
    let with = fio_write(&uri, seconds);
    let exec_cpus = (exec_threads_cpu_s(&pids)? - cpu0) / t0.elapsed().as_secs_f64();
    // A flood task that ended on its own met an error other than its budget: report it.
    for f in flood {
        if f.is_finished() {
            if let Ok(Err(e)) = rt.block_on(f) {
                return Err(e);
            }
        } else {
            f.abort();
        }
    }
    Ok(Measured {
        alone,
        with: with?,
        exec_cpus,
    })
}

pub fn run(args: BenchExecIoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.budgets.is_empty(), "no --budgets given");
    let mut results = Vec::new();
    for &budget in &args.budgets {
        let mut m = None;
        crate::common::in_scratch_cluster(
            &format!("exec-io-{budget}"),
            None,
            args.keep,
            |scratch| {
                m = Some(measure(scratch, budget, args.seconds)?);
                Ok(())
            },
        )?;
        let m = m.ok_or_else(|| anyhow::anyhow!("budget {budget} % was not measured"))?;
        progress(&format!(
            "--exec-cpu-percent {budget}: p99 {:.2} ms alone, {:.2} ms with programs ({:.2}x); \
             {:.0} IOPS alone, {:.0} with ({:.2}x); execution threads used {:.2} CPUs",
            m.alone.clat_p99_us / 1000.0,
            m.with.clat_p99_us / 1000.0,
            m.with.clat_p99_us / m.alone.clat_p99_us,
            m.alone.iops,
            m.with.iops,
            m.with.iops / m.alone.iops,
            m.exec_cpus
        ));
        results.push(BenchResult::lower_is_better(
            format!(
                "4k randwrite QD4 over NBD, p99 with programs at {budget} % of a CPU per daemon"
            ),
            "ms",
            m.with.clat_p99_us / 1000.0,
            "no programs",
            m.alone.clat_p99_us / 1000.0,
        ));
        results.push(BenchResult::higher_is_better(
            format!(
                "4k randwrite QD4 over NBD, IOPS with programs at {budget} % of a CPU per daemon"
            ),
            "IOPS",
            m.with.iops,
            "no programs",
            m.alone.iops,
        ));
        results.push(BenchResult::higher_is_better(
            format!("CPUs the execution threads of 3 daemons used at {budget} % each"),
            "CPUs",
            m.exec_cpus,
            "their budget",
            3.0 * f64::from(budget) / 100.0,
        ));
    }
    print_report("exec-io", &results, args.json)
}
