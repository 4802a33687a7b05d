//! Message-level alignment: trajectories (the proxy's captures) → token-exact training samples.
//!
//! A sample is built from captured tokens only — the chain `prompt_ids(k) + output_ids(k) ⊑
//! prompt_ids(k+1)` the proxy's faithful prompts create — never from a harness's re-serialized
//! text, so every sample is token-exact against the engine's prompts by construction (and
//! checked). Messages decide the structure around the tokens: which requests form a thread
//! (main agent, side requests, sub-agents), where a thread's history was rewritten (a new
//! segment), and which captured generation each echoed assistant turn is
//! ([`messages`]: ids first, exact content otherwise, [`MatchMode`]). What cannot be aligned is
//! dropped and counted in [`AlignStats`], never guessed. See [`trajectory`] for the algorithm.
//!
//! Without `--model` the captured text of a generation is unknown (records hold tokens), so
//! assistant turns link by tool-call id, or, for plain-text turns, by the proxy's token splice;
//! with the model's tokenizer each capture is decoded and compared with its echo, which also
//! counts the harness's re-serializations (`tool_call_mismatches`).
//!
//! The work is a pure function of the input: trajectories are aligned in parallel (rayon, `-j`)
//! in chunks and written in input order, so output is byte-identical for any thread count.

pub mod by_harness;
pub mod messages;
pub mod trajectory;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

pub use messages::MatchMode;
pub use trajectory::align_trajectory;

use crate::chat::ChatFormat;
use crate::io::{open_records, AtomicWriter, IoError, ReadOptions};
use crate::records::{AlignStats, Record, Trajectory, CHAT_MODEL};

/// Errors of align; each names the file, record, trajectory and field involved.
#[derive(Debug, thiserror::Error)]
pub enum AlignError {
    #[error("trajectory `{trajectory}`: generations[{position}] (index {index}): `{field}`: {msg}")]
    BadGeneration {
        trajectory: String,
        position: usize,
        index: u32,
        field: String,
        msg: String,
    },
    #[error("{path}: trajectory record {record}")]
    InRecord {
        path: PathBuf,
        record: u64,
        #[source]
        source: Box<AlignError>,
    },
    #[error("loading the chat format from {path}")]
    LoadModel {
        path: PathBuf,
        #[source]
        source: crate::chat::ChatError,
    },
    #[error("cannot start {jobs} worker threads: {msg}")]
    Threads { jobs: usize, msg: String },
    #[error("invariant broken: {0}")]
    Invariant(String),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// What align needs besides its input.
#[derive(Debug, Default)]
pub struct Settings {
    pub mode: MatchMode,
    /// The model's chat format (`--model`), to decode captured outputs for content comparison.
    pub chat: Option<Arc<ChatFormat>>,
    /// Without `--model`, look for the tokenizer each trajectory names (see [`Settings::chat_for`]).
    pub discover: bool,
    /// The folders trajectories named, each loaded once (None: it could not be).
    named: Mutex<HashMap<PathBuf, Option<Arc<ChatFormat>>>>,
}

impl Settings {
    /// Settings with `mode`, loading the chat format from `model` when given; without it, each
    /// trajectory's own tokenizer is used where it names one that loads.
    pub fn new(mode: MatchMode, model: Option<&Path>) -> Result<Self, AlignError> {
        let chat = model
            .map(|p| {
                ChatFormat::from_model_dir(p).map_err(|source| AlignError::LoadModel {
                    path: p.to_path_buf(),
                    source,
                })
            })
            .transpose()?;
        Ok(Settings {
            mode,
            chat: chat.map(Arc::new),
            discover: model.is_none(),
            named: Mutex::default(),
        })
    }

    /// The chat format to decode `t`'s captures with: `--model`'s; else (with `discover`) the
    /// folder rollout recorded in the trajectory (`metadata.chat_model`), or the embedded
    /// backend's checkpoint for older records. None: statistics that need the text
    /// (re-serializations, segment kinds, linked answers) are approximate for `t`.
    pub fn chat_for(&self, t: &Trajectory) -> Option<Arc<ChatFormat>> {
        if let Some(c) = &self.chat {
            return Some(c.clone());
        }
        if !self.discover {
            return None;
        }
        let dir = t
            .metadata
            .get(CHAT_MODEL)
            .and_then(|v| v.as_str())
            .or_else(|| t.backend.strip_prefix("embedded:"))?;
        let mut named = self.named.lock().expect("invariant: lock not poisoned");
        named
            .entry(PathBuf::from(dir))
            .or_insert_with(|| match ChatFormat::from_model_dir(Path::new(dir)) {
                Ok(c) => {
                    tracing::info!(
                        "align: decoding captures with the tokenizer in {dir} (named by the trajectories)"
                    );
                    Some(Arc::new(c))
                }
                Err(e) => {
                    tracing::warn!("align: {dir} (named by trajectory {}): {e:#}", t.id);
                    None
                }
            })
            .clone()
    }
}

/// Adds `b`'s counts to `a` (totals over trajectories).
pub fn add_stats(a: &mut AlignStats, b: &AlignStats) {
    a.trajectories += b.trajectories;
    a.threads += b.threads;
    a.segments += b.segments;
    a.samples += b.samples;
    a.aligned_turns += b.aligned_turns;
    a.dropped_turns += b.dropped_turns;
    a.policy_tokens += b.policy_tokens;
    a.dropped_tokens += b.dropped_tokens;
    for (k, v) in &b.dropped_by_reason {
        *a.dropped_by_reason.entry(k.clone()).or_default() += v;
    }
    a.tool_call_mismatches += b.tool_call_mismatches;
    a.mismatches_resolved_by_id += b.mismatches_resolved_by_id;
    a.token_exact_samples += b.token_exact_samples;
    for (k, v) in &b.segment_breaks {
        *a.segment_breaks.entry(k.clone()).or_default() += v;
    }
    a.compacted_messages += b.compacted_messages;
    a.unlinked_assistant_messages += b.unlinked_assistant_messages;
    a.samples_without_routing += b.samples_without_routing;
    a.context_refusals += b.context_refusals;
    a.without_tokenizer += b.without_tokenizer;
    a.malformed_tool_calls += b.malformed_tool_calls;
    a.skipped_uninformative += b.skipped_uninformative;
}

/// Where align reads and writes.
#[derive(Debug, Clone)]
pub struct Files {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// Per-trajectory stats records followed by the total.
    pub stats: Option<PathBuf>,
}

/// How the driver runs.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub jobs: usize,
    pub read: ReadOptions,
    pub progress: bool,
}

