//! `spindle-io`: the I/O engine every Spindle disk and socket operation goes through.
//!
//! Design (DAPHNE asynchronous I/O, see `docs/io.md`): `rings` io_uring instances, each
//! driven by one thread (submit + complete) or two (submitter + completer) and fed by a
//! bounded staging queue; requests are spread round-robin; request metadata lives in a
//! pre-allocated slab; short reads and writes are resubmitted for the remainder.
//!
//! ```no_run
//! use spindle_io::{Config, Engine, Op};
//! let engine = Engine::new(Config::default()).unwrap();
//! let file = std::fs::File::open("/etc/hostname").unwrap();
//! use std::os::fd::AsRawFd;
//! let req = engine.submit(Op::read(file.as_raw_fd(), 0, vec![0u8; 4096])).unwrap();
//! let done = req.wait();
//! let n = done.result.unwrap(); // short at end of file, not an error
//! let bytes = &done.buf.unwrap()[..n];
//! # let _ = bytes;
//! ```
//!
//! Ownership: an [`Op`] owns its buffers; they come back in the [`Completion`]. A dropped
//! [`Request`] leaves them inside the engine until the kernel is done with them.
//!
//! Also: registered buffers and files ([`Engine::register_buffers`],
//! [`Engine::register_files`], [`Op::ReadFixed`]/[`Op::WriteFixed`], [`FixedBufPool`]),
//! per-request deadlines with linked timeouts ([`Engine::submit_with_timeout`]), IOPOLL rings
//! (`Config::iopoll`, [`LocalRing::builder`]), and [`LocalRing`], the caller-driven ring.
//!
//! Invariants: no allocation per request in steady state (slab, queues and scratch are
//! preallocated; checked by the `no_alloc` test); every request completes exactly once;
//! nothing is dropped when queues are full (submitters block).

pub mod alloc;
mod buf;
mod engine;
mod error;
mod exec;
mod fixed;
pub mod limits;
mod local;
mod op;
mod queue;
#[cfg(feature = "tokio")]
pub mod reactor;
mod slab;
mod stats;
mod threads;
mod uring;

pub use alloc::PageAlignedLarge;
pub use buf::IoBuf;
pub use engine::{BackendChoice, BackendKind, Config, Engine, RingThreads};
pub use error::{EngineError, SubmitError};
pub use exec::check_iopoll;
pub use fixed::{FileRef, FixedBuf, FixedBufPool, FixedFile};
pub use local::LocalRingBuilder;
pub use local::{LocalRing, Token};
pub use op::{Completion, InternalOp, Op};
pub use slab::Request;
pub use stats::{LatencySnapshot, RingStats, Stats};
pub use uring::{default_ring_factory, RingFactory, RingSetup};
