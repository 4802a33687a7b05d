//! A run's figures per step and harness, for a mixed rollout (`rollout --harness` more than once):
//! rewards, infra failures, terminations and audit kinds from the trajectories, turns and tokens
//! align dropped from its stats (`AlignStats::by_harness`), and train-step's per-harness figures
//! (`StepMetrics::by_harness`: log-prob Pearson, trained reward). Shared by `validate` (its table
//! and the validation report's `checks.by_harness`) and `report` (`harness_steps.csv`, the page's
//! per-harness view), so both say the same.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::run::{read_files, RunError};
use super::stats::RewardSum;
use crate::io::ReadOptions;
use crate::records::{AlignStats, HarnessStepMetrics, StepMetrics, Trajectory};

/// One harness in one step.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HarnessRow {
    pub step: u64,
    pub harness: String,
    pub trajectories: u64,
    pub infra_failures: u64,
    /// Graded, non-infra rewards.
    pub rewards: RewardSum,
    /// Groups (task, group id) with a trajectory of this harness, and of those, groups that
    /// also hold another harness's (`rollout --harness-mix sample`).
    pub groups: u64,
    pub mixed_groups: u64,
    pub terminations: BTreeMap<String, u64>,
    /// Trajectories with at least one audit event of each kind.
    pub audit: BTreeMap<String, u64>,
    /// align's counts for this harness's trajectories.
    pub aligned_turns: u64,
    pub dropped_turns: u64,
    pub policy_tokens: u64,
    pub dropped_tokens: u64,
    /// train-step's figures for this harness on this step's batch: the step-metrics record whose
    /// `step` (the checkpoint it made) is one more than this row's.
    pub train: Option<HarnessStepMetrics>,
}

impl HarnessRow {
    /// Mean graded reward.
    pub fn reward_mean(&self) -> Option<f64> {
        self.rewards.mean()
    }
    /// Infra failures over trajectories.
    pub fn infra_rate(&self) -> Option<f64> {
        (self.trajectories > 0).then(|| self.infra_failures as f64 / self.trajectories as f64)
    }
    /// Dropped turns over the turns align saw.
    pub fn align_drop_rate(&self) -> Option<f64> {
        let all = self.aligned_turns + self.dropped_turns;
        (all > 0).then(|| self.dropped_turns as f64 / all as f64)
    }
    /// The figures a validation report keeps per harness.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "trajectories": self.trajectories,
            "reward_mean": self.reward_mean(),
            "infra_rate": self.infra_rate(),
            "align_drop_rate": self.align_drop_rate(),
            "dropped_turns": self.dropped_turns,
            "policy_tokens": self.policy_tokens,
            "dropped_tokens": self.dropped_tokens,
            "logprob_pearson": self.train.as_ref().and_then(|m| m.logprob_pearson),
            "mixed_groups": self.mixed_groups,
            "terminations": self.terminations,
            "audit": self.audit,
        })
    }
}

/// Accumulates [`HarnessRow`]s over a run's files.
#[derive(Debug, Default)]
pub struct ByHarness {
    rows: BTreeMap<(u64, String), HarnessRow>,
    groups: BTreeMap<(u64, String, u64), BTreeSet<String>>,
}

impl ByHarness {
    fn row(&mut self, step: u64, harness: &str) -> &mut HarnessRow {
        self.rows
            .entry((step, harness.to_string()))
            .or_insert_with(|| HarnessRow {
                step,
                harness: harness.to_string(),
                ..Default::default()
            })
    }

    /// Counts one trajectory of `step`.
    pub fn add_trajectory(&mut self, step: u64, t: &Trajectory) {
        self.groups
            .entry((step, t.task_id.clone(), t.group_id))
            .or_default()
            .insert(t.harness.clone());
        let r = self.row(step, &t.harness);
        r.trajectories += 1;
        r.infra_failures += u64::from(t.is_infra_failure());
        if let (false, Some(x)) = (t.is_infra_failure(), t.reward) {
            r.rewards.push(x);
        }
        *r.terminations.entry(t.termination.to_string()).or_default() += 1;
        for k in t.audit_kinds() {
            *r.audit.entry(k).or_default() += 1;
        }
    }

    /// Adds align's per-harness counts from the run's align-stats files: each file's total
    /// record's `by_harness`, else its per-trajectory records by their `harness`.
    pub fn add_align_stats(
        &mut self,
        files: &[(Option<u64>, std::path::PathBuf)],
        opts: ReadOptions,
        latest_step: u64,
    ) -> Result<(), RunError> {
        for (step, path) in files {
            let recs = read_files::<AlignStats>(&[(*step, path.clone())], opts)?;
            let step = step.unwrap_or(latest_step);
            let total = recs.iter().map(|r| &r.1).find(|r| r.trajectory_id.is_none());
            let parts: Vec<(&str, &AlignStats)> = match total {
                Some(t) => t.by_harness.iter().map(|(h, s)| (h.as_str(), s)).collect(),
                None => recs
                    .iter()
                    .filter_map(|(_, r)| Some((r.harness.as_deref()?, r)))
                    .collect(),
            };
            for (h, s) in parts {
                let r = self.row(step, h);
                r.aligned_turns += s.aligned_turns;
                r.dropped_turns += s.dropped_turns;
                r.policy_tokens += s.policy_tokens;
                r.dropped_tokens += s.dropped_tokens;
            }
        }
        Ok(())
    }

