//! The end of the agent stage, for good, and the extraction of the agent's change.
//!
//! An agent's processes can outlive its harness (`setsid`, `nohup`, double forks, a process that
//! traps SIGTERM). Left alive they write into the repository while the diff is read, and into
//! whatever else reads the container afterwards. So nothing is read until every process of the
//! agent user is gone:
//!
//! 1. In band, at the harness's exit: the harness runs under a wrapper (run as the agent user
//!    through `setpriv`, so the in-container `timeout` above it stays root) that, the moment the
//!    harness exits, sends SIGSTOP to every process the agent user owns (`kill -1`: one system
//!    call; a stopped process cannot fork or write), counts them and SIGKILLs them. A process
//!    cannot catch or ignore either signal.
//! 2. Out of band, always: the container is frozen (the cgroup freezer) and the engine lists its
//!    processes. Anything not root still there (the wrapper was killed, the agent timed out)
//!    means the container is killed while frozen, snapshotted into an image, and the diff is read
//!    from a new container of that snapshot, in which nothing of the agent's runs. Otherwise the
//!    container is thawed (only root's relay and init are left in it) and the diff read in place.
//!
//! Either way an `outlived_agent` audit event counts the processes that had to be killed.
//!
//! The diff is read by root against a copy of the base commit kept where the agent user cannot
//! reach it (`/var/lib/lego-rl/base.git`, mode 700, made at setup), with no system or global git
//! configuration, hooks, fsmonitor or external diff and textconv drivers, and with git attributes
//! read from the base commit (`GIT_ATTR_SOURCE`), so an agent's `.gitattributes` cannot make the
//! extraction fail (an infra failure, weight 0) or re-encode files. The agent's own `.git`
//! (its config, index, hooks, info/exclude) takes no part, so it cannot rename paths in the diff
//! (`diff.noprefix`), run code (`core.fsmonitor`, filters) or hide files through its index.

use std::collections::HashMap;

use super::{now, Defence, Trial};
use crate::grade::integrity;
use crate::records::AuditEvent;
use crate::sandbox::{ExecOutput, SandboxError, AGENT_USER, LABEL_RUN, LABEL_TRIAL};
use crate::text::{sh_quote, tail_bytes};

/// Where setup keeps the base commit, out of the agent user's reach.
pub const BASE_GIT: &str = "/var/lib/lego-rl/base.git";
/// The wrapper's last stderr line: how many agent processes it stopped and killed.
const OUTLIVED_MARK: &str = "LEGO_RL_OUTLIVED ";

/// The command that runs the harness `script` as the agent user and, at its exit, stops and kills
/// every other process of that user (see the module docs). Run it as root. `env` is the trial's
/// environment: the agent user's HOME, USER and LOGNAME are set only where it does not set them.
pub fn agent_command(script: &str, env: &[String]) -> String {
    // The agent's processes volunteer as the OOM killer's first victims (children inherit the
    // score; an unprivileged process may raise it), so memory pressure of the agent's making kills
    // the agent's processes, not the relay. Only shell builtins run after the harness: a fork
    // there would be one more process of the agent user.
    let wrapper = format!(
        "echo 500 > /proc/self/oom_score_adj 2>/dev/null\n\
         bash -c {script}\n\
         rc=$?\n\
         kill -s STOP -1 2>/dev/null\n\
         n=0\n\
         for p in /proc/[0-9]*; do\n\
         \x20 [ \"${{p#/proc/}}\" = \"$$\" ] && continue\n\
         \x20 [ -O \"$p\" ] || continue\n\
         \x20 read -r line < \"$p/stat\" 2>/dev/null || continue\n\
         \x20 st=${{line##*) }}; st=${{st%% *}}\n\
         \x20 [ \"$st\" = Z ] || n=$((n+1))\n\
         done\n\
         kill -s KILL -1 2>/dev/null\n\
         echo \"{OUTLIVED_MARK}$n\" >&2\n\
         exit $rc",
        script = sh_quote(script)
    );
    let defaults: Vec<String> = [
        ("HOME", format!("/home/{AGENT_USER}")),
        ("USER", AGENT_USER.to_string()),
        ("LOGNAME", AGENT_USER.to_string()),
    ]
    .into_iter()
    .filter(|(k, _)| !env.iter().any(|e| e.starts_with(&format!("{k}="))))
    .map(|(k, v)| format!("{k}={v}"))
    .collect();
    format!(
        "exec setpriv --reuid={AGENT_USER} --regid={AGENT_USER} --init-groups -- env {} bash -c {}",
        defaults.join(" "),
        sh_quote(&wrapper)
    )
}

