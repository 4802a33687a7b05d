//! The report's data model: per-step, per-task, per-harness and per-termination summaries of a
//! run, trajectory summaries for the browser, and trajectory details (conversation, grader,
//! stages, per-token log-prob differences). Built in one streaming pass over the run's files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::behaviour::{behaviour, Behaviour, Thread};
use super::conversation::threads;
use crate::io::{open_records, ReadOptions};
use crate::records::{
    AuditEvent, GraderResult, Sample, StageTiming, StepMetrics, Trajectory, TrajectoryAgreement,
    ValidationReport,
};
use crate::validate::run::{for_each_trajectory, read_plain, RunError, RunFiles};

/// One trajectory in the browser list.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrajSummary {
    pub id: String,
    pub task_id: String,
    pub step: u64,
    pub harness: String,
    pub reward: Option<f64>,
    pub termination: String,
    pub infra: bool,
    pub turns: u64,
    pub response_tokens: u64,
    pub tool_calls: u64,
    pub audit: Vec<String>,
}

/// Per-token rollout-vs-trainer log-prob differences of one sample.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenDiff {
    pub sample_id: String,
    /// Token ids of the policy (loss-mask 1) positions.
    pub tokens: Vec<u32>,
    /// trainer − rollout log-prob per policy token.
    pub diff: Vec<f32>,
}

/// Everything the browser shows for one opened trajectory.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrajDetail {
    pub summary: TrajSummary,
    pub threads: Vec<Thread>,
    pub behaviour: Behaviour,
    pub grader: Option<GraderResult>,
    pub stages: BTreeMap<String, StageTiming>,
    pub audit: Vec<AuditEvent>,
    pub diff: Option<String>,
    pub logprob_diffs: Vec<TokenDiff>,
    /// train-step's rollout-vs-trainer agreement on this trajectory (`StepMetrics::by_trajectory`),
    /// once a step has trained on it.
    pub agreement: Option<StepAgreement>,
}

/// A trajectory's agreement figures and the train step that measured them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepAgreement {
    pub step: u64,
    #[serde(flatten)]
    pub figures: TrajectoryAgreement,
}

/// Aggregates over one step.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct StepRow {
    pub step: u64,
    pub trajectories: u64,
    pub graded: u64,
    pub reward_mean: Option<f64>,
    pub infra_failures: u64,
    pub groups: u64,
    pub zero_variance_groups: u64,
    /// Dynamic sampling (`rollout --min-informative-groups`; None when the step's rollout did not
    /// sample dynamically): groups marked informative, extra groups drawn beyond the planned ones,
    /// and the task pool's size.
    pub informative_groups: Option<u64>,
    pub extra_groups: Option<u64>,
    pub task_pool: Option<u64>,
    /// Tasks the loop's re-filter dropped from the pool before this step's batch
    /// (`loop.sh --refilter`: `filter-tasks --drop-saturated`), by reason (`saturated_solved`,
    /// `saturated_failed`); None without a re-filter.
    pub pool_dropped: Option<BTreeMap<String, u64>>,
    pub response_tokens_mean: Option<f64>,
    pub turns_mean: Option<f64>,
    pub tool_calls_mean: Option<f64>,
    /// Tool calls the proxy rejected and answered as text, over the step's trajectories.
    pub malformed_tool_calls: u64,
    /// Generations whose request asked for sampling it was not served with (rollout pins its
    /// sampling in train mode; `Generation::ignored_sampling`).
    pub sampling_overrides: u64,
    pub reread_after_edit: Option<f64>,
    pub files_viewed_before_edit: Option<f64>,
    pub success_after_failure: Option<f64>,
    /// Prompt tokens of the step's trajectories whose backend reports its prefix cache
    /// (`metadata.prefix_cache`), and how many of them it served from the cache.
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    /// `cached_prompt_tokens / prompt_tokens` (None without such trajectories).
    pub prefix_cache_hit_rate: Option<f64>,
    pub audit: BTreeMap<String, u64>,
    pub terminations: BTreeMap<String, u64>,
    /// Held-out trajectories of this step's checkpoint (the run's `eval/` files).
    pub eval_trajectories: u64,
    /// Their mean reward over graded, non-infra trajectories.
    pub eval_reward_mean: Option<f64>,
    /// The StepMetrics of this step, if train-step wrote one.
    pub metrics: Option<StepMetrics>,
    /// The latest validation report of this step.
    pub validation: Option<ValidationReport>,
}

