//! Programs beside I/O (issue #23): fio writes 4 KiB blocks to an image through the real
//! NBD server, first alone, then while every daemon's execution thread is kept busy by
//! programs that spin over 32 MiB objects until their instruction budget stops them.
//! fio's p99 latency and IOPS are printed for both, with the CPU the execution threads
//! used meanwhile (read from `/proc`). Asserted, with the daemons' default CPU budget for
//! programs (25 % of a CPU each, `cpu_budget.rs`): the programs did run (at least a
//! quarter of their budget: they run under `SCHED_IDLE` on a saturated machine), they kept to their budget, and I/O kept its latency (p99 within 2x + 3 ms,
//! at least half the IOPS) on a 2-core machine already saturated by fio, the NBD server
//! and 3 daemons.

mod common;

use common::{ok, run_ok, spindle, Cluster, NbdProc};
use spindle_client::{ClientError, ExecOptions, ProgramCode};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Scans the object again and again: stopped by the instruction budget (2e9), which takes
/// seconds of CPU each run.
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

/// fio: 4 KiB random writes at queue depth 4 for `secs` seconds; p99 completion latency
/// in milliseconds, and IOPS.
fn fio_p99_ms(uri: &str, secs: u64) -> (f64, f64) {
    let out = Command::new("fio")
        .args([
            "--name=isolation",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=4",
            "--size=64m",
            "--time_based=1",
            "--ramp_time=1",
            &format!("--runtime={secs}"),
            "--randseed=7",
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("fio (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: serde_json::Value =
        serde_json::from_str(&text[text.find('{').expect("fio JSON")..]).expect("fio JSON");
    let w = &doc["jobs"][0]["write"];
    let p99_ns = w["clat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .expect("p99");
    (p99_ns / 1e6, w["iops"].as_f64().expect("iops"))
}

/// CPU seconds used so far by the execution threads (`osdN-execM`) of the daemons `pids`.
fn exec_threads_cpu_s(pids: &[i32]) -> f64 {
    // SAFETY: sysconf has no memory arguments.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ticks = 0u64;
    let mut threads = 0;
    for pid in pids {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("daemon threads");
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if !comm.contains("-exec") {
                continue;
            }
            threads += 1;
            let stat = std::fs::read_to_string(t.path().join("stat")).expect("thread stat");
            // Fields after the command (which ends at the last ')'): state is field 3,
            // utime and stime are fields 14 and 15.
            let rest: Vec<&str> = stat[stat.rfind(')').expect("stat") + 2..]
                .split(' ')
                .collect();
            ticks +=
                rest[11].parse::<u64>().expect("utime") + rest[12].parse::<u64>().expect("stime");
        }
    }
    assert_eq!(threads, pids.len(), "one execution thread per daemon");
    ticks as f64 / ticks_per_s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_keeps_its_latency_while_programs_spin_on_every_daemon() {
    let c = Cluster::start("exec-isolation", 3, 16);
    ok(&c, &["image", "create", "vol", "--size", "256M"]);
    let nbd = NbdProc::start(&c);
    let uri = nbd.uri("vol");
    let client = c.client().await;
    // Big objects spread over the primaries.
    let big: Vec<String> = (0..6).map(|i| format!("big{i}")).collect();
    for (i, name) in big.iter().enumerate() {
        let data: Vec<u8> = (0..32u32 << 20).map(|j| (j as u8) ^ (i as u8)).collect();
        client.write_full("default", name, data).await.unwrap();
    }
    let spin = ProgramCode::new(spindle_prog::compile_c(SPIN).expect("clang"));

    let (p99_before, iops_before) = fio_p99_ms(&uri, 8);

    let stop = Arc::new(AtomicBool::new(false));
    let stopped_runs = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for name in big.clone() {
        let (client, spin, stop, stopped_runs) = (
            client.clone(),
            spin.clone(),
            stop.clone(),
            stopped_runs.clone(),
        );
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
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
                    Err(ClientError::Program(m)) if m.contains("instruction budget") => {
                        stopped_runs.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("{name}: {other:?}"),
                }
            }
        }));
    }
    // Let every execution thread get busy.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let pids: Vec<i32> = (0..c.osds)
        .map(|id| Cluster::pid(&c.osd_dir(id)).expect("daemon pid"))
        .collect();
    let (cpu0, t0) = (exec_threads_cpu_s(&pids), std::time::Instant::now());
    let (p99_during, iops_during) = tokio::task::spawn_blocking(move || fio_p99_ms(&uri, 8))
        .await
        .unwrap();
    let window_s = t0.elapsed().as_secs_f64();
    let exec_cpu_s = exec_threads_cpu_s(&pids) - cpu0;
    let runs_during = stopped_runs.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    // Each daemon's execution threads may use 25 % of a CPU (the default).
    let budget_s = 0.25 * pids.len() as f64 * window_s;
    eprintln!(
        "fio 4k randwrite QD4 through NBD: p99 {p99_before:.2} ms, {iops_before:.0} IOPS alone; \
         p99 {p99_during:.2} ms, {iops_during:.0} IOPS with programs spinning on every daemon \
         (execution threads used {exec_cpu_s:.2} CPU-s of a {budget_s:.2} CPU-s budget in \
         {window_s:.1} s; {runs_during} runs stopped by their instruction budget)"
    );
    assert!(
        exec_cpu_s >= 0.25 * budget_s,
        "the programs hardly ran during the fio job: {exec_cpu_s:.2} CPU-s of {budget_s:.2}"
    );
    assert!(
        exec_cpu_s <= 1.25 * budget_s + 0.1,
        "the execution threads overran their budget: {exec_cpu_s:.2} CPU-s of {budget_s:.2}"
    );
    assert!(
        p99_during <= 2.0 * p99_before + 3.0,
        "p99 {p99_during:.2} ms with programs running, {p99_before:.2} ms without"
    );
    assert!(
        iops_during >= 0.5 * iops_before,
        "{iops_during:.0} IOPS with programs running, {iops_before:.0} without"
    );
    drop(nbd);
    let _ = run_ok(spindle().args(["down", "--dir"]).arg(&c.dir));
}
