//! AdamW (decoupled weight decay, PyTorch's update order) with no decay on 1-d parameters (norm
//! scales, biases), learning-rate warmup then constant or cosine decay, and its state saved beside
//! a checkpoint (`optimizer.safetensors`: `exp_avg.<param>` and `exp_avg_sq.<param>` in fp32, plus
//! the step counter in `trainer_state.json`) so the next `train-step` continues exactly.
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

/// Moment buffers and step counter.
#[derive(Debug, Default)]
pub struct AdamW {
    /// Optimizer steps taken so far (over all invocations).
    pub steps: u64,
    exp_avg: BTreeMap<String, Tensor>,
    exp_avg_sq: BTreeMap<String, Tensor>,
    /// fp32 master copies of the parameters narrower than fp32 (see the module header).
    master: BTreeMap<String, Tensor>,
    /// The stored dtype of each parameter the checkpoint holds narrower than fp32 while the
    /// trainer computes it in fp32; set by the trainer before each step (not saved).
    pub(crate) stored: BTreeMap<String, Kind>,
    /// Tests only: update bf16 parameters in place, without masters (the behaviour before
    /// them), so a test can show what the masters change. Not reachable from the CLI.
    #[doc(hidden)]
    pub test_only_no_masters: bool,
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

const STATE_FILE: &str = "optimizer.safetensors";
const COUNTER_FILE: &str = "trainer_state.json";

impl AdamW {
    /// Applies one update with the gradients currently stored on `params`; returns the lr used.
    pub fn step(&mut self, cfg: &AdamWConfig, params: &[(String, Tensor)]) -> f64 {
        let grads: Vec<Option<Tensor>> = params
            .iter()
            .map(|(_, p)| Some(p.grad()).filter(Tensor::defined))
            .collect();
        self.step_grads(cfg, params, &grads)
    }

    /// Applies one update with `grads[i]` for `params[i]` (`None`: the parameter got no gradient
    /// and is left alone, moments included); returns the lr used.
    pub fn step_grads(
        &mut self,
        cfg: &AdamWConfig,
        params: &[(String, Tensor)],
        grads: &[Option<Tensor>],
    ) -> f64 {
        self.step_grads_scaled(cfg, params, grads, None)
    }

    /// [`AdamW::step_grads`] with each gradient upcast to fp32 and then multiplied by `scale`
    /// (the clipping factor) one tensor at a time: a bf16 gradient is clipped in fp32 without an
    /// fp32 copy of every gradient alive at once.
    pub fn step_grads_scaled(
        &mut self,
        cfg: &AdamWConfig,
        params: &[(String, Tensor)],
        grads: &[Option<Tensor>],
        scale: Option<f64>,
    ) -> f64 {
        let (lr, bc) = self.advance(cfg);
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
            let stored = self.stored.get(name).copied();
            let narrow = (p.kind() != Kind::Float || stored.is_some()) && !self.test_only_no_masters;
            let base = match self.master.get(name) {
                Some(master) if narrow => master.shallow_clone(),
                _ => p.to_kind(Kind::Float),
            };
            let new = adamw_update(base, &g, m, v, p.dim() > 1, lr, bc, cfg);
            let mut p = p.shallow_clone();
            match stored.filter(|_| narrow) {
                Some(kind) => p.copy_(&new.to_kind(kind).to_kind(p.kind())),
                None => p.copy_(&new.to_kind(p.kind())),
            };
            if narrow {
                self.master.insert(name.clone(), new);
            }
        }
        lr
    }

    /// Counts one optimizer step; returns its lr and bias corrections (1 − β₁ᵗ, 1 − β₂ᵗ).
    pub(crate) fn advance(&mut self, cfg: &AdamWConfig) -> (f64, (f64, f64)) {
        let lr = cfg.lr_at(self.steps);
        self.steps += 1;
        let t = self.steps as i32;
        (lr, (1.0 - cfg.beta1.powi(t), 1.0 - cfg.beta2.powi(t)))
    }

    /// The full moments of `name`, when it has any (ZeRO re-shards them).
    pub(crate) fn moments(&self, name: &str) -> Option<(&Tensor, &Tensor)> {
        Some((self.exp_avg.get(name)?, self.exp_avg_sq.get(name)?))
    }

    /// The fp32 master copy of `name`, when it has one (ZeRO re-shards it).
    pub(crate) fn master(&self, name: &str) -> Option<&Tensor> {
        self.master.get(name)
    }

    /// True when moments were loaded or accumulated.
    pub(crate) fn has_moments(&self) -> bool {
        !self.exp_avg.is_empty()
    }

    /// Writes only the step counter (the moments are sharded, see [`super::zero`]).
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

    /// Bytes of the moments and master weights held.
    pub fn state_bytes(&self) -> u64 {
        self.exp_avg
            .values()
            .chain(self.exp_avg_sq.values())
            .chain(self.master.values())
            .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }

    /// Bytes of the moments of the parameters `pick` selects.
    pub fn state_bytes_where(&self, pick: impl Fn(&str) -> bool) -> u64 {
        self.exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .chain(&self.master)
            .filter(|(n, _)| pick(n))
            .map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }

