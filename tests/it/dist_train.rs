//! train-step on 2 Gloo ranks (`--nproc-per-node 2`, or ranks started by hand) against one
//! process on the same samples and checkpoint: the same update (fp32, weights within 1e-6) for the
//! dense and the MoE model with routing replay, `--zero 0` and `--zero 1`; resume of sharded
//! optimizer state; and a rank that dies or cannot reach the store failing the step cleanly.
//!
//! Every run here uses one intra-op thread per process (`OMP_NUM_THREADS=1`) and lr 1e-4. fp32
//! sums in another order (2 ranks' gradients added after, not during, accumulation; or simply 2
//! threads instead of 1 in one process) differ by a few ulps, and AdamW's m/(√v + ε) turns that
//! into update differences of up to lr·Δg/ε where |g| ≲ ε: on the tiny MoE one process with 1 vs 2
//! threads already differs by 4.8e-6 at lr 1e-3. At lr 1e-4 that noise is ~1e-7 while every update
//! is ~1e-4, so the 1e-6 bound still catches a gradient a rank left out (≥ 1e-5).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lego_rl::model::Model;
use lego_rl::records::StepMetrics;
use tch::{Device, Tensor};

use crate::common::{lego, python};
use crate::dist::free_port;
use crate::model::{seq_logprobs, tiny_dense, tiny_moe};
use crate::train::{moe_samples, read_metrics, write_samples};

/// Micro-batches of 40 tokens (segments and trajectories split over them), lr 1e-4 (see above).
const OPTS: [&str; 6] = [
    "--micro-batch-tokens",
    "40",
    "--lr",
    "1e-4",
    "--warmup-steps",
    "2",
];

/// `lego-rl train-step` from `ckpt` on `input` into `out` with [`OPTS`] and `extra`.
fn train_step(ckpt: &Path, input: &Path, out: &Path, metrics: &Path, extra: &[&str]) -> Output {
    run_train_step(&OPTS, ckpt, input, out, metrics, extra)
}

