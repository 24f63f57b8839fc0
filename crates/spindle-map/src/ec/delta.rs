//! Delta slots: a shard slot that stores only the byte ranges of the shard that changed
//! since a whole-shard *base* slot, so a small overwrite of a large object writes a few
//! KiB per shard instead of a copy of the whole shard.
//!
//! A delta slot is written once, like every slot object, and names its base (slot
//! position and version). Its bytes are the shard's bytes of every changed range (the
//! *payload*, ranges in shard order), a header, then the 16-byte trailer of every shard
//! slot with the magic `SPED`:
//!
//! ```text
//! payload | u8 flags (bit 0: has a base) | u8 base position | u64 base epoch | u64 base seq
//!         | u64 shard size | u32 extent count | (u64 offset, u64 length) per extent
//!         | u32 CRC32C of the header so far | u32 header length
//!         | u64 object size | u32 "SPED" | u32 CRC32C of the 12 bytes before
//! ```
//!
//! The shard's bytes at the delta's version are the base's bytes with every extent laid
//! over them. A delta without a base covers the whole shard (a copy that could not write
//! a delta over the base the primary asked for writes this instead). Extents are sorted,
//! disjoint and inside the shard; a cumulative delta (the next write over a delta) merges
//! the old extents with the new range and keeps the same base, so a chain is never longer
//! than one delta.

use spindle_types::Version as Ver;

use super::TRAILER_BYTES;

/// Trailer magic of a delta slot (`SPEC` marks a whole-shard slot).
pub const DELTA_MAGIC: u32 = u32::from_le_bytes(*b"SPED");

/// Largest payload the primary asks for in a delta slot: above it a write produces a
/// whole shard again. 12 KiB of payload plus the header keeps a delta slot under the
/// store's 16 KiB inline limit (no data file, no file sync, no unlink), i.e. up to three
/// 4 KiB writes into one object accumulate before the shard is rewritten whole.
pub const DELTA_PAYLOAD_BYTES_MAX: u64 = 12 << 10;

/// Most extents in one delta slot (bounds the header; a write that would need more
/// produces a whole shard).
pub const DELTA_EXTENTS_MAX: usize = 64;

/// Fixed header bytes (without the extent table).
const HEADER_FIXED_BYTES: usize = 1 + 1 + 8 + 8 + 8 + 4 + 4 + 4;

/// One changed range of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The metadata of a delta slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaSlot {
    /// Base slot (position, version); None: the extents cover the whole shard.
    pub base: Option<(u8, Ver)>,
    pub object_size: u64,
    pub shard_size: u64,
    /// Sorted, disjoint, inside `shard_size`.
    pub extents: Vec<Extent>,
}

