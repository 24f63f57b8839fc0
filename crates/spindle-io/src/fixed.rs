//! Registered ("fixed") buffers and files.
//!
//! A [`FixedBufPool`] is one aligned allocation cut into `count` buffers of `size` bytes,
//! registered with every ring of an engine (or with one [`crate::LocalRing`]) so reads and
//! writes into them (`Op::ReadFixed`/`Op::WriteFixed`) skip the per-I/O page pinning.
//!
//! Ownership invariants:
//! - The pool's memory is freed only when the last [`FixedBuf`] handle *and* every owner of
//!   the pool (the engine or ring that registered it) are gone. Rings hold the pool until
//!   they are closed, so the kernel's registration never outlives the memory of a live ring.
//! - A `FixedBuf` is the only handle to its region (its index comes from the pool's free
//!   list and returns there when the handle is dropped), so its `&mut [u8]` is exclusive.
//!   The buffer index and the address the kernel is given always belong together: handles
//!   cannot be forged.
//! - While an op runs, the op owns its `FixedBuf` (exactly like an `IoBuf`); the handle comes
//!   back in `Completion::fixed_buf`.
//!
//! Registered files: a [`FixedFile`] is an index into the file table of the engine (every
//! ring registers the same table) or ring that returned it. [`FileRef`] names the file of a
//! fixed read/write: a plain descriptor or a registered one. The thread-pool backend keeps
//! the same table and runs `pread`/`pwrite` on the original descriptor.

use std::alloc::{self, Layout};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::slab::lock;

/// Most buffers in one registered set (the kernel's limit, `IORING_MAX_REG_BUFFERS`).
pub const FIXED_BUFS_MAX: usize = 1 << 14;
/// Largest registered buffer (the kernel's limit per buffer is 1 GiB).
pub const FIXED_BUF_MAX_BYTES: usize = 1 << 30;
/// Largest registered file table.
pub const FIXED_FILES_MAX: usize = 1 << 16;

struct PoolMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the memory is a plain heap block; access to each region is arbitrated by the
// pool's free list (one `FixedBuf` per region).
unsafe impl Send for PoolMemory {}
// SAFETY: as above; shared access only hands out addresses.
unsafe impl Sync for PoolMemory {}

