//! The Star Schema Benchmark's query 3.3 (issue #23, after Delilah in DAPHNE D6.3), three
//! ways over the same data in a pool, checked against DuckDB on Parquet files of the same
//! data: `spindle bench ssb`.
//!
//! Data. A deterministic generator following the SSB specification (O'Neil, O'Neil, Chen,
//! Revilak, rev. 3, with TPC-H's rules where SSB keeps them): `customer` has SF x 30,000
//! rows, `supplier` SF x 2,000, each with a city made of the first 9 characters of one of
//! the 25 nations and a digit; `lineorder` has SF x 1,500,000 orders of 1 to 7 lines
//! (about 6,000,000 rows per SF), each order one customer and one order date between
//! 1992-01-01 and 1998-08-02, each line a supplier, a part, a quantity (1-50) and a
//! discount (0-10 %), its revenue the part's TPC-H retail price x quantity x
//! (100 - discount) / 100. Only what Q3.3 reads is stored (see `docs/pushdown.md`):
//! - `lineorder`, column-wise: one object per column per row group of
//!   [`ROWS_PER_GROUP`] rows, fixed-width u32 (`PREFIX.lineorder.{sfNrgM}.custkey`,
//!   `.suppkey`, `.orderdate` as yyyymmdd, `.revenue`). The placement key `{sfNrgM}`
//!   puts a row group's columns in one placement group, so one program run sees them;
//! - `customer.city` and `supplier.city`: one u8 per row (by key - 1), codes into
//!   `city.dict`, 250 fixed-width 10-byte names;
//! - `meta`: the scale factor, seed and row counts (JSON).
//!
//! Q3.3 (revenue by customer city, supplier city and year, for cities 'UNITED KI1' and
//! 'UNITED KI5' on both sides and years 1992 to 1997) runs as:
//! - **pull**: the four columns of every row group come to the client, which computes;
//! - **filter offload**: a program (`ssb_q33_filter.c`) filters each row group on its
//!   primary and returns the qualifying rows; the client converts dates and aggregates;
//! - **full offload**: a program (`ssb_q33.c`) filters, converts and aggregates, and
//!   returns partial sums per (city, city, year), merged on the client.
//!
//! In every case the client first reads the two small city columns and the dictionary
//! (the dimension tables) and decides which keys qualify: the programs get that as their
//! arguments (the qualifying keys, each with its city).

use spindle_client::{Client, ExecOptions, ProgramCode};
use std::collections::BTreeMap;
use std::path::Path;

/// Rows per row group: 4 MiB per u32 column object.
pub const ROWS_PER_GROUP: usize = 1 << 20;

/// The 25 nations of TPC-H / SSB, in their key order.
pub const NATIONS: [&str; 25] = [
    "ALGERIA",
    "ARGENTINA",
    "BRAZIL",
    "CANADA",
    "EGYPT",
    "ETHIOPIA",
    "FRANCE",
    "GERMANY",
    "INDIA",
    "INDONESIA",
    "IRAN",
    "IRAQ",
    "JAPAN",
    "JORDAN",
    "KENYA",
    "MOROCCO",
    "MOZAMBIQUE",
    "PERU",
    "CHINA",
    "ROMANIA",
    "SAUDI ARABIA",
    "VIETNAM",
    "RUSSIA",
    "UNITED KINGDOM",
    "UNITED STATES",
];

/// Bytes of a city name (9 of the nation, space-padded, and a digit).
pub const CITY_BYTES: usize = 10;

/// City `code` (nation * 10 + digit) as SSB writes it.
pub fn city_name(code: u8) -> String {
    let nation = NATIONS[code as usize / 10];
    let mut s: String = nation.chars().take(9).collect();
    while s.len() < 9 {
        s.push(' ');
    }
    s.push(char::from(b'0' + code % 10));
    s
}

/// Q3.3's cities (both sides) and years.
pub const Q33_CITIES: [&str; 2] = ["UNITED KI1", "UNITED KI5"];
pub const Q33_YEARS: (u32, u32) = (1992, 1997);

/// The generated tables (what is stored of them).
pub struct SsbData {
    pub sf: u32,
    pub seed: u64,
    /// City code of customer key k at k - 1, of supplier key k at k - 1.
    pub customer_city: Vec<u8>,
    pub supplier_city: Vec<u8>,
    pub custkey: Vec<u32>,
    pub suppkey: Vec<u32>,
    pub orderdate: Vec<u32>,
    pub revenue: Vec<u32>,
}

/// splitmix64: a small deterministic generator (the data depends only on the seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in lo..=hi.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + (((self.next() >> 32) * (hi - lo + 1)) >> 32)
    }
}

