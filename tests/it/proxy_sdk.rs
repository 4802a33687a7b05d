//! The official `openai` and `anthropic` Python SDKs (tests/python/*.py) as clients of the real
//! proxy served by the embedded engine on the tiny Qwen3-MoE: what the SDKs parse must agree with
//! what the proxy captured (token ids, log-probs, routing, tool-call ids), under concurrency, client
//! disconnects and errors.

use std::path::Path;
use std::sync::Arc;

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::vllm::VllmBackend;
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::{Generation, PromptMode};
use serde_json::{json, Value};
use tch::Device;

use super::common;
use super::proxy::{chat, recompute};

fn cfg() -> ProxyConfig {
    let mut c = ProxyConfig::default();
    c.sampling.max_tokens = Some(16);
    c.sampling.seed = Some(11);
    // A generation stops the moment its client leaves (the disconnect tests); the retry grace
    // that keeps it running for a retry is tests/it/retry.rs's.
    c.retry_grace = std::time::Duration::ZERO;
    c
}

async fn start(c: ProxyConfig) -> (Proxy, Arc<EmbeddedBackend>, String) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let proxy = Proxy::new(chat(), backend.clone(), c);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (proxy, backend, format!("http://{addr}"))
}

/// Runs `tests/python/{script} {scenario} {config}` with the venv's Python; returns its JSON.
pub(crate) async fn sdk(script: &str, scenario: &str, config: &Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("config.json");
    std::fs::write(&cfg_path, config.to_string()).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = tokio::process::Command::new(common::python())
        .arg(&path)
        .arg(scenario)
        .arg(&cfg_path)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} {scenario} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {stdout}\n{stderr}"))
}

fn tool_call(command: &str, timeout: Option<u32>) -> String {
    let args = match timeout {
        Some(t) => format!("{{\"command\": \"{command}\", \"timeout\": {t}}}"),
        None => format!("{{\"command\": \"{command}\"}}"),
    };
    format!("<tool_call>\n{{\"name\": \"bash\", \"arguments\": {args}}}\n</tool_call>")
}

/// The capture behind a response: counts agree with the API's usage, log-probs and routing are
/// present and shaped by the tokens.
fn check_capture(g: &Generation, usage_prompt: Option<&Value>, usage_output: Option<&Value>) {
    assert_eq!(g.status.as_deref(), Some("ok"), "{g:?}");
    if let Some(p) = usage_prompt {
        assert_eq!(p, &json!(g.prompt_ids.len()));
    }
    if let Some(o) = usage_output {
        assert_eq!(o, &json!(g.output_ids.len()));
    }
    let lps = g.logprobs.to_f32().unwrap();
    assert_eq!(lps.len(), g.output_ids.len());
    assert!(lps.iter().all(|l| l.is_finite() && *l <= 0.0), "{lps:?}");
    let r = g.routing.as_ref().expect("routing captured");
    assert_eq!(r.shape, vec![g.prompt_ids.len() + g.output_ids.len() - 1, 2, 2]);
    assert!(
        r.to_u32().unwrap().iter().all(|&e| e < 8),
        "expert ids within the 8 experts"
    );
    assert!(g.backend.as_deref().unwrap().starts_with("embedded:"));
    assert!(g.timings.contains_key("engine") && g.timings.contains_key("total"));
}

fn index_of(id: &Value, prefix: &str) -> u32 {
    id.as_str()
        .and_then(|s| s.strip_prefix(prefix))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("id {id} is not {prefix}N"))
}

