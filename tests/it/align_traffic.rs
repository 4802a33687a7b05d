//! align's statistics do not depend on `--model`: real harness traffic (testdata/harness-traffic:
//! mini-swe-agent's text-based protocol, OpenCode's auto-compaction) is replayed through the real
//! proxy in front of the embedded tiny Qwen3-MoE, each request as the harness sent it, answered
//! with what the harness later echoed (forced), tool-call ids carried over as a harness does.
//! The trajectory names its tokenizer as rollout's do; align without `--model` then gives the
//! same statistics as with it, and warns when a trajectory names none.

use std::path::Path;
use std::sync::Arc;

use lego_rl::align::messages::common_prefix;
use lego_rl::align::MatchMode;
use lego_rl::chat::{ChatFormat, Conversation, Role};
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::io::{read_all, AtomicWriter, ReadOptions};
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::{AlignStats, Generation, Trajectory, CHAT_MODEL};
use serde_json::{json, Value};
use tch::Device;

use crate::common::{lego, root};

/// The raw model text that makes the proxy answer with `m` (an OpenAI assistant message).
fn forced_text(m: &Value) -> String {
    let mut text = match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("{}")).unwrap();
        let call = json!({"name": call["function"]["name"], "arguments": args});
        text.push_str(&format!("\n<tool_call>\n{call}\n</tool_call>"));
    }
    text
}

