//! Model parity with transformers (log-probs within 1e-4, routing exact), packing, KV-cache
//! decoding, save → transformers load, and R3 routing replay.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lego_rl::model::{AttnMask, CausalLm, ForwardInput, KvCache, Model, ModelError};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::common;

fn ids_tensor(ids: &[i64]) -> Tensor {
    Tensor::from_slice(ids)
}

/// Next-token log-probs of one sequence (positions 0..n-2), plus the routing used / own top-k.
pub fn seq_logprobs(
    lm: &CausalLm,
    ids: &[i64],
    replay: Option<&Tensor>,
) -> (Vec<f64>, Option<Tensor>, Option<Tensor>) {
    let _g = tch::no_grad_guard();
    let n = ids.len() as i64;
    let tokens = ids_tensor(ids);
    let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu));
    let input = ForwardInput {
        replay,
        ..ForwardInput::causal(&tokens, &pos)
    };
    let out = lm.forward(&input, None);
    let at = Tensor::arange(n - 1, (Kind::Int64, Device::Cpu));
    let (lp, _) = lm.next_token_logprobs(&out.hidden, &at, &tokens.narrow(0, 1, n - 1), false);
    (
        Vec::<f64>::try_from(lp.to_kind(Kind::Double)).unwrap(),
        out.routing,
        out.router_topk,
    )
}

pub fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

pub fn ids_of(seq: &Value) -> Vec<i64> {
    seq["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// `[T, L, k]` routing tensor → nested Vec `[L][T][k]` like reference.json.
pub fn routing_lists(r: &Tensor) -> Vec<Vec<Vec<i64>>> {
    let r = r.permute([1, 0, 2]).contiguous();
    let s = r.size();
    let flat = Vec::<i64>::try_from(r.reshape([-1])).unwrap();
    (0..s[0] as usize)
        .map(|l| {
            (0..s[1] as usize)
                .map(|t| {
                    let o = (l * s[1] as usize + t) * s[2] as usize;
                    flat[o..o + s[2] as usize].to_vec()
                })
                .collect()
        })
        .collect()
}

pub fn reference_routing(seq: &Value) -> Vec<Vec<Vec<i64>>> {
    serde_json::from_value(seq["topk_experts"].clone()).unwrap()
}

/// The committed tiny dense checkpoint (vocab 4096, untied head, published config layout).
pub fn tiny_dense() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/models/tiny-qwen3")
}

/// The generated tiny MoE checkpoint (vocab 151936, tied, newer config layout); generated once
/// by scripts/make_tiny_models.py with transformers.
pub fn tiny_moe() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    generated(&DIR, "tiny-qwen3-moe")
}

/// The tiny MoE's weights rounded to bfloat16 and saved as bfloat16 (as published Qwen
/// checkpoints are), generated like [`tiny_moe`].
pub fn tiny_moe_bf16() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    generated(&DIR, "tiny-qwen3-moe-bf16")
}

/// `testdata/models/generated/NAME`, made by scripts/make_tiny_models.py once when missing.
pub(crate) fn generated(cell: &OnceLock<PathBuf>, name: &str) -> PathBuf {
    cell.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = root.join("testdata/models/generated").join(name);
        if !dir.join("reference.json").is_file() {
            let status = std::process::Command::new(common::python())
                .arg(root.join("scripts/make_tiny_models.py"))
                .arg(&dir)
                .status()
                .expect("running scripts/make_tiny_models.py (needs the venv: scripts/setup.sh)");
            assert!(status.success(), "make_tiny_models.py failed");
        }
        dir
    })
    .clone()
}

#[test]
fn dense_log_probs_and_logits_match_transformers() {
    let dir = tiny_dense();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    assert!(!model.cfg().tie_word_embeddings);
    let reference = read_json(&dir.join("reference.json"));
    for seq in reference["sequences"].as_array().unwrap() {
        let ids = ids_of(seq);
        let (lp, routing, _) = seq_logprobs(&model.lm, &ids, None);
        assert!(routing.is_none());
        let d = max_abs_diff(&lp, &floats(&seq["next_token_logprobs"]));
        assert!(d < 1e-4, "{}: log-prob max |Δ| {d}", seq["name"]);
        assert_last_logits(&model, &ids, seq);
    }
}

