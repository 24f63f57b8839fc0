//! Layout of an object of an erasure-coded pool over its shards.
//!
//! An object of `object_size` bytes is cut into stripes of `k * stripe_unit` bytes (the
//! last one zero-padded). Stripe `s` puts its j-th `stripe_unit` bytes into data shard j
//! at shard offset `s * stripe_unit`; parity shard r holds the r-th Reed-Solomon parity of
//! the stripe's k data units at the same offset. So every shard is the concatenation of
//! its units, `stripes * stripe_unit` bytes long, and a run of stripes is one "chunk" per
//! shard for the coding kernels (Reed-Solomon is bytewise): a range of stripes is encoded
//! or decoded with one kernel call. This is the layout of Ceph's erasure-coded pools
//! (stripe_unit = Ceph's `stripe_unit`, chunk = unit) and of ISA-L's `ec_encode_data`
//! applied to each shard's bytes.
//!
//! Each shard object stored by a daemon is the shard's bytes followed by a 16-byte trailer:
//! `u64 object_size | u32 magic "SPEC" | u32 CRC32C of the first 12 bytes` (little endian).

pub mod delta;

use crate::{Pool, PoolKind};
use spindle_ec::{EcError, MatrixKind, ReedSolomon};
use std::sync::Arc;

/// Bytes of the trailer after the shard data in each stored shard object.
pub const TRAILER_BYTES: u64 = 16;
const TRAILER_MAGIC: u32 = u32::from_le_bytes(*b"SPEC");

/// The coding of one erasure-coded pool.
#[derive(Clone)]
pub struct EcLayout {
    pub k: usize,
    pub m: usize,
    pub stripe_unit_bytes: u64,
    pub codec: Arc<ReedSolomon>,
}

impl std::fmt::Debug for EcLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EcLayout(k={}, m={}, matrix={}, stripe_unit={})",
            self.k,
            self.m,
            self.codec.matrix_kind().name(),
            self.stripe_unit_bytes
        )
    }
}

impl EcLayout {
    pub fn new(
        k: usize,
        m: usize,
        matrix: MatrixKind,
        stripe_unit_bytes: u64,
    ) -> Result<EcLayout, EcError> {
        assert!(stripe_unit_bytes > 0, "stripe unit must be positive");
        Ok(EcLayout {
            k,
            m,
            stripe_unit_bytes,
            codec: Arc::new(ReedSolomon::new(k, m, matrix)?),
        })
    }

    /// The layout of an erasure-coded pool (None for a replicated pool).
    pub fn for_pool(pool: &Pool) -> Option<Result<EcLayout, EcError>> {
        match pool.kind {
            PoolKind::Replicated { .. } => None,
            PoolKind::Erasure {
                k,
                m,
                matrix,
                stripe_unit_bytes,
                ..
            } => {
                let kind = MatrixKind::ALL
                    .get(matrix as usize)
                    .copied()
                    .unwrap_or(MatrixKind::IsalRs);
                Some(EcLayout::new(
                    k as usize,
                    m as usize,
                    kind,
                    stripe_unit_bytes as u64,
                ))
            }
        }
    }

    pub fn total(&self) -> usize {
        self.k + self.m
    }

    /// Object bytes per stripe.
    pub fn stripe_width(&self) -> u64 {
        self.k as u64 * self.stripe_unit_bytes
    }

    /// Stripes of an object of `object_size` bytes.
    pub fn stripes(&self, object_size: u64) -> u64 {
        object_size.div_ceil(self.stripe_width())
    }

    /// Bytes of each shard (without trailer) for an object of `object_size` bytes.
    pub fn shard_size(&self, object_size: u64) -> u64 {
        self.stripes(object_size) * self.stripe_unit_bytes
    }

    /// Stripes `[first, end)` covering object bytes `[offset, offset + len)`.
    pub fn stripe_range(&self, offset: u64, len: u64) -> (u64, u64) {
        let w = self.stripe_width();
        (offset / w, (offset + len).div_ceil(w))
    }

    /// Encodes `stripes` stripes whose object bytes are `data` (at most `stripes` stripe
    /// widths; missing bytes are zeros) into one buffer of k + m segments of
    /// `stripes * stripe_unit` bytes each (shard i's bytes for these stripes), which is the
    /// layout of a wire `EcWrite` payload.
    pub fn encode_stripes(&self, data: &[u8], stripes: u64) -> Result<Vec<u8>, EcError> {
        Ok(self.encode_shards(data, stripes, 0)?.concat())
    }

