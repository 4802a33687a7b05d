//! train-step: CLI end to end on the tiny MoE, bad input, resume equivalence, and a toy task the
//! policy measurably learns with GSPO.

use std::path::{Path, PathBuf};

use lego_rl::model::{probe, ForwardInput, KvCache, Model};
use lego_rl::records::{LossMask, Packed, Record, Sample, StepMetrics};
use lego_rl::train::{AdamWConfig, LossKind, Settings, Trainer};
use tch::{Device, Kind, Tensor};

use crate::common::lego;
use crate::model::{seq_logprobs, tiny_dense, tiny_moe};

/// A sample whose rollout log-probs and routing are the model's own (a perfect rollout engine).
pub fn sample(
    model: &Model,
    traj: &str,
    group: u64,
    tokens: &[i64],
    prompt: usize,
    reward: f64,
    weight: f64,
) -> Sample {
    let (lp, routing, _) = seq_logprobs(&model.lm, tokens, None);
    let mask: Vec<bool> = (0..tokens.len()).map(|t| t >= prompt).collect();
    let rollout: Vec<f32> = (prompt..tokens.len()).map(|t| lp[t - 1] as f32).collect();
    let routing = routing.map(|r| {
        let shape: Vec<usize> = r.size().iter().map(|&d| d as usize).collect();
        let ids: Vec<u16> = Vec::<i64>::try_from(r.reshape([-1]))
            .unwrap()
            .into_iter()
            .map(|e| e as u16)
            .collect();
        Packed::from_experts(shape, &ids)
    });
    Sample {
        schema: Sample::SCHEMA.into(),
        id: format!("{traj}#0.0"),
        trajectory_id: traj.into(),
        task_id: format!("task-{group}"),
        group_id: group,
        sample_index: 0,
        thread: 0,
        segment: 0,
        token_ids: tokens.iter().map(|&t| t as u32).collect(),
        loss_mask: LossMask::from_dense(&mask),
        rollout_logprobs: Packed::f32_vec(&rollout),
        sampling: Vec::new(),
        routing,
        reward,
        weight,
        policy_version: 0,
        policy_versions: Vec::new(),
        metadata: Default::default(),
    }
}

/// Two groups of the MoE reference sequences: group 0 has rewards 1/0 plus an infra failure,
/// group 1 is zero-variance; one trajectory is split into two segments. (Token ids wrap at the
/// model's vocabulary, so the dense 4096-token checkpoint can use them too.)
pub fn moe_samples(model: &Model) -> Vec<Sample> {
    let vocab = model.cfg().vocab_size;
    let seqs: Vec<Vec<i64>> = (0..4)
        .map(|i| {
            (0..24)
                .map(|t| (t * 7919 + i * 104729 + 11) % 151643 % vocab)
                .collect()
        })
        .collect();
    let mut v = vec![
        sample(model, "a", 0, &seqs[0], 8, 1.0, 1.0),
        sample(model, "b", 0, &seqs[1], 8, 0.0, 1.0),
        sample(model, "c", 0, &seqs[2], 8, 1.0, 0.0),
        sample(model, "d", 1, &seqs[3], 8, 1.0, 1.0),
        sample(model, "e", 1, &seqs[0][..12], 4, 1.0, 1.0),
    ];
    let mut seg = sample(model, "a", 0, &seqs[3][..16], 10, 1.0, 1.0);
    seg.id = "a#0.1".into();
    seg.segment = 1;
    v.push(seg);
    v
}

pub fn write_samples(path: &Path, samples: &[Sample]) {
    let mut w = lego_rl::io::AtomicWriter::create(path).unwrap();
    for s in samples {
        w.write(s).unwrap();
    }
    w.finish().unwrap();
}

pub fn read_metrics(path: &Path) -> Vec<StepMetrics> {
    lego_rl::io::read_all(path, Default::default()).unwrap()
}

pub fn settings() -> Settings {
    Settings {
        micro_batch_tokens: 40,
        optim: AdamWConfig {
            lr: 1e-3,
            warmup_steps: 2,
            ..AdamWConfig::default()
        },
        ..Settings::default()
    }
}

