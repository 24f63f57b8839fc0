//! Checkpoint: dirty data files are synced, then metadata, inline bytes and the journal's
//! start are stored in the metadata database, which lets the journal be reused.

use super::*;

impl Worker {
    /// Syncs dirty data files, stores the metadata durably and restarts the journal.
    pub(super) fn checkpoint(&mut self) -> Result<(), StoreError> {
        // At most SYNCS_IN_FLIGHT_MAX syncs (and open descriptors) at a time: a random
        // write workload over a large image dirties one file per write, tens of thousands
        // per checkpoint (see `Disk::sync_data_each`).
        // Kept dirty until the checkpoint commits: a checkpoint that fails (for lack of
        // space, in the database commit) is retried with the same files.
        let dirty: Vec<u64> = self.dirty_files.iter().copied().collect();
        let sh = &self.sh;
        let mut files = dirty.into_iter().filter_map(|id| match sh.file(id, false) {
            Ok(f) => Some(Ok(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e)),
        });
        sh.disk.sync_data_each(&mut files, SYNCS_IN_FLIGHT_MAX)?;
        sh.disk.sync_dir(&sh.objects_dir)?;
        let sup = Super {
            epoch: self.epoch + 1,
            next_seq: self.next_seq,
            next_file_id: self.next_file_id,
        };
        let saved = {
            let pgs = self.sh.pgs_read();
            self.sh
                .db()
                .and_then(|db| meta::save(&db, sup, &pgs, &self.removed_pgs))
        };
        if let Err(e) = saved {
            // redb refuses every operation after a failed write until reopened; the
            // previous commit is intact on disk (commits are atomic). Only a lack of
            // space is retried: after any other error (a failed fsync above all) the page
            // cache may hold pages that never reach the disk, and a database reopened on
            // them would write a header that points at them (after a power loss redb then
            // finds a corrupt tree); the store latches instead and recovers at restart.
            if matches!(e, StoreError::NoSpace(_)) {
                if let Err(r) = self.sh.reopen_db() {
                    tracing::warn!(error = %r, "cannot reopen the metadata database yet");
                }
            }
            return Err(e);
        }
        self.dirty_files.clear();
        {
            let mut pgs = self.sh.pgs_write();
            pgs.retain(|_, p| !p.is_empty());
            for p in pgs.values_mut() {
                // The inline bytes are durable in the database now: drop the memory copies.
                for name in &p.ck_dirty_objects {
                    if let Some(e) = p.objects.get(name) {
                        e.lock().inline = None;
                    }
                }
                p.ck_dirty_objects.clear();
                p.ck_dirty = false;
                p.ck_log_reset = false;
                p.ck_log_persisted = p.log.back().map_or(Version::ZERO, |e| e.version);
            }
        }
        self.removed_pgs.clear();
        // No journal record from before this checkpoint is ever replayed again: files freed
        // until now can be overwritten.
        self.reusable.append(&mut self.freed_this_epoch);
        self.epoch = sup.epoch;
        self.journal_pos = 0;
        self.inline_mem = 0;
        self.last_checkpoint = Instant::now();
        self.sh.counters.checkpoints.fetch_add(1, Relaxed);
        Ok(())
    }
}
