//! Interoperability of Spindle's erasure-coded object layout (`spindle_map::ec::EcLayout`
//! with `MatrixKind::IsalRs`) with Intel ISA-L's own encoder and decoder, loaded at run time
//! from `libisal.so.2` (Debian package `libisal2`). The tests fail, never skip, when the
//! library is missing.
//!
//! Both directions are checked: shards Spindle encoded are rebuilt by ISA-L after every
//! erasure pattern of up to m shards, and shards laid out here by hand with ISA-L parity are
//! identical to Spindle's and rebuilt by `EcLayout::reconstruct`.

mod isal;

use isal::Isal;
use spindle_ec::MatrixKind;
use spindle_map::ec::EcLayout;

/// Codes checked (k, m).
const CODES: [(usize, usize); 3] = [(2, 1), (4, 2), (6, 3)];
/// Stripe units checked, in bytes.
const STRIPE_UNITS: [usize; 2] = [512, 4096];

/// Object sizes checked for a code: empty, inside one unit, unit and stripe boundaries,
/// several stripes with a partial last one, and about 1 MiB.
fn object_sizes(k: usize, su: usize) -> Vec<usize> {
    vec![
        0,
        1,
        su - 1,
        su,
        su + 1,
        k * su - 1,
        k * su,
        k * su + 1,
        5 * k * su + 37,
        (1 << 20) + 3,
    ]
}

/// Fixed-seed object bytes (SplitMix64).
fn object(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Every set of 1..=m shard indices out of k + m, smallest sets first.
fn erasure_patterns(k: usize, m: usize) -> Vec<Vec<usize>> {
    let n = k + m;
    let mut patterns: Vec<Vec<usize>> = (1u32..1 << n)
        .filter(|mask| (mask.count_ones() as usize) <= m)
        .map(|mask| (0..n).filter(|&i| mask & (1 << i) != 0).collect())
        .collect();
    patterns.sort_by_key(|p| (p.len(), p.clone()));
    patterns
}

/// None if equal, else a description of the first difference (never the whole buffers).
fn difference(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(format!("length {} instead of {}", got.len(), want.len()));
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
    Some(format!(
        "first difference at byte {at}: {:#04x} instead of {:#04x}",
        got[at], want[at]
    ))
}

fn layout(k: usize, m: usize, su: usize) -> EcLayout {
    EcLayout::new(k, m, MatrixKind::IsalRs, su as u64)
        .unwrap_or_else(|e| panic!("EcLayout RS({k},{m}) su={su}: {e:?}"))
}

/// Spindle's encoding of `data`: the k + m shards.
fn spindle_shards(l: &EcLayout, data: &[u8]) -> Vec<Vec<u8>> {
    let stripes = l.stripes(data.len() as u64);
    let buf = l
        .encode_stripes(data, stripes)
        .unwrap_or_else(|e| panic!("{l:?} encode_stripes of {} bytes: {e:?}", data.len()));
    let seg = stripes as usize * l.stripe_unit_bytes as usize;
    assert_eq!(buf.len(), seg * l.total(), "{l:?} size={}", data.len());
    if seg == 0 {
        return vec![Vec::new(); l.total()];
    }
    buf.chunks(seg).map(<[u8]>::to_vec).collect()
}

/// Object bytes `[0, size)` gathered by Spindle from the k data shards.
fn gathered(l: &EcLayout, shards: &[Vec<u8>], size: usize) -> Vec<u8> {
    let segs: Vec<&[u8]> = shards[..l.k].iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    l.gather(&segs, 0, 0, size as u64, &mut out);
    out
}

/// The k data shards of an object, laid out independently of Spindle: shard j's unit of
/// stripe s holds object bytes `[s*k*su + j*su, +su)`, zero-padded past the end.
fn scatter(data: &[u8], k: usize, su: usize) -> Vec<Vec<u8>> {
    let stripes = data.len().div_ceil(k * su);
    let mut shards = vec![vec![0u8; stripes * su]; k];
    for s in 0..stripes {
        for (j, shard) in shards.iter_mut().enumerate() {
            let from = (s * k * su + j * su).min(data.len());
            let to = (from + su).min(data.len());
            shard[s * su..s * su + (to - from)].copy_from_slice(&data[from..to]);
        }
    }
    shards
}

#[test]
fn spindle_encoded_shards_decode_with_isal() {
    let isal = Isal::load();
    let mut decodes = 0usize;
    for (k, m) in CODES {
        let patterns = erasure_patterns(k, m);
        for su in STRIPE_UNITS {
            let l = layout(k, m, su);
            for size in object_sizes(k, su) {
                let data = object(size, (k * 1000 + m * 100 + su + size) as u64);
                let shards = spindle_shards(&l, &data);
                if size == 0 {
                    assert!(
                        shards.iter().all(Vec::is_empty),
                        "RS({k},{m}) su={su}: an empty object has empty shards"
                    );
                    continue;
                }
                for pattern in &patterns {
                    let case = format!("RS({k},{m}) su={su} size={size} erased={pattern:?}");
                    let input: Vec<Option<Vec<u8>>> = shards
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (!pattern.contains(&i)).then(|| s.clone()))
                        .collect();
                    let decoded = isal.decode(k, m, &input);
                    assert_eq!(decoded.len(), k + m, "{case}");
                    for &i in pattern {
                        if let Some(d) = difference(&decoded[i], &shards[i]) {
                            panic!("{case}: ISA-L rebuilt shard {i} differs from Spindle's: {d}");
                        }
                    }
                    if let Some(d) = difference(&gathered(&l, &decoded, size), &data) {
                        panic!("{case}: object gathered from ISA-L-decoded shards: {d}");
                    }
                    decodes += 1;
                }
            }
        }
    }
    eprintln!("{decodes} ISA-L decodes of Spindle-encoded objects matched");
}