pub const CLI_OPTS: [&str; 6] = [
    "--micro-batch-tokens",
    "40",
    "--lr",
    "1e-3",
    "--warmup-steps",
    "2",
];

/// `lego-rl train-step` from the tiny MoE on `input` into `out`, with [`CLI_OPTS`].
fn train_step(input: &Path, out: &Path) -> assert_cmd::Command {
    let mut c = lego();
    c.args(["train-step", "--checkpoint"])
        .arg(tiny_moe())
        .arg("-i")
        .arg(input)
        .arg("--out")
        .arg(out)
        .args(CLI_OPTS);
    c
}

#[test]
fn train_step_writes_checkpoint_and_metrics() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, &moe_samples(&model));
    let out = tmp.path().join("step-1");
    let metrics = tmp.path().join("metrics.jsonl.zst");
    train_step(&input, &out)
        .arg("--metrics")
        .arg(&metrics)
        .assert()
        .success();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "optimizer/manifest.json",
        "optimizer/all/slice-00000-of-00001.safetensors",
        "trainer_state.json",
        "lego-rl.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("lego-rl.json")).unwrap()).unwrap();
    assert_eq!(info["policy_version"], 1);
    // The weight probe is the updated weights' (not the parent's), as a server scores them.
    let lp = probe_matches_checkpoint(&out);
    assert_ne!(
        lp,
        probe::logprobs(&model),
        "the step moved the probe's log-probs"
    );
    // A copy that kept the step counter but lost the optimizer state is refused by name, not
    // resumed with fresh moments under a late step's bias correction.
    let partial = tmp.path().join("partial");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&out)
        .arg(&partial)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::remove_dir_all(partial.join("optimizer")).unwrap();
    // A probe.json copied along into a checkpoint of another version is not trusted: a reload
    // that kept the old weights would otherwise verify against it.
    let mut other: serde_json::Value = info.clone();
    other["policy_version"] = 2.into();
    std::fs::write(partial.join("lego-rl.json"), other.to_string()).unwrap();
    assert_eq!(probe::read(&partial).unwrap(), None);
    let e = Trainer::load(&partial, Device::Cpu, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("partial/optimizer") && e.contains("counts 1 optimizer steps"),
        "{e}"
    );
    assert_eq!(info["samples_consumed"], 6);
    let m = &read_metrics(&metrics)[0];
    assert_eq!(m.step, 1);
    assert_eq!(
        (
            m.groups,
            m.valid_trajectories,
            m.infra_failed_trajectories,
            m.samples
        ),
        (2, 4, 1, 6)
    );
    assert_eq!(m.zero_variance_group_fraction, Some(0.5));
    assert_eq!(m.expert_overlap, Some(1.0), "own routing recorded and replayed");
    assert!(m.logprob_pearson.unwrap() > 0.999_999, "{:?}", m.logprob_pearson);
    assert!(m.logprob_max_abs_diff.unwrap() < 1e-4);
    assert_eq!(m.ratio_mean, Some(1.0), "π_θ = π_old on the first update");
    // Near-uniform tiny model: entropy ≈ ln(151936) = 11.93.
    assert!(
        (m.entropy.unwrap() - 151936f64.ln()).abs() < 0.2,
        "{:?}",
        m.entropy
    );
    assert!(m.grad_norm.unwrap() > 0.0);
    assert!((m.lr - 5e-4).abs() < 1e-12, "first warmup step: lr/2");
    assert_eq!(m.policy_tokens, 16 * 4 + 8 + 6);
    // The update changed the policy.
    let new = Model::load(&out, Device::Cpu, None).unwrap();
    let ids: Vec<i64> = (0..20).map(|t| t * 31 + 5).collect();
    let (a, _, _) = seq_logprobs(&model.lm, &ids, None);
    let (b, _, _) = seq_logprobs(&new.lm, &ids, None);
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-4));
}

