//! The whole trajectory wherever the report shows it: a thread's last turn (a tool call the
//! proxy answered and no request echoes) in the page and the assistant's prompt; train-step's own
//! rollout-vs-trainer agreement of a trained trajectory, joined to its page and prompt; and the
//! prompt within `--assistant-context − --assistant-max-tokens` at 1024, 2048 and 8192 tokens,
//! counted with the real tokenizer.

use lego_rl::chat::ChatFormat;
use lego_rl::io::AppendWriter;
use lego_rl::model::Model;
use lego_rl::records::{CapturedCall, CapturedResponse, StepMetrics};
use serde_json::Value;
use tch::Device;

use crate::assist::{failing_endpoint, run_with_long_episode, small_run};
use crate::common::lego;
use crate::report::{chromium, dump_dom, enc, http_get, serve};
use crate::synth::trajectory;

const LAST_CALL: &str = "git diff --stat -- last-call-7f3";

fn prompt_of(addr: &str, id: &str) -> Value {
    let (status, body) = http_get(addr, &format!("/api/ask/prompt?id={}", enc(id)));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_last_turn_that_is_a_tool_call_is_in_the_page_and_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let mut t = trajectory(&s, 0, 1, 0, 7);
    t.id = "owner__repo1-101/900/0".into();
    let last = t.generations.last_mut().unwrap();
    last.response = Some(CapturedResponse {
        text: "Let me check the change.".into(),
        reasoning: None,
        tool_calls: vec![CapturedCall {
            id: "call_last".into(),
            name: "execute_bash".into(),
            arguments: serde_json::json!({ "command": LAST_CALL }).to_string(),
        }],
    });
    let (mut w, _) = AppendWriter::open(&run.join("trajectories/step-000000.jsonl.zst")).unwrap();
    w.push(&t).unwrap();
    w.commit().unwrap();
    drop(w);
    let (upstream, _) = failing_endpoint();
    let (_server, addr) = serve(&run, &[format!("--assistant={upstream}")]);
    let (status, body) = http_get(&addr, &format!("/api/trajectory?id={}", enc(&t.id)));
    assert_eq!(status, 200, "{body}");
    let d: Value = serde_json::from_str(&body).unwrap();
    let turns = d["threads"][0]["turns"].as_array().unwrap();
    let final_turn = turns.last().unwrap();
    assert_eq!(final_turn["role"], "assistant");
    assert!(
        final_turn["calls"][0]["args"]
            .as_str()
            .unwrap()
            .contains(LAST_CALL),
        "{final_turn}"
    );
    let p = prompt_of(&addr, &t.id);
    let user = p["user"].as_str().unwrap();
    assert!(
        user.contains(LAST_CALL),
        "the last call is in the prompt:\n{user}"
    );
    let Some(chrome) = chromium() else { return };
    let dom = dump_dom(
        &chrome,
        &dir.path().join("profile"),
        &format!("http://{addr}/#traj={}", enc(&t.id)),
    );
    assert!(dom.contains(LAST_CALL), "the last call is on the page");
}

