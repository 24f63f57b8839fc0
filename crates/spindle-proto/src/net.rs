//! Async transport over TCP (tokio): framed reads and writes, and [`RpcConn`], a
//! multiplexed request/reply connection shared by many tasks.
//!
//! Invariants:
//! - a frame that fails to parse or verify ends the connection (the byte stream cannot be
//!   resynchronized); every waiting caller gets [`NetError::Closed`] with the reason;
//! - [`RpcConn::start`] enqueues synchronously, so frames leave in the order `start` was
//!   called (the primary relies on this to keep replicas' operation order);
//! - request id 0 is never used for requests: frames with id 0 are unsolicited pushes
//!   (map updates) delivered to the connection's push channel.

use crate::auth::{ConnectAuth, FrameMac, Peer, Verifier, MAC_BYTES};
use crate::frame::{
    encode_frame, frame_header, parse_header, FrameError, HEADER_LEN, PAYLOAD_LEN_MAX_DEFAULT,
};
use crate::msg::Msg;
use crate::request::{CallError, Request};
use crate::transport::{Tcp, Transport};
use crate::CodecError;
use spindle_trace::Stage;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, thiserror::Error, Clone)]
pub enum NetError {
    #[error("connection closed: {0}")]
    Closed(String),
    #[error("timed out after {0} ms")]
    Timeout(u64),
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("bad message: {0}")]
    Codec(#[from] CodecError),
    #[error("i/o: {0}")]
    Io(String),
    /// Authentication failed (final: retrying with the same key fails the same way).
    #[error("authentication failed: {0}")]
    Auth(String),
}

impl From<std::io::Error> for NetError {
    fn from(e: std::io::Error) -> Self {
        NetError::Io(e.to_string())
    }
}

/// A received frame with its decoded message.
#[derive(Debug)]
pub struct Incoming {
    pub request_id: u64,
    pub epoch: u64,
    pub msg: Msg,
    /// CRC32C of each 4 KiB block of the frame's bulk bytes (see
    /// [`RawFrame::bulk_block_crcs`]); empty for small bulks.
    pub bulk_block_crcs: Vec<u32>,
    /// The BLAKE3 hash of the frame's bulk bytes, when its MAC was checked (a daemon
    /// forwarding the same bytes MACs them with it instead of hashing them again).
    pub bulk_hash: Option<[u8; 32]>,
    /// When the frame was decoded, if stage clocks are on (`spindle_trace`).
    pub received: Option<std::time::Instant>,
    /// Who sent it, on an authenticated served connection (None without authentication).
    pub peer: Option<Arc<Peer>>,
}

/// Reads one frame and decodes its message. `Ok(None)` on a clean end of stream between
/// frames.
pub async fn read_msg<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Incoming>, NetError> {
    read_msg_mac(r, None).await
}

/// [`read_msg`], checking the frame's MAC with `mac` if given.
async fn read_msg_mac<R: AsyncRead + Unpin>(
    r: &mut R,
    mac: Option<&mut FrameMac>,
) -> Result<Option<Incoming>, NetError> {
    let frame = match read_header(r).await? {
        None => None,
        Some(h) => Some(read_body(r, &h, mac).await?),
    };
    match frame {
        None => Ok(None),
        Some(mut f) => {
            let (request_id, epoch) = (f.request_id, f.epoch);
            let bulk_block_crcs = std::mem::take(&mut f.bulk_block_crcs);
            let bulk_hash = f.bulk_hash;
            Ok(Some(Incoming {
                request_id,
                epoch,
                msg: f.decode()?,
                bulk_block_crcs,
                bulk_hash,
                received: spindle_trace::now(),
                peer: None,
            }))
        }
    }
}

/// A verified frame, its body split into the bulk bytes and the fields.
#[derive(Debug)]
pub struct RawFrame {
    pub kind: u16,
    pub request_id: u64,
    pub epoch: u64,
    /// Bulk length the body claims; it differs from `bulk.len()` only for a bad body.
    bulk_claim: u32,
    pub bulk: Vec<u8>,
    pub fields: Vec<u8>,
    /// CRC32C of each [`BULK_BLOCK_BYTES`] block of `bulk` when it is at least
    /// [`BULK_BLOCK_CRCS_BYTES_MIN`] long and the message can write an object (a client
    /// request or a replication write; else empty): computed in the pass that verifies
    /// the frame checksum (which is combined from them), so a store can keep them as its
    /// block checksums instead of reading the bytes again.
    pub bulk_block_crcs: Vec<u32>,
    /// BLAKE3 of `bulk` if the frame's MAC was checked over it.
    pub bulk_hash: Option<[u8; 32]>,
}

/// Block size of [`RawFrame::bulk_block_crcs`].
pub const BULK_BLOCK_BYTES: usize = spindle_types::crc::CRC_BLOCK_BYTES;
/// Bulks at least this long get block checksums (object payloads the daemons write whole).
pub const BULK_BLOCK_CRCS_BYTES_MIN: usize = 64 << 10;

impl RawFrame {
    /// Decodes the message (taking the bulk bytes without copying them).
    pub fn decode(self) -> Result<Msg, CodecError> {
        if self.bulk_claim as usize != self.bulk.len() {
            return Err(CodecError::TooLong {
                what: "bulk length",
                len: self.bulk_claim as u64,
                max: self.bulk.len() as u64,
            });
        }
        Msg::decode_parts(self.kind, self.bulk, &self.fields)
    }
}

/// Spare capacity of every received payload buffer: room for a small trailer (an
/// erasure-coded shard slot's 16 bytes) appended by the receiver without moving it.
pub const BULK_SPARE_BYTES: usize = 64;

/// Reads exactly `len` bytes into a fresh vector (no zeroing; [`BULK_SPARE_BYTES`] of
/// spare capacity).
async fn read_vec<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    what: &str,
) -> Result<Vec<u8>, NetError> {
    let mut v = Vec::with_capacity(len + BULK_SPARE_BYTES);
    while v.len() < len {
        let n = (&mut *r)
            .take((len - v.len()) as u64)
            .read_buf(&mut v)
            .await?;
        if n == 0 {
            return Err(NetError::Closed(format!(
                "stream ended inside a frame {what} ({} of {len} bytes)",
                v.len()
            )));
        }
    }
    Ok(v)
}

/// Reads the next frame header. `Ok(None)` on a clean end of stream before its first byte.
async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<crate::frame::FrameHeader>, NetError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut header[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(NetError::Closed(format!(
                "stream ended inside a frame header ({got} of {HEADER_LEN} bytes)"
            )));
        }
        got += n;
    }
    Ok(Some(parse_header(&header, PAYLOAD_LEN_MAX_DEFAULT)?))
}

