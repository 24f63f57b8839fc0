//! The portable backend: worker threads per staging queue, each running one blocking system
//! call at a time (`pread`, `pwrite`, `fsync`, ...). Same slab, same `Request`, same
//! resubmission rule as the io_uring backend.
//!
//! Invariant: while a worker runs an op, the op is out of its slot (so `Request::is_done`
//! and `poll` never wait for a blocking call); it goes back before the slot completes.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crate::exec::{on_result, run_sync, timed_out, Outcome};
use crate::op::Op;
use crate::queue::StagingQueue;
use crate::slab::{lock, split_user_data, SlabOwner, SlotScratch, State};

pub(crate) fn run_worker(owner: Arc<SlabOwner>, queue: Arc<StagingQueue>) {
    loop {
        let index = {
            let mut q = queue.lock();
            loop {
                if let Some(index) = q.fresh.pop_front() {
                    queue.depth.store(q.fresh.len(), Relaxed);
                    queue.in_flight.fetch_add(1, Relaxed);
                    queue.not_full.notify_one();
                    break index;
                }
                if q.closed {
                    return;
                }
                q = queue.not_empty.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        execute(&owner, index);
        queue.in_flight.fetch_sub(1, Relaxed);
    }
}

fn execute(owner: &SlabOwner, index: u32) {
    let slot = owner.slab.slot(index);
    let mut inner = lock(&slot.inner);
    if inner.cancelled {
        drop(inner);
        let err = io::Error::from_raw_os_error(libc::ECANCELED);
        owner.slab.complete(&owner.counters, index, Err(err), false);
        return;
    }
    inner.state = State::Running;
    let Some(mut op) = inner.op.take() else {
        drop(inner);
        let err = io::Error::other("spindle-io: slot without op (bug)");
        owner.slab.complete(&owner.counters, index, Err(err), false);
        return;
    };
    if let Op::Cancel { target } = op {
        inner.op = Some(op);
        drop(inner);
        let result = cancel(owner, target);
        owner.slab.complete(&owner.counters, index, result, false);
        return;
    }
    let mut progress = inner.progress;
    let deadline = inner.deadline;
    let mut iovecs = std::mem::take(&mut inner.iovecs);
    let scratch: *mut SlotScratch = &mut *inner.scratch;
    drop(inner);

    let result = loop {
        if let Some(deadline) = deadline {
            if let Err(e) = before_deadline(&op, deadline) {
                break Err(e);
            }
        }
        // SAFETY: the scratch box belongs to this slot and nobody else touches it while the
        // request is running (it is read only after completion, under the slot lock).
        let scratch = unsafe { &mut *scratch };
        let res = run_sync(&mut op, progress, &mut iovecs, scratch, &owner.files);
        match on_result(&op, &mut progress, res) {
            Outcome::Resubmit => {
                owner.counters.resubmitted.fetch_add(1, Relaxed);
            }
            Outcome::Done(result) => break result,
        }
    };

    let statx_valid = result.is_ok() && matches!(op, Op::Statx { .. });
    let mut inner = lock(&slot.inner);
    inner.op = Some(op);
    inner.progress = progress;
    inner.iovecs = iovecs;
    drop(inner);
    owner
        .slab
        .complete(&owner.counters, index, result, statx_valid);
}

/// Cancels a request that no worker has started yet.
fn cancel(owner: &SlabOwner, target: u64) -> io::Result<usize> {
    let (index, generation) = split_user_data(target);
    if index as usize >= owner.slab.capacity() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let mut inner = lock(&owner.slab.slot(index).inner);
    if inner.generation != generation {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    match inner.state {
        State::Queued if !inner.cancelled => {
            inner.cancelled = true;
            Ok(0)
        }
        State::Running => Err(io::Error::from_raw_os_error(libc::EALREADY)),
        _ => Err(io::Error::from_raw_os_error(libc::ENOENT)),
    }
}

/// Best-effort deadline for a blocking call: fails with `ETIMEDOUT` once the deadline has
/// passed; for calls that can block indefinitely (streams: reads/writes without offset,
/// send, recv, accept) first waits for readiness with `poll(2)` for at most the time left;
/// a `Timeout` op longer than the time left sleeps until the deadline and times out. A call
/// already running is never interrupted, so its buffers stay in use until it returns.
fn before_deadline(op: &Op, deadline: Instant) -> io::Result<()> {
    let now = Instant::now();
    if now >= deadline {
        return Err(timed_out());
    }
    let left = deadline - now;
    let (fd, events) = match op {
        Op::Timeout { duration } => {
            if *duration > left {
                std::thread::sleep(left);
                return Err(timed_out());
            }
            return Ok(());
        }
        Op::Read {
            fd, offset: None, ..
        }
        | Op::Readv {
            fd, offset: None, ..
        }
        | Op::Recv { fd, .. }
        | Op::Accept { fd } => (*fd, libc::POLLIN),
        Op::Write {
            fd, offset: None, ..
        }
        | Op::Writev {
            fd, offset: None, ..
        }
        | Op::Send { fd, .. } => (*fd, libc::POLLOUT),
        _ => return Ok(()),
    };
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd on the stack.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n == 0 {
        return Err(timed_out());
    }
    // Ready, or poll failed (EINTR, EBADF...): let the call itself report.
    Ok(())
}
