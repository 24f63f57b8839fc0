//! DeLiBA's user-space block layer in front of an [`Image`]: an LRU cache of image data
//! and a self-tuning coalescing scheduler.
//!
//! ```text
//!  read/write/write_zeroes/discard/flush (any number of tasks, e.g. NBD connections)
//!        |                       |
//!     Cache (LRU, write-through, extents)   <- reads are served here when possible
//!        |  misses: whole extents; writes: per-object pieces
//!     Scheduler (per-object batches held <= min(EWMA latency / 2, hold_us_max);
//!                sequential writes <= min(EWMA latency, sequential_hold_us_max))
//!        |  one object operation per batch
//!     Image -> ObjectBackend (cluster)
//! ```
//!
//! # Cache
//! Granularity: aligned extents of `cache_extent_bytes` (default 4 KiB, clamped to the
//! object size so an extent never spans two objects). Consecutive missing extents of one
//! read (within one object) are fetched with one backend read and then cached extent by
//! extent, so a large read costs one object operation per object, not one per extent.
//! Measured (fio 4k randread QD16 over NBD, 3 daemons): 64 KiB extents made every random
//! 4 KiB miss move 16x the data and ran at 5.2k IOPS; 4 KiB extents avoid that
//! amplification. A 32 MiB cache is 8,192 entries under one lock. Write-through: writes invalidate the extents they touch (they
//! never update them in place) and are acknowledged after the backend acknowledged them.
//!
//! Invariant (no stale data): an extent is inserted only if no write to it started
//! after the fill's backend read was issued and none is in flight at insert time. Each
//! extent maps to one of [`CACHE_GENERATION_SLOTS`] slots holding a generation and a
//! count of writers in flight; a write bumps the generation and increments the writer
//! count before it is submitted, and bumps it again and decrements when it completed.
//! A fill records (generation, epoch) before it reads and inserts only if both are
//! unchanged and the writer count is zero. Slot collisions only reject more fills.
//! `resize` bumps the global epoch and empties the cache.
//!
//! # Scheduler (DeLiBA-1's self-tuning coalescing)
//! Rules, per data object:
//! 1. At most one *open* (held, not yet dispatched) batch per object. A request merges
//!    into it if it has the same direction (read or write; zeroing never merges), its
//!    range touches or overlaps the batch's range, and the union is at most
//!    `coalesce_bytes_max`. Later write bytes overwrite earlier ones in the merged buffer,
//!    which is their submission order.
//! 2. Otherwise the open batch is dispatched at once and the request opens a new batch.
//! 3. Reads are dispatched at once (never held; see `Scheduler::hold` for why). A
//!    write batch is dispatched when its hold expires (the hold is fixed when it opens:
//!    `min(EWMA of object-op latency / 2, hold_us_max)`, so no request waits longer than
//!    the bound), when it reaches `coalesce_bytes_max`, on a conflicting request (rule 2)
//!    and on `flush`. With a hold of zero (disabled, or no latency observed yet) a
//!    request is dispatched inside `submit`. A write batch that continues a sequential
//!    stream (it starts where the previous write ended) is held up to one mean latency,
//!    capped by `sequential_hold_us_max` (50 ms), so that it can grow to a whole object,
//!    which the daemons write once instead of through their journal; when nothing is
//!    running any more, held batches wait at most `hold_us_max` longer. (Sequential 512 KiB
//!    writes at queue depth 16: batches of 8 requests = whole 4 MiB objects.)
//! 4. A dispatched batch first waits for every earlier-dispatched, still-running batch of
//!    the same object whose range overlaps and where either is a write. Dispatch order
//!    per object equals submission order of the batches, so overlapping writes are never
//!    reordered and a read that overlaps a queued write sees it.

use crate::image::{Image, ImageError, ObjectBackend, ObjectWrite};
use bytes::Bytes;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Default cache size (as the in-kernel RBD driver and DeLiBA).
pub const CACHE_CAPACITY_BYTES_DEFAULT: u64 = 32 << 20;
/// Default cache extent.
pub const CACHE_EXTENT_BYTES_DEFAULT: u64 = 4 << 10;
/// Smallest cache extent.
pub const CACHE_EXTENT_BYTES_MIN: u64 = 4 << 10;
/// Largest cache extent.
pub const CACHE_EXTENT_BYTES_MAX: u64 = 4 << 20;
/// Generation slots of the cache (bounded memory for the stale-fill check).
pub const CACHE_GENERATION_SLOTS: usize = 4096;
/// Default largest merged object operation.
pub const COALESCE_BYTES_MAX_DEFAULT: u64 = 4 << 20;
/// Default cap of the hold (protects against a latency spike inflating the EWMA).
pub const HOLD_US_MAX_DEFAULT: u64 = 2000;
/// Default cap of the hold of a batch that continues a sequential write stream.
pub const SEQUENTIAL_HOLD_US_MAX_DEFAULT: u64 = 50_000;
/// EWMA weight of a new latency sample is 1 / 2^this.
const EWMA_SHIFT: u32 = 3;
/// Longest backend read one cache-miss run turns into.
const READ_RUN_BYTES_MAX: u64 = 4 << 20;
/// Reads at least this long bypass the cache (neither looked up nor filled): a large
/// read is rarely re-read soon, would evict the small hot extents the cache is for, and
/// per-4 KiB-extent bookkeeping cost more than the read itself (512 KiB sequential reads:
/// 128 lookups and inserts each). Always safe: the cache is write-through, so the
/// backend is never behind it.
const CACHE_BYPASS_READ_BYTES: u64 = 128 << 10;

/// One missing extent of a read.
struct Miss {
    extent: u64,
    e_start: u64,
    e_len: u64,
    /// The part of the extent the caller asked for.
    from: u64,
    to: u64,
    ticket: FillTicket,
}

