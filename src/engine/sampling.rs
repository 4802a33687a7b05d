//! Choosing the next token of a sequence from its next-token logits: greedy, plain temperature
//! sampling, and min-p / top-k / top-p over the most likely candidates, with the sequence's own
//! seeded rng. Split from the embedded engine's worker ([`super::embedded`]), which records the
//! choice.
//!
//! The processed distribution (min-p, top-k, top-p) is the one sampling rule of lego-rl,
//! [`crate::model::sampled::log_softmax`], called on the row: the engine draws from it and
//! records its log-probs, and the trainer recomputes them with the same function, so the two
//! cannot disagree on which tokens are in the support (ties at a boundary included).

use rand::Rng;
use tch::{Device, Kind, Tensor};

use super::GenerateRequest;
use crate::model::sampled::{self, Processing};

/// Per-worker buffer of a step: the probabilities of the distribution a sequence draws from.
#[derive(Default)]
pub(super) struct Scratch {
    probs: Vec<f32>,
}

/// Copies a float tensor's elements into `buf` (resized, not reallocated once large enough).
fn copy_into(t: &Tensor, buf: &mut Vec<f32>) {
    let numel = t.numel();
    buf.resize(numel, 0.0);
    t.copy_data(&mut buf[..], numel);
}

/// Samples the next token of `req` from its next-token logits (`row`, a CPU float tensor) with
/// `rng`; returns it with its log-prob under the distribution it was drawn from when that is not
/// the model's own (see [`forced_logprob`]): tempered, and renormalised over the min-p / top-k /
/// top-p support. `None`: the model's own distribution
/// (temperature 1, the whole vocabulary) or greedy decoding, whose log-prob the caller takes
/// from the row.
///
/// Only what the choice needs leaves libtorch: the vectorized argmax for greedy decoding, one
/// probability row for plain temperature, the support's sorted probabilities otherwise.
pub(super) fn choose(
    req: &GenerateRequest,
    row: &Tensor,
    rng: &mut rand::rngs::StdRng,
    scratch: &mut Scratch,
) -> (u32, Option<f32>) {
    match plain_temperature(req) {
        Some(t) => {
            // Vectorized by libtorch: a scalar `exp` per vocabulary entry in Rust cost more
            // than the LM head itself. softmax(logp / T) = softmax(logits / T).
            copy_into(&(row / f64::from(t)).softmax(-1, Kind::Float), &mut scratch.probs);
            let next = sample_probs(&scratch.probs, rng);
            (next, (t != 1.0).then(|| scratch.probs[next as usize].ln()))
        }
        // Temperature 0 (or below 1e-6): the mode, picked by argmax.
        None if req.sampling.is_greedy() => (row.argmax(0, false).int64_value(&[]) as u32, None),
        None => {
            // The support with the mode as "next": the mode is in every support anyway.
            let mode = row.argmax(0, false).int64_value(&[]) as u32;
            let lsm = processed(req, row, mode);
            // Drawn in descending order of probability: a support that differs at its boundary
            // (its least likely tokens, under the float noise of a cached prefill against a
            // fresh one) then moves only the draws that land there, and a seeded run repeats.
            // Drawn in vocabulary order, every draw past a boundary token would shift.
            let kept = lsm.gt(-1e29).sum(Kind::Int64).int64_value(&[]);
            let (vals, idx) = lsm.topk(kept, 0, true, true);
            copy_into(&vals.exp(), &mut scratch.probs);
            let i = i64::from(sample_probs(&scratch.probs, rng));
            (idx.int64_value(&[i]) as u32, Some(vals.double_value(&[i]) as f32))
        }
    }
}

/// The log-prob of a forced `token` under the distribution `req` samples from, when that is not
/// the model's own (`None`, as for [`choose`]). Its support is the sampler's plus `token`: a
/// scripted token outside the min-p / top-k / top-p support would otherwise have probability
/// 0, and the trainer recomputes every recorded token with the same rule and function.
pub(super) fn forced_logprob(req: &GenerateRequest, row: &Tensor, token: u32) -> Option<f32> {
    if !req.sampling.is_processed() || (token as i64) >= row.size()[0] {
        return None;
    }
    match plain_temperature(req) {
        Some(t) => {
            let lsm = (row / f64::from(t)).log_softmax(-1, Kind::Float);
            Some(lsm.double_value(&[token as i64]) as f32)
        }
        None => Some(processed(req, row, token).double_value(&[token as i64]) as f32),
    }
}

