//! GSPO (Zheng et al. 2025) objective math, kept free of model code so it can be checked by hand.
//!
//! Per trajectory i: s_i = exp((1/|y_i|) Σ_t (log π_θ − log π_old)) over its policy tokens (all
//! segments together), loss = −(1/N) Σ_i w_i · min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i)
//! over the N contributing trajectories.
//!
//! Because one trajectory's segments can land in different micro-batches, the trainer never
//! differentiates this expression directly. It first computes every s_i (weights do not change
//! during gradient accumulation), then backpropagates the linear surrogate Σ_t c_t·log π_θ(t)
//! whose coefficients c_t = ∂loss/∂log π_θ(t) are given by [`coefficients`]. `gspo-token`
//! (sg[s_i]·π_θ/sg[π_θ] per token) has the same value and gradient when A is per-sequence, and
//! `sft` is the masked mean NLL.

/// Which objective to optimise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// Sequence-level clipped ratio (GSPO).
    Gspo,
    /// GSPO-token: per-token ratio sg[s_i]·π_θ/sg[π_θ] (same gradient with sequence advantages).
    GspoToken,
    /// Masked negative log-likelihood on policy tokens (warm start, rejection-sampling FT).
    Sft,
}

/// What the objective needs to know about one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajTerm {
    /// Group-relative advantage A_i.
    pub advantage: f64,
    /// Sample weight w_i (0 = infra failure).
    pub weight: f64,
    /// Whether it is in the mean (valid member of a group with ≥ 2 valid members and variance).
    pub contributes: bool,
    /// |y_i|: its policy tokens over all segments that an off-policy mask kept ([`accumulate`]).
    pub tokens: usize,
    /// Σ_t (log π_θ − log π_old) over those tokens, at the current weights.
    pub logratio_sum: f64,
    /// Σ_t log π_θ over those tokens (for `sft`).
    pub logprob_sum: f64,
}

/// Adds one sequence's policy tokens to its trajectory's term: current and old log-probs, and the
/// off-policy correction's weight of each token (`train-step --is-correction`; 1 without one).
/// A token weighted 0 (a token, sequence or geometric mask) is outside the objective: neither its
/// log-ratio nor its count enters s_i = exp(Σ Δ / |y_i|). Counting it, as the length did before,
/// diluted the ratio with a token that has no gradient and shrank every kept token's step by
/// the masked share. TIS weights (> 0) only scale gradients; their tokens count.
pub fn accumulate(term: &mut TrajTerm, cur: &[f64], old: &[f64], weights: &[f64]) {
    for ((c, o), w) in cur.iter().zip(old).zip(weights) {
        if *w > 0.0 {
            term.logratio_sum += c - o;
            term.logprob_sum += c;
            term.tokens += 1;
        }
    }
}

/// Loss value and per-trajectory derivative of one objective at the current weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    pub loss: f64,
    /// ∂loss/∂log π_θ(t), identical for every policy token t of trajectory i.
    pub coef: Vec<f64>,
    /// s_i per trajectory (1 for `sft` and non-contributing ones).
    pub ratio: Vec<f64>,
    /// Whether the clipped branch was active (gradient zero) for trajectory i.
    pub clipped: Vec<bool>,
    /// Number of trajectories in the mean (GSPO) or tokens in the mean (`sft`).
    pub denominator: f64,
}