/// Consecutive missing extents within one object, fetched with one backend read.
struct MissRun {
    start: u64,
    end: u64,
    misses: Vec<Miss>,
}

/// Configuration of a [`BlockLayer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockConfig {
    /// Cache size; 0 disables the cache.
    pub cache_capacity_bytes: u64,
    /// Cache granularity: a power of two in 4 KiB..=4 MiB (clamped to the object size).
    pub cache_extent_bytes: u64,
    /// false: every request is dispatched at once (no hold, no merging).
    pub coalesce_enabled: bool,
    /// Largest merged object operation.
    pub coalesce_bytes_max: u64,
    /// Upper bound of the hold in microseconds.
    pub hold_us_max: u64,
    /// Upper bound of the hold of a write batch that continues a sequential stream (it
    /// starts where the previous write ended). Such a batch is held up to one mean
    /// latency (not half), so that it can grow to a whole object: the daemons write a
    /// whole object once, straight to a fresh file, while a partial write goes through
    /// their journal and is written twice. 0 = same as `hold_us_max`.
    pub sequential_hold_us_max: u64,
    /// Hold only when it can pay: not for a lone request (queue depth 1), and only on
    /// occasional probes while held batches rarely attract neighbours. false = DeLiBA's
    /// plain rule (always hold min(mean latency / 2, `hold_us_max`)).
    pub adaptive_hold: bool,
    /// Bytes fetched ahead of a sequential reader (see `readahead.rs`); 0 disables.
    pub readahead_bytes: u64,
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            cache_capacity_bytes: CACHE_CAPACITY_BYTES_DEFAULT,
            cache_extent_bytes: CACHE_EXTENT_BYTES_DEFAULT,
            coalesce_enabled: true,
            coalesce_bytes_max: COALESCE_BYTES_MAX_DEFAULT,
            hold_us_max: HOLD_US_MAX_DEFAULT,
            sequential_hold_us_max: SEQUENTIAL_HOLD_US_MAX_DEFAULT,
            adaptive_hold: true,
            readahead_bytes: READAHEAD_BYTES_DEFAULT,
        }
    }
}

impl BlockConfig {
    fn validate(&self) -> Result<(), ImageError> {
        let e = &self.cache_extent_bytes;
        if !e.is_power_of_two() || !(CACHE_EXTENT_BYTES_MIN..=CACHE_EXTENT_BYTES_MAX).contains(e) {
            return Err(ImageError::InvalidConfig(format!(
                "cache_extent_bytes {e}: must be a power of two in 4 KiB..=4 MiB"
            )));
        }
        if self.coalesce_bytes_max == 0 {
            return Err(ImageError::InvalidConfig(
                "coalesce_bytes_max must be > 0".to_string(),
            ));
        }
        Ok(())
    }
}

/// Counters of a [`BlockLayer`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockStats {
    /// Extent lookups served from the cache.
    pub cache_hits: u64,
    /// Extent lookups that went to the backend.
    pub cache_misses: u64,
    /// Extents evicted to make room.
    pub cache_evictions: u64,
    /// Fills refused because a write raced with them (stale data kept out).
    pub cache_fills_rejected: u64,
    /// Bytes currently cached.
    pub cache_bytes: u64,
    /// Configured capacity.
    pub cache_capacity_bytes: u64,
    /// Requests submitted to the scheduler (per-object pieces).
    pub sched_requests: u64,
    /// Requests that joined an open batch.
    pub sched_merges: u64,
    /// Requests that were part of a batch of two or more.
    pub sched_merged_requests: u64,
    /// Object operations issued (batches dispatched).
    pub sched_backend_ops: u64,
    /// Write operations that replaced a whole object (the daemons write those once,
    /// straight to a fresh file, instead of journaling them).
    pub sched_whole_object_writes: u64,
    /// Sum over requests of the time held before dispatch.
    pub sched_delay_total_us: u64,
    /// Current EWMA of object-operation latency.
    pub sched_latency_ewma_us: u64,
    /// Hold a batch opened now would get.
    pub sched_hold_us: u64,
    /// Reads served from readahead chunks.
    pub readahead_hits: u64,
    /// Bytes fetched ahead of sequential readers.
    pub readahead_issued_bytes: u64,
    /// Streams whose readahead a random read cancelled.
    pub readahead_cancelled: u64,
}

use spindle_types::sync::lock;

mod readahead;
use readahead::{Covered, Fetch, Readahead};
pub use readahead::{READAHEAD_BYTES_DEFAULT, READAHEAD_CHUNK_BYTES, READAHEAD_TRIGGER_BYTES};

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start < b_end && b_start < a_end
}

// ---------------------------------------------------------------------------------------
// Cache

struct CacheEntry {
    /// The extent's bytes; shared with the reads it was handed to (a miss's buffer is
    /// returned and cached without a copy).
    data: Bytes,
    last_use: u64,
}

/// What a fill remembers before reading, checked on insert.
#[derive(Clone, Copy, Debug)]
struct FillTicket {
    generation: u64,
    epoch: u64,
}

struct CacheState {
    entries: HashMap<u64, CacheEntry>,
    /// last_use tick -> extent index (LRU order).
    lru: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
    generations: Vec<u64>,
    writers: Vec<u32>,
    /// Bumped by `clear`: fills that started before are refused.
    epoch: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    fills_rejected: u64,
}

struct Cache {
    capacity_bytes: u64,
    state: Mutex<CacheState>,
}

fn slot(extent: u64) -> usize {
    (extent % CACHE_GENERATION_SLOTS as u64) as usize
}

impl Cache {
    fn new(capacity_bytes: u64) -> Cache {
        Cache {
            capacity_bytes,
            state: Mutex::new(CacheState {
                entries: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                bytes: 0,
                generations: vec![0; CACHE_GENERATION_SLOTS],
                writers: vec![0; CACHE_GENERATION_SLOTS],
                epoch: 0,
                hits: 0,
                misses: 0,
                evictions: 0,
                fills_rejected: 0,
            }),
        }
    }

