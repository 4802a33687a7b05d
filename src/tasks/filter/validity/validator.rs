//! The sandbox side of the validity stage: the [`Validator`] that loads the image manifest and
//! runs each task's with/without-fix checks through [`Trial`], `jobs` trials in flight.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use serde_json::{json, Value};

use super::judge::{judge_harbor, judge_swebench};
use super::{
    invalid, Candidate, Mode, Reference, Run, RunError, ValidityError, ValiditySettings, ValidityVerdict,
};
use crate::io::{read_all, ReadOptions};
use crate::records::{Grader, ImageRecord, Task};
use crate::sandbox::images::trial_workdir;
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::trial::install_signal_sweep;
use crate::sandbox::{Engine, SandboxError, Trial, TrialLimits};
use crate::text::tail_bytes;

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
        // Checked where an agent would work: the task's workdir, else its image's.
        let (workdir, _) = trial_workdir(&self.engine, task, image)
            .await
            .map_err(|e| ("sandbox_error".to_string(), json!({"error": e.to_string()})))?;
        let mut with_workdir = task.clone();
        with_workdir.environment.workdir = Some(workdir);
        let mut trial = Trial::new(
            self.engine.clone(),
            with_workdir,
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

#[cfg(test)]
mod tests {
    use super::*;

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
