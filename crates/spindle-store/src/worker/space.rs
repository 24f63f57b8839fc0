//! Space: full mode (only deletes and truncates are admitted until space is free), the
//! reserve file that makes room to leave it, and preallocation of buffered writes when the
//! file system is nearly full (so that applying a durable record never meets ENOSPC).

use super::*;

impl Worker {
    /// Full mode ends when the file system has room for the reserve twice over and the
    /// reserve could be created again.
    pub(super) fn check_space(&mut self) {
        if !self.full || Instant::now() < self.space_check_at {
            return;
        }
        self.space_check_at = Instant::now() + SPACE_CHECK_INTERVAL;
        let Ok(crate::disk::DiskSpace { avail_bytes, .. }) =
            self.sh.disk.space(&self.sh.config.dir)
        else {
            return;
        };
        let want_bytes = self
            .sh
            .config
            .reserve_bytes
            .saturating_mul(2)
            .max(SPACE_FREE_MIN_BYTES);
        if avail_bytes < want_bytes {
            return;
        }
        if self.sh.config.reserve_bytes > 0 {
            if let Err(e) = self.create_reserve() {
                tracing::debug!(error = %e, "space reserve not re-created yet");
                return;
            }
        }
        self.full = false;
        self.sh.full.store(false, Relaxed);
        self.checkpoint_retry_at = None;
        tracing::info!(
            avail_bytes,
            "file system has room again; store accepts writes"
        );
    }

    /// Enters full mode (once): releases the reserve so that deletes, truncates and
    /// checkpoints find room, and refuses new data from now on.
    pub(super) fn enter_full(&mut self, why: &str) {
        self.space_check_at = Instant::now() + SPACE_CHECK_INTERVAL;
        if self.full {
            return;
        }
        self.full = true;
        self.sh.full.store(true, Relaxed);
        let released = remove_file_if_present(&*self.sh.disk, &self.reserve_path());
        self.drop_kept_files();
        tracing::warn!(
            error = %why,
            reserve_released = released.is_ok(),
            "file system full: store refuses new data (deletes and truncates still work) \
             until space is free"
        );
    }

    /// Freed files kept for reuse hold their space: give it back (no record refers to
    /// them; replay re-creates a file an earlier record writes into, as for deletes).
    pub(super) fn drop_kept_files(&mut self) {
        let kept: Vec<(u64, u64)> = self
            .reusable
            .drain(..)
            .chain(self.freed_this_epoch.drain(..))
            .collect();
        if !kept.is_empty() {
            tracing::info!(
                files = kept.len(),
                bytes = kept.iter().map(|k| k.1).sum::<u64>(),
                "file system tight: removing the freed data files kept for reuse"
            );
        }
        for (id, _) in kept {
            self.remove_unreferenced(id);
        }
    }

    pub(super) fn reserve_path(&self) -> std::path::PathBuf {
        self.sh.config.dir.join("reserve")
    }

    /// Creates (or completes) the reserve file of `reserve_bytes` allocated bytes; a
    /// partial one is removed on failure (it would only hold space).
    pub(super) fn create_reserve(&mut self) -> Result<(), StoreError> {
        let path = self.reserve_path();
        let want = self.sh.config.reserve_bytes;
        let made = (|| -> Result<(), StoreError> {
            let file = self.sh.disk.open(&path, OpenHow::Data { create: true })?;
            if file.len_bytes()? >= want {
                return Ok(());
            }
            file.allocate(0, want, false)?;
            if file.len_bytes()? < want {
                // No fallocate here (EOPNOTSUPP): write the zeros.
                let chunk = vec![0u8; 1 << 20];
                let mut pos = 0;
                while pos < want {
                    let n = (want - pos).min(chunk.len() as u64) as usize;
                    file.write_all_at(&chunk[..n], pos)?;
                    pos += n as u64;
                }
            }
            file.sync_all()?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = remove_file_if_present(&*self.sh.disk, &path);
            return Err(e.classify());
        }
        Ok(())
    }

    /// The file system has at least [`PREALLOC_SKIP_AVAIL_BYTES_MIN`] available (asked at
    /// most every [`ROOM_CHECK_INTERVAL`]): buffered writes then skip their preallocation
    /// (an `fallocate` per 4 KiB write cost 8-25% of 4k random writes QD16).
    pub(super) fn roomy(&mut self) -> bool {
        if self.full {
            return false;
        }
        let now = Instant::now();
        if self.roomy_until.is_some_and(|t| now < t) {
            return true;
        }
        let roomy = self
            .sh
            .disk
            .space(&self.sh.config.dir)
            .is_ok_and(|s| s.avail_bytes >= PREALLOC_SKIP_AVAIL_BYTES_MIN);
        self.roomy_until = roomy.then(|| now + ROOM_CHECK_INTERVAL);
        roomy
    }

    /// Allocates the blocks of `[offset, offset + len)` of data file `file_id` (created if
    /// missing; size unchanged), so that applying the record after its journal write
    /// cannot fail for lack of space.
    pub(super) fn preallocate(
        &mut self,
        file_id: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), StoreError> {
        if len == 0 || self.roomy() {
            return Ok(());
        }
        let file = self.sh.file(file_id, true)?;
        file.allocate(offset, len, true)
            .map_err(|e| StoreError::Io(e).classify())
    }
}
