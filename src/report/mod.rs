//! `report`: CSV tables, a self-contained HTML page (inline CSS/JS/SVG, no network) with plots
//! over steps, behaviour diagnostics and a trajectory browser, and a live read-only server that
//! follows a run's growing files.

pub mod advisories;
pub mod assist;
pub mod behaviour;
pub mod conversation;
pub mod data;
pub mod guard;
pub mod harness;
pub mod html;
pub mod pool;
pub mod serve;
pub mod tables;

use std::path::{Path, PathBuf};

use crate::io::{AtomicWriter, Compression, IoError, ReadOptions, TornTail};
use crate::validate::run::{RunError, RunFiles};

/// Errors of report generation and serving.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("writing {table}: {msg}")]
    Csv { table: String, msg: String },
    #[error("{path}: cannot create output directory: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serialize report data: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{bind}: cannot listen: {source}")]
    Bind {
        bind: String,
        #[source]
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),
    #[error("assistant: {0}")]
    Assist(String),
    #[error(transparent)]
    Guard(#[from] guard::GuardError),
}

/// The error of writing CSV table `name` (a row's `csv::Error`, or the final flush's
/// `IntoInnerError`), for the report's tables in `tables`, `harness`, `pool`.
fn csv_err<E: std::fmt::Display>(name: &str) -> impl Fn(E) -> ReportError + '_ {
    move |e| ReportError::Csv {
        table: name.to_string(),
        msg: e.to_string(),
    }
}

/// The bytes of CSV table `name` once its last row is written.
fn finish_csv(w: csv::Writer<Vec<u8>>, name: &str) -> Result<Vec<u8>, ReportError> {
    w.into_inner().map_err(csv_err(name))
}

/// Settings of a static report.
#[derive(Debug, Clone)]
pub struct StaticSettings {
    pub run: PathBuf,
    pub output: PathBuf,
    /// Trajectory details embedded in the page.
    pub max_trajectories: usize,
    pub strict: bool,
    /// Run-health advisory thresholds (`advisories.json`, the page's "Health" section).
    pub advisories: advisories::Thresholds,
    /// Trajectories embedded in detail beyond `max_trajectories` (`diagnosis.md`'s examples).
    pub embed: std::collections::HashSet<String>,
    /// `--review`'s verdicts, shown on their trajectories (which are embedded).
    pub reviews: Vec<assist::review::Review>,
}

/// What a static report wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub files: Vec<PathBuf>,
    pub trajectories: u64,
    pub embedded: usize,
}

fn write_plain(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let mut w = AtomicWriter::with_compression(path, Compression::Plain)?;
    w.write_raw(bytes)?;
    w.finish()?;
    Ok(())
}

/// Writes `index.html` and the CSV tables of a finished run into `output` (each atomically).
pub fn write_static(s: &StaticSettings) -> Result<Written, ReportError> {
    let files = RunFiles::discover(&s.run, false)?;
    let opts = ReadOptions {
        strict: s.strict,
        torn_tail: TornTail::Error,
    };
    let mut embed = s.embed.clone();
    embed.extend(s.reviews.iter().map(|r| r.id.clone()));
    let mut d = data::build_embedding(&files, opts, Some(s.max_trajectories), &embed)?;
    d.reviews = s.reviews.iter().map(|r| (r.id.clone(), r.clone())).collect();
    d.advisories = advisories::advise(&d.steps, &s.advisories);
    std::fs::create_dir_all(&s.output).map_err(|source| ReportError::CreateDir {
        path: s.output.clone(),
        source,
    })?;
    let mut written = Vec::new();
    for (name, bytes) in tables::all(&d)? {
        let p = s.output.join(name);
        write_plain(&p, &bytes)?;
        written.push(p);
    }
    let p = s.output.join("advisories.json");
    let file = advisories::AdvisoriesFile {
        schema: advisories::SCHEMA,
        thresholds: &s.advisories,
        advisories: &d.advisories,
    };
    write_plain(&p, &serde_json::to_vec_pretty(&file)?)?;
    written.push(p);
    let p = s.output.join("index.html");
    write_plain(&p, html::page(&d)?.as_bytes())?;
    written.push(p);
    Ok(Written {
        files: written,
        trajectories: d.trajectory_count,
        embedded: d.details.len(),
    })
}
