//! Several harnesses in one rollout (`--harness` more than once, `--harness-mix`): which harness
//! runs each trial.
//!
//! The assignment is a pure function of the flags, the task lists and the trial's (task, group,
//! sample), never of timing or of what the output already holds, so a rerun after a crash (even
//! SIGKILL) runs every missing trial on the harness the killed run would have used. Policies:
//!
//! - **`task`** (the default): the task record's `harness` field names the adapter (its `name`);
//!   tasks without the field go round robin by position.
//! - **`round-robin`**: task at position `p` runs on harness `p mod H`, whatever its field says.
//! - **`group`**: every trial of a group on one harness, `(p + group_id) mod H`, so a task's groups
//!   of successive epochs (and extra groups) rotate over the harnesses.
//! - **`sample`**: a group split across harnesses, sample `i` on harness `i mod H`. The GSPO
//!   advantage is still computed within the group, so a mixed group compares the harnesses' trials
//!   of one task against each other: a policy that does better on one harness gets its trials
//!   there pushed up and the other's pushed down.
//!
//! Positions count the run's tasks (the shard's, with an image, in input order), then the
//! dynamic-sampling pool's tasks not already among them. With one harness everything runs on it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Forced, RolloutError};
use crate::harness::Harness;
use crate::records::Task;

/// `rollout --harness-mix`: how trials are spread over several harnesses.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HarnessMix {
    /// Per task: the task record's `harness` field, else round robin over tasks.
    #[default]
    Task,
    /// Per task, round robin by position (the tasks' `harness` fields are ignored).
    RoundRobin,
    /// Per group: every trial of a group on one harness, rotating with the group id.
    Group,
    /// Per sample: sample i of every group on harness i mod H.
    Sample,
}

impl HarnessMix {
    /// The flag's value as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            HarnessMix::Task => "task",
            HarnessMix::RoundRobin => "round-robin",
            HarnessMix::Group => "group",
            HarnessMix::Sample => "sample",
        }
    }
}

/// Which harness runs each trial of a run.
#[derive(Debug, Clone)]
pub struct Assignment {
    mix: HarnessMix,
    harnesses: usize,
    /// Task id → (position, harness named by its record when the policy reads it).
    tasks: HashMap<String, (usize, Option<usize>)>,
}

impl Assignment {
    /// The assignment over `names` (the adapters' names, in `--harness` order) for the run's
    /// `tasks`, then the pool's. A task whose `harness` field names none of them is an error under
    /// `task` with several harnesses (it names the task).
    pub fn new(
        mix: HarnessMix,
        names: &[String],
        tasks: &[Task],
        pool: &[Task],
    ) -> Result<Self, RolloutError> {
        let mut map: HashMap<String, (usize, Option<usize>)> = HashMap::new();
        for t in tasks.iter().chain(pool) {
            if map.contains_key(&t.id) {
                continue;
            }
            let named = match (&t.harness, mix, names.len()) {
                (Some(h), HarnessMix::Task, 2..) => Some(names.iter().position(|n| n == h).ok_or_else(|| {
                    RolloutError::Invalid(format!(
                        "task `{}`: field `harness` names `{h}`, which is not among the --harness adapters ({})",
                        t.id,
                        names.join(", ")
                    ))
                })?),
                _ => None,
            };
            let position = map.len();
            map.insert(t.id.clone(), (position, named));
        }
        Ok(Assignment {
            mix,
            harnesses: names.len().max(1),
            tasks: map,
        })
    }

    /// The index (into the `--harness` list) of the harness that runs sample `sample` of group
    /// `group_id` of task `task_id`.
    pub fn harness(&self, task_id: &str, group_id: u64, sample: u32) -> usize {
        let h = self.harnesses as u64;
        if h == 1 {
            return 0;
        }
        let (position, named) = self.tasks.get(task_id).copied().unwrap_or((0, None));
        let p = position as u64;
        (match self.mix {
            HarnessMix::Task => named.map_or(p % h, |n| n as u64),
            HarnessMix::RoundRobin => p % h,
            HarnessMix::Group => (p + group_id % h) % h,
            HarnessMix::Sample => u64::from(sample) % h,
        }) as usize
    }
}

