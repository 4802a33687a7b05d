//! The whole loop on the tiny model: `scripts/loop.sh` for 2 steps (real Docker, the real
//! mini-swe-agent harness, the embedded engine with scripted continuations), asserting every stage's
//! output; the Slurm examples run through a fake `sbatch` that executes the jobs locally, on the
//! tiny Qwen3.5 (its chat template, XML tool calls, the hybrid engine and trainer, validate's gates);
//! Qwen3.5's chat format through the proxy, align and replay without Docker; the demo's model choice.

use std::path::{Path, PathBuf};
use std::process::Command;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{AlignStats, Sample, StepMetrics, Task, Trajectory, ValidationReport};

use crate::common::{docker_available, lego, root};

fn read<T: lego_rl::records::Record>(p: &Path) -> Vec<T> {
    read_all(p, ReadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Tasks with absolute paths (filter-tasks output) restricted to those with scripted continuations
/// (`forced`, under testdata/rollout), plus the images and the harness runtime: what loop.sh needs.
fn prepare(run: &Path, forced: &str) -> (PathBuf, PathBuf, PathBuf) {
    let forced = root().join("testdata/rollout").join(forced);
    let kept = run.join("tasks.kept.jsonl.zst");
    lego()
        .args(["filter-tasks", "-i"])
        .arg(root().join("testdata/tasks/tasks.jsonl"))
        .arg("-o")
        .arg(&kept)
        .assert()
        .success();
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&forced).expect("forced file")).expect("json");
    let ids = ids["tasks"].as_object().expect("tasks").clone();
    let tasks: Vec<Task> = read::<Task>(&kept)
        .into_iter()
        .filter(|t| ids.contains_key(&t.id))
        .collect();
    assert!(!tasks.is_empty(), "no kept task has a forced script");
    let train = run.join("tasks.train.jsonl");
    let text: String = tasks
        .iter()
        .map(|t| serde_json::to_string(t).expect("json") + "\n")
        .collect();
    std::fs::write(&train, text).expect("write tasks");
    let images = run.join("images.jsonl.zst");
    lego()
        .args(["build-images", "-i"])
        .arg(&train)
        .arg("-o")
        .arg(&images)
        .arg("--harness")
        .arg(root().join("examples/harnesses/mini-swe-agent.toml"))
        .assert()
        .success();
    (train, images, forced)
}

