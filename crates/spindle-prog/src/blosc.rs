//! A decoder of Blosc 1 frames (the `blosc` codec of Zarr v2 and v3, through numcodecs'
//! bundled c-blosc 1.x), so that reductions decode such chunks next to the data.
//!
//! Written from the format's description (c-blosc's `README_CHUNK_FORMAT.rst`, read with
//! its `blosc_d`): a 16-byte header, then either the buffer as it is (`MEMCPYED`) or one
//! start offset per block and the blocks. A block is one stream, or `typesize` streams
//! ("splits") of equal length; each stream is stored as it is when its compressed length
//! equals its decoded length. A block is then byte- or bit-unshuffled.
//!
//! Inner codecs decoded: lz4 and lz4hc (`lz4_flex`), zlib (`miniz_oxide`) and zstd
//! (libzstd). blosclz and snappy are refused with [`BloscError::Codec`]; callers decode
//! those chunks elsewhere (the client).
//!
//! Every length is checked against the input and the destination before it is used: a
//! corrupt or hostile frame gives an error, never a read or write out of bounds.

/// The header's length, and where a copied (`MEMCPYED`) buffer starts.
const HEADER_BYTES: usize = 16;
/// Blocks of fewer elements than this are never split (`MIN_BUFFERSIZE` in c-blosc).
const SPLIT_ELEMENTS_MIN: usize = 128;
/// Blocks of elements larger than this are never split (`MAX_SPLITS` in c-blosc).
const SPLIT_TYPESIZE_MAX: usize = 16;

const FLAG_SHUFFLE: u8 = 0x01;
const FLAG_MEMCPYED: u8 = 0x02;
const FLAG_BITSHUFFLE: u8 = 0x04;
/// Bit 3 is not used by Blosc 1 (Blosc 2's delta filter): a frame with it is refused.
const FLAG_RESERVED: u8 = 0x08;
const FLAG_DONT_SPLIT: u8 = 0x10;

/// The inner codec, bits 5-7 of the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inner {
    BloscLz,
    Lz4,
    Snappy,
    Zlib,
    Zstd,
}

impl Inner {
    fn of(flags: u8) -> Result<Inner, BloscError> {
        Ok(match flags >> 5 {
            0 => Inner::BloscLz,
            1 => Inner::Lz4,
            2 => Inner::Snappy,
            3 => Inner::Zlib,
            4 => Inner::Zstd,
            n => return Err(BloscError::Corrupt(format!("unknown inner codec {n}"))),
        })
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BloscError {
    #[error("blosc: {0}")]
    Corrupt(String),
    #[error("blosc: inner codec {0:?} is not decoded next to the data")]
    Codec(Inner),
    #[error("blosc: the decoded buffer is {need} bytes, room for {room}")]
    TooLarge { need: usize, room: usize },
}

/// The parts of a frame's header a caller may want before decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub flags: u8,
    pub typesize: usize,
    pub decoded_bytes: usize,
    pub block_bytes: usize,
    pub frame_bytes: usize,
}

fn le32(b: &[u8], at: usize) -> Result<usize, BloscError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
        .ok_or_else(|| BloscError::Corrupt(format!("truncated at byte {at}")))
}

/// Reads and checks a frame's header.
pub fn header(src: &[u8]) -> Result<Header, BloscError> {
    if src.len() < HEADER_BYTES {
        return Err(BloscError::Corrupt(format!(
            "{} bytes, shorter than the header",
            src.len()
        )));
    }
    let h = Header {
        flags: src[2],
        typesize: usize::from(src[3]),
        decoded_bytes: le32(src, 4)?,
        block_bytes: le32(src, 8)?,
        frame_bytes: le32(src, 12)?,
    };
    // Blosc 1 writes versions 1 and 2; Blosc 2 frames (3 and up) have another header
    // layout, and decoding them as Blosc 1 would give wrong bytes, not an error.
    if !(1..=2).contains(&src[0]) {
        return Err(BloscError::Corrupt(format!(
            "format version {} (Blosc 1 frames are versions 1 and 2)",
            src[0]
        )));
    }
    if h.flags & FLAG_RESERVED != 0 {
        return Err(BloscError::Corrupt(format!("flags {:#04x}", h.flags)));
    }
    if h.typesize == 0 {
        return Err(BloscError::Corrupt("type size 0".into()));
    }
    if h.frame_bytes > src.len() || h.frame_bytes < HEADER_BYTES {
        return Err(BloscError::Corrupt(format!(
            "the header says {} bytes, the frame has {}",
            h.frame_bytes,
            src.len()
        )));
    }
    if h.decoded_bytes > 0 && h.block_bytes == 0 {
        return Err(BloscError::Corrupt("block size 0".into()));
    }
    Inner::of(h.flags)?;
    Ok(h)
}