    /// Copies `data[from..from + out.len()]` of a cached extent of `extent_len` bytes
    /// into `out`; on a miss returns the ticket for the fill.
    /// The cached bytes of `extent` (all `extent_len` of them; a reference, not a copy), or
    /// the ticket a fill of the extent must present to `insert`.
    fn lookup(&self, extent: u64, extent_len: u64) -> Result<Bytes, FillTicket> {
        let mut s = lock(&self.state);
        s.tick += 1;
        let tick = s.tick;
        let hit = match s.entries.get_mut(&extent) {
            Some(e) if e.data.len() as u64 == extent_len => {
                let old = std::mem::replace(&mut e.last_use, tick);
                Some((old, e.data.clone()))
            }
            _ => None,
        };
        match hit {
            Some((old, data)) => {
                s.lru.remove(&old);
                s.lru.insert(tick, extent);
                s.hits += 1;
                Ok(data)
            }
            None => {
                s.misses += 1;
                Err(FillTicket {
                    generation: s.generations[slot(extent)],
                    epoch: s.epoch,
                })
            }
        }
    }

    fn remove_locked(s: &mut CacheState, extent: u64) {
        if let Some(e) = s.entries.remove(&extent) {
            s.lru.remove(&e.last_use);
            s.bytes -= e.data.len() as u64;
        }
    }

    /// Inserts a filled extent unless a write raced with the fill.
    fn insert(&self, extent: u64, ticket: FillTicket, data: Bytes) {
        let len = data.len() as u64;
        if len > self.capacity_bytes || len == 0 {
            return;
        }
        let mut s = lock(&self.state);
        let sl = slot(extent);
        if s.generations[sl] != ticket.generation || s.writers[sl] != 0 || s.epoch != ticket.epoch {
            s.fills_rejected += 1;
            return;
        }
        Self::remove_locked(&mut s, extent);
        while s.bytes + len > self.capacity_bytes {
            let Some((_, victim)) = s.lru.pop_first() else {
                break;
            };
            if let Some(e) = s.entries.remove(&victim) {
                s.bytes -= e.data.len() as u64;
                s.evictions += 1;
            }
        }
        s.tick += 1;
        let tick = s.tick;
        s.lru.insert(tick, extent);
        s.entries.insert(
            extent,
            CacheEntry {
                data,
                last_use: tick,
            },
        );
        s.bytes += len;
        debug_assert!(s.bytes <= self.capacity_bytes);
        debug_assert_eq!(s.lru.len(), s.entries.len());
    }

    /// Marks extents `first..=last` as being written: drops them, bumps generations.
    fn begin_write(self: &Arc<Self>, first: u64, last: u64) -> WriteGuard {
        let mut s = lock(&self.state);
        for extent in first..=last {
            let sl = slot(extent);
            s.generations[sl] += 1;
            s.writers[sl] += 1;
            Self::remove_locked(&mut s, extent);
        }
        WriteGuard {
            cache: self.clone(),
            first,
            last,
        }
    }

    /// Empties the cache and refuses every fill in progress.
    fn clear(&self) {
        let mut s = lock(&self.state);
        s.epoch += 1;
        s.entries.clear();
        s.lru.clear();
        s.bytes = 0;
    }
}

/// Held while a write to extents `first..=last` may still change the backend.
struct WriteGuard {
    cache: Arc<Cache>,
    first: u64,
    last: u64,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.cache.state);
        for extent in self.first..=self.last {
            let sl = slot(extent);
            debug_assert!(s.writers[sl] > 0, "writer count underflow");
            s.writers[sl] = s.writers[sl].saturating_sub(1);
            s.generations[sl] += 1;
            Cache::remove_locked(&mut s, extent);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scheduler

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
    Zero,
}

type Reply = oneshot::Sender<Result<Vec<u8>, ImageError>>;

struct Waiter {
    /// Image offset of the request.
    offset: u64,
    len: u64,
    submitted: Instant,
    reply: Reply,
    /// Keeps the cache from accepting fills until the write is done.
    _guard: Option<Arc<WriteGuard>>,
}

struct Batch {
    id: u64,
    dir: Dir,
    object: u64,
    /// Image byte range `[start, end)`, inside one object.
    start: u64,
    end: u64,
    /// Write bytes of `[start, end)` (empty for reads and zeroing).
    data: Vec<u8>,
    waiters: Vec<Waiter>,
    /// Was held open for merging (only then does its wait count as added delay).
    held: bool,
    /// Held although nothing was running (a sequential write at an object's start).
    idle_hold: bool,
}

struct Running {
    id: u64,
    dir: Dir,
    start: u64,
    end: u64,
    done: watch::Receiver<bool>,
}

#[derive(Default)]
struct SchedState {
    open: HashMap<u64, Batch>,
    running: HashMap<u64, Vec<Running>>,
    next_id: u64,
    latency_ewma_us: u64,
    requests: u64,
    merges: u64,
    merged_requests: u64,
    backend_ops: u64,
    whole_object_writes: u64,
    delay_total_us: u64,
    /// How often a held batch attracted a neighbour (EWMA, fixed point of 2^16).
    merge_rate_ewma: u32,
    /// Idle holds in a row that no neighbour joined (a client that waits for each reply).
    idle_hold_misses: u32,
    /// Chances for an idle hold (sequential writes at an object's start with nothing
    /// running): after back-off, every `HOLD_PROBE_EVERY`th of them is held as a probe.
    /// Counted per chance, not per request: in a steady stream the requests at object
    /// starts fall on one residue of the request count, which may never be a multiple.
    idle_hold_chances: u64,
    /// Image offset where the last write request ended (sequential-stream detection).
    write_end: Option<u64>,
}

