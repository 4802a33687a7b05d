//! The report's diagnostic assistant: a language model asked about one trajectory (the live
//! UI's Ask box) or about every failed trial of a run (`report --summarize`).
//!
//! It talks to any OpenAI-compatible `chat/completions` endpoint, streaming. `embedded:CKPT`
//! serves a checkpoint in-process through lego-rl's own proxy on a loopback port, so both kinds
//! take the same path; each request is its own proxy trial, whose captures are dropped when it
//! ends. Nothing is sent anywhere unless an assistant is configured: without one the server has
//! no endpoint to send to and the page shows no Ask box.

pub mod ask;
pub mod prompt;
pub mod review;
pub mod summarize;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use serde_json::{json, Value};

use crate::chat::ChatFormat;
use crate::engine::embedded::{EmbeddedBackend, EngineOptions};
use crate::engine::Backend;
use crate::proxy::{HarnessSampling, Proxy, ProxyConfig};
use crate::records::Sampling;
pub use prompt::{AssistPrompt, TokenCounter};

/// Environment variable holding the assistant endpoint's API key (the default of
/// `--assistant-api-key-env`); the key is sent as a bearer token and never logged.
pub const API_KEY_ENV: &str = "LEGO_RL_ASSISTANT_API_KEY";

/// Errors of the assistant.
#[derive(Debug, thiserror::Error)]
pub enum AssistError {
    #[error("--assistant `{0}`: expected an http(s) URL of an OpenAI-compatible API or embedded:CKPT_DIR")]
    Spec(String),
    #[error("{path}: cannot load the assistant's chat format: {msg}")]
    Chat { path: PathBuf, msg: String },
    #[error("cannot start the embedded assistant on {path}: {msg}")]
    Embedded { path: PathBuf, msg: String },
    #[error("assistant request to {url} failed: {msg}")]
    Request { url: String, msg: String },
    #[error("assistant at {url} answered HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("the question and history leave no room for the trajectory within {context} tokens")]
    NoRoom { context: usize },
}

/// Where the assistant runs.
#[derive(Debug, Clone, PartialEq)]
pub enum AssistantSpec {
    /// An OpenAI-compatible base URL (`http://host:8000/v1`; `/v1` is added when missing).
    Url(String),
    /// A checkpoint served in-process by the embedded engine.
    Embedded(PathBuf),
}