/// Loads the `--harness` adapters (with `max_turns` overriding theirs), refusing one that cannot
/// run here and two that share a name (per-harness figures are keyed by it).
pub fn load(paths: &[PathBuf], max_turns: Option<u32>) -> Result<Vec<Harness>, RolloutError> {
    if paths.is_empty() {
        return Err(RolloutError::Invalid("at least one --harness is needed".into()));
    }
    let mut out: Vec<Harness> = Vec::with_capacity(paths.len());
    for path in paths {
        let mut harness = Harness::load(path)?;
        if let Some(m) = max_turns {
            harness.config.max_turns = m;
        }
        if let Some(why) = &harness.config.runtime.unavailable {
            return Err(RolloutError::Invalid(format!(
                "{}: harness `{}` cannot run here: {why}",
                path.display(),
                harness.config.name
            )));
        }
        if let Some(other) = out.iter().find(|h| h.config.name == harness.config.name) {
            return Err(RolloutError::Invalid(format!(
                "{} and {} are both harness `{}`: give each harness once",
                other.path.display(),
                path.display(),
                harness.config.name
            )));
        }
        out.push(harness);
    }
    Ok(out)
}

/// The runtime volume of each harness (built once, then cached), as the bind its sandboxes mount.
pub(super) async fn runtime_binds(
    engine: &crate::sandbox::Engine,
    harnesses: &[Harness],
    base_image: &str,
    cache_dir: &Path,
) -> Result<Vec<String>, RolloutError> {
    let mut binds = Vec::with_capacity(harnesses.len());
    for h in harnesses {
        binds.push(
            crate::sandbox::runtime::ensure_runtime(engine, h, base_image, cache_dir)
                .await?
                .bind(),
        );
    }
    Ok(binds)
}

