//! Parameter groups: the trainer's parallelism as data.
//!
//! A step's parameters fall into groups. Each group knows which parameters it holds, the process
//! group that sums their gradients, and its optimizer storage: [`Storage::Full`] (every rank of
//! the reduction group holds the whole state) or [`Storage::Sharded`] (ZeRO-1: each holds 1/N,
//! masters included). Without expert parallelism there is one group of all parameters, reduced
//! over the world. Under `--expert-parallel E` there are two on every rank: the dense parameters
//! (reduced over the world) and this rank's experts (reduced over the ranks holding the same
//! experts, [`crate::c10d::ExpertGroups::expert_dp`]).
//!
//! Why this shape: the update, the gradient norm, saving, loading and the memory figures each
//! loop over the groups, so they are written once. Before, every parallelism axis was an
//! `Option` on the trainer, and each combination (ZeRO, experts, experts with ZeRO) had its own
//! update, save and load branch; master weights would have doubled them again. A new axis (tensor
//! or context parallelism) adds a [`Members`] kind with its reduction group and norm scope, not a
//! branch in the trainer. `train/plan.rs` describes memory in the same terms.
//!
//! The global gradient norm sums each group's local Σg² over the ranks that together cover the
//! group once ([`Members::norm_scope`]): nobody (a whole reduced gradient on every rank), the
//! expert-parallel group (each rank's reduced experts), or the world (ZeRO chunks, which are
//! disjoint over the reduction group, and under expert parallelism over the world).

use tch::Tensor;

use super::optim::{AdamW, AdamWConfig, Moments};
use super::shard::{all_reduce_grads, copy_bytes, defined_anywhere, sum_scalars, sum_squares};
use super::zero::ZeroAdamW;
use super::TrainError;
use crate::c10d::ProcessGroup;

/// True for a routed expert's parameter (per-expert or fused).
pub fn is_expert_param(name: &str) -> bool {
    name.contains(".mlp.experts.")
}

/// Which parameters a group holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Members {
    /// Every parameter (no expert parallelism).
    All,
    /// Everything but the routed experts (under expert parallelism).
    Dense,
    /// The routed experts of expert-parallel rank `rank` of `size`.
    Experts { rank: usize, size: usize },
}

/// Which process group a quantity is summed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This rank's value is already the total.
    Own,
    ExpertParallel,
    World,
}

impl Members {
    /// The groups of a run, in the order every rank updates them (collectives follow it).
    pub fn of_run(expert: Option<(usize, usize)>) -> Vec<Members> {
        match expert {
            None => vec![Members::All],
            Some((rank, size)) => vec![Members::Dense, Members::Experts { rank, size }],
        }
    }

    /// The group's name on disk (`super::state`).
    pub fn name(&self) -> String {
        match self {
            Members::All => "all".into(),
            Members::Dense => "dense".into(),
            Members::Experts { rank, size } => format!("experts-{:05}-of-{size:05}", rank + 1),
        }
    }

    /// Whether the parameter called `name` belongs to this group.
    pub fn holds(&self, name: &str) -> bool {
        match self {
            Members::All => true,
            Members::Dense => !is_expert_param(name),
            Members::Experts { .. } => is_expert_param(name),
        }
    }

    /// The parameters of `params` this group holds, in order.
    pub fn select(&self, params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        params
            .iter()
            .filter(|(n, _)| self.holds(n))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect()
    }

    /// Summed over the world, or over the ranks holding the same experts.
    pub fn reduced_over_world(&self) -> bool {
        !matches!(self, Members::Experts { .. })
    }

    /// Over which ranks this group's local Σg² adds up to its whole (see the module header).
    pub fn norm_scope(&self, sharded: bool) -> Scope {
        match (self, sharded) {
            (_, true) => Scope::World,
            (Members::Experts { .. }, false) => Scope::ExpertParallel,
            _ => Scope::Own,
        }
    }
}

/// The process groups a step runs on.
pub struct Comms<'a> {
    pub world: &'a ProcessGroup,
    /// Under expert parallelism: the expert-parallel group and the ranks holding the same experts.
    pub expert: Option<(&'a ProcessGroup, &'a ProcessGroup)>,
}

impl<'a> Comms<'a> {
    /// The process group that sums `m`'s gradients.
    pub fn reducer(&self, m: Members) -> &'a ProcessGroup {
        match (m.reduced_over_world(), self.expert) {
            (false, Some((_, dp))) => dp,
            _ => self.world,
        }
    }

    fn scope(&self, scope: Scope) -> Option<&'a ProcessGroup> {
        match scope {
            Scope::Own => None,
            Scope::ExpertParallel => Some(self.expert.map_or(self.world, |(ep, _)| ep)),
            Scope::World => Some(self.world),
        }
    }
}

