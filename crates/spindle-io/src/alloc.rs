//! `PageAlignedLarge`: a global allocator that places every large heap block on a page
//! boundary, so that large `Vec<u8>`s (network receive buffers, object payloads) can be
//! handed to O_DIRECT writes as they are, without an aligned copy.
//!
//! Invariants:
//! - The alignment used for a block is a pure function of its `Layout` (size and
//!   requested alignment), so `dealloc` and `realloc` always see the alignment the block
//!   was allocated with (Rust hands them the same layout `alloc` got).
//! - Blocks below [`LARGE_BYTES_MIN`] are allocated exactly as the system allocator would.
//!
//! The blocks come from mimalloc (`mimalloc` crate): against glibc's malloc, a storage
//! daemon's CPU per 4 KiB random write fell 10-22% in A/B runs (docs/benchmarks.md,
//! 2026-11-27), most of glibc's cost being consolidation and bin bookkeeping for the
//! many short-lived 4 KiB buffers. Free memory goes back to the system with
//! [`release_free_memory`], which the `spindle` binary installs as its heap release.
//!
//! Nothing relies on the alignment for correctness: code that wants an aligned buffer
//! checks the address and falls back to copying (tests and other binaries run on the
//! default allocator).

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc as Inner;

/// Blocks of at least this many bytes are page aligned: whole objects (4 MiB by default).
/// Not lower: 512 KiB read buffers gained nothing from it and measured as slow or slower
/// with it (docs/nbd.md, session 6).
pub const LARGE_BYTES_MIN: usize = 1 << 20;
/// Alignment of large blocks (the page size; what O_DIRECT needs on every common device).
pub const LARGE_ALIGN: usize = 4096;

/// See the module documentation. Register with
/// `#[global_allocator] static A: PageAlignedLarge = PageAlignedLarge;`.
pub struct PageAlignedLarge;

fn adjust(layout: Layout) -> Layout {
    if layout.size() >= LARGE_BYTES_MIN && layout.align() < LARGE_ALIGN {
        // Cannot fail: the size is unchanged and LARGE_ALIGN is a power of two; a size
        // this close to isize::MAX would have failed to allocate anyway.
        Layout::from_size_align(layout.size(), LARGE_ALIGN).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every method forwards to mimalloc with `adjust(layout)`, and a block is always
// released with the same adjusted layout it was allocated with (see the invariants).
unsafe impl GlobalAlloc for PageAlignedLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller guarantees a non-zero size; adjusting keeps the size.
        unsafe { Inner.alloc(adjust(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { Inner.alloc_zeroed(adjust(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` here with this layout, hence with
        // `adjust(layout)` at the system allocator.
        unsafe { Inner.dealloc(ptr, adjust(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = adjust(layout);
        let new = match Layout::from_size_align(new_size, layout.align()) {
            Ok(l) => adjust(l),
            Err(_) => return std::ptr::null_mut(),
        };
        if old.align() == new.align() {
            // SAFETY: `ptr` was allocated with `old`; the alignment does not change.
            return unsafe { Inner.realloc(ptr, old, new_size) };
        }
        // The block crosses the threshold: move it by hand.
        // SAFETY: `new` has a non-zero size (new_size > 0 per the GlobalAlloc contract).
        let fresh = unsafe { Inner.alloc(new) };
        if !fresh.is_null() {
            // SAFETY: both blocks are valid for the smaller size and do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                Inner.dealloc(ptr, old);
            }
        }
        fresh
    }
}

/// Returns this allocator's free memory to the system (for a binary using
/// [`PageAlignedLarge`]; its heap release, see `spindle_serve::heap`, also trims glibc's
/// heap, which C code may use).
pub fn release_free_memory() {
    // SAFETY: mi_collect takes no pointers; it frees unused pages of the calling thread's
    // heap and (forced) abandoned and retired segments.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_page_aligned_and_small_ones_are_untouched() {
        let a = PageAlignedLarge;
        for size in [LARGE_BYTES_MIN, 4 << 20, (1 << 20) + 17] {
            let l = Layout::from_size_align(size, 1).unwrap();
            // SAFETY: non-zero size; freed below with the same layout.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % LARGE_ALIGN, 0, "size {size}");
                p.write_bytes(7, size);
                a.dealloc(p, l);
            }
        }
        assert_eq!(adjust(Layout::from_size_align(100, 1).unwrap()).align(), 1);
        assert_eq!(
            adjust(Layout::from_size_align(LARGE_BYTES_MIN - 1, 8).unwrap()).align(),
            8
        );
    }

    #[test]
    fn realloc_across_the_threshold_keeps_the_bytes() {
        let a = PageAlignedLarge;
        let small = Layout::from_size_align(1000, 1).unwrap();
        // SAFETY: each pointer is used with the layout it currently has.
        unsafe {
            let p = a.alloc(small);
            for i in 0..1000 {
                *p.add(i) = i as u8;
            }
            let big = 3 * LARGE_BYTES_MIN;
            let q = a.realloc(p, small, big);
            assert_eq!(q as usize % LARGE_ALIGN, 0);
            for i in 0..1000 {
                assert_eq!(*q.add(i), i as u8);
            }
            let big_layout = Layout::from_size_align(big, 1).unwrap();
            let r = a.realloc(q, big_layout, 500);
            for i in 0..500 {
                assert_eq!(*r.add(i), i as u8);
            }
            a.dealloc(r, Layout::from_size_align(500, 1).unwrap());
        }
    }
}
