//! `validate` on synthetic runs: gates passing and failing (exit 0/1), corrupted inputs (exit 2
//! naming file and record), the appended validation report, held-out eval and comparison.

use std::io::Write;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::ValidationReport;
use serde_json::Value;

use crate::common::lego;
use crate::synth::{write_run, Synth};

fn gate<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["report"]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("gate {name} in {v}"))
}

/// `validate --no-report --json DIR` (plus `extra`): its exit code and its JSON.
fn validate_json(dir: &std::path::Path, extra: &[&str]) -> (Option<i32>, Value) {
    let out = lego()
        .args(["validate", "--no-report", "--json"])
        .args(extra)
        .arg(dir)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out.status.code(), v)
}

#[test]
fn healthy_run_passes_and_appends_a_report() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &Synth::default());
    let out = lego().arg("validate").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("38 gate(s), 0 failed"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("logprob_pearson") && l.contains("0.9970") && l.contains("ok")),
        "{text}"
    );
    // Twice: the report file grows by one record per run.
    let out = lego()
        .args(["validate", "--json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        gate(&v, "zero_variance_group_fraction")["value"],
        0.25,
        "task 0 always fails: 1 of 4 groups"
    );
    assert_eq!(
        gate(&v, "align_drop_rate")["value"].as_f64().unwrap(),
        1.0 / 101.0
    );
    assert_eq!(v["health"]["samples"], 48);
    let reports: Vec<ValidationReport> =
        read_all(&dir.path().join("validation.jsonl.zst"), ReadOptions::default()).unwrap();
    assert_eq!(reports.len(), 2);
    assert!(reports[1].passed);
    assert_eq!(reports[1].step, Some(2));
    assert_eq!(reports[1].checks["trajectories"], 48);
}

#[test]
fn any_grader_tampering_fails_its_gate() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            tamper_every: 16,
            ..Default::default()
        },
    );
    let (code, v) = validate_json(dir.path(), &[]);
    assert_eq!(code, Some(1), "{v}");
    let g = gate(&v, "grader_tampering_rate");
    // One of the run's 16 (step 2), one of openhands' 8: the value is the worst failing scope's.
    assert_eq!(g["value"], 1.0 / 8.0, "{g}");
    assert_eq!(
        g["detail"],
        "failing step 2: 0.0625, harness openhands step 2: 0.1250 (worst)"
    );
    assert_eq!(g["passed"], false);
    assert_eq!(v["health"]["steps"]["2"]["audit"]["grader_tampering"], 1);
    assert_eq!(v["health"]["steps"]["2"]["audit"]["shadowing"], 1);
    // Without it, the same run passes that gate.
    let clean = tempfile::tempdir().unwrap();
    write_run(clean.path(), &Synth::default());
    let (_, v) = validate_json(clean.path(), &[]);
    assert_eq!(gate(&v, "grader_tampering_rate")["passed"], true, "{v}");
}

#[test]
fn a_rewarded_trajectory_with_a_hack_signal_fails_suspected_hack_rate() {
    let dir = tempfile::tempdir().unwrap();
    let s = Synth {
        hack_every: 3,
        ..Default::default()
    };
    write_run(dir.path(), &s);
    let (code, v) = validate_json(dir.path(), &[]);
    assert_eq!(code, Some(1), "{v}");
    let step = &v["health"]["steps"]["2"]["audit"];
    // Signals on trajectories 0, 3, ..., 15 of step 2; only the rewarded ones are suspected.
    let rewarded: u64 = (0..16)
        .filter(|i| i % 3 == 0)
        .filter(|i| {
            let t = crate::synth::trajectory(&s, 2, i / 4, (i % 4) as u32, *i);
            t.reward.is_some_and(|r| r > 0.0)
        })
        .count() as u64;
    assert_eq!(step["hack_skip"], 6, "{step}");
    assert!(rewarded > 0 && rewarded < 6, "{rewarded}");
    assert_eq!(step["suspected_hack"], rewarded, "{step}");
    let g = gate(&v, "suspected_hack_rate");
    assert_eq!(g["passed"], false, "{g}");
    // The report's advisory of the same name fires on the step (and no audit:suspected_hack).
    let out = dir.path().join("report");
    let r = lego()
        .arg("report")
        .arg(dir.path())
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{r:?}");
    let adv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("advisories.json")).unwrap()).unwrap();
    let names: Vec<&str> = adv["advisories"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["step"] == 2)
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"suspected_hack_rate"), "{names:?}");
    assert!(!names.contains(&"audit:suspected_hack"), "{names:?}");
    // Without signals the same run passes it.
    let clean = tempfile::tempdir().unwrap();
    write_run(clean.path(), &Synth::default());
    let (_, v) = validate_json(clean.path(), &[]);
    assert_eq!(gate(&v, "suspected_hack_rate")["passed"], true, "{v}");
    assert_eq!(gate(&v, "suspected_hack_rate")["value"], 0.0, "{v}");
}

