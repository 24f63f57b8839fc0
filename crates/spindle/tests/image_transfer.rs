//! `spindle image export|import|du` against a real cluster: a round trip through a file
//! and through a pipe reproduces the image byte for byte (sha256 by `sha256sum`), holes
//! stay holes (a 10 GiB image with a few MiB of data exports to a file that allocates a
//! few MiB), a snapshot exports as it was, and `du` counts provisioned and used bytes of
//! the image and of its snapshots. Bad input: a missing image, an existing target, a
//! truncated input.

mod common;

use common::{run_ok, spindle, Cluster};
use spindle_image::Image;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

const POOL: &str = "default";

fn ok(c: &Cluster, args: &[&str]) -> String {
    run_ok(spindle().args(args).arg("--dir").arg(&c.dir))
}

fn fails(c: &Cluster, args: &[&str], needle: &str) {
    let out = spindle()
        .args(args)
        .arg("--dir")
        .arg(&c.dir)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spindle");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in: {err}"
    );
}

fn sha256(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_import_round_trips_keep_holes_and_du_counts() {
    let c = Cluster::start("xfer", 3, 16);
    let client = Arc::new(c.client().await);
    let dir = c.dir.clone();

    // A 64 MiB image with data in some places, zeros (written and never written) elsewhere.
    ok(
        &c,
        &[
            "image",
            "create",
            "src",
            "--size",
            "64M",
            "--object-size",
            "1M",
        ],
    );
    let src = Image::open(client.clone(), POOL, "src").await.unwrap();
    let mut model = vec![0u8; 64 << 20];
    for (i, (offset, len)) in [
        (0usize, 3000usize),
        (5 << 20, 1 << 20),
        (9 << 20, 123_456),
        ((64 << 20) - 4096, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64 + 1, len);
        src.write(offset as u64, &data).await.unwrap();
        model[offset..offset + len].copy_from_slice(&data);
    }
    src.write(20 << 20, &vec![0u8; 2 << 20]).await.unwrap();
    let reference = dir.join("reference.raw");
    std::fs::write(&reference, &model).unwrap();

    // Through a file.
    let file = dir.join("src.raw");
    let out = ok(&c, &["image", "export", "src", file.to_str().unwrap()]);
    assert!(out.contains("exported src"), "{out}");
    assert_eq!(sha256(&file), sha256(&reference), "export equals the image");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    assert!(
        meta.blocks() * 512 < 8 << 20,
        "holes stay holes: {} bytes allocated for ~1.3 MiB of data",
        meta.blocks() * 512
    );
    ok(&c, &["image", "import", file.to_str().unwrap(), "copy"]);
    let back = dir.join("copy.raw");
    ok(&c, &["image", "export", "copy", back.to_str().unwrap()]);
    assert_eq!(
        sha256(&back),
        sha256(&reference),
        "export -> import -> export"
    );
    // Zeros were not written: the copy has only the objects with data.
    let copy_objects = client
        .list(POOL)
        .await
        .unwrap()
        .iter()
        .filter(|o| o.name.starts_with("img.copy.") && !o.name.ends_with("header"))
        .count();
    assert_eq!(copy_objects, 4, "objects 0, 5, 9 and 63 only");

    // Through a pipe: export to stdout, import from stdin.
    let piped = dir.join("piped.raw");
    let mut export = spindle()
        .args(["image", "export", "src", "-", "--dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let import = spindle()
        .args(["image", "import", "-", "piped", "--size", "64M", "--dir"])
        .arg(&dir)
        .stdin(export.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(export.wait().unwrap().success(), "export to stdout");
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    ok(&c, &["image", "export", "piped", piped.to_str().unwrap()]);
    assert_eq!(sha256(&piped), sha256(&reference), "export - | import -");

    // A snapshot exports as it was; du counts the head, the snapshot and its copies.
    ok(&c, &["image", "snap", "create", "src@before"]);
    src.write(0, &[0xff; 4096]).await.unwrap();
    let snap_file = dir.join("before.raw");
    ok(
        &c,
        &["image", "export", "src@before", snap_file.to_str().unwrap()],
    );
    assert_eq!(
        sha256(&snap_file),
        sha256(&reference),
        "the snapshot as it was"
    );
    let du: serde_json::Value =
        serde_json::from_str(&ok(&c, &["image", "du", "src", "--json"])).unwrap();
    let img = &du[0];
    assert_eq!(img["name"], "src");
    assert_eq!(img["provisioned_bytes"], 64u64 << 20);
    // Objects 0 (4096 written over 3000 bytes), 5 (1 MiB), 9, 20-21 (zeros written), 63.
    let used = img["used_bytes"].as_u64().unwrap();
    assert!(
        ((1 << 20) + 123_456 + 4096..=6 << 20).contains(&used),
        "used {used}"
    );
    assert_eq!(img["snapshots"][0]["name"], "before");
    assert_eq!(
        img["snapshots"][0]["used_bytes"], 3000,
        "one copy of object 0, as it was (3000 bytes)"
    );

    // A mostly empty 10 GiB image exports small and quickly (a few objects of data).
    ok(&c, &["image", "create", "big", "--size", "10G"]);
    let big = Image::open(client.clone(), POOL, "big").await.unwrap();
    big.write(7 << 30, &pattern(9, 1 << 20)).await.unwrap();
    let big_file = dir.join("big.raw");
    let started = std::time::Instant::now();
    ok(&c, &["image", "export", "big", big_file.to_str().unwrap()]);
    let meta = std::fs::metadata(&big_file).unwrap();
    eprintln!(
        "10 GiB sparse export: {:?}, {} bytes allocated",
        started.elapsed(),
        meta.blocks() * 512
    );
    assert_eq!(meta.len(), 10 << 30);
    assert!(
        meta.blocks() * 512 <= 4 << 20,
        "allocated {}",
        meta.blocks() * 512
    );
    let mut f = std::fs::File::open(&big_file).unwrap();
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(7 << 30)).unwrap();
    let mut got = vec![0u8; 1 << 20];
    f.read_exact(&mut got).unwrap();
    assert_eq!(got, pattern(9, 1 << 20));
    std::fs::remove_file(&big_file).unwrap();

    // Bad input.
    fails(
        &c,
        &["image", "export", "nope", "/tmp/never"],
        "no such image",
    );
    fails(
        &c,
        &["image", "import", file.to_str().unwrap(), "copy"],
        "already exists",
    );
    // A stream shorter than --size: refused, and the half-made image removed.
    fails(
        &c,
        &["image", "import", "-", "short", "--size", "64M"],
        "import",
    );
    fails(&c, &["image", "info", "short"], "no such image");
    fails(
        &c,
        &["image", "import", "/nonexistent/file", "x"],
        "/nonexistent/file",
    );
    fails(
        &c,
        &["image", "export", "src", file.to_str().unwrap()],
        "exists",
    );
}
