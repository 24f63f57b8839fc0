//! Administrative commands, typed. On the wire a command is still its argument list
//! (`Msg::Command { args }`, what `spindle` sends); the monitor parses it into an
//! [`AdminCommand`] (every number and name checked here, with a clear error) before the
//! core executes it, and [`AdminCommand::to_args`] is the inverse.

/// What `spindle osd out|in|down ID` does (in JSON: `"out"`, `"in"`, `"down"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OsdVerb {
    Out,
    In,
    Down,
}

impl OsdVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            OsdVerb::Out => "out",
            OsdVerb::In => "in",
            OsdVerb::Down => "down",
        }
    }
}

/// What `snap VERB` does to an image's snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapVerb {
    Create,
    Rm,
    Protect,
    Unprotect,
    Forget,
}

impl SnapVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapVerb::Create => "create",
            SnapVerb::Rm => "rm",
            SnapVerb::Protect => "protect",
            SnapVerb::Unprotect => "unprotect",
            SnapVerb::Forget => "forget",
        }
    }
}

/// One administrative command.
/// Images one process reports with its registration: the dashboard lists them, and a
/// process serving more reports the first ones (NBD exports are usually a few).
pub const IMAGE_REPORTS_MAX: usize = 256;
/// Their JSON: about 250 bytes each.
pub const IMAGE_REPORTS_BYTES_MAX: usize = 96 * 1024;
const _: () = assert!(IMAGE_REPORTS_MAX * 300 <= IMAGE_REPORTS_BYTES_MAX);

/// A monitor's clock against the leader's, measured like NTP: it sends its registration,
/// the leader answers with its clock, and the midpoint of the round trip is compared with
/// it. The true offset is within `skew_ms ± rtt_ms / 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// Positive: this monitor's clock is ahead of the leader's.
    pub skew_ms: i64,
    pub rtt_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum AdminCommand {
    /// The `spindle status` document.
    Status,
    /// The pools part of the status document.
    PoolLs,
    PoolCreate {
        name: String,
        size: u32,
        min_size: u32,
        pg_count: u32,
    },
    PoolCreateEc {
        name: String,
        k: u32,
        m: u32,
        min_size: u32,
        /// Index into `spindle_map::EC_MATRIX_NAMES`.
        matrix: u8,
        stripe_unit_bytes: u32,
        pg_count: u32,
    },
    PoolRm {
        name: String,
    },
    Osd {
        verb: OsdVerb,
        id: u32,
    },
    /// Add a daemon to Spindle's CRUSH hierarchy with this weight (0 < weight <= 65535),
    /// in host bucket `host` (a new host if none has that name), or in a host of its own.
    OsdAdd {
        weight: f64,
        host: Option<String>,
    },
    /// Set the full (`full: true`) or nearfull ratio, in parts per million (0, 1e6].
    SetRatio {
        full: bool,
        ratio_ppm: u32,
    },
    CrushGet,
    /// Replace the CRUSH map with this `crushtool -d` text.
    CrushSet {
        text: String,
    },
    /// Take (or keep) an image's exclusive lock for client `client`, with a lease of
    /// `lease_ms`. A lock another client holds is taken over, and that client fenced, only
    /// when its lease ran out or `take_over` is set.
    LockAcquire {
        pool: String,
        image: String,
        client: u64,
        lease_ms: u64,
        holder: String,
        take_over: bool,
    },
    /// Extend the lease of a lock `client` holds.
    LockRenew {
        pool: String,
        image: String,
        client: u64,
    },
    /// Drop the lock if `client` holds it (nothing to do otherwise).
    LockRelease {
        pool: String,
        image: String,
        client: u64,
    },
    /// Image snapshots (`spindle_mon`'s `snaps` module): `verb` is create (with the
    /// image's size), rm, protect, unprotect, or forget (drop the image's entry once it has
    /// no snapshot: the image is being removed).
    Snap {
        verb: SnapVerb,
        pool: String,
        image: String,
        /// Empty for `forget`.
        snap: String,
        /// The image's size, for `create` (0 otherwise).
        size_bytes: u64,
    },
    /// The trimmer deleted every copy that removals up to the `removals`-th left of
    /// `pool`/`image` (`ImageSnaps::trimmed`); a removal since keeps the trim pending.
    SnapTrimmed {
        pool: String,
        image: String,
        removals: u64,
    },
    /// Register (`add`) or drop (`rm`) clone `child_pool`/`child` of snapshot
    /// `pool`/`image`@`snap` (`snaps` module): add needs the snapshot protected; rm of a
    /// clone that is not registered (or whose snapshot is gone) changes nothing.
    SnapChild {
        add: bool,
        pool: String,
        image: String,
        snap: String,
        child_pool: String,
        child: String,
    },
    /// The monitors: members, leader, term (any monitor answers from its own view).
    MonLs,
    /// A monitor tells the leader where it serves Prometheus metrics (every few seconds;
    /// kept in the leader's memory, listed by `status`).
    MonMetrics {
        id: u64,
        addr: String,
        /// Its clock against the leader's, from its previous registration (the leader
        /// answers with its clock): the `MON_CLOCK_SKEW` health check.
        clock: Option<ClockSample>,
    },
    /// Another process (a `spindle nbd`) tells the leader where it serves Prometheus
    /// metrics, under a name of its own (`nbd.HOST.PID`); kept like [`Self::MonMetrics`].
    MetricsRegister {
        name: String,
        addr: String,
        /// The images it serves, with their counters (the dashboard's images).
        images: Vec<crate::reply::ImageReport>,
    },
    /// Add monitor `id` listening on `addr` (already running, started with `--id`): it
    /// catches up as a learner, then becomes a voter.
    MonAdd {
        id: u64,
        addr: String,
    },
    /// Remove monitor `id` from the voters.
    MonRm {
        id: u64,
    },
    /// Entities and their capabilities (no keys).
    AuthLs,
    /// An entity's key (sealed under the asking entity's key) and capabilities.
    AuthGet {
        entity: String,
    },
    /// Add an entity with capabilities `caps` (canonical text) and a new key, or the key
    /// in `key_sealed` (hex, sealed under the asking entity's key).
    AuthAdd {
        entity: String,
        caps: String,
        key_sealed: Option<String>,
    },
    /// Replace an entity's capabilities.
    AuthCaps {
        entity: String,
        caps: String,
    },
    AuthRm {
        entity: String,
    },
    /// Monitor to leader: apply a key database change (hex, sealed under the monitors' key).
    AuthApply {
        sealed: String,
    },
}

