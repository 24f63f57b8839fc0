//! `spindle_reduce`: count, sum, min and max over an n-dimensional box of a chunk of
//! fixed-width little-endian values in C order (an uncompressed Zarr chunk), the native
//! helper behind reductions next to the data (issue #24). eBPF has no floating point, so
//! the arithmetic is here; the program only passes the request and emits the result.
//!
//! Floats sum in double precision and propagate NaN to sum, min and max (as NumPy does);
//! integers sum with wraparound in 64 bits (as NumPy's int64 sum does). The results are
//! the bits of an f64 (floats), i64 (signed) or u64 (unsigned); with no value in the box
//! they are all 0.

/// Most dimensions a box may have.
pub const REDUCE_DIMS_MAX: usize = 8;
/// Size of `struct spindle_reduce` (`include/spindle_prog.h`): data, data_len, dtype,
/// ndim, shape[8], start[8], stop[8], count, sum, min, max.
pub const REDUCE_SPEC_BYTES: usize = 8 * (4 + 3 * REDUCE_DIMS_MAX + 4);
/// Offset of the results (`count`) in the request.
pub const REDUCE_RESULT_OFFSET: usize = 8 * (4 + 3 * REDUCE_DIMS_MAX);

const _: () = assert!(REDUCE_SPEC_BYTES == 256);

/// Element types (`enum spindle_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32 = 1,
    F64 = 2,
    I8 = 3,
    I16 = 4,
    I32 = 5,
    I64 = 6,
    U8 = 7,
    U16 = 8,
    U32 = 9,
    U64 = 10,
}

impl Dtype {
    pub fn from_code(code: u64) -> Option<Dtype> {
        use Dtype::*;
        Some(match code {
            1 => F32,
            2 => F64,
            3 => I8,
            4 => I16,
            5 => I32,
            6 => I64,
            7 => U8,
            8 => U16,
            9 => U32,
            10 => U64,
            _ => return None,
        })
    }

    pub fn width(self) -> usize {
        use Dtype::*;
        match self {
            I8 | U8 => 1,
            I16 | U16 => 2,
            F32 | I32 | U32 => 4,
            F64 | I64 | U64 => 8,
        }
    }
}

/// What a reduction gives: `sum`, `min` and `max` as bits (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reduced {
    pub count: u64,
    pub sum: u64,
    pub min: u64,
    pub max: u64,
}

/// Running state of one element kind.
trait Acc {
    fn new() -> Self;
    fn add_run(&mut self, run: &[u8]);
    fn finish(self, count: u64) -> Reduced;
}

struct FloatAcc {
    sum: f64,
    min: f64,
    max: f64,
    nan: bool,
}

/// Independent lanes of the float loop: partial sums, minima and maxima that the compiler
/// keeps in vector registers (16 f64 lanes: four AVX2 registers per accumulator, enough
/// independent additions to hide their latency). 64 KiB of f32 reduce in about 5 us with
/// AVX2, 10 without, against 45-55 with one running minimum and maximum (session 30).
const FLOAT_LANES: usize = 16;

macro_rules! float_acc {
    ($name:ident, $t:ty, $w:expr) => {
        struct $name(FloatAcc);
        impl Acc for $name {
            fn new() -> Self {
                $name(FloatAcc {
                    sum: 0.0,
                    min: f64::INFINITY,
                    max: f64::NEG_INFINITY,
                    nan: false,
                })
            }
            #[inline(always)]
            fn add_run(&mut self, run: &[u8]) {
                let a = &mut self.0;
                // Comparisons that skip NaN (a NaN is noted apart and wins at the end), so
                // each lane is a plain vector min, max and add.
                let mut s = [0f64; FLOAT_LANES];
                let mut lo = [f64::INFINITY; FLOAT_LANES];
                let mut hi = [f64::NEG_INFINITY; FLOAT_LANES];
                let mut nan = [0u64; FLOAT_LANES];
                let mut chunks = run.chunks_exact(FLOAT_LANES * $w);
                for c in &mut chunks {
                    let mut v = [0f64; FLOAT_LANES];
                    for (k, e) in c.chunks_exact($w).enumerate() {
                        v[k] = <$t>::from_le_bytes(e.try_into().expect("width")) as f64;
                    }
                    for k in 0..FLOAT_LANES {
                        s[k] += v[k];
                        lo[k] = if v[k] < lo[k] { v[k] } else { lo[k] };
                        hi[k] = if v[k] > hi[k] { v[k] } else { hi[k] };
                        nan[k] |= u64::from(v[k].is_nan());
                    }
                }
                for e in chunks.remainder().chunks_exact($w) {
                    let v = <$t>::from_le_bytes(e.try_into().expect("width")) as f64;
                    s[0] += v;
                    lo[0] = if v < lo[0] { v } else { lo[0] };
                    hi[0] = if v > hi[0] { v } else { hi[0] };
                    nan[0] |= u64::from(v.is_nan());
                }
                let mut sum = 0.0;
                for k in 0..FLOAT_LANES {
                    sum += s[k];
                    a.min = if lo[k] < a.min { lo[k] } else { a.min };
                    a.max = if hi[k] > a.max { hi[k] } else { a.max };
                    a.nan |= nan[k] != 0;
                }
                a.sum += sum;
            }
            fn finish(self, count: u64) -> Reduced {
                let a = self.0;
                if count == 0 {
                    return Reduced::default();
                }
                let (min, max) = if a.nan {
                    (f64::NAN, f64::NAN)
                } else {
                    (a.min, a.max)
                };
                Reduced {
                    count,
                    sum: a.sum.to_bits(),
                    min: min.to_bits(),
                    max: max.to_bits(),
                }
            }
        }
    };
}

