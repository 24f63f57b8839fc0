//! `spindle bench ec`: erasure-coding and CRC32C throughput of `spindle-ec` against ISA-L
//! 2.30, measured in the same run.
//!
//! ISA-L is loaded at run time from `libisal.so.2` (Debian `libisal2`, pulled in by
//! `libisal-dev`) with `libloading`, so only this benchmark depends on it. Before timing a
//! case, the outputs of both libraries are compared byte for byte (parity, rebuilt chunks,
//! CRCs). Timing: each case alternates Spindle and ISA-L runs (so both see the same machine
//! noise) and keeps the best run of each; the `--seconds` budget is split evenly over cases.
//! GB/s are 1e9 bytes of *data* per second (k x chunk bytes per stripe, for encode and
//! decode alike), single-threaded, cache-hot buffers (as in `shared/baselines/kernels.md`).
//! Spindle runs on the engine `SPINDLE_EC_ENGINE` names, else the best one for this CPU;
//! inside timing loops results are discarded because every case was validated beforehand.

use std::ffi::{c_int, c_uint};
use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use spindle_ec::{crc32c, EngineKind, MatrixKind, ReedSolomon};

use crate::common::{print_report, BenchResult};

/// Arguments of `spindle bench ec`.
#[derive(clap::Args, Debug)]
pub struct BenchEcArgs {
    /// Print one JSON object (SYSTEM.md §5) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Total time budget in seconds, split evenly over the measured cases.
    #[arg(long, default_value_t = 45.0)]
    pub seconds: f64,
    /// Only run cases whose name contains this text (e.g. "RS(10,4)", "fused", "crc32c").
    #[arg(long)]
    pub filter: Option<String>,
    /// ISA-L entry points to compare with: `dispatch` (ec_encode_data and crc32_iscsi, which
    /// pick ISA-L's best kernels for this CPU) or `avx2` (ec_encode_data_avx2 and
    /// crc32_iscsi_01, ISA-L's kernels for CPUs without AVX-512, e.g. AMD Zen 3).
    #[arg(long, value_enum, default_value = "dispatch")]
    pub isal_kernels: IsalKernels,
    /// ISA-L shared library to compare with (file name or path).
    #[arg(long, default_value = "libisal.so.2")]
    pub isal_library: String,
}

/// Which ISA-L entry points the benchmark calls.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsalKernels {
    /// `ec_encode_data` and `crc32_iscsi` (ISA-L's own run-time dispatch).
    Dispatch,
    /// `ec_encode_data_avx2` and `crc32_iscsi_01` (SSE4.2 + PCLMULQDQ).
    Avx2,
}

impl IsalKernels {
    fn encode_symbol(self) -> &'static str {
        match self {
            IsalKernels::Dispatch => "ec_encode_data",
            IsalKernels::Avx2 => "ec_encode_data_avx2",
        }
    }

    fn crc_symbol(self) -> &'static str {
        match self {
            IsalKernels::Dispatch => "crc32_iscsi",
            IsalKernels::Avx2 => "crc32_iscsi_01",
        }
    }
}

/// Codes measured (k, m).
const CODES: [(usize, usize); 4] = [(4, 2), (6, 3), (8, 3), (10, 4)];
/// Chunk sizes measured, in bytes.
const CHUNK_SIZES_BYTES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// CRC32C buffer sizes measured, in bytes.
const CRC_SIZES_BYTES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Runs per library per case; the best one counts.
const RUNS_PER_CASE: usize = 5;

type GenMatrixFn = unsafe extern "C" fn(a: *mut u8, m: c_int, k: c_int);
type InitTablesFn = unsafe extern "C" fn(k: c_int, rows: c_int, a: *mut u8, tables: *mut u8);
type EncodeFn = unsafe extern "C" fn(
    len: c_int,
    k: c_int,
    rows: c_int,
    tables: *mut u8,
    data: *mut *mut u8,
    coding: *mut *mut u8,
);
type InvertFn = unsafe extern "C" fn(input: *mut u8, output: *mut u8, n: c_int) -> c_int;
type CrcFn = unsafe extern "C" fn(buffer: *mut u8, len: c_int, init_crc: c_uint) -> c_uint;