    /// [`EcLayout::encode_stripes`] as k + m separate shard buffers, each with
    /// `spare_bytes` of spare capacity (for a slot trailer, appended without moving the
    /// shard). Data shards are filled unit by unit (never zeroed first).
    pub fn encode_shards(
        &self,
        data: &[u8],
        stripes: u64,
        spare_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, EcError> {
        let su = self.stripe_unit_bytes as usize;
        let seg = stripes as usize * su;
        let w = self.stripe_width() as usize;
        assert!(data.len() <= stripes as usize * w, "more data than stripes");
        let mut shards: Vec<Vec<u8>> = (0..self.total())
            .map(|_| Vec::with_capacity(seg + spare_bytes))
            .collect();
        // Data shard j holds unit j of every stripe, in stripe order.
        for stripe in 0..stripes as usize {
            for (j, shard) in shards.iter_mut().take(self.k).enumerate() {
                let at = (stripe * self.k + j) * su;
                let unit = data.get(at..(at + su).min(data.len())).unwrap_or(&[]);
                shard.extend_from_slice(unit);
                shard.resize((stripe + 1) * su, 0);
            }
        }
        let (data_shards, parity) = shards.split_at_mut(self.k);
        for p in parity.iter_mut() {
            p.resize(seg, 0);
        }
        if seg > 0 {
            let data_segs: Vec<&[u8]> = data_shards.iter().map(|v| v.as_slice()).collect();
            let mut parity_segs: Vec<&mut [u8]> =
                parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.codec.encode(&data_segs, &mut parity_segs)?;
        }
        debug_assert!(shards.iter().all(|v| v.len() == seg));
        Ok(shards)
    }

    /// Appends to `out` object bytes `[from, from + len)` of the stripes whose data segments
    /// (shard bytes starting at stripe `first_stripe`) are `segs` (k segments, same length).
    pub fn gather(
        &self,
        segs: &[&[u8]],
        first_stripe: u64,
        from: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) {
        assert_eq!(segs.len(), self.k);
        let su = self.stripe_unit_bytes;
        let w = self.stripe_width();
        let mut pos = from;
        let end = from + len;
        while pos < end {
            let stripe = pos / w;
            let j = ((pos % w) / su) as usize;
            let in_unit = pos % su;
            let take = (su - in_unit).min(end - pos);
            let at = ((stripe - first_stripe) * su + in_unit) as usize;
            let seg = segs[j];
            let avail = seg.len().saturating_sub(at).min(take as usize);
            if avail > 0 {
                out.extend_from_slice(&seg[at..at + avail]);
            }
            // Beyond the segment (never written) reads as zeros.
            out.resize(out.len() + (take as usize - avail), 0);
            pos += take;
        }
    }

    /// Rebuilds the `None` segments (at most m) from the others, in place. All present
    /// segments must have the same length.
    pub fn reconstruct(&self, segs: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        assert_eq!(segs.len(), self.total());
        let len = segs.iter().flatten().map(Vec::len).next().unwrap_or(0);
        let erasures: Vec<usize> = (0..segs.len()).filter(|&i| segs[i].is_none()).collect();
        if erasures.is_empty() {
            return Ok(());
        }
        let mut bufs: Vec<Vec<u8>> = segs
            .iter_mut()
            .map(|s| s.take().unwrap_or_else(|| vec![0u8; len]))
            .collect();
        let result = if len == 0 {
            if erasures.len() > self.m {
                Err(EcError::TooManyErasures {
                    erased: erasures.len(),
                    parity_chunks: self.m,
                })
            } else {
                Ok(())
            }
        } else {
            self.codec.decode(&mut bufs, &erasures)
        };
        for (slot, buf) in segs.iter_mut().zip(bufs) {
            *slot = Some(buf);
        }
        result
    }
}

/// The trailer stored after a shard's bytes.
pub fn trailer(object_size: u64) -> [u8; TRAILER_BYTES as usize] {
    trailer_with_magic(object_size, TRAILER_MAGIC)
}

/// A slot trailer: `u64 object size | u32 magic | u32 CRC32C of the 12 bytes before`.
fn trailer_with_magic(object_size: u64, magic: u32) -> [u8; TRAILER_BYTES as usize] {
    let mut t = [0u8; TRAILER_BYTES as usize];
    t[..8].copy_from_slice(&object_size.to_le_bytes());
    t[8..12].copy_from_slice(&magic.to_le_bytes());
    let crc = spindle_types::crc::crc32c(&t[..12]);
    t[12..].copy_from_slice(&crc.to_le_bytes());
    t
}

/// The object size of a slot trailer with `magic` (None if `t` is not one).
fn parse_trailer_with_magic(t: &[u8], want: u32) -> Option<u64> {
    if t.len() != TRAILER_BYTES as usize {
        return None;
    }
    let magic = u32::from_le_bytes(t[8..12].try_into().ok()?);
    let crc = u32::from_le_bytes(t[12..16].try_into().ok()?);
    if magic != want || crc != spindle_types::crc::crc32c(&t[..12]) {
        return None;
    }
    Some(u64::from_le_bytes(t[..8].try_into().ok()?))
}

/// The object size recorded in a shard trailer (None if it is not a valid trailer).
pub fn parse_trailer(t: &[u8]) -> Option<u64> {
    parse_trailer_with_magic(t, TRAILER_MAGIC)
}

/// The object size recorded in the trailer of any shard slot, whole (`SPEC`) or delta
/// (`SPED`).
pub fn parse_any_trailer(t: &[u8]) -> Option<u64> {
    parse_trailer(t).or_else(|| delta::parse_delta_trailer(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn encode_gather_round_trip_every_size() {
        let l = EcLayout::new(3, 2, MatrixKind::IsalRs, 512).unwrap();
        for len in [0usize, 1, 511, 512, 1536, 1537, 5000, 3 * 512 * 4] {
            let data = object(len, len as u8);
            let n = l.stripes(len as u64);
            let buf = l.encode_stripes(&data, n).unwrap();
            let seg = (n * 512) as usize;
            assert_eq!(buf.len(), seg * 5);
            let segs: Vec<&[u8]> = buf.chunks(seg.max(1)).take(3).collect();
            let segs: Vec<&[u8]> = if seg == 0 { vec![&[][..]; 3] } else { segs };
            let mut out = Vec::new();
            l.gather(&segs, 0, 0, len as u64, &mut out);
            assert_eq!(out, data, "len {len}");
        }
    }

    #[test]
    fn any_m_lost_shards_are_rebuilt() {
        let l = EcLayout::new(4, 2, MatrixKind::IsalCauchy, 1024).unwrap();
        let data = object(10_000, 7);
        let n = l.stripes(10_000);
        let buf = l.encode_stripes(&data, n).unwrap();
        let seg = (n * 1024) as usize;
        for a in 0..6 {
            for b in a + 1..6 {
                let mut segs: Vec<Option<Vec<u8>>> =
                    buf.chunks(seg).map(|c| Some(c.to_vec())).collect();
                segs[a] = None;
                segs[b] = None;
                l.reconstruct(&mut segs).unwrap();
                let all: Vec<u8> = segs.iter().flatten().flatten().copied().collect();
                assert_eq!(all, buf, "lost {a},{b}");
            }
        }
        let mut segs: Vec<Option<Vec<u8>>> = buf.chunks(seg).map(|c| Some(c.to_vec())).collect();
        segs[0] = None;
        segs[1] = None;
        segs[2] = None;
        assert!(l.reconstruct(&mut segs).is_err());
    }

    #[test]
    fn a_stripe_range_encodes_like_the_whole_object() {
        let l = EcLayout::new(2, 1, MatrixKind::IsalRs, 512).unwrap();
        let data = object(4096, 3);
        let whole = l.encode_stripes(&data, 4).unwrap();
        // Stripes 1..3 alone.
        let part = l.encode_stripes(&data[1024..3072], 2).unwrap();
        for shard in 0..3 {
            assert_eq!(
                &part[shard * 1024..(shard + 1) * 1024],
                &whole[shard * 2048 + 512..shard * 2048 + 1536]
            );
        }
    }

    #[test]
    fn gather_past_short_segments_reads_zeros() {
        let l = EcLayout::new(2, 1, MatrixKind::IsalRs, 512).unwrap();
        let mut out = Vec::new();
        // Segments shorter than the range asked (or empty): zeros, never a panic.
        l.gather(&[&[7u8; 100][..], &[][..]], 0, 0, 2048, &mut out);
        assert_eq!(out.len(), 2048);
        assert_eq!(&out[..100], &[7u8; 100][..]);
        assert!(out[100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn trailer_round_trip_and_damage() {
        let t = trailer(123_456_789);
        assert_eq!(parse_trailer(&t), Some(123_456_789));
        let mut bad = t;
        bad[2] ^= 1;
        assert_eq!(parse_trailer(&bad), None);
        assert_eq!(parse_trailer(&t[..15]), None);
    }
}
