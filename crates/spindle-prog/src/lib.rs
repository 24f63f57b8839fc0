//! Pushdown programs (issue #23): eBPF objects compiled from C (`clang -O2 -target bpf -c`,
//! with `include/spindle_prog.h`), loaded and verified once, then run against objects by
//! the storage daemons that hold them, in an interpreter or a JIT, under limits.
//!
//! The virtual machine is `solana-sbpf` (its legacy SBPF v0 instruction set, which is
//! eBPF's): it checks every memory access against the regions mapped for the run, meters
//! instructions, bounds the call depth and the stack, and its JIT keeps those checks
//! (chosen over `rbpf`, whose JIT does not check memory and whose verifier accepted an
//! infinite loop: `../shared/ECOSYSTEM.md`). This crate adds what Spindle needs around
//! it: a loader for relocatable objects (no linker), helpers by name (`object.rs`), the
//! program's view of an object, scratch memory and output, and limits with clear errors.
//!
//! Safety before a run: the object must be well formed, call only known helpers, have no
//! writable globals, no calls through registers, at most [`object::INSTRUCTIONS_MAX`]
//! instructions; then the VM's verifier checks every instruction and jump target. During
//! a run: every load and store is checked against the mapped regions, the instruction
//! budget stops loops, the stack is [`STACK_FRAMES_MAX`] frames of 4 KiB, scratch memory
//! and output stop at their limits, and wall time is checked at every helper call.

pub mod blosc;
pub mod object;
pub mod reduce;

use solana_sbpf::aligned_memory::AlignedMemory;
use solana_sbpf::declare_builtin_function;
use solana_sbpf::ebpf;
use solana_sbpf::elf::Executable;
use solana_sbpf::error::{EbpfError, ProgramResult};
use solana_sbpf::memory_region::{AccessType, MemoryMapping, MemoryRegion};
use solana_sbpf::program::{
    BuiltinFunctionDefinition, BuiltinProgram, FunctionRegistry, SBPFVersion,
};
use solana_sbpf::verifier::RequisiteVerifier;
use solana_sbpf::vm::{CallFrame, Config, ContextObject, EbpfVm, ExecutionMode};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a program was refused or stopped.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProgError {
    #[error("program refused: {0}")]
    Object(String),
    #[error("program refused: it calls unknown helper {0}")]
    UnknownHelper(String),
    #[error("program refused by the verifier: {0}")]
    Verify(String),
    #[error("program stopped: instruction budget of {0} exhausted")]
    InstructionLimit(u64),
    #[error("program stopped: wall time limit of {0:?} passed")]
    TimeLimit(Duration),
    #[error("program stopped: scratch memory limit of {limit_bytes} bytes reached (asked for {asked_bytes} more)")]
    MemoryLimit { limit_bytes: u64, asked_bytes: u64 },
    #[error("program stopped: output limit of {0} bytes reached")]
    OutputLimit(u64),
    #[error("program stopped: {0}")]
    Fault(String),
    #[error("program stopped: bad helper call: {0}")]
    BadHelperCall(String),
    #[error("the JIT is not available here: {0}")]
    NoJit(String),
    #[error("bad run: {0}")]
    BadInput(String),
}

/// Interpreter or JIT, chosen per run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Interpreter,
    Jit,
}

/// Call frames a program may nest (4 KiB of stack each: 256 KiB in all).
pub const STACK_FRAMES_MAX: usize = 64;

/// Where the object's bytes are mapped (read-only).
pub const DATA_VM_ADDR: u64 = ebpf::MM_REGION_SIZE * 5;

/// Most objects one run sees (`spindle_types::limits::EXEC_OBJECTS_MAX`).
pub const OBJECTS_MAX: usize = 16;

/// Where object `i` of a run is mapped (read-only): the first at [`DATA_VM_ADDR`], the
/// others after the constants (the VM's aligned mapping wants one region per 4 GiB slot,
/// in order from slot 0).
pub fn object_vm_addr(i: usize) -> u64 {
    if i == 0 {
        DATA_VM_ADDR
    } else {
        ebpf::MM_REGION_SIZE * (6 + i as u64)
    }
}

/// Bytes of the input header before the object table: data, data_len, args, args_len,
/// n_objects, objects, part, parts, stripe_unit.
const INPUT_HEADER_BYTES: u64 = 72;

/// Which part of its objects a run sees (`in->part`, `in->parts`, `in->stripe_unit`).
///
/// A whole-object run sees part 0 of 1. A shard-local run on an erasure-coded pool sees
/// data shard `index` of `count` (the pool's k): of each object, the stripe units
/// `index`, `index + count`, `index + 2 * count`, ... of `unit_bytes` each, back to back
/// (the last one cut at the object's end). Byte `b` of a part is byte
/// `(b / unit) * count * unit + index * unit + b % unit` of the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub index: u64,
    pub count: u64,
    pub unit_bytes: u64,
}

impl Part {
    /// The whole object.
    pub const WHOLE: Part = Part {
        index: 0,
        count: 1,
        unit_bytes: 0,
    };

