//! Stage 3, validity (sandboxes): per task, the tests without the gold patch must fail where
//! FAIL_TO_PASS says and pass where PASS_TO_PASS says; with the gold patch the task must resolve;
//! all of it `--validity-runs N` times to catch flaky tests; a grader that passes without the fix
//! is rejected. Images come from build-images' manifest (`--images FILE`).
//!
//! Every check goes through the same [`Trial`] stages training uses, so a task is judged by the
//! grader that will later judge agents:
//! - SWE-style tasks: `evaluate` with an empty diff (without the fix) and with the gold patch as
//!   the diff, each in a fresh container from the pristine image (test patch applied, protected
//!   test files restored, collection hooks reverted, tests graded per test).
//! - Harbor tasks: `setup`, then the verifier on the untouched workdir (no-op solution, reward
//!   must be 0); and `setup`, `solution/` uploaded to `/solution`, `bash /solution/solve.sh` as the
//!   agent, then the verifier on the workdir's diff in a fresh container, exactly as an agent's
//!   work is graded (reward must be 1).
//!
//! Reasons (the `reason` of the decision record and funnel): `no_image`, `image_build_failed`,
//! `image_missing`, `no_grader`, `no_gold_patch`, `no_solution`, `flaky` (a graded test or the
//! reward differs between runs of the same check), `gold_patch_does_not_apply`,
//! `passes_without_fix`, `rewards_without_fix` (a partial Harbor reward without the solution),
//! `gold_does_not_resolve`, `solution_failed`, `f2p_passes_without_fix`,
//! `p2p_fails_without_fix`, `<stage>_failed` (a trial stage failed: test patch does not apply,
//! verifier timed out, ...) and `sandbox_error` (the engine failed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use serde_json::{json, Map, Value};

use crate::grade::pytest::{PASSED, SKIPPED, XFAIL};
use crate::io::{read_all, IoError, ReadOptions};
use crate::records::{AuditEvent, Grader, ImageRecord, Task};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::trial::install_signal_sweep;
use crate::sandbox::{Engine, SandboxError, Trial, TrialLimits};
use crate::text::tail_bytes;

/// Settings of the validity stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ValiditySettings {
    /// Repetitions of the with/without-fix check (≥ 1); any disagreement = flaky.
    pub runs: u32,
    /// build-images' manifests (`ImageRecord` zstd JSONL); a later record of a task wins.
    pub images: Vec<PathBuf>,
    /// Sandbox trials in flight at once.
    pub jobs: usize,
}

/// One task's validity verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidityVerdict {
    /// Valid; the evidence summarises the runs.
    Valid(Value),
    Invalid {
        reason: String,
        evidence: Value,
    },
}

fn invalid(reason: &str, evidence: Value) -> ValidityVerdict {
    ValidityVerdict::Invalid {
        reason: reason.to_string(),
        evidence,
    }
}

/// Errors of the validity stage (before any task is checked).
#[derive(Debug, thiserror::Error)]
pub enum ValidityError {
    #[error("the validity stage needs build-images' manifest: pass --images FILE")]
    NoImages,
    #[error("--validity-runs must be at least 1")]
    NoRuns,
    #[error("reading the image manifest: {0}")]
    Manifest(#[from] IoError),
    #[error("{path}: image manifest holds no records")]
    EmptyManifest { path: PathBuf },
    #[error("validity stage: {0}")]
    Engine(#[from] SandboxError),
    #[error("validity stage: cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// One task to check: the task and the directory its relative paths resolve against.
pub struct Candidate {
    pub task: Task,
    pub dir: PathBuf,
}

/// Which reference the check runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    WithoutFix,
    WithFix,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::WithoutFix => "without_fix",
            Mode::WithFix => "with_fix",
        }
    }
}

/// The reference solution of a task.
enum Reference {
    Patch(String),
    SolutionDir(PathBuf),
}

