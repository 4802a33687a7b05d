//! Unit tests of thread/segment grouping on real harness requests and of sample building.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::chat::{Conversation, Message, Role};
use crate::records::{Generation, Packed, Sample, Sampling, SamplingRun, Termination};

fn trajectory(generations: Vec<Generation>) -> Trajectory {
    Trajectory {
        policy_version: 3,
        reward: Some(1.0),
        ..Trajectory::new("t", 0, 0, "test", "test", generations)
    }
}

fn generation(
    index: u32,
    api: &str,
    request: Value,
    prompt: Vec<u32>,
    output: Vec<u32>,
    ids: Vec<String>,
) -> Generation {
    let lps: Vec<f32> = (0..output.len()).map(|k| -(k as f32) / 8.0 - 0.1).collect();
    Generation {
        index,
        api: api.into(),
        request,
        prompt_ids: prompt,
        logprobs: Packed::f32_vec(&lps),
        output_ids: output,
        tool_call_ids: ids,
        status: Some("ok".into()),
        ..Default::default()
    }
}

/// A stand-in tokenizer for fixture requests: one token per message, hashed from what the
/// message rules compare (so the token chain holds exactly where a history is extended).
fn token(m: &Message) -> u32 {
    let mut h = DefaultHasher::new();
    m.role.as_str().hash(&mut h);
    if m.role == Role::Assistant && !m.tool_calls.is_empty() {
        m.tool_calls.iter().for_each(|c| c.id.hash(&mut h));
    } else {
        m.content.trim().hash(&mut h);
        m.tool_call_id.hash(&mut h);
    }
    (h.finish() % 100_000) as u32
}

/// Trajectory of a captured traffic file, as a faithful proxy would have recorded it: the
/// answer of request k is what later requests echo after k's messages (the four harnesses never
/// rewrote tool-call ids), its tokens that echo's token.
fn fixture(rel: &str) -> Trajectory {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/harness-traffic")
        .join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    let reqs: Vec<(String, Value, Conversation)> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["method"] == "POST")
        .map(|r| {
            let api = if r["path"].as_str().unwrap().contains("/messages") {
                "anthropic"
            } else {
                "openai"
            };
            let conv = Conversation::from_api_request(api, &r["body"]).unwrap();
            (api.to_string(), r["body"].clone(), conv)
        })
        .collect();
    let mut gens = Vec::new();
    for (k, (api, body, conv)) in reqs.iter().enumerate() {
        let n = conv.messages.len();
        let echo = reqs[k + 1..].iter().find_map(|(_, _, later)| {
            (later.messages.len() > n
                && later.messages[n].role == Role::Assistant
                && messages::common_prefix(&conv.messages, &later.messages[..n], MatchMode::Strict) == n)
                .then(|| later.messages[n].clone())
        });
        let prompt: Vec<u32> = conv.messages.iter().map(token).collect();
        let (output, ids) = match &echo {
            Some(m) => (
                vec![token(m)],
                m.tool_calls.iter().map(|c| c.id.clone()).collect(),
            ),
            None => (vec![7], Vec::new()),
        };
        gens.push(generation(k as u32, api, body.clone(), prompt, output, ids));
    }
    trajectory(gens)
}

fn align(t: &Trajectory) -> (Vec<Sample>, AlignStats) {
    align_trajectory(t, &Settings::default()).unwrap()
}

#[test]
fn single_thread_harnesses_give_one_token_exact_sample() {
    for rel in [
        "claude-code/requests.jsonl",
        "mini-swe-agent/requests.jsonl",
        "mini-swe-agent/textbased/requests.jsonl",
        "openhands-sdk/requests.jsonl",
    ] {
        let t = fixture(rel);
        let (samples, stats) = align(&t);
        assert_eq!(stats.threads, 1, "{rel}");
        assert_eq!(samples.len(), 1, "{rel}: {stats:?}");
        assert_eq!(stats.aligned_turns, t.generations.len() as u64, "{rel}");
        assert!(stats.segment_breaks.is_empty(), "{rel}: {stats:?}");
        assert_eq!(stats.token_exact_samples, 1);
        // Every generation's output is trained exactly once, at its own positions.
        let s = &samples[0];
        assert_eq!(s.loss_mask.count_ones(), t.generations.len());
        let mask = s.loss_mask.to_dense();
        for g in &t.generations {
            assert!(mask[g.prompt_ids.len()], "{rel}: generation {}", g.index);
            assert_eq!(s.token_ids[g.prompt_ids.len()], g.output_ids[0]);
        }
    }
}