/// The raw logits at the last three positions of `ids`, vocab ids 0..15, equal the reference
/// sequence's `logits_last3_first16` within 1e-4.
pub fn assert_last_logits(model: &Model, ids: &[i64], seq: &Value) {
    let _g = tch::no_grad_guard();
    let n = ids.len() as i64;
    let t = ids_tensor(ids);
    let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu));
    let h = model.lm.forward(&ForwardInput::causal(&t, &pos), None).hidden;
    let logits = model
        .lm
        .logits(&h.narrow(0, n - 3, 3))
        .narrow(1, 0, 16)
        .to_kind(Kind::Double);
    let got = Vec::<f64>::try_from(logits.reshape([-1])).unwrap();
    let want: Vec<f64> = seq["logits_last3_first16"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(floats)
        .collect();
    let d = max_abs_diff(&got, &want);
    assert!(d < 1e-4, "{}: logits max |Δ| {d}", seq["name"]);
}

#[test]
fn moe_log_probs_and_routing_match_transformers() {
    let dir = tiny_moe();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    assert_eq!(
        model.cfg().num_experts,
        8,
        "num_local_experts read from the newer layout"
    );
    assert_eq!(model.cfg().rope_theta, 1e6, "rope_parameters.rope_theta read");
    assert_eq!(model.lm.moe_layers(), 2, "layer 1 is dense (mlp_only_layers)");
    let reference = read_json(&dir.join("reference.json"));
    for seq in reference["sequences"].as_array().unwrap() {
        let ids = ids_of(seq);
        let (lp, routing, own) = seq_logprobs(&model.lm, &ids, None);
        let d = max_abs_diff(&lp, &floats(&seq["next_token_logprobs"]));
        assert!(d < 1e-4, "{}: log-prob max |Δ| {d}", seq["name"]);
        let routing = routing.unwrap();
        assert_eq!(routing.size(), vec![ids.len() as i64, 2, 2]);
        assert_eq!(routing_lists(&routing), reference_routing(seq), "{}", seq["name"]);
        assert!(routing.equal(&own.unwrap()));
    }
}

#[test]
fn packed_sequences_equal_separate_forwards() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let reference = read_json(&tiny_moe().join("reference.json"));
    let seqs: Vec<Vec<i64>> = reference["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids_of)
        .collect();
    let _g = tch::no_grad_guard();
    let (out, tokens) = packed_forward(&model, &seqs);
    let mut offset = 0i64;
    for s in &seqs {
        let len = s.len() as i64;
        let at = Tensor::arange_start(offset, offset + len - 1, (Kind::Int64, Device::Cpu));
        let next = tokens.narrow(0, offset + 1, len - 1);
        let (lp, _) = model.lm.next_token_logprobs(&out.hidden, &at, &next, false);
        let (alone, routing, _) = seq_logprobs(&model.lm, s, None);
        let d = max_abs_diff(&Vec::<f64>::try_from(lp.to_kind(Kind::Double)).unwrap(), &alone);
        assert!(d < 1e-5, "packed vs alone |Δ| {d}");
        assert!(out
            .routing
            .as_ref()
            .unwrap()
            .narrow(0, offset, len)
            .equal(&routing.unwrap()));
        offset += len;
    }
}

/// Prefill then one token at a time through the KV cache gives the full forward's log-probs, for
/// the dense model and for the MoE (whose one-token steps take the direct expert path).
#[test]
fn kv_cache_decoding_equals_full_forward() {
    for dir in [tiny_dense(), tiny_moe()] {
        kv_cache_decoding_equals_full_forward_of(&dir);
    }
}

fn kv_cache_decoding_equals_full_forward_of(dir: &Path) {
    let model = Model::load(dir, Device::Cpu, None).unwrap();
    let ids: Vec<i64> = (0..20).map(|i| (i * 97 + 13) % 4096).collect();
    let (full, _, _) = seq_logprobs(&model.lm, &ids, None);
    let _g = tch::no_grad_guard();
    let mut cache = KvCache::new(0);
    let mut got = Vec::new();
    let prefix = 7usize;
    let mut fed = 0usize;
    while fed < ids.len() - 1 {
        let step = if fed == 0 { prefix } else { 1 };
        let t = Tensor::from_slice(&ids[fed..fed + step]);
        let pos = Tensor::arange_start(fed as i64, (fed + step) as i64, (Kind::Int64, Device::Cpu));
        let out = model
            .lm
            .forward(&ForwardInput::causal(&t, &pos), Some(&mut cache));
        let logits = model.lm.logits(&out.hidden).log_softmax(-1, Kind::Float);
        for j in 0..step {
            got.push(logits.double_value(&[j as i64, ids[fed + j + 1]]));
        }
        fed += step;
        assert_eq!(cache.len(), fed as i64);
    }
    let d = max_abs_diff(&got, &full);
    assert!(d < 1e-5, "{}: cached vs full |Δ| {d}", dir.display());
}