impl std::str::FromStr for AssistantSpec {
    type Err = AssistError;
    fn from_str(s: &str) -> Result<Self, AssistError> {
        if let Some(dir) = s.strip_prefix("embedded:") {
            if dir.is_empty() {
                return Err(AssistError::Spec(s.into()));
            }
            return Ok(AssistantSpec::Embedded(PathBuf::from(dir)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(AssistantSpec::Url(s.trim_end_matches('/').to_string()));
        }
        Err(AssistError::Spec(s.into()))
    }
}

/// The assistant's settings (`report --assistant*`).
#[derive(Debug, Clone)]
pub struct AssistantSettings {
    pub spec: AssistantSpec,
    /// The model name sent with each request (default: the endpoint's first `/v1/models` entry,
    /// else `default`).
    pub model: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: String,
    /// A model directory with `tokenizer.json` (and, for `embedded:`, the chat template): counts
    /// prompt tokens exactly. Default for `embedded:` is the checkpoint itself.
    pub chat_model: Option<PathBuf>,
    /// The endpoint's context window in tokens (default: the embedded model's, else 32768).
    pub context: Option<usize>,
    /// Most tokens of one answer.
    pub max_tokens: u32,
}

/// One earlier question or answer of a conversation.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// A piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    Finish(String),
}

pub type PieceStream = Pin<Box<dyn Stream<Item = Result<Piece, AssistError>> + Send>>;

/// A configured assistant (cheap to share behind an `Arc`).
pub struct Assistant {
    /// `…/v1`.
    base: String,
    model: String,
    api_key: Option<String>,
    pub context: usize,
    pub max_tokens: u32,
    pub counter: TokenCounter,
    http: reqwest::Client,
    /// The in-process proxy of `embedded:`; each request registers its own trial.
    proxy: Option<Proxy>,
    label: String,
}

const DEFAULT_CONTEXT: usize = 32768;

fn load_chat(dir: &std::path::Path) -> Result<ChatFormat, AssistError> {
    ChatFormat::from_model_dir(dir).map_err(|e| AssistError::Chat {
        path: dir.to_path_buf(),
        msg: format!("{e:#}"),
    })
}

impl Assistant {
    /// Starts the assistant: loads the embedded checkpoint and serves it on a loopback port, or
    /// prepares the client of a URL (sending nothing yet).
    pub async fn start(s: &AssistantSettings) -> Result<Self, AssistError> {
        let http = reqwest::Client::new();
        let api_key = std::env::var(&s.api_key_env).ok().filter(|k| !k.is_empty());
        match &s.spec {
            AssistantSpec::Url(url) => {
                let counter = match &s.chat_model {
                    Some(dir) => TokenCounter::Exact(Arc::new(load_chat(dir)?)),
                    None => TokenCounter::Estimate,
                };
                let base = if url.ends_with("/v1") {
                    url.clone()
                } else {
                    format!("{url}/v1")
                };
                Ok(Assistant {
                    label: format!("{} at {url}", s.model.as_deref().unwrap_or("default")),
                    model: s.model.clone().unwrap_or_else(|| "default".into()),
                    base,
                    api_key,
                    context: s.context.unwrap_or(DEFAULT_CONTEXT),
                    max_tokens: s.max_tokens,
                    counter,
                    http,
                    proxy: None,
                })
            }
            AssistantSpec::Embedded(dir) => {
                let chat_dir = s.chat_model.clone().unwrap_or_else(|| dir.clone());
                let chat = Arc::new(load_chat(&chat_dir)?);
                let dir2 = dir.clone();
                let failed = |msg: String| AssistError::Embedded {
                    path: dir.clone(),
                    msg,
                };
                let backend = tokio::task::spawn_blocking(move || {
                    EmbeddedBackend::start_with(&dir2, tch::Device::Cpu, EngineOptions::default())
                })
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(e.to_string()))?;
                let context = s
                    .context
                    .or_else(|| backend.context_length())
                    .unwrap_or(DEFAULT_CONTEXT);
                let cfg = ProxyConfig {
                    sampling: Sampling {
                        temperature: Some(0.7),
                        max_tokens: Some(s.max_tokens),
                        ..Default::default()
                    },
                    harness_sampling: HarnessSampling::Honor,
                    return_routing: false,
                    model_name: "assistant".into(),
                    retry_grace: std::time::Duration::ZERO,
                    ..ProxyConfig::default()
                };
                let proxy = Proxy::new(chat.clone(), Arc::new(backend), cfg);
                let (addr, _server) = proxy
                    .serve(([127, 0, 0, 1], 0).into())
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                Ok(Assistant {
                    label: format!("embedded {}", dir.display()),
                    model: "assistant".into(),
                    base: format!("http://{addr}/v1"),
                    api_key: None,
                    context,
                    max_tokens: s.max_tokens,
                    counter: TokenCounter::Exact(chat),
                    http,
                    proxy: Some(proxy),
                })
            }
        }
    }

    /// What the UI shows as the assistant's name.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Tokens left for the trajectory after the answer and `history` (plus `question` when it
    /// is a follow-up, which goes after the history).
    pub fn prompt_budget(&self, history: &[ChatTurn]) -> Result<usize, AssistError> {
        let used: usize = history.iter().map(|t| self.counter.count(&t.content) + 8).sum();
        let budget = self.context.saturating_sub(self.max_tokens as usize + used + 16);
        if budget < 256 {
            return Err(AssistError::NoRoom {
                context: self.context,
            });
        }
        Ok(budget)
    }

    /// The chat messages: the prompt (whose question is the first), then the conversation.
    pub fn messages(prompt: &AssistPrompt, history: &[ChatTurn]) -> Vec<Value> {
        let mut m = vec![
            json!({"role": "system", "content": prompt.system}),
            json!({"role": "user", "content": prompt.user}),
        ];
        m.extend(
            history
                .iter()
                .map(|t| json!({"role": t.role, "content": t.content})),
        );
        m
    }

