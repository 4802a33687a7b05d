//! The whole loop on the tiny model: `scripts/loop.sh` for 2 steps (real Docker, the real
//! mini-swe-agent harness, the embedded engine with scripted continuations), asserting every stage's
//! output; and the Slurm examples run through a fake `sbatch` that executes the jobs locally.

use std::path::{Path, PathBuf};
use std::process::Command;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{AlignStats, Sample, StepMetrics, Task, Trajectory, ValidationReport};

use crate::common::{docker_available, lego, root};

fn read<T: lego_rl::records::Record>(p: &Path) -> Vec<T> {
    read_all(p, ReadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Tasks with absolute paths (filter-tasks output) restricted to those with scripted continuations,
/// plus the images and the harness runtime: what loop.sh needs.
fn prepare(run: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let forced = root().join("testdata/rollout/inflection.json");
    let kept = run.join("tasks.kept.jsonl.zst");
    lego()
        .args(["filter-tasks", "-i"])
        .arg(root().join("testdata/tasks/tasks.jsonl"))
        .arg("-o")
        .arg(&kept)
        .assert()
        .success();
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&forced).expect("forced file")).expect("json");
    let ids = ids["tasks"].as_object().expect("tasks").clone();
    let tasks: Vec<Task> = read::<Task>(&kept)
        .into_iter()
        .filter(|t| ids.contains_key(&t.id))
        .collect();
    assert!(!tasks.is_empty(), "no kept task has a forced script");
    let train = run.join("tasks.train.jsonl");
    let text: String = tasks
        .iter()
        .map(|t| serde_json::to_string(t).expect("json") + "\n")
        .collect();
    std::fs::write(&train, text).expect("write tasks");
    let images = run.join("images.jsonl.zst");
    lego()
        .args(["build-images", "-i"])
        .arg(&train)
        .arg("-o")
        .arg(&images)
        .arg("--harness")
        .arg(root().join("examples/harnesses/mini-swe-agent.toml"))
        .assert()
        .success();
    (train, images, forced)
}

#[test]
fn two_steps_of_the_loop_on_the_tiny_model() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("mkdir");
    let (tasks, images, forced) = prepare(&run);
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let out = Command::new(root().join("scripts/loop.sh"))
        .env("LEGO_RL_BIN", &bin)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .args(["--run"])
        .arg(&run)
        .arg("--tasks")
        .arg(&tasks)
        .arg("--images")
        .arg(&images)
        .arg("--checkpoint")
        .arg(crate::model::tiny_moe())
        .args(["--steps", "2", "--group-size", "4", "--concurrency", "2"])
        .arg("--rollout-args")
        .arg(format!("--forced {} --max-turns 6", forced.display()))
        .output()
        .expect("loop.sh runs");
    let log = std::fs::read_to_string(run.join("logs/rollout.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "loop.sh failed:\n{}\nrollout log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in 0..2 {
        let name = format!("step-{step:06}");
        let trajs: Vec<Trajectory> = read(&run.join(format!("trajectories/{name}.jsonl.zst")));
        assert_eq!(trajs.len(), 4, "one group of 4 per step");
        assert!(trajs.iter().all(|t| t.schema == "lego-rl/trajectory/v1"));
        assert!(
            trajs.iter().all(|t| !t.infra_failure && t.reward.is_some()),
            "every trial graded: {:?}",
            trajs
                .iter()
                .map(|t| (&t.termination, t.reward))
                .collect::<Vec<_>>()
        );
        // The prefix cache (on by default) served the group's shared first prompt and each
        // trial's earlier turns; the Pearson bound below holds for the captures it gave.
        let (prompt, cached) = trajs.iter().fold((0, 0), |(p, c), t| {
            let m = &t.metadata["prefix_cache"];
            (
                p + m["prompt_tokens"].as_u64().expect("metadata.prefix_cache"),
                c + m["cached_tokens"].as_u64().expect("metadata.prefix_cache"),
            )
        });
        assert!(
            cached * 2 > prompt,
            "{cached} of {prompt} prompt tokens from the cache"
        );
        let rewards: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        assert!(
            rewards.contains(&1.0) && rewards.contains(&0.0),
            "the scripted group has mixed rewards: {rewards:?}"
        );
        let samples: Vec<Sample> = read(&run.join(format!("samples/{name}.jsonl.zst")));
        assert!(!samples.is_empty());
        // loop.sh runs align without --model: it decoded every capture with the tokenizer the
        // trajectories name, so the statistics the gates read are exact.
        let stats: Vec<AlignStats> = read(&run.join(format!("align-stats/{name}.jsonl.zst")));
        let total = stats.last().expect("align-stats total");
        assert!(total.trajectory_id.is_none() && total.trajectories == 4);
        assert_eq!(total.without_tokenizer, 0, "{total:?}");
        for s in &samples {
            assert_eq!(s.loss_mask.len(), s.token_ids.len(), "{}", s.id);
            assert!(s.loss_mask.count_ones() > 0, "{}", s.id);
        }
        assert!(run
            .join(format!("checkpoints/step-{:06}/config.json", step + 1))
            .is_file());
    }
    let metrics: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let r = m.logprob_pearson.expect("rollout/trainer log-prob correlation");
        assert!(r >= 0.99, "log-prob Pearson {r} < 0.99 with routing replay");
        assert!(m.loss.is_finite());
    }
    let reports: Vec<ValidationReport> = read(&run.join("validation.jsonl.zst"));
    assert!(reports.iter().all(|r| r.passed), "gates passed");
    // The new checkpoint loads (the embedded engine reads it back).
    lego_rl::model::Model::load(&run.join("checkpoints/step-000002"), tch::Device::Cpu, None)
        .expect("the trained checkpoint loads");
    let html = std::fs::read_to_string(run.join("report/index.html")).expect("report");
    assert!(
        html.contains("inflection__ordinal-teens"),
        "report lists the task"
    );
}

