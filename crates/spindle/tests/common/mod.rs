//! A real embedded cluster (monitor + storage daemons as separate processes on
//! 127.0.0.1) for integration tests, started and stopped through the `spindle` CLI.
#![allow(dead_code)]

use spindle_client::{Client, ClientConfig};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `spindle` binary under test; `SPINDLE_TEST_BIN` points the tests at another build
/// (e.g. an older commit's, to check that a test fails without a fix). Daemons started by
/// `spindle up` run the same binary.
pub fn spindle() -> Command {
    match std::env::var_os("SPINDLE_TEST_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_spindle")),
    }
}

pub const POOL: &str = "default";

pub struct Cluster {
    pub dir: PathBuf,
    pub osds: u32,
}

/// Runs `spindle ARGS --dir CLUSTER` and returns its standard output (panics on failure).
pub fn ok(c: &Cluster, args: &[&str]) -> String {
    run_ok(spindle().args(args).arg("--dir").arg(&c.dir))
}

/// `qemu-img compare` of raw file `reference` with `uri` (a file or an NBD URI):
/// (identical, what qemu-img said).
pub fn qemu_img_compare(reference: &Path, uri: &str) -> (bool, String) {
    let out = std::process::Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(reference)
        .arg(uri)
        .output()
        .expect("spawn qemu-img");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Waits (up to 60 s) until `client`'s map has at least `removals` snapshot removals of
/// `image` and the monitors' snapshot trimmer has freed what they left; panics otherwise.
pub async fn wait_trimmed(client: &Client, pool: &str, image: &str, removals: u64) {
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = client.image_snaps(pool, image) {
            if s.removals >= removals && !s.trim_pending() {
                return;
            }
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the snapshot copies of {pool}/{image} were not freed within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Runs `spindle ARGS --dir CLUSTER` (no standard input) and asserts that it fails with
/// `needle` in its standard error.
pub fn fails(c: &Cluster, args: &[&str], needle: &str) {
    let out = spindle()
        .args(args)
        .arg("--dir")
        .arg(&c.dir)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spindle");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in: {err}"
    );
}

pub fn unique_dir(tag: &str) -> PathBuf {
    let base = std::env::var_os("SPINDLE_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    base.join(format!("spindle-test-{tag}-{}-{nanos}", std::process::id()))
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn spindle");
    assert!(
        out.status.success(),
        "{:?} failed: {}\n{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    /// `spindle up --osds N` in a fresh directory; returns once every PG is clean.
    pub fn start(tag: &str, osds: u32, pg_count: u32) -> Cluster {
        Self::start_with(tag, osds, pg_count, &[])
    }

    /// Like [`Cluster::start`], with more `spindle up` flags (daemon settings).
    pub fn start_with(tag: &str, osds: u32, pg_count: u32, extra: &[&str]) -> Cluster {
        let dir = unique_dir(tag);
        std::fs::create_dir_all(&dir).expect("create test dir");
        let c = Cluster { dir, osds };
        let (osds, pg_count) = (osds.to_string(), pg_count.to_string());
        let mut args = vec!["--osds", &osds, "--pg-count", &pg_count];
        args.extend_from_slice(extra);
        c.up_with(&args);
        c
    }

    /// Like [`Cluster::start`], with environment variables for the daemons (`spindle up`
    /// passes its environment on to them).
    pub fn start_with_env(tag: &str, osds: u32, pg_count: u32, env: &[(&str, &str)]) -> Cluster {
        Self::start_with_env_args(tag, osds, pg_count, env, &[])
    }

    /// [`Cluster::start_with_env`] with more `spindle up` flags.
    pub fn start_with_env_args(
        tag: &str,
        osds: u32,
        pg_count: u32,
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> Cluster {
        let dir = unique_dir(tag);
        std::fs::create_dir_all(&dir).expect("create test dir");
        let c = Cluster { dir, osds };
        run_ok(
            spindle()
                .arg("up")
                .arg("--dir")
                .arg(&c.dir)
                .args(["--wait-seconds", "90"])
                .args(["--osds", &osds.to_string()])
                .args(["--pg-count", &pg_count.to_string()])
                .args(extra)
                .envs(env.iter().copied()),
        );
        c
    }

    pub fn up_with(&self, extra: &[&str]) -> String {
        run_ok(
            spindle()
                .arg("up")
                .arg("--dir")
                .arg(&self.dir)
                .args(["--wait-seconds", "90"])
                .args(extra),
        )
    }

    /// Starts whatever is not running and waits for clean.
    pub fn up(&self) -> String {
        self.up_with(&[])
    }

    /// Every monitor's address, comma-separated (monitor 0 in `mon/`, others in `mon.N/`).
    pub fn mon_addr(&self) -> String {
        let addrs: Vec<String> = (0..16)
            .filter_map(|id| std::fs::read_to_string(self.mon_dir(id).join("addr")).ok())
            .map(|a| a.trim().to_string())
            .collect();
        assert!(
            !addrs.is_empty(),
            "no monitor address in {}",
            self.dir.display()
        );
        addrs.join(",")
    }

    pub fn mon_dir(&self, id: u64) -> PathBuf {
        if id == 0 {
            self.dir.join("mon")
        } else {
            self.dir.join(format!("mon.{id}"))
        }
    }

    pub fn mon_addr_of(&self, id: u64) -> String {
        std::fs::read_to_string(self.mon_dir(id).join("addr"))
            .expect("mon addr")
            .trim()
            .to_string()
    }

    /// SIGKILLs monitor `id`.
    pub fn kill_mon_id(&self, id: u64) {
        let pid = Self::pid(&self.mon_dir(id)).expect("mon pid");
        Self::kill_and_wait(pid);
    }

    pub fn osd_dir(&self, id: u32) -> PathBuf {
        self.dir.join(format!("osd.{id}"))
    }

    pub fn pid(dir: &Path) -> Option<i32> {
        std::fs::read_to_string(dir.join("pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    fn kill_and_wait(pid: i32) {
        // SAFETY: plain kill(2) on a daemon this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Gone, or a zombie with every thread exited (so its file locks are released).
            if spindle_cluster::zombie(pid as u32) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("pid {pid} survived SIGKILL");
    }

    pub fn kill_osd(&self, id: u32) {
        let pid = Self::pid(&self.osd_dir(id)).expect("osd pid");
        Self::kill_and_wait(pid);
    }

    pub fn kill_mon(&self) {
        let pid = Self::pid(&self.dir.join("mon")).expect("mon pid");
        Self::kill_and_wait(pid);
    }

    pub fn start_osd(&self, id: u32) {
        run_ok(
            spindle()
                .args(["osd", "start", &id.to_string(), "--dir"])
                .arg(&self.dir),
        );
    }

    pub fn status(&self) -> serde_json::Value {
        let out = run_ok(spindle().args(["status", "--json", "--dir"]).arg(&self.dir));
        serde_json::from_str(&out).expect("status JSON")
    }

    /// Waits until `pred(status)` holds.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status();
            if pred(&s) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_osd_up(&self, id: u32, up: bool) {
        self.wait_for(&format!("osd.{id} up={up}"), Duration::from_secs(30), |s| {
            s["osds"][id as usize]["up"] == up
        });
    }

    pub fn wait_clean(&self) {
        self.wait_for("all pgs clean", Duration::from_secs(90), |s| {
            let pgs = &s["pgs"];
            [
                "degraded",
                "recovering",
                "backfilling",
                "peering",
                "incomplete",
                "inactive",
            ]
            .iter()
            .all(|k| pgs[*k] == 0)
                && s["osds"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(|o| o["up"] == true || o["in"] == false))
        });
    }

    /// A client configuration for this cluster: every monitor, and the administrator's
    /// key from `DIR/keyring` (if the cluster authenticates).
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig::new(self.mon_addr())
            .with_keyring(&self.dir.join("keyring"), "client.admin")
            .expect("the cluster's keyring")
    }

    pub async fn client(&self) -> Client {
        let mut cfg = self.client_config();
        cfg.op_timeout_ms = 60_000;
        Client::connect(cfg).await.expect("client connects")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let added = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("osd."))
                    .count()
            })
            .unwrap_or(0) as u32;
        for id in 0..self.osds.max(added) {
            if let Some(pid) = Self::pid(&self.osd_dir(id)) {
                // SAFETY: kill(2) of our own daemons.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if let Some(pid) = Self::pid(&self.dir.join("mon")) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // A daemon started just before the end may not have written its pid file yet
        // (`spindle osd start` returns once it is spawned): every process that names this
        // cluster's directory on its command line goes too.
        let dir = self.dir.to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let names_dir = cmdline
                .split(|&b| b == 0)
                .any(|arg| String::from_utf8_lossy(arg).starts_with(&dir));
            if names_dir && pid != std::process::id() as i32 {
                // SAFETY: kill(2) of a daemon of this test's cluster.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("keeping {} for inspection", self.dir.display());
        }
    }
}

/// Deterministic object contents for (name, generation).
pub fn content(name: &str, generation: u64, len: usize) -> Vec<u8> {
    let mut x = 0xcbf2_9ce4_8422_2325u64 ^ generation.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        x = (x ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Log-uniform size in 1..=max.
pub fn size_log_uniform(rng: &mut u64, max: u64) -> usize {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let bits = 64 - max.leading_zeros() as u64;
    let b = (*rng % bits) + 1;
    let lo = 1u64 << (b - 1);
    let hi = ((1u64 << b) - 1).min(max);
    (lo + (*rng >> 20) % (hi - lo + 1)) as usize
}

/// Runs `op(name, generation, len)` for every object with 16 tasks in parallel.
pub async fn for_each_object<F, Fut>(objects: &BTreeMap<String, (u64, usize)>, op: F)
where
    F: Fn(String, u64, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let items: Vec<(String, u64, usize)> = objects
        .iter()
        .map(|(n, (g, l))| (n.clone(), *g, *l))
        .collect();
    let items = Arc::new(Mutex::new(items));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let items = items.clone();
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let next = items.lock().unwrap().pop();
                let Some((name, generation, len)) = next else {
                    break;
                };
                op(name, generation, len).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub async fn write_all(client: &Client, objects: &BTreeMap<String, (u64, usize)>) {
    let client = client.clone();
    for_each_object(objects, move |name, generation, len| {
        let client = client.clone();
        async move {
            client
                .write_full(POOL, &name, content(&name, generation, len))
                .await
                .unwrap_or_else(|e| panic!("write {name}: {e}"));
        }
    })
    .await;
}

pub async fn verify_all(client: &Client, objects: &BTreeMap<String, (u64, usize)>) {
    let client = client.clone();
    for_each_object(objects, move |name, generation, len| {
        let client = client.clone();
        async move {
            let got = client
                .read_full(POOL, &name)
                .await
                .unwrap_or_else(|e| panic!("read {name}: {e}"));
            assert_eq!(got.len(), len, "{name}: size");
            assert!(
                got == content(&name, generation, len),
                "{name}: content differs"
            );
        }
    })
    .await;
}

/// Opens every daemon's store (cluster stopped) and checks each object is on every copy.
pub async fn verify_on_every_replica(
    c: &Cluster,
    objects: &BTreeMap<String, (u64, usize)>,
    copies: usize,
) {
    let ids: Vec<u32> = (0..c.osds).collect();
    verify_on_replicas(c, &ids, 32, objects, copies).await
}

/// Opens the stores of daemons `ids` (cluster stopped) and checks that each object is on
/// exactly `copies` of them, with the acknowledged content.
pub async fn verify_on_replicas(
    c: &Cluster,
    ids: &[u32],
    map_pg_count: u32,
    objects: &BTreeMap<String, (u64, usize)>,
    copies: usize,
) {
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    for &id in ids {
        let store = spindle_store::Store::open(spindle_store::StoreConfig::new(
            c.osd_dir(id).join("store"),
        ))
        .unwrap_or_else(|e| panic!("osd.{id} store: {e}"));
        for (name, (generation, len)) in objects {
            let pg = spindle_map::object_pg(name, map_pg_count);
            let pgid = spindle_store::PgId { pool: 1, pg };
            if store.stat(pgid, name).is_none() {
                continue;
            }
            let data = store
                .read(pgid, name, 0, u64::MAX / 2)
                .await
                .unwrap_or_else(|e| panic!("osd.{id} {name}: {e}"));
            assert!(
                data == content(name, *generation, *len),
                "osd.{id}: {name} differs from the acknowledged write"
            );
            *found.entry(name.clone()).or_default() += 1;
        }
        store.shutdown().unwrap();
    }
    for name in objects.keys() {
        assert_eq!(
            found.get(name).copied().unwrap_or(0),
            copies,
            "{name}: copies"
        );
    }
}

pub fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Health is OK apart from a nearfull warning: the daemons of a test cluster live on the
/// machine's own disk, which may be more than 85% used (this VM's is), so HEALTH_OK
/// itself depends on the machine.
pub fn healthy_but_for_disk_usage(status: &serde_json::Value) -> bool {
    status["health"]["checks"]
        .as_array()
        .is_some_and(|checks| checks.iter().all(|c| c["name"] == "OSD_NEARFULL"))
}

/// A `spindle nbd` child (stderr appended to `DIR/nbd.log`); SIGKILLed on drop.
pub struct NbdProc {
    pub child: Child,
    /// Kept open so the child never blocks on (or dies of) a closed stdout.
    _stdout: BufReader<ChildStdout>,
    pub addr: String,
    /// Where it serves Prometheus metrics (from its banner), unless `--metrics-listen off`.
    pub metrics_addr: Option<String>,
    log: PathBuf,
}

impl NbdProc {
    /// Starts `spindle nbd --listen 127.0.0.1:0` on the cluster and waits for its banner.
    pub fn start(c: &Cluster) -> NbdProc {
        NbdProc::start_with(c, &[])
    }

    /// [`NbdProc::start`] with more arguments (e.g. `--break-lock`).
    pub fn start_with(c: &Cluster, extra: &[&str]) -> NbdProc {
        let log_path = c.dir.join("nbd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("nbd log");
        let mut child = spindle()
            .args(["nbd", "--listen", "127.0.0.1:0", "--dir"])
            .arg(&c.dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn spindle nbd");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let addr = loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read banner");
            assert!(
                n > 0,
                "spindle nbd exited before listening: {:?}; log: {}",
                child.try_wait(),
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            if let Some(rest) = line.trim().strip_prefix("spindle nbd: serving on ") {
                break rest.to_string();
            }
        };
        // The rest of the banner, up to its last line: the metrics address if any.
        let mut metrics_addr = None;
        loop {
            line.clear();
            if stdout.read_line(&mut line).expect("read banner") == 0 {
                break;
            }
            if let Some(rest) = line.trim().strip_prefix("metrics: http://") {
                metrics_addr = rest.strip_suffix("/metrics").map(String::from);
            }
            if line.starts_with("stop with") {
                break;
            }
        }
        // The banner is printed after bind, so connections are accepted now.
        std::net::TcpStream::connect(&addr).expect("nbd server accepts connections");
        NbdProc {
            child,
            _stdout: stdout,
            addr,
            metrics_addr,
            log: log_path,
        }
    }

    /// What the server logged so far (stderr, appended across restarts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn uri(&self, image: &str) -> String {
        format!("nbd://{}/{image}", self.addr)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit (flush, then exit 0).
    pub fn terminate(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "spindle nbd exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "spindle nbd ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NbdProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A daemon counter summed over every daemon (`status --json`).
pub fn counter(c: &Cluster, name: &str) -> u64 {
    let s = c.status();
    s["osds"]
        .as_array()
        .expect("osds")
        .iter()
        .filter_map(|o| o["counters"][name].as_u64())
        .sum()
}

/// Waits for a daemon counter (summed) to reach `at_least`: counters travel with
/// heartbeats.
pub async fn wait_counter(c: &Cluster, name: &str, at_least: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = counter(c, name);
        if now >= at_least {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {now}, expected at least {at_least}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
