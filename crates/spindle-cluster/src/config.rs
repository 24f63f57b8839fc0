//! A cluster on several hosts, from one configuration file (TOML) that lists the monitors
//! and storage daemons with their host, address and data directory. Every host gets the
//! same file; `spindle host start --config FILE [--host NAME]` starts the daemons of the
//! host it runs on (creating their directories the first time), `spindle host stop`
//! stops them. The first map is derived from the file alone (the cluster id is in it), so
//! every host's monitors start from the same map without talking first.
//!
//! ```toml
//! cluster_id = "5f3c9a0e12345678"   # 16 hex digits, the same everywhere
//! pg_count = 64                     # placement groups of pool `default`
//!
//! [[mon]]
//! id = 0
//! host = "h1"
//! addr = "10.0.0.1:6789"
//! dir = "/var/lib/spindle/mon.0"
//!
//! [[osd]]
//! id = 0
//! host = "h1"
//! addr = "10.0.0.1:6800"
//! dir = "/var/lib/spindle/osd.0"
//! ```
//!
//! The CRUSH hierarchy is root `default` -> host -> daemon, and pool `default` keeps
//! min(3, hosts) copies with the failure domain `host` (`spindle_map::crush_map_of_hosts`).

use crate::{pid_alive, read_pid, spawn_daemon, stop_pid};
use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// 16 hex digits.
    pub cluster_id: String,
    /// Placement groups of the pool `default` (a power of two).
    #[serde(default = "default_pg_count")]
    pub pg_count: u32,
    /// A daemon down this long is marked out (its data re-created elsewhere); 0 = never.
    #[serde(default = "default_out_after_ms")]
    pub out_after_ms: u64,
    /// The cluster's keyring (made by `spindle host keygen`, mode 0600): every host reads
    /// its daemons' keys from it, the first monitor seeds the key database from it, the
    /// administrator's client uses `client.admin` from it. Absent: the cluster runs
    /// without authentication.
    #[serde(default)]
    pub keyring: Option<PathBuf>,
    /// Encrypt the payloads of every authenticated connection (ChaCha20-Poly1305), not
    /// only MAC them. Needs `keyring`.
    #[serde(default)]
    pub encrypt: bool,
    pub mon: Vec<MonEntry>,
    pub osd: Vec<OsdEntry>,
}

