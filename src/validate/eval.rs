//! Held-out evaluation: pass@1 with a 95% interval, unbiased pass@k, per harness and per repo,
//! and the difference between two runs or checkpoints.
//!
//! Statistics (chosen so that several samples per task are handled honestly):
//! - pass@1 is the mean over tasks of `c/n` (c successes of n graded samples of the task).
//! - `ci95` is a percentile bootstrap over tasks (2000 resamples, fixed seed, so reruns agree):
//!   samples of one task are correlated, so tasks, not samples, are resampled.
//! - `wilson95` is the Wilson score interval of pooled successes / samples (exact for one sample
//!   per task, too narrow otherwise); both are reported.
//! - pass@k is the unbiased estimator `1 - C(n-c, k) / C(n, k)` (Chen et al. 2021) averaged over
//!   tasks with `n >= k`.
//! - A comparison bootstraps the paired per-task difference over tasks both runs scored.
//!
//! Infra failures and ungraded trials (reward null) are excluded and counted. A reward counts as
//! a pass when it is ≥ 0.5 (rewards are 0/1; Harbor floats are thresholded).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::records::Trajectory;

const BOOTSTRAP: usize = 2000;
const Z95: f64 = 1.959_963_984_540_054;

/// Successes and graded samples per task.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Outcomes {
    pub tasks: BTreeMap<String, (u64, u64)>,
    pub excluded: u64,
}

impl Outcomes {
    /// Adds one trajectory.
    pub fn add(&mut self, t: &Trajectory) {
        match t.reward {
            Some(r) if !t.infra_failure => {
                let e = self.tasks.entry(t.task_id.clone()).or_default();
                e.0 += u64::from(r >= 0.5);
                e.1 += 1;
            }
            _ => self.excluded += 1,
        }
    }
}

/// One score line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Score {
    pub tasks: u64,
    pub samples: u64,
    pub excluded: u64,
    pub pass_at_1: f64,
    pub ci95: [f64; 2],
    pub wilson95: [f64; 2],
    /// k → pass@k (only k ≤ the largest sample count of a task).
    pub pass_at_k: BTreeMap<u64, f64>,
}

/// A held-out evaluation: overall, per harness, per repo.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Eval {
    pub overall: Score,
    pub per_harness: BTreeMap<String, Score>,
    pub per_repo: BTreeMap<String, Score>,
}

/// Collects trajectories by overall, harness and repo.
#[derive(Debug, Default)]
pub struct EvalBuilder {
    pub overall: Outcomes,
    pub per_harness: BTreeMap<String, Outcomes>,
    pub per_repo: BTreeMap<String, Outcomes>,
}

impl EvalBuilder {
    /// Adds one trajectory; `repo` from [`repo_of`].
    pub fn add(&mut self, t: &Trajectory, repo: &str) {
        self.overall.add(t);
        self.per_harness.entry(t.harness.clone()).or_default().add(t);
        self.per_repo.entry(repo.to_string()).or_default().add(t);
    }

    /// The scores.
    pub fn finish(&self) -> Eval {
        Eval {
            overall: score(&self.overall),
            per_harness: self
                .per_harness
                .iter()
                .map(|(k, o)| (k.clone(), score(o)))
                .collect(),
            per_repo: self.per_repo.iter().map(|(k, o)| (k.clone(), score(o))).collect(),
        }
    }
}

/// The repository of a trajectory's task: `metadata.repo`, else the SWE-bench id convention
/// (`owner__name-1234` → `owner/name`), else `unknown`.
pub fn repo_of(t: &Trajectory) -> String {
    if let Some(r) = t.metadata.get("repo").and_then(|v| v.as_str()) {
        return r.to_string();
    }
    if let Some((owner, rest)) = t.task_id.split_once("__") {
        let name = match rest.rsplit_once('-') {
            Some((n, num)) if num.chars().all(|c| c.is_ascii_digit()) => n,
            _ => rest,
        };
        return format!("{owner}/{name}");
    }
    "unknown".into()
}

