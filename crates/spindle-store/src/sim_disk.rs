//! `SimDisk`: an in-memory [`Disk`] for deterministic crash and fault testing.
//!
//! Everything that happens is a function of the seed and of the sequence of calls: the
//! state lives in ordered maps (no hash iteration order), randomness comes from one
//! SplitMix64 generator seeded by the caller, and nothing reads a clock.
//!
//! Fault model (each at least as harsh as Linux on ext4 with `data=ordered`):
//! - **Unsynced data.** Each file keeps what reads see (`data`) and what survives a crash
//!   (`durable`). A write changes `data` and marks its torn-sectors (512 B by default)
//!   dirty; `sync_data`/`sync_all` copies the dirty sectors (and the length) to `durable`.
//!   Writes on O_DSYNC files ([`OpenHow::Journal`], `DirectNew`, `DirectExisting`) are
//!   durable when they return.
//! - **Torn writes at a crash.** [`SimDisk::crash`] keeps each dirty sector's new bytes or
//!   its old ones, independently (a coin per sector), and an unsynced length change or
//!   not; a write that was in flight when an injected failure hit keeps a random subset of
//!   its sectors. So a crash can leave any mix of old and new sectors of unsynced writes,
//!   never a change to a synced one.
//! - **Names.** Creates, renames and unlinks are durable only after `sync_dir` of their
//!   directory; at a crash each directory keeps a random prefix (in order) of its changes
//!   since its last sync (ext4 commits them in order, but may have committed none). A
//!   rename is one change (atomic). A file's `sync_all` does not make its name durable.
//!   Directories themselves are created durable (the store creates them once).
//! - **Failed syncs.** [`SimDisk::fail_sync_after`] makes one later sync (file, directory
//!   or O_DSYNC write) fail with EIO; the file's unsynced data is then dropped from the
//!   durable image for good (reads still return it, as Linux keeps the clean pages), so
//!   a later successful sync does not bring it back.
//! - **Dead disk.** [`SimDisk::fail_after_ops`]: after N more mutating operations every
//!   operation fails with EIO (the N+1-th, if a write, lands torn), as a device that dies.
//! - **Full disk.** [`SimDisk::set_capacity_bytes`]: allocations (writes to unallocated
//!   4 KiB blocks, `allocate`) beyond it fail with ENOSPC and change nothing. Growing a
//!   file with `set_len` allocates nothing (holes).
//! - **Bit rot.** [`SimDisk::flip_bit`] flips a bit at rest (in both images).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use spindle_io::IoBuf;

use crate::disk::{Disk, DiskFile, DiskRead, DiskSpace, FileRef, OpenHow};

/// Allocation unit of the simulated file system.
pub const SIM_BLOCK_BYTES: u64 = 4096;
/// Default granularity of torn writes (the smallest sector a device may write).
pub const SIM_TORN_SECTOR_BYTES_DEFAULT: u64 = 512;
const _: () = assert!(SIM_BLOCK_BYTES.is_multiple_of(SIM_TORN_SECTOR_BYTES_DEFAULT));

/// SplitMix64: small, fast, and fully determined by its seed.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SimRng::below(0)");
        // Multiply-shift: bias below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

#[derive(Clone, Debug)]
enum NsOp {
    Link {
        name: PathBuf,
        ino: u64,
    },
    Unlink {
        name: PathBuf,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
        ino: u64,
    },
}

