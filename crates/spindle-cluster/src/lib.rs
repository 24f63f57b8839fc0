//! `spindle-cluster`: the embedded-cluster process manager behind `spindle up`, `spindle
//! down`, `spindle osd start/stop/add` and the benchmarks that run their own cluster. It
//! starts the monitor and the storage daemons as detached `spindle mon run` / `spindle
//! osd run` processes of the running executable, finds them again through their pid
//! files, stops them, and waits for a cluster to become clean.
//!
//! Embedded cluster layout: `DIR/cluster.json` (daemon count, settings), `DIR/mon/`
//! (database, `addr`, `pid`, `log`), `DIR/osd.N/` (store, `pid`, `log`).

pub mod config;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde_json::Value;
use spindle_client::{Client, ClientConfig};
use spindle_mon::reply::{pg_summary, unsettled_pgs};
use spindle_mon::{Admin, Status};
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
    /// Keyring file with this client's key (default: DIR/keyring if it exists; a cluster
    /// made with `spindle up --no-auth` needs none).
    #[arg(long, env = "SPINDLE_KEYRING", global = true)]
    pub keyring: Option<PathBuf>,
    /// The entity to authenticate as.
    #[arg(
        long = "name",
        id = "auth_entity",
        env = "SPINDLE_NAME",
        default_value = "client.admin",
        global = true
    )]
    pub entity: String,
}

