//! Transmission phase: reader loop, per-request op tasks, single writer task.
//!
//! Invariants: (1) only the writer task writes to the socket; (2) a semaphore permit is
//! held from before a request header is read until its reply has been written (or the
//! connection died), so at most `requests_in_flight_per_connection` requests and their
//! buffers exist per connection; (3) a FLUSH starts only after every write-type request
//! read before it has completed; (4) the device only sees in-bounds ranges.

use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use spindle_trace::Stage;
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadHalf, WriteHalf,
};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::device::{BlockDevice, Exports};
use crate::handshake::Session;
use crate::proto::*;
use crate::server::{bump, wait_shutdown, NbdServer};

/// What a request is answered with.
enum Body {
    /// Success without payload.
    Ok,
    /// Successful READ data for the range starting at `offset`, in pieces sent one after
    /// another (as the device assembled it: no copy into one buffer).
    Data { offset: u64, data: Vec<Bytes> },
    /// Error reply (`message` is used only in structured replies).
    Error { errno: u32, message: String },
    /// `base:allocation` extent: the whole range is allocated data.
    BlockStatus { context: u32, length: u32 },
}

struct Reply {
    handle: u64,
    body: Body,
    /// Released when the reply has been written (backpressure).
    _permit: OwnedSemaphorePermit,
    /// When the reply was produced, if stage clocks are on (`spindle_trace`).
    produced: Option<std::time::Instant>,
}

/// Tracks in-flight write-type requests by arrival sequence number, so a FLUSH can wait
/// for exactly the writes read before it.
#[derive(Default)]
struct WriteTracker {
    in_flight: Mutex<BTreeSet<u64>>,
    changed: Notify,
}

struct WriteGuard {
    tracker: Arc<WriteTracker>,
    seq: u64,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.tracker.lock().remove(&self.seq);
        self.tracker.changed.notify_waiters();
    }
}

impl WriteTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        // The set stays consistent even if a holder panicked (single insert/remove).
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn begin(self: &Arc<Self>, seq: u64) -> WriteGuard {
        self.lock().insert(seq);
        WriteGuard {
            tracker: self.clone(),
            seq,
        }
    }

    /// Waits until no write with a sequence number below `seq` is in flight.
    async fn wait_before(&self, seq: u64) {
        loop {
            // Registered before the check: `notify_waiters` wakes futures created earlier.
            let notified = self.changed.notified();
            if self.lock().first().is_none_or(|&first| first >= seq) {
                return;
            }
            notified.await;
        }
    }
}

/// Why the reader stopped.
enum Stop {
    Eof,
    Disc,
    Shutdown,
    Protocol,
    WriterGone,
}