#[test]
fn a_title_side_request_is_its_own_thread_and_the_main_agent_is_thread_0() {
    let t = fixture("opencode/requests.jsonl");
    let (samples, stats) = align(&t);
    assert_eq!(stats.threads, 2);
    assert_eq!(samples.len(), 2);
    // The title request came first, but the agent (5 requests) is thread 0.
    let main = samples.iter().find(|s| s.thread == 0).unwrap();
    assert_eq!(main.loss_mask.count_ones(), 5);
    assert_eq!(main.metadata["generations"], json!([1, 2, 3, 4, 5]));
    let title = samples.iter().find(|s| s.thread == 1).unwrap();
    assert_eq!(title.metadata["generations"], json!([0]));
}

#[test]
fn compaction_starts_a_new_segment_of_the_same_thread_and_counts_what_it_dropped() {
    // OpenCode: title, two agent turns, a summarizer request, then the agent on a flattened history.
    let t = fixture("opencode/autocompact/requests.jsonl");
    let (samples, stats) = align(&t);
    assert_eq!(stats.threads, 3, "{stats:?}");
    assert_eq!(
        stats.segment_breaks.get("history_rewritten"),
        Some(&1),
        "{stats:?}"
    );
    let main: Vec<&Sample> = samples.iter().filter(|s| s.thread == 0).collect();
    assert_eq!(main.len(), 2);
    assert_eq!((main[0].segment, main[1].segment), (0, 1));
    assert_eq!(main[0].metadata["generations"], json!([1, 2]));
    assert_eq!(main[1].metadata["generations"], json!([4, 5, 6]));
    // The old history (task, call, result) is gone; only the system prompt stayed.
    assert_eq!(stats.compacted_messages, 3);
    // The synthetic assistant turn of the flattened history was produced by no generation.
    assert_eq!(stats.unlinked_assistant_messages, 1);

    // OpenHands: the condenser (its own system prompt) then a summary replacing old events.
    let t = fixture("openhands-sdk/condenser/requests.jsonl");
    let (samples, stats) = align(&t);
    assert_eq!(stats.threads, 2);
    assert_eq!(stats.segment_breaks.get("history_rewritten"), Some(&1));
    let main: Vec<&Sample> = samples.iter().filter(|s| s.thread == 0).collect();
    assert_eq!(main.len(), 2);
}

#[test]
fn a_rendered_prompt_breaks_the_token_chain_but_not_the_thread() {
    let mut t = fixture("mini-swe-agent/requests.jsonl");
    // The engine saw request 2 re-rendered (another tokenization of the same history), and
    // the later requests were spliced onto that.
    for g in &mut t.generations[2..] {
        g.prompt_ids[0] += 1;
    }
    let (samples, stats) = align(&t);
    assert_eq!(stats.threads, 1);
    assert_eq!(
        stats.segment_breaks.get("prompt_not_token_continuation"),
        Some(&1)
    );
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].metadata["generations"], json!([0, 1]));
    assert_eq!(samples[1].metadata["generations"], json!([2, 3, 4]));
    assert_eq!(stats.aligned_turns, 5);
}

fn chat_request(messages: Value) -> Value {
    json!({"model": "m", "messages": messages})
}

