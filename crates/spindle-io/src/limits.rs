//! Every bound of the engine, in one place.

/// Most io_uring instances (or thread-pool queues) per engine.
pub const RINGS_MAX: usize = 64;
/// Largest staging queue per ring.
pub const STAGING_MAX: usize = 1 << 16;
/// Most requests one ring keeps in the kernel (the SQ holds this plus control entries).
pub const IN_FLIGHT_MAX: usize = 4096;
/// Largest request slab.
pub const SLAB_MAX: usize = 1 << 20;
/// Most worker threads per queue of the thread-pool backend.
pub const POOL_THREADS_MAX: usize = 256;
/// Largest single transfer submitted at once (longer ones continue as resubmissions).
pub const TRANSFER_MAX_BYTES: usize = crate::exec::TRANSFER_MAX_BYTES;
/// Most buffers in one registered set.
pub const FIXED_BUFS_MAX: usize = crate::fixed::FIXED_BUFS_MAX;
/// Largest registered buffer.
pub const FIXED_BUF_MAX_BYTES: usize = crate::fixed::FIXED_BUF_MAX_BYTES;
/// Largest registered file table (`Config::fixed_files`).
pub const FIXED_FILES_MAX: usize = crate::fixed::FIXED_FILES_MAX;
/// Most buffers in one readv/writev.
pub const IOV_MAX: usize = crate::exec::IOV_MAX;

const _: () = assert!(
    IN_FLIGHT_MAX + 2 <= 8192,
    "ring sizes must fit u32 and the kernel"
);
const _: () = assert!(
    SLAB_MAX < u32::MAX as usize,
    "slot index u32::MAX tags control entries"
);
