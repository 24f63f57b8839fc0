//! `spindle-mon`: the monitor. It owns the cluster map, bumps its epoch on every change,
//! persists it before anyone sees it ([`MapStore`]), pushes each new epoch to subscribers,
//! marks daemons down when they miss heartbeats for `down_after_ms`, and answers
//! administrative commands (`status`, `pool create|rm|ls`, `osd out|in|down`, `crush set`).
//!
//! Invariants:
//! - an epoch is visible (replied, pushed) only after `MapStore::save` returned, so a
//!   monitor restart never goes back in time;
//! - epochs strictly increase by one per change;
//! - malformed requests get an error reply; the monitor never panics on input.

mod store;

pub use store::{MapStore, MapStoreError, RedbMapStore};

use serde_json::json;
use spindle_map::{ClusterMap, OsdInfo, PgId, Placement, PoolKind};
use spindle_proto::msg::{PgReport, PgStateCode};
use spindle_proto::net::{accept_loop, Incoming, Replier, Service};
use spindle_proto::{ErrorCode, Msg};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum MonError {
    #[error(transparent)]
    Store(#[from] MapStoreError),
    #[error("monitor: {0}")]
    Io(#[from] std::io::Error),
    #[error("monitor: {0}")]
    Map(#[from] spindle_map::MapError),
    #[error("monitor has no cluster map in {0}; run `spindle up` (or `spindle mon init`) first")]
    NotInitialized(PathBuf),
}

#[derive(Clone, Debug)]
pub struct MonConfig {
    /// Directory of the monitor's database.
    pub dir: PathBuf,
    /// Address to listen on (`127.0.0.1:0` picks a port).
    pub listen: String,
    /// A daemon that sends no heartbeat for this long is marked down.
    pub down_after_ms: u64,
    /// A daemon down for this long is marked out, so its data is re-created elsewhere
    /// (0 = never).
    pub out_after_ms: u64,
}

impl MonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MonConfig {
            dir: dir.into(),
            listen: "127.0.0.1:0".to_string(),
            down_after_ms: 2000,
            out_after_ms: 30_000,
        }
    }
    fn db_path(&self) -> PathBuf {
        self.dir.join("mon.redb")
    }
}

/// Settings of a new cluster.
#[derive(Clone, Debug)]
pub struct InitSpec {
    pub osd_count: u32,
    /// Default pool created with the cluster: (name, size, min_size, pg_count).
    pub default_pool: Option<(String, u32, u32, u32)>,
}

/// Creates the first map of a new cluster in `dir` (fails if one exists).
pub fn init(dir: &std::path::Path, spec: &InitSpec) -> Result<ClusterMap, MonError> {
    std::fs::create_dir_all(dir)?;
    let mut store = RedbMapStore::open(&dir.join("mon.redb"))?;
    if let Some(existing) = store.load()? {
        return Ok(existing);
    }
    let ids: Vec<u32> = (0..spec.osd_count).collect();
    let mut map = ClusterMap {
        cluster_id: rand::random(),
        epoch: 1,
        osds: ids
            .iter()
            .map(|&id| {
                (
                    id,
                    OsdInfo {
                        id,
                        addr: String::new(),
                        pid: 0,
                        up: false,
                        in_cluster: true,
                        weight: 0x10000,
                        up_from: 0,
                        nearfull: false,
                        full: false,
                    },
                )
            })
            .collect(),
        pools: Default::default(),
        crush: spindle_map::embedded_crush_map(&ids)?,
        nearfull_ratio_ppm: spindle_map::NEARFULL_RATIO_PPM_DEFAULT,
        full_ratio_ppm: spindle_map::FULL_RATIO_PPM_DEFAULT,
    };
    if let Some((name, size, min_size, pg_count)) = &spec.default_pool {
        map.add_pool(
            name,
            PoolKind::Replicated {
                size: *size,
                min_size: *min_size,
            },
            *pg_count,
            0,
        )?;
    }
    store.save(&map)?;
    Ok(map)
}

struct State {
    map: ClusterMap,
    placement: Placement,
    store: Box<dyn MapStore>,
    last_heartbeat: HashMap<u32, Instant>,
    /// Latest placement-group reports per daemon, with the epoch they were made at.
    reports: HashMap<u32, (u64, Vec<PgReport>)>,
    /// Latest counters per daemon.
    counters: HashMap<u32, Vec<(String, u64)>>,
    /// Since when each down (and still in) daemon has been down, for `out_after_ms`.
    down_since: HashMap<u32, Instant>,
    /// Recovery rate: (when, total recovered bytes, total recovered objects) samples.
    recovery_samples: std::collections::VecDeque<(Instant, u64, u64)>,
}

/// A running monitor (shared by its tasks).
pub struct Monitor {
    state: Mutex<State>,
    map_tx: watch::Sender<Arc<Vec<u8>>>,
    config: MonConfig,
}

impl Monitor {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a bug panicked mid-update; keep serving the last state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn epoch(&self) -> u64 {
        self.lock().map.epoch
    }

    /// Applies `change` to a copy of the map; if it changed anything, bumps the epoch,
    /// persists, then publishes. Returns the (possibly unchanged) epoch.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut ClusterMap) -> Result<T, String>,
    ) -> Result<(T, u64), String> {
        let mut st = self.lock();
        let mut next = st.map.clone();
        let out = change(&mut next)?;
        let before = st.map.encode();
        next.epoch = st.map.epoch;
        if next.encode() == before {
            return Ok((out, st.map.epoch));
        }
        next.epoch = st.map.epoch + 1;
        st.store.save(&next).map_err(|e| e.to_string())?;
        st.placement = Placement::compute(&next);
        st.map = next;
        let bytes = Arc::new(st.map.encode());
        let epoch = st.map.epoch;
        drop(st);
        self.map_tx.send_replace(bytes);
        Ok((out, epoch))
    }

    fn handle(self: &Arc<Self>, inc: Incoming, reply: Replier) {
        let rid = inc.request_id;
        let epoch = self.epoch();
        match inc.msg {
            Msg::OsdBoot { osd_id, addr, pid } => {
                let res = self.update(|m| {
                    let next_epoch = m.epoch + 1;
                    let osd = m
                        .osds
                        .get_mut(&osd_id)
                        .ok_or_else(|| format!("osd.{osd_id} is not part of this cluster"))?;
                    // A daemon re-registering after a monitor restart (same process, same
                    // address) changes nothing: no new epoch, no re-peering.
                    if !(osd.up && osd.addr == addr && osd.pid == pid) {
                        osd.addr = addr.clone();
                        osd.pid = pid;
                        osd.up = true;
                        osd.up_from = next_epoch;
                    }
                    Ok(())
                });
                match res {
                    Ok((_, e)) => {
                        self.lock().last_heartbeat.insert(osd_id, Instant::now());
                        tracing::info!("osd.{osd_id} booted at {addr} (pid {pid}), epoch {e}");
                        let map = self.map_tx.borrow().as_ref().clone();
                        reply.send(rid, e, &Msg::MapUpdate { map });
                    }
                    Err(msg) => {
                        reply.send(rid, epoch, &Msg::error(ErrorCode::Invalid, msg));
                    }
                }
            }
            Msg::Heartbeat {
                osd_id,
                reports,
                counters,
            } => {
                let mut st = self.lock();
                if st.map.osds.contains_key(&osd_id) {
                    let now = Instant::now();
                    st.last_heartbeat.insert(osd_id, now);
                    st.reports.insert(osd_id, (inc.epoch, reports));
                    st.counters.insert(osd_id, counters);
                    let (bytes, objects) = st.counters.values().fold((0, 0), |acc, c| {
                        let get = |k: &str| c.iter().find(|(n, _)| n == k).map_or(0, |x| x.1);
                        (
                            acc.0 + get("recovered_bytes"),
                            acc.1 + get("recovered_objects"),
                        )
                    });
                    st.recovery_samples.push_back((now, bytes, objects));
                    while st
                        .recovery_samples
                        .front()
                        .is_some_and(|(t, _, _)| now.duration_since(*t) > RATE_WINDOW)
                    {
                        st.recovery_samples.pop_front();
                    }
                }
                let flags = st.counters.get(&osd_id).and_then(|c| {
                    let (nearfull, full) = space_flags(&st.map, c);
                    let o = st.map.osds.get(&osd_id)?;
                    (o.nearfull != nearfull || o.full != full).then_some((nearfull, full))
                });
                let mut epoch = st.map.epoch;
                drop(st);
                if let Some((nearfull, full)) = flags {
                    // Flags are in the map so clients and primaries refuse writes to a full
                    // pool without asking anyone.
                    let res = self.update(|m| {
                        if let Some(o) = m.osds.get_mut(&osd_id) {
                            o.nearfull = nearfull;
                            o.full = full;
                        }
                        Ok(())
                    });
                    match res {
                        Ok((_, e)) => {
                            epoch = e;
                            tracing::info!(
                                "osd.{osd_id}: nearfull={nearfull} full={full}, epoch {e}"
                            );
                        }
                        Err(e) => tracing::warn!("osd.{osd_id}: cannot update full flags: {e}"),
                    }
                }
                reply.send(rid, epoch, &Msg::HeartbeatAck { epoch });
            }
            Msg::GetMap {
                have_epoch,
                subscribe,
            } => {
                let mut rx = self.map_tx.subscribe();
                let current = rx.borrow_and_update().clone();
                if !subscribe {
                    if have_epoch < epoch {
                        reply.send(
                            rid,
                            epoch,
                            &Msg::MapUpdate {
                                map: current.to_vec(),
                            },
                        );
                    } else {
                        reply.send(rid, epoch, &Msg::Ok);
                    }
                    return;
                }
                let me = self.clone();
                tokio::spawn(async move {
                    let mut have = have_epoch;
                    let mut bytes = current;
                    loop {
                        let e = me.epoch();
                        if have < e {
                            if !reply.send(
                                0,
                                e,
                                &Msg::MapUpdate {
                                    map: bytes.to_vec(),
                                },
                            ) {
                                return;
                            }
                            have = e;
                        }
                        // Ends with the connection, not at the next epoch.
                        tokio::select! {
                            changed = rx.changed() => if changed.is_err() {
                                return;
                            },
                            () = reply.closed() => return,
                        }
                        bytes = rx.borrow_and_update().clone();
                    }
                });
                // The subscription itself is acknowledged so the caller knows it is live.
                let _ = rid;
            }
            Msg::Command { args } => {
                let (ok, output) = match self.command(&args) {
                    Ok(v) => (true, v.to_string()),
                    Err(e) => (false, e),
                };
                reply.send(rid, self.epoch(), &Msg::CommandReply { ok, output });
            }
            other => {
                reply.send(
                    rid,
                    epoch,
                    &Msg::error(
                        ErrorCode::Invalid,
                        format!("the monitor does not handle {}", other.name()),
                    ),
                );
            }
        }
    }

    fn command(&self, args: &[String]) -> Result<serde_json::Value, String> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let parse_u32 = |s: &str, what: &str| {
            s.parse::<u32>()
                .map_err(|_| format!("{what} must be a number, got '{s}'"))
        };
        match a.as_slice() {
            ["status"] => Ok(self.status()),
            ["pool", "ls"] => Ok(self.status()["pools"].clone()),
            ["pool", "create", name, size, min_size, pg_count] => {
                let (size, min_size, pg_count) = (
                    parse_u32(size, "size")?,
                    parse_u32(min_size, "min_size")?,
                    parse_u32(pg_count, "pg count")?,
                );
                let name = name.to_string();
                let (id, epoch) = self.update(|m| {
                    m.add_pool(
                        &name,
                        PoolKind::Replicated { size, min_size },
                        pg_count,
                        0,
                    )
                    .map_err(|e| e.to_string())
                })?;
                Ok(json!({"pool": name, "id": id, "epoch": epoch}))
            }
            ["pool", "create-ec", name, k, m, min_size, matrix, stripe_unit, pg_count] => {
                let (k, m, min_size, stripe_unit_bytes, pg_count) = (
                    parse_u32(k, "k")?,
                    parse_u32(m, "m")?,
                    parse_u32(min_size, "min_size")?,
                    parse_u32(stripe_unit, "stripe unit")?,
                    parse_u32(pg_count, "pg count")?,
                );
                let matrix = spindle_map::EC_MATRIX_NAMES
                    .iter()
                    .position(|n| n == matrix)
                    .ok_or_else(|| {
                        format!(
                            "unknown matrix '{matrix}' (one of {})",
                            spindle_map::EC_MATRIX_NAMES.join(", ")
                        )
                    })? as u8;
                let name = name.to_string();
                let (id, epoch) = self.update(|map| {
                    // The first rule placing positionally (the embedded map's erasure_rule).
                    let rule = (0..map.crush.rules.len() as i32)
                        .find(|&r| {
                            map.crush.rule(r).is_some_and(|rule| {
                                rule.steps.iter().any(|s| {
                                    matches!(
                                        s,
                                        spindle_crush::Step::ChooseIndep { .. }
                                            | spindle_crush::Step::ChooseLeafIndep { .. }
                                    )
                                })
                            })
                        })
                        .ok_or("the CRUSH map has no indep rule for erasure-coded pools")?;
                    map.add_pool(
                        &name,
                        PoolKind::Erasure {
                            k,
                            m,
                            min_size,
                            matrix,
                            stripe_unit_bytes,
                        },
                        pg_count,
                        rule,
                    )
                    .map_err(|e| e.to_string())
                })?;
                Ok(json!({"pool": name, "id": id, "epoch": epoch}))
            }
            ["pool", "rm", name] => {
                let name = name.to_string();
                let (id, epoch) =
                    self.update(|m| m.remove_pool(&name).map_err(|e| e.to_string()))?;
                Ok(json!({"removed": name, "id": id, "epoch": epoch}))
            }
            ["osd", verb @ ("out" | "in" | "down"), id] => {
                let id = parse_u32(id, "osd id")?;
                let verb = verb.to_string();
                let ((), epoch) = self.update(|m| {
                    let osd = m
                        .osds
                        .get_mut(&id)
                        .ok_or_else(|| format!("no storage daemon osd.{id}"))?;
                    match verb.as_str() {
                        "out" => osd.in_cluster = false,
                        "in" => osd.in_cluster = true,
                        _ => osd.up = false,
                    }
                    Ok(())
                })?;
                Ok(json!({"osd": id, "done": verb, "epoch": epoch}))
            }
            ["crush", "set", text] => {
                let crush = spindle_crush::text::parse_text(text)
                    .map_err(|e| format!("CRUSH map does not parse: {e}"))?;
                crush
                    .validate()
                    .map_err(|e| format!("CRUSH map is invalid: {e}"))?;
                let ((), epoch) = self.update(|m| {
                    let mut next = m.clone();
                    next.crush = crush;
                    for id in next.osds.keys() {
                        if (*id as i64) >= next.crush.max_devices as i64 {
                            return Err(format!("osd.{id} is not a device of the new map"));
                        }
                    }
                    for pool in next.pools.values() {
                        next.check_pool(pool).map_err(|e| e.to_string())?;
                    }
                    *m = next;
                    Ok(())
                })?;
                Ok(json!({"epoch": epoch}))
            }
            ["osd", "add", weight] => {
                let weight: f64 = weight
                    .parse()
                    .ok()
                    .filter(|w: &f64| w.is_finite() && *w > 0.0 && *w <= 65535.0)
                    .ok_or_else(|| format!("weight must be a positive number, got '{weight}'"))?;
                let (id, epoch) = self.update(|m| {
                    let ids: Vec<u32> = m.osds.keys().copied().collect();
                    let mut weighted = spindle_map::embedded_weights(&m.crush, &ids).ok_or(
                        "the CRUSH map was set by hand: add the new daemon to it \
                         (`spindle crush set-map`) instead",
                    )?;
                    let id = ids.iter().max().map_or(0, |x| x + 1);
                    weighted.push((id, (weight * 65536.0) as u32));
                    let crush = spindle_map::embedded_crush_map_weighted(&weighted)
                        .map_err(|e| e.to_string())?;
                    m.crush = crush;
                    m.osds.insert(
                        id,
                        OsdInfo {
                            id,
                            addr: String::new(),
                            pid: 0,
                            up: false,
                            in_cluster: true,
                            weight: 0x10000,
                            up_from: 0,
                            nearfull: false,
                            full: false,
                        },
                    );
                    Ok(id)
                })?;
                self.lock().last_heartbeat.insert(id, Instant::now());
                Ok(json!({"osd": id, "epoch": epoch}))
            }
            ["osd", verb @ ("set-full-ratio" | "set-nearfull-ratio"), ratio] => {
                let ppm = ratio
                    .parse::<f64>()
                    .ok()
                    .filter(|r| *r > 0.0 && *r <= 1.0)
                    .map(|r| (r * 1e6).round() as u32)
                    .ok_or_else(|| format!("ratio must be a number in (0, 1], got '{ratio}'"))?;
                let full = *verb == "set-full-ratio";
                let ((), epoch) = self.update(|m| {
                    let (nearfull_ppm, full_ppm) = if full {
                        (m.nearfull_ratio_ppm, ppm)
                    } else {
                        (ppm, m.full_ratio_ppm)
                    };
                    if nearfull_ppm > full_ppm {
                        return Err(format!(
                            "nearfull ratio {} would be above full ratio {}",
                            nearfull_ppm as f64 / 1e6,
                            full_ppm as f64 / 1e6
                        ));
                    }
                    m.nearfull_ratio_ppm = nearfull_ppm;
                    m.full_ratio_ppm = full_ppm;
                    Ok(())
                })?;
                Ok(json!({"done": verb, "ratio": ppm as f64 / 1e6, "epoch": epoch}))
            }
            ["crush", "get"] => Ok(json!(spindle_crush::text::print_text(&self.lock().map.crush))),
            _ => Err(format!(
                "unknown command '{}' (known: status, pool ls|create|rm, osd out|in|down|add|set-full-ratio|set-nearfull-ratio, crush get|set)",
                a.join(" ")
            )),
        }
    }

    /// The `spindle status` document.
    pub fn status(&self) -> serde_json::Value {
        // "inconsistent" (Ceph's name): serving, but scrub found objects with no intact
        // copy. It outranks clean/degraded/recovering/backfilling; a group that does not
        // serve (peering, incomplete, inactive) shows that instead, while the PG_DAMAGED
        // check still counts its damaged objects.
        const STATES: [&str; 8] = [
            "clean",
            "degraded",
            "recovering",
            "backfilling",
            "peering",
            "incomplete",
            "inactive",
            "inconsistent",
        ];
        const INCONSISTENT: usize = 7;
        let st = self.lock();
        let map = &st.map;
        let mut report_of: HashMap<(u32, u32, u32), (u64, &PgReport)> = HashMap::new();
        for (osd, (epoch, reports)) in &st.reports {
            for r in reports {
                report_of.insert((*osd, r.pool, r.pg), (*epoch, r));
            }
        }
        let mut totals = [0u64; STATES.len()];
        // (group, objects with no intact copy) as the group's current primary reports it.
        let mut damaged: Vec<(PgId, u64)> = Vec::new();
        let (mut missing_objects_total, mut missing_bytes_total) = (0u64, 0u64);
        let mut pools = Vec::new();
        let mut objects_total = 0u64;
        for pool in map.pools.values() {
            let mut counts = [0u64; STATES.len()];
            let (mut objects, mut missing_objects, mut missing_bytes) = (0u64, 0u64, 0u64);
            for pg in 0..pool.pg_count {
                let Some(mapping) = st.placement.pg(pool.id, pg) else {
                    continue;
                };
                let serving = if pool.is_erasure() {
                    pool.read_size()
                } else {
                    pool.min_size()
                };
                let report = mapping
                    .up
                    .first()
                    .and_then(|primary| report_of.get(&(*primary, pool.id, pg)));
                let damaged_objects = report.map_or(0, |(_, r)| r.damaged_objects);
                if damaged_objects > 0 {
                    damaged.push((PgId { pool: pool.id, pg }, damaged_objects));
                }
                let slot = if (mapping.up.len() as u32) < serving {
                    6
                } else {
                    match report {
                        Some((e, r)) if *e >= map.epoch => {
                            objects += r.objects;
                            missing_objects += r.missing_objects;
                            missing_bytes += r.missing_bytes;
                            match r.state {
                                PgStateCode::Clean
                                | PgStateCode::Degraded
                                | PgStateCode::Recovering
                                | PgStateCode::Backfilling
                                    if damaged_objects > 0 =>
                                {
                                    INCONSISTENT
                                }
                                PgStateCode::Clean if mapping.up.len() as u32 >= pool.size() => 0,
                                PgStateCode::Clean | PgStateCode::Degraded => 1,
                                PgStateCode::Recovering => 2,
                                PgStateCode::Backfilling => 3,
                                PgStateCode::Peering => 4,
                                PgStateCode::Incomplete => 5,
                                PgStateCode::Inactive => 6,
                            }
                        }
                        _ => 4,
                    }
                };
                counts[slot] += 1;
            }
            for i in 0..counts.len() {
                totals[i] += counts[i];
            }
            objects_total += objects;
            missing_objects_total += missing_objects;
            missing_bytes_total += missing_bytes;
            let pgs: serde_json::Map<String, serde_json::Value> = STATES
                .iter()
                .zip(counts)
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            pools.push(json!({
                "id": pool.id,
                "name": pool.name,
                "type": if pool.is_erasure() { "erasure" } else { "replicated" },
                "erasure": match pool.kind {
                    PoolKind::Erasure { k, m, matrix, stripe_unit_bytes, .. } => json!({
                        "k": k, "m": m,
                        "matrix": spindle_map::EC_MATRIX_NAMES.get(matrix as usize),
                        "stripe_unit": stripe_unit_bytes,
                    }),
                    PoolKind::Replicated { .. } => serde_json::Value::Null,
                },
                "size": pool.size(),
                "min_size": pool.min_size(),
                "pg_count": pool.pg_count,
                "crush_rule": pool.crush_rule,
                "objects": objects,
                "pgs": pgs,
                "recovery": {"objects_left": missing_objects, "bytes_left": missing_bytes},
            }));
        }
        let osds: Vec<_> = map
            .osds
            .values()
            .map(|o| {
                let counters: serde_json::Map<String, serde_json::Value> = st
                    .counters
                    .get(&o.id)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                let get = |k: &str| counters.get(k).and_then(|v| v.as_u64());
                json!({"id": o.id, "addr": o.addr, "pid": o.pid, "up": o.up,
                       "in": o.in_cluster, "weight": o.weight as f64 / 65536.0,
                       "crush_weight": crush_weight(&map.crush, o.id),
                       "up_from": o.up_from,
                       "total_bytes": get("fs_total_bytes"),
                       "used_bytes": get("fs_used_bytes"),
                       "avail_bytes": get("fs_avail_bytes"),
                       "nearfull": o.nearfull, "full": o.full,
                       "healthy": get("store_failed").is_none_or(|f| f == 0),
                       "counters": counters})
            })
            .collect();
        let (bytes_per_sec, objects_per_sec) =
            match (st.recovery_samples.front(), st.recovery_samples.back()) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    let secs = b.0.duration_since(a.0).as_secs_f64();
                    (
                        b.1.saturating_sub(a.1) as f64 / secs,
                        b.2.saturating_sub(a.2) as f64 / secs,
                    )
                }
                _ => (0.0, 0.0),
            };
        let pgs: serde_json::Map<String, serde_json::Value> = STATES
            .iter()
            .zip(totals)
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut health = Health::default();
        let down: Vec<String> = map
            .osds
            .values()
            .filter(|o| o.in_cluster && !o.up)
            .map(|o| format!("osd.{}", o.id))
            .collect();
        if !down.is_empty() {
            health.add(
                "OSD_DOWN",
                Severity::Warn,
                format!("{} daemon(s) down: {}", down.len(), down.join(", ")),
            );
        }
        let not_active = totals[4] + totals[5] + totals[6];
        if not_active > 0 {
            health.add(
                "PG_AVAILABILITY",
                Severity::Warn,
                format!("{not_active} placement group(s) peering, incomplete or inactive"),
            );
        }
        let degraded = totals[1] + totals[2] + totals[3];
        if degraded > 0 {
            health.add(
                "PG_DEGRADED",
                Severity::Warn,
                format!("{degraded} placement group(s) degraded or recovering"),
            );
        }
        space_health(&st, &mut health);
        if !damaged.is_empty() {
            health.add("PG_DAMAGED", Severity::Err, damage_message(&damaged));
        }
        let inconsistent_pgs: Vec<_> = damaged
            .iter()
            .map(|(pg, n)| json!({"pg": pg.to_string(), "damaged_objects": n}))
            .collect();
        json!({
            "cluster_id": format!("{:016x}", map.cluster_id),
            "epoch": map.epoch,
            "nearfull_ratio": map.nearfull_ratio_ppm as f64 / 1e6,
            "full_ratio": map.full_ratio_ppm as f64 / 1e6,
            "health": health.to_json(),
            "osds": osds,
            "pools": pools,
            "objects": objects_total,
            "pgs": pgs,
            "inconsistent_pgs": inconsistent_pgs,
            "recovery": {
                "objects_left": missing_objects_total,
                "bytes_left": missing_bytes_total,
                "bytes_per_sec": bytes_per_sec,
                "objects_per_sec": objects_per_sec,
            },
        })
    }

    fn check_heartbeats(&self) {
        let down_after = Duration::from_millis(self.config.down_after_ms);
        let now = Instant::now();
        let stale: Vec<u32> = {
            let st = self.lock();
            st.map
                .osds
                .values()
                .filter(|o| o.up)
                .filter(|o| {
                    st.last_heartbeat
                        .get(&o.id)
                        .is_none_or(|t| now.duration_since(*t) > down_after)
                })
                .map(|o| o.id)
                .collect()
        };
        self.check_out(now);
        if stale.is_empty() {
            return;
        }
        match self.update(|m| {
            for id in &stale {
                if let Some(o) = m.osds.get_mut(id) {
                    o.up = false;
                }
            }
            Ok(())
        }) {
            Ok((_, e)) => {
                let mut st = self.lock();
                for id in &stale {
                    st.down_since.entry(*id).or_insert(now);
                }
                drop(st);
                tracing::warn!(
                    "marked {:?} down after {} ms without heartbeat (epoch {e})",
                    stale,
                    self.config.down_after_ms
                )
            }
            Err(e) => tracing::error!("cannot mark daemons down: {e}"),
        }
    }
}

