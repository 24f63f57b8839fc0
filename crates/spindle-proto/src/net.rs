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

use crate::frame::{
    encode_frame, frame_header, parse_header, FrameError, HEADER_LEN, PAYLOAD_LEN_MAX_DEFAULT,
};
use crate::msg::Msg;
use crate::CodecError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
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
}

/// Reads one frame and decodes its message. `Ok(None)` on a clean end of stream between
/// frames.
pub async fn read_msg<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Incoming>, NetError> {
    match read_frame_raw(r).await? {
        None => Ok(None),
        Some(mut f) => {
            let (request_id, epoch) = (f.request_id, f.epoch);
            let bulk_block_crcs = std::mem::take(&mut f.bulk_block_crcs);
            Ok(Some(Incoming {
                request_id,
                epoch,
                msg: f.decode()?,
                bulk_block_crcs,
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
}

/// Block size of [`RawFrame::bulk_block_crcs`].
pub const BULK_BLOCK_BYTES: usize = spindle_ec::crc32c::CRC_BLOCK_BYTES;
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

/// Reads exactly `len` bytes into a fresh vector (spare capacity, no zeroing).
async fn read_vec<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    what: &str,
) -> Result<Vec<u8>, NetError> {
    let mut v = Vec::with_capacity(len);
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

/// Reads and verifies one frame. The body (`u32 bulk length | bulk | fields`) is read in
/// pieces so the bulk bytes land in a buffer of their own, which the decoded message then
/// owns. A body whose bulk length is impossible is still read whole (the stream stays in
/// sync) and reported by [`RawFrame::decode`].
pub async fn read_frame_raw<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<RawFrame>, NetError> {
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
    let h = parse_header(&header, PAYLOAD_LEN_MAX_DEFAULT)?;
    let len = h.payload_len as usize;
    let mut block_crcs = Vec::new();
    let (bulk_claim, bulk, fields, crc) = if len < 4 {
        let fields = read_vec(r, len, "payload").await?;
        let crc = spindle_ec::crc32c::crc32c(&fields);
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
        let crc = spindle_ec::crc32c::crc32c(&prefix);
        let crc =
            if bulk.len() >= BULK_BLOCK_CRCS_BYTES_MIN && crate::msg::kind_writes_objects(h.kind) {
                let bulk_crc = spindle_ec::crc32c::crc32c_blocks(&bulk, &mut block_crcs);
                spindle_ec::crc32c::crc32c_combine(crc, bulk_crc, bulk.len())
            } else {
                spindle_ec::crc32c::crc32c_append(crc, &bulk)
            };
        let crc = spindle_ec::crc32c::crc32c_append(crc, &fields);
        (claim, bulk, fields, crc)
    };
    if crc != h.payload_crc {
        return Err(FrameError::PayloadChecksum {
            stored: h.payload_crc,
            computed: crc,
        }
        .into());
    }
    Ok(Some(RawFrame {
        kind: h.kind,
        request_id: h.request_id,
        epoch: h.epoch,
        bulk_claim,
        bulk,
        fields,
        bulk_block_crcs: block_crcs,
    }))
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
    head: Arc<Vec<u8>>,
    bulk: Arc<Vec<u8>>,
    crc: u32,
}

impl Prepared {
    /// Encodes `msg` (copies its bulk bytes, checksumming them in the same pass).
    pub fn new(msg: &Msg) -> Prepared {
        let src = msg.bulk();
        let fields = msg.encode_fields();
        let mut head = Vec::with_capacity(4 + fields.len());
        head.extend_from_slice(&(src.len() as u32).to_le_bytes());
        let mut crc = spindle_ec::crc32c::crc32c(&head);
        let mut bulk = Vec::with_capacity(src.len());
        for piece in src.chunks(64 << 10) {
            bulk.extend_from_slice(piece);
            crc = spindle_ec::crc32c::crc32c_append(crc, &bulk[bulk.len() - piece.len()..]);
        }
        let crc = spindle_ec::crc32c::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Arc::new(head),
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
        let crc = spindle_ec::crc32c::crc32c(&head);
        let crc = match bulk_crc {
            Some(b) => spindle_ec::crc32c::crc32c_combine(crc, b, bulk.len()),
            None => spindle_ec::crc32c::crc32c_append(crc, &bulk),
        };
        let crc = spindle_ec::crc32c::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Arc::new(head),
            bulk,
            crc,
        }
    }

    fn build(msg: &Msg, bulk: Vec<u8>) -> Prepared {
        let fields = msg.encode_fields();
        let mut head = Vec::with_capacity(4 + fields.len());
        head.extend_from_slice(&(bulk.len() as u32).to_le_bytes());
        let crc = spindle_ec::crc32c::crc32c(&head);
        let crc = spindle_ec::crc32c::crc32c_append(crc, &bulk);
        let crc = spindle_ec::crc32c::crc32c_append(crc, &fields);
        head.extend_from_slice(&fields);
        Prepared {
            kind: msg.kind(),
            head: Arc::new(head),
            bulk: Arc::new(bulk),
            crc,
        }
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
        }
    }
}

/// One frame queued for a connection's writer: header plus a (possibly shared) body.
pub struct Outgoing {
    header: [u8; HEADER_LEN],
    body: Prepared,
}

fn outgoing(request_id: u64, epoch: u64, msg: &Msg) -> Outgoing {
    Prepared::new(msg).frame(request_id, epoch)
}

async fn write_outgoing<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    frame: &Outgoing,
) -> Result<(), NetError> {
    let head = &frame.body.head;
    w.write_all(&frame.header).await?;
    w.write_all(&head[..4]).await?;
    w.write_all(&frame.body.bulk).await?;
    w.write_all(&head[4..]).await?;
    Ok(())
}

/// Writes queued frames to `w`, coalescing whatever is queued into one flush (large
/// bodies go straight from their buffer to the socket).
pub async fn writer_loop<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), NetError> {
    let mut w = BufWriter::with_capacity(256 << 10, w);
    while let Some(frame) = rx.recv().await {
        write_outgoing(&mut w, &frame).await?;
        while let Ok(more) = rx.try_recv() {
            write_outgoing(&mut w, &more).await?;
        }
        w.flush().await?;
    }
    Ok(())
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
            Ok(Ok(r)) => r,
        }
    }
}

