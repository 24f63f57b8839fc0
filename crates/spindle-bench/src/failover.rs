//! `spindle bench failover`: how long the cluster cannot change its map after the leader
//! monitor dies, and how long clients take to see the next map.
//!
//! On a fresh embedded cluster with three monitors in a scratch directory (never the
//! user's cluster: monitors are killed), each round:
//! 1. finds the leader, and connects an observer client whose map subscription is on it;
//! 2. SIGKILLs the leader;
//! 3. times the first committed map change (another client retries a change until it
//!    commits: the failover time; target under 3 s with the default timeouts);
//! 4. times until the observer has that epoch (its subscription moved to a live monitor);
//! 5. restarts the killed monitor; the next round starts once every monitor has caught up
//!    (same applied epoch, same leader) and a second has passed.

use crate::common::{print_report, BenchResult};
use clap::Args;
use spindle_client::{Client, ClientConfig};
use spindle_cluster::{self as cluster_cmd, admin, SettingsArgs, Target, UpArgs};
use spindle_mon::Admin;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BenchFailoverArgs {
    /// Scratch directory for the benchmark's own cluster (removed afterwards unless --keep).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// Leader kills to time.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
    /// Seconds of each fio run of the authentication cost comparison (0: skip it).
    #[arg(long, default_value_t = 10)]
    pub auth_seconds: u64,
    /// Clusters of each kind (with and without authentication) in that comparison,
    /// alternated; the better run of each counts.
    #[arg(long, default_value_t = 2)]
    pub auth_rounds: u32,
}

/// The failover target of issue #20 (default timeouts).
const FAILOVER_TARGET_S: f64 = 3.0;

pub fn run(args: BenchFailoverArgs) -> anyhow::Result<()> {
    if args.rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    let mut results = Vec::new();
    crate::common::in_scratch_cluster("failover", args.scratch.clone(), args.keep, |scratch| {
        results = run_in(&args, scratch)?;
        Ok(())
    })?;
    if args.auth_seconds > 0 {
        results.extend(crate::auth_cost::auth_cost(
            args.auth_seconds,
            args.auth_rounds,
            args.keep,
            &progress,
        )?);
    } else {
        progress("not measured: the cost of authentication (--auth-seconds 0)");
    }
    print_report("failover", &results, args.json)
}

/// A progress line on stderr (stdout may be JSON).
fn progress(line: &str) {
    eprintln!("bench failover: {line}");
    let _ = std::io::stderr().flush();
}

