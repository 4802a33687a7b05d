//! Judging one gate over its scopes for [`super::judge`]: the run's values and, in a run that
//! mixes harnesses, each harness's; which value a gate reports, whether it passed, and a detail
//! that names the failing scopes (kept apart from the gate table, which fills a file).

use std::collections::BTreeMap;

use super::{GateConfig, Op};
use crate::records::GateResult;

/// The item whose value is worst by `op` (the first of equals), if any.
fn worst_of<T: Copy>(op: Op, items: impl Iterator<Item = T>, value: impl Fn(T) -> f64) -> Option<T> {
    items.reduce(|a, b| if op.worse(value(b), value(a)) { b } else { a })
}

/// A run-level gate over its scopes (the run's, with an empty name, then each harness's), each
/// measured or not: the value (the worst failing scope's; when none fails, the run's, else the
/// worst harness's), whether every measured scope passed, and the detail (the run's own, then the
/// failing harnesses by name, the worst marked when several scopes fail).
pub(super) fn judge_run_level(
    op: Op,
    threshold: f64,
    scopes: Vec<(String, Option<(f64, String)>)>,
) -> (Option<f64>, bool, String) {
    let measured: Vec<(String, f64, String)> = scopes
        .into_iter()
        .filter_map(|(scope, m)| m.map(|(v, d)| (scope, v, d)))
        .collect();
    let failing: Vec<&(String, f64, String)> = measured.iter().filter(|m| !op.ok(m.1, threshold)).collect();
    // The run's own value when measured (as for the per-step gates), else the worst harness's;
    // a failing gate's is its worst failing scope's.
    let run_wide = measured.iter().any(|m| m.0.is_empty());
    let worst = if failing.is_empty() {
        worst_of(op, measured.iter().filter(|m| m.0.is_empty() || !run_wide), |m| {
            m.1
        })
    } else {
        worst_of(op, failing.iter().copied(), |m| m.1)
    };
    let mark = |m: &(String, f64, String)| {
        let is_worst = failing.len() > 1 && worst.is_some_and(|w| std::ptr::eq(w, m));
        if is_worst {
            " (worst)"
        } else {
            ""
        }
    };
    let overall = measured
        .iter()
        .find(|m| m.0.is_empty())
        .map(|m| format!("{}{}", m.2, mark(m)));
    let harnesses: Vec<String> = failing
        .iter()
        .filter(|m| !m.0.is_empty())
        .map(|m| format!("{}: {:.4} ({}){}", m.0, m.1, m.2, mark(m)))
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
    (worst.map(|w| w.1), failing.is_empty(), detail)
}

/// One per-step gate over its scopes (the run, then each harness: a prefix for the detail and the
/// values by step), judged on the latest step or on all with `all_steps`.
pub(super) fn judge_steps(
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
    // A passing gate's value is the run's own (its worst judged step), so it means what it
    // always meant; only without a run-wide value is it the worst harness's. A failing gate's is
    // the worst failing value, wherever it is: a gate that fails on a harness at 0.25 must not
    // report the run's 0.05 under its threshold.
    let run_wide = judged.iter().any(|j| j.0.is_empty());
    let run_worst = worst_of(
        op,
        judged.iter().copied().filter(|j| j.0.is_empty() || !run_wide),
        |j| j.2,
    );
    let failing: Vec<(&str, u64, f64)> = judged
        .iter()
        .copied()
        .filter(|(_, _, v)| !op.ok(*v, threshold))
        .collect();
    let worst = worst_of(op, failing.iter().copied(), |j| j.2).or(run_worst);
    let listed: Vec<String> = failing
        .iter()
        .map(|&f| {
            let mark = if failing.len() > 1 && Some(f) == worst {
                " (worst)"
            } else {
                ""
            };
            format!("{}step {}: {:.4}{mark}", f.0, f.1, f.2)
        })
        .collect();
    // The run's own value, when it passed and a harness failed: the figure the value replaced.
    let run_ok = run_worst
        .filter(|r| r.0.is_empty() && !failing.is_empty() && op.ok(r.2, threshold))
        .map(|r| format!("; run-wide step {}: {:.4}", r.1, r.2))
        .unwrap_or_default();
    GateResult {
        name: name.into(),
        value: worst.map(|w| w.2),
        op: op.symbol().into(),
        threshold,
        passed: failing.is_empty(),
        detail: Some(match worst {
            None => "not measured".into(),
            Some(_) if !failing.is_empty() => format!("failing {}{run_ok}", listed.join(", ")),
            Some((scope, step, _)) => format!("worst at {scope}step {step}"),
        }),
    }
}

/// Adds to a per-step gate's detail the harnesses not judged alone on it for having too few
/// trajectories (`few`: step, label), on the steps it judged: the run's latest (`run_latest`,
/// else the latest listed), or all.
pub(super) fn note_too_few(
    g: &mut GateResult,
    few: Vec<(u64, String)>,
    cfg: &GateConfig,
    run_latest: Option<u64>,
) {
    let latest = run_latest.or_else(|| few.iter().map(|f| f.0).max());
    let listed: Vec<String> = few
        .into_iter()
        .filter(|f| cfg.all_steps || Some(f.0) == latest)
        .map(|f| f.1)
        .collect();
    if listed.is_empty() {
        return;
    }
    let note = format!(
        "under {} trajectories, not judged alone: {}",
        cfg.min_harness_trajectories,
        listed.join(", ")
    );
    g.detail = Some(match g.detail.take() {
        Some(d) => format!("{d}; {note}"),
        None => note,
    });
}