/// Splits the wrapper's count off the agent's stderr: (stderr without it, the count if present).
pub fn take_outlived(stderr: &str) -> (String, Option<u64>) {
    let trimmed = stderr.trim_end_matches('\n');
    let (head, last) = match trimmed.rfind('\n') {
        Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
        None => ("", trimmed),
    };
    match last
        .strip_prefix(OUTLIVED_MARK)
        .and_then(|n| n.trim().parse().ok())
    {
        Some(n) => (head.to_string(), Some(n)),
        None => (stderr.to_string(), None),
    }
}

/// How [`extract_script`] reads the diff: each field is a defence (all on in every real trial;
/// the adversarial tests switch one off, see [`super::Defence`]).
#[derive(Debug, Clone, Copy)]
pub struct ExtractOptions {
    /// Leave compiled Python out of the diff.
    pub no_bytecode: bool,
    /// Neutralise every git attribute (`info/attributes` overrides any `.gitattributes`, on every
    /// git version; `GIT_ATTR_SOURCE` alone needs git 2.42).
    pub neutral_attributes: bool,
    /// Read `.gitattributes` from the base commit (`GIT_ATTR_SOURCE=HEAD`, ignored before git 2.42).
    pub attr_source: bool,
    /// Leave nested repositories out of the diff (an empty one makes `git add -A` fail), each
    /// named on stderr by a [`NESTED_MARK`] line.
    pub skip_nested: bool,
    /// The largest diff printed; a larger one prints nothing and a [`TOO_LARGE_MARK`] line on
    /// stderr (the diff is written to a root-only file first, never held whole in memory here).
    pub max_bytes: u64,
}

/// Extraction's stderr line naming a nested repository left out of the diff.
pub const NESTED_MARK: &str = "LEGO_NESTED ";
/// Extraction's stderr line giving the size of a diff over the limit.
pub const TOO_LARGE_MARK: &str = "LEGO_DIFF_TOO_LARGE ";

/// Attributes that override whatever a `.gitattributes` of the agent's says (`!attr`: unset, git's
/// own detection applies).
const NEUTRAL_ATTRIBUTES: &str =
    "* !text !eol !filter !working-tree-encoding !ident !diff !merge !export-subst";

/// Shell that writes [`NEUTRAL_ATTRIBUTES`] to `$git_dir/info/attributes`.
pub fn neutral_attributes_script(git_dir: &str) -> String {
    format!("mkdir -p {git_dir}/info && printf '%s\\n' '{NEUTRAL_ATTRIBUTES}' > {git_dir}/info/attributes")
}

/// The extraction script: `git add -A` (compiled Python and nested repositories left out) then the
/// binary diff against the base commit, with the base copy as the git directory and every
/// configurable hook off.
pub fn extract_script(workdir: &str, o: ExtractOptions) -> String {
    let specs = if o.no_bytecode {
        integrity::NO_BYTECODE_PATHSPECS
    } else {
        ""
    };
    let attrs = if o.neutral_attributes {
        format!("{}; ", neutral_attributes_script(BASE_GIT))
    } else {
        "rm -f {BASE_GIT}/info/attributes; ".replace("{BASE_GIT}", BASE_GIT)
    };
    let nested = if o.skip_nested {
        format!(
            "find . -path ./.git -prune -o -name .git -prune -print > {STATE}/nested; \
             while IFS= read -r g; do d=${{g#./}}; d=${{d%/.git}}; echo \"{NESTED_MARK}$d\" >&2; \
             set -- \"$@\" \":(exclude,literal)$d\"; done < {STATE}/nested; "
        )
    } else {
        String::new()
    };
    let script = format!(
        "set -e; set --; export GIT_DIR={BASE_GIT} GIT_WORK_TREE={wd} GIT_CONFIG_NOSYSTEM=1 \
         GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_SOURCE=HEAD HOME=/nonexistent; cd {wd}; {attrs}{nested}\
         git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false \
         -c core.attributesFile=/dev/null add -A -- . {specs} \"$@\" >/dev/null; \
         git -c core.fsmonitor=false -c diff.noprefix=false -c diff.mnemonicPrefix=false -c core.attributesFile=/dev/null \
         diff --cached --binary --no-color --no-ext-diff --no-textconv --src-prefix=a/ --dst-prefix=b/ HEAD > {STATE}/agent.diff; \
         s=$(stat -c %s {STATE}/agent.diff); \
         if [ \"$s\" -gt {max} ]; then echo \"{TOO_LARGE_MARK}$s\" >&2; else cat {STATE}/agent.diff; fi; rm -f {STATE}/agent.diff",
        wd = sh_quote(workdir),
        max = o.max_bytes,
    );
    let script = if o.attr_source {
        script
    } else {
        script.replace(" GIT_ATTR_SOURCE=HEAD", "")
    };
    if o.neutral_attributes {
        script
    } else {
        script.replace(" -c core.attributesFile=/dev/null", "")
    }
}

