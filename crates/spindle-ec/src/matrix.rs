//! Dense matrices over GF(2^8) and the coding matrices of ISA-L and Jerasure.
//!
//! A systematic code of k data and m parity chunks uses the (k+m) x k *encode matrix*
//! `[I_k ; C]`, where the m x k *coding matrix* `C` gives `parity[r] = sum_j C[r][j] * data[j]`.
//! The three generators reproduce, element for element, the matrices of
//! - ISA-L `gf_gen_rs_matrix` (`C[r][j] = 2^(r*j)`),
//! - ISA-L `gf_gen_cauchy1_matrix` (`C[r][j] = 1 / ((k + r) xor j)`),
//! - Jerasure `reed_sol_vandermonde_coding_matrix` with w = 8 (an extended Vandermonde matrix
//!   made systematic, then normalised so that the first parity row and the first column of
//!   the coding matrix are all ones).

use crate::{gf, EcError};

/// A row-major matrix over GF(2^8). Invariant: `elements.len() == rows * cols`.
#[derive(Clone, PartialEq, Eq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    elements: Vec<u8>,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Matrix {}x{} [", self.rows, self.cols)?;
        for r in 0..self.rows {
            writeln!(f, "  {:?}", self.row(r))?;
        }
        write!(f, "]")
    }
}

impl Matrix {
    /// The all-zero matrix.
    pub fn zero(rows: usize, cols: usize) -> Matrix {
        Matrix {
            rows,
            cols,
            elements: vec![0; rows * cols],
        }
    }

    /// The identity matrix of size n.
    pub fn identity(n: usize) -> Matrix {
        let mut m = Matrix::zero(n, n);
        for i in 0..n {
            m.set(i, i, 1);
        }
        m
    }

