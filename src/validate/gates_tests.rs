//! Tests of [`super`] (kept apart: the gate table and its tests together exceed a file).
use super::*;
use crate::validate::health::RewardSum;

fn health_with(step: u64, infra: u64, of: u64) -> Health {
    let mut h = Health::default();
    h.steps.insert(
        step,
        StepHealth {
            step,
            trajectories: of,
            infra_failures: infra,
            ..Default::default()
        },
    );
    h
}

#[test]
fn gate_file_overrides_defaults_and_rejects_unknown_names() {
    let mut cfg = GateConfig::default();
    cfg.apply_toml(
        "all_steps = true\ndisable = [\"expert_overlap\"]\n[thresholds]\nlogprob_pearson = 0.98\n",
    )
    .unwrap();
    assert!(cfg.all_steps);
    assert_eq!(cfg.thresholds["logprob_pearson"], 0.98);
    assert!(!cfg.thresholds.contains_key("expert_overlap"));
    let err = cfg.apply_toml("[thresholds]\nnope = 1\n").unwrap_err();
    assert!(err.to_string().contains("unknown gate `nope`"), "{err}");
    cfg.apply_flag("infra_failure_rate=0.5").unwrap();
    assert_eq!(cfg.thresholds["infra_failure_rate"], 0.5);
    cfg.apply_flag("infra_failure_rate=off").unwrap();
    assert!(!cfg.thresholds.contains_key("infra_failure_rate"));
    assert!(cfg.apply_flag("infra_failure_rate").is_err());
}

#[test]
fn every_audit_kind_is_gated() {
    let mut h = health_with(3, 0, 10);
    let s = h.steps.get_mut(&3).expect("step");
    s.audit.insert("outlived_agent".into(), 1);
    s.audit.insert("grading_killed".into(), 1);
    let g = judge(&h, &GateConfig::default());
    for k in AUDIT_KINDS {
        let gate = g.iter().find(|g| g.name == format!("{k}_rate"));
        assert!(gate.is_some(), "no gate for audit kind {k}");
    }
    let by = |n: &str| g.iter().find(|g| g.name == n).expect("gate").clone();
    assert_eq!(by("outlived_agent_rate").value, Some(0.1));
    assert!(!by("outlived_agent_rate").passed, "0.1 > 0.05");
    assert!(!by("grading_killed_rate").passed);
    assert!(by("nested_repo_rate").passed);
    for (gate, threshold) in [("outside_read_rate", 0.1), ("reward_tampering_rate", 0.0)] {
        assert_eq!(by(gate).threshold, threshold, "{gate}");
    }
}

#[test]
fn latest_step_is_judged_unless_all_steps() {
    let mut h = health_with(0, 5, 10);
    h.steps.insert(
        1,
        StepHealth {
            step: 1,
            trajectories: 10,
            infra_failures: 0,
            ..Default::default()
        },
    );
    let mut cfg = GateConfig::default();
    let g = judge(&h, &cfg);
    let infra = g.iter().find(|g| g.name == "infra_failure_rate").unwrap();
    assert_eq!(infra.value, Some(0.0));
    assert!(infra.passed);
    cfg.all_steps = true;
    let g = judge(&h, &cfg);
    let infra = g.iter().find(|g| g.name == "infra_failure_rate").unwrap();
    assert_eq!(infra.value, Some(0.5));
    assert!(!infra.passed);
    assert_eq!(infra.detail.as_deref(), Some("failing step 0: 0.5000"));
    let pearson = g.iter().find(|g| g.name == "logprob_pearson").unwrap();
    assert!(pearson.passed && pearson.value.is_none());
}

fn rewards(hits: u64, n: u64) -> RewardSum {
    RewardSum {
        n,
        sum: hits as f64,
        sq_sum: hits as f64,
    }
}

fn with_train_rewards(hits: &[u64], per_step: u64) -> Health {
    let mut h = Health::default();
    for (i, &k) in hits.iter().enumerate() {
        let r = rewards(k, per_step);
        h.steps.insert(
            i as u64,
            StepHealth {
                step: i as u64,
                trajectories: per_step,
                rewards: r,
                ..Default::default()
            },
        );
    }
    h
}

fn gate<'a>(g: &'a [GateResult], name: &str) -> &'a GateResult {
    g.iter().find(|g| g.name == name).unwrap()
}

