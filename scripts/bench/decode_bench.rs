//! Driver for scripts/bench/decode.sh: decode throughput of the embedded engine, called directly
//! through the `Backend` trait (no HTTP, no chat rendering: the least overhead an honest caller
//! pays — the proxy adds its own, measured by scripts/bench/proxy.sh).
//!
//!   decode_bench CHECKPOINT_DIR PROMPT_IDS_JSON NEW_TOKENS RUNS THREADS [TEMPERATURE [TOP_P]]
//!
//! Decoding of exactly NEW_TOKENS tokens (no stop ids), RUNS times after one warm-up run, on
//! THREADS torch threads; greedy, or temperature sampling when TEMPERATURE > 0 (seeded), with
//! nucleus sampling when TOP_P < 1.
//! Prints `key=value` lines, and the generated ids of the first run (`ids=1,2,…`) so the script
//! can check that both sides decoded the same tokens.
//!
//! The same request is timed, in the same run, on the engine with its prefix cache (the default:
//! after the warm-up, every run finds its prompt but the last token cached) and on one without
//! (`engine_nocache_*`: every run prefills its whole prompt, like transformers does), run by run
//! in turns, with the generated ids of both checked equal.
//!
//! Then concurrent throughput: N = 1, 4, 8 requests at once (N rotations of the prompt, seeds
//! 1..=N, NEW_TOKENS each), timed from sending them to the last answer (best of RUNS after a
//! warm-up), against the engine with batched decode and against the same engine capped at one
//! sequence per decode forward (the interleaving that came before batching), with how many
//! output tokens agree between the two (each request's common prefix).

use std::path::Path;
use std::time::Instant;

use lego_rl::engine::embedded::{EmbeddedBackend, EngineOptions};
use lego_rl::engine::{Backend, GenerateOutput, GenerateRequest};
use lego_rl::records::Sampling;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        (6..=8).contains(&a.len()),
        "usage: decode_bench CHECKPOINT PROMPT_IDS_JSON NEW_TOKENS RUNS THREADS [TEMPERATURE [TOP_P]]"
    );
    let temperature: f64 = a.get(6).map_or(Ok(0.0), |t| t.parse())?;
    let top_p: f64 = a.get(7).map_or(Ok(1.0), |t| t.parse())?;
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
            top_p: (top_p < 1.0).then_some(top_p),
            max_tokens: Some(new_tokens),
            seed: Some(1),
            ..Default::default()
        },
        // Routing is captured in production: keep its cost in the measurement.
        return_routing: true,
        ..Default::default()
    };
    let nocache = EmbeddedBackend::start_with(
        ckpt,
        tch::Device::Cpu,
        EngineOptions {
            prefix_cache_bytes: 0,
            ..EngineOptions::default()
        },
    )?;
    println!("prompt_tokens={}", prompt.len());
    println!("new_tokens={new_tokens}");
    println!("runs={runs}");
    let mut outs = timed(&[(&backend, "engine"), (&nocache, "engine_nocache")], &req, runs).await?;
    let (uncached, first) = (
        outs.pop().expect("two backends"),
        outs.pop().expect("two backends"),
    );
    let equal = first.iter().zip(&uncached).take_while(|(a, b)| a == b).count();
    println!("engine_nocache_equal_tokens={equal}/{}", first.len());
    // Greedy decoding must not change a token with the cache (sampling the random model's
    // nearly flat distribution may, on ~1e-6 of summation-order noise: see below).
    anyhow::ensure!(
        temperature > 0.0 || first == uncached,
        "greedy decoding with and without the prefix cache gave different tokens"
    );
    println!(
        "engine_cached_prompt_tokens={}",
        backend.counts().prefix_cache.prompt_tokens - backend.counts().prefix_cache.prefill_tokens
    );
    let ids: Vec<String> = first.iter().map(u32::to_string).collect();
    println!("engine_ids={}", ids.join(","));

    // The LM head alone: one `[1, hidden] x [hidden, vocab]` matmul per token, the same work on
    // both sides (memory-bound: the fp32 head is read whole for every token). Its time bounds the
    // ratio: an engine whose every other op took no time would still be at most
    // transformers' step / head.
    println!("head_ms_per_token={:.4}", head_ms_per_token(ckpt, 256)?);

    let interleaved = EmbeddedBackend::start_with(
        ckpt,
        tch::Device::Cpu,
        EngineOptions {
            max_decode_batch: 1,
            ..EngineOptions::default()
        },
    )?;
    let levels = [1usize, 4, 8];
    let (mut batched_rates, mut interleaved_rates, mut equal_tokens) = (Vec::new(), Vec::new(), Vec::new());
    for &n in &levels {
        let reqs: Vec<GenerateRequest> = (0..n)
            .map(|i| {
                let mut r = req.clone();
                r.prompt_ids.rotate_left(i * 7 % prompt.len().max(1));
                r.sampling.seed = Some(1 + i as u64);
                r
            })
            .collect();
        let (rate, outs) = concurrent(&backend, &reqs, runs).await?;
        let (rate_1, outs_1) = concurrent(&interleaved, &reqs, runs).await?;
        // Greedy decoding gives the same tokens; sampling from the random tiny model's nearly
        // uniform distribution may not: the batched matmuls' summation order moves log-probs by
        // ~1e-6, which now and then moves a sampled token across a neighbour's sliver of mass.
        let equal: usize = outs
            .iter()
            .zip(&outs_1)
            .map(|(a, b)| a.iter().zip(b).take_while(|(x, y)| x == y).count())
            .sum();
        equal_tokens.push(format!("{equal}/{}", outs.iter().map(Vec::len).sum::<usize>()));
        batched_rates.push(format!("{rate:.1}"));
        interleaved_rates.push(format!("{rate_1:.1}"));
    }
    let levels: Vec<String> = levels.iter().map(usize::to_string).collect();
    println!("concurrent_levels={}", levels.join(","));
    println!("concurrent_batched_tok_per_s={}", batched_rates.join(","));
    println!("concurrent_interleaved_tok_per_s={}", interleaved_rates.join(","));
    println!("concurrent_equal_tokens={}", equal_tokens.join(","));
    println!(
        "concurrent_largest_decode_batch={}",
        backend.counts().largest_decode_batch
    );
    Ok(())
}