    /// Drops the moments (after ZeRO took its chunks of them).
    pub(crate) fn clear_moments(&mut self) {
        self.exp_avg.clear();
        self.exp_avg_sq.clear();
        self.master.clear();
    }

    /// Writes the state into checkpoint directory `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        self.write_moments(&dir.join(STATE_FILE), |_| true)?;
        self.save_counter(dir)
    }

    /// The moments of the parameters `pick` selects, written to `path`.
    fn write_moments(&self, path: &Path, pick: impl Fn(&str) -> bool) -> Result<(), TrainError> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (prefix, map) in [
            ("exp_avg", &self.exp_avg),
            ("exp_avg_sq", &self.exp_avg_sq),
            ("master", &self.master),
        ] {
            for (name, t) in map.iter().filter(|(n, _)| pick(n)) {
                tensors.push((format!("{prefix}.{name}"), t.to_device(tch::Device::Cpu)));
            }
        }
        Tensor::write_safetensors(&tensors, path).map_err(|e| TrainError::OptimizerState {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })
    }

    /// Expert parallelism: the moments of the parameters `split` selects into `file` (this
    /// rank's), and with `lead` the others into `optimizer.safetensors` plus the step counter.
    pub fn save_filtered(
        &self,
        dir: &Path,
        file: &Path,
        lead: bool,
        split: impl Fn(&str) -> bool,
    ) -> Result<(), TrainError> {
        self.write_moments(file, &split)?;
        if lead {
            self.write_moments(&dir.join(STATE_FILE), |n| !split(n))?;
            self.save_counter(dir)?;
        }
        Ok(())
    }

    /// Keeps, for each parameter with moments, what `keep` returns for each of its moments
    /// (`None` drops the parameter's moments).
    pub(crate) fn retain_moments(&mut self, keep: impl Fn(&str, &Tensor) -> Option<Tensor>) {
        for map in [&mut self.exp_avg, &mut self.exp_avg_sq, &mut self.master] {
            let old = std::mem::take(map);
            for (name, t) in old {
                if let Some(t) = keep(&name, &t) {
                    map.insert(name, t);
                }
            }
        }
    }

    /// Adds the moments saved in `path` (another file of the same state).
    pub(crate) fn load_more(&mut self, path: &Path, device: tch::Device) -> Result<(), TrainError> {
        self.read_moments(path, device)
    }

    fn read_moments(&mut self, path: &Path, device: tch::Device) -> Result<(), TrainError> {
        let bad = |msg: String| TrainError::OptimizerState {
            path: path.to_path_buf(),
            msg,
        };
        for (name, t) in Tensor::read_safetensors(path).map_err(|e| bad(e.to_string()))? {
            let t = t.to_device(device);
            if let Some(p) = name.strip_prefix("exp_avg_sq.") {
                self.exp_avg_sq.insert(p.to_string(), t);
            } else if let Some(p) = name.strip_prefix("exp_avg.") {
                self.exp_avg.insert(p.to_string(), t);
            } else if let Some(p) = name.strip_prefix("master.") {
                self.master.insert(p.to_string(), t);
            } else {
                return Err(bad(format!("unexpected tensor `{name}`")));
            }
        }
        Ok(())
    }

    /// Reads the state saved in `dir`; a checkpoint without one (e.g. a base model) starts fresh.
    pub fn load(dir: &Path, device: tch::Device) -> Result<Self, TrainError> {
        let counter = dir.join(COUNTER_FILE);
        if !counter.is_file() {
            return Ok(AdamW::default());
        }
        let bad = |path: &Path, msg: String| TrainError::OptimizerState {
            path: path.to_path_buf(),
            msg,
        };
        let text = std::fs::read_to_string(&counter).map_err(|e| bad(&counter, e.to_string()))?;
        let state: TrainerState = serde_json::from_str(&text).map_err(|e| bad(&counter, e.to_string()))?;
        let path = dir.join(STATE_FILE);
        let mut opt = AdamW {
            steps: state.optimizer_steps,
            ..AdamW::default()
        };
        if !path.exists() && super::zero::saved_layout(dir)?.is_some() {
            // Moments sharded by --zero 1: the trainer loads this rank's chunks.
            return Ok(opt);
        }
        opt.read_moments(&path, device)?;
        Ok(opt)
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
        let mut opt = AdamW::default();
        for _ in 0..2 {
            let mut q = p.shallow_clone();
            q.zero_grad();
            (&p * Tensor::from_slice(&[0.5f32, 0.25]).reshape([1, 2]))
                .sum(Kind::Float)
                .backward();
            opt.step(&cfg, &[("w".into(), p.shallow_clone())]);
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
        let (mut o32, mut o16) = (AdamW::default(), AdamW::default());
        for _ in 0..50 {
            o32.step_grads(&cfg, &[("w".into(), p32.shallow_clone())], &[Some(grad.copy())]);
            let g16 = grad.to_kind(Kind::BFloat16);
            o16.step_grads(&cfg, &[("w".into(), p16.shallow_clone())], &[Some(g16)]);
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