fn expect_bad_input(checkpoint: &Path, samples: &[Sample], needles: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, samples);
    let out = tmp.path().join("out");
    let metrics = tmp.path().join("metrics.jsonl.zst");
    let o = lego()
        .args(["train-step", "--checkpoint"])
        .arg(checkpoint)
        .arg("-i")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .arg("--metrics")
        .arg(&metrics)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert!(!out.exists(), "nothing written to --out");
    assert!(!metrics.exists(), "no metrics appended");
    let leftovers: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(leftovers, vec![input], "no temp dirs left behind");
}

#[test]
fn bad_input_fails_with_named_record_and_writes_nothing() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let good = moe_samples(&model);
    let mut vocab = good.clone();
    vocab[2].token_ids[5] = 151936;
    expect_bad_input(
        &tiny_moe(),
        &vocab,
        &[
            "record 3",
            "sample `c#0.0`",
            "token_ids[5] = 151936",
            "vocab_size 151936",
        ],
    );
    let mut layers = good.clone();
    let r = layers[1].routing.as_mut().unwrap();
    r.shape = vec![r.shape[0] * 2, 1, 2];
    expect_bad_input(
        &tiny_moe(),
        &layers,
        &["record 2", "routing has shape [48, 1, 2]", "[24 or 23, 2, 2]"],
    );
    // A checkpoint missing a tensor.
    let ckpt = tempfile::tempdir().unwrap();
    std::fs::copy(tiny_dense().join("config.json"), ckpt.path().join("config.json")).unwrap();
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(tiny_dense().join("model.safetensors"))
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .collect();
    Tensor::write_safetensors(&kept, ckpt.path().join("model.safetensors")).unwrap();
    let dense = Model::load(&tiny_dense(), Device::Cpu, None).unwrap();
    let s = vec![sample(&dense, "x", 0, &[1, 2, 3, 4], 2, 1.0, 1.0)];
    expect_bad_input(ckpt.path(), &s, &["no tensor `lm_head.weight`"]);
}

#[test]
fn two_steps_in_one_process_equal_two_invocations() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let batch1 = moe_samples(&model);
    let mut batch2 = batch1.clone();
    for (i, s) in batch2.iter_mut().enumerate() {
        s.reward = (i % 2) as f64;
        s.weight = 1.0;
    }
    // Segments of trajectory "a" must agree on the reward.
    batch2[5].reward = batch2[0].reward;
    drop(model);
    let tmp = tempfile::tempdir().unwrap();
    let (in1, in2) = (tmp.path().join("b1.jsonl.zst"), tmp.path().join("b2.jsonl.zst"));
    write_samples(&in1, &batch1);
    write_samples(&in2, &batch2);
    // In one process.
    let mut t = Trainer::load(&tiny_moe(), Device::Cpu, None).unwrap();
    t.step(&batch1, &in1, &settings()).unwrap();
    t.step(&batch2, &in2, &settings()).unwrap();
    // Two invocations.
    let mut from = tiny_moe();
    for (i, input) in [&in1, &in2].into_iter().enumerate() {
        let out = tmp.path().join(format!("step-{}", i + 1));
        lego()
            .args(["train-step", "--checkpoint"])
            .arg(&from)
            .arg("-i")
            .arg(input)
            .arg("--out")
            .arg(&out)
            .args(CLI_OPTS)
            .assert()
            .success();
        from = out;
    }
    let resumed = Model::load(&from, Device::Cpu, None).unwrap();
    let mut max = 0f64;
    for ((na, a), (nb, b)) in t.model.named_variables().iter().zip(resumed.named_variables()) {
        assert_eq!(na, &nb);
        max = max.max((a - b).abs().max().double_value(&[]));
    }
    assert!(max <= 1e-6, "weights differ by {max}");
    let changed = (t.model.named_variables()[0].1.shallow_clone()
        - Model::load(&tiny_moe(), Device::Cpu, None)
            .unwrap()
            .named_variables()[0]
            .1
            .shallow_clone())
    .abs()
    .max()
    .double_value(&[]);
    assert!(changed > 0.0, "the two steps changed the weights");
    assert_eq!(t.opt.steps, 2);
}