/// Reads and verifies the body of the frame whose header is `h`.
async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    h: &crate::frame::FrameHeader,
    mac: Option<&mut FrameMac>,
) -> Result<RawFrame, NetError> {
    let mac = match mac {
        Some(m) if m.encrypts() => return read_sealed_body(r, h, m).await,
        other => other,
    };
    let len = h.payload_len as usize;
    let mut block_crcs = Vec::new();
    let (bulk_claim, bulk, fields, crc) = if len < 4 {
        let fields = read_vec(r, len, "payload").await?;
        let crc = spindle_types::crc::crc32c(&fields);
        (u32::MAX, Vec::new(), fields, crc)
    } else {
        let prefix = read_vec(r, 4, "payload").await?;
        let claim = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let bulk_len = if claim as usize <= len - 4 {
            claim as usize
        } else {
            0
        };
        let bulk = read_vec(r, bulk_len, "payload").await?;
        let fields = read_vec(r, len - 4 - bulk_len, "payload").await?;
        let crc = spindle_types::crc::crc32c(&prefix);
        let crc =
            if bulk.len() >= BULK_BLOCK_CRCS_BYTES_MIN && crate::msg::kind_writes_objects(h.kind) {
                let bulk_crc = spindle_types::crc::crc32c_blocks(&bulk, &mut block_crcs);
                spindle_types::crc::crc32c_combine(crc, bulk_crc, bulk.len())
            } else {
                spindle_types::crc::crc32c_append(crc, &bulk)
            };
        let crc = spindle_types::crc::crc32c_append(crc, &fields);
        (claim, bulk, fields, crc)
    };
    if crc != h.payload_crc {
        return Err(FrameError::PayloadChecksum {
            stored: h.payload_crc,
            computed: crc,
        }
        .into());
    }
    let mut bulk_hash = None;
    if let Some(mac) = mac {
        let claim = bulk_claim.to_le_bytes();
        let want = if len < 4 {
            mac.frame(
                h.kind,
                h.request_id,
                h.epoch,
                h.payload_len,
                &fields,
                &[],
                &[],
            )
        } else {
            bulk_hash = crate::auth::bulk_hash(&bulk);
            mac.frame_hashed(
                h.kind,
                h.request_id,
                h.epoch,
                h.payload_len,
                &claim,
                bulk.len(),
                bulk_hash.as_ref(),
                &fields,
            )
        };
        let mut got = [0u8; MAC_BYTES];
        r.read_exact(&mut got)
            .await
            .map_err(|e| NetError::Closed(format!("stream ended inside a frame's MAC: {e}")))?;
        if !crate::auth::equal_secret(&got, &want) {
            return Err(NetError::Auth(format!(
                "frame MAC mismatch (kind {}, request {}): altered, forged or replayed",
                h.kind, h.request_id
            )));
        }
    }
    Ok(RawFrame {
        kind: h.kind,
        request_id: h.request_id,
        epoch: h.epoch,
        bulk_claim,
        bulk,
        fields,
        bulk_block_crcs: block_crcs,
        bulk_hash,
    })
}

/// [`read_body`] on an encrypting session: the payload is read whole, its checksum (of the
/// ciphertext) checked, then it is opened in place and split like a plain body.
async fn read_sealed_body<R: AsyncRead + Unpin>(
    r: &mut R,
    h: &crate::frame::FrameHeader,
    mac: &mut FrameMac,
) -> Result<RawFrame, NetError> {
    let len = h.payload_len as usize;
    let mut payload = read_vec(r, len, "payload").await?;
    let crc = spindle_types::crc::crc32c(&payload);
    if crc != h.payload_crc {
        return Err(FrameError::PayloadChecksum {
            stored: h.payload_crc,
            computed: crc,
        }
        .into());
    }
    let mut tag = [0u8; MAC_BYTES];
    r.read_exact(&mut tag)
        .await
        .map_err(|e| NetError::Closed(format!("stream ended inside a frame's tag: {e}")))?;
    mac.open(h.kind, h.request_id, h.epoch, &mut payload, &tag)
        .map_err(|_| {
            NetError::Auth(format!(
                "sealed frame does not open (kind {}, request {}): altered, forged or replayed",
                h.kind, h.request_id
            ))
        })?;
    let mut block_crcs = Vec::new();
    if len < 4 {
        return Ok(RawFrame {
            kind: h.kind,
            request_id: h.request_id,
            epoch: h.epoch,
            bulk_claim: u32::MAX,
            bulk: Vec::new(),
            fields: payload,
            bulk_block_crcs: block_crcs,
            bulk_hash: None,
        });
    }
    let claim = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    let bulk_len = if claim as usize <= len - 4 {
        claim as usize
    } else {
        0
    };
    let fields = payload[4 + bulk_len..].to_vec();
    // The bulk moves to the front of the buffer, which the message then owns.
    payload.copy_within(4..4 + bulk_len, 0);
    payload.truncate(bulk_len);
    let bulk = payload;
    if bulk.len() >= BULK_BLOCK_CRCS_BYTES_MIN && crate::msg::kind_writes_objects(h.kind) {
        spindle_types::crc::crc32c_blocks(&bulk, &mut block_crcs);
    }
    Ok(RawFrame {
        kind: h.kind,
        request_id: h.request_id,
        epoch: h.epoch,
        bulk_claim: claim,
        bulk,
        fields,
        bulk_block_crcs: block_crcs,
        bulk_hash: None,
    })
}

/// Reads and verifies one frame. The body (`u32 bulk length | bulk | fields`) is read in
/// pieces so the bulk bytes land in a buffer of their own, which the decoded message then
/// owns. A body whose bulk length is impossible is still read whole (the stream stays in
/// sync) and reported by [`RawFrame::decode`].
pub async fn read_frame_raw<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<RawFrame>, NetError> {
    match read_header(r).await? {
        None => Ok(None),
        Some(h) => Ok(Some(read_body(r, &h, None).await?)),
    }
}

/// Encodes `msg` as one frame.
pub fn frame_bytes(request_id: u64, epoch: u64, msg: &Msg) -> Vec<u8> {
    let payload = msg.encode();
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_frame(msg.kind(), request_id, epoch, &payload, &mut out);
    out
}

pub async fn write_msg<W: AsyncWrite + Unpin>(
    w: &mut W,
    request_id: u64,
    epoch: u64,
    msg: &Msg,
) -> Result<(), NetError> {
    w.write_all(&frame_bytes(request_id, epoch, msg)).await?;
    w.flush().await?;
    Ok(())
}

/// A message body encoded once, with its checksum, ready to be framed for any number of
/// peers without copying it again (replication sends one body to every replica).
#[derive(Clone)]
pub struct Prepared {
    kind: u16,
    /// `u32 bulk length | fields`: the bulk bytes go out between the two.
    head: Arc<Head>,
    bulk: Arc<Vec<u8>>,
    crc: u32,
}

/// The small part of a [`Prepared`] body, and the hash its frame MACs cover for its bulk
/// (computed by the first authenticated connection that sends it, shared by the others).
struct Head {
    bytes: Vec<u8>,
    bulk_hash: std::sync::OnceLock<[u8; 32]>,
}

impl Head {
    fn new(bytes: Vec<u8>) -> Arc<Head> {
        Arc::new(Head {
            bytes,
            bulk_hash: std::sync::OnceLock::new(),
        })
    }
}

impl std::ops::Deref for Head {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl Prepared {
    /// Encodes `msg` (copies its bulk bytes, checksumming them in the same pass).
    pub fn new(msg: &Msg) -> Prepared {
        let src = msg.bulk();
        let fields = msg.encode_fields();
        let mut head = Vec::with_capacity(4 + fields.len());
        head.extend_from_slice(&(src.len() as u32).to_le_bytes());
        let mut crc = spindle_types::crc::crc32c(&head);
        let mut bulk = Vec::with_capacity(src.len());
        for piece in src.chunks(64 << 10) {
            bulk.extend_from_slice(piece);
            crc = spindle_types::crc::crc32c_append(crc, &bulk[bulk.len() - piece.len()..]);
        }
        let crc = spindle_types::crc::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Head::new(head),
            bulk: Arc::new(bulk),
            crc,
        }
    }

    /// Encodes `msg`, moving its bulk bytes instead of copying them.
    pub fn from_msg(mut msg: Msg) -> Prepared {
        let bulk = msg.take_bulk();
        Self::build(&msg, bulk)
    }