#[test]
fn failing_gates_exit_1_and_can_be_configured() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            last_pearson: 0.95,
            git_every: 2,
            unreplayed: 0.25,
            kl: 0.42,
            ..Default::default()
        },
    );
    let (code, v) = validate_json(dir.path(), &[]);
    assert_eq!(code, Some(1), "{v}");
    // A behaviour policy the trainer does not recompute (tests/it/sampling.rs's 0.42 nats).
    assert_eq!(gate(&v, "logprob_kl")["value"], 0.42);
    assert_eq!(gate(&v, "logprob_kl")["passed"], false);
    // Tokens trained without recorded routing while replay was on: R3 did not hold for them.
    assert_eq!(gate(&v, "unreplayed_token_fraction")["value"], 0.25);
    assert_eq!(gate(&v, "unreplayed_token_fraction")["passed"], false);
    let p = gate(&v, "logprob_pearson");
    assert_eq!(p["value"], 0.95);
    assert_eq!(p["passed"], false);
    assert_eq!(p["detail"], "failing step 2: 0.9500");
    // Every even trajectory is openhands' (synth's mixed run): all of them read git history, so
    // the gate's value is openhands' (the worst failing scope), named in the detail.
    assert_eq!(gate(&v, "git_history_rate")["value"], 1.0);
    assert_eq!(gate(&v, "git_history_rate")["passed"], false);
    assert_eq!(
        gate(&v, "git_history_rate")["detail"],
        "failing step 2: 0.5000, harness openhands step 2: 1.0000 (worst)"
    );
    assert_eq!(v["health"]["steps"]["2"]["audit"]["git_history"], 8);
    assert!(
        !dir.path().join("validation.jsonl.zst").exists(),
        "--no-report writes nothing"
    );
    // Looser thresholds from flags and a gate file make it pass.
    let gates = dir.path().join("gates.toml");
    std::fs::write(
        &gates,
        "disable = [\"git_history_rate\", \"unreplayed_token_fraction\"]\n[thresholds]\nlogprob_pearson = 0.9\nlogprob_kl = 0.5\n",
    )
    .unwrap();
    let out = lego()
        .args(["validate", "--gates"])
        .arg(&gates)
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = lego()
        .args([
            "validate",
            "--gate",
            "logprob_pearson=0.9",
            "--gate",
            "git_history_rate=1.0",
            "--gate",
            "unreplayed_token_fraction=0.3",
            "--gate",
            "logprob_kl=0.5",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: Vec<ValidationReport> =
        read_all(&dir.path().join("validation.jsonl.zst"), ReadOptions::default()).unwrap();
    assert_eq!(report.len(), 2);
    // The shipped example gate file parses.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gates.toml");
    let out = lego()
        .args(["validate", "--no-report", "--gates", example])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // An unknown gate name is an error (2).
    let out = lego()
        .args(["validate", "--gate", "nope=1"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown gate `nope`"));
}

#[test]
fn all_steps_catches_an_earlier_bad_step() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            infra_every: 3,
            ..Default::default()
        },
    );
    // 6 of 16 trajectories per step fail for infra reasons: 0.375.
    let (code, v) = validate_json(dir.path(), &["--all-steps"]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(gate(&v, "infra_failure_rate")["value"], 0.375);
}

#[test]
fn cross_file_inconsistency_fails() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            orphan_sample: true,
            ..Default::default()
        },
    );
    let out = lego()
        .args(["validate", "--no-report"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("samples_without_trajectory") && text.contains("names missing trajectory ghost/0/0"),
        "{text}"
    );
}