    /// How many bytes of an object of `object_bytes` this part holds.
    pub fn len_of(&self, object_bytes: u64) -> u64 {
        if self.count <= 1 || self.unit_bytes == 0 {
            return object_bytes;
        }
        let stripe = self.count * self.unit_bytes;
        let full = object_bytes / stripe;
        let rest = object_bytes % stripe;
        let tail = rest
            .saturating_sub(self.index * self.unit_bytes)
            .min(self.unit_bytes);
        full * self.unit_bytes + tail
    }

    /// This part's bytes of a whole object `object` (stripe units gathered).
    pub fn extract(&self, object: &[u8]) -> Vec<u8> {
        if self.count <= 1 || self.unit_bytes == 0 {
            return object.to_vec();
        }
        let unit = self.unit_bytes as usize;
        let stripe = unit * self.count as usize;
        let mut out = Vec::with_capacity(self.len_of(object.len() as u64) as usize);
        let mut at = self.index as usize * unit;
        while at < object.len() {
            out.extend_from_slice(&object[at..(at + unit).min(object.len())]);
            at += stripe;
        }
        out
    }
}

/// What one run may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub instructions: u64,
    pub scratch_bytes: u64,
    pub output_bytes: u64,
    pub wall: Duration,
}

impl Default for Limits {
    /// About a second of JIT-compiled work per object, 64 MiB of scratch memory, 16 MiB
    /// of output, ten minutes of wall time (a safety net: the instruction budget ends a
    /// run long before, unless its thread is paused by a CPU budget).
    fn default() -> Limits {
        Limits {
            instructions: 2_000_000_000,
            scratch_bytes: 64 << 20,
            output_bytes: 16 << 20,
            wall: Duration::from_secs(600),
        }
    }
}

/// The helpers programs may call (`include/spindle_prog.h`).
pub const HELPERS: [&str; 7] = [
    "spindle_emit",
    "spindle_read",
    "spindle_alloc",
    "spindle_filter",
    "spindle_reduce",
    "spindle_zstd_decompress",
    "spindle_blosc_decompress",
];

/// A run's state, seen by the VM and the helpers.
pub struct RunContext {
    remaining: u64,
    mapping: MemoryMapping,
    output: Vec<u8>,
    output_limit: u64,
    scratch_next: u64,
    scratch_len: u64,
    data_len: u64,
    started: Instant,
    wall: Duration,
    /// Why a helper stopped the run (the VM only carries a boxed error).
    stopped: Option<ProgError>,
}

impl ContextObject for RunContext {
    fn consume(&mut self, amount: u64) {
        self.remaining = self.remaining.saturating_sub(amount);
    }

    fn get_remaining(&self) -> u64 {
        self.remaining
    }

    fn active_mapping_ptr(&mut self) -> std::ptr::NonNull<MemoryMapping> {
        std::ptr::NonNull::from(&mut self.mapping)
    }
}

type HelperResult = Result<u64, Box<dyn std::error::Error>>;

impl RunContext {
    fn stop(&mut self, e: ProgError) -> HelperResult {
        self.stopped = Some(e.clone());
        Err(Box::new(e))
    }

    fn check_time(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        if self.started.elapsed() > self.wall {
            self.stop(ProgError::TimeLimit(self.wall))?;
        }
        Ok(())
    }

    /// The host bytes of `len` bytes at `addr` (for `access`), or the run stops.
    fn host(&mut self, access: AccessType, addr: u64, len: u64) -> Result<*mut u8, ProgError> {
        if len == 0 {
            return Ok(std::ptr::NonNull::<u8>::dangling().as_ptr());
        }
        let r: Result<_, EbpfError> = self.mapping.map(access, addr, len).into();
        match r {
            Ok(buf) => Ok(buf.ptr().cast::<u8>().cast_mut()),
            Err(e) => Err(ProgError::BadHelperCall(format!(
                "{} of {len} bytes at {addr:#x} outside the program's memory ({e})",
                match access {
                    AccessType::Load => "a read",
                    AccessType::Store => "a write",
                }
            ))),
        }
    }

    fn emit(&mut self, src: u64, len: u64) -> HelperResult {
        self.check_time()?;
        if self.output.len() as u64 + len > self.output_limit {
            return self.stop(ProgError::OutputLimit(self.output_limit));
        }
        let p = match self.host(AccessType::Load, src, len) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        // SAFETY: `host` checked that the VM maps `len` readable bytes at `src`, backed by
        // buffers that outlive the run.
        let bytes = unsafe { std::slice::from_raw_parts(p, len as usize) };
        self.output.extend_from_slice(bytes);
        Ok(0)
    }

    fn read(&mut self, offset: u64, dst: u64, len: u64) -> HelperResult {
        self.check_time()?;
        let n = len.min(self.data_len.saturating_sub(offset));
        let to = match self.host(AccessType::Store, dst, n) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        let from = match self.host(AccessType::Load, DATA_VM_ADDR + offset, n) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        // SAFETY: both ranges were checked by the VM's mapping; the object's region is
        // read-only and the destination writable, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from, to, n as usize) };
        Ok(n)
    }