    /// Encodes `msg` (whose own bulk is ignored: empty) with `bulk` as its bulk bytes,
    /// shared rather than copied (others may read the same bytes, e.g. a local write of
    /// the object being replicated). `bulk_crc`: the CRC32C of `bulk` if known (e.g.
    /// combined from block checksums), saving a pass over it.
    pub fn with_shared_bulk(msg: &Msg, bulk: Arc<Vec<u8>>, bulk_crc: Option<u32>) -> Prepared {
        debug_assert!(
            msg.bulk().is_empty(),
            "the message's own bulk would be dropped"
        );
        let fields = msg.encode_fields();
        let mut head = Vec::with_capacity(4 + fields.len());
        head.extend_from_slice(&(bulk.len() as u32).to_le_bytes());
        let crc = spindle_types::crc::crc32c(&head);
        let crc = match bulk_crc {
            Some(b) => spindle_types::crc::crc32c_combine(crc, b, bulk.len()),
            None => spindle_types::crc::crc32c_append(crc, &bulk),
        };
        let crc = spindle_types::crc::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Head::new(head),
            bulk,
            crc,
        }
    }

    fn build(msg: &Msg, bulk: Vec<u8>) -> Prepared {
        let fields = msg.encode_fields();
        let mut head = Vec::with_capacity(4 + fields.len());
        head.extend_from_slice(&(bulk.len() as u32).to_le_bytes());
        let crc = spindle_types::crc::crc32c(&head);
        let crc = spindle_types::crc::crc32c_append(crc, &bulk);
        let crc = spindle_types::crc::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Head::new(head),
            bulk: Arc::new(bulk),
            crc,
        }
    }

    /// The same body, with the BLAKE3 hash of its bulk already known (the hash of the
    /// frame these bytes arrived in: [`Incoming::bulk_hash`]). A wrong hash makes the
    /// peer refuse the frame's MAC (the connection closes), never accept other bytes.
    pub fn with_bulk_hash(self, hash: [u8; 32]) -> Prepared {
        debug_assert_eq!(
            crate::auth::bulk_hash(&self.bulk),
            Some(hash),
            "the hash of other bytes"
        );
        let _ = self.head.bulk_hash.set(hash);
        self
    }

    /// The hash frame MACs cover for the bulk (None when empty).
    fn bulk_hash(&self) -> Option<&[u8; 32]> {
        if self.bulk.is_empty() {
            return None;
        }
        Some(
            self.head
                .bulk_hash
                .get_or_init(|| *blake3::hash(&self.bulk).as_bytes()),
        )
    }

    fn frame(&self, request_id: u64, epoch: u64) -> Outgoing {
        Outgoing {
            header: frame_header(
                self.kind,
                request_id,
                epoch,
                (self.head.len() + self.bulk.len()) as u32,
                self.crc,
            ),
            body: self.clone(),
            queued: spindle_trace::now(),
        }
    }
}

/// One frame queued for a connection's writer: header plus a (possibly shared) body.
pub struct Outgoing {
    header: [u8; HEADER_LEN],
    body: Prepared,
    /// When it was queued, if stage clocks are on.
    queued: Option<std::time::Instant>,
}

fn outgoing(request_id: u64, epoch: u64, msg: &Msg) -> Outgoing {
    Prepared::new(msg).frame(request_id, epoch)
}

/// Frames written by one vectored write at most (up to 4 pieces each; `IOV_MAX` is 1024).
const FRAMES_PER_WRITE_MAX: usize = 64;

/// Writes `frames` with vectored writes straight from their buffers (no copy into a
/// write buffer: a frame's bulk is often a 128 KiB-4 MiB payload). With `stall`, each
/// write call must make progress within it (a peer that stops reading).
async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Outgoing],
    stall: Option<Duration>,
    mac: Option<&mut FrameMac>,
) -> Result<(), NetError> {
    if let Some(mac) = mac {
        if mac.encrypts() {
            return write_sealed_frames(w, frames, stall, mac).await;
        }
        return write_frames_as(w, frames, stall, Some(mac)).await;
    }
    write_frames_as(w, frames, stall, None).await
}

/// [`write_frames`] on an encrypting session: each payload is copied, sealed in place and
/// sent with a header that carries the ciphertext's checksum.
async fn write_sealed_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Outgoing],
    stall: Option<Duration>,
    mac: &mut FrameMac,
) -> Result<(), NetError> {
    let mut sealed = Vec::with_capacity(frames.len());
    for f in frames {
        spindle_trace::record(Stage::RpcWriterQueue, f.queued);
        let h = &f.header;
        let u16_at = |at: usize| u16::from_le_bytes([h[at], h[at + 1]]);
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let (kind, request_id, epoch) = (u16_at(6), u64_at(12), u64_at(20));
        let head = &f.body.head;
        let mut payload = Vec::with_capacity(head.len() + f.body.bulk.len());
        payload.extend_from_slice(&head[..4]);
        payload.extend_from_slice(&f.body.bulk);
        payload.extend_from_slice(&head[4..]);
        let tag = mac
            .seal(kind, request_id, epoch, &mut payload)
            .map_err(|_| NetError::Auth("cannot seal a frame".into()))?;
        let header = frame_header(
            kind,
            request_id,
            epoch,
            payload.len() as u32,
            spindle_types::crc::crc32c(&payload),
        );
        sealed.push((header, payload, tag));
    }
    let mut slices = Vec::with_capacity(sealed.len() * 3);
    for (header, payload, tag) in &sealed {
        slices.push(std::io::IoSlice::new(header));
        slices.push(std::io::IoSlice::new(payload));
        slices.push(std::io::IoSlice::new(tag));
    }
    write_slices(w, &mut slices, stall).await
}

/// Writes `slices` whole (see [`write_frames`] for `stall`).
async fn write_slices<W: AsyncWrite + Unpin>(
    w: &mut W,
    slices: &mut [std::io::IoSlice<'_>],
    stall: Option<Duration>,
) -> Result<(), NetError> {
    let mut rest: &mut [std::io::IoSlice<'_>] = slices;
    while !rest.is_empty() {
        let written = match stall {
            None => w.write_vectored(rest).await?,
            Some(stall) => tokio::time::timeout(stall, w.write_vectored(rest))
                .await
                .map_err(|_| NetError::Timeout(stall.as_millis() as u64))??,
        };
        if written == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
        }
        std::io::IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

/// [`write_frames`] in the clear, with a MAC after each frame if `mac` is given.
async fn write_frames_as<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Outgoing],
    stall: Option<Duration>,
    mac: Option<&mut FrameMac>,
) -> Result<(), NetError> {
    let macs: Vec<[u8; MAC_BYTES]> = match mac {
        None => Vec::new(),
        Some(mac) => frames
            .iter()
            .map(|f| {
                let h = &f.header;
                let u16_at = |at: usize| u16::from_le_bytes([h[at], h[at + 1]]);
                let u32_at =
                    |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
                let u64_at = |at: usize| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&h[at..at + 8]);
                    u64::from_le_bytes(a)
                };
                let head = &f.body.head;
                mac.frame_hashed(
                    u16_at(6),
                    u64_at(12),
                    u64_at(20),
                    u32_at(28),
                    &head[..4],
                    f.body.bulk.len(),
                    f.body.bulk_hash(),
                    &head[4..],
                )
            })
            .collect(),
    };
    let mut slices = Vec::with_capacity(frames.len() * 5);
    for (i, f) in frames.iter().enumerate() {
        spindle_trace::record(Stage::RpcWriterQueue, f.queued);
        let head = &f.body.head;
        slices.push(std::io::IoSlice::new(&f.header));
        slices.push(std::io::IoSlice::new(&head[..4]));
        if !f.body.bulk.is_empty() {
            slices.push(std::io::IoSlice::new(&f.body.bulk));
        }
        if head.len() > 4 {
            slices.push(std::io::IoSlice::new(&head[4..]));
        }
        if let Some(m) = macs.get(i) {
            slices.push(std::io::IoSlice::new(m));
        }
    }
    write_slices(w, &mut slices, stall).await
}

