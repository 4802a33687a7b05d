//! SGLang backend: `POST /generate` with token ids.
//!
//! Request: `input_ids`, `sampling_params` (`max_new_tokens`, `temperature`, `top_p`, `top_k`,
//! `min_p` and the penalties, always, `stop_token_ids`, `skip_special_tokens: false`, `no_stop_trim: true`), `return_logprob: true`,
//! `return_routed_experts: true`. Response: `output_ids`, `meta_info.output_token_logprobs` as
//! `[logprob, token_id, text]` triples, `meta_info.finish_reason` (`{"type": "stop"|"length", ...}`),
//! `meta_info.routed_experts` (base64 of a flat little-endian int32 array, reshaped with the
//! model's layer count and top-k) from position 0 (see [`decode_routing`]). Weight reload: `POST /update_weights_from_disk {"model_path": DIR}`.

use std::time::Instant;

use base64::Engine as _;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};

use super::{
    post_json, Backend, EngineError, FinishReason, GenerateOutput, GenerateRequest, Routing, RoutingShape,
};

const NAME: &str = "sglang";

/// An SGLang server.
pub struct SglangBackend {
    base: String,
    client: reqwest::Client,
    shape: Option<RoutingShape>,
}

impl SglangBackend {
    /// `base` is the server root; `shape` is the model's MoE routing shape (None for dense).
    pub fn new(base: &str, shape: Option<RoutingShape>) -> Self {
        SglangBackend {
            base: base.trim_end_matches('/').to_string(),
            client: reqwest::Client::new(),
            shape,
        }
    }

    async fn generate_inner(&self, req: GenerateRequest) -> Result<GenerateOutput, EngineError> {
        let url = format!("{}/generate", self.base);
        let s = &req.sampling;
        let mut params = json!({
            "max_new_tokens": s.max_tokens.unwrap_or(1024),
            "stop_token_ids": req.stop_token_ids,
            "skip_special_tokens": false,
            "no_stop_trim": true,
        });
        // SGLang, like vLLM, can fill omitted fields from generation_config.json
        // (`--sampling-defaults model`).
        for (field, value) in super::distribution_fields(s) {
            params[field] = value;
        }
        if let Some(seed) = s.seed {
            params["sampling_seed"] = json!(seed);
        }
        if !s.stop.is_empty() {
            params["stop"] = json!(s.stop);
        }
        let want_routing = req.return_routing && self.shape.is_some();
        let body = json!({
            "input_ids": req.prompt_ids,
            "sampling_params": params,
            "return_logprob": true,
            "return_routed_experts": want_routing,
        });
        let start = Instant::now();
        let v = post_json(&self.client, NAME, &url, &body).await?;
        let bad = |msg: &str| EngineError::BadResponse {
            backend: NAME,
            url: url.clone(),
            msg: msg.to_string(),
        };
        let meta = &v["meta_info"];
        let triples = meta["output_token_logprobs"]
            .as_array()
            .ok_or_else(|| bad("no meta_info.output_token_logprobs"))?;
        let mut logprobs = Vec::with_capacity(triples.len());
        let mut ids_from_logprobs = Vec::with_capacity(triples.len());
        for t in triples {
            logprobs.push(
                t[0].as_f64()
                    .ok_or_else(|| bad("output_token_logprobs[i][0] is not a number"))?
                    as f32,
            );
            ids_from_logprobs.push(
                t[1].as_u64()
                    .ok_or_else(|| bad("output_token_logprobs[i][1] is not a token id"))?
                    as u32,
            );
        }
        let output_ids: Vec<u32> = match v["output_ids"].as_array() {
            Some(ids) => ids
                .iter()
                .map(|x| x.as_u64().map(|i| i as u32))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("bad output_ids"))?,
            None => ids_from_logprobs.clone(),
        };
        if output_ids != ids_from_logprobs {
            return Err(bad("output_ids disagree with the ids in output_token_logprobs"));
        }
        let finish = match &meta["finish_reason"] {
            Value::Object(o) => o.get("type").and_then(Value::as_str).unwrap_or("").to_string(),
            Value::String(s) => s.clone(),
            _ => String::new(),
        };
        let routing = match (want_routing, self.shape) {
            (true, Some(shape)) => decode_routing(meta, shape).map_err(|m| bad(&m))?,
            _ => None,
        };
        Ok(GenerateOutput {
            output_ids,
            logprobs,
            routing,
            finish_reason: FinishReason::parse(&finish),
            seconds: meta["e2e_latency"]
                .as_f64()
                .unwrap_or_else(|| start.elapsed().as_secs_f64()),
            // The radix cache's share of the prompt.
            cached_tokens: meta["cached_tokens"].as_u64().map(|n| n as usize),
            // SGLang returns the model's own log-probs; align drops tempered or truncated turns.
            processed_logprobs: false,
        })
    }

    async fn reload_inner(&self, dir: std::path::PathBuf) -> Result<(), EngineError> {
        let url = format!("{}/update_weights_from_disk", self.base);
        // A failed load answers HTTP 400 with the same body, which `post_json` turns into an
        // error carrying it.
        let v = post_json(&self.client, NAME, &url, &json!({ "model_path": dir })).await?;
        reload_answer(&url, &v)
    }
}

