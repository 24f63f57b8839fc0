//! `spindle`: the command-line entry point. Each subcommand lives in its own module;
//! this file only parses arguments and dispatches.

mod bench_common;
mod bench_crush;
mod bench_ec;
mod bench_io;
mod crush_cmd;
mod ec_cmd;

use clap::{Parser, Subcommand};

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
    /// Benchmarks that print Spindle's figures beside their reference.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// CRUSH mappings per second against crushtool.
    Crush(bench_crush::BenchCrushArgs),
    /// Erasure coding and CRC32C throughput against ISA-L.
    Ec(bench_ec::BenchEcArgs),
    /// The spindle-io engine against fio's io_uring engine on the same file.
    Io(bench_io::BenchIoArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crush { command } => crush_cmd::run(command),
        Command::Ec { command } => ec_cmd::run(command),
        Command::Bench { command } => match command {
            BenchCommand::Crush(args) => bench_crush::run(args),
            BenchCommand::Ec(args) => bench_ec::run(args),
            BenchCommand::Io(args) => bench_io::run(args),
        },
    };
    if let Err(error) = result {
        eprintln!("spindle: error: {error:#}");
        std::process::exit(1);
    }
}
