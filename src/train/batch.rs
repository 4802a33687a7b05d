//! Turns `Sample` records into validated training sequences, trajectories and groups.
//!
//! Every check happens here, before any weight changes, and every error names the input file,
//! the record (1-based) and the sample id: token ids beyond the vocabulary, a loss mask or
//! rollout log-probs of the wrong length, a policy token at position 0, routing whose shape does
//! not match the model (`[T or T−1, moe_layers, top_k]`) or names an expert that does not exist.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tch::{Device, Tensor};

use crate::model::sampled::Processing;
use crate::model::Config;
use crate::records::{Sample, Sampling, SamplingRun};

use super::gspo::group_advantages;
use super::TrainError;

/// One packed-able training sequence.
#[derive(Debug, Clone)]
pub struct Seq {
    /// The sample's id (for errors that name it).
    pub id: String,
    /// Index of the trajectory in [`Batch::trajs`].
    pub traj: usize,
    pub tokens: Vec<i64>,
    /// Positions whose *next* token is a policy token (t−1 for every loss-mask-1 t).
    pub pred_at: Vec<i64>,
    /// Rollout log-probs of those policy tokens.
    pub rollout_lp: Vec<f32>,
    /// Per policy token, the distribution it was drawn from when not the model's own; empty
    /// when every token was.
    pub sampled: Vec<Draw>,
    /// `[rows, moe_layers, k]` recorded expert ids, rows = T or T−1.
    pub routing: Option<(usize, Vec<i64>)>,
    /// (policy version, policy tokens it generated), in token order ([`Sample::policy_versions`]).
    pub versions: Vec<(u64, usize)>,
}

/// The distribution one policy token was drawn from, as the head's [`Processing`] holds it:
/// top-k 0, top-p 2 (no float sum reaches it) and min-p 0 where there is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub temperature: f32,
    pub top_k: i64,
    pub top_p: f32,
    pub min_p: f32,
}

/// One trajectory (all its segments share s_i and A_i).
#[derive(Debug, Clone)]
pub struct Traj {
    pub id: String,
    /// The GSPO group: (task_id, group_id). Group ids are per task (one rollout call numbers
    /// every task's groups of an epoch alike), so the task is part of the key.
    pub group: (String, u64),
    pub reward: f64,
    pub weight: f64,
    pub policy_version: u64,
    pub advantage: f64,
    pub contributes: bool,
}

/// Sequences, trajectories and group statistics of one step's input.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub seqs: Vec<Seq>,
    pub trajs: Vec<Traj>,
    /// trajectory indices per group, groups in ascending (task_id, group_id) order.
    pub groups: Vec<Vec<usize>>,
    pub zero_variance_groups: usize,
}

fn bad(path: &Path, record: usize, id: &str, msg: String) -> TrainError {
    TrainError::BadSample {
        path: path.to_path_buf(),
        record: record + 1,
        id: id.to_string(),
        msg,
    }
}

impl Batch {
    /// Validates `samples` (read from `path`) against the model and computes advantages.
    pub fn new(
        samples: &[Sample],
        cfg: &Config,
        moe_layers: usize,
        path: &Path,
        adv_eps: f64,
    ) -> Result<Self, TrainError> {
        if samples.is_empty() {
            return Err(TrainError::NoSamples {
                path: path.to_path_buf(),
            });
        }
        let mut batch = Batch::default();
        let mut traj_index: HashMap<&str, usize> = HashMap::new();
        for (r, s) in samples.iter().enumerate() {
            let seq = to_seq(s, cfg, moe_layers, path, r)?;
            let ti = *traj_index.entry(&s.trajectory_id).or_insert_with(|| {
                batch.trajs.push(Traj {
                    id: s.trajectory_id.clone(),
                    group: (s.task_id.clone(), s.group_id),
                    reward: s.reward,
                    weight: s.weight,
                    policy_version: s.policy_version,
                    advantage: 0.0,
                    contributes: false,
                });
                batch.trajs.len() - 1
            });
            let t = &mut batch.trajs[ti];
            if t.group.0 != s.task_id
                || t.group.1 != s.group_id
                || t.reward != s.reward
                || t.weight != s.weight
            {
                return Err(bad(
                    path,
                    r,
                    &s.id,
                    format!(
                        "segment of trajectory `{}` disagrees with an earlier segment on task_id/group_id/reward/weight",
                        s.trajectory_id
                    ),
                ));
            }
            batch.seqs.push(Seq { traj: ti, ..seq });
        }
        let mut groups: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
        for (i, t) in batch.trajs.iter().enumerate() {
            groups.entry(t.group.clone()).or_default().push(i);
        }
        for members in groups.into_values() {
            let rewards: Vec<f64> = members.iter().map(|&i| batch.trajs[i].reward).collect();
            let weights: Vec<f64> = members.iter().map(|&i| batch.trajs[i].weight).collect();
            let (adv, zero) = group_advantages(&rewards, &weights, adv_eps);
            batch.zero_variance_groups += zero as usize;
            for (&i, (a, c)) in members.iter().zip(adv) {
                batch.trajs[i].advantage = a;
                batch.trajs[i].contributes = c;
            }
            batch.groups.push(members);
        }
        Ok(batch)
    }

