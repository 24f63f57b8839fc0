//! `spindle bench io`: the `spindle-io` engine against `fio --ioengine=io_uring` on the same
//! file, in the same run (SYSTEM.md §4-5).
//!
//! Three jobs, each run once through Spindle and once through fio with matching parameters:
//! 4 KiB random read at queue depth 32 with O_DIRECT; 128 KiB sequential read at queue depth
//! 8 (buffered, as fio's default); 4 KiB random write at queue depth 16 with one fdatasync
//! per 16 writes (buffered; as fio's `--fdatasync=16`: the sync takes a queue slot and no
//! write is issued while it is in flight, see `SyncGate`). Both sides run one
//! submitting thread in a closed loop. Latency is submission to reaped completion for data
//! requests only (fio: `lat_ns` with `lat_percentiles=1`); syncs are excluded on both sides.
//! The `--seconds` budget is split evenly over the six runs. Before each run the file is
//! synced and, for buffered jobs, read once into the page cache (fio gets `invalidate=0`), so
//! both sides start from the same state and buffered jobs measure the I/O path, not the disk.

use std::future::Future;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use spindle_io::{
    BackendChoice, Config, Engine, FileRef, FixedBuf, FixedBufPool, FixedFile, IoBuf, Op, Request,
    RingThreads,
};

use crate::common::{print_report, BenchResult};

/// Arguments of `spindle bench io`.
#[derive(clap::Args, Debug)]
pub struct BenchIoArgs {
    /// Print one JSON object (SYSTEM.md §5) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Total time budget in seconds for the six timed runs (file creation not included).
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Test file (created with 1 GiB of data if missing or of another size; kept afterwards).
    #[arg(long, default_value = "spindle-bench-io.dat")]
    pub file: PathBuf,
    /// Test file size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// io_uring instances in Spindle's engine.
    #[arg(long, default_value_t = 1)]
    pub rings: usize,
    /// Two threads per ring (submitter + completer) instead of one.
    #[arg(long)]
    pub two_threads: bool,
    /// fio binary.
    #[arg(long, default_value = "fio")]
    pub fio: String,
    /// How long the benchmark thread polls (yielding) for completions before it sleeps,
    /// e.g. `50us`; 0 sleeps at once.
    #[arg(long, default_value = "0us", value_parser = parse_duration)]
    pub spin: Duration,
    /// Single-thread rings: how long the ring thread polls for new work before it sleeps
    /// (`Config::idle_spin`), e.g. `20us`.
    #[arg(long, default_value = "0us", value_parser = parse_duration)]
    pub ring_spin: Duration,
    /// Only run jobs whose name contains this text (randread, seqread, randwrite).
    #[arg(long)]
    pub filter: Option<String>,
    /// Which Spindle path to measure: `engine` (the thread-safe `Engine`: ring threads,
    /// staging queues), `local` (`LocalRing`: the caller's thread drives its own ring, as in
    /// the thread-per-core data path and as fio does), or `both`.
    #[arg(long, default_value = "both", value_parser = ["engine", "local", "both"])]
    pub mode: String,
    /// Registered buffers and files on both sides: Spindle's `register_buffers` /
    /// `register_files` with `ReadFixed`/`WriteFixed`, and fio's `--fixedbufs
    /// --registerfiles`. Off by default (fio's defaults: neither).
    #[arg(long)]
    pub fixed: bool,
    /// LocalRing: submit the ops refilled after a round of completions together (one
    /// `io_uring_enter` that submits and waits) instead of each as soon as it is queued.
    /// fio's default (`iodepth_batch_submit=1`) submits each at once, and so does the
    /// benchmark by default: on the virtio disk measured, batched submission gave 10-20%
    /// fewer IOPS at QD32.
    #[arg(long)]
    pub submit_batch: bool,
}

#[derive(Clone, Copy)]
struct Job {
    name: &'static str,
    fio_rw: &'static str,
    block_bytes: usize,
    queue_depth: usize,
    direct: bool,
    write: bool,
    random: bool,
    /// fdatasync after this many writes (0: never).
    sync_every: usize,
}

