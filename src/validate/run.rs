//! Finding a run's files and streaming its trajectories: shared by `validate` (run health) and
//! `report`, so both agree on what a run directory contains.
//!
//! Layout (see `man/lego-rl-formats.md`): `trajectories/*.jsonl[.zst]`, `samples/*`,
//! `align-stats/*`, `metrics.jsonl[.zst]`, `validation.jsonl[.zst]`. The step of a trajectory is
//! the number in its file name (`step-000012` → 12); a file without one uses each trajectory's
//! `policy_version`.

use std::path::{Path, PathBuf};

use crate::io::{open_lines, open_records, read_all, IoError, ReadOptions, TornTail};
use crate::records::{known_kind, AlignStats, Record, Sample, StepMetrics, Trajectory, ValidationReport};

/// Errors while finding or reading a run's files.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}: not a run directory (no trajectories/, samples/, metrics or validation file)")]
    NotARun { path: PathBuf },
    #[error("{path}: cannot list directory: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot tell what records it holds: {msg}")]
    Sniff { path: PathBuf, msg: String },
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The record files of one run, each with its step where the file name carries one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFiles {
    /// The run directory, when the files came from one.
    pub root: Option<PathBuf>,
    pub trajectories: Vec<(Option<u64>, PathBuf)>,
    pub samples: Vec<(Option<u64>, PathBuf)>,
    pub align_stats: Vec<(Option<u64>, PathBuf)>,
    pub metrics: Vec<PathBuf>,
    pub validation: Vec<PathBuf>,
    /// Held-out evaluation trajectories (`eval/step-NNNNNN.jsonl.zst`, step = the evaluated
    /// checkpoint's policy version). Reported beside the training rewards; no gate reads them.
    pub eval: Vec<(Option<u64>, PathBuf)>,
    /// `filter-tasks` decisions of the loop's between-step re-filter (`pool/step-NNNNNN.decisions.jsonl.zst`,
    /// step = the batch whose pool it made; `scripts/loop.sh --refilter`). The report counts the drops.
    pub pool_decisions: Vec<(Option<u64>, PathBuf)>,
    /// The task pool each re-filter made (`pool/step-NNNNNN.jsonl.zst`, task records with their
    /// recent `pass_rate`): the report's difficulty band over steps.
    pub pool: Vec<(Option<u64>, PathBuf)>,
}

