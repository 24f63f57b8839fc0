//! Cluster commands: `up`, `down`, `status`, `pool`, `osd`, and the object commands
//! `put`, `get`, `rm`, `ls`, `stat`. All find the embedded cluster through `--dir` /
//! `SPINDLE_DIR` (default `./spindle-data`), or a monitor through `--mon`.
//!
//! Embedded cluster layout: `DIR/cluster.json` (daemon count), `DIR/mon/` (database,
//! `addr`, `pid`, `log`), `DIR/osd.N/` (store, `pid`, `log`).

use crate::daemon::{runtime, write_atomic};
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;
use spindle_client::{Client, ClientConfig};
use spindle_mon::reply::{pg_summary, unsettled_pgs};
use spindle_mon::{Admin, OsdVerb, PoolCreated, RatioSet, Status};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How to find the cluster (every cluster subcommand takes these).
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// Embedded cluster directory.
    #[arg(
        long,
        env = "SPINDLE_DIR",
        default_value = "./spindle-data",
        global = true
    )]
    pub dir: PathBuf,
    /// Monitor address (overrides --dir for finding the monitor).
    #[arg(long, global = true)]
    pub mon: Option<String>,
}

impl Target {
    pub fn mon_addr(&self) -> anyhow::Result<String> {
        if let Some(m) = &self.mon {
            return Ok(m.clone());
        }
        let file = self.dir.join("mon").join("addr");
        std::fs::read_to_string(&file)
            .map(|s| s.trim().to_string())
            .map_err(|_| {
                anyhow!(
                    "no cluster found in {} (no {}); start one with `spindle up` or pass --mon ADDR",
                    self.dir.display(),
                    file.display()
                )
            })
    }

    pub async fn client(&self) -> anyhow::Result<Client> {
        let addr = self.mon_addr()?;
        Client::connect(ClientConfig::new(addr.clone()))
            .await
            .with_context(|| {
                format!(
                    "is the cluster in {} running? (`spindle up` starts it)",
                    self.dir.display()
                )
            })
    }
}

#[derive(Args)]
pub struct UpArgs {
    /// Number of storage daemons of a new cluster.
    #[arg(long, default_value_t = 3)]
    pub osds: u32,
    /// Placement groups of the default pool.
    #[arg(long, default_value_t = 64)]
    pub pg_count: u32,
    /// Seconds to wait for the cluster to become clean.
    #[arg(long, default_value_t = 60)]
    pub wait_seconds: u64,
    #[command(flatten)]
    pub settings: SettingsArgs,
    #[command(flatten)]
    pub target: Target,
}

/// Daemon settings of an embedded cluster, kept in `DIR/cluster.json` (given flags
/// replace the stored values; daemons pick them up when they start).
#[derive(Args, Clone, Debug, Default)]
pub struct SettingsArgs {
    /// Mark a daemon out (and re-create its data elsewhere) after it was down this long;
    /// 0 = never. Default 30000.
    #[arg(long)]
    pub out_after_ms: Option<u64>,
    /// Background recovery: objects each daemon recovers at once. Default 2.
    #[arg(long)]
    pub recovery_ops_max: Option<usize>,
    /// Background recovery: bytes per second per daemon; 0 = unlimited (default).
    #[arg(long)]
    pub recovery_bytes_per_sec: Option<u64>,
    /// Scrub every placement group this often; 0 = only `spindle scrub`. Default 1 day.
    #[arg(long)]
    pub scrub_interval_ms: Option<u64>,
}

const SETTING_KEYS: [&str; 4] = [
    "out_after_ms",
    "recovery_ops_max",
    "recovery_bytes_per_sec",
    "scrub_interval_ms",
];

impl SettingsArgs {
    fn values(&self) -> [Option<u64>; 4] {
        [
            self.out_after_ms,
            self.recovery_ops_max.map(|v| v as u64),
            self.recovery_bytes_per_sec,
            self.scrub_interval_ms,
        ]
    }
}