impl NsOp {
    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>) {
        match self {
            NsOp::Link { name, ino } => {
                names.insert(name.clone(), *ino);
            }
            NsOp::Unlink { name } => {
                names.remove(name);
            }
            NsOp::Rename { from, to, ino } => {
                names.remove(from);
                names.insert(to.clone(), *ino);
            }
        }
    }

    fn references(&self, ino: u64) -> bool {
        match self {
            NsOp::Link { ino: i, .. } | NsOp::Rename { ino: i, .. } => *i == ino,
            NsOp::Unlink { .. } => false,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Inode {
    /// What reads see; its length is the file's length.
    data: Vec<u8>,
    /// What survives a crash for sure (plus the dirty sectors that happen to).
    durable: Vec<u8>,
    /// Torn-sector indexes written (or cut off) since the last successful sync.
    dirty: BTreeSet<u64>,
    /// The length changed since the last successful sync.
    len_dirty: bool,
    /// Allocated blocks (index = offset / SIM_BLOCK_BYTES).
    blocks: BTreeSet<u64>,
    /// Open handles.
    handles: u32,
}

/// Outcome of counting one operation against the injected faults.
enum Tick {
    Ok,
    /// This operation is the one the injected failure hits (a write lands torn).
    FailNow,
}

#[derive(Debug)]
struct SimState {
    rng: SimRng,
    torn_sector_bytes: u64,
    capacity_bytes: u64,
    dirs: BTreeSet<PathBuf>,
    /// The namespace as the file system shows it now.
    names: BTreeMap<PathBuf, u64>,
    /// The namespace as of the last directory syncs.
    durable_names: BTreeMap<PathBuf, u64>,
    /// Namespace changes not yet durable, in order, with their directory.
    pending: Vec<(PathBuf, NsOp)>,
    inodes: BTreeMap<u64, Inode>,
    next_ino: u64,
    /// Mutating operations so far.
    ops: u64,
    fail_after_ops: Option<u64>,
    /// The device died (fail_after_ops reached): everything fails.
    failing: bool,
    /// Syncs to let succeed before one fails (None: none fails).
    fail_sync_after: Option<u64>,
    syncs_failed: u64,
    /// A later image was taken by `crash()`: this one is gone.
    dead: bool,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error (EIO: {what})"))
}

fn os_err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl SimState {
    fn new(seed: u64) -> SimState {
        SimState {
            rng: SimRng::new(seed),
            torn_sector_bytes: SIM_TORN_SECTOR_BYTES_DEFAULT,
            capacity_bytes: 1 << 40,
            dirs: BTreeSet::from([PathBuf::from("/")]),
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            pending: Vec::new(),
            inodes: BTreeMap::new(),
            next_ino: 1,
            ops: 0,
            fail_after_ops: None,
            failing: false,
            fail_sync_after: None,
            syncs_failed: 0,
            dead: false,
        }
    }

    /// Checks the disk is usable; counts a mutating operation.
    fn tick(&mut self, mutating: bool) -> io::Result<Tick> {
        if self.dead {
            return Err(eio("disk image replaced by a crash"));
        }
        if self.failing {
            return Err(eio("device failed"));
        }
        if mutating {
            self.ops += 1;
            if self.fail_after_ops.is_some_and(|n| self.ops > n) {
                self.failing = true;
                return Ok(Tick::FailNow);
            }
        }
        Ok(Tick::Ok)
    }

    /// Whether this sync is the one to fail.
    fn sync_fails(&mut self) -> bool {
        match self.fail_sync_after {
            Some(0) => {
                self.fail_sync_after = None;
                self.syncs_failed += 1;
                true
            }
            Some(n) => {
                self.fail_sync_after = Some(n - 1);
                false
            }
            None => false,
        }
    }

    fn used_bytes(&self) -> u64 {
        let live: BTreeSet<u64> = self.names.values().copied().collect();
        self.inodes
            .iter()
            .filter(|(ino, i)| live.contains(ino) || i.handles > 0)
            .map(|(_, i)| i.blocks.len() as u64 * SIM_BLOCK_BYTES)
            .sum()
    }

    /// Drops an inode nothing can reach any more (no name now, none durable, none
    /// pending, no handle).
    fn maybe_free(&mut self, ino: u64) {
        let reachable = self.inodes.get(&ino).is_some_and(|i| i.handles > 0)
            || self.names.values().any(|&i| i == ino)
            || self.durable_names.values().any(|&i| i == ino)
            || self.pending.iter().any(|(_, op)| op.references(ino));
        if !reachable {
            self.inodes.remove(&ino);
        }
    }

    fn ino(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| os_err(libc::ENOENT))
    }

    fn inode(&mut self, ino: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&ino)
            .ok_or_else(|| eio("inode vanished"))
    }

    fn create(&mut self, path: &Path) -> io::Result<u64> {
        let dir = parent_of(path);
        if !self.dirs.contains(&dir) {
            return Err(os_err(libc::ENOENT));
        }
        if let Tick::FailNow = self.tick(true)? {
            return Err(eio("device failed"));
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Inode::default());
        self.names.insert(path.to_path_buf(), ino);
        let name = path.to_path_buf();
        self.pending.push((dir, NsOp::Link { name, ino }));
        Ok(ino)
    }

    fn sectors(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let s = self.torn_sector_bytes;
        if len == 0 {
            return 0..0;
        }
        offset / s..(offset + len).div_ceil(s)
    }

    /// Allocates the blocks of `[offset, offset + len)`; ENOSPC (changing nothing) if the
    /// capacity would be exceeded.
    fn allocate(&mut self, ino: u64, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let first = offset / SIM_BLOCK_BYTES;
        let last = (offset + len - 1) / SIM_BLOCK_BYTES;
        let have = self.inode(ino)?.blocks.range(first..=last).count() as u64;
        let need_bytes = (last - first + 1 - have) * SIM_BLOCK_BYTES;
        if need_bytes > 0 && self.used_bytes() + need_bytes > self.capacity_bytes {
            return Err(os_err(libc::ENOSPC));
        }
        self.inode(ino)?.blocks.extend(first..=last);
        Ok(())
    }

    fn write(&mut self, ino: u64, dsync: bool, data: &[u8], offset: u64) -> io::Result<()> {
        let tick = self.tick(true)?;
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| os_err(libc::EFBIG))?;
        let end_usize = usize::try_from(end).map_err(|_| os_err(libc::EFBIG))?;
        if let Tick::FailNow = tick {
            // The device died during this write: a random subset of its sectors landed
            // (in the cache, unsynced).
            let sectors: Vec<u64> = self.sectors(offset, data.len() as u64).collect();
            let keep: Vec<bool> = sectors.iter().map(|_| self.rng.coin()).collect();
            let s = self.torn_sector_bytes;
            let node = self.inode(ino)?;
            for (sec, keep) in sectors.into_iter().zip(keep) {
                if !keep {
                    continue;
                }
                let from = (sec * s).max(offset);
                let to = ((sec + 1) * s).min(end);
                if node.data.len() < to as usize {
                    node.data.resize(to as usize, 0);
                    node.len_dirty = true;
                }
                node.data[from as usize..to as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                node.dirty.insert(sec);
            }
            return Err(eio("device failed during a write"));
        }
        self.allocate(ino, offset, data.len() as u64)?;
        let sync_failed = dsync && self.sync_fails();
        let sectors = self.sectors(offset, data.len() as u64);
        let node = self.inode(ino)?;
        if node.data.len() < end_usize {
            node.data.resize(end_usize, 0);
            node.len_dirty = true;
        }
        node.data[offset as usize..end_usize].copy_from_slice(data);
        if !dsync {
            node.dirty.extend(sectors);
            return Ok(());
        }
        if sync_failed {
            // Written, then the write-back failed: pages clean, never durable.
            for sec in sectors {
                node.dirty.remove(&sec);
            }
            return Err(eio("O_DSYNC write failed"));
        }
        if node.durable.len() < end_usize {
            node.durable.resize(end_usize, 0);
        }
        node.durable[offset as usize..end_usize].copy_from_slice(data);
        for sec in sectors {
            node.dirty.remove(&sec);
        }
        Ok(())
    }

    fn set_len(&mut self, ino: u64, len: u64) -> io::Result<()> {
        if let Tick::FailNow = self.tick(true)? {
            return Err(eio("device failed"));
        }
        let new = usize::try_from(len).map_err(|_| os_err(libc::EFBIG))?;
        let cut = {
            let node = self.inode(ino)?;
            let old = node.data.len() as u64;
            node.data.resize(new, 0);
            node.len_dirty = true;
            node.blocks.retain(|&b| b * SIM_BLOCK_BYTES < len);
            (len < old).then(|| (len, old - len))
        };
        if let Some((from, n)) = cut {
            // The cut-off bytes are "written" (as zeros): a crash may keep old or new.
            let sectors = self.sectors(from, n);
            self.inode(ino)?.dirty.extend(sectors);
        }
        Ok(())
    }

    fn sync(&mut self, ino: u64) -> io::Result<()> {
        if let Tick::FailNow = self.tick(true)? {
            return Err(eio("device failed during a sync"));
        }
        let fails = self.sync_fails();
        let s = self.torn_sector_bytes as usize;
        let node = self.inode(ino)?;
        if fails {
            node.dirty.clear();
            node.len_dirty = false;
            return Err(eio("fsync failed"));
        }
        node.durable.resize(node.data.len(), 0);
        let len = node.data.len();
        for &sec in &node.dirty {
            let from = (sec as usize * s).min(len);
            let to = ((sec as usize + 1) * s).min(len);
            node.durable[from..to].copy_from_slice(&node.data[from..to]);
        }
        node.dirty.clear();
        node.len_dirty = false;
        Ok(())
    }

    /// The post-crash image (see the module documentation).
    fn crash_image(&mut self) -> SimState {
        let mut by_dir: BTreeMap<PathBuf, Vec<NsOp>> = BTreeMap::new();
        for (dir, op) in std::mem::take(&mut self.pending) {
            by_dir.entry(dir).or_default().push(op);
        }
        let mut names = self.durable_names.clone();
        for ops in by_dir.values() {
            let keep = self.rng.below(ops.len() as u64 + 1) as usize;
            for op in &ops[..keep] {
                op.apply(&mut names);
            }
        }
        let live: BTreeSet<u64> = names.values().copied().collect();
        let s = self.torn_sector_bytes;
        let mut inodes = BTreeMap::new();
        for ino in live {
            let Some(old) = self.inodes.get(&ino) else {
                continue;
            };
            let len = if old.len_dirty && self.rng.coin() {
                old.data.len()
            } else {
                old.durable.len()
            };
            let mut content = old.durable.clone();
            content.resize(len, 0);
            for &sec in &old.dirty {
                if !self.rng.coin() {
                    continue;
                }
                let from = ((sec * s) as usize).min(len);
                let to = (((sec + 1) * s) as usize).min(len);
                for (i, b) in content[from..to].iter_mut().enumerate() {
                    *b = old.data.get(from + i).copied().unwrap_or(0);
                }
            }
            let blocks: BTreeSet<u64> = old
                .blocks
                .iter()
                .copied()
                .filter(|&b| b * SIM_BLOCK_BYTES < len as u64)
                .collect();
            inodes.insert(
                ino,
                Inode {
                    durable: content.clone(),
                    data: content,
                    blocks,
                    ..Inode::default()
                },
            );
        }
        let seed = self.rng.next_u64();
        self.dead = true;
        SimState {
            rng: SimRng::new(seed),
            torn_sector_bytes: self.torn_sector_bytes,
            capacity_bytes: self.capacity_bytes,
            dirs: self.dirs.clone(),
            durable_names: names.clone(),
            names,
            pending: Vec::new(),
            inodes,
            next_ino: self.next_ino,
            ..SimState::new(0)
        }
    }
}

