//! Driver for scripts/bench/engines.sh: the embedded engine and a real vLLM (started and
//! supervised by lego-rl, as `--backend vllm-serve` does) on the same checkpoint, same requests,
//! same run, both called through the `Backend` trait.
//!
//!   engines_bench CHECKPOINT VLLM_PYTHON PROMPT_TOKENS NEW_TOKENS RUNS
//!
//! Measures, for each engine, best of RUNS after a warm-up:
//! - prefill: one request of PROMPT_TOKENS tokens and 1 new token (a fresh prompt every run, so
//!   that no prefix cache serves it);
//! - decode: NEW_TOKENS sampled tokens (seeded) after a 16-token prompt, for 1 stream and for 8
//!   at once (tokens/s over all streams);
//! - reload: the checkpoint loaded again in place (vLLM: pause, load, cache reset, resume, then
//!   the probe verification and, when that fails, a restart).
//!
//! Prints `key=value` lines (`embedded_*`, `vllm_*`).

use std::path::Path;
use std::time::{Duration, Instant};

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::vllm::server::ServeOptions;
use lego_rl::engine::vllm::supervised::SupervisedVllm;
use lego_rl::engine::{Backend, GenerateRequest};
use lego_rl::records::Sampling;

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + salt * 104_729) % 50_000 + 100)
        .collect()
}

fn request(prompt: Vec<u32>, new: u32, seed: u64) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        sampling: Sampling {
            temperature: Some(1.0),
            max_tokens: Some(new),
            seed: Some(seed),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Tokens per second of `streams` concurrent requests, best of `runs` after a warm-up; `salt`
/// keeps every prompt fresh.
async fn throughput(
    b: &dyn Backend,
    prompt: usize,
    new: u32,
    streams: usize,
    runs: usize,
    salt: &mut u32,
) -> anyhow::Result<f64> {
    let mut best: f64 = 0.0;
    for run in 0..=runs {
        let reqs: Vec<_> = (0..streams)
            .map(|s| {
                *salt += 1;
                request(ids(prompt, *salt), new, s as u64 + 1)
            })
            .collect();
        let start = Instant::now();
        let outs = futures::future::try_join_all(reqs.into_iter().map(|r| b.generate(r))).await?;
        let secs = start.elapsed().as_secs_f64();
        let tokens: usize = if new == 1 {
            prompt * streams
        } else {
            outs.iter().map(|o| o.output_ids.len()).sum()
        };
        if run > 0 {
            best = best.max(tokens as f64 / secs);
        }
    }
    Ok(best)
}

async fn measure(
    name: &str,
    b: &dyn Backend,
    ckpt: &Path,
    prompt: usize,
    new: u32,
    runs: usize,
) -> anyhow::Result<()> {
    let mut salt = 0;
    let prefill = throughput(b, prompt, 1, 1, runs, &mut salt).await?;
    let decode1 = throughput(b, 16, new, 1, runs, &mut salt).await?;
    let decode8 = throughput(b, 16, new, 8, runs, &mut salt).await?;
    let start = Instant::now();
    let report = b.reload(ckpt).await?;
    let reload = start.elapsed().as_secs_f64();
    println!("{name}_prefill_tok_per_s={prefill:.1}");
    println!("{name}_decode1_tok_per_s={decode1:.1}");
    println!("{name}_decode8_tok_per_s={decode8:.1}");
    println!("{name}_reload_s={reload:.2}");
    println!("{name}_reload_restarts={}", report.restarts);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        a.len() == 6,
        "usage: engines_bench CHECKPOINT VLLM_PYTHON PROMPT_TOKENS NEW_TOKENS RUNS"
    );
    let ckpt = Path::new(&a[1]);
    let (prompt, new, runs): (usize, u32, usize) = (a[3].parse()?, a[4].parse()?, a[5].parse()?);
    let embedded = EmbeddedBackend::start(ckpt, tch::Device::Cpu)?;
    measure("embedded", &embedded, ckpt, prompt, new, runs).await?;
    drop(embedded);
    let log = std::env::temp_dir().join(format!("engines-bench-vllm-{}.log", std::process::id()));
    let opts = ServeOptions {
        python: a[2].clone().into(),
        log: log.clone(),
        extra_args: vec!["--dtype=float32".into()],
        ready_timeout: Duration::from_secs(900),
        env: vec![("VLLM_CPU_KVCACHE_SPACE".into(), "1".into())],
    };
    let start = Instant::now();
    let vllm = SupervisedVllm::start(ckpt, opts, tch::Device::Cpu, None).await?;
    println!("vllm_start_s={:.1}", start.elapsed().as_secs_f64());
    measure("vllm", &vllm, ckpt, prompt, new, runs).await?;
    let _ = std::fs::remove_file(log);
    Ok(())
}