    /// Builds a matrix from its rows; `None` if the rows have different lengths.
    pub fn from_rows(rows: &[Vec<u8>]) -> Option<Matrix> {
        let cols = rows.first().map_or(0, Vec::len);
        if rows.iter().any(|r| r.len() != cols) {
            return None;
        }
        Some(Matrix {
            rows: rows.len(),
            cols,
            elements: rows.concat(),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    #[inline]
    pub fn get(&self, row: usize, col: usize) -> u8 {
        assert!(row < self.rows && col < self.cols);
        self.elements[row * self.cols + col]
    }

    #[inline]
    pub fn set(&mut self, row: usize, col: usize, value: u8) {
        assert!(row < self.rows && col < self.cols);
        self.elements[row * self.cols + col] = value;
    }

    /// One row as a slice.
    pub fn row(&self, row: usize) -> &[u8] {
        assert!(row < self.rows);
        &self.elements[row * self.cols..(row + 1) * self.cols]
    }

    fn row_mut(&mut self, row: usize) -> &mut [u8] {
        assert!(row < self.rows);
        &mut self.elements[row * self.cols..(row + 1) * self.cols]
    }

    /// All rows as a `Vec` of `Vec`s (for display and serialisation).
    pub fn to_rows(&self) -> Vec<Vec<u8>> {
        (0..self.rows).map(|r| self.row(r).to_vec()).collect()
    }

    /// The matrix made of the given rows of `self`, in the given order.
    pub fn select_rows(&self, rows: &[usize]) -> Matrix {
        let mut out = Matrix::zero(rows.len(), self.cols);
        for (i, &r) in rows.iter().enumerate() {
            out.row_mut(i).copy_from_slice(self.row(r));
        }
        out
    }

    /// Matrix product `self * rhs`; `None` if the shapes do not match.
    pub fn mul(&self, rhs: &Matrix) -> Option<Matrix> {
        if self.cols != rhs.rows {
            return None;
        }
        let mut out = Matrix::zero(self.rows, rhs.cols);
        for r in 0..self.rows {
            for i in 0..self.cols {
                let a = self.get(r, i);
                if a == 0 {
                    continue;
                }
                for c in 0..rhs.cols {
                    let v = out.get(r, c) ^ gf::mul(a, rhs.get(i, c));
                    out.set(r, c, v);
                }
            }
        }
        Some(out)
    }

    /// Inverse by Gauss-Jordan elimination with row pivoting.
    pub fn invert(&self) -> Result<Matrix, EcError> {
        if self.rows != self.cols {
            return Err(EcError::NotSquare {
                rows: self.rows,
                cols: self.cols,
            });
        }
        let n = self.rows;
        let mut work = self.clone();
        let mut inverse = Matrix::identity(n);
        for col in 0..n {
            let pivot_row = (col..n)
                .find(|&r| work.get(r, col) != 0)
                .ok_or(EcError::SingularMatrix)?;
            if pivot_row != col {
                work.swap_rows(pivot_row, col);
                inverse.swap_rows(pivot_row, col);
            }
            let scale = gf::inv(work.get(col, col));
            work.scale_row(col, scale);
            inverse.scale_row(col, scale);
            for r in 0..n {
                let factor = work.get(r, col);
                if r != col && factor != 0 {
                    work.add_scaled_row(r, col, factor);
                    inverse.add_scaled_row(r, col, factor);
                }
            }
        }
        debug_assert_eq!(work, Matrix::identity(n));
        Ok(inverse)
    }

    fn swap_rows(&mut self, a: usize, b: usize) {
        for c in 0..self.cols {
            self.elements.swap(a * self.cols + c, b * self.cols + c);
        }
    }

    fn scale_row(&mut self, row: usize, factor: u8) {
        for v in self.row_mut(row) {
            *v = gf::mul(*v, factor);
        }
    }

    /// `row[target] += factor * row[source]`.
    fn add_scaled_row(&mut self, target: usize, source: usize, factor: u8) {
        for c in 0..self.cols {
            let v = self.get(target, c) ^ gf::mul(factor, self.get(source, c));
            self.set(target, c, v);
        }
    }
}

/// Which published coding matrix a code uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatrixKind {
    /// ISA-L `gf_gen_rs_matrix` (Ceph `plugin=isa technique=reed_sol_van`). Not MDS for every
    /// k and m: some erasure patterns of large codes cannot be decoded (reported as
    /// [`EcError::SingularMatrix`]); every pattern of the codes tested here decodes.
    IsalRs,
    /// ISA-L `gf_gen_cauchy1_matrix` (Ceph `plugin=isa technique=cauchy`). MDS; the default.
    IsalCauchy,
    /// Jerasure `reed_sol_vandermonde_coding_matrix(k, m, 8)` (Ceph's default
    /// `plugin=jerasure technique=reed_sol_van`). MDS.
    JerasureVandermonde,
}

impl MatrixKind {
    /// Every kind, for tests and command-line help.
    pub const ALL: [MatrixKind; 3] = [
        MatrixKind::IsalRs,
        MatrixKind::IsalCauchy,
        MatrixKind::JerasureVandermonde,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MatrixKind::IsalRs => "isal-rs",
            MatrixKind::IsalCauchy => "isal-cauchy",
            MatrixKind::JerasureVandermonde => "jerasure-van",
        }
    }
}

/// Checks k and m against the crate's limits.
pub(crate) fn check_shape(data_chunks: usize, parity_chunks: usize) -> Result<(), EcError> {
    if data_chunks == 0 {
        return Err(EcError::NoDataChunks);
    }
    if parity_chunks == 0 {
        return Err(EcError::NoParityChunks);
    }
    match data_chunks.checked_add(parity_chunks) {
        Some(total) if total <= crate::MAX_TOTAL_CHUNKS => Ok(()),
        _ => Err(EcError::TooManyChunks {
            data_chunks,
            parity_chunks,
        }),
    }
}

/// The m x k coding matrix of the given kind (the parity rows of the encode matrix).
pub fn coding_matrix(
    kind: MatrixKind,
    data_chunks: usize,
    parity_chunks: usize,
) -> Result<Matrix, EcError> {
    check_shape(data_chunks, parity_chunks)?;
    let (k, m) = (data_chunks, parity_chunks);
    match kind {
        MatrixKind::IsalRs => {
            let mut c = Matrix::zero(m, k);
            for r in 0..m {
                let generator = gf::pow(2, r);
                for j in 0..k {
                    c.set(r, j, gf::pow(generator, j));
                }
            }
            Ok(c)
        }
        MatrixKind::IsalCauchy => {
            let mut c = Matrix::zero(m, k);
            for r in 0..m {
                for j in 0..k {
                    // (k + r) != j because j < k, so the xor is never 0; k+r < 64 fits a byte.
                    let x = ((k + r) ^ j) as u8;
                    assert!(x != 0);
                    c.set(r, j, gf::inv(x));
                }
            }
            Ok(c)
        }
        MatrixKind::JerasureVandermonde => jerasure_vandermonde(k, m),
    }
}

/// Jerasure's construction: the (k+m) x k extended Vandermonde matrix (first row `e_0`, last
/// row `e_{k-1}`, row i in between `[1, i, i^2, ..]`) is multiplied on the right by the inverse
/// of its top k x k block (the column operations that make the top the identity), then each
/// column of the parity part is divided by its entry in the first parity row, then each later
/// parity row is divided by its first entry.
fn jerasure_vandermonde(k: usize, m: usize) -> Result<Matrix, EcError> {
    let rows = k + m;
    let mut vandermonde = Matrix::zero(rows, k);
    vandermonde.set(0, 0, 1);
    vandermonde.set(rows - 1, k - 1, 1);
    for i in 1..rows - 1 {
        for j in 0..k {
            // i < 64 fits a byte.
            vandermonde.set(i, j, gf::pow(i as u8, j));
        }
    }
    let top: Vec<usize> = (0..k).collect();
    let bottom: Vec<usize> = (k..rows).collect();
    let top_inverse = vandermonde.select_rows(&top).invert()?;
    let mut coding = vandermonde
        .select_rows(&bottom)
        .mul(&top_inverse)
        .ok_or(EcError::SingularMatrix)?;
    for j in 0..k {
        let first = coding.get(0, j);
        if first == 0 {
            return Err(EcError::SingularMatrix);
        }
        let scale = gf::inv(first);
        for r in 0..m {
            coding.set(r, j, gf::mul(coding.get(r, j), scale));
        }
    }
    for r in 1..m {
        let first = coding.get(r, 0);
        if first == 0 {
            return Err(EcError::SingularMatrix);
        }
        coding.scale_row(r, gf::inv(first));
    }
    Ok(coding)
}

/// The (k+m) x k encode matrix `[I_k ; C]`.
pub fn encode_matrix(
    kind: MatrixKind,
    data_chunks: usize,
    parity_chunks: usize,
) -> Result<Matrix, EcError> {
    let coding = coding_matrix(kind, data_chunks, parity_chunks)?;
    let mut full = Matrix::zero(data_chunks + parity_chunks, data_chunks);
    for i in 0..data_chunks {
        full.set(i, i, 1);
    }
    for r in 0..parity_chunks {
        full.row_mut(data_chunks + r).copy_from_slice(coding.row(r));
    }
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_matrix_is_identity() {
        let full = encode_matrix(MatrixKind::IsalCauchy, 6, 3).unwrap();
        let rows = [1usize, 2, 4, 6, 7, 8];
        let sub = full.select_rows(&rows);
        let inverse = sub.invert().unwrap();
        assert_eq!(sub.mul(&inverse).unwrap(), Matrix::identity(6));
        assert_eq!(inverse.mul(&sub).unwrap(), Matrix::identity(6));
    }

    #[test]
    fn singular_matrix_is_an_error() {
        let m = Matrix::from_rows(&[vec![1, 2], vec![1, 2]]).unwrap();
        assert_eq!(m.invert(), Err(EcError::SingularMatrix));
        let not_square = Matrix::zero(2, 3);
        assert!(matches!(
            not_square.invert(),
            Err(EcError::NotSquare { .. })
        ));
    }

    #[test]
    fn known_small_matrices() {
        let rs = coding_matrix(MatrixKind::IsalRs, 4, 2).unwrap();
        assert_eq!(rs.to_rows(), vec![vec![1, 1, 1, 1], vec![1, 2, 4, 8]]);
        let cauchy = coding_matrix(MatrixKind::IsalCauchy, 4, 2).unwrap();
        assert_eq!(
            cauchy.to_rows(),
            vec![vec![71, 167, 122, 186], vec![167, 71, 186, 122]]
        );
        let jer = coding_matrix(MatrixKind::JerasureVandermonde, 4, 2).unwrap();
        assert_eq!(jer.to_rows(), vec![vec![1, 1, 1, 1], vec![1, 70, 143, 200]]);
    }

    #[test]
    fn shape_limits() {
        assert_eq!(
            coding_matrix(MatrixKind::IsalRs, 0, 2),
            Err(EcError::NoDataChunks)
        );
        assert_eq!(
            coding_matrix(MatrixKind::IsalRs, 2, 0),
            Err(EcError::NoParityChunks)
        );
        assert!(coding_matrix(MatrixKind::IsalCauchy, 60, 4).is_ok());
        assert!(matches!(
            coding_matrix(MatrixKind::IsalCauchy, 60, 5),
            Err(EcError::TooManyChunks { .. })
        ));
        assert!(matches!(
            coding_matrix(MatrixKind::IsalCauchy, usize::MAX, 5),
            Err(EcError::TooManyChunks { .. })
        ));
        for kind in MatrixKind::ALL {
            assert!(coding_matrix(kind, 1, 63).is_ok(), "{kind:?}");
            assert!(coding_matrix(kind, 63, 1).is_ok(), "{kind:?}");
        }
    }
}