/// The forced scripts of each harness: none, one file for all of them, or one per `--harness`
/// in the same order (harnesses speak different tool formats, so a mixed run scripts each).
pub fn load_forced(paths: &[PathBuf], harnesses: usize) -> Result<Vec<Forced>, RolloutError> {
    let load = |p: &Path| Forced::load(p).map_err(RolloutError::from);
    match paths.len() {
        0 => Ok(vec![Forced::default(); harnesses]),
        1 => Ok(vec![load(&paths[0])?; harnesses]),
        n if n == harnesses => paths.iter().map(|p| load(p)).collect(),
        n => Err(RolloutError::Invalid(format!(
            "--forced is given {n} times for {harnesses} --harness adapters: give it once (for all) or once per harness, in the same order"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::rollout::plan::{plan, Key};

    fn tasks(ids: &[&str]) -> Vec<Task> {
        ids.iter().map(|id| Task::new(*id, "x")).collect()
    }

    fn names() -> Vec<String> {
        vec!["mini-swe-agent".into(), "openhands-sdk".into()]
    }

    /// (task, group, sample) → harness over every trial of a plan.
    fn assigned(a: &Assignment, p: &[crate::rollout::GroupPlan]) -> Vec<(String, u64, u32, usize)> {
        p.iter()
            .flat_map(|g| {
                g.samples.iter().map(|&s| {
                    (
                        g.task.id.clone(),
                        g.group_id,
                        s,
                        a.harness(&g.task.id, g.group_id, s),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn each_policy_spreads_trials_as_documented() {
        let mut ts = tasks(&["a", "b", "c"]);
        ts[2].harness = Some("mini-swe-agent".into());
        ts[1].harness = Some("openhands-sdk".into());
        let n = names();
        let by = |mix| Assignment::new(mix, &n, &ts, &[]).unwrap();
        // task: the field where set, else position mod H.
        let a = by(HarnessMix::Task);
        assert_eq!(
            [a.harness("a", 0, 0), a.harness("b", 0, 0), a.harness("c", 5, 1)],
            [0, 1, 0]
        );
        // round-robin: position only.
        let a = by(HarnessMix::RoundRobin);
        assert_eq!(
            [a.harness("a", 0, 1), a.harness("b", 3, 0), a.harness("c", 0, 0)],
            [0, 1, 0]
        );
        // group: one harness per group, rotating with the group id.
        let a = by(HarnessMix::Group);
        for s in 0..4 {
            assert_eq!(a.harness("a", 0, s), 0);
            assert_eq!(a.harness("a", 1, s), 1);
            assert_eq!(a.harness("b", 0, s), 1);
        }
        // sample: i mod H within every group.
        let a = by(HarnessMix::Sample);
        assert_eq!(
            (0..4).map(|s| a.harness("b", 7, s)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        // One harness: everything on it, whatever the fields say.
        let one = Assignment::new(HarnessMix::Task, &n[..1], &ts, &[]).unwrap();
        assert!(ts.iter().all(|t| one.harness(&t.id, 3, 2) == 0));
        // Pool tasks continue the positions; a task in both keeps its first position.
        let a = Assignment::new(HarnessMix::RoundRobin, &n, &ts[..1], &tasks(&["a", "p"])).unwrap();
        assert_eq!([a.harness("a", 0, 0), a.harness("p", 0, 0)], [0, 1]);
    }

    #[test]
    fn a_task_naming_an_unknown_harness_is_refused_by_name() {
        let mut ts = tasks(&["a", "b"]);
        ts[1].harness = Some("claude-code".into());
        let e = Assignment::new(HarnessMix::Task, &names(), &ts, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("task `b`") && e.contains("`harness`") && e.contains("claude-code"),
            "{e}"
        );
        // The field is only read by the `task` policy.
        assert!(Assignment::new(HarnessMix::Sample, &names(), &ts, &[]).is_ok());
    }

    /// A resumed run (some trials already in the output) gives every missing trial the harness the
    /// full run gives it, for every policy.
    #[test]
    fn a_resumed_run_assigns_the_missing_trials_as_the_full_run_does() {
        let ts = tasks(&["a", "b", "c"]);
        let n = names();
        for mix in [
            HarnessMix::Task,
            HarnessMix::RoundRobin,
            HarnessMix::Group,
            HarnessMix::Sample,
        ] {
            let full = assigned(
                &Assignment::new(mix, &n, &ts, &[]).unwrap(),
                &plan(&ts, 2, 10, 3, &BTreeSet::new()),
            );
            // Killed after some trials: they are in the output; the rerun plans the rest.
            let done: BTreeSet<Key> = full
                .iter()
                .step_by(2)
                .map(|(t, g, s, _)| (t.clone(), *g, *s))
                .collect();
            let rest = assigned(
                &Assignment::new(mix, &n, &ts, &[]).unwrap(),
                &plan(&ts, 2, 10, 3, &done),
            );
            assert_eq!(rest.len(), full.len() - done.len(), "{mix:?}");
            for r in &rest {
                assert!(full.contains(r), "{mix:?}: {r:?} differs from the full run");
            }
            let used: BTreeSet<usize> = full.iter().map(|r| r.3).collect();
            assert_eq!(used.len(), 2, "{mix:?} uses both harnesses");
        }
    }

    #[test]
    fn forced_scripts_are_one_for_all_or_one_per_harness() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        std::fs::write(&p, r#"{"schema": "lego-rl/forced/v1", "tasks": {"a": [["x"]]}}"#).unwrap();
        assert_eq!(load_forced(&[], 2).unwrap().len(), 2);
        let all = load_forced(std::slice::from_ref(&p), 2).unwrap();
        assert_eq!(
            (all[0].script("a", 0), all[1].script("a", 0)),
            (&["x".to_string()][..], &["x".to_string()][..])
        );
        assert_eq!(load_forced(&[p.clone(), p.clone()], 2).unwrap().len(), 2);
        let e = load_forced(&[p.clone(), p.clone()], 3).unwrap_err().to_string();
        assert!(e.contains("--forced is given 2 times for 3"), "{e}");
    }
}
