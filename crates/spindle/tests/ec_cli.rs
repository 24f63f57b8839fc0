//! Black-box tests of `spindle ec encode | decode` through the real binary: the ISA-L and
//! Jerasure golden vectors, decoding from every kind of survivor set, and clear failures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};

const VECTORS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../spindle-ec/tests/data/ec_vectors.json"
));

fn spindle(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spindle"));
    command.args(args).env_remove("SPINDLE_EC_ENGINE");
    for (key, value) in envs {
        command.env(key, value);
    }
    command.output().expect("spindle binary runs")
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "spindle failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn failed(output: &Output) -> String {
    assert!(!output.status.success(), "spindle unexpectedly succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh scratch directory under the target directory.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("ec_cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

fn lcg_stream(len: usize) -> Vec<u8> {
    let mut state: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn matrix_arg(generator: &str) -> &'static str {
    if generator.starts_with("gf_gen_cauchy1_matrix") {
        "isal-cauchy"
    } else if generator.starts_with("gf_gen_rs_matrix") {
        "isal-rs"
    } else {
        "jerasure-van"
    }
}

fn code_args(k: usize, m: usize, matrix: &str, chunk: usize) -> Vec<String> {
    [
        "-k",
        &k.to_string(),
        "-m",
        &m.to_string(),
        "--matrix",
        matrix,
        "--chunk-size",
        &chunk.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn encode(dir: &Path, input: &Path, code: &[String], envs: &[(&str, &str)]) -> Output {
    let mut args: Vec<String> = vec!["ec".into(), "encode".into()];
    args.extend(code.iter().cloned());
    args.extend(["--input".into(), input.display().to_string()]);
    args.extend(["--output-dir".into(), dir.display().to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spindle(&refs, envs)
}

fn decode(dir: &Path, output: &Path, code: &[String], extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["ec".into(), "decode".into()];
    args.extend(code.iter().cloned());
    args.extend(["--dir".into(), dir.display().to_string()]);
    args.extend(["--output".into(), output.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    spindle(&refs, &[])
}

#[test]
fn golden_vectors_through_the_cli() {
    let doc: Value = serde_json::from_str(VECTORS).expect("vectors parse");
    for vector in doc["vectors"].as_array().expect("vector list") {
        let name = vector["name"].as_str().unwrap();
        let k = vector["k"].as_u64().unwrap() as usize;
        let m = vector["m"].as_u64().unwrap() as usize;
        let chunk = vector["chunk_size"].as_u64().unwrap() as usize;
        let matrix = matrix_arg(vector["matrix_generator"].as_str().unwrap());
        let root = scratch(name);
        let input = root.join("input");
        let data = lcg_stream(k * chunk);
        std::fs::write(&input, &data).unwrap();
        let code = code_args(k, m, matrix, chunk);
        let chunks = root.join("chunks");
        ok(&encode(&chunks, &input, &code, &[]));
        let expected_chunks = vector["data_chunks"]
            .as_array()
            .unwrap()
            .iter()
            .chain(vector["parity_chunks"].as_array().unwrap());
        for expected in expected_chunks {
            let index = expected["index"].as_u64().unwrap();
            let bytes = std::fs::read(chunks.join(index.to_string())).unwrap();
            assert_eq!(bytes.len(), chunk, "{name} chunk {index}");
            assert_eq!(
                hex(&Sha256::digest(&bytes)),
                expected["sha256"].as_str().unwrap(),
                "{name} {index}"
            );
            assert_eq!(hex(&bytes[..64]), expected["first64_hex"].as_str().unwrap());
        }
        // Lose the first m data chunks: decode rebuilds them from the rest.
        for index in 0..m {
            std::fs::remove_file(chunks.join(index.to_string())).unwrap();
        }
        let output = root.join("decoded");
        let report = ok(&decode(&chunks, &output, &code, &[]));
        assert!(report.contains("rebuilt"), "{report}");
        assert_eq!(std::fs::read(&output).unwrap(), data, "{name}");
    }
}

#[test]
fn golden_vectors_with_the_scalar_engine() {
    let doc: Value = serde_json::from_str(VECTORS).unwrap();
    let vector = &doc["vectors"][2]; // Jerasure RS(4,2)
    let root = scratch("scalar");
    let input = root.join("input");
    std::fs::write(&input, lcg_stream(4 * 4096)).unwrap();
    let code = code_args(4, 2, "jerasure-van", 4096);
    let report = ok(&encode(
        &root.join("chunks"),
        &input,
        &code,
        &[("SPINDLE_EC_ENGINE", "scalar")],
    ));
    assert!(report.contains("engine scalar"), "{report}");
    let parity = std::fs::read(root.join("chunks").join("5")).unwrap();
    assert_eq!(
        hex(&Sha256::digest(&parity)),
        vector["parity_chunks"][1]["sha256"].as_str().unwrap()
    );
    let bogus = encode(
        &root.join("chunks"),
        &input,
        &code,
        &[("SPINDLE_EC_ENGINE", "gpu")],
    );
    assert!(failed(&bogus).contains("unknown coding engine"));
}

#[test]
fn every_survivor_set_of_rs_6_3_decodes_short_input() {
    let root = scratch("rs63");
    let input = root.join("input");
    let original: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(&input, &original).unwrap();
    let code = code_args(6, 3, "isal-rs", 1999);
    let pristine = root.join("pristine");
    ok(&encode(&pristine, &input, &code, &[]));
    // Every pattern of up to 3 missing files among 9: data, parity or both.
    for mask in 0u32..(1 << 9) {
        if mask.count_ones() > 3 {
            continue;
        }
        let dir = root.join(format!("set{mask}"));
        std::fs::create_dir_all(&dir).unwrap();
        for index in 0..9 {
            if mask & (1 << index) == 0 {
                std::fs::copy(
                    pristine.join(index.to_string()),
                    dir.join(index.to_string()),
                )
                .unwrap();
            }
        }
        let output = root.join(format!("out{mask}"));
        ok(&decode(
            &dir,
            &output,
            &code,
            &["--length", &original.len().to_string()],
        ));
        assert_eq!(
            std::fs::read(&output).unwrap(),
            original,
            "missing mask {mask:#b}"
        );
    }
    // Without --length the zero padding up to k x chunk-size is kept.
    let padded = root.join("padded");
    ok(&decode(&pristine, &padded, &code, &[]));
    let bytes = std::fs::read(&padded).unwrap();
    assert_eq!(bytes.len(), 6 * 1999);
    assert_eq!(&bytes[..original.len()], &original[..]);
    assert!(bytes[original.len()..].iter().all(|&b| b == 0));
}

#[test]
fn failures_are_clear() {
    let root = scratch("failures");
    let input = root.join("input");
    std::fs::write(&input, vec![7u8; 5000]).unwrap();
    let chunks = root.join("chunks");
    let code = code_args(4, 2, "isal-cauchy", 1024);

    // Input larger than one stripe.
    let error = failed(&encode(&chunks, &input, &code, &[]));
    assert!(error.contains("more than one stripe"), "{error}");

    // Bad code parameters.
    let error = failed(&encode(
        &chunks,
        &input,
        &code_args(0, 2, "isal-cauchy", 4096),
        &[],
    ));
    assert!(error.contains("at least 1"), "{error}");
    let error = failed(&encode(
        &chunks,
        &input,
        &code_args(60, 5, "isal-cauchy", 4096),
        &[],
    ));
    assert!(error.contains("exceeds the limit of 64"), "{error}");
    let error = failed(&encode(
        &chunks,
        &input,
        &code_args(4, 0, "isal-cauchy", 4096),
        &[],
    ));
    assert!(error.contains("parity"), "{error}");
    let error = failed(&encode(
        &chunks,
        &input,
        &code_args(4, 2, "isal-cauchy", 0),
        &[],
    ));
    assert!(error.contains("--chunk-size"), "{error}");
    let error = failed(&encode(
        &chunks,
        &input,
        &code_args(4, 2, "reed-solomon", 4096),
        &[],
    ));
    assert!(error.contains("isal-cauchy"), "{error}");
    let missing_input = failed(&encode(
        &chunks,
        &root.join("nope"),
        &code_args(4, 2, "isal-rs", 4096),
        &[],
    ));
    assert!(
        missing_input.contains("cannot read input"),
        "{missing_input}"
    );

    // A good encode, then damage.
    let code = code_args(4, 2, "isal-cauchy", 2048);
    ok(&encode(&chunks, &input, &code, &[]));
    let output = root.join("out");
    for index in [0, 3, 5] {
        std::fs::remove_file(chunks.join(index.to_string())).unwrap();
    }
    let error = failed(&decode(&chunks, &output, &code, &[]));
    assert!(
        error.contains("only 3 of 6") && error.contains("missing: 0, 3, 5"),
        "{error}"
    );
    assert!(!output.exists(), "no output on failure");

    ok(&encode(&chunks, &input, &code, &[]));
    let file = chunks.join("2");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.pop();
    std::fs::write(&file, bytes).unwrap();
    let error = failed(&decode(&chunks, &output, &code, &[]));
    assert!(
        error.contains("chunk sizes disagree") && error.contains("2047 bytes"),
        "{error}"
    );

    let error = failed(&decode(&root.join("absent"), &output, &code, &[]));
    assert!(error.contains("does not exist"), "{error}");
    ok(&encode(&chunks, &input, &code, &[]));
    let error = failed(&decode(&chunks, &output, &code, &["--length", "9000"]));
    assert!(error.contains("larger than the decoded data"), "{error}");
}

#[test]
fn help_documents_the_layout() {
    let help = ok(&spindle(&["ec", "encode", "--help"], &[]));
    assert!(
        help.contains("rejected") && help.contains("zero-padded"),
        "{help}"
    );
    let help = ok(&spindle(&["ec", "decode", "--help"], &[]));
    assert!(
        help.contains("at least k") && help.contains("--length"),
        "{help}"
    );
}
