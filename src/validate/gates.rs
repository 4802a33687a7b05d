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
        match self {
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
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            thresholds: GATES.iter().map(|g| (g.0.to_string(), g.2)).collect(),
            all_steps: false,
        }
    }
}

/// The TOML gate file: `all_steps`, `[thresholds]` (name = number), `disable` (names).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    #[serde(default)]
    all_steps: Option<bool>,
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
/// harness does, its value stays the run's, and the detail names the harness of each failing
/// scope (`failing harness openhands step 2: 0.2500`).
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
        if mixed {
            let replay_of = |step: u64| {
                h.metrics
                    .iter()
                    .find(|m| m.step == step)
                    .and_then(|m| m.routing_replay)
            };
            for (harness, c) in by_harness::gate_values(name, &h.harnesses, AUDIT_KINDS, replay_of) {
                scopes.push((format!("harness {harness} "), c));
            }
        }
        out.push(judge_steps(name, op, threshold, scopes, cfg.all_steps));
    }
    out
}

/// A run-level gate over its scopes (the run's, with an empty name, then each harness's), each
/// measured or not: the value (the run's, else the worst harness's), whether every measured scope
/// passed, and the detail (the run's own, then the failing harnesses by name).
fn judge_run_level(
    op: Op,
    threshold: f64,
    scopes: Vec<(String, Option<(f64, String)>)>,
) -> (Option<f64>, bool, String) {
    let measured: Vec<(String, f64, String)> = scopes
        .into_iter()
        .filter_map(|(scope, m)| m.map(|(v, d)| (scope, v, d)))
        .collect();
    // The run's own value when measured (as for the per-step gates), else the worst harness's.
    let run_wide = measured.iter().any(|m| m.0.is_empty());
    let worst = measured
        .iter()
        .filter(|m| m.0.is_empty() || !run_wide)
        .map(|m| m.1)
        .reduce(|a, b| if op.worse(b, a) { b } else { a });
    let passed = measured.iter().all(|m| op.ok(m.1, threshold));
    let overall = measured.iter().find(|m| m.0.is_empty()).map(|m| m.2.clone());
    let harnesses: Vec<String> = measured
        .iter()
        .filter(|m| !m.0.is_empty() && !op.ok(m.1, threshold))
        .map(|(scope, v, d)| format!("{scope}: {v:.4} ({d})"))
        .collect();
    let detail = match (overall, harnesses.is_empty()) {
        (Some(d), true) => d,
        (None, true) if measured.is_empty() => "not measured".to_string(),
        (None, true) => "every harness within".to_string(),
        (o, false) => format!(
            "{}failing {}",
            o.map(|d| d + "; ").unwrap_or_default(),
            harnesses.join(", ")
        ),
    };
    (worst, passed, detail)
}

/// One per-step gate over its scopes (the run, then each harness: a prefix for the detail and the
/// values by step), judged on the latest step or on all with `all_steps`.
fn judge_steps(
    name: &str,
    op: Op,
    threshold: f64,
    scopes: Vec<(String, BTreeMap<u64, f64>)>,
    all_steps: bool,
) -> GateResult {
    let mut judged: Vec<(&str, u64, f64)> = Vec::new();
    // Without `all_steps`, the run's latest step is judged in every scope (a harness that did not
    // run in it is not judged on an older one); without a run-wide value, each scope's latest.
    let latest = scopes.first().and_then(|s| s.1.keys().next_back().copied());
    for (scope, cands) in &scopes {
        let steps: Vec<(u64, f64)> = if all_steps {
            cands.iter().map(|(k, v)| (*k, *v)).collect()
        } else if let Some(step) = latest {
            cands.get(&step).map(|v| (step, *v)).into_iter().collect()
        } else {
            cands
                .iter()
                .next_back()
                .map(|(k, v)| (*k, *v))
                .into_iter()
                .collect()
        };
        judged.extend(steps.into_iter().map(|(k, v)| (scope.as_str(), k, v)));
    }
    // The value is the run's own (its worst judged step), so it means what it always meant; a
    // harness's failure shows in `passed` and the detail. Only without a run-wide value is it the
    // worst harness's.
    let run_wide = judged.iter().any(|j| j.0.is_empty());
    let worst = judged
        .iter()
        .copied()
        .filter(|j| j.0.is_empty() || !run_wide)
        .reduce(|a, b| if op.worse(b.2, a.2) { b } else { a });
    let failing: Vec<String> = judged
        .iter()
        .filter(|(_, _, v)| !op.ok(*v, threshold))
        .map(|(scope, s, v)| format!("{scope}step {s}: {v:.4}"))
        .collect();
    GateResult {
        name: name.into(),
        value: worst.map(|w| w.2),
        op: op.symbol().into(),
        threshold,
        passed: failing.is_empty(),
        detail: Some(match worst {
            None => "not measured".into(),
            Some(_) if !failing.is_empty() => format!("failing {}", failing.join(", ")),
            Some((scope, step, _)) => format!("worst at {scope}step {step}"),
        }),
    }
}

#[cfg(test)]
#[path = "gates_tests.rs"]
mod tests;
