//! The unpublished writes of a write log, as reads see them: non-overlapping extents of the
//! image, each with the seq of the record it came from and its bytes (a slice of that
//! record's data, shared, never copied).
//!
//! Invariants: extents never overlap; an extent's bytes are those of the newest logged
//! write covering them; `remove_published(range, seq)` drops only extents of records up to
//! `seq`, so a newer write to the same range stays visible until it is published itself.

use bytes::Bytes;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
struct Extent {
    end: u64,
    seq: u64,
    data: Bytes,
}

/// What a read of a range finds: overlay bytes, or a gap to read from the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Logged(Bytes),
    Gap { offset: u64, len: u64 },
}

#[derive(Default, Debug)]
pub struct Overlay {
    /// start -> extent.
    extents: BTreeMap<u64, Extent>,
    bytes: u64,
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where the extents touching `[offset, ..)` start: the one reaching over `offset`
    /// from before it, else `offset`.
    fn first_start(&self, offset: u64) -> u64 {
        self.extents
            .range(..offset)
            .next_back()
            .filter(|(_, e)| e.end > offset)
            .map_or(offset, |(s, _)| *s)
    }

    /// Keeps the part of extent `e` (starting at `s`) at or after `from`, if any.
    fn keep_tail(&mut self, s: u64, e: &Extent, from: u64) {
        if e.end > from {
            self.bytes += e.end - from;
            self.extents.insert(
                from,
                Extent {
                    end: e.end,
                    seq: e.seq,
                    data: e.data.slice((from - s) as usize..),
                },
            );
        }
    }

    /// Cuts every extent overlapping `[start, end)` back to what lies outside it.
    fn punch(&mut self, start: u64, end: u64) {
        // The extent that starts before `start` and may reach into the range.
        let s = self.first_start(start);
        if let Some(e) = (s < start).then(|| self.extents.get(&s).cloned()).flatten() {
            self.bytes -= e.end - start;
            let head = Extent {
                end: start,
                seq: e.seq,
                data: e.data.slice(..(start - s) as usize),
            };
            self.extents.insert(s, head);
            self.keep_tail(s, &e, end);
        }
        let inside: Vec<u64> = self.extents.range(start..end).map(|(s, _)| *s).collect();
        for s in inside {
            let Some(e) = self.extents.remove(&s) else {
                continue;
            };
            self.bytes -= e.end - s;
            self.keep_tail(s, &e, end);
        }
    }

    /// Records that `data` at `offset` is the newest write there (record `seq`).
    pub fn insert(&mut self, offset: u64, seq: u64, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        self.punch(offset, end);
        self.bytes += data.len() as u64;
        self.extents.insert(offset, Extent { end, seq, data });
    }

    /// Drops the extents inside `[offset, offset + len)` that came from records up to
    /// `seq` (they are now published).
    pub fn remove_published(&mut self, offset: u64, len: u64, seq: u64) {
        let end = offset + len;
        let first = self.first_start(offset);
        let doomed: Vec<u64> = self
            .extents
            .range(first..end)
            .filter(|(_, e)| e.seq <= seq)
            .map(|(s, _)| *s)
            .collect();
        for s in doomed {
            if let Some(e) = self.extents.remove(&s) {
                self.bytes -= e.end - s;
            }
        }
    }

    /// The newest record (seq) with bytes inside `[offset, offset + len)`, if any.
    pub fn newest_seq_in(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset + len;
        let first = self.first_start(offset);
        self.extents
            .range(first..end)
            .filter(|(_, e)| e.end > offset)
            .map(|(_, e)| e.seq)
            .max()
    }

    /// `[offset, offset + len)` as overlay bytes and gaps, in order.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let end = offset + len;
        let mut out = Vec::new();
        let mut at = offset;
        let first = self.first_start(offset);
        for (&s, e) in self.extents.range(first..end) {
            if s > at {
                out.push(Piece::Gap {
                    offset: at,
                    len: s - at,
                });
                at = s;
            }
            let from = at.max(s);
            let to = e.end.min(end);
            if to > from {
                out.push(Piece::Logged(
                    e.data.slice((from - s) as usize..(to - s) as usize),
                ));
                at = to;
            }
        }
        if at < end {
            out.push(Piece::Gap {
                offset: at,
                len: end - at,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random inserts, removals and reads against a byte-per-byte model.
    #[test]
    fn matches_a_byte_model() {
        const SIZE: u64 = 1 << 14;
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut o = Overlay::default();
            // (seq, byte) or None for "not in the overlay".
            let mut model: Vec<Option<(u64, u8)>> = vec![None; SIZE as usize];
            for seq in 1..300u64 {
                let off = rng.gen_range(0..SIZE - 1);
                let len = rng.gen_range(1..(SIZE - off).min(3000));
                if rng.gen_bool(0.7) {
                    let data: Vec<u8> = (0..len).map(|i| (seq as u8) ^ (i as u8)).collect();
                    for i in 0..len {
                        model[(off + i) as usize] = Some((seq, data[i as usize]));
                    }
                    o.insert(off, seq, Bytes::from(data));
                } else {
                    let upto = rng.gen_range(0..seq);
                    o.remove_published(off, len, upto);
                    // Every record up to `upto` is published: its bytes may go (inside
                    // the range they must), newer bytes must all stay.
                    for (i, m) in model.iter_mut().enumerate() {
                        let i = i as u64;
                        let covered = o.pieces(i, 1).iter().any(|p| matches!(p, Piece::Logged(_)));
                        match *m {
                            Some((s, _)) if s > upto => {
                                assert!(covered, "seed {seed}: newer byte {i} dropped")
                            }
                            Some(_) if i >= off && i < off + len => {
                                assert!(!covered, "seed {seed}: published byte {i} kept");
                                *m = None;
                            }
                            _ if !covered => *m = None,
                            _ => {}
                        }
                    }
                }
                let roff = rng.gen_range(0..SIZE - 1);
                let rlen = rng.gen_range(1..(SIZE - roff).min(5000));
                let mut at = roff;
                let mut total = 0;
                for p in o.pieces(roff, rlen) {
                    match p {
                        Piece::Logged(b) => {
                            for (i, byte) in b.iter().enumerate() {
                                let m = model[(at + i as u64) as usize];
                                assert_eq!(
                                    m.map(|m| m.1),
                                    Some(*byte),
                                    "seed {seed} at {}",
                                    at + i as u64
                                );
                            }
                            at += b.len() as u64;
                            total += b.len() as u64;
                        }
                        Piece::Gap { offset, len } => {
                            assert_eq!(offset, at);
                            for i in 0..len {
                                assert_eq!(
                                    model[(at + i) as usize],
                                    None,
                                    "seed {seed} gap at {}",
                                    at + i
                                );
                            }
                            at += len;
                            total += len;
                        }
                    }
                }
                assert_eq!(total, rlen);
                let held: u64 = model.iter().filter(|m| m.is_some()).count() as u64;
                assert_eq!(o.bytes(), held, "seed {seed}");
            }
        }
    }
}
