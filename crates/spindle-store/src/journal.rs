//! Write-ahead journal: record encoding, batch building and replay parsing.
//!
//! Invariants:
//! - A batch starts at a `JOURNAL_ALIGN`-aligned offset and is zero padded to the next one;
//!   it is written with a single write on an O_DSYNC (and, when possible, O_DIRECT) file
//!   descriptor, so when the write completes every record of the batch is durable.
//! - Records carry the journal epoch (changed by every checkpoint) and a global sequence
//!   number; replay accepts only the current epoch and consecutive sequence numbers, so
//!   stale records of earlier epochs and torn tails end replay.
//! - The CRC32C covers the whole record after the CRC field (header rest + body).

use crate::limits::JOURNAL_ALIGN;
use crate::types::{LogEntry, LogOp, Mutation, PgId, Version};

pub const MAGIC: u32 = 0x5250_4A53; // "SJPR" little endian
pub const HEADER_BYTES: usize = 32;
/// Records start at multiples of this inside a batch.
pub const RECORD_ALIGN: usize = 8;

const KIND_APPLY: u8 = 1;
const KIND_RECOVER: u8 = 2;
const KIND_SET_LOG: u8 = 3;
const KIND_REMOVE_PG: u8 = 4;
const KIND_PG_MARK: u8 = 5;
/// Apply's `mut` of a direct write whose data was synced before the record (older format,
/// still replayed).
const MUT_WRITE_FULL_DIRECT: u8 = 5;
/// Apply's `mut` of a direct write written together with its record (`DirectCheck`).
const MUT_WRITE_FULL_DIRECT_CHECKED: u8 = 6;
/// A multi-extent write: u32 count, (u64 offset, u32 length) per extent, then the bytes.
const MUT_WRITE_EXTENTS: u8 = 7;
/// Recover's `has` of a direct recover, older format.
const HAS_DIRECT: u8 = 2;
/// Recover's `has` of a direct recover written together with its record.
const HAS_DIRECT_CHECKED: u8 = 3;

/// One journaled transaction, with everything replay needs (file ids included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A client mutation. `file_id` is the object's data file (0 for a delete of a
    /// missing object).
    Apply {
        pg: PgId,
        name: String,
        version: Version,
        file_id: u64,
        mutation: Mutation,
    },
    Recover {
        pg: PgId,
        name: String,
        file_id: u64,
        state: Option<(Vec<u8>, Version)>,
    },
    SetPgLog {
        pg: PgId,
        entries: Vec<LogEntry>,
        last_version: Version,
        log_tail: Version,
    },
    RemovePg {
        pg: PgId,
    },
    /// Marks a PG copy incomplete (missing objects its log does not account for), or
    /// complete again: then its log is cleared and `log_tail` set to its last_version.
    PgMark {
        pg: PgId,
        incomplete: bool,
    },
    /// A large WriteFull whose `size` bytes go to the file `file_id` (fresh or reused) with
    /// O_DSYNC writes issued together with this record's batch: the batch is acknowledged
    /// only when both are durable, so the record carries the data's block checksums and
    /// replay checks them where the data may not have landed (see `DirectCheck`).
    ApplyDirect {
        pg: PgId,
        name: String,
        version: Version,
        file_id: u64,
        size: u64,
        check: DirectCheck,
    },
    /// `Recover` with data, written like `ApplyDirect`.
    RecoverDirect {
        pg: PgId,
        name: String,
        version: Version,
        file_id: u64,
        size: u64,
        check: DirectCheck,
    },
}

/// What a direct record carries to check its data file at replay.
///
/// The data of a direct record is written at the same time as the record's batch (one
/// flush for both). A batch is acknowledged only when its journal write and all its data
/// writes completed, and the next batch starts after that, so only the journal's *last*
/// batch can have a durable record whose data did not land. Replay therefore checks the
/// file of a direct record of the last batch (`batch_last_seq` >= the last valid record's
/// sequence number) against `crcs` and ends the journal before a record that fails; the
/// records of earlier batches are trusted, and their `crcs` (not a re-read of the file) become
/// the object's checksums, so bit rot in the file is found by reads instead of being
/// checksummed as if it were data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectCheck {
    /// Sequence number of the last record of this record's batch.
    pub batch_last_seq: u64,
    /// CRC32C of each 4 KiB block of the data (the last one of its real bytes); empty in a
    /// record of the older format (data synced before the record), whose checksums replay
    /// recomputes from the file.
    pub crcs: Vec<u32>,
}