fn read_cluster_json(dir: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(dir.join("cluster.json"))
        .with_context(|| format!("no embedded cluster in {}", dir.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Stored setting `key` as command-line arguments for a daemon (nothing if unset).
fn setting_args(dir: &Path, keys: &[&str]) -> Vec<String> {
    let v = read_cluster_json(dir).unwrap_or(Value::Null);
    keys.iter()
        .filter_map(|k| {
            v["settings"][*k]
                .as_u64()
                .map(|n| [format!("--{}", k.replace('_', "-")), n.to_string()])
        })
        .flatten()
        .collect()
}

/// Merges given flags into `cluster.json`.
fn store_settings(dir: &Path, settings: &SettingsArgs) -> anyhow::Result<()> {
    let mut v = read_cluster_json(dir)?;
    for (k, val) in SETTING_KEYS.iter().zip(settings.values()) {
        if let Some(val) = val {
            v["settings"][*k] = serde_json::json!(val);
        }
    }
    write_atomic(&dir.join("cluster.json"), &v.to_string())
}

#[derive(Args)]
pub struct StatusArgs {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool: replicated (`--size`), or erasure-coded (`--erasure k=4,m=2`).
    Create {
        name: String,
        #[arg(long, default_value_t = 3)]
        size: u32,
        /// Copies (replicated) or shards (erasure-coded) that must be up for writes
        /// (default: 2 for size >= 3, else 1; k + 1 for erasure-coded pools).
        #[arg(long)]
        min_size: Option<u32>,
        #[arg(long, default_value_t = 64)]
        pg_count: u32,
        /// Erasure-code profile: `k=K,m=M[,matrix=isal-rs|isal-cauchy|jerasure-van]
        /// [,stripe-unit=BYTES][,min-size=N]` (Reed-Solomon; defaults isal-rs, 4096,
        /// k + 1). The client encodes; shard i lives on the i-th daemon of CRUSH's
        /// `indep` result.
        #[arg(long, conflicts_with = "size")]
        erasure: Option<String>,
    },
    /// List pools.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool (its objects become unreachable).
    Rm { name: String },
}

#[derive(Subcommand)]
pub enum OsdCommand {
    /// List storage daemons.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Mark a daemon out: its data will be placed elsewhere.
    Out { id: u32 },
    /// Mark a daemon in.
    In { id: u32 },
    /// Stop a daemon of the embedded cluster (SIGTERM).
    Stop { id: u32 },
    /// Start a daemon of the embedded cluster.
    Start { id: u32 },
    /// Add a storage daemon to the embedded cluster and start it; placement groups
    /// rebalance onto it in proportion to its weight.
    Add {
        /// CRUSH weight (1.0 = the weight of every daemon `spindle up` created).
        #[arg(long, default_value_t = 1.0)]
        weight: f64,
    },
    /// Run a storage daemon in the foreground (what `spindle up` starts).
    Run(crate::daemon::OsdRunArgs),
    /// Used/size ratio of a daemon's file system above which it is full: clients and
    /// daemons refuse new writes to pools on it (deletes still work). Default 0.95.
    SetFullRatio { ratio: f64 },
    /// Ratio above which a daemon is nearfull (a health warning). Default 0.85.
    SetNearfullRatio { ratio: f64 },
}

#[derive(Args)]
pub struct ObjArgs {
    /// Pool name.
    #[arg(long, default_value = "default")]
    pub pool: String,
}

/// True if `pid` is a live process (a zombie, e.g. a killed daemon whose parent is gone
/// and not reaped yet, counts as dead).
fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    pid > 0 && unsafe { libc::kill(pid as i32, 0) } == 0 && !zombie(pid)
}

fn read_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Starts `spindle ARGS` detached (own session), output appended to `log`.
fn spawn_daemon(args: &[String], log: &Path) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the spindle executable")?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("cannot start daemon")?;
    Ok(child.id())
}

fn osd_dir(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}"))
}

