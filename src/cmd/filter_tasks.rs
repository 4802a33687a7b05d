//! `lego-rl filter-tasks`: from a raw task pool to a difficulty-banded training set.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Filter a task pool into a training set, reporting the funnel.
///
/// Stages (each optional, each reported): rules, decontamination against an evaluation set,
/// validity in sandboxes, a difficulty band from reference-policy trials, and online
/// re-filtering of saturated tasks.
///
/// Example:
///   lego-rl filter-tasks -i pool.jsonl.zst -o run/tasks.kept.jsonl.zst \
///       --exclude-instances swebench_verified_ids.txt --trials ref-trials.jsonl.zst
#[derive(Args, Debug)]
pub struct FilterTasksArgs {
    /// Task pool: SWE-bench JSONL, Harbor task directories or lego-rl task records.
    #[arg(short, long, required = true)]
    pub input: Vec<PathBuf>,
    /// Kept tasks (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

/// Runs `filter-tasks`.
pub fn run(_args: FilterTasksArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("filter-tasks").into())
}
