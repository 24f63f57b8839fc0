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
use std::time::Instant;

use io_uring::IoUring;

use crate::error::SubmitError;
use crate::exec::{build_sqe, on_result, validate, Outcome};
use crate::op::{Completion, Op};
use crate::slab::{SlotInner, State};

/// Identifies an op submitted to a [`LocalRing`]; returned with its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u64);

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
}

fn token(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl LocalRing {
    /// A ring for at most `capacity` ops in flight (1..=4096).
    pub fn new(capacity: u32) -> io::Result<LocalRing> {
        if !(1..=4096).contains(&capacity) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "LocalRing capacity must be 1..=4096",
            ));
        }
        // One thread submits and reaps: tell the kernel (no inter-processor interrupts for
        // completions, single-issuer fast paths). Older kernels lack these flags: retry
        // without them.
        let ring = match IoUring::builder()
            .setup_cqsize(2 * capacity)
            .setup_coop_taskrun()
            .setup_single_issuer()
            .build(capacity)
        {
            Ok(ring) => ring,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder()
                .setup_cqsize(2 * capacity)
                .build(capacity)?,
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
        })
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
        if let Err(reason) = validate(&op) {
            return Err(SubmitError::Invalid { reason, op });
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
        let user_data = token(index, slot.generation);
        let entry = build_sqe(slot, user_data);
        self.push_entry(&entry);
        self.in_flight += 1;
        Ok(Token(user_data))
    }

    fn push_entry(&mut self, entry: &io_uring::squeue::Entry) {
        loop {
            // SAFETY: the entry points into the slot's op buffers and scratch, which stay in
            // place until the op's final completion is reaped (module invariants).
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                self.unsubmitted += 1;
                return;
            }
            // The submission queue is full: hand what is there to the kernel.
            let _ = self.submit();
        }
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
        self.ready.pop_front()
    }

    /// Moves every available kernel completion into the ready list (or resubmits).
    fn reap(&mut self) {
        loop {
            self.resubmit.clear();
            for cqe in self.ring.completion() {
                let user_data = cqe.user_data();
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
                match on_result(op, &mut slot.progress, i64::from(cqe.result())) {
                    Outcome::Resubmit => self.resubmit.push(index),
                    Outcome::Done(result) => {
                        slot.statx_valid = result.is_ok() && matches!(op, Op::Statx { .. });
                        let completion = take_completion(slot, result);
                        self.ready.push_back((Token(user_data), completion));
                        self.free.push(index);
                        self.in_flight -= 1;
                    }
                }
            }
            if self.resubmit.is_empty() {
                return;
            }
            for i in 0..self.resubmit.len() {
                let index = self.resubmit[i];
                let slot = &mut self.slots[index as usize];
                let entry = build_sqe(slot, token(index, slot.generation));
                self.push_entry(&entry);
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
                if cqe.user_data() != u64::MAX {
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
