//! Stages 4 and 5, from rollout output (`Trajectory` records):
//!
//! - **difficulty band** (`--trials FILE`): k trial runs per task by a reference policy; keep a
//!   task solved between `--min-solved` and `--max-solved` times. Infra-failed trials
//!   (`infra_failure`, an `infra:*` termination or no reward) do not count; a task with fewer
//!   than k counted trials is *incomplete* and handled by `--incomplete-trials` (drop, keep or
//!   fail), always with its own funnel reason, never silently. With more than k counted trials
//!   the first k by (policy version, group, sample index) are used.
//! - **online re-filtering** (`--drop-saturated FILE`): recent training trajectories; a task
//!   whose last N groups (by policy version, then group id) were each all-solved (or each
//!   all-failed) has zero reward variance under the current policy and is dropped.
//!
//! Both stages also give each task they saw trials of a [`PassRate`], which filter-tasks writes
//! into the kept task's record (`Task::pass_rate`): the saturation stage's over the same last N
//! groups it judged (the policy's recent behaviour; fewer when the task has fewer), else the
//! difficulty stage's over its k counted trials. `rollout --pool-order curriculum` orders the task
//! pool by it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::json;

use super::Drop;
use crate::io::{open_lines, TornTail};
use crate::records::{check_schema, PassRate, Termination, Trajectory};

/// A trial counts as solved when its reward is at least this (0/1 rewards; Harbor floats).
pub const DEFAULT_SOLVED_THRESHOLD: f64 = 1.0;

/// Errors of loading trial files.
#[derive(Debug, thiserror::Error)]
pub enum TrialsError {
    #[error(transparent)]
    Read(#[from] crate::io::IoError),
    #[error("{path}: record {line}: not a trajectory record: {msg}")]
    BadRecord { path: PathBuf, line: u64, msg: String },
}

/// One trial outcome, as the stages see it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Solved,
    Failed,
    Infra,
}

/// The fields of a `Trajectory` these stages read; the rest (generations, token ids, logs) is
/// skipped by the parser without being decoded, which keeps large rollout files cheap to read.
#[derive(Deserialize)]
struct TrialView {
    schema: String,
    task_id: String,
    group_id: u64,
    sample_index: u32,
    policy_version: u64,
    termination: Termination,
    infra_failure: bool,
    reward: Option<f64>,
}

fn outcome(t: &TrialView, threshold: f64) -> Outcome {
    match t.reward {
        _ if t.infra_failure || t.termination.is_infra() => Outcome::Infra,
        None => Outcome::Infra,
        Some(r) if r >= threshold => Outcome::Solved,
        Some(_) => Outcome::Failed,
    }
}

/// Trials of each task: (policy version, group, sample index, outcome), sorted.
type Trials = HashMap<String, Vec<(u64, u64, u32, Outcome)>>;

fn load(paths: &[PathBuf], threshold: f64) -> Result<Trials, TrialsError> {
    let mut by_task: Trials = HashMap::new();
    for path in paths {
        let mut lines = open_lines(path, TornTail::Error)?;
        while let Some((line, text)) = lines.next_line()? {
            let bad = |msg: String| TrialsError::BadRecord {
                path: path.clone(),
                line,
                msg,
            };
            let t: TrialView = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            check_schema::<Trajectory>(&t.schema).map_err(|e| bad(e.to_string()))?;
            let o = outcome(&t, threshold);
            by_task
                .entry(t.task_id)
                .or_default()
                .push((t.policy_version, t.group_id, t.sample_index, o));
        }
    }
    for v in by_task.values_mut() {
        v.sort_by_key(|a| (a.0, a.1, a.2));
    }
    Ok(by_task)
}

/// What to do with a task that has fewer than k counted trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Incomplete {
    /// Drop it (reason `trials_missing` or `trials_incomplete`).
    Drop,
    /// Keep it (it passes the stage with reason recorded in its decision).
    Keep,
    /// Stop with an error listing such tasks.
    Fail,
}

