//! A small safe wrapper over Intel ISA-L's erasure-coding API, loaded at run time from
//! `libisal.so.2` (Debian package `libisal2`), used as an independent reference for
//! Spindle's erasure-coded layout.
//!
//! Entry points used (C prototypes of ISA-L's `include/erasure_code.h`):
//! - `void gf_gen_rs_matrix(unsigned char *a, int m, int k)`: the m x k encode matrix, rows
//!   0..k the identity, the rest ISA-L's Reed-Solomon (Vandermonde-like) parity rows. This
//!   is the matrix of Spindle's `MatrixKind::IsalRs`.
//! - `void ec_init_tables(int k, int rows, unsigned char *a, unsigned char *gftbls)`: expands
//!   a rows x k coefficient matrix into `32 * k * rows` bytes of multiplication tables.
//! - `void ec_encode_data(int len, int k, int rows, unsigned char *gftbls,
//!   unsigned char **data, unsigned char **coding)`: coding[r] = sum_j a[r][j] * data[j]
//!   over GF(2^8), bytewise, for `len` bytes.
//! - `int gf_invert_matrix(unsigned char *in, unsigned char *out, const int n)`: inverts an
//!   n x n matrix (returns 0 on success, non-zero if singular; `in` is clobbered).
//! - `unsigned char gf_mul(unsigned char a, unsigned char b)`: GF(2^8) product.
//!
//! Decoding follows the recipe of ISA-L's `erasure_code/erasure_code_test.c`: take the rows of
//! the encode matrix of the first k surviving shards, invert that k x k matrix; an erased
//! data shard's decode row is the corresponding row of the inverse, an erased parity shard's
//! decode row is its encode row times the inverse. Then `ec_init_tables` over those rows and
//! one `ec_encode_data` call from the k survivors rebuild every erased shard.

use std::ffi::c_int;

type GenMatrixFn = unsafe extern "C" fn(a: *mut u8, m: c_int, k: c_int);
type InitTablesFn = unsafe extern "C" fn(k: c_int, rows: c_int, a: *mut u8, gftbls: *mut u8);
type EncodeDataFn = unsafe extern "C" fn(
    len: c_int,
    k: c_int,
    rows: c_int,
    gftbls: *mut u8,
    data: *mut *mut u8,
    coding: *mut *mut u8,
);
type InvertMatrixFn = unsafe extern "C" fn(input: *mut u8, output: *mut u8, n: c_int) -> c_int;
type GfMulFn = unsafe extern "C" fn(a: u8, b: u8) -> u8;

/// The shared library ISA-L is loaded from.
pub const LIBRARY: &str = "libisal.so.2";

/// ISA-L's erasure-coding entry points, resolved from `libisal.so.2`.
pub struct Isal {
    gen_rs_matrix: GenMatrixFn,
    init_tables: InitTablesFn,
    encode_data: EncodeDataFn,
    invert_matrix: InvertMatrixFn,
    gf_mul: GfMulFn,
    /// Keeps the library mapped while the function pointers above are in use.
    _library: libloading::Library,
}

impl Isal {
    /// Loads ISA-L. Panics (never skips) if the library or one of its symbols is missing.
    pub fn load() -> Isal {
        // SAFETY: loading ISA-L only runs its trivial ELF initialisers.
        let library = unsafe { libloading::Library::new(LIBRARY) }.unwrap_or_else(|e| {
            panic!(
                "cannot load Intel ISA-L ({LIBRARY}): {e}; these interoperability tests need \
                 the Debian package libisal2 (apt-get install libisal2)"
            )
        });
        /// Resolves `name`.
        ///
        /// # Safety
        /// `T` must be the C type of the symbol, and the pointer must not be called after
        /// `library` is unloaded.
        unsafe fn symbol<T: Copy>(library: &libloading::Library, name: &str) -> T {
            let c_name = format!("{name}\0");
            // SAFETY: contract of this function.
            *unsafe { library.get::<T>(c_name.as_bytes()) }.unwrap_or_else(|e| {
                panic!("{LIBRARY} (Debian libisal2) lacks the symbol {name}: {e}")
            })
        }
        // SAFETY: the types are the C prototypes of ISA-L's erasure_code.h and gf_vect_mul.h;
        // the pointers are only called while the library, stored alongside them, is alive.
        unsafe {
            Isal {
                gen_rs_matrix: symbol(&library, "gf_gen_rs_matrix"),
                init_tables: symbol(&library, "ec_init_tables"),
                encode_data: symbol(&library, "ec_encode_data"),
                invert_matrix: symbol(&library, "gf_invert_matrix"),
                gf_mul: symbol(&library, "gf_mul"),
                _library: library,
            }
        }
    }

