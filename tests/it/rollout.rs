//! `lego-rl rollout` end to end: real Docker sandboxes, the real mini-swe-agent from PyPI (in the
//! read-only runtime volume), the embedded tiny Qwen3-MoE behind the proxy, driven through
//! multi-turn episodes by forced scripted continuations (testdata/rollout/inflection.json: sample
//! 2k inspects, fixes, tests and submits; sample 2k+1 makes a wrong edit and submits). Fails
//! loudly when Docker is missing and `CI` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lego_rl::chat::ChatFormat;
use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{Task, Termination, Trajectory};
use serde_json::Value;

use crate::common::{docker_available, lego, root};

pub(crate) const TASK: &str = "inflection__ordinal-teens";

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI runs")
}

/// The task file (the inflection task only, paths made absolute) and its image manifest, built
/// once per test binary through the CLI.
pub(crate) struct Fixture {
    pub(crate) tasks: PathBuf,
    pub(crate) images: PathBuf,
}

pub(crate) fn fixture() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| {
        let have_base = docker(&["image", "inspect", "lego-rl/base:trixie"])
            .status
            .success();
        if !have_base {
            let st = Command::new(root().join("scripts/bootstrap-base-image.sh"))
                .status()
                .expect("bootstrap script runs");
            assert!(st.success(), "bootstrap-base-image.sh failed");
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rollout-fixture");
        std::fs::create_dir_all(&dir).unwrap();
        let all: Vec<Task> =
            read_all(&root().join("testdata/tasks/tasks.jsonl"), ReadOptions::default()).unwrap();
        let mut task = all.into_iter().find(|t| t.id == TASK).expect("inflection task");
        task.absolutize_paths(&root().join("testdata/tasks"));
        let tasks = dir.join("tasks.jsonl");
        std::fs::write(&tasks, serde_json::to_string(&task).unwrap() + "\n").unwrap();
        let images = dir.join("images.jsonl.zst");
        let out = lego()
            .args(["build-images", "-i"])
            .arg(&tasks)
            .arg("-o")
            .arg(&images)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "build-images: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Fixture { tasks, images }
    })
}

fn tiny_moe() -> PathBuf {
    crate::model::tiny_moe()
}

pub(crate) fn chat_dir() -> PathBuf {
    root().join("testdata/tokenizer/qwen3")
}

fn forced() -> PathBuf {
    root().join("testdata/rollout/inflection.json")
}

/// `lego-rl rollout` on the fixture with mini-swe-agent and the forced scripts.
fn rollout_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let backend = format!("embedded:{}", tiny_moe().display());
    rollout_args_on(&backend, &chat_dir(), out, extra)
}

