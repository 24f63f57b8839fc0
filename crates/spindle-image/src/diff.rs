//! Differences between two states of an image (`spindle image diff`, `export-diff`,
//! `import-diff`), as `rbd` offers them.
//!
//! Which objects changed between snapshot `A` and snapshot `B` (or the head) follows from
//! the snapshot copies alone (`crate::snap`): object `i` reads at a snapshot `s` from its
//! copy with the smallest id `>= s`, else from the head, and a copy `i@c` is made only
//! when the object first changes after snapshot `c` (the newest at the time). So object `i`
//! is unchanged between `A` and `B` exactly when it has no copy with an id in `[A, B)`
//! (`[A, inf)` for the head). The objects that changed are read at both states and compared
//! 4 KiB block by block: a block that differs becomes data (or a zero run, if it is zeros
//! at `B`). Without `A`, every block that is not zeros at `B` is data. One listing of the
//! pool finds the copies. A diff of the head while it is written is not consistent (as
//! with `rbd`): diff snapshots.
//!
//! The diff stream (`spindle diff v1`) is rbd's diff v1 record set with a checksum on each
//! record: the magic `spindle diff v1\n`, then records `u8 tag | u32 len | payload |
//! u32 crc32c(tag, len, payload)` (little endian):
//! - `f` / `t`: the from / to snapshot's name (absent: from nothing / to the head);
//! - `s`: `u64` image size at the end state;
//! - `w`: `u64` offset, then the bytes (at most [`DIFF_RECORD_DATA_BYTES_MAX`]);
//! - `z`: `u64` offset, `u64` length: zeros;
//! - `e`: `u64` number of records before it; nothing may follow.
//!
//! `f`, `t` and `s` come before any data record; `s` is required. `import-diff` reads the
//! whole stream and checks every record before it changes anything, so a truncated or
//! corrupted diff leaves the image unchanged; then it requires the image to have snapshot
//! `f` (a chain of diffs applies in order only), resizes to `s`, applies the data and
//! takes snapshot `t`.

use crate::image::{ImageError, PARALLEL_OPS_MAX};
use crate::snap::{parse_snap_object, source_at};
use crate::transfer::SPARSE_BLOCK_BYTES;
use crate::Image;
use spindle_client::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::Arc;

/// First bytes of a diff stream.
pub const DIFF_MAGIC: &[u8] = b"spindle diff v1\n";
/// Largest data payload of one `w` record (an export writes at most an object per record;
/// objects are at most 32 MiB, so larger runs are cut).
pub const DIFF_RECORD_DATA_BYTES_MAX: usize = 4 << 20;
/// Largest payload of any record (a `w` record's offset and data).
const RECORD_BYTES_MAX: usize = DIFF_RECORD_DATA_BYTES_MAX + 8;
const _: () = assert!(RECORD_BYTES_MAX <= u32::MAX as usize);

/// One changed range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    /// Zeros at the end state (a `z` record), else data.
    pub zero: bool,
}

/// The two states a diff is between.
pub struct DiffSpec<'a> {
    pub pool: &'a str,
    pub image: &'a str,
    /// The older snapshot (None: from nothing, i.e. all zeros).
    pub from: Option<&'a str>,
    /// The newer snapshot (None: the head).
    pub to: Option<&'a str>,
}

/// The changed objects between the states, and the images to read them from.
struct Plan {
    to: Image<Client>,
    from: Option<Image<Client>>,
    objects: Vec<u64>,
}

