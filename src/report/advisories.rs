//! Run-health advisories: the soft layer under `validate`'s gates. A gate fails a run; an
//! advisory says that a run is drifting towards trouble while every gate still passes, so a
//! person looks before a step is wasted. They are computed from the report's per-step rows
//! (nothing is re-read), shown at the top of the page and the live UI, and written to
//! `advisories.json` for scripts.
//!
//! Defaults follow the field where it has published numbers: the Miles dashboard's health
//! advisories warn at a zero-std group fraction ≥ 0.5, truncation ≥ 0.25 and an abort ratio
//! ≥ 0.05 (our infra-failure fraction). The rest are lego-rl's own choices, set below the
//! matching `validate` gate (Pearson 0.995 against the gate's 0.99) or at a level where a
//! person should look (any audit event at all: each is a possible reward hack).
//!
//! Two shapes: a *threshold* advisory fires on each step whose figure crosses its threshold; a
//! *trend* advisory compares a step with the run's start (response length growth) or with its
//! own recent past (a Pearson decline), and needs at least [`TREND_MIN_STEPS`] steps.

use std::collections::BTreeMap;

use serde::Serialize;

use super::data::StepRow;

/// Schema of `advisories.json`.
pub const SCHEMA: &str = "lego-rl/advisories/v1";

/// Steps a trend advisory needs before it can fire (a two-step run has no trend).
pub const TREND_MIN_STEPS: usize = 3;

/// How an advisory compares its figure with its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Fires when the figure is at or above the threshold.
    AtLeast,
    /// Fires when the figure is below the threshold.
    Below,
    /// Fires when the figure is above the threshold (for counts whose threshold is 0).
    Above,
}

/// One advisory's definition: its name (the `--advisory NAME=VALUE` key), its default
/// threshold and what it means.
pub struct Def {
    pub name: &'static str,
    pub default: f64,
    pub direction: Direction,
    pub doc: &'static str,
}

/// Every advisory except the per-audit-kind ones (`audit:<kind>`, threshold [`AUDIT_DEFAULT`]).
pub const DEFS: &[Def] = &[
    Def {
        name: "zero_variance_group_fraction",
        default: 0.5,
        direction: Direction::AtLeast,
        doc: "groups whose rollouts all got the same reward (no learning signal)",
    },
    Def {
        name: "truncated_fraction",
        default: 0.25,
        direction: Direction::AtLeast,
        doc: "trajectories ended by max_turns, context_limit or agent_timeout",
    },
    Def {
        name: "infra_failure_fraction",
        default: 0.05,
        direction: Direction::AtLeast,
        doc: "trajectories that failed in our machinery (weight 0)",
    },
    Def {
        name: "malformed_tool_call_rate",
        default: 0.1,
        direction: Direction::AtLeast,
        doc: "tool calls the proxy could not parse, over all tool calls attempted",
    },
    Def {
        name: "staleness_mean",
        default: 1.5,
        direction: Direction::AtLeast,
        doc: "mean policy versions between sampling and training (train-step metrics)",
    },
    Def {
        name: "response_tokens_growth",
        default: 1.5,
        direction: Direction::AtLeast,
        doc: "mean response tokens of a step over the mean of the run's first steps (trend)",
    },
    Def {
        name: "logprob_pearson",
        default: 0.995,
        direction: Direction::Below,
        doc: "rollout-vs-trainer log-prob Pearson of a step (the validate gate is 0.99)",
    },
    Def {
        name: "logprob_pearson_decline",
        default: 0.002,
        direction: Direction::AtLeast,
        doc: "drop of a step's Pearson below the best of the previous steps (trend)",
    },
    Def {
        name: "suspected_hack_rate",
        default: 0.0,
        direction: Direction::Above,
        doc: "rewarded trajectories with a deterministic hack signal (hack_* audit kinds, \
              outside_read), over the step's trajectories: review them before trusting the reward",
    },
    Def {
        name: "prefix_cache_hit_rate",
        default: 0.5,
        direction: Direction::Below,
        doc: "share of prompt tokens the engine served from its prefix cache",
    },
];

/// Default threshold of every `audit:<kind>` advisory: the fraction of a step's trajectories
/// with that event. 0 means any event at all fires.
pub const AUDIT_DEFAULT: f64 = 0.0;

