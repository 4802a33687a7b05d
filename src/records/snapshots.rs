//! Round trip of every record type, and a snapshot of its JSON so that a format change is seen
//! in review (update with `INSTA_UPDATE=always cargo test --release --lib records`).

use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn round_trip<R: Record + PartialEq + std::fmt::Debug + Clone>(rec: &R) -> serde_json::Value {
    let text = serde_json::to_string(rec).unwrap();
    let back: R = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, rec);
    check_schema::<R>(back.schema()).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parse_any(value.clone()), Ok(R::KIND));
    value
}

fn task() -> Task {
    let mut t = Task::new("pkg__pkg-1", "The parser drops the last token.");
    t.source = TaskSource::Swebench;
    t.repo = Some("owner/pkg".into());
    t.base_commit = Some("0123abcd".into());
    t.gold_patch = Some("diff --git a/pkg/p.py b/pkg/p.py\n".into());
    t.test_patch = Some("diff --git a/tests/test_p.py b/tests/test_p.py\n".into());
    t.fail_to_pass = vec!["tests/test_p.py::test_last".into()];
    t.pass_to_pass = vec!["tests/test_p.py::test_first".into()];
    t.environment = Environment {
        dockerfile: Some("FROM lego-rl/base:debian-python\n".into()),
        repo_source: Some(RepoSource::Bundle {
            path: "repos/pkg.bundle".into(),
        }),
        workdir: Some("/testbed".into()),
        setup: vec!["pip install -e .".into()],
        ..Default::default()
    };
    t.grader = Some(Grader::Swebench {
        test_cmd: "python -m pytest -rA".into(),
        test_files: vec![],
    });
    t.metadata.insert("version".into(), json!("1.2"));
    t
}

fn generation() -> Generation {
    Generation {
        thread: 0,
        index: 1,
        api: "openai".into(),
        request: json!({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}),
        prompt_mode: PromptMode::Faithful,
        prompt_ids: vec![151644, 872, 198],
        output_ids: vec![6023, 151645],
        logprobs: Packed::f32_vec(&[-0.25, -1.5]),
        routing: Some(Packed::from_experts(
            vec![4, 2, 2],
            &[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7],
        )),
        finish_reason: "stop".into(),
        tool_call_ids: vec!["call_0_1_0".into()],
        response: Some(CapturedResponse {
            text: "Hi".into(),
            reasoning: None,
            tool_calls: vec![CapturedCall {
                id: "call_0_1_0".into(),
                name: "bash".into(),
                arguments: "{\"command\": \"ls\"}".into(),
            }],
        }),
        backend: Some("embedded".into()),
        policy_version: 3,
        sampling: Sampling {
            temperature: Some(0.7),
            top_p: Some(0.95),
            max_tokens: Some(512),
            ..Default::default()
        },
        processed_logprobs: true,
        ignored_sampling: BTreeMap::new(),
        timings: BTreeMap::from([("decode".into(), 0.5), ("prefill".into(), 0.01)]),
        status: Some("ok".into()),
        error: None,
        extra: Default::default(),
    }
}

/// A trajectory with every kind of field filled (an infra failure, so no reward).
fn trajectory() -> Trajectory {
    Trajectory {
        schema: Trajectory::SCHEMA.into(),
        id: Trajectory::make_id("pkg__pkg-1", 0, 3),
        task_id: "pkg__pkg-1".into(),
        group_id: 0,
        sample_index: 3,
        harness: "mini-swe-agent".into(),
        backend: "embedded".into(),
        policy_version: 3,
        sampling: Sampling {
            temperature: Some(1.0),
            ..Default::default()
        },
        generations: vec![generation()],
        termination: Termination::Infra("setup".into()),
        infra_failure: true,
        reward: None,
        grader: Some(GraderResult {
            tests: BTreeMap::from([("tests/test_p.py::test_last".into(), "FAILED".into())]),
            exit_code: Some(1),
            ..Default::default()
        }),
        stages: BTreeMap::from([(
            "setup".into(),
            StageTiming {
                start: 1.0,
                end: 2.5,
                outcome: "error".into(),
            },
        )]),
        audit: vec![AuditEvent {
            kind: "git_history".into(),
            detail: "git log --all".into(),
            generation: Some(1),
        }],
        diff: Some(String::new()),
        mode: Some("train".into()),
        metadata: Default::default(),
        dynamic_sampling: None,
    }
}

