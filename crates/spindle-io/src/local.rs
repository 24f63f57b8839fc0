//! `LocalRing`: one io_uring driven entirely by the calling thread.
//!
//! The [`crate::Engine`] moves every request across threads (caller -> ring thread ->
//! caller), which is what a general, thread-safe API needs. A storage daemon's data path is
//! thread-per-core and run-to-completion instead: each core owns a ring and submits and reaps
//! on it itself, with no queue, lock or wake-up between threads - the way fio's io_uring
//! engine works. `LocalRing` is that path. It uses the same [`Op`] and [`Completion`] types
//! and the same rules as the engine: an op owns its buffers until its completion hands them
//! back; short reads and writes are resubmitted for the remainder (offset and buffer
//! advanced) until done, end of file (a short `Ok`) or error; errors carry the OS code.
//!
//! Invariants: at most `capacity` ops are in flight (the completion queue is sized at twice
//! that, so it cannot overflow); slots and their scratch space are allocated once, in `new`;
//! a slot's buffers are never moved or freed while the kernel may use them (an op is only
//! taken out of its slot after its final completion). Dropping a `LocalRing` with ops in
//! flight waits for them (after asking the kernel to cancel them) before freeing anything.
//! `LocalRing` is `!Sync` by construction (`&mut self` everywhere) and meant to stay on one
//! thread.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use io_uring::{squeue, IoUring};

use crate::error::SubmitError;
use crate::exec::{
    iopoll_allows, iopoll_error, on_result_deadline, prepare, timed_out, validate, Next, Outcome,
    LINK_TIMEOUT_BIT,
};
use crate::fixed::{FileTable, FixedBufPool, FixedFile};
use crate::op::{Completion, Op};
use crate::slab::{SlotInner, State};

/// Size of a `LocalRing`'s registered file table (created at the first `register_files`).
pub const LOCAL_FIXED_FILES: usize = 1024;

/// Options of a [`LocalRing`] (see [`LocalRing::builder`]).
#[derive(Debug, Clone)]
pub struct LocalRingBuilder {
    capacity: u32,
    iopoll: bool,
    defer_taskrun: bool,
    coop_taskrun: bool,
}

impl LocalRingBuilder {
    /// Polled completions (`IORING_SETUP_IOPOLL`): only O_DIRECT reads and writes on a
    /// block device that supports polling; `wait` spins in the kernel instead of sleeping.
    /// Other ops are rejected at `push`; a file that cannot be polled completes with
    /// `io::ErrorKind::Unsupported` (the kernel's `EOPNOTSUPP`), never hangs. Linked
    /// timeouts are not available on IOPOLL rings.
    pub fn iopoll(mut self, on: bool) -> Self {
        self.iopoll = on;
        self
    }

    /// `IORING_SETUP_DEFER_TASKRUN` (what fio uses): the kernel finishes completions only
    /// when this thread waits (`LocalRing::wait`), never interrupting it. With it, `pop`
    /// alone does not see new completions: call `wait` (as a run-to-completion loop does).
    /// Falls back to a ring without it on kernels that lack it.
    pub fn defer_taskrun(mut self, on: bool) -> Self {
        self.defer_taskrun = on;
        self
    }

    /// `IORING_SETUP_COOP_TASKRUN` (on by default): completions are finished when this
    /// thread next enters the kernel, without interrupting it. Turn it off for a ring whose
    /// thread sleeps in `epoll_wait` on the ring's descriptor (see [`LocalRing::fd`]): a
    /// cooperative completion would not wake it.
    pub fn coop_taskrun(mut self, on: bool) -> Self {
        self.coop_taskrun = on;
        self
    }

    /// Creates the ring.
    pub fn build(self) -> io::Result<LocalRing> {
        let capacity = self.capacity;
        if !(1..=4096).contains(&capacity) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "LocalRing capacity must be 1..=4096",
            ));
        }
        // One thread submits and reaps: tell the kernel (no inter-processor interrupts for
        // completions, single-issuer fast paths). Older kernels lack these flags: retry
        // without them.
        let mut builder = IoUring::builder();
        builder.setup_cqsize(2 * capacity).setup_single_issuer();
        if self.coop_taskrun {
            builder.setup_coop_taskrun();
        }
        if self.iopoll {
            builder.setup_iopoll();
        }
        if self.defer_taskrun {
            builder.setup_defer_taskrun();
        }
        let mut defer_taskrun = self.defer_taskrun;
        let ring = match builder.build(capacity) {
            Ok(ring) => ring,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                defer_taskrun = false;
                let mut builder = IoUring::builder();
                builder.setup_cqsize(2 * capacity);
                if self.iopoll {
                    builder.setup_iopoll();
                }
                builder.build(capacity)?
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        Ok(LocalRing {
            ring,
            slots: (0..capacity).map(|_| SlotInner::empty(now)).collect(),
            free: (0..capacity).rev().collect(),
            in_flight: 0,
            unsubmitted: 0,
            ready: VecDeque::with_capacity(capacity as usize),
            resubmit: Vec::with_capacity(capacity as usize),
            iopoll: self.iopoll,
            defer_taskrun,
            buffers: None,
            files: None,
        })
    }
}