async fn plan(client: &Arc<Client>, spec: &DiffSpec<'_>) -> Result<Plan, ImageError> {
    let to = match spec.to {
        Some(s) => Image::open_snap(client.clone(), spec.pool, spec.image, s).await?,
        None => Image::open(client.clone(), spec.pool, spec.image).await?,
    };
    let os = to.object_size_bytes();
    let to_count = to.size_bytes().div_ceil(os);
    let Some(from_name) = spec.from else {
        // From nothing: every object that may hold data at the end state.
        let objects = match (to.parent(), to.objects_with_data().await?) {
            (None, Some(listed)) => listed.into_iter().filter(|&i| i < to_count).collect(),
            _ => (0..to_count).collect(),
        };
        return Ok(Plan {
            to,
            from: None,
            objects,
        });
    };
    let from = Image::open_snap(client.clone(), spec.pool, spec.image, from_name).await?;
    let from_id = from.snapshot().map_or(0, |(id, _)| id);
    let to_id = to.snapshot().map(|(id, _)| id);
    if to_id.is_some_and(|t| t <= from_id) {
        return Err(ImageError::Snapshot(format!(
            "{}@{from_name} is not older than {}@{}",
            spec.image,
            spec.image,
            spec.to.unwrap_or("")
        )));
    }
    let mut copies: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for object in crate::ObjectBackend::list_objects(&**client, spec.pool).await? {
        if let Some((index, c)) = parse_snap_object(spec.image, &object) {
            copies.entry(index).or_default().push(c);
        }
    }
    let mut objects = BTreeSet::new();
    for (index, ids) in copies.iter_mut() {
        ids.sort_unstable();
        let at_from = source_at(ids, from_id);
        let at_to = match to_id {
            Some(t) => source_at(ids, t),
            None => None,
        };
        if at_from != at_to {
            objects.insert(*index);
        }
    }
    // Past the older state's end everything read as zeros there; the objects written
    // there since have copies (the write preserved them), so nothing else is needed.
    Ok(Plan {
        to,
        from: Some(from),
        objects: objects
            .into_iter()
            .filter(|&i| i < to_count.max(1))
            .collect(),
    })
}

/// Reads `[offset, offset + len)` of `image`, zeros past its end.
async fn read_padded(image: &Image<Client>, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
    let size = image.size_bytes();
    let mut data = if offset >= size {
        Vec::new()
    } else {
        image.read(offset, len.min(size - offset)).await?
    };
    data.resize(len as usize, 0);
    Ok(data)
}

/// The changed runs of one object: (offset in the image, bytes at the end state or None
/// for zeros).
async fn object_changes(
    plan: &Plan,
    index: u64,
) -> Result<Vec<(u64, Option<Vec<u8>>)>, ImageError> {
    let os = plan.to.object_size_bytes();
    let start = index * os;
    let size = plan.to.size_bytes();
    if start >= size {
        return Ok(Vec::new());
    }
    let len = os.min(size - start);
    let new = read_padded(&plan.to, start, len).await?;
    let old = match &plan.from {
        Some(from) => read_padded(from, start, len).await?,
        None => vec![0; len as usize],
    };
    let mut out: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    for (i, (n, o)) in new
        .chunks(SPARSE_BLOCK_BYTES)
        .zip(old.chunks(SPARSE_BLOCK_BYTES))
        .enumerate()
    {
        if n == o {
            continue;
        }
        let at = start + (i * SPARSE_BLOCK_BYTES) as u64;
        if n.iter().all(|&b| b == 0) {
            // One entry per zero block ([`extents_of`] merges them into runs).
            out.push((at, None));
            continue;
        }
        match out.last_mut() {
            Some((off, Some(bytes))) if *off + bytes.len() as u64 == at => {
                bytes.extend_from_slice(n);
            }
            _ => out.push((at, Some(n.to_vec()))),
        }
    }
    Ok(out)
}

/// Turns per-block changes into extents (adjacent zero blocks become one run).
fn extents_of(changes: &[(u64, Option<Vec<u8>>)], end: u64) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for (offset, data) in changes {
        let (len, zero) = match data {
            Some(d) => (d.len() as u64, false),
            None => ((SPARSE_BLOCK_BYTES as u64).min(end - offset), true),
        };
        match out.last_mut() {
            Some(e) if e.zero == zero && e.offset + e.len == *offset => e.len += len,
            _ => out.push(Extent {
                offset: *offset,
                len,
                zero,
            }),
        }
    }
    out
}

