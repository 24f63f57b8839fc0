//! The request slab: pre-allocated metadata slots, and `Request`, the caller's handle to one.
//!
//! Invariants:
//! - The slab is allocated once (`Box<[Slot]>`); slots never move, so addresses inside a
//!   slot's heap scratch (`SlotScratch`) can be given to the kernel.
//! - A slot is owned by exactly one party at a time: the free list, or a live request. A
//!   live request's slot returns to the free list only when both (a) the operation has
//!   completed and (b) the `Request` handle was consumed or dropped. So memory the kernel may
//!   still touch (the op's buffers, the scratch) is never freed or reused early.
//! - `generation` changes every time a slot is handed out; the user_data of every kernel
//!   submission carries it, and stale completions are detected by assertion.
//! - Steady state allocates nothing: slots, free list and scratch are preallocated; the
//!   scratch iovec vector only grows (to at most `IOV_MAX` entries) and is never shrunk.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::op::{Completion, Op};
use crate::stats::Counters;

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Free,
    /// In a staging queue (may still be cancelled by the thread backend without running).
    Queued,
    /// Handed to the kernel or a worker thread.
    Running,
    Done,
}

/// Per-slot memory the kernel reads or writes, kept on the heap at a fixed address.
pub(crate) struct SlotScratch {
    pub(crate) statx: libc::statx,
    pub(crate) sockaddr: libc::sockaddr_storage,
    pub(crate) sockaddr_len: libc::socklen_t,
    pub(crate) timespec: io_uring::types::Timespec,
    /// Relative timeout of the linked `IORING_OP_LINK_TIMEOUT` (per-request deadline).
    pub(crate) link_timespec: io_uring::types::Timespec,
}

pub(crate) struct SlotInner {
    pub(crate) generation: u32,
    pub(crate) state: State,
    /// Ring (or worker queue) the request was sent to; cancellation goes to the same ring.
    pub(crate) ring: usize,
    /// The operation, holding every buffer, while the request is live and not yet taken.
    pub(crate) op: Option<Op>,
    /// Bytes already transferred by earlier (short) submissions.
    pub(crate) progress: usize,
    pub(crate) result: Option<io::Result<usize>>,
    pub(crate) statx_valid: bool,
    pub(crate) waker: Option<Waker>,
    /// The `Request` was dropped: free the slot as soon as the op completes.
    pub(crate) detached: bool,
    /// Set by a cancellation that reached the request before a worker started it.
    pub(crate) cancelled: bool,
    pub(crate) submitted_at: Instant,
    /// Per-request deadline (`submit_with_timeout`), covering every resubmission.
    pub(crate) deadline: Option<Instant>,
    /// iovecs for readv/writev (rebuilt at each submission from `progress`).
    pub(crate) iovecs: Vec<libc::iovec>,
    pub(crate) scratch: Box<SlotScratch>,
}

impl SlotInner {
    /// A free slot with its scratch space allocated (done once, at start-up).
    pub(crate) fn empty(now: Instant) -> SlotInner {
        SlotInner {
            generation: 0,
            state: State::Free,
            ring: 0,
            op: None,
            progress: 0,
            result: None,
            statx_valid: false,
            waker: None,
            detached: false,
            cancelled: false,
            submitted_at: now,
            deadline: None,
            iovecs: Vec::new(),
            scratch: Box::new(SlotScratch {
                // SAFETY: statx and sockaddr_storage are plain C structs for which all-zero
                // bytes are a valid value.
                statx: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                sockaddr: unsafe { std::mem::zeroed() },
                sockaddr_len: 0,
                timespec: io_uring::types::Timespec::new(),
                link_timespec: io_uring::types::Timespec::new(),
            }),
        }
    }
}

// SAFETY: the raw pointers in `iovecs` point into buffers owned by `op` in the same slot; the
// slot is only accessed under its mutex, so moving access between threads is sound.
unsafe impl Send for SlotInner {}

pub(crate) struct Slot {
    pub(crate) inner: Mutex<SlotInner>,
    pub(crate) done: Condvar,
}

pub(crate) struct Slab {
    slots: Box<[Slot]>,
    free: Mutex<Vec<u32>>,
    free_available: Condvar,
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data
/// consistent before any operation that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Slab {
    pub(crate) fn new(capacity: usize) -> Slab {
        assert!(capacity > 0 && capacity <= u32::MAX as usize);
        let now = Instant::now();
        let slots = (0..capacity)
            .map(|_| Slot {
                inner: Mutex::new(SlotInner::empty(now)),
                done: Condvar::new(),
            })
            .collect();
        Slab {
            slots,
            free: Mutex::new((0..capacity as u32).rev().collect()),
            free_available: Condvar::new(),
        }
    }

    pub(crate) fn slot(&self, index: u32) -> &Slot {
        &self.slots[index as usize]
    }