impl DirectCheck {
    /// Encoded size: batch_last_seq u64, count u32, count x u32.
    pub fn encoded_bytes(blocks: usize) -> usize {
        12 + 4 * blocks
    }
}

fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_pg(b: &mut Vec<u8>, pg: PgId) {
    put_u32(b, pg.pool);
    put_u32(b, pg.pg);
}
fn put_version(b: &mut Vec<u8>, v: Version) {
    put_u64(b, v.epoch);
    put_u64(b, v.seq);
}
fn put_name(b: &mut Vec<u8>, name: &str) {
    // Names are validated to <= NAME_BYTES_MAX (< u16::MAX) before they get here.
    let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
    put_u16(b, len);
    b.extend_from_slice(&name.as_bytes()[..usize::from(len)]);
}
fn put_check(b: &mut Vec<u8>, check: &DirectCheck) {
    put_u64(b, check.batch_last_seq);
    put_u32(b, check.crcs.len() as u32);
    for c in &check.crcs {
        put_u32(b, *c);
    }
}
fn put_bytes(b: &mut Vec<u8>, data: &[u8]) {
    put_u64(b, data.len() as u64);
    b.extend_from_slice(data);
}

impl Record {
    fn kind(&self) -> u8 {
        match self {
            Record::Apply { .. } | Record::ApplyDirect { .. } => KIND_APPLY,
            Record::Recover { .. } | Record::RecoverDirect { .. } => KIND_RECOVER,
            Record::SetPgLog { .. } => KIND_SET_LOG,
            Record::RemovePg { .. } => KIND_REMOVE_PG,
            Record::PgMark { .. } => KIND_PG_MARK,
        }
    }

    /// Upper bound of the encoded size (header + body + alignment).
    pub fn encoded_bytes_hint(&self) -> usize {
        let body = match self {
            Record::Apply { name, mutation, .. } => {
                64 + name.len()
                    + match mutation {
                        Mutation::WriteFull(d) | Mutation::Write { data: d, .. } => d.len(),
                        Mutation::WriteExtents { extents, data } => data.len() + extents.len() * 12,
                        _ => 0,
                    }
            }
            Record::Recover { name, state, .. } => {
                64 + name.len() + state.as_ref().map_or(0, |(d, _)| d.len())
            }
            Record::SetPgLog { entries, .. } => {
                64 + entries.iter().map(|e| 19 + e.name.len()).sum::<usize>()
            }
            Record::RemovePg { .. } => 8,
            Record::PgMark { .. } => 9,
            Record::ApplyDirect { name, check, .. } | Record::RecoverDirect { name, check, .. } => {
                64 + name.len() + DirectCheck::encoded_bytes(check.crcs.len())
            }
        };
        HEADER_BYTES + body + RECORD_ALIGN
    }