impl Drop for PoolMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `FixedBufPool::new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

pub(crate) struct PoolInner {
    memory: PoolMemory,
    size: usize,
    count: usize,
    free: Mutex<Vec<u16>>,
}

/// A registered buffer set (cheap to clone; all clones share the buffers).
#[derive(Clone)]
pub struct FixedBufPool {
    inner: Arc<PoolInner>,
}

impl FixedBufPool {
    /// Allocates `count` zeroed buffers of `size` bytes (rounded up to 4096: every buffer is
    /// 4096-aligned, usable with O_DIRECT). Not registered yet: see
    /// `Engine::register_buffers` / `LocalRing::register_buffers`.
    pub(crate) fn new(count: usize, size: usize) -> io::Result<FixedBufPool> {
        if count == 0 || count > FIXED_BUFS_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fixed buffer count must be 1..=FIXED_BUFS_MAX (16384)",
            ));
        }
        if size == 0 || size > FIXED_BUF_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "fixed buffer size must be 1..=1 GiB",
            ));
        }
        let size = size.div_ceil(4096) * 4096;
        let total = size.checked_mul(count).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "fixed buffer set too large")
        })?;
        let layout = Layout::from_size_align(total, 4096)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "fixed buffer layout"))?;
        // SAFETY: non-zero size (count >= 1, size >= 4096).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        };
        Ok(FixedBufPool {
            inner: Arc::new(PoolInner {
                memory: PoolMemory { ptr, layout },
                size,
                count,
                // Indexes < FIXED_BUFS_MAX fit u16.
                free: Mutex::new((0..count as u16).rev().collect()),
            }),
        })
    }

    /// The iovecs to register, in buffer-index order.
    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.inner.count)
            .map(|i| libc::iovec {
                // SAFETY: i * size < total allocation.
                iov_base: unsafe { self.inner.memory.ptr.as_ptr().add(i * self.inner.size) }.cast(),
                iov_len: self.inner.size,
            })
            .collect()
    }

    /// Takes a free buffer (its length is the full buffer size), or `None` if all are in use.
    pub fn take(&self) -> Option<FixedBuf> {
        let index = lock(&self.inner.free).pop()?;
        Some(FixedBuf {
            pool: self.inner.clone(),
            index,
            len: self.inner.size,
        })
    }

    /// Number of buffers in the set.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Size of each buffer in bytes (a multiple of 4096).
    pub fn buf_size(&self) -> usize {
        self.inner.size
    }

    /// Buffers not currently taken.
    pub fn available(&self) -> usize {
        lock(&self.inner.free).len()
    }
}

impl std::fmt::Debug for FixedBufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedBufPool")
            .field("count", &self.inner.count)
            .field("buf_size", &self.inner.size)
            .finish()
    }
}

/// One buffer of a [`FixedBufPool`]; returns to the pool when dropped.
pub struct FixedBuf {
    pool: Arc<PoolInner>,
    index: u16,
    len: usize,
}

impl FixedBuf {
    /// Index of the buffer in the registered set (what the kernel is given).
    pub fn index(&self) -> u16 {
        self.index
    }
    /// Content length (what a write sends, what a read fills up to).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the content length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The buffer's size.
    pub fn capacity(&self) -> usize {
        self.pool.size
    }
    /// Sets the content length.
    ///
    /// # Panics
    /// If `len > capacity` (a programming error).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.pool.size, "FixedBuf::set_len beyond capacity");
        self.len = len;
    }
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        // SAFETY: index < count, so the region lies inside the allocation.
        unsafe {
            self.pool
                .memory
                .ptr
                .as_ptr()
                .add(usize::from(self.index) * self.pool.size)
        }
    }
}

impl Deref for FixedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the region is initialised (zeroed) memory of `size >= len` bytes that only
        // this handle refers to (module invariants).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl DerefMut for FixedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        lock(&self.pool.free).push(self.index);
    }
}

impl std::fmt::Debug for FixedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedBuf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

/// A registered file: an index into the file table of the engine or ring that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedFile(pub(crate) u32);

impl FixedFile {
    /// Index in the registered file table.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// The file of a fixed read/write: a plain descriptor or a registered one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRef {
    Fd(RawFd),
    Fixed(FixedFile),
}

impl From<RawFd> for FileRef {
    fn from(fd: RawFd) -> FileRef {
        FileRef::Fd(fd)
    }
}

impl From<FixedFile> for FileRef {
    fn from(file: FixedFile) -> FileRef {
        FileRef::Fixed(file)
    }
}

/// The descriptors behind registered file indexes (`-1`: free). Every ring of an engine
/// registers the same table; the thread pool reads it to find the original descriptor.
pub(crate) struct FileTable {
    pub(crate) fds: Mutex<Vec<RawFd>>,
}

impl FileTable {
    pub(crate) fn new(size: usize) -> FileTable {
        FileTable {
            fds: Mutex::new(vec![-1; size]),
        }
    }

    /// Reserves table entries for `fds`; returns the first index (entries are contiguous).
    pub(crate) fn reserve(&self, fds: &[RawFd]) -> io::Result<u32> {
        let mut table = lock(&self.fds);
        let n = fds.len();
        if n == 0 || n > table.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "file count must be 1..=the file table size (Config::fixed_files)",
            ));
        }
        let mut start = 0;
        while start + n <= table.len() {
            match table[start..start + n].iter().position(|&fd| fd != -1) {
                None => {
                    table[start..start + n].copy_from_slice(fds);
                    return Ok(start as u32);
                }
                Some(used) => start += used + 1,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::OutOfMemory,
            "registered file table full (Config::fixed_files)",
        ))
    }

    pub(crate) fn release(&self, start: u32, n: usize) {
        let mut table = lock(&self.fds);
        for fd in table.iter_mut().skip(start as usize).take(n) {
            *fd = -1;
        }
    }

    /// The raw descriptor of `file` (for the thread pool).
    pub(crate) fn resolve(&self, file: FileRef) -> RawFd {
        match file {
            FileRef::Fd(fd) => fd,
            FileRef::Fixed(FixedFile(i)) => lock(&self.fds).get(i as usize).copied().unwrap_or(-1),
        }
    }
}