#[test]
fn two_steps_of_the_loop_on_the_tiny_model() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("mkdir");
    let (tasks, images, forced) = prepare(&run, "inflection.json");
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let out = crate::common::script("scripts/loop.sh")
        .env("LEGO_RL_BIN", &bin)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .args(["--run"])
        .arg(&run)
        .arg("--tasks")
        .arg(&tasks)
        .arg("--images")
        .arg(&images)
        .arg("--checkpoint")
        .arg(crate::model::tiny_moe())
        .args(["--steps", "2", "--group-size", "4", "--concurrency", "2"])
        .arg("--rollout-args")
        .arg(format!("--forced {} --max-turns 6", forced.display()))
        // TIS at its cap of 2 changes nothing this close to on-policy; it records the spread of
        // log(π_old/π_rollout) that the stale batch below is compared with.
        .args(["--train-args", "--is-correction tis"])
        .output()
        .expect("loop.sh runs");
    let log = std::fs::read_to_string(run.join("logs/rollout.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "loop.sh failed:\n{}\nrollout log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in 0..2 {
        let name = format!("step-{step:06}");
        let trajs: Vec<Trajectory> = read(&run.join(format!("trajectories/{name}.jsonl.zst")));
        assert_eq!(trajs.len(), 4, "one group of 4 per step");
        assert!(trajs.iter().all(|t| t.schema == "lego-rl/trajectory/v1"));
        assert!(
            trajs.iter().all(|t| !t.infra_failure && t.reward.is_some()),
            "every trial graded: {:?}",
            trajs
                .iter()
                .map(|t| (&t.termination, t.reward))
                .collect::<Vec<_>>()
        );
        // The prefix cache (on by default) served the group's shared first prompt and each
        // trial's earlier turns; the Pearson bound below holds for the captures it gave.
        let (prompt, cached) = trajs.iter().fold((0, 0), |(p, c), t| {
            let m = &t.metadata["prefix_cache"];
            (
                p + m["prompt_tokens"].as_u64().expect("metadata.prefix_cache"),
                c + m["cached_tokens"].as_u64().expect("metadata.prefix_cache"),
            )
        });
        assert!(
            cached * 2 > prompt,
            "{cached} of {prompt} prompt tokens from the cache"
        );
        let rewards: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        assert!(
            rewards.contains(&1.0) && rewards.contains(&0.0),
            "the scripted group has mixed rewards: {rewards:?}"
        );
        let samples: Vec<Sample> = read(&run.join(format!("samples/{name}.jsonl.zst")));
        assert!(!samples.is_empty());
        // loop.sh runs align without --model: it decoded every capture with the tokenizer the
        // trajectories name, so the statistics the gates read are exact.
        let stats: Vec<AlignStats> = read(&run.join(format!("align-stats/{name}.jsonl.zst")));
        let total = stats.last().expect("align-stats total");
        assert!(total.trajectory_id.is_none() && total.trajectories == 4);
        assert_eq!(total.without_tokenizer, 0, "{total:?}");
        for s in &samples {
            assert_eq!(s.loss_mask.len(), s.token_ids.len(), "{}", s.id);
            assert!(s.loss_mask.count_ones() > 0, "{}", s.id);
        }
        assert!(run
            .join(format!("checkpoints/step-{:06}/config.json", step + 1))
            .is_file());
    }
    let metrics: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let r = m.logprob_pearson.expect("rollout/trainer log-prob correlation");
        assert!(r >= 0.99, "log-prob Pearson {r} < 0.99 with routing replay");
        assert!(m.loss.is_finite());
    }
    let reports: Vec<ValidationReport> = read(&run.join("validation.jsonl.zst"));
    assert!(reports.iter().all(|r| r.passed), "gates passed");
    // The new checkpoint loads (the embedded engine reads it back).
    lego_rl::model::Model::load(&run.join("checkpoints/step-000002"), tch::Device::Cpu, None)
        .expect("the trained checkpoint loads");
    let html = std::fs::read_to_string(run.join("report/index.html")).expect("report");
    assert!(
        html.contains("inflection__ordinal-teens"),
        "report lists the task"
    );
    // The run-health advisories stay quiet on a healthy run (mixed rewards, no truncation, no
    // infra failures or audit events, Pearson ≈ 1, two steps: no trend yet).
    let adv: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report/advisories.json")).expect("advisories.json"))
            .unwrap();
    assert_eq!(adv["advisories"], serde_json::json!([]), "{adv:#}");
    summarize_the_demo_run(&run);
    a_stale_batch_trains_with_the_correction(&run, &tasks, &images);
}

