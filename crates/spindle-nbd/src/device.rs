//! The device-side traits the server is generic over, and an in-memory implementation.
//!
//! Invariants the server guarantees to a [`BlockDevice`]: every call it makes has
//! `offset + len <= size_bytes()` (checked before the call, overflow-safe), `read`/`write`
//! lengths are `<= ServerConfig::max_request_bytes`, and `write` data has exactly the
//! length the client announced. A device must return exactly `len` bytes from `read`;
//! anything else is reported to the client as `EIO`.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::proto;

/// Error a device returns; mapped to the NBD errno on the wire.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// -> `EIO`
    #[error("I/O error: {0}")]
    Io(String),
    /// -> `EINVAL`
    #[error("invalid request: {0}")]
    Invalid(String),
    /// -> `ENOSPC`
    #[error("no space: {0}")]
    NoSpace(String),
    /// -> `EPERM`
    #[error("not permitted: {0}")]
    NotPermitted(String),
}

impl DeviceError {
    /// The NBD error value sent on the wire for this error.
    pub fn errno(&self) -> u32 {
        match self {
            DeviceError::Io(_) => proto::NBD_EIO,
            DeviceError::Invalid(_) => proto::NBD_EINVAL,
            DeviceError::NoSpace(_) => proto::NBD_ENOSPC,
            DeviceError::NotPermitted(_) => proto::NBD_EPERM,
        }
    }
}

/// A byte-addressed device exported over NBD. Calls may run concurrently.
pub trait BlockDevice: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    /// Whether FLUSH on one connection covers writes completed on every other connection
    /// to this device (advertise `NBD_FLAG_CAN_MULTI_CONN` only if true).
    fn multi_conn_consistent(&self) -> bool;
    /// A read-only device (advertised with `NBD_FLAG_READ_ONLY`; the device refuses
    /// writes itself too).
    fn read_only(&self) -> bool {
        false
    }
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<u8>, DeviceError>> + Send;
    /// [`BlockDevice::read`] as buffers sent one after another (the server uses this one):
    /// a device that assembles a read from several buffers need not copy them into one.
    fn read_pieces(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<Bytes>, DeviceError>> + Send {
        async move { self.read(offset, len).await.map(|v| vec![Bytes::from(v)]) }
    }
    /// `fua`: the data must be durable before the future completes.
    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> impl Future<Output = Result<(), DeviceError>> + Send;
    /// Makes every write that completed before this call durable.
    fn flush(&self) -> impl Future<Output = Result<(), DeviceError>> + Send;
    /// Discards a range; reads of it afterwards return zeros.
    fn trim(&self, offset: u64, len: u32) -> impl Future<Output = Result<(), DeviceError>> + Send;
    /// Zeroes a range; `may_trim` = the device may deallocate it (no `NO_HOLE` flag).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_trim: bool,
        fua: bool,
    ) -> impl Future<Output = Result<(), DeviceError>> + Send;
}

/// One export as shown by `NBD_OPT_LIST` / `NBD_INFO_DESCRIPTION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub size_bytes: u64,
    pub description: String,
}

/// The set of exports a server offers.
pub trait Exports: Send + Sync + 'static {
    type Device: BlockDevice;
    fn list(&self) -> impl Future<Output = Result<Vec<ExportInfo>, DeviceError>> + Send;
    /// Opens the named export ("" = the default export, if any). Err(Invalid) = unknown export.
    fn open(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Arc<Self::Device>, DeviceError>> + Send;
}

/// Chunk granularity of [`MemoryDevice`]: untouched or fully zeroed chunks use no memory.
const CHUNK_BYTES: u64 = 64 * 1024;

/// A sparse in-memory [`BlockDevice`]: a map of 64 KiB chunks; absent chunks read as zeros.
/// Used by tests and examples. FLUSH is a no-op (memory is the "stable" medium), so it is
/// multi-connection consistent.
pub struct MemoryDevice {
    size_bytes: u64,
    /// Chunk index -> chunk contents (always exactly `CHUNK_BYTES` long).
    chunks: RwLock<BTreeMap<u64, Box<[u8]>>>,
    flushes: AtomicU64,
}

impl MemoryDevice {
    pub fn new(size_bytes: u64) -> Self {
        MemoryDevice {
            size_bytes,
            chunks: RwLock::new(BTreeMap::new()),
            flushes: AtomicU64::new(0),
        }
    }

