//! Expert parallelism (`train-step --expert-parallel E`) of the MoE layers: which experts a rank
//! holds, and how its tokens reach the ranks that hold their experts and come back.
//!
//! The E ranks of an expert-parallel group hold one slice each of every MoE layer's experts:
//! rank r holds experts r·n/E … (r+1)·n/E − 1 (n/E = `per_rank`). Routing and gates are
//! computed on the token's own rank from its current router logits (replayed or not: R3 is
//! unchanged); the (token, slot) rows, sorted by expert as in the one-rank dispatch, are then
//!
//! 1. counted per expert and the counts exchanged (all_to_all of `[E × per_rank]` int64),
//! 2. sent to their owners (a differentiable all_to_all; rows for rank j are contiguous because
//!    the order is by expert, and owners are contiguous expert ranges),
//! 3. regrouped on the owner by local expert (across source ranks), computed, and put back in
//!    arrival order ([`Regroup`]),
//! 4. returned by the reverse all_to_all, weighted by the gates on the token's rank and summed
//!    with one `index_add` in the sorted order — the order the one-rank path adds them in.
//!
//! The backward of both exchanges is the reverse exchange, so every rank's backward takes part
//! in as many all_to_alls as its forward. A rank with no tokens (or whose micro-batches ran out,
//! see [`super::CausalLm::expert_idle_pass`]) still takes part with zero rows.
//!
//! A collective that fails inside a forward cannot return an error through the model's
//! (infallible) forward: [`ExpertComm`] records the first error, later exchanges are skipped
//! (zeros) and the trainer reads the error after the pass ([`ExpertComm::take_error`]).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use crate::c10d::{DistError, ProcessGroup};

/// Which slice of every MoE layer's experts this rank holds: slice `rank` of `size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShard {
    pub rank: usize,
    pub size: usize,
}

impl Default for ExpertShard {
    fn default() -> Self {
        ExpertShard { rank: 0, size: 1 }
    }
}

impl ExpertShard {
    /// Experts per rank (`n` must divide by `size`).
    pub fn per_rank(&self, n: i64) -> i64 {
        n / self.size as i64
    }

    /// Global ids of the experts this rank holds.
    pub fn range(&self, n: i64) -> Range<i64> {
        let k = self.per_rank(n);
        let start = self.rank as i64 * k;
        start..start + k
    }

    /// True when every expert is here (no exchange needed).
    pub fn is_whole(&self) -> bool {
        self.size <= 1
    }
}

/// The expert-parallel group shared by every MoE layer of a model, and the first error one of
/// its exchanges met during a forward.
#[derive(Debug)]
pub struct ExpertComm {
    pub group: Arc<ProcessGroup>,
    error: Mutex<Option<DistError>>,
}

impl ExpertComm {
    pub fn new(group: Arc<ProcessGroup>) -> Self {
        ExpertComm {
            group,
            error: Mutex::new(None),
        }
    }

    /// The first error of a forward's exchange, or of the group (e.g. in a backward).
    pub fn take_error(&self) -> Option<DistError> {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        e.take()
    }

    fn failed(&self) -> bool {
        self.error.lock().map(|e| e.is_some()).unwrap_or(true)
    }

    fn record(&self, e: DistError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    /// Exchanges the per-expert row counts: `send[e]` rows of this rank go to expert e (global
    /// ids); returns `[source rank][local expert]` counts of the rows this rank receives.
    /// `None` after a failure (recorded).
    /// The counts travel on `device` (NCCL exchanges device tensors only).
    pub(super) fn counts(&self, send: &[i64], per_rank: usize, device: tch::Device) -> Option<Vec<i64>> {
        if self.failed() {
            return None;
        }
        let n = self.group.world_size();
        let input = Tensor::from_slice(send).to_device(device);
        let out = Tensor::zeros([(n * per_rank) as i64], (Kind::Int64, device));
        match self
            .group
            .all_to_all(&out, &input, "MoE expert dispatch: token counts")
        {
            Ok(()) => {
                Some(Vec::<i64>::try_from(&out.to_device(tch::Device::Cpu)).expect("invariant: 1-d int64"))
            }
            Err(e) => {
                self.record(e);
                None
            }
        }
    }

    /// The differentiable exchange of rows (`what`: dispatch or combine); zeros of the expected
    /// shape after a failure (recorded), so the forward can finish and the caller report it.
    pub(super) fn exchange(&self, x: &Tensor, out_splits: &[i64], in_splits: &[i64], what: &str) -> Tensor {
        let rows: i64 = out_splits.iter().sum();
        let zeros = || {
            let mut size = x.size();
            size[0] = rows;
            Tensor::zeros(size.as_slice(), (x.kind(), x.device()))
        };
        if self.failed() {
            return zeros();
        }
        match self.group.all_to_all_autograd(x, out_splits, in_splits, what) {
            Ok(t) => t,
            Err(e) => {
                self.record(e);
                zeros()
            }
        }
    }
}

/// Rows per destination rank of a sorted dispatch: the sums of `counts` (per global expert)
/// over each rank's slice of experts.
pub fn rows_per_rank(counts: &[i64], per_rank: usize) -> Vec<i64> {
    counts.chunks(per_rank.max(1)).map(|c| c.iter().sum()).collect()
}

/// How the rows an owner received (`[source rank][local expert]` blocks, in arrival order) are
/// regrouped by local expert, so that each expert runs once over all its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regroup {
    /// Arrival-order row indices, by local expert then source rank.
    pub order: Vec<i64>,
    /// Rows of each local expert in `order`.
    pub per_expert: Vec<i64>,
    /// Where each arrival-order row sits in `order` (the inverse permutation).
    pub inverse: Vec<i64>,
    /// Rows received from each source rank.
    pub per_source: Vec<i64>,
}

