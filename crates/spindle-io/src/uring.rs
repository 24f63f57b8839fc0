//! The io_uring backend: one ring per staging queue, driven by one thread (submit and
//! complete) or two (a submitter and a completer).
//!
//! Invariants:
//! - At most `in_flight_max` requests of a ring are in the kernel at once, and the rings are
//!   sized `sq >= in_flight_max + CONTROL_SQES`, `cq = 2 * sq`: the completion queue cannot
//!   overflow (control entries: the eventfd wake-up read and the shutdown cancel).
//! - A request's remainder (short transfer) stays counted in flight until it is done.
//! - Only the submitting thread touches the SQ and only the completing thread the CQ.
//! - The ring outlives every submission that points into memory it does not own: a ring
//!   thread exits only when nothing is in flight, including its own wake-up read.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};

use crate::exec::{on_result_deadline, prepare, timed_out, Next, Outcome, LINK_TIMEOUT_BIT};
use crate::op::{InternalKind, InternalOp, Op};
use crate::queue::StagingQueue;
use crate::slab::{lock, split_user_data, user_data, SlabOwner, State};

/// Extra SQ/CQ entries reserved for control submissions.
pub(crate) const CONTROL_SQES: usize = 2;
/// `user_data` of control submissions carry slot index `u32::MAX` (never a real slot).
const WAKE_TAG: u64 = user_data_tag(1);
const CANCEL_TAG: u64 = user_data_tag(2);
const EXIT_TAG: u64 = user_data_tag(3);
/// `IORING_ENTER_GETEVENTS` from the kernel ABI.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// How often a draining ring re-checks its grace deadline.
const DRAIN_TICK: Duration = Duration::from_millis(5);

const fn user_data_tag(n: u32) -> u64 {
    ((n as u64) << 32) | u32::MAX as u64
}

/// Parameters of one ring, given to the ring factory.
#[derive(Debug, Clone)]
pub struct RingSetup {
    /// Ring number (0-based).
    pub index: usize,
    /// Submission queue entries (a power of two).
    pub sq_entries: u32,
    /// Completion queue entries (twice `sq_entries`).
    pub cq_entries: u32,
    /// Kernel submission-queue polling with this idle time (`IORING_SETUP_SQPOLL`).
    pub sqpoll_idle: Option<Duration>,
    /// One thread submits and reaps: the ring may use `SINGLE_ISSUER` (created disabled;
    /// the ring thread enables it and becomes its only issuer).
    pub single_issuer: bool,
    /// Polled completions (`IORING_SETUP_IOPOLL`, `Config::iopoll`).
    pub iopoll: bool,
}

/// Creates io_uring instances; injectable so tests can force failures.
pub type RingFactory = Arc<dyn Fn(&RingSetup) -> io::Result<IoUring> + Send + Sync>;

/// The default factory: `io_uring_setup` with the given sizes and options.
pub fn default_ring_factory() -> RingFactory {
    Arc::new(|setup: &RingSetup| {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(setup.cq_entries);
        if setup.iopoll {
            builder.setup_iopoll();
        }
        if let Some(idle) = setup.sqpoll_idle {
            builder.setup_sqpoll(u32::try_from(idle.as_millis()).unwrap_or(u32::MAX));
        } else {
            // Task work runs when the ring thread enters the kernel anyway: no IPIs.
            builder.setup_coop_taskrun();
            if setup.single_issuer {
                builder.setup_single_issuer().setup_r_disabled();
            }
        }
        builder.build(setup.sq_entries)
    })
}

pub(crate) struct RingCtx {
    pub(crate) owner: Arc<SlabOwner>,
    pub(crate) queue: Arc<StagingQueue>,
    pub(crate) in_flight_max: usize,
    pub(crate) shutdown_grace: Duration,
    /// Single-thread rings: how long to poll for work before sleeping after a busy round.
    pub(crate) idle_spin: Duration,
    /// The ring was created with `IORING_SETUP_IOPOLL` (see `run_single_iopoll`).
    pub(crate) iopoll: bool,
}

/// The submission(s) of one request: the op and, with a deadline, its linked timeout.
type Sqes = (squeue::Entry, Option<squeue::Entry>);

/// True for the CQE of a request's linked timeout (ignored: the op's own CQE decides).
fn is_link_timeout(ud: u64) -> bool {
    (ud as u32) != u32::MAX && ud & LINK_TIMEOUT_BIT != 0
}

