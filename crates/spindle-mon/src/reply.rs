//! Typed answers of the administrative commands.
//!
//! On the wire a command's answer is still JSON in `CommandReply { ok, output }`; these
//! types are what the monitor serializes ([`crate::MonCore::execute`] returns an
//! [`AdminReply`]) and what `spindle` and other clients deserialize it into ([`Admin`]
//! pairs a command with its reply type: `client.admin(&Admin::status())` is a [`Status`]). The CLI's `--json` output serializes the same
//! types, so the two cannot drift apart.
//!
//! Fields are declared in alphabetical order of their JSON names: the documents come out
//! byte for byte as the untyped `serde_json::json!` documents did (whose keys were sorted).

use crate::command::{AdminCommand, OsdVerb};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::marker::PhantomData;

/// The state of a placement group as `status` reports it (Ceph's names), in display order.
/// `inconsistent` (scrub found objects with no intact copy) outranks clean, degraded,
/// recovering and backfilling; a group that does not serve shows why instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgStatus {
    Clean,
    Inconsistent,
    Degraded,
    Recovering,
    Backfilling,
    Peering,
    Incomplete,
    Inactive,
}

impl PgStatus {
    /// Every state, in display order.
    pub const ALL: [PgStatus; 8] = [
        PgStatus::Clean,
        PgStatus::Inconsistent,
        PgStatus::Degraded,
        PgStatus::Recovering,
        PgStatus::Backfilling,
        PgStatus::Peering,
        PgStatus::Incomplete,
        PgStatus::Inactive,
    ];

    /// The name in `Status::pgs` and `PoolStatus::pgs`.
    pub fn name(self) -> &'static str {
        match self {
            PgStatus::Clean => "clean",
            PgStatus::Inconsistent => "inconsistent",
            PgStatus::Degraded => "degraded",
            PgStatus::Recovering => "recovering",
            PgStatus::Backfilling => "backfilling",
            PgStatus::Peering => "peering",
            PgStatus::Incomplete => "incomplete",
            PgStatus::Inactive => "inactive",
        }
    }

    /// Serving, and waiting will not change it: clean, or inconsistent (scrub's verdict
    /// stands until the damaged objects are overwritten or deleted).
    pub fn is_settled(self) -> bool {
        matches!(self, PgStatus::Clean | PgStatus::Inconsistent)
    }
}

/// `12 clean, 2 degraded`: the non-zero counts of a per-state map, in display order.
pub fn pg_summary(pgs: &BTreeMap<String, u64>) -> String {
    let count = |s: PgStatus| pgs.get(s.name()).copied().unwrap_or(0);
    PgStatus::ALL
        .iter()
        .filter(|s| count(**s) > 0)
        .map(|s| format!("{} {}", count(*s), s.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Groups of a per-state map that are not settled ([`PgStatus::is_settled`]).
pub fn unsettled_pgs(pgs: &BTreeMap<String, u64>) -> u64 {
    PgStatus::ALL
        .iter()
        .filter(|s| !s.is_settled())
        .map(|s| pgs.get(s.name()).copied().unwrap_or(0))
        .sum()
}

/// The `spindle status` document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The cluster id in hex.
    pub cluster_id: String,
    pub epoch: u64,
    /// The last map changes the leader committed, oldest first (a new leader starts with
    /// none).
    #[serde(default)]
    pub events: Vec<MapEvent>,
    pub full_ratio: f64,
    pub health: HealthReport,
    /// The images NBD servers serve, with their counters, by pool and name.
    #[serde(default)]
    pub images: Vec<ImageReport>,
    /// Groups scrub found objects with no intact copy in.
    pub inconsistent_pgs: Vec<InconsistentPg>,
    /// Each monitor's clock against the leader's, in milliseconds (positive: ahead), as
    /// measured at its last registration, with the round trip it was measured over.
    #[serde(default)]
    pub mon_clock: BTreeMap<u64, MonClock>,
    /// Where each monitor serves Prometheus metrics (`ip:port`, path `/metrics`), by id:
    /// those that registered with the leader in the last 30 s.
    #[serde(default)]
    pub mon_metrics_addrs: BTreeMap<u64, String>,
    pub nearfull_ratio: f64,
    pub objects: u64,
    pub osds: Vec<OsdStatus>,
    /// Placement groups per state (`clean`, `degraded`, ..., `inconsistent`).
    pub pgs: BTreeMap<String, u64>,
    pub pools: Vec<PoolStatus>,
    pub recovery: ClusterRecovery,
    /// Where other processes (`spindle nbd`, by `nbd.HOST.PID`) serve Prometheus metrics:
    /// those that registered in the last 30 s.
    #[serde(default)]
    pub service_metrics_addrs: BTreeMap<String, String>,
}

/// A committed map change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapEvent {
    pub epoch: u64,
    pub unix_ms: u64,
    /// Why the map changed (`osd.2 marked down ...`, a command).
    pub what: String,
}

/// The cluster's health: `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`, and the checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    pub checks: Vec<HealthCheck>,
    pub status: String,
}