/// A deterministic in-memory disk with fault injection. Clones share the same disk.
#[derive(Clone, Debug)]
pub struct SimDisk {
    st: Arc<Mutex<SimState>>,
}

impl SimDisk {
    /// An empty disk (only `/` exists) whose random choices all derive from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk {
            st: Arc::new(Mutex::new(SimState::new(seed))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Simulates a power loss now: returns the image that a reboot finds (see the module
    /// documentation for what survives). This disk fails every later operation.
    pub fn crash(&self) -> SimDisk {
        let next = self.lock().crash_image();
        SimDisk {
            st: Arc::new(Mutex::new(next)),
        }
    }

    /// After `n` more mutating operations (writes, syncs, length changes, creates,
    /// removals), every operation fails with EIO; the operation that hits the limit, if a
    /// write, lands torn.
    pub fn fail_after_ops(&self, n: u64) {
        let mut st = self.lock();
        st.fail_after_ops = Some(st.ops + n);
    }

    /// Lets `n` syncs (file syncs, directory syncs, O_DSYNC writes) succeed, then fails
    /// the next one with EIO (its unsynced data is lost for good).
    pub fn fail_sync_after(&self, n: u64) {
        self.lock().fail_sync_after = Some(n);
    }

    /// Syncs failed by [`SimDisk::fail_sync_after`] so far.
    pub fn syncs_failed(&self) -> u64 {
        self.lock().syncs_failed
    }

    /// Whether the device died ([`SimDisk::fail_after_ops`] reached).
    pub fn failed(&self) -> bool {
        self.lock().failing
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Capacity of the file system (allocations beyond it fail with ENOSPC).
    pub fn set_capacity_bytes(&self, capacity_bytes: u64) {
        self.lock().capacity_bytes = capacity_bytes;
    }

    /// Bytes allocated by live files.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes()
    }

    /// Granularity of torn writes (a power of two dividing 4096; default 512).
    pub fn set_torn_sector_bytes(&self, bytes: u64) {
        assert!(
            bytes.is_power_of_two() && SIM_BLOCK_BYTES.is_multiple_of(bytes),
            "torn sector size must be a power of two dividing {SIM_BLOCK_BYTES}"
        );
        self.lock().torn_sector_bytes = bytes;
    }

    /// Flips bit `bit_offset` (counted from the file's start) of `path`, at rest: what
    /// reads see now and what survives a crash.
    pub fn flip_bit(&self, path: &Path, bit_offset: u64) -> io::Result<()> {
        let mut st = self.lock();
        let ino = st.ino(path)?;
        let node = st.inode(ino)?;
        let byte = usize::try_from(bit_offset / 8).map_err(|_| os_err(libc::EINVAL))?;
        if byte >= node.data.len() {
            return Err(os_err(libc::EINVAL));
        }
        let mask = 1u8 << (bit_offset % 8);
        node.data[byte] ^= mask;
        if let Some(b) = node.durable.get_mut(byte) {
            *b ^= mask;
        }
        Ok(())
    }

    /// Names of the files (not directories) that exist now, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        self.lock().names.keys().cloned().collect()
    }

    /// The current content of `path` (what reads see), bypassing fault injection.
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut st = self.lock();
        let ino = st.ino(path)?;
        Ok(st.inode(ino)?.data.clone())
    }

