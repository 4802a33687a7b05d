//! `lego-rl train-step`: one GSPO update with MoE routing replay.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Update the policy with GSPO on aligned samples, replaying rollout routing.
///
/// Reads samples, recomputes old log-probs with the recorded MoE routing (R3), applies the
/// sequence-level GSPO loss with group-relative advantages, and writes a new Hugging Face
/// checkpoint plus one step-metrics record.
///
/// Example:
///   lego-rl train-step --checkpoint run/checkpoints/step-000000 -i run/samples/step-000000.jsonl.zst \
///       --out run/checkpoints/step-000001 --metrics run/metrics.jsonl.zst
#[derive(Args, Debug)]
pub struct TrainStepArgs {
    /// Samples (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub input: PathBuf,
    /// Checkpoint to start from (Hugging Face layout).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Directory of the new checkpoint.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `train-step`.
pub fn run(_args: TrainStepArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("train-step").into())
}