/// Aggregates over a group of trajectories (a task, a harness, a termination reason).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GroupRow {
    pub key: String,
    pub trajectories: u64,
    pub graded: u64,
    pub reward_mean: Option<f64>,
    pub infra_failures: u64,
    pub response_tokens_mean: Option<f64>,
    pub tool_calls_mean: Option<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReportData {
    pub run: String,
    /// `report --review`'s verdicts by trajectory id (static mode), shown on the trajectory.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub reviews: BTreeMap<String, crate::report::assist::review::Review>,
    pub live: bool,
    pub steps: Vec<StepRow>,
    pub tasks: Vec<GroupRow>,
    pub harnesses: Vec<GroupRow>,
    /// Per step and harness (`harness_steps.csv`; the page's per-harness view of a mixed run).
    pub harness_steps: Vec<crate::validate::by_harness::HarnessRow>,
    /// Per step of a run whose loop re-filters its task pool (`pool_steps.csv`; the page's task
    /// pool view): pool size, re-filter drops, pass-rate bands. Empty without `pool/` files.
    pub pool_steps: Vec<super::pool::PoolStep>,
    pub terminations: Vec<GroupRow>,
    pub tool_names: BTreeMap<String, u64>,
    pub validation: Vec<ValidationReport>,
    pub trajectory_count: u64,
    /// Loss tokens by staleness over the run (entry `s`: generated `s` policy versions before the
    /// one that trained them), the sum of the steps' `StepMetrics::staleness_histogram`.
    pub staleness: Vec<u64>,
    /// The trajectories the browser lists (all in live mode; a bounded sample in static mode).
    pub trajectories: Vec<TrajSummary>,
    /// Details embedded in the page (static mode); live mode fetches them.
    pub details: BTreeMap<String, TrajDetail>,
    /// Run-health advisories over `steps` (filled by the caller, which knows the thresholds).
    pub advisories: Vec<super::advisories::Advisory>,
    /// The live UI's diagnostic assistant, when `--assistant` is given (the page shows the Ask
    /// box only then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assistant: Option<super::assist::ask::AssistantInfo>,
}

#[derive(Default)]
struct Acc {
    n: u64,
    graded: u64,
    reward: f64,
    infra: u64,
    tokens: u64,
    turns: u64,
    calls: u64,
    edited: u64,
    reread: u64,
    viewed: u64,
    failed_followed: u64,
    recovered: u64,
}

impl Acc {
    fn add(&mut self, s: &TrajSummary, b: &Behaviour) {
        self.n += 1;
        if let (false, Some(r)) = (s.infra, s.reward) {
            self.graded += 1;
            self.reward += r;
        }
        self.infra += u64::from(s.infra);
        self.tokens += s.response_tokens;
        self.turns += s.turns;
        self.calls += s.tool_calls;
        if let (Some(r), Some(v)) = (b.reread_after_edit, b.files_viewed_before_edit) {
            self.edited += 1;
            self.reread += u64::from(r);
            self.viewed += v;
        }
        self.failed_followed += b.failed_runs_followed;
        self.recovered += b.recovered;
    }
    fn mean(sum: u64, n: u64) -> Option<f64> {
        (n > 0).then(|| sum as f64 / n as f64)
    }
    fn group(&self, key: String) -> GroupRow {
        GroupRow {
            key,
            trajectories: self.n,
            graded: self.graded,
            reward_mean: (self.graded > 0).then(|| self.reward / self.graded as f64),
            infra_failures: self.infra,
            response_tokens_mean: Self::mean(self.tokens, self.n),
            tool_calls_mean: Self::mean(self.calls, self.n),
        }
    }
}

/// Summarizes one trajectory.
pub fn summarize(step: u64, t: &Trajectory, b: &Behaviour) -> TrajSummary {
    TrajSummary {
        id: t.id.clone(),
        task_id: t.task_id.clone(),
        step,
        harness: t.harness.clone(),
        reward: t.reward,
        termination: t.termination.to_string(),
        infra: t.is_infra_failure(),
        turns: t.generations.len() as u64,
        response_tokens: t.generations.iter().map(|g| g.output_ids.len() as u64).sum(),
        tool_calls: b.tool_calls,
        audit: t.audit_kinds().into_iter().collect(),
    }
}

