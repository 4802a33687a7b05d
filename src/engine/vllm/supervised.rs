//! `--backend vllm-serve:CKPT`: a vLLM server that rollout starts, watches, reloads with
//! verification and restarts; and `--backend vllm:URL` with verified reloads.
//!
//! **Supervision.** Every reload loads the new checkpoint in place and checks it
//! ([`super::verify`]): the server's probe log-probs must match the checkpoint's within the
//! tolerance and must have changed across the load. A load that fails or does not verify (wrong
//! weights, or an answer that did not change: the old weights, or a step the check cannot see)
//! restarts the server on the new checkpoint and checks the fresh server against the checkpoint;
//! a server that still does not verify is an error (rollout stops, it never serves unverified
//! weights). A server that died (a crashed engine) is restarted on its checkpoint before the
//! next request; a request in flight when it died is lost (an infra error for its trial).
//!
//! **A server of the user's** (`vllm:URL`) cannot be restarted: a reload that fails or does not
//! verify is an error, and the message says to restart the server on that checkpoint.

use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;

use super::server::{ServeOptions, VllmServer};
use super::verify::Verifier;
use super::VllmBackend;
use crate::engine::{Backend, EngineError, GenerateOutput, GenerateRequest, ReloadReport, Verification};

const NAME: &str = "vllm-serve";

/// A supervised vLLM server behind the [`Backend`] interface.
pub struct SupervisedVllm {
    server: VllmServer,
    client: VllmBackend,
    verifier: Verifier,
    /// Serializes restarts: concurrent requests that find the server dead restart it once.
    restarting: tokio::sync::Mutex<()>,
    /// What the fresh server measured against its checkpoint.
    pub startup: Verification,
}

impl SupervisedVllm {
    /// Starts a server for `checkpoint`, waits for it, and calibrates the reload check on it.
    pub async fn start(
        checkpoint: &Path,
        opts: ServeOptions,
        device: tch::Device,
        tolerance: Option<f64>,
    ) -> Result<Self, EngineError> {
        let server = VllmServer::start(checkpoint, opts).await?;
        let client = VllmBackend::connect(&server.url()).await?;
        let verifier = Verifier::new(device, tolerance);
        let startup = verifier.calibrate(&client, checkpoint).await?;
        tracing::info!(
            "{NAME}: probe of the fresh server: max |Δ log-prob| {:.2e} over {} tokens against the \
             checkpoint, {:.2e} call to call; reloads must stay within {:.2e}",
            startup.max_abs_delta,
            startup.tokens,
            startup.served_noise,
            startup.tolerance
        );
        if !startup.passed {
            return Err(failed(format!(
                "the fresh server's log-probs differ from {}'s by {:.3e}, over the given tolerance \
                 {:.3e}",
                checkpoint.display(),
                startup.max_abs_delta,
                startup.tolerance
            )));
        }
        Ok(SupervisedVllm {
            server,
            client,
            verifier,
            restarting: tokio::sync::Mutex::new(()),
            startup,
        })
    }

    /// The server process (tests check it is gone after rollout).
    pub fn server(&self) -> &VllmServer {
        &self.server
    }

    /// Restarts a dead server on its checkpoint.
    async fn heal(&self) -> Result<(), EngineError> {
        let _one = self.restarting.lock().await;
        if self.server.alive() {
            return Ok(());
        }
        let ckpt = self
            .server
            .checkpoint()
            .ok_or_else(|| failed("the server was never started".into()))?;
        tracing::warn!(
            "{NAME}: the server died; restarting it on {} (the end of its log:\n{})",
            ckpt.display(),
            self.server.log_tail()
        );
        self.server.restart(&ckpt).await
    }

    async fn generate_inner(&self, req: GenerateRequest) -> Result<GenerateOutput, EngineError> {
        if !self.server.alive() {
            self.heal().await?;
        }
        let out = self.client.generate(req).await;
        if out.is_err() && !self.server.alive() {
            // This request is lost (an infra error for its trial); the next ones get a server.
            self.heal().await?;
        }
        out
    }

