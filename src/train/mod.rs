//! GSPO training with MoE routing replay: one `train-step` = read samples, recompute π_old with
//! the recorded routing, apply the GSPO (or GSPO-token / SFT) update with gradient accumulation
//! over token-budget micro-batches, and write the next checkpoint with its optimizer state.
//!
//! - [`gspo`]: the objective and group-relative advantages (pure math, hand-checked).
//! - [`batch`]: sample validation, trajectories, groups, micro-batching.
//! - [`harness_metrics`]: the step's figures split by harness (`StepMetrics::by_harness`).
//! - [`optim`]: AdamW, LR schedule, optimizer state on disk.
//! - [`trainer`]: the step itself and its [`StepMetrics`](crate::records::StepMetrics).
//! - [`groups`]: the parameter groups (which parameters, reduced over which ranks, with which
//!   optimizer storage) that the update, saving, loading and memory figures loop over.
//! - [`shard`], [`zero`]: the same step on many ranks (data parallel; ZeRO-1 optimizer state).
//! - [`state`]: the optimizer state on disk (one layout, and the older ones it still reads).
//! - [`plan`]: the memory one rank needs for a step, from `config.json` alone (`--plan`).
//! - [`expert`]: expert parallelism (each rank holds some experts of every MoE layer).

pub mod batch;
pub mod correction;
pub mod expert;
pub mod groups;
pub mod gspo;
pub mod harness_metrics;
pub mod metrics;
pub mod optim;
pub mod plan;
mod save;
pub mod settings;
pub mod shard;
pub mod state;
pub mod trainer;
mod update;
pub mod zero;

use std::path::PathBuf;

pub use gspo::LossKind;
pub use optim::{AdamWConfig, Schedule};
pub use settings::Settings;
pub use trainer::{CheckpointInfo, Trainer};

/// Errors of a training step; each names the file, record or tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: record {record} (sample `{id}`): {msg}")]
    BadSample {
        path: PathBuf,
        record: usize,
        id: String,
        msg: String,
    },
    #[error("{path}: no samples")]
    NoSamples { path: PathBuf },
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("{path}: optimizer state: {msg}")]
    OptimizerState { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    Output { path: PathBuf, msg: String },
    #[error("--freeze {pattern}: {msg}")]
    Freeze { pattern: String, msg: String },
    #[error("non-finite {what} ({value}); no update written")]
    NonFinite { what: &'static str, value: f64 },
    #[error("non-finite {what} ({value}) at policy token {token} of sample `{sample}`; no update written")]
    NonFiniteSample {
        what: &'static str,
        sample: String,
        token: usize,
        value: f64,
    },
    #[error("non-finite gradient norm ({value}): the gradient of sample `{sample}` alone is not finite; no update written")]
    NonFiniteGradient { sample: String, value: f64 },
    #[error("{0}")]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Dist(#[from] crate::c10d::DistError),
}