/// The detail of one trajectory (without log-prob differences, added from samples).
pub fn detail(step: u64, t: Trajectory) -> TrajDetail {
    let th = threads(&t);
    let b = behaviour(&th);
    TrajDetail {
        summary: summarize(step, &t, &b),
        threads: th,
        behaviour: b,
        grader: t.grader,
        stages: t.stages,
        audit: t.audit,
        diff: t.diff,
        logprob_diffs: Vec::new(),
        agreement: None,
    }
}

/// Joins train-step's per-trajectory agreement (`metrics`) to `details` (the latest step's
/// figures when a trajectory was trained on more than once).
pub fn attach_agreement(metrics: &[StepMetrics], details: &mut BTreeMap<String, TrajDetail>) {
    for m in metrics {
        for a in &m.by_trajectory {
            if let Some(d) = details.get_mut(&a.trajectory_id) {
                if d.agreement.as_ref().is_none_or(|x| x.step <= m.step) {
                    d.agreement = Some(StepAgreement {
                        step: m.step,
                        figures: a.clone(),
                    });
                }
            }
        }
    }
}

/// Per-token differences of a sample, when it carries `metadata.trainer_logprobs`.
pub fn token_diff(s: &Sample) -> Option<TokenDiff> {
    let trainer: crate::records::Packed =
        serde_json::from_value(s.metadata.get("trainer_logprobs")?.clone()).ok()?;
    let trainer = trainer.to_f32().ok()?;
    let rollout = s.rollout_logprobs.to_f32().ok()?;
    if trainer.len() != rollout.len() {
        return None;
    }
    let mask = s.loss_mask.to_dense();
    let tokens: Vec<u32> = s
        .token_ids
        .iter()
        .zip(mask)
        .filter(|(_, m)| *m)
        .map(|(t, _)| *t)
        .collect();
    Some(TokenDiff {
        sample_id: s.id.clone(),
        tokens: tokens.into_iter().take(rollout.len()).collect(),
        diff: trainer.iter().zip(&rollout).map(|(a, b)| a - b).collect(),
    })
}

/// Adds the log-prob differences of the samples of `details` (streaming the sample files).
pub fn attach_token_diffs(
    files: &RunFiles,
    opts: ReadOptions,
    details: &mut BTreeMap<String, TrajDetail>,
) -> Result<(), RunError> {
    if details.is_empty() {
        return Ok(());
    }
    for (_, p) in &files.samples {
        let mut r = open_records::<Sample>(p, opts)?;
        for s in r.by_ref() {
            let s = s?;
            if let Some(d) = details.get_mut(&s.trajectory_id) {
                if let Some(td) = token_diff(&s) {
                    d.logprob_diffs.push(td);
                }
            }
        }
    }
    Ok(())
}

/// Builds the report. `max_details`: how many trajectory details to embed (spread over the
/// trajectory files); `None` = list every trajectory and embed no detail (live mode).
pub fn build(
    files: &RunFiles,
    opts: ReadOptions,
    max_details: Option<usize>,
) -> Result<ReportData, RunError> {
    build_embedding(files, opts, max_details, &HashSet::new())
}

