//! The behaviour policy exactly: in train mode (`--harness-sampling pin`) a harness's own
//! temperature / top_p cannot bend rollout's sampling, and the override is recorded and counted;
//! with `honor` the tempered, truncated distribution is recorded and recomputed by train-step.

use std::path::Path;
use std::sync::Arc;

use lego_rl::align::{align_trajectory, MatchMode, Settings};
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::model::Model;
use lego_rl::proxy::{HarnessSampling, Proxy, ProxyConfig};
use lego_rl::records::{Generation, Sampling, SamplingRun, Trajectory};
use lego_rl::train::Trainer;
use serde_json::{json, Value};
use tch::Device;

use super::proxy::chat;

async fn start(harness_sampling: HarnessSampling, configure: impl FnOnce(&mut Sampling)) -> (Proxy, String) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let mut cfg = ProxyConfig {
        harness_sampling,
        ..ProxyConfig::default()
    };
    cfg.sampling.max_tokens = Some(24);
    configure(&mut cfg.sampling);
    let proxy = Proxy::new(chat(), backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (proxy, format!("http://{addr}"))
}

/// mini-swe-agent's first request from the captured traffic, as it sent it.
fn harness_request() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/harness-traffic/mini-swe-agent/requests.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["path"], "/v1/chat/completions");
    serde_json::from_str(first["body_raw"].as_str().unwrap()).unwrap()
}

/// Sends `bodies` in order on one trial of a fresh proxy; returns the captures.
async fn captures(mode: HarnessSampling, bodies: &[Value]) -> Vec<Generation> {
    captures_seeded(mode, None, bodies).await
}

/// [`captures`] with rollout's configured seed (`rollout --seed`): trial `sampling/0/0`'s first
/// call samples with the same seed on every fresh proxy.
async fn captures_seeded(mode: HarnessSampling, seed: Option<u64>, bodies: &[Value]) -> Vec<Generation> {
    captures_with(mode, |s| s.seed = seed, bodies).await
}

/// [`captures`] with rollout's sampling configured by `configure` (`rollout --temperature`,
/// `--top-k`, …).
async fn captures_with(
    mode: HarnessSampling,
    configure: impl FnOnce(&mut Sampling),
    bodies: &[Value],
) -> Vec<Generation> {
    let (proxy, base) = start(mode, configure).await;
    let (token, trial) = proxy.register_trial("sampling/0/0");
    let client = reqwest::Client::new();
    for body in bodies {
        let r = client
            .post(format!("{base}/t/{token}/v1/chat/completions"))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
    trial.generations()
}

/// A harness request with `temperature: 0.3, top_p: 0.5` and its own `seed` in train mode is
/// sampled at rollout's settings (temperature 1, full vocabulary, rollout's seed): the same tokens
/// and log-probs as the request without them; the ignored values are recorded on the generation.
/// With `honor` (what train mode did before pinning) the same request samples a different
/// distribution.
#[tokio::test(flavor = "multi_thread")]
async fn pinned_sampling_ignores_a_harness_temperature_and_top_p_and_records_them() {
    let plain = harness_request();
    assert!(plain.get("temperature").is_none() && plain.get("top_p").is_none());
    let mut bent = plain.clone();
    bent["temperature"] = json!(0.3);
    bent["top_p"] = json!(0.5);
    bent["seed"] = json!(99);

    // Each on a fresh proxy as trial sampling/0/0's first call: the same rollout seed.
    let reference = &captures_seeded(HarnessSampling::Pin, Some(5), std::slice::from_ref(&plain)).await[0];
    let overridden = &captures_seeded(HarnessSampling::Pin, Some(5), &[bent.clone()]).await[0];
    assert!(
        reference.ignored_sampling.is_empty(),
        "{:?}",
        reference.ignored_sampling
    );
    assert_eq!(
        serde_json::to_value(&overridden.ignored_sampling).unwrap(),
        json!({"seed": 99, "temperature": 0.3, "top_p": 0.5})
    );
    assert!(overridden.sampling_overridden());
    assert_eq!(
        (overridden.sampling.temperature, overridden.sampling.top_p),
        (Some(1.0), None)
    );
    assert_eq!(
        overridden.sampling.seed, reference.sampling.seed,
        "rollout's seed"
    );
    assert_eq!(
        overridden.request["temperature"],
        json!(0.3),
        "the request is kept as sent"
    );
    assert_eq!(overridden.prompt_ids, reference.prompt_ids);
    assert_eq!(
        overridden.output_ids, reference.output_ids,
        "sampled at rollout's settings"
    );
    let (a, b) = (
        overridden.logprobs.to_f32().unwrap(),
        reference.logprobs.to_f32().unwrap(),
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-4),
        "{a:?} vs {b:?}"
    );

    let honored = captures(HarnessSampling::Honor, &[bent]).await;
    assert!(honored[0].ignored_sampling.is_empty());
    assert_eq!(
        (honored[0].sampling.temperature, honored[0].sampling.top_p),
        (Some(0.3), Some(0.5))
    );
    assert_ne!(
        honored[0].output_ids, reference.output_ids,
        "at T = 0.3 over the nucleus the tiny model samples differently"
    );
}

