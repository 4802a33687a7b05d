//! Gates: thresholds on run health that decide whether a run may continue (`validate` exits 1
//! when one fails, so a Slurm chain stops). Defaults follow the paper's healthy ranges; a TOML
//! file (`--gates`, see `examples/gates.toml`) and `--gate NAME=VALUE` override them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::by_harness;
pub use super::collapse::REWARD_WINDOW;
use super::collapse::{run_level, train_drop};
use super::health::{Health, StepHealth, AUDIT_KINDS, CHECKS};
use crate::records::{GateResult, StepMetrics};

/// Errors in a gate configuration.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("{path}: cannot read gate file: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad gate file: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("unknown gate `{name}` (known: {known})")]
    Unknown { name: String, known: String },
    #[error("bad --gate `{0}`: expected NAME=NUMBER or NAME=off")]
    Flag(String),
}

/// Whether a gate's value must be at least or at most its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    AtLeast,
    AtMost,
}

impl Op {
    fn symbol(self) -> &'static str {
        match self {
            Op::AtLeast => ">=",
            Op::AtMost => "<=",
        }
    }
    fn ok(self, value: f64, threshold: f64) -> bool {
        // A non-finite figure fails whatever the direction: −∞ is not a KL at most 0.01, and a
        // NaN compares false either way by accident, not by rule.
        value.is_finite()
            && match self {
                Op::AtLeast => value >= threshold,
                Op::AtMost => value <= threshold,
            }
    }
    /// The worse of two values.
    fn worse(self, a: f64, b: f64) -> bool {
        match self {
            Op::AtLeast => a < b,
            Op::AtMost => a > b,
        }
    }
}