/// What one graded run produced.
#[derive(Debug, Clone)]
struct Run {
    reward: f64,
    tests: BTreeMap<String, String>,
    apply: Option<String>,
    audit: Vec<AuditEvent>,
    log_tail: Option<String>,
}

/// A failed run: the reason and its evidence.
type RunError = (String, Value);

/// Runs the validity checks on the container engine.
pub struct Validator {
    rt: tokio::runtime::Runtime,
    engine: Engine,
    images: HashMap<String, ImageRecord>,
    manifest: Vec<PathBuf>,
    runs: u32,
    jobs: usize,
    run_id: String,
    trials: AtomicU64,
    /// `jobs` permits: one per trial in flight.
    slots: tokio::sync::Semaphore,
}

impl Validator {
    /// Loads the manifest and connects to the engine (fails before anything is read or written).
    pub fn new(settings: &ValiditySettings) -> Result<Self, ValidityError> {
        if settings.runs == 0 {
            return Err(ValidityError::NoRuns);
        }
        if settings.images.is_empty() {
            return Err(ValidityError::NoImages);
        }
        let mut images = HashMap::new();
        for path in &settings.images {
            let recs: Vec<ImageRecord> = read_all(path, ReadOptions::default())?;
            if recs.is_empty() {
                return Err(ValidityError::EmptyManifest { path: path.clone() });
            }
            // The last record of a task wins (a later build of it).
            images.extend(recs.into_iter().map(|r| (r.task_id.clone(), r)));
        }
        let manifest = settings.images.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(ValidityError::Runtime)?;
        let engine = rt.block_on(Engine::connect())?;
        let run_id = format!("validity-{}", uuid::Uuid::new_v4().simple());
        {
            let _guard = rt.enter();
            install_signal_sweep(engine.clone(), run_id.clone());
        }
        Ok(Validator {
            rt,
            engine,
            images,
            manifest,
            runs: settings.runs,
            jobs: settings.jobs.max(1),
            run_id,
            trials: AtomicU64::new(0),
            slots: tokio::sync::Semaphore::new(settings.jobs.max(1)),
        })
    }

    /// Checks every candidate (`jobs` trials in flight); verdicts in input order. `on_trial` is
    /// called after each graded run (progress).
    pub fn check_all(&self, candidates: &[Candidate], on_trial: &(dyn Fn() + Sync)) -> Vec<ValidityVerdict> {
        self.rt.block_on(async {
            let verdicts = futures::stream::iter(candidates.iter().enumerate())
                .map(|(i, c)| async move { (i, self.check(c, on_trial).await) })
                .buffer_unordered(self.jobs)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<BTreeMap<_, _>>();
            crate::sandbox::trial::park_if_interrupted().await;
            verdicts.into_values().collect()
        })
    }