/// One map change (the near-full ratio, toggled), retried until it commits: its epoch.
async fn change_map(client: &Client, deadline: Instant) -> anyhow::Result<u64> {
    loop {
        let now = client.map().nearfull_ratio_ppm;
        let ratio = if now == 860_000 { "0.87" } else { "0.86" };
        let r: Result<spindle_mon::RatioSet, _> = client
            .command_as(vec![
                "osd".into(),
                "set-nearfull-ratio".into(),
                ratio.into(),
            ])
            .await;
        match r {
            Ok(r) => return Ok(r.epoch),
            Err(e) if Instant::now() > deadline => {
                anyhow::bail!("no map change committed before the deadline: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run_in(args: &BenchFailoverArgs, scratch: &Path) -> anyhow::Result<Vec<BenchResult>> {
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("bench failover: {msg}");
            let _ = std::io::stderr().flush();
        }
    };
    progress("starting a scratch cluster with 3 monitors");
    cluster_cmd::up_quiet(UpArgs {
        no_auth: false,
        mons: Some(3),
        osds: 3,
        pg_count: 16,
        wait_seconds: 60,
        settings: SettingsArgs::default(),
        target: Target {
            dir: scratch.to_path_buf(),
            mon: None,
            keyring: None,
            entity: "client.admin".into(),
        },
    })?;
    let target = Target {
        dir: scratch.to_path_buf(),
        mon: None,
        keyring: None,
        entity: "client.admin".into(),
    };
    let rt = spindle_cluster::runtime()?;
    rt.block_on(async {
        let all = target.mon_addr()?;
        let mut config = target.client_config()?;
        // Commands retry across the election (NoLeader, broken connections) themselves.
        config.op_timeout_ms = 20_000;
        let client = Client::connect(config.clone()).await?;
        let (mut failover_s, mut seen_s) = (Vec::new(), Vec::new());
        for round in 0..args.rounds {
            // Settle: every monitor up and caught up (the same applied epoch and the same
            // leader in each one's own view), then a second of steady heartbeats: the
            // failover measured is that of a healthy group, not of one whose previous
            // victim is still catching up (that monitor, with an old log, cannot win an
            // election but can start one, and the group then needs another round).
            let deadline = Instant::now() + Duration::from_secs(30);
            let leader = loop {
                let mut views = Vec::new();
                for addr in all.split(',') {
                    let one = async {
                        let mut one = config.clone();
                        one.mon_addr = addr.to_string();
                        let c = Client::connect(one).await.ok()?;
                        admin(&c, Admin::mon_ls()).await.ok()
                    };
                    views.push(one.await);
                }
                let agreed = views.iter().all(|v| {
                    v.as_ref().is_some_and(|v| {
                        views[0].as_ref().is_some_and(|f| {
                            v.leader.is_some() && v.leader == f.leader && v.epoch == f.epoch
                        })
                    })
                });
                if agreed {
                    if let Some(Some(v)) = views.into_iter().next() {
                        let id = v.leader;
                        break v.mons.into_iter().find(|m| Some(m.id) == id);
                    }
                }
                if Instant::now() > deadline {
                    anyhow::bail!("the monitors did not settle within 30 s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(leader) = leader else {
                anyhow::bail!("the leader is not a member");
            };
            // The observer lists the leader first: its subscription is on it.
            let others: Vec<&str> = all.split(',').filter(|a| *a != leader.addr).collect();
            let observer = Client::connect(ClientConfig {
                mon_addr: format!("{},{}", leader.addr, others.join(",")),
                ..config.clone()
            })
            .await?;
            let dir = cluster_cmd::mon_dir(scratch, leader.id);
            let pid = cluster_cmd::read_pid(&dir)
                .ok_or_else(|| anyhow::anyhow!("mon.{} has no pid file", leader.id))?;
            let killed = Instant::now();
            // SAFETY: kill(2) of a monitor of the benchmark's own scratch cluster.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let epoch = change_map(&client, killed + Duration::from_secs(30)).await?;
            let failover = killed.elapsed().as_secs_f64();
            if !observer.wait_for_epoch(epoch, 30_000).await {
                anyhow::bail!("the observer did not see epoch {epoch} within 30 s");
            }
            let seen = killed.elapsed().as_secs_f64();
            progress(&format!(
                "round {}: leader mon.{} killed; map change committed after {:.2} s, seen by a client subscribed to it after {:.2} s",
                round + 1,
                leader.id,
                failover,
                seen
            ));
            failover_s.push(failover);
            seen_s.push(seen);
            drop(observer);
            // Reap it (the benchmark's process is not its parent: it was started with
            // setsid by `spindle up`), then start it again.
            while cluster_cmd::pid_alive(pid) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cluster_cmd::start_mon(scratch, leader.id, false)?;
        }
        let max_failover = failover_s.iter().copied().fold(0.0, f64::max);
        let results = vec![
            BenchResult::lower_is_better(
                "leader failover: SIGKILL to first committed map change (median)",
                "s",
                median(&mut failover_s),
                "target",
                FAILOVER_TARGET_S,
            ),
            BenchResult::lower_is_better(
                "leader failover: SIGKILL to first committed map change (worst)",
                "s",
                max_failover,
                "target",
                FAILOVER_TARGET_S,
            ),
            BenchResult::lower_is_better(
                "SIGKILL to the new epoch at a client subscribed to the dead leader (median)",
                "s",
                median(&mut seen_s),
                "target",
                FAILOVER_TARGET_S,
            ),
        ];
        anyhow::Ok(results)
    })
}
