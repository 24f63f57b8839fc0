//! Sequential readahead of the block layer (issue #18, item 3).
//!
//! A reader that streams through an image (`dd`, a backup, a VM booting, fio `rw=read`)
//! waits for every request's round trip at queue depth 1; the disk behind the daemons sits
//! idle between them. Once a stream has read [`READAHEAD_TRIGGER_BYTES`] in order, the block
//! layer (from the stream's second request on) fetches the next `readahead_bytes` of the
//! image ahead of it, in chunks of at most
//! [`READAHEAD_CHUNK_BYTES`] within one object, all in flight at once; a read that a chunk
//! covers is served from it (waiting for it if it is still in flight) instead of going to
//! the cluster. A read that does not continue the stream drops every chunk (random access
//! cancels the readahead).
//!
//! Invariant (no stale data): a chunk is served only if no write, zeroing or resize that
//! overlaps it was submitted after the chunk was issued. Every such change removes the
//! overlapping chunks (and everything after them) before it is submitted to the scheduler,
//! and marks them invalid, so a reader already waiting for one falls back to a normal read.
//! A chunk issued after a write was submitted is ordered behind that write by the scheduler
//! (rule 4 of `block.rs`), so it sees the write. Hence a read issued after a write was
//! acknowledged never sees data from before it.
//!
//! Memory: at most `readahead_bytes` (plus one chunk) of issued chunks per image.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Default bytes fetched ahead of a sequential reader.
pub const READAHEAD_BYTES_DEFAULT: u64 = 8 << 20;
/// Largest backend read of one readahead chunk (chunks never span two objects).
pub const READAHEAD_CHUNK_BYTES: u64 = 1 << 20;
/// A stream must have read this much in order, over at least two requests, before
/// readahead starts: a lone random read, however large, never triggers it.
pub const READAHEAD_TRIGGER_BYTES: u64 = 256 << 10;

/// The outcome of a chunk's fetch: `None` while in flight.
pub(crate) type ChunkData = Option<Result<bytes::Bytes, String>>;

/// One fetched (or in-flight) range of the image.
pub(crate) struct Chunk {
    pub start: u64,
    pub len: u64,
    pub data: watch::Receiver<ChunkData>,
    /// Cleared when a write overlapping the chunk is submitted.
    pub valid: Arc<AtomicBool>,
}

/// A chunk to fetch: the block layer issues the backend read and sends the result.
pub(crate) struct Fetch {
    pub start: u64,
    pub len: u64,
    pub tx: watch::Sender<ChunkData>,
}

/// What a read may use: the chunks covering it, in order.
pub(crate) struct Covered {
    pub chunks: Vec<(u64, watch::Receiver<ChunkData>, Arc<AtomicBool>)>,
}

#[derive(Default)]
pub(crate) struct Readahead {
    /// Where the stream's next read would start.
    next: u64,
    /// Bytes read in order so far by the current stream.
    streak_bytes: u64,
    /// Requests of the current stream (a lone read, however large, never triggers).
    streak_reads: u64,
    /// End of what has been issued ahead.
    ahead: u64,
    chunks: VecDeque<Chunk>,
    pub hits: u64,
    pub issued_bytes: u64,
    pub cancelled: u64,
}

