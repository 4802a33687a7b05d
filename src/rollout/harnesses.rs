//! Several harnesses in one rollout (`--harness` more than once, `--harness-mix`): which harness
//! runs each trial.
//!
//! The assignment is a pure function of the flags, the task lists and the trial's (task, group,
//! sample), never of timing or of what the output already holds, so a rerun after a crash (even
//! SIGKILL) runs every missing trial on the harness the killed run would have used. Policies:
//!
//! - **`task`** (the default): the task record's `harness` field names the adapter (its `name`);
//!   tasks without the field go by their key `k` (below), harness `k mod H`.
//! - **`task-hash`**: every task on harness `k mod H`, whatever its field says.
//! - **`group`**: every trial of a group on one harness, `(k + group_id) mod H`, so a task's groups
//!   of successive epochs (and extra groups) rotate over the harnesses.
//! - **`sample`**: a group split across harnesses, sample `i` on harness `i mod H`. The GSPO
//!   advantage is still computed within the group, so a mixed group compares the harnesses' trials
//!   of one task against each other: a policy that does better on one harness gets its trials
//!   there pushed up and the other's pushed down.
//!
//! A task's key `k` is a fixed hash of its id (64-bit FNV-1a), not its place in a list: the same
//! task gets the same harness in every invocation, whichever other tasks it is run with
//! (`loop.sh` runs one batch per invocation, `--shard` splits the input, a rerun may find other
//! images). Over many tasks the hash spreads them evenly; over a handful it may not, so name the
//! harness in the task records (`task`) where an exact split matters. With one harness
//! everything runs on it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Forced, RolloutError};
use crate::harness::Harness;
use crate::records::Task;

/// `rollout --harness-mix`: how trials are spread over several harnesses.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HarnessMix {
    /// Per task: the task record's `harness` field, else by a hash of the task id.
    #[default]
    Task,
    /// Per task, by a hash of the task id (the tasks' `harness` fields are ignored).
    TaskHash,
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
            HarnessMix::TaskHash => "task-hash",
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
    /// Task id → the harness its record names, when the policy reads it.
    named: HashMap<String, usize>,
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
        let mut named = HashMap::new();
        for t in tasks.iter().chain(pool) {
            if let (Some(h), HarnessMix::Task, 2..) = (&t.harness, mix, names.len()) {
                let i = names.iter().position(|n| n == h).ok_or_else(|| {
                    RolloutError::Invalid(format!(
                        "task `{}`: field `harness` names `{h}`, which is not among the --harness adapters ({})",
                        t.id,
                        names.join(", ")
                    ))
                })?;
                named.entry(t.id.clone()).or_insert(i);
            }
        }
        Ok(Assignment {
            mix,
            harnesses: names.len().max(1),
            named,
        })
    }

    /// The index (into the `--harness` list) of the harness that runs sample `sample` of group
    /// `group_id` of task `task_id`.
    pub fn harness(&self, task_id: &str, group_id: u64, sample: u32) -> usize {
        let h = self.harnesses as u64;
        if h == 1 {
            return 0;
        }
        let k = task_key(task_id);
        (match self.mix {
            HarnessMix::Task => self.named.get(task_id).map_or(k % h, |&n| n as u64),
            HarnessMix::TaskHash => k % h,
            HarnessMix::Group => (k % h + group_id % h) % h,
            HarnessMix::Sample => u64::from(sample) % h,
        }) as usize
    }

    /// Which forced script sample `sample` gets from its harness's file: its rank among the
    /// group's samples on the same harness (`sample` itself when the group is on one harness),
    /// so each harness of a mixed group cycles through all of its own scripts.
    pub fn script_rank(&self, task_id: &str, group_id: u64, sample: u32) -> u32 {
        let mine = self.harness(task_id, group_id, sample);
        (0..sample)
            .filter(|&k| self.harness(task_id, group_id, k) == mine)
            .count() as u32
    }
}

