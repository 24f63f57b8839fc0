//! Operations a caller submits and the completions it gets back.
//!
//! Ownership rule: an `Op` owns every piece of memory the kernel reads or writes for it
//! (buffers, paths). Submitting moves the `Op` into the engine's request slab; the memory
//! comes back only inside the `Completion`, after the kernel is done with it. Dropping a
//! `Request` early leaves the memory in the slab until the operation finishes.

use std::ffi::CString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::buf::IoBuf;
use crate::fixed::{FileRef, FixedBuf, FixedBufPool};

/// One I/O operation. Build it with the constructors (`Op::read`, ...).
#[derive(Debug)]
#[non_exhaustive]
pub enum Op {
    /// Fill `buf` (its `len`) from `fd` at `offset` (`None`: current position, for pipes
    /// and sockets). Short reads are resubmitted until the buffer is full, end of file
    /// (a read returning 0) or an error.
    Read {
        fd: RawFd,
        offset: Option<u64>,
        buf: IoBuf,
    },
    /// Write all of `buf` to `fd` at `offset`; short writes are resubmitted.
    Write {
        fd: RawFd,
        offset: Option<u64>,
        buf: IoBuf,
    },
    /// Vectored read into `bufs` in order; same completion rule as `Read`.
    Readv {
        fd: RawFd,
        offset: Option<u64>,
        bufs: Vec<IoBuf>,
    },
    /// Vectored write of `bufs` in order; same completion rule as `Write`.
    Writev {
        fd: RawFd,
        offset: Option<u64>,
        bufs: Vec<IoBuf>,
    },
    /// `fsync(2)`.
    Fsync { fd: RawFd },
    /// `fdatasync(2)`.
    Fdatasync { fd: RawFd },
    /// `fallocate(2)`.
    Fallocate {
        fd: RawFd,
        mode: i32,
        offset: u64,
        len: u64,
    },
    /// `openat(AT_FDCWD, path, flags, mode)`; the result is the new descriptor.
    Open {
        path: CString,
        flags: i32,
        mode: u32,
    },
    /// `close(2)`.
    Close { fd: RawFd },
    /// `statx(AT_FDCWD, path, flags, mask)`; with an empty path and `AT_EMPTY_PATH` in
    /// `flags`, stats `fd`.
    Statx {
        fd: RawFd,
        path: CString,
        flags: i32,
        mask: u32,
    },
    /// `send(2)` of all of `buf` (short sends are resubmitted).
    Send { fd: RawFd, buf: IoBuf, flags: i32 },
    /// One `recv(2)` into `buf`: the result is what that call returned (0 at end of stream).
    Recv { fd: RawFd, buf: IoBuf, flags: i32 },
    /// `accept4(fd, NULL, NULL, SOCK_CLOEXEC)`; the result is the new descriptor.
    Accept { fd: RawFd },
    /// `connect(2)` to `addr`.
    Connect { fd: RawFd, addr: SocketAddr },
    /// Completes after `duration` with result 0.
    Timeout { duration: Duration },
    /// Does nothing; completes with 0.
    Nop,
    /// Cancels another request; made only by `Engine::cancel` (`submit` rejects it).
    /// Completes with 0 if the target was cancelled, `ENOENT`/`EALREADY` otherwise.
    Cancel { target: u64 },
    /// Fill the registered buffer `buf` (its `len`) from `file` at `offset`
    /// (`IORING_OP_READ_FIXED`; the thread pool runs `pread` on the same memory). Same
    /// short-read rule as `Read`. `buf` must come from the pool registered with the engine or
    /// ring the op is submitted to (otherwise the kernel answers `EFAULT`).
    ReadFixed {
        file: FileRef,
        offset: u64,
        buf: FixedBuf,
    },
    /// Write all of the registered buffer `buf` to `file` at `offset`
    /// (`IORING_OP_WRITE_FIXED`); short writes are resubmitted.
    WriteFixed {
        file: FileRef,
        offset: u64,
        buf: FixedBuf,
    },
    /// Engine-internal control operation (registration); cannot be built outside the crate.
    #[doc(hidden)]
    Internal(InternalOp),
}

/// Engine-internal operations (not constructible outside the crate).
#[derive(Debug)]
pub struct InternalOp(pub(crate) InternalKind);

#[derive(Debug)]
pub(crate) enum InternalKind {
    /// Register this buffer set with the ring (run by the ring's issuing thread).
    RegisterBuffers(FixedBufPool),
    /// Set registered file table entries `offset..` to `fds` (-1 clears).
    UpdateFiles { offset: u32, fds: Vec<i32> },
}

