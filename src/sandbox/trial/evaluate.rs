//! The evaluate stage's two graders. Both run in a *fresh* container from the pristine task image
//! with no network, in which the agent never ran: the agent's diff is applied, files that would
//! change how grading runs are put back, and the tests run as a non-root user with Python's
//! safe-path mode, so neither the repository's working directory nor a planted module is
//! imported in place of the grader's own.
//!
//! - SWE-style ([`super::swe_grader`]): protected test files restored, the test patch applied, `test_cmd` run, statuses
//!   graded ([`grade::swebench`]) from the grader's root-owned result stream ([`channel`]), which
//!   junit.xml must agree with.
//! - Harbor: `/tests` uploaded only after the diff is applied, `test.sh` run as the task's
//!   `[verifier] user` (else the non-root agent user) with pytest's plugin autoload off (the image's
//!   plugins named in `PYTEST_PLUGINS`), `/logs/verifier/reward.*` read by root.
//!
//! Before any test runs, [`grade::integrity::tampering`] checks the diff; a diff that shadows a
//! module the grader imports, or a tree with planted bytecode (found at extraction), gets reward 0
//! with reason `grader_tampering`, and no test runs.

use std::collections::BTreeSet;
use std::time::Duration;

use super::revert::Reverts;
use super::{diff_files, Defence, Trial};
use crate::grade;
use crate::grade::channel;
use crate::grade::integrity::{self, GRADER_TAMPERING};
use crate::records::{AuditEvent, GraderResult};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::{SandboxError, AGENT_USER};
use crate::text::{sh_quote, tail_bytes};

/// Exported before every command that runs code of the repository while grading: no implicit
/// working directory on `sys.path` (`-m`, `-c`), no user site-packages.
pub(super) const SAFE_PYTHON: &str = "export PYTHONSAFEPATH=1 PYTHONNOUSERSITE=1";

pub(super) fn stage_error(message: String) -> SandboxError {
    SandboxError::Stage {
        stage: "evaluate",
        message,
    }
}

/// The grading result of a trial whose diff tampers with grading: reward 0, tests not run.
pub(super) fn tampered(events: &[AuditEvent]) -> (f64, GraderResult) {
    let what: Vec<&str> = events.iter().map(|e| e.detail.as_str()).collect();
    (
        0.0,
        GraderResult {
            reason: Some(GRADER_TAMPERING.into()),
            log_tail: Some(format!("not graded: {}", what.join("; "))),
            ..Default::default()
        },
    )
}

/// The grading result of a trial whose diff broke grading itself (a test patch that no longer
/// applies, a killed grading shell, no reward file): the agent's doing, so reward 0 and a trial
/// that counts, with the audit event `kind`.
pub(super) fn sabotaged(kind: &str, apply: Option<String>, log: &str) -> ((f64, GraderResult), AuditEvent) {
    (
        (
            0.0,
            GraderResult {
                reason: Some(kind.into()),
                apply,
                log_tail: Some(tail_bytes(log, 4000)),
                ..Default::default()
            },
        ),
        AuditEvent {
            kind: kind.into(),
            detail: format!("grading failed on the agent's diff ({kind}): reward 0"),
            generation: None,
        },
    )
}

/// Lists, one module a line after `pytest11 `, the plugins the pristine image really has (entry
/// point group `pytest11`): with autoload off they are loaded by `-p`, and nothing the diff adds is.
pub const PYTEST_PLUGINS_PY: &str = "import importlib.metadata as m\n\
seen = set()\n\
for ep in m.entry_points(group='pytest11'):\n    mod = ep.value.split(':')[0].strip()\n    \
if mod and mod not in seen:\n        seen.add(mod)\n        print('pytest11 ' + mod)";

/// The grading result of tests that ran out of time on the agent's diff: its doing (the task's
/// gold patch passed within the limit), so reward 0, not an infra failure.
pub(super) fn timed_out(stdout: &str) -> (f64, GraderResult) {
    (
        0.0,
        GraderResult {
            reason: Some("eval_timeout".into()),
            apply: marker(stdout, "LEGO_APPLY=").map(str::to_string),
            log_tail: Some("the tests ran out of time on the agent's diff".into()),
            ..Default::default()
        },
    )
}

