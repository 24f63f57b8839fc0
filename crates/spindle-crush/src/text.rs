//! The decompiled text format of `crushtool -d`: a parser that compiles it exactly as
//! Ceph's `CrushCompiler::compile` does, and a printer that writes exactly what
//! `CrushCompiler::decompile` writes, so `print(parse(t))` of crushtool output is `t`.
//!
//! Errors name the 1-based line and what was expected. `choose_args` sections are
//! rejected with a clear error (weight sets are not supported yet).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::builder::{add_bucket, make_bucket, MAX_BUCKET_WEIGHT_16_16, MAX_DEVICE_WEIGHT_16_16};
use crate::classes::{item_weight_at, populate_classes};
use crate::error::CrushError;
use crate::map::{
    BucketAlg, CrushMap, Rule, Step, Tunables, LEGACY_ALLOWED_BUCKET_ALGS, RULE_TYPE_ERASURE,
    RULE_TYPE_REPLICATED,
};

#[derive(Debug, Clone)]
struct Token {
    text: String,
    line: usize,
}

fn tokenize(input: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    for (index, raw) in input.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("");
        let mut current = String::new();
        for ch in content.chars() {
            if ch.is_whitespace() || matches!(ch, '{' | '}' | '[' | ']') {
                if !current.is_empty() {
                    tokens.push(Token {
                        text: std::mem::take(&mut current),
                        line,
                    });
                }
                if !ch.is_whitespace() {
                    tokens.push(Token {
                        text: ch.to_string(),
                        line,
                    });
                }
            } else {
                current.push(ch);
            }
        }
        if !current.is_empty() {
            tokens.push(Token {
                text: current,
                line,
            });
        }
    }
    tokens
}

struct Cursor {
    tokens: Vec<Token>,
    pos: usize,
    last_line: usize,
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Cursor {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn line(&self) -> usize {
        self.peek().map_or(self.last_line, |t| t.line)
    }

    fn error(&self, expected: &str) -> CrushError {
        let found = match self.peek() {
            Some(t) => format!("'{}'", t.text),
            None => "end of file".to_string(),
        };
        CrushError::Parse {
            line: self.line(),
            message: format!("expected {expected}, found {found}"),
        }
    }

    fn next(&mut self, expected: &str) -> Result<Token, CrushError> {
        match self.tokens.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.clone())
            }
            None => Err(self.error(expected)),
        }
    }

    fn keyword(&mut self, word: &str) -> Result<usize, CrushError> {
        match self.peek() {
            Some(t) if t.text == word => {
                let line = t.line;
                self.pos += 1;
                Ok(line)
            }
            _ => Err(self.error(&format!("'{word}'"))),
        }
    }

    fn accept(&mut self, word: &str) -> bool {
        if self.peek().is_some_and(|t| t.text == word) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn name(&mut self, what: &str) -> Result<Token, CrushError> {
        match self.peek() {
            Some(t) if is_name(&t.text) && !matches!(t.text.as_str(), "{" | "}") => self.next(what),
            _ => Err(self.error(what)),
        }
    }

    fn int(&mut self, what: &str) -> Result<(i64, usize), CrushError> {
        let valid = self.peek().is_some_and(|t| {
            let digits = t.text.strip_prefix('-').unwrap_or(&t.text);
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
        });
        if !valid {
            return Err(self.error(what));
        }
        let t = self.next(what)?;
        let value = t.text.parse::<i64>().map_err(|_| CrushError::Parse {
            line: t.line,
            message: format!("{what} '{}' is out of range", t.text),
        })?;
        Ok((value, t.line))
    }

    fn int_in(&mut self, what: &str, min: i64, max: i64) -> Result<i64, CrushError> {
        let (value, line) = self.int(what)?;
        if value < min || value > max {
            return Err(CrushError::Parse {
                line,
                message: format!("{what} {value} is out of range {min}..={max}"),
            });
        }
        Ok(value)
    }

    fn real(&mut self, what: &str) -> Result<(f32, usize), CrushError> {
        let ok = self.peek().is_some_and(|t| {
            let s = t.text.as_str();
            !s.is_empty()
                && s.chars().all(|c| c.is_ascii_digit() || c == '.')
                && s.chars().any(|c| c.is_ascii_digit())
                && s.matches('.').count() <= 1
        });
        if !ok {
            return Err(self.error(what));
        }
        let t = self.next(what)?;
        let value = t.text.parse::<f32>().map_err(|_| CrushError::Parse {
            line: t.line,
            message: format!("invalid {what} '{}'", t.text),
        })?;
        Ok((value, t.line))
    }
}

