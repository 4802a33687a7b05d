//! `Sample` (one aligned training sequence) and `AlignStats` (what align kept and dropped).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Packed;

/// A 0/1 mask over a sequence, run-length encoded: `[n0, n1, n2, ...]` means n0 positions of 0,
/// then n1 positions of 1, then n2 of 0, and so on (the first run is always zeros and may be 0).
/// Policy-generated tokens carry 1; prompts, tool results and template tokens 0.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(transparent)]
pub struct LossMask(pub Vec<u32>);

impl LossMask {
    /// Encodes a dense mask.
    pub fn from_dense(mask: &[bool]) -> Self {
        let mut runs = Vec::new();
        let mut current = false;
        let mut n = 0u32;
        for &m in mask {
            if m != current {
                runs.push(n);
                current = m;
                n = 0;
            }
            n += 1;
        }
        runs.push(n);
        LossMask(runs)
    }

    /// Expands to a dense mask.
    pub fn to_dense(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.len());
        for (i, &n) in self.0.iter().enumerate() {
            out.extend(std::iter::repeat_n(i % 2 == 1, n as usize));
        }
        out
    }

    /// Sequence length the mask covers.
    pub fn len(&self) -> usize {
        self.0.iter().map(|&n| n as usize).sum()
    }

    /// True when the mask covers no positions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of positions with mask 1.
    pub fn count_ones(&self) -> usize {
        self.0.iter().skip(1).step_by(2).map(|&n| n as usize).sum()
    }
}

/// One training sequence aligned from a trajectory (`lego-rl/sample/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Sample {
    pub schema: String,
    /// `<trajectory_id>#<thread>.<segment>`.
    pub id: String,
    pub trajectory_id: String,
    pub task_id: String,
    pub group_id: u64,
    pub sample_index: u32,
    /// Thread within the trajectory (0 = main agent).
    #[serde(default)]
    pub thread: u32,
    /// Segment within the thread (a compaction or rewrite starts a new one).
    #[serde(default)]
    pub segment: u32,
    /// The captured tokens, exactly as the engine saw and sampled them.
    pub token_ids: Vec<u32>,
    /// 1 exactly on policy-generated tokens (see [`LossMask`]).
    pub loss_mask: LossMask,
    /// Sampling log-prob of each loss-mask-1 token, f32 `[count_ones(loss_mask)]`.
    pub rollout_logprobs: Packed,
    /// The distributions the policy tokens were drawn from where they are not the model's own
    /// (temperature 1, the whole vocabulary), as runs over the policy tokens; empty (the usual
    /// case) when every token was. `rollout_logprobs` are of these distributions, and train-step
    /// recomputes the same ones (src/model/sampled.rs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sampling: Vec<SamplingRun>,
    /// Expert ids `[T, layers, top_k]` for positions 0..T (T = len(token_ids) or one less).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Packed>,
    /// The trajectory's reward (shared by all its samples).
    pub reward: f64,
    /// 0 for infra failures (excluded from the loss and from group statistics), else 1.
    pub weight: f64,
    pub policy_version: u64,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// From policy token `start` (an index into `rollout_logprobs`) up to the next run's start, the
/// tokens were drawn with these settings: logits divided by `temperature`, restricted to the
/// `top_k` most likely (0: no limit), then to the fewest most likely whose renormalised mass
/// reaches `top_p` (1: no limit), renormalised. A run with temperature 1, no top-k and top-p 1
/// returns to the model's own distribution. Why runs and not a value per token: a sample's
/// turns share one sampling unless a harness changes it between requests.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct SamplingRun {
    pub start: u32,
    pub temperature: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub top_k: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub top_p: f64,
}

fn is_zero(k: &u32) -> bool {
    *k == 0
}

fn one() -> f64 {
    1.0
}

fn is_one(p: &f64) -> bool {
    *p == 1.0
}

impl SamplingRun {
    /// The run of `sampling` from policy token `start`: its distribution when processed
    /// ([`super::Sampling::is_processed`]), else the model's own.
    pub fn of(sampling: &super::Sampling, start: u32) -> SamplingRun {
        if !sampling.is_processed() {
            return SamplingRun {
                start,
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
            };
        }
        SamplingRun {
            start,
            temperature: sampling.temperature.unwrap_or(1.0),
            top_k: sampling.top_k.unwrap_or(0),
            top_p: sampling.top_p.filter(|&p| p < 1.0).unwrap_or(1.0),
        }
    }

    /// Whether this run draws from the model's own distribution.
    pub fn is_model(&self) -> bool {
        self.temperature == 1.0 && self.top_k == 0 && self.top_p >= 1.0
    }

    /// Whether two runs draw from the same distribution (their starts aside).
    pub fn same_distribution(&self, other: &SamplingRun) -> bool {
        (self.temperature, self.top_k, self.top_p) == (other.temperature, other.top_k, other.top_p)
    }
}

/// align's statistics (`lego-rl/align-stats/v1`): one record per trajectory and one total
/// (`trajectory_id` null).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct AlignStats {
    pub schema: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory_id: Option<String>,
    pub trajectories: u64,
    pub threads: u64,
    pub segments: u64,
    pub samples: u64,
    pub aligned_turns: u64,
    pub dropped_turns: u64,
    pub policy_tokens: u64,
    pub dropped_tokens: u64,
    /// Dropped turns by reason.
    #[serde(default)]
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Assistant turns whose text differed from the capture (re-serialized by the harness).
    pub tool_call_mismatches: u64,
    /// Of those, how many the tool-call-id linkage resolved.
    pub mismatches_resolved_by_id: u64,
    /// Samples whose tokens equal the engine's prompts token for token (align builds samples
    /// from captured tokens only and checks every one, so this equals `samples`).
    pub token_exact_samples: u64,
    /// Why a thread started a new segment: `history_rewritten` (compaction, condensation),
    /// `prompt_not_token_continuation` (same conversation, but the engine saw a re-rendered
    /// history), `branch` (a second continuation of one generation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub segment_breaks: BTreeMap<String, u64>,
    /// Messages (and the answer) of a thread's latest request that a rewritten history dropped.
    #[serde(default)]
    pub compacted_messages: u64,
    /// Assistant messages in requests that no captured generation produced (written by the
    /// harness, e.g. a compaction summary); context only, never trained.
    #[serde(default)]
    pub unlinked_assistant_messages: u64,
    /// Samples left without routing because some position had none recorded.
    #[serde(default)]
    pub samples_without_routing: u64,
    /// Requests the proxy refused for not fitting the context (nothing was generated, so they
    /// are not turns; the harness may have compacted and gone on).
    #[serde(default)]
    pub context_refusals: u64,
    /// Trajectories aligned without the policy's tokenizer (no `--model`, and none named by the
    /// trajectory loads): their text-based statistics are approximate.
    #[serde(default)]
    pub without_tokenizer: u64,
    /// Tool calls the proxy rejected and returned as text, over the aligned turns (their tokens
    /// are trained as the text the policy wrote; a run whose calls stop parsing shows here).
    #[serde(default)]
    pub malformed_tool_calls: u64,
}