    /// Policy tokens by staleness: entry `s` counts the tokens generated by policy version
    /// `current − s`, where `current` is the version being trained (a token generated by a newer
    /// one counts as 0). Per token, not per trajectory: a trajectory that spans a reload has
    /// tokens of several versions.
    pub fn staleness_histogram(&self, current: u64) -> Vec<u64> {
        let mut hist: Vec<u64> = Vec::new();
        for &(version, tokens) in self.seqs.iter().flat_map(|s| &s.versions) {
            let behind = current.saturating_sub(version) as usize;
            if hist.len() <= behind {
                hist.resize(behind + 1, 0);
            }
            hist[behind] += tokens as u64;
        }
        hist
    }
}

fn to_seq(s: &Sample, cfg: &Config, moe_layers: usize, path: &Path, r: usize) -> Result<Seq, TrainError> {
    let n = s.token_ids.len();
    if n == 0 {
        return Err(bad(path, r, &s.id, "token_ids is empty".into()));
    }
    if let Some((i, &tok)) = s
        .token_ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t as i64 >= cfg.vocab_size)
    {
        return Err(bad(
            path,
            r,
            &s.id,
            format!(
                "token_ids[{i}] = {tok} is outside the model's vocabulary (vocab_size {})",
                cfg.vocab_size
            ),
        ));
    }
    if s.loss_mask.len() != n {
        return Err(bad(
            path,
            r,
            &s.id,
            format!(
                "loss_mask covers {} positions, token_ids has {n}",
                s.loss_mask.len()
            ),
        ));
    }
    let mask = s.loss_mask.to_dense();
    if mask[0] {
        return Err(bad(
            path,
            r,
            &s.id,
            "loss_mask marks position 0, which has no context to predict it from".into(),
        ));
    }
    let pred_at: Vec<i64> = (1..n).filter(|&t| mask[t]).map(|t| t as i64 - 1).collect();
    let rollout_lp = s
        .rollout_logprobs
        .to_f32()
        .map_err(|e| bad(path, r, &s.id, format!("rollout_logprobs: {e}")))?;
    if rollout_lp.len() != pred_at.len() {
        return Err(bad(
            path,
            r,
            &s.id,
            format!(
                "rollout_logprobs has {} values, loss_mask has {} ones",
                rollout_lp.len(),
                pred_at.len()
            ),
        ));
    }
    if let Some(j) = rollout_lp.iter().position(|l| !l.is_finite()) {
        return Err(bad(
            path,
            r,
            &s.id,
            format!(
                "rollout_logprobs[{j}] is {}: a sampled token's log-prob is finite",
                rollout_lp[j]
            ),
        ));
    }
    let sampled = sampled_from(&s.sampling, pred_at.len())
        .map_err(|m| bad(path, r, &s.id, format!("sampling: {m}")))?;
    let versions =
        versions_of(s, pred_at.len()).map_err(|m| bad(path, r, &s.id, format!("policy_versions: {m}")))?;
    let routing = match (&s.routing, moe_layers) {
        (Some(p), l) if l > 0 => {
            let k = cfg.num_experts_per_tok as usize;
            let shape_ok = p.shape.len() == 3 && (p.shape[0] == n || p.shape[0] + 1 == n);
            if !shape_ok || p.shape[1] != l || p.shape[2] != k {
                return Err(bad(
                    path,
                    r,
                    &s.id,
                    format!(
                        "routing has shape {:?}, the model needs [{n} or {}, {l}, {k}] ([tokens, moe_layers, top_k])",
                        p.shape,
                        n - 1
                    ),
                ));
            }
            let ids = p
                .to_u32()
                .map_err(|e| bad(path, r, &s.id, format!("routing: {e}")))?;
            if let Some(&e) = ids.iter().find(|&&e| e as i64 >= cfg.num_experts) {
                return Err(bad(
                    path,
                    r,
                    &s.id,
                    format!("routing names expert {e}, the model has {}", cfg.num_experts),
                ));
            }
            Some((p.shape[0], ids.into_iter().map(i64::from).collect()))
        }
        _ => None,
    };
    Ok(Seq {
        id: s.id.clone(),
        traj: 0,
        tokens: s.token_ids.iter().map(|&t| t as i64).collect(),
        pred_at,
        rollout_lp,
        sampled,
        routing,
        versions,
    })
}

