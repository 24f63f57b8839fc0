//! Cluster commands: `up`, `down`, `status`, `pool`, `osd`, and the object commands
//! `put`, `get`, `rm`, `ls`, `stat`. All find the embedded cluster through `--dir` /
//! `SPINDLE_DIR` (default `./spindle-data`), or a monitor through `--mon`.
//!
//! Starting and stopping the embedded cluster's processes is `spindle-cluster`'s job.

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;
use spindle_cluster::{
    admin, cluster_osd_count, osd_dir, read_cluster_json, read_pid, runtime, start_osd, stop_pid,
    write_atomic, Target,
};
use spindle_mon::reply::pg_summary;
use spindle_mon::{Admin, OsdVerb, RatioSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct StatusArgs {
    #[arg(long)]
    pub json: bool,
    /// Show it again every this many seconds (`--watch` alone: 2) until interrupted.
    #[arg(long, num_args = 0..=1, default_missing_value = "2", value_name = "SECONDS")]
    pub watch: Option<u64>,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args)]
pub struct HealthArgs {
    /// The report as JSON (`status`, and `checks` with `name`, `severity`, `message`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `spindle health`: `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`, then one line per check
/// (exit status 0 whatever the health, as `ceph health`; scripts read the first word or
/// the JSON).
pub fn health(args: HealthArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = args.target.client().await?;
        let s = admin(&client, Admin::status()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&s.health)?);
        } else {
            println!("{}", s.health.status);
            for c in &s.health.checks {
                println!("    {} {}: {}", c.severity, c.name, c.message);
            }
        }
        anyhow::Ok(())
    })
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool: replicated (`--size`), or erasure-coded (`--erasure k=4,m=2`).
    Create {
        name: String,
        #[arg(long, default_value_t = 3)]
        size: u32,
        /// Copies (replicated) or shards (erasure-coded) that must be up for writes
        /// (default: 2 for size >= 3, else 1; k + 1 for erasure-coded pools).
        #[arg(long)]
        min_size: Option<u32>,
        #[arg(long, default_value_t = 64)]
        pg_count: u32,
        /// Erasure-code profile: `k=K,m=M[,matrix=isal-rs|isal-cauchy|jerasure-van]
        /// [,stripe-unit=BYTES][,min-size=N]` (Reed-Solomon; defaults isal-rs, 4096,
        /// k + 1). The client encodes; shard i lives on the i-th daemon of CRUSH's
        /// `indep` result.
        #[arg(long, conflicts_with = "size")]
        erasure: Option<String>,
    },
    /// List pools.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool (its objects become unreachable).
    Rm { name: String },
}

#[derive(Subcommand)]
pub enum OsdCommand {
    /// List storage daemons.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Mark a daemon out: its data will be placed elsewhere.
    Out { id: u32 },
    /// Mark a daemon in.
    In { id: u32 },
    /// Stop a daemon of the embedded cluster (SIGTERM).
    Stop { id: u32 },
    /// Start a daemon of the embedded cluster.
    Start { id: u32 },
    /// Add a storage daemon to the embedded cluster and start it; placement groups
    /// rebalance onto it in proportion to its weight.
    Add {
        /// CRUSH weight (1.0 = the weight of every daemon `spindle up` created).
        #[arg(long, default_value_t = 1.0)]
        weight: f64,
        /// The host (CRUSH failure domain) the daemon is on; default: a host of its own.
        #[arg(long)]
        host: Option<String>,
        /// Only add it to the map (a cluster from a configuration file: add the daemon to
        /// the file and run `spindle host start` on its host).
        #[arg(long)]
        no_start: bool,
    },
    /// Run a storage daemon in the foreground (what `spindle up` starts).
    Run(crate::daemon::OsdRunArgs),
    /// Used/size ratio of a daemon's file system above which it is full: clients and
    /// daemons refuse new writes to pools on it (deletes still work). Default 0.95.
    SetFullRatio { ratio: f64 },
    /// Ratio above which a daemon is nearfull (a health warning). Default 0.85.
    SetNearfullRatio { ratio: f64 },
}

