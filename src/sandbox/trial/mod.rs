//! One trial's container lifecycle: setup → agent → extract → evaluate → cleanup, each stage timed,
//! time-limited and classified, so every trial yields exactly one [`TrialResult`].
//!
//! - setup: a container from the task image on its own internal network (no host address, no route
//!   out; with [`Trial::with_proxy_socket`] its main process is the [`relay`] to the proxy, the only
//!   reachable endpoint), the caller's files written ([`Trial::with_files`]), non-root `agent` user, pids/memory/CPU limits, no Docker socket; the repository reset to the
//!   base commit and its history squashed to a single fresh commit (`rm -rf .git; git init`), so no
//!   ref, reflog, stash or object of the fix exists; files of the test patch are at their pre-patch
//!   state (absent when the patch creates them).
//! - agent: the caller's command, as `agent`, under the agent time limit.
//! - extract: every process of the agent user stopped and killed, then `git add -A; git diff --binary`
//!   against a root-only copy of the base, in a container where nothing of the agent's runs ([`stop`]).
//! - evaluate: SWE-style tasks in a *fresh* container from the pristine image with no network: apply
//!   the diff (`git apply`, `--3way`, `--reject`, `patch --fuzz=5`), revert what changes how grading
//!   starts (collection hooks, ini files, package metadata, start-up hooks: [`crate::grade::hooks`])
//!   and restore test helpers and every protected test file, in that order ([`revert`]), apply the
//!   test patch, run the tests as a non-root user with plugin autoload off, grade ([`crate::grade`]). Harbor tasks the
//!   same way: a fresh container, the diff applied, `/tests` uploaded only then, `test.sh` run as the
//!   task's verifier user (else non-root). A diff that plants a module shadowing what the grader
//!   imports, or compiled bytecode, gets reward 0 with reason `grader_tampering` ([`crate::grade::integrity`]).
//! - cleanup: containers and network removed on every path (a sweep by label catches the rest).
//!
//! The evaluate stage lives in [`evaluate`]; the whole lifecycle ([`Trial::run`]) in [`lifecycle`];
//! removal (the cleanup stage and the [`Drop`] backstop) in [`cleanup`].
//!
//! Failure classes: engine or setup problems are `infra:<stage>` (weight 0 in training); the agent's
//! own outcomes are `finished`, `agent_timeout`, `agent_crash`. Sabotage of extraction or grading
//! by the diff (a nested repository, a diff over [`TrialLimits::diff_bytes`], a test patch it keeps
//! from applying, a killed grading shell, no Harbor reward or one that is not `test.sh`'s own)
//! costs reward, not weight: reward 0 and an audit event naming it, never `infra:*`. Every result
//! file is read bounded ([`bounded`]); the test user's grading processes cannot trace one another
//! ([`noptrace`]); Harbor's reward files are root's to check ([`harbor_grader`]).
//!
//! Every defence can be switched off one by one, by tests only ([`Defence`]), to show that the
//! trick it stops really scores without it.
//!
//! Memory: the limit covers the whole container. An OOM kill in the agent stage is the agent's doing
//! (only its processes and the small relay run then, and the agent's processes volunteer as the
//! first victims): `agent_crash` when the agent exits non-zero (137), `finished` when the harness
//! survived the loss of a child, either way with an `oom_kill` audit event; if it took the container
//! down, `agent_crash` with reward 0 (nothing left to grade). A container that stops or vanishes in
//! the agent stage *without* an OOM kill was killed by someone else (operator, engine): `infra:agent`.
//! Running out of memory in a stage lego-rl runs (setup, extract) fails that stage: `infra:<stage>`.
//! The [`observe`] module reads the counters behind this, and the egress audit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod bounded;
mod cleanup;
mod defence;
mod evaluate;
mod harbor_grader;
mod lifecycle;
mod noptrace;
mod observe;
mod results;
mod revert;
mod setup;
mod signals;
mod stop;
mod swe_grader;
mod swe_verdict;

pub use defence::Defence;
pub use observe::{audit_events, parse_probe, probe_script, Counters, Egress};
pub use signals::{install_signal_sweep, interrupted, park_if_interrupted};
pub use stop::{agent_command, extract_script, take_outlived, BASE_GIT};