    fn encode_body(&self, b: &mut Vec<u8>) {
        match self {
            Record::Apply {
                pg,
                name,
                version,
                file_id,
                mutation,
            } => {
                put_pg(b, *pg);
                put_version(b, *version);
                put_u64(b, *file_id);
                put_name(b, name);
                match mutation {
                    Mutation::WriteFull(data) => {
                        b.push(1);
                        put_bytes(b, data);
                    }
                    Mutation::Write { offset, data } => {
                        b.push(2);
                        put_u64(b, *offset);
                        put_bytes(b, data);
                    }
                    Mutation::Truncate { size_bytes } => {
                        b.push(3);
                        put_u64(b, *size_bytes);
                    }
                    Mutation::Delete => b.push(4),
                    Mutation::WriteExtents { extents, data } => {
                        b.push(MUT_WRITE_EXTENTS);
                        b.extend_from_slice(&(extents.len() as u32).to_le_bytes());
                        for e in extents {
                            put_u64(b, e.offset);
                            b.extend_from_slice(&e.len_bytes.to_le_bytes());
                        }
                        put_bytes(b, data);
                    }
                }
            }
            Record::Recover {
                pg,
                name,
                file_id,
                state,
            } => {
                put_pg(b, *pg);
                put_u64(b, *file_id);
                put_name(b, name);
                match state {
                    None => b.push(0),
                    Some((data, version)) => {
                        b.push(1);
                        put_version(b, *version);
                        put_bytes(b, data);
                    }
                }
            }
            Record::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            } => {
                put_pg(b, *pg);
                put_version(b, *last_version);
                put_version(b, *log_tail);
                put_u32(b, u32::try_from(entries.len()).unwrap_or(u32::MAX));
                for e in entries {
                    put_version(b, e.version);
                    b.push(match e.op {
                        LogOp::Modify => 1,
                        LogOp::Delete => 2,
                    });
                    put_name(b, &e.name);
                }
            }
            Record::RemovePg { pg } => put_pg(b, *pg),
            Record::PgMark { pg, incomplete } => {
                put_pg(b, *pg);
                b.push(u8::from(*incomplete));
            }
            Record::ApplyDirect {
                pg,
                name,
                version,
                file_id,
                size,
                check,
            } => {
                put_pg(b, *pg);
                put_version(b, *version);
                put_u64(b, *file_id);
                put_name(b, name);
                b.push(MUT_WRITE_FULL_DIRECT_CHECKED);
                put_u64(b, *size);
                put_check(b, check);
            }
            Record::RecoverDirect {
                pg,
                name,
                version,
                file_id,
                size,
                check,
            } => {
                put_pg(b, *pg);
                put_u64(b, *file_id);
                put_name(b, name);
                b.push(HAS_DIRECT_CHECKED);
                put_version(b, *version);
                put_u64(b, *size);
                put_check(b, check);
            }
        }
    }

    /// Appends the record (header + body, padded to `RECORD_ALIGN`) to `out`.
    pub fn encode(&self, epoch: u64, seq: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + HEADER_BYTES, 0);
        self.encode_body(out);
        let body_len = out.len() - start - HEADER_BYTES;
        let h = &mut out[start..start + HEADER_BYTES];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&u32::try_from(body_len).unwrap_or(u32::MAX).to_le_bytes());
        h[12] = self.kind();
        h[16..24].copy_from_slice(&epoch.to_le_bytes());
        h[24..32].copy_from_slice(&seq.to_le_bytes());
        let crc = spindle_types::crc::crc32c(&out[start + 8..]);
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        let padded = out.len().next_multiple_of(RECORD_ALIGN);
        out.resize(padded, 0);
    }
}

/// Bounds-checked little-endian reader over a record body.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn pg(&mut self) -> Option<PgId> {
        Some(PgId {
            pool: self.u32()?,
            pg: self.u32()?,
        })
    }
    fn version(&mut self) -> Option<Version> {
        Some(Version {
            epoch: self.u64()?,
            seq: self.u64()?,
        })
    }
    fn name(&mut self) -> Option<String> {
        let len = usize::from(self.u16()?);
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
    /// A `DirectCheck` of data of `size` bytes (exactly one CRC per 4 KiB block).
    fn check(&mut self, size: u64) -> Option<DirectCheck> {
        let batch_last_seq = self.u64()?;
        let count = self.u32()? as u64;
        if count != size.div_ceil(crate::limits::BLOCK_BYTES) {
            return None;
        }
        let raw = self.take(usize::try_from(count).ok()?.checked_mul(4)?)?;
        let crcs = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Some(DirectCheck {
            batch_last_seq,
            crcs,
        })
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let len = usize::try_from(self.u64()?).ok()?;
        Some(self.take(len)?.to_vec())
    }
}

