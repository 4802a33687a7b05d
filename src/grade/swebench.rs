//! SWE-bench resolution: RESOLVED_FULL over FAIL_TO_PASS and PASS_TO_PASS.

use std::collections::BTreeMap;

use super::pytest::{PASSED, SKIPPED, XFAIL};

/// The verdict on one evaluation run.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// 1.0 when resolved, 0.0 otherwise.
    pub reward: f64,
    /// F2P tests that did not pass, P2P tests that did not pass or skip (for the report).
    pub failing: Vec<String>,
    /// Why the reward is 0 when no test evidence was found.
    pub note: Option<String>,
}

/// SWE-bench's rule: every FAIL_TO_PASS test passed (skipped is a failure) and every PASS_TO_PASS test
/// passed or was skipped. A test absent from the results did not pass. No statuses at all, or a
/// non-zero exit with no failing test, is treated as "the suite did not run": reward 0 with a note.
pub fn resolve(
    statuses: &BTreeMap<String, String>,
    f2p: &[String],
    p2p: &[String],
    exit_code: Option<i64>,
) -> Verdict {
    let mut failing = Vec::new();
    for t in f2p {
        if statuses.get(t).map(String::as_str) != Some(PASSED) {
            failing.push(t.clone());
        }
    }
    for t in p2p {
        match statuses.get(t).map(String::as_str) {
            Some(PASSED) | Some(SKIPPED) | Some(XFAIL) => {}
            _ => failing.push(t.clone()),
        }
    }
    let any_failed = statuses
        .values()
        .any(|s| s != PASSED && s != SKIPPED && s != XFAIL);
    let note = if statuses.is_empty() {
        Some("no test results: the suite did not run".to_string())
    } else if exit_code.is_some_and(|c| c != 0) && !any_failed {
        Some(format!(
            "test command exited {} with no failing test",
            exit_code.unwrap_or(-1)
        ))
    } else if f2p.is_empty() && p2p.is_empty() {
        Some("task lists no FAIL_TO_PASS or PASS_TO_PASS tests".to_string())
    } else {
        None
    };
    let reward = if failing.is_empty() && note.is_none() {
        1.0
    } else {
        0.0
    };
    Verdict {
        reward,
        failing,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }
    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn resolved_full_rule() {
        let f2p = v(&["a"]);
        let p2p = v(&["b", "c"]);
        let all = st(&[("a", "PASSED"), ("b", "PASSED"), ("c", "SKIPPED")]);
        assert_eq!(resolve(&all, &f2p, &p2p, Some(0)).reward, 1.0);
        // A skipped F2P test is a failure.
        let skipped = st(&[("a", "SKIPPED"), ("b", "PASSED"), ("c", "PASSED")]);
        assert_eq!(resolve(&skipped, &f2p, &p2p, Some(0)).reward, 0.0);
        // A missing P2P test did not pass.
        let missing = st(&[("a", "PASSED"), ("b", "PASSED")]);
        let got = resolve(&missing, &f2p, &p2p, Some(1));
        assert_eq!((got.reward, got.failing), (0.0, v(&["c"])));
    }

    #[test]
    fn no_evidence_is_not_a_pass() {
        assert_eq!(resolve(&BTreeMap::new(), &[], &[], Some(0)).reward, 0.0);
        let only_pass = st(&[("a", "PASSED")]);
        let got = resolve(&only_pass, &v(&["a"]), &[], Some(2));
        assert_eq!(got.reward, 0.0);
        assert!(got.note.is_some());
    }
}
