//! Export and import of whole images as raw files, sparse-aware (`spindle image export`,
//! `spindle image import`), and space accounting (`spindle image du`).
//!
//! Export reads the image (or a snapshot: [`crate::Image::open_snap`]) one data object at
//! a time, `PARALLEL_OPS_MAX` objects in flight, and writes only the 4 KiB blocks that are
//! not all zeros: into a file they land at their offset and the rest stays a hole (the
//! file gets the image's size with `set_len`); to a pipe the zeros are written out (a pipe
//! cannot seek). Import reads the file an object's worth at a time and writes only the
//! non-zero blocks, so holes (and zero runs) stay unallocated in the image too.

use crate::image::{ImageError, ObjectBackend, PARALLEL_OPS_MAX};
use crate::Image;
use std::io::{Read, Seek, SeekFrom, Write};

/// Zero detection granularity: a block of zeros is a hole.
pub const SPARSE_BLOCK_BYTES: usize = 4096;

/// The runs of `data` that are not all zeros, as (offset, len), at `SPARSE_BLOCK_BYTES`
/// granularity (adjacent non-zero blocks form one run).
pub fn nonzero_runs(data: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, block) in data.chunks(SPARSE_BLOCK_BYTES).enumerate() {
        if block.iter().all(|&b| b == 0) {
            continue;
        }
        let at = i * SPARSE_BLOCK_BYTES;
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at => *len += block.len(),
            _ => runs.push((at, block.len())),
        }
    }
    runs
}

/// What an export or import moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransferStats {
    /// The image's size.
    pub size_bytes: u64,
    /// Bytes that were not zeros (written to the file, or to the image).
    pub data_bytes: u64,
}