/// Days since 1992-01-01 as yyyymmdd.
fn date_key(mut day: u32) -> u32 {
    let mut year = 1992;
    loop {
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days = if leap { 366 } else { 365 };
        if day < days {
            let months = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            let mut month = 0;
            while day >= months[month] {
                day -= months[month];
                month += 1;
            }
            return year * 10000 + (month as u32 + 1) * 100 + day + 1;
        }
        day -= days;
        year += 1;
    }
}

/// Days from 1992-01-01 to 1998-08-02 (TPC-H's last order date: 1998-12-31 less 151 days).
const ORDER_DAYS: u32 = 2405;

impl SsbData {
    /// The tables at scale factor `sf` from `seed`.
    pub fn generate(sf: u32, seed: u64) -> SsbData {
        assert!(sf >= 1);
        let mut rng = Rng(seed ^ 0x5353_4230_3333);
        let customers = 30_000 * sf as usize;
        let suppliers = 2_000 * sf as usize;
        let city = |rng: &mut Rng| (rng.range(0, 24) * 10 + rng.range(0, 9)) as u8;
        let customer_city = (0..customers).map(|_| city(&mut rng)).collect();
        let supplier_city = (0..suppliers).map(|_| city(&mut rng)).collect();
        let orders = 1_500_000 * sf as usize;
        let parts = 200_000 * (1 + (sf as f64).log2().floor() as u64);
        let rows_guess = orders * 4 + 16;
        let (mut custkey, mut suppkey, mut orderdate, mut revenue) = (
            Vec::with_capacity(rows_guess),
            Vec::with_capacity(rows_guess),
            Vec::with_capacity(rows_guess),
            Vec::with_capacity(rows_guess),
        );
        for _ in 0..orders {
            let cust = rng.range(1, customers as u64) as u32;
            let date = date_key(rng.range(0, ORDER_DAYS as u64) as u32);
            for _ in 0..rng.range(1, 7) {
                let part = rng.range(1, parts);
                let price = 90_000 + (part / 10) % 20_001 + 100 * (part % 1000);
                let quantity = rng.range(1, 50);
                let discount = rng.range(0, 10);
                custkey.push(cust);
                suppkey.push(rng.range(1, suppliers as u64) as u32);
                orderdate.push(date);
                revenue.push((price * quantity * (100 - discount) / 100) as u32);
            }
        }
        SsbData {
            sf,
            seed,
            customer_city,
            supplier_city,
            custkey,
            suppkey,
            orderdate,
            revenue,
        }
    }

    pub fn rows(&self) -> usize {
        self.custkey.len()
    }

    pub fn row_groups(&self) -> usize {
        self.rows().div_ceil(ROWS_PER_GROUP)
    }
}

/// One row of Q3.3's answer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Q33Row {
    pub c_city: String,
    pub s_city: String,
    pub d_year: u32,
    pub revenue: u64,
}

/// Q3.3's answer in its order: year ascending, revenue descending (then the cities, so
/// ties have one order).
pub fn q33_order(mut rows: Vec<Q33Row>) -> Vec<Q33Row> {
    rows.sort_by(|a, b| {
        (a.d_year, std::cmp::Reverse(a.revenue), &a.c_city, &a.s_city).cmp(&(
            b.d_year,
            std::cmp::Reverse(b.revenue),
            &b.c_city,
            &b.s_city,
        ))
    });
    rows
}

/// The plan every configuration shares: which keys qualify, from the dimension tables.
pub struct Q33Plan {
    /// Per customer key - 1: 0, or the 1-based index of its city in `cities`.
    pub cust_sel: Vec<u8>,
    pub supp_sel: Vec<u8>,
    pub cities: Vec<String>,
    /// The programs' argument block (`struct q33_args` and the qualifying keys of both
    /// sides).
    pub args: Vec<u8>,
}

impl Q33Plan {
    pub fn new(customer_city: &[u8], supplier_city: &[u8], dict: &[String]) -> Q33Plan {
        let cities: Vec<String> = Q33_CITIES.iter().map(|c| c.to_string()).collect();
        let index = |code: &u8| {
            dict.get(*code as usize)
                .and_then(|name| cities.iter().position(|c| c == name))
                .map_or(0, |i| i as u8 + 1)
        };
        let cust_sel: Vec<u8> = customer_city.iter().map(index).collect();
        let supp_sel: Vec<u8> = supplier_city.iter().map(index).collect();
        // Keys travel in 24 bits (scale factors up to 32 have fewer than 2^24 customers).
        assert!(cust_sel.len() < 1 << 24 && supp_sel.len() < 1 << 24);
        let (y0, y1) = Q33_YEARS;
        // The qualifying keys (1-based) with their city's index: key << 8 | index.
        let listed = |sel: &[u8]| -> Vec<u32> {
            sel.iter()
                .enumerate()
                .filter(|(_, &i)| i != 0)
                .map(|(k, &i)| ((k as u32 + 1) << 8) | i as u32)
                .collect()
        };
        let (cust_keys, supp_keys) = (listed(&cust_sel), listed(&supp_sel));
        let mut args = Vec::new();
        for v in [
            y0 * 10000 + 101,
            y1 * 10000 + 1231,
            y0,
            y1 - y0 + 1,
            cities.len() as u32,
            cities.len() as u32,
            cust_sel.len() as u32 + 1,
            supp_sel.len() as u32 + 1,
            cust_keys.len() as u32,
            supp_keys.len() as u32,
        ]
        .into_iter()
        .chain(cust_keys)
        .chain(supp_keys)
        {
            args.extend_from_slice(&v.to_le_bytes());
        }
        Q33Plan {
            cust_sel,
            supp_sel,
            cities,
            args,
        }
    }

