//! `--backend vllm-serve:CKPT`: a vLLM server that rollout starts, watches, reloads with
//! verification ([`super::verify`]) and restarts; and `--backend vllm:URL` with verified reloads.
//!
//! **Supervision.** A reload that fails or does not verify restarts the server on the new
//! checkpoint and verifies again; a server that still does not verify is an error (rollout stops,
//! it never serves unverified weights). A server that died (a crashed engine) is restarted on its
//! checkpoint before the next request; the request that found it dead fails as an infra error.

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
             checkpoint; reloads must stay within {:.2e}",
            startup.max_abs_delta,
            startup.tokens,
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
        let why = match self.client.reload_inner(dir.clone()).await {
            Ok(()) => {
                let v = self.verifier.check(&self.client, &dir).await?;
                if v.passed {
                    return Ok(ReloadReport {
                        seconds: start.elapsed().as_secs_f64(),
                        verification: Some(v),
                        ..Default::default()
                    });
                }
                let why = v.mismatch(&dir);
                rejected = Some(v);
                why
            }
            Err(e) => e.to_string(),
        };
        tracing::warn!("{NAME}: {why}; restarting the server on {}", dir.display());
        self.server.restart(&dir).await?;
        let v = self.verifier.check(&self.client, &dir).await?;
        if !v.passed {
            return Err(failed(format!(
                "even a fresh server on {} differs from the checkpoint by {:.3e} (> {:.3e}); not \
                 serving it",
                dir.display(),
                v.max_abs_delta,
                v.tolerance
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
            self.client.reload_inner(dir.clone()).await?;
            let v = self.verifier.check(&self.client, &dir).await?;
            if !v.passed {
                return Err(EngineError::Failed {
                    backend: "vllm",
                    msg: format!(
                        "{}; restart the server on that checkpoint (an in-place reload of MoE \
                         weights is wrong on some vLLM builds)",
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