use super::images::{slug, DEFAULT_WORKDIR};
use super::relay;
use super::{ContainerSpec, Engine, ExecOutput, SandboxError, AGENT_USER, LABEL_RUN, LABEL_TRIAL};
use crate::records::{AuditEvent, Grader, GraderResult, StageTiming, Task, Termination};
use crate::text::sh_quote;

/// Resource limits and stage time limits of one trial.
#[derive(Debug, Clone)]
pub struct TrialLimits {
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
    pub setup: Duration,
    pub agent: Duration,
    pub eval: Duration,
    /// The largest diff read (bytes); a larger one gets reward 0 with a `diff_too_large` event.
    pub diff_bytes: u64,
}

/// [`TrialLimits::diff_bytes`]' default: far above any real fix, far below what would strain the
/// host, which holds every trial's diff in memory.
pub const MAX_DIFF_BYTES: u64 = 32 << 20;

impl TrialLimits {
    /// Limits from the task's timeouts with 4 GiB, 1 CPU and 512 processes.
    pub fn for_task(task: &Task) -> Self {
        TrialLimits {
            memory_bytes: 4 << 30,
            nano_cpus: 1_000_000_000,
            pids: 512,
            setup: Duration::from_secs_f64(task.timeouts.setup_s.max(1.0)),
            agent: Duration::from_secs_f64(task.timeouts.agent_s.max(1.0)),
            eval: Duration::from_secs_f64(task.timeouts.eval_s.max(1.0)),
            diff_bytes: MAX_DIFF_BYTES,
        }
    }
}

/// How the agent stage ended (as the sandbox sees it; harness adapters may refine it).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutcome {
    Finished,
    Timeout,
    /// Non-zero exit (137 = killed, e.g. by the OOM killer).
    Crash(Option<i64>),
}

/// Everything a trial produced, mapping onto the Trajectory record's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialResult {
    pub termination: Termination,
    pub infra_failure: bool,
    pub reward: Option<f64>,
    pub grader: Option<GraderResult>,
    pub stages: BTreeMap<String, StageTiming>,
    pub audit: Vec<AuditEvent>,
    pub diff: Option<String>,
    /// Agent stage output (tail), for logs.
    pub agent_log: Option<String>,
    /// Why an infra failure happened (`<stage>: <error>`); None otherwise.
    pub infra_cause: Option<String>,
    /// The agent command's exit code when it exited non-zero (not when it timed out); the
    /// `agent` stage's outcome says the same in words (`exit Some(N)`).
    pub agent_exit_code: Option<i64>,
    /// Files the harness left (see [`Trial::with_outputs`]): path → contents, for those that
    /// existed and were readable after the agent stage.
    pub outputs: BTreeMap<String, String>,
}

impl TrialResult {
    /// A result that ended as `termination` with nothing else recorded yet.
    pub fn new(termination: Termination) -> Self {
        TrialResult {
            termination,
            infra_failure: false,
            reward: None,
            grader: None,
            stages: BTreeMap::new(),
            audit: Vec::new(),
            diff: None,
            agent_log: None,
            infra_cause: None,
            agent_exit_code: None,
            outputs: BTreeMap::new(),
        }
    }
}

/// The most of one harness output file kept (its tail): a status file is small; a JSON transcript
/// that outgrows this is cut and no longer parses (the turn count decides), while the tail of a
/// JSON Lines stream still holds its last record, where a harness's final status is.
const MAX_OUTPUT_BYTES: usize = 16 << 20;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Files a unified diff touches (`diff --git a/X b/Y` → X and Y).
pub fn diff_files(diff: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in diff.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            for part in rest.split(' ') {
                if let Some(p) = part.strip_prefix("a/").or_else(|| part.strip_prefix("b/")) {
                    out.insert(p.to_string());
                }
            }
        }
    }
    out
}

pub use crate::grade::hooks::is_collection_hook;