/// What happened to a request after one completion.
enum After {
    Finished,
    /// Short transfer; the entries for the remainder (single-thread mode builds them at once).
    Resubmit(Option<Sqes>),
}

/// Applies one completion to its slot.
fn on_cqe(ctx: &RingCtx, ud: u64, res: i32, build_now: bool) -> After {
    let (index, generation) = split_user_data(ud);
    let owner = &ctx.owner;
    let slot = owner.slab.slot(index);
    let mut inner = lock(&slot.inner);
    assert_eq!(
        inner.generation, generation,
        "completion for a recycled slot"
    );
    assert_eq!(
        inner.state,
        State::Running,
        "completion for a request not running"
    );
    let mut progress = inner.progress;
    let deadline = inner.deadline;
    let mut outcome = match inner.op.as_ref() {
        Some(op) => on_result_deadline(op, &mut progress, i64::from(res), deadline),
        None => Outcome::Done(Err(io::Error::other("spindle-io: slot without op (bug)"))),
    };
    inner.progress = progress;
    if matches!(outcome, Outcome::Resubmit) {
        owner.counters.resubmitted.fetch_add(1, Relaxed);
        if !build_now {
            return After::Resubmit(None);
        }
        match prepare(&mut inner, ud) {
            Next::Submit(a, b) => return After::Resubmit(Some((a, b))),
            Next::Expired => outcome = Outcome::Done(Err(timed_out())),
        }
    }
    match outcome {
        Outcome::Resubmit => After::Resubmit(None),
        Outcome::Done(result) => {
            let result = if ctx.iopoll {
                crate::exec::iopoll_error(result)
            } else {
                result
            };
            let statx_valid =
                result.is_ok() && matches!(inner.op, Some(crate::op::Op::Statx { .. }));
            drop(inner);
            owner
                .slab
                .complete(&owner.counters, index, result, statx_valid);
            After::Finished
        }
    }
}

/// Marks a staged (or short-transferred) request running and builds its submission(s).
/// Returns `None` when the request completed right here: registration ops (run by this,
/// the ring's issuing thread) and requests whose deadline has already passed.
fn start(ctx: &RingCtx, ring: &IoUring, index: u32) -> Option<Sqes> {
    let owner = &ctx.owner;
    let slot = owner.slab.slot(index);
    let mut inner = lock(&slot.inner);
    if inner.state == State::Queued {
        inner.state = State::Running;
    }
    let result = if let Some(Op::Internal(InternalOp(kind))) = inner.op.as_ref() {
        register(ring, kind)
    } else {
        let ud = user_data(index, inner.generation);
        match prepare(&mut inner, ud) {
            Next::Submit(a, b) => return Some((a, b)),
            Next::Expired => Err(timed_out()),
        }
    };
    drop(inner);
    owner.slab.complete(&owner.counters, index, result, false);
    None
}

/// Runs a registration on this ring (`io_uring_register`; the caller is the ring's issuer).
pub(crate) fn register(ring: &IoUring, kind: &InternalKind) -> io::Result<usize> {
    match kind {
        InternalKind::RegisterBuffers(pool) => {
            let iovecs = pool.iovecs();
            // SAFETY: the iovecs describe the pool's allocation, which outlives the ring's
            // use of it (the engine keeps the pool until its rings are closed, and every
            // op using a buffer owns a handle that keeps the memory alive).
            unsafe { ring.submitter().register_buffers(&iovecs) }?;
            Ok(0)
        }
        InternalKind::UpdateFiles { offset, fds } => {
            ring.submitter().register_files_update(*offset, fds)
        }
    }
}

/// Pushes one entry, submitting first if the SQ is full (it cannot be, by the sizing
/// invariant, unless an SQPOLL thread lags; then submitting makes room).
fn push(ring: &IoUring, entry: &squeue::Entry) {
    loop {
        // SAFETY: this thread is the only SQ user (module invariant); the entry's pointers
        // stay valid until its completion (slab invariants).
        let pushed = unsafe { ring.submission_shared().push(entry).is_ok() };
        if pushed {
            return;
        }
        submit_retrying(ring, 0, None);
    }
}