#[derive(Args)]
pub struct ObjArgs {
    /// Pool name.
    #[arg(long, default_value = "default")]
    pub pool: String,
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    runtime()?.block_on(async {
        let client = args.target.client().await?;
        let Some(every_s) = args.watch else {
            return print_status(&client, args.json).await;
        };
        let every = Duration::from_secs(every_s.max(1));
        let terminal = std::io::stdout().is_terminal();
        loop {
            if terminal && !args.json {
                // Clear the screen and start at the top.
                print!("\x1b[2J\x1b[H");
            }
            match print_status(&client, args.json).await {
                Ok(()) => {}
                // A failover or a restart: say so and keep watching.
                Err(e) => println!("status unavailable: {e:#}"),
            }
            if !args.json {
                println!("(every {} s; Ctrl-C to stop)", every.as_secs());
            }
            tokio::time::sleep(every).await;
        }
    })
}

async fn print_status(client: &spindle_client::Client, json: bool) -> anyhow::Result<()> {
    {
        let s = admin(client, Admin::status()).await?;
        if json {
            println!("{}", serde_json::to_string(&s)?);
            return Ok(());
        }
        println!("cluster {}  epoch {}", s.cluster_id, s.epoch);
        println!("health: {}", s.health.status);
        for c in &s.health.checks {
            println!("    {} {}: {}", c.severity, c.name, c.message);
        }
        let osds = &s.osds;
        let up = osds.iter().filter(|o| o.up).count();
        let inn = osds.iter().filter(|o| o.in_cluster).count();
        if let Ok(m) = admin(client, Admin::mon_ls()).await {
            let voters = m.mons.iter().filter(|x| x.voter).count();
            println!(
                "mons: {voters} ({}, term {})",
                m.leader
                    .map_or("no leader".to_string(), |l| format!("leader mon.{l}")),
                m.term
            );
        }
        println!("osds: {} total, {up} up, {inn} in", osds.len());
        for o in osds {
            let (Some(total), Some(used)) = (o.total_bytes, o.used_bytes) else {
                continue;
            };
            let flag = if !o.healthy {
                "  UNHEALTHY"
            } else if o.full {
                "  full"
            } else if o.nearfull {
                "  nearfull"
            } else {
                ""
            };
            println!(
                "    osd.{}: {:.1} MiB used, {:.1} MiB available of {:.1} MiB ({:.0}%){flag}",
                o.id,
                used as f64 / 1048576.0,
                o.avail_bytes.unwrap_or(0) as f64 / 1048576.0,
                total as f64 / 1048576.0,
                if total > 0 {
                    used as f64 * 100.0 / total as f64
                } else {
                    0.0
                }
            );
        }
        println!("pgs: {}   objects: {}", pg_summary(&s.pgs), s.objects);
        let rec = &s.recovery;
        if rec.objects_left > 0 || rec.bytes_per_sec > 0.0 {
            println!(
                "recovery: {} object copies ({:.1} MiB) left, {:.1} MiB/s, {:.0} objects/s",
                rec.objects_left,
                rec.bytes_left as f64 / 1048576.0,
                rec.bytes_per_sec / 1048576.0,
                rec.objects_per_sec
            );
        }
        for p in &s.pools {
            println!(
                "pool {} '{}': {} copies (min {}), {} pgs, {} objects, pgs {}",
                p.id,
                p.name,
                p.size,
                p.min_size,
                p.pg_count,
                p.objects,
                pg_summary(&p.pgs)
            );
            let left = p.recovery.objects_left;
            if left > 0 {
                println!(
                    "    recovering: {left} object copies, {:.1} MiB left",
                    p.recovery.bytes_left as f64 / 1048576.0
                );
            }
        }
        let endpoints = s.mon_metrics_addrs.len()
            + s.service_metrics_addrs.len()
            + s.osds.iter().filter(|o| o.metrics_addr.is_some()).count();
        // The monitor that answered leads: its dashboard shows the cluster.
        if let Some(addr) = m_leader_metrics(client, &s).await {
            println!("dashboard: http://{addr}/   metrics: http://{addr}/metrics ({endpoints} endpoints in `spindle status --json`)");
        }
        Ok(())
    }
}

