//! Programs compiled from C by Debian's clang (`clang -O2 -target bpf -c`, installed by
//! scripts/setup.sh) and run in both engines: working programs give the same answers in
//! the interpreter and the JIT; hostile ones are refused at load or stopped by a limit
//! with an error that says which.

use spindle_prog::{Engine, Limits, Part, ProgError, Program};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Compiles `tests/programs/NAME.c` to an object file; its bytes.
fn build(name: &str) -> Vec<u8> {
    build_file(&format!("tests/programs/{name}.c"))
}

/// Compiles the C file at `rel` (from the crate's directory); the object file's bytes.
fn build_file(rel: &str) -> Vec<u8> {
    let name = Path::new(rel)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // One file per build: tests run in parallel and may build the same source.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out: PathBuf =
        std::env::temp_dir().join(format!("spindle-prog-{}-{n}-{name}.o", std::process::id()));
    let status = Command::new("clang")
        .args(["-O2", "-target", "bpf", "-Wall", "-Werror", "-I"])
        .arg(dir.join("include"))
        .arg("-c")
        .arg(dir.join(rel))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("clang (scripts/setup.sh installs Debian's clang)");
    assert!(status.success(), "clang failed on {name}.c");
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    bytes
}

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const BOTH: [Engine; 2] = [Engine::Interpreter, Engine::Jit];

fn small() -> Limits {
    Limits {
        instructions: 5_000_000,
        scratch_bytes: 4 << 20,
        output_bytes: 1 << 20,
        wall: Duration::from_secs(10),
    }
}