/// Trajectories aligned per parallel chunk, per worker thread.
const CHUNK_PER_JOB: usize = 16;

/// Aligns every trajectory of `files.inputs` (in order) into `files.output`; returns the total.
pub fn run(files: &Files, settings: &Settings, opts: RunOptions) -> Result<AlignStats, AlignError> {
    let jobs = opts.jobs.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .thread_name(|i| format!("lego-rl-align-{i}"))
        .build()
        .map_err(|e| AlignError::Threads {
            jobs,
            msg: e.to_string(),
        })?;
    // The writers are created outside the pool: their compression threads follow the global
    // pool, so the compressed bytes do not depend on `-j`.
    let out = AtomicWriter::create(&files.output)?;
    let stats_out = files.stats.as_deref().map(AtomicWriter::create).transpose()?;
    pool.install(|| run_in_pool(files, settings, opts, jobs, out, stats_out))
}

fn run_in_pool(
    files: &Files,
    settings: &Settings,
    opts: RunOptions,
    jobs: usize,
    mut out: AtomicWriter,
    mut stats_out: Option<AtomicWriter>,
) -> Result<AlignStats, AlignError> {
    let mut total = AlignStats {
        schema: AlignStats::SCHEMA.to_string(),
        ..Default::default()
    };
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} align {pos} trajectories ({per_sec})")
                .expect("invariant: valid template"),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    for path in &files.inputs {
        let mut reader = open_records::<Trajectory>(path, opts.read)?;
        let mut record = 0u64;
        loop {
            let mut chunk = Vec::with_capacity(CHUNK_PER_JOB * jobs);
            for r in reader.by_ref().take(CHUNK_PER_JOB * jobs) {
                record += 1;
                chunk.push((record, r?));
            }
            if chunk.is_empty() {
                break;
            }
            // Alignment and serialization in parallel; writing in input order.
            let aligned: Vec<Result<(Vec<u8>, AlignStats), AlignError>> = chunk
                .par_iter()
                .map(|(rec, t)| {
                    let in_record = |e| AlignError::InRecord {
                        path: path.clone(),
                        record: *rec,
                        source: Box::new(e),
                    };
                    let (mut samples, mut st) = if t.is_uninformative() {
                        (Vec::new(), skipped(t))
                    } else {
                        align_trajectory(t, settings).map_err(in_record)?
                    };
                    by_harness::tag(&mut st, &mut samples, t);
                    let mut lines = Vec::new();
                    for sample in &samples {
                        serde_json::to_writer(&mut lines, sample).map_err(|e| {
                            in_record(AlignError::Invariant(format!("serializing a sample: {e}")))
                        })?;
                        lines.push(b'\n');
                    }
                    Ok((lines, st))
                })
                .collect();
            for a in aligned {
                let (lines, st) = a?;
                out.write_raw(&lines)?;
                add_stats(&mut total, &st);
                by_harness::add(&mut total, &st);
                if let Some(w) = stats_out.as_mut() {
                    w.write(&st)?;
                }
                bar.inc(1);
            }
        }
        reader.warn_skipped();
    }
    bar.finish_and_clear();
    if total.without_tokenizer > 0 {
        tracing::warn!(
            "align: {} of {} trajectories were aligned without the policy's tokenizer (no --model, and \
             they name none that loads): tool_call_mismatches, segment_breaks and \
             unlinked_assistant_messages are approximate for them; pass --model DIR",
            total.without_tokenizer,
            total.trajectories
        );
    }
    out.finish()?;
    if let Some(mut w) = stats_out {
        w.write(&total)?;
        w.finish()?;
    }
    Ok(total)
}

/// The stats of a trajectory align skips: dynamic sampling marked its group uninformative (no
/// reward variance, so no GSPO signal); it stays in the trajectories file as data.
fn skipped(t: &Trajectory) -> AlignStats {
    AlignStats {
        schema: AlignStats::SCHEMA.to_string(),
        trajectory_id: Some(t.id.clone()),
        trajectories: 1,
        skipped_uninformative: 1,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
