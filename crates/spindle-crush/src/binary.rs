//! Ceph's compiled CRUSH map format (`crushtool -c` output, `CrushWrapper::encode` with
//! the features of Ceph 16): decoding and encoding.
//!
//! Invariant: `encode(decode(b)) == b` for maps without choose_args, and `encode` of a
//! compiled text map equals `crushtool -c` output byte for byte (tested against crushtool).
//! Decoding never panics: truncated or inconsistent input is a [`CrushError::Binary`].

use std::collections::BTreeMap;

use crate::error::CrushError;
use crate::map::{Bucket, BucketAlg, CrushMap, Rule, Step, Tunables};

/// `CRUSH_MAGIC`.
pub const MAGIC: u32 = 0x0001_0000;
/// Bound on table sizes read from untrusted input.
const MAX_ENTRIES: u32 = 1 << 20;

pub fn is_binary(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == MAGIC
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], CrushError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                CrushError::Binary(format!("truncated at byte {} reading {what}", self.pos))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, CrushError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, CrushError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, CrushError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self, what: &str) -> Result<i32, CrushError> {
        Ok(self.u32(what)? as i32)
    }
    fn count(&mut self, what: &str) -> Result<u32, CrushError> {
        let n = self.u32(what)?;
        if n > MAX_ENTRIES {
            return Err(CrushError::Binary(format!(
                "{what} count {n} is implausible"
            )));
        }
        Ok(n)
    }
    fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }
    fn string_map(&mut self, what: &str) -> Result<BTreeMap<i32, String>, CrushError> {
        let n = self.count(what)?;
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let key = self.i32(what)?;
            let mut len = self.u32(what)?;
            if len == 0 {
                // Old encodings wrote 64-bit keys; the string is never empty.
                len = self.u32(what)?;
            }
            if len > MAX_ENTRIES {
                return Err(CrushError::Binary(format!(
                    "{what} string length {len} is implausible"
                )));
            }
            let s = self.take(len as usize, what)?;
            let s = String::from_utf8(s.to_vec())
                .map_err(|_| CrushError::Binary(format!("{what}: name is not UTF-8")))?;
            m.insert(key, s);
        }
        Ok(m)
    }
    fn int_map(&mut self, what: &str) -> Result<BTreeMap<i32, i32>, CrushError> {
        let n = self.count(what)?;
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let k = self.i32(what)?;
            let v = self.i32(what)?;
            m.insert(k, v);
        }
        Ok(m)
    }
}

