//! The seam between the store and the disk: every file-system operation of the store goes
//! through a [`Disk`] (and the [`DiskFile`]s it opens), so that the same store runs over
//! the real file system ([`RealDisk`]) or over a deterministic simulated disk
//! ([`crate::SimDisk`]) that tears writes, loses unsynced data and injects errors.
//!
//! Durability contract (what every implementation must give, and what the store may
//! assume; [`crate::SimDisk`] gives exactly this and no more):
//! - A write returns when its bytes are visible to later reads. It is durable (survives a
//!   crash) only after a successful `sync_data` / `sync_all` of that file, or when it
//!   returned successfully on a file opened with [`OpenHow::Journal`],
//!   [`OpenHow::DirectNew`] or [`OpenHow::DirectExisting`] (O_DSYNC).
//!   An unsynced write may survive a crash in part: any subset of its sectors.
//! - A failed sync (or failed O_DSYNC write) may have dropped the unsynced data of that
//!   file for good, even though reads still return it (Linux marks the pages clean): the
//!   caller must not acknowledge anything that depended on it.
//! - Names (create, rename, unlink) are durable only after `sync_dir` of the directory
//!   holding them; until then a crash may undo any suffix of them (per directory).
//! - A file's length follows the same rule as its bytes (durable after a sync).
//!
//! Hot path cost: a [`DiskFile`] is an `Arc<dyn DiskFile>` opened once and cached by the
//! store (`fdcache.rs`); each I/O is one virtual call next to a system call, and no call
//! allocates on the heap beyond what the store already did. The io_uring paths (parallel
//! direct writes, checkpoint syncs, reads that miss the page cache) are batch methods of
//! [`Disk`] that [`RealDisk`] implements with the `spindle-io` engine, unchanged.

use std::ffi::OsString;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use spindle_io::{Engine, IoBuf, Op};

/// An open file of a [`Disk`].
pub type FileRef = Arc<dyn DiskFile>;

/// How [`Disk::open`] opens a file. Each variant fixes access mode, creation and the
/// caching / durability flags the store used before the seam existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenHow {
    /// Read-write through the page cache (data files, the space reserve); created if
    /// `create` (never truncated).
    Data { create: bool },
    /// Read-only through the page cache.
    Read,
    /// The journal: read-write, created if missing, O_DSYNC (every completed write is
    /// durable) and O_DIRECT where the file system allows it.
    Journal,
    /// A new file for a large direct write: write-only, created and truncated, O_DSYNC
    /// (a completed write is durable, its length included; the name only after `sync_dir`),
    /// O_DIRECT where allowed unless `cached` (then through the page cache, so reads soon
    /// after find it there).
    DirectNew { cached: bool },
    /// An existing file overwritten in place by a direct write: write-only, O_DSYNC,
    /// O_DIRECT where allowed unless `cached`; fails with NotFound if missing.
    DirectExisting { cached: bool },
    /// Read-only with O_DIRECT; fails with `EINVAL` where the file system refuses it.
    DirectRead,
}

/// Size and free space of a disk, as `df` counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskSpace {
    /// Used plus available bytes (root-reserved blocks excluded).
    pub total_bytes: u64,
    /// Bytes an unprivileged writer can still allocate.
    pub avail_bytes: u64,
}