    /// Takes a free slot, blocking while none is free (backpressure on submitters).
    pub(crate) fn alloc(&self) -> u32 {
        let mut free = lock(&self.free);
        loop {
            if let Some(index) = free.pop() {
                return index;
            }
            free = self
                .free_available
                .wait(free)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Returns a slot to the free list. The caller has reset the slot under its lock.
    fn release(&self, index: u32) {
        let mut free = lock(&self.free);
        assert!(free.len() < self.slots.len(), "slab free list overflow");
        free.push(index);
        drop(free);
        self.free_available.notify_one();
    }

    /// Records the final result of a running request and wakes whoever waits on it.
    /// Frees the slot (dropping the op and its buffers) if the handle was dropped.
    pub(crate) fn complete(
        &self,
        counters: &Counters,
        index: u32,
        result: io::Result<usize>,
        statx_valid: bool,
    ) {
        let slot = self.slot(index);
        let mut inner = lock(&slot.inner);
        assert!(
            matches!(inner.state, State::Running | State::Queued),
            "completing a request in state {:?}",
            inner.state
        );
        let latency_ns = inner.submitted_at.elapsed().as_nanos();
        counters
            .latency
            .record(u64::try_from(latency_ns).unwrap_or(u64::MAX));
        counters
            .completed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if inner.detached {
            reset(&mut inner);
            drop(inner);
            self.release(index);
            return;
        }
        inner.state = State::Done;
        inner.result = Some(result);
        inner.statx_valid = statx_valid;
        let waker = inner.waker.take();
        drop(inner);
        slot.done.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

fn reset(inner: &mut SlotInner) {
    inner.state = State::Free;
    inner.op = None;
    inner.result = None;
    inner.waker = None;
    inner.progress = 0;
    inner.detached = false;
    inner.cancelled = false;
    inner.statx_valid = false;
    inner.deadline = None;
    inner.iovecs.clear();
}

/// What the slab and a request need from the engine.
pub(crate) struct SlabOwner {
    pub(crate) slab: Slab,
    pub(crate) counters: Counters,
    /// Registered file table (the thread pool resolves fixed files through it).
    pub(crate) files: crate::fixed::FileTable,
}

/// A submitted operation. Poll it, wait on it, or `.await` it; its `Completion` hands back
/// every buffer of the op. Dropping it before completion is safe: the op (and its buffers)
/// stays in the engine until the kernel is done, then is freed.
pub struct Request {
    pub(crate) owner: Arc<SlabOwner>,
    pub(crate) index: u32,
    pub(crate) generation: u32,
    /// The completion was taken; the slot is already free.
    pub(crate) taken: bool,
}

impl Request {
    /// The `user_data` of this request's kernel submissions.
    pub(crate) fn user_data(&self) -> u64 {
        user_data(self.index, self.generation)
    }

    fn slot(&self) -> &Slot {
        self.owner.slab.slot(self.index)
    }

    /// True once the operation has finished (never blocks for I/O).
    pub fn is_done(&self) -> bool {
        if self.taken {
            return true;
        }
        lock(&self.slot().inner).state == State::Done
    }

    /// Takes the completion if the operation has finished.
    pub fn try_take(&mut self) -> Option<Completion> {
        if self.taken {
            return None;
        }
        let owner = &*self.owner;
        let mut inner = lock(&owner.slab.slot(self.index).inner);
        if inner.state != State::Done {
            return None;
        }
        let completion = take_locked(owner, self.index, self.generation, &mut inner);
        self.taken = true;
        Some(completion)
    }

    /// Blocks until the operation has finished, then returns its completion.
    ///
    /// # Panics
    /// If the completion was already taken.
    pub fn wait(mut self) -> Completion {
        self.wait_done();
        match self.try_take() {
            Some(c) => c,
            None => panic!("Request::wait after the completion was taken"),
        }
    }

    /// Blocks until the operation has finished (the completion stays in the request).
    pub(crate) fn wait_done(&self) {
        if self.taken {
            return;
        }
        let slot = self.slot();
        let mut inner = lock(&slot.inner);
        while inner.state != State::Done {
            inner = slot.done.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Moves the result and the op's buffers out of a done slot and frees the slot.
fn take_locked(
    owner: &SlabOwner,
    index: u32,
    generation: u32,
    inner: &mut SlotInner,
) -> Completion {
    {
        assert_eq!(
            inner.generation, generation,
            "request/slot generation mismatch"
        );
        assert_eq!(inner.state, State::Done);
        let result = inner.result.take().unwrap_or_else(|| {
            Err(io::Error::other(
                "spindle-io: completion without result (bug)",
            ))
        });
        let transferred = inner.progress;
        let statx = inner.statx_valid.then_some(inner.scratch.statx);
        let completion = Completion::from_op(inner.op.take(), result, transferred, statx);
        reset(inner);
        owner.slab.release(index);
        completion
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let mut inner = lock(&self.slot().inner);
        assert_eq!(
            inner.generation, self.generation,
            "request/slot generation mismatch"
        );
        if inner.state == State::Done {
            reset(&mut inner);
            drop(inner);
            self.owner.slab.release(self.index);
        } else {
            // The kernel (or a worker) may still use the op's buffers: keep them in the
            // slot; `Slab::complete` frees the slot when the operation finishes.
            inner.detached = true;
            inner.waker = None;
        }
    }
}

impl Future for Request {
    type Output = Completion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completion> {
        let this = self.get_mut();
        assert!(!this.taken, "Request polled after completion");
        let owner = &*this.owner;
        let mut inner = lock(&owner.slab.slot(this.index).inner);
        if inner.state == State::Done {
            let completion = take_locked(owner, this.index, this.generation, &mut inner);
            this.taken = true;
            return Poll::Ready(completion);
        }
        match &inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => inner.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("index", &self.index)
            .field("generation", &self.generation)
            .field("done", &self.is_done())
            .finish()
    }
}

pub(crate) fn user_data(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

pub(crate) fn split_user_data(user_data: u64) -> (u32, u32) {
    (user_data as u32, (user_data >> 32) as u32)
}