/// The root-only directory that holds [`BASE_GIT`] and extraction's scratch files.
const STATE: &str = "/var/lib/lego-rl";

/// Nested repositories and the size of an over-limit diff, from [`extract_script`]'s stderr.
pub fn extract_marks(stderr: &str) -> (Vec<String>, Option<u64>) {
    let nested = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(NESTED_MARK))
        .map(str::to_string)
        .collect();
    let big = stderr
        .lines()
        .find_map(|l| l.strip_prefix(TOO_LARGE_MARK)?.trim().parse().ok());
    (nested, big)
}

/// Lists files kept out of the diff by ignore rules, with the rule that ignores each
/// (`SOURCE:LINE:PATTERN<TAB>PATH`), in the environment of [`extract_script`]; at most 1000.
pub fn ignored_script(workdir: &str) -> String {
    format!(
        "export GIT_DIR={BASE_GIT} GIT_WORK_TREE={wd} GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
         GIT_ATTR_SOURCE=HEAD HOME=/nonexistent; cd {wd}; git -c core.attributesFile=/dev/null ls-files -o -i --exclude-standard --directory -- . {specs} | head -1000 | \
         git check-ignore -v --no-index --stdin; true",
        wd = sh_quote(workdir),
        specs = integrity::NO_BYTECODE_PATHSPECS,
    )
}

/// The `hidden_from_diff` event: files that only an ignore file the agent itself wrote or changed
/// keeps out of the diff (so they never reach grading; the event makes the attempt visible).
pub fn hidden_event(ignored: &str, diff: &str) -> Option<AuditEvent> {
    let touched: std::collections::BTreeSet<String> = super::diff_files(diff);
    let hidden: Vec<String> = ignored
        .lines()
        .filter_map(|l| {
            let (rule, path) = l.split_once('\t')?;
            let source = rule.split(':').next()?;
            touched.contains(source).then(|| format!("{path} ({rule})"))
        })
        .collect();
    if hidden.is_empty() {
        return None;
    }
    let shown: Vec<&str> = hidden.iter().take(10).map(String::as_str).collect();
    Some(AuditEvent {
        kind: "hidden_from_diff".into(),
        detail: format!(
            "{} path(s) kept out of the diff by ignore rules the agent wrote (not graded): {}{}",
            hidden.len(),
            shown.join(", "),
            if hidden.len() > shown.len() { ", ..." } else { "" }
        ),
        generation: None,
    })
}

/// True for paths outside the repository whose change can alter how Python starts or what it
/// imports (user site-packages, `.pth`, site/user customize): they never reach grading (that
/// runs in a fresh container), but they are an attempt worth an audit event.
pub fn is_outside_python_hook(path: &str, workdir: &str) -> bool {
    let wd = workdir.trim_end_matches('/');
    if path == wd || path.starts_with(&format!("{wd}/")) {
        return false;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".pth")
        || matches!(name, "sitecustomize.py" | "usercustomize.py")
        || path.contains("/site-packages/")
        || path.contains("/dist-packages/")
}

