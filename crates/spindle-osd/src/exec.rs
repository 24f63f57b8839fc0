//! Pushdown programs run on a group's primary (`ObjOp::Exec`, issue #23; `docs/pushdown.md`).
//!
//! A run names a program by its id (BLAKE3 of its object file), one object and up to
//! fifteen more of the same placement group (names sharing a placement key), arguments,
//! the engine and whether to use the data cache. The primary reads every object the way
//! a client read does (replicated: its own copy, repaired from another on a checksum
//! failure; erasure-coded: decoded from the shards, with a missing shard rebuilt), then
//! hands the run to the daemon's execution threads and answers with the program's return
//! value and output.
//!
//! What keeps a program from hurting the daemon:
//! - the program is verified when loaded and checked at every access while it runs, under
//!   instruction, memory, output and wall-time limits (`spindle-prog`);
//! - runs go to [`ExecPool`]: `exec_threads` threads of their own under the `SCHED_IDLE`
//!   policy, which together may use `exec_cpu_percent` of one CPU (`cpu_budget.rs`:
//!   paused by a timer on their own CPU clock), never the runtime's threads,
//!   behind a bounded queue (a full queue answers `Busy`, which clients retry): a busy
//!   program slows other runs, not I/O;
//! - loaded programs are kept in a bounded cache, and so is object data ([`DataCache`]),
//!   which holds an object's bytes with their version and serves them only while the
//!   object is still at that version: a write makes the entry stale at once.

use super::*;
use spindle_prog::{Engine, Limits, Part, ProgError, Program};
use std::collections::BTreeMap;

/// Programs one daemon keeps loaded (JIT code included), least recently used out first.
pub const PROGRAMS_CACHED_MAX: usize = 64;
/// Jobs waiting for an execution thread (runs, and programs being loaded).
pub const EXEC_QUEUE_MAX: usize = 256;
/// Runs taken in at once (reading their objects, waiting, running): each holds a place
/// from before its first read to its end ([`ExecPool::reserve`]), so a run beyond it is
/// answered `Busy` before it reads anything, and the bound covers the objects' bytes
/// held in memory. 256: a client batch keeps 256 runs in flight over all daemons
/// (`spindle.zarr.reduce`), which one daemon must be able to take without refusing any
/// (with 64, a 64 KiB-chunk reduction spent most of its time in clients' pauses after
/// `Busy`: 20.9 s against 6.5 s, session 30).
pub const EXEC_RUNS_ADMITTED_MAX: usize = 256;
/// Object bytes the admitted runs of one daemon may hold at once. The run count alone
/// would allow 256 runs of 16 objects of 32 MiB, 128 GiB. 1 GiB: twice the largest run
/// (16 x 32 MiB), and 256 runs of 4 MiB, four times what a Zarr reduction of 1 MiB chunks
/// holds with a full client batch in flight.
pub const EXEC_HELD_BYTES_MAX: u64 = 1 << 30;
// An admitted run always finds room in the queue (program loads aside).
const _: () = assert!(EXEC_RUNS_ADMITTED_MAX <= EXEC_QUEUE_MAX);
// The largest run is admitted when nothing else is held (else it would be `Busy` forever).
const _: () = assert!(
    spindle_types::limits::EXEC_OBJECTS_MAX as u64 * spindle_types::limits::OBJECT_BYTES_MAX
        <= EXEC_HELD_BYTES_MAX
);
/// Nice value of the execution threads where `SCHED_IDLE` is refused (the runtime's
/// threads keep 0).
const EXEC_THREAD_NICE: i32 = 10;

/// An object in the cache: (group, name).
type CacheKey = (PgId, String);
/// A cached object: the version it was read at, its bytes, and when it was last used.
type CacheEntry = (Ver, Arc<Vec<u8>>, u64);

/// Bounded cache of object bytes by (group, name), each with the version it was read at.
pub(crate) struct DataCache {
    capacity_bytes: u64,
    bytes: u64,
    tick: u64,
    entries: HashMap<CacheKey, CacheEntry>,
    /// Least recently used first: tick -> key.
    order: BTreeMap<u64, CacheKey>,
}