    /// One task: both checks, `runs` times, then the verdict.
    async fn check(&self, c: &Candidate, on_trial: &(dyn Fn() + Sync)) -> ValidityVerdict {
        let task = &c.task;
        let Some(img) = self.images.get(&task.id) else {
            return invalid(
                "no_image",
                json!({
                    "manifests": self.manifest.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                    "detail": "task not in the image manifest",
                }),
            );
        };
        if let Some(e) = &img.error {
            return invalid(
                "image_build_failed",
                json!({"image": img.image, "error": e, "log_path": img.log_path}),
            );
        }
        match self.engine.image_id(&img.image).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return invalid(
                    "image_missing",
                    json!({"image": img.image, "detail": "in the manifest but not in the engine; re-run build-images"}),
                )
            }
            Err(e) => return invalid("sandbox_error", json!({"error": e.to_string()})),
        }
        let reference = match &task.grader {
            None => return invalid("no_grader", Value::Null),
            Some(Grader::Swebench { .. }) => match task.gold_patch.as_deref() {
                Some(p) if !p.trim().is_empty() => Reference::Patch(p.to_string()),
                _ => return invalid("no_gold_patch", Value::Null),
            },
            Some(Grader::Harbor { .. }) => match solution_dir(task, &c.dir) {
                Some(d) => Reference::SolutionDir(d),
                None => {
                    return invalid(
                        "no_solution",
                        json!({"detail": "no solution/solve.sh (metadata.solution_dir or metadata.harbor.solution)"}),
                    )
                }
            },
        };
        // Every run of both checks, each in its own containers; `slots` bounds trials in flight.
        let jobs: Vec<(Mode, u32)> = (0..self.runs)
            .flat_map(|r| [(Mode::WithoutFix, r), (Mode::WithFix, r)])
            .collect();
        let jobs_len = jobs.len();
        let results: Vec<(Mode, u32, Result<Run, RunError>)> = futures::stream::iter(jobs)
            .map(|(mode, r)| {
                let reference = &reference;
                async move {
                    let res = self.once(c, &img.image, mode, reference).await;
                    on_trial();
                    (mode, r, res)
                }
            })
            .buffered(jobs_len)
            .collect()
            .await;
        let mut without = Vec::new();
        let mut with = Vec::new();
        for (mode, r, res) in results {
            match res {
                Err((reason, mut evidence)) => {
                    if let Value::Object(m) = &mut evidence {
                        m.insert("check".into(), json!(mode.as_str()));
                        m.insert("run".into(), json!(r + 1));
                    }
                    return ValidityVerdict::Invalid { reason, evidence };
                }
                Ok(run) => match mode {
                    Mode::WithoutFix => without.push(run),
                    Mode::WithFix => with.push(run),
                },
            }
        }
        match reference {
            Reference::Patch(_) => judge_swebench(task, &without, &with),
            Reference::SolutionDir(_) => judge_harbor(&without, &with),
        }
    }

    /// One graded run in fresh containers, always cleaned up.
    async fn once(
        &self,
        c: &Candidate,
        image: &str,
        mode: Mode,
        reference: &Reference,
    ) -> Result<Run, RunError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|e| ("sandbox_error".to_string(), json!({"error": e.to_string()})))?;
        let n = self.trials.fetch_add(1, Ordering::Relaxed);
        let task = &c.task;
        let mut trial = Trial::new(
            self.engine.clone(),
            task.clone(),
            c.dir.clone(),
            image.to_string(),
            &self.run_id,
            &format!("{n}-{}-{}", task.id, mode.as_str()),
            TrialLimits::for_task(task),
            Vec::new(),
            Vec::new(),
        );
        let r = run_checked(&mut trial, mode, reference).await;
        if let Err(e) = trial.cleanup().await {
            tracing::warn!("validity {}: cleanup: {e}", task.id);
        }
        r.map(|mut run| {
            run.audit = std::mem::take(&mut trial.audit);
            run
        })
    }
}

/// The stages of one run (see the module docs).
async fn run_checked(trial: &mut Trial, mode: Mode, reference: &Reference) -> Result<Run, RunError> {
    let mut diff = match (mode, reference) {
        (Mode::WithFix, Reference::Patch(p)) => p.clone(),
        _ => String::new(),
    };
    if let Reference::SolutionDir(dir) = reference {
        trial.setup().await.map_err(stage_error)?;
        if mode == Mode::WithFix {
            let mut tar = TarBuilder::new();
            tar.dir("solution");
            tar.dir_tree(dir, "solution").map_err(|e| {
                (
                    "no_solution".to_string(),
                    json!({"path": dir.display().to_string(), "error": e.to_string()}),
                )
            })?;
            trial.upload("/", tar.finish()).await.map_err(stage_error)?;
            let (_, out) = trial
                .run_agent("bash /solution/solve.sh")
                .await
                .map_err(stage_error)?;
            if !out.ok() {
                return Err((
                    "solution_failed".into(),
                    json!({
                        "exit_code": out.exit_code,
                        "timed_out": out.timed_out,
                        "output_tail": tail_bytes(&format!("{}{}", out.stdout, out.stderr), 2000),
                    }),
                ));
            }
            // Graded like an agent's work: the solution's diff of the workdir, in a fresh
            // container.
            diff = trial.extract(None).await.map_err(stage_error)?;
        }
    }
    let (reward, grader) = trial.evaluate(&diff).await.map_err(stage_error)?;
    Ok(Run {
        reward,
        tests: grader.tests,
        apply: grader.apply,
        audit: Vec::new(),
        log_tail: grader.log_tail.map(|l| tail_bytes(&l, 2000)),
    })
}