fn start_osd(dir: &Path, id: u32, mon: &str) -> anyhow::Result<u32> {
    let d = osd_dir(dir, id);
    std::fs::create_dir_all(&d)?;
    if let Some(pid) = read_pid(&d).filter(|&p| pid_alive(p)) {
        return Ok(pid);
    }
    let mut args: Vec<String> = vec![
        "osd".into(),
        "run".into(),
        "--id".into(),
        id.to_string(),
        "--dir".into(),
        d.display().to_string(),
        "--mon".into(),
        mon.to_string(),
    ];
    args.extend(setting_args(dir, &SETTING_KEYS[1..]));
    spawn_daemon(&args, &d.join("log"))
}

fn cluster_osd_count(dir: &Path) -> anyhow::Result<u32> {
    let v = read_cluster_json(dir)?;
    v["osds"]
        .as_u64()
        .map(|n| n as u32)
        .ok_or_else(|| anyhow!("cluster.json has no osd count"))
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    up_impl(args, false)
}

/// `up` without the report on stdout (for benchmarks that run their own cluster).
pub fn up_quiet(args: UpArgs) -> anyhow::Result<()> {
    up_impl(args, true)
}

fn up_impl(args: UpArgs, quiet: bool) -> anyhow::Result<()> {
    macro_rules! say {
        ($($t:tt)*) => {
            if !quiet {
                println!($($t)*);
            }
        };
    }
    let dir = args.target.dir.clone();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let mon_dir = dir.join("mon");
    let osds = match cluster_osd_count(&dir) {
        Ok(n) => n,
        Err(_) => {
            if args.osds == 0 {
                bail!("--osds must be at least 1");
            }
            let size = args.osds.min(3);
            let min_size = if size >= 2 { 2 } else { 1 };
            spindle_mon::init(
                &mon_dir,
                &spindle_mon::InitSpec {
                    osd_count: args.osds,
                    default_pool: Some(("default".into(), size, min_size, args.pg_count)),
                },
            )?;
            write_atomic(
                &dir.join("cluster.json"),
                &serde_json::json!({"osds": args.osds}).to_string(),
            )?;
            say!(
                "created a cluster of {} storage daemons in {} (pool 'default': {size} copies, min {min_size})",
                args.osds,
                dir.display()
            );
            args.osds
        }
    };
    store_settings(&dir, &args.settings)?;
    std::fs::create_dir_all(&mon_dir)?;
    let mon_pid = match read_pid(&mon_dir).filter(|&p| pid_alive(p)) {
        Some(p) => p,
        None => {
            let _ = std::fs::remove_file(mon_dir.join("pid"));
            let mut mon_args: Vec<String> = vec![
                "mon".into(),
                "run".into(),
                "--dir".into(),
                mon_dir.display().to_string(),
            ];
            mon_args.extend(setting_args(&dir, &SETTING_KEYS[..1]));
            spawn_daemon(&mon_args, &mon_dir.join("log"))?
        }
    };
    // The monitor writes its pid after binding: wait for it.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if read_pid(&mon_dir) == Some(mon_pid) {
            break;
        }
        if !pid_alive(mon_pid) || Instant::now() > deadline {
            bail!(
                "the monitor did not start; see {}",
                mon_dir.join("log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mon_addr = args
        .target
        .mon_addr()
        .or_else(|_| std::fs::read_to_string(mon_dir.join("addr")).map(|s| s.trim().to_string()))?;
    let mut pids = Vec::new();
    for id in 0..osds {
        pids.push(start_osd(&dir, id, &mon_addr)?);
    }
    let target = Target {
        dir: dir.clone(),
        mon: Some(mon_addr.clone()),
    };
    let rt = runtime()?;
    let status = rt.block_on(async {
        let client = target.client().await?;
        wait_clean(&client, Duration::from_secs(args.wait_seconds)).await
    })?;
    say!("monitor      {mon_addr} (pid {mon_pid})");
    for o in &status.osds {
        say!("osd.{:<8} {} (pid {})", o.id, o.addr, o.pid);
    }
    say!("epoch {}, pgs: {}", status.epoch, pg_summary(&status.pgs));
    say!();
    say!("use it:");
    say!("  export SPINDLE_DIR={}", dir.display());
    say!("  spindle put NAME FILE    spindle get NAME FILE    spindle ls");
    say!("  spindle status           spindle bench objects --seconds 10");
    say!(
        "  spindle down             (stops every daemon; data stays in {})",
        dir.display()
    );
    Ok(())
}

/// Runs an administrative command on the monitor and returns its typed answer.
pub async fn admin<R: serde::de::DeserializeOwned>(
    client: &Client,
    req: Admin<R>,
) -> anyhow::Result<R> {
    Ok(client.admin(&req).await?)
}

/// Waits until every daemon is up and every placement group is clean.
pub async fn wait_clean(client: &Client, timeout: Duration) -> anyhow::Result<Status> {
    let deadline = Instant::now() + timeout;
    loop {
        let status = admin(client, Admin::status()).await?;
        let all_up = status.osds.iter().all(|o| o.up || !o.in_cluster);
        let pgs = &status.pgs;
        // Inconsistent groups serve; they do not get better by waiting.
        if all_up && unsettled_pgs(pgs) == 0 {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!(
                "cluster not clean after {} s: pgs {}; daemons up: {}",
                timeout.as_secs(),
                pg_summary(pgs),
                status.osds.iter().filter(|o| o.up).count()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stop_pid(pid: u32, what: &str) -> anyhow::Result<()> {
    if !pid_alive(pid) {
        return Ok(());
    }
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(pid) {
        if Instant::now() > deadline {
            eprintln!("{what} (pid {pid}) did not stop in 10 s; killing it");
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

pub fn down(target: Target) -> anyhow::Result<()> {
    down_impl(target, false)
}

/// `down` without the report on stdout.
pub fn down_quiet(target: Target) -> anyhow::Result<()> {
    down_impl(target, true)
}

fn down_impl(target: Target, quiet: bool) -> anyhow::Result<()> {
    let dir = &target.dir;
    let osds = cluster_osd_count(dir)?;
    for id in 0..osds {
        if let Some(pid) = read_pid(&osd_dir(dir, id)) {
            stop_pid(pid, &format!("osd.{id}"))?;
        }
    }
    if let Some(pid) = read_pid(&dir.join("mon")) {
        stop_pid(pid, "monitor")?;
    }
    if !quiet {
        println!("stopped the cluster in {}", dir.display());
    }
    Ok(())
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = args.target.client().await?;
        let s = admin(&client, Admin::status()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&s)?);
            return Ok(());
        }
        println!("cluster {}  epoch {}", s.cluster_id, s.epoch);
        println!("health: {}", s.health.status);
        for c in &s.health.checks {
            println!("    {} {}: {}", c.severity, c.name, c.message);
        }
        let osds = &s.osds;
        let up = osds.iter().filter(|o| o.up).count();
        let inn = osds.iter().filter(|o| o.in_cluster).count();
        println!("osds: {} total, {up} up, {inn} in", osds.len());
        for o in osds {
            let (Some(total), Some(used)) = (o.total_bytes, o.used_bytes) else {
                continue;
            };
            let flag = if !o.healthy {
                "  UNHEALTHY"
            } else if o.full {
                "  full"
            } else if o.nearfull {
                "  nearfull"
            } else {
                ""
            };
            println!(
                "    osd.{}: {:.1} MiB used, {:.1} MiB available of {:.1} MiB ({:.0}%){flag}",
                o.id,
                used as f64 / 1048576.0,
                o.avail_bytes.unwrap_or(0) as f64 / 1048576.0,
                total as f64 / 1048576.0,
                if total > 0 {
                    used as f64 * 100.0 / total as f64
                } else {
                    0.0
                }
            );
        }
        println!("pgs: {}   objects: {}", pg_summary(&s.pgs), s.objects);
        let rec = &s.recovery;
        if rec.objects_left > 0 || rec.bytes_per_sec > 0.0 {
            println!(
                "recovery: {} object copies ({:.1} MiB) left, {:.1} MiB/s, {:.0} objects/s",
                rec.objects_left,
                rec.bytes_left as f64 / 1048576.0,
                rec.bytes_per_sec / 1048576.0,
                rec.objects_per_sec
            );
        }
        for p in &s.pools {
            println!(
                "pool {} '{}': {} copies (min {}), {} pgs, {} objects, pgs {}",
                p.id,
                p.name,
                p.size,
                p.min_size,
                p.pg_count,
                p.objects,
                pg_summary(&p.pgs)
            );
            let left = p.recovery.objects_left;
            if left > 0 {
                println!(
                    "    recovering: {left} object copies, {:.1} MiB left",
                    p.recovery.bytes_left as f64 / 1048576.0
                );
            }
        }
        anyhow::Ok(())
    })
}

pub fn pool(command: PoolCommand, target: Target) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = target.client().await?;
        match command {
            PoolCommand::Create {
                name,
                erasure: Some(profile),
                min_size,
                pg_count,
                ..
            } => {
                let p = parse_erasure_profile(&profile, min_size)?;
                // The matrix goes by name: the monitor names the known ones if it is not.
                let r: PoolCreated = client
                    .command_as(
                        [
                            "pool",
                            "create-ec",
                            &name,
                            &p.k.to_string(),
                            &p.m.to_string(),
                            &p.min_size.to_string(),
                            &p.matrix,
                            &p.stripe_unit.to_string(),
                            &pg_count.to_string(),
                        ]
                        .map(String::from)
                        .to_vec(),
                    )
                    .await?;
                println!(
                    "created erasure-coded pool '{name}' (k={}, m={}, {}, stripe unit {} B, \
                     min_size {}; id {}, epoch {})",
                    p.k, p.m, p.matrix, p.stripe_unit, p.min_size, r.id, r.epoch
                );
            }
            PoolCommand::Create {
                name,
                size,
                min_size,
                pg_count,
                erasure: None,
            } => {
                let min_size = min_size.unwrap_or(if size >= 3 { 2 } else { 1 });
                let r = admin(&client, Admin::pool_create(&name, size, min_size, pg_count)).await?;
                println!("created pool '{name}' (id {}, epoch {})", r.id, r.epoch);
            }
            PoolCommand::Ls { json } => {
                let r = admin(&client, Admin::pool_ls()).await?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    for p in &r {
                        let kind = match &p.erasure {
                            Some(e) => format!(
                                "erasure k={} m={} {} su={}",
                                e.k,
                                e.m,
                                e.matrix.as_deref().unwrap_or("?"),
                                e.stripe_unit
                            ),
                            None => "replicated".to_string(),
                        };
                        println!(
                            "{}\t{}\t{kind}\tsize {}\tmin_size {}\tpgs {}",
                            p.id, p.name, p.size, p.min_size, p.pg_count
                        );
                    }
                }
            }
            PoolCommand::Rm { name } => {
                admin(&client, Admin::pool_rm(&name)).await?;
                println!("removed pool '{name}'");
            }
        }
        anyhow::Ok(())
    })
}

/// A parsed `--erasure` profile.
#[derive(Debug, PartialEq)]
pub struct ErasureProfile {
    pub k: u32,
    pub m: u32,
    pub matrix: String,
    pub stripe_unit: u32,
    pub min_size: u32,
}

/// Parses `k=4,m=2[,matrix=..][,stripe-unit=..][,min-size=..]`.
pub fn parse_erasure_profile(text: &str, min_size: Option<u32>) -> anyhow::Result<ErasureProfile> {
    let (mut k, mut m, mut matrix, mut stripe_unit, mut ms) =
        (None, None, "isal-rs".to_string(), 4096u32, min_size);
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .with_context(|| format!("'{part}' in the erasure profile is not key=value"))?;
        let num = |v: &str| {
            v.parse::<u32>()
                .with_context(|| format!("{key} must be a number, got '{v}'"))
        };
        match key.trim() {
            "k" => k = Some(num(value)?),
            "m" => m = Some(num(value)?),
            "matrix" => matrix = value.to_string(),
            "stripe-unit" | "stripe_unit" => stripe_unit = num(value)?,
            "min-size" | "min_size" => ms = Some(num(value)?),
            other => anyhow::bail!(
                "unknown erasure profile key '{other}' (k, m, matrix, stripe-unit, min-size)"
            ),
        }
    }
    let k = k.context("the erasure profile needs k=<data shards>")?;
    let m = m.context("the erasure profile needs m=<parity shards>")?;
    Ok(ErasureProfile {
        k,
        m,
        matrix,
        stripe_unit,
        min_size: ms.unwrap_or((k + 1).min(k + m)),
    })
}