impl DataCache {
    pub(crate) fn new(capacity_bytes: u64) -> DataCache {
        DataCache {
            capacity_bytes,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The bytes of `name` if cached at `version` (an entry at another version is stale:
    /// it is dropped).
    pub(crate) fn get(&mut self, pgid: PgId, name: &str, version: Ver) -> Option<Arc<Vec<u8>>> {
        let key = (pgid, name.to_string());
        let (v, data, tick) = self.entries.get(&key)?.clone();
        if v != version {
            self.remove(&key);
            return None;
        }
        self.tick += 1;
        self.order.remove(&tick);
        self.order.insert(self.tick, key.clone());
        if let Some(e) = self.entries.get_mut(&key) {
            e.2 = self.tick;
        }
        Some(data)
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some((_, data, tick)) = self.entries.remove(key) {
            self.order.remove(&tick);
            self.bytes -= data.len() as u64;
        }
    }

    /// Keeps `data` as `name` at `version` (evicting the least recently used entries to
    /// make room; an object larger than the whole cache is not kept).
    pub(crate) fn put(&mut self, pgid: PgId, name: &str, version: Ver, data: Arc<Vec<u8>>) {
        let key = (pgid, name.to_string());
        self.remove(&key);
        if data.len() as u64 > self.capacity_bytes {
            return;
        }
        while self.bytes + data.len() as u64 > self.capacity_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, d, _)) = self.entries.remove(&oldest) {
                self.bytes -= d.len() as u64;
            }
        }
        self.tick += 1;
        self.bytes += data.len() as u64;
        self.order.insert(self.tick, key.clone());
        self.entries.insert(key, (version, data, self.tick));
        debug_assert!(self.bytes <= self.capacity_bytes);
        debug_assert_eq!(self.order.len(), self.entries.len());
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Loaded programs by id, least recently used out first.
#[derive(Default)]
pub(crate) struct ProgramCache {
    tick: u64,
    programs: HashMap<[u8; 32], (Arc<Program>, u64)>,
}

impl ProgramCache {
    fn get(&mut self, id: &[u8; 32]) -> Option<Arc<Program>> {
        self.tick += 1;
        let tick = self.tick;
        self.programs.get_mut(id).map(|(p, t)| {
            *t = tick;
            p.clone()
        })
    }

    fn put(&mut self, p: Arc<Program>) {
        if self.programs.len() >= PROGRAMS_CACHED_MAX {
            if let Some(oldest) = self
                .programs
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(id, _)| *id)
            {
                self.programs.remove(&oldest);
            }
        }
        self.tick += 1;
        self.programs.insert(p.id, (p, self.tick));
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Puts the calling thread (an execution thread) below everything else: the `SCHED_IDLE`
/// policy, so any other thread that wakes up - a daemon's I/O, the NBD server, fio -
/// preempts it at once whatever process and session it belongs to (nice alone only ranks
/// threads within one session's scheduling group: each daemon runs in its own session).
/// Falls back to nice [`EXEC_THREAD_NICE`] where the policy is refused.
fn lower_priority(osd_id: u32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes the calling thread's policy (pid 0: this thread on Linux); `param`
    // is a valid sched_param for the call to read.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        tracing::warn!(
            "osd.{osd_id}: SCHED_IDLE refused for an execution thread ({}); using nice {EXEC_THREAD_NICE}",
            std::io::Error::last_os_error()
        );
        // SAFETY: setpriority on the calling thread; no memory is passed.
        let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, EXEC_THREAD_NICE) };
    }
}

/// The execution threads: a bounded queue and `threads` threads under `SCHED_IDLE`
/// ([`lower_priority`]) that share a CPU budget (`cpu_budget.rs`), started with the
/// daemon, ended when it is dropped.
pub(crate) struct ExecPool {
    tx: Mutex<Option<std::sync::mpsc::SyncSender<Job>>>,
    /// Places held by runs ([`ExecPool::reserve`]).
    admitted: Arc<std::sync::atomic::AtomicUsize>,
    /// Object bytes held by runs, at most [`EXEC_HELD_BYTES_MAX`].
    held_bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// A run's place among the [`EXEC_RUNS_ADMITTED_MAX`] admitted, and its share of the
/// [`EXEC_HELD_BYTES_MAX`] object bytes; both given back when dropped.
pub(crate) struct ExecPlace {
    admitted: Arc<std::sync::atomic::AtomicUsize>,
    held_bytes: Arc<std::sync::atomic::AtomicU64>,
    bytes: u64,
}

impl ExecPlace {
    /// Makes the place's share `total_bytes` if it is more than the share taken (an
    /// object was larger than when it was sized, or its size was unknown); false (the
    /// share unchanged) if that would pass [`EXEC_HELD_BYTES_MAX`].
    pub(crate) fn cover(&mut self, total_bytes: u64) -> bool {
        if total_bytes <= self.bytes {
            return true;
        }
        if !take_bytes(&self.held_bytes, total_bytes - self.bytes) {
            return false;
        }
        self.bytes = total_bytes;
        true
    }
}

impl Drop for ExecPlace {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::AcqRel;
        let before = self.admitted.fetch_sub(1, AcqRel);
        debug_assert!(before > 0, "a place given back twice");
        let before = self.held_bytes.fetch_sub(self.bytes, AcqRel);
        debug_assert!(before >= self.bytes, "bytes given back twice");
    }
}

