//! The weight probe: a fixed token sequence whose log-probs under a checkpoint tell whether an
//! inference server really serves that checkpoint's weights (`rollout --backend vllm-serve`
//! checks every reload with it, `engine::vllm::supervised`).
//!
//! **Who computes the reference.** train-step writes `probe.json` beside the weights it saves,
//! from the model it has in memory ([`write`]), so a rollout that follows the trainer reads the
//! reference instead of loading the checkpoint a second time (for a 35B policy, tens of GB in
//! rollout's process). A checkpoint without the file (a base model, or one train-step could not
//! score whole: expert parallelism, or a compute dtype other than the saved one) is scored by
//! [`logprobs`] on a model loaded from it: the same function, so both references agree.
//!
//! **Why log-probs and not checksums.** vLLM's `/weight_checker` hashes its own parameters, which
//! it fuses, pads and permutes on load (qkv, gate-up, expert stacks), so no checksum computed
//! from the checkpoint can be compared with it; and equal weights are not the end of it (a
//! stale prefix cache or a layer left on the meta device serve wrongly with the right weights).
//! The probe checks what rollout consumes: the served distribution.
//!
//! **Staleness.** The file names the policy version it was computed for; a `probe.json` whose
//! version differs from the checkpoint's `lego-rl.json` (copied along from another checkpoint)
//! is ignored, never trusted. It is not among [`super::AUX_FILES`], so a save never carries a
//! parent's probe into its child.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::{ForwardInput, Model, ModelError};

/// The file beside a checkpoint's weights.
pub const FILE: &str = "probe.json";
const FORMAT: &str = "lego-rl/probe/v1";

/// The probe: 8 prompt tokens, then 24 scored ones. Ids below 10,100 exist in every vocabulary
/// this project serves; the sequence is fixed so runs compare.
pub fn sequence() -> (Vec<u32>, Vec<u32>) {
    let ids: Vec<u32> = (0..32u32).map(|i| (i * 7919 + 13) % 10_000 + 100).collect();
    (ids[..8].to_vec(), ids[8..].to_vec())
}

/// The smallest vocabulary the probe's ids fit in.
pub const MIN_VOCAB: i64 = 10_100;

/// Whether the probe's ids exist in `model`'s vocabulary (the test models with small
/// vocabularies get no probe; none of them can be served by vLLM either).
pub fn fits(model: &Model) -> bool {
    model.cfg().vocab_size >= MIN_VOCAB
}

/// `probe.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub format: String,
    /// `lego-rl.json`'s policy version of the checkpoint it was computed for.
    pub policy_version: u64,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Log-prob of each of `tokens` at temperature 1 (the model's own distribution).
    pub logprobs: Vec<f32>,
    /// The dtype the model computed in (the checkpoint's).
    pub dtype: String,
}

/// The probe's log-probs under `model`: one causal forward, no gradients, no replay. The
/// model's vocabulary must hold the probe ([`fits`]).
pub fn logprobs(model: &Model) -> Vec<f32> {
    assert!(fits(model), "invariant: callers check the vocabulary first");
    let _g = tch::no_grad_guard();
    let (prompt, scored) = sequence();
    let ids: Vec<i64> = prompt.iter().chain(&scored).map(|&t| i64::from(t)).collect();
    let device = model.device();
    let n = ids.len() as i64;
    let tokens = Tensor::from_slice(&ids).to_device(device);
    let positions = Tensor::arange(n, (Kind::Int64, device));
    let out = model.lm.forward(&ForwardInput::causal(&tokens, &positions), None);
    // Position t predicts token t + 1: the scored tokens are predicted from the prompt's last
    // position on.
    let first = prompt.len() as i64 - 1;
    let at = Tensor::arange_start(first, n - 1, (Kind::Int64, device));
    let next = tokens.narrow(0, first + 1, scored.len() as i64);
    let (lp, _) = model.lm.next_token_logprobs(&out.hidden, &at, &next, false);
    Vec::<f32>::try_from(lp.to_kind(Kind::Float).to_device(Device::Cpu)).expect("invariant: 1-d f32")
}

/// Whether `model` computes in the dtypes its checkpoint is saved in, so that its log-probs are
/// the saved weights' (a `--dtype float32` run over a bf16 checkpoint is not).
pub fn computes_as_saved(model: &Model) -> bool {
    model
        .named_variables()
        .iter()
        .all(|(name, t)| t.kind() == model.stored_kind(name))
}

/// Writes `probe.json` for `model`'s weights (saved as policy version `policy_version`) into
/// `dir`.
pub fn write(dir: &Path, model: &Model, policy_version: u64) -> Result<(), ModelError> {
    let (prompt, tokens) = sequence();
    let record = ProbeRecord {
        format: FORMAT.into(),
        policy_version,
        prompt,
        tokens,
        logprobs: logprobs(model),
        dtype: format!("{:?}", model.file_kind),
    };
    let path = dir.join(FILE);
    let text = serde_json::to_string_pretty(&record).expect("invariant: the record serializes");
    std::fs::write(&path, text + "\n").map_err(|e| ModelError::Write { path, source: e })
}

/// The reference log-probs `dir/probe.json` holds for the checkpoint in `dir`, or `None` when
/// there is no usable file: absent, another probe sequence, or another policy version than the
/// checkpoint's `lego-rl.json` (see the module docs). A file that cannot be read or parsed is an
/// error.
pub fn read(dir: &Path) -> Result<Option<Vec<f32>>, ModelError> {
    let path = dir.join(FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let Some(policy_version) = checkpoint_version(dir)? else {
        tracing::warn!(
            "{}: the checkpoint has no lego-rl.json to tie it to; scoring the checkpoint instead",
            path.display()
        );
        return Ok(None);
    };
    let bad = |msg: String| ModelError::Config {
        path: path.clone(),
        msg,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Read {
        path: path.clone(),
        source: e,
    })?;
    let r: ProbeRecord = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if r.format != FORMAT {
        return Err(bad(format!("format {:?}, expected {FORMAT:?}", r.format)));
    }
    if r.logprobs.len() != r.tokens.len() {
        return Err(bad(format!(
            "{} log-probs for {} tokens",
            r.logprobs.len(),
            r.tokens.len()
        )));
    }
    let (prompt, tokens) = sequence();
    if r.prompt != prompt || r.tokens != tokens {
        tracing::warn!(
            "{}: another probe sequence; scoring the checkpoint instead",
            path.display()
        );
        return Ok(None);
    }
    if r.policy_version != policy_version {
        tracing::warn!(
            "{}: computed for policy version {}, but the checkpoint is version {policy_version} \
             (copied from another checkpoint?); scoring the checkpoint instead",
            path.display(),
            r.policy_version
        );
        return Ok(None);
    }
    Ok(Some(r.logprobs))
}

/// `policy_version` of `dir/lego-rl.json` (written by train-step with the weights), if any.
fn checkpoint_version(dir: &Path) -> Result<Option<u64>, ModelError> {
    let path = dir.join("lego-rl.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Read {
        path: path.clone(),
        source: e,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    Ok(v.get("policy_version").and_then(serde_json::Value::as_u64))
}
