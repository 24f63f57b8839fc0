//! Message bodies of the cluster protocol (monitor, storage daemons, clients).
//!
//! One [`Msg`] travels in one frame; the frame's `kind` is [`Msg::kind`] and the body is
//! encoded with [`crate::codec`]. Requests and replies are matched by the frame's
//! `request_id`; every frame carries the sender's map epoch (see `docs/cluster.md`).
//! Decoding validates every length and enum tag: a bad body is a [`CodecError`], which
//! the receiver answers with an error reply (or closes the connection), never a panic.
//!
//! Every message is declared once, in the `messages!` table below: its kind tag, its log
//! name and its fields, each with the codec it travels with. [`Msg`], [`MsgKind`], the
//! per-message structs of [`typed`], `kind`, `name`, `encode`, `decode` and `bulk` follow
//! from that. Adding a message is one entry there, plus one line in `request.rs` if it is
//! a request (naming its reply type). The bytes are pinned by golden vectors
//! (`tests/golden/messages.txt`).

use crate::codec::{CodecError, Reader, Writer};

/// Longest object name (`spindle_types::limits::OBJECT_NAME_BYTES_MAX`).
pub const NAME_MAX: usize = spindle_types::limits::OBJECT_NAME_BYTES_MAX;
/// Largest data payload in one message (`spindle_types::limits::MESSAGE_DATA_BYTES_MAX`).
pub const DATA_MAX: usize = spindle_types::limits::MESSAGE_DATA_BYTES_MAX;
const LIST_MAX: u32 = 1 << 22;
const MAP_MAX: usize = spindle_types::limits::CLUSTER_MAP_BYTES_MAX;
const TEXT_MAX: usize = 1 << 20;
/// A Raft request carries log entries of whole maps (the sender splits batches that would
/// not fit: `spindle-mon` answers `PayloadTooLarge` with a smaller count).
pub const RAFT_MAX: usize = spindle_types::limits::FRAME_PAYLOAD_BYTES_MAX / 2;

/// Error codes carried in `ErrorReply`.
pub use spindle_types::ErrorCode;
/// A placement-group version: ordered by (epoch, seq) (one type with the store's).
pub use spindle_types::Version as Ver;

/// A change to one object, as replicated from the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    WriteFull(Vec<u8>),
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        size_bytes: u64,
    },
    Delete,
    /// Several writes to one object as one operation (one version, one journal record on
    /// each copy): `data` holds the extents' bytes one after the other; extents sorted
    /// and not overlapping (`spindle_types::check_extents`, checked when decoded).
    /// Replicated pools only (a write log's publisher sends these).
    WriteExtents {
        extents: Vec<spindle_types::Extent>,
        data: Vec<u8>,
    },
    /// Client -> primary of an erasure-coded pool: the client-encoded shards of a byte range
    /// of stripes. `data` holds k + m segments of `shard_len` bytes each (shard i's bytes
    /// from `shard_offset`); the object's size becomes `object_size`. `full`: the segments
    /// are the whole object (no old content kept). `expect`: the version the client read
    /// the untouched parts of the stripes at (a partial write is refused with `Conflict`
    /// when the object changed since; None = the object did not exist).
    EcWrite {
        object_size: u64,
        shard_offset: u64,
        shard_len: u64,
        full: bool,
        expect: Option<Ver>,
        data: Vec<u8>,
    },
    /// Primary -> one shard copy: write a new version of a shard slot object =
    /// (the shard's content at version `base`, found in whichever slot holds it, or
    /// nothing) resized to `shard_size`, with `data` at `shard_offset`, for `object_size`.
    /// `delta_base`: None writes a whole shard (followed by the shard trailer); Some(p)
    /// writes a delta slot over the whole-shard slot at position p (the one holding
    /// `base`, or the base of the delta holding it), or - when this copy cannot - a delta
    /// covering the whole shard (`spindle_map::ec::delta`).
    EcPatch {
        base: Option<Ver>,
        object_size: u64,
        shard_size: u64,
        shard_offset: u64,
        delta_base: Option<u8>,
        data: Vec<u8>,
    },
}

impl From<spindle_types::Mutation> for Mutation {
    /// An object mutation as the protocol carries it (same variants, same bytes).
    fn from(m: spindle_types::Mutation) -> Mutation {
        use spindle_types::Mutation as M;
        match m {
            M::WriteFull(data) => Mutation::WriteFull(data),
            M::Write { offset, data } => Mutation::Write { offset, data },
            M::Truncate { size_bytes } => Mutation::Truncate { size_bytes },
            M::Delete => Mutation::Delete,
            M::WriteExtents { extents, data } => Mutation::WriteExtents { extents, data },
        }
    }
}

/// An erasure-coded shard write where an object mutation was needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardMutation;

impl TryFrom<Mutation> for spindle_types::Mutation {
    type Error = ShardMutation;
    /// The object mutation carried, or `ShardMutation` for `EcWrite` / `EcPatch` (which
    /// only erasure-coded groups take).
    fn try_from(m: Mutation) -> Result<spindle_types::Mutation, ShardMutation> {
        use spindle_types::Mutation as M;
        Ok(match m {
            Mutation::WriteFull(data) => M::WriteFull(data),
            Mutation::Write { offset, data } => M::Write { offset, data },
            Mutation::Truncate { size_bytes } => M::Truncate { size_bytes },
            Mutation::Delete => M::Delete,
            Mutation::WriteExtents { extents, data } => M::WriteExtents { extents, data },
            Mutation::EcWrite { .. } | Mutation::EcPatch { .. } => return Err(ShardMutation),
        })
    }
}

impl Mutation {
    /// An erasure-coded shard write (`EcWrite`, `EcPatch`).
    pub fn is_shard(&self) -> bool {
        matches!(self, Mutation::EcWrite { .. } | Mutation::EcPatch { .. })
    }
}

/// What a client asks of an object (or, for `List`, of a placement group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjOp {
    Mutate(Mutation),
    Read {
        offset: u64,
        len: u64,
    },
    Stat,
    List,
    /// Run a pushdown program (`spindle-prog`) against the object, and against `more`
    /// objects of the same placement group (names sharing a placement key: see
    /// `spindle_map::placement::placement_key`). Answered with `ObjReply`: `version` is the
    /// object's, `size_bytes` the program's return value, `data` its output, `listing` the
    /// objects it ran against; a refused or stopped program is `ProgramFailed`, a program
    /// the daemon does not hold (and `elf` empty) `ProgramUnknown`.
    Exec(ExecOp),
}

