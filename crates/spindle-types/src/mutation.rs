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
    /// Several writes at once (one version, one journal record): `data` holds the bytes of
    /// `extents` one after the other. Extents are sorted, non-empty and do not overlap
    /// ([`check_extents`]); the effect is that of one `Write` per extent.
    WriteExtents { extents: Vec<Extent>, data: Vec<u8> },
}

/// One range of a [`Mutation::WriteExtents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len_bytes: u32,
}

/// Why an extent list is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExtentsError {
    #[error("a multi-extent write needs at least one extent")]
    Empty,
    #[error("{0} extents in one write, the limit is {max}", max = crate::limits::WRITE_EXTENTS_MAX)]
    TooMany(usize),
    #[error("extent {0} is empty")]
    EmptyExtent(usize),
    #[error("extent {0} starts before the end of the one before it (extents are sorted and do not overlap)")]
    Unsorted(usize),
    #[error("extent {0} ends past 2^64")]
    Overflow(usize),
    #[error("the extents cover {covered} bytes but the write carries {carried}")]
    LengthMismatch { covered: u64, carried: u64 },
}

/// Checks a multi-extent write's extents against its `data_len`; returns the end of the
/// last extent (the object's size is at least that afterwards).
pub fn check_extents(extents: &[Extent], data_len: usize) -> Result<u64, ExtentsError> {
    if extents.is_empty() {
        return Err(ExtentsError::Empty);
    }
    if extents.len() > crate::limits::WRITE_EXTENTS_MAX {
        return Err(ExtentsError::TooMany(extents.len()));
    }
    let (mut end, mut covered) = (0u64, 0u64);
    for (i, e) in extents.iter().enumerate() {
        if e.len_bytes == 0 {
            return Err(ExtentsError::EmptyExtent(i));
        }
        if i > 0 && e.offset < end {
            return Err(ExtentsError::Unsorted(i));
        }
        end = e
            .offset
            .checked_add(e.len_bytes as u64)
            .ok_or(ExtentsError::Overflow(i))?;
        covered += e.len_bytes as u64;
    }
    if covered != data_len as u64 {
        return Err(ExtentsError::LengthMismatch {
            covered,
            carried: data_len as u64,
        });
    }
    Ok(end)
}

/// The (offset, bytes) pieces of a multi-extent write (extents already checked).
pub fn extent_pieces<'a>(
    extents: &'a [Extent],
    data: &'a [u8],
) -> impl Iterator<Item = (u64, &'a [u8])> + 'a {
    let mut at = 0usize;
    extents.iter().map(move |e| {
        let piece = &data[at..at + e.len_bytes as usize];
        at += e.len_bytes as usize;
        (e.offset, piece)
    })
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
            Mutation::WriteExtents { extents, data } => {
                let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
                for (offset, piece) in extent_pieces(extents, data) {
                    let start = offset as usize;
                    let end = start + piece.len();
                    if v.len() < end {
                        v.resize(end, 0);
                    }
                    v[start..end].copy_from_slice(piece);
                }
                Some(v)
            }
        }
    }

    /// The data bytes the mutation carries.
    pub fn data_len(&self) -> usize {
        match self {
            Mutation::WriteFull(d)
            | Mutation::Write { data: d, .. }
            | Mutation::WriteExtents { data: d, .. } => d.len(),
            Mutation::Truncate { .. } | Mutation::Delete => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_extents, Extent, ExtentsError, Mutation};

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
    fn write_extents_is_one_write_per_extent() {
        let ext = |offset, len_bytes| Extent { offset, len_bytes };
        let m = Mutation::WriteExtents {
            extents: vec![ext(1, 1), ext(4, 2)],
            data: vec![7, 8, 9],
        };
        assert_eq!(m.apply_to(Some(&[1, 2, 3])), Some(vec![1, 7, 3, 0, 8, 9]));
        assert_eq!(m.apply_to(None), Some(vec![0, 7, 0, 0, 8, 9]));
        assert_eq!(check_extents(&[ext(1, 1), ext(4, 2)], 3), Ok(6));
        assert_eq!(check_extents(&[], 0), Err(ExtentsError::Empty));
        assert_eq!(
            check_extents(&[ext(0, 0)], 0),
            Err(ExtentsError::EmptyExtent(0))
        );
        assert_eq!(
            check_extents(&[ext(4, 2), ext(5, 1)], 3),
            Err(ExtentsError::Unsorted(1))
        );
        assert_eq!(
            check_extents(&[ext(u64::MAX, 2)], 2),
            Err(ExtentsError::Overflow(0))
        );
        assert!(matches!(
            check_extents(&[ext(0, 2)], 3),
            Err(ExtentsError::LengthMismatch { .. })
        ));
        let many = vec![ext(0, 1); crate::limits::WRITE_EXTENTS_MAX + 1];
        assert!(matches!(
            check_extents(&many, many.len()),
            Err(ExtentsError::TooMany(_))
        ));
        // Touching extents are fine (sorted, not overlapping).
        assert_eq!(check_extents(&[ext(0, 2), ext(2, 2)], 4), Ok(4));
    }

    #[test]
    fn delete_removes_and_a_missing_object_stays_absent() {
        assert_eq!(Mutation::Delete.apply_to(Some(&[1])), None);
        assert_eq!(Mutation::Delete.apply_to(None), None);
    }
}