impl Trial {
    /// Creates and starts the evaluation container from the pristine image with `files` under
    /// `/tmp/lego/`.
    pub(super) async fn start_eval_container(
        &mut self,
        files: &[(&str, &[u8])],
    ) -> Result<String, SandboxError> {
        let spec = self.offline_spec("-eval", self.image.clone());
        let id = self.engine.create_container(&spec).await?;
        self.eval_container = Some(id.clone());
        self.engine.start_container(&id).await?;
        let mut tar = TarBuilder::new();
        tar.dir("lego");
        for (name, bytes) in files {
            tar.file(&format!("lego/{name}"), bytes, 0o644);
        }
        self.engine.upload(&id, "/tmp", tar.finish()).await?;
        Ok(id)
    }

    /// Root's preparation in the evaluation container (`prep`, ending with the grader
    /// interpreter's importable names) and the tampering check of `diff` against those names.
    pub(super) async fn prepare_and_check(
        &mut self,
        id: &str,
        prep: &str,
        diff: &str,
        dirs: &BTreeSet<String>,
    ) -> Result<(Option<(f64, GraderResult)>, Vec<String>), SandboxError> {
        let script = format!(
            "set -e; {prep}; cd /; python3 -I -c {} 2>/dev/null || true; python3 -I -c {} 2>/dev/null || true",
            sh_quote(integrity::IMPORTABLE_NAMES_PY),
            sh_quote(PYTEST_PLUGINS_PY)
        );
        let out = self
            .engine
            .exec(id, "root", "/", &[], &script, self.limits.eval)
            .await?;
        if !out.ok() {
            return Err(stage_error(format!(
                "preparing the evaluation container: exit {:?}: {}",
                out.exit_code,
                tail_bytes(&out.stderr, 2000)
            )));
        }
        // The import-path probe's directories, when it ran (see `evaluate_swebench`).
        let mut dirs = dirs.clone();
        dirs.extend(channel::syspath_dirs(&out.stdout));
        let (plugins, names): (Vec<&str>, Vec<&str>) = out
            .stdout
            .lines()
            .filter(|l| !l.starts_with("LEGO_SYSPATH "))
            .partition(|l| l.starts_with("pytest11 "));
        let plugins: Vec<String> = plugins
            .iter()
            .filter_map(|l| l.strip_prefix("pytest11 "))
            .map(str::to_string)
            .collect();
        if self.defended(Defence::Shadowing) {
            let events = integrity::tampering(diff, &dirs, &integrity::grader_names(&names.join("\n")));
            self.audit.extend(events);
        }
        // This check's events and extraction's (planted bytecode).
        let all: Vec<AuditEvent> = self
            .audit
            .iter()
            .filter(|e| integrity::TAMPERING_KINDS.contains(&e.kind.as_str()))
            .cloned()
            .collect();
        Ok(((!all.is_empty()).then(|| tampered(&all)), plugins))
    }

    /// The task's `[verifier] user` (Harbor's task.toml, kept in the task's metadata).
    fn verifier_user(&self) -> Option<String> {
        self.task
            .metadata
            .get("harbor")?
            .pointer("/task_toml/verifier/user")?
            .as_str()
            .filter(|u| !u.is_empty())
            .map(str::to_string)
    }