impl Op {
    /// Read `buf.len()` bytes at `offset` (see [`Op::Read`]).
    pub fn read(fd: RawFd, offset: u64, buf: impl Into<IoBuf>) -> Op {
        Op::Read {
            fd,
            offset: Some(offset),
            buf: buf.into(),
        }
    }
    /// Write all of `buf` at `offset`.
    pub fn write(fd: RawFd, offset: u64, buf: impl Into<IoBuf>) -> Op {
        Op::Write {
            fd,
            offset: Some(offset),
            buf: buf.into(),
        }
    }
    /// Read from the current position (pipes, sockets, character devices).
    pub fn read_stream(fd: RawFd, buf: impl Into<IoBuf>) -> Op {
        Op::Read {
            fd,
            offset: None,
            buf: buf.into(),
        }
    }
    /// Write at the current position (pipes, sockets, O_APPEND files).
    pub fn write_stream(fd: RawFd, buf: impl Into<IoBuf>) -> Op {
        Op::Write {
            fd,
            offset: None,
            buf: buf.into(),
        }
    }
    /// Open `path` relative to the current directory.
    pub fn open(path: &std::path::Path, flags: i32, mode: u32) -> io::Result<Op> {
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        Ok(Op::Open { path, flags, mode })
    }
    /// `statx` of an open descriptor (all basic fields).
    pub fn statx_fd(fd: RawFd) -> Op {
        Op::Statx {
            fd,
            path: CString::default(),
            flags: libc::AT_EMPTY_PATH,
            mask: libc::STATX_BASIC_STATS,
        }
    }

    /// Read into a registered buffer (see [`Op::ReadFixed`]).
    pub fn read_fixed(file: impl Into<FileRef>, offset: u64, buf: FixedBuf) -> Op {
        Op::ReadFixed {
            file: file.into(),
            offset,
            buf,
        }
    }
    /// Write from a registered buffer (see [`Op::WriteFixed`]).
    pub fn write_fixed(file: impl Into<FileRef>, offset: u64, buf: FixedBuf) -> Op {
        Op::WriteFixed {
            file: file.into(),
            offset,
            buf,
        }
    }

    /// Total bytes a data-transfer op wants to move (0 for others).
    pub(crate) fn transfer_len(&self) -> usize {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } | Op::Send { buf, .. } => buf.len(),
            Op::Recv { buf, .. } => buf.len(),
            Op::ReadFixed { buf, .. } | Op::WriteFixed { buf, .. } => buf.len(),
            Op::Readv { bufs, .. } | Op::Writev { bufs, .. } => bufs.iter().map(|b| b.len()).sum(),
            _ => 0,
        }
    }

    /// True for ops whose short results are resubmitted for the remainder.
    pub(crate) fn resubmits_short(&self) -> bool {
        matches!(
            self,
            Op::Read { .. }
                | Op::Write { .. }
                | Op::Readv { .. }
                | Op::Writev { .. }
                | Op::Send { .. }
                | Op::ReadFixed { .. }
                | Op::WriteFixed { .. }
        )
    }

    /// True for ops where a result of 0 before the end means end of file / stream.
    pub(crate) fn zero_is_eof(&self) -> bool {
        matches!(
            self,
            Op::Read { .. } | Op::Readv { .. } | Op::Recv { .. } | Op::ReadFixed { .. }
        )
    }
}

/// Result of a finished operation, with every buffer the op owned.
#[derive(Debug)]
pub struct Completion {
    /// Bytes transferred (reads/writes: less than requested only at end of file), the new
    /// descriptor (open, accept), or 0. Errors carry the OS error code.
    pub result: io::Result<usize>,
    /// Bytes transferred before an error or end of file (equal to `result` on success).
    pub transferred: usize,
    /// The buffer of a read/write/send/recv, handed back.
    pub buf: Option<IoBuf>,
    /// The buffers of a readv/writev, handed back.
    pub bufs: Vec<IoBuf>,
    /// The `statx` result of a successful `Op::Statx`.
    pub statx: Option<libc::statx>,
    /// The registered buffer of a `ReadFixed`/`WriteFixed`, handed back.
    pub fixed_buf: Option<FixedBuf>,
}

impl Completion {
    /// The completion of `op` with `result`: the op's buffers are moved into it.
    pub(crate) fn from_op(
        op: Option<Op>,
        result: io::Result<usize>,
        transferred: usize,
        statx: Option<libc::statx>,
    ) -> Completion {
        let mut completion = Completion {
            result,
            transferred,
            buf: None,
            bufs: Vec::new(),
            statx,
            fixed_buf: None,
        };
        match op {
            Some(
                Op::Read { buf, .. }
                | Op::Write { buf, .. }
                | Op::Send { buf, .. }
                | Op::Recv { buf, .. },
            ) => completion.buf = Some(buf),
            Some(Op::Readv { bufs, .. } | Op::Writev { bufs, .. }) => completion.bufs = bufs,
            Some(Op::ReadFixed { buf, .. } | Op::WriteFixed { buf, .. }) => {
                completion.fixed_buf = Some(buf)
            }
            _ => {}
        }
        completion
    }

    /// The byte count or descriptor, as `io::Result`.
    pub fn ok(&self) -> io::Result<usize> {
        match &self.result {
            Ok(n) => Ok(*n),
            Err(e) => Err(match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            }),
        }
    }
}