impl Monitor {
    /// Marks out every daemon that has been down (and in) for `out_after_ms`.
    fn check_out(&self, now: Instant) {
        let out_after_ms = self.config.out_after_ms;
        if out_after_ms == 0 {
            return;
        }
        let due: Vec<u32> = {
            let mut st = self.lock();
            let down: Vec<u32> = st
                .map
                .osds
                .values()
                .filter(|o| !o.up && o.in_cluster)
                .map(|o| o.id)
                .collect();
            // Forget daemons that came back or were taken out; start the clock for daemons
            // found down otherwise (marked by hand, or down when the monitor started).
            st.down_since.retain(|id, _| down.contains(id));
            for id in &down {
                st.down_since.entry(*id).or_insert(now);
            }
            st.down_since
                .iter()
                .filter(|(_, t)| now.duration_since(**t) >= Duration::from_millis(out_after_ms))
                .map(|(id, _)| *id)
                .collect()
        };
        if due.is_empty() {
            return;
        }
        match self.update(|m| {
            for id in &due {
                if let Some(o) = m.osds.get_mut(id) {
                    if !o.up {
                        o.in_cluster = false;
                    }
                }
            }
            Ok(())
        }) {
            Ok((_, e)) => tracing::warn!(
                "marked {:?} out after {out_after_ms} ms down (epoch {e}); their data is \
                 being re-created on the other daemons",
                due
            ),
            Err(e) => tracing::error!("cannot mark daemons out: {e}"),
        }
    }
}