pub fn osd(command: OsdCommand, target: Target) -> anyhow::Result<()> {
    match command {
        OsdCommand::Run(args) => crate::daemon::osd_run(args),
        OsdCommand::Stop { id } => {
            let d = osd_dir(&target.dir, id);
            let pid = read_pid(&d)
                .ok_or_else(|| anyhow!("osd.{id} has no pid file in {}", d.display()))?;
            stop_pid(pid, &format!("osd.{id}"))?;
            println!("stopped osd.{id}");
            Ok(())
        }
        OsdCommand::Add { weight } => {
            let dir = target.dir.clone();
            let count = cluster_osd_count(&dir)?;
            let mon = target.mon_addr()?;
            let id = runtime()?.block_on(async {
                let client = target.client().await?;
                let r = admin(&client, Admin::osd_add(weight)).await?;
                anyhow::Ok(r.osd)
            })?;
            if id + 1 > count {
                let mut v = read_cluster_json(&dir)?;
                v["osds"] = serde_json::json!(id + 1);
                write_atomic(&dir.join("cluster.json"), &v.to_string())?;
            }
            let pid = start_osd(&dir, id, &mon)?;
            println!("added osd.{id} (weight {weight}, pid {pid}); data is rebalancing (see `spindle status`)");
            Ok(())
        }
        OsdCommand::Start { id } => {
            let mon = target.mon_addr()?;
            let pid = start_osd(&target.dir, id, &mon)?;
            println!("started osd.{id} (pid {pid})");
            Ok(())
        }
        OsdCommand::Ls { json } => runtime()?.block_on(async {
            let client = target.client().await?;
            let s = admin(&client, Admin::status()).await?;
            if json {
                println!("{}", serde_json::to_string(&s.osds)?);
            } else {
                for o in &s.osds {
                    println!(
                        "osd.{}\t{}\t{}\t{}\tpid {}",
                        o.id,
                        if o.up { "up" } else { "down" },
                        if o.in_cluster { "in" } else { "out" },
                        o.addr,
                        o.pid
                    );
                }
            }
            anyhow::Ok(())
        }),
        OsdCommand::SetFullRatio { ratio } | OsdCommand::SetNearfullRatio { ratio } => {
            let verb = if matches!(command, OsdCommand::SetFullRatio { .. }) {
                "set-full-ratio"
            } else {
                "set-nearfull-ratio"
            };
            runtime()?.block_on(async {
                let client = target.client().await?;
                // The ratio goes as given: the monitor checks it is in (0, 1].
                let r: RatioSet = client
                    .command_as(vec!["osd".into(), verb.into(), ratio.to_string()])
                    .await?;
                println!("{verb} {} (epoch {})", r.ratio, r.epoch);
                anyhow::Ok(())
            })
        }
        OsdCommand::Out { id } | OsdCommand::In { id } => {
            let verb = if matches!(command, OsdCommand::Out { .. }) {
                OsdVerb::Out
            } else {
                OsdVerb::In
            };
            runtime()?.block_on(async {
                let client = target.client().await?;
                let r = admin(&client, Admin::osd(verb, id)).await?;
                println!("marked osd.{id} {} (epoch {})", verb.as_str(), r.epoch);
                anyhow::Ok(())
            })
        }
    }
}

