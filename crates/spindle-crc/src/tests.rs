use proptest::prelude::*;

use super::*;

/// Bit-at-a-time CRC32C, the textbook definition.
fn bitwise(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLYNOMIAL
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn engines() -> Vec<CrcEngine> {
    [
        CrcEngine::Scalar,
        CrcEngine::Sse42,
        CrcEngine::Avx512,
        CrcEngine::ArmCrc,
    ]
    .into_iter()
    .filter(|e| e.is_available())
    .collect()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8
        })
        .collect()
}

#[test]
fn check_value() {
    assert_eq!(bitwise(b"123456789"), CHECK_VALUE);
    for engine in engines() {
        assert_eq!(
            crc32c_append_with(engine, 0, b"123456789"),
            CHECK_VALUE,
            "{engine:?}"
        );
    }
    assert_eq!(crc32c(b"123456789"), CHECK_VALUE);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn every_length_up_to_a_few_lanes() {
    let data = pattern(3 * 8192 * 2 + 300, 7);
    let lengths = (0..1100).chain([8191, 8192, 8193, 24_575, 24_576, 24_577, data.len()]);
    // Unaligned starts too.
    for start in 1..70 {
        let expected = bitwise(&data[start..start + 5000]);
        for engine in engines() {
            assert_eq!(
                crc32c_append_with(engine, 0, &data[start..start + 5000]),
                expected
            );
        }
    }
    for len in lengths {
        let expected = bitwise(&data[..len]);
        for engine in engines() {
            assert_eq!(
                crc32c_append_with(engine, 0, &data[..len]),
                expected,
                "{engine:?} {len}"
            );
        }
    }
}

#[test]
fn x_pow_matches_shifting_zero_bytes() {
    for bytes in [0u64, 1, 7, 64, 1000] {
        let zeros = vec![0u8; bytes as usize];
        for state in [1u32, 0x1234_5678, u32::MAX] {
            assert_eq!(
                multiply_mod(state, x_pow_8n(bytes)),
                update_scalar(state, &zeros),
                "{bytes} bytes"
            );
        }
    }
    assert_eq!(x_pow_8n(3), x_pow(24));
}

#[test]
fn x_inverse_is_inverse() {
    assert_eq!(multiply_mod(X_INVERSE, x_pow(1)), x_pow(0));
    for n in [1u64, 32, 33, 100, 4096] {
        assert_eq!(
            multiply_mod(x_inverse_pow(n), x_pow(n)),
            x_pow(0),
            "n = {n}"
        );
    }
}

#[test]
fn streams_match_single_buffers() {
    for count in 1..=16 {
        for len in [0usize, 1, 7, 8, 100, 4096, 4099] {
            let buffers: Vec<Vec<u8>> = (0..count).map(|i| pattern(len, i as u32)).collect();
            let pointers: Vec<*const u8> = buffers.iter().map(|b| b.as_ptr()).collect();
            for engine in engines() {
                let mut states = vec![u32::MAX; count];
                // SAFETY: every pointer refers to a live buffer of `len` bytes.
                unsafe { update_streams(engine, &mut states, &pointers, len) };
                for (state, buffer) in states.iter().zip(&buffers) {
                    assert_eq!(!state, bitwise(buffer), "{engine:?} {count} {len}");
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn matches_bitwise(data in proptest::collection::vec(any::<u8>(), 0..5000), split in 0usize..5000) {
        let expected = bitwise(&data);
        for engine in engines() {
            prop_assert_eq!(crc32c_append_with(engine, 0, &data), expected);
        }
        let split = split.min(data.len());
        let (a, b) = data.split_at(split);
        prop_assert_eq!(crc32c_append(crc32c(a), b), expected);
        prop_assert_eq!(crc32c_combine(crc32c(a), crc32c(b), b.len()), expected);
    }
}

#[test]
fn block_crcs_and_their_combination_match_direct_computation() {
    let data: Vec<u8> = (0..(1u32 << 20) + 4096 + 123)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for len in [
        0,
        1,
        4095,
        4096,
        4097,
        8192,
        3 * 4096 + 5,
        1 << 20,
        data.len(),
    ] {
        let mut blocks = Vec::new();
        let whole = crc32c_blocks(&data[..len], &mut blocks);
        assert_eq!(whole, crc32c(&data[..len]), "len {len}");
        let expected: Vec<u32> = data[..len].chunks(CRC_BLOCK_BYTES).map(crc32c).collect();
        assert_eq!(blocks, expected, "len {len}");
        assert_eq!(crc32c_of_blocks(&blocks, len), Some(whole), "len {len}");
        assert_eq!(crc32c_of_blocks(&blocks, len + 4096), None);
    }
}

proptest! {
    #[test]
    fn table_shift_matches_combine(a in any::<u32>(), b in any::<u32>(), len in 0u64..100_000) {
        let shift = Crc32cShift::new(len);
        prop_assert_eq!(shift.combine(a, b), crc32c_combine(a, b, len as usize));
    }
}
