//! examples/slurm/train.sbatch as a multi-task job through the fake `sbatch` and `srun` of
//! tests/slurm-shim: 1 node × 2 tasks run train-step as 2 Gloo ranks (Slurm's variables, the
//! store on the node list's first host). The full submit-step.sh chain (rollout array, align,
//! train, validate) runs through the same shims in tests/it/pipeline.rs.

use std::process::Command;

use lego_rl::model::Model;
use lego_rl::records::StepMetrics;
use tch::Device;

use crate::common::root;
use crate::dist::free_port;
use crate::model::tiny_moe;
use crate::train::{moe_samples, read_metrics, write_samples};

#[test]
fn train_sbatch_runs_two_ranks_through_srun() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("checkpoints")).unwrap();
    std::fs::create_dir_all(run.join("samples")).unwrap();
    let st = Command::new("cp")
        .arg("-r")
        .arg(tiny_moe())
        .arg(run.join("checkpoints/step-000000"))
        .status()
        .unwrap();
    assert!(st.success());
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    // Aligned already: the job reuses the samples (as after a requeue) instead of running align.
    write_samples(&run.join("samples/step-000000.jsonl.zst"), &moe_samples(&model));
    drop(model);
    let shim = root().join("tests/slurm-shim");
    let state = tmp.path().join("slurm");
    let path = format!("{}:{}", shim.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(shim.join("sbatch"))
        .args([
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--export=ALL,STEP=0",
        ])
        .arg(root().join("examples/slurm/train.sbatch"))
        .env("PATH", path)
        .env("SLURM_SHIM_STATE", &state)
        .env("LEGO_RL", assert_cmd::cargo::cargo_bin("lego-rl"))
        .env("LEGO_RL_NO_PROGRESS", "1")
        .env("RUN", &run)
        .env("TRAIN_DEVICE", "cpu")
        .env(
            "TRAIN_ARGS",
            "--micro-batch-tokens 40 --lr 1e-3 --dist-timeout 120",
        )
        .env("MASTER_PORT", free_port().to_string())
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let log = std::fs::read_to_string(state.join(format!("{id}.out"))).unwrap_or_default();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status = std::fs::read_to_string(state.join(format!("{id}.status"))).unwrap();
    assert_eq!(status.trim(), "0", "train.sbatch failed:\n{log}");
    let next = run.join("checkpoints/step-000001");
    for f in [
        "model.safetensors",
        "lego-rl.json",
        "optimizer/manifest.json",
        "optimizer/all/group.json",
        "optimizer/all/slice-00000-of-00002.safetensors",
        "optimizer/all/slice-00001-of-00002.safetensors",
    ] {
        assert!(next.join(f).is_file(), "{f} missing:\n{log}");
    }
    let m: Vec<StepMetrics> = read_metrics(&run.join("metrics.jsonl.zst"));
    assert_eq!(m.len(), 1, "one record, from rank 0");
    assert_eq!(m[0].extra["world_size"], 2);
    assert_eq!(m[0].extra["zero"], 1);
}
