//! Golden vectors produced with the real ISA-L 2.30 and Jerasure 2.0 (copied from
//! `shared/ec/ec_vectors.json` into `tests/data/`): matrices, SHA-256, first bytes and CRC32C
//! of every chunk must be reproduced exactly, by every engine, by plain and fused encode.

use serde_json::Value;
use sha2::{Digest, Sha256};
use spindle_ec::{crc32c, EngineKind, MatrixKind, ReedSolomon};

const VECTORS: &str = include_str!("data/ec_vectors.json");

/// The documented input: 32-bit LCG (Numerical Recipes), seed 0x12345678, byte = state >> 24
/// after each step.
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

fn matrix_kind(generator: &str) -> MatrixKind {
    if generator.starts_with("gf_gen_cauchy1_matrix") {
        MatrixKind::IsalCauchy
    } else if generator.starts_with("gf_gen_rs_matrix") {
        MatrixKind::IsalRs
    } else if generator.starts_with("reed_sol_vandermonde_coding_matrix") {
        MatrixKind::JerasureVandermonde
    } else {
        panic!("unknown generator {generator}")
    }
}

fn as_usize(v: &Value) -> usize {
    v.as_u64().expect("number") as usize
}

fn rows(v: &Value) -> Vec<Vec<u8>> {
    v.as_array()
        .expect("matrix")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("row")
                .iter()
                .map(|x| as_usize(x) as u8)
                .collect()
        })
        .collect()
}

fn check_chunk(expected: &Value, chunk: &[u8], what: &str) {
    assert_eq!(
        hex(&Sha256::digest(chunk)),
        expected["sha256"].as_str().unwrap(),
        "{what} sha256"
    );
    assert_eq!(
        hex(&chunk[..64]),
        expected["first64_hex"].as_str().unwrap(),
        "{what} first64"
    );
    if let Some(crc) = expected.get("crc32c").and_then(Value::as_str) {
        assert_eq!(
            format!("{:#010x}", crc32c::crc32c(chunk)),
            crc,
            "{what} crc32c"
        );
    }
}

#[test]
fn input_stream_matches_documentation() {
    let doc: Value = serde_json::from_str(VECTORS).unwrap();
    let first = doc["input_generation"]["first_16_stream_bytes_hex"]
        .as_str()
        .unwrap();
    assert_eq!(hex(&lcg_stream(16)), first);
    let check = doc["crc32c_check"]["123456789"].as_str().unwrap();
    assert_eq!(format!("{:#010x}", crc32c::crc32c(b"123456789")), check);
}

#[test]
fn golden_vectors_every_engine() {
    let doc: Value = serde_json::from_str(VECTORS).unwrap();
    let vectors = doc["vectors"].as_array().unwrap();
    assert_eq!(vectors.len(), 6);
    for vector in vectors {
        let name = vector["name"].as_str().unwrap();
        let (k, m) = (as_usize(&vector["k"]), as_usize(&vector["m"]));
        let chunk_bytes = as_usize(&vector["chunk_size"]);
        let kind = matrix_kind(vector["matrix_generator"].as_str().unwrap());
        let stream = lcg_stream(k * chunk_bytes);
        let data: Vec<&[u8]> = stream.chunks(chunk_bytes).collect();
        for (i, expected) in vector["data_chunks"].as_array().unwrap().iter().enumerate() {
            check_chunk(expected, data[i], &format!("{name} data {i}"));
        }
        for engine in EngineKind::CONCRETE
            .into_iter()
            .filter(|e| e.is_available())
        {
            let codec = ReedSolomon::with_engine(k, m, kind, engine).unwrap();
            assert_eq!(
                codec.encode_matrix().to_rows(),
                rows(&vector["encode_matrix_full"])
            );
            assert_eq!(
                spindle_ec::matrix::coding_matrix(kind, k, m)
                    .unwrap()
                    .to_rows(),
                rows(&vector["coding_matrix"]),
                "{name}"
            );
            let mut parity = vec![vec![0xAAu8; chunk_bytes]; m];
            codec.encode(&data, &mut parity).unwrap();
            let mut fused_parity = vec![vec![0x55u8; chunk_bytes]; m];
            let mut crcs = vec![0u32; k + m];
            codec
                .encode_with_crc(&data, &mut fused_parity, &mut crcs)
                .unwrap();
            assert_eq!(parity, fused_parity, "{name} {engine}");
            for (r, expected) in vector["parity_chunks"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
            {
                assert_eq!(as_usize(&expected["index"]), k + r);
                check_chunk(expected, &parity[r], &format!("{name} {engine} parity {r}"));
            }
            for (i, chunk) in data
                .iter()
                .copied()
                .chain(parity.iter().map(Vec::as_slice))
                .enumerate()
            {
                assert_eq!(
                    crcs[i],
                    crc32c::crc32c(chunk),
                    "{name} {engine} fused crc {i}"
                );
            }
        }
    }
}