#[test]
fn corrupted_inputs_exit_2_naming_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &Synth::default());
    // A plain-JSONL trajectory file whose second record lacks required fields.
    let bad = dir.path().join("trajectories/step-000003.jsonl");
    let good = serde_json::to_string(&crate::synth::trajectory(&Synth::default(), 3, 0, 0, 0)).unwrap();
    let mut f = std::fs::File::create(&bad).unwrap();
    writeln!(f, "{good}\n{{\"schema\":\"lego-rl/trajectory/v1\",\"id\":\"x\"}}").unwrap();
    drop(f);
    let out = lego().arg("validate").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("step-000003.jsonl: record 2:"), "{err}");
    assert!(
        !dir.path().join("validation.jsonl.zst").exists(),
        "no report after an error"
    );
    // A truncated zstd metrics file.
    std::fs::remove_file(&bad).unwrap();
    let m = dir.path().join("metrics.jsonl.zst");
    let bytes = std::fs::read(&m).unwrap();
    std::fs::write(&m, &bytes[..bytes.len() - 4]).unwrap();
    let out = lego().arg("validate").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("metrics.jsonl.zst"), "{err}");
    // Not a run directory at all.
    let empty = tempfile::tempdir().unwrap();
    let out = lego().arg("validate").arg(empty.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
}

#[test]
fn explicit_files_with_health() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            last_pearson: 0.5,
            ..Default::default()
        },
    );
    let t = dir.path().join("trajectories/step-000002.jsonl.zst");
    let m = dir.path().join("metrics.jsonl.zst");
    // Without --health: record checks only (all good, exit 0).
    let out = lego().arg("validate").arg(&t).arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("trajectory:16"));
    // With --health: gates judge them (the Pearson gate fails).
    let out = lego()
        .args(["validate", "--health", "--json"])
        .arg(&t)
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gate(&v, "logprob_pearson")["value"], 0.5);
}

#[test]
fn held_out_eval_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &Synth::default());
    let a = dir.path().join("trajectories/step-000000.jsonl.zst");
    let b = dir.path().join("trajectories/step-000001.jsonl.zst");
    let out = lego()
        .args(["validate", "--json", "--eval"])
        .arg(&a)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["eval"]["score"]["overall"];
    // Step 0: task 0 never passes; task t passes sample i iff (i + t) % 3 != 0.
    let expect: f64 = (1..4)
        .map(|t| (0..4).filter(|i| (i + t) % 3 != 0).count() as f64 / 4.0)
        .sum::<f64>()
        / 4.0;
    assert_eq!(s["pass_at_1"].as_f64().unwrap(), expect);
    assert_eq!(s["tasks"], 4);
    assert!(s["pass_at_k"]["4"].as_f64().unwrap() == 0.75, "{s}");
    let ci = s["ci95"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= expect && ci[1].as_f64().unwrap() >= expect);
    assert_eq!(v["eval"]["score"]["per_harness"]["claude-code"]["samples"], 8);
    assert_eq!(v["eval"]["score"]["per_repo"]["owner/repo0"]["tasks"], 2);
    let out = lego()
        .args(["validate", "--compare"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("compare: 4 common task(s)"), "{text}");
}