// ---------------------------------------------------------------------------------------
// Abstract syntax.

#[derive(Debug, Clone)]
struct ItemLine {
    name: String,
    weight: Option<f32>,
    pos: Option<i64>,
    line: usize,
}

#[derive(Debug, Clone)]
struct BucketDef {
    type_name: String,
    name: String,
    id: Option<i32>,
    class_ids: Vec<(String, i32, usize)>,
    alg: Option<BucketAlg>,
    hash: u8,
    items: Vec<ItemLine>,
    line: usize,
}

#[derive(Debug, Clone)]
enum StepDef {
    Take {
        item: String,
        class: Option<String>,
        line: usize,
    },
    Choose {
        leaf: bool,
        firstn: bool,
        num: i32,
        type_name: String,
        line: usize,
    },
    Emit,
    Noop,
    Set {
        step: Step,
    },
}

#[derive(Debug, Clone)]
struct RuleDef {
    name: Option<String>,
    id: i32,
    rule_type: u8,
    min_size: u8,
    max_size: u8,
    steps: Vec<StepDef>,
    line: usize,
}

#[derive(Debug, Clone)]
enum Stmt {
    Tunable {
        name: String,
        value: i64,
        line: usize,
    },
    Device {
        id: i32,
        name: String,
        class: Option<String>,
        line: usize,
    },
    Type {
        id: i32,
        name: String,
    },
    Bucket(BucketDef),
    Rule(RuleDef),
}

fn parse_stmts(input: &str) -> Result<Vec<Stmt>, CrushError> {
    let tokens = tokenize(input);
    let last_line = input.lines().count().max(1);
    let mut c = Cursor {
        tokens,
        pos: 0,
        last_line,
    };
    let mut stmts = Vec::new();
    while let Some(tok) = c.peek().cloned() {
        match tok.text.as_str() {
            "tunable" => {
                c.pos += 1;
                let name = c.name("tunable name")?.text;
                let (value, _) = c.int("tunable value")?;
                stmts.push(Stmt::Tunable {
                    name,
                    value,
                    line: tok.line,
                });
            }
            "device" => {
                c.pos += 1;
                let id = c.int_in("device id", 0, i64::from(i32::MAX) - 1)? as i32;
                let name = c.name("device name")?.text;
                let class = if c.accept("class") {
                    Some(c.name("class name")?.text)
                } else {
                    None
                };
                stmts.push(Stmt::Device {
                    id,
                    name,
                    class,
                    line: tok.line,
                });
            }
            "type" => {
                c.pos += 1;
                let id = c.int_in("type id", 0, i64::from(u16::MAX))? as i32;
                let name = c.name("type name")?.text;
                stmts.push(Stmt::Type { id, name });
            }
            "rule" => {
                c.pos += 1;
                stmts.push(Stmt::Rule(parse_rule(&mut c, tok.line)?));
            }
            "choose_args" => {
                return Err(CrushError::Parse {
                    line: tok.line,
                    message: "choose_args (weight sets) are not supported".to_string(),
                });
            }
            "{" | "}" | "[" | "]" => {
                return Err(c.error("'tunable', 'device', 'type', a bucket or 'rule'"));
            }
            _ if is_name(&tok.text) => {
                c.pos += 1;
                stmts.push(Stmt::Bucket(parse_bucket(
                    &mut c,
                    tok.text.clone(),
                    tok.line,
                )?));
            }
            _ => return Err(c.error("'tunable', 'device', 'type', a bucket or 'rule'")),
        }
    }
    Ok(stmts)
}