/// `loop.sh --max-staleness 2` resumed for a third step whose batch checkpoint 0 sampled: batch
/// 0's trajectories, which step-000000 rolled out, stand in as batch 2 (a rollout that outran the
/// trainer by two steps, which the run's timing cannot produce on demand). The step trains it
/// from checkpoint 2 with the token mask on, at bounds the fresh batch of step 1 stays well
/// inside: the stale batch's log-ratio spread grows, the mask drops tokens, and the staleness is
/// 2 for every token (metrics, validate's gate, the report).
fn a_stale_batch_trains_with_the_correction(run: &Path, tasks: &Path, images: &Path) {
    let traj = |s: u64| run.join(format!("trajectories/step-{s:06}.jsonl.zst"));
    std::fs::copy(traj(0), traj(2)).expect("copy batch 0");
    std::fs::write(run.join("trajectories/step-000002.jsonl.zst.done"), "").expect("done");
    let before: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    let fresh = &before[0];
    assert_eq!(fresh.is_correction.as_deref(), Some("tis"));
    assert_eq!(
        fresh.staleness_histogram,
        vec![fresh.policy_tokens],
        "step 1: batch 0, checkpoint 0"
    );
    assert_eq!(fresh.staleness_mean, Some(0.0));
    let spread = |m: &StepMetrics| {
        let (lo, hi) = (
            m.is_log_ratio_min.expect("is_log_ratio_min"),
            m.is_log_ratio_max.expect("is_log_ratio_max"),
        );
        lo.abs().max(hi.abs())
    };
    // Bounds 4× the fresh batch's largest |log ρ| (and never tighter than float noise).
    let bound = (4.0 * spread(fresh)).max(1e-5);
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let out = crate::common::script("scripts/loop.sh")
        .env("LEGO_RL_BIN", &bin)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .arg("--run")
        .arg(run)
        .arg("--tasks")
        .arg(tasks)
        .arg("--images")
        .arg(images)
        .args(["--steps", "3", "--max-staleness", "2", "--validate-every", "1000"])
        .arg("--train-args")
        .arg(format!(
            "--is-correction token-mask --is-mask-low {} --is-mask-high {}",
            (-bound).exp(),
            bound.exp()
        ))
        .output()
        .expect("loop.sh runs");
    assert!(
        out.status.success(),
        "loop.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    assert_eq!(metrics.len(), 3, "only the third step ran");
    let stale = &metrics[2];
    assert_eq!((stale.step, stale.staleness_max), (3, Some(2)));
    assert_eq!(stale.staleness_histogram, vec![0, 0, stale.policy_tokens]);
    assert_eq!(stale.staleness_mean, Some(2.0));
    assert_eq!(stale.policy_tokens, fresh.policy_tokens, "the same trajectories");
    assert!(
        spread(stale) > bound && stale.is_log_ratio_std > fresh.is_log_ratio_std,
        "two updates moved the policy: |log ρ| up to {} (fresh: {}), std {:?} (fresh: {:?})",
        spread(stale),
        spread(fresh),
        stale.is_log_ratio_std,
        fresh.is_log_ratio_std
    );
    let masked = stale.is_masked_token_fraction.expect("is_masked_token_fraction");
    eprintln!(
        "stale batch: max |log ρ| {:.2e} (fresh {:.2e}), std {:?} (fresh {:?}), bound {bound:.2e}, masked {masked:.3}",
        spread(stale),
        spread(fresh),
        stale.is_log_ratio_std,
        fresh.is_log_ratio_std
    );
    assert!(masked > 0.0, "the mask dropped tokens beyond exp(±{bound:.2e})");
    let out = lego().arg("validate").arg(run).output().expect("validate runs");
    let reports: Vec<ValidationReport> = read(&run.join("validation.jsonl.zst"));
    let last = reports.last().expect("a validation report");
    assert_eq!(last.step, Some(3), "{out:?}");
    let gate = |name: &str| {
        last.gates
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("gate {name}"))
    };
    assert_eq!(
        (gate("staleness_max").value, gate("staleness_max").passed),
        (Some(2.0), true)
    );
    assert_eq!(gate("is_masked_token_fraction").value, Some(masked));
    let csv = std::fs::read_to_string(run.join("report/staleness.csv")).expect("staleness.csv");
    assert!(csv.contains(&format!("\n3,2,{}\n", stale.policy_tokens)), "{csv}");
}

