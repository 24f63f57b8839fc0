//! aarch64 NEON split-nibble kernel: the 128-bit twin of the x86 SSSE3 kernel with `tbl`
//! (`vqtbl1q_u8`) in place of `pshufb`. One destination row per pass, two 16-byte vectors per
//! step, overlapping last step, scalar code below 16 bytes.
//!
//! Not executed on the development machine (x86_64 only, no aarch64 toolchain installed):
//! it is kept deliberately small, uses only baseline NEON intrinsics, and is selected only on
//! aarch64 builds. The property tests compare it with the scalar kernel when run there.

use std::arch::aarch64::*;

use super::{scalar, DotProduct};

/// NEON dot product of a whole job.
///
/// # Safety
/// The pointer contract of [`DotProduct::new`] must hold (NEON is baseline on aarch64).
pub(crate) unsafe fn dot_product_neon(job: &DotProduct<'_>) {
    for r in 0..job.dst.len() {
        let row = job.rows(r, 1);
        // SAFETY: `row` is a one-row subset of `job`; the length checks pick the kernel
        // whose precondition holds.
        unsafe {
            if job.len >= 32 {
                neon_row(&row);
            } else {
                scalar::dot_product_range(&row, 0, job.len);
            }
        }
    }
}

/// # Safety
/// Pointer contract of [`DotProduct::new`], `job.dst.len() == 1`, `job.len >= 32`.
unsafe fn neon_row(job: &DotProduct<'_>) {
    const STEP: usize = 32;
    assert!(job.dst.len() == 1 && job.len >= STEP);
    let dst = job.dst[0];
    let last = job.len - STEP;
    let mut pos = 0;
    // SAFETY: every load reads `pos..pos + 32 <= job.len` of a source, every store writes the
    // same range of the destination, and every table is 64 bytes (contract of the caller).
    unsafe {
        let mask = vdupq_n_u8(0x0f);
        loop {
            let mut acc0 = vdupq_n_u8(0);
            let mut acc1 = vdupq_n_u8(0);
            for (j, &src) in job.src.iter().enumerate() {
                let table = job.tables[j].as_ptr();
                let table_low = vld1q_u8(table);
                let table_high = vld1q_u8(table.add(32));
                let data0 = vld1q_u8(src.add(pos));
                let data1 = vld1q_u8(src.add(pos + 16));
                acc0 = veorq_u8(acc0, vqtbl1q_u8(table_low, vandq_u8(data0, mask)));
                acc0 = veorq_u8(acc0, vqtbl1q_u8(table_high, vshrq_n_u8::<4>(data0)));
                acc1 = veorq_u8(acc1, vqtbl1q_u8(table_low, vandq_u8(data1, mask)));
                acc1 = veorq_u8(acc1, vqtbl1q_u8(table_high, vshrq_n_u8::<4>(data1)));
            }
            vst1q_u8(dst.add(pos), acc0);
            vst1q_u8(dst.add(pos + 16), acc1);
            if pos == last {
                break;
            }
            pos = (pos + STEP).min(last);
        }
    }
}