/// `lego-rl train-step` on `ckpt` and `input` into `out` and `metrics`, one intra-op thread per
/// process, with `opts` then `extra` (also the runner of tests/it/dist_ep.rs).
pub fn run_train_step(
    opts: &[&str],
    ckpt: &Path,
    input: &Path,
    out: &Path,
    metrics: &Path,
    extra: &[&str],
) -> Output {
    lego()
        .env("OMP_NUM_THREADS", "1")
        .args(["train-step", "--checkpoint"])
        .arg(ckpt)
        .arg("-i")
        .arg(input)
        .arg("--out")
        .arg(out)
        .arg("--metrics")
        .arg(metrics)
        .args(opts)
        .args(extra)
        .output()
        .unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Max |Δ| over all tensors of two checkpoints (same names required).
fn max_weight_diff(a: &Path, b: &Path) -> f64 {
    let read = |p: &Path| {
        let mut v = Tensor::read_safetensors(p.join("model.safetensors")).unwrap();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let (a, b) = (read(a), read(b));
    assert_eq!(a.len(), b.len());
    let mut max = 0f64;
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        max = max.max((ta - tb).abs().max().double_value(&[]));
    }
    max
}

fn close(a: Option<f64>, b: Option<f64>, what: &str) {
    match (a, b) {
        (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{what}: {a} vs {b}"),
        (a, b) => assert_eq!(a, b, "{what}"),
    }
}

/// Every metric of the update agrees with one process's (the run's seconds excepted).
fn same_metrics(one: &StepMetrics, two: &StepMetrics) {
    close(Some(one.loss), Some(two.loss), "loss");
    close(Some(one.lr), Some(two.lr), "lr");
    close(one.grad_norm, two.grad_norm, "grad_norm");
    close(one.ratio_mean, two.ratio_mean, "ratio_mean");
    close(one.ratio_min, two.ratio_min, "ratio_min");
    close(one.ratio_max, two.ratio_max, "ratio_max");
    close(one.clip_fraction, two.clip_fraction, "clip_fraction");
    close(one.entropy, two.entropy, "entropy");
    close(one.logprob_pearson, two.logprob_pearson, "logprob_pearson");
    close(
        one.logprob_max_abs_diff,
        two.logprob_max_abs_diff,
        "logprob_max_abs_diff",
    );
    close(one.logprob_kl, two.logprob_kl, "logprob_kl");
    close(one.expert_overlap, two.expert_overlap, "expert_overlap");
    close(one.reward_mean, two.reward_mean, "reward_mean");
    assert_eq!(
        (
            one.step,
            one.groups,
            one.valid_trajectories,
            one.samples,
            one.policy_tokens
        ),
        (
            two.step,
            two.groups,
            two.valid_trajectories,
            two.samples,
            two.policy_tokens
        )
    );
}

fn extra(m: &StepMetrics, key: &str) -> u64 {
    m.extra[key]
        .as_u64()
        .unwrap_or_else(|| panic!("metrics extra `{key}`"))
}

#[test]
fn two_ranks_make_the_update_of_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    // Dense: one update. MoE (routing recorded and replayed): two updates (one per group, both
    // with a learning signal), so the second is scored on the ranks' shards after the first.
    // 5 trajectories (odd), one of them in two segments, over micro-batches of 40 tokens.
    for (name, ckpt, extra_opts) in [
        ("dense", tiny_dense(), &[][..]),
        ("moe", tiny_moe(), &["--updates", "2"][..]),
    ] {
        let model = Model::load(&ckpt, Device::Cpu, None).unwrap();
        let input = tmp.path().join(format!("{name}.jsonl.zst"));
        let mut samples = moe_samples(&model);
        assert_eq!(samples[4].trajectory_id, "e");
        samples[4].reward = 0.0;
        write_samples(&input, &samples);
        drop(model);
        let run = |tag: &str, opts: &[&str]| {
            let out = tmp.path().join(format!("{name}-{tag}"));
            let metrics = tmp.path().join(format!("{name}-{tag}.metrics.jsonl.zst"));
            let all: Vec<&str> = extra_opts.iter().chain(opts).copied().collect();
            ok(
                &train_step(&ckpt, &input, &out, &metrics, &all),
                &format!("{name} {tag}"),
            );
            (out, read_metrics(&metrics).remove(0))
        };
        let (one, m1) = run("1rank", &[]);
        assert_eq!((extra(&m1, "world_size"), extra(&m1, "zero")), (1, 0));
        let moved = max_weight_diff(&ckpt, &one);
        assert!(
            moved > 1e-5,
            "{name}: the update moved the weights by only {moved}"
        );
        for zero in ["0", "1"] {
            let (two, m2) = run(
                &format!("2ranks-zero{zero}"),
                &["--nproc-per-node", "2", "--zero", zero],
            );
            let d = max_weight_diff(&one, &two);
            eprintln!("{name} --zero {zero}: max |Δweight| 2 ranks vs 1 = {d:e}");
            assert!(d <= 1e-6, "{name} --zero {zero}: weights differ by {d}");
            same_metrics(&m1, &m2);
            assert_eq!(extra(&m2, "world_size"), 2);
            let ratio =
                extra(&m2, "optimizer_state_bytes") as f64 / extra(&m1, "optimizer_state_bytes") as f64;
            if zero == "1" {
                assert!(
                    ratio <= 0.55,
                    "{name}: ZeRO-1 optimizer state per rank is {ratio} of one process's"
                );
                assert!(two
                    .join("optimizer/all/slice-00001-of-00002.safetensors")
                    .is_file());
            } else {
                assert_eq!(ratio, 1.0);
                assert!(two
                    .join("optimizer/all/slice-00000-of-00001.safetensors")
                    .is_file());
            }
        }
    }
}

#[test]
fn two_rank_zero1_resumes_like_one_process_and_loads_in_transformers() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let batch1 = moe_samples(&model);
    let mut batch2 = batch1.clone();
    for (i, s) in batch2.iter_mut().enumerate() {
        s.reward = (i % 2) as f64;
        s.weight = 1.0;
    }
    batch2[5].reward = batch2[0].reward;
    drop(model);
    let tmp = tempfile::tempdir().unwrap();
    let (in1, in2) = (tmp.path().join("b1.jsonl.zst"), tmp.path().join("b2.jsonl.zst"));
    write_samples(&in1, &batch1);
    write_samples(&in2, &batch2);
    let metrics = tmp.path().join("m.jsonl.zst");
    // One process, two invocations (which equal two steps in one process: tests/it/train.rs).
    let ref1 = tmp.path().join("ref-1");
    let ref2 = tmp.path().join("ref-2");
    ok(
        &train_step(&tiny_moe(), &in1, &ref1, &tmp.path().join("r.jsonl.zst"), &[]),
        "reference step 1",
    );
    ok(
        &train_step(&ref1, &in2, &ref2, &tmp.path().join("r.jsonl.zst"), &[]),
        "reference step 2",
    );
    let two = ["--nproc-per-node", "2", "--zero", "1"];
    let s1 = tmp.path().join("step-1");
    ok(&train_step(&tiny_moe(), &in1, &s1, &metrics, &two), "step 1");
    assert!(
        s1.join("optimizer/all/group.json").is_file()
            && !s1.join("optimizer/all/slice-00000-of-00001.safetensors").exists()
    );
    // Another world size stops before any compute, saying why.
    let bad = tmp.path().join("step-2-one-rank");
    let o = train_step(&s1, &in2, &bad, &metrics, &["--zero", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("saved by 2 ranks with --zero 1, this run has 1"),
        "{err}"
    );
    assert!(!bad.exists());
    let s2 = tmp.path().join("step-2");
    ok(&train_step(&s1, &in2, &s2, &metrics, &two), "step 2");
    let resumed = Model::load(&s2, Device::Cpu, None).unwrap();
    let max = max_weight_diff(&ref2, &s2);
    eprintln!("2 × 2-rank ZeRO-1 invocations vs 2 one-process steps: max |Δweight| {max:e}");
    assert!(max <= 1e-6, "weights differ by {max}");
    assert_eq!(
        read_metrics(&metrics).len(),
        2,
        "rank 0 alone appends the metrics"
    );

    // transformers loads the 2-rank checkpoint and computes what we compute.
    let ids: Vec<i64> = (0..20).map(|t| t * 7919 % 151643).collect();
    let ids_json = tmp.path().join("ids.json");
    let req = serde_json::json!({"sequences": [{"name": "s", "input_ids": ids}]});
    std::fs::write(&ids_json, req.to_string()).unwrap();
    let hf_out = tmp.path().join("hf.json");
    let status = Command::new(python())
        .arg(crate::common::root().join("scripts/hf_reference.py"))
        .arg(&s2)
        .arg(&ids_json)
        .arg(&hf_out)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "transformers failed to load the 2-rank checkpoint"
    );
    let hf: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&hf_out).unwrap()).unwrap();
    let theirs: Vec<f64> = hf["sequences"][0]["next_token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let (ours, _, _) = seq_logprobs(&resumed.lm, &ids, None);
    let d = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(d < 1e-4, "transformers vs lego-rl log-probs |Δ| {d}");
}

