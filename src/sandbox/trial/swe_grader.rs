//! The SWE-style grader of the evaluate stage (see [`super::evaluate`] for what both graders
//! share and why), phase by phase: which files are protected and put back, root's preparation of
//! the fresh container (the grader's plugin, the import-path probe), the grading script the test
//! user runs (the diff applied, hooks and tests restored, the test patch, `test_cmd`), and the
//! verdict from the result stream, junit.xml or the log.

use std::collections::BTreeSet;

use super::evaluate::{marker, sabotaged, stage_error, timed_out, SAFE_PYTHON};
use super::noptrace;
use super::results::{grading_wrapper, Wrap};
use super::revert::Reverts;
use super::stop::neutral_attributes_script;
use super::swe_verdict::VerdictContext;
use super::{diff_files, Defence, Trial};
use crate::grade::channel;
use crate::grade::hooks;
use crate::grade::integrity;
use crate::records::GraderResult;
use crate::sandbox::{SandboxError, AGENT_USER};
use crate::text::{sh_quote, tail_bytes};

/// What the grading script is given to put back and run.
struct Grading<'a> {
    /// The working directory and base commit, shell-quoted.
    wd: String,
    base: String,
    test_cmd: &'a str,
    test_files: &'a [String],
    reverts: Reverts,
    /// Test files (of the test patch, `test_files` and the graded test ids) and those the diff
    /// touched.
    protected: BTreeSet<String>,
    touched: BTreeSet<String>,
    /// The pristine image's pytest plugins (loaded by name when autoload is off).
    plugins: Vec<String>,
    channel: bool,
    /// The stream's lines carry the grading's key.
    keyed: bool,
}

