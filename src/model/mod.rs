//! Qwen3, Qwen3-MoE and the hybrid Qwen3-Next / Qwen3.5-MoE family in tch, loaded from and saved
//! to Hugging Face checkpoints.
//!
//! - [`Config`]: `config.json` in both key layouts found in the wild.
//! - [`CausalLm`]: the network; var names equal HF tensor names, so [`Model::load`] /
//!   [`Model::save`] move safetensors in and out without renaming.
//! - MoE forward returns the expert ids it used (`[T, moe_layers, k]`) and replays given ids (R3).
//! - The head ([`CausalLm::next_token_logprobs_chunked`], [`CausalLm::backward_logprobs`])
//!   scores only the positions asked for, in chunks of positions, without keeping
//!   `[positions, vocab]` logits for the backward.
//! - [`KvCache`] + [`ForwardInput`] with positions let an inference engine decode incrementally;
//!   [`CausalLm::decode_batch`] decodes one token of several sequences (own caches) in one forward.
//! - [`probe`]: the fixed sequence whose log-probs verify that a server serves a checkpoint.
//! - [`shapes`]: every parameter's name, shape and role for a config, without building the model
//!   (memory plans, parameter counts).

mod cache;
mod checkpoint;
mod config;
pub mod expert_parallel;
mod gated_deltanet;
mod head;
mod layers;
mod moe;
pub mod probe;
mod qwen3;
pub mod sampled;
pub mod shapes;
mod sharded;

use std::path::PathBuf;

pub use cache::{tensor_bytes, KvCache, LinearState, StateSnapshot};
pub use checkpoint::{parse_device, parse_kind, Model, AUX_FILES};
pub use config::{Config, LayerType, SUPPORTED_MODEL_TYPES};
pub use expert_parallel::{ExpertComm, ExpertShard};
pub use gated_deltanet::CHUNK as DELTA_CHUNK;
pub use head::{DEFAULT_LOGPROB_CHUNK, ENTROPY_SAMPLE};
pub use layers::AttnMask;
pub use moe::MoeRouting;
pub use qwen3::{CausalLm, FeedForward, ForwardInput, ForwardOutput, Mixer};
pub use sharded::{shard_file, ExpertLayout};

/// Errors of loading, saving and configuring a model; each names the file and tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{path}: invalid safetensors: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("{dir}: checkpoint has no tensor `{name}` (needed by the model in config.json)")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {got:?}, the config needs {want:?}")]
    Shape {
        path: PathBuf,
        name: String,
        got: Vec<i64>,
        want: Vec<i64>,
    },
    #[error("{path}: tensor `{name}` has unsupported dtype {dtype}")]
    DType {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{dir}: no model.safetensors or model.safetensors.index.json")]
    NoWeights { dir: PathBuf },
    #[error("{0}")]
    Torch(#[from] tch::TchError),
}
