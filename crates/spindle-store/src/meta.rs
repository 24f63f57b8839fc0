//! Checkpoint metadata in redb: superblock, object metadata, PG info and PG logs.
//!
//! Tables (all keys big endian so that redb's byte order is (pool, pg, ...) order):
//! - `super`:  &str -> u64 (`format`, `epoch`, `next_seq`, `next_file_id`)
//! - `objects`: pool u32 | pg u32 | name bytes  ->  file_id u64 | size u64 | version 16 B |
//!   crc_count u32 | crc u32 * crc_count   (little endian values)
//!   (file_id 0 = inline object, format 2)
//! - `inline`: pool u32 | pg u32 | name bytes  ->  the bytes of an inline object
//! - `pgs`:    pool u32 | pg u32  ->  last_version 16 B | log_tail 16 B [| flags 1 B: bit 0 incomplete]
//! - `pglog`:  pool u32 | pg u32 | epoch u64 | seq u64  ->  op u8 | name bytes

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::{meta_err, StoreError};
use crate::state::{block_count, ObjEntry, ObjState, PgState};
use crate::types::{LogEntry, LogOp, PgId, Version};

const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
const PGS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("pgs");
const PGLOG: TableDefinition<&[u8], &[u8]> = TableDefinition::new("pglog");
const INLINE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("inline");

/// Format 2 added inline objects (`file_id` 0 + the `inline` table). Format 3 changes no
/// table: it marks a store whose journal may hold direct records with checksums
/// (`journal::DirectCheck`), which a format-2 build would take for the journal's end and
/// so lose acknowledged writes; such a build refuses the store instead. Databases of
/// formats 1 and 2 are read as they are and written as format 3 by the checkpoint that
/// every open makes before its first journal record.
pub const FORMAT_VERSION: u64 = 3;
const FORMAT_MIN: u64 = 1;

/// The superblock: where the journal continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Super {
    /// Journal epoch: only records of this epoch are replayed.
    pub epoch: u64,
    /// Sequence number of the first journal record after this checkpoint.
    pub next_seq: u64,
    /// Next unused data-file id.
    pub next_file_id: u64,
}

pub struct Loaded {
    pub sup: Super,
    pub pgs: BTreeMap<PgId, PgState>,
}

fn pg_key(pg: PgId) -> Vec<u8> {
    let mut k = Vec::with_capacity(8);
    k.extend_from_slice(&pg.pool.to_be_bytes());
    k.extend_from_slice(&pg.pg.to_be_bytes());
    k
}

fn obj_key(pg: PgId, name: &str) -> Vec<u8> {
    let mut k = pg_key(pg);
    k.extend_from_slice(name.as_bytes());
    k
}

fn log_key(pg: PgId, v: Version) -> Vec<u8> {
    let mut k = pg_key(pg);
    k.extend_from_slice(&v.epoch.to_be_bytes());
    k.extend_from_slice(&v.seq.to_be_bytes());
    k
}