impl Target {
    /// The monitor addresses, comma-separated: `--mon`, else every monitor of the
    /// embedded cluster in `--dir`.
    pub fn mon_addr(&self) -> anyhow::Result<String> {
        if let Some(m) = &self.mon {
            return Ok(m.clone());
        }
        let addrs: Vec<String> = mon_ids(&self.dir)
            .into_iter()
            .filter_map(|id| {
                std::fs::read_to_string(mon_dir(&self.dir, id).join("addr"))
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .collect();
        if addrs.is_empty() {
            bail!(
                "no cluster found in {} (no monitor address in {}); start one with `spindle up` or pass --mon ADDR",
                self.dir.display(),
                mon_dir(&self.dir, 0).join("addr").display()
            );
        }
        Ok(addrs.join(","))
    }

    /// The identity to authenticate with: `--keyring`, else `DIR/keyring` if it exists
    /// (None: a cluster without authentication).
    pub fn identity(&self) -> anyhow::Result<Option<spindle_proto::auth::Identity>> {
        let path = match &self.keyring {
            Some(p) => p.clone(),
            None => self.dir.join(KEYRING),
        };
        if self.keyring.is_none() && !path.exists() {
            return Ok(None);
        }
        let k = spindle_proto::auth::Keyring::load(&path)?;
        Ok(Some(k.identity(&self.entity)?))
    }

    /// A client configuration for this target (monitors and identity).
    pub fn client_config(&self) -> anyhow::Result<ClientConfig> {
        let mut c = ClientConfig::new(self.mon_addr()?);
        c.auth = self.identity()?;
        c.metrics_listen = std::env::var(CLIENT_METRICS_ENV)
            .ok()
            .filter(|v| !v.is_empty());
        Ok(c)
    }

    /// A client of the cluster; with [`CLIENT_METRICS_ENV`] set, serving its metrics
    /// there (the address printed on standard error).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let r = Client::connect(self.client_config()?).await;
        if let Ok(c) = &r {
            if let Some(addr) = c.metrics_addr() {
                eprintln!("client metrics: http://{addr}/metrics");
            }
        }
        if let Err(
            e @ (spindle_client::ClientError::Auth(_) | spindle_client::ClientError::Denied(_)),
        ) = r
        {
            return Err(e.into());
        }
        r.with_context(|| {
            format!(
                "is the cluster in {} running? (`spindle up` starts it)",
                self.dir.display()
            )
        })
    }
}

/// An address (`127.0.0.1:0` picks a port) on which the clients of `spindle` commands
/// serve their Prometheus metrics: for long-running ones (`spindle bench`, `spindle
/// agent`) that a monitoring stack should see.
pub const CLIENT_METRICS_ENV: &str = "SPINDLE_CLIENT_METRICS";

/// The keyring file of a cluster, monitor or daemon directory.
pub const KEYRING: &str = "keyring";

/// The keys of a new cluster: `client.admin` (every capability), the monitors' `mon.`, and
/// one per storage daemon.
pub fn new_cluster_keyring(osds: u32) -> spindle_proto::auth::Keyring {
    use spindle_proto::auth::{Key, Keyring, KeyringEntry};
    let mut k = Keyring::default();
    for entity in ["client.admin".to_string(), "mon.".to_string()]
        .into_iter()
        .chain((0..osds).map(|i| format!("osd.{i}")))
    {
        k.set(KeyringEntry {
            entity,
            key: Key::random(),
            caps: None,
        });
    }
    k
}

/// Writes `entity`'s entry of `keyring` alone to `path` (mode 0600).
pub fn write_keyring_of(
    keyring: &spindle_proto::auth::Keyring,
    entity: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let e = keyring
        .get(entity)
        .ok_or_else(|| anyhow!("the keyring has no key for {entity}"))?;
    spindle_proto::auth::Keyring {
        entries: vec![e.clone()],
    }
    .save(path)?;
    Ok(())
}

#[derive(Args)]
pub struct UpArgs {
    /// Number of monitors of a new cluster (a Raft group: 3 survive the loss of one,
    /// 5 of two). Default 1. An existing cluster keeps its monitors (`spindle mon add|rm`).
    #[arg(long)]
    pub mons: Option<u32>,
    /// Number of storage daemons of a new cluster.
    #[arg(long, default_value_t = 3)]
    pub osds: u32,
    /// Placement groups of the default pool.
    #[arg(long, default_value_t = 64)]
    pub pg_count: u32,
    /// Seconds to wait for the cluster to become clean.
    #[arg(long, default_value_t = 60)]
    pub wait_seconds: u64,
    /// Make a new cluster without authentication (anyone who can reach it may do
    /// anything). Default: keys for every entity, the administrator's in DIR/keyring.
    #[arg(long)]
    pub no_auth: bool,
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
    /// Mark a daemon down after this long without heartbeats. Default 2000; a monitor
    /// refuses to start with a value too short for the daemons' heartbeat timing.
    #[arg(long)]
    pub down_after_ms: Option<u64>,
    /// Background recovery: objects each daemon recovers at once. Default 2.
    #[arg(long)]
    pub recovery_ops_max: Option<usize>,
    /// Background recovery: bytes per second per daemon; 0 = unlimited (default).
    #[arg(long)]
    pub recovery_bytes_per_sec: Option<u64>,
    /// Scrub every placement group this often; 0 = only `spindle scrub`. Default 1 day.
    #[arg(long)]
    pub scrub_interval_ms: Option<u64>,
    /// A client operation unanswered this long is slow (the `SLOW_OPS` health check).
    /// Default 30000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub slow_op_ms: Option<u64>,
    /// Threads each daemon runs pushdown programs on (`spindle exec`), at a lower priority
    /// than I/O. Default 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub exec_threads: Option<u64>,
    /// MiB of object data each daemon keeps for repeated program runs (`spindle exec
    /// --cache`). Default 256.
    #[arg(long)]
    pub exec_cache_mib: Option<u64>,
    /// Share of one CPU, in percent, each daemon's execution threads may use together.
    /// Default 25.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=6400))]
    pub exec_cpu_percent: Option<u64>,
    /// Encrypt the payloads of every authenticated connection (ChaCha20-Poly1305), not
    /// only MAC them: `--encrypt` or `--encrypt true`, `--encrypt false` to stop. Default
    /// off. Has no effect on a cluster made with `--no-auth`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub encrypt: Option<bool>,
    /// Serve Prometheus metrics from every monitor and daemon (on a free port of
    /// 127.0.0.1; `spindle status --json` lists them). Default on; `--metrics false` for
    /// none.
    #[arg(long)]
    pub metrics: Option<bool>,
}

/// The stored settings: the first [`MON_SETTINGS`] go to monitors, the rest to daemons.
pub const SETTING_KEYS: [&str; 9] = [
    "out_after_ms",
    "down_after_ms",
    "recovery_ops_max",
    "recovery_bytes_per_sec",
    "scrub_interval_ms",
    "slow_op_ms",
    "exec_threads",
    "exec_cache_mib",
    "exec_cpu_percent",
];

/// How many of [`SETTING_KEYS`] are monitor settings.
pub const MON_SETTINGS: usize = 2;

impl SettingsArgs {
    fn values(&self) -> [Option<u64>; SETTING_KEYS.len()] {
        [
            self.out_after_ms,
            self.down_after_ms,
            self.recovery_ops_max.map(|v| v as u64),
            self.recovery_bytes_per_sec,
            self.scrub_interval_ms,
            self.slow_op_ms,
            self.exec_threads,
            self.exec_cache_mib,
            self.exec_cpu_percent,
        ]
    }
}

pub fn read_cluster_json(dir: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(dir.join("cluster.json"))
        .with_context(|| format!("no embedded cluster in {}", dir.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Stored setting `key` as command-line arguments for a daemon (nothing if unset).
pub fn setting_args(dir: &Path, keys: &[&str]) -> Vec<String> {
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

/// `--encrypt` if the embedded cluster's stored settings say so (monitors and daemons).
pub fn encrypt_args(dir: &Path) -> Vec<String> {
    let v = read_cluster_json(dir).unwrap_or(Value::Null);
    match v["settings"]["encrypt"].as_bool() {
        Some(true) => vec!["--encrypt".into()],
        _ => Vec::new(),
    }
}

/// The flags of both monitors and daemons from the stored settings: `--encrypt`, and
/// `--metrics-listen off` when metrics are off.
pub fn common_daemon_args(dir: &Path) -> Vec<String> {
    let mut args = encrypt_args(dir);
    let v = read_cluster_json(dir).unwrap_or(Value::Null);
    if v["settings"]["metrics"].as_bool() == Some(false) {
        args.extend(["--metrics-listen".into(), "off".into()]);
    }
    args
}

/// Merges given flags into `cluster.json`.
pub fn store_settings(dir: &Path, settings: &SettingsArgs) -> anyhow::Result<()> {
    let mut v = read_cluster_json(dir)?;
    for (k, val) in SETTING_KEYS.iter().zip(settings.values()) {
        if let Some(val) = val {
            v["settings"][*k] = serde_json::json!(val);
        }
    }
    if let Some(e) = settings.encrypt {
        v["settings"]["encrypt"] = serde_json::json!(e);
    }
    if let Some(m) = settings.metrics {
        v["settings"]["metrics"] = serde_json::json!(m);
    }
    write_atomic(&dir.join("cluster.json"), &v.to_string())
}

/// True if `pid` is a live process (a zombie, e.g. a killed daemon whose parent is gone
/// and not reaped yet, counts as dead).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    pid > 0 && unsafe { libc::kill(pid as i32, 0) } == 0 && !zombie(pid)
}

pub fn read_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Starts `spindle ARGS` detached (own session), output appended to `log`.
pub fn spawn_daemon(args: &[String], log: &Path) -> anyhow::Result<u32> {
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

/// Monitor `id`'s directory: `DIR/mon` for the first (as before there were several),
/// `DIR/mon.ID` for the others.
pub fn mon_dir(dir: &Path, id: u64) -> PathBuf {
    if id == 0 {
        dir.join("mon")
    } else {
        dir.join(format!("mon.{id}"))
    }
}

/// The ids of the embedded cluster's monitors (directories `mon` and `mon.N`), sorted.
pub fn mon_ids(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if name == "mon" {
                Some(0)
            } else {
                name.strip_prefix("mon.")?.parse().ok()
            }
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// Free TCP ports on 127.0.0.1, all bound at once so they differ (a monitor group needs
/// its addresses before its monitors start).
pub fn free_local_addrs(n: usize) -> anyhow::Result<Vec<String>> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect()
}

/// Starts monitor `id` of the embedded cluster unless it runs, and waits until it has
/// bound its address (it writes its pid then). `join`: a new monitor joining a running
/// group (its directory is prepared with that id).
pub fn start_mon(dir: &Path, id: u64, join: bool) -> anyhow::Result<u32> {
    let d = mon_dir(dir, id);
    std::fs::create_dir_all(&d)?;
    if let Some(pid) = read_pid(&d).filter(|&p| pid_alive(p)) {
        return Ok(pid);
    }
    // The monitors share one key: a new (or wiped) monitor's directory gets it from
    // another monitor of the cluster.
    if !d.join(KEYRING).exists() {
        if let Some(k) = mon_ids(dir)
            .into_iter()
            .map(|other| mon_dir(dir, other).join(KEYRING))
            .find(|p| p.exists())
        {
            spindle_proto::auth::Keyring::load(&k)?.save(&d.join(KEYRING))?;
        }
    }
    let _ = std::fs::remove_file(d.join("pid"));
    let mut args: Vec<String> = vec![
        "mon".into(),
        "run".into(),
        "--dir".into(),
        d.display().to_string(),
    ];
    if join || !(d.join(spindle_mon::RAFT_DB).exists() || d.join("mon.redb").exists()) {
        // An empty directory (a new monitor, or one whose disk was replaced) joins the
        // group as `id` and catches up from the leader.
        args.extend(["--id".into(), id.to_string()]);
    }
    args.extend(setting_args(dir, &SETTING_KEYS[..MON_SETTINGS]));
    args.extend(common_daemon_args(dir));
    let pid = spawn_daemon(&args, &d.join("log"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if read_pid(&d) == Some(pid) {
            return Ok(pid);
        }
        if !pid_alive(pid) || Instant::now() > deadline {
            bail!(
                "monitor {id} did not start; see {}",
                d.join("log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn osd_dir(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("osd.{id}"))
}

pub fn start_osd(dir: &Path, id: u32, mon: &str) -> anyhow::Result<u32> {
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
    args.extend(setting_args(dir, &SETTING_KEYS[MON_SETTINGS..]));
    args.extend(common_daemon_args(dir));
    spawn_daemon(&args, &d.join("log"))
}

pub fn cluster_osd_count(dir: &Path) -> anyhow::Result<u32> {
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
    let osds = match cluster_osd_count(&dir) {
        Ok(n) => n,
        Err(_) => {
            if args.osds == 0 {
                bail!("--osds must be at least 1");
            }
            let mon_count = args.mons.unwrap_or(1);
            if mon_count == 0 || mon_count as usize > spindle_mon::MONITORS_MAX {
                bail!(
                    "--mons must be 1..={} (3 or 5 survive the loss of 1 or 2)",
                    spindle_mon::MONITORS_MAX
                );
            }
            let size = args.osds.min(3);
            let min_size = if size >= 2 { 2 } else { 1 };
            // One monitor takes any free port when it first binds; a group needs its
            // addresses up front (they are its Raft membership).
            let addrs = if mon_count == 1 {
                vec![String::new()]
            } else {
                free_local_addrs(mon_count as usize)?
            };
            let mons: Vec<(PathBuf, String)> = addrs
                .iter()
                .enumerate()
                .map(|(i, a)| (mon_dir(&dir, i as u64), a.clone()))
                .collect();
            for (d, a) in &mons {
                std::fs::create_dir_all(d)?;
                if !a.is_empty() {
                    write_atomic(&d.join("addr"), a)?;
                }
            }
            let keyring = (!args.no_auth).then(|| new_cluster_keyring(args.osds));
            spindle_mon::init_monitors_auth(
                &mons,
                &spindle_mon::InitSpec {
                    osd_count: args.osds,
                    osd_hosts: Vec::new(),
                    default_pool: Some(("default".into(), size, min_size, args.pg_count)),
                },
                keyring.as_ref(),
            )?;
            if let Some(k) = &keyring {
                for id in 0..args.osds {
                    let d = osd_dir(&dir, id);
                    std::fs::create_dir_all(&d)?;
                    write_keyring_of(k, &format!("osd.{id}"), &d.join(KEYRING))?;
                }
                write_keyring_of(k, "client.admin", &dir.join(KEYRING))?;
            }
            write_atomic(
                &dir.join("cluster.json"),
                &serde_json::json!({"osds": args.osds}).to_string(),
            )?;
            say!(
                "created a cluster of {} storage daemons and {} monitor{} in {} (pool 'default': {size} copies, min {min_size})",
                args.osds,
                mon_count,
                if mon_count == 1 { "" } else { "s" },
                dir.display()
            );
            args.osds
        }
    };
    if args.settings.encrypt == Some(true) && !dir.join(KEYRING).exists() {
        bail!(
            "--encrypt needs authentication, and the cluster in {} runs without it (made with --no-auth)",
            dir.display()
        );
    }
    store_settings(&dir, &args.settings)?;
    let ids = mon_ids(&dir);
    if ids.is_empty() {
        bail!("no monitor directory in {}", dir.display());
    }
    if let Some(n) = args.mons.filter(|&n| n as usize != ids.len()) {
        eprintln!(
            "note: the cluster in {} has {} monitor(s); --mons {n} applies to new clusters only (`spindle mon add|rm` changes them)",
            dir.display(),
            ids.len()
        );
    }
    let mut mon_pids = Vec::new();
    for &id in &ids {
        mon_pids.push((id, start_mon(&dir, id, false)?));
    }
    let mon_addr = args.target.mon_addr().or_else(|_| {
        Target {
            dir: dir.clone(),
            mon: None,
            keyring: None,
            entity: "client.admin".into(),
        }
        .mon_addr()
    })?;
    let mut pids = Vec::new();
    for id in 0..osds {
        pids.push(start_osd(&dir, id, &mon_addr)?);
    }
    let target = Target {
        dir: dir.clone(),
        mon: Some(mon_addr.clone()),
        ..args.target.clone()
    };
    let rt = runtime()?;
    let status = rt.block_on(async {
        let client = target.client().await?;
        wait_clean(&client, Duration::from_secs(args.wait_seconds)).await
    })?;
    for ((id, pid), addr) in mon_pids.iter().zip(mon_addr.split(',')) {
        say!("mon.{id:<8} {addr} (pid {pid})");
    }
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
/// An erasure-coded pool's shape.
#[derive(Debug, PartialEq)]
pub struct ErasureProfile {
    pub k: u32,
    pub m: u32,
    pub matrix: String,
    pub stripe_unit: u32,
    pub min_size: u32,
}

/// Parses `k=4,m=2[,matrix=..][,stripe-unit=..][,min-size=..]` (`spindle pool create
/// --erasure`, `spindle bench ssb --erasure`).
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

/// Creates erasure-coded pool `name` of profile `p` (the matrix goes by name: the monitor
/// names the known ones if it is not one).
pub async fn create_ec_pool(
    client: &Client,
    name: &str,
    p: &ErasureProfile,
    pg_count: u32,
) -> anyhow::Result<spindle_mon::PoolCreated> {
    Ok(client
        .command_as(
            [
                "pool",
                "create-ec",
                name,
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
        .await?)
}

pub async fn admin<R: serde::de::DeserializeOwned>(
    client: &Client,
    req: Admin<R>,
) -> anyhow::Result<R> {
    Ok(client.admin(&req).await?)
}

/// Waits until every daemon is up and every placement group is clean, with a progress
/// bar of the objects left to recover while there are some (on a terminal).
pub async fn wait_clean(client: &Client, timeout: Duration) -> anyhow::Result<Status> {
    let deadline = Instant::now() + timeout;
    let mut recovery = RecoveryBar::default();
    loop {
        let status = admin(client, Admin::status()).await?;
        let all_up = status.osds.iter().all(|o| o.up || !o.in_cluster);
        let pgs = &status.pgs;
        // Inconsistent groups serve; they do not get better by waiting.
        if all_up && unsettled_pgs(pgs) == 0 {
            recovery.finish();
            return Ok(status);
        }
        recovery.show(status.recovery.objects_left);
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

/// Objects left to recover as a bar: its length is the most seen so far.
#[derive(Default)]
struct RecoveryBar {
    bar: Option<indicatif::ProgressBar>,
    most: u64,
}

impl RecoveryBar {
    fn show(&mut self, left: u64) {
        if left == 0 && self.bar.is_none() {
            return;
        }
        self.most = self.most.max(left);
        let b = self.bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(left),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "recovering: [{bar:24}] {pos}/{len} object copies, {per_sec}, {eta} left",
            ) {
                b.set_style(style.progress_chars("=> "));
            }
            b
        });
        b.set_length(self.most);
        b.set_position(self.most - left);
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.set_position(self.most);
            b.finish();
        }
    }
}

pub fn stop_pid(pid: u32, what: &str) -> anyhow::Result<()> {
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

/// True if `pid` has exited: gone, or a zombie whose threads have all exited.
///
/// The leader of a killed multi-threaded process turns zombie before its other threads have
/// finished exiting, and those threads still hold the process's files (and so its `flock`s,
/// e.g. redb's database lock) until each is gone from `/proc/PID/task`. Counting the process
/// as dead on the leader's state alone let `spindle up` start a monitor that then found its
/// database "already open" (CI, 2026-11-28).
pub fn zombie(pid: u32) -> bool {
    let leader_zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    if !leader_zombie {
        return false;
    }
    // Every thread but the leader must be gone (the leader's own entry stays until reaped).
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks
            .filter_map(Result::ok)
            .all(|t| t.file_name().to_str() == Some(pid.to_string().as_str())),
        Err(_) => true,
    }
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
    for id in mon_ids(dir) {
        if let Some(pid) = read_pid(&mon_dir(dir, id)) {
            stop_pid(pid, &format!("mon.{id}"))?;
        }
    }
    if !quiet {
        println!("stopped the cluster in {}", dir.display());
    }
    Ok(())
}

/// A multi-threaded tokio runtime for commands and benchmarks.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Writes `contents` to `path` atomically (temp file + rename).
pub fn write_atomic(path: &Path, contents: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Parses `10G`, `512M`, `4K`, `4KiB`, `1T` or plain bytes (suffixes are powers of 1024).
pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{text:?}: expected a number with an optional K/M/G/T suffix"
        ));
    }
    let n: u64 = digits.parse().map_err(|e| format!("{text:?}: {e}"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        other => return Err(format!("{text:?}: unknown size suffix {other:?}")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?}: too large"))
}

/// `10 GiB`-style rendering (exact when a whole number of the unit).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    for (unit, shift) in UNITS {
        let one = 1u64 << shift;
        if bytes >= one {
            if bytes.is_multiple_of(one) {
                return format!("{} {unit}", bytes >> shift);
            }
            return format!("{:.1} {unit}", bytes as f64 / one as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_bytes("10G"), Ok(10 << 30));
        assert_eq!(parse_size_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_size_bytes("4K"), Ok(4096));
        assert_eq!(parse_size_bytes("4kib"), Ok(4096));
        assert_eq!(parse_size_bytes("1536"), Ok(1536));
        assert!(parse_size_bytes("G").is_err());
        assert!(parse_size_bytes("1X").is_err());
        assert!(parse_size_bytes("99999999999P").is_err());
        assert_eq!(format_size(10 << 30), "10 GiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(100), "100 B");
    }
}
