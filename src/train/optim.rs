//! AdamW (decoupled weight decay, PyTorch's update order) with no decay on 1-d parameters (norm
//! scales, biases), learning-rate warmup then constant or cosine decay. [`AdamW`] is the step
//! counter (`trainer_state.json`); [`Moments`] is the full state of some parameters
//! (`exp_avg.<param>`, `exp_avg_sq.<param>` and `master.<param>` in fp32), the storage of a
//! parameter group that is not sharded ([`super::groups`]; where it goes on disk:
//! [`super::state`]), so the next `train-step` continues exactly.
//!
//! Written by hand rather than with `tch::nn::Optimizer` because that type does not expose its
//! moment buffers, and resuming bit-exactly needs them.
//!
//! **Master weights.** A parameter narrower than fp32 (a bf16 checkpoint) gets an fp32 master copy:
//! AdamW updates the master and the parameter is then copied from it. Without it an update of
//! about `lr` (1e-6) is below bf16's spacing near typical weights (~1.2e-4 at 0.02) and rounds
//! away for almost every element, so a bf16 run would pass every gate and learn nothing. The
//! masters are saved with the moments (`master.<param>`, fp32) so a resumed run continues
//! bit-exactly; a checkpoint without them (a fresh download) starts them from its weights.
//!
//! A parameter computed in fp32 but stored narrower (`--dtype float32` on a bf16 checkpoint) gets
//! a master too ([`AdamW::stored`]): each saved checkpoint rounds the weights to bf16, so without
//! one the next train-step would start from the rounded weights and lose the update all the same.
//! The parameter is set to its master rounded to the stored dtype, so the trainer computes with
//! the weights the checkpoint, and so the rollout engine, holds.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::TrainError;

/// Learning-rate schedule after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    Constant,
    Cosine,
}

