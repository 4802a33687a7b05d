//! What a rollout run has to do: the shard's tasks, one group per task and epoch, minus the
//! (task, group, sample) keys already in the output.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::RolloutError;
use crate::io::{read_all, ReadOptions};
use crate::records::{ImageRecord, Task, Trajectory};

/// `--shard i/n`: this process takes the tasks whose 0-based position in the input is `i` mod `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

impl FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a shard `i/n` with 0 <= i < n (e.g. 0/4)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The tasks of this shard, in input order (deterministic: the same input and shard always
    /// give the same tasks, and the shards of `n` partition the input).
    pub fn select<T: Clone>(&self, tasks: &[T]) -> Vec<T> {
        tasks
            .iter()
            .enumerate()
            .filter(|(k, _)| k % self.count == self.index)
            .map(|(_, t)| t.clone())
            .collect()
    }
}

/// A trajectory's identity within a run.
pub type Key = (String, u64, u32);

/// One group to run: a task, its group id, and the samples still missing from the output.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPlan {
    pub task: Task,
    pub group_id: u64,
    pub samples: Vec<u32>,
}

/// Groups in run order (epoch-major, then input order); group ids are `first_group + epoch`.
/// Groups whose every sample is already in `done` are left out.
pub fn plan(
    tasks: &[Task],
    epochs: u64,
    first_group: u64,
    group_size: u32,
    done: &BTreeSet<Key>,
) -> Vec<GroupPlan> {
    let mut out = Vec::new();
    for epoch in 0..epochs {
        let group_id = first_group + epoch;
        for task in tasks {
            let samples: Vec<u32> = (0..group_size)
                .filter(|s| !done.contains(&(task.id.clone(), group_id, *s)))
                .collect();
            if !samples.is_empty() {
                out.push(GroupPlan {
                    task: task.clone(),
                    group_id,
                    samples,
                });
            }
        }
    }
    out
}

/// Tasks with a usable image, and how many had none.
pub(super) fn usable_tasks(tasks: Vec<Task>, images: &[ImageRecord]) -> (Vec<(Task, String)>, u64) {
    let by_task: HashMap<&str, &ImageRecord> = images
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| (r.task_id.as_str(), r))
        .collect();
    let mut missing = 0;
    let mut out = Vec::new();
    for t in tasks {
        match by_task.get(t.id.as_str()) {
            Some(r) => {
                let image = r.image.clone();
                out.push((t, image));
            }
            None => {
                tracing::warn!("task {}: no usable image in the manifest; skipped", t.id);
                missing += 1;
            }
        }
    }
    (out, missing)
}

/// The trajectories already in `output` (after the append writer cut any torn frame).
pub(super) fn existing(output: &Path) -> Result<Vec<Trajectory>, RolloutError> {
    if !output.exists() {
        return Ok(Vec::new());
    }
    // Strict: a record that does not parse must stop the run, not be silently run again.
    let opts = ReadOptions {
        strict: true,
        ..Default::default()
    };
    Ok(read_all(output, opts)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_input() {
        let items: Vec<u32> = (0..10).collect();
        let mut all = Vec::new();
        for i in 0..3 {
            let s: Shard = format!("{i}/3").parse().unwrap();
            all.extend(s.select(&items));
        }
        all.sort();
        assert_eq!(all, items);
        assert_eq!("1/3".parse::<Shard>().unwrap().select(&items), vec![1, 4, 7]);
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn plan_skips_done_keys() {
        let t = Task::new("a", "x");
        let done: BTreeSet<Key> = [("a".to_string(), 0, 0), ("a".to_string(), 0, 2)].into();
        let p = plan(std::slice::from_ref(&t), 2, 0, 3, &done);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].group_id, p[0].samples.clone()), (0, vec![1]));
        assert_eq!((p[1].group_id, p[1].samples.clone()), (1, vec![0, 1, 2]));
        let all: BTreeSet<Key> = (0..3).map(|s| ("a".to_string(), 5, s)).collect();
        assert!(plan(&[t], 1, 5, 3, &all).is_empty());
    }
}