fn decode_body(kind: u8, body: &[u8]) -> Option<Record> {
    let mut c = Cursor { b: body, pos: 0 };
    let rec = match kind {
        KIND_APPLY => {
            let pg = c.pg()?;
            let version = c.version()?;
            let file_id = c.u64()?;
            let name = c.name()?;
            let mutation = match c.u8()? {
                1 => Mutation::WriteFull(c.bytes()?),
                2 => {
                    let offset = c.u64()?;
                    Mutation::Write {
                        offset,
                        data: c.bytes()?,
                    }
                }
                3 => Mutation::Truncate {
                    size_bytes: c.u64()?,
                },
                4 => Mutation::Delete,
                MUT_WRITE_EXTENTS => {
                    let n = c.u32()? as usize;
                    if n > spindle_types::limits::WRITE_EXTENTS_MAX {
                        return None;
                    }
                    let mut extents = Vec::with_capacity(n);
                    for _ in 0..n {
                        let offset = c.u64()?;
                        let len_bytes = c.u32()?;
                        extents.push(spindle_types::Extent { offset, len_bytes });
                    }
                    let data = c.bytes()?;
                    spindle_types::check_extents(&extents, data.len()).ok()?;
                    Mutation::WriteExtents { extents, data }
                }
                m @ (MUT_WRITE_FULL_DIRECT | MUT_WRITE_FULL_DIRECT_CHECKED) => {
                    let size = c.u64()?;
                    let check = match m {
                        MUT_WRITE_FULL_DIRECT_CHECKED => c.check(size)?,
                        _ => DirectCheck::default(),
                    };
                    let rec = Record::ApplyDirect {
                        pg,
                        name,
                        version,
                        file_id,
                        size,
                        check,
                    };
                    return (c.pos == body.len()).then_some(rec);
                }
                _ => return None,
            };
            Record::Apply {
                pg,
                name,
                version,
                file_id,
                mutation,
            }
        }
        KIND_RECOVER => {
            let pg = c.pg()?;
            let file_id = c.u64()?;
            let name = c.name()?;
            let state = match c.u8()? {
                0 => None,
                1 => {
                    let v = c.version()?;
                    Some((c.bytes()?, v))
                }
                h @ (HAS_DIRECT | HAS_DIRECT_CHECKED) => {
                    let version = c.version()?;
                    let size = c.u64()?;
                    let check = match h {
                        HAS_DIRECT_CHECKED => c.check(size)?,
                        _ => DirectCheck::default(),
                    };
                    let rec = Record::RecoverDirect {
                        pg,
                        name,
                        version,
                        file_id,
                        size,
                        check,
                    };
                    return (c.pos == body.len()).then_some(rec);
                }
                _ => return None,
            };
            Record::Recover {
                pg,
                name,
                file_id,
                state,
            }
        }
        KIND_SET_LOG => {
            let pg = c.pg()?;
            let last_version = c.version()?;
            let log_tail = c.version()?;
            let n = c.u32()? as usize;
            let mut entries = Vec::with_capacity(n.min(body.len() / 19));
            for _ in 0..n {
                let version = c.version()?;
                let op = match c.u8()? {
                    1 => LogOp::Modify,
                    2 => LogOp::Delete,
                    _ => return None,
                };
                entries.push(LogEntry {
                    version,
                    name: c.name()?,
                    op,
                });
            }
            Record::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            }
        }
        KIND_REMOVE_PG => Record::RemovePg { pg: c.pg()? },
        KIND_PG_MARK => {
            let pg = c.pg()?;
            let incomplete = match c.u8()? {
                0 => false,
                1 => true,
                _ => return None,
            };
            Record::PgMark { pg, incomplete }
        }
        _ => return None,
    };
    (c.pos == body.len()).then_some(rec)
}

/// Result of parsing one position of the journal.
pub enum Parsed {
    /// A valid record of the expected epoch/seq, occupying `bytes` (padded).
    Record { record: Record, bytes: usize },
    /// More input is needed: at least this many bytes from the record start.
    NeedBytes(usize),
    /// Not a valid record of the expected epoch and sequence number here.
    Invalid,
}

/// Parses the record at the start of `buf` (`eof`: no more bytes exist after `buf`).
pub fn parse(buf: &[u8], eof: bool, epoch: u64, seq: u64) -> Parsed {
    if buf.len() < HEADER_BYTES {
        return if eof {
            Parsed::Invalid
        } else {
            Parsed::NeedBytes(HEADER_BYTES)
        };
    }
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&buf[i..i + 8]);
        u64::from_le_bytes(a)
    };
    if u32_at(0) != MAGIC || u64_at(16) != epoch || u64_at(24) != seq {
        return Parsed::Invalid;
    }
    let body_len = u32_at(8) as usize;
    let total = HEADER_BYTES + body_len;
    if buf.len() < total {
        return if eof {
            Parsed::Invalid
        } else {
            Parsed::NeedBytes(total)
        };
    }
    if spindle_types::crc::crc32c(&buf[8..total]) != u32_at(4) {
        return Parsed::Invalid;
    }
    match decode_body(buf[12], &buf[HEADER_BYTES..total]) {
        Some(record) => Parsed::Record {
            record,
            bytes: total.next_multiple_of(RECORD_ALIGN),
        },
        None => Parsed::Invalid,
    }
}