pub fn put(args: ObjArgs, target: Target, name: String, file: PathBuf) -> anyhow::Result<()> {
    let data = if file.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
        v
    } else {
        std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?
    };
    runtime()?.block_on(async {
        let client = target.client().await?;
        let len = data.len();
        let v = client.write_full(&args.pool, &name, data).await?;
        println!("wrote {name} ({len} bytes, version {}.{})", v.epoch, v.seq);
        anyhow::Ok(())
    })
}

pub fn get(args: ObjArgs, target: Target, name: String, file: PathBuf) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = target.client().await?;
        let data = client.read_full(&args.pool, &name).await?;
        if file.as_os_str() == "-" {
            std::io::Write::write_all(&mut std::io::stdout(), &data)?;
        } else {
            std::fs::write(&file, &data).with_context(|| format!("writing {}", file.display()))?;
        }
        anyhow::Ok(())
    })
}

pub fn rm(args: ObjArgs, target: Target, name: String) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        target.client().await?.delete(&args.pool, &name).await?;
        anyhow::Ok(())
    })
}

pub fn stat(args: ObjArgs, target: Target, name: String, json: bool) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let s = target.client().await?.stat(&args.pool, &name).await?;
        if json {
            println!(
                "{}",
                serde_json::json!({"name": name, "size_bytes": s.size_bytes,
                    "version": format!("{}.{}", s.version.epoch, s.version.seq)})
            );
        } else {
            println!(
                "{name}\t{} bytes\tversion {}.{}",
                s.size_bytes, s.version.epoch, s.version.seq
            );
        }
        anyhow::Ok(())
    })
}

