//! The Harbor grader of the evaluate stage (see [`super::evaluate`] for what both graders share):
//! the agent's diff applied in a fresh container, `/tests` uploaded only then, `test.sh` run as the
//! task's verifier user, and the reward read by root under one rule: the reward root reads is the
//! one `test.sh` itself wrote.
//!
//! Code under test runs inside `test.sh`, as the same user, so no separation is perfect without
//! changing the task; what the grader does instead ([`Defence::RewardFiles`]):
//!
//! - root owns `/logs/verifier` and pre-creates both reward files in it, empty, mode 644, owned by
//!   the verifier user: `test.sh` can write them, no process of that user can create another file
//!   there, replace one by a symlink, directory or FIFO, or chmod the directory;
//! - `test.sh` runs as root's direct child (root sees its own exit status, nothing of the user
//!   stands between), with its stdout and stderr in a log and the no-ptrace filter
//!   ([`super::noptrace`]) when the image has `python3`;
//! - the moment `test.sh` exits, root's shell kills every process of the verifier user (shell
//!   builtins only: no fork between the exit and the kills), stamps the time on a root-only file,
//!   reads the reward files (builtins) to compare them once the kills are done, and counts the
//!   processes that outlived `test.sh` (`outlived_verifier`);
//! - then, with nothing of that user alive, `reward_tampering` (reward 0) is any of: a reward file
//!   the task's verifier does not write (the ones its tests directory names), a changed mode, a
//!   non-regular file, a change after `test.sh` exited, a file over the size cap, an unparseable
//!   reward ([`grade::harbor::tampering`]).
//!
//! Residual risk: a process of the verifier user that rewrites an expected reward file while
//! `test.sh` still runs, after `test.sh`'s own last write (watching it with inotify), is not told
//! apart from `test.sh`: that needs the writing process of each write (fanotify needs
//! `CAP_SYS_ADMIN`, which the container does not have) or a verifier that runs the agent's code as
//! another user. So is a daemon that wins a race of microseconds between `test.sh`'s exit and the
//! kills.

use std::collections::BTreeSet;
use std::path::Path;

use super::bounded::{self, Read, REWARD_CAP};
use super::evaluate::{marker, sabotaged, stage_error, timed_out, SAFE_PYTHON};
use super::revert::Reverts;
use super::{diff_files, noptrace, Defence, Trial};
use crate::grade;
use crate::grade::harbor::{OUTLIVED_VERIFIER, REWARD_FILES, REWARD_TAMPERING};
use crate::grade::integrity;
use crate::records::{AuditEvent, GraderResult};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::{ExecOutput, SandboxError, AGENT_USER};
use crate::text::{sh_quote, tail_bytes};

/// Printed when a reward file's content changed between `test.sh`'s exit (read at once, with
/// builtins) and the end of the kills.
const CHANGED: &str = "LEGO_CHANGED_AFTER_EXIT";

/// Root's directory of the mark stamped when `test.sh` exits.
const MARK_DIR: &str = "/var/lib/lego-rl-harbor";

/// The text of every file under `dir` (the task's tests directory: small).
fn texts_under(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(texts_under(&p));
        } else if let Ok(b) = std::fs::read(&p) {
            out.push(b);
        }
    }
    out
}