/// The ISA-L entry points used, resolved from the shared library.
struct Isal {
    gen_cauchy1_matrix: GenMatrixFn,
    init_tables: InitTablesFn,
    encode_data: EncodeFn,
    invert_matrix: InvertFn,
    crc32_iscsi: CrcFn,
    kernels: IsalKernels,
    /// Keeps the library mapped while the function pointers above are in use.
    _library: libloading::Library,
}

impl Isal {
    fn load(name: &str, kernels: IsalKernels) -> anyhow::Result<Isal> {
        // SAFETY: loading ISA-L runs only its (trivial) ELF initialisers.
        let library = unsafe { libloading::Library::new(name) }.with_context(|| {
            format!(
                "cannot load ISA-L ({name}); install it with `apt-get install libisal-dev` \
                 (Debian package libisal2 provides libisal.so.2)"
            )
        })?;
        // SAFETY: the symbol types are the C prototypes of ISA-L 2.30's erasure_code.h and
        // crc.h; the pointers are used only while `library` is alive (it is stored below).
        unsafe {
            let gen_cauchy1_matrix = *library.get::<GenMatrixFn>(b"gf_gen_cauchy1_matrix\0")?;
            let init_tables = *library.get::<InitTablesFn>(b"ec_init_tables\0")?;
            let encode_data = *library.get::<EncodeFn>(kernels.encode_symbol().as_bytes())?;
            let invert_matrix = *library.get::<InvertFn>(b"gf_invert_matrix\0")?;
            let crc32_iscsi = *library.get::<CrcFn>(kernels.crc_symbol().as_bytes())?;
            Ok(Isal {
                gen_cauchy1_matrix,
                init_tables,
                encode_data,
                invert_matrix,
                crc32_iscsi,
                kernels,
                _library: library,
            })
        }
    }

    /// Standard CRC32C through `crc32_iscsi`.
    fn crc32c(&self, buffer: &[u8]) -> u32 {
        let len = c_int::try_from(buffer.len()).unwrap_or(c_int::MAX);
        // SAFETY: ISA-L reads `len <= buffer.len()` bytes and does not write.
        !unsafe { (self.crc32_iscsi)(buffer.as_ptr().cast_mut(), len, u32::MAX) }
    }

    /// `ec_encode_data` over `len` bytes.
    ///
    /// # Safety
    /// `tables` must hold `32 * k * rows` bytes from `ec_init_tables`; `src` holds k and `dst`
    /// rows pointers to buffers of at least `len` bytes, the destinations distinct.
    unsafe fn encode(
        &self,
        len: usize,
        tables: &mut [u8],
        src: &mut [*mut u8],
        dst: &mut [*mut u8],
    ) {
        assert_eq!(tables.len(), 32 * src.len() * dst.len());
        // SAFETY: contract of this function; sizes fit c_int (chunks are at most 1 MiB).
        unsafe {
            (self.encode_data)(
                len as c_int,
                src.len() as c_int,
                dst.len() as c_int,
                tables.as_mut_ptr(),
                src.as_mut_ptr(),
                dst.as_mut_ptr(),
            )
        }
    }
}

/// A 64-byte aligned buffer (the alignment ISA-L's own benchmarks use).
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let storage = vec![0u8; len + 64];
        let start = storage.as_ptr().align_offset(64).min(64);
        Aligned {
            storage,
            start,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }

    fn ptr(&mut self) -> *mut u8 {
        self.bytes_mut().as_mut_ptr()
    }
}

fn filled(len: usize, seed: u64) -> Aligned {
    let mut buffer = Aligned::new(len);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for byte in buffer.bytes_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
    buffer
}

/// Times `op` repeatedly for about `run` and returns operations per second.
fn rate(run: Duration, op: &mut dyn FnMut()) -> f64 {
    op(); // warm caches and lazily built tables
    let start = Instant::now();
    let mut ops = 0u64;
    loop {
        op();
        ops += 1;
        let elapsed = start.elapsed();
        if elapsed >= run {
            return ops as f64 / elapsed.as_secs_f64();
        }
    }
}

