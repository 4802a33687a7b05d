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

use super::capture::{prepare, run, Outcome, Trial};
use super::routes::{error_response, Api};
use super::{ProxyError, State};
use crate::chat::openai::{ChatCompletionRequest, StringOrList};
use crate::chat::RenderOptions;
use crate::records::Sampling;

fn sampling(state: &State, req: &ChatCompletionRequest) -> Sampling {
    let mut s = state.cfg.sampling.clone();
    if let Some(t) = req.temperature {
        s.temperature = Some(t);
    }
    if let Some(p) = req.top_p {
        s.top_p = Some(p);
    }
    if let Some(m) = req.max_tokens {
        s.max_tokens = Some(m.min(s.max_tokens.unwrap_or(u32::MAX)));
    }
    if let Some(seed) = req.seed {
        s.seed = Some(seed);
    }
    s.stop = match &req.stop {
        Some(StringOrList::One(x)) => vec![x.clone()],
        Some(StringOrList::Many(v)) => v.clone(),
        None => vec![],
    };
    s
}

pub(crate) async fn chat_completions(state: Arc<State>, trial: Arc<Trial>, body: Bytes) -> Response {
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
    let prepared = match prepare(&state, &trial, "openai", raw, conv, opts, s) {
        Ok(p) => p,
        Err(e) => return error_response(Api::OpenAi, &e),
    };
    let fut = {
        let state = state.clone();
        async move { run(&state, prepared).await }
    };
    if !req.stream {
        return match fut.await {
            Ok(out) => Json(completion(&model, &out)).into_response(),
            Err(e) => fail(e),
        };
    }
    // Streaming: headers go out at once; the generation runs inside the stream, so a client
    // that disconnects drops it (and the capture records `client_disconnected`).
    let stream = futures::stream::once(fut).flat_map(move |res| {
        let events: Vec<Event> = match res {
            Ok(out) => chunks(&model, &out, include_usage),
            Err(e) => vec![Event::default().data(error_json(&e).to_string())],
        };
        let done = Event::default().data("[DONE]");
        futures::stream::iter(events.into_iter().chain([done]).map(Ok::<_, Infallible>))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
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

fn chunks(model: &str, out: &Outcome, include_usage: bool) -> Vec<Event> {
    let created = now();
    let chunk = |delta: Value, finish: Value| {
        let mut c = json!({"id": id(out), "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]});
        if include_usage {
            c["usage"] = Value::Null;
        }
        Event::default().data(c.to_string())
    };
    let p = &out.parsed;
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    if let Some(r) = &p.reasoning {
        events.push(chunk(json!({"reasoning_content": r}), Value::Null));
    }
    if !p.content.is_empty() {
        events.push(chunk(json!({"content": p.content}), Value::Null));
    }
    for (i, c) in p.tool_calls.iter().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}),
            Value::Null,
        ));
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}),
            Value::Null,
        ));
    }
    events.push(chunk(json!({}), json!(finish_reason(out))));
    if include_usage {
        let u = json!({"id": id(out), "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage(out)});
        events.push(Event::default().data(u.to_string()));
    }
    events
}
