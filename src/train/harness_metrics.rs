//! train-step's figures split by harness (`StepMetrics::by_harness`): a batch from a mixed
//! rollout (`rollout --harness` more than once) holds trajectories of several harnesses, and a
//! total hides one whose captures the trainer reproduces worse, or whose rewards lag. A pure
//! function of the samples (their `metadata.harness`, written by align), the batch's trajectories
//! and groups (advantages) and the per-sequence π_old log-probs of pass 1. The same agreement
//! figures per trajectory (`StepMetrics::by_trajectory`) let the report show each trajectory's.

use std::collections::{BTreeMap, BTreeSet};

use super::batch::Batch;
use super::metrics::{agreement, mean_std, median, pearson};
use crate::align::by_harness::of_sample;
use crate::records::{HarnessStepMetrics, Sample, TrajectoryAgreement};

/// The step's figures per harness; empty when no sample names one. `samples[i]` is the sample of
/// `batch.seqs[i]` and `old[i]` its trainer log-probs; samples without a harness count as
/// `unknown`.
pub fn by_harness(
    samples: &[Sample],
    batch: &Batch,
    old: &[Vec<f64>],
) -> BTreeMap<String, HarnessStepMetrics> {
    if samples.iter().all(|s| of_sample(s).is_none()) {
        return BTreeMap::new();
    }
    let name = |i: usize| of_sample(&samples[i]).unwrap_or("unknown").to_string();
    // Each trajectory's harness: its first sample's.
    let mut traj_harness: Vec<Option<String>> = vec![None; batch.trajs.len()];
    #[derive(Default)]
    struct Acc {
        samples: u64,
        ro: Vec<f64>,
        tr: Vec<f64>,
        seq_r: Vec<f64>,
    }
    let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
    for (i, seq) in batch.seqs.iter().enumerate() {
        let h = name(i);
        traj_harness[seq.traj].get_or_insert_with(|| h.clone());
        let a = acc.entry(h).or_default();
        a.samples += 1;
        let r: Vec<f64> = seq.rollout_lp.iter().map(|&x| f64::from(x)).collect();
        let t = old.get(i).map_or(&[][..], Vec::as_slice);
        if let Some(p) = pearson(&r, t) {
            a.seq_r.push(p);
        }
        a.ro.extend(r);
        a.tr.extend_from_slice(t);
    }
    let mut out: BTreeMap<String, HarnessStepMetrics> = BTreeMap::new();
    for (h, a) in acc {
        let (p, max_abs, kl) = agreement(&a.ro, &a.tr);
        out.insert(
            h,
            HarnessStepMetrics {
                samples: a.samples,
                policy_tokens: a.ro.len() as u64,
                logprob_pearson: p,
                logprob_pearson_seq_median: median(a.seq_r),
                logprob_max_abs_diff: max_abs,
                logprob_kl: kl,
                ..Default::default()
            },
        );
    }
    for (h, m) in &mut out {
        let mine: Vec<usize> = (0..batch.trajs.len())
            .filter(|&t| traj_harness[t].as_deref() == Some(h.as_str()))
            .collect();
        let valid: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|&t| batch.trajs[t].weight > 0.0)
            .collect();
        m.trajectories = mine.len() as u64;
        m.valid_trajectories = valid.len() as u64;
        m.infra_failed_trajectories = (mine.len() - valid.len()) as u64;
        let rewards: Vec<f64> = valid.iter().map(|&t| batch.trajs[t].reward).collect();
        (m.reward_mean, m.reward_std) = mean_std(&rewards).unzip();
        let adv: Vec<f64> = valid.iter().map(|&t| batch.trajs[t].advantage).collect();
        m.advantage_mean = mean_std(&adv).map(|(mean, _)| mean);
        for members in &batch.groups {
            let hs: BTreeSet<&str> = members
                .iter()
                .filter_map(|&t| traj_harness[t].as_deref())
                .collect();
            if hs.contains(h.as_str()) {
                m.groups += 1;
                m.mixed_groups += u64::from(hs.len() > 1);
            }
        }
    }
    out
}