    /// Adds train-step's per-harness figures to the rows of the batch each step trained (batch
    /// `s` makes checkpoint `s + 1`, the record's `step`).
    pub fn add_metrics(&mut self, metrics: &[StepMetrics]) {
        for m in metrics {
            for (h, hm) in &m.by_harness {
                self.row(m.step.saturating_sub(1), h).train = Some(hm.clone());
            }
        }
    }

    /// The rows in (step, harness) order.
    pub fn finish(mut self) -> Vec<HarnessRow> {
        for ((step, _, _), hs) in std::mem::take(&mut self.groups) {
            for h in &hs {
                let r = self.row(step, h);
                r.groups += 1;
                r.mixed_groups += u64::from(hs.len() > 1);
            }
        }
        self.rows.into_values().collect()
    }
}

/// The per-step values of gate `name` for each harness, for the gates that make sense per
/// harness: `infra_failure_rate`, `align_drop_rate`, `<kind>_rate` for each of `audit_kinds`
/// (health's list, passed in so that this module does not import health, which imports it), and
/// train-step's `logprob_pearson` (`_without_replay`) and `logprob_kl` (keyed by the step-metrics
/// record's step, as the overall gate; `replay_of(step)` is that record's `routing_replay`).
/// Other gates: empty. On the rate gates ([`is_rate_gate`]) a harness is left out of the steps
/// where it has fewer than `min_trajectories` trajectories ([`too_few`] lists them).
pub fn gate_values(
    name: &str,
    rows: &[HarnessRow],
    audit_kinds: &[&str],
    min_trajectories: u64,
    replay_of: impl Fn(u64) -> Option<bool>,
) -> BTreeMap<String, BTreeMap<u64, f64>> {
    let mut out: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    let rate = is_rate_gate(name, audit_kinds);
    for r in rows {
        if rate && r.trajectories < min_trajectories {
            continue;
        }
        let train = r.train.as_ref();
        let metric_step = r.step + 1;
        let v = match name {
            "infra_failure_rate" => r.infra_rate().map(|v| (r.step, v)),
            "align_drop_rate" => r.align_drop_rate().map(|v| (r.step, v)),
            "logprob_pearson" => train
                .and_then(|m| m.logprob_pearson)
                .filter(|_| replay_of(metric_step) != Some(false))
                .map(|v| (metric_step, v)),
            "logprob_pearson_without_replay" => train
                .and_then(|m| m.logprob_pearson)
                .filter(|_| replay_of(metric_step) == Some(false))
                .map(|v| (metric_step, v)),
            "logprob_kl" => train.and_then(|m| m.logprob_kl).map(|v| (metric_step, v)),
            _ => audit_kind(name, audit_kinds)
                .filter(|_| r.trajectories > 0)
                .map(|k| {
                    let n = r.audit.get(k).copied().unwrap_or(0);
                    (r.step, n as f64 / r.trajectories as f64)
                }),
        };
        if let Some((step, v)) = v {
            out.entry(r.harness.clone()).or_default().insert(step, v);
        }
    }
    out
}

/// Whether gate `name` is a share of a step's trajectories (or of align's turns of them):
/// `infra_failure_rate`, `align_drop_rate`, `<kind>_rate` for each of `audit_kinds`. One event
/// moves such a rate by 1/n, so a harness is judged on it alone only from a minimum sample.
pub fn is_rate_gate(name: &str, audit_kinds: &[&str]) -> bool {
    name == "infra_failure_rate" || name == "align_drop_rate" || audit_kind(name, audit_kinds).is_some()
}

/// The audit kind of gate `<kind>_rate`, when `kind` is one of `audit_kinds`.
fn audit_kind<'a>(name: &'a str, audit_kinds: &[&str]) -> Option<&'a str> {
    name.strip_suffix("_rate").filter(|k| audit_kinds.contains(k))
}

/// The (harness, step, trajectories) that [`gate_values`] leaves out of rate gate `name` for
/// having fewer than `min_trajectories` trajectories (but at least one) in the step.
pub fn too_few(
    name: &str,
    rows: &[HarnessRow],
    audit_kinds: &[&str],
    min_trajectories: u64,
) -> Vec<(String, u64, u64)> {
    if !is_rate_gate(name, audit_kinds) {
        return Vec::new();
    }
    rows.iter()
        .filter(|r| r.trajectories > 0 && r.trajectories < min_trajectories)
        .map(|r| (r.harness.clone(), r.step, r.trajectories))
        .collect()
}