    /// ISA-L's (k+m) x k encode matrix, `gf_gen_rs_matrix(a, k + m, k)`, row-major.
    pub fn rs_matrix(&self, k: usize, m: usize) -> Vec<u8> {
        assert!(k > 0 && m > 0 && k + m <= 255, "bad code shape k={k} m={m}");
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: `a` holds (k+m) * k bytes, all that gf_gen_rs_matrix writes.
        unsafe { (self.gen_rs_matrix)(a.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        a
    }

    fn mul(&self, a: u8, b: u8) -> u8 {
        // SAFETY: pure function of two bytes.
        unsafe { (self.gf_mul)(a, b) }
    }

    /// `ec_init_tables` over `rows` x k `coefficients` then one `ec_encode_data` call:
    /// `outputs[r] = sum_j coefficients[r][j] * inputs[j]`. All buffers have the same length.
    fn apply(&self, k: usize, coefficients: &mut [u8], inputs: &[&[u8]], outputs: &mut [Vec<u8>]) {
        let rows = outputs.len();
        assert_eq!(inputs.len(), k);
        assert_eq!(coefficients.len(), rows * k);
        let len = inputs[0].len();
        assert!(
            inputs.iter().all(|s| s.len() == len),
            "inputs differ in length"
        );
        assert!(
            outputs.iter().all(|s| s.len() == len),
            "outputs differ in length"
        );
        if len == 0 || rows == 0 {
            return;
        }
        let len = c_int::try_from(len).expect("shard too long for ISA-L's int length");
        let mut tables = vec![0u8; 32 * k * rows];
        // ISA-L only reads the sources (the C prototype is not const-correct).
        let mut src: Vec<*mut u8> = inputs.iter().map(|s| s.as_ptr().cast_mut()).collect();
        let mut dst: Vec<*mut u8> = outputs.iter_mut().map(|s| s.as_mut_ptr()).collect();
        // SAFETY: `coefficients` is rows x k, `tables` 32 * k * rows bytes; `src` holds k and
        // `dst` rows pointers to distinct live buffers of `len` bytes each.
        unsafe {
            (self.init_tables)(
                k as c_int,
                rows as c_int,
                coefficients.as_mut_ptr(),
                tables.as_mut_ptr(),
            );
            (self.encode_data)(
                len,
                k as c_int,
                rows as c_int,
                tables.as_mut_ptr(),
                src.as_mut_ptr(),
                dst.as_mut_ptr(),
            );
        }
    }

    /// The m parity shards of the k data shards (same length each), with ISA-L's
    /// `gf_gen_rs_matrix` code (Spindle's `MatrixKind::IsalRs`).
    pub fn encode(&self, k: usize, m: usize, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
        assert_eq!(data.len(), k, "encode needs k={k} data shards");
        let len = data[0].len();
        let a = self.rs_matrix(k, m);
        let mut parity_rows = a[k * k..].to_vec();
        let inputs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut parity = vec![vec![0u8; len]; m];
        self.apply(k, &mut parity_rows, &inputs, &mut parity);
        parity
    }

    /// All k + m shards, the `None` ones (at most m) rebuilt from the others with ISA-L, as
    /// `erasure_code_test.c` decodes. Panics if more than m are missing or the k x k matrix
    /// of the survivors is singular.
    pub fn decode(&self, k: usize, m: usize, shards: &[Option<Vec<u8>>]) -> Vec<Vec<u8>> {
        assert_eq!(shards.len(), k + m, "decode needs k+m={} shards", k + m);
        let erased: Vec<usize> = (0..k + m).filter(|&i| shards[i].is_none()).collect();
        assert!(
            erased.len() <= m,
            "{} shards erased, ISA-L RS({k},{m}) rebuilds at most {m}",
            erased.len()
        );
        let survivors: Vec<usize> = (0..k + m)
            .filter(|&i| shards[i].is_some())
            .take(k)
            .collect();
        let inputs: Vec<&[u8]> = survivors
            .iter()
            .map(|&i| shards[i].as_deref().unwrap())
            .collect();
        let len = inputs[0].len();
        let mut rebuilt = vec![vec![0u8; len]; erased.len()];
        if !erased.is_empty() {
            let a = self.rs_matrix(k, m);
            // The survivors' rows of the encode matrix, then its inverse.
            let mut b: Vec<u8> = survivors
                .iter()
                .flat_map(|&i| a[i * k..(i + 1) * k].iter().copied())
                .collect();
            let mut inverse = vec![0u8; k * k];
            // SAFETY: `b` and `inverse` are k x k.
            let status =
                unsafe { (self.invert_matrix)(b.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
            assert_eq!(
                status, 0,
                "gf_invert_matrix: singular survivor matrix for RS({k},{m}), rows {survivors:?}"
            );
            // Decode rows: data shard e -> row e of the inverse; parity shard e -> a[e] x inverse.
            let mut decode_rows = vec![0u8; erased.len() * k];
            for (p, &e) in erased.iter().enumerate() {
                let row = &mut decode_rows[p * k..(p + 1) * k];
                if e < k {
                    row.copy_from_slice(&inverse[e * k..(e + 1) * k]);
                } else {
                    for (col, out) in row.iter_mut().enumerate() {
                        *out = (0..k).fold(0u8, |acc, j| {
                            acc ^ self.mul(a[e * k + j], inverse[j * k + col])
                        });
                    }
                }
            }
            self.apply(k, &mut decode_rows, &inputs, &mut rebuilt);
        }
        let mut rebuilt = rebuilt.into_iter();
        shards
            .iter()
            .map(|s| match s {
                Some(bytes) => bytes.clone(),
                None => rebuilt.next().unwrap(),
            })
            .collect()
    }
}