/// An image a process (`spindle nbd`) serves, as it reports it with its metrics
/// registration: counters only grow while it serves the image (a reader derives rates).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageReport {
    pub pool: String,
    pub image: String,
    pub size_bytes: u64,
    /// Bytes of the image's data objects (one copy), from the server's last listing of
    /// the pool (every 30 s); None before the first.
    pub used_bytes: Option<u64>,
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Summed latencies of the operations counted, in microseconds.
    pub read_latency_us: u64,
    pub write_latency_us: u64,
    /// The process's registered name (filled in by the leader).
    #[serde(default)]
    pub served_by: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonClock {
    pub skew_ms: i64,
    pub rtt_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub message: String,
    /// `OSD_DOWN`, `PG_DAMAGED`, ...
    pub name: String,
    /// `HEALTH_WARN` or `HEALTH_ERR`.
    pub severity: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InconsistentPg {
    pub damaged_objects: u64,
    /// `pool.pg` (pg in hex).
    pub pg: String,
}

/// One storage daemon in `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OsdStatus {
    pub addr: String,
    pub avail_bytes: Option<u64>,
    /// The daemon's heartbeat counters.
    pub counters: BTreeMap<String, u64>,
    pub crush_weight: f64,
    pub full: bool,
    /// False once its store refused I/O after a disk error.
    pub healthy: bool,
    /// Its CRUSH host (the failure domain), if the CRUSH map has one for it.
    #[serde(default)]
    pub host: Option<String>,
    pub id: u32,
    #[serde(rename = "in")]
    pub in_cluster: bool,
    /// Where it serves Prometheus metrics (`ip:port`, path `/metrics`), from its latest
    /// heartbeat.
    #[serde(default)]
    pub metrics_addr: Option<String>,
    pub nearfull: bool,
    pub pid: u32,
    pub total_bytes: Option<u64>,
    pub up: bool,
    pub up_from: u64,
    pub used_bytes: Option<u64>,
    pub weight: f64,
}

/// One pool in `status` and `pool ls`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub crush_rule: i32,
    /// Erasure-code parameters (None for a replicated pool).
    pub erasure: Option<ErasureStatus>,
    pub id: u32,
    pub min_size: u32,
    pub name: String,
    pub objects: u64,
    pub pg_count: u32,
    pub pgs: BTreeMap<String, u64>,
    pub recovery: PoolRecovery,
    pub size: u32,
    /// `replicated` or `erasure`.
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureStatus {
    pub k: u32,
    pub m: u32,
    pub matrix: Option<String>,
    pub stripe_unit: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecovery {
    pub bytes_left: u64,
    pub objects_left: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecovery {
    pub bytes_left: u64,
    pub bytes_per_sec: f64,
    pub objects_left: u64,
    pub objects_per_sec: f64,
}

/// `pool create` / `pool create-ec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCreated {
    pub epoch: u64,
    pub id: u32,
    pub pool: String,
}

/// `pool rm`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRemoved {
    pub epoch: u64,
    pub id: u32,
    pub removed: String,
}

