//! `align` on real captures: our scripted harness (tests/harness/scripted_harness.py) drives the
//! real proxy in front of the embedded tiny Qwen3-MoE through the official `openai` and
//! `anthropic` SDKs, re-serializing tool arguments, compacting its history and calling a side
//! model; the captured trajectories are aligned by the CLI and the samples checked against the
//! captures and against the trainer's own log-prob recomputation with routing replay.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lego_rl::chat::ChatFormat;
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::io::{read_all, AtomicWriter, ReadOptions};
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::{AlignStats, Generation, Sample, Trajectory};
use lego_rl::train::{Settings, Trainer};
use serde_json::Value;
use tch::Device;

use crate::common::{lego, python};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tokenizer_dir() -> PathBuf {
    root().join("testdata/tokenizer/qwen3")
}

fn call(command: &str, thought: &str) -> String {
    format!(
        "<think>\n{thought}\n</think>\n\n<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": \"{command}\", \"timeout\": 30}}}}\n</tool_call>"
    )
}

/// What the model is forced to say, in request order: 4 calls with a title request after the
/// second, then the final answer (the harness compacts after the third call).
fn script() -> Vec<String> {
    vec![
        call("ls", "Look at the repository first."),
        call("cat calc.py", "Read the code."),
        "<think>\nA title.\n</think>\n\nFixing calc.py".to_string(),
        call("sed -i s/a - b/a + b/ calc.py", "add subtracts; fix it."),
        call("python -m pytest -q", "Run the tests."),
        "<think>\nAll green.\n</think>\n\nThe tests pass now.".to_string(),
    ]
}