/// Every gate: name, direction, default threshold, what it measures.
pub const GATES: &[(&str, Op, f64, &str)] = &[
    (
        "logprob_pearson",
        Op::AtLeast,
        0.99,
        "rollout vs trainer log-prob Pearson with routing replay (StepMetrics)",
    ),
    (
        "logprob_pearson_without_replay",
        Op::AtLeast,
        0.98,
        "the same Pearson on steps trained with `--replay off` (the R3 ablation)",
    ),
    (
        "logprob_kl",
        Op::AtMost,
        0.01,
        "mean k3 KL estimate of the rollout vs trainer token distributions (StepMetrics): Pearson \
         is blind to an affine change of the log-probs, such as a temperature or top-p the \
         trainer does not recompute (0.42 nats in tests/it/sampling.rs, with Pearson 0.99999)",
    ),
    (
        "expert_overlap",
        Op::AtLeast,
        0.9,
        "trainer routing equal to the recorded one (StepMetrics)",
    ),
    (
        "unreplayed_token_fraction",
        Op::AtMost,
        0.0,
        "loss tokens trained with routing replay on but without recorded routing (the backend \
         returned none): they ran on the trainer's own routing, so R3 did not hold for them",
    ),
    (
        "is_masked_token_fraction",
        Op::AtMost,
        0.2,
        "loss tokens an off-policy mask (train-step --is-correction) gave zero weight: beyond it the \
         batch is too far off-policy for the correction to stand for it",
    ),
    (
        "infra_failure_rate",
        Op::AtMost,
        0.1,
        "trajectories that failed for infrastructure reasons",
    ),
    (
        "align_drop_rate",
        Op::AtMost,
        0.05,
        "assistant turns align dropped (AlignStats)",
    ),
    (
        "git_history_rate",
        Op::AtMost,
        0.05,
        "trajectories with a git_history audit event",
    ),
    (
        "test_edit_rate",
        Op::AtMost,
        0.05,
        "trajectories with a test_edit audit event",
    ),
    (
        "blocked_egress_rate",
        Op::AtMost,
        0.05,
        "trajectories with a blocked_egress audit event",
    ),
    (
        "grader_tampering_rate",
        Op::AtMost,
        0.0,
        "trajectories whose diff tried to change how grading runs (shadowing, bytecode; graded 0)",
    ),
    (
        "suspected_hack_rate",
        Op::AtMost,
        // A little room: outside_read and the text checks have false positives; the report's
        // advisory of the same name fires on any.
        0.02,
        "rewarded trajectories with a deterministic hack signal (hack_* audit kinds, outside_read): \
         a diff that special-cases the hidden tests' literals, detects the test runner, drops \
         assertions, skips, or swallows exceptions",
    ),
    (
        "collection_hook_rate",
        Op::AtMost,
        0.02,
        "trajectories whose diff had a conftest.py, pytest ini file or .gitattributes (reverted)",
    ),
    (
        "startup_hook_rate",
        Op::AtMost,
        0.0,
        "trajectories whose diff had package metadata, a .pth or sitecustomize (reverted)",
    ),
    (
        "test_helper_rate",
        Op::AtMost,
        0.02,
        "trajectories whose diff changed __init__.py or helpers beside the tests (restored)",
    ),
    (
        "binary_file_rate",
        Op::AtMost,
        0.02,
        "trajectories whose diff carried compiled code (.so, ...)",
    ),
    (
        "outside_write_rate",
        Op::AtMost,
        0.0,
        "trajectories that wrote Python start-up hooks outside the repository",
    ),
    (
        "hidden_from_diff_rate",
        Op::AtMost,
        0.0,
        "trajectories that hid files from the diff with their own ignore rules",
    ),
    (
        "outlived_agent_rate",
        Op::AtMost,
        0.05,
        "trajectories whose processes outlived the agent stage",
    ),
    (
        "oom_kill_rate",
        Op::AtMost,
        0.05,
        "trajectories with an OOM kill in the agent stage",
    ),
    (
        "nested_repo_rate",
        Op::AtMost,
        0.0,
        "trajectories with a nested repository (left out of the diff)",
    ),
    (
        "diff_too_large_rate",
        Op::AtMost,
        0.0,
        "trajectories whose diff was over the size limit (graded 0)",
    ),
    (
        "test_patch_conflict_rate",
        Op::AtMost,
        0.0,
        "trajectories whose diff kept the test patch from applying (graded 0)",
    ),
    (
        "grading_killed_rate",
        Op::AtMost,
        0.0,
        "trajectories whose code killed the grading shell or test.sh (graded 0)",
    ),
    (
        "reward_missing_rate",
        Op::AtMost,
        0.0,
        "Harbor trajectories whose verifier wrote no reward (graded 0)",
    ),
    (
        "reward_tampering_rate",
        Op::AtMost,
        0.0,
        "Harbor trajectories whose reward was not the one test.sh wrote: a planted or read-only \
         reward file, a changed mode, a symlink, a write after test.sh exited, an unparseable \
         reward (graded 0)",
    ),
    (
        "outlived_verifier_rate",
        Op::AtMost,
        0.05,
        "Harbor trajectories with processes of the verifier user still running when test.sh exited \
         (killed before the reward was read)",
    ),
    (
        "outside_read_rate",
        Op::AtMost,
        0.1,
        "trajectories whose commands named absolute paths outside the repository, home, /tmp and \
         system directories (reading around for the fix; audit only, not graded)",
    ),
    (
        "zero_variance_group_fraction",
        Op::AtMost,
        0.9,
        "groups whose rewards are all equal (no signal)",
    ),
    (
        "informative_group_fraction",
        Op::AtLeast,
        0.1,
        "groups with reward variance over the groups sampled, on steps rolled out with dynamic \
         sampling (`dynamic_sampling` marks): the pool's yield; below it most of the extra-group \
         budget is spent on saturated tasks (re-filter the pool, or rollout --pool-order curriculum)",
    ),
    (
        "staleness_max",
        Op::AtMost,
        2.0,
        "steps between the sampling policy and the step",
    ),
    (
        "train_reward_drop",
        Op::AtMost,
        0.0,
        "train reward's fall from the first 5 steps to the latest 5, at its 95% lower bound",
    ),
    (
        "heldout_reward_drop",
        Op::AtMost,
        0.0,
        "held-out reward's fall from the first evaluation to the latest, at its 95% lower bound",
    ),
    (
        "duplicate_trajectory_ids",
        Op::AtMost,
        0.0,
        "trajectory ids seen twice",
    ),
    (
        "samples_without_trajectory",
        Op::AtMost,
        0.0,
        "samples whose trajectory is not in the run",
    ),
    (
        "group_size_mismatches",
        Op::AtMost,
        0.0,
        "groups of another size than the step's usual one",
    ),
    (
        "policy_version_decreases",
        Op::AtMost,
        0.0,
        "policy_version going back within a file or trajectory",
    ),
];

/// Thresholds in force and which steps they apply to.
#[derive(Debug, Clone, PartialEq)]
pub struct GateConfig {
    /// Threshold per gate; a gate absent here is disabled.
    pub thresholds: BTreeMap<String, f64>,
    /// Judge every step, not only the latest.
    pub all_steps: bool,
    /// In a mixed run, a harness with fewer trajectories than this in a step is not judged on
    /// its own on that step's rate gates (see [`MIN_HARNESS_TRAJECTORIES`]).
    pub min_harness_trajectories: u64,
}