/// Toy task on a tiny random Qwen3 (vocab 64): after a 3-token prompt the policy writes 2 tokens;
/// reward 1 iff both are in the lower half of the vocabulary (≈ 1/4 at the start). 16 GSPO steps
/// of 8 groups × 8 samples. (On the 4096-token checkpoint each token is sampled too rarely for a
/// vocabulary-wide preference to emerge in a few dozen steps.)
#[test]
fn gspo_raises_reward_on_a_toy_task() {
    tch::manual_seed(0);
    let cfg = lego_rl::model::Config::tiny();
    let mut trainer = Trainer::new(Model::random(&cfg, Device::Cpu, Kind::Float));
    let s = Settings {
        loss: LossKind::Gspo,
        optim: AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.0,
            ..AdamWConfig::default()
        },
        ..Settings::default()
    };
    let (groups, per_group, gen) = (8u64, 8u32, 2);
    let mut curve = Vec::new();
    let path = PathBuf::from("toy");
    for step in 0..16u64 {
        let mut samples = Vec::new();
        for g in 0..groups {
            let prompt: Vec<i64> = (0..3)
                .map(|j| ((step * 131 + g * 17 + j * 7) % 64) as i64)
                .collect();
            for k in 0..per_group {
                // Sample with a KV cache, recording the sampling log-probs like an engine would.
                let _guard = tch::no_grad_guard();
                let mut cache = KvCache::new(0);
                let mut toks = prompt.clone();
                let mut lps = Vec::new();
                let mut fed = 0;
                for _ in 0..gen {
                    let t = Tensor::from_slice(&toks[fed..]);
                    let pos = Tensor::arange_start(fed as i64, toks.len() as i64, (Kind::Int64, Device::Cpu));
                    let h = trainer
                        .model
                        .lm
                        .forward(&ForwardInput::causal(&t, &pos), Some(&mut cache))
                        .hidden;
                    fed = toks.len();
                    let logp = trainer.model.lm.logits(&h.get(-1)).log_softmax(-1, Kind::Float);
                    let next = logp.exp().multinomial(1, false).int64_value(&[0]);
                    lps.push(logp.double_value(&[next]) as f32);
                    toks.push(next);
                }
                let reward = toks[3..].iter().all(|&t| t < 32) as u8 as f64;
                let mask: Vec<bool> = (0..toks.len()).map(|t| t >= 3).collect();
                samples.push(Sample {
                    schema: Sample::SCHEMA.into(),
                    id: format!("s{step}-g{g}-{k}#0.0"),
                    trajectory_id: format!("s{step}-g{g}-{k}"),
                    task_id: format!("toy-{g}"),
                    group_id: g,
                    sample_index: k,
                    thread: 0,
                    segment: 0,
                    token_ids: toks.iter().map(|&t| t as u32).collect(),
                    loss_mask: LossMask::from_dense(&mask),
                    rollout_logprobs: Packed::f32_vec(&lps),
                    sampling: Vec::new(),
                    routing: None,
                    reward,
                    weight: 1.0,
                    policy_version: step,
                    policy_versions: Vec::new(),
                    metadata: Default::default(),
                });
            }
        }
        let m = trainer.step(&samples, &path, &s).unwrap();
        assert_eq!(
            m.logprob_max_abs_diff.map(|d| d < 1e-4),
            Some(true),
            "engine and trainer agree"
        );
        curve.push(m.reward_mean.unwrap());
    }
    let first = curve[..4].iter().sum::<f64>() / 4.0;
    let last = curve[curve.len() - 4..].iter().sum::<f64>() / 4.0;
    eprintln!("toy reward curve: {curve:.2?}");
    assert!(last > first + 0.3, "mean reward {first:.3} → {last:.3}");
}

