//! `spindle agent --write-log DIR --cpus LIST`: the write log's offload agent (LineFS's
//! publisher on its own cores). It pins itself to LIST, holds `DIR/agent.lock`, and
//! publishes the log of every `spindle nbd --write-log DIR` front end that finds it
//! there when its log opens (see `spindle_image::wlog::agent`).

use anyhow::{bail, Context};
use clap::Args;
use spindle_client::{Client, ClientConfig};
use spindle_cluster::Target;
use spindle_image::block::BlockConfig;
use spindle_image::wlog::agent::{self, Ctl, Stopped, F};
use spindle_image::{BlockLayer, Image};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often the agent looks for new front ends in its directory.
const SCAN_EVERY: Duration = Duration::from_millis(100);

#[derive(Args)]
pub struct AgentArgs {
    /// The write log directory of the `spindle nbd --write-log DIR` front ends to serve.
    #[arg(long, value_name = "DIR")]
    pub write_log: PathBuf,
    /// CPUs to run on (e.g. `1` or `2-3,6`); default: wherever the system puts it.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    crate::daemon::init_logging();
    // Before the runtime starts its threads: they inherit the mask.
    if let Some(list) = &args.cpus {
        let cpus = agent::parse_cpus(list).map_err(|e| anyhow::anyhow!("--cpus: {e}"))?;
        agent::pin_thread(0, &cpus).with_context(|| format!("cannot pin to CPUs {list}"))?;
    }
    std::fs::create_dir_all(&args.write_log)
        .with_context(|| format!("cannot create {}", args.write_log.display()))?;
    let _lock = hold_lock(&args.write_log)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(args))
}

/// Takes `DIR/agent.lock` (one agent per directory), writing this pid into it.
fn hold_lock(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let path = agent::agent_lock_path(dir);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let other = std::fs::read_to_string(&path).unwrap_or_default();
        bail!(
            "another agent serves {} (pid {})",
            dir.display(),
            other.trim()
        );
    }
    f.set_len(0)?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

async fn serve(args: AgentArgs) -> anyhow::Result<()> {
    let mon = args.target.mon_addr()?;
    let identity = args.target.identity()?;
    let pid = agent::own_pid();
    println!(
        "spindle agent: serving the write logs in {} (pid {pid}{})",
        args.write_log.display(),
        args.cpus
            .as_deref()
            .map(|c| format!(", CPUs {c}"))
            .unwrap_or_default()
    );
    {
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    // Control page path -> its publishing task.
    let mut serving: HashMap<PathBuf, tokio::task::JoinHandle<()>> = HashMap::new();
    // Pages of another cluster's images (a new front end makes a new page: checked again).
    let mut refused: std::collections::HashSet<(PathBuf, u64)> = Default::default();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    loop {
        serving.retain(|_, t| !t.is_finished());
        refused.retain(|(page, _)| page.exists());
        for ctl_file in control_pages(&args.write_log) {
            if serving.contains_key(&ctl_file) {
                continue;
            }
            let Ok(Some(ctl)) = Ctl::open(&ctl_file) else {
                continue;
            };
            if refused.contains(&(ctl_file.clone(), ctl.get(F::LogId))) {
                continue;
            }
            let holder = ctl.get(F::AgentPid);
            let attachable = ctl.get(F::Stop) == 0
                && ctl.get(F::Failed) == 0
                && ctl.alive(F::FrontPid, F::FrontBeatMs)
                && ctl.publisher_gone();
            if !attachable || !ctl.swap_if(F::AgentPid, holder, pid) {
                continue;
            }
            ctl.set(F::AgentBeatMs, agent::now_ms());
            ctl.set(F::AgentCpus, agent::own_cpu_mask());
            let client_id = ctl.get(F::ClientId);
            // A client per front end, dropped with its task: front ends come and go (each
            // with a new id), and the agent must hold its descriptors flat.
            let mut config = ClientConfig::new(mon.clone());
            config.client_id = Some(client_id);
            config.auth = identity.clone();
            let client = match Client::connect(config).await {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    eprintln!("spindle agent: cannot reach the cluster at {mon}: {e}");
                    ctl.swap_if(F::AgentPid, pid, 0);
                    continue;
                }
            };
            let cluster = client.map().cluster_id;
            if ctl.get(F::ClusterId) != cluster {
                eprintln!(
                    "spindle agent: {}: its image lives in another cluster (id {:x}; this agent \
                     serves {cluster:x}); not publishing it",
                    ctl_file.display(),
                    ctl.get(F::ClusterId)
                );
                ctl.swap_if(F::AgentPid, pid, 0);
                refused.insert((ctl_file, ctl.get(F::LogId)));
                continue;
            }
            let log = log_of(&ctl_file);
            let ctl = Arc::new(ctl);
            let task = tokio::spawn(async move {
                match publish(&log, ctl.clone(), client, pid).await {
                    Ok(stopped) => {
                        println!("spindle agent: {}: detached ({stopped:?})", log.display())
                    }
                    Err(e) => eprintln!("spindle agent: {}: {e:#}", log.display()),
                }
            });
            serving.insert(ctl_file, task);
        }
        tokio::select! {
            _ = tokio::time::sleep(SCAN_EVERY) => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    println!(
        "spindle agent: stopping ({} logs served; their front ends publish themselves now)",
        serving.len()
    );
    for (_, t) in serving {
        t.abort();
    }
    Ok(())
}

/// Opens the image of the log at `log` and publishes it until its front end lets go.
async fn publish(
    log: &Path,
    ctl: Arc<Ctl>,
    client: Arc<Client>,
    pid: u64,
) -> anyhow::Result<Stopped> {
    let name = spindle_image::wlog::log_name(log)
        .with_context(|| format!("cannot read the superblock of {}", log.display()))?;
    let (pool, image) = name
        .split_once('/')
        .with_context(|| format!("{}: bad image name {name:?}", log.display()))?;
    println!(
        "spindle agent: {}: publishing {pool}/{image}",
        log.display()
    );
    let image = match Image::open(client, pool, image).await {
        Ok(i) => i,
        Err(e) => {
            ctl.set(F::AgentPid, 0);
            return Err(e).with_context(|| format!("cannot open image {name}"));
        }
    };
    // No cache and no merging here: the front end caches; the publisher batches itself.
    let config = BlockConfig {
        cache_capacity_bytes: 0,
        coalesce_enabled: false,
        readahead_bytes: 0,
        ..BlockConfig::default()
    };
    let layer = Arc::new(BlockLayer::new(Arc::new(image), config)?);
    agent::publish_from_file(log, ctl, layer, pid)
        .await
        .map_err(|e| anyhow::anyhow!(e))
}

/// The control pages in `dir`.
fn control_pages(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "ctl"))
        .collect()
}

/// The log a control page belongs to (`<log>.ctl` -> `<log>`).
fn log_of(ctl: &Path) -> PathBuf {
    ctl.with_extension("")
}