/// Alternates the two measurements `RUNS_PER_CASE` times; best rate of each.
fn best_of(run: Duration, spindle: &mut dyn FnMut(), isal: &mut dyn FnMut()) -> (f64, f64) {
    let (mut best_spindle, mut best_isal) = (0.0f64, 0.0f64);
    for _ in 0..RUNS_PER_CASE {
        best_spindle = best_spindle.max(rate(run, spindle));
        best_isal = best_isal.max(rate(run, isal));
    }
    (best_spindle, best_isal)
}

/// One stripe's buffers, shared by both libraries: data, and one parity set per library.
struct Stripe {
    data: Vec<Aligned>,
    spindle_parity: Vec<Aligned>,
    isal_parity: Vec<Aligned>,
}

impl Stripe {
    fn new(k: usize, m: usize, chunk_bytes: usize) -> Stripe {
        Stripe {
            data: (0..k).map(|j| filled(chunk_bytes, j as u64 + 1)).collect(),
            spindle_parity: (0..m).map(|_| Aligned::new(chunk_bytes)).collect(),
            isal_parity: (0..m).map(|_| Aligned::new(chunk_bytes)).collect(),
        }
    }
}

/// ISA-L's Cauchy encode matrix and tables for (k, m).
fn isal_encode_tables(isal: &Isal, k: usize, m: usize) -> (Vec<u8>, Vec<u8>) {
    let mut matrix = vec![0u8; (k + m) * k];
    let mut tables = vec![0u8; 32 * k * m];
    // SAFETY: `matrix` holds (k+m) x k bytes and `tables` 32 * k * m bytes, as ISA-L requires.
    unsafe {
        (isal.gen_cauchy1_matrix)(matrix.as_mut_ptr(), (k + m) as c_int, k as c_int);
        (isal.init_tables)(
            k as c_int,
            m as c_int,
            matrix[k * k..].as_mut_ptr(),
            tables.as_mut_ptr(),
        );
    }
    (matrix, tables)
}

/// ISA-L decode tables that rebuild data chunks 0..m from chunks m..k+m (as its
/// `erasure_code_perf` does: invert the survivors' rows, keep the lost rows).
fn isal_decode_tables(isal: &Isal, matrix: &[u8], k: usize, m: usize) -> anyhow::Result<Vec<u8>> {
    let mut survivors = matrix[m * k..(m + k) * k].to_vec();
    let mut inverse = vec![0u8; k * k];
    // SAFETY: both matrices are k x k.
    if unsafe { (isal.invert_matrix)(survivors.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) }
        != 0
    {
        bail!("ISA-L could not invert the decode matrix of RS({k},{m})");
    }
    let mut tables = vec![0u8; 32 * k * m];
    // SAFETY: the first m rows of `inverse` (m x k bytes) and a 32 * k * m table buffer.
    unsafe {
        (isal.init_tables)(
            k as c_int,
            m as c_int,
            inverse.as_mut_ptr(),
            tables.as_mut_ptr(),
        )
    };
    Ok(tables)
}

struct Bench<'a> {
    isal: &'a Isal,
    run: Duration,
    filter: Option<&'a str>,
    results: Vec<BenchResult>,
}

