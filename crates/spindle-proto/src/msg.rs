//! Message bodies of the cluster protocol (monitor, storage daemons, clients).
//!
//! One [`Msg`] travels in one frame; the frame's `kind` is [`Msg::kind`] and the body is
//! encoded with [`crate::codec`]. Requests and replies are matched by the frame's
//! `request_id`; every frame carries the sender's map epoch (see `docs/cluster.md`).
//! Decoding validates every length and enum tag: a bad body is a [`CodecError`], which
//! the receiver answers with an error reply (or closes the connection), never a panic.

use crate::codec::{CodecError, Reader, Writer};

/// Longest object name (`spindle_types::limits::OBJECT_NAME_BYTES_MAX`).
pub const NAME_MAX: usize = spindle_types::limits::OBJECT_NAME_BYTES_MAX;
/// Largest data payload in one message (`spindle_types::limits::MESSAGE_DATA_BYTES_MAX`).
pub const DATA_MAX: usize = spindle_types::limits::MESSAGE_DATA_BYTES_MAX;
const LIST_MAX: u32 = 1 << 22;
const MAP_MAX: usize = 32 << 20;
const TEXT_MAX: usize = 1 << 20;

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
    /// (the other slot's content at version `base`, or nothing) resized to `shard_size`,
    /// with `data` at `shard_offset`, followed by the shard trailer for `object_size`.
    EcPatch {
        base: Option<Ver>,
        object_size: u64,
        shard_size: u64,
        shard_offset: u64,
        data: Vec<u8>,
    },
}

/// What a client asks of an object (or, for `List`, of a placement group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjOp {
    Mutate(Mutation),
    Read { offset: u64, len: u64 },
    Stat,
    List,
}

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    // ---- monitor ----
    /// A storage daemon starts (or restarts) and asks to be marked up.
    OsdBoot {
        osd_id: u32,
        addr: String,
        pid: u32,
    },
    /// A daemon is alive; `reports` covers the placement groups it is primary for.
    Heartbeat {
        osd_id: u32,
        reports: Vec<PgReport>,
        /// Named counters of the daemon (e.g. `corruptions_repaired`), shown by `status`.
        counters: Vec<(String, u64)>,
    },
    /// Reply to a heartbeat: the monitor's epoch (the daemon fetches the map if newer).
    HeartbeatAck {
        epoch: u64,
    },
    /// Ask for the map if newer than `have_epoch`; with `subscribe`, every later epoch is
    /// pushed on this connection as a `MapUpdate` with request id 0.
    GetMap {
        have_epoch: u64,
        subscribe: bool,
    },
    /// A whole encoded cluster map (`spindle_map::ClusterMap::encode`).
    MapUpdate {
        map: Vec<u8>,
    },
    /// An administrative command (`["pool", "create", "name", ...]`).
    Command {
        args: Vec<String>,
    },
    /// Command result: `output` is JSON on success, a message on failure.
    CommandReply {
        ok: bool,
        output: String,
    },

    // ---- client -> primary ----
    ObjRequest {
        pool: u32,
        pg: u32,
        name: String,
        op: ObjOp,
    },
    ObjReply {
        version: Ver,
        size_bytes: u64,
        data: Vec<u8>,
        listing: Vec<ObjectListing>,
    },

    // ---- primary -> replicas (replication and peering) ----
    RepWrite {
        pool: u32,
        pg: u32,
        name: String,
        version: Ver,
        mutation: Mutation,
    },
    PgQuery {
        pool: u32,
        pg: u32,
    },
    PgInfo {
        last_version: Ver,
        log_tail: Ver,
        log: Vec<LogEntryMsg>,
        /// The copy misses objects its log does not account for (backfill unfinished).
        incomplete: bool,
    },
    PgList {
        pool: u32,
        pg: u32,
    },
    /// Fetch the full state of an object (reply `ObjState`).
    ObjPull {
        pool: u32,
        pg: u32,
        name: String,
    },
    /// Read a byte range of a shard slot object, which must be at `version` (reply
    /// `ObjReply`; a different version is `Conflict`, a missing object `NotFound`).
    ShardRead {
        pool: u32,
        pg: u32,
        name: String,
        version: Ver,
        offset: u64,
        len: u64,
    },
    /// Install the full state of an object (`version == None`: it must not exist).
    ObjState {
        pool: u32,
        pg: u32,
        name: String,
        version: Option<Ver>,
        data: Vec<u8>,
    },
    /// Replace a placement group's log after recovery.
    PgSetLog {
        pool: u32,
        pg: u32,
        last_version: Ver,
        log_tail: Ver,
        log: Vec<LogEntryMsg>,
    },
    /// Mark a copy incomplete before recovering it, or complete once it has everything.
    PgMark {
        pool: u32,
        pg: u32,
        incomplete: bool,
    },
    /// From a daemon holding a copy outside the up set to the primary: is the group clean
    /// (so the stray copy can be removed)? Reply `Ok` if so, `Again` otherwise.
    PgCleanQuery {
        pool: u32,
        pg: u32,
    },
    /// Client -> primary: scrub a placement group now (reply `ScrubResult`).
    ScrubPg {
        pool: u32,
        pg: u32,
    },
    ScrubResult {
        objects: u64,
        /// Bad object copies found (missing, extra, stale, checksum or content mismatch),
        /// those of damaged objects included.
        inconsistent: u64,
        /// Bad copies repaired from an intact one.
        repaired: u64,
        /// Objects with no intact copy (fewer than k intact shards on erasure-coded pools),
        /// sorted: they cannot be repaired and reads of them fail.
        damaged: Vec<String>,
    },
    /// Primary -> replica: digests of the named objects (all objects if empty).
    ScrubQuery {
        pool: u32,
        pg: u32,
        names: Vec<String>,
    },
    ScrubMap {
        entries: Vec<ScrubEntry>,
    },
    /// Generic success reply.
    Ok,

    /// Failure reply to any request. `map` carries the newer map for `StaleMap`.
    Error {
        code: ErrorCode,
        message: String,
        map: Vec<u8>,
    },
}

