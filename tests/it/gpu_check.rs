//! GPU readiness without a GPU (issue 37): the release binary links libtorch_cuda when its torch
//! wheel has CUDA, `lego-rl env` reports what it can use, `--device cuda` without a GPU fails at
//! once saying so, the GPU pack fits its 64 MiB, and `scripts/gpu/check.sh --cpu` runs every step
//! and prints every figure.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use crate::common::{lego, python, root};

/// The release binary the tests run (the one scripts/setup.sh builds).
fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lego-rl"))
}

/// True when the torch this checkout builds against ships libtorch_cuda (PyPI's Linux wheel does).
fn wheel_has_cuda() -> bool {
    root().join(".libtorch/lib/libtorch_cuda.so").is_file()
}

fn env_json() -> serde_json::Value {
    let out = lego().args(["env", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

// Regression: the binary linked libtorch_cpu and c10 only (`--as-needed` dropped libtorch_cuda,
// which nothing calls directly), so `--device cuda` could never work.
#[test]
fn binary_links_libtorch_cuda_when_the_wheel_has_it() {
    let ldd = Process::new("ldd").arg(binary()).output().unwrap();
    let text = String::from_utf8_lossy(&ldd.stdout);
    assert!(text.contains("libtorch_cpu.so"), "{text}");
    assert_eq!(
        text.contains("libtorch_cuda.so"),
        wheel_has_cuda(),
        "libtorch_cuda linked iff the wheel has it:\n{text}"
    );
}

#[test]
fn env_reports_torch_cuda_and_threads() {
    let e = env_json();
    assert_eq!(e["schema"], "lego-rl/env/v1");
    assert!(e["torch_version"].as_str().unwrap().starts_with("2.11.0"), "{e}");
    let lib = Path::new(e["libtorch"].as_str().unwrap());
    assert!(lib.join("libtorch_cpu.so").is_file(), "{e}");
    assert!(e["threads"].as_i64().unwrap() >= 1);
    let cuda = wheel_has_cuda();
    assert_eq!(e["built_with_cuda"], cuda);
    assert_eq!(e["torch_cuda_loaded"], cuda);
    // setup.sh fetches the CUDA headers whenever the wheel has CUDA, so the NCCL path is built.
    assert_eq!(e["built_with_nccl"], cuda);
    if cuda {
        assert_eq!(e["torch_cuda_version"], "13.0");
        assert!(e["nccl_version"].as_str().unwrap().starts_with("2."), "{e}");
    }
    // Torch's device count and the driver's list agree, GPU or not.
    let count = e["cuda_device_count"].as_i64().unwrap();
    assert_eq!(e["cuda_available"], count > 0);
    assert_eq!(e["devices"].as_array().unwrap().len() as i64, count, "{e}");
    assert_eq!(e["nccl_usable"], cuda && count > 0);
    let table = lego().arg("env").output().unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    for key in ["torch", "libtorch", "CUDA usable", "NCCL usable", "threads"] {
        assert!(
            table.lines().any(|l| l.starts_with(key)),
            "{key} missing:\n{table}"
        );
    }
}

#[test]
fn device_cuda_without_a_gpu_fails_at_once() {
    if env_json()["cuda_available"] == true {
        eprintln!("a GPU is here: the no-GPU error cannot be shown");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl.zst");
    let ckpt = root().join("testdata/models/tiny-qwen3");
    let train = lego()
        .args(["train-step", "--device", "cuda", "--checkpoint"])
        .arg(&ckpt)
        .arg("-i")
        .arg(&missing)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let rollout = lego()
        .args(["rollout", "--device", "cuda:0", "-i"])
        .arg(&missing)
        .arg("--images")
        .arg(&missing)
        .arg("--harness")
        .arg(&missing)
        .arg("--backend")
        .arg(format!("embedded:{}", ckpt.display()))
        .arg("-o")
        .arg(dir.path().join("t.jsonl.zst"))
        .output()
        .unwrap();
    for (name, out, flag) in [("train-step", train, "cuda"), ("rollout", rollout, "cuda:0")] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        let want = if wheel_has_cuda() {
            format!("--device {flag}: no CUDA device")
        } else {
            format!("--device {flag}: this lego-rl was built without CUDA")
        };
        assert!(err.contains(&want), "{name}: {err}");
        // Before any input was read: the missing files are not what it complains about.
        assert!(!err.contains("missing.jsonl.zst"), "{name}: {err}");
    }
}

#[test]
fn gpu_pack_fits_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("pack");
    let out = Process::new(root().join("scripts/gpu/pack.sh"))
        .arg(&dest)
        .env("LEGO_RL_PYTHON", python())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let size: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(size <= 64 << 20, "{size} bytes");
    for f in [
        "lego-rl",
        "check.sh",
        "check_helper.py",
        "models/qwen3-30b-a3b.json",
        "models/tiny-qwen3-moe-bf16/model.safetensors",
    ] {
        assert!(dest.join(f).is_file(), "{f} missing from the pack");
    }
    // The packed binary is the stripped one and still runs.
    let v = Process::new(dest.join("lego-rl"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(v.status.success());
}

/// Every figure of the issue, measured on CPU at tiny sizes (NCCL needs a GPU and says so).
#[test]
fn check_script_on_cpu_prints_every_figure() {
    let dir = tempfile::tempdir().unwrap();
    let out = Process::new(root().join("scripts/gpu/check.sh"))
        .arg("--cpu")
        .env("OUT", dir.path())
        .env("LEGO_RL_PYTHON", python())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("gpu-figures.json")).unwrap()).unwrap();
    let f = &figures["figures"];
    for key in [
        "agreement_replay_on_pearson",
        "agreement_replay_on_max_abs_diff",
        "agreement_replay_on_expert_overlap",
        "agreement_replay_off_pearson",
        "agreement_replay_off_max_abs_diff",
        "agreement_replay_off_expert_overlap",
        "train_tokens_per_second",
        "train_mfu",
        "train_peak_memory_bytes",
        "train_plan_total_bytes",
        "train_peak_over_plan",
        "reference_tokens_per_second",
        "train_over_reference",
        "decode_tokens_per_second_1",
        "decode_tokens_per_second_batched",
        "gloo_2_ranks_tokens_per_second",
        "long_tokens",
        "long_tokens_per_second",
        "long_peak_memory_bytes",
        "long_plan_total_bytes",
        "long_peak_over_plan",
    ] {
        assert!(f[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {}", f[key]);
    }
    assert_eq!(f["gloo_2_ranks_ok"], true);
    assert!(f["nccl_1_rank_ok"].as_str().unwrap().starts_with("skipped"));
    // The trainer's router agrees with the engine's on most experts (both see the same bf16 weights).
    assert!(f["agreement_replay_off_expert_overlap"].as_f64().unwrap() > 0.5);
    let md = std::fs::read_to_string(dir.path().join("gpu-figures.md")).unwrap();
    assert!(stdout.contains(&md), "the table is printed");
    assert!(!md.contains("— ("), "a figure is missing:\n{md}");
}
