//! Several harnesses in one run, through the real pipeline: one rollout of one group of 2 on the
//! shared inflection fixture with `--harness-mix sample`, so sample 0 runs the real mini-swe-agent
//! and sample 1 the real OpenHands SDK in Docker sandboxes against the embedded tiny MoE (the
//! long-context view the harness tests use), each driven by its own forced script: mini-swe-agent
//! the wrong edit (reward 0), OpenHands the fix (reward 1). Then align, one GSPO train-step with
//! routing replay, validate and report on the run directory, each asserted to split its figures
//! by harness.

use std::path::Path;

use std::time::Instant;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{AlignStats, Sample, StepMetrics, Trajectory};
use serde_json::{json, Value};

use crate::common::{docker_available, lego, root};
use crate::harnesses::long_context_moe;
use crate::rollout::{chat_dir, fixture, leftovers, read, TASK};

const MINI: &str = "mini-swe-agent";
const OPENHANDS: &str = "openhands-sdk";

fn run_ok(c: &mut assert_cmd::Command, what: &str) -> std::process::Output {
    let started = Instant::now();
    let o = c.output().unwrap();
    eprintln!("{what}: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        o.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// mini-swe-agent's forced script: the wrong edit of testdata/rollout/inflection.json (script 1).
fn wrong_edit_for_mini(dir: &Path) -> std::path::PathBuf {
    let f: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/rollout/inflection.json")).unwrap(),
    )
    .unwrap();
    let p = dir.join("forced-mini.json");
    let doc = json!({"schema": "lego-rl/forced/v1", "tasks": {TASK: [f["tasks"][TASK][1].clone()]}});
    std::fs::write(&p, doc.to_string()).unwrap();
    p
}

#[test]
fn a_group_split_across_mini_swe_agent_and_openhands_trains_in_one_step_with_figures_by_harness() {
    if !docker_available() {
        return;
    }
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    for d in ["trajectories", "samples", "align-stats"] {
        std::fs::create_dir_all(run.join(d)).unwrap();
    }
    let traj = run.join("trajectories/step-000000.jsonl.zst");
    let run_id = format!("it-mixed-{}", std::process::id());
    let harness = |h: &str| root().join(format!("examples/harnesses/{h}.toml"));
    let mut rollout = lego();
    rollout
        .args(["rollout", "-i"])
        .arg(&fx.tasks)
        .arg("--images")
        .arg(&fx.images)
        .arg("--harness")
        .arg(harness(MINI))
        .arg("--harness")
        .arg(harness(OPENHANDS))
        .args(["--harness-mix", "sample"])
        .arg("--forced")
        .arg(wrong_edit_for_mini(tmp.path()))
        .arg("--forced")
        .arg(root().join("testdata/rollout/inflection-openhands-sdk.json"))
        .arg("--backend")
        .arg(format!("embedded:{}", long_context_moe().display()))
        .arg("--chat-model")
        .arg(chat_dir())
        .args([
            "--max-turns",
            "10",
            "--group-size",
            "2",
            "-j",
            "2",
            "--run-id",
            &run_id,
            "-o",
        ])
        .arg(&traj);
    run_ok(&mut rollout, "rollout of one group on two harnesses");
    assert_eq!(leftovers(&run_id), "", "sandboxes left behind");

    // Sample i ran on harness i mod 2, and each trajectory records the harness that ran it:
    // the forced scripts (one per harness) decided the rewards.
    let mut trajs: Vec<Trajectory> = read(&traj);
    trajs.sort_by_key(|t| t.sample_index);
    let got: Vec<(u32, &str, u64, Option<f64>)> = trajs
        .iter()
        .map(|t| (t.sample_index, t.harness.as_str(), t.group_id, t.reward))
        .collect();
    assert_eq!(
        got,
        [(0, MINI, 0, Some(0.0)), (1, OPENHANDS, 0, Some(1.0))],
        "{trajs:#?}"
    );
    assert_eq!(trajs[1].generations[0].api, "openai");
    assert!(
        trajs[1].generations[0].request["tools"]
            .to_string()
            .contains("\"terminal\""),
        "the OpenHands SDK's own tools"
    );
    assert_eq!(
        trajs[0].metadata["agent_exit_status"], "Submitted",
        "{:?}",
        trajs[0].metadata
    );
    assert_eq!(
        trajs[1].metadata["agent_exit_status"], "finished",
        "{:?}",
        trajs[1].metadata
    );

    // align: the stats name each trajectory's harness and the total splits by it; samples carry it.
    let samples_path = run.join("samples/step-000000.jsonl.zst");
    let stats_path = run.join("align-stats/step-000000.jsonl.zst");
    let mut align = lego();
    align
        .args(["align", "-i"])
        .arg(&traj)
        .arg("-o")
        .arg(&samples_path)
        .arg("--stats")
        .arg(&stats_path)
        .arg("--model")
        .arg(chat_dir());
    run_ok(&mut align, "align");
    let stats: Vec<AlignStats> = read_all(&stats_path, ReadOptions::default()).unwrap();
    let total = stats.iter().find(|s| s.trajectory_id.is_none()).unwrap();
    assert_eq!(total.by_harness.len(), 2, "{total:?}");
    for h in [MINI, OPENHANDS] {
        let b = &total.by_harness[h];
        let own = stats.iter().find(|s| s.harness.as_deref() == Some(h)).unwrap();
        assert_eq!((b.trajectories, b.dropped_turns), (1, 0), "{h}: {b:?}");
        assert_eq!(
            (b.samples, b.policy_tokens),
            (own.samples, own.policy_tokens),
            "{h}"
        );
        assert!(b.policy_tokens > 0, "{h}");
    }
    assert_eq!(
        total.by_harness.values().map(|b| b.policy_tokens).sum::<u64>(),
        total.policy_tokens
    );
    let samples: Vec<Sample> = read_all(&samples_path, ReadOptions::default()).unwrap();
    for s in &samples {
        let want = if s.sample_index == 0 { MINI } else { OPENHANDS };
        assert_eq!(s.metadata["harness"], want, "{}", s.id);
    }

    // One train-step on both harnesses' samples: one GSPO group (the mixed one), the advantage
    // taken within it, the figures split by harness.
    let metrics_path = run.join("metrics.jsonl.zst");
    let mut train = lego();
    train
        .args(["train-step", "-i"])
        .arg(&samples_path)
        .arg("--checkpoint")
        .arg(long_context_moe())
        .arg("--out")
        .arg(run.join("checkpoints/step-000001"))
        .arg("--metrics")
        .arg(&metrics_path);
    run_ok(&mut train, "train-step");
    let m: Vec<StepMetrics> = read_all(&metrics_path, ReadOptions::default()).unwrap();
    let m = &m[0];
    assert_eq!(m.groups, 1);
    assert_eq!(m.by_harness.len(), 2, "{m:?}");
    let (mini, oh) = (&m.by_harness[MINI], &m.by_harness[OPENHANDS]);
    assert_eq!((mini.trajectories, mini.reward_mean), (1, Some(0.0)), "{mini:?}");
    assert_eq!((oh.trajectories, oh.reward_mean), (1, Some(1.0)), "{oh:?}");
    assert_eq!(
        (mini.groups, mini.mixed_groups, oh.groups, oh.mixed_groups),
        (1, 1, 1, 1)
    );
    assert!(mini.advantage_mean.unwrap() < 0.0 && oh.advantage_mean.unwrap() > 0.0);
    assert_eq!(mini.policy_tokens + oh.policy_tokens, m.policy_tokens);
    assert_eq!(mini.samples + oh.samples, samples.len() as u64);
    for (h, x) in [(MINI, mini), (OPENHANDS, oh)] {
        // Routing replay: the trainer reproduces each harness's captured log-probs.
        let diff = x.logprob_max_abs_diff.unwrap();
        assert!(diff < 1e-4, "{h}: trainer vs rollout log-probs differ by {diff}");
        assert!(x.logprob_pearson.unwrap() > 0.999, "{h}: {x:?}");
    }
    eprintln!("train-step by harness: {:?}", m.by_harness);

    // validate: the per-harness table and the report's checks.by_harness.
    let mut validate = lego();
    validate.arg("validate").arg(&run).args(["--json", "--no-report"]);
    let o = validate.output().unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let by = &v["report"]["checks"]["by_harness"];
    assert_eq!(by[MINI]["reward_mean"], 0.0, "{by}");
    assert_eq!(by[OPENHANDS]["reward_mean"], 1.0, "{by}");
    assert_eq!(by[OPENHANDS]["terminations"]["finished"], 1, "{by}");
    assert_eq!(by[MINI]["align_drop_rate"], 0.0, "{by}");
    // validate's per-harness figures of the batch are train-step's for the step that trained it
    // (and align's), the same numbers: what both show agrees, so neither view can drift.
    for (h, x) in &m.by_harness {
        let b = &by[h.as_str()];
        let num = |k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{h} {k}: {b}"));
        assert_eq!(num("logprob_pearson"), x.logprob_pearson.unwrap(), "{h}: {b}");
        assert_eq!(num("reward_mean"), x.reward_mean.unwrap(), "{h}: {b}");
        assert_eq!(b["trajectories"], x.trajectories, "{h}: {b}");
        assert_eq!(b["mixed_groups"], x.mixed_groups, "{h}: {b}");
        assert_eq!(b["policy_tokens"], x.policy_tokens, "{h}: {b}");
        assert_eq!(
            num("infra_rate"),
            x.infra_failed_trajectories as f64 / x.trajectories as f64,
            "{h}: {b}"
        );
        let own = &total.by_harness[h];
        assert_eq!(b["dropped_turns"], own.dropped_turns, "{h}: {b}");
    }
    let o = lego()
        .arg("validate")
        .arg(&run)
        .arg("--no-report")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("HARNESS")
            && table
                .lines()
                .any(|l| l.contains(OPENHANDS) && l.contains("finished=1")),
        "{table}"
    );

    // report: harness_steps.csv, one row per harness, and the page's per-harness view.
    let out = tmp.path().join("report");
    let mut report = lego();
    report.arg("report").arg(&run).arg("-o").arg(&out);
    run_ok(&mut report, "report");
    let csv = std::fs::read_to_string(out.join("harness_steps.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| rows[0].iter().position(|c| *c == name).unwrap();
    let row = |h: &str| {
        rows.iter()
            .find(|r| r[col("harness")] == h)
            .unwrap_or_else(|| panic!("{csv}"))
    };
    assert_eq!(rows.len(), 3, "{csv}");
    assert_eq!(row(MINI)[col("reward_mean")], "0", "{csv}");
    assert_eq!(row(OPENHANDS)[col("reward_mean")], "1", "{csv}");
    assert_eq!(row(MINI)[col("mixed_groups")], "1", "{csv}");
    assert_eq!(row(OPENHANDS)[col("dropped_turns")], "0", "{csv}");
    // The same figures as train-step's metrics by harness and validate's checks.by_harness,
    // number for number (formatting aside).
    for (h, x) in &m.by_harness {
        let r = row(h);
        let cell = |c: &str| r[col(c)].to_string();
        let num = |c: &str| {
            cell(c)
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{h} {c}: {e}: {csv}"))
        };
        let b = &by[h.as_str()];
        assert_eq!(num("logprob_pearson"), x.logprob_pearson.unwrap(), "{h}: {csv}");
        assert_eq!(
            num("logprob_pearson"),
            b["logprob_pearson"].as_f64().unwrap(),
            "{h}"
        );
        assert_eq!(
            num("logprob_max_abs_diff"),
            x.logprob_max_abs_diff.unwrap(),
            "{h}"
        );
        assert_eq!(num("trained_reward_mean"), x.reward_mean.unwrap(), "{h}");
        assert_eq!(num("reward_mean"), b["reward_mean"].as_f64().unwrap(), "{h}");
        assert_eq!(cell("trained_samples"), x.samples.to_string(), "{h}");
        assert_eq!(cell("trajectories"), x.trajectories.to_string(), "{h}");
        assert_eq!(cell("groups"), x.groups.to_string(), "{h}");
        assert_eq!(cell("mixed_groups"), x.mixed_groups.to_string(), "{h}");
        assert_eq!(cell("policy_tokens"), x.policy_tokens.to_string(), "{h}");
        assert_eq!(
            cell("infra_failures"),
            x.infra_failed_trajectories.to_string(),
            "{h}"
        );
        assert_eq!(cell("dropped_turns"), b["dropped_turns"].to_string(), "{h}");
        assert_eq!(
            num("align_drop_rate"),
            b["align_drop_rate"].as_f64().unwrap(),
            "{h}"
        );
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(
        html.contains("\"harness_steps\"") && html.contains(OPENHANDS),
        "page data"
    );
}
