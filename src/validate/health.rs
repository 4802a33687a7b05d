//! Run health: per-step statistics and cross-file consistency, gathered in one streaming pass
//! over a run's files. Gates ([`super::gates`]) judge these numbers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use super::run::{for_each_trajectory, for_each_trajectory_in, read_files, read_plain, RunError, RunFiles};
pub use super::stats::RewardSum;
use crate::io::ReadOptions;
use crate::records::{AlignStats, Sample, StepMetrics, Trajectory};

/// Audit kinds that count as reward-hacking attempts (or sabotage of grading) and get a gate each,
/// `<kind>_rate` (`grader_tampering`:
/// trajectories with a `shadowing`, `bytecode`, `result_tampering` or `config_mismatch` event,
/// graded 0; see
/// `Trajectory::audit_kinds`).
pub const AUDIT_KINDS: &[&str] = &[
    "git_history",
    "test_edit",
    "blocked_egress",
    "grader_tampering",
    "collection_hook",
    "startup_hook",
    "test_helper",
    "binary_file",
    "outside_write",
    "hidden_from_diff",
    "outlived_agent",
    "oom_kill",
    "nested_repo",
    "diff_too_large",
    "test_patch_conflict",
    "grading_killed",
    "reward_missing",
    "reward_tampering",
    "outlived_verifier",
    "outside_read",
    "suspected_hack",
];

/// At most this many examples are kept per consistency problem.
const MAX_EXAMPLES: usize = 5;

/// What one step's trajectories showed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StepHealth {
    pub step: u64,
    pub trajectories: u64,
    pub infra_failures: u64,
    /// Rewards of the graded (reward not null, not infra) trajectories: their count, sum and sum
    /// of squares (a variance for the reward-drop gates).
    pub rewards: RewardSum,
    /// Trajectories with at least one audit event of each kind.
    pub audit: BTreeMap<String, u64>,
    /// Groups with at least one graded member, and those whose graded rewards are all equal.
    pub groups: u64,
    pub zero_variance_groups: u64,
    /// Largest `step - policy_version` over trajectories and their generations.
    pub staleness_max: Option<u64>,
    /// Align's totals for this step: turns kept and dropped.
    pub aligned_turns: u64,
    pub dropped_turns: u64,
}

impl StepHealth {
    /// Mean reward over graded trajectories.
    pub fn reward_mean(&self) -> Option<f64> {
        self.rewards.mean()
    }
    /// Infra failures over trajectories.
    pub fn infra_rate(&self) -> Option<f64> {
        (self.trajectories > 0).then(|| self.infra_failures as f64 / self.trajectories as f64)
    }
    /// Trajectories with an audit event of `kind`, over trajectories.
    pub fn audit_rate(&self, kind: &str) -> Option<f64> {
        (self.trajectories > 0)
            .then(|| self.audit.get(kind).copied().unwrap_or(0) as f64 / self.trajectories as f64)
    }
    /// Zero-variance groups over groups.
    pub fn zero_variance_fraction(&self) -> Option<f64> {
        (self.groups > 0).then(|| self.zero_variance_groups as f64 / self.groups as f64)
    }
    /// Dropped turns over all assistant turns align saw.
    pub fn align_drop_rate(&self) -> Option<f64> {
        let all = self.aligned_turns + self.dropped_turns;
        (all > 0).then(|| self.dropped_turns as f64 / all as f64)
    }
}

/// One kind of cross-file inconsistency: how many, and the first few.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Problem {
    pub count: u64,
    pub examples: Vec<String>,
}

impl Problem {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(example());
        }
    }
}

/// Everything validate measured about a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Health {
    pub steps: BTreeMap<u64, StepHealth>,
    pub metrics: Vec<StepMetrics>,
    pub trajectories: u64,
    pub samples: u64,
    /// Held-out evaluations (`eval/`): graded rewards per evaluated policy version.
    pub eval: BTreeMap<u64, RewardSum>,
    /// Cross-file consistency, by check name.
    pub problems: BTreeMap<String, Problem>,
    /// Per step and harness (a mixed rollout's split; one row per step for a single harness).
    pub harnesses: Vec<super::by_harness::HarnessRow>,
    /// Dynamic sampling's figures, for the steps whose trajectories carry its marks.
    pub dynamic: BTreeMap<u64, super::dynamic::DynamicStep>,
}

/// Consistency checks, each reported even when it found nothing.
pub const CHECKS: &[&str] = &[
    "duplicate_trajectory_ids",
    "samples_without_trajectory",
    "group_size_mismatches",
    "policy_version_decreases",
];