/// After this many idle holds in a row that nothing joined, idle holds are only probes
/// (every `HOLD_PROBE_EVERY`th chance): a queue-depth-1 sequential writer gains nothing
/// from them.
const IDLE_HOLD_MISSES_MAX: u32 = 4;

/// Fixed-point 1.0 of `merge_rate_ewma`.
const MERGE_RATE_ONE: u32 = 1 << 16;
/// Below this merge rate holding costs latency for nothing: hold only every
/// `HOLD_PROBE_EVERY`th request, to notice when merging pays again.
const MERGE_RATE_MIN: u32 = MERGE_RATE_ONE / 20;
const HOLD_PROBE_EVERY: u64 = 16;

impl SchedState {
    fn record_merge(&mut self, merged: bool) {
        let r = self.merge_rate_ewma;
        self.merge_rate_ewma = if merged {
            r + ((MERGE_RATE_ONE - r) >> 4)
        } else {
            r - (r >> 4)
        };
    }

    /// Something else is queued or running: a neighbour may still arrive.
    fn busy(&self) -> bool {
        !self.open.is_empty() || self.running.values().any(|v| !v.is_empty())
    }
}

struct Scheduler<B: ObjectBackend> {
    image: Arc<Image<B>>,
    config: BlockConfig,
    state: Mutex<SchedState>,
}

impl<B: ObjectBackend> Scheduler<B> {
    /// The hold of DeLiBA's scheduler, min(mean latency / 2, cap), made adaptive: no hold
    /// for a lone request (queue depth 1: no neighbour can arrive while it waits), and
    /// mostly none while held batches rarely attract neighbours (random I/O), with a probe
    /// every `HOLD_PROBE_EVERY` requests so sequential phases turn it back on.
    ///
    /// A write that continues a sequential stream is held up to one mean latency (capped by
    /// `sequential_hold_us_max`) instead of half: while the earlier batches run, the
    /// client's next requests of the stream arrive and the batch grows towards a whole
    /// object. When nothing is running any more, held batches wait at most
    /// `hold_us_max` longer (time for the client to react to the last completion; after
    /// that no neighbour can come), so a stream whose queue depth cannot fill an object
    /// is not held for a whole latency.
    ///
    /// Reads are never held: a daemon serves a cached read in microseconds, so the hold
    /// costs more than merging saves (fio QD16 sequential reads over NBD, held vs not:
    /// 4 KiB 10.1k vs 40.2k IOPS, 64 KiB 288 vs 500 MB/s, 512 KiB 553 vs 955 MB/s).
    fn hold(
        &self,
        s: &mut SchedState,
        dir: Dir,
        sequential_write: bool,
        object_start: bool,
    ) -> Duration {
        if dir == Dir::Read {
            return Duration::ZERO;
        }
        if self.config.adaptive_hold {
            if !s.busy() {
                // A sequential write at an object's start with nothing running: the client
                // may be about to send the rest of the object (fio at queue depth 16 sends
                // a whole object's requests at once after each round of replies). A short
                // hold lets them join, so the object is written whole (no journal)
                // instead of as a lone request plus a partial remainder.
                if sequential_write && object_start && self.config.coalesce_enabled {
                    s.idle_hold_chances += 1;
                    if s.idle_hold_misses < IDLE_HOLD_MISSES_MAX
                        || s.idle_hold_chances.is_multiple_of(HOLD_PROBE_EVERY)
                    {
                        return Duration::from_micros(self.config.hold_us_max);
                    }
                }
                return Duration::ZERO;
            }
            if !sequential_write
                && s.merge_rate_ewma < MERGE_RATE_MIN
                && !s.requests.is_multiple_of(HOLD_PROBE_EVERY)
            {
                return Duration::ZERO;
            }
        }
        if sequential_write && self.config.coalesce_enabled {
            let cap = match self.config.sequential_hold_us_max {
                0 => self.config.hold_us_max,
                cap => cap,
            };
            return Duration::from_micros(s.latency_ewma_us.min(cap));
        }
        self.hold_bound(s)
    }

    fn hold_bound(&self, s: &SchedState) -> Duration {
        if !self.config.coalesce_enabled {
            return Duration::ZERO;
        }
        Duration::from_micros((s.latency_ewma_us / 2).min(self.config.hold_us_max))
    }