/// `report --summarize` on the demo run with the embedded assistant (the tiny policy: its causes
/// are noise, the path is real): every failed trial is visited once, and every example link of
/// diagnosis.md opens a trajectory embedded in the page.
fn summarize_the_demo_run(run: &Path) {
    let mut failed: Vec<String> = (0..2)
        .flat_map(|step| read::<Trajectory>(&run.join(format!("trajectories/step-{step:06}.jsonl.zst"))))
        .filter(|t| t.is_infra_failure() || t.reward.is_none_or(|r| r < 0.5))
        .map(|t| t.id)
        .collect();
    failed.sort();
    let out = run.join("report");
    let o = lego()
        .arg("report")
        .arg(run)
        .arg("-o")
        .arg(&out)
        .args(["--summarize", "--assistant-max-tokens", "16"])
        .arg(format!(
            "--assistant=embedded:{}",
            crate::model::tiny_moe().display()
        ))
        .arg(format!(
            "--assistant-chat-model={}",
            crate::rollout::chat_dir().display()
        ))
        .output()
        .expect("report runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut rows = csv::Reader::from_path(out.join("diagnosis.csv")).expect("diagnosis.csv");
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    let mut ids: Vec<String> = rows.iter().map(|r| r[0].to_string()).collect();
    ids.sort();
    assert_eq!(ids, failed, "every failed trial exactly once");
    assert!(
        rows.iter().all(|r| &r[6] == "true"),
        "every request answered: {rows:?}"
    );
    let md = std::fs::read_to_string(out.join("diagnosis.md")).expect("diagnosis.md");
    let html = std::fs::read_to_string(out.join("index.html")).expect("index.html");
    let links: Vec<&str> = md
        .split("](index.html#traj=")
        .skip(1)
        .map(|l| &l[..l.find(')').unwrap()])
        .collect();
    assert!(!links.is_empty(), "{md}");
    for l in &links {
        let id = percent_decode(l);
        assert!(failed.contains(&id), "{id} is a failed trial");
        assert!(
            html.contains(&format!("\"{id}\":{{")),
            "{id} is embedded in the page"
        );
    }
    // And a link opens its trajectory in the browser.
    let Some(chrome) = crate::report::chromium() else {
        return;
    };
    let url = format!("file://{}#traj={}", out.join("index.html").display(), links[0]);
    let dom = crate::report::dump_dom(&chrome, &run.join("chrome-profile"), &url);
    let id = percent_decode(links[0]);
    assert!(
        dom.contains(&format!("id=\"detail-title\">Trajectory {id}")),
        "diagnosis.md's first link opens {id}"
    );
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Also the issue-27 pipeline on the paper's model family: `rollout --forced` through the proxy
/// with the Qwen3.5 template (reasoning, XML calls), align, a GSPO train-step with replay on the
/// hybrid model, then validate's gates — one run shared with the Slurm check.
#[test]
fn slurm_examples_run_through_a_fake_sbatch_on_the_tiny_qwen35() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("checkpoints")).expect("mkdir");
    let (tasks, images, forced) = prepare(&run, "inflection-qwen3.5.json");
    let ckpt = run.join("checkpoints/step-000000");
    let st = Command::new("cp")
        .arg("-r")
        .arg(crate::hybrid::tiny_qwen35())
        .arg(&ckpt)
        .status()
        .expect("cp");
    assert!(st.success());
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let shim = root().join("tests/slurm-shim");
    let state = dir.path().join("slurm");
    let path = format!("{}:{}", shim.display(), std::env::var("PATH").unwrap_or_default());
    let out = crate::common::script("examples/slurm/submit-step.sh")
        .arg("0")
        .env("PATH", path)
        .env("SLURM_SHIM_STATE", &state)
        .env("LEGO_RL", &bin)
        .env("LEGO_RL_NO_PROGRESS", "1")
        .env("RUN", &run)
        .env("TASKS", &tasks)
        .env("IMAGES", &images)
        .env("SHARDS", "2")
        .env("GROUP_SIZE", "2")
        .env("TRAIN_DEVICE", "cpu")
        .env("LEGO_RL_BACKEND", format!("embedded:{}", ckpt.display()))
        .env(
            "ROLLOUT_ARGS",
            format!("--forced {} --max-turns 6", forced.display()),
        )
        .output()
        .expect("submit-step.sh runs");
    let logs: String = std::fs::read_dir(&state)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "out"))
                .map(|e| {
                    format!(
                        "== {}\n{}",
                        e.path().display(),
                        std::fs::read_to_string(e.path()).unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        out.status.success(),
        "submit-step.sh failed: {}\n{logs}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rollout array"), "{stdout}");
    // Every job succeeded (the shim records exit statuses).
    for e in std::fs::read_dir(&state).expect("state").flatten() {
        if e.path().extension().is_some_and(|x| x == "status") {
            let s = std::fs::read_to_string(e.path()).expect("status");
            assert_eq!(s.trim(), "0", "{}: job failed\n{logs}", e.path().display());
        }
    }
    // The shards together cover the batch exactly once: one group of 2.
    let mut trajs: Vec<Trajectory> = Vec::new();
    for shard in 0..2 {
        let p = run.join(format!("trajectories/step-000000/shard-{shard}.jsonl.zst"));
        if p.exists() {
            trajs.extend(read::<Trajectory>(&p));
        }
    }
    assert_eq!(trajs.len(), 2, "{logs}");
    // Every scripted Qwen3.5 turn parsed: reasoning opened by the template, one XML call each,
    // the tool loop spliced on the captured tokens (no segment break).
    for t in &trajs {
        assert!(!t.infra_failure && t.reward.is_some(), "{:?}", t.termination);
        assert!(t.generations.len() >= 3, "{}", t.id);
        for g in &t.generations {
            assert_eq!(
                g.status.as_deref(),
                Some("ok"),
                "{} #{}: {:?}",
                t.id,
                g.index,
                g.extra
            );
            assert_eq!(g.tool_call_ids.len(), 1, "{} #{}", t.id, g.index);
        }
        assert!(t.metadata.get("malformed_tool_calls").is_none());
    }
    let rewards: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
    assert!(rewards.contains(&1.0) && rewards.contains(&0.0), "{rewards:?}");
    let samples: Vec<Sample> = read(&run.join("samples/step-000000.jsonl.zst"));
    assert_eq!(samples.len(), 2, "one segment per trajectory");
    let stats: Vec<AlignStats> = read(&run.join("align-stats/step-000000.jsonl.zst"));
    let total = stats.last().expect("align-stats total");
    assert_eq!(
        (
            total.dropped_turns,
            total.malformed_tool_calls,
            total.without_tokenizer
        ),
        (0, 0, 0),
        "{total:?}"
    );
    assert!(total.segment_breaks.is_empty(), "{total:?}");
    assert!(
        run.join("checkpoints/step-000001/config.json").is_file(),
        "{logs}"
    );
    let metrics: Vec<StepMetrics> = read(&run.join("metrics.jsonl.zst"));
    assert_eq!(metrics.len(), 1);
    let m = &metrics[0];
    assert_eq!(m.routing_replay, Some(true));
    assert!(m.logprob_pearson.expect("pearson") >= 0.999, "{m:?}");
    assert!(m.expert_overlap.expect("overlap") >= 0.99, "{m:?}");
    // train.sbatch ran validate after the step (a failed gate fails the job, checked above).
    let reports: Vec<ValidationReport> = read(&run.join("validation.jsonl.zst"));
    assert!(
        !reports.is_empty() && reports.iter().all(|r| r.passed),
        "{reports:?}"
    );
}