#[test]
fn heldout_collapse_fails_and_a_rise_passes() {
    // Run 8 of examples/learn: 23/96 at the warm start, 2/96 after 25 GSPO steps.
    let mut h = Health::default();
    h.eval.insert(40, rewards(23, 96));
    h.eval.insert(45, rewards(12, 24));
    h.eval.insert(65, rewards(2, 96));
    let g = judge(&h, &GateConfig::default());
    let drop = gate(&g, "heldout_reward_drop");
    let (a, b): (f64, f64) = (23.0 / 96.0, 2.0 / 96.0);
    let want = (a - b) - 1.96 * (a * (1.0 - a) / 96.0 + b * (1.0 - b) / 96.0).sqrt();
    assert!((drop.value.unwrap() - want).abs() < 1e-12, "{drop:?}");
    assert!((want - 0.1287).abs() < 1e-3);
    assert!(!drop.passed);
    assert_eq!(
        drop.detail.as_deref(),
        Some("eval 40: 0.240 (n=96) -> eval 65: 0.021 (n=96)")
    );
    // Run 7: 40/96 -> 64/96.
    h.eval.clear();
    h.eval.insert(40, rewards(40, 96));
    h.eval.insert(66, rewards(64, 96));
    let drop = gate(&judge(&h, &GateConfig::default()), "heldout_reward_drop").clone();
    assert!(drop.passed && drop.value.unwrap() < 0.0, "{drop:?}");
    // One evaluation: nothing to compare.
    h.eval.remove(&66);
    let drop = gate(&judge(&h, &GateConfig::default()), "heldout_reward_drop").clone();
    assert!(drop.passed && drop.value.is_none());
    assert_eq!(drop.detail.as_deref(), Some("not measured"));
}

#[test]
fn train_reward_drop_compares_first_and_latest_windows() {
    // Run 8's train batches (of 24): a fall too small to be told from noise.
    let run8 = [
        7, 3, 0, 2, 2, 1, 4, 1, 0, 1, 3, 3, 5, 3, 7, 7, 5, 4, 3, 2, 3, 1, 3, 0, 1,
    ];
    let g = judge(&with_train_rewards(&run8, 24), &GateConfig::default());
    let drop = gate(&g, "train_reward_drop");
    let (a, b): (f64, f64) = (14.0 / 120.0, 8.0 / 120.0);
    let want = (a - b) - 1.96 * (a * (1.0 - a) / 120.0 + b * (1.0 - b) / 120.0).sqrt();
    assert!((drop.value.unwrap() - want).abs() < 1e-12, "{drop:?}");
    assert!(drop.passed);
    assert_eq!(
        drop.detail.as_deref(),
        Some("steps 0-4: 0.117 (n=120) -> steps 20-24: 0.067 (n=120)")
    );
    // A collapse: half the batch solved, then almost nothing.
    let collapse = [12, 12, 11, 13, 12, 6, 3, 1, 1, 0, 1];
    let drop = gate(
        &judge(&with_train_rewards(&collapse, 24), &GateConfig::default()),
        "train_reward_drop",
    )
    .clone();
    assert!(!drop.passed && drop.value.unwrap() > 0.3, "{drop:?}");
    // Fewer than two windows of steps: not measured; and the gate can be switched off.
    let mut cfg = GateConfig::default();
    let drop = gate(
        &judge(&with_train_rewards(&collapse[..9], 24), &cfg),
        "train_reward_drop",
    )
    .clone();
    assert!(drop.passed && drop.value.is_none());
    cfg.apply_flag("train_reward_drop=off").unwrap();
    assert!(judge(&with_train_rewards(&collapse, 24), &cfg)
        .iter()
        .all(|g| g.name != "train_reward_drop"));
}

fn harness_row(step: u64, harness: &str) -> crate::validate::by_harness::HarnessRow {
    crate::validate::by_harness::HarnessRow {
        step,
        harness: harness.into(),
        trajectories: 4,
        ..Default::default()
    }
}