/// A group's optimizer state.
#[derive(Debug)]
pub enum Storage {
    Full(Moments),
    /// ZeRO-1 over the group's reduction group.
    Sharded(ZeroAdamW),
}

/// One parameter group with its state.
#[derive(Debug)]
pub struct ParamGroup {
    pub members: Members,
    pub storage: Storage,
}

/// A group's gradients summed over its reduction group.
enum Reduced {
    /// Whole tensors (`None`: no rank has one).
    Full(Vec<Option<Tensor>>),
    /// This rank's fp32 chunk of each bucket.
    Chunks(Vec<Tensor>),
}

/// What one optimizer update did.
pub struct Update {
    /// The gradient norm before clipping.
    pub norm: f64,
    pub lr: f64,
    /// Bytes of the fp32 reduced-gradient copies alive at the update ([`copy_bytes`]; full
    /// storage on many ranks). ZeRO-1's reduced chunks are its own state's.
    pub copy_bytes: u64,
}

/// Knobs of the update the settings decide.
pub struct UpdateKnobs<'a> {
    pub optim: &'a AdamWConfig,
    pub max_grad_norm: f64,
    pub bucket_elems: i64,
}

/// One optimizer update of every group: gradients summed over each group's reduction group (in
/// fp32), clipped by the global norm, AdamW (counted once on `opt`).
pub fn update(
    groups: &mut [ParamGroup],
    params: &[(String, Tensor)],
    opt: &mut AdamW,
    k: &UpdateKnobs,
    comms: &Comms,
) -> Result<Update, TrainError> {
    let _g = tch::no_grad_guard();
    let mut work = Vec::with_capacity(groups.len());
    let mut local = [0.0f64; 3];
    for g in groups.iter() {
        let mine = g.members.select(params);
        let pg = comms.reducer(g.members);
        let defined = defined_anywhere(pg, &mine)?;
        let reduced = match &g.storage {
            Storage::Full(_) => Reduced::Full(all_reduce_grads(pg, &mine, &defined, k.bucket_elems)?),
            Storage::Sharded(z) => Reduced::Chunks(z.reduce_scatter(&mine, &defined, pg)?),
        };
        let sq = match &reduced {
            Reduced::Full(grads) => sum_squares(grads.iter().flatten()),
            Reduced::Chunks(chunks) => sum_squares(chunks),
        };
        let scope = g.members.norm_scope(matches!(g.storage, Storage::Sharded(_)));
        local[scope as usize] += sq;
        work.push((mine, defined, reduced));
    }
    let mut norm_sq = local[Scope::Own as usize];
    for scope in [Scope::ExpertParallel, Scope::World] {
        let used = groups
            .iter()
            .any(|g| g.members.norm_scope(matches!(g.storage, Storage::Sharded(_))) == scope);
        if let (true, Some(pg)) = (used, comms.scope(scope)) {
            norm_sq += sum_scalars(pg, &[local[scope as usize]], "gradient norm")?[0];
        }
    }
    let norm = norm_sq.sqrt();
    if !norm.is_finite() {
        return Err(TrainError::NonFinite {
            what: "gradient norm",
            value: norm,
        });
    }
    let scale = (k.max_grad_norm > 0.0 && norm > k.max_grad_norm).then(|| k.max_grad_norm / (norm + 1e-6));
    let at = opt.advance(k.optim);
    let mut copies = 0;
    for (g, (mine, defined, reduced)) in groups.iter_mut().zip(work) {
        match (&mut g.storage, reduced) {
            (Storage::Full(m), Reduced::Full(grads)) => {
                m.update(opt, k.optim, &mine, &grads, scale, at);
                copies += copy_bytes(&mine, &grads);
            }
            (Storage::Sharded(z), Reduced::Chunks(mut chunks)) => {
                if let Some(scale) = scale {
                    for c in &mut chunks {
                        let _ = c.g_mul_scalar_(scale);
                    }
                }
                z.step(&mine, &defined, &chunks, (at, k.optim), comms.reducer(g.members))?;
            }
            _ => unreachable!("invariant: reduced as stored"),
        }
    }
    Ok(Update {
        norm,
        lr: at.lr,
        copy_bytes: copies,
    })
}

impl ParamGroup {
    /// Bytes of optimizer state this rank holds for the parameters `pick` selects.
    pub fn state_bytes_where(&self, pick: impl Fn(&str) -> bool) -> u64 {
        match &self.storage {
            Storage::Full(m) => m.state_bytes_where(pick),
            Storage::Sharded(z) => z.state_bytes_where(pick),
        }
    }

    /// Bytes of the reduced gradient chunks this rank holds during an update (sharded only).
    pub fn chunk_bytes(&self) -> u64 {
        match &self.storage {
            Storage::Full(_) => 0,
            Storage::Sharded(z) => z.grad_bytes(),
        }
    }
}
