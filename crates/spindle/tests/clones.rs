//! Clones against a real cluster, through the real CLI, NBD server and `qemu-img`: a clone
//! of a protected snapshot reads its parent until it writes; its writes never reach the
//! parent snapshot (sha256 of `spindle image export` before and after); a snapshot of the
//! clone keeps its state; the snapshot cannot be unprotected or removed while the clone
//! reads it; flatten detaches the clone (same bytes) and the parent snapshot can go; a
//! clone into an erasure-coded pool; bad input.

mod common;

use common::{fails, ok, qemu_img_compare, run_ok, spindle, Cluster, NbdProc};
use sha2::{Digest, Sha256};
use spindle_image::Image;
use std::process::Command;
use std::sync::Arc;

const POOL: &str = "default";
const EC_POOL: &str = "ec";
const BLOCK: usize = 4096;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn block_of(seq: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seq.wrapping_mul(0x9e37_79b9) ^ i as u64 ^ 1).to_le_bytes());
    }
    out
}

/// sha256 of `spindle image export SPEC -` (the real CLI, through a pipe).
fn export_sha(c: &Cluster, spec: &str, pool: &str) -> String {
    let out = spindle()
        .args(["image", "export", spec, "-", "--pool", pool, "--dir"])
        .arg(&c.dir)
        .output()
        .expect("spawn spindle");
    assert!(
        out.status.success(),
        "export {spec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hex(&out.stdout)
}

fn hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes `count` random blocks (seq from `seq`) through `img` and into `model`.
async fn scribble(
    img: &Image<spindle_client::Client>,
    model: &mut [u8],
    rng: &mut Rng,
    seq: &mut u64,
    count: usize,
) {
    for _ in 0..count {
        let offset = (rng.next() % (model.len() / BLOCK) as u64) as usize * BLOCK;
        let b = block_of(*seq);
        *seq += 1;
        img.write(offset as u64, &b).await.expect("write");
        model[offset..offset + BLOCK].copy_from_slice(&b);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_reads_its_parent_keeps_it_unchanged_and_flattens() {
    let c = Cluster::start_with("clone", 4, 8, &[]);
    run_ok(
        spindle()
            .args(["pool", "create", EC_POOL, "--pg-count", "8", "--erasure"])
            .arg("k=2,m=1,min-size=2")
            .arg("--dir")
            .arg(&c.dir),
    );
    c.wait_clean();
    let size = 4usize << 20;
    ok(
        &c,
        &[
            "image",
            "create",
            "golden",
            "--size",
            "4M",
            "--object-size",
            "256K",
        ],
    );
    let client = Arc::new(c.client().await);
    let golden = Image::open(client.clone(), POOL, "golden").await.unwrap();
    let mut rng = Rng(0xc10e);
    let mut seq = 0u64;
    let mut base = vec![0u8; size];
    scribble(&golden, &mut base, &mut rng, &mut seq, 200).await;
    ok(&c, &["image", "snap", "create", "golden@base"]);

    // Bad input: an unprotected snapshot, a missing one, a bad name.
    fails(
        &c,
        &["image", "clone", "golden@base", "vm1"],
        "not protected",
    );
    fails(&c, &["image", "clone", "golden@nope", "vm1"], "no snapshot");
    fails(&c, &["image", "clone", "golden", "vm1"], "IMAGE@SNAP");
    ok(&c, &["image", "snap", "protect", "golden@base"]);
    fails(&c, &["image", "clone", "golden@base", "bad/na me"], "");
    fails(&c, &["image", "clone", "golden@base", "golden"], "exists");

    let base_sha = export_sha(&c, "golden@base", POOL);
    assert_eq!(base_sha, hex(&base));
    let out = ok(&c, &["image", "clone", "golden@base", "vm1"]);
    assert!(
        out.contains("cloned default/golden@base as default/vm1"),
        "{out}"
    );
    fails(&c, &["image", "clone", "golden@base", "vm1"], "exists");
    let info: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "info", "vm1", "--json"])).unwrap();
    assert_eq!(info["parent"], "default/golden@base");
    assert_eq!(info["overlap_bytes"], size as u64);
    assert_eq!(info["format_version"], 2);
    let children: Vec<String> =
        serde_json::from_str(&ok(&c, &["image", "children", "golden@base", "--json"])).unwrap();
    assert_eq!(children, vec!["default/vm1".to_string()]);
    // Nothing written yet: the clone is the snapshot, and holds no data object.
    assert_eq!(export_sha(&c, "vm1", POOL), base_sha);
    let du: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "du", "vm1", "--json"])).unwrap();
    assert_eq!(du[0]["used_bytes"], 0, "{du}");

    // Writes to the clone (also partial blocks inside objects the parent filled), and to
    // the parent's head: neither changes the parent snapshot.
    let vm1 = Image::open(client.clone(), POOL, "vm1").await.unwrap();
    let mut model = base.clone();
    scribble(&vm1, &mut model, &mut rng, &mut seq, 150).await;
    vm1.write(1000, &[7u8; 100]).await.unwrap();
    model[1000..1100].fill(7);
    vm1.discard(256 << 10, 256 << 10).await.unwrap();
    model[256 << 10..512 << 10].fill(0);
    let mut head = base.clone();
    scribble(&golden, &mut head, &mut rng, &mut seq, 50).await;
    assert_eq!(
        export_sha(&c, "golden@base", POOL),
        base_sha,
        "parent snapshot changed"
    );
    assert_eq!(export_sha(&c, "vm1", POOL), hex(&model));
    assert_eq!(export_sha(&c, "golden", POOL), hex(&head));
    drop(vm1);

    // Served over NBD (a new opener: no copy-up state in memory), compared by qemu-img.
    let reference = c.dir.join("vm1.raw");
    std::fs::write(&reference, &model).unwrap();
    let nbd = NbdProc::start(&c);
    let (same, why) = qemu_img_compare(&reference, &nbd.uri("vm1"));
    assert!(same, "qemu-img compare of vm1: {why}");
    // Writes through NBD land in the clone only.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 8k 64k"])
        .arg(nbd.uri("vm1"))
        .output()
        .expect("spawn qemu-io");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model[8 << 10..72 << 10].fill(0x5a);
    drop(nbd);

    // A snapshot of the clone, then more writes: the snapshot keeps its state.
    ok(&c, &["image", "snap", "create", "vm1@s1"]);
    let at_s1 = model.clone();
    let vm1 = Image::open(client.clone(), POOL, "vm1").await.unwrap();
    scribble(&vm1, &mut model, &mut rng, &mut seq, 100).await;
    drop(vm1);
    assert_eq!(export_sha(&c, "vm1@s1", POOL), hex(&at_s1));

    // The parent snapshot is held by its clone.
    fails(&c, &["image", "snap", "unprotect", "golden@base"], "clone");
    fails(&c, &["image", "snap", "rm", "golden@base"], "protected");

    // A second clone, into the erasure-coded pool, removed again.
    ok(&c, &["image", "clone", "default/golden@base", "ec/vm2"]);
    let vm2 = Image::open(client.clone(), EC_POOL, "vm2").await.unwrap();
    let mut model2 = base.clone();
    scribble(&vm2, &mut model2, &mut rng, &mut seq, 60).await;
    drop(vm2);
    assert_eq!(export_sha(&c, "vm2", EC_POOL), hex(&model2));
    let children: Vec<String> =
        serde_json::from_str(&ok(&c, &["image", "children", "golden@base", "--json"])).unwrap();
    assert_eq!(
        children,
        vec!["default/vm1".to_string(), "ec/vm2".to_string()]
    );
    ok(&c, &["image", "rm", "vm2", "--pool", EC_POOL]);
    let children: Vec<String> =
        serde_json::from_str(&ok(&c, &["image", "children", "golden@base", "--json"])).unwrap();
    assert_eq!(children, vec!["default/vm1".to_string()]);

    // Flatten: same bytes, no parent; then the parent snapshot can go.
    let out = ok(&c, &["image", "flatten", "vm1"]);
    assert!(out.contains("flattened vm1"), "{out}");
    fails(&c, &["image", "flatten", "vm1"], "not a clone");
    let info: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "info", "vm1", "--json"])).unwrap();
    assert!(info.get("parent").is_none(), "{info}");
    assert_eq!(info["format_version"], 1);
    assert_eq!(ok(&c, &["image", "children", "golden@base"]).trim(), "");
    ok(&c, &["image", "snap", "unprotect", "golden@base"]);
    ok(&c, &["image", "snap", "rm", "golden@base"]);
    // The parent's snapshot copies are gone, and golden itself too.
    ok(&c, &["image", "rm", "golden"]);
    assert_eq!(export_sha(&c, "vm1", POOL), hex(&model));
    assert_eq!(export_sha(&c, "vm1@s1", POOL), hex(&at_s1));
    fails(
        &c,
        &["image", "clone", "golden@base", "vm3"],
        "no such image",
    );
}
