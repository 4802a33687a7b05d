//! `lego-rl rollout`: real harnesses in sandboxes, through the capturing proxy, in groups.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Run harnesses on tasks in sandboxes and record trajectories.
///
/// For each task, a group of trials: one container, one trial token on the in-process proxy,
/// one harness run, graded. Every model call is captured token-exactly.
///
/// Example:
///   lego-rl rollout -i run/tasks.kept.jsonl.zst --images run/images.jsonl.zst \
///       --harness examples/harnesses/mini-swe-agent.toml \
///       --backend embedded:run/checkpoints/step-000000 -o run/trajectories/step-000000.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct RolloutArgs {
    /// Tasks (zstd JSONL).
    #[arg(short, long)]
    pub input: PathBuf,
    /// Trajectories (zstd JSONL, appended as groups complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Trials per task.
    #[arg(long, default_value_t = 8)]
    pub group_size: u32,
}

/// Runs `rollout`.
pub fn run(_args: RolloutArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("rollout").into())
}
