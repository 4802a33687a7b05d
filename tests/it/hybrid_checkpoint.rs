//! Hybrid checkpoints (Qwen3.5-MoE, Qwen3-Next): save → transformers load with every tensor
//! carried through byte-identical, fused expert layouts, `train-step` keeping tensors it does not
//! train, and the refusals of unsupported families and bad hybrid checkpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lego_rl::model::{Model, ModelError};
use tch::{Device, Kind, Tensor};

use crate::common::{self, lego};
use crate::hybrid::{tiny_next, tiny_qwen35};
use crate::model::{
    floats, ids_of, max_abs_diff, read_json, reference_routing, routing_lists, seq_logprobs, tiny_moe,
};
use crate::train::{sample, write_samples, CLI_OPTS};

/// Every tensor of a safetensors file as (dtype, shape, bytes), by name.
pub(crate) fn raw_tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                (format!("{:?}", v.dtype()), v.shape().to_vec(), v.data().to_vec()),
            )
        })
        .collect()
}

/// Load → save writes every input tensor (Qwen3.5: text, vision tower, MTP head, a bf16 one among
/// fp32; Qwen3-Next: its fused `in_proj_qkvz` / `in_proj_ba`) byte-identical under its own name;
/// a save of the saved checkpoint is byte-identical again; transformers loads each saved
/// directory (one interpreter for both) and computes the reference log-probs and routing.
#[test]
fn hybrid_saves_keep_every_tensor_and_load_in_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hf_args: Vec<PathBuf> = Vec::new();
    let models = [("qwen3.5", tiny_qwen35()), ("qwen3-next", tiny_next())];
    for (name, dir) in &models {
        let model = Model::load(dir, Device::Cpu, None).unwrap();
        let first = tmp.path().join(name).join("first");
        std::fs::create_dir_all(&first).unwrap();
        model.save(&first).unwrap();
        let input = raw_tensors(&dir.join("model.safetensors"));
        let saved = raw_tensors(&first.join("model.safetensors"));
        if *name == "qwen3.5" {
            assert!(
                input.keys().any(|k| k.starts_with("model.visual.")),
                "vision tensors in the input"
            );
            assert!(input.contains_key("mtp.fc.weight"));
        } else {
            assert!(input.contains_key("model.layers.0.linear_attn.in_proj_qkvz.weight"));
        }
        assert_eq!(saved.keys().collect::<Vec<_>>(), input.keys().collect::<Vec<_>>());
        for (tensor, t) in &input {
            assert!(saved[tensor] == *t, "{name}: `{tensor}` changed on save");
        }
        let second = tmp.path().join(name).join("second");
        std::fs::create_dir(&second).unwrap();
        Model::load(&first, Device::Cpu, None)
            .unwrap()
            .save(&second)
            .unwrap();
        assert_eq!(raw_tensors(&second.join("model.safetensors")), saved, "{name}");

        let reference = read_json(&dir.join("reference.json"));
        let ids_json = tmp.path().join(name).join("ids.json");
        let ids_only = serde_json::json!({"sequences": reference["sequences"].as_array().unwrap().iter()
            .map(|s| serde_json::json!({"name": s["name"], "input_ids": s["input_ids"]})).collect::<Vec<_>>()});
        std::fs::write(&ids_json, ids_only.to_string()).unwrap();
        hf_args.extend([first, ids_json, tmp.path().join(name).join("hf.json")]);
    }
    let status = std::process::Command::new(common::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/hf_reference.py"))
        .args(&hf_args)
        .status()
        .unwrap();
    assert!(status.success(), "transformers failed to load a saved checkpoint");
    for (name, dir) in &models {
        let hf = read_json(&tmp.path().join(name).join("hf.json"));
        let reference = read_json(&dir.join("reference.json"));
        for (seq, want) in hf["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .zip(reference["sequences"].as_array().unwrap())
        {
            let d = max_abs_diff(
                &floats(&seq["next_token_logprobs"]),
                &floats(&want["next_token_logprobs"]),
            );
            assert!(
                d < 1e-6,
                "{name} {}: saved checkpoint in transformers |Δ| {d}",
                seq["name"]
            );
            assert_eq!(seq["topk_experts"], want["topk_experts"], "{name}");
        }
    }
}

/// Experts stored fused (`experts.gate_up_proj` `[E, 2·I, hidden]`, `experts.down_proj`
/// `[E, hidden, I]`, as transformers ≥ 5 keeps them) load into the same function as per-expert
/// ones, and save back fused, byte-identical.
#[test]
fn fused_expert_tensors_load_and_save_in_their_layout() {
    let dir = tiny_qwen35();
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    let st = tmp.path().join("model.safetensors");
    let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(&st).unwrap().into_iter().collect();
    let mut fused: Vec<(String, Tensor)> = Vec::new();
    for (name, t) in &tensors {
        if !(name.starts_with("model.language_model.") && name.contains(".mlp.experts.")) {
            fused.push((name.clone(), t.shallow_clone()));
        }
    }
    for l in 0..4 {
        let p = format!("model.language_model.layers.{l}.mlp.experts");
        let get = |e: i64, w: &str| tensors[&format!("{p}.{e}.{w}.weight")].shallow_clone();
        let gate_up: Vec<Tensor> = (0..8)
            .map(|e| Tensor::cat(&[get(e, "gate_proj"), get(e, "up_proj")], 0))
            .collect();
        let down: Vec<Tensor> = (0..8).map(|e| get(e, "down_proj")).collect();
        fused.push((format!("{p}.gate_up_proj"), Tensor::stack(&gate_up, 0)));
        fused.push((format!("{p}.down_proj"), Tensor::stack(&down, 0)));
    }
    Tensor::write_safetensors(&fused, &st).unwrap();
    let model = Model::load(tmp.path(), Device::Cpu, None).unwrap();
    assert!(model.cfg().fused_experts);
    let reference = read_json(&dir.join("reference.json"));
    for seq in reference["sequences"].as_array().unwrap() {
        let (lp, routing, _) = seq_logprobs(&model.lm, &ids_of(seq), None);
        let d = max_abs_diff(&lp, &floats(&seq["next_token_logprobs"]));
        assert!(d < 1e-4, "{}: fused experts log-prob |Δ| {d}", seq["name"]);
        assert_eq!(routing_lists(&routing.unwrap()), reference_routing(seq));
    }
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    model.save(&out).unwrap();
    assert_eq!(raw_tensors(&out.join("model.safetensors")), raw_tensors(&st));
}

/// Regression: train-step dropped tensors it does not use (an `mtp.fc.weight` added to the
/// Qwen3-MoE checkpoint was gone from the output, 80 tensors in, 79 out, exit 0).
#[test]
fn train_step_carries_unused_tensors_through() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    for f in std::fs::read_dir(tiny_moe()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, ckpt.join(f.file_name().unwrap())).unwrap();
    }
    let st = ckpt.join("model.safetensors");
    let mut tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(&st).unwrap();
    let extra = Tensor::arange(64 * 8, (Kind::Float, Device::Cpu)).view([8, 64]) / 7.0;
    tensors.push(("mtp.fc.weight".into(), extra));
    Tensor::write_safetensors(&tensors, &st).unwrap();
    let model = Model::load(&ckpt, Device::Cpu, None).unwrap();
    let seq: Vec<i64> = (0..24).map(|t| (t * 7919 + 11) % 151643).collect();
    let seq2: Vec<i64> = (0..24).map(|t| (t * 104729 + 5) % 151643).collect();
    let input = tmp.path().join("samples.jsonl.zst");
    write_samples(
        &input,
        &[
            sample(&model, "a", 0, &seq, 8, 1.0, 1.0),
            sample(&model, "b", 0, &seq2, 8, 0.0, 1.0),
        ],
    );
    let out = tmp.path().join("step-1");
    lego()
        .args(["train-step", "--checkpoint"])
        .arg(&ckpt)
        .arg("-i")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .args(CLI_OPTS)
        .assert()
        .success();
    let before = raw_tensors(&st);
    let after = raw_tensors(&out.join("model.safetensors"));
    assert_eq!(after.len(), before.len(), "tensor count in → out");
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        after["mtp.fc.weight"] == before["mtp.fc.weight"],
        "carried byte-identical"
    );
}

