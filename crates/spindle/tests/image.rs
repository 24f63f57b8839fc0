//! Block images against a real 3-daemon cluster: the `spindle image` CLI, and a
//! `BlockLayer` over a real `Client` (random writes across object boundaries read back,
//! thin provisioning: never-written objects do not exist).

mod common;

use common::{content, run_ok, spindle, Cluster};
use spindle_client::ClientError;
use spindle_image::image::data_object_name;
use spindle_image::{BlockConfig, BlockLayer, Image, ImageError};
use std::collections::BTreeSet;
use std::sync::Arc;

const POOL: &str = "default";

fn image_cmd(c: &Cluster, args: &[&str]) -> std::process::Output {
    spindle()
        .arg("image")
        .args(args)
        .arg("--dir")
        .arg(&c.dir)
        .output()
        .expect("spawn spindle")
}

fn image_ok(c: &Cluster, args: &[&str]) -> String {
    run_ok(spindle().arg("image").args(args).arg("--dir").arg(&c.dir))
}

fn info_json(c: &Cluster, name: &str) -> serde_json::Value {
    serde_json::from_str(&image_ok(c, &["info", name, "--json"])).expect("info JSON")
}

fn cli(c: &Cluster) {
    let out = image_ok(c, &["create", "vol1", "--size", "10G"]);
    assert!(out.contains("created image vol1"), "{out}");
    image_ok(
        c,
        &["create", "vol2", "--size", "64M", "--object-size", "1M"],
    );
    let info = info_json(c, "vol1");
    assert_eq!(info["size_bytes"], 10u64 << 30);
    assert_eq!(info["object_size_bytes"], 4u64 << 20);
    assert_eq!(info["object_count"], 2560);
    let info = info_json(c, "vol2");
    assert_eq!(info["object_size_bytes"], 1u64 << 20);
    let text = image_ok(c, &["info", "vol2"]);
    assert!(text.contains("64 MiB"), "{text}");

    let ls = image_ok(c, &["ls"]);
    let names: Vec<&str> = ls.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(names, ["vol1", "vol2"], "{ls}");
    let ls: serde_json::Value = serde_json::from_str(&image_ok(c, &["ls", "--json"])).unwrap();
    assert_eq!(ls.as_array().map(|a| a.len()), Some(2));

    // Errors: exists, bad size, bad name, missing image.
    for args in [
        &["create", "vol1", "--size", "1G"][..],
        &["create", "vol3", "--size", "1000"],
        &["create", "vol3", "--size", "1G", "--object-size", "3K"],
        &["create", "bad/name", "--size", "1G"],
        &["info", "nope"],
        &["resize", "nope", "--size", "1G"],
        &["rm", "nope"],
    ] {
        let out = image_cmd(c, args);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    image_ok(c, &["resize", "vol1", "--size", "20G"]);
    assert_eq!(info_json(c, "vol1")["size_bytes"], 20u64 << 30);
    image_ok(c, &["resize", "vol2", "--size", "32M"]);
    assert_eq!(info_json(c, "vol2")["size_bytes"], 32u64 << 20);

    // rm of a 20 GiB image lists instead of deleting 5120 objects blindly; progress
    // goes to stderr.
    let out = image_cmd(c, &["rm", "vol1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    image_ok(c, &["rm", "vol2"]);
    assert_eq!(image_ok(c, &["ls"]).trim(), "");
}

async fn data_objects(client: &spindle_client::Client, name: &str) -> BTreeSet<String> {
    let prefix = format!("img.{name}.");
    client
        .list(POOL)
        .await
        .expect("list")
        .into_iter()
        .map(|l| l.name)
        .filter(|n| n.starts_with(&prefix) && !n.ends_with(".header"))
        .collect()
}

async fn library(c: &Cluster) {
    const SIZE: u64 = 24 << 20;
    const OBJECT: u64 = 1 << 20;
    let client = Arc::new(c.client().await);
    let img = Arc::new(
        Image::create(client.clone(), POOL, "libvol", SIZE, OBJECT)
            .await
            .expect("create"),
    );
    let bl = Arc::new(BlockLayer::new(img.clone(), BlockConfig::default()).expect("layer"));
    let mut model = vec![0u8; SIZE as usize];
    let mut touched = BTreeSet::new();
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Rounds of concurrent writes to disjoint ranges in the first 16 objects; objects
    // 16.. are never written.
    for round in 0..6u64 {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        while ranges.len() < 6 {
            let len = 1 + next() % (600 << 10);
            let offset = next() % (16 * OBJECT - len);
            if ranges
                .iter()
                .all(|&(o, l)| offset + len <= o || o + l <= offset)
            {
                ranges.push((offset, len));
            }
        }
        let mut tasks = Vec::new();
        for (i, &(offset, len)) in ranges.iter().enumerate() {
            let data = content("libvol", round * 100 + i as u64, len as usize);
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            for o in offset / OBJECT..=(offset + len - 1) / OBJECT {
                touched.insert(o);
            }
            let bl = bl.clone();
            tasks.push(tokio::spawn(async move { bl.write(offset, &data).await }));
        }
        for t in tasks {
            t.await.expect("task").expect("write");
        }
        // Read back some random ranges (through the cache) as we go.
        for _ in 0..4 {
            let len = 1 + next() % (3 << 20);
            let offset = next() % (SIZE - len);
            let got = bl.read(offset, len).await.expect("read");
            assert!(
                got == model[offset as usize..(offset + len) as usize],
                "round {round}: {offset}+{len}"
            );
        }
    }
    bl.flush().await.expect("flush");
    // Small reads go through the cache (large ones bypass it): the second read of the
    // same 8 KiB hits.
    for _ in 0..2 {
        let got = bl.read(4096 * 3, 8192).await.expect("small read");
        assert!(got == model[4096 * 3..4096 * 5]);
    }
    assert_eq!(bl.read(0, SIZE).await.expect("read all"), model);
    // Cold read through a fresh image handle and block layer.
    let fresh = Arc::new(
        Image::open(client.clone(), POOL, "libvol")
            .await
            .expect("open"),
    );
    let cold = BlockLayer::new(fresh, BlockConfig::default()).expect("layer");
    assert_eq!(cold.read(0, SIZE).await.expect("cold read"), model);
    let stats = bl.stats();
    assert!(stats.cache_hits > 0, "{stats:?}");
    eprintln!("block stats: {}", serde_json::to_string(&stats).unwrap());

    // Thin: exactly the objects written exist.
    let expected: BTreeSet<String> = touched
        .iter()
        .map(|&o| data_object_name("libvol", o))
        .collect();
    assert_eq!(data_objects(&client, "libvol").await, expected);
    assert!(matches!(
        client.stat(POOL, &data_object_name("libvol", 20)).await,
        Err(ClientError::NotFound(_))
    ));

    // Zeroing a whole object deletes it; zeroing a hole creates nothing.
    let first = *touched.first().expect("some object written");
    bl.write_zeroes(first * OBJECT, OBJECT).await.expect("zero");
    bl.discard(20 * OBJECT, 2 * OBJECT + 4096)
        .await
        .expect("discard hole");
    model[(first * OBJECT) as usize..((first + 1) * OBJECT) as usize].fill(0);
    let mut expected = expected;
    expected.remove(&data_object_name("libvol", first));
    assert_eq!(data_objects(&client, "libvol").await, expected);
    assert_eq!(bl.read(0, SIZE).await.expect("read all"), model);

    // Shrink and grow: the tail reads as zeros.
    bl.resize(8 * OBJECT + 512).await.expect("shrink");
    bl.resize(SIZE).await.expect("grow");
    let got = bl.read(0, SIZE).await.expect("read all");
    let keep = (8 * OBJECT + 512) as usize;
    assert!(got[..keep] == model[..keep]);
    assert!(got[keep..].iter().all(|&b| b == 0));
    assert!(matches!(
        bl.read(SIZE, 1).await,
        Err(ImageError::OutOfRange { .. })
    ));

    Image::remove(client.clone(), POOL, "libvol", |_, _| {})
        .await
        .expect("remove");
    assert!(data_objects(&client, "libvol").await.is_empty());
    assert!(Image::list(&*client, POOL).await.expect("list").is_empty());
}

#[test]
fn images_on_a_real_cluster() {
    let c = Cluster::start("img", 3, 32);
    cli(&c);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(library(&c));
    // Dropping `c` kills the daemons and removes the directory.
}