/// A task's key: 64-bit FNV-1a of its id, fixed across builds and platforms (unlike std's
/// `DefaultHasher`), so the assignment never changes under a run.
pub fn task_key(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
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
        let k = |id: &str| (task_key(id) % 2) as usize;
        // FNV-1a's published test vectors: the key is the standard hash.
        assert_eq!(task_key(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(task_key("a"), 0xaf63_dc4c_8601_ec8c);
        // task: the field where set, else the key mod H.
        let a = by(HarnessMix::Task);
        assert_eq!(
            [a.harness("a", 0, 0), a.harness("b", 0, 0), a.harness("c", 5, 1)],
            [k("a"), 1, 0]
        );
        // task-hash: the key only, whatever the fields say.
        let a = by(HarnessMix::TaskHash);
        assert_eq!(
            [a.harness("a", 0, 1), a.harness("b", 3, 0), a.harness("c", 0, 0)],
            [k("a"), k("b"), k("c")]
        );
        // group: one harness per group, rotating with the group id.
        let a = by(HarnessMix::Group);
        for s in 0..4 {
            assert_eq!(a.harness("a", 0, s), k("a"));
            assert_eq!(a.harness("a", 1, s), 1 - k("a"));
            assert_eq!(a.harness("b", 4, s), k("b"));
        }
        // sample: i mod H within every group.
        let a = by(HarnessMix::Sample);
        assert_eq!(
            (0..4).map(|s| a.harness("b", 7, s)).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        // ... and each harness's samples take its forced scripts in turn: 0, 1, 2, ... on each
        // (by the sample index, harness 0 would only ever get even-numbered scripts).
        assert_eq!(
            (0..6).map(|s| a.script_rank("b", 7, s)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 2, 2]
        );
        let g = by(HarnessMix::Group);
        assert!((0..5).all(|s| g.script_rank("a", 1, s) == s));
        // One harness: everything on it, whatever the fields say.
        let one = Assignment::new(HarnessMix::Task, &n[..1], &ts, &[]).unwrap();
        assert!(ts.iter().all(|t| one.harness(&t.id, 3, 2) == 0));
        // Over many tasks the hash spreads them about evenly.
        let ids: Vec<String> = (0..1000).map(|i| format!("repo__repo-{i}")).collect();
        let on_first = ids.iter().filter(|id| k(id) == 0).count();
        assert!(
            (450..550).contains(&on_first),
            "{on_first} of 1000 on the first harness"
        );
    }

    /// Regression: the harness used to follow the task's place in the invocation's list, so
    /// `loop.sh` (one batch of `--tasks-per-step` tasks per invocation, often one) and `--shard`
    /// put every task on the first harness. A task's harness is now the same whichever tasks it
    /// is run with.
    #[test]
    fn a_task_gets_the_same_harness_whatever_it_is_run_with() {
        let n = names();
        let all = tasks(&["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"]);
        for mix in [HarnessMix::Task, HarnessMix::TaskHash, HarnessMix::Group] {
            let whole = Assignment::new(mix, &n, &all, &[]).unwrap();
            let mut used = BTreeSet::new();
            for (i, t) in all.iter().enumerate() {
                // The task alone (a loop.sh batch of one), and behind the others (a shard or pool).
                let alone = Assignment::new(mix, &n, &all[i..=i], &[]).unwrap();
                let pooled = Assignment::new(mix, &n, &all[..0], &all[i..]).unwrap();
                for g in 0..3 {
                    let h = whole.harness(&t.id, g, 0);
                    assert_eq!(alone.harness(&t.id, g, 0), h, "{mix:?} {}", t.id);
                    assert_eq!(pooled.harness(&t.id, g, 0), h, "{mix:?} {}", t.id);
                    used.insert(h);
                }
            }
            assert_eq!(used.len(), 2, "{mix:?}: one-task batches use both harnesses");
        }
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
            HarnessMix::TaskHash,
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
