//! Choosing the next token of a sequence from its next-token logits: greedy, plain temperature
//! sampling, and top-k / top-p over the most likely candidates, with the sequence's own seeded
//! rng. Split from the embedded engine's worker ([`super::embedded`]), which records the choice.

use rand::Rng;
use tch::{Kind, Tensor};

use super::GenerateRequest;

/// Per-worker buffers of a step: the log-softmax row of a top-k / top-p sequence and the
/// probabilities of a plain-temperature one.
#[derive(Default)]
pub(super) struct Scratch {
    logp: Vec<f32>,
    probs: Vec<f32>,
}

/// Copies a float tensor's elements into `buf` (resized, not reallocated once large enough).
fn copy_into(t: &Tensor, buf: &mut Vec<f32>) {
    let numel = t.numel();
    buf.resize(numel, 0.0);
    t.copy_data(&mut buf[..], numel);
}

/// Samples the next token of `req` from its next-token logits (`row`, a CPU float tensor, and
/// their logsumexp `lse`) with `rng`; returns it with its log-prob under the distribution it was
/// drawn from when that is not the model's own (see [`forced_logprob`]): tempered, and
/// renormalised over the top-k / top-p support. `None`: the model's own distribution
/// (temperature 1, the whole vocabulary) or greedy decoding, whose log-prob the caller takes
/// from the row.
///
/// Only what the choice needs leaves libtorch: the vectorized argmax for greedy decoding, the
/// tempered softmax for plain temperature sampling, the whole log-softmax row only for top-k /
/// top-p.
pub(super) fn choose(
    req: &GenerateRequest,
    row: &Tensor,
    lse: f32,
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
            copy_into(&(row - f64::from(lse)), &mut scratch.logp);
            let (next, logprob) = sample(&scratch.logp, req, rng);
            (next, Some(logprob))
        }
    }
}

/// The log-prob of a forced `token` under the distribution `req` samples from, when that is not
/// the model's own (`None`, as for [`choose`]). Its support is the sampler's plus `token`: a
/// scripted token outside the top-k / top-p support would otherwise have probability 0, and the
/// trainer recomputes every recorded token with the same rule (src/model/sampled.rs).
pub(super) fn forced_logprob(
    req: &GenerateRequest,
    row: &Tensor,
    lse: f32,
    token: u32,
    scratch: &mut Scratch,
) -> Option<f32> {
    if !req.sampling.is_processed() || (token as i64) >= row.size()[0] {
        return None;
    }
    match plain_temperature(req) {
        Some(t) => {
            let lsm = (row / f64::from(t)).log_softmax(-1, Kind::Float);
            Some(lsm.double_value(&[token as i64]) as f32)
        }
        None => {
            copy_into(&(row - f64::from(lse)), &mut scratch.logp);
            Some(Support::of(&scratch.logp, req).logprob_of(token, &scratch.logp))
        }
    }
}

/// The temperature when sampling is plain temperature sampling (no top-k, no top-p < 1).
fn plain_temperature(req: &GenerateRequest) -> Option<f32> {
    let s = &req.sampling;
    let top_k = s.top_k.filter(|&k| k > 0);
    (!s.is_greedy() && top_k.is_none() && s.top_p.is_none_or(|p| p >= 1.0))
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

/// The candidates a top-k / top-p sampler draws from: the tempered log-probs, the most likely
/// `keep` first (sorted), with the softmax's `max` and normalizer `total` over the top-k.
struct Support {
    cand: Vec<(u32, f32)>,
    keep: usize,
    max: f32,
    total: f32,
    temperature: f32,
    /// Probability of each kept candidate (over the top-k) and their sum.
    probs: Vec<f32>,
    kept: f32,
}

impl Support {
    fn of(logp: &[f32], req: &GenerateRequest) -> Support {
        let s = &req.sampling;
        let temperature = s.temperature.unwrap_or(1.0) as f32;
        let mut cand: Vec<(u32, f32)> = logp
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / temperature))
            .collect();
        if let Some(k) = s.top_k.map(|k| k as usize).filter(|&k| k > 0 && k < cand.len()) {
            cand.select_nth_unstable_by(k - 1, desc);
            cand.truncate(k);
        }
        let (max, total) = softmax_norm(&cand);
        let keep = match s.top_p.filter(|&p| p < 1.0) {
            Some(top_p) => nucleus(&mut cand, max, total, top_p as f32),
            None => {
                cand.sort_unstable_by(desc);
                cand.len()
            }
        };
        let probs: Vec<f32> = cand[..keep].iter().map(|c| (c.1 - max).exp() / total).collect();
        let kept = probs.iter().sum();
        Support {
            cand,
            keep,
            max,
            total,
            temperature,
            probs,
            kept,
        }
    }

    /// Index (into the kept candidates) of one draw.
    fn draw(&self, rng: &mut impl Rng) -> usize {
        let mut u: f32 = rng.gen::<f32>() * self.kept;
        for (i, p) in self.probs.iter().enumerate() {
            if u < *p {
                return i;
            }
            u -= p;
        }
        self.keep - 1
    }

    /// Log-prob of the `i`-th kept candidate, renormalised over the support.
    fn logprob_at(&self, i: usize) -> f32 {
        (self.probs[i] / self.kept).ln()
    }

    /// Log-prob of `token` renormalised over the support plus `token` (`logp`: the untempered
    /// row the support was made from).
    fn logprob_of(&self, token: u32, logp: &[f32]) -> f32 {
        match self.cand[..self.keep].iter().position(|c| c.0 == token) {
            Some(i) => self.logprob_at(i),
            None => {
                let p = (logp[token as usize] / self.temperature - self.max).exp() / self.total;
                (p / (self.kept + p)).ln()
            }
        }
    }
}