/// Runs the scripted harness against a fresh trial; returns its captures.
async fn capture(proxy: &Proxy, base: &str, trial_id: &str, api: &str) -> Vec<Generation> {
    let (token, trial) = proxy.register_trial(trial_id);
    trial.push_script(script());
    let url = match api {
        "openai" => format!("{base}/t/{token}/v1"),
        _ => format!("{base}/t/{token}"),
    };
    let harness = root().join("tests/harness/scripted_harness.py");
    let api = api.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(harness)
            .args(["--api", &api, "--base-url", &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "harness failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["requests"], 5, "{summary}");
    assert_eq!(summary["side_requests"], 1);
    assert_eq!(summary["compactions"], 1);
    assert_eq!(summary["final"], "The tests pass now.");
    let gens = trial.generations();
    assert_eq!(gens.len(), 6);
    assert!(gens.iter().all(|g| g.status.as_deref() == Some("ok")), "{gens:?}");
    gens
}

pub(crate) fn trajectory(
    task: &str,
    sample: u32,
    generations: Vec<Generation>,
    reward: Option<f64>,
) -> Trajectory {
    Trajectory {
        reward,
        mode: Some("train".into()),
        ..Trajectory::new(task, 0, sample, "scripted", "embedded", generations)
    }
}

pub(crate) fn align(args: &[&str]) {
    let out = lego().arg("align").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "align {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn total(stats: &Path) -> AlignStats {
    let all: Vec<AlignStats> = read_all(stats, ReadOptions::default()).unwrap();
    let t = all.last().unwrap().clone();
    assert!(t.trajectory_id.is_none());
    t
}

#[tokio::test(flavor = "multi_thread")]
async fn scripted_harness_captures_align_token_exactly_and_replay_matches_the_trainer() {
    let chat = Arc::new(ChatFormat::from_model_dir(&tokenizer_dir()).unwrap());
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let mut cfg = ProxyConfig::default();
    cfg.sampling.seed = Some(11);
    let proxy = Proxy::new(chat, backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{addr}");
    let openai = capture(&proxy, &base, "calc/0/0", "openai").await;
    let anthropic = capture(&proxy, &base, "calc/0/1", "anthropic").await;

    let dir = tempfile::tempdir().unwrap();
    let traj_path = dir.path().join("trajectories.jsonl.zst");
    let trajs = vec![
        trajectory("calc", 0, openai, Some(1.0)),
        trajectory("calc", 1, anthropic, Some(0.0)),
    ];
    let mut w = AtomicWriter::create(&traj_path).unwrap();
    for t in &trajs {
        w.write(t).unwrap();
    }
    w.finish().unwrap();
    // scripts/bench/align.sh replicates these real captures into its benchmark input.
    if let Some(out) = std::env::var_os("LEGO_RL_ALIGN_SEED_OUT") {
        std::fs::copy(&traj_path, out).unwrap();
    }

    let p = |name: &str| dir.path().join(name);
    let s = |path: &Path| path.to_str().unwrap().to_string();
    let (traj, model) = (s(&traj_path), s(&tokenizer_dir()));
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("s1.jsonl.zst")),
        "--stats",
        &s(&p("st1.jsonl.zst")),
        "--model",
        &model,
        "-j",
        "1",
    ]);
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("s2.jsonl.zst")),
        "--stats",
        &s(&p("st2.jsonl.zst")),
        "--model",
        &model,
        "-j",
        "2",
    ]);
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("s3.jsonl.zst")),
        "--model",
        &model,
        "-j",
        "2",
    ]);
    // Deterministic: identical bytes for 1 and 2 threads and across runs.
    let bytes = |n: &str| std::fs::read(p(n)).unwrap();
    assert_eq!(bytes("s1.jsonl.zst"), bytes("s2.jsonl.zst"));
    assert_eq!(bytes("s2.jsonl.zst"), bytes("s3.jsonl.zst"));
    assert_eq!(bytes("st1.jsonl.zst"), bytes("st2.jsonl.zst"));

    // Also at a size where compression runs in several frames and -j splits the work into
    // many chunks (a regression: the compressor's threads once followed -j).
    let big = p("big.jsonl.zst");
    let mut w = AtomicWriter::create(&big).unwrap();
    for k in 0..300 {
        for t in &trajs {
            let mut t = t.clone();
            t.task_id = format!("calc-{k}");
            t.id = Trajectory::make_id(&t.task_id, 0, t.sample_index);
            w.write(&t).unwrap();
        }
    }
    w.finish().unwrap();
    align(&[
        "-i",
        &s(&big),
        "-o",
        &s(&p("b1.jsonl.zst")),
        "--model",
        &model,
        "-j",
        "1",
    ]);
    align(&[
        "-i",
        &s(&big),
        "-o",
        &s(&p("b2.jsonl.zst")),
        "--model",
        &model,
        "-j",
        "2",
    ]);
    assert_eq!(bytes("b1.jsonl.zst"), bytes("b2.jsonl.zst"));

    let samples: Vec<Sample> = read_all(&p("s1.jsonl.zst"), ReadOptions::default()).unwrap();
    let per_traj: Vec<AlignStats> = read_all(&p("st1.jsonl.zst"), ReadOptions::default()).unwrap();
    assert_eq!(per_traj.len(), 3);
    for (t, st) in trajs.iter().zip(&per_traj) {
        let api = &t.generations[0].api;
        assert_eq!(st.trajectory_id.as_deref(), Some(t.id.as_str()));
        // Main agent + the title side model; compaction split the main thread in two segments.
        assert_eq!(st.threads, 2, "{api}: {st:?}");
        assert_eq!(st.samples, 3, "{api}: {st:?}");
        assert_eq!(
            st.segment_breaks.get("history_rewritten"),
            Some(&1),
            "{api}: {st:?}"
        );
        assert_eq!(st.segment_breaks.len(), 1, "{api}: {st:?}");
        // Dropped by compaction: the two earliest calls and their results.
        assert_eq!(st.compacted_messages, 4, "{api}: {st:?}");
        // Every echoed call was re-serialized; the ids linked every one of them.
        assert_eq!(st.tool_call_mismatches, 3, "{api}: {st:?}");
        assert_eq!(st.mismatches_resolved_by_id, 3, "{api}: {st:?}");
        assert_eq!(
            (st.aligned_turns, st.dropped_turns, st.unlinked_assistant_messages),
            (6, 0, 0)
        );
        assert_eq!(st.token_exact_samples, 3);
        let policy: usize = t.generations.iter().map(|g| g.output_ids.len()).sum();
        assert_eq!(st.policy_tokens, policy as u64);

        let mine: Vec<&Sample> = samples.iter().filter(|s| s.trajectory_id == t.id).collect();
        let ids: Vec<(u32, u32, Value)> = mine
            .iter()
            .map(|s| (s.thread, s.segment, s.metadata["generations"].clone()))
            .collect();
        assert_eq!(
            ids,
            vec![
                (1, 0, serde_json::json!([2])),
                (0, 0, serde_json::json!([0, 1, 3])),
                (0, 1, serde_json::json!([4, 5])),
            ],
            "{api}"
        );
        for s in &mine {
            assert_eq!((s.reward, s.weight, s.group_id), (t.reward.unwrap(), 1.0, 0));
            let mask = s.loss_mask.to_dense();
            assert_eq!(mask.len(), s.token_ids.len());
            // Loss-mask positions hold exactly the captured outputs, in order, and their log-probs.
            let mut want_tokens = Vec::new();
            let mut want_lps = Vec::new();
            for k in s.metadata["trained"].as_array().unwrap() {
                let g = &t.generations[k.as_u64().unwrap() as usize];
                let at = g.prompt_ids.len();
                assert_eq!(&s.token_ids[at..at + g.output_ids.len()], &g.output_ids[..]);
                assert!(mask[at..at + g.output_ids.len()].iter().all(|&m| m));
                want_tokens.extend_from_slice(&g.output_ids);
                want_lps.extend(g.logprobs.to_f32().unwrap());
            }
            let got: Vec<u32> = s
                .token_ids
                .iter()
                .zip(&mask)
                .filter(|(_, &m)| m)
                .map(|(&t, _)| t)
                .collect();
            assert_eq!(got, want_tokens);
            assert_eq!(s.rollout_logprobs.to_f32().unwrap(), want_lps);
            // Every engine prompt on the path is a prefix of the sample (token-exact).
            for k in s.metadata["generations"].as_array().unwrap() {
                let g = &t.generations[k.as_u64().unwrap() as usize];
                assert_eq!(&s.token_ids[..g.prompt_ids.len()], &g.prompt_ids[..]);
            }
            let r = s.routing.as_ref().expect("routing for every position");
            assert_eq!(r.shape, vec![s.token_ids.len() - 1, 2, 2]);
        }
    }
    let all = total(&p("st1.jsonl.zst"));
    assert_eq!(
        (all.trajectories, all.samples, all.tool_call_mismatches),
        (2, 6, 6)
    );

    // Loose matching normalizes the re-serialized arguments: no mismatch left, same samples.
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("loose.jsonl.zst")),
        "--stats",
        &s(&p("lst.jsonl.zst")),
        "--model",
        &model,
        "--match",
        "loose-tool-args",
    ]);
    let loose = total(&p("lst.jsonl.zst"));
    assert_eq!((loose.tool_call_mismatches, loose.samples), (0, 6));
    // Content-only ignores ids: the re-serialized echoes cannot be linked, so every turn after a
    // call starts a new segment; nothing is guessed and no policy token is lost.
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("co.jsonl.zst")),
        "--stats",
        &s(&p("cst.jsonl.zst")),
        "--model",
        &model,
        "--match",
        "content-only",
    ]);
    let co = total(&p("cst.jsonl.zst"));
    assert_eq!(co.mismatches_resolved_by_id, 0);
    assert!(co.tool_call_mismatches >= 6, "{co:?}");
    assert!(co.samples > 6, "{co:?}");
    assert_eq!(co.policy_tokens, all.policy_tokens);
    // Without the tokenizer, calls link by id and text turns by the proxy's splice: same samples.
    align(&[
        "-i",
        &traj,
        "-o",
        &s(&p("nomodel.jsonl.zst")),
        "--stats",
        &s(&p("nst.jsonl.zst")),
    ]);
    let nomodel: Vec<Sample> = read_all(&p("nomodel.jsonl.zst"), ReadOptions::default()).unwrap();
    assert_eq!(nomodel, samples);
    assert_eq!(total(&p("nst.jsonl.zst")).tool_call_mismatches, 0);

    // The trainer's π_old pass (packed sequences, replayed routing) reproduces the rollout
    // log-probs of every policy token. Tolerance 1e-4: decode-time (KV cache) vs one packed
    // forward in f32 on CPU.
    eprintln!("align totals: {}", serde_json::to_string(&all).unwrap());
    assert_trainer_reproduces_rollout(
        &crate::model::tiny_moe(),
        &samples,
        &p("s1.jsonl.zst"),
        all.policy_tokens,
    );
}