impl Bench<'_> {
    fn wanted(&self, name: &str) -> bool {
        self.filter.is_none_or(|f| name.contains(f))
    }

    fn record(&mut self, name: String, reference: &str, bytes_per_op: usize, rates: (f64, f64)) {
        let to_gbps = |ops_per_s: f64| ops_per_s * bytes_per_op as f64 / 1e9;
        self.results.push(BenchResult::higher_is_better(
            name,
            "GB/s",
            to_gbps(rates.0),
            reference,
            to_gbps(rates.1),
        ));
    }

    fn code(&mut self, k: usize, m: usize, chunk_bytes: usize) -> anyhow::Result<()> {
        let label = format!("RS({k},{m}) {}", size_label(chunk_bytes));
        let names = [
            format!("encode {label}"),
            format!("decode {label}"),
            format!("fused {label}"),
        ];
        if !names.iter().any(|n| self.wanted(n)) {
            return Ok(());
        }
        let isal = self.isal;
        let codec = ReedSolomon::new(k, m, MatrixKind::IsalCauchy)?;
        let (matrix, mut encode_tables) = isal_encode_tables(isal, k, m);
        let mut stripe = Stripe::new(k, m, chunk_bytes);
        let mut data_ptrs: Vec<*mut u8> = stripe.data.iter_mut().map(Aligned::ptr).collect();
        let mut isal_parity_ptrs: Vec<*mut u8> =
            stripe.isal_parity.iter_mut().map(Aligned::ptr).collect();

        // Encode: check parity equality, then time.
        let data: Vec<&[u8]> = stripe.data.iter().map(Aligned::bytes).collect();
        let mut parity: Vec<&mut [u8]> = stripe
            .spindle_parity
            .iter_mut()
            .map(Aligned::bytes_mut)
            .collect();
        codec.encode(&data, &mut parity)?;
        // SAFETY: k data and m parity buffers of `chunk_bytes`; tables from ec_init_tables.
        unsafe {
            isal.encode(
                chunk_bytes,
                &mut encode_tables,
                &mut data_ptrs,
                &mut isal_parity_ptrs,
            )
        };
        for (r, p) in parity.iter().enumerate() {
            if **p != *stripe.isal_parity[r].bytes() {
                bail!("{label}: Spindle and ISA-L parity {r} differ");
            }
        }
        if self.wanted(&names[0]) {
            let rates = best_of(
                self.run,
                &mut || codec.encode(&data, &mut parity).unwrap_or(()),
                // SAFETY: as for the check above.
                &mut || unsafe {
                    isal.encode(
                        chunk_bytes,
                        &mut encode_tables,
                        &mut data_ptrs,
                        &mut isal_parity_ptrs,
                    )
                },
            );
            self.record(
                names[0].clone(),
                &format!("ISA-L 2.30 {} (cauchy1)", isal.kernels.encode_symbol()),
                k * chunk_bytes,
                rates,
            );
        }

        if self.wanted(&names[2]) {
            let mut crcs = vec![0u32; k + m];
            codec.encode_with_crc(&data, &mut parity, &mut crcs)?;
            let isal_crcs: Vec<u32> = data
                .iter()
                .map(|d| isal.crc32c(d))
                .chain(stripe.isal_parity.iter().map(|p| isal.crc32c(p.bytes())))
                .collect();
            if crcs != isal_crcs {
                bail!("{label}: fused CRCs differ from ISA-L crc32_iscsi");
            }
            let rates = best_of(
                self.run,
                &mut || {
                    codec
                        .encode_with_crc(&data, &mut parity, &mut crcs)
                        .unwrap_or(());
                    black_box(&crcs);
                },
                &mut || {
                    // SAFETY: as for the encode check above.
                    unsafe {
                        isal.encode(
                            chunk_bytes,
                            &mut encode_tables,
                            &mut data_ptrs,
                            &mut isal_parity_ptrs,
                        )
                    };
                    let mut sum = 0u32;
                    for d in &data {
                        sum ^= isal.crc32c(d);
                    }
                    for &p in &isal_parity_ptrs {
                        // SAFETY: `p` points to a live parity buffer of `chunk_bytes` bytes
                        // that ISA-L has just written; nothing else accesses it meanwhile.
                        sum ^= isal.crc32c(unsafe { std::slice::from_raw_parts(p, chunk_bytes) });
                    }
                    black_box(sum);
                },
            );
            self.record(
                names[2].clone(),
                &format!(
                    "ISA-L {} + {} of all k+m chunks",
                    isal.kernels.encode_symbol(),
                    isal.kernels.crc_symbol()
                ),
                k * chunk_bytes,
                rates,
            );
        }
        drop(parity);

        if self.wanted(&names[1]) {
            // Lose data chunks 0..m; rebuild them from chunks m..k+m with cached tables.
            let mut decode_tables = isal_decode_tables(isal, &matrix, k, m)?;
            let mut chunks: Vec<Aligned> = stripe
                .data
                .drain(..)
                .chain(stripe.spindle_parity.drain(..))
                .collect();
            let originals: Vec<Vec<u8>> = chunks[..m].iter().map(|c| c.bytes().to_vec()).collect();
            let erasures: Vec<usize> = (0..m).collect();
            let mut isal_lost: Vec<Aligned> = (0..m).map(|_| Aligned::new(chunk_bytes)).collect();
            let mut survivor_ptrs: Vec<*mut u8> =
                chunks[m..].iter_mut().map(Aligned::ptr).collect();
            let mut lost_ptrs: Vec<*mut u8> = isal_lost.iter_mut().map(Aligned::ptr).collect();
            let mut views: Vec<&mut [u8]> = chunks.iter_mut().map(Aligned::bytes_mut).collect();
            for lost in &mut views[..m] {
                lost.fill(0);
            }
            codec.decode(&mut views, &erasures)?;
            // SAFETY: k survivors and m distinct output buffers of `chunk_bytes` bytes.
            unsafe {
                isal.encode(
                    chunk_bytes,
                    &mut decode_tables,
                    &mut survivor_ptrs,
                    &mut lost_ptrs,
                )
            };
            for i in 0..m {
                if *views[i] != originals[i][..] || *isal_lost[i].bytes() != originals[i][..] {
                    bail!("{label}: decoded chunk {i} differs from the original");
                }
            }
            let rates = best_of(
                self.run,
                &mut || codec.decode(&mut views, &erasures).unwrap_or(()),
                // SAFETY: as for the check above.
                &mut || unsafe {
                    isal.encode(
                        chunk_bytes,
                        &mut decode_tables,
                        &mut survivor_ptrs,
                        &mut lost_ptrs,
                    )
                },
            );
            self.record(
                names[1].clone(),
                &format!(
                    "ISA-L {}, cached decode tables",
                    isal.kernels.encode_symbol()
                ),
                k * chunk_bytes,
                rates,
            );
        }
        Ok(())
    }

    fn crc(&mut self, len: usize) -> anyhow::Result<()> {
        let name = format!("crc32c {}", size_label(len));
        if !self.wanted(&name) {
            return Ok(());
        }
        let buffer = filled(len, 99);
        let bytes = buffer.bytes();
        let engine = EngineKind::Auto.resolve()?.crc_engine();
        if crc32c::crc32c_append_with(engine, 0, bytes) != self.isal.crc32c(bytes) {
            bail!("{name}: Spindle and ISA-L CRC32C differ");
        }
        let isal = self.isal;
        let rates = best_of(
            self.run,
            &mut || {
                black_box(crc32c::crc32c_append_with(engine, 0, black_box(bytes)));
            },
            &mut || {
                black_box(isal.crc32c(black_box(bytes)));
            },
        );
        let reference = format!("ISA-L 2.30 {}", isal.kernels.crc_symbol());
        self.record(name, &reference, len, rates);
        Ok(())
    }
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{}KiB", bytes >> 10)
    }
}