/// Per-task summary for the difficulty band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandCounts {
    pub counted: u32,
    pub solved: u32,
    pub infra: u32,
}

/// The difficulty stage, with its trials loaded.
#[derive(Debug, Clone)]
pub struct Difficulty {
    pub min_solved: u32,
    pub max_solved: u32,
    pub trials_per_task: u32,
    pub incomplete: Incomplete,
    counts: HashMap<String, BandCounts>,
}

impl Difficulty {
    /// Loads the trial files and summarises them per task.
    pub fn load(
        paths: &[PathBuf],
        min_solved: u32,
        max_solved: u32,
        trials_per_task: u32,
        threshold: f64,
        incomplete: Incomplete,
    ) -> Result<Difficulty, TrialsError> {
        let trials = load(paths, threshold)?;
        let counts = trials
            .into_iter()
            .map(|(task, v)| {
                let infra = v.iter().filter(|t| t.3 == Outcome::Infra).count() as u32;
                let counted: Vec<_> = v
                    .iter()
                    .filter(|t| t.3 != Outcome::Infra)
                    .take(trials_per_task as usize)
                    .collect();
                let solved = counted.iter().filter(|t| t.3 == Outcome::Solved).count() as u32;
                (
                    task,
                    BandCounts {
                        counted: counted.len() as u32,
                        solved,
                        infra,
                    },
                )
            })
            .collect();
        Ok(Difficulty {
            min_solved,
            max_solved,
            trials_per_task,
            incomplete,
            counts,
        })
    }

    /// The pass rate over the task's counted trials (None without any).
    pub fn pass_rate(&self, id: &str) -> Option<PassRate> {
        let c = self.counts.get(id).filter(|c| c.counted > 0)?;
        Some(PassRate::new(c.solved, c.counted))
    }

    /// The stage's verdict: `Ok(evidence)` to pass, `Err` to drop. With
    /// [`Incomplete::Fail`], an incomplete task is a drop whose reason starts with `trials_`;
    /// the pipeline turns those into an error.
    pub fn check(&self, id: &str) -> Result<serde_json::Value, Drop> {
        let k = self.trials_per_task;
        let c = self.counts.get(id).copied().unwrap_or(BandCounts {
            counted: 0,
            solved: 0,
            infra: 0,
        });
        let evidence = json!({"solved": c.solved, "counted": c.counted, "infra": c.infra, "k": k,
                              "band": [self.min_solved, self.max_solved]});
        if c.counted < k {
            let reason = if c.counted == 0 && c.infra == 0 {
                "trials_missing"
            } else {
                "trials_incomplete"
            };
            return match self.incomplete {
                Incomplete::Keep => Ok(json!({"kept_incomplete": reason, "trials": evidence})),
                Incomplete::Drop | Incomplete::Fail => Err(Drop {
                    reason: reason.into(),
                    evidence,
                }),
            };
        }
        if c.solved < self.min_solved {
            let reason = if c.solved == 0 {
                "never_solved"
            } else {
                "below_band"
            };
            return Err(Drop {
                reason: reason.into(),
                evidence,
            });
        }
        if c.solved > self.max_solved {
            let reason = if c.solved == k {
                "always_solved"
            } else {
                "above_band"
            };
            return Err(Drop {
                reason: reason.into(),
                evidence,
            });
        }
        Ok(evidence)
    }
}

/// Per-group (solved, counted) of one task, newest last.
type Groups = Vec<(u32, u32)>;

/// The saturation stage, with its trajectories loaded.
#[derive(Debug, Clone)]
pub struct Saturation {
    pub last_groups: u32,
    groups: HashMap<String, Groups>,
}

