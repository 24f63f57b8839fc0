//! The Raft log and state machine of one monitor, in one redb database (`raft.redb`:
//! checksummed pages, every commit durable before it returns).
//!
//! The state machine is the cluster map: an entry is a [`Proposal`], "the map after epoch
//! `base_epoch`", applied only if the machine is at `base_epoch` (a compare-and-set, so a
//! proposal made by a leader that was deposed before it committed, from a map that is no
//! longer the latest, is refused the same way on every monitor). The applied map is
//! published on a watch channel: what subscriptions push and followers serve.

// openraft's traits fix the error type (`StorageError`, over 200 bytes); the helpers here
// return it too rather than converting at every call.
#![allow(clippy::result_large_err)]

use super::{MonRaftTypes as C, Outcome, Proposal};
use crate::auth::AuthDb;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, LogState, RaftLogReader, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};
use spindle_map::ClusterMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("raft_log");
const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("raft_meta");

type SErr = StorageError<u64>;

fn read_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::read(openraft::AnyError::error(e)).into()
}
fn write_err(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write(openraft::AnyError::error(e)).into()
}

/// Encoding of everything stored and sent: bincode with a size bound.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain data into a vector cannot fail.
    bincode::serialize(v).unwrap_or_default()
}
pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, String> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(b.len() as u64 + 1024)
        .deserialize(b)
        .map_err(|e| e.to_string())
}

/// A map the state machine applied: what subscribers get.
#[derive(Clone, Debug)]
pub struct Applied {
    pub epoch: u64,
    pub bytes: Arc<Vec<u8>>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SmDisk {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    map: Option<Vec<u8>>,
    /// The key database (`crate::auth::AuthDb`), if the cluster authenticates.
    auth: Option<Vec<u8>>,
}

/// What a new monitor's database holds before its Raft starts: its id, and for the
/// monitors of a new cluster the first members and the first map.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Boot {
    pub id: u64,
    /// The monitors a new cluster starts with (id, address); empty for a monitor that
    /// joins an existing cluster (`spindle mon add`).
    pub members: Vec<(u64, String)>,
    /// The first map (epoch 1 of a new cluster, or the map of a single-monitor database
    /// being converted); proposed by whichever monitor leads first.
    pub seed: Option<Vec<u8>>,
    /// The first key database of a cluster that authenticates (proposed with the map).
    pub auth_seed: Option<Vec<u8>>,
}

/// How long opening the database waits for a lock held by a monitor that is still exiting.
const DB_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The database shared by the log store and the state machine.
#[derive(Clone)]
pub struct RaftDb {
    db: Arc<redb::Database>,
}

impl RaftDb {
    pub fn open(path: &Path) -> Result<RaftDb, String> {
        // A monitor that was just killed can hold the file lock for a moment after its
        // process is reported gone (its threads still exiting); a supervisor restarting it at
        // once should not fail for that. A live second monitor still fails, after the wait.
        let deadline = std::time::Instant::now() + DB_LOCK_WAIT;
        let db = loop {
            match redb::Database::create(path) {
                Ok(db) => break db,
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(format!(
                        "{e} ({}; is another monitor running on this directory?)",
                        path.display()
                    ))
                }
            }
        };
        let tx = db.begin_write().map_err(|e| e.to_string())?;
        {
            tx.open_table(LOG).map_err(|e| e.to_string())?;
            tx.open_table(META).map_err(|e| e.to_string())?;
        }
        tx.commit().map_err(|e| e.to_string())?;
        Ok(RaftDb { db: Arc::new(db) })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let tx = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = tx.open_table(META).map_err(|e| e.to_string())?;
        Ok(t.get(key)
            .map_err(|e| e.to_string())?
            .map(|v| v.value().to_vec()))
    }

    fn put(&self, pairs: &[(&str, &[u8])]) -> Result<(), String> {
        let tx = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut t = tx.open_table(META).map_err(|e| e.to_string())?;
            for (k, v) in pairs {
                t.insert(*k, *v).map_err(|e| e.to_string())?;
            }
        }
        tx.commit().map_err(|e| e.to_string())
    }

    pub fn boot(&self) -> Result<Option<Boot>, String> {
        self.get("boot")?.map(|b| decode(&b)).transpose()
    }

    pub fn set_boot(&self, boot: &Boot) -> Result<(), String> {
        self.put(&[("boot", &encode(boot))])
    }

    /// Forgets the first map once a leader proposed it (it is then in the log).
    pub fn clear_seed(&self) -> Result<(), String> {
        if let Some(mut b) = self.boot()? {
            b.seed = None;
            b.auth_seed = None;
            self.set_boot(&b)?;
        }
        Ok(())
    }

    /// Whether this database has ever held Raft state (a vote or a log entry).
    pub fn has_raft_state(&self) -> Result<bool, String> {
        if self.get("vote")?.is_some() || self.get("sm")?.is_some() {
            return Ok(true);
        }
        let tx = self.db.begin_read().map_err(|e| e.to_string())?;
        let t = tx.open_table(LOG).map_err(|e| e.to_string())?;
        let any = t.first().map_err(|e| e.to_string())?.is_some();
        Ok(any)
    }
}