    fn nyears(&self) -> usize {
        (Q33_YEARS.1 - Q33_YEARS.0 + 1) as usize
    }

    /// Adds one row to `sums` if it qualifies.
    fn add(&self, sums: &mut BTreeMap<(u8, u8, u32), u64>, c: u32, s: u32, d: u32, r: u32) {
        let (Some(&ci), Some(&si)) = (
            self.cust_sel.get((c as usize).wrapping_sub(1)),
            self.supp_sel.get((s as usize).wrapping_sub(1)),
        ) else {
            return;
        };
        let year = d / 10000;
        if ci == 0 || si == 0 || year < Q33_YEARS.0 || year > Q33_YEARS.1 {
            return;
        }
        *sums.entry((ci, si, year)).or_default() += r as u64;
    }

    /// Q3.3's rows over columns (the host's computation: pull, and the reference).
    pub fn over_columns(&self, sums: &mut BTreeMap<(u8, u8, u32), u64>, cols: [&[u32]; 4]) {
        let [c, s, d, r] = cols;
        for i in 0..c.len().min(s.len()).min(d.len()).min(r.len()) {
            self.add(sums, c[i], s[i], d[i], r[i]);
        }
    }

    /// The answer from sums by (city index, city index, year).
    pub fn answer(&self, sums: &BTreeMap<(u8, u8, u32), u64>) -> Vec<Q33Row> {
        q33_order(
            sums.iter()
                .filter(|(_, &v)| v > 0)
                .map(|(&(c, s, y), &v)| Q33Row {
                    c_city: self.cities[c as usize - 1].clone(),
                    s_city: self.cities[s as usize - 1].clone(),
                    d_year: y,
                    revenue: v,
                })
                .collect(),
        )
    }
}

/// The dictionary of city names (code order).
pub fn city_dict() -> Vec<String> {
    (0..250u8).map(city_name).collect()
}

/// Q3.3 computed here over the generated data (the reference the cluster's answers are
/// also checked against, beside DuckDB's).
pub fn q33_reference(d: &SsbData) -> Vec<Q33Row> {
    let plan = Q33Plan::new(&d.customer_city, &d.supplier_city, &city_dict());
    let mut sums = BTreeMap::new();
    plan.over_columns(
        &mut sums,
        [&d.custkey, &d.suppkey, &d.orderdate, &d.revenue],
    );
    plan.answer(&sums)
}

/// Object names of a data set.
#[derive(Clone, Debug)]
pub struct Names {
    pub prefix: String,
    pub sf: u32,
}

/// The lineorder columns, in the order the programs take them.
pub const COLUMNS: [&str; 4] = ["custkey", "suppkey", "orderdate", "revenue"];