#[test]
fn a_mixed_run_judges_pearson_and_reward_collapse_per_harness_naming_it() {
    let mut h = Health::default();
    h.metrics.push(StepMetrics {
        step: 4,
        logprob_pearson: Some(0.995),
        routing_replay: Some(true),
        ..Default::default()
    });
    for (harness, pearson) in [("a", 0.999), ("b", 0.97)] {
        let mut r = harness_row(3, harness);
        r.train = Some(crate::records::HarnessStepMetrics {
            logprob_pearson: Some(pearson),
            ..Default::default()
        });
        h.harnesses.push(r);
    }
    // Ten steps of rewards: harness a steady at 0.5, harness b from 1 to 0.
    for step in 0..10 {
        for harness in ["a", "b"] {
            let mut r = harness_row(step, harness);
            for i in 0..20 {
                r.rewards.push(match harness {
                    "a" => f64::from(i % 2),
                    _ => f64::from(step < 5),
                });
            }
            h.harnesses.push(r);
        }
    }
    let g = judge(&h, &GateConfig::default());
    let by = |n: &str| g.iter().find(|g| g.name == n).expect("gate").clone();
    let p = by("logprob_pearson");
    assert_eq!(
        p.value,
        Some(0.97),
        "the failing harness's value, not the run's 0.995"
    );
    assert!(!p.passed);
    assert_eq!(
        p.detail.as_deref(),
        Some("failing harness b step 4: 0.9700; run-wide step 4: 0.9950")
    );
    assert_eq!(
        by("logprob_pearson_without_replay").detail.as_deref(),
        Some("not measured")
    );
    let r = by("train_reward_drop");
    assert!(!r.passed);
    assert_eq!(r.value, Some(1.0), "no run-wide steps: the worst harness's");
    let detail = r.detail.unwrap_or_default();
    assert!(
        detail.starts_with("failing harness b: 1.0000 (steps 0-4: 1.000 (n=100)"),
        "{detail}"
    );
    // One harness only: nothing is judged per harness.
    h.harnesses.retain(|r| r.harness == "a");
    let g = judge(&h, &GateConfig::default());
    let p = g.iter().find(|g| g.name == "logprob_pearson").expect("gate");
    assert!(p.passed, "{p:?}");
}

#[test]
fn the_informative_fraction_is_judged_on_dynamically_sampled_steps_only() {
    let mut h = health_with(2, 0, 10);
    let g = judge(&h, &GateConfig::default());
    let fraction = |g: &[GateResult]| {
        g.iter()
            .find(|g| g.name == "informative_group_fraction")
            .expect("gate")
            .clone()
    };
    assert_eq!(fraction(&g).detail.as_deref(), Some("not measured"));
    h.dynamic.insert(
        2,
        crate::validate::dynamic::DynamicStep {
            step: 2,
            sampled_groups: 20,
            informative_groups: 1,
            ..Default::default()
        },
    );
    let f = fraction(&judge(&h, &GateConfig::default()));
    assert_eq!((f.value, f.passed), (Some(0.05), false));
}

/// A mixed run's step 2: the run-wide infra rate and one row per harness, `(name, infra, of)`.
fn mixed_infra(run: (u64, u64), harnesses: &[(&str, u64, u64)]) -> Health {
    let mut h = health_with(2, run.0, run.1);
    for &(name, infra, of) in harnesses {
        let mut r = harness_row(2, name);
        r.trajectories = of;
        r.infra_failures = infra;
        h.harnesses.push(r);
    }
    h
}

// Regression: a gate that failed for one harness reported the run's value, under its threshold.
#[test]
fn a_failing_gate_reports_the_worst_failing_value_and_names_its_scope() {
    let infra = |h: &Health, cfg: &GateConfig| gate(&judge(h, cfg), "infra_failure_rate").clone();
    let cfg = GateConfig::default();
    // The run passes (2 of 40), harness b fails (2 of 10): b's value, the run's in the detail.
    let g = infra(&mixed_infra((2, 40), &[("a", 0, 30), ("b", 2, 10)]), &cfg);
    assert_eq!((g.value, g.passed), (Some(0.2), false));
    assert_eq!(
        g.detail.as_deref(),
        Some("failing harness b step 2: 0.2000; run-wide step 2: 0.0500")
    );
    // The run fails (6 of 40) and harness b fails worse (5 of 10): b's value, marked worst.
    let g = infra(&mixed_infra((6, 40), &[("a", 1, 30), ("b", 5, 10)]), &cfg);
    assert_eq!((g.value, g.passed), (Some(0.5), false));
    assert_eq!(
        g.detail.as_deref(),
        Some("failing step 2: 0.1500, harness b step 2: 0.5000 (worst)")
    );
    // Every scope passes: the run's value, as always.
    let g = infra(&mixed_infra((1, 40), &[("a", 0, 30), ("b", 1, 10)]), &cfg);
    assert_eq!((g.value, g.passed), (Some(0.025), true));
    assert_eq!(g.detail.as_deref(), Some("worst at step 2"));
}