/// Writes `image` to `out`: a file (`seekable`: holes stay holes) or a stream.
/// `progress(done_bytes, total_bytes)` after each batch of objects.
pub async fn export<B: ObjectBackend, W: Write + Seek>(
    image: &Image<B>,
    out: &mut W,
    seekable: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<TransferStats, ImageError> {
    let size = image.size_bytes();
    let os = image.object_size_bytes();
    let count = size.div_ceil(os);
    let mut stats = TransferStats {
        size_bytes: size,
        data_bytes: 0,
    };
    let io = |e: std::io::Error| ImageError::Task(format!("writing the export: {e}"));
    // Large images: only the objects that exist are read (the rest are holes).
    let with_data = image.objects_with_data().await?;
    progress(0, size);
    // Reads stay `PARALLEL_OPS_MAX` objects ahead of the writing, in order (a batch at a
    // time left the cluster idle while the file was written: 198 MB/s against `rbd
    // export`'s 306 in the same sitting).
    use futures::stream::StreamExt;
    let with_data = &with_data;
    let mut parts = futures::stream::iter(0..count)
        .map(|i| {
            let offset = i * os;
            let len = os.min(size - offset);
            let skip = with_data.as_ref().is_some_and(|w| !w.contains(&i));
            async move {
                if skip {
                    Ok((i, len, None))
                } else {
                    image.read(offset, len).await.map(|d| (i, len, Some(d)))
                }
            }
        })
        .buffered(PARALLEL_OPS_MAX);
    while let Some(part) = parts.next().await {
        let (i, len, data) = part?;
        let base = i * os;
        match data {
            // A hole: nothing to write to a file; zeros to a stream.
            None => {
                if !seekable {
                    out.write_all(&vec![0u8; len as usize]).map_err(io)?;
                }
            }
            Some(data) if seekable => {
                for (at, len) in nonzero_runs(&data) {
                    out.seek(SeekFrom::Start(base + at as u64)).map_err(io)?;
                    out.write_all(&data[at..at + len]).map_err(io)?;
                    stats.data_bytes += len as u64;
                }
            }
            Some(data) => {
                stats.data_bytes += nonzero_runs(&data).iter().map(|r| r.1 as u64).sum::<u64>();
                out.write_all(&data).map_err(io)?;
            }
        }
        if (i + 1) % PARALLEL_OPS_MAX as u64 == 0 || i + 1 == count {
            progress(((i + 1) * os).min(size), size);
        }
    }
    out.flush().map_err(io)?;
    Ok(stats)
}

/// Reads `input` (raw, `size_bytes` long) into `image` (already created with that size):
/// only the non-zero blocks are written. `progress(done_bytes, total_bytes)`.
pub async fn import<B: ObjectBackend, R: Read>(
    image: &Image<B>,
    input: &mut R,
    size_bytes: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<TransferStats, ImageError> {
    let os = image.object_size_bytes();
    if image.size_bytes() < size_bytes {
        return Err(ImageError::InvalidSize(size_bytes));
    }
    let io = |e: std::io::Error| ImageError::Task(format!("reading the import: {e}"));
    let mut stats = TransferStats {
        size_bytes,
        data_bytes: 0,
    };
    let mut offset = 0u64;
    progress(0, size_bytes);
    // Up to `PARALLEL_OPS_MAX` writes stay in flight while the input is read (a batch at
    // a time left the cluster idle while the next batch was read).
    use futures::stream::{FuturesUnordered, StreamExt};
    let mut in_flight = FuturesUnordered::new();
    while offset < size_bytes {
        let len = os.min(size_bytes - offset) as usize;
        let mut buf = vec![0u8; len];
        input.read_exact(&mut buf).map_err(io)?;
        let runs = nonzero_runs(&buf);
        for (at, run) in runs {
            stats.data_bytes += run as u64;
            // A whole object of data moves; a part of one is copied out.
            let data = if at == 0 && run == buf.len() {
                std::mem::take(&mut buf)
            } else {
                buf[at..at + run].to_vec()
            };
            in_flight.push(image.write_owned(offset + at as u64, data));
            while in_flight.len() >= PARALLEL_OPS_MAX {
                if let Some(r) = in_flight.next().await {
                    r?;
                }
            }
        }
        offset += len as u64;
        if (offset / os).is_multiple_of(PARALLEL_OPS_MAX as u64) && offset < size_bytes {
            progress(offset, size_bytes);
        }
    }
    while let Some(r) = in_flight.next().await {
        r?;
    }
    progress(size_bytes, size_bytes);
    Ok(stats)
}

/// Space of one image (`spindle image du`): what it may grow to and what it stores.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageUsage {
    pub name: String,
    pub provisioned_bytes: u64,
    /// Bytes of the head's data objects (as stored: one copy, before replication or
    /// erasure coding).
    pub used_bytes: u64,
    /// Per snapshot (oldest first): the bytes of the copies it is the newest reader of
    /// (what removing it alone may free).
    pub snapshots: Vec<SnapUsage>,
    /// Bytes of copies no live snapshot reads: removed snapshots' space, being freed in
    /// the background.
    pub trimming_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapUsage {
    pub name: String,
    pub id: u64,
    pub provisioned_bytes: u64,
    pub used_bytes: u64,
}

/// The space of every image of `pool` (or of `only`), from one listing of the pool.
pub async fn usage(
    client: &spindle_client::Client,
    pool: &str,
    only: Option<&str>,
) -> Result<Vec<ImageUsage>, ImageError> {
    let listing = client.list(pool).await?;
    let images = Image::list(client, pool).await?;
    let mut out = Vec::new();
    for info in images {
        if only.is_some_and(|n| n != info.name) {
            continue;
        }
        let mut used = 0u64;
        // Per object index: (copy id, bytes), sorted by id.
        let mut copies: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
        for o in &listing {
            if spindle_map::image_data_object(&o.name).is_some_and(|(img, _)| img == info.name) {
                used += o.size_bytes;
            } else if let Some((index, c)) = crate::snap::parse_snap_object(&info.name, &o.name) {
                copies.entry(index).or_default().push((c, o.size_bytes));
            }
        }
        let snaps = client.image_snaps(pool, &info.name).unwrap_or_default();
        let live: Vec<u64> = snaps.snaps.keys().copied().collect();
        // A copy belongs to the newest live snapshot it serves; none: it is being trimmed
        // (or, above the map's seq, made for a snapshot this map does not know yet).
        let mut per_snap: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut trimming_bytes = 0u64;
        for list in copies.values_mut() {
            list.sort_unstable();
            let ids: Vec<u64> = list.iter().map(|(c, _)| *c).collect();
            let unneeded = crate::snap::unneeded_copies(&ids, &live, snaps.seq);
            let mut previous = 0u64;
            for &(c, bytes) in list.iter() {
                if unneeded.contains(&c) {
                    trimming_bytes += bytes;
                } else if let Some(s) = live.iter().rev().find(|&&s| s > previous && s <= c) {
                    *per_snap.entry(*s).or_default() += bytes;
                }
                previous = c;
            }
        }
        let snapshots = crate::snap::list(client, pool, &info.name)
            .into_iter()
            .map(|s| SnapUsage {
                used_bytes: per_snap.get(&s.id).copied().unwrap_or(0),
                name: s.name,
                id: s.id,
                provisioned_bytes: s.size_bytes,
            })
            .collect();
        out.push(ImageUsage {
            name: info.name,
            provisioned_bytes: info.size_bytes,
            used_bytes: used,
            snapshots,
            trimming_bytes,
        });
    }
    if let Some(n) = only {
        if out.is_empty() {
            return Err(ImageError::NotFound(n.to_string()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_are_holes() {
        let mut d = vec![0u8; 5 * SPARSE_BLOCK_BYTES + 100];
        d[SPARSE_BLOCK_BYTES + 3] = 1;
        d[2 * SPARSE_BLOCK_BYTES] = 1;
        d[5 * SPARSE_BLOCK_BYTES + 99] = 7;
        assert_eq!(
            nonzero_runs(&d),
            vec![
                (SPARSE_BLOCK_BYTES, 2 * SPARSE_BLOCK_BYTES),
                (5 * SPARSE_BLOCK_BYTES, 100)
            ]
        );
        assert!(nonzero_runs(&[0u8; 8192]).is_empty());
    }
}