/// Identifies an op submitted to a [`LocalRing`]; returned with its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u64);

impl Token {
    /// The ring slot the op occupies (`0..capacity`), unique among the ops pushed and not
    /// yet returned by `pop` (a slot is reused only after its completion was popped): lets a
    /// caller keep per-op data in a plain array instead of a map.
    pub fn slot(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
}

/// A caller-driven io_uring (see the module documentation).
pub struct LocalRing {
    ring: IoUring,
    slots: Vec<SlotInner>,
    free: Vec<u32>,
    in_flight: usize,
    /// Entries pushed to the submission queue but not yet handed to the kernel.
    unsubmitted: usize,
    ready: VecDeque<(Token, Completion)>,
    /// Slots whose short transfer must be resubmitted (capacity preallocated).
    resubmit: Vec<u32>,
    iopoll: bool,
    defer_taskrun: bool,
    /// The registered buffer set, kept while the ring lives (see `fixed.rs`).
    buffers: Option<FixedBufPool>,
    /// Registered file table (sparse, created by the first `register_files`).
    files: Option<FileTable>,
}

fn token(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl LocalRing {
    /// A ring for at most `capacity` ops in flight (1..=4096), default options.
    pub fn new(capacity: u32) -> io::Result<LocalRing> {
        LocalRing::builder(capacity).build()
    }

    /// Options: IOPOLL, DEFER_TASKRUN.
    pub fn builder(capacity: u32) -> LocalRingBuilder {
        LocalRingBuilder {
            capacity,
            iopoll: false,
            defer_taskrun: false,
            coop_taskrun: true,
        }
    }

    /// The ring's descriptor. It polls readable while completions wait in the completion
    /// queue, so an event loop can sleep in `epoll_wait` on it and then [`LocalRing::pop`]
    /// (a ring built without `coop_taskrun` and without `defer_taskrun`).
    pub fn fd(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.ring.as_raw_fd()
    }

    /// True if the ring was created with `IORING_SETUP_IOPOLL`.
    pub fn is_iopoll(&self) -> bool {
        self.iopoll
    }

    /// True if the ring runs with `IORING_SETUP_DEFER_TASKRUN`.
    pub fn is_defer_taskrun(&self) -> bool {
        self.defer_taskrun
    }

    /// Allocates `count` buffers of `size` bytes (rounded up to 4096, 4096-aligned) and
    /// registers them with this ring, for `Op::ReadFixed`/`Op::WriteFixed`. One set per
    /// ring (a second call fails with `EBUSY`). The memory lives until the ring and every
    /// `FixedBuf` taken from the set are gone.
    pub fn register_buffers(&mut self, count: usize, size: usize) -> io::Result<FixedBufPool> {
        if self.buffers.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let pool = FixedBufPool::new(count, size)?;
        let iovecs = pool.iovecs();
        // SAFETY: the iovecs describe the pool's allocation, kept alive by `self.buffers`
        // for the life of the ring (and by every handle).
        unsafe { self.ring.submitter().register_buffers(&iovecs) }?;
        self.buffers = Some(pool.clone());
        Ok(pool)
    }

    /// Registers `fds` with this ring (a sparse table of `LOCAL_FIXED_FILES` entries is
    /// created on first use) and returns their handles for `FileRef::Fixed`. The caller
    /// keeps owning the descriptors (unregister before closing them).
    pub fn register_files(&mut self, fds: &[RawFd]) -> io::Result<Vec<FixedFile>> {
        if self.files.is_none() {
            self.ring
                .submitter()
                .register_files_sparse(LOCAL_FIXED_FILES as u32)?;
            self.files = Some(FileTable::new(LOCAL_FIXED_FILES));
        }
        let Some(table) = self.files.as_ref() else {
            return Err(io::Error::other("file table missing"));
        };
        let start = table.reserve(fds)?;
        if let Err(e) = self.ring.submitter().register_files_update(start, fds) {
            table.release(start, fds.len());
            return Err(e);
        }
        Ok((0..fds.len() as u32)
            .map(|i| FixedFile(start + i))
            .collect())
    }

    /// Removes registered files (their indexes can be reused).
    pub fn unregister_files(&mut self, files: &[FixedFile]) -> io::Result<()> {
        let Some(table) = self.files.as_ref() else {
            return Ok(());
        };
        for file in files {
            self.ring.submitter().register_files_update(file.0, &[-1])?;
            table.release(file.0, 1);
        }
        Ok(())
    }

    /// Most ops in flight at once.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Ops submitted and not yet returned by [`LocalRing::pop`].
    pub fn in_flight(&self) -> usize {
        self.in_flight + self.ready.len()
    }

    /// Queues `op` (no system call yet; see [`LocalRing::submit`] and
    /// [`LocalRing::wait`]). Fails, handing the op back, when the op is invalid or all
    /// `capacity` slots are in use (pop completions first).
    pub fn push(&mut self, op: Op) -> Result<Token, SubmitError> {
        self.push_inner(op, None)
    }

    /// Like [`LocalRing::push`], with a deadline `timeout` from now that covers the whole
    /// op (every resubmission of a short transfer included): if it has not completed by
    /// then, a linked `IORING_OP_LINK_TIMEOUT` cancels it and it completes with `ETIMEDOUT`
    /// (`io::ErrorKind::TimedOut`); `Completion::transferred` says how much was done.
    pub fn push_with_timeout(&mut self, op: Op, timeout: Duration) -> Result<Token, SubmitError> {
        if self.iopoll {
            return Err(SubmitError::Invalid {
                reason: "linked timeouts are not available on IOPOLL rings",
                op,
            });
        }
        self.push_inner(op, Instant::now().checked_add(timeout))
    }

    fn push_inner(&mut self, op: Op, deadline: Option<Instant>) -> Result<Token, SubmitError> {
        if let Err(reason) = validate(&op) {
            return Err(SubmitError::Invalid { reason, op });
        }
        if self.iopoll && !iopoll_allows(&op) {
            return Err(SubmitError::Invalid {
                reason: "IOPOLL rings accept only reads and writes (O_DIRECT files)",
                op,
            });
        }
        let Some(index) = self.free.pop() else {
            return Err(SubmitError::Invalid {
                reason: "LocalRing is full: pop completions first",
                op,
            });
        };
        let slot = &mut self.slots[index as usize];
        debug_assert_eq!(slot.state, State::Free);
        slot.generation = slot.generation.wrapping_add(1);
        slot.state = State::Running;
        slot.op = Some(op);
        slot.progress = 0;
        slot.result = None;
        slot.statx_valid = false;
        slot.deadline = deadline;
        let user_data = token(index, slot.generation);
        self.in_flight += 1;
        match prepare(slot, user_data) {
            Next::Submit(entry, timeout) => self.push_entries(&entry, timeout.as_ref()),
            Next::Expired => self.finish(index, Err(timed_out())),
        }
        Ok(Token(user_data))
    }

    /// Pushes an op's entry (and its linked timeout: both in the same submission).
    fn push_entries(&mut self, entry: &squeue::Entry, timeout: Option<&squeue::Entry>) {
        loop {
            // SAFETY: the entries point into the slot's op buffers and scratch, which stay in
            // place until the op's final completion is reaped (module invariants).
            let pushed = unsafe {
                let mut sq = self.ring.submission();
                match timeout {
                    None => sq.push(entry).is_ok(),
                    Some(t) => sq.push_multiple(&[entry.clone(), t.clone()]).is_ok(),
                }
            };
            if pushed {
                self.unsubmitted += 1 + usize::from(timeout.is_some());
                return;
            }
            // The submission queue is full: hand what is there to the kernel.
            let _ = self.submit();
        }
    }

    /// Completes slot `index` with `result` (moves it to the ready list; `pop` frees the slot).
    fn finish(&mut self, index: u32, result: io::Result<usize>) {
        let slot = &mut self.slots[index as usize];
        let result = if self.iopoll {
            iopoll_error(result)
        } else {
            result
        };
        slot.statx_valid = result.is_ok() && matches!(slot.op, Some(Op::Statx { .. }));
        let user_data = token(index, slot.generation);
        let completion = take_completion(slot, result);
        // The slot is reused only after `pop` hands this completion out (so a `Token`'s
        // slot is unique among the ops pushed and not yet popped).
        self.ready.push_back((Token(user_data), completion));
        self.in_flight -= 1;
    }

    /// Hands queued entries to the kernel without waiting.
    pub fn submit(&mut self) -> io::Result<usize> {
        let n = self.ring.submit()?;
        self.unsubmitted = self.unsubmitted.saturating_sub(n);
        Ok(n)
    }

    /// Submits queued entries and waits until at least `min_ready` completions are ready to
    /// pop (or nothing is in flight any more). Short transfers are resubmitted internally.
    pub fn wait(&mut self, min_ready: usize) -> io::Result<usize> {
        loop {
            self.reap();
            if self.ready.len() >= min_ready || self.in_flight == 0 {
                if self.unsubmitted > 0 {
                    self.submit()?;
                }
                return Ok(self.ready.len());
            }
            match self.ring.submit_and_wait(1) {
                Ok(n) => self.unsubmitted = self.unsubmitted.saturating_sub(n),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes one finished op, if any.
    pub fn pop(&mut self) -> Option<(Token, Completion)> {
        if self.ready.is_empty() {
            self.reap();
        }
        let (token, completion) = self.ready.pop_front()?;
        self.free.push(token.slot() as u32);
        Some((token, completion))
    }

    /// Moves every available kernel completion into the ready list (or resubmits).
    fn reap(&mut self) {
        loop {
            self.resubmit.clear();
            let mut finished: Option<(u32, io::Result<usize>)>;
            loop {
                finished = None;
                let Some(cqe) = self.ring.completion().next() else {
                    break;
                };
                let user_data = cqe.user_data();
                if user_data == u64::MAX || user_data & LINK_TIMEOUT_BIT != 0 {
                    // Drop-time cancels and linked timeouts: the op's own CQE decides.
                    continue;
                }
                let index = (user_data & 0xffff_ffff) as u32;
                let generation = (user_data >> 32) as u32;
                let Some(slot) = self.slots.get_mut(index as usize) else {
                    continue;
                };
                if slot.generation != generation || slot.state != State::Running {
                    debug_assert!(false, "completion for a slot not in flight");
                    continue;
                }
                let Some(op) = slot.op.as_ref() else { continue };
                let res = i64::from(cqe.result());
                match on_result_deadline(op, &mut slot.progress, res, slot.deadline) {
                    Outcome::Resubmit => self.resubmit.push(index),
                    Outcome::Done(result) => finished = Some((index, result)),
                }
                if let Some((index, result)) = finished.take() {
                    self.finish(index, result);
                }
            }
            if self.resubmit.is_empty() {
                return;
            }
            for i in 0..self.resubmit.len() {
                let index = self.resubmit[i];
                let slot = &mut self.slots[index as usize];
                match prepare(slot, token(index, slot.generation)) {
                    Next::Submit(entry, timeout) => self.push_entries(&entry, timeout.as_ref()),
                    Next::Expired => self.finish(index, Err(timed_out())),
                }
            }
            let _ = self.submit();
        }
    }
}

/// Moves the result and the op's buffers out of a finished slot and frees it.
fn take_completion(slot: &mut SlotInner, result: io::Result<usize>) -> Completion {
    let statx = slot.statx_valid.then_some(slot.scratch.statx);
    let completion = Completion::from_op(slot.op.take(), result, slot.progress, statx);
    slot.state = State::Free;
    slot.progress = 0;
    slot.statx_valid = false;
    completion
}

impl Drop for LocalRing {
    fn drop(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        // Hand everything queued to the kernel, then cancel whatever is in flight and wait
        // until the kernel is done with every buffer. A cancel can race with an op that is
        // not armed yet, so it is repeated (every 10 ms, for up to 10 s).
        let _ = self.submit();
        for _ in 0..1000 {
            let cancel = io_uring::opcode::AsyncCancel2::new(io_uring::types::CancelBuilder::any())
                .build()
                .user_data(u64::MAX);
            // SAFETY: the cancel entry points at no memory of ours.
            let _ = unsafe { self.ring.submission().push(&cancel) };
            let timeout = io_uring::types::Timespec::new().nsec(10_000_000);
            let args = io_uring::types::SubmitArgs::new().timespec(&timeout);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            for cqe in self.ring.completion() {
                if cqe.user_data() != u64::MAX && cqe.user_data() & LINK_TIMEOUT_BIT == 0 {
                    self.in_flight = self.in_flight.saturating_sub(1);
                }
            }
            if self.in_flight == 0 {
                return;
            }
        }
        // The kernel still holds buffers: never free memory it may write into.
        std::mem::forget(std::mem::take(&mut self.slots));
    }
}
