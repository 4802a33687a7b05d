//! The validity verdict from a task's graded runs: flaky tests or rewards across runs, then the
//! SWE-style (FAIL_TO_PASS / PASS_TO_PASS) or Harbor (reward) rules.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::{invalid, Mode, Run, ValidityVerdict};
use crate::grade::pytest::{PASSED, SKIPPED, XFAIL};
use crate::records::Task;

fn passes(status: Option<&String>) -> bool {
    matches!(
        status.map(String::as_str),
        Some(PASSED) | Some(SKIPPED) | Some(XFAIL)
    )
}

const MAX_LISTED: usize = 20;

fn listed(tests: &[&String]) -> Value {
    json!({"count": tests.len(), "tests": tests.iter().take(MAX_LISTED).collect::<Vec<_>>()})
}

/// Tests (of `names`) or rewards that differ between runs of one check.
fn flaky(names: &BTreeSet<&String>, without: &[Run], with: &[Run]) -> Option<Value> {
    let mut tests = Map::new();
    let mut count = 0;
    for name in names {
        let mut per_check = Map::new();
        for (mode, runs) in [(Mode::WithoutFix, without), (Mode::WithFix, with)] {
            let statuses: Vec<&str> = runs
                .iter()
                .map(|r| r.tests.get(*name).map_or("MISSING", String::as_str))
                .collect();
            if statuses.windows(2).any(|w| w[0] != w[1]) {
                per_check.insert(mode.as_str().into(), json!(statuses));
            }
        }
        if !per_check.is_empty() {
            count += 1;
            if tests.len() < MAX_LISTED {
                tests.insert((*name).clone(), Value::Object(per_check));
            }
        }
    }
    let rewards = |runs: &[Run]| runs.iter().map(|r| r.reward).collect::<Vec<_>>();
    let differ = |runs: &[Run]| runs.windows(2).any(|w| w[0].reward != w[1].reward);
    if count == 0 && !differ(without) && !differ(with) {
        return None;
    }
    Some(json!({
        "runs": without.len(),
        "flaky_tests": count,
        "tests": tests,
        "rewards": {"without_fix": rewards(without), "with_fix": rewards(with)},
    }))
}

pub(super) fn judge_swebench(task: &Task, without: &[Run], with: &[Run]) -> ValidityVerdict {
    let graded: BTreeSet<&String> = task.fail_to_pass.iter().chain(&task.pass_to_pass).collect();
    if let Some(ev) = flaky(&graded, without, with) {
        return invalid("flaky", ev);
    }
    let (w0, g0) = (&without[0], &with[0]);
    if g0.apply.as_deref() == Some("failed") {
        return invalid("gold_patch_does_not_apply", json!({"log_tail": g0.log_tail}));
    }
    let f2p_passing: Vec<&String> = task
        .fail_to_pass
        .iter()
        .filter(|t| w0.tests.get(*t).map(String::as_str) == Some(PASSED))
        .collect();
    if w0.reward >= 1.0 {
        return invalid(
            "passes_without_fix",
            json!({"reward": w0.reward, "fail_to_pass_passing": listed(&f2p_passing)}),
        );
    }
    if g0.reward < 1.0 {
        let failing: Vec<&String> = task
            .fail_to_pass
            .iter()
            .filter(|t| g0.tests.get(*t).map(String::as_str) != Some(PASSED))
            .chain(task.pass_to_pass.iter().filter(|t| !passes(g0.tests.get(*t))))
            .collect();
        return invalid(
            "gold_does_not_resolve",
            json!({
                "reward": g0.reward,
                "apply": g0.apply,
                "failing": listed(&failing),
                "audit": g0.audit.iter().map(|a| format!("{}: {}", a.kind, a.detail)).collect::<Vec<_>>(),
                "log_tail": g0.log_tail,
            }),
        );
    }
    if !f2p_passing.is_empty() {
        return invalid(
            "f2p_passes_without_fix",
            json!({"fail_to_pass_passing": listed(&f2p_passing)}),
        );
    }
    let p2p_failing: Vec<&String> = task
        .pass_to_pass
        .iter()
        .filter(|t| !passes(w0.tests.get(*t)))
        .collect();
    if !p2p_failing.is_empty() {
        return invalid(
            "p2p_fails_without_fix",
            json!({"pass_to_pass_failing": listed(&p2p_failing), "log_tail": w0.log_tail}),
        );
    }
    ValidityVerdict::Valid(json!({
        "runs": without.len(),
        "fail_to_pass": task.fail_to_pass.len(),
        "pass_to_pass": task.pass_to_pass.len(),
        "reward_without_fix": w0.reward,
        "reward_with_fix": g0.reward,
        "gold_apply": g0.apply,
    }))
}