fn parse_pg(k: &[u8]) -> Option<PgId> {
    Some(PgId {
        pool: u32::from_be_bytes(k.get(0..4)?.try_into().ok()?),
        pg: u32::from_be_bytes(k.get(4..8)?.try_into().ok()?),
    })
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn encode_obj(st: &ObjState) -> Vec<u8> {
    let mut v = Vec::with_capacity(36 + 4 * st.crcs.len());
    v.extend_from_slice(&st.file_id.to_le_bytes());
    v.extend_from_slice(&st.size.to_le_bytes());
    v.extend_from_slice(&st.version.epoch.to_le_bytes());
    v.extend_from_slice(&st.version.seq.to_le_bytes());
    v.extend_from_slice(&(st.crcs.len() as u32).to_le_bytes());
    for c in &st.crcs {
        v.extend_from_slice(&c.to_le_bytes());
    }
    v
}

fn decode_obj(b: &[u8]) -> Option<ObjState> {
    let file_id = le_u64(b, 0)?;
    let size = le_u64(b, 8)?;
    let version = Version {
        epoch: le_u64(b, 16)?,
        seq: le_u64(b, 24)?,
    };
    let n = u32::from_le_bytes(b.get(32..36)?.try_into().ok()?) as usize;
    if n as u64 != block_count(size) || b.len() != 36 + 4 * n {
        return None;
    }
    let crcs = b[36..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some(ObjState {
        file_id,
        size,
        version,
        crcs,
        inline: None,
        writing: 0,
        gen: 0,
    })
}

fn bad(what: String) -> StoreError {
    StoreError::BadFormat(what)
}

/// Opens (or creates) the metadata database. `Ok(None)` from `load` means "fresh".
/// `cache_bytes` bounds redb's page cache (its default, 1 GiB, would let a daemon's memory
/// grow with the metadata it ever touched).
pub fn open_db(
    disk: &dyn crate::disk::Disk,
    path: &Path,
    cache_bytes: u64,
) -> Result<Database, StoreError> {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(cache_bytes as usize);
    disk.open_meta(path, &builder).map_err(|e| {
        StoreError::Meta(format!(
            "cannot open metadata database {}: {}",
            path.display(),
            redb::Error::from(e)
        ))
    })
}

/// Loads the last checkpoint; `None` if the database has no superblock yet.
pub fn load(db: &Database) -> Result<Option<Loaded>, StoreError> {
    let tx = db.begin_read().map_err(meta_err)?;
    let sup_table = match tx.open_table(SUPER) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(meta_err(e)),
    };
    let get = |k: &str| -> Result<u64, StoreError> {
        match sup_table.get(k).map_err(meta_err)? {
            Some(v) => Ok(v.value()),
            None => Err(bad(format!("superblock field {k} missing"))),
        }
    };
    let format = get("format")?;
    if !(FORMAT_MIN..=FORMAT_VERSION).contains(&format) {
        return Err(bad(format!(
            "metadata format {format}, this build reads {FORMAT_MIN}..={FORMAT_VERSION}"
        )));
    }
    let sup = Super {
        epoch: get("epoch")?,
        next_seq: get("next_seq")?,
        next_file_id: get("next_file_id")?,
    };
    let mut pgs: BTreeMap<PgId, PgState> = BTreeMap::new();
    let objects = tx.open_table(OBJECTS).map_err(meta_err)?;
    for item in objects.iter().map_err(meta_err)? {
        let (k, v) = item.map_err(meta_err)?;
        let k = k.value();
        let pg = parse_pg(k).ok_or_else(|| bad("object key too short".into()))?;
        let name = String::from_utf8(k[8..].to_vec())
            .map_err(|_| bad("object name is not UTF-8".into()))?;
        let st = decode_obj(v.value())
            .ok_or_else(|| bad(format!("object {name:?} metadata is malformed")))?;
        if (st.file_id == 0 && format < 2) || st.file_id >= sup.next_file_id {
            return Err(bad(format!("object {name:?} has invalid file id")));
        }
        pgs.entry(pg)
            .or_default()
            .objects
            .insert(name, ObjEntry::new(st));
    }
    let pgt = tx.open_table(PGS).map_err(meta_err)?;
    for item in pgt.iter().map_err(meta_err)? {
        let (k, v) = item.map_err(meta_err)?;
        let pg = parse_pg(k.value()).ok_or_else(|| bad("pg key too short".into()))?;
        let v = v.value();
        let f = |i| le_u64(v, i).ok_or_else(|| bad("pg record too short".into()));
        let p = pgs.entry(pg).or_default();
        p.last_version = Version {
            epoch: f(0)?,
            seq: f(8)?,
        };
        p.log_tail = Version {
            epoch: f(16)?,
            seq: f(24)?,
        };
        p.incomplete = v.get(32).is_some_and(|flags| flags & 1 != 0);
    }
    let logt = tx.open_table(PGLOG).map_err(meta_err)?;
    for item in logt.iter().map_err(meta_err)? {
        let (k, v) = item.map_err(meta_err)?;
        let k = k.value();
        let v = v.value();
        let pg = parse_pg(k).ok_or_else(|| bad("log key too short".into()))?;
        let version = match (k.len(), k.get(8..16), k.get(16..24)) {
            (24, Some(e), Some(s)) => Version {
                epoch: u64::from_be_bytes(e.try_into().map_err(|_| bad("log key".into()))?),
                seq: u64::from_be_bytes(s.try_into().map_err(|_| bad("log key".into()))?),
            },
            _ => return Err(bad("log key malformed".into())),
        };
        let op = match v.first() {
            Some(1) => LogOp::Modify,
            Some(2) => LogOp::Delete,
            _ => return Err(bad("log entry op malformed".into())),
        };
        let name = String::from_utf8(v[1..].to_vec())
            .map_err(|_| bad("log entry name is not UTF-8".into()))?;
        let p = pgs.entry(pg).or_default();
        p.log.push_back(LogEntry { version, name, op });
    }
    for p in pgs.values_mut() {
        p.ck_log_persisted = p.log.back().map_or(Version::ZERO, |e| e.version);
    }
    Ok(Some(Loaded { sup, pgs }))
}

/// Writes a checkpoint: the superblock plus every PG/object changed since the last one.
/// `removed` are PGs removed since the last checkpoint (their rows are deleted first).
/// Returns after a durable commit.
pub fn save(
    db: &Database,
    sup: Super,
    pgs: &BTreeMap<PgId, PgState>,
    removed: &BTreeSet<PgId>,
) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(meta_err)?;
    {
        let mut st = tx.open_table(SUPER).map_err(meta_err)?;
        st.insert("format", FORMAT_VERSION).map_err(meta_err)?;
        st.insert("epoch", sup.epoch).map_err(meta_err)?;
        st.insert("next_seq", sup.next_seq).map_err(meta_err)?;
        st.insert("next_file_id", sup.next_file_id)
            .map_err(meta_err)?;
        let mut objects = tx.open_table(OBJECTS).map_err(meta_err)?;
        let mut pgt = tx.open_table(PGS).map_err(meta_err)?;
        let mut logt = tx.open_table(PGLOG).map_err(meta_err)?;
        let mut inline = tx.open_table(INLINE).map_err(meta_err)?;
        for pg in removed {
            let pfx = pg_key(*pg);
            objects
                .retain_in(pfx.as_slice().., |k, _| !k.starts_with(&pfx))
                .map_err(meta_err)?;
            inline
                .retain_in(pfx.as_slice().., |k, _| !k.starts_with(&pfx))
                .map_err(meta_err)?;
            logt.retain_in(pfx.as_slice().., |k, _| !k.starts_with(&pfx))
                .map_err(meta_err)?;
            pgt.remove(pfx.as_slice()).map_err(meta_err)?;
        }
        for (pg, p) in pgs {
            for name in &p.ck_dirty_objects {
                let key = obj_key(*pg, name);
                match p.objects.get(name) {
                    Some(e) => {
                        let (v, is_inline, data) = {
                            let st = e.lock();
                            (encode_obj(&st), st.is_inline(), st.inline.clone())
                        };
                        objects
                            .insert(key.as_slice(), v.as_slice())
                            .map_err(meta_err)?;
                        match (is_inline, data) {
                            // Inline and changed: the bytes go with the metadata.
                            (true, Some(d)) => {
                                inline
                                    .insert(key.as_slice(), d.as_slice())
                                    .map_err(meta_err)?;
                            }
                            // Inline, bytes unchanged since they were loaded: the row stays.
                            (true, None) => {}
                            (false, _) => {
                                inline.remove(key.as_slice()).map_err(meta_err)?;
                            }
                        }
                    }
                    None => {
                        objects.remove(key.as_slice()).map_err(meta_err)?;
                        inline.remove(key.as_slice()).map_err(meta_err)?;
                    }
                }
            }
            if !p.ck_dirty && !p.ck_log_reset {
                continue;
            }
            let pfx = pg_key(*pg);
            let mut v = Vec::with_capacity(32);
            for x in [
                p.last_version.epoch,
                p.last_version.seq,
                p.log_tail.epoch,
                p.log_tail.seq,
            ] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.push(u8::from(p.incomplete));
            pgt.insert(pfx.as_slice(), v.as_slice()).map_err(meta_err)?;
            let keep_after = if p.ck_log_reset {
                logt.retain_in(pfx.as_slice().., |k, _| !k.starts_with(&pfx))
                    .map_err(meta_err)?;
                None
            } else {
                // Drop trimmed entries (version <= the oldest kept one, exclusive).
                let first_kept = p.log.front().map(|e| e.version);
                let hi = match first_kept {
                    Some(v) => log_key(*pg, v),
                    None => log_key(
                        *pg,
                        Version {
                            epoch: u64::MAX,
                            seq: u64::MAX,
                        },
                    ),
                };
                logt.retain_in(pfx.as_slice()..hi.as_slice(), |_, _| false)
                    .map_err(meta_err)?;
                Some(p.ck_log_persisted)
            };
            for e in &p.log {
                if keep_after.is_some_and(|after| e.version <= after) {
                    continue;
                }
                let mut val = Vec::with_capacity(1 + e.name.len());
                val.push(match e.op {
                    LogOp::Modify => 1,
                    LogOp::Delete => 2,
                });
                val.extend_from_slice(e.name.as_bytes());
                logt.insert(log_key(*pg, e.version).as_slice(), val.as_slice())
                    .map_err(meta_err)?;
            }
        }
    }
    tx.commit().map_err(meta_err)?;
    Ok(())
}

/// The stored bytes of inline object `name` of `pg` (`None` if there is no row).
pub fn load_inline(db: &Database, pg: PgId, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let tx = db.begin_read().map_err(meta_err)?;
    let t = match tx.open_table(INLINE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(meta_err(e)),
    };
    let key = obj_key(pg, name);
    Ok(t.get(key.as_slice())
        .map_err(meta_err)?
        .map(|v| v.value().to_vec()))
}

/// Test hook: overwrites the stored bytes of inline object `name` of `pg`.
#[cfg(test)]
pub fn put_inline(db: &Database, pg: PgId, name: &str, data: &[u8]) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(meta_err)?;
    {
        let mut t = tx.open_table(INLINE).map_err(meta_err)?;
        let key = obj_key(pg, name);
        t.insert(key.as_slice(), data).map_err(meta_err)?;
    }
    tx.commit().map_err(meta_err)?;
    Ok(())
}
