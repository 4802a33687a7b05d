//! Driver for scripts/bench/proxy_overhead.sh: the pieces of the proxy-overhead comparison, each
//! run as its own process so no two share a runtime.
//!
//!   proxy_overhead fake PORT TOKENS
//!       A fast fake backend answering at once, in two shapes of the same answer (TOKENS tokens):
//!       vLLM's `POST /v1/completions` with a token-id prompt (what lego-rl's `vllm:` backend
//!       calls: `choices[0].token_ids`, `logprobs.token_logprobs`) and OpenAI's streaming
//!       `POST /v1/chat/completions` (what LiteLLM's `openai/` provider calls), plus `GET /v1/models`.
//!   proxy_overhead lego PORT BACKEND_URL TOKENIZER_DIR
//!       The lego-rl proxy (anonymous plain paths) over the `vllm:` backend at BACKEND_URL.
//!   proxy_overhead load URL CLIENTS SECONDS
//!       CLIENTS concurrent clients, each sending streaming chat completions to URL back to back
//!       for SECONDS (after a 1 s warm-up); latency = request sent → `data: [DONE]` read. Prints
//!       `key=value` lines: requests, req/s, latency p50/p99 in ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};

const WORD_IDS: [u32; 4] = [9707, 1879, 1052, 13]; // a few ordinary Qwen token ids

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("fake") if a.len() == 4 => fake(a[2].parse()?, a[3].parse()?).await,
        Some("lego") if a.len() == 5 => lego(a[2].parse()?, &a[3], &a[4]).await,
        Some("load") if a.len() == 5 => load(&a[2], a[3].parse()?, a[4].parse()?).await,
        _ => anyhow::bail!(
            "usage: proxy_overhead fake PORT TOKENS | lego PORT BACKEND_URL TOKENIZER_DIR | load URL CLIENTS SECONDS"
        ),
    }
}

async fn fake(port: u16, tokens: usize) -> anyhow::Result<()> {
    // The vLLM answer: TOKENS ids ending with <|im_end|> (151645), finish "stop".
    let mut ids: Vec<u32> = (0..tokens - 1).map(|i| WORD_IDS[i % WORD_IDS.len()]).collect();
    ids.push(151645);
    let vllm = Arc::new(json!({
        "id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "text": "", "finish_reason": "stop", "token_ids": ids,
            "logprobs": {"token_logprobs": vec![-0.5f32; tokens],
                "tokens": ids.iter().map(|i| format!("token_id:{i}")).collect::<Vec<_>>()}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
    }));
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "fake", "object": "model"}]})) }),
        )
        .route(
            "/v1/completions",
            post(move || {
                let v = vllm.clone();
                async move { Json((*v).clone()) }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |Json(req): Json<Value>| async move { chat(tokens, &req) }),
        );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// The same answer as OpenAI chat: TOKENS content chunks ("Hello" / " world" …), then the finish
/// chunk, a usage chunk and `[DONE]` when streaming; one JSON object otherwise.
fn chat(tokens: usize, req: &Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    let words = ["Hello", " world", " it", "."];
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    if req["stream"].as_bool() != Some(true) {
        let text: String = (0..tokens - 1).map(|i| words[i % words.len()]).collect();
        return Json(json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}}))
        .into_response();
    }
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    for i in 0..tokens - 1 {
        events.push(chunk(json!({"content": words[i % words.len()]}), Value::Null));
    }
    events.push(chunk(json!({}), json!("stop")));
    events.push(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
        "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}}));
    let mut sse: Vec<Event> = events
        .iter()
        .map(|e| Event::default().data(e.to_string()))
        .collect();
    sse.push(Event::default().data("[DONE]"));
    Sse::new(futures::stream::iter(
        sse.into_iter().map(Ok::<_, std::convert::Infallible>),
    ))
    .into_response()
}

async fn lego(port: u16, backend: &str, tokenizer: &str) -> anyhow::Result<()> {
    let dir = std::path::Path::new(tokenizer);
    let chat = Arc::new(lego_rl::chat::ChatFormat::from_parts(
        &dir.join("tokenizer.json"),
        &dir.join("tokenizer_config.json"),
        None,
    )?);
    let backend = Arc::new(lego_rl::engine::vllm::VllmBackend::new(backend));
    let cfg = lego_rl::proxy::ProxyConfig {
        allow_anonymous: true,
        ..Default::default()
    };
    let proxy = lego_rl::proxy::Proxy::new(chat, backend, cfg);
    let (_, handle) = proxy.serve(([127, 0, 0, 1], port).into()).await?;
    handle.await?;
    Ok(())
}

async fn load(url: &str, clients: usize, seconds: f64) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()?;
    let body = json!({"model": "fake", "stream": true, "max_tokens": 64,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "You are a coding agent."},
                     {"role": "user", "content": "Fix the failing test in tests/test_parser.py."}]});
    let one = |http: reqwest::Client, body: Value, url: String| async move {
        let t = Instant::now();
        let resp = http.post(&url).json(&body).send().await?;
        anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
        let mut s = resp.bytes_stream();
        let mut tail = Vec::new();
        while let Some(chunk) = s.next().await {
            tail.extend_from_slice(&chunk?);
            if tail.len() > 64 {
                tail.drain(..tail.len() - 64);
            }
        }
        let text = String::from_utf8_lossy(&tail);
        anyhow::ensure!(text.contains("[DONE]"), "stream did not end with [DONE]: {text}");
        Ok::<_, anyhow::Error>(t.elapsed())
    };
    // Warm-up: connections opened, caches filled.
    let warm_until = Instant::now() + Duration::from_secs(1);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, body, url) = (http.clone(), body.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < warm_until {
                one(http.clone(), body.clone(), url.clone()).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, body, url) = (http.clone(), body.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < until {
                lat.push(one(http.clone(), body.clone(), url.clone()).await?);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let wall = start.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    println!("requests={}", lat.len());
    println!("req_per_s={:.1}", lat.len() as f64 / wall);
    println!("p50_ms={:.3}", pct(0.50));
    println!("p99_ms={:.3}", pct(0.99));
    Ok(())
}
