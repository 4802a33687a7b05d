//! The hybrid family (Qwen3.5-MoE in its vision-language layout, Qwen3-Next): parity with
//! transformers (log-probs within 1e-4, routing exact), packing, the engine's recurrent decode
//! against the trainer's chunked forward, and a GSPO train-step with replay. Checkpoints (save →
//! transformers load, layouts, bad input) are in `hybrid_checkpoint.rs`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::{Backend, GenerateRequest};
use lego_rl::model::{ForwardInput, KvCache, Model};
use lego_rl::records::Sampling;
use tch::{Device, Kind, Tensor};

use crate::common::{self, lego};
use crate::hybrid_checkpoint::raw_tensors;
use crate::model::{floats, ids_of, max_abs_diff, read_json, reference_routing, routing_lists, seq_logprobs};
use crate::train::{read_metrics, sample, write_samples, CLI_OPTS};

/// A generated tiny hybrid checkpoint (`tiny-qwen3.5-moe` or `tiny-qwen3-next`), made once by
/// scripts/make_tiny_models.py with transformers.
pub fn tiny(name: &str) -> PathBuf {
    static LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();
    let _g = LOCK
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("testdata/models/generated").join(name);
    // The script also refreshes a chat template testdata corrected since the model was made.
    let template = |d: &Path| std::fs::read(d.join("chat_template.jinja")).ok();
    let stale_template = name.starts_with("tiny-qwen3.5")
        && template(&dir) != template(&root.join("testdata/tokenizer/qwen3.5"));
    if !dir.join("reference.json").is_file() || stale_template {
        let status = std::process::Command::new(common::python())
            .arg(root.join("scripts/make_tiny_models.py"))
            .arg(&dir)
            .status()
            .expect("running scripts/make_tiny_models.py (needs the venv: scripts/setup.sh)");
        assert!(status.success(), "make_tiny_models.py failed for {name}");
    }
    dir
}

pub fn tiny_qwen35() -> PathBuf {
    tiny("tiny-qwen3.5-moe")
}

pub fn tiny_next() -> PathBuf {
    tiny("tiny-qwen3-next")
}

/// Log-probs, logits and routing of every reference sequence against transformers'.
fn matches_transformers(dir: &Path, moe_layers: usize) {
    let model = Model::load(dir, Device::Cpu, None).unwrap();
    assert_eq!(model.lm.moe_layers(), moe_layers);
    let reference = read_json(&dir.join("reference.json"));
    for seq in reference["sequences"].as_array().unwrap() {
        let ids = ids_of(seq);
        let (lp, routing, own) = seq_logprobs(&model.lm, &ids, None);
        let d = max_abs_diff(&lp, &floats(&seq["next_token_logprobs"]));
        assert!(
            d < 1e-4,
            "{}: {}: log-prob max |Δ| {d}",
            dir.display(),
            seq["name"]
        );
        let routing = routing.unwrap();
        assert_eq!(routing.size(), vec![ids.len() as i64, moe_layers as i64, 2]);
        assert_eq!(routing_lists(&routing), reference_routing(seq), "{}", seq["name"]);
        assert!(routing.equal(&own.unwrap()));
        crate::model::assert_last_logits(&model, &ids, seq);
    }
}

#[test]
fn qwen35_log_probs_logits_and_routing_match_transformers() {
    matches_transformers(&tiny_qwen35(), 4);
}

#[test]
fn qwen3_next_log_probs_logits_and_routing_match_transformers() {
    // Layer 1 is dense (`mlp_only_layers`); the linear layers use the fused grouped projections.
    matches_transformers(&tiny_next(), 3);
}

