//! `spindle nbd`: serves every block image of a pool over NBD (Network Block Device), so
//! any NBD client (`nbdinfo`, `qemu-img`, `qemu-io`, `nbdcopy`, fio's `nbd` engine, the
//! kernel's `nbd-client`) can use Spindle images as disks.
//!
//! # Adapter design
//!
//! The adapter lives in `spindle_image::nbd`:
//! * `ImageDevice` implements [`spindle_nbd::BlockDevice`] over one
//!   `Arc<BlockLayer<Client>>` (LRU cache + coalescing scheduler over an `Image`).
//! * `ImageExports` implements [`spindle_nbd::Exports`] over a pool: `list` is
//!   `Image::list`; `open(name)` opens the image once and caches the device, so every
//!   connection to an image shares ONE block layer (one cache, one write tracker).
//!
//! # Semantics
//!
//! * Every Spindle client write is acknowledged only when it is durable on all up
//!   replicas, so a completed NBD WRITE is already stable: FUA needs nothing extra, and
//!   FLUSH only has to wait for the writes still in flight (`BlockLayer::flush`).
//! * Multi-connection consistency (`NBD_FLAG_CAN_MULTI_CONN`) holds because all
//!   connections of an export go through the same block layer and completed writes are
//!   durable: a FLUSH on any connection covers writes completed on every connection.
//! * TRIM discards (reads return zeros), WRITE_ZEROES writes zeros (or discards whole
//!   objects; the image is thin either way).
//! * An image resized while it is exported keeps its old size until the server restarts.

use crate::daemon::init_logging;
use anyhow::{bail, Context};
use clap::Args;
use spindle_cluster::Target;