/// Thresholds in force: the defaults, then the user's `NAME=VALUE` overrides (`NAME=off`
/// switches one off). `audit` holds overrides of single audit kinds, `audit_all` one for all.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Thresholds {
    pub values: BTreeMap<String, Option<f64>>,
}

impl Default for Thresholds {
    fn default() -> Self {
        let mut values: BTreeMap<String, Option<f64>> = DEFS
            .iter()
            .map(|d| (d.name.to_string(), Some(d.default)))
            .collect();
        values.insert("audit".to_string(), Some(AUDIT_DEFAULT));
        Thresholds { values }
    }
}

impl Thresholds {
    /// Applies `NAME=VALUE` overrides. NAME is one of [`DEFS`], `audit` (every audit kind) or
    /// `audit:<kind>`; VALUE a number or `off`.
    pub fn with_overrides(mut self, overrides: &[String]) -> Result<Self, String> {
        for o in overrides {
            let (name, value) = o
                .split_once('=')
                .ok_or_else(|| format!("--advisory {o:?}: expected NAME=VALUE (or NAME=off)"))?;
            let known = DEFS.iter().any(|d| d.name == name)
                || name == "audit"
                || name.strip_prefix("audit:").is_some_and(|k| !k.is_empty());
            if !known {
                let names: Vec<&str> = DEFS.iter().map(|d| d.name).collect();
                return Err(format!(
                    "--advisory {o:?}: unknown advisory {name:?}; known: {}, audit, audit:<kind>",
                    names.join(", ")
                ));
            }
            let v = match value {
                "off" => None,
                v => Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| format!("--advisory {o:?}: {value:?} is not a number or off"))?,
                ),
            };
            self.values.insert(name.to_string(), v);
        }
        Ok(self)
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied().flatten()
    }

    /// The threshold of one audit kind: its own override, else the `audit` one.
    fn audit(&self, kind: &str) -> Option<f64> {
        match self.values.get(&format!("audit:{kind}")) {
            Some(v) => *v,
            None => self.get("audit"),
        }
    }
}

/// One fired advisory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advisory {
    /// The advisory's name (`audit:<kind>` for audit events).
    pub name: String,
    pub step: u64,
    pub value: f64,
    pub threshold: f64,
    pub direction: Direction,
    /// One line for people.
    pub message: String,
}

/// The content of `advisories.json`.
#[derive(Debug, Clone, Serialize)]
pub struct AdvisoriesFile<'a> {
    pub schema: &'static str,
    pub thresholds: &'a Thresholds,
    pub advisories: &'a [Advisory],
}

fn fires(direction: Direction, value: f64, threshold: f64) -> bool {
    match direction {
        Direction::AtLeast => value >= threshold,
        Direction::Below => value < threshold,
        Direction::Above => value > threshold,
    }
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The per-step figure of a threshold advisory (None where the step has no data for it).
fn figure(name: &str, r: &StepRow) -> Option<f64> {
    let m = r.metrics.as_ref();
    match name {
        "zero_variance_group_fraction" => ratio(r.zero_variance_groups, r.groups),
        "truncated_fraction" => {
            let t: u64 = ["max_turns", "context_limit", "agent_timeout"]
                .iter()
                .map(|k| r.terminations.get(*k).copied().unwrap_or(0))
                .sum();
            ratio(t, r.trajectories)
        }
        "infra_failure_fraction" => ratio(r.infra_failures, r.trajectories),
        "malformed_tool_call_rate" => {
            let calls = r
                .tool_calls_mean
                .map_or(0.0, |c| c * r.trajectories as f64)
                .round() as u64;
            ratio(r.malformed_tool_calls, calls + r.malformed_tool_calls)
        }
        "staleness_mean" => m.and_then(|m| m.staleness_mean),
        "logprob_pearson" => m.and_then(|m| m.logprob_pearson),
        "prefix_cache_hit_rate" => r.prefix_cache_hit_rate,
        "suspected_hack_rate" => ratio(
            r.audit.get(crate::records::SUSPECTED_HACK).copied().unwrap_or(0),
            r.trajectories,
        ),
        _ => None,
    }
}

fn def(name: &str) -> &'static Def {
    DEFS.iter()
        .find(|d| d.name == name)
        .expect("invariant: advisory names come from DEFS")
}