/// Two members of one group (different rewards) made of `gens`, aligned with the captured tokens.
fn group_of_two(gens: &[Generation]) -> Vec<lego_rl::records::Sample> {
    let tokenizer = crate::common::root().join("testdata/tokenizer/qwen3");
    let settings = Settings::new(MatchMode::Strict, Some(&tokenizer)).unwrap();
    let mut samples = Vec::new();
    for (i, reward) in [(0, 1.0), (1, 0.0)] {
        let mut t = Trajectory::new("sampling", 0, i, "test", "test", gens.to_vec());
        t.reward = Some(reward);
        let (s, stats) = align_trajectory(&t, &settings).unwrap();
        assert_eq!((stats.aligned_turns, stats.dropped_turns), (1, 0), "{stats:?}");
        samples.extend(s);
    }
    samples
}

/// train-step's agreement figures on `samples` (a fresh tiny MoE each time, a negligible step).
fn recompute(samples: &[lego_rl::records::Sample]) -> lego_rl::records::StepMetrics {
    let model = Model::load(&crate::model::tiny_moe(), Device::Cpu, None).unwrap();
    let mut s = crate::train::settings();
    s.optim.lr = 1e-9;
    Trainer::new(model).step(samples, Path::new("mem"), &s).unwrap()
}

/// Log-probs of the tokens after `ids[..from]` under the sampler `sampling`, from transformers'
/// own logits warpers on the tiny MoE (scripts/hf_reference.py).
fn transformers_processed(ids: &[u32], sampling: Value, from: usize) -> Vec<f64> {
    let tmp = tempfile::tempdir().unwrap();
    let (input, out) = (tmp.path().join("ids.json"), tmp.path().join("hf.json"));
    let seqs = json!({"sequences": [{"name": "honored", "input_ids": ids, "sampling": sampling}]});
    std::fs::write(&input, seqs.to_string()).unwrap();
    let status = std::process::Command::new(crate::common::python())
        .arg(crate::common::root().join("scripts/hf_reference.py"))
        .arg(crate::model::tiny_moe())
        .arg(&input)
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/hf_reference.py failed");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    let lp = hf["sequences"][0]["processed_logprobs"].as_array().unwrap();
    lp[from - 1..].iter().map(|v| v.as_f64().unwrap()).collect()
}

