//! The LLM proxy: OpenAI- and Anthropic-compatible endpoints in front of a token-level
//! [`Backend`], recording every generation exactly as sampled.
//!
//! Harnesses talk to it as if it were the vendor API. The proxy converts each request to a
//! [`Conversation`], renders it to tokens itself (or, in faithful mode, reuses the captured
//! tokens of the previous turn and tokenizes only the new suffix), asks the backend for tokens
//! with log-probs and routing, parses the tokens back into text / reasoning / tool calls, records
//! the [`Generation`] into the trial's capture, and only then answers.
//!
//! Every path exists plainly (`/v1/chat/completions`) and under a per-trial prefix
//! (`/t/{token}/v1/chat/completions`). The token, issued by [`Proxy::register_trial`], attributes
//! the request to its trial and is its only credential (API keys sent by harnesses are ignored
//! and never logged). Plain paths are served only with [`ProxyConfig::allow_anonymous`]
//! (standalone debugging), under the trial `anonymous`.

mod anthropic_api;
mod capture;
mod flight;
mod harness_sampling;
mod openai_api;
mod routes;
mod trial;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use capture::{call_seed, Captured, Trial};
pub use harness_sampling::{HarnessSampling, SAMPLING_FIELDS};

use crate::chat::ChatFormat;
use crate::engine::Backend;
use crate::records::{PromptMode, Sampling};

/// Proxy settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Build prompts from captured tokens where possible (default), or always re-render.
    pub prompt_mode: PromptMode,
    /// Serve plain paths without a trial token (standalone mode).
    pub allow_anonymous: bool,
    /// Request bodies above this size get 413.
    pub max_body_bytes: usize,
    /// Sampling defaults; request fields override temperature/top_p/top_k (unless
    /// `harness_sampling` pins them) and cap max_tokens.
    pub sampling: Sampling,
    /// Whether requests' own temperature/top_p/top_k are used (`Honor`) or ignored and recorded
    /// (`Pin`, rollout's train mode).
    pub harness_sampling: HarnessSampling,
    /// Ask the backend for MoE routing.
    pub return_routing: bool,
    /// The model id answered by `/v1/models` and echoed in responses when a request names none.
    pub model_name: String,
    /// Context window offered to harnesses, in tokens (prompt plus at least one generated
    /// token); None: the backend's. A longer prompt is refused in the API provider's own words,
    /// which harnesses answer by compacting.
    pub max_context: Option<usize>,
    /// How long a generation whose client went away keeps running, for the client's retry to be
    /// answered from it (the official SDKs retry a timed-out request after 0.4-1 s); then it is
    /// cancelled and recorded `client_disconnected`. Zero cancels at once.
    pub retry_grace: std::time::Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            prompt_mode: PromptMode::Faithful,
            allow_anonymous: false,
            max_body_bytes: 32 << 20,
            sampling: Sampling {
                temperature: Some(1.0),
                max_tokens: Some(4096),
                ..Default::default()
            },
            harness_sampling: HarnessSampling::default(),
            return_routing: true,
            model_name: "policy".into(),
            max_context: None,
            retry_grace: std::time::Duration::from_secs(3),
        }
    }
}

/// Errors of the proxy, mapped to each API's own error JSON by the handlers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    #[error("unknown or expired trial token")]
    UnknownTrial,
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0}")]
    BadRequest(String),
    /// The prompt does not fit the model's context; each API answers in its provider's words
    /// (see `routes::error_response`), which harnesses parse to compact and retry.
    #[error("prompt of {prompt} tokens does not fit the model's context of {context} tokens")]
    ContextLength { prompt: usize, context: usize },
    #[error("inference backend unavailable: {0}")]
    Backend(String),
}

