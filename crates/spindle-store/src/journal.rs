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
    /// A large WriteFull whose `size` bytes were already written and synced to the new
    /// file `file_id` before this record was journaled.
    ApplyDirect {
        pg: PgId,
        name: String,
        version: Version,
        file_id: u64,
        size: u64,
    },
    /// `Recover` with data, written like `ApplyDirect`.
    RecoverDirect {
        pg: PgId,
        name: String,
        version: Version,
        file_id: u64,
        size: u64,
    },
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
            Record::ApplyDirect { name, .. } | Record::RecoverDirect { name, .. } => {
                64 + name.len()
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
            } => {
                put_pg(b, *pg);
                put_version(b, *version);
                put_u64(b, *file_id);
                put_name(b, name);
                b.push(5);
                put_u64(b, *size);
            }
            Record::RecoverDirect {
                pg,
                name,
                version,
                file_id,
                size,
            } => {
                put_pg(b, *pg);
                put_u64(b, *file_id);
                put_name(b, name);
                b.push(2);
                put_version(b, *version);
                put_u64(b, *size);
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
                5 => {
                    let size = c.u64()?;
                    let rec = Record::ApplyDirect {
                        pg,
                        name,
                        version,
                        file_id,
                        size,
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
                2 => {
                    let version = c.version()?;
                    let size = c.u64()?;
                    let rec = Record::RecoverDirect {
                        pg,
                        name,
                        version,
                        file_id,
                        size,
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
