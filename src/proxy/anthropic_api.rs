//! Anthropic Messages: request → conversation, answer as JSON or as the documented SSE event
//! sequence: `message_start`, `ping`, per content block `content_block_start` →
//! `content_block_delta` (`thinking_delta` + `signature_delta`, `text_delta`, `input_json_delta`)
//! → `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};

use super::capture::{prepare, Outcome, Trial};
use super::flight::{run, run_streaming, Progress};
use super::routes::{error_response, Api};
use super::{ProxyError, State};
use crate::chat::anthropic::MessagesRequest;
use crate::chat::{Conversation, RenderOptions, StreamEvent};
use crate::records::Sampling;

/// Thinking blocks must carry a signature that harnesses echo back; ours is a fixed marker
/// (the proxy never validates it: it trusts only its own captures).
const SIGNATURE: &str = "lego-rl";

fn parse(state: &State, body: &Bytes) -> Result<(Value, MessagesRequest, Conversation), ProxyError> {
    let _ = state;
    let raw: Value = serde_json::from_slice(body)
        .map_err(|e| ProxyError::BadRequest(format!("request body is not valid JSON: {e}")))?;
    let req: MessagesRequest = serde_json::from_value(raw.clone())
        .map_err(|e| ProxyError::BadRequest(format!("invalid request: {e}")))?;
    let conv = req
        .to_conversation()
        .map_err(|e| ProxyError::BadRequest(format!("{e:#}")))?;
    Ok((raw, req, conv))
}

pub(crate) async fn count_tokens(state: Arc<State>, body: Bytes) -> Response {
    let result = parse(&state, &body).and_then(|(_, _, conv)| {
        let opts = RenderOptions::generation(conv.thinking);
        state
            .chat
            .prompt_ids(&conv, &opts)
            .map_err(|e| ProxyError::BadRequest(format!("{e:#}")))
    });
    match result {
        Ok(ids) => Json(json!({"input_tokens": ids.len()})).into_response(),
        Err(e) => error_response(Api::Anthropic, &e),
    }
}