/// The state shared by all handlers.
pub(crate) struct State {
    pub chat: Arc<ChatFormat>,
    pub backend: Arc<dyn Backend>,
    pub cfg: ProxyConfig,
    pub trials: Mutex<HashMap<String, Arc<Trial>>>,
    /// The version of the weights the backend serves; changed only under `serving`'s write lock.
    pub policy_version: AtomicU64,
    /// Held for reading by every generation while the backend runs it, and for writing by a
    /// weight swap ([`Proxy::swap_weights`]): a generation runs on one version of the weights, and
    /// records that version exactly, even when rollout reloads while trials are running.
    pub serving: tokio::sync::RwLock<()>,
}

/// A running or runnable proxy (cheap to clone).
#[derive(Clone)]
pub struct Proxy {
    state: Arc<State>,
}

impl Proxy {
    /// A proxy over `backend` for the model whose chat format is `chat`.
    pub fn new(chat: Arc<ChatFormat>, backend: Arc<dyn Backend>, cfg: ProxyConfig) -> Self {
        let state = State {
            chat,
            backend,
            cfg,
            trials: Mutex::new(HashMap::new()),
            policy_version: AtomicU64::new(0),
            serving: tokio::sync::RwLock::new(()),
        };
        let proxy = Proxy {
            state: Arc::new(state),
        };
        if proxy.state.cfg.allow_anonymous {
            proxy.insert_trial("anonymous", "anonymous".into());
        }
        proxy
    }

    fn insert_trial(&self, trial_id: &str, token: String) -> Arc<Trial> {
        let trial = Arc::new(Trial::new(trial_id));
        self.state
            .trials
            .lock()
            .expect("invariant: lock not poisoned")
            .insert(token, trial.clone());
        trial
    }

    /// Registers a trial and returns its unguessable token (the URL prefix `/t/{token}`).
    pub fn register_trial(&self, trial_id: &str) -> (String, Arc<Trial>) {
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let trial = self.insert_trial(trial_id, token.clone());
        (token, trial)
    }

    /// Removes a trial; its token stops working. Returns its captures.
    pub fn finish_trial(&self, token: &str) -> Option<Arc<Trial>> {
        self.state
            .trials
            .lock()
            .expect("invariant: lock not poisoned")
            .remove(token)
    }

    /// Sets the policy version recorded in new captures: the backend's weights before any
    /// generation (a swap while generations run goes through [`Self::swap_weights`]).
    pub fn set_policy_version(&self, v: u64) {
        self.state.policy_version.store(v, Ordering::SeqCst);
    }

    /// Swaps the backend's weights to policy `version` with `load` (the backend's reload): waits
    /// for the generations in flight to finish on the old weights, holds new ones back while
    /// `load` runs, and records `version` for those that follow when it succeeds. Requests keep
    /// arriving meanwhile (their prompts are prepared; their generations wait). Why a lock and
    /// not a version read when a request arrives: an engine that queues the reload behind running
    /// work would serve a request that arrived before the swap with the new weights, and the
    /// capture would name the old version.
    pub async fn swap_weights<T, E>(
        &self,
        version: u64,
        load: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let _swap = self.state.serving.write().await;
        let loaded = load.await?;
        self.state.policy_version.store(version, Ordering::SeqCst);
        Ok(loaded)
    }

    /// The axum router (for embedding in another server or for tests).
    pub fn router(&self) -> axum::Router {
        routes::router(self.state.clone())
    }

    /// Binds `addr` and serves in the background; returns the bound address.
    pub async fn serve(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let app = self.router();
        let handle = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("proxy server stopped: {e}");
            }
        });
        Ok((bound, handle))
    }

    /// Serves on a unix socket at `path` in the background (the transport sandboxes use: the
    /// socket is bind-mounted into each trial container, where a relay forwards a loopback port to
    /// it — see [`crate::sandbox::relay`]). A stale socket file at `path` is replaced; the socket is
    /// made connectable by any user, so access control is the directory it lives in plus the
    /// per-trial token in the URL.
    pub async fn serve_unix(&self, path: &std::path::Path) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let app = self.router();
        Ok(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("proxy server stopped: {e}");
            }
        }))
    }
}

// Tests: tests/it/proxy.rs drives the server over HTTP with the embedded engine.
