//! The distribution a policy token was drawn from, recomputed by the head.
//!
//! GSPO's ratio divides the trainer's probability of each sampled token by the behaviour
//! policy's, and the behaviour policy is what the engine really sampled from: logits divided by
//! the temperature, restricted to the top-k / top-p support, renormalised (vLLM calls its
//! log-probs `processed_logprobs`). When a sample says its tokens were drawn that way
//! (`Sample::sampling`), train-step recomputes the same quantity with the same rule as the
//! engine's sampler (src/engine/sampling.rs): temperature first, then top-k, then the nucleus of
//! the top-k-renormalised probabilities, the fewest most-likely tokens whose mass reaches top-p.
//!
//! The support is found on the trainer's own logits, and the token that was sampled is always
//! in it: the trainer's logits differ from the engine's by float rounding, and a token at the
//! nucleus's edge must not get probability 0 (an infinite log-ratio) because of that. For a
//! sampled token the rule is the engine's exactly; the engine scores a forced token outside the
//! support the same way (support ∪ {token}), so both sides agree on every recorded token. The
//! support is a constant of the step (no gradient flows through which tokens are in it), as in
//! every sampler: the gradient of `log q(next)` with respect to the logits is
//! `(onehot(next) − q) / T`, which [`super::CausalLm::backward_logprobs`] uses in closed form.

use tch::{Kind, Tensor};

/// Log-probability given to the tokens outside the support before the log-softmax: finite, so
/// that `p · log p` is 0 rather than NaN in the entropy diagnostic, and far below any logit.
const OUTSIDE: f64 = -1e30;

/// Per-position sampling of the tokens whose log-probs the head computes (`[N]` each, on the
/// model's device), built by train-step from the samples' sampling runs.
#[derive(Debug)]
pub struct Processing {
    /// `[N]` f32, above 0 (1 where a position was sampled from the model's own distribution).
    pub temperature: Tensor,
    /// `[N]` i64, 0 where there is no top-k; `None` when no position has one.
    pub top_k: Option<Tensor>,
    /// `[N]` f32, 2 where there is no top-p (no float sum reaches it); `None` when no position
    /// has one.
    pub top_p: Option<Tensor>,
}

impl Processing {
    /// The rows `start..start + len`.
    pub fn narrow(&self, start: i64, len: i64) -> Processing {
        let n = |t: &Tensor| t.narrow(0, start, len);
        Processing {
            temperature: n(&self.temperature),
            top_k: self.top_k.as_ref().map(n),
            top_p: self.top_p.as_ref().map(n),
        }
    }
}

/// `log_softmax` of `logits` (`[n, vocab]`, any float kind; fp32 result) under `proc`: the
/// model's own distribution when `proc` is `None`, else the tempered distribution renormalised
/// over each row's support (entries outside it are about −1e30, their probability 0). `next`
/// (`[n]`) are the tokens whose log-probs are wanted; each is kept in its row's support.
pub fn log_softmax(logits: &Tensor, next: &Tensor, proc: Option<&Processing>) -> Tensor {
    let Some(p) = proc else {
        return logits.log_softmax(-1, Kind::Float);
    };
    let z = logits.to_kind(Kind::Float) / p.temperature.unsqueeze(1);
    if p.top_k.is_none() && p.top_p.is_none() {
        return z.log_softmax(-1, Kind::Float);
    }
    let outside = {
        let _g = tch::no_grad_guard();
        outside(&z.detach(), next, p)
    };
    z.masked_fill(&outside, OUTSIDE).log_softmax(-1, Kind::Float)
}

/// Where each row of tempered logits `z` is outside its [`support`]: below the smallest kept
/// logit, and not `next`. One comparison over the vocabulary instead of scattering the support
/// back into it; a token tied with the smallest kept one is kept too (the sort that ranks them
/// is arbitrary there anyway).
fn outside(z: &Tensor, next: &Tensor, p: &Processing) -> Tensor {
    let (vals, keep, whole) = support(z, p);
    let count = keep
        .sum_dim_intlist([1i64].as_slice(), false, Kind::Int64)
        .clamp_min(1);
    let threshold = vals
        .gather(1, &(count - 1).unsqueeze(1), false)
        .masked_fill(&whole.unsqueeze(1), f64::NEG_INFINITY);
    let mut out = z.lt_tensor(&threshold);
    let _ = out.scatter_value_(-1, &next.unsqueeze(1), 0);
    out
}