/// AdamW hyper-parameters and schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub schedule: Schedule,
    /// Optimizer steps over which cosine decays to `min_lr`.
    pub total_steps: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-6,
            min_lr: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            total_steps: 1000,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    /// Learning rate of optimizer step `k` (0-based).
    pub fn lr_at(&self, k: u64) -> f64 {
        if k < self.warmup_steps {
            return self.lr * (k + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let progress = ((k - self.warmup_steps) as f64 / span).min(1.0);
                self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// The step counter and what every parameter group's update reads (the groups' moments live in
/// their storage: [`Moments`], or [`super::zero::ZeroAdamW`] under ZeRO-1).
#[derive(Debug, Default)]
pub struct AdamW {
    /// Optimizer steps taken so far (over all invocations).
    pub steps: u64,
    /// The stored dtype of each parameter the checkpoint holds narrower than fp32 while the
    /// trainer computes it in fp32; set by the trainer before each step (not saved).
    pub(crate) stored: BTreeMap<String, Kind>,
    /// Tests only: update bf16 parameters in place, without masters (the behaviour before
    /// them), so a test can show what the masters change. Not reachable from the CLI.
    #[doc(hidden)]
    pub test_only_no_masters: bool,
}

/// Full (unsharded) AdamW state of some parameters: the moments and fp32 masters of each, by
/// parameter name.
#[derive(Debug, Default)]
pub struct Moments {
    exp_avg: BTreeMap<String, Tensor>,
    exp_avg_sq: BTreeMap<String, Tensor>,
    /// fp32 master copies of the parameters narrower than fp32 (see the module header).
    master: BTreeMap<String, Tensor>,
}

/// One AdamW update of fp32 values `pf` with gradient `g`, moments `m`/`v` updated in place
/// (PyTorch's order: decay, moments, bias-corrected step). Elementwise, so ZeRO applies it to any
/// slice of a parameter and gets the same numbers.
#[expect(clippy::too_many_arguments, reason = "the update's inputs, all of them")]
pub(crate) fn adamw_update(
    mut pf: Tensor,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    decay: bool,
    lr: f64,
    (bc1, bc2): (f64, f64),
    cfg: &AdamWConfig,
) -> Tensor {
    if cfg.weight_decay > 0.0 && decay {
        pf *= 1.0 - lr * cfg.weight_decay;
    }
    let _ = m.lerp_(g, 1.0 - cfg.beta1);
    let _ = v.g_mul_scalar_(cfg.beta2).g_add_(&(g * g * (1.0 - cfg.beta2)));
    let denom = v.sqrt() / bc2.sqrt() + cfg.eps;
    pf - (&*m / denom) * (lr / bc1)
}

/// `trainer_state.json`.
#[derive(Debug, Serialize, Deserialize)]
struct TrainerState {
    optimizer_steps: u64,
}

const COUNTER_FILE: &str = "trainer_state.json";

/// One update's learning rate and bias corrections (1 − β₁ᵗ, 1 − β₂ᵗ), shared by every group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepScale {
    pub lr: f64,
    pub bc: (f64, f64),
}

impl AdamW {
    /// Counts one optimizer step; returns its lr and bias corrections.
    pub(crate) fn advance(&mut self, cfg: &AdamWConfig) -> StepScale {
        let lr = cfg.lr_at(self.steps);
        self.steps += 1;
        let t = self.steps as i32;
        StepScale {
            lr,
            bc: (1.0 - cfg.beta1.powi(t), 1.0 - cfg.beta2.powi(t)),
        }
    }

    /// Writes the step counter into checkpoint directory `dir`.
    pub fn save_counter(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(COUNTER_FILE);
        let state = TrainerState {
            optimizer_steps: self.steps,
        };
        let text = serde_json::to_string_pretty(&state).expect("invariant: state serializes");
        std::fs::write(&path, text + "\n").map_err(|e| TrainError::OptimizerState {
            path,
            msg: e.to_string(),
        })
    }

    /// Reads the step counter saved in `dir`; a checkpoint without one (e.g. a base model)
    /// starts at 0.
    pub fn load(dir: &Path) -> Result<Self, TrainError> {
        let counter = dir.join(COUNTER_FILE);
        if !counter.is_file() {
            return Ok(AdamW::default());
        }
        let bad = |msg: String| TrainError::OptimizerState {
            path: counter.clone(),
            msg,
        };
        let text = std::fs::read_to_string(&counter).map_err(|e| bad(e.to_string()))?;
        let state: TrainerState = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        Ok(AdamW {
            steps: state.optimizer_steps,
            ..AdamW::default()
        })
    }

    /// Whether `name`'s update goes through an fp32 master (narrower than fp32, or stored so).
    pub(crate) fn keeps_master(&self, name: &str, p: &Tensor) -> bool {
        (p.kind() != Kind::Float || self.stored.contains_key(name)) && !self.test_only_no_masters
    }
}

impl Moments {
    /// One process's whole update: the gradients stored on `params`, one step counted on `opt`;
    /// returns the lr used.
    pub fn step(&mut self, opt: &mut AdamW, cfg: &AdamWConfig, params: &[(String, Tensor)]) -> f64 {
        let grads: Vec<Option<Tensor>> = params
            .iter()
            .map(|(_, p)| Some(p.grad()).filter(Tensor::defined))
            .collect();
        self.step_grads(opt, cfg, params, &grads)
    }

    /// [`Moments::step`] with `grads[i]` for `params[i]` (`None`: the parameter got no gradient
    /// and is left alone, moments included).
    pub fn step_grads(
        &mut self,
        opt: &mut AdamW,
        cfg: &AdamWConfig,
        params: &[(String, Tensor)],
        grads: &[Option<Tensor>],
    ) -> f64 {
        let at = opt.advance(cfg);
        self.update(opt, cfg, params, grads, None, at);
        at.lr
    }

    /// Applies one update with `grads[i]` for `params[i]`, each gradient upcast to fp32 and then
    /// multiplied by `scale` (the clipping factor) one tensor at a time: a bf16 gradient is
    /// clipped in fp32 without an fp32 copy of every gradient alive at once.
    pub(crate) fn update(
        &mut self,
        opt: &AdamW,
        cfg: &AdamWConfig,
        params: &[(String, Tensor)],
        grads: &[Option<Tensor>],
        scale: Option<f64>,
        at: StepScale,
    ) {
        let _guard = tch::no_grad_guard();
        for ((name, p), g) in params.iter().zip(grads) {
            let Some(g) = g else { continue };
            let mut g = g.to_kind(Kind::Float);
            if let Some(scale) = scale {
                g *= scale;
            }
            let m = self.exp_avg.entry(name.clone()).or_insert_with(|| g.zeros_like());
            let v = self
                .exp_avg_sq
                .entry(name.clone())
                .or_insert_with(|| g.zeros_like());
            let narrow = opt.keeps_master(name, p);
            let base = match self.master.get(name) {
                Some(master) if narrow => master.shallow_clone(),
                _ => p.to_kind(Kind::Float),
            };
            let new = adamw_update(base, &g, m, v, p.dim() > 1, at.lr, at.bc, cfg);
            let mut p = p.shallow_clone();
            match opt.stored.get(name).filter(|_| narrow) {
                Some(&kind) => p.copy_(&new.to_kind(kind).to_kind(p.kind())),
                None => p.copy_(&new.to_kind(p.kind())),
            };
            if narrow {
                self.master.insert(name.clone(), new);
            }
        }
    }

    /// The moments of `name`, when it has any (ZeRO re-shards them).
    pub(crate) fn moments(&self, name: &str) -> Option<(&Tensor, &Tensor)> {
        Some((self.exp_avg.get(name)?, self.exp_avg_sq.get(name)?))
    }

    /// The fp32 master copy of `name`, when it has one (ZeRO re-shards it).
    pub(crate) fn master(&self, name: &str) -> Option<&Tensor> {
        self.master.get(name)
    }

    /// Bytes of the moments and master weights of the parameters `pick` selects.
    pub fn state_bytes_where(&self, pick: impl Fn(&str) -> bool) -> u64 {
        self.exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .chain(&self.master)
            .filter(|(n, _)| pick(n))
            .map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }

    /// Refuses state whose shape is not its parameter's (read from `path`).
    pub(crate) fn check_shapes(&self, params: &[(String, Tensor)], path: &Path) -> Result<(), TrainError> {
        for (name, p) in params {
            for (what, t) in [
                ("exp_avg", self.exp_avg.get(name)),
                ("exp_avg_sq", self.exp_avg_sq.get(name)),
                ("master", self.master.get(name)),
            ] {
                if let Some(t) = t.filter(|t| t.size() != p.size()) {
                    return Err(TrainError::OptimizerState {
                        path: path.to_path_buf(),
                        msg: format!(
                            "`{what}.{name}` has shape {:?}, the parameter {:?} (another model?)",
                            t.size(),
                            p.size()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Writes the state to `path` (`exp_avg.<param>`, `exp_avg_sq.<param>`, `master.<param>`).
    pub(crate) fn write(&self, path: &Path) -> Result<(), TrainError> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (prefix, map) in [
            ("exp_avg", &self.exp_avg),
            ("exp_avg_sq", &self.exp_avg_sq),
            ("master", &self.master),
        ] {
            for (name, t) in map {
                tensors.push((format!("{prefix}.{name}"), t.to_device(tch::Device::Cpu)));
            }
        }
        Tensor::write_safetensors(&tensors, path).map_err(|e| TrainError::OptimizerState {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })
    }

    /// Adds the state saved in `path` by [`Moments::write`], keeping of each tensor what `keep`
    /// returns for (parameter name, tensor) (`None` drops it).
    pub(crate) fn read(
        &mut self,
        path: &Path,
        device: tch::Device,
        keep: impl Fn(&str, Tensor) -> Option<Tensor>,
    ) -> Result<(), TrainError> {
        let bad = |msg: String| TrainError::OptimizerState {
            path: path.to_path_buf(),
            msg,
        };
        for (name, t) in Tensor::read_safetensors(path).map_err(|e| bad(e.to_string()))? {
            let (map, param) = if let Some(p) = name.strip_prefix("exp_avg_sq.") {
                (&mut self.exp_avg_sq, p)
            } else if let Some(p) = name.strip_prefix("exp_avg.") {
                (&mut self.exp_avg, p)
            } else if let Some(p) = name.strip_prefix("master.") {
                (&mut self.master, p)
            } else {
                return Err(bad(format!("unexpected tensor `{name}`")));
            };
            if let Some(t) = keep(param, t) {
                map.insert(param.to_string(), t.to_device(device));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let c = AdamWConfig {
            lr: 1.0,
            min_lr: 0.1,
            warmup_steps: 4,
            schedule: Schedule::Cosine,
            total_steps: 14,
            ..AdamWConfig::default()
        };
        assert_eq!(c.lr_at(0), 0.25);
        assert_eq!(c.lr_at(3), 1.0);
        assert!((c.lr_at(4) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(9) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(14) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(100) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn matches_pytorch_adamw_on_a_hand_example() {
        // torch.optim.AdamW([p], lr=0.1, weight_decay=0.5) on p=[1.0, -2.0] (2-d so it decays),
        // grad [0.5, 0.25], two steps: p = [0.75249..., -1.70249...] computed by hand below.
        let cfg = AdamWConfig {
            lr: 0.1,
            weight_decay: 0.5,
            ..AdamWConfig::default()
        };
        let p = Tensor::from_slice(&[1.0f32, -2.0])
            .reshape([1, 2])
            .set_requires_grad(true);
        let (mut opt, mut state) = (AdamW::default(), Moments::default());
        for _ in 0..2 {
            let mut q = p.shallow_clone();
            q.zero_grad();
            (&p * Tensor::from_slice(&[0.5f32, 0.25]).reshape([1, 2]))
                .sum(Kind::Float)
                .backward();
            state.step(&mut opt, &cfg, &[("w".into(), p.shallow_clone())]);
        }
        // Each Adam step with a constant gradient moves by lr·(m̂/(√v̂+eps)) ≈ lr; decay first.
        let mut want = [1.0f64, -2.0];
        for _ in 0..2 {
            for w in want.iter_mut() {
                *w *= 1.0 - 0.1 * 0.5;
                *w -= 0.1;
            }
        }
        let got = Vec::<f32>::try_from(p.detach().reshape([-1])).unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn bf16_parameters_learn_like_fp32_through_fp32_masters() {
        // Regression: the update used to be computed in fp32 and rounded back into the bf16
        // parameter each step, so at lr 1e-6 about 98% of the steps vanished (bf16's spacing near
        // 0.02 is ~1.2e-4). With masters, the bf16 weights are the fp32 run's, rounded.
        tch::manual_seed(7);
        let init = (Tensor::randn([64, 64], (Kind::Float, tch::Device::Cpu)) * 0.02)
            .to_kind(Kind::BFloat16)
            .to_kind(Kind::Float);
        let grad = Tensor::randn([64, 64], (Kind::Float, tch::Device::Cpu))
            .to_kind(Kind::BFloat16)
            .to_kind(Kind::Float);
        let cfg = AdamWConfig {
            lr: 1e-6,
            ..AdamWConfig::default()
        };
        let p32 = init.copy();
        let p16 = init.to_kind(Kind::BFloat16);
        let (mut c32, mut c16) = (AdamW::default(), AdamW::default());
        let (mut o32, mut o16) = (Moments::default(), Moments::default());
        for _ in 0..50 {
            o32.step_grads(
                &mut c32,
                &cfg,
                &[("w".into(), p32.shallow_clone())],
                &[Some(grad.copy())],
            );
            let g16 = grad.to_kind(Kind::BFloat16);
            o16.step_grads(&mut c16, &cfg, &[("w".into(), p16.shallow_clone())], &[Some(g16)]);
        }
        let want = p32.to_kind(Kind::BFloat16);
        assert!(
            p16.equal(&want),
            "bf16 weights differ from the fp32 run's, rounded"
        );
        let moved = p16
            .ne_tensor(&init.to_kind(Kind::BFloat16))
            .to_kind(Kind::Float)
            .mean(Kind::Float);
        let moved = moved.double_value(&[]);
        assert!(
            moved > 0.2,
            "only {moved:.3} of the bf16 weights moved in 50 steps"
        );
        assert!(
            o16.master("w").unwrap().equal(&p32),
            "the master is the fp32 run's weight"
        );
    }
}