/// With `--harness-sampling honor` a harness's `temperature: 0.3, top_p: 0.5` is the behaviour
/// policy, so that is what is recorded and trained: the captured log-probs are those of
/// log-softmax(logits / 0.3) renormalised over the nucleus (transformers' own warpers agree),
/// align carries the sampling into the sample, and train-step recomputes the same distribution
/// (Pearson ≥ 0.9999, |Δ| at float noise). The same samples without their sampling, recomputed at
/// temperature 1 over the whole vocabulary (what train-step did before), miss by whole nats.
#[tokio::test(flavor = "multi_thread")]
async fn honoured_sampling_records_and_trains_the_tempered_nucleus_it_drew_from() {
    let mut bent = harness_request();
    bent["seed"] = json!(5);
    bent["temperature"] = json!(0.3);
    bent["top_p"] = json!(0.5);
    let gens = captures(HarnessSampling::Honor, &[bent]).await;
    let g = &gens[0];
    assert!(
        g.processed_logprobs,
        "the embedded engine records the distribution sampled"
    );
    assert!(g.output_ids.len() >= 8, "{:?}", g.output_ids);
    let recorded = g.logprobs.to_f32().unwrap();
    let ids: Vec<u32> = g.prompt_ids.iter().chain(&g.output_ids).copied().collect();
    let reference = transformers_processed(
        &ids,
        json!({"temperature": 0.3, "top_p": 0.5}),
        g.prompt_ids.len(),
    );
    let d = recorded
        .iter()
        .zip(&reference)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "recorded vs transformers' warpers: max |Δ| {d} over {} tokens",
        recorded.len()
    );
    assert!(
        d < 1e-4,
        "recorded vs transformers: max |Δ| {d}: {recorded:?} vs {reference:?}"
    );

    let mut samples = group_of_two(&gens);
    let run = SamplingRun {
        start: 0,
        temperature: 0.3,
        top_k: 0,
        top_p: 0.5,
        min_p: 0.0,
        rule: Default::default(),
    };
    assert_eq!(samples[0].sampling, vec![run]);

    let m = recompute(&samples);
    let (pearson, diff) = (m.logprob_pearson.unwrap(), m.logprob_max_abs_diff.unwrap());
    eprintln!(
        "recomputed sampled distribution: Pearson {pearson}, max |Δ| {diff}, KL {:?}",
        m.logprob_kl
    );
    assert!(
        pearson >= 0.9999 && diff < 1e-3 && m.logprob_kl.unwrap() < 1e-6,
        "recomputed the sampled distribution: {m:?}"
    );

    for s in &mut samples {
        s.sampling.clear();
    }
    let m = recompute(&samples);
    let (pearson_t1, diff_t1) = (m.logprob_pearson.unwrap(), m.logprob_max_abs_diff.unwrap());
    // Pearson alone cannot tell: within one generation log q ≈ log p / T + c, an affine map.
    eprintln!(
        "temperature-1 recomputation: Pearson {pearson_t1}, max |Δ| {diff_t1}, KL {:?}",
        m.logprob_kl
    );
    assert!(
        !(pearson_t1 >= 0.9999 && diff_t1 < 1e-3) && diff_t1 > 1.0,
        "the model's own distribution is not the one sampled: {m:?}"
    );
    // Why validate gates the KL beside the Pearson: here the Pearson passes its gate (0.99) and
    // only the KL (gated at 0.01) sees the wrong distribution.
    assert!(
        pearson_t1 >= 0.99 && m.logprob_kl.unwrap() > 0.01,
        "Pearson blind, KL not: {m:?}"
    );
}

/// An OpenAI request's `top_k` and `min_p` (the vLLM extensions harnesses send) are honoured
/// under `honor`, not dropped: recorded in the generation's sampling, every sampled token inside
/// the top-k, the log-probs those of the processed distribution (each token at least as likely
/// as under the model's own, renormalised over fewer tokens); the penalties, which no engine here
/// applies, are listed as ignored. Under `pin` all of them are listed.
#[tokio::test(flavor = "multi_thread")]
async fn an_openai_requests_top_k_and_min_p_are_honoured_and_its_penalties_listed() {
    let mut body = harness_request();
    body["top_k"] = json!(3);
    body["min_p"] = json!(0.05);
    body["presence_penalty"] = json!(0.5);
    body["seed"] = json!(4);
    let g = &captures(HarnessSampling::Honor, &[body.clone()]).await[0];
    assert_eq!(
        (g.sampling.top_k, g.sampling.min_p, g.sampling.seed),
        (Some(3), Some(0.05), Some(4))
    );
    assert_eq!(
        serde_json::to_value(&g.ignored_sampling).unwrap(),
        json!({"presence_penalty": 0.5})
    );
    assert!(g.processed_logprobs);
    // The model's own log-probs of the same tokens (one forward of the tiny MoE): each sampled
    // token ranks in the top 3 of its row, and its processed log-prob is at least its own.
    let model = Model::load(&crate::model::tiny_moe(), Device::Cpu, None).unwrap();
    let ids: Vec<i64> = g
        .prompt_ids
        .iter()
        .chain(&g.output_ids)
        .map(|&t| i64::from(t))
        .collect();
    let (n, p) = (ids.len() as i64, g.prompt_ids.len() as i64);
    let logits = {
        let _g = tch::no_grad_guard();
        let tokens = tch::Tensor::from_slice(&ids);
        let pos = tch::Tensor::arange(n, (tch::Kind::Int64, Device::Cpu));
        let out = model
            .lm
            .forward(&lego_rl::model::ForwardInput::causal(&tokens, &pos), None);
        model.lm.logits(&out.hidden).to_kind(tch::Kind::Float)
    };
    let recorded = g.logprobs.to_f32().unwrap();
    for (j, lp) in recorded.iter().enumerate() {
        let (at, next) = (p + j as i64 - 1, ids[p as usize + j]);
        let row = logits.get(at);
        let z = row.double_value(&[next]);
        let above = row.gt(z).sum(tch::Kind::Int64).int64_value(&[]);
        let own = z - row.logsumexp([0i64].as_slice(), false).double_value(&[]);
        assert!(
            above < 3,
            "token {j}: {above} tokens more likely, outside the top 3"
        );
        assert!(f64::from(*lp) >= own - 1e-4, "token {j}: {lp} < its own {own}");
    }
    let pinned = &captures(HarnessSampling::Pin, &[body]).await[0];
    assert_eq!(
        serde_json::to_value(&pinned.ignored_sampling).unwrap(),
        json!({"min_p": 0.05, "presence_penalty": 0.5, "seed": 4, "top_k": 3})
    );
    assert_eq!((pinned.sampling.top_k, pinned.sampling.min_p), (None, None));
}