/// CRUSH weight of a daemon (sum over the map's buckets holding it), as a float.
fn crush_weight(crush: &spindle_crush::CrushMap, id: u32) -> f64 {
    crush
        .buckets
        .iter()
        .flatten()
        .flat_map(|b| b.items.iter().zip(&b.item_weights))
        .filter(|(item, _)| **item == id as i32)
        .map(|(_, w)| *w as f64 / 65536.0)
        .sum()
}

/// Window over which the recovery rate in `status` is computed.
const RATE_WINDOW: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct MonService(Arc<Monitor>);

impl Service for MonService {
    fn epoch(&self) -> u64 {
        self.0.epoch()
    }
    fn dispatch(&self, inc: Incoming, reply: Replier) {
        self.0.handle(inc, reply)
    }
}

/// A bound, loaded monitor, ready to serve.
pub struct BoundMonitor {
    pub addr: std::net::SocketAddr,
    listener: TcpListener,
    mon: Arc<Monitor>,
}

impl BoundMonitor {
    /// Loads the map from `config.dir` and binds the listener.
    pub async fn bind(config: MonConfig) -> Result<BoundMonitor, MonError> {
        let store = RedbMapStore::open(&config.db_path())?;
        let map = store
            .load()?
            .ok_or_else(|| MonError::NotInitialized(config.dir.clone()))?;
        let listener = TcpListener::bind(&config.listen).await?;
        let addr = listener.local_addr()?;
        let now = Instant::now();
        // Every daemon the map calls up gets a full grace period after a monitor restart.
        let last_heartbeat = map.osds.keys().map(|&id| (id, now)).collect();
        let (map_tx, _) = watch::channel(Arc::new(map.encode()));
        tracing::info!(
            "monitor listening on {addr}, cluster {:016x}, epoch {}",
            map.cluster_id,
            map.epoch
        );
        let mon = Arc::new(Monitor {
            state: Mutex::new(State {
                placement: Placement::compute(&map),
                map,
                store: Box::new(store),
                last_heartbeat,
                reports: HashMap::new(),
                counters: HashMap::new(),
                down_since: HashMap::new(),
                recovery_samples: Default::default(),
            }),
            map_tx,
            config,
        });
        Ok(BoundMonitor {
            addr,
            listener,
            mon,
        })
    }