/// The leader monitor's metrics address (it serves the dashboard), from `status`.
async fn m_leader_metrics(
    client: &spindle_client::Client,
    s: &spindle_mon::Status,
) -> Option<String> {
    let leader = admin(client, Admin::mon_ls()).await.ok()?.leader?;
    s.mon_metrics_addrs.get(&leader).cloned()
}

pub fn pool(command: PoolCommand, target: Target) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = target.client().await?;
        match command {
            PoolCommand::Create {
                name,
                erasure: Some(profile),
                min_size,
                pg_count,
                ..
            } => {
                let p = spindle_cluster::parse_erasure_profile(&profile, min_size)?;
                let r = spindle_cluster::create_ec_pool(&client, &name, &p, pg_count).await?;
                println!(
                    "created erasure-coded pool '{name}' (k={}, m={}, {}, stripe unit {} B, \
                     min_size {}; id {}, epoch {})",
                    p.k, p.m, p.matrix, p.stripe_unit, p.min_size, r.id, r.epoch
                );
            }
            PoolCommand::Create {
                name,
                size,
                min_size,
                pg_count,
                erasure: None,
            } => {
                let min_size = min_size.unwrap_or(if size >= 3 { 2 } else { 1 });
                let r = admin(&client, Admin::pool_create(&name, size, min_size, pg_count)).await?;
                println!("created pool '{name}' (id {}, epoch {})", r.id, r.epoch);
            }
            PoolCommand::Ls { json } => {
                let r = admin(&client, Admin::pool_ls()).await?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    for p in &r {
                        let kind = match &p.erasure {
                            Some(e) => format!(
                                "erasure k={} m={} {} su={}",
                                e.k,
                                e.m,
                                e.matrix.as_deref().unwrap_or("?"),
                                e.stripe_unit
                            ),
                            None => "replicated".to_string(),
                        };
                        println!(
                            "{}\t{}\t{kind}\tsize {}\tmin_size {}\tpgs {}",
                            p.id, p.name, p.size, p.min_size, p.pg_count
                        );
                    }
                }
            }
            PoolCommand::Rm { name } => {
                admin(&client, Admin::pool_rm(&name)).await?;
                println!("removed pool '{name}'");
            }
        }
        anyhow::Ok(())
    })
}