/// Evaluates the objective and its per-trajectory token coefficients.
pub fn coefficients(kind: LossKind, terms: &[TrajTerm], eps_low: f64, eps_high: f64) -> Objective {
    let n = terms.len();
    let mut coef = vec![0.0; n];
    let mut ratio = vec![1.0; n];
    let mut clipped = vec![false; n];
    let mut loss = 0.0;
    let denominator;
    match kind {
        LossKind::Sft => {
            let valid = |t: &&TrajTerm| t.weight > 0.0;
            denominator = terms.iter().filter(valid).map(|t| t.tokens as f64).sum::<f64>();
            if denominator > 0.0 {
                for (i, t) in terms.iter().enumerate().filter(|(_, t)| valid(t)) {
                    coef[i] = -t.weight / denominator;
                    loss -= t.weight * t.logprob_sum / denominator;
                }
            }
        }
        LossKind::Gspo | LossKind::GspoToken => {
            denominator = terms.iter().filter(|t| t.contributes).count() as f64;
            for (i, t) in terms.iter().enumerate() {
                if !t.contributes || t.tokens == 0 {
                    continue;
                }
                let s = (t.logratio_sum / t.tokens as f64).exp();
                ratio[i] = s;
                let a = t.advantage;
                let unclipped = s * a;
                let clipped_val = s.clamp(1.0 - eps_low, 1.0 + eps_high) * a;
                let (value, slope) = if unclipped <= clipped_val {
                    (unclipped, a)
                } else {
                    (clipped_val, 0.0)
                };
                clipped[i] = slope == 0.0 && a != 0.0;
                loss -= t.weight * value / denominator;
                // d s / d logπ(t) = s / |y_i|.
                coef[i] = -t.weight * slope * s / (t.tokens as f64 * denominator);
            }
        }
    }
    Objective {
        loss,
        coef,
        ratio,
        clipped,
        denominator,
    }
}