impl Names {
    pub fn column(&self, group: usize, col: &str) -> String {
        format!(
            "{}.lineorder.{{sf{}rg{group:05}}}.{col}",
            self.prefix, self.sf
        )
    }
    pub fn meta(&self) -> String {
        format!("{}.sf{}.meta", self.prefix, self.sf)
    }
    pub fn customer_city(&self) -> String {
        format!("{}.sf{}.customer.city", self.prefix, self.sf)
    }
    pub fn supplier_city(&self) -> String {
        format!("{}.sf{}.supplier.city", self.prefix, self.sf)
    }
    pub fn dict(&self) -> String {
        format!("{}.sf{}.city.dict", self.prefix, self.sf)
    }
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Stores the data set in `pool` (16 objects in flight); `progress` gets the bytes done.
pub async fn load(
    client: &Client,
    pool: &str,
    names: &Names,
    d: &SsbData,
    progress: impl Fn(u64),
) -> anyhow::Result<()> {
    use futures::StreamExt;
    let dict: Vec<u8> = city_dict().iter().flat_map(|c| c.bytes()).collect();
    client.write_full(pool, &names.dict(), dict).await?;
    client
        .write_full(pool, &names.customer_city(), d.customer_city.clone())
        .await?;
    client
        .write_full(pool, &names.supplier_city(), d.supplier_city.clone())
        .await?;
    let cols: [&[u32]; 4] = [&d.custkey, &d.suppkey, &d.orderdate, &d.revenue];
    let jobs: Vec<(String, &[u32])> = (0..d.row_groups())
        .flat_map(|g| {
            let range = g * ROWS_PER_GROUP..((g + 1) * ROWS_PER_GROUP).min(d.rows());
            COLUMNS
                .iter()
                .zip(cols)
                .map(move |(name, col)| (names.column(g, name), &col[range.clone()]))
                .collect::<Vec<_>>()
        })
        .collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let mut writes = futures::stream::iter(jobs.into_iter().map(|(name, col)| {
        let done = &done;
        let progress = &progress;
        async move {
            let bytes = u32_bytes(col);
            let len = bytes.len() as u64;
            client.write_full(pool, &name, bytes).await?;
            progress(done.fetch_add(len, std::sync::atomic::Ordering::Relaxed) + len);
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(16);
    while let Some(r) = writes.next().await {
        r?;
    }
    let meta = serde_json::json!({
        "sf": d.sf,
        "seed": d.seed,
        "rows": d.rows(),
        "row_groups": d.row_groups(),
        "rows_per_group": ROWS_PER_GROUP,
        "customers": d.customer_city.len(),
        "suppliers": d.supplier_city.len(),
    });
    client
        .write_full(pool, &names.meta(), meta.to_string().into_bytes())
        .await?;
    Ok(())
}

/// How Q3.3 runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// The columns to the client.
    Pull,
    /// The filter on the daemons, the rest on the client.
    Filter(ExecOptions),
    /// Filter, year conversion and aggregation on the daemons, partial sums merged here.
    Full(ExecOptions),
}

impl Config {
    /// Every configuration: pull, then filter and full offload in the interpreter and the
    /// JIT, each without and with the daemons' data cache; offloaded runs shard-local if
    /// `shards` (on an erasure-coded pool: on each data shard's daemon).
    pub fn all(shards: bool) -> Vec<Config> {
        let mut v = vec![Config::Pull];
        for full in [false, true] {
            for jit in [false, true] {
                for cache in [false, true] {
                    let o = ExecOptions { jit, cache, shards };
                    v.push(if full {
                        Config::Full(o)
                    } else {
                        Config::Filter(o)
                    });
                }
            }
        }
        v
    }

    pub fn label(&self) -> String {
        let o = |o: &ExecOptions| {
            format!(
                "{}{}{}",
                if o.jit { "jit" } else { "interpreter" },
                if o.cache { ", cached" } else { "" },
                if o.shards { ", shard-local" } else { "" }
            )
        };
        match self {
            Config::Pull => "pull".into(),
            Config::Filter(x) => format!("filter offload ({})", o(x)),
            Config::Full(x) => format!("full offload ({})", o(x)),
        }
    }
}

/// The programs of the offloaded configurations.
pub struct Programs {
    pub filter: ProgramCode,
    pub full: ProgramCode,
}

impl Programs {
    /// Compiled here with clang from the sources shipped in `spindle-prog/programs/`.
    pub fn compile() -> anyhow::Result<Programs> {
        let c = |src: &str| {
            spindle_prog::compile_c(src)
                .map(ProgramCode::new)
                .map_err(|e| anyhow::anyhow!(e))
        };
        Ok(Programs {
            filter: c(include_str!("../../spindle-prog/programs/ssb_q33_filter.c"))?,
            full: c(include_str!("../../spindle-prog/programs/ssb_q33.c"))?,
        })
    }
}

/// What a run of Q3.3 returned and moved.
pub struct Q33Run {
    pub rows: Vec<Q33Row>,
    /// Payload bytes the client received (object data, program output).
    pub bytes_received: u64,
    /// Payload bytes the client sent (program arguments and names).
    pub bytes_sent: u64,
}

/// Runs Q3.3 on the data set `names` in `pool` as `config` (`parallel` row groups in
/// flight).
pub async fn q33(
    client: &Client,
    pool: &str,
    names: &Names,
    config: Config,
    programs: &Programs,
    parallel: usize,
) -> anyhow::Result<Q33Run> {
    use futures::StreamExt;
    let meta: serde_json::Value =
        serde_json::from_slice(&client.read_full(pool, &names.meta()).await?)?;
    let groups = meta["row_groups"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("{}: no row_groups", names.meta()))?
        as usize;
    let dict_bytes = client.read_full(pool, &names.dict()).await?;
    let dict: Vec<String> = dict_bytes
        .chunks(CITY_BYTES)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let customer_city = client.read_full(pool, &names.customer_city()).await?;
    let supplier_city = client.read_full(pool, &names.supplier_city()).await?;
    let mut received = (dict_bytes.len() + customer_city.len() + supplier_city.len()) as u64;
    let mut sent = 0u64;
    let plan = Q33Plan::new(&customer_city, &supplier_city, &dict);
    let plan = &plan;
    let mut sums: BTreeMap<(u8, u8, u32), u64> = BTreeMap::new();
    let per_group = futures::stream::iter((0..groups).map(|g| async move {
        let cols: Vec<String> = COLUMNS.iter().map(|c| names.column(g, c)).collect();
        let refs: Vec<&str> = cols.iter().map(String::as_str).collect();
        let names_bytes: u64 = cols.iter().map(|c| c.len() as u64).sum();
        match config {
            Config::Pull => {
                let data =
                    futures::future::try_join_all(refs.iter().map(|n| client.read_full(pool, n)))
                        .await?;
                anyhow::Ok(GroupResult::Columns(data, names_bytes))
            }
            Config::Filter(o) => {
                let r = client
                    .exec(pool, &refs, &programs.filter, &plan.args, o)
                    .await?;
                Ok(GroupResult::Rows(
                    r.output,
                    names_bytes + plan.args.len() as u64,
                ))
            }
            Config::Full(o) => {
                let r = client
                    .exec(pool, &refs, &programs.full, &plan.args, o)
                    .await?;
                Ok(GroupResult::Sums(
                    r.output,
                    names_bytes + plan.args.len() as u64,
                ))
            }
        }
    }))
    .buffer_unordered(parallel.max(1));
    let mut per_group = std::pin::pin!(per_group);
    let nyears = plan.nyears();
    let ncities = plan.cities.len();
    while let Some(r) = per_group.next().await {
        match r? {
            GroupResult::Columns(data, out) => {
                sent += out;
                received += data.iter().map(|d| d.len() as u64).sum::<u64>();
                let cols: Vec<Vec<u32>> = data.iter().map(|d| bytes_u32(d)).collect();
                plan.over_columns(&mut sums, [&cols[0], &cols[1], &cols[2], &cols[3]]);
            }
            GroupResult::Rows(rows, out) => {
                sent += out;
                received += rows.len() as u64;
                for r in bytes_u32(&rows).chunks_exact(4) {
                    plan.add(&mut sums, r[0], r[1], r[2], r[3]);
                }
            }
            GroupResult::Sums(partial, out) => {
                sent += out;
                received += partial.len() as u64;
                // One partial aggregate, or one per data shard (shard-local runs).
                let cells = ncities * ncities * nyears;
                anyhow::ensure!(
                    !partial.is_empty() && partial.len() % (cells * 8) == 0,
                    "a partial aggregate of {} bytes",
                    partial.len()
                );
                for (i, v) in partial.chunks_exact(8).enumerate() {
                    let i = i % cells;
                    let v = u64::from_le_bytes(v.try_into().expect("8 bytes"));
                    if v == 0 {
                        continue;
                    }
                    let (c, rest) = (i / (ncities * nyears), i % (ncities * nyears));
                    let (s, y) = (rest / nyears, rest % nyears);
                    *sums
                        .entry((c as u8 + 1, s as u8 + 1, Q33_YEARS.0 + y as u32))
                        .or_default() += v;
                }
            }
        }
    }
    Ok(Q33Run {
        rows: plan.answer(&sums),
        bytes_received: received,
        bytes_sent: sent,
    })
}

enum GroupResult {
    Columns(Vec<Vec<u8>>, u64),
    Rows(Vec<u8>, u64),
    Sums(Vec<u8>, u64),
}

/// The Python that has DuckDB and pyarrow: `SPINDLE_PYTHON`, else `.venv/bin/python` in
/// the current directory or one above it, or above this executable (`scripts/setup.sh`
/// makes it in the repository).
pub fn python() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("SPINDLE_PYTHON") {
        return Ok(p.into());
    }
    let mut starts = vec![std::env::current_dir()?];
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    for start in starts {
        for dir in start.ancestors() {
            let p = dir.join(".venv/bin/python");
            if p.exists() {
                return Ok(p);
            }
        }
    }
    anyhow::bail!(
        "no Python with DuckDB found: run scripts/setup.sh (it makes .venv) or set SPINDLE_PYTHON"
    )
}

const DUCKDB_SCRIPT: &str = r#"
import json, sys, time, datetime
import numpy as np, pyarrow as pa, pyarrow.parquet as pq, duckdb
d, rounds = sys.argv[1], int(sys.argv[2])
dict_ = open(f"{d}/city.dict", "rb").read()
cities = pa.array([dict_[i:i + 10].decode() for i in range(0, len(dict_), 10)])
cust = np.fromfile(f"{d}/customer.city", dtype=np.uint8)
supp = np.fromfile(f"{d}/supplier.city", dtype=np.uint8)
pq.write_table(pa.table({"c_custkey": np.arange(1, len(cust) + 1, dtype=np.uint32),
                         "c_city": cities.take(pa.array(cust))}), f"{d}/customer.parquet")
pq.write_table(pa.table({"s_suppkey": np.arange(1, len(supp) + 1, dtype=np.uint32),
                         "s_city": cities.take(pa.array(supp))}), f"{d}/supplier.parquet")
days = [datetime.date(1992, 1, 1) + datetime.timedelta(days=i) for i in range(2557)]
pq.write_table(pa.table({"d_datekey": np.array([x.year * 10000 + x.month * 100 + x.day for x in days], dtype=np.uint32),
                         "d_year": np.array([x.year for x in days], dtype=np.uint32)}), f"{d}/date.parquet")
cols = {f"lo_{c}": np.fromfile(f"{d}/lineorder.{c}", dtype="<u4") for c in ["custkey", "suppkey", "orderdate", "revenue"]}
pq.write_table(pa.table(cols), f"{d}/lineorder.parquet")
del cols
q = f"""
select c_city, s_city, d_year, sum(lo_revenue) as revenue
from read_parquet('{d}/customer.parquet'), read_parquet('{d}/lineorder.parquet'),
     read_parquet('{d}/supplier.parquet'), read_parquet('{d}/date.parquet')
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_orderdate = d_datekey
  and (c_city = 'UNITED KI1' or c_city = 'UNITED KI5')
  and (s_city = 'UNITED KI1' or s_city = 'UNITED KI5')
  and d_year >= 1992 and d_year <= 1997
group by c_city, s_city, d_year
order by d_year asc, revenue desc
"""
con = duckdb.connect()
best = None
for _ in range(rounds):
    t = time.perf_counter()
    rows = con.execute(q).fetchall()
    s = time.perf_counter() - t
    best = s if best is None else min(best, s)
print(json.dumps({"seconds": best, "duckdb": duckdb.__version__,
                  "parquet_bytes": sum(__import__("os").path.getsize(f"{d}/{t}.parquet") for t in ["lineorder", "customer", "supplier", "date"]),
                  "rows": [{"c_city": r[0], "s_city": r[1], "d_year": int(r[2]), "revenue": int(r[3])} for r in rows]}))
"#;

/// DuckDB's answer to Q3.3 on Parquet files of `d` written under `dir` (local disk), and
/// the best of `rounds` query times (the Parquet writing is not timed).
pub struct DuckDbRun {
    pub rows: Vec<Q33Row>,
    pub seconds: f64,
    pub version: String,
    pub parquet_bytes: u64,
}

pub fn q33_duckdb(d: &SsbData, dir: &Path, rounds: u32) -> anyhow::Result<DuckDbRun> {
    use anyhow::Context;
    std::fs::create_dir_all(dir)?;
    let dict: Vec<u8> = city_dict().iter().flat_map(|c| c.bytes()).collect();
    std::fs::write(dir.join("city.dict"), dict)?;
    std::fs::write(dir.join("customer.city"), &d.customer_city)?;
    std::fs::write(dir.join("supplier.city"), &d.supplier_city)?;
    for (name, col) in COLUMNS
        .iter()
        .zip([&d.custkey, &d.suppkey, &d.orderdate, &d.revenue])
    {
        std::fs::write(dir.join(format!("lineorder.{name}")), u32_bytes(col))?;
    }
    std::fs::write(dir.join("q33.py"), DUCKDB_SCRIPT)?;
    let py = python()?;
    let out = std::process::Command::new(&py)
        .arg(dir.join("q33.py"))
        .arg(dir)
        .arg(rounds.max(1).to_string())
        .output()
        .with_context(|| format!("running {}", py.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "DuckDB's Q3.3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("DuckDB printed {}", String::from_utf8_lossy(&out.stdout)))?;
    let rows: Vec<Q33Row> = serde_json::from_value(v["rows"].clone())?;
    Ok(DuckDbRun {
        rows: q33_order(rows),
        seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
        version: v["duckdb"].as_str().unwrap_or("?").to_string(),
        parquet_bytes: v["parquet_bytes"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_cities_and_the_generator_follow_the_specification() {
        assert_eq!(date_key(0), 19920101);
        assert_eq!(date_key(59), 19920229);
        assert_eq!(date_key(366), 19930101);
        assert_eq!(date_key(ORDER_DAYS), 19980802);
        assert_eq!(city_name(23 * 10 + 1), "UNITED KI1");
        assert_eq!(city_name(18 * 10 + 7), "CHINA    7");
        let d = SsbData::generate(1, 7);
        // About 6,000,000 rows (1.5 M orders of 1 to 7 lines, 4 on average).
        assert!((5_900_000..6_100_000).contains(&d.rows()), "{}", d.rows());
        assert_eq!(d.customer_city.len(), 30_000);
        assert!(d
            .orderdate
            .iter()
            .all(|&x| (19920101..=19980802).contains(&x)));
        assert!(d.custkey.iter().all(|&c| (1..=30_000).contains(&c)));
        // Deterministic from the seed.
        let again = SsbData::generate(1, 7);
        assert_eq!(again.revenue[..1000], d.revenue[..1000]);
        assert_eq!(q33_reference(&d), q33_reference(&again));
        let other = SsbData::generate(1, 8);
        assert_ne!(other.revenue[..1000], d.revenue[..1000]);
        // Q3.3 selects a few hundred rows at SF 1: 24 groups at most.
        let answer = q33_reference(&d);
        assert!(!answer.is_empty() && answer.len() <= 24, "{answer:?}");
    }
}

/// `spindle bench ssb`.
#[derive(clap::Args)]
pub struct BenchSsbArgs {
    /// Scale factor (about 6 million lineorder rows each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=32))]
    sf: u32,
    /// Scale factor 1.
    #[arg(long)]
    quick: bool,
    /// Timed runs of each configuration (the best is reported).
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// The generator's seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Row groups in flight at once.
    #[arg(long, default_value_t = 12)]
    parallel: usize,
    /// Share of one CPU each daemon's execution threads may use (`spindle up
    /// --exec-cpu-percent`). Default 100: a cluster whose job is this query gives programs
    /// a whole CPU per daemon; a cluster also serving I/O keeps the default of 25.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=6400))]
    exec_cpu_percent: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Scratch directory for the cluster and the Parquet files (default: a new one under
    /// the temporary directory).
    #[arg(long)]
    scratch: Option<std::path::PathBuf>,
    /// Keep the scratch directory.
    #[arg(long)]
    keep: bool,
    /// Load the columns into an erasure-coded pool of this profile (`k=2,m=1`) instead of
    /// the replicated default, and run the offloaded configurations both shard-local (on
    /// each data shard's daemon) and on a decoded copy on the primary.
    #[arg(long, value_name = "PROFILE")]
    erasure: Option<String>,
}

/// Bytes the loopback interface received (every byte between the client, the daemons
/// and the monitor in an embedded cluster).
fn loopback_bytes() -> u64 {
    std::fs::read_to_string("/proc/net/dev")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.trim_start().starts_with("lo:"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds of this process (user + system): the client's.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return f64::NAN;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One configuration's best run.
struct Measured {
    config: Config,
    wall_s: f64,
    loopback_bytes: u64,
    payload_bytes: u64,
    cpu_s: f64,
}

fn say(line: &str) {
    eprintln!("ssb: {line}");
}

pub fn run(args: BenchSsbArgs) -> anyhow::Result<()> {
    use crate::common::{in_scratch_cluster, print_report, BenchResult};
    let sf = if args.quick { 1 } else { args.sf };
    let started = std::time::Instant::now();
    say(&format!("generating SF {sf} (seed {})", args.seed));
    let data = SsbData::generate(sf, args.seed);
    say(&format!(
        "{} lineorder rows in {} row groups ({:.1} s)",
        data.rows(),
        data.row_groups(),
        started.elapsed().as_secs_f64()
    ));
    let reference = q33_reference(&data);
    let programs = Programs::compile()?;
    let mut results = Vec::new();
    in_scratch_cluster("ssb", args.scratch.clone(), args.keep, |scratch| {
        say(&format!(
            "daemons' execution threads: {} % of a CPU each (--exec-cpu-percent)",
            args.exec_cpu_percent
        ));
        // Each daemon keeps about a third of the columns (primaries): room for all of it.
        let cache_mib = ((data.rows() as u64 * 16 / 3 * 2) >> 20) + 64;
        // The cluster lives in the scratch directory itself, which `in_scratch_cluster`
        // stops however this ends.
        let target = crate::common::up_scratch(
            scratch,
            32,
            spindle_cluster::SettingsArgs {
                exec_cache_mib: Some(cache_mib),
                exec_cpu_percent: Some(u64::from(args.exec_cpu_percent)),
                ..Default::default()
            },
        )?;
        say("DuckDB on Parquet files of the same data (local disk)");
        let duck = q33_duckdb(&data, &scratch.join("parquet"), args.rounds.max(1) + 1)?;
        anyhow::ensure!(
            duck.rows == reference,
            "DuckDB's answer differs from this generator's own computation:\nDuckDB {:?}\nhere {:?}",
            duck.rows,
            reference
        );
        say(&format!(
            "DuckDB {}: {} rows in {:.3} s",
            duck.version,
            duck.rows.len(),
            duck.seconds
        ));
        let rt = spindle_cluster::runtime()?;
        let measured: Vec<Measured> = rt.block_on(async {
            let client = target.client().await?;
            let pool = match &args.erasure {
                None => "default",
                Some(profile) => {
                    let p = spindle_cluster::parse_erasure_profile(profile, None)?;
                    spindle_cluster::create_ec_pool(&client, "ssbec", &p, 32).await?;
                    spindle_cluster::wait_clean(&client, std::time::Duration::from_secs(90))
                        .await?;
                    say(&format!(
                        "erasure-coded pool ssbec: k={}, m={}, stripe unit {} B",
                        p.k, p.m, p.stripe_unit
                    ));
                    "ssbec"
                }
            };
            let names = Names {
                prefix: "ssb".into(),
                sf,
            };
            let total = data.rows() as u64 * 16;
            let t = std::time::Instant::now();
            let last = std::sync::atomic::AtomicU64::new(0);
            load(&client, pool, &names, &data, |done| {
                let step = total / 10;
                let before = last.load(std::sync::atomic::Ordering::Relaxed);
                if done - before >= step {
                    last.store(done, std::sync::atomic::Ordering::Relaxed);
                    say(&format!("loaded {} of {} MB", done >> 20, total >> 20));
                }
            })
            .await?;
            say(&format!(
                "loaded {} MB of columns into pool {pool} in {:.1} s",
                total >> 20,
                t.elapsed().as_secs_f64()
            ));
            let mut out = Vec::new();
            let mut configs = Config::all(false);
            if args.erasure.is_some() {
                configs.extend(Config::all(true).into_iter().filter(|c| *c != Config::Pull));
            }
            for config in configs {
                // A cached configuration starts warm (one run fills the daemons' caches).
                if matches!(config, Config::Filter(o) | Config::Full(o) if o.cache) {
                    q33(&client, pool, &names, config, &programs, args.parallel).await?;
                }
                let mut best: Option<Measured> = None;
                for _ in 0..args.rounds.max(1) {
                    let (lo, cpu, t) = (loopback_bytes(), cpu_seconds(), std::time::Instant::now());
                    let r = q33(&client, pool, &names, config, &programs, args.parallel).await?;
                    let wall_s = t.elapsed().as_secs_f64();
                    let m = Measured {
                        config,
                        wall_s,
                        loopback_bytes: loopback_bytes().saturating_sub(lo),
                        payload_bytes: r.bytes_received + r.bytes_sent,
                        cpu_s: cpu_seconds() - cpu,
                    };
                    anyhow::ensure!(
                        r.rows == duck.rows,
                        "{}: the answer differs from DuckDB's:\n{:?}\nDuckDB: {:?}",
                        config.label(),
                        r.rows,
                        duck.rows
                    );
                    if best.as_ref().is_none_or(|b| m.wall_s < b.wall_s) {
                        best = Some(m);
                    }
                }
                let m = best.expect("one round at least");
                say(&format!(
                    "{}: {:.3} s, {:.1} MB over loopback, {:.1} MB of payload, client CPU {:.3} s; answer = DuckDB's",
                    config.label(),
                    m.wall_s,
                    m.loopback_bytes as f64 / 1e6,
                    m.payload_bytes as f64 / 1e6,
                    m.cpu_s
                ));
                out.push(m);
            }
            anyhow::Ok(out)
        })?;
        let pull = measured
            .iter()
            .find(|m| m.config == Config::Pull)
            .ok_or_else(|| anyhow::anyhow!("pull was not measured"))?;
        for m in &measured {
            let l = m.config.label();
            if m.config != Config::Pull {
                results.push(BenchResult::lower_is_better(
                    format!("Q3.3 SF{sf} {l}: wall"),
                    "s",
                    m.wall_s,
                    "pull",
                    pull.wall_s,
                ));
                results.push(BenchResult::lower_is_better(
                    format!("Q3.3 SF{sf} {l}: loopback bytes"),
                    "MB",
                    m.loopback_bytes as f64 / 1e6,
                    "pull",
                    pull.loopback_bytes as f64 / 1e6,
                ));
                results.push(BenchResult::lower_is_better(
                    format!("Q3.3 SF{sf} {l}: client payload bytes"),
                    "MB",
                    m.payload_bytes as f64 / 1e6,
                    "pull",
                    pull.payload_bytes as f64 / 1e6,
                ));
                results.push(BenchResult::lower_is_better(
                    format!("Q3.3 SF{sf} {l}: client CPU"),
                    "s",
                    m.cpu_s,
                    "pull",
                    pull.cpu_s,
                ));
            }
            results.push(BenchResult::lower_is_better(
                format!("Q3.3 SF{sf} {l}: wall vs DuckDB"),
                "s",
                m.wall_s,
                format!("DuckDB {} on local Parquet", duck.version),
                duck.seconds,
            ));
        }
        Ok(())
    })?;
    print_report("ssb", &results, args.json)
}