    pub fn monitor(&self) -> Arc<Monitor> {
        self.mon.clone()
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), MonError> {
        let mon = self.mon.clone();
        let ticker = tokio::spawn({
            let mon = mon.clone();
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tick.tick().await;
                    mon.check_heartbeats();
                }
            }
        });
        let accept = accept_loop(self.listener, "monitor", MonService(mon.clone()));
        tokio::select! {
            _ = accept => {}
            _ = shutdown => {}
        }
        ticker.abort();
        Ok(())
    }
}

/// Longest list of PG ids named in one health message.
const HEALTH_PGS_NAMED_MAX: usize = 16;

/// The `PG_DAMAGED` message (Ceph's "Possible data damage"): how many groups and objects,
/// and which groups (the first [`HEALTH_PGS_NAMED_MAX`]).
fn damage_message(damaged: &[(PgId, u64)]) -> String {
    let objects: u64 = damaged.iter().map(|(_, n)| n).sum();
    let mut named: Vec<String> = damaged
        .iter()
        .take(HEALTH_PGS_NAMED_MAX)
        .map(|(pg, n)| format!("{pg} ({n})"))
        .collect();
    if damaged.len() > HEALTH_PGS_NAMED_MAX {
        named.push(format!("and {} more", damaged.len() - HEALTH_PGS_NAMED_MAX));
    }
    format!(
        "Possible data damage: {} placement group(s) inconsistent, {objects} object(s) with \
         no intact copy: {}",
        damaged.len(),
        named.join(", ")
    )
}