/// Times `req` `runs` times on each of `backends` after a warm-up on each, the backends taking
/// turns run by run (so drift in the machine's speed falls on all alike), and prints per backend
/// `{name}_seconds_mean`, `{name}_tok_per_s` and `{name}_tok_per_s_best`; returns each one's
/// output ids.
async fn timed(
    backends: &[(&EmbeddedBackend, &str)],
    req: &GenerateRequest,
    runs: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let new_tokens = req.sampling.max_tokens.unwrap_or(0) as usize;
    let mut firsts = Vec::new();
    for (backend, _) in backends {
        let first = backend.generate(req.clone()).await?; // warm-up
        anyhow::ensure!(first.output_ids.len() == new_tokens, "short output");
        firsts.push(first.output_ids);
    }
    let mut best = vec![f64::INFINITY; backends.len()];
    let mut total = vec![0.0; backends.len()];
    for _ in 0..runs {
        for (i, (backend, _)) in backends.iter().enumerate() {
            let t = Instant::now();
            let out = backend.generate(req.clone()).await?;
            let s = t.elapsed().as_secs_f64();
            // Seeded: sampled runs repeat too.
            anyhow::ensure!(out.output_ids == firsts[i], "output changed between runs");
            best[i] = best[i].min(s);
            total[i] += s;
        }
    }
    for (i, (_, name)) in backends.iter().enumerate() {
        println!("{name}_seconds_mean={:.4}", total[i] / runs as f64);
        println!("{name}_tok_per_s={:.1}", (new_tokens * runs) as f64 / total[i]);
        println!("{name}_tok_per_s_best={:.1}", new_tokens as f64 / best[i]);
    }
    Ok(firsts)
}

/// Output tokens per second of `reqs` sent all at once (best of `runs` after a warm-up), and
/// the output ids of each request.
async fn concurrent(
    backend: &EmbeddedBackend,
    reqs: &[GenerateRequest],
    runs: usize,
) -> anyhow::Result<(f64, Vec<Vec<u32>>)> {
    let all = || futures::future::join_all(reqs.iter().map(|r| backend.generate(r.clone())));
    let first: Vec<GenerateOutput> = all().await.into_iter().collect::<Result<_, _>>()?;
    let tokens: usize = first.iter().map(|o| o.output_ids.len()).sum();
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        for out in all().await {
            out?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((
        tokens as f64 / best,
        first.into_iter().map(|o| o.output_ids).collect(),
    ))
}

/// Milliseconds of the LM head's matmul for one token (mean of `iters` after a warm-up), with the
/// checkpoint's own head weight (`lm_head.weight`, or the tied embedding), as the model loads it
/// (any layout: Qwen3.5's `model.language_model.` prefix, sharded files).
fn head_ms_per_token(ckpt: &Path, iters: usize) -> anyhow::Result<f64> {
    let _g = tch::no_grad_guard();
    let vars = lego_rl::model::Model::load(ckpt, tch::Device::Cpu, None)?.named_variables();
    let find = |suffix: &str| vars.iter().find(|(n, _)| n.ends_with(suffix)).map(|(_, t)| t);
    let w = find("lm_head.weight")
        .or_else(|| find("embed_tokens.weight"))
        .ok_or_else(|| anyhow::anyhow!("no lm_head.weight or embed_tokens.weight"))?
        .to_kind(tch::Kind::Float);
    let x = tch::Tensor::randn([1, w.size()[1]], (tch::Kind::Float, tch::Device::Cpu));
    let mut sink = 0.0;
    for _ in 0..8 {
        sink += x.linear(&w, None::<tch::Tensor>).double_value(&[0, 0]);
    }
    let t = Instant::now();
    for _ in 0..iters {
        sink += x.linear(&w, None::<tch::Tensor>).double_value(&[0, 0]);
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0 / iters as f64;
    std::hint::black_box(sink);
    Ok(ms)
}