/// Pushes a request's entries: an op and its linked timeout go in together (a link chain
/// must not be split across two submissions).
fn push_sqes(ring: &IoUring, sqes: &Sqes) {
    let (entry, timeout) = sqes;
    let Some(timeout) = timeout else {
        push(ring, entry);
        return;
    };
    let pair = [entry.clone(), timeout.clone()];
    loop {
        // SAFETY: as in `push`.
        let pushed = unsafe { ring.submission_shared().push_multiple(&pair).is_ok() };
        if pushed {
            return;
        }
        submit_retrying(ring, 0, None);
    }
}

/// `io_uring_enter`; transient errors (EINTR, EBUSY, EAGAIN, ETIME) are returned to the loop.
fn submit_retrying(ring: &IoUring, want: usize, timeout: Option<Duration>) {
    let result = match timeout {
        Some(t) => {
            let ts = types::Timespec::from(t);
            let args = types::SubmitArgs::new().timespec(&ts);
            ring.submitter().submit_with_args(want, &args)
        }
        None => ring.submitter().submit_and_wait(want),
    };
    if let Err(e) = result {
        match e.raw_os_error() {
            Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ETIME) => {}
            _ => {
                eprintln!("spindle-io: io_uring_enter failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn cancel_all_entry() -> squeue::Entry {
    opcode::AsyncCancel2::new(types::CancelBuilder::any())
        .build()
        .user_data(CANCEL_TAG)
}

/// Single-thread mode: one thread pulls staged requests, submits, and reaps completions.
pub(crate) fn run_single(ring: IoUring, ctx: RingCtx) {
    let wake_fd: RawFd = match &ctx.queue.wake_fd {
        Some(fd) => fd.as_raw_fd(),
        None => -1,
    };
    assert!(wake_fd >= 0, "single-thread ring without eventfd");
    // A ring created disabled (single issuer) is enabled here, making this thread its issuer;
    // on an enabled ring this fails harmlessly (EBADFD).
    let _ = ring.submitter().register_enable_rings();
    // The kernel writes the eventfd counter here; it lives until the loop below has seen the
    // read complete (`wake_armed == false`), and only then is dropped.
    let mut wake_buf: Box<u64> = Box::new(0);
    let mut wake_armed = false;
    let mut in_flight = 0usize;
    let mut batch: Vec<u32> = Vec::with_capacity(ctx.in_flight_max);
    let mut closed_at: Option<Instant> = None;
    let mut cancel_sent = false;
    let mut reaped = 0usize;
    let queue = &ctx.queue;
    loop {
        if !wake_armed && closed_at.is_none() {
            let ptr: *mut u64 = &mut *wake_buf;
            let entry = opcode::Read::new(types::Fd(wake_fd), ptr.cast(), 8)
                .build()
                .user_data(WAKE_TAG);
            push(&ring, &entry);
            wake_armed = true;
        }
        let room = ctx.in_flight_max - in_flight;
        let closed = {
            let mut q = queue.lock();
            let take = room.min(q.fresh.len());
            batch.extend(q.fresh.drain(..take));
            queue.depth.store(q.fresh.len(), Relaxed);
            if take > 0 {
                queue.not_full.notify_all();
            }
            q.closed
        };
        if closed && closed_at.is_none() {
            closed_at = Some(Instant::now());
            if wake_armed {
                // Complete our own wake-up read so the ring can be torn down safely.
                queue.kick();
            }
        }
        let worked = !batch.is_empty() || reaped > 0;
        for index in batch.drain(..) {
            if let Some(sqes) = start(&ctx, &ring, index) {
                push_sqes(&ring, &sqes);
                in_flight += 1;
            }
        }
        queue.in_flight.store(in_flight, Relaxed);
        if let Some(at) = closed_at {
            let drained = queue.lock().fresh.is_empty();
            if drained && in_flight == 0 && !wake_armed {
                break;
            }
            if drained && in_flight > 0 && !cancel_sent && at.elapsed() >= ctx.shutdown_grace {
                push(&ring, &cancel_all_entry());
                cancel_sent = true;
            }
        }

        // Submit, and wait for a completion unless there is more to do right away.
        // SAFETY: this thread is the only CQ user.
        let cq_ready = unsafe { !ring.completion_shared().is_empty() };
        if cq_ready {
            submit_retrying(&ring, 0, None);
        } else if closed_at.is_some() {
            submit_retrying(&ring, 1, Some(DRAIN_TICK));
        } else {
            if !ctx.idle_spin.is_zero() && worked {
                spin_for_work(&ring, &ctx, in_flight);
            }
            let mut q = queue.lock();
            let more = ctx.in_flight_max > in_flight && !q.fresh.is_empty();
            if !more && !q.closed {
                // New work will write the eventfd; a completion also ends the wait.
                q.sleeping = true;
            }
            drop(q);
            submit_retrying(&ring, usize::from(!more), None);
            queue.lock().sleeping = false;
        }

        // Reap.
        // SAFETY: this thread is the only CQ user.
        let mut cq = unsafe { ring.completion_shared() };
        reaped = 0;
        for cqe in &mut cq {
            reaped += 1;
            match cqe.user_data() {
                WAKE_TAG => wake_armed = false,
                CANCEL_TAG | EXIT_TAG => {}
                ud if is_link_timeout(ud) => {}
                ud => match on_cqe(&ctx, ud, cqe.result(), true) {
                    After::Finished => in_flight -= 1,
                    After::Resubmit(Some(sqes)) => push_sqes(&ring, &sqes),
                    After::Resubmit(None) => {
                        unreachable!("single-thread resubmit builds the entry")
                    }
                },
            }
        }
        drop(cq);
        queue.in_flight.store(in_flight, Relaxed);
    }
    drop(ring);
    drop(wake_buf);
}

/// Busy-waits (yielding the CPU) up to `idle_spin` for new staged work or a completion,
/// so a ring that is busy does not pay a sleep and an eventfd wake-up per request.
fn spin_for_work(ring: &IoUring, ctx: &RingCtx, in_flight: usize) {
    let until = Instant::now() + ctx.idle_spin;
    while Instant::now() < until {
        if in_flight < ctx.in_flight_max && ctx.queue.depth.load(Relaxed) > 0 {
            return;
        }
        // SAFETY: called from the ring thread, the only CQ user.
        if unsafe { !ring.completion_shared().is_empty() } {
            return;
        }
        std::thread::yield_now();
    }
}

/// Two-thread mode, submitter side: pulls staged requests and remainders, fills the SQ.
pub(crate) fn run_submitter(ring: Arc<IoUring>, ctx: Arc<RingCtx>) {
    let queue = &ctx.queue;
    let mut batch: Vec<u32> = Vec::with_capacity(ctx.in_flight_max);
    let mut closed_at: Option<Instant> = None;
    let mut cancel_sent = false;
    'outer: loop {
        {
            let mut q = queue.lock();
            loop {
                batch.extend(q.resubmit.drain(..));
                let in_flight = queue.in_flight.load(Relaxed);
                let room = ctx.in_flight_max.saturating_sub(in_flight);
                let take = room.min(q.fresh.len());
                batch.extend(q.fresh.drain(..take));
                queue.in_flight.fetch_add(take, Relaxed);
                queue.depth.store(q.fresh.len(), Relaxed);
                if take > 0 {
                    queue.not_full.notify_all();
                }
                if !batch.is_empty() {
                    break;
                }
                if q.closed {
                    let at = *closed_at.get_or_insert_with(Instant::now);
                    if q.fresh.is_empty() && in_flight == 0 {
                        break 'outer;
                    }
                    if !cancel_sent && at.elapsed() >= ctx.shutdown_grace {
                        drop(q);
                        push(&ring, &cancel_all_entry());
                        submit_retrying(&ring, 0, None);
                        cancel_sent = true;
                        q = queue.lock();
                        continue;
                    }
                    q = queue.wait_not_empty(q, DRAIN_TICK);
                } else {
                    q = queue.wait_not_empty(q, Duration::from_secs(1));
                }
            }
        }
        for index in batch.drain(..) {
            match start(&ctx, &ring, index) {
                Some(sqes) => push_sqes(&ring, &sqes),
                None => {
                    queue.in_flight.fetch_sub(1, Relaxed);
                }
            }
        }
        submit_retrying(&ring, 0, None);
    }
    // Nothing is in flight: tell the completer to stop.
    push(&ring, &opcode::Nop::new().build().user_data(EXIT_TAG));
    submit_retrying(&ring, 0, None);
}

/// Two-thread mode, completer side: waits for completions and finishes or re-queues them.
pub(crate) fn run_completer(ring: Arc<IoUring>, ctx: Arc<RingCtx>) {
    let queue = &ctx.queue;
    loop {
        // SAFETY: GETEVENTS only (no submission): the SQ stays the submitter's.
        let waited = unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
        };
        if let Err(e) = waited {
            if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                eprintln!("spindle-io: io_uring_enter (completer) failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut finished = 0usize;
        let mut exit = false;
        // SAFETY: this thread is the only CQ user.
        let mut cq = unsafe { ring.completion_shared() };
        for cqe in &mut cq {
            match cqe.user_data() {
                EXIT_TAG => exit = true,
                CANCEL_TAG | WAKE_TAG => {}
                ud if is_link_timeout(ud) => {}
                ud => match on_cqe(&ctx, ud, cqe.result(), false) {
                    After::Finished => finished += 1,
                    After::Resubmit(_) => queue.push_resubmit(split_user_data(ud).0),
                },
            }
        }
        drop(cq);
        if finished > 0 {
            let q = queue.lock();
            queue.in_flight.fetch_sub(finished, Relaxed);
            queue.not_empty.notify_one();
            drop(q);
        }
        if exit {
            return;
        }
    }
}

/// Single-thread IOPOLL mode. Completions of polled I/O are found by polling
/// (`io_uring_enter(GETEVENTS)` spins in the kernel until one is there), and an eventfd read
/// cannot be armed on such a ring (an eventfd is not a polled file), so: while requests are
/// in flight the thread polls for completions; with nothing in flight it sleeps on the
/// staging queue's eventfd with `poll(2)`. Polled I/O always completes (it cannot be left
/// waiting like a socket read), so shutdown simply lets in-flight requests finish.
pub(crate) fn run_single_iopoll(ring: IoUring, ctx: RingCtx) {
    let wake_fd: RawFd = match &ctx.queue.wake_fd {
        Some(fd) => fd.as_raw_fd(),
        None => -1,
    };
    let _ = ring.submitter().register_enable_rings();
    let mut in_flight = 0usize;
    let mut batch: Vec<u32> = Vec::with_capacity(ctx.in_flight_max);
    let queue = &ctx.queue;
    loop {
        let room = ctx.in_flight_max - in_flight;
        let closed = {
            let mut q = queue.lock();
            let take = room.min(q.fresh.len());
            batch.extend(q.fresh.drain(..take));
            queue.depth.store(q.fresh.len(), Relaxed);
            if take > 0 {
                queue.not_full.notify_all();
            }
            q.closed
        };
        for index in batch.drain(..) {
            if let Some(sqes) = start(&ctx, &ring, index) {
                push_sqes(&ring, &sqes);
                in_flight += 1;
            }
        }
        queue.in_flight.store(in_flight, Relaxed);
        if in_flight == 0 {
            let mut q = queue.lock();
            if !q.fresh.is_empty() {
                continue;
            }
            if closed {
                break;
            }
            q.sleeping = true;
            drop(q);
            wait_readable(wake_fd, Duration::from_millis(100));
            queue.lock().sleeping = false;
            continue;
        }
        // Submit what was pushed and poll until at least one completion is there.
        submit_retrying(&ring, 1, None);
        // SAFETY: this thread is the only CQ user.
        let mut cq = unsafe { ring.completion_shared() };
        for cqe in &mut cq {
            match cqe.user_data() {
                WAKE_TAG | CANCEL_TAG | EXIT_TAG => {}
                ud if is_link_timeout(ud) => {}
                ud => match on_cqe(&ctx, ud, cqe.result(), true) {
                    After::Finished => in_flight -= 1,
                    After::Resubmit(Some(sqes)) => push_sqes(&ring, &sqes),
                    After::Resubmit(None) => {}
                },
            }
        }
        drop(cq);
        queue.in_flight.store(in_flight, Relaxed);
    }
}

/// Waits up to `timeout` for the eventfd to be written, then resets its counter.
fn wait_readable(fd: RawFd, timeout: Duration) {
    if fd < 0 {
        std::thread::sleep(timeout);
        return;
    }
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd on the stack.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n > 0 {
        let mut counter = 0u64;
        // SAFETY: reads 8 bytes into a local; the eventfd is readable, so this does not block.
        let _ = unsafe { libc::read(fd, (&mut counter as *mut u64).cast(), 8) };
    }
}
