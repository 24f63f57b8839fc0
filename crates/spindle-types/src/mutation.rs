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

impl Mutation {
    /// The object's content after this mutation, given its content before (`None`:
    /// absent, before or after). The reference model of what the store does to the data
    /// (tests and simulators check the store against it): `WriteFull` replaces; `Write`
    /// creates a missing object, zero-fills any gap past the old end and grows the
    /// object to at least `offset + len`; `Truncate` creates a missing object, cuts or
    /// zero-extends it to `size_bytes`; `Delete` removes it (a missing one stays absent).
    /// Pure: no I/O, no limits checked (the store refuses oversized objects before this).
    pub fn apply_to(&self, old: Option<&[u8]>) -> Option<Vec<u8>> {
        match self {
            Mutation::Delete => None,
            Mutation::WriteFull(d) => Some(d.clone()),
            Mutation::Write { offset, data } => {
                let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
                let start = *offset as usize;
                let end = start + data.len();
                if v.len() < end {
                    v.resize(end, 0);
                }
                v[start..end].copy_from_slice(data);
                Some(v)
            }
            Mutation::Truncate { size_bytes } => {
                let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
                v.resize(*size_bytes as usize, 0);
                Some(v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Mutation;

    #[test]
    fn write_full_replaces_and_creates() {
        let m = Mutation::WriteFull(vec![1, 2]);
        assert_eq!(m.apply_to(Some(&[9, 9, 9])), Some(vec![1, 2]));
        assert_eq!(m.apply_to(None), Some(vec![1, 2]));
        assert_eq!(Mutation::WriteFull(vec![]).apply_to(None), Some(vec![]));
    }

    #[test]
    fn write_overwrites_in_place_grows_and_zero_fills_gaps() {
        let w = |offset, data: &[u8]| Mutation::Write {
            offset,
            data: data.to_vec(),
        };
        // Inside the object: size unchanged.
        assert_eq!(w(1, &[7]).apply_to(Some(&[1, 2, 3])), Some(vec![1, 7, 3]));
        // Across the end: grows to offset + len.
        assert_eq!(
            w(2, &[7, 8]).apply_to(Some(&[1, 2, 3])),
            Some(vec![1, 2, 7, 8])
        );
        // Past the end: the gap reads as zeros.
        assert_eq!(w(4, &[7]).apply_to(Some(&[1])), Some(vec![1, 0, 0, 0, 7]));
        // A missing object is created (zeros before the offset).
        assert_eq!(w(2, &[5]).apply_to(None), Some(vec![0, 0, 5]));
        // An empty write still creates the object, up to its offset.
        assert_eq!(w(3, &[]).apply_to(None), Some(vec![0, 0, 0]));
        assert_eq!(w(0, &[]).apply_to(Some(&[4, 4])), Some(vec![4, 4]));
    }

    #[test]
    fn truncate_cuts_extends_with_zeros_and_creates() {
        let t = |size_bytes| Mutation::Truncate { size_bytes };
        assert_eq!(t(1).apply_to(Some(&[1, 2, 3])), Some(vec![1]));
        assert_eq!(t(5).apply_to(Some(&[1, 2])), Some(vec![1, 2, 0, 0, 0]));
        assert_eq!(t(0).apply_to(Some(&[1, 2])), Some(vec![]));
        assert_eq!(t(2).apply_to(None), Some(vec![0, 0]));
    }

    #[test]
    fn delete_removes_and_a_missing_object_stays_absent() {
        assert_eq!(Mutation::Delete.apply_to(Some(&[1])), None);
        assert_eq!(Mutation::Delete.apply_to(None), None);
    }
}
