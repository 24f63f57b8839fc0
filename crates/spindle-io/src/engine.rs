//! `Engine`: configuration, backend selection, submission and shutdown.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{EngineError, SubmitError};
use crate::exec::{iopoll_allows, validate};
use crate::fixed::{FileTable, FixedBufPool, FixedFile};
use crate::op::{InternalKind, InternalOp, Op};
use crate::queue::StagingQueue;
use crate::slab::{lock, SlabOwner, State};
use crate::stats::{Counters, RingStats, Stats};
use crate::uring::{default_ring_factory, RingCtx, RingFactory, RingSetup, CONTROL_SQES};
use crate::{limits, Request};

/// Which backend to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring if a ring can be created, else the thread pool (with one log line).
    Auto,
    /// io_uring only; `Engine::new` fails if a ring cannot be created.
    IoUring,
    /// The portable thread pool (blocking system calls).
    ThreadPool,
}

/// The backend an engine actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    IoUring,
    ThreadPool,
}

/// Threads per io_uring instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingThreads {
    /// One thread submits and reaps (fewest context switches).
    One,
    /// A submitter and a completer thread (submission never waits behind completions).
    Two,
}

/// Engine configuration. `Config::default()` suits tests and small tools.
#[derive(Clone)]
pub struct Config {
    /// Number of io_uring instances (or worker queues of the thread pool).
    pub rings: usize,
    pub ring_threads: RingThreads,
    /// Staging queue bound per ring; a full queue blocks `submit`.
    pub staging_capacity: usize,
    /// Requests per ring in the kernel at once (bounds SQ/CQ use).
    pub in_flight_max: usize,
    /// Slab slots: requests submitted and not yet consumed (completion taken or request
    /// dropped). `submit` blocks while all slots are in use.
    pub slab_capacity: usize,
    pub backend: BackendChoice,
    /// Worker threads per queue for the thread-pool backend.
    pub pool_threads_per_ring: usize,
    /// Kernel SQ polling (`IORING_SETUP_SQPOLL`) with this idle time.
    pub sqpoll_idle: Option<Duration>,
    /// On shutdown, how long in-flight requests may run before they are cancelled.
    pub shutdown_grace: Duration,
    /// Single-thread rings: after a busy round, poll (yielding the CPU) this long for new
    /// work before sleeping in the kernel. Zero (the default) sleeps at once.
    pub idle_spin: Duration,
    /// Polled completions (`IORING_SETUP_IOPOLL`): for O_DIRECT reads and writes on a
    /// block device that supports polling (e.g. NVMe with poll queues). Needs
    /// `RingThreads::One` and no SQPOLL. Ring threads spin in the kernel while requests are in
    /// flight. Only read/write ops are accepted (others: `SubmitError::Invalid`); a file that
    /// cannot be polled completes with `io::ErrorKind::Unsupported`. Ignored by the thread pool.
    pub iopoll: bool,
    /// Size of the registered file table (`Engine::register_files`); every ring registers a
    /// sparse table of this size at start-up. 0 disables registered files.
    pub fixed_files: usize,
    /// Creates the rings; replace it to inject failures in tests.
    pub ring_factory: RingFactory,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rings: 1,
            ring_threads: RingThreads::One,
            staging_capacity: 1024,
            in_flight_max: 256,
            slab_capacity: 8192,
            backend: BackendChoice::Auto,
            pool_threads_per_ring: 4,
            sqpoll_idle: None,
            shutdown_grace: Duration::from_secs(1),
            idle_spin: Duration::ZERO,
            iopoll: false,
            fixed_files: 64,
            ring_factory: default_ring_factory(),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("rings", &self.rings)
            .field("ring_threads", &self.ring_threads)
            .field("staging_capacity", &self.staging_capacity)
            .field("in_flight_max", &self.in_flight_max)
            .field("slab_capacity", &self.slab_capacity)
            .field("backend", &self.backend)
            .field("pool_threads_per_ring", &self.pool_threads_per_ring)
            .field("sqpoll_idle", &self.sqpoll_idle)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("idle_spin", &self.idle_spin)
            .field("iopoll", &self.iopoll)
            .field("fixed_files", &self.fixed_files)
            .finish_non_exhaustive()
    }
}

