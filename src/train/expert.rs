//! Expert parallelism in the trainer (`--expert-parallel E`): loading this rank's experts, and
//! keeping the ranks of an expert-parallel group in step: every rank takes part in every token
//! exchange, so the passes run in rounds agreed before any of them ([`Trainer::rounds`]), and a
//! rank whose micro-batches ran out runs idle passes. The gradient sync and the optimizer state
//! are the parameter groups' ([`super::groups`]): non-expert gradients summed over the whole world
//! as in data parallelism, expert gradients only over the ranks holding the same experts (the
//! expert data-parallel group). Each token's contribution reaches its expert's gradient on the
//! owner rank exactly once, so with the same per-token coefficients (normalised over the whole
//! batch) the sums equal one process's.

use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::settings::Settings;
use super::trainer::Trainer;
use super::TrainError;
use crate::c10d::{ExpertGroups, ProcessGroup, ReduceOp};
use crate::model::{ExpertComm, ExpertShard, Model};

/// The groups of expert parallelism a trainer runs in.
#[derive(Debug)]
pub struct ExpertParallel {
    /// The expert-parallel group (also attached to every MoE layer).
    pub comm: Arc<ExpertComm>,
    /// The ranks holding the same experts as this one.
    pub expert_dp: ProcessGroup,
}

impl ExpertParallel {
    /// Size of the expert-parallel group.
    pub fn size(&self) -> usize {
        self.comm.group.world_size()
    }
}

impl Trainer {
    /// [`Trainer::load`] holding only this rank's experts of `groups.ep` (each MoE layer's
    /// experts split over its ranks).
    pub fn load_expert_parallel(
        dir: &Path,
        device: Device,
        kind: Option<Kind>,
        groups: ExpertGroups,
    ) -> Result<Self, TrainError> {
        let shard = ExpertShard {
            rank: groups.ep.rank(),
            size: groups.ep.world_size(),
        };
        let mut model = Model::load_shard(dir, device, kind, shard)?;
        let comm = Arc::new(ExpertComm::new(Arc::new(groups.ep)));
        model.lm.attach_expert_comm(comm.clone());
        let mut t = Trainer::load_model(model, dir)?;
        t.expert = Some(ExpertParallel {
            comm,
            expert_dp: groups.expert_dp,
        });
        Ok(t)
    }

    /// This rank's place in expert parallelism: (expert-parallel rank, size).
    pub(super) fn expert_rank(&self) -> Option<(usize, usize)> {
        self.expert.as_ref().map(|e| (e.comm.group.rank(), e.size()))
    }

    /// The first error of an expert exchange since the last check.
    pub(super) fn expert_error(&self) -> Option<TrainError> {
        let ep = self.expert.as_ref()?;
        if let Some(e) = ep.comm.take_error() {
            return Some(e.into());
        }
        ep.comm.group.poisoned().map(|msg| TrainError::Output {
            path: "expert-parallel group".into(),
            msg: format!("a collective failed: {msg}"),
        })
    }

    /// Maps a torch error of a forward or backward to the exchange error behind it, if any.
    pub(super) fn torch_or_expert(&self, e: tch::TchError) -> TrainError {
        self.expert_error().unwrap_or(TrainError::Torch(e))
    }

    /// Fails when an exchange of the pass just run failed.
    pub(super) fn check_exchanges(&self) -> Result<(), TrainError> {
        self.expert_error().map_or(Ok(()), Err)
    }

    /// A pass's micro-batches as the rounds every rank of its exchange group runs together:
    /// this rank's in order, then `None` (an idle pass, [`Trainer::idle_round`]) until it has as
    /// many as the busiest rank. Agreed on before any of them runs; without expert parallelism
    /// the micro-batches as they are.
    pub(super) fn rounds<T>(&self, mine: Vec<T>) -> Result<Vec<Option<T>>, TrainError> {
        let n = match &self.expert {
            None => mine.len(),
            Some(ep) => {
                let t = Tensor::from_slice(&[mine.len() as f64]).to_device(ep.comm.group.device());
                ep.comm
                    .group
                    .all_reduce(&t, ReduceOp::Max, "micro-batches per rank")?;
                t.double_value(&[0]) as usize
            }
        };
        let mut rounds: Vec<Option<T>> = mine.into_iter().map(Some).collect();
        rounds.resize_with(n.max(rounds.len()), || None);
        Ok(rounds)
    }

    /// One idle pass (see [`crate::model::CausalLm::expert_idle_pass`]): this rank's part in the
    /// exchanges of a round it has no micro-batch for (`grad`: forward and backward).
    pub(super) fn idle_round(&self, grad: bool, s: &Settings) -> Result<(), TrainError> {
        if self.expert.is_none() {
            return Ok(());
        }
        self.model
            .lm
            .expert_idle_pass(grad, s.activation_checkpointing)
            .map_err(|e| self.torch_or_expert(e))?;
        self.check_exchanges()
    }
}