    async fn reload_inner(&self, dir: PathBuf) -> Result<ReloadReport, EngineError> {
        let start = Instant::now();
        let _one = self.restarting.lock().await;
        let mut rejected = None;
        let why = match load_in_place(&self.client, &self.verifier, &dir).await? {
            InPlace::Checked(v) if v.passed => {
                return Ok(ReloadReport {
                    seconds: start.elapsed().as_secs_f64(),
                    verification: Some(v),
                    ..Default::default()
                });
            }
            InPlace::Checked(v) => {
                let why = v.mismatch(&dir);
                rejected = Some(v);
                why
            }
            InPlace::Failed(e) => e.to_string(),
        };
        tracing::warn!("{NAME}: {why}; restarting the server on {}", dir.display());
        self.server.restart(&dir).await?;
        // A server started on the checkpoint holds it: only the tolerance is left to check.
        let v = self.verifier.check(&self.client, &dir, None).await?;
        if !v.passed {
            return Err(failed(format!(
                "even a fresh server on {} does not verify ({}); not serving it",
                dir.display(),
                v.mismatch(&dir)
            )));
        }
        Ok(ReloadReport {
            seconds: start.elapsed().as_secs_f64(),
            verification: Some(v),
            restarts: 1,
            rejected,
        })
    }
}

/// What an in-place load came to.
enum InPlace {
    /// The server took the load; this is its check.
    Checked(Verification),
    /// The server could not be asked before the load, or the load failed.
    Failed(EngineError),
}

/// Loads `dir` into the server in place and checks it against the server's answer just before.
/// An error is the check's own (e.g. a reference that cannot be read), which a restart would not
/// mend.
async fn load_in_place(
    client: &VllmBackend,
    verifier: &Verifier,
    dir: &Path,
) -> Result<InPlace, EngineError> {
    let loaded = async {
        let before = verifier.served(client).await?;
        client.reload_inner(dir.to_path_buf()).await?;
        Ok::<_, EngineError>(before)
    };
    match loaded.await {
        Ok(before) => Ok(InPlace::Checked(
            verifier.check(client, dir, Some(&before)).await?,
        )),
        Err(e) => Ok(InPlace::Failed(e)),
    }
}

impl Backend for SupervisedVllm {
    fn id(&self) -> String {
        format!("vllm-serve:{}", self.client.base())
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.generate_inner(req).boxed()
    }

    fn context_length(&self) -> Option<usize> {
        self.client.context_length()
    }

    fn processed_logprobs(&self) -> Option<bool> {
        self.client.processed_logprobs()
    }

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<ReloadReport, EngineError>> {
        self.reload_inner(checkpoint_dir.to_path_buf()).boxed()
    }
}

/// `--backend vllm:URL` with verification: a reload that fails or does not verify is an error
/// (the server is the user's; rollout cannot restart it).
pub struct VerifiedVllm {
    pub client: VllmBackend,
    pub verifier: Verifier,
}

impl Backend for VerifiedVllm {
    fn id(&self) -> String {
        self.client.id()
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.client.generate(req)
    }

    fn context_length(&self) -> Option<usize> {
        self.client.context_length()
    }

    fn processed_logprobs(&self) -> Option<bool> {
        self.client.processed_logprobs()
    }

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<ReloadReport, EngineError>> {
        let dir = checkpoint_dir.to_path_buf();
        async move {
            let start = Instant::now();
            let v = match load_in_place(&self.client, &self.verifier, &dir).await? {
                InPlace::Checked(v) => v,
                InPlace::Failed(e) => return Err(e),
            };
            if !v.passed {
                return Err(EngineError::Failed {
                    backend: "vllm",
                    msg: format!(
                        "{}; not serving it: restart the server on that checkpoint (an in-place \
                         reload of MoE weights is wrong on some vLLM builds)",
                        v.mismatch(&dir)
                    ),
                });
            }
            Ok(ReloadReport {
                seconds: start.elapsed().as_secs_f64(),
                verification: Some(v),
                ..Default::default()
            })
        }
        .boxed()
    }
}

