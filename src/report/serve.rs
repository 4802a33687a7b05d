//! The live UI: a read-only axum server (localhost by default) serving the report page and JSON
//! endpoints, re-reading the run's files when they change. Growing zstd files are read up to
//! their last complete frame (`TornTail::Stop`), so a producer appending right now is never an
//! error; a bad record is skipped and counted rather than taking the page down.
//!
//! - `GET /` the page (data embedded; it then polls)
//! - `GET /api/summary` [`data::ReportData`] without details
//! - `GET /api/trajectory?id=<id>` one trajectory's detail (404 when absent)
//! - with `--assistant` only (404 otherwise: nothing is sent anywhere without one):
//!   `GET /api/ask/prompt?id=<id>[&question=]` the exact prompt the assistant would get,
//!   `POST /api/ask` `{id, question, history}` its answer as server-sent events (`prompt` with
//!   the exact prompt, then `reasoning` / `delta` pieces, `finish`, any `error`, and `end`),
//!   `POST /api/conversations` `{id, prompt, turns}` appends a conversation to the
//!   conversations file (see [`super::assist`]).
//!
//! Every request passes [`super::guard`] first: `Host` must be the bound address (or `--token`
//! given), and a `POST` needs a same-origin `Origin` and a JSON body.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::advisories::{advise, Thresholds};
use super::assist::ask;
use super::data;
use super::guard::{self, Guard};
use super::{html, ReportError};
use crate::io::{ReadOptions, TornTail};
use crate::validate::run::RunFiles;

/// What identifies the state of a run's files: each path with its length and mtime.
type Signature = Vec<(PathBuf, u64, Option<SystemTime>)>;

struct Served {
    run: PathBuf,
    thresholds: Thresholds,
    cache: Mutex<Option<(Signature, Arc<String>)>>,
    assist: Option<ask::Assist>,
}

/// What the live UI serves beyond the run's files.
#[derive(Default)]
pub struct LiveOptions {
    /// The diagnostic assistant and where its conversations are saved.
    pub assist: Option<ask::Assist>,
    /// `--token`: needed for every request; allows binding beyond loopback (see [`guard`]).
    pub token: Option<String>,
}

const OPTS: ReadOptions = ReadOptions {
    strict: false,
    torn_tail: TornTail::Stop,
};

fn signature(files: &RunFiles) -> Signature {
    let all = files
        .trajectories
        .iter()
        .chain(&files.samples)
        .chain(&files.align_stats)
        .chain(&files.eval)
        .chain(&files.pool)
        .chain(&files.pool_decisions)
        .map(|(_, p)| p)
        .chain(&files.metrics)
        .chain(&files.validation);
    all.map(|p| {
        let m = std::fs::metadata(p).ok();
        (
            p.clone(),
            m.as_ref().map_or(0, |m| m.len()),
            m.and_then(|m| m.modified().ok()),
        )
    })
    .collect()
}

impl Served {
    /// The summary JSON, rebuilt only when a file changed.
    fn summary(&self) -> Result<Arc<String>, ReportError> {
        let files = RunFiles::discover(&self.run, true)?;
        let sig = signature(&files);
        if let Ok(cache) = self.cache.lock() {
            if let Some((s, json)) = cache.as_ref() {
                if *s == sig {
                    return Ok(json.clone());
                }
            }
        }
        let mut d = data::build(&files, OPTS, None)?;
        d.advisories = advise(&d.steps, &self.thresholds);
        d.assistant = self.assist.as_ref().map(ask::Assist::info);
        let json = Arc::new(html::script_json(&d)?);
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((sig, json.clone()));
        }
        Ok(json)
    }
}

fn error_response(e: impl std::fmt::Display) -> Response {
    ask::error(StatusCode::INTERNAL_SERVER_ERROR, e)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ReportError> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(error_response(e)),
        Err(e) => Err(error_response(e)),
    }
}

