//! The standing adversarial suite: scripted "agents" ([`crate::adversarial_cases`]), each trying
//! one way to a reward it did not earn, on the real sandboxes and graders (Docker, the testdata
//! task images). Each trick runs twice in the same test: guarded, it must end with reward 0 and
//! the audit event that names it; unguarded (its defences switched off through the doc-hidden
//! `Trial::without_defence`, which nothing outside tests reaches), it must really score: reward 1,
//! or the weight-0 infra failure a saboteur is after, or its event hidden. A trick that cannot
//! score without its defence would test nothing but an event name. Each honest control (the real
//! fix, alone or with the tricks' harmless twins) must still get reward 1. The threat model these
//! cases stand for is in man/lego-rl-formats.md ("Reward integrity"). Fails loudly when Docker is
//! missing and `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use lego_rl::records::{Grader, Task, Termination};
use lego_rl::sandbox::{Engine, Trial, TrialLimits, TrialResult};

use crate::adversarial_cases::{cases, Case, Scores, HARBOR, HARBOR_CODE, KINDS, SWE};
use crate::sandbox::{assert_no_leftovers, engine, images, rt, run_id, task, task_root};

/// Runs `c` once, guarded or (`unguarded`) with its defences off.
pub(crate) async fn run_case(engine: &Engine, t: &Task, run: &str, c: &Case, unguarded: bool) -> TrialResult {
    let mut t = t.clone();
    if let (Some(cmd), Some(Grader::Swebench { test_cmd, .. })) = (c.test_cmd, t.grader.as_mut()) {
        *test_cmd = cmd.to_string();
    }
    let mut limits = TrialLimits::for_task(&t);
    if let Some(s) = c.agent_s {
        limits.agent = Duration::from_secs(s);
    }
    if let Some(s) = c.eval_s {
        limits.eval = Duration::from_secs(s);
    }
    if let Some(s) = c.setup_s {
        limits.setup = Duration::from_secs(s);
    }
    if let Some(m) = c.memory_mb {
        limits.memory_bytes = m << 20;
    }
    if let Some(b) = c.diff_bytes {
        limits.diff_bytes = b;
    }
    let image = c.image.clone().unwrap_or_else(|| images()[&t.id].image.clone());
    let name = if unguarded {
        format!("{}-unguarded", c.name)
    } else {
        c.name.to_string()
    };
    let mut trial = Trial::new(
        engine.clone(),
        t,
        task_root(),
        image,
        run,
        &name,
        limits,
        Vec::new(),
        Vec::new(),
    );
    for d in &c.keep_off {
        trial = trial.without_defence(*d);
    }
    if unguarded {
        for d in &c.off {
            trial = trial.without_defence(*d);
        }
    }
    trial.run(&c.script).await
}

/// `image` with git 2.39 in place of the base image's 2.47 (agent, extraction and grading all run
/// it): the git of SWE-bench's images (2.34) and every git before 2.42 ignores `GIT_ATTR_SOURCE`.
/// The binary is Debian bookworm's, unpacked by scripts/install-test-deps.sh.
pub(crate) fn old_git_image(image: &str) -> String {
    let git = old_git();
    let dir = git.ancestors().nth(4).expect("CTX/x/usr/bin/git").to_path_buf();
    std::fs::write(
        dir.join("Dockerfile"),
        format!("FROM {image}\nCOPY x/usr/bin/git /usr/bin/git\n"),
    )
    .expect("Dockerfile");
    derived_image(image, "git-2.39", &dir)
}

/// `image` with `ENV PYTHONPATH=<workdir>/lib_env`: a task image that puts a repository directory
/// on the path by its environment alone (the import-path probe must find it; the command's text
/// does not name it).
fn env_pythonpath_image(image: &str, workdir: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("env-pythonpath");
    std::fs::create_dir_all(&dir).expect("image context");
    let dockerfile = format!("FROM {image}\nENV PYTHONPATH={workdir}/lib_env\n");
    std::fs::write(dir.join("Dockerfile"), dockerfile).expect("Dockerfile");
    derived_image(image, "env-pythonpath", &dir)
}

