//! Direct writes: large whole-object writes go straight to a fresh or reused file
//! through the I/O engine (no double write), O_DSYNC, in flight together with their
//! batch's journal write (one flush for both; the record carries the data's checksums).

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

    /// Makes the batch's large payloads ready to write (no I/O): each becomes an
    /// O_DIRECT-ready buffer (the payload itself when it is aligned or goes through the page
    /// cache, else an aligned copy) with its block checksums, which the record carries.
    pub(super) fn prepare_direct(&mut self) -> PreparedDirect {
        let direct = std::mem::take(&mut self.direct);
        let mut prepared = PreparedDirect {
            writes: Vec::with_capacity(direct.len()),
            fix_len: Vec::new(),
            created: false,
        };
        for DirectWrite {
            file_id,
            data,
            file,
            created: new_file,
            block_crcs,
        } in direct
        {
            prepared.created |= new_file;
            if !new_file {
                self.sh.counters.files_reused.fetch_add(1, Relaxed);
            }
            let size_bytes = data.len() as u64;
            let bytes = data.as_slice();
            // Written through the page cache (see `open_direct_target`): any buffer will do,
            // at its exact length (no padding, so no truncate afterwards).
            let cached = is_cached(size_bytes);
            let aligned = cached
                || ((bytes.as_ptr() as usize).is_multiple_of(JOURNAL_ALIGN)
                    && bytes.len().is_multiple_of(JOURNAL_ALIGN));
            let padded_len = bytes.len().next_multiple_of(JOURNAL_ALIGN);
            let (buf, crcs) = match (aligned, block_crcs) {
                // Already O_DIRECT-ready (the daemon's allocator page-aligns large blocks,
                // and received payloads are allocated at their exact size): write the buffer
                // itself, with the block checksums computed while the frame it came in was
                // verified.
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
                // One pass over the data: copy into an aligned buffer and checksum each block.
                (false, None) => {
                    let mut crcs = Vec::with_capacity(bytes.len().div_ceil(BLOCK_BYTES as usize));
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
                self.sh.counters.direct_writes_adopted.fetch_add(1, Relaxed);
            }
            assert_eq!(crcs.len() as u64, block_count(size_bytes));
            self.direct_crcs.insert(file_id, crcs);
            // An O_DIRECT write of a size that is not a multiple of 4 KiB is padded; the
            // file is cut to the real size (and synced) after the write.
            if !cached && !size_bytes.is_multiple_of(JOURNAL_ALIGN as u64) {
                prepared.fix_len.push((file.clone(), size_bytes));
            }
            prepared.writes.push((file, 0, buf));
        }
        prepared
    }

    /// What has to be durable after the batch's writes (data and journal, written together)
    /// before it is acknowledged: padded files cut to size and synced, new names synced.
    pub(super) fn finish_direct(
        &self,
        fix_len: Vec<(FileRef, u64)>,
        created: bool,
    ) -> Result<(), StoreError> {
        if !fix_len.is_empty() {
            for (file, size) in &fix_len {
                file.set_len(*size)?;
            }
            let len = fix_len.len();
            let mut each = fix_len.into_iter().map(|(f, _)| Ok(f));
            self.sh.disk.sync_data_each(&mut each, len)?;
        }
        // New names must be durable before the batch is acknowledged; a reused file's name
        // already is (it was synced when the file was created). Replay refuses a record of
        // the last batch whose file is missing.
        if created {
            self.sh.disk.sync_dir(&self.sh.objects_dir)?;
        }
        Ok(())
    }

    /// Replay: whether the data file of a direct record of the journal's last batch holds
    /// exactly the data the record's checksums describe (else the batch's data writes did
    /// not all land before the crash, and the batch was not acknowledged).
    pub(super) fn direct_data_landed(
        &self,
        file_id: u64,
        size: u64,
        crcs: &[u32],
    ) -> Result<bool, StoreError> {
        let file = match self
            .sh
            .disk
            .open(&self.sh.file_path(file_id), OpenHow::Read)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if file.len_bytes()? < size || crcs.len() as u64 != block_count(size) {
            return Ok(false);
        }
        const CHUNK_BYTES: u64 = 1 << 20;
        let mut buf = vec![0u8; CHUNK_BYTES as usize];
        let mut pos = 0u64;
        let mut block = 0usize;
        while pos < size {
            let len = (size - pos).min(CHUNK_BYTES) as usize;
            match read_exact_at(&*file, &mut buf[..len], pos) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(e.into()),
            }
            for chunk in buf[..len].chunks(BLOCK_BYTES as usize) {
                if spindle_types::crc::crc32c(chunk) != crcs[block] {
                    return Ok(false);
                }
                block += 1;
            }
            pos += len as u64;
        }
        Ok(true)
    }

    /// Points an object at its freshly written direct file (and unlinks the old file).
    pub(super) fn exec_direct(
        &mut self,
        pg: PgId,
        name: &str,
        version: Version,
        file_id: u64,
        size: u64,
        crcs: Vec<u32>,
    ) -> Result<(), StoreError> {
        self.next_file_id = self.next_file_id.max(file_id + 1);
        let e = self.get_or_create(pg, name, file_id);
        self.begin_write(&e);
        let crcs = if crcs.is_empty() {
            // Replay of an older-format record: the CRCs are recomputed from the file
            // after replay.
            assert!(self.replaying, "a live direct write without its CRCs");
            self.replayed.insert((pg, name.to_string()));
            vec![0; block_count(size) as usize]
        } else {
            assert_eq!(crcs.len() as u64, block_count(size));
            if self.replaying {
                // The file's length is fixed (a padded O_DIRECT write cut to size) after
                // replay.
                self.replayed_direct
                    .push((pg, name.to_string(), file_id, size));
            }
            crcs
        };
        let old = {
            let mut st = e.lock();
            let old = st.file_id;
            st.file_id = file_id;
            st.inline = None;
            st.set_size(size, &self.sh.counters.data_bytes);
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
