//! The proxy's retry guard: the official `openai` and `anthropic` SDKs with a client timeout
//! shorter than the first generation give up and retry it (`x-stainless-retry-count` > 0). The
//! retry is answered from that generation: one capture per turn, the same answer, and align finds
//! one assistant message per turn.

use std::sync::Arc;

use lego_rl::align::{align_trajectory, MatchMode, Settings};
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::{Generation, Trajectory};
use serde_json::{json, Value};
use tch::Device;

use super::proxy::chat;
use super::proxy_sdk::sdk;

/// Words of the first answer: 150 decode steps, well over the client's 50 ms.
const WORDS: usize = 150;

/// A long scripted first answer, then a short second one.
fn scripts() -> [String; 2] {
    [
        format!("<think>\nLook.\n</think>\n\n{}", "word ".repeat(WORDS).trim_end()),
        "<think>\nFix.\n</think>\n\nDone.".to_string(),
    ]
}

async fn run(script: &str, url_suffix: &str) -> (Value, Vec<Generation>) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    // A grace longer than the SDK's backoff over 4 retries (0.5 + 1 + 2 + 4 s at most), so that
    // the generation outlives every gap between attempts however slow the machine.
    let cfg = ProxyConfig {
        retry_grace: std::time::Duration::from_secs(10),
        ..ProxyConfig::default()
    };
    let proxy = Proxy::new(chat(), backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token, trial) = proxy.register_trial("retry/0/0");
    trial.push_script(scripts());
    let url = format!("http://{addr}/t/{token}{url_suffix}");
    let out = sdk(
        script,
        "retry",
        &json!({"url": url, "timeout": 0.05, "max_retries": 4}),
    )
    .await;
    let gens = trial.generations();
    assert_eq!(trial.replays() as i64, out["retries"].as_i64().unwrap(), "{out}");
    (out, gens)
}

