//! Every limit that more than one crate relies on, with its reason, and compile-time
//! assertions of how the limits relate (TigerBeetle's `constants.zig` is the model).
//! Limits private to one crate stay in that crate (`spindle_store::limits`,
//! `spindle_io::limits`, the connection rules in `spindle_proto::net`).

use crate::ids::PG_NUMBER_LIMIT;

// ---- names ----

/// Longest object name in bytes, in the protocol and in the store: long enough for any
/// S3-style key, short enough that a journal record's name length fits a `u16`.
pub const OBJECT_NAME_BYTES_MAX: usize = 1024;
/// An erasure-coded pool stores every object as shard slot objects whose names add this
/// many bytes to the object's name (`\0` + `d` + position: up to three versions per shard,
/// whole or delta; rollback needs the old one).
pub const EC_SLOT_SUFFIX_BYTES: usize = 3;
/// Longest object name a client may use on an erasure-coded pool.
pub const EC_OBJECT_NAME_BYTES_MAX: usize = OBJECT_NAME_BYTES_MAX - EC_SLOT_SUFFIX_BYTES;
/// Longest pool name (Ceph allows any length; 128 keeps maps and status lines small).
pub const POOL_NAME_BYTES_MAX: usize = 128;
/// Longest image name: an image's objects are named `img.NAME.` + 16 hex digits (data) or
/// `img.NAME.header`.
pub const IMAGE_NAME_BYTES_MAX: usize = 64;
/// Bytes an image adds around its name in its objects' names (`img.` + `.` + 16 digits,
/// and for a snapshot's copy of a data object `@` + 16 more).
pub const IMAGE_OBJECT_NAME_OVERHEAD_BYTES: usize = 4 + 1 + 16 + 1 + 16;
/// Most snapshots of one image at once (live ones; removed ones cost nothing). Each lives
/// in the cluster map; rbd has no fixed limit, but every snapshot adds a copy of each
/// object written after it, and a read of an old snapshot looks through the copies.
pub const IMAGE_SNAPS_MAX: usize = 256;
/// Most snapshots in one cluster map, over all images (each about 100 bytes in the map).
pub const CLUSTER_SNAPS_MAX: usize = 1 << 14;
/// Longest snapshot name (`[A-Za-z0-9._-]`, like image names).
pub const SNAP_NAME_BYTES_MAX: usize = 64;
/// Most clones of one snapshot (its children are listed in the cluster map, so that
/// unprotecting it can refuse while any exists).
pub const SNAP_CHILDREN_MAX: usize = 1024;
/// Most clones in one cluster map, over all snapshots (each about 80 bytes in the map).
pub const CLUSTER_CLONES_MAX: usize = 1 << 14;
/// Longest chain of clones (a clone of a clone of ...): each level is one more image a
/// read of an unwritten range may go through, and one more header to open.
pub const CLONE_DEPTH_MAX: usize = 16;

// ---- sizes ----

/// Largest object a client may create: an object travels whole in one message (reads,
/// whole writes, recovery), so it bounds the memory one operation pins. Images of any size
/// are striped over objects of at most this size.
pub const OBJECT_BYTES_MAX: u64 = 32 << 20;
/// Largest data payload of one message: a whole object, or the encoded shards of one
/// erasure-coded write of up to `OBJECT_BYTES_MAX * 3 / 2` bytes (k + m <= 1.5 k, as
/// 2+1 and 4+2; wider ratios write large objects in parts).
pub const MESSAGE_DATA_BYTES_MAX: usize = 48 << 20;
/// Largest non-data part of a message: the object name, the block checksums of a maximal
/// payload (4 bytes per 4 KiB), the extent list of a multi-extent write (12 bytes per
/// extent), and the fixed fields with room to spare.
pub const MESSAGE_OVERHEAD_BYTES_MAX: usize = OBJECT_NAME_BYTES_MAX
    + MESSAGE_DATA_BYTES_MAX / CRC_BLOCK_BYTES * 4
    + WRITE_EXTENTS_MAX * 12
    + EXEC_ARGS_BYTES_MAX
    + EXEC_OBJECTS_MAX * (OBJECT_NAME_BYTES_MAX + 4)
    + (64 << 10);
