//! The streaming run: read batches on one thread, evaluate per-record stages in parallel,
//! decide duplicates and write in input order.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};

use indicatif::ProgressBar;
use rayon::prelude::*;
use serde_json::{json, Map, Value};

use super::funnel::{Funnel, Stage};
use super::trials::Incomplete;
use super::{validity, Drop, FilterError, Settings};
use crate::io::{is_stdio, AtomicWriter, Compression};
use crate::records::{Record, TaskDecision};
use crate::tasks::facts::content_hash;
use crate::tasks::source::{classify, parse_record, render, InputKind, Parsed, RecordLines};
use crate::tasks::{chunks, harbor, TaskError};

const BATCH_RECORDS: usize = 4096;
const BATCH_BYTES: usize = 32 << 20;

/// What a run did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub funnel: Funnel,
    pub kept: u64,
    /// Bad inputs recorded under `--keep-going`.
    pub errors: u64,
}

/// One record after the parallel step.
enum Eval {
    Bad(TaskError),
    Good(Box<Evaluated>),
}

struct Evaluated {
    id: String,
    id_hash: u64,
    dedupe_key: Option<u64>,
    /// First failing per-record stage, or the evidence of every passed stage.
    verdict: Result<Vec<(Stage, Value)>, (Stage, Drop)>,
    /// The output line, for records that passed every per-record stage.
    line: Option<Vec<u8>>,
}

/// A batch from the reader thread: (path, record number, text) or a read error.
type Batch = (PathBuf, Vec<(u64, String)>, Option<TaskError>);

fn evaluate(
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
        stage(Stage::Rules, super::rules::check(r, f).map(|()| Value::Null));
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
    let line_out = match &verdict {
        Ok(()) if s.dry_run => None,
        Ok(()) => match render(path, line, text, &parsed) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Eval::Bad(e),
        },
        Err(_) => None,
    };
    Eval::Good(Box::new(Evaluated {
        id_hash: content_hash(&[&f.id]),
        id: f.id.clone(),
        dedupe_key: f.dedupe_key,
        verdict: verdict.map(|()| passed),
        line: line_out,
    }))
}

