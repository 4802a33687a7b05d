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

use super::capture::{prepare, run, Outcome, Trial};
use super::routes::{error_response, Api};
use super::{ProxyError, State};
use crate::chat::anthropic::MessagesRequest;
use crate::chat::{Conversation, RenderOptions};
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

pub(crate) async fn messages(state: Arc<State>, trial: Arc<Trial>, body: Bytes) -> Response {
    let (raw, req, conv) = match parse(&state, &body) {
        Ok(x) => x,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    let opts = RenderOptions::generation(conv.thinking);
    let mut s: Sampling = state.cfg.sampling.clone();
    if let Some(t) = req.temperature {
        s.temperature = Some(t);
    }
    if let Some(p) = req.top_p {
        s.top_p = Some(p);
    }
    if let Some(k) = req.top_k {
        s.top_k = Some(k);
    }
    if let Some(m) = req.max_tokens {
        s.max_tokens = Some(m.min(s.max_tokens.unwrap_or(u32::MAX)));
    }
    s.stop = req.stop_sequences.clone();
    let model = if req.model.is_empty() {
        state.cfg.model_name.clone()
    } else {
        req.model.clone()
    };
    let prepared = match prepare(&state, &trial, "anthropic", raw, conv, opts, s) {
        Ok(p) => p,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    let fut = {
        let state = state.clone();
        async move { run(&state, prepared).await }
    };
    if !req.stream {
        return match fut.await {
            Ok(out) => Json(message(&model, &out)).into_response(),
            Err(e) => error_response(Api::Anthropic, &e),
        };
    }
    let stream = futures::stream::once(fut).flat_map(move |res| {
        let events = match res {
            Ok(out) => events(&model, &out),
            Err(e) => {
                let etype = if matches!(e, ProxyError::Backend(_)) {
                    "overloaded_error"
                } else {
                    "invalid_request_error"
                };
                vec![Event::default().event("error").data(
                    json!({"type": "error", "error": {"type": etype, "message": e.to_string()}}).to_string(),
                )]
            }
        };
        futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

fn stop_reason(out: &Outcome) -> &'static str {
    if !out.parsed.tool_calls.is_empty() {
        "tool_use"
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
        "content": blocks(out), "stop_reason": stop_reason(out), "stop_sequence": null,
        "usage": {"input_tokens": out.prompt_tokens, "output_tokens": out.output_tokens},
    })
}

fn events(model: &str, out: &Outcome) -> Vec<Event> {
    let ev = |name: &str, data: Value| Event::default().event(name).data(data.to_string());
    let mut v = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {
            "id": id(out), "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": out.prompt_tokens, "output_tokens": 1}}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    for (i, block) in blocks(out).into_iter().enumerate() {
        let (start, deltas) = match block["type"].as_str() {
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": SIGNATURE}),
                ],
            ),
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![json!({"type": "input_json_delta", "partial_json": block["input"].to_string()})],
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
        };
        v.push(ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": start}),
        ));
        for d in deltas {
            v.push(ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i, "delta": d}),
            ));
        }
        v.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        ));
    }
    v.push(ev(
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(out), "stop_sequence": null},
        "usage": {"output_tokens": out.output_tokens}}),
    ));
    v.push(ev("message_stop", json!({"type": "message_stop"})));
    v
}