/// One open file. Offsets and lengths in bytes.
pub trait DiskFile: Send + Sync + Debug {
    /// Reads into `buf` at `offset`; returns the bytes read, fewer than `buf.len()` only
    /// at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `data` at `offset` (extending the file if needed). Durable on return
    /// only for [`OpenHow::Journal`] files; otherwise after `sync_data`.
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Current length (what reads see, durable or not).
    fn len_bytes(&self) -> io::Result<u64>;
    /// Sets the length (holes read as zeros). Durable after `sync_data`.
    fn set_len(&self, len_bytes: u64) -> io::Result<()>;
    /// Allocates `[offset, offset + len)` so later writes there cannot fail for lack of
    /// space (`fallocate`; `keep_size`: the length does not change). `Ok` without effect
    /// where the file system cannot allocate ahead. ENOSPC/EDQUOT are returned as such.
    fn allocate(&self, offset: u64, len_bytes: u64, keep_size: bool) -> io::Result<()>;
    /// Makes this file's written bytes and length durable (`fdatasync`). After an error,
    /// unsynced data may be lost even though reads still return it.
    fn sync_data(&self) -> io::Result<()>;
    /// `sync_data` plus the file's own metadata (`fsync`). Does *not* make its name
    /// durable: that takes `Disk::sync_dir`.
    fn sync_all(&self) -> io::Result<()>;
    /// `len` bytes at `offset` if they can be had without waiting for the device (the
    /// real disk: all in the page cache, `preadv2(RWF_NOWAIT)`); `None` otherwise, also on
    /// any error (the caller then reads with [`Disk::read_start`], which reports it).
    fn read_cached(&self, offset: u64, len: usize) -> Option<Vec<u8>>;
    /// Whether every page of the range is cached (`cachestat`); `None` if unknown.
    fn fully_cached(&self, _offset: u64, _len: usize) -> Option<bool> {
        None
    }
    /// The OS file behind this handle, for [`RealDisk`]'s io_uring paths; `None` for
    /// simulated files.
    fn std_file(&self) -> Option<&File> {
        None
    }
}

/// A read started with [`Disk::read_start`]: in flight on the engine, or already done.
pub enum DiskRead {
    Engine(spindle_io::Request),
    /// On the calling thread's own ring (`spindle_io::reactor`): no thread hand-off.
    Local(spindle_io::reactor::LocalRequest),
    /// `(bytes read, buffer)` or the error.
    Done(io::Result<(usize, IoBuf)>),
}

impl DiskRead {
    fn finish(c: spindle_io::Completion) -> io::Result<(usize, IoBuf)> {
        let n = c.ok()?;
        Ok((n, c.buf.unwrap_or_else(|| IoBuf::zeroed(0))))
    }

    /// Waits (blocking the thread) for the read.
    pub fn wait(self) -> io::Result<(usize, IoBuf)> {
        match self {
            DiskRead::Engine(req) => Self::finish(req.wait()),
            DiskRead::Local(req) => Self::finish(req.wait()),
            DiskRead::Done(r) => r,
        }
    }

    /// Waits (asynchronously) for the read.
    pub async fn done(self) -> io::Result<(usize, IoBuf)> {
        match self {
            DiskRead::Engine(req) => Self::finish(req.await),
            DiskRead::Local(req) => Self::finish(req.await),
            DiskRead::Done(r) => r,
        }
    }
}

/// The file-system operations the store needs. Paths are absolute (under the store's
/// directory). See the module documentation for the durability contract.
pub trait Disk: Send + Sync + Debug + 'static {
    /// Opens `path` as `how` says.
    fn open(&self, path: &Path, how: OpenHow) -> io::Result<FileRef>;
    /// Whether `path` names a file or directory.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Creates the directory and its parents (durable: directories are created once, at a
    /// store's first open, and `sync_dir` of the parent covers them).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Removes the name (NotFound if absent); durable after `sync_dir` of its directory.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames within one directory (atomic); durable after `sync_dir`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Names in directory `path` (any order).
    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>>;
    /// Makes every create, rename and unlink in directory `path` durable (`fsync` of the
    /// directory).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Length of the file `path`.
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    /// Size and free space of the file system holding `path`.
    fn space(&self, path: &Path) -> io::Result<DiskSpace>;
    /// Writes each `(file, offset, bytes)` the iterator yields, starting each as soon as
    /// it is yielded (all in flight at once where the disk can, so the caller prepares the
    /// next buffer while the previous ones are written); returns after all completed,
    /// with the first error. Not durable before `sync_data` (except on O_DSYNC files). The
    /// writes may complete in any order.
    fn write_batch(
        &self,
        writes: &mut dyn Iterator<Item = (FileRef, u64, IoBuf)>,
    ) -> io::Result<()>;
    /// `sync_data` of every file the iterator yields, at most `in_flight_max` at once
    /// (each holds an open descriptor until done); the first error (of the iterator or a
    /// sync) is returned.
    fn sync_data_each(
        &self,
        files: &mut dyn Iterator<Item = io::Result<FileRef>>,
        in_flight_max: usize,
    ) -> io::Result<()>;
    /// Starts a read of `buf.len()` bytes at `offset` into `buf` (short at end of file).
    fn read_start(&self, file: &FileRef, offset: u64, buf: IoBuf) -> DiskRead;
    /// Whether the store may use this disk from helper threads (the unlink thread). A
    /// deterministic simulator answers `false`: then files are removed on the worker thread.
    fn concurrent(&self) -> bool {
        true
    }
    /// Opens (or creates) the redb metadata database at `path` over this disk.
    fn open_meta(
        &self,
        path: &Path,
        builder: &redb::Builder,
    ) -> Result<redb::Database, redb::DatabaseError> {
        let file = self.open(path, OpenHow::Data { create: true })?;
        builder.create_with_backend(DiskBackend { file })
    }
}