/// Root's shell that runs `test.sh` (`env`: the verifier's environment as `NAME=value` words) and
/// kills every process of the verifier user `u` the moment it exits; prints `LEGO_EXIT=`,
/// `LEGO_T=` (root's clock then), `LEGO_OUTLIVED=` and the reward files' `LEGO_STAT` lines.
fn run_script(u: &str, wd: &str, env: &str, no_ptrace: bool) -> String {
    let run = format!(
        "setpriv --reuid={u} --regid={u} --init-groups -- env HOME=/tmp {env} bash /tests/test.sh \
         >/logs/verifier/test-stdout.txt 2>&1 </dev/null"
    );
    let filtered = if no_ptrace {
        format!(
            "if command -v python3 >/dev/null 2>&1; then \
             {p}true >/dev/null 2>&1 || {{ echo {failed}; exit 0; }}; {p}{run}; else {run}; fi",
            p = noptrace::prefix(),
            failed = noptrace::FAILED
        )
    } else {
        run
    };
    // The moment test.sh exits: a root-only file is stamped (a builtin redirection: its ctime is
    // the kernel's clock, the one the reward files' ctimes come from), then every live (not
    // zombie) /proc entry whose real uid is the verifier's is killed with builtins only (`read`,
    // `kill`), repeated until none is left (a process that forked meanwhile), each pid counted
    // once; `kill -1` as that user after, as a backstop.
    format!(
        "chmod -R a+rX /tests; U=$(id -u {u}); mkdir -m 700 -p {MARK_DIR}; cd {wd}; {filtered}; rc=$?; \
         : > {MARK_DIR}/exited; IFS= read -r -d '' -N 4096 s1 </logs/verifier/reward.json; \
         IFS= read -r -d '' -N 4096 s2 </logs/verifier/reward.txt; n=0; seen=' '; \
         for i in 1 2 3 4 5 6 7 8 9 10; do k=0; for p in /proc/[0-9]*; do z=; \
         while read -r a b _; do case \"$a\" in State:) [ \"$b\" = Z ] && z=1;; \
         Uid:) if [ -z \"$z\" ] && [ \"$b\" = \"$U\" ] && kill -KILL \"${{p#/proc/}}\" 2>/dev/null; then k=1; \
         case \"$seen\" in *\" ${{p#/proc/}} \"*) ;; *) seen=\"$seen${{p#/proc/}} \"; n=$((n+1));; esac; fi; break;; esac; \
         done 2>/dev/null <\"$p/status\"; done; [ $k = 0 ] && break; done; \
         setpriv --reuid={u} --regid={u} --init-groups -- bash -c 'kill -KILL -1' 2>/dev/null; \
         IFS= read -r -d '' -N 4096 t1 </logs/verifier/reward.json; IFS= read -r -d '' -N 4096 t2 </logs/verifier/reward.txt; \
         if [ \"$s1\" != \"$t1\" ] || [ \"$s2\" != \"$t2\" ]; then echo {CHANGED}; fi; \
         echo \"LEGO_EXIT=$rc\"; echo \"LEGO_OUTLIVED=$n\"; stat -c 'LEGO_T=%.9Z' {MARK_DIR}/exited; \
         cd /logs/verifier && stat -c 'LEGO_STAT %n %a %U %F %.9Z' {} 2>/dev/null; true",
        REWARD_FILES.join(" ")
    )
}

/// The texts of reward.json and reward.txt, when written.
type Rewards = (Option<String>, Option<String>);

/// What the verdict needs besides `test.sh`'s output.
struct Graded<'a> {
    id: &'a str,
    diff: &'a str,
    apply: Option<String>,
    tests_dir: &'a Path,
    /// [`Defence::RewardFiles`] is on.
    guarded: bool,
}