#[test]
fn a_shared_node_is_trained_once_and_failed_captures_are_dropped_and_counted() {
    let sys = json!({"role": "system", "content": "s"});
    let user = json!({"role": "user", "content": "u"});
    let a0 = json!({"role": "assistant", "content": "first"});
    let g0 = generation(
        0,
        "openai",
        chat_request(json!([sys, user])),
        vec![1, 2],
        vec![10, 11],
        vec![],
    );
    // Two continuations of generation 0 (the harness retried with another user message).
    let g1 = generation(
        1,
        "openai",
        chat_request(json!([sys, user, a0, {"role": "user", "content": "x"}])),
        vec![1, 2, 10, 11, 5],
        vec![20],
        vec![],
    );
    let g2 = generation(
        2,
        "openai",
        chat_request(json!([sys, user, a0, {"role": "user", "content": "y"}])),
        vec![1, 2, 10, 11, 6],
        vec![30, 31, 32],
        vec![],
    );
    let mut g3 = generation(
        3,
        "openai",
        chat_request(json!([sys, user])),
        vec![1, 2],
        vec![40],
        vec![],
    );
    g3.status = Some("client_disconnected".into());
    let t = trajectory(vec![g2.clone(), g0, g1, g3]);
    let (samples, stats) = align(&t);
    assert_eq!(samples.len(), 2);
    assert_eq!(stats.segment_breaks.get("branch"), Some(&1));
    assert_eq!(samples[0].token_ids, vec![1, 2, 10, 11, 5, 20]);
    assert_eq!(
        samples[0].loss_mask.to_dense(),
        vec![false, false, true, true, false, true]
    );
    assert_eq!(samples[1].token_ids, vec![1, 2, 10, 11, 6, 30, 31, 32]);
    // Generation 0 was trained by the first branch; only generation 2's tokens here.
    assert_eq!(
        samples[1].loss_mask.to_dense(),
        vec![false, false, false, false, false, true, true, true]
    );
    assert_eq!(samples[1].rollout_logprobs, g2.logprobs);
    assert_eq!(stats.aligned_turns, 3);
    assert_eq!(stats.policy_tokens, 6);
    assert_eq!(stats.dropped_turns, 1);
    assert_eq!(stats.dropped_tokens, 1);
    assert_eq!(
        stats.dropped_by_reason.get("status:client_disconnected"),
        Some(&1)
    );
    assert_eq!(
        (samples[0].reward, samples[0].weight, samples[0].policy_version),
        (1.0, 1.0, 3)
    );

    let mut infra = t.clone();
    infra.infra_failure = true;
    infra.termination = Termination::Infra("setup".into());
    assert!(align(&infra).0.iter().all(|s| s.weight == 0.0));
    let mut ungraded = t;
    ungraded.reward = None;
    assert!(align(&ungraded)
        .0
        .iter()
        .all(|s| s.weight == 0.0 && s.reward == 0.0));
}

#[test]
fn routing_comes_from_the_deepest_generation_and_covers_t_minus_1_positions() {
    let sys = json!({"role": "system", "content": "s"});
    let a0 = json!({"role": "assistant", "content": "a"});
    // 1 layer, top-1: expert id = 10 × generation + position.
    let routing = |g: u16, n: usize| {
        Packed::from_experts(
            vec![n, 1, 1],
            &(0..n as u16).map(|p| 10 * g + p).collect::<Vec<_>>(),
        )
    };
    let mut g0 = generation(
        0,
        "openai",
        chat_request(json!([sys, {"role": "user", "content": "u"}])),
        vec![1, 2],
        vec![3],
        vec![],
    );
    g0.routing = Some(routing(0, 2));
    let mut g1 = generation(
        1,
        "openai",
        chat_request(json!([sys, {"role": "user", "content": "u"}, a0, {"role": "user", "content": "v"}])),
        vec![1, 2, 3, 4],
        vec![5, 6],
        vec![],
    );
    g1.routing = Some(routing(1, 5));
    let (samples, _) = align(&trajectory(vec![g0.clone(), g1.clone()]));
    let r = samples[0].routing.as_ref().unwrap();
    assert_eq!(r.shape, vec![5, 1, 1]);
    assert_eq!(r.to_u32().unwrap(), vec![10, 11, 12, 13, 14]);

    // A backend that recorded only the new positions of generation 1 (routing_start 3).
    g1.routing = Some(Packed::from_experts(vec![2, 1, 1], &[23, 24]));
    g1.extra.insert("routing_start".into(), json!(3));
    let (samples, stats) = align(&trajectory(vec![g0.clone(), g1.clone()]));
    // Position 2 (generation 0's output, never forwarded by generation 0) has no routing.
    assert!(samples[0].routing.is_none());
    assert_eq!(stats.samples_without_routing, 1);
    g1.extra.insert("routing_start".into(), json!(2));
    g1.routing = Some(Packed::from_experts(vec![3, 1, 1], &[22, 23, 24]));
    let (samples, _) = align(&trajectory(vec![g0, g1]));
    assert_eq!(
        samples[0].routing.as_ref().unwrap().to_u32().unwrap(),
        vec![0, 1, 22, 23, 24]
    );
}

#[test]
fn bad_generations_are_errors_naming_the_field() {
    let mut g = generation(
        0,
        "openai",
        chat_request(json!([{"role": "user", "content": "u"}])),
        vec![1],
        vec![2, 3],
        vec![],
    );
    g.logprobs = Packed::f32_vec(&[-1.0]);
    let err = align_trajectory(&trajectory(vec![g.clone()]), &Settings::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "trajectory `t/0/0`: generations[0] (index 0): `logprobs`: 1 values for 2 output tokens"
    );
    g.logprobs = Packed::f32_vec(&[-1.0, -1.0]);
    g.routing = Some(Packed::from_experts(vec![9, 1, 1], &[0; 9]));
    let err = align_trajectory(&trajectory(vec![g]), &Settings::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`routing.shape`: covers positions 0..9 but prompt + output has 3"),
        "{err}"
    );
}