/// The default of [`GateConfig::min_harness_trajectories`]: one group at the paper's group size.
/// Below it one event decides a harness's rate (1 infra failure of 3 trajectories is 0.33 against
/// a 0.1 gate), so a harness that ran a few trajectories would fail the run on noise; its
/// trajectories still count in the run-wide rate, which is judged as always.
pub const MIN_HARNESS_TRAJECTORIES: u64 = 8;

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            thresholds: GATES.iter().map(|g| (g.0.to_string(), g.2)).collect(),
            all_steps: false,
            min_harness_trajectories: MIN_HARNESS_TRAJECTORIES,
        }
    }
}

/// The TOML gate file: `all_steps`, `min_harness_trajectories`, `[thresholds]` (name = number),
/// `disable` (names).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    #[serde(default)]
    all_steps: Option<bool>,
    #[serde(default)]
    min_harness_trajectories: Option<u64>,
    #[serde(default)]
    thresholds: BTreeMap<String, f64>,
    #[serde(default)]
    disable: Vec<String>,
}

fn known(name: &str) -> Result<(), GateError> {
    if GATES.iter().any(|g| g.0 == name) {
        Ok(())
    } else {
        Err(GateError::Unknown {
            name: name.to_string(),
            known: GATES.iter().map(|g| g.0).collect::<Vec<_>>().join(", "),
        })
    }
}

