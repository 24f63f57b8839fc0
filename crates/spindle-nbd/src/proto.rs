//! NBD wire constants and pure (I/O-free) encoding/decoding helpers.
//!
//! All numeric constants are data taken from the NBD protocol specification,
//! `doc/proto.md` of <https://github.com/NetworkBlockDevice/nbd> (current master; note
//! that pre-2018 revisions numbered the meta-context options 10/11 instead of 9/10). Everything on the
//! wire is big-endian. Nothing in this module panics on any input: decoders return
//! `None`/`Err` for malformed data.

// ---- Handshake ----------------------------------------------------------------------

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, newstyle magic (server greeting and every client option header).
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flags (server -> client).
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (client -> server).
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option types.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply types.
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

/// `NBD_REP_INFO` item types.
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

/// The only metadata context this server implements.
pub const BASE_ALLOCATION: &str = "base:allocation";

// ---- Transmission -------------------------------------------------------------------

pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Size of a (compact) request header.
pub const REQUEST_HEADER_BYTES: usize = 28;

/// Command types.
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
/// Every command flag this server understands; any other bit -> `EINVAL`.
pub const KNOWN_CMD_FLAGS: u16 = NBD_CMD_FLAG_FUA
    | NBD_CMD_FLAG_NO_HOLE
    | NBD_CMD_FLAG_DF
    | NBD_CMD_FLAG_REQ_ONE
    | NBD_CMD_FLAG_FAST_ZERO;

/// Structured reply chunk flags and types.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

/// Error values on the wire (Linux errno numbers, as the spec mandates).
pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

/// Known command types, decoded from the 16-bit `type` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    /// Any other value; answered with `EINVAL`.
    Unknown(u16),
}

impl Command {
    pub fn from_wire(v: u16) -> Command {
        match v {
            NBD_CMD_READ => Command::Read,
            NBD_CMD_WRITE => Command::Write,
            NBD_CMD_DISC => Command::Disc,
            NBD_CMD_FLUSH => Command::Flush,
            NBD_CMD_TRIM => Command::Trim,
            NBD_CMD_CACHE => Command::Cache,
            NBD_CMD_WRITE_ZEROES => Command::WriteZeroes,
            NBD_CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }
}

/// A decoded request header (the payload of a WRITE follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: Command,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why a request header could not be decoded. The stream cannot be resynchronised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRequestMagic(pub u32);

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl RequestHeader {
    /// Decodes a 28-byte request header. The array type makes every index in bounds.
    pub fn decode(b: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, BadRequestMagic> {
        let magic = be_u32(b, 0);
        if magic != NBD_REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        Ok(RequestHeader {
            flags: be_u16(b, 4),
            command: Command::from_wire(be_u16(b, 6)),
            handle: be_u64(b, 8),
            offset: be_u64(b, 16),
            length: be_u32(b, 24),
        })
    }

    /// Encodes a request header (used by tests and diagnostic clients).
    pub fn encode(flags: u16, command: u16, handle: u64, offset: u64, length: u32) -> [u8; 28] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&flags.to_be_bytes());
        b[6..8].copy_from_slice(&command.to_be_bytes());
        b[8..16].copy_from_slice(&handle.to_be_bytes());
        b[16..24].copy_from_slice(&offset.to_be_bytes());
        b[24..28].copy_from_slice(&length.to_be_bytes());
        b
    }
}

/// Cursor over option data; every read is bounds-checked.
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| be_u16(b, 0))
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| be_u32(b, 0))
    }
    /// A string prefixed by a 32-bit length; `None` if truncated, too long or not UTF-8.
    pub fn string32(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        if len > MAX_STRING_BYTES {
            return None;
        }
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).ok()
    }
    pub fn is_empty(&self) -> bool {
        self.pos == self.data.len()
    }
}

/// The spec's hard limit on strings (export names, messages, context names).
pub const MAX_STRING_BYTES: usize = 4096;

