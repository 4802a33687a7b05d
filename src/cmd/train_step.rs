//! `lego-rl train-step`: one GSPO update with MoE routing replay.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::cli::GlobalArgs;
use crate::io::{read_all, AppendWriter, ReadOptions};
use crate::model::{parse_device, parse_kind, DEFAULT_LOGPROB_CHUNK};
use crate::records::Sample;
use crate::train::{trainer::check_out, AdamWConfig, LossKind, Schedule, Settings, Trainer};

/// Update the policy with GSPO on aligned samples, replaying rollout routing.
///
/// Reads samples, recomputes old log-probs with the recorded MoE routing (R3), applies the
/// sequence-level GSPO loss with group-relative advantages, and writes a new Hugging Face
/// checkpoint (plus optimizer state and lego-rl.json, so the next step resumes exactly) and
/// appends one step-metrics record. Nothing is written to --out unless the step succeeds.
///
/// Example:
///   lego-rl train-step --checkpoint run/checkpoints/step-000000 -i run/samples/step-000000.jsonl.zst \
///       --out run/checkpoints/step-000001 --metrics run/metrics.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct TrainStepArgs {
    /// Samples (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub input: PathBuf,
    /// Checkpoint to start from (Hugging Face layout).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Directory of the new checkpoint (must not exist, or be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Step-metrics file to append one record to.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype (float32, bfloat16); default: the checkpoint's. Saved weights keep the
    /// checkpoint's dtype.
    #[arg(long)]
    pub dtype: Option<String>,
    /// Objective.
    #[arg(long, value_enum, default_value = "gspo")]
    pub loss: LossKind,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    /// Final learning rate of the cosine schedule.
    #[arg(long, default_value_t = 0.0)]
    pub min_lr: f64,
    /// Linear warmup, in optimizer updates.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Schedule after warmup.
    #[arg(long, value_enum, default_value = "constant")]
    pub schedule: Schedule,
    /// Optimizer updates over which the cosine schedule decays.
    #[arg(long, default_value_t = 1000)]
    pub total_steps: u64,
    /// AdamW weight decay (not applied to norms and biases).
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Lower clip range of the sequence ratio.
    #[arg(long, default_value_t = 3e-4)]
    pub eps_low: f64,
    /// Upper clip range of the sequence ratio.
    #[arg(long, default_value_t = 4e-4)]
    pub eps_high: f64,
    /// Optimizer updates per step (mini-batches of whole groups).
    #[arg(long, default_value_t = 1)]
    pub updates: usize,
    /// Tokens per packed micro-batch (gradient accumulation over micro-batches).
    #[arg(long, default_value_t = 8192)]
    pub micro_batch_tokens: usize,
    /// Recompute each layer's activations in the backward pass (per-layer activation
    /// checkpointing): activation memory of one layer instead of all, for one more forward pass.
    #[arg(long)]
    pub activation_checkpointing: bool,
    /// Positions per chunk of the LM head (0 = off: all scored positions at once).
    ///
    /// Log-probs and their gradient are computed chunk by chunk, with the softmax gradient in
    /// closed form, so at most N × vocab logits exist at a time instead of one per scored token
    /// of the micro-batch (on a 151936-token vocabulary these dominate memory). Same gradients.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LOGPROB_CHUNK)]
    pub logprob_chunk: usize,
    /// Gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Truncated importance-sampling cap on π_old/π_rollout per token (off when absent).
    #[arg(long)]
    pub tis_cap: Option<f64>,
    /// Parameters not to update: a regular expression matched anywhere in the Hugging Face
    /// parameter names (e.g. `embed_tokens` freezes the token embeddings, and with them a tied
    /// LM head). Matching no parameter, or all of them, is an error.
    #[arg(long, value_name = "REGEX")]
    pub freeze: Option<String>,
    /// Seed of torch's generator.
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
}

/// Runs `train-step`.
pub fn run(args: TrainStepArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let device = parse_device(&args.device)
        .with_context(|| format!("--device {}: expected cpu, cuda or cuda:N", args.device))?;
    let kind = args
        .dtype
        .as_deref()
        .map(|d| parse_kind(d).with_context(|| format!("--dtype {d}: expected float32 or bfloat16")))
        .transpose()?;
    let settings = Settings {
        loss: args.loss,
        eps_low: args.eps_low,
        eps_high: args.eps_high,
        updates: args.updates.max(1),
        micro_batch_tokens: args.micro_batch_tokens.max(1),
        activation_checkpointing: args.activation_checkpointing,
        logprob_chunk: (args.logprob_chunk > 0).then_some(args.logprob_chunk),
        max_grad_norm: args.max_grad_norm,
        tis_cap: args.tis_cap,
        adv_eps: 1e-6,
        freeze: args.freeze,
        optim: AdamWConfig {
            lr: args.lr,
            min_lr: args.min_lr,
            warmup_steps: args.warmup_steps,
            schedule: args.schedule,
            total_steps: args.total_steps,
            weight_decay: args.weight_decay,
            ..AdamWConfig::default()
        },
    };
    check_out(&args.out)?;
    tch::manual_seed(args.seed);
    let samples: Vec<Sample> = read_all(
        &args.input,
        ReadOptions {
            strict: true,
            ..ReadOptions::default()
        },
    )?;
    let mut trainer = Trainer::load(&args.checkpoint, device, kind)
        .with_context(|| format!("loading checkpoint {}", args.checkpoint.display()))?;
    let metrics = trainer.step(&samples, &args.input, &settings)?;
    trainer.save_atomic(&args.out)?;
    tracing::info!(
        step = metrics.step,
        loss = metrics.loss,
        grad_norm = metrics.grad_norm,
        tokens_per_second = metrics.tokens_per_second,
        "train-step done"
    );
    if let Some(path) = &args.metrics {
        let (mut w, _) = AppendWriter::open(path)?;
        w.push(&metrics)?;
        w.commit()?;
    }
    Ok(Outcome::Ok)
}