/// A parsed `--erasure` profile.
pub fn osd(command: OsdCommand, target: Target) -> anyhow::Result<()> {
    match command {
        OsdCommand::Run(args) => crate::daemon::osd_run(args),
        OsdCommand::Stop { id } => {
            let d = osd_dir(&target.dir, id);
            let pid = read_pid(&d)
                .ok_or_else(|| anyhow!("osd.{id} has no pid file in {}", d.display()))?;
            stop_pid(pid, &format!("osd.{id}"))?;
            println!("stopped osd.{id}");
            Ok(())
        }
        OsdCommand::Add {
            weight,
            host,
            no_start,
        } => {
            let dir = target.dir.clone();
            let identity = target.identity()?;
            let (id, key) = runtime()?.block_on(async {
                let client = target.client().await?;
                let req = match &host {
                    Some(h) => Admin::osd_add_on(weight, h),
                    None => Admin::osd_add(weight),
                };
                let r = admin(&client, req).await?;
                // With authentication, the new daemon's key.
                let key = match &identity {
                    None => None,
                    Some(me) => {
                        let key = spindle_proto::auth::Key::random();
                        let sealed = seal_hex(&me.key, &key);
                        admin(
                            &client,
                            Admin::auth_add(&format!("osd.{}", r.osd), "", Some(sealed)),
                        )
                        .await?;
                        Some(key)
                    }
                };
                anyhow::Ok((r.osd, key))
            })?;
            if let Some(key) = &key {
                let k = spindle_proto::auth::Keyring {
                    entries: vec![spindle_proto::auth::KeyringEntry {
                        entity: format!("osd.{id}"),
                        key: key.clone(),
                        caps: None,
                    }],
                };
                if no_start {
                    // Its directory is on another host: the operator puts the key there.
                    println!(
                        "osd.{id}'s keyring (save it as `keyring`, mode 0600, in its directory):"
                    );
                    print!("{}", k.to_text());
                } else {
                    let d = osd_dir(&dir, id);
                    std::fs::create_dir_all(&d)?;
                    k.save(&d.join(spindle_cluster::KEYRING))?;
                }
            }
            let on = host
                .as_deref()
                .map(|h| format!(" on host {h}"))
                .unwrap_or_default();
            if no_start {
                println!("added osd.{id} (weight {weight}){on}; start it on its host");
                return Ok(());
            }
            let count = cluster_osd_count(&dir)?;
            let mon = target.mon_addr()?;
            if id + 1 > count {
                let mut v = read_cluster_json(&dir)?;
                v["osds"] = serde_json::json!(id + 1);
                write_atomic(&dir.join("cluster.json"), &v.to_string())?;
            }
            let pid = start_osd(&dir, id, &mon)?;
            println!("added osd.{id} (weight {weight}, pid {pid}){on}; data is rebalancing (see `spindle status`)");
            Ok(())
        }
        OsdCommand::Start { id } => {
            let mon = target.mon_addr()?;
            let pid = start_osd(&target.dir, id, &mon)?;
            println!("started osd.{id} (pid {pid})");
            Ok(())
        }
        OsdCommand::Ls { json } => runtime()?.block_on(async {
            let client = target.client().await?;
            let s = admin(&client, Admin::status()).await?;
            if json {
                println!("{}", serde_json::to_string(&s.osds)?);
            } else {
                for o in &s.osds {
                    println!(
                        "osd.{}\t{}\t{}\t{}\tpid {}\thost {}",
                        o.id,
                        if o.up { "up" } else { "down" },
                        if o.in_cluster { "in" } else { "out" },
                        o.addr,
                        o.pid,
                        o.host.as_deref().unwrap_or("-")
                    );
                }
            }
            anyhow::Ok(())
        }),
        OsdCommand::SetFullRatio { ratio } | OsdCommand::SetNearfullRatio { ratio } => {
            let verb = if matches!(command, OsdCommand::SetFullRatio { .. }) {
                "set-full-ratio"
            } else {
                "set-nearfull-ratio"
            };
            runtime()?.block_on(async {
                let client = target.client().await?;
                // The ratio goes as given: the monitor checks it is in (0, 1].
                let r: RatioSet = client
                    .command_as(vec!["osd".into(), verb.into(), ratio.to_string()])
                    .await?;
                println!("{verb} {} (epoch {})", r.ratio, r.epoch);
                anyhow::Ok(())
            })
        }
        OsdCommand::Out { id } | OsdCommand::In { id } => {
            let verb = if matches!(command, OsdCommand::Out { .. }) {
                OsdVerb::Out
            } else {
                OsdVerb::In
            };
            runtime()?.block_on(async {
                let client = target.client().await?;
                let r = admin(&client, Admin::osd(verb, id)).await?;
                println!("marked osd.{id} {} (epoch {})", verb.as_str(), r.epoch);
                anyhow::Ok(())
            })
        }
    }
}