/// The changed extents between the two states; `progress(done, total)` per object.
pub async fn changed_extents(
    client: &Arc<Client>,
    spec: &DiffSpec<'_>,
    mut progress: impl FnMut(u64, u64) + Send,
) -> Result<(u64, Vec<Extent>), ImageError> {
    let plan = plan(client, spec).await?;
    let size = plan.to.size_bytes();
    let total = plan.objects.len() as u64;
    progress(0, total);
    let mut out: Vec<Extent> = Vec::new();
    let mut done = 0;
    for batch in plan.objects.chunks(PARALLEL_OPS_MAX) {
        let jobs = batch.iter().map(|&i| object_changes(&plan, i));
        for changes in futures::future::join_all(jobs).await {
            for e in extents_of(&changes?, size) {
                match out.last_mut() {
                    Some(last) if last.zero == e.zero && last.offset + last.len == e.offset => {
                        last.len += e.len
                    }
                    _ => out.push(e),
                }
            }
        }
        done += batch.len() as u64;
        progress(done, total);
    }
    Ok((size, out))
}

/// What an export-diff or import-diff moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiffStats {
    pub size_bytes: u64,
    /// Bytes of data records.
    pub data_bytes: u64,
    /// Bytes of zero records.
    pub zero_bytes: u64,
    pub records: u64,
}

struct RecordWriter<'w, W: Write> {
    out: &'w mut W,
    records: u64,
}

impl<W: Write> RecordWriter<'_, W> {
    fn record(&mut self, tag: u8, parts: &[&[u8]]) -> std::io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= RECORD_BYTES_MAX);
        let head = [&[tag][..], &(len as u32).to_le_bytes()[..]].concat();
        let mut crc = spindle_crc::crc32c(&head);
        for p in parts {
            crc = spindle_crc::crc32c_append(crc, p);
        }
        self.out.write_all(&head)?;
        for p in parts {
            self.out.write_all(p)?;
        }
        self.out.write_all(&crc.to_le_bytes())?;
        self.records += 1;
        Ok(())
    }
}

/// Writes the diff between the two states to `out`; `progress(done, total)` per object.
pub async fn export_diff<W: Write>(
    client: &Arc<Client>,
    spec: &DiffSpec<'_>,
    out: &mut W,
    mut progress: impl FnMut(u64, u64) + Send,
) -> Result<DiffStats, ImageError> {
    let io = |e: std::io::Error| ImageError::Task(format!("writing the diff: {e}"));
    let plan = plan(client, spec).await?;
    let size = plan.to.size_bytes();
    let mut stats = DiffStats {
        size_bytes: size,
        ..DiffStats::default()
    };
    out.write_all(DIFF_MAGIC).map_err(io)?;
    let mut w = RecordWriter { out, records: 0 };
    if let Some(f) = spec.from {
        w.record(b'f', &[f.as_bytes()]).map_err(io)?;
    }
    if let Some(t) = spec.to {
        w.record(b't', &[t.as_bytes()]).map_err(io)?;
    }
    w.record(b's', &[&size.to_le_bytes()]).map_err(io)?;
    let total = plan.objects.len() as u64;
    progress(0, total);
    let mut done = 0;
    for batch in plan.objects.chunks(PARALLEL_OPS_MAX) {
        let jobs = batch.iter().map(|&i| object_changes(&plan, i));
        for changes in futures::future::join_all(jobs).await {
            let changes = changes?;
            for e in extents_of(&changes, size).iter().filter(|e| e.zero) {
                w.record(b'z', &[&e.offset.to_le_bytes(), &e.len.to_le_bytes()])
                    .map_err(io)?;
                stats.zero_bytes += e.len;
            }
            for (offset, data) in &changes {
                let Some(data) = data else { continue };
                for (i, piece) in data.chunks(DIFF_RECORD_DATA_BYTES_MAX).enumerate() {
                    let at = offset + (i * DIFF_RECORD_DATA_BYTES_MAX) as u64;
                    w.record(b'w', &[&at.to_le_bytes(), piece]).map_err(io)?;
                    stats.data_bytes += piece.len() as u64;
                }
            }
        }
        done += batch.len() as u64;
        progress(done, total);
    }
    let records = w.records;
    w.record(b'e', &[&records.to_le_bytes()]).map_err(io)?;
    stats.records = w.records;
    w.out.flush().map_err(io)?;
    Ok(stats)
}

