//! `IoBuf`: an owned byte buffer that the engine can hand to the kernel.
//!
//! Invariants:
//! - The memory behind an `IoBuf` never moves while the value exists (it is a heap block;
//!   moving the `IoBuf` value moves only the pointer), so the engine can give its address
//!   to the kernel and move the `IoBuf` into the request slab.
//! - `len <= capacity`; the bytes `0..capacity` are always initialised (zeroed at
//!   allocation), so the kernel may write anywhere in `0..capacity`.
//! - An aligned buffer's address and capacity are multiples of its alignment (O_DIRECT).
//! - A *shared* buffer ([`IoBuf::shared`]) is a read-only view of an `Arc<Vec<u8>>` that
//!   others read too (e.g. a network send of the same bytes): only write operations may
//!   use it (`Engine::submit` refuses reads into it) and `DerefMut` on it is a bug.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Who owns the memory behind an [`IoBuf`].
enum Owner {
    /// Allocated here with this layout.
    Aligned(Layout),
    /// Adopted from a `Vec<u8>` (pointer, length, capacity).
    Vec,
    /// Borrowed from a shared vector, kept alive by this reference.
    Shared(Arc<Vec<u8>>),
}

/// An owned, heap-allocated, optionally aligned byte buffer.
pub struct IoBuf {
    ptr: NonNull<u8>,
    /// Bytes that count as content (what a write sends, what a read fills up to).
    len: usize,
    /// Allocated bytes; `layout.size()` unless the buffer came from a `Vec`.
    capacity: usize,
    owner: Owner,
}

// SAFETY: `IoBuf` owns its heap block exclusively (like `Vec<u8>`); no shared state.
unsafe impl Send for IoBuf {}
// SAFETY: shared references only give `&[u8]`.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zeroed buffer of `len` bytes whose address and capacity are multiples of `align`
    /// (a power of two; 4096 suits O_DIRECT on every common device).
    ///
    /// # Panics
    /// If `align` is not a power of two or the size overflows (programming errors).
    pub fn aligned(len: usize, align: usize) -> IoBuf {
        assert!(
            align.is_power_of_two(),
            "IoBuf alignment must be a power of two"
        );
        let capacity = len.div_ceil(align).max(1) * align;
        let layout = match Layout::from_size_align(capacity, align) {
            Ok(layout) => layout,
            Err(_) => panic!("IoBuf layout overflow: {capacity} bytes, align {align}"),
        };
        // SAFETY: the layout has non-zero size (capacity >= align >= 1).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        IoBuf {
            ptr,
            len,
            capacity,
            owner: Owner::Aligned(layout),
        }
    }

    /// An aligned buffer of `len` bytes (`len >= data.len()`) holding `data` followed by
    /// zeros: like [`IoBuf::aligned`] plus a copy, but the memory is written once (no
    /// zeroing pass over what the copy overwrites). For O_DIRECT writes of caller data.
    ///
    /// # Panics
    /// If `len < data.len()`, `align` is not a power of two or the size overflows.
    pub fn aligned_copy(data: &[u8], len: usize, align: usize) -> IoBuf {
        Self::aligned_copy_inspect(data, len, align, usize::MAX, |_| {})
    }

    /// [`IoBuf::aligned_copy`] that hands each copied piece of `chunk` bytes (the last may
    /// be shorter) to `inspect` right after copying it, while it is still in cache: e.g.
    /// per-block checksums in the same pass over memory as the copy.
    ///
    /// # Panics
    /// As [`IoBuf::aligned_copy`], or if `chunk` is 0.
    pub fn aligned_copy_inspect(
        data: &[u8],
        len: usize,
        align: usize,
        chunk: usize,
        mut inspect: impl FnMut(&[u8]),
    ) -> IoBuf {
        assert!(chunk > 0, "IoBuf::aligned_copy_inspect: chunk must be > 0");
        assert!(len >= data.len(), "IoBuf::aligned_copy: len below the data");
        assert!(
            align.is_power_of_two(),
            "IoBuf alignment must be a power of two"
        );
        let capacity = len.div_ceil(align).max(1) * align;
        let layout = match Layout::from_size_align(capacity, align) {
            Ok(layout) => layout,
            Err(_) => panic!("IoBuf layout overflow: {capacity} bytes, align {align}"),
        };
        // SAFETY: the layout has non-zero size (capacity >= align >= 1).
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let mut done = 0;
        while done < data.len() {
            let n = chunk.min(data.len() - done);
            // SAFETY: `raw` is valid for `capacity >= len >= data.len()` bytes and does not
            // overlap `data`; bytes `done..done + n` are written before they are viewed.
            let piece = unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr().add(done), raw.add(done), n);
                std::slice::from_raw_parts(raw.add(done), n)
            };
            inspect(piece);
            done += n;
        }
        // SAFETY: as above; the tail up to `capacity` is zeroed, so every byte is initialized.
        unsafe { std::ptr::write_bytes(raw.add(data.len()), 0, capacity - data.len()) };
        IoBuf {
            ptr,
            len,
            capacity,
            owner: Owner::Aligned(layout),
        }
    }

    /// A zeroed, unaligned buffer of `len` bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        IoBuf::from(vec![0u8; len])
    }

    /// Content length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the content length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated bytes (at least `len`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the content length (the bytes stay as they are: always initialised).
    ///
    /// # Panics
    /// If `len > capacity`.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "IoBuf::set_len beyond capacity");
        self.len = len;
    }

    /// A read-only buffer over `data`, which others may read at the same time: for write
    /// operations only (no copy). Its content is all of `data`.
    pub fn shared(data: Arc<Vec<u8>>) -> IoBuf {
        let len = data.len();
        // The kernel only reads through this pointer (reads into shared buffers are
        // refused at submission).
        let ptr = NonNull::new(data.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        IoBuf {
            ptr,
            len,
            capacity: len,
            owner: Owner::Shared(data),
        }
    }

    /// True for [`IoBuf::shared`] buffers (read-only).
    pub fn is_shared(&self) -> bool {
        matches!(self.owner, Owner::Shared(_))
    }

    /// Start address, for the kernel (only written through for buffers that are not
    /// shared; see `validate` in `exec.rs`).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start address, for the kernel (write direction).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Copies the content into a `Vec<u8>` (or takes the `Vec` back without copying when the
    /// buffer was made from one).
    pub fn into_vec(self) -> Vec<u8> {
        match &self.owner {
            Owner::Aligned(_) => self.deref().to_vec(),
            Owner::Shared(shared) => shared.to_vec(),
            Owner::Vec => {
                let me = std::mem::ManuallyDrop::new(self);
                // SAFETY: the pointer, length and capacity came from a `Vec<u8>` in `From`, and
                // `me` is never dropped, so ownership moves to the new `Vec` exactly once.
                unsafe { Vec::from_raw_parts(me.ptr.as_ptr(), me.len, me.capacity) }
            }
        }
    }
}

