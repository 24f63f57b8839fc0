//! `spindle-proto`: the frame layer of Spindle's wire protocol.
//!
//! Every message between clients, storage daemons and the monitor travels in one frame:
//!
//! ```text
//! offset size field
//!      0    4 magic        "SPND" (0x444e5053 little endian)
//!      4    2 version      protocol version (`frame::VERSION`)
//!      6    2 kind         message kind (the message layer's code)
//!      8    2 flags        must be 0 in version 1
//!     10    2 reserved     must be 0
//!     12    8 request_id   chosen by the requester, echoed in the reply
//!     20    8 epoch        the sender's cluster-map epoch
//!     28    4 payload_len  bytes of payload that follow the header
//!     32    4 payload_crc  CRC32C of the payload
//!     36    4 header_crc   CRC32C of bytes 0..36
//!     40    - payload
//! ```
//!
//! All integers are little endian. Invariants:
//! - a frame is accepted only if its magic, version, reserved bits and both checksums are
//!   right and its payload is at most the decoder's `payload_len_max`; anything else is a
//!   typed [`FrameError`] and the connection is to be closed (the stream cannot be
//!   resynchronized safely);
//! - the header checksum is verified before the length is trusted, so a corrupt length
//!   never makes the decoder wait for, or allocate, gigabytes;
//! - decoding never panics, whatever the bytes (property-tested and fuzzed).
//!
//! The message bodies (object I/O, replication, map updates) are encoded with [`codec`]
//! and defined by the cluster crates on top of this one.

pub mod auth;
pub mod codec;
pub mod frame;

pub use codec::{CodecError, Reader, Writer};
pub use frame::{
    encode_frame, frame_header, Frame, FrameDecoder, FrameError, FrameHeader, HEADER_LEN, MAGIC,
    VERSION,
};
pub mod mons;
pub mod msg;
pub mod net;
pub mod request;
pub mod tickets;
pub mod transport;

pub use mons::MonAddrs;
pub use msg::{typed, ErrorCode, Msg, MsgKind};
pub use request::{AdminRequest, CallError, MapReply, RemoteError, Reply, Request};