/// One record of a diff stream.
enum Record {
    From(String),
    To(String),
    Size(u64),
    Write(u64, Vec<u8>),
    Zero(u64, u64),
    End(u64),
}

fn bad(why: impl std::fmt::Display) -> ImageError {
    ImageError::Snapshot(format!("not a valid diff: {why}"))
}

/// Reads the next record (checked); None at the end of the stream.
fn next_record<R: Read>(input: &mut R) -> Result<Option<Record>, ImageError> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match input.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(bad("truncated record header")),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::Task(format!("reading the diff: {e}"))),
        }
    }
    let tag = head[0];
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > RECORD_BYTES_MAX {
        return Err(bad(format!("record of {len} bytes")));
    }
    let mut payload = vec![0u8; len + 4];
    input
        .read_exact(&mut payload)
        .map_err(|_| bad("truncated record"))?;
    let crc_at = payload.len() - 4;
    let want = u32::from_le_bytes([
        payload[crc_at],
        payload[crc_at + 1],
        payload[crc_at + 2],
        payload[crc_at + 3],
    ]);
    payload.truncate(crc_at);
    let crc = spindle_crc::crc32c_append(spindle_crc::crc32c(&head), &payload);
    if crc != want {
        return Err(bad(format!(
            "checksum mismatch in a '{}' record",
            char::from(tag).escape_default()
        )));
    }
    let u64_at = |p: &[u8], at: usize| -> Result<u64, ImageError> {
        p.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| bad("short record"))
    };
    let name = |p: Vec<u8>| -> Result<String, ImageError> {
        let s = String::from_utf8(p).map_err(|_| bad("snapshot name is not UTF-8"))?;
        crate::image::check_image_name(&s).map_err(|_| bad(format!("snapshot name {s:?}")))?;
        Ok(s)
    };
    Ok(Some(match tag {
        b'f' => Record::From(name(payload)?),
        b't' => Record::To(name(payload)?),
        b's' if len == 8 => Record::Size(u64_at(&payload, 0)?),
        b'w' if len > 8 => {
            let offset = u64_at(&payload, 0)?;
            payload.drain(..8);
            Record::Write(offset, payload)
        }
        b'z' if len == 16 => Record::Zero(u64_at(&payload, 0)?, u64_at(&payload, 8)?),
        b'e' if len == 8 => Record::End(u64_at(&payload, 0)?),
        other => {
            return Err(bad(format!(
                "unknown record '{}' of {len} bytes",
                char::from(other).escape_default()
            )))
        }
    }))
}

/// What a diff says, checked whole ([`check_diff`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiffSummary {
    pub from: Option<String>,
    pub to: Option<String>,
    pub size_bytes: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub records: u64,
}

/// Reads a diff stream record by record, checking each: magic, checksum and shape,
/// metadata before data, every range inside the size, the end record's count, nothing
/// after it. [`DiffReader::next_data`] yields the data records.
struct DiffReader<'r, R: Read> {
    input: &'r mut R,
    summary: DiffSummary,
    size: Option<u64>,
    ended: bool,
}

impl<'r, R: Read> DiffReader<'r, R> {
    fn new(input: &'r mut R) -> Result<Self, ImageError> {
        let mut magic = vec![0u8; DIFF_MAGIC.len()];
        input.read_exact(&mut magic).map_err(|_| bad("too short"))?;
        if magic != DIFF_MAGIC {
            return Err(bad("no `spindle diff v1` header"));
        }
        Ok(DiffReader {
            input,
            summary: DiffSummary::default(),
            size: None,
            ended: false,
        })
    }