/// Most extents in one multi-extent write (`Mutation::WriteExtents`): a write log
/// publishing 512-byte sector writes into a 4 MiB object never has more separate
/// (non-touching) extents in it than 4 MiB / 512 / 2 = 4096. Bounds the journal record's
/// header and the work one request asks of a daemon.
pub const WRITE_EXTENTS_MAX: usize = 4096;
/// Largest frame payload a receiver accepts (checked before anything is allocated).
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 << 20;
/// Largest object the local store accepts (offsets are u64 in its format; 1 TiB keeps
/// every size computation far from overflow). The cluster stays below `OBJECT_BYTES_MAX`;
/// the store's own limit is for tools and tests that use it directly.
pub const STORE_OBJECT_BYTES_MAX: u64 = 1 << 40;
/// Largest data payload of one store mutation (a journal record is built in memory).
pub const STORE_MUTATION_BYTES_MAX: usize = 1 << 30;
/// Bytes covered by one data checksum, on disk and in bulk messages: the page size, so a
/// 4 KiB random read checks exactly one CRC.
pub const CRC_BLOCK_BYTES: usize = spindle_crc::CRC_BLOCK_BYTES;

// ---- pushdown programs ----

/// Largest argument block of one program run: arguments are parameters (predicates,
/// dictionaries of a few values), not data; data is in objects.
pub const EXEC_ARGS_BYTES_MAX: usize = 1 << 20;
/// Most objects one program run sees (the object named and others of its placement group:
/// the columns of one row group). Each is mapped into the program's memory as its own
/// region: 16 keeps the mapping table small.
pub const EXEC_OBJECTS_MAX: usize = 16;
/// Largest program object file: 64 Ki instructions (8 bytes each) and 4 MiB of constants
/// (`spindle-prog`'s own limits) with room for the ELF's headers and symbols.
pub const PROGRAM_BYTES_MAX: usize = 8 << 20;
/// Longest one program run may last on a daemon. A run is bounded by its instruction budget
/// (2·10⁹ by default); this only catches what that cannot: a run paused by the daemon's CPU
/// budget for programs (25 % of a CPU by default, so 4x its CPU time) in the interpreter
/// (about 10x slower than the JIT) may take a minute or more, and a run that goes on for
/// minutes is allowed; one that goes on for ten is stopped.
pub const EXEC_WALL_MS: u64 = 600_000;
/// How long a client waits for a program run's answer (whatever its operation timeout):
/// longer than [`EXEC_WALL_MS`], so the daemon's answer (the result, or the limit that
/// stopped the run) always comes first.
pub const EXEC_REPLY_TIMEOUT_MS: u64 = EXEC_WALL_MS + 60_000;

// ---- placement ----

/// Largest number of placement groups in one pool (Ceph's practical maximum per pool).
pub const PG_COUNT_MAX: u32 = 1 << 16;
/// Largest replication factor, and largest k + m of an erasure-coded pool.
pub const POOL_SIZE_MAX: u32 = 16;
/// Most chunks (k + m) the erasure-coding kernel handles (`spindle_ec::MAX_TOTAL_CHUNKS`;
/// the kernel crate cannot depend on this one, `spindle-map` asserts they agree).
pub const EC_CHUNKS_MAX: usize = 64;
/// Largest stripe unit of an erasure-coded pool (one shard's part of a stripe).
pub const STRIPE_UNIT_BYTES_MAX: u32 = 1 << 20;

// ---- image locks and fencing ----

/// Largest encoded cluster map (a frame carries it whole; the monitor stores it per epoch).
pub const CLUSTER_MAP_BYTES_MAX: usize = 32 << 20;
/// Most images locked at once in one cluster: each lock lives in the map, which every
/// daemon and client holds whole.
pub const IMAGE_LOCKS_MAX: usize = 1 << 15;
/// Longest description of a lock holder (host, process id, program).
pub const IMAGE_LOCK_HOLDER_BYTES_MAX: usize = 256;
/// Most fenced clients in the map; the oldest entries go first beyond it.
pub const FENCED_CLIENTS_MAX: usize = 1 << 12;
/// How long a fenced client stays fenced (Ceph keeps blocklist entries one hour). A
/// client id is random per client instance and never reused, so an entry only matters
/// while the fenced process may still be alive and stalled; a day covers any pause a
/// process survives in practice.
pub const FENCE_KEEP_SECS: u64 = 24 * 3600;
/// How long an image lock's lease lasts without a renewal. The holder renews every third
/// of it, so two lost renewals in a row do not lose the lock.
pub const IMAGE_LOCK_LEASE_MS_DEFAULT: u64 = 15_000;

