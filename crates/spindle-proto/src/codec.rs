//! Bounds-checked little-endian field encoding for message bodies.
//!
//! Invariant: [`Reader`] never panics and never allocates more than the bytes it was given
//! (lengths are checked against what is left before anything is allocated).

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
#[non_exhaustive]
pub enum CodecError {
    #[error("message truncated: needed {needed} more bytes for {what}")]
    Truncated { what: &'static str, needed: usize },
    #[error("{what}: length {len} exceeds {max}")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{what} is not valid UTF-8")]
    BadUtf8 { what: &'static str },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("invalid {what}: {value}")]
    Invalid { what: &'static str, value: u64 },
}

/// Appends fields to a byte vector.
#[derive(Debug, Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.u32(v as u32)
    }
    /// A u32 length followed by the bytes.
    ///
    /// # Panics
    /// If `v` is 4 GiB or longer.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).expect("field below 4 GiB"));
        self.bytes.extend_from_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// Reads fields from a byte slice.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CodecError> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(CodecError::Truncated {
                what,
                needed: n - left,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, CodecError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, CodecError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, CodecError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn i32(&mut self, what: &'static str) -> Result<i32, CodecError> {
        Ok(self.u32(what)? as i32)
    }
    /// A length-prefixed byte field of at most `max_len` bytes, borrowed from the input.
    pub fn bytes(&mut self, what: &'static str, max_len: usize) -> Result<&'a [u8], CodecError> {
        let len = self.u32(what)? as usize;
        if len > max_len {
            return Err(CodecError::TooLong {
                what,
                len: len as u64,
                max: max_len as u64,
            });
        }
        self.take(len, what)
    }
    pub fn str(&mut self, what: &'static str, max_len: usize) -> Result<&'a str, CodecError> {
        std::str::from_utf8(self.bytes(what, max_len)?).map_err(|_| CodecError::BadUtf8 { what })
    }
    /// Errors unless every byte was consumed (a message with extra bytes is malformed).
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    pub fn finish(self) -> Result<(), CodecError> {
        match self.bytes.len() - self.pos {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }
}
