//! Frame encoding and an incremental decoder for byte streams.

use spindle_types::crc::crc32c;
use thiserror::Error;

/// "SPND" in little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPND");
/// The protocol version this crate speaks.
pub const VERSION: u16 = 10;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 40;
/// Default bound on a frame's payload (`spindle_types::limits::FRAME_PAYLOAD_BYTES_MAX`:
/// a message's largest data payload plus its metadata).
pub const PAYLOAD_LEN_MAX_DEFAULT: u32 = spindle_types::limits::FRAME_PAYLOAD_BYTES_MAX as u32;

const _: () = assert!(HEADER_LEN == 4 + 2 + 2 + 2 + 2 + 8 + 8 + 4 + 4 + 4);

/// Why a frame was rejected. Every variant means: close this connection.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum FrameError {
    #[error("bad magic {0:#010x} (not a Spindle peer?)")]
    BadMagic(u32),
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    UnsupportedVersion(u16),
    #[error("header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("reserved header bits set (flags {flags:#06x}, reserved {reserved:#06x})")]
    ReservedBits { flags: u16, reserved: u16 },
    #[error("payload of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u32, max: u32 },
    #[error("payload checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    PayloadChecksum { stored: u32, computed: u32 },
}

/// The fixed-size part of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: u16,
    pub request_id: u64,
    pub epoch: u64,
    pub payload_len: u32,
    pub payload_crc: u32,
}

/// A decoded, verified frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u16,
    pub request_id: u64,
    pub epoch: u64,
    pub payload: Vec<u8>,
}

/// The header of a frame whose payload is `payload_len` bytes with CRC32C `payload_crc`.
pub fn frame_header(
    kind: u16,
    request_id: u64,
    epoch: u64,
    payload_len: u32,
    payload_crc: u32,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&kind.to_le_bytes());
    // 8..10 flags, 10..12 reserved: zero.
    h[12..20].copy_from_slice(&request_id.to_le_bytes());
    h[20..28].copy_from_slice(&epoch.to_le_bytes());
    h[28..32].copy_from_slice(&payload_len.to_le_bytes());
    h[32..36].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c(&h[..HEADER_LEN - 4]);
    h[36..40].copy_from_slice(&header_crc.to_le_bytes());
    h
}

/// Appends one frame to `out`.
///
/// # Panics
/// If the payload is 4 GiB or more (no caller can build such a message within limits).
pub fn encode_frame(kind: u16, request_id: u64, epoch: u64, payload: &[u8], out: &mut Vec<u8>) {
    let payload_len = u32::try_from(payload.len()).expect("payload below 4 GiB");
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&frame_header(
        kind,
        request_id,
        epoch,
        payload_len,
        crc32c(payload),
    ));
    out.extend_from_slice(payload);
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses and verifies a header (exactly [`HEADER_LEN`] bytes) against `payload_len_max`.
pub fn parse_header(
    bytes: &[u8; HEADER_LEN],
    payload_len_max: u32,
) -> Result<FrameHeader, FrameError> {
    let magic = u32_at(bytes, 0);
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let stored = u32_at(bytes, 36);
    let computed = crc32c(&bytes[..36]);
    if stored != computed {
        return Err(FrameError::HeaderChecksum { stored, computed });
    }
    let version = u16_at(bytes, 4);
    if version != VERSION {
        return Err(FrameError::UnsupportedVersion(version));
    }
    let (flags, reserved) = (u16_at(bytes, 8), u16_at(bytes, 10));
    if flags != 0 || reserved != 0 {
        return Err(FrameError::ReservedBits { flags, reserved });
    }
    let payload_len = u32_at(bytes, 28);
    if payload_len > payload_len_max {
        return Err(FrameError::TooLarge {
            len: payload_len,
            max: payload_len_max,
        });
    }
    Ok(FrameHeader {
        kind: u16_at(bytes, 6),
        request_id: u64_at(bytes, 12),
        epoch: u64_at(bytes, 20),
        payload_len,
        payload_crc: u32_at(bytes, 32),
    })
}

/// Incremental decoder: feed it whatever the socket returned, take out whole frames.
/// After an error the decoder stays failed (the stream cannot be trusted any more).
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    /// Bytes of `buffer` already consumed by returned frames.
    consumed: usize,
    payload_len_max: u32,
    failed: Option<FrameError>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(PAYLOAD_LEN_MAX_DEFAULT)
    }
}

impl FrameDecoder {
    pub fn new(payload_len_max: u32) -> Self {
        FrameDecoder {
            buffer: Vec::new(),
            consumed: 0,
            payload_len_max,
            failed: None,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.consumed > 0 && self.consumed == self.buffer.len() {
            self.buffer.clear();
            self.consumed = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending_len(&self) -> usize {
        self.buffer.len() - self.consumed
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that
    /// ended this stream.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let available = &self.buffer[self.consumed..];
        if available.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut header_bytes = [0u8; HEADER_LEN];
        header_bytes.copy_from_slice(&available[..HEADER_LEN]);
        let header = match parse_header(&header_bytes, self.payload_len_max) {
            Ok(h) => h,
            Err(e) => return Err(self.fail(e)),
        };
        let total = HEADER_LEN + header.payload_len as usize;
        if available.len() < total {
            return Ok(None);
        }
        let payload = &available[HEADER_LEN..total];
        let computed = crc32c(payload);
        if computed != header.payload_crc {
            return Err(self.fail(FrameError::PayloadChecksum {
                stored: header.payload_crc,
                computed,
            }));
        }
        let frame = Frame {
            kind: header.kind,
            request_id: header.request_id,
            epoch: header.epoch,
            payload: payload.to_vec(),
        };
        self.consumed += total;
        if self.consumed == self.buffer.len() {
            self.buffer.clear();
            self.consumed = 0;
        } else if self.consumed > (1 << 20) {
            self.buffer.drain(..self.consumed);
            self.consumed = 0;
        }
        Ok(Some(frame))
    }

    fn fail(&mut self, error: FrameError) -> FrameError {
        self.failed = Some(error.clone());
        error
    }
}
