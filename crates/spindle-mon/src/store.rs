//! Where the monitor keeps the map between restarts. Behind a trait so a replicated store
//! (an existing Raft library such as openraft) can replace the single-node one.

use spindle_map::ClusterMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum MapStoreError {
    #[error("monitor store: {0}")]
    Db(String),
    #[error("monitor store holds a corrupt map: {0}")]
    Corrupt(String),
}

/// Durable storage of the cluster map. `save` returns only once the map is durable.
pub trait MapStore: Send {
    fn load(&self) -> Result<Option<ClusterMap>, MapStoreError>;
    fn save(&mut self, map: &ClusterMap) -> Result<(), MapStoreError>;
}

const MAPS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("maps");
const META: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
/// Epochs kept for inspection (older ones are pruned).
const HISTORY_EPOCHS: u64 = 500;

/// Single-node store in a redb database (checksummed pages, durable commits).
pub struct RedbMapStore {
    db: redb::Database,
}

fn db_err(e: impl std::fmt::Display) -> MapStoreError {
    MapStoreError::Db(e.to_string())
}

impl RedbMapStore {
    pub fn open(path: &Path) -> Result<Self, MapStoreError> {
        let db = redb::Database::create(path).map_err(db_err)?;
        Ok(RedbMapStore { db })
    }
}

impl MapStore for RedbMapStore {
    fn load(&self) -> Result<Option<ClusterMap>, MapStoreError> {
        use redb::ReadableDatabase;
        let tx = self.db.begin_read().map_err(db_err)?;
        let meta = match tx.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db_err(e)),
        };
        let Some(current) = meta.get("current").map_err(db_err)? else {
            return Ok(None);
        };
        let epoch = current.value();
        let maps = tx.open_table(MAPS).map_err(db_err)?;
        let bytes = maps
            .get(epoch)
            .map_err(db_err)?
            .ok_or_else(|| MapStoreError::Corrupt(format!("epoch {epoch} missing")))?;
        let map =
            ClusterMap::decode(bytes.value()).map_err(|e| MapStoreError::Corrupt(e.to_string()))?;
        if map.epoch != epoch {
            return Err(MapStoreError::Corrupt(format!(
                "record {epoch} holds epoch {}",
                map.epoch
            )));
        }
        Ok(Some(map))
    }

    fn save(&mut self, map: &ClusterMap) -> Result<(), MapStoreError> {
        let tx = self.db.begin_write().map_err(db_err)?;
        {
            let mut maps = tx.open_table(MAPS).map_err(db_err)?;
            maps.insert(map.epoch, map.encode().as_slice())
                .map_err(db_err)?;
            if map.epoch > HISTORY_EPOCHS {
                let old = map.epoch - HISTORY_EPOCHS;
                maps.retain_in(..old, |_, _| false).map_err(db_err)?;
            }
            let mut meta = tx.open_table(META).map_err(db_err)?;
            meta.insert("current", map.epoch).map_err(db_err)?;
        }
        tx.commit().map_err(db_err)?;
        Ok(())
    }
}

/// A map store in memory, for simulations and tests: clones share the map (it survives
/// the node that saved it, as a disk survives a crash), and saves can be made to fail.
#[derive(Clone, Default)]
pub struct MemMapStore {
    saved: std::sync::Arc<std::sync::Mutex<Option<ClusterMap>>>,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl MemMapStore {
    /// A store that already holds `map`.
    pub fn with(map: ClusterMap) -> MemMapStore {
        let s = MemMapStore::default();
        *s.lock() = Some(map);
        s
    }

    /// Makes every later save fail (`true`) or succeed again.
    pub fn fail_saves(&self, fail: bool) {
        self.fail.store(fail, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ClusterMap>> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MapStore for MemMapStore {
    fn load(&self) -> Result<Option<ClusterMap>, MapStoreError> {
        Ok(self.lock().clone())
    }
    fn save(&mut self, map: &ClusterMap) -> Result<(), MapStoreError> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(MapStoreError::Db("saves fail (simulated)".into()));
        }
        *self.lock() = Some(map.clone());
        Ok(())
    }
}