#[test]
fn a_harness_with_few_trajectories_is_not_judged_alone_on_rate_gates() {
    // Harness "few" ran 3 trajectories, 1 an infra failure (0.33 against 0.1); the run's 1 of 23
    // passes, and so does the gate, saying what it left out.
    let h = mixed_infra((1, 23), &[("many", 0, 20), ("few", 1, 3)]);
    let g = gate(&judge(&h, &GateConfig::default()), "infra_failure_rate").clone();
    assert_eq!((g.value, g.passed), (Some(1.0 / 23.0), true), "{g:?}");
    assert_eq!(
        g.detail.as_deref(),
        Some("worst at step 2; under 8 trajectories, not judged alone: harness few step 2 (3)")
    );
    // From the gate file's minimum down to 3, it is judged alone and fails the gate.
    let mut cfg = GateConfig::default();
    cfg.apply_toml("min_harness_trajectories = 3").unwrap();
    let g = gate(&judge(&h, &cfg), "infra_failure_rate").clone();
    assert_eq!((g.value, g.passed), (Some(1.0 / 3.0), false), "{g:?}");
    assert!(
        g.detail
            .as_deref()
            .unwrap()
            .starts_with("failing harness few step 2: 0.3333"),
        "{g:?}"
    );
    // The minimum is for rates of trajectories: train-step's Pearson of the same harness (over
    // its tokens) is judged whatever its trajectory count.
    let mut h = h;
    h.metrics.push(StepMetrics {
        step: 3,
        logprob_pearson: Some(0.999),
        routing_replay: Some(true),
        ..Default::default()
    });
    for r in h.harnesses.iter_mut() {
        r.train = Some(crate::records::HarnessStepMetrics {
            logprob_pearson: Some(if r.harness == "few" { 0.9 } else { 0.999 }),
            ..Default::default()
        });
    }
    let p = gate(&judge(&h, &GateConfig::default()), "logprob_pearson").clone();
    assert_eq!((p.value, p.passed), (Some(0.9), false), "{p:?}");
}

/// A figure that is not finite fails its gate in either direction: a NaN Pearson (computed from a
/// NaN log-prob) is not "not measured", and a −∞ KL is not under its bound.
#[test]
fn a_non_finite_figure_fails_its_gate() {
    for (pearson, kl) in [(f64::NAN, 0.0), (0.999, f64::NEG_INFINITY), (0.999, f64::NAN)] {
        let mut h = Health::default();
        h.metrics.push(StepMetrics {
            step: 1,
            logprob_pearson: Some(pearson),
            logprob_kl: Some(kl),
            routing_replay: Some(true),
            ..Default::default()
        });
        let g = judge(&h, &GateConfig::default());
        let (p, k) = (gate(&g, "logprob_pearson"), gate(&g, "logprob_kl"));
        assert_eq!(
            (p.passed, k.passed),
            (pearson.is_finite(), kl.is_finite()),
            "{p:?} {k:?}"
        );
    }
}

/// The behaviour-policy gates' default thresholds, as the README states them: the value at the
/// threshold passes, one past it fails.
#[test]
fn behaviour_policy_gates_hold_their_documented_thresholds() {
    let at = |f: &dyn Fn(&mut StepMetrics)| {
        let mut m = StepMetrics {
            step: 1,
            routing_replay: Some(true),
            ..Default::default()
        };
        f(&mut m);
        let mut h = Health::default();
        h.metrics.push(m);
        judge(&h, &GateConfig::default())
    };
    type Case = (&'static str, fn(&mut StepMetrics), fn(&mut StepMetrics));
    let cases: [Case; 5] = [
        (
            "logprob_kl",
            |m| m.logprob_kl = Some(0.01),
            |m| m.logprob_kl = Some(0.011),
        ),
        (
            "logprob_pearson",
            |m| m.logprob_pearson = Some(0.99),
            |m| m.logprob_pearson = Some(0.989),
        ),
        (
            "is_masked_token_fraction",
            |m| m.is_masked_token_fraction = Some(0.2),
            |m| m.is_masked_token_fraction = Some(0.21),
        ),
        (
            "staleness_max",
            |m| m.staleness_max = Some(2),
            |m| m.staleness_max = Some(3),
        ),
        (
            "unreplayed_token_fraction",
            |m| m.unreplayed_token_fraction = Some(0.0),
            |m| m.unreplayed_token_fraction = Some(0.01),
        ),
    ];
    for (name, pass, fail) in cases {
        assert!(gate(&at(&pass), name).passed, "{name} at its threshold");
        assert!(!gate(&at(&fail), name).passed, "{name} past its threshold");
    }
}