/// A program run (`ObjOp::Exec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOp {
    /// BLAKE3 of the program's object file.
    pub program: [u8; 32],
    /// The JIT (else the interpreter).
    pub jit: bool,
    /// Read the objects through the daemon's data cache (and fill it).
    pub cache: bool,
    /// On an erasure-coded pool, run on each data shard's part of the objects, on the
    /// daemon holding it (answered with `ExecParts`); else ignored (whole objects).
    pub shards: bool,
    /// The program's arguments (at most [`EXEC_ARGS_MAX`] bytes).
    pub args: Vec<u8>,
    /// Other objects the program sees after the first (at most [`EXEC_OBJECTS_MAX`] - 1).
    pub more: Vec<String>,
    /// The program's object file (the bulk), or empty when the daemon should hold it.
    pub elf: Vec<u8>,
}

/// Largest argument block of a program run.
pub const EXEC_ARGS_MAX: usize = spindle_types::limits::EXEC_ARGS_BYTES_MAX;
/// Most objects one program run sees.
pub const EXEC_OBJECTS_MAX: usize = spindle_types::limits::EXEC_OBJECTS_MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntryMsg {
    pub version: Ver,
    pub name: String,
    pub delete: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectListing {
    pub name: String,
    pub size_bytes: u64,
    pub version: Ver,
}

/// State of a placement group as its primary reports it to the monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PgStateCode {
    /// All copies present and in sync.
    Clean = 0,
    /// Serving, but fewer copies than the pool's size are up.
    Degraded = 1,
    /// Peering or copying objects to bring copies in sync.
    Recovering = 2,
    /// Fewer than min_size copies up: not serving.
    Inactive = 3,
    /// Serving while copying whole placement-group contents to a copy whose log does not
    /// reach back far enough (a new or long-absent daemon).
    Backfilling = 4,
    /// No complete copy is reachable: not serving until one comes back.
    Incomplete = 5,
    /// Exchanging logs with the other copies: not serving yet.
    Peering = 6,
}

impl PgStateCode {
    fn from_u8(v: u8) -> Result<Self, CodecError> {
        Ok(match v {
            0 => Self::Clean,
            1 => Self::Degraded,
            2 => Self::Recovering,
            3 => Self::Inactive,
            4 => Self::Backfilling,
            5 => Self::Incomplete,
            6 => Self::Peering,
            _ => {
                return Err(CodecError::Invalid {
                    what: "pg state",
                    value: v as u64,
                })
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgReport {
    pub pool: u32,
    pub pg: u32,
    pub state: PgStateCode,
    pub objects: u64,
    /// Object copies still to recover (summed over the copies that miss them).
    pub missing_objects: u64,
    /// Bytes of those copies (as known on the primary).
    pub missing_bytes: u64,
    /// Objects scrub found with no intact copy (replicated) or fewer than k intact shards
    /// (erasure-coded): unrecoverable until overwritten or deleted. Non-zero makes the
    /// group `inconsistent` in `spindle status` and raises the `PG_DAMAGED` health check.
    pub damaged_objects: u64,
}

/// One object of a copy, as scrub compares them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubEntry {
    pub name: String,
    pub version: Ver,
    pub size_bytes: u64,
    /// CRC32C of the whole object data (0 when `ok` is false).
    pub digest: u32,
    /// False when the copy failed its own block checksums.
    pub ok: bool,
}

/// How each field of a message travels. A message declares one of these per field (see
/// [`messages!`]); its encoding, decoding and bulk access follow from that.
mod wire {
    use super::*;

    /// The codec of one field: written to the fields section (or left to the bulk),
    /// read back in declaration order.
    pub(super) trait Field {
        type Value;
        fn put(&self, w: &mut Writer, v: &Self::Value);
        fn get(
            &self,
            r: &mut Reader,
            bulk: &mut Option<Vec<u8>>,
        ) -> Result<Self::Value, CodecError>;
        /// The bulk bytes this field carries, if any.
        fn bulk<'a>(&self, _v: &'a Self::Value) -> Option<&'a [u8]> {
            None
        }
        fn bulk_mut<'a>(&self, _v: &'a mut Self::Value) -> Option<&'a mut Vec<u8>> {
            None
        }
    }