/// Sequences of different prompt lengths decoded together (`decode_batch`, joining and leaving
/// the batch at different steps) get, row for row, the log-probs and routing of decoding each
/// alone: for the dense model, and for the MoE, where a batch of several tokens takes the
/// grouped expert dispatch and a lone token the direct one-token path.
#[test]
fn batched_decoding_equals_decoding_each_alone() {
    for dir in [tiny_dense(), tiny_moe()] {
        batched_decoding_equals_decoding_each_alone_of(&dir);
    }
}

/// Next-token log-probs `[T, vocab]` and routing of one forward that continues `cache`.
fn cached_step(lm: &CausalLm, ids: &[i64], start: usize, cache: &mut KvCache) -> (Tensor, Option<Tensor>) {
    let t = Tensor::from_slice(ids);
    let pos = Tensor::arange_start(
        start as i64,
        (start + ids.len()) as i64,
        (Kind::Int64, Device::Cpu),
    );
    let out = lm.forward(&ForwardInput::causal(&t, &pos), Some(cache));
    (lm.logits(&out.hidden).log_softmax(-1, Kind::Float), out.routing)
}

fn batched_decoding_equals_decoding_each_alone_of(dir: &Path) {
    let model = Model::load(dir, Device::Cpu, None).unwrap();
    let lm = &model.lm;
    let _g = tch::no_grad_guard();
    // (prompt length, first step in the batch, decode steps) per sequence.
    let plan = [(3usize, 0usize, 6usize), (11, 0, 2), (6, 1, 5), (15, 3, 4)];
    let ids: Vec<Vec<i64>> = plan
        .iter()
        .enumerate()
        .map(|(s, &(n, _, steps))| {
            (0..n + steps)
                .map(|i| ((i * 97 + s * 389 + 13) % 4096) as i64)
                .collect()
        })
        .collect();
    let prefilled = |n: usize, ids: &[i64]| {
        let mut cache = KvCache::new(0);
        let _ = cached_step(lm, &ids[..n], 0, &mut cache);
        cache
    };
    // Alone: prefill, then one token per forward.
    let alone: Vec<Vec<(Tensor, Option<Tensor>)>> = plan
        .iter()
        .zip(&ids)
        .map(|(&(n, _, steps), ids)| {
            let mut cache = prefilled(n, ids);
            (n..n + steps)
                .map(|p| cached_step(lm, &ids[p..=p], p, &mut cache))
                .collect()
        })
        .collect();
    // Batched: each sequence prefilled alone, then its decode steps in batches of whichever
    // sequences are decoding at that step.
    let mut caches: Vec<KvCache> = plan
        .iter()
        .zip(&ids)
        .map(|(&(n, _, _), ids)| prefilled(n, ids))
        .collect();
    let mut widest = 0;
    for step in 0..10 {
        let members: Vec<usize> = (0..plan.len())
            .filter(|&s| (plan[s].1..plan[s].1 + plan[s].2).contains(&step))
            .collect();
        if members.is_empty() {
            continue;
        }
        widest = widest.max(members.len());
        let at = |s: usize| plan[s].0 + step - plan[s].1;
        let tokens = Tensor::from_slice(&members.iter().map(|&s| ids[s][at(s)]).collect::<Vec<_>>());
        let positions = Tensor::from_slice(&members.iter().map(|&s| at(s) as i64).collect::<Vec<_>>());
        let mut batch: Vec<&mut KvCache> = caches
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| members.contains(s))
            .map(|(_, c)| c)
            .collect();
        let out = lm.decode_batch(&tokens, &positions, &mut batch);
        assert_eq!(out.hidden.size(), [members.len() as i64, lm.cfg.hidden_size]);
        let logp = lm.logits(&out.hidden).log_softmax(-1, Kind::Float);
        for (row, &s) in members.iter().enumerate() {
            let (want_logp, want_routing) = &alone[s][step - plan[s].1];
            let got = logp.narrow(0, row as i64, 1);
            let d = (&got - want_logp).abs().max().double_value(&[]);
            assert!(
                d <= 1e-4,
                "{}: sequence {s} step {step}: |Δ log-prob| {d}",
                dir.display()
            );
            match (&out.routing, want_routing) {
                (Some(r), Some(w)) => assert!(
                    r.narrow(0, row as i64, 1).equal(w),
                    "{}: sequence {s} step {step}: routing differs",
                    dir.display()
                ),
                (None, None) => {}
                _ => panic!("routing present on one side only"),
            }
        }
        for (s, c) in caches.iter().enumerate() {
            let fed = plan[s].0 + (step + 1).saturating_sub(plan[s].1).min(plan[s].2);
            assert_eq!(c.len(), fed as i64, "sequence {s}'s cache after step {step}");
        }
    }
    assert_eq!(widest, 3, "the plan has a step with three sequences in the batch");
}