impl From<Vec<u8>> for IoBuf {
    fn from(vec: Vec<u8>) -> IoBuf {
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let len = vec.len();
        // Make every byte of the capacity initialised (the kernel may fill up to capacity).
        let spare = vec.spare_capacity_mut();
        for byte in spare {
            byte.write(0);
        }
        let capacity = vec.capacity();
        let ptr = NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling());
        IoBuf {
            ptr,
            len,
            capacity,
            owner: Owner::Vec,
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.owner {
            // SAFETY: allocated in `aligned` with exactly this layout.
            Owner::Aligned(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), *layout) },
            // The `Arc` (dropped with `self`) keeps or frees the memory.
            Owner::Shared(_) => {}
            // SAFETY: pointer/len/capacity came from a `Vec<u8>` (see `From`).
            Owner::Vec => unsafe {
                drop(Vec::from_raw_parts(
                    self.ptr.as_ptr(),
                    self.len,
                    self.capacity,
                ));
            },
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `capacity >= len` initialised bytes (module invariants).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    /// # Panics
    /// On a shared buffer (a programming error: others read it).
    fn deref_mut(&mut self) -> &mut [u8] {
        assert!(
            !self.is_shared(),
            "IoBuf: mutable access to a shared buffer"
        );
        // SAFETY: as in `deref`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field(
                "aligned",
                &match &self.owner {
                    Owner::Aligned(l) => Some(l.align()),
                    Owner::Vec | Owner::Shared(_) => None,
                },
            )
            .field("shared", &self.is_shared())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned_and_zeroed() {
        let buf = IoBuf::aligned(5000, 4096);
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        assert_eq!(buf.capacity(), 8192);
        assert_eq!(buf.len(), 5000);
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn vec_round_trip_keeps_bytes() {
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(b"hello");
        let mut buf = IoBuf::from(v);
        assert_eq!(&buf[..], b"hello");
        buf.set_len(7);
        assert_eq!(&buf[..], b"hello\0\0");
        assert_eq!(buf.into_vec(), b"hello\0\0".to_vec());
        assert_eq!(IoBuf::aligned(3, 512).into_vec(), vec![0, 0, 0]);
        assert!(IoBuf::from(Vec::new()).is_empty());
    }
}

#[cfg(test)]
mod copy_tests {
    use super::IoBuf;

    #[test]
    fn aligned_copy_inspect_copies_pads_and_shows_every_chunk() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut seen = Vec::new();
        let buf =
            IoBuf::aligned_copy_inspect(&data, 12_288, 4096, 4096, |c| seen.extend_from_slice(c));
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        assert_eq!(buf.len(), 12_288);
        assert_eq!(&buf[..10_000], &data[..]);
        assert!(buf[10_000..].iter().all(|&b| b == 0));
        assert_eq!(seen, data);
        let plain = IoBuf::aligned_copy(&data, 10_000, 512);
        assert_eq!(&plain[..], &data[..]);
    }
}
