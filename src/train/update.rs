//! The optimizer side of a step, written once for every parallelism: the parameter groups laid
//! out (and their saved state restored, or refused) before any compute, one update over all of
//! them ([`super::groups::update`]: gradients reduced and clipped in fp32 whatever the
//! parameters' dtype, since a bf16 sum over ranks or a bf16 clip would round each gradient to 8
//! significant bits before the fp32 master sees it), and the memory the step's state takes.

use tch::{Kind, Tensor};

use super::groups::{self, Comms, Members, ParamGroup, Storage, Update, UpdateKnobs};
use super::optim::Moments;
use super::settings::Settings;
use super::shard::sum_scalars;
use super::trainer::Trainer;
use super::zero::ZeroAdamW;
use super::TrainError;
use crate::c10d::ProcessGroup;
use crate::records::StepMetrics;

impl Trainer {
    /// The process groups a step of `pg` runs on.
    fn comms<'a>(expert: &'a Option<super::expert::ExpertParallel>, pg: &'a ProcessGroup) -> Comms<'a> {
        Comms {
            world: pg,
            expert: expert.as_ref().map(|e| (&*e.comm.group, &e.expert_dp)),
        }
    }

    /// Sums the gradients of every group over its reduction group, clips them by the global norm
    /// and applies AdamW.
    pub(super) fn sync_and_update(
        &mut self,
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<Update, TrainError> {
        let knobs = UpdateKnobs {
            optim: &s.optim,
            max_grad_norm: s.max_grad_norm,
            bucket_elems: s.bucket_elems,
        };
        let comms = Self::comms(&self.expert, pg);
        groups::update(&mut self.groups, params, &mut self.opt, &knobs, &comms)
    }

    /// Lays out the parameter groups at the first step and restores the checkpoint's optimizer
    /// state into them, or refuses state this run cannot continue — before any compute.
    /// `vars`: every parameter (frozen ones too); `params`: the trained ones.
    pub(super) fn prepare_optimizer(
        &mut self,
        vars: &[(String, Tensor)],
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<(), TrainError> {
        // fp32 compute of weights stored narrower keeps masters too (see super::optim).
        self.opt.stored = params
            .iter()
            .map(|(name, p)| (name, p.kind(), self.model.stored_kind(name)))
            .filter(|&(_, compute, stored)| compute == Kind::Float && stored != Kind::Float)
            .map(|(name, _, stored)| (name.clone(), stored))
            .collect();
        if !self.groups.is_empty() {
            return Ok(());
        }
        let expert = self.expert_rank();
        let run = (pg.world_size(), expert.map_or(1, |e| e.1));
        let num_experts = self.model.cfg().num_experts;
        let comms = Self::comms(&self.expert, pg);
        let mut laid_out = Vec::new();
        let mut restored = Ok(());
        for members in Members::of_run(expert) {
            let mine = members.select(params);
            let reducer = comms.reducer(members);
            let storage = if s.zero {
                let z = ZeroAdamW::new(&mine, &self.opt.stored, reducer, s.bucket_elems);
                Storage::Sharded(z.with_expert_parallel(run.1))
            } else {
                Storage::Full(Moments::default())
            };
            let mut g = ParamGroup { members, storage };
            if restored.is_ok() {
                restored = self
                    .saved
                    .restore(&mut g, vars, &mine, reducer.rank(), run, num_experts);
            }
            laid_out.push(g);
        }
        // A file only one rank reads (its slice) can fail on that rank alone: every rank learns
        // it here and stops, instead of the others waiting in the first collective of the pass.
        let failed = sum_scalars(
            pg,
            &[f64::from(u8::from(restored.is_err()))],
            "optimizer state restored",
        )?[0];
        restored?;
        if failed > 0.0 {
            return Err(TrainError::OptimizerState {
                path: self.source.clone().unwrap_or_default(),
                msg: format!(
                    "{failed} other rank(s) could not restore their optimizer state (see their errors)"
                ),
            });
        }
        self.groups = laid_out;
        Ok(())
    }

    /// Records the world and this rank's optimizer-state and gradient bytes in `m.extra`:
    /// `gradient_bytes` counts the parameters' own `.grad` (full size on every rank: the backward
    /// fills them before any collective runs) plus the reduced gradients the update held beside
    /// them: the chunks sharded groups keep, and for full groups on many ranks `copy_bytes` (the
    /// largest of the step's updates: the fp32 sums of narrower gradients).
    pub(super) fn memory_metrics(
        &self,
        m: &mut StepMetrics,
        params: &[(String, Tensor)],
        pg: &ProcessGroup,
        copy_bytes: u64,
    ) {
        let local: u64 = params
            .iter()
            .map(|(_, p)| (p.numel() * p.kind().elt_size_in_bytes()) as u64)
            .sum();
        let state: u64 = self.groups.iter().map(|g| g.state_bytes_where(|_| true)).sum();
        let chunks: u64 = self.groups.iter().map(ParamGroup::chunk_bytes).sum();
        let sharded = self
            .groups
            .iter()
            .any(|g| matches!(g.storage, Storage::Sharded(_)));
        for (k, v) in [
            ("world_size", pg.world_size() as u64),
            ("zero", u64::from(sharded)),
            ("optimizer_state_bytes", state),
            ("gradient_bytes", local + chunks + copy_bytes),
        ] {
            m.extra.insert(k.into(), v.into());
        }
        if self.model.lm.moe_layers() == 0 {
            return;
        }
        // This rank's share of the routed experts (what expert parallelism divides), measured on
        // the live tensors: weights, their `.grad`, and their AdamW state.
        let is_expert = super::groups::is_expert_param;
        let (mut weights, mut grads) = (0u64, 0u64);
        for (_, p) in params.iter().filter(|(n, _)| is_expert(n)) {
            weights += (p.numel() * p.kind().elt_size_in_bytes()) as u64;
            let g = p.grad();
            if g.defined() {
                grads += (g.numel() * g.kind().elt_size_in_bytes()) as u64;
            }
        }
        let ep = self.expert_rank().map_or(1, |e| e.1) as u64;
        let expert_state: u64 = self.groups.iter().map(|g| g.state_bytes_where(is_expert)).sum();
        for (k, v) in [
            ("expert_parallel", ep),
            ("expert_weight_bytes", weights),
            ("expert_gradient_bytes", grads),
            ("expert_optimizer_state_bytes", expert_state),
        ] {
            m.extra.insert(k.into(), v.into());
        }
    }
}

/// The parameters an update moves: all of `vars` but those `freeze` matches. A pattern that
/// matches no parameter (a typo) or every parameter is an error rather than a silent no-op.
pub(super) fn trainable(
    vars: &[(String, Tensor)],
    freeze: Option<&str>,
) -> Result<Vec<(String, Tensor)>, TrainError> {
    let re = freeze
        .map(|pattern| {
            regex::Regex::new(pattern).map_err(|e| TrainError::Freeze {
                pattern: pattern.to_string(),
                msg: e.to_string(),
            })
        })
        .transpose()?;
    let (mut params, mut frozen) = (Vec::new(), Vec::new());
    for (name, p) in vars {
        if re.as_ref().is_some_and(|re| re.is_match(name)) {
            frozen.push(name.as_str());
        } else {
            params.push((name.clone(), p.shallow_clone()));
        }
    }
    let Some(pattern) = freeze else {
        return Ok(params);
    };
    let err = |msg: String| TrainError::Freeze {
        pattern: pattern.to_string(),
        msg,
    };
    if frozen.is_empty() {
        let names: Vec<&str> = vars.iter().take(3).map(|(n, _)| n.as_str()).collect();
        return Err(err(format!(
            "matches no parameter of the model (names look like {})",
            names.join(", ")
        )));
    }
    if params.is_empty() {
        return Err(err("matches every parameter: nothing would train".into()));
    }
    tracing::info!(
        frozen = frozen.len(),
        trainable = params.len(),
        "frozen: {}",
        frozen.join(", ")
    );
    Ok(params)
}