/// Adds `bytes` to `held` unless the sum would pass [`EXEC_HELD_BYTES_MAX`].
fn take_bytes(held: &std::sync::atomic::AtomicU64, bytes: u64) -> bool {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    held.fetch_update(AcqRel, Acquire, |n| {
        n.checked_add(bytes).filter(|t| *t <= EXEC_HELD_BYTES_MAX)
    })
    .is_ok()
}

impl ExecPool {
    pub(crate) fn new(threads: usize, cpu_percent: u32, osd_id: u32) -> ExecPool {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(EXEC_QUEUE_MAX);
        let rx = Arc::new(Mutex::new(rx));
        let threads = threads.max(1);
        let percent = crate::cpu_budget::per_thread_percent(cpu_percent, threads);
        for i in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("osd{osd_id}-exec{i}"))
                .spawn(move || {
                    lower_priority(osd_id);
                    if let Err(e) = crate::cpu_budget::limit_this_thread(percent) {
                        tracing::warn!(
                            "osd.{osd_id}: no CPU budget for an execution thread ({e}): programs may take a whole CPU"
                        );
                    }
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("osd.{osd_id}: cannot start an execution thread: {e}");
            }
        }
        ExecPool {
            tx: Mutex::new(Some(tx)),
            admitted: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            held_bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// A place for one run that will hold `bytes` of objects (as far as known: see
    /// [`ExecPlace::cover`]), taken before its objects are read; None when
    /// [`EXEC_RUNS_ADMITTED_MAX`] runs hold one or the bytes would pass
    /// [`EXEC_HELD_BYTES_MAX`] (the run is then answered `Busy` without a read that would
    /// be thrown away).
    pub(crate) fn reserve(&self, bytes: u64) -> Option<ExecPlace> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        self.admitted
            .fetch_update(AcqRel, Acquire, |n| {
                (n < EXEC_RUNS_ADMITTED_MAX).then_some(n + 1)
            })
            .ok()?;
        // From here the place is held: dropping it gives the count back.
        let mut place = ExecPlace {
            admitted: self.admitted.clone(),
            held_bytes: self.held_bytes.clone(),
            bytes: 0,
        };
        place.cover(bytes).then_some(place)
    }

    /// Runs `f` on an execution thread; None when the queue is full (or the pool gone).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<Result<T, tokio::sync::oneshot::error::RecvError>> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done_tx.send(f());
        });
        {
            let tx = lock(&self.tx);
            tx.as_ref()?.try_send(job).ok()?;
        }
        Some(done_rx.await)
    }
}

/// What a run runs (shared by the parts of a shard-local run).
pub(crate) struct RunSpec {
    program: Arc<Program>,
    /// The program's object file if the client sent it (else empty): passed on to the
    /// daemons holding the shards.
    elf: Arc<Vec<u8>>,
    engine: Engine,
    cache: bool,
    args: Arc<Vec<u8>>,
}

impl RunSpec {
    fn new(
        program: Arc<Program>,
        elf: Arc<Vec<u8>>,
        jit: bool,
        cache: bool,
        args: Vec<u8>,
    ) -> RunSpec {
        RunSpec {
            program,
            elf,
            engine: if jit {
                Engine::Jit
            } else {
                Engine::Interpreter
            },
            cache,
            args: Arc::new(args),
        }
    }
}

/// Where a run's objects are read from.
pub(crate) enum Source {
    /// A replicated group: this copy, repaired from `peers` on a checksum failure.
    Replicated { peers: Vec<u32> },
    /// An erasure-coded group.
    Ec {
        mapping: PgMapping,
        layout: spindle_map::ec::EcLayout,
    },
}

fn failed(e: ProgError) -> Msg {
    Msg::error(ErrorCode::ProgramFailed, e.to_string())
}