    /// Little-endian u32, labelled for errors.
    pub(super) struct U32(pub &'static str);
    /// Little-endian u64.
    pub(super) struct U64(pub &'static str);
    /// A bool as one byte (decoded: non-zero is true).
    pub(super) struct Flag(pub &'static str);
    /// A length-prefixed UTF-8 string of at most `.1` bytes.
    pub(super) struct Text(pub &'static str, pub usize);
    /// An object name (at most [`NAME_MAX`] bytes).
    pub(super) struct Name;
    /// Length-prefixed bytes of at most `.1` bytes.
    pub(super) struct Bytes(pub &'static str, pub usize);
    /// The body's bulk bytes (nothing in the fields section).
    pub(super) struct Bulk;
    /// A version: epoch, seq.
    pub(super) struct V;
    /// `u8 exists` (any non-zero is true) then the version if it exists.
    pub(super) struct OptVer;
    pub(super) struct Op;
    pub(super) struct Mut;
    pub(super) struct Log;
    pub(super) struct Reports;
    pub(super) struct Counters;
    /// The command's arguments: at most 64 strings.
    pub(super) struct Args;
    pub(super) struct Listing;
    /// A counted list of object names.
    pub(super) struct Names(pub &'static str);
    /// A counted list of u64 values, at most `.1`.
    pub(super) struct U64s(pub &'static str, pub usize);
    pub(super) struct ScrubEntries;
    pub(super) struct Code;

    /// A field with no bulk bytes: its value type, how it is written and how it is read
    /// (`$s` is the field descriptor, for its label and bound).
    macro_rules! plain_field {
        ($($t:ty => $v:ty, put($w:ident, $x:ident) $put:block, get($s:ident, $r:ident) $get:block;)*) => {$(
            impl Field for $t {
                type Value = $v;
                fn put(&self, $w: &mut Writer, $x: &$v) $put
                fn get(&self, $r: &mut Reader, _: &mut Option<Vec<u8>>) -> Result<$v, CodecError> {
                    let $s = self;
                    $get
                }
            }
        )*};
    }
    plain_field! {
        U32 => u32, put(w, v) { w.u32(*v); }, get(s, r) { r.u32(s.0) };
        U64 => u64, put(w, v) { w.u64(*v); }, get(s, r) { r.u64(s.0) };
        Flag => bool, put(w, v) { w.u8(*v as u8); }, get(s, r) { Ok(r.u8(s.0)? != 0) };
        Text => String, put(w, v) { w.str(v); }, get(s, r) { Ok(r.str(s.0, s.1)?.to_string()) };
        Name => String, put(w, v) { w.str(v); }, get(_s, r) { name(r) };
        Bytes => Vec<u8>, put(w, v) { w.bytes(v); }, get(s, r) { Ok(r.bytes(s.0, s.1)?.to_vec()) };
        V => Ver, put(w, v) { put_ver(w, *v); }, get(_s, r) { get_ver(r) };
        OptVer => Option<Ver>, put(w, v) { put_opt_ver(w, *v); }, get(_s, r) {
            Ok(match r.u8("exists")? {
                0 => None,
                _ => Some(get_ver(r)?),
            })
        };
    }
    impl Field for Bulk {
        type Value = Vec<u8>;
        fn put(&self, _: &mut Writer, _: &Vec<u8>) {}
        fn get(&self, _: &mut Reader, bulk: &mut Option<Vec<u8>>) -> Result<Vec<u8>, CodecError> {
            Ok(take_bulk(bulk))
        }
        fn bulk<'a>(&self, v: &'a Vec<u8>) -> Option<&'a [u8]> {
            Some(v)
        }
        fn bulk_mut<'a>(&self, v: &'a mut Vec<u8>) -> Option<&'a mut Vec<u8>> {
            Some(v)
        }
    }
    fn mutation_data(m: &Mutation) -> Option<&[u8]> {
        match m {
            Mutation::WriteFull(d)
            | Mutation::Write { data: d, .. }
            | Mutation::WriteExtents { data: d, .. }
            | Mutation::EcWrite { data: d, .. }
            | Mutation::EcPatch { data: d, .. } => Some(d),
            Mutation::Truncate { .. } | Mutation::Delete => None,
        }
    }
    fn mutation_data_mut(m: &mut Mutation) -> Option<&mut Vec<u8>> {
        match m {
            Mutation::WriteFull(d)
            | Mutation::Write { data: d, .. }
            | Mutation::WriteExtents { data: d, .. }
            | Mutation::EcWrite { data: d, .. }
            | Mutation::EcPatch { data: d, .. } => Some(d),
            Mutation::Truncate { .. } | Mutation::Delete => None,
        }
    }
    impl Field for Mut {
        type Value = Mutation;
        fn put(&self, w: &mut Writer, v: &Mutation) {
            put_mutation(w, v);
        }
        fn get(&self, r: &mut Reader, bulk: &mut Option<Vec<u8>>) -> Result<Mutation, CodecError> {
            get_mutation(r, bulk)
        }
        fn bulk<'a>(&self, v: &'a Mutation) -> Option<&'a [u8]> {
            mutation_data(v)
        }
        fn bulk_mut<'a>(&self, v: &'a mut Mutation) -> Option<&'a mut Vec<u8>> {
            mutation_data_mut(v)
        }
    }
    impl Field for Op {
        type Value = ObjOp;
        fn put(&self, w: &mut Writer, v: &ObjOp) {
            match v {
                ObjOp::Mutate(m) => {
                    w.u8(0);
                    put_mutation(w, m);
                }
                ObjOp::Read { offset, len } => {
                    w.u8(1).u64(*offset).u64(*len);
                }
                ObjOp::Stat => {
                    w.u8(2);
                }
                ObjOp::List => {
                    w.u8(3);
                }
                ObjOp::Exec(e) => {
                    w.u8(4);
                    w.bytes(&e.program)
                        .u8(e.jit as u8 | (e.cache as u8) << 1 | (e.shards as u8) << 2)
                        .bytes(&e.args)
                        .u32(e.more.len() as u32);
                    for n in &e.more {
                        w.str(n);
                    }
                }
            }
        }
        fn get(&self, r: &mut Reader, bulk: &mut Option<Vec<u8>>) -> Result<ObjOp, CodecError> {
            Ok(match r.u8("op")? {
                0 => ObjOp::Mutate(get_mutation(r, bulk)?),
                1 => ObjOp::Read {
                    offset: r.u64("offset")?,
                    len: r.u64("len")?,
                },
                2 => ObjOp::Stat,
                3 => ObjOp::List,
                4 => {
                    let id = r.bytes("program id", 32)?;
                    let program: [u8; 32] = id.try_into().map_err(|_| CodecError::Invalid {
                        what: "program id length",
                        value: id.len() as u64,
                    })?;
                    let flags = r.u8("exec flags")?;
                    if flags > 7 {
                        return Err(CodecError::Invalid {
                            what: "exec flags",
                            value: flags as u64,
                        });
                    }
                    let args = r.bytes("program args", EXEC_ARGS_MAX)?.to_vec();
                    let count = r.u32("exec object count")?;
                    if count as usize >= EXEC_OBJECTS_MAX {
                        return Err(CodecError::Invalid {
                            what: "exec object count",
                            value: count as u64,
                        });
                    }
                    let mut more = Vec::with_capacity(count as usize);
                    for _ in 0..count {
                        more.push(name(r)?);
                    }
                    ObjOp::Exec(ExecOp {
                        program,
                        jit: flags & 1 != 0,
                        cache: flags & 2 != 0,
                        shards: flags & 4 != 0,
                        args,
                        more,
                        elf: take_bulk(bulk),
                    })
                }
                v => {
                    return Err(CodecError::Invalid {
                        what: "op",
                        value: v as u64,
                    })
                }
            })
        }
        fn bulk<'a>(&self, v: &'a ObjOp) -> Option<&'a [u8]> {
            match v {
                ObjOp::Mutate(m) => mutation_data(m),
                ObjOp::Exec(e) => Some(&e.elf),
                _ => None,
            }
        }
        fn bulk_mut<'a>(&self, v: &'a mut ObjOp) -> Option<&'a mut Vec<u8>> {
            match v {
                ObjOp::Mutate(m) => mutation_data_mut(m),
                ObjOp::Exec(e) => Some(&mut e.elf),
                _ => None,
            }
        }
    }
    impl Field for Log {
        type Value = Vec<LogEntryMsg>;
        fn put(&self, w: &mut Writer, v: &Vec<LogEntryMsg>) {
            put_log(w, v);
        }
        fn get(
            &self,
            r: &mut Reader,
            _: &mut Option<Vec<u8>>,
        ) -> Result<Vec<LogEntryMsg>, CodecError> {
            get_log(r)
        }
    }
    impl Field for Reports {
        type Value = Vec<PgReport>;
        fn put(&self, w: &mut Writer, v: &Vec<PgReport>) {
            w.u32(v.len() as u32);
            for p in v {
                w.u32(p.pool)
                    .u32(p.pg)
                    .u8(p.state as u8)
                    .u64(p.objects)
                    .u64(p.missing_objects)
                    .u64(p.missing_bytes)
                    .u64(p.damaged_objects);
            }
        }
        fn get(
            &self,
            r: &mut Reader,
            _: &mut Option<Vec<u8>>,
        ) -> Result<Vec<PgReport>, CodecError> {
            let n = count(r, "report count")?;
            let mut reports = Vec::with_capacity((n as usize).min(4096));
            for _ in 0..n {
                reports.push(PgReport {
                    pool: r.u32("pool")?,
                    pg: r.u32("pg")?,
                    state: PgStateCode::from_u8(r.u8("state")?)?,
                    objects: r.u64("objects")?,
                    missing_objects: r.u64("missing objects")?,
                    missing_bytes: r.u64("missing bytes")?,
                    damaged_objects: r.u64("damaged objects")?,
                });
            }
            Ok(reports)
        }
    }
    impl Field for Counters {
        type Value = Vec<(String, u64)>;
        fn put(&self, w: &mut Writer, v: &Vec<(String, u64)>) {
            w.u32(v.len() as u32);
            for (k, v) in v {
                w.str(k).u64(*v);
            }
        }
        fn get(
            &self,
            r: &mut Reader,
            _: &mut Option<Vec<u8>>,
        ) -> Result<Vec<(String, u64)>, CodecError> {
            let n = count(r, "counter count")?;
            let mut counters = Vec::new();
            // More than 1024 leaves bytes unread: the message is refused as trailing.
            for _ in 0..n.min(1024) {
                counters.push((r.str("counter", 128)?.to_string(), r.u64("value")?));
            }
            Ok(counters)
        }
    }
    impl Field for Args {
        type Value = Vec<String>;
        fn put(&self, w: &mut Writer, v: &Vec<String>) {
            w.u32(v.len() as u32);
            for a in v {
                w.str(a);
            }
        }
        fn get(&self, r: &mut Reader, _: &mut Option<Vec<u8>>) -> Result<Vec<String>, CodecError> {
            let n = r.u32("arg count")?;
            if n > 64 {
                return Err(CodecError::TooLong {
                    what: "arg count",
                    len: n as u64,
                    max: 64,
                });
            }
            let mut args = Vec::new();
            for _ in 0..n {
                args.push(r.str("arg", TEXT_MAX)?.to_string());
            }
            Ok(args)
        }
    }
    impl Field for Listing {
        type Value = Vec<ObjectListing>;
        fn put(&self, w: &mut Writer, v: &Vec<ObjectListing>) {
            w.u32(v.len() as u32);
            for l in v {
                w.str(&l.name).u64(l.size_bytes);
                put_ver(w, l.version);
            }
        }
        fn get(
            &self,
            r: &mut Reader,
            _: &mut Option<Vec<u8>>,
        ) -> Result<Vec<ObjectListing>, CodecError> {
            let n = count(r, "listing length")?;
            let mut listing = Vec::with_capacity((n as usize).min(4096));
            for _ in 0..n {
                listing.push(ObjectListing {
                    name: name(r)?,
                    size_bytes: r.u64("size")?,
                    version: get_ver(r)?,
                });
            }
            Ok(listing)
        }
    }
    impl Field for Names {
        type Value = Vec<String>;
        fn put(&self, w: &mut Writer, v: &Vec<String>) {
            w.u32(v.len() as u32);
            for n in v {
                w.str(n);
            }
        }
        fn get(&self, r: &mut Reader, _: &mut Option<Vec<u8>>) -> Result<Vec<String>, CodecError> {
            let n = count(r, self.0)?;
            let mut names = Vec::with_capacity((n as usize).min(4096));
            for _ in 0..n {
                names.push(name(r)?);
            }
            Ok(names)
        }
    }
    impl Field for U64s {
        type Value = Vec<u64>;
        fn put(&self, w: &mut Writer, v: &Vec<u64>) {
            w.u32(v.len() as u32);
            for x in v {
                w.u64(*x);
            }
        }
        fn get(&self, r: &mut Reader, _: &mut Option<Vec<u8>>) -> Result<Vec<u64>, CodecError> {
            let n = r.u32(self.0)?;
            if n as usize > self.1 {
                return Err(CodecError::TooLong {
                    what: self.0,
                    len: n as u64,
                    max: self.1 as u64,
                });
            }
            (0..n).map(|_| r.u64(self.0)).collect()
        }
    }
    impl Field for ScrubEntries {
        type Value = Vec<ScrubEntry>;
        fn put(&self, w: &mut Writer, v: &Vec<ScrubEntry>) {
            w.u32(v.len() as u32);
            for e in v {
                w.str(&e.name);
                put_ver(w, e.version);
                w.u64(e.size_bytes).u32(e.digest).u8(e.ok as u8);
            }
        }
        fn get(
            &self,
            r: &mut Reader,
            _: &mut Option<Vec<u8>>,
        ) -> Result<Vec<ScrubEntry>, CodecError> {
            let n = count(r, "scrub entries")?;
            let mut entries = Vec::with_capacity((n as usize).min(4096));
            for _ in 0..n {
                entries.push(ScrubEntry {
                    name: name(r)?,
                    version: get_ver(r)?,
                    size_bytes: r.u64("size")?,
                    digest: r.u32("digest")?,
                    ok: r.u8("ok")? != 0,
                });
            }
            Ok(entries)
        }
    }
    impl Field for Code {
        type Value = ErrorCode;
        fn put(&self, w: &mut Writer, v: &ErrorCode) {
            w.u16(*v as u16);
        }
        fn get(&self, r: &mut Reader, _: &mut Option<Vec<u8>>) -> Result<ErrorCode, CodecError> {
            let v = r.u16("code")?;
            ErrorCode::from_u16(v).ok_or(CodecError::Invalid {
                what: "error code",
                value: v as u64,
            })
        }
    }
}

