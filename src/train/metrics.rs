//! Step metrics: the [`StepMetrics`] record of a step from its batch and results, and the small
//! statistics it uses (Pearson correlation, median, mean/std).

use crate::records::{Record, Sample, StepMetrics};

use super::batch::Batch;

/// Pearson correlation; `None` with fewer than 2 points or zero variance, NaN when a value is
/// not finite (a figure that was computed from a NaN is NaN, never "not measured").
pub fn pearson(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len().min(b.len());
    if n < 2 {
        return None;
    }
    if a.iter().chain(b).any(|x| !x.is_finite()) {
        return Some(f64::NAN);
    }
    let (ma, mb) = (a.iter().sum::<f64>() / n as f64, b.iter().sum::<f64>() / n as f64);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma).powi(2);
        sbb += (y - mb).powi(2);
    }
    (saa > 0.0 && sbb > 0.0).then(|| sab / (saa * sbb).sqrt())
}

/// Median (mean of the two middle values for even counts); `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Population mean and standard deviation; `None` when empty.
pub fn mean_std(v: &[f64]) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64;
    Some((m, var.sqrt()))
}

/// Pearson, largest |Δ| and mean k3 KL of rollout (`ro`) vs trainer (`tr`) log-probs.
pub fn agreement(ro: &[f64], tr: &[f64]) -> (Option<f64>, Option<f64>, Option<f64>) {
    // Not `f64::max`, which drops a NaN.
    let max_abs =
        ro.iter()
            .zip(tr)
            .map(|(a, b)| (a - b).abs())
            .reduce(|m, d| if d.is_nan() || d > m { d } else { m });
    let kl = (!ro.is_empty()).then(|| {
        ro.iter()
            .zip(tr)
            .map(|(r, t)| (t - r).exp() - 1.0 - (t - r))
            .sum::<f64>()
            / ro.len() as f64
    });
    (pearson(ro, tr), max_abs, kl)
}

/// Results of the update loop that go into the metrics.
pub(super) struct Finished {
    pub losses: Vec<f64>,
    pub ratios: Vec<f64>,
    pub clipped: usize,
    pub grad_norms: Vec<f64>,
    pub lr: f64,
    pub elapsed: f64,
}

/// The metrics of the step that followed policy version `prev` (π_old log-probs `old`).
pub(super) fn step_metrics(
    prev: u64,
    samples: &[Sample],
    batch: &Batch,
    old: &[Vec<f64>],
    entropy: Option<f64>,
    overlap: (i64, i64),
    f: Finished,
) -> StepMetrics {
    let valid: Vec<&super::batch::Traj> = batch.trajs.iter().filter(|t| t.weight > 0.0).collect();
    let rewards: Vec<f64> = valid.iter().map(|t| t.reward).collect();
    let (mut ro, mut tr, mut seq_r) = (Vec::new(), Vec::new(), Vec::new());
    for (seq, lp) in batch.seqs.iter().zip(old) {
        let r: Vec<f64> = seq.rollout_lp.iter().map(|&x| x as f64).collect();
        if let Some(p) = pearson(&r, lp) {
            seq_r.push(p);
        }
        ro.extend(r);
        tr.extend_from_slice(lp);
    }
    let (logprob_pearson, max_abs, kl) = agreement(&ro, &tr);
    let staleness = batch.staleness_histogram(prev);
    let stale_tokens: u64 = staleness.iter().sum();
    let total_tokens: usize = batch.seqs.iter().map(|s| s.tokens.len()).sum();
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let (rm, rs) = mean_std(&rewards).unzip();
    StepMetrics {
        schema: StepMetrics::SCHEMA.to_string(),
        step: prev + 1,
        loss: mean(&f.losses).unwrap_or(0.0),
        lr: f.lr,
        ratio_mean: mean(&f.ratios),
        ratio_min: f.ratios.iter().copied().reduce(f64::min),
        ratio_max: f.ratios.iter().copied().reduce(f64::max),
        clip_fraction: (!f.ratios.is_empty()).then(|| f.clipped as f64 / f.ratios.len() as f64),
        grad_norm: f.grad_norms.iter().copied().reduce(f64::max),
        entropy,
        reward_mean: rm,
        reward_std: rs,
        zero_variance_group_fraction: (!batch.groups.is_empty())
            .then(|| batch.zero_variance_groups as f64 / batch.groups.len() as f64),
        groups: batch.groups.len() as u64,
        valid_trajectories: valid.len() as u64,
        infra_failed_trajectories: (batch.trajs.len() - valid.len()) as u64,
        samples: samples.len() as u64,
        policy_tokens: ro.len() as u64,
        tokens_per_second: (f.elapsed > 0.0).then(|| total_tokens as f64 / f.elapsed),
        logprob_pearson,
        logprob_pearson_seq_median: median(seq_r),
        logprob_max_abs_diff: max_abs,
        logprob_kl: kl,
        expert_overlap: (overlap.1 > 0).then(|| overlap.0 as f64 / overlap.1 as f64),
        routing_replay: None,
        staleness_mean: (stale_tokens > 0).then(|| {
            staleness
                .iter()
                .enumerate()
                .map(|(s, &n)| s as f64 * n as f64)
                .sum::<f64>()
                / stale_tokens as f64
        }),
        staleness_max: staleness.iter().rposition(|&n| n > 0).map(|s| s as u64),
        staleness_histogram: staleness,
        seconds: Some(f.elapsed),
        extra: Default::default(),
        by_trajectory: super::harness_metrics::by_trajectory(batch, old),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_on_known_values() {
        assert!((pearson(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.5]).unwrap() - 0.99795).abs() < 1e-4);
        assert_eq!(pearson(&[1.0, 1.0], &[1.0, 2.0]), None);
        assert!(pearson(&[1.0, f64::NAN, 3.0], &[1.0, 2.0, 3.0]).unwrap().is_nan());
        let (r, max_abs, kl) = agreement(&[-1.0, f64::NAN, -2.0], &[-1.0, -1.5, -2.0]);
        assert!(r.unwrap().is_nan() && max_abs.unwrap().is_nan() && kl.unwrap().is_nan());
        assert_eq!(median(vec![3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(mean_std(&[1.0, 3.0]), Some((2.0, 1.0)));
    }
}