/// `step-000012.jsonl.zst` → 12: the digits after the last `step-` (or `step_`) in the name.
pub fn step_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let at = name.rfind("step-").or_else(|| name.rfind("step_"))?;
    let digits: String = name[at + 5..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn is_record_file(p: &Path) -> bool {
    let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    n.ends_with(".jsonl") || n.ends_with(".jsonl.zst")
}

fn list(dir: &Path) -> Result<Vec<(Option<u64>, PathBuf)>, RunError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let rd = std::fs::read_dir(dir).map_err(|source| RunError::List {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out: Vec<(Option<u64>, PathBuf)> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_record_file(p))
        .map(|p| (step_of(&p), p))
        .collect();
    out.sort();
    Ok(out)
}

fn one_of(root: &Path, stem: &str) -> Vec<PathBuf> {
    [".jsonl.zst", ".jsonl"]
        .iter()
        .map(|ext| root.join(format!("{stem}{ext}")))
        .filter(|p| p.is_file())
        .collect()
}

impl RunFiles {
    /// Finds the files of a run directory. With `allow_empty`, a directory with none of them is
    /// an empty run (a live report started before rollout); otherwise an error.
    pub fn discover(root: &Path, allow_empty: bool) -> Result<Self, RunError> {
        let (pool_decisions, pool) = list(&root.join("pool"))?.into_iter().partition(|(_, p)| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(".decisions.jsonl"))
        });
        let files = RunFiles {
            root: Some(root.to_path_buf()),
            trajectories: list(&root.join("trajectories"))?,
            samples: list(&root.join("samples"))?,
            align_stats: list(&root.join("align-stats"))?,
            metrics: one_of(root, "metrics"),
            validation: one_of(root, "validation"),
            eval: list(&root.join("eval"))?,
            pool_decisions,
            pool,
        };
        if !allow_empty && files.is_empty() {
            return Err(RunError::NotARun {
                path: root.to_path_buf(),
            });
        }
        Ok(files)
    }

    /// Sorts explicit files by the kind of their first record.
    pub fn from_files(paths: &[PathBuf]) -> Result<Self, RunError> {
        let mut files = RunFiles::default();
        for p in paths {
            let mut lines = open_lines(p, TornTail::Error)?;
            let sniff = |msg: String| RunError::Sniff { path: p.clone(), msg };
            let Some((_, text)) = lines.next_line()? else {
                continue;
            };
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| sniff(format!("record 1: not JSON: {e}")))?;
            let kind = known_kind(&value).map_err(|e| sniff(format!("record 1: {e}")))?;
            let entry = (step_of(p), p.clone());
            match kind {
                k if k == Trajectory::KIND => files.trajectories.push(entry),
                k if k == Sample::KIND => files.samples.push(entry),
                k if k == AlignStats::KIND => files.align_stats.push(entry),
                k if k == StepMetrics::KIND => files.metrics.push(p.clone()),
                k if k == ValidationReport::KIND => files.validation.push(p.clone()),
                other => return Err(sniff(format!("`{other}` records are not part of run health"))),
            }
        }
        Ok(files)
    }

    /// True when no record file was found.
    pub fn is_empty(&self) -> bool {
        self.trajectories.is_empty()
            && self.samples.is_empty()
            && self.align_stats.is_empty()
            && self.metrics.is_empty()
            && self.validation.is_empty()
            && self.eval.is_empty()
    }

    /// Where validate appends its report by default.
    pub fn default_report_path(&self) -> Option<PathBuf> {
        self.root.as_ref().map(|r| {
            self.validation
                .first()
                .cloned()
                .unwrap_or_else(|| r.join("validation.jsonl.zst"))
        })
    }
}

/// Calls `f(step, file, trajectory)` for every trajectory of every trajectory file, streaming.
pub fn for_each_trajectory(
    files: &RunFiles,
    opts: ReadOptions,
    f: impl FnMut(u64, &Path, Trajectory),
) -> Result<(), RunError> {
    for_each_trajectory_in(&files.trajectories, opts, f)
}

/// [`for_each_trajectory`] over any list of trajectory files (e.g. [`RunFiles::eval`]).
pub fn for_each_trajectory_in(
    paths: &[(Option<u64>, PathBuf)],
    opts: ReadOptions,
    mut f: impl FnMut(u64, &Path, Trajectory),
) -> Result<(), RunError> {
    for (step, path) in paths {
        let mut reader = open_records::<Trajectory>(path, opts)?;
        for t in reader.by_ref() {
            let t = t?;
            f(step.unwrap_or(t.policy_version), path, t);
        }
        reader.warn_skipped();
    }
    Ok(())
}

/// Reads every record of several files of one kind, in order, each with its file's step.
pub fn read_files<R: Record>(
    paths: &[(Option<u64>, PathBuf)],
    opts: ReadOptions,
) -> Result<Vec<(Option<u64>, R)>, RunError> {
    let mut out = Vec::new();
    for (step, p) in paths {
        out.extend(read_all::<R>(p, opts)?.into_iter().map(|r| (*step, r)));
    }
    Ok(out)
}

/// Reads every record of several unstepped files of one kind.
pub fn read_plain<R: Record>(paths: &[PathBuf], opts: ReadOptions) -> Result<Vec<R>, RunError> {
    let mut out = Vec::new();
    for p in paths {
        out.extend(read_all::<R>(p, opts)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_from_file_names() {
        assert_eq!(
            step_of(Path::new("run/trajectories/step-000012.jsonl.zst")),
            Some(12)
        );
        assert_eq!(step_of(Path::new("eval_step_3.jsonl")), Some(3));
        assert_eq!(step_of(Path::new("trajectories.jsonl.zst")), None);
    }
}