impl Readahead {
    /// A read of `[offset, offset + len)` arrives: returns the chunks that cover it (if all
    /// of it is covered) and the chunks to fetch now (`window` bytes ahead; `object_bytes`
    /// bounds chunks to one object; `size` is the image's size).
    pub fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        window: u64,
        object_bytes: u64,
        size: u64,
    ) -> (Option<Covered>, Vec<Fetch>) {
        let end = offset + len;
        if offset == self.next && self.streak_bytes > 0 {
            self.streak_bytes = self.streak_bytes.saturating_add(len);
            self.streak_reads += 1;
        } else {
            // Not the stream's continuation: a new stream starts here; what was fetched
            // for the old one is dropped.
            if !self.chunks.is_empty() {
                self.cancelled += 1;
            }
            self.drop_from(0);
            self.streak_bytes = len;
            self.streak_reads = 1;
            self.ahead = end;
        }
        self.next = end;
        // Chunks wholly before this read are consumed.
        while self
            .chunks
            .front()
            .is_some_and(|c| c.start + c.len <= offset)
        {
            self.chunks.pop_front();
        }
        let covered = self.cover(offset, end);
        if covered.is_some() {
            self.hits += 1;
        }
        let mut fetches = Vec::new();
        // Refill only once less than half the window is left ahead, so that chunks are
        // large (a refill per request would fetch request-sized pieces).
        if window > 0
            && self.streak_reads >= 2
            && self.streak_bytes >= READAHEAD_TRIGGER_BYTES
            && self.ahead.saturating_sub(end) < window / 2
        {
            let mut pos = self.ahead.max(end);
            let limit = end.saturating_add(window).min(size);
            while pos < limit {
                let object_end = (pos / object_bytes + 1) * object_bytes;
                let chunk_end = (pos + READAHEAD_CHUNK_BYTES).min(object_end).min(limit);
                let (tx, rx) = watch::channel(None);
                self.chunks.push_back(Chunk {
                    start: pos,
                    len: chunk_end - pos,
                    data: rx,
                    valid: Arc::new(AtomicBool::new(true)),
                });
                fetches.push(Fetch {
                    start: pos,
                    len: chunk_end - pos,
                    tx,
                });
                self.issued_bytes += chunk_end - pos;
                pos = chunk_end;
            }
            self.ahead = self.ahead.max(pos);
        }
        // Bounded: chunks start at most one chunk before this read and end at most
        // `window` past it.
        debug_assert!(self.held_bytes() <= len + window + 2 * READAHEAD_CHUNK_BYTES);
        (covered, fetches)
    }

    /// The chunks covering `[offset, end)` without a gap, if there are.
    fn cover(&self, offset: u64, end: u64) -> Option<Covered> {
        let mut pos = offset;
        let mut chunks = Vec::new();
        for c in &self.chunks {
            if c.start + c.len <= pos {
                continue;
            }
            if c.start > pos {
                return None;
            }
            chunks.push((c.start, c.data.clone(), c.valid.clone()));
            pos = c.start + c.len;
            if pos >= end {
                return Some(Covered { chunks });
            }
        }
        None
    }

    /// A change to `[offset, offset + len)` is about to be submitted: every chunk that
    /// overlaps it, and every chunk after that, is invalidated and dropped.
    pub fn on_write(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        if let Some(i) = self
            .chunks
            .iter()
            .position(|c| c.start < end && offset < c.start + c.len)
        {
            let start = self.chunks[i].start;
            self.drop_from(i);
            self.ahead = self.ahead.min(start);
        }
    }

    /// Everything goes (resize).
    pub fn clear(&mut self) {
        self.drop_from(0);
        self.streak_bytes = 0;
        self.streak_reads = 0;
        self.ahead = 0;
    }

    fn drop_from(&mut self, i: usize) {
        for c in self.chunks.drain(i..) {
            c.valid.store(false, Ordering::Release);
        }
    }

    /// Bytes of issued chunks (in flight or ready).
    pub fn held_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_stream_triggers_chunks_within_objects_and_bounded() {
        let mut ra = Readahead::default();
        let size = 64 * MIB;
        let obj = 4 * MIB;
        // 128 KiB sequential reads: the trigger is 256 KiB.
        let (c, f) = ra.on_read(0, 128 << 10, 8 * MIB, obj, size);
        assert!(c.is_none() && f.is_empty());
        let (c, f) = ra.on_read(128 << 10, 128 << 10, 8 * MIB, obj, size);
        assert!(c.is_none());
        // 8 MiB ahead of 256 KiB, in chunks of at most 1 MiB that never cross 4 MiB.
        let total: u64 = f.iter().map(|x| x.len).sum();
        assert_eq!(total, 8 * MIB);
        for x in &f {
            assert!(x.len <= READAHEAD_CHUNK_BYTES);
            assert_eq!(x.start / obj, (x.start + x.len - 1) / obj);
        }
        assert_eq!(f[0].start, 256 << 10);
        // The next read is covered; no refill while more than half the window is ahead.
        let (c, f2) = ra.on_read(256 << 10, 128 << 10, 8 * MIB, obj, size);
        assert_eq!(c.unwrap().chunks.len(), 1);
        assert!(f2.is_empty());
        assert!(ra.held_bytes() <= 8 * MIB + READAHEAD_CHUNK_BYTES);
        // A read spanning two chunks is covered by both.
        let (c, _) = ra.on_read(384 << 10, MIB, 8 * MIB, obj, size);
        assert_eq!(c.unwrap().chunks.len(), 2);
        // Once less than half the window is ahead, it is filled again in large chunks.
        let (_, f3) = ra.on_read(1408 << 10, 4 * MIB, 8 * MIB, obj, size);
        assert!(!f3.is_empty());
        assert!(f3.iter().map(|x| x.len).sum::<u64>() >= 4 * MIB);
    }

    #[test]
    fn random_access_cancels_and_writes_invalidate() {
        let mut ra = Readahead::default();
        let (size, obj) = (64 * MIB, 4 * MIB);
        ra.on_read(0, 512 << 10, 4 * MIB, obj, size);
        let (_, f) = ra.on_read(512 << 10, 512 << 10, 4 * MIB, obj, size);
        assert!(!f.is_empty());
        let valid: Vec<_> = ra.chunks.iter().map(|c| c.valid.clone()).collect();
        // A write in the middle of the window drops that chunk and the ones after it.
        ra.on_write(2 * MIB + 10, 1);
        assert!(ra.chunks.iter().all(|c| c.start + c.len <= 2 * MIB));
        assert!(valid.iter().any(|v| !v.load(Ordering::Acquire)));
        // The stream continues: the dropped range is fetched again (after the write).
        let (_, f) = ra.on_read(MIB, 512 << 10, 4 * MIB, obj, size);
        assert!(f
            .iter()
            .any(|x| x.start <= 2 * MIB + 10 && 2 * MIB + 10 < x.start + x.len));
        // A random read drops everything.
        let (c, f) = ra.on_read(40 * MIB, 4096, 4 * MIB, obj, size);
        assert!(c.is_none() && f.is_empty());
        assert_eq!(ra.held_bytes(), 0);
        assert!(valid.iter().all(|v| !v.load(Ordering::Acquire)));
        // A lone large read does not trigger; never past the end of the image.
        let mut ra = Readahead::default();
        let (_, f) = ra.on_read(size - MIB, 512 << 10, 8 * MIB, obj, size);
        assert!(f.is_empty());
        let (_, f) = ra.on_read(size - (512 << 10), 256 << 10, 8 * MIB, obj, size);
        assert_eq!(f.last().map(|x| x.start + x.len), Some(size));
    }
}
