//! The evaluate stage's two graders. Both run in a *fresh* container from the pristine task image
//! with no network, in which the agent never ran: the agent's diff is applied, files that would
//! change how grading runs are put back, and the tests run as a non-root user with Python's
//! safe-path mode, so neither the repository's working directory nor a planted module is
//! imported in place of the grader's own.
//!
//! - SWE-style ([`super::swe_grader`]): protected test files restored, the test patch applied, `test_cmd` run, statuses
//!   graded ([`crate::grade::swebench`]) from the grader's root-owned result stream ([`channel`]), which
//!   junit.xml must agree with.
//! - Harbor ([`super::harbor_grader`]): `/tests` uploaded only after the diff is applied, `test.sh`
//!   run as the task's `[verifier] user` (else the non-root agent user) with pytest's plugin
//!   autoload off (the image's plugins named in `PYTEST_PLUGINS`), `/logs/verifier/reward.*` read
//!   by root once it checked they are `test.sh`'s own.
//!
//! Before any test runs, [`crate::grade::integrity::tampering`] checks the diff; a diff that shadows a
//! module the grader imports, or a tree with planted bytecode (found at extraction), gets reward 0
//! with reason `grader_tampering`, and no test runs.

use std::collections::BTreeSet;

use super::{Defence, Trial};
use crate::grade::channel;
use crate::grade::integrity::{self, GRADER_TAMPERING};
use crate::records::{AuditEvent, GraderResult};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::SandboxError;
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

/// What root's preparation found.
pub(super) struct Prepared {
    /// The verdict when the diff tampers with grading (no test runs).
    pub verdict: Option<(f64, GraderResult)>,
    /// The pristine image's pytest plugins.
    pub plugins: Vec<String>,
    /// The config file pytest used at the base commit, when the import-path probe ran.
    pub config: Option<String>,
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
    ) -> Result<Prepared, SandboxError> {
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
        let config = channel::probe_config(&out.stdout);
        let (plugins, names): (Vec<&str>, Vec<&str>) = out
            .stdout
            .lines()
            .filter(|l| !l.starts_with("LEGO_SYSPATH ") && !l.starts_with("LEGO_INI"))
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
        Ok(Prepared {
            verdict: (!all.is_empty()).then(|| tampered(&all)),
            plugins,
            config,
        })
    }
}

/// The value after the first line starting with `prefix`.
pub(super) fn marker<'a>(stdout: &'a str, prefix: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| l.strip_prefix(prefix))
}
