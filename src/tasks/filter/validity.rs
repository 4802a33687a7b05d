//! Stage 3, validity (needs sandboxes): per task, the tests without the gold patch must fail
//! where FAIL_TO_PASS says and pass where PASS_TO_PASS says; with the gold patch the task must
//! resolve; all of it `--validity-runs N` times to catch flaky tests; a grader that passes
//! without the fix is rejected. Images come from build-images' manifest (`--images FILE`).
//!
//! The sandbox module that runs trials has not landed yet, so this file defines the stage's
//! interface and settings only, and selecting the stage is an error — it never pretends to
//! have checked anything.

use std::path::PathBuf;

use crate::records::{ImageRecord, Task};

/// Settings of the validity stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ValiditySettings {
    /// Repetitions of the with/without-gold-patch check (≥ 1); any disagreement = flaky.
    pub runs: u32,
    /// build-images' manifest (`ImageRecord` zstd JSONL).
    pub images: Option<PathBuf>,
}

/// One task's validity verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidityVerdict {
    Valid,
    /// e.g. `passes_without_fix`, `gold_does_not_resolve`, `flaky:<test>`, `no_image`.
    Invalid {
        reason: String,
        evidence: serde_json::Value,
    },
}

/// What runs the checks: implemented by the sandbox side.
pub trait ValidityChecker: Sync {
    /// Checks one task in its image, `runs` times.
    fn check(&self, task: &Task, image: &ImageRecord, runs: u32) -> Result<ValidityVerdict, ValidityError>;
}

/// Errors of the validity stage.
#[derive(Debug, thiserror::Error)]
pub enum ValidityError {
    #[error("validity stage requires sandbox support (not yet available); run without --validity-runs/--images or drop `validity` from --stages")]
    Unavailable,
}

/// Returns the checker for these settings; none exists in this build.
pub fn checker(_settings: &ValiditySettings) -> Result<Box<dyn ValidityChecker>, ValidityError> {
    Err(ValidityError::Unavailable)
}