fn write_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut cfg = read_json(&tiny_qwen35().join("config.json"));
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// Bad input fails up front with the key, tensor or family named.
#[test]
fn unsupported_families_and_bad_hybrid_checkpoints_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::copy(
        tiny_qwen35().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    write_config(dir, |c| {
        c["model_type"] = "deepseek_v3".into();
    });
    let err = Model::load(dir, Device::Cpu, None).unwrap_err().to_string();
    assert!(
        err.contains("`deepseek_v3` is not supported") && err.contains("qwen3_5_moe"),
        "{err}"
    );
    write_config(dir, |c| {
        c["architectures"] = serde_json::json!(["Qwen3_5MoeForSequenceClassification"]);
    });
    let err = Model::load(dir, Device::Cpu, None).unwrap_err().to_string();
    assert!(err.contains("Qwen3_5MoeForSequenceClassification"), "{err}");
    write_config(dir, |c| {
        c["text_config"]["layer_types"].as_array_mut().unwrap().pop();
    });
    let err = Model::load(dir, Device::Cpu, None).unwrap_err().to_string();
    assert!(
        err.contains("`text_config.layer_types` has 3 entries") && err.contains("is 4"),
        "{err}"
    );
    // A checkpoint without one layer's A_log.
    write_config(dir, |_| {});
    let st = dir.join("model.safetensors");
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(&st)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "model.language_model.layers.2.linear_attn.A_log")
        .collect();
    Tensor::write_safetensors(&tensors, &st).unwrap();
    match Model::load(dir, Device::Cpu, None) {
        Err(ModelError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.language_model.layers.2.linear_attn.A_log")
        }
        other => panic!("expected the missing A_log to be named, got {other:?}"),
    }
    // The CLI refuses an unsupported family before reading any sample.
    write_config(dir, |c| {
        c["model_type"] = "llama".into();
        c["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    });
    let out = lego()
        .args(["train-step", "--checkpoint"])
        .arg(dir)
        .args(["-i", "/nonexistent.jsonl.zst", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`llama` is not supported"), "{stderr}");
}