const JOBS: [Job; 3] = [
    Job {
        name: "randread 4k qd32 direct",
        fio_rw: "randread",
        block_bytes: 4096,
        queue_depth: 32,
        direct: true,
        write: false,
        random: true,
        sync_every: 0,
    },
    Job {
        name: "seqread 128k qd8",
        fio_rw: "read",
        block_bytes: 128 * 1024,
        queue_depth: 8,
        direct: false,
        write: false,
        random: false,
        sync_every: 0,
    },
    Job {
        name: "randwrite 4k qd16 fdatasync/16",
        fio_rw: "randwrite",
        block_bytes: 4096,
        queue_depth: 16,
        direct: false,
        write: true,
        random: true,
        sync_every: 16,
    },
];

/// Figures of one run.
#[derive(Debug, Clone, Copy)]
struct Figures {
    iops: f64,
    mb_per_s: f64,
    mean_us: f64,
    p99_us: f64,
}

pub fn run(args: BenchIoArgs) -> anyhow::Result<()> {
    let jobs: Vec<Job> = JOBS
        .iter()
        .copied()
        .filter(|j| args.filter.as_deref().is_none_or(|f| j.name.contains(f)))
        .collect();
    if jobs.is_empty() {
        bail!("no job matches the filter");
    }
    let file_bytes = args.size_mib * 1024 * 1024;
    prepare_file(&args.file, file_bytes)?;
    let runs_per_job = if args.mode == "both" { 3 } else { 2 };
    let per_run =
        Duration::from_secs_f64((args.seconds / (runs_per_job * jobs.len()) as f64).max(1.0));
    let fio_version = fio_version(&args.fio)?;
    let mut results = Vec::new();
    let modes: Vec<&str> = match args.mode.as_str() {
        "engine" => vec!["engine"],
        "local" => vec!["local"],
        _ => vec!["engine", "local"],
    };
    for job in &jobs {
        settle(&args.file, job)?;
        let theirs = run_fio(&args, job, file_bytes, per_run)?;
        for mode in &modes {
            settle(&args.file, job)?;
            let ours = if *mode == "local" {
                run_spindle_local(&args, job, file_bytes, per_run)?
            } else {
                run_spindle(&args, job, file_bytes, per_run)?
            };
            let reference = if args.fixed {
                format!("{fio_version} io_uring fixedbufs registerfiles")
            } else {
                format!("{fio_version} io_uring")
            };
            let path = if *mode == "local" {
                "LocalRing"
            } else {
                "Engine"
            };
            let name = |what: &str| format!("{} [{path}] {what}", job.name);
            results.push(BenchResult::higher_is_better(
                name("IOPS"),
                "IOPS",
                ours.iops,
                &reference,
                theirs.iops,
            ));
            results.push(BenchResult::higher_is_better(
                name("throughput"),
                "MB/s",
                ours.mb_per_s,
                &reference,
                theirs.mb_per_s,
            ));
            results.push(BenchResult::lower_is_better(
                name("mean latency"),
                "us",
                ours.mean_us,
                &reference,
                theirs.mean_us,
            ));
            results.push(BenchResult::lower_is_better(
                name("p99 latency"),
                "us",
                ours.p99_us,
                &reference,
                theirs.p99_us,
            ));
        }
    }
    print_report("io", &results, args.json)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1e-6)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|e| format!("bad duration {text:?}: {e}"))?;
    if !(0.0..=1.0).contains(&(value * scale)) {
        return Err(format!("duration {text:?} out of range 0..1s"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Creates the test file with non-zero data unless it already has the right size.
fn prepare_file(path: &Path, bytes: u64) -> anyhow::Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() == bytes)
        .unwrap_or(false)
    {
        return Ok(());
    }
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in chunk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Gives both sides the same starting state: no dirty pages left by the previous run and,
/// for buffered jobs, the whole file in the page cache (fio runs with `invalidate=0`; its
/// default would drop the cache at every pass over the file when `time_based`, which the
/// benchmark does not want to measure).
fn settle(path: &Path, job: &Job) -> anyhow::Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    file.sync_all()?;
    if !job.direct {
        let mut chunk = vec![0u8; 1 << 20];
        while file.read(&mut chunk)? > 0 {}
    }
    Ok(())
}

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// One queue slot of the closed loop.
struct InFlight {
    request: Request,
    started: Instant,
    is_sync: bool,
}

/// The buffer of a data op: plain (`IoBuf`) or registered (`FixedBuf`, with `--fixed`).
enum Buf {
    Plain(IoBuf),
    Fixed(FixedBuf),
}

/// Builds a data op for `job` at `offset` from `buf` (fixed ops address the registered file).
fn data_op(job: &Job, fd: i32, file: Option<FixedFile>, offset: u64, buf: Buf) -> Op {
    match (buf, job.write) {
        (Buf::Plain(b), true) => Op::write(fd, offset, b),
        (Buf::Plain(b), false) => Op::read(fd, offset, b),
        (Buf::Fixed(b), write) => {
            let target: FileRef = match file {
                Some(f) => f.into(),
                None => fd.into(),
            };
            if write {
                Op::write_fixed(target, offset, b)
            } else {
                Op::read_fixed(target, offset, b)
            }
        }
    }
}

/// Takes the buffer back out of a completion.
fn buf_of(done: &mut spindle_io::Completion) -> Option<Buf> {
    if let Some(b) = done.fixed_buf.take() {
        return Some(Buf::Fixed(b));
    }
    done.buf.take().map(Buf::Plain)
}

/// The sync rule of fio's `--fdatasync=N`: after every N writes issued, one fdatasync is
/// issued (taking a queue slot), and no further write is issued until it has completed.
struct SyncGate {
    every: usize,
    writes_since_sync: usize,
    sync_in_flight: bool,
}

enum Next {
    Data,
    Sync,
    /// Wait for the sync in flight.
    Hold,
}

impl SyncGate {
    fn new(job: &Job) -> SyncGate {
        SyncGate {
            every: job.sync_every,
            writes_since_sync: 0,
            sync_in_flight: false,
        }
    }
    fn next(&mut self, write: bool) -> Next {
        if self.sync_in_flight {
            return Next::Hold;
        }
        if self.every > 0 && self.writes_since_sync >= self.every {
            self.writes_since_sync = 0;
            self.sync_in_flight = true;
            return Next::Sync;
        }
        self.writes_since_sync += usize::from(write);
        Next::Data
    }
    fn sync_done(&mut self) {
        self.sync_in_flight = false;
    }
}

/// Buffers for `queue_depth` data ops: registered ones with `--fixed`, else aligned `IoBuf`s.
fn make_bufs(job: &Job, pool: Option<&FixedBufPool>) -> anyhow::Result<Vec<Buf>> {
    (0..job.queue_depth)
        .map(|_| match pool {
            Some(pool) => {
                let mut b = pool.take().context("registered buffer pool exhausted")?;
                b.set_len(job.block_bytes);
                Ok(Buf::Fixed(b))
            }
            None => Ok(Buf::Plain(IoBuf::aligned(job.block_bytes, 4096))),
        })
        .collect()
}

fn run_spindle(
    args: &BenchIoArgs,
    job: &Job,
    file_bytes: u64,
    duration: Duration,
) -> anyhow::Result<Figures> {
    let file = open_for(args, job)?;
    let fd = file.as_raw_fd();
    let config = Config {
        rings: args.rings,
        ring_threads: if args.two_threads {
            RingThreads::Two
        } else {
            RingThreads::One
        },
        backend: BackendChoice::IoUring,
        in_flight_max: job.queue_depth.max(1),
        idle_spin: args.ring_spin,
        ..Config::default()
    };
    let engine = Engine::new(config).context("starting the spindle-io engine")?;
    let (pool, fixed_file) = if args.fixed {
        let pool = engine
            .register_buffers(job.queue_depth, job.block_bytes)
            .context("registering buffers")?;
        let files = engine
            .register_files(&[fd])
            .context("registering the file")?;
        (Some(pool), files.first().copied())
    } else {
        (None, None)
    };
    let mut spare = make_bufs(job, pool.as_ref())?;
    let mut offset = offsets(job, file_bytes);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    let mut latencies_ns: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut slots: Vec<Option<InFlight>> = (0..job.queue_depth).map(|_| None).collect();
    let mut gate = SyncGate::new(job);
    let t0 = Instant::now();
    let mut data_ops = 0u64;
    let mut stopping = false;
    let mut idle_since: Option<Instant> = None;
    loop {
        // Fill every free slot (unless stopping or waiting for a sync).
        if !stopping {
            for slot in slots.iter_mut().filter(|s| s.is_none()) {
                let (op, is_sync) = match gate.next(job.write) {
                    Next::Hold => break,
                    Next::Sync => (Op::Fdatasync { fd }, true),
                    Next::Data => {
                        let buf = spare.pop().context("no spare buffer")?;
                        (data_op(job, fd, fixed_file, offset(), buf), false)
                    }
                };
                let started = Instant::now();
                let request = engine.submit(op).map_err(|e| anyhow::anyhow!("{e}"))?;
                *slot = Some(InFlight {
                    request,
                    started,
                    is_sync,
                });
            }
        }
        let mut progressed = false;
        let mut live = 0;
        for slot in slots.iter_mut() {
            let Some(in_flight) = slot.as_mut() else {
                continue;
            };
            live += 1;
            let Poll::Ready(mut done) = Pin::new(&mut in_flight.request).poll(&mut cx) else {
                continue;
            };
            progressed = true;
            let now = Instant::now();
            let n = done
                .ok()
                .with_context(|| format!("{} I/O failed", job.name))?;
            if in_flight.is_sync {
                gate.sync_done();
            } else {
                if n != job.block_bytes {
                    bail!("{}: short transfer of {n} bytes", job.name);
                }
                data_ops += 1;
                latencies_ns.push((now - in_flight.started).as_nanos() as u64);
                spare.push(buf_of(&mut done).context("buffer not handed back")?);
            }
            *slot = None;
        }
        if !stopping && t0.elapsed() >= duration {
            stopping = true;
        }
        if stopping && live == 0 {
            break;
        }
        if progressed {
            idle_since = None;
        } else {
            // Brief spin (yielding) before sleeping: completions often follow within
            // microseconds, and a futex wake-up costs more than that.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < args.spin {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(Duration::from_millis(100));
            }
        }
    }
    Ok(figures(job, &mut latencies_ns, data_ops, t0.elapsed()))
}