    /// Streams the answer to `messages`.
    pub async fn stream(&self, messages: Vec<Value>) -> Result<PieceStream, AssistError> {
        // Each embedded request is a proxy trial of its own, ended when its stream ends, so the
        // proxy keeps no captures of the assistant's conversations.
        let (url, token) = match &self.proxy {
            Some(p) => {
                let (token, _) = p.register_trial("assistant");
                let host = self.base.trim_end_matches("/v1");
                (format!("{host}/t/{token}/v1/chat/completions"), Some(token))
            }
            None => (format!("{}/chat/completions", self.base), None),
        };
        let body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "stream": true,
        });
        let mut req = self.http.post(&url).json(&body);
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let request_failed = |e: reqwest::Error| AssistError::Request {
            url: url.clone(),
            msg: e.to_string(),
        };
        let resp = req.send().await.map_err(request_failed)?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(AssistError::Status {
                url,
                status: status.as_u16(),
                body: prompt::cut_middle(&body, 500).0,
            });
        }
        let finish = TrialEnd {
            proxy: self.proxy.clone(),
            token,
        };
        let mut buf = String::new();
        let bytes = resp.bytes_stream();
        let pieces = bytes
            .map(move |chunk| {
                let _keep = &finish;
                let chunk = chunk.map_err(|e| AssistError::Request {
                    url: url.clone(),
                    msg: e.to_string(),
                })?;
                buf.push_str(&String::from_utf8_lossy(&chunk));
                let mut out = Vec::new();
                while let Some(end) = buf.find('\n') {
                    let line: String = buf.drain(..=end).collect();
                    out.extend(sse_line(line.trim_end()));
                }
                Ok(out)
            })
            .flat_map(|r: Result<Vec<Piece>, AssistError>| match r {
                Ok(v) => futures::stream::iter(v.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            });
        Ok(Box::pin(pieces))
    }

    /// The whole answer to `messages` (its text, or its reasoning when it has no text).
    pub async fn complete(&self, messages: Vec<Value>) -> Result<String, AssistError> {
        let mut s = self.stream(messages).await?;
        let (mut text, mut reasoning) = (String::new(), String::new());
        while let Some(p) = s.next().await {
            match p? {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
                Piece::Finish(_) => {}
            }
        }
        Ok(if text.trim().is_empty() { reasoning } else { text })
    }
}

/// Ends an embedded request's proxy trial when its stream is dropped.
struct TrialEnd {
    proxy: Option<Proxy>,
    token: Option<String>,
}

impl Drop for TrialEnd {
    fn drop(&mut self) {
        if let (Some(p), Some(t)) = (&self.proxy, &self.token) {
            p.finish_trial(t);
        }
    }
}

/// The pieces of one SSE line of an OpenAI `chat.completion.chunk` stream.
fn sse_line(line: &str) -> Vec<Piece> {
    let Some(data) = line.strip_prefix("data:") else {
        return Vec::new();
    };
    let data = data.trim();
    if data == "[DONE]" {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let choice = &v["choices"][0];
    let delta = &choice["delta"];
    for (key, reasoning) in [
        ("reasoning_content", true),
        ("reasoning", true),
        ("content", false),
    ] {
        if let Some(t) = delta[key].as_str().filter(|t| !t.is_empty()) {
            out.push(if reasoning {
                Piece::Reasoning(t.into())
            } else {
                Piece::Text(t.into())
            });
        }
    }
    if let Some(f) = choice["finish_reason"].as_str() {
        out.push(Piece::Finish(f.into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            "embedded:run/ck".parse::<AssistantSpec>().unwrap(),
            AssistantSpec::Embedded("run/ck".into())
        );
        assert_eq!(
            "http://h:8000/v1/".parse::<AssistantSpec>().unwrap(),
            AssistantSpec::Url("http://h:8000/v1".into())
        );
        assert!("h:8000".parse::<AssistantSpec>().is_err());
        assert!("embedded:".parse::<AssistantSpec>().is_err());
    }

    #[test]
    fn sse_lines_give_text_reasoning_and_finish() {
        let l = r#"data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        assert_eq!(sse_line(l), vec![Piece::Text("Hi".into())]);
        let l = r#"data: {"choices":[{"delta":{"reasoning_content":"hm"},"finish_reason":"length"}]}"#;
        assert_eq!(
            sse_line(l),
            vec![Piece::Reasoning("hm".into()), Piece::Finish("length".into())]
        );
        assert!(sse_line("data: [DONE]").is_empty());
        assert!(sse_line(": keep-alive").is_empty());
    }
}
