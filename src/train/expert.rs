//! Expert parallelism in the trainer (`--expert-parallel E`): loading this rank's experts,
//! keeping the ranks of an expert-parallel group in step (every rank takes part in every
//! exchange, so a rank whose micro-batches ran out runs idle passes), and the gradient sync:
//! non-expert gradients summed over the whole world as in data parallelism, expert gradients only
//! over the ranks holding the same experts (the expert data-parallel group). Each token's
//! contribution reaches its expert's gradient on the owner rank exactly once, so with the same
//! per-token coefficients (normalised over the whole batch) the sums equal one process's.
//!
//! ZeRO-1 with expert parallelism is refused (`train-step` says so): its buckets are laid out
//! over the world, and expert parameters differ between the ranks of a group.

use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::optim::AdamW;
use super::shard::{all_reduce_grads, defined_anywhere, sum_scalars, sum_squares};
use super::trainer::{Settings, Trainer};
use super::TrainError;
use crate::dist::{ExpertGroups, ProcessGroup, ReduceOp};
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

/// True for a routed expert's parameter (per-expert or fused).
pub fn is_expert_param(name: &str) -> bool {
    name.contains(".mlp.experts.")
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
        let mut t = Trainer::load_model(model, dir, device)?;
        load_expert_moments(&mut t.opt, dir, device, shard.rank, shard.size)?;
        t.expert = Some(ExpertParallel {
            comm,
            expert_dp: groups.expert_dp,
        });
        t.restrict_moments(shard);
        Ok(t)
    }

    /// Keeps the loaded moments of this rank's parameters only, a fused tensor's moments cut to
    /// this rank's rows (a checkpoint saved by one process holds every expert's).
    fn restrict_moments(&mut self, shard: ExpertShard) {
        let vars = self.model.named_variables();
        let n = self.model.cfg().num_experts;
        self.opt.retain_moments(|name, m| {
            let var = vars.iter().find(|(v, _)| v == name)?;
            if m.size() == var.1.size() {
                return Some(m.shallow_clone());
            }
            let r = shard.range(n);
            (m.size().first() == Some(&n)).then(|| m.narrow(0, r.start, r.end - r.start).copy())
        });
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
    pub(super) fn check_expert(&self) -> Result<(), TrainError> {
        self.expert_error().map_or(Ok(()), Err)
    }

    /// How many micro-batches the busiest rank of this rank's expert-parallel group has
    /// (`mine` without expert parallelism). Agreed on before any of them runs: a rank that has
    /// fewer then runs idle passes until it took part in as many exchanges
    /// ([`Trainer::expert_catch_up`]).
    pub(super) fn expert_rounds(&self, mine: usize) -> Result<usize, TrainError> {
        let Some(ep) = &self.expert else {
            return Ok(mine);
        };
        let t = Tensor::from_slice(&[mine as f64]);
        ep.comm
            .group
            .all_reduce(&t, ReduceOp::Max, "micro-batches per rank")?;
        Ok(t.double_value(&[0]) as usize)
    }

    /// After this rank ran `mine` of the group's `rounds` micro-batches: the idle passes that
    /// make up the difference (`grad`: forward and backward).
    pub(super) fn expert_catch_up(
        &self,
        mine: usize,
        rounds: usize,
        grad: bool,
        s: &Settings,
    ) -> Result<(), TrainError> {
        for _ in mine..rounds {
            self.expert_idle(grad, s)?;
        }
        Ok(())
    }

    /// One idle pass (see [`crate::model::CausalLm::expert_idle_pass`]).
    pub(super) fn expert_idle(&self, grad: bool, s: &Settings) -> Result<(), TrainError> {
        if self.expert.is_none() {
            return Ok(());
        }
        self.model
            .lm
            .expert_idle_pass(grad, s.activation_checkpointing)
            .map_err(|e| self.torch_or_expert(e))?;
        self.check_expert()
    }

    /// The gradient sync, clip and AdamW of expert parallelism; returns (norm, lr).
    pub(super) fn sync_and_update_ep(
        &mut self,
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<(f64, f64), TrainError> {
        let ep = self
            .expert
            .as_ref()
            .expect("invariant: called under expert parallelism");
        let (experts, dense): (Vec<_>, Vec<_>) = params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .partition(|(n, _)| is_expert_param(n));
        let _g = tch::no_grad_guard();
        let dense_defined = defined_anywhere(pg, &dense)?;
        let expert_defined = defined_anywhere(&ep.expert_dp, &experts)?;
        let mut dense_grads = all_reduce_grads(pg, &dense, &dense_defined, s.bucket_elems)?;
        let mut expert_grads = all_reduce_grads(&ep.expert_dp, &experts, &expert_defined, s.bucket_elems)?;
        // ‖g‖² = the dense part (the same on every rank) + every expert's once: the sum of the
        // local experts' squares over the expert-parallel group.
        let local = sum_squares(expert_grads.iter().flatten());
        let experts_sq = sum_scalars(&ep.comm.group, &[local], "expert gradient norm")?[0];
        let norm = (sum_squares(dense_grads.iter().flatten()) + experts_sq).sqrt();
        if !norm.is_finite() {
            return Err(TrainError::NonFinite {
                what: "gradient norm",
                value: norm,
            });
        }
        if s.max_grad_norm > 0.0 && norm > s.max_grad_norm {
            let scale = s.max_grad_norm / (norm + 1e-6);
            for g in dense_grads.iter_mut().chain(expert_grads.iter_mut()).flatten() {
                let _ = g.g_mul_scalar_(scale);
            }
        }
        let mut all = dense;
        all.extend(experts);
        let mut grads = dense_grads;
        grads.extend(expert_grads);
        Ok((norm, self.opt.step_grads(&s.optim, &all, &grads)))
    }

    /// Writes this rank's expert moments (`optimizer-ep-RRRRR-of-EEEEE.safetensors`; rank 0
    /// writes the others in `optimizer.safetensors` and the step counter).
    pub(super) fn save_expert_optimizer(&self, dir: &Path, lead: bool) -> Result<(), TrainError> {
        let ep = self
            .expert
            .as_ref()
            .expect("invariant: called under expert parallelism");
        let (r, n) = (ep.comm.group.rank(), ep.size());
        let file = dir.join(expert_optimizer_file(r, n));
        self.opt.save_filtered(dir, &file, lead, is_expert_param)
    }
}

/// The optimizer file of expert-parallel rank `r` of `n`.
pub fn expert_optimizer_file(r: usize, n: usize) -> String {
    format!("optimizer-ep-{:05}-of-{:05}.safetensors", r + 1, n)
}

/// The expert-parallel size a checkpoint's optimizer state was saved at (1 when not split).
pub fn saved_expert_parallel(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix("optimizer-ep-")?.strip_suffix(".safetensors")?;
            rest.split_once("-of-")?.1.parse().ok()
        })
        .max()
        .unwrap_or(1)
}

/// Loads the moments of an optimizer saved under expert parallelism of size `n` into `opt`
/// (`optimizer.safetensors` holds the rest): every rank file at n = 1, this rank's at n = `size`.
pub fn load_expert_moments(
    opt: &mut AdamW,
    dir: &Path,
    device: Device,
    rank: usize,
    size: usize,
) -> Result<(), TrainError> {
    let saved = saved_expert_parallel(dir);
    if saved <= 1 {
        return Ok(());
    }
    if saved != size {
        return Err(TrainError::OptimizerState {
            path: dir.join(expert_optimizer_file(0, saved)),
            msg: format!(
                "expert moments saved at --expert-parallel {saved}, this run has {size}: resume at \
                 --expert-parallel {saved}"
            ),
        });
    }
    opt.load_more(&dir.join(expert_optimizer_file(rank, size)), device)
}