/// The same job on a `LocalRing` driven by this thread, set up like fio's io_uring engine
/// (`COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN`): take one completion, queue its
/// replacement and submit it at once (fio's `iodepth_batch_submit=1`; `--submit-batch`
/// leaves the submission to the next wait), and wait in the kernel for at least one
/// completion only when none is ready. Per-op
/// bookkeeping lives in an array indexed by the ring slot, and buffers are recycled, so the
/// loop allocates nothing.
fn run_spindle_local(
    args: &BenchIoArgs,
    job: &Job,
    file_bytes: u64,
    duration: Duration,
) -> anyhow::Result<Figures> {
    let file = open_for(args, job)?;
    let fd = file.as_raw_fd();
    let mut ring = spindle_io::LocalRing::builder(job.queue_depth as u32)
        .defer_taskrun(true)
        .build()
        .context("creating a LocalRing")?;
    let (pool, fixed_file) = if args.fixed {
        let pool = ring
            .register_buffers(job.queue_depth, job.block_bytes)
            .context("registering buffers")?;
        let files = ring.register_files(&[fd]).context("registering the file")?;
        (Some(pool), files.first().copied())
    } else {
        (None, None)
    };
    let mut spare = make_bufs(job, pool.as_ref())?;
    let mut offset = offsets(job, file_bytes);
    let mut started: Vec<(Instant, bool)> = vec![(Instant::now(), false); ring.capacity()];
    let mut latencies_ns: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut gate = SyncGate::new(job);
    let t0 = Instant::now();
    let mut data_ops = 0u64;
    let mut stopping = false;
    loop {
        while !stopping && ring.in_flight() < job.queue_depth {
            let (op, is_sync) = match gate.next(job.write) {
                Next::Hold => break,
                Next::Sync => (Op::Fdatasync { fd }, true),
                Next::Data => {
                    let buf = spare.pop().context("no spare buffer")?;
                    (data_op(job, fd, fixed_file, offset(), buf), false)
                }
            };
            let now = Instant::now();
            let token = ring.push(op).map_err(|e| anyhow::anyhow!("{e}"))?;
            started[token.slot()] = (now, is_sync);
            if !args.submit_batch {
                // Hand the op to the kernel at once, as fio does (iodepth_batch_submit=1).
                ring.submit().context("submitting")?;
            }
        }
        if ring.in_flight() == 0 {
            break;
        }
        // One completion at a time, its replacement queued (and submitted) right after it
        // by the refill above; wait in the kernel only when nothing is ready.
        let Some((token, mut done)) = ring.pop() else {
            ring.wait(1).context("waiting for completions")?;
            continue;
        };
        let now = Instant::now();
        let (at, is_sync) = started[token.slot()];
        let n = done
            .ok()
            .with_context(|| format!("{} I/O failed", job.name))?;
        if is_sync {
            gate.sync_done();
        } else {
            if n != job.block_bytes {
                bail!("{}: short transfer of {n} bytes", job.name);
            }
            data_ops += 1;
            latencies_ns.push((now - at).as_nanos() as u64);
            spare.push(buf_of(&mut done).context("buffer not handed back")?);
        }
        if !stopping && now - t0 >= duration {
            stopping = true;
        }
    }
    Ok(figures(job, &mut latencies_ns, data_ops, t0.elapsed()))
}

