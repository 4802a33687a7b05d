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

    /// Same rows, moved to `device`.
    pub fn to_device(&self, device: tch::Device) -> Processing {
        let d = |t: &Tensor| t.to_device(device);
        Processing {
            temperature: d(&self.temperature),
            top_k: self.top_k.as_ref().map(d),
            top_p: self.top_p.as_ref().map(d),
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
    let keep = {
        let _g = tch::no_grad_guard();
        support(&z.detach(), next, p)
    };
    z.masked_fill(&keep.logical_not(), OUTSIDE)
        .log_softmax(-1, Kind::Float)
}

/// The support of each row of tempered logits `z` (`[n, vocab]` f32): the top-k, then the
/// shortest most-likely prefix of the top-k-renormalised probabilities whose mass reaches
/// top-p (a token is kept when the mass before it is below top-p), plus `next`. Ties are broken
/// by the sort, which may order equal logits differently from the engine: only an exact tie at
/// the boundary can tell.
fn support(z: &Tensor, next: &Tensor, p: &Processing) -> Tensor {
    let (n, vocab) = (z.size()[0], z.size()[1]);
    let dev = z.device();
    let (sorted, order) = z.sort(-1, true);
    let rank = Tensor::arange(vocab, (Kind::Int64, dev)).unsqueeze(0);
    let mut keep = match &p.top_k {
        Some(k) => {
            let k = k.where_self(&k.gt(0), &Tensor::from(vocab).to_device(dev));
            rank.lt_tensor(&k.unsqueeze(1))
        }
        None => Tensor::ones([n, vocab], (Kind::Bool, dev)),
    };
    if let Some(top_p) = &p.top_p {
        let probs = sorted
            .masked_fill(&keep.logical_not(), f64::NEG_INFINITY)
            .softmax(-1, Kind::Float);
        let before = probs.cumsum(-1, Kind::Float) - &probs;
        keep = keep.logical_and(&before.lt_tensor(&top_p.unsqueeze(1)));
    }
    let mask = Tensor::zeros([n, vocab], (Kind::Bool, dev)).scatter(-1, &order, &keep);
    let ones = Tensor::ones([n, 1], (Kind::Bool, dev));
    mask.scatter(-1, &next.unsqueeze(1), &ones)
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
}