impl GateConfig {
    /// Applies a TOML gate file over the current settings.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), GateError> {
        let text = std::fs::read_to_string(path).map_err(|source| GateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.apply_toml(&text).map_err(|e| match e {
            GateError::Parse { source, .. } => GateError::Parse {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Applies gate-file text (see [`GateConfig::apply_file`]).
    pub fn apply_toml(&mut self, text: &str) -> Result<(), GateError> {
        let file: GateFile = toml::from_str(text).map_err(|source| GateError::Parse {
            path: PathBuf::new(),
            source,
        })?;
        for (name, v) in file.thresholds {
            known(&name)?;
            self.thresholds.insert(name, v);
        }
        for name in file.disable {
            known(&name)?;
            self.thresholds.remove(&name);
        }
        if let Some(a) = file.all_steps {
            self.all_steps = a;
        }
        if let Some(n) = file.min_harness_trajectories {
            self.min_harness_trajectories = n;
        }
        Ok(())
    }

    /// Applies one `NAME=NUMBER` or `NAME=off` flag.
    pub fn apply_flag(&mut self, flag: &str) -> Result<(), GateError> {
        let (name, value) = flag.split_once('=').ok_or_else(|| GateError::Flag(flag.into()))?;
        known(name)?;
        if value == "off" {
            self.thresholds.remove(name);
        } else {
            let v: f64 = value.parse().map_err(|_| GateError::Flag(flag.into()))?;
            self.thresholds.insert(name.to_string(), v);
        }
        Ok(())
    }
}

/// Gates judged on the whole run by [`run_level`].
const RUN_LEVEL: &[&str] = &["train_reward_drop", "heldout_reward_drop"];

fn metric(name: &str, m: &StepMetrics) -> Option<f64> {
    match name {
        // A dense model (no replay to speak of) counts as replayed.
        "logprob_pearson" => m.logprob_pearson.filter(|_| m.routing_replay != Some(false)),
        "logprob_pearson_without_replay" => m.logprob_pearson.filter(|_| m.routing_replay == Some(false)),
        "logprob_kl" => m.logprob_kl,
        "expert_overlap" => m.expert_overlap,
        "unreplayed_token_fraction" => m.unreplayed_token_fraction,
        "is_masked_token_fraction" => m.is_masked_token_fraction,
        "staleness_max" => m.staleness_max.map(|v| v as f64),
        "zero_variance_group_fraction" => m.zero_variance_group_fraction,
        _ => None,
    }
}

fn from_step(name: &str, s: &StepHealth) -> Option<f64> {
    match name {
        "infra_failure_rate" => s.infra_rate(),
        "align_drop_rate" => s.align_drop_rate(),
        "git_history_rate" => s.audit_rate("git_history"),
        "test_edit_rate" => s.audit_rate("test_edit"),
        "blocked_egress_rate" => s.audit_rate("blocked_egress"),
        "grader_tampering_rate" => s.audit_rate("grader_tampering"),
        "zero_variance_group_fraction" => s.zero_variance_fraction(),
        "staleness_max" => s.staleness_max.map(|v| v as f64),
        // Every other audit kind: `<kind>_rate`.
        _ => name
            .strip_suffix("_rate")
            .filter(|k| AUDIT_KINDS.contains(k))
            .and_then(|k| s.audit_rate(k)),
    }
}

/// Judges every enabled gate. Each gate's value is its worst over the judged steps (the latest
/// step, or all with `all_steps`); trajectory-derived values win over StepMetrics ones where a
/// step has both. A gate with nothing to measure passes with detail `not measured`. In a run that
/// mixes harnesses, the gates that make sense per harness (see [`by_harness::gate_values`], and
/// `train_reward_drop`) are judged for each harness too: the gate fails when the run or any
/// harness does. A failing gate's value is the worst failing one, so that value and verdict
/// agree, and the detail names the scope of each failing value (`failing harness openhands step
/// 2: 0.2500`, the worst marked when several fail, then the run's own value when it passed); a
/// passing gate's value is the run's. On the rate gates a harness with fewer than
/// `min_harness_trajectories` trajectories in a judged step is not judged alone, and the detail
/// says so.
pub fn judge(h: &Health, cfg: &GateConfig) -> Vec<GateResult> {
    let mut out = Vec::new();
    let mixed = by_harness::is_mixed(&h.harnesses);
    for &(name, op, _, _) in GATES {
        let Some(&threshold) = cfg.thresholds.get(name) else {
            continue;
        };
        let result = |value: Option<f64>, passed: bool, detail: Option<String>| GateResult {
            name: name.into(),
            value,
            op: op.symbol().into(),
            threshold,
            passed,
            detail,
        };
        if CHECKS.contains(&name) {
            let p = h.problems.get(name).cloned().unwrap_or_default();
            let value = p.count as f64;
            let detail = (!p.examples.is_empty()).then(|| p.examples.join("; "));
            out.push(result(Some(value), op.ok(value, threshold), detail));
            continue;
        }
        if RUN_LEVEL.contains(&name) {
            let mut scopes: Vec<(String, Option<(f64, String)>)> = vec![(String::new(), run_level(name, h))];
            if mixed && name == "train_reward_drop" {
                for (harness, steps) in by_harness::reward_steps(&h.harnesses) {
                    scopes.push((format!("harness {harness}"), train_drop(&steps)));
                }
            }
            let (value, passed, detail) = judge_run_level(op, threshold, scopes);
            out.push(result(value, passed, Some(detail)));
            continue;
        }
        // (step, value) candidates: per step from trajectories, else from metrics.
        let mut cands: BTreeMap<u64, f64> = BTreeMap::new();
        for m in &h.metrics {
            if let Some(v) = metric(name, m) {
                let e = cands.entry(m.step).or_insert(v);
                if op.worse(v, *e) {
                    *e = v;
                }
            }
        }
        for (step, s) in &h.steps {
            if let Some(v) = from_step(name, s) {
                cands.insert(*step, v);
            }
        }
        if name == "informative_group_fraction" {
            cands.extend(
                h.dynamic
                    .iter()
                    .filter_map(|(k, d)| Some((*k, d.informative_fraction()?))),
            );
        }
        let mut scopes = vec![(String::new(), cands)];
        let mut few: Vec<(u64, String)> = Vec::new();
        if mixed {
            let replay_of = |step: u64| {
                h.metrics
                    .iter()
                    .find(|m| m.step == step)
                    .and_then(|m| m.routing_replay)
            };
            let min = cfg.min_harness_trajectories;
            for (harness, c) in by_harness::gate_values(name, &h.harnesses, AUDIT_KINDS, min, replay_of) {
                scopes.push((format!("harness {harness} "), c));
            }
            few = by_harness::too_few(name, &h.harnesses, AUDIT_KINDS, min)
                .into_iter()
                .map(|(harness, step, n)| (step, format!("harness {harness} step {step} ({n})")))
                .collect();
        }
        let run_latest = scopes[0].1.keys().next_back().copied();
        let mut g = judge_steps(name, op, threshold, scopes, cfg.all_steps);
        note_too_few(&mut g, few, cfg, run_latest);
        out.push(g);
    }
    out
}

// Judging one gate over its scopes (the run, each harness) is apart: the gate table and it
// together exceed a file.
#[path = "gates_scopes.rs"]
mod scopes;
use scopes::{judge_run_level, judge_steps, note_too_few};

#[cfg(test)]
#[path = "gates_tests.rs"]
mod tests;