    /// Queues one request lying inside one object; the reply carries read data.
    fn submit(
        self: &Arc<Self>,
        dir: Dir,
        offset: u64,
        len: u64,
        data: Vec<u8>,
        guard: Option<Arc<WriteGuard>>,
    ) -> oneshot::Receiver<Result<Vec<u8>, ImageError>> {
        let object_size_bytes = self.image.object_size_bytes();
        let object = offset / object_size_bytes;
        debug_assert!(len > 0);
        debug_assert_eq!(
            (offset + len - 1) / object_size_bytes,
            object,
            "spans objects"
        );
        debug_assert!(dir != Dir::Write || data.len() as u64 == len);
        let (reply, rx) = oneshot::channel();
        let waiter = Waiter {
            offset,
            len,
            submitted: Instant::now(),
            reply,
            _guard: guard,
        };
        let mut s = lock(&self.state);
        s.requests += 1;
        let sequential_write = dir == Dir::Write && s.write_end == Some(offset);
        if dir == Dir::Write {
            s.write_end = Some(offset + len);
        }
        let hold = self.hold(
            &mut s,
            dir,
            sequential_write,
            offset.is_multiple_of(object_size_bytes),
        );
        let max = self.config.coalesce_bytes_max;
        let end = offset + len;
        if let Some(b) = s.open.get_mut(&object) {
            let union_start = b.start.min(offset);
            let union_end = b.end.max(end);
            let touches = offset <= b.end && b.start <= end;
            if b.dir == dir && dir != Dir::Zero && touches && union_end - union_start <= max {
                let appended = dir == Dir::Write && offset == b.end;
                if appended {
                    // Appending (sequential writes): grow in place (amortised doubling)
                    // instead of copying the whole batch on every merge.
                    b.data.extend_from_slice(&data);
                } else if dir == Dir::Write {
                    if union_start != b.start {
                        let mut merged = vec![0u8; (union_end - union_start) as usize];
                        let at = (b.start - union_start) as usize;
                        merged[at..at + b.data.len()].copy_from_slice(&b.data);
                        b.data = merged;
                    } else if union_end != b.end {
                        b.data.resize((union_end - union_start) as usize, 0);
                    }
                    let at = (offset - union_start) as usize;
                    b.data[at..at + data.len()].copy_from_slice(&data);
                }
                b.start = union_start;
                b.end = union_end;
                b.waiters.push(waiter);
                let joined_idle_hold = b.idle_hold;
                debug_assert!(dir != Dir::Write || b.data.len() as u64 == b.end - b.start);
                // An append that reaches the object's end cannot be followed by another
                // append: nothing more will join this batch.
                let full =
                    b.end - b.start >= max || (appended && b.end.is_multiple_of(object_size_bytes));
                s.merges += 1;
                s.record_merge(true);
                if joined_idle_hold {
                    s.idle_hold_misses = 0;
                }
                if full {
                    if let Some(b) = s.open.remove(&object) {
                        self.dispatch(&mut s, b);
                    }
                }
                return rx;
            }
            // Rule 2: the open batch goes first.
            if let Some(b) = s.open.remove(&object) {
                self.dispatch(&mut s, b);
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        let batch = Batch {
            id,
            dir,
            object,
            start: offset,
            end,
            data,
            waiters: vec![waiter],
            held: false,
            idle_hold: false,
        };
        let ends_stream_object = sequential_write && end.is_multiple_of(object_size_bytes);
        if hold.is_zero() || dir == Dir::Zero || len >= max || ends_stream_object {
            self.dispatch(&mut s, batch);
        } else {
            let mut batch = batch;
            if sequential_write {
                // Room for the rest of the object (bounded by the batch limit), so that
                // appends do not reallocate and copy the batch again and again.
                let room = (object_size_bytes - offset % object_size_bytes).min(max);
                batch.data.reserve_exact((room - len) as usize);
            }
            batch.held = true;
            batch.idle_hold = !s.busy();
            s.open.insert(object, batch);
            self.arm_hold(object, id, hold);
        }
        rx
    }

    /// Dispatches the open batch `id` of `object` after `hold`, unless it went earlier.
    fn arm_hold(self: &Arc<Self>, object: u64, id: u64, hold: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            let mut s = lock(&this.state);
            if s.open.get(&object).is_some_and(|b| b.id == id) {
                if let Some(b) = s.open.remove(&object) {
                    if b.waiters.len() == 1 {
                        s.record_merge(false);
                        if b.idle_hold {
                            s.idle_hold_misses = s.idle_hold_misses.saturating_add(1);
                        }
                    }
                    this.dispatch(&mut s, b);
                }
            }
        });
    }

    /// Issues `batch` (after the conflicting running batches of its object).
    fn dispatch(self: &Arc<Self>, s: &mut SchedState, mut batch: Batch) {
        let now = Instant::now();
        let conflicts = |r: &Running| {
            overlaps(r.start, r.end, batch.start, batch.end)
                && (r.dir != Dir::Read || batch.dir != Dir::Read)
        };
        let deps: Vec<watch::Receiver<bool>> = s
            .running
            .get(&batch.object)
            .map(|v| {
                v.iter()
                    .filter(|r| conflicts(r))
                    .inspect(|r| debug_assert!(r.id < batch.id, "dependency on a later batch"))
                    .map(|r| r.done.clone())
                    .collect()
            })
            .unwrap_or_default();
        let (done_tx, done_rx) = watch::channel(false);
        s.running.entry(batch.object).or_default().push(Running {
            id: batch.id,
            dir: batch.dir,
            start: batch.start,
            end: batch.end,
            done: done_rx,
        });
        s.backend_ops += 1;
        if batch.dir == Dir::Write
            && batch.start.is_multiple_of(self.image.object_size_bytes())
            && batch.end - batch.start == self.image.object_size_bytes()
        {
            s.whole_object_writes += 1;
        }
        if batch.waiters.len() > 1 {
            s.merged_requests += batch.waiters.len() as u64;
        }
        if batch.held {
            for w in &batch.waiters {
                s.delay_total_us += now.duration_since(w.submitted).as_micros() as u64;
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            for mut d in deps {
                // Err: the batch's task died; nothing more to wait for.
                let _ = d.wait_for(|finished| *finished).await;
            }
            let started = Instant::now();
            let len = batch.end - batch.start;
            let result = match batch.dir {
                Dir::Read => this.image.read(batch.start, len).await,
                Dir::Write => this
                    .image
                    .write_owned(batch.start, std::mem::take(&mut batch.data))
                    .await
                    .map(|()| Vec::new()),
                Dir::Zero => this
                    .image
                    .write_zeroes(batch.start, len)
                    .await
                    .map(|()| Vec::new()),
            };
            let latency_us = started.elapsed().as_micros() as u64;
            {
                let mut s = lock(&this.state);
                s.latency_ewma_us = if s.latency_ewma_us == 0 {
                    latency_us.max(1)
                } else {
                    (s.latency_ewma_us * ((1 << EWMA_SHIFT) - 1) + latency_us) >> EWMA_SHIFT
                };
                if let Some(v) = s.running.get_mut(&batch.object) {
                    v.retain(|r| r.id != batch.id);
                    if v.is_empty() {
                        s.running.remove(&batch.object);
                    }
                }
                // Nothing running any more: once the client has reacted to this last
                // completion no neighbour can arrive (it may be waiting for the held
                // replies), so held batches wait at most the short hold from now.
                if s.running.is_empty() && !s.open.is_empty() {
                    let short = Duration::from_micros(this.config.hold_us_max);
                    let open: Vec<(u64, u64)> = s.open.iter().map(|(o, b)| (*o, b.id)).collect();
                    for (object, id) in open {
                        this.arm_hold(object, id, short);
                    }
                }
            }
            let _ = done_tx.send(true);
            // A read batch with one waiter for all of it hands over its buffer (no copy).
            let mut result = result;
            let sole_reader = batch.dir == Dir::Read && batch.waiters.len() == 1;
            for w in batch.waiters {
                let Waiter {
                    offset,
                    len: wlen,
                    reply,
                    _guard,
                    ..
                } = w;
                drop(_guard);
                let r = match &mut result {
                    Ok(data) if batch.dir == Dir::Read => {
                        let at = (offset - batch.start) as usize;
                        debug_assert!(at + wlen as usize <= data.len());
                        if sole_reader && at == 0 && wlen as usize == data.len() {
                            Ok(std::mem::take(data))
                        } else {
                            Ok(data[at..at + wlen as usize].to_vec())
                        }
                    }
                    Ok(_) => Ok(Vec::new()),
                    Err(e) => Err(e.duplicate()),
                };
                let _ = reply.send(r);
            }
        });
    }