impl Regroup {
    /// From the received counts `recv[s · per_rank + j]` (source s, local expert j).
    pub fn new(recv: &[i64], per_rank: usize) -> Self {
        let sources = recv.len() / per_rank.max(1);
        let mut start = vec![0i64; recv.len()];
        let mut at = 0;
        for (i, &c) in recv.iter().enumerate() {
            start[i] = at;
            at += c;
        }
        let mut order = Vec::with_capacity(at as usize);
        let mut per_expert = vec![0i64; per_rank];
        for (j, n) in per_expert.iter_mut().enumerate() {
            for s in 0..sources {
                let b = s * per_rank + j;
                order.extend(start[b]..start[b] + recv[b]);
                *n += recv[b];
            }
        }
        let mut inverse = vec![0i64; order.len()];
        for (pos, &row) in order.iter().enumerate() {
            inverse[row as usize] = pos as i64;
        }
        Regroup {
            order,
            per_expert,
            inverse,
            per_source: rows_per_rank(recv, per_rank),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_experts_into_contiguous_slices() {
        let s = ExpertShard { rank: 1, size: 4 };
        assert_eq!(s.range(8), 2..4);
        assert_eq!(s.per_rank(128), 32);
        assert!(!s.is_whole() && ExpertShard::default().is_whole());
        assert_eq!(ExpertShard::default().range(8), 0..8);
    }

    #[test]
    fn rows_per_rank_sums_each_owners_experts() {
        // 8 experts over 2 ranks: experts 0-3 on rank 0, 4-7 on rank 1.
        assert_eq!(rows_per_rank(&[1, 0, 2, 0, 0, 0, 0, 3], 4), vec![3, 3]);
        // Every token on the other rank's experts.
        assert_eq!(rows_per_rank(&[0, 0, 0, 0, 5, 1, 0, 0], 4), vec![0, 6]);
        assert_eq!(rows_per_rank(&[0; 8], 4), vec![0, 0]);
    }

    #[test]
    fn regroup_orders_rows_by_local_expert_then_source() {
        // 2 sources × 2 local experts: source 0 sent 2 rows for expert 0 and 1 for expert 1
        // (arrival rows 0,1 | 2); source 1 sent 0 for expert 0 and 2 for expert 1 (rows 3,4).
        let r = Regroup::new(&[2, 1, 0, 2], 2);
        assert_eq!(r.order, vec![0, 1, 2, 3, 4]);
        assert_eq!(r.per_expert, vec![2, 3]);
        assert_eq!(r.per_source, vec![3, 2]);
        // Source 0: 1 row for expert 0, 1 for expert 1; source 1: 2 for expert 0, 0 for 1.
        let r = Regroup::new(&[1, 1, 2, 0], 2);
        assert_eq!(r.order, vec![0, 2, 3, 1]);
        assert_eq!(r.per_expert, vec![3, 1]);
        assert_eq!(r.inverse, vec![0, 3, 1, 2]);
        for (pos, &row) in r.order.iter().enumerate() {
            assert_eq!(r.inverse[row as usize], pos as i64);
        }
        // Nothing received.
        let r = Regroup::new(&[0, 0, 0, 0], 2);
        assert!(r.order.is_empty() && r.inverse.is_empty());
        assert_eq!(r.per_expert, vec![0, 0]);
    }
}