/// Reads a small record file (stdin, a JSON array) on a thread, in batches of records.
fn spawn_batches(path: PathBuf, mut lines: RecordLines) -> Receiver<Batch> {
    let (tx, rx) = sync_channel::<Batch>(2);
    std::thread::spawn(move || loop {
        let mut batch = Vec::with_capacity(BATCH_RECORDS);
        let mut bytes = 0;
        let mut err = None;
        let mut eof = false;
        while batch.len() < BATCH_RECORDS && bytes < BATCH_BYTES {
            match lines.next_record() {
                Ok(Some((n, t))) => {
                    bytes += t.len();
                    batch.push((n, t));
                }
                Ok(None) => {
                    eof = true;
                    break;
                }
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let stop = eof || err.is_some();
        if tx.send((path.clone(), batch, err)).is_err() || stop {
            break;
        }
    });
    rx
}

/// Evaluates one chunk of whole lines in parallel; returns the evaluations in order and the
/// number of lines the chunk held. Line numbers continue from `base`.
fn evaluate_chunk(s: &Settings, want: bool, path: &Path, data: &[u8], base: u64) -> (Vec<Eval>, u64) {
    let parts = chunks::parts(data, rayon::current_num_threads() * 4);
    let counts: Vec<u64> = parts.par_iter().map(|p| chunks::count_lines(p)).collect();
    let mut bases = Vec::with_capacity(parts.len());
    let mut n = base;
    for c in &counts {
        bases.push(n);
        n += c;
    }
    let evals: Vec<Vec<Eval>> = parts
        .par_iter()
        .zip(bases)
        .map(|(part, base)| {
            let mut out = Vec::new();
            let mut start = 0;
            let ends =
                memchr::memchr_iter(b'\n', part).chain((part.last() != Some(&b'\n')).then_some(part.len()));
            for (i, end) in ends.enumerate() {
                let raw = &part[start..end];
                start = end + 1;
                let line = base + i as u64 + 1;
                match std::str::from_utf8(raw) {
                    Err(e) => out.push(Eval::Bad(TaskError::Io(crate::io::IoError::BadRecord {
                        path: path.to_path_buf(),
                        line,
                        msg: format!("not UTF-8: {e}"),
                    }))),
                    Ok(text) if text.trim().is_empty() => {}
                    Ok(text) => out.push(evaluate(
                        s,
                        want,
                        path,
                        line,
                        Some(text),
                        parse_record(path, line, text),
                    )),
                }
            }
            out
        })
        .collect();
    (evals.into_iter().flatten().collect(), n - base)
}

/// The sequential, order-preserving part of a run.
struct Sink<'a> {
    s: &'a Settings,
    stages: Vec<Stage>,
    funnel: Funnel,
    /// None with `--dry-run`.
    out: Option<AtomicWriter>,
    decisions: Option<AtomicWriter>,
    ids: HashSet<u64>,
    /// Dedupe key → first id (the id only when decisions are written).
    keys: HashMap<u64, Option<Box<str>>>,
    kept: u64,
    errors: u64,
    incomplete: Vec<String>,
    incomplete_count: u64,
}

impl Sink<'_> {
    fn decide(
        &mut self,
        task_id: &str,
        kept: bool,
        stage: Stage,
        drop: Option<Drop>,
        evidence: Value,
    ) -> Result<(), FilterError> {
        let Some(w) = &mut self.decisions else {
            return Ok(());
        };
        let (reason, evidence) = match drop {
            Some(d) => (Some(d.reason), d.evidence),
            None => (None, evidence),
        };
        let rec = TaskDecision {
            schema: TaskDecision::SCHEMA.to_string(),
            task_id: task_id.to_string(),
            kept,
            stage: stage.as_str().to_string(),
            reason,
            evidence,
        };
        w.write(&rec)?;
        Ok(())
    }

    fn bad(&mut self, e: TaskError) -> Result<(), FilterError> {
        if !self.s.keep_going {
            return Err(e.into());
        }
        if self.errors < 20 {
            tracing::warn!("skipped: {e}");
        }
        self.errors += 1;
        let c = self.funnel.stage_mut(Stage::Ingest);
        c.input += 1;
        *c.reasons.entry(e.reason()).or_default() += 1;
        let d = Drop {
            reason: e.reason(),
            evidence: json!({"error": e.to_string()}),
        };
        self.decide(&e.locator(), false, Stage::Ingest, Some(d), Value::Null)
    }

    fn take(&mut self, ev: Eval) -> Result<(), FilterError> {
        let ev = match ev {
            Eval::Bad(e) => return self.bad(e),
            Eval::Good(ev) => ev,
        };
        let c = self.funnel.stage_mut(Stage::Ingest);
        c.input += 1;
        c.output += 1;
        let want = self.decisions.is_some();
        let mut last = Stage::Ingest;
        for i in 0..self.stages.len() {
            let st = self.stages[i];
            self.funnel.stage_mut(st).input += 1;
            let mut dropped: Option<Drop> = match &ev.verdict {
                Err((at, d)) if *at == st => Some(d.clone()),
                _ => None,
            };
            if st == Stage::Rules && dropped.is_none() {
                dropped = self.duplicate(&ev, want);
            }
            let fail_incomplete = self
                .s
                .difficulty
                .as_ref()
                .is_some_and(|d| d.incomplete == Incomplete::Fail);
            if st == Stage::Difficulty
                && fail_incomplete
                && dropped.as_ref().is_some_and(|d| d.reason.starts_with("trials_"))
            {
                self.incomplete_count += 1;
                if self.incomplete.len() < 5 {
                    self.incomplete.push(ev.id.clone());
                }
            }
            if let Some(d) = dropped {
                let c = self.funnel.stage_mut(st);
                *c.reasons.entry(d.reason.clone()).or_default() += 1;
                return self.decide(&ev.id, false, st, Some(d), Value::Null);
            }
            self.funnel.stage_mut(st).output += 1;
            last = st;
        }
        if let Some(out) = &mut self.out {
            let line = ev.line.as_deref().ok_or_else(|| TaskError::Input {
                path: PathBuf::from("-"),
                msg: "invariant: a kept record has its output line".into(),
            })?;
            out.write_raw(line)?;
        }
        self.kept += 1;
        if want {
            let evidence = match &ev.verdict {
                Ok(passed) if !passed.is_empty() => Value::Object(
                    passed
                        .iter()
                        .map(|(st, v)| (st.as_str().to_string(), v.clone()))
                        .collect::<Map<_, _>>(),
                ),
                _ => Value::Null,
            };
            self.decide(&ev.id, true, last, None, evidence)?;
        }
        Ok(())
    }

    fn duplicate(&mut self, ev: &Evaluated, want: bool) -> Option<Drop> {
        if !self.ids.insert(ev.id_hash) {
            return Some(Drop {
                reason: "duplicate_id".into(),
                evidence: json!({"id": ev.id}),
            });
        }
        let key = ev.dedupe_key?;
        match self.keys.get(&key) {
            Some(first) => Some(Drop {
                reason: "duplicate".into(),
                evidence: json!({"duplicate_of": first.as_deref(), "detail": "same repo, base_commit and patch"}),
            }),
            None => {
                self.keys
                    .insert(key, want.then(|| ev.id.clone().into_boxed_str()));
                None
            }
        }
    }
}

