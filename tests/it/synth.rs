//! A small deterministic generator of synthetic run directories for validate/report tests:
//! trajectories whose generations carry OpenAI- and Anthropic-style requests with tool calls,
//! samples, align stats and step metrics. Knobs inject the faults a gate must catch.

use std::collections::BTreeMap;
use std::path::Path;

use lego_rl::io::AtomicWriter;
use lego_rl::records::{
    AlignStats, AuditEvent, DynamicSampling, Generation, GraderResult, LossMask, Packed, Record, Sample,
    StageTiming, StepMetrics, Termination, Trajectory,
};
use serde_json::{json, Value};

/// What to generate.
#[derive(Clone, Debug)]
pub struct Synth {
    pub steps: u64,
    pub tasks: usize,
    pub group_size: u32,
    /// logprob_pearson written for the last step (earlier steps get 0.998).
    pub last_pearson: f64,
    /// Every n-th trajectory (by index in a step) is an infra failure (0 = none).
    pub infra_every: usize,
    /// Every n-th trajectory reads git history (0 = none).
    pub git_every: usize,
    /// Every n-th trajectory edits a test file (0 = none).
    pub test_edit_every: usize,
    /// Every n-th trajectory planted a module shadowing pytest (graded 0, `grader_tampering`).
    pub tamper_every: usize,
    /// Every n-th trajectory's diff raised a hack signal (`hack_skip`; `suspected_hack` when it
    /// was rewarded).
    pub hack_every: usize,
    /// Add a sample naming a trajectory that does not exist.
    pub orphan_sample: bool,
    /// unreplayed_token_fraction of every step (routing replay on).
    pub unreplayed: f64,
    /// logprob_kl of every step.
    pub kl: f64,
    /// Dynamic sampling's marks, (N, budget): every group marked (informative when its graded
    /// rewards vary), the last task's group as extra group 0, the pool holding every task.
    pub dynamic: Option<(u64, u64)>,
}

impl Default for Synth {
    fn default() -> Self {
        Synth {
            steps: 3,
            tasks: 4,
            group_size: 4,
            last_pearson: 0.997,
            infra_every: 0,
            git_every: 0,
            test_edit_every: 0,
            tamper_every: 0,
            hack_every: 0,
            orphan_sample: false,
            unreplayed: 0.0,
            kl: 1e-6,
            dynamic: None,
        }
    }
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

/// The conversation of one OpenAI-style (OpenHands-like) trajectory: view, edit, a failing and
/// a passing test run, and (when `reread`) a re-read of the edited file.
pub fn openai_messages(task: &str, reread: bool) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("Fix {task}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("c1", "str_replace_editor", json!({"command": "view", "path": "/testbed/pkg/a.py"}))]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n"}),
        json!({"role": "assistant", "content": "Looking at b.py too.", "tool_calls": [call("c2", "execute_bash", json!({"command": "cat /testbed/pkg/b.py"}))]}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "X = 2\n[Command finished with exit code 0]"}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("c3", "str_replace_editor", json!({"command": "str_replace", "path": "/testbed/pkg/a.py", "old_str": "1", "new_str": "2"}))]}),
        json!({"role": "tool", "tool_call_id": "c3", "content": "The file /testbed/pkg/a.py has been edited."}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("c4", "execute_bash", json!({"command": "python -m pytest tests"}))]}),
        json!({"role": "tool", "tool_call_id": "c4", "content": "1 failed\n[Command finished with exit code 1]"}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("c5", "execute_bash", json!({"command": "python -m pytest tests -x"}))]}),
        json!({"role": "tool", "tool_call_id": "c5", "content": "1 passed\n[Command finished with exit code 0]"}),
    ];
    if reread {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [call("c6", "str_replace_editor", json!({"command": "view", "path": "/testbed/pkg/a.py"}))]}));
        m.push(json!({"role": "tool", "tool_call_id": "c6", "content": "def f():\n    return 2\n"}));
    }
    // The final answer: generated, so only the generation's output holds it (no later request).
    m.push(json!({"role": "assistant", "content": "Done."}));
    m
}

/// The conversation of one Anthropic-style (Claude Code-like) trajectory: Read, Edit, a failing
/// Bash and no re-read.
pub fn anthropic_messages(task: &str) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": [{"type": "text", "text": format!("Fix {task}.")}]}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/testbed/pkg/c.py"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "C = 3"}]}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Editing."}, {"type": "tool_use", "id": "t2", "name": "Edit", "input": {"file_path": "/testbed/pkg/c.py", "old_string": "3", "new_string": "4"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "ok"}]}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "Bash", "input": {"command": "pytest"}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3", "content": "boom", "is_error": true}]}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Done."}]}),
    ]
}

