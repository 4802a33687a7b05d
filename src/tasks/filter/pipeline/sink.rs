//! The sequential, order-preserving part of a run: duplicates, the stage sequence with its
//! pause for the validity verdicts, funnel counts, kept lines and decision records.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use indicatif::ProgressBar;
use serde_json::{json, Map, Value};

use super::evaluate::{Eval, Evaluated};
use crate::io::AtomicWriter;
use crate::records::{Record, TaskDecision};
use crate::tasks::filter::funnel::{Funnel, Stage};
use crate::tasks::filter::trials::Incomplete;
use crate::tasks::filter::validity::{Validator, ValidityVerdict};
use crate::tasks::filter::{Drop, FilterError, Settings};
use crate::tasks::TaskError;

/// Where a record stands in the stage sequence.
enum Step {
    Dropped(Stage, Drop),
    Kept,
    /// Waiting for the validity verdict (the stage's index).
    AtValidity(usize),
}

/// Hasher for keys that are already 64-bit content hashes: the sequential part of a run hashes
/// nothing twice.
#[derive(Default, Clone, Copy)]
pub(super) struct Prehashed(u64);

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

pub(super) type ByHash = BuildHasherDefault<Prehashed>;

/// The sequential, order-preserving part of a run.
pub(super) struct Sink<'a> {
    pub(super) s: &'a Settings,
    pub(super) stages: Vec<Stage>,
    pub(super) funnel: Funnel,
    /// None with `--dry-run`.
    pub(super) out: Option<AtomicWriter>,
    pub(super) decisions: Option<AtomicWriter>,
    pub(super) ids: HashSet<u64, ByHash>,
    /// Dedupe key → first id (the id only when decisions are written).
    pub(super) keys: HashMap<u64, Option<Box<str>>, ByHash>,
    pub(super) kept: u64,
    pub(super) errors: u64,
    pub(super) incomplete: Vec<String>,
    pub(super) incomplete_count: u64,
    /// The sandbox side of the validity stage, when it runs.
    pub(super) validator: Option<Validator>,
    /// Sandbox runs finished (progress).
    pub(super) trials_done: AtomicU64,
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

    pub(super) fn bad(&mut self, e: TaskError) -> Result<(), FilterError> {
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
    pub(super) fn take_batch(&mut self, evals: Vec<Eval>, progress: &ProgressBar) -> Result<(), FilterError> {
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
