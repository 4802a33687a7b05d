//! Driver for scripts/bench/prefix_cache.sh: the embedded engine with its prefix cache and
//! without it, in the same process, through the lego-rl proxy (HTTP, render + capture).
//!
//!   prefix_cache_bench CKPT TOKENIZER_DIR REQUESTS_JSONL MAX_TOKENS GROUP
//!
//! 1. Episode: the POST requests of a captured harness episode (testdata/harness-traffic/*/
//!    requests.jsonl), replayed in order through one trial of the proxy, each answered with at
//!    most MAX_TOKENS sampled tokens (seeded).
//! 2. Group: GROUP copies of the episode's first request sent at once (a GSPO group's shared
//!    first prompt), one trial each.
//!
//! CKPT is copied to a temporary directory with `max_position_embeddings` raised to 65536 (the
//! tiny model's 4096 cannot hold Claude Code's ~27k-token prompts; RoPE needs no other change).
//! Prints `key=value` lines per mode (`off`, `on`): wall seconds, prompt tokens received, prefill
//! tokens computed, and the episode's unique prompt tokens (the tokens of a trie of its prompts:
//! what an ideal cache would compute).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use lego_rl::chat::ChatFormat;
use lego_rl::engine::embedded::{EmbeddedBackend, EngineOptions};
use lego_rl::proxy::{Proxy, ProxyConfig};
use serde_json::Value;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() == 6,
        "usage: prefix_cache_bench CKPT TOKENIZER_DIR REQUESTS_JSONL MAX_TOKENS GROUP"
    );
    let (ckpt, tok, requests) = (Path::new(&a[1]), Path::new(&a[2]), Path::new(&a[3]));
    let (max_tokens, group): (u32, usize) = (a[4].parse()?, a[5].parse()?);
    let long = tempfile::tempdir()?;
    long_context_copy(ckpt, long.path())?;
    let chat = Arc::new(ChatFormat::from_parts(
        &tok.join("tokenizer.json"),
        &tok.join("tokenizer_config.json"),
        None,
    )?);
    let posts: Vec<(String, String)> = std::fs::read_to_string(requests)?
        .lines()
        .map(serde_json::from_str::<Value>)
        .filter_map(|r| {
            let r = r.ok()?;
            (r["method"] == "POST").then(|| {
                (
                    r["path"].as_str().unwrap_or("").to_string(),
                    r["body_raw"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect();
    anyhow::ensure!(!posts.is_empty(), "{}: no POST requests", requests.display());
    println!("episode_requests={}", posts.len());
    for (mode, bytes) in [
        ("off", 0usize),
        ("on", EngineOptions::default().prefix_cache_bytes),
    ] {
        let opts = EngineOptions {
            prefix_cache_bytes: bytes,
            ..EngineOptions::default()
        };
        let backend = Arc::new(EmbeddedBackend::start_with(long.path(), tch::Device::Cpu, opts)?);
        let mut cfg = ProxyConfig::default();
        cfg.sampling.max_tokens = Some(max_tokens);
        cfg.sampling.seed = Some(7);
        let proxy = Proxy::new(chat.clone(), backend.clone(), cfg);
        let (addr, _) = proxy.serve("127.0.0.1:0".parse()?).await?;
        let base = format!("http://{addr}");
        let client = reqwest::Client::new();

        let (token, trial) = proxy.register_trial("episode");
        let t0 = Instant::now();
        for (path, body) in &posts {
            send(&client, &format!("{base}/t/{token}{path}"), body).await?;
        }
        let episode_s = t0.elapsed().as_secs_f64();
        let stats = backend.counts().prefix_cache;
        let prompts: Vec<Vec<u32>> = trial.generations().into_iter().map(|g| g.prompt_ids).collect();
        anyhow::ensure!(
            prompts.len() == posts.len(),
            "{} of {} requests answered",
            prompts.len(),
            posts.len()
        );
        println!("{mode}_episode_seconds={episode_s:.3}");
        println!("{mode}_episode_prompt_tokens={}", stats.prompt_tokens);
        println!("{mode}_episode_prefill_tokens={}", stats.prefill_tokens);
        println!("{mode}_episode_unique_tokens={}", unique_tokens(&prompts));

        // The group starts from an empty cache (a fresh engine): the episode cached its prompt.
        let (path, body) = &posts[0];
        let backend = Arc::new(EmbeddedBackend::start_with(long.path(), tch::Device::Cpu, opts)?);
        let mut cfg = ProxyConfig::default();
        cfg.sampling.max_tokens = Some(max_tokens);
        let proxy = Proxy::new(chat.clone(), backend.clone(), cfg);
        let (addr, _) = proxy.serve("127.0.0.1:0".parse()?).await?;
        let urls: Vec<String> = (0..group)
            .map(|i| {
                let (token, _) = proxy.register_trial(&format!("group-{i}"));
                format!("http://{addr}/t/{token}{path}")
            })
            .collect();
        let t0 = Instant::now();
        futures::future::try_join_all(urls.iter().map(|u| send(&client, u, body))).await?;
        let group_s = t0.elapsed().as_secs_f64();
        let stats = backend.counts().prefix_cache;
        println!("{mode}_group_seconds={group_s:.3}");
        println!("{mode}_group_prompt_tokens={}", stats.prompt_tokens);
        println!("{mode}_group_prefill_tokens={}", stats.prefill_tokens);
    }
    Ok(())
}

/// POSTs `body` as JSON and reads the whole answer (SSE or JSON); fails on a non-2xx status.
async fn send(client: &reqwest::Client, url: &str, body: &str) -> anyhow::Result<()> {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = r.status();
    let text = r.text().await?;
    anyhow::ensure!(
        status.is_success(),
        "{url}: HTTP {status}: {}",
        text.chars().take(300).collect::<String>()
    );
    Ok(())
}

/// Copies the checkpoint's files into `dir` with a 65536-token context.
fn long_context_copy(ckpt: &Path, dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(ckpt)? {
        let p: PathBuf = entry?.path();
        if p.is_file() {
            std::fs::copy(&p, dir.join(p.file_name().unwrap_or_default()))?;
        }
    }
    let cfg_path = dir.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path)?)?;
    cfg["max_position_embeddings"] = 65536.into();
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg)?)?;
    Ok(())
}

/// Tokens of a trie of `prompts`: each prompt's tokens past its longest common prefix with an
/// earlier one.
fn unique_tokens(prompts: &[Vec<u32>]) -> usize {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let shared = prompts[..i]
                .iter()
                .map(|q| q.iter().zip(p).take_while(|(x, y)| x == y).count())
                .max()
                .unwrap_or(0);
            p.len() - shared
        })
        .sum()
}
