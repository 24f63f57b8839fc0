//! The portable reference kernel: one byte at a time through the split-nibble tables.

use super::DotProduct;

/// Scalar dot product over bytes `offset..offset + len` of every buffer.
///
/// # Safety
/// The pointer contract of [`DotProduct::new`] must hold.
pub(crate) unsafe fn dot_product_range(job: &DotProduct<'_>, offset: usize, len: usize) {
    assert!(offset.checked_add(len).is_some_and(|end| end <= job.len));
    let k = job.sources();
    for (r, &dst) in job.dst.iter().enumerate() {
        // SAFETY: `dst` is writable for `job.len` bytes and overlaps no source (contract).
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(offset), len) };
        out.fill(0);
        for (j, &src) in job.src.iter().enumerate() {
            let table = &job.tables[r * k + j];
            let (low, high) = (&table[..16], &table[32..48]);
            // SAFETY: `src` is readable for `job.len` bytes (contract).
            let input = unsafe { std::slice::from_raw_parts(src.add(offset), len) };
            for (o, &x) in out.iter_mut().zip(input) {
                *o ^= low[(x & 15) as usize] ^ high[(x >> 4) as usize];
            }
        }
    }
}

/// Scalar dot product over the whole job.
///
/// # Safety
/// The pointer contract of [`DotProduct::new`] must hold.
pub(crate) unsafe fn dot_product(job: &DotProduct<'_>) {
    // SAFETY: forwarded contract; the whole range is in bounds.
    unsafe { dot_product_range(job, 0, job.len) }
}