/// Shortest and longest image lock lease a client may ask for.
pub const LOCK_LEASE_MS_MIN: u64 = 1_000;
pub const LOCK_LEASE_MS_MAX: u64 = 600_000;

fn client_id(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s, 16)
        .ok()
        .filter(|c| *c != 0)
        .ok_or_else(|| format!("client id must be a non-zero hex number, got '{s}'"))
}

const KNOWN: &str = "status, pool ls|create|create-ec|rm, osd out|in|down|add|set-full-ratio|set-nearfull-ratio, crush get|set, lock acquire|renew|release, snap create|rm|protect|unprotect|forget, mon ls|add|rm, auth ls|get|add|caps|rm";

fn entity(s: &str) -> Result<String, String> {
    spindle_proto::auth::parse_entity(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn caps(s: &str) -> Result<String, String> {
    spindle_proto::auth::Caps::parse(s)
        .map(|c| c.to_text())
        .map_err(|e| format!("bad capabilities: {e}"))
}

fn hex_arg(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 1024 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("expected a hex string".into());
    }
    Ok(s.to_string())
}

fn mon_id(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .map_err(|_| format!("monitor id must be a number, got '{s}'"))
}

fn number(s: &str, what: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .map_err(|_| format!("{what} must be a number, got '{s}'"))
}

impl AdminCommand {
    /// Parses an argument list (`["pool", "create", "rbd", "3", "2", "64"]`).
    pub fn parse(args: &[String]) -> Result<AdminCommand, String> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(match a.as_slice() {
            ["status"] => AdminCommand::Status,
            ["pool", "ls"] => AdminCommand::PoolLs,
            ["pool", "create", name, size, min_size, pg_count] => AdminCommand::PoolCreate {
                name: name.to_string(),
                size: number(size, "size")?,
                min_size: number(min_size, "min_size")?,
                pg_count: number(pg_count, "pg count")?,
            },
            ["pool", "create-ec", name, k, m, min_size, matrix, stripe_unit, pg_count] => {
                AdminCommand::PoolCreateEc {
                    name: name.to_string(),
                    k: number(k, "k")?,
                    m: number(m, "m")?,
                    min_size: number(min_size, "min_size")?,
                    matrix: spindle_map::EC_MATRIX_NAMES
                        .iter()
                        .position(|n| n == matrix)
                        .ok_or_else(|| {
                            format!(
                                "unknown matrix '{matrix}' (one of {})",
                                spindle_map::EC_MATRIX_NAMES.join(", ")
                            )
                        })? as u8,
                    stripe_unit_bytes: number(stripe_unit, "stripe unit")?,
                    pg_count: number(pg_count, "pg count")?,
                }
            }
            ["pool", "rm", name] => AdminCommand::PoolRm {
                name: name.to_string(),
            },
            ["osd", verb @ ("out" | "in" | "down"), id] => AdminCommand::Osd {
                verb: match *verb {
                    "out" => OsdVerb::Out,
                    "in" => OsdVerb::In,
                    _ => OsdVerb::Down,
                },
                id: number(id, "osd id")?,
            },
            ["osd", "add", weight, host @ ..] if host.len() <= 1 => AdminCommand::OsdAdd {
                weight: weight
                    .parse()
                    .ok()
                    .filter(|w: &f64| w.is_finite() && *w > 0.0 && *w <= 65535.0)
                    .ok_or_else(|| format!("weight must be a positive number, got '{weight}'"))?,
                host: match host.first() {
                    None => None,
                    Some(h) if spindle_map::valid_host_name(h) => Some(h.to_string()),
                    Some(h) => {
                        return Err(format!(
                            "bad host name '{h}' (letters, digits, '.', '_', '-'; at most 64; not starting with a digit)"
                        ))
                    }
                },
            },
            ["osd", verb @ ("set-full-ratio" | "set-nearfull-ratio"), ratio] => {
                AdminCommand::SetRatio {
                    full: *verb == "set-full-ratio",
                    ratio_ppm: ratio
                        .parse::<f64>()
                        .ok()
                        .filter(|r| *r > 0.0 && *r <= 1.0)
                        .map(|r| (r * 1e6).round() as u32)
                        .ok_or_else(|| {
                            format!("ratio must be a number in (0, 1], got '{ratio}'")
                        })?,
                }
            }
            ["crush", "get"] => AdminCommand::CrushGet,
            ["crush", "set", text] => AdminCommand::CrushSet {
                text: text.to_string(),
            },
            ["lock", "acquire", pool, image, client, lease_ms, holder, mode @ ("keep" | "break")] => {
                AdminCommand::LockAcquire {
                    pool: pool.to_string(),
                    image: image.to_string(),
                    client: client_id(client)?,
                    lease_ms: lease_ms
                        .parse::<u64>()
                        .ok()
                        .filter(|l| (LOCK_LEASE_MS_MIN..=LOCK_LEASE_MS_MAX).contains(l))
                        .ok_or_else(|| {
                            format!(
                                "lease must be {LOCK_LEASE_MS_MIN}..={LOCK_LEASE_MS_MAX} ms, got '{lease_ms}'"
                            )
                        })?,
                    holder: holder.to_string(),
                    take_over: *mode == "break",
                }
            }
            ["lock", verb @ ("renew" | "release"), pool, image, client] => {
                let (pool, image, client) = (pool.to_string(), image.to_string(), client_id(client)?);
                if *verb == "renew" {
                    AdminCommand::LockRenew { pool, image, client }
                } else {
                    AdminCommand::LockRelease { pool, image, client }
                }
            }
            ["snap", "child", verb @ ("add" | "rm"), pool, image, snap, child_pool, child] => {
                AdminCommand::SnapChild {
                    add: *verb == "add",
                    pool: pool.to_string(),
                    image: image.to_string(),
                    snap: snap.to_string(),
                    child_pool: child_pool.to_string(),
                    child: child.to_string(),
                }
            }
            ["snap", "trimmed", pool, image, removals] => AdminCommand::SnapTrimmed {
                pool: pool.to_string(),
                image: image.to_string(),
                removals: removals
                    .parse::<u64>()
                    .map_err(|_| format!("removal count must be a number, got '{removals}'"))?,
            },
            ["snap", verb, pool, image, snap, size] => {
                let verb = match *verb {
                    "create" => SnapVerb::Create,
                    "rm" => SnapVerb::Rm,
                    "protect" => SnapVerb::Protect,
                    "unprotect" => SnapVerb::Unprotect,
                    "forget" => SnapVerb::Forget,
                    other => return Err(format!("unknown snap verb '{other}'")),
                };
                AdminCommand::Snap {
                    verb,
                    pool: pool.to_string(),
                    image: image.to_string(),
                    snap: snap.to_string(),
                    size_bytes: size
                        .parse::<u64>()
                        .map_err(|_| format!("snapshot size must be a byte count, got '{size}'"))?,
                }
            }
            ["mon", "ls"] => AdminCommand::MonLs,
            ["metrics", "register", name, addr, images @ ..] if images.len() <= 1 => {
                if name.is_empty()
                    || name.len() > 128
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                {
                    return Err(format!(
                        "a metrics name is 1 to 128 letters, digits, '.', '_' or '-', got '{name}'"
                    ));
                }
                if addr.parse::<std::net::SocketAddr>().is_err() {
                    return Err(format!("a metrics address is ip:port, got '{addr}'"));
                }
                let images: Vec<crate::reply::ImageReport> = match images {
                    [json] => {
                        if json.len() > IMAGE_REPORTS_BYTES_MAX {
                            return Err(format!(
                                "image reports of {} bytes (at most {IMAGE_REPORTS_BYTES_MAX})",
                                json.len()
                            ));
                        }
                        serde_json::from_str(json)
                            .map_err(|e| format!("image reports are not valid: {e}"))?
                    }
                    _ => Vec::new(),
                };
                if images.len() > IMAGE_REPORTS_MAX {
                    return Err(format!(
                        "{} image reports (at most {IMAGE_REPORTS_MAX} per process)",
                        images.len()
                    ));
                }
                AdminCommand::MetricsRegister {
                    name: name.to_string(),
                    addr: addr.to_string(),
                    images,
                }
            }
            ["mon", "metrics", id, addr, clock @ ..] if clock.is_empty() || clock.len() == 2 => {
                AdminCommand::MonMetrics {
                    id: id
                        .parse::<u64>()
                        .map_err(|_| format!("monitor id must be a number, got '{id}'"))?,
                    addr: addr.to_string(),
                    clock: match clock {
                        [skew, rtt] => Some(ClockSample {
                            skew_ms: skew
                                .parse()
                                .map_err(|_| format!("clock skew must be a number, got '{skew}'"))?,
                            rtt_ms: rtt
                                .parse()
                                .map_err(|_| format!("round trip must be a number, got '{rtt}'"))?,
                        }),
                        _ => None,
                    },
                }
            }
            ["mon", "add", id, addr] => {
                if addr.is_empty() || addr.len() > 256 || addr.contains(',') {
                    return Err(format!("bad monitor address '{addr}'"));
                }
                AdminCommand::MonAdd {
                    id: mon_id(id)?,
                    addr: addr.to_string(),
                }
            }
            ["mon", "rm", id] => AdminCommand::MonRm { id: mon_id(id)? },
            ["auth", "ls"] => AdminCommand::AuthLs,
            ["auth", "get", e] => AdminCommand::AuthGet { entity: entity(e)? },
            ["auth", "add", e, c, key @ ..] if key.len() <= 1 => AdminCommand::AuthAdd {
                entity: entity(e)?,
                caps: caps(c)?,
                key_sealed: key.first().map(|k| hex_arg(k)).transpose()?,
            },
            ["auth", "caps", e, c] => AdminCommand::AuthCaps {
                entity: entity(e)?,
                caps: caps(c)?,
            },
            ["auth", "rm", e] => AdminCommand::AuthRm { entity: entity(e)? },
            ["auth", "apply", sealed] => AdminCommand::AuthApply {
                sealed: hex_arg(sealed)?,
            },
            _ => {
                return Err(format!(
                    "unknown command '{}' (known: {KNOWN})",
                    a.join(" ")
                ))
            }
        })
    }

    /// The argument list that [`AdminCommand::parse`] turns back into this command.
    pub fn to_args(&self) -> Vec<String> {
        let v: Vec<String> = match self {
            AdminCommand::Status => vec!["status".into()],
            AdminCommand::PoolLs => vec!["pool".into(), "ls".into()],
            AdminCommand::PoolCreate {
                name,
                size,
                min_size,
                pg_count,
            } => vec![
                "pool".into(),
                "create".into(),
                name.clone(),
                size.to_string(),
                min_size.to_string(),
                pg_count.to_string(),
            ],
            AdminCommand::PoolCreateEc {
                name,
                k,
                m,
                min_size,
                matrix,
                stripe_unit_bytes,
                pg_count,
            } => vec![
                "pool".into(),
                "create-ec".into(),
                name.clone(),
                k.to_string(),
                m.to_string(),
                min_size.to_string(),
                spindle_map::EC_MATRIX_NAMES
                    .get(*matrix as usize)
                    .copied()
                    .unwrap_or("?")
                    .to_string(),
                stripe_unit_bytes.to_string(),
                pg_count.to_string(),
            ],
            AdminCommand::PoolRm { name } => vec!["pool".into(), "rm".into(), name.clone()],
            AdminCommand::Osd { verb, id } => {
                vec!["osd".into(), verb.as_str().into(), id.to_string()]
            }
            AdminCommand::OsdAdd { weight, host } => {
                let mut v = vec!["osd".into(), "add".into(), weight.to_string()];
                v.extend(host.clone());
                v
            }
            AdminCommand::SetRatio { full, ratio_ppm } => vec![
                "osd".into(),
                if *full {
                    "set-full-ratio"
                } else {
                    "set-nearfull-ratio"
                }
                .into(),
                (*ratio_ppm as f64 / 1e6).to_string(),
            ],
            AdminCommand::CrushGet => vec!["crush".into(), "get".into()],
            AdminCommand::CrushSet { text } => vec!["crush".into(), "set".into(), text.clone()],
            AdminCommand::LockAcquire {
                pool,
                image,
                client,
                lease_ms,
                holder,
                take_over,
            } => vec![
                "lock".into(),
                "acquire".into(),
                pool.clone(),
                image.clone(),
                format!("{client:x}"),
                lease_ms.to_string(),
                holder.clone(),
                if *take_over { "break" } else { "keep" }.into(),
            ],
            AdminCommand::LockRenew {
                pool,
                image,
                client,
            } => vec![
                "lock".into(),
                "renew".into(),
                pool.clone(),
                image.clone(),
                format!("{client:x}"),
            ],
            AdminCommand::LockRelease {
                pool,
                image,
                client,
            } => vec![
                "lock".into(),
                "release".into(),
                pool.clone(),
                image.clone(),
                format!("{client:x}"),
            ],
            AdminCommand::SnapTrimmed {
                pool,
                image,
                removals,
            } => vec![
                "snap".into(),
                "trimmed".into(),
                pool.clone(),
                image.clone(),
                removals.to_string(),
            ],
            AdminCommand::Snap {
                verb,
                pool,
                image,
                snap,
                size_bytes,
            } => vec![
                "snap".into(),
                verb.as_str().into(),
                pool.clone(),
                image.clone(),
                snap.clone(),
                size_bytes.to_string(),
            ],
            AdminCommand::SnapChild {
                add,
                pool,
                image,
                snap,
                child_pool,
                child,
            } => vec![
                "snap".into(),
                "child".into(),
                if *add { "add" } else { "rm" }.into(),
                pool.clone(),
                image.clone(),
                snap.clone(),
                child_pool.clone(),
                child.clone(),
            ],
            AdminCommand::MonLs => vec!["mon".into(), "ls".into()],
            AdminCommand::MonMetrics { id, addr, clock } => {
                let mut args = vec!["mon".into(), "metrics".into(), id.to_string(), addr.clone()];
                if let Some(c) = clock {
                    args.extend([c.skew_ms.to_string(), c.rtt_ms.to_string()]);
                }
                args
            }
            AdminCommand::MetricsRegister { name, addr, images } => {
                let mut args = vec![
                    "metrics".into(),
                    "register".into(),
                    name.clone(),
                    addr.clone(),
                ];
                if !images.is_empty() {
                    args.push(serde_json::to_string(images).unwrap_or_default());
                }
                args
            }
            AdminCommand::MonAdd { id, addr } => {
                vec!["mon".into(), "add".into(), id.to_string(), addr.clone()]
            }
            AdminCommand::MonRm { id } => vec!["mon".into(), "rm".into(), id.to_string()],
            AdminCommand::AuthLs => vec!["auth".into(), "ls".into()],
            AdminCommand::AuthGet { entity } => vec!["auth".into(), "get".into(), entity.clone()],
            AdminCommand::AuthAdd {
                entity,
                caps,
                key_sealed,
            } => {
                let mut v = vec!["auth".into(), "add".into(), entity.clone(), caps.clone()];
                v.extend(key_sealed.clone());
                v
            }
            AdminCommand::AuthCaps { entity, caps } => {
                vec!["auth".into(), "caps".into(), entity.clone(), caps.clone()]
            }
            AdminCommand::AuthRm { entity } => vec!["auth".into(), "rm".into(), entity.clone()],
            AdminCommand::AuthApply { sealed } => {
                vec!["auth".into(), "apply".into(), sealed.clone()]
            }
        };
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn every_command_round_trips_through_its_arguments() {
        let all = [
            AdminCommand::Status,
            AdminCommand::PoolLs,
            AdminCommand::PoolCreate {
                name: "rbd".into(),
                size: 3,
                min_size: 2,
                pg_count: 64,
            },
            AdminCommand::PoolCreateEc {
                name: "ec".into(),
                k: 4,
                m: 2,
                min_size: 5,
                matrix: 1,
                stripe_unit_bytes: 4096,
                pg_count: 32,
            },
            AdminCommand::PoolRm { name: "rbd".into() },
            AdminCommand::Osd {
                verb: OsdVerb::Out,
                id: 3,
            },
            AdminCommand::Osd {
                verb: OsdVerb::Down,
                id: 0,
            },
            AdminCommand::OsdAdd {
                weight: 1.5,
                host: None,
            },
            AdminCommand::OsdAdd {
                weight: 1.0,
                host: Some("rack1-h2".into()),
            },
            AdminCommand::SetRatio {
                full: true,
                ratio_ppm: 950_000,
            },
            AdminCommand::SetRatio {
                full: false,
                ratio_ppm: 850_000,
            },
            AdminCommand::CrushGet,
            AdminCommand::CrushSet {
                text: "# begin crush map\n".into(),
            },
            AdminCommand::LockAcquire {
                pool: "rbd".into(),
                image: "vm1".into(),
                client: 0xfeed_beef,
                lease_ms: 15_000,
                holder: "host a pid 7".into(),
                take_over: true,
            },
            AdminCommand::LockRenew {
                pool: "rbd".into(),
                image: "vm1".into(),
                client: 1,
            },
            AdminCommand::LockRelease {
                pool: "rbd".into(),
                image: "vm1".into(),
                client: u64::MAX,
            },
            AdminCommand::SnapChild {
                add: true,
                pool: "rbd".into(),
                image: "golden".into(),
                snap: "base".into(),
                child_pool: "vms".into(),
                child: "vm7".into(),
            },
            AdminCommand::SnapChild {
                add: false,
                pool: "rbd".into(),
                image: "golden".into(),
                snap: "base".into(),
                child_pool: "rbd".into(),
                child: "vm8".into(),
            },
            AdminCommand::SnapTrimmed {
                pool: "rbd".into(),
                image: "vm1".into(),
                removals: 3,
            },
            AdminCommand::Snap {
                verb: SnapVerb::Create,
                pool: "rbd".into(),
                image: "vm1".into(),
                snap: "monday".into(),
                size_bytes: 1 << 30,
            },
            AdminCommand::Snap {
                verb: SnapVerb::Forget,
                pool: "rbd".into(),
                image: "vm1".into(),
                snap: String::new(),
                size_bytes: 0,
            },
            AdminCommand::MonLs,
            AdminCommand::MonMetrics {
                id: 2,
                addr: "10.0.0.2:9283".into(),
                clock: None,
            },
            AdminCommand::MonMetrics {
                id: 2,
                addr: "10.0.0.2:9283".into(),
                clock: Some(ClockSample {
                    skew_ms: -1250,
                    rtt_ms: 3,
                }),
            },
            AdminCommand::MetricsRegister {
                name: "nbd.h1.4242".into(),
                addr: "127.0.0.1:9300".into(),
                images: Vec::new(),
            },
            AdminCommand::MetricsRegister {
                name: "nbd.h1.4242".into(),
                addr: "127.0.0.1:9300".into(),
                images: vec![crate::reply::ImageReport {
                    pool: "rbd".into(),
                    image: "vm1".into(),
                    size_bytes: 1 << 30,
                    used_bytes: Some(4 << 20),
                    read_ops: 3,
                    write_ops: 4,
                    read_bytes: 12288,
                    write_bytes: 16384,
                    read_latency_us: 900,
                    write_latency_us: 1800,
                    served_by: String::new(),
                }],
            },
            AdminCommand::MonAdd {
                id: 3,
                addr: "10.0.0.3:6789".into(),
            },
            AdminCommand::MonRm { id: 1 },
            AdminCommand::AuthLs,
            AdminCommand::AuthGet {
                entity: "client.a".into(),
            },
            AdminCommand::AuthAdd {
                entity: "osd.3".into(),
                caps: String::new(),
                key_sealed: Some("00ff".into()),
            },
            AdminCommand::AuthAdd {
                entity: "client.r".into(),
                caps: "mon allow r; osd allow r pool=default".into(),
                key_sealed: None,
            },
            AdminCommand::AuthCaps {
                entity: "client.r".into(),
                caps: "osd allow rw".into(),
            },
            AdminCommand::AuthRm {
                entity: "client.r".into(),
            },
            AdminCommand::AuthApply {
                sealed: "abcd".into(),
            },
        ];
        for c in all {
            assert_eq!(AdminCommand::parse(&c.to_args()), Ok(c.clone()), "{c:?}");
        }
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        let e = AdminCommand::parse(&args(&["pool", "create", "p", "three", "2", "8"]));
        assert_eq!(e, Err("size must be a number, got 'three'".into()));
        let e = AdminCommand::parse(&args(&["osd", "set-full-ratio", "1.5"])).unwrap_err();
        assert!(e.contains("(0, 1]"), "{e}");
        let e = AdminCommand::parse(&args(&["osd", "add", "-1"])).unwrap_err();
        assert!(e.contains("positive"), "{e}");
        let e = AdminCommand::parse(&args(&[
            "pool",
            "create-ec",
            "e",
            "2",
            "1",
            "3",
            "bogus",
            "4096",
            "8",
        ]))
        .unwrap_err();
        assert!(e.contains("unknown matrix 'bogus'"), "{e}");
        let e = AdminCommand::parse(&args(&["lock", "renew", "rbd", "vm1", "0"])).unwrap_err();
        assert!(e.contains("non-zero hex"), "{e}");
        let e = AdminCommand::parse(&args(&[
            "lock", "acquire", "rbd", "vm1", "a", "10", "h", "keep",
        ]))
        .unwrap_err();
        assert!(e.contains("lease must be"), "{e}");
        let e = AdminCommand::parse(&args(&["auth", "add", "bob", ""])).unwrap_err();
        assert!(e.contains("bad entity name"), "{e}");
        let e =
            AdminCommand::parse(&args(&["auth", "caps", "client.a", "osd allow x"])).unwrap_err();
        assert!(e.contains("bad capabilities"), "{e}");
        let e = AdminCommand::parse(&args(&["frobnicate"])).unwrap_err();
        assert!(e.starts_with("unknown command 'frobnicate'"), "{e}");
    }
}