#[derive(Subcommand)]
pub enum HostCommand {
    /// Start this host's monitors and storage daemons from the cluster configuration
    /// file (their directories are created the first time).
    Start {
        #[arg(long)]
        config: PathBuf,
        /// This host's name in the file (default: the machine's host name).
        #[arg(long)]
        host: Option<String>,
    },
    /// Stop this host's daemons.
    Stop {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        host: Option<String>,
    },
    /// Check a configuration file and print the cluster it describes.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Make the keyring of a new cluster (every entity's key, mode 0600) at OUT; name it
    /// in the configuration (`keyring = "OUT"`) and copy it to every host.
    Keygen {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn host(command: HostCommand) -> anyhow::Result<()> {
    use spindle_cluster::config::{host_start, host_stop, this_host, ClusterConfig};
    match command {
        HostCommand::Start { config, host } => {
            let c = ClusterConfig::load(&config)?;
            host_start(&c, &host.unwrap_or_else(this_host), false)
        }
        HostCommand::Stop { config, host } => {
            let c = ClusterConfig::load(&config)?;
            host_stop(&c, &host.unwrap_or_else(this_host))
        }
        HostCommand::Keygen { config, out } => {
            let c = ClusterConfig::load(&config)?;
            spindle_cluster::config::keygen(&c, &out)?;
            println!(
                "wrote the keys of client.admin, mon. and {} storage daemons to {} (mode 0600)",
                c.osd.len(),
                out.display()
            );
            Ok(())
        }
        HostCommand::Check { config } => {
            let c = ClusterConfig::load(&config)?;
            let spec = c.init_spec();
            println!(
                "cluster {}: {} monitors, {} storage daemons",
                c.cluster_id,
                c.mon.len(),
                c.osd.len()
            );
            for h in c.hosts() {
                let mons: Vec<String> = c
                    .mon
                    .iter()
                    .filter(|m| m.host == h)
                    .map(|m| format!("mon.{}", m.id))
                    .collect();
                let osds: Vec<String> = c
                    .osd
                    .iter()
                    .filter(|o| o.host == h)
                    .map(|o| format!("osd.{}", o.id))
                    .collect();
                println!(
                    "  host {h}: {}",
                    mons.into_iter().chain(osds).collect::<Vec<_>>().join(" ")
                );
            }
            if let Some((name, size, min_size, pgs)) = spec.default_pool {
                println!("pool '{name}': {size} copies (min {min_size}) on distinct hosts, {pgs} placement groups");
            }
            println!("clients: --mon {}", c.mon_addrs());
            Ok(())
        }
    }
}

/// Hex of `key` sealed under `under` (how keys travel in `auth` commands).
fn seal_hex(under: &spindle_proto::auth::Key, key: &spindle_proto::auth::Key) -> String {
    spindle_proto::auth::seal(under, spindle_mon::AUTH_KEY_PURPOSE, &key.0)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Opens a key an `auth` answer sealed for us.
fn open_hex(
    under: &spindle_proto::auth::Key,
    sealed: &str,
) -> anyhow::Result<spindle_proto::auth::Key> {
    let bytes: Vec<u8> = (0..sealed.len() / 2)
        .map(|i| u8::from_str_radix(&sealed[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .context("bad sealed key from the monitor")?;
    let plain = spindle_proto::auth::open(under, spindle_mon::AUTH_KEY_PURPOSE, &bytes)?;
    Ok(spindle_proto::auth::Key(plain.try_into().map_err(
        |_| anyhow!("the monitor sent a key of the wrong length"),
    )?))
}

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Entities and their capabilities (keys are not shown).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// An entity's key as a keyring (to stdout, or to --out with mode 0600).
    Get {
        entity: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Add an entity with a new key and capabilities given as Ceph-style pairs, e.g.
    /// `spindle auth add client.backup mon 'allow r' osd 'allow r pool=default images'`.
    /// Grants: `allow r|rw|* [pool=NAME] [images]` (`images`: also image headers and
    /// data objects; `*` includes them and scrub). Prints its keyring (or writes --out).
    Add {
        entity: String,
        caps: Vec<String>,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Replace an entity's capabilities (storage daemons apply them when its ticket is
    /// next renewed, within 5 minutes; monitors at once).
    Caps { entity: String, caps: Vec<String> },
    /// Remove an entity: its new connections and ticket renewals are refused (connections
    /// it already has open are not cut; restart the daemons to cut them at once).
    Rm { entity: String },
}

pub fn auth(command: AuthCommand, target: Target) -> anyhow::Result<()> {
    use spindle_proto::auth::{Caps, Keyring, KeyringEntry};
    let me = target.identity()?.ok_or_else(|| {
        anyhow!(
            "no keyring (--keyring, or {}): this cluster runs without authentication, or pass its keyring",
            target.dir.join(spindle_cluster::KEYRING).display()
        )
    })?;
    let write_or_print = |entity: &str,
                          key: spindle_proto::auth::Key,
                          caps: &str,
                          out: &Option<PathBuf>|
     -> anyhow::Result<()> {
        let k = Keyring {
            entries: vec![KeyringEntry {
                entity: entity.to_string(),
                key,
                caps: (!caps.is_empty()).then(|| caps.to_string()),
            }],
        };
        match out {
            Some(p) => {
                k.save(p)?;
                println!("wrote {entity}'s key to {} (mode 0600)", p.display());
            }
            None => print!("{}", k.to_text()),
        }
        Ok(())
    };
    runtime()?.block_on(async {
        let client = target.client().await?;
        match command {
            AuthCommand::Ls { json } => {
                let l = admin(&client, Admin::auth_ls()).await?;
                if json {
                    println!("{}", serde_json::to_string(&l)?);
                } else {
                    for e in &l {
                        println!(
                            "{}\t{}",
                            e.entity,
                            if e.caps.is_empty() { "-" } else { &e.caps }
                        );
                    }
                }
            }
            AuthCommand::Get { entity, out } => {
                let e = admin(&client, Admin::auth_get(&entity)).await?;
                let sealed = e
                    .key_sealed
                    .ok_or_else(|| anyhow!("the monitor sent no key"))?;
                write_or_print(&entity, open_hex(&me.key, &sealed)?, &e.caps, &out)?;
            }
            AuthCommand::Add { entity, caps, out } => {
                let caps = Caps::from_pairs(&caps)?.to_text();
                let e = admin(&client, Admin::auth_add(&entity, &caps, None)).await?;
                let sealed = e
                    .key_sealed
                    .ok_or_else(|| anyhow!("the monitor sent no key"))?;
                write_or_print(&entity, open_hex(&me.key, &sealed)?, &e.caps, &out)?;
            }
            AuthCommand::Caps { entity, caps } => {
                let caps = Caps::from_pairs(&caps)?.to_text();
                let e = admin(&client, Admin::auth_caps(&entity, &caps)).await?;
                println!("{}: {}", e.entity, e.caps);
            }
            AuthCommand::Rm { entity } => {
                admin(&client, Admin::auth_rm(&entity)).await?;
                println!("removed {entity}");
            }
        }
        anyhow::Ok(())
    })
}

#[derive(Subcommand)]
pub enum MonCommand {
    /// The monitors: id, address, voter or learner, the leader and the term.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Add a monitor. Embedded cluster (`--dir`): starts a new one on a free local port
    /// and adds it. Otherwise give `--id` and `--addr` of a monitor already started with
    /// `spindle mon run --dir D --id ID --listen ADDR`.
    Add {
        #[arg(long)]
        id: Option<u64>,
        #[arg(long)]
        addr: Option<String>,
    },
    /// Remove monitor ID from the group (embedded cluster: also stops it and moves its
    /// directory aside).
    Rm { id: u64 },
    /// Stop monitor ID of the embedded cluster (it stays a member: `spindle up` or
    /// `spindle mon start` brings it back).
    Stop { id: u64 },
    /// Start monitor ID of the embedded cluster.
    Start { id: u64 },
    /// Run a monitor in the foreground (what `spindle up` starts).
    Run(crate::daemon::MonRunArgs),
}

fn print_mons(l: &spindle_mon::MonList) {
    for m in &l.mons {
        println!(
            "mon.{}	{}	{}{}",
            m.id,
            m.addr,
            if m.voter { "voter" } else { "learner" },
            if l.leader == Some(m.id) {
                "\tleader"
            } else {
                ""
            }
        );
    }
    println!(
        "term {}, epoch {} (as seen by mon.{})",
        l.term, l.epoch, l.answered_by
    );
}

pub fn mon(command: MonCommand, target: Target) -> anyhow::Result<()> {
    match command {
        MonCommand::Run(args) => crate::daemon::mon_run(args),
        MonCommand::Ls { json } => runtime()?.block_on(async {
            let client = target.client().await?;
            let l = admin(&client, Admin::mon_ls()).await?;
            if json {
                println!("{}", serde_json::to_string(&l)?);
            } else {
                print_mons(&l);
            }
            anyhow::Ok(())
        }),
        MonCommand::Add { id, addr } => {
            let (id, addr) = match (id, addr) {
                (Some(id), Some(addr)) => (id, addr),
                (None, None) => {
                    // Embedded: the next id, a free port, a new directory.
                    let dir = &target.dir;
                    let id = spindle_cluster::mon_ids(dir)
                        .into_iter()
                        .max()
                        .map_or(0, |m| m + 1);
                    let addr = spindle_cluster::free_local_addrs(1)?
                        .pop()
                        .ok_or_else(|| anyhow!("no free port"))?;
                    let d = spindle_cluster::mon_dir(dir, id);
                    std::fs::create_dir_all(&d)?;
                    write_atomic(&d.join("addr"), &addr)?;
                    let pid = spindle_cluster::start_mon(dir, id, true)?;
                    println!("started mon.{id} at {addr} (pid {pid}); adding it");
                    (id, addr)
                }
                _ => bail!("give both --id and --addr, or neither (embedded cluster)"),
            };
            runtime()?.block_on(async {
                let client = target.client().await?;
                let l = admin(&client, Admin::mon_add(id, &addr)).await?;
                println!("mon.{id} at {addr} is a member");
                print_mons(&l);
                anyhow::Ok(())
            })
        }
        MonCommand::Rm { id } => {
            runtime()?.block_on(async {
                let client = target.client().await?;
                let l = admin(&client, Admin::mon_rm(id)).await?;
                println!("removed mon.{id}");
                print_mons(&l);
                anyhow::Ok(())
            })?;
            let d = spindle_cluster::mon_dir(&target.dir, id);
            if target.mon.is_none() && d.exists() {
                if let Some(pid) = read_pid(&d) {
                    stop_pid(pid, &format!("mon.{id}"))?;
                }
                let aside = target.dir.join(format!("removed-mon.{id}"));
                let _ = std::fs::remove_dir_all(&aside);
                std::fs::rename(&d, &aside)?;
                println!("stopped mon.{id}; its directory is now {}", aside.display());
            }
            Ok(())
        }
        MonCommand::Stop { id } => {
            let d = spindle_cluster::mon_dir(&target.dir, id);
            let pid = read_pid(&d)
                .ok_or_else(|| anyhow!("mon.{id} has no pid file in {}", d.display()))?;
            stop_pid(pid, &format!("mon.{id}"))?;
            println!("stopped mon.{id}");
            Ok(())
        }
        MonCommand::Start { id } => {
            let pid = spindle_cluster::start_mon(&target.dir, id, false)?;
            println!("started mon.{id} (pid {pid})");
            Ok(())
        }
    }
}

/// Objects from this size on show a spinner while written (on a terminal).
const LARGE_OBJECT_BYTES: usize = 4 << 20;

/// `, 12.3 MB/s` for large transfers, else nothing.
fn rate_note(len: usize, started: Instant) -> String {
    let secs = started.elapsed().as_secs_f64();
    if len < LARGE_OBJECT_BYTES || secs <= 0.0 {
        return String::new();
    }
    format!(" in {secs:.2} s, {:.1} MB/s", len as f64 / secs / 1e6)
}

pub fn put(args: ObjArgs, target: Target, name: String, file: PathBuf) -> anyhow::Result<()> {
    let data = if file.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
        v
    } else {
        std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?
    };
    runtime()?.block_on(async {
        let client = target.client().await?;
        let len = data.len();
        let started = Instant::now();
        let v = {
            let _spin = (len >= LARGE_OBJECT_BYTES)
                .then(|| crate::progress::Spinner::new(format!("writing {name} ({len} bytes)")));
            client.write_full(&args.pool, &name, data).await?
        };
        println!(
            "wrote {name} ({len} bytes, version {}.{}){}",
            v.epoch,
            v.seq,
            rate_note(len, started)
        );
        anyhow::Ok(())
    })
}

pub fn get(args: ObjArgs, target: Target, name: String, file: PathBuf) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = target.client().await?;
        let data = {
            let _spin = crate::progress::Spinner::new(format!("reading {name}"));
            client.read_full(&args.pool, &name).await?
        };
        if file.as_os_str() == "-" {
            std::io::Write::write_all(&mut std::io::stdout(), &data)?;
        } else {
            std::fs::write(&file, &data).with_context(|| format!("writing {}", file.display()))?;
        }
        anyhow::Ok(())
    })
}

pub fn rm(args: ObjArgs, target: Target, name: String) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        target.client().await?.delete(&args.pool, &name).await?;
        anyhow::Ok(())
    })
}

