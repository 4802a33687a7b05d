//! Data parallelism of one step: which whole trajectories this rank computes, and how the ranks'
//! partial results become the whole batch's again.
//!
//! Every rank reads the same samples and builds the same [`Batch`] (advantages over the whole
//! batch), then works on a deterministic, token-balanced shard of whole trajectories (all
//! segments of a trajectory on one rank, so its sequence ratio is one rank's sum). Log-probs come
//! back to every rank by an all-reduce of a flat buffer in which each rank filled only its own
//! sequences (x + 0 = x exactly, so every rank then holds the values one process would have), and
//! gradients are summed by bucketed all-reduce (`--zero 0`) or reduce-scatter
//! ([`super::zero`]). With a world of one, each of these is the identity. The small host-side
//! values (log-probs, counts, flags) travel on the group's device ([`ProcessGroup::device`]).

use tch::{Device, Kind, Tensor};

use super::batch::Batch;
use crate::c10d::{DistError, ProcessGroup, ReduceOp};

/// The sequences of `idx` this rank computes: trajectories go, largest first (ties: lower
/// index), to the rank with the fewest tokens so far (ties: lower rank); order of `idx` is kept.
pub fn shard(batch: &Batch, idx: &[usize], world: usize, rank: usize) -> Vec<usize> {
    if world <= 1 {
        return idx.to_vec();
    }
    let mut tokens = vec![0usize; batch.trajs.len()];
    for &i in idx {
        tokens[batch.seqs[i].traj] += batch.seqs[i].tokens.len();
    }
    let mut trajs: Vec<usize> = (0..batch.trajs.len()).filter(|&t| tokens[t] > 0).collect();
    trajs.sort_by_key(|&t| (std::cmp::Reverse(tokens[t]), t));
    let mut load = vec![0usize; world];
    let mut owner = vec![usize::MAX; batch.trajs.len()];
    for t in trajs {
        let r = (0..world)
            .min_by_key(|&r| (load[r], r))
            .expect("invariant: world ≥ 1");
        load[r] += tokens[t];
        owner[t] = r;
    }
    idx.iter()
        .copied()
        .filter(|&i| owner[batch.seqs[i].traj] == rank)
        .collect()
}

/// Per-sequence values (log-probs of the policy tokens) of the sequences of `idx`, each rank
/// having filled only its own (others empty), combined so every rank holds all of them.
pub fn combine_per_seq(
    pg: &ProcessGroup,
    batch: &Batch,
    idx: &[usize],
    mut values: Vec<Vec<f64>>,
    what: &str,
) -> Result<Vec<Vec<f64>>, DistError> {
    if pg.world_size() <= 1 {
        return Ok(values);
    }
    let total: usize = idx.iter().map(|&i| batch.seqs[i].pred_at.len()).sum();
    let mut flat = vec![0f64; total];
    let mut o = 0;
    for &i in idx {
        let n = batch.seqs[i].pred_at.len();
        if values[i].len() == n {
            flat[o..o + n].copy_from_slice(&values[i]);
        }
        o += n;
    }
    let t = Tensor::from_slice(&flat).to_device(pg.device());
    pg.all_reduce(&t, ReduceOp::Sum, what)?;
    let flat = Vec::<f64>::try_from(&t.to_device(Device::Cpu)).expect("invariant: 1-d f64");
    let mut o = 0;
    for &i in idx {
        let n = batch.seqs[i].pred_at.len();
        values[i] = flat[o..o + n].to_vec();
        o += n;
    }
    Ok(values)
}

/// Sums small per-rank numbers (counts, partial sums) over ranks, in f64.
pub fn sum_scalars(pg: &ProcessGroup, v: &[f64], what: &str) -> Result<Vec<f64>, DistError> {
    let t = Tensor::from_slice(v).to_device(pg.device());
    pg.all_reduce(&t, ReduceOp::Sum, what)?;
    Ok(Vec::<f64>::try_from(&t.to_device(Device::Cpu)).expect("invariant: 1-d f64"))
}

/// For each parameter: does any rank hold a gradient for it? (One process leaves a parameter
/// that got no gradient alone; so must the ranks together.)
pub fn defined_anywhere(pg: &ProcessGroup, params: &[(String, Tensor)]) -> Result<Vec<bool>, DistError> {
    let flags: Vec<f32> = params
        .iter()
        .map(|(_, p)| f32::from(u8::from(p.grad().defined())))
        .collect();
    let t = Tensor::from_slice(&flags).to_device(pg.device());
    pg.all_reduce(&t, ReduceOp::Max, "which parameters have gradients")?;
    Ok(Vec::<f32>::try_from(&t.to_device(Device::Cpu))
        .expect("invariant: 1-d f32")
        .into_iter()
        .map(|f| f > 0.0)
        .collect())
}

