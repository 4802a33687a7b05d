//! `Task` (one training or evaluation problem) and `TaskDecision` (filter-tasks' verdict on one).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where a task came from.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TaskSource {
    /// A SWE-bench-style instance (official field names).
    Swebench,
    /// A Harbor task directory (task.toml, instruction.md, environment/, tests/, solution/).
    Harbor,
    /// Written directly as a lego-rl task record.
    #[default]
    LegoRl,
}

/// Where the task's repository comes from when the environment is built.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RepoSource {
    /// A git bundle file (path relative to the task file's directory, or absolute).
    Bundle { path: String },
    /// A tarball of a git working tree with its `.git` directory.
    Tarball { path: String },
    /// A clonable URL (needs network at build time).
    Git { url: String },
}

/// How to build or find the task's container environment.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Environment {
    /// Dockerfile text of the task's environment (built by build-images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    /// Build context directory (relative to the task file's directory, or absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// A prebuilt image to use as is instead of building.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The repository, checked out at `base_commit` into `workdir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_source: Option<RepoSource>,
    /// Working directory of the agent inside the container (default `/testbed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Shell commands that install the project's dependencies (shared by tasks of one repo+version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
}

/// How a finished trial is graded.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Grader {
    /// SWE-bench semantics: run `test_cmd` on the test files, parse per-test statuses; reward 1
    /// iff every FAIL_TO_PASS passes and every PASS_TO_PASS passes or is skipped.
    Swebench {
        /// e.g. `python -m pytest -rA -p no:cacheprovider`; test files are appended.
        test_cmd: String,
        /// Test files to run (those touched by the test patch when empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        test_files: Vec<String>,
    },
    /// Harbor semantics: run `/tests/test.sh`, read `/logs/verifier/reward.json` then `reward.txt`.
    Harbor {
        /// Directory holding test.sh and its files (relative to the task file's directory).
        tests_dir: String,
    },
}

/// Per-stage time limits of a trial, in seconds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Timeouts {
    pub setup_s: f64,
    pub agent_s: f64,
    pub eval_s: f64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            setup_s: 300.0,
            agent_s: 1800.0,
            eval_s: 900.0,
        }
    }
}

/// Solved trials over counted (graded, non-infra) trials of a task, in the window filter-tasks
/// judged it on (`Task::pass_rate`). On read, `rate` may be left out (it is derived from
/// `solved / trials`); a `rate` given must agree with them to within [`PassRate::TOLERANCE`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(try_from = "PassRateFields")]
pub struct PassRate {
    /// `solved / trials` (0 when `trials` is 0), for readers that want the number.
    pub rate: f64,
    pub solved: u32,
    pub trials: u32,
}

/// A `pass_rate` as written, before [`PassRate`] derives or checks its `rate`.
#[derive(Deserialize)]
struct PassRateFields {
    #[serde(default)]
    rate: Option<f64>,
    solved: u32,
    trials: u32,
}

impl TryFrom<PassRateFields> for PassRate {
    type Error = String;
    fn try_from(f: PassRateFields) -> Result<Self, String> {
        let p = PassRate::new(f.solved, f.trials);
        match f.rate {
            // The derived rate, exact, even where the written one was rounded. (`<=` is false
            // for a NaN rate, which is an error too.)
            None => Ok(p),
            Some(r) if (r - p.rate).abs() <= Self::TOLERANCE => Ok(p),
            Some(r) => Err(format!(
                "rate {r} disagrees with solved / trials = {} / {} = {}",
                f.solved, f.trials, p.rate
            )),
        }
    }
}

impl PassRate {
    /// How far a written `rate` may be from `solved / trials`: a rate rounded to 3 decimals
    /// (1/3 as 0.333) is read, a rate of another task or window is not.
    pub const TOLERANCE: f64 = 5e-4;

    /// The rate of `solved` of `trials`.
    pub fn new(solved: u32, trials: u32) -> Self {
        PassRate {
            rate: if trials == 0 {
                0.0
            } else {
                f64::from(solved) / f64::from(trials)
            },
            solved,
            trials,
        }
    }
}

