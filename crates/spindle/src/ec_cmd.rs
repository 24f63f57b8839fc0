//! `spindle ec encode | decode`: Reed-Solomon coding of one file into k + m chunk files and
//! back, with the coding matrices of ISA-L and Jerasure (so chunks are interchangeable with
//! Ceph's `isa` and `jerasure` plugins for the same k, m, technique and chunk size).
//!
//! File layout: `DIR/0` .. `DIR/<k-1>` are the data chunks (the input, zero-padded to
//! k x chunk-size bytes, cut into k consecutive pieces), `DIR/<k>` .. `DIR/<k+m-1>` the parity
//! chunks (parity row r in `DIR/<k+r>`). Every file is exactly chunk-size bytes. No metadata
//! file is written: decode needs the same -k, -m, --matrix and --chunk-size.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use spindle_ec::{crc32c, EngineKind, MatrixKind, ReedSolomon};

/// Largest accepted chunk size (the whole stripe is held in memory).
const CHUNK_SIZE_MAX_BYTES: usize = 1 << 30;

/// Subcommands of `spindle ec`.
#[derive(clap::Subcommand, Debug)]
pub enum EcCommand {
    /// Encode a file into k data and m parity chunk files DIR/0 .. DIR/<k+m-1>.
    Encode(EncodeArgs),
    /// Rebuild the original data from any k of the k + m chunk files.
    Decode(DecodeArgs),
}

/// The coding matrix, named as on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixArg {
    /// ISA-L gf_gen_rs_matrix (Ceph plugin=isa technique=reed_sol_van); not MDS for
    /// large k + m.
    IsalRs,
    /// ISA-L gf_gen_cauchy1_matrix (Ceph plugin=isa technique=cauchy).
    IsalCauchy,
    /// Jerasure reed_sol_vandermonde_coding_matrix, w=8 (Ceph plugin=jerasure
    /// technique=reed_sol_van).
    JerasureVan,
}

impl From<MatrixArg> for MatrixKind {
    fn from(arg: MatrixArg) -> MatrixKind {
        match arg {
            MatrixArg::IsalRs => MatrixKind::IsalRs,
            MatrixArg::IsalCauchy => MatrixKind::IsalCauchy,
            MatrixArg::JerasureVan => MatrixKind::JerasureVandermonde,
        }
    }
}

/// Code parameters shared by encode and decode.
#[derive(clap::Args, Debug)]
pub struct CodeArgs {
    /// Number of data chunks k (k + m <= 64).
    #[arg(short = 'k', long = "data-chunks")]
    pub data_chunks: usize,
    /// Number of parity chunks m (at least 1).
    #[arg(short = 'm', long = "parity-chunks")]
    pub parity_chunks: usize,
    /// Coding matrix.
    #[arg(long, value_enum, default_value = "isal-cauchy")]
    pub matrix: MatrixArg,
    /// Size of every chunk in bytes.
    #[arg(long = "chunk-size")]
    pub chunk_size_bytes: usize,
    /// Coding engine: auto, scalar, ssse3, avx2, avx512, gfni or neon (default: the
    /// SPINDLE_EC_ENGINE environment variable, else the fastest this CPU supports).
    #[arg(long, default_value = "auto")]
    pub engine: String,
}

impl CodeArgs {
    fn codec(&self) -> anyhow::Result<ReedSolomon> {
        if self.chunk_size_bytes == 0 {
            bail!("--chunk-size must be at least 1 byte");
        }
        if self.chunk_size_bytes > CHUNK_SIZE_MAX_BYTES {
            bail!(
                "--chunk-size {} exceeds the limit of {CHUNK_SIZE_MAX_BYTES} bytes",
                self.chunk_size_bytes
            );
        }
        let engine: EngineKind = self.engine.parse()?;
        let codec = ReedSolomon::with_engine(
            self.data_chunks,
            self.parity_chunks,
            self.matrix.into(),
            engine,
        )
        .with_context(|| {
            format!(
                "invalid code RS({},{})",
                self.data_chunks, self.parity_chunks
            )
        })?;
        Ok(codec)
    }
}

/// `spindle ec encode`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "The input must not be larger than k x chunk-size bytes (one stripe); \
    a larger input is rejected. A shorter input is zero-padded to k x chunk-size bytes. \
    Existing chunk files in the output directory are overwritten."
)]
pub struct EncodeArgs {
    #[command(flatten)]
    pub code: CodeArgs,
    /// File to encode.
    #[arg(long)]
    pub input: PathBuf,
    /// Directory that receives the chunk files 0 .. k+m-1 (created if missing).
    #[arg(long = "output-dir")]
    pub output_dir: PathBuf,
}

