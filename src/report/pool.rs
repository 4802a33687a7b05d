//! The report's view of the task pool's difficulty band over steps (`scripts/loop.sh --refilter`):
//! per batch, the pool's size, what the re-filter dropped from it and why, and how its tasks'
//! recent pass rates (`Task::pass_rate`, renewed by each re-filter) spread over bands, as
//! `pool_steps.csv` and the page's "Task pool" plot and table. A run without `pool/` files has
//! no rows and the page shows nothing.
//!
//! Why bands and not quantiles: the question this view answers is how much of the pool can still
//! teach. A group of a task at pass rate 0 or 1 has all-equal rewards and gives GSPO no gradient,
//! and a group's chance of varying peaks in the middle; quantiles hide how many tasks sit exactly
//! at the ends (a pool half at 1 and half at 0.5 has a median of 0.75 or 1 depending on one task).
//! So the ends are bands of their own: never solved (0), hard (0, 0.25), middle [0.25, 0.75],
//! easy (0.75, 1), always solved (1), and the tasks without a pass rate yet (no counted trial).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{csv_err, finish_csv, ReportError};
use crate::io::{open_records, read_all, ReadOptions};
use crate::records::{PassRate, Task, TaskDecision};
use crate::validate::run::{RunError, RunFiles};

/// The pool's tasks per pass-rate band (the bounds are in the module doc).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Bands {
    /// No pass rate yet: the task has no counted trial in the re-filter's window.
    pub unrated: u64,
    pub never_solved: u64,
    pub hard: u64,
    pub middle: u64,
    pub easy: u64,
    pub always_solved: u64,
}

impl Bands {
    /// Counts one task's pass rate. The band comes from `solved` and `trials`, not the stored
    /// `rate`, so that a rate of exactly 0 or 1 is a count, never a float comparison.
    pub fn add(&mut self, rate: Option<&PassRate>) {
        let band = match rate {
            None => &mut self.unrated,
            Some(r) if r.trials == 0 => &mut self.unrated,
            Some(r) if r.solved == 0 => &mut self.never_solved,
            Some(r) if r.solved >= r.trials => &mut self.always_solved,
            Some(r) => {
                let p = f64::from(r.solved) / f64::from(r.trials);
                if p < 0.25 {
                    &mut self.hard
                } else if p <= 0.75 {
                    &mut self.middle
                } else {
                    &mut self.easy
                }
            }
        };
        *band += 1;
    }
}

/// The pool of one batch.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PoolStep {
    /// The batch the pool was made for (its file's `step-NNNNNN`).
    pub step: u64,
    /// Tasks in the pool; None without a pool file for the step.
    pub tasks: Option<u64>,
    /// Tasks the re-filter dropped before this batch, by reason (`saturated_solved`: every recent
    /// group solved, `saturated_failed`: none); None without a decisions file for the step.
    pub dropped: Option<BTreeMap<String, u64>>,
    pub bands: Bands,
    /// Mean pass rate over the rated tasks (a task's solved / trials, each task weighing one).
    pub pass_rate_mean: Option<f64>,
}

/// Reads the run's pool files and re-filter decisions into one row per step that has either.
pub fn pool_steps(files: &RunFiles, opts: ReadOptions) -> Result<Vec<PoolStep>, RunError> {
    let mut rows: BTreeMap<u64, PoolStep> = BTreeMap::new();
    for (step, path) in &files.pool {
        let Some(step) = step else { continue };
        let r = entry(&mut rows, *step);
        let (mut rated, mut sum) = (0u64, 0.0);
        let mut reader = open_records::<Task>(path, opts)?;
        for t in reader.by_ref() {
            let t = t?;
            *r.tasks.get_or_insert(0) += 1;
            r.bands.add(t.pass_rate.as_ref());
            if let Some(p) = t.pass_rate.filter(|p| p.trials > 0) {
                rated += 1;
                sum += f64::from(p.solved.min(p.trials)) / f64::from(p.trials);
            }
        }
        reader.warn_skipped();
        r.tasks.get_or_insert(0);
        r.pass_rate_mean = (rated > 0).then(|| sum / rated as f64);
    }
    for (step, path) in &files.pool_decisions {
        let Some(step) = step else { continue };
        let dropped = entry(&mut rows, *step).dropped.get_or_insert_with(BTreeMap::new);
        for d in read_all::<TaskDecision>(path, opts)?
            .into_iter()
            .filter(|d| !d.kept)
        {
            *dropped.entry(d.reason.unwrap_or(d.stage)).or_default() += 1;
        }
    }
    Ok(rows.into_values().collect())
}

fn entry(rows: &mut BTreeMap<u64, PoolStep>, step: u64) -> &mut PoolStep {
    rows.entry(step).or_insert_with(|| PoolStep {
        step,
        ..Default::default()
    })
}

/// The re-filter's reasons that get a column of their own in `pool_steps.csv`; any other
/// reason (a stage other than saturation) is summed into `dropped_other`.
const SATURATION: [&str; 2] = ["saturated_solved", "saturated_failed"];