/// splitmix64: a tiny fixed generator so bootstrap intervals do not change between releases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Percentile-bootstrap 95% interval of the mean of `values`.
pub fn bootstrap_mean_ci(values: &[f64]) -> [f64; 2] {
    if values.is_empty() {
        return [f64::NAN, f64::NAN];
    }
    let mut rng = Rng(0);
    let mut means: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| {
            (0..values.len())
                .map(|_| values[rng.below(values.len())])
                .sum::<f64>()
                / values.len() as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    [percentile(&means, 0.025), percentile(&means, 0.975)]
}

/// Wilson score 95% interval for `c` successes of `n`.
pub fn wilson(c: u64, n: u64) -> [f64; 2] {
    if n == 0 {
        return [f64::NAN, f64::NAN];
    }
    let (n, p) = (n as f64, c as f64 / n as f64);
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z95 * ((p * (1.0 - p) / n) + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    [(centre - half).max(0.0), (centre + half).min(1.0)]
}

/// Unbiased pass@k for one task with `c` successes of `n` samples (`n >= k`).
pub fn pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    if n - c < k {
        return 1.0;
    }
    // 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// Scores one set of outcomes.
pub fn score(o: &Outcomes) -> Score {
    let rates: Vec<f64> = o.tasks.values().map(|(c, n)| *c as f64 / *n as f64).collect();
    let (c, n): (u64, u64) = o.tasks.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let max_n = o.tasks.values().map(|t| t.1).max().unwrap_or(0);
    let mut pass_at = BTreeMap::new();
    let mut k = 1;
    while k <= max_n {
        let v: Vec<f64> = o
            .tasks
            .values()
            .filter(|t| t.1 >= k)
            .map(|t| pass_at_k(t.1, t.0, k))
            .collect();
        pass_at.insert(k, v.iter().sum::<f64>() / v.len() as f64);
        k *= 2;
    }
    Score {
        tasks: o.tasks.len() as u64,
        samples: n,
        excluded: o.excluded,
        pass_at_1: if rates.is_empty() {
            f64::NAN
        } else {
            rates.iter().sum::<f64>() / rates.len() as f64
        },
        ci95: bootstrap_mean_ci(&rates),
        wilson95: wilson(c, n),
        pass_at_k: pass_at,
    }
}

/// B minus A on the tasks both scored.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    pub common_tasks: u64,
    pub a_pass_at_1: f64,
    pub b_pass_at_1: f64,
    pub difference: f64,
    pub ci95: [f64; 2],
}

/// Compares two runs with a paired bootstrap over their common tasks.
pub fn compare(a: &Outcomes, b: &Outcomes) -> Comparison {
    let mut da = Vec::new();
    let mut db = Vec::new();
    let mut diffs = Vec::new();
    for (task, (ca, na)) in &a.tasks {
        if let Some((cb, nb)) = b.tasks.get(task) {
            let (ra, rb) = (*ca as f64 / *na as f64, *cb as f64 / *nb as f64);
            da.push(ra);
            db.push(rb);
            diffs.push(rb - ra);
        }
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    Comparison {
        common_tasks: diffs.len() as u64,
        a_pass_at_1: mean(&da),
        b_pass_at_1: mean(&db),
        difference: mean(&diffs),
        ci95: bootstrap_mean_ci(&diffs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_combinatorial_formula() {
        // n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 1), 0.0);
        assert_eq!(pass_at_k(4, 3, 2), 1.0);
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn wilson_interval_known_values() {
        // 8/10: Wilson 95% = [0.4902, 0.9433].
        let [lo, hi] = wilson(8, 10);
        assert!(
            (lo - 0.4902).abs() < 1e-4 && (hi - 0.9433).abs() < 1e-4,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0, 10)[0], 0.0);
    }

    #[test]
    fn scores_and_comparison() {
        let mut a = Outcomes::default();
        let mut b = Outcomes::default();
        for i in 0..40 {
            a.tasks.insert(format!("t{i}"), (u64::from(i % 4 == 0), 1));
            b.tasks.insert(format!("t{i}"), (u64::from(i % 2 == 0), 1));
        }
        let s = score(&a);
        assert_eq!(s.pass_at_1, 0.25);
        assert!(
            s.ci95[0] < 0.25 && s.ci95[1] > 0.25 && s.ci95[0] > 0.05,
            "{:?}",
            s.ci95
        );
        let c = compare(&a, &b);
        assert_eq!(c.common_tasks, 40);
        assert!((c.difference - 0.25).abs() < 1e-12);
        assert!(
            c.ci95[0] > 0.0,
            "B is better on every task it differs: {:?}",
            c.ci95
        );
    }
}
