//! `lego-rl build-images`: one content-addressed image per task environment.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::cli::GlobalArgs;
use crate::io::{read_all, AtomicWriter, ReadOptions};
use crate::records::{ImageRecord, Task};
use crate::sandbox::{build_images, BuildSettings, Engine, DEFAULT_BASE_IMAGE};

/// Build (or find cached) container images for tasks.
///
/// One image per task environment, tagged by a content hash of Dockerfile, context, base image
/// and build args, so unchanged tasks are cache hits. Layers: base → environment (shared by tasks
/// with the same repository setup) → task. One failed build does not stop the others; exits 1 if
/// any failed. Writes a manifest of image records. The base image comes from
/// `scripts/bootstrap-base-image.sh` where no registry is reachable.
///
/// Example:
///   lego-rl build-images -i run/tasks.kept.jsonl.zst -o run/images.jsonl.zst -j 2
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct BuildImagesArgs {
    /// Tasks (zstd JSONL); relative paths in them resolve against this file's directory.
    #[arg(short, long)]
    pub input: PathBuf,
    /// Image manifest (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Parallel builds.
    #[arg(short, long, default_value_t = 2)]
    pub jobs: usize,
    /// Base image of tasks without their own Dockerfile.
    #[arg(long, default_value = DEFAULT_BASE_IMAGE)]
    pub base_image: String,
    /// Directory for per-image build logs (default: `<output dir>/build-logs`, or ./build-logs).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

/// Runs `build-images`.
pub fn run(args: BuildImagesArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let tasks: Vec<Task> = read_all(&args.input, ReadOptions::default())
        .with_context(|| format!("reading tasks from {}", args.input.display()))?;
    let task_root = args
        .input
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| match args.output.to_str() {
            Some("-") | None => PathBuf::from("build-logs"),
            Some(_) => args.output.parent().unwrap_or(Path::new(".")).join("build-logs"),
        });
    let settings = BuildSettings {
        base_image: args.base_image.clone(),
        jobs: args.jobs.max(1),
        log_dir,
        task_root,
    };
    let bar = crate::ui::bar(crate::ui::progress_enabled(global), tasks.len() as u64, "images");
    let run_id = format!("build-{}", uuid::Uuid::new_v4().simple());
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let records: Vec<ImageRecord> = rt.block_on(async {
        let engine = Engine::connect().await?;
        build_images(&engine, &tasks, &settings, &run_id, &|r: &ImageRecord| {
            bar.inc(1);
            if let Some(e) = &r.error {
                tracing::error!("{}: {e}", r.task_id);
            } else {
                tracing::info!(
                    "{}: {} ({}, {:.1}s)",
                    r.task_id,
                    r.image,
                    if r.cache_hit { "cached" } else { "built" },
                    r.seconds
                );
            }
        })
        .await
    })?;
    bar.finish_and_clear();
    let mut out =
        AtomicWriter::create(&args.output).with_context(|| format!("writing {}", args.output.display()))?;
    for r in &records {
        out.write(r)?;
    }
    out.finish()?;
    let failed: Vec<&ImageRecord> = records.iter().filter(|r| r.error.is_some()).collect();
    let hits = records.iter().filter(|r| r.cache_hit).count();
    eprintln!(
        "build-images: {} tasks, {} built, {} cached, {} failed",
        records.len(),
        records.len() - hits - failed.len(),
        hits,
        failed.len()
    );
    for r in &failed {
        eprintln!("  failed: {}: {}", r.task_id, r.error.as_deref().unwrap_or(""));
    }
    Ok(if failed.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Failures
    })
}
