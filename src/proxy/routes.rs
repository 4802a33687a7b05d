//! HTTP routes: plain and `/t/{token}` prefixed paths, body limits, trial lookup.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::json;

use super::capture::Trial;
use super::{anthropic_api, openai_api, ProxyError, State};

type S = Arc<State>;

pub(crate) fn router(state: S) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/completions", post(openai_completions))
        .route("/v1/messages", post(anthropic_messages))
        .route("/v1/messages/count_tokens", post(anthropic_count))
        .route("/v1/models", get(models))
        .route("/", any(root));
    let prefixed = Router::new()
        .route("/t/{token}/v1/chat/completions", post(openai_chat_t))
        .route("/t/{token}/v1/completions", post(openai_completions_t))
        .route("/t/{token}/v1/messages", post(anthropic_messages_t))
        .route("/t/{token}/v1/messages/count_tokens", post(anthropic_count_t))
        .route("/t/{token}/v1/models", get(models_t))
        .route("/t/{token}", any(root_t))
        .route("/t/{token}/", any(root_t));
    api.merge(prefixed)
        // Bodies are read with our own limit so the 413 comes in the API's error format.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// Which API's error format to answer in.
#[derive(Clone, Copy)]
pub(crate) enum Api {
    OpenAi,
    Anthropic,
}

pub(crate) fn error_response(api: Api, err: &ProxyError) -> Response {
    let (status, otype, atype) = match err {
        ProxyError::UnknownTrial => (
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "authentication_error",
        ),
        ProxyError::TooLarge { .. } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
        ),
        ProxyError::BadRequest(_) | ProxyError::ContextLength { .. } => (
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request_error",
        ),
        ProxyError::Backend(_) => (StatusCode::BAD_GATEWAY, "server_error", "overloaded_error"),
    };
    match api {
        Api::OpenAi => {
            let (message, param, code) = match err {
                ProxyError::UnknownTrial => (err.to_string(), json!(null), json!("invalid_api_key")),
                // OpenAI's own words and code; clients (litellm, the OpenAI SDK's users) match
                // `context_length_exceeded`.
                &ProxyError::ContextLength { prompt, context } => (
                    format!(
                        "This model's maximum context length is {context} tokens. However, your \
                         messages resulted in {prompt} tokens. Please reduce the length of the \
                         messages."
                    ),
                    json!("messages"),
                    json!("context_length_exceeded"),
                ),
                _ => (err.to_string(), json!(null), json!(null)),
            };
            (
                status,
                Json(json!({"error": {"message": message, "type": otype, "param": param, "code": code}})),
            )
                .into_response()
        }
        Api::Anthropic => {
            // Anthropic signals an unavailable model service with 529 overloaded_error.
            let status = if matches!(err, ProxyError::Backend(_)) {
                StatusCode::from_u16(529).expect("valid")
            } else {
                status
            };
            let message = match err {
                // Anthropic's exact words: Claude Code matches
                // /^prompt is too long: \d+ tokens > \d+ maximum$/ and compacts by the gap. The
                // maximum is the longest prompt accepted (one position is left to generate in).
                &ProxyError::ContextLength { prompt, context } => format!(
                    "prompt is too long: {prompt} tokens > {} maximum",
                    context.saturating_sub(1)
                ),
                _ => err.to_string(),
            };
            (
                status,
                Json(json!({"type": "error", "error": {"type": atype, "message": message}})),
            )
                .into_response()
        }
    }
}

fn trial(state: &State, token: Option<&str>) -> Result<Arc<Trial>, ProxyError> {
    let trials = state.trials.lock().expect("invariant: lock not poisoned");
    match token {
        Some(t) => trials.get(t).cloned().ok_or(ProxyError::UnknownTrial),
        None if state.cfg.allow_anonymous => trials.get("anonymous").cloned().ok_or(ProxyError::UnknownTrial),
        None => Err(ProxyError::UnknownTrial),
    }
}