/// Writes queued frames to `w`, whatever is queued (up to [`FRAMES_PER_WRITE_MAX`]) in
/// one vectored write. With `stall`, gives up when the peer takes no bytes for that long.
async fn write_queued<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    stall: Option<Duration>,
    mut mac: Option<FrameMac>,
) -> Result<(), NetError> {
    let mut batch = Vec::with_capacity(FRAMES_PER_WRITE_MAX);
    while let Some(frame) = rx.recv().await {
        let start = spindle_trace::now();
        batch.push(frame);
        while batch.len() < FRAMES_PER_WRITE_MAX {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        write_frames(&mut w, &batch, stall, mac.as_mut()).await?;
        if let Some(start) = start {
            spindle_trace::add(Stage::RpcWrite, batch.len() as u64, start.elapsed());
        }
        // Frees each body as soon as it is on the socket.
        batch.clear();
    }
    Ok(())
}

/// Writes queued frames to `w` (see [`write_queued`]).
pub async fn writer_loop<W: AsyncWrite + Unpin>(
    w: W,
    rx: mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), NetError> {
    write_queued(w, rx, None, None).await
}

type Waiter = oneshot::Sender<Result<Incoming, NetError>>;

struct Shared {
    pending: Mutex<HashMap<u64, Waiter>>,
    closed: AtomicBool,
    close_reason: Mutex<String>,
}

impl Shared {
    fn close(&self, reason: String) {
        self.closed.store(true, Ordering::Release);
        if let Ok(mut r) = self.close_reason.lock() {
            if r.is_empty() {
                *r = reason.clone();
            }
        }
        let waiters: Vec<Waiter> = match self.pending.lock() {
            Ok(mut p) => p.drain().map(|(_, w)| w).collect(),
            Err(_) => Vec::new(),
        };
        for w in waiters {
            let _ = w.send(Err(NetError::Closed(reason.clone())));
        }
    }
}

/// A multiplexed request/reply connection (one per peer, shared by all tasks).
pub struct RpcConn {
    peer: String,
    tx: mpsc::UnboundedSender<Outgoing>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    /// When a frame was last queued ([`monotonic_ms`]).
    last_used_ms: AtomicU64,
}

/// Milliseconds since the first call in this process (a monotonic clock for idle checks).
fn monotonic_ms() -> u64 {
    // tokio's clock: the same as std's, except under a paused test clock.
    static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(tokio::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// The reply to one request, once it arrives.
pub struct PendingReply {
    rx: oneshot::Receiver<Result<Incoming, NetError>>,
    peer: String,
}

impl PendingReply {
    pub async fn wait(self, timeout_ms: u64) -> Result<Incoming, NetError> {
        match tokio::time::timeout(Duration::from_millis(timeout_ms), self.rx).await {
            Err(_) => Err(NetError::Timeout(timeout_ms)),
            Ok(Err(_)) => Err(NetError::Closed(format!(
                "{}: connection dropped",
                self.peer
            ))),
            Ok(Ok(r)) => {
                if let Ok(inc) = &r {
                    spindle_trace::record(Stage::RpcReplyWake, inc.received);
                }
                r
            }
        }
    }
}

impl RpcConn {
    /// Connects over TCP; unsolicited frames (request id 0) go to `push` if given.
    pub async fn connect(
        addr: &str,
        timeout_ms: u64,
        push: Option<mpsc::UnboundedSender<Incoming>>,
    ) -> Result<Arc<RpcConn>, NetError> {
        Self::connect_via(&Tcp, addr, timeout_ms, push).await
    }

    /// Connects over `transport` (see [`RpcConn::connect`]).
    pub async fn connect_via<T: Transport>(
        transport: &T,
        addr: &str,
        timeout_ms: u64,
        push: Option<mpsc::UnboundedSender<Incoming>>,
    ) -> Result<Arc<RpcConn>, NetError> {
        Self::connect_auth(transport, addr, timeout_ms, push, &ConnectAuth::None).await
    }

    /// Connects over `transport` and authenticates as `auth` says (the handshake of
    /// `crate::auth`; every later frame carries a MAC). An authentication failure is
    /// [`NetError::Auth`].
    pub async fn connect_auth<T: Transport>(
        transport: &T,
        addr: &str,
        timeout_ms: u64,
        push: Option<mpsc::UnboundedSender<Incoming>>,
        auth: &ConnectAuth,
    ) -> Result<Arc<RpcConn>, NetError> {
        let (read_half, mut write_half) =
            tokio::time::timeout(Duration::from_millis(timeout_ms), transport.connect(addr))
                .await
                .map_err(|_| NetError::Connect {
                    addr: addr.to_string(),
                    reason: format!("timed out after {timeout_ms} ms"),
                })?
                .map_err(|e| NetError::Connect {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })?;
        let mut r = BufReader::with_capacity(CLIENT_READ_BUFFER_BYTES, read_half);
        let macs = match auth {
            ConnectAuth::None => None,
            auth => Some(
                tokio::time::timeout(
                    Duration::from_millis(crate::auth::HANDSHAKE_MS_MAX.min(timeout_ms.max(1000))),
                    client_handshake(&mut r, &mut write_half, auth, addr),
                )
                .await
                .map_err(|_| NetError::Auth(format!("{addr}: the handshake timed out")))??,
            ),
        };
        let (send_mac, mut recv_mac) = match macs {
            Some(m) => (Some(m.send), Some(m.recv)),
            None => (None, None),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            close_reason: Mutex::new(String::new()),
        });
        let peer = addr.to_string();
        {
            let shared = shared.clone();
            let peer = peer.clone();
            tokio::spawn(async move {
                let reason = match write_queued(write_half, rx, None, send_mac).await {
                    Ok(()) => "connection dropped by owner".to_string(),
                    Err(e) => format!("{peer}: write failed: {e}"),
                };
                shared.close(reason);
            });
        }
        {
            let shared = shared.clone();
            let peer = peer.clone();
            tokio::spawn(async move {
                let reason = loop {
                    match read_msg_mac(&mut r, recv_mac.as_mut()).await {
                        Ok(None) => break format!("{peer} closed the connection"),
                        Err(e) => break format!("{peer}: {e}"),
                        Ok(Some(inc)) => {
                            if inc.request_id == 0 {
                                if let Some(push) = &push {
                                    let _ = push.send(inc);
                                }
                                continue;
                            }
                            let waiter = match shared.pending.lock() {
                                Ok(mut p) => p.remove(&inc.request_id),
                                Err(_) => None,
                            };
                            if let Some(w) = waiter {
                                let _ = w.send(Ok(inc));
                            }
                        }
                    }
                };
                shared.close(reason);
            });
        }
        Ok(Arc::new(RpcConn {
            peer,
            tx,
            shared,
            next_id: AtomicU64::new(1),
            last_used_ms: AtomicU64::new(monotonic_ms()),
        }))
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Open and used within [`CLIENT_IDLE_REUSE_MS_MAX`]: safe to start a request on. A pool
    /// replaces a connection that is not (the server closes connections idle for twice as
    /// long, so a request never races with that close).
    pub fn is_reusable(&self) -> bool {
        !self.is_closed()
            && monotonic_ms().saturating_sub(self.last_used_ms.load(Ordering::Relaxed))
                < CLIENT_IDLE_REUSE_MS_MAX
    }

    /// Enqueues a request now (frames leave in `start` order) and returns its reply.
    pub fn start(&self, epoch: u64, msg: &Msg) -> Result<PendingReply, NetError> {
        self.start_prepared(epoch, &Prepared::new(msg))
    }

    /// [`RpcConn::start`] with a body encoded once for several peers.
    pub fn start_prepared(&self, epoch: u64, msg: &Prepared) -> Result<PendingReply, NetError> {
        if self.is_closed() {
            let reason = self
                .shared
                .close_reason
                .lock()
                .map(|r| r.clone())
                .unwrap_or_default();
            return Err(NetError::Closed(reason));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.last_used_ms.store(monotonic_ms(), Ordering::Relaxed);
        let (wtx, wrx) = oneshot::channel();
        if let Ok(mut p) = self.shared.pending.lock() {
            p.insert(id, wtx);
        }
        if self.tx.send(msg.frame(id, epoch)).is_err() {
            if let Ok(mut p) = self.shared.pending.lock() {
                p.remove(&id);
            }
            return Err(NetError::Closed(format!("{}: writer stopped", self.peer)));
        }
        Ok(PendingReply {
            rx: wrx,
            peer: self.peer.clone(),
        })
    }

    /// Sends a frame that expects no reply (request id 0 is reserved for pushes; this uses
    /// a fresh id the peer's reply to which, if any, is ignored).
    pub fn send_oneway(&self, epoch: u64, msg: &Msg) -> Result<(), NetError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.last_used_ms.store(monotonic_ms(), Ordering::Relaxed);
        self.tx
            .send(outgoing(id, epoch, msg))
            .map_err(|_| NetError::Closed(format!("{}: writer stopped", self.peer)))
    }

    pub async fn call(&self, epoch: u64, msg: &Msg, timeout_ms: u64) -> Result<Incoming, NetError> {
        self.start(epoch, msg)?.wait(timeout_ms).await
    }

    /// Sends a typed request and waits for its typed reply: an `Error` reply is
    /// [`CallError::Remote`], a reply of another kind [`CallError::Unexpected`] (see
    /// [`crate::request`]).
    pub async fn request<R: Request>(
        &self,
        epoch: u64,
        req: R,
        timeout_ms: u64,
    ) -> Result<R::Reply, CallError> {
        let msg: Msg = req.into();
        let inc = self.call(epoch, &msg, timeout_ms).await?;
        crate::request::reply_to::<R>(inc.msg)
    }
}

/// The connecting side of the handshake (`crate::auth`): hello, challenge, proof, done.
async fn client_handshake<R, W>(
    r: &mut R,
    w: &mut W,
    auth: &ConnectAuth,
    addr: &str,
) -> Result<crate::auth::SessionMacs, NetError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use crate::auth::{equal_secret, nonce, proof, session_macs};
    let (entity, key, ticket) = match auth {
        ConnectAuth::None => return Err(NetError::Auth("no credentials".into())),
        ConnectAuth::Key(id) => (id.entity.as_str(), id.key.clone(), Vec::new()),
        ConnectAuth::Ticket {
            entity,
            ticket,
            session_key,
        } => (entity.as_str(), session_key.clone(), ticket.to_vec()),
    };
    let refused = |m: Msg, step: &str| match m {
        Msg::Error {
            code: crate::ErrorCode::Again,
            message,
            ..
        } => NetError::Closed(format!("{addr} cannot authenticate anyone yet: {message}")),
        Msg::Error { message, .. } => NetError::Auth(format!("{addr} refused {entity}: {message}")),
        other => NetError::Auth(format!(
            "{addr}: unexpected {:?} in reply to the {step}",
            other.msg_kind()
        )),
    };
    let closed = || NetError::Closed(format!("{addr} closed the connection during the handshake"));
    let cn = nonce();
    write_msg(
        w,
        1,
        0,
        &Msg::AuthHello {
            entity: entity.to_string(),
            nonce: cn.to_vec(),
            ticket,
        },
    )
    .await?;
    let (sn, encrypt) = match read_handshake_msg(r).await?.ok_or_else(closed)?.msg {
        Msg::AuthChallenge { nonce, encrypt } => (nonce, encrypt),
        other => return Err(refused(other, "hello")),
    };
    write_msg(
        w,
        2,
        0,
        &Msg::AuthProof {
            proof: proof(&key, "client", entity, &cn, &sn, encrypt).to_vec(),
        },
    )
    .await?;
    match read_handshake_msg(r).await?.ok_or_else(closed)?.msg {
        Msg::AuthDone { proof: p } => {
            if !equal_secret(&p, &proof(&key, "server", entity, &cn, &sn, encrypt)) {
                return Err(NetError::Auth(format!(
                    "{addr} could not prove it knows the key of {entity}: not a server of this cluster"
                )));
            }
        }
        other => return Err(refused(other, "proof")),
    }
    Ok(session_macs(&key, entity, &cn, &sn, true, encrypt))
}

/// Largest frame of the handshake (a hello with the largest ticket, with room to spare):
/// a peer not authenticated yet cannot make a server read (and allocate) more.
const HANDSHAKE_FRAME_BYTES_MAX: u32 = 16 << 10;
const _: () = assert!(crate::auth::TICKET_BYTES_MAX + 1024 < HANDSHAKE_FRAME_BYTES_MAX as usize);

/// Reads one handshake frame (at most [`HANDSHAKE_FRAME_BYTES_MAX`] of payload).
async fn read_handshake_msg<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Incoming>, NetError> {
    let Some(h) = read_header(r).await? else {
        return Ok(None);
    };
    if h.payload_len > HANDSHAKE_FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len: h.payload_len,
            max: HANDSHAKE_FRAME_BYTES_MAX,
        }
        .into());
    }
    let f = read_body(r, &h, None).await?;
    Ok(Some(Incoming {
        request_id: f.request_id,
        epoch: f.epoch,
        msg: f.decode()?,
        bulk_block_crcs: Vec::new(),
        bulk_hash: None,
        received: None,
        peer: None,
    }))
}