/// Generations whose requests grow turn by turn, one per assistant message.
fn generations(api: &str, messages: &[Value], version: u64) -> Vec<Generation> {
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let request = if api == "openai" {
            json!({"model": "policy", "messages": messages[..i].to_vec()})
        } else {
            json!({"model": "policy", "system": "You are Claude Code.", "max_tokens": 1024, "messages": messages[..i].to_vec()})
        };
        let n = 3 + (i % 4);
        out.push(Generation {
            index: out.len() as u32,
            api: api.into(),
            request,
            prompt_ids: (0..(10 * i as u32 + 5)).collect(),
            output_ids: (100..100 + n as u32).collect(),
            logprobs: Packed::f32_vec(&vec![-0.5; n]),
            finish_reason: "tool_calls".into(),
            policy_version: version,
            ..Default::default()
        });
    }
    out
}

fn write<R: Record + Sync>(path: &Path, recs: &[R]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = AtomicWriter::create(path).unwrap();
    w.write_all(recs).unwrap();
    w.finish().unwrap();
}

/// One trajectory of the synthetic run.
pub fn trajectory(s: &Synth, step: u64, task: usize, sample: u32, index: usize) -> Trajectory {
    let task_id = format!("owner__repo{}-{}", task % 2, 100 + task);
    let anthropic = sample % 2 == 1;
    let messages = if anthropic {
        anthropic_messages(&task_id)
    } else {
        openai_messages(&task_id, (task + sample as usize + step as usize) % 3 != 0)
    };
    let infra = s.infra_every > 0 && index % s.infra_every == 0;
    // Rewards rise with the step; task 0 always fails (a zero-variance group).
    let reward = (!infra).then(|| f64::from(task != 0 && (sample as u64 + task as u64 + step) % 3 != 0));
    let mut audit = Vec::new();
    if s.git_every > 0 && index % s.git_every == 0 {
        audit.push(AuditEvent {
            kind: "git_history".into(),
            detail: "git log -p".into(),
            generation: Some(1),
        });
    }
    if s.test_edit_every > 0 && index % s.test_edit_every == s.test_edit_every - 1 {
        audit.push(AuditEvent {
            kind: "test_edit".into(),
            detail: "tests/test_a.py".into(),
            generation: None,
        });
    }
    let tampered = s.tamper_every > 0 && index % s.tamper_every == 0;
    if tampered {
        audit.push(AuditEvent {
            kind: "shadowing".into(),
            detail: "pytest: pytest.py would be imported instead of the grader's `pytest`".into(),
            generation: None,
        });
    }
    let reward = if tampered && !infra { Some(0.0) } else { reward };
    if s.hack_every > 0 && index % s.hack_every == 0 {
        audit.push(AuditEvent {
            kind: "hack_skip".into(),
            detail: "pkg/a.py:3: pytest.skip('slow')".into(),
            generation: None,
        });
    }
    let t0 = 1_700_000_000.0 + (step * 1000 + index as u64) as f64;
    Trajectory {
        schema: Trajectory::SCHEMA.into(),
        id: Trajectory::make_id(&task_id, step * 100 + task as u64, sample),
        task_id,
        group_id: step * 100 + task as u64,
        sample_index: sample,
        harness: if anthropic {
            "claude-code".into()
        } else {
            "openhands".into()
        },
        backend: "embedded".into(),
        policy_version: step,
        sampling: Default::default(),
        generations: generations(if anthropic { "anthropic" } else { "openai" }, &messages, step),
        termination: if infra {
            Termination::Infra("setup".into())
        } else if sample == 3 {
            Termination::MaxTurns
        } else {
            Termination::Finished
        },
        infra_failure: infra,
        reward,
        grader: Some(GraderResult {
            tests: BTreeMap::from([(
                "tests/test_a.py::test_f".into(),
                if reward == Some(1.0) { "PASSED" } else { "FAILED" }.into(),
            )]),
            exit_code: Some(i64::from(reward != Some(1.0))),
            log_tail: Some("=== 1 passed ===".into()),
            reason: tampered.then(|| "grader_tampering".into()),
            ..Default::default()
        }),
        stages: BTreeMap::from([
            (
                "setup".into(),
                StageTiming {
                    start: t0,
                    end: t0 + 5.0,
                    outcome: "ok".into(),
                },
            ),
            (
                "agent".into(),
                StageTiming {
                    start: t0 + 5.0,
                    end: t0 + 65.0,
                    outcome: "ok".into(),
                },
            ),
        ]),
        audit,
        diff: Some("--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-1\n+2\n".into()),
        mode: Some("train".into()),
        metadata: Default::default(),
        dynamic_sampling: None,
    }
}

