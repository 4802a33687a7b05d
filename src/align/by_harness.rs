//! align's figures split by harness: a mixed rollout (`rollout --harness` more than once) runs
//! harnesses whose requests align differently (one re-serializes tool calls, another compacts), so
//! a total hides which one drops content. Each trajectory's stats record names its harness, the
//! total record carries the same counts per harness (`AlignStats::by_harness`), and every sample
//! carries its trajectory's harness in `metadata.harness`, where train-step splits its figures.

use serde_json::Value;

use super::add_stats;
use crate::records::{AlignStats, Record, Sample, Trajectory};

/// The sample metadata key naming the harness that ran the sample's trajectory.
pub const HARNESS: &str = "harness";

/// Names `t`'s harness in its stats record and in each of its samples.
pub fn tag(st: &mut AlignStats, samples: &mut [Sample], t: &Trajectory) {
    st.harness = Some(t.harness.clone());
    for s in samples {
        s.metadata
            .insert(HARNESS.into(), Value::String(t.harness.clone()));
    }
}

/// Adds one trajectory's stats to the total's entry for its harness.
pub fn add(total: &mut AlignStats, st: &AlignStats) {
    let key = st.harness.clone().unwrap_or_else(|| "unknown".into());
    let entry = total.by_harness.entry(key).or_insert_with(|| AlignStats {
        schema: AlignStats::SCHEMA.to_string(),
        ..Default::default()
    });
    add_stats(entry, st);
}

/// The harness `align` recorded in a sample (None for samples aligned before it did).
pub fn of_sample(s: &Sample) -> Option<&str> {
    s.metadata.get(HARNESS).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{LossMask, Packed};

    fn sample() -> Sample {
        Sample {
            schema: Sample::SCHEMA.into(),
            id: "x#0.0".into(),
            trajectory_id: "x".into(),
            task_id: "task".into(),
            group_id: 0,
            sample_index: 0,
            thread: 0,
            segment: 0,
            token_ids: vec![1, 2],
            loss_mask: LossMask(vec![1, 1]),
            rollout_logprobs: Packed::f32_vec(&[-0.5]),
            sampling: Vec::new(),
            routing: None,
            reward: 1.0,
            weight: 1.0,
            policy_version: 0,
            policy_versions: Vec::new(),
            metadata: Default::default(),
        }
    }

    #[test]
    fn totals_split_by_the_harness_each_trajectory_names() {
        let mut total = AlignStats::default();
        let t = |h: &str| Trajectory::new("task", 0, 0, h, "embedded", Vec::new());
        for (h, dropped) in [("mini-swe-agent", 1), ("openhands-sdk", 2), ("mini-swe-agent", 3)] {
            let mut st = AlignStats {
                trajectories: 1,
                dropped_turns: dropped,
                ..Default::default()
            };
            let mut samples = vec![sample()];
            tag(&mut st, &mut samples, &t(h));
            assert_eq!(of_sample(&samples[0]), Some(h));
            add_stats(&mut total, &st);
            add(&mut total, &st);
        }
        assert_eq!(total.dropped_turns, 6);
        assert!(total.harness.is_none(), "the total names no harness");
        let by: Vec<(&str, u64, u64)> = total
            .by_harness
            .iter()
            .map(|(k, v)| (k.as_str(), v.trajectories, v.dropped_turns))
            .collect();
        assert_eq!(by, [("mini-swe-agent", 2, 4), ("openhands-sdk", 1, 2)]);
    }
}