pub(crate) async fn run<E, S>(
    server: Arc<NbdServer<E>>,
    session: Session<E::Device>,
    mut rd: BufReader<ReadHalf<S>>,
    wr: WriteHalf<S>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()>
where
    E: Exports,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    debug!(export = %session.export_name, structured = session.structured,
        flags = session.transmission_flags, "nbd transmission phase");
    let n = server.config.requests_in_flight_per_connection;
    let max_request_bytes = server.config.max_request_bytes;
    let size_bytes = session.device.size_bytes();
    let structured = session.structured;
    let semaphore = Arc::new(Semaphore::new(n));
    let tracker = Arc::new(WriteTracker::default());
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(writer_loop(
        BufWriter::with_capacity(256 * 1024, wr),
        rx,
        structured,
    ));
    let mut seq: u64 = 0;

    let stop = loop {
        // Backpressure: no permit, no read.
        let permit = tokio::select! {
            p = semaphore.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break Stop::WriterGone, // semaphore is never closed
            },
            _ = tx.closed() => break Stop::WriterGone,
        };
        // Read the next request, unless a shutdown comes first. Cancelling a half-read
        // request is fine: the connection is closed right after.
        let incoming = tokio::select! {
            biased;
            _ = wait_shutdown(&mut shutdown) => break Stop::Shutdown,
            _ = tx.closed() => break Stop::WriterGone,
            r = read_request(&mut rd, max_request_bytes, &server) => r,
        };
        let decoded = spindle_trace::now();
        let (req, payload) = match incoming {
            Ok(Incoming::Request(req, payload)) => (req, payload),
            Ok(Incoming::Stalled(req, got)) => {
                warn!(export = %session.export_name, len = req.length, received = got,
                    "nbd WRITE payload stalled; disconnecting client");
                bump(&server.counters.stalled_connections, 1);
                break Stop::Protocol;
            }
            Ok(Incoming::BadMagic(m)) => {
                warn!(magic = format_args!("{m:#010x}"), export = %session.export_name,
                    "nbd request with bad magic; disconnecting client");
                bump(&server.counters.protocol_errors, 1);
                break Stop::Protocol;
            }
            Ok(Incoming::OversizedWrite(req)) => {
                // The payload cannot be skipped safely: answer, then disconnect.
                warn!(
                    len = req.length,
                    max = max_request_bytes,
                    "nbd WRITE larger than the maximum request size; disconnecting client"
                );
                bump(&server.counters.requests_write, 1);
                bump(&server.counters.protocol_errors, 1);
                bump(&server.counters.error_replies, 1);
                let message = format!(
                    "write of {} bytes exceeds maximum {max_request_bytes}",
                    req.length
                );
                let body = Body::Error {
                    errno: NBD_EINVAL,
                    message,
                };
                let _ = tx.send(Reply {
                    handle: req.handle,
                    body,
                    _permit: permit,
                    produced: spindle_trace::now(),
                });
                break Stop::Protocol;
            }
            Err(e) => {
                debug!(error = %e, "nbd connection closed");
                break Stop::Eof;
            }
        };
        if let Some((p, _)) = &payload {
            bump(&server.counters.bytes_written, p.len() as u64);
        }
        let c = &server.counters;
        match req.command {
            Command::Read => bump(&c.requests_read, 1),
            Command::Write => bump(&c.requests_write, 1),
            Command::Disc => bump(&c.requests_disc, 1),
            Command::Flush => bump(&c.requests_flush, 1),
            Command::Trim => bump(&c.requests_trim, 1),
            Command::Cache => bump(&c.requests_cache, 1),
            Command::WriteZeroes => bump(&c.requests_write_zeroes, 1),
            Command::BlockStatus => bump(&c.requests_block_status, 1),
            Command::Unknown(_) => bump(&c.requests_unknown, 1),
        }

        let reply_now = |errno: u32, message: String, permit: OwnedSemaphorePermit| {
            let body = if errno == 0 {
                Body::Ok
            } else {
                Body::Error { errno, message }
            };
            if errno != 0 {
                bump(&server.counters.error_replies, 1);
            }
            // A closed channel means the writer died; the loop notices on the next turn.
            let _ = tx.send(Reply {
                handle: req.handle,
                body,
                _permit: permit,
                produced: spindle_trace::now(),
            });
        };

        if req.flags & !KNOWN_CMD_FLAGS != 0 {
            reply_now(
                NBD_EINVAL,
                format!("unknown command flags {:#x}", req.flags),
                permit,
            );
            continue;
        }
        let in_bounds = req
            .offset
            .checked_add(u64::from(req.length))
            .is_some_and(|end| end <= size_bytes);
        let out_of_bounds_errno = match req.command {
            Command::Write | Command::WriteZeroes => NBD_ENOSPC,
            _ => NBD_EINVAL,
        };
        let bounds_msg = || {
            format!(
                "range {}+{} beyond export size {size_bytes}",
                req.offset, req.length
            )
        };
        let fua = req.flags & NBD_CMD_FLAG_FUA != 0;
        let device = session.device.clone();

        match req.command {
            Command::Disc => break Stop::Disc,
            Command::Unknown(t) => {
                reply_now(NBD_EINVAL, format!("unknown command type {t}"), permit);
            }
            _ if req.command != Command::Flush && !in_bounds => {
                reply_now(out_of_bounds_errno, bounds_msg(), permit);
            }
            Command::Read if req.length > max_request_bytes => {
                reply_now(
                    NBD_EINVAL,
                    format!(
                        "read of {} bytes exceeds maximum {max_request_bytes}",
                        req.length
                    ),
                    permit,
                );
            }
            Command::Read if req.length == 0 => reply_now(0, String::new(), permit),
            Command::Cache => reply_now(0, String::new(), permit),
            Command::BlockStatus => match session.base_allocation {
                None => reply_now(NBD_EINVAL, "no metadata context negotiated".into(), permit),
                Some(_) if req.length == 0 => {
                    reply_now(NBD_EINVAL, "zero-length block status".into(), permit)
                }
                Some(context) => {
                    let _ = tx.send(Reply {
                        handle: req.handle,
                        body: Body::BlockStatus {
                            context,
                            length: req.length,
                        },
                        _permit: permit,
                        produced: spindle_trace::now(),
                    });
                }
            },
            Command::Read => {
                let tx = tx.clone();
                let server = server.clone();
                let (offset, len) = (req.offset, req.length);
                tokio::spawn(async move {
                    spindle_trace::record(Stage::NbdDispatch, decoded);
                    let read_start = spindle_trace::now();
                    let read = device.read_pieces(offset, len).await;
                    spindle_trace::record(Stage::NbdDeviceRead, read_start);
                    let body = match read {
                        Ok(data) if pieces_len(&data) == len as usize => {
                            bump(&server.counters.bytes_read, u64::from(len));
                            Body::Data { offset, data }
                        }
                        Ok(data) => device_error(
                            &server,
                            NBD_EIO,
                            format!(
                                "device returned {} bytes for a {len}-byte read",
                                pieces_len(&data)
                            ),
                        ),
                        Err(e) => device_error(&server, e.errno(), e.to_string()),
                    };
                    let _ = tx.send(Reply {
                        handle: req.handle,
                        body,
                        _permit: permit,
                        produced: spindle_trace::now(),
                    });
                });
            }
            Command::Write | Command::Trim | Command::WriteZeroes => {
                let guard = tracker.begin(seq);
                seq += 1;
                let tx = tx.clone();
                let server = server.clone();
                let (command, offset, len, flags) =
                    (req.command, req.offset, req.length, req.flags);
                tokio::spawn(async move {
                    let r = match command {
                        Command::Write => {
                            // The payload's budget is held until the device has taken it.
                            let (data, _charged) = match payload {
                                Some((data, charged)) => (data, Some(charged)),
                                None => (Vec::new(), None),
                            };
                            let write_start = spindle_trace::now();
                            let written = device.write(offset, data, fua).await;
                            spindle_trace::record(Stage::NbdDeviceWrite, write_start);
                            written
                        }
                        // The trait's trim has no FUA: honour it with a flush.
                        Command::Trim if fua => match device.trim(offset, len).await {
                            Ok(()) => device.flush().await,
                            Err(e) => Err(e),
                        },
                        Command::Trim => device.trim(offset, len).await,
                        _ => {
                            device
                                .write_zeroes(offset, len, flags & NBD_CMD_FLAG_NO_HOLE == 0, fua)
                                .await
                        }
                    };
                    drop(guard);
                    let body = match r {
                        Ok(()) => Body::Ok,
                        Err(e) => device_error(&server, e.errno(), e.to_string()),
                    };
                    let _ = tx.send(Reply {
                        handle: req.handle,
                        body,
                        _permit: permit,
                        produced: spindle_trace::now(),
                    });
                });
            }
            Command::Flush => {
                let tx = tx.clone();
                let server = server.clone();
                let tracker = tracker.clone();
                let before = seq;
                tokio::spawn(async move {
                    tracker.wait_before(before).await;
                    let body = match device.flush().await {
                        Ok(()) => Body::Ok,
                        Err(e) => device_error(&server, e.errno(), e.to_string()),
                    };
                    let _ = tx.send(Reply {
                        handle: req.handle,
                        body,
                        _permit: permit,
                        produced: spindle_trace::now(),
                    });
                });
            }
        }
    };

    match stop {
        Stop::Eof => debug!("nbd client closed the connection"),
        Stop::Disc => debug!("nbd client sent NBD_CMD_DISC"),
        Stop::Shutdown => debug!("nbd server shutdown: closing connection"),
        Stop::Protocol | Stop::WriterGone => {}
    }
    // Each in-flight op holds a sender clone: the writer ends after the last reply.
    drop(tx);
    match writer.await {
        Ok(r) => r,
        Err(e) => Err(io::Error::other(e)),
    }
}

