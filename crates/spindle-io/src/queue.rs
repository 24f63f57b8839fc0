//! The staging queue of one ring: bounded, many producers (any caller thread), one consumer
//! (the ring's submitter thread, or the worker threads of the fallback backend).
//!
//! Invariants:
//! - `fresh.len() <= capacity`: a full queue blocks the submitter (backpressure); nothing is
//!   ever dropped.
//! - `resubmit` holds requests that are already counted in flight (remainders of short
//!   transfers in two-thread mode); its length is bounded by the in-flight bound, and its
//!   capacity is reserved up front, so pushing never allocates and never blocks.
//! - Both deques are preallocated: pushing and popping never allocates.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::slab::lock;

pub(crate) struct QueueInner {
    pub(crate) fresh: VecDeque<u32>,
    pub(crate) resubmit: VecDeque<u32>,
    /// No new submissions accepted; drain and stop.
    pub(crate) closed: bool,
    /// The single-thread ring thread is (about to be) blocked in the kernel and must be
    /// woken through the eventfd when work arrives.
    pub(crate) sleeping: bool,
}

pub(crate) struct StagingQueue {
    pub(crate) inner: Mutex<QueueInner>,
    pub(crate) not_empty: Condvar,
    pub(crate) not_full: Condvar,
    pub(crate) capacity: usize,
    /// Mirror of `fresh.len()` for statistics.
    pub(crate) depth: AtomicUsize,
    /// Requests handed to the kernel or a worker, not yet completed (statistics and the
    /// two-thread in-flight bound).
    pub(crate) in_flight: AtomicUsize,
    /// Eventfd the single-thread ring waits on together with its completions.
    pub(crate) wake_fd: Option<OwnedFd>,
}

impl StagingQueue {
    pub(crate) fn new(capacity: usize, resubmit_capacity: usize, wake_fd: Option<OwnedFd>) -> Self {
        StagingQueue {
            inner: Mutex::new(QueueInner {
                fresh: VecDeque::with_capacity(capacity),
                resubmit: VecDeque::with_capacity(resubmit_capacity),
                closed: false,
                sleeping: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            capacity,
            depth: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            wake_fd,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, QueueInner> {
        lock(&self.inner)
    }

    /// Appends a request, blocking while the queue is full. Returns false (and does not
    /// enqueue) if the queue is closed.
    pub(crate) fn push(&self, index: u32) -> bool {
        let mut inner = self.lock();
        while inner.fresh.len() >= self.capacity && !inner.closed {
            inner = self.not_full.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        if inner.closed {
            return false;
        }
        inner.fresh.push_back(index);
        self.depth.store(inner.fresh.len(), Relaxed);
        self.wake_locked(&mut inner);
        true
    }

    /// Queues the remainder of a short transfer (two-thread mode; never blocks).
    pub(crate) fn push_resubmit(&self, index: u32) {
        let mut inner = self.lock();
        assert!(
            inner.resubmit.len() < inner.resubmit.capacity(),
            "resubmit queue beyond the in-flight bound"
        );
        inner.resubmit.push_back(index);
        self.wake_locked(&mut inner);
    }

    /// Wakes the consumer after new work arrived (called with the lock held).
    pub(crate) fn wake_locked(&self, inner: &mut QueueInner) {
        self.not_empty.notify_one();
        if inner.sleeping {
            inner.sleeping = false;
            self.kick();
        }
    }

    /// Writes the eventfd (single-thread ring) so a thread blocked in the kernel wakes up.
    pub(crate) fn kick(&self) {
        if let Some(fd) = &self.wake_fd {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A failure can only
            // be EAGAIN (counter saturated), which still leaves the eventfd readable.
            unsafe {
                libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }

    /// Closes the queue: submitters get an error, blocked ones wake up, the consumer drains.
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.sleeping = false;
        drop(inner);
        self.not_full.notify_all();
        self.not_empty.notify_all();
        self.kick();
    }

    /// Waits on `not_empty` with a timeout.
    pub(crate) fn wait_not_empty<'a>(
        &self,
        guard: MutexGuard<'a, QueueInner>,
        timeout: Duration,
    ) -> MutexGuard<'a, QueueInner> {
        match self.not_empty.wait_timeout(guard, timeout) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }
}