/// A policy collapse that every pipeline gate misses (examples/learn, run 8): the held-out
/// reward falls from the first evaluation under eval/ to the latest, and validate fails on it.
#[test]
fn heldout_reward_collapse_fails_the_run() {
    use lego_rl::io::AtomicWriter;
    use lego_rl::records::Trajectory;
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &Synth::default());
    let eval = |version: u64, solved: usize| -> Vec<Trajectory> {
        (0..40)
            .map(|i| {
                let mut t = crate::synth::trajectory(&Synth::default(), version, i % 8, (i / 8) as u32, i);
                t.reward = Some(f64::from(u8::from(i < solved)));
                t
            })
            .collect()
    };
    std::fs::create_dir_all(dir.path().join("eval")).unwrap();
    for (version, solved) in [(0, 16), (1, 13), (2, 2)] {
        let mut w =
            AtomicWriter::create(&dir.path().join(format!("eval/step-{version:06}.jsonl.zst"))).unwrap();
        w.write_all(&eval(version, solved)).unwrap();
        w.finish().unwrap();
    }
    let (code, v) = validate_json(dir.path(), &[]);
    assert_eq!(code, Some(1), "{v}");
    let g = gate(&v, "heldout_reward_drop");
    assert_eq!(g["passed"], false, "{g}");
    assert_eq!(g["detail"], "eval 0: 0.400 (n=40) -> eval 2: 0.050 (n=40)");
    let (a, b): (f64, f64) = (0.4, 0.05);
    let want = (a - b) - 1.96 * (a * (1.0 - a) / 40.0 + b * (1.0 - b) / 40.0).sqrt();
    assert!((g["value"].as_f64().unwrap() - want).abs() < 1e-9, "{g}");
    // Every other gate passes: only the reward shows the collapse.
    let failed: Vec<&str> = v["report"]["gates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["passed"] == false)
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["heldout_reward_drop"]);
    // Too few train steps (3 < 2 windows of 5) for the train-reward gate.
    assert_eq!(gate(&v, "train_reward_drop")["detail"], "not measured");
    let out = lego()
        .args(["validate", "--no-report", "--gate", "heldout_reward_drop=off"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Dynamic sampling's marks (synth: every group marked, task 0's never informative, the last
/// task's group extra 0 of a budget of 1, N = 4): validate's table per step, the
/// `informative_group_fraction` gate, and the warning for a budget spent short of N.
#[test]
fn dynamic_sampling_figures_gate_and_budget_warning() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            dynamic: Some((4, 1)),
            ..Default::default()
        },
    );
    let out = lego()
        .args(["validate", "--no-report"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text.lines().position(|l| l.contains("INFORMATIVE")).expect(&text);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(header + 1)
        .take(3)
        .map(|l| l.split_whitespace().collect())
        .collect();
    // STEP SAMPLED INFORMATIVE EXTRA POOL WANTED
    assert_eq!(rows[2], ["2", "4", "3", "1/1", "4", "4"], "{text}");
    assert!(
        text.contains("warning: step 2: the extra-group budget (1) ran out with 3 of 4 informative groups"),
        "{text}"
    );
    let (code, v) = validate_json(dir.path(), &[]);
    assert_eq!(code, Some(0));
    let g = gate(&v, "informative_group_fraction");
    assert_eq!(
        (g["value"].as_f64(), g["passed"].as_bool()),
        (Some(0.75), Some(true)),
        "{g}"
    );
    assert_eq!(v["health"]["dynamic"]["1"]["extra_groups"], 1);
    let check = &v["report"]["checks"]["dynamic_sampling"];
    assert_eq!(check["informative_groups"], 3, "{check}");
    assert!(check["warning"]
        .as_str()
        .unwrap()
        .starts_with("step 2: the extra-group budget"));
    // A stricter threshold fails, naming the step.
    let (code, v) = validate_json(dir.path(), &["--gate", "informative_group_fraction=0.8"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        gate(&v, "informative_group_fraction")["detail"],
        "failing step 2: 0.7500"
    );
    // A run without marks has neither the table nor a measure.
    let plain = tempfile::tempdir().unwrap();
    write_run(plain.path(), &Synth::default());
    let (_, v) = validate_json(plain.path(), &[]);
    assert_eq!(gate(&v, "informative_group_fraction")["detail"], "not measured");
    assert!(v["report"]["checks"].get("dynamic_sampling").is_none());
}

/// Per-harness gates on a mixed run (synth: even samples on openhands, odd on claude-code): two
/// openhands infra failures make 2 of 16 trajectories (0.125, within 0.15) but 2 of openhands' 8
/// (0.25): the gate fails with openhands' value and names the harness.
#[test]
fn a_gate_fails_for_one_harness_of_a_mixed_run_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        &Synth {
            infra_every: 8,
            ..Default::default()
        },
    );
    let (code, v) = validate_json(dir.path(), &["--gate", "infra_failure_rate=0.15"]);
    assert_eq!(code, Some(1), "{v}");
    let g = gate(&v, "infra_failure_rate");
    assert_eq!(
        g["value"], 0.25,
        "the failing harness's value, not the run's 0.125"
    );
    assert_eq!(g["passed"], false);
    assert_eq!(
        g["detail"],
        "failing harness openhands step 2: 0.2500; run-wide step 2: 0.1250"
    );
    let (code, v) = validate_json(dir.path(), &["--gate", "infra_failure_rate=0.3"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(gate(&v, "infra_failure_rate")["detail"], "worst at step 2");
}
