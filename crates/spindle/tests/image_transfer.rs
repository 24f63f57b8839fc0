//! `spindle image export|import|du` against a real cluster: a round trip through a file
//! and through a pipe reproduces the image byte for byte (sha256 by `sha256sum`), holes
//! stay holes (a 10 GiB image with a few MiB of data exports to a file that allocates a
//! few MiB), a snapshot exports as it was, and `du` counts provisioned and used bytes of
//! the image and of its snapshots. Bad input: a missing image, an existing target, a
//! truncated input.

mod common;

use common::{fails, ok, spindle, Cluster};
use spindle_image::Image;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

const POOL: &str = "default";

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

/// A chain of three `export-diff`/`import-diff` reproduces the image byte for byte (sha256
/// of exports), each diff carrying only what changed; `image diff` lists the changed
/// extents; a diff applies only in order; a truncated or corrupted diff is refused and
/// leaves the image unchanged; diffs travel through pipes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_diffs_reproduces_the_image_and_bad_diffs_change_nothing() {
    let c = Cluster::start("diffs", 3, 8);
    let dir = c.dir.clone();
    let size = 8usize << 20;
    ok(
        &c,
        &[
            "image",
            "create",
            "src",
            "--size",
            "8M",
            "--object-size",
            "1M",
        ],
    );
    let client = Arc::new(c.client().await);
    let src = Image::open(client.clone(), POOL, "src").await.unwrap();
    let mut model = vec![0u8; size];
    let write = |img_model: &mut Vec<u8>, off: usize, data: &[u8]| {
        img_model[off..off + data.len()].copy_from_slice(data);
        (off as u64, data.to_vec())
    };
    // Generation 1: two regions; then s1.
    for (off, data) in [
        write(&mut model, 0, &pattern(1, 100_000)),
        write(&mut model, 5 << 20, &pattern(2, 8192)),
    ] {
        src.write(off, &data).await.unwrap();
    }
    ok(&c, &["image", "snap", "create", "src@s1"]);
    let d1 = dir.join("d1");
    ok(
        &c,
        &["image", "export-diff", "src@s1", d1.to_str().unwrap()],
    );
    // Generation 2: a small change inside object 0, a zeroed range, and the image grows.
    src.write(4096, &pattern(3, 4096)).await.unwrap();
    model[4096..8192].copy_from_slice(&pattern(3, 4096));
    src.write_zeroes(5 << 20, 8192).await.unwrap();
    model[5 << 20..(5 << 20) + 8192].fill(0);
    src.resize(10 << 20).await.unwrap();
    model.resize(10 << 20, 0);
    src.write(9 << 20, &pattern(4, 3000)).await.unwrap();
    model[9 << 20..(9 << 20) + 3000].copy_from_slice(&pattern(4, 3000));
    ok(&c, &["image", "snap", "create", "src@s2"]);
    // `image diff` s1 -> s2: exactly the changed blocks.
    let extents: serde_json::Value = serde_json::from_str(&ok(
        &c,
        &["image", "diff", "src@s2", "--from-snap", "s1", "--json"],
    ))
    .unwrap();
    let listed: Vec<(u64, u64, bool)> = extents
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["offset"].as_u64().unwrap(),
                e["len"].as_u64().unwrap(),
                e["zero"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            (4096, 4096, false),
            (5 << 20, 8192, true),
            (9 << 20, 4096, false)
        ],
        "{extents}"
    );
    let d2 = dir.join("d2");
    ok(
        &c,
        &[
            "image",
            "export-diff",
            "--from-snap",
            "s1",
            "src@s2",
            d2.to_str().unwrap(),
        ],
    );
    // Generation 3: the image shrinks and changes; the diff goes through a pipe.
    src.resize(9 << 20).await.unwrap();
    model.truncate(9 << 20);
    src.write(8 << 20, &pattern(5, 65536)).await.unwrap();
    model[8 << 20..(8 << 20) + 65536].copy_from_slice(&pattern(5, 65536));
    ok(&c, &["image", "snap", "create", "src@s3"]);
    let d3 = dir.join("d3");
    let out = spindle()
        .args([
            "image",
            "export-diff",
            "--from-snap",
            "s2",
            "src@s3",
            "-",
            "--dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&d3, &out.stdout).unwrap();
    // Each diff is about its changes: d2 and d3 are far smaller than the image.
    let len = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    assert!(
        len(&d1) < 200_000 && len(&d2) < 20_000 && len(&d3) < 100_000,
        "{} {} {}",
        len(&d1),
        len(&d2),
        len(&d3)
    );

    // The destination: an empty image; the chain in order.
    ok(&c, &["image", "create", "dst", "--size", "1M"]);
    fails(
        &c,
        &["image", "import-diff", d2.to_str().unwrap(), "dst"],
        "does not have",
    );
    ok(&c, &["image", "import-diff", d1.to_str().unwrap(), "dst"]);
    fails(
        &c,
        &["image", "import-diff", d1.to_str().unwrap(), "dst"],
        "already has snapshot s1",
    );
    let export = |spec: &str, name: &str| {
        let path = dir.join(name);
        ok(&c, &["image", "export", spec, path.to_str().unwrap()]);
        sha256(&path)
    };
    let before = export("dst", "dst-before.raw");
    // Damaged copies of d2: truncated, one flipped byte, trailing garbage: refused, and
    // the image is unchanged.
    let good = std::fs::read(&d2).unwrap();
    let mut damaged: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() - 7].to_vec()),
        ("truncated at a record", good[..good.len() / 2].to_vec()),
        ("trailing", [good.clone(), b"junk".to_vec()].concat()),
    ];
    let mut flipped = good.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x01;
    damaged.push(("flipped", flipped));
    for (what, bytes) in damaged {
        let p = dir.join(format!("bad-{}", what.replace(' ', "-")));
        std::fs::write(&p, bytes).unwrap();
        fails(
            &c,
            &["image", "import-diff", p.to_str().unwrap(), "dst"],
            "not a valid diff",
        );
    }
    assert_eq!(
        export("dst", "dst-after-bad.raw"),
        before,
        "a refused diff changed the image"
    );
    assert!(
        !ok(&c, &["image", "snap", "ls", "dst"]).contains("s2"),
        "a refused diff took its snapshot"
    );
    ok(&c, &["image", "import-diff", d2.to_str().unwrap(), "dst"]);
    // d3 through standard input.
    let mut child = spindle()
        .args(["image", "import-diff", "-", "dst", "--dir"])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&std::fs::read(&d3).unwrap()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Byte for byte, at every snapshot of the chain and at the head.
    for s in ["s1", "s2", "s3"] {
        assert_eq!(
            export(&format!("dst@{s}"), &format!("dst-{s}.raw")),
            export(&format!("src@{s}"), &format!("src-{s}.raw")),
            "dst@{s} differs from src@{s}"
        );
    }
    let reference = dir.join("model.raw");
    std::fs::write(&reference, &model).unwrap();
    assert_eq!(export("dst", "dst.raw"), sha256(&reference));
    assert_eq!(export("src@s3", "src-s3-again.raw"), sha256(&reference));
}