/// `osd out|in|down`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdMarked {
    pub done: OsdVerb,
    pub epoch: u64,
    pub osd: u32,
}

/// `osd add`: the new daemon's id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdAdded {
    pub epoch: u64,
    pub osd: u32,
}

/// `osd set-full-ratio|set-nearfull-ratio`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioSet {
    /// `set-full-ratio` or `set-nearfull-ratio`.
    pub done: String,
    pub epoch: u64,
    pub ratio: f64,
}

/// `crush set`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrushSet {
    pub epoch: u64,
}

/// `lock acquire`: the lock is the caller's from map `epoch` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLocked {
    /// The map epoch that holds the lock (and the fence of a previous holder).
    pub epoch: u64,
    pub generation: u64,
    /// The previous holder, fenced, when the lock was taken over.
    pub taken_from: Option<String>,
}

/// `lock renew`: the lease runs this long from now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRenewed {
    pub lease_ms: u64,
}

/// `lock release`: the map epoch from which the lock is gone (the current one if the
/// caller held none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockReleased {
    pub epoch: u64,
}

/// `snap create|rm|protect|unprotect|forget`: the map epoch holding the change (every
/// primary must have it before the snapshot counts as taken: the caller pushes it) and the
/// snapshot's id (0 for `forget`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapDone {
    pub epoch: u64,
    pub id: u64,
}

/// One monitor of the Raft group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonMember {
    pub id: u64,
    pub addr: String,
    /// A voter (a learner still catching up is not).
    pub voter: bool,
}

/// `mon ls`, `mon add`, `mon rm`: the monitors as the answering monitor sees them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonList {
    /// The monitor that answered.
    pub answered_by: u64,
    /// The leader it follows (None while an election runs).
    pub leader: Option<u64>,
    pub term: u64,
    /// The map epoch it has applied.
    pub epoch: u64,
    pub mons: Vec<MonMember>,
}

/// The answer of any command, as the monitor produces it (serialized without a tag: the
/// command says which it is).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AdminReply {
    Status(Box<Status>),
    PoolLs(Vec<PoolStatus>),
    PoolCreated(PoolCreated),
    PoolRemoved(PoolRemoved),
    OsdMarked(OsdMarked),
    OsdAdded(OsdAdded),
    RatioSet(RatioSet),
    /// `crush get`: the map as `crushtool -d` text.
    CrushMap(String),
    CrushSet(CrushSet),
    ImageLocked(ImageLocked),
    LockRenewed(LockRenewed),
    LockReleased(LockReleased),
    SnapDone(SnapDone),
    MonList(MonList),
    AuthList(Vec<AuthEntry>),
    AuthEntry(AuthEntry),
    /// `mon metrics`: recorded (JSON `null`).
    Registered,
}

/// An entity of the key database as `auth` commands show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthEntry {
    pub entity: String,
    pub caps: String,
    /// The key, hex of its sealing under the asking entity's key (`auth get|add` only;
    /// `spindle_proto::auth::open(asker_key, "auth key", ..)` opens it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sealed: Option<String>,
}