/// One request as read from the socket.
enum Incoming {
    /// A request header, with its payload for WRITE (and the payload budget it holds).
    Request(RequestHeader, Option<(Vec<u8>, OwnedSemaphorePermit)>),
    /// A WRITE whose payload did not arrive in time (bytes received so far).
    Stalled(RequestHeader, usize),
    /// A WRITE whose payload exceeds `max_request_bytes` (payload not read).
    OversizedWrite(RequestHeader),
    /// The header did not start with `NBD_REQUEST_MAGIC`.
    BadMagic(u32),
}

/// Reads one request header and, for WRITE, its payload. `Err` = the stream ended/failed.
async fn read_request<R: AsyncRead + Unpin, E: Exports>(
    rd: &mut BufReader<R>,
    max_request_bytes: u32,
    server: &NbdServer<E>,
) -> io::Result<Incoming> {
    let mut hdr = [0u8; REQUEST_HEADER_BYTES];
    rd.read_exact(&mut hdr).await?;
    let req = match RequestHeader::decode(&hdr) {
        Ok(r) => r,
        Err(BadRequestMagic(m)) => return Ok(Incoming::BadMagic(m)),
    };
    if req.command != Command::Write {
        return Ok(Incoming::Request(req, None));
    }
    if req.length > max_request_bytes {
        return Ok(Incoming::OversizedWrite(req));
    }
    // Bounded by max_request_bytes (<= 2^30) and by the in-flight permit count.
    // Read into spare capacity: zeroing the buffer first would be one more pass over
    // every written byte.
    // The payload is charged to the server's budget before it is read: while the budget
    // is exhausted this connection is not read (TCP slows the client down).
    let charged = server.payload_budget.acquire(u64::from(req.length)).await;
    let cfg = &server.config;
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(
            cfg.payload_deadline_ms_base
                + u64::from(req.length).div_ceil(1 << 20) * cfg.payload_deadline_ms_per_mib,
        );
    let len = req.length as usize;
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let mut take = (&mut *rd).take((len - buf.len()) as u64);
        let Ok(n) = tokio::time::timeout_at(deadline, take.read_buf(&mut buf)).await else {
            return Ok(Incoming::Stalled(req, buf.len()));
        };
        let n = n?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "stream ended inside a write payload ({} of {len} bytes)",
                    buf.len()
                ),
            ));
        }
    }
    Ok(Incoming::Request(req, Some((buf, charged))))
}

