//! Dynamic sampling (`rollout --min-informative-groups N`): after the planned groups, keep
//! drawing groups from the task pool until the output holds N informative groups (reward variance
//! > 0 among the graded, non-infra trials) or `--max-extra-groups` extra groups are spent.
//!
//! - **Extra groups are deterministic**: extra group `k` is pool task `k mod P` with group id
//!   `first_group + epochs + k / P` (further epochs over the pool), so the same flags always name
//!   the same extra groups, and their ids never meet a planned group's.
//! - **Exactly N**: an extra group starts only while the informative groups written plus the groups
//!   in flight are fewer than N, so the extras never overshoot N (the planned groups always run and
//!   may hold more).
//! - **Resumable**: the state is read back from the output: the extra groups already there are
//!   spent, the groups there count as informative or not by their rewards, and the extra groups
//!   not there (in flight when a run was killed) are run in index order. No group runs twice and
//!   none is lost.
//! - **Marked**: every group this run writes gets [`DynamicSampling`]; align skips the
//!   uninformative ones.
//! - **Curriculum** (`--pool-order curriculum`): the pool is first sorted by how likely a group of
//!   the task is to be informative under the current policy, from the task's recent pass rate
//!   (`Task::pass_rate`, which `filter-tasks` writes from the recent trajectories): by p(1 - p)
//!   descending, ties by task id, so the tasks in the middle of the difficulty band come first.
//!   p is smoothed, (solved + 1) / (trials + 2) (Laplace's rule): a task without a pass rate
//!   counts as p = 0.5, a middle-band task until shown otherwise, and 0 of 2 ranks above 0 of 16,
//!   since two failures say less about the task than sixteen. The sort is a pure function of the
//!   pool file, so "extra group k → task" stays one, and resume keeps running no group twice.
//!   Why an order and not random weighted draws: a draw would have to be seeded and replayed to
//!   stay resumable, and with a budget below the pool's size (the usual case) the order already
//!   decides which tasks run; a full round still visits every task once before any repeats, which
//!   keeps the batch diverse (repeating the single best task would be the greedy optimum and a
//!   poor curriculum). Saturated tasks are dropped from the pool by the loop's re-filter anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::path::Path;

use super::plan::{usable_tasks, GroupPlan, Shard};
use super::RolloutError;
use crate::io::{read_all, ReadOptions};
use crate::records::{DynamicSampling, ImageRecord, Task, Trajectory};

/// The pool of `--task-pool FILE`: the shard's tasks with a usable image (their images are added
/// to `image_of`); the others are skipped with a warning.
pub(super) fn load_pool(
    path: &Path,
    shard: Shard,
    images: &[ImageRecord],
    opts: ReadOptions,
    image_of: &mut HashMap<String, String>,
) -> Result<Vec<Task>, RolloutError> {
    let all: Vec<Task> = read_all(path, opts)?;
    let (usable, missing) = usable_tasks(shard.select(&all), images);
    if missing > 0 {
        tracing::warn!(
            "{}: {missing} pool tasks without a usable image skipped",
            path.display()
        );
    }
    for (t, i) in &usable {
        image_of.insert(t.id.clone(), i.clone());
    }
    Ok(usable.into_iter().map(|(t, _)| t).collect())
}

/// The order extra groups take the pool's tasks in (`rollout --pool-order`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolOrder {
    /// The pool file's order.
    #[default]
    AsIs,
    /// Middle of the difficulty band first: by p(1 - p) of the smoothed recent pass rate.
    Curriculum,
}

/// The flags of dynamic sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicConfig {
    /// Informative groups the output should hold.
    pub min_informative_groups: u64,
    /// Extra groups (beyond the planned ones) the run may spend.
    pub max_extra_groups: u64,
    /// The order of the pool's tasks.
    pub pool_order: PoolOrder,
}

