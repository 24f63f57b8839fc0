//! What both backends share: turning a raw result into "resubmit the rest" or "done", building
//! the io_uring submission for the remainder of an op, and running an op synchronously.
//!
//! Invariant: every resubmission moves at least one byte forward (`progress` strictly grows),
//! so the resubmission loop is bounded by the op's length.

use std::io;
use std::time::Instant;

use io_uring::{opcode, squeue, types};

use crate::buf::IoBuf;
use crate::fixed::{FileRef, FileTable};
use crate::op::Op;
use crate::slab::{SlotInner, SlotScratch};

/// Largest single transfer handed to the kernel (Linux caps one read/write at 0x7ffff000).
pub(crate) const TRANSFER_MAX_BYTES: usize = 1 << 30;
/// Most buffers in one readv/writev (Linux `IOV_MAX`).
pub(crate) const IOV_MAX: usize = 1024;

/// Decision after one kernel/syscall result.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Short transfer: submit the remainder (`progress` was advanced).
    Resubmit,
    Done(io::Result<usize>),
}

/// Applies one raw result (`>= 0` count/fd, `< 0` negated errno) to the op's progress.
pub(crate) fn on_result(op: &Op, progress: &mut usize, res: i64) -> Outcome {
    if res < 0 {
        let errno = i32::try_from(-res).unwrap_or(libc::EIO);
        if matches!(op, Op::Timeout { .. }) && errno == libc::ETIME {
            return Outcome::Done(Ok(0));
        }
        return Outcome::Done(Err(io::Error::from_raw_os_error(errno)));
    }
    let n = usize::try_from(res).unwrap_or(usize::MAX);
    if !op.resubmits_short() {
        if matches!(op, Op::Recv { .. }) {
            *progress = n;
        }
        return Outcome::Done(Ok(n));
    }
    let total = op.transfer_len();
    assert!(
        n <= total - *progress,
        "kernel reported more bytes than asked for"
    );
    *progress += n;
    if *progress == total {
        return Outcome::Done(Ok(total));
    }
    if n == 0 {
        if op.zero_is_eof() {
            // End of file: a short result, not an error.
            return Outcome::Done(Ok(*progress));
        }
        return Outcome::Done(Err(io::Error::from(io::ErrorKind::WriteZero)));
    }
    Outcome::Resubmit
}

/// Checks an op before it is accepted (limits the kernel would otherwise reject late).
pub(crate) fn validate(op: &Op) -> Result<(), &'static str> {
    match op {
        Op::Readv { bufs, .. } | Op::Writev { bufs, .. } if bufs.len() > IOV_MAX => {
            Err("more than IOV_MAX (1024) buffers")
        }
        Op::Read { buf, .. } | Op::Recv { buf, .. } if buf.is_shared() => {
            Err("a shared (read-only) buffer cannot receive data")
        }
        Op::Readv { bufs, .. } if bufs.iter().any(IoBuf::is_shared) => {
            Err("a shared (read-only) buffer cannot receive data")
        }
        Op::Cancel { .. } => Err("cancel ops are made with Engine::cancel"),
        Op::Internal(_) => Err("internal op"),
        _ => Ok(()),
    }
}

fn offset_of(offset: Option<u64>, progress: usize) -> u64 {
    match offset {
        // -1: the current file position (pipes, sockets).
        None => u64::MAX,
        Some(o) => o.saturating_add(progress as u64),
    }
}

/// Fills `iovecs` with the part of `bufs` after the first `skip` bytes.
fn fill_iovecs(bufs: &mut [IoBuf], mut skip: usize, iovecs: &mut Vec<libc::iovec>) {
    iovecs.clear();
    for buf in bufs.iter_mut() {
        let len = buf.len();
        if skip >= len {
            skip -= len;
            continue;
        }
        // SAFETY: `skip < len <= capacity`, so the pointer stays inside the buffer.
        let base = unsafe { buf.as_mut_ptr().add(skip) };
        iovecs.push(libc::iovec {
            iov_base: base.cast(),
            iov_len: len - skip,
        });
        skip = 0;
    }
}