pub fn stat(args: ObjArgs, target: Target, name: String, json: bool) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let s = target.client().await?.stat(&args.pool, &name).await?;
        if json {
            println!(
                "{}",
                serde_json::json!({"name": name, "size_bytes": s.size_bytes,
                    "version": format!("{}.{}", s.version.epoch, s.version.seq)})
            );
        } else {
            println!(
                "{name}\t{} bytes\tversion {}.{}",
                s.size_bytes, s.version.epoch, s.version.seq
            );
        }
        anyhow::Ok(())
    })
}

pub fn ls(args: ObjArgs, target: Target, json: bool) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let list = target.client().await?.list(&args.pool).await?;
        if json {
            let v: Vec<Value> = list
                .iter()
                .map(|l| serde_json::json!({"name": l.name, "size_bytes": l.size_bytes}))
                .collect();
            println!("{}", Value::Array(v));
        } else {
            for l in list {
                println!("{}\t{}", l.name, l.size_bytes);
            }
        }
        anyhow::Ok(())
    })
}

#[derive(Args)]
pub struct ScrubArgs {
    /// Pool to scrub (default: every pool).
    pub pool: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `spindle scrub [POOL]`: compare every copy now and repair bad ones. Objects with no
/// intact copy are listed (`pool/pg name`) and make the command fail (exit status 1).
pub fn scrub(args: ScrubArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = args.target.client().await?;
        let pools: Vec<String> = match &args.pool {
            Some(p) => vec![p.clone()],
            None => client
                .map()
                .pools
                .values()
                .map(|p| p.name.clone())
                .collect(),
        };
        let mut out = Vec::new();
        let mut damaged_total = 0;
        for pool in pools {
            let started = Instant::now();
            let s = client
                .scrub_with_progress(
                    &pool,
                    crate::progress::bar(
                        format!("scrubbing {pool}:"),
                        crate::progress::Unit::Groups,
                    ),
                )
                .await?;
            damaged_total += s.damaged.len();
            if !args.json {
                println!(
                    "pool '{pool}': {} pgs, {} objects scrubbed, {} bad copies found, {} repaired, \
                     {} objects with no intact copy ({:.1} s)",
                    s.pgs,
                    s.objects,
                    s.inconsistent,
                    s.repaired,
                    s.damaged.len(),
                    started.elapsed().as_secs_f64()
                );
                for d in &s.damaged {
                    println!("no intact copy: {pool}/{} {}", d.pg, d.name);
                }
            }
            let damaged: Vec<Value> = s
                .damaged
                .iter()
                .map(|d| serde_json::json!({"pg": d.pg.to_string(), "name": d.name}))
                .collect();
            out.push(
                serde_json::json!({"pool": pool, "pgs": s.pgs, "objects": s.objects,
                "inconsistent": s.inconsistent, "repaired": s.repaired,
                "damaged_objects": s.damaged.len(), "damaged": damaged}),
            );
        }
        if args.json {
            println!("{}", Value::Array(out));
        }
        if damaged_total > 0 {
            bail!(
                "{damaged_total} object(s) have no intact copy and cannot be repaired; \
                 overwrite or delete them ('spindle status' names their placement groups)"
            );
        }
        anyhow::Ok(())
    })
}