fn failed(msg: String) -> EngineError {
    EngineError::Failed { backend: NAME, msg }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use axum::routing::{get, post};
    use axum::{Json, Router};
    use serde_json::{json, Value};

    use super::{VerifiedVllm, Verifier};
    use crate::engine::vllm::VllmBackend;
    use crate::engine::Backend;
    use crate::model::probe;

    /// A bf16-sized step: the two checkpoints' probes 2e-3 apart, the server 2e-3 from the
    /// trainer, and the load moving the server's answer by 1e-3 in unrelated directions.
    fn old_reference() -> Vec<f32> {
        (0..24).map(|i| -1.0 - i as f32 * 0.1).collect()
    }

    fn wobble(v: &[f32], pattern: &[f32]) -> Vec<f32> {
        v.iter().zip(pattern.iter().cycle()).map(|(x, d)| x + d).collect()
    }

    /// A checkpoint directory as train-step leaves it, with `logprobs` in its probe.json.
    fn checkpoint(root: &Path, version: u64, logprobs: &[f32]) -> PathBuf {
        let dir = root.join(format!("step-{version:06}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        std::fs::write(
            dir.join("lego-rl.json"),
            json!({"policy_version": version}).to_string(),
        )
        .unwrap();
        let (prompt, tokens) = probe::sequence();
        let record = json!({"format": "lego-rl/probe/v1", "policy_version": version, "prompt": prompt,
                            "tokens": tokens, "logprobs": logprobs, "dtype": "BFloat16"});
        std::fs::write(dir.join(probe::FILE), record.to_string()).unwrap();
        dir
    }

    /// A vLLM server that scores the probe as `before` until a `reload_weights` and as `after`
    /// once one came, if it `loads` at all (one that does not: the old weights keep serving).
    async fn fake_vllm(before: Vec<f32>, after: Vec<f32>, loads: bool) -> String {
        let loaded = Arc::new(AtomicBool::new(false));
        let flag = loaded.clone();
        let completions = move |Json(req): Json<Value>| {
            let lp = if flag.load(Ordering::SeqCst) {
                &after
            } else {
                &before
            };
            let prompt_len = req["prompt"].as_array().unwrap().len();
            let answer = if req.get("prompt_logprobs").is_some() {
                // One entry per prompt position, `null` first; the probe's scored tokens last.
                let ids = req["prompt"].as_array().unwrap();
                let first = prompt_len - lp.len();
                let entries: Vec<Value> = (0..prompt_len)
                    .map(|i| match i.checked_sub(first) {
                        Some(k) => json!({ids[i].to_string(): {"logprob": lp[k]}}),
                        None if i == 0 => Value::Null,
                        None => json!({ids[i].to_string(): {"logprob": -1.0}}),
                    })
                    .collect();
                json!({"choices": [{"token_ids": [1], "finish_reason": "length", "prompt_logprobs": entries,
                    "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-0.5]}}]})
            } else {
                // The logprobs-mode probe (`probe_processed`): raw log-probs.
                json!({"choices": [{"token_ids": [1], "finish_reason": "length",
                    "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [-0.5]}}]})
            };
            async move { Json(answer) }
        };
        let app = Router::new()
            .route(
                "/v1/models",
                get(|| async { Json(json!({"data": [{"id": "tiny", "max_model_len": 2048}]})) }),
            )
            .route("/v1/completions", post(completions))
            .route("/pause", post(|| async { r#"{"status":"paused"}"# }))
            .route("/reset_prefix_cache", post(|| async { "" }))
            .route("/resume", post(|| async { r#"{"status":"resumed"}"# }))
            .route(
                "/collective_rpc",
                post(move || async move {
                    loaded.store(loads, Ordering::SeqCst);
                    r#"{"results":[null]}"#
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    /// `--backend vllm:URL --follow` over a server of the user's, calibrated on step 0 and then
    /// reloaded to step 1; returns the reload's outcome.
    async fn reload_on(loads: bool) -> Result<crate::engine::ReloadReport, String> {
        let tmp = tempfile::tempdir().unwrap();
        let old = old_reference();
        let new = wobble(&old, &[2e-3, -1e-3, 0.0, 1e-3]);
        let served_old = wobble(&old, &[2e-3, 1e-3, -2e-3, 0.0]);
        let served_new = wobble(&served_old, &[-1e-3, 0.0, 1e-3, 5e-4]);
        let (step0, step1) = (checkpoint(tmp.path(), 0, &old), checkpoint(tmp.path(), 1, &new));
        let url = fake_vllm(served_old, served_new, loads).await;
        let client = VllmBackend::connect(&url).await.unwrap();
        let verifier = Verifier::new(tch::Device::Cpu, None);
        let fresh = verifier.calibrate(&client, &step0).await.unwrap();
        assert!(fresh.passed, "{fresh:?}");
        let backend = VerifiedVllm { client, verifier };
        backend.reload(&step1).await.map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_users_server_that_kept_the_old_weights_is_refused_and_one_that_loaded_them_serves() {
        // The step is below the tolerance (4 × 2e-3): before the change requirement, the kept
        // weights passed as "inconclusive".
        let err = reload_on(false).await.unwrap_err();
        assert!(err.contains("did not change across the load"), "{err}");
        assert!(err.contains("restart the server on that checkpoint"), "{err}");
        let r = reload_on(true).await.unwrap();
        let v = r.verification.unwrap();
        assert!(v.passed && v.failure.is_none(), "{v:?}");
        assert!(v.previous_apart.unwrap() < v.tolerance, "{v:?}");
        assert!((v.served_change.unwrap() - 1e-3).abs() < 1e-5, "{v:?}");
    }
}