/// Greedy, or top-k / top-p sampling over the most likely candidates, sorted (plain temperature
/// sampling is [`sample_probs`]); returns the token and its log-prob renormalised over the
/// support (0 for greedy).
fn sample(logp: &[f32], req: &GenerateRequest, rng: &mut impl Rng) -> (u32, f32) {
    if req.sampling.is_greedy() {
        return (argmax(logp), 0.0);
    }
    let support = Support::of(logp, req);
    let i = support.draw(rng);
    (support.cand[i].0, support.logprob_at(i))
}

/// The largest logit and `sum(exp(logit - max))`, the softmax's normalizer (summed in f64: the
/// row has ~152k terms).
fn softmax_norm(cand: &[(u32, f32)]) -> (f32, f32) {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let total = cand.iter().map(|c| f64::from((c.1 - max).exp())).sum::<f64>() as f32;
    (max, total)
}

/// Descending by (tempered) logit; equal logits by token id, so the order (and the draw) does
/// not depend on how the candidates were partitioned before the sort.
fn desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Top-p: sorts the most likely candidates to the front and returns how many of them make the
/// nucleus, the fewest whose probability (`exp(logit - max) / total`) reaches `top_p`.
///
/// A trained policy's nucleus is a handful of tokens out of ~152k, so sorting the whole row for
/// every token (what this replaced: O(V log V) per token) is mostly wasted: this sorts a prefix
/// picked by `select_nth_unstable_by` (linear) and grows it 8x while its mass falls short,
/// sorting the whole row only once the prefix would pass an eighth of it (a flat, untrained
/// distribution). `scripts/bench/decode.sh 128 5 1 64 1.0 0.95` compares it with transformers.
/// The result is the full sort's: the same candidates in the same order, the same cumulative sums.
fn nucleus(cand: &mut [(u32, f32)], max: f32, total: f32, top_p: f32) -> usize {
    let n = cand.len();
    let mut k = 64.min(n);
    loop {
        if k < n {
            cand.select_nth_unstable_by(k - 1, desc);
        }
        cand[..k].sort_unstable_by(desc);
        let mut acc = 0.0;
        if let Some(i) = cand[..k].iter().position(|c| {
            acc += (c.1 - max).exp() / total;
            acc >= top_p
        }) {
            return i + 1;
        }
        if k == n {
            return n;
        }
        k = if k * 8 > n / 8 { n } else { k * 8 };
    }
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
    fn chi_square(mut draw: impl FnMut() -> u32, q: &[f64]) -> f64 {
        let mut counts = vec![0usize; q.len()];
        for _ in 0..DRAWS {
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
                    let e = q * DRAWS as f64;
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
            let chi2 = chi_square(|| sample_probs(&probs, &mut rng), &q);
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

    /// What `nucleus` replaced: the whole row sorted, the nucleus its shortest prefix reaching
    /// `top_p`.
    fn nucleus_by_full_sort(cand: &[(u32, f32)], max: f32, total: f32, top_p: f32) -> Vec<u32> {
        let mut all = cand.to_vec();
        all.sort_unstable_by(desc);
        let mut acc = 0.0;
        let keep = all
            .iter()
            .position(|c| {
                acc += (c.1 - max).exp() / total;
                acc >= top_p
            })
            .map_or(all.len(), |i| i + 1);
        all[..keep].iter().map(|c| c.0).collect()
    }

    #[test]
    fn nucleus_is_the_full_sorts_prefix_on_peaked_and_flat_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let n = 50_000;
        let mut sizes = Vec::new();
        // Gaussian logits (Box-Muller) times a scale: flat (1) to peaked (12), so the nucleus is
        // found in the first 64, in a grown prefix, and only by sorting the whole row.
        for scale in [1.0f32, 3.0, 6.0, 12.0] {
            let row: Vec<(u32, f32)> = (0..n)
                .map(|i| {
                    let (u, v): (f32, f32) = (rng.gen::<f32>().max(1e-12), rng.gen());
                    let z = (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos();
                    (i as u32, scale * z)
                })
                .collect();
            let (max, total) = softmax_norm(&row);
            for top_p in [0.5, 0.9, 0.95, 0.999] {
                let want = nucleus_by_full_sort(&row, max, total, top_p);
                let mut cand = row.clone();
                let keep = nucleus(&mut cand, max, total, top_p);
                let got: Vec<u32> = cand[..keep].iter().map(|c| c.0).collect();
                assert_eq!(got, want, "scale {scale}, top-p {top_p}");
                sizes.push(keep);
            }
        }
        assert!(sizes.iter().any(|&k| k <= 64), "{sizes:?}");
        assert!(sizes.iter().any(|&k| k > 64 && k <= n / 8), "{sizes:?}");
        assert!(sizes.iter().any(|&k| k > n / 8), "{sizes:?}");
    }

    #[test]
    fn top_k_top_p_and_greedy_draw_from_the_truncated_distribution() {
        let logp = logp();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // top-k 2: the two most likely, renormalised (1 degree of freedom: 10.83).
        let req = request(1.0, Some(2), None);
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng).0, &target(1.0, 2));
        assert!(chi2 < 10.83, "top-k: chi-square {chi2}");
        // top-p 0.8: the smallest prefix reaching 0.8 is 0.5 + 0.25 + 0.125.
        let req = request(1.0, None, Some(0.8));
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng).0, &target(1.0, 3));
        assert!(chi2 < 13.82, "top-p: chi-square {chi2}");
        // Temperature before truncation: at T=2 the weights flatten to .343 .243 .172 .121 .121,
        // so top-p 0.8 keeps four.
        let req = request(2.0, None, Some(0.8));
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng).0, &target(2.0, 4));
        assert!(chi2 < 16.27, "T=2, top-p: chi-square {chi2}");
        // Temperature 0 is greedy.
        let req = request(0.0, None, None);
        assert!((0..1000).all(|_| sample(&logp, &req, &mut rng).0 == 0));
    }

    /// The log-prob recorded with each draw is that of the distribution drawn from: tempered,
    /// renormalised over the support; a forced token outside the support is scored over the
    /// support plus itself; the model's own distribution records nothing (the caller's raw
    /// log-prob).
    #[test]
    fn recorded_logprobs_are_those_of_the_distribution_drawn_from() {
        let logp = logp();
        let row = Tensor::from_slice(&logp);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut scratch = Scratch::default();
        // T=2, top-p 0.8: four tokens kept (see above).
        let req = request(2.0, None, Some(0.8));
        let q = target(2.0, 4);
        for _ in 0..50 {
            let (next, lp) = choose(&req, &row, 0.0, &mut rng, &mut scratch);
            let want = q[next as usize].ln();
            assert!(
                (f64::from(lp.unwrap()) - want).abs() < 1e-5,
                "{next}: {lp:?} vs {want}"
            );
            let forced = forced_logprob(&req, &row, 0.0, next, &mut scratch).unwrap();
            assert!((f64::from(forced) - want).abs() < 1e-5);
        }
        // Token 4 is outside the nucleus (it ties with 3, which the id order puts first): scored
        // over the four kept plus itself.
        let w: Vec<f64> = P.iter().map(|p| p.powf(0.5)).collect();
        let want = (w[4] / (w[0] + w[1] + w[2] + w[3] + w[4])).ln();
        let got = forced_logprob(&request(2.0, None, Some(0.8)), &row, 0.0, 4, &mut scratch).unwrap();
        assert!((f64::from(got) - want).abs() < 1e-5, "{got} vs {want}");
        // Plain temperature: log-softmax(logits / T).
        let req = request(0.5, None, None);
        let q = target(0.5, P.len());
        let (next, lp) = choose(&req, &row, 0.0, &mut rng, &mut scratch);
        assert!((f64::from(lp.unwrap()) - q[next as usize].ln()).abs() < 1e-5);
        let got = forced_logprob(&req, &row, 0.0, 3, &mut scratch).unwrap();
        assert!((f64::from(got) - q[3].ln()).abs() < 1e-5);
        // The model's own distribution and greedy decoding: nothing recorded here.
        for req in [request(1.0, None, None), request(0.0, None, None)] {
            assert_eq!(choose(&req, &row, 0.0, &mut rng, &mut scratch).1, None);
            assert_eq!(forced_logprob(&req, &row, 0.0, 1, &mut scratch), None);
        }
    }
}