/// Opens the test file as the job needs it (writable for writes, O_DIRECT if direct).
fn open_for(args: &BenchIoArgs, job: &Job) -> anyhow::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(job.write);
    if job.direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options
        .open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))
}

/// The offsets a job visits: xorshift-random blocks, or blocks in order, wrapping.
fn offsets(job: &Job, file_bytes: u64) -> impl FnMut() -> u64 {
    let (block_bytes, random) = (job.block_bytes as u64, job.random);
    let blocks = file_bytes / block_bytes;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_block = 0u64;
    move || {
        let block = if random {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % blocks
        } else {
            let b = next_block;
            next_block = (next_block + 1) % blocks;
            b
        };
        block * block_bytes
    }
}

/// IOPS, throughput, mean and p99 latency of a finished run.
fn figures(job: &Job, latencies_ns: &mut [u64], data_ops: u64, elapsed: Duration) -> Figures {
    latencies_ns.sort_unstable();
    let mean_ns = latencies_ns.iter().sum::<u64>() as f64 / latencies_ns.len().max(1) as f64;
    let p99_ns = latencies_ns
        .get(((latencies_ns.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0) as f64;
    let iops = data_ops as f64 / elapsed.as_secs_f64();
    Figures {
        iops,
        mb_per_s: iops * job.block_bytes as f64 / 1e6,
        mean_us: mean_ns / 1e3,
        p99_us: p99_ns / 1e3,
    }
}

fn fio_version(fio: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new(fio)
        .arg("--version")
        .output()
        .with_context(|| {
            format!("running `{fio} --version` (install fio: apt-get install -y fio)")
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn run_fio(
    args: &BenchIoArgs,
    job: &Job,
    file_bytes: u64,
    duration: Duration,
) -> anyhow::Result<Figures> {
    let mut cmd = std::process::Command::new(&args.fio);
    cmd.arg("--name=spindle-bench-io")
        .arg(format!("--filename={}", args.file.display()))
        .arg("--ioengine=io_uring")
        .arg(format!("--rw={}", job.fio_rw))
        .arg(format!("--bs={}", job.block_bytes))
        .arg(format!("--iodepth={}", job.queue_depth))
        .arg(format!("--direct={}", u8::from(job.direct)))
        .arg(format!("--size={file_bytes}"))
        .arg(format!("--runtime={}ms", duration.as_millis()))
        .arg("--time_based=1")
        .arg("--norandommap=1")
        .arg("--randrepeat=0")
        .arg("--lat_percentiles=1")
        .arg("--invalidate=0")
        .arg("--output-format=json");
    if job.sync_every > 0 {
        cmd.arg(format!("--fdatasync={}", job.sync_every));
    }
    if args.fixed {
        cmd.arg("--fixedbufs=1").arg("--registerfiles=1");
    }
    let out = cmd.output().context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON object.
    let start = text.find('{').context("no JSON in fio output")?;
    let json: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio JSON")?;
    let side = if job.write { "write" } else { "read" };
    let stats = &json["jobs"][0][side];
    let number = |v: &serde_json::Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("fio JSON lacks {side}.{what}"))
    };
    let iops = number(&stats["iops"], "iops")?;
    let bw_bytes = number(&stats["bw_bytes"], "bw_bytes")?;
    let mean_ns = number(&stats["lat_ns"]["mean"], "lat_ns.mean")?;
    let p99_ns = number(
        &stats["lat_ns"]["percentile"]["99.000000"],
        "lat_ns.percentile.99",
    )?;
    Ok(Figures {
        iops,
        mb_per_s: bw_bytes / 1e6,
        mean_us: mean_ns / 1e3,
        p99_us: p99_ns / 1e3,
    })
}