/// The rollout-vs-trainer agreement of each trajectory of `batch` with policy tokens, in the
/// batch's trajectory order; `old[i]` are the trainer log-probs of `batch.seqs[i]`.
pub fn by_trajectory(batch: &Batch, old: &[Vec<f64>]) -> Vec<TrajectoryAgreement> {
    let mut acc: Vec<(u64, Vec<f64>, Vec<f64>)> = vec![(0, Vec::new(), Vec::new()); batch.trajs.len()];
    for (i, seq) in batch.seqs.iter().enumerate() {
        let a = &mut acc[seq.traj];
        a.0 += 1;
        a.1.extend(seq.rollout_lp.iter().map(|&x| f64::from(x)));
        a.2.extend_from_slice(old.get(i).map_or(&[][..], Vec::as_slice));
    }
    batch
        .trajs
        .iter()
        .zip(acc)
        .filter(|(_, (samples, ro, _))| *samples > 0 && !ro.is_empty())
        .map(|(t, (samples, ro, tr))| {
            let (p, max_abs, kl) = agreement(&ro, &tr);
            let n = ro.len().min(tr.len());
            let mean_abs =
                (n > 0).then(|| ro.iter().zip(&tr).map(|(a, b)| (a - b).abs()).sum::<f64>() / n as f64);
            TrajectoryAgreement {
                trajectory_id: t.id.clone(),
                samples,
                policy_tokens: ro.len() as u64,
                logprob_pearson: p,
                logprob_mean_abs_diff: mean_abs,
                logprob_max_abs_diff: max_abs,
                logprob_kl: kl,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{LossMask, Packed};

    fn sample(traj: &str, group: u64, harness: Option<&str>, reward: f64, lps: &[f32]) -> Sample {
        let n = lps.len() as u32;
        let mut metadata = serde_json::Map::new();
        if let Some(h) = harness {
            metadata.insert("harness".into(), h.into());
        }
        Sample {
            schema: "lego-rl/sample/v1".into(),
            id: format!("{traj}#0.0"),
            trajectory_id: traj.into(),
            task_id: "t".into(),
            group_id: group,
            sample_index: 0,
            thread: 0,
            segment: 0,
            token_ids: (0..=n).collect(),
            loss_mask: LossMask(vec![1, n]),
            rollout_logprobs: Packed::f32_vec(lps),
            sampling: Vec::new(),
            routing: None,
            reward,
            weight: 1.0,
            policy_version: 0,
            policy_versions: Vec::new(),
            metadata,
        }
    }

    fn batch(samples: &[Sample]) -> Batch {
        Batch::new(
            samples,
            &crate::model::Config::tiny(),
            0,
            std::path::Path::new("x"),
            1e-6,
        )
        .unwrap()
    }

    /// One mixed group (a on mini, b on openhands) and one group of openhands only: rewards,
    /// advantages, groups and log-prob agreement land on the right harness.
    #[test]
    fn figures_land_on_the_harness_that_ran_each_trajectory() {
        let s = vec![
            sample("a", 0, Some("mini"), 0.0, &[-1.0, -2.0, -3.0]),
            sample("b", 0, Some("oh"), 1.0, &[-1.0, -2.0]),
            sample("c", 1, Some("oh"), 1.0, &[-0.5, -0.7]),
            sample("d", 1, Some("oh"), 1.0, &[-0.1, -0.2]),
        ];
        let b = batch(&s);
        // The trainer agrees perfectly with mini's tokens and is off by a constant on oh's.
        let old: Vec<Vec<f64>> = vec![
            vec![-1.0, -2.0, -3.0],
            vec![-1.5, -2.5],
            vec![-1.0, -1.2],
            vec![-0.6, -0.7],
        ];
        let m = by_harness(&s, &b, &old);
        let (mini, oh) = (&m["mini"], &m["oh"]);
        assert_eq!((mini.trajectories, mini.samples, mini.policy_tokens), (1, 1, 3));
        assert_eq!((oh.trajectories, oh.samples, oh.policy_tokens), (3, 3, 6));
        assert_eq!(
            (mini.groups, mini.mixed_groups, oh.groups, oh.mixed_groups),
            (1, 1, 2, 1)
        );
        assert_eq!((mini.reward_mean, oh.reward_mean), (Some(0.0), Some(1.0)));
        assert!(mini.advantage_mean.unwrap() < 0.0 && oh.advantage_mean.unwrap() > 0.0);
        assert_eq!(mini.logprob_max_abs_diff, Some(0.0));
        assert!((oh.logprob_max_abs_diff.unwrap() - 0.5).abs() < 1e-6);
        assert!((mini.logprob_pearson.unwrap() - 1.0).abs() < 1e-12);
        // Per trajectory: a agrees exactly; b is off by 0.5 on each of its two tokens.
        let t = by_trajectory(&b, &old);
        let ids: Vec<&str> = t.iter().map(|x| x.trajectory_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert_eq!((t[0].policy_tokens, t[0].logprob_mean_abs_diff), (3, Some(0.0)));
        assert!(
            (t[1].logprob_mean_abs_diff.unwrap() - 0.5).abs() < 1e-6,
            "{:?}",
            t[1]
        );
        assert!((t[0].logprob_pearson.unwrap() - 1.0).abs() < 1e-12);
        // Samples aligned before align named harnesses: no split at all.
        let plain: Vec<Sample> = s
            .iter()
            .cloned()
            .map(|mut x| {
                x.metadata.clear();
                x
            })
            .collect();
        assert!(by_harness(&plain, &batch(&plain), &old).is_empty());
    }
}