/// A sample's policy versions as (version, tokens) runs over its `n` policy tokens, checking
/// them: the first run starts at 0, each starts after the previous and below `n`, and no version
/// is older than the trajectory's `policy_version` (versions only grow during a trajectory).
fn versions_of(s: &Sample, n: usize) -> Result<Vec<(u64, usize)>, String> {
    let runs = &s.policy_versions;
    if runs.is_empty() {
        return Ok(vec![(s.policy_version, n)]);
    }
    let mut out = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        let start = run.start as usize;
        let end = runs.get(i + 1).map_or(n, |next| next.start as usize);
        if (i == 0 && start != 0) || start >= end || end > n {
            return Err(format!(
                "run {i} covers policy tokens {start}..{end}: runs must start at 0 and cover 0..{n} in increasing order"
            ));
        }
        if run.version < s.policy_version {
            return Err(format!(
                "run {i}: version {} is older than the trajectory's policy_version {}",
                run.version, s.policy_version
            ));
        }
        out.push((run.version, end - start));
    }
    Ok(out)
}

/// Expands a sample's sampling runs over its `n` policy tokens (empty when every token was drawn
/// from the model's own distribution), checking them: starts in increasing order below `n`, a
/// temperature above greedy decoding, a top-p in (0, 1], a min-p in [0, 1].
fn sampled_from(runs: &[SamplingRun], n: usize) -> Result<Vec<Draw>, String> {
    if runs.iter().all(SamplingRun::is_model) {
        return Ok(Vec::new());
    }
    let mut out = vec![MODEL; n];
    for (i, run) in runs.iter().enumerate() {
        let start = run.start as usize;
        let end = runs.get(i + 1).map_or(n, |next| next.start as usize);
        if start >= end || end > n {
            return Err(format!(
                "run {i} covers policy tokens {start}..{end}, outside 0..{n} or not after the previous run"
            ));
        }
        if !(run.temperature.is_finite() && run.temperature > Sampling::GREEDY_BELOW) {
            return Err(format!(
                "run {i}: temperature {} is not a sampling temperature",
                run.temperature
            ));
        }
        if !(run.top_p > 0.0 && run.top_p <= 1.0) {
            return Err(format!("run {i}: top_p {} is outside (0, 1]", run.top_p));
        }
        if !(0.0..=1.0).contains(&run.min_p) {
            return Err(format!("run {i}: min_p {} is outside [0, 1]", run.min_p));
        }
        let top_p = if run.top_p < 1.0 {
            run.top_p as f32
        } else {
            NO_TOP_P
        };
        out[start..end].fill(Draw {
            temperature: run.temperature as f32,
            top_k: i64::from(run.top_k),
            top_p,
            min_p: run.min_p as f32,
        });
    }
    Ok(out)
}

