//! Pushdown programs run by the storage daemons (issue #23), on a real cluster: programs
//! compiled from C by clang, loaded with `spindle prog load`, run with `spindle exec` and
//! the client library on replicated and erasure-coded pools, over several objects of one
//! placement group, with the data cache (never stale after a write), with a daemon down,
//! and hostile programs refused or stopped while the daemons keep serving.

mod common;

use common::{run_ok, spindle, Cluster};
use spindle_client::{ClientError, ExecOptions, ProgramCode};

const POOL: &str = "default";
const EC_POOL: &str = "ecpool";

const SUM: &str = r#"
#include "spindle_prog.h"
/* Sum of the object as u32 values, emitted; returns their count. */
uint64_t spindle_main(const struct spindle_input *in) {
    const uint32_t *v = (const uint32_t *)in->data;
    uint64_t n = in->data_len / 4, s = 0;
    for (uint64_t i = 0; i < n; i++) s += v[i];
    spindle_emit(&s, sizeof s);
    return n;
}
"#;

/// Sum over rows of a[i] * b[i] where the first object is a and the second b (u32 each),
/// counting only rows whose a is at least the u64 argument.
const DOT: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    if (in->n_objects != 2 || in->args_len < 8) return ~0ULL;
    const uint32_t *a = (const uint32_t *)in->objects[0].data;
    const uint32_t *b = (const uint32_t *)in->objects[1].data;
    uint64_t n = in->objects[0].len / 4, m = in->objects[1].len / 4;
    if (m < n) n = m;
    uint64_t min = *(const uint64_t *)in->args, s = 0;
    for (uint64_t i = 0; i < n; i++)
        if (a[i] >= min) s += (uint64_t)a[i] * b[i];
    spindle_emit(&s, sizeof s);
    return n;
}
"#;

const LOOP: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    volatile uint64_t x = 0;
    for (;;) x += in->data_len;
    return x;
}
"#;

const OOB: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    return in->data[in->data_len + 4096];
}
"#;

/// Writes into the object, which is mapped read-only.
const OOB_WRITE: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    ((volatile uint8_t *)in->data)[7] = 1;
    return 0;
}
"#;

const UNKNOWN_HELPER: &str = r#"
#include "spindle_prog.h"
extern uint64_t spindle_format_disk(uint64_t);
uint64_t spindle_main(const struct spindle_input *in) {
    return spindle_format_disk(in->data_len);
}
"#;

const HUGE_STACK: &str = r#"
#include "spindle_prog.h"
/* Recursion that never ends, with a big frame each. */
__attribute__((noinline)) uint64_t down(uint64_t n) {
    volatile uint8_t frame[256];
    if (n == 0xdeadbeefcafeULL) return 0;
    frame[n % 256] = (uint8_t)n;
    return down(n + 1) + frame[(n + 1) % 256];
}
uint64_t spindle_main(const struct spindle_input *in) {
    return down(in->data_len);
}
"#;

const ALLOC_FOREVER: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    uint64_t total = 0;
    for (;;) {
        uint8_t *p = spindle_alloc(1 << 20);
        p[0] = 1;
        total += p[0];
    }
    return total;
}
"#;

fn program(src: &str) -> ProgramCode {
    ProgramCode::new(spindle_prog::compile_c(src).expect("clang compiles the program"))
}

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn column(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i ^ seed).wrapping_mul(2_654_435_761) >> 8)
        .collect()
}

fn sum(v: &[u32]) -> u64 {
    v.iter().map(|&x| x as u64).sum()
}

fn u64_of(out: &[u8]) -> u64 {
    u64::from_le_bytes(out[..8].try_into().expect("8 bytes of output"))
}

/// A daemon counter summed over every daemon (`status --json`).
fn counter(c: &Cluster, name: &str) -> u64 {
    let s = c.status();
    s["osds"]
        .as_array()
        .expect("osds")
        .iter()
        .filter_map(|o| o["counters"][name].as_u64())
        .sum()
}

