//! Pushdown programs run by the storage daemons (issue #23), on a real cluster: programs
//! compiled from C by clang, loaded with `spindle prog load`, run with `spindle exec` and
//! the client library on replicated and erasure-coded pools, over several objects of one
//! placement group, with the data cache (never stale after a write), with a daemon down,
//! and hostile programs refused or stopped while the daemons keep serving.

mod common;

use common::{counter, run_ok, spindle, wait_counter, Cluster};
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

/// What a part of a run sees: part, parts, stripe unit, then the u32 values at indexes 0,
/// unit / 4 - 1 and unit / 4 of its data (u64 each); returns its length.
const WHOAMI: &str = r#"
#include "spindle_prog.h"
uint64_t spindle_main(const struct spindle_input *in) {
    uint64_t w[6] = {in->part, in->parts, in->stripe_unit, 0, 0, 0};
    const uint32_t *v = (const uint32_t *)in->data;
    uint64_t n = in->data_len / 4, at[3] = {0, in->stripe_unit / 4 - 1, in->stripe_unit / 4};
    for (int i = 0; i < 3; i++)
        if (at[i] < n) w[3 + i] = v[at[i]];
    spindle_emit(w, sizeof w);
    return in->data_len;
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

/// What `DOT` computes: the sum of a[i] * b[i] over rows whose a is at least `min`.
fn dot_of(a: &[u32], b: &[u32], min: u64) -> u64 {
    a.iter()
        .zip(b)
        .filter(|(x, _)| **x as u64 >= min)
        .map(|(x, y)| *x as u64 * *y as u64)
        .sum()
}

fn sum(v: &[u32]) -> u64 {
    v.iter().map(|&x| x as u64).sum()
}

fn u64_of(out: &[u8]) -> u64 {
    u64::from_le_bytes(out[..8].try_into().expect("8 bytes of output"))
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
        let want = dot_of(&a, &b, min);
        let r = client
            .exec(
                pool,
                &["t.{rg3}.a", "t.{rg3}.b"],
                &dot,
                &min.to_le_bytes(),
                ExecOptions {
                    jit: true,
                    cache: false,
                    shards: false,
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

    // Shard-local runs on the erasure-coded pool: one part per data shard, run by the daemon
    // holding it, over that shard's stripe units; together they are the whole run.
    let (k, unit) = match client.map().pool_by_name(EC_POOL).unwrap().kind.clone() {
        spindle_map::PoolKind::Erasure {
            k,
            stripe_unit_bytes,
            ..
        } => (k as usize, stripe_unit_bytes as usize),
        other => panic!("{other:?}"),
    };
    let shard_runs = counter(&c, "exec_shard_runs");
    for (jit, cache) in [(true, false), (false, false), (true, true)] {
        let opts = ExecOptions {
            jit,
            cache,
            shards: true,
        };
        let min = 1u64 << 20;
        let want = dot_of(&a, &b, min);
        let r = client
            .exec(
                EC_POOL,
                &["t.{rg3}.a", "t.{rg3}.b"],
                &dot,
                &min.to_le_bytes(),
                opts,
            )
            .await
            .unwrap();
        let parts = r.each_part();
        assert_eq!(parts.len(), k, "one part per data shard");
        assert!(parts.iter().all(|(n, _)| *n > 0), "every shard holds rows");
        assert_eq!(r.ret, 200_000, "the parts' rows add up to the object's");
        let total: u64 = parts.iter().map(|(_, o)| u64_of(o)).sum();
        assert_eq!(total, want, "jit={jit} cache={cache}");
        // The same program on a replicated pool: one whole-object run.
        let r = client
            .exec(
                POOL,
                &["t.{rg3}.a", "t.{rg3}.b"],
                &dot,
                &min.to_le_bytes(),
                opts,
            )
            .await
            .unwrap();
        assert!(r.parts.is_empty());
        assert_eq!(u64_of(&r.output), want);
    }
    wait_counter(&c, "exec_shard_runs", shard_runs + 3 * k as u64).await;
    // `spindle exec --shards`: each part reported, the return values summed.
    let mut args = vec!["exec", "sum", "--pool", EC_POOL, "--shards", "--json"];
    args.extend(sums.iter().map(|(n, _, _)| n.as_str()));
    let out = common::ok(&c, &args);
    for (line, (name, n, s)) in out.lines().zip(&sums) {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["ret"], *n, "{name}: {line}");
        assert_eq!(line["parts"].as_array().map(Vec::len), Some(k), "{line}");
        let hex = line["output_hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let total: u64 = bytes.chunks_exact(8).map(u64_of).sum();
        assert_eq!(total, *s, "{name}: the parts' sums add up");
    }
    // What a part sees: its index, k, the stripe unit, and the object's stripe units
    // `part`, `part + k`, ... back to back.
    let whoami = program(WHOAMI);
    let v = column(77, 50_000);
    client
        .write_full(EC_POOL, "striped", u32s(&v))
        .await
        .unwrap();
    let r = client
        .exec(
            EC_POOL,
            &["striped"],
            &whoami,
            &[],
            ExecOptions {
                shards: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let bytes = u32s(&v);
    for (i, (ret, out)) in r.each_part().into_iter().enumerate() {
        let words: Vec<u64> = out.chunks_exact(8).map(u64_of).collect();
        assert_eq!(&words[..3], &[i as u64, k as u64, unit as u64], "part {i}");
        let mine: Vec<u8> = bytes
            .chunks(unit)
            .skip(i)
            .step_by(k)
            .flatten()
            .copied()
            .collect();
        assert_eq!(ret, mine.len() as u64, "part {i}: length");
        let want = [0, unit / 4 - 1, unit / 4]
            .map(|at| u32::from_le_bytes(mine[at * 4..at * 4 + 4].try_into().unwrap()) as u64);
        assert_eq!(&words[3..6], &want, "part {i}: values");
    }

    // The data cache: a second cached run reads no object; a rewrite is seen at once.
    for pool in [POOL, EC_POOL] {
        let cached = ExecOptions {
            jit: true,
            cache: true,
            shards: false,
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
        // Shard-local and cached: each part's cached bytes are dropped by a write too.
        let shards = ExecOptions {
            shards: true,
            ..cached
        };
        for v in [&v3, &v1] {
            if v == &v1 {
                client.write_full(pool, "cached", u32s(v)).await.unwrap();
            }
            for _ in 0..2 {
                let r = client
                    .exec(pool, &["cached"], &sum_p, &[], shards)
                    .await
                    .unwrap();
                let total: u64 = r.each_part().iter().map(|(_, o)| u64_of(o)).sum();
                assert_eq!(total, sum(v), "{pool}: shard-local cached run");
            }
        }
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
                    .exec(
                        pool,
                        &["col1"],
                        &p,
                        &[],
                        ExecOptions {
                            jit,
                            cache: false,
                            shards: false,
                        },
                    )
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

    // Objects of the erasure-coded pool with a data shard on osd.2 (killed next), for the
    // shard-local runs below.
    let map = client.map();
    let ec = map.pool_by_name(EC_POOL).unwrap();
    let placement = spindle_map::Placement::compute(&map);
    let on_osd2: Vec<(String, Vec<u32>)> = (0..200)
        .map(|i| format!("deg{i}"))
        .filter(|n| {
            let pg = spindle_map::object_pg(n, ec.pg_count);
            let shard = placement.pg(ec.id, pg).unwrap().shard_of(2);
            shard.is_some_and(|s| (s as usize) < k)
        })
        .take(3)
        .map(|n| {
            let v = column(n.len() as u32 * 31, 40_000);
            (n, v)
        })
        .collect();
    assert_eq!(on_osd2.len(), 3, "objects with a data shard on osd.2");
    for (n, v) in &on_osd2 {
        client.write_full(EC_POOL, n, u32s(v)).await.unwrap();
    }
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
    // Shard-local with a data shard's daemon down: its part runs on a decoded copy.
    let decoded = counter(&c, "exec_shard_decoded");
    let degraded: Vec<(String, u64, u64)> = on_osd2
        .iter()
        .map(|(n, v)| (n.clone(), v.len() as u64, sum(v)))
        .collect();
    for (name, n, s) in sums.iter().chain(&degraded) {
        let r = client
            .exec(
                EC_POOL,
                &[name.as_str()],
                &sum_p,
                &[],
                ExecOptions {
                    shards: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("shard-local {name} with osd.2 down: {e}"));
        let total: u64 = r.each_part().iter().map(|(_, o)| u64_of(o)).sum();
        assert_eq!((r.ret, total), (*n, *s), "shard-local {name}");
    }
    wait_counter(&c, "exec_shard_decoded", decoded + degraded.len() as u64).await;
    let _ = run_ok(spindle().args(["down", "--dir"]).arg(&c.dir));
    // The compiled programs' directory (the cluster's own is removed with `c`).
    let _ = std::fs::remove_dir_all(&dir);
}
