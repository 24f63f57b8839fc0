//! `reactor`: a [`LocalRing`] owned by the thread of a tokio current-thread runtime, so an
//! async task submits its disk I/O itself and its completion wakes it on the same thread:
//! no hand-off to a ring thread and back (the [`crate::Engine`] costs two thread wake-ups
//! per request; on a loaded 2-core machine that was a quarter of a 4 KiB read's time in a
//! storage daemon, `docs/benchmarks.md`).
//!
//! [`install`] creates the thread's ring (without cooperative task running, so a completion
//! wakes the thread while it sleeps in `epoll_wait`), registers the ring's descriptor with
//! the runtime (readable while completions wait) and spawns the task that reaps them.
//! [`submit`] queues an op on the calling thread's ring and enters the kernel at once; it
//! hands the op back when this thread has no ring or the ring is full, and the caller then
//! uses the engine (a thread that never installed a ring - the store's worker, blocking
//! helpers - keeps the engine path).
//!
//! Invariants: the ring and its bookkeeping never leave their thread (thread-local); a
//! [`LocalRequest`] only shares its completion slot (so futures holding one stay `Send`);
//! an op's buffers stay with the ring until its final completion even if its request is
//! dropped (the completion is then dropped on arrival); dropping the ring at thread exit
//! cancels and waits for whatever is still in flight (`LocalRing`'s `Drop`).

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::{Handle, RuntimeFlavor};

use crate::{Completion, LocalRing, Op, SubmitError};

/// Ops one thread's ring keeps in flight; more go to the engine.
pub const REACTOR_OPS_IN_FLIGHT_MAX: u32 = 256;

// One per request, inside its `Arc` (one allocation either way); boxing the completion
// would add a second.
#[allow(clippy::large_enum_variant)]
enum SlotState {
    Waiting(Option<Waker>),
    Done(Completion),
    Taken,
}

struct Slot {
    state: Mutex<SlotState>,
}

impl Slot {
    fn complete(&self, c: Completion) {
        let waker = {
            let mut st = crate::slab::lock(&self.state);
            match std::mem::replace(&mut *st, SlotState::Done(c)) {
                SlotState::Waiting(w) => w,
                other => {
                    debug_assert!(false, "a slot completed twice");
                    *st = other;
                    None
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct Local {
    ring: LocalRing,
    /// The request waiting for each ring slot (indexed by `Token::slot`).
    waiting: Vec<Option<Arc<Slot>>>,
    /// Ops submitted on this ring so far.
    submitted: u64,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
}

/// Installs a ring on this thread. Must run inside a current-thread tokio runtime (on a
/// multi-threaded one a task moves between threads and would wait on another thread's
/// ring: nothing is installed and `Ok(false)` returned). `Ok(false)` too if this thread
/// has one already.
pub fn install() -> io::Result<bool> {
    let handle = Handle::try_current().map_err(io::Error::other)?;
    if handle.runtime_flavor() != RuntimeFlavor::CurrentThread {
        return Ok(false);
    }
    if LOCAL.with(|l| l.borrow().is_some()) {
        return Ok(false);
    }
    let ring = LocalRing::builder(REACTOR_OPS_IN_FLIGHT_MAX)
        .coop_taskrun(false)
        .build()?;
    // The runtime watches a duplicate of the ring's descriptor (the same open ring), owned
    // by the `AsyncFd`: it stays open for as long as it is registered, whatever the order
    // in which the runtime and this thread's ring go away.
    // SAFETY: `ring.fd()` is open for the duration of the call (the ring is alive).
    let dup = unsafe { BorrowedFd::borrow_raw(ring.fd()) }.try_clone_to_owned()?;
    // SAFETY: the `AsyncFd` owns `dup`, so the descriptor stays valid until it is dropped.
    let fd = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE)? };
    let slots = ring.capacity();
    LOCAL.with(|l| {
        *l.borrow_mut() = Some(Local {
            ring,
            waiting: (0..slots).map(|_| None).collect(),
            submitted: 0,
        })
    });
    handle.spawn(drive(fd));
    Ok(true)
}

/// Whether this thread has a ring.
pub fn installed() -> bool {
    LOCAL.with(|l| l.borrow().is_some())
}

/// Ops submitted on this thread's ring so far (0 without one).
pub fn ops_submitted() -> u64 {
    LOCAL.with(|l| l.borrow().as_ref().map_or(0, |local| local.submitted))
}

/// Reaps completions whenever the ring's descriptor polls readable.
async fn drive(fd: AsyncFd<OwnedFd>) {
    loop {
        match fd.readable().await {
            Ok(mut ready) => ready.clear_ready(),
            Err(e) => {
                // Not expected for an io_uring descriptor; keep reaping on a timer rather
                // than strand requests.
                debug_assert!(false, "ring descriptor poll failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        reap();
    }
}

/// Hands every finished op to its request (and submits anything still queued).
fn reap() {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let Some(local) = l.as_mut() else { return };
        let _ = local.ring.wait(0);
        while let Some((token, completion)) = local.ring.pop() {
            if let Some(slot) = local.waiting.get_mut(token.slot()).and_then(Option::take) {
                slot.complete(completion);
            }
        }
    });
}

/// Queues `op` on this thread's ring and submits it. Hands the op back if this thread has
/// no ring, the ring is full or the op is not valid there (the caller then uses the
/// engine, which reports invalid ops).
pub fn submit(op: Op) -> Result<LocalRequest, Op> {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let Some(local) = l.as_mut() else {
            return Err(op);
        };
        if local.ring.in_flight() >= local.ring.capacity() {
            return Err(op);
        }
        let token = local.ring.push(op).map_err(SubmitError::into_op)?;
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::Waiting(None)),
        });
        local.waiting[token.slot()] = Some(slot.clone());
        local.submitted += 1;
        // An error here leaves the entry queued; the next reap submits it.
        let _ = local.ring.submit();
        Ok(LocalRequest { slot })
    })
}