impl Trial {
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
        let guarded = self.defended(Defence::RewardFiles);
        let logs = if guarded {
            // Root's directory; the files test.sh may write, pre-created for the verifier user.
            let files: Vec<String> = REWARD_FILES
                .iter()
                .chain(&["test-stdout.txt"])
                .map(|f| format!("/logs/verifier/{f}"))
                .collect();
            format!(
                "chown root:root /logs /logs/verifier; chmod 755 /logs /logs/verifier; \
                 touch {f}; chown {u}: {f}; chmod 644 {f}",
                f = files.join(" ")
            )
        } else {
            format!("chown -R {u} /logs/verifier")
        };
        let prep = format!(
            "id -u {u} >/dev/null 2>&1 || {{ echo \"the task's verifier user {u} does not exist in its image\" >&2; exit 3; }}; \
             rm -rf /tests /logs/verifier; mkdir -p {wd} /logs/verifier; chown -R {u} {wd}; {logs}"
        );
        let dirs = BTreeSet::from([String::new()]);
        let prepared = self.prepare_and_check(&id, &prep, &diff, &dirs).await?;
        if let Some(verdict) = prepared.verdict {
            return Ok(verdict);
        }
        let plugins = prepared.plugins;
        // test.sh runs pytest itself: autoload off there too, the image's own plugins by name
        // (`PYTEST_PLUGINS`, read by every pytest test.sh starts; nothing the diff adds is).
        let autoload = if self.defended(Defence::PluginAutoload) {
            let named = if plugins.is_empty() {
                String::new()
            } else {
                format!(" PYTEST_PLUGINS={}", sh_quote(&plugins.join(",")))
            };
            format!("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1{named}")
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
        let run = if guarded {
            let env = format!("PYTHONSAFEPATH=1 PYTHONNOUSERSITE=1 {autoload}");
            run_script(&u, &wd, &env, self.defended(Defence::NoPtrace))
        } else {
            let autoload = if autoload.is_empty() {
                autoload
            } else {
                format!("export {autoload}; ")
            };
            format!(
                "chmod -R a+rX /tests; \
                 setpriv --reuid={u} --regid={u} --init-groups -- env HOME=/tmp bash -c {}; echo \"LEGO_EXIT=$?\"",
                sh_quote(&format!(
                    "cd {wd}; {SAFE_PYTHON}; {autoload}bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
                ))
            )
        };
        let out = self
            .engine
            .exec(&id, "root", "/", &[], &run, self.limits.eval)
            .await?;
        let graded = Graded {
            id: &id,
            diff: &diff,
            apply,
            tests_dir: &dir,
            guarded,
        };
        self.harbor_verdict(out, graded).await
    }

