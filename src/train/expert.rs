//! Expert parallelism in the trainer (`--expert-parallel E`): loading this rank's experts,
//! keeping the ranks of an expert-parallel group in step (every rank takes part in every
//! exchange, so a rank whose micro-batches ran out runs idle passes), and the gradient sync:
//! non-expert gradients summed over the whole world as in data parallelism, expert gradients only
//! over the ranks holding the same experts (the expert data-parallel group). Each token's
//! contribution reaches its expert's gradient on the owner rank exactly once, so with the same
//! per-token coefficients (normalised over the whole batch) the sums equal one process's.
//!
//! With ZeRO-1 the dense gradients are reduce-scattered over the world and the expert gradients
//! over the expert data-parallel group, each rank updating its chunk of both
//! ([`super::zero`]); the global norm is one all-reduce of every rank's chunk squares.

use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::optim::AdamW;
use super::shard::{all_reduce_grads, copy_bytes, defined_anywhere, sum_scalars, sum_squares};
use super::trainer::{Settings, Trainer};
use super::update::Update;
use super::zero::{self, ZeroAdamW};
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
    /// Under ZeRO-1: this rank's share of its experts' moments, sharded over `expert_dp` (the
    /// trainer's own ZeRO state then holds the dense parameters'), laid out at the first step.
    pub zero: Option<ZeroAdamW>,
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
            zero: None,
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
        let t = Tensor::from_slice(&[mine as f64]).to_device(ep.comm.group.device());
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

    /// The gradient sync, clip and AdamW of expert parallelism.
    pub(super) fn sync_and_update_ep(
        &mut self,
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<Update, TrainError> {
        let ep = self
            .expert
            .as_mut()
            .expect("invariant: called under expert parallelism");
        let (experts, dense) = split_experts(params);
        let _g = tch::no_grad_guard();
        let dense_defined = defined_anywhere(pg, &dense)?;
        let expert_defined = defined_anywhere(&ep.expert_dp, &experts)?;
        let clip = |norm: f64| {
            if !norm.is_finite() {
                return Err(TrainError::NonFinite {
                    what: "gradient norm",
                    value: norm,
                });
            }
            Ok((s.max_grad_norm > 0.0 && norm > s.max_grad_norm).then(|| s.max_grad_norm / (norm + 1e-6)))
        };
        if let (Some(dz), Some(ez)) = (&mut self.zero, &mut ep.zero) {
            let mut chunks = dz.reduce_scatter(&dense, &dense_defined, pg)?;
            let mut expert_chunks = ez.reduce_scatter(&experts, &expert_defined, &ep.expert_dp)?;
            // Every rank's chunks are disjoint pieces of the summed gradients and together
            // cover each dense parameter once and each expert once: one all-reduce gives ‖g‖².
            let local = sum_squares(&chunks) + sum_squares(&expert_chunks);
            let norm = sum_scalars(pg, &[local], "gradient norm")?[0].sqrt();
            if let Some(scale) = clip(norm)? {
                for c in chunks.iter_mut().chain(&mut expert_chunks) {
                    let _ = c.g_mul_scalar_(scale);
                }
            }
            let (lr, bc) = self.opt.advance(&s.optim);
            dz.step(&dense, &dense_defined, &chunks, lr, bc, &s.optim, pg)?;
            ez.step(
                &experts,
                &expert_defined,
                &expert_chunks,
                lr,
                bc,
                &s.optim,
                &ep.expert_dp,
            )?;
            return Ok(Update {
                norm,
                lr,
                copy_bytes: 0,
            });
        }
        let dense_grads = all_reduce_grads(pg, &dense, &dense_defined, s.bucket_elems)?;
        let expert_grads = all_reduce_grads(&ep.expert_dp, &experts, &expert_defined, s.bucket_elems)?;
        // ‖g‖² = the dense part (the same on every rank) + every expert's once: the sum of the
        // local experts' squares over the expert-parallel group.
        let local = sum_squares(expert_grads.iter().flatten());
        let experts_sq = sum_scalars(&ep.comm.group, &[local], "expert gradient norm")?[0];
        let norm = (sum_squares(dense_grads.iter().flatten()) + experts_sq).sqrt();
        let scale = clip(norm)?;
        let mut all = dense;
        all.extend(experts);
        let mut grads = dense_grads;
        grads.extend(expert_grads);
        let lr = self.opt.step_grads_scaled(&s.optim, &all, &grads, scale);
        let copy_bytes = copy_bytes(&all, &grads);
        Ok(Update { norm, lr, copy_bytes })
    }

    /// Under ZeRO-1: lays out the dense parameters' state over the world and this rank's
    /// experts' over its expert data-parallel group, loading them from the checkpoint when it
    /// was saved so, else re-sharding the full moments it had.
    pub(super) fn prepare_zero_ep(
        &mut self,
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<(), TrainError> {
        let ep = self
            .expert
            .as_mut()
            .expect("invariant: called under expert parallelism");
        let (experts, dense) = split_experts(params);
        let e = ep.size();
        let stored = &self.opt.stored;
        let mut dz = ZeroAdamW::new(&dense, stored, pg, s.bucket_elems).with_expert_parallel(e);
        let mut ez = ZeroAdamW::new(&experts, stored, &ep.expert_dp, s.bucket_elems).with_expert_parallel(e);
        match &self.source {
            Some(dir) if self.zero_saved.is_some() => {
                dz.load(dir, pg.rank())?;
                let folder = zero::expert_folder(dir, ep.comm.group.rank(), e);
                ez.load_from(&folder, ep.expert_dp.rank())?;
            }
            _ if self.opt.has_moments() => {
                dz.reshard_from(&self.opt, &dense, pg.rank());
                ez.reshard_from(&self.opt, &experts, ep.expert_dp.rank());
                self.opt.clear_moments();
            }
            _ => {}
        }
        self.zero = Some(dz);
        ep.zero = Some(ez);
        Ok(())
    }

    /// Writes this rank's expert moments (`optimizer-ep-RRRRR-of-EEEEE.safetensors`; rank 0
    /// writes the others in `optimizer.safetensors` and the step counter). Under ZeRO-1 the
    /// moments are in the ZeRO shards and rank 0 writes the counter only.
    pub(super) fn save_expert_optimizer(&self, dir: &Path, lead: bool) -> Result<(), TrainError> {
        let ep = self
            .expert
            .as_ref()
            .expect("invariant: called under expert parallelism");
        if ep.zero.is_some() {
            return if lead { self.opt.save_counter(dir) } else { Ok(()) };
        }
        let (r, n) = (ep.comm.group.rank(), ep.size());
        let file = dir.join(expert_optimizer_file(r, n));
        self.opt.save_filtered(dir, &file, lead, is_expert_param)
    }

    /// Every rank's share of its experts' ZeRO-1 state, into [`zero::expert_folder`] of `dir`.
    pub(super) fn save_expert_zero(&self, dir: &Path) -> Result<(), TrainError> {
        match &self.expert {
            Some(ExpertParallel {
                zero: Some(z),
                comm,
                expert_dp,
            }) => z.save_in(
                &zero::expert_folder(dir, comm.group.rank(), comm.group.world_size()),
                expert_dp.rank(),
            ),
            _ => Ok(()),
        }
    }
}

/// Named parameters, in the order the optimizer lays them out.
type Params = Vec<(String, Tensor)>;

/// `params` split into (routed experts, everything else), each in the order given.
fn split_experts(params: &[(String, Tensor)]) -> (Params, Params) {
    params
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .partition(|(n, _)| is_expert_param(n))
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
