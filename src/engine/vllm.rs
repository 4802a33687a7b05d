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

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use base64::Engine as _;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use super::{post_json, Backend, EngineError, FinishReason, GenerateOutput, GenerateRequest, Routing};

const NAME: &str = "vllm";

/// A vLLM server.
pub struct VllmBackend {
    base: String,
    client: reqwest::Client,
    model: OnceLock<String>,
}

impl VllmBackend {
    /// `base` is the server root, e.g. `http://gpu-node:8000`.
    pub fn new(base: &str) -> Self {
        VllmBackend {
            base: base.trim_end_matches('/').to_string(),
            client: reqwest::Client::new(),
            model: OnceLock::new(),
        }
    }

    async fn model(&self) -> Result<String, EngineError> {
        if let Some(m) = self.model.get() {
            return Ok(m.clone());
        }
        let url = format!("{}/v1/models", self.base);
        let resp = self
            .client
            .get(&url)
            .send()
            .await
            .map_err(|source| EngineError::Unavailable {
                backend: NAME,
                url: url.clone(),
                source,
            })?;
        let v: Value = resp.json().await.map_err(|source| EngineError::Unavailable {
            backend: NAME,
            url: url.clone(),
            source,
        })?;
        let id = v["data"][0]["id"]
            .as_str()
            .ok_or_else(|| bad(&url, "no model in data[0].id"))?
            .to_string();
        Ok(self.model.get_or_init(|| id).clone())
    }

    async fn generate_inner(&self, req: GenerateRequest) -> Result<GenerateOutput, EngineError> {
        let model = self.model().await?;
        let url = format!("{}/v1/completions", self.base);
        let s = &req.sampling;
        let mut body = json!({
            "model": model,
            "prompt": req.prompt_ids,
            "max_tokens": s.max_tokens.unwrap_or(1024),
            "temperature": s.temperature.unwrap_or(1.0),
            "logprobs": 0,
            "return_tokens_as_token_ids": true,
            "return_token_ids": true,
            "skip_special_tokens": false,
            "spaces_between_special_tokens": false,
            "include_stop_str_in_output": true,
            "stop_token_ids": req.stop_token_ids,
            "n": 1,
        });
        if let Some(p) = s.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(k) = s.top_k {
            body["top_k"] = json!(k);
        }
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed);
        }
        if !s.stop.is_empty() {
            body["stop"] = json!(s.stop);
        }
        let start = Instant::now();
        let v = post_json(&self.client, NAME, &url, &body).await?;
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
        let output_ids: Vec<u32> = match choice["token_ids"].as_array() {
            Some(ids) => ids
                .iter()
                .map(|x| {
                    x.as_u64()
                        .map(|i| i as u32)
                        .ok_or_else(|| bad(&url, "bad token_ids"))
                })
                .collect::<Result<_, _>>()?,
            // Older servers: only `"token_id:<id>"` strings in logprobs.tokens.
            None => choice["logprobs"]["tokens"]
                .as_array()
                .ok_or_else(|| bad(&url, "neither choices[0].token_ids nor logprobs.tokens"))?
                .iter()
                .map(|t| {
                    t.as_str()
                        .and_then(|s| s.strip_prefix("token_id:"))
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad(&url, "logprobs.tokens entry is not `token_id:<id>`"))
                })
                .collect::<Result<_, _>>()?,
        };
        if output_ids.len() != logprobs.len() {
            return Err(bad(
                &url,
                &format!("{} tokens but {} log-probs", output_ids.len(), logprobs.len()),
            ));
        }
        let routing = if req.return_routing {
            routing(&url, &v, choice, req.prompt_ids.len(), output_ids.len())?
        } else {
            None
        };
        Ok(GenerateOutput {
            finish_reason: FinishReason::parse(choice["finish_reason"].as_str().unwrap_or("")),
            output_ids,
            logprobs,
            routing,
            seconds: start.elapsed().as_secs_f64(),
            // Present when the server runs with `--enable-prompt-tokens-details`.
            cached_tokens: v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .map(|n| n as usize),
        })
    }
}

/// The dev-mode endpoints of a reload, in order (see the module docs).
const PAUSE: &str = "/pause?mode=wait&wait_for_inflight_requests=true";
const COLLECTIVE_RPC: &str = "/collective_rpc";
const RESET_PREFIX_CACHE: &str = "/reset_prefix_cache";
const RESUME: &str = "/resume";