impl Config {
    fn check(&self) -> Result<(), EngineError> {
        let bad = |what| Err(EngineError::InvalidConfig(what));
        if self.rings == 0 || self.rings > limits::RINGS_MAX {
            return bad("rings must be in 1..=RINGS_MAX");
        }
        if self.staging_capacity == 0 || self.staging_capacity > limits::STAGING_MAX {
            return bad("staging_capacity must be in 1..=STAGING_MAX");
        }
        if self.in_flight_max == 0 || self.in_flight_max > limits::IN_FLIGHT_MAX {
            return bad("in_flight_max must be in 1..=IN_FLIGHT_MAX");
        }
        if self.slab_capacity == 0 || self.slab_capacity > limits::SLAB_MAX {
            return bad("slab_capacity must be in 1..=SLAB_MAX");
        }
        if self.pool_threads_per_ring == 0 || self.pool_threads_per_ring > limits::POOL_THREADS_MAX
        {
            return bad("pool_threads_per_ring must be in 1..=POOL_THREADS_MAX");
        }
        if self.iopoll && (self.ring_threads != RingThreads::One || self.sqpoll_idle.is_some()) {
            return bad("iopoll needs RingThreads::One and no sqpoll");
        }
        if self.fixed_files > limits::FIXED_FILES_MAX {
            return bad("fixed_files must be at most FIXED_FILES_MAX");
        }
        Ok(())
    }
}

/// The I/O engine. Share it between threads by reference or `Arc`; every method takes `&self`.
/// Dropping it shuts it down (see [`Engine::shutdown`]).
pub struct Engine {
    owner: Arc<SlabOwner>,
    queues: Vec<Arc<StagingQueue>>,
    threads: Vec<JoinHandle<()>>,
    next_ring: AtomicUsize,
    kind: BackendKind,
    iopoll: bool,
    /// The registered buffer set, kept until the rings are closed (see `fixed.rs`).
    buffers: Mutex<Option<FixedBufPool>>,
}

fn new_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain system call; the descriptor is owned by the returned OwnedFd.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, EngineError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(EngineError::Thread)
}

impl Engine {
    /// Builds an engine. With `BackendChoice::Auto`, a failure to set up io_uring falls back
    /// to the thread pool and prints one line to stderr.
    pub fn new(config: Config) -> Result<Engine, EngineError> {
        config.check()?;
        let owner = Arc::new(SlabOwner {
            slab: crate::slab::Slab::new(config.slab_capacity),
            counters: Counters::new(),
            files: FileTable::new(config.fixed_files),
        });
        if config.backend != BackendChoice::ThreadPool {
            match Self::create_rings(&config) {
                Ok(rings) => return Self::start_uring(config, owner, rings),
                Err(e) if config.backend == BackendChoice::IoUring => return Err(e),
                Err(e) => {
                    eprintln!(
                        "spindle-io: io_uring unavailable ({e}); using the thread-pool backend"
                    );
                }
            }
        }
        Self::start_pool(config, owner)
    }

    fn create_rings(config: &Config) -> Result<Vec<io_uring::IoUring>, EngineError> {
        let sq_entries = (config.in_flight_max + CONTROL_SQES).next_power_of_two();
        let mut rings = Vec::with_capacity(config.rings);
        for index in 0..config.rings {
            let setup = RingSetup {
                index,
                sq_entries: sq_entries as u32,
                cq_entries: 2 * sq_entries as u32,
                sqpoll_idle: config.sqpoll_idle,
                single_issuer: config.ring_threads == RingThreads::One,
                iopoll: config.iopoll,
            };
            let ring = (config.ring_factory)(&setup)
                .map_err(|source| EngineError::RingSetup { index, source })?;
            if config.fixed_files > 0 {
                // Before the ring thread enables the ring: no issuer is bound yet.
                ring.submitter()
                    .register_files_sparse(config.fixed_files as u32)
                    .map_err(|source| EngineError::RingSetup { index, source })?;
            }
            // The CQ must hold everything that can be in flight (no overflow).
            if (ring.params().cq_entries() as usize) < config.in_flight_max + CONTROL_SQES
                || (ring.params().sq_entries() as usize) < config.in_flight_max + CONTROL_SQES
            {
                return Err(EngineError::RingSetup {
                    index,
                    source: std::io::Error::other("ring smaller than the in-flight bound"),
                });
            }
            rings.push(ring);
        }
        Ok(rings)
    }

