//! Group commit: a batch of queued transactions is admitted, validated and written to the
//! journal in one O_DSYNC write; a failed journal write aborts the whole batch.

use super::*;

impl Worker {
    /// Validates a batch (against the state plus the batch's earlier transactions, `ov`),
    /// writes its direct payloads and its journal record. `None` if nothing is left to
    /// journal.
    pub(super) fn submit_batch(&mut self, batch: Vec<Txn>, ov: &mut Overlay) -> Option<Committed> {
        if let Some(f) = &self.failed {
            for t in batch {
                let _ = t.done.send(Err(StoreError::Failed(f.clone())));
            }
            return None;
        }
        let batch = self.admit(batch);
        let mut records = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        let mut hint = 0;
        for t in batch {
            match self.validate(ov, t.kind) {
                Ok(r) => {
                    hint += r.encoded_bytes_hint();
                    records.push(r);
                    waiters.push(t.done);
                }
                Err(e) => {
                    if let StoreError::NoSpace(msg) = &e {
                        self.enter_full(msg);
                    }
                    let _ = t.done.send(Err(e));
                }
            }
        }
        if records.is_empty() {
            return None;
        }
        let seq_before = self.next_seq;
        let submitted = self
            .write_direct()
            .and_then(|_| self.journal_submit(&records, hint));
        match submitted.map_err(StoreError::classify) {
            Ok(padded) => {
                self.batch_new_files.clear();
                self.batch_reused.clear();
                Some(Committed {
                    padded,
                    records,
                    waiters,
                })
            }
            // Nothing of the batch is in the journal (or it was zeroed again) and nothing
            // was applied: undo what validation reserved and fail just this batch.
            Err(StoreError::NoSpace(msg)) => {
                self.abort_batch(seq_before);
                self.enter_full(&msg);
                for w in waiters {
                    let _ = w.send(Err(StoreError::NoSpace(msg.clone())));
                }
                None
            }
            Err(e) => {
                self.fail(&e);
                for w in waiters {
                    let _ = w.send(Err(e.duplicate()));
                }
                None
            }
        }
    }

    /// Journal space for the batch, before anything is validated, and full-mode
    /// admission: returns the transactions to validate (the others are answered
    /// `NoSpace`).
    pub(super) fn admit(&mut self, batch: Vec<Txn>) -> Vec<Txn> {
        if !self.full {
            let need: usize = batch.iter().map(|t| self.journal_bytes_max(&t.kind)).sum();
            match self.reserve_journal(need) {
                Ok(()) => return batch,
                Err(StoreError::NoSpace(msg)) => self.enter_full(&msg),
                // Other errors surface at the journal write (and latch there).
                Err(_) => return batch,
            }
        }
        let mut keep = Vec::with_capacity(batch.len());
        for t in batch {
            if frees_space(&t.kind) {
                keep.push(t);
            } else {
                let _ = t.done.send(Err(StoreError::NoSpace(FULL_MESSAGE.into())));
            }
        }
        let need: usize = keep.iter().map(|t| self.journal_bytes_max(&t.kind)).sum();
        if let Err(e) = self.reserve_journal(need) {
            if matches!(e, StoreError::NoSpace(_)) {
                for t in keep {
                    let _ = t.done.send(Err(e.duplicate()));
                }
                return Vec::new();
            }
        }
        keep
    }

    /// Makes sure the journal has `need` bytes of records (padded) allocated ahead of the
    /// write position.
    pub(super) fn reserve_journal(&mut self, need: usize) -> Result<(), StoreError> {
        if need == 0 {
            return Ok(());
        }
        let end = self.journal_pos + journal::batch_padded_len(need) as u64;
        self.extend_journal(end).map_err(StoreError::classify)
    }

    /// An upper bound of the journal bytes `kind`'s record takes (data of direct writes
    /// excluded: it goes to its own file).
    pub(super) fn journal_bytes_max(&self, kind: &TxnKind) -> usize {
        let data = |len: usize, may_be_direct: bool| {
            if may_be_direct && len >= DIRECT_WRITE_BYTES_MIN && !self.fits_inline(len as u64) {
                0
            } else {
                len
            }
        };
        RECORD_BYTES_MAX_OVERHEAD
            + match kind {
                TxnKind::Apply { name, mutation, .. } => {
                    name.len()
                        + match mutation {
                            TxnMutation::FullShared(d) => data(d.len(), true),
                            TxnMutation::Plain(Mutation::WriteFull(d)) => data(d.len(), true),
                            TxnMutation::Plain(Mutation::Write { data: d, .. }) => d.len(),
                            TxnMutation::Plain(_) => 0,
                        }
                }
                TxnKind::Recover { name, state, .. } => {
                    name.len() + state.as_ref().map_or(0, |(d, _)| data(d.len(), true))
                }
                TxnKind::SetPgLog { entries, .. } => {
                    entries.iter().map(|e| 32 + e.name.len()).sum::<usize>()
                }
                TxnKind::RemovePg { .. } | TxnKind::PgMark { .. } => 0,
            }
    }