    fn handle(&self, st: &mut SimState, ino: u64, dsync: bool) -> io::Result<FileRef> {
        st.inode(ino)?.handles += 1;
        Ok(Arc::new(SimFile {
            st: self.st.clone(),
            ino,
            dsync,
        }))
    }
}

impl Disk for SimDisk {
    fn open(&self, path: &Path, how: OpenHow) -> io::Result<FileRef> {
        let mut st = self.lock();
        st.tick(false)?;
        let existing = st.names.get(path).copied();
        let (create, truncate, dsync) = match how {
            OpenHow::Data { create } => (create, false, false),
            OpenHow::Journal => (true, false, true),
            OpenHow::DirectNew { .. } => (true, true, true),
            OpenHow::DirectExisting { .. } => (false, false, true),
            OpenHow::Read | OpenHow::DirectRead => (false, false, false),
        };
        let ino = match existing {
            Some(ino) => {
                if truncate {
                    st.set_len(ino, 0)?;
                }
                ino
            }
            None if create => st.create(path)?,
            None => return Err(os_err(libc::ENOENT)),
        };
        self.handle(&mut st, ino, dsync)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let mut st = self.lock();
        st.tick(false)?;
        Ok(st.names.contains_key(path) || st.dirs.contains(path))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick(false)?;
        for a in path.ancestors() {
            if st.names.contains_key(a) {
                return Err(os_err(libc::ENOTDIR));
            }
            st.dirs.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick(false)?;
        let ino = st.ino(path)?;
        if let Tick::FailNow = st.tick(true)? {
            return Err(eio("device failed"));
        }
        st.names.remove(path);
        let name = path.to_path_buf();
        st.pending.push((parent_of(path), NsOp::Unlink { name }));
        st.maybe_free(ino);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.tick(false)?;
        let ino = st.ino(from)?;
        let dir = parent_of(from);
        if dir != parent_of(to) {
            return Err(os_err(libc::EXDEV));
        }
        if let Tick::FailNow = st.tick(true)? {
            return Err(eio("device failed"));
        }
        let replaced = st.names.remove(to);
        st.names.remove(from);
        st.names.insert(to.to_path_buf(), ino);
        let op = NsOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            ino,
        };
        st.pending.push((dir, op));
        if let Some(r) = replaced {
            st.maybe_free(r);
        }
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let mut st = self.lock();
        st.tick(false)?;
        if !st.dirs.contains(path) {
            return Err(os_err(libc::ENOENT));
        }
        let files = st.names.keys().filter(|n| n.parent() == Some(path));
        let dirs = st.dirs.iter().filter(|d| d.parent() == Some(path));
        Ok(files
            .chain(dirs)
            .filter_map(|p| p.file_name().map(OsString::from))
            .collect())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        if let Tick::FailNow = st.tick(true)? {
            return Err(eio("device failed during a directory sync"));
        }
        if !st.dirs.contains(path) {
            return Err(os_err(libc::ENOENT));
        }
        if st.sync_fails() {
            return Err(eio("directory fsync failed"));
        }
        let pending = std::mem::take(&mut st.pending);
        let mut rest = Vec::with_capacity(pending.len());
        let mut unlinked = Vec::new();
        for (dir, op) in pending {
            if dir == path {
                op.apply(&mut st.durable_names);
                if let NsOp::Unlink { .. } | NsOp::Rename { .. } = op {
                    unlinked.extend(st.inodes.keys().copied());
                }
            } else {
                rest.push((dir, op));
            }
        }
        st.pending = rest;
        unlinked.sort_unstable();
        unlinked.dedup();
        for ino in unlinked {
            st.maybe_free(ino);
        }
        Ok(())
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let mut st = self.lock();
        st.tick(false)?;
        let ino = st.ino(path)?;
        Ok(st.inode(ino)?.data.len() as u64)
    }