    fn start_uring(
        config: Config,
        owner: Arc<SlabOwner>,
        rings: Vec<io_uring::IoUring>,
    ) -> Result<Engine, EngineError> {
        let mut engine = Engine {
            owner: owner.clone(),
            queues: Vec::with_capacity(rings.len()),
            threads: Vec::new(),
            next_ring: AtomicUsize::new(0),
            kind: BackendKind::IoUring,
            iopoll: config.iopoll,
            buffers: Mutex::new(None),
        };
        for (index, ring) in rings.into_iter().enumerate() {
            let wake_fd = match config.ring_threads {
                RingThreads::One => Some(new_eventfd().map_err(EngineError::Thread)?),
                RingThreads::Two => None,
            };
            let queue = Arc::new(StagingQueue::new(
                config.staging_capacity,
                config.in_flight_max,
                wake_fd,
            ));
            engine.queues.push(queue.clone());
            let ctx = RingCtx {
                owner: owner.clone(),
                queue,
                in_flight_max: config.in_flight_max,
                shutdown_grace: config.shutdown_grace,
                idle_spin: config.idle_spin,
                iopoll: config.iopoll,
            };
            match config.ring_threads {
                RingThreads::One if config.iopoll => {
                    let h = spawn(format!("spindle-io-{index}"), move || {
                        crate::uring::run_single_iopoll(ring, ctx)
                    });
                    engine.threads.push(h?);
                }
                RingThreads::One => {
                    let h = spawn(format!("spindle-io-{index}"), move || {
                        crate::uring::run_single(ring, ctx)
                    });
                    engine.threads.push(h?);
                }
                RingThreads::Two => {
                    let ring = Arc::new(ring);
                    let ctx = Arc::new(ctx);
                    let (r2, c2) = (ring.clone(), ctx.clone());
                    let h = spawn(format!("spindle-io-{index}c"), move || {
                        crate::uring::run_completer(r2, c2)
                    });
                    engine.threads.push(h?);
                    let h = spawn(format!("spindle-io-{index}s"), move || {
                        crate::uring::run_submitter(ring, ctx)
                    });
                    engine.threads.push(h?);
                }
            }
        }
        Ok(engine)
    }

