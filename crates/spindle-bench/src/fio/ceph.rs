//! `spindle bench fio --ceph`: a real Ceph 16 started in the same sitting with
//! `shared/baselines/ceph/up.sh` and stopped with its `down.sh`.
//!
//! Invariants:
//! - down.sh runs exactly once for every up.sh this process started, whatever happens
//!   after the start (error, panic, Ctrl-C noticed by the bench): [`CephCluster`] runs it
//!   when stopped or dropped. It is only created after the checks that no cluster is
//!   running in the data directory and no monitor listens on Ceph's fixed port, so it
//!   never stops a Ceph this process did not start.
//! - up.sh and down.sh get `CEPH_DIR` explicitly; their output goes to a log file, never
//!   to stdout (which `--json` keeps for the report).

use crate::proc_cpu;
use anyhow::{bail, Context};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The monitor address up.sh configures (msgr v2 port); a listener there means another
/// Ceph is running and up.sh would fail.
const CEPH_MON_ADDR: &str = "127.0.0.1:3300";

/// The log of up.sh and down.sh.
pub fn log_path() -> PathBuf {
    std::env::temp_dir().join("spindle-bench-fio-ceph.log")
}

/// Where up.sh and down.sh are: `--ceph-scripts DIR`, else
/// `$SPINDLE_SHARED_DIR/baselines/ceph`, else `../shared/baselines/ceph` (relative to the
/// current directory).
pub fn scripts_dir(explicit: Option<&Path>, shared_dir: Option<&Path>) -> PathBuf {
    match (explicit, shared_dir) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(shared)) => shared.join("baselines").join("ceph"),
        (None, None) => Path::new("..")
            .join("shared")
            .join("baselines")
            .join("ceph"),
    }
}

/// The two scripts, checked to exist.
#[derive(Debug, Clone)]
pub struct CephScripts {
    up: PathBuf,
    down: PathBuf,
}

impl CephScripts {
    pub fn find(dir: &Path) -> anyhow::Result<Self> {
        let up = dir.join("up.sh");
        let down = dir.join("down.sh");
        for script in [&up, &down] {
            if !script.is_file() {
                bail!(
                    "--ceph: {} not found (pass --ceph-scripts DIR, or set SPINDLE_SHARED_DIR \
                     to the shared folder holding baselines/ceph/up.sh and down.sh)",
                    script.display()
                );
            }
        }
        Ok(CephScripts { up, down })
    }
}

/// The RBD image of the cluster up.sh creates that matches a Spindle image's pool:
/// `rbd/rep` (3 copies) or `ecmeta/ec` (data on an EC 2+1 pool).
pub fn rbd_image(erasure: bool) -> (&'static str, &'static str) {
    if erasure {
        ("ecmeta", "ec")
    } else {
        ("rbd", "rep")
    }
}

/// `IMG_SIZE` for up.sh: `rbd create --size` reads a bare number as MiB, so the size is
/// given in MiB with the unit, rounded up.
pub fn image_size_arg(size_bytes: u64) -> String {
    format!("{}M", size_bytes.div_ceil(1 << 20).max(1))
}

/// One line per daemon of `$CEPH_DIR/pids`: `NAME PID` (e.g. `osd.0 1234`).
pub fn parse_pids(text: &str) -> anyhow::Result<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(name), Some(pid), None) = (words.next(), words.next(), words.next()) else {
            bail!("line {line:?} of the Ceph pid file is not `NAME PID`");
        };
        let pid: u32 = pid
            .parse()
            .with_context(|| format!("pid {pid:?} of {name} is not a number"))?;
        out.push((name.to_string(), pid));
    }
    Ok(out)
}

/// Checks that starting a cluster in `dir` cannot collide with a running one (which the
/// cleanup would otherwise stop).
pub fn check_free(dir: &Path) -> anyhow::Result<()> {
    let pids = dir.join("pids");
    if pids.exists() {
        bail!(
            "--ceph: {} exists: a Ceph cluster of up.sh is running in {} (stop it with \
             CEPH_DIR={} down.sh, or pick another --ceph-dir)",
            pids.display(),
            dir.display(),
            dir.display()
        );
    }
    let addr: SocketAddr = CEPH_MON_ADDR.parse()?;
    if TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
        bail!("--ceph: something listens on {CEPH_MON_ADDR}, Ceph's monitor port: another Ceph is running");
    }
    Ok(())
}

