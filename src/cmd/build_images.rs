//! `lego-rl build-images`: one content-addressed image per task environment.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Build (or find cached) container images for tasks.
///
/// One image per task environment, tagged by a content hash of Dockerfile, context, base image
/// and build args, so unchanged tasks are cache hits. Writes a manifest of image records.
///
/// Example:
///   lego-rl build-images -i run/tasks.kept.jsonl.zst -o run/images.jsonl.zst -j 2
#[derive(Args, Debug)]
pub struct BuildImagesArgs {
    /// Tasks (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub input: PathBuf,
    /// Image manifest (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Parallel builds.
    #[arg(short, long, default_value_t = 2)]
    pub jobs: usize,
}

/// Runs `build-images`.
pub fn run(_args: BuildImagesArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("build-images").into())
}
