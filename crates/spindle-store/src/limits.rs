//! Every bound of the store in one place. The limits it shares with other crates come
//! from `spindle_types::limits`.

/// Bytes covered by one data CRC: the cluster's checksum block (callers hand in block CRCs
/// computed with `spindle_types::crc::crc32c_blocks`, `Store::apply_with_block_crcs`).
pub const BLOCK_BYTES: u64 = spindle_types::limits::CRC_BLOCK_BYTES as u64;
/// Longest object name in bytes (the protocol's limit: one constant).
pub const NAME_BYTES_MAX: usize = spindle_types::limits::OBJECT_NAME_BYTES_MAX;
/// Largest object size (offset + length of any write, truncate size).
pub const OBJECT_BYTES_MAX: u64 = spindle_types::limits::STORE_OBJECT_BYTES_MAX;
/// Largest data payload of one mutation (journal records must fit in memory).
pub const MUTATION_BYTES_MAX: usize = spindle_types::limits::STORE_MUTATION_BYTES_MAX;
/// A journal batch stops taking transactions beyond this many bytes (a single larger
/// transaction still forms its own batch).
pub const BATCH_BYTES_MAX: usize = 64 << 20;
/// Transactions per journal batch.
pub const BATCH_TXNS_MAX: usize = 8192;
/// Alignment (and padding unit) of journal batches: O_DIRECT block size.
pub const JOURNAL_ALIGN: usize = 4096;
/// The journal is pre-written with zeros this far ahead of the write position.
pub const JOURNAL_ZERO_CHUNK_BYTES: u64 = 8 << 20;
/// WriteFull / recover payloads at least this large bypass the journal (written with
/// O_DIRECT to a fresh file and synced before the metadata-only record is journaled).
/// 128 KiB (was 256 KiB): the whole shards of an erasure-coded image (256 KiB objects,
/// k = 2: 128 KiB + trailer) went through the journal and the page cache, and every
/// checkpoint then synced thousands of such files while every commit waited: 512k writes
/// on an EC 2+1 image had a p99 of 617-726 ms (13x the mean); direct, 94-118 ms (2.3x),
/// and 160 -> 199 MB/s in the same bench run (docs/benchmarks.md, 2026-11-27). Reads of
/// such shards then come from the disk, not the page cache, as Ceph's do.
pub const DIRECT_WRITE_BYTES_MIN: usize = 128 << 10;
/// Direct writes at least this large bypass the page cache too (O_DIRECT); smaller ones
/// (128-256 KiB: an erasure-coded image's whole shards) are written through it and synced
/// before their record, like the others, so reads of a freshly written shard find it in
/// memory: with O_DIRECT 4k random reads at QD1 of an EC 2+1 image took 410 us (1.67x
/// Ceph, same sitting), every read a disk read.
pub const DIRECT_UNCACHED_BYTES_MIN: usize = 256 << 10;
/// Largest inline object, whatever `StoreConfig::inline_max_bytes` says (inline objects are
/// held in memory whole while they change).
pub const INLINE_BYTES_MAX: u64 = 16 << 20;
/// Reads at least this long that miss the page cache are read with O_DIRECT: a virtio
/// disk here streams 512 KiB O_DIRECT reads at QD16 at 1.29 GB/s but buffered io_uring
/// reads at 0.65 GB/s, and a large read would only evict the small hot blocks the page
/// cache is good for (the client has its own cache). Smaller misses stay buffered.
pub const DIRECT_READ_BYTES_MIN: usize = 128 << 10;
/// Data-file syncs a checkpoint keeps in flight at once (each holds an engine request
/// slot and an open descriptor until it is waited for).
pub const SYNCS_IN_FLIGHT_MAX: usize = 256;
/// Log entries in one `set_pg_log` record.
pub const LOG_ENTRIES_MAX: usize = 1 << 20;

const _: () = assert!(BLOCK_BYTES.is_power_of_two());
const _: () = assert!(JOURNAL_ALIGN.is_power_of_two());
const _: () = assert!(JOURNAL_ZERO_CHUNK_BYTES.is_multiple_of(JOURNAL_ALIGN as u64));
const _: () = assert!(NAME_BYTES_MAX <= u16::MAX as usize);