    /// Number of `flush` calls served so far.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Number of allocated 64 KiB chunks (shows that trim/zeroing deallocates).
    pub fn allocated_chunks(&self) -> usize {
        self.chunks.read().map(|c| c.len()).unwrap_or(0)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(DeviceError::Invalid(format!(
                "range {offset}+{len} beyond device size {}",
                self.size_bytes
            ))),
        }
    }

    /// Synchronous read of `[offset, offset+len)`.
    pub fn read_sync(&self, offset: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        self.check(offset, len)?;
        let chunks = self
            .chunks
            .read()
            .map_err(|_| DeviceError::Io("lock poisoned".into()))?;
        let len_usize = usize::try_from(len).map_err(|_| DeviceError::Invalid("len".into()))?;
        let mut out = vec![0u8; len_usize];
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let idx = abs / CHUNK_BYTES;
            let within = abs % CHUNK_BYTES;
            let n = (CHUNK_BYTES - within).min(len - pos);
            if let Some(c) = chunks.get(&idx) {
                out[pos as usize..(pos + n) as usize]
                    .copy_from_slice(&c[within as usize..(within + n) as usize]);
            }
            pos += n;
        }
        Ok(out)
    }

    /// Synchronous write; `None` data = write zeros (deallocating whole chunks).
    pub fn write_sync(
        &self,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<(), DeviceError> {
        self.check(offset, len)?;
        let mut chunks = self
            .chunks
            .write()
            .map_err(|_| DeviceError::Io("lock poisoned".into()))?;
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let idx = abs / CHUNK_BYTES;
            let within = abs % CHUNK_BYTES;
            let n = (CHUNK_BYTES - within).min(len - pos);
            match data {
                Some(d) => {
                    let c = chunks
                        .entry(idx)
                        .or_insert_with(|| vec![0u8; CHUNK_BYTES as usize].into_boxed_slice());
                    c[within as usize..(within + n) as usize]
                        .copy_from_slice(&d[pos as usize..(pos + n) as usize]);
                }
                None if n == CHUNK_BYTES => {
                    chunks.remove(&idx);
                }
                None => {
                    if let Some(c) = chunks.get_mut(&idx) {
                        c[within as usize..(within + n) as usize].fill(0);
                    }
                }
            }
            pos += n;
        }
        Ok(())
    }
}

impl BlockDevice for MemoryDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn multi_conn_consistent(&self) -> bool {
        true
    }
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Vec<u8>, DeviceError>> + Send {
        std::future::ready(self.read_sync(offset, u64::from(len)))
    }
    fn write(
        &self,
        offset: u64,
        data: Vec<u8>,
        _fua: bool,
    ) -> impl Future<Output = Result<(), DeviceError>> + Send {
        std::future::ready(self.write_sync(offset, data.len() as u64, Some(&data)))
    }
    fn flush(&self) -> impl Future<Output = Result<(), DeviceError>> + Send {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }
    fn trim(&self, offset: u64, len: u32) -> impl Future<Output = Result<(), DeviceError>> + Send {
        std::future::ready(self.write_sync(offset, u64::from(len), None))
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _may_trim: bool,
        _fua: bool,
    ) -> impl Future<Output = Result<(), DeviceError>> + Send {
        // Zeroed memory is never "allocated" differently, so NO_HOLE changes nothing here.
        std::future::ready(self.write_sync(offset, u64::from(len), None))
    }
}

/// A map name -> [`MemoryDevice`], with an optional default export for the name "".
#[derive(Default)]
pub struct MemoryExports {
    inner: RwLock<MemoryExportsInner>,
}

#[derive(Default)]
struct MemoryExportsInner {
    exports: BTreeMap<String, (String, Arc<MemoryDevice>)>,
    default: Option<String>,
}

impl MemoryExports {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) an export.
    pub fn insert(&self, name: &str, description: &str, device: Arc<MemoryDevice>) {
        if let Ok(mut g) = self.inner.write() {
            g.exports
                .insert(name.to_string(), (description.to_string(), device));
        }
    }

    /// Makes `name` the export opened by the empty name "".
    pub fn set_default(&self, name: &str) {
        if let Ok(mut g) = self.inner.write() {
            g.default = Some(name.to_string());
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<MemoryDevice>> {
        let g = self.inner.read().ok()?;
        let name = match (name, &g.default) {
            ("", Some(d)) if !g.exports.contains_key("") => d.as_str(),
            _ => name,
        };
        g.exports.get(name).map(|(_, d)| d.clone())
    }
}

impl Exports for MemoryExports {
    type Device = MemoryDevice;

    fn list(&self) -> impl Future<Output = Result<Vec<ExportInfo>, DeviceError>> + Send {
        let r = match self.inner.read() {
            Ok(g) => Ok(g
                .exports
                .iter()
                .map(|(name, (description, dev))| ExportInfo {
                    name: name.clone(),
                    size_bytes: dev.size_bytes(),
                    description: description.clone(),
                })
                .collect()),
            Err(_) => Err(DeviceError::Io("lock poisoned".into())),
        };
        std::future::ready(r)
    }

    fn open(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Arc<MemoryDevice>, DeviceError>> + Send {
        let r = self
            .get(name)
            .ok_or_else(|| DeviceError::Invalid(format!("unknown export {name:?}")));
        std::future::ready(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_device_sparse_roundtrip() {
        let d = MemoryDevice::new(4 * CHUNK_BYTES + 100);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        d.write_sync(1000, data.len() as u64, Some(&data)).unwrap();
        assert_eq!(d.read_sync(1000, data.len() as u64).unwrap(), data);
        assert_eq!(d.read_sync(0, 1000).unwrap(), vec![0; 1000]);
        d.write_sync(CHUNK_BYTES, CHUNK_BYTES, None).unwrap();
        assert_eq!(
            d.read_sync(CHUNK_BYTES, CHUNK_BYTES).unwrap(),
            vec![0; CHUNK_BYTES as usize]
        );
        assert_eq!(d.allocated_chunks(), 3); // chunks 0..=3 written, chunk 1 zeroed
        assert!(d.read_sync(4 * CHUNK_BYTES, 101).is_err());
        assert!(d.read_sync(u64::MAX, 2).is_err());
    }
}
