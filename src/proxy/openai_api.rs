//! OpenAI chat completions: request → conversation, answer as JSON or as SSE chunks
//! (`data: {...}` lines, tool-call deltas per call index, optional usage chunk, `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};

use super::capture::{prepare, prepare_raw, Outcome, Trial};
use super::flight::{run, run_streaming, Progress};
use super::routes::{error_response, Api};
use super::{ProxyError, State};
use crate::chat::openai::{ChatCompletionRequest, StringOrList};
use crate::chat::{RenderOptions, StreamEvent};
use crate::records::Sampling;

fn sampling(state: &State, req: &ChatCompletionRequest) -> Sampling {
    // The distribution's fields (temperature, top_p, top_k, min_p, seed, penalties) are read
    // from the raw request by `harness_sampling::enforce`, for both APIs alike.
    let mut s = state.cfg.sampling.clone();
    if let Some(m) = req.max_tokens {
        s.max_tokens = Some(m.min(s.max_tokens.unwrap_or(u32::MAX)));
    }
    s.stop = req.stop.clone().map_or_else(Vec::new, StringOrList::into_vec);
    s
}

pub(crate) async fn chat_completions(
    state: Arc<State>,
    trial: Arc<Trial>,
    body: Bytes,
    retry: u32,
) -> Response {
    let fail = |e: ProxyError| error_response(Api::OpenAi, &e);
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return fail(ProxyError::BadRequest(format!(
                "request body is not valid JSON: {e}"
            )))
        }
    };
    let req: ChatCompletionRequest = match serde_json::from_value(raw.clone()) {
        Ok(r) => r,
        Err(e) => return fail(ProxyError::BadRequest(format!("invalid request: {e}"))),
    };
    if req.n.is_some_and(|n| n != 1) {
        return fail(ProxyError::BadRequest("only n=1 is supported".into()));
    }
    let conv = match req.to_conversation() {
        Ok(c) => c,
        Err(e) => return fail(ProxyError::BadRequest(format!("{e:#}"))),
    };
    let mut opts = RenderOptions::generation(conv.thinking);
    if let Some(kw) = &req.chat_template_kwargs {
        opts.extra = kw.clone();
        opts.extra.remove("enable_thinking");
    }
    let model = if req.model.is_empty() {
        state.cfg.model_name.clone()
    } else {
        req.model.clone()
    };
    let s = sampling(&state, &req);
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let prepared = match prepare(&state, &trial, "openai", raw, conv, opts, s, retry) {
        Ok(p) => p,
        Err(e) => return error_response(Api::OpenAi, &e),
    };
    if !req.stream {
        return match run(&state, prepared).await {
            Ok(out) => Json(completion(&model, &out)).into_response(),
            Err(e) => fail(e),
        };
    }
    // Streaming: headers go out at once; the generation runs in a task that sends parsed pieces
    // as the engine produces tokens. A client that disconnects drops the receiver, which cancels
    // the generation (the capture records `client_disconnected`).
    let chunker = Chunker {
        id: format!("chatcmpl-{}", prepared.index()),
        created: now(),
        model,
        include_usage,
    };
    let rx = run_streaming(state, prepared);
    let head =
        futures::stream::iter([chunker.chunk(json!({"role": "assistant", "content": ""}), Value::Null)]);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx)
        .flat_map(move |p| futures::stream::iter(chunker.progress(p)));
    Sse::new(head.chain(body).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Builds the `chat.completion.chunk` events of one streamed answer.
struct Chunker {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Chunker {
    fn chunk(&self, delta: Value, finish: Value) -> Event {
        let mut c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]});
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        Event::default().data(c.to_string())
    }

    fn progress(&self, p: Progress) -> Vec<Event> {
        match p {
            Progress::Event(StreamEvent::Reasoning(r)) => {
                vec![self.chunk(json!({"reasoning_content": r}), Value::Null)]
            }
            Progress::Event(StreamEvent::Text(t)) => vec![self.chunk(json!({"content": t}), Value::Null)],
            Progress::Event(StreamEvent::ToolCall { index, call }) => vec![
                self.chunk(
                    json!({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": ""}}]}),
                    Value::Null,
                ),
                self.chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]}),
                    Value::Null,
                ),
            ],
            Progress::Done(Ok(out)) => {
                let mut v = vec![self.chunk(json!({}), json!(finish_reason(&out)))];
                if self.include_usage {
                    let u = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage(&out)});
                    v.push(Event::default().data(u.to_string()));
                }
                v.push(Event::default().data("[DONE]"));
                v
            }
            Progress::Done(Err(e)) => vec![
                Event::default().data(error_json(&e).to_string()),
                Event::default().data("[DONE]"),
            ],
        }
    }
}

fn error_json(e: &ProxyError) -> Value {
    json!({"error": {"message": e.to_string(), "type": "server_error", "param": null, "code": null}})
}

fn finish_reason(out: &Outcome) -> &'static str {
    if !out.parsed.tool_calls.is_empty() {
        "tool_calls"
    } else {
        match out.finish {
            crate::engine::FinishReason::Length => "length",
            _ => "stop",
        }
    }
}

