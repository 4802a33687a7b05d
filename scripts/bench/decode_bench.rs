//! Driver for scripts/bench/decode.sh: decode throughput of the embedded engine, called directly
//! through the `Backend` trait (no HTTP, no chat rendering: the least overhead an honest caller
//! pays — the proxy adds its own, measured by scripts/bench/proxy.sh).
//!
//!   decode_bench CHECKPOINT_DIR PROMPT_IDS_JSON NEW_TOKENS RUNS THREADS [TEMPERATURE]
//!
//! Decoding of exactly NEW_TOKENS tokens (no stop ids), RUNS times after one warm-up run, on
//! THREADS torch threads; greedy, or plain temperature sampling when TEMPERATURE > 0 (seeded). Prints `key=value` lines, and the generated ids of the first run
//! (`ids=1,2,…`) so the script can check that both sides decoded the same tokens.

use std::path::Path;
use std::time::Instant;

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::{Backend, GenerateRequest};
use lego_rl::records::Sampling;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() == 6 || a.len() == 7,
        "usage: decode_bench CHECKPOINT PROMPT_IDS_JSON NEW_TOKENS RUNS THREADS [TEMPERATURE]"
    );
    let temperature: f64 = a.get(6).map_or(Ok(0.0), |t| t.parse())?;
    let ckpt = Path::new(&a[1]);
    let prompt: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(&a[2])?)?;
    let new_tokens: u32 = a[3].parse()?;
    let runs: usize = a[4].parse()?;
    let threads: i32 = a[5].parse()?;
    tch::set_num_threads(threads);
    let backend = EmbeddedBackend::start(ckpt, tch::Device::Cpu)?;
    let req = GenerateRequest {
        prompt_ids: prompt.clone(),
        sampling: Sampling {
            temperature: Some(temperature),
            max_tokens: Some(new_tokens),
            seed: Some(1),
            ..Default::default()
        },
        // Routing is captured in production: keep its cost in the measurement.
        return_routing: true,
        ..Default::default()
    };
    let first = backend.generate(req.clone()).await?; // warm-up
    anyhow::ensure!(first.output_ids.len() == new_tokens as usize, "short output");
    let mut best = f64::INFINITY;
    let mut total = 0.0;
    for _ in 0..runs {
        let t = Instant::now();
        let out = backend.generate(req.clone()).await?;
        let s = t.elapsed().as_secs_f64();
        // Seeded: sampled runs repeat too.
        anyhow::ensure!(out.output_ids == first.output_ids, "output changed between runs");
        best = best.min(s);
        total += s;
    }
    println!("prompt_tokens={}", prompt.len());
    println!("new_tokens={new_tokens}");
    println!("runs={runs}");
    println!("engine_seconds_mean={:.4}", total / runs as f64);
    println!("engine_tok_per_s={:.1}", new_tokens as f64 * runs as f64 / total);
    println!("engine_tok_per_s_best={:.1}", new_tokens as f64 / best);
    let ids: Vec<String> = first.output_ids.iter().map(u32::to_string).collect();
    println!("engine_ids={}", ids.join(","));
    Ok(())
}