/// How likely a group of `t` is to have reward variance, as far as the curriculum cares: p(1 - p)
/// of its smoothed pass rate (see the module docs).
pub fn middle_band_weight(t: &Task) -> f64 {
    let (solved, trials) = t.pass_rate.map_or((0, 0), |r| (r.solved, r.trials.max(r.solved)));
    let p = (f64::from(solved) + 1.0) / (f64::from(trials) + 2.0);
    p * (1.0 - p)
}

/// Sorts `pool` for `order` (stable for [`PoolOrder::AsIs`]: unchanged).
pub fn order_pool(pool: &mut [Task], order: PoolOrder) {
    if order == PoolOrder::Curriculum {
        pool.sort_by(|a, b| {
            middle_band_weight(b)
                .total_cmp(&middle_band_weight(a))
                .then_with(|| a.id.cmp(&b.id))
        });
    }
}

/// Figures of a dynamic-sampling run (over the whole output: earlier runs' groups included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DynamicSummary {
    /// Groups in the output (planned and extra).
    pub sampled_groups: u64,
    pub informative_groups: u64,
    pub extra_groups: u64,
    /// Tasks in the pool.
    pub pool: u64,
    pub min_informative_groups: u64,
    pub max_extra_groups: u64,
}

/// Decides which extra groups to run and marks the groups written.
#[derive(Debug)]
pub struct Oversampler {
    cfg: DynamicConfig,
    pool: Vec<Task>,
    index_of: HashMap<String, u64>,
    /// Group id of the first round of extra groups.
    base: u64,
    /// Extra group indices already in the output or started by this run.
    spent: BTreeSet<u64>,
    /// Next extra index to consider.
    next: u64,
    informative: u64,
    sampled: u64,
    group_size: u32,
}

