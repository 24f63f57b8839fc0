//! A bounded cache of open data-file descriptors.
//!
//! A store may hold far more data files than a process may keep open (a 4 GiB image is
//! 1,024 objects per daemon, a 1 TiB one 262,144). Descriptors are opened on first use
//! and kept; when the cache is full, one entry is dropped to make room (an arbitrary one:
//! the map's hash order has nothing to do with the access order, so this behaves like
//! random replacement, which for random access over more files than fit is as good as
//! LRU and costs no bookkeeping). The previous rule, "drop everything when full", made
//! every access miss for a while after each overflow: with 1,024 files and 512 slots, a
//! random 4 KiB write workload spent 3% of the machine in `open`.
//!
//! The capacity comes from the process's open-file limit (`default_entries`): a store
//! has two caches (buffered and O_DIRECT descriptors), so each takes at most a third of
//! what the limit leaves after a reserve for sockets, the journal and the database.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use crate::disk::FileRef;

/// Descriptors kept aside for everything that is not a cached data file (sockets,
/// journal, database, io_uring, standard streams).
const RESERVED_FDS: u64 = 256;
/// Fewest entries a cache gets, whatever the limit (the limit must then be raised).
const ENTRIES_MIN: usize = 16;
/// Most entries a cache gets, however high the limit.
const ENTRIES_MAX: usize = 16 << 10;

/// Entries per descriptor cache for the current open-file limit (`RLIMIT_NOFILE` soft
/// limit; `spindle` raises it to the hard limit at start).
pub fn default_entries() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid `rlimit` for the call to write.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let soft = if rc == 0 { lim.rlim_cur } else { 1024 };
    entries_for_limit(soft)
}

fn entries_for_limit(soft_limit: u64) -> usize {
    let spare = soft_limit.saturating_sub(RESERVED_FDS) / 3;
    usize::try_from(spare)
        .unwrap_or(ENTRIES_MAX)
        .clamp(ENTRIES_MIN, ENTRIES_MAX)
}

pub(crate) struct FdCache {
    files: Mutex<HashMap<u64, FileRef>>,
    capacity: usize,
}

impl FdCache {
    pub fn new(capacity: usize) -> FdCache {
        let capacity = capacity.max(1);
        FdCache {
            files: Mutex::new(HashMap::with_capacity(capacity.min(4096))),
            capacity,
        }
    }

    /// The cached descriptor of file `id`, or the one `open` returns (then cached).
    pub fn get_or_open(
        &self,
        id: u64,
        open: impl FnOnce() -> io::Result<FileRef>,
    ) -> io::Result<FileRef> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = files.get(&id) {
            return Ok(f.clone());
        }
        let f = open()?;
        if files.len() >= self.capacity {
            // Users holding the evicted `Arc` keep the descriptor until they are done.
            if let Some(&victim) = files.keys().next() {
                files.remove(&victim);
            }
        }
        files.insert(id, f.clone());
        debug_assert!(files.len() <= self.capacity);
        Ok(f)
    }

    pub fn remove(&self, id: u64) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        files.remove(&id);
    }

    #[cfg(test)]
    fn contains(&self, id: u64) -> bool {
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn dev_null() -> io::Result<FileRef> {
        Ok(std::sync::Arc::new(std::fs::File::open("/dev/null")?))
    }

    #[test]
    fn full_cache_evicts_one_entry_not_all() {
        let cache = FdCache::new(8);
        let opens = Cell::new(0);
        let open = || {
            opens.set(opens.get() + 1);
            dev_null()
        };
        for id in 0..8 {
            cache.get_or_open(id, open).unwrap();
        }
        assert_eq!(opens.get(), 8);
        assert_eq!(cache.len(), 8);
        // Hits do not open.
        for id in 0..8 {
            cache.get_or_open(id, open).unwrap();
        }
        assert_eq!(opens.get(), 8);
        // One more file evicts exactly one entry, not all of them.
        cache.get_or_open(100, open).unwrap();
        assert_eq!(cache.len(), 8);
        assert_eq!(opens.get(), 9);
        assert!(cache.contains(100));
        assert_eq!((0..8).filter(|&id| cache.contains(id)).count(), 7);
    }

    #[test]
    fn open_errors_are_returned_and_not_cached() {
        let cache = FdCache::new(4);
        let err = cache
            .get_or_open(1, || Err(io::Error::from_raw_os_error(libc::EMFILE)))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EMFILE));
        assert_eq!(cache.len(), 0);
        cache.get_or_open(1, dev_null).unwrap();
        cache.remove(1);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn capacity_follows_the_open_file_limit() {
        assert_eq!(entries_for_limit(1024), (1024 - 256) / 3);
        assert_eq!(entries_for_limit(20000), (20000 - 256) / 3);
        assert_eq!(entries_for_limit(1 << 20), ENTRIES_MAX);
        assert_eq!(entries_for_limit(0), ENTRIES_MIN);
        assert_eq!(entries_for_limit(u64::MAX), ENTRIES_MAX);
        // Two caches stay within the limit, with the reserve left over.
        for soft in [1024u64, 4096, 20000, 65536] {
            assert!(2 * entries_for_limit(soft) as u64 + RESERVED_FDS <= soft);
        }
    }
}
