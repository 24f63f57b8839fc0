//! `spindle-nbd`: an NBD (Network Block Device) protocol server on tokio, generic over a
//! [`BlockDevice`] (and an [`Exports`] catalogue that opens devices by name).
//!
//! Protocol: the NBD specification (`doc/proto.md` of
//! <https://github.com/NetworkBlockDevice/nbd>), fixed-newstyle handshake only, with
//! `NBD_OPT_GO`/`INFO`/`LIST`/`EXPORT_NAME`/`ABORT`, structured replies and the
//! `base:allocation` metadata context (every extent is reported as allocated data).
//! TLS is not offered (`NBD_OPT_STARTTLS` -> `NBD_REP_ERR_UNSUP`).
//!
//! # Design
//!
//! One tokio task per connection runs the handshake (`handshake.rs`), then becomes the
//! *reader* of the transmission phase (`transmission.rs`):
//!
//! ```text
//!  socket rx --> reader task --(spawn, <= N in flight)--> op task --> device
//!                   |  acquire permit before reading            |
//!                   |  each request header                      v
//!                   '------------------------------------> mpsc --> writer task --> socket tx
//! ```
//!
//! * **Bounded concurrency / backpressure.** A semaphore of
//!   `requests_in_flight_per_connection` permits; the reader takes a permit *before* it
//!   reads the next request, and the permit travels with the request into its reply and is
//!   released only after the writer has put the reply on the socket. When all permits are
//!   taken the reader stops reading, so TCP flow control pushes back on the client and the
//!   server holds at most N requests (and N data buffers) per connection.
//! * **Single writer.** Only the writer task writes to the socket after the handshake, so
//!   reply frames are never interleaved; replies go out in completion order (NBD allows
//!   out-of-order replies; clients match them by handle).
//! * **FLUSH ordering.** Every write-type request (WRITE, TRIM, WRITE_ZEROES) gets a
//!   sequence number in the order it was read; a FLUSH waits until every write-type request
//!   read before it has completed, then calls [`BlockDevice::flush`]. Later writes are not
//!   blocked by a pending flush.
//! * **Errors stay per connection.** Malformed input never panics: a bad request magic, an
//!   unknown client flag or a WRITE whose payload is larger than `max_request_bytes`
//!   (the stream cannot be resynchronised) ends that connection after the in-flight
//!   requests are answered; everything else gets an errno reply and the session goes on.
//! * **Shutdown.** When the watch channel turns `true` the listener stops accepting, every
//!   connection stops reading new requests, answers the ones in flight and closes;
//!   `serve_*` returns once all connections are gone. (A dropped sender is not a shutdown.)
//!
//! Invariants: a device only sees ranges with `offset + len <= size_bytes()`; `read`/`write`
//! lengths never exceed `max_request_bytes`; no `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod device;
mod handshake;
pub mod proto;
mod server;
mod transmission;

pub use device::{BlockDevice, DeviceError, ExportInfo, Exports, MemoryDevice, MemoryExports};
pub use server::{NbdServer, ServerConfig, ServerStats};
