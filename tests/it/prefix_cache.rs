//! The embedded engine's prefix cache on the tiny Qwen3-MoE and the tiny hybrid Qwen3.5-MoE
//! (Gated DeltaNet layers: recurrent-state snapshots): an engine with the cache and one without
//! it give the same outputs, log-probs (within 1e-5) and routing for a multi-turn conversation, a
//! group sharing a prompt and a request diverging inside a cached prefix, while the cached one
//! computes fewer prompt tokens; a small budget evicts, and a reload drops it all.

use std::path::Path;

use lego_rl::engine::embedded::{EmbeddedBackend, EngineOptions};
use lego_rl::engine::{Backend, GenerateOutput, GenerateRequest};
use lego_rl::model::{tensor_bytes, ForwardInput, KvCache, Model};
use lego_rl::records::Sampling;
use tch::{Device, Kind, Tensor};

use super::proxy::chat;

fn engine_on(model: &Path, prefix_cache_bytes: usize) -> EmbeddedBackend {
    let opts = EngineOptions {
        prefix_cache_bytes,
        ..EngineOptions::default()
    };
    EmbeddedBackend::start_with(model, Device::Cpu, opts).unwrap()
}

fn engine(prefix_cache_bytes: usize) -> EmbeddedBackend {
    engine_on(&crate::model::tiny_moe(), prefix_cache_bytes)
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
    cached_equals_uncached(&crate::model::tiny_moe(), false).await;
}

/// A hybrid model resumes from recurrent-state snapshots: where the cache has keys and values
/// but no state (inside an entry), it resumes from the last snapshot before and recomputes up to
/// the divergence, and leaves a snapshot there for the next request parting at the same place.
#[tokio::test(flavor = "multi_thread")]
async fn cached_prefills_of_a_hybrid_model_resume_from_state_snapshots() {
    cached_equals_uncached(&crate::hybrid::tiny_qwen35(), true).await;
}

/// The multi-turn, diverging and group checks on `model`; `hybrid`: it has recurrent layers.
async fn cached_equals_uncached(model: &Path, hybrid: bool) {
    let (on, off) = (engine_on(model, 64 << 20), engine_on(model, 0));
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
    let out = both(&on, &off, &request(diverging.clone(), 8, None), "diverging").await;
    // A recurrent state is kept only where an entry ends: a hybrid model resumes after turn 1's
    // prompt but one token (where its prefill stopped to leave a snapshot), not at k.
    let resumed = if hybrid { p1.len() - 1 } else { k };
    assert_eq!(out.cached_tokens, Some(resumed));
    // The next request parting at the same place resumes there (the first one left a snapshot).
    diverging.truncate(k);
    diverging.extend(enc("A different question."));
    let out = both(&on, &off, &request(diverging, 8, None), "diverging again").await;
    assert_eq!(out.cached_tokens, Some(k));

    // A group of 8 sharing a prompt, sent at once: one computes the prompt, the other seven find
    // it (all but its last token, which gives each its first output token).
    let shared = enc(&user("Write a function that reverses a string, with tests."));
    let before = on.counts().prefix_cache;
    let uncached_before = off.counts().prefix_cache;
    let group: Vec<GenerateRequest> = (0..8)
        .map(|s| request(shared.clone(), 8, Some(100 + s)))
        .collect();
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
    // The group alone: one prompt computed of eight.
    assert_eq!(
        uncached.prefill_tokens - uncached_before.prefill_tokens,
        8 * shared.len() as u64
    );
}

/// A hybrid model's cache counts its state snapshots in its bytes: after one request, its
/// positions' keys, values and routing, plus two snapshots (the prompt but its last token, where
/// a group's other samples resume; the finished sequence, where the next turn does). The sizes
/// come from a forward of the model itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_hybrid_caches_bytes_count_its_state_snapshots() {
    let dir = crate::hybrid::tiny_qwen35();
    let (per_position, snapshot) = {
        let model = Model::load(&dir, Device::Cpu, None).unwrap();
        let _g = tch::no_grad_guard();
        let mut kv = KvCache::new(model.lm.cfg.num_hidden_layers as usize);
        let (tokens, positions) = (
            Tensor::from_slice(&[9i64, 8]),
            Tensor::arange(2, (Kind::Int64, Device::Cpu)),
        );
        let out = model
            .lm
            .forward(&ForwardInput::causal(&tokens, &positions), Some(&mut kv));
        let snap = kv
            .snapshot()
            .expect("a hybrid model has recurrent states")
            .bytes();
        let routing = tensor_bytes(&out.routing.unwrap());
        ((kv.bytes() - snap + routing) / 2, snap)
    };
    let e = engine_on(&dir, 64 << 20);
    let req = request(chat().encode(&user("Count to ten.")).unwrap(), 6, None);
    let out = e.generate(req.clone()).await.unwrap();
    let positions = req.prompt_ids.len() + out.output_ids.len() - 1;
    let stats = e.counts().prefix_cache;
    assert_eq!(
        stats.bytes as usize,
        positions * per_position + 2 * snapshot,
        "{stats:?}, {positions} positions of {per_position} B, snapshots of {snapshot} B"
    );
}

