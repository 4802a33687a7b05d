//! The filter-tasks funnel: from a raw task pool to a difficulty-banded training set.
//!
//! Stages run in a fixed order, each optional and each counted in the [`Funnel`]:
//! `rules` → `decontamination` → `validity` → `difficulty` → `saturation`. Records stream
//! through in batches: one thread reads and decompresses, rayon evaluates every per-record
//! stage in parallel, and a sequential pass (the only cross-record state: duplicates) decides in
//! input order, so the output is the same for the same inputs whatever the thread count.
//! Nothing is sampled (the difficulty band takes the first k trials in (group, sample) order),
//! so there is no seed to set.

pub mod decontam;
pub mod funnel;
mod pipeline;
pub mod rules;
pub mod trials;
pub mod validity;

use std::path::PathBuf;

pub use decontam::{Decontamination, EvalSet};
pub use funnel::{Funnel, Stage, StageCount};
pub use pipeline::{run, Summary};
pub use rules::RuleSettings;
pub use trials::{Difficulty, Incomplete, Saturation};
pub use validity::ValiditySettings;

/// Why a stage dropped a task.
#[derive(Debug, Clone, PartialEq)]
pub struct Drop {
    /// Short snake_case reason (`statement_too_short`, `eval_repo`, `never_solved`, ...).
    pub reason: String,
    /// The values that decided it (the failing value and its bound, pass counts, ...).
    pub evidence: serde_json::Value,
}

/// Resolved settings of one filter run; every input file is already loaded.
#[derive(Debug, Default)]
pub struct Settings {
    pub inputs: Vec<PathBuf>,
    /// Kept tasks (`-` = stdout).
    pub output: PathBuf,
    pub decisions: Option<PathBuf>,
    pub funnel_csv: Option<PathBuf>,
    /// Run the stages and report, but write no kept tasks.
    pub dry_run: bool,
    /// Record bad inputs in the funnel and decisions instead of stopping at the first.
    pub keep_going: bool,
    pub rules: Option<RuleSettings>,
    pub decontamination: Option<Decontamination>,
    pub validity: Option<ValiditySettings>,
    pub difficulty: Option<Difficulty>,
    pub saturation: Option<Saturation>,
}

impl Settings {
    /// The enabled stages, in pipeline order.
    pub fn stages(&self) -> Vec<Stage> {
        let mut s = Vec::new();
        if self.rules.is_some() {
            s.push(Stage::Rules);
        }
        if self.decontamination.is_some() {
            s.push(Stage::Decontamination);
        }
        if self.validity.is_some() {
            s.push(Stage::Validity);
        }
        if self.difficulty.is_some() {
            s.push(Stage::Difficulty);
        }
        if self.saturation.is_some() {
            s.push(Stage::Saturation);
        }
        s
    }
}

/// Errors of a filter run.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error(transparent)]
    Task(#[from] crate::tasks::TaskError),
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error(transparent)]
    Validity(#[from] validity::ValidityError),
    #[error(
        "{count} task(s) have fewer than {k} counted trials (missing or infra-failed), e.g. {examples}; \
         re-run their trials, or pass --incomplete-trials drop|keep"
    )]
    IncompleteTrials { count: u64, k: u32, examples: String },
    #[error("{path}: cannot write funnel CSV: {source}")]
    FunnelCsv {
        path: PathBuf,
        #[source]
        source: csv::Error,
    },
    #[error("reader thread failed: {0}")]
    Reader(String),
}