impl Osd {
    /// Serves one program run (this daemon is the group's primary, the group active, the
    /// run's objects checked to be of the group).
    pub(crate) async fn exec_op(
        &self,
        epoch: u64,
        pgid: PgId,
        name: String,
        exec: spindle_proto::msg::ExecOp,
        source: Source,
    ) -> Msg {
        let inner = &self.inner;
        OsdCounters::bump(&inner.counters.exec_runs);
        let msg = self.exec_inner(epoch, pgid, name, exec, source).await;
        if let Msg::Error { code, .. } = &msg {
            if *code == ErrorCode::ProgramFailed {
                OsdCounters::bump(&inner.counters.exec_failed);
            }
        }
        msg
    }

    async fn exec_inner(
        &self,
        epoch: u64,
        pgid: PgId,
        name: String,
        exec: spindle_proto::msg::ExecOp,
        source: Source,
    ) -> Msg {
        let spindle_proto::msg::ExecOp {
            program: id,
            jit,
            cache,
            shards,
            args,
            more,
            elf,
        } = exec;
        let elf = Arc::new(elf);
        let program = match self.resolve_program(id, elf.clone()).await {
            Ok(p) => p,
            Err(m) => return m,
        };
        // The objects, in order.
        let mut names = Vec::with_capacity(1 + more.len());
        names.push(name);
        names.extend(more);
        let run = RunSpec::new(program, elf, jit, cache, args);
        if shards {
            if let Source::Ec { mapping, layout } = &source {
                return self
                    .exec_shards(epoch, pgid, mapping, layout, &names, run)
                    .await;
            }
        }
        // Sized before the reads from this daemon's metadata (a replicated object's size;
        // an erasure-coded one's is known once decoded), made exact after them.
        let sized_bytes: u64 = match &source {
            Source::Replicated { .. } => names
                .iter()
                .filter_map(|n| self.inner.store.stat(pgid, n))
                .map(|m| m.size_bytes)
                .sum(),
            Source::Ec { .. } => 0,
        };
        let Some(mut place) = self.inner.exec_pool.reserve(sized_bytes) else {
            return busy();
        };
        // Read at once (their disk reads overlap).
        let objects: Vec<(Ver, Arc<Vec<u8>>)> = match futures::future::try_join_all(
            names
                .iter()
                .map(|n| self.exec_object(epoch, pgid, n, &source, cache)),
        )
        .await
        {
            Ok(o) => o,
            Err(m) => return m,
        };
        let listing: Vec<ObjectListing> = names
            .iter()
            .zip(&objects)
            .map(|(n, (v, d))| ObjectListing {
                name: n.clone(),
                size_bytes: d.len() as u64,
                version: *v,
            })
            .collect();
        let version = objects[0].0;
        let datas: Vec<Arc<Vec<u8>>> = objects.into_iter().map(|(_, d)| d).collect();
        if !place.cover(datas.iter().map(|d| d.len() as u64).sum()) {
            return busy();
        }
        match self.run_here(datas, &run, Part::WHOLE).await {
            Ok((ret, output)) => Msg::ObjReply {
                version,
                size_bytes: ret,
                data: output,
                listing,
            },
            Err(m) => {
                if let Msg::Error { message, .. } = &m {
                    tracing::info!("osd.{}: program run in pg {pgid}: {message}", self.inner.id);
                }
                m
            }
        }
    }

    /// The program with id `id`: held, or loaded from its object file `elf` if sent (on
    /// an execution thread: verifying and JIT-compiling a large program takes a while).
    async fn resolve_program(&self, id: [u8; 32], elf: Arc<Vec<u8>>) -> Result<Arc<Program>, Msg> {
        if let Some(p) = lock(&self.inner.exec_programs).get(&id) {
            return Ok(p);
        }
        if elf.is_empty() {
            return Err(Msg::error(
                ErrorCode::ProgramUnknown,
                format!(
                    "osd.{} does not hold program {}: send its object file",
                    self.inner.id,
                    hex(&id)
                ),
            ));
        }
        if *blake3::hash(&elf).as_bytes() != id {
            return Err(Msg::error(
                ErrorCode::Invalid,
                format!("the object file sent is not program {}", hex(&id)),
            ));
        }
        let loaded = match self.inner.exec_pool.run(move || Program::load(&elf)).await {
            None => return Err(busy()),
            Some(Err(_)) => return Err(internal_gone()),
            Some(Ok(loaded)) => loaded,
        };
        match loaded {
            Ok(p) => {
                let p = Arc::new(p);
                OsdCounters::bump(&self.inner.counters.exec_programs_loaded);
                lock(&self.inner.exec_programs).put(p.clone());
                Ok(p)
            }
            Err(e) => Err(failed(e)),
        }
    }

