//! Live episodes of **Claude Code** (the `claude` CLI bundled in the PyPI wheel `claude-agent-sdk`,
//! Anthropic Messages API, streaming) and the **OpenHands SDK** (PyPI `openhands-sdk`, OpenAI chat
//! completions through litellm, non-streaming): each unmodified harness runs in a real Docker
//! sandbox against the embedded tiny Qwen3-MoE behind the proxy, driven by forced scripted
//! continuations (`testdata/rollout/inflection-<harness>.json`) through a multi-turn episode that
//! inspects, edits and tests the inflection repo and gets reward 1. The trajectory is then aligned
//! and the trainer's recomputation with routing replay must reproduce every captured log-prob.
//!
//! The harnesses' real prompts are long (Claude Code's first request is ~20k tokens: a 27 kB system
//! prompt and 24 tool schemas), past the tiny checkpoint's 4096 positions, so the tests serve a
//! view of the same weights whose config allows Qwen3's 40960 positions (RoPE has no learned
//! table; only the engine's context check reads the number).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lego_rl::chat::ChatFormat;
use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{AlignStats, Sample, Termination, Trajectory};
use serde_json::Value;

use crate::align::assert_trainer_reproduces_rollout;
use crate::common::{docker_available, lego, root};
use crate::rollout::{chat_dir, fixture, leftovers, read, TASK};

/// The tiny MoE's weights and tokenizer with `max_position_embeddings` raised to 40960.
pub(crate) fn long_context_moe() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = crate::model::tiny_moe();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tiny-qwen3-moe-40k");
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            let dst = dir.join(&name);
            if name == "config.json" {
                let mut cfg: Value =
                    serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap();
                cfg["max_position_embeddings"] = 40960.into();
                std::fs::write(&dst, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
            } else if !dst.exists() {
                std::os::unix::fs::symlink(entry.path(), &dst).unwrap();
            }
        }
        dir
    })
    .clone()
}

fn forced(harness: &str) -> PathBuf {
    root().join(format!("testdata/rollout/inflection-{harness}.json"))
}

fn script(harness: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(forced(harness)).unwrap()).unwrap();
    serde_json::from_value(v["tasks"][TASK][0].clone()).unwrap()
}

/// Text of every tool result a request carries, in order: OpenAI `tool` messages (string or
/// content parts) and Anthropic `tool_result` blocks (string or text blocks).
fn tool_outputs(request: &Value) -> Vec<String> {
    fn text(content: &Value) -> String {
        match content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            other => other.to_string(),
        }
    }
    let mut out = Vec::new();
    for m in request["messages"].as_array().into_iter().flatten() {
        if m["role"] == "tool" {
            out.push(text(&m["content"]));
        } else if let Some(blocks) = m["content"].as_array() {
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                out.push(text(&b["content"]));
            }
        }
    }
    out
}

/// The tool names a request offers; `name_at` is the JSON pointer of a tool's name (Anthropic
/// `/name`, OpenAI `/function/name`).
fn tool_names<'a>(request: &'a Value, name_at: &str) -> Vec<&'a str> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer(name_at).and_then(Value::as_str))
        .collect()
}

/// Runs one trial of `harness` on the inflection task; returns the trajectory and the temp dir.
fn episode(harness: &str) -> (Trajectory, tempfile::TempDir) {
    episode_with(harness, &forced(harness), &[])
}

