//! Replay at open: the journal's records after the last checkpoint are applied again,
//! and files no object references are removed.

use super::*;

impl Worker {
    /// Replays the journal records of the current epoch; returns how many were applied.
    pub(super) fn replay(&mut self) -> Result<u64, StoreError> {
        self.replaying = true;
        let file_len = self.journal.len_bytes()?;
        let mut base = 0u64; // file offset of buf[0]
        let mut buf: Vec<u8> = Vec::new();
        let mut pos = 0u64;
        let mut count = 0u64;
        let chunk = 16usize << 20;
        let reader = self
            .sh
            .disk
            .open(&self.sh.config.dir.join("journal"), OpenHow::Read)?;
        loop {
            let in_buf = (pos - base) as usize;
            let eof = base + buf.len() as u64 >= file_len;
            match journal::parse(
                &buf[in_buf.min(buf.len())..],
                eof,
                self.epoch,
                self.next_seq,
            ) {
                Parsed::Record { record, bytes } => {
                    self.exec(record)?;
                    self.next_seq += 1;
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
        self.finish_batch();
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