/// A trial stage's failure as a reason: `<stage>_failed` for a stage the task controls (setup
/// script, test patch, verifier), `sandbox_error` for the engine.
fn stage_error(e: SandboxError) -> RunError {
    match &e {
        SandboxError::Stage { stage, message } => (
            format!("{stage}_failed"),
            json!({"error": tail_bytes(message, 2000)}),
        ),
        _ => ("sandbox_error".into(), json!({"error": e.to_string()})),
    }
}

/// The Harbor solution directory: `metadata.harbor.solution` (solve.sh, from a task directory),
/// `metadata.solution_dir` (relative to the record's file), or `solution/` beside the tests.
fn solution_dir(task: &Task, dir: &Path) -> Option<PathBuf> {
    let from_harbor = task
        .metadata
        .get("harbor")
        .and_then(|h| h.get("solution"))
        .and_then(Value::as_str)
        .and_then(|s| Path::new(s).parent().map(Path::to_path_buf));
    let from_meta = task
        .metadata
        .get("solution_dir")
        .and_then(Value::as_str)
        .map(|s| dir.join(s));
    let beside_tests = match &task.grader {
        Some(Grader::Harbor { tests_dir }) => dir.join(tests_dir).parent().map(|p| p.join("solution")),
        _ => None,
    };
    [from_harbor, from_meta, beside_tests]
        .into_iter()
        .flatten()
        .find(|d| d.join("solve.sh").is_file())
}

fn passes(status: Option<&String>) -> bool {
    matches!(
        status.map(String::as_str),
        Some(PASSED) | Some(SKIPPED) | Some(XFAIL)
    )
}

const MAX_LISTED: usize = 20;

fn listed(tests: &[&String]) -> Value {
    json!({"count": tests.len(), "tests": tests.iter().take(MAX_LISTED).collect::<Vec<_>>()})
}

/// Tests (of `names`) or rewards that differ between runs of one check.
fn flaky(names: &BTreeSet<&String>, without: &[Run], with: &[Run]) -> Option<Value> {
    let mut tests = Map::new();
    let mut count = 0;
    for name in names {
        let mut per_check = Map::new();
        for (mode, runs) in [(Mode::WithoutFix, without), (Mode::WithFix, with)] {
            let statuses: Vec<&str> = runs
                .iter()
                .map(|r| r.tests.get(*name).map_or("MISSING", String::as_str))
                .collect();
            if statuses.windows(2).any(|w| w[0] != w[1]) {
                per_check.insert(mode.as_str().into(), json!(statuses));
            }
        }
        if !per_check.is_empty() {
            count += 1;
            if tests.len() < MAX_LISTED {
                tests.insert((*name).clone(), Value::Object(per_check));
            }
        }
    }
    let rewards = |runs: &[Run]| runs.iter().map(|r| r.reward).collect::<Vec<_>>();
    let differ = |runs: &[Run]| runs.windows(2).any(|w| w[0].reward != w[1].reward);
    if count == 0 && !differ(without) && !differ(with) {
        return None;
    }
    Some(json!({
        "runs": without.len(),
        "flaky_tests": count,
        "tests": tests,
        "rewards": {"without_fix": rewards(without), "with_fix": rewards(with)},
    }))
}