/// The retry a request says it is (`x-stainless-retry-count`, sent by the official OpenAI and
/// Anthropic SDKs; 0 for a first attempt or a client that does not say).
fn retry(headers: &HeaderMap) -> u32 {
    headers
        .get("x-stainless-retry-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

pub(crate) async fn read_body(state: &State, body: Body) -> Result<Bytes, ProxyError> {
    let limit = state.cfg.max_body_bytes;
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ProxyError::TooLarge { limit })
}

async fn openai_chat(AxState(s): AxState<S>, headers: HeaderMap, body: Body) -> Response {
    dispatch_openai(s, None, retry(&headers), body).await
}
async fn openai_chat_t(
    AxState(s): AxState<S>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    dispatch_openai(s, Some(token), retry(&headers), body).await
}
async fn openai_completions(AxState(s): AxState<S>, headers: HeaderMap, body: Body) -> Response {
    dispatch_completions(s, None, retry(&headers), body).await
}
async fn openai_completions_t(
    AxState(s): AxState<S>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    dispatch_completions(s, Some(token), retry(&headers), body).await
}
async fn dispatch_openai(s: S, token: Option<String>, retry: u32, body: Body) -> Response {
    let t = match trial(&s, token.as_deref()) {
        Ok(t) => t,
        Err(e) => return error_response(Api::OpenAi, &e),
    };
    match read_body(&s, body).await {
        Ok(bytes) => openai_api::chat_completions(s, t, bytes, retry).await,
        Err(e) => error_response(Api::OpenAi, &e),
    }
}
async fn dispatch_completions(s: S, token: Option<String>, retry: u32, body: Body) -> Response {
    let t = match trial(&s, token.as_deref()) {
        Ok(t) => t,
        Err(e) => return error_response(Api::OpenAi, &e),
    };
    match read_body(&s, body).await {
        Ok(bytes) => openai_api::completions(s, t, bytes, retry).await,
        Err(e) => error_response(Api::OpenAi, &e),
    }
}

async fn anthropic_messages(AxState(s): AxState<S>, headers: HeaderMap, body: Body) -> Response {
    dispatch_anthropic(s, None, retry(&headers), body, false).await
}
async fn anthropic_messages_t(
    AxState(s): AxState<S>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    dispatch_anthropic(s, Some(token), retry(&headers), body, false).await
}
async fn anthropic_count(AxState(s): AxState<S>, headers: HeaderMap, body: Body) -> Response {
    dispatch_anthropic(s, None, retry(&headers), body, true).await
}
async fn anthropic_count_t(
    AxState(s): AxState<S>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    dispatch_anthropic(s, Some(token), retry(&headers), body, true).await
}
async fn dispatch_anthropic(s: S, token: Option<String>, retry: u32, body: Body, count: bool) -> Response {
    let t = match trial(&s, token.as_deref()) {
        Ok(t) => t,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    let bytes = match read_body(&s, body).await {
        Ok(b) => b,
        Err(e) => return error_response(Api::Anthropic, &e),
    };
    if count {
        anthropic_api::count_tokens(s, bytes).await
    } else {
        anthropic_api::messages(s, t, bytes, retry).await
    }
}

async fn models(AxState(s): AxState<S>) -> Response {
    models_for(&s, None)
}
async fn models_t(AxState(s): AxState<S>, Path(token): Path<String>) -> Response {
    models_for(&s, Some(token))
}
fn models_for(s: &State, token: Option<String>) -> Response {
    if let Err(e) = trial(s, token.as_deref()) {
        return error_response(Api::OpenAi, &e);
    }
    Json(json!({"object": "list", "data": [{
        "id": s.cfg.model_name, "object": "model", "created": 0, "owned_by": "lego-rl",
        "type": "model", "display_name": s.cfg.model_name,
    }]}))
    .into_response()
}

/// `HEAD /` (Claude Code probes it at start) and `GET /` answer 200.
async fn root(method: Method) -> Response {
    root_answer(method)
}
async fn root_t(method: Method) -> Response {
    root_answer(method)
}
fn root_answer(method: Method) -> Response {
    if method == Method::HEAD {
        StatusCode::OK.into_response()
    } else {
        (StatusCode::OK, "lego-rl proxy\n").into_response()
    }
}