/// The top-p of a position without one: no float sum of probabilities reaches it.
const NO_TOP_P: f32 = 2.0;

/// A token drawn from the model's own distribution, as [`Seq::sampled`] holds it.
const MODEL: Draw = Draw {
    temperature: 1.0,
    top_k: 0,
    top_p: NO_TOP_P,
    min_p: 0.0,
};

/// The head's [`Processing`] of the scored positions of micro-batch `mb` (in the order
/// `Trainer::inputs` lays them out: each sequence's `pred_at` in turn), or `None` when every
/// token was drawn from the model's own distribution.
pub fn processing(seqs: &[Seq], mb: &[usize], device: Device) -> Option<Processing> {
    if mb.iter().all(|&i| seqs[i].sampled.is_empty()) {
        return None;
    }
    let (mut t, mut k, mut p, mut m) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &i in mb {
        let s = &seqs[i];
        let own;
        let rows = if s.sampled.is_empty() {
            own = vec![MODEL; s.pred_at.len()];
            &own
        } else {
            &s.sampled
        };
        for d in rows {
            t.push(d.temperature);
            k.push(d.top_k);
            p.push(d.top_p);
            m.push(d.min_p);
        }
    }
    let on = |v: Tensor| v.to_device(device);
    Some(Processing {
        temperature: on(Tensor::from_slice(&t)),
        top_k: k.iter().any(|&x| x > 0).then(|| on(Tensor::from_slice(&k))),
        top_p: p.iter().any(|&x| x < 1.0).then(|| on(Tensor::from_slice(&p))),
        min_p: m.iter().any(|&x| x > 0.0).then(|| on(Tensor::from_slice(&m))),
    })
}