/// One trial: the container(s) and network it owns and what happened so far.
pub struct Trial {
    engine: Engine,
    pub task: Task,
    task_root: PathBuf,
    image: String,
    run_id: String,
    trial_id: String,
    limits: TrialLimits,
    env: Vec<String>,
    binds: Vec<String>,
    workdir: String,
    container: Option<String>,
    network: Option<String>,
    eval_container: Option<String>,
    /// The container the diff was read from when the agent's container had to be killed.
    extract_container: Option<String>,
    /// The killed agent container's snapshot (see [`stop`]).
    snapshot_image: Option<String>,
    base_hash: Option<String>,
    /// Kernel counters and relay log after setup (see [`observe`]).
    baseline: Option<Counters>,
    /// Host path of the proxy's unix socket (see [`super::relay`]); `None`: no way out at all.
    proxy_socket: Option<PathBuf>,
    /// Files written into the container after setup, owned by the agent user.
    files: Vec<(String, Vec<u8>)>,
    /// Files read back after the agent stage.
    outputs: Vec<String>,
    /// Defences switched off (tests only; see [`Defence`]).
    off: BTreeSet<Defence>,
    /// The size of a diff over [`TrialLimits::diff_bytes`], when extraction found one.
    too_large: Option<u64>,
    pub stages: BTreeMap<String, StageTiming>,
    pub audit: Vec<AuditEvent>,
}