    /// A shard-local run on an erasure-coded group (`ExecOp::shards`): each object's
    /// settled version and size, read under its lock, then data shard i's part of them
    /// run on the daemon holding shard i, all k at once. A part whose daemon is down, or
    /// fails for any reason but the program's own failure, a full queue or an unknown
    /// program, is run here on a decoded copy (the objects read whole, as a client read
    /// does, at the same versions, and the part's stripe units taken out). Answers
    /// `ExecParts` (`Again` if an object changed meanwhile: the client retries).
    async fn exec_shards(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &spindle_map::ec::EcLayout,
        names: &[String],
        run: RunSpec,
    ) -> Msg {
        let mut slots = Vec::with_capacity(names.len());
        let mut listing = Vec::with_capacity(names.len());
        for name in names {
            match self.ec_exec_slot(epoch, pgid, mapping, layout, name).await {
                Ok((stored, size_bytes, version)) => {
                    slots.push(ObjectListing {
                        name: stored,
                        size_bytes,
                        version,
                    });
                    listing.push(ObjectListing {
                        name: name.clone(),
                        size_bytes,
                        version,
                    });
                }
                Err(m) => return m,
            }
        }
        let k = layout.k;
        let part_of = |i: usize| Part {
            index: i as u64,
            count: k as u64,
            unit_bytes: layout.stripe_unit_bytes,
        };
        let one = |i: usize| {
            let run = &run;
            let slots = &slots;
            async move {
                let copy = PgId {
                    pool: pgid.pool,
                    pg: spindle_map::shard_pg(pgid.pg, Some(i as u8)),
                };
                let part = part_of(i);
                let reply = match mapping.shards.get(i).copied().flatten() {
                    None => Msg::error(ErrorCode::Again, format!("shard {i} is down")),
                    Some(d) if d == self.inner.id => {
                        self.shard_part_run(copy, slots, run, part).await
                    }
                    Some(d) => self.shard_part_call(epoch, d, copy, slots, run, part).await,
                };
                match reply {
                    Msg::ObjReply {
                        size_bytes, data, ..
                    } => Ok((size_bytes, data)),
                    Msg::Error { code, message, .. }
                        if matches!(
                            code,
                            ErrorCode::ProgramFailed | ErrorCode::ProgramUnknown | ErrorCode::Busy
                        ) =>
                    {
                        Err(Msg::error(code, message))
                    }
                    other => {
                        tracing::debug!(
                            "osd.{}: part {i} of a run in pg {pgid}: {other:?}; running it on a decoded copy",
                            self.inner.id
                        );
                        OsdCounters::bump(&self.inner.counters.exec_shard_decoded);
                        self.decoded_part_run(epoch, pgid, mapping, layout, names, slots, run, part)
                            .await
                    }
                }
            }
        };
        let results = futures::future::join_all((0..k).map(one)).await;
        let mut rets = Vec::with_capacity(k);
        let mut lens = Vec::with_capacity(k);
        let mut data = Vec::new();
        for r in results {
            match r {
                Ok((ret, out)) => {
                    rets.push(ret);
                    lens.push(out.len() as u64);
                    data.extend_from_slice(&out);
                }
                Err(m) => return m,
            }
        }
        // Each part may emit up to the output limit; k of them together may not fit in one
        // reply.
        if data.len() > spindle_types::limits::MESSAGE_DATA_BYTES_MAX {
            return Msg::error(
                ErrorCode::ProgramFailed,
                format!(
                    "the {k} parts emitted {} bytes together, more than one answer carries ({} \
                     bytes): emit less per part, or run on whole objects",
                    data.len(),
                    spindle_types::limits::MESSAGE_DATA_BYTES_MAX
                ),
            );
        }
        Msg::ExecParts {
            version: listing[0].version,
            rets,
            lens,
            data,
            listing,
        }
    }

    /// Sends part `part` of a shard-local run to daemon `osd` (with the program's object
    /// file when this daemon was sent it).
    async fn shard_part_call(
        &self,
        epoch: u64,
        osd: u32,
        copy: PgId,
        slots: &[ObjectListing],
        run: &RunSpec,
        part: Part,
    ) -> Msg {
        let msg = Msg::ShardExec {
            pool: copy.pool,
            pg: copy.pg,
            objects: slots.to_vec(),
            program: run.program.id.to_vec(),
            jit: run.engine == Engine::Jit,
            cache: run.cache,
            args: run.args.to_vec(),
            part: part.index as u32,
            parts: part.count as u32,
            stripe_unit: part.unit_bytes,
            elf: run.elf.to_vec(),
        };
        let conn = match self.peer_conn(osd).await {
            Ok(c) => c,
            Err(e) => return Msg::error(ErrorCode::Again, e),
        };
        let timeout_ms = spindle_types::limits::EXEC_WALL_MS + self.inner.config.replica_timeout_ms;
        tokio::select! {
            r = conn.call(epoch, &msg, timeout_ms) => match r {
                Ok(inc) => inc.msg,
                Err(e) => Msg::error(ErrorCode::Again, format!("osd.{osd}: {e}")),
            },
            why = self.until_marked_down(osd) => Msg::error(ErrorCode::Again, why),
        }
    }