pub fn ls(args: ObjArgs, target: Target, json: bool) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let list = target.client().await?.list(&args.pool).await?;
        if json {
            let v: Vec<Value> = list
                .iter()
                .map(|l| serde_json::json!({"name": l.name, "size_bytes": l.size_bytes}))
                .collect();
            println!("{}", Value::Array(v));
        } else {
            for l in list {
                println!("{}\t{}", l.name, l.size_bytes);
            }
        }
        anyhow::Ok(())
    })
}

#[derive(Args)]
pub struct ScrubArgs {
    /// Pool to scrub (default: every pool).
    pub pool: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `spindle scrub [POOL]`: compare every copy now and repair bad ones. Objects with no
/// intact copy are listed (`pool/pg name`) and make the command fail (exit status 1).
pub fn scrub(args: ScrubArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = args.target.client().await?;
        let pools: Vec<String> = match &args.pool {
            Some(p) => vec![p.clone()],
            None => client
                .map()
                .pools
                .values()
                .map(|p| p.name.clone())
                .collect(),
        };
        let mut out = Vec::new();
        let mut damaged_total = 0;
        for pool in pools {
            let started = Instant::now();
            let s = client.scrub(&pool).await?;
            damaged_total += s.damaged.len();
            if !args.json {
                println!(
                    "pool '{pool}': {} pgs, {} objects scrubbed, {} bad copies found, {} repaired, \
                     {} objects with no intact copy ({:.1} s)",
                    s.pgs,
                    s.objects,
                    s.inconsistent,
                    s.repaired,
                    s.damaged.len(),
                    started.elapsed().as_secs_f64()
                );
                for d in &s.damaged {
                    println!("no intact copy: {pool}/{} {}", d.pg, d.name);
                }
            }
            let damaged: Vec<Value> = s
                .damaged
                .iter()
                .map(|d| serde_json::json!({"pg": d.pg.to_string(), "name": d.name}))
                .collect();
            out.push(
                serde_json::json!({"pool": pool, "pgs": s.pgs, "objects": s.objects,
                "inconsistent": s.inconsistent, "repaired": s.repaired,
                "damaged_objects": s.damaged.len(), "damaged": damaged}),
            );
        }
        if args.json {
            println!("{}", Value::Array(out));
        }
        if damaged_total > 0 {
            bail!(
                "{damaged_total} object(s) have no intact copy and cannot be repaired; \
                 overwrite or delete them ('spindle status' names their placement groups)"
            );
        }
        anyhow::Ok(())
    })
}