pub(crate) async fn messages(state: Arc<State>, trial: Arc<Trial>, body: Bytes, retry: u32) -> Response {
    let (raw, req, conv) = match parse(&state, &body) {
        Ok(x) => x,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    let opts = RenderOptions::generation(conv.thinking);
    // temperature, top_p and top_k are read from the raw request by
    // `harness_sampling::enforce`, as for OpenAI's API.
    let mut s: Sampling = state.cfg.sampling.clone();
    if let Some(m) = req.max_tokens {
        s.max_tokens = Some(m.min(s.max_tokens.unwrap_or(u32::MAX)));
    }
    s.stop = req.stop_sequences.clone();
    let model = if req.model.is_empty() {
        state.cfg.model_name.clone()
    } else {
        req.model.clone()
    };
    let prepared = match prepare(&state, &trial, "anthropic", raw, conv, opts, s, retry) {
        Ok(p) => p,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    if !req.stream {
        return match run(&state, prepared).await {
            Ok(out) => Json(message(&model, &out)).into_response(),
            Err(e) => error_response(Api::Anthropic, &e),
        };
    }
    // Streaming: blocks open and close as the parsed output changes kind, token by token; a
    // client that disconnects cancels the generation (see `run_streaming`).
    let mut writer = Writer {
        id: format!("msg_lego{:08}", prepared.index()),
        open: None,
        next: 0,
    };
    let head = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": writer.id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": prepared.prompt_tokens(), "output_tokens": 1}}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    let rx = run_streaming(state, prepared);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx)
        .flat_map(move |p| futures::stream::iter(writer.progress(p)));
    Sse::new(futures::stream::iter(head).chain(body).map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn ev(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// Turns parsed output pieces into the documented content-block events.
struct Writer {
    id: String,
    /// The kind and index of the open content block.
    open: Option<(&'static str, usize)>,
    next: usize,
}

impl Writer {
    fn start(&mut self, v: &mut Vec<Event>, kind: &'static str, block: Value) -> usize {
        self.close(v);
        let i = self.next;
        self.next += 1;
        v.push(ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        ));
        self.open = Some((kind, i));
        i
    }

    /// Opens a block of `kind` unless one is open; returns its index.
    fn ensure(&mut self, v: &mut Vec<Event>, kind: &'static str) -> usize {
        match self.open {
            Some((k, i)) if k == kind => i,
            _ => {
                let block = match kind {
                    "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                    _ => json!({"type": "text", "text": ""}),
                };
                self.start(v, kind, block)
            }
        }
    }

    fn close(&mut self, v: &mut Vec<Event>) {
        if let Some((kind, i)) = self.open.take() {
            if kind == "thinking" {
                v.push(delta(
                    i,
                    json!({"type": "signature_delta", "signature": SIGNATURE}),
                ));
            }
            v.push(ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
    }

    fn progress(&mut self, p: Progress) -> Vec<Event> {
        let mut v = Vec::new();
        match p {
            Progress::Event(StreamEvent::Reasoning(r)) => {
                let i = self.ensure(&mut v, "thinking");
                v.push(delta(i, json!({"type": "thinking_delta", "thinking": r})));
            }
            Progress::Event(StreamEvent::Text(t)) => {
                let i = self.ensure(&mut v, "text");
                v.push(delta(i, json!({"type": "text_delta", "text": t})));
            }
            Progress::Event(StreamEvent::ToolCall { call, .. }) => {
                let block = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
                let i = self.start(&mut v, "tool_use", block);
                let input = call.arguments_json().unwrap_or_else(|| json!({}));
                v.push(delta(
                    i,
                    json!({"type": "input_json_delta", "partial_json": input.to_string()}),
                ));
                self.close(&mut v);
            }
            Progress::Done(Ok(out)) => {
                if self.next == 0 {
                    // Every message has at least one content block.
                    self.ensure(&mut v, "text");
                }
                self.close(&mut v);
                v.push(ev(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(&out), "stop_sequence": out.parsed.stop},
                        "usage": {"output_tokens": out.output_tokens}}),
                ));
                v.push(ev("message_stop", json!({"type": "message_stop"})));
            }
            Progress::Done(Err(e)) => {
                let etype = if matches!(e, ProxyError::Backend(_)) {
                    "overloaded_error"
                } else {
                    "invalid_request_error"
                };
                v.push(ev(
                    "error",
                    json!({"type": "error", "error": {"type": etype, "message": e.to_string()}}),
                ));
            }
        }
        v
    }
}

fn delta(index: usize, d: Value) -> Event {
    ev(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": d}),
    )
}

fn stop_reason(out: &Outcome) -> &'static str {
    if !out.parsed.tool_calls.is_empty() {
        "tool_use"
    } else if out.parsed.stop.is_some() {
        "stop_sequence"
    } else if out.finish == crate::engine::FinishReason::Length {
        "max_tokens"
    } else {
        "end_turn"
    }
}

fn id(out: &Outcome) -> String {
    format!("msg_lego{:08}", out.index)
}

fn blocks(out: &Outcome) -> Vec<Value> {
    let p = &out.parsed;
    let mut blocks = Vec::new();
    if let Some(r) = &p.reasoning {
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": SIGNATURE}));
    }
    if !p.content.is_empty() || p.tool_calls.is_empty() {
        blocks.push(json!({"type": "text", "text": p.content}));
    }
    for c in &p.tool_calls {
        let input = c.arguments_json().unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
    }
    blocks
}

fn message(model: &str, out: &Outcome) -> Value {
    json!({
        "id": id(out), "type": "message", "role": "assistant", "model": model,
        "content": blocks(out), "stop_reason": stop_reason(out), "stop_sequence": out.parsed.stop,
        "usage": {"input_tokens": out.prompt_tokens, "output_tokens": out.output_tokens},
    })
}