fn judge_swebench(task: &Task, without: &[Run], with: &[Run]) -> ValidityVerdict {
    let graded: BTreeSet<&String> = task.fail_to_pass.iter().chain(&task.pass_to_pass).collect();
    if let Some(ev) = flaky(&graded, without, with) {
        return invalid("flaky", ev);
    }
    let (w0, g0) = (&without[0], &with[0]);
    if g0.apply.as_deref() == Some("failed") {
        return invalid("gold_patch_does_not_apply", json!({"log_tail": g0.log_tail}));
    }
    let f2p_passing: Vec<&String> = task
        .fail_to_pass
        .iter()
        .filter(|t| w0.tests.get(*t).map(String::as_str) == Some(PASSED))
        .collect();
    if w0.reward >= 1.0 {
        return invalid(
            "passes_without_fix",
            json!({"reward": w0.reward, "fail_to_pass_passing": listed(&f2p_passing)}),
        );
    }
    if g0.reward < 1.0 {
        let failing: Vec<&String> = task
            .fail_to_pass
            .iter()
            .filter(|t| g0.tests.get(*t).map(String::as_str) != Some(PASSED))
            .chain(task.pass_to_pass.iter().filter(|t| !passes(g0.tests.get(*t))))
            .collect();
        return invalid(
            "gold_does_not_resolve",
            json!({
                "reward": g0.reward,
                "apply": g0.apply,
                "failing": listed(&failing),
                "audit": g0.audit.iter().map(|a| format!("{}: {}", a.kind, a.detail)).collect::<Vec<_>>(),
                "log_tail": g0.log_tail,
            }),
        );
    }
    if !f2p_passing.is_empty() {
        return invalid(
            "f2p_passes_without_fix",
            json!({"fail_to_pass_passing": listed(&f2p_passing)}),
        );
    }
    let p2p_failing: Vec<&String> = task
        .pass_to_pass
        .iter()
        .filter(|t| !passes(w0.tests.get(*t)))
        .collect();
    if !p2p_failing.is_empty() {
        return invalid(
            "p2p_fails_without_fix",
            json!({"pass_to_pass_failing": listed(&p2p_failing), "log_tail": w0.log_tail}),
        );
    }
    ValidityVerdict::Valid(json!({
        "runs": without.len(),
        "fail_to_pass": task.fail_to_pass.len(),
        "pass_to_pass": task.pass_to_pass.len(),
        "reward_without_fix": w0.reward,
        "reward_with_fix": g0.reward,
        "gold_apply": g0.apply,
    }))
}

