//! `lego-rl build-images`: one content-addressed image per task environment, and the agent
//! runtime volumes of the harnesses named with `--harness`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::harness::Harness;
use crate::io::{read_all, AtomicWriter};
use crate::records::{ImageRecord, Task};
use crate::sandbox::runtime::{default_cache_dir, ensure_runtimes, RuntimeVolume};
use crate::sandbox::{build_images, BuildSettings, Engine, SandboxError, DEFAULT_BASE_IMAGE};
use crate::settings::GlobalArgs;

/// Build (or find cached) container images for tasks.
///
/// One image per task environment, tagged by a content hash of Dockerfile, context, base image
/// and build args, so unchanged tasks are cache hits. Layers: base → environment (shared by tasks
/// with the same repository setup) → task. One failed build does not stop the others; exits 1 if
/// any failed. Writes a manifest of image records. The base image comes from
/// `scripts/bootstrap-base-image.sh` where no registry is reachable.
///
/// With `--harness FILE`, also builds each harness's agent runtime (its `[runtime]` PyPI packages
/// in a venv) once into a Docker volume `lego-rl-runtime-<harness>-<hash>` on the base image;
/// trials mount it read-only at /opt/lego-agent. Wheels are downloaded on the host (cached in
/// $LEGO_RL_CACHE/runtime-wheels, default ~/.cache/lego-rl) and installed offline. An existing
/// volume is a cache hit. The volumes are listed on stderr.
///
/// Example:
///   lego-rl build-images -i run/tasks.kept.jsonl.zst -o run/images.jsonl.zst -j 2 \
///     --harness examples/harnesses/mini-swe-agent.toml
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct BuildImagesArgs {
    /// Tasks (zstd JSONL); relative paths in them resolve against this file's directory. The
    /// global --strict applies to its records.
    #[arg(short, long, required_unless_present = "harness")]
    pub input: Option<PathBuf>,
    /// Image manifest (zstd JSONL) of the tasks of --input.
    #[arg(short, long, default_value = "-", requires = "input")]
    pub output: PathBuf,
    /// Parallel image builds (of the tasks of --input).
    #[arg(short, long, default_value_t = 2, requires = "input")]
    pub jobs: usize,
    /// Base image of tasks without their own Dockerfile, and of the harness runtimes.
    #[arg(long, default_value = DEFAULT_BASE_IMAGE)]
    pub base_image: String,
    /// Directory for per-image build logs (default: `<output dir>/build-logs`, or ./build-logs).
    #[arg(long, requires = "input")]
    pub log_dir: Option<PathBuf>,
    /// Harness adapter (TOML) whose agent runtime to build into a volume; repeatable.
    #[arg(long, value_name = "FILE")]
    pub harness: Vec<PathBuf>,
}

/// What the flags resolve to, worked out before any work starts: every flag is checked and every
/// input read here, so a typo or a bad record fails before the first (minutes-long) build.
struct Resolved {
    /// The harnesses whose runtimes to build (none: images only).
    harnesses: Vec<Harness>,
    /// The image builds, when --input is given.
    images: Option<Images>,
    base_image: String,
}

/// The image builds of `--input`'s tasks.
struct Images {
    tasks: Vec<Task>,
    settings: BuildSettings,
    output: PathBuf,
}

impl Resolved {
    fn from_args(args: BuildImagesArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        anyhow::ensure!(args.jobs >= 1, "--jobs 0: need at least 1");
        if global.strict && args.input.is_none() {
            anyhow::bail!("--strict: build-images reads records only from --input (harness adapters are always checked)");
        }
        let harnesses = args
            .harness
            .iter()
            .map(|p| Harness::load(p))
            .collect::<Result<Vec<_>, _>>()?;
        let images = match &args.input {
            Some(input) => Some(Images::resolve(input, &args, global)?),
            None => None,
        };
        Ok(Resolved {
            harnesses,
            images,
            base_image: args.base_image,
        })
    }
}

impl Images {
    fn resolve(input: &Path, args: &BuildImagesArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        let tasks: Vec<Task> = read_all(input, global.read_options())
            .with_context(|| format!("reading tasks from {}", input.display()))?;
        let task_root = input
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
        Ok(Images {
            tasks,
            settings: BuildSettings {
                base_image: args.base_image.clone(),
                jobs: args.jobs,
                log_dir,
                task_root,
            },
            output: args.output.clone(),
        })
    }
}

/// Runs `build-images`.
pub fn run(args: BuildImagesArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let resolved = Resolved::from_args(args, global)?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let runtimes_ok =
        resolved.harnesses.is_empty() || build_runtimes(&rt, &resolved.harnesses, &resolved.base_image)?;
    let images_ok = match &resolved.images {
        Some(images) => build_task_images(&rt, images, global)?,
        None => true,
    };
    Ok(if images_ok && runtimes_ok {
        Outcome::Ok
    } else {
        Outcome::Failures
    })
}

/// Builds (or finds) the tasks' images and writes their manifest, with a summary on stderr; false
/// if any failed.
fn build_task_images(
    rt: &tokio::runtime::Runtime,
    images: &Images,
    global: &GlobalArgs,
) -> anyhow::Result<bool> {
    let tasks = &images.tasks;
    let bar = crate::ui::bar(crate::ui::progress_enabled(global), tasks.len() as u64, "images");
    let run_id = format!("build-{}", uuid::Uuid::new_v4().simple());
    let records: Vec<ImageRecord> = rt.block_on(async {
        let engine = Engine::connect().await?;
        build_images(&engine, tasks, &images.settings, &run_id, &|r: &ImageRecord| {
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
    let output = &images.output;
    let mut out = AtomicWriter::create(output).with_context(|| format!("writing {}", output.display()))?;
    for r in &records {
        out.write(r)?;
    }
    out.finish()?;
    let failed: Vec<&ImageRecord> = records.iter().filter(|r| r.error.is_some()).collect();
    let hits = records.iter().filter(|r| r.cache_hit).count();
    crate::stderr_line!(
        "build-images: {} tasks, {} built, {} cached, {} failed",
        records.len(),
        records.len() - hits - failed.len(),
        hits,
        failed.len()
    );
    for r in &failed {
        crate::stderr_line!("  failed: {}: {}", r.task_id, r.error.as_deref().unwrap_or(""));
    }
    Ok(failed.is_empty())
}

/// Builds (or finds) the harnesses' runtime volumes, one summary line each on stderr; false if any
/// failed.
fn build_runtimes(
    rt: &tokio::runtime::Runtime,
    harnesses: &[Harness],
    base_image: &str,
) -> anyhow::Result<bool> {
    let cache = default_cache_dir();
    let results = rt.block_on(async {
        let engine = Engine::connect().await?;
        let report = |h: &Harness, r: &Result<RuntimeVolume, SandboxError>| match r {
            Ok(v) => crate::stderr_line!(
                "runtime {}: volume {} ({}, {:.1}s)",
                h.config.name,
                v.name,
                if v.cache_hit { "cached" } else { "built" },
                v.seconds
            ),
            Err(e) => crate::stderr_line!("runtime {}: failed: {e}", h.config.name),
        };
        anyhow::Ok(ensure_runtimes(&engine, harnesses, base_image, &cache, &report).await)
    })?;
    Ok(results.iter().all(Result::is_ok))
}