fn decoded(g: &Generation) -> String {
    chat().decode(&g.output_ids, false).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_chat_streaming_and_tools_match_the_captures() {
    let (proxy, _backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/0");
    let scripts = [
        "<think>\nThe user greets me.\n</think>\n\nHello from the tiny model!".to_string(),
        format!(
            "<think>\nTwo commands.\n</think>\n\n{}\n{}",
            tool_call("ls -la", Some(10)),
            tool_call("cat a.py", Some(5))
        ),
        format!("<think>\nRead b.\n</think>\n\n{}", tool_call("cat b.py", Some(5))),
        "<think>\nok\n</think>\n\nAll done: a.py and b.py.".to_string(),
    ];
    trial.push_script(scripts.clone());
    let out = sdk(
        "openai_client.py",
        "chat",
        &json!({"url": format!("{base}/t/{token}/v1")}),
    )
    .await;
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    let gens = trial.generations();
    assert_eq!(gens.len(), 5);
    for (i, r) in results.iter().enumerate() {
        let g = &gens[index_of(&r["id"], "chatcmpl-") as usize];
        assert_eq!(g.index as usize, i);
        check_capture(g, Some(&r["usage"]["prompt"]), Some(&r["usage"]["completion"]));
        let ids: Vec<&str> = r["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            g.tool_call_ids, ids,
            "tool-call ids the SDK saw are the captured ones"
        );
        if let Some(script) = scripts.get(i) {
            // Forced tokens are exactly the script (plus the end-of-turn token).
            assert_eq!(decoded(g), format!("{script}<|im_end|>"));
        } else {
            // Sampled: the text the SDK got is the captured tokens' text.
            let text = chat().decode(&g.output_ids, true).unwrap();
            assert!(
                text.contains(r["content"].as_str().unwrap().trim()),
                "{text:?} vs {r}"
            );
            assert_eq!(g.sampling.temperature, Some(0.7));
            assert_eq!(g.sampling.seed, Some(3));
        }
    }
    assert_eq!(gens[1].finish_reason, "tool_calls");
    // Turns 3 and 4 continue turn 2's thread from its captured tokens, although the SDK
    // re-serialized the assistant messages.
    assert_eq!(gens[1].thread, gens[2].thread);
    assert_ne!(gens[0].thread, gens[1].thread);
    for k in [2, 3] {
        assert_eq!(gens[k].prompt_mode, PromptMode::Faithful, "{:?}", gens[k].extra);
        let before: Vec<u32> = gens[k - 1]
            .prompt_ids
            .iter()
            .chain(&gens[k - 1].output_ids)
            .copied()
            .collect();
        assert_eq!(&gens[k].prompt_ids[..before.len()], &before[..]);
    }
    // The streamed tool call's log-probs are the trainer's recomputation with replayed routing.
    let g = &gens[2];
    let again = recompute(&g.prompt_ids, &g.output_ids, g.routing.as_ref());
    let lps = g.logprobs.to_f32().unwrap();
    let diff = lps
        .iter()
        .zip(&again)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "captured vs recomputed log-probs differ by {diff}");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_messages_streaming_and_tool_use_match_the_captures() {
    let (proxy, _backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/1");
    let scripts = [
        "<think>\nGreet back.\n</think>\n\nHi! I am tiny.".to_string(),
        format!("<think>\nlist\n</think>\n\n{}", tool_call("ls -la", Some(10))),
        format!(
            "<think>\nread\n</think>\n\nReading a.py now.\n{}",
            tool_call("cat a.py", None)
        ),
        "<think>\nDenied.\n</think>\n\nI cannot read it.".to_string(),
    ];
    trial.push_script(scripts.clone());
    let out = sdk(
        "anthropic_client.py",
        "messages",
        &json!({"url": format!("{base}/t/{token}")}),
    )
    .await;
    let results = out["results"].as_array().unwrap();
    let gens = trial.generations();
    assert_eq!(gens.len(), 4, "count_tokens is not a generation");
    for (i, r) in results.iter().enumerate() {
        let g = &gens[index_of(&r["id"], "msg_lego") as usize];
        assert_eq!(g.index as usize, i);
        assert_eq!(g.api, "anthropic");
        check_capture(g, r["usage"].get("input"), Some(&r["usage"]["output"]));
        assert_eq!(decoded(g), format!("{}<|im_end|>", scripts[i]));
        let uses: Vec<&str> = r["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        assert_eq!(g.tool_call_ids, uses);
        assert!(uses.iter().all(|u| u.starts_with("toolu_")));
    }
    // Turns 3 and 4 are built from the captured tokens of the turns before, although the SDK
    // echoed thinking blocks and tool_use inputs back as parsed objects.
    for k in [2, 3] {
        assert_eq!(
            gens[k].prompt_mode,
            PromptMode::Faithful,
            "turn {k}: {:?}",
            gens[k].extra
        );
        let before: Vec<u32> = gens[k - 1]
            .prompt_ids
            .iter()
            .chain(&gens[k - 1].output_ids)
            .copied()
            .collect();
        assert_eq!(&gens[k].prompt_ids[..before.len()], &before[..]);
    }
    // The SDK's raw events of turn 4 (it skips `ping`), deltas streamed token by token.
    let mut events: Vec<&str> = results[3]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    events.dedup();
    assert_eq!(
        events,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
}

/// 200 streams at once (100 trials × 2 threads): all complete, every answer is the one scripted
/// for its own request, and every capture lands in its own trial and thread.
#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_200_concurrent_streams_each_land_in_their_own_trial_and_thread() {
    let (proxy, backend, base) = start(cfg()).await;
    let mut trials = Vec::new();
    let mut config = Vec::new();
    for t in 0..100 {
        let (token, trial) = proxy.register_trial(&format!("conc/{t}/0"));
        trial.push_script([format!("Trial {t} answer A."), format!("Trial {t} answer B.")]);
        config.push(json!({"trial": t, "url": format!("{base}/t/{token}/v1")}));
        trials.push(trial);
    }
    let out = sdk(
        "openai_client.py",
        "concurrent",
        &json!({"trials": config, "per_trial": 2}),
    )
    .await;
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 200);
    assert_eq!(backend.counts().completed, 200);
    for (t, trial) in trials.iter().enumerate() {
        let gens = trial.generations();
        assert_eq!(gens.len(), 2, "trial {t}");
        let mut threads: Vec<u32> = gens.iter().map(|g| g.thread).collect();
        threads.sort();
        assert_eq!(threads, [0, 1], "trial {t}: one thread per first user message");
        for k in 0..2 {
            let r = &results[2 * t + k];
            let g = &gens[index_of(&r["id"], "chatcmpl-") as usize];
            check_capture(g, Some(&r["usage"]["prompt"]), Some(&r["usage"]["completion"]));
            // The capture is of this client's request, and the client got this capture's tokens.
            let sent = r["sent"].as_str().unwrap();
            assert_eq!(g.request["messages"][0]["content"], sent);
            assert!(sent.starts_with(&format!("trial {t} thread {k}:")));
            let content = r["content"].as_str().unwrap();
            assert_eq!(decoded(g), format!("{content}<|im_end|>"));
            assert!(content.starts_with(&format!("Trial {t} answer ")), "{content}");
            assert_eq!(r["finish_reason"], "stop");
        }
        assert_ne!(gens[0].output_ids, gens[1].output_ids, "each script used once");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_disconnect_cancels_the_generation_and_the_engine_keeps_serving() {
    let (proxy, backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/2");
    // A long forced continuation (scripts ignore max_tokens): far from done when the client leaves.
    trial.push_script(["word ".repeat(3000)]);
    let out = sdk(
        "openai_client.py",
        "disconnect",
        &json!({"url": format!("{base}/t/{token}/v1")}),
    )
    .await;
    assert_eq!(out["received"], 3, "tokens stream before the generation ends");
    assert!(out["after"]["usage"]["completion"].as_u64().unwrap() <= 3);
    // The engine drops the abandoned sequence at its next step.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while backend.counts().cancelled == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "generation not cancelled: {:?}",
            backend.counts()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let counts = backend.counts();
    assert_eq!(
        (counts.cancelled, counts.completed, counts.active),
        (1, 1, 0),
        "{counts:?}"
    );
    assert!(counts.forwards < 3000, "stopped early: {counts:?}");
    let gens = trial.generations();
    assert_eq!(gens.len(), 2);
    assert_eq!(gens[0].status.as_deref(), Some("client_disconnected"));
    assert!(!gens[0].prompt_ids.is_empty());
    // The partial output is kept: at least the tokens the client read, as scripted.
    check_partial(&gens[0], 3, &"word ".repeat(3000));
    check_capture(&gens[1], None, Some(&out["after"]["usage"]["completion"]));
}

/// A cancelled generation's capture: the tokens generated before the client left (at least
/// `min`), a prefix of the scripted ones, each with its log-prob.
fn check_partial(g: &Generation, min: usize, script: &str) {
    assert_eq!(g.finish_reason, "cancelled");
    assert!(g.output_ids.len() >= min, "{} tokens kept", g.output_ids.len());
    let script_ids = chat().encode(script).unwrap();
    assert!(script_ids.starts_with(&g.output_ids), "{:?}", g.output_ids);
    let lps = g.logprobs.to_f32().unwrap();
    assert_eq!(lps.len(), g.output_ids.len());
    assert!(lps.iter().all(|l| l.is_finite() && *l <= 0.0), "{lps:?}");
}

/// A client of a non-streaming request that closes its socket mid-generation (a harness that
/// gives up waiting): the generation is cancelled, the capture keeps its partial output and is
/// marked `client_disconnected`, and the engine keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_non_streaming_client_that_disconnects_cancels_the_generation_and_keeps_its_partial_output() {
    use tokio::io::AsyncWriteExt;
    let (proxy, backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/4");
    let script = "word ".repeat(3000);
    trial.push_script([script.clone()]);
    let addr = base.strip_prefix("http://").unwrap();
    let body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "Write a long essay."}]})
        .to_string();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /t/{token}/v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let wait = |what: &str| {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            backend.counts()
        )
    };
    // Well into the generation (prefill + 20 decode steps, each token sent before it is
    // counted), the client goes away without reading a byte.
    while backend.counts().forwards < 21 {
        wait("generation not started");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(sock);
    while backend.counts().cancelled == 0 || trial.generations().is_empty() {
        wait("generation not cancelled");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let counts = backend.counts();
    assert_eq!(
        (counts.cancelled, counts.completed, counts.active),
        (1, 0, 0),
        "{counts:?}"
    );
    assert!(counts.forwards < 3000, "stopped early: {counts:?}");
    let g = &trial.generations()[0];
    assert_eq!(g.status.as_deref(), Some("client_disconnected"));
    check_partial(g, 20, &script);
    assert!(g.output_ids.len() as u64 <= counts.forwards);
    // The engine keeps serving.
    let r = reqwest::Client::new()
        .post(format!("{base}/t/{token}/v1/chat/completions"))
        .json(&json!({"model": "qwen3", "max_tokens": 3, "messages": [{"role": "user", "content": "Briefly."}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let gens = trial.generations();
    assert_eq!(gens.len(), 2);
    check_capture(
        &gens[1],
        Some(&v["usage"]["prompt_tokens"]),
        Some(&v["usage"]["completion_tokens"]),
    );
    assert_eq!(backend.counts().completed, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_stop_strings_end_the_output_and_are_cut_from_the_text() {
    let (proxy, _backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/3");
    // Scripts run on past their stop strings: the engine must end them there.
    let scripts = ["One, two. END and more words", "One\ntwo, three\n\nfour five"];
    trial.push_script(scripts.map(String::from));
    let out = sdk(
        "openai_client.py",
        "stop",
        &json!({"url": format!("{base}/t/{token}/v1")}),
    )
    .await;
    let results = out["results"].as_array().unwrap();
    // (The chat parser trims the content's trailing whitespace, as for any answer.)
    let expected = [("One, two.", "END"), ("One\ntwo,", "three")];
    let gens = trial.generations();
    assert_eq!(gens.len(), 2);
    for (i, (r, (content, stop))) in results.iter().zip(expected).enumerate() {
        assert_eq!(
            r["content"], content,
            "OpenAI returns the text before the stop string"
        );
        assert_eq!(r["finish_reason"], "stop");
        let g = &gens[index_of(&r["id"], "chatcmpl-") as usize];
        check_capture(g, None, Some(&r["usage"]["completion"]));
        assert_eq!(g.extra["stop_string"], stop);
        // The capture is every token sampled, up to and including the one completing the stop
        // string: a prefix of the script's tokens, whose text ends within that token.
        let script_ids = chat().encode(scripts[i]).unwrap();
        assert!(script_ids.starts_with(&g.output_ids), "{:?}", g.output_ids);
        let text = decoded(g);
        let before = chat()
            .decode(&g.output_ids[..g.output_ids.len() - 1], false)
            .unwrap();
        assert!(text.contains(stop) && !before.contains(stop), "{text:?}");
        assert!(text.starts_with(content));
    }
}

/// A vLLM-shaped server whose generate endpoint fails with HTTP 500.
async fn failing_vllm() -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"object": "list", "data": [{"id": "tiny"}]})) }),
        )
        .route(
            "/v1/completions",
            post(|| async {
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(
                        json!({"error": {"message": "CUDA out of memory", "type": "InternalServerError"}}),
                    ),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn sdk_errors_come_in_each_apis_shape_and_are_captured() {
    let mut c = cfg();
    c.max_body_bytes = 64 << 10;
    let (proxy, _backend, base) = start(c.clone()).await;
    let (token, trial) = proxy.register_trial("err/0/0");
    let failing = Proxy::new(
        chat(),
        Arc::new(VllmBackend::new(&failing_vllm().await)),
        c.clone(),
    );
    let (addr, _) = failing.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token_500, trial_500) = failing.register_trial("err/0/1");
    // A backend that is not there: a port that was just free.
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone_url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let down = Proxy::new(chat(), Arc::new(VllmBackend::new(&gone_url)), c.clone());
    let (addr_down, _) = down.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token_down, trial_down) = down.register_trial("err/0/2");
    let config = |suffix: &str| {
        json!({
            "url": format!("{base}/t/{token}{suffix}"),
            "unknown": format!("{base}/t/0123456789abcdef{suffix}"),
            "backend_500": format!("http://{addr}/t/{token_500}{suffix}"),
            "backend_down": format!("http://{addr_down}/t/{token_down}{suffix}"),
            "max_body_bytes": c.max_body_bytes,
            // ~1 token per word: over the tiny model's 4096-token context, under the body limit.
            "context_words": 5000,
            "context": 4096,
        })
    };
    let o = sdk("openai_client.py", "errors", &config("/v1")).await;
    assert!(
        o["context"]["message"].as_str().unwrap().contains("context"),
        "{o}"
    );
    let a = sdk("anthropic_client.py", "errors", &config("")).await;
    assert!(
        a["backend_500"]["message"].as_str().unwrap().contains("500"),
        "{a}"
    );
    // Context overflows are captured for `context_limit` (plain and streamed, each API).
    let gens = trial.generations();
    assert_eq!(gens.len(), 4, "{gens:?}");
    for g in &gens {
        assert_eq!(g.status.as_deref(), Some("context_limit"));
        assert!(g.prompt_ids.len() >= 4096 && g.output_ids.is_empty());
        assert!(g.error.as_deref().unwrap().contains("4096"));
    }
    // Backend failures are captured as infra errors, 2 per SDK (plain and streamed).
    for (t, needle) in [(&trial_500, "500"), (&trial_down, "cannot reach")] {
        let gens = t.generations();
        assert_eq!(gens.len(), 4, "{gens:?}");
        for g in gens {
            assert_eq!(g.status.as_deref(), Some("infra_error"));
            assert!(g.error.as_deref().unwrap().contains(needle), "{:?}", g.error);
            assert!(g.backend.as_deref().unwrap().starts_with("vllm"));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_text_completions_use_the_raw_prompt() {
    let (proxy, _backend, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("sdk/0/3");
    let c = chat();
    let prompt_ids = c.encode("The quick brown fox").unwrap();
    let out = sdk(
        "openai_client.py",
        "completions",
        &json!({"url": format!("{base}/t/{token}/v1"), "prompt_ids": prompt_ids}),
    )
    .await;
    let results = out["results"].as_array().unwrap();
    let gens = trial.generations();
    assert_eq!(gens.len(), 2);
    let prompts = [c.encode("def add(a, b):").unwrap(), prompt_ids];
    for (r, expect) in results.iter().zip(prompts) {
        let g = &gens[index_of(&r["id"], "cmpl-") as usize];
        assert_eq!(g.api, "openai-completions");
        assert_eq!(g.prompt_ids, expect, "no chat template around the prompt");
        check_capture(g, Some(&r["usage"]["prompt"]), Some(&r["usage"]["completion"]));
        assert_eq!(
            c.decode(&g.output_ids, true).unwrap(),
            r["text"].as_str().unwrap()
        );
    }
    assert_eq!(gens[0].sampling.max_tokens, Some(6));
}