    fn alloc(&mut self, len: u64) -> HelperResult {
        self.check_time()?;
        let start = self.scratch_next.next_multiple_of(8);
        let end = start.saturating_add(len);
        if end > self.scratch_len {
            return self.stop(ProgError::MemoryLimit {
                limit_bytes: self.scratch_len,
                asked_bytes: len,
            });
        }
        self.scratch_next = end;
        Ok(ebpf::MM_HEAP_START + start)
    }

    fn filter(&mut self, spec: u64) -> HelperResult {
        self.check_time()?;
        let p = match self.host(AccessType::Load, spec, 64) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        // SAFETY: 64 readable bytes checked above.
        let raw = unsafe { std::slice::from_raw_parts(p, 64) };
        let field = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let (column, n, width, op, a, b, out, and_with) = (
            field(0),
            field(1),
            field(2),
            field(3),
            field(4),
            field(5),
            field(6),
            field(7),
        );
        if !matches!(width, 1 | 2 | 4 | 8) || op > 3 {
            return self.stop(ProgError::BadHelperCall(format!(
                "spindle_filter: width {width} (1, 2, 4 or 8) or op {op} (0 to 3)"
            )));
        }
        let Some(col_bytes) = n.checked_mul(width) else {
            return self.stop(ProgError::BadHelperCall(
                "spindle_filter: n too large".into(),
            ));
        };
        let bitmap_bytes = n.div_ceil(8);
        let (col, outp) = match (
            self.host(AccessType::Load, column, col_bytes),
            self.host(AccessType::Store, out, bitmap_bytes),
        ) {
            (Ok(c), Ok(o)) => (c, o),
            (Err(e), _) | (_, Err(e)) => return self.stop(e),
        };
        let with = if and_with == 0 {
            None
        } else {
            match self.host(AccessType::Load, and_with, bitmap_bytes) {
                // SAFETY: checked readable, `bitmap_bytes` long.
                Ok(p) => {
                    Some(unsafe { std::slice::from_raw_parts(p, bitmap_bytes as usize) }.to_vec())
                }
                Err(e) => return self.stop(e),
            }
        };
        // SAFETY: checked by the mapping: `col_bytes` readable, `bitmap_bytes` writable.
        let col = unsafe { std::slice::from_raw_parts(col, col_bytes as usize) };
        let bitmap = unsafe { std::slice::from_raw_parts_mut(outp, bitmap_bytes as usize) };
        if op == 3 {
            // `a`: the table's address, `b`: its length.
            let table = match self.host(AccessType::Load, a, b) {
                // SAFETY: checked readable, `b` bytes long.
                Ok(p) => unsafe { std::slice::from_raw_parts(p, b as usize) },
                Err(e) => return self.stop(e),
            };
            return Ok(filter_column_in(
                col,
                width as usize,
                table,
                bitmap,
                with.as_deref(),
            ));
        }
        Ok(filter_column(
            col,
            width as usize,
            op,
            a,
            b,
            bitmap,
            with.as_deref(),
        ))
    }
}