fn usage(out: &Outcome) -> Value {
    json!({"prompt_tokens": out.prompt_tokens, "completion_tokens": out.output_tokens,
           "total_tokens": out.prompt_tokens + out.output_tokens})
}

fn id(out: &Outcome) -> String {
    format!("chatcmpl-{}", out.index)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn completion(model: &str, out: &Outcome) -> Value {
    let p = &out.parsed;
    let mut message = json!({"role": "assistant", "content": if p.content.is_empty() && !p.tool_calls.is_empty() { Value::Null } else { json!(p.content) }});
    if let Some(r) = &p.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if !p.tool_calls.is_empty() {
        message["tool_calls"] = p
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    json!({
        "id": id(out), "object": "chat.completion", "created": now(), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(out), "logprobs": null}],
        "usage": usage(out),
    })
}

/// `POST /v1/completions`: a plain-text prompt (string, one-element list, or token ids),
/// continued without a chat template; the answer is raw text (`text_completion` objects).
pub(crate) async fn completions(state: Arc<State>, trial: Arc<Trial>, body: Bytes, retry: u32) -> Response {
    let fail = |e: ProxyError| error_response(Api::OpenAi, &e);
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return fail(ProxyError::BadRequest(format!(
                "request body is not valid JSON: {e}"
            )))
        }
    };
    let prompt_ids = match completion_prompt(&state, &raw["prompt"]) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    if raw["n"].as_u64().is_some_and(|n| n != 1) {
        return fail(ProxyError::BadRequest("only n=1 is supported".into()));
    }
    if raw["echo"].as_bool() == Some(true) {
        return fail(ProxyError::BadRequest("echo is not supported".into()));
    }
    let mut s = state.cfg.sampling.clone();
    // OpenAI's documented default for completions is 16 tokens.
    let max = raw["max_tokens"]
        .as_u64()
        .map_or(16, |m| m.min(u32::MAX as u64) as u32);
    s.max_tokens = Some(max.min(s.max_tokens.unwrap_or(u32::MAX)));
    s.stop = match &raw["stop"] {
        Value::String(x) => vec![x.clone()],
        Value::Array(v) => v.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        _ => vec![],
    };
    let model = raw["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .unwrap_or(&state.cfg.model_name)
        .to_string();
    let stream = raw["stream"].as_bool().unwrap_or(false);
    let include_usage = raw["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let prepared = match prepare_raw(&state, &trial, "openai-completions", raw, prompt_ids, s, retry) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let id = format!("cmpl-{}", prepared.index());
    let created = now();
    if !stream {
        return match run(&state, prepared).await {
            Ok(out) => Json(json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": out.parsed.content, "logprobs": null,
                    "finish_reason": finish_reason(&out)}],
                "usage": usage(&out),
            }))
            .into_response(),
            Err(e) => fail(e),
        };
    }
    let chunk = move |text: &str, finish: Value, usage: Option<Value>| {
        let choices = if usage.is_some() {
            json!([])
        } else {
            json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}])
        };
        let mut c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": choices});
        if include_usage {
            c["usage"] = usage.unwrap_or(Value::Null);
        }
        Event::default().data(c.to_string())
    };
    let rx = run_streaming(state, prepared);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).flat_map(move |p| {
        let events = match p {
            Progress::Event(StreamEvent::Text(t)) => vec![chunk(&t, Value::Null, None)],
            Progress::Event(_) => vec![],
            Progress::Done(Ok(out)) => {
                let mut v = vec![chunk("", json!(finish_reason(&out)), None)];
                if include_usage {
                    v.push(chunk("", Value::Null, Some(usage(&out))));
                }
                v.push(Event::default().data("[DONE]"));
                v
            }
            Progress::Done(Err(e)) => vec![
                Event::default().data(error_json(&e).to_string()),
                Event::default().data("[DONE]"),
            ],
        };
        futures::stream::iter(events)
    });
    Sse::new(body.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The prompt of a completions request as token ids.
fn completion_prompt(state: &State, prompt: &Value) -> Result<Vec<u32>, ProxyError> {
    let bad = |m: &str| ProxyError::BadRequest(format!("prompt: {m}"));
    let ids = |v: &[Value]| -> Option<Vec<u32>> {
        v.iter()
            .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect()
    };
    match prompt {
        Value::String(s) => state.chat.encode(s).map_err(|e| bad(&format!("{e:#}"))),
        Value::Array(v) if v.is_empty() => Err(bad("empty")),
        Value::Array(v) if v.len() == 1 && !v[0].is_number() => completion_prompt(state, &v[0]),
        Value::Array(v) if v.iter().all(Value::is_number) => {
            ids(v).ok_or_else(|| bad("token ids must be non-negative integers"))
        }
        Value::Array(_) => Err(bad("only one prompt per request is supported (n=1)")),
        Value::Null => Err(bad("missing")),
        _ => Err(bad(
            "must be a string, a list of one string, or a list of token ids",
        )),
    }
}