/// Each harness's graded rewards per step (the per-harness `train_reward_drop`).
pub fn reward_steps(rows: &[HarnessRow]) -> BTreeMap<String, Vec<(u64, RewardSum)>> {
    let mut out: BTreeMap<String, Vec<(u64, RewardSum)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.rewards.n > 0) {
        out.entry(r.harness.clone())
            .or_default()
            .push((r.step, r.rewards));
    }
    out
}

/// Whether the rows hold more than one harness (the per-harness views are shown only then).
pub fn is_mixed(rows: &[HarnessRow]) -> bool {
    rows.iter().map(|r| &r.harness).collect::<BTreeSet<_>>().len() > 1
}

/// `validate`'s per-harness table (printed only for a run that mixes harnesses): per step and
/// harness, trajectories, reward, infra failures, mixed groups, dropped turns and tokens, the
/// trainer's log-prob Pearson, and the terminations and audit kinds seen.
pub fn print(out: &mut impl std::io::Write, rows: &[HarnessRow]) -> std::io::Result<()> {
    if !is_mixed(rows) {
        return Ok(());
    }
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.4}"));
    let kv = |m: &BTreeMap<String, u64>| {
        let v: Vec<String> = m.iter().map(|(k, n)| format!("{k}={n}")).collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(",")
        }
    };
    writeln!(
        out,
        "\n{:>6}  {:<16}  {:>6}  {:>7}  {:>6}  {:>6}  {:>8}  {:>8}  {:>8}  TERMINATIONS / AUDIT",
        "STEP", "HARNESS", "TRAJ", "REWARD", "INFRA", "MIXED", "DROPPED", "DROP_TOK", "PEARSON"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:>6}  {:<16}  {:>6}  {:>7}  {:>6}  {:>6}  {:>8}  {:>8}  {:>8}  {} / {}",
            r.step,
            r.harness,
            r.trajectories,
            f(r.reward_mean()),
            r.infra_failures,
            format!("{}/{}", r.mixed_groups, r.groups),
            r.dropped_turns,
            r.dropped_tokens,
            f(r.train.as_ref().and_then(|m| m.logprob_pearson)),
            kv(&r.terminations),
            kv(&r.audit)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{AuditEvent, Record, Termination};

    #[test]
    fn trajectories_align_stats_and_metrics_split_by_harness() {
        let mut b = ByHarness::default();
        let mut a = Trajectory::new("t", 0, 0, "mini", "embedded", Vec::new());
        a.reward = Some(0.0);
        let mut o = Trajectory::new("t", 0, 1, "oh", "embedded", Vec::new());
        o.reward = Some(1.0);
        o.audit.push(AuditEvent {
            kind: "git_history".into(),
            detail: String::new(),
            generation: None,
        });
        let mut i = Trajectory::new("u", 0, 0, "oh", "embedded", Vec::new());
        i.termination = Termination::Infra("setup".into());
        i.infra_failure = true;
        for t in [&a, &o, &i] {
            b.add_trajectory(3, t);
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("step-000003.jsonl");
        let mut total = AlignStats {
            schema: AlignStats::SCHEMA.into(),
            ..Default::default()
        };
        total.by_harness.insert(
            "oh".into(),
            AlignStats {
                aligned_turns: 3,
                dropped_turns: 1,
                ..Default::default()
            },
        );
        std::fs::write(&p, serde_json::to_string(&total).unwrap() + "\n").unwrap();
        b.add_align_stats(&[(Some(3), p)], ReadOptions::default(), 0)
            .unwrap();
        let mut m = StepMetrics {
            step: 4,
            ..Default::default()
        };
        m.by_harness.insert(
            "mini".into(),
            HarnessStepMetrics {
                logprob_pearson: Some(0.5),
                ..Default::default()
            },
        );
        b.add_metrics(&[m]);
        let rows = b.finish();
        assert!(is_mixed(&rows));
        let (mini, oh) = (&rows[0], &rows[1]);
        assert_eq!((mini.harness.as_str(), oh.harness.as_str()), ("mini", "oh"));
        assert_eq!((mini.reward_mean(), oh.reward_mean()), (Some(0.0), Some(1.0)));
        assert_eq!((oh.trajectories, oh.infra_rate()), (2, Some(0.5)));
        assert_eq!(
            (mini.groups, mini.mixed_groups, oh.groups, oh.mixed_groups),
            (1, 1, 2, 1)
        );
        assert_eq!(oh.terminations.get("infra:setup"), Some(&1));
        assert_eq!(oh.audit.get("git_history"), Some(&1));
        assert_eq!(mini.audit.get("git_history"), None);
        assert_eq!((oh.align_drop_rate(), mini.align_drop_rate()), (Some(0.25), None));
        assert_eq!(mini.train.as_ref().and_then(|t| t.logprob_pearson), Some(0.5));
        assert_eq!(oh.summary()["align_drop_rate"], 0.25);
    }
}