/// Declares every message once: its kind tag, log name and fields, each field with the
/// codec it travels with (`wire::*`). From that follow [`Msg`], [`MsgKind`], one struct
/// per message in [`typed`] (for [`crate::request::Request`]), `kind`, `name`,
/// `encode_fields`, `decode_parts`, `bulk` and `take_bulk`. Fields are encoded and
/// decoded in declaration order. Tags are unique: `MsgKind` is a `repr(u16)` enum with
/// them as discriminants, so a duplicate does not compile.
macro_rules! messages {
    ($(
        $(#[$meta:meta])*
        $kind:ident = $tag:literal, $name:literal $({
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $codec:expr ),* $(,)?
        })?;
    )*) => {
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Msg {
            $( $(#[$meta])* $kind $({ $( $(#[$fmeta])* $field: $ty ),* })?, )*
        }

        /// The kind tag of each message (the frame's `kind`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum MsgKind {
            $( $kind = $tag, )*
        }

        impl MsgKind {
            /// Every message kind, in declaration order.
            pub const ALL: &'static [MsgKind] = &[$( MsgKind::$kind ),*];

            pub fn from_u16(v: u16) -> Option<MsgKind> {
                match v {
                    $( $tag => Some(MsgKind::$kind), )*
                    _ => None,
                }
            }

            /// Short name for logs.
            pub fn name(self) -> &'static str {
                match self {
                    $( MsgKind::$kind => $name, )*
                }
            }
        }

        /// One struct per message, with the fields of its [`Msg`] variant: what
        /// [`crate::request::Request`] and [`crate::request::Reply`] are implemented for.
        pub mod typed {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$meta])*
                #[derive(Clone, Debug, PartialEq, Eq)]
                pub struct $kind { $($( $(#[$fmeta])* pub $field: $ty, )*)? }

                impl From<$kind> for Msg {
                    fn from(v: $kind) -> Msg {
                        let $kind { $($( $field ),*)? } = v;
                        Msg::$kind $({ $( $field ),* })?
                    }
                }

                impl TryFrom<Msg> for $kind {
                    /// Any other message, given back.
                    type Error = Msg;
                    fn try_from(m: Msg) -> Result<$kind, Msg> {
                        match m {
                            Msg::$kind $({ $( $field ),* })? => {
                                core::result::Result::Ok($kind { $($( $field ),*)? })
                            }
                            other => Err(other),
                        }
                    }
                }

                impl $kind {
                    pub const KIND: MsgKind = MsgKind::$kind;
                }
            )*
        }

        impl Msg {
            pub fn msg_kind(&self) -> MsgKind {
                match self {
                    $( Msg::$kind { .. } => MsgKind::$kind, )*
                }
            }

            /// The fields section of the body (everything but the bulk bytes).
            pub fn encode_fields(&self) -> Vec<u8> {
                #[allow(unused_imports)]
                use wire::Field as _;
                let mut w = Writer::new();
                match self {
                    $( Msg::$kind $({ $( $field ),* })? => {
                        $($( wire::Field::put(&$codec, &mut w, $field); )*)?
                    } )*
                }
                w.finish()
            }

            /// The bulk bytes of the message (object data), empty for messages without
            /// any. They travel in the body's bulk section so that receivers take them
            /// without copying.
            pub fn bulk(&self) -> &[u8] {
                match self {
                    $( Msg::$kind $({ $( $field ),* })? => {
                        $($(
                            if let Some(b) = wire::Field::bulk(&$codec, $field) {
                                return b;
                            }
                        )*)?
                    } )*
                }
                &[]
            }

            /// Moves the bulk bytes out (leaving an empty vector).
            pub fn take_bulk(&mut self) -> Vec<u8> {
                match self {
                    $( Msg::$kind $({ $( $field ),* })? => {
                        $($(
                            if let Some(b) = wire::Field::bulk_mut(&$codec, $field) {
                                return std::mem::take(b);
                            }
                        )*)?
                    } )*
                }
                Vec::new()
            }

            fn decode_fields(
                kind: MsgKind,
                r: &mut Reader,
                bulk: &mut Option<Vec<u8>>,
            ) -> Result<Msg, CodecError> {
                #[allow(unused_variables)]
                let (r, bulk) = (r, bulk);
                Ok(match kind {
                    $( MsgKind::$kind => Msg::$kind $({ $(
                        $field: wire::Field::get(&$codec, r, bulk)?,
                    )* })?, )*
                })
            }
        }
    };
}

use wire::*;

messages! {
    // ---- monitor ----
    /// A storage daemon starts (or restarts) and asks to be marked up.
    OsdBoot = 1, "osd_boot" {
        osd_id: u32 = U32("osd id"),
        addr: String = Text("addr", 256),
        pid: u32 = U32("pid"),
    };
    /// A daemon is alive; `reports` covers the placement groups it is primary for.
    Heartbeat = 2, "heartbeat" {
        osd_id: u32 = U32("osd id"),
        reports: Vec<PgReport> = Reports,
        /// Named counters of the daemon (e.g. `corruptions_repaired`), shown by `status`.
        counters: Vec<(String, u64)> = Counters,
        /// Where the daemon serves Prometheus metrics (`ip:port`; empty: nowhere).
        metrics_addr: String = Text("metrics addr", 256),
    };
    /// Reply to a heartbeat: the monitor's epoch (the daemon fetches the map if newer).
    HeartbeatAck = 3, "heartbeat_ack" {
        epoch: u64 = U64("epoch"),
    };
    /// Ask for the map if newer than `have_epoch`; with `subscribe`, every later epoch is
    /// pushed on this connection as a `MapUpdate` with request id 0.
    GetMap = 4, "get_map" {
        have_epoch: u64 = U64("have epoch"),
        subscribe: bool = Flag("subscribe"),
    };
    /// A whole encoded cluster map (`spindle_map::ClusterMap::encode`).
    MapUpdate = 5, "map_update" {
        map: Vec<u8> = Bytes("map", MAP_MAX),
    };
    /// An administrative command (`["pool", "create", "name", ...]`).
    Command = 6, "command" {
        args: Vec<String> = Args,
    };
    /// Command result: `output` is JSON on success, a message on failure.
    CommandReply = 7, "command_reply" {
        ok: bool = Flag("ok"),
        output: String = Text("output", MAP_MAX),
    };
    /// Monitor -> monitor: one Raft RPC of the replicated monitor map (`rpc`: 1 append
    /// entries, 2 vote, 3 full snapshot), its `openraft` request encoded by `spindle-mon`.
    MonRaft = 8, "mon_raft" {
        rpc: u32 = U32("raft rpc"),
        body: Vec<u8> = Bytes("raft request", RAFT_MAX),
    };
    /// Answer to `MonRaft`: the `openraft` result, encoded by `spindle-mon`.
    MonRaftReply = 9, "mon_raft_reply" {
        body: Vec<u8> = Bytes("raft reply", RAFT_MAX),
    };

    // ---- client -> primary ----
    ObjRequest = 20, "obj_request" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        name: String = Name,
        op: ObjOp = Op,
        /// The sending client's id (random per client instance; 0 = anonymous): a
        /// primary refuses writes of a client the map lists as fenced.
        client: u64 = U64("client"),
        /// For writes to an image's data object (`img.NAME.` + 16 hex digits): the id of
        /// the image's newest snapshot the writer preserved the object for (0: none). A
        /// primary refuses a write whose guard is not the newest snapshot in its map
        /// (`SnapChanged`). Ignored for other objects and for reads.
        snap_guard: u64 = U64("snap guard"),
    };
    ObjReply = 21, "obj_reply" {
        version: Ver = V,
        size_bytes: u64 = U64("size"),
        data: Vec<u8> = Bulk,
        listing: Vec<ObjectListing> = Listing,
    };

    /// Answer to a shard-local program run (`ExecOp::shards`) on an erasure-coded group:
    /// one result per data shard, in shard order. `rets[i]` is the program's return value
    /// on shard i and its output the next `lens[i]` bytes of `data` (the outputs back to
    /// back); `version` and `listing` as in `ObjReply`.
    ExecParts = 22, "exec_parts" {
        version: Ver = V,
        rets: Vec<u64> = U64s("part count", spindle_types::limits::POOL_SIZE_MAX as usize),
        lens: Vec<u64> = U64s("part count", spindle_types::limits::POOL_SIZE_MAX as usize),
        data: Vec<u8> = Bulk,
        listing: Vec<ObjectListing> = Listing,
    };

    // ---- primary -> replicas (replication and peering) ----
    RepWrite = 30, "rep_write" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        name: String = Name,
        version: Ver = V,
        mutation: Mutation = Mut,
    };
    PgQuery = 31, "pg_query" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
    };
    PgInfo = 32, "pg_info" {
        last_version: Ver = V,
        log_tail: Ver = V,
        log: Vec<LogEntryMsg> = Log,
        /// The copy misses objects its log does not account for (backfill unfinished).
        incomplete: bool = Flag("incomplete"),
    };
    PgList = 33, "pg_list" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
    };
    /// Fetch the full state of an object (reply `ObjState`).
    ObjPull = 34, "obj_pull" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        name: String = Name,
    };
    /// Read a byte range of a shard slot object, which must be at `version` (reply
    /// `ObjReply`; a different version is `Conflict`, a missing object `NotFound`).
    ShardRead = 60, "shard_read" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        name: String = Name,
        version: Ver = V,
        offset: u64 = U64("offset"),
        len: u64 = U64("length"),
    };
    /// Primary -> the daemon holding data shard `part` of `parts` of a group: run a program
    /// on that shard's part of `objects` (`name` the slot object, `version` its version,
    /// `size_bytes` the object's size), reply `ObjReply` as a run does (`size_bytes` the
    /// return value, `data` the output). A slot at another version is `Conflict`; a program
    /// the daemon does not hold (and `elf` empty) `ProgramUnknown`.
    ShardExec = 61, "shard_exec" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        objects: Vec<ObjectListing> = Listing,
        program: Vec<u8> = Bytes("program id", 32),
        jit: bool = Flag("jit"),
        cache: bool = Flag("cache"),
        args: Vec<u8> = Bytes("program args", EXEC_ARGS_MAX),
        part: u32 = U32("part"),
        parts: u32 = U32("parts"),
        stripe_unit: u64 = U64("stripe unit"),
        elf: Vec<u8> = Bulk,
    };
    /// Install the full state of an object (`version == None`: it must not exist).
    ObjState = 35, "obj_state" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        name: String = Name,
        version: Option<Ver> = OptVer,
        data: Vec<u8> = Bulk,
    };
    /// Replace a placement group's log after recovery.
    PgSetLog = 36, "pg_set_log" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        last_version: Ver = V,
        log_tail: Ver = V,
        log: Vec<LogEntryMsg> = Log,
    };
    /// Mark a copy incomplete before recovering it, or complete once it has everything.
    PgMark = 37, "pg_mark" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        incomplete: bool = Flag("incomplete"),
    };
    /// From a daemon holding a copy outside the up set to the primary: is the group clean
    /// (so the stray copy can be removed)? Reply `Ok` if so, `Again` otherwise.
    PgCleanQuery = 38, "pg_clean_query" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
    };
    /// Client -> primary: scrub a placement group now (reply `ScrubResult`).
    ScrubPg = 50, "scrub_pg" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
    };
    ScrubResult = 51, "scrub_result" {
        objects: u64 = U64("objects"),
        /// Bad object copies found (missing, extra, stale, checksum or content mismatch),
        /// those of damaged objects included.
        inconsistent: u64 = U64("inconsistent"),
        /// Bad copies repaired from an intact one.
        repaired: u64 = U64("repaired"),
        /// Objects with no intact copy (fewer than k intact shards on erasure-coded pools),
        /// sorted: they cannot be repaired and reads of them fail.
        damaged: Vec<String> = Names("damaged count"),
    };
    /// Primary -> replica: digests of the named objects (all objects if empty).
    ScrubQuery = 52, "scrub_query" {
        pool: u32 = U32("pool"),
        pg: u32 = U32("pg"),
        names: Vec<String> = Names("name count"),
    };
    ScrubMap = 53, "scrub_map" {
        entries: Vec<ScrubEntry> = ScrubEntries,
    };
    /// Primary -> the other copies of its groups, every 250 ms and on each new map (the
    /// frame carries the sender's epoch): a copy at the same epoch promises not to help a
    /// newer primary take over before the read lease it grants runs out (reply
    /// `PeerPong`; `spindle-osd/src/lease.rs`).
    PeerPing = 70, "peer_ping" {
        osd_id: u32 = U32("osd id"),
    };
    /// Answer to `PeerPing`: the copy's epoch (a lease counts only when it equals the
    /// primary's).
    PeerPong = 71, "peer_pong" {
        epoch: u64 = U64("epoch"),
    };
    // ---- authentication (`crate::auth`) ----
    /// First frame of an authenticated connection: who connects, its nonce, and for a
    /// storage daemon the ticket the monitors issued it (empty towards a monitor).
    AuthHello = 80, "auth_hello" {
        entity: String = Text("entity", crate::auth::ENTITY_BYTES_MAX),
        nonce: Vec<u8> = Bytes("nonce", crate::auth::NONCE_BYTES),
        ticket: Vec<u8> = Bytes("ticket", crate::auth::TICKET_BYTES_MAX),
    };
    /// The server's nonce, and whether the session's payloads are encrypted (the server's
    /// policy; bound into both proofs).
    AuthChallenge = 81, "auth_challenge" {
        nonce: Vec<u8> = Bytes("nonce", crate::auth::NONCE_BYTES),
        encrypt: bool = Flag("encrypt"),
    };
    /// The connecting side's proof of its key over both nonces.
    AuthProof = 82, "auth_proof" {
        proof: Vec<u8> = Bytes("proof", crate::auth::PROOF_BYTES),
    };
    /// The server accepted the proof; its own proof (mutual authentication). Every later
    /// frame in both directions carries a MAC.
    AuthDone = 83, "auth_done" {
        proof: Vec<u8> = Bytes("proof", crate::auth::PROOF_BYTES),
    };
    /// To a monitor, on an authenticated connection: a ticket for the storage daemons
    /// (reply `AuthTicket`).
    AuthTicketGet = 84, "auth_ticket_get";
    /// A ticket (sealed with the service key), its session key sealed with the entity's
    /// key, and for a storage daemon the service key sealed with its key (else empty).
    AuthTicket = 85, "auth_ticket" {
        ticket: Vec<u8> = Bytes("ticket", crate::auth::TICKET_BYTES_MAX),
        session: Vec<u8> = Bytes("session", 256),
        service: Vec<u8> = Bytes("service", 256),
    };
    /// Generic success reply.
    Ok = 40, "ok";
    /// Failure reply to any request. `map` carries the newer map for `StaleMap`.
    Error = 41, "error" {
        code: ErrorCode = Code,
        message: String = Text("message", TEXT_MAX),
        map: Vec<u8> = Bytes("map", MAP_MAX),
    };
}