async fn index(State(s): State<Arc<Served>>) -> Response {
    let s2 = s.clone();
    match blocking(move || s2.summary()).await {
        Ok(json) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html::page_with_json(&json),
        )
            .into_response(),
        Err(r) => r,
    }
}

async fn summary(State(s): State<Arc<Served>>) -> Response {
    match blocking(move || s.summary()).await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json.to_string()).into_response(),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct IdQuery {
    id: String,
}

async fn trajectory(State(s): State<Arc<Served>>, Query(q): Query<IdQuery>) -> Response {
    let run = s.run.clone();
    let id = q.id.clone();
    let found = blocking(move || {
        let files = RunFiles::discover(&run, true)?;
        let d = data::find_detail(&files, OPTS, &id)?;
        d.map(|d| html::script_json(&d)).transpose()
    })
    .await;
    match found {
        Ok(Some(json)) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(None) => not_found(format!("no trajectory `{}`", q.id)),
        Err(r) => r,
    }
}

fn not_found(msg: String) -> Response {
    ask::error(StatusCode::NOT_FOUND, msg)
}

/// One trajectory's detail for the assistant (404 without an assistant or the trajectory).
async fn detail_for_ask(s: &Arc<Served>, id: &str) -> Result<(data::TrajDetail, ask::Assist), Response> {
    let Some(assist) = s.assist.clone() else {
        return Err(not_found(
            "no assistant configured (start report --serve with --assistant)".into(),
        ));
    };
    let run = s.run.clone();
    let id2 = id.to_string();
    let d = blocking(move || {
        let files = RunFiles::discover(&run, true)?;
        Ok(data::find_detail(&files, OPTS, &id2)?)
    })
    .await?;
    match d {
        Some(d) => Ok((d, assist)),
        None => Err(not_found(format!("no trajectory `{id}`"))),
    }
}

async fn ask_prompt(State(s): State<Arc<Served>>, Query(q): Query<ask::PromptQuery>) -> Response {
    match detail_for_ask(&s, &q.id).await {
        Ok((d, assist)) => assist.prompt_response(&d, q.question.as_deref()),
        Err(r) => r,
    }
}

async fn ask_stream(State(s): State<Arc<Served>>, axum::Json(q): axum::Json<ask::AskRequest>) -> Response {
    match detail_for_ask(&s, &q.id).await {
        Ok((d, assist)) => assist.answer(d, q).await,
        Err(r) => r,
    }
}

async fn save_conversation(State(s): State<Arc<Served>>, body: axum::body::Bytes) -> Response {
    match &s.assist {
        Some(a) => a.save(&body),
        None => not_found("no assistant configured (start report --serve with --assistant)".into()),
    }
}

/// The router of the live UI for `run`, with run-health advisories under `thresholds`, every
/// request checked by `guard`.
pub fn router(run: &Path, thresholds: Thresholds, live: LiveOptions, guard: Guard) -> Router {
    let state = Arc::new(Served {
        run: run.to_path_buf(),
        thresholds,
        cache: Mutex::new(None),
        assist: live.assist,
    });
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/api/summary", get(summary))
        .route("/api/trajectory", get(trajectory))
        .route("/api/ask/prompt", get(ask_prompt))
        .route("/api/ask", post(ask_stream))
        .route("/api/conversations", post(save_conversation))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(guard),
            guard::middleware,
        ))
}

/// Serves `run` on `bind` until the process is stopped; `on_listen` gets the bound address
/// (useful with port 0).
pub async fn serve(
    run: &Path,
    bind: &str,
    thresholds: Thresholds,
    live: LiveOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ReportError> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|source| ReportError::Bind {
            bind: bind.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(ReportError::Serve)?;
    let guard = Guard::new(addr, live.token.clone())?;
    on_listen(addr);
    axum::serve(listener, router(run, thresholds, live, guard))
        .await
        .map_err(ReportError::Serve)
}