/// Decoded payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parses `NBD_OPT_INFO`/`NBD_OPT_GO` data: u32 name length, name, u16 count, u16 items.
/// `None` = malformed (reply `NBD_REP_ERR_INVALID`).
pub fn parse_info_request(data: &[u8]) -> Option<InfoRequest> {
    let mut c = Cursor::new(data);
    let name = c.string32()?;
    let n = c.u16()?;
    let mut requests = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        requests.push(c.u16()?);
    }
    if !c.is_empty() {
        return None;
    }
    Some(InfoRequest { name, requests })
}

/// Decoded payload of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// Parses meta-context option data: u32 name length, name, u32 count, (u32 len, query)*.
pub fn parse_meta_context_request(data: &[u8]) -> Option<MetaContextRequest> {
    let mut c = Cursor::new(data);
    let export = c.string32()?;
    let n = c.u32()?;
    // Each query takes at least 4 bytes; bound the allocation by the data present.
    let mut queries = Vec::with_capacity((n as usize).min(data.len() / 4));
    for _ in 0..n {
        queries.push(c.string32()?);
    }
    if !c.is_empty() {
        return None;
    }
    Some(MetaContextRequest { export, queries })
}

/// Encodes an option reply header followed by `data`.
pub fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&reply_type.to_be_bytes());
    // Option reply payloads we build are far below 4 GiB (strings <= 4096 bytes).
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Header of a simple reply (data, if any, follows).
pub fn simple_reply_header(error: u32, handle: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Header of a structured reply chunk (`length` bytes of payload follow).
pub fn structured_reply_header(flags: u16, reply_type: u16, handle: u64, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// Truncates `s` to at most `max` bytes on a char boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_roundtrip_and_bad_magic() {
        let b = RequestHeader::encode(NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 0xdead_beef, 4096, 512);
        let h = RequestHeader::decode(&b).unwrap();
        assert_eq!(
            h,
            RequestHeader {
                flags: NBD_CMD_FLAG_FUA,
                command: Command::Write,
                handle: 0xdead_beef,
                offset: 4096,
                length: 512
            }
        );
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(
            RequestHeader::decode(&bad),
            Err(BadRequestMagic(0x0060_9513))
        );
        let b = RequestHeader::encode(0, 77, 1, 0, 0);
        assert_eq!(
            RequestHeader::decode(&b).unwrap().command,
            Command::Unknown(77)
        );
    }

    #[test]
    fn info_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
        d.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        let r = parse_info_request(&d).unwrap();
        assert_eq!(r.name, "vol");
        assert_eq!(r.requests, vec![NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE]);
        // Truncated, trailing garbage, and absurd lengths are all rejected, never panic.
        for cut in 0..d.len() {
            assert!(parse_info_request(&d[..cut]).is_none(), "cut {cut}");
        }
        let mut extra = d.clone();
        extra.push(0);
        assert!(parse_info_request(&extra).is_none());
        assert!(parse_info_request(&[0xff, 0xff, 0xff, 0xff]).is_none());
    }

    #[test]
    fn meta_context_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&0u32.to_be_bytes());
        d.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        let r = parse_meta_context_request(&d).unwrap();
        assert_eq!(r.export, "");
        assert_eq!(r.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);
        for cut in 0..d.len() {
            assert!(parse_meta_context_request(&d[..cut]).is_none());
        }
        // A huge query count with no data behind it does not allocate or panic.
        let mut huge = Vec::new();
        huge.extend_from_slice(&0u32.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_context_request(&huge).is_none());
    }

    #[test]
    fn reply_encoding() {
        let r = option_reply(NBD_OPT_GO, NBD_REP_ACK, &[]);
        assert_eq!(r.len(), 20);
        assert_eq!(&r[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let s = structured_reply_header(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 7, 0);
        assert_eq!(&s[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(
            &simple_reply_header(NBD_EINVAL, 9)[4..8],
            &22u32.to_be_bytes()
        );
        assert_eq!(truncate_utf8("héllo", 2), "h");
    }
}