/// Decodes the frame at the start of `src` into `dst`; returns the decoded length.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, BloscError> {
    let h = header(src)?;
    let src = &src[..h.frame_bytes];
    let n = h.decoded_bytes;
    if n > dst.len() {
        return Err(BloscError::TooLarge {
            need: n,
            room: dst.len(),
        });
    }
    let dst = &mut dst[..n];
    if n == 0 {
        return Ok(0);
    }
    if h.flags & FLAG_MEMCPYED != 0 {
        let body = src.get(HEADER_BYTES..HEADER_BYTES + n).ok_or_else(|| {
            BloscError::Corrupt(format!("a copied buffer of {n} bytes cut short"))
        })?;
        dst.copy_from_slice(body);
        return Ok(n);
    }
    let inner = Inner::of(h.flags)?;
    if matches!(inner, Inner::BloscLz | Inner::Snappy) {
        return Err(BloscError::Codec(inner));
    }
    let blocks = n.div_ceil(h.block_bytes);
    let shuffle = h.flags & FLAG_SHUFFLE != 0 && h.typesize > 1;
    let bitshuffle = h.flags & FLAG_BITSHUFFLE != 0;
    // At most the decoded length (which the caller's room bounds), whatever the header's
    // block size says.
    let block_room = h.block_bytes.min(n);
    let mut tmp = vec![0u8; if shuffle || bitshuffle { block_room } else { 0 }];
    for b in 0..blocks {
        let at = b * h.block_bytes;
        let len = h.block_bytes.min(n - at);
        let start = le32(src, HEADER_BYTES + 4 * b)?;
        let out = &mut dst[at..at + len];
        let bitshuffled = bitshuffle && len >= h.typesize;
        if shuffle || bitshuffled {
            let t = &mut tmp[..len];
            block(src, start, t, &h, inner, len < h.block_bytes)?;
            if shuffle {
                unshuffle(t, out, h.typesize);
            } else {
                bit_unshuffle(t, out, h.typesize);
            }
        } else {
            block(src, start, out, &h, inner, len < h.block_bytes)?;
        }
    }
    Ok(n)
}

/// Decodes one block's streams, starting at byte `start` of the frame, into `out`.
fn block(
    src: &[u8],
    mut start: usize,
    out: &mut [u8],
    h: &Header,
    inner: Inner,
    leftover: bool,
) -> Result<(), BloscError> {
    let splits = if h.flags & FLAG_DONT_SPLIT == 0
        && h.typesize <= SPLIT_TYPESIZE_MAX
        && out.len() / h.typesize >= SPLIT_ELEMENTS_MIN
        && !leftover
    {
        h.typesize
    } else {
        1
    };
    let stream_bytes = out.len() / splits;
    // `splits` divides a block that is not the leftover one: the block size is a multiple
    // of the type size when split (c-blosc makes it so); refuse a frame where it is not.
    if stream_bytes * splits != out.len() {
        return Err(BloscError::Corrupt(format!(
            "a block of {} bytes in {splits} streams",
            out.len()
        )));
    }
    for part in out.chunks_exact_mut(stream_bytes) {
        let stored = le32(src, start)?;
        start += 4;
        let body = src.get(start..start + stored).ok_or_else(|| {
            BloscError::Corrupt(format!(
                "a stream of {stored} bytes at byte {start} cut short"
            ))
        })?;
        start += stored;
        if stored == stream_bytes {
            part.copy_from_slice(body);
            continue;
        }
        let got = match inner {
            Inner::Lz4 => lz4_flex::block::decompress_into(body, part)
                .map_err(|e| BloscError::Corrupt(format!("lz4: {e}")))?,
            Inner::Zlib => miniz_oxide::inflate::decompress_slice_iter_to_slice(
                part,
                std::iter::once(body),
                true,
                false,
            )
            .map_err(|e| BloscError::Corrupt(format!("zlib: {e:?}")))?,
            Inner::Zstd => zstd::bulk::decompress_to_buffer(body, part)
                .map_err(|e| BloscError::Corrupt(format!("zstd: {e}")))?,
            Inner::BloscLz | Inner::Snappy => return Err(BloscError::Codec(inner)),
        };
        if got != stream_bytes {
            return Err(BloscError::Corrupt(format!(
                "a stream decoded to {got} bytes, not {stream_bytes}"
            )));
        }
    }
    Ok(())
}

