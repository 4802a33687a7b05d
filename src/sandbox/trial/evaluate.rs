//! The evaluate stage's two graders: SWE-style tasks in a fresh container from the pristine image,
//! Harbor tasks by running `/tests/test.sh` in the trial container (as Harbor does).

use std::collections::BTreeSet;
use std::time::Duration;

use super::{diff_files, is_collection_hook, sh_quote, tail, Trial};
use crate::grade;
use crate::records::{AuditEvent, GraderResult};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::{ContainerSpec, SandboxError};

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
        for f in touched.intersection(&protected) {
            self.audit.push(AuditEvent {
                kind: "test_edit".into(),
                detail: format!("{f} (discarded before grading)"),
                generation: None,
            });
        }
        let hooks: Vec<String> = touched
            .iter()
            .filter(|f| is_collection_hook(f) && !protected.contains(*f))
            .cloned()
            .collect();
        for f in &hooks {
            self.audit.push(AuditEvent {
                kind: "collection_hook".into(),
                detail: format!("{f} (reverted before grading)"),
                generation: None,
            });
        }
        let spec = ContainerSpec {
            name: self.name("-eval"),
            image: self.image.clone(),
            labels: self.labels(),
            env: Vec::new(),
            network: "none".into(),
            memory_bytes: Some(self.limits.memory_bytes),
            nano_cpus: Some(self.limits.nano_cpus),
            pids_limit: Some(self.limits.pids),
            binds: Vec::new(),
            cmd: None,
        };
        let id = self.engine.create_container(&spec).await?;
        self.eval_container = Some(id.clone());
        self.engine.start_container(&id).await?;
        let mut tar = TarBuilder::new();
        tar.dir("lego")
            .file("lego/agent.diff", diff.as_bytes(), 0o644)
            .file("lego/test.patch", test_patch.as_bytes(), 0o644);
        self.engine.upload(&id, "/tmp", tar.finish()).await?;
        let base = sh_quote(self.task.base_commit.as_deref().unwrap_or("HEAD"));
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
        let restore_tests = restore(&mut protected.iter());
        let revert_hooks = restore(&mut hooks.iter());
        let files: Vec<String> = test_files.iter().map(|f| sh_quote(f)).collect();
        let script = format!(
            "cd {wd}; git reset -q --hard {base}; git clean -qfdx; D=/tmp/lego/agent.diff; \
             if [ ! -s $D ]; then M=none; \
             elif git apply --binary $D 2>/dev/null; then M='git apply'; \
             elif git apply --binary --3way $D 2>/dev/null; then M='git apply --3way'; \
             elif git reset -q --hard; git apply --binary --reject $D 2>/dev/null; then M='git apply --reject'; \
             elif git reset -q --hard; git clean -qfd; patch --batch --fuzz=5 -p1 -i $D >/dev/null 2>&1; then M='patch --fuzz=5'; \
             else git reset -q --hard; git clean -qfd; M=failed; fi; echo \"LEGO_APPLY=$M\"; \
             {restore_tests}{revert_hooks}\
             if [ -s /tmp/lego/test.patch ] && ! git apply --binary /tmp/lego/test.patch; then echo LEGO_TEST_PATCH_FAILED; exit 3; fi; \
             {test_cmd} -rA --junitxml=/tmp/lego/junit.xml {files} >/tmp/lego/test.log 2>&1; echo \"LEGO_EXIT=$?\"",
            wd = sh_quote(&self.workdir),
            files = files.join(" "),
        );
        let out = self
            .engine
            .exec(&id, "root", "/", &[], &script, self.limits.eval)
            .await?;
        if out.timed_out || out.stdout.contains("LEGO_TEST_PATCH_FAILED") || out.exit_code != Some(0) {
            return Err(SandboxError::Stage {
                stage: "evaluate",
                message: format!(
                    "grading script exit {:?} (timed out: {}): {}",
                    out.exit_code,
                    out.timed_out,
                    tail(&(out.stdout + &out.stderr), 2000)
                ),
            });
        }
        let apply = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("LEGO_APPLY="))
            .map(str::to_string);
        let exit_code = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("LEGO_EXIT="))
            .and_then(|c| c.trim().parse().ok());
        let short = Duration::from_secs(60);
        let junit = self
            .engine
            .exec(
                &id,
                "root",
                "/",
                &[],
                "cat /tmp/lego/junit.xml 2>/dev/null",
                short,
            )
            .await?
            .stdout;
        let log = self
            .engine
            .exec(&id, "root", "/", &[], "tail -c 200000 /tmp/lego/test.log", short)
            .await?
            .stdout;
        let statuses =
            grade::pytest::parse_junit(&junit, test_files).unwrap_or_else(|| grade::pytest::parse_log(&log));
        let verdict = grade::swebench::resolve(
            &statuses,
            &self.task.fail_to_pass,
            &self.task.pass_to_pass,
            exit_code,
        );
        let mut log_tail = tail(&log, 4000);
        if let Some(note) = &verdict.note {
            log_tail = format!("{note}\n{log_tail}");
        }
        let reward = if apply.as_deref() == Some("failed") {
            0.0
        } else {
            verdict.reward
        };
        Ok((
            reward,
            GraderResult {
                tests: statuses,
                exit_code,
                apply,
                log_path: None,
                log_tail: Some(log_tail),
            },
        ))
    }

    pub(super) async fn evaluate_harbor(
        &mut self,
        tests_dir: &str,
    ) -> Result<(f64, GraderResult), SandboxError> {
        let dir = self.task_root.join(tests_dir);
        let mut tar = TarBuilder::new();
        tar.dir("tests");
        tar.dir_tree(&dir, "tests")
            .map_err(|source| SandboxError::ReadFile {
                path: dir.clone(),
                source,
            })?;
        let prep = self
            .exec(
                "root",
                "rm -rf /tests /logs/verifier; mkdir -p /logs/verifier",
                Duration::from_secs(60),
            )
            .await?;
        if !prep.ok() {
            return Err(SandboxError::Stage {
                stage: "evaluate",
                message: tail(&prep.stderr, 2000),
            });
        }
        self.upload("/", tar.finish()).await?;
        let out = self
            .exec(
                "root",
                "bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1; echo \"LEGO_EXIT=$?\"",
                self.limits.eval,
            )
            .await?;
        if out.timed_out {
            return Err(SandboxError::Stage {
                stage: "evaluate",
                message: "verifier timed out".into(),
            });
        }
        let exit_code = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("LEGO_EXIT="))
            .and_then(|c| c.trim().parse().ok());
        let short = Duration::from_secs(60);
        let read = |f: &'static str| {
            format!("if [ -f /logs/verifier/{f} ]; then echo LEGO_PRESENT; cat /logs/verifier/{f}; fi")
        };
        let json = self.exec("root", &read("reward.json"), short).await?.stdout;
        let txt = self.exec("root", &read("reward.txt"), short).await?.stdout;
        let log = self
            .exec("root", "tail -c 20000 /logs/verifier/test-stdout.txt", short)
            .await?
            .stdout;
        let present = |s: &str| s.strip_prefix("LEGO_PRESENT\n").map(str::to_string);
        let parsed = grade::harbor::parse_reward(present(&json).as_deref(), present(&txt).as_deref())
            .map_err(|e| SandboxError::Stage {
                stage: "evaluate",
                message: e.to_string(),
            })?;
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
                apply: None,
                log_path: None,
                log_tail: Some(tail(&log, 4000)),
            },
        ))
    }
}