/// Runs the funnel over every input and writes the outputs (all or nothing).
pub fn run(s: &Settings, progress: &ProgressBar) -> Result<Summary, FilterError> {
    if let Some(v) = &s.validity {
        validity::checker(v)?;
    }
    let stages = s.stages();
    let mut sink = Sink {
        s,
        funnel: Funnel::new(&stages),
        stages,
        out: if s.dry_run {
            None
        } else {
            Some(AtomicWriter::create(&s.output)?)
        },
        decisions: s.decisions.as_deref().map(AtomicWriter::create).transpose()?,
        ids: HashSet::new(),
        keys: HashMap::new(),
        kept: 0,
        errors: 0,
        incomplete: Vec::new(),
        incomplete_count: 0,
    };
    let want = s.decisions.is_some();
    // Inputs in the order given: record files through the reader thread, directories inline.
    let groups: Vec<Result<InputKind, TaskError>> = s.inputs.iter().map(|p| classify(p)).collect();
    for kind in groups {
        match kind {
            Err(e) => sink.bad(e)?,
            Ok(InputKind::HarborDirs(dirs)) => {
                for d in dirs {
                    let ev = match harbor::load(&d) {
                        Ok(task) => {
                            let facts = crate::tasks::facts::Facts::of_task(&task);
                            evaluate(
                                s,
                                want,
                                &d,
                                0,
                                None,
                                Ok(Parsed::Task(Box::new(task), facts, false)),
                            )
                        }
                        Err(e) => Eval::Bad(e),
                    };
                    sink.take(ev)?;
                    progress.inc(1);
                }
            }
            Ok(InputKind::Records(path)) => {
                let lines = match RecordLines::open(&path) {
                    Ok(l) => l,
                    Err(e) => {
                        sink.bad(e)?;
                        continue;
                    }
                };
                if !is_stdio(&path) && !lines.is_array() {
                    drop(lines);
                    let rx = match chunks::spawn(path.clone()) {
                        Ok(rx) => rx,
                        Err(e) => {
                            sink.bad(e.into())?;
                            continue;
                        }
                    };
                    let mut line = 0;
                    for chunk in rx {
                        let (evals, n) = evaluate_chunk(s, want, &path, &chunk.data, line);
                        line += n;
                        progress.inc(evals.len() as u64);
                        for ev in evals {
                            sink.take(ev)?;
                        }
                        if let Some(end) = chunk.end {
                            sink.bad(TaskError::Io(end.into_error(&path, line)))?;
                        }
                    }
                    continue;
                }
                let rx = spawn_batches(path.clone(), lines);
                for (path, batch, err) in rx {
                    let evals: Vec<Eval> = batch
                        .par_iter()
                        .map(|(n, text)| {
                            evaluate(s, want, &path, *n, Some(text), parse_record(&path, *n, text))
                        })
                        .collect();
                    progress.inc(evals.len() as u64);
                    for ev in evals {
                        sink.take(ev)?;
                    }
                    if let Some(e) = err {
                        // A file that cannot be read further: recorded (keep-going) or fatal.
                        sink.bad(e)?;
                    }
                }
            }
        }
    }
    if sink.incomplete_count > 0 {
        return Err(FilterError::IncompleteTrials {
            count: sink.incomplete_count,
            k: s.difficulty.as_ref().map_or(0, |d| d.trials_per_task),
            examples: sink.incomplete.join(", "),
        });
    }
    let funnel = sink.funnel.clone();
    if let Some(path) = &s.funnel_csv {
        let bytes = funnel.to_csv().map_err(|source| FilterError::FunnelCsv {
            path: path.clone(),
            source,
        })?;
        let mut w = AtomicWriter::with_compression(path, Compression::Plain)?;
        w.write_raw(&bytes)?;
        w.finish()?;
    }
    if let Some(d) = sink.decisions.take() {
        d.finish()?;
    }
    if let Some(out) = sink.out.take() {
        out.finish()?;
    }
    Ok(Summary {
        funnel,
        kept: sink.kept,
        errors: sink.errors,
    })
}