#[test]
fn a_trained_trajectory_shows_train_steps_agreement() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let id = trajectory(&s, 0, 0, 0, 0).id;
    // Before training: no train-step figures (only the fixture's per-token differences).
    let (upstream, _) = failing_endpoint();
    let (server, addr) = serve(&run, &[format!("--assistant={upstream}")]);
    let p = prompt_of(&addr, &id);
    let user = p["user"].as_str().unwrap();
    assert!(
        !user.contains("## Rollout-vs-trainer agreement\ntrain-step"),
        "{user}"
    );
    drop(server);
    // One real train-step on samples of that trajectory (a perfect rollout engine: the
    // samples' log-probs are the model's own), its metrics appended to the run's.
    let model = Model::load(&crate::model::tiny_moe(), Device::Cpu, None).unwrap();
    let mut samples = crate::train::moe_samples(&model);
    for x in &mut samples {
        if x.trajectory_id == "a" {
            x.trajectory_id = id.clone();
        }
    }
    let input = dir.path().join("samples.jsonl.zst");
    crate::train::write_samples(&input, &samples);
    let metrics = run.join("metrics.jsonl.zst");
    let before = crate::train::read_metrics(&metrics).len();
    lego()
        .args(["train-step", "--checkpoint"])
        .arg(crate::model::tiny_moe())
        .arg("-i")
        .arg(&input)
        .arg("--out")
        .arg(dir.path().join("ckpt"))
        .arg("--metrics")
        .arg(&metrics)
        .args(crate::train::CLI_OPTS)
        .assert()
        .success();
    let all: Vec<StepMetrics> = crate::train::read_metrics(&metrics);
    assert_eq!(all.len(), before + 1);
    let mine = all
        .last()
        .unwrap()
        .by_trajectory
        .iter()
        .find(|a| a.trajectory_id == id)
        .unwrap_or_else(|| panic!("{:?}", all.last().unwrap().by_trajectory))
        .clone();
    assert_eq!(mine.samples, 2, "both segments");
    assert!(mine.logprob_pearson.unwrap() > 0.99, "{mine:?}");
    assert!(mine.logprob_mean_abs_diff.unwrap() < 0.05, "{mine:?}");
    let (_server, addr) = serve(&run, &[format!("--assistant={upstream}")]);
    let (_, body) = http_get(&addr, &format!("/api/trajectory?id={}", enc(&id)));
    let d: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(d["agreement"]["trajectory_id"], id.as_str(), "{}", d["agreement"]);
    assert_eq!(d["agreement"]["policy_tokens"], mine.policy_tokens);
    let user = prompt_of(&addr, &id)["user"].as_str().unwrap().to_string();
    let section = user.split("## Rollout-vs-trainer agreement\n").nth(1).unwrap();
    assert!(
        section.starts_with(&format!(
            "train-step {} on {} policy tokens",
            all.last().unwrap().step,
            mine.policy_tokens
        )),
        "{section}"
    );
    assert!(!section.lines().next().unwrap().contains("not recorded"));
    let Some(chrome) = chromium() else { return };
    let dom = dump_dom(
        &chrome,
        &dir.path().join("profile"),
        &format!("http://{addr}/#traj={}", enc(&id)),
    );
    assert!(
        dom.contains("<table id=\"traj-agreement\">"),
        "agreement table on the page"
    );
}

#[test]
fn the_prompt_fits_small_and_large_contexts_by_the_real_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let (run, long) = run_with_long_episode(dir.path());
    let chat_dir = crate::rollout::chat_dir();
    let chat = ChatFormat::from_model_dir(&chat_dir).unwrap();
    let count = |t: &str| chat.encode(t).unwrap().len();
    let (upstream, _) = failing_endpoint();
    for (context, max_tokens) in [(1024usize, 512usize), (2048, 1024), (8192, 512)] {
        let (_server, addr) = serve(
            &run,
            &[
                format!("--assistant={upstream}"),
                format!("--assistant-chat-model={}", chat_dir.display()),
                format!("--assistant-context={context}"),
                format!("--assistant-max-tokens={max_tokens}"),
            ],
        );
        let p = prompt_of(&addr, &long.id);
        let (system, user) = (p["system"].as_str().unwrap(), p["user"].as_str().unwrap());
        let tokens = count(system) + count(user);
        assert_eq!(
            p["tokens"].as_u64().unwrap() as usize,
            tokens,
            "the server counts as the tokenizer does"
        );
        assert!(
            tokens <= context - max_tokens,
            "context {context}: {tokens} prompt tokens + {max_tokens} for the answer"
        );
        for section in [
            "## Instruction",
            "## Outcome",
            "## Grader",
            "## Left out",
            "## Question",
        ] {
            assert!(
                user.contains(section),
                "context {context}: no {section} in\n{user}"
            );
        }
        let left_out: Vec<&str> = p["left_out"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for l in &left_out {
            assert!(
                user.contains(&format!("- {l}\n")),
                "context {context}: {l} listed in the prompt"
            );
        }
        if context < 8192 {
            assert!(
                left_out.iter().any(|l| l.contains("instruction")),
                "context {context}: the instruction shrank too: {left_out:?}"
            );
        }
    }
}