/// One task (`lego-rl/task/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Task {
    pub schema: String,
    /// Unique id (SWE-bench `instance_id`, Harbor directory name, ...).
    pub id: String,
    #[serde(default)]
    pub source: TaskSource,
    /// `owner/name` of the repository, used for repository-level decontamination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// Problem statement given to the agent.
    pub instruction: String,
    /// Reference solution as a unified diff (SWE-bench `patch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold_patch: Option<String>,
    /// Diff that adds or updates the tests (hidden from the agent, applied before grading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_patch: Option<String>,
    #[serde(default)]
    pub fail_to_pass: Vec<String>,
    #[serde(default)]
    pub pass_to_pass: Vec<String>,
    #[serde(default)]
    pub environment: Environment,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<Grader>,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// The harness adapter (its `name`, e.g. `mini-swe-agent`) this task runs on when rollout is
    /// given several (`--harness-mix task`, the default); ignored with one harness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
    /// The task's recent pass rate under the training policy, written by `filter-tasks` (the
    /// saturation stage, from `--drop-saturated` trajectories; else the difficulty stage, from
    /// `--trials`); `rollout --pool-order curriculum` draws extra groups by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate: Option<PassRate>,
    /// Anything else from the source record (kept verbatim, e.g. SWE-bench `version`).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

impl Task {
    /// A task with only the required fields set.
    pub fn new(id: impl Into<String>, instruction: impl Into<String>) -> Self {
        Task {
            schema: <Task as super::Record>::SCHEMA.to_string(),
            id: id.into(),
            source: TaskSource::LegoRl,
            repo: None,
            base_commit: None,
            instruction: instruction.into(),
            gold_patch: None,
            test_patch: None,
            fail_to_pass: Vec::new(),
            pass_to_pass: Vec::new(),
            environment: Environment::default(),
            grader: None,
            timeouts: Timeouts::default(),
            harness: None,
            pass_rate: None,
            metadata: Map::new(),
        }
    }
}

impl Task {
    /// Resolves the relative paths of this task (build context, repository bundle or tarball,
    /// Harbor tests dir) against `dir`, the directory of the file it was read from, so the record
    /// stays valid when written elsewhere (e.g. into a run directory). Returns whether any changed.
    pub fn absolutize_paths(&mut self, dir: &std::path::Path) -> bool {
        let mut changed = false;
        let mut fix = |p: &mut String| {
            if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
                *p = dir.join(p.as_str()).display().to_string();
                changed = true;
            }
        };
        if let Some(c) = self.environment.context.as_mut() {
            fix(c);
        }
        match self.environment.repo_source.as_mut() {
            Some(RepoSource::Bundle { path }) | Some(RepoSource::Tarball { path }) => fix(path),
            _ => {}
        }
        if let Some(Grader::Harbor { tests_dir }) = self.grader.as_mut() {
            fix(tests_dir);
        }
        // Harbor's reference solution (filter-tasks' validity stage runs it).
        if let Some(serde_json::Value::String(s)) = self.metadata.get_mut("solution_dir") {
            fix(s);
        }
        changed
    }
}

/// filter-tasks' decision on one task (`lego-rl/task-decision/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TaskDecision {
    pub schema: String,
    pub task_id: String,
    pub kept: bool,
    /// The stage that dropped it (`rules`, `decontamination`, `validity`, `difficulty`,
    /// `saturation`), or the last stage it passed.
    pub stage: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Stage-specific evidence (e.g. pass counts, the failing rule's value and bound).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub evidence: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_rate_derives_its_rate_on_read_and_rejects_one_that_disagrees() {
        let read = |j: &str| serde_json::from_str::<PassRate>(j);
        // Left out: derived from solved / trials (0 without trials).
        assert_eq!(read(r#"{"solved":1,"trials":4}"#).unwrap(), PassRate::new(1, 4));
        assert_eq!(read(r#"{"solved":1,"trials":4}"#).unwrap().rate, 0.25);
        assert_eq!(read(r#"{"solved":0,"trials":0}"#).unwrap().rate, 0.0);
        // Given and consistent (rounded to 3 decimals too): read, as the exact rate.
        assert_eq!(read(r#"{"rate":0.25,"solved":1,"trials":4}"#).unwrap().rate, 0.25);
        assert_eq!(
            read(r#"{"rate":0.333,"solved":1,"trials":3}"#).unwrap().rate,
            1.0 / 3.0
        );
        // Given and inconsistent: an error naming both.
        let e = read(r#"{"rate":0.75,"solved":1,"trials":4}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rate 0.75 disagrees with solved / trials = 1 / 4 = 0.25"),
            "{e}"
        );
        // What is written always carries the rate, and reads back equal.
        let p = PassRate::new(2, 3);
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains("\"rate\":0.6666"), "{text}");
        assert_eq!(read(&text).unwrap(), p);
        // In a task record: a pool file written by hand without rates reads.
        let t: Task = serde_json::from_str(
            r#"{"schema":"lego-rl/task/v1","id":"a","instruction":"x","pass_rate":{"solved":3,"trials":4}}"#,
        )
        .unwrap();
        assert_eq!(t.pass_rate.map(|p| p.rate), Some(0.75));
    }
}
