//! The parallel, per-record part of a run: parse a record, run every per-record stage on it,
//! render its output line, and prepare it for the validity stage.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::Value;

use crate::io::is_stdio;
use crate::records::{PassRate, Task};
use crate::tasks::facts::content_hash;
use crate::tasks::filter::funnel::Stage;
use crate::tasks::filter::validity::Candidate;
use crate::tasks::filter::{Drop, Settings};
use crate::tasks::source::{parse_record, render, Parsed};
use crate::tasks::{chunks, TaskError};

/// One record after the parallel step.
pub(super) enum Eval {
    Bad(TaskError),
    Good(Box<Evaluated>),
}

pub(super) struct Evaluated {
    pub(super) id: String,
    pub(super) id_hash: u64,
    pub(super) dedupe_key: Option<u64>,
    /// First failing per-record stage, or the evidence of every passed stage.
    pub(super) verdict: Result<Vec<(Stage, Value)>, (Stage, Drop)>,
    /// The output line, for records that passed every per-record stage.
    pub(super) line: Option<Vec<u8>>,
    /// The task to check in sandboxes, when the validity stage is on and the record passed the
    /// stages before it.
    pub(super) candidate: Option<Box<Candidate>>,
    /// The validity stage's evidence for a valid task.
    pub(super) validity: Option<Value>,
}

/// The directory a record's relative paths resolve against: its file's (a Harbor task
/// directory's parent).
fn record_dir(path: &Path) -> PathBuf {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() && !is_stdio(path) => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// The record as a `Task` (SWE-bench records converted as on output).
fn to_task(path: &Path, line: u64, text: Option<&str>, parsed: &Parsed<'_>) -> Result<Task, TaskError> {
    match parsed {
        Parsed::Task(t, _, _) => Ok((**t).clone()),
        Parsed::Swebench(..) => {
            let bytes = render(path, line, text, parsed)?;
            serde_json::from_slice(&bytes).map_err(|e| TaskError::Input {
                path: path.to_path_buf(),
                msg: format!("record {line}: converted task does not parse: {e}"),
            })
        }
    }
}

/// The output line of a kept task with its `pass_rate` set (replacing an older one).
fn with_pass_rate(
    path: &Path,
    line: u64,
    text: Option<&str>,
    parsed: &Parsed<'_>,
    rate: PassRate,
) -> Result<Vec<u8>, TaskError> {
    let mut task = to_task(path, line, text, parsed)?;
    task.pass_rate = Some(rate);
    let mut out = serde_json::to_vec(&task).map_err(|e| TaskError::Input {
        path: path.to_path_buf(),
        msg: format!("record {line}: cannot serialise task: {e}"),
    })?;
    out.push(b'\n');
    Ok(out)
}

pub(super) fn evaluate(
    s: &Settings,
    want_evidence: bool,
    path: &Path,
    line: u64,
    text: Option<&str>,
    parsed: Result<Parsed<'_>, TaskError>,
) -> Eval {
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => return Eval::Bad(e),
    };
    let f = parsed.facts();
    let mut passed = Vec::new();
    let mut verdict = Ok(());
    let mut stage = |st: Stage, r: Result<Value, Drop>| {
        if verdict.is_ok() {
            match r {
                Ok(ev) if want_evidence && !ev.is_null() => passed.push((st, ev)),
                Ok(_) => {}
                Err(d) => verdict = Err((st, d)),
            }
        }
    };
    if let Some(r) = &s.rules {
        stage(
            Stage::Rules,
            crate::tasks::filter::rules::check(r, f).map(|()| Value::Null),
        );
    }
    if let Some(d) = &s.decontamination {
        stage(Stage::Decontamination, d.check(f).map(|()| Value::Null));
    }
    if let Some(d) = &s.difficulty {
        stage(Stage::Difficulty, d.check(&f.id));
    }
    if let Some(sat) = &s.saturation {
        stage(Stage::Saturation, sat.check(&f.id));
    }
    let before_validity = matches!(&verdict, Err((Stage::Rules | Stage::Decontamination, _)));
    let candidate = if s.validity.is_some() && !before_validity {
        match to_task(path, line, text, &parsed) {
            Ok(task) => Some(Box::new(Candidate {
                task,
                dir: record_dir(path),
            })),
            Err(e) => return Eval::Bad(e),
        }
    } else {
        None
    };
    // The kept task's recent pass rate (saturation stage, else difficulty) goes into its record.
    let pass_rate = s
        .saturation
        .as_ref()
        .and_then(|sat| sat.pass_rate(&f.id))
        .or_else(|| s.difficulty.as_ref().and_then(|d| d.pass_rate(&f.id)));
    let line_out = match (&verdict, pass_rate) {
        (Ok(()), _) if s.dry_run => None,
        (Ok(()), None) => match render(path, line, text, &parsed) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Eval::Bad(e),
        },
        (Ok(()), Some(rate)) => match with_pass_rate(path, line, text, &parsed, rate) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Eval::Bad(e),
        },
        (Err(_), _) => None,
    };
    let (id_hash, dedupe_key) = (content_hash(&[&f.id]), f.dedupe_key);
    let id = match parsed {
        Parsed::Swebench(f, _) | Parsed::Task(_, f, _) => f.id,
    };
    Eval::Good(Box::new(Evaluated {
        id_hash,
        id,
        dedupe_key,
        verdict: verdict.map(|()| passed),
        line: line_out,
        candidate,
        validity: None,
    }))
}