/// `--zero 0`: the gradients summed over ranks, all-reduced in fp32 buckets of at most
/// `bucket_elems` elements; `None` where no rank has a gradient. An fp32 parameter's sum lands in
/// its own `.grad` (one bucket's copy alive at a time); a narrower one's (bf16), and that of a
/// parameter this rank has no gradient for, is a fp32 tensor of its own: summing bf16 over ranks
/// would round every partial sum to 8 significant bits (mixed precision reduces in fp32, as
/// Megatron and FSDP do). With one rank the gradients are returned as they are (no copy); the
/// update upcasts them ([`super::optim::AdamW::step_grads_scaled`]).
pub fn all_reduce_grads(
    pg: &ProcessGroup,
    params: &[(String, Tensor)],
    defined: &[bool],
    bucket_elems: i64,
) -> Result<Vec<Option<Tensor>>, DistError> {
    let _g = tch::no_grad_guard();
    let local = |p: &Tensor| Some(p.grad()).filter(Tensor::defined);
    if pg.world_size() <= 1 {
        // Nothing to sum: the gradients as they are, without a copy.
        return Ok(params.iter().map(|(_, p)| local(p)).collect());
    }
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut used = 0i64;
    for (i, (_, p)) in params.iter().enumerate() {
        if !defined[i] {
            continue;
        }
        let n = p.numel() as i64;
        if buckets.is_empty() || used + n > bucket_elems {
            buckets.push(Vec::new());
            used = 0;
        }
        buckets.last_mut().expect("invariant: pushed above").push(i);
        used += n;
    }
    let mut out: Vec<Option<Tensor>> = (0..params.len()).map(|_| None).collect();
    let n_buckets = buckets.len();
    for (bi, b) in buckets.into_iter().enumerate() {
        let parts: Vec<Tensor> = b
            .iter()
            .map(|&i| {
                let p = &params[i].1;
                let g = p.grad();
                if g.defined() {
                    g.to_kind(Kind::Float).reshape([-1])
                } else {
                    Tensor::zeros([p.numel() as i64], (Kind::Float, p.device()))
                }
            })
            .collect();
        let flat = Tensor::cat(&parts, 0);
        pg.all_reduce(
            &flat,
            ReduceOp::Sum,
            &format!("gradient bucket {}/{n_buckets}", bi + 1),
        )?;
        let mut off = 0;
        for &i in &b {
            let p = &params[i].1;
            let n = p.numel() as i64;
            let sum = flat.narrow(0, off, n).view(p.size().as_slice());
            out[i] = Some(match local(p).filter(|g| g.kind() == Kind::Float) {
                Some(mut g) => {
                    g.copy_(&sum);
                    g
                }
                None => sum.copy(),
            });
            off += n;
        }
    }
    Ok(out)
}

/// Bytes of the reduced gradients in `grads` that are not their parameter's own `.grad`: the
/// fp32 sums [`all_reduce_grads`] keeps for a narrower (bf16) parameter, or for one this rank has
/// no gradient for, alive with the `.grad`s until the update ends (`gradient_bytes` counts them).
pub fn copy_bytes(params: &[(String, Tensor)], grads: &[Option<Tensor>]) -> u64 {
    params
        .iter()
        .zip(grads)
        .filter_map(|((_, p), g)| g.as_ref().map(|g| (p.grad(), g)))
        .filter(|(own, g)| !own.defined() || own.data_ptr() != g.data_ptr())
        .map(|(_, g)| (g.numel() * g.kind().elt_size_in_bytes()) as u64)
        .sum()
}

/// Σ g² in f64 over `grads` (whole tensors or this rank's chunks), with one device→host read
/// for all of them: each tensor's sum stays on the device and only their total comes back (a read
/// per tensor was a host synchronisation per parameter: 789 per step on 2 layers).
pub fn sum_squares<'a>(grads: impl IntoIterator<Item = &'a Tensor>) -> f64 {
    let _g = tch::no_grad_guard();
    let sums: Vec<Tensor> = grads
        .into_iter()
        .map(|g| g.to_kind(Kind::Double).pow_tensor_scalar(2).sum(Kind::Double))
        .collect();
    if sums.is_empty() {
        return 0.0;
    }
    Tensor::stack(&sums, 0).sum(Kind::Double).double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::batch::{Seq, Traj};

    #[test]
    fn shards_are_whole_balanced_and_cover_everything() {
        // Trajectory 0 has two segments (10 + 2 tokens), 1 has 8, 2 has 5, 3 has 4.
        let seq = |traj, n| Seq {
            id: String::new(),
            traj,
            tokens: vec![1; n],
            pred_at: vec![],
            rollout_lp: vec![],
            sampled: vec![],
            routing: None,
            versions: vec![],
        };
        let traj = |id: &str| Traj {
            id: id.into(),
            group: ("t".into(), 0),
            reward: 0.0,
            weight: 1.0,
            policy_version: 0,
            advantage: 0.0,
            contributes: true,
        };
        let batch = Batch {
            seqs: vec![seq(0, 10), seq(1, 8), seq(2, 5), seq(0, 2), seq(3, 4)],
            trajs: vec![traj("a"), traj("b"), traj("c"), traj("d")],
            groups: vec![vec![0, 1, 2, 3]],
            zero_variance_groups: 0,
        };
        let all: Vec<usize> = (0..5).collect();
        // 12 → rank 0, 8 → rank 1, 5 → rank 1 (8 < 12), 4 → rank 0 (12 < 13).
        assert_eq!(shard(&batch, &all, 2, 0), vec![0, 3, 4]);
        assert_eq!(shard(&batch, &all, 2, 1), vec![1, 2]);
        assert_eq!(shard(&batch, &all, 1, 0), all);
        // More ranks than trajectories: some ranks get nothing.
        let mut seen: Vec<usize> = (0..6).flat_map(|r| shard(&batch, &all, 6, r)).collect();
        seen.sort();
        assert_eq!(seen, all);
        assert!(shard(&batch, &all, 6, 5).is_empty());
    }
}