float_acc!(F32Acc, f32, 4);
float_acc!(F64Acc, f64, 8);

macro_rules! int_acc {
    ($name:ident, $t:ty, $wide:ty, $w:expr) => {
        struct $name {
            sum: $wide,
            min: $t,
            max: $t,
        }
        impl Acc for $name {
            fn new() -> Self {
                $name {
                    sum: 0,
                    min: <$t>::MAX,
                    max: <$t>::MIN,
                }
            }
            #[inline(always)]
            fn add_run(&mut self, run: &[u8]) {
                for e in run.chunks_exact($w) {
                    let v = <$t>::from_le_bytes(e.try_into().expect("width"));
                    self.sum = self.sum.wrapping_add(v as $wide);
                    self.min = self.min.min(v);
                    self.max = self.max.max(v);
                }
            }
            fn finish(self, count: u64) -> Reduced {
                if count == 0 {
                    return Reduced::default();
                }
                Reduced {
                    count,
                    sum: self.sum as u64,
                    min: self.min as $wide as u64,
                    max: self.max as $wide as u64,
                }
            }
        }
    };
}

int_acc!(I8Acc, i8, i64, 1);
int_acc!(I16Acc, i16, i64, 2);
int_acc!(I32Acc, i32, i64, 4);
int_acc!(I64Acc, i64, i64, 8);
int_acc!(U8Acc, u8, u64, 1);
int_acc!(U16Acc, u16, u64, 2);
int_acc!(U32Acc, u32, u64, 4);
int_acc!(U64Acc, u64, u64, 8);

/// Reduces the box `start..stop` of a chunk of `shape` (C order) held in `data`.
pub fn reduce_box(
    data: &[u8],
    dtype: u64,
    shape: &[u64],
    start: &[u64],
    stop: &[u64],
) -> Result<Reduced, String> {
    let dt = Dtype::from_code(dtype).ok_or_else(|| format!("unknown dtype {dtype}"))?;
    let ndim = shape.len();
    if ndim == 0 || ndim > REDUCE_DIMS_MAX || start.len() != ndim || stop.len() != ndim {
        return Err(format!(
            "ndim {ndim} (1 to {REDUCE_DIMS_MAX}), with a start and a stop per dimension"
        ));
    }
    let mut elements: u64 = 1;
    for d in 0..ndim {
        if start[d] > stop[d] || stop[d] > shape[d] {
            return Err(format!(
                "dimension {d}: box {}..{} outside 0..{}",
                start[d], stop[d], shape[d]
            ));
        }
        elements = elements
            .checked_mul(shape[d])
            .ok_or_else(|| "the chunk's shape overflows".to_string())?;
    }
    let w = dt.width();
    let need = elements
        .checked_mul(w as u64)
        .filter(|&b| b <= data.len() as u64)
        .ok_or_else(|| {
            format!(
                "a chunk of {elements} values of {w} bytes does not fit in {} bytes",
                data.len()
            )
        })?;
    debug_assert!(need <= data.len() as u64);
    macro_rules! run {
        ($acc:ty) => {
            reduce_with::<$acc>(data, w, shape, start, stop)
        };
    }
    Ok(match dt {
        Dtype::F32 => run!(F32Acc),
        Dtype::F64 => run!(F64Acc),
        Dtype::I8 => run!(I8Acc),
        Dtype::I16 => run!(I16Acc),
        Dtype::I32 => run!(I32Acc),
        Dtype::I64 => run!(I64Acc),
        Dtype::U8 => run!(U8Acc),
        Dtype::U16 => run!(U16Acc),
        Dtype::U32 => run!(U32Acc),
        Dtype::U64 => run!(U64Acc),
    })
}

