//! The streaming run: read batches on one thread, evaluate per-record stages in parallel,
//! decide duplicates and write in input order.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{sync_channel, Receiver};

use indicatif::ProgressBar;
use rayon::prelude::*;
use serde_json::{json, Map, Value};

use super::funnel::{Funnel, Stage};
use super::trials::Incomplete;
use super::validity::{Candidate, Validator, ValidityVerdict};
use super::{Drop, FilterError, Settings};
use crate::io::{is_stdio, AtomicWriter, Compression};
use crate::records::{Record, Task, TaskDecision};
use crate::tasks::facts::content_hash;
use crate::tasks::source::{classify, load_dir, parse_record, render, InputKind, Parsed, RecordLines};
use crate::tasks::{chunks, TaskError};

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
    /// The task to check in sandboxes, when the validity stage is on and the record passed the
    /// stages before it.
    candidate: Option<Box<Candidate>>,
    /// The validity stage's evidence for a valid task.
    validity: Option<Value>,
}

/// Where a record stands in the stage sequence.
enum Step {
    Dropped(Stage, Drop),
    Kept,
    /// Waiting for the validity verdict (the stage's index).
    AtValidity(usize),
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
    let line_out = match &verdict {
        Ok(()) if s.dry_run => None,
        Ok(()) => match render(path, line, text, &parsed) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Eval::Bad(e),
        },
        Err(_) => None,
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
fn evaluate_chunk(s: &Settings, want: bool, path: &Path, data: &[u8], base: u64) -> (Vec<Eval>, u64) {
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

/// Hasher for keys that are already 64-bit content hashes: the sequential part of a run hashes
/// nothing twice.
#[derive(Default, Clone, Copy)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type ByHash = BuildHasherDefault<Prehashed>;

/// The sequential, order-preserving part of a run.
struct Sink<'a> {
    s: &'a Settings,
    stages: Vec<Stage>,
    funnel: Funnel,
    /// None with `--dry-run`.
    out: Option<AtomicWriter>,
    decisions: Option<AtomicWriter>,
    ids: HashSet<u64, ByHash>,
    /// Dedupe key → first id (the id only when decisions are written).
    keys: HashMap<u64, Option<Box<str>>, ByHash>,
    kept: u64,
    errors: u64,
    incomplete: Vec<String>,
    incomplete_count: u64,
    /// The sandbox side of the validity stage, when it runs.
    validator: Option<Validator>,
    /// Sandbox runs finished (progress).
    trials_done: AtomicU64,
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
        let mut ev = match ev {
            Eval::Bad(e) => return self.bad(e),
            Eval::Good(ev) => ev,
        };
        self.ingest();
        let step = self.advance(&mut ev, 0, None);
        self.finish(&ev, step)
    }

    /// Takes a batch in input order; with the validity stage, first every record up to it, then
    /// the sandbox checks of the survivors together (`-j` in flight), then the rest in order.
    fn take_batch(&mut self, evals: Vec<Eval>, progress: &ProgressBar) -> Result<(), FilterError> {
        if self.validator.is_none() {
            for ev in evals {
                self.take(ev)?;
            }
            return Ok(());
        }
        let mut items: Vec<Result<(Box<Evaluated>, Step), TaskError>> = Vec::with_capacity(evals.len());
        for ev in evals {
            match ev {
                Eval::Bad(e) if !self.s.keep_going => return Err(e.into()),
                Eval::Bad(e) => items.push(Err(e)),
                Eval::Good(mut ev) => {
                    self.ingest();
                    let step = self.advance(&mut ev, 0, None);
                    items.push(Ok((ev, step)));
                }
            }
        }
        let mut waiting = Vec::new();
        let mut candidates = Vec::new();
        for (i, item) in items.iter_mut().enumerate() {
            if let Ok((ev, Step::AtValidity(_))) = item {
                let c = ev.candidate.take().ok_or_else(|| TaskError::Input {
                    path: PathBuf::from("-"),
                    msg: format!("invariant: task {} reached validity without its task", ev.id),
                })?;
                waiting.push(i);
                candidates.push(*c);
            }
        }
        if !candidates.is_empty() {
            let verdicts = match &self.validator {
                Some(v) => {
                    let done = &self.trials_done;
                    v.check_all(&candidates, &|| {
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        progress.set_message(format!("filtering (validity: {n} sandbox runs)"));
                    })
                }
                None => Vec::new(),
            };
            for (i, verdict) in waiting.into_iter().zip(verdicts) {
                if let Ok((ev, step)) = &mut items[i] {
                    if let Step::AtValidity(at) = *step {
                        *step = self.advance(ev, at, Some(verdict));
                    }
                }
            }
        }
        for item in items {
            match item {
                Err(e) => self.bad(e)?,
                Ok((ev, step)) => self.finish(&ev, step)?,
            }
        }
        Ok(())
    }

    /// Counts a readable record in.
    fn ingest(&mut self) {
        let c = self.funnel.stage_mut(Stage::Ingest);
        c.input += 1;
        c.output += 1;
    }

