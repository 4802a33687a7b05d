//! The proxy in front of the embedded engine on the tiny Qwen3-MoE: API shapes, captures that are
//! token-exact, faithful prompts across turns, trial tokens, error formats, and every real
//! harness request from the captured traffic.

use std::path::Path;
use std::sync::Arc;

use lego_rl::chat::{ChatFormat, RenderOptions};
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::model::{ForwardInput, Model};
use lego_rl::proxy::{Proxy, ProxyConfig};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

pub(crate) fn chat() -> Arc<ChatFormat> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tokenizer/qwen3");
    Arc::new(
        ChatFormat::from_parts(
            &dir.join("tokenizer.json"),
            &dir.join("tokenizer_config.json"),
            None,
        )
        .unwrap(),
    )
}

async fn start(cfg: ProxyConfig) -> (Proxy, String) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let proxy = Proxy::new(chat(), backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (proxy, format!("http://{addr}"))
}

fn cfg() -> ProxyConfig {
    let mut c = ProxyConfig::default();
    c.sampling.max_tokens = Some(12);
    c.sampling.seed = Some(7);
    c
}

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

const TOOL_CALL: &str = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\", \"timeout\": 10}}\n</tool_call>";

fn bash_tool() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"]}}}])
}

/// Trainer-side recomputation of the captured output log-probs, replaying the captured routing.
pub(crate) fn recompute(
    prompt: &[u32],
    output: &[u32],
    routing: Option<&lego_rl::records::Packed>,
) -> Vec<f32> {
    let model = Model::load(&crate::model::tiny_moe(), Device::Cpu, None).unwrap();
    let _g = tch::no_grad_guard();
    let all: Vec<i64> = prompt.iter().chain(output).map(|&t| t as i64).collect();
    let n = all.len() as i64;
    let tokens = Tensor::from_slice(&all);
    let positions = Tensor::arange(n, (Kind::Int64, Device::Cpu));
    let replay = routing.map(|r| {
        let ids: Vec<i64> = r.to_u32().unwrap().into_iter().map(i64::from).collect();
        let t = Tensor::from_slice(&ids).reshape([r.shape[0] as i64, r.shape[1] as i64, r.shape[2] as i64]);
        // vLLM-style T-1 rows: pad the never-forwarded last position with -1 (route normally).
        let pad = Tensor::full(
            [n - r.shape[0] as i64, r.shape[1] as i64, r.shape[2] as i64],
            -1,
            (Kind::Int64, Device::Cpu),
        );
        Tensor::cat(&[t, pad], 0)
    });
    let mut input = ForwardInput::causal(&tokens, &positions);
    input.replay = replay.as_ref();
    let out = model.lm.forward(&input, None);
    let p = prompt.len() as i64;
    let at = Tensor::arange_start(p - 1, n - 1, (Kind::Int64, Device::Cpu));
    let next = tokens.narrow(0, p, n - p);
    let (lp, _) = model.lm.next_token_logprobs(&out.hidden, &at, &next, false);
    Vec::<f32>::try_from(lp).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_request_is_captured_token_exactly() {
    let (proxy, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("task-1/0/0");
    let body = json!({"model": "qwen3", "messages": [{"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "List the files."}], "tools": bash_tool()});
    let (status, resp) = post(&format!("{base}/t/{token}/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["object"], "chat.completion");
    assert_eq!(resp["choices"][0]["message"]["role"], "assistant");
    let gens = trial.generations();
    assert_eq!(gens.len(), 1);
    let g = &gens[0];
    assert_eq!(g.status.as_deref(), Some("ok"));
    // Rendered mode on the first turn: prompt = tokenize(render(messages)).
    let c = chat();
    let conv = lego_rl::chat::openai::ChatCompletionRequest::from_json(&body.to_string())
        .unwrap()
        .to_conversation()
        .unwrap();
    assert_eq!(
        g.prompt_ids,
        c.prompt_ids(&conv, &RenderOptions::generation(None)).unwrap()
    );
    assert_eq!(resp["usage"]["completion_tokens"], g.output_ids.len());
    let lps = g.logprobs.to_f32().unwrap();
    assert_eq!(lps.len(), g.output_ids.len());
    // Routing covers prompt + output minus the never-forwarded last token, 2 MoE layers, top-2.
    let r = g.routing.as_ref().unwrap();
    assert_eq!(r.shape, vec![g.prompt_ids.len() + g.output_ids.len() - 1, 2, 2]);
    // The trainer's recomputation with replayed routing equals the captured log-probs.
    let again = recompute(&g.prompt_ids, &g.output_ids, g.routing.as_ref());
    let max_diff = lps
        .iter()
        .zip(&again)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        max_diff < 1e-4,
        "captured vs recomputed log-probs differ by {max_diff}"
    );
}

/// `rollout --seed`: each call samples with the configured seed mixed with its trial id and call
/// index, so the same trial reruns identically while the members of a group differ; a seed the
/// request sends is used as is.
#[tokio::test(flavor = "multi_thread")]
async fn configured_seed_is_per_trial_and_call_and_reproducible() {
    let mut c = cfg();
    c.sampling.max_tokens = Some(24);
    c.sampling.temperature = Some(1.0);
    let body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "Say something."}]});
    let run = |c: ProxyConfig, ids: &'static [&'static str]| {
        let body = body.clone();
        async move {
            let (proxy, base) = start(c).await;
            let mut out = Vec::new();
            for id in ids {
                let (token, trial) = proxy.register_trial(id);
                let url = format!("{base}/t/{token}/v1/chat/completions");
                // Two calls with the same prompt; the bodies differ (the same body twice is a
                // client's retry, answered from the first generation).
                for call in 0..2 {
                    let mut body = body.clone();
                    body["max_tokens"] = json!(24 + call);
                    let (status, resp) = post(&url, &body).await;
                    assert_eq!(status, 200, "{resp}");
                }
                let mut seeded = body.clone();
                seeded["seed"] = json!(5);
                let (status, resp) = post(&url, &seeded).await;
                assert_eq!(status, 200, "{resp}");
                out.push(trial.generations());
            }
            out
        }
    };
    let ids: &'static [&'static str] = &["t/0/0", "t/0/1"];
    let first = run(c.clone(), ids).await;
    for (id, gens) in ids.iter().zip(&first) {
        for g in &gens[..2] {
            assert_eq!(g.sampling.seed, Some(lego_rl::proxy::call_seed(7, id, g.index)));
        }
        assert_eq!(gens[2].sampling.seed, Some(5), "the request's own seed is kept");
    }
    // Same prompt, different trials and calls: different seeds, and (at temperature 1 over a
    // 151936-token vocabulary) different samples.
    assert_ne!(first[0][0].sampling.seed, first[1][0].sampling.seed);
    assert_ne!(first[0][0].sampling.seed, first[0][1].sampling.seed);
    assert_eq!(first[0][0].prompt_ids, first[1][0].prompt_ids);
    assert_ne!(first[0][0].output_ids, first[1][0].output_ids);
    // A rerun of the same trials on a fresh proxy samples exactly the same tokens.
    let again = run(c, ids).await;
    for (a, b) in first.iter().zip(&again) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.output_ids, y.output_ids);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn faithful_mode_reuses_captured_tokens_when_the_harness_reserializes_arguments() {
    let (proxy, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("task-1/0/1");
    // Qwen3 in thinking mode opens every turn with a think block (the template relies on it).
    trial.push_script([
        format!("<think>\nList them.\n</think>\n\n{TOOL_CALL}"),
        "<think>\nok\n</think>\n\nDone.".to_string(),
    ]);
    let url = format!("{base}/t/{token}/v1/chat/completions");
    let mut messages = vec![json!({"role": "user", "content": "List the files."})];
    let (status, resp) = post(&url, &json!({"messages": messages, "tools": bash_tool()})).await;
    assert_eq!(status, 200, "{resp}");
    let msg = &resp["choices"][0]["message"];
    assert_eq!(resp["choices"][0]["finish_reason"], "tool_calls", "{resp}");
    let call = &msg["tool_calls"][0];
    assert_eq!(call["function"]["name"], "bash");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"command": "ls -la", "timeout": 10}));
    // The harness echoes the call with re-serialized arguments (other key order, spacing).
    messages.push(
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": call["id"], "type": "function",
        "function": {"name": "bash", "arguments": "{\"timeout\":10,\"command\":\"ls -la\"}"}}]}),
    );
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "a.py\nb.py"}));
    let (status, resp) = post(&url, &json!({"messages": messages, "tools": bash_tool()})).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["choices"][0]["message"]["content"], "Done.");
    let gens = trial.generations();
    assert_eq!(
        gens[0].tool_call_ids,
        vec![call["id"].as_str().unwrap().to_string()]
    );
    // Each answer is captured as returned: the last one is echoed by no request.
    let first = gens[0].response.as_ref().unwrap();
    assert_eq!(first.tool_calls[0].name, "bash");
    assert_eq!(first.tool_calls[0].id, call["id"].as_str().unwrap());
    assert_eq!(gens[1].response.as_ref().unwrap().text, "Done.");
    assert_eq!(
        gens[1].prompt_mode,
        lego_rl::records::PromptMode::Faithful,
        "{:?}",
        gens[1].extra
    );
    // Turn 2's prompt starts with exactly turn 1's prompt and sampled output tokens.
    let first: Vec<u32> = gens[0]
        .prompt_ids
        .iter()
        .chain(&gens[0].output_ids)
        .copied()
        .collect();
    assert_eq!(&gens[1].prompt_ids[..first.len()], &first[..]);
    // Forced tokens still get their true log-probs.
    let again = recompute(&gens[1].prompt_ids, &gens[1].output_ids, gens[1].routing.as_ref());
    let lps = gens[1].logprobs.to_f32().unwrap();
    assert!(lps.iter().zip(&again).all(|(a, b)| (a - b).abs() < 1e-4));
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_stream_has_the_documented_event_order() {
    let (proxy, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("t");
    trial.push_script([format!("<think>\nlook first\n</think>\n\n{TOOL_CALL}")]);
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        // The schema declares what TOOL_CALL passes (an undeclared parameter is rejected).
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let r = reqwest::Client::new()
        .post(format!("{base}/t/{token}/v1/messages?beta=true"))
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let mut events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    // Deltas stream token by token: compare runs of them as one.
    events.dedup();
    assert_eq!(
        events,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    assert!(
        text.contains("\"thinking_delta\"")
            && text.contains("\"signature_delta\"")
            && text.contains("\"input_json_delta\"")
    );
    assert!(text.contains("\"stop_reason\":\"tool_use\""));
    let g = &trial.generations()[0];
    assert_eq!(g.api, "anthropic");
    assert!(g.tool_call_ids[0].starts_with("toolu_"), "{:?}", g.tool_call_ids);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_limits_and_errors_use_each_apis_format() {
    let mut c = cfg();
    c.max_body_bytes = 4096;
    let (_proxy, base) = start(c).await;
    let (s, v) = post(
        &format!("{base}/t/nope/v1/chat/completions"),
        &json!({"messages": []}),
    )
    .await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let (s, v) = post(&format!("{base}/t/nope/v1/messages"), &json!({"messages": []})).await;
    assert_eq!(s, 401);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    // Plain paths need a token unless the proxy runs standalone.
    let (s, _) = post(&format!("{base}/v1/chat/completions"), &json!({"messages": []})).await;
    assert_eq!(s, 401);
    let r = reqwest::Client::new()
        .head(format!("{base}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_get_400_and_413() {
    let mut c = cfg();
    c.max_body_bytes = 4096;
    let (proxy, base) = start(c).await;
    let (token, _) = proxy.register_trial("t");
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{base}/t/{token}/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("not valid JSON"));
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(10_000)}]});
    let (s, v) = post(&format!("{base}/t/{token}/v1/messages"), &big).await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["type"], "request_too_large");
    let (s, v) = post(
        &format!("{base}/t/{token}/v1/chat/completions"),
        &json!({"messages": [{"role": "wizard", "content": "x"}]}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("wizard"), "{v}");
}