/// True for the message kinds clients send (charged to a server's client payload budget;
/// everything else is peer traffic between daemons).
pub fn kind_is_client_request(kind: u16) -> bool {
    matches!(
        MsgKind::from_u16(kind),
        Some(
            MsgKind::ObjRequest
                | MsgKind::Command
                | MsgKind::GetMap
                | MsgKind::AuthHello
                | MsgKind::AuthProof
                | MsgKind::AuthTicketGet
        )
    )
}

/// True for the message kinds whose bulk can be an object a daemon writes whole (client
/// requests and replication): the receiver computes their block checksums.
pub fn kind_writes_objects(kind: u16) -> bool {
    matches!(
        MsgKind::from_u16(kind),
        Some(MsgKind::ObjRequest | MsgKind::RepWrite)
    )
}

fn put_ver(w: &mut Writer, v: Ver) {
    w.u64(v.epoch).u64(v.seq);
}
fn get_ver(r: &mut Reader) -> Result<Ver, CodecError> {
    Ok(Ver {
        epoch: r.u64("version epoch")?,
        seq: r.u64("version seq")?,
    })
}
/// Data-bearing variants leave their bytes to the body's bulk section.
fn put_mutation(w: &mut Writer, m: &Mutation) {
    match m {
        Mutation::WriteFull(_) => {
            w.u8(0);
        }
        Mutation::Write { offset, .. } => {
            w.u8(1).u64(*offset);
        }
        Mutation::Truncate { size_bytes } => {
            w.u8(2).u64(*size_bytes);
        }
        Mutation::Delete => {
            w.u8(3);
        }
        Mutation::WriteExtents { extents, .. } => {
            w.u8(6).u32(extents.len() as u32);
            for e in extents {
                w.u64(e.offset).u32(e.len_bytes);
            }
        }
        Mutation::EcWrite {
            object_size,
            shard_offset,
            shard_len,
            full,
            expect,
            ..
        } => {
            w.u8(4)
                .u64(*object_size)
                .u64(*shard_offset)
                .u64(*shard_len)
                .u8(*full as u8);
            put_opt_ver(w, *expect);
        }
        Mutation::EcPatch {
            base,
            object_size,
            shard_size,
            shard_offset,
            delta_base,
            ..
        } => {
            w.u8(5);
            put_opt_ver(w, *base);
            w.u64(*object_size).u64(*shard_size).u64(*shard_offset);
            // u8::MAX: a whole shard (slot positions are small numbers).
            w.u8(delta_base.unwrap_or(u8::MAX));
        }
    }
}
fn put_opt_ver(w: &mut Writer, v: Option<Ver>) {
    match v {
        Some(v) => {
            w.u8(1);
            put_ver(w, v);
        }
        None => {
            w.u8(0);
        }
    }
}
fn get_opt_ver(r: &mut Reader) -> Result<Option<Ver>, CodecError> {
    Ok(match r.u8("version present")? {
        0 => None,
        1 => Some(get_ver(r)?),
        v => {
            return Err(CodecError::Invalid {
                what: "version present",
                value: v as u64,
            })
        }
    })
}
fn get_mutation(r: &mut Reader, bulk: &mut Option<Vec<u8>>) -> Result<Mutation, CodecError> {
    Ok(match r.u8("mutation")? {
        0 => Mutation::WriteFull(take_bulk(bulk)),
        1 => Mutation::Write {
            offset: r.u64("offset")?,
            data: take_bulk(bulk),
        },
        2 => Mutation::Truncate {
            size_bytes: r.u64("size")?,
        },
        3 => Mutation::Delete,
        6 => {
            let n = r.u32("extent count")? as usize;
            if n > spindle_types::limits::WRITE_EXTENTS_MAX {
                return Err(CodecError::TooLong {
                    what: "extent list",
                    len: n as u64,
                    max: spindle_types::limits::WRITE_EXTENTS_MAX as u64,
                });
            }
            let mut extents = Vec::with_capacity(n);
            for _ in 0..n {
                let offset = r.u64("extent offset")?;
                let len_bytes = r.u32("extent length")?;
                extents.push(spindle_types::Extent { offset, len_bytes });
            }
            let data = take_bulk(bulk);
            if let Err(e) = spindle_types::check_extents(&extents, data.len()) {
                tracing::debug!("refused extent list: {e}");
                return Err(CodecError::Invalid {
                    what: "extent list",
                    value: extents.len() as u64,
                });
            }
            Mutation::WriteExtents { extents, data }
        }
        4 => {
            let object_size = r.u64("object size")?;
            let shard_offset = r.u64("shard offset")?;
            let shard_len = r.u64("shard length")?;
            let full = r.u8("full")? != 0;
            let expect = get_opt_ver(r)?;
            Mutation::EcWrite {
                object_size,
                shard_offset,
                shard_len,
                full,
                expect,
                data: take_bulk(bulk),
            }
        }
        5 => {
            let base = get_opt_ver(r)?;
            Mutation::EcPatch {
                base,
                object_size: r.u64("object size")?,
                shard_size: r.u64("shard size")?,
                shard_offset: r.u64("shard offset")?,
                delta_base: match r.u8("delta base")? {
                    u8::MAX => None,
                    p => Some(p),
                },
                data: take_bulk(bulk),
            }
        }
        v => {
            return Err(CodecError::Invalid {
                what: "mutation",
                value: v as u64,
            })
        }
    })
}
fn take_bulk(bulk: &mut Option<Vec<u8>>) -> Vec<u8> {
    bulk.take().unwrap_or_default()
}