fn remaining(op: &Op, progress: usize) -> u32 {
    // Bounded by TRANSFER_MAX_BYTES < u32::MAX.
    (op.transfer_len() - progress).min(TRANSFER_MAX_BYTES) as u32
}

/// Builds the submission for the not-yet-done part of the slot's op.
///
/// The returned entry points into the op's buffers and the slot's scratch; both stay put
/// until the slot is completed (slab invariants).
pub(crate) fn build_sqe(inner: &mut SlotInner, user_data: u64) -> squeue::Entry {
    let progress = inner.progress;
    let SlotInner {
        op,
        iovecs,
        scratch,
        ..
    } = inner;
    let Some(op) = op.as_mut() else {
        // A slot without an op is a bug; a NOP completes it harmlessly with 0.
        debug_assert!(false, "build_sqe on an empty slot");
        return opcode::Nop::new().build().user_data(user_data);
    };
    let len = remaining(op, progress);
    let scratch: &mut SlotScratch = scratch;
    let entry = match op {
        Op::Read { fd, offset, buf } => {
            // SAFETY: progress < len(buf) (a done op is never resubmitted).
            let ptr = unsafe { buf.as_mut_ptr().add(progress) };
            opcode::Read::new(types::Fd(*fd), ptr, len)
                .offset(offset_of(*offset, progress))
                .build()
        }
        Op::Write { fd, offset, buf } => {
            // SAFETY: as above.
            let ptr = unsafe { buf.as_ptr().add(progress) };
            opcode::Write::new(types::Fd(*fd), ptr, len)
                .offset(offset_of(*offset, progress))
                .build()
        }
        Op::Readv { fd, offset, bufs } => {
            fill_iovecs(bufs, progress, iovecs);
            opcode::Readv::new(types::Fd(*fd), iovecs.as_ptr(), iovecs.len() as u32)
                .offset(offset_of(*offset, progress))
                .build()
        }
        Op::Writev { fd, offset, bufs } => {
            fill_iovecs(bufs, progress, iovecs);
            opcode::Writev::new(types::Fd(*fd), iovecs.as_ptr(), iovecs.len() as u32)
                .offset(offset_of(*offset, progress))
                .build()
        }
        Op::Fsync { fd } => opcode::Fsync::new(types::Fd(*fd)).build(),
        Op::Fdatasync { fd } => opcode::Fsync::new(types::Fd(*fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Op::Fallocate {
            fd,
            mode,
            offset,
            len,
        } => opcode::Fallocate::new(types::Fd(*fd), *len)
            .offset(*offset)
            .mode(*mode)
            .build(),
        Op::Open { path, flags, mode } => {
            opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
                .flags(*flags)
                .mode(*mode)
                .build()
        }
        Op::Close { fd } => opcode::Close::new(types::Fd(*fd)).build(),
        Op::Statx {
            fd,
            path,
            flags,
            mask,
        } => {
            let statx: *mut libc::statx = &mut scratch.statx;
            opcode::Statx::new(types::Fd(*fd), path.as_ptr(), statx.cast())
                .flags(*flags)
                .mask(*mask)
                .build()
        }
        Op::Send { fd, buf, flags } => {
            // SAFETY: progress < len(buf).
            let ptr = unsafe { buf.as_ptr().add(progress) };
            opcode::Send::new(types::Fd(*fd), ptr, len)
                .flags(*flags | libc::MSG_NOSIGNAL)
                .build()
        }
        Op::Recv { fd, buf, flags } => opcode::Recv::new(types::Fd(*fd), buf.as_mut_ptr(), len)
            .flags(*flags)
            .build(),
        Op::Accept { fd } => {
            opcode::Accept::new(types::Fd(*fd), std::ptr::null_mut(), std::ptr::null_mut())
                .flags(libc::SOCK_CLOEXEC)
                .build()
        }
        Op::Connect { fd, addr } => {
            scratch.sockaddr_len = write_sockaddr(addr, &mut scratch.sockaddr);
            let ptr: *const libc::sockaddr_storage = &scratch.sockaddr;
            opcode::Connect::new(types::Fd(*fd), ptr.cast(), scratch.sockaddr_len).build()
        }
        Op::Timeout { duration } => {
            scratch.timespec = types::Timespec::from(*duration);
            opcode::Timeout::new(&scratch.timespec).build()
        }
        Op::Nop => opcode::Nop::new().build(),
        Op::Cancel { target } => opcode::AsyncCancel::new(*target).build(),
        Op::ReadFixed { file, offset, buf } => {
            // SAFETY: progress < len(buf) <= capacity: inside the registered region.
            let ptr = unsafe { buf.as_ptr().add(progress) };
            let index = buf.index();
            let offset = offset.saturating_add(progress as u64);
            match *file {
                FileRef::Fd(fd) => opcode::ReadFixed::new(types::Fd(fd), ptr, len, index),
                FileRef::Fixed(f) => opcode::ReadFixed::new(types::Fixed(f.0), ptr, len, index),
            }
            .offset(offset)
            .build()
        }
        Op::WriteFixed { file, offset, buf } => {
            // SAFETY: as above.
            let ptr = unsafe { buf.as_ptr().add(progress) };
            let index = buf.index();
            let offset = offset.saturating_add(progress as u64);
            match *file {
                FileRef::Fd(fd) => opcode::WriteFixed::new(types::Fd(fd), ptr, len, index),
                FileRef::Fixed(f) => opcode::WriteFixed::new(types::Fixed(f.0), ptr, len, index),
            }
            .offset(offset)
            .build()
        }
        // Registration runs synchronously in the issuing thread, never as an SQE.
        Op::Internal(_) => opcode::Nop::new().build(),
    };
    entry.user_data(user_data)
}

/// `user_data` bit marking the linked timeout of a request (slot indexes stay below 2^30;
/// control tags, with index `u32::MAX`, are matched before this bit is looked at).
pub(crate) const LINK_TIMEOUT_BIT: u64 = 1 << 30;

/// What to hand the kernel for the (rest of the) slot's op.
pub(crate) enum Next {
    /// The op's entry, and its linked timeout when the request has a deadline (the two must
    /// be pushed together, see `push_multiple`).
    Submit(squeue::Entry, Option<squeue::Entry>),
    /// The deadline passed before the (re)submission: complete with `ETIMEDOUT`.
    Expired,
}

/// Builds the submission(s) for the slot: the op, linked to an `IORING_OP_LINK_TIMEOUT` for
/// the time left until the request's deadline (the deadline covers every resubmission).
pub(crate) fn prepare(inner: &mut SlotInner, user_data: u64) -> Next {
    let Some(deadline) = inner.deadline else {
        return Next::Submit(build_sqe(inner, user_data), None);
    };
    let now = Instant::now();
    if now >= deadline {
        return Next::Expired;
    }
    inner.scratch.link_timespec = types::Timespec::from(deadline - now);
    let entry = build_sqe(inner, user_data).flags(squeue::Flags::IO_LINK);
    // The kernel copies the timespec when it prepares the entry (at submission).
    let timeout = opcode::LinkTimeout::new(&inner.scratch.link_timespec)
        .build()
        .user_data(user_data | LINK_TIMEOUT_BIT);
    Next::Submit(entry, Some(timeout))
}

/// The error of a request whose deadline passed.
pub(crate) fn timed_out() -> io::Error {
    io::Error::from_raw_os_error(libc::ETIMEDOUT)
}

/// `on_result` for a request that may have a deadline: a cancellation (`ECANCELED`,
/// `EINTR`, `ETIME`) once the deadline has passed is the linked timeout firing, reported as
/// `ETIMEDOUT` (`io::ErrorKind::TimedOut`).
pub(crate) fn on_result_deadline(
    op: &Op,
    progress: &mut usize,
    res: i64,
    deadline: Option<Instant>,
) -> Outcome {
    if let Some(deadline) = deadline {
        let cancelled = res == -i64::from(libc::ECANCELED)
            || res == -i64::from(libc::EINTR)
            || res == -i64::from(libc::ETIME);
        if cancelled && Instant::now() >= deadline {
            return Outcome::Done(Err(timed_out()));
        }
    }
    on_result(op, progress, res)
}

/// Encodes a socket address for `connect`; returns its length.
pub(crate) fn write_sockaddr(
    addr: &std::net::SocketAddr,
    storage: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    let storage_ptr: *mut libc::sockaddr_storage = storage;
    match addr {
        std::net::SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { storage_ptr.cast::<libc::sockaddr_in>().write(sin) };
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        std::net::SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { storage_ptr.cast::<libc::sockaddr_in6>().write(sin6) };
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

fn raw(ret: isize) -> i64 {
    if ret < 0 {
        -i64::from(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    } else {
        ret as i64
    }
}

/// Runs the remainder of an op with one blocking system call; returns the raw result as
/// `on_result` expects it. Retries `EINTR`.
pub(crate) fn run_sync(
    op: &mut Op,
    progress: usize,
    iovecs: &mut Vec<libc::iovec>,
    scratch: &mut SlotScratch,
    files: &FileTable,
) -> i64 {
    loop {
        let res = run_sync_once(op, progress, iovecs, scratch, files);
        if res != -i64::from(libc::EINTR) {
            return res;
        }
    }
}

fn pos(offset: Option<u64>, progress: usize) -> Option<libc::off_t> {
    offset.map(|o| o.saturating_add(progress as u64).min(i64::MAX as u64) as libc::off_t)
}

fn run_sync_once(
    op: &mut Op,
    progress: usize,
    iovecs: &mut Vec<libc::iovec>,
    scratch: &mut SlotScratch,
    files: &FileTable,
) -> i64 {
    let len = remaining(op, progress) as usize;
    // SAFETY (for every call below): pointers come from buffers owned by `op`, valid for
    // `len` bytes after `progress`; paths are NUL-terminated `CString`s; the statx and
    // sockaddr targets live in `scratch`. The kernel validates descriptors and offsets.
    unsafe {
        match op {
            Op::Read { fd, offset, buf } => {
                let ptr = buf.as_mut_ptr().add(progress).cast();
                raw(match pos(*offset, progress) {
                    Some(o) => libc::pread(*fd, ptr, len, o),
                    None => libc::read(*fd, ptr, len),
                })
            }
            Op::Write { fd, offset, buf } => {
                let ptr = buf.as_ptr().add(progress).cast();
                raw(match pos(*offset, progress) {
                    Some(o) => libc::pwrite(*fd, ptr, len, o),
                    None => libc::write(*fd, ptr, len),
                })
            }
            Op::Readv { fd, offset, bufs } => {
                fill_iovecs(bufs, progress, iovecs);
                let n = iovecs.len() as i32;
                raw(match pos(*offset, progress) {
                    Some(o) => libc::preadv(*fd, iovecs.as_ptr(), n, o),
                    None => libc::readv(*fd, iovecs.as_ptr(), n),
                })
            }
            Op::Writev { fd, offset, bufs } => {
                fill_iovecs(bufs, progress, iovecs);
                let n = iovecs.len() as i32;
                raw(match pos(*offset, progress) {
                    Some(o) => libc::pwritev(*fd, iovecs.as_ptr(), n, o),
                    None => libc::writev(*fd, iovecs.as_ptr(), n),
                })
            }
            Op::Fsync { fd } => raw(libc::fsync(*fd) as isize),
            Op::Fdatasync { fd } => raw(libc::fdatasync(*fd) as isize),
            Op::Fallocate {
                fd,
                mode,
                offset,
                len,
            } => raw(libc::fallocate(
                *fd,
                *mode,
                (*offset).min(i64::MAX as u64) as libc::off_t,
                (*len).min(i64::MAX as u64) as libc::off_t,
            ) as isize),
            Op::Open { path, flags, mode } => {
                raw(libc::openat(libc::AT_FDCWD, path.as_ptr(), *flags, *mode) as isize)
            }
            Op::Close { fd } => {
                // close(2) must not be retried after EINTR (the fd is gone either way).
                let r = libc::close(*fd);
                if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    0
                } else {
                    raw(r as isize)
                }
            }
            Op::Statx {
                fd,
                path,
                flags,
                mask,
            } => raw(libc::statx(*fd, path.as_ptr(), *flags, *mask, &mut scratch.statx) as isize),
            Op::Send { fd, buf, flags } => {
                let ptr = buf.as_ptr().add(progress).cast();
                raw(libc::send(*fd, ptr, len, *flags | libc::MSG_NOSIGNAL))
            }
            Op::Recv { fd, buf, flags } => {
                raw(libc::recv(*fd, buf.as_mut_ptr().cast(), len, *flags))
            }
            Op::Accept { fd } => raw(libc::accept4(
                *fd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            ) as isize),
            Op::Connect { fd, addr } => {
                let len = write_sockaddr(addr, &mut scratch.sockaddr);
                let ptr: *const libc::sockaddr_storage = &scratch.sockaddr;
                raw(libc::connect(*fd, ptr.cast(), len) as isize)
            }
            Op::Timeout { duration } => {
                std::thread::sleep(*duration);
                0
            }
            Op::Nop => 0,
            // Handled by the thread backend before it gets here.
            Op::Cancel { .. } => -i64::from(libc::EINVAL),
            Op::ReadFixed { file, offset, buf } => {
                let ptr = buf.as_ptr().add(progress).cast();
                let fd = files.resolve(*file);
                raw(libc::pread(
                    fd,
                    ptr,
                    len,
                    pos(Some(*offset), progress).unwrap_or(0),
                ))
            }
            Op::WriteFixed { file, offset, buf } => {
                let ptr = buf.as_ptr().add(progress).cast();
                let fd = files.resolve(*file);
                raw(libc::pwrite(
                    fd,
                    ptr,
                    len,
                    pos(Some(*offset), progress).unwrap_or(0),
                ))
            }
            // Registration has nothing to do without a kernel ring.
            Op::Internal(_) => 0,
        }
    }
}

/// On an IOPOLL ring, `EOPNOTSUPP` means the file or its device cannot do polled I/O: say so.
pub(crate) fn iopoll_error(result: io::Result<usize>) -> io::Result<usize> {
    match result {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "IOPOLL ring: polled I/O is not supported for this file (it must be opened with \
             O_DIRECT on a block device with poll queues, e.g. NVMe with nvme.poll_queues > 0) \
             (EOPNOTSUPP)",
        )),
        other => other,
    }
}

/// Ops an IOPOLL ring accepts (polled reads and writes).
pub(crate) fn iopoll_allows(op: &Op) -> bool {
    matches!(
        op,
        Op::Read { .. }
            | Op::Write { .. }
            | Op::Readv { .. }
            | Op::Writev { .. }
            | Op::ReadFixed { .. }
            | Op::WriteFixed { .. }
    )
}

fn iopoll_unsupported(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("IOPOLL: polled I/O is not possible for this descriptor: {why}"),
    )
}

/// Checks up front whether `fd` can do polled I/O on an IOPOLL ring: it must be opened with
/// `O_DIRECT` and be (or live on) a block device whose queue polls
/// (`/sys/dev/block/MAJ:MIN/queue/io_poll` = 1, e.g. NVMe with `poll_queues`). Returns a
/// clear `io::ErrorKind::Unsupported` error naming the reason otherwise. (On a device that
/// does not poll, the kernel either refuses polled I/O with `EOPNOTSUPP`, reported with the
/// same kind of error, or completes it by interrupt while the ring spins.)
pub fn check_iopoll(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: plain fcntl on a caller-provided descriptor.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_DIRECT == 0 {
        return Err(iopoll_unsupported("not opened with O_DIRECT"));
    }
    // SAFETY: all-zero is a valid `stat`; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let dev = match st.st_mode & libc::S_IFMT {
        libc::S_IFBLK => st.st_rdev,
        libc::S_IFREG => st.st_dev,
        _ => return Err(iopoll_unsupported("not a regular file or block device")),
    };
    let base = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    for path in [
        format!("{base}/queue/io_poll"),
        format!("{base}/../queue/io_poll"),
    ] {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if text.trim() == "1" {
                return Ok(());
            }
            return Err(iopoll_unsupported(&format!(
                "the device does not poll ({path} = {})",
                text.trim()
            )));
        }
    }
    Err(iopoll_unsupported(&format!(
        "no block queue found for device {base}"
    )))
}