    /// The verdict once `test.sh` ran (its output `out`).
    async fn harbor_verdict(
        &mut self,
        out: ExecOutput,
        g: Graded<'_>,
    ) -> Result<(f64, GraderResult), SandboxError> {
        let Graded {
            id,
            diff,
            apply,
            tests_dir: dir,
            guarded,
        } = g;
        if out.stdout.lines().any(|l| l.starts_with(noptrace::FAILED)) {
            return Err(stage_error(format!(
                "the verifier's seccomp filter: {}",
                tail_bytes(&out.stdout, 2000)
            )));
        }
        if out.timed_out && !diff.trim().is_empty() {
            return Ok(timed_out(&out.stdout));
        }
        if out.timed_out {
            return Err(stage_error("verifier timed out".into()));
        }
        let exit_code = marker(&out.stdout, "LEGO_EXIT=").and_then(|c| c.trim().parse().ok());
        let outlived: u64 = marker(&out.stdout, "LEGO_OUTLIVED=")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        if outlived > 0 {
            self.audit.push(AuditEvent {
                kind: OUTLIVED_VERIFIER.into(),
                detail: format!(
                    "{outlived} process(es) of the verifier user outlived test.sh (killed before the reward was read)"
                ),
                generation: None,
            });
        }
        let log = self.verifier_log(id).await?;
        // test.sh must finish for its reward to count: killed (by a signal: exit 128+n, or no
        // exit line at all) on a non-empty diff is the diff's doing.
        let sabotage = !diff.trim().is_empty() && self.defended(Defence::SabotageCostsReward);
        if sabotage && exit_code.is_none_or(|c| c >= 128) {
            let (verdict, event) = sabotaged("grading_killed", apply, &log);
            self.audit.push(event);
            return Ok(verdict);
        }
        let rewards = if guarded {
            let exited = marker(&out.stdout, "LEGO_T=").and_then(|t| t.trim().parse().ok());
            let stats = grade::harbor::parse_stats(&out.stdout);
            let expected = grade::harbor::expected_files(texts_under(dir).iter().map(Vec::as_slice));
            let changed = out.stdout.lines().any(|l| l == CHANGED);
            match grade::harbor::tampering(&stats, &expected, exited) {
                _ if changed => Err("a reward file changed after test.sh exited".to_string()),
                Some(why) => Err(why),
                None => self.read_rewards(id).await?,
            }
        } else {
            Ok(self.read_rewards_unguarded(id).await?)
        };
        let parsed = match rewards {
            Ok((json, txt)) => grade::harbor::parse_reward(json.as_deref(), txt.as_deref()),
            Err(why) => Err(grade::GradeError::Tampered(why)),
        };
        if sabotage {
            let kind = match &parsed {
                Err(grade::GradeError::MissingReward) => Some("reward_missing"),
                Err(grade::GradeError::Tampered(_)) => Some(REWARD_TAMPERING),
                Err(grade::GradeError::BadReward { .. }) if guarded => Some(REWARD_TAMPERING),
                _ => None,
            };
            if let Some(kind) = kind {
                let (verdict, mut event) = sabotaged(kind, apply, &log);
                if let Err(e) = &parsed {
                    event.detail = format!("{}: {e}", event.detail);
                }
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

    /// The reward files, read bounded (empty: not written): `Err` says why one was refused.
    async fn read_rewards(&self, id: &str) -> Result<Result<Rewards, String>, SandboxError> {
        let mut got = Vec::new();
        for f in REWARD_FILES {
            let path = format!("/logs/verifier/{f}");
            match self.read_bounded(id, &path, REWARD_CAP).await? {
                Read::Absent => got.push(None),
                Read::Text(t) => got.push((!t.is_empty()).then_some(t)),
                Read::Refused(why) => {
                    return Ok(Err(bounded::refused_event(REWARD_TAMPERING, &path, &why).detail))
                }
            }
        }
        let txt = got.pop().flatten();
        Ok(Ok((got.pop().flatten(), txt)))
    }

    /// Without [`Defence::RewardFiles`]: whatever is there, whole.
    async fn read_rewards_unguarded(
        &self,
        id: &str,
    ) -> Result<(Option<String>, Option<String>), SandboxError> {
        let short = std::time::Duration::from_secs(60);
        let mut got = Vec::new();
        for f in REWARD_FILES {
            let read =
                format!("if [ -f /logs/verifier/{f} ]; then echo LEGO_PRESENT; cat /logs/verifier/{f}; fi");
            let out = self.engine.exec(id, "root", "/", &[], &read, short).await?.stdout;
            got.push(out.strip_prefix("LEGO_PRESENT\n").map(str::to_string));
        }
        let txt = got.pop().flatten();
        Ok((got.pop().flatten(), txt))
    }

    /// The tail of test.sh's output (never through a symlink).
    async fn verifier_log(&self, id: &str) -> Result<String, SandboxError> {
        let short = std::time::Duration::from_secs(60);
        let tail = "f=/logs/verifier/test-stdout.txt; [ -f $f ] && [ ! -L $f ] && tail -c 20000 $f";
        Ok(self.engine.exec(id, "root", "/", &[], tail, short).await?.stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_sh_is_roots_child_and_the_kills_use_builtins() {
        let s = run_script("'agent'", "/app", "PYTHONSAFEPATH=1", true);
        assert!(s.contains("then python3 -I -c"), "{s}");
        assert!(
            s.contains("bash /tests/test.sh >/logs/verifier/test-stdout.txt 2>&1 </dev/null; else"),
            "{s}"
        );
        assert!(s.contains("rc=$?; : > /var/lib/lego-rl-harbor/exited;"), "{s}");
        assert!(
            s.contains("stat -c 'LEGO_STAT %n %a %U %F %.9Z' reward.json reward.txt"),
            "{s}"
        );
        let plain = run_script("'agent'", "/app", "", false);
        assert!(!plain.contains("python3"), "{plain}");
    }
}