/// Walks the box's rows (the last dimension is contiguous) in C order, with AVX2 where
/// the CPU has it (the same code compiled twice).
fn reduce_with<A: Acc>(
    data: &[u8],
    w: usize,
    shape: &[u64],
    start: &[u64],
    stop: &[u64],
) -> Reduced {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { reduce_with_avx2::<A>(data, w, shape, start, stop) };
    }
    reduce_rows::<A>(data, w, shape, start, stop)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_with_avx2<A: Acc>(
    data: &[u8],
    w: usize,
    shape: &[u64],
    start: &[u64],
    stop: &[u64],
) -> Reduced {
    reduce_rows::<A>(data, w, shape, start, stop)
}

#[inline(always)]
fn reduce_rows<A: Acc>(
    data: &[u8],
    w: usize,
    shape: &[u64],
    start: &[u64],
    stop: &[u64],
) -> Reduced {
    let ndim = shape.len();
    if (0..ndim).any(|d| start[d] == stop[d]) {
        return A::new().finish(0);
    }
    let mut stride = [1u64; REDUCE_DIMS_MAX];
    for d in (0..ndim - 1).rev() {
        stride[d] = stride[d + 1] * shape[d + 1];
    }
    let last = ndim - 1;
    let row = (stop[last] - start[last]) as usize;
    let mut idx = [0u64; REDUCE_DIMS_MAX];
    idx[..ndim].copy_from_slice(start);
    let mut acc = A::new();
    let mut count = 0u64;
    loop {
        let base: u64 = (0..ndim).map(|d| idx[d] * stride[d]).sum();
        let from = base as usize * w;
        acc.add_run(&data[from..from + row * w]);
        count += row as u64;
        // Next row: the odometer over the dimensions before the last.
        let mut d = last;
        loop {
            if d == 0 {
                return acc.finish(count);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < stop[d] {
                break;
            }
            idx[d] = start[d];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_whole_chunk_and_a_box_of_it() {
        // 3 x 4 chunk of f32: 0..12.
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let d = f32s(&v);
        let r = reduce_box(&d, 1, &[3, 4], &[0, 0], &[3, 4]).unwrap();
        assert_eq!(r.count, 12);
        assert_eq!(f64::from_bits(r.sum), 66.0);
        assert_eq!(f64::from_bits(r.min), 0.0);
        assert_eq!(f64::from_bits(r.max), 11.0);
        // Rows 1..3, columns 1..3: 5, 6, 9, 10.
        let r = reduce_box(&d, 1, &[3, 4], &[1, 1], &[3, 3]).unwrap();
        assert_eq!((r.count, f64::from_bits(r.sum)), (4, 30.0));
        assert_eq!((f64::from_bits(r.min), f64::from_bits(r.max)), (5.0, 10.0));
        // An empty box.
        assert_eq!(
            reduce_box(&d, 1, &[3, 4], &[2, 1], &[2, 3]).unwrap(),
            Reduced::default()
        );
    }

    #[test]
    fn nan_propagates_and_integers_wrap_like_numpy() {
        let d = f32s(&[1.0, f32::NAN, 3.0]);
        let r = reduce_box(&d, 1, &[3], &[0], &[3]).unwrap();
        assert!(f64::from_bits(r.sum).is_nan() && f64::from_bits(r.min).is_nan());
        let v: Vec<u8> = [i64::MAX, 1, -5]
            .iter()
            .flat_map(|x: &i64| x.to_le_bytes())
            .collect();
        let r = reduce_box(&v, 6, &[3], &[0], &[3]).unwrap();
        assert_eq!(r.sum as i64, i64::MAX.wrapping_add(1).wrapping_add(-5));
        assert_eq!((r.min as i64, r.max as i64), (-5, i64::MAX));
        let u: Vec<u8> = vec![200, 7, 255];
        let r = reduce_box(&u, 7, &[3], &[0], &[3]).unwrap();
        assert_eq!((r.sum, r.min, r.max), (462, 7, 255));
        let i: Vec<u8> = [-3i16, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
        let r = reduce_box(&i, 4, &[2], &[0], &[2]).unwrap();
        assert_eq!((r.sum as i64, r.min as i64, r.max as i64), (6, -3, 9));
    }

    /// Every dtype and a 3-d box against a plain loop over the same values.
    #[test]
    fn boxes_match_a_plain_loop() {
        let shape = [5u64, 6, 7];
        let n = 5 * 6 * 7;
        let vals: Vec<i64> = (0..n).map(|i| (i * 7919 % 201) - 100).collect();
        let (start, stop) = ([1u64, 0, 2], [4u64, 5, 7]);
        let inside = |i: usize| {
            let (a, b, c) = (i / 42, (i / 7) % 6, i % 7);
            (start[0]..stop[0]).contains(&(a as u64))
                && (start[1]..stop[1]).contains(&(b as u64))
                && (start[2]..stop[2]).contains(&(c as u64))
        };
        let picked: Vec<i64> = (0..n as usize)
            .filter(|&i| inside(i))
            .map(|i| vals[i])
            .collect();
        let d: Vec<u8> = vals
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect();
        let r = reduce_box(&d, 5, &shape, &start, &stop).unwrap();
        assert_eq!(r.count, picked.len() as u64);
        assert_eq!(r.sum as i64, picked.iter().sum::<i64>());
        assert_eq!(r.min as i64, *picked.iter().min().unwrap());
        assert_eq!(r.max as i64, *picked.iter().max().unwrap());
        let d: Vec<u8> = vals
            .iter()
            .flat_map(|&x| (x as f64).to_le_bytes())
            .collect();
        let r = reduce_box(&d, 2, &shape, &start, &stop).unwrap();
        assert_eq!(f64::from_bits(r.sum), picked.iter().sum::<i64>() as f64);
    }

    /// The lane-wise float loop against one running value, for every length around the
    /// lane count, a NaN at every position, and infinities of both signs; in both
    /// compilations (portable, and AVX2 where the CPU has it).
    #[test]
    fn float_lanes_agree_with_a_running_value_at_every_length_and_nan_position() {
        fn plain(v: &[f64]) -> (f64, f64, f64, bool) {
            let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
            for &x in v {
                lo = lo.min(x);
                hi = hi.max(x);
            }
            (v.iter().sum(), lo, hi, v.iter().any(|x| x.is_nan()))
        }
        type Reducer = fn(&[u8], usize, &[u64], &[u64], &[u64]) -> Reduced;
        let mut ways: Vec<(&str, Reducer)> = vec![
            ("portable", reduce_rows::<F32Acc>),
            ("dispatched", reduce_with::<F32Acc>),
        ];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            ways.push(("avx2", |d, w, sh, a, b| unsafe {
                reduce_with_avx2::<F32Acc>(d, w, sh, a, b)
            }));
        }
        for n in 1..(3 * FLOAT_LANES + 3) {
            let base: Vec<f32> = (0..n).map(|i| ((i * 37 % 23) as f32) - 11.5).collect();
            let mut cases = vec![base.clone()];
            for p in 0..n {
                let mut v = base.clone();
                v[p] = f32::NAN;
                cases.push(v);
            }
            let mut v = base.clone();
            v[n / 2] = f32::INFINITY;
            v[n - 1] = f32::NEG_INFINITY;
            cases.push(v);
            for v in cases {
                let want = plain(&v.iter().map(|&x| x as f64).collect::<Vec<_>>());
                let d = f32s(&v);
                for (name, f) in &ways {
                    let r = f(&d, 4, &[n as u64], &[0], &[n as u64]);
                    let (sum, lo, hi) = (
                        f64::from_bits(r.sum),
                        f64::from_bits(r.min),
                        f64::from_bits(r.max),
                    );
                    assert_eq!(r.count, n as u64, "{name} n={n}");
                    if want.3 {
                        assert!(
                            sum.is_nan() && lo.is_nan() && hi.is_nan(),
                            "{name} n={n} {v:?}"
                        );
                    } else {
                        assert_eq!((lo, hi), (want.1, want.2), "{name} n={n} {v:?}");
                        assert!(
                            sum == want.0
                                || (sum - want.0).abs() <= 1e-9 * want.0.abs().max(1.0)
                                || (sum.is_nan() && want.0.is_nan()),
                            "{name} n={n}: {sum} vs {}",
                            want.0
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let d = vec![0u8; 16];
        assert!(reduce_box(&d, 99, &[4], &[0], &[4]).is_err());
        assert!(
            reduce_box(&d, 1, &[5], &[0], &[5]).is_err(),
            "20 bytes in 16"
        );
        assert!(reduce_box(&d, 1, &[4], &[3], &[2]).is_err());
        assert!(reduce_box(&d, 1, &[4], &[0], &[5]).is_err());
        assert!(reduce_box(&d, 1, &[], &[], &[]).is_err());
        assert!(reduce_box(&d, 1, &[u64::MAX, 2], &[0, 0], &[1, 1]).is_err());
    }
}