    /// Undoes what validation did for a batch that failed before its journal write
    /// (sequence numbers, files created for it, reusable files taken).
    pub(super) fn abort_batch(&mut self, seq_before: u64) {
        self.next_seq = seq_before;
        self.direct.clear();
        self.direct_crcs.clear();
        for id in std::mem::take(&mut self.batch_new_files) {
            self.remove_new_file(id);
        }
        self.reusable.append(&mut self.batch_reused);
    }

    /// Encodes `records` into one aligned buffer and writes it (O_DSYNC) at the journal end.
    /// Returns the padded length written. On a failure nothing of the batch is valid in
    /// the journal when the error is ENOSPC (a partly written batch is zeroed again and
    /// the sequence numbers are given back by the caller); other errors latch the store.
    pub(super) fn journal_submit(
        &mut self,
        records: &[Record],
        hint: usize,
    ) -> Result<u64, StoreError> {
        let mut bytes = Vec::with_capacity(hint);
        for r in records {
            r.encode(self.epoch, self.next_seq, &mut bytes);
            self.next_seq += 1;
        }
        let padded = journal::batch_padded_len(bytes.len());
        let mut buf = IoBuf::aligned(padded, JOURNAL_ALIGN);
        buf[..bytes.len()].copy_from_slice(&bytes);
        drop(bytes);
        self.extend_journal(self.journal_pos + padded as u64)
            .map_err(StoreError::classify)?;
        // A blocking write on this thread rather than a request to the I/O engine: the
        // worker waits for its (single) journal write anyway, and going through the
        // engine's ring thread (and the kernel's io-wq worker an O_DSYNC direct write is
        // punted to) added three thread hand-offs per commit; measured on 4 KiB random
        // writes, docs/benchmarks.md. A failed or short write fails the batch.
        match self.journal.write_all_at(&buf, self.journal_pos) {
            Ok(()) => {
                self.journal_pos += padded as u64;
                Ok(padded as u64)
            }
            // The region was allocated by `extend_journal`, so this is not expected; if it
            // happens, a prefix of the batch's records may be on disk and valid: zero the
            // region again so that replay never accepts them (later batches reuse these
            // sequence numbers), else latch.
            Err(e) if is_no_space(&e) => {
                let zeros = IoBuf::aligned(padded, JOURNAL_ALIGN);
                match self.journal.write_all_at(&zeros, self.journal_pos) {
                    Ok(()) => Err(StoreError::NoSpace(format!("journal write: {e}"))),
                    Err(z) => {
                        self.journal_pos += padded as u64;
                        Err(StoreError::Failed(format!(
                            "journal write failed ({e}) and the partial batch could not be \
                             erased ({z})"
                        )))
                    }
                }
            }
            Err(e) => {
                self.journal_pos += padded as u64;
                Err(StoreError::Io(e))
            }
        }
    }

    /// Makes sure the journal is allocated and written (with zeros) up to `end`, in chunks,
    /// so that batch writes overwrite allocated blocks and the O_DSYNC write needs no
    /// metadata commit.
    pub(super) fn extend_journal(&mut self, end: u64) -> Result<(), StoreError> {
        while self.journal_zeroed < end {
            // Full: only what is needed (the space left may be less than a chunk).
            let chunk = if self.full {
                end - self.journal_zeroed
            } else {
                JOURNAL_ZERO_CHUNK_BYTES.max(end - self.journal_zeroed)
            };
            let buf = IoBuf::aligned(chunk as usize, JOURNAL_ALIGN);
            let journal = self.journal.clone();
            let mut write = std::iter::once((journal, self.journal_zeroed, buf));
            self.sh.disk.write_batch(&mut write)?;
            self.journal_zeroed += chunk;
        }
        Ok(())
    }

    /// Ends the current batch: lets readers in again.
    pub(super) fn finish_batch(&mut self) {
        for e in self.touched.drain(..) {
            {
                let mut st = e.lock();
                st.writing -= 1;
                st.gen += 1;
            }
            e.notify.notify_waiters();
        }
    }
}