/// `POST /update_weights_from_disk`'s answer, `{"success", "message", "num_paused_requests"}`
/// (older servers: the first two): only `success: true` means the new weights serve. Anything else,
/// a missing field included (another service on that path), is an error naming the message.
fn reload_answer(url: &str, v: &Value) -> Result<(), EngineError> {
    if v["success"].as_bool() == Some(true) {
        return Ok(());
    }
    Err(EngineError::BadResponse {
        backend: NAME,
        url: url.to_string(),
        msg: match v["message"].as_str() {
            Some(m) => format!("reload failed: {m}"),
            None => format!("reload answer without \"success\": true: {v}"),
        },
    })
}

/// `meta_info.routed_experts`: base64 of a flat little-endian int32 array `[token][layer][k]`
/// covering positions 0 .. seq_len − 2 (SGLang's `state_capturer/routed_experts.py`). The rows
/// start at the request's `routed_experts_start_len`, which SGLang does not echo back; this
/// client never sends it, so they start at 0.
fn decode_routing(meta: &Value, shape: RoutingShape) -> Result<Option<Routing>, String> {
    let Some(b64) = meta["routed_experts"].as_str() else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("routed_experts is not base64: {e}"))?;
    let per = shape.layers * shape.top_k * 4;
    if bytes.len() % per != 0 {
        return Err(format!(
            "routed_experts has {} bytes, not a multiple of layers*top_k*4 = {per}",
            bytes.len()
        ));
    }
    let experts = bytes
        .chunks_exact(4)
        .map(|c| {
            u16::try_from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .map_err(|_| "routed_experts holds an id outside 0..65535".to_string())
        })
        .collect::<Result<Vec<u16>, _>>()?;
    Ok(Some(Routing {
        start: 0,
        tokens: bytes.len() / per,
        layers: shape.layers,
        top_k: shape.top_k,
        experts,
    }))
}

impl Backend for SglangBackend {
    fn id(&self) -> String {
        format!("sglang:{}", self.base)
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.generate_inner(req).boxed()
    }

    fn processed_logprobs(&self) -> Option<bool> {
        Some(false)
    }

    fn reload(
        &self,
        checkpoint_dir: &std::path::Path,
    ) -> BoxFuture<'_, Result<super::ReloadReport, EngineError>> {
        let dir = checkpoint_dir.to_path_buf();
        async move {
            let start = std::time::Instant::now();
            self.reload_inner(dir).await?;
            Ok(super::ReloadReport::took(start.elapsed()))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/engine-routing")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    const SHAPE: RoutingShape = RoutingShape { layers: 2, top_k: 2 };

    #[test]
    fn reload_answers_are_read_as_sglang_writes_them() {
        let url = "http://sglang/update_weights_from_disk";
        reload_answer(url, &fixture("sglang-update-weights-from-disk.json")).unwrap();
        let err = reload_answer(url, &fixture("sglang-update-weights-from-disk-failure.json")).unwrap_err();
        assert!(
            err.to_string()
                .contains("reload failed: Failed to get weights iterator"),
            "{err}"
        );
        // An answer without `success` (not SGLang's endpoint) never counts as a reload.
        let err = reload_answer(url, &json!({})).unwrap_err();
        assert!(err.to_string().contains("without \"success\": true"), "{err}");
    }

    #[test]
    fn routing_decodes_as_sglang_returns_it() {
        // testdata/engine-routing/README.md: positions 0..3 of a 3 + 2 token sequence.
        let rows: Vec<u16> = vec![1, 5, 2, 7, 3, 0, 6, 4, 7, 2, 1, 3, 4, 6, 0, 5];
        let r = decode_routing(&fixture("sglang-generate.json")["meta_info"], SHAPE)
            .unwrap()
            .unwrap();
        assert_eq!((r.start, r.tokens), (0, 4));
        assert_eq!(r.experts, rows);
        // With `routed_experts_start_len: 2` in the request: the rows of positions 2..3 only.
        let r = decode_routing(&fixture("sglang-generate-start-len-2.json")["meta_info"], SHAPE)
            .unwrap()
            .unwrap();
        assert_eq!(r.experts, rows[8..]);
        let mut meta = fixture("sglang-generate.json")["meta_info"].clone();
        meta["routed_experts"] = json!("AAAA");
        assert!(decode_routing(&meta, SHAPE)
            .unwrap_err()
            .contains("not a multiple"));
    }
}