impl RunContext {
    /// `spindle_reduce(spec)`: see `reduce.rs`; the results go back into the request.
    fn reduce(&mut self, spec: u64) -> HelperResult {
        use reduce::{REDUCE_DIMS_MAX, REDUCE_RESULT_OFFSET, REDUCE_SPEC_BYTES};
        self.check_time()?;
        let p = match self.host(AccessType::Store, spec, REDUCE_SPEC_BYTES as u64) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        // A copy of the request: the data it names may overlap it (both in scratch
        // memory), so no reference to the request lives while the data is read.
        let mut raw = [0u8; REDUCE_SPEC_BYTES];
        // SAFETY: REDUCE_SPEC_BYTES readable bytes checked above (writable implies
        // readable); copied out before anything else is mapped.
        raw.copy_from_slice(unsafe { std::slice::from_raw_parts(p, REDUCE_SPEC_BYTES) });
        let raw = &mut raw[..];
        let field = |raw: &[u8], i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let (data, data_len, dtype, ndim) =
            (field(raw, 0), field(raw, 1), field(raw, 2), field(raw, 3));
        if ndim == 0 || ndim > REDUCE_DIMS_MAX as u64 {
            return self.stop(ProgError::BadHelperCall(format!(
                "spindle_reduce: ndim {ndim} (1 to {REDUCE_DIMS_MAX})"
            )));
        }
        let n = ndim as usize;
        let dims = |k: usize| -> Vec<u64> {
            (0..n)
                .map(|d| field(raw, 4 + k * REDUCE_DIMS_MAX + d))
                .collect()
        };
        let (shape, start, stop) = (dims(0), dims(1), dims(2));
        let chunk = match self.host(AccessType::Load, data, data_len) {
            // SAFETY: `data_len` readable bytes checked by the mapping.
            Ok(p) => unsafe { std::slice::from_raw_parts(p, data_len as usize) },
            Err(e) => return self.stop(e),
        };
        let r = match reduce::reduce_box(chunk, dtype, &shape, &start, &stop) {
            Ok(r) => r,
            Err(why) => {
                return self.stop(ProgError::BadHelperCall(format!("spindle_reduce: {why}")))
            }
        };
        let mut results = [0u8; 32];
        for (i, v) in [r.count, r.sum, r.min, r.max].into_iter().enumerate() {
            results[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let at = spec + REDUCE_RESULT_OFFSET as u64;
        let to = match self.host(AccessType::Store, at, 32) {
            Ok(p) => p,
            Err(e) => return self.stop(e),
        };
        // SAFETY: 32 writable bytes checked above; `results` is on the host stack.
        unsafe { std::ptr::copy_nonoverlapping(results.as_ptr(), to, 32) };
        Ok(r.count)
    }

    /// `spindle_zstd_decompress(src, src_len, dst, dst_cap)`: decodes the zstd frame(s)
    /// at `src` into `dst`, returning the decoded length. A corrupt frame, or one that
    /// does not fit in `dst_cap` bytes, stops the run with the decoder's reason (the work
    /// is bounded by `dst_cap`, itself bounded by the run's scratch memory).
    fn zstd_decompress(&mut self, src: u64, src_len: u64, dst: u64, dst_cap: u64) -> HelperResult {
        self.decompress(
            "spindle_zstd_decompress",
            [src, src_len, dst, dst_cap],
            |from, to| zstd::bulk::decompress_to_buffer(from, to).map_err(|e| e.to_string()),
        )
    }

    /// `spindle_blosc_decompress(src, src_len, dst, dst_cap)`: as
    /// `spindle_zstd_decompress`, for one Blosc 1 frame ([`blosc`]).
    fn blosc_decompress(&mut self, src: u64, src_len: u64, dst: u64, dst_cap: u64) -> HelperResult {
        self.decompress(
            "spindle_blosc_decompress",
            [src, src_len, dst, dst_cap],
            |from, to| blosc::decompress(from, to).map_err(|e| e.to_string()),
        )
    }

    /// A decoding helper's checks: both ranges mapped, and disjoint; `decode` gets them as
    /// slices and returns the decoded length or why it failed (which stops the run).
    fn decompress(
        &mut self,
        helper: &str,
        [src, src_len, dst, dst_cap]: [u64; 4],
        decode: impl FnOnce(&[u8], &mut [u8]) -> Result<usize, String>,
    ) -> HelperResult {
        self.check_time()?;
        // Disjoint in the VM's address space means disjoint on the host (each region is
        // one host buffer, mapped linearly).
        let overlap = src < dst.saturating_add(dst_cap) && dst < src.saturating_add(src_len);
        if overlap && src_len > 0 && dst_cap > 0 {
            return self.stop(ProgError::BadHelperCall(format!(
                "{helper}: source and destination overlap"
            )));
        }
        let (from, to) = match (
            self.host(AccessType::Load, src, src_len),
            self.host(AccessType::Store, dst, dst_cap),
        ) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return self.stop(e),
        };
        // SAFETY: both ranges checked by the mapping and disjoint (above).
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(from, src_len as usize),
                std::slice::from_raw_parts_mut(to, dst_cap as usize),
            )
        };
        match decode(from, to) {
            Ok(n) => Ok(n as u64),
            Err(e) => self.stop(ProgError::BadHelperCall(format!(
                "{helper}: {e} ({src_len} bytes in, room for {dst_cap})"
            ))),
        }
    }
}

/// Sets bit i of `bitmap` for each value of `col` (`width`-byte little-endian unsigned)
/// matching `op` with `a` and `b`, ANDed with `with`; the number of bits set. Each width
/// and operation has its own loop of eight values per bitmap byte, one comparison each
/// (a range is one wrapping subtraction and compare), which the compiler vectorises.
pub fn filter_column(
    col: &[u8],
    width: usize,
    op: u64,
    a: u64,
    b: u64,
    bitmap: &mut [u8],
    with: Option<&[u8]>,
) -> u64 {
    macro_rules! by_type {
        ($t:ty) => {{
            const W: usize = std::mem::size_of::<$t>();
            let load = |c: &[u8]| {
                let mut x = [0u8; W];
                x.copy_from_slice(c);
                <$t>::from_le_bytes(x)
            };
            let max = <$t>::MAX as u64;
            match op {
                0 if a <= max => {
                    let x = a as $t;
                    scan::<$t, W>(col, bitmap, with, load, |v| v == x)
                }
                1 if a <= b && a <= max => {
                    let lo = a as $t;
                    let span = (b.min(max) - a) as $t;
                    scan::<$t, W>(col, bitmap, with, load, |v| v.wrapping_sub(lo) <= span)
                }
                2 => {
                    let m = (a & max) as $t;
                    scan::<$t, W>(col, bitmap, with, load, |v| v & m != 0)
                }
                // Nothing can match (a value out of the width's range, an empty range).
                _ => scan::<$t, W>(col, bitmap, with, load, |_| false),
            }
        }};
    }
    match width {
        1 => by_type!(u8),
        2 => by_type!(u16),
        4 => by_type!(u32),
        _ => by_type!(u64),
    }
}

