//! `spindle image`: block images striped over objects (`create`, `ls`, `info`, `resize`,
//! `rm`). Images live in a pool (`--pool`, default `default`); the cluster is found
//! through `--dir`/`--mon` like every cluster command.

use crate::cluster_cmd::ObjArgs;
use crate::progress::Unit;
use anyhow::{bail, Context};
use clap::Subcommand;
use spindle_cluster::{format_size, parse_size_bytes, runtime, Target};
use spindle_image::image::{ImageInfo, OBJECT_SIZE_BYTES_DEFAULT, SECTOR_BYTES};
use spindle_image::Image;
use std::io::Write;
use std::sync::Arc;

/// Image subcommands.
#[derive(Subcommand)]
pub enum ImageCommand {
    /// Create a thin image (no data object is written until data is).
    Create {
        name: String,
        /// Volume size: bytes or with a K/M/G/T suffix (powers of 1024); multiple of 512.
        #[arg(long, value_parser = parse_size_bytes)]
        size: u64,
        /// Size of one data object: a power of two in 4K..=32M (default 4M; 256K on an
        /// erasure-coded pool, where small writes rewrite a shard of their object).
        #[arg(long, value_parser = parse_size_bytes)]
        object_size: Option<u64>,
        /// A limit where the image is served, `qos.KEY=VALUE` (repeatable; see
        /// `spindle image config`).
        #[arg(long = "qos", value_name = "qos.KEY=VALUE")]
        qos: Vec<String>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// List the images of a pool.
    Ls {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Size, object size and creation time of an image.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Grow or shrink an image (shrinking deletes the data past the new end).
    Resize {
        name: String,
        /// New size (as for `create`).
        #[arg(long, value_parser = parse_size_bytes)]
        size: u64,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Delete an image and all its data objects (refused while it has snapshots).
    Rm {
        name: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Write an image (or `IMAGE@SNAP`) to a raw file (holes stay holes) or to `-`
    /// (standard output).
    Export {
        /// IMAGE or IMAGE@SNAP
        spec: String,
        /// A new file, or `-` for standard output.
        file: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Create an image from a raw file (its size) or `-` (standard input, with --size);
    /// zero blocks are not written.
    Import {
        /// A file, or `-` for standard input.
        file: String,
        name: String,
        /// Size of the image (required with `-`, which must then give that many bytes;
        /// default: the file's size, rounded up to 512 bytes). Larger than the file: the
        /// rest reads as zeros.
        #[arg(long, value_parser = parse_size_bytes)]
        size: Option<u64>,
        /// Object size (as for `create`).
        #[arg(long, value_parser = parse_size_bytes)]
        object_size: Option<u64>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// List the extents that changed between two states of an image (from nothing, or
    /// from `--from-snap`, to IMAGE@SNAP or the head).
    Diff {
        /// IMAGE or IMAGE@SNAP (the newer state)
        spec: String,
        /// The older snapshot (default: from an empty image).
        #[arg(long)]
        from_snap: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Write the changes between two states of an image as a diff (checksummed records)
    /// to a file or `-`.
    ExportDiff {
        /// IMAGE or IMAGE@SNAP (the newer state; the diff then ends in that snapshot)
        spec: String,
        /// A new file, or `-` for standard output.
        file: String,
        /// The older snapshot (default: from an empty image).
        #[arg(long)]
        from_snap: Option<String>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Apply a diff to an image: the whole diff is checked first (a damaged one changes
    /// nothing); the image must have the diff's start snapshot, and gets its end snapshot.
    ImportDiff {
        /// A file, or `-` for standard input.
        file: String,
        name: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Per-image settings: limits where the image is served (qos.iops, qos.read_iops,
    /// qos.write_iops, qos.bps, qos.read_bps, qos.write_bps, each with a `_burst`),
    /// applied live within a second.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// I/O rates, latency and queue depth of the images being served (as their clients
    /// see them), like `rbd perf image iostat`.
    Stats {
        /// Print again every second until interrupted.
        #[arg(long)]
        watch: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Provisioned and used bytes of the images of a pool (or one), and of their snapshots.
    Du {
        name: Option<String>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Create a copy-on-write clone of a protected snapshot: the clone reads what it has
    /// not written from the snapshot (`spindle image snap protect` it first).
    Clone {
        /// [POOL/]IMAGE@SNAP (POOL defaults to --pool)
        parent: String,
        /// [POOL/]NAME of the new image (POOL defaults to --pool)
        child: String,
        /// Object size of the clone (default: the parent's).
        #[arg(long, value_parser = parse_size_bytes)]
        object_size: Option<u64>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Copy everything a clone still reads from its parent snapshot into the clone and
    /// detach it (takes the image's lock: refused while it is served).
    Flatten {
        name: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// List the clones of a snapshot.
    Children {
        /// IMAGE@SNAP
        spec: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Snapshots: `create|ls|rm|rollback|protect|unprotect|trim IMAGE@SNAP`.
    Snap {
        #[command(subcommand)]
        command: SnapCommand,
    },
}

/// `spindle image config` subcommands.
#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Set `qos.KEY=VALUE` settings (a value of 0 removes one; byte values take K/M/G).
    Set {
        name: String,
        #[arg(required = true, value_name = "qos.KEY=VALUE")]
        settings: Vec<String>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Remove settings.
    Rm {
        name: String,
        #[arg(required = true, value_name = "qos.KEY")]
        keys: Vec<String>,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Show the settings.
    Get {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
}

/// `qos.KEY=VALUE` parsed (value: a count, or bytes with a K/M/G suffix; 0 removes it).
fn qos_setting(s: &str) -> anyhow::Result<(String, Option<u64>)> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("expected qos.KEY=VALUE, got {s:?}"))?;
    let value = parse_size_bytes(value).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
    Ok((key.to_string(), (value > 0).then_some(value)))
}

/// Prints the reports of the images served now.
async fn print_stats(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    json: bool,
) -> anyhow::Result<()> {
    use spindle_image::ObjectBackend;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut reports = Vec::new();
    for object in client.list_objects(pool).await? {
        let Some(image) = object
            .strip_prefix("img.")
            .and_then(|o| o.strip_suffix(".stats"))
        else {
            continue;
        };
        let Ok(data) = client.read_object(pool, &object, 0, 1 << 16).await else {
            continue;
        };
        let Ok(r) = serde_json::from_slice::<spindle_image::qos::ImageIoReport>(&data) else {
            eprintln!("image {image}: unreadable statistics object {object}");
            continue;
        };
        // Reports older than a few seconds: not served any more (or the server is gone).
        if now_ms.saturating_sub(r.unix_ms) <= 5_000 {
            reports.push(r);
        }
    }
    reports.sort_by(|a, b| a.image.cmp(&b.image));
    if json {
        println!("{}", serde_json::to_string(&reports)?);
        return Ok(());
    }
    println!(
        "{:<20} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>6}",
        "IMAGE", "RD IOPS", "WR IOPS", "RD MB/s", "WR MB/s", "RD LAT ms", "WR LAT ms", "QD"
    );
    for r in &reports {
        let x = &r.rates;
        println!(
            "{:<20} {:>9.0} {:>9.0} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>6.1}",
            r.image,
            x.read_iops,
            x.write_iops,
            x.read_bytes_per_sec / 1e6,
            x.write_bytes_per_sec / 1e6,
            x.read_latency_us / 1e3,
            x.write_latency_us / 1e3,
            x.queue_depth
        );
    }
    if reports.is_empty() {
        println!("(no image of pool {pool} is being served)");
    }
    Ok(())
}

/// `spindle image snap` subcommands.
#[derive(Subcommand)]
pub enum SnapCommand {
    /// Take a crash-consistent snapshot while writes run (returns once every daemon
    /// enforces it: a write issued afterwards is never in it).
    Create {
        /// IMAGE@SNAP
        spec: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// List an image's snapshots.
    Ls {
        image: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Remove a snapshot. The copies only it kept are freed in the background by the
    /// monitors (`spindle image du` counts them as trimming until then).
    Rm {
        /// IMAGE@SNAP
        spec: String,
        /// Free the copies now, before returning.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Make the image what it was at the snapshot (takes the image's lock: refused while
    /// the image is served).
    Rollback {
        /// IMAGE@SNAP
        spec: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Protect a snapshot from removal.
    Protect {
        /// IMAGE@SNAP
        spec: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Allow a protected snapshot to be removed again.
    Unprotect {
        /// IMAGE@SNAP
        spec: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
    /// Free snapshot copies no snapshot reads (what an interrupted `rm` left).
    Trim {
        image: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
}

/// Standard output as the export's writer: it cannot seek, so the export writes every
/// byte in order (`seekable` false) and never calls `seek`.
struct StdoutSeek<W: Write>(W);

impl<W: Write> Write for StdoutSeek<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> std::io::Seek for StdoutSeek<W> {
    fn seek(&mut self, _: std::io::SeekFrom) -> std::io::Result<u64> {
        Err(std::io::Error::other("standard output cannot seek"))
    }
}

/// The settings as one line (`unlimited` when none).
fn spec_line(spec: &spindle_image::qos::QosSpec) -> String {
    let pairs = spec.pairs();
    if pairs.is_empty() {
        return "unlimited".to_string();
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `IMAGE@SNAP` split, with a clear error.
fn snap_spec(spec: &str) -> anyhow::Result<(&str, &str)> {
    match spec.split_once('@') {
        Some((image, snap)) if !image.is_empty() && !snap.is_empty() => Ok((image, snap)),
        _ => bail!("expected IMAGE@SNAP, got {spec:?}"),
    }
}

/// `[POOL/]NAME` with the pool defaulting to `pool`.
fn pool_spec<'a>(spec: &'a str, pool: &'a str) -> (&'a str, &'a str) {
    match spec.split_once('/') {
        Some((p, n)) if !p.is_empty() => (p, n),
        _ => (pool, spec),
    }
}

async fn run_snap(client: Arc<spindle_client::Client>, command: SnapCommand) -> anyhow::Result<()> {
    use spindle_image::snap;
    match command {
        SnapCommand::Create { spec, obj } => {
            let (image, name) = snap_spec(&spec)?;
            let started = std::time::Instant::now();
            let id = snap::create(&client, &obj.pool, image, name)
                .await
                .with_context(|| format!("creating snapshot {spec}"))?;
            println!(
                "created snapshot {spec} (id {id}) in {} ms",
                started.elapsed().as_millis()
            );
        }
        SnapCommand::Ls { image, json, obj } => {
            // The image must exist (a clear error rather than an empty list).
            Image::open(client.clone(), &obj.pool, &image).await?;
            let list = snap::list(&client, &obj.pool, &image);
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!("ID\tNAME\tSIZE\tPROTECTED\tCREATED");
                for s in list {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        s.id,
                        s.name,
                        format_size(s.size_bytes),
                        if s.protected { "yes" } else { "no" },
                        s.created_unix_secs
                    );
                }
            }
        }
        SnapCommand::Rm { spec, wait, obj } => {
            let (image, name) = snap_spec(&spec)?;
            snap::remove(&client, &obj.pool, image, name)
                .await
                .with_context(|| format!("removing snapshot {spec}"))?;
            if wait {
                let freed = trim_now(&client, &obj.pool, image).await?;
                println!("removed snapshot {spec} ({freed} object copies freed)");
            } else {
                println!(
                    "removed snapshot {spec} (the copies only it kept are freed in the background)"
                );
            }
        }
        SnapCommand::Rollback { spec, obj } => {
            let (image, name) = snap_spec(&spec)?;
            let work = snap::rollback(
                &client,
                &obj.pool,
                image,
                name,
                crate::progress::bar(format!("rolling back to {spec}:"), Unit::Objects),
            );
            with_image_lock(
                &client,
                &obj.pool,
                image,
                "spindle image snap rollback",
                work,
            )
            .await
            .with_context(|| format!("cannot roll {image} back"))?
            .with_context(|| format!("rolling back to {spec}"))?;
            println!("rolled {image} back to {spec}");
        }
        SnapCommand::Protect { spec, obj } => {
            let (image, name) = snap_spec(&spec)?;
            snap::protect(&client, &obj.pool, image, name, true).await?;
            println!("protected {spec}");
        }
        SnapCommand::Unprotect { spec, obj } => {
            let (image, name) = snap_spec(&spec)?;
            // Clones that no longer exist (a clone or removal interrupted by a crash)
            // do not hold the snapshot.
            let pruned =
                spindle_image::clone::prune_children(&client, &obj.pool, image, name).await?;
            if pruned > 0 {
                eprintln!("dropped {pruned} clone(s) of {spec} that no longer exist");
            }
            snap::protect(&client, &obj.pool, image, name, false).await?;
            println!("unprotected {spec}");
        }
        SnapCommand::Trim { image, obj } => {
            let freed = trim_now(&client, &obj.pool, &image).await?;
            println!("freed {freed} object copies of {image}");
        }
    }
    Ok(())
}

/// [`spindle_image::admin::with_lock`], as an `anyhow` result.
async fn with_image_lock<T>(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
    program: &str,
    work: impl std::future::Future<Output = T>,
) -> anyhow::Result<T> {
    Ok(spindle_image::admin::with_lock(client, pool, image, program, work).await?)
}

/// Frees the copies of `image` no live snapshot reads, in the foreground, and records it
/// in the map (so the monitors' trimmer has nothing left to do for those removals).
async fn trim_now(
    client: &Arc<spindle_client::Client>,
    pool: &str,
    image: &str,
) -> anyhow::Result<u64> {
    let snaps = client.image_snaps(pool, image).unwrap_or_default();
    let freed = spindle_image::snap::trim_for(
        &**client,
        pool,
        image,
        &snaps,
        crate::progress::bar(
            format!("freeing snapshot copies of {image}:"),
            Unit::Objects,
        ),
    )
    .await
    .with_context(|| format!("freeing snapshot copies of {image}"))?;
    if snaps.trim_pending() {
        client
            .snap_trimmed(pool, image, snaps.removals)
            .await
            .with_context(|| format!("recording the trim of {image}"))?;
    }
    Ok(freed)
}

fn check_volume_size(size_bytes: u64) -> anyhow::Result<()> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(SECTOR_BYTES) {
        bail!("--size {size_bytes}: must be a positive multiple of {SECTOR_BYTES} bytes");
    }
    Ok(())
}

/// The image's lock as `image info` shows it (JSON null when unlocked).
fn lock_json(map: &spindle_map::ClusterMap, pool: &str, image: &str) -> serde_json::Value {
    let lock = map
        .pool_by_name(pool)
        .and_then(|p| map.image_locks.get(&(p.id, image.to_string())));
    match lock {
        None => serde_json::Value::Null,
        Some(l) => serde_json::json!({
            "client": format!("{:016x}", l.client),
            "fenced_clients_in_map": map.fenced.len(),
            "generation": l.generation,
            "holder": l.holder,
            "since_unix_secs": l.since_unix_secs,
        }),
    }
}

fn print_info(info: &ImageInfo) {
    println!("image:       {}", info.name);
    println!("pool:        {}", info.pool);
    println!(
        "size:        {} ({} bytes)",
        format_size(info.size_bytes),
        info.size_bytes
    );
    println!(
        "object size: {} ({} objects)",
        format_size(info.object_size_bytes),
        info.object_count
    );
    println!("created:     {} (unix seconds)", info.created_unix_secs);
    println!("format:      {}", info.format_version);
    if !info.qos.is_unlimited() {
        println!("qos:         {}", spec_line(&info.qos));
    }
    if let (Some(parent), Some(overlap)) = (&info.parent, info.overlap_bytes) {
        println!("parent:      {parent} (overlap {})", format_size(overlap));
    }
}

fn print_lock(lock: &serde_json::Value) {
    if lock.is_null() {
        println!("lock:        none");
    } else {
        println!(
            "lock:        held by {} (client {}, generation {}, since {} unix seconds)",
            lock["holder"].as_str().unwrap_or("?"),
            lock["client"].as_str().unwrap_or("?"),
            lock["generation"],
            lock["since_unix_secs"]
        );
    }
}

/// Runs one `spindle image` subcommand.
pub fn run(command: ImageCommand, target: Target) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = Arc::new(target.client().await?);
        match command {
            ImageCommand::Create {
                name,
                size,
                object_size,
                qos,
                obj,
            } => {
                check_volume_size(size)?;
                let qos: Vec<(String, Option<u64>)> =
                    qos.iter().map(|s| qos_setting(s)).collect::<anyhow::Result<_>>()?;
                let mut spec = spindle_image::qos::QosSpec::default();
                for (k, v) in &qos {
                    spec.set(k, *v).map_err(|e| anyhow::anyhow!(e))?;
                }
                spec.check().map_err(|e| anyhow::anyhow!(e))?;
                let object_size = object_size
                    .or_else(|| spindle_image::image::default_object_size(&client.map(), &obj.pool))
                    .unwrap_or(OBJECT_SIZE_BYTES_DEFAULT);
                let img = Image::create(client.clone(), &obj.pool, &name, size, object_size)
                    .await
                    .with_context(|| format!("creating image {name}"))?;
                if !qos.is_empty() {
                    Image::update_qos(&*client, &obj.pool, &name, &qos).await?;
                }
                let info = img.info();
                println!(
                    "created image {name} ({}, {} objects of {})",
                    format_size(info.size_bytes),
                    info.object_count,
                    format_size(info.object_size_bytes)
                );
            }
            ImageCommand::Ls { json, obj } => {
                let list = Image::list(&*client, &obj.pool).await?;
                if json {
                    println!("{}", serde_json::to_string(&list)?);
                } else {
                    for i in list {
                        println!(
                            "{}\t{}\t{}",
                            i.name,
                            format_size(i.size_bytes),
                            format_size(i.object_size_bytes)
                        );
                    }
                }
            }
            ImageCommand::Info { name, json, obj } => {
                let info = Image::open(client.clone(), &obj.pool, &name).await?.info();
                let lock = lock_json(&client.map(), &obj.pool, &name);
                if json {
                    let mut doc = serde_json::to_value(&info)?;
                    doc["lock"] = lock;
                    println!("{}", serde_json::to_string(&doc)?);
                } else {
                    print_info(&info);
                    print_lock(&lock);
                }
            }
            ImageCommand::Resize { name, size, obj } => {
                check_volume_size(size)?;
                let img = Image::open(client, &obj.pool, &name).await?;
                let old = img.size_bytes();
                img.resize(size)
                    .await
                    .with_context(|| format!("resizing image {name}"))?;
                println!(
                    "resized image {name}: {} -> {}",
                    format_size(old),
                    format_size(size)
                );
            }
            ImageCommand::Snap { command } => run_snap(client, command).await?,
            ImageCommand::Clone {
                parent,
                child,
                object_size,
                obj,
            } => {
                let (parent_pool, parent_spec) = pool_spec(&parent, &obj.pool);
                let (image, snap) = snap_spec(parent_spec)?;
                let (child_pool, child_name) = pool_spec(&child, &obj.pool);
                spindle_image::clone::clone(
                    &client,
                    parent_pool,
                    image,
                    snap,
                    child_pool,
                    child_name,
                    object_size,
                )
                .await
                .with_context(|| format!("cloning {parent} as {child}"))?;
                println!("cloned {parent_pool}/{image}@{snap} as {child_pool}/{child_name}");
            }
            ImageCommand::Flatten { name, obj } => {
                let started = std::time::Instant::now();
                let work = spindle_image::clone::flatten(
                    &client,
                    &obj.pool,
                    &name,
                    crate::progress::bar(format!("flattening {name}:"), Unit::Objects),
                );
                with_image_lock(&client, &obj.pool, &name, "spindle image flatten", work)
                    .await
                    .with_context(|| format!("cannot flatten {name}"))?
                    .with_context(|| format!("flattening {name}"))?;
                println!(
                    "flattened {name} in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            ImageCommand::Children { spec, json, obj } => {
                let (image, snap) = snap_spec(&spec)?;
                let children = spindle_image::clone::children(&client, &obj.pool, image, snap)?;
                if json {
                    println!("{}", serde_json::to_string(&children)?);
                } else {
                    for c in children {
                        println!("{c}");
                    }
                }
            }
            ImageCommand::Export { spec, file, obj } => {
                let img = match spec.split_once('@') {
                    Some((image, snap)) => {
                        Image::open_snap(client.clone(), &obj.pool, image, snap).await?
                    }
                    None => Image::open(client.clone(), &obj.pool, &spec).await?,
                };
                let started = std::time::Instant::now();
                let stats = if file == "-" {
                    let mut out = StdoutSeek(std::io::stdout().lock());
                    spindle_image::transfer::export(&img, &mut out, false, |_, _| {}).await?
                } else {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&file)
                        .with_context(|| format!("creating {file} (it must not exist)"))?;
                    let stats = spindle_image::transfer::export(
                        &img,
                        &mut f,
                        true,
                        crate::progress::bar(format!("exporting {spec}:"), Unit::Bytes),
                    )
                    .await?;
                    f.set_len(stats.size_bytes)?;
                    f.sync_all()?;
                    stats
                };
                eprintln!(
                    "exported {spec}: {} ({} of data) in {:.1} s",
                    format_size(stats.size_bytes),
                    format_size(stats.data_bytes),
                    started.elapsed().as_secs_f64()
                );
                if file != "-" {
                    println!("exported {spec} to {file}");
                }
            }
            ImageCommand::Import {
                file,
                name,
                size,
                object_size,
                obj,
            } => {
                // `size`: the image's; `data_len`: the bytes read into its start.
                let (mut input, size, data_len): (Box<dyn std::io::Read>, u64, u64) =
                    if file == "-" {
                        let Some(size) = size else {
                            bail!("importing from standard input needs --size");
                        };
                        (Box::new(std::io::stdin().lock()), size, size)
                    } else {
                        let f = std::fs::File::open(&file)
                            .with_context(|| format!("opening {file}"))?;
                        let len = f.metadata()?.len();
                        let size = size.unwrap_or(len);
                        if size < len {
                            bail!(
                                "{file} has {len} bytes, more than --size {size}: a larger --size, or none"
                            );
                        }
                        (Box::new(std::io::BufReader::new(f)), size, len)
                    };
                let image_size = size.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
                check_volume_size(image_size)?;
                let object_size = object_size
                    .or_else(|| spindle_image::image::default_object_size(&client.map(), &obj.pool))
                    .unwrap_or(OBJECT_SIZE_BYTES_DEFAULT);
                let img = Image::create(client.clone(), &obj.pool, &name, image_size, object_size)
                    .await
                    .with_context(|| format!("creating image {name}"))?;
                let started = std::time::Instant::now();
                let r = spindle_image::transfer::import(
                    &img,
                    &mut input,
                    data_len,
                    crate::progress::bar(format!("importing {name}:"), Unit::Bytes),
                )
                .await;
                let stats = match r {
                    Ok(s) => s,
                    Err(e) => {
                        // No half-made image stays behind.
                        let _ = Image::remove(client.clone(), &obj.pool, &name, |_, _| {}).await;
                        return Err(anyhow::Error::new(e).context(format!("import into {name} failed; the image was removed")));
                    }
                };
                println!(
                    "imported {name}: {} ({} of data) in {:.1} s",
                    format_size(stats.size_bytes),
                    format_size(stats.data_bytes),
                    started.elapsed().as_secs_f64()
                );
            }
            ImageCommand::Diff {
                spec,
                from_snap,
                json,
                obj,
            } => {
                let (image, to) = match spec.split_once('@') {
                    Some((i, s)) => (i, Some(s)),
                    None => (spec.as_str(), None),
                };
                let dspec = spindle_image::diff::DiffSpec {
                    pool: &obj.pool,
                    image,
                    from: from_snap.as_deref(),
                    to,
                };
                let (_, extents) = spindle_image::diff::changed_extents(
                    &client,
                    &dspec,
                    crate::progress::bar(format!("comparing {spec}:"), Unit::Objects),
                )
                .await?;
                if json {
                    println!("{}", serde_json::to_string(&extents)?);
                } else {
                    println!("OFFSET\tLENGTH\tTYPE");
                    for e in extents {
                        println!(
                            "{}\t{}\t{}",
                            e.offset,
                            e.len,
                            if e.zero { "zero" } else { "data" }
                        );
                    }
                }
            }
            ImageCommand::ExportDiff {
                spec,
                file,
                from_snap,
                obj,
            } => {
                let (image, to) = match spec.split_once('@') {
                    Some((i, s)) => (i, Some(s)),
                    None => (spec.as_str(), None),
                };
                let dspec = spindle_image::diff::DiffSpec {
                    pool: &obj.pool,
                    image,
                    from: from_snap.as_deref(),
                    to,
                };
                let started = std::time::Instant::now();
                let stats = if file == "-" {
                    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                    spindle_image::diff::export_diff(&client, &dspec, &mut out, |_, _| {}).await?
                } else {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&file)
                        .with_context(|| format!("creating {file} (it must not exist)"))?;
                    let mut out = std::io::BufWriter::new(f);
                    let r = spindle_image::diff::export_diff(
                        &client,
                        &dspec,
                        &mut out,
                        crate::progress::bar(format!("exporting the diff of {spec}:"), Unit::Objects),
                    )
                    .await;
                    let stats = match r {
                        Ok(s) => s,
                        Err(e) => {
                            drop(out);
                            let _ = std::fs::remove_file(&file);
                            return Err(anyhow::Error::new(e)
                                .context(format!("exporting the diff of {spec}; {file} was removed")));
                        }
                    };
                    out.into_inner()
                        .map_err(|e| anyhow::anyhow!("writing {file}: {e}"))?
                        .sync_all()?;
                    stats
                };
                eprintln!(
                    "exported the diff of {spec}{}: {} of data, {} of zeros, {} records in {:.1} s",
                    from_snap.as_deref().map(|f| format!(" since {f}")).unwrap_or_default(),
                    format_size(stats.data_bytes),
                    format_size(stats.zero_bytes),
                    stats.records,
                    started.elapsed().as_secs_f64()
                );
            }
            ImageCommand::ImportDiff { file, name, obj } => {
                // Read twice (checked whole first): standard input is spooled to a file.
                let mut input = if file == "-" {
                    let path = std::env::temp_dir()
                        .join(format!("spindle-import-diff-{}", std::process::id()));
                    let mut f = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .with_context(|| format!("creating {}", path.display()))?;
                    let copied = std::io::copy(&mut std::io::stdin().lock(), &mut f);
                    let _ = std::fs::remove_file(&path);
                    copied.context("reading the diff from standard input")?;
                    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
                    f
                } else {
                    std::fs::File::open(&file).with_context(|| format!("opening {file}"))?
                };
                let started = std::time::Instant::now();
                let mut reader = std::io::BufReader::new(&mut input);
                let work = spindle_image::diff::import_diff(
                    &client,
                    &obj.pool,
                    &name,
                    &mut reader,
                    crate::progress::bar(format!("applying the diff to {name}:"), Unit::Bytes),
                );
                let s = with_image_lock(&client, &obj.pool, &name, "spindle image import-diff", work)
                    .await
                    .with_context(|| format!("cannot apply a diff to {name}"))?
                    .with_context(|| format!("applying {file} to {name}"))?;
                println!(
                    "applied {file} to {name}: {} of data, {} of zeros{} in {:.1} s",
                    format_size(s.data_bytes),
                    format_size(s.zero_bytes),
                    s.to.as_deref().map(|t| format!(", snapshot {name}@{t}")).unwrap_or_default(),
                    started.elapsed().as_secs_f64()
                );
            }
            ImageCommand::Config { command } => match command {
                ConfigCommand::Set {
                    name,
                    settings,
                    obj,
                } => {
                    let changes: Vec<(String, Option<u64>)> = settings
                        .iter()
                        .map(|s| qos_setting(s))
                        .collect::<anyhow::Result<_>>()?;
                    let spec = Image::update_qos(&*client, &obj.pool, &name, &changes)
                        .await
                        .with_context(|| format!("configuring {name}"))?;
                    println!("{name}: {}", spec_line(&spec));
                }
                ConfigCommand::Rm { name, keys, obj } => {
                    let changes: Vec<(String, Option<u64>)> =
                        keys.into_iter().map(|k| (k, None)).collect();
                    let spec = Image::update_qos(&*client, &obj.pool, &name, &changes)
                        .await
                        .with_context(|| format!("configuring {name}"))?;
                    println!("{name}: {}", spec_line(&spec));
                }
                ConfigCommand::Get { name, json, obj } => {
                    let info = Image::open(client.clone(), &obj.pool, &name).await?.info();
                    if json {
                        println!("{}", serde_json::to_string(&info.qos)?);
                    } else {
                        for (k, v) in info.qos.pairs() {
                            println!("{k}={v}");
                        }
                    }
                }
            },
            ImageCommand::Stats { watch, json, obj } => loop {
                print_stats(&client, &obj.pool, json).await?;
                if !watch {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                println!();
            },
            ImageCommand::Du { name, json, obj } => {
                let usage = spindle_image::transfer::usage(&client, &obj.pool, name.as_deref()).await?;
                if json {
                    println!("{}", serde_json::to_string(&usage)?);
                } else {
                    println!("NAME\tPROVISIONED\tUSED");
                    for u in usage {
                        for s in &u.snapshots {
                            println!(
                                "{}@{}\t{}\t{}",
                                u.name,
                                s.name,
                                format_size(s.provisioned_bytes),
                                format_size(s.used_bytes)
                            );
                        }
                        println!(
                            "{}\t{}\t{}",
                            u.name,
                            format_size(u.provisioned_bytes),
                            format_size(u.used_bytes)
                        );
                        if u.trimming_bytes > 0 {
                            println!(
                                "{} (removed snapshots, being freed)\t-\t{}",
                                u.name,
                                format_size(u.trimming_bytes)
                            );
                        }
                    }
                }
            }
            ImageCommand::Rm { name, obj } => {
                spindle_image::admin::remove(
                    &client,
                    &obj.pool,
                    &name,
                    "spindle image rm",
                    crate::progress::bar(format!("removing {name}:"), Unit::Objects),
                )
                .await
                .with_context(|| format!("cannot remove image {name}"))?;
                println!("removed image {name}");
            }
        }
        anyhow::Ok(())
    })
}