fn judge_harbor(without: &[Run], with: &[Run]) -> ValidityVerdict {
    let names: BTreeSet<&String> = without.iter().chain(with).flat_map(|r| r.tests.keys()).collect();
    if let Some(ev) = flaky(&names, without, with) {
        return invalid("flaky", ev);
    }
    let (w0, g0) = (&without[0], &with[0]);
    if w0.reward >= 1.0 {
        return invalid(
            "passes_without_fix",
            json!({"reward": w0.reward, "components": w0.tests}),
        );
    }
    if w0.reward > 0.0 {
        return invalid(
            "rewards_without_fix",
            json!({"reward": w0.reward, "components": w0.tests}),
        );
    }
    if g0.reward < 1.0 {
        return invalid(
            "gold_does_not_resolve",
            json!({"reward": g0.reward, "components": g0.tests, "log_tail": g0.log_tail}),
        );
    }
    ValidityVerdict::Valid(json!({
        "runs": without.len(),
        "reward_without_fix": w0.reward,
        "reward_with_fix": g0.reward,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(reward: f64, tests: &[(&str, &str)]) -> Run {
        Run {
            reward,
            tests: tests
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            apply: Some("git apply".into()),
            audit: Vec::new(),
            log_tail: None,
        }
    }

    fn task() -> Task {
        let mut t = Task::new("t", "fix it");
        t.fail_to_pass = vec!["a.py::f".into()];
        t.pass_to_pass = vec!["a.py::p".into()];
        t
    }

    fn swe(t: &Task, without: &Run, with: &Run) -> String {
        reason(&judge_swebench(
            t,
            std::slice::from_ref(without),
            std::slice::from_ref(with),
        ))
        .to_string()
    }

    fn harbor(without: &Run, with: &Run) -> String {
        reason(&judge_harbor(
            std::slice::from_ref(without),
            std::slice::from_ref(with),
        ))
        .to_string()
    }

    fn reason(v: &ValidityVerdict) -> &str {
        match v {
            ValidityVerdict::Valid(_) => "valid",
            ValidityVerdict::Invalid { reason, .. } => reason,
        }
    }

    #[test]
    fn swebench_verdicts() {
        let t = task();
        let none = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "PASSED")]);
        let gold = run(1.0, &[("a.py::f", "PASSED"), ("a.py::p", "PASSED")]);
        assert_eq!(swe(&t, &none, &gold), "valid");
        assert_eq!(swe(&t, &gold, &gold), "passes_without_fix");
        assert_eq!(swe(&t, &none, &none), "gold_does_not_resolve");
        let p2p_broken = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "ERROR")]);
        assert_eq!(swe(&t, &p2p_broken, &gold), "p2p_fails_without_fix");
        let mut t2 = t.clone();
        t2.fail_to_pass.push("a.py::g".into());
        let half = run(
            0.0,
            &[
                ("a.py::f", "FAILED"),
                ("a.py::g", "PASSED"),
                ("a.py::p", "PASSED"),
            ],
        );
        let gold2 = run(
            1.0,
            &[
                ("a.py::f", "PASSED"),
                ("a.py::g", "PASSED"),
                ("a.py::p", "PASSED"),
            ],
        );
        assert_eq!(swe(&t2, &half, &gold2), "f2p_passes_without_fix");
        // A graded test that changes between runs of the same check is flaky, whatever run 1 said.
        let other = run(0.0, &[("a.py::f", "FAILED"), ("a.py::p", "FAILED")]);
        let v = judge_swebench(&t, &[none.clone(), other], &[gold.clone(), gold.clone()]);
        assert_eq!(reason(&v), "flaky");
        let ValidityVerdict::Invalid { evidence, .. } = v else {
            unreachable!()
        };
        assert_eq!(
            evidence["tests"]["a.py::p"]["without_fix"],
            json!(["PASSED", "FAILED"])
        );
        assert!(evidence["tests"]["a.py::p"].get("with_fix").is_none());
        let mut bad_apply = gold;
        bad_apply.apply = Some("failed".into());
        assert_eq!(swe(&t, &none, &bad_apply), "gold_patch_does_not_apply");
    }

    #[test]
    fn harbor_verdicts() {
        let zero = run(0.0, &[("reward", "0")]);
        let one = run(1.0, &[("reward", "1")]);
        let half = run(0.5, &[("correctness", "1"), ("performance", "0")]);
        assert_eq!(harbor(&zero, &one), "valid");
        assert_eq!(harbor(&one, &one), "passes_without_fix");
        assert_eq!(harbor(&half, &one), "rewards_without_fix");
        assert_eq!(harbor(&zero, &half), "gold_does_not_resolve");
        assert_eq!(
            reason(&judge_harbor(
                &[zero.clone(), zero],
                &[one.clone(), run(0.0, &[("reward", "0")])]
            )),
            "flaky"
        );
    }

    #[test]
    fn solution_dir_lookup() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("t/solution")).unwrap();
        std::fs::create_dir_all(d.path().join("t/tests")).unwrap();
        let mut t = Task::new("t", "x");
        t.grader = Some(Grader::Harbor {
            tests_dir: "t/tests".into(),
        });
        assert_eq!(solution_dir(&t, d.path()), None, "no solve.sh");
        std::fs::write(d.path().join("t/solution/solve.sh"), "true\n").unwrap();
        assert_eq!(solution_dir(&t, d.path()), Some(d.path().join("t/solution")));
        t.metadata.insert("solution_dir".into(), json!("t/solution"));
        assert_eq!(solution_dir(&t, d.path()), Some(d.path().join("t/solution")));
    }
}