/// Byte unshuffle: `src` holds byte 0 of every element, then byte 1 of every element, and
/// so on; bytes past the last whole element are as they are.
fn unshuffle(src: &[u8], dst: &mut [u8], typesize: usize) {
    debug_assert_eq!(src.len(), dst.len());
    let elements = src.len() / typesize;
    let whole = elements * typesize;
    for i in 0..typesize {
        let plane = &src[i * elements..(i + 1) * elements];
        for (j, &v) in plane.iter().enumerate() {
            dst[j * typesize + i] = v;
        }
    }
    dst[whole..].copy_from_slice(&src[whole..]);
}

/// Bit unshuffle (the bitshuffle library's layout, as Blosc uses it): for byte `j` and bit
/// `k` of an element, a row of `elements / 8` bytes whose byte `b`, bit `m` is that bit of
/// element `8 b + m`, rows in order of `8 j + k`. Only a whole number of 8-element groups
/// is shuffled; otherwise the block is stored as it is. Bytes past the last whole element
/// are as they are.
fn bit_unshuffle(src: &[u8], dst: &mut [u8], typesize: usize) {
    debug_assert_eq!(src.len(), dst.len());
    let elements = src.len() / typesize;
    if !elements.is_multiple_of(8) {
        dst.copy_from_slice(src);
        return;
    }
    let whole = elements * typesize;
    dst[..whole].fill(0);
    let row_bytes = elements / 8;
    for j in 0..typesize {
        for k in 0..8 {
            let row = &src[(8 * j + k) * row_bytes..(8 * j + k + 1) * row_bytes];
            for (b, &bits) in row.iter().enumerate() {
                if bits == 0 {
                    continue;
                }
                for m in 0..8 {
                    let bit = (bits >> m) & 1;
                    dst[(8 * b + m) * typesize + j] |= bit << k;
                }
            }
        }
    }
    dst[whole..].copy_from_slice(&src[whole..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame built by hand: header, block starts, then each block's streams stored as
    /// they are (so no inner codec is needed to build it).
    fn stored_frame(data: &[u8], typesize: usize, block_bytes: usize, flags: u8) -> Vec<u8> {
        let blocks = data.len().div_ceil(block_bytes);
        let mut f = vec![2u8, 1, flags | (1 << 5), typesize as u8];
        f.extend((data.len() as u32).to_le_bytes());
        f.extend((block_bytes as u32).to_le_bytes());
        f.extend(0u32.to_le_bytes());
        let starts_at = f.len();
        f.resize(starts_at + 4 * blocks, 0);
        for (b, chunk) in data.chunks(block_bytes).enumerate() {
            let start = f.len() as u32;
            f[starts_at + 4 * b..starts_at + 4 * b + 4].copy_from_slice(&start.to_le_bytes());
            f.extend((chunk.len() as u32).to_le_bytes());
            f.extend(chunk);
        }
        let total = f.len() as u32;
        f[12..16].copy_from_slice(&total.to_le_bytes());
        f
    }

    #[test]
    fn stored_blocks_and_copied_buffers_decode() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let f = stored_frame(&data, 1, 256, FLAG_DONT_SPLIT);
        let mut out = vec![0u8; 1000];
        assert_eq!(decompress(&f, &mut out), Ok(1000));
        assert_eq!(out, data);
        // A Blosc 2 frame's version is refused.
        let mut v3 = f.clone();
        v3[0] = 3;
        assert!(
            matches!(decompress(&v3, &mut out), Err(BloscError::Corrupt(m)) if m.contains("version 3"))
        );
        // Too little room.
        let mut small = vec![0u8; 999];
        assert!(matches!(
            decompress(&f, &mut small),
            Err(BloscError::TooLarge {
                need: 1000,
                room: 999
            })
        ));
        // A copied buffer.
        let mut c = vec![2u8, 1, FLAG_MEMCPYED, 4];
        c.extend(8u32.to_le_bytes());
        c.extend(8u32.to_le_bytes());
        c.extend(24u32.to_le_bytes());
        c.extend(1u64.to_le_bytes());
        let mut out = vec![0u8; 8];
        assert_eq!(decompress(&c, &mut out), Ok(8));
        assert_eq!(out, 1u64.to_le_bytes());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let f = stored_frame(&data, 4, 1024, FLAG_DONT_SPLIT | FLAG_SHUFFLE);
        let mut out = vec![0u8; 4096];
        assert!(decompress(&f, &mut out).is_ok());
        for cut in 0..f.len() {
            assert!(decompress(&f[..cut], &mut out).is_err(), "cut at {cut}");
        }
        for at in 0..f.len() {
            for v in [0u8, 0x7f, 0xff] {
                let mut g = f.clone();
                g[at] = v;
                // Any answer but a panic; a changed data byte decodes to changed data.
                let _ = decompress(&g, &mut out);
            }
        }
    }

    #[test]
    fn unshuffles_invert_their_shuffles() {
        for typesize in [1usize, 2, 4, 8, 3] {
            for len in [0usize, 7, 8, 64, 100, 1024 + 5] {
                let plain: Vec<u8> = (0..len).map(|i| (i * 131 + 17) as u8).collect();
                // Byte shuffle, by its definition.
                let elements = len / typesize;
                let mut shuffled = plain.clone();
                for j in 0..elements {
                    for i in 0..typesize {
                        shuffled[i * elements + j] = plain[j * typesize + i];
                    }
                }
                let mut out = vec![0u8; len];
                unshuffle(&shuffled, &mut out, typesize);
                assert_eq!(out, plain, "typesize {typesize} len {len}");
                // Bit shuffle, by its definition.
                let mut bits = plain.clone();
                if elements.is_multiple_of(8) {
                    bits[..elements * typesize].fill(0);
                    for e in 0..elements {
                        for j in 0..typesize {
                            for k in 0..8 {
                                let bit = (plain[e * typesize + j] >> k) & 1;
                                let row = 8 * j + k;
                                bits[row * (elements / 8) + e / 8] |= bit << (e % 8);
                            }
                        }
                    }
                }
                bit_unshuffle(&bits, &mut out, typesize);
                assert_eq!(out, plain, "bits: typesize {typesize} len {len}");
            }
        }
    }

    #[test]
    fn split_streams_and_inner_codecs_decode() {
        // One block of 4-byte elements, split into 4 streams, each lz4-compressed.
        let plain: Vec<u8> = (0..4096u32).flat_map(|i| (i / 3).to_le_bytes()).collect();
        let typesize = 4;
        let elements = plain.len() / typesize;
        let mut shuffled = vec![0u8; plain.len()];
        for j in 0..elements {
            for i in 0..typesize {
                shuffled[i * elements + j] = plain[j * typesize + i];
            }
        }
        for inner in [Inner::Lz4, Inner::Zlib, Inner::Zstd] {
            let code: u8 = match inner {
                Inner::Lz4 => 1,
                Inner::Zlib => 3,
                _ => 4,
            };
            let mut f = vec![2u8, 1, FLAG_SHUFFLE | (code << 5), typesize as u8];
            f.extend((plain.len() as u32).to_le_bytes());
            f.extend((plain.len() as u32).to_le_bytes());
            f.extend(0u32.to_le_bytes());
            f.extend(20u32.to_le_bytes());
            for stream in shuffled.chunks(elements) {
                let c = match inner {
                    Inner::Lz4 => lz4_flex::block::compress(stream),
                    Inner::Zlib => miniz_oxide::deflate::compress_to_vec_zlib(stream, 6),
                    _ => zstd::bulk::compress(stream, 3).unwrap(),
                };
                assert!(c.len() < stream.len());
                f.extend((c.len() as u32).to_le_bytes());
                f.extend(c);
            }
            let total = f.len() as u32;
            f[12..16].copy_from_slice(&total.to_le_bytes());
            let mut out = vec![0u8; plain.len()];
            assert_eq!(decompress(&f, &mut out), Ok(plain.len()), "{inner:?}");
            assert_eq!(out, plain, "{inner:?}");
            // A damaged stream is an error.
            let mut g = f.clone();
            let last = g.len() - 3;
            g[last] ^= 0x55;
            let _ = decompress(&g, &mut out);
        }
        // blosclz is refused by name.
        let mut f = stored_frame(&plain, 1, 1 << 20, FLAG_DONT_SPLIT);
        f[2] &= 0x1f;
        let mut out = vec![0u8; plain.len()];
        assert_eq!(
            decompress(&f, &mut out),
            Err(BloscError::Codec(Inner::BloscLz))
        );
    }
}