#[test]
fn later_updates_of_a_step_see_moved_ratios() {
    // Two mini-batches: the second is scored after the first update, so its sequence ratios
    // move away from 1, beyond the clip band (whether the clipped branch is active depends on
    // the direction of the move; the branch logic is covered by the GSPO math unit test).
    let model = Model::load(&tiny_dense(), Device::Cpu, None).unwrap();
    let seq = |i: i64| -> Vec<i64> { (0..12).map(|t| (t * 131 + i * 977 + 1) % 4096).collect() };
    let samples = vec![
        sample(&model, "a", 0, &seq(0), 4, 1.0, 1.0),
        sample(&model, "b", 0, &seq(1), 4, 0.0, 1.0),
        sample(&model, "c", 1, &seq(2), 4, 1.0, 1.0),
        sample(&model, "d", 1, &seq(3), 4, 0.0, 1.0),
    ];
    let mut t = Trainer::new(model);
    let s = Settings {
        updates: 2,
        optim: AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
        ..Settings::default()
    };
    let m = t.step(&samples, Path::new("mem"), &s).unwrap();
    assert_eq!(t.opt.steps, 2);
    let (lo, hi) = (m.ratio_min.unwrap(), m.ratio_max.unwrap());
    assert!(lo < 1.0 - 1e-3 && hi > 1.0 + 1e-3, "ratios {lo}..{hi}");
    assert!(m.clip_fraction.is_some_and(|c| (0.0..=1.0).contains(&c)));
}

/// Per-layer activation checkpointing recomputes the same arithmetic: the accumulated gradients
/// (and so the update) equal those of the plain backward pass, on the MoE (with routing replay,
/// packed micro-batches, two segments), on the dense model, and on the hybrid Qwen3.5 (packed
/// rows through the Gated DeltaNet, one sequence at a time).
#[test]
fn activation_checkpointing_gives_the_same_gradients() {
    for dir in [tiny_moe(), tiny_dense(), crate::hybrid::tiny_qwen35()] {
        let model = Model::load(&dir, Device::Cpu, None).unwrap();
        let batch = moe_samples(&model);
        drop(model);
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("b.jsonl.zst");
        write_samples(&input, &batch);
        let mut plain = Trainer::load(&dir, Device::Cpu, None).unwrap();
        let m1 = plain.step(&batch, &input, &settings()).unwrap();
        let mut ckpt = Trainer::load(&dir, Device::Cpu, None).unwrap();
        let s = Settings {
            activation_checkpointing: true,
            ..settings()
        };
        let m2 = ckpt.step(&batch, &input, &s).unwrap();
        assert_eq!(m1.grad_norm.is_some(), m2.grad_norm.is_some());
        let (g1, g2) = (m1.grad_norm.unwrap(), m2.grad_norm.unwrap());
        assert!(g1 > 0.0, "{}: no gradient", dir.display());
        assert!(
            (g1 - g2).abs() <= 1e-5 * g1,
            "{}: grad norm {g1} vs {g2}",
            dir.display()
        );
        let max = max_rel_grad_diff(&plain, &ckpt);
        assert!(
            max <= 1e-4,
            "{}: gradients differ by {max} (relative)",
            dir.display()
        );
    }
}

/// Largest per-parameter `max |g_a − g_b| / max |g_a|` over two trainers' accumulated
/// gradients (asserting both have the same parameters and gradient presence).
fn max_rel_grad_diff(a: &Trainer, b: &Trainer) -> f64 {
    let mut max = 0f64;
    for ((na, a), (nb, b)) in a.model.named_variables().iter().zip(b.model.named_variables()) {
        assert_eq!(na, &nb);
        let (ga, gb) = (a.grad(), b.grad());
        assert_eq!(ga.defined(), gb.defined(), "{na}: gradient presence differs");
        if ga.defined() {
            let scale = ga.abs().max().double_value(&[]).max(1e-12);
            max = max.max((ga - gb).abs().max().double_value(&[]) / scale);
        }
    }
    max
}