/// Every request four real harnesses sent (testdata/harness-traffic) gets a well-formed answer.
#[tokio::test(flavor = "multi_thread")]
async fn every_captured_harness_request_is_answered() {
    let mut c = cfg();
    c.sampling.max_tokens = Some(4);
    let (proxy, base) = start(c).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/harness-traffic");
    let mut files = Vec::new();
    for entry in walk(&root) {
        if entry.file_name().is_some_and(|n| n == "requests.jsonl") {
            files.push(entry);
        }
    }
    assert!(files.len() >= 6, "{files:?}");
    let client = reqwest::Client::new();
    let mut answered = 0;
    let mut too_long = 0;
    let mut gens = Vec::new();
    for f in files {
        // Each capture is one harness run: one trial (two runs may start with the same request).
        let (token, trial) = proxy.register_trial(&f.display().to_string());
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let req: Value = serde_json::from_str(line).unwrap();
            let path = req["path"].as_str().unwrap();
            let method = req["method"].as_str().unwrap();
            let url = format!("{base}/t/{token}{path}");
            let r = match method {
                "HEAD" => client.head(&url).send().await.unwrap(),
                "GET" => client.get(&url).send().await.unwrap(),
                _ => client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(req["body_raw"].as_str().unwrap().to_string())
                    .send()
                    .await
                    .unwrap(),
            };
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            if status == 400 && method == "POST" {
                // Longer than the tiny model's 4096-token context: refused up front, in the API's format.
                let v: Value = serde_json::from_str(&text).unwrap();
                let msg = v["error"]["message"].as_str().unwrap();
                if path.contains("/messages") {
                    assert_eq!(v["type"], "error", "{v}");
                    assert!(
                        msg.starts_with("prompt is too long: ") && msg.ends_with(" maximum"),
                        "{msg}"
                    );
                } else {
                    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
                    assert!(msg.contains("maximum context length is 4096 tokens"), "{msg}");
                }
                too_long += 1;
                continue;
            }
            assert_eq!(status, 200, "{} {path} from {}: {text}", method, f.display());
            if method == "POST" {
                let streaming = req["body"]["stream"].as_bool().unwrap_or(false);
                if streaming {
                    assert!(text.contains("data: "), "{text}");
                    if path.contains("/messages") {
                        assert!(text.contains("event: message_stop"), "{text}");
                    } else {
                        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                    }
                } else {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    assert!(
                        v["choices"][0]["message"].is_object() || v["content"].is_array(),
                        "{v}"
                    );
                }
                answered += 1;
            }
        }
        gens.extend(trial.generations());
    }
    assert!(
        answered >= 10 && answered + too_long >= 30,
        "{answered} answered, {too_long} over the context"
    );
    // Prompts over the context are captured too, marked for `context_limit`.
    assert_eq!(gens.len(), answered + too_long);
    let over = gens
        .iter()
        .filter(|g| g.status.as_deref() == Some("context_limit"))
        .count();
    assert_eq!(over, too_long);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_stop_sequences_answer_stop_sequence_and_cut_the_text() {
    let (proxy, base) = start(cfg()).await;
    let (token, trial) = proxy.register_trial("stop");
    trial.push_script([
        "Alpha beta</done> gamma".to_string(),
        "Alpha beta</done> gamma".to_string(),
    ]);
    let body = |stream: bool| {
        json!({"model": "claude", "max_tokens": 64, "stream": stream, "stop_sequences": ["</done>", "zzz"],
            "messages": [{"role": "user", "content": "go"}]})
    };
    let (status, resp) = post(&format!("{base}/t/{token}/v1/messages"), &body(false)).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["stop_reason"], "stop_sequence");
    assert_eq!(resp["stop_sequence"], "</done>");
    assert_eq!(resp["content"][0]["text"], "Alpha beta");
    let r = reqwest::Client::new()
        .post(format!("{base}/t/{token}/v1/messages"))
        .json(&body(true))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let streamed: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["delta"]["type"] == "text_delta")
        .map(|v| v["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, "Alpha beta", "the stop string never streams: {text}");
    assert!(
        text.contains(r#""stop_reason":"stop_sequence","stop_sequence":"</done>""#),
        "{text}"
    );
    for g in trial.generations() {
        assert_eq!(g.extra["stop_string"], "</done>");
        let out = chat().decode(&g.output_ids, false).unwrap();
        assert!(out.ends_with("</done>") || out.contains("</done>"), "{out}");
        assert!(!out.contains("gamma") && !out.contains("<|im_end|>"), "{out}");
        assert_eq!(g.logprobs.to_f32().unwrap().len(), g.output_ids.len());
    }
}

/// A prompt over `max_context` is refused in each API's words and recorded as `context_limit`;
/// the scripted output it did not use goes to the next request; rollout's `classify` on what the
/// proxy itself recorded: `context_limit` when the last request was refused, the harness's own
/// outcome when it recovered (compacted and went on).
#[tokio::test(flavor = "multi_thread")]
async fn context_refusals_are_recorded_and_decide_the_termination_only_when_last() {
    use lego_rl::harness::Harness;
    use lego_rl::records::{Termination, CONTEXT_LIMIT};
    use lego_rl::rollout::judge::classify;

    let mut c = cfg();
    c.max_context = Some(64);
    let (proxy, base) = start(c).await;
    let (token, trial) = proxy.register_trial("ctx/0/0");
    trial.push_script(["Short answer.".to_string()]);
    let long = "hello ".repeat(80);
    let anthropic =
        |text: &str| json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]});
    let (s, v) = post(&format!("{base}/t/{token}/v1/messages"), &anthropic(&long)).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let msg = v["error"]["message"].as_str().unwrap();
    let (prompt, max) = msg
        .strip_prefix("prompt is too long: ")
        .and_then(|m| m.strip_suffix(" maximum"))
        .and_then(|m| m.split_once(" tokens > "))
        .unwrap_or_else(|| panic!("not Anthropic's wording: {msg}"));
    assert!(prompt.parse::<usize>().unwrap() > 64 && max == "63", "{msg}");
    let openai = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": long}]});
    let (s, v) = post(&format!("{base}/t/{token}/v1/chat/completions"), &openai).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (400, &json!("context_length_exceeded")),
        "{v}"
    );

    let harness = Harness::load(&crate::common::root().join("examples/harnesses/claude-code.toml"))
        .unwrap()
        .config;
    let refused = trial.generations();
    assert_eq!(refused.len(), 2);
    for g in &refused {
        assert_eq!(g.status.as_deref(), Some(CONTEXT_LIMIT), "{g:?}");
        assert!(g.output_ids.is_empty() && g.prompt_ids.len() >= 64);
    }
    // The harness printed its error and exited 0 ("success" in its stream): the episode still
    // ended on the context limit.
    assert_eq!(
        classify(
            &Termination::Finished,
            Some(0),
            &refused,
            &harness,
            Some("success")
        ),
        Termination::ContextLimit
    );
    // It compacts and asks again with a prompt that fits: the scripted output was kept for it.
    let (s, v) = post(&format!("{base}/t/{token}/v1/messages"), &anthropic("hi")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["content"][0]["text"], "Short answer.");
    let recovered = trial.generations();
    assert_eq!(recovered.last().unwrap().status.as_deref(), Some("ok"));
    assert_eq!(
        classify(
            &Termination::Finished,
            Some(0),
            &recovered,
            &harness,
            Some("success")
        ),
        Termination::Finished
    );
}