/// Rollout's own sampling at Qwen's recommended settings (`rollout --temperature 0.6 --top-k 20
/// --top-p 0.95 --min-p 0.05` under pin): recorded on every generation, carried by align into
/// the sample's sampling runs, and recomputed by train-step to float noise.
#[tokio::test(flavor = "multi_thread")]
async fn rollouts_top_k_and_min_p_are_recorded_and_recomputed_by_train_step() {
    let gens = captures_with(
        HarnessSampling::Pin,
        |s| {
            s.temperature = Some(0.6);
            s.top_k = Some(20);
            s.top_p = Some(0.95);
            s.min_p = Some(0.05);
            s.seed = Some(3);
        },
        &[harness_request()],
    )
    .await;
    let g = &gens[0];
    assert!(g.processed_logprobs && g.ignored_sampling.is_empty());
    assert_eq!((g.sampling.top_k, g.sampling.min_p), (Some(20), Some(0.05)));
    let samples = group_of_two(&gens);
    let run = SamplingRun {
        start: 0,
        temperature: 0.6,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.05,
        rule: Default::default(),
    };
    assert_eq!(samples[0].sampling, vec![run]);
    let m = recompute(&samples);
    let (pearson, diff, kl) = (
        m.logprob_pearson.unwrap(),
        m.logprob_max_abs_diff.unwrap(),
        m.logprob_kl.unwrap(),
    );
    eprintln!(
        "recomputed T 0.6, top-k 20, top-p 0.95, min-p 0.05: Pearson {pearson}, max |Δ| {diff}, KL {kl}"
    );
    assert!(pearson >= 0.9999 && diff < 1e-3 && kl < 1e-6, "{m:?}");
}

/// Anthropic's Messages API goes through the same field handling: under pin its `temperature`
/// and `top_k` are listed as ignored and rollout's sampling is used; under honor they are applied.
#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_requests_sampling_fields_are_pinned_or_honoured_alike() {
    let body = json!({
        "model": "qwen3",
        "max_tokens": 8,
        "temperature": 0.3,
        "top_k": 3,
        "messages": [{"role": "user", "content": "Say hi."}],
    });
    for mode in [HarnessSampling::Pin, HarnessSampling::Honor] {
        let (proxy, base) = start(mode, |_| ()).await;
        let (token, trial) = proxy.register_trial("sampling/0/0");
        let r = reqwest::Client::new()
            .post(format!("{base}/t/{token}/v1/messages"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        let g = &trial.generations()[0];
        let ignored = serde_json::to_value(&g.ignored_sampling).unwrap();
        match mode {
            HarnessSampling::Pin => {
                assert_eq!(ignored, json!({"temperature": 0.3, "top_k": 3}));
                assert_eq!((g.sampling.temperature, g.sampling.top_k), (Some(1.0), None));
            }
            HarnessSampling::Honor => {
                assert_eq!(ignored, json!({}));
                assert_eq!((g.sampling.temperature, g.sampling.top_k), (Some(0.3), Some(3)));
                assert!(g.processed_logprobs);
            }
        }
    }
}