/// Builds the Dockerfile in `ctx` (a `FROM image` with one change) as `NAME-suffix:TAG` of
/// `image`'s `NAME:TAG`, and returns that tag.
pub(crate) fn derived_image(image: &str, suffix: &str, ctx: &Path) -> String {
    let (name, tag) = image.rsplit_once(':').expect("a tagged image");
    let out = format!("{name}-{suffix}:{tag}");
    let built = Command::new("docker")
        .args(["build", "-q", "-t", &out])
        .arg(ctx)
        .output()
        .expect("docker build runs");
    assert!(
        built.status.success(),
        "docker build {out}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// git 2.39's binary (see [`old_git_image`]), copied into a build context of its own from where
/// scripts/install-test-deps.sh unpacked Debian bookworm's package.
fn old_git() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let git = cache.join("lego-rl/old-git/x/usr/bin/git");
    assert!(
        git.exists(),
        "no {}: run scripts/install-test-deps.sh (scripts/test.sh does)",
        git.display()
    );
    let ctx = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("old-git");
    let _ = std::fs::remove_dir_all(&ctx);
    std::fs::create_dir_all(ctx.join("x/usr/bin")).expect("build context");
    std::fs::copy(&git, ctx.join("x/usr/bin/git")).expect("copy git");
    ctx.join("x/usr/bin/git")
}

/// The unguarded run of a trick must score what its author is after.
pub(crate) fn check_unguarded(c: &Case, r: &TrialResult) -> Result<(), String> {
    if let Some(line) = c.log_has {
        if !r.agent_log.as_deref().unwrap_or_default().contains(line) {
            return Err(format!(
                "{} (unguarded): agent log lacks {line:?}: {:?}",
                c.name, r.agent_log
            ));
        }
    }
    let ctx = || {
        format!(
            "{} (unguarded, {:?} off): {:?} {:?} infra={:?} audit={:?} log={:?} diff={:?} grader={:?}",
            c.name,
            c.off,
            r.termination,
            r.reward,
            r.infra_cause,
            r.audit,
            r.agent_log,
            r.diff.as_deref().map(|d| lego_rl::text::tail_bytes(d, 600)),
            r.grader
        )
    };
    let ok = match c.scores {
        Scores::Reward => !r.infra_failure && r.reward == Some(1.0),
        Scores::Infra => r.infra_failure,
        Scores::HidesEvent => r.infra_failure || !r.audit.iter().any(|a| c.events.contains(&a.kind.as_str())),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("the trick does not score without its defence: {}", ctx()))
    }
}

/// Timestamps (seconds) the late writers left in the diff's `late-*.txt` files.
fn late_stamps(diff: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut in_late = false;
    for line in diff.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            in_late = rest.contains("/late-");
        } else if in_late && !line.starts_with("+++") {
            if let Some(t) = line.strip_prefix('+').and_then(|t| t.parse::<f64>().ok()) {
                out.push(t);
            }
        }
    }
    out
}

fn check(c: &Case, r: &TrialResult) -> Result<(), String> {
    let ctx = || {
        format!(
            "{}: {:?} {:?} audit={:?} log={:?}",
            c.name, r.termination, r.reward, r.audit, r.agent_log
        )
    };
    if r.infra_failure {
        return Err(format!("infra failure {:?}: {}", r.infra_cause, ctx()));
    }
    if let Some(line) = c.log_has {
        if !r.agent_log.as_deref().unwrap_or_default().contains(line) {
            return Err(format!("agent log lacks {line:?}: {}", ctx()));
        }
    }
    if r.reward.is_some_and(|x| x > 0.0) && r.audit.iter().any(|a| a.kind == "diff_too_large") {
        return Err(format!("a diff over the limit was graded: {}", ctx()));
    }
    if r.reward != Some(c.reward) {
        return Err(format!("reward: {} grader={:?}", ctx(), r.grader));
    }
    let reason = r.grader.as_ref().and_then(|g| g.reason.as_deref());
    if reason != c.reason {
        return Err(format!("reason {reason:?}: {}", ctx()));
    }
    let kinds: Vec<&str> = r
        .audit
        .iter()
        .map(|a| a.kind.as_str())
        .filter(|k| KINDS.contains(k))
        .collect();
    let want = &c.events;
    let extra: Vec<&&str> = kinds.iter().filter(|k| !want.contains(*k)).collect();
    let fork_bomb = c.name == "fork-bomb";
    if !want.iter().all(|w| kinds.contains(w)) || (!extra.is_empty() && !fork_bomb) {
        return Err(format!("events {kinds:?}, want {want:?}: {}", ctx()));
    }
    if fork_bomb && r.termination != Termination::AgentTimeout {
        return Err(format!("termination: {}", ctx()));
    }
    if c.name == "late-writers" || c.name == "wrapper-killed" {
        let diff = r.diff.clone().unwrap_or_default();
        let stamps = late_stamps(&diff);
        if stamps.is_empty() {
            return Err(format!(
                "no late writer's line at all (they ran during the stage): {}",
                ctx()
            ));
        }
        // The in-band stop freezes them the moment the harness exits; without it (the wrapper
        // killed) they are frozen when extraction begins. Nothing after that is in the diff.
        let limit = if c.name == "late-writers" {
            r.stages["agent"].end
        } else {
            r.stages["freeze"].end
        };
        let late: Vec<&f64> = stamps.iter().filter(|t| **t > limit).collect();
        if !late.is_empty() {
            return Err(format!(
                "{}: {} lines written after {limit}: {late:?}",
                c.name,
                late.len()
            ));
        }
        let n: u64 = r
            .audit
            .iter()
            .find(|a| a.kind == "outlived_agent")
            .and_then(|a| a.detail.split(' ').next()?.parse().ok())
            .unwrap_or(0);
        if n < 4 {
            return Err(format!("outlived count {n} < 4 writers: {}", ctx()));
        }
    }
    Ok(())
}

