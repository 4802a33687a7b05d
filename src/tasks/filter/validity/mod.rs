//! Stage 3, validity (sandboxes): per task, the tests without the gold patch must fail where
//! FAIL_TO_PASS says and pass where PASS_TO_PASS says; with the gold patch the task must resolve;
//! all of it `--validity-runs N` times to catch flaky tests; a grader that passes without the fix
//! is rejected. Images come from build-images' manifest (`--images FILE`).
//!
//! Every check goes through the same [`Trial`](crate::sandbox::Trial) stages training uses, so a
//! task is judged by the grader that will later judge agents:
//! - SWE-style tasks: `evaluate` with an empty diff (without the fix) and with the gold patch as
//!   the diff, each in a fresh container from the pristine image (test patch applied, protected
//!   test files restored, collection hooks reverted, tests graded per test).
//! - Harbor tasks: `setup`, then the verifier on the untouched workdir (no-op solution, reward
//!   must be 0); and `setup`, `solution/` uploaded to `/solution`, `bash /solution/solve.sh` as the
//!   agent, then the verifier on the workdir's diff in a fresh container, exactly as an agent's
//!   work is graded (reward must be 1).
//!
//! Reasons (the `reason` of the decision record and funnel): `no_image`, `image_build_failed`,
//! `image_missing`, `no_grader`, `no_gold_patch`, `no_solution`, `flaky` (a graded test or the
//! reward differs between runs of the same check), `gold_patch_does_not_apply`,
//! `passes_without_fix`, `rewards_without_fix` (a partial Harbor reward without the solution),
//! `gold_does_not_resolve`, `solution_failed`, `f2p_passes_without_fix`,
//! `p2p_fails_without_fix`, `<stage>_failed` (a trial stage failed: test patch does not apply,
//! verifier timed out, ...) and `sandbox_error` (the engine failed).//!
//! The sandbox runs are in [`validator`]; the verdict from their results in [`judge`].

mod judge;
mod validator;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::io::IoError;
use crate::records::{AuditEvent, Task};
use crate::sandbox::SandboxError;

pub use validator::Validator;

/// Settings of the validity stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ValiditySettings {
    /// Repetitions of the with/without-fix check (≥ 1); any disagreement = flaky.
    pub runs: u32,
    /// build-images' manifests (`ImageRecord` zstd JSONL); a later record of a task wins.
    pub images: Vec<PathBuf>,
    /// Sandbox trials in flight at once.
    pub jobs: usize,
}

/// One task's validity verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidityVerdict {
    /// Valid; the evidence summarises the runs.
    Valid(Value),
    Invalid {
        reason: String,
        evidence: Value,
    },
}

fn invalid(reason: &str, evidence: Value) -> ValidityVerdict {
    ValidityVerdict::Invalid {
        reason: reason.to_string(),
        evidence,
    }
}

/// Errors of the validity stage (before any task is checked).
#[derive(Debug, thiserror::Error)]
pub enum ValidityError {
    #[error("the validity stage needs build-images' manifest: pass --images FILE")]
    NoImages,
    #[error("--validity-runs must be at least 1")]
    NoRuns,
    #[error("reading the image manifest: {0}")]
    Manifest(#[from] IoError),
    #[error("{path}: image manifest holds no records")]
    EmptyManifest { path: PathBuf },
    #[error("validity stage: {0}")]
    Engine(#[from] SandboxError),
    #[error("validity stage: cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// One task to check: the task and the directory its relative paths resolve against.
pub struct Candidate {
    pub task: Task,
    pub dir: PathBuf,
}

/// Which reference the check runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    WithoutFix,
    WithFix,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::WithoutFix => "without_fix",
            Mode::WithFix => "with_fix",
        }
    }
}

/// The reference solution of a task.
enum Reference {
    Patch(String),
    SolutionDir(PathBuf),
}

/// What one graded run produced.
#[derive(Debug, Clone)]
struct Run {
    reward: f64,
    tests: BTreeMap<String, String>,
    apply: Option<String>,
    audit: Vec<AuditEvent>,
    log_tail: Option<String>,
}

/// A failed run: the reason and its evidence.
type RunError = (String, Value);