/// How bad a health check is (Ceph's HEALTH_WARN / HEALTH_ERR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warn,
    Err,
}

/// The value of counter `name` in a daemon's heartbeat counters.
fn counter(c: &[(String, u64)], name: &str) -> Option<u64> {
    c.iter().find(|(n, _)| n == name).map(|x| x.1)
}

/// (nearfull, full) of a daemon from its heartbeat counters: its file system's used
/// ratio against the map's ratios, or its store refusing new data (full mode).
fn space_flags(map: &ClusterMap, c: &[(String, u64)]) -> (bool, bool) {
    let store_full = counter(c, "store_full").unwrap_or(0) != 0;
    let (total, used) = (
        counter(c, "fs_total_bytes").unwrap_or(0),
        counter(c, "fs_used_bytes").unwrap_or(0),
    );
    let ratio_ppm = if total == 0 {
        0
    } else {
        (used as u128 * 1_000_000 / total as u128) as u64
    };
    let full = store_full || ratio_ppm >= map.full_ratio_ppm as u64;
    let nearfull = full || ratio_ppm >= map.nearfull_ratio_ppm as u64;
    (nearfull, full)
}

/// OSD_NEARFULL, OSD_FULL, POOL_FULL and OSD_UNHEALTHY (a store latched by an I/O error).
fn space_health(st: &State, health: &mut Health) {
    let map = &st.map;
    let list = |f: &dyn Fn(&OsdInfo) -> bool| -> Vec<String> {
        map.osds
            .values()
            .filter(|o| f(o))
            .map(|o| format!("osd.{}", o.id))
            .collect()
    };
    let full = list(&|o| o.full);
    let nearfull = list(&|o| o.nearfull && !o.full);
    let unhealthy = list(&|o| {
        o.up && st
            .counters
            .get(&o.id)
            .is_some_and(|c| counter(c, "store_failed").unwrap_or(0) != 0)
    });
    if !nearfull.is_empty() {
        health.add(
            "OSD_NEARFULL",
            Severity::Warn,
            format!(
                "{} daemon(s) nearfull (above {}): {}",
                nearfull.len(),
                map.nearfull_ratio_ppm as f64 / 1e6,
                nearfull.join(", ")
            ),
        );
    }
    if !full.is_empty() {
        health.add(
            "OSD_FULL",
            Severity::Err,
            format!(
                "{} daemon(s) full (above {} or out of space): {}",
                full.len(),
                map.full_ratio_ppm as f64 / 1e6,
                full.join(", ")
            ),
        );
    }
    let pools: Vec<&str> = map
        .pools
        .values()
        .filter(|p| map.pool_full(p.id))
        .map(|p| p.name.as_str())
        .collect();
    if !pools.is_empty() {
        health.add(
            "POOL_FULL",
            Severity::Err,
            format!(
                "{} pool(s) full, new writes are refused (deletes work): {}",
                pools.len(),
                pools.join(", ")
            ),
        );
    }
    if !unhealthy.is_empty() {
        health.add(
            "OSD_UNHEALTHY",
            Severity::Err,
            format!(
                "{} daemon(s) refuse I/O after a disk error (restart to recover): {}",
                unhealthy.len(),
                unhealthy.join(", ")
            ),
        );
    }
}