fn pieces_len(pieces: &[Bytes]) -> usize {
    pieces.iter().map(Bytes::len).sum()
}

fn device_error<E: Exports>(server: &NbdServer<E>, errno: u32, message: String) -> Body {
    bump(&server.counters.error_replies, 1);
    Body::Error { errno, message }
}

/// Writes replies in completion order; batches everything already queued into one flush.
async fn writer_loop<W: AsyncWrite + Unpin>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    structured: bool,
) -> io::Result<()> {
    while let Some(first) = rx.recv().await {
        let start = spindle_trace::now();
        encode(&mut w, first, structured).await?;
        let mut replies = 1;
        while let Ok(next) = rx.try_recv() {
            encode(&mut w, next, structured).await?;
            replies += 1;
        }
        w.flush().await?;
        if let Some(start) = start {
            spindle_trace::add(Stage::NbdSend, replies, start.elapsed());
        }
    }
    w.shutdown().await
}

async fn encode<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    r: Reply,
    structured: bool,
) -> io::Result<()> {
    spindle_trace::record(Stage::NbdReplyQueue, r.produced);
    let h = r.handle;
    if !structured {
        match r.body {
            Body::Ok => w.write_all(&simple_reply_header(0, h)).await?,
            Body::Data { data, .. } => {
                w.write_all(&simple_reply_header(0, h)).await?;
                for piece in &data {
                    w.write_all(piece).await?;
                }
            }
            Body::Error { errno, .. } => w.write_all(&simple_reply_header(errno, h)).await?,
            // Never produced without structured replies (context needs them).
            Body::BlockStatus { .. } => w.write_all(&simple_reply_header(NBD_EINVAL, h)).await?,
        }
        return Ok(());
    }
    match r.body {
        Body::Ok => {
            w.write_all(&structured_reply_header(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_NONE,
                h,
                0,
            ))
            .await?;
        }
        Body::Data { offset, data } => {
            // One chunk per read: its length <= max_request_bytes <= 2^30, so 8 + len fits u32.
            let len = 8 + pieces_len(&data) as u32;
            w.write_all(&structured_reply_header(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_OFFSET_DATA,
                h,
                len,
            ))
            .await?;
            w.write_all(&offset.to_be_bytes()).await?;
            for piece in &data {
                w.write_all(piece).await?;
            }
        }
        Body::Error { errno, message } => {
            let msg = truncate_utf8(&message, MAX_STRING_BYTES).as_bytes();
            let len = 6 + msg.len() as u32;
            w.write_all(&structured_reply_header(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_ERROR,
                h,
                len,
            ))
            .await?;
            w.write_all(&errno.to_be_bytes()).await?;
            w.write_all(&(msg.len() as u16).to_be_bytes()).await?;
            w.write_all(msg).await?;
        }
        Body::BlockStatus { context, length } => {
            w.write_all(&structured_reply_header(
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_BLOCK_STATUS,
                h,
                12,
            ))
            .await?;
            let mut d = [0u8; 12];
            d[0..4].copy_from_slice(&context.to_be_bytes());
            d[4..8].copy_from_slice(&length.to_be_bytes());
            // d[8..12] = status flags 0: allocated, not known to be zero.
            w.write_all(&d).await?;
        }
    }
    Ok(())
}
