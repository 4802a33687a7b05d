//! The embedded engine's prefix cache on the tiny Qwen3-MoE: an engine with the cache and one
//! without it give the same outputs, log-probs (within 1e-5) and routing for a multi-turn
//! conversation, a group sharing a prompt and a request diverging inside a cached prefix, while
//! the cached one computes fewer prompt tokens; a small budget evicts, and a reload drops it all.

use lego_rl::engine::embedded::{EmbeddedBackend, EngineOptions};
use lego_rl::engine::{Backend, GenerateOutput, GenerateRequest};
use lego_rl::model::Model;
use lego_rl::records::Sampling;
use tch::Device;

use super::proxy::chat;

fn engine(prefix_cache_bytes: usize) -> EmbeddedBackend {
    let opts = EngineOptions {
        prefix_cache_bytes,
        ..EngineOptions::default()
    };
    EmbeddedBackend::start_with(&crate::model::tiny_moe(), Device::Cpu, opts).unwrap()
}

fn user(text: &str) -> String {
    format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
}

/// Greedy (`seed` None) or seeded sampling at T = 0.05: the random tiny model's distribution at
/// T = 1 is so flat that ~1e-6 of summation-order noise moves a sampled token now and then (see
/// tests/it/engine.rs); at T = 0.05 a few tokens carry the mass, as in a trained model.
fn request(prompt_ids: Vec<u32>, max_tokens: u32, seed: Option<u64>) -> GenerateRequest {
    GenerateRequest {
        prompt_ids,
        sampling: Sampling {
            temperature: Some(if seed.is_some() { 0.05 } else { 0.0 }),
            max_tokens: Some(max_tokens),
            seed,
            ..Default::default()
        },
        return_routing: true,
        ..Default::default()
    }
}

/// Same tokens, log-probs within 1e-5 and the same routing of every position.
fn assert_same(got: &GenerateOutput, want: &GenerateOutput, what: &str) {
    assert_eq!(got.output_ids, want.output_ids, "{what}: output");
    assert_eq!(got.finish_reason, want.finish_reason, "{what}: finish");
    let d = got
        .logprobs
        .iter()
        .zip(&want.logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d <= 1e-5, "{what}: |Δ log-prob| {d}");
    let (g, w) = (got.routing.as_ref().unwrap(), want.routing.as_ref().unwrap());
    assert_eq!(
        (g.start, g.tokens, &g.experts),
        (w.start, w.tokens, &w.experts),
        "{what}: routing"
    );
}

/// Both engines, one request; returns the cached engine's answer.
async fn both(
    on: &EmbeddedBackend,
    off: &EmbeddedBackend,
    req: &GenerateRequest,
    what: &str,
) -> GenerateOutput {
    let (got, want) = (
        on.generate(req.clone()).await.unwrap(),
        off.generate(req.clone()).await.unwrap(),
    );
    assert_same(&got, &want, what);
    assert_eq!(want.cached_tokens, Some(0), "{what}: the engine without a cache");
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn cached_prefills_give_the_uncached_outputs_log_probs_and_routing() {
    let (on, off) = (engine(64 << 20), engine(0));
    let c = chat();
    let enc = |s: &str| c.encode(s).unwrap();

    // A conversation: each prompt is the previous prompt + its output + a new user turn, so all
    // but the new turn (and the last output token, never forwarded) comes from the cache.
    let mut prompt = enc(&format!(
        "<|im_start|>system\nYou are a careful coding agent.<|im_end|>\n{}",
        user("List the files.")
    ));
    let turns = ["Open main.rs.", "Fix the bug on line 3.", "Run the tests."];
    let mut conversation = Vec::new();
    for (i, next) in turns.iter().enumerate() {
        let seed = (i % 2 == 1).then_some(i as u64);
        let req = request(prompt.clone(), 10, seed);
        let out = both(&on, &off, &req, &format!("turn {i}")).await;
        if let Some((prev_prompt, prev_out)) = conversation.last() {
            let prev_prompt: &Vec<u32> = prev_prompt;
            let prev_out: &GenerateOutput = prev_out;
            assert_eq!(
                out.cached_tokens,
                Some(prev_prompt.len() + prev_out.output_ids.len() - 1),
                "turn {i}"
            );
        }
        conversation.push((prompt.clone(), out.clone()));
        prompt.extend(&out.output_ids);
        prompt.extend(enc(&format!("<|im_end|>\n{}", user(next))));
    }

    // A request that leaves the conversation inside turn 1's output: the cache serves the
    // positions before the divergence, cut from the middle of an entry.
    let (p1, o1) = &conversation[1];
    let k = p1.len() + 4;
    let mut diverging: Vec<u32> = p1.iter().chain(&o1.output_ids).take(k).copied().collect();
    diverging.extend(enc("Something else entirely."));
    let out = both(&on, &off, &request(diverging, 8, None), "diverging").await;
    assert_eq!(out.cached_tokens, Some(k));

    // A group of 8 sharing a prompt, sent at once: one computes the prompt, the other seven find
    // it (all but its last token, which gives each its first output token).
    let shared = enc(&user("Write a function that reverses a string, with tests."));
    let group: Vec<GenerateRequest> = (0..8)
        .map(|s| request(shared.clone(), 8, Some(100 + s)))
        .collect();
    let before = on.counts().prefix_cache;
    let (got, want) = tokio::join!(
        futures::future::join_all(group.iter().map(|r| on.generate(r.clone()))),
        futures::future::join_all(group.iter().map(|r| off.generate(r.clone()))),
    );
    let mut cached = Vec::new();
    for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
        let (g, w) = (g.unwrap(), w.unwrap());
        assert_same(&g, &w, &format!("group sample {i}"));
        cached.push(g.cached_tokens.unwrap());
    }
    assert_eq!(
        cached.iter().filter(|&&n| n == shared.len() - 1).count(),
        7,
        "{cached:?} of {}",
        shared.len()
    );
    let after = on.counts().prefix_cache;
    assert_eq!(after.requests - before.requests, 8);
    assert_eq!(
        after.prefill_tokens - before.prefill_tokens,
        (8 * shared.len() - cached.iter().sum::<usize>()) as u64
    );
    assert!(after.bytes > 0 && after.bytes <= after.budget, "{after:?}");
    // Everything the engine without a cache computed, the cached one computed a fraction of.
    let uncached = off.counts().prefix_cache;
    assert_eq!(uncached.prefill_tokens, uncached.prompt_tokens);
    assert_eq!(after.prompt_tokens, uncached.prompt_tokens);
    assert!(
        after.prefill_tokens * 2 < uncached.prefill_tokens,
        "{after:?} vs {uncached:?}"
    );
}