/// Entry point of `spindle bench ec`.
pub fn run(args: BenchEcArgs) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be a positive number");
    }
    let isal = Isal::load(&args.isal_library, args.isal_kernels)?;
    let filter = args.filter.as_deref();
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let mut cases = 0usize;
    for &(k, m) in &CODES {
        for &chunk in &CHUNK_SIZES_BYTES {
            let label = format!("RS({k},{m}) {}", size_label(chunk));
            cases += ["encode", "decode", "fused"]
                .iter()
                .filter(|op| wanted(&format!("{op} {label}")))
                .count();
        }
    }
    cases += CRC_SIZES_BYTES
        .iter()
        .filter(|&&l| wanted(&format!("crc32c {}", size_label(l))))
        .count();
    if cases == 0 {
        bail!("no benchmark case matches the filter");
    }
    // Two libraries, RUNS_PER_CASE runs each, plus about 10 % for warm-up and checks.
    let run = Duration::from_secs_f64(args.seconds / (cases * 2 * RUNS_PER_CASE) as f64 / 1.1);
    let mut bench = Bench {
        isal: &isal,
        run,
        filter,
        results: Vec::new(),
    };
    for &(k, m) in &CODES {
        for &chunk in &CHUNK_SIZES_BYTES {
            bench.code(k, m, chunk)?;
        }
    }
    for &len in &CRC_SIZES_BYTES {
        bench.crc(len)?;
    }
    print_report("ec", &bench.results, args.json)
}