impl Trial {
    pub(super) async fn evaluate_swebench(
        &mut self,
        diff: &str,
        test_cmd: &str,
        test_files: &[String],
    ) -> Result<(f64, GraderResult), SandboxError> {
        let test_patch = self.task.test_patch.clone().unwrap_or_default();
        let touched = diff_files(diff);
        let mut protected: BTreeSet<String> = diff_files(&test_patch);
        protected.extend(test_files.iter().cloned());
        for t in self.task.fail_to_pass.iter().chain(&self.task.pass_to_pass) {
            if let Some(file) = t.split("::").next() {
                protected.insert(file.to_string());
            }
        }
        let test_dirs = hooks::test_dirs(protected.iter().map(String::as_str));
        let reverts = Reverts::plan(&touched, &protected, &test_dirs, &self.off);
        self.audit.extend(reverts.events());
        let id = self
            .start_eval_container(&[
                ("agent.diff", diff.as_bytes()),
                ("test.patch", test_patch.as_bytes()),
                ("plugin.py", channel::PLUGIN_PY.as_bytes()),
            ])
            .await?;
        let wd = sh_quote(&self.workdir);
        let base = sh_quote(self.task.base_commit.as_deref().unwrap_or("HEAD"));
        let prep = self.swebench_prep(&wd, &base, test_cmd);
        let tests = test_files
            .iter()
            .chain(&self.task.fail_to_pass)
            .chain(&self.task.pass_to_pass)
            .map(String::as_str);
        let dirs = integrity::search_dirs(test_cmd, tests);
        let prepared = self.prepare_and_check(&id, &prep, diff, &dirs).await?;
        if let Some(verdict) = prepared.verdict {
            return Ok(verdict);
        }
        let (plugins, base_config) = (prepared.plugins, prepared.config);
        let channel = self.defended(Defence::ResultChannel);
        let wrap = Wrap {
            channel,
            keyed: channel && self.defended(Defence::KeyedResults),
            no_ptrace: self.defended(Defence::NoPtrace),
        };
        let grading = Grading {
            wd,
            base,
            test_cmd,
            test_files,
            reverts,
            protected,
            touched,
            plugins,
            channel,
            keyed: wrap.keyed,
        };
        let script = self.swebench_script(&grading);
        let out = self
            .engine
            .exec(
                &id,
                "root",
                "/",
                &[],
                &grading_wrapper(&script, wrap),
                self.limits.eval,
            )
            .await?;
        if out.stdout.lines().any(|l| l.starts_with(noptrace::FAILED)) {
            return Err(stage_error(format!(
                "the grading seccomp filter: {}",
                tail_bytes(&out.stdout, 2000)
            )));
        }
        if out.timed_out && !diff.trim().is_empty() {
            return Ok(timed_out(&out.stdout));
        }
        let apply = marker(&out.stdout, "LEGO_APPLY=").map(str::to_string);
        let log = out.stdout.clone() + &out.stderr;
        // Every process of the test user is dead now (the wrapper killed them): the stream is
        // whole, and nothing of theirs can change a file while it is read.
        let stream = if channel {
            Some(self.read_stream(&id, wrap.keyed).await?)
        } else {
            None
        };
        if !out.timed_out && !diff.trim().is_empty() && self.defended(Defence::SabotageCostsReward) {
            // The test patch applied at the base commit (the task was checked): if it no longer
            // does, the diff put something in its way; if the script died before its last line,
            // code of the diff killed it. The last line is the shell's, which code under test can
            // print itself (into the shell's stdout by tracing it) before killing it, so the line
            // proves nothing: the script's last command is that `echo`, so a script that did not
            // exit 0 was killed whatever it printed, and pytest's exit status comes from the
            // plugin's keyed `finish` alone (missing when pytest was killed too; present when
            // pytest, as the killed shell's tracer, held its death back until it finished).
            let killed = matches!(out.exit_code, Some(c) if c != 0) && self.defended(Defence::PluginFinish);
            let kind = if out.stdout.contains("LEGO_TEST_PATCH_FAILED") {
                Some("test_patch_conflict")
            } else if marker(&out.stdout, "LEGO_EXIT=").is_none() || killed {
                Some("grading_killed")
            } else {
                None
            };
            if let Some(kind) = kind {
                let (verdict, event) = sabotaged(kind, apply, &log);
                self.audit.push(event);
                return Ok(verdict);
            }
        }
        if out.timed_out || out.stdout.contains("LEGO_TEST_PATCH_FAILED") || out.exit_code != Some(0) {
            return Err(stage_error(format!(
                "grading script exit {:?} (timed out: {}): {}",
                out.exit_code,
                out.timed_out,
                tail_bytes(&(out.stdout + &out.stderr), 2000)
            )));
        }
        let exit_code = marker(&out.stdout, "LEGO_EXIT=").and_then(|c| c.trim().parse().ok());
        let ctx = VerdictContext {
            test_files,
            stream,
            base_config,
            touched: &grading.touched,
            apply,
            exit_code,
        };
        self.swebench_verdict(&id, ctx).await
    }

    /// Root's preparation of the evaluation container: the grader's plugin, the repository reset
    /// to the base commit and handed to the test user, and the import-path probe.
    fn swebench_prep(&self, wd: &str, base: &str, test_cmd: &str) -> String {
        let attrs = if self.defended(Defence::GitAttributes) {
            format!("{}; ", neutral_attributes_script(".git"))
        } else {
            String::new()
        };
        // The grader's plugin, root-owned in the site-packages of the interpreter the grader runs:
        // the result stream and the import-path probe.
        let plugin = format!(
            "P=$(python3 -I -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); \
             install -D -m 644 -o root -g root /tmp/lego/plugin.py \"$P/{}.py\"; ",
            channel::PLUGIN_MODULE
        );
        // The import-path probe: the task's own test command, as the test user at the base
        // commit (same directory, same environment: the image's ENV, the command's PYTHONPATH with
        // its `$VAR` and absolute entries, the ini's `pythonpath`), stopped before collection.
        let probe = if self.defended(Defence::Shadowing) && self.defended(Defence::ImportPathProbe) {
            let out = "/tmp/lego/out/syspath";
            let cmd = format!(
                "cd {wd}; {SAFE_PYTHON}; export {}={out}; {test_cmd} -p {} >/dev/null 2>&1",
                channel::SYSPATH_ENV,
                channel::PLUGIN_MODULE
            );
            format!(
                "; setpriv --reuid={AGENT_USER} --regid={AGENT_USER} --init-groups -- env HOME=/home/{AGENT_USER} \
                 bash -c {} || true; cat {out} 2>/dev/null || true; rm -f {out}; \
                 cd {wd}; git reset -q --hard {base}; git clean -qfdx; chown -R {AGENT_USER}:{AGENT_USER} {wd}",
                sh_quote(&cmd)
            )
        } else {
            String::new()
        };
        format!(
            "{plugin}cd {wd}; {attrs}git reset -q --hard {base}; git clean -qfdx; mkdir -p /tmp/lego/out; \
             chown -R {AGENT_USER}:{AGENT_USER} {wd} /tmp/lego/out{probe}"
        )
    }