#[test]
fn isal_encoded_shards_decode_with_spindle() {
    let isal = Isal::load();
    let mut rebuilds = 0usize;
    for (k, m) in CODES {
        let patterns = erasure_patterns(k, m);
        for su in STRIPE_UNITS {
            let l = layout(k, m, su);
            for size in object_sizes(k, su) {
                let case = format!("RS({k},{m}) su={su} size={size}");
                let data = object(size, (k * 7919 + m * 104_729 + su * 3 + size) as u64);
                let data_shards = scatter(&data, k, su);
                let parity = isal.encode(k, m, &data_shards);
                assert_eq!(parity.len(), m, "{case}");
                let isal_shards: Vec<Vec<u8>> = data_shards.into_iter().chain(parity).collect();

                // Byte for byte what Spindle encodes, data and parity.
                let spindle = spindle_shards(&l, &data);
                for (i, (got, want)) in spindle.iter().zip(&isal_shards).enumerate() {
                    let what = if i < k { "data" } else { "parity" };
                    if let Some(d) = difference(got, want) {
                        panic!("{case}: Spindle {what} shard {i} differs from ISA-L's: {d}");
                    }
                }
                if let Some(d) = difference(&gathered(&l, &isal_shards, size), &data) {
                    panic!("{case}: object gathered from the ISA-L layout: {d}");
                }

                // Spindle rebuilds ISA-L's shards after any erasure of up to m of them.
                for pattern in &patterns {
                    let case = format!("{case} erased={pattern:?}");
                    let mut segs: Vec<Option<Vec<u8>>> = isal_shards
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (!pattern.contains(&i)).then(|| s.clone()))
                        .collect();
                    l.reconstruct(&mut segs)
                        .unwrap_or_else(|e| panic!("{case}: EcLayout::reconstruct: {e:?}"));
                    let rebuilt: Vec<Vec<u8>> = segs
                        .into_iter()
                        .enumerate()
                        .map(|(i, s)| s.unwrap_or_else(|| panic!("{case}: shard {i} left None")))
                        .collect();
                    for &i in pattern {
                        if let Some(d) = difference(&rebuilt[i], &isal_shards[i]) {
                            panic!("{case}: Spindle rebuilt shard {i} differs from ISA-L's: {d}");
                        }
                    }
                    if let Some(d) = difference(&gathered(&l, &rebuilt, size), &data) {
                        panic!("{case}: object gathered from Spindle-rebuilt shards: {d}");
                    }
                    rebuilds += 1;
                }
            }
        }
    }
    eprintln!("{rebuilds} Spindle rebuilds of ISA-L-encoded objects matched");
}