    /// `ShardExec`: runs a part of a shard-local run on this daemon's shard.
    pub(crate) fn serve_shard_exec(&self, msg: Msg, rid: u64, epoch: u64, reply: Replier) {
        let Msg::ShardExec {
            pool,
            pg,
            objects,
            program,
            jit,
            cache,
            args,
            part,
            parts,
            stripe_unit,
            elf,
        } = msg
        else {
            return crate::not_handled(&reply, rid, epoch, &msg);
        };
        let osd = self.clone();
        tokio::spawn(async move {
            let bad = |m: String| Msg::error(ErrorCode::Invalid, m);
            let msg = if objects.is_empty() || objects.len() > spindle_prog::OBJECTS_MAX {
                bad(format!("{} objects in a shard run", objects.len()))
            } else if parts == 0
                || part >= parts
                || parts > spindle_types::limits::POOL_SIZE_MAX
                || stripe_unit == 0
                || stripe_unit > spindle_types::limits::STRIPE_UNIT_BYTES_MAX as u64
                || spindle_map::split_shard_pg(pg).1 != Some(part as u8)
            {
                bad(format!(
                    "part {part} of {parts} (stripe unit {stripe_unit}) of pg {pg}: not a data shard"
                ))
            } else {
                match <[u8; 32]>::try_from(program.as_slice()) {
                    Err(_) => bad("a program id is 32 bytes".into()),
                    Ok(id) => match osd.resolve_program(id, Arc::new(elf)).await {
                        Err(m) => m,
                        Ok(program) => {
                            let run = RunSpec::new(program, Arc::new(Vec::new()), jit, cache, args);
                            let part = Part {
                                index: part as u64,
                                count: parts as u64,
                                unit_bytes: stripe_unit,
                            };
                            osd.shard_part_run(PgId { pool, pg }, &objects, &run, part)
                                .await
                        }
                    },
                }
            };
            reply.send_owned(rid, epoch, msg);
        });
    }

    /// Runs `part` of `slots` (slot objects of shard copy `copy`, at their versions) here:
    /// each slot's part read (or taken from the data cache), then the program on an
    /// execution thread.
    async fn shard_part_run(
        &self,
        copy: PgId,
        slots: &[ObjectListing],
        run: &RunSpec,
        part: Part,
    ) -> Msg {
        let part_bytes = slots.iter().map(|s| part.len_of(s.size_bytes)).sum();
        let Some(_place) = self.inner.exec_pool.reserve(part_bytes) else {
            return busy();
        };
        let mut datas = Vec::with_capacity(slots.len());
        for s in slots {
            let want = part.len_of(s.size_bytes);
            if run.cache {
                if let Some(d) = lock(&self.inner.exec_data).get(copy, &s.name, s.version) {
                    OsdCounters::bump(&self.inner.counters.exec_cache_hits);
                    datas.push(d);
                    continue;
                }
            }
            let d = match self.shard_read(copy, &s.name, s.version, 0, want).await {
                Msg::ObjReply { data, .. } if data.len() as u64 == want => Arc::new(data),
                Msg::ObjReply { data, .. } => {
                    return Msg::error(
                        ErrorCode::Io,
                        format!(
                            "{:?}: {} bytes of the shard where {want} belong",
                            s.name,
                            data.len()
                        ),
                    )
                }
                other => return other,
            };
            if run.cache {
                lock(&self.inner.exec_data).put(copy, &s.name, s.version, d.clone());
            }
            datas.push(d);
        }
        OsdCounters::bump(&self.inner.counters.exec_shard_runs);
        match self.run_here(datas, run, part).await {
            Ok((ret, output)) => Msg::ObjReply {
                version: slots[0].version,
                size_bytes: ret,
                data: output,
                listing: Vec::new(),
            },
            Err(m) => m,
        }
    }