#[test]
fn tricks_score_without_their_defence_and_get_zero_with_it_and_honest_fixes_get_one() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    images();
    let (swe, harbor, harbor_code) = (task(SWE), task(HARBOR), task(HARBOR_CODE));
    let run = run_id("adversarial");
    // LEGO_RL_ADVERSARIAL_ONLY=NAME,... runs only those cases (for debugging one trick).
    let only = std::env::var("LEGO_RL_ADVERSARIAL_ONLY").unwrap_or_default();
    let git = old_git_image(&images()[SWE].image);
    let workdir = swe
        .environment
        .workdir
        .clone()
        .unwrap_or_else(|| "/testbed".into());
    let env_image = env_pythonpath_image(&images()[SWE].image, &workdir);
    let all: Vec<Case> = cases(&swe, &harbor)
        .into_iter()
        .filter(|c| only.is_empty() || only.split(',').any(|o| o == c.name))
        .map(|mut c| {
            if c.name.ends_with("-on-git-2.39") {
                c.image = Some(git.clone());
            }
            if c.name.ends_with("-images-env-pythonpath") {
                c.image = Some(env_image.clone());
            }
            c
        })
        .collect();
    // Every case guarded, and every trick once more unguarded.
    let runs: Vec<(usize, bool)> = all
        .iter()
        .enumerate()
        .flat_map(|(i, c)| std::iter::once((i, false)).chain((!c.off.is_empty()).then_some((i, true))))
        .collect();
    let tasks: Vec<&Task> = all
        .iter()
        .map(|c| match c.task {
            SWE => &swe,
            HARBOR => &harbor,
            _ => &harbor_code,
        })
        .collect();
    run_and_check(&rt, &engine, &run, (&all, &tasks), &runs, check);
}

/// Runs `runs` (case index, unguarded), two trials at a time, case i on `tasks[i]`; asserts
/// every guarded run passes `check` and every unguarded one [`check_unguarded`], naming each
/// failure, and that the run left nothing behind.
pub(crate) fn run_and_check(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    run: &str,
    (all, tasks): (&[Case], &[&Task]),
    runs: &[(usize, bool)],
    check: fn(&Case, &TrialResult) -> Result<(), String>,
) {
    let results: Vec<(usize, bool, TrialResult)> = rt.block_on(async {
        futures::stream::iter(runs.iter().copied())
            .map(|(i, unguarded)| {
                let (c, t) = (&all[i], tasks[i]);
                async move { (i, unguarded, run_case(engine, t, run, c, unguarded).await) }
            })
            .buffer_unordered(2)
            .collect()
            .await
    });
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(i, unguarded, r)| {
            if *unguarded {
                check_unguarded(&all[*i], r).err()
            } else {
                check(&all[*i], r).err()
            }
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        runs.len(),
        failures.join("\n")
    );
    rt.block_on(assert_no_leftovers(engine, run));
}
