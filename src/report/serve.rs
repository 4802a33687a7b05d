//! The live UI: a read-only axum server (localhost by default) serving the report page and JSON
//! endpoints, re-reading the run's files when they change. Growing zstd files are read up to
//! their last complete frame (`TornTail::Stop`), so a producer appending right now is never an
//! error; a bad record is skipped and counted rather than taking the page down.
//!
//! - `GET /` the page (data embedded; it then polls)
//! - `GET /api/summary` [`data::ReportData`] without details
//! - `GET /api/trajectory?id=<id>` one trajectory's detail (404 when absent)

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::advisories::{advise, Thresholds};
use super::data;
use super::{html, ReportError};
use crate::io::{ReadOptions, TornTail};
use crate::validate::run::RunFiles;

/// What identifies the state of a run's files: each path with its length and mtime.
type Signature = Vec<(PathBuf, u64, Option<SystemTime>)>;

struct Served {
    run: PathBuf,
    thresholds: Thresholds,
    cache: Mutex<Option<(Signature, Arc<String>)>>,
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
        let json = Arc::new(html::script_json(&d)?);
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((sig, json.clone()));
        }
        Ok(json)
    }
}

fn error_response(e: impl std::fmt::Display) -> Response {
    let body = serde_json::json!({ "error": { "message": e.to_string() } }).to_string();
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
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
        Ok(None) => {
            let body = serde_json::json!({ "error": { "message": format!("no trajectory `{}`", q.id) } })
                .to_string();
            (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
        Err(r) => r,
    }
}

/// The router of the live UI for `run`, with run-health advisories under `thresholds`.
pub fn router(run: &Path, thresholds: Thresholds) -> Router {
    let state = Arc::new(Served {
        run: run.to_path_buf(),
        thresholds,
        cache: Mutex::new(None),
    });
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/api/summary", get(summary))
        .route("/api/trajectory", get(trajectory))
        .with_state(state)
}

/// Serves `run` on `bind` until the process is stopped; `on_listen` gets the bound address
/// (useful with port 0).
pub async fn serve(
    run: &Path,
    bind: &str,
    thresholds: Thresholds,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ReportError> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|source| ReportError::Bind {
            bind: bind.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(ReportError::Serve)?;
    on_listen(addr);
    axum::serve(listener, router(run, thresholds))
        .await
        .map_err(ReportError::Serve)
}