    /// Runs `part` of a shard-local run here on a decoded copy: each object read whole at
    /// the version the run saw, the part's stripe units taken out.
    #[allow(clippy::too_many_arguments)]
    async fn decoded_part_run(
        &self,
        epoch: u64,
        pgid: PgId,
        mapping: &PgMapping,
        layout: &spindle_map::ec::EcLayout,
        names: &[String],
        slots: &[ObjectListing],
        run: &RunSpec,
        part: Part,
    ) -> Result<(u64, Vec<u8>), Msg> {
        // Whole objects are read (at the sizes the run saw: a changed object fails below).
        let Some(_place) = self
            .inner
            .exec_pool
            .reserve(slots.iter().map(|s| s.size_bytes).sum())
        else {
            return Err(busy());
        };
        let mut datas = Vec::with_capacity(names.len());
        for (name, s) in names.iter().zip(slots) {
            match self.ec_read_whole(epoch, pgid, mapping, layout, name).await {
                Msg::ObjReply { version, data, .. } if version == s.version => {
                    datas.push(Arc::new(part.extract(&data)))
                }
                Msg::ObjReply { .. } => {
                    return Err(Msg::error(
                        ErrorCode::Again,
                        format!("{name} changed during the run"),
                    ))
                }
                other => return Err(other),
            }
        }
        self.run_here(datas, run, part).await
    }

    /// The program of `run` on `datas` (part `part` of each object) on an execution
    /// thread: its return value and output, or the reply saying why not (a refused or
    /// stopped program is `ProgramFailed`, counted once per run by the primary).
    async fn run_here(
        &self,
        datas: Vec<Arc<Vec<u8>>>,
        run: &RunSpec,
        part: Part,
    ) -> Result<(u64, Vec<u8>), Msg> {
        let bytes_in: u64 = datas.iter().map(|d| d.len() as u64).sum();
        let limits = Limits {
            wall: std::time::Duration::from_millis(spindle_types::limits::EXEC_WALL_MS),
            ..Limits::default()
        };
        let program = run.program.clone();
        let args = run.args.clone();
        let engine = run.engine;
        let out = match self
            .inner
            .exec_pool
            .run(move || {
                let slices: Vec<&[u8]> = datas.iter().map(|d| d.as_slice()).collect();
                program.run_part(engine, &slices, part, &args, &limits)
            })
            .await
        {
            None => return Err(busy()),
            Some(Err(_)) => return Err(internal_gone()),
            Some(Ok(Err(e))) => return Err(failed(e)),
            Some(Ok(Ok(out))) => out,
        };
        let c = &self.inner.counters;
        OsdCounters::add(&c.exec_instructions, out.instructions);
        OsdCounters::add(&c.exec_bytes_in, bytes_in);
        Ok((out.ret, out.output))
    }

    /// One object of a run at its current version: from the data cache when asked and
    /// still current, else read (and cached when asked).
    async fn exec_object(
        &self,
        epoch: u64,
        pgid: PgId,
        name: &str,
        source: &Source,
        cache: bool,
    ) -> Result<(Ver, Arc<Vec<u8>>), Msg> {
        let current = match source {
            Source::Replicated { .. } => self.inner.store.stat(pgid, name).map(|m| m.version),
            Source::Ec { .. } => self.ec_current_version(pgid, name),
        };
        if cache {
            if let Some(v) = current {
                if let Some(d) = lock(&self.inner.exec_data).get(pgid, name, v) {
                    OsdCounters::bump(&self.inner.counters.exec_cache_hits);
                    return Ok((v, d));
                }
            }
        }
        let reply = match source {
            Source::Replicated { peers } => {
                if self.object_missing(pgid, name, true) {
                    let since = self.interval_of(pgid).unwrap_or(0);
                    self.ensure_recovered(pgid, since, name)
                        .await
                        .map_err(|e| Msg::error(ErrorCode::Again, e))?;
                }
                self.read(
                    epoch,
                    pgid,
                    name,
                    0,
                    spindle_types::limits::OBJECT_BYTES_MAX,
                    peers,
                )
                .await
            }
            Source::Ec { mapping, layout } => {
                self.ec_read_whole(epoch, pgid, mapping, layout, name).await
            }
        };
        match reply {
            Msg::ObjReply { version, data, .. } => {
                let data = Arc::new(data);
                if cache {
                    lock(&self.inner.exec_data).put(pgid, name, version, data.clone());
                }
                Ok((version, data))
            }
            other => Err(other),
        }
    }
}