/// Sets bit i of `bitmap` for each value v of `col` (`width`-byte little-endian unsigned)
/// with `table[v]` non-zero (v within the table), ANDed with `with`; the number of bits
/// set. A semi-join against a small dimension table: `table` says which keys qualify.
pub fn filter_column_in(
    col: &[u8],
    width: usize,
    table: &[u8],
    bitmap: &mut [u8],
    with: Option<&[u8]>,
) -> u64 {
    macro_rules! by_type {
        ($t:ty) => {{
            const W: usize = std::mem::size_of::<$t>();
            let load = |c: &[u8]| {
                let mut x = [0u8; W];
                x.copy_from_slice(c);
                <$t>::from_le_bytes(x)
            };
            scan::<$t, W>(col, bitmap, with, load, |v| {
                table.get(v as usize).is_some_and(|&t| t != 0)
            })
        }};
    }
    match width {
        1 => by_type!(u8),
        2 => by_type!(u16),
        4 => by_type!(u32),
        _ => by_type!(u64),
    }
}

/// The loop of [`filter_column`] for one value type.
fn scan<T: Copy, const W: usize>(
    col: &[u8],
    bitmap: &mut [u8],
    with: Option<&[u8]>,
    load: impl Fn(&[u8]) -> T,
    pred: impl Fn(T) -> bool,
) -> u64 {
    let mut count = 0u64;
    let mut chunks = col.chunks_exact(8 * W);
    let mut i = 0usize;
    for c in chunks.by_ref() {
        let mut bits = 0u8;
        for j in 0..8 {
            bits |= (pred(load(&c[j * W..j * W + W])) as u8) << j;
        }
        if let Some(w) = with {
            bits &= w[i];
        }
        bitmap[i] = bits;
        count += bits.count_ones() as u64;
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut bits = 0u8;
        for (j, v) in rest.chunks_exact(W).enumerate() {
            bits |= (pred(load(v)) as u8) << j;
        }
        if let Some(w) = with {
            bits &= w[i];
        }
        bitmap[i] = bits;
        count += bits.count_ones() as u64;
    }
    count
}

declare_builtin_function!(
    HelperEmit,
    fn rust(
        ctx: &mut RunContext,
        src: u64,
        len: u64,
        _c: u64,
        _d: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.emit(src, len)
    }
);

declare_builtin_function!(
    HelperRead,
    fn rust(
        ctx: &mut RunContext,
        offset: u64,
        dst: u64,
        len: u64,
        _d: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.read(offset, dst, len)
    }
);

declare_builtin_function!(
    HelperAlloc,
    fn rust(
        ctx: &mut RunContext,
        len: u64,
        _b: u64,
        _c: u64,
        _d: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.alloc(len)
    }
);

declare_builtin_function!(
    HelperFilter,
    fn rust(
        ctx: &mut RunContext,
        spec: u64,
        _b: u64,
        _c: u64,
        _d: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.filter(spec)
    }
);

declare_builtin_function!(
    HelperReduce,
    fn rust(
        ctx: &mut RunContext,
        spec: u64,
        _b: u64,
        _c: u64,
        _d: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.reduce(spec)
    }
);

declare_builtin_function!(
    HelperZstd,
    fn rust(
        ctx: &mut RunContext,
        src: u64,
        src_len: u64,
        dst: u64,
        dst_cap: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.zstd_decompress(src, src_len, dst, dst_cap)
    }
);

declare_builtin_function!(
    HelperBlosc,
    fn rust(
        ctx: &mut RunContext,
        src: u64,
        src_len: u64,
        dst: u64,
        dst_cap: u64,
        _e: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        ctx.blosc_decompress(src, src_len, dst, dst_cap)
    }
);

/// The loader every program shares: the VM's configuration and the helpers.
fn loader() -> Result<Arc<BuiltinProgram<RunContext>>, ProgError> {
    let config = Config {
        max_call_depth: STACK_FRAMES_MAX,
        enabled_sbpf_versions: SBPFVersion::V0..=SBPFVersion::V0,
        reject_broken_elfs: true,
        // Regions sit at distinct 4 GiB-aligned addresses: the upper half of an address
        // picks the region (no search per access).
        aligned_memory_mapping: true,
        ..Config::default()
    };
    let mut l = BuiltinProgram::new_loader(config);
    let registered = [
        HelperEmit::register(&mut l, "spindle_emit"),
        HelperRead::register(&mut l, "spindle_read"),
        HelperAlloc::register(&mut l, "spindle_alloc"),
        HelperFilter::register(&mut l, "spindle_filter"),
        HelperReduce::register(&mut l, "spindle_reduce"),
        HelperZstd::register(&mut l, "spindle_zstd_decompress"),
        HelperBlosc::register(&mut l, "spindle_blosc_decompress"),
    ];
    for (r, name) in registered.into_iter().zip(HELPERS) {
        r.map_err(|e| ProgError::Verify(format!("registering helper {name}: {e}")))?;
    }
    Ok(Arc::new(l))
}