impl Trial {
    /// A trial of `task` on `image`; nothing is created until [`Trial::setup`].
    #[expect(
        clippy::too_many_arguments,
        reason = "plain constructor of a record-like struct"
    )]
    pub fn new(
        engine: Engine,
        task: Task,
        task_root: PathBuf,
        image: String,
        run_id: &str,
        trial_id: &str,
        limits: TrialLimits,
        env: Vec<String>,
        binds: Vec<String>,
    ) -> Self {
        let workdir = task
            .environment
            .workdir
            .clone()
            .unwrap_or_else(|| DEFAULT_WORKDIR.to_string());
        Trial {
            engine,
            task,
            task_root,
            image,
            run_id: run_id.to_string(),
            trial_id: trial_id.to_string(),
            limits,
            env,
            binds,
            workdir,
            container: None,
            network: None,
            eval_container: None,
            extract_container: None,
            snapshot_image: None,
            base_hash: None,
            baseline: None,
            proxy_socket: None,
            files: Vec::new(),
            outputs: Vec::new(),
            off: BTreeSet::new(),
            too_large: None,
            stages: BTreeMap::new(),
            audit: Vec::new(),
        }
    }

    /// Makes the proxy listening on the unix socket `host_socket` the trial's only reachable
    /// endpoint, at [`super::relay::proxy_url`] inside the container. The socket must exist
    /// before [`Trial::setup`] (a missing bind source would be created as a directory).
    pub fn with_proxy_socket(mut self, host_socket: PathBuf) -> Self {
        self.proxy_socket = Some(host_socket);
        self
    }

    /// Switches one defence off, for the adversarial tests that show its trick scores without it.
    /// Never used outside tests.
    #[doc(hidden)]
    pub fn without_defence(mut self, defence: Defence) -> Self {
        self.off.insert(defence);
        self
    }

    fn defended(&self, defence: Defence) -> bool {
        !self.off.contains(&defence)
    }

    /// Files (absolute path in the container → bytes) written after setup, before the agent
    /// stage, owned by the agent user (harness config files, the instruction).
    pub fn with_files(mut self, files: Vec<(String, Vec<u8>)>) -> Self {
        self.files = files;
        self
    }

    /// Files (absolute paths in the container) the harness writes and the caller wants back,
    /// read as the agent user once the agent stage is over (e.g. the harness's own exit status).
    pub fn with_outputs(mut self, paths: Vec<String>) -> Self {
        self.outputs = paths;
        self
    }

    /// Reads [`Trial::with_outputs`]' files; a missing or unreadable one is left out.
    async fn read_outputs(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for path in &self.outputs {
            let script = format!("tail -c {MAX_OUTPUT_BYTES} -- {}", sh_quote(path));
            match self.exec(AGENT_USER, &script, self.limits.setup).await {
                Ok(o) if o.ok() => {
                    out.insert(path.clone(), o.stdout);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!("trial {}: reading {path}: {e}", self.trial_id),
            }
        }
        out
    }

    fn name(&self, suffix: &str) -> String {
        format!("lego-rl-{}-{}{suffix}", slug(&self.run_id), slug(&self.trial_id))
    }

    /// A container of this trial from `image` with no network, no mounts and the trial's limits,
    /// idle until commands are exec'd (the evaluation and snapshot containers).
    fn offline_spec(&self, suffix: &str, image: String) -> ContainerSpec {
        ContainerSpec {
            name: self.name(suffix),
            image,
            labels: self.labels(),
            env: Vec::new(),
            network: "none".into(),
            memory_bytes: Some(self.limits.memory_bytes),
            nano_cpus: Some(self.limits.nano_cpus),
            pids_limit: Some(self.limits.pids),
            binds: Vec::new(),
            cmd: None,
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_RUN.to_string(), self.run_id.clone()),
            (LABEL_TRIAL.to_string(), self.trial_id.clone()),
        ])
    }

    fn record(&mut self, stage: &str, start: f64, outcome: &str) {
        self.stages.insert(
            stage.to_string(),
            StageTiming {
                start,
                end: now(),
                outcome: outcome.to_string(),
            },
        );
    }

    /// The trial container's id (after setup).
    pub fn container(&self) -> Option<&str> {
        self.container.as_deref()
    }

    fn is_swebench(&self) -> bool {
        matches!(self.task.grader, Some(Grader::Swebench { .. }))
    }

    /// Runs `script` in the trial container as `user` (used by setup, tests and harness adapters).
    pub async fn exec(
        &self,
        user: &str,
        script: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        let id = self.container.as_deref().ok_or(SandboxError::Stage {
            stage: "exec",
            message: "no container".into(),
        })?;
        self.engine
            .exec(id, user, &self.workdir, &self.env, script, timeout)
            .await
    }

    /// Copies `files` (path → bytes, relative to `dest`) into the trial container.
    pub async fn upload(&self, dest: &str, tar: Vec<u8>) -> Result<(), SandboxError> {
        let id = self.container.as_deref().ok_or(SandboxError::Stage {
            stage: "upload",
            message: "no container".into(),
        })?;
        self.engine.upload(id, dest, tar).await
    }

    /// Runs the agent's command as the agent user under the agent time limit (stage `agent`).
    pub async fn run_agent(&mut self, script: &str) -> Result<(AgentOutcome, ExecOutput), SandboxError> {
        let start = now();
        // Run as root only to start `setpriv`: the harness and everything it starts run as the
        // agent user, and are stopped and killed the moment it exits (see [`stop`]).
        let r = self
            .exec("root", &agent_command(script, &self.env), self.limits.agent)
            .await;
        let outcome = match &r {
            Err(_) => "error".to_string(),
            Ok(o) if o.timed_out => "timeout".into(),
            Ok(o) if o.exit_code == Some(0) => "ok".into(),
            Ok(o) => format!("exit {:?}", o.exit_code),
        };
        self.record("agent", start, &outcome);
        let out = r?;
        let kind = if out.timed_out {
            AgentOutcome::Timeout
        } else if out.exit_code == Some(0) {
            AgentOutcome::Finished
        } else {
            AgentOutcome::Crash(out.exit_code)
        };
        Ok((kind, out))
    }

    /// Grades the trial (stage `evaluate`); returns (reward, grader details).
    pub async fn evaluate(&mut self, diff: &str) -> Result<(f64, GraderResult), SandboxError> {
        let start = now();
        let r = match self.task.grader.clone() {
            Some(Grader::Swebench { test_cmd, test_files }) => {
                self.evaluate_swebench(diff, &test_cmd, &test_files).await
            }
            Some(Grader::Harbor { tests_dir }) => self.evaluate_harbor(diff, &tests_dir).await,
            None => Err(SandboxError::Stage {
                stage: "evaluate",
                message: format!("task {} has no grader", self.task.id),
            }),
        };
        self.record("evaluate", start, if r.is_ok() { "ok" } else { "error" });
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_files_and_hooks() {
        let d = "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n\
                 diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n";
        let files = diff_files(d);
        assert_eq!(
            files.into_iter().collect::<Vec<_>>(),
            vec!["src/x.py".to_string(), "tests/conftest.py".to_string()]
        );
        assert!(is_collection_hook("tests/conftest.py"));
        assert!(is_collection_hook("pyproject.toml"));
        assert!(!is_collection_hook("src/conftest_helper.py"));
    }
}