/// Evaluates the lines of one part, numbered from `base + 1`; returns the evaluations, the
/// number of lines and whether any line was bad.
fn evaluate_part(s: &Settings, want: bool, path: &Path, part: &[u8], base: u64) -> (Vec<Eval>, u64, bool) {
    let mut out = Vec::new();
    let mut start = 0;
    let mut lines = 0;
    let mut bad = false;
    let ends = memchr::memchr_iter(b'\n', part).chain((part.last() != Some(&b'\n')).then_some(part.len()));
    for end in ends {
        let raw = &part[start..end];
        start = end + 1;
        lines += 1;
        let line = base + lines;
        let ev = match std::str::from_utf8(raw) {
            Err(e) => Eval::Bad(TaskError::Io(crate::io::IoError::BadRecord {
                path: path.to_path_buf(),
                line,
                msg: format!("not UTF-8: {e}"),
            })),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => evaluate(s, want, path, line, Some(text), parse_record(path, line, text)),
        };
        bad |= matches!(ev, Eval::Bad(_));
        out.push(ev);
    }
    (out, lines, bad)
}

/// Evaluates one chunk of whole lines in parallel; returns the evaluations in order and the
/// number of lines the chunk held. Line numbers continue from `base`.
///
/// Parts are evaluated with line numbers counted from their own start, so no separate pass
/// counts lines first; only errors carry a line number, so the rare part with a bad line is
/// evaluated again, in order, with its true base.
pub(super) fn evaluate_chunk(
    s: &Settings,
    want: bool,
    path: &Path,
    data: &[u8],
    base: u64,
) -> (Vec<Eval>, u64) {
    let parts = chunks::parts(data, rayon::current_num_threads() * 4);
    let results: Vec<(Vec<Eval>, u64, bool)> = parts
        .par_iter()
        .map(|part| evaluate_part(s, want, path, part, 0))
        .collect();
    let mut out = Vec::with_capacity(results.iter().map(|r| r.0.len()).sum());
    let mut n = base;
    for (part, (evals, lines, bad)) in parts.iter().zip(results) {
        if bad && n > 0 {
            out.extend(evaluate_part(s, want, path, part, n).0);
        } else {
            out.extend(evals);
        }
        n += lines;
    }
    (out, n - base)
}