    /// The next data record (`Write` or `Zero`); None after a valid end.
    fn next_data(&mut self) -> Result<Option<Record>, ImageError> {
        loop {
            let Some(r) = next_record(self.input)? else {
                if !self.ended {
                    return Err(bad("no end record (truncated?)"));
                }
                if self.size.is_none() {
                    return Err(bad("no size record"));
                }
                return Ok(None);
            };
            if self.ended {
                return Err(bad("records after the end record"));
            }
            let s = &mut self.summary;
            let out = match r {
                Record::From(n) if self.size.is_none() && s.from.is_none() => {
                    s.from = Some(n);
                    None
                }
                Record::To(n) if self.size.is_none() && s.to.is_none() => {
                    s.to = Some(n);
                    None
                }
                Record::Size(n) if self.size.is_none() => {
                    crate::image::check_size_bytes(n).map_err(bad)?;
                    self.size = Some(n);
                    s.size_bytes = n;
                    None
                }
                Record::End(n) => {
                    if n != s.records {
                        return Err(bad(format!(
                            "end record counts {n} records, the stream has {}",
                            s.records
                        )));
                    }
                    self.ended = true;
                    continue;
                }
                Record::Write(offset, data) => {
                    let size = self
                        .size
                        .ok_or_else(|| bad("data before the size record"))?;
                    if offset
                        .checked_add(data.len() as u64)
                        .is_none_or(|end| end > size)
                    {
                        return Err(bad(format!("write at {offset} past the size {size}")));
                    }
                    s.data_bytes += data.len() as u64;
                    Some(Record::Write(offset, data))
                }
                Record::Zero(offset, len) => {
                    let size = self
                        .size
                        .ok_or_else(|| bad("data before the size record"))?;
                    if offset.checked_add(len).is_none_or(|end| end > size) {
                        return Err(bad(format!("zeros at {offset}+{len} past the size {size}")));
                    }
                    s.zero_bytes += len;
                    Some(Record::Zero(offset, len))
                }
                _ => return Err(bad("metadata record out of place")),
            };
            s.records += 1;
            if out.is_some() {
                return Ok(out);
            }
        }
    }
}

/// Reads a whole diff stream and checks it (see [`DiffReader`]).
pub fn check_diff<R: Read>(input: &mut R) -> Result<DiffSummary, ImageError> {
    let mut r = DiffReader::new(input)?;
    while r.next_data()?.is_some() {}
    Ok(r.summary)
}