/// True for the message kinds clients send (charged to a server's client payload budget;
/// everything else is peer traffic between daemons).
pub fn kind_is_client_request(kind: u16) -> bool {
    kind == tag::OBJ_REQUEST || kind == tag::COMMAND || kind == tag::GET_MAP
}

/// True for the message kinds whose bulk can be an object a daemon writes whole (client
/// requests and replication): the receiver computes their block checksums.
pub fn kind_writes_objects(kind: u16) -> bool {
    kind == tag::OBJ_REQUEST || kind == tag::REP_WRITE
}

mod tag {
    pub const OSD_BOOT: u16 = 1;
    pub const HEARTBEAT: u16 = 2;
    pub const HEARTBEAT_ACK: u16 = 3;
    pub const GET_MAP: u16 = 4;
    pub const MAP_UPDATE: u16 = 5;
    pub const COMMAND: u16 = 6;
    pub const COMMAND_REPLY: u16 = 7;
    pub const OBJ_REQUEST: u16 = 20;
    pub const OBJ_REPLY: u16 = 21;
    pub const REP_WRITE: u16 = 30;
    pub const PG_QUERY: u16 = 31;
    pub const PG_INFO: u16 = 32;
    pub const PG_LIST: u16 = 33;
    pub const OBJ_PULL: u16 = 34;
    pub const OBJ_STATE: u16 = 35;
    pub const PG_SET_LOG: u16 = 36;
    pub const PG_MARK: u16 = 37;
    pub const PG_CLEAN_QUERY: u16 = 38;
    pub const SCRUB_PG: u16 = 50;
    pub const SCRUB_RESULT: u16 = 51;
    pub const SCRUB_QUERY: u16 = 52;
    pub const SCRUB_MAP: u16 = 53;
    pub const SHARD_READ: u16 = 60;
    pub const OK: u16 = 40;
    pub const ERROR: u16 = 41;
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
            ..
        } => {
            w.u8(5);
            put_opt_ver(w, *base);
            w.u64(*object_size).u64(*shard_size).u64(*shard_offset);
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
    pub fn kind(&self) -> u16 {
        use tag::*;
        match self {
            Msg::OsdBoot { .. } => OSD_BOOT,
            Msg::Heartbeat { .. } => HEARTBEAT,
            Msg::HeartbeatAck { .. } => HEARTBEAT_ACK,
            Msg::GetMap { .. } => GET_MAP,
            Msg::MapUpdate { .. } => MAP_UPDATE,
            Msg::Command { .. } => COMMAND,
            Msg::CommandReply { .. } => COMMAND_REPLY,
            Msg::ObjRequest { .. } => OBJ_REQUEST,
            Msg::ObjReply { .. } => OBJ_REPLY,
            Msg::RepWrite { .. } => REP_WRITE,
            Msg::PgQuery { .. } => PG_QUERY,
            Msg::PgInfo { .. } => PG_INFO,
            Msg::PgList { .. } => PG_LIST,
            Msg::ObjPull { .. } => OBJ_PULL,
            Msg::ShardRead { .. } => SHARD_READ,
            Msg::ObjState { .. } => OBJ_STATE,
            Msg::PgSetLog { .. } => PG_SET_LOG,
            Msg::PgMark { .. } => PG_MARK,
            Msg::PgCleanQuery { .. } => PG_CLEAN_QUERY,
            Msg::ScrubPg { .. } => SCRUB_PG,
            Msg::ScrubResult { .. } => SCRUB_RESULT,
            Msg::ScrubQuery { .. } => SCRUB_QUERY,
            Msg::ScrubMap { .. } => SCRUB_MAP,
            Msg::Ok => OK,
            Msg::Error { .. } => ERROR,
        }
    }

    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::OsdBoot { .. } => "osd_boot",
            Msg::Heartbeat { .. } => "heartbeat",
            Msg::HeartbeatAck { .. } => "heartbeat_ack",
            Msg::GetMap { .. } => "get_map",
            Msg::MapUpdate { .. } => "map_update",
            Msg::Command { .. } => "command",
            Msg::CommandReply { .. } => "command_reply",
            Msg::ObjRequest { .. } => "obj_request",
            Msg::ObjReply { .. } => "obj_reply",
            Msg::RepWrite { .. } => "rep_write",
            Msg::PgQuery { .. } => "pg_query",
            Msg::PgInfo { .. } => "pg_info",
            Msg::PgList { .. } => "pg_list",
            Msg::ObjPull { .. } => "obj_pull",
            Msg::ShardRead { .. } => "shard_read",
            Msg::ObjState { .. } => "obj_state",
            Msg::PgSetLog { .. } => "pg_set_log",
            Msg::PgMark { .. } => "pg_mark",
            Msg::PgCleanQuery { .. } => "pg_clean_query",
            Msg::ScrubPg { .. } => "scrub_pg",
            Msg::ScrubResult { .. } => "scrub_result",
            Msg::ScrubQuery { .. } => "scrub_query",
            Msg::ScrubMap { .. } => "scrub_map",
            Msg::Ok => "ok",
            Msg::Error { .. } => "error",
        }
    }

    /// Convenience constructor for error replies.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Msg {
        Msg::Error {
            code,
            message: message.into(),
            map: Vec::new(),
        }
    }

    /// The bulk bytes of the message (object data), empty for messages without any. They
    /// travel in the body's bulk section so that receivers take them without copying.
    pub fn bulk(&self) -> &[u8] {
        match self {
            Msg::ObjRequest {
                op:
                    ObjOp::Mutate(
                        Mutation::WriteFull(d)
                        | Mutation::Write { data: d, .. }
                        | Mutation::EcWrite { data: d, .. }
                        | Mutation::EcPatch { data: d, .. },
                    ),
                ..
            }
            | Msg::RepWrite {
                mutation:
                    Mutation::WriteFull(d)
                    | Mutation::Write { data: d, .. }
                    | Mutation::EcWrite { data: d, .. }
                    | Mutation::EcPatch { data: d, .. },
                ..
            }
            | Msg::ObjReply { data: d, .. }
            | Msg::ObjState { data: d, .. } => d,
            _ => &[],
        }
    }

    /// Moves the bulk bytes out (leaving an empty vector).
    pub fn take_bulk(&mut self) -> Vec<u8> {
        match self {
            Msg::ObjRequest {
                op:
                    ObjOp::Mutate(
                        Mutation::WriteFull(d)
                        | Mutation::Write { data: d, .. }
                        | Mutation::EcWrite { data: d, .. }
                        | Mutation::EcPatch { data: d, .. },
                    ),
                ..
            }
            | Msg::RepWrite {
                mutation:
                    Mutation::WriteFull(d)
                    | Mutation::Write { data: d, .. }
                    | Mutation::EcWrite { data: d, .. }
                    | Mutation::EcPatch { data: d, .. },
                ..
            }
            | Msg::ObjReply { data: d, .. }
            | Msg::ObjState { data: d, .. } => std::mem::take(d),
            _ => Vec::new(),
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

    /// The fields section of the body (everything but the bulk bytes).
    pub fn encode_fields(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Msg::OsdBoot { osd_id, addr, pid } => {
                w.u32(*osd_id).str(addr).u32(*pid);
            }
            Msg::Heartbeat {
                osd_id,
                reports,
                counters,
            } => {
                w.u32(*osd_id).u32(reports.len() as u32);
                for p in reports {
                    w.u32(p.pool)
                        .u32(p.pg)
                        .u8(p.state as u8)
                        .u64(p.objects)
                        .u64(p.missing_objects)
                        .u64(p.missing_bytes)
                        .u64(p.damaged_objects);
                }
                w.u32(counters.len() as u32);
                for (k, v) in counters {
                    w.str(k).u64(*v);
                }
            }
            Msg::HeartbeatAck { epoch } => {
                w.u64(*epoch);
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                w.u64(*have_epoch).u8(*subscribe as u8);
            }
            Msg::MapUpdate { map } => {
                w.bytes(map);
            }
            Msg::Command { args } => {
                w.u32(args.len() as u32);
                for a in args {
                    w.str(a);
                }
            }
            Msg::CommandReply { ok, output } => {
                w.u8(*ok as u8).str(output);
            }
            Msg::ObjRequest { pool, pg, name, op } => {
                w.u32(*pool).u32(*pg).str(name);
                match op {
                    ObjOp::Mutate(m) => {
                        w.u8(0);
                        put_mutation(&mut w, m);
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
                }
            }
            Msg::ObjReply {
                version,
                size_bytes,
                data,
                listing,
            } => {
                let _ = data; // bulk
                put_ver(&mut w, *version);
                w.u64(*size_bytes).u32(listing.len() as u32);
                for l in listing {
                    w.str(&l.name).u64(l.size_bytes);
                    put_ver(&mut w, l.version);
                }
            }
            Msg::RepWrite {
                pool,
                pg,
                name,
                version,
                mutation,
            } => {
                w.u32(*pool).u32(*pg).str(name);
                put_ver(&mut w, *version);
                put_mutation(&mut w, mutation);
            }
            Msg::PgQuery { pool, pg }
            | Msg::PgList { pool, pg }
            | Msg::PgCleanQuery { pool, pg }
            | Msg::ScrubPg { pool, pg } => {
                w.u32(*pool).u32(*pg);
            }
            Msg::PgInfo {
                last_version,
                log_tail,
                log,
                incomplete,
            } => {
                put_ver(&mut w, *last_version);
                put_ver(&mut w, *log_tail);
                put_log(&mut w, log);
                w.u8(*incomplete as u8);
            }
            Msg::PgMark {
                pool,
                pg,
                incomplete,
            } => {
                w.u32(*pool).u32(*pg).u8(*incomplete as u8);
            }
            Msg::ScrubResult {
                objects,
                inconsistent,
                repaired,
                damaged,
            } => {
                w.u64(*objects)
                    .u64(*inconsistent)
                    .u64(*repaired)
                    .u32(damaged.len() as u32);
                for n in damaged {
                    w.str(n);
                }
            }
            Msg::ScrubQuery { pool, pg, names } => {
                w.u32(*pool).u32(*pg).u32(names.len() as u32);
                for n in names {
                    w.str(n);
                }
            }
            Msg::ScrubMap { entries } => {
                w.u32(entries.len() as u32);
                for e in entries {
                    w.str(&e.name);
                    put_ver(&mut w, e.version);
                    w.u64(e.size_bytes).u32(e.digest).u8(e.ok as u8);
                }
            }
            Msg::ObjPull { pool, pg, name } => {
                w.u32(*pool).u32(*pg).str(name);
            }
            Msg::ShardRead {
                pool,
                pg,
                name,
                version,
                offset,
                len,
            } => {
                w.u32(*pool).u32(*pg).str(name);
                put_ver(&mut w, *version);
                w.u64(*offset).u64(*len);
            }
            Msg::ObjState {
                pool,
                pg,
                name,
                version,
                data,
            } => {
                w.u32(*pool).u32(*pg).str(name);
                let _ = data; // bulk
                match version {
                    Some(v) => {
                        w.u8(1);
                        put_ver(&mut w, *v);
                    }
                    None => {
                        w.u8(0);
                    }
                }
            }
            Msg::PgSetLog {
                pool,
                pg,
                last_version,
                log_tail,
                log,
            } => {
                w.u32(*pool).u32(*pg);
                put_ver(&mut w, *last_version);
                put_ver(&mut w, *log_tail);
                put_log(&mut w, log);
            }
            Msg::Ok => {}
            Msg::Error { code, message, map } => {
                w.u16(*code as u16).str(message).bytes(map);
            }
        }
        w.finish()
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
        use tag::*;
        if bulk.len() > DATA_MAX {
            return Err(CodecError::TooLong {
                what: "bulk data",
                len: bulk.len() as u64,
                max: DATA_MAX as u64,
            });
        }
        let mut bulk = Some(bulk);
        let bulk = &mut bulk;
        let mut r = Reader::new(fields);
        let r = &mut r;
        let msg = match kind {
            OSD_BOOT => Msg::OsdBoot {
                osd_id: r.u32("osd id")?,
                addr: r.str("addr", 256)?.to_string(),
                pid: r.u32("pid")?,
            },
            HEARTBEAT => {
                let osd_id = r.u32("osd id")?;
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
                let n = count(r, "counter count")?;
                let mut counters = Vec::new();
                for _ in 0..n.min(1024) {
                    counters.push((r.str("counter", 128)?.to_string(), r.u64("value")?));
                }
                Msg::Heartbeat {
                    osd_id,
                    reports,
                    counters,
                }
            }
            HEARTBEAT_ACK => Msg::HeartbeatAck {
                epoch: r.u64("epoch")?,
            },
            GET_MAP => Msg::GetMap {
                have_epoch: r.u64("have epoch")?,
                subscribe: r.u8("subscribe")? != 0,
            },
            MAP_UPDATE => Msg::MapUpdate {
                map: r.bytes("map", MAP_MAX)?.to_vec(),
            },
            COMMAND => {
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
                Msg::Command { args }
            }
            COMMAND_REPLY => Msg::CommandReply {
                ok: r.u8("ok")? != 0,
                output: r.str("output", MAP_MAX)?.to_string(),
            },
            OBJ_REQUEST => {
                let pool = r.u32("pool")?;
                let pg = r.u32("pg")?;
                let name = name(r)?;
                let op = match r.u8("op")? {
                    0 => ObjOp::Mutate(get_mutation(r, bulk)?),
                    1 => ObjOp::Read {
                        offset: r.u64("offset")?,
                        len: r.u64("len")?,
                    },
                    2 => ObjOp::Stat,
                    3 => ObjOp::List,
                    v => {
                        return Err(CodecError::Invalid {
                            what: "op",
                            value: v as u64,
                        })
                    }
                };
                Msg::ObjRequest { pool, pg, name, op }
            }
            OBJ_REPLY => {
                let version = get_ver(r)?;
                let size_bytes = r.u64("size")?;
                let data = take_bulk(bulk);
                let n = count(r, "listing length")?;
                let mut listing = Vec::with_capacity((n as usize).min(4096));
                for _ in 0..n {
                    listing.push(ObjectListing {
                        name: name(r)?,
                        size_bytes: r.u64("size")?,
                        version: get_ver(r)?,
                    });
                }
                Msg::ObjReply {
                    version,
                    size_bytes,
                    data,
                    listing,
                }
            }
            REP_WRITE => Msg::RepWrite {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
                name: name(r)?,
                version: get_ver(r)?,
                mutation: get_mutation(r, bulk)?,
            },
            PG_QUERY => Msg::PgQuery {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
            },
            PG_LIST => Msg::PgList {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
            },
            PG_INFO => Msg::PgInfo {
                last_version: get_ver(r)?,
                log_tail: get_ver(r)?,
                log: get_log(r)?,
                incomplete: r.u8("incomplete")? != 0,
            },
            PG_MARK => Msg::PgMark {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
                incomplete: r.u8("incomplete")? != 0,
            },
            PG_CLEAN_QUERY => Msg::PgCleanQuery {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
            },
            SCRUB_PG => Msg::ScrubPg {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
            },
            SCRUB_RESULT => {
                let objects = r.u64("objects")?;
                let inconsistent = r.u64("inconsistent")?;
                let repaired = r.u64("repaired")?;
                let n = count(r, "damaged count")?;
                let mut damaged = Vec::with_capacity((n as usize).min(4096));
                for _ in 0..n {
                    damaged.push(name(r)?);
                }
                Msg::ScrubResult {
                    objects,
                    inconsistent,
                    repaired,
                    damaged,
                }
            }
            SCRUB_QUERY => {
                let pool = r.u32("pool")?;
                let pg = r.u32("pg")?;
                let n = count(r, "name count")?;
                let mut names = Vec::with_capacity((n as usize).min(4096));
                for _ in 0..n {
                    names.push(name(r)?);
                }
                Msg::ScrubQuery { pool, pg, names }
            }
            SCRUB_MAP => {
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
                Msg::ScrubMap { entries }
            }
            OBJ_PULL => Msg::ObjPull {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
                name: name(r)?,
            },
            SHARD_READ => Msg::ShardRead {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
                name: name(r)?,
                version: get_ver(r)?,
                offset: r.u64("offset")?,
                len: r.u64("length")?,
            },
            OBJ_STATE => {
                let pool = r.u32("pool")?;
                let pg = r.u32("pg")?;
                let name = name(r)?;
                let version = match r.u8("exists")? {
                    0 => None,
                    _ => Some(get_ver(r)?),
                };
                Msg::ObjState {
                    pool,
                    pg,
                    name,
                    version,
                    data: take_bulk(bulk),
                }
            }
            PG_SET_LOG => Msg::PgSetLog {
                pool: r.u32("pool")?,
                pg: r.u32("pg")?,
                last_version: get_ver(r)?,
                log_tail: get_ver(r)?,
                log: get_log(r)?,
            },
            OK => Msg::Ok,
            ERROR => Msg::Error {
                code: {
                    let v = r.u16("code")?;
                    ErrorCode::from_u16(v).ok_or(CodecError::Invalid {
                        what: "error code",
                        value: v as u64,
                    })?
                },
                message: r.str("message", TEXT_MAX)?.to_string(),
                map: r.bytes("map", MAP_MAX)?.to_vec(),
            },
            other => {
                return Err(CodecError::Invalid {
                    what: "message kind",
                    value: other as u64,
                })
            }
        };
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