/// Writes the tiny model with every weight moved by noise into a temporary checkpoint.
fn perturbed_checkpoint() -> tempfile::TempDir {
    let model = Model::load(&crate::model::tiny_moe(), Device::Cpu, None).unwrap();
    tch::manual_seed(11);
    {
        let _g = tch::no_grad_guard();
        for (_, mut t) in model.named_variables() {
            let noise = t.randn_like() * 0.05;
            let _ = t.g_add_(&noise);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_budget_evicts_and_a_reload_drops_every_entry() {
    let c = chat();
    let enc = |s: &str| c.encode(s).unwrap();
    let a = request(
        enc(&user("Describe the architecture of a compiler in detail.")),
        8,
        None,
    );
    let b = request(
        enc(&user("Summarise the plot of a long novel you like.")),
        8,
        None,
    );
    // Bytes per cached position (KV of every layer plus routing), measured on a first entry.
    let probe = engine(64 << 20);
    let first = probe.generate(a.clone()).await.unwrap();
    let positions = a.prompt_ids.len() + first.output_ids.len() - 1;
    let stats = probe.counts().prefix_cache;
    assert_eq!(stats.bytes as usize % positions, 0, "{stats:?}");
    let per_token = stats.bytes as usize / positions;
    // Room for b's prompt and output, not for a's own part besides.
    let budget = per_token * (b.prompt_ids.len() + 7 + 2);
    let (on, off) = (engine(budget), engine(0));
    both(&on, &off, &a, "a").await;
    both(&on, &off, &b, "b").await;
    let s = on.counts().prefix_cache;
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.bytes as usize <= budget, "{s:?}");
    // a's own part went (least recently used); b's is whole; only the chat template's shared
    // opening of a remains.
    let shared = a
        .prompt_ids
        .iter()
        .zip(&b.prompt_ids)
        .take_while(|(x, y)| x == y)
        .count();
    let again_b = both(&on, &off, &b, "b again").await;
    assert_eq!(again_b.cached_tokens, Some(b.prompt_ids.len() - 1));
    let again_a = both(&on, &off, &a, "a again").await;
    assert_eq!(again_a.cached_tokens, Some(shared));

    // New weights: nothing computed with the old ones is reused, and the answers are those of an
    // engine started on the new weights.
    let new = perturbed_checkpoint();
    on.reload(new.path()).await.unwrap();
    let s = on.counts().prefix_cache;
    assert_eq!((s.invalidations, s.bytes), (1, 0), "{s:?}");
    let fresh = EmbeddedBackend::start_with(
        new.path(),
        Device::Cpu,
        EngineOptions {
            prefix_cache_bytes: 0,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let got = on.generate(a.clone()).await.unwrap();
    assert_eq!(got.cached_tokens, Some(0));
    let want = fresh.generate(a.clone()).await.unwrap();
    assert_same(&got, &want, "a on the new weights");
    assert_ne!(
        got.logprobs, again_a.logprobs,
        "the perturbation changes the answer (else this part tests nothing)"
    );
}