impl VllmBackend {
    /// Pauses the server, loads `dir` into every worker, drops the prefix cache and resumes.
    async fn reload_inner(&self, dir: PathBuf) -> Result<(), EngineError> {
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
        self.dev_post(PAUSE, None).await?;
        let rpc = json!({"method": "reload_weights", "kwargs": {"weights_path": weights_path}});
        let reloaded = async {
            let answer = self.dev_post(COLLECTIVE_RPC, Some(&rpc)).await?;
            check_rpc_answer(&format!("{}{COLLECTIVE_RPC}", self.base), &answer)?;
            self.dev_post(RESET_PREFIX_CACHE, None).await.map(drop)
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
            return Err(super::status_error(NAME, &url, status, text));
        }
        Ok(text)
    }

    /// Adds to a failure after the pause that the server is still paused, and how to get on.
    fn left_paused(&self, e: EngineError) -> EngineError {
        // The cause's own "vllm: " prefix would repeat this error's.
        let cause = e.to_string();
        let cause = cause.strip_prefix(&format!("{NAME}: ")).unwrap_or(&cause);
        let mut msg = format!(
            "weight reload failed: {cause}; the server stays paused (POST {}{RESUME} serves whatever \
             weights it now holds; restarting `vllm serve` is the clean way out)",
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

fn bad(url: &str, msg: &str) -> EngineError {
    EngineError::BadResponse {
        backend: NAME,
        url: url.to_string(),
        msg: msg.to_string(),
    }
}

/// Decodes a routed-experts field: base64 `.npy` or nested lists `[tokens][layers][top_k]`.
fn experts_array(url: &str, v: &Value) -> Result<Option<Routing>, EngineError> {
    match v {
        Value::Null => Ok(None),
        Value::String(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| bad(url, &format!("routed_experts is not base64: {e}")))?;
            let arr = super::npy::parse(&bytes).map_err(|e| bad(url, &format!("routed_experts: {e}")))?;
            let [t, l, k] = arr.shape[..] else {
                return Err(bad(
                    url,
                    &format!("routed_experts has shape {:?}, want 3-d", arr.shape),
                ));
            };
            Ok(Some(Routing {
                start: 0,
                tokens: t,
                layers: l,
                top_k: k,
                experts: arr.data.into_iter().map(|e| e as u16).collect(),
            }))
        }
        Value::Array(rows) => {
            let t = rows.len();
            let l = rows.first().and_then(|r| r.as_array()).map_or(0, Vec::len);
            let k = rows
                .first()
                .and_then(|r| r.as_array())
                .and_then(|r| r.first())
                .and_then(|x| x.as_array())
                .map_or(0, Vec::len);
            let mut flat = Vec::with_capacity(t * l * k);
            for row in rows {
                for layer in row.as_array().into_iter().flatten() {
                    let experts = layer
                        .as_array()
                        .filter(|e| e.len() == k)
                        .ok_or_else(|| bad(url, "ragged routed_experts"))?;
                    for e in experts {
                        flat.push(e.as_u64().ok_or_else(|| bad(url, "non-integer expert id"))? as u16);
                    }
                }
            }
            if flat.len() != t * l * k {
                return Err(bad(url, "ragged routed_experts"));
            }
            Ok(Some(Routing {
                start: 0,
                tokens: t,
                layers: l,
                top_k: k,
                experts: flat,
            }))
        }
        _ => Err(bad(url, "routed_experts is neither base64 nor a list")),
    }
}

fn routing(
    url: &str,
    resp: &Value,
    choice: &Value,
    prompt: usize,
    output: usize,
) -> Result<Option<Routing>, EngineError> {
    let Some(Routing {
        tokens: t,
        layers: l,
        top_k: k,
        experts,
        ..
    }) = experts_array(url, &choice["routed_experts"])?
    else {
        return Ok(None);
    };
    if let Some(mut p) = experts_array(url, &resp["prompt_routed_experts"])? {
        // Split form: prompt rows at the response level, generated rows per choice.
        if (p.layers, p.top_k) != (l, k) {
            return Err(bad(
                url,
                "prompt_routed_experts and routed_experts disagree on layers/top_k",
            ));
        }
        p.experts.extend(experts);
        p.tokens += t;
        return Ok(Some(p));
    }
    let total = prompt + output;
    let start = if t == total || t + 1 == total {
        0
    } else if t == output || t + 1 == output {
        prompt
    } else {
        return Err(bad(
            url,
            &format!("routed_experts has {t} rows for {prompt} prompt + {output} output tokens"),
        ));
    };
    Ok(Some(Routing {
        start,
        tokens: t,
        layers: l,
        top_k: k,
        experts,
    }))
}

impl Backend for VllmBackend {
    fn id(&self) -> String {
        format!("vllm:{}", self.base)
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.generate_inner(req).boxed()
    }

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<(), EngineError>> {
        self.reload_inner(checkpoint_dir.to_path_buf()).boxed()
    }
}