/// Writes `model` with every weight moved by noise into a temporary checkpoint.
fn perturbed_checkpoint(model: &Path) -> tempfile::TempDir {
    let model = Model::load(model, Device::Cpu, None).unwrap();
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
    let new = perturbed_checkpoint(&crate::model::tiny_moe());
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

/// What train-step measures of a rollout is unchanged by the cache: on a conversation forced as
/// `rollout --forced` forces it (the pipeline test's set-up, here without Docker), scored by a
/// trainer whose weights moved (so the agreement is not trivially perfect) replaying the recorded
/// routing, the Pearson correlation of rollout and trainer log-probs and the expert overlap of
/// the recorded routing with the trainer's router are the same with the cache on and off.
#[tokio::test(flavor = "multi_thread")]
async fn rollout_trainer_agreement_is_the_same_with_and_without_the_cache() {
    for model in [crate::model::tiny_moe(), crate::hybrid::tiny_qwen35()] {
        let trainer_dir = perturbed_checkpoint(&model);
        let trainer = Model::load(trainer_dir.path(), Device::Cpu, None).unwrap();
        let (on, off) = (engine_on(&model, 64 << 20), engine_on(&model, 0));
        let (with, with_cached) = agreement(&on, &trainer).await;
        let (without, without_cached) = agreement(&off, &trainer).await;
        let name = model.file_name().unwrap().to_string_lossy().into_owned();
        eprintln!("{name}: cache on {with:?} ({with_cached} prompt tokens cached), off {without:?}");
        assert!(with_cached > 0 && without_cached == 0, "{name}");
        assert!(
            (with.0 - without.0).abs() <= 1e-6,
            "{name}: Pearson {with:?} vs {without:?}"
        );
        assert_eq!(with.1, without.1, "{name}: expert overlap");
        assert!(
            with.0 < 0.999_999 && with.1 < 1.0,
            "{name}: the perturbation shows ({with:?})"
        );
    }
}

/// Runs a 3-turn forced conversation on `engine` and scores it with `trainer` as train-step does
/// (one forward of the whole sequence, replaying the recorded routing): `(Pearson, expert
/// overlap)` and the prompt tokens the engine took from its cache.
async fn agreement(engine: &EmbeddedBackend, trainer: &Model) -> ((f64, f64), usize) {
    let c = chat();
    let enc = |s: &str| c.encode(s).unwrap();
    let mut seq = enc(&format!(
        "<|im_start|>system\nYou fix bugs.<|im_end|>\n{}",
        user("Fix ordinal().")
    ));
    let (mut rollout, mut at, mut cached) = (Vec::new(), Vec::new(), 0);
    let mut routing = None;
    let turns = [
        (
            "Let me look.\n<tool_call>{\"name\": \"bash\"}</tool_call>",
            "3 files",
        ),
        ("The teens check is wrong; fixing it.", "done"),
        ("Tests pass now.", ""),
    ];
    for (reply, tool) in turns {
        let mut req = request(seq.clone(), 64, None);
        req.forced_output = Some(enc(reply));
        let out = engine.generate(req).await.unwrap();
        cached += out.cached_tokens.unwrap_or(0);
        at.extend((seq.len()..seq.len() + out.output_ids.len()).map(|p| p as i64 - 1));
        rollout.extend(out.logprobs.iter().map(|&l| f64::from(l)));
        seq.extend(&out.output_ids);
        routing = out.routing;
        seq.extend(enc(&format!("<|im_end|>\n{}", user(tool))));
    }
    // The last capture covers every position forwarded: all of `seq` up to the last output token.
    let r = routing.unwrap();
    let recorded = Tensor::from_slice(&r.experts.iter().map(|&e| i64::from(e)).collect::<Vec<_>>()).view([
        r.tokens as i64,
        r.layers as i64,
        r.top_k as i64,
    ]);
    let t = r.tokens as i64;
    let ids: Vec<i64> = seq.iter().map(|&x| i64::from(x)).collect();
    let _g = tch::no_grad_guard();
    let tokens = Tensor::from_slice(&ids[..t as usize]);
    let positions = Tensor::arange(t, (Kind::Int64, Device::Cpu));
    let input = ForwardInput {
        replay: Some(&recorded),
        ..ForwardInput::causal(&tokens, &positions)
    };
    let out = trainer.lm.forward(&input, None);
    let logp = trainer.lm.logits(&out.hidden).log_softmax(-1, Kind::Float);
    let at = Tensor::from_slice(&at);
    let next = Tensor::from_slice(&ids).index_select(0, &(&at + 1));
    let scored = Vec::<f64>::try_from(
        logp.index_select(0, &at)
            .gather(1, &next.unsqueeze(1), false)
            .squeeze_dim(1)
            .to_kind(Kind::Double),
    )
    .unwrap();
    let pearson = crate::hybrid::pearson(&rollout, &scored);
    // The trainer's own top-k against the recorded one, position by position (as sets).
    let (own, _) = out.router_topk.unwrap().sort(-1, false);
    let (rec, _) = recorded.sort(-1, false);
    let same = own.eq_tensor(&rec).all_dim(-1, false);
    let overlap = same.sum(Kind::Int64).int64_value(&[]) as f64 / same.numel() as f64;
    ((pearson, overlap), cached)
}