#[test]
fn missing_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tiny_dense();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let tensors = Tensor::read_safetensors(src.join("model.safetensors")).unwrap();
    let kept: Vec<(String, Tensor)> = tensors
        .into_iter()
        .filter(|(n, _)| n != "model.layers.1.self_attn.k_norm.weight")
        .collect();
    Tensor::write_safetensors(&kept, tmp.path().join("model.safetensors")).unwrap();
    let err = Model::load(tmp.path(), Device::Cpu, None).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name, .. } if name == "model.layers.1.self_attn.k_norm.weight"),
        "{err}"
    );
    assert!(err.to_string().contains("model.layers.1.self_attn.k_norm.weight"));
}

/// Adds `scale`·N(0,1) (seeded) to every router weight.
pub fn perturb_routers(model: &Model, scale: f64) {
    use rand::{Rng, SeedableRng};
    // Own seeded generator (Box–Muller normals), not libtorch's global one: tests run in parallel
    // threads, and another test drawing from or seeding the global generator between
    // `manual_seed` and `randn_like` made the noise, and so the figures, vary from run to run.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let _g = tch::no_grad_guard();
    for (name, mut t) in model.named_variables() {
        if name.ends_with("mlp.gate.weight") {
            let normals: Vec<f32> = (0..t.numel())
                .map(|_| {
                    let (u1, u2): (f64, f64) = (1.0 - rng.gen::<f64>(), rng.gen());
                    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * scale) as f32
                })
                .collect();
            let noise = tch::Tensor::from_slice(&normals)
                .reshape(t.size())
                .to_kind(t.kind());
            let _ = t.g_add_(&noise);
        }
    }
}

#[test]
fn routing_replay_restores_recorded_routing_and_improves_agreement() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let reference = read_json(&tiny_moe().join("reference.json"));
    let seq = &reference["sequences"][0];
    let ids = ids_of(seq);
    let (recorded_lp, recorded, _) = seq_logprobs(&model.lm, &ids, None);
    let recorded = recorded.unwrap();
    perturb_routers(&model, 0.1);
    let (free_lp, free_routing, _) = seq_logprobs(&model.lm, &ids, None);
    let free_routing = free_routing.unwrap();
    let sets_equal = |a: &Tensor, b: &Tensor| {
        let (sa, _) = a.sort(-1, false);
        let (sb, _) = b.sort(-1, false);
        sa.eq_tensor(&sb)
            .all_dim(-1, false)
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[])
    };
    let overlap_free = sets_equal(&free_routing, &recorded);
    assert!(
        overlap_free < 1.0,
        "perturbation must change some routes (overlap {overlap_free})"
    );
    // Replay all T rows, and the engine's T-1 rows (last row routes on its own).
    for rows in [ids.len() as i64, ids.len() as i64 - 1] {
        let replay = Tensor::full([ids.len() as i64, 2, 2], -1, (Kind::Int64, Device::Cpu));
        replay.narrow(0, 0, rows).copy_(&recorded.narrow(0, 0, rows));
        let (replay_lp, used, _) = seq_logprobs(&model.lm, &ids, Some(&replay));
        let used = used.unwrap();
        assert!(
            used.narrow(0, 0, rows).equal(&recorded.narrow(0, 0, rows)),
            "replayed rows equal the record"
        );
        let d_free = max_abs_diff(&free_lp, &recorded_lp);
        let d_replay = max_abs_diff(&replay_lp, &recorded_lp);
        let mean = |a: &[f64]| {
            a.iter()
                .zip(&recorded_lp)
                .map(|(x, y)| (x - y).abs())
                .sum::<f64>()
                / a.len() as f64
        };
        assert!(d_replay < d_free, "replay max |Δ| {d_replay} vs free {d_free}");
        assert!(mean(&replay_lp) < mean(&free_lp), "mean |Δ| improves with replay");
    }
}

