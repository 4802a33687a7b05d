//! The streaming run: read batches on one thread, evaluate per-record stages in parallel,
//! decide duplicates and write in input order.
//!
//! The per-record, parallel part is in [`evaluate`]; the sequential, order-preserving part
//! (duplicates, stage counts, outputs) in [`sink`].

mod evaluate;
mod sink;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{sync_channel, Receiver};

use indicatif::ProgressBar;
use rayon::prelude::*;

use super::funnel::Funnel;
use super::validity::Validator;
use super::{FilterError, Settings};
use crate::io::{is_stdio, AtomicWriter, Compression};
use crate::tasks::source::{classify, load_dir, parse_record, InputKind, Parsed, RecordLines};
use crate::tasks::{chunks, TaskError};
use evaluate::{evaluate, evaluate_chunk, Eval};
use sink::Sink;

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

/// A batch from the reader thread: (path, record number, text) or a read error.
type Batch = (PathBuf, Vec<(u64, String)>, Option<TaskError>);

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