/// Rounds a batch length up to the journal alignment.
pub fn batch_padded_len(len: usize) -> usize {
    len.next_multiple_of(JOURNAL_ALIGN).max(JOURNAL_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg() -> PgId {
        PgId { pool: 2, pg: 9 }
    }

    fn parse_one(bytes: &[u8], seq: u64) -> Option<Record> {
        match parse(bytes, true, 4, seq) {
            Parsed::Record { record, .. } => Some(record),
            _ => None,
        }
    }

    #[test]
    fn direct_records_round_trip_with_their_checks() {
        let version = Version { epoch: 3, seq: 8 };
        let crcs: Vec<u32> = (0..33).map(|i| 0x1234_0000 + i).collect();
        let check = DirectCheck {
            batch_last_seq: 12,
            crcs,
        };
        let size = 32 * 4096 + 5;
        for r in [
            Record::ApplyDirect {
                pg: pg(),
                name: "obj".into(),
                version,
                file_id: 77,
                size,
                check: check.clone(),
            },
            Record::RecoverDirect {
                pg: pg(),
                name: "obj".into(),
                version,
                file_id: 78,
                size,
                check: check.clone(),
            },
        ] {
            let mut out = Vec::new();
            r.encode(4, 10, &mut out);
            assert!(out.len() <= r.encoded_bytes_hint());
            assert_eq!(parse_one(&out, 10), Some(r));
        }
    }

    /// Records written before checks existed (`mut` 5, `has` 2: the data was synced before
    /// the record) still replay, with no check (CRCs recomputed from the file).
    #[test]
    fn older_direct_records_decode_without_a_check() {
        let mut body = Vec::new();
        put_pg(&mut body, pg());
        put_version(&mut body, Version { epoch: 1, seq: 2 });
        put_u64(&mut body, 5);
        put_name(&mut body, "x");
        body.push(MUT_WRITE_FULL_DIRECT);
        put_u64(&mut body, 200_000);
        match decode_body(KIND_APPLY, &body) {
            Some(Record::ApplyDirect { size, check, .. }) => {
                assert_eq!(size, 200_000);
                assert_eq!(check, DirectCheck::default());
            }
            other => panic!("{other:?}"),
        }
        let mut body = Vec::new();
        put_pg(&mut body, pg());
        put_u64(&mut body, 6);
        put_name(&mut body, "x");
        body.push(HAS_DIRECT);
        put_version(&mut body, Version { epoch: 1, seq: 2 });
        put_u64(&mut body, 200_000);
        assert!(matches!(
            decode_body(KIND_RECOVER, &body),
            Some(Record::RecoverDirect { check, .. }) if check.crcs.is_empty()
        ));
    }

    /// A check whose CRC count does not match the size is refused (the record is invalid),
    /// and so is a truncated one.
    #[test]
    fn a_check_of_the_wrong_length_is_refused() {
        let body_with = |crcs: Vec<u32>| {
            let r = Record::ApplyDirect {
                pg: pg(),
                name: "o".into(),
                version: Version { epoch: 1, seq: 1 },
                file_id: 1,
                size: 8192,
                check: DirectCheck {
                    batch_last_seq: 1,
                    crcs,
                },
            };
            let mut body = Vec::new();
            r.encode_body(&mut body);
            body
        };
        assert_eq!(decode_body(KIND_APPLY, &body_with(vec![1, 2, 3])), None);
        let body = body_with(vec![1, 2]);
        assert!(decode_body(KIND_APPLY, &body).is_some());
        for cut in 1..12 {
            assert_eq!(decode_body(KIND_APPLY, &body[..body.len() - cut]), None);
        }
    }
}