/// [`rollout_args`] on another backend and chat model directory.
pub(crate) fn rollout_args_on(backend: &str, chat: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let fx = fixture();
    let mut a: Vec<String> = vec![
        "rollout".into(),
        "-i".into(),
        fx.tasks.display().to_string(),
        "--images".into(),
        fx.images.display().to_string(),
        "--harness".into(),
        root()
            .join("examples/harnesses/mini-swe-agent.toml")
            .display()
            .to_string(),
        "--backend".into(),
        backend.into(),
        "--chat-model".into(),
        chat.display().to_string(),
        "--forced".into(),
        forced().display().to_string(),
        "--max-turns".into(),
        "8".into(),
        "-o".into(),
        out.display().to_string(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub(crate) fn read(out: &Path) -> Vec<Trajectory> {
    read_all(
        out,
        ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap()
}

pub(crate) fn leftovers(run_id: &str) -> String {
    let o = docker(&["ps", "-aq", "--filter", &format!("label=lego-rl.run-id={run_id}")]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Waits until run `run_id` has a sandbox, while `child` (its rollout) still runs: the moment a
/// test interrupts or kills it. Panics with `never` after `limit`.
pub(crate) fn wait_for_a_sandbox(
    child: &mut std::process::Child,
    run_id: &str,
    limit: Duration,
    never: &str,
) {
    let deadline = Instant::now() + limit;
    while leftovers(run_id).is_empty() {
        assert!(Instant::now() < deadline, "{never}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "rollout ended before it had a sandbox"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The tool results the harness sent back (OpenAI `tool` messages) in a generation's request.
fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| {
                    m["content"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| m["content"].to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn forced_scripts() -> Vec<Vec<String>> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(forced()).unwrap()).unwrap();
    serde_json::from_value(v["tasks"][TASK].clone()).unwrap()
}

/// Checks a successful (even) sample: the episode's outputs are the forced script token for
/// token, the commands really ran in the container, the fix was graded 1.
fn check_good(t: &Trajectory, chat: &ChatFormat) {
    assert_eq!(t.termination, Termination::Finished, "{t:#?}");
    // mini-swe-agent's own record of how it ended (its adapter's `[exit_status]`).
    assert_eq!(t.metadata["agent_exit_status"], "Submitted", "{:?}", t.metadata);
    assert!(!t.infra_failure);
    assert_eq!(t.reward, Some(1.0), "grader: {:?}", t.grader);
    let script = &forced_scripts()[0];
    assert_eq!(
        t.generations.len(),
        script.len(),
        "one model call per scripted turn"
    );
    let im_end = chat.special().im_end.unwrap();
    for (g, text) in t.generations.iter().zip(script) {
        assert_eq!(g.status.as_deref(), Some("ok"), "{g:?}");
        assert_eq!(g.thread, 0);
        let mut want = chat.encode(text).unwrap();
        want.push(im_end);
        assert_eq!(g.output_ids, want, "captured output is the forced continuation");
        assert_eq!(g.finish_reason, "tool_calls");
        assert_eq!(g.logprobs.to_f32().unwrap().len(), g.output_ids.len());
        assert!(g.routing.is_some(), "MoE routing captured");
        assert_eq!(g.policy_version, 0);
    }
    // The commands ran in the sandbox: the harness fed their real output back.
    let grep = tool_results(&t.generations[1].request).join("\n");
    assert!(
        grep.contains("number % 10 in (11, 12, 13)"),
        "grep output: {grep}"
    );
    let pytest = tool_results(&t.generations[3].request).join("\n");
    assert!(pytest.contains("passed"), "pytest output: {pytest}");
    assert!(!pytest.contains("failed"), "pytest output: {pytest}");
    let diff = t.diff.as_deref().expect("diff");
    assert!(diff.contains("+    if number % 100 in (11, 12, 13):"), "{diff}");
    let grader = t.grader.as_ref().expect("grader");
    assert_eq!(
        grader
            .tests
            .get("tests_lego/test_regression.py::test_teens_take_th")
            .map(String::as_str),
        Some("PASSED"),
        "{grader:?}"
    );
    for stage in ["setup", "agent", "extract", "evaluate", "cleanup"] {
        let s = t
            .stages
            .get(stage)
            .unwrap_or_else(|| panic!("stage {stage} in {:?}", t.stages));
        assert!(s.end >= s.start);
    }
    assert_eq!(t.stages["agent"].outcome, "ok");
}

#[test]
fn mini_swe_agent_episode_inspects_edits_tests_and_gets_reward_1() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    let run_id = format!("it-rollout-episode-{}", std::process::id());
    // A turn budget of exactly the script's 4 turns: the agent submits on its last allowed turn,
    // which its exit status tells apart from running out of turns.
    let mut args = rollout_args(&out, &["--group-size", "1", "--run-id", &run_id, "-v"]);
    let at = args.iter().position(|a| a == "--max-turns").unwrap();
    args[at + 1] = forced_scripts()[0].len().to_string();
    let o = lego().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rollout failed: {stderr}");
    assert!(
        stderr.contains(&format!("group {TASK}/0: 1 trials")),
        "group line at -v: {stderr}"
    );
    let trajs = read(&out);
    assert_eq!(trajs.len(), 1);
    let t = &trajs[0];
    assert_eq!(t.schema, "lego-rl/trajectory/v1");
    assert_eq!(t.id, format!("{TASK}/0/0"));
    assert_eq!((t.task_id.as_str(), t.group_id, t.sample_index), (TASK, 0, 0));
    assert_eq!(t.harness, "mini-swe-agent");
    assert!(t.backend.starts_with("embedded:"), "{}", t.backend);
    assert_eq!(t.policy_version, 0);
    assert_eq!(t.sampling.temperature, Some(1.0));
    assert_eq!(t.mode.as_deref(), Some("train"));
    assert_eq!(t.metadata["run_id"], run_id.as_str());
    let chat = ChatFormat::from_parts(
        &chat_dir().join("tokenizer.json"),
        &chat_dir().join("tokenizer_config.json"),
        None,
    )
    .unwrap();
    check_good(t, &chat);
    // mini-swe-agent's first request is the rendered system + task; later ones splice the
    // captured tokens (faithful prompts).
    assert!(t.generations[0].request["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("ordinalize(11)"));
    assert_eq!(leftovers(&run_id), "", "sandboxes left behind");
    // A rerun finds the key done and does nothing.
    let o = lego()
        .args(rollout_args(&out, &["--group-size", "1", "--run-id", &run_id]))
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(read(&out).len(), 1);
}

/// The harness's own temperature under pinned sampling: ignored and recorded in each generation's
/// `ignored_sampling`, counted in the trajectory's `metadata.sampling_overrides`, in rollout's
/// summary line and in the report's `steps.csv` (a run directory holding these trajectories as
/// its step 0).
fn sampling_overrides_are_counted(trajs: &[Trajectory], stderr: &str, tmp: &Path) {
    let mut total = 0;
    for t in trajs.iter().filter(|t| !t.generations.is_empty()) {
        assert_eq!(t.metadata["harness_sampling"], "pin", "{}", t.id);
        for g in &t.generations {
            assert_eq!(
                serde_json::to_value(&g.ignored_sampling).unwrap()["temperature"],
                serde_json::json!(0.3),
                "{}: {:?}",
                t.id,
                g.ignored_sampling
            );
            assert_ne!(g.sampling.temperature, Some(0.3), "rollout's own temperature served");
        }
        assert_eq!(
            t.metadata["sampling_overrides"],
            serde_json::json!(t.generations.len()),
            "{}",
            t.id
        );
        total += t.generations.len();
    }
    assert!(total > 0);
    assert!(
        stderr.contains(&format!(
            ", {total} generations without the request's own sampling (ignored_sampling)"
        )),
        "{stderr}"
    );
    let run = tmp.join("run");
    std::fs::create_dir_all(run.join("trajectories")).unwrap();
    let mut w = lego_rl::io::AtomicWriter::create(&run.join("trajectories/step-000000.jsonl.zst")).unwrap();
    for t in trajs {
        w.write(t).unwrap();
    }
    w.finish().unwrap();
    let o = lego().arg("report").arg(&run).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(run.join("report/steps.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "sampling_overrides").expect("column");
    let row: Vec<&str> = lines.next().expect("step 0").split(',').collect();
    assert_eq!(row[col], total.to_string(), "{csv}");
}

#[test]
fn group_of_8_has_mixed_rewards_and_an_injected_setup_failure_stays_alone() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    let run_id = format!("it-rollout-group-{}", std::process::id());
    // Infra fault: a container already holds sample 5's sandbox name, so creating its container
    // fails in setup (as a leftover or an engine conflict would).
    let blocker = format!(
        "lego-rl-{}-{}",
        lego_rl::sandbox::images::slug(&run_id),
        lego_rl::sandbox::images::slug(&format!("{TASK}/0/5"))
    );
    let c = docker(&["create", "--name", &blocker, "lego-rl/base:trixie", "true"]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    // The harness asks for its own temperature (mini-swe-agent passes model_kwargs through
    // litellm), which rollout's pinned sampling (train mode's default) ignores and counts.
    let harness = tmp.path().join("mini-swe-agent.toml");
    let adapter = std::fs::read_to_string(root().join("examples/harnesses/mini-swe-agent.toml")).unwrap();
    let step_limit = r#""-c", "agent.step_limit={max_turns}","#;
    assert!(adapter.contains(step_limit));
    let adapter = adapter.replace(
        step_limit,
        &format!(r#"{step_limit} "-c", "model.model_kwargs.temperature=0.3","#),
    );
    std::fs::write(&harness, adapter).unwrap();
    let mut args = rollout_args(
        &out,
        &["--group-size", "8", "-j", "2", "--run-id", &run_id],
    );
    let at = args.iter().position(|a| a == "--harness").unwrap() + 1;
    args[at] = harness.display().to_string();
    let o = lego().args(args).output().unwrap();
    docker(&["rm", "-f", &blocker]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rollout failed: {stderr}");
    let trajs = read(&out);
    let by_sample: BTreeMap<u32, &Trajectory> = trajs.iter().map(|t| (t.sample_index, t)).collect();
    assert_eq!(
        by_sample.keys().copied().collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    let chat = ChatFormat::from_parts(
        &chat_dir().join("tokenizer.json"),
        &chat_dir().join("tokenizer_config.json"),
        None,
    )
    .unwrap();
    for (s, t) in &by_sample {
        assert_eq!(t.group_id, 0);
        if *s == 5 {
            assert_eq!(t.termination, Termination::Infra("setup".into()), "{t:#?}");
            assert!(t.infra_failure);
            assert_eq!(t.reward, None);
            assert!(t.generations.is_empty());
            assert_eq!(t.stages["setup"].outcome, "error");
            // The cause is kept with the trajectory and named in rollout's summary.
            let cause = lego_rl::rollout::trial::infra_cause(t).expect("infra cause recorded");
            assert!(
                cause.starts_with("setup: ") && cause.contains(&blocker),
                "{cause}"
            );
            assert!(
                stderr.contains("1 infra failures (first: ") && stderr.contains(cause),
                "{stderr}"
            );
        } else if s % 2 == 0 {
            check_good(t, &chat);
        } else {
            assert_eq!(t.termination, Termination::Finished, "{t:#?}");
            assert!(!t.infra_failure);
            assert_eq!(t.reward, Some(0.0), "wrong edit graded 0: {:?}", t.grader);
            assert_eq!(t.generations.len(), 3);
            assert!(t.diff.as_deref().unwrap_or("").contains("number in (11,)"));
        }
    }
    sampling_overrides_are_counted(&trajs, &stderr, tmp.path());
    let rewards: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
    assert_eq!(rewards.len(), 7);
    assert_eq!(
        rewards.iter().sum::<f64>(),
        4.0,
        "samples 0, 2, 4 and 6 fixed the bug"
    );
    assert_eq!(leftovers(&run_id), "", "sandboxes left behind");
}

#[test]
fn sigkill_mid_group_then_rerun_writes_every_key_exactly_once() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    // Two groups of 2 (epochs 0 and 1), one trial at a time; the default run id (from the
    // output path) lets the rerun remove what the killed run left behind.
    let args = rollout_args(&out, &["--group-size", "2", "--epochs", "2", "-j", "1"]);
    let run_id = lego_rl::rollout::default_run_id(&out);
    let mut child = crate::common::lego_process()
        .args(&args)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for group 0 to be committed and a trial of group 1 to be running, then SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(Instant::now() < deadline, "group 0 never completed");
        assert!(
            child.try_wait().unwrap().is_none(),
            "rollout ended before it was killed"
        );
        let committed =
            out.exists() && read_all::<Trajectory>(&out, ReadOptions::default()).is_ok_and(|t| t.len() == 2);
        if committed && !leftovers(&run_id).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = read(&out);
    assert_eq!(before.len(), 2, "only the committed group is in the file");
    assert!(before.iter().all(|t| t.group_id == 0));
    assert!(!leftovers(&run_id).is_empty(), "the killed run left its sandbox");
    let o = lego().args(&args).output().unwrap();
    assert!(
        o.status.success(),
        "rerun: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after = read(&out);
    let mut keys: Vec<(String, u64, u32)> = after
        .iter()
        .map(|t| (t.task_id.clone(), t.group_id, t.sample_index))
        .collect();
    keys.sort();
    let want: Vec<(String, u64, u32)> = [(0, 0), (0, 1), (1, 0), (1, 1)]
        .into_iter()
        .map(|(g, s)| (TASK.to_string(), g, s))
        .collect();
    assert_eq!(keys, want, "every (task, group, sample) exactly once");
    assert_eq!(&after[..2], &before[..], "the first run's records are untouched");
    for t in &after {
        assert!(!t.infra_failure, "{t:#?}");
        assert_eq!(t.reward, Some(if t.sample_index == 0 { 1.0 } else { 0.0 }));
    }
    assert_eq!(
        leftovers(&run_id),
        "",
        "the rerun removed the killed run's sandboxes"
    );
}

/// Ctrl-C (SIGINT) in the middle of a trial: rollout removes every container and network of its
/// run before exiting 130, and writes no partial group.
#[test]
fn sigint_mid_trial_removes_the_runs_sandboxes() {
    interrupt_mid_trial(false);
}

/// The same with nobody left to read stderr (an orphaned rollout whose parent died): the
/// interrupt sweep's last line fails to print, and rollout must still clean up and exit 130
/// instead of hanging (an `eprintln` there once panicked the signal task and the process hung).
#[test]
fn sigint_with_stderr_gone_still_cleans_up_and_exits_130() {
    interrupt_mid_trial(true);
}

fn interrupt_mid_trial(stderr_gone: bool) {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    let args = rollout_args(&out, &["--group-size", "1", "-j", "1"]);
    let run_id = lego_rl::rollout::default_run_id(&out);
    let mut child = crate::common::lego_process()
        .args(&args)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if stderr_gone {
        // Closing the pipe's read end: every later write to stderr fails (EPIPE).
        drop(child.stderr.take());
    }
    wait_for_a_sandbox(
        &mut child,
        &run_id,
        Duration::from_secs(300),
        "no sandbox was ever created",
    );
    std::thread::sleep(Duration::from_secs(1));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // The sweep removes a container or two; a hang is the failure this guards against.
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rollout did not exit within 120 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    if !stderr_gone {
        assert!(err.contains("interrupted"), "{err}");
    }
    assert_eq!(leftovers(&run_id), "", "containers left after SIGINT");
    let nets = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("label=lego-rl.run-id={run_id}"),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&nets.stdout).trim(),
        "",
        "networks left after SIGINT"
    );
    let written = if out.exists() { read(&out).len() } else { 0 };
    assert_eq!(written, 0, "no partial group is written");
}

/// `--follow --reload-in-flight`: before each group rollout switches to the newest complete
/// checkpoint under the root and tags trajectories with its policy version; a `step-*` directory
/// without `lego-rl.json` (still being written) is ignored until it is complete. In flight, the
/// switch does not wait for the trial still running (-j 1: group 1's second trial), whose
/// generations then record the new version, and align carries it per token. (Waiting for the
/// trials, the default, is exercised through vLLM in tests/it/vllm.rs.)
#[test]
fn follow_switches_to_the_newest_checkpoint_between_generations() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    let ckpts = tmp.path().join("checkpoints");
    // Checkpoints share the tiny model's files; only their policy versions differ.
    let make = |version: u64, complete: bool| {
        let dir = ckpts.join(format!("step-{version:06}"));
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(tiny_moe()).unwrap() {
            let entry = entry.unwrap();
            let dst = dir.join(entry.file_name());
            if entry.file_name() != "lego-rl.json" && !dst.exists() {
                std::os::unix::fs::symlink(entry.path(), dst).unwrap();
            }
        }
        if complete {
            let info = lego_rl::train::CheckpointInfo {
                policy_version: version,
                optimizer_steps: version,
                ..Default::default()
            };
            std::fs::write(dir.join("lego-rl.json"), serde_json::to_string(&info).unwrap()).unwrap();
        }
        dir
    };
    let base = make(0, true);
    make(1, true);
    let pending = make(2, false);
    let mut args = rollout_args(
        &out,
        &[
            "--group-size",
            "2",
            "--epochs",
            "3",
            "-j",
            "1",
            "--max-staleness",
            "5",
        ],
    );
    let b = args.iter().position(|a| a == "--backend").unwrap();
    args[b + 1] = format!("embedded:{}", base.display());
    args.extend([
        "--follow".to_string(),
        ckpts.display().to_string(),
        "--reload-in-flight".to_string(),
    ]);
    let mut child = crate::common::lego_process()
        .args(&args)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once group 0 is committed, step 2 completes; group 2 starts at least a group later.
    let deadline = Instant::now() + Duration::from_secs(900);
    while !(out.exists() && read_all::<Trajectory>(&out, ReadOptions::default()).is_ok_and(|t| t.len() >= 2))
    {
        assert!(Instant::now() < deadline, "group 0 never completed");
        assert!(child.try_wait().unwrap().is_none(), "rollout ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    let info = lego_rl::train::CheckpointInfo {
        policy_version: 2,
        optimizer_steps: 2,
        ..Default::default()
    };
    std::fs::write(
        pending.join("lego-rl.json"),
        serde_json::to_string(&info).unwrap(),
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rollout --follow: {stderr}");
    let trajs = read(&out);
    assert_eq!(trajs.len(), 6, "3 groups of 2");
    let version = |g: u64| -> Vec<u64> {
        trajs
            .iter()
            .filter(|t| t.group_id == g)
            .map(|t| t.policy_version)
            .collect()
    };
    assert_eq!(
        version(0),
        [1, 1],
        "the newer complete checkpoint was loaded before group 0"
    );
    assert_eq!(version(2), [2, 2], "step 2 was loaded once complete");
    assert_eq!(version(1), [1, 1], "group 1 started on policy 1");
    assert!(
        trajs.iter().all(|t| !t.infra_failure && t.reward.is_some()),
        "{trajs:#?}"
    );
    assert!(stderr.contains("reloads"), "{stderr}");
    // Group 1's second trial was running when step 2 loaded (before group 2's first trial):
    // its generations record version 2, every other generation its trajectory's version.
    let gen_versions =
        |t: &Trajectory| -> Vec<u64> { t.generations.iter().map(|g| g.policy_version).collect() };
    for t in &trajs {
        let v = gen_versions(t);
        assert!(!v.is_empty(), "{}: no generation", t.id);
        if t.group_id == 1 && t.sample_index == 1 {
            assert!(
                v.iter().all(|&x| x == 2),
                "{}: the reload came before its first request: {v:?}",
                t.id
            );
        } else {
            assert!(v.iter().all(|&x| x == t.policy_version), "{}: {v:?}", t.id);
        }
    }
    // align carries the versions per policy token: runs only where a trajectory spans versions.
    let samples_out = tmp.path().join("samples.jsonl.zst");
    lego()
        .args(["align", "-i"])
        .arg(&out)
        .arg("-o")
        .arg(&samples_out)
        .assert()
        .success();
    let samples: Vec<lego_rl::records::Sample> = read_all(&samples_out, ReadOptions::default()).unwrap();
    assert!(!samples.is_empty());
    for s in &samples {
        let spanned = s.group_id == 1 && s.sample_index == 1;
        let want = if spanned {
            vec![lego_rl::records::VersionRun { start: 0, version: 2 }]
        } else {
            vec![]
        };
        assert_eq!(s.policy_versions, want, "{}", s.id);
    }
}