/// Replays `rel`'s chat-completion requests through a fresh trial; returns its captures.
async fn replay(proxy: &Proxy, base: &str, rel: &str) -> Vec<Generation> {
    let path = root().join("testdata/harness-traffic").join(rel);
    let bodies: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("/chat/completions"))
        .map(|r| r["body"].clone())
        .collect();
    let convs: Vec<Conversation> = bodies
        .iter()
        .map(|b| Conversation::from_api_request("openai", b).unwrap())
        .collect();
    let (token, trial) = proxy.register_trial(rel);
    let client = reqwest::Client::new();
    // Recorded tool-call id → the proxy's, as the harness would have echoed them.
    let mut ids: Vec<(String, String)> = Vec::new();
    for (k, body) in bodies.iter().enumerate() {
        let n = convs[k].messages.len();
        // What this request was answered with: the assistant turn a later request echoes.
        let echo = (k + 1..bodies.len()).find_map(|j| {
            let later = &convs[j].messages;
            (later.len() > n
                && later[n].role == Role::Assistant
                && common_prefix(&convs[k].messages, &later[..n], MatchMode::Strict) == n)
                .then(|| bodies[j]["messages"][n].clone())
        });
        let answer = echo.clone().unwrap_or_else(|| json!({"content": "Done."}));
        trial.push_script([forced_text(&answer)]);
        let mut text = body.to_string();
        for (old, new) in &ids {
            text = text.replace(&format!("\"{old}\""), &format!("\"{new}\""));
        }
        let mut body: Value = serde_json::from_str(&text).unwrap();
        body["stream"] = json!(false);
        body.as_object_mut().unwrap().remove("stream_options");
        let r = client
            .post(format!("{base}/t/{token}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{rel} request {k}");
        let v: Value = r.json().await.unwrap();
        let got = v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let want = answer["tool_calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(got.len(), want.len(), "{rel} request {k}: {v}");
        for (w, g) in want.iter().zip(&got) {
            ids.push((w["id"].as_str().unwrap().into(), g["id"].as_str().unwrap().into()));
        }
    }
    let gens = trial.generations();
    assert!(gens.iter().all(|g| g.status.as_deref() == Some("ok")), "{rel}");
    gens
}

fn trajectory(id: &str, generations: Vec<Generation>, chat_model: Option<&Path>) -> Trajectory {
    let mut metadata = serde_json::Map::new();
    if let Some(dir) = chat_model {
        metadata.insert(CHAT_MODEL.into(), json!(dir));
    }
    Trajectory {
        reward: Some(1.0),
        mode: Some("train".into()),
        metadata,
        ..Trajectory::new(id, 0, 0, id, "vllm:http://127.0.0.1:1", generations)
    }
}

/// `lego-rl align` of `trajs` (with `--model DIR` when given): per-trajectory stats and stderr.
fn align(dir: &Path, tag: &str, trajs: &[Trajectory], model: Option<&Path>) -> (Vec<AlignStats>, String) {
    let input = dir.join(format!("t-{tag}.jsonl.zst"));
    let mut w = AtomicWriter::create(&input).unwrap();
    trajs.iter().for_each(|t| w.write(t).unwrap());
    w.finish().unwrap();
    let stats = dir.join(format!("a-{tag}.jsonl.zst"));
    let mut cmd = lego();
    cmd.args(["align", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(dir.join(format!("s-{tag}.jsonl.zst")))
        .arg("--stats")
        .arg(&stats);
    if let Some(m) = model {
        cmd.arg("--model").arg(m);
    }
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "align: {stderr}");
    (read_all(&stats, ReadOptions::default()).unwrap(), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn align_statistics_are_the_same_without_model_and_warn_when_they_cannot_be() {
    let tok = root().join("testdata/tokenizer/qwen3");
    let chat = Arc::new(ChatFormat::from_model_dir(&tok).unwrap());
    let backend =
        Arc::new(EmbeddedBackend::start(&crate::harnesses::long_context_moe(), Device::Cpu).unwrap());
    let proxy = Proxy::new(chat, backend, ProxyConfig::default());
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{addr}");
    let mut named = Vec::new();
    for rel in [
        "mini-swe-agent/textbased/requests.jsonl",
        "opencode/autocompact/requests.jsonl",
    ] {
        named.push(trajectory(rel, replay(&proxy, &base, rel).await, Some(&tok)));
    }
    let dir = tempfile::tempdir().unwrap();
    let (auto, stderr) = align(dir.path(), "auto", &named, None);
    let (explicit, _) = align(dir.path(), "model", &named, Some(&tok));
    assert_eq!(auto, explicit, "{stderr}");
    assert!(!stderr.contains("approximate"), "{stderr}");
    let (text, compacted) = (&auto[0], &auto[1]);
    eprintln!("text-based: {text:?}\nauto-compact: {compacted:?}");
    // The text-based turns continue the conversation: no mismatch, nothing unlinked, and a break
    // only where the template re-rendered the history (earlier reasoning dropped), never a
    // rewritten history.
    assert_eq!(
        (text.tool_call_mismatches, text.unlinked_assistant_messages),
        (0, 0),
        "{text:?}"
    );
    assert!(!text.segment_breaks.contains_key("history_rewritten"), "{text:?}");
    assert_eq!(text.dropped_turns, 0);
    // The compaction is one rewritten history whose carried-over answer links to its capture.
    assert_eq!(
        compacted.segment_breaks.get("history_rewritten"),
        Some(&1),
        "{compacted:?}"
    );
    assert_eq!(compacted.dropped_turns, 0);
    assert_eq!(auto[2].without_tokenizer, 0);

    // A trajectory that names no tokenizer (an HTTP backend, no metadata): the same samples,
    // statistics marked and warned about as approximate.
    let anonymous: Vec<Trajectory> = named
        .iter()
        .map(|t| trajectory(&t.task_id, t.generations.clone(), None))
        .collect();
    let (approx, stderr) = align(dir.path(), "none", &anonymous, None);
    assert_eq!(approx[2].without_tokenizer, 2, "{:?}", approx[2]);
    assert!(
        stderr.contains("approximate") && stderr.contains("--model"),
        "{stderr}"
    );
    let samples = |tag: &str| std::fs::read(dir.path().join(format!("s-{tag}.jsonl.zst"))).unwrap();
    assert_eq!(
        samples("none"),
        samples("model"),
        "samples do not depend on the tokenizer"
    );
}