impl Trial {
    /// Records `outside_write` events for Python start-up hooks the agent wrote outside the
    /// repository (read from the engine's change list; a failure only skips the audit).
    async fn audit_outside_writes(&mut self, id: &str) {
        let changes = match self.engine.changes(id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("trial {}: change list: {e}", self.trial_id);
                return;
            }
        };
        let hooks: Vec<&String> = changes
            .iter()
            .filter(|p| is_outside_python_hook(p, &self.workdir))
            .collect();
        if !hooks.is_empty() {
            let shown: Vec<&str> = hooks.iter().take(10).map(|s| s.as_str()).collect();
            self.audit.push(AuditEvent {
                kind: "outside_write".into(),
                detail: format!(
                    "{} path(s) outside the repository that change how Python starts (not seen by grading): {}{}",
                    hooks.len(),
                    shown.join(", "),
                    if hooks.len() > shown.len() { ", ..." } else { "" }
                ),
                generation: None,
            });
        }
    }

    /// Stops the agent for good and reads its diff (stage `extract`); `in_band` is the wrapper's
    /// count, when it reported one.
    pub async fn extract(&mut self, in_band: Option<u64>) -> Result<String, SandboxError> {
        let start = now();
        let r = self.extract_inner(in_band).await;
        self.record("extract", start, if r.is_ok() { "ok" } else { "error" });
        r
    }

    async fn extract_inner(&mut self, in_band: Option<u64>) -> Result<String, SandboxError> {
        let id = self.container.clone().ok_or(SandboxError::Stage {
            stage: "extract",
            message: "no container".into(),
        })?;
        // Stage `freeze`: from the freeze request until the engine confirms it; nothing of the
        // agent's writes after its end.
        let frozen = now();
        let paused = self.engine.pause(&id).await;
        self.record("freeze", frozen, if paused.is_ok() { "ok" } else { "error" });
        if let Err(e) = paused {
            // A cgroup whose processes keep forking (a fork bomb) can fail to freeze ("unable
            // to freeze"): kill it instead, and read the change from a snapshot where nothing runs.
            if self.base_hash.is_none() {
                return Err(e);
            }
            self.audit.push(AuditEvent {
                kind: "outlived_agent".into(),
                detail: format!(
                    "the agent's container could not be frozen after the agent stage ({e}); killed before the \
                     diff was read"
                ),
                generation: None,
            });
            let read = self.read_change_from_snapshot(&id).await?;
            return self.finish_extract(read);
        }
        self.audit_outside_writes(&id).await;
        let agents: Vec<_> = match self.engine.processes(&id).await {
            Ok(p) => p.into_iter().filter(|p| p.uid != Some(0)).collect(),
            Err(e) => {
                let _ = self.engine.unpause(&id).await;
                return Err(e);
            }
        };
        // Zombies are dead but still hold their process slots until init reaps them: with many
        // (a fork bomb) nothing could be run in the container, so any agent entry at all means
        // the snapshot path; only live ones count as having outlived the stage.
        let left = agents.iter().filter(|p| !p.is_zombie()).count() as u64;
        let outlived = in_band.unwrap_or(0).max(left);
        if outlived > 0 {
            self.audit.push(AuditEvent {
                kind: "outlived_agent".into(),
                detail: format!(
                    "{outlived} process(es) of the agent user outlived the agent stage{}; stopped and killed before \
                     the diff was read",
                    if left > 0 { " (still running when the container was frozen)" } else { "" }
                ),
                generation: None,
            });
        }
        let Some(_) = self.base_hash else {
            let _ = self.engine.unpause(&id).await;
            return Ok(String::new());
        };
        // Only root's init and relay are left: thaw and read in place. If that cannot run (a
        // process table still full of the agent's dying processes, seen with a fork bomb), or
        // anything of the agent's is left, kill and read from a snapshot in which nothing runs.
        let in_place = if agents.is_empty() {
            self.engine.unpause(&id).await?;
            self.read_change(&id).await.ok().filter(|(out, ..)| out.ok())
        } else {
            None
        };
        let read = match in_place {
            Some(r) => r,
            None => self.read_change_from_snapshot(&id).await?,
        };
        self.finish_extract(read)
    }

    /// The diff of extraction's reads, and their audit events.
    fn finish_extract(
        &mut self,
        (out, scan, hidden): (ExecOutput, ExecOutput, ExecOutput),
    ) -> Result<String, SandboxError> {
        if !out.ok() {
            return Err(SandboxError::Stage {
                stage: "extract",
                message: tail_bytes(&out.stderr, 2000),
            });
        }
        let (nested, too_large) = extract_marks(&out.stderr);
        if !nested.is_empty() {
            self.audit.push(AuditEvent {
                kind: "nested_repo".into(),
                detail: format!(
                    "nested repositories left out of the diff (not graded): {}",
                    nested.join(", ")
                ),
                generation: None,
            });
        }
        if let Some(size) = too_large {
            self.too_large = Some(size);
            self.audit.push(AuditEvent {
                kind: "diff_too_large".into(),
                detail: format!(
                    "the diff is {size} bytes, over the {} byte limit: not read, reward 0",
                    self.limits.diff_bytes
                ),
                generation: None,
            });
        }
        if self.defended(Defence::Bytecode) {
            if let Some(event) = integrity::bytecode_event(&scan.stdout) {
                self.audit.push(event);
            }
        }
        if let Some(event) = hidden_event(&hidden.stdout, &out.stdout) {
            self.audit.push(event);
        }
        Ok(out.stdout)
    }

    /// The three reads of extraction in container `cid`: the diff, the bytecode scan, the ignored
    /// files.
    async fn read_change(&self, cid: &str) -> Result<(ExecOutput, ExecOutput, ExecOutput), SandboxError> {
        let scan = if self.defended(Defence::SpecialFiles) {
            integrity::BYTECODE_SCAN_PY.to_string()
        } else {
            integrity::BYTECODE_SCAN_PY.replace("if not stat.S_ISREG(os.stat(p).st_mode):", "if False:")
        };
        let scan_script = format!(
            "cd {} && python3 -I -c {} 2>/dev/null; true",
            sh_quote(&self.workdir),
            sh_quote(&scan)
        );
        let run = |script: String| async move {
            self.engine
                .exec(cid, "root", "/", &[], &script, self.limits.setup)
                .await
        };
        let options = ExtractOptions {
            no_bytecode: self.defended(Defence::Bytecode),
            neutral_attributes: self.defended(Defence::GitAttributes)
                && self.defended(Defence::AttributesOverride),
            attr_source: self.defended(Defence::GitAttributes),
            skip_nested: self.defended(Defence::NestedRepo),
            max_bytes: if self.defended(Defence::DiffCap) {
                self.limits.diff_bytes
            } else {
                u64::MAX / 2
            },
        };
        let out = run(extract_script(&self.workdir, options)).await?;
        let scan = run(scan_script).await?;
        let hidden = run(ignored_script(&self.workdir)).await?;
        Ok((out, scan, hidden))
    }

    /// Kills the (frozen or thawed) agent container, snapshots it and reads the change from a new
    /// container of the snapshot, removed again before this returns (the image at cleanup).
    async fn read_change_from_snapshot(
        &mut self,
        id: &str,
    ) -> Result<(ExecOutput, ExecOutput, ExecOutput), SandboxError> {
        self.engine.kill(id).await?;
        let labels = HashMap::from([
            (LABEL_RUN.to_string(), self.run_id.clone()),
            (LABEL_TRIAL.to_string(), self.trial_id.clone()),
        ]);
        let image = self.engine.commit(id, labels).await?;
        self.snapshot_image = Some(image.clone());
        let spec = self.offline_spec("-extract", image);
        let sid = self.engine.create_container(&spec).await?;
        self.extract_container = Some(sid.clone());
        self.engine.start_container(&sid).await?;
        let r = self.read_change(&sid).await;
        if let Some(c) = self.extract_container.take() {
            let _ = self.engine.remove_container(&c).await;
        }
        r
    }

    /// Setup's last step: the root-only copy of the base commit the diff is read against
    /// (`workdir` must already be a repository at the base, for SWE-style tasks) or, for tasks
    /// without one (Harbor), a fresh commit of the workdir as the image left it.
    pub(super) fn base_snapshot_script(&self, swebench: bool) -> String {
        let wd = sh_quote(&self.workdir);
        let dir = BASE_GIT.rsplit_once('/').map_or("/var/lib/lego-rl", |(d, _)| d);
        let make = if swebench {
            format!("cp -a {wd}/.git {BASE_GIT}")
        } else {
            format!(
                "GIT_DIR={BASE_GIT} git init -q -b main; cd {wd}; GIT_DIR={BASE_GIT} GIT_WORK_TREE={wd} git add -A; \
                 GIT_DIR={BASE_GIT} GIT_WORK_TREE={wd} GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
                 git -c user.name=lego-rl -c user.email=lego-rl@localhost commit -q --no-verify --allow-empty -m base"
            )
        };
        format!(
            "command -v git >/dev/null || {{ echo 'the task image has no git: it is needed to read the agent diff' >&2; exit 3; }}; \
             mkdir -p {dir}; chmod 700 {dir}; rm -rf {BASE_GIT}; {make}; chown -R root:root {dir}; \
             GIT_DIR={BASE_GIT} git rev-parse HEAD"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrappers_count_is_taken_from_the_last_line_only() {
        assert_eq!(
            take_outlived("warn\nLEGO_RL_OUTLIVED 3\n"),
            ("warn\n".to_string(), Some(3))
        );
        assert_eq!(take_outlived("LEGO_RL_OUTLIVED 0\n"), (String::new(), Some(0)));
        // A forged line that is not last does not count (the wrapper was killed before its own).
        let forged = "LEGO_RL_OUTLIVED 0\nkilled\n";
        assert_eq!(take_outlived(forged), (forged.to_string(), None));
    }

    #[test]
    fn extraction_marks_parse() {
        let (nested, big) = extract_marks("LEGO_NESTED sub\nLEGO_NESTED a b/c\nLEGO_DIFF_TOO_LARGE 123\n");
        assert_eq!(nested, ["sub", "a b/c"]);
        assert_eq!(big, Some(123));
        assert_eq!(extract_marks("warning\n"), (Vec::new(), None));
    }

    #[test]
    fn only_ignore_rules_the_agent_wrote_hide_files() {
        let diff = "diff --git a/.gitignore b/.gitignore\nnew file mode 100644\n";
        let ignored = ".gitignore:1:pytest.py\tpytest.py\nbuild/.gitignore:1:*\tbuild/x\n";
        let ev = hidden_event(ignored, diff).expect("event");
        assert_eq!(ev.kind, "hidden_from_diff");
        assert!(
            ev.detail.starts_with("1 path(s)") && ev.detail.contains("pytest.py (.gitignore:1:pytest.py)")
        );
        assert!(hidden_event(ignored, "").is_none());
    }

    #[test]
    fn outside_hooks_are_startup_files_outside_the_repository() {
        assert!(is_outside_python_hook(
            "/home/agent/.local/lib/python3.13/site-packages/evil.pth",
            "/testbed"
        ));
        assert!(is_outside_python_hook("/tmp/sitecustomize.py", "/testbed"));
        assert!(!is_outside_python_hook("/testbed/evil.pth", "/testbed"));
        assert!(!is_outside_python_hook("/home/agent/.cache/pip/x", "/testbed"));
        assert!(!is_outside_python_hook("/testbed2/x.py", "/testbed2/"));
    }

    #[test]
    fn scripts_quote_the_workdir_and_keep_the_agents_git_out() {
        let o = ExtractOptions {
            no_bytecode: true,
            neutral_attributes: true,
            attr_source: true,
            skip_nested: true,
            max_bytes: 10,
        };
        let s = extract_script("/app dir", o);
        assert!(s.contains("info/attributes") && s.contains("-gt 10") && s.contains(NESTED_MARK));
        assert!(s.contains("GIT_WORK_TREE='/app dir'"));
        assert!(s.contains(&format!("GIT_DIR={BASE_GIT}")));
        let w = agent_command("echo 'hi'", &[]);
        assert!(w.starts_with("exec setpriv --reuid=agent"));
        assert!(w.contains("kill -s STOP -1") && w.contains("env HOME=/home/agent USER=agent"));
        let w = agent_command("true", &["HOME=/tmp/h".into()]);
        assert!(w.contains("env USER=agent LOGNAME=agent bash"), "{w}");
    }
}