    /// Runs the stages from index `from`; pauses at validity until its verdict is given.
    fn advance(&mut self, ev: &mut Evaluated, from: usize, mut validity: Option<ValidityVerdict>) -> Step {
        let want = self.decisions.is_some();
        for i in from..self.stages.len() {
            let st = self.stages[i];
            if st == Stage::Validity && validity.is_none() {
                return Step::AtValidity(i);
            }
            self.funnel.stage_mut(st).input += 1;
            let mut dropped: Option<Drop> = match &ev.verdict {
                Err((at, d)) if *at == st => Some(d.clone()),
                _ => None,
            };
            if st == Stage::Rules && dropped.is_none() {
                dropped = self.duplicate(ev, want);
            }
            if st == Stage::Validity {
                match validity.take() {
                    Some(ValidityVerdict::Invalid { reason, evidence }) => {
                        dropped = Some(Drop { reason, evidence });
                    }
                    Some(ValidityVerdict::Valid(evidence)) => ev.validity = Some(evidence),
                    None => {}
                }
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
                return Step::Dropped(st, d);
            }
            self.funnel.stage_mut(st).output += 1;
        }
        Step::Kept
    }

    /// Writes a record's outcome (kept line, decision).
    fn finish(&mut self, ev: &Evaluated, step: Step) -> Result<(), FilterError> {
        match step {
            Step::Dropped(st, d) => self.decide(&ev.id, false, st, Some(d), Value::Null),
            Step::AtValidity(_) => Err(TaskError::Input {
                path: PathBuf::from("-"),
                msg: format!("invariant: task {} left without a validity verdict", ev.id),
            }
            .into()),
            Step::Kept => {
                if let Some(out) = &mut self.out {
                    let line = ev.line.as_deref().ok_or_else(|| TaskError::Input {
                        path: PathBuf::from("-"),
                        msg: "invariant: a kept record has its output line".into(),
                    })?;
                    out.write_raw(line)?;
                }
                self.kept += 1;
                if self.decisions.is_some() {
                    let mut map: Map<String, Value> = match &ev.verdict {
                        Ok(passed) => passed
                            .iter()
                            .map(|(st, v)| (st.as_str().to_string(), v.clone()))
                            .collect(),
                        Err(_) => Map::new(),
                    };
                    if let Some(v) = &ev.validity {
                        map.insert(Stage::Validity.as_str().to_string(), v.clone());
                    }
                    let evidence = if map.is_empty() {
                        Value::Null
                    } else {
                        Value::Object(map)
                    };
                    let last = self.stages.last().copied().unwrap_or(Stage::Ingest);
                    self.decide(&ev.id, true, last, None, evidence)?;
                }
                Ok(())
            }
        }
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

/// Hands one chunk's results to the sink, then the stream's end error placed after them.
fn take_evals(
    sink: &mut Sink,
    evals: Vec<Eval>,
    end: Option<chunks::End>,
    path: &Path,
    line: u64,
    progress: &ProgressBar,
) -> Result<(), FilterError> {
    progress.inc(evals.len() as u64);
    sink.take_batch(evals, progress)?;
    match end {
        Some(end) => sink.bad(TaskError::Io(end.into_error(path, line))),
        None => Ok(()),
    }
}

/// Runs the funnel over every input and writes the outputs (all or nothing).
pub fn run(s: &Settings, progress: &ProgressBar) -> Result<Summary, FilterError> {
    // Connects to the engine and reads the manifest before any output is opened.
    let validator = s.validity.as_ref().map(Validator::new).transpose()?;
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
        ids: HashSet::default(),
        keys: HashMap::default(),
        kept: 0,
        errors: 0,
        incomplete: Vec::new(),
        incomplete_count: 0,
        validator,
        trials_done: AtomicU64::new(0),
    };
    let want = s.decisions.is_some();
    // Inputs in the order given: record files through the reader thread, directories inline.
    let groups: Vec<Result<InputKind, TaskError>> = s.inputs.iter().map(|p| classify(p)).collect();
    for kind in groups {
        match kind {
            Err(e) => sink.bad(e)?,
            Ok(InputKind::TaskDirs(dirs)) => {
                let mut evals = Vec::with_capacity(dirs.len());
                for d in dirs {
                    let ev = match load_dir(&d) {
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
                    evals.push(ev);
                    progress.inc(1);
                }
                sink.take_batch(evals, progress)?;
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
                    // Pipelined: while the rayon workers evaluate chunk k+1, this thread hands
                    // chunk k's results to the sink (dedupe, funnel, output), which is serial.
                    let mut line = 0;
                    let mut pending: Option<(Vec<Eval>, Option<chunks::End>, u64)> = None;
                    loop {
                        let chunk = rx.next_chunk();
                        let mut evaluated = None;
                        let taken = rayon::in_place_scope(|scope| {
                            if let Some(c) = &chunk {
                                let (path, out) = (&path, &mut evaluated);
                                scope.spawn(move |_| {
                                    *out = Some(evaluate_chunk(s, want, path, c.data(), line))
                                });
                            }
                            match pending.take() {
                                Some((evals, end, at)) => {
                                    take_evals(&mut sink, evals, end, &path, at, progress)
                                }
                                None => Ok(()),
                            }
                        });
                        taken?;
                        let Some(mut chunk) = chunk else { break };
                        let (evals, n) = evaluated.expect("invariant: the scope ran the evaluation");
                        line += n;
                        pending = Some((evals, chunk.end.take(), line));
                        rx.recycle(chunk);
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
                    sink.take_batch(evals, progress)?;
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