/// Reads exactly `buf.len()` bytes at `offset` (UnexpectedEof if the file is shorter).
pub fn read_exact_at(file: &dyn DiskFile, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let n = file.read_at(buf, offset)?;
    if n < buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read {n} of {} bytes at {offset}", buf.len()),
        ));
    }
    Ok(())
}

/// redb's storage over a [`DiskFile`]: checkpoint metadata goes through the seam too.
/// (No byte-range locks: the default `Unsupported` tells redb to go without.)
#[derive(Debug)]
pub struct DiskBackend {
    file: FileRef,
}

impl DiskBackend {
    pub fn new(file: FileRef) -> DiskBackend {
        DiskBackend { file }
    }
}

impl redb::StorageBackend for DiskBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len_bytes()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        read_exact_at(&*self.file, out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write_all_at(data, offset)
    }
}

/// The real file system: exactly the calls the store made before the seam (O_DIRECT |
/// O_DSYNC journal, page-cache data files, io_uring for parallel and uncached I/O,
/// statvfs), plus the redb file backend with its file locks.
#[derive(Debug)]
pub struct RealDisk {
    engine: Engine,
}

impl RealDisk {
    /// A real disk with its own I/O engine (io_uring, or the thread-pool fallback).
    pub fn new() -> io::Result<RealDisk> {
        let engine = Engine::new(spindle_io::Config::default()).map_err(io::Error::other)?;
        Ok(RealDisk { engine })
    }
}

fn real_fd(file: &FileRef) -> io::Result<i32> {
    file.std_file().map(|f| f.as_raw_fd()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a file of another disk was handed to the real disk",
        )
    })
}

/// Opens with O_DIRECT added, retrying without it where the file system refuses it.
fn open_maybe_direct(path: &Path, mut opts: OpenOptions, flags: i32) -> io::Result<File> {
    let direct = opts.clone().custom_flags(flags | libc::O_DIRECT).open(path);
    match direct {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => opts.custom_flags(flags).open(path),
        r => r,
    }
}