/// Decodes a compiled map.
pub fn decode(bytes: &[u8]) -> Result<CrushMap, CrushError> {
    let mut r = Reader { bytes, pos: 0 };
    if r.u32("magic")? != MAGIC {
        return Err(CrushError::Binary("bad magic number".to_string()));
    }
    let max_buckets = r.i32("max_buckets")?;
    let max_rules = r.u32("max_rules")?;
    let max_devices = r.i32("max_devices")?;
    if !(0..=MAX_ENTRIES as i32).contains(&max_buckets)
        || max_rules > 256
        || !(0..=crate::map::MAX_DEVICES).contains(&max_devices)
    {
        return Err(CrushError::Binary("implausible map dimensions".to_string()));
    }
    let mut map = CrushMap {
        tunables: Tunables::LEGACY,
        max_devices,
        ..CrushMap::default()
    };
    for index in 0..max_buckets as usize {
        let alg = r.u32("bucket alg")?;
        if alg == 0 {
            map.buckets.push(None);
            continue;
        }
        let id = r.i32("bucket id")?;
        let type_id = r.u16("bucket type")?;
        let alg_byte = r.u8("bucket alg")?;
        let hash = r.u8("bucket hash")?;
        let weight = r.u32("bucket weight")?;
        let size = r.count("bucket size")? as usize;
        let alg = BucketAlg::from_id(alg_byte)
            .ok_or_else(|| CrushError::Binary(format!("bucket {id}: unknown alg {alg_byte}")))?;
        if id != -1 - index as i32 {
            return Err(CrushError::Binary(format!(
                "bucket at index {index} has id {id}"
            )));
        }
        let mut items = Vec::with_capacity(size);
        for _ in 0..size {
            items.push(r.i32("bucket item")?);
        }
        let mut bucket = Bucket {
            id,
            type_id,
            alg,
            hash,
            weight,
            items,
            item_weights: Vec::new(),
            sum_weights: Vec::new(),
            node_weights: Vec::new(),
            straws: Vec::new(),
        };
        match alg {
            BucketAlg::Uniform => {
                let w = r.u32("uniform item weight")?;
                bucket.item_weights = vec![w; size];
            }
            BucketAlg::List => {
                for _ in 0..size {
                    bucket.item_weights.push(r.u32("list item weight")?);
                    bucket.sum_weights.push(r.u32("list sum weight")?);
                }
            }
            BucketAlg::Tree => {
                let num_nodes = r.u8("tree num_nodes")? as usize;
                for _ in 0..num_nodes {
                    bucket.node_weights.push(r.u32("tree node weight")?);
                }
                if size > 0 && num_nodes < 2 * size {
                    return Err(CrushError::Binary(format!(
                        "tree bucket {id}: too few nodes"
                    )));
                }
                bucket.item_weights = (0..size)
                    .map(|i| bucket.node_weights[crate::builder::tree_leaf_node(i)])
                    .collect();
            }
            BucketAlg::Straw => {
                for _ in 0..size {
                    bucket.item_weights.push(r.u32("straw item weight")?);
                    bucket.straws.push(r.u32("straw length")?);
                }
            }
            BucketAlg::Straw2 => {
                for _ in 0..size {
                    bucket.item_weights.push(r.u32("straw2 item weight")?);
                }
            }
        }
        map.buckets.push(Some(bucket));
    }
    for index in 0..max_rules {
        if r.u32("rule present")? == 0 {
            map.rules.push(None);
            continue;
        }
        let len = r.count("rule length")?;
        let ruleset = r.u8("ruleset")?;
        if u32::from(ruleset) != index {
            return Err(CrushError::Binary(format!(
                "rule {index}: ruleset {ruleset} != rule id"
            )));
        }
        let rule_type = r.u8("rule type")?;
        let min_size = r.u8("rule min_size")?;
        let max_size = r.u8("rule max_size")?;
        let mut steps = Vec::with_capacity(len as usize);
        for _ in 0..len {
            let op = r.u32("step op")?;
            let arg1 = r.i32("step arg1")?;
            let arg2 = r.i32("step arg2")?;
            steps.push(Step::decode(op, arg1, arg2).ok_or_else(|| {
                CrushError::Binary(format!("rule {index}: unknown step op {op}"))
            })?);
        }
        map.rules.push(Some(Rule {
            rule_type,
            min_size,
            max_size,
            steps,
        }));
    }
    map.type_names = r.string_map("type names")?;
    map.item_names = r.string_map("item names")?;
    map.rule_names = r.string_map("rule names")?;
    let t = &mut map.tunables;
    if !r.at_end() {
        t.choose_local_tries = r.u32("choose_local_tries")?;
        t.choose_local_fallback_tries = r.u32("choose_local_fallback_tries")?;
        t.choose_total_tries = r.u32("choose_total_tries")?;
    }
    if !r.at_end() {
        t.chooseleaf_descend_once = r.u32("chooseleaf_descend_once")?;
    }
    if !r.at_end() {
        t.chooseleaf_vary_r = r.u8("chooseleaf_vary_r")?;
    }
    if !r.at_end() {
        t.straw_calc_version = r.u8("straw_calc_version")?;
    }
    if !r.at_end() {
        t.allowed_bucket_algs = r.u32("allowed_bucket_algs")?;
    }
    if !r.at_end() {
        t.chooseleaf_stable = r.u8("chooseleaf_stable")?;
    }
    if !r.at_end() {
        map.class_map = r.int_map("class map")?;
        map.class_names = r.string_map("class names")?;
        let n = r.count("class buckets")?;
        for _ in 0..n {
            let orig = r.i32("class bucket")?;
            let m = r.int_map("class bucket")?;
            map.class_bucket.insert(orig, m);
        }
    }
    if !r.at_end() {
        let n = r.u32("choose_args")?;
        if n != 0 {
            return Err(CrushError::Binary(
                "choose_args (weight sets) are not supported".to_string(),
            ));
        }
    }
    Ok(map)
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_string_map(out: &mut Vec<u8>, m: &BTreeMap<i32, String>) {
    put_u32(out, m.len() as u32);
    for (k, v) in m {
        put_u32(out, *k as u32);
        put_u32(out, v.len() as u32);
        out.extend_from_slice(v.as_bytes());
    }
}

fn put_int_map(out: &mut Vec<u8>, m: &BTreeMap<i32, i32>) {
    put_u32(out, m.len() as u32);
    for (k, v) in m {
        put_u32(out, *k as u32);
        put_u32(out, *v as u32);
    }
}

/// Encodes a map as Ceph 16's `crushtool -c` writes it.
pub fn encode(map: &CrushMap) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, MAGIC);
    put_u32(&mut out, map.buckets.len() as u32);
    put_u32(&mut out, map.rules.len() as u32);
    put_u32(&mut out, map.max_devices as u32);
    for bucket in &map.buckets {
        let Some(b) = bucket else {
            put_u32(&mut out, 0);
            continue;
        };
        put_u32(&mut out, b.alg as u32);
        put_u32(&mut out, b.id as u32);
        out.extend_from_slice(&b.type_id.to_le_bytes());
        out.push(b.alg as u8);
        out.push(b.hash);
        put_u32(&mut out, b.weight);
        put_u32(&mut out, b.items.len() as u32);
        for &item in &b.items {
            put_u32(&mut out, item as u32);
        }
        match b.alg {
            BucketAlg::Uniform => put_u32(&mut out, b.item_weights.first().copied().unwrap_or(0)),
            BucketAlg::List => {
                for (w, s) in b.item_weights.iter().zip(&b.sum_weights) {
                    put_u32(&mut out, *w);
                    put_u32(&mut out, *s);
                }
            }
            BucketAlg::Tree => {
                out.push(b.node_weights.len() as u8);
                for &w in &b.node_weights {
                    put_u32(&mut out, w);
                }
            }
            BucketAlg::Straw => {
                for (w, s) in b.item_weights.iter().zip(&b.straws) {
                    put_u32(&mut out, *w);
                    put_u32(&mut out, *s);
                }
            }
            BucketAlg::Straw2 => {
                for &w in &b.item_weights {
                    put_u32(&mut out, w);
                }
            }
        }
    }
    for (index, rule) in map.rules.iter().enumerate() {
        let Some(rule) = rule else {
            put_u32(&mut out, 0);
            continue;
        };
        put_u32(&mut out, 1);
        put_u32(&mut out, rule.steps.len() as u32);
        out.push(index as u8);
        out.push(rule.rule_type);
        out.push(rule.min_size);
        out.push(rule.max_size);
        for step in &rule.steps {
            let (op, a1, a2) = step.encode();
            put_u32(&mut out, op);
            put_u32(&mut out, a1 as u32);
            put_u32(&mut out, a2 as u32);
        }
    }
    put_string_map(&mut out, &map.type_names);
    put_string_map(&mut out, &map.item_names);
    put_string_map(&mut out, &map.rule_names);
    let t = &map.tunables;
    put_u32(&mut out, t.choose_local_tries);
    put_u32(&mut out, t.choose_local_fallback_tries);
    put_u32(&mut out, t.choose_total_tries);
    put_u32(&mut out, t.chooseleaf_descend_once);
    out.push(t.chooseleaf_vary_r);
    out.push(t.straw_calc_version);
    put_u32(&mut out, t.allowed_bucket_algs);
    out.push(t.chooseleaf_stable);
    put_int_map(&mut out, &map.class_map);
    put_string_map(&mut out, &map.class_names);
    put_u32(&mut out, map.class_bucket.len() as u32);
    for (orig, m) in &map.class_bucket {
        put_u32(&mut out, *orig as u32);
        put_int_map(&mut out, m);
    }
    put_u32(&mut out, 0); // choose_args
    out
}
