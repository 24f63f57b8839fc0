//! Group commit: a batch of queued transactions is admitted, validated and written to the
//! journal in one O_DSYNC write; a failed journal write aborts the whole batch.

use super::*;

impl Worker {
    /// Validates a batch (against the state plus the batch's earlier transactions, `ov`),
    /// writes its direct payloads and its journal record. `None` if nothing is left to
    /// journal. The second value is the transactions deferred to the next batch: those
    /// after one that touches an object a direct write of this batch writes (see
    /// `touches_direct`).
    pub(super) fn submit_batch(
        &mut self,
        batch: Vec<Txn>,
        ov: &mut Overlay,
    ) -> (Option<Committed>, Vec<Txn>) {
        if let Some(f) = &self.failed {
            for t in batch {
                let _ = t.done.send(Err(StoreError::Failed(f.clone())));
            }
            return (None, Vec::new());
        }
        let batch = self.admit(batch);
        let mut records = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        let mut hint = 0;
        let mut direct_objects: HashSet<(PgId, String)> = HashSet::new();
        let mut deferred = Vec::new();
        let mut txns = batch.into_iter();
        while let Some(t) = txns.next() {
            if touches_direct(&t.kind, &direct_objects) {
                deferred.push(t);
                deferred.extend(txns);
                break;
            }
            match self.validate(ov, t.kind) {
                Ok(r) => {
                    if let Record::ApplyDirect { pg, name, .. }
                    | Record::RecoverDirect { pg, name, .. } = &r
                    {
                        direct_objects.insert((*pg, name.clone()));
                    }
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
            return (None, deferred);
        }
        let seq_before = self.next_seq;
        let submitted = self
            .write_records(&mut records, hint)
            .map_err(StoreError::classify);
        let committed = match submitted {
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
        };
        (committed, deferred)
    }

    /// Writes a validated batch: its journal record, and its direct writes' data in flight
    /// at the same time (one flush for both, see `journal::DirectCheck`). Returns the padded
    /// journal length written. On ENOSPC nothing of the batch is valid in the journal (it
    /// is zeroed again, and the caller gives the sequence numbers back); any other failure
    /// latches the store (replay then decides what of the batch landed).
    fn write_records(&mut self, records: &mut [Record], hint: usize) -> Result<u64, StoreError> {
        if self.direct.is_empty() {
            return self.journal_submit(records, hint);
        }
        let PreparedDirect {
            writes,
            fix_len,
            created,
        } = self.prepare_direct();
        let batch_last_seq = self.next_seq + records.len() as u64 - 1;
        for r in records.iter_mut() {
            if let Record::ApplyDirect { file_id, check, .. }
            | Record::RecoverDirect { file_id, check, .. } = r
            {
                let crcs = self.direct_crcs.remove(file_id);
                assert!(crcs.is_some(), "direct record without its prepared write");
                *check = DirectCheck {
                    batch_last_seq,
                    crcs: crcs.unwrap_or_default(),
                };
            }
        }
        assert!(
            self.direct_crcs.is_empty(),
            "prepared write without its record"
        );
        let (buf, padded) = self.encode_records(records, hint);
        self.extend_journal(self.journal_pos + padded as u64)
            .map_err(StoreError::classify)?;
        // Every data write and the journal write in flight at once; the data files are
        // O_DSYNC, so each write is durable when it completes.
        let mut all = writes.into_iter().chain(std::iter::once((
            self.journal.clone(),
            self.journal_pos,
            buf,
        )));
        let written = self.sh.disk.write_batch(&mut all);
        drop(all);
        if let Err(e) = written {
            return Err(self.journal_write_failed(e, padded));
        }
        self.journal_pos += padded as u64;
        // The record is durable: a failure from here on latches (never an abort that
        // would hand the record's sequence numbers and files to a later batch).
        self.finish_direct(fix_len, created).map_err(|e| {
            StoreError::Failed(format!("completing the batch's direct writes: {e}"))
        })?;
        Ok(padded as u64)
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

    /// An upper bound of the journal bytes `kind`'s record takes (of a direct write's data
    /// only its checksums: the data goes to its own file).
    pub(super) fn journal_bytes_max(&self, kind: &TxnKind) -> usize {
        let data = |len: usize, may_be_direct: bool| {
            if may_be_direct && len >= DIRECT_WRITE_BYTES_MIN && !self.fits_inline(len as u64) {
                // Only the block checksums travel in the record.
                DirectCheck::encoded_bytes(block_count(len as u64) as usize)
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
                            TxnMutation::Plain(Mutation::WriteExtents { extents, data }) => {
                                data.len() + extents.len() * 12
                            }
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

    /// Encodes `records` into one zero-padded aligned buffer (consuming their sequence
    /// numbers); returns it with its padded length.
    fn encode_records(&mut self, records: &[Record], hint: usize) -> (IoBuf, usize) {
        let mut bytes = Vec::with_capacity(hint);
        for r in records {
            r.encode(self.epoch, self.next_seq, &mut bytes);
            self.next_seq += 1;
        }
        let padded = journal::batch_padded_len(bytes.len());
        let mut buf = IoBuf::aligned(padded, JOURNAL_ALIGN);
        buf[..bytes.len()].copy_from_slice(&bytes);
        (buf, padded)
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
        let (buf, padded) = self.encode_records(records, hint);
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
            Err(e) => Err(self.journal_write_failed(e, padded)),
        }
    }

    /// After a failed batch write at the journal end (`padded` bytes): on ENOSPC a prefix
    /// of the batch's records may be on disk and valid, so the region is zeroed again and
    /// replay never accepts them (later batches reuse these sequence numbers), else the
    /// store latches.
    fn journal_write_failed(&mut self, e: io::Error, padded: usize) -> StoreError {
        if !is_no_space(&e) {
            self.journal_pos += padded as u64;
            return StoreError::Io(e);
        }
        // The region was allocated by `extend_journal`, so the journal write itself is not
        // expected to meet ENOSPC (a direct write's new file can).
        let zeros = IoBuf::aligned(padded, JOURNAL_ALIGN);
        match self.journal.write_all_at(&zeros, self.journal_pos) {
            Ok(()) => StoreError::NoSpace(format!("batch write: {e}")),
            Err(z) => {
                self.journal_pos += padded as u64;
                StoreError::Failed(format!(
                    "batch write failed ({e}) and the partial batch could not be erased ({z})"
                ))
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

/// Whether a transaction touches an object a direct write of the current batch writes
/// (`direct`: its (PG, name)s): it then goes to the next batch. Replay checks a direct
/// record of the journal's last batch against its file, and a later record of the same
/// batch that changed that file (a write, a delete, a PG removal) would make an
/// acknowledged batch fail the check.
fn touches_direct(kind: &TxnKind, direct: &HashSet<(PgId, String)>) -> bool {
    if direct.is_empty() {
        return false;
    }
    match kind {
        TxnKind::Apply { pg, name, .. } | TxnKind::Recover { pg, name, .. } => {
            direct.contains(&(*pg, name.clone()))
        }
        TxnKind::RemovePg { pg } => direct.iter().any(|(p, _)| p == pg),
        TxnKind::SetPgLog { .. } | TxnKind::PgMark { .. } => false,
    }
}
