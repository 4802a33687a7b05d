//! Task ingestion and the filter-tasks funnel.
//!
//! Every accepted input normalises to [`crate::records::Task`]:
//! - SWE-bench-style JSON Lines (official field names; `FAIL_TO_PASS`/`PASS_TO_PASS` as JSON
//!   arrays or JSON-encoded strings; `version` kept a string; unknown fields kept in `metadata`),
//!   also a `.json` file holding one array of such records;
//! - Harbor task directories (`task.toml` in the legacy and current key layouts, `instruction.md`,
//!   `environment/`, `tests/test.sh`, `solution/solve.sh`), or a directory of them;
//! - swebench 5.x task repositories (`tasks/<id>/task.yaml`, `tests.json`, `gold.patch`,
//!   `test.patch`, ...; [`swebench_repo`]), or single task directories of that layout;
//! - lego-rl `Task` records (`schema: "lego-rl/task/v1"`).
//!
//! The hot path (SWE-bench lines through rules and decontamination) never builds a `Task` for a
//! record it drops: [`view`] borrows the raw JSON fields and computes the few facts the stages need
//! ([`facts::Facts`]); only kept records are converted. [`filter`] holds the stages and the funnel.

pub mod chunks;
pub mod facts;
pub mod filter;
pub mod harbor;
pub mod json;
pub mod patch;
pub mod source;
pub mod swebench;
pub mod swebench_repo;
pub mod view;

use std::path::PathBuf;

/// Errors of task ingestion; each names the file (or directory), the record and the field.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error("{path}: record {line}: not a JSON object: {msg}")]
    NotJson { path: PathBuf, line: u64, msg: String },
    #[error("{path}: record {line}: field `{field}`: {msg}")]
    BadField {
        path: PathBuf,
        line: u64,
        field: String,
        msg: String,
    },
    #[error("{path}: record {line}: missing required field `{field}`")]
    MissingField {
        path: PathBuf,
        line: u64,
        field: &'static str,
    },
    #[error("{path}: record {line}: not a lego-rl task record: {msg}")]
    BadTaskRecord { path: PathBuf, line: u64, msg: String },
    #[error("{path}: cannot read task directory: {msg}")]
    TaskDir { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    Input { path: PathBuf, msg: String },
}

impl TaskError {
    /// A short machine-friendly reason for the funnel (`not_json`, `missing_field:instance_id`, ...).
    pub fn reason(&self) -> String {
        match self {
            TaskError::Io(_) => "unreadable_file".into(),
            TaskError::NotJson { .. } => "not_json".into(),
            TaskError::BadField { field, .. } => format!("bad_field:{field}"),
            TaskError::MissingField { field, .. } => format!("missing_field:{field}"),
            TaskError::BadTaskRecord { .. } => "bad_task_record".into(),
            TaskError::TaskDir { .. } => "unreadable_task_dir".into(),
            TaskError::Input { .. } => "bad_input".into(),
        }
    }

    /// Where the error is, as `path` or `path:line`, used as the decision's task id when the
    /// record could not be identified.
    pub fn locator(&self) -> String {
        match self {
            TaskError::Io(e) => match e {
                crate::io::IoError::BadRecord { path, line, .. } => format!("{}:{line}", path.display()),
                crate::io::IoError::Open { path, .. }
                | crate::io::IoError::Read { path, .. }
                | crate::io::IoError::Truncated { path, .. }
                | crate::io::IoError::TruncatedStream { path, .. }
                | crate::io::IoError::Write { path, .. }
                | crate::io::IoError::Serialize { path, .. }
                | crate::io::IoError::Skipped { path, .. } => path.display().to_string(),
            },
            TaskError::NotJson { path, line, .. }
            | TaskError::BadField { path, line, .. }
            | TaskError::MissingField { path, line, .. }
            | TaskError::BadTaskRecord { path, line, .. } => format!("{}:{line}", path.display()),
            TaskError::TaskDir { path, .. } | TaskError::Input { path, .. } => path.display().to_string(),
        }
    }
}