/// An op submitted with [`submit`]; resolves to its completion.
pub struct LocalRequest {
    slot: Arc<Slot>,
}

impl LocalRequest {
    /// Waits on the calling thread (which must be the ring's) without a runtime: reaps
    /// until this op completed.
    pub fn wait(self) -> Completion {
        loop {
            {
                let mut st = crate::slab::lock(&self.slot.state);
                if let SlotState::Done(_) = &*st {
                    if let SlotState::Done(c) = std::mem::replace(&mut *st, SlotState::Taken) {
                        return c;
                    }
                }
            }
            let waited = LOCAL.with(|l| {
                let mut l = l.borrow_mut();
                l.as_mut().map(|local| local.ring.wait(1))
            });
            // No ring on this thread: the request cannot have come from it.
            assert!(waited.is_some(), "LocalRequest::wait off the ring's thread");
            reap();
        }
    }
}

impl Future for LocalRequest {
    type Output = Completion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Completion> {
        let mut st = crate::slab::lock(&self.slot.state);
        match std::mem::replace(&mut *st, SlotState::Taken) {
            SlotState::Done(c) => Poll::Ready(c),
            SlotState::Waiting(_) => {
                *st = SlotState::Waiting(Some(cx.waker().clone()));
                Poll::Pending
            }
            SlotState::Taken => panic!("LocalRequest polled after completion"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBuf;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn temp_file(bytes: &[u8]) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!(
            "spindle-io-reactor-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
        (path.clone(), std::fs::File::open(&path).unwrap())
    }

    #[test]
    fn reads_complete_on_the_runtime_thread_and_many_at_once() {
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let (path, file) = temp_file(&data);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(install().unwrap());
            assert!(!install().unwrap(), "a second install is refused");
            assert!(installed());
            // More than the ring holds: the rest is handed back for the engine.
            let mut reqs = Vec::new();
            let mut handed_back = 0;
            for i in 0..(REACTOR_OPS_IN_FLIGHT_MAX as u64 + 10) {
                let off = (i * 3_989) % 990_000;
                match submit(Op::read(file.as_raw_fd(), off, IoBuf::zeroed(4096))) {
                    Ok(r) => reqs.push((off, r)),
                    Err(_) => handed_back += 1,
                }
            }
            assert_eq!(handed_back, 10);
            // Some requests are dropped before they complete: their buffers stay with the
            // ring, the others still complete.
            let kept: Vec<_> = reqs
                .into_iter()
                .enumerate()
                .filter_map(|(i, r)| (i % 5 != 0).then_some(r))
                .collect();
            for (off, r) in kept {
                let c = r.await;
                let n = c.ok().unwrap();
                assert_eq!(n, 4096);
                let buf = c.buf.unwrap();
                assert_eq!(&buf.into_vec()[..n], &data[off as usize..off as usize + n]);
            }
            // Spawned tasks (Send futures) complete too, on the same thread.
            let fd = file.as_raw_fd();
            let expect = data[4096..8192].to_vec();
            let t = tokio::spawn(async move {
                let r = submit(Op::read(fd, 4096, IoBuf::zeroed(4096)))
                    .ok()
                    .unwrap();
                r.await.buf.unwrap().into_vec()
            });
            assert_eq!(t.await.unwrap(), expect);
            // Errors come back as errors.
            let c = submit(Op::read(-1, 0, IoBuf::zeroed(10)))
                .ok()
                .unwrap()
                .await;
            assert!(c.ok().is_err());
        });
        drop(rt);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn no_ring_without_a_current_thread_runtime() {
        assert!(install().is_err(), "outside a runtime");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async { assert!(!install().unwrap()) });
        assert!(submit(Op::read(0, 0, crate::IoBuf::zeroed(1))).is_err());
    }
}
