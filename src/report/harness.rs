//! The report's per-harness view of a mixed run (`rollout --harness` more than once):
//! `harness_steps.csv`, one row per step and harness (reward, infra failures, mixed groups, align's
//! dropped turns and tokens, train-step's log-prob Pearson and trained reward on that batch,
//! terminations and audit kinds), from the rows `validate` computes too ([`crate::validate::by_harness`]). The page
//! draws them (reward and Pearson per harness over steps, and the table) when the run has more
//! than one harness.

use super::data::ReportData;
use super::{csv_err, finish_csv, ReportError};

/// `harness_steps.csv` (header only for a run without trajectories).
pub fn harness_steps_csv(d: &ReportData) -> Result<Vec<u8>, ReportError> {
    let name = "harness_steps.csv";
    let err = csv_err(name);
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "step",
        "harness",
        "trajectories",
        "graded",
        "reward_mean",
        "infra_failures",
        "groups",
        "mixed_groups",
        "aligned_turns",
        "dropped_turns",
        "align_drop_rate",
        "policy_tokens",
        "dropped_tokens",
        "trained_samples",
        "trained_reward_mean",
        "logprob_pearson",
        "logprob_max_abs_diff",
        "terminations",
        "audit",
    ])
    .map_err(&err)?;
    let num = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let kv = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(";")
    };
    for r in &d.harness_steps {
        let t = r.train.as_ref();
        w.write_record([
            r.step.to_string(),
            r.harness.clone(),
            r.trajectories.to_string(),
            r.rewards.n.to_string(),
            num(r.reward_mean()),
            r.infra_failures.to_string(),
            r.groups.to_string(),
            r.mixed_groups.to_string(),
            r.aligned_turns.to_string(),
            r.dropped_turns.to_string(),
            num(r.align_drop_rate()),
            r.policy_tokens.to_string(),
            r.dropped_tokens.to_string(),
            t.map(|m| m.samples.to_string()).unwrap_or_default(),
            num(t.and_then(|m| m.reward_mean)),
            num(t.and_then(|m| m.logprob_pearson)),
            num(t.and_then(|m| m.logprob_max_abs_diff)),
            kv(&r.terminations),
            kv(&r.audit),
        ])
        .map_err(&err)?;
    }
    finish_csv(w, name)
}
