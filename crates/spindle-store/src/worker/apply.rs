//! Validation and apply: each transaction is checked against the batch's overlay (versions,
//! existence, file ids), then its journal record is applied to data files and metadata.

use super::*;

impl Worker {
    /// Checks a transaction against the state (plus the earlier ones of the batch) and turns
    /// it into a journal record.
    pub(super) fn validate(
        &mut self,
        ov: &mut Overlay,
        kind: TxnKind,
    ) -> Result<Record, StoreError> {
        if self.full && !frees_space(&kind) {
            return Err(StoreError::NoSpace(FULL_MESSAGE.into()));
        }
        Ok(match kind {
            TxnKind::Apply {
                pg,
                name,
                version,
                mutation,
                block_crcs,
            } => {
                let have = match ov.last.get(&pg) {
                    Some(v) => *v,
                    None => self
                        .sh
                        .pgs_read()
                        .get(&pg)
                        .map_or(Version::ZERO, |p| p.last_version),
                };
                if version <= have {
                    return Err(StoreError::VersionNotNewer {
                        pg,
                        have,
                        got: version,
                    });
                }
                ov.last.insert(pg, version);
                let direct_size =
                    |len: usize| len >= DIRECT_WRITE_BYTES_MIN && !self.fits_inline(len as u64);
                // Whole-object writes large enough for a file of their own bypass the
                // journal; everything else is an ordinary mutation.
                let full = match mutation {
                    TxnMutation::FullShared(d) => Ok(DirectData::Shared(d)),
                    TxnMutation::Plain(Mutation::WriteFull(d)) if direct_size(d.len()) => {
                        Ok(DirectData::Owned(d))
                    }
                    TxnMutation::Plain(m) => Err(m),
                };
                let mutation = match full {
                    Ok(data) if direct_size(data.len()) => {
                        let size = data.len() as u64;
                        let (file_id, reuse) = self.direct_target(size);
                        let (file, created) = match self.open_direct_target(file_id, reuse, size) {
                            Ok(f) => f,
                            Err(e) => {
                                ov.last.insert(pg, have);
                                return Err(e);
                            }
                        };
                        ov.objects.insert((pg, name.clone()), Some((file_id, size)));
                        let block_crcs =
                            (block_crcs.len() as u64 == block_count(size)).then_some(block_crcs);
                        self.direct.push(DirectWrite {
                            file_id,
                            data,
                            file,
                            created,
                            block_crcs,
                        });
                        return Ok(Record::ApplyDirect {
                            pg,
                            name,
                            version,
                            file_id,
                            size,
                            check: DirectCheck::default(),
                        });
                    }
                    // A shared payload too small for a file of its own.
                    Ok(data) => Mutation::WriteFull(data.into_vec()),
                    Err(m) => m,
                };
                let existing = self.exists(ov, pg, &name);
                let cur_size = existing.map_or(0, |(_, size)| size);
                let new_size = match &mutation {
                    Mutation::WriteFull(d) => d.len() as u64,
                    Mutation::Write { offset, data } => {
                        cur_size.max(offset.saturating_add(data.len() as u64))
                    }
                    Mutation::Truncate { size_bytes } => *size_bytes,
                    Mutation::Delete => 0,
                    Mutation::WriteExtents { extents, .. } => {
                        cur_size.max(extents.last().map_or(0, |e| e.offset + e.len_bytes as u64))
                    }
                };
                let whole = matches!(mutation, Mutation::WriteFull(_));
                let file_id = match (&mutation, existing) {
                    (Mutation::Delete, e) => e.map_or(0, |(id, _)| id),
                    // Small: a new object, an inline one, or a file-backed one replaced
                    // whole is (or becomes) inline.
                    (_, e)
                        if self.fits_inline(new_size)
                            && (whole || e.is_none_or(|(id, _)| id == 0)) =>
                    {
                        0
                    }
                    (_, Some((id, _))) if id != 0 => id,
                    // A new large object, or an inline object growing past the threshold.
                    _ => self.alloc_file(),
                };
                if file_id != 0 && !matches!(mutation, Mutation::Delete) {
                    // The blocks the record's application writes are allocated now, before
                    // the journal write: applying a durable record never meets ENOSPC.
                    let relocating = existing.map(|(id, _)| id) != Some(file_id);
                    let (start, end) = match &mutation {
                        Mutation::WriteFull(d) => (0, d.len() as u64),
                        Mutation::Write { offset, data } if relocating => {
                            (0, cur_size.max(offset + data.len() as u64))
                        }
                        Mutation::Write { offset, data } => (*offset, offset + data.len() as u64),
                        Mutation::WriteExtents { .. } if relocating => (0, new_size),
                        Mutation::WriteExtents { extents, .. } => (
                            extents.first().map_or(0, |e| e.offset),
                            extents.last().map_or(0, |e| e.offset + e.len_bytes as u64),
                        ),
                        Mutation::Truncate { size_bytes } if relocating => {
                            (0, cur_size.min(*size_bytes))
                        }
                        Mutation::Truncate { .. } | Mutation::Delete => (0, 0),
                    };
                    if let Err(e) = self.preallocate(file_id, start, end - start) {
                        if relocating {
                            self.remove_new_file(file_id);
                        }
                        ov.last.insert(pg, have);
                        return Err(e);
                    }
                }
                let after = (!matches!(mutation, Mutation::Delete)).then_some((file_id, new_size));
                ov.objects.insert((pg, name.clone()), after);
                Record::Apply {
                    pg,
                    name,
                    version,
                    file_id,
                    mutation,
                }
            }
            TxnKind::Recover { pg, name, state } => {
                let state = match state {
                    Some((data, version))
                        if data.len() >= DIRECT_WRITE_BYTES_MIN
                            && !self.fits_inline(data.len() as u64) =>
                    {
                        let size = data.len() as u64;
                        let (file_id, reuse) = self.direct_target(size);
                        let (file, created) = self.open_direct_target(file_id, reuse, size)?;
                        ov.objects.insert((pg, name.clone()), Some((file_id, size)));
                        self.direct.push(DirectWrite {
                            file_id,
                            data: DirectData::Owned(data),
                            file,
                            created,
                            block_crcs: None,
                        });
                        return Ok(Record::RecoverDirect {
                            pg,
                            name,
                            version,
                            file_id,
                            size,
                            check: DirectCheck::default(),
                        });
                    }
                    other => other,
                };
                let existing = self.exists(ov, pg, &name);
                let file_id = match (&state, existing) {
                    (None, e) => e.map_or(0, |(id, _)| id),
                    (Some((d, _)), _) if self.fits_inline(d.len() as u64) => 0,
                    (Some(_), Some((id, _))) if id != 0 => id,
                    (Some(_), _) => self.alloc_file(),
                };
                if let (Some((d, _)), true) = (&state, file_id != 0) {
                    if let Err(e) = self.preallocate(file_id, 0, d.len() as u64) {
                        if existing.map(|(id, _)| id) != Some(file_id) {
                            self.remove_new_file(file_id);
                        }
                        return Err(e);
                    }
                }
                let after = state.as_ref().map(|(d, _)| (file_id, d.len() as u64));
                ov.objects.insert((pg, name.clone()), after);
                Record::Recover {
                    pg,
                    name,
                    file_id,
                    state,
                }
            }
            TxnKind::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            } => {
                ov.last.insert(pg, last_version);
                Record::SetPgLog {
                    pg,
                    entries,
                    last_version,
                    log_tail,
                }
            }
            TxnKind::RemovePg { pg } => {
                ov.last.insert(pg, Version::ZERO);
                ov.removed.insert(pg);
                ov.objects.retain(|(p, _), _| *p != pg);
                Record::RemovePg { pg }
            }
            TxnKind::PgMark { pg, incomplete } => Record::PgMark { pg, incomplete },
        })
    }

    /// Applies one journaled record to the data files and the in-memory state.
    pub(super) fn exec(&mut self, record: Record) -> Result<(), StoreError> {
        let max = self.sh.config.pg_log_max_entries;
        match record {
            Record::Apply {
                pg,
                name,
                version,
                file_id,
                mutation,
            } => {
                self.next_file_id = self.next_file_id.max(file_id + 1);
                let op = if matches!(mutation, Mutation::Delete) {
                    self.delete_object(pg, &name)?;
                    LogOp::Delete
                } else {
                    let e = self.get_or_create(pg, &name, file_id);
                    self.begin_write(&e);
                    let whole = matches!(mutation, Mutation::WriteFull(_));
                    self.relocate(pg, &name, &e, file_id, whole)?;
                    if file_id == 0 {
                        self.apply_inline(pg, &name, &e, mutation)?;
                    } else {
                        match mutation {
                            Mutation::WriteFull(data) => self.write_full(&e, data)?,
                            Mutation::Write { offset, data } => self.write_at(&e, offset, &data)?,
                            Mutation::WriteExtents { extents, data } => {
                                self.write_extents(&e, &extents, &data)?
                            }
                            Mutation::Truncate { size_bytes } => self.truncate(&e, size_bytes)?,
                            Mutation::Delete => {}
                        }
                    }
                    e.lock().version = version;
                    if self.replaying {
                        self.replayed.insert((pg, name.clone()));
                    }
                    LogOp::Modify
                };
                let mut pgs = self.sh.pgs_write();
                if let Some(p) = pgs.get_mut(&pg) {
                    p.push_log(LogEntry { version, name, op }, max);
                }
            }
            Record::Recover {
                pg,
                name,
                file_id,
                state,
            } => {
                self.next_file_id = self.next_file_id.max(file_id + 1);
                match state {
                    None => self.delete_object(pg, &name)?,
                    Some((data, version)) => {
                        let e = self.get_or_create(pg, &name, file_id);
                        self.begin_write(&e);
                        self.relocate(pg, &name, &e, file_id, true)?;
                        if file_id == 0 {
                            self.apply_inline(pg, &name, &e, Mutation::WriteFull(data))?;
                        } else {
                            self.write_full(&e, data)?;
                        }
                        e.lock().version = version;
                        if self.replaying {
                            self.replayed.insert((pg, name));
                        }
                    }
                }
            }
            Record::SetPgLog {
                pg,
                entries,
                last_version,
                log_tail,
            } => {
                let mut pgs = self.sh.pgs_write();
                let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
                p.log = entries.into();
                p.last_version = last_version;
                p.log_tail = log_tail;
                p.trim(max);
                p.ck_log_reset = true;
                p.ck_dirty = true;
            }
            Record::ApplyDirect {
                pg,
                name,
                version,
                file_id,
                size,
                check,
            } => {
                self.exec_direct(pg, &name, version, file_id, size, check.crcs)?;
                let mut pgs = self.sh.pgs_write();
                if let Some(p) = pgs.get_mut(&pg) {
                    let op = LogOp::Modify;
                    p.push_log(LogEntry { version, name, op }, max);
                }
            }
            Record::RecoverDirect {
                pg,
                name,
                version,
                file_id,
                size,
                check,
            } => self.exec_direct(pg, &name, version, file_id, size, check.crcs)?,
            Record::PgMark { pg, incomplete } => {
                let mut pgs = self.sh.pgs_write();
                let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
                p.incomplete = incomplete;
                if !incomplete {
                    // Complete again: the log may have gaps (objects recovered by state),
                    // so it is dropped; everything up to last_version is present.
                    p.log.clear();
                    p.log_tail = p.last_version;
                    p.ck_log_reset = true;
                }
                p.ck_dirty = true;
            }
            Record::RemovePg { pg } => {
                let removed = self.sh.pgs_write().remove(&pg);
                self.removed_pgs.insert(pg);
                if let Some(p) = removed {
                    for (name, e) in p.objects {
                        self.uncount(&e);
                        self.begin_write(&e);
                        let id = e.lock().file_id;
                        if id != 0 {
                            self.unlink(id)?;
                        }
                        self.replayed.remove(&(pg, name));
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes the size of `e`, just removed from the PG map, out of `Counters::data_bytes`.
    fn uncount(&self, e: &Arc<ObjEntry>) {
        let size = e.lock().size;
        let before = self.sh.counters.data_bytes.fetch_sub(size, Relaxed);
        debug_assert!(before >= size, "data_bytes below a removed object's size");
    }

    /// Marks `e` as being written (readers wait or retry).
    pub(super) fn begin_write(&mut self, e: &Arc<ObjEntry>) {
        {
            let mut st = e.lock();
            st.writing += 1;
            st.gen += 1;
        }
        self.touched.push(e.clone());
    }

    /// The entry of `name` in `pg`, created (with `file_id`) if missing.
    pub(super) fn get_or_create(&mut self, pg: PgId, name: &str, file_id: u64) -> Arc<ObjEntry> {
        let mut pgs = self.sh.pgs_write();
        let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
        p.ck_dirty_objects.insert(name.to_string());
        let e = p
            .objects
            .entry(name.to_string())
            .or_insert_with(|| {
                ObjEntry::new(ObjState {
                    file_id,
                    inline: (file_id == 0).then(|| Arc::new(Vec::new())),
                    size: 0,
                    version: Version::ZERO,
                    crcs: Vec::new(),
                    writing: 0,
                    gen: 0,
                })
            })
            .clone();
        drop(pgs);
        e
    }

    /// Removes `name` from `pg` (if present) and unlinks its file.
    pub(super) fn delete_object(&mut self, pg: PgId, name: &str) -> Result<(), StoreError> {
        let removed = {
            let mut pgs = self.sh.pgs_write();
            let p = pg_entry(&mut pgs, pg, self.removed_pgs.contains(&pg));
            p.ck_dirty_objects.insert(name.to_string());
            p.objects.remove(name)
        };
        if let Some(e) = removed {
            self.uncount(&e);
            self.begin_write(&e);
            let id = e.lock().file_id;
            if id != 0 {
                self.unlink(id)?;
            }
        }
        Ok(())
    }

    /// Drops a data file no object references any more (called only once that is durable
    /// or, at open, known): removed by the unlink thread while `run` is going, else here.
    pub(super) fn unlink(&mut self, file_id: u64) -> Result<(), StoreError> {
        self.sh.forget_file(file_id);
        self.dirty_files.remove(&file_id);
        let path = self.sh.file_path(file_id);
        // Keep large files for in-place reuse: block-aligned ones (O_DIRECT overwrites)
        // and any written through the page cache (overwritten at their exact length, so
        // an erasure-coded shard with its 16-byte trailer is reused too). Only while
        // running: at open, unreferenced files are removed.
        if self.unlinker.is_some()
            && !self.full
            && !self.sh.space_tight.load(Relaxed)
            && self.freed_this_epoch.len() + self.reusable.len() < REUSABLE_FILES_MAX
        {
            if let Ok(size) = self.sh.disk.file_len(&path) {
                let kept = kept_bytes(&self.freed_this_epoch) + kept_bytes(&self.reusable);
                if size >= DIRECT_WRITE_BYTES_MIN as u64
                    && kept + size <= REUSABLE_BYTES_MAX
                    && (size.is_multiple_of(JOURNAL_ALIGN as u64) || super::direct::is_cached(size))
                {
                    self.freed_this_epoch.push((file_id, size));
                    return Ok(());
                }
            }
        }
        let path = match &self.unlinker {
            Some(tx) => match tx.send(path) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(path)) => {
                    self.unlinker = None;
                    path
                }
            },
            None => path,
        };
        Ok(remove_file_if_present(&*self.sh.disk, &path)?)
    }

    /// Removes an unreferenced data file (through the unlink thread when running).
    pub(super) fn remove_unreferenced(&mut self, file_id: u64) {
        let path = self.sh.file_path(file_id);
        let path = match &self.unlinker {
            Some(tx) => match tx.send(path) {
                Ok(()) => return,
                Err(mpsc::SendError(path)) => path,
            },
            None => path,
        };
        if let Err(e) = remove_file_if_present(&*self.sh.disk, &path) {
            tracing::warn!(file_id, error = %e, "cannot remove an unreferenced data file");
        }
    }

    /// Removes a data file created for the batch being built (not journaled).
    pub(super) fn remove_new_file(&mut self, file_id: u64) {
        self.batch_new_files.retain(|&id| id != file_id);
        self.batch_reused.retain(|&(id, _)| id != file_id);
        self.sh.forget_file(file_id);
        self.dirty_files.remove(&file_id);
        if let Err(e) = remove_file_if_present(&*self.sh.disk, &self.sh.file_path(file_id)) {
            tracing::warn!(file_id, error = %e, "cannot remove an unjournaled data file");
        }
    }

    pub(super) fn submit_write(
        &mut self,
        file: &FileRef,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        if data.is_empty() {
            return Ok(());
        }
        file.write_all_at(data, offset)?;
        Ok(())
    }

    /// Reads `[start, start + len)` of `file` (zeros past its end).
    pub(super) fn read_old(
        &mut self,
        file: &FileRef,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let mut buf = vec![0u8; len as usize];
        if len == 0 {
            return Ok(buf);
        }
        let (n, buf) = self
            .sh
            .disk
            .read_start(file, start, IoBuf::from(std::mem::take(&mut buf)))
            .wait()?;
        let mut buf = buf.into_vec();
        buf.truncate(n);
        buf.resize(len as usize, 0);
        Ok(buf)
    }

    /// Grows `st` to `new` bytes of zeros (CRCs only; the file grows by the caller).
    pub(super) fn grow_crcs(st: &mut ObjState, new: u64, total: &std::sync::atomic::AtomicU64) {
        let old = st.size;
        if new <= old {
            return;
        }
        if !old.is_multiple_of(BLOCK_BYTES) {
            let b = old / BLOCK_BYTES;
            let cur = block_len(old, b);
            let next = block_len(new, b);
            if let Some(c) = st.crcs.get_mut(b as usize) {
                *c = append_zeros(*c, next - cur);
            }
        }
        for b in block_count(old)..block_count(new) {
            st.crcs.push(zero_crc(block_len(new, b)));
        }
        st.set_size(new, total);
    }

    pub(super) fn write_at(
        &mut self,
        e: &Arc<ObjEntry>,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        let end = offset + data.len() as u64;
        let new = old.max(end);
        let mut new_crcs = Vec::new();
        if !data.is_empty() {
            for b in offset / BLOCK_BYTES..=(end - 1) / BLOCK_BYTES {
                let bs = b * BLOCK_BYTES;
                let be = bs + block_len(new, b);
                let crc = if offset <= bs && end >= be {
                    spindle_types::crc::crc32c(
                        &data[(bs - offset) as usize..(be - offset) as usize],
                    )
                } else {
                    let old_end = old.min(be).max(bs);
                    let mut block = self.read_old(&file, bs, old_end - bs)?;
                    block.resize((be - bs) as usize, 0);
                    let from = offset.max(bs);
                    let to = end.min(be);
                    block[(from - bs) as usize..(to - bs) as usize]
                        .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                    spindle_types::crc::crc32c(&block)
                };
                new_crcs.push((b, crc));
            }
        }
        {
            let mut st = e.lock();
            Self::grow_crcs(&mut st, new, &self.sh.counters.data_bytes);
            for (b, crc) in new_crcs {
                if let Some(c) = st.crcs.get_mut(b as usize) {
                    *c = crc;
                }
            }
        }
        if data.is_empty() && new > old {
            file.set_len(new)?;
        }
        self.submit_write(&file, offset, data)
    }

    /// A multi-extent write: one `write_at` per extent, in order (each reads the block
    /// bytes the one before wrote, where they share a block).
    pub(super) fn write_extents(
        &mut self,
        e: &Arc<ObjEntry>,
        extents: &[spindle_types::Extent],
        data: &[u8],
    ) -> Result<(), StoreError> {
        for (offset, piece) in spindle_types::extent_pieces(extents, data) {
            self.write_at(e, offset, piece)?;
        }
        Ok(())
    }

    pub(super) fn truncate(&mut self, e: &Arc<ObjEntry>, new: u64) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        if new < old && !new.is_multiple_of(BLOCK_BYTES) {
            let b = new / BLOCK_BYTES;
            let bs = b * BLOCK_BYTES;
            let block = self.read_old(&file, bs, new - bs)?;
            let crc = spindle_types::crc::crc32c(&block);
            let mut st = e.lock();
            st.crcs.truncate(b as usize);
            st.crcs.push(crc);
            st.set_size(new, &self.sh.counters.data_bytes);
        } else if new < old {
            let mut st = e.lock();
            st.crcs.truncate(block_count(new) as usize);
            st.set_size(new, &self.sh.counters.data_bytes);
        } else {
            Self::grow_crcs(&mut e.lock(), new, &self.sh.counters.data_bytes);
        }
        file.set_len(new)?;
        Ok(())
    }

    pub(super) fn write_full(
        &mut self,
        e: &Arc<ObjEntry>,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        let file_id = e.lock().file_id;
        let file = self.sh.file(file_id, true)?;
        self.dirty_files.insert(file_id);
        let old = e.lock().size;
        let new = data.len() as u64;
        if new < old {
            file.set_len(new)?;
        }
        {
            let mut st = e.lock();
            st.crcs = crcs_of(&data);
            st.set_size(new, &self.sh.counters.data_bytes);
        }
        self.submit_write(&file, 0, &data)
    }
}
