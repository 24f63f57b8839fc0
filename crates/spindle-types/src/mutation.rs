//! A change to one object: what the store applies, what a replicated primary sends its
//! copies, and (wrapped with the erasure-coded shard writes) what the protocol carries.

/// A change to one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Replace the whole object (creates it).
    WriteFull(Vec<u8>),
    /// Write at `offset` (creates it; size becomes max(size, offset + len); gaps read as zeros).
    Write { offset: u64, data: Vec<u8> },
    /// Set the size (creates the object if missing; growing reads as zeros).
    Truncate { size_bytes: u64 },
    /// Remove the object (deleting a missing object is Ok, and still logged).
    Delete,
}
