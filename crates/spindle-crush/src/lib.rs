//! `spindle-crush`: CRUSH placement, bit-compatible with Ceph's (16.x `crushtool`).
//!
//! Every I/O in Spindle starts here: an object's placement group is mapped through a rule
//! of the cluster's CRUSH map to an ordered list of storage daemons. Operators can bring
//! the maps they already run with Ceph: the text format of `crushtool -d` and the compiled
//! binary format are both read, and mappings are identical to Ceph's.
//!
//! Layout:
//! - [`map`]: the model (buckets of all five algorithms, rules, tunables, classes);
//! - [`builder`]: derived bucket data exactly as Ceph's `builder.c` computes it;
//! - [`classes`]: per-class shadow hierarchies;
//! - [`text`], [`binary`]: the two interchange formats;
//! - [`mapper`]: the scalar reference mapping (`do_rule`);
//! - [`batch`]: many inputs at once, with an AVX2 path for the hash and straw2 draw;
//! - [`tester`]: `crushtool --test` compatible output.

pub mod batch;
pub mod binary;
pub mod builder;
pub mod classes;
pub mod error;
pub mod hash;
mod lanes;
pub mod ln;
mod ln_tables;
pub mod map;
pub mod mapper;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod tester;
pub mod text;

pub use error::CrushError;
pub use map::{Bucket, BucketAlg, CrushMap, Rule, Step, Tunables, ITEM_NONE, WEIGHT_ONE};
pub use mapper::{do_rule, Workspace};

/// Loads a map from either format: compiled binary (starts with Ceph's CRUSH magic) or
/// decompiled text.
pub fn load_map(bytes: &[u8]) -> Result<CrushMap, CrushError> {
    if binary::is_binary(bytes) {
        binary::decode(bytes)
    } else {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            CrushError::Invalid(format!("map is neither binary nor UTF-8 text: {e}"))
        })?;
        text::parse_text(text)
    }
}
