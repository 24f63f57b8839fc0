//! `spindle-bench`: the benchmark commands behind `spindle bench ...`. Each prints
//! Spindle's figure beside its anchor measured in the same run on the same machine
//! (crushtool, ISA-L, fio's io_uring engine, Ceph's `rados bench` / RBD, nbdkit memory)
//! and the ratio; `--json` gives one JSON object. Figures and their history:
//! `docs/benchmarks.md`.
//!
//! - [`crush`]: placement against crushtool; [`ec`]: erasure coding and CRC32C against
//!   ISA-L; [`io`]: the I/O engine against fio;
//! - [`objects`]: object writes/reads on a cluster against `rados bench`; [`fio`]: block
//!   images over NBD with fio against nbdkit memory, the disk and Ceph RBD (`--ceph`: in
//!   the same sitting); [`recovery`]: recovery speed after a daemon loss; [`soak`]:
//!   descriptors and memory of long-running processes; [`stages`]: where a block read's
//!   time goes, stage by stage; [`ssb`]: SSB Q3.3 offloaded against pulled and DuckDB;
//!   [`exec_io`]: fio's latency while programs run on the daemons, budget by budget;
//!   [`zarr`]: Zarr arrays through the Python package against zarr's LocalStore;
//! - [`common`]: the report every benchmark prints; [`proc_cpu`]: CPU time of processes.

pub mod auth_cost;
pub mod common;
pub mod crush;
pub mod ec;
pub mod exec_io;
pub mod failover;
pub mod fio;
pub mod images;
pub mod io;
pub mod metrics_cost;
pub mod objects;
pub mod proc_cpu;
pub mod prog;
pub mod recovery;
pub mod soak;
pub mod ssb;
pub mod stages;
pub mod zarr;
