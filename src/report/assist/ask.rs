//! The live UI's Ask box on the server side: the prompt shown on request, the streamed answer,
//! and saved conversations.
//!
//! A conversation is the prompt (the condensed record and the first question) followed by
//! `history`: the answers and follow-up questions since, ending with the question to answer.
//! Saved conversations are appended, one JSON object per line (`lego-rl/conversation/v1`, see
//! man/lego-rl-formats.md), to the conversations file with one `write` of the whole line.

use std::convert::Infallible;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::prompt::{self, AssistPrompt, DEFAULT_QUESTION};
use super::{AssistError, Assistant, ChatTurn, Piece};
use crate::report::data::TrajDetail;

/// Schema of a saved conversation line.
pub const CONVERSATION_SCHEMA: &str = "lego-rl/conversation/v1";

/// The assistant of a live UI and where its conversations go.
#[derive(Clone)]
pub struct Assist {
    pub assistant: Arc<Assistant>,
    pub conversations: PathBuf,
}

/// What the page learns about the assistant (in `/api/summary` as `assistant`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssistantInfo {
    pub label: String,
    pub context: usize,
    pub max_tokens: u32,
    pub default_question: &'static str,
    pub conversations: String,
}

#[derive(Debug, Deserialize)]
pub struct PromptQuery {
    pub id: String,
    pub question: Option<String>,
}

/// `POST /api/ask`.
#[derive(Debug, Deserialize)]
pub struct AskRequest {
    pub id: String,
    /// The first question (default: [`DEFAULT_QUESTION`]).
    #[serde(default)]
    pub question: Option<String>,
    /// Answers and follow-ups after the first question, ending with the one to answer.
    #[serde(default)]
    pub history: Vec<ChatTurn>,
}

/// A saved conversation.
#[derive(Debug, Serialize, Deserialize)]
pub struct Conversation {
    pub schema: String,
    pub saved_at: String,
    pub trajectory_id: String,
    pub assistant: String,
    pub prompt: Value,
    pub turns: Vec<ChatTurn>,
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// An error answered as `{"error": {"message": ...}}` with `status` (every JSON endpoint of
/// the live UI).
pub(crate) fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    json_response(status, json!({ "error": { "message": msg.to_string() } }))
}

fn event(name: &str, v: Value) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(v.to_string()))
}

impl Assist {
    pub fn info(&self) -> AssistantInfo {
        AssistantInfo {
            label: self.assistant.label().to_string(),
            context: self.assistant.context,
            max_tokens: self.assistant.max_tokens,
            default_question: DEFAULT_QUESTION,
            conversations: self.conversations.display().to_string(),
        }
    }

    fn prompt(
        &self,
        d: &TrajDetail,
        question: &str,
        history: &[ChatTurn],
    ) -> Result<AssistPrompt, AssistError> {
        let budget = self.assistant.prompt_budget(history)?;
        Ok(prompt::build(d, question, budget, &self.assistant.counter))
    }

    /// `GET /api/ask/prompt`: the exact prompt, as JSON.
    pub fn prompt_response(&self, d: &TrajDetail, question: Option<&str>) -> Response {
        match self.prompt(d, question.unwrap_or(DEFAULT_QUESTION), &[]) {
            Ok(p) => json_response(StatusCode::OK, json!(p)),
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        }
    }

    /// `POST /api/ask`: the answer as server-sent events.
    pub async fn answer(&self, d: TrajDetail, q: AskRequest) -> Response {
        if let Some(t) = q
            .history
            .iter()
            .find(|t| t.role != "user" && t.role != "assistant")
        {
            return error(
                StatusCode::BAD_REQUEST,
                format!("history: role `{}` is neither user nor assistant", t.role),
            );
        }
        let question = q.question.as_deref().unwrap_or(DEFAULT_QUESTION);
        let p = match self.prompt(&d, question, &q.history) {
            Ok(p) => p,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
        // The exact prompt first: the page shows it and saves it with the conversation.
        let head = event("prompt", json!(p));
        let messages = Assistant::messages(&p, &q.history);
        let body: futures::stream::BoxStream<'static, Result<Event, Infallible>> =
            match self.assistant.stream(messages).await {
                Err(e) => futures::stream::iter([event("error", json!({"message": e.to_string()}))]).boxed(),
                Ok(pieces) => pieces
                    .map(|p| match p {
                        Ok(Piece::Text(t)) => event("delta", json!({ "text": t })),
                        Ok(Piece::Reasoning(t)) => event("reasoning", json!({ "text": t })),
                        Ok(Piece::Finish(f)) => event("finish", json!({ "finish_reason": f })),
                        Err(e) => event("error", json!({"message": e.to_string()})),
                    })
                    .boxed(),
            };
        let end = futures::stream::iter([event("end", json!({}))]);
        let all = futures::stream::iter([head]).chain(body).chain(end);
        Sse::new(all).keep_alive(KeepAlive::default()).into_response()
    }

    /// `POST /api/conversations`: validates and appends one conversation.
    pub fn save(&self, body: &[u8]) -> Response {
        let v: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
        };
        let Some(id) = v["id"].as_str().filter(|s| !s.is_empty()) else {
            return error(StatusCode::BAD_REQUEST, "field `id`: expected a trajectory id");
        };
        let turns: Vec<ChatTurn> = match serde_json::from_value(v["turns"].clone()) {
            Ok(t) => t,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("field `turns`: {e}")),
        };
        if turns.is_empty() || turns.iter().any(|t| t.role != "user" && t.role != "assistant") {
            return error(
                StatusCode::BAD_REQUEST,
                "field `turns`: expected user and assistant turns",
            );
        }
        let record = Conversation {
            schema: CONVERSATION_SCHEMA.into(),
            saved_at: chrono::Utc::now().to_rfc3339(),
            trajectory_id: id.into(),
            assistant: self.assistant.label().into(),
            prompt: v["prompt"].clone(),
            turns,
        };
        match append_line(&self.conversations, &record) {
            Ok(()) => json_response(
                StatusCode::OK,
                json!({"saved": self.conversations.display().to_string(), "turns": record.turns.len()}),
            ),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{}: {e}", self.conversations.display()),
            ),
        }
    }
}

/// Appends `record` as one line with a single `write` (O_APPEND), then syncs it.
fn append_line(path: &std::path::Path, record: &impl Serialize) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(&line)?;
    f.sync_data()
}