/// `rollout --reload-in-flight`: a weight swap waits for the generation in flight, which keeps
/// the old weights and records version 0; a request that arrives during the swap runs after it
/// and records version 1. Without the proxy's lock the engine would queue its reload behind the
/// running generation and serve that request after it, on the new weights, while the capture,
/// reading the version before the swap ended, named the old one.
#[tokio::test(flavor = "multi_thread")]
async fn a_weight_swap_waits_for_the_generation_in_flight_and_labels_the_next_with_its_version() {
    let dir = crate::model::tiny_moe();
    let backend = Arc::new(EmbeddedBackend::start(&dir, Device::Cpu).unwrap());
    let proxy = Proxy::new(chat(), backend.clone(), ProxyConfig::default());
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token, trial) = proxy.register_trial("task-1/0/0");
    let url = format!("http://{addr}/t/{token}/v1/chat/completions");
    let body = |content: &str, max: u32| json!({"model": "qwen3", "messages": [{"role": "user", "content": content}], "max_tokens": max, "seed": 1});
    let t0 = std::time::Instant::now();
    // A long generation (a random tiny model almost never ends a turn early).
    let long = tokio::spawn({
        let (url, body) = (url.clone(), body("a long answer", 1500));
        async move {
            let r = post(&url, &body).await;
            (r, t0.elapsed())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let swap = tokio::spawn({
        let (proxy, backend, dir) = (proxy.clone(), backend.clone(), dir.clone());
        async move {
            let r = proxy
                .swap_weights(1, lego_rl::engine::Backend::reload(backend.as_ref(), &dir))
                .await;
            (r.map(|_| ()), t0.elapsed())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let sent = t0.elapsed();
    let (status, resp) = post(&url, &body("a short one", 4)).await;
    assert_eq!(status, 200, "{resp}");
    let ((status, resp), long_done) = long.await.unwrap();
    assert_eq!(status, 200, "{resp}");
    let (swapped, swap_done) = swap.await.unwrap();
    swapped.unwrap();
    assert!(
        long_done > sent && swap_done > sent,
        "the long generation ({long_done:?}) and the swap ({swap_done:?}) were still running when \
         the short request was sent ({sent:?})"
    );
    let gens = trial.generations();
    let versions: Vec<(usize, u64)> = gens
        .iter()
        .map(|g| (g.output_ids.len(), g.policy_version))
        .collect();
    assert_eq!(gens.len(), 2, "{versions:?}");
    let short = gens
        .iter()
        .find(|g| g.output_ids.len() <= 4)
        .expect("the short generation");
    let long = gens
        .iter()
        .find(|g| g.output_ids.len() > 4)
        .expect("the long generation");
    assert_eq!(
        (long.policy_version, short.policy_version),
        (0, 1),
        "{versions:?}"
    );
}