#[test]
fn an_unparseable_request_is_dropped_not_guessed() {
    let g = generation(0, "openai", json!({"messages": "nope"}), vec![1], vec![2], vec![]);
    let (samples, stats) = align(&trajectory(vec![g]));
    assert!(samples.is_empty());
    assert_eq!(stats.dropped_by_reason.get("unparseable_request"), Some(&1));
    assert_eq!(stats.dropped_tokens, 1);
}

#[test]
fn a_turn_cut_at_a_stop_string_links_by_the_text_the_client_was_given() {
    // The engine keeps the token that completed a stop string (and what came with it); the
    // proxy answered the text before it, and that is what the harness echoes.
    let chat = crate::chat::ChatFormat::from_model_dir(&crate::chat::testdata("tokenizer/qwen3")).unwrap();
    let user = json!({"role": "user", "content": "u"});
    let prompt0 = chat
        .encode("<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let output0 = chat
        .encode("Looking at it.\nOBSERVATION: made up<|im_end|>")
        .unwrap();
    let mut g0 = generation(
        0,
        "openai",
        chat_request(json!([user])),
        prompt0.clone(),
        output0.clone(),
        vec![],
    );
    g0.sampling.stop = vec!["OBSERVATION:".into()];
    let echoed = json!({"role": "assistant", "content": "Looking at it.\n"});
    let mut prompt1 = [prompt0, output0].concat();
    prompt1.extend(
        chat.encode("\n<|im_start|>user\nv<|im_end|>\n<|im_start|>assistant\n")
            .unwrap(),
    );
    let g1 = generation(
        1,
        "openai",
        chat_request(json!([user, echoed, {"role": "user", "content": "v"}])),
        prompt1,
        chat.encode("Done.<|im_end|>").unwrap(),
        vec![],
    );
    let t = trajectory(vec![g0, g1]);
    let settings = Settings {
        chat: Some(std::sync::Arc::new(chat)),
        ..Settings::default()
    };
    let (samples, stats) = align_trajectory(&t, &settings).unwrap();
    assert_eq!(samples.len(), 1, "{stats:?}");
    assert_eq!((stats.aligned_turns, stats.dropped_turns), (2, 0));
    assert_eq!(stats.tool_call_mismatches, 0);
    assert!(stats.segment_breaks.is_empty(), "{:?}", stats.segment_breaks);
}

/// A sample's sampling runs follow its generations' processed sampling (the model's own
/// distribution at first is left out, a change starts a run); a tempered turn whose log-probs are
/// the model's own, and a greedy one, are dropped and counted rather than trained as if sampled.
#[test]
fn sampling_runs_follow_the_generations_and_unfaithful_log_probs_are_dropped() {
    let sys = json!({"role": "system", "content": "s"});
    let user = json!({"role": "user", "content": "u"});
    let a0 = json!({"role": "assistant", "content": "first"});
    let a1 = json!({"role": "assistant", "content": "second"});
    let tempered = |t: f64, top_p: Option<f64>| Sampling {
        temperature: Some(t),
        top_p,
        ..Default::default()
    };
    let g0 = generation(
        0,
        "openai",
        chat_request(json!([sys, user])),
        vec![1, 2],
        vec![10, 11],
        vec![],
    );
    let mut g1 = generation(
        1,
        "openai",
        chat_request(json!([sys, user, a0, {"role": "user", "content": "x"}])),
        vec![1, 2, 10, 11, 5],
        vec![20, 21, 22],
        vec![],
    );
    g1.sampling = tempered(0.5, Some(0.9));
    g1.processed_logprobs = true;
    let mut g2 = generation(
        2,
        "openai",
        chat_request(
            json!([sys, user, a0, {"role": "user", "content": "x"}, a1, {"role": "user", "content": "y"}]),
        ),
        vec![1, 2, 10, 11, 5, 20, 21, 22, 6],
        vec![30],
        vec![],
    );
    g2.sampling = tempered(1.0, None);
    let (samples, stats) = align(&trajectory(vec![g0.clone(), g1.clone(), g2.clone()]));
    assert_eq!(samples.len(), 1, "{stats:?}");
    let run = |start, temperature, top_p| SamplingRun {
        start,
        temperature,
        top_k: 0,
        top_p,
        min_p: 0.0,
        rule: Default::default(),
    };
    // Policy tokens: g0's 2, g1's 3, g2's 1.
    assert_eq!(samples[0].sampling, vec![run(2, 0.5, 0.9), run(5, 1.0, 1.0)]);

    // The same tempered turn with the model's own log-probs, and a greedy one: dropped.
    g1.processed_logprobs = false;
    g2.sampling = tempered(0.0, None);
    let (samples, stats) = align(&trajectory(vec![g0, g1, g2]));
    assert_eq!(
        stats.dropped_by_reason.get("logprobs_not_of_sampling"),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(
        stats.dropped_by_reason.get("greedy_decoding"),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(stats.aligned_turns, 1);
    assert!(samples.iter().all(|s| s.sampling.is_empty()));
}

#[test]
fn policy_version_runs_follow_the_generations_that_spanned_a_reload() {
    let sys = json!({"role": "system", "content": "s"});
    let user = json!({"role": "user", "content": "u"});
    let a0 = json!({"role": "assistant", "content": "first"});
    let a1 = json!({"role": "assistant", "content": "second"});
    let turn = |index: u32, messages: Value, prompt: Vec<u32>, output: Vec<u32>, version: u64| Generation {
        policy_version: version,
        ..generation(index, "openai", chat_request(messages), prompt, output, vec![])
    };
    let later = json!([sys, user, a0, {"role": "user", "content": "x"}]);
    let last = json!([sys, user, a0, {"role": "user", "content": "x"}, a1, {"role": "user", "content": "y"}]);
    // The trajectory started on policy 3 (`trajectory`); its second and third turns ran after
    // reloads to 4 and 5. The first generation records 0 (a producer that does not fill it):
    // never older than its trajectory, so it counts as 3.
    let gens = vec![
        turn(0, json!([sys, user]), vec![1, 2], vec![10, 11], 0),
        turn(1, later.clone(), vec![1, 2, 10, 11, 5], vec![20, 21, 22], 4),
        turn(2, last.clone(), vec![1, 2, 10, 11, 5, 20, 21, 22, 6], vec![30], 5),
    ];
    let (samples, stats) = align(&trajectory(gens));
    assert_eq!(samples.len(), 1, "{stats:?}");
    let run = |start, version| crate::records::VersionRun { start, version };
    assert_eq!(samples[0].policy_versions, vec![run(0, 3), run(2, 4), run(5, 5)]);
    assert_eq!(samples[0].token_versions(6), vec![3, 3, 4, 4, 4, 5]);
    assert_eq!(samples[0].policy_version, 3);

    // All on the trajectory's version: no runs, and every token is version 3.
    let gens = vec![
        turn(0, json!([sys, user]), vec![1, 2], vec![10, 11], 3),
        turn(1, later, vec![1, 2, 10, 11, 5], vec![20, 21, 22], 3),
    ];
    let (samples, _) = align(&trajectory(gens));
    assert!(samples[0].policy_versions.is_empty());
    assert_eq!(samples[0].token_versions(5), vec![3; 5]);
}

#[test]
fn the_trajectories_of_an_uninformative_group_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("traj.jsonl");
    let base = fixture("mini-swe-agent/requests.jsonl");
    let mark = |informative| {
        Some(crate::records::DynamicSampling {
            informative,
            extra_group: None,
            pool: 2,
            ..Default::default()
        })
    };
    let trajs = [
        Trajectory {
            dynamic_sampling: mark(false),
            ..base.clone()
        },
        Trajectory {
            id: Trajectory::make_id("u", 0, 0),
            task_id: "u".into(),
            dynamic_sampling: mark(true),
            ..base.clone()
        },
        Trajectory {
            id: Trajectory::make_id("v", 0, 0),
            task_id: "v".into(),
            ..base
        },
    ];
    let mut w = crate::io::AtomicWriter::create(&input).unwrap();
    w.write_all(&trajs).unwrap();
    w.finish().unwrap();
    let files = Files {
        inputs: vec![input],
        output: tmp.path().join("samples.jsonl"),
        stats: None,
    };
    let opts = RunOptions {
        jobs: 1,
        read: ReadOptions::default(),
        progress: false,
    };
    let total = run(&files, &Settings::default(), opts).unwrap();
    assert_eq!(
        (total.trajectories, total.skipped_uninformative, total.samples),
        (3, 1, 2)
    );
    let samples: Vec<Sample> = crate::io::read_all(&files.output, ReadOptions::default()).unwrap();
    let from: Vec<&str> = samples.iter().map(|s| s.trajectory_id.as_str()).collect();
    assert_eq!(from, ["u/0/0", "v/0/0"]);
}