/// The naming rule of images and snapshots: 1..=`max_bytes` bytes of `[A-Za-z0-9._-]`
/// (so object names built from them are unambiguous: no `@`, no `/`, no NUL).
pub fn is_simple_name(name: &str, max_bytes: usize) -> bool {
    !name.is_empty()
        && name.len() <= max_bytes
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

// ---- how they relate ----

// Every lock and every fenced client fit the map with room left for daemons and pools
// (8 fixed u64/u32 fields per lock, 16 bytes per fenced client).
const _: () = assert!(
    IMAGE_LOCKS_MAX * (IMAGE_NAME_BYTES_MAX + IMAGE_LOCK_HOLDER_BYTES_MAX + 4 * 8)
        + FENCED_CLIENTS_MAX * 16
        <= CLUSTER_MAP_BYTES_MAX / 2
);

// Every snapshot fits the map too, beside the locks (name + 4 u64 fields + the image key).
const _: () = assert!(
    IMAGE_LOCKS_MAX * (IMAGE_NAME_BYTES_MAX + IMAGE_LOCK_HOLDER_BYTES_MAX + 4 * 8)
        + FENCED_CLIENTS_MAX * 16
        + CLUSTER_SNAPS_MAX * (SNAP_NAME_BYTES_MAX + IMAGE_NAME_BYTES_MAX + 6 * 8)
        + CLUSTER_CLONES_MAX * (IMAGE_NAME_BYTES_MAX + 2 * 8)
        <= CLUSTER_MAP_BYTES_MAX / 2
);
const _: () = assert!(IMAGE_SNAPS_MAX <= CLUSTER_SNAPS_MAX);
const _: () = assert!(SNAP_CHILDREN_MAX <= CLUSTER_CLONES_MAX);

// One name limit: an image object's name, and an EC slot object's name, fit it.
const _: () =
    assert!(IMAGE_NAME_BYTES_MAX + IMAGE_OBJECT_NAME_OVERHEAD_BYTES <= EC_OBJECT_NAME_BYTES_MAX);
const _: () = assert!(OBJECT_NAME_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(POOL_NAME_BYTES_MAX <= OBJECT_NAME_BYTES_MAX);
// A whole object, and the shards of a whole object at k + m = 1.5 k, fit one message.
const _: () = assert!(OBJECT_BYTES_MAX as usize <= MESSAGE_DATA_BYTES_MAX);
const _: () = assert!(OBJECT_BYTES_MAX as usize * 3 / 2 <= MESSAGE_DATA_BYTES_MAX);
// A program travels in one message.
const _: () = assert!(PROGRAM_BYTES_MAX <= MESSAGE_DATA_BYTES_MAX);
const _: () = assert!(EXEC_REPLY_TIMEOUT_MS > EXEC_WALL_MS);
// A message fits a frame.
const _: () =
    assert!(MESSAGE_DATA_BYTES_MAX + MESSAGE_OVERHEAD_BYTES_MAX <= FRAME_PAYLOAD_BYTES_MAX);
const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX <= u32::MAX as usize);
// What the cluster sends, the store takes in one mutation.
const _: () = assert!(OBJECT_BYTES_MAX <= STORE_OBJECT_BYTES_MAX);
const _: () = assert!(MESSAGE_DATA_BYTES_MAX <= STORE_MUTATION_BYTES_MAX);
// Checksum blocks divide objects and stripe units evenly.
const _: () = assert!(CRC_BLOCK_BYTES.is_power_of_two());
const _: () = assert!((OBJECT_BYTES_MAX as usize).is_multiple_of(CRC_BLOCK_BYTES));
// Group numbers leave the high byte for the shard position; positions fit a u8.
const _: () = assert!(PG_COUNT_MAX <= PG_NUMBER_LIMIT);
const _: () = assert!(POOL_SIZE_MAX as usize <= EC_CHUNKS_MAX);
const _: () = assert!(POOL_SIZE_MAX < u8::MAX as u32);
const _: () = assert!(STRIPE_UNIT_BYTES_MAX.is_power_of_two());