#[test]
fn every_record_round_trips_and_matches_its_snapshot() {
    insta::assert_json_snapshot!("task", round_trip(&task()));
    insta::assert_json_snapshot!(
        "task_decision",
        round_trip(&TaskDecision {
            schema: TaskDecision::SCHEMA.into(),
            task_id: "pkg__pkg-1".into(),
            kept: false,
            stage: "difficulty".into(),
            reason: Some("solved 4 of 4".into()),
            evidence: json!({"solved": 4, "trials": 4}),
        })
    );
    insta::assert_json_snapshot!(
        "image",
        round_trip(&ImageRecord {
            schema: ImageRecord::SCHEMA.into(),
            task_id: "pkg__pkg-1".into(),
            image: "lego-rl/task-pkg__pkg-1:3f2a".into(),
            image_id: Some("sha256:abcd".into()),
            environment_image: Some("lego-rl/env-pkg:91bc".into()),
            cache_hit: true,
            seconds: 0.02,
            log_path: Some("logs/build/pkg__pkg-1.log".into()),
            error: None,
        })
    );
    insta::assert_json_snapshot!("trajectory", round_trip(&trajectory()));
    insta::assert_json_snapshot!(
        "sample",
        round_trip(&Sample {
            schema: Sample::SCHEMA.into(),
            id: "pkg__pkg-1/0/3#0.0".into(),
            trajectory_id: "pkg__pkg-1/0/3".into(),
            task_id: "pkg__pkg-1".into(),
            group_id: 0,
            sample_index: 3,
            thread: 0,
            segment: 0,
            token_ids: vec![151644, 872, 198, 6023, 151645],
            loss_mask: LossMask::from_dense(&[false, false, false, true, true]),
            rollout_logprobs: Packed::f32_vec(&[-0.25, -1.5]),
            sampling: vec![SamplingRun {
                start: 1,
                temperature: 0.7,
                top_k: 20,
                top_p: 0.95,
                min_p: 0.0,
                rule: Default::default(),
            }],
            routing: Some(Packed::from_experts(vec![1, 2, 2], &[0, 300, 2, 3])),
            reward: 1.0,
            weight: 1.0,
            policy_version: 3,
            policy_versions: Vec::new(),
            metadata: Default::default(),
        })
    );
    insta::assert_json_snapshot!(
        "align_stats",
        round_trip(&AlignStats {
            schema: AlignStats::SCHEMA.into(),
            trajectories: 8,
            threads: 9,
            segments: 10,
            samples: 10,
            aligned_turns: 40,
            dropped_turns: 1,
            policy_tokens: 5000,
            dropped_tokens: 120,
            dropped_by_reason: BTreeMap::from([("status:client_disconnected".into(), 1)]),
            tool_call_mismatches: 3,
            mismatches_resolved_by_id: 3,
            token_exact_samples: 10,
            segment_breaks: BTreeMap::from([("history_rewritten".into(), 1)]),
            compacted_messages: 6,
            unlinked_assistant_messages: 1,
            ..Default::default()
        })
    );
    insta::assert_json_snapshot!(
        "step_metrics",
        round_trip(&StepMetrics {
            schema: StepMetrics::SCHEMA.into(),
            step: 1,
            loss: 0.01,
            lr: 1e-6,
            clip_fraction: Some(0.1),
            logprob_pearson: Some(0.999),
            expert_overlap: Some(0.97),
            routing_replay: Some(true),
            groups: 2,
            valid_trajectories: 15,
            infra_failed_trajectories: 1,
            by_trajectory: vec![TrajectoryAgreement {
                trajectory_id: "pkg__pkg-1/0/0".into(),
                samples: 1,
                policy_tokens: 120,
                logprob_pearson: Some(0.9991),
                logprob_mean_abs_diff: Some(0.002),
                logprob_max_abs_diff: Some(0.03),
                logprob_kl: Some(1e-5),
            }],
            ..Default::default()
        })
    );
    insta::assert_json_snapshot!(
        "validation_report",
        round_trip(&ValidationReport {
            schema: ValidationReport::SCHEMA.into(),
            step: Some(1),
            passed: false,
            gates: vec![GateResult {
                name: "logprob_pearson".into(),
                value: Some(0.95),
                op: ">=".into(),
                threshold: 0.99,
                passed: false,
                detail: None,
            }],
            ..Default::default()
        })
    );
}

#[test]
fn loss_mask_runs_round_trip() {
    for dense in [
        vec![],
        vec![true],
        vec![false],
        vec![true, true, false, true],
        vec![false, false, true, true, true, false, false, true],
    ] {
        let m = LossMask::from_dense(&dense);
        assert_eq!(m.to_dense(), dense);
        assert_eq!(m.len(), dense.len());
        assert_eq!(m.count_ones(), dense.iter().filter(|&&b| b).count());
    }
    assert_eq!(LossMask::from_dense(&[true, true, false]).0, vec![0, 2, 1]);
}
