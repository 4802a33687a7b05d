//! The optimizer side of a step on any number of ranks: gradients summed over ranks (bucketed
//! all-reduce, or reduce-scatter under ZeRO-1), clipped by the global norm, AdamW — reduced and
//! clipped in fp32 whatever the parameters' dtype (a bf16 sum over ranks or a bf16 clip would
//! round each gradient to 8 significant bits before the fp32 master sees it); the ZeRO state
//! laid out, loaded or re-sharded before any compute; and the memory the step's state takes.

use tch::{Kind, Tensor};

use super::shard::{all_reduce_grads, copy_bytes, defined_anywhere, sum_scalars, sum_squares};
use super::trainer::{Settings, Trainer};
use super::zero::ZeroAdamW;
use super::TrainError;
use crate::c10d::ProcessGroup;
use crate::records::StepMetrics;

/// What one optimizer update did.
pub(super) struct Update {
    /// The gradient norm before clipping.
    pub norm: f64,
    pub lr: f64,
    /// Bytes of the fp32 reduced-gradient copies alive at the update ([`copy_bytes`]; `--zero 0`
    /// on many ranks). ZeRO-1's reduced chunks are its own state's.
    pub copy_bytes: u64,
}

impl Trainer {
    /// Sums the gradients over ranks (all-reduce, or reduce-scatter under ZeRO), clips them by
    /// the global norm and applies AdamW.
    pub(super) fn sync_and_update(
        &mut self,
        params: &[(String, Tensor)],
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<Update, TrainError> {
        if self.expert.is_some() {
            return self.sync_and_update_ep(params, s, pg);
        }
        let defined = defined_anywhere(pg, params)?;
        let non_finite = |value| TrainError::NonFinite {
            what: "gradient norm",
            value,
        };
        let clip = |norm: f64| {
            (s.max_grad_norm > 0.0 && norm > s.max_grad_norm).then(|| s.max_grad_norm / (norm + 1e-6))
        };
        let _g = tch::no_grad_guard();
        if let Some(zero) = &mut self.zero {
            let mut chunks = zero.reduce_scatter(params, &defined, pg)?;
            let norm = sum_scalars(pg, &[sum_squares(&chunks)], "gradient norm")?[0].sqrt();
            if !norm.is_finite() {
                return Err(non_finite(norm));
            }
            if let Some(scale) = clip(norm) {
                for c in &mut chunks {
                    let _ = c.g_mul_scalar_(scale);
                }
            }
            let (lr, bc) = self.opt.advance(&s.optim);
            zero.step(params, &defined, &chunks, lr, bc, &s.optim, pg)?;
            return Ok(Update {
                norm,
                lr,
                copy_bytes: 0,
            });
        }
        // Summed in fp32; the clip factor is applied in fp32 inside the update.
        let grads = all_reduce_grads(pg, params, &defined, s.bucket_elems)?;
        let norm = sum_squares(grads.iter().flatten()).sqrt();
        if !norm.is_finite() {
            return Err(non_finite(norm));
        }
        let lr = self.opt.step_grads_scaled(&s.optim, params, &grads, clip(norm));
        let copy_bytes = copy_bytes(params, &grads);
        Ok(Update { norm, lr, copy_bytes })
    }

    /// Lays out ZeRO state at the first step (loading or re-sharding saved moments), or refuses
    /// saved state this run cannot continue — before any compute.
    pub(super) fn prepare_optimizer(
        &mut self,
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
        let source = self.source.clone().unwrap_or_default();
        if let (Some(saved), false) = (&self.zero_saved, s.zero) {
            return Err(TrainError::OptimizerState {
                path: source.join(super::zero::DIR),
                msg: format!(
                    "sharded by --zero 1 over {} ranks; resume with --zero 1 at that world size (this run: \
                     --zero 0, {} ranks)",
                    saved.world_size,
                    pg.world_size()
                ),
            });
        }
        if !s.zero || self.zero.is_some() {
            return Ok(());
        }
        if self.expert.is_some() {
            return self.prepare_zero_ep(params, s, pg);
        }
        let mut zero = ZeroAdamW::new(params, &self.opt.stored, pg, s.bucket_elems);
        if self.zero_saved.is_some() {
            zero.load(&source, pg.rank())?;
        } else if self.opt.has_moments() {
            zero.reshard_from(&self.opt, params, pg.rank());
            self.opt.clear_moments();
        }
        self.zero = Some(zero);
        Ok(())
    }

    /// Records the world and this rank's optimizer-state and gradient bytes in `m.extra`:
    /// `gradient_bytes` counts the parameters' own `.grad` (full size on every rank: the backward
    /// fills them before any collective runs) plus the reduced gradients the update held beside
    /// them: under ZeRO-1 the chunks it keeps, under ZeRO-0 on many ranks `copy_bytes` (the
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
        let expert_zero = self.expert.as_ref().and_then(|e| e.zero.as_ref());
        let (state, grads) = match &self.zero {
            Some(z) => {
                let (es, eg) = expert_zero.map_or((0, 0), |e| (e.state_bytes(), e.grad_bytes()));
                (z.state_bytes() + es, local + z.grad_bytes() + eg)
            }
            None => (self.opt.state_bytes(), local + copy_bytes),
        };
        for (k, v) in [
            ("world_size", pg.world_size() as u64),
            ("zero", u64::from(self.zero.is_some())),
            ("optimizer_state_bytes", state),
            ("gradient_bytes", grads),
        ] {
            m.extra.insert(k.into(), v.into());
        }
        if self.model.lm.moe_layers() == 0 {
            return;
        }
        // This rank's share of the routed experts (what expert parallelism divides), measured on
        // the live tensors: weights, their `.grad`, and their AdamW moments.
        let experts = params.iter().filter(|(n, _)| super::expert::is_expert_param(n));
        let (mut weights, mut grads) = (0u64, 0u64);
        for (_, p) in experts {
            weights += (p.numel() * p.kind().elt_size_in_bytes()) as u64;
            let g = p.grad();
            if g.defined() {
                grads += (g.numel() * g.kind().elt_size_in_bytes()) as u64;
            }
        }
        let ep = self.expert.as_ref().map_or(1, |e| e.size()) as u64;
        for (k, v) in [
            ("expert_parallel", ep),
            ("expert_weight_bytes", weights),
            ("expert_gradient_bytes", grads),
            (
                "expert_optimizer_state_bytes",
                expert_zero.map_or_else(
                    || self.opt.state_bytes_where(super::expert::is_expert_param),
                    |z| z.state_bytes(),
                ),
            ),
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