/// One capture per turn, the first answered to its retries too, and one aligned message per turn.
fn check(out: &Value, gens: &[Generation], first_text: &str) {
    assert!(
        out["retries"].as_u64().unwrap() >= 1,
        "the client timed out and retried: {out}"
    );
    assert_eq!(gens.len(), 2, "one capture per turn: {gens:#?}");
    assert!(
        gens.iter().all(|g| g.status.as_deref() == Some("ok")),
        "{gens:#?}"
    );
    assert_eq!(gens[0].extra["replays"], out["retries"]);
    assert!(gens[1].extra.get("replays").is_none());
    let text = chat().decode(&gens[0].output_ids, false).unwrap();
    assert!(text.contains(first_text.trim()), "{text}");
    let t = Trajectory::new("retry", 0, 0, "test", "test", gens.to_vec());
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tokenizer/qwen3");
    let settings = Settings::new(MatchMode::Strict, Some(&tokenizer)).unwrap();
    let (samples, stats) = align_trajectory(&t, &settings).unwrap();
    // Each turn is aligned once (Qwen3's template drops the first turn's reasoning from the
    // second prompt, so the second turn starts a segment of its own: two samples, one per turn).
    assert_eq!((stats.aligned_turns, stats.dropped_turns), (2, 0), "{stats:?}");
    assert_eq!(samples.len() as u64, stats.segments, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_retry_after_a_client_timeout_is_answered_from_the_first_generation() {
    let (out, gens) = run("openai_client.py", "/v1").await;
    let words = "word ".repeat(WORDS);
    assert_eq!(
        out["first"]["content"].as_str().unwrap(),
        words.trim_end(),
        "{out}"
    );
    check(&out, &gens, &words);
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_retry_after_a_client_timeout_is_answered_from_the_first_generation() {
    let (out, gens) = run("anthropic_client.py", "").await;
    let words = "word ".repeat(WORDS);
    let text: Vec<&Value> = out["first"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .collect();
    assert_eq!(text[0]["text"].as_str().unwrap(), words.trim_end(), "{out}");
    check(&out, &gens, &words);
}

/// A streaming request whose client goes away mid-stream, then the same request again (a client
/// that reconnects): the second is streamed the whole generation from its first token, and only
/// one generation is captured.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_streaming_request_is_streamed_again_from_the_same_generation() {
    use futures::StreamExt;
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let proxy = Proxy::new(chat(), backend, ProxyConfig::default());
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token, trial) = proxy.register_trial("retry/0/1");
    let [long, _] = scripts();
    trial.push_script([long.clone()]);
    let url = format!("http://{addr}/t/{token}/v1/chat/completions");
    let body = json!({"model": "qwen3", "stream": true,
        "messages": [{"role": "user", "content": "Describe the repository."}]});
    let client = reqwest::Client::new();
    let first = client.post(&url).json(&body).send().await.unwrap();
    let mut chunks = first.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        let c = chunks.next().await.unwrap().unwrap();
        seen += String::from_utf8_lossy(&c).matches("\"content\"").count();
    }
    drop(chunks);
    let second = client.post(&url).json(&body).send().await.unwrap();
    let text = second.text().await.unwrap();
    let mut content = String::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(v) = serde_json::from_str::<Value>(line) {
            content.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(content, "word ".repeat(WORDS).trim_end(), "{text}");
    let gens = trial.generations();
    assert_eq!(gens.len(), 1, "{gens:#?}");
    assert_eq!(gens[0].status.as_deref(), Some("ok"));
    assert_eq!(gens[0].extra["replays"], json!(1));
}

/// A proxy on the tiny MoE with `grace` and a trial with `script` queued.
async fn proxy_with(grace: std::time::Duration, script: Vec<String>) -> (String, Arc<lego_rl::proxy::Trial>, Proxy) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let cfg = ProxyConfig {
        retry_grace: grace,
        ..ProxyConfig::default()
    };
    let proxy = Proxy::new(chat(), backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (token, trial) = proxy.register_trial("retry/0/2");
    trial.push_script(script);
    (format!("http://{addr}/t/{token}/v1/chat/completions"), trial, proxy)
}

/// Starts a streaming request and goes away after its first three content chunks.
async fn stream_then_leave(client: &reqwest::Client, url: &str, body: &Value) {
    use futures::StreamExt;
    let first = client.post(url).json(body).send().await.unwrap();
    let mut chunks = first.bytes_stream();
    let mut seen = 0;
    while seen < 3 {
        let c = chunks.next().await.unwrap().unwrap();
        seen += String::from_utf8_lossy(&c).matches("\"content\"").count();
    }
}

/// The trial's captures once there are `n` (a flight whose client left is captured when the
/// grace ends and it is cancelled, or when it finishes).
async fn captures_when(trial: &lego_rl::proxy::Trial, n: usize) -> Vec<Generation> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let gens = trial.generations();
        if gens.len() >= n || std::time::Instant::now() > deadline {
            return gens;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// An announced retry (`x-stainless-retry-count` > 0) with the same messages is the same turn even
/// when its other fields differ (an SDK may adjust `max_tokens` or a harness its sampling between
/// attempts): it joins the first generation. The same request unannounced is a new turn: a second
/// generation.
#[tokio::test(flavor = "multi_thread")]
async fn an_announced_retry_with_other_fields_changed_joins_the_generation_and_an_unannounced_one_does_not() {
    let [long, _] = scripts();
    let messages = json!([{"role": "user", "content": "Describe the repository."}]);
    let first = json!({"model": "qwen3", "stream": true, "max_tokens": 400, "messages": messages});
    let again = json!({"model": "qwen3", "max_tokens": 300, "temperature": 0.9, "messages": messages});
    for announced in [true, false] {
        let (url, trial, _proxy) =
            proxy_with(std::time::Duration::from_secs(10), vec![long.clone(), long.clone()]).await;
        let client = reqwest::Client::new();
        stream_then_leave(&client, &url, &first).await;
        let mut req = client.post(&url).json(&again);
        if announced {
            req = req.header("x-stainless-retry-count", "1");
        }
        let answer: Value = req.send().await.unwrap().json().await.unwrap();
        let content = answer["choices"][0]["message"]["content"].as_str().unwrap_or("");
        assert!(content.contains(&"word ".repeat(WORDS).trim_end().to_string()), "{answer}");
        if announced {
            let gens = captures_when(&trial, 1).await;
            assert_eq!(gens.len(), 1, "{gens:#?}");
            assert_eq!(gens[0].status.as_deref(), Some("ok"));
            assert_eq!(gens[0].extra["replays"], json!(1));
        } else {
            let gens = captures_when(&trial, 2).await;
            assert_eq!(gens.len(), 2, "a second generation: {gens:#?}");
            assert!(gens.iter().all(|g| g.extra.get("replays").is_none()), "{gens:#?}");
        }
    }
}

/// A generation whose client went away and never came back runs on for the grace, then is
/// cancelled: captured `client_disconnected` with the tokens it made, more than the client saw
/// and fewer than its script.
#[tokio::test(flavor = "multi_thread")]
async fn a_generation_left_by_its_client_is_cancelled_after_the_grace() {
    const LONG: usize = 3000;
    let script = format!("<think>\nLook.\n</think>\n\n{}", "word ".repeat(LONG).trim_end());
    let (url, trial, _proxy) = proxy_with(std::time::Duration::from_secs(1), vec![script]).await;
    let body = json!({"model": "qwen3", "stream": true, "max_tokens": 4000,
        "messages": [{"role": "user", "content": "Describe the repository."}]});
    stream_then_leave(&reqwest::Client::new(), &url, &body).await;
    let gens = captures_when(&trial, 1).await;
    assert_eq!(gens.len(), 1, "{gens:#?}");
    let g = &gens[0];
    assert_eq!(g.status.as_deref(), Some("client_disconnected"), "{g:#?}");
    assert_eq!(g.finish_reason, "cancelled");
    let made = g.output_ids.len();
    // It ran on after the client left (the client saw 3 chunks; the grace is hundreds of
    // decode steps even on a slow machine), and stopped long before its script ended.
    assert!(made > 20 && made < LONG, "{made} tokens");
    eprintln!("left after 3 chunks; cancelled after the 1 s grace at {made} of ~{LONG} tokens");
}

/// The README's retry grace: a generation whose client went away keeps running 3 s by default,
/// longer than the SDKs' first retry delays (0.4–1 s, asserted on the real SDKs above with a
/// longer grace).
#[test]
fn the_retry_grace_is_three_seconds_by_default() {
    assert_eq!(
        ProxyConfig::default().retry_grace,
        std::time::Duration::from_secs(3)
    );
}