/// One rank of a 2-rank train-step started by hand (torchrun's variables).
fn rank(r: usize, port: u16, input: &Path, out: &Path, timeout: &str) -> Command {
    // (OPTS and the thread count do not matter here: these steps must not finish.)
    let mut c = crate::common::lego_process();
    c.args(["-v", "train-step", "--checkpoint"])
        .arg(tiny_moe())
        .arg("-i")
        .arg(input)
        .arg("--out")
        .arg(out)
        .args(OPTS)
        .args(["--dist-timeout", timeout])
        .env("NO_COLOR", "1")
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn a_dead_rank_or_a_wrong_port_fails_the_step_and_writes_nothing() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(&input, &moe_samples(&model));
    drop(model);
    let out = tmp.path().join("out");
    // Rank 1 is killed once the group is formed; rank 0 must fail (fast: Gloo sees the closed
    // connection) with an error naming itself and the collective.
    let port = free_port();
    let r0 = rank(0, port, &input, &out, "60").spawn().unwrap();
    let mut r1 = rank(1, port, &input, &out, "60").spawn().unwrap();
    let mut lines = BufReader::new(r1.stderr.take().unwrap()).lines();
    let joined = lines.any(|l| l.unwrap().contains("joined the process group"));
    assert!(joined, "rank 1 never joined");
    r1.kill().unwrap();
    r1.wait().unwrap();
    let o = r0.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("lego-rl: error: rank 0 of 2: "), "{err}");
    assert!(!out.exists(), "--out untouched");
    assert_eq!(
        leftovers(tmp.path()),
        vec![input.clone()],
        "no staging directory left"
    );

    // Nobody serves the store at MASTER_PORT: a clear error after --dist-timeout, not a hang.
    let o = rank(1, free_port(), &input, &out, "3").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lego-rl: error: rank 1 of 2: rendezvous at 127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains("(gloo) failed within 3s"), "{err}");
    assert!(!out.exists());

    // SIGTERM to the launcher reaches every rank; it exits 2 and nothing is written.
    let mut launcher = crate::common::lego_process()
        .args(["-v", "train-step", "--nproc-per-node", "2", "--checkpoint"])
        .arg(tiny_moe())
        .arg("-i")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .args(OPTS)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launcher.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen += &l;
        seen += "\n";
        if l.starts_with("[rank 1]") && l.contains("joined the process group") {
            break;
        }
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) };
    seen.extend(lines.map(|l| l.unwrap() + "\n"));
    let status = launcher.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{seen}");
    assert!(
        seen.contains("was interrupted (signal 15, forwarded to every rank)"),
        "{seen}"
    );
    assert!(!out.exists(), "{seen}");

    // Through the launcher: a rank's error is prefixed with its rank, and the exit code is 2.
    let bad = tmp.path().join("missing.jsonl.zst");
    let metrics = tmp.path().join("m.jsonl.zst");
    let o = train_step(&tiny_moe(), &bad, &out, &metrics, &["--nproc-per-node", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("[rank 0] lego-rl: error: ") || err.contains("[rank 1] lego-rl: error: "),
        "{err}"
    );
    assert!(
        err.contains("lego-rl: error: train-step on 2 ranks failed: rank "),
        "{err}"
    );
    assert!(!out.exists() && !metrics.exists());
}