/// The rule's processed log-probs of `row` under `req`'s sampling, `next` in the support.
fn processed(req: &GenerateRequest, row: &Tensor, next: u32) -> Tensor {
    let s = &req.sampling;
    let proc = Processing::single(
        s.temperature.unwrap_or(1.0) as f32,
        s.top_k.map_or(0, i64::from),
        s.top_p.map_or(2.0, |p| p as f32),
        s.min_p.map_or(0.0, |p| p as f32),
        Device::Cpu,
    );
    let next = Tensor::from_slice(&[i64::from(next)]);
    sampled::log_softmax(&row.unsqueeze(0), &next, Some(&proc)).squeeze_dim(0)
}

/// The temperature when sampling is plain temperature sampling (no top-k, no top-p < 1, no
/// min-p).
fn plain_temperature(req: &GenerateRequest) -> Option<f32> {
    let s = &req.sampling;
    let top_k = s.top_k.filter(|&k| k > 0);
    let min_p = s.min_p.filter(|&p| p > 0.0);
    (!s.is_greedy() && top_k.is_none() && min_p.is_none() && s.top_p.is_none_or(|p| p >= 1.0))
        .then_some(s.temperature.unwrap_or(1.0) as f32)
}

/// One draw from `probs` (summing to ~1): one pass, no sort. Rounding that leaves a sliver of
/// mass past the last entry gives the mode.
fn sample_probs(probs: &[f32], rng: &mut impl Rng) -> u32 {
    let mut u: f32 = rng.gen();
    for (i, &p) in probs.iter().enumerate() {
        if u < p {
            return i as u32;
        }
        u -= p;
    }
    argmax(probs)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// The samplers' draws against their target distributions: seeded, so the chi-square values
/// are fixed numbers, and the bound (p = 0.001 for the degrees of freedom) leaves room for a
/// change of rng stream without making a wrong distribution pass.
#[cfg(test)]
mod sampling_tests {
    use super::*;
    use crate::records::Sampling;
    use rand::SeedableRng;

    const P: [f64; 5] = [0.5, 0.25, 0.125, 0.0625, 0.0625];
    const DRAWS: usize = 200_000;

    fn logp() -> Vec<f32> {
        P.iter().map(|p| p.ln() as f32).collect()
    }

    /// Normalised `P[i]^(1/t)` over `keep` (the rest 0).
    fn target(t: f64, keep: usize) -> Vec<f64> {
        let w: Vec<f64> = P.iter().take(keep).map(|p| p.powf(1.0 / t)).collect();
        let total: f64 = w.iter().sum();
        let mut q: Vec<f64> = w.iter().map(|x| x / total).collect();
        q.resize(P.len(), 0.0);
        q
    }

    /// Pearson's chi-square of the draws against `q`; a draw where `q` is 0 fails at once.
    fn chi_square(mut draw: impl FnMut() -> u32, q: &[f64], draws: usize) -> f64 {
        let mut counts = vec![0usize; q.len()];
        for _ in 0..draws {
            counts[draw() as usize] += 1;
        }
        counts
            .iter()
            .zip(q)
            .map(|(&c, &q)| {
                if q == 0.0 {
                    assert_eq!(c, 0, "drew an entry outside the support");
                    0.0
                } else {
                    let e = q * draws as f64;
                    (c as f64 - e).powi(2) / e
                }
            })
            .sum()
    }

    fn request(temperature: f64, top_k: Option<u32>, top_p: Option<f64>) -> GenerateRequest {
        GenerateRequest {
            prompt_ids: vec![1],
            sampling: Sampling {
                temperature: Some(temperature),
                top_k,
                top_p,
                ..Default::default()
            },
            stop_token_ids: vec![],
            return_routing: false,
            forced_output: None,
        }
    }

    #[test]
    fn plain_temperature_draws_follow_the_tempered_distribution() {
        let logp = logp();
        for t in [1.0, 0.5, 2.0] {
            let q = target(t, P.len());
            let probs: Vec<f32> = q.iter().map(|&x| x as f32).collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let chi2 = chi_square(|| sample_probs(&probs, &mut rng), &q, DRAWS);
            // 4 degrees of freedom: 18.47 at p = 0.001.
            assert!(chi2 < 18.47, "T={t}: chi-square {chi2}");
        }
        // The same tempered distribution through the libtorch softmax the engine uses.
        let t = 0.5;
        let tensor = Tensor::from_slice(&logp);
        let mut probs = Vec::new();
        copy_into(&(&tensor / t).softmax(-1, Kind::Float), &mut probs);
        for (a, b) in probs.iter().zip(target(t, P.len())) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{probs:?}");
        }
    }

    /// The probabilities `req` draws from on `row` (the rule's processed row).
    fn drawn_from(req: &GenerateRequest, row: &Tensor) -> Vec<f64> {
        let mode = row.argmax(0, false).int64_value(&[]) as u32;
        Vec::<f64>::try_from(processed(req, row, mode).exp().to_kind(Kind::Double)).unwrap()
    }

    fn close(got: &[f64], want: &[f64]) {
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn top_k_top_p_and_greedy_draw_from_the_truncated_distribution() {
        let row = Tensor::from_slice(&logp());
        // top-k 2: the two most likely, renormalised.
        close(&drawn_from(&request(1.0, Some(2), None), &row), &target(1.0, 2));
        // top-p 0.8: the smallest prefix reaching 0.8 is 0.5 + 0.25 + 0.125.
        close(&drawn_from(&request(1.0, None, Some(0.8)), &row), &target(1.0, 3));
        // Temperature before truncation: at T=2 the weights flatten to .343 .243 .172 .121 .121,
        // so top-p 0.8 keeps four: tokens 3 and 4 tie at the boundary, and one of them stays.
        close(&drawn_from(&request(2.0, None, Some(0.8)), &row), &target(2.0, 4));
        // top-k 4 keeps both ties (vLLM's and transformers' `logits < kth`): five tokens.
        close(&drawn_from(&request(1.0, Some(4), None), &row), &target(1.0, 5));
        // The draws come from that distribution (sample_probs is chi-square tested above).
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut scratch = Scratch::default();
        let req = request(1.0, Some(2), None);
        let chi2 = chi_square(
            || choose(&req, &row, &mut rng, &mut scratch).0,
            &target(1.0, 2),
            20_000,
        );
        assert!(chi2 < 10.83, "top-k: chi-square {chi2}");
        // Temperature 0 is greedy.
        let req = request(0.0, None, None);
        assert!((0..100).all(|_| choose(&req, &row, &mut rng, &mut scratch).0 == 0));
    }

    /// The log-prob recorded with each draw is that of the distribution drawn from: tempered,
    /// renormalised over the support; a forced token outside the support is scored over the
    /// support plus itself, one tied with the boundary as its equal; the model's own
    /// distribution records nothing (the caller's raw log-prob).
    #[test]
    fn recorded_logprobs_are_those_of_the_distribution_drawn_from() {
        let row = Tensor::from_slice(&logp());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut scratch = Scratch::default();
        // T=2, top-p 0.8: four tokens kept (see above).
        let req = request(2.0, None, Some(0.8));
        let q = target(2.0, 4);
        for _ in 0..50 {
            let (next, lp) = choose(&req, &row, &mut rng, &mut scratch);
            let want = q[next as usize].ln();
            assert!(
                (f64::from(lp.unwrap()) - want).abs() < 1e-5,
                "{next}: {lp:?} vs {want}"
            );
            let forced = forced_logprob(&req, &row, next).unwrap();
            assert!((f64::from(forced) - want).abs() < 1e-5);
        }
        // Token 4 ties with token 3 at the nucleus's boundary: it takes 3's place, with 3's
        // probability (the engine gave it w4 / (w0..w4), 0.129 nats less, before the one rule).
        let got = forced_logprob(&req, &row, 4).unwrap();
        assert!(
            (f64::from(got) - q[3].ln()).abs() < 1e-5,
            "{got} vs {}",
            q[3].ln()
        );
        // Below the boundary (top-p 0.6 at T=1 keeps two): scored over the two plus itself.
        let got = forced_logprob(&request(1.0, None, Some(0.6)), &row, 3).unwrap();
        let want = (P[3] / (P[0] + P[1] + P[3])).ln();
        assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
        // Plain temperature: log-softmax(logits / T).
        let req = request(0.5, None, None);
        let q = target(0.5, P.len());
        let (next, lp) = choose(&req, &row, &mut rng, &mut scratch);
        assert!((f64::from(lp.unwrap()) - q[next as usize].ln()).abs() < 1e-5);
        let got = forced_logprob(&req, &row, 3).unwrap();
        assert!((f64::from(got) - q[3].ln()).abs() < 1e-5);
        // The model's own distribution and greedy decoding: nothing recorded here.
        for req in [request(1.0, None, None), request(0.0, None, None)] {
            assert_eq!(choose(&req, &row, &mut rng, &mut scratch).1, None);
            assert_eq!(forced_logprob(&req, &row, 1), None);
        }
    }
}

#[cfg(test)]
#[path = "sampling_rule_tests.rs"]
mod sampling_rule_tests;
