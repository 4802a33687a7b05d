//! Run validation, in three layers:
//! - record checks of files ([`check_file`]): every record parses as its kind with a known schema;
//! - run health ([`health`], [`gates`]): cross-file consistency and gates on a run's numbers,
//!   ending in a [`ValidationReport`] appended to the run's validation file;
//! - held-out evaluation ([`eval`]): pass@1 with intervals, pass@k, comparisons.

pub mod by_harness;
mod collapse;
pub mod dynamic;
pub mod eval;
pub mod gates;
pub mod health;
pub mod output;
pub mod run;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::io::{open_lines, IoError, TornTail};
use crate::records::{parse_any, Record, ValidationReport};

/// At most this many record errors are kept per file for the report.
const MAX_ERRORS: usize = 5;

/// What checking one file found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FileCheck {
    pub path: PathBuf,
    pub records: u64,
    pub bad: u64,
    /// Records per kind.
    pub kinds: BTreeMap<String, u64>,
    /// The first few bad records, each naming file and record.
    pub errors: Vec<String>,
    /// Set when the file itself could not be read to the end (missing, truncated, corrupt).
    pub fatal: Option<String>,
}

/// Checks every record of `path`. With `strict`, the first bad record is fatal.
pub fn check_file(path: &Path, strict: bool) -> FileCheck {
    let mut check = FileCheck {
        path: path.to_path_buf(),
        records: 0,
        bad: 0,
        kinds: BTreeMap::new(),
        errors: Vec::new(),
        fatal: None,
    };
    let mut lines = match open_lines(path, TornTail::Error) {
        Ok(l) => l,
        Err(e) => {
            check.fatal = Some(e.to_string());
            return check;
        }
    };
    loop {
        let mut batch = Vec::with_capacity(1024);
        let mut end = false;
        while batch.len() < 1024 {
            match lines.next_line() {
                Ok(Some(item)) => batch.push(item),
                Ok(None) => {
                    end = true;
                    break;
                }
                Err(e) => {
                    check.fatal = Some(e.to_string());
                    end = true;
                    break;
                }
            }
        }
        let results: Vec<(u64, Result<&'static str, String>)> = batch
            .into_par_iter()
            .map(|(line, text)| {
                let r = serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| format!("not JSON: {e}"))
                    .and_then(parse_any);
                (line, r)
            })
            .collect();
        for (line, r) in results {
            check.records += 1;
            match r {
                Ok(kind) => *check.kinds.entry(kind.to_string()).or_default() += 1,
                Err(msg) => {
                    check.bad += 1;
                    let e = IoError::BadRecord {
                        path: path.to_path_buf(),
                        line,
                        msg,
                    };
                    if strict {
                        check.fatal = Some(format!("{e} (--strict)"));
                        return check;
                    }
                    if check.errors.len() < MAX_ERRORS {
                        check.errors.push(e.to_string());
                    }
                }
            }
        }
        if end {
            return check;
        }
    }
}

/// Checks several files in parallel, in input order.
pub fn check_files(paths: &[PathBuf], strict: bool) -> Vec<FileCheck> {
    paths.par_iter().map(|p| check_file(p, strict)).collect()
}

/// The verdict of run health: measurements, gate results and the record to append.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub health: health::Health,
    pub report: ValidationReport,
}

/// Measures a run and judges its gates.
pub fn validate_run(
    files: &run::RunFiles,
    opts: crate::io::ReadOptions,
    cfg: &gates::GateConfig,
) -> Result<Verdict, run::RunError> {
    let h = health::measure(files, opts)?;
    let results = gates::judge(&h, cfg);
    let step = h
        .steps
        .keys()
        .copied()
        .chain(h.metrics.iter().map(|m| m.step))
        .max();
    let mut checks = serde_json::Map::new();
    checks.insert("trajectory_files".into(), files.trajectories.len().into());
    checks.insert("trajectories".into(), h.trajectories.into());
    checks.insert("samples".into(), h.samples.into());
    checks.insert("metrics".into(), h.metrics.len().into());
    checks.insert("steps".into(), h.steps.len().into());
    if by_harness::is_mixed(&h.harnesses) {
        // The latest batch's figures per harness (a mixed rollout).
        let last = h.harnesses.iter().map(|r| r.step).max();
        let latest: serde_json::Map<String, serde_json::Value> = h
            .harnesses
            .iter()
            .filter(|r| Some(r.step) == last)
            .map(|r| (r.harness.clone(), r.summary()))
            .collect();
        checks.insert("by_harness".into(), latest.into());
    }
    if let Some(d) = h.dynamic.values().next_back() {
        // The latest dynamically sampled batch, with the budget warning when it ran out short.
        let mut v = serde_json::to_value(d).unwrap_or_default();
        if let (Some(w), Some(o)) = (d.warning(), v.as_object_mut()) {
            o.insert("warning".into(), w.into());
        }
        checks.insert("dynamic_sampling".into(), v);
    }
    let report = ValidationReport {
        schema: ValidationReport::SCHEMA.into(),
        step,
        passed: results.iter().all(|g| g.passed),
        gates: results,
        checks,
        eval: serde_json::Map::new(),
    };
    Ok(Verdict { health: h, report })
}

/// Appends one report to `path` (created if needed) as one committed zstd frame.
pub fn append_report(path: &Path, report: &ValidationReport) -> Result<(), IoError> {
    let (mut w, _) = crate::io::AppendWriter::open(path)?;
    w.push(report)?;
    w.commit()?;
    Ok(())
}