    /// Dispatches every open batch and waits for every write/zeroing running now.
    async fn flush(self: &Arc<Self>) {
        let waits: Vec<watch::Receiver<bool>> = {
            let mut s = lock(&self.state);
            let open: Vec<Batch> = s.open.drain().map(|(_, b)| b).collect();
            for b in open {
                self.dispatch(&mut s, b);
            }
            s.running
                .values()
                .flatten()
                .filter(|r| r.dir != Dir::Read)
                .map(|r| r.done.clone())
                .collect()
        };
        for mut w in waits {
            let _ = w.wait_for(|finished| *finished).await;
        }
    }
}

/// Waits for every reply; the first error wins.
async fn collect(
    rxs: Vec<oneshot::Receiver<Result<Vec<u8>, ImageError>>>,
) -> Result<(), ImageError> {
    let mut first_error = None;
    for rx in rxs {
        if let Err(e) = receive(rx).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The bytes `[offset, offset + len)` from readahead chunks that cover them, waiting for
/// chunks still in flight; `None` (read normally) if a chunk failed or was invalidated by a
/// write submitted since it was issued.
async fn serve_ahead(covered: Covered, offset: u64, len: u64) -> Option<Vec<Bytes>> {
    let end = offset + len;
    let mut out = Vec::with_capacity(covered.chunks.len());
    let mut got = 0u64;
    for (start, mut rx, valid) in covered.chunks {
        let data = loop {
            let ready = rx.borrow().clone();
            if let Some(r) = ready {
                break r;
            }
            if rx.changed().await.is_err() {
                return None;
            }
        };
        let data = data.ok()?;
        if !valid.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let from = offset.max(start);
        let to = end.min(start + data.len() as u64);
        if to <= from {
            return None;
        }
        out.push(data.slice((from - start) as usize..(to - start) as usize));
        got += to - from;
    }
    (got == len).then_some(out)
}

async fn receive(
    rx: oneshot::Receiver<Result<Vec<u8>, ImageError>>,
) -> Result<Vec<u8>, ImageError> {
    rx.await
        .unwrap_or_else(|_| Err(ImageError::Task("scheduler task ended".to_string())))
}

// ---------------------------------------------------------------------------------------
// BlockLayer

/// The block layer of one image: share one (behind an `Arc`) among every user of the
/// image so the cache stays coherent. Needs a tokio runtime (it spawns tasks).
pub struct BlockLayer<B: ObjectBackend> {
    image: Arc<Image<B>>,
    cache: Option<Arc<Cache>>,
    sched: Arc<Scheduler<B>>,
    readahead: Mutex<Readahead>,
    config: BlockConfig,
}

impl<B: ObjectBackend> BlockLayer<B> {
    /// A block layer over `image`.
    pub fn new(image: Arc<Image<B>>, config: BlockConfig) -> Result<BlockLayer<B>, ImageError> {
        config.validate()?;
        let cache = (config.cache_capacity_bytes > 0)
            .then(|| Arc::new(Cache::new(config.cache_capacity_bytes)));
        Ok(BlockLayer {
            sched: Arc::new(Scheduler {
                image: image.clone(),
                config: config.clone(),
                state: Mutex::new(SchedState::default()),
            }),
            image,
            cache,
            readahead: Mutex::new(Readahead::default()),
            config,
        })
    }

    /// The image underneath.
    pub fn image(&self) -> &Arc<Image<B>> {
        &self.image
    }

    /// The configuration in use.
    pub fn config(&self) -> &BlockConfig {
        &self.config
    }

    /// Current size of the volume.
    pub fn size_bytes(&self) -> u64 {
        self.image.size_bytes()
    }

    fn extent_bytes(&self) -> u64 {
        self.config
            .cache_extent_bytes
            .min(self.image.object_size_bytes())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<u64, ImageError> {
        let size = self.image.size_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(size),
            _ => Err(ImageError::OutOfRange { offset, len, size }),
        }
    }

    /// Per-object pieces `(offset, len)` of a range.
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let os = self.image.object_size_bytes();
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let piece_end = end.min((pos / os + 1) * os);
            out.push((pos, piece_end - pos));
            pos = piece_end;
        }
        out
    }

    /// Reads `len` bytes at `offset` (readahead chunks, the cache, then the scheduler).
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
        let mut pieces = self.read_pieces(offset, len).await?;
        if pieces.len() == 1 {
            // The buffer itself when nothing else holds it (no copy).
            return Ok(Vec::from(pieces.remove(0)));
        }
        let mut out = Vec::with_capacity(len as usize);
        for p in &pieces {
            out.extend_from_slice(p);
        }
        Ok(out)
    }

    /// [`BlockLayer::read`] as the buffers it was assembled from, in order (slices of
    /// readahead chunks, one buffer per object read): a caller that sends them on (the
    /// NBD server) need not copy them into one.
    pub async fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<Bytes>, ImageError> {
        let size = self.check_range(offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if self.config.readahead_bytes > 0 {
            let (covered, fetches) = lock(&self.readahead).on_read(
                offset,
                len,
                self.config.readahead_bytes,
                self.image.object_size_bytes(),
                size,
            );
            for f in fetches {
                self.fetch_ahead(f);
            }
            if let Some(covered) = covered {
                if let Some(data) = serve_ahead(covered, offset, len).await {
                    return Ok(data);
                }
            }
        }
        let cache = self
            .cache
            .as_ref()
            .filter(|_| len < CACHE_BYPASS_READ_BYTES);
        let Some(cache) = cache else {
            let rxs: Vec<_> = self
                .pieces(offset, len)
                .into_iter()
                .map(|(o, l)| self.sched.submit(Dir::Read, o, l, Vec::new(), None))
                .collect();
            let mut out = Vec::with_capacity(rxs.len());
            for rx in rxs {
                out.push(Bytes::from(receive(rx).await?));
            }
            debug_assert_eq!(out.iter().map(Bytes::len).sum::<usize>() as u64, len);
            return Ok(out);
        };
        let ext = self.extent_bytes();
        let object_bytes = self.image.object_size_bytes();
        let end = offset + len;
        // Inside one extent (a 4 KiB random read): the cached bytes, or the backend's reply
        // buffer, are the piece handed out and (on a miss) the cache entry: no copy.
        if offset / ext == (end - 1) / ext {
            let extent = offset / ext;
            let e_start = extent * ext;
            let e_end = (e_start + ext).min(size);
            let (from, to) = ((offset - e_start) as usize, (end - e_start) as usize);
            let ticket = match cache.lookup(extent, e_end - e_start) {
                Ok(hit) => return Ok(vec![hit.slice(from..to)]),
                Err(ticket) => ticket,
            };
            let rx = self
                .sched
                .submit(Dir::Read, e_start, e_end - e_start, Vec::new(), None);
            let data = Bytes::from(receive(rx).await?);
            if data.len() as u64 != e_end - e_start {
                return Err(ImageError::Task(format!(
                    "a read of {} bytes returned {}",
                    e_end - e_start,
                    data.len()
                )));
            }
            cache.insert(extent, ticket, data.clone());
            return Ok(vec![data.slice(from..to)]);
        }
        let mut out = vec![0u8; len as usize];
        // Runs of consecutive missing extents within one object: one backend read each.
        let mut runs: Vec<MissRun> = Vec::new();
        for extent in offset / ext..=(end - 1) / ext {
            let e_start = extent * ext;
            let e_end = (e_start + ext).min(size);
            let from = offset.max(e_start);
            let to = end.min(e_end);
            let dst = &mut out[(from - offset) as usize..(to - offset) as usize];
            match cache.lookup(extent, e_end - e_start) {
                Ok(hit) => {
                    let at = (from - e_start) as usize;
                    dst.copy_from_slice(&hit[at..at + dst.len()]);
                }
                Err(ticket) => {
                    let miss = Miss {
                        extent,
                        e_start,
                        e_len: e_end - e_start,
                        from,
                        to,
                        ticket,
                    };
                    match runs.last_mut() {
                        Some(run)
                            if run.end == e_start
                                && !e_start.is_multiple_of(object_bytes)
                                && run.end - run.start < READ_RUN_BYTES_MAX =>
                        {
                            run.end = e_end;
                            run.misses.push(miss);
                        }
                        _ => runs.push(MissRun {
                            start: e_start,
                            end: e_end,
                            misses: vec![miss],
                        }),
                    }
                }
            }
        }
        let pending: Vec<_> = runs
            .into_iter()
            .map(|run| {
                let rx =
                    self.sched
                        .submit(Dir::Read, run.start, run.end - run.start, Vec::new(), None);
                (run, rx)
            })
            .collect();
        for (run, rx) in pending {
            let data = receive(rx).await?;
            debug_assert_eq!(data.len() as u64, run.end - run.start);
            for m in run.misses {
                let base = (m.e_start - run.start) as usize;
                let piece = &data[base..base + m.e_len as usize];
                out[(m.from - offset) as usize..(m.to - offset) as usize].copy_from_slice(
                    &piece[(m.from - m.e_start) as usize..(m.to - m.e_start) as usize],
                );
                // A copy per extent: a slice would keep the whole run's buffer alive for
                // as long as any one of its extents stays cached.
                cache.insert(m.extent, m.ticket, Bytes::copy_from_slice(piece));
            }
        }
        Ok(vec![Bytes::from(out)])
    }

    /// Issues one readahead chunk (inside one object) and publishes its result.
    fn fetch_ahead(&self, f: Fetch) {
        let rx = self
            .sched
            .submit(Dir::Read, f.start, f.len, Vec::new(), None);
        tokio::spawn(async move {
            let r = receive(rx).await;
            let r = match r {
                Ok(d) if d.len() as u64 == f.len => Ok(Bytes::from(d)),
                Ok(d) => Err(format!("{} of {} bytes", d.len(), f.len)),
                Err(e) => Err(e.to_string()),
            };
            // Nobody may be waiting any more (the stream moved on): fine.
            let _ = f.tx.send(Some(r));
        });
    }

    fn write_guard(&self, offset: u64, len: u64) -> Option<Arc<WriteGuard>> {
        let ext = self.extent_bytes();
        self.cache
            .as_ref()
            .map(|c| Arc::new(c.begin_write(offset / ext, (offset + len - 1) / ext)))
    }

    async fn mutate(
        &self,
        dir: Dir,
        offset: u64,
        data: Cow<'_, [u8]>,
        len: u64,
    ) -> Result<(), ImageError> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // Before the change is submitted: no readahead chunk issued before it is served
        // after it (see `readahead.rs`).
        lock(&self.readahead).on_write(offset, len);
        let guard = self.write_guard(offset, len);
        let pieces = self.pieces(offset, len);
        // A request hands its own buffer to the scheduler for its first object (the
        // only one, mostly); the pieces in later objects are copied out of it.
        let mut owned = match data {
            Cow::Owned(mut v) if dir == Dir::Write => {
                let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(pieces.len());
                bufs.push(Vec::new());
                for &(o, l) in &pieces[1..] {
                    let at = (o - offset) as usize;
                    bufs.push(v[at..at + l as usize].to_vec());
                }
                v.truncate(pieces.first().map_or(0, |&(_, l)| l as usize));
                bufs[0] = v;
                bufs.into_iter()
            }
            other => {
                let rxs: Vec<_> = pieces
                    .iter()
                    .map(|&(o, l)| {
                        let piece = if dir == Dir::Write {
                            let at = (o - offset) as usize;
                            other[at..at + l as usize].to_vec()
                        } else {
                            Vec::new()
                        };
                        self.sched.submit(dir, o, l, piece, guard.clone())
                    })
                    .collect();
                drop(guard);
                return collect(rxs).await;
            }
        };
        let rxs: Vec<_> = pieces
            .iter()
            .map(|&(o, l)| {
                let piece = owned.next().unwrap_or_default();
                debug_assert_eq!(piece.len() as u64, l);
                self.sched.submit(dir, o, l, piece, guard.clone())
            })
            .collect();
        drop(guard);
        collect(rxs).await
    }

    /// Writes `data` at `offset`; returns once the cluster acknowledged it (durable).
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        self.mutate(Dir::Write, offset, Cow::Borrowed(data), data.len() as u64)
            .await
    }

    /// [`BlockLayer::write`] of a buffer the caller gives up: a request inside one object
    /// is queued without copying it.
    pub async fn write_owned(&self, offset: u64, data: Vec<u8>) -> Result<(), ImageError> {
        let len = data.len() as u64;
        self.mutate(Dir::Write, offset, Cow::Owned(data), len).await
    }

    /// Drops the cached extents `[offset, offset + len)` touches, and refuses fills of them
    /// that started before (the range was written around this layer).
    pub fn invalidate(&self, offset: u64, len: u64) {
        if len == 0 || self.check_range(offset, len).is_err() {
            return;
        }
        lock(&self.readahead).on_write(offset, len);
        drop(self.write_guard(offset, len));
    }

    /// [`Image::object_writes`]: many ranges cut into one write per data object.
    pub fn object_writes(&self, runs: &[(u64, Vec<u8>)]) -> Result<Vec<ObjectWrite>, ImageError> {
        self.image.object_writes(runs)
    }

    /// Sends one [`ObjectWrite`], bypassing the scheduler (a write log's publisher: every
    /// write of the image goes through it, so nothing queued here races with it). Cached
    /// extents it touches are dropped, and fills racing with the write are refused.
    pub async fn write_object(&self, w: &ObjectWrite) -> Result<(), ImageError> {
        let mut guards = Vec::with_capacity(w.extents.len());
        for e in &w.extents {
            let offset = w.object_offset + e.offset;
            let len = e.len_bytes as u64;
            self.check_range(offset, len)?;
            lock(&self.readahead).on_write(offset, len);
            guards.push(self.write_guard(offset, len));
        }
        let r = self.image.write_object(w).await;
        drop(guards);
        r
    }

    /// Makes the range read as zeros (deallocating what it can, never creating objects).
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        self.mutate(Dir::Zero, offset, Cow::Borrowed(&[]), len)
            .await
    }

    /// Discards the range; it reads as zeros afterwards.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), ImageError> {
        self.write_zeroes(offset, len).await
    }

    /// Dispatches held requests and waits for every write submitted before this call.
    pub async fn flush(&self) -> Result<(), ImageError> {
        self.sched.flush().await;
        self.image.flush().await
    }

    /// Resizes the image (see [`Image::resize`]); must not race with I/O beyond the
    /// smaller of the two sizes. Empties the cache.
    pub async fn resize(&self, new_size_bytes: u64) -> Result<(), ImageError> {
        self.sched.flush().await;
        if let Some(c) = &self.cache {
            c.clear();
        }
        lock(&self.readahead).clear();
        let r = self.image.resize(new_size_bytes).await;
        if let Some(c) = &self.cache {
            c.clear();
        }
        lock(&self.readahead).clear();
        r
    }

    /// Counters so far.
    pub fn stats(&self) -> BlockStats {
        let mut st = BlockStats {
            cache_capacity_bytes: self.config.cache_capacity_bytes,
            ..BlockStats::default()
        };
        if let Some(c) = &self.cache {
            let s = lock(&c.state);
            st.cache_hits = s.hits;
            st.cache_misses = s.misses;
            st.cache_evictions = s.evictions;
            st.cache_fills_rejected = s.fills_rejected;
            st.cache_bytes = s.bytes;
        }
        let s = lock(&self.sched.state);
        st.sched_requests = s.requests;
        st.sched_merges = s.merges;
        st.sched_merged_requests = s.merged_requests;
        st.sched_backend_ops = s.backend_ops;
        st.sched_whole_object_writes = s.whole_object_writes;
        st.sched_delay_total_us = s.delay_total_us;
        st.sched_latency_ewma_us = s.latency_ewma_us;
        st.sched_hold_us = self.sched.hold_bound(&s).as_micros() as u64;
        drop(s);
        let ra = lock(&self.readahead);
        st.readahead_hits = ra.hits;
        st.readahead_issued_bytes = ra.issued_bytes;
        st.readahead_cancelled = ra.cancelled;
        st
    }
}

#[cfg(test)]
mod tests;
