//! The client write log's file: two superblock slots, then a ring of records.
//!
//! ```text
//! offset 0      superblock slot 0 (4 KiB)
//! offset 4 KiB  superblock slot 1 (4 KiB)
//! offset 8 KiB  ring of `ring_bytes` (a multiple of 4 KiB): records, each padded to 4 KiB
//! ```
//!
//! Superblock (little endian): `u64 magic "SPNDWLOG" | u32 format | u32 0 | u64 log_id |
//! u64 ring_bytes | u64 published_seq | u64 published_lsn | u64 generation | u16 name_len |
//! name (pool/image) | ... | u64 client_id at 320 | ... | u32 crc32c of bytes 0..4092` at
//! 4092. `client_id` is the client whose writes the ring holds (the image lock's holder;
//! 0 in logs written before it was recorded: not checked). The valid slot with the
//! highest generation wins; a write alternates slots, so a torn superblock write leaves
//! the other slot.
//!
//! Record header (64 bytes): `u32 magic "SWLR" | u8 kind (1 write, 2 pad) | 3 x u8 0 |
//! u64 seq | u64 log_id | u64 image offset | u32 data_len | u32 record_bytes |
//! u64 batch_first_seq | 12 x u8 0 | u32 crc32c` of header bytes 0..60 and the data, at
//! 60. `batch_first_seq` is the seq of the first record of the group commit the record was
//! written in: a valid record of a *later* batch after a bad one proves the bad one's batch
//! completed (was acknowledged), so the bad one is damage, not a torn tail. The data follows the header; the
//! record is zero-padded to a multiple of 4 KiB (`record_bytes`). A pad record fills the
//! ring's end when the next record does not fit there; only its header is written.
//!
//! Positions are LSNs: bytes appended since the log was created, never reset; the ring
//! offset of LSN `l` is `l % ring_bytes`. A record never straddles the ring's end.
//! Records are valid in sequence: seq `n + 1` follows seq `n`, from `published_lsn` on; a
//! record from an earlier lap has a lower seq (or another log's id) and ends the scan.

use spindle_types::crc::crc32c;

/// Alignment and padding unit of everything in the file (O_DIRECT).
pub const BLOCK_BYTES: u64 = 4096;
/// Where the ring starts in the file (after the two superblock slots).
pub const RING_START: u64 = 2 * BLOCK_BYTES;
/// Bytes of a record header.
pub const HEADER_BYTES: usize = 64;
/// Largest data of one record: longer writes are logged as several records.
pub const RECORD_DATA_BYTES_MAX: usize = 4 << 20;

const SUPER_MAGIC: u64 = u64::from_le_bytes(*b"SPNDWLOG");
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SWLR");
/// The file format this build writes and reads.
pub const FORMAT: u32 = 1;
const NAME_BYTES_MAX: usize = 256;
const KIND_WRITE: u8 = 1;
const KIND_PAD: u8 = 2;

const _: () = assert!(HEADER_BYTES as u64 <= BLOCK_BYTES);
const _: () = assert!((RECORD_DATA_BYTES_MAX as u64).is_multiple_of(BLOCK_BYTES));
const _: () = assert!(58 + NAME_BYTES_MAX <= BLOCK_BYTES as usize - 4);

/// The state a superblock records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Super {
    pub log_id: u64,
    pub ring_bytes: u64,
    /// Every record up to this seq is durable in the cluster (0: none yet).
    pub published_seq: u64,
    /// Where the first unpublished record starts.
    pub published_lsn: u64,
    /// Counts superblock writes; the newest valid slot wins.
    pub generation: u64,
    /// `pool/image` the log belongs to.
    pub name: String,
    /// The client (image lock holder) whose writes the ring holds; 0: not recorded.
    pub client_id: u64,
}

/// Where the superblock keeps `client_id` (past the longest name).
const CLIENT_ID_AT: usize = 320;
const _: () = assert!(58 + NAME_BYTES_MAX <= CLIENT_ID_AT);

