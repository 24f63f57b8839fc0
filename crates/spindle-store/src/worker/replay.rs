//! Replay at open: the journal's records after the last checkpoint are applied again,
//! and files no object references are removed.

use super::*;

impl Worker {
    /// Parses the journal's valid records of the current epoch in order and calls
    /// `f(worker, record, seq)` for each until it returns false. Returns the number of
    /// records `f` accepted and the journal offset after the last of them.
    fn scan_journal(
        &mut self,
        mut f: impl FnMut(&mut Self, Record, u64) -> Result<bool, StoreError>,
    ) -> Result<(u64, u64), StoreError> {
        let file_len = self.journal.len_bytes()?;
        let mut base = 0u64; // file offset of buf[0]
        let mut buf: Vec<u8> = Vec::new();
        let mut pos = 0u64;
        let mut count = 0u64;
        let mut seq = self.next_seq;
        let chunk = 16usize << 20;
        let reader = self
            .sh
            .disk
            .open(&self.sh.config.dir.join("journal"), OpenHow::Read)?;
        loop {
            let in_buf = (pos - base) as usize;
            let eof = base + buf.len() as u64 >= file_len;
            match journal::parse(&buf[in_buf.min(buf.len())..], eof, self.epoch, seq) {
                Parsed::Record { record, bytes } => {
                    if !f(self, record, seq)? {
                        break;
                    }
                    seq += 1;
                    count += 1;
                    pos += bytes as u64;
                }
                Parsed::NeedBytes(n) => {
                    // Slide the window to `pos` and read at least `n` bytes.
                    let want = n.max(chunk);
                    let avail = file_len.saturating_sub(pos);
                    let len = (want as u64).min(avail) as usize;
                    let mut nb = vec![0u8; len];
                    read_exact_at(&*reader, &mut nb, pos)?;
                    base = pos;
                    buf = nb;
                }
                Parsed::Invalid => {
                    let aligned = pos.next_multiple_of(JOURNAL_ALIGN as u64);
                    if aligned != pos {
                        pos = aligned;
                        if pos > base + buf.len() as u64 {
                            base = pos;
                            buf.clear();
                        }
                        continue;
                    }
                    break;
                }
            }
        }
        Ok((count, pos))
    }

    /// Replays the journal records of the current epoch; returns how many were applied.
    ///
    /// Two passes: the first finds the last valid record, the second applies the records
    /// and checks the data of direct records of the last batch (see `journal::DirectCheck`):
    /// the journal ends before the first whose data did not land.
    pub(super) fn replay(&mut self) -> Result<u64, StoreError> {
        self.replaying = true;
        let (valid, _) = self.scan_journal(|_, _, _| Ok(true))?;
        let last_seq = (self.next_seq + valid).saturating_sub(1);
        let mut dropped_at = None;
        let (count, pos) = self.scan_journal(|w, record, seq| {
            if let Record::ApplyDirect {
                file_id,
                size,
                check,
                ..
            }
            | Record::RecoverDirect {
                file_id,
                size,
                check,
                ..
            } = &record
            {
                let last_batch = check.batch_last_seq >= last_seq;
                if !check.crcs.is_empty()
                    && last_batch
                    && !w.direct_data_landed(*file_id, *size, &check.crcs)?
                {
                    dropped_at = Some(seq);
                    return Ok(false);
                }
            }
            w.exec(record)?;
            w.next_seq += 1;
            Ok(true)
        })?;
        if let Some(seq) = dropped_at {
            let dropped = last_seq - seq + 1;
            self.sh
                .counters
                .replay_records_discarded
                .fetch_add(dropped, Relaxed);
            tracing::warn!(
                first_seq = seq,
                records = dropped,
                "journal ends early: the data of a direct write in the last batch did not \
                 land before the crash, so the batch was never acknowledged; its records from \
                 that one on are dropped"
            );
        }
        self.finish_batch();
        // Files of direct records replayed with their checksums: only the length may need
        // fixing (a padded O_DIRECT write that landed before its cut to size).
        for (pg, name, file_id, size) in std::mem::take(&mut self.replayed_direct) {
            let entry = self
                .sh
                .pgs_read()
                .get(&pg)
                .and_then(|p| p.objects.get(&name).cloned());
            // Only while the object is still that write (not deleted or replaced; one a
            // record changed is in `replayed`, whose files are fixed below).
            let current = entry.is_some_and(|e| {
                let st = e.lock();
                st.file_id == file_id && st.size == size
            });
            if !current || self.replayed.contains(&(pg, name)) {
                continue;
            }
            let file = self.sh.file(file_id, false)?;
            if file.len_bytes()? != size {
                file.set_len(size)?;
                self.dirty_files.insert(file_id);
            }
        }
        // Recompute the CRCs of every replayed object from its file.
        self.replaying = false;
        let replayed = std::mem::take(&mut self.replayed);
        for (pg, name) in replayed {
            let entry = self
                .sh
                .pgs_read()
                .get(&pg)
                .and_then(|p| p.objects.get(&name).cloned());
            if let Some(entry) = entry {
                if entry.lock().is_inline() {
                    let data = self.inline_data(pg, &name, &entry)?;
                    entry.lock().crcs = crcs_of(&data);
                    continue;
                }
                let mut st = entry.lock();
                let file = self.sh.file(st.file_id, true)?;
                if file.len_bytes()? != st.size {
                    file.set_len(st.size)?;
                }
                st.crcs = crcs_of_file(&*file, st.size)?;
            }
        }
        tracing::info!(records = count, journal_bytes = pos, "journal replayed");
        Ok(count)
    }

    /// Removes data files that no object references (left by crashes before journaling).
    pub(super) fn remove_orphans(&mut self) -> Result<(), StoreError> {
        let referenced: HashSet<u64> = self
            .sh
            .pgs_read()
            .values()
            .flat_map(|p| p.objects.values().map(|e| e.lock().file_id))
            .collect();
        let mut removed = 0u64;
        for name in self.sh.disk.read_dir(&self.sh.objects_dir)? {
            let Some(id) = name.to_str().and_then(|n| u64::from_str_radix(n, 16).ok()) else {
                continue;
            };
            if name.len() == 16 && !referenced.contains(&id) {
                self.unlink(id)?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(files = removed, "removed unreferenced data files");
        }
        Ok(())
    }
}