/// [`episode`] with another forced script and extra rollout arguments.
fn episode_with(harness: &str, script: &Path, extra: &[&str]) -> (Trajectory, tempfile::TempDir) {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    // Unique per script: a rollout removes what carries its run id, so two tests of one harness
    // running at once must not share one.
    let tag = script.file_stem().and_then(|s| s.to_str()).unwrap_or("script");
    let run_id = format!("it-{harness}-{tag}-{}", std::process::id());
    let o = lego()
        .args(["rollout", "-i"])
        .arg(&fx.tasks)
        .arg("--images")
        .arg(&fx.images)
        .arg("--harness")
        .arg(root().join(format!("examples/harnesses/{harness}.toml")))
        .arg("--backend")
        .arg(format!("embedded:{}", long_context_moe().display()))
        .arg("--chat-model")
        .arg(chat_dir())
        .arg("--forced")
        .arg(script)
        .args(extra)
        .args([
            "--max-turns",
            "10",
            "--group-size",
            "1",
            "--run-id",
            &run_id,
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "rollout with {harness} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(leftovers(&run_id), "", "sandboxes left behind");
    let mut trajs = read(&out);
    assert_eq!(trajs.len(), 1);
    (trajs.remove(0), tmp)
}

/// The common checks: the episode followed the script token for token, the commands really ran
/// in the sandbox, the fix was graded 1, and alignment + the trainer reproduce the captures.
fn check_episode(harness: &str, t: &Trajectory, dir: &Path, finish_reason: &str) {
    assert_eq!(t.harness, harness);
    assert_eq!(t.termination, Termination::Finished, "{t:#?}");
    assert!(!t.infra_failure);
    assert_eq!(t.reward, Some(1.0), "grader: {:?}", t.grader);
    let script = script(harness);
    let chat = ChatFormat::from_model_dir(&chat_dir()).unwrap();
    let im_end = chat.special().im_end.unwrap();
    // Every generation is the main agent's: no side request was made or all were answered in
    // their own thread after the scripted ones.
    let main: Vec<_> = t.generations.iter().filter(|g| g.thread == 0).collect();
    assert_eq!(main.len(), script.len(), "one model call per scripted turn");
    for (i, (g, text)) in main.iter().zip(&script).enumerate() {
        assert_eq!(g.status.as_deref(), Some("ok"), "{g:?}");
        let mut want = chat.encode(text).unwrap();
        want.push(im_end);
        assert_eq!(g.output_ids, want, "turn {i}: captured output is the forced one");
        let last = i + 1 == script.len();
        let want_reason = if last { finish_reason } else { "tool_calls" };
        assert_eq!(g.finish_reason, want_reason, "turn {i}");
        assert_eq!(g.logprobs.to_f32().unwrap().len(), g.output_ids.len());
        assert!(g.routing.is_some(), "MoE routing captured");
        if i > 0 {
            assert_eq!(
                g.extra.get("spliced_after").and_then(Value::as_u64),
                Some(main[i - 1].index as u64),
                "turn {i}: the prompt splices the previous turn's captured tokens"
            );
        }
    }
    // The commands ran in the sandbox: the harness fed their real output back.
    let last = &main.last().unwrap().request;
    let outputs = tool_outputs(last).join("\n---\n");
    assert!(
        outputs.contains("number % 10 in (11, 12, 13)"),
        "grep output in the history: {outputs}"
    );
    assert!(
        outputs.contains("passed") && !outputs.contains("failed"),
        "pytest output in the history: {outputs}"
    );
    let diff = t.diff.as_deref().expect("diff");
    assert!(diff.contains("+    if number % 100 in (11, 12, 13):"), "{diff}");
    assert_eq!(t.stages["agent"].outcome, "ok");

    // align → samples carrying every scripted token; the trainer's π_old pass with replayed
    // routing reproduces the rollout log-probs (tolerance 1e-4: KV-cache decode vs one forward).
    let traj = dir.join("traj.jsonl.zst");
    let samples_path = dir.join("samples.jsonl.zst");
    let stats_path = dir.join("stats.jsonl.zst");
    let o = lego()
        .args(["align", "-i"])
        .arg(&traj)
        .arg("-o")
        .arg(&samples_path)
        .arg("--stats")
        .arg(&stats_path)
        .arg("--model")
        .arg(chat_dir())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "align: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let samples: Vec<Sample> = read_all(&samples_path, ReadOptions::default()).unwrap();
    let stats: Vec<AlignStats> = read_all(&stats_path, ReadOptions::default()).unwrap();
    let total = stats
        .iter()
        .find(|s| s.trajectory_id.is_none())
        .expect("totals record");
    let scripted: usize = main.iter().map(|g| g.output_ids.len()).sum();
    assert_eq!(total.dropped_turns, 0, "{total:?}");
    assert!(total.policy_tokens as usize >= scripted, "{total:?}");
    assert_eq!(samples.len() as u64, total.samples);
    assert!(samples.iter().all(|s| s.reward == 1.0 && s.weight == 1.0));
    eprintln!(
        "{harness}: {} generations, prompt of turn 0 = {} tokens, align {total:?}",
        t.generations.len(),
        main[0].prompt_ids.len()
    );
    assert_trainer_reproduces_rollout(
        &long_context_moe(),
        &samples,
        &dir.join("ckpt"),
        total.policy_tokens,
    );
}

#[test]
fn claude_code_episode_inspects_edits_tests_and_gets_reward_1() {
    if !docker_available() {
        return;
    }
    let (t, dir) = episode("claude-code");
    check_episode("claude-code", &t, dir.path(), "stop");
    // The CLI's own word on how it ended: the `result` record of its teed stream-json stdout.
    assert_eq!(t.metadata["agent_exit_status"], "success", "{:?}", t.metadata);
    let first = &t.generations[0];
    assert_eq!(first.api, "anthropic");
    // The real CLI's request: its own system prompt and tool set, the task as the last user block.
    let tools = tool_names(&first.request, "/name");
    assert!(tools.contains(&"Bash") && tools.contains(&"Edit"), "{tools:?}");
    assert!(first.request["messages"][0]
        .to_string()
        .contains("ordinalize(11)"));
}

#[test]
fn openhands_sdk_episode_inspects_edits_tests_and_gets_reward_1() {
    if !docker_available() {
        return;
    }
    let (t, dir) = episode("openhands-sdk");
    check_episode("openhands-sdk", &t, dir.path(), "tool_calls");
    // The SDK's own word on how it ended, from the launcher's status.json.
    assert_eq!(t.metadata["agent_exit_status"], "finished", "{:?}", t.metadata);
    let first = &t.generations[0];
    assert_eq!(first.api, "openai");
    let tools = tool_names(&first.request, "/function/name");
    assert!(
        tools.contains(&"terminal") && tools.contains(&"finish"),
        "{tools:?}"
    );
}

/// Context overflow the way Claude Code meets it: the proxy offers a 24300-token context
/// (`rollout --max-context`; the CLI's first request alone is ~19.6k tokens), a long command
/// output fills it within three turns, and the fourth request is refused with Anthropic's 400
/// "prompt is too long: N tokens > M maximum". The CLI compacts on it by itself: its summary
/// request is refused too, a retry with the head of the conversation cut off fits and is
/// answered (scripted, in the <analysis>/<summary> form it asks for), and the session goes on
/// from the summary, edits, tests and finishes. A refused request uses no scripted output, so
/// the script is the accepted answers in order (testdata/rollout/inflection-claude-code-compact.json;
/// the episode avoids reading files, which the CLI would re-attach whole after compacting).
#[test]
fn claude_code_compacts_on_the_proxys_context_refusal_and_finishes() {
    if !docker_available() {
        return;
    }
    let script = root().join("testdata/rollout/inflection-claude-code-compact.json");
    let (t, dir) = episode_with("claude-code", &script, &["--max-context", "24300"]);
    let statuses: Vec<&str> = t
        .generations
        .iter()
        .map(|g| g.status.as_deref().unwrap_or(""))
        .collect();
    let refused = statuses.iter().filter(|s| **s == "context_limit").count();
    assert!(refused >= 1, "{statuses:?}");
    assert_eq!(t.metadata["context_refusals"], refused, "{:?}", t.metadata);
    // Honest termination: it recovered and submitted, graded 1.
    assert_eq!(t.termination, Termination::Finished, "{statuses:?}");
    assert_eq!(t.reward, Some(1.0), "grader: {:?}", t.grader);
    assert_eq!(t.metadata["agent_exit_status"], "success");
    let last = t.generations.last().unwrap();
    assert_eq!(last.status.as_deref(), Some("ok"));
    // The compaction: the session that goes on is a new thread whose history is the summary.
    let continued = t
        .generations
        .iter()
        .find(|g| {
            g.request["messages"][0]
                .to_string()
                .contains("continued from a previous conversation")
        })
        .expect("a request continuing from the summary");
    assert!(continued.thread > 0 && continued.status.as_deref() == Some("ok"));
    assert!(continued.request["messages"][0]
        .to_string()
        .contains("number % 100"));
    let ok: Vec<_> = t
        .generations
        .iter()
        .filter(|g| g.status.as_deref() == Some("ok"))
        .collect();
    assert_eq!(
        ok.len(),
        script_len(&script),
        "one accepted request per scripted answer"
    );

    // align without --model finds the tokenizer the trajectory names; its statistics equal
    // those with --model, count the refusals (not as dropped turns) and train exactly the
    // generated tokens.
    let traj = dir.path().join("traj.jsonl.zst");
    let stats = |model: Option<&Path>| -> (AlignStats, Vec<Sample>) {
        let tag = if model.is_some() { "model" } else { "auto" };
        let (samples, stats) = (
            dir.path().join(format!("s-{tag}.jsonl.zst")),
            dir.path().join(format!("a-{tag}.jsonl.zst")),
        );
        let mut cmd = lego();
        cmd.args(["align", "-i"])
            .arg(&traj)
            .arg("-o")
            .arg(&samples)
            .arg("--stats")
            .arg(&stats);
        if let Some(m) = model {
            cmd.arg("--model").arg(m);
        }
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "align: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let all: Vec<AlignStats> = read_all(&stats, ReadOptions::default()).unwrap();
        let total = all.into_iter().find(|s| s.trajectory_id.is_none()).unwrap();
        (total, read_all(&samples, ReadOptions::default()).unwrap())
    };
    let (auto, samples) = stats(None);
    let (with_model, _) = stats(Some(&chat_dir()));
    assert_eq!(auto, with_model);
    assert_eq!(auto.without_tokenizer, 0);
    assert_eq!(auto.context_refusals as usize, refused);
    assert_eq!(auto.dropped_turns, 0, "{auto:?}");
    assert!(auto.threads >= 2, "{auto:?}");
    let generated: usize = ok.iter().map(|g| g.output_ids.len()).sum();
    assert_eq!(auto.policy_tokens as usize, generated, "{auto:?}");
    let trained: usize = samples.iter().map(|s| s.loss_mask.count_ones()).sum();
    assert_eq!(trained, generated);
    assert_trainer_reproduces_rollout(
        &long_context_moe(),
        &samples,
        &dir.path().join("ckpt"),
        auto.policy_tokens,
    );
}

fn script_len(path: &Path) -> usize {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["tasks"][TASK][0].as_array().unwrap().len()
}