    fn start_pool(config: Config, owner: Arc<SlabOwner>) -> Result<Engine, EngineError> {
        let mut engine = Engine {
            owner: owner.clone(),
            queues: Vec::with_capacity(config.rings),
            threads: Vec::new(),
            next_ring: AtomicUsize::new(0),
            kind: BackendKind::ThreadPool,
            iopoll: false,
            buffers: Mutex::new(None),
        };
        for index in 0..config.rings {
            let queue = Arc::new(StagingQueue::new(config.staging_capacity, 0, None));
            engine.queues.push(queue.clone());
            for worker in 0..config.pool_threads_per_ring {
                let (o, q) = (owner.clone(), queue.clone());
                let h = spawn(format!("spindle-io-{index}w{worker}"), move || {
                    crate::threads::run_worker(o, q)
                });
                engine.threads.push(h?);
            }
        }
        Ok(engine)
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Submits an operation; returns at once unless the slab or the chosen staging queue is
    /// full (then it blocks until there is room: backpressure, nothing is dropped).
    /// Thread-safe. Errors hand the op (and its buffers) back.
    pub fn submit(&self, op: Op) -> Result<Request, SubmitError> {
        self.submit_inner(op, None)
    }

    /// Submits `op` with a deadline `timeout` from now covering the whole request (every
    /// resubmission of a short transfer included). If it has not completed by then it is
    /// cancelled (io_uring: a linked `IORING_OP_LINK_TIMEOUT`) and completes with
    /// `ETIMEDOUT` (`io::ErrorKind::TimedOut`), `Completion::transferred` saying how much was
    /// done. The thread pool honours it on a best-effort basis: before each blocking call,
    /// and by waiting for readiness (at most the time left) on streams; a call already
    /// running is not interrupted (its buffers stay in use until it returns). Not available
    /// on IOPOLL engines.
    pub fn submit_with_timeout(&self, op: Op, timeout: Duration) -> Result<Request, SubmitError> {
        if self.iopoll {
            return Err(SubmitError::Invalid {
                reason: "linked timeouts are not available on IOPOLL rings",
                op,
            });
        }
        let deadline = Instant::now().checked_add(timeout);
        self.submit_inner(op, deadline)
    }

    fn submit_inner(&self, op: Op, deadline: Option<Instant>) -> Result<Request, SubmitError> {
        if let Err(reason) = validate(&op) {
            return Err(SubmitError::Invalid { reason, op });
        }
        if self.iopoll && self.kind == BackendKind::IoUring && !iopoll_allows(&op) {
            return Err(SubmitError::Invalid {
                reason: "IOPOLL rings accept only reads and writes (O_DIRECT files)",
                op,
            });
        }
        let ring = self.next_ring.fetch_add(1, Relaxed) % self.queues.len();
        self.enqueue(op, ring, deadline)
    }

    /// Allocates `count` buffers of `size` bytes (rounded up to 4096, 4096-aligned) and
    /// registers them with every ring (`IORING_REGISTER_BUFFERS`, run by each ring's issuing
    /// thread). Use them with `Op::ReadFixed`/`Op::WriteFixed`. One set per engine (a second
    /// call fails with `EBUSY`). The thread pool accepts the same ops on the same memory.
    /// The memory is freed when the engine and every `FixedBuf` taken from the set are gone.
    pub fn register_buffers(&self, count: usize, size: usize) -> io::Result<FixedBufPool> {
        let mut slot = lock(&self.buffers);
        if slot.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let pool = FixedBufPool::new(count, size)?;
        // Kept even if a ring fails: rings that did register must not see the memory freed.
        *slot = Some(pool.clone());
        drop(slot);
        self.on_every_ring(|| InternalKind::RegisterBuffers(pool.clone()))?;
        Ok(pool)
    }

    /// Registers `fds` in the engine's file table (every ring, `IORING_REGISTER_FILES_UPDATE`)
    /// and returns their handles, usable as `FileRef::Fixed` in `ReadFixed`/`WriteFixed`.
    /// The caller keeps owning the descriptors: unregister them before closing them. The
    /// thread pool maps the handles back to the descriptors.
    pub fn register_files(&self, fds: &[RawFd]) -> io::Result<Vec<FixedFile>> {
        let start = self.owner.files.reserve(fds)?;
        let update = self.on_every_ring(|| InternalKind::UpdateFiles {
            offset: start,
            fds: fds.to_vec(),
        });
        if let Err(e) = update {
            let cleared = vec![-1; fds.len()];
            let _ = self.on_every_ring(|| InternalKind::UpdateFiles {
                offset: start,
                fds: cleared.clone(),
            });
            self.owner.files.release(start, fds.len());
            return Err(e);
        }
        Ok((0..fds.len() as u32)
            .map(|i| FixedFile(start + i))
            .collect())
    }

    /// Removes registered files from every ring's table (their indexes can be reused).
    pub fn unregister_files(&self, files: &[FixedFile]) -> io::Result<()> {
        for file in files {
            self.on_every_ring(|| InternalKind::UpdateFiles {
                offset: file.0,
                fds: vec![-1],
            })?;
            self.owner.files.release(file.0, 1);
        }
        Ok(())
    }

    /// Runs an internal op on every ring and waits for all; the first error is returned.
    fn on_every_ring(&self, make: impl Fn() -> InternalKind) -> io::Result<()> {
        let mut requests = Vec::with_capacity(self.queues.len());
        for ring in 0..self.queues.len() {
            let op = Op::Internal(InternalOp(make()));
            let request = self
                .enqueue(op, ring, None)
                .map_err(|e| io::Error::other(e.to_string()))?;
            requests.push(request);
        }
        let mut first_error = None;
        for request in requests {
            if let Err(e) = request.wait().result {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Asks the engine to cancel `target`. The returned request completes with 0 if the
    /// target was cancelled (it then completes with `ECANCELED`), or `ENOENT`/`EALREADY`
    /// if it had finished or could not be stopped.
    pub fn cancel(&self, target: &Request) -> Result<Request, SubmitError> {
        let ring = lock(&self.owner.slab.slot(target.index).inner).ring;
        let op = Op::Cancel {
            target: target.user_data(),
        };
        if self.iopoll && self.kind == BackendKind::IoUring {
            return Err(SubmitError::Invalid {
                reason: "IOPOLL rings cannot cancel (polled I/O always completes)",
                op,
            });
        }
        self.enqueue(op, ring, None)
    }

    fn enqueue(
        &self,
        op: Op,
        ring: usize,
        deadline: Option<Instant>,
    ) -> Result<Request, SubmitError> {
        let slab = &self.owner.slab;
        let index = slab.alloc();
        let slot = slab.slot(index);
        let generation = {
            let mut inner = lock(&slot.inner);
            assert_eq!(inner.state, State::Free, "allocated slot not free");
            inner.generation = inner.generation.wrapping_add(1);
            inner.state = State::Queued;
            inner.ring = ring;
            inner.op = Some(op);
            inner.progress = 0;
            inner.submitted_at = Instant::now();
            inner.deadline = deadline;
            inner.generation
        };
        let request = Request {
            owner: self.owner.clone(),
            index,
            generation,
            taken: false,
        };
        if !self.queues[ring].push(index) {
            // Closed: take the op back and free the slot (the request was never queued).
            let mut inner = lock(&slot.inner);
            let op = inner.op.take();
            inner.state = State::Done;
            inner.result = Some(Err(std::io::Error::other("engine shut down")));
            drop(inner);
            drop(request);
            return match op {
                Some(op) => Err(SubmitError::ShutDown(op)),
                None => Err(SubmitError::ShutDown(Op::Nop)),
            };
        }
        self.owner.counters.submitted.fetch_add(1, Relaxed);
        Ok(request)
    }

    /// How many of `requests` have finished (never blocks).
    pub fn poll(&self, requests: &[Request]) -> usize {
        requests.iter().filter(|r| r.is_done()).count()
    }

    /// Blocks until every one of `requests` has finished; take the completions with
    /// `Request::try_take` or `Request::wait` afterwards.
    pub fn block_on(&self, requests: &[Request]) {
        for r in requests {
            r.wait_done();
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let c = &self.owner.counters;
        let submitted = c.submitted.load(Relaxed);
        let completed = c.completed.load(Relaxed);
        Stats {
            submitted,
            completed,
            resubmitted: c.resubmitted.load(Relaxed),
            in_flight: submitted.saturating_sub(completed),
            rings: self
                .queues
                .iter()
                .map(|q| RingStats {
                    queue_depth: q.depth.load(Relaxed),
                    in_flight: q.in_flight.load(Relaxed),
                })
                .collect(),
            latency: c.latency.snapshot(),
        }
    }

    /// Stops accepting submissions, lets staged and in-flight requests finish for up to
    /// `Config::shutdown_grace`, cancels what is still running after that, and joins the
    /// engine's threads. Every request completes exactly once (possibly with `ECANCELED`).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for q in &self.queues {
            q.close();
        }
        for h in self.threads.drain(..) {
            if h.join().is_err() {
                eprintln!("spindle-io: an engine thread panicked");
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.kind)
            .field("rings", &self.queues.len())
            .finish_non_exhaustive()
    }
}