/// A loaded, verified program (JIT-compiled too, where the JIT runs).
pub struct Program {
    /// BLAKE3 of the object file: programs are stored and named by content.
    pub id: [u8; 32],
    executable: Executable<RunContext>,
    rodata: Vec<u8>,
    jit: Result<(), String>,
    pub helpers_used: Vec<String>,
    pub instructions: usize,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("id", &hex(&self.id))
            .field("instructions", &self.instructions)
            .field("helpers_used", &self.helpers_used)
            .finish()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Program {
    /// Loads and verifies the object file `elf`.
    pub fn load(elf: &[u8]) -> Result<Program, ProgError> {
        let image = object::load(elf, &HELPERS)?;
        let loader = loader()?;
        let mut registry = FunctionRegistry::<usize>::default();
        let mut register = |key: u32, name: &[u8], pc: usize| {
            if loader.get_function_registry().lookup_by_key(key).is_some() {
                return Err(ProgError::Verify(format!(
                    "function at instruction {pc} collides with a helper's key"
                )));
            }
            match registry.register_function(key, name.to_vec(), pc) {
                Ok(()) => Ok(()),
                Err(e) => Err(ProgError::Verify(format!("function at {pc}: {e}"))),
            }
        };
        register(
            ebpf::hash_symbol_name(b"entrypoint"),
            b"entrypoint",
            image.entry_pc,
        )?;
        for &pc in &image.functions {
            register(object::function_key(pc), b"", pc)?;
        }
        let executable =
            Executable::from_text_bytes(&image.text, loader, SBPFVersion::V0, registry)
                .map_err(|e| ProgError::Verify(e.to_string()))?;
        executable
            .verify::<RequisiteVerifier>()
            .map_err(|e| ProgError::Verify(e.to_string()))?;
        let jit = compile(&executable);
        Ok(Program {
            id: *blake3::hash(elf).as_bytes(),
            instructions: image.text.len() / ebpf::INSN_SIZE,
            executable,
            rodata: image.rodata,
            jit,
            helpers_used: image.helpers_used,
        })
    }

    /// The program's id in hex.
    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }

    /// Runs the program against object bytes `data` with arguments `args`.
    pub fn run(
        &self,
        engine: Engine,
        data: &[u8],
        args: &[u8],
        limits: &Limits,
    ) -> Result<RunOutput, ProgError> {
        self.run_objects(engine, &[data], args, limits)
    }

    /// Runs the program against several whole objects (`objects[0]` is `in->data`; all
    /// are in `in->objects`), at most [`OBJECTS_MAX`].
    pub fn run_objects(
        &self,
        engine: Engine,
        objects: &[&[u8]],
        args: &[u8],
        limits: &Limits,
    ) -> Result<RunOutput, ProgError> {
        self.run_part(engine, objects, Part::WHOLE, args, limits)
    }

    /// Runs the program against `part` of several objects (`objects` holds that part's
    /// bytes of each).
    pub fn run_part(
        &self,
        engine: Engine,
        objects: &[&[u8]],
        part: Part,
        args: &[u8],
        limits: &Limits,
    ) -> Result<RunOutput, ProgError> {
        if part.count == 0 || part.index >= part.count {
            return Err(ProgError::BadInput(format!(
                "part {} of {}: no such part",
                part.index, part.count
            )));
        }
        let Some(data) = objects.first().copied() else {
            return Err(ProgError::BadInput(
                "a run needs at least one object".into(),
            ));
        };
        if objects.len() > OBJECTS_MAX {
            return Err(ProgError::BadInput(format!(
                "{} objects given, at most {OBJECTS_MAX} per run",
                objects.len()
            )));
        }
        if engine == Engine::Jit {
            if let Err(e) = &self.jit {
                return Err(ProgError::NoJit(e.clone()));
            }
        }
        let config = self.executable.get_config();
        // The regions: code, stack, scratch, the input header with the arguments, the
        // object, the constants. Buffers outlive the VM (dropped at the end of this call).
        let mut stack = AlignedMemory::<{ ebpf::HOST_ALIGN }>::zero_filled(config.stack_size());
        let stack_len = stack.len();
        let mut scratch = Scratch::new(limits.scratch_bytes as usize)?;
        let table_bytes = 16 * objects.len() as u64;
        let mut input =
            Vec::with_capacity((INPUT_HEADER_BYTES + table_bytes) as usize + args.len());
        let words = [
            DATA_VM_ADDR,
            data.len() as u64,
            ebpf::MM_INPUT_START + INPUT_HEADER_BYTES + table_bytes,
            args.len() as u64,
            objects.len() as u64,
            ebpf::MM_INPUT_START + INPUT_HEADER_BYTES,
            part.index,
            part.count,
            part.unit_bytes,
        ];
        const _: () = assert!(INPUT_HEADER_BYTES == 9 * 8);
        for w in words {
            input.extend_from_slice(&w.to_le_bytes());
        }
        for (i, o) in objects.iter().enumerate() {
            input.extend_from_slice(&object_vm_addr(i).to_le_bytes());
            input.extend_from_slice(&(o.len() as u64).to_le_bytes());
        }
        input.extend_from_slice(args);
        let mut regions = vec![
            self.executable.get_ro_region(),
            MemoryRegion::new_gapped(
                &raw mut *stack.as_slice_mut(),
                ebpf::MM_STACK_START,
                if config.enable_stack_frame_gaps {
                    config.stack_frame_size as u64
                } else {
                    0
                },
            ),
            MemoryRegion::new(&raw mut *scratch.as_mut_slice(), ebpf::MM_HEAP_START),
            MemoryRegion::new(&raw const *input.as_slice(), ebpf::MM_INPUT_START),
            MemoryRegion::new(&raw const *data, DATA_VM_ADDR),
            MemoryRegion::new(&raw const *self.rodata.as_slice(), object::RODATA_VM_ADDR),
        ];
        for (i, o) in objects.iter().enumerate().skip(1) {
            regions.push(MemoryRegion::new(&raw const **o, object_vm_addr(i)));
        }
        // SAFETY: every region's buffer lives until the end of this function, after the
        // VM that uses the mapping; the read-only ones are not written while mapped.
        let mapping = unsafe {
            MemoryMapping::new(regions, config, SBPFVersion::V0)
                .map_err(|e| ProgError::Fault(format!("mapping the program's memory: {e}")))?
        };
        let mut ctx = RunContext {
            remaining: limits.instructions,
            mapping,
            output: Vec::new(),
            output_limit: limits.output_bytes,
            scratch_next: 0,
            scratch_len: limits.scratch_bytes,
            data_len: data.len() as u64,
            started: Instant::now(),
            wall: limits.wall,
            stopped: None,
        };
        let (instructions, result) = {
            let mut vm = EbpfVm::new(
                self.executable.get_loader().clone(),
                SBPFVersion::V0,
                &mut ctx,
                stack_len,
            );
            vm.registers[1] = ebpf::MM_INPUT_START;
            let mut frames = vec![CallFrame::default(); STACK_FRAMES_MAX];
            let mut mode = match engine {
                Engine::Interpreter => ExecutionMode::Interpreted,
                Engine::Jit => ExecutionMode::Jit,
            };
            vm.execute_program(&self.executable, &mut mode, &mut frames)
        };
        let ret = match result {
            ProgramResult::Ok(v) => v,
            ProgramResult::Err(e) => {
                return Err(match (ctx.stopped.take(), e) {
                    (Some(why), _) => why,
                    (None, EbpfError::ExceededMaxInstructions) => {
                        ProgError::InstructionLimit(limits.instructions)
                    }
                    (None, e) => ProgError::Fault(e.to_string()),
                })
            }
        };
        if ctx.started.elapsed() > limits.wall {
            return Err(ProgError::TimeLimit(limits.wall));
        }
        Ok(RunOutput {
            ret,
            output: ctx.output,
            instructions,
        })
    }
}

