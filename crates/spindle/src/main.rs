//! `spindle`: the command-line entry point. Each subcommand lives in its own module;
//! this file only parses arguments and dispatches.

mod agent_cmd;
mod cluster_cmd;
mod crush_cmd;
mod daemon;
mod ec_cmd;
mod image_cmd;
mod nbd_cmd;
mod prog_cmd;
mod progress;
mod sim_cmd;
mod trimmer;

use clap::{Parser, Subcommand};

/// Large blocks (network payloads, objects) start on a page boundary, so the storage
/// daemons hand received payloads to O_DIRECT writes without an aligned copy; blocks come
/// from mimalloc (see `spindle_io::alloc`).
#[global_allocator]
static ALLOCATOR: spindle_io::PageAlignedLarge = spindle_io::PageAlignedLarge;

#[derive(Parser)]
#[command(
    name = "spindle",
    version,
    about = "Spindle: accelerated software-defined storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// CRUSH placement: compile, decompile and test maps (crushtool compatible).
    Crush {
        #[command(subcommand)]
        command: crush_cmd::CrushCommand,
    },
    /// Reed-Solomon erasure coding of files into chunk files and back.
    Ec {
        #[command(subcommand)]
        command: ec_cmd::EcCommand,
    },
    /// Start an embedded cluster (a monitor and N storage daemons on 127.0.0.1) and return.
    Up(spindle_cluster::UpArgs),
    /// Stop every daemon of the embedded cluster (data stays on disk).
    Down {
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Cluster state: epoch, daemons, pools, placement-group health.
    Status(cluster_cmd::StatusArgs),
    /// Cluster health: HEALTH_OK, HEALTH_WARN or HEALTH_ERR and the checks behind it.
    Health(cluster_cmd::HealthArgs),
    /// Pools: create, ls, rm.
    Pool {
        #[command(subcommand)]
        command: cluster_cmd::PoolCommand,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Storage daemons: ls, out, in, stop, start, run.
    Osd {
        #[command(subcommand)]
        command: cluster_cmd::OsdCommand,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// A cluster on several hosts from a configuration file: start or stop this host's
    /// daemons.
    Host {
        #[command(subcommand)]
        command: cluster_cmd::HostCommand,
    },
    /// Keys and capabilities: ls, get, add, caps, rm.
    Auth {
        #[command(subcommand)]
        command: cluster_cmd::AuthCommand,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Monitors: ls, add, rm, stop, start, run.
    Mon {
        #[command(subcommand)]
        command: cluster_cmd::MonCommand,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Store a file as an object ("-" reads stdin).
    Put {
        name: String,
        file: std::path::PathBuf,
        #[command(flatten)]
        obj: cluster_cmd::ObjArgs,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Read an object into a file ("-" writes stdout).
    Get {
        name: String,
        file: std::path::PathBuf,
        #[command(flatten)]
        obj: cluster_cmd::ObjArgs,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Delete an object.
    Rm {
        name: String,
        #[command(flatten)]
        obj: cluster_cmd::ObjArgs,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// List the objects of a pool.
    Ls {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: cluster_cmd::ObjArgs,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Size and version of an object.
    Stat {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: cluster_cmd::ObjArgs,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Compare every copy of every object now (or of one pool) and repair bad copies.
    Scrub(cluster_cmd::ScrubArgs),
    /// Block images striped over objects: create, ls, info, resize, rm.
    Image {
        #[command(subcommand)]
        command: image_cmd::ImageCommand,
        #[command(flatten)]
        target: spindle_cluster::Target,
    },
    /// Serve every image of a pool over NBD (nbdinfo, qemu-img, fio, nbd-client).
    Nbd(nbd_cmd::NbdArgs),
    /// The write log's offload agent: publishes the logs of `spindle nbd --write-log DIR`
    /// from its own CPUs (start it before the NBD server).
    Agent(agent_cmd::AgentArgs),
    /// Deterministic whole-cluster simulation: one seed, simulated network and time,
    /// faults; prints a trace hash per seed and replays failures by seed.
    Sim(sim_cmd::SimArgs),
    /// Pushdown programs (eBPF from C): load, check, ls, header.
    Prog {
        #[command(subcommand)]
        command: prog_cmd::ProgCommand,
    },
    /// Run a loaded program next to objects, on the daemons that hold them.
    Exec(prog_cmd::ExecArgs),
    /// Benchmarks that print Spindle's figures beside their reference.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Object write/read throughput, latency and CPU against Ceph's rados bench.
    Objects(spindle_bench::objects::BenchObjectsArgs),
    /// CRUSH mappings per second against crushtool.
    Crush(spindle_bench::crush::BenchCrushArgs),
    /// Erasure coding and CRC32C throughput against ISA-L.
    Ec(spindle_bench::ec::BenchEcArgs),
    /// The spindle-io engine against fio's io_uring engine on the same file.
    Io(spindle_bench::io::BenchIoArgs),
    /// Recovery speed and client impact after losing a daemon (own scratch cluster).
    Recovery(spindle_bench::recovery::BenchRecoveryArgs),
    /// Leader-monitor failover: SIGKILL to the next committed map change, and to a client
    /// seeing it (own scratch cluster with 3 monitors).
    Failover(spindle_bench::failover::BenchFailoverArgs),
    /// What metrics cost: 4k NBD IOPS with every endpoint on and scraped each second
    /// against all off; each endpoint's scrape time and size with 100 images open.
    Metrics(spindle_bench::metrics_cost::BenchMetricsArgs),
    /// What snapshots cost: 4k random writes with 0, 2 and 10 snapshots, the first write
    /// after a snapshot, snapshot creation under load.
    Images(spindle_bench::images::BenchImagesArgs),
    /// Block images over NBD with fio (DeLiBA matrix) against Ceph RBD and nbdkit memory.
    Fio(spindle_bench::fio::BenchFioArgs),
    /// Many short-lived clients: descriptors and memory of every process must stay flat.
    Soak(spindle_bench::soak::BenchSoakArgs),
    /// Where a block read's time goes, stage by stage (own scratch cluster, stage clocks on).
    Stages(spindle_bench::stages::BenchStagesArgs),
    /// Pushdown programs: a column scan in the interpreter and the JIT against native code.
    Prog(spindle_bench::prog::BenchProgArgs),
    /// SSB Q3.3 pulled, filter-offloaded and fully offloaded to the daemons (interpreter
    /// and JIT, cached and not), beside DuckDB on local Parquet (own scratch cluster).
    Ssb(spindle_bench::ssb::BenchSsbArgs),
    /// Programs beside I/O: fio's p99 and IOPS through NBD alone and while programs spin
    /// on every daemon, for several CPU budgets of the execution threads.
    ExecIo(spindle_bench::exec_io::BenchExecIoArgs),
    /// Zarr arrays through the Python package's SpindleStore beside zarr's LocalStore,
    /// and a whole-array sum pushed down against read-and-sum (own scratch cluster).
    Zarr(spindle_bench::zarr::BenchZarrArgs),
}

/// Keeps large buffers (object data, frames) in the heap instead of a fresh mmap per
/// allocation: glibc's default would page-fault and zero 4 MiB for every object moved.
fn tune_allocator() {
    // SAFETY: mallopt only changes allocator parameters; called before any threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// The servers' heap release (after bursts): mimalloc's free pages, then glibc's (C code).
fn release_heap() {
    spindle_io::alloc::release_free_memory();
    spindle_serve::heap::glibc_trim();
}

/// A command whose output goes to a pipe that closes early (`spindle ls | head`) ends
/// quietly, as coreutils do, instead of panicking in `println!`: SIGPIPE gets its default
/// action back (Rust ignores it). Not for daemons and servers: sockets use MSG_NOSIGNAL
/// anyway, but a daemon must never die of a signal from its output.
fn exit_quietly_on_broken_pipe() {
    // SAFETY: restores the default disposition of one signal before any threads exist.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Raises the open-file soft limit to the hard limit: a storage daemon keeps a descriptor
/// per recently used data file (its caches are sized from this limit), and Debian's
/// default soft limit of 1,024 would leave room for only a few hundred.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid `rlimit` for getrlimit to write and setrlimit to read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        // Only ever raised (a soft limit above 2^20 stays as it is).
        let wanted = lim.rlim_max.min(1 << 20);
        if lim.rlim_cur < wanted {
            lim.rlim_cur = wanted;
            // Best effort: on failure the caches are sized from the limit that stays.
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn main() {
    tune_allocator();
    spindle_serve::heap::set_release(release_heap);
    raise_open_files_limit();
    let cli = Cli::parse();
    let long_running = matches!(
        cli.command,
        Command::Mon { .. }
            | Command::Osd {
                command: cluster_cmd::OsdCommand::Run(_),
                ..
            }
            | Command::Nbd(_)
            | Command::Agent(_)
            | Command::Up(_)
            | Command::Bench { .. }
    );
    if !long_running {
        exit_quietly_on_broken_pipe();
    }
    let result = match cli.command {
        Command::Crush { command } => crush_cmd::run(command),
        Command::Ec { command } => ec_cmd::run(command),
        Command::Up(args) => spindle_cluster::up(args),
        Command::Down { target } => spindle_cluster::down(target),
        Command::Status(args) => cluster_cmd::status(args),
        Command::Health(args) => cluster_cmd::health(args),
        Command::Pool { command, target } => cluster_cmd::pool(command, target),
        Command::Osd { command, target } => cluster_cmd::osd(command, target),
        Command::Mon { command, target } => cluster_cmd::mon(command, target),
        Command::Auth { command, target } => cluster_cmd::auth(command, target),
        Command::Host { command } => cluster_cmd::host(command),
        Command::Put {
            name,
            file,
            obj,
            target,
        } => cluster_cmd::put(obj, target, name, file),
        Command::Get {
            name,
            file,
            obj,
            target,
        } => cluster_cmd::get(obj, target, name, file),
        Command::Rm { name, obj, target } => cluster_cmd::rm(obj, target, name),
        Command::Ls { json, obj, target } => cluster_cmd::ls(obj, target, json),
        Command::Stat {
            name,
            json,
            obj,
            target,
        } => cluster_cmd::stat(obj, target, name, json),
        Command::Scrub(args) => cluster_cmd::scrub(args),
        Command::Image { command, target } => image_cmd::run(command, target),
        Command::Nbd(args) => nbd_cmd::run(args),
        Command::Agent(args) => agent_cmd::run(args),
        Command::Sim(args) => sim_cmd::run(args),
        Command::Prog { command } => prog_cmd::prog(command),
        Command::Exec(args) => prog_cmd::exec(args),
        Command::Bench { command } => match command {
            BenchCommand::Objects(args) => spindle_bench::objects::run(args),
            BenchCommand::Ssb(args) => spindle_bench::ssb::run(args),
            BenchCommand::ExecIo(args) => spindle_bench::exec_io::run(args),
            BenchCommand::Zarr(args) => spindle_bench::zarr::run(args),
            BenchCommand::Crush(args) => spindle_bench::crush::run(args),
            BenchCommand::Ec(args) => spindle_bench::ec::run(args),
            BenchCommand::Io(args) => spindle_bench::io::run(args),
            BenchCommand::Recovery(args) => spindle_bench::recovery::run(args),
            BenchCommand::Failover(args) => spindle_bench::failover::run(args),
            BenchCommand::Metrics(args) => spindle_bench::metrics_cost::run(args),
            BenchCommand::Images(args) => spindle_bench::images::run(args),
            BenchCommand::Fio(args) => spindle_bench::fio::run(args),
            BenchCommand::Soak(args) => spindle_bench::soak::run(args),
            BenchCommand::Stages(args) => spindle_bench::stages::run(args),
            BenchCommand::Prog(args) => spindle_bench::prog::run(args),
        },
    };
    if let Err(error) = result {
        eprintln!("spindle: error: {error:#}");
        std::process::exit(1);
    }
}