/// The cluster's health: named checks, each with a severity and a one-line message, as
/// Ceph reports them (`HEALTH_OK` when there are none). Shown by `spindle status`.
#[derive(Clone, Debug, Default)]
pub struct Health {
    checks: Vec<(&'static str, Severity, String)>,
}

impl Health {
    pub fn add(&mut self, name: &'static str, severity: Severity, message: String) {
        self.checks.push((name, severity, message));
    }

    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`: the worst check decides.
    pub fn status(&self) -> &'static str {
        match self.checks.iter().map(|c| c.1).max() {
            None => "HEALTH_OK",
            Some(Severity::Warn) => "HEALTH_WARN",
            Some(Severity::Err) => "HEALTH_ERR",
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let checks: Vec<_> = self
            .checks
            .iter()
            .map(|(name, sev, msg)| {
                json!({
                    "name": name,
                    "severity": match sev { Severity::Warn => "HEALTH_WARN", Severity::Err => "HEALTH_ERR" },
                    "message": msg,
                })
            })
            .collect();
        json!({"status": self.status(), "checks": checks})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_damage_check_names_groups_and_counts_objects() {
        let m = damage_message(&[
            (PgId { pool: 1, pg: 0x1f }, 2),
            (PgId { pool: 2, pg: 3 }, 1),
        ]);
        assert_eq!(
            m,
            "Possible data damage: 2 placement group(s) inconsistent, 3 object(s) with no \
             intact copy: 1.1f (2), 2.3 (1)"
        );
        let many: Vec<(PgId, u64)> = (0..20).map(|pg| (PgId { pool: 1, pg }, 1)).collect();
        let m = damage_message(&many);
        assert!(m.contains("20 placement group(s)"), "{m}");
        assert!(m.ends_with("1.f (1), and 4 more"), "{m}");
    }
}