impl Super {
    /// The slot (0 or 1) this superblock is written to: generations alternate.
    pub fn slot(&self) -> u64 {
        self.generation % 2
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES as usize];
        b[0..8].copy_from_slice(&SUPER_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        b[16..24].copy_from_slice(&self.log_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.ring_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.published_seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.published_lsn.to_le_bytes());
        b[48..56].copy_from_slice(&self.generation.to_le_bytes());
        let name = &self.name.as_bytes()[..self.name.len().min(NAME_BYTES_MAX)];
        b[56..58].copy_from_slice(&(name.len() as u16).to_le_bytes());
        b[58..58 + name.len()].copy_from_slice(name);
        b[CLIENT_ID_AT..CLIENT_ID_AT + 8].copy_from_slice(&self.client_id.to_le_bytes());
        let crc = crc32c(&b[..BLOCK_BYTES as usize - 4]);
        b[BLOCK_BYTES as usize - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The superblock in `b` (one slot), or why not.
    pub fn decode(b: &[u8]) -> Result<Super, String> {
        if b.len() < BLOCK_BYTES as usize {
            return Err("short superblock".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if u64_at(0) != SUPER_MAGIC {
            return Err("not a Spindle write log (bad magic)".into());
        }
        let stored = u32::from_le_bytes(b[4092..4096].try_into().unwrap_or([0; 4]));
        let computed = crc32c(&b[..4092]);
        if stored != computed {
            return Err(format!(
                "superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let format = u32::from_le_bytes(b[8..12].try_into().unwrap_or([0; 4]));
        if format != FORMAT {
            return Err(format!(
                "write log format {format} is not supported (this build reads {FORMAT})"
            ));
        }
        let name_len = u16::from_le_bytes([b[56], b[57]]) as usize;
        if name_len > NAME_BYTES_MAX {
            return Err("superblock name too long".into());
        }
        let ring_bytes = u64_at(24);
        if ring_bytes == 0 || ring_bytes % BLOCK_BYTES != 0 {
            return Err(format!("bad ring size {ring_bytes}"));
        }
        Ok(Super {
            log_id: u64_at(16),
            ring_bytes,
            published_seq: u64_at(32),
            published_lsn: u64_at(40),
            generation: u64_at(48),
            name: String::from_utf8_lossy(&b[58..58 + name_len]).into_owned(),
            client_id: u64_at(CLIENT_ID_AT),
        })
    }
}

/// Bytes a record with `data_len` bytes of data takes in the ring.
pub fn record_bytes(data_len: usize) -> u64 {
    ((HEADER_BYTES + data_len) as u64).div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

/// Encodes a write record into `out`, which must be `record_bytes(data.len())` long (its
/// padding is zeroed here).
pub fn encode_write(
    out: &mut [u8],
    seq: u64,
    batch_first: u64,
    log_id: u64,
    offset: u64,
    data: &[u8],
) {
    let total = record_bytes(data.len());
    debug_assert_eq!(out.len() as u64, total);
    header(
        out,
        KIND_WRITE,
        seq,
        log_id,
        offset,
        data.len() as u32,
        total as u32,
    );
    out[40..48].copy_from_slice(&batch_first.to_le_bytes());
    out[HEADER_BYTES..HEADER_BYTES + data.len()].copy_from_slice(data);
    out[HEADER_BYTES + data.len()..].fill(0);
    let crc = record_crc(&out[..60], data);
    out[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes a pad record covering `total` bytes into `out`, its first block (the only one
/// written; zeroed past the header here).
pub fn encode_pad(out: &mut [u8], seq: u64, batch_first: u64, log_id: u64, total: u64) {
    header(out, KIND_PAD, seq, log_id, 0, 0, total as u32);
    out[HEADER_BYTES..].fill(0);
    out[40..48].copy_from_slice(&batch_first.to_le_bytes());
    let crc = record_crc(&out[..60], &[]);
    out[60..64].copy_from_slice(&crc.to_le_bytes());
}

fn header(out: &mut [u8], kind: u8, seq: u64, log_id: u64, offset: u64, len: u32, total: u32) {
    out[..HEADER_BYTES].fill(0);
    out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[4] = kind;
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..24].copy_from_slice(&log_id.to_le_bytes());
    out[24..32].copy_from_slice(&offset.to_le_bytes());
    out[32..36].copy_from_slice(&len.to_le_bytes());
    out[36..40].copy_from_slice(&total.to_le_bytes());
}

fn record_crc(header: &[u8], data: &[u8]) -> u32 {
    spindle_types::crc::crc32c_append(crc32c(header), data)
}

/// A record header as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub pad: bool,
    pub seq: u64,
    pub log_id: u64,
    pub offset: u64,
    pub data_len: usize,
    pub record_bytes: u64,
    pub batch_first: u64,
    pub crc: u32,
}

/// The header at the start of `b`, if it has the record magic and sane lengths.
pub fn decode_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER_BYTES {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    if u32_at(0) != RECORD_MAGIC || !(b[4] == KIND_WRITE || b[4] == KIND_PAD) {
        return None;
    }
    let h = Header {
        pad: b[4] == KIND_PAD,
        seq: u64_at(8),
        log_id: u64_at(16),
        offset: u64_at(24),
        data_len: u32_at(32) as usize,
        record_bytes: u32_at(36) as u64,
        batch_first: u64_at(40),
        crc: u32_at(60),
    };
    let sane = h.record_bytes.is_multiple_of(BLOCK_BYTES)
        && h.record_bytes >= BLOCK_BYTES
        && if h.pad {
            h.data_len == 0
        } else {
            h.data_len <= RECORD_DATA_BYTES_MAX && h.record_bytes == record_bytes(h.data_len)
        };
    sane.then_some(h)
}

/// Whether the record's checksum matches: `header_block` holds the header (at least
/// `HEADER_BYTES`), `data` its data (empty for a pad).
pub fn record_ok(header_block: &[u8], h: &Header, data: &[u8]) -> bool {
    data.len() == h.data_len && record_crc(&header_block[..60], data) == h.crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblocks_round_trip_and_damage_is_refused() {
        let s = Super {
            log_id: 9,
            ring_bytes: 64 << 20,
            published_seq: 17,
            published_lsn: 123 * 4096,
            generation: 5,
            name: "rbd/vm1".into(),
            client_id: 0xabcd,
        };
        let b = s.encode();
        assert_eq!(Super::decode(&b), Ok(s.clone()));
        assert_eq!(s.slot(), 1);
        let mut bad = b.clone();
        bad[33] ^= 1;
        assert!(Super::decode(&bad).unwrap_err().contains("checksum"));
        assert!(Super::decode(&[0u8; 4096]).unwrap_err().contains("magic"));
    }

    #[test]
    fn records_round_trip_and_every_flipped_byte_is_caught() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let total = record_bytes(data.len());
        assert_eq!(total, 8192);
        let mut rec = vec![0u8; total as usize];
        encode_write(&mut rec, 3, 2, 77, 1 << 20, &data);
        let h = decode_header(&rec).unwrap();
        assert_eq!(
            (h.seq, h.batch_first, h.log_id, h.offset, h.data_len, h.pad),
            (3, 2, 77, 1 << 20, 5000, false)
        );
        assert!(record_ok(
            &rec,
            &h,
            &rec[HEADER_BYTES..HEADER_BYTES + h.data_len]
        ));
        for i in (0..HEADER_BYTES + data.len()).step_by(97) {
            let mut bad = rec.clone();
            bad[i] ^= 0x10;
            let ok = decode_header(&bad).is_some_and(|h| {
                record_ok(
                    &bad,
                    &h,
                    &bad[HEADER_BYTES..HEADER_BYTES + h.data_len.min(5000)],
                )
            });
            assert!(!ok, "flip at {i} not caught");
        }
        let mut pad = vec![0u8; BLOCK_BYTES as usize];
        encode_pad(&mut pad, 4, 4, 77, 3 * BLOCK_BYTES);
        let h = decode_header(&pad).unwrap();
        assert!(h.pad && h.record_bytes == 3 * BLOCK_BYTES && record_ok(&pad, &h, &[]));
    }
}