/// Applies a diff to image `image` (the caller holds its lock). `input` is read twice:
/// first checked whole ([`check_diff`]: a bad diff changes nothing), then applied. The
/// image must have the diff's from-snapshot and not yet its to-snapshot, which is taken
/// at the end. `progress(done_bytes, total_bytes)`.
pub async fn import_diff<R: Read + std::io::Seek>(
    client: &Arc<Client>,
    pool: &str,
    image: &str,
    input: &mut R,
    mut progress: impl FnMut(u64, u64) + Send,
) -> Result<DiffSummary, ImageError> {
    let summary = check_diff(input)?;
    let img = Image::open(client.clone(), pool, image).await?;
    let snaps = client.image_snaps(pool, image).unwrap_or_default();
    if let Some(f) = &summary.from {
        if snaps.by_name(f).is_none() {
            return Err(ImageError::Snapshot(format!(
                "the diff starts at snapshot {f}, which {image} does not have \
                 (apply the diffs of a chain in order)"
            )));
        }
    }
    if let Some(t) = &summary.to {
        if snaps.by_name(t).is_some() {
            return Err(ImageError::Snapshot(format!(
                "{image} already has snapshot {t}, where the diff ends"
            )));
        }
    }
    input
        .seek(std::io::SeekFrom::Start(0))
        .map_err(|e| ImageError::Task(format!("rewinding the diff: {e}")))?;
    if img.size_bytes() != summary.size_bytes {
        img.resize(summary.size_bytes).await?;
    }
    let total = summary.data_bytes + summary.zero_bytes;
    let mut done = 0u64;
    progress(0, total);
    // Records are applied in batches, in parallel within a batch (the extents of one
    // diff never overlap), read as they go (the stream is checked again on the way).
    let mut reader = DiffReader::new(input)?;
    loop {
        let mut batch = Vec::new();
        let mut batch_bytes = 0u64;
        while batch.len() < PARALLEL_OPS_MAX && batch_bytes < 16 << 20 {
            match reader.next_data()? {
                None => break,
                Some(r) => {
                    batch_bytes += match &r {
                        Record::Write(_, d) => d.len() as u64,
                        Record::Zero(_, l) => *l,
                        _ => 0,
                    };
                    batch.push(r);
                }
            }
        }
        if batch.is_empty() {
            break;
        }
        let jobs = batch.into_iter().map(|r| {
            let img = &img;
            async move {
                match r {
                    Record::Write(offset, data) => img.write_owned(offset, data).await,
                    Record::Zero(offset, len) => img.write_zeroes(offset, len).await,
                    _ => Ok(()),
                }
            }
        });
        for r in futures::future::join_all(jobs).await {
            r?;
        }
        done += batch_bytes;
        progress(done, total);
    }
    img.flush().await?;
    if let Some(t) = &summary.to {
        crate::snap::create(client, pool, image, t).await?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(records: &[(u8, Vec<u8>)], end: bool) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(DIFF_MAGIC);
        let mut w = RecordWriter {
            out: &mut out,
            records: 0,
        };
        for (tag, payload) in records {
            w.record(*tag, &[payload]).unwrap();
        }
        if end {
            let n = w.records;
            w.record(b'e', &[&n.to_le_bytes()]).unwrap();
        }
        out
    }

    fn good() -> Vec<(u8, Vec<u8>)> {
        let mut w = 4096u64.to_le_bytes().to_vec();
        w.extend_from_slice(&[7; 100]);
        let z = [8192u64.to_le_bytes(), 4096u64.to_le_bytes()].concat();
        vec![
            (b'f', b"s1".to_vec()),
            (b't', b"s2".to_vec()),
            (b's', (1u64 << 20).to_le_bytes().to_vec()),
            (b'w', w),
            (b'z', z),
        ]
    }

    #[test]
    fn a_good_diff_checks() {
        let s = check_diff(&mut &stream(&good(), true)[..]).unwrap();
        assert_eq!(s.from.as_deref(), Some("s1"));
        assert_eq!(s.to.as_deref(), Some("s2"));
        assert_eq!(
            (s.size_bytes, s.data_bytes, s.zero_bytes, s.records),
            (1 << 20, 100, 4096, 5)
        );
    }

    #[test]
    fn every_damage_is_refused() {
        let bytes = stream(&good(), true);
        // Truncated anywhere.
        for cut in 0..bytes.len() {
            assert!(check_diff(&mut &bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Any single flipped bit.
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            assert!(check_diff(&mut &b[..]).is_err(), "flip at {at}");
        }
        // Trailing garbage, a missing end, data past the size, data before the size,
        // a wrong count.
        let mut tail = bytes.clone();
        tail.extend_from_slice(&bytes[DIFF_MAGIC.len()..DIFF_MAGIC.len() + 20]);
        assert!(check_diff(&mut &tail[..]).is_err());
        assert!(check_diff(&mut &stream(&good(), false)[..]).is_err());
        let mut past = good();
        past[3].1[..8].copy_from_slice(&((1u64 << 20) - 50).to_le_bytes());
        assert!(check_diff(&mut &stream(&past, true)[..]).is_err());
        let mut early = good();
        early.swap(2, 3);
        assert!(check_diff(&mut &stream(&early, true)[..]).is_err());
        let mut wrong = stream(&good(), false);
        let mut w = RecordWriter {
            out: &mut wrong,
            records: 0,
        };
        w.record(b'e', &[&9u64.to_le_bytes()]).unwrap();
        assert!(check_diff(&mut &wrong[..]).is_err());
    }

    #[test]
    fn zero_blocks_merge_into_runs() {
        let changes = vec![
            (0u64, None),
            (4096, None),
            (8192, Some(vec![1u8; 4096])),
            (12288, Some(vec![2u8; 100])),
            (16384, None),
        ];
        // The last zero block is cut at the end (16384 + 1000).
        let e = extents_of(&changes, 17384);
        assert_eq!(
            e,
            vec![
                Extent {
                    offset: 0,
                    len: 8192,
                    zero: true
                },
                Extent {
                    offset: 8192,
                    len: 4196,
                    zero: false
                },
                Extent {
                    offset: 16384,
                    len: 1000,
                    zero: true
                },
            ]
        );
    }
}