/// Splits sequence indices into micro-batches of at most `budget` tokens (a longer sequence goes
/// alone), keeping input order.
pub fn micro_batches(seqs: &[Seq], idx: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for &i in idx {
        let n = seqs[i].tokens.len();
        match out.last_mut() {
            Some(mb) if used + n <= budget => {
                mb.push(i);
                used += n;
            }
            _ => {
                out.push(vec![i]);
                used = n;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{LossMask, Packed, Record};

    fn sample(task: &str, group: u64, index: u32, reward: f64) -> Sample {
        Sample {
            schema: Sample::SCHEMA.into(),
            id: format!("{task}/{group}/{index}#0.0"),
            trajectory_id: format!("{task}/{group}/{index}"),
            task_id: task.into(),
            group_id: group,
            sample_index: index,
            thread: 0,
            segment: 0,
            token_ids: vec![1, 2, 3, 4],
            loss_mask: LossMask::from_dense(&[false, false, true, true]),
            rollout_logprobs: Packed::f32_vec(&[-1.0, -1.0]),
            sampling: Vec::new(),
            routing: None,
            reward,
            weight: 1.0,
            policy_version: 0,
            policy_versions: Vec::new(),
            metadata: Default::default(),
        }
    }

    #[test]
    fn groups_are_per_task_even_when_group_ids_coincide() {
        // One rollout call numbers every task's first group 0: task a is all-solved (no signal),
        // task b is mixed. Keyed by group_id alone they would form one mixed group of 4.
        let samples = [
            sample("a", 0, 0, 1.0),
            sample("a", 0, 1, 1.0),
            sample("b", 0, 0, 1.0),
            sample("b", 0, 1, 0.0),
        ];
        let b = Batch::new(&samples, &Config::tiny(), 0, Path::new("s.jsonl"), 1e-6).unwrap();
        assert_eq!(b.groups.len(), 2);
        assert_eq!(b.zero_variance_groups, 1);
        let adv: Vec<(bool, f64)> = b.trajs.iter().map(|t| (t.contributes, t.advantage)).collect();
        assert!(!adv[0].0 && !adv[1].0, "task a's group is zero-variance: {adv:?}");
        assert!(
            adv[2].0 && adv[3].0 && adv[2].1 > 0.0 && adv[3].1 < 0.0,
            "{adv:?}"
        );
    }

    #[test]
    fn sampling_runs_expand_per_policy_token_and_bad_ones_are_named() {
        let run = |start, temperature, top_k, top_p| SamplingRun {
            start,
            temperature,
            top_k,
            top_p,
            min_p: 0.0,
            rule: Default::default(),
        };
        let draw = |temperature, top_k, top_p| Draw {
            temperature,
            top_k,
            top_p,
            min_p: 0.0,
        };
        assert!(sampled_from(&[], 3).unwrap().is_empty());
        assert!(sampled_from(&[run(0, 1.0, 0, 1.0)], 3).unwrap().is_empty());
        assert_eq!(
            sampled_from(&[run(1, 0.5, 4, 0.9), run(2, 1.0, 0, 1.0)], 3).unwrap(),
            vec![draw(1.0, 0, NO_TOP_P), draw(0.5, 4, 0.9), draw(1.0, 0, NO_TOP_P)]
        );
        let err = |runs: &[SamplingRun]| sampled_from(runs, 3).unwrap_err();
        assert!(err(&[run(3, 0.5, 0, 1.0)]).contains("run 0 covers policy tokens 3..3"));
        assert!(err(&[run(2, 0.5, 0, 1.0), run(1, 0.7, 0, 1.0)]).contains("run 0 covers"));
        assert!(err(&[run(0, 0.0, 0, 1.0)]).contains("temperature 0"));
        assert!(err(&[run(0, 0.5, 0, 0.0)]).contains("top_p 0 is outside"));
        let mut min_p = run(0, 0.5, 0, 1.0);
        min_p.min_p = 1.5;
        assert!(err(&[min_p]).contains("min_p 1.5 is outside"));
    }

    #[test]
    fn a_non_finite_rollout_logprob_is_refused_naming_the_sample_and_token() {
        let mut a = sample("a", 0, 0, 1.0);
        a.token_ids = vec![1, 2, 3, 4];
        a.loss_mask = LossMask::from_dense(&[false, true, true, true]);
        a.rollout_logprobs = Packed::f32_vec(&[-1.0, f32::NAN, -1.0]);
        let e = Batch::new(&[a], &Config::tiny(), 0, Path::new("s.jsonl"), 1e-6)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.jsonl") && e.contains("a/0/0#0.0") && e.contains("rollout_logprobs[1] is NaN"),
            "{e}"
        );
    }

    #[test]
    fn staleness_is_counted_per_token_from_the_version_runs() {
        let run = |start, version| crate::records::VersionRun { start, version };
        let mut a = sample("a", 0, 0, 1.0);
        a.token_ids = vec![1, 2, 3, 4, 5];
        a.loss_mask = LossMask::from_dense(&[false, true, true, true, true]);
        a.rollout_logprobs = Packed::f32_vec(&[-1.0; 4]);
        a.policy_version = 2;
        // One token of version 2, then a reload: three of version 3.
        a.policy_versions = vec![run(0, 2), run(1, 3)];
        let mut b = sample("a", 0, 1, 0.0);
        b.policy_version = 4;
        let batch = Batch::new(&[a.clone(), b], &Config::tiny(), 0, Path::new("s.jsonl"), 1e-6).unwrap();
        // Training version 4: b's 2 tokens are current, a's 3 tokens 1 behind, its first 2 behind.
        assert_eq!(batch.staleness_histogram(4), vec![2, 3, 1]);

        let bad = |runs: Vec<crate::records::VersionRun>| {
            let mut s = a.clone();
            s.policy_versions = runs;
            Batch::new(&[s], &Config::tiny(), 0, Path::new("s.jsonl"), 1e-6)
                .unwrap_err()
                .to_string()
        };
        let e = bad(vec![run(1, 3)]);
        assert!(
            e.contains("s.jsonl") && e.contains("policy_versions: run 0 covers policy tokens 1..4"),
            "{e}"
        );
        assert!(bad(vec![run(0, 2), run(4, 3)]).contains("run 1 covers policy tokens 4..4"));
        assert!(bad(vec![run(0, 1)]).contains("version 1 is older than the trajectory's policy_version 2"));
    }
}
