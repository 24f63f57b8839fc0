//! Direct writes: large whole-object writes go straight to a fresh or reused file
//! through the I/O engine (no double write), before their journal record.

use super::*;

/// A direct write of `size_bytes` goes through the page cache (synced before its record
/// all the same): reads soon after find it there (see `DIRECT_UNCACHED_BYTES_MIN`).
pub(super) fn is_cached(size_bytes: u64) -> bool {
    size_bytes < DIRECT_UNCACHED_BYTES_MIN as u64
}

impl Worker {
    /// The file a direct write of `size` bytes goes to: a reusable file of exactly that
    /// size (overwritten in place) or a new one. `(file id, reused)`.
    pub(super) fn direct_target(&mut self, size: u64) -> (u64, bool) {
        match self.reusable.iter().position(|&(_, s)| s == size) {
            Some(i) => {
                let taken = self.reusable.swap_remove(i);
                self.batch_reused.push(taken);
                (taken.0, true)
            }
            None => (self.alloc_file(), false),
        }
    }

    /// Opens the target of a direct write before its batch is journaled: a reusable file
    /// as is, else a new one. Not preallocated: the direct write itself runs before the
    /// batch's journal write (`submit_batch`), so an ENOSPC there aborts the batch with
    /// nothing journaled, and a preallocated (unwritten) extent would cost an extent
    /// conversion at the write's completion (512k writes QD16 ran ~20% slower with it).
    /// `(file, created)`.
    pub(super) fn open_direct_target(
        &mut self,
        file_id: u64,
        reuse: bool,
        size: u64,
    ) -> Result<(FileRef, bool), StoreError> {
        let path = self.sh.file_path(file_id);
        let cached = is_cached(size);
        if reuse {
            if let Ok(f) = self.sh.disk.open(&path, OpenHow::DirectExisting { cached }) {
                return Ok((f, false));
            }
        }
        let opened = self
            .sh
            .disk
            .open(&path, OpenHow::DirectNew { cached })
            .map_err(StoreError::from);
        match opened {
            Ok(f) => Ok((f, true)),
            Err(e) => {
                self.remove_new_file(file_id);
                Err(e.classify())
            }
        }
    }

    /// Writes the batch's large payloads to their new files (O_DIRECT, in parallel), syncs
    /// them and the objects directory. Must complete before their records are journaled.
    pub(super) fn write_direct(&mut self) -> Result<(), StoreError> {
        if self.direct.is_empty() {
            return Ok(());
        }
        let direct = std::mem::take(&mut self.direct);
        let mut files = Vec::with_capacity(direct.len());
        let mut crcs_of_batch = Vec::with_capacity(direct.len());
        let mut created = false;
        let sh = self.sh.clone();
        // Each write is submitted as soon as its buffer is ready, so copying and
        // checksumming the next one overlaps the previous one's I/O (engine on a real disk).
        let mut writes = direct.into_iter().map(
            |DirectWrite {
                 file_id,
                 data,
                 file,
                 created: new_file,
                 block_crcs,
             }| {
                created |= new_file;
                if !new_file {
                    sh.counters.files_reused.fetch_add(1, Relaxed);
                }
                let size_bytes = data.len() as u64;
                let bytes = data.as_slice();
                // Written through the page cache (see `open_direct_target`): any buffer
                // will do, at its exact length (no padding, so no truncate afterwards).
                let cached = is_cached(size_bytes);
                let aligned = cached
                    || ((bytes.as_ptr() as usize).is_multiple_of(JOURNAL_ALIGN)
                        && bytes.len().is_multiple_of(JOURNAL_ALIGN));
                let padded_len = bytes.len().next_multiple_of(JOURNAL_ALIGN);
                let (buf, crcs) = match (aligned, block_crcs) {
                    // Already O_DIRECT-ready (the daemon's allocator page-aligns large
                    // blocks, and received payloads are allocated at their exact size):
                    // write the buffer itself, with the block checksums computed while the
                    // frame it came in was verified.
                    (true, Some(crcs)) => (data.into_iobuf(), crcs),
                    (true, None) => {
                        let crcs = bytes
                            .chunks(BLOCK_BYTES as usize)
                            .map(spindle_types::crc::crc32c)
                            .collect();
                        (data.into_iobuf(), crcs)
                    }
                    (false, Some(crcs)) => {
                        (IoBuf::aligned_copy(bytes, padded_len, JOURNAL_ALIGN), crcs)
                    }
                    // One pass over the data: copy into an aligned buffer and checksum each
                    // block.
                    (false, None) => {
                        let mut crcs =
                            Vec::with_capacity(bytes.len().div_ceil(BLOCK_BYTES as usize));
                        let buf = IoBuf::aligned_copy_inspect(
                            bytes,
                            padded_len,
                            JOURNAL_ALIGN,
                            BLOCK_BYTES as usize,
                            |block| crcs.push(spindle_types::crc::crc32c(block)),
                        );
                        (buf, crcs)
                    }
                };
                if aligned {
                    sh.counters.direct_writes_adopted.fetch_add(1, Relaxed);
                }
                assert_eq!(crcs.len() as u64, block_count(size_bytes));
                crcs_of_batch.push((file_id, crcs));
                files.push((file.clone(), size_bytes));
                (file, 0, buf)
            },
        );
        let written = sh.disk.write_batch(&mut writes);
        drop(writes);
        for (file_id, crcs) in crcs_of_batch {
            self.direct_crcs.insert(file_id, crcs);
        }
        written?;
        for (file, size) in &files {
            if !is_cached(*size) && !size.is_multiple_of(JOURNAL_ALIGN as u64) {
                file.set_len(*size)?;
            }
        }
        let len = files.len();
        let mut each = files.into_iter().map(|(f, _)| Ok(f));
        self.sh.disk.sync_data_each(&mut each, len)?;
        // New names must be durable before a record refers to them; a reused file's name
        // already is (it was synced when the file was created).
        if created {
            self.sh.disk.sync_dir(&self.sh.objects_dir)?;
        }
        Ok(())
    }

    /// Points an object at its freshly written direct file (and unlinks the old file).
    pub(super) fn exec_direct(
        &mut self,
        pg: PgId,
        name: &str,
        version: Version,
        file_id: u64,
        size: u64,
    ) -> Result<(), StoreError> {
        self.next_file_id = self.next_file_id.max(file_id + 1);
        let e = self.get_or_create(pg, name, file_id);
        self.begin_write(&e);
        let crcs = match self.direct_crcs.remove(&file_id) {
            Some(c) => c,
            None => {
                // Replay: the CRCs are recomputed from the file after replay.
                debug_assert!(self.replaying, "a live direct write without its CRCs");
                self.replayed.insert((pg, name.to_string()));
                vec![0; block_count(size) as usize]
            }
        };
        let old = {
            let mut st = e.lock();
            let old = st.file_id;
            st.file_id = file_id;
            st.inline = None;
            st.size = size;
            st.crcs = crcs;
            st.version = version;
            old
        };
        if old != file_id && old != 0 {
            self.unlink(old)?;
        }
        Ok(())
    }
}
