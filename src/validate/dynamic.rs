//! Dynamic sampling's figures per step (`rollout --min-informative-groups`), counted from the
//! `dynamic_sampling` marks of a run's trajectories: groups sampled, informative groups, extra
//! groups spent, the task pool's size, and whether the extra-group budget ran out short of N.
//! Shared by `validate` (its table, the `informative_group_fraction` gate and the budget warning)
//! and `report` (`steps.csv`), so both count the same.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::records::{DynamicSampling, Trajectory};

/// One step's dynamic-sampling figures (only steps with marked trajectories have one).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DynamicStep {
    pub step: u64,
    /// Marked groups (task, group id): planned and extra.
    pub sampled_groups: u64,
    pub informative_groups: u64,
    /// Groups drawn from the pool beyond the planned ones.
    pub extra_groups: u64,
    /// Tasks in the pool (the largest any mark of the step names).
    pub pool: u64,
    /// The rollout's N and budget, when its marks record them.
    pub min_informative_groups: Option<u64>,
    pub max_extra_groups: Option<u64>,
}

impl DynamicStep {
    /// Informative groups over sampled groups.
    pub fn informative_fraction(&self) -> Option<f64> {
        (self.sampled_groups > 0).then(|| self.informative_groups as f64 / self.sampled_groups as f64)
    }

    /// The budget ran out short of N: the step has fewer informative groups than asked for and
    /// every extra group allowed was spent (a rollout that is still running, or stopped by
    /// `--max-trajectories`, is short without having spent its budget, and is not reported).
    pub fn budget_exhausted(&self) -> bool {
        match (self.min_informative_groups, self.max_extra_groups) {
            (Some(n), Some(m)) => self.informative_groups < n && self.extra_groups >= m,
            _ => false,
        }
    }

    /// `step 3: the extra-group budget (8) ran out with 1 of 4 informative groups`, when it did.
    pub fn warning(&self) -> Option<String> {
        self.budget_exhausted().then(|| {
            format!(
                "step {}: the extra-group budget ({}) ran out with {} of {} informative groups \
                 (pool of {} tasks; re-filter the pool, or try rollout --pool-order curriculum)",
                self.step,
                self.max_extra_groups.unwrap_or(0),
                self.informative_groups,
                self.min_informative_groups.unwrap_or(0),
                self.pool
            )
        })
    }
}

/// Collects the marks of a run's trajectories, one per (step, task, group).
#[derive(Debug, Default)]
pub struct DynamicCounter {
    marks: BTreeMap<(u64, String, u64), DynamicSampling>,
}

impl DynamicCounter {
    /// Counts one trajectory of `step` (unmarked ones are ignored).
    pub fn add_trajectory(&mut self, step: u64, t: &Trajectory) {
        if let Some(d) = t.dynamic_sampling {
            self.marks.insert((step, t.task_id.clone(), t.group_id), d);
        }
    }

    /// The figures of every step with a mark, by step.
    pub fn finish(self) -> BTreeMap<u64, DynamicStep> {
        let mut out: BTreeMap<u64, DynamicStep> = BTreeMap::new();
        for ((step, _, _), d) in self.marks {
            let s = out.entry(step).or_insert_with(|| DynamicStep {
                step,
                ..Default::default()
            });
            s.sampled_groups += 1;
            s.informative_groups += u64::from(d.informative);
            s.extra_groups += u64::from(d.extra_group.is_some());
            s.pool = s.pool.max(d.pool);
            s.min_informative_groups = s.min_informative_groups.max(d.min_informative_groups);
            s.max_extra_groups = s.max_extra_groups.max(d.max_extra_groups);
        }
        out
    }
}

/// `validate`'s dynamic-sampling table (printed only for a run with marked trajectories), and the
/// budget warnings under it.
pub fn print(out: &mut impl std::io::Write, steps: &BTreeMap<u64, DynamicStep>) -> std::io::Result<()> {
    if steps.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\n{:>6}  {:>7}  {:>11}  {:>11}  {:>6}  {:>6}",
        "STEP", "SAMPLED", "INFORMATIVE", "EXTRA", "POOL", "WANTED"
    )?;
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for s in steps.values() {
        writeln!(
            out,
            "{:>6}  {:>7}  {:>11}  {:>11}  {:>6}  {:>6}",
            s.step,
            s.sampled_groups,
            s.informative_groups,
            format!("{}/{}", s.extra_groups, opt(s.max_extra_groups)),
            s.pool,
            opt(s.min_informative_groups)
        )?;
    }
    for w in steps.values().filter_map(DynamicStep::warning) {
        writeln!(out, "warning: {w}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(task: &str, group: u64, sample: u32, informative: bool, extra: Option<u64>) -> Trajectory {
        Trajectory {
            dynamic_sampling: Some(DynamicSampling {
                informative,
                extra_group: extra,
                pool: 5,
                min_informative_groups: Some(3),
                max_extra_groups: Some(2),
            }),
            ..Trajectory::new(task, group, sample, "h", "b", Vec::new())
        }
    }

    #[test]
    fn groups_count_once_per_step_and_a_spent_budget_short_of_n_warns() {
        let mut c = DynamicCounter::default();
        for (step, t) in [
            (1, marked("a", 0, 0, true, None)),
            (1, marked("a", 0, 1, true, None)),
            (1, marked("b", 0, 0, false, None)),
            (1, marked("b", 1, 0, false, Some(0))),
            (1, marked("a", 1, 0, true, Some(1))),
            (2, marked("a", 2, 0, true, None)),
            (2, Trajectory::new("u", 2, 0, "h", "b", Vec::new())),
        ] {
            c.add_trajectory(step, &t);
        }
        let steps = c.finish();
        let one = steps[&1];
        assert_eq!(
            (
                one.sampled_groups,
                one.informative_groups,
                one.extra_groups,
                one.pool
            ),
            (4, 2, 2, 5)
        );
        assert_eq!(one.informative_fraction(), Some(0.5));
        assert!(one.budget_exhausted(), "2 of 3 informative, 2 of 2 extra spent");
        assert!(one
            .warning()
            .unwrap()
            .starts_with("step 1: the extra-group budget (2) ran out with 2 of 3 informative groups"));
        let two = steps[&2];
        assert_eq!(
            (two.sampled_groups, two.extra_groups),
            (1, 0),
            "unmarked u not counted"
        );
        assert!(!two.budget_exhausted(), "budget not spent: the run stopped early");
        let mut text = Vec::new();
        print(&mut text, &steps).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("warning: step 1:"), "{text}");
        assert!(!text.contains("warning: step 2"), "{text}");
    }
}