/// [`build`], embedding the details of the trajectories in `also` beyond `max_details` (static
/// mode; e.g. the examples `diagnosis.md` links to).
pub fn build_embedding(
    files: &RunFiles,
    opts: ReadOptions,
    max_details: Option<usize>,
    also: &HashSet<String>,
) -> Result<ReportData, RunError> {
    let per_file = max_details.map(|m| m.div_ceil(files.trajectories.len().max(1)));
    let mut taken: HashMap<std::path::PathBuf, usize> = HashMap::new();
    let mut steps: BTreeMap<u64, (Acc, StepRow)> = BTreeMap::new();
    let mut tasks: BTreeMap<String, Acc> = BTreeMap::new();
    let mut harnesses: BTreeMap<String, Acc> = BTreeMap::new();
    let mut terms: BTreeMap<String, Acc> = BTreeMap::new();
    let mut groups: BTreeMap<(u64, String, u64), Vec<f64>> = BTreeMap::new();
    let mut dynamic = crate::validate::dynamic::DynamicCounter::default();
    let mut by_harness = crate::validate::by_harness::ByHarness::default();
    let mut data = ReportData {
        run: files
            .root
            .as_deref()
            .map(Path::display)
            .map(|d| d.to_string())
            .unwrap_or_default(),
        live: max_details.is_none(),
        ..Default::default()
    };
    for_each_trajectory(files, opts, |step, path, t| {
        data.trajectory_count += 1;
        by_harness.add_trajectory(step, &t);
        let th = threads(&t);
        let b = behaviour(&th);
        let s = summarize(step, &t, &b);
        let (acc, row) = step_entry(&mut steps, step);
        acc.add(&s, &b);
        for k in &s.audit {
            *row.audit.entry(k.clone()).or_default() += 1;
        }
        *row.terminations.entry(s.termination.clone()).or_default() += 1;
        row.malformed_tool_calls += t
            .generations
            .iter()
            .map(|g| g.malformed_tool_calls())
            .sum::<u64>();
        row.sampling_overrides += t.generations.iter().filter(|g| g.sampling_overridden()).count() as u64;
        if let Some(c) = t.metadata.get("prefix_cache") {
            row.prompt_tokens += c["prompt_tokens"].as_u64().unwrap_or(0);
            row.cached_prompt_tokens += c["cached_tokens"].as_u64().unwrap_or(0);
        }
        tasks.entry(s.task_id.clone()).or_default().add(&s, &b);
        harnesses.entry(s.harness.clone()).or_default().add(&s, &b);
        terms.entry(s.termination.clone()).or_default().add(&s, &b);
        for (name, n) in &b.tool_names {
            *data.tool_names.entry(name.clone()).or_default() += n;
        }
        dynamic.add_trajectory(step, &t);
        let g = groups.entry((step, t.task_id.clone(), t.group_id)).or_default();
        if let (false, Some(r)) = (s.infra, s.reward) {
            g.push(r);
        }
        match per_file {
            None => data.trajectories.push(s),
            Some(cap) => {
                let n = taken.entry(path.to_path_buf()).or_default();
                let wanted = also.contains(&s.id);
                if wanted || (*n < cap && data.details.len() < max_details.unwrap_or(0)) {
                    if !wanted {
                        *n += 1;
                    }
                    data.trajectories.push(s);
                    let d = detail(step, t);
                    data.details.insert(d.summary.id.clone(), d);
                }
            }
        }
    })?;
    let eval = eval_rewards(files, opts)?;
    for ((step, _, _), rewards) in &groups {
        if let (Some((_, row)), false) = (steps.get_mut(step), rewards.is_empty()) {
            row.groups += 1;
            row.zero_variance_groups += u64::from(rewards.iter().all(|r| *r == rewards[0]));
        }
    }
    for (step, d) in dynamic.finish() {
        if let Some((_, row)) = steps.get_mut(&step) {
            row.informative_groups = Some(d.informative_groups);
            row.extra_groups = Some(d.extra_groups);
            row.task_pool = Some(d.pool);
        }
    }
    data.pool_steps = super::pool::pool_steps(files, opts)?;
    for p in &data.pool_steps {
        if let Some(dropped) = &p.dropped {
            step_entry(&mut steps, p.step).1.pool_dropped = Some(dropped.clone());
        }
    }
    let metrics = read_plain::<StepMetrics>(&files.metrics, opts)?;
    attach_agreement(&metrics, &mut data.details);
    data.validation = read_plain::<ValidationReport>(&files.validation, opts)?;
    let latest = steps.keys().next_back().copied().unwrap_or(0);
    by_harness.add_align_stats(&files.align_stats, opts, latest)?;
    by_harness.add_metrics(&metrics);
    data.harness_steps = by_harness.finish();
    for m in metrics {
        let step = m.step;
        step_entry(&mut steps, step).1.metrics = Some(m);
    }
    for v in &data.validation {
        if let Some(step) = v.step {
            step_entry(&mut steps, step).1.validation = Some(v.clone());
        }
    }
    for (step, (n, graded, sum)) in eval {
        let row = &mut step_entry(&mut steps, step).1;
        row.eval_trajectories = n;
        row.eval_reward_mean = (graded > 0).then(|| sum / graded as f64);
    }
    data.steps = steps
        .into_values()
        .map(|(a, mut row)| {
            row.trajectories = a.n;
            row.graded = a.graded;
            row.reward_mean = (a.graded > 0).then(|| a.reward / a.graded as f64);
            row.infra_failures = a.infra;
            row.response_tokens_mean = Acc::mean(a.tokens, a.n);
            row.turns_mean = Acc::mean(a.turns, a.n);
            row.tool_calls_mean = Acc::mean(a.calls, a.n);
            row.reread_after_edit = Acc::mean(a.reread, a.edited);
            row.files_viewed_before_edit = Acc::mean(a.viewed, a.edited);
            row.success_after_failure = Acc::mean(a.recovered, a.failed_followed);
            row.prefix_cache_hit_rate =
                (row.prompt_tokens > 0).then(|| row.cached_prompt_tokens as f64 / row.prompt_tokens as f64);
            row
        })
        .collect();
    data.staleness = run_staleness(&data.steps);
    data.tasks = tasks.into_iter().map(|(k, a)| a.group(k)).collect();
    data.harnesses = harnesses.into_iter().map(|(k, a)| a.group(k)).collect();
    data.terminations = terms.into_iter().map(|(k, a)| a.group(k)).collect();
    attach_token_diffs(files, opts, &mut data.details)?;
    Ok(data)
}