    pub(super) async fn evaluate_harbor(
        &mut self,
        diff: &str,
        tests_dir: &str,
    ) -> Result<(f64, GraderResult), SandboxError> {
        let dir = self.task_root.join(tests_dir);
        let mut tests = TarBuilder::new();
        tests.dir("tests");
        tests
            .dir_tree(&dir, "tests")
            .map_err(|source| SandboxError::ReadFile {
                path: dir.clone(),
                source,
            })?;
        let user = self.verifier_user().unwrap_or_else(|| AGENT_USER.to_string());
        if user == "root" || user == "0" {
            return Err(stage_error(
                "the task's [verifier] user is root: lego-rl runs verifiers as a non-root user".into(),
            ));
        }
        // Hooks are left out of the diff (there is no base repository here to restore from).
        let touched = diff_files(diff);
        let reverts = Reverts::plan(&touched, &BTreeSet::new(), &BTreeSet::new(), &self.off);
        self.audit.extend(reverts.events());
        let hooks: BTreeSet<String> = reverts.in_order().cloned().collect();
        let diff = integrity::drop_sections(diff, &hooks);
        let id = self
            .start_eval_container(&[("agent.diff", diff.as_bytes())])
            .await?;
        let (wd, u) = (sh_quote(&self.workdir), sh_quote(&user));
        let prep = format!(
            "id -u {u} >/dev/null 2>&1 || {{ echo \"the task's verifier user {u} does not exist in its image\" >&2; exit 3; }}; \
             rm -rf /tests /logs/verifier; mkdir -p {wd} /logs/verifier; chown -R {u} {wd} /logs/verifier"
        );
        let dirs = BTreeSet::from([String::new()]);
        let (verdict, plugins) = self.prepare_and_check(&id, &prep, &diff, &dirs).await?;
        if let Some(verdict) = verdict {
            return Ok(verdict);
        }
        // test.sh runs pytest itself: autoload off there too, the image's own plugins by name
        // (`PYTEST_PLUGINS`, read by every pytest test.sh starts; nothing the diff adds is).
        let autoload = if self.defended(Defence::PluginAutoload) {
            let named = if plugins.is_empty() {
                String::new()
            } else {
                format!(" PYTEST_PLUGINS={}", sh_quote(&plugins.join(",")))
            };
            format!("export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1{named}; ")
        } else {
            String::new()
        };
        let parent = std::path::Path::new(&self.workdir)
            .parent()
            .map_or("/".to_string(), |p| p.display().to_string());
        let apply = format!(
            "cd {wd}; export GIT_CEILING_DIRECTORIES={}; D=/tmp/lego/agent.diff; \
             if [ ! -s $D ]; then M=none; \
             elif git apply --binary $D 2>/dev/null; then M='git apply'; \
             elif patch --batch --fuzz=5 -p1 -i $D >/dev/null 2>&1; then M='patch --fuzz=5'; \
             else M=failed; fi; echo \"LEGO_APPLY=$M\"",
            sh_quote(&parent)
        );
        let applied = self
            .engine
            .exec(&id, &user, "/", &[], &apply, self.limits.eval)
            .await?;
        let apply = marker(&applied.stdout, "LEGO_APPLY=").map(str::to_string);
        // The tests arrive only now, readable by the verifier user, writable by root alone.
        self.engine.upload(&id, "/", tests.finish()).await?;
        let run = format!(
            "chmod -R a+rX /tests; \
             setpriv --reuid={u} --regid={u} --init-groups -- env HOME=/tmp bash -c {}; echo \"LEGO_EXIT=$?\"",
            sh_quote(&format!(
                "cd {wd}; {SAFE_PYTHON}; {autoload}bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
            ))
        );
        let out = self
            .engine
            .exec(&id, "root", "/", &[], &run, self.limits.eval)
            .await?;
        if out.timed_out && !diff.trim().is_empty() {
            return Ok(timed_out(&out.stdout));
        }
        if out.timed_out {
            return Err(stage_error("verifier timed out".into()));
        }
        let exit_code = marker(&out.stdout, "LEGO_EXIT=").and_then(|c| c.trim().parse().ok());
        let short = Duration::from_secs(60);
        let read = |f: &'static str| {
            format!("if [ -f /logs/verifier/{f} ]; then echo LEGO_PRESENT; cat /logs/verifier/{f}; fi")
        };
        let json = self
            .engine
            .exec(&id, "root", "/", &[], &read("reward.json"), short)
            .await?
            .stdout;
        let txt = self
            .engine
            .exec(&id, "root", "/", &[], &read("reward.txt"), short)
            .await?
            .stdout;
        let log = self
            .engine
            .exec(
                &id,
                "root",
                "/",
                &[],
                "tail -c 20000 /logs/verifier/test-stdout.txt",
                short,
            )
            .await?
            .stdout;
        let present = |s: &str| s.strip_prefix("LEGO_PRESENT\n").map(str::to_string);
        let parsed = grade::harbor::parse_reward(present(&json).as_deref(), present(&txt).as_deref());
        // test.sh must finish for its reward to count: killed (by a signal: exit 128+n, or no
        // exit line at all) or leaving no reward, on a non-empty diff, is the diff's doing.
        if !diff.trim().is_empty() && self.defended(Defence::SabotageCostsReward) {
            let kind = match (&parsed, exit_code) {
                (_, None) => Some("grading_killed"),
                (_, Some(c)) if c >= 128 => Some("grading_killed"),
                (Err(grade::GradeError::MissingReward), _) => Some("reward_missing"),
                _ => None,
            };
            if let Some(kind) = kind {
                let (verdict, event) = sabotaged(kind, apply, &log);
                self.audit.push(event);
                return Ok(verdict);
            }
        }
        let parsed = parsed.map_err(|e| stage_error(e.to_string()))?;
        let tests = parsed
            .components
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        Ok((
            parsed.reward,
            GraderResult {
                tests,
                exit_code,
                apply,
                log_path: None,
                log_tail: Some(tail_bytes(&log, 4000)),
                reason: None,
            },
        ))
    }
}

/// The value after the first line starting with `prefix`.
pub(super) fn marker<'a>(stdout: &'a str, prefix: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| l.strip_prefix(prefix))
}