impl Saturation {
    /// Loads training trajectories and groups them per task.
    pub fn load(paths: &[PathBuf], last_groups: u32, threshold: f64) -> Result<Saturation, TrialsError> {
        let trials = load(paths, threshold)?;
        let groups = trials
            .into_iter()
            .map(|(task, v)| {
                // (policy version, group) → (solved, counted), ordered oldest first.
                let mut g: BTreeMap<(u64, u64), (u32, u32)> = BTreeMap::new();
                let mut version_of: HashMap<u64, u64> = HashMap::new();
                for t in &v {
                    let ver = version_of.entry(t.1).or_insert(t.0);
                    *ver = (*ver).max(t.0);
                }
                for t in v.iter().filter(|t| t.3 != Outcome::Infra) {
                    let e = g.entry((version_of[&t.1], t.1)).or_default();
                    e.1 += 1;
                    if t.3 == Outcome::Solved {
                        e.0 += 1;
                    }
                }
                (task, g.into_values().collect())
            })
            .collect();
        Ok(Saturation { last_groups, groups })
    }

    /// The pass rate over the task's last N groups (all of them when it has fewer; at least one
    /// group, even with N = 0); None without a counted trial.
    pub fn pass_rate(&self, id: &str) -> Option<PassRate> {
        let groups = self.groups.get(id)?;
        let n = (self.last_groups as usize).max(1).min(groups.len());
        let (solved, trials) = groups[groups.len() - n..]
            .iter()
            .fold((0, 0), |(s, c), g| (s + g.0, c + g.1));
        (trials > 0).then(|| PassRate::new(solved, trials))
    }

    /// Drops a task whose last N groups all had zero reward variance in the same direction.
    pub fn check(&self, id: &str) -> Result<serde_json::Value, Drop> {
        let n = self.last_groups as usize;
        let Some(groups) = self.groups.get(id) else {
            return Ok(json!({"groups": 0}));
        };
        if groups.len() < n || n == 0 {
            return Ok(json!({"groups": groups.len(), "needed": n}));
        }
        let last = &groups[groups.len() - n..];
        let evidence = json!({"last_groups": last.iter().map(|(s, c)| json!({"solved": s, "trials": c})).collect::<Vec<_>>()});
        if last.iter().all(|(s, c)| s == c) {
            return Err(Drop {
                reason: "saturated_solved".into(),
                evidence,
            });
        }
        if last.iter().all(|(s, _)| *s == 0) {
            return Err(Drop {
                reason: "saturated_failed".into(),
                evidence,
            });
        }
        Ok(evidence)
    }

    /// Builds a saturation stage from in-memory groups (tests).
    #[cfg(test)]
    fn from_groups(last_groups: u32, groups: HashMap<String, Groups>) -> Self {
        Saturation { last_groups, groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_needs_every_recent_group_uniform() {
        let mut g = HashMap::new();
        g.insert("solved".to_string(), vec![(1, 4), (4, 4), (4, 4)]);
        g.insert("failed".to_string(), vec![(0, 4), (0, 3)]);
        g.insert("mixed".to_string(), vec![(4, 4), (0, 4)]);
        g.insert("varied".to_string(), vec![(4, 4), (2, 4)]);
        g.insert("short".to_string(), vec![(4, 4)]);
        let s = Saturation::from_groups(2, g);
        let r = |id: &str| s.check(id).err().map(|d| d.reason).unwrap_or_default();
        assert_eq!(r("solved"), "saturated_solved");
        assert_eq!(r("failed"), "saturated_failed");
        assert_eq!(r("mixed"), "");
        assert_eq!(r("varied"), "");
        assert_eq!(r("short"), "");
        assert_eq!(r("absent"), "");
        // The pass rate covers the same last 2 groups (fewer when there are fewer).
        let rate = |id: &str| s.pass_rate(id).map(|p| (p.solved, p.trials));
        assert_eq!(rate("solved"), Some((8, 8)));
        assert_eq!(rate("varied"), Some((6, 8)));
        assert_eq!(rate("short"), Some((4, 4)));
        assert_eq!(rate("absent"), None);
        assert_eq!(s.pass_rate("varied").unwrap().rate, 0.75);
    }
}
