//! Grading: turn what a test run left behind into a reward, with the semantics of the task's source.
//!
//! - [`swebench`]: per-test statuses from pytest's JUnit XML (preferred) or its `-rA` summary
//!   ([`pytest`]); reward 1 iff every FAIL_TO_PASS test passed and every PASS_TO_PASS test passed or
//!   was skipped (SWE-bench's RESOLVED_FULL). No evidence that the suite ran is never a pass.
//! - [`channel`]: the per-test stream the grader's own pytest plugin writes to a root-owned pipe;
//!   it decides SWE statuses, and junit.xml is checked against it.
//! - [`harbor`]: `/logs/verifier/reward.json` then `reward.txt`; a missing or non-finite reward is an
//!   error (on the agent's diff: reward 0 with `reward_missing` or `reward_tampering`; otherwise an
//!   infra failure), and the checks that the reward root reads is the one `test.sh` wrote.
//!
//! Pure functions over text, so they are unit-tested without containers; `sandbox::trial` runs the
//! commands and feeds the outputs here.

pub mod channel;
pub mod harbor;
pub mod hooks;
pub mod integrity;
pub mod pytest;
pub mod swebench;

/// Why a trial could not be graded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GradeError {
    #[error("no reward file: neither reward.json nor reward.txt was written")]
    MissingReward,
    #[error("reward file {file}: {message}")]
    BadReward { file: &'static str, message: String },
    /// The reward is not the one the verifier wrote (see `grade::harbor::tampering`).
    #[error("the reward is not test.sh's own: {0}")]
    Tampered(String),
}