/// A Ceph cluster started by up.sh; down.sh runs when it is stopped or dropped.
pub struct CephCluster {
    scripts: CephScripts,
    dir: PathBuf,
    log_path: PathBuf,
    stopped: bool,
}

impl CephCluster {
    /// Runs up.sh (about a minute; installs the Debian packages when missing) with
    /// `CEPH_DIR=dir` and images of `image_size_bytes`. On failure down.sh has run.
    pub fn start(
        scripts: &CephScripts,
        dir: &Path,
        image_size_bytes: u64,
    ) -> anyhow::Result<CephCluster> {
        check_free(dir)?;
        Self::launch(scripts, dir, image_size_bytes, log_path())
    }

    /// [`CephCluster::start`] without the checks, logging to `log_path`.
    fn launch(
        scripts: &CephScripts,
        dir: &Path,
        image_size_bytes: u64,
        log_path: PathBuf,
    ) -> anyhow::Result<CephCluster> {
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        // From here on the guard owns the cleanup, including of a half-started cluster.
        let mut cluster = CephCluster {
            scripts: scripts.clone(),
            dir: dir.to_path_buf(),
            log_path,
            stopped: false,
        };
        let status = Command::new("bash")
            .arg(&scripts.up)
            .env("CEPH_DIR", dir)
            .env("IMG_SIZE", image_size_arg(image_size_bytes))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("cannot run {}", scripts.up.display()))?;
        if !status.success() {
            let tail = cluster.log_tail();
            let stop = cluster.stop();
            bail!(
                "{} failed ({status}); down.sh {}; last lines of {}:\n{tail}",
                scripts.up.display(),
                match stop {
                    Ok(()) => "ran".to_string(),
                    Err(e) => format!("failed too: {e:#}"),
                },
                cluster.log_path.display()
            );
        }
        Ok(cluster)
    }

    /// `ceph.conf` of the cluster (fio's rbd engine finds it through `CEPH_CONF`).
    pub fn conf(&self) -> PathBuf {
        self.dir.join("ceph.conf")
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The daemons up.sh recorded (monitor, manager, OSDs).
    pub fn daemons(&self) -> anyhow::Result<Vec<(String, u32)>> {
        let path = self.dir.join("pids");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        parse_pids(&text)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Runs down.sh (once) and checks that none of the recorded daemons survived it.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let daemons = self.daemons().unwrap_or_default();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.log_path)
            .with_context(|| format!("cannot open {}", self.log_path.display()))?;
        let status = Command::new("bash")
            .arg(&self.scripts.down)
            .env("CEPH_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("cannot run {}", self.scripts.down.display()))?;
        let survivors: Vec<String> = daemons
            .iter()
            .filter(|(_, pid)| proc_cpu::cmdline(*pid).is_some_and(|c| c.contains("ceph-")))
            .map(|(name, pid)| format!("{name} (pid {pid})"))
            .collect();
        if !status.success() || !survivors.is_empty() {
            bail!(
                "{} ({status}) left Ceph daemons running: [{}]; see {}",
                self.scripts.down.display(),
                survivors.join(", "),
                self.log_path.display()
            );
        }
        Ok(())
    }
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        if !self.stopped {
            eprintln!(
                "bench fio: stopping Ceph ({} with CEPH_DIR={})",
                self.scripts.down.display(),
                self.dir.display()
            );
            if let Err(e) = self.stop() {
                eprintln!("bench fio: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_dir_prefers_the_option_then_the_shared_dir() {
        let opt = Path::new("/opt/ceph");
        let shared = Path::new("/work/shared");
        assert_eq!(scripts_dir(Some(opt), Some(shared)), opt);
        assert_eq!(
            scripts_dir(None, Some(shared)),
            Path::new("/work/shared/baselines/ceph")
        );
        assert_eq!(
            scripts_dir(None, None),
            Path::new("../shared/baselines/ceph")
        );
    }

    #[test]
    fn missing_scripts_are_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("spindle-no-ceph-{}", std::process::id()));
        let err = CephScripts::find(&dir).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("up.sh not found") && e.contains("--ceph-scripts")),
            "{err:?}"
        );
    }

    /// The scripts of the shared folder are found when it is there.
    #[test]
    fn shared_scripts_are_found() {
        let Some(shared) = std::env::var_os("SPINDLE_SHARED_DIR") else {
            return;
        };
        let dir = scripts_dir(None, Some(Path::new(&shared)));
        assert!(CephScripts::find(&dir).is_ok(), "{}", dir.display());
    }

    /// Stand-ins for up.sh and down.sh in a fresh directory: up.sh records a daemon and
    /// IMG_SIZE, then exits with `up_status`; down.sh notes that it ran.
    fn fake_scripts(name: &str, up_status: i32) -> (PathBuf, CephScripts) {
        let root =
            std::env::temp_dir().join(format!("spindle-fake-ceph-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let written = std::fs::create_dir_all(&root)
            .and_then(|()| {
                std::fs::write(
                    root.join("up.sh"),
                    format!(
                        "mkdir -p \"$CEPH_DIR\"\necho \"mon.a 999999999\" > \"$CEPH_DIR/pids\"\n\
                         echo \"$IMG_SIZE\" > \"$CEPH_DIR/img\"\necho starting\nexit {up_status}\n"
                    ),
                )
            })
            .and_then(|()| {
                std::fs::write(
                    root.join("down.sh"),
                    "echo ran >> \"$CEPH_DIR.down\"\nrm -rf \"$CEPH_DIR\"\n",
                )
            });
        assert!(written.is_ok(), "{written:?}");
        match CephScripts::find(&root) {
            Ok(scripts) => (root, scripts),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// down.sh runs exactly once: when the cluster is stopped, when it is dropped, and
    /// when up.sh fails half-way.
    #[test]
    fn down_runs_once_whatever_happens() {
        let down_count = |dir: &Path| {
            std::fs::read_to_string(dir.with_extension("down"))
                .map(|s| s.lines().count())
                .unwrap_or(0)
        };
        let (root, scripts) = fake_scripts("ok", 0);
        let dir = root.join("data");
        let cluster = CephCluster::launch(&scripts, &dir, 1 << 30, root.join("log"));
        let Ok(mut cluster) = cluster else {
            panic!("{:?}", cluster.err());
        };
        assert_eq!(
            std::fs::read_to_string(dir.join("img")).ok().as_deref(),
            Some("1024M\n")
        );
        assert_eq!(
            cluster.daemons().ok(),
            Some(vec![("mon.a".to_string(), 999_999_999)])
        );
        assert!(cluster.stop().is_ok());
        assert!(cluster.stop().is_ok());
        drop(cluster);
        assert_eq!(down_count(&dir), 1);

        let dropped = CephCluster::launch(&scripts, &dir, 1 << 20, root.join("log"));
        assert!(dropped.is_ok());
        drop(dropped);
        assert_eq!(down_count(&dir), 2);

        let _ = std::fs::remove_dir_all(&root);

        let (root, scripts) = fake_scripts("fails", 3);
        let dir = root.join("data");
        let err = CephCluster::launch(&scripts, &dir, 1 << 20, root.join("log"))
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("down.sh ran") && e.contains("starting")),
            "{err:?}"
        );
        assert_eq!(down_count(&dir), 1);
        assert!(!dir.exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn pid_file_lines_parse() {
        let text = "mon.a 100\nmgr.x 101\nosd.0 102\n\nosd.1 103\n";
        let pids = parse_pids(text).ok();
        assert_eq!(pids.as_ref().map(Vec::len), Some(4));
        assert_eq!(
            pids.and_then(|p| p.last().cloned()),
            Some(("osd.1".to_string(), 103))
        );
        assert!(parse_pids("osd.0 abc").is_err());
        assert!(parse_pids("osd.0").is_err());
        assert!(parse_pids("osd.0 1 2").is_err());
        assert_eq!(parse_pids("").ok().map(|p| p.len()), Some(0));
    }

    #[test]
    fn image_matches_the_pool_kind_and_size_is_in_mib() {
        assert_eq!(rbd_image(false), ("rbd", "rep"));
        assert_eq!(rbd_image(true), ("ecmeta", "ec"));
        assert_eq!(image_size_arg(1 << 30), "1024M");
        assert_eq!(image_size_arg((1 << 30) + 1), "1025M");
        assert_eq!(image_size_arg(0), "1M");
    }
}