fn default_pg_count() -> u32 {
    64
}
fn default_out_after_ms() -> u64 {
    30_000
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonEntry {
    pub id: u64,
    pub host: String,
    pub addr: String,
    pub dir: PathBuf,
    /// Where it serves Prometheus metrics (`/metrics`). Default: a free port on
    /// 127.0.0.1 (`spindle status --json` shows it); `off`: nowhere.
    #[serde(default)]
    pub metrics_addr: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsdEntry {
    pub id: u32,
    pub host: String,
    pub addr: String,
    pub dir: PathBuf,
    /// Where it serves Prometheus metrics (as for monitors).
    #[serde(default)]
    pub metrics_addr: Option<String>,
}

impl ClusterConfig {
    /// Reads and checks a configuration file (every error names the problem).
    pub fn load(path: &Path) -> anyhow::Result<ClusterConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the cluster configuration {}", path.display()))?;
        let c: ClusterConfig =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        c.check()
            .with_context(|| format!("in {}", path.display()))?;
        Ok(c)
    }

    pub fn cluster_id(&self) -> anyhow::Result<u64> {
        if self.cluster_id.len() != 16 {
            bail!(
                "cluster_id must be 16 hex digits, got {:?}",
                self.cluster_id
            );
        }
        u64::from_str_radix(&self.cluster_id, 16).map_err(|_| {
            anyhow!(
                "cluster_id must be 16 hex digits, got {:?}",
                self.cluster_id
            )
        })
    }

    fn check(&self) -> anyhow::Result<()> {
        self.cluster_id()?;
        if !self.pg_count.is_power_of_two() {
            bail!("pg_count must be a power of two, got {}", self.pg_count);
        }
        if self.mon.is_empty() || self.mon.len() > spindle_mon::MONITORS_MAX {
            bail!(
                "1 to {} monitors ([[mon]] entries) needed, got {}",
                spindle_mon::MONITORS_MAX,
                self.mon.len()
            );
        }
        if self.osd.is_empty() {
            bail!("no storage daemon ([[osd]] entries)");
        }
        if self.encrypt && self.keyring.is_none() {
            bail!("encrypt = true needs a keyring (sessions are keyed by authentication)");
        }
        let mut addrs = BTreeSet::new();
        let mut mon_ids = BTreeSet::new();
        for m in &self.mon {
            if !mon_ids.insert(m.id) {
                bail!("monitor id {} appears twice", m.id);
            }
            check_entry(
                "mon",
                &m.id.to_string(),
                &m.host,
                &m.addr,
                &m.dir,
                &mut addrs,
            )?;
        }
        let mut ids: Vec<u32> = self.osd.iter().map(|o| o.id).collect();
        ids.sort_unstable();
        if ids != (0..self.osd.len() as u32).collect::<Vec<_>>() {
            bail!(
                "storage daemon ids must be 0..{} (each once), got {ids:?}",
                self.osd.len()
            );
        }
        for o in &self.osd {
            check_entry(
                "osd",
                &o.id.to_string(),
                &o.host,
                &o.addr,
                &o.dir,
                &mut addrs,
            )?;
        }
        Ok(())
    }

    /// Every monitor address, comma-separated (what clients and daemons are given).
    pub fn mon_addrs(&self) -> String {
        self.mon
            .iter()
            .map(|m| m.addr.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The hosts named in the file, sorted.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.mon
            .iter()
            .map(|m| m.host.as_str())
            .chain(self.osd.iter().map(|o| o.host.as_str()))
            .collect()
    }

    /// The settings of the cluster's first map: every daemon in its host, pool `default`
    /// with min(3, hosts with daemons) copies.
    pub fn init_spec(&self) -> spindle_mon::InitSpec {
        let mut osds = self.osd.clone();
        osds.sort_by_key(|o| o.id);
        let osd_hosts: Vec<String> = osds.iter().map(|o| o.host.clone()).collect();
        let hosts: BTreeSet<&String> = osd_hosts.iter().collect();
        let size = (hosts.len() as u32).min(3);
        let min_size = if size >= 2 { 2 } else { 1 };
        spindle_mon::InitSpec {
            osd_count: osds.len() as u32,
            osd_hosts,
            default_pool: Some(("default".into(), size, min_size, self.pg_count)),
        }
    }
}

fn check_entry(
    kind: &str,
    id: &str,
    host: &str,
    addr: &str,
    dir: &Path,
    addrs: &mut BTreeSet<String>,
) -> anyhow::Result<()> {
    if !spindle_map::valid_host_name(host) {
        bail!("{kind}.{id}: bad host name {host:?} (letters, digits, '.', '_', '-'; not starting with a digit)");
    }
    addr.parse::<std::net::SocketAddr>()
        .map_err(|_| anyhow!("{kind}.{id}: address {addr:?} is not IP:PORT"))?;
    if !addrs.insert(addr.to_string()) {
        bail!("{kind}.{id}: address {addr} is used twice");
    }
    if !dir.is_absolute() {
        bail!(
            "{kind}.{id}: dir {} must be an absolute path",
            dir.display()
        );
    }
    Ok(())
}

/// This machine's host name (what `--host` defaults to).
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn wait_pid_file(dir: &Path, pid: u32, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if read_pid(dir) == Some(pid) {
            return Ok(());
        }
        if !pid_alive(pid) || Instant::now() > deadline {
            bail!("{what} did not start; see {}", dir.join("log").display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts (detached) every daemon of `host` that is not running; prints what it did.
pub fn host_start(config: &ClusterConfig, host: &str, quiet: bool) -> anyhow::Result<()> {
    if !config.hosts().contains(host) {
        bail!(
            "host {host:?} is not in the configuration (hosts: {}); pass --host",
            config.hosts().into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    let members: Vec<(u64, String)> = config.mon.iter().map(|m| (m.id, m.addr.clone())).collect();
    let first = spindle_mon::first_map(&config.init_spec(), config.cluster_id()?)?;
    let mons = config.mon_addrs();
    let keyring = config
        .keyring
        .as_ref()
        .map(|p| spindle_proto::auth::Keyring::load(p))
        .transpose()?;
    if keyring.is_none() && !quiet {
        println!("note: no keyring in the configuration: the cluster runs without authentication");
    }
    for m in config.mon.iter().filter(|m| m.host == host) {
        // A running monitor holds its database open: check before touching it.
        if let Some(pid) = read_pid(&m.dir).filter(|&p| pid_alive(p)) {
            if !quiet {
                println!("mon.{} already runs (pid {pid})", m.id);
            }
            continue;
        }
        std::fs::create_dir_all(&m.dir).with_context(|| format!("creating {}", m.dir.display()))?;
        spindle_mon::init_member(&m.dir, m.id, &members, &first, keyring.as_ref())?;
        let _ = std::fs::remove_file(m.dir.join("pid"));
        let mut args: Vec<String> = vec![
            "mon".into(),
            "run".into(),
            "--dir".into(),
            m.dir.display().to_string(),
            "--listen".into(),
            m.addr.clone(),
            "--out-after-ms".into(),
            config.out_after_ms.to_string(),
        ];
        if config.encrypt {
            args.push("--encrypt".into());
        }
        if let Some(a) = &m.metrics_addr {
            args.extend(["--metrics-listen".into(), a.clone()]);
        }
        let pid = spawn_daemon(&args, &m.dir.join("log"))?;
        wait_pid_file(&m.dir, pid, &format!("mon.{}", m.id))?;
        if !quiet {
            println!("mon.{:<6} {} (pid {pid})", m.id, m.addr);
        }
    }
    for o in config.osd.iter().filter(|o| o.host == host) {
        std::fs::create_dir_all(&o.dir).with_context(|| format!("creating {}", o.dir.display()))?;
        if let Some(k) = &keyring {
            let path = o.dir.join(crate::KEYRING);
            if !path.exists() {
                crate::write_keyring_of(k, &format!("osd.{}", o.id), &path)?;
            }
        }
        if let Some(pid) = read_pid(&o.dir).filter(|&p| pid_alive(p)) {
            if !quiet {
                println!("osd.{} already runs (pid {pid})", o.id);
            }
            continue;
        }
        let _ = std::fs::remove_file(o.dir.join("pid"));
        let mut args: Vec<String> = vec![
            "osd".into(),
            "run".into(),
            "--id".into(),
            o.id.to_string(),
            "--dir".into(),
            o.dir.display().to_string(),
            "--mon".into(),
            mons.clone(),
            "--listen".into(),
            o.addr.clone(),
        ];
        if config.encrypt {
            args.push("--encrypt".into());
        }
        if let Some(a) = &o.metrics_addr {
            args.extend(["--metrics-listen".into(), a.clone()]);
        }
        let pid = spawn_daemon(&args, &o.dir.join("log"))?;
        if !quiet {
            println!("osd.{:<6} {} (pid {pid})", o.id, o.addr);
        }
    }
    if !quiet {
        println!("monitors: {mons}  (clients: --mon {mons})");
    }
    Ok(())
}

/// Writes a new keyring for the cluster of `config` to `out` (mode 0600): `client.admin`,
/// the monitors' `mon.` and every daemon's key. Refuses to replace an existing file.
pub fn keygen(config: &ClusterConfig, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        bail!(
            "{} exists; remove it first (a cluster keeps the keys it was made with)",
            out.display()
        );
    }
    let mut k = crate::new_cluster_keyring(0);
    for o in &config.osd {
        k.set(spindle_proto::auth::KeyringEntry {
            entity: format!("osd.{}", o.id),
            key: spindle_proto::auth::Key::random(),
            caps: None,
        });
    }
    k.save(out)?;
    Ok(())
}

/// Stops every daemon of `host` (SIGTERM, SIGKILL after 10 s).
pub fn host_stop(config: &ClusterConfig, host: &str) -> anyhow::Result<()> {
    for o in config.osd.iter().filter(|o| o.host == host) {
        if let Some(pid) = read_pid(&o.dir) {
            stop_pid(pid, &format!("osd.{}", o.id))?;
        }
    }
    for m in config.mon.iter().filter(|m| m.host == host) {
        if let Some(pid) = read_pid(&m.dir) {
            stop_pid(pid, &format!("mon.{}", m.id))?;
        }
    }
    Ok(())
}

/// The configuration file's directory entries that belong to `host`.
pub fn host_dirs(config: &ClusterConfig, host: &str) -> Vec<PathBuf> {
    config
        .mon
        .iter()
        .filter(|m| m.host == host)
        .map(|m| m.dir.clone())
        .chain(
            config
                .osd
                .iter()
                .filter(|o| o.host == host)
                .map(|o| o.dir.clone()),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
cluster_id = "00000000000000aa"
pg_count = 16
[[mon]]
id = 0
host = "h1"
addr = "127.0.0.1:7000"
dir = "/tmp/x/mon.0"
[[osd]]
id = 0
host = "h1"
addr = "127.0.0.1:7100"
dir = "/tmp/x/osd.0"
[[osd]]
id = 1
host = "h2"
addr = "127.0.0.1:7101"
dir = "/tmp/x/osd.1"
"#;

    fn parse(text: &str) -> anyhow::Result<ClusterConfig> {
        let c: ClusterConfig = toml::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    #[test]
    fn a_good_file_gives_hosts_and_the_first_map_settings() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.cluster_id().unwrap(), 0xaa);
        assert_eq!(c.hosts().into_iter().collect::<Vec<_>>(), ["h1", "h2"]);
        let spec = c.init_spec();
        assert_eq!(spec.osd_hosts, ["h1", "h2"]);
        assert_eq!(spec.default_pool, Some(("default".into(), 2, 2, 16)));
        assert_eq!(c.mon_addrs(), "127.0.0.1:7000");
        // The first map is the same wherever it is computed.
        let a = spindle_mon::first_map(&spec, 0xaa).unwrap();
        let b = spindle_mon::first_map(&c.init_spec(), 0xaa).unwrap();
        assert_eq!(a.encode(), b.encode());
    }

    /// `host start` on a host whose monitor runs (holding its database open) but whose
    /// daemons are dead: the monitor is left alone, not opened a second time.
    #[test]
    fn host_start_leaves_a_running_monitor_and_its_database_alone() {
        let dir = std::env::temp_dir().join(format!("spindle-host-start-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mon_dir = dir.join("mon.0");
        // Host h1 runs the monitor only; the daemons are on h2.
        let text = GOOD
            .replace("/tmp/x/mon.0", &mon_dir.display().to_string())
            .replace(
                "id = 0\nhost = \"h1\"\naddr = \"127.0.0.1:7100\"",
                "id = 0\nhost = \"h2\"\naddr = \"127.0.0.1:7100\"",
            );
        let c = parse(&text).unwrap();
        assert!(c.osd.iter().all(|o| o.host == "h2"));
        std::fs::create_dir_all(&mon_dir).unwrap();
        let members: Vec<(u64, String)> = c.mon.iter().map(|m| (m.id, m.addr.clone())).collect();
        let first = spindle_mon::first_map(&c.init_spec(), c.cluster_id().unwrap()).unwrap();
        spindle_mon::init_member(&mon_dir, 0, &members, &first, None).unwrap();
        // "The monitor": this process, with the database open.
        let db = spindle_mon::raft::RaftDb::open(&mon_dir.join(spindle_mon::RAFT_DB)).unwrap();
        std::fs::write(mon_dir.join("pid"), std::process::id().to_string()).unwrap();
        let res = host_start(&c, "h1", true);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
        res.unwrap();
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        for (bad, why) in [
            (GOOD.replace("00000000000000aa", "xyz"), "cluster_id"),
            (
                GOOD.replace("pg_count = 16", "pg_count = 12"),
                "power of two",
            ),
            (GOOD.replace("id = 1\n", "id = 2\n"), "ids must be 0..2"),
            (
                GOOD.replace("127.0.0.1:7101", "127.0.0.1:7100"),
                "used twice",
            ),
            (GOOD.replace("\"h2\"", "\"2h\""), "bad host name"),
            (GOOD.replace("/tmp/x/osd.1", "rel/osd.1"), "absolute"),
            (GOOD.replace("127.0.0.1:7000", "nowhere"), "not IP:PORT"),
            (format!("{GOOD}\nextra = 1\n"), "unknown field"),
        ] {
            let e = format!("{:#}", parse(&bad).unwrap_err());
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