/// Reads a run's files and measures its health.
pub fn measure(files: &RunFiles, opts: ReadOptions) -> Result<Health, RunError> {
    let mut h = Health::default();
    for c in CHECKS {
        h.problems.insert(c.to_string(), Problem::default());
    }
    let mut ids: HashSet<String> = HashSet::new();
    // (step, task, group) → graded rewards and member count.
    let mut groups: BTreeMap<(u64, String, u64), (u64, Vec<f64>)> = BTreeMap::new();
    let mut last_version: HashMap<std::path::PathBuf, u64> = HashMap::new();
    let mut problems = std::mem::take(&mut h.problems);
    let mut by_harness = super::by_harness::ByHarness::default();
    let mut dynamic = super::dynamic::DynamicCounter::default();
    for_each_trajectory(files, opts, |step, path, t: Trajectory| {
        by_harness.add_trajectory(step, &t);
        dynamic.add_trajectory(step, &t);
        h.trajectories += 1;
        let s = h.steps.entry(step).or_insert_with(|| StepHealth {
            step,
            ..Default::default()
        });
        s.trajectories += 1;
        if t.is_infra_failure() {
            s.infra_failures += 1;
        }
        let graded = !t.is_infra_failure() && t.reward.is_some();
        let g = groups.entry((step, t.task_id.clone(), t.group_id)).or_default();
        g.0 += 1;
        if let (true, Some(r)) = (graded, t.reward) {
            s.rewards.push(r);
            g.1.push(r);
        }
        for k in t.audit_kinds() {
            *s.audit.entry(k).or_default() += 1;
        }
        let oldest = t
            .generations
            .iter()
            .map(|g| g.policy_version)
            .chain([t.policy_version])
            .min()
            .unwrap_or(t.policy_version);
        let stale = step.saturating_sub(oldest);
        s.staleness_max = Some(s.staleness_max.unwrap_or(0).max(stale));
        if !ids.insert(t.id.clone()) {
            problems
                .entry("duplicate_trajectory_ids".into())
                .or_default()
                .add(|| format!("{}: {}", path.display(), t.id));
        }
        let prev = last_version.entry(path.to_path_buf()).or_insert(t.policy_version);
        version_checks(path, &t, prev, &mut problems);
    })?;
    group_checks(&groups, &mut h.steps, &mut problems);
    // Samples: each must point at a trajectory of the run (when the run has trajectories).
    for (_, path) in &files.samples {
        let mut reader = crate::io::open_records::<Sample>(path, opts)?;
        for s in reader.by_ref() {
            let s = s?;
            h.samples += 1;
            if !files.trajectories.is_empty() && !ids.contains(&s.trajectory_id) {
                problems
                    .entry("samples_without_trajectory".into())
                    .or_default()
                    .add(|| {
                        format!(
                            "{}: sample {} names missing trajectory {}",
                            path.display(),
                            s.id,
                            s.trajectory_id
                        )
                    });
            }
        }
    }
    // Align stats: the total record (trajectory_id null) per file, else the sum of the rest.
    for (step, path) in &files.align_stats {
        let recs = read_files::<AlignStats>(&[(*step, path.clone())], opts)?;
        let (totals, per): (Vec<_>, Vec<_>) = recs
            .into_iter()
            .map(|r| r.1)
            .partition(|r| r.trajectory_id.is_none());
        let use_ = if totals.is_empty() { per } else { totals };
        let step = step.or_else(|| h.steps.keys().next_back().copied()).unwrap_or(0);
        let s = h.steps.entry(step).or_insert_with(|| StepHealth {
            step,
            ..Default::default()
        });
        for r in use_ {
            s.aligned_turns += r.aligned_turns;
            s.dropped_turns += r.dropped_turns;
        }
    }
    // Held-out evaluations: only their rewards (they are not training data, so the per-step
    // checks above do not apply to them).
    for_each_trajectory_in(&files.eval, opts, |step, _, t| {
        let e = h.eval.entry(step).or_default();
        if let (false, Some(r)) = (t.is_infra_failure(), t.reward) {
            e.push(r);
        }
    })?;
    h.metrics = read_plain::<StepMetrics>(&files.metrics, opts)?;
    let latest = h.steps.keys().next_back().copied().unwrap_or(0);
    by_harness.add_align_stats(&files.align_stats, opts, latest)?;
    by_harness.add_metrics(&h.metrics);
    h.harnesses = by_harness.finish();
    h.dynamic = dynamic.finish();
    h.problems = problems;
    Ok(h)
}

/// `policy_version_decreases`: a trajectory older than the one before it in `path` (`prev`, the
/// newest so far, updated), or a generation older than the one before it.
fn version_checks(path: &Path, t: &Trajectory, prev: &mut u64, problems: &mut BTreeMap<String, Problem>) {
    if t.policy_version < *prev {
        problems
            .entry("policy_version_decreases".into())
            .or_default()
            .add(|| {
                format!(
                    "{}: {} has policy_version {} after {}",
                    path.display(),
                    t.id,
                    t.policy_version,
                    prev
                )
            });
    }
    *prev = (*prev).max(t.policy_version);
    let mut gen_prev = 0;
    for gen in &t.generations {
        if gen.policy_version < gen_prev {
            problems
                .entry("policy_version_decreases".into())
                .or_default()
                .add(|| {
                    format!(
                        "{}: {} generation {} goes back to policy_version {}",
                        path.display(),
                        t.id,
                        gen.index,
                        gen.policy_version
                    )
                });
        }
        gen_prev = gen_prev.max(gen.policy_version);
    }
}

/// Groups, keyed (step, task, group) with their member count and graded rewards: zero variance
/// per step, and `group_size_mismatches` (the most common size within a step is the expected
/// one).
fn group_checks(
    groups: &BTreeMap<(u64, String, u64), (u64, Vec<f64>)>,
    steps: &mut BTreeMap<u64, StepHealth>,
    problems: &mut BTreeMap<String, Problem>,
) {
    let mut sizes: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
    for ((step, _, _), (n, rewards)) in groups {
        *sizes.entry(*step).or_default().entry(*n).or_default() += 1;
        let s = steps.get_mut(step).expect("invariant: step seen with its group");
        if !rewards.is_empty() {
            s.groups += 1;
            if rewards.iter().all(|r| *r == rewards[0]) {
                s.zero_variance_groups += 1;
            }
        }
    }
    for ((step, task, group), (n, _)) in groups {
        let expected = sizes[step]
            .iter()
            .max_by_key(|(size, count)| (**count, **size))
            .map(|(size, _)| *size)
            .unwrap_or(*n);
        if *n != expected {
            problems
                .entry("group_size_mismatches".into())
                .or_default()
                .add(|| format!("step {step}: group {task}/{group} has {n} trajectories, others {expected}"));
        }
    }
}