fn parse_bucket(c: &mut Cursor, type_name: String, line: usize) -> Result<BucketDef, CrushError> {
    let name = c.name("bucket name")?.text;
    c.keyword("{")?;
    let mut def = BucketDef {
        type_name,
        name,
        id: None,
        class_ids: Vec::new(),
        alg: None,
        hash: 0,
        items: Vec::new(),
        line,
    };
    loop {
        let tok = c.next("'id', 'alg', 'hash', 'item' or '}'")?;
        match tok.text.as_str() {
            "}" => break,
            "id" => {
                let id = c.int_in("bucket id", i64::from(i32::MIN) + 1, -1)? as i32;
                if c.accept("class") {
                    let class = c.name("class name")?.text;
                    def.class_ids.push((class, id, tok.line));
                } else {
                    def.id = Some(id);
                }
            }
            "alg" => {
                let alg_tok = c.name("bucket algorithm")?;
                def.alg =
                    Some(
                        BucketAlg::from_name(&alg_tok.text).ok_or_else(|| CrushError::Parse {
                            line: alg_tok.line,
                            message: format!(
                        "unknown bucket alg '{}' (expected uniform, list, tree, straw or straw2)",
                        alg_tok.text
                    ),
                        })?,
                    );
            }
            "hash" => {
                if c.accept("rjenkins1") {
                    def.hash = 0;
                } else {
                    let (h, hl) = c.int("hash id")?;
                    if h != 0 {
                        return Err(CrushError::Parse {
                            line: hl,
                            message: format!("unknown hash {h} (only 0, rjenkins1, exists)"),
                        });
                    }
                    def.hash = 0;
                }
            }
            "item" => {
                let name = c.name("item name")?.text;
                let mut item = ItemLine {
                    name,
                    weight: None,
                    pos: None,
                    line: tok.line,
                };
                loop {
                    if c.accept("weight") {
                        item.weight = Some(c.real("item weight")?.0);
                    } else if c.accept("pos") {
                        item.pos = Some(c.int_in("item pos", 0, 65535)?);
                    } else {
                        break;
                    }
                }
                def.items.push(item);
            }
            _ => {
                return Err(CrushError::Parse {
                    line: tok.line,
                    message: format!(
                        "expected 'id', 'alg', 'hash', 'item' or '}}' in bucket '{}', found '{}'",
                        def.name, tok.text
                    ),
                })
            }
        }
    }
    Ok(def)
}

fn parse_rule(c: &mut Cursor, line: usize) -> Result<RuleDef, CrushError> {
    let name = if c.peek().is_some_and(|t| t.text != "{") {
        Some(c.name("rule name")?.text)
    } else {
        None
    };
    c.keyword("{")?;
    if !c.accept("id") {
        c.keyword("ruleset").map_err(|_| c.error("'id'"))?;
    }
    let id = c.int_in("rule id", 0, 255)? as i32;
    c.keyword("type")?;
    let type_tok = c.next("rule type")?;
    let rule_type = match type_tok.text.as_str() {
        "replicated" => RULE_TYPE_REPLICATED,
        "erasure" => RULE_TYPE_ERASURE,
        other => {
            return Err(CrushError::Parse {
                line: type_tok.line,
                message: format!("expected rule type 'replicated' or 'erasure', found '{other}'"),
            })
        }
    };
    let mut min_size = 1u8;
    let mut max_size = 100u8;
    if c.accept("min_size") {
        min_size = c.int_in("min_size", 0, 255)? as u8;
    }
    if c.accept("max_size") {
        max_size = c.int_in("max_size", 0, 255)? as u8;
    }
    let mut steps = Vec::new();
    loop {
        let tok = c.next("'step' or '}'")?;
        match tok.text.as_str() {
            "}" => break,
            "step" => steps.push(parse_step(c)?),
            other => {
                return Err(CrushError::Parse {
                    line: tok.line,
                    message: format!("expected 'step' or '}}' in rule, found '{other}'"),
                })
            }
        }
    }
    Ok(RuleDef {
        name,
        id,
        rule_type,
        min_size,
        max_size,
        steps,
        line,
    })
}

