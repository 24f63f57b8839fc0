//! Inline objects (<= 16 KiB): their bytes live in the journal and, after a checkpoint, in
//! the metadata database; they move to a file of their own when they grow.

use super::*;

impl Worker {
    /// The bytes of inline object `e` (`name` in `pg`): the in-memory copy, else loaded from
    /// the metadata database (and kept in memory: the caller is about to change them).
    /// Missing or wrong-length stored bytes are taken as zeros / cut to the size, as a
    /// missing or short data file is by the file path (reads still detect it by CRC).
    pub(super) fn inline_data(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
    ) -> Result<Arc<Vec<u8>>, StoreError> {
        if let Some(d) = &e.lock().inline {
            return Ok(d.clone());
        }
        let mut data = meta::load_inline(&*self.sh.db()?, pg, name)?.unwrap_or_default();
        let mut st = e.lock();
        data.resize(usize::try_from(st.size).unwrap_or(usize::MAX), 0);
        let data = Arc::new(data);
        st.inline = Some(data.clone());
        Ok(data)
    }

    /// Moves object `e` to `target` (0: inline, else that data file) if it is elsewhere.
    /// `whole`: the caller replaces all the bytes next, so they need not be carried over.
    pub(super) fn relocate(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
        target: u64,
        whole: bool,
    ) -> Result<(), StoreError> {
        let (cur, size) = {
            let st = e.lock();
            (st.file_id, st.size)
        };
        if cur == target {
            return Ok(());
        }
        if target == 0 {
            // File -> inline (a WriteFull / recover of a small object): drop the file.
            let data = if whole {
                Vec::new()
            } else {
                let file = self.sh.file(cur, true)?;
                let mut d = self.read_old(&file, 0, size)?;
                d.truncate(usize::try_from(size).unwrap_or(usize::MAX));
                d
            };
            {
                let mut st = e.lock();
                st.file_id = 0;
                st.inline = Some(Arc::new(data));
            }
            return self.unlink(cur);
        }
        if cur != 0 {
            e.lock().file_id = target;
            return Ok(());
        }
        // Inline -> file (the object grows past the threshold): the new file starts as a
        // copy of the inline bytes. Replay may find the file left by an earlier run: reset it.
        let data = if whole {
            None
        } else {
            Some(self.inline_data(pg, name, e)?)
        };
        {
            let mut st = e.lock();
            st.file_id = target;
            st.inline = None;
        }
        let file = self.sh.file(target, true)?;
        self.dirty_files.insert(target);
        file.set_len(0)?;
        if let Some(d) = data {
            file.set_len(d.len() as u64)?;
            self.submit_write(&file, 0, d.as_ref())?;
        }
        Ok(())
    }

    /// Applies `m` to inline object `e` (in memory; persisted at the next checkpoint).
    pub(super) fn apply_inline(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
        m: Mutation,
    ) -> Result<(), StoreError> {
        let too_large = || StoreError::InvalidArgument("inline object too large".into());
        // The byte ranges the mutation rewrites (their blocks get new CRCs).
        let (data, changed) = match m {
            Mutation::WriteFull(d) => {
                let n = d.len();
                (d, std::iter::once(0..n).collect())
            }
            Mutation::Delete => return Ok(()),
            Mutation::Write { offset, data: part } => {
                let from = usize::try_from(offset).map_err(|_| too_large())?;
                let to = from.checked_add(part.len()).ok_or_else(too_large)?;
                let mut d = self.take_inline(pg, name, e)?;
                if d.len() < to {
                    d.resize(to, 0);
                }
                d[from..to].copy_from_slice(&part);
                (d, std::iter::once(from..to).collect())
            }
            Mutation::WriteExtents {
                extents,
                data: parts,
            } => {
                let mut d = self.take_inline(pg, name, e)?;
                let mut changed = Vec::with_capacity(extents.len());
                for (offset, part) in spindle_types::extent_pieces(&extents, &parts) {
                    let from = usize::try_from(offset).map_err(|_| too_large())?;
                    let to = from.checked_add(part.len()).ok_or_else(too_large)?;
                    if d.len() < to {
                        d.resize(to, 0);
                    }
                    d[from..to].copy_from_slice(part);
                    changed.push(from..to);
                }
                (d, changed)
            }
            Mutation::Truncate { size_bytes } => {
                let n = usize::try_from(size_bytes).map_err(|_| too_large())?;
                let mut d = self.take_inline(pg, name, e)?;
                d.resize(n, 0);
                (d, Vec::new())
            }
        };
        self.inline_mem += data.len() as u64;
        let mut st = e.lock();
        let (old, new) = (st.size, data.len() as u64);
        // Like the file path: a block keeps its CRC unless the mutation changed its bytes or
        // its length, so damage to untouched stored bytes stays detectable.
        let crcs = data
            .chunks(BLOCK_BYTES as usize)
            .enumerate()
            .map(|(b, chunk)| {
                let (bs, be) = (b * BLOCK_BYTES as usize, (b + 1) * BLOCK_BYTES as usize);
                let b = b as u64;
                let touched = changed.iter().any(|c| c.start < be && c.end > bs);
                let same_len = block_len(old, b) == block_len(new, b);
                match st.crcs.get(b as usize) {
                    Some(c) if !touched && same_len => *c,
                    _ => spindle_types::crc::crc32c(chunk),
                }
            })
            .collect();
        st.crcs = crcs;
        st.set_size(new, &self.sh.counters.data_bytes);
        st.inline = Some(Arc::new(data));
        Ok(())
    }

    /// The inline bytes of `e`, taken out of the object for changing (copied only if a
    /// reader still holds them).
    pub(super) fn take_inline(
        &mut self,
        pg: PgId,
        name: &str,
        e: &Arc<ObjEntry>,
    ) -> Result<Vec<u8>, StoreError> {
        let old = self.inline_data(pg, name, e)?;
        e.lock().inline = None;
        Ok(Arc::try_unwrap(old).unwrap_or_else(|a| a.as_ref().clone()))
    }
}
