//! Daemon entry points: `spindle mon run` and `spindle osd run` (what `spindle up` starts).

use anyhow::Context;
use clap::Args;
use spindle_cluster::write_atomic;
use std::path::PathBuf;

#[derive(Args)]
pub struct MonRunArgs {
    /// Monitor directory (database, address file).
    #[arg(long)]
    pub dir: PathBuf,
    /// A new monitor joining a running group as this id: an empty directory is prepared
    /// for it (then `spindle mon add --id ID --addr ADDR` makes it a member). Ignored when
    /// the directory holds a monitor.
    #[arg(long)]
    pub id: Option<u64>,
    /// Address to listen on. Default: the address used last time (from DIR/addr), else a
    /// free port on 127.0.0.1.
    #[arg(long)]
    pub listen: Option<String>,
    /// Mark a daemon down after this long without heartbeats.
    #[arg(long, default_value_t = spindle_mon::DOWN_AFTER_MS_DEFAULT)]
    pub down_after_ms: u64,
    /// Mark a daemon out (re-create its data elsewhere) after it was down this long;
    /// 0 = never.
    #[arg(long, default_value_t = 30_000)]
    pub out_after_ms: u64,
    /// Encrypt every authenticated session's payloads (ChaCha20-Poly1305), not only MAC
    /// them. Clients and daemons follow the server's choice by themselves.
    #[arg(long)]
    pub encrypt: bool,
    /// Serve Prometheus metrics on this address (`/metrics`); `off` for none. Default: a
    /// free port on 127.0.0.1 (`spindle status --json` lists it).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_listen: String,
}

/// `--metrics-listen`: None for `off`.
fn metrics_listen(arg: &str) -> Option<String> {
    (arg != "off").then(|| arg.to_string())
}

#[derive(Args)]
pub struct OsdRunArgs {
    /// Daemon id (a device of the cluster's CRUSH map).
    #[arg(long)]
    pub id: u32,
    /// Data directory of this daemon.
    #[arg(long)]
    pub dir: PathBuf,
    /// Monitor address.
    #[arg(long)]
    pub mon: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Background recovery: objects recovered at once (as primary).
    #[arg(long, default_value_t = 2)]
    pub recovery_ops_max: usize,
    /// Background recovery: bytes per second; 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    pub recovery_bytes_per_sec: u64,
    /// Scrub each placement group this often; 0 = only on demand (`spindle scrub`).
    #[arg(long, default_value_t = 24 * 3600 * 1000)]
    pub scrub_interval_ms: u64,
    /// A client operation unanswered this long is slow: counted, and reported to the
    /// monitors (the `SLOW_OPS` health check). Ceph's `osd_op_complaint_time`.
    #[arg(long, default_value_t = spindle_osd::SLOW_OP_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..))]
    pub slow_op_ms: u64,
    /// Threads that run pushdown programs (`spindle exec`), under `SCHED_IDLE`: programs never
    /// run on the threads that serve I/O.
    #[arg(long, default_value_t = spindle_osd::EXEC_THREADS_DEFAULT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub exec_threads: usize,
    /// MiB of object data kept for repeated program runs (`spindle exec --cache`); a
    /// write makes an object's entry stale at once.
    #[arg(long, default_value_t = spindle_osd::EXEC_CACHE_BYTES_DEFAULT >> 20)]
    pub exec_cache_mib: u64,
    /// Share of one CPU, in percent, that the execution threads may use together (a
    /// timer on their CPU clock pauses them): programs never take the CPUs I/O needs.
    /// Above 100 on machines with CPUs to spare (e.g. 200 with `--exec-threads 2`).
    #[arg(long, default_value_t = spindle_osd::cpu_budget::EXEC_CPU_PERCENT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=spindle_osd::cpu_budget::EXEC_CPU_PERCENT_MAX as i64))]
    pub exec_cpu_percent: u32,
    /// Encrypt every authenticated session's payloads (ChaCha20-Poly1305), not only MAC
    /// them. Clients and other daemons follow the server's choice by themselves.
    #[arg(long)]
    pub encrypt: bool,
    /// Serve Prometheus metrics on this address (`/metrics`); `off` for none. Default: a
    /// free port on 127.0.0.1 (`spindle status --json` lists it).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_listen: String,
}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPINDLE_LOG")
        // openraft logs every retry to an unreachable monitor (twice a second) as an
        // error; the monitor logs peers going and coming back itself.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The daemons' runtime: one thread runs the whole control and network path
/// (run-to-completion; the store and the I/O engine have their own threads), so a request
/// never hops between scheduler threads. `SPINDLE_DAEMON_THREADS=N` gives N workers.
pub fn daemon_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    match std::env::var("SPINDLE_DAEMON_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) if n > 1 => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .context("cannot start the async runtime")
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

pub fn mon_run(args: MonRunArgs) -> anyhow::Result<()> {
    init_logging();
    let addr_file = args.dir.join("addr");
    let listen = match args.listen {
        Some(l) => l,
        None => std::fs::read_to_string(&addr_file)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "127.0.0.1:0".to_string()),
    };
    if let Some(id) = args.id {
        spindle_mon::prepare_join(&args.dir, id)?;
    }
    let rt = daemon_runtime()?;
    rt.block_on(async move {
        let mut config = spindle_mon::MonConfig::new(&args.dir);
        config.listen = listen;
        config.down_after_ms = args.down_after_ms;
        config.out_after_ms = args.out_after_ms;
        config.encrypt = args.encrypt;
        config.metrics_listen = metrics_listen(&args.metrics_listen);
        let bound = spindle_mon::BoundMonitor::bind(config).await?;
        write_atomic(&addr_file, &bound.addr.to_string())?;
        write_atomic(&args.dir.join("pid"), &std::process::id().to_string())?;
        tokio::spawn(crate::trimmer::run(bound.monitor(), bound.addr.clone()));
        bound.run(termination()).await?;
        anyhow::Ok(())
    })
}

pub fn osd_run(args: OsdRunArgs) -> anyhow::Result<()> {
    init_logging();
    spindle_trace::init_from_env(&format!("osd.{}", args.id));
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    write_atomic(&args.dir.join("pid"), &std::process::id().to_string())?;
    let rt = daemon_runtime()?;
    rt.block_on(async move {
        let mut config = spindle_osd::OsdConfig::new(args.id, &args.dir, args.mon);
        config.listen = args.listen;
        config.recovery_ops_max = args.recovery_ops_max;
        config.recovery_bytes_per_sec = args.recovery_bytes_per_sec;
        config.scrub_interval_ms = args.scrub_interval_ms;
        config.slow_op_ms = args.slow_op_ms;
        config.exec_threads = args.exec_threads;
        config.exec_cache_bytes = args.exec_cache_mib << 20;
        config.exec_cpu_percent = args.exec_cpu_percent;
        config.encrypt = args.encrypt;
        config.metrics_listen = metrics_listen(&args.metrics_listen);
        // The store's disk reads from this thread go on its own ring (no hand-off to the
        // engine's ring threads); a multi-threaded runtime keeps the engine.
        if let Err(e) = spindle_io::reactor::install() {
            tracing::warn!("no io_uring ring on the daemon's thread ({e}); reads use the engine");
        }
        spindle_osd::Osd::run(config, termination()).await?;
        anyhow::Ok(())
    })
}