#[test]
fn a_program_reads_the_object_calls_functions_and_emits() {
    let p = Program::load(&build("sum")).expect("loads");
    assert_eq!(p.helpers_used, vec!["spindle_emit".to_string()]);
    let values: Vec<u32> = (0..10_000u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let data = u32s(&values);
    let sum: u64 = values.iter().map(|&v| v as u64).sum();
    for engine in BOTH {
        let out = p.run(engine, &data, b"args!", &small()).unwrap();
        assert_eq!(out.ret, 10_000, "{engine:?}");
        let mut want = b"sum=".to_vec();
        want.extend_from_slice(&sum.to_le_bytes());
        want.extend_from_slice(&(sum * 2).to_le_bytes());
        want.extend_from_slice(b"args!");
        assert_eq!(out.output, want, "{engine:?}");
        assert!(
            out.instructions > 10_000,
            "{engine:?}: {}",
            out.instructions
        );
    }
    // Empty object, no arguments.
    let out = p.run(Engine::Jit, &[], &[], &small()).unwrap();
    assert_eq!(out.ret, 0);
}

#[test]
fn spindle_read_copies_ranges_into_scratch_memory() {
    let p = Program::load(&build("read_copy")).unwrap();
    let data: Vec<u8> = (0..12_345u32).map(|i| (i * 7 % 251) as u8).collect();
    for engine in BOTH {
        let out = p.run(engine, &data, &[], &small()).unwrap();
        assert_eq!(out.ret, data.len() as u64);
        assert_eq!(out.output, data, "{engine:?}");
    }
}

#[test]
fn the_filter_helper_matches_a_scalar_filter() {
    let p = Program::load(&build("filter")).unwrap();
    let values: Vec<u32> = (0..100_003u32)
        .map(|i| (i.wrapping_mul(40503)) % 1000)
        .collect();
    let data = u32s(&values);
    let args = u32s(&[100, 299]);
    let mut bits = vec![0u8; values.len().div_ceil(8)];
    let mut count = 0;
    for (i, v) in values.iter().enumerate() {
        if (100..=299).contains(v) {
            bits[i / 8] |= 1 << (i % 8);
            count += 1;
        }
    }
    for engine in BOTH {
        let out = p.run(engine, &data, &args, &small()).unwrap();
        assert_eq!(out.ret, count, "{engine:?}");
        assert_eq!(out.output, bits, "{engine:?}");
    }
}

/// Runs `name` in both engines expecting an error; returns the interpreter's.
fn stopped(name: &str, limits: &Limits, data: &[u8]) -> ProgError {
    let p = Program::load(&build(name)).unwrap_or_else(|e| panic!("{name} loads: {e}"));
    let mut first = None;
    for engine in BOTH {
        let started = Instant::now();
        let e = p
            .run(engine, data, &[], limits)
            .expect_err(&format!("{name} must be stopped ({engine:?})"));
        eprintln!("{name} ({engine:?}): {e} after {:?}", started.elapsed());
        first.get_or_insert(e);
    }
    first.unwrap()
}

#[test]
fn an_infinite_loop_stops_at_the_instruction_budget() {
    let e = stopped("loop", &small(), &[]);
    assert_eq!(e, ProgError::InstructionLimit(5_000_000));
    assert!(e
        .to_string()
        .contains("instruction budget of 5000000 exhausted"));
}

#[test]
fn reads_and_writes_outside_the_programs_memory_stop_it() {
    for name in ["oob_read", "oob_write", "wild_write"] {
        let e = stopped(name, &small(), &[1, 2, 3, 4]);
        assert!(
            matches!(&e, ProgError::Fault(m) if m.to_lowercase().contains("access violation")),
            "{name}: {e}"
        );
    }
    // A helper asked to read memory the program does not have.
    let e = stopped("bad_helper_args", &small(), &[]);
    assert!(
        matches!(&e, ProgError::BadHelperCall(m) if m.contains("outside the program's memory")),
        "{e}"
    );
}

#[test]
fn unbounded_recursion_stops_at_the_stack_limit() {
    let e = stopped("deep_stack", &small(), &[]);
    assert!(
        matches!(&e, ProgError::Fault(m) if m.to_lowercase().contains("call depth") || m.to_lowercase().contains("stack")),
        "{e}"
    );
}

#[test]
fn unbounded_allocation_and_output_stop_at_their_limits() {
    let e = stopped("alloc", &small(), &[]);
    assert_eq!(
        e,
        ProgError::MemoryLimit {
            limit_bytes: 4 << 20,
            asked_bytes: 1 << 20
        }
    );
    let e = stopped("flood", &small(), &[]);
    assert_eq!(e, ProgError::OutputLimit(1 << 20));
}

#[test]
fn wall_time_is_enforced_at_helper_calls() {
    let limits = Limits {
        instructions: u64::MAX / 2,
        output_bytes: u64::MAX / 2,
        wall: Duration::from_millis(200),
        ..small()
    };
    let started = Instant::now();
    let e = stopped(
        "flood",
        &Limits {
            output_bytes: 1 << 40,
            ..limits
        },
        &[],
    );
    assert_eq!(e, ProgError::TimeLimit(Duration::from_millis(200)));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn bad_programs_are_refused_before_they_run() {
    let unknown = Program::load(&build("unknown_helper")).unwrap_err();
    assert_eq!(unknown, ProgError::UnknownHelper("bpf_trace_printk".into()));
    let by_number = Program::load(&build("helper_by_number")).unwrap_err();
    assert!(
        matches!(&by_number, ProgError::UnknownHelper(m) if m.contains("#6")),
        "{by_number}"
    );
    let global = Program::load(&build("global_var")).unwrap_err();
    assert!(global.to_string().contains("global variables"), "{global}");
    // Malformed objects: garbage, truncated, an object for another machine.
    let good = build("sum");
    for (what, bytes) in [
        ("empty", Vec::new()),
        (
            "garbage",
            (0..4096u32).map(|i| (i * 31 % 256) as u8).collect(),
        ),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("header only", good[..64].to_vec()),
    ] {
        let e = Program::load(&bytes).expect_err(what);
        assert!(matches!(e, ProgError::Object(_)), "{what}: {e}");
    }
    // Every single-byte corruption of the code is refused or, if it still verifies, runs
    // within its limits: never a crash.
    let text_start = 64; // ELF header; the code follows in clang's objects
    for i in (text_start..good.len().min(text_start + 512)).step_by(3) {
        let mut bad = good.clone();
        bad[i] ^= 0xa5;
        if let Ok(p) = Program::load(&bad) {
            for engine in BOTH {
                let _ = p.run(engine, &[1, 2, 3, 4, 5, 6, 7, 8], &[], &small());
            }
        }
    }
    let x86 = std::fs::read("/proc/self/exe").unwrap();
    let e = Program::load(&x86[..x86.len().min(1 << 20)]).unwrap_err();
    assert!(matches!(e, ProgError::Object(_)), "{e}");
}

/// The request `programs/zarr_reduce.c` takes: a `struct spindle_reduce` (data fields
/// ignored).
fn reduce_args(dtype: u64, shape: &[u64], start: &[u64], stop: &[u64]) -> Vec<u8> {
    let mut w = vec![0u64; 32];
    w[2] = dtype;
    w[3] = shape.len() as u64;
    let n = shape.len();
    w[4..4 + n].copy_from_slice(shape);
    w[12..12 + n].copy_from_slice(start);
    w[20..20 + n].copy_from_slice(stop);
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The reduction program on a 3-d f32 chunk and on an i16 chunk, in both engines: the
/// results of the native helper, equal to a plain loop's; a box outside the chunk stops
/// the run with the helper's reason.
#[test]
fn the_zarr_reduce_program_reduces_a_box_of_a_chunk() {
    let p = Program::load(&build_file("programs/zarr_reduce.c")).unwrap();
    let shape = [6u64, 10, 12];
    let vals: Vec<f32> = (0..720).map(|i| ((i * 37) % 101) as f32 - 50.5).collect();
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (start, stop) = ([1u64, 2, 0], [6u64, 9, 5]);
    let mut picked = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        let (a, b, c) = (i / 120, (i / 12) % 10, i % 12);
        if (1..6).contains(&a) && (2..9).contains(&b) && (0..5).contains(&c) {
            picked.push(*v as f64);
        }
    }
    let expect_sum: f64 = picked.iter().sum();
    for engine in BOTH {
        let out = p
            .run(
                engine,
                &data,
                &reduce_args(1, &shape, &start, &stop),
                &small(),
            )
            .unwrap();
        assert_eq!(out.ret, picked.len() as u64, "{engine:?}");
        let r: Vec<u64> = out
            .output
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(r[0], picked.len() as u64);
        assert!(
            (f64::from_bits(r[1]) - expect_sum).abs() < 1e-9,
            "{engine:?}"
        );
        assert_eq!(
            f64::from_bits(r[2]),
            picked.iter().cloned().fold(f64::INFINITY, f64::min)
        );
        assert_eq!(
            f64::from_bits(r[3]),
            picked.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        );
    }
    let ints: Vec<u8> = [-7i16, 3, 12, -1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = p
        .run(
            Engine::Jit,
            &ints,
            &reduce_args(4, &[4], &[0], &[4]),
            &small(),
        )
        .unwrap();
    assert_eq!(out.output[..8], 4u64.to_le_bytes());
    assert_eq!(i64::from_le_bytes(out.output[8..16].try_into().unwrap()), 7);
    for engine in BOTH {
        let e = p
            .run(engine, &ints, &reduce_args(4, &[4], &[0], &[5]), &small())
            .unwrap_err();
        assert!(e.to_string().contains("spindle_reduce"), "{engine:?}: {e}");
    }
}

/// A run over several chunks (a batch groups chunks of one placement group): 32 bytes of
/// results per object, in the run's order, each equal to that chunk's own run; the
/// return value counts them all.
#[test]
fn the_zarr_reduce_program_reduces_each_object_of_a_run() {
    let p = Program::load(&build_file("programs/zarr_reduce.c")).unwrap();
    let chunks: Vec<Vec<u8>> = (0..5)
        .map(|k| {
            (0..1000)
                .map(|i| ((i * 31 + k * 977) % 211) as f32 - 100.25)
                .flat_map(|v| v.to_le_bytes())
                .collect()
        })
        .collect();
    let args = reduce_args(1, &[1000], &[0], &[1000]);
    let objects: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    for engine in BOTH {
        let out = p
            .run_part(engine, &objects, Part::WHOLE, &args, &small())
            .unwrap();
        assert_eq!(out.ret, 5000, "{engine:?}");
        assert_eq!(out.output.len(), 5 * 32, "{engine:?}");
        for (k, c) in chunks.iter().enumerate() {
            let one = p.run(engine, c, &args, &small()).unwrap();
            assert_eq!(
                out.output[k * 32..(k + 1) * 32],
                one.output[..],
                "{engine:?} {k}"
            );
        }
    }
}

/// The request for a zstd-compressed chunk: `reduce_args` and `struct zarr_codec`.
fn reduce_args_zstd(dtype: u64, shape: &[u64], decoded_len: u64) -> Vec<u8> {
    let stop = shape.to_vec();
    let mut a = reduce_args(dtype, shape, &vec![0; shape.len()], &stop);
    a.extend_from_slice(&1u64.to_le_bytes());
    a.extend_from_slice(&decoded_len.to_le_bytes());
    a
}

/// A zstd-compressed chunk (zarr's default codec) is decoded next to the data by the
/// `spindle_zstd_decompress` helper and reduced to the same results as the raw chunk; a
/// corrupt frame, too little room, an absurd decoded size and overlapping buffers each stop
/// the run with a reason.
#[test]
fn the_zarr_reduce_program_decodes_zstd_chunks() {
    let p = Program::load(&build_file("programs/zarr_reduce.c")).unwrap();
    assert!(p
        .helpers_used
        .contains(&"spindle_zstd_decompress".to_string()));
    let vals: Vec<f64> = (0..32_768)
        .map(|i| ((i * 7919) % 1000) as f64 / 8.0)
        .collect();
    let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let packed = zstd::bulk::compress(&raw, 3).unwrap();
    assert!(packed.len() < raw.len() / 2, "compressible test data");
    let shape = [256u64, 128];
    let plain = p
        .run(
            Engine::Jit,
            &raw,
            &reduce_args(2, &shape, &[0, 0], &shape),
            &small(),
        )
        .unwrap();
    for engine in BOTH {
        let out = p
            .run(
                engine,
                &packed,
                &reduce_args_zstd(2, &shape, raw.len() as u64),
                &small(),
            )
            .unwrap();
        assert_eq!(out.output, plain.output, "{engine:?}");
        assert_eq!(out.ret, 32_768);
    }
    let sum = f64::from_bits(u64::from_le_bytes(plain.output[8..16].try_into().unwrap()));
    assert_eq!(sum, vals.iter().sum::<f64>());
    let stops = |data: &[u8], args: &[u8], what: &str| {
        for engine in BOTH {
            let e = p.run(engine, data, args, &small()).unwrap_err();
            assert!(e.to_string().contains(what), "{engine:?}: {e}");
        }
    };
    let mut corrupt = packed.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0xff;
    corrupt.truncate(corrupt.len() - 3);
    stops(
        &corrupt,
        &reduce_args_zstd(2, &shape, raw.len() as u64),
        "spindle_zstd_decompress",
    );
    stops(
        &packed,
        &reduce_args_zstd(2, &shape, raw.len() as u64 / 2),
        "spindle_zstd_decompress",
    );
    stops(&packed, &reduce_args_zstd(2, &shape, 1 << 40), "memory");
    let overlap = Program::load(&build("zstd_overlap")).unwrap();
    for engine in BOTH {
        let e = overlap.run(engine, &packed, &[], &small()).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{engine:?}: {e}");
    }
}

/// A Blosc 1 frame of `raw` (8-byte elements, byte-shuffled, one zstd stream per block of
/// `block_bytes`), built by hand from the format's description; Python's tests decode
/// frames made by numcodecs' own c-blosc.
fn blosc_zstd_frame(raw: &[u8], block_bytes: usize) -> Vec<u8> {
    let typesize = 8usize;
    let blocks = raw.len().div_ceil(block_bytes);
    // Shuffle, inner codec 4 (zstd), streams not split.
    let mut f = vec![2u8, 1, 0x01 | 0x10 | (4 << 5), typesize as u8];
    f.extend((raw.len() as u32).to_le_bytes());
    f.extend((block_bytes as u32).to_le_bytes());
    f.extend(0u32.to_le_bytes());
    let starts = f.len();
    f.resize(starts + 4 * blocks, 0);
    for (b, block) in raw.chunks(block_bytes).enumerate() {
        let at = f.len() as u32;
        f[starts + 4 * b..starts + 4 * b + 4].copy_from_slice(&at.to_le_bytes());
        let n = block.len() / typesize;
        let mut shuffled = block.to_vec();
        for j in 0..n {
            for i in 0..typesize {
                shuffled[i * n + j] = block[j * typesize + i];
            }
        }
        let c = zstd::bulk::compress(&shuffled, 3).unwrap();
        f.extend((c.len() as u32).to_le_bytes());
        f.extend(c);
    }
    let total = f.len() as u32;
    f[12..16].copy_from_slice(&total.to_le_bytes());
    f
}

/// A Blosc chunk (zarr's `blosc` codec) is decoded next to the data by the
/// `spindle_blosc_decompress` helper and reduced to the same results as the raw chunk; a
/// corrupt frame and too little room stop the run with the helper's reason.
#[test]
fn the_zarr_reduce_program_decodes_blosc_chunks() {
    let p = Program::load(&build_file("programs/zarr_reduce.c")).unwrap();
    assert!(p
        .helpers_used
        .contains(&"spindle_blosc_decompress".to_string()));
    let vals: Vec<f64> = (0..32_768)
        .map(|i| ((i * 7919) % 1000) as f64 / 8.0)
        .collect();
    let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Three blocks, the last one short.
    let packed = blosc_zstd_frame(&raw, 100_000);
    assert!(packed.len() < raw.len() / 2, "compressible test data");
    let shape = [256u64, 128];
    let plain = p
        .run(
            Engine::Jit,
            &raw,
            &reduce_args(2, &shape, &[0, 0], &shape),
            &small(),
        )
        .unwrap();
    let args = |decoded_len: u64| {
        let mut a = reduce_args(2, &shape, &[0, 0], &shape);
        a.extend_from_slice(&2u64.to_le_bytes());
        a.extend_from_slice(&decoded_len.to_le_bytes());
        a
    };
    for engine in BOTH {
        let out = p
            .run(engine, &packed, &args(raw.len() as u64), &small())
            .unwrap();
        assert_eq!(out.output, plain.output, "{engine:?}");
        assert_eq!(out.ret, 32_768);
    }
    let stops = |data: &[u8], args: &[u8], what: &str| {
        for engine in BOTH {
            let e = p.run(engine, data, args, &small()).unwrap_err();
            assert!(e.to_string().contains(what), "{engine:?}: {e}");
        }
    };
    let mut corrupt = packed.clone();
    corrupt.truncate(corrupt.len() - 3);
    stops(
        &corrupt,
        &args(raw.len() as u64),
        "spindle_blosc_decompress",
    );
    stops(
        &packed,
        &args(raw.len() as u64 / 2),
        "the decoded buffer is",
    );
}