/// `spindle ec decode`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Reads whichever of DIR/0 .. DIR/<k+m-1> exist (at least k are needed; \
    every one present must be exactly chunk-size bytes) and writes the k data chunks, i.e. \
    k x chunk-size bytes including the zero padding added by encode, unless --length is given."
)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub code: CodeArgs,
    /// Directory holding the chunk files.
    #[arg(long)]
    pub dir: PathBuf,
    /// File that receives the rebuilt data.
    #[arg(long)]
    pub output: PathBuf,
    /// Write only the first BYTES bytes (the original input length) instead of k x chunk-size.
    #[arg(long = "length")]
    pub length_bytes: Option<u64>,
}

/// Entry point of `spindle ec`.
pub fn run(cmd: EcCommand) -> anyhow::Result<()> {
    match cmd {
        EcCommand::Encode(args) => encode(&args),
        EcCommand::Decode(args) => decode(&args),
    }
}

fn chunk_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(index.to_string())
}

fn encode(args: &EncodeArgs) -> anyhow::Result<()> {
    let codec = args.code.codec()?;
    let (k, m, chunk_bytes) = (
        codec.data_chunks(),
        codec.parity_chunks(),
        args.code.chunk_size_bytes,
    );
    let stripe_bytes = k * chunk_bytes;
    let input_bytes = std::fs::metadata(&args.input)
        .with_context(|| format!("cannot read input {}", args.input.display()))?
        .len();
    if input_bytes > stripe_bytes as u64 {
        bail!(
            "input {} is {input_bytes} bytes, more than one stripe of k x chunk-size = {k} x \
             {chunk_bytes} = {stripe_bytes} bytes; use a larger --chunk-size or split the input",
            args.input.display()
        );
    }
    let mut data = std::fs::read(&args.input)
        .with_context(|| format!("cannot read input {}", args.input.display()))?;
    if data.len() > stripe_bytes {
        bail!("input {} grew while being read", args.input.display());
    }
    data.resize(stripe_bytes, 0);
    let chunks: Vec<&[u8]> = data.chunks(chunk_bytes).collect();
    let mut parity = vec![vec![0u8; chunk_bytes]; m];
    let mut crcs = vec![0u32; k + m];
    codec.encode_with_crc(&chunks, &mut parity, &mut crcs)?;
    std::fs::create_dir_all(&args.output_dir)
        .with_context(|| format!("cannot create {}", args.output_dir.display()))?;
    let all = chunks
        .iter()
        .copied()
        .chain(parity.iter().map(Vec::as_slice));
    for (index, chunk) in all.enumerate() {
        let path = chunk_path(&args.output_dir, index);
        std::fs::write(&path, chunk).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!(
        "encoded {} ({input_bytes} bytes) as RS({k},{m}) {} with {}-byte chunks (engine {})",
        args.input.display(),
        codec.matrix_kind().name(),
        chunk_bytes,
        codec.engine()
    );
    for (index, crc) in crcs.iter().enumerate() {
        let kind = if index < k { "data" } else { "parity" };
        println!(
            "  {}  {kind:<6}  crc32c {crc:#010x}",
            chunk_path(&args.output_dir, index).display()
        );
    }
    Ok(())
}

fn decode(args: &DecodeArgs) -> anyhow::Result<()> {
    let codec = args.code.codec()?;
    let (k, m, chunk_bytes) = (
        codec.data_chunks(),
        codec.parity_chunks(),
        args.code.chunk_size_bytes,
    );
    if !args.dir.is_dir() {
        bail!("chunk directory {} does not exist", args.dir.display());
    }
    let mut chunks = Vec::with_capacity(k + m);
    let mut missing = Vec::new();
    for index in 0..k + m {
        let path = chunk_path(&args.dir, index);
        match std::fs::read(&path) {
            Ok(bytes) => {
                if bytes.len() != chunk_bytes {
                    bail!(
                        "chunk file {} is {} bytes, expected {chunk_bytes} (--chunk-size); \
                         chunk sizes disagree",
                        path.display(),
                        bytes.len()
                    );
                }
                chunks.push(bytes);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                missing.push(index);
                chunks.push(vec![0u8; chunk_bytes]);
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", path.display()))
            }
        }
    }
    let present = k + m - missing.len();
    if present < k {
        bail!(
            "only {present} of {} chunk files are present in {} (missing: {}); at least k = {k} \
             are needed",
            k + m,
            args.dir.display(),
            missing
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    codec
        .decode(&mut chunks, &missing)
        .context("cannot rebuild the missing chunks")?;
    let mut output: Vec<u8> = chunks[..k].concat();
    if let Some(length) = args.length_bytes {
        if length > output.len() as u64 {
            bail!(
                "--length {length} is larger than the decoded data ({} bytes)",
                output.len()
            );
        }
        output.truncate(length as usize);
    }
    std::fs::write(&args.output, &output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!(
        "decoded {} bytes from {present} of {} chunks (rebuilt: {}) into {}; crc32c {:#010x}",
        output.len(),
        k + m,
        if missing.is_empty() {
            "none".to_string()
        } else {
            missing
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        },
        args.output.display(),
        crc32c::crc32c(&output)
    );
    Ok(())
}