/// The steps' staleness histograms summed entry by entry.
fn run_staleness(steps: &[StepRow]) -> Vec<u64> {
    let mut sum: Vec<u64> = Vec::new();
    for h in steps
        .iter()
        .filter_map(|r| r.metrics.as_ref())
        .map(|m| &m.staleness_histogram)
    {
        if sum.len() < h.len() {
            sum.resize(h.len(), 0);
        }
        for (s, n) in sum.iter_mut().zip(h) {
            *s += n;
        }
    }
    sum
}

/// The accumulator and row of `step`, created empty on first use.
fn step_entry(steps: &mut BTreeMap<u64, (Acc, StepRow)>, step: u64) -> &mut (Acc, StepRow) {
    steps.entry(step).or_insert_with(|| {
        (
            Acc::default(),
            StepRow {
                step,
                ..Default::default()
            },
        )
    })
}

/// Per step of the run's `eval/` files: (trajectories, graded non-infra ones, their reward sum).
fn eval_rewards(files: &RunFiles, opts: ReadOptions) -> Result<BTreeMap<u64, (u64, u64, f64)>, RunError> {
    let mut out: BTreeMap<u64, (u64, u64, f64)> = BTreeMap::new();
    let only_eval = RunFiles {
        trajectories: files.eval.clone(),
        ..Default::default()
    };
    for_each_trajectory(&only_eval, opts, |step, _, t| {
        let e = out.entry(step).or_default();
        e.0 += 1;
        if let (false, Some(r)) = (t.is_infra_failure(), t.reward) {
            e.1 += 1;
            e.2 += r;
        }
    })?;
    Ok(out)
}

/// Finds one trajectory's detail by id (live mode), with its log-prob differences.
pub fn find_detail(files: &RunFiles, opts: ReadOptions, id: &str) -> Result<Option<TrajDetail>, RunError> {
    let mut found = None;
    for_each_trajectory(files, opts, |step, _, t| {
        if found.is_none() && t.id == id {
            found = Some(detail(step, t));
        }
    })?;
    let Some(d) = found else { return Ok(None) };
    let mut m = BTreeMap::from([(id.to_string(), d)]);
    attach_token_diffs(files, opts, &mut m)?;
    attach_agreement(&read_plain::<StepMetrics>(&files.metrics, opts)?, &mut m);
    Ok(m.into_values().next())
}

/// Field names of a JSON object, for CSV headers of flattened metrics.
pub fn metric_columns(rows: &[StepRow]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut cols = Vec::new();
    for r in rows {
        if let Some(m) = &r.metrics {
            if let Ok(Value::Object(o)) = serde_json::to_value(m) {
                for (k, v) in o {
                    if k != "schema"
                        && k != "step"
                        && !matches!(v, Value::Object(_) | Value::Array(_))
                        && seen.insert(k.clone())
                    {
                        cols.push(k);
                    }
                }
            }
        }
    }
    cols
}

/// A StepMetrics as a flat map (for CSV).
pub fn metric_map(m: &Option<StepMetrics>) -> Map<String, Value> {
    match m.as_ref().map(serde_json::to_value) {
        Some(Ok(Value::Object(o))) => o,
        _ => Map::new(),
    }
}