/// The chunked LM head (no graph through the softmax: closed-form gradient per chunk of
/// positions, one decoder backward) gives the gradients of the unchunked autograd head — alone,
/// with one position per chunk, and combined with activation checkpointing — on the MoE (routing
/// replay, packed micro-batches, tied 151936-wide head) and on the dense model; the scoring
/// pass's chunked log-probs and strided entropy equal the unchunked ones.
#[test]
fn chunked_logprobs_give_the_same_gradients() {
    for dir in [tiny_moe(), tiny_dense()] {
        let model = Model::load(&dir, Device::Cpu, None).unwrap();
        let batch = moe_samples(&model);
        drop(model);
        let run = |chunk: Option<usize>, activation_checkpointing: bool| {
            let mut t = Trainer::load(&dir, Device::Cpu, None).unwrap();
            let s = Settings {
                logprob_chunk: chunk,
                activation_checkpointing,
                ..settings()
            };
            let m = t.step(&batch, Path::new("mem"), &s).unwrap();
            (t, m)
        };
        let (plain, m0) = run(None, false);
        assert!(m0.grad_norm.unwrap() > 0.0, "{}: no gradient", dir.display());
        for (chunk, ckpt) in [(7, false), (1, false), (5, true)] {
            let (t, m) = run(Some(chunk), ckpt);
            let what = format!("{} chunk {chunk} checkpointing {ckpt}", dir.display());
            let max = max_rel_grad_diff(&plain, &t);
            assert!(max <= 1e-5, "{what}: gradients differ by {max} (relative)");
            let (g0, g) = (m0.grad_norm.unwrap(), m.grad_norm.unwrap());
            assert!((g0 - g).abs() <= 1e-6 * g0, "{what}: grad norm {g0} vs {g}");
            // fp32 sums over 151936 entries; a 1-row head matmul rounds differently.
            let (e0, e) = (m0.entropy.unwrap(), m.entropy.unwrap());
            assert!((e0 - e).abs() <= 1e-5 * e0, "{what}: entropy {e0} vs {e}");
            assert!(
                (m0.loss - m.loss).abs() <= 1e-9,
                "{what}: loss {} vs {}",
                m0.loss,
                m.loss
            );
            assert_eq!(m0.policy_tokens, m.policy_tokens);
        }
    }
}

/// Under a sampled distribution (T = 0.5, top-k 50, top-p 0.9 on every policy token) the chunked
/// head's closed-form gradient, (onehot − q) / T over the support, equals autograd's through the
/// unchunked tempered, masked log-softmax; and it is not the model's own distribution's gradient.
#[test]
fn chunked_logprobs_give_the_same_gradients_under_a_sampled_distribution() {
    let dir = tiny_moe();
    let model = Model::load(&dir, Device::Cpu, None).unwrap();
    let mut batch = moe_samples(&model);
    drop(model);
    let own = batch.clone();
    for s in &mut batch {
        s.sampling = vec![lego_rl::records::SamplingRun {
            start: 0,
            temperature: 0.5,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.0,
            rule: Default::default(),
        }];
    }
    let run = |batch: &[Sample], chunk: Option<usize>| {
        let mut t = Trainer::load(&dir, Device::Cpu, None).unwrap();
        let s = Settings {
            logprob_chunk: chunk,
            ..settings()
        };
        let m = t.step(batch, Path::new("mem"), &s).unwrap();
        (t, m)
    };
    let (plain, m0) = run(&batch, None);
    let (chunked, m) = run(&batch, Some(7));
    let max = max_rel_grad_diff(&plain, &chunked);
    assert!(max <= 1e-5, "gradients differ by {max} (relative)");
    let (g0, g) = (m0.grad_norm.unwrap(), m.grad_norm.unwrap());
    assert!((g0 - g).abs() <= 1e-6 * g0, "grad norm {g0} vs {g}");
    let (unsampled, _) = run(&own, Some(7));
    let apart = max_rel_grad_diff(&unsampled, &chunked);
    assert!(
        apart > 1e-2,
        "the sampled distribution's gradient is the model's own ({apart})"
    );
}