/// The Raft log.
#[derive(Clone)]
pub struct LogStore {
    db: RaftDb,
}

impl LogStore {
    pub fn new(db: RaftDb) -> LogStore {
        LogStore { db }
    }

    fn meta<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<Option<T>, SErr> {
        self.db
            .get(key)
            .map_err(read_err)?
            .map(|b| decode(&b).map_err(read_err))
            .transpose()
    }
}

impl RaftLogReader<C> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<C>>, SErr> {
        let tx = self.db.db.begin_read().map_err(read_err)?;
        let t = tx.open_table(LOG).map_err(read_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(read_err)? {
            let (_, v) = item.map_err(read_err)?;
            out.push(decode::<Entry<C>>(v.value()).map_err(read_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<C> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<C>, SErr> {
        let purged: Option<LogId<u64>> = self.meta("purged")?;
        let last = {
            let tx = self.db.db.begin_read().map_err(read_err)?;
            let t = tx.open_table(LOG).map_err(read_err)?;
            let last = match t.last().map_err(read_err)? {
                Some((_, v)) => Some(decode::<Entry<C>>(v.value()).map_err(read_err)?.log_id),
                None => None,
            };
            last
        };
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), SErr> {
        self.db
            .put(&[("vote", &encode(vote))])
            .map_err(|e| StorageIOError::write_vote(openraft::AnyError::error(e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, SErr> {
        self.meta("vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), SErr> {
        self.db
            .put(&[("committed", &encode(&committed))])
            .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, SErr> {
        Ok(self.meta::<Option<LogId<u64>>>("committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<C>> + Send,
        I::IntoIter: Send,
    {
        let res = (|| {
            let tx = self.db.db.begin_write().map_err(write_err)?;
            {
                let mut t = tx.open_table(LOG).map_err(write_err)?;
                for e in entries {
                    t.insert(e.log_id.index, encode(&e).as_slice())
                        .map_err(write_err)?;
                }
            }
            tx.commit().map_err(write_err)
        })();
        match &res {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        res
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        let tx = self.db.db.begin_write().map_err(write_err)?;
        {
            let mut t = tx.open_table(LOG).map_err(write_err)?;
            t.retain_in(log_id.index.., |_, _| false)
                .map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), SErr> {
        let tx = self.db.db.begin_write().map_err(write_err)?;
        {
            let mut m = tx.open_table(META).map_err(write_err)?;
            m.insert("purged", encode(&log_id).as_slice())
                .map_err(write_err)?;
            let mut t = tx.open_table(LOG).map_err(write_err)?;
            t.retain_in(..=log_id.index, |_, _| false)
                .map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }
}

struct SmInner {
    disk: SmDisk,
    snapshot_seq: u64,
}

/// The state machine: the latest applied map, the last applied log id and membership.
#[derive(Clone)]
pub struct StateMachine {
    db: RaftDb,
    inner: Arc<Mutex<SmInner>>,
    published: watch::Sender<Option<Applied>>,
    /// The applied key database, decoded.
    auth: Arc<Mutex<Option<Arc<AuthDb>>>>,
}

fn auth_of(bytes: &Option<Vec<u8>>) -> Option<Arc<AuthDb>> {
    bytes
        .as_ref()
        .and_then(|b| AuthDb::decode(b).ok())
        .map(Arc::new)
}

fn applied_of(map: &Option<Vec<u8>>) -> Option<Applied> {
    let bytes = map.as_ref()?;
    let epoch = ClusterMap::decode(bytes).ok()?.epoch;
    Some(Applied {
        epoch,
        bytes: Arc::new(bytes.clone()),
    })
}

impl StateMachine {
    /// Loads the applied state from the database.
    pub fn open(db: RaftDb) -> Result<StateMachine, String> {
        let disk: SmDisk = match db.get("sm")? {
            Some(b) => decode(&b)?,
            None => SmDisk::default(),
        };
        let (published, _) = watch::channel(applied_of(&disk.map));
        let auth = Arc::new(Mutex::new(auth_of(&disk.auth)));
        Ok(StateMachine {
            auth,
            db,
            inner: Arc::new(Mutex::new(SmInner {
                disk,
                snapshot_seq: 0,
            })),
            published,
        })
    }

    /// The applied maps, newest first seen: what subscriptions push.
    pub fn subscribe(&self) -> watch::Receiver<Option<Applied>> {
        self.published.subscribe()
    }

    /// The latest applied map.
    pub fn current(&self) -> Option<Applied> {
        self.published.borrow().clone()
    }

    /// The applied key database (None: the cluster does not authenticate, or it is not
    /// applied yet).
    pub fn auth(&self) -> Option<Arc<AuthDb>> {
        self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_auth(&self, bytes: &Option<Vec<u8>>) {
        *self.auth.lock().unwrap_or_else(|p| p.into_inner()) = auth_of(bytes);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SmInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn persist(&self, disk: &SmDisk) -> Result<(), SErr> {
        self.db.put(&[("sm", &encode(disk))]).map_err(write_err)
    }

    fn snapshot_of(disk: &SmDisk, seq: u64) -> Snapshot<C> {
        let meta = SnapshotMeta {
            last_log_id: disk.last_applied,
            last_membership: disk.membership.clone(),
            snapshot_id: format!("{}-{}", disk.last_applied.map_or(0, |l| l.index), seq),
        };
        Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(encode(&(&disk.map, &disk.auth)))),
        }
    }
}

/// The state machine's decision for one proposal (deterministic: every monitor decides the
/// same from the same state).
fn decide_auth(current: &Option<Vec<u8>>, base_version: u64, db: &[u8]) -> Result<u64, String> {
    let cur = match current {
        Some(b) => {
            AuthDb::decode(b)
                .map_err(|e| format!("applied key database: {e}"))?
                .version
        }
        None => 0,
    };
    if base_version != cur {
        return Err(format!(
            "key database change based on version {base_version} but it is at {cur}"
        ));
    }
    let next = AuthDb::decode(db).map_err(|e| format!("proposed key database: {e}"))?;
    if next.version != cur + 1 {
        return Err(format!(
            "proposed key database has version {} after {cur}",
            next.version
        ));
    }
    Ok(next.version)
}

fn decide(current: &Option<Vec<u8>>, base_epoch: u64, map: &[u8]) -> Result<u64, String> {
    let (cur_epoch, cur_cluster) = match current {
        Some(b) => {
            let m = ClusterMap::decode(b).map_err(|e| format!("applied map: {e}"))?;
            (m.epoch, Some(m.cluster_id))
        }
        None => (0, None),
    };
    if current.is_none() {
        // The first map of the group: epoch 1 of a new cluster, or the map of a
        // single-monitor database converted to Raft (any epoch).
        if base_epoch != 0 {
            return Err(format!(
                "proposal based on epoch {} but no map is applied yet",
                base_epoch
            ));
        }
        let first = ClusterMap::decode(map).map_err(|e| format!("proposed map: {e}"))?;
        return Ok(first.epoch);
    }
    if base_epoch != cur_epoch {
        return Err(format!(
            "proposal based on epoch {} but the map is at epoch {cur_epoch}",
            base_epoch
        ));
    }
    let next = ClusterMap::decode(map).map_err(|e| format!("proposed map: {e}"))?;
    if next.epoch != cur_epoch + 1 {
        return Err(format!(
            "proposed map has epoch {} after epoch {cur_epoch}",
            next.epoch
        ));
    }
    if cur_cluster.is_some_and(|c| c != next.cluster_id) {
        return Err("proposed map is of another cluster".into());
    }
    Ok(next.epoch)
}

impl RaftStateMachine<C> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), SErr> {
        let g = self.lock();
        Ok((g.disk.last_applied, g.disk.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, SErr>
    where
        I: IntoIterator<Item = Entry<C>> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        let disk = {
            let mut g = self.lock();
            for e in entries {
                g.disk.last_applied = Some(e.log_id);
                let outcome = match e.payload {
                    EntryPayload::Blank => Outcome::Nothing,
                    EntryPayload::Membership(m) => {
                        g.disk.membership = StoredMembership::new(Some(e.log_id), m);
                        Outcome::Nothing
                    }
                    EntryPayload::Normal(Proposal::Map { base_epoch, map }) => {
                        match decide(&g.disk.map, base_epoch, &map) {
                            Ok(epoch) => {
                                g.disk.map = Some(map);
                                Outcome::Applied { epoch }
                            }
                            Err(reason) => Outcome::Refused { reason },
                        }
                    }
                    EntryPayload::Normal(Proposal::Auth { base_version, db }) => {
                        match decide_auth(&g.disk.auth, base_version, &db) {
                            Ok(version) => {
                                g.disk.auth = Some(db);
                                Outcome::AuthApplied { version }
                            }
                            Err(reason) => Outcome::Refused { reason },
                        }
                    }
                };
                out.push(outcome);
            }
            g.disk.clone()
        };
        self.persist(&disk)?;
        self.set_auth(&disk.auth);
        if let Some(a) = applied_of(&disk.map) {
            self.published.send_if_modified(|cur| {
                if cur.as_ref().is_none_or(|c| c.epoch < a.epoch) {
                    *cur = Some(a);
                    true
                } else {
                    false
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let (map, auth): (Option<Vec<u8>>, Option<Vec<u8>>) =
            decode(snapshot.get_ref()).map_err(read_err)?;
        if let Some(b) = &map {
            ClusterMap::decode(b).map_err(|e| read_err(format!("snapshot map: {e}")))?;
        }
        if let Some(b) = &auth {
            AuthDb::decode(b).map_err(|e| read_err(format!("snapshot key database: {e}")))?;
        }
        let disk = SmDisk {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            map,
            auth,
        };
        self.persist(&disk)?;
        self.set_auth(&disk.auth);
        self.db
            .put(&[("snapshot", &encode(&(meta, snapshot.get_ref())))])
            .map_err(write_err)?;
        self.lock().disk = disk.clone();
        let a = applied_of(&disk.map);
        tracing::info!(
            "installed a snapshot up to log index {} (map epoch {})",
            meta.last_log_id.map_or(0, |l| l.index),
            a.as_ref().map_or(0, |a| a.epoch)
        );
        // A snapshot may move the map forward by many epochs (never back: it holds only
        // committed entries, newer than what this monitor applied).
        self.published.send_replace(a);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<C>>, SErr> {
        let Some(b) = self.db.get("snapshot").map_err(read_err)? else {
            return Ok(None);
        };
        let (meta, data): (SnapshotMeta<u64, BasicNode>, Vec<u8>) = decode(&b).map_err(read_err)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

impl RaftSnapshotBuilder<C> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<C>, SErr> {
        let snap = {
            let mut g = self.lock();
            g.snapshot_seq += 1;
            StateMachine::snapshot_of(&g.disk, g.snapshot_seq)
        };
        self.db
            .put(&[("snapshot", &encode(&(&snap.meta, snap.snapshot.get_ref())))])
            .map_err(write_err)?;
        Ok(snap)
    }
}