/// `pool_steps.csv` (header only for a run without `pool/` files).
pub fn pool_steps_csv(rows: &[PoolStep]) -> Result<Vec<u8>, ReportError> {
    let name = "pool_steps.csv";
    let err = csv_err(name);
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "step",
        "pool_tasks",
        "dropped_saturated_solved",
        "dropped_saturated_failed",
        "dropped_other",
        "unrated",
        "never_solved",
        "hard",
        "middle",
        "easy",
        "always_solved",
        "pass_rate_mean",
    ])
    .map_err(&err)?;
    for r in rows {
        let dropped = |f: &dyn Fn(&str) -> bool| {
            r.dropped
                .as_ref()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| f(k))
                        .map(|(_, n)| n)
                        .sum::<u64>()
                        .to_string()
                })
                .unwrap_or_default()
        };
        let b = &r.bands;
        w.write_record([
            r.step.to_string(),
            r.tasks.map(|n| n.to_string()).unwrap_or_default(),
            dropped(&|k| k == SATURATION[0]),
            dropped(&|k| k == SATURATION[1]),
            dropped(&|k| !SATURATION.contains(&k)),
            b.unrated.to_string(),
            b.never_solved.to_string(),
            b.hard.to_string(),
            b.middle.to_string(),
            b.easy.to_string(),
            b.always_solved.to_string(),
            r.pass_rate_mean.map(|v| v.to_string()).unwrap_or_default(),
        ])
        .map_err(&err)?;
    }
    finish_csv(w, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::AtomicWriter;
    use crate::records::Record;

    fn task(id: &str, rate: Option<(u32, u32)>) -> Task {
        let mut t = Task::new(id, "fix it");
        t.pass_rate = rate.map(|(s, n)| PassRate::new(s, n));
        t
    }

    fn decision(id: &str, kept: bool, reason: Option<&str>) -> TaskDecision {
        TaskDecision {
            schema: TaskDecision::SCHEMA.into(),
            task_id: id.into(),
            kept,
            stage: "saturation".into(),
            reason: reason.map(str::to_string),
            evidence: serde_json::Value::Null,
        }
    }

    fn write<R: Record + Sync>(path: &std::path::Path, records: &[R]) {
        let mut w = AtomicWriter::create(path).unwrap();
        w.write_all(records).unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn pool_files_give_size_drops_and_pass_rate_bands_per_step() {
        let dir = tempfile::tempdir().unwrap();
        let pool = dir.path().join("pool");
        std::fs::create_dir_all(&pool).unwrap();
        // Batch 1: one task per band and one without a pass rate; batch 2: the middle ones
        // after the re-filter dropped an all-solved and two all-failed tasks.
        write(
            &pool.join("step-000001.jsonl.zst"),
            &[
                task("unrated", None),
                task("never", Some((0, 4))),
                task("hard", Some((1, 8))),
                task("middle-low", Some((1, 4))),
                task("middle-high", Some((3, 4))),
                task("easy", Some((7, 8))),
                task("always", Some((4, 4))),
            ],
        );
        write(
            &pool.join("step-000002.jsonl.zst"),
            &[
                task("middle-low", Some((2, 4))),
                task("middle-high", Some((2, 4))),
            ],
        );
        write(
            &pool.join("step-000002.decisions.jsonl.zst"),
            &[
                decision("always", false, Some("saturated_solved")),
                decision("never", false, Some("saturated_failed")),
                decision("hard", false, Some("saturated_failed")),
                decision("middle-low", true, None),
            ],
        );
        let files = RunFiles::discover(dir.path(), true).unwrap();
        assert_eq!((files.pool.len(), files.pool_decisions.len()), (2, 1));
        let rows = pool_steps(&files, ReadOptions::default()).unwrap();
        assert_eq!(rows.len(), 2);
        let (one, two) = (&rows[0], &rows[1]);
        assert_eq!((one.step, one.tasks, one.dropped.as_ref()), (1, Some(7), None));
        assert_eq!(
            one.bands,
            Bands {
                unrated: 1,
                never_solved: 1,
                hard: 1,
                middle: 2,
                easy: 1,
                always_solved: 1,
            }
        );
        // Six rated tasks: (0 + 1/8 + 1/4 + 3/4 + 7/8 + 1) / 6.
        assert_eq!(one.pass_rate_mean, Some(3.0 / 6.0));
        assert_eq!((two.step, two.tasks, two.bands.middle), (2, Some(2), 2));
        let dropped = two.dropped.clone().unwrap();
        assert_eq!((dropped["saturated_solved"], dropped["saturated_failed"]), (1, 2));
        let csv = String::from_utf8(pool_steps_csv(&rows).unwrap()).unwrap();
        assert_eq!(
            csv,
            "step,pool_tasks,dropped_saturated_solved,dropped_saturated_failed,dropped_other,\
             unrated,never_solved,hard,middle,easy,always_solved,pass_rate_mean\n\
             1,7,,,,1,1,1,2,1,1,0.5\n\
             2,2,1,2,0,0,0,0,2,0,0,0.5\n"
        );
    }

    #[test]
    fn a_run_without_pool_files_has_no_rows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pool")).unwrap();
        let files = RunFiles::discover(dir.path(), true).unwrap();
        assert!(pool_steps(&files, ReadOptions::default()).unwrap().is_empty());
        let csv = pool_steps_csv(&[]).unwrap();
        assert_eq!(csv.iter().filter(|b| **b == b'\n').count(), 1, "header only");
    }
}
