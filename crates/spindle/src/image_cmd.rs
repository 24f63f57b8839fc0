//! `spindle image`: block images striped over objects (`create`, `ls`, `info`, `resize`,
//! `rm`). Images live in a pool (`--pool`, default `default`); the cluster is found
//! through `--dir`/`--mon` like every cluster command.

use crate::cluster_cmd::ObjArgs;
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
    /// Delete an image and all its data objects.
    Rm {
        name: String,
        #[command(flatten)]
        obj: ObjArgs,
    },
}

fn check_volume_size(size_bytes: u64) -> anyhow::Result<()> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(SECTOR_BYTES) {
        bail!("--size {size_bytes}: must be a positive multiple of {SECTOR_BYTES} bytes");
    }
    Ok(())
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
                obj,
            } => {
                check_volume_size(size)?;
                let object_size = object_size
                    .or_else(|| spindle_image::image::default_object_size(&client.map(), &obj.pool))
                    .unwrap_or(OBJECT_SIZE_BYTES_DEFAULT);
                let img = Image::create(client, &obj.pool, &name, size, object_size)
                    .await
                    .with_context(|| format!("creating image {name}"))?;
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
                let info = Image::open(client, &obj.pool, &name).await?.info();
                if json {
                    println!("{}", serde_json::to_string(&info)?);
                } else {
                    print_info(&info);
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
            ImageCommand::Rm { name, obj } => {
                let mut shown = false;
                Image::remove(client, &obj.pool, &name, |done, total| {
                    // A counter line on stderr for images with more than a handful of
                    // objects.
                    if total > 64 {
                        let mut err = std::io::stderr();
                        let _ = write!(err, "\rremoving {name}: {done}/{total} objects");
                        let _ = err.flush();
                        shown = true;
                    }
                })
                .await
                .with_context(|| format!("removing image {name}"))?;
                if shown {
                    eprintln!();
                }
                println!("removed image {name}");
            }
        }
        anyhow::Ok(())
    })
}