impl RpcConn {
    /// Connects; unsolicited frames (request id 0) go to `push` if given.
    pub async fn connect(
        addr: &str,
        timeout_ms: u64,
        push: Option<mpsc::UnboundedSender<Incoming>>,
    ) -> Result<Arc<RpcConn>, NetError> {
        let stream =
            tokio::time::timeout(Duration::from_millis(timeout_ms), TcpStream::connect(addr))
                .await
                .map_err(|_| NetError::Connect {
                    addr: addr.to_string(),
                    reason: format!("timed out after {timeout_ms} ms"),
                })?
                .map_err(|e| NetError::Connect {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })?;
        stream.set_nodelay(true)?;
        let (read_half, write_half) = stream.into_split();
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
                let reason = match writer_loop(write_half, rx).await {
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
                let mut r = BufReader::with_capacity(256 << 10, read_half);
                let reason = loop {
                    match read_msg(&mut r).await {
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
        }))
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
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
        self.tx
            .send(outgoing(id, epoch, msg))
            .map_err(|_| NetError::Closed(format!("{}: writer stopped", self.peer)))
    }

    pub async fn call(&self, epoch: u64, msg: &Msg, timeout_ms: u64) -> Result<Incoming, NetError> {
        self.start(epoch, msg)?.wait(timeout_ms).await
    }
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

/// Sends replies on a served connection (cheap to clone; frames keep their order). The
/// request's admission permit is released when the last clone is dropped.
#[derive(Clone)]
pub struct Replier {
    tx: mpsc::UnboundedSender<Outgoing>,
    _permit: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl Replier {
    /// Queues a reply; false if the connection is gone.
    pub fn send(&self, request_id: u64, epoch: u64, msg: &Msg) -> bool {
        self.tx.send(outgoing(request_id, epoch, msg)).is_ok()
    }

    /// Queues a reply, moving its bulk bytes instead of copying them.
    pub fn send_owned(&self, request_id: u64, epoch: u64, msg: Msg) -> bool {
        self.tx
            .send(Prepared::from_msg(msg).frame(request_id, epoch))
            .is_ok()
    }
}

/// Serves one accepted connection: verified frames are decoded and handed to `dispatch`
/// in arrival order (it must not block; spawn for anything slow). A body that does not
/// decode gets an `Invalid` error reply and the connection goes on (the frame itself was
/// whole and verified); a bad frame gets an error frame, is logged, and ends the
/// connection. Returns when the peer disconnects.
pub async fn serve<F>(stream: TcpStream, label: &str, epoch: impl Fn() -> u64, mut dispatch: F)
where
    F: FnMut(Incoming, Replier),
{
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".to_string());
    let (read_half, write_half) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer_loop(write_half, rx));
    let replier = Replier { tx, _permit: None };
    let admission = Arc::new(tokio::sync::Semaphore::new(
        REQUESTS_IN_FLIGHT_PER_CONNECTION,
    ));
    let mut r = BufReader::with_capacity(256 << 10, read_half);
    loop {
        // Wait for a free request slot before reading the next frame.
        let Ok(permit) = admission.clone().acquire_owned().await else {
            break;
        };
        match read_frame_raw(&mut r).await {
            Ok(None) => break,
            Ok(Some(frame)) => {
                let (kind, request_id, frame_epoch) = (frame.kind, frame.request_id, frame.epoch);
                let mut frame = frame;
                let bulk_block_crcs = std::mem::take(&mut frame.bulk_block_crcs);
                match frame.decode() {
                    Ok(msg) => dispatch(
                        Incoming {
                            request_id,
                            epoch: frame_epoch,
                            msg,
                            bulk_block_crcs,
                        },
                        Replier {
                            tx: replier.tx.clone(),
                            _permit: Some(Arc::new(permit)),
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
                tracing::warn!("{label}: closing connection from {peer}: {e}");
                replier.send(
                    0,
                    epoch(),
                    &Msg::error(
                        crate::ErrorCode::Invalid,
                        format!("closing connection: {e}"),
                    ),
                );
                break;
            }
        }
    }
    drop(replier);
    let _ = writer.await;
}

/// A server that dispatches decoded requests (the monitor, a storage daemon).
pub trait Service: Clone + Send + Sync + 'static {
    /// The map epoch to stamp on error frames.
    fn epoch(&self) -> u64;
    /// Handles one request in arrival order (see [`serve`]).
    fn dispatch(&self, inc: Incoming, reply: Replier);
}

/// Accepts connections until the listener fails for good, serving each on its own task.
pub async fn accept_loop<S: Service>(
    listener: tokio::net::TcpListener,
    label: &'static str,
    svc: S,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let s2 = svc.clone();
                    serve(
                        stream,
                        label,
                        move || s2.epoch(),
                        |inc, reply| svc.dispatch(inc, reply),
                    )
                    .await;
                });
            }
            Err(e) => {
                tracing::warn!("{label}: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