fn busy() -> Msg {
    Msg::error(
        ErrorCode::Busy,
        format!(
            "every execution thread is busy: {EXEC_RUNS_ADMITTED_MAX} runs or \
             {} MiB of their objects are taken in",
            EXEC_HELD_BYTES_MAX >> 20
        ),
    )
}

fn internal_gone() -> Msg {
    Msg::error(ErrorCode::Internal, "the execution thread went away")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(n: u32) -> PgId {
        PgId { pool: 1, pg: n }
    }

    fn v(seq: u64) -> Ver {
        Ver { epoch: 1, seq }
    }

    #[test]
    fn places_are_bounded_and_given_back() {
        let pool = ExecPool::new(1, 100, 0);
        let mut held: Vec<ExecPlace> = (0..EXEC_RUNS_ADMITTED_MAX)
            .map(|_| pool.reserve(0).expect("a place below the bound"))
            .collect();
        assert!(pool.reserve(0).is_none(), "a place beyond the bound");
        drop(held.pop());
        let again = pool.reserve(0);
        assert!(again.is_some(), "a place given back is taken again");
        assert!(pool.reserve(0).is_none());
        drop(held);
        drop(again);
        assert!(pool.reserve(0).is_some(), "all places back");
    }

    #[test]
    fn held_bytes_are_bounded_and_given_back() {
        use std::sync::atomic::Ordering::Relaxed;
        let pool = ExecPool::new(1, 100, 0);
        let largest_run_bytes = spindle_types::limits::EXEC_OBJECTS_MAX as u64
            * spindle_types::limits::OBJECT_BYTES_MAX;
        let a = pool
            .reserve(largest_run_bytes)
            .expect("the largest run alone");
        let mut b = pool
            .reserve(EXEC_HELD_BYTES_MAX - largest_run_bytes - 10)
            .expect("up to the bound");
        assert!(pool.reserve(11).is_none(), "bytes beyond the bound");
        // A refused run gives its place back: the count is unchanged.
        assert_eq!(pool.admitted.load(Relaxed), 2);
        let mut c = pool.reserve(10).expect("exactly at the bound");
        assert!(c.cover(10), "a share already covered");
        assert!(!c.cover(11), "growing past the bound");
        assert_eq!(pool.held_bytes.load(Relaxed), EXEC_HELD_BYTES_MAX);
        drop(a);
        assert!(c.cover(10 + largest_run_bytes), "growing into freed bytes");
        assert!(!c.cover(11 + largest_run_bytes), "one byte past the bound");
        assert!(!b.cover(EXEC_HELD_BYTES_MAX), "no room for that");
        drop(b);
        drop(c);
        assert_eq!(pool.held_bytes.load(Relaxed), 0, "every byte back");
        assert_eq!(pool.admitted.load(Relaxed), 0, "every place back");
        assert!(pool.reserve(EXEC_HELD_BYTES_MAX).is_some());
        assert!(pool.reserve(EXEC_HELD_BYTES_MAX + 1).is_none());
    }

    #[test]
    fn data_cache_serves_only_the_current_version_and_stays_bounded() {
        let mut c = DataCache::new(100);
        c.put(pg(0), "a", v(1), Arc::new(vec![1; 40]));
        assert_eq!(c.get(pg(0), "a", v(1)).map(|d| d[0]), Some(1));
        // A newer version (the object was written): the entry is stale and dropped.
        assert!(c.get(pg(0), "a", v(2)).is_none());
        assert!(c.get(pg(0), "a", v(1)).is_none());
        assert_eq!(c.bytes(), 0);
        c.put(pg(0), "a", v(2), Arc::new(vec![2; 40]));
        c.put(pg(0), "b", v(1), Arc::new(vec![3; 40]));
        // "a" used last: "b" goes first.
        assert!(c.get(pg(0), "a", v(2)).is_some());
        c.put(pg(1), "c", v(1), Arc::new(vec![4; 40]));
        assert!(c.get(pg(0), "b", v(1)).is_none());
        assert!(c.get(pg(0), "a", v(2)).is_some());
        assert!(c.get(pg(1), "c", v(1)).is_some());
        assert_eq!(c.bytes(), 80);
        // Too large for the whole cache: not kept, nothing evicted.
        c.put(pg(2), "big", v(1), Arc::new(vec![0; 101]));
        assert!(c.get(pg(2), "big", v(1)).is_none());
        assert_eq!(c.bytes(), 80);
        // Replacing an entry frees its old bytes.
        c.put(pg(1), "c", v(2), Arc::new(vec![5; 10]));
        assert_eq!(c.bytes(), 50);
    }
}