/// `--freeze`: the parameters the pattern matches come out of the step bit-identical (no update,
/// no weight decay) while the others move; a pattern that matches no parameter, every
/// parameter, or is not a regular expression fails naming the flag, and writes nothing.
#[test]
fn freeze_keeps_matched_parameters_and_rejects_bad_patterns() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, &moe_samples(&model));
    let train = |out: &Path, pattern: &str| {
        train_step(&input, out)
            .args(["--freeze", pattern])
            .output()
            .unwrap()
    };
    let out = tmp.path().join("frozen");
    let o = train(&out, r"embed_tokens|layers\.0\.");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = Model::load(&out, Device::Cpu, None).unwrap().named_variables();
    let before = model.named_variables();
    assert_eq!(before.len(), after.len());
    let (mut frozen, mut moved) = (0, 0);
    for ((name, a), (name_after, b)) in before.iter().zip(&after) {
        assert_eq!(name, name_after);
        if name.contains("embed_tokens") || name.contains("layers.0.") {
            assert!(a.equal(b), "{name} is frozen but changed");
            frozen += 1;
        } else if !a.equal(b) {
            moved += 1;
        }
    }
    assert!(frozen > 2 && moved > 2, "frozen {frozen}, moved {moved}");
    for (pattern, needle) in [
        (
            "no_such_parameter",
            "--freeze no_such_parameter: matches no parameter of the model",
        ),
        (".", "--freeze .: matches every parameter"),
        ("(embed", "--freeze (embed: regex parse error"),
    ] {
        let out = tmp.path().join("bad");
        let o = train(&out, pattern);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{pattern}: {err}");
        assert!(err.contains(needle), "{pattern}: stderr lacks {needle:?}:\n{err}");
        assert!(!out.exists(), "{pattern}: nothing written to --out");
    }
}

/// The R3 ablation: samples recorded by the tiny MoE, trained from a copy whose routers were
/// perturbed. `--replay off` lets the trainer's routers choose (recorded routing only compared),
/// so its log-probs agree less with the rollout's; both figures are reported, marked by mode, and
/// `validate` gates each under its own name.
#[test]
fn replay_off_reports_lower_agreement_and_overlap_than_replay() {
    let recorder = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let samples = moe_samples(&recorder);
    let step = |replay: bool| {
        let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
        // Strong enough that the first MoE layer's routes move the second's (0.1 is not, on
        // these 24-token sequences).
        crate::model::perturb_routers(&model, 0.3);
        let tmp = tempfile::tempdir().unwrap();
        let s = Settings { replay, ..settings() };
        Trainer::new(model)
            .step(&samples, &tmp.path().join("s.jsonl"), &s)
            .unwrap()
    };
    let (on, off) = (step(true), step(false));
    eprintln!(
        "replay on: Pearson {:?} overlap {:?}; off: Pearson {:?} overlap {:?}",
        on.logprob_pearson, on.expert_overlap, off.logprob_pearson, off.expert_overlap
    );
    assert_eq!((on.routing_replay, off.routing_replay), (Some(true), Some(false)));
    assert!(off.logprob_pearson.unwrap() < on.logprob_pearson.unwrap());
    assert!(off.logprob_max_abs_diff.unwrap() > on.logprob_max_abs_diff.unwrap());
    assert!(off.expert_overlap.unwrap() < on.expert_overlap.unwrap());

    // The CLI flag, and validate's gates on a run holding one step of each mode.
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, &moe_samples(&model));
    let metrics = tmp.path().join("metrics.jsonl.zst");
    train_step(&input, &tmp.path().join("step-1"))
        .args(["--replay", "off", "--metrics"])
        .arg(&metrics)
        .assert()
        .success();
    let m = &read_metrics(&metrics)[0];
    assert_eq!(m.routing_replay, Some(false));
    assert!(m.logprob_pearson.is_some() && m.expert_overlap.is_some());
    let out = lego()
        .args(["validate", "--json", "--no-report"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let gate = |name: &str| {
        report["report"]["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no gate {name}: {report}"))
    };
    assert_eq!(
        gate("logprob_pearson_without_replay")["value"],
        serde_json::json!(m.logprob_pearson)
    );
    assert!(gate("logprob_pearson")["value"].is_null(), "{report}");
}

/// Asserts `ckpt/probe.json` (written by train-step with the weights) holds exactly the
/// log-probs of scoring the saved checkpoint, and returns them.
pub(crate) fn probe_matches_checkpoint(ckpt: &std::path::Path) -> Vec<f32> {
    let written = probe::read(ckpt)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no usable probe.json", ckpt.display()));
    let scored = probe::logprobs(&Model::load(ckpt, Device::Cpu, None).unwrap());
    assert_eq!(written, scored, "{}", ckpt.display());
    written
}