#[test]
fn slurm_examples_run_through_a_fake_sbatch() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("checkpoints")).expect("mkdir");
    let (tasks, images, forced) = prepare(&run);
    let ckpt = run.join("checkpoints/step-000000");
    let st = Command::new("cp")
        .arg("-r")
        .arg(crate::model::tiny_moe())
        .arg(&ckpt)
        .status()
        .expect("cp");
    assert!(st.success());
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let shim = root().join("tests/slurm-shim");
    let state = dir.path().join("slurm");
    let path = format!("{}:{}", shim.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(root().join("examples/slurm/submit-step.sh"))
        .arg("0")
        .env("PATH", path)
        .env("SLURM_SHIM_STATE", &state)
        .env("LEGO_RL", &bin)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .env("RUN", &run)
        .env("TASKS", &tasks)
        .env("IMAGES", &images)
        .env("SHARDS", "2")
        .env("GROUP_SIZE", "2")
        .env("TRAIN_DEVICE", "cpu")
        .env("LEGO_RL_BACKEND", format!("embedded:{}", ckpt.display()))
        .env(
            "ROLLOUT_ARGS",
            format!("--forced {} --max-turns 6", forced.display()),
        )
        .output()
        .expect("submit-step.sh runs");
    let logs: String = std::fs::read_dir(&state)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "out"))
                .map(|e| {
                    format!(
                        "== {}\n{}",
                        e.path().display(),
                        std::fs::read_to_string(e.path()).unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        out.status.success(),
        "submit-step.sh failed: {}\n{logs}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rollout array"), "{stdout}");
    // Every job succeeded (the shim records exit statuses).
    for e in std::fs::read_dir(&state).expect("state").flatten() {
        if e.path().extension().is_some_and(|x| x == "status") {
            let s = std::fs::read_to_string(e.path()).expect("status");
            assert_eq!(s.trim(), "0", "{}: job failed\n{logs}", e.path().display());
        }
    }
    // The shards together cover the batch exactly once: one group of 2.
    let mut trajs: Vec<Trajectory> = Vec::new();
    for shard in 0..2 {
        let p = run.join(format!("trajectories/step-000000/shard-{shard}.jsonl.zst"));
        if p.exists() {
            trajs.extend(read::<Trajectory>(&p));
        }
    }
    assert_eq!(trajs.len(), 2, "{logs}");
    let samples: Vec<Sample> = read(&run.join("samples/step-000000.jsonl.zst"));
    assert!(!samples.is_empty());
    assert!(
        run.join("checkpoints/step-000001/config.json").is_file(),
        "{logs}"
    );
    let metrics: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    assert_eq!(metrics.len(), 1);
}