/// Waits for a daemon counter (summed) to reach `at_least`: counters travel with
/// heartbeats.
async fn wait_counter(c: &Cluster, name: &str, at_least: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = counter(c, name);
        if now >= at_least {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {now}, expected at least {at_least}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_run_next_to_the_data_on_replicated_and_erasure_coded_pools() {
    // Answers and limits are tested here with programs given a whole CPU per daemon (an
    // interpreted run to the end of its instruction budget takes a while); the default
    // budget of 25 % is tested beside I/O in `exec_isolation.rs`.
    let c = Cluster::start_with("exec", 3, 16, &["--exec-cpu-percent", "100"]);
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

    // `spindle prog load` verifies and stores the program; `prog ls` lists it.
    let dir = common::unique_dir("exec-progs");
    std::fs::create_dir_all(&dir).unwrap();
    let sum_o = dir.join("sum.o");
    std::fs::write(&sum_o, spindle_prog::compile_c(SUM).unwrap()).unwrap();
    for pool in [POOL, EC_POOL] {
        let out = common::ok(
            &c,
            &[
                "prog",
                "load",
                "sum",
                sum_o.to_str().unwrap(),
                "--pool",
                pool,
            ],
        );
        assert!(out.contains("loaded program sum = "), "{out}");
    }
    let listed = common::ok(&c, &["prog", "ls"]);
    assert!(listed.starts_with("sum\t"), "{listed}");
    // A program the verifier refuses is not stored.
    let bad_o = dir.join("unknown.o");
    std::fs::write(&bad_o, spindle_prog::compile_c(UNKNOWN_HELPER).unwrap()).unwrap();
    common::fails(
        &c,
        &["prog", "load", "bad", bad_o.to_str().unwrap()],
        "unknown helper spindle_format_disk",
    );

    // Objects of u32 values on both pools; every run's answer against the same sum here.
    let mut sums = Vec::new();
    for (i, n) in [1usize, 1000, 300_000, 1 << 20].into_iter().enumerate() {
        let v = column(i as u32, n);
        for pool in [POOL, EC_POOL] {
            client
                .write_full(pool, &format!("col{i}"), u32s(&v))
                .await
                .unwrap();
        }
        sums.push((format!("col{i}"), n as u64, sum(&v)));
    }
    for pool in [POOL, EC_POOL] {
        let objects: Vec<&str> = sums.iter().map(|(n, _, _)| n.as_str()).collect();
        for engine in ["jit", "interpreter"] {
            let mut args = vec!["exec", "sum", "--pool", pool, "--engine", engine, "--json"];
            args.extend(&objects);
            let out = common::ok(&c, &args);
            let lines: Vec<serde_json::Value> = out
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines.len(), sums.len(), "{out}");
            for (line, (name, n, s)) in lines.iter().zip(&sums) {
                assert_eq!(line["objects"][0], name.as_str(), "{out}");
                assert_eq!(line["ret"], *n, "{pool} {engine} {name}");
                let hex = line["output_hex"].as_str().unwrap();
                let bytes: Vec<u8> = (0..16)
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                assert_eq!(u64_of(&bytes), *s, "{pool} {engine} {name}");
            }
        }
    }
    // A missing object is NotFound, as a read would be.
    let sum_p = client.program(POOL, "sum").await.unwrap();
    let r = client
        .exec(POOL, &["nope"], &sum_p, &[], ExecOptions::default())
        .await;
    assert!(matches!(r, Err(ClientError::NotFound(_))), "{r:?}");

    // Several objects of one placement group in one run.
    let dot = program(DOT);
    let (a, b) = (column(7, 200_000), column(9, 200_000));
    for pool in [POOL, EC_POOL] {
        client
            .write_full(pool, "t.{rg3}.a", u32s(&a))
            .await
            .unwrap();
        client
            .write_full(pool, "t.{rg3}.b", u32s(&b))
            .await
            .unwrap();
        let min = 1u64 << 20;
        let want: u64 = a
            .iter()
            .zip(&b)
            .filter(|(x, _)| **x as u64 >= min)
            .map(|(x, y)| *x as u64 * *y as u64)
            .sum();
        let r = client
            .exec(
                pool,
                &["t.{rg3}.a", "t.{rg3}.b"],
                &dot,
                &min.to_le_bytes(),
                ExecOptions {
                    jit: true,
                    cache: false,
                },
            )
            .await
            .unwrap();
        assert_eq!((r.ret, u64_of(&r.output)), (200_000, want), "{pool}");
        assert_eq!(r.objects.len(), 2);
        assert_eq!(r.objects[1].name, "t.{rg3}.b");
        assert_eq!(r.objects[1].size_bytes, 800_000);
        // Objects of different groups cannot be in one run: a clear refusal.
        let other = (0..64)
            .map(|i| format!("elsewhere{i}"))
            .find(|n| {
                let map = client.map();
                let pg_count = map.pool_by_name(pool).unwrap().pg_count;
                spindle_map::object_pg(n, pg_count) != spindle_map::object_pg("rg3", pg_count)
            })
            .unwrap();
        client.write_full(pool, &other, vec![0; 8]).await.unwrap();
        let r = client
            .exec(
                pool,
                &["t.{rg3}.a", &other],
                &dot,
                &[],
                ExecOptions::default(),
            )
            .await;
        match r {
            Err(ClientError::Invalid(m)) => assert!(m.contains("placement key"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    // The data cache: a second cached run reads no object; a rewrite is seen at once.
    for pool in [POOL, EC_POOL] {
        let cached = ExecOptions {
            jit: true,
            cache: true,
        };
        let v1 = column(100, 100_000);
        client.write_full(pool, "cached", u32s(&v1)).await.unwrap();
        let r = client
            .exec(pool, &["cached"], &sum_p, &[], cached)
            .await
            .unwrap();
        assert_eq!(u64_of(&r.output), sum(&v1));
        let hits = counter(&c, "exec_cache_hits");
        let r = client
            .exec(pool, &["cached"], &sum_p, &[], cached)
            .await
            .unwrap();
        assert_eq!(u64_of(&r.output), sum(&v1));
        wait_counter(&c, "exec_cache_hits", hits + 1).await;
        // Rewritten whole, then partly: each cached run sees the new bytes.
        let v2 = column(200, 100_000);
        client.write_full(pool, "cached", u32s(&v2)).await.unwrap();
        let r = client
            .exec(pool, &["cached"], &sum_p, &[], cached)
            .await
            .unwrap();
        assert_eq!(
            u64_of(&r.output),
            sum(&v2),
            "{pool}: stale data after a rewrite"
        );
        let mut v3 = v2.clone();
        v3[5000] = 123_456_789;
        client
            .write(
                pool,
                "cached",
                5000 * 4,
                123_456_789u32.to_le_bytes().to_vec(),
            )
            .await
            .unwrap();
        let r = client
            .exec(pool, &["cached"], &sum_p, &[], cached)
            .await
            .unwrap();
        assert_eq!(
            u64_of(&r.output),
            sum(&v3),
            "{pool}: stale data after a write"
        );
    }

    // Hostile programs: each refused or stopped with its reason; the daemons serve on.
    let stopped: [(&str, &[&str]); 6] = [
        (LOOP, &["instruction budget"]),
        (OOB, &["access violation"]),
        (OOB_WRITE, &["access violation"]),
        (UNKNOWN_HELPER, &["unknown helper spindle_format_disk"]),
        (HUGE_STACK, &["call depth", "stack"]),
        (ALLOC_FOREVER, &["scratch memory limit"]),
    ];
    for pool in [POOL, EC_POOL] {
        for (src, why) in stopped {
            let p = program(src);
            for jit in [true, false] {
                let started = std::time::Instant::now();
                let r = client
                    .exec(pool, &["col1"], &p, &[], ExecOptions { jit, cache: false })
                    .await;
                match r {
                    Err(ClientError::Program(m)) => {
                        let m = m.to_lowercase();
                        assert!(why.iter().any(|w| m.contains(w)), "{pool} jit={jit}: {m}")
                    }
                    other => panic!("{pool} jit={jit} {why:?}: {other:?}"),
                }
                assert!(started.elapsed() < std::time::Duration::from_secs(60));
            }
        }
        // A malformed object file: refused with a clear error.
        let garbage = ProgramCode::new(b"\x7fELF not really an object file".to_vec());
        match client
            .exec(pool, &["col1"], &garbage, &[], ExecOptions::default())
            .await
        {
            Err(ClientError::Program(m)) => assert!(m.contains("refused"), "{m}"),
            other => panic!("{other:?}"),
        }
        let data = client.read_full(pool, "col1").await.unwrap();
        assert_eq!(data.len(), 4000);
    }
    wait_counter(&c, "exec_failed", 2 * (6 * 2 + 1)).await;

    // One daemon down: runs still answer (the replicated copy elsewhere; the erasure-coded
    // objects decoded from the shards left).
    c.kill_osd(2);
    c.wait_osd_up(2, false);
    for pool in [POOL, EC_POOL] {
        for (name, n, s) in &sums {
            let r = client
                .exec(pool, &[name.as_str()], &sum_p, &[], ExecOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{pool} {name} with osd.2 down: {e}"));
            assert_eq!((r.ret, u64_of(&r.output)), (*n, *s), "{pool} {name}");
        }
    }
    let _ = run_ok(spindle().args(["down", "--dir"]).arg(&c.dir));
    // The compiled programs' directory (the cluster's own is removed with `c`).
    let _ = std::fs::remove_dir_all(&dir);
}