/// Why bytes are not a delta slot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeltaError {
    #[error("delta slot of {0} bytes is too short")]
    Short(usize),
    #[error("delta slot trailer is not valid")]
    Trailer,
    #[error("delta slot header checksum mismatch")]
    Checksum,
    #[error("delta slot header is malformed: {0}")]
    Malformed(&'static str),
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// The trailer of a delta slot.
fn delta_trailer(object_size: u64) -> [u8; TRAILER_BYTES as usize] {
    super::trailer_with_magic(object_size, DELTA_MAGIC)
}

/// The object size of a delta slot's trailer (None if `t` is not one).
pub fn parse_delta_trailer(t: &[u8]) -> Option<u64> {
    super::parse_trailer_with_magic(t, DELTA_MAGIC)
}

impl DeltaSlot {
    /// A delta over `base` holding one range.
    pub fn over(base: (u8, Ver), object_size: u64, shard_size: u64, at: u64, len: u64) -> Self {
        DeltaSlot {
            base: Some(base),
            object_size,
            shard_size,
            extents: vec![Extent { offset: at, len }],
        }
    }

    /// A delta that needs no base: one extent over the whole shard.
    pub fn whole(object_size: u64, shard_size: u64) -> Self {
        DeltaSlot {
            base: None,
            object_size,
            shard_size,
            extents: if shard_size == 0 {
                Vec::new()
            } else {
                vec![Extent {
                    offset: 0,
                    len: shard_size,
                }]
            },
        }
    }

    /// Bytes of the payload (the extents' lengths).
    pub fn payload_bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.len).sum()
    }

    /// Stored bytes of a delta slot with this metadata.
    pub fn stored_bytes(&self) -> u64 {
        self.payload_bytes() + (HEADER_FIXED_BYTES + 16 * self.extents.len()) as u64 + TRAILER_BYTES
    }

    fn check(&self) -> Result<(), DeltaError> {
        // A shard is never larger than a whole object (bounds what a reader allocates).
        if self.shard_size > spindle_types::limits::OBJECT_BYTES_MAX {
            return Err(DeltaError::Malformed("shard larger than any object"));
        }
        let mut end = 0u64;
        for (i, e) in self.extents.iter().enumerate() {
            if e.len == 0 || (i > 0 && e.offset < end) {
                return Err(DeltaError::Malformed("extents overlap, touch or are empty"));
            }
            end = e
                .offset
                .checked_add(e.len)
                .filter(|&x| x <= self.shard_size)
                .ok_or(DeltaError::Malformed("extent beyond the shard"))?;
        }
        if self.base.is_none() && self.payload_bytes() != self.shard_size {
            return Err(DeltaError::Malformed(
                "a delta without a base must cover the shard",
            ));
        }
        if self.extents.len() > DELTA_EXTENTS_MAX {
            return Err(DeltaError::Malformed("too many extents"));
        }
        Ok(())
    }

    /// The stored bytes: `payload` (exactly `payload_bytes()` long), header, trailer.
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        assert_eq!(payload.len() as u64, self.payload_bytes());
        debug_assert_eq!(self.check(), Ok(()));
        let mut out = Vec::with_capacity(self.stored_bytes() as usize);
        out.extend_from_slice(payload);
        let h0 = out.len();
        let (flags, pos, ver) = match self.base {
            Some((pos, v)) => (1u8, pos, v),
            None => (0u8, 0, Ver::ZERO),
        };
        out.push(flags);
        out.push(pos);
        out.extend_from_slice(&ver.epoch.to_le_bytes());
        out.extend_from_slice(&ver.seq.to_le_bytes());
        out.extend_from_slice(&self.shard_size.to_le_bytes());
        out.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for e in &self.extents {
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
        }
        let crc = spindle_types::crc::crc32c(&out[h0..]);
        out.extend_from_slice(&crc.to_le_bytes());
        let header_len = (out.len() - h0 + 4) as u32;
        out.extend_from_slice(&header_len.to_le_bytes());
        out.extend_from_slice(&delta_trailer(self.object_size));
        debug_assert_eq!(out.len() as u64, self.stored_bytes());
        out
    }

    /// Parses stored bytes: (metadata, payload).
    pub fn parse(raw: &[u8]) -> Result<(DeltaSlot, &[u8]), DeltaError> {
        let t = TRAILER_BYTES as usize;
        if raw.len() < t + HEADER_FIXED_BYTES {
            return Err(DeltaError::Short(raw.len()));
        }
        let object_size = parse_delta_trailer(&raw[raw.len() - t..]).ok_or(DeltaError::Trailer)?;
        let body = &raw[..raw.len() - t];
        let header_len = u32_at(body, body.len() - 4) as usize;
        if header_len < HEADER_FIXED_BYTES || header_len > body.len() {
            return Err(DeltaError::Malformed("header length"));
        }
        let h0 = body.len() - header_len;
        let h = &body[h0..];
        let crc_at = h.len() - 8;
        if u32_at(h, crc_at) != spindle_types::crc::crc32c(&h[..crc_at]) {
            return Err(DeltaError::Checksum);
        }
        let flags = h[0];
        let base = match flags {
            0 => None,
            1 => Some((
                h[1],
                Ver {
                    epoch: u64_at(h, 2),
                    seq: u64_at(h, 10),
                },
            )),
            _ => return Err(DeltaError::Malformed("flags")),
        };
        let shard_size = u64_at(h, 18);
        let n = u32_at(h, 26) as usize;
        if n > DELTA_EXTENTS_MAX || HEADER_FIXED_BYTES + 16 * n != header_len {
            return Err(DeltaError::Malformed("extent count"));
        }
        let extents = (0..n)
            .map(|i| Extent {
                offset: u64_at(h, 30 + 16 * i),
                len: u64_at(h, 38 + 16 * i),
            })
            .collect();
        let d = DeltaSlot {
            base,
            object_size,
            shard_size,
            extents,
        };
        d.check()?;
        let payload = &body[..h0];
        if payload.len() as u64 != d.payload_bytes() {
            return Err(DeltaError::Malformed("payload length"));
        }
        Ok((d, payload))
    }

    /// Lays the extents' bytes over `out`, which holds the base's shard bytes from shard
    /// offset `at` (`out` may run past the shard's end: those bytes are left alone).
    pub fn overlay(&self, payload: &[u8], at: u64, out: &mut [u8]) {
        let end = at + out.len() as u64;
        let mut p = 0u64;
        for e in &self.extents {
            let (s, t) = (e.offset.max(at), e.end().min(end));
            if s < t {
                let src = (p + s - e.offset) as usize;
                let dst = (s - at) as usize;
                let n = (t - s) as usize;
                out[dst..dst + n].copy_from_slice(&payload[src..src + n]);
            }
            p += e.len;
        }
    }

    /// The delta after `patch` is written at shard offset `at` (over this delta's base):
    /// the extents merged with the new range, and the payload rebuilt.
    pub fn with_patch(
        &self,
        payload: &[u8],
        object_size: u64,
        at: u64,
        patch: &[u8],
    ) -> (DeltaSlot, Vec<u8>) {
        let new = Extent {
            offset: at,
            len: patch.len() as u64,
        };
        let mut merged: Vec<Extent> = Vec::with_capacity(self.extents.len() + 1);
        let mut all: Vec<Extent> = self.extents.clone();
        if new.len > 0 {
            all.push(new);
        }
        all.sort_by_key(|e| e.offset);
        for e in all {
            match merged.last_mut() {
                Some(last) if e.offset <= last.end() => {
                    let end = last.end().max(e.end());
                    last.len = end - last.offset;
                }
                _ => merged.push(e),
            }
        }
        let d = DeltaSlot {
            base: self.base,
            object_size,
            shard_size: self.shard_size,
            extents: merged,
        };
        let mut out = vec![0u8; d.payload_bytes() as usize];
        let mut p = 0usize;
        for e in &d.extents {
            let slice = &mut out[p..p + e.len as usize];
            // Old bytes first, then the patch over them (every byte of a merged extent is
            // covered by an old extent or the patch).
            self.overlay(payload, e.offset, slice);
            let (s, t) = (new.offset.max(e.offset), new.end().min(e.end()));
            if s < t {
                slice[(s - e.offset) as usize..(t - e.offset) as usize]
                    .copy_from_slice(&patch[(s - new.offset) as usize..(t - new.offset) as usize]);
            }
            p += e.len as usize;
        }
        (d, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn materialize(d: &DeltaSlot, payload: &[u8], base: &[u8]) -> Vec<u8> {
        let mut out = base.to_vec();
        out.resize(d.shard_size as usize, 0);
        d.overlay(payload, 0, &mut out);
        out
    }

    /// Cumulative deltas over a base always read back as the base with every patch
    /// applied in order, round-trip through the stored form, and read the same through
    /// any window.
    #[test]
    fn cumulative_deltas_match_a_model() {
        for seed in 0..200 {
            let mut r = Rng(seed);
            let shard = 1 + r.below(20_000);
            let base: Vec<u8> = (0..shard).map(|_| r.next() as u8).collect();
            let mut model = base.clone();
            let v = Ver {
                epoch: 3,
                seq: seed,
            };
            let at = r.below(shard);
            let len = 1 + r.below(shard - at);
            let patch: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            model[at as usize..(at + len) as usize].copy_from_slice(&patch);
            let mut d = DeltaSlot::over((2, v), 77, shard, at, len);
            let mut payload = patch;
            for _ in 0..r.below(6) {
                let at = r.below(shard);
                let len = 1 + r.below((shard - at).min(3000));
                let patch: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
                model[at as usize..(at + len) as usize].copy_from_slice(&patch);
                let (nd, np) = d.with_patch(&payload, 99, at, &patch);
                d = nd;
                payload = np;
            }
            assert_eq!(materialize(&d, &payload, &base), model, "seed {seed}");
            let raw = d.encode(&payload);
            assert_eq!(raw.len() as u64, d.stored_bytes());
            let (pd, pp) = DeltaSlot::parse(&raw).unwrap();
            assert_eq!(pd, d);
            assert_eq!(pp, &payload[..]);
            assert_eq!(pd.base, Some((2, v)));
            // A window anywhere (also past the shard's end).
            let w0 = r.below(shard + 10);
            let wl = r.below(shard + 10);
            let mut win: Vec<u8> = (w0..w0 + wl)
                .map(|i| base.get(i as usize).copied().unwrap_or(0xEE))
                .collect();
            d.overlay(&payload, w0, &mut win);
            for (i, b) in win.iter().enumerate() {
                let at = w0 as usize + i;
                let want = model.get(at).copied().unwrap_or(0xEE);
                assert_eq!(*b, want, "seed {seed}: byte {at}");
            }
        }
    }

    #[test]
    fn damage_is_refused() {
        let d = DeltaSlot::over((1, Ver { epoch: 1, seq: 2 }), 10, 100, 10, 20);
        let raw = d.encode(&[5; 20]);
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x40;
            if i < 20 {
                // Payload bytes are covered by the store's block checksums, not here.
                assert!(DeltaSlot::parse(&bad).is_ok());
            } else {
                assert!(DeltaSlot::parse(&bad).is_err(), "flip at {i} accepted");
            }
        }
        assert!(DeltaSlot::parse(&raw[..raw.len() - 1]).is_err());
        assert!(DeltaSlot::parse(&[]).is_err());
        let w = DeltaSlot::whole(7, 64);
        let raw = w.encode(&[1; 64]);
        assert_eq!(DeltaSlot::parse(&raw).unwrap().0, w);
        assert_eq!(parse_delta_trailer(&raw[raw.len() - 16..]), Some(7));
        assert_eq!(super::super::parse_trailer(&raw[raw.len() - 16..]), None);
    }
}