fn put_log(w: &mut Writer, log: &[LogEntryMsg]) {
    w.u32(log.len() as u32);
    for e in log {
        put_ver(w, e.version);
        w.str(&e.name).u8(e.delete as u8);
    }
}
fn count(r: &mut Reader, what: &'static str) -> Result<u32, CodecError> {
    let n = r.u32(what)?;
    if n > LIST_MAX {
        return Err(CodecError::TooLong {
            what,
            len: n as u64,
            max: LIST_MAX as u64,
        });
    }
    Ok(n)
}
fn get_log(r: &mut Reader) -> Result<Vec<LogEntryMsg>, CodecError> {
    let n = count(r, "log length")?;
    let mut log = Vec::with_capacity((n as usize).min(4096));
    for _ in 0..n {
        log.push(LogEntryMsg {
            version: get_ver(r)?,
            name: r.str("name", NAME_MAX)?.to_string(),
            delete: r.u8("delete")? != 0,
        });
    }
    Ok(log)
}
fn name(r: &mut Reader) -> Result<String, CodecError> {
    Ok(r.str("object name", NAME_MAX)?.to_string())
}

impl Msg {
    /// The frame kind of this message.
    pub fn kind(&self) -> u16 {
        self.msg_kind() as u16
    }

    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        self.msg_kind().name()
    }

    /// Convenience constructor for error replies.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Msg {
        Msg::Error {
            code,
            message: message.into(),
            map: Vec::new(),
        }
    }

    /// The whole body: `u32 bulk length | bulk | fields`.
    pub fn encode(&self) -> Vec<u8> {
        let bulk = self.bulk();
        let fields = self.encode_fields();
        let mut out = Vec::with_capacity(4 + bulk.len() + fields.len());
        out.extend_from_slice(&(bulk.len() as u32).to_le_bytes());
        out.extend_from_slice(bulk);
        out.extend_from_slice(&fields);
        out
    }

    /// Decodes a whole body (`u32 bulk length | bulk | fields`), copying the bulk bytes.
    pub fn decode(kind: u16, payload: &[u8]) -> Result<Msg, CodecError> {
        let mut r = Reader::new(payload);
        let bulk_len = r.u32("bulk length")? as usize;
        let rest = &payload[4..];
        if bulk_len > rest.len() {
            return Err(CodecError::Truncated {
                what: "bulk data",
                needed: bulk_len - rest.len(),
            });
        }
        Self::decode_parts(kind, rest[..bulk_len].to_vec(), &rest[bulk_len..])
    }

    /// Decodes a body already split into its bulk bytes (taken without copying) and its
    /// fields.
    pub fn decode_parts(kind: u16, bulk: Vec<u8>, fields: &[u8]) -> Result<Msg, CodecError> {
        if bulk.len() > DATA_MAX {
            return Err(CodecError::TooLong {
                what: "bulk data",
                len: bulk.len() as u64,
                max: DATA_MAX as u64,
            });
        }
        let mut bulk = Some(bulk);
        let mut r = Reader::new(fields);
        let kind = MsgKind::from_u16(kind).ok_or(CodecError::Invalid {
            what: "message kind",
            value: kind as u64,
        })?;
        let msg = Self::decode_fields(kind, &mut r, &mut bulk)?;
        let rest = r.remaining();
        if rest != 0 {
            return Err(CodecError::Trailing(rest));
        }
        if bulk.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(CodecError::Invalid {
                what: "bulk data on a message without data",
                value: bulk.as_ref().map_or(0, |b| b.len() as u64),
            });
        }
        Ok(msg)
    }
}
