//! Driver for scripts/bench/proxy.sh: decode throughput of the embedded engine on a checkpoint,
//! called directly through the `Backend` trait and through the proxy over HTTP (OpenAI streaming
//! chat completions, the way harnesses call it), with the same load in the same run.
//!
//!   proxy_bench CHECKPOINT_DIR TOKENIZER_DIR CLIENTS REQUESTS_PER_CLIENT MAX_TOKENS
//!
//! Prints one `key=value` line per measurement.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use lego_rl::chat::{ChatFormat, Conversation, Message, RenderOptions, Role};
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::{Backend, GenerateRequest};
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::Sampling;
use serde_json::json;

fn prompt(i: usize) -> String {
    format!("Request {i}: write a short story about a robot that learns to fix bugs.")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() == 6,
        "usage: proxy_bench CHECKPOINT TOKENIZER_DIR CLIENTS REQUESTS MAX_TOKENS"
    );
    let (ckpt, tok) = (Path::new(&a[1]), Path::new(&a[2]));
    let clients: usize = a[3].parse()?;
    let per_client: usize = a[4].parse()?;
    let max_tokens: u32 = a[5].parse()?;
    let chat = Arc::new(ChatFormat::from_parts(
        &tok.join("tokenizer.json"),
        &tok.join("tokenizer_config.json"),
        None,
    )?);
    let backend = Arc::new(EmbeddedBackend::start(ckpt, tch::Device::Cpu)?);
    // Same seeded sampling and stop tokens both ways, so both paths decode the same tokens.
    let sampling = Sampling {
        temperature: Some(1.0),
        max_tokens: Some(max_tokens),
        seed: Some(1),
        ..Default::default()
    };
    let special = chat.special();
    let stops: Vec<u32> = [special.im_end, special.endoftext]
        .into_iter()
        .flatten()
        .collect();

    // Warm-up.
    let conv = |i: usize| Conversation {
        messages: vec![Message::text(Role::User, prompt(i))],
        ..Default::default()
    };
    let ids = chat.prompt_ids(&conv(0), &RenderOptions::generation(None))?;
    backend
        .generate(GenerateRequest {
            prompt_ids: ids,
            sampling: sampling.clone(),
            stop_token_ids: stops.clone(),
            return_routing: true,
            forced_output: None,
        })
        .await?;

    // The proxy: streaming chat completions over HTTP, one trial per client.
    let cfg = ProxyConfig {
        sampling: sampling.clone(),
        ..Default::default()
    };
    let proxy = Proxy::new(chat.clone(), backend.clone(), cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse()?).await?;
    let http = reqwest::Client::new();
    // Alternate the two paths (direct, proxy, direct, proxy) so a change of machine load
    // during the run affects both alike.
    let (mut direct_tokens, mut direct_s, mut proxy_tokens, mut proxy_s) = (0, 0.0, 0, 0.0);
    for round in 0..2 {
        let (n, s) = direct(&backend, &chat, &sampling, &stops, clients, per_client).await?;
        direct_tokens += n;
        direct_s += s;
        let (n, s) = through_proxy(&proxy, &http, addr, clients, per_client, max_tokens, round).await?;
        proxy_tokens += n;
        proxy_s += s;
    }
    println!("clients={clients}");
    println!("requests={}", 2 * clients * per_client);
    println!("direct_tokens={direct_tokens}");
    println!("direct_seconds={direct_s:.3}");
    println!("direct_tok_per_s={:.1}", direct_tokens as f64 / direct_s);
    println!("proxy_tokens={proxy_tokens}");
    println!("proxy_seconds={proxy_s:.3}");
    println!("proxy_tok_per_s={:.1}", proxy_tokens as f64 / proxy_s);
    Ok(())
}

/// The same rendered prompts, straight to the engine; returns (tokens, seconds).
async fn direct(
    backend: &Arc<EmbeddedBackend>,
    chat: &Arc<ChatFormat>,
    sampling: &Sampling,
    stops: &[u32],
    clients: usize,
    per_client: usize,
) -> anyhow::Result<(usize, f64)> {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (backend, chat, sampling, stops) =
            (backend.clone(), chat.clone(), sampling.clone(), stops.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut tokens = 0usize;
            for r in 0..per_client {
                let conv = Conversation {
                    messages: vec![Message::text(Role::User, prompt(c * per_client + r))],
                    ..Default::default()
                };
                let ids = chat.prompt_ids(&conv, &RenderOptions::generation(None)).unwrap();
                let out = backend
                    .generate(GenerateRequest {
                        prompt_ids: ids,
                        sampling: sampling.clone(),
                        stop_token_ids: stops.clone(),
                        return_routing: true,
                        forced_output: None,
                    })
                    .await
                    .unwrap();
                tokens += out.output_ids.len();
            }
            tokens
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await?;
    }
    Ok((n, t.elapsed().as_secs_f64()))
}

/// Streaming chat completions over HTTP through the proxy, one trial per client.
async fn through_proxy(
    proxy: &Proxy,
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    clients: usize,
    per_client: usize,
    max_tokens: u32,
    round: usize,
) -> anyhow::Result<(usize, f64)> {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (token, trial) = proxy.register_trial(&format!("bench/{c}/{round}"));
        let url = format!("http://{addr}/t/{token}/v1/chat/completions");
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            for r in 0..per_client {
                let body = json!({"model": "policy", "stream": true, "max_tokens": max_tokens, "seed": 1,
                    "messages": [{"role": "user", "content": prompt(c * per_client + r)}]});
                let resp = http.post(&url).json(&body).send().await.unwrap();
                assert!(resp.status().is_success());
                let mut s = resp.bytes_stream();
                while let Some(chunk) = s.next().await {
                    chunk.unwrap();
                }
            }
            trial
                .generations()
                .iter()
                .map(|g| g.output_ids.len())
                .sum::<usize>()
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await?;
    }
    Ok((n, t.elapsed().as_secs_f64()))
}