/// Qwen3.5's chat format through the real proxy in front of the embedded tiny Qwen3.5, without
/// Docker: a client runs a tool loop (reasoning, XML calls), makes one call to a tool the request
/// never declared, is told so in a new user message — after which the template drops every
/// earlier `<think>` block (verl#6854) — and goes on. The proxy splices inside the tool loops and
/// renders (new segment) after the new query; align counts that one break and the rejected call;
/// the trainer reproduces every rollout log-prob with routing replay.
#[tokio::test(flavor = "multi_thread")]
async fn qwen35_chat_format_through_the_proxy_align_and_replay() {
    use lego_rl::chat::ChatFormat;
    use lego_rl::engine::embedded::EmbeddedBackend;
    use lego_rl::io::AtomicWriter;
    use lego_rl::proxy::{Proxy, ProxyConfig};
    use lego_rl::records::PromptMode;
    use serde_json::{json, Value};
    use std::sync::Arc;

    let dir = crate::hybrid::tiny_qwen35();
    let chat = Arc::new(ChatFormat::from_model_dir(&dir).expect("the checkpoint's chat format"));
    let backend = Arc::new(EmbeddedBackend::start(&dir, tch::Device::Cpu).expect("engine"));
    let mut cfg = ProxyConfig::default();
    cfg.sampling.seed = Some(5);
    let proxy = Proxy::new(chat, backend, cfg);
    let (addr, _) = proxy
        .serve("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    let (token, trial) = proxy.register_trial("calc/0/0");
    let call = |thought: &str, name: &str, param: &str, value: &str| {
        format!("{thought}\n</think>\n\n<tool_call>\n<function={name}>\n<parameter={param}>\n{value}\n</parameter>\n</function>\n</tool_call>")
    };
    trial.push_script([
        call("List first.", "bash", "command", "ls"),
        call(
            "Python is quicker.",
            "python",
            "code",
            "print(open('calc.py').read())",
        ),
        call("Use bash then.", "bash", "command", "cat calc.py"),
        "It subtracts.\n</think>\n\nadd() subtracts; that is the bug.".to_string(),
    ]);
    let url = format!("http://{addr}/t/{token}/v1/chat/completions");
    let tools = json!([{"type": "function", "function": {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]);
    let client = reqwest::Client::new();
    let mut messages = vec![json!({"role": "user", "content": "Find the bug in calc.py."})];
    let mut answers: Vec<Value> = Vec::new();
    for (turn, next) in ["a.py calc.py", "", "def add(a, b): return a - b", ""]
        .into_iter()
        .enumerate()
    {
        let resp: Value = client
            .post(&url)
            .json(&json!({"messages": messages, "tools": tools}))
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        let msg = resp["choices"][0]["message"].clone();
        // An OpenAI client echoes the answer without its reasoning.
        let mut echo = json!({"role": "assistant", "content": msg["content"]});
        if let Some(calls) = msg.get("tool_calls").filter(|c| c.is_array()) {
            echo["tool_calls"] = calls.clone();
        }
        messages.push(echo);
        match (turn, msg["tool_calls"][0]["id"].as_str()) {
            (1, _) => {
                messages.push(json!({"role": "user", "content": "There is no `python` tool; use bash."}))
            }
            (_, Some(id)) => messages.push(json!({"role": "tool", "tool_call_id": id, "content": next})),
            _ => {}
        }
        answers.push(resp);
    }
    assert_eq!(answers[0]["choices"][0]["finish_reason"], "tool_calls");
    // The undeclared call comes back as text, not as a call the harness cannot run.
    let rejected = &answers[1]["choices"][0]["message"];
    assert!(
        rejected["tool_calls"].as_array().is_none_or(Vec::is_empty),
        "{rejected}"
    );
    assert!(
        rejected["content"]
            .as_str()
            .unwrap_or("")
            .contains("<function=python>"),
        "{rejected}"
    );
    assert_eq!(
        answers[3]["choices"][0]["message"]["content"],
        "add() subtracts; that is the bug."
    );
    let gens = trial.generations();
    assert_eq!(gens.len(), 4);
    assert_eq!(gens[1].status.as_deref(), Some("malformed_tool_call"));
    assert_eq!(gens[1].malformed_tool_calls(), 1);
    let modes: Vec<PromptMode> = gens.iter().map(|g| g.prompt_mode).collect();
    assert_eq!(
        modes,
        [
            PromptMode::Rendered,
            PromptMode::Faithful,
            PromptMode::Rendered,
            PromptMode::Faithful
        ],
        "{:?}",
        gens.iter().map(|g| &g.extra).collect::<Vec<_>>()
    );
    let joined =
        |g: &lego_rl::records::Generation| [g.prompt_ids.as_slice(), g.output_ids.as_slice()].concat();
    assert!(gens[1].prompt_ids.starts_with(&joined(&gens[0])));
    assert!(
        !gens[2].prompt_ids.starts_with(&joined(&gens[1])),
        "the think blocks are gone"
    );
    assert!(gens[3].prompt_ids.starts_with(&joined(&gens[2])));

    let tmp = tempfile::tempdir().expect("tmp");
    let p = |name: &str| tmp.path().join(name);
    let mut w = AtomicWriter::create(&p("traj.jsonl.zst")).expect("create");
    w.write(&crate::align::trajectory("calc", 0, gens, Some(1.0)))
        .expect("write");
    w.finish().expect("finish");
    let s = |path: &Path| path.to_str().expect("utf-8").to_string();
    crate::align::align(&[
        "-i",
        &s(&p("traj.jsonl.zst")),
        "-o",
        &s(&p("samples.jsonl.zst")),
        "--stats",
        &s(&p("stats.jsonl.zst")),
        "--model",
        &s(&dir),
    ]);
    let stats = crate::align::total(&p("stats.jsonl.zst"));
    assert_eq!(
        (
            stats.aligned_turns,
            stats.dropped_turns,
            stats.samples,
            stats.token_exact_samples
        ),
        (4, 0, 2, 2),
        "{stats:?}"
    );
    assert_eq!(stats.threads, 1, "{stats:?}");
    assert_eq!(
        stats.segment_breaks,
        [("prompt_not_token_continuation".to_string(), 1)].into(),
        "{stats:?}"
    );
    assert_eq!(stats.malformed_tool_calls, 1, "{stats:?}");
    assert_eq!(stats.tool_call_mismatches, 0, "{stats:?}");
    let samples: Vec<Sample> = read(&p("samples.jsonl.zst"));
    crate::align::assert_trainer_reproduces_rollout(&dir, &samples, &p("step-1"), stats.policy_tokens);
}

/// `LEGO_RL_MODEL` picks the demo's policy and the scripted outputs in its chat format, and
/// `LEGO_RL_HARNESS=a,b` two harnesses with a script each (the full demo is the loop
/// `two_steps_of_the_loop_on_the_tiny_model` runs; this only checks the choice).
#[test]
fn demo_honours_lego_rl_model() {
    let demo = |model: Option<&str>| {
        let mut c = Command::new(root().join("scripts/demo.sh"));
        c.arg("--dry-run").env_remove("LEGO_RL_FORCED");
        match model {
            Some(m) => c.env("LEGO_RL_MODEL", m),
            None => c.env_remove("LEGO_RL_MODEL"),
        };
        let out = c.output().expect("demo.sh runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let gen = root().join("testdata/models/generated");
    let (code, err) = demo(None);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("model {}", gen.join("tiny-qwen3-moe").display())),
        "{err}"
    );
    assert!(err.contains("testdata/rollout/inflection.json"), "{err}");
    let (code, err) = demo(Some("tiny-qwen3.5-moe"));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("model {}", gen.join("tiny-qwen3.5-moe").display())),
        "{err}"
    );
    assert!(err.contains("testdata/rollout/inflection-qwen3.5.json"), "{err}");
    // Two harnesses: each with its own scripted continuations, a group split across them.
    let out = Command::new(root().join("scripts/demo.sh"))
        .arg("--dry-run")
        .env_remove("LEGO_RL_FORCED")
        .env_remove("LEGO_RL_MODEL")
        .env_remove("LEGO_RL_HARNESS_MIX")
        .env("LEGO_RL_HARNESS", "mini-swe-agent,openhands-sdk")
        .output()
        .expect("demo.sh runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("harnesses mini-swe-agent openhands-sdk (--harness-mix sample)")
            && err.contains("--forced ")
            && err.contains("testdata/rollout/inflection.json --forced ")
            && err.contains("testdata/rollout/inflection-openhands-sdk.json")
            && err.contains("through a 40960-position view"),
        "{err}"
    );
    let (_, err) = demo(None);
    assert!(!err.contains("position view"), "mini-swe-agent alone fits: {err}");
    let (code, err) = demo(Some("qwen9"));
    assert_eq!(code, Some(2));
    assert!(
        err.contains("LEGO_RL_MODEL=qwen9") && err.contains("tiny-qwen3.5-moe"),
        "{err}"
    );
}