use spindle_image::lock::LockOptions;
use spindle_image::nbd::{ImageDevice, ImageExports};
use spindle_image::wlog::{WriteLogConfig, WRITE_LOG_BYTES_MIN};
use spindle_image::{BlockConfig, Image};
use spindle_nbd::{NbdServer, ServerConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Default NBD port (IANA-assigned 10809).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// How long a graceful shutdown waits for connections to drain before flushing anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `spindle nbd`.
#[derive(Args)]
pub struct NbdArgs {
    /// TCP address to listen on (port 0 = any free port; the chosen one is printed).
    #[arg(long, default_value = DEFAULT_LISTEN, conflicts_with = "socket")]
    pub listen: String,
    /// Listen on this Unix-domain socket instead of TCP (a stale socket file is replaced).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Pool whose images are exported (each as an export named after the image).
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// Read cache per exported image, in MiB (0 disables the cache).
    #[arg(long, default_value_t = 32)]
    pub cache_mib: u64,
    /// Dispatch every request at once instead of holding and merging adjacent ones.
    #[arg(long)]
    pub no_coalesce: bool,
    /// Do not fetch ahead of sequential readers (default: 8 MiB ahead once a stream has
    /// read 256 KiB in order).
    #[arg(long)]
    pub no_readahead: bool,
    /// Take over the lock of an image another client holds (e.g. a stalled `spindle
    /// nbd`): that client is fenced first, and the daemons refuse its writes from then on.
    /// Without it such an image is refused, with the holder named. A holder whose lease ran
    /// out, or a process of this host that is gone, is taken over without it.
    #[arg(long)]
    pub break_lock: bool,
    /// Acknowledge writes once they are durable in a local write log in this directory
    /// (one file per image), and publish them to the cluster in the background (LineFS's
    /// persist and publish). FLUSH and FUA wait until everything before them is published.
    /// After a crash, the log is replayed into the image before it is served again.
    #[arg(long, value_name = "DIR")]
    pub write_log: Option<PathBuf>,
    /// Ring size of each image's write log (K/M/G suffixes; at least 32M). Unpublished
    /// writes are also held in memory, so this bounds the memory they take too.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub write_log_size: String,
    /// Serve Prometheus metrics (`/metrics`: requests, bytes, per image latency
    /// histograms, cache and scheduler figures) on this address; `off` for none.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_listen: String,
    #[command(flatten)]
    pub target: Target,
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Prints how to reach the exports at `uri_base` (e.g. `nbd://127.0.0.1:10809`), given
/// a function that turns an export name into its URI.
fn print_usage(
    listening: &str,
    uri: &dyn Fn(&str) -> String,
    images: &[String],
    metrics: Option<std::net::SocketAddr>,
) {
    println!("spindle nbd: serving on {listening}");
    if images.is_empty() {
        println!("  (no images yet: `spindle image create NAME --size 10G`; new images are served at once)");
    }
    for name in images {
        println!("  export {name}: {}", uri(name));
    }
    let example = images.first().map(String::as_str).unwrap_or("IMAGE");
    let u = uri(example);
    println!("connect with:");
    println!("  nbdinfo --list '{}'", uri(""));
    println!("  qemu-img info '{u}'");
    println!(
        "  fio --name=t --ioengine=nbd --uri='{u}' --rw=randwrite --bs=4k --iodepth=16 --runtime=10 --time_based"
    );
    println!("  sudo nbd-client -N {example} ... /dev/nbd0   (kernel client)");
    if let Some(m) = metrics {
        println!("metrics: http://{m}/metrics");
    }
    println!("stop with Ctrl-C or SIGTERM (in-flight requests are answered and flushed)");
}

/// `spindle nbd`.
pub fn run(args: NbdArgs) -> anyhow::Result<()> {
    init_logging();
    spindle_trace::init_from_env("nbd");
    // One thread: its run queue is FIFO, so the tasks of a connection's requests reach
    // the block scheduler in arrival order and a sequential stream merges into whole-object
    // writes. The multi-threaded scheduler runs the newest task first (its LIFO slot), which
    // interleaved 512 KiB sequential writes so that batches averaged 2 requests instead of 8
    // (130 -> 258 MB/s with one thread, docs/benchmarks.md); 4 KiB random I/O is as fast.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(args))
}

async fn serve(args: NbdArgs) -> anyhow::Result<()> {
    let client = Arc::new(args.target.client().await?);
    let config = BlockConfig {
        cache_capacity_bytes: args
            .cache_mib
            .checked_mul(1 << 20)
            .context("--cache-mib is too large")?,
        coalesce_enabled: !args.no_coalesce,
        readahead_bytes: if args.no_readahead {
            0
        } else {
            spindle_image::block::READAHEAD_BYTES_DEFAULT
        },
        ..BlockConfig::default()
    };
    let images: Vec<String> = Image::list(&*client, &args.pool)
        .await
        .with_context(|| format!("cannot list the images of pool {}", args.pool))?
        .into_iter()
        .map(|i| i.name)
        .collect();
    let write_log = match &args.write_log {
        None => None,
        Some(dir) => {
            let ring_bytes = spindle_cluster::parse_size_bytes(&args.write_log_size)
                .map_err(|e| anyhow::anyhow!("--write-log-size {}: {e}", args.write_log_size))?;
            if ring_bytes < WRITE_LOG_BYTES_MIN || ring_bytes % 4096 != 0 {
                bail!(
                    "--write-log-size must be a multiple of 4K and at least {}M",
                    WRITE_LOG_BYTES_MIN >> 20
                );
            }
            Some(WriteLogConfig::new(dir, ring_bytes))
        }
    };
    let exports = Arc::new(
        ImageExports::new(client.clone(), args.pool.clone(), config)
            .with_locking(Some(LockOptions {
                take_over: args.break_lock,
                ..LockOptions::default()
            }))
            .with_write_log(write_log),
    );
    let mut server_config = ServerConfig::default();
    if let Some(mib) = std::env::var("SPINDLE_PAYLOAD_BUDGET_MIB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        server_config.payload_budget_bytes =
            (mib << 20).max(server_config.max_request_bytes as u64);
    }
    if let Some(ms) = std::env::var("SPINDLE_FRAME_DEADLINE_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        server_config.payload_deadline_ms_base = ms;
        server_config.payload_deadline_ms_per_mib = 0;
    }
    let server = Arc::new(NbdServer::new(exports.clone(), server_config));
    // After a burst of large writes, hand the freed payload buffers back to the system.
    let _trimmer = {
        let server = server.clone();
        spindle_proto::net::AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                let peak = server.take_payload_peak_bytes();
                if peak >= 64 << 20 && server.stats().payload_bytes_in_use < 16 << 20 {
                    spindle_proto::net::trim_heap();
                }
            }
        }))
    };
    // With a write log: its counters, every half second, in `<log>.stats.json` (for
    // operators and `spindle bench fio --write-log`), written whole (temporary + rename).
    let _log_stats = args.write_log.is_some().then(|| {
        let exports = exports.clone();
        spindle_proto::net::AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                for (_, dev) in exports.opened().await {
                    if let Some(w) = dev.write_log() {
                        write_log_stats_file(w.path(), &w.stats());
                    }
                }
            }
        }))
    });
    // Prometheus metrics: the server's counters and each opened image's figures, read at
    // scrape time from a list of the opened devices refreshed every second.
    let devices: Arc<std::sync::Mutex<OpenedDevices>> = Default::default();
    let _device_list = {
        let (exports, devices) = (exports.clone(), devices.clone());
        spindle_proto::net::AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let opened = exports.opened().await;
                *devices.lock().unwrap_or_else(|p| p.into_inner()) = opened;
            }
        }))
    };
    let metrics = match args.metrics_listen.as_str() {
        "off" => None,
        listen => {
            let mut registry = spindle_metrics::prometheus_client::registry::Registry::default();
            let (server, devices, pool) = (server.clone(), devices.clone(), args.pool.clone());
            registry.register_collector(Box::new(spindle_metrics::Snapshot::new(move || {
                let devices = devices.lock().unwrap_or_else(|p| p.into_inner()).clone();
                nbd_samples(&server.stats(), &pool, &devices)
            })));
            Some(
                spindle_metrics::serve(listen, Arc::new(registry), None)
                    .await
                    .with_context(|| format!("cannot serve metrics on {listen}"))?,
            )
        }
    };
    // Registered with the leader monitor every 2 s, so `spindle status --json` lists it,
    // with the images served (the dashboard's images: counters every 2 s, used space from
    // a listing of the pool every 30 s).
    let _registration = metrics.as_ref().map(|m| {
        let host: String = spindle_cluster::config::this_host()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let name = format!("nbd.{host}.{}", std::process::id());
        let addr = m.addr.to_string();
        let (client, devices, pool) = (client.clone(), devices.clone(), args.pool.clone());
        spindle_proto::net::AbortOnDrop(tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(spindle_mon::MON_METRICS_REGISTER_MS));
            let mut warned = false;
            let mut used = UsedBytes::default();
            loop {
                tick.tick().await;
                let opened = devices.lock().unwrap_or_else(|p| p.into_inner()).clone();
                used.refresh(&client, &pool, !opened.is_empty()).await;
                let images = image_reports(&pool, &opened, &used.by_image);
                let cmd = spindle_mon::AdminCommand::MetricsRegister {
                    name: name.clone(),
                    addr: addr.clone(),
                    images,
                };
                if let Err(e) = client.command_as::<serde_json::Value>(cmd.to_args()).await {
                    if !warned {
                        eprintln!("spindle nbd: cannot register the metrics address: {e}");
                        warned = true;
                    }
                }
            }
        }))
    });
    // Each served image's limits (re-read from its header) and its I/O statistics
    // (`img.NAME.stats`, for `spindle image stats`), every second.
    let _housekeeping =
        spindle_proto::net::AbortOnDrop(tokio::spawn(exports.clone().housekeeping_loop()));
    let (stop_tx, stop_rx) = watch::channel(false);

    let serving = if let Some(path) = &args.socket {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                bail!("{} exists and is not a socket", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
        }
        let listener = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let sock = path.display().to_string();
        print_usage(
            &format!("unix:{sock}"),
            &|name| format!("nbd+unix:///{name}?socket={sock}"),
            &images,
            metrics.as_ref().map(|m| m.addr),
        );
        tokio::spawn(server.clone().serve_unix(listener, stop_rx))
    } else {
        let listener = listen_tcp(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr().context("listener address")?;
        print_usage(
            &addr.to_string(),
            &|name| format!("nbd://{addr}/{name}"),
            &images,
            metrics.as_ref().map(|m| m.addr),
        );
        tokio::spawn(server.clone().serve_tcp(listener, stop_rx))
    };
    {
        use std::io::Write;
        // The banner tells scripts the server is ready; make sure it is out.
        let _ = std::io::stdout().flush();
    }

    let mut serving = serving;
    tokio::select! {
        r = termination() => r?,
        r = &mut serving => {
            r.context("server task failed")?.context("server failed")?;
            bail!("the server stopped unexpectedly");
        }
    }
    eprintln!("spindle nbd: shutting down: answering in-flight requests, then flushing");
    let _ = stop_tx.send(true);
    match tokio::time::timeout(DRAIN_TIMEOUT, &mut serving).await {
        Ok(r) => r.context("server task failed")?.context("server failed")?,
        Err(_) => {
            eprintln!(
                "spindle nbd: connections still open after {DRAIN_TIMEOUT:?}; flushing anyway"
            );
            serving.abort();
        }
    }
    exports
        .flush_all()
        .await
        .map_err(|e| anyhow::anyhow!("final flush failed: {e}"))?;
    exports.release_locks().await;
    let s = server.stats();
    eprintln!(
        "spindle nbd: stopped: {} connections, {} reads ({} bytes), {} writes ({} bytes), {} flushes, {} trims, {} write-zeroes, {} error replies",
        s.connections_accepted,
        s.requests_read,
        s.bytes_read,
        s.requests_write,
        s.bytes_written,
        s.requests_flush,
        s.requests_trim,
        s.requests_write_zeroes,
        s.error_replies
    );
    for (name, dev) in exports.opened().await {
        let b = dev.layer().stats();
        eprintln!(
            "  {name}: cache hits {} misses {} evictions {}; scheduler: {} requests, {} merged \
             into others, {} object operations ({} whole-object writes), {} us added delay in \
             total",
            b.cache_hits,
            b.cache_misses,
            b.cache_evictions,
            b.sched_requests,
            b.sched_merges,
            b.sched_backend_ops,
            b.sched_whole_object_writes,
            b.sched_delay_total_us
        );
        if let Some(w) = dev.write_log() {
            let s = w.stats();
            eprintln!(
                "  {name}: write log: {} records ({} bytes) in {} group commits, {} published in \
                 {} chunks ({} writes after coalescing), {} waits for ring space",
                s.appended_records,
                s.appended_bytes,
                s.group_commits,
                s.published_records,
                s.publish_chunks,
                s.publish_writes,
                s.full_waits
            );
        }
    }
    if let Some(path) = &args.socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The images a server opened (name, device).
type OpenedDevices = Vec<(String, Arc<ImageDevice>)>;

/// How often `spindle nbd` lists its pool for the used space of the images it serves.
const USED_REFRESH: Duration = Duration::from_secs(30);

/// The used bytes of every image of the pool, from the last listing.
#[derive(Default)]
struct UsedBytes {
    by_image: std::collections::HashMap<String, u64>,
    listed_at: Option<tokio::time::Instant>,
}

impl UsedBytes {
    /// Lists the pool again if [`USED_REFRESH`] passed (and images are served).
    async fn refresh(&mut self, client: &spindle_client::Client, pool: &str, serving: bool) {
        if !serving || self.listed_at.is_some_and(|t| t.elapsed() < USED_REFRESH) {
            return;
        }
        self.listed_at = Some(tokio::time::Instant::now());
        match spindle_image::transfer::usage(client, pool, None).await {
            Ok(list) => {
                self.by_image = list.into_iter().map(|u| (u.name, u.used_bytes)).collect();
            }
            Err(e) => tracing::debug!("listing {pool} for used space: {e}"),
        }
    }
}

/// What the monitor's dashboard shows of each served image (at most
/// [`spindle_mon::IMAGE_REPORTS_MAX`]).
fn image_reports(
    pool: &str,
    devices: &[(String, Arc<ImageDevice>)],
    used: &std::collections::HashMap<String, u64>,
) -> Vec<spindle_mon::ImageReport> {
    devices
        .iter()
        .take(spindle_mon::IMAGE_REPORTS_MAX)
        .map(|(name, dev)| {
            let t = dev.io_stats().totals();
            spindle_mon::ImageReport {
                pool: pool.to_string(),
                image: name.clone(),
                size_bytes: dev.layer().size_bytes(),
                used_bytes: used.get(name).copied(),
                read_ops: t.read_ops,
                write_ops: t.write_ops,
                read_bytes: t.read_bytes,
                write_bytes: t.write_bytes,
                read_latency_us: t.read_latency_ns / 1000,
                write_latency_us: t.write_latency_ns / 1000,
                served_by: String::new(),
            }
        })
        .collect()
}

/// What a scrape of `spindle nbd` shows: the server's request counters, and per opened
/// image its operations, bytes, latency histograms, cache and scheduler figures.
fn nbd_samples(
    s: &spindle_nbd::ServerStats,
    pool: &str,
    devices: &[(String, Arc<ImageDevice>)],
) -> Vec<spindle_metrics::Sample> {
    use spindle_metrics::Sample;
    let mut out = Vec::new();
    for (op, n) in [
        ("read", s.requests_read),
        ("write", s.requests_write),
        ("flush", s.requests_flush),
        ("trim", s.requests_trim),
        ("write_zeroes", s.requests_write_zeroes),
        ("cache", s.requests_cache),
        ("block_status", s.requests_block_status),
        ("disc", s.requests_disc),
        ("unknown", s.requests_unknown),
    ] {
        out.push(
            Sample::counter(
                "spindle_nbd_requests",
                "NBD requests received, by command",
                n,
            )
            .label("op", op),
        );
    }
    for (op, n) in [("read", s.bytes_read), ("write", s.bytes_written)] {
        out.push(
            Sample::counter(
                "spindle_nbd_payload_bytes",
                "NBD payload bytes: sent by reads, received by writes",
                n,
            )
            .label("op", op),
        );
    }
    out.extend([
        Sample::counter(
            "spindle_nbd_connections",
            "NBD connections accepted",
            s.connections_accepted,
        ),
        Sample::gauge(
            "spindle_nbd_connections_active",
            "NBD connections open now",
            s.connections_active as f64,
        ),
        Sample::counter(
            "spindle_nbd_error_replies",
            "NBD requests answered with an error",
            s.error_replies,
        ),
        Sample::counter(
            "spindle_nbd_protocol_errors",
            "NBD connections dropped for breaking the protocol",
            s.protocol_errors,
        ),
        Sample::gauge(
            "spindle_nbd_payload_bytes_in_use",
            "Write payload bytes held now",
            s.payload_bytes_in_use as f64,
        ),
    ]);
    for (name, dev) in devices {
        let with = |x: Sample| x.label("pool", pool).label("image", name.clone());
        let t = dev.io_stats().totals();
        let (read_lat, write_lat) = dev.io_stats().latencies();
        for (op, ops, bytes, lat) in [
            ("read", t.read_ops, t.read_bytes, &read_lat),
            ("write", t.write_ops, t.write_bytes, &write_lat),
        ] {
            out.push(with(
                Sample::counter("spindle_image_ops", "Image operations done, by type", ops)
                    .label("op", op),
            ));
            out.push(with(
                Sample::counter(
                    "spindle_image_bytes",
                    "Image bytes read or written, by type",
                    bytes,
                )
                .label("op", op),
            ));
            out.push(with(
                Sample::latency(
                    "spindle_image_op_duration_seconds",
                    "Image operation latency as its clients see it, by type (writes: also \
                     flushes, trims and zeroing)",
                    lat,
                )
                .label("op", op),
            ));
        }
        out.push(with(Sample::gauge(
            "spindle_image_ops_in_flight",
            "Image operations in progress",
            t.in_flight as f64,
        )));
        let b = dev.layer().stats();
        for (metric, help, v) in [
            (
                "spindle_image_cache_hits",
                "Extent lookups served from the image's cache",
                b.cache_hits,
            ),
            (
                "spindle_image_cache_misses",
                "Extent lookups that went to the cluster",
                b.cache_misses,
            ),
            (
                "spindle_image_sched_requests",
                "Requests given to the coalescing scheduler",
                b.sched_requests,
            ),
            (
                "spindle_image_sched_merges",
                "Requests merged into an open batch",
                b.sched_merges,
            ),
            (
                "spindle_image_sched_backend_ops",
                "Object operations the scheduler issued",
                b.sched_backend_ops,
            ),
            (
                "spindle_image_readahead_hits",
                "Reads served from readahead",
                b.readahead_hits,
            ),
        ] {
            out.push(with(Sample::counter(metric, help, v)));
        }
        out.push(with(Sample::gauge(
            "spindle_image_cache_bytes",
            "Bytes in the image's cache",
            b.cache_bytes as f64,
        )));
    }
    out
}

/// Pending connections the listening socket queues before `accept` (the kernel caps it at
/// `net.core.somaxconn`). tokio's default, 1024, overflowed under a burst of 2,000
/// connects (the stress test in `tests/nbd.rs`): the kernel then dropped the clients' final
/// ACKs and a few hundred clients waited for a greeting that never came.
const LISTEN_BACKLOG: u32 = 8192;

/// A TCP listener on `addr` (host:port, first address that binds) with `LISTEN_BACKLOG`.
async fn listen_tcp(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for sa in tokio::net::lookup_host(addr).await? {
        let socket = if sa.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(sa).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr}: no address to listen on"))))
}

/// Writes `<log>.stats.json`: the log's counters and the time they were taken.
fn write_log_stats_file(log: &std::path::Path, stats: &spindle_image::wlog::WriteLogStats) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut v = serde_json::to_value(stats).unwrap_or_default();
    v["unix_ms"] = serde_json::json!(now_ms);
    let path = spindle_image::wlog::stats_path(log);
    let tmp = path.with_extension("json.tmp");
    let written = std::fs::write(&tmp, v.to_string()).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::debug!("cannot write {}: {e}", path.display());
    }
}