    /// The grading script: the diff applied (by the first method that takes it), hooks and
    /// protected tests put back, the test patch applied, and `test_cmd` run on the test files.
    fn swebench_script(&self, g: &Grading) -> String {
        let Grading { wd, base, .. } = g;
        let restore = |files: &mut dyn Iterator<Item = &String>| -> String {
            files
                .map(|f| {
                    format!(
                        "git checkout -q {base} -- {q} 2>/dev/null || rm -f {q}; ",
                        q = sh_quote(f)
                    )
                })
                .collect()
        };
        // Hooks (.gitattributes first among them) before the tests, see [`Reverts::in_order`];
        // with the protected-tests defence off, only the files the agent did not touch are reset.
        let reverts_sh = restore(&mut g.reverts.in_order());
        let untouched_tests: Vec<&String> = g.protected.iter().filter(|f| !g.touched.contains(*f)).collect();
        let restore_tests = if self.defended(Defence::ProtectedTests) {
            String::new()
        } else {
            restore(&mut untouched_tests.into_iter())
        };
        // Plugin autoload off: only the image's own plugins load, by name (found above in the
        // pristine image); no entry point the diff adds is ever read.
        let autoload = if self.defended(Defence::PluginAutoload) {
            let p: Vec<String> = g.plugins.iter().map(|m| format!("-p {}", sh_quote(m))).collect();
            ("export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1; ", p.join(" "))
        } else {
            ("", String::new())
        };
        let files: Vec<String> = g.test_files.iter().map(|f| sh_quote(f)).collect();
        let (channel_env, channel_p) = if g.channel {
            let key = if g.keyed {
                format!(" {}=4", channel::KEY_FD_ENV)
            } else {
                String::new()
            };
            (
                format!("export {}=3{key}; ", channel::FD_ENV),
                format!(" -p {}", channel::PLUGIN_MODULE),
            )
        } else {
            (String::new(), String::new())
        };
        // As the non-root user from here on: applying the diff cannot write outside what that
        // user owns (the repository, /tmp/lego/out), whatever a fallback like `patch` does.
        format!(
            "cd {wd}; D=/tmp/lego/agent.diff; \
             if [ ! -s $D ]; then M=none; \
             elif git apply --binary $D 2>/dev/null; then M='git apply'; \
             elif git apply --binary --3way $D 2>/dev/null; then M='git apply --3way'; \
             elif git reset -q --hard; git apply --binary --reject $D 2>/dev/null; then M='git apply --reject'; \
             elif git reset -q --hard; git clean -qfd; patch --batch --fuzz=5 -p1 -i $D >/dev/null 2>&1; then M='patch --fuzz=5'; \
             else git reset -q --hard; git clean -qfd; M=failed; fi; echo \"LEGO_APPLY=$M\"; \
             {reverts_sh}{restore_tests}\
             if [ -s /tmp/lego/test.patch ] && ! git apply --binary /tmp/lego/test.patch; then echo LEGO_TEST_PATCH_FAILED; exit 3; fi; \
             {SAFE_PYTHON}; {autoload_env}{channel_env}\
             {test_cmd} {plugins}{channel_p} -rA --junitxml=/tmp/lego/out/junit.xml {files} >/tmp/lego/out/test.log 2>&1; echo \"LEGO_EXIT=$?\"",
            test_cmd = g.test_cmd,
            files = files.join(" "),
            autoload_env = autoload.0,
            plugins = autoload.1,
        )
    }
}