impl Disk for RealDisk {
    fn open(&self, path: &Path, how: OpenHow) -> io::Result<FileRef> {
        let mut o = OpenOptions::new();
        let f = match how {
            OpenHow::Data { create } => o
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .custom_flags(libc::O_CLOEXEC)
                .mode(0o644)
                .open(path)?,
            OpenHow::Read => o.read(true).custom_flags(libc::O_CLOEXEC).open(path)?,
            OpenHow::Journal => {
                o.read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644);
                open_maybe_direct(path, o, libc::O_CLOEXEC | libc::O_DSYNC)?
            }
            OpenHow::DirectNew { cached } => {
                o.write(true).create(true).truncate(true).mode(0o644);
                if cached {
                    o.custom_flags(libc::O_CLOEXEC | libc::O_DSYNC).open(path)?
                } else {
                    open_maybe_direct(path, o, libc::O_CLOEXEC | libc::O_DSYNC)?
                }
            }
            OpenHow::DirectExisting { cached } => {
                o.write(true);
                if cached {
                    o.custom_flags(libc::O_CLOEXEC | libc::O_DSYNC).open(path)?
                } else {
                    open_maybe_direct(path, o, libc::O_CLOEXEC | libc::O_DSYNC)?
                }
            }
            OpenHow::DirectRead => o
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
                .open(path)?,
        };
        Ok(Arc::new(f))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }

    fn space(&self, path: &Path) -> io::Result<DiskSpace> {
        let (total_bytes, avail_bytes) = fs_space(path)?;
        Ok(DiskSpace {
            total_bytes,
            avail_bytes,
        })
    }

    fn write_batch(
        &self,
        writes: &mut dyn Iterator<Item = (FileRef, u64, IoBuf)>,
    ) -> io::Result<()> {
        let mut reqs = Vec::with_capacity(writes.size_hint().0);
        let mut first_err = None;
        for (file, offset, buf) in writes {
            let submitted = real_fd(&file).and_then(|fd| {
                self.engine
                    .submit(Op::write(fd, offset, buf))
                    .map_err(io::Error::other)
            });
            match submitted {
                // The file (descriptor) stays alive until its write completed.
                Ok(req) => reqs.push((req, file)),
                Err(e) => {
                    first_err.get_or_insert(e);
                    break;
                }
            }
        }
        for (req, _file) in reqs {
            if let Err(e) = req.wait().ok() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn sync_data_each(
        &self,
        files: &mut dyn Iterator<Item = io::Result<FileRef>>,
        in_flight_max: usize,
    ) -> io::Result<()> {
        // Bounded: a submit that finds no free engine slot waits for one, and only this
        // thread would free them (a deadlock with tens of thousands of dirty files).
        let in_flight_max = in_flight_max.max(1);
        let mut syncs: std::collections::VecDeque<(spindle_io::Request, FileRef)> =
            std::collections::VecDeque::with_capacity(in_flight_max.min(4096));
        for file in files {
            let file = file?;
            if syncs.len() >= in_flight_max {
                if let Some((req, _f)) = syncs.pop_front() {
                    req.wait().ok()?;
                }
            }
            let fd = real_fd(&file)?;
            let req = self
                .engine
                .submit(Op::Fdatasync { fd })
                .map_err(io::Error::other)?;
            syncs.push_back((req, file));
        }
        assert!(syncs.len() <= in_flight_max);
        for (req, _f) in syncs {
            req.wait().ok()?;
        }
        Ok(())
    }

    fn read_start(&self, file: &FileRef, offset: u64, buf: IoBuf) -> DiskRead {
        let fd = match real_fd(file) {
            Ok(fd) => fd,
            Err(e) => return DiskRead::Done(Err(e)),
        };
        // The calling thread's own ring when it has one (a daemon's runtime thread), else
        // the engine's ring threads.
        let op = match spindle_io::reactor::submit(Op::read(fd, offset, buf)) {
            Ok(req) => return DiskRead::Local(req),
            Err(op) => op,
        };
        match self.engine.submit(op) {
            Ok(req) => DiskRead::Engine(req),
            Err(e) => DiskRead::Done(Err(io::Error::other(e))),
        }
    }

    fn open_meta(
        &self,
        path: &Path,
        builder: &redb::Builder,
    ) -> Result<redb::Database, redb::DatabaseError> {
        // redb's own file backend: the same calls as through `DiskBackend`, plus its file
        // locks, which refuse a second process opening the same store.
        builder.create(path)
    }
}

impl DiskFile for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match FileExt::read_at(self, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, data, offset)
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn set_len(&self, len_bytes: u64) -> io::Result<()> {
        File::set_len(self, len_bytes)
    }

    fn allocate(&self, offset: u64, len_bytes: u64, keep_size: bool) -> io::Result<()> {
        let range = i64::try_from(offset)
            .ok()
            .zip(i64::try_from(len_bytes).ok());
        let Some((offset, len)) = range else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range too large to allocate",
            ));
        };
        let mode = if keep_size {
            libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        loop {
            // SAFETY: plain syscall on a descriptor we own; no memory is passed.
            let rc = unsafe { libc::fallocate(self.as_raw_fd(), mode, offset, len) };
            if rc == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) => return Ok(()),
                _ => return Err(e),
            }
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn read_cached(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        read_cached(self, offset, len)
    }

    fn fully_cached(&self, offset: u64, len: usize) -> Option<bool> {
        fully_cached(self, offset, len)
    }

    fn std_file(&self) -> Option<&File> {
        Some(self)
    }
}