pub(super) fn judge_harbor(without: &[Run], with: &[Run]) -> ValidityVerdict {
    let names: BTreeSet<&String> = without.iter().chain(with).flat_map(|r| r.tests.keys()).collect();
    if let Some(ev) = flaky(&names, without, with) {
        return invalid("flaky", ev);
    }
    let (w0, g0) = (&without[0], &with[0]);
    if w0.reward >= 1.0 {
        return invalid(
            "passes_without_fix",
            json!({"reward": w0.reward, "components": w0.tests}),
        );
    }
    if w0.reward > 0.0 {
        return invalid(
            "rewards_without_fix",
            json!({"reward": w0.reward, "components": w0.tests}),
        );
    }
    if g0.reward < 1.0 {
        return invalid(
            "gold_does_not_resolve",
            json!({"reward": g0.reward, "components": g0.tests, "log_tail": g0.log_tail}),
        );
    }
    ValidityVerdict::Valid(json!({
        "runs": without.len(),
        "reward_without_fix": w0.reward,
        "reward_with_fix": g0.reward,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(reward: f64, tests: &[(&str, &str)]) -> Run {
        Run {
            reward,
            tests: tests
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            apply: Some("git apply".into()),
            audit: Vec::new(),
            log_tail: None,
        }
    }

    fn task() -> Task {
        let mut t = Task::new("t", "fix it");
        t.fail_to_pass = vec!["a.py::f".into()];
        t.pass_to_pass = vec!["a.py::p".into()];
        t
    }

    fn swe(t: &Task, without: &Run, with: &Run) -> String {
        reason(&judge_swebench(
            t,
            std::slice::from_ref(without),
            std::slice::from_ref(with),
        ))
        .to_string()
    }

    fn harbor(without: &Run, with: &Run) -> String {
        reason(&judge_harbor(
            std::slice::from_ref(without),
            std::slice::from_ref(with),
        ))
        .to_string()
    }

    fn reason(v: &ValidityVerdict) -> &str {
        match v {
            ValidityVerdict::Valid(_) => "valid",
            ValidityVerdict::Invalid { reason, .. } => reason,
        }
    }

    #[test]
    fn swebench_verdicts() {
        let t = task();
        let none = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "PASSED")]);
        let gold = run(1.0, &[("a.py::f", "PASSED"), ("a.py::p", "PASSED")]);
        assert_eq!(swe(&t, &none, &gold), "valid");
        assert_eq!(swe(&t, &gold, &gold), "passes_without_fix");
        assert_eq!(swe(&t, &none, &none), "gold_does_not_resolve");
        let p2p_broken = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "ERROR")]);
        assert_eq!(swe(&t, &p2p_broken, &gold), "p2p_fails_without_fix");
        let mut t2 = t.clone();
        t2.fail_to_pass.push("a.py::g".into());
        let half = run(
            0.0,
            &[
                ("a.py::f", "FAILED"),
                ("a.py::g", "PASSED"),
                ("a.py::p", "PASSED"),
            ],
        );
        let gold2 = run(
            1.0,
            &[
                ("a.py::f", "PASSED"),
                ("a.py::g", "PASSED"),
                ("a.py::p", "PASSED"),
            ],
        );
        assert_eq!(swe(&t2, &half, &gold2), "f2p_passes_without_fix");
        // A graded test that changes between runs of the same check is flaky, whatever run 1 said.
        let other = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "FAILED")]);
        let v = judge_swebench(&t, &[none.clone(), other], &[gold.clone(), gold.clone()]);
        assert_eq!(reason(&v), "flaky");
        let ValidityVerdict::Invalid { evidence, .. } = v else {
            unreachable!()
        };
        assert_eq!(
            evidence["tests"]["a.py::p"]["without_fix"],
            json!(["PASSED", "FAILED"])
        );
        assert!(evidence["tests"]["a.py::p"].get("with_fix").is_none());
        let mut bad_apply = gold;
        bad_apply.apply = Some("failed".into());
        assert_eq!(swe(&t, &none, &bad_apply), "gold_patch_does_not_apply");
    }

    #[test]
    fn harbor_verdicts() {
        let zero = run(0.0, &[("reward", "0")]);
        let one = run(1.0, &[("reward", "1")]);
        let half = run(0.5, &[("correctness", "1"), ("performance", "0")]);
        assert_eq!(harbor(&zero, &one), "valid");
        assert_eq!(harbor(&one, &one), "passes_without_fix");
        assert_eq!(harbor(&half, &one), "rewards_without_fix");
        assert_eq!(harbor(&zero, &half), "gold_does_not_resolve");
        assert_eq!(
            reason(&judge_harbor(
                &[zero.clone(), zero],
                &[one.clone(), run(0.0, &[("reward", "0")])]
            )),
            "flaky"
        );
    }
}
