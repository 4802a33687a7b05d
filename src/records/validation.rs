//! `StepMetrics` (one per train-step) and `ValidationReport` (one per validate run): flat objects
//! of numbers so that report and a pandas user read them directly.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What one train-step measured (`lego-rl/step-metrics/v1`). Optional fields are absent when
/// the quantity does not apply (e.g. routing metrics on a dense model).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StepMetrics {
    pub schema: String,
    /// Step number after this update (the new checkpoint's policy version).
    pub step: u64,
    pub loss: f64,
    #[serde(default)]
    pub lr: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_fraction: Option<f64>,
    /// Gradient norm before clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_variance_group_fraction: Option<f64>,
    #[serde(default)]
    pub groups: u64,
    #[serde(default)]
    pub valid_trajectories: u64,
    #[serde(default)]
    pub infra_failed_trajectories: u64,
    #[serde(default)]
    pub samples: u64,
    #[serde(default)]
    pub policy_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Pearson correlation of rollout vs trainer log-probs over all policy tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_pearson: Option<f64>,
    /// Median over sequences of the per-sequence Pearson correlation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_pearson_seq_median: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_max_abs_diff: Option<f64>,
    /// Mean of the k3 KL estimate between rollout and trainer policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_kl: Option<f64>,
    /// Fraction of (token, layer) top-k sets where the trainer's own routing equals the recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_overlap: Option<f64>,
    /// Whether the trainer replayed the recorded routing (R3) when it computed the log-probs the
    /// `logprob_*` agreement figures compare (`train-step --replay`); null for a dense model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_replay: Option<bool>,
    /// With routing replay on: the fraction of loss tokens whose sample had no recorded routing
    /// (a backend that returned none), computed with the trainer's own routing instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreplayed_token_fraction: Option<f64>,
    /// How many versions older than the one trained (this step's input checkpoint) the policy
    /// that generated each loss token was: the mean and the maximum over the loss tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness_max: Option<u64>,
    /// Loss tokens by staleness: entry `s` counts those `s` versions old (per token: a trajectory
    /// that spans a reload has tokens of several versions, `Sample::policy_versions`). The report
    /// sums it over the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staleness_histogram: Vec<u64>,
    /// The off-policy corrections applied (`train-step --is-correction`, comma-separated:
    /// `tis`, `token-mask`, `seq-mask`, `geo-mask`); absent with none, and so are the `is_*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_correction: Option<String>,
    /// Fraction of loss tokens whose gradient weight a mask set to zero (token or sequence mask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_masked_token_fraction: Option<f64>,
    /// Fraction of sequences a sequence mask (`seq-mask`, `geo-mask`) dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_masked_sequence_fraction: Option<f64>,
    /// Fraction of loss tokens whose π_old/π_rollout exceeded the TIS cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_tis_capped_fraction: Option<f64>,
    /// Spread of log(π_old/π_rollout) over the loss tokens: min, max, standard deviation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_log_ratio_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_log_ratio_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_log_ratio_std: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The step's figures split by the harness that ran each trajectory (align writes it into
    /// every sample's `metadata.harness`); empty when no sample names one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_harness: BTreeMap<String, HarnessStepMetrics>,
    /// Rollout vs trainer log-prob agreement of each trajectory of the batch, so the report
    /// can show a trajectory's own figures next to it (its page and the assistant's prompt).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_trajectory: Vec<TrajectoryAgreement>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

/// One trajectory's part of a train step's agreement figures (`StepMetrics::by_trajectory`):
/// its policy tokens' rollout log-probs against the trainer's (π_old, pass 1).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct TrajectoryAgreement {
    pub trajectory_id: String,
    pub samples: u64,
    pub policy_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_pearson: Option<f64>,
    /// Mean of |trainer − rollout| over the policy tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_mean_abs_diff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_max_abs_diff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_kl: Option<f64>,
}

/// One harness's part of a train step (`StepMetrics::by_harness`). Groups are GSPO's (task,
/// group id); under `rollout --harness-mix sample` a group holds trials of several harnesses and
/// counts for each (`mixed_groups`), and its advantages compare them with each other.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct HarnessStepMetrics {
    pub trajectories: u64,
    /// Trajectories with weight > 0 (not infra failures), and the rest.
    pub valid_trajectories: u64,
    pub infra_failed_trajectories: u64,
    /// Groups with a trajectory of this harness, and of those, groups with another harness's too.
    pub groups: u64,
    pub mixed_groups: u64,
    pub samples: u64,
    pub policy_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    /// Mean GSPO advantage of the valid trajectories (in a mixed group, above 0 where this
    /// harness's trials did better than the others').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage_mean: Option<f64>,
    /// Rollout vs trainer (π_old, pass 1) log-prob agreement over this harness's policy tokens,
    /// as the step's `logprob_*` figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_pearson: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_pearson_seq_median: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_max_abs_diff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_kl: Option<f64>,
}

/// One gate's verdict.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GateResult {
    pub name: String,
    /// The measured value (null when there was nothing to measure).
    pub value: Option<f64>,
    /// `>=` or `<=`.
    pub op: String,
    pub threshold: f64,
    pub passed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What one validate run found (`lego-rl/validation-report/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ValidationReport {
    pub schema: String,
    /// The latest train step covered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    pub passed: bool,
    #[serde(default)]
    pub gates: Vec<GateResult>,
    /// Record-level checks: files read, records, bad records.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub checks: Map<String, Value>,
    /// Held-out evaluation (pass@1 with its 95% interval, pass@k, per harness / repo).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub eval: Map<String, Value>,
}