fn parse_step(c: &mut Cursor) -> Result<StepDef, CrushError> {
    let tok = c.next("a step (take, choose, chooseleaf, emit, set_...)")?;
    let line = tok.line;
    let set = |c: &mut Cursor, f: fn(i32) -> Step| -> Result<StepDef, CrushError> {
        let v = c.int_in("step value", 0, i64::from(i32::MAX))? as i32;
        Ok(StepDef::Set { step: f(v) })
    };
    match tok.text.as_str() {
        "take" => {
            let item = c.name("item name after 'take'")?.text;
            let class = if c.accept("class") {
                Some(c.name("class name")?.text)
            } else {
                None
            };
            Ok(StepDef::Take { item, class, line })
        }
        "choose" | "chooseleaf" => {
            let leaf = tok.text == "chooseleaf";
            let mode = c.next("'firstn' or 'indep'")?;
            let firstn = match mode.text.as_str() {
                "firstn" => true,
                "indep" => false,
                other => {
                    return Err(CrushError::Parse {
                        line: mode.line,
                        message: format!("expected 'firstn' or 'indep', found '{other}'"),
                    })
                }
            };
            let num = c.int_in("replica count", -1024, 1024)? as i32;
            c.keyword("type")?;
            let type_name = c.name("type name")?.text;
            Ok(StepDef::Choose {
                leaf,
                firstn,
                num,
                type_name,
                line,
            })
        }
        "emit" => Ok(StepDef::Emit),
        "noop" => Ok(StepDef::Noop),
        "set_choose_tries" => set(c, Step::SetChooseTries),
        "set_chooseleaf_tries" => set(c, Step::SetChooseLeafTries),
        "set_choose_local_tries" => set(c, Step::SetChooseLocalTries),
        "set_choose_local_fallback_tries" => set(c, Step::SetChooseLocalFallbackTries),
        "set_chooseleaf_vary_r" => set(c, Step::SetChooseLeafVaryR),
        "set_chooseleaf_stable" => set(c, Step::SetChooseLeafStable),
        other => Err(CrushError::Parse {
            line,
            message: format!(
                "unknown step '{other}' (expected take, choose, chooseleaf, emit or set_...)"
            ),
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Compilation (semantics of CrushCompiler::parse_crush).

fn perr(line: usize, message: String) -> CrushError {
    CrushError::Parse { line, message }
}

/// Compiles a text map as `crushtool -c` does. Starts from the legacy tunables, like Ceph,
/// so a map without `tunable` lines keeps its historical meaning.
pub fn parse_text(input: &str) -> Result<CrushMap, CrushError> {
    let mut stmts = parse_stmts(input)?;
    adjust_bucket_order(&mut stmts)?;

    let mut map = CrushMap {
        tunables: Tunables::LEGACY,
        ..CrushMap::default()
    };
    let mut item_id: HashMap<String, i32> = HashMap::new();
    let mut used_ids: BTreeMap<i32, ()> = BTreeMap::new();
    let mut item_weight: HashMap<i32, u32> = HashMap::new();
    let mut type_id: HashMap<String, i32> = HashMap::new();
    let mut rule_id: HashMap<String, i32> = HashMap::new();
    let mut class_bucket: BTreeMap<i32, BTreeMap<i32, i32>> = BTreeMap::new();
    let mut saw_rule = false;

    // Ids that buckets claim explicitly are reserved before any is assigned automatically.
    for stmt in &stmts {
        if let Stmt::Bucket(b) = stmt {
            if let Some(id) = b.id {
                used_ids.insert(id, ());
            }
        }
    }

    for stmt in &stmts {
        match stmt {
            Stmt::Tunable { name, value, line } => {
                let v = *value;
                let t = &mut map.tunables;
                let small = |v: i64| -> Result<u8, CrushError> {
                    u8::try_from(v)
                        .map_err(|_| perr(*line, format!("tunable {name} value {v} out of range")))
                };
                let big = |v: i64| -> Result<u32, CrushError> {
                    u32::try_from(v)
                        .map_err(|_| perr(*line, format!("tunable {name} value {v} out of range")))
                };
                match name.as_str() {
                    "choose_local_tries" => t.choose_local_tries = big(v)?,
                    "choose_local_fallback_tries" => t.choose_local_fallback_tries = big(v)?,
                    "choose_total_tries" => t.choose_total_tries = big(v)?,
                    "chooseleaf_descend_once" => t.chooseleaf_descend_once = big(v)?,
                    "chooseleaf_vary_r" => t.chooseleaf_vary_r = small(v)?,
                    "chooseleaf_stable" => t.chooseleaf_stable = small(v)?,
                    "straw_calc_version" => t.straw_calc_version = small(v)?,
                    "allowed_bucket_algs" => t.allowed_bucket_algs = big(v)?,
                    _ => return Err(perr(*line, format!("tunable '{name}' not recognized"))),
                }
            }
            Stmt::Device {
                id,
                name,
                class,
                line,
            } => {
                if item_id.contains_key(name) {
                    return Err(perr(*line, format!("item '{name}' defined twice")));
                }
                if map.item_names.contains_key(id) {
                    return Err(perr(*line, format!("device id {id} defined twice")));
                }
                map.item_names.insert(*id, name.clone());
                item_id.insert(name.clone(), *id);
                if let Some(class) = class {
                    let cid = get_or_create_class(&mut map, class);
                    map.class_map.insert(*id, cid);
                }
            }
            Stmt::Type { id, name } => {
                type_id.insert(name.clone(), *id);
                map.type_names.insert(*id, name.clone());
            }
            Stmt::Bucket(def) => {
                if saw_rule {
                    return Err(perr(
                        def.line,
                        "buckets must be defined before rules".to_string(),
                    ));
                }
                compile_bucket(
                    &mut map,
                    def,
                    &mut item_id,
                    &mut used_ids,
                    &mut item_weight,
                    &type_id,
                    &mut class_bucket,
                )?;
            }
            Stmt::Rule(def) => {
                if !saw_rule {
                    saw_rule = true;
                    // crushtool ignores a failure here (partial shadow trees); so do we, to
                    // compile to the same map. Rules needing a missing shadow fail below.
                    let _ = populate_classes(&mut map, &class_bucket);
                }
                compile_rule(&mut map, def, &item_id, &type_id, &mut rule_id)?;
            }
        }
    }
    map.finalize();
    map.validate()
        .map_err(|e| perr(input.lines().count().max(1), e.to_string()))?;
    Ok(map)
}

fn get_or_create_class(map: &mut CrushMap, class: &str) -> i32 {
    if let Some(id) = map.class_id(class) {
        return id;
    }
    let id = map
        .class_names
        .keys()
        .next_back()
        .map_or(0, |last| last + 1);
    map.class_names.insert(id, class.to_string());
    id
}

/// Ceph's `adjust_bucket_item_place`: swaps bucket definitions so that a bucket defined
/// before one of its items comes after it (with Ceph's exact, position-keyed swapping).
fn adjust_bucket_order(stmts: &mut [Stmt]) -> Result<(), CrushError> {
    let mut names = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut contents: HashMap<String, Vec<String>> = HashMap::new();
    for (index, stmt) in stmts.iter().enumerate() {
        if let Stmt::Bucket(b) = stmt {
            names.push(b.name.clone());
            position.insert(b.name.clone(), index);
            contents.insert(
                b.name.clone(),
                b.items.iter().map(|i| i.name.clone()).collect(),
            );
        }
    }
    for i in 0..names.len() {
        for j in i + 1..names.len() {
            let i_has_j = contents[&names[i]].contains(&names[j]);
            if i_has_j {
                if contents[&names[j]].contains(&names[i]) {
                    let line = match &stmts[position[&names[i]]] {
                        Stmt::Bucket(b) => b.line,
                        _ => 0,
                    };
                    return Err(perr(
                        line,
                        format!(
                            "bucket '{}' and bucket '{}' contain each other",
                            names[i], names[j]
                        ),
                    ));
                }
                stmts.swap(position[&names[i]], position[&names[j]]);
            }
        }
    }
    Ok(())
}

fn compile_bucket(
    map: &mut CrushMap,
    def: &BucketDef,
    item_id: &mut HashMap<String, i32>,
    used_ids: &mut BTreeMap<i32, ()>,
    item_weight: &mut HashMap<i32, u32>,
    type_id: &HashMap<String, i32>,
    class_bucket: &mut BTreeMap<i32, BTreeMap<i32, i32>>,
) -> Result<(), CrushError> {
    let type_value = *type_id.get(&def.type_name).ok_or_else(|| {
        perr(
            def.line,
            format!("bucket type '{}' is not defined", def.type_name),
        )
    })?;
    if item_id.contains_key(&def.name) {
        return Err(perr(
            def.line,
            format!("bucket or device '{}' is already defined", def.name),
        ));
    }
    let alg = def
        .alg
        .ok_or_else(|| perr(def.line, format!("bucket '{}' has no 'alg' line", def.name)))?;
    let mut class_ids: BTreeMap<i32, i32> = BTreeMap::new();
    for (class, id, line) in &def.class_ids {
        let cid = get_or_create_class(map, class);
        if class_ids.insert(cid, *id).is_some() {
            return Err(perr(
                *line,
                format!("duplicate device class {class} for bucket {}", def.name),
            ));
        }
    }
    // Positions: explicit `pos` values first, the rest fill the gaps in order.
    let mut used_pos = std::collections::BTreeSet::new();
    for item in &def.items {
        if let Some(pos) = item.pos {
            if !used_pos.insert(pos) {
                return Err(perr(
                    item.line,
                    format!(
                        "item '{}' in bucket '{}' has explicit pos {pos}, which is occupied",
                        item.name, def.name
                    ),
                ));
            }
        }
    }
    let mut size = def.items.len();
    if let Some(&max_pos) = used_pos.iter().next_back() {
        size = size.max(max_pos as usize);
    }
    let mut items = vec![0i32; size];
    let mut weights = vec![0u32; size];
    let mut curpos = 0i64;
    let mut bucket_weight = 0u32;
    let mut uniform_weight: Option<u32> = None;
    for item in &def.items {
        let id = *item_id.get(&item.name).ok_or_else(|| {
            perr(
                item.line,
                format!(
                    "item '{}' in bucket '{}' is not defined",
                    item.name, def.name
                ),
            )
        })?;
        let mut weight = item_weight.get(&id).copied().unwrap_or(0x10000);
        if let Some(w) = item.weight {
            // Ceph: float multiply, then truncation to unsigned.
            let scaled = w * 65536.0f32;
            let limit = if id >= 0 {
                MAX_DEVICE_WEIGHT_16_16
            } else {
                MAX_BUCKET_WEIGHT_16_16
            };
            if f64::from(scaled) > limit as f64 {
                let what = if id >= 0 {
                    "device weight limited to 100"
                } else {
                    "bucket weight limited to 65535"
                };
                return Err(perr(item.line, format!("item '{}': {what}", item.name)));
            }
            weight = scaled as u32;
        }
        if alg == BucketAlg::Uniform {
            match uniform_weight {
                None => uniform_weight = Some(weight),
                Some(u) if u != weight => {
                    return Err(perr(
                        item.line,
                        format!(
                            "item '{}' in uniform bucket '{}' has weight {} but previous item(s) have weight {}; uniform bucket items must all have identical weights",
                            item.name, def.name, weight as f32 / 65536.0, u as f32 / 65536.0
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        let pos = match item.pos {
            Some(p) if p as usize >= size => {
                return Err(perr(
                    item.line,
                    format!(
                        "item '{}' in bucket '{}' has pos {p} >= size {size}",
                        item.name, def.name
                    ),
                ))
            }
            Some(p) => p,
            None => {
                while used_pos.contains(&curpos) {
                    curpos += 1;
                }
                curpos += 1;
                curpos - 1
            }
        };
        items[pos as usize] = id;
        weights[pos as usize] = weight;
        bucket_weight = bucket_weight.checked_add(weight).ok_or_else(|| {
            perr(
                item.line,
                format!(
                    "weights of bucket '{}' overflow; lower the item weights",
                    def.name
                ),
            )
        })?;
    }
    let id = match def.id {
        Some(id) => id,
        None => {
            let mut id = -1;
            while used_ids.contains_key(&id) {
                id -= 1;
            }
            id
        }
    };
    let bucket = make_bucket(
        alg,
        def.hash,
        type_value as u16,
        &items,
        &weights,
        map.tunables.straw_calc_version,
    )
    .map_err(|e| perr(def.line, format!("bucket '{}': {e}", def.name)))?;
    add_bucket(map, id, bucket)
        .map_err(|e| perr(def.line, format!("bucket '{}': {e}", def.name)))?;
    used_ids.insert(id, ());
    item_id.insert(def.name.clone(), id);
    item_weight.insert(id, bucket_weight);
    map.item_names.insert(id, def.name.clone());
    if !class_ids.is_empty() {
        class_bucket.insert(id, class_ids);
    }
    Ok(())
}

fn compile_rule(
    map: &mut CrushMap,
    def: &RuleDef,
    item_id: &HashMap<String, i32>,
    type_id: &HashMap<String, i32>,
    rule_id: &mut HashMap<String, i32>,
) -> Result<(), CrushError> {
    let rname = def.name.clone().unwrap_or_default();
    if let Some(name) = &def.name {
        if rule_id.contains_key(name) {
            return Err(perr(
                def.line,
                format!("rule name '{name}' already defined"),
            ));
        }
    }
    if map.rule(def.id).is_some() {
        return Err(perr(def.line, format!("rule {} already exists", def.id)));
    }
    let mut steps = Vec::with_capacity(def.steps.len());
    for step in &def.steps {
        steps.push(match step {
            StepDef::Take { item, class, line } => {
                let mut id = *item_id
                    .get(item)
                    .ok_or_else(|| perr(*line, format!("in rule '{rname}' item '{item}' not defined")))?;
                if let Some(class) = class {
                    let cid = map
                        .class_id(class)
                        .ok_or_else(|| perr(*line, format!("in rule '{rname}' class '{class}' does not exist")))?;
                    let by_class = map.class_bucket.get(&id).ok_or_else(|| {
                        perr(*line, format!("in rule '{rname}' step take {item} has no class information"))
                    })?;
                    id = *by_class.get(&cid).ok_or_else(|| {
                        perr(*line, format!("in rule '{rname}' step take {item} no matching bucket for class {class}"))
                    })?;
                }
                Step::Take { item: id }
            }
            StepDef::Choose { leaf, firstn, num, type_name, line } => {
                let t = *type_id
                    .get(type_name)
                    .ok_or_else(|| perr(*line, format!("in rule '{rname}' type '{type_name}' not defined")))?;
                let (num, type_id) = (*num, t);
                match (leaf, firstn) {
                    (false, true) => Step::ChooseFirstN { num, type_id },
                    (false, false) => Step::ChooseIndep { num, type_id },
                    (true, true) => Step::ChooseLeafFirstN { num, type_id },
                    (true, false) => Step::ChooseLeafIndep { num, type_id },
                }
            }
            StepDef::Emit => Step::Emit,
            StepDef::Noop => Step::Noop,
            StepDef::Set { step } => *step,
        });
    }
    let index = def.id as usize;
    if map.rules.len() <= index {
        map.rules.resize(index + 1, None);
    }
    map.rules[index] = Some(Rule {
        rule_type: def.rule_type,
        min_size: def.min_size,
        max_size: def.max_size,
        steps,
    });
    if let Some(name) = &def.name {
        map.rule_names.insert(def.id, name.clone());
        rule_id.insert(name.clone(), def.id);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Decompilation (CrushCompiler::decompile).

/// Formats a 16.16 weight as `%.3f` of its single-precision value, as Ceph does.
pub fn format_weight(weight: u32) -> String {
    let value = f64::from(weight as i32 as f32 / 65536.0f32);
    format!("{value:.3}")
}

fn type_name(map: &CrushMap, t: i32) -> String {
    match map.type_names.get(&t) {
        Some(n) => n.clone(),
        None if t == 0 => "device".to_string(),
        None => format!("type{t}"),
    }
}

fn item_name(map: &CrushMap, id: i32) -> String {
    match map.item_names.get(&id) {
        Some(n) => n.clone(),
        None if id >= 0 => format!("device{id}"),
        None => format!("bucket{}", -1 - i64::from(id)),
    }
}

/// Prints the map in the text format `crushtool -d` writes.
pub fn print_text(map: &CrushMap) -> String {
    let mut out = String::new();
    let t = &map.tunables;
    out.push_str("# begin crush map\n");
    let l = Tunables::LEGACY;
    if t.choose_local_tries != l.choose_local_tries {
        let _ = writeln!(out, "tunable choose_local_tries {}", t.choose_local_tries);
    }
    if t.choose_local_fallback_tries != l.choose_local_fallback_tries {
        let _ = writeln!(
            out,
            "tunable choose_local_fallback_tries {}",
            t.choose_local_fallback_tries
        );
    }
    if t.choose_total_tries != l.choose_total_tries {
        let _ = writeln!(out, "tunable choose_total_tries {}", t.choose_total_tries);
    }
    if t.chooseleaf_descend_once != 0 {
        let _ = writeln!(
            out,
            "tunable chooseleaf_descend_once {}",
            t.chooseleaf_descend_once
        );
    }
    if t.chooseleaf_vary_r != 0 {
        let _ = writeln!(out, "tunable chooseleaf_vary_r {}", t.chooseleaf_vary_r);
    }
    if t.chooseleaf_stable != 0 {
        let _ = writeln!(out, "tunable chooseleaf_stable {}", t.chooseleaf_stable);
    }
    if t.straw_calc_version != 0 {
        let _ = writeln!(out, "tunable straw_calc_version {}", t.straw_calc_version);
    }
    if t.allowed_bucket_algs != LEGACY_ALLOWED_BUCKET_ALGS {
        let _ = writeln!(out, "tunable allowed_bucket_algs {}", t.allowed_bucket_algs);
    }

    out.push_str("\n# devices\n");
    for id in 0..map.max_devices {
        if let Some(name) = map.item_names.get(&id) {
            let _ = write!(out, "device {id} {name}");
            if let Some(class) = map.class_map.get(&id).and_then(|c| map.class_names.get(c)) {
                let _ = write!(out, " class {class}");
            }
            out.push('\n');
        }
    }

    out.push_str("\n# types\n");
    // Ceph walks ids upward from 0 until every name is printed, naming a missing type 0
    // "osd"; negative ids (only possible in a corrupted binary map) are never printed.
    if !map.type_names.is_empty() && !map.type_names.contains_key(&0) {
        out.push_str("type 0 osd\n");
    }
    for (id, name) in map.type_names.range(0..) {
        let _ = writeln!(out, "type {id} {name}");
    }

    out.push_str("\n# buckets\n");
    let mut done = vec![false; map.buckets.len()];
    for index in 0..map.buckets.len() {
        print_bucket_tree(map, -1 - index as i32, &mut done, &mut out);
    }

    out.push_str("\n# rules\n");
    for (id, rule) in map.rules.iter().enumerate() {
        let Some(rule) = rule else { continue };
        let id = id as i32;
        out.push_str("rule ");
        if let Some(name) = map.rule_names.get(&id) {
            out.push_str(name);
        }
        out.push_str(" {\n");
        let _ = writeln!(out, "\tid {id}");
        match rule.rule_type {
            RULE_TYPE_REPLICATED => out.push_str("\ttype replicated\n"),
            RULE_TYPE_ERASURE => out.push_str("\ttype erasure\n"),
            other => {
                let _ = writeln!(out, "\ttype {other}");
            }
        }
        let _ = writeln!(out, "\tmin_size {}", rule.min_size);
        let _ = writeln!(out, "\tmax_size {}", rule.max_size);
        for step in &rule.steps {
            let _ = match *step {
                Step::Noop => writeln!(out, "\tstep noop"),
                Step::Take { item } => match map.split_shadow(item) {
                    Some((orig, class)) => writeln!(
                        out,
                        "\tstep take {} class {}",
                        item_name(map, orig),
                        map.class_names.get(&class).cloned().unwrap_or_default()
                    ),
                    None => writeln!(out, "\tstep take {}", item_name(map, item)),
                },
                Step::Emit => writeln!(out, "\tstep emit"),
                Step::SetChooseTries(v) => writeln!(out, "\tstep set_choose_tries {v}"),
                Step::SetChooseLocalTries(v) => writeln!(out, "\tstep set_choose_local_tries {v}"),
                Step::SetChooseLocalFallbackTries(v) => {
                    writeln!(out, "\tstep set_choose_local_fallback_tries {v}")
                }
                Step::SetChooseLeafTries(v) => writeln!(out, "\tstep set_chooseleaf_tries {v}"),
                Step::SetChooseLeafVaryR(v) => writeln!(out, "\tstep set_chooseleaf_vary_r {v}"),
                Step::SetChooseLeafStable(v) => writeln!(out, "\tstep set_chooseleaf_stable {v}"),
                Step::ChooseFirstN { num, type_id } => {
                    writeln!(
                        out,
                        "\tstep choose firstn {num} type {}",
                        type_name(map, type_id)
                    )
                }
                Step::ChooseIndep { num, type_id } => {
                    writeln!(
                        out,
                        "\tstep choose indep {num} type {}",
                        type_name(map, type_id)
                    )
                }
                Step::ChooseLeafFirstN { num, type_id } => {
                    writeln!(
                        out,
                        "\tstep chooseleaf firstn {num} type {}",
                        type_name(map, type_id)
                    )
                }
                Step::ChooseLeafIndep { num, type_id } => {
                    writeln!(
                        out,
                        "\tstep chooseleaf indep {num} type {}",
                        type_name(map, type_id)
                    )
                }
            };
        }
        out.push_str("}\n");
    }
    out.push_str("\n# end crush map\n");
    out
}

/// Depth-first, children before parents; each bucket printed once.
fn print_bucket_tree(map: &CrushMap, id: i32, done: &mut [bool], out: &mut String) {
    let Some(bucket) = map.bucket(id) else { return };
    let index = (-1 - i64::from(id)) as usize;
    if done[index] {
        return;
    }
    done[index] = true; // also guards against cycles in a malformed map
    for &item in &bucket.items {
        if item < 0 {
            print_bucket_tree(map, item, done, out);
        }
    }
    if map.is_shadow(id) {
        return;
    }
    let _ = writeln!(
        out,
        "{} {} {{",
        type_name(map, i32::from(bucket.type_id)),
        item_name(map, id)
    );
    let _ = writeln!(out, "\tid {id}\t\t# do not change unnecessarily");
    if let Some(by_class) = map.class_bucket.get(&id) {
        for (class, shadow) in by_class {
            let class_name = map.class_names.get(class).cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "\tid {shadow} class {class_name}\t\t# do not change unnecessarily"
            );
        }
    }
    let _ = writeln!(out, "\t# weight {}", format_weight(bucket.weight));
    let _ = write!(out, "\talg {}", bucket.alg.name());
    let dopos = match bucket.alg {
        BucketAlg::Uniform => {
            let _ = write!(
                out,
                "\t# do not change bucket size ({}) unnecessarily",
                bucket.size()
            );
            true
        }
        BucketAlg::List => {
            out.push_str("\t# add new items at the end; do not change order unnecessarily");
            false
        }
        BucketAlg::Tree => {
            out.push_str("\t# do not change pos for existing items unnecessarily");
            true
        }
        _ => false,
    };
    out.push('\n');
    let _ = writeln!(out, "\thash {}\t# rjenkins1", bucket.hash);
    for (pos, &item) in bucket.items.iter().enumerate() {
        let _ = write!(
            out,
            "\titem {} weight {}",
            item_name(map, item),
            format_weight(item_weight_at(bucket, pos))
        );
        if dopos {
            let _ = write!(out, " pos {pos}");
        }
        out.push('\n');
    }
    out.push_str("}\n");
}