impl AdminReply {
    /// Parses the JSON answer of `cmd` into the reply type of that command.
    pub fn parse(cmd: &AdminCommand, json: &str) -> Result<AdminReply, serde_json::Error> {
        use serde_json::from_str;
        Ok(match cmd {
            AdminCommand::Status => AdminReply::Status(from_str(json)?),
            AdminCommand::PoolLs => AdminReply::PoolLs(from_str(json)?),
            AdminCommand::PoolCreate { .. } | AdminCommand::PoolCreateEc { .. } => {
                AdminReply::PoolCreated(from_str(json)?)
            }
            AdminCommand::PoolRm { .. } => AdminReply::PoolRemoved(from_str(json)?),
            AdminCommand::Osd { .. } => AdminReply::OsdMarked(from_str(json)?),
            AdminCommand::OsdAdd { .. } => AdminReply::OsdAdded(from_str(json)?),
            AdminCommand::SetRatio { .. } => AdminReply::RatioSet(from_str(json)?),
            AdminCommand::CrushGet => AdminReply::CrushMap(from_str(json)?),
            AdminCommand::CrushSet { .. } => AdminReply::CrushSet(from_str(json)?),
            AdminCommand::LockAcquire { .. } => AdminReply::ImageLocked(from_str(json)?),
            AdminCommand::LockRenew { .. } => AdminReply::LockRenewed(from_str(json)?),
            AdminCommand::LockRelease { .. } => AdminReply::LockReleased(from_str(json)?),
            AdminCommand::Snap { .. }
            | AdminCommand::SnapChild { .. }
            | AdminCommand::SnapTrimmed { .. } => AdminReply::SnapDone(from_str(json)?),
            AdminCommand::MonMetrics { .. } | AdminCommand::MetricsRegister { .. } => {
                let _: serde_json::Value = from_str(json)?;
                AdminReply::Registered
            }
            AdminCommand::MonLs | AdminCommand::MonAdd { .. } | AdminCommand::MonRm { .. } => {
                AdminReply::MonList(from_str(json)?)
            }
            AdminCommand::AuthLs => AdminReply::AuthList(from_str(json)?),
            AdminCommand::AuthGet { .. }
            | AdminCommand::AuthAdd { .. }
            | AdminCommand::AuthCaps { .. }
            | AdminCommand::AuthRm { .. }
            | AdminCommand::AuthApply { .. } => AdminReply::AuthEntry(from_str(json)?),
        })
    }
}

/// A command together with the type of its answer: what a client sends
/// (`command.to_args()`) and what it deserializes the answer into (`R`).
#[derive(Clone, Debug, PartialEq)]
pub struct Admin<R> {
    pub command: AdminCommand,
    reply: PhantomData<fn() -> R>,
}

impl<R> Admin<R> {
    fn new(command: AdminCommand) -> Admin<R> {
        Admin {
            command,
            reply: PhantomData,
        }
    }

    /// The argument list that travels in `Msg::Command`.
    pub fn args(&self) -> Vec<String> {
        self.command.to_args()
    }
}

impl<R> spindle_proto::AdminRequest for Admin<R> {
    type Reply = R;
    fn args(&self) -> Vec<String> {
        self.command.to_args()
    }
}

impl Admin<Status> {
    pub fn status() -> Self {
        Admin::new(AdminCommand::Status)
    }
}

impl Admin<Vec<PoolStatus>> {
    pub fn pool_ls() -> Self {
        Admin::new(AdminCommand::PoolLs)
    }
}

impl Admin<PoolCreated> {
    pub fn pool_create(name: &str, size: u32, min_size: u32, pg_count: u32) -> Self {
        Admin::new(AdminCommand::PoolCreate {
            name: name.to_string(),
            size,
            min_size,
            pg_count,
        })
    }

    /// An erasure-coded pool; `matrix` indexes `spindle_map::EC_MATRIX_NAMES`.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_create_ec(
        name: &str,
        k: u32,
        m: u32,
        min_size: u32,
        matrix: u8,
        stripe_unit_bytes: u32,
        pg_count: u32,
    ) -> Self {
        Admin::new(AdminCommand::PoolCreateEc {
            name: name.to_string(),
            k,
            m,
            min_size,
            matrix,
            stripe_unit_bytes,
            pg_count,
        })
    }
}

impl Admin<PoolRemoved> {
    pub fn pool_rm(name: &str) -> Self {
        Admin::new(AdminCommand::PoolRm {
            name: name.to_string(),
        })
    }
}