/// Marks every group of one step's trajectories as rollout's dynamic sampling would.
fn mark_dynamic(trajs: &mut [Trajectory], tasks: u64, n: u64, budget: u64) {
    let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, t) in trajs.iter().enumerate() {
        groups.entry(t.group_id).or_default().push(i);
    }
    for members in groups.values() {
        let informative = DynamicSampling::varies(members.iter().map(|&i| &trajs[i]));
        let last_task = trajs[members[0]].group_id % 100 == tasks - 1;
        for &i in members {
            trajs[i].dynamic_sampling = Some(DynamicSampling {
                informative,
                extra_group: last_task.then_some(0),
                pool: tasks,
                min_informative_groups: Some(n),
                max_extra_groups: Some(budget),
            });
        }
    }
}

/// Writes the run into `dir`.
pub fn write_run(dir: &Path, s: &Synth) {
    let mut metrics = Vec::new();
    for step in 0..s.steps {
        let mut trajs = Vec::new();
        for task in 0..s.tasks {
            for sample in 0..s.group_size {
                let index = trajs.len();
                trajs.push(trajectory(s, step, task, sample, index));
            }
        }
        if let Some((n, budget)) = s.dynamic {
            mark_dynamic(&mut trajs, s.tasks as u64, n, budget);
        }
        let mut samples: Vec<Sample> = trajs
            .iter()
            .map(|t| {
                let n = 4;
                let rollout: Vec<f32> = (0..n).map(|i| -0.1 * (i + 1) as f32).collect();
                let trainer: Vec<f32> = rollout
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + 0.05 * i as f32)
                    .collect();
                let mut metadata = serde_json::Map::new();
                metadata.insert(
                    "trainer_logprobs".into(),
                    serde_json::to_value(Packed::f32_vec(&trainer)).unwrap(),
                );
                Sample {
                    schema: Sample::SCHEMA.into(),
                    id: format!("{}#0.0", t.id),
                    trajectory_id: t.id.clone(),
                    task_id: t.task_id.clone(),
                    group_id: t.group_id,
                    sample_index: t.sample_index,
                    thread: 0,
                    segment: 0,
                    token_ids: (0..8).collect(),
                    loss_mask: LossMask::from_dense(&[false, false, false, false, true, true, true, true]),
                    rollout_logprobs: Packed::f32_vec(&rollout),
                    sampling: Vec::new(),
                    routing: None,
                    reward: t.reward.unwrap_or(0.0),
                    weight: if t.infra_failure { 0.0 } else { 1.0 },
                    policy_version: t.policy_version,
                    policy_versions: Vec::new(),
                    metadata,
                }
            })
            .collect();
        if s.orphan_sample && step == s.steps - 1 {
            let mut o = samples[0].clone();
            o.trajectory_id = "ghost/0/0".into();
            o.id = "ghost/0/0#0.0".into();
            samples.push(o);
        }
        let stats = AlignStats {
            schema: AlignStats::SCHEMA.into(),
            trajectories: trajs.len() as u64,
            samples: samples.len() as u64,
            aligned_turns: 100,
            dropped_turns: 1,
            ..Default::default()
        };
        let name = format!("step-{step:06}.jsonl.zst");
        write(&dir.join("trajectories").join(&name), &trajs);
        write(&dir.join("samples").join(&name), &samples);
        write(&dir.join("align-stats").join(&name), &[stats]);
        let graded: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        metrics.push(StepMetrics {
            schema: StepMetrics::SCHEMA.into(),
            step,
            loss: 0.5 / (step + 1) as f64,
            lr: 1e-6,
            clip_fraction: Some(0.01 * step as f64),
            grad_norm: Some(1.0 + step as f64),
            reward_mean: Some(graded.iter().sum::<f64>() / graded.len().max(1) as f64),
            logprob_pearson: Some(if step + 1 == s.steps {
                s.last_pearson
            } else {
                0.998
            }),
            expert_overlap: Some(0.95),
            routing_replay: Some(true),
            unreplayed_token_fraction: Some(s.unreplayed),
            logprob_kl: Some(s.kl),
            // Step 0 trains on its own checkpoint's batch; later steps on a batch one version
            // old in part (the async loop at --max-staleness 1).
            staleness_max: Some(step.min(1)),
            staleness_histogram: if step == 0 { vec![100] } else { vec![70, 30] },
            ..Default::default()
        });
    }
    write(&dir.join("metrics.jsonl.zst"), &metrics);
}