#[test]
fn saved_checkpoint_loads_in_transformers_with_same_function() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    perturb_routers(&model, 0.05);
    let tmp = tempfile::tempdir().unwrap();
    model.save(tmp.path()).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        assert!(tmp.path().join(f).is_file(), "{f} written");
    }
    // Same names and dtype as the source file.
    let names = |p: &Path| {
        let mut v: Vec<(String, Kind)> = Tensor::read_safetensors(p.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(n, t)| (n, t.kind()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(names(tmp.path()), names(&tiny_moe()));
    let reference = read_json(&tiny_moe().join("reference.json"));
    let ids_json = tmp.path().join("ids.json");
    let ids_only = serde_json::json!({"sequences": reference["sequences"].as_array().unwrap().iter()
        .map(|s| serde_json::json!({"name": s["name"], "input_ids": s["input_ids"]})).collect::<Vec<_>>()});
    std::fs::write(&ids_json, ids_only.to_string()).unwrap();
    let out = tmp.path().join("hf.json");
    let status = std::process::Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/hf_reference.py"))
        .arg(tmp.path())
        .arg(&ids_json)
        .arg(&out)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "transformers failed to load the saved checkpoint"
    );
    let hf = read_json(&out);
    for seq in hf["sequences"].as_array().unwrap() {
        let ids = ids_of(seq);
        let (lp, routing, _) = seq_logprobs(&model.lm, &ids, None);
        let d = max_abs_diff(&lp, &floats(&seq["next_token_logprobs"]));
        assert!(
            d < 1e-4,
            "{}: saved-then-transformers log-prob |Δ| {d}",
            seq["name"]
        );
        assert_eq!(routing_lists(&routing.unwrap()), reference_routing(seq));
    }
}

#[test]
fn bf16_compute_stays_close_to_fp32() {
    let dir = tiny_dense();
    let fp32 = Model::load(&dir, Device::Cpu, None).unwrap();
    let bf16 = Model::load(&dir, Device::Cpu, Some(Kind::BFloat16)).unwrap();
    assert_eq!(bf16.file_kind, Kind::Float, "saving keeps the checkpoint's dtype");
    assert_eq!(bf16.named_variables()[0].1.kind(), Kind::BFloat16);
    let ids: Vec<i64> = (0..16).map(|i| (i * 389 + 3) % 4096).collect();
    let (a, _, _) = seq_logprobs(&fp32.lm, &ids, None);
    let (b, _, _) = seq_logprobs(&bf16.lm, &ids, None);
    let d = max_abs_diff(&a, &b);
    assert!(d > 0.0 && d < 0.05, "bf16 vs fp32 log-prob |Δ| {d}");
}

/// One forward of `seqs` packed into one row, each attending only within itself; returns its
/// output and the packed tokens.
pub fn packed_forward(model: &Model, seqs: &[Vec<i64>]) -> (lego_rl::model::ForwardOutput, Tensor) {
    let all: Vec<i64> = seqs.concat();
    let (mut pos, mut segments) = (Vec::new(), Vec::new());
    for s in seqs {
        segments.push((pos.len() as i64, s.len() as i64));
        pos.extend(0..s.len() as i64);
    }
    let tokens = Tensor::from_slice(&all);
    let positions = Tensor::from_slice(&pos);
    let out = model.lm.forward(
        &ForwardInput {
            tokens: &tokens,
            positions: &positions,
            mask: AttnMask::Packed(&segments),
            replay: None,
        },
        None,
    );
    (out, tokens)
}
