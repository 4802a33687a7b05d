//! Running sums of graded rewards, shared by the run's health (`health.rs`), its per-harness split
//! (`by_harness.rs`) and the gates: mean and the variance of the mean without keeping the rewards.

use serde::Serialize;

/// Graded rewards of a set of trajectories: count, sum and sum of squares.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct RewardSum {
    pub n: u64,
    pub sum: f64,
    pub sq_sum: f64,
}

impl RewardSum {
    /// Adds one reward.
    pub fn push(&mut self, r: f64) {
        self.n += 1;
        self.sum += r;
        self.sq_sum += r * r;
    }
    pub fn add(&mut self, other: RewardSum) {
        self.n += other.n;
        self.sum += other.sum;
        self.sq_sum += other.sq_sum;
    }
    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
    /// Variance of the mean (the rewards' sample variance over n; rewards taken as independent).
    pub fn var_of_mean(&self) -> Option<f64> {
        let m = self.mean()?;
        let var = (self.sq_sum / self.n as f64 - m * m).max(0.0);
        Some(var / self.n as f64)
    }
}