impl Admin<OsdMarked> {
    pub fn osd(verb: OsdVerb, id: u32) -> Self {
        Admin::new(AdminCommand::Osd { verb, id })
    }
}

impl Admin<OsdAdded> {
    pub fn osd_add(weight: f64) -> Self {
        Admin::new(AdminCommand::OsdAdd { weight, host: None })
    }
    /// Adds a daemon in host bucket `host`.
    pub fn osd_add_on(weight: f64, host: &str) -> Self {
        Admin::new(AdminCommand::OsdAdd {
            weight,
            host: Some(host.into()),
        })
    }
}

impl Admin<RatioSet> {
    /// The full (`full: true`) or nearfull ratio, in parts per million.
    pub fn set_ratio(full: bool, ratio_ppm: u32) -> Self {
        Admin::new(AdminCommand::SetRatio { full, ratio_ppm })
    }
}

impl Admin<String> {
    pub fn crush_get() -> Self {
        Admin::new(AdminCommand::CrushGet)
    }
}

impl Admin<ImageLocked> {
    /// `lock acquire`: `take_over` fences a live holder (`--break-lock`).
    pub fn lock_acquire(
        pool: &str,
        image: &str,
        client: u64,
        lease_ms: u64,
        holder: &str,
        take_over: bool,
    ) -> Self {
        Admin::new(AdminCommand::LockAcquire {
            pool: pool.into(),
            image: image.into(),
            client,
            lease_ms,
            holder: holder.into(),
            take_over,
        })
    }
}

impl Admin<LockRenewed> {
    pub fn lock_renew(pool: &str, image: &str, client: u64) -> Self {
        Admin::new(AdminCommand::LockRenew {
            pool: pool.into(),
            image: image.into(),
            client,
        })
    }
}

impl Admin<LockReleased> {
    pub fn lock_release(pool: &str, image: &str, client: u64) -> Self {
        Admin::new(AdminCommand::LockRelease {
            pool: pool.into(),
            image: image.into(),
            client,
        })
    }
}

impl Admin<MonList> {
    pub fn mon_ls() -> Self {
        Admin::new(AdminCommand::MonLs)
    }
    pub fn mon_add(id: u64, addr: &str) -> Self {
        Admin::new(AdminCommand::MonAdd {
            id,
            addr: addr.into(),
        })
    }
    pub fn mon_rm(id: u64) -> Self {
        Admin::new(AdminCommand::MonRm { id })
    }
}

impl Admin<Vec<AuthEntry>> {
    pub fn auth_ls() -> Self {
        Admin::new(AdminCommand::AuthLs)
    }
}

impl Admin<AuthEntry> {
    pub fn auth_get(entity: &str) -> Self {
        Admin::new(AdminCommand::AuthGet {
            entity: entity.into(),
        })
    }
    /// `caps`: canonical text; `key_sealed`: hex of the key sealed under the caller's key
    /// (None: the monitors make one).
    pub fn auth_add(entity: &str, caps: &str, key_sealed: Option<String>) -> Self {
        Admin::new(AdminCommand::AuthAdd {
            entity: entity.into(),
            caps: caps.into(),
            key_sealed,
        })
    }
    pub fn auth_caps(entity: &str, caps: &str) -> Self {
        Admin::new(AdminCommand::AuthCaps {
            entity: entity.into(),
            caps: caps.into(),
        })
    }
    pub fn auth_rm(entity: &str) -> Self {
        Admin::new(AdminCommand::AuthRm {
            entity: entity.into(),
        })
    }
}