/// A run's scratch memory: an anonymous private mapping, so its pages are zero and cost
/// nothing until the program touches them (a zeroed buffer from the allocator would be
/// cleared whole for every run: 64 MiB by default), and go back to the system after it.
struct Scratch {
    ptr: *mut u8,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> Result<Scratch, ProgError> {
        if len == 0 {
            return Ok(Scratch {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ProgError::Fault(format!(
                "cannot map {len} bytes of scratch memory: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Scratch { ptr: p.cast(), len })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes (or is dangling with len 0) for as long
        // as `self` lives, and only `self` hands it out.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping `new` made; no slice of it outlives self.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// The header programs include (`include/spindle_prog.h`).
pub const HEADER: &str = include_str!("../include/spindle_prog.h");

/// Example programs shipped with Spindle (`programs/`): (name, C source).
pub const EXAMPLES: [(&str, &str); 3] = [
    ("column_sum", include_str!("../programs/column_sum.c")),
    ("column_range", include_str!("../programs/column_range.c")),
    (
        "column_range_helper",
        include_str!("../programs/column_range_helper.c"),
    ),
];

/// Compiles C `source` with Debian's clang (`clang -O2 -target bpf -c`, the header on the
/// include path); the object file's bytes.
pub fn compile_c(source: &str) -> Result<Vec<u8>, String> {
    let dir = std::env::temp_dir().join(format!(
        "spindle-prog-{}-{}",
        std::process::id(),
        COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = (|| {
        std::fs::write(dir.join("spindle_prog.h"), HEADER).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("prog.c"), source).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("clang")
            .args(["-O2", "-target", "bpf", "-I"])
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("prog.c"))
            .arg("-o")
            .arg(dir.join("prog.o"))
            .output()
            .map_err(|e| format!("cannot run clang ({e}): scripts/setup.sh installs it"))?;
        if !out.status.success() {
            return Err(format!(
                "clang failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        std::fs::read(dir.join("prog.o")).map_err(|e| e.to_string())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

static COMPILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// JIT-compiles `e` (only on x86_64 Linux, where solana-sbpf's JIT runs).
fn compile(e: &Executable<RunContext>) -> Result<(), String> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        e.jit_compile().map_err(|e| e.to_string())
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = e;
        Err("no JIT for this architecture".into())
    }
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutput {
    /// `spindle_main`'s return value.
    pub ret: u64,
    /// The bytes emitted.
    pub output: Vec<u8>,
    /// Instructions executed (as metered).
    pub instructions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_filter_matches_a_scalar_semi_join() {
        let table: Vec<u8> = (0..300u32).map(|k| (k % 7 == 3) as u8 * 2).collect();
        for width in [1usize, 2, 4, 8] {
            for n in [0usize, 1, 8, 13, 1000] {
                let values: Vec<u64> = (0..n as u64).map(|i| (i * 37 + 5) % 400).collect();
                let max = if width == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * width)) - 1
                };
                let col: Vec<u8> = values
                    .iter()
                    .flat_map(|&v| (v & max).to_le_bytes()[..width].to_vec())
                    .collect();
                let with: Vec<u8> = (0..n.div_ceil(8))
                    .map(|i| (i as u8).wrapping_mul(151))
                    .collect();
                for and_with in [None, Some(with.as_slice())] {
                    let mut bm = vec![0u8; n.div_ceil(8)];
                    let count = filter_column_in(&col, width, &table, &mut bm, and_with);
                    let mut want = vec![0u8; n.div_ceil(8)];
                    for (i, &v) in values.iter().enumerate() {
                        let v = (v & max) as usize;
                        let hit = v < table.len() && table[v] != 0;
                        let allowed = and_with.is_none_or(|w| w[i / 8] >> (i % 8) & 1 == 1);
                        if hit && allowed {
                            want[i / 8] |= 1 << (i % 8);
                        }
                    }
                    assert_eq!(bm, want, "width {width} n {n}");
                    let ones: u32 = want.iter().map(|b| b.count_ones()).sum();
                    assert_eq!(count, ones as u64);
                }
            }
        }
    }

    #[test]
    fn filters_set_bits_and_count_matches() {
        let col: Vec<u8> = [5u32, 7, 9, 7, 1, 7, 7, 0, 7, 3]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut bm = [0u8; 2];
        assert_eq!(filter_column(&col, 4, 0, 7, 0, &mut bm, None), 5);
        assert_eq!(bm, [0b0110_1010, 0b01]);
        let mut r = [0u8; 2];
        assert_eq!(filter_column(&col, 4, 1, 3, 7, &mut r, Some(&bm)), 5);
        assert_eq!(filter_column(&col, 4, 1, 3, 7, &mut r, None), 7);
        assert_eq!(r, [0b0110_1011, 0b11]);
        assert_eq!(filter_column(&col, 4, 2, 0b10, 0, &mut r, None), 6);
    }

    /// The parts of an object, each its stripe units gathered, are the object's bytes
    /// dealt round-robin by unit: every byte in exactly one part, at the offset the header
    /// says, and each part as long as `len_of` says.
    #[test]
    fn parts_deal_the_stripe_units_round_robin() {
        for (count, unit) in [(1u64, 4096u64), (2, 4096), (3, 16), (4, 1)] {
            for size in [0usize, 1, 15, 16, 17, 47, 48, 49, 100, 8191, 8192, 20_000] {
                let object: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
                let mut seen = 0;
                for index in 0..count {
                    let part = Part {
                        index,
                        count,
                        unit_bytes: unit,
                    };
                    let bytes = part.extract(&object);
                    assert_eq!(bytes.len() as u64, part.len_of(size as u64));
                    for (b, &x) in bytes.iter().enumerate() {
                        let b = b as u64;
                        let at = (b / unit) * count * unit + index * unit + b % unit;
                        assert_eq!(object[at as usize], x, "{count}x{unit} size {size}");
                    }
                    seen += bytes.len();
                }
                assert_eq!(seen, size);
            }
        }
        assert_eq!(Part::WHOLE.len_of(5), 5);
    }

    /// Every width and operation against a plain scalar filter, on odd lengths and edge
    /// values.
    #[test]
    fn filters_agree_with_a_scalar_filter() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for width in [1usize, 2, 4, 8] {
            let max = if width == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * width)) - 1
            };
            for n in [0usize, 1, 7, 8, 9, 63, 1000] {
                let values: Vec<u64> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if x.is_multiple_of(5) {
                            max
                        } else {
                            (x % 300) & max
                        }
                    })
                    .collect();
                let col: Vec<u8> = values
                    .iter()
                    .flat_map(|v| v.to_le_bytes()[..width].to_vec())
                    .collect();
                let with: Vec<u8> = (0..n.div_ceil(8)).map(|i| (i * 37 % 256) as u8).collect();
                for (op, a, b) in [
                    (0, 5, 0),
                    (0, max, 0),
                    (1, 10, 200),
                    (1, 0, max),
                    (1, 200, 10),
                    (1, max.saturating_add(1), u64::MAX),
                    (2, 0b1010, 0),
                    (0, u64::MAX, 0),
                ] {
                    for and in [None, Some(&with[..])] {
                        let mut want = vec![0u8; n.div_ceil(8)];
                        let mut count = 0;
                        for (i, &v) in values.iter().enumerate() {
                            let hit = match op {
                                0 => v == a,
                                1 => a <= v && v <= b,
                                _ => v & a != 0,
                            } && and.is_none_or(|w| w[i / 8] >> (i % 8) & 1 == 1);
                            if hit {
                                want[i / 8] |= 1 << (i % 8);
                                count += 1;
                            }
                        }
                        let mut got = vec![0xffu8; n.div_ceil(8)];
                        let c = filter_column(&col, width, op, a, b, &mut got, and);
                        assert_eq!((c, &got), (count, &want), "w{width} n{n} op{op} {a} {b}");
                    }
                }
            }
        }
    }
}