impl Oversampler {
    /// An oversampler over `pool` (tasks with duplicate ids keep the first), whose extra groups
    /// start at group id `base`, resuming from the trajectories already in the output.
    pub fn new(
        cfg: DynamicConfig,
        pool: Vec<Task>,
        base: u64,
        group_size: u32,
        existing: &[Trajectory],
    ) -> Self {
        let mut seen = BTreeSet::new();
        let mut uniq: Vec<Task> = pool.into_iter().filter(|t| seen.insert(t.id.clone())).collect();
        order_pool(&mut uniq, cfg.pool_order);
        let index_of: HashMap<String, u64> = uniq
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.clone(), i as u64))
            .collect();
        let mut s = Oversampler {
            cfg,
            pool: uniq,
            index_of,
            base,
            spent: BTreeSet::new(),
            next: 0,
            informative: 0,
            sampled: 0,
            group_size,
        };
        let mut groups: BTreeMap<(&str, u64), Vec<&Trajectory>> = BTreeMap::new();
        for t in existing {
            groups.entry((&t.task_id, t.group_id)).or_default().push(t);
        }
        for ((task, group), members) in groups {
            s.sampled += 1;
            s.informative += u64::from(DynamicSampling::varies(members.iter().copied()));
            if let Some(k) = s.extra_index(task, group) {
                s.spent.insert(k);
            }
        }
        s
    }

    /// The extra index of group (task, group id), if it is an extra group of this pool.
    fn extra_index(&self, task: &str, group_id: u64) -> Option<u64> {
        let round = group_id.checked_sub(self.base)?;
        let idx = self.index_of.get(task)?;
        Some(round * self.pool.len() as u64 + idx)
    }

    /// Whether another extra group may start now, with `in_flight` groups running.
    pub fn wants_more(&self, in_flight: usize) -> bool {
        let (in_flight, spent) = (in_flight as u64, self.spent.len() as u64);
        !self.pool.is_empty()
            && self.informative + in_flight < self.cfg.min_informative_groups
            && spent < self.cfg.max_extra_groups
    }

    /// The next extra group to run, if one may start now (see [`Self::wants_more`]).
    pub fn next_group(&mut self, in_flight: usize) -> Option<GroupPlan> {
        if !self.wants_more(in_flight) {
            return None;
        }
        while self.spent.contains(&self.next) {
            self.next += 1;
        }
        let k = self.next;
        self.spent.insert(k);
        let p = self.pool.len() as u64;
        Some(GroupPlan {
            task: self.pool[(k % p) as usize].clone(),
            group_id: self.base + k / p,
            samples: (0..self.group_size).collect(),
        })
    }

    /// Marks a finished group's trajectories and counts it.
    pub fn mark(&mut self, group: &mut [Trajectory]) {
        let Some(first) = group.first() else {
            return;
        };
        let mark = DynamicSampling {
            informative: DynamicSampling::varies(group.iter()),
            extra_group: self.extra_index(&first.task_id, first.group_id),
            pool: self.pool.len() as u64,
            min_informative_groups: Some(self.cfg.min_informative_groups),
            max_extra_groups: Some(self.cfg.max_extra_groups),
        };
        self.sampled += 1;
        self.informative += u64::from(mark.informative);
        for t in group {
            t.dynamic_sampling = Some(mark);
        }
    }

    /// The run's figures so far.
    pub fn summary(&self) -> DynamicSummary {
        DynamicSummary {
            sampled_groups: self.sampled,
            informative_groups: self.informative,
            extra_groups: self.spent.len() as u64,
            pool: self.pool.len() as u64,
            min_informative_groups: self.cfg.min_informative_groups,
            max_extra_groups: self.cfg.max_extra_groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traj(task: &str, group: u64, sample: u32, reward: f64) -> Trajectory {
        Trajectory {
            reward: Some(reward),
            ..Trajectory::new(task, group, sample, "h", "b", Vec::new())
        }
    }

    fn cfg(n: u64, m: u64) -> DynamicConfig {
        DynamicConfig {
            min_informative_groups: n,
            max_extra_groups: m,
            pool_order: PoolOrder::AsIs,
        }
    }

    fn rated(id: &str, rate: Option<(u32, u32)>) -> Task {
        Task {
            pass_rate: rate.map(|(s, n)| crate::records::PassRate::new(s, n)),
            ..Task::new(id, "x")
        }
    }

    #[test]
    fn the_curriculum_puts_the_middle_band_first_and_unknown_tasks_with_it() {
        let pool = vec![
            rated("always", Some((8, 8))),
            rated("never-of-16", Some((0, 16))),
            rated("half", Some((4, 8))),
            rated("unknown", None),
            rated("never-of-2", Some((0, 2))),
            rated("mostly", Some((6, 8))),
            rated("a-half", Some((1, 2))),
        ];
        let mut sorted = pool.clone();
        order_pool(&mut sorted, PoolOrder::Curriculum);
        let ids: Vec<&str> = sorted.iter().map(|t| t.id.as_str()).collect();
        // p = 0.5 for half, a-half and unknown (ties by id); then 7/10, 1/4, 9/10 and 1/18 away.
        assert_eq!(
            ids,
            [
                "a-half",
                "half",
                "unknown",
                "mostly",
                "never-of-2",
                "always",
                "never-of-16"
            ]
        );
        let mut same = pool.clone();
        order_pool(&mut same, PoolOrder::AsIs);
        assert_eq!(same, pool);
        // Extra groups follow the order, in rounds; the mapping is the same on a rerun.
        let c = DynamicConfig {
            pool_order: PoolOrder::Curriculum,
            ..cfg(10, 10)
        };
        let mut s = Oversampler::new(c, pool.clone(), 3, 2, &[]);
        let first: Vec<String> = (0..8).map(|_| s.next_group(0).unwrap().task.id).collect();
        assert_eq!(first[..3], ["a-half", "half", "unknown"]);
        assert_eq!(first[7], "a-half", "round two");
        let done = vec![traj("half", 3, 0, 1.0), traj("half", 3, 1, 1.0)];
        let mut again = Oversampler::new(c, pool, 3, 2, &done);
        assert_eq!(again.summary().extra_groups, 1, "(half, 3) is extra 1");
        assert_eq!(again.next_group(0).unwrap().task.id, "a-half");
        assert_eq!(again.next_group(0).unwrap().task.id, "unknown");
    }

    #[test]
    fn extras_cycle_the_pool_in_rounds_and_stop_at_n_counting_in_flight() {
        let pool = vec![Task::new("a", "x"), Task::new("b", "y"), Task::new("a", "dup")];
        let mut s = Oversampler::new(cfg(2, 10), pool, 5, 2, &[]);
        let g0 = s.next_group(0).unwrap();
        assert_eq!(
            (g0.task.id.as_str(), g0.group_id, g0.samples),
            ("a", 5, vec![0, 1])
        );
        // One informative in flight and one more needed: a second may start, not a third.
        let g1 = s.next_group(1).unwrap();
        assert_eq!((g1.task.id.as_str(), g1.group_id), ("b", 5));
        assert!(s.next_group(2).is_none());
        let mut a = vec![traj("a", 5, 0, 1.0), traj("a", 5, 1, 0.0)];
        s.mark(&mut a);
        assert_eq!(a[0].dynamic_sampling.unwrap().extra_group, Some(0));
        assert!(a[1].dynamic_sampling.unwrap().informative);
        let mut b = vec![traj("b", 5, 0, 1.0), traj("b", 5, 1, 1.0)];
        s.mark(&mut b);
        assert!(b[0].is_uninformative());
        let g2 = s.next_group(0).unwrap();
        assert_eq!((g2.task.id.as_str(), g2.group_id), ("a", 6), "round two");
        let mut a2 = vec![traj("a", 6, 0, 0.0), traj("a", 6, 1, 1.0)];
        s.mark(&mut a2);
        assert!(s.next_group(0).is_none(), "two informative groups");
        let sum = s.summary();
        assert_eq!(
            (
                sum.sampled_groups,
                sum.informative_groups,
                sum.extra_groups,
                sum.pool
            ),
            (3, 2, 3, 2)
        );
    }

    #[test]
    fn the_budget_stops_extras_and_infra_trials_do_not_count_as_variance() {
        let mut s = Oversampler::new(cfg(5, 1), vec![Task::new("a", "x")], 1, 2, &[]);
        assert!(s.next_group(0).is_some());
        assert!(s.next_group(0).is_none(), "budget of one spent");
        let mut g = vec![traj("a", 1, 0, 1.0), traj("a", 1, 1, 0.0)];
        g[1].infra_failure = true;
        s.mark(&mut g);
        assert!(g[0].is_uninformative(), "the infra trial has weight 0");
    }

    #[test]
    fn resume_counts_the_output_and_runs_only_the_missing_extras() {
        let pool = vec![Task::new("a", "x"), Task::new("b", "y")];
        // Planned group (a, 0) informative; extras 0 (a, 1) and 2 (a, 2) written, extra 1 lost.
        let existing = vec![
            traj("a", 0, 0, 1.0),
            traj("a", 0, 1, 0.0),
            traj("a", 1, 0, 1.0),
            traj("a", 1, 1, 1.0),
            traj("a", 2, 0, 0.0),
            traj("a", 2, 1, 0.0),
        ];
        let mut s = Oversampler::new(cfg(3, 10), pool, 1, 2, &existing);
        let sum = s.summary();
        assert_eq!(
            (sum.sampled_groups, sum.informative_groups, sum.extra_groups),
            (3, 1, 2)
        );
        let g = s.next_group(0).unwrap();
        assert_eq!((g.task.id.as_str(), g.group_id), ("b", 1), "the lost extra 1");
        let g = s.next_group(1).unwrap();
        assert_eq!((g.task.id.as_str(), g.group_id), ("b", 2), "extra 3");
        assert!(s.next_group(2).is_none());
    }
}