/// Marks a handshake refused because the server cannot check anyone yet.
const NOT_READY: &str = ": not ready: ";

/// The accepting side of the handshake: the peer's identity and the session's MACs, or
/// why it was refused (also sent to the peer as an `AuthFailed` error).
async fn server_handshake<R, W>(
    r: &mut R,
    w: &mut W,
    verifier: &dyn Verifier,
    epoch: u64,
) -> Result<(Arc<Peer>, crate::auth::SessionMacs), String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    use crate::auth::{equal_secret, nonce, proof, session_macs, NONCE_BYTES};
    async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, rid: u64, epoch: u64, why: String) -> String {
        let _ = write_msg(
            w,
            rid,
            epoch,
            &Msg::error(crate::ErrorCode::AuthFailed, why.clone()),
        )
        .await;
        why
    }
    let first = match read_handshake_msg(r).await {
        Ok(Some(inc)) => inc,
        Ok(None) => return Err("closed before authenticating".into()),
        Err(e) => {
            // As for any bad frame: an error frame, then the connection closes.
            let _ = write_msg(
                w,
                0,
                epoch,
                &Msg::error(
                    crate::ErrorCode::Invalid,
                    format!("closing connection: {e}"),
                ),
            )
            .await;
            return Err(format!("bad first frame: {e}"));
        }
    };
    let rid = first.request_id;
    let (entity, cn, ticket) = match first.msg {
        Msg::AuthHello {
            entity,
            nonce,
            ticket,
        } => (entity, nonce, ticket),
        other => {
            let why = format!(
                "no authentication (first message {:?}): this cluster requires a key (--keyring, --name)",
                other.msg_kind()
            );
            return Err(refuse(w, rid, epoch, why).await);
        }
    };
    if let Err(why) = verifier.ready(&entity) {
        let _ = write_msg(
            w,
            rid,
            epoch,
            &Msg::error(crate::ErrorCode::Again, why.clone()),
        )
        .await;
        return Err(format!("{entity}{NOT_READY}{why}"));
    }
    if cn.len() != NONCE_BYTES {
        return Err(refuse(w, rid, epoch, format!("{entity}: bad nonce length")).await);
    }
    let (key, peer) = match verifier.accept(&entity, &ticket) {
        Ok(k) => k,
        Err(e) => return Err(refuse(w, rid, epoch, format!("{entity}: {e}")).await),
    };
    let sn = nonce();
    let encrypt = verifier.encrypt();
    write_msg(
        w,
        rid,
        epoch,
        &Msg::AuthChallenge {
            nonce: sn.to_vec(),
            encrypt,
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let second = match read_handshake_msg(r).await {
        Ok(Some(inc)) => inc,
        Ok(None) => return Err(format!("{entity}: closed during the handshake")),
        Err(e) => return Err(format!("{entity}: bad frame during the handshake: {e}")),
    };
    let rid = second.request_id;
    match second.msg {
        Msg::AuthProof { proof: p }
            if equal_secret(&p, &proof(&key, "client", &entity, &cn, &sn, encrypt)) => {}
        Msg::AuthProof { .. } => {
            let why = format!("{entity}: wrong proof (a wrong key, or a replayed handshake)");
            return Err(refuse(w, rid, epoch, why).await);
        }
        other => {
            let why = format!("{entity}: expected a proof, got {:?}", other.msg_kind());
            return Err(refuse(w, rid, epoch, why).await);
        }
    }
    write_msg(
        w,
        rid,
        epoch,
        &Msg::AuthDone {
            proof: proof(&key, "server", &entity, &cn, &sn, encrypt).to_vec(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((peer, session_macs(&key, &entity, &cn, &sn, false, encrypt)))
}

impl Drop for RpcConn {
    fn drop(&mut self) {
        self.shared.close("connection dropped by owner".to_string());
    }
}

/// Requests a served connection may have in progress at once. When they are all busy the
/// server stops reading that socket, so a flooding peer is slowed by TCP flow control
/// instead of growing the daemon's queues (admission control).
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION: usize = 64;

/// A served connection with nothing in progress (no request, no subscription) that sends
/// nothing for this long is closed. Longer than [`CLIENT_IDLE_REUSE_MS_MAX`], so a client
/// that follows the rule never sends into a connection the server is closing.
pub const SERVER_IDLE_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// A client does not start requests on a connection idle for this long: it opens a new
/// one (see [`RpcConn::is_reusable`]).
pub const CLIENT_IDLE_REUSE_MS_MAX: u64 = 5 * 60 * 1000;
const _: () = assert!(CLIENT_IDLE_REUSE_MS_MAX * 2 <= SERVER_IDLE_TIMEOUT_MS);

/// A frame whose first byte has arrived must be complete within this time plus
/// [`FRAME_DEADLINE_MS_PER_MIB`] per MiB of payload (a peer that stops half way, or
/// trickles, does not keep its buffer for ever: 74 s for the largest frame).
pub const FRAME_DEADLINE_MS_BASE: u64 = 10_000;
pub const FRAME_DEADLINE_MS_PER_MIB: u64 = 1_000;

/// A writer whose peer takes no bytes for this long gives up on the connection (a peer
/// that stops reading must not keep its queued replies in memory).
pub const WRITE_STALL_MS_MAX: u64 = 30_000;

/// After the peer has gone (end of stream), queued replies may go out for this long; then
/// the connection and everything still queued or running for it is dropped. Short: a peer
/// that ended its side does not wait for replies (Spindle's clients close both sides), and
/// a subscription must not keep a closed connection's descriptor and buffers for long.
pub const REPLY_DRAIN_MS_MAX: u64 = 250;

/// Read buffer of a client connection: small replies coalesce in it; a large payload's
/// bytes past one buffer's worth bypass it (tokio's `BufReader` hands reads at least its
/// size straight to the socket), so a larger buffer would copy more of every payload.
const CLIENT_READ_BUFFER_BYTES: usize = 64 << 10;

/// Read buffer of a served connection (bulk payloads bypass it; replies are written
/// straight from their buffers, see `write_frames`).
const SERVED_READ_BUFFER_BYTES: usize = 64 << 10;

/// The payload budget of served connections (`spindle_serve`). A served frame's payload is
/// charged before it is read and released when the request's last [`Replier`] is dropped,
/// i.e. when the request is done. A process keeps two: one for client requests and one for
/// peer traffic (replication, recovery), because a primary holds client bytes while it
/// waits for replicas, and replicas must never wait for client bytes to be released (that
/// would be a cycle).
pub use spindle_serve::PayloadBudget;
use spindle_serve::{AcceptBackoff, BUDGET_UNIT_BYTES};

/// A budget of `bytes`, at least one maximum-size frame.
fn payload_budget(bytes: u64) -> PayloadBudget {
    PayloadBudget::new(bytes.max(PAYLOAD_LEN_MAX_DEFAULT as u64 + BUDGET_UNIT_BYTES))
}

/// Default payload budget of a process: 1/32 of its memory, between 128 MiB and 1 GiB
/// (split evenly between client and peer traffic).
pub fn payload_budget_bytes_default() -> u64 {
    let pages = memory_total_bytes();
    (pages / 32).clamp(128 << 20, 1 << 30)
}

fn memory_total_bytes() -> u64 {
    // /proc/meminfo avoids an unsafe sysconf call; 4 GiB if it cannot be read.
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(4 << 30, |kib| kib * 1024)
}

/// Limits and budgets of a process's served connections.
pub struct ServeLimits {
    /// Payloads of client requests (`ObjRequest`) and monitor commands.
    pub client_budget: PayloadBudget,
    /// Payloads of everything else (replication, recovery, peering, scrub, shards).
    pub peer_budget: PayloadBudget,
    pub idle_timeout_ms: u64,
    pub frame_deadline_ms_base: u64,
    pub frame_deadline_ms_per_mib: u64,
    pub write_stall_ms: u64,
    /// Served connections open now (a gauge).
    pub connections_open: AtomicU64,
    /// Served connections closed so far (the heap is trimmed after churn).
    pub connections_closed: AtomicU64,
}

impl ServeLimits {
    /// `payload_budget_bytes` in total, split evenly.
    pub fn new(payload_budget_bytes: u64) -> ServeLimits {
        ServeLimits {
            client_budget: payload_budget(payload_budget_bytes / 2),
            peer_budget: payload_budget(payload_budget_bytes / 2),
            idle_timeout_ms: SERVER_IDLE_TIMEOUT_MS,
            frame_deadline_ms_base: FRAME_DEADLINE_MS_BASE,
            frame_deadline_ms_per_mib: FRAME_DEADLINE_MS_PER_MIB,
            write_stall_ms: WRITE_STALL_MS_MAX,
            connections_open: AtomicU64::new(0),
            connections_closed: AtomicU64::new(0),
        }
    }

    /// The budget a frame of `kind` is charged to.
    fn budget_for(&self, kind: u16) -> &PayloadBudget {
        if crate::msg::kind_is_client_request(kind) {
            &self.client_budget
        } else {
            &self.peer_budget
        }
    }

    fn frame_deadline(&self, payload_len: u32) -> Duration {
        let mib = (payload_len as u64).div_ceil(1 << 20);
        Duration::from_millis(self.frame_deadline_ms_base + mib * self.frame_deadline_ms_per_mib)
    }
}

impl Default for ServeLimits {
    /// The defaults, overridden by `SPINDLE_PAYLOAD_BUDGET_MIB` (total payload budget),
    /// `SPINDLE_CONN_IDLE_TIMEOUT_MS` (idle timeout of served connections) and
    /// `SPINDLE_FRAME_DEADLINE_MS` (time for any frame to arrive once started).
    fn default() -> Self {
        let env = |name: &str| -> Option<u64> {
            let v = std::env::var(name).ok()?;
            match v.trim().parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    tracing::warn!("ignoring {name}={v:?}: not a whole number");
                    None
                }
            }
        };
        let budget = env("SPINDLE_PAYLOAD_BUDGET_MIB")
            .map_or_else(payload_budget_bytes_default, |mib| mib << 20);
        let mut limits = ServeLimits::new(budget);
        if let Some(ms) = env("SPINDLE_CONN_IDLE_TIMEOUT_MS") {
            limits.idle_timeout_ms = ms.max(1);
        }
        if let Some(ms) = env("SPINDLE_FRAME_DEADLINE_MS") {
            limits.frame_deadline_ms_base = ms.max(1);
            limits.frame_deadline_ms_per_mib = 0;
        }
        limits
    }
}

/// What a request in progress holds: its admission slot and its payload bytes.
struct Held {
    _admission: tokio::sync::OwnedSemaphorePermit,
    _payload: tokio::sync::OwnedSemaphorePermit,
}

/// Sends replies on a served connection (cheap to clone; frames keep their order). The
/// request's admission slot and payload budget are released when the last clone is dropped.
#[derive(Clone)]
pub struct Replier {
    tx: mpsc::UnboundedSender<Outgoing>,
    _held: Option<Arc<Held>>,
    done: Option<Arc<DoneHook>>,
}

/// What a request's replies came to, given to its completion hook ([`Replier::on_done`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyOutcome {
    /// Bulk bytes of the last reply (a read's data).
    pub bulk_bytes: u64,
    /// The last reply was an error.
    pub error: bool,
    /// A reply was sent at all (false: dropped unanswered, e.g. the daemon shut down).
    pub replied: bool,
}

/// A request's completion hook.
type DoneFn = Box<dyn FnOnce(ReplyOutcome) + Send>;

/// Runs a request's completion hook when its last [`Replier`] clone is dropped.
struct DoneHook {
    outcome: Mutex<ReplyOutcome>,
    f: Mutex<Option<DoneFn>>,
}

impl DoneHook {
    fn record(&self, msg: &Msg) {
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        *o = ReplyOutcome {
            bulk_bytes: msg.bulk().len() as u64,
            error: matches!(msg, Msg::Error { .. }),
            replied: true,
        };
    }
}

impl Drop for DoneHook {
    fn drop(&mut self) {
        let outcome = *self.outcome.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = self.f.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            f(outcome);
        }
    }
}