    fn space(&self, _path: &Path) -> io::Result<DiskSpace> {
        let mut st = self.lock();
        st.tick(false)?;
        let used = st.used_bytes();
        Ok(DiskSpace {
            total_bytes: st.capacity_bytes,
            avail_bytes: st.capacity_bytes.saturating_sub(used),
        })
    }

    fn write_batch(
        &self,
        writes: &mut dyn Iterator<Item = (FileRef, u64, IoBuf)>,
    ) -> io::Result<()> {
        // In flight together on a real disk: they land in any order (seeded).
        let mut all: Vec<(FileRef, u64, IoBuf)> = writes.collect();
        {
            let mut st = self.lock();
            for i in (1..all.len()).rev() {
                let j = st.rng.below(i as u64 + 1) as usize;
                all.swap(i, j);
            }
        }
        let mut first_err = None;
        for (file, offset, buf) in all {
            if let Err(e) = file.write_all_at(&buf, offset) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn sync_data_each(
        &self,
        files: &mut dyn Iterator<Item = io::Result<FileRef>>,
        _in_flight_max: usize,
    ) -> io::Result<()> {
        for f in files {
            f?.sync_data()?;
        }
        Ok(())
    }

    fn read_start(&self, file: &FileRef, offset: u64, mut buf: IoBuf) -> DiskRead {
        DiskRead::Done(file.read_at(&mut buf, offset).map(|n| (n, buf)))
    }

    fn concurrent(&self) -> bool {
        false
    }
}

/// An open file of a [`SimDisk`].
#[derive(Debug)]
struct SimFile {
    st: Arc<Mutex<SimState>>,
    ino: u64,
    /// Opened O_DSYNC: writes are durable when they return.
    dsync: bool,
}

impl SimFile {
    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut st = self.lock();
        if let Some(node) = st.inodes.get_mut(&self.ino) {
            node.handles = node.handles.saturating_sub(1);
        }
        st.maybe_free(self.ino);
    }
}

impl DiskFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut st = self.lock();
        st.tick(false)?;
        let node = st.inode(self.ino)?;
        let len = node.data.len() as u64;
        if offset >= len {
            return Ok(0);
        }
        let n = (len - offset).min(buf.len() as u64) as usize;
        let from = offset as usize;
        buf[..n].copy_from_slice(&node.data[from..from + n]);
        Ok(n)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.lock().write(self.ino, self.dsync, data, offset)
    }

    fn len_bytes(&self) -> io::Result<u64> {
        let mut st = self.lock();
        st.tick(false)?;
        Ok(st.inode(self.ino)?.data.len() as u64)
    }

    fn set_len(&self, len_bytes: u64) -> io::Result<()> {
        self.lock().set_len(self.ino, len_bytes)
    }

    fn allocate(&self, offset: u64, len_bytes: u64, keep_size: bool) -> io::Result<()> {
        let mut st = self.lock();
        if let Tick::FailNow = st.tick(true)? {
            return Err(eio("device failed"));
        }
        st.allocate(self.ino, offset, len_bytes)?;
        let end = offset.saturating_add(len_bytes);
        if !keep_size && end > st.inode(self.ino)?.data.len() as u64 {
            let end = usize::try_from(end).map_err(|_| os_err(libc::EFBIG))?;
            let node = st.inode(self.ino)?;
            node.data.resize(end, 0);
            node.len_dirty = true;
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.lock().sync(self.ino)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.lock().sync(self.ino)
    }

    fn read_cached(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        // Everything is "cached"; a short or failed read goes to `read_start`, which
        // reports it.
        let mut buf = vec![0u8; len];
        match self.read_at(&mut buf, offset) {
            Ok(n) if n == len => Some(buf),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn disk(seed: u64) -> SimDisk {
        let d = SimDisk::new(seed);
        d.create_dir_all(&p("/s")).unwrap();
        d
    }

    /// A file whose name is durable, with `bytes` synced.
    fn synced_file(d: &SimDisk, path: &str, bytes: &[u8]) -> FileRef {
        let f = d.open(&p(path), OpenHow::Data { create: true }).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.sync_data().unwrap();
        d.sync_dir(&p("/s")).unwrap();
        f
    }

    #[test]
    fn synced_data_survives_every_crash() {
        for seed in 0..50 {
            let d = disk(seed);
            let f = synced_file(&d, "/s/a", &[7u8; 10_000]);
            // Unsynced overwrite of the middle.
            f.write_all_at(&[9u8; 3000], 2000).unwrap();
            assert_eq!(d.contents(&p("/s/a")).unwrap()[2500], 9);
            let after = d.crash();
            let got = after.contents(&p("/s/a")).unwrap();
            assert_eq!(got.len(), 10_000);
            // Bytes outside the unsynced write are the synced ones.
            assert!(got[..2000].iter().all(|&b| b == 7), "seed {seed}");
            assert!(got[5000..].iter().all(|&b| b == 7), "seed {seed}");
            // Inside: each 512-byte sector is all old or all new (torn, never mixed
            // within a sector).
            for sec in (2000 / 512)..(5000usize).div_ceil(512) {
                let from = (sec * 512).max(2000);
                let to = ((sec + 1) * 512).min(5000);
                let s = &got[from..to];
                assert!(
                    s.iter().all(|&b| b == 7) || s.iter().all(|&b| b == 9),
                    "seed {seed}: sector {sec} mixes old and new bytes"
                );
            }
        }
    }

    #[test]
    fn torn_writes_happen_and_keep_sector_granularity() {
        let mut saw = [false; 3]; // all old, all new, mixed
        for seed in 0..64 {
            let d = disk(seed);
            let f = synced_file(&d, "/s/a", &[1u8; 8192]);
            f.write_all_at(&[2u8; 8192], 0).unwrap();
            let got = d.crash().contents(&p("/s/a")).unwrap();
            let new = got
                .chunks(512)
                .filter(|s| s.iter().all(|&b| b == 2))
                .count();
            let old = got
                .chunks(512)
                .filter(|s| s.iter().all(|&b| b == 1))
                .count();
            assert_eq!(new + old, 16, "seed {seed}: a sector was torn inside");
            saw[if new == 0 {
                0
            } else if old == 0 {
                1
            } else {
                2
            }] = true;
        }
        assert!(saw[2], "64 crashes never tore a 16-sector write");
    }

    #[test]
    fn failed_fsync_loses_the_data_for_good() {
        for seed in 0..20 {
            let d = disk(seed);
            let f = synced_file(&d, "/s/a", &[1u8; 4096]);
            f.write_all_at(&[2u8; 4096], 0).unwrap();
            d.fail_sync_after(0);
            assert!(f.sync_data().is_err());
            assert_eq!(d.syncs_failed(), 1);
            // Reads still see the new bytes (clean pages in the cache) ...
            assert_eq!(d.contents(&p("/s/a")).unwrap(), vec![2u8; 4096]);
            // ... and a later sync succeeds without making them durable.
            f.sync_data().unwrap();
            let got = d.crash().contents(&p("/s/a")).unwrap();
            assert_eq!(got, vec![1u8; 4096], "seed {seed}");
        }
    }

    #[test]
    fn dsync_writes_are_durable_on_return() {
        for seed in 0..20 {
            let d = disk(seed);
            let j = d.open(&p("/s/j"), OpenHow::Journal).unwrap();
            d.sync_dir(&p("/s")).unwrap();
            j.write_all_at(&[5u8; 4096], 4096).unwrap();
            let got = d.crash().contents(&p("/s/j")).unwrap();
            assert_eq!(got.len(), 8192);
            assert!(got[4096..].iter().all(|&b| b == 5), "seed {seed}");
        }
    }

    #[test]
    fn names_are_durable_only_after_the_directory_sync() {
        let mut lost = 0;
        for seed in 0..40 {
            let d = disk(seed);
            let f = d
                .open(&p("/s/new"), OpenHow::Data { create: true })
                .unwrap();
            f.write_all_at(b"x", 0).unwrap();
            f.sync_all().unwrap(); // not the directory
            let after = d.crash();
            if !after.exists(&p("/s/new")).unwrap() {
                lost += 1;
            }
            // Synced directory: always there, also after an unsynced unlink may be undone.
            let d = disk(seed);
            synced_file(&d, "/s/kept", b"abc");
            d.remove_file(&p("/s/kept")).unwrap();
            assert!(!d.exists(&p("/s/kept")).unwrap());
            let after = d.crash();
            if after.exists(&p("/s/kept")).unwrap() {
                assert_eq!(after.contents(&p("/s/kept")).unwrap(), b"abc");
            }
            let d = disk(seed);
            synced_file(&d, "/s/gone", b"abc");
            d.remove_file(&p("/s/gone")).unwrap();
            d.sync_dir(&p("/s")).unwrap();
            assert!(!d.crash().exists(&p("/s/gone")).unwrap());
        }
        assert!(
            lost > 0 && lost < 40,
            "unsynced creates lost {lost} of 40 times"
        );
    }

    #[test]
    fn a_dead_device_fails_everything_and_tears_the_last_write() {
        let d = disk(3);
        let f = synced_file(&d, "/s/a", &[0u8; 4096]);
        d.fail_after_ops(0);
        assert!(f.write_all_at(&[1u8; 4096], 0).is_err());
        assert!(d.failed());
        let mut buf = [0u8; 10];
        assert!(f.read_at(&mut buf, 0).is_err());
        assert!(f.sync_data().is_err());
        assert!(d.open(&p("/s/b"), OpenHow::Data { create: true }).is_err());
        // The image after the crash is usable, the old handle is not.
        let after = d.crash();
        assert_eq!(after.contents(&p("/s/a")).unwrap().len(), 4096);
        assert!(d.exists(&p("/s/a")).is_err());
    }

    #[test]
    fn capacity_gives_enospc_and_changes_nothing() {
        let d = disk(1);
        d.set_capacity_bytes(16 * SIM_BLOCK_BYTES);
        let f = synced_file(&d, "/s/a", &[1u8; 12 * 4096]);
        assert_eq!(d.used_bytes(), 12 * SIM_BLOCK_BYTES);
        let err = f.write_all_at(&[2u8; 8 * 4096], 12 * 4096).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(f.len_bytes().unwrap(), 12 * 4096);
        // Overwrites of allocated blocks and growth by set_len need no space.
        f.write_all_at(&[3u8; 4096], 0).unwrap();
        f.set_len(1 << 24).unwrap();
        let err = f.allocate(0, 1 << 20, true).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        let space = d.space(&p("/s")).unwrap();
        assert_eq!(space.avail_bytes, 4 * SIM_BLOCK_BYTES);
        // Freeing space (unlink of the last name, handle dropped) makes room.
        drop(f);
        d.remove_file(&p("/s/a")).unwrap();
        assert_eq!(d.used_bytes(), 0);
    }

    #[test]
    fn bit_flips_change_data_at_rest() {
        let d = disk(1);
        synced_file(&d, "/s/a", &[0u8; 100]);
        d.flip_bit(&p("/s/a"), 8 * 50 + 3).unwrap();
        assert_eq!(d.contents(&p("/s/a")).unwrap()[50], 8);
        assert_eq!(d.crash().contents(&p("/s/a")).unwrap()[50], 8);
    }

    #[test]
    fn crashes_are_deterministic() {
        let run = |seed| {
            let d = disk(seed);
            let f = synced_file(&d, "/s/a", &[1u8; 65536]);
            f.write_all_at(&[2u8; 65536], 0).unwrap();
            d.crash().contents(&p("/s/a")).unwrap()
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }
}
