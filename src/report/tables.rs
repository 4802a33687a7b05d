//! CSV tables of a report for notebooks: per step (trajectory aggregates, behaviour, StepMetrics
//! fields, validation), per task, per harness and per termination reason, per step and harness
//! ([`super::harness`]) and the task pool per step ([`super::pool`]).

use super::data::{metric_columns, metric_map, GroupRow, ReportData};
use super::{csv_err, finish_csv, ReportError};

fn num(v: Option<f64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// `steps.csv`.
pub fn steps_csv(d: &ReportData) -> Result<Vec<u8>, ReportError> {
    let name = "steps.csv";
    let mut w = csv::Writer::from_writer(Vec::new());
    let metric_cols = metric_columns(&d.steps);
    let mut header: Vec<String> = [
        "step",
        "trajectories",
        "graded",
        "reward_mean",
        "infra_failures",
        "groups",
        "zero_variance_groups",
        "informative_groups",
        "extra_groups",
        "task_pool",
        "pool_dropped",
        "response_tokens_mean",
        "turns_mean",
        "tool_calls_mean",
        "malformed_tool_calls",
        "sampling_overrides",
        "reread_after_edit",
        "files_viewed_before_edit",
        "success_after_failure",
        "prompt_tokens",
        "prefix_cache_hit_rate",
        "audit_git_history",
        "audit_test_edit",
        "audit_blocked_egress",
        "audit_grader_tampering",
        "validation_passed",
        "validation_gates_failed",
        "eval_pass_at_1",
        "eval_trajectories",
        "eval_reward_mean",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    header.extend(metric_cols.iter().map(|c| format!("metrics_{c}")));
    w.write_record(&header).map_err(csv_err(name))?;
    for r in &d.steps {
        let a = |k: &str| r.audit.get(k).copied().unwrap_or(0).to_string();
        let v = r.validation.as_ref();
        let eval_p1 = v
            .and_then(|v| v.eval.get("score"))
            .and_then(|s| s["overall"]["pass_at_1"].as_f64());
        let mut rec = vec![
            r.step.to_string(),
            r.trajectories.to_string(),
            r.graded.to_string(),
            num(r.reward_mean),
            r.infra_failures.to_string(),
            r.groups.to_string(),
            r.zero_variance_groups.to_string(),
            opt(r.informative_groups),
            opt(r.extra_groups),
            opt(r.task_pool),
            r.pool_dropped
                .as_ref()
                .map(|d| d.values().sum::<u64>().to_string())
                .unwrap_or_default(),
            num(r.response_tokens_mean),
            num(r.turns_mean),
            num(r.tool_calls_mean),
            r.malformed_tool_calls.to_string(),
            r.sampling_overrides.to_string(),
            num(r.reread_after_edit),
            num(r.files_viewed_before_edit),
            num(r.success_after_failure),
            r.prompt_tokens.to_string(),
            num(r.prefix_cache_hit_rate),
            a("git_history"),
            a("test_edit"),
            a("blocked_egress"),
            a("grader_tampering"),
            v.map(|v| v.passed.to_string()).unwrap_or_default(),
            v.map(|v| v.gates.iter().filter(|g| !g.passed).count().to_string())
                .unwrap_or_default(),
            num(eval_p1),
            r.eval_trajectories.to_string(),
            num(r.eval_reward_mean),
        ];
        let m = metric_map(&r.metrics);
        for c in &metric_cols {
            rec.push(match m.get(c) {
                Some(serde_json::Value::Null) | None => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
            });
        }
        w.write_record(&rec).map_err(csv_err(name))?;
    }
    finish_csv(w, name)
}

/// A per-group table (`tasks.csv`, `harnesses.csv`, `terminations.csv`) with `key` as its first column.
pub fn group_csv(name: &str, key: &str, rows: &[GroupRow]) -> Result<Vec<u8>, ReportError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        key,
        "trajectories",
        "graded",
        "reward_mean",
        "infra_failures",
        "response_tokens_mean",
        "tool_calls_mean",
    ])
    .map_err(csv_err(name))?;
    for r in rows {
        w.write_record([
            r.key.clone(),
            r.trajectories.to_string(),
            r.graded.to_string(),
            num(r.reward_mean),
            r.infra_failures.to_string(),
            num(r.response_tokens_mean),
            num(r.tool_calls_mean),
        ])
        .map_err(csv_err(name))?;
    }
    finish_csv(w, name)
}

/// `staleness.csv`: per step, loss tokens by how many policy versions old they were (the
/// step's `staleness_histogram` in long form; steps without one are left out).
pub fn staleness_csv(d: &ReportData) -> Result<Vec<u8>, ReportError> {
    let name = "staleness.csv";
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["step", "versions_behind", "tokens"])
        .map_err(csv_err(name))?;
    for r in &d.steps {
        let hist = r
            .metrics
            .as_ref()
            .map(|m| m.staleness_histogram.as_slice())
            .unwrap_or(&[]);
        for (behind, tokens) in hist.iter().enumerate() {
            w.write_record([r.step.to_string(), behind.to_string(), tokens.to_string()])
                .map_err(csv_err(name))?;
        }
    }
    finish_csv(w, name)
}

/// Every table as (file name, bytes).
pub fn all(d: &ReportData) -> Result<Vec<(&'static str, Vec<u8>)>, ReportError> {
    Ok(vec![
        ("steps.csv", steps_csv(d)?),
        ("staleness.csv", staleness_csv(d)?),
        ("tasks.csv", group_csv("tasks.csv", "task_id", &d.tasks)?),
        (
            "harnesses.csv",
            group_csv("harnesses.csv", "harness", &d.harnesses)?,
        ),
        (
            "terminations.csv",
            group_csv("terminations.csv", "termination", &d.terminations)?,
        ),
        ("harness_steps.csv", super::harness::harness_steps_csv(d)?),
        ("pool_steps.csv", super::pool::pool_steps_csv(&d.pool_steps)?),
    ])
}
