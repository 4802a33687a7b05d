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
        })
    }
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

    fn reload(&self, _checkpoint_dir: &std::path::Path) -> BoxFuture<'_, Result<(), EngineError>> {
        // vLLM has no stable public endpoint that loads weights from a directory; its dev-mode
        // RPC surface changes between releases. Restart the server on the new checkpoint.
        async {
            Err(EngineError::ReloadUnsupported {
                backend: NAME,
                msg:
                    "restart `vllm serve` on the new checkpoint (or follow with SGLang / the embedded engine)"
                        .into(),
            })
        }
        .boxed()
    }
}
