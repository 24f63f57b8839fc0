//! `spindle prog` (load, check, ls programs) and `spindle exec` (run one next to objects):
//! pushdown programs, issue #23 (`docs/pushdown.md`).

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use spindle_client::ExecOptions;
use spindle_cluster::{runtime, Target};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ProgCommand {
    /// Verify a program's object file (`clang -O2 -target bpf -c`) and store it in a pool
    /// under NAME (content-addressed: the file under its BLAKE3 id, NAME pointing at it).
    Load {
        name: String,
        file: PathBuf,
        /// Pool to store it in (runs on objects of this pool use it).
        #[arg(long, default_value = "default")]
        pool: String,
        #[command(flatten)]
        target: Target,
    },
    /// Verify a program's object file here, without a cluster: prints its id, size and the
    /// helpers it calls, or why it is refused.
    Check { file: PathBuf },
    /// Programs stored in a pool, by name.
    Ls {
        #[arg(long, default_value = "default")]
        pool: String,
        #[command(flatten)]
        target: Target,
    },
    /// Print the C header programs include (`spindle_prog.h`).
    Header,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EngineArg {
    Jit,
    Interpreter,
}

#[derive(Args)]
pub struct ExecArgs {
    /// Program name (as loaded with `spindle prog load`) or id.
    pub program: String,
    /// Objects to run it against: one run each; `a,b,c` is one run over several objects of
    /// one placement group (names sharing a `{key}`).
    #[arg(required = true)]
    pub objects: Vec<String>,
    #[arg(long, default_value = "default")]
    pub pool: String,
    #[arg(long, value_enum, default_value = "jit")]
    pub engine: EngineArg,
    /// Read objects through the daemons' data cache (and fill it).
    #[arg(long)]
    pub cache: bool,
    /// On an erasure-coded pool, run once per data shard on the daemon holding it, over
    /// that shard's stripe units of the objects (`in->part` of `in->parts`); each part is
    /// reported. Ignored on replicated pools.
    #[arg(long)]
    pub shards: bool,
    /// Arguments as little-endian u64 values, in order (`--arg 5 --arg 9`).
    #[arg(long = "arg")]
    pub args_u64: Vec<u64>,
    /// Arguments from a file (after any `--arg` values).
    #[arg(long)]
    pub args_file: Option<PathBuf>,
    /// Write the runs' outputs here, one after the other in the order given ("-": stdout).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Runs in flight at once.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// One JSON line per run: objects, return value, output length (and output in hex
    /// when it is at most 256 bytes).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

pub fn prog(command: ProgCommand) -> anyhow::Result<()> {
    match command {
        ProgCommand::Check { file } => {
            let elf =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let p = spindle_prog::Program::load(&elf)
                .with_context(|| format!("{} is not a valid program", file.display()))?;
            println!(
                "{}: program {} ({} bytes, {} instructions; helpers: {})",
                file.display(),
                p.id_hex(),
                elf.len(),
                p.instructions,
                if p.helpers_used.is_empty() {
                    "none".to_string()
                } else {
                    p.helpers_used.join(", ")
                }
            );
            Ok(())
        }
        ProgCommand::Load {
            name,
            file,
            pool,
            target,
        } => {
            if name.is_empty() || name.len() > 128 || name.contains('\0') {
                bail!("a program name is 1 to 128 bytes without NUL");
            }
            let elf =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            // Refused here with the verifier's reason rather than at the first run.
            let p = spindle_prog::Program::load(&elf)
                .with_context(|| format!("{} is not a valid program", file.display()))?;
            runtime()?.block_on(async {
                let client = target.client().await?;
                let code = client.program_store(&pool, &name, elf).await?;
                println!(
                    "loaded program {name} = {} ({} bytes, {} instructions) into pool {pool}",
                    code.id_hex(),
                    code.elf.len(),
                    p.instructions
                );
                anyhow::Ok(())
            })
        }
        ProgCommand::Ls { pool, target } => runtime()?.block_on(async {
            let client = target.client().await?;
            let mut names: Vec<String> = client
                .list(&pool)
                .await?
                .into_iter()
                .filter_map(|l| l.name.strip_prefix(".prog.name.").map(str::to_string))
                .collect();
            names.sort();
            for n in names {
                let code = client.program(&pool, &n).await?;
                println!("{n}\t{}\t{} bytes", code.id_hex(), code.elf.len());
            }
            anyhow::Ok(())
        }),
        ProgCommand::Header => {
            print!("{}", spindle_prog::HEADER);
            Ok(())
        }
    }
}

pub fn exec(a: ExecArgs) -> anyhow::Result<()> {
    use futures::StreamExt;
    let mut args = Vec::new();
    for v in &a.args_u64 {
        args.extend_from_slice(&v.to_le_bytes());
    }
    if let Some(f) = &a.args_file {
        args.extend(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?);
    }
    let opts = ExecOptions {
        jit: matches!(a.engine, EngineArg::Jit),
        cache: a.cache,
        shards: a.shards,
    };
    runtime()?.block_on(async {
        let client = a.target.client().await?;
        let code = client.program(&a.pool, &a.program).await?;
        let runs: Vec<Vec<String>> = a
            .objects
            .iter()
            .map(|o| o.split(',').map(str::to_string).collect())
            .collect();
        let (client, code, args, pool) = (&client, &code, &args, &a.pool);
        let results: Vec<_> = futures::stream::iter(runs.iter().map(|objs| async move {
            let names: Vec<&str> = objs.iter().map(String::as_str).collect();
            client.exec(pool, &names, code, args, opts).await
        }))
        .buffered(a.parallel.max(1))
        .collect()
        .await;
        let mut out: Option<Box<dyn std::io::Write>> = match &a.output {
            None => None,
            Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout())),
            Some(p) => Some(Box::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            )),
        };
        let to_stdout = a.output.as_ref().is_some_and(|p| p.as_os_str() == "-");
        let mut failures = 0;
        for (objs, r) in runs.iter().zip(results) {
            let what = objs.join(",");
            match r {
                Ok(r) => {
                    if let Some(w) = out.as_mut() {
                        w.write_all(&r.output)?;
                    }
                    let line = if a.json {
                        let mut line = serde_json::json!({
                            "objects": objs,
                            "ret": r.ret,
                            "output_bytes": r.output.len(),
                        });
                        if !r.parts.is_empty() {
                            line["parts"] = r
                                .each_part()
                                .iter()
                                .map(|(ret, out)| {
                                    serde_json::json!({"ret": ret, "output_bytes": out.len()})
                                })
                                .collect::<Vec<_>>()
                                .into();
                        }
                        if r.output.len() <= 256 {
                            line["output_hex"] = hex(&r.output).into();
                        }
                        line.to_string()
                    } else {
                        let parts = if r.parts.is_empty() {
                            String::new()
                        } else {
                            format!(" (the sum of {} shard parts)", r.parts.len())
                        };
                        format!(
                            "{what}: returned {}, {} bytes out{parts}",
                            r.ret,
                            r.output.len()
                        )
                    };
                    // The report goes beside the output, never into it.
                    if to_stdout {
                        eprintln!("{line}");
                    } else {
                        println!("{line}");
                    }
                }
                Err(e) => {
                    failures += 1;
                    eprintln!("{what}: {e}");
                }
            }
        }
        if failures > 0 {
            bail!("{failures} of {} runs failed", runs.len());
        }
        anyhow::Ok(())
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
