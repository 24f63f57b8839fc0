//! The cost of authentication and frame integrity (issue #20): the same fio runs over NBD
//! on fresh scratch clusters, one made with keys (every connection authenticated, every
//! frame carrying a keyed BLAKE3 MAC), one with keys and `--encrypt` (every payload sealed
//! with ChaCha20-Poly1305) and one with `--no-auth`, alternated (on, encrypted, off, on,
//! ...) so drift of the machine hits all alike; the better run of each counts. Target:
//! authentication costs at most 5% of 4k random-write IOPS at QD16 (encryption is
//! optional and reported, without a target).

use crate::common::BenchResult;
use crate::fio::{fio_json, parse_figures, spindle_nbd_child, Engine, Point};
use spindle_cluster::{SettingsArgs, Target, UpArgs};
use std::path::Path;
use std::sync::Arc;

/// At most this share of 4k IOPS may go to authentication and frame MACs.
const AUTH_COST_MAX: f64 = 0.05;
const IMAGE_BYTES: u64 = 1 << 30;

/// How a scratch cluster's connections are protected.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Authenticated, frames MACed.
    Mac,
    /// Authenticated, payloads encrypted.
    Encrypted,
    /// No authentication.
    Off,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Mac => "auth-on",
            Mode::Encrypted => "auth-encrypted",
            Mode::Off => "auth-off",
        }
    }
}

/// CPU time of every process of the scratch cluster in `dir` and of `extra`, in µs.
fn cluster_cpu_us(dir: &Path, extra: u32) -> anyhow::Result<u64> {
    let mut pids = vec![extra];
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path().join("pid");
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                pids.push(pid);
            }
        }
    }
    pids.iter()
        .map(|&p| crate::proc_cpu::process_cpu_us(p))
        .sum::<anyhow::Result<u64>>()
}

/// (4k randwrite IOPS, 512k write MB/s, CPU µs per 4k write over every process) of one
/// cluster.
fn measure(scratch: &Path, mode: Mode, seconds: u64) -> anyhow::Result<(f64, f64, f64)> {
    let auth = mode != Mode::Off;
    let target = Target {
        dir: scratch.to_path_buf(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    spindle_cluster::up_quiet(UpArgs {
        no_auth: !auth,
        mons: Some(1),
        osds: 3,
        pg_count: 32,
        wait_seconds: 60,
        settings: SettingsArgs {
            encrypt: Some(mode == Mode::Encrypted),
            ..SettingsArgs::default()
        },
        target: target.clone(),
    })?;
    if auth != scratch.join("keyring").exists() {
        anyhow::bail!("the scratch cluster's authentication is not what was asked");
    }
    let encrypting = spindle_cluster::encrypt_args(scratch).len() == 1;
    if encrypting != (mode == Mode::Encrypted) {
        anyhow::bail!("the scratch cluster's encryption is not what was asked");
    }
    spindle_cluster::runtime()?.block_on(async {
        let client = Arc::new(target.client().await?);
        spindle_image::Image::create(client, "default", "bench", IMAGE_BYTES, 4 << 20).await?;
        anyhow::Ok(())
    })?;
    let (nbd, uri) = spindle_nbd_child(&target, "default", "bench", &[], "nbd-auth")?;
    let engine = Engine::nbd(&uri);
    let run = |bs: &str, rw: &str| -> anyhow::Result<f64> {
        let p = Point {
            bs: bs.into(),
            rw: rw.into(),
            iodepth: 16,
        };
        let mut a: Vec<String> = vec!["--name=auth-cost".into()];
        a.extend(engine.engine_args().iter().cloned());
        a.extend([
            format!("--bs={bs}"),
            format!("--rw={rw}"),
            "--iodepth=16".into(),
            "--numjobs=1".into(),
            "--direct=1".into(),
            "--time_based=1".into(),
            format!("--runtime={seconds}"),
            "--ramp_time=2".into(),
            "--size=512m".into(),
            "--randseed=20".into(),
            "--group_reporting=1".into(),
        ]);
        let v = fio_json(&a, &[])?;
        let (f, _) = parse_figures(&v, &p)?;
        Ok(if bs == "4k" { f.iops } else { f.mb_per_s })
    };
    // CPU per write: less noisy than IOPS on a machine whose disk sets the pace; the
    // 2 s ramp is counted at the measured rate.
    let cpu_before = cluster_cpu_us(scratch, nbd.pid())?;
    let iops = run("4k", "randwrite")?;
    let cpu_us = cluster_cpu_us(scratch, nbd.pid())?.saturating_sub(cpu_before);
    let cpu_per_write = cpu_us as f64 / (iops * (seconds + 2) as f64).max(1.0);
    let mb_s = run("512k", "write")?;
    Ok((iops, mb_s, cpu_per_write))
}

/// Runs the comparison (`rounds` clusters of each kind, alternated) and returns its
/// results; `progress` prints a line.
pub fn auth_cost(
    seconds: u64,
    rounds: u32,
    keep: bool,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<BenchResult>> {
    // Best (4k IOPS, 512k MB/s) of each mode, and the least CPU per 4k write.
    let mut best = [(0.0f64, 0.0f64); 3];
    let mut cpu = [f64::INFINITY; 3];
    let modes = [Mode::Mac, Mode::Encrypted, Mode::Off];
    for round in 0..rounds.max(1) {
        for (i, mode) in modes.into_iter().enumerate() {
            let mut got = (0.0, 0.0, 0.0);
            crate::common::in_scratch_cluster(mode.name(), None, keep, |scratch| {
                got = measure(scratch, mode, seconds)?;
                Ok(())
            })?;
            progress(&format!(
                "round {}: {}: 4k randwrite QD16 {:.0} IOPS ({:.0} us of CPU per write), 512k write QD16 {:.0} MB/s",
                round + 1,
                mode.name(),
                got.0,
                got.2,
                got.1
            ));
            best[i].0 = best[i].0.max(got.0);
            best[i].1 = best[i].1.max(got.1);
            cpu[i] = cpu[i].min(got.2);
        }
    }
    let [on, encrypted, off] = best;
    Ok(vec![
        BenchResult::higher_is_better(
            "4k randwrite QD16 over NBD, authenticated (IOPS; reference: same without authentication)",
            "IOPS",
            on.0,
            "no authentication",
            off.0,
        ),
        BenchResult::higher_is_better(
            "512k write QD16 over NBD, authenticated (MB/s; reference: same without authentication)",
            "MB/s",
            on.1,
            "no authentication",
            off.1,
        ),
        BenchResult::lower_is_better(
            "CPU per 4k randwrite over NBD, all processes, authenticated (least of the rounds)",
            "us",
            cpu[0],
            "no authentication",
            cpu[2],
        ),
        BenchResult::higher_is_better(
            "4k IOPS kept with authentication (target: at least 0.95)",
            "ratio",
            on.0 / off.0,
            "target",
            1.0 - AUTH_COST_MAX,
        ),
        BenchResult::higher_is_better(
            "4k randwrite QD16 over NBD, authenticated and encrypted (IOPS; reference: same without authentication)",
            "IOPS",
            encrypted.0,
            "no authentication",
            off.0,
        ),
        BenchResult::higher_is_better(
            "512k write QD16 over NBD, authenticated and encrypted (MB/s; reference: same without authentication)",
            "MB/s",
            encrypted.1,
            "no authentication",
            off.1,
        ),
    ])
}