/// (usable size, available bytes) of the file system holding `path` (statvfs), counted
/// as `df` counts them: available is `f_bavail` (what an unprivileged writer can still
/// use) and the usable size is used + available, where used is `f_blocks - f_bfree`.
/// Blocks reserved for root are in neither, so the used ratio `1 - avail / size` is `df`'s
/// `Use%` (a file system with a large root reserve would otherwise look nearly full while
/// most of it is free: 252 GB with 177 GB free but only 16 GB outside the reserve read as
/// 94% used instead of df's 83%).
pub(crate) fn fs_space(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    let used_blocks = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64);
    let avail_blocks = st.f_bavail as u64;
    Ok((
        used_blocks
            .saturating_add(avail_blocks)
            .saturating_mul(frsize),
        avail_blocks.saturating_mul(frsize),
    ))
}

/// Set once the kernel answered `ENOSYS` to `cachestat` (before Linux 6.5).
static CACHESTAT_UNSUPPORTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether every page of `[offset, offset + len)` of `file` is in the page cache, asked
/// with `cachestat(2)`, which starts no I/O; `None` where the kernel lacks it or on error.
fn fully_cached(file: &File, offset: u64, len: usize) -> Option<bool> {
    use std::sync::atomic::Ordering::Relaxed;
    // The kernel's `struct cachestat_range` and `struct cachestat` (include/uapi/linux/mman.h).
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // The number of `cachestat` on every architecture Rust targets (syscalls added since
    // Linux 5.1 share one numbering; only alpha, which Rust does not target, differs); the
    // libc crate does not export it for x86_64 glibc.
    const SYS_CACHESTAT: libc::c_long = 451;
    if CACHESTAT_UNSUPPORTED.load(Relaxed) || len == 0 {
        return None;
    }
    let range = Range {
        off: offset,
        len: len as u64,
    };
    let mut stat = Stat::default();
    // SAFETY: `range` and `stat` are valid for reads/writes of their C layouts for the
    // call; the descriptor is owned by `file`, alive for the call.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    if rc != 0 {
        if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            CACHESTAT_UNSUPPORTED.store(true, Relaxed);
        }
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let page_bytes = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    let first = offset / page_bytes;
    let last = (offset + len as u64 - 1) / page_bytes;
    Some(stat.nr_cache > last - first)
}

/// `len` bytes at `offset` of `file` if all of them are in the page cache (one
/// `preadv2(RWF_NOWAIT)`, which never waits for the disk); `None` when any would need disk
/// I/O, at the end of the file, or on any error (the caller then reads through the
/// engine, which reports errors).
fn read_cached(file: &File, offset: u64, len: usize) -> Option<Vec<u8>> {
    let offset = libc::off_t::try_from(offset).ok()?;
    // Not zeroed first: the read fills all of it or the buffer is dropped unread.
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    // SAFETY: `iov` describes `buf`'s allocation, valid for `len` bytes of writes and alive
    // for the call; the descriptor is owned by `file`, alive for the call.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    if usize::try_from(n).ok()? != len {
        return None;
    }
    // SAFETY: the kernel wrote all `len` bytes (a full read), within the capacity.
    unsafe { buf.set_len(len) };
    Some(buf)
}