/// The advisories of a run's steps (in step order), under `th`.
pub fn advise(steps: &[StepRow], th: &Thresholds) -> Vec<Advisory> {
    let mut out = Vec::new();
    let trend = steps.len() >= TREND_MIN_STEPS;
    // The run's start for length growth: the mean over its first steps (up to 3) with data.
    let start: Vec<f64> = steps
        .iter()
        .filter_map(|r| r.response_tokens_mean)
        .take(3)
        .collect();
    let start_mean = (!start.is_empty()).then(|| start.iter().sum::<f64>() / start.len() as f64);
    for (i, r) in steps.iter().enumerate() {
        let mut push = |name: &str, value: f64, threshold: f64, direction: Direction, message: String| {
            if fires(direction, value, threshold) {
                out.push(Advisory {
                    name: name.to_string(),
                    step: r.step,
                    value,
                    threshold,
                    direction,
                    message,
                });
            }
        };
        for d in DEFS {
            let (Some(t), Some(v)) = (th.get(d.name), figure(d.name, r)) else {
                continue;
            };
            push(
                d.name,
                v,
                t,
                d.direction,
                format!("{}: {v:.4} ({})", d.name, d.doc),
            );
        }
        if let (true, Some(t), Some(s), Some(v)) = (
            trend && i >= TREND_MIN_STEPS - 1,
            th.get("response_tokens_growth"),
            start_mean,
            r.response_tokens_mean,
        ) {
            if s > 0.0 {
                let g = v / s;
                let d = def("response_tokens_growth");
                push(
                    d.name,
                    g,
                    t,
                    d.direction,
                    format!("mean response tokens {v:.1} = {g:.2}× the run's start ({s:.1})"),
                );
            }
        }
        if let (true, Some(t), Some(p)) = (
            trend && i >= TREND_MIN_STEPS - 1,
            th.get("logprob_pearson_decline"),
            figure("logprob_pearson", r),
        ) {
            let best = steps[i.saturating_sub(3)..i]
                .iter()
                .filter_map(|q| figure("logprob_pearson", q))
                .fold(f64::NEG_INFINITY, f64::max);
            if best.is_finite() {
                let d = def("logprob_pearson_decline");
                push(
                    d.name,
                    best - p,
                    t,
                    d.direction,
                    format!("log-prob Pearson fell to {p:.4} from {best:.4} in the previous steps"),
                );
            }
        }
        for (kind, n) in &r.audit {
            if kind == crate::records::SUSPECTED_HACK {
                continue; // its own advisory, suspected_hack_rate
            }
            let name = format!("audit:{kind}");
            if let (Some(t), Some(v)) = (th.audit(kind), ratio(*n, r.trajectories)) {
                push(
                    &name,
                    v,
                    t,
                    Direction::Above,
                    format!("{n} of {} trajectories have audit event {kind}", r.trajectories),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::StepMetrics;

    /// A healthy step: mixed rewards, no truncation, no failures, good agreement.
    fn healthy(step: u64) -> StepRow {
        StepRow {
            step,
            trajectories: 16,
            groups: 2,
            zero_variance_groups: 0,
            response_tokens_mean: Some(200.0),
            tool_calls_mean: Some(5.0),
            terminations: BTreeMap::from([("finished".to_string(), 16)]),
            prompt_tokens: 1000,
            cached_prompt_tokens: 900,
            prefix_cache_hit_rate: Some(0.9),
            metrics: Some(StepMetrics {
                logprob_pearson: Some(0.999),
                staleness_mean: Some(0.5),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(a: &[Advisory]) -> Vec<(String, u64)> {
        a.iter().map(|a| (a.name.clone(), a.step)).collect()
    }

    #[test]
    fn a_healthy_run_is_quiet() {
        let steps: Vec<StepRow> = (1..=5).map(healthy).collect();
        assert_eq!(advise(&steps, &Thresholds::default()), vec![]);
    }

    #[test]
    fn each_threshold_advisory_fires_on_the_step_that_crosses_it() {
        type Edit = Box<dyn Fn(&mut StepRow)>;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "zero_variance_group_fraction",
                Box::new(|r| r.zero_variance_groups = 1),
            ),
            (
                "truncated_fraction",
                Box::new(|r| {
                    r.terminations = BTreeMap::from([
                        ("finished".into(), 12),
                        ("max_turns".into(), 2),
                        ("context_limit".into(), 2),
                    ])
                }),
            ),
            ("infra_failure_fraction", Box::new(|r| r.infra_failures = 1)),
            (
                "malformed_tool_call_rate",
                Box::new(|r| r.malformed_tool_calls = 9),
            ),
            (
                "staleness_mean",
                Box::new(|r| r.metrics.as_mut().unwrap().staleness_mean = Some(2.0)),
            ),
            (
                "logprob_pearson",
                Box::new(|r| r.metrics.as_mut().unwrap().logprob_pearson = Some(0.993)),
            ),
            (
                "prefix_cache_hit_rate",
                Box::new(|r| r.prefix_cache_hit_rate = Some(0.2)),
            ),
            (
                "audit:test_file_modified",
                Box::new(|r| r.audit = BTreeMap::from([("test_file_modified".into(), 1)])),
            ),
        ];
        for (name, f) in cases {
            let mut steps: Vec<StepRow> = (1..=2).map(healthy).collect();
            f(&mut steps[1]);
            let got = advise(&steps, &Thresholds::default());
            assert!(
                got.iter().any(|a| a.name == name && a.step == 2),
                "{name}: {got:?}"
            );
            assert!(
                got.iter().all(|a| a.step == 2),
                "{name}: only the crossing step: {got:?}"
            );
            // Switched off, it is quiet.
            let off = Thresholds::default()
                .with_overrides(&[format!("{name}=off")])
                .unwrap();
            assert!(advise(&steps, &off).iter().all(|a| a.name != name), "{name} off");
        }
    }

    #[test]
    fn thresholds_sit_exactly_at_their_edges() {
        // 8 of 16 groups at 0.5: Miles' "≥ 0.5" fires; 7 of 16 does not.
        let mut r = healthy(1);
        r.groups = 16;
        r.zero_variance_groups = 8;
        assert_eq!(
            names(&advise(&[r.clone()], &Thresholds::default())),
            vec![("zero_variance_group_fraction".into(), 1)]
        );
        r.zero_variance_groups = 7;
        assert_eq!(advise(&[r], &Thresholds::default()), vec![]);
    }

    #[test]
    fn trends_need_three_steps_and_compare_with_the_start_or_the_recent_past() {
        let mut steps: Vec<StepRow> = (1..=2).map(healthy).collect();
        steps[1].response_tokens_mean = Some(400.0);
        steps[1].metrics.as_mut().unwrap().logprob_pearson = Some(0.996);
        assert_eq!(
            advise(&steps, &Thresholds::default()),
            vec![],
            "two steps: no trend"
        );
        let mut steps: Vec<StepRow> = (1..=4).map(healthy).collect();
        steps[3].response_tokens_mean = Some(400.0);
        steps[3].metrics.as_mut().unwrap().logprob_pearson = Some(0.996);
        let got = advise(&steps, &Thresholds::default());
        assert_eq!(
            names(&got),
            vec![
                ("response_tokens_growth".into(), 4),
                ("logprob_pearson_decline".into(), 4)
            ]
        );
        assert!(
            (got[0].value - 2.0).abs() < 1e-12,
            "400 over the first three steps' 200"
        );
        assert!((got[1].value - 0.003).abs() < 1e-9);
    }

    #[test]
    fn overrides_are_checked() {
        let t = Thresholds::default()
            .with_overrides(&["truncated_fraction=0.1".into(), "audit:shadowing=0.5".into()])
            .unwrap();
        assert_eq!(t.get("truncated_fraction"), Some(0.1));
        assert_eq!(t.audit("shadowing"), Some(0.5));
        assert_eq!(t.audit("other"), Some(AUDIT_DEFAULT));
        for bad in ["nope=1", "truncated_fraction", "truncated_fraction=x", "audit:=1"] {
            let e = Thresholds::default()
                .with_overrides(&[bad.to_string()])
                .unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