/// The trainer's π_old pass over `samples` (packed sequences, replayed routing) covers
/// `policy_tokens` tokens and reproduces every rollout log-prob within 1e-4 (KV-cache decode vs
/// one packed forward in f32 on CPU); its own router agrees with the recorded routing.
pub(crate) fn assert_trainer_reproduces_rollout(
    model: &Path,
    samples: &[Sample],
    out: &Path,
    policy_tokens: u64,
) {
    let mut trainer = Trainer::load(model, Device::Cpu, None).unwrap();
    let metrics = trainer.step(samples, out, &Settings::default()).unwrap();
    assert_eq!(metrics.policy_tokens, policy_tokens);
    let diff = metrics.logprob_max_abs_diff.unwrap();
    eprintln!(
        "trainer vs rollout: max |Δ logprob| = {diff:e}, expert overlap {:?}",
        metrics.expert_overlap
    );
    assert!(diff < 1e-4, "trainer vs rollout log-probs differ by {diff}");
    assert!(
        metrics.expert_overlap.unwrap() >= 0.99,
        "{:?}",
        metrics.expert_overlap
    );
}

#[test]
fn bad_trajectories_are_errors_naming_file_record_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let good = serde_json::json!({"schema": "lego-rl/trajectory/v1", "id": "a/0/0", "task_id": "a", "group_id": 0,
        "sample_index": 0, "harness": "h", "backend": "b", "policy_version": 0, "termination": "finished",
        "infra_failure": false, "reward": 1.0, "generations": []});
    let mut bad = good.clone();
    bad["id"] = "a/0/1".into();
    bad["generations"] = serde_json::json!([{"index": 0, "api": "openai", "request": {"messages": []},
        "prompt_ids": [1], "output_ids": [2, 3], "logprobs": {"dtype": "f32", "shape": [1], "data": "AACAvw=="},
        "status": "ok"}]);
    std::fs::write(&path, format!("{good}\n{bad}\n")).unwrap();
    let out = lego()
        .args([
            "align",
            "-i",
            path.to_str().unwrap(),
            "-o",
            dir.path().join("s.jsonl.zst").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("bad.jsonl: trajectory record 2: trajectory `a/0/1`: generations[0] (index 0): `logprobs`: 1 values for 2 output tokens"),
        "{err}"
    );
    // Nothing was left under the output name.
    assert!(!dir.path().join("s.jsonl.zst").exists());
    // A file of another record kind is refused with the schema it holds (strict reading).
    let stats = dir.path().join("stats.jsonl");
    std::fs::write(&stats, "{\"schema\": \"lego-rl/align-stats/v1\"}\n").unwrap();
    let out = lego()
        .args(["--strict", "align", "-i", stats.to_str().unwrap(), "-o"])
        .arg(dir.path().join("s2.jsonl.zst"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("stats.jsonl: record 1: expected a `lego-rl/trajectory/v1` record, found `lego-rl/align-stats/v1`"),
        "{err}"
    );
}