impl Admin<CrushSet> {
    pub fn crush_set(text: &str) -> Self {
        Admin::new(AdminCommand::CrushSet {
            text: text.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{first_map, InitSpec, MonCore, MonTiming};

    fn core() -> MonCore {
        let spec = InitSpec {
            osd_count: 3,
            osd_hosts: Vec::new(),
            default_pool: Some(("default".into(), 3, 2, 8)),
        };
        let map = first_map(&spec, 7).expect("first map");
        let timing = MonTiming {
            down_after_ms: 2_000,
            out_after_ms: 30_000,
        };
        let mut core = MonCore::new(map, timing, 0);
        let (_, next) = core
            .execute(&AdminCommand::PoolCreateEc {
                name: "ec".into(),
                k: 2,
                m: 1,
                min_size: 2,
                matrix: 0,
                stripe_unit_bytes: 4096,
                pg_count: 4,
            })
            .unwrap();
        core.install(next.unwrap(), 0);
        core.heartbeat(
            1,
            0,
            core.epoch(),
            vec![],
            vec![("fs_total_bytes".into(), 100)],
        );
        core
    }

    /// Every command's answer, as JSON on the wire, parses back into its reply type; keys
    /// come out sorted (the documents are byte for byte what the untyped ones were).
    #[test]
    fn every_answer_survives_the_wire_and_keys_are_sorted() {
        let core = core();
        let crush = spindle_crush::text::print_text(&core.map().crush);
        let all = [
            Admin::status().command,
            Admin::pool_ls().command,
            Admin::pool_create("p", 3, 2, 8).command,
            Admin::pool_create_ec("e2", 2, 1, 2, 0, 4096, 8).command,
            Admin::pool_rm("default").command,
            Admin::osd(OsdVerb::Out, 1).command,
            Admin::osd_add(1.0).command,
            Admin::set_ratio(false, 800_000).command,
            Admin::crush_get().command,
            Admin::crush_set(&crush).command,
        ];
        for cmd in all {
            let (reply, _) = core.execute(&cmd).unwrap();
            let json = serde_json::to_string(&reply).unwrap();
            let sorted = serde_json::to_value(&reply).unwrap().to_string();
            assert_eq!(json, sorted, "{cmd:?}: keys not in sorted order");
            assert_eq!(AdminReply::parse(&cmd, &json).unwrap(), reply, "{cmd:?}");
        }
    }

    #[test]
    fn status_keeps_the_json_names_clients_rely_on() {
        let (reply, _) = core().execute(&AdminCommand::Status).unwrap();
        let v = serde_json::to_value(&reply).unwrap();
        let osd = &v["osds"][0];
        assert_eq!(osd["in"], true);
        assert_eq!(osd["total_bytes"], 100);
        assert!(osd["used_bytes"].is_null());
        assert_eq!(v["pools"][0]["type"], "replicated");
        assert!(v["pools"][0]["erasure"].is_null());
        assert_eq!(v["pools"][1]["type"], "erasure");
        assert_eq!(v["pools"][1]["erasure"]["stripe_unit"], 4096);
        // No daemon booted: every group of both pools (8 + 4) is inactive.
        assert_eq!(v["pgs"]["inactive"], 12);
        assert_eq!(v["health"]["status"], "HEALTH_WARN");
        assert_eq!(v["recovery"]["objects_left"], 0);
        let marked = serde_json::to_value(OsdMarked {
            done: OsdVerb::Down,
            epoch: 3,
            osd: 1,
        })
        .unwrap();
        assert_eq!(
            marked,
            serde_json::json!({"done": "down", "epoch": 3, "osd": 1})
        );
    }

    #[test]
    fn pg_states_have_one_name_each_and_summaries_follow_display_order() {
        let names: std::collections::BTreeSet<_> = PgStatus::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), PgStatus::ALL.len());
        for (i, s) in PgStatus::ALL.iter().enumerate() {
            assert_eq!(
                *s as usize, i,
                "ALL is in declaration order (status.rs indexes by it)"
            );
        }
        let pgs: BTreeMap<String, u64> = [("degraded", 2), ("clean", 12), ("inconsistent", 1)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(pg_summary(&pgs), "12 clean, 1 inconsistent, 2 degraded");
        assert_eq!(unsettled_pgs(&pgs), 2, "clean and inconsistent are settled");
    }
}
