//! The reward-collapse gates (`train_reward_drop`, `heldout_reward_drop`): judged on the whole run,
//! not a step, and (train reward) for each harness of a mixed run too. Kept apart from the gate
//! table (`gates.rs`) so that both stay readable.

use super::health::{Health, RewardSum};

/// Steps per window of the train-reward gate: the first window is compared with the latest, so
/// the gate is measured once a run has twice this many steps with graded trajectories.
pub const REWARD_WINDOW: usize = 5;

/// The reward-collapse gates judge the whole run, not a step: how much the mean reward fell
/// from a baseline (the first window of train steps, the first held-out evaluation) to now,
/// taken at the lower end of its 95% interval (normal approximation, rewards independent:
/// `(before - now) - 1.96 * sqrt(var_before + var_now)`). Above 0 means "significantly worse than
/// at the start", which is what a policy collapse looks like while every pipeline gate stays green
/// (examples/learn/README.md, run 8). Comparing with the start, not the best window so far, keeps
/// the test free of the selection a maximum would add. Value and a detail, or None if the run has
/// too little to compare.
pub(super) fn run_level(name: &str, h: &Health) -> Option<(f64, String)> {
    match name {
        "train_reward_drop" => {
            let steps: Vec<(u64, RewardSum)> = h
                .steps
                .iter()
                .map(|(k, s)| (*k, s.rewards))
                .filter(|(_, r)| r.n > 0)
                .collect();
            train_drop(&steps)
        }
        "heldout_reward_drop" => {
            let evals: Vec<(u64, RewardSum)> = h
                .eval
                .iter()
                .map(|(k, r)| (*k, *r))
                .filter(|(_, r)| r.n > 0)
                .collect();
            let (&(s0, a), &(s1, b)) = (evals.first()?, evals.last()?);
            if s0 == s1 {
                return None;
            }
            Some((
                reward_drop(a, b)?,
                format!("eval {s0}: {} -> eval {s1}: {}", show(a), show(b)),
            ))
        }
        _ => None,
    }
}

/// The fall of the mean from `before` to `now` at its 95% lower bound (see [`run_level`]).
fn reward_drop(before: RewardSum, now: RewardSum) -> Option<f64> {
    let d = before.mean()? - now.mean()?;
    Some(d - 1.96 * (before.var_of_mean()? + now.var_of_mean()?).sqrt())
}

fn show(r: RewardSum) -> String {
    format!("{:.3} (n={})", r.mean().unwrap_or(0.0), r.n)
}

/// `train_reward_drop` over steps with graded rewards (the run's, or one harness's): the first
/// [`REWARD_WINDOW`] steps against the latest.
pub(super) fn train_drop(steps: &[(u64, RewardSum)]) -> Option<(f64, String)> {
    if steps.len() < 2 * REWARD_WINDOW {
        return None;
    }
    let sum = |w: &[(u64, RewardSum)]| {
        let mut t = RewardSum::default();
        w.iter().for_each(|(_, r)| t.add(*r));
        t
    };
    let (first, last) = (&steps[..REWARD_WINDOW], &steps[steps.len() - REWARD_WINDOW..]);
    let (a, b) = (sum(first), sum(last));
    Some((
        reward_drop(a, b)?,
        format!(
            "steps {}-{}: {} -> steps {}-{}: {}",
            first[0].0,
            first[REWARD_WINDOW - 1].0,
            show(a),
            last[0].0,
            last[REWARD_WINDOW - 1].0,
            show(b)
        ),
    ))
}