/// Packed sequences (block-diagonal mask) give each sequence's own log-probs: the linear
/// attention must restart its state at every sequence boundary.
#[test]
fn hybrid_packed_sequences_equal_separate_forwards() {
    let dir = tiny_qwen35();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    let reference = read_json(&dir.join("reference.json"));
    let seqs: Vec<Vec<i64>> = reference["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids_of)
        .collect();
    let _g = tch::no_grad_guard();
    let (out, _) = crate::model::packed_forward(&model, &seqs);
    let lsm = model.lm.logits(&out.hidden).log_softmax(-1, Kind::Float);
    let mut start = 0i64;
    for s in &seqs {
        let (alone, _, _) = seq_logprobs(&model.lm, s, None);
        let packed: Vec<f64> = (0..s.len() - 1)
            .map(|t| lsm.double_value(&[start + t as i64, s[t + 1]]))
            .collect();
        let d = max_abs_diff(&packed, &alone);
        assert!(d < 1e-5, "packed vs alone |Δ| {d}");
        start += s.len() as i64;
    }
}

/// Pearson correlation of two equally long series (the metrics' own; NaN without variance).
pub fn pearson(a: &[f64], b: &[f64]) -> f64 {
    lego_rl::train::metrics::pearson(a, b).unwrap_or(f64::NAN)
}

/// Generates `steps` tokens for two sequences at once as the engine does (chunked prefill, then
/// batched one-token recurrent decode steps, sampled from the model), then scores the whole
/// sequences as the trainer does (one chunked forward). Returns per sequence the engine's and
/// the trainer's log-probs of the generated tokens.
fn engine_vs_trainer(model: &Model, steps: usize) -> Vec<(Vec<f64>, Vec<f64>)> {
    let lm = &model.lm;
    let _g = tch::no_grad_guard();
    tch::manual_seed(11);
    let prompts: [Vec<i64>; 2] = [
        vec![151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
        (0..37).map(|i| (i * 7919 + 11) % 151643).collect(),
    ];
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| KvCache::new(0)).collect();
    let mut seqs: Vec<Vec<i64>> = prompts.to_vec();
    let mut engine: Vec<Vec<f64>> = vec![Vec::new(); 2];
    let mut last: Vec<Tensor> = Vec::new();
    for (p, cache) in prompts.iter().zip(caches.iter_mut()) {
        let t = Tensor::from_slice(p);
        let pos = Tensor::arange(p.len() as i64, (Kind::Int64, Device::Cpu));
        let out = lm.forward(&ForwardInput::causal(&t, &pos), Some(cache));
        last.push(out.hidden.narrow(0, p.len() as i64 - 1, 1));
    }
    let mut hidden = Tensor::cat(&last, 0);
    for step in 0..steps {
        let logp = lm
            .logits(&hidden)
            .to_kind(Kind::Float)
            .log_softmax(-1, Kind::Float);
        let next = logp.exp().multinomial(1, false).squeeze_dim(1);
        let next_v = Vec::<i64>::try_from(&next).unwrap();
        for b in 0..2 {
            engine[b].push(logp.double_value(&[b as i64, next_v[b]]));
            seqs[b].push(next_v[b]);
        }
        if step + 1 == steps {
            break;
        }
        let positions = Tensor::from_slice(&seqs.iter().map(|s| s.len() as i64 - 1).collect::<Vec<_>>());
        let mut batch: Vec<&mut KvCache> = caches.iter_mut().collect();
        hidden = lm.decode_batch(&next, &positions, &mut batch).hidden;
    }
    seqs.iter()
        .zip(prompts.iter())
        .zip(engine)
        .map(|((s, p), e)| {
            let (lp, _, _) = seq_logprobs(lm, s, None);
            (e, lp[p.len() - 1..].to_vec())
        })
        .collect()
}

/// The engine's recurrent decode and the trainer's chunked forward compute the same log-probs
/// over 520 generated tokens (8 chunks of the delta rule): Pearson ≥ 0.99999, max |Δ| ≤ 1e-4 in
/// fp32.
#[test]
fn recurrent_decode_matches_chunked_forward_over_520_tokens() {
    let dir = tiny_qwen35();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    let (mut all_e, mut all_t) = (Vec::new(), Vec::new());
    for (e, t) in engine_vs_trainer(&model, 520) {
        assert_eq!(e.len(), 520);
        all_e.extend(e);
        all_t.extend(t);
    }
    let d = max_abs_diff(&all_e, &all_t);
    let r = pearson(&all_e, &all_t);
    eprintln!("fp32 engine (recurrent) vs trainer (chunked): pearson {r:.9}, max |Δ| {d:.3e}");
    assert!(r >= 0.99999, "pearson {r}");
    assert!(d <= 1e-4, "max |Δ| {d}");
}

/// The same comparison in bf16, printed, not gated (bf16 rounds differently in the two forms);
/// minutes on CPU, so run by hand: `cargo test --release --test it -- --ignored bf16_figures
/// --nocapture`. Measured: Pearson 1.000000, max |Δ| 9.8e-4.
#[test]
#[ignore]
fn recurrent_decode_vs_chunked_forward_bf16_figures() {
    let dir = tiny_qwen35();
    let bf16 = Model::load(&dir, Device::Cpu, Some(Kind::BFloat16)).unwrap();
    let (mut e16, mut t16) = (Vec::new(), Vec::new());
    for (e, t) in engine_vs_trainer(&bf16, 520) {
        e16.extend(e);
        t16.extend(t);
    }
    eprintln!(
        "bf16 engine (recurrent) vs trainer (chunked): pearson {:.6}, max |Δ| {:.3e}",
        pearson(&e16, &t16),
        max_abs_diff(&e16, &t16)
    );
}

/// The embedded engine serves the hybrid model: two generations at once (prefill, then batched
/// recurrent decode steps), each with the log-probs and routing the trainer's chunked forward
/// computes over its prompt + output (what `train-step` replays and compares).
#[tokio::test(flavor = "multi_thread")]
async fn embedded_engine_matches_the_trainer_on_qwen35() {
    let dir = tiny_qwen35();
    let engine = EmbeddedBackend::start(&dir, Device::Cpu).unwrap();
    let request = |prompt: Vec<u32>, seed: u64| GenerateRequest {
        prompt_ids: prompt,
        sampling: Sampling {
            temperature: Some(1.0),
            max_tokens: Some(70),
            seed: Some(seed),
            ..Default::default()
        },
        return_routing: true,
        ..Default::default()
    };
    let reqs = [
        request(vec![151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198], 1),
        request((0..21).map(|i| (i * 7919 + 5) % 151643).collect(), 2),
    ];
    let (a, b) = tokio::join!(engine.generate(reqs[0].clone()), engine.generate(reqs[1].clone()));
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    for (req, out) in reqs.iter().zip([a.unwrap(), b.unwrap()]) {
        assert_eq!(out.output_ids.len(), 70);
        let ids: Vec<i64> = req
            .prompt_ids
            .iter()
            .chain(&out.output_ids)
            .map(|&t| t as i64)
            .collect();
        let (lp, routing, _) = seq_logprobs(&model.lm, &ids, None);
        let got: Vec<f64> = out.logprobs.iter().map(|&x| x as f64).collect();
        let d = max_abs_diff(&got, &lp[req.prompt_ids.len() - 1..]);
        assert!(d < 1e-4, "engine vs trainer log-prob |Δ| {d}");
        let r = out.routing.expect("routing returned");
        assert_eq!((r.tokens, r.layers, r.top_k), (ids.len() - 1, 4, 2));
        let want: Vec<u16> =
            Vec::<i64>::try_from(routing.unwrap().narrow(0, 0, ids.len() as i64 - 1).reshape([-1]))
                .unwrap()
                .into_iter()
                .map(|e| e as u16)
                .collect();
        assert_eq!(r.experts, want, "engine routing = the trainer's");
    }
    let forwards = engine.counts().forwards;
    assert!(
        forwards <= 80,
        "{forwards} forwards: the two decodes were not batched"
    );
}

/// A GSPO train-step with routing replay on the tiny Qwen3.5 (regression: train-step refused
/// the family, "missing required key `rope_theta`"): the step replays its own routing (overlap
/// 1), reproduces the rollout log-probs, changes the policy and keeps the vision and MTP tensors.
#[test]
fn qwen35_gspo_train_step_with_replay() {
    let dir = tiny_qwen35();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    let seqs: Vec<Vec<i64>> = (0..3)
        .map(|i| (0..24).map(|t| (t * 7919 + i * 104729 + 11) % 151643).collect())
        .collect();
    let samples = vec![
        sample(&model, "a", 0, &seqs[0], 8, 1.0, 1.0),
        sample(&model, "b", 0, &seqs[1], 8, 0.0, 1.0),
        sample(&model, "c", 0, &seqs[2], 8, 0.5, 1.0),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, &samples);
    let out = tmp.path().join("step-1");
    let metrics = tmp.path().join("metrics.jsonl.zst");
    lego()
        .args(["train-step", "--checkpoint"])
        .arg(&dir)
        .arg("-i")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .arg("--metrics")
        .arg(&metrics)
        .args(CLI_OPTS)
        .assert()
        .success();
    let m = &read_metrics(&metrics)[0];
    assert_eq!(m.expert_overlap, Some(1.0), "own routing recorded and replayed");
    assert!(m.logprob_pearson.unwrap() > 0.999_999, "{:?}", m.logprob_pearson);
    assert!(m.logprob_max_abs_diff.unwrap() < 1e-4);
    assert!(m.grad_norm.unwrap() > 0.0);
    let input_t = raw_tensors(&dir.join("model.safetensors"));
    let saved = raw_tensors(&out.join("model.safetensors"));
    assert_eq!(
        saved.keys().collect::<Vec<_>>(),
        input_t.keys().collect::<Vec<_>>()
    );
    for (name, t) in &input_t {
        if name.starts_with("mtp.") || name.starts_with("model.visual.") {
            assert!(
                saved[name] == *t,
                "`{name}` is not trained and must be carried through"
            );
        }
    }
    assert!(
        saved["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"]
            != input_t["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"],
        "the step trained the Gated DeltaNet"
    );
    let new = Model::load(&out, Device::Cpu, None).unwrap();
    let (a, _, _) = seq_logprobs(&model.lm, &seqs[0], None);
    let (b, _, _) = seq_logprobs(&new.lm, &seqs[0], None);
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-4));
}