/// Group-relative advantages: A = (r − mean)/(std + eps) over the group's valid members
/// (population std). Returns per-member (advantage, contributes) and whether the group had zero
/// variance. Fewer than 2 valid members, or zero variance: nobody contributes.
pub fn group_advantages(rewards: &[f64], weights: &[f64], eps: f64) -> (Vec<(f64, bool)>, bool) {
    let valid: Vec<f64> = rewards
        .iter()
        .zip(weights)
        .filter(|(_, &w)| w > 0.0)
        .map(|(&r, _)| r)
        .collect();
    let none = vec![(0.0, false); rewards.len()];
    if valid.len() < 2 {
        return (none, false);
    }
    let mean = valid.iter().sum::<f64>() / valid.len() as f64;
    let var = valid.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / valid.len() as f64;
    let std = var.sqrt();
    if std < 1e-8 {
        return (none, true);
    }
    let out = rewards
        .iter()
        .zip(weights)
        .map(|(&r, &w)| {
            if w > 0.0 {
                ((r - mean) / (std + eps), true)
            } else {
                (0.0, false)
            }
        })
        .collect();
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// Two groups: group A = {r=1, r=0, r=1 but infra-failed (w=0)}, group B = {1, 1} (zero
    /// variance). Trajectory 0 has two segments (tokens 0-1 and 2), trajectory 1 one segment.
    fn example() -> (Vec<f64>, Vec<f64>, Vec<usize>) {
        let old = vec![-1.0, -2.0, -0.5, -1.5, -0.7];
        // Current log-probs: trajectory 0 moved up by 0.01/token (ratio e^0.01 > 1+4e-4 → clipped
        // with A>0); trajectory 1 moved down slightly (ratio inside the band).
        let cur = vec![-0.99, -1.99, -0.49, -1.5001, -0.7001];
        let traj_of_token = vec![0, 0, 0, 1, 1];
        (old, cur, traj_of_token)
    }

    fn terms_at(
        cur: &[f64],
        old: &[f64],
        traj: &[usize],
        adv: &[(f64, bool)],
        weights: &[f64],
    ) -> Vec<TrajTerm> {
        (0..adv.len())
            .map(|i| {
                let toks: Vec<usize> = (0..cur.len()).filter(|&t| traj[t] == i).collect();
                TrajTerm {
                    advantage: adv[i].0,
                    weight: weights[i],
                    contributes: adv[i].1,
                    tokens: toks.len(),
                    logratio_sum: toks.iter().map(|&t| cur[t] - old[t]).sum(),
                    logprob_sum: toks.iter().map(|&t| cur[t]).sum(),
                }
            })
            .collect()
    }

    #[test]
    fn advantages_exclude_infra_failures_and_count_zero_variance() {
        let (a, zero) = group_advantages(&[1.0, 0.0, 1.0], &[1.0, 1.0, 0.0], 1e-6);
        assert!(!zero);
        assert!((a[0].0 - 0.5 / (0.5 + 1e-6)).abs() < 1e-12);
        assert!((a[1].0 + 0.5 / (0.5 + 1e-6)).abs() < 1e-12);
        assert_eq!(a[2], (0.0, false));
        let (b, zero) = group_advantages(&[1.0, 1.0], &[1.0, 1.0], 1e-6);
        assert!(zero);
        assert!(b.iter().all(|x| !x.1));
        let (c, zero) = group_advantages(&[1.0, 0.0], &[1.0, 0.0], 1e-6);
        assert!(
            !zero && c.iter().all(|x| !x.1),
            "one valid member contributes nothing"
        );
    }

    #[test]
    fn gspo_loss_matches_hand_computation_and_finite_differences() {
        let (old, cur, traj) = example();
        let (adv, _) = group_advantages(&[1.0, 0.0, 1.0], &[1.0, 1.0, 0.0], 1e-6);
        let weights = [1.0, 1.0, 0.0];
        let (el, eh) = (3e-4, 4e-4);
        let obj = coefficients(
            LossKind::Gspo,
            &terms_at(&cur, &old, &traj, &adv, &weights),
            el,
            eh,
        );
        // By hand: N = 2. s0 = exp(0.03/3) = e^0.01, clipped to 1.0004 (A0 = +0.999998);
        // s1 = exp(-0.0002/2) = e^-0.0001, inside the band, A1 = -0.999998.
        let a = 0.5 / (0.5 + 1e-6);
        let s1 = (-0.0001f64).exp();
        let want = -(1.0004 * a + s1 * -a) / 2.0;
        assert!((obj.loss - want).abs() < 1e-12, "{} vs {want}", obj.loss);
        assert_eq!(obj.clipped, vec![true, false, false]);
        assert_eq!(obj.denominator, 2.0);
        // Per-token gradient vs central finite differences of the loss.
        let loss_at =
            |c: &[f64]| coefficients(LossKind::Gspo, &terms_at(c, &old, &traj, &adv, &weights), el, eh).loss;
        for t in 0..cur.len() {
            let h = 1e-7;
            let mut up = cur.clone();
            up[t] += h;
            let mut dn = cur.clone();
            dn[t] -= h;
            let fd = (loss_at(&up) - loss_at(&dn)) / (2.0 * h);
            let analytic = obj.coef[traj[t]];
            assert!((fd - analytic).abs() < 1e-6, "token {t}: fd {fd} vs {analytic}");
        }
        // Token 3 of the unclipped trajectory: -(w/N)·A·s/|y| = a·s1/4.
        assert!((obj.coef[1] - a * s1 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn surrogate_gradient_through_autograd_equals_coefficients() {
        // The trainer backpropagates Σ c_t·logπ_t; through log_softmax that must equal the
        // gradient of the true loss with respect to the logits (checked by finite differences).
        let (old, _, traj) = example();
        let (adv, _) = group_advantages(&[1.0, 0.0, 1.0], &[1.0, 1.0, 0.0], 1e-6);
        let weights = [1.0, 1.0, 0.0];
        let (el, eh) = (0.05, 0.05);
        let targets = Tensor::from_slice(&[1i64, 0, 2, 1, 0]);
        let base = [
            0.1f64, 0.3, -0.2, 0.5, 0.0, 0.1, -0.3, 0.2, 0.4, 0.0, 0.1, 0.2, 0.3, 0.2, 0.1,
        ];
        let at = |j: usize, h: f64| {
            let mut v = base;
            v[j] += h;
            Tensor::from_slice(&v).reshape([5, 3])
        };
        let logits0 = at(0, 0.0);
        let lp_of = |l: &Tensor| {
            l.log_softmax(-1, Kind::Double)
                .gather(1, &targets.unsqueeze(1), false)
                .squeeze_dim(1)
        };
        let loss_of = |l: &Tensor| {
            let cur = Vec::<f64>::try_from(lp_of(l)).unwrap();
            coefficients(
                LossKind::Gspo,
                &terms_at(&cur, &old, &traj, &adv, &weights),
                el,
                eh,
            )
            .loss
        };
        let logits = logits0.copy().set_requires_grad(true);
        let lp = lp_of(&logits);
        let cur = Vec::<f64>::try_from(lp.detach()).unwrap();
        let obj = coefficients(
            LossKind::Gspo,
            &terms_at(&cur, &old, &traj, &adv, &weights),
            el,
            eh,
        );
        assert!(
            obj.ratio[0] > 1.0 + eh,
            "trajectory 0 is clipped in this example too"
        );
        let c: Vec<f64> = traj.iter().map(|&i| obj.coef[i]).collect();
        (lp * Tensor::from_slice(&c)).sum(Kind::Double).backward();
        let grad = Vec::<f64>::try_from(logits.grad().reshape([-1])).unwrap();
        for (j, &g) in grad.iter().enumerate() {
            let h = 1e-6;
            let fd = (loss_of(&at(j, h)) - loss_of(&at(j, -h))) / (2.0 * h);
            assert!((fd - g).abs() < 1e-7, "logit {j}: fd {fd} vs autograd {}", g);
        }
        assert!(
            grad.iter().any(|g| g.abs() > 1e-3),
            "gradient is not trivially zero"
        );
    }

    #[test]
    fn sft_is_masked_mean_nll_over_valid_trajectories() {
        let (old, cur, traj) = example();
        let adv = vec![(0.0, false), (0.0, false)];
        let obj = coefficients(
            LossKind::Sft,
            &terms_at(&cur, &old, &traj, &adv, &[1.0, 0.0]),
            0.0,
            0.0,
        );
        let want = -(cur[0] + cur[1] + cur[2]) / 3.0;
        assert!((obj.loss - want).abs() < 1e-12);
        assert_eq!(obj.coef, vec![-1.0 / 3.0, 0.0]);
    }

    #[test]
    fn gspo_token_has_gspo_value_and_gradient() {
        let (old, cur, traj) = example();
        let (adv, _) = group_advantages(&[1.0, 0.0, 1.0], &[1.0, 1.0, 0.0], 1e-6);
        let terms = terms_at(&cur, &old, &traj, &adv, &[1.0, 1.0, 0.0]);
        assert_eq!(
            coefficients(LossKind::Gspo, &terms, 3e-4, 4e-4),
            coefficients(LossKind::GspoToken, &terms, 3e-4, 4e-4)
        );
    }

    #[test]
    fn masked_tokens_leave_the_sequence_ratio_and_its_length() {
        let mut t = TrajTerm {
            advantage: 1.0,
            weight: 1.0,
            contributes: true,
            tokens: 0,
            logratio_sum: 0.0,
            logprob_sum: 0.0,
        };
        // Log-ratios 0.1, 5.0 (masked) and 0.1 (TIS-weighted 0.5: kept).
        accumulate(&mut t, &[-1.0, 4.0, -1.0], &[-1.1, -1.0, -1.1], &[1.0, 0.0, 0.5]);
        assert_eq!(t.tokens, 2);
        assert!((t.logratio_sum - 0.2).abs() < 1e-12, "{t:?}");
        let obj = coefficients(LossKind::Gspo, &[t], 0.5, 0.5);
        assert!((obj.ratio[0] - 0.1f64.exp()).abs() < 1e-12, "{obj:?}");
        // d loss / d log π(t) = −s / (|y| N): the two kept tokens share the step.
        assert!((obj.coef[0] + 0.1f64.exp() / 2.0).abs() < 1e-12, "{obj:?}");
    }
}