/// The support of each row of tempered logits `z` (`[n, vocab]` f32): the top-k, then the
/// shortest most-likely prefix of the top-k-renormalised probabilities whose mass reaches
/// top-p (a token is kept when the mass before it is below top-p). Returns the most likely
/// logits in order (`[n, width]`), which of them are kept (a prefix of each row), and the rows
/// that keep the whole vocabulary. Ties are broken by the ranking, which may order equal logits
/// differently from the engine: only an exact tie at the boundary can tell.
///
/// Only the most likely tokens are ranked (`topk`, not a sort of the vocabulary: a full sort per
/// position made train-step ~9× slower on Qwen3's 151,936-token vocabulary): every row's top-k
/// when all rows have one, else a window that grows until each nucleus without a top-k ends
/// inside it. Rows with neither keep the whole vocabulary.
fn support(z: &Tensor, p: &Processing) -> (Tensor, Tensor, Tensor) {
    let (n, vocab) = (z.size()[0], z.size()[1]);
    let dev = z.device();
    let top_k = match &p.top_k {
        Some(k) => k.shallow_clone(),
        None => Tensor::zeros([n], (Kind::Int64, dev)),
    };
    let top_p = match &p.top_p {
        Some(t) => t.shallow_clone(),
        None => Tensor::full([n], 2.0, (Kind::Float, dev)),
    };
    let limited = top_k.gt(0);
    let nucleus = top_p.lt(1.0);
    // Rows that keep everything: no top-k and no top-p.
    let whole = limited.logical_or(&nucleus).logical_not();
    // Rows whose nucleus is taken over the whole vocabulary's probabilities.
    let open = limited.logical_not().logical_and(&nucleus);
    let any_open = open.any().int64_value(&[]) != 0;
    let k_max = top_k.max().int64_value(&[]).clamp(1, vocab);
    let mut width = if any_open { k_max.max(1024) } else { k_max }.min(vocab);
    let lse = any_open.then(|| z.logsumexp([-1i64].as_slice(), true));
    loop {
        let (vals, _) = z.topk(width, -1, true, true);
        let rank = Tensor::arange(width, (Kind::Int64, dev)).unsqueeze(0);
        let k = top_k.where_self(&limited, &Tensor::from(width).to_device(dev));
        let mut keep = rank.lt_tensor(&k.unsqueeze(1));
        let mut enough = true;
        if p.top_p.is_some() {
            // Renormalised over the top-k where there is one, over the vocabulary elsewhere.
            let in_k = vals
                .masked_fill(&keep.logical_not(), f64::NEG_INFINITY)
                .softmax(-1, Kind::Float);
            let probs = match &lse {
                Some(lse) => in_k.where_self(&limited.unsqueeze(1), &(&vals - lse).exp()),
                None => in_k,
            };
            let mass = probs.cumsum(-1, Kind::Float);
            let before = &mass - &probs;
            keep = keep.logical_and(&before.lt_tensor(&top_p.unsqueeze(1)));
            if width < vocab && any_open {
                // An open nucleus that has not reached its mass inside the window may go on.
                let reached = mass.select(1, width - 1).ge_tensor(&top_p);
                enough = open.logical_and(&reached.logical_not()).any().int64_value(&[]) == 0;
            }
        }
        if enough || width == vocab {
            return (vals, keep, whole);
        }
        width = (width * 8).min(vocab);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(p: &[[f64; 5]]) -> Tensor {
        let flat: Vec<f32> = p.iter().flatten().map(|x| x.ln() as f32).collect();
        Tensor::from_slice(&flat).view([p.len() as i64, 5])
    }

    fn proc(t: &[f32], k: Option<&[i64]>, p: Option<&[f32]>) -> Processing {
        Processing {
            temperature: Tensor::from_slice(t),
            top_k: k.map(Tensor::from_slice),
            top_p: p.map(Tensor::from_slice),
        }
    }

    fn values(t: &Tensor) -> Vec<Vec<f64>> {
        Vec::<Vec<f64>>::try_from(t.to_kind(Kind::Double)).unwrap()
    }

    const P: [f64; 5] = [0.5, 0.25, 0.125, 0.0625, 0.0625];

    #[test]
    fn temperature_then_top_k_then_top_p_renormalised_with_the_next_token_kept() {
        let logits = rows(&[P, P, P, P]);
        let next = Tensor::from_slice(&[0i64, 1, 4, 0]);
        // Row 0: T=2 alone. Row 1: top-p 0.8 keeps the three whose mass before is < 0.8.
        // Row 2: the same, but the next token (4) lies outside and is added. Row 3: top-k 2,
        // then top-p 0.6 of the renormalised pair (2/3, 1/3) keeps only the first.
        let p = proc(
            &[2.0, 1.0, 1.0, 1.0],
            Some(&[0, 0, 0, 2]),
            Some(&[2.0, 0.8, 0.8, 0.6]),
        );
        let lsm = values(&log_softmax(&logits, &next, Some(&p)));
        let t2: Vec<f64> = P.iter().map(|x| x.sqrt()).collect();
        let z: f64 = t2.iter().sum();
        for (got, want) in lsm[0].iter().zip(&t2) {
            assert!((got - (want / z).ln()).abs() < 1e-6, "{lsm:?}");
        }
        let kept = |row: &[f64], ids: &[usize]| {
            let mass: f64 = ids.iter().map(|&i| P[i]).sum();
            for (i, &l) in row.iter().enumerate() {
                if ids.contains(&i) {
                    assert!((l - (P[i] / mass).ln()).abs() < 1e-6, "{row:?}");
                } else {
                    assert!(l < -1e29, "{row:?}");
                }
            }
        };
        kept(&lsm[1], &[0, 1, 2]);
        kept(&lsm[2], &[0, 1, 2, 4]);
        kept(&lsm[3], &[0]);
        assert_eq!(
            values(&log_softmax(&logits, &next, None)),
            values(&logits.log_softmax(-1, Kind::Float))
        );
    }

    #[test]
    fn gradients_flow_through_the_tempered_logits_only_inside_the_support() {
        let logits = rows(&[P]).set_requires_grad(true);
        let next = Tensor::from_slice(&[1i64]);
        let p = proc(&[0.5], None, Some(&[0.8]));
        let lsm = log_softmax(&logits, &next, Some(&p));
        lsm.get(0).get(1).backward();
        let g = Vec::<f64>::try_from(logits.grad().get(0).to_kind(Kind::Double)).unwrap();
        // d log q(1) / d z = (onehot(1) − q) / T over the support, 0 outside.
        let q = values(&lsm.exp())[0].clone();
        for i in 0..5 {
            let want = (f64::from(i == 1) - q[i]) / 0.5;
            assert!((g[i] - want).abs() < 1e-6, "{g:?} vs {q:?}");
        }
        assert_eq!(g[3], 0.0);
    }

    /// The support by the definition, one row at a time: a full sort of the vocabulary.
    fn reference(z: &[f32], next: usize, top_k: usize, top_p: f32) -> Vec<bool> {
        let mut order: Vec<usize> = (0..z.len()).collect();
        order.sort_by(|&a, &b| z[b].total_cmp(&z[a]));
        let k = if top_k == 0 { z.len() } else { top_k };
        let kept = &order[..k];
        let max = z[kept[0]] as f64;
        let total: f64 = kept.iter().map(|&i| (z[i] as f64 - max).exp()).sum();
        let mut keep = vec![false; z.len()];
        let mut before = 0.0;
        for &i in kept {
            if top_p < 1.0 && before >= top_p as f64 {
                break;
            }
            keep[i] = true;
            before += (z[i] as f64 - max).exp() / total;
        }
        keep[next] = true;
        keep
    }

    #[test]
    fn the_windowed_support_equals_a_full_sort_of_the_vocabulary() {
        // A peaked row (its nucleus inside the first window), flat rows whose nucleus needs
        // more than 1024 tokens (the window grows), top-k rows with and without top-p, and a
        // row that keeps everything.
        let vocab = 5000;
        tch::manual_seed(3);
        let peaked = Tensor::randn([1, vocab], (Kind::Float, tch::Device::Cpu)) * 4.0;
        let flat = Tensor::randn([5, vocab], (Kind::Float, tch::Device::Cpu)) * 0.05;
        let z = Tensor::cat(&[peaked, flat], 0);
        let next = Tensor::from_slice(&[7i64, 11, 4999, 0, 42, 3]);
        let k = [0i64, 0, 0, 50, 3000, 0];
        let top_p = [0.9f32, 0.95, 0.3, 0.5, 2.0, 2.0];
        let p = proc(&[1.0; 6], Some(&k), Some(&top_p));
        let got = outside(&z, &next, &p).logical_not();
        let rows = Vec::<Vec<f32>>::try_from(&z).unwrap();
        let got = Vec::<Vec<bool>>::try_from(&got).unwrap();
        let nexts = Vec::<i64>::try_from(&next).unwrap();
        for r in 0..6 {
            let want = reference(&rows[r], nexts[r] as usize, k[r] as usize, top_p[r]);
            let sizes = (
                want.iter().filter(|&&x| x).count(),
                got[r].iter().filter(|&&x| x).count(),
            );
            assert!(
                got[r] == want,
                "row {r}: support sizes (reference, windowed) {sizes:?}"
            );
        }
        // Row 1's nucleus is larger than the first window.
        assert!(got[1].iter().filter(|&&x| x).count() > 1024);
    }
}