impl Replier {
    /// Queues a reply; false if the connection is gone.
    pub fn send(&self, request_id: u64, epoch: u64, msg: &Msg) -> bool {
        if let Some(d) = &self.done {
            d.record(msg);
        }
        self.tx.send(outgoing(request_id, epoch, msg)).is_ok()
    }

    /// Queues a reply, moving its bulk bytes instead of copying them.
    pub fn send_owned(&self, request_id: u64, epoch: u64, msg: Msg) -> bool {
        if let Some(d) = &self.done {
            d.record(&msg);
        }
        self.tx
            .send(Prepared::from_msg(msg).frame(request_id, epoch))
            .is_ok()
    }

    /// The same replier, calling `f` with what the replies came to once the request is
    /// done (its last clone dropped): per-operation metrics without touching every path
    /// that answers. Replaces an earlier hook.
    pub fn on_done(mut self, f: impl FnOnce(ReplyOutcome) + Send + 'static) -> Replier {
        self.done = Some(Arc::new(DoneHook {
            outcome: Mutex::new(ReplyOutcome::default()),
            f: Mutex::new(Some(Box::new(f))),
        }));
        self
    }

    /// Resolves once the connection is gone (the peer closed it, or it was dropped for a
    /// timeout): long-lived holders of a replier (map subscriptions) wait on this so they
    /// end with the connection instead of at their next send.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Writes queued frames like [`writer_loop`], but gives up when the peer takes no bytes
/// for `stall` (a peer that stops reading).
async fn writer_loop_bounded<W: AsyncWrite + Unpin>(
    w: W,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    stall: Duration,
    mac: Option<FrameMac>,
) -> Result<(), NetError> {
    write_queued(w, rx, Some(stall), mac).await
}

/// Why a served connection ended.
enum Ended {
    PeerClosed,
    Idle,
    Error(String),
}

/// Serves one accepted connection with the default limits (see [`serve_with`]).
pub async fn serve<F>(stream: TcpStream, label: &str, epoch: impl Fn() -> u64, dispatch: F)
where
    F: FnMut(Incoming, Replier),
{
    serve_with(stream, label, &default_limits(), epoch, dispatch).await
}

/// Process-wide limits for services that do not bring their own.
pub fn default_limits() -> Arc<ServeLimits> {
    static LIMITS: std::sync::OnceLock<Arc<ServeLimits>> = std::sync::OnceLock::new();
    LIMITS
        .get_or_init(|| Arc::new(ServeLimits::default()))
        .clone()
}

/// Serves one accepted connection: verified frames are decoded and handed to `dispatch`
/// in arrival order (it must not block; spawn for anything slow). A body that does not
/// decode gets an `Invalid` error reply and the connection goes on (the frame itself was
/// whole and verified); a bad frame gets an error frame, is logged, and ends the
/// connection. Returns when the peer disconnects, when the connection was idle (nothing
/// in progress) for `limits.idle_timeout_ms`, or when a frame or a reply stalls; the
/// socket and every buffer of the connection are released then (replies still being
/// produced may go out for [`REPLY_DRAIN_MS_MAX`]).
pub async fn serve_with<F>(
    stream: TcpStream,
    label: &str,
    limits: &ServeLimits,
    epoch: impl Fn() -> u64,
    dispatch: F,
) where
    F: FnMut(Incoming, Replier),
{
    let (read_half, write_half, peer) = crate::transport::tcp_accepted(stream);
    serve_halves(
        read_half, write_half, &peer, label, limits, None, epoch, dispatch,
    )
    .await
}

/// [`serve_with`] over the halves of a connection of any [`Transport`] (`peer` names the
/// other end in logs). With a `verifier`, the connection must authenticate first (the
/// handshake of `crate::auth`, within [`crate::auth::HANDSHAKE_MS_MAX`]); every frame
/// after it must carry a valid MAC, and every [`Incoming`] names the peer.
#[allow(clippy::too_many_arguments)]
pub async fn serve_halves<R, W, F>(
    read_half: R,
    mut write_half: W,
    peer: &str,
    label: &str,
    limits: &ServeLimits,
    verifier: Option<Arc<dyn Verifier>>,
    epoch: impl Fn() -> u64,
    mut dispatch: F,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
    F: FnMut(Incoming, Replier),
{
    limits.connections_open.fetch_add(1, Ordering::Relaxed);
    let mut r = BufReader::with_capacity(SERVED_READ_BUFFER_BYTES, read_half);
    let authenticated = verifier.is_some();
    let (peer_auth, send_mac, mut recv_mac) = match verifier {
        None => (None, None, None),
        Some(v) => {
            let shake = tokio::time::timeout(
                Duration::from_millis(crate::auth::HANDSHAKE_MS_MAX.min(limits.idle_timeout_ms)),
                server_handshake(&mut r, &mut write_half, &*v, epoch()),
            )
            .await
            .unwrap_or_else(|_| Err("the handshake timed out".into()));
            match shake {
                Ok((p, macs)) => {
                    tracing::debug!("{label}: {peer} authenticated as {}", p.entity);
                    (Some(p), Some(macs.send), Some(macs.recv))
                }
                Err(why) if why.contains(NOT_READY) => {
                    // Not a security event: a new cluster or a booting daemon.
                    tracing::debug!("{label}: connection from {peer}: {why}");
                    limits.connections_open.fetch_sub(1, Ordering::Relaxed);
                    limits.connections_closed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(why) => {
                    crate::auth::log_refusal(label, &format!("connection from {peer}: {why}"));
                    limits.connections_open.fetch_sub(1, Ordering::Relaxed);
                    limits.connections_closed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let mut writer = tokio::spawn(writer_loop_bounded(
        write_half,
        rx,
        Duration::from_millis(limits.write_stall_ms),
        send_mac,
    ));
    let replier = Replier {
        tx,
        _held: None,
        done: None,
    };
    let admission = Arc::new(tokio::sync::Semaphore::new(
        REQUESTS_IN_FLIGHT_PER_CONNECTION,
    ));
    let idle = Duration::from_millis(limits.idle_timeout_ms);
    // The connection ends when reading ends, or when the writer gave up (the peer takes
    // no bytes: its requests would be served into the void).
    let reading = async {
        'conn: loop {
            // Wait for a free request slot before reading the next frame.
            let Ok(admitted) = admission.clone().acquire_owned().await else {
                break Ended::Error("admission closed".into());
            };
            // Wait for the next frame's first byte; with nothing in progress, not for ever.
            loop {
                match tokio::time::timeout(idle, r.fill_buf()).await {
                    Ok(Ok([])) => break 'conn Ended::PeerClosed,
                    Ok(Ok(_)) => break,
                    Ok(Err(e)) => break 'conn Ended::Error(e.to_string()),
                    Err(_) => {
                        // The slot taken above is the only one out: nothing in progress.
                        if admission.available_permits() + 1 == REQUESTS_IN_FLIGHT_PER_CONNECTION {
                            break 'conn Ended::Idle;
                        }
                    }
                }
            }
            let frame_start = spindle_trace::now();
            let header =
                match tokio::time::timeout(limits.frame_deadline(0), read_header(&mut r)).await {
                    Err(_) => break Ended::Error("frame header stalled".into()),
                    Ok(Ok(None)) => break Ended::PeerClosed,
                    Ok(Ok(Some(h))) => Ok(h),
                    Ok(Err(e)) => Err(e),
                };
            let frame = match header {
                Ok(h) => {
                    // Charge the payload before reading it: while the budget is exhausted this
                    // connection is not read (its sender is slowed by TCP flow control).
                    let budget = limits.budget_for(h.kind);
                    let charged = budget.acquire(h.payload_len as u64).await;
                    let deadline = limits.frame_deadline(h.payload_len);
                    match tokio::time::timeout(deadline, read_body(&mut r, &h, recv_mac.as_mut()))
                        .await
                    {
                        Err(_) => {
                            break Ended::Error(format!(
                                "frame of {} bytes not complete after {} ms",
                                h.payload_len,
                                deadline.as_millis()
                            ))
                        }
                        Ok(body) => body.map(|f| (f, charged)),
                    }
                }
                Err(e) => Err(e),
            };
            match frame {
                Ok((frame, charged)) => {
                    let (kind, request_id, frame_epoch) =
                        (frame.kind, frame.request_id, frame.epoch);
                    let mut frame = frame;
                    let bulk_block_crcs = std::mem::take(&mut frame.bulk_block_crcs);
                    let bulk_hash = frame.bulk_hash;
                    let decoded = frame.decode();
                    spindle_trace::record(Stage::RpcRead, frame_start);
                    match decoded {
                        Ok(Msg::AuthHello { .. }) if !authenticated => {
                            replier.send(
                                request_id,
                                epoch(),
                                &Msg::error(
                                    crate::ErrorCode::AuthFailed,
                                    "this server runs without authentication",
                                ),
                            );
                        }
                        Ok(msg) => dispatch(
                            Incoming {
                                request_id,
                                epoch: frame_epoch,
                                msg,
                                bulk_block_crcs,
                                bulk_hash,
                                received: spindle_trace::now(),
                                peer: peer_auth.clone(),
                            },
                            Replier {
                                tx: replier.tx.clone(),
                                _held: Some(Arc::new(Held {
                                    _admission: admitted,
                                    _payload: charged,
                                })),
                                done: None,
                            },
                        ),
                        Err(e) => {
                            tracing::warn!("{label}: bad message from {peer} (kind {kind}): {e}");
                            replier.send(
                                request_id,
                                epoch(),
                                &Msg::error(crate::ErrorCode::Invalid, format!("bad message: {e}")),
                            );
                        }
                    }
                }
                Err(e) => {
                    if matches!(e, NetError::Auth(_)) {
                        crate::auth::log_refusal(label, &format!("connection from {peer}: {e}"));
                    }
                    tracing::warn!("{label}: closing connection from {peer}: {e}");
                    replier.send(
                        0,
                        epoch(),
                        &Msg::error(
                            crate::ErrorCode::Invalid,
                            format!("closing connection: {e}"),
                        ),
                    );
                    break Ended::Error(e.to_string());
                }
            }
        }
    };
    let (ended, writer_done) = tokio::select! {
        ended = reading => (ended, false),
        w = &mut writer => {
            let why = match w {
                Ok(Ok(())) => "reply writer ended".to_string(),
                Ok(Err(e)) => format!("replies stalled: {e}"),
                Err(e) => format!("reply writer failed: {e}"),
            };
            (Ended::Error(why), true)
        }
    };
    match &ended {
        Ended::PeerClosed => {}
        Ended::Idle => tracing::debug!("{label}: closing idle connection from {peer}"),
        Ended::Error(e) => tracing::debug!("{label}: connection from {peer} ended: {e}"),
    }
    // The read side (and its buffer) goes now; queued replies get a short drain, then the
    // write side and whatever is queued on it go too. Holders of a replier (requests still
    // running, subscriptions) see `Replier::closed` / a failed send and end.
    drop(r);
    drop(replier);
    if !writer_done
        && tokio::time::timeout(Duration::from_millis(REPLY_DRAIN_MS_MAX), &mut writer)
            .await
            .is_err()
    {
        writer.abort();
        let _ = writer.await;
    }
    limits.connections_open.fetch_sub(1, Ordering::Relaxed);
    limits.connections_closed.fetch_add(1, Ordering::Relaxed);
}

/// A server that dispatches decoded requests (the monitor, a storage daemon).
pub trait Service: Clone + Send + Sync + 'static {
    /// The map epoch to stamp on error frames.
    fn epoch(&self) -> u64;
    /// Handles one request in arrival order (see [`serve`]).
    fn dispatch(&self, inc: Incoming, reply: Replier);
    /// Limits and payload budgets of this service's connections.
    fn limits(&self) -> Arc<ServeLimits> {
        default_limits()
    }
    /// The authority connections must authenticate with; None: no authentication.
    fn verifier(&self) -> Option<Arc<dyn Verifier>> {
        None
    }
}

/// Hands freed heap memory back to the system after a burst of large payloads, and now
/// and then after connections came and went (the `spindle` binary keeps freed memory in
/// glibc's arenas, see its `tune_allocator`, so a burst or a crowd of short-lived
/// connections would leave the process at its high-water mark for ever).
struct HeapReleaser {
    closed_at_last_trim: u64,
    last_churn_trim: std::time::Instant,
}

impl HeapReleaser {
    fn tick(&mut self, limits: &ServeLimits) {
        let peak = limits.client_budget.take_peak_bytes() + limits.peer_budget.take_peak_bytes();
        let now = limits.client_budget.in_use_bytes() + limits.peer_budget.in_use_bytes();
        let closed = limits.connections_closed.load(Ordering::Relaxed);
        let burst_over = peak >= TRIM_AFTER_PEAK_BYTES && now < TRIM_AFTER_PEAK_BYTES / 4;
        let churned = closed != self.closed_at_last_trim
            && self.last_churn_trim.elapsed() >= Duration::from_millis(TRIM_AFTER_CHURN_MS);
        if burst_over || churned {
            trim_heap();
            self.closed_at_last_trim = closed;
            self.last_churn_trim = std::time::Instant::now();
        }
    }
}

/// Returns free heap pages to the system (see `spindle_serve::heap`).
pub fn trim_heap() {
    spindle_serve::heap::release();
}

/// Payload bytes that, once used and released, make the server trim its heap.
const TRIM_AFTER_PEAK_BYTES: u64 = 64 << 20;
/// How often the server checks whether a burst is over.
const TRIM_CHECK_MS: u64 = 2_000;
/// After connections closed, the heap is trimmed at most this often.
const TRIM_AFTER_CHURN_MS: u64 = 30_000;

/// Accepts connections until the listener fails for good, serving each on its own task.
/// Accept failures (out of descriptors, ...) back off instead of spinning, and are logged
/// once per interval with a count.
pub async fn accept_loop<S: Service>(
    listener: tokio::net::TcpListener,
    label: &'static str,
    svc: S,
) {
    accept_loop_via(&Tcp, listener, label, svc).await
}

/// [`accept_loop`] over any [`Transport`].
pub async fn accept_loop_via<T: Transport, S: Service>(
    transport: &T,
    listener: T::Listener,
    label: &'static str,
    svc: S,
) {
    let limits = svc.limits();
    let verifier = svc.verifier();
    // Ends with this loop (dropped when the loop's task is aborted).
    let _trimmer = AbortOnDrop({
        let limits = limits.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(TRIM_CHECK_MS));
            let mut releaser = HeapReleaser {
                closed_at_last_trim: 0,
                last_churn_trim: std::time::Instant::now(),
            };
            loop {
                tick.tick().await;
                releaser.tick(&limits);
            }
        })
    });
    let mut backoff = AcceptBackoff::new();
    loop {
        match transport.accept(&listener).await {
            Ok((read_half, write_half, peer)) => {
                backoff.accepted();
                let svc = svc.clone();
                let limits = limits.clone();
                let verifier = verifier.clone();
                tokio::spawn(async move {
                    let s2 = svc.clone();
                    serve_halves(
                        read_half,
                        write_half,
                        &peer,
                        label,
                        &limits,
                        verifier,
                        move || s2.epoch(),
                        |inc, reply| svc.dispatch(inc, reply),
                    )
                    .await;
                });
            }
            Err(e) => backoff.pause_after(label, &e).await,
        }
    }
}

/// Aborts a background task when dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
