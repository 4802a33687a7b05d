//! The one sampling rule against the samplers it follows, on rows that tie at the boundaries:
//! testdata/sampling/ties.json holds vLLM v1's and transformers' processed log-probs
//! (scripts/sampling_reference.py). The engine's recorded and forced log-probs and the trainer's
//! recomputation ([`sampled::log_softmax`] on logits in their own dtype, fp32 or bf16) must give
//! every token of vLLM's support vLLM's log-prob, and a token tied with the boundary that vLLM's
//! (unstable) sort happened to leave out the log-prob of its kept equals.

use rand::SeedableRng;
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::{choose, forced_logprob, GenerateRequest, Scratch};
use crate::model::sampled::{self, Processing};
use crate::records::Sampling;

struct Case {
    logits: Vec<f32>,
    bf16: bool,
    t: f64,
    k: u32,
    p: f64,
    min_p: f64,
    vllm: Vec<(usize, f64)>,
    transformers: Vec<(usize, f64)>,
}

fn cases() -> Vec<Case> {
    let doc: Value = serde_json::from_str(include_str!("../../testdata/sampling/ties.json")).unwrap();
    let pairs = |v: &Value| -> Vec<(usize, f64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
            .collect()
    };
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let row = &doc["rows"][c["row"].as_u64().unwrap() as usize];
            Case {
                logits: row["logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect(),
                bf16: row["dtype"] == "bfloat16",
                t: c["temperature"].as_f64().unwrap(),
                k: c["top_k"].as_u64().unwrap() as u32,
                p: c["top_p"].as_f64().unwrap(),
                min_p: c["min_p"].as_f64().unwrap(),
                vllm: pairs(&c["vllm"]),
                transformers: pairs(&c["transformers"]),
            }
        })
        .collect()
}

fn request(c: &Case) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: vec![1],
        sampling: Sampling {
            temperature: Some(c.t),
            top_k: (c.k > 0).then_some(c.k),
            top_p: (c.p < 1.0).then_some(c.p),
            min_p: (c.min_p > 0.0).then_some(c.min_p),
            ..Default::default()
        },
        stop_token_ids: vec![],
        return_routing: false,
        forced_output: None,
    }
}

/// The trainer's log-prob of each of `tokens`, each as the "next" token of its own row, from the
/// logits in the case's dtype.
fn trainer(c: &Case, tokens: &[usize]) -> Vec<f64> {
    let n = tokens.len() as i64;
    let kind = if c.bf16 { Kind::BFloat16 } else { Kind::Float };
    let row = Tensor::from_slice(&c.logits).to_kind(kind);
    let logits = row.unsqueeze(0).expand([n, -1], false).contiguous();
    let next = Tensor::from_slice(&tokens.iter().map(|&t| t as i64).collect::<Vec<_>>());
    let full = |v: f64| Tensor::full([n], v, (Kind::Float, Device::Cpu));
    let proc = Processing {
        temperature: full(c.t),
        top_k: (c.k > 0).then(|| Tensor::full([n], i64::from(c.k), (Kind::Int64, Device::Cpu))),
        top_p: (c.p < 1.0).then(|| full(c.p)),
        min_p: (c.min_p > 0.0).then(|| full(c.min_p)),
    };
    let lsm = sampled::log_softmax(&logits, &next, Some(&proc));
    let picked = lsm.gather(1, &next.unsqueeze(1), false).squeeze_dim(1);
    Vec::<f64>::try_from(picked.to_kind(Kind::Double)).unwrap()
}

/// Each token of `support` and, for every other token tied with one of them, the kept equal's
/// log-prob: what the rule must give each.
fn expected(c: &Case, support: &[(usize, f64)]) -> Vec<(usize, f64)> {
    let mut out = support.to_vec();
    for (t, &z) in c.logits.iter().enumerate() {
        if support.iter().any(|&(s, _)| s == t) {
            continue;
        }
        if let Some(&(_, lp)) = support.iter().find(|&&(s, _)| c.logits[s] == z) {
            out.push((t, lp));
        }
    }
    out
}

#[test]
fn engine_and_trainer_give_vllms_processed_logprobs_on_tied_rows_in_fp32_and_bf16() {
    let cases = cases();
    let (mut ties, mut bf16, mut beyond_k) = (0, 0, 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(58);
    let mut scratch = Scratch::default();
    for (i, c) in cases.iter().enumerate() {
        let want = expected(c, &c.vllm);
        ties += (want.len() > c.vllm.len()) as usize;
        bf16 += c.bf16 as usize;
        beyond_k += (c.k > 0 && c.vllm.len() > c.k as usize) as usize;
        let tokens: Vec<usize> = want.iter().map(|w| w.0).collect();
        let got = trainer(c, &tokens);
        let req = request(c);
        let row = Tensor::from_slice(&c.logits);
        for (&(t, lp), g) in want.iter().zip(&got) {
            assert!(
                (g - lp).abs() < 2e-5,
                "case {i}, token {t}: trainer {g} vs vLLM {lp}"
            );
            let e = f64::from(forced_logprob(&req, &row, t as u32).unwrap());
            assert!(
                (e - lp).abs() < 2e-5,
                "case {i}, token {t}: engine {e} vs vLLM {lp}"
            );
        }
        // The engine draws only from vLLM's support (up to boundary equals), with its log-probs.
        for _ in 0..20 {
            let (t, lp) = choose(&req, &row, &mut rng, &mut scratch);
            let w = want.iter().find(|w| w.0 == t as usize);
            let w = w.unwrap_or_else(|| panic!("case {i}: drew {t}, outside vLLM's support"));
            assert!(
                (f64::from(lp.unwrap()) - w.1).abs() < 2e-5,
                "case {i}: {lp:?} vs {}",
                w.1
            );
        }
    }
    // The fixture exercises what it is for: ties cut at a boundary, top-k supports wider than
    // k, and bf16 rows.
    assert!(
        ties >= 10 && beyond_k >= 5 && bf16 >= 40,
        "{ties} {beyond_k} {bf16}"
    );
}

#[test]
fn transformers_agrees_except_where_it_applies_min_p_after_top_p() {
    let mut differ = 0;
    for (i, c) in cases().iter().enumerate() {
        let want = expected(c, &c.transformers);
        let tokens: Vec<usize> = want.iter().map(|w| w.0).collect();
        let got = trainer(c, &tokens);
        let agree = want.iter().zip(&got).all(|(w, g)| (g - w.1).abs() < 2e-5);
        let mixed = c.min_p > 0.0 && (c.k > 0 || c.p < 1.0);
        assert!(agree || mixed, "case {i}: transformers {want:?} vs {got:?}");
        differ += !agree as usize;
    }
    // Where the two libraries differ the rule is vLLM's (the test above), and they do differ.
    assert!(differ >= 5, "{differ}");
}
