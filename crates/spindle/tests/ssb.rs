//! SSB Q3.3 at scale factor 1 (issue #23) on a real cluster: the lineorder columns loaded
//! into a replicated and an erasure-coded pool, the query run every way (pulled, filter
//! offloaded, fully offloaded; interpreter and JIT; with and without the daemons' data
//! cache; shard-local on the erasure-coded pool), each answer equal to DuckDB's on Parquet
//! files of the same data (DuckDB from the Python package `scripts/setup.sh` installs in
//! `.venv`), then again with a daemon down (its shards' parts run on decoded copies).

mod common;

use common::{counter, run_ok, spindle, wait_counter, Cluster};
use spindle_bench::ssb::{self, Config, Names, Programs, SsbData};

const EC_POOL: &str = "ssbec";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q33_answers_equal_duckdb_in_every_configuration_on_both_pools_and_with_a_daemon_down() {
    let data = SsbData::generate(1, 42);
    let reference = ssb::q33_reference(&data);
    let dir = common::unique_dir("ssb-parquet");
    let duck = ssb::q33_duckdb(&data, &dir, 1).expect("DuckDB (scripts/setup.sh installs it)");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(duck.rows, reference, "DuckDB and the generator's own sums");
    assert!(duck.rows.len() >= 20, "{:?}", duck.rows);

    // A whole CPU per daemon for programs, as `spindle bench ssb` gives them.
    let c = Cluster::start_with("ssb", 3, 16, &["--exec-cpu-percent", "100"]);
    common::ok(
        &c,
        &[
            "pool",
            "create",
            EC_POOL,
            "--pg-count",
            "8",
            "--erasure",
            "k=2,m=1",
        ],
    );
    c.wait_clean();
    let client = c.client().await;
    let programs = Programs::compile().expect("clang compiles the SSB programs");
    let names = Names {
        prefix: "ssb".into(),
        sf: 1,
    };
    for pool in ["default", EC_POOL] {
        ssb::load(&client, pool, &names, &data, |_| {})
            .await
            .unwrap_or_else(|e| panic!("loading into {pool}: {e}"));
    }
    // The columns of a row group share a placement group (their placement key).
    let map = client.map();
    for pool in ["default", EC_POOL] {
        let pg_count = map.pool_by_name(pool).unwrap().pg_count;
        let pgs: std::collections::BTreeSet<u32> = ssb::COLUMNS
            .iter()
            .map(|col| spindle_map::object_pg(&names.column(3, col), pg_count))
            .collect();
        assert_eq!(pgs.len(), 1, "{pool}: {pgs:?}");
    }

    let rows = data.rows();
    let run_all = |phase: &'static str| {
        let (client, names, programs, duck) = (&client, &names, &programs, &duck);
        async move {
            for pool in ["default", EC_POOL] {
                // Shard-local on the erasure-coded pool.
                for config in Config::all(pool == EC_POOL) {
                    let r = ssb::q33(client, pool, names, config, programs, 8)
                        .await
                        .unwrap_or_else(|e| panic!("{phase} {pool} {}: {e}", config.label()));
                    assert_eq!(
                        r.rows,
                        duck.rows,
                        "{phase} {pool} {}: the answer differs from DuckDB's",
                        config.label()
                    );
                    // Offloaded runs return rows or sums, never the columns.
                    if config != Config::Pull {
                        assert!(
                            r.bytes_received < 1 << 20,
                            "{phase} {pool} {}: {} bytes received",
                            config.label(),
                            r.bytes_received
                        );
                    } else {
                        assert!(r.bytes_received as usize >= rows * 16);
                    }
                }
            }
        }
    };
    // On the erasure-coded pool the offloaded runs are shard-local: each data shard's
    // daemon runs the program on its own stripe units.
    let shard_runs = counter(&c, "exec_shard_runs");
    run_all("all up").await;
    let groups = data.row_groups() as u64;
    wait_counter(&c, "exec_shard_runs", shard_runs + 8 * groups * 2).await;
    c.kill_osd(1);
    c.wait_osd_up(1, false);
    // With osd.1 down, the parts of its data shards run on decoded copies.
    let decoded = counter(&c, "exec_shard_decoded");
    run_all("osd.1 down").await;
    wait_counter(&c, "exec_shard_decoded", decoded + 1).await;
    let _ = run_ok(spindle().args(["down", "--dir"]).arg(&c.dir));
}
