//! `model::shapes` against the models the code builds and transformers builds, parameter counts
//! against the published ones, and `train-step --plan` on the real configs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lego_rl::model::shapes::{checkpoint_extras, param_shapes, ParamCounts};
use lego_rl::model::{Config, Model};
use serde_json::{json, Value};
use tch::{Device, Kind};

use crate::common::{lego, python, root};

fn configs() -> PathBuf {
    root().join("testdata/models/configs")
}

fn raw(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(configs().join(name)).unwrap()).unwrap()
}

/// `assert_eq!` on name → shape maps, reporting only the differences.
fn assert_same(built: &BTreeMap<String, Vec<i64>>, planned: &BTreeMap<String, Vec<i64>>, what: &str) {
    let only = |a: &BTreeMap<String, Vec<i64>>, b: &BTreeMap<String, Vec<i64>>| {
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(v))
            .map(|(k, v)| format!("{k} {v:?}"))
            .collect::<Vec<_>>()
    };
    let (extra, missing) = (only(built, planned), only(planned, built));
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what}: built but not planned (or other shape): {extra:?}; planned but not built: {missing:?}"
    );
    assert!(!built.is_empty(), "{what}: an empty model proves nothing");
}

fn planned(cfg: &Config) -> BTreeMap<String, Vec<i64>> {
    let specs = param_shapes(cfg);
    let map: BTreeMap<_, _> = specs.iter().map(|p| (p.name.clone(), p.shape.clone())).collect();
    assert_eq!(map.len(), specs.len(), "duplicate names in param_shapes");
    map
}

fn built(model: &Model) -> BTreeMap<String, Vec<i64>> {
    model
        .named_variables()
        .into_iter()
        .map(|(n, t)| (n, t.size()))
        .collect()
}

/// A real config shrunk to test size, keeping its family, key layout and layer pattern.
fn shrunk(name: &str) -> Value {
    let mut v = raw(name);
    let small = json!({
        "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 6,
    });
    let text = if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        &mut v
    };
    for (k, x) in small.as_object().unwrap() {
        if text.get(k).is_some() {
            text[k] = x.clone();
        }
    }
    if let Some(types) = text.get_mut("layer_types").and_then(Value::as_array_mut) {
        types.truncate(4);
    }
    if let Some(vc) = v.get_mut("vision_config") {
        for (k, x) in [
            ("depth", 2),
            ("hidden_size", 16),
            ("intermediate_size", 40),
            ("num_heads", 2),
        ] {
            vc[k] = x.into();
        }
        vc["out_hidden_size"] = 32.into();
        vc["num_position_embeddings"] = 16.into();
    }
    v
}

fn cfg_of(v: &Value) -> Config {
    Config::from_json(&v.to_string()).unwrap()
}

/// param_shapes is what `CausalLm::new` builds, var for var, for every family and both expert
/// layouts (random models from small and shrunk real configs, and the tiny checkpoints as loaded).
#[test]
fn param_shapes_equal_the_built_models() {
    let mut cases: Vec<(String, Config)> = vec![
        ("tiny dense".into(), Config::tiny()),
        (
            "tiny dense, tied, attention bias".into(),
            Config {
                tie_word_embeddings: true,
                attention_bias: true,
                ..Config::tiny()
            },
        ),
        (
            "tiny moe, layer 1 dense".into(),
            Config {
                mlp_only_layers: vec![1],
                ..Config::tiny_moe()
            },
        ),
    ];
    for name in [
        "qwen3-30b-a3b.json",
        "qwen3-next-80b-a3b.json",
        "qwen3.5-35b-a3b.json",
    ] {
        cases.push((format!("shrunk {name}"), cfg_of(&shrunk(name))));
    }
    for (what, cfg) in cases.clone() {
        if cfg.num_experts > 0 {
            let fused = Config {
                fused_experts: true,
                ..cfg
            };
            cases.push((format!("{what}, fused experts"), fused));
        }
    }
    for (what, cfg) in &cases {
        let model = Model::random(cfg, Device::Cpu, Kind::Float);
        assert_same(&built(&model), &planned(cfg), what);
    }
    let dirs = [
        crate::model::tiny_dense(),
        crate::model::tiny_moe(),
        crate::hybrid::tiny("tiny-qwen3.5-moe"),
        crate::hybrid::tiny("tiny-qwen3-next"),
    ];
    for dir in dirs {
        let model = Model::load(&dir, Device::Cpu, None).unwrap();
        assert_same(&built(&model), &planned(model.cfg()), &dir.display().to_string());
    }
}

/// The text model's and the vision tower's names and shapes are transformers' own
/// (`Qwen3_5MoeForConditionalGeneration` built on the meta device from a shrunk Qwen3.5 config),
/// and the MTP layer is the model's full-attention MoE layer under `mtp.` (transformers drops
/// MTP weights, so it has none to compare).
#[test]
fn qwen35_text_and_vision_shapes_equal_transformers() {
    let v = shrunk("qwen3.5-35b-a3b.json");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    let script = r#"
import json, sys, torch, transformers
cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])
with torch.device("meta"):
    m = transformers.Qwen3_5MoeForConditionalGeneration(cfg)
print(json.dumps({k: list(t.shape) for k, t in m.state_dict().items()}))
"#;
    let out = std::process::Command::new(python())
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: BTreeMap<String, Vec<i64>> = serde_json::from_slice(&out.stdout).unwrap();
    let mut cfg = cfg_of(&v);
    cfg.fused_experts = theirs.keys().any(|k| k.ends_with("experts.gate_up_proj"));
    let extras = checkpoint_extras(&v, &cfg);
    let mut ours = planned(&cfg);
    ours.extend(
        extras
            .iter()
            .filter(|p| p.name.starts_with("model.visual."))
            .map(|p| (p.name.clone(), p.shape.clone())),
    );
    assert_same(&theirs, &ours, "Qwen3.5 text + vision vs transformers");
    let last = cfg.num_hidden_layers - 1; // a full-attention layer (every 4th)
    let main = planned(&cfg);
    let mtp: Vec<_> = extras
        .iter()
        .filter(|p| p.name.starts_with("mtp.layers.0."))
        .collect();
    assert!(mtp.len() > 10, "{mtp:?}");
    for p in mtp {
        let as_main = p
            .name
            .replace("mtp.layers.0.", &format!("{}.layers.{last}.", cfg.text_prefix));
        assert_eq!(main.get(&as_main), Some(&p.shape), "{}", p.name);
    }
}

fn counts(name: &str) -> (ParamCounts, Config) {
    let v = raw(name);
    let cfg = cfg_of(&v);
    let c = ParamCounts::new(&cfg, &param_shapes(&cfg), &checkpoint_extras(&v, &cfg));
    (c, cfg)
}

/// `published` as the model card writes it, with `unit` its last digit's place: Qwen rounds
/// some figures and truncates others (Qwen3-30B-A3B's 3.353B active is published as "3.3B",
/// Qwen3-Next's 79.67B total as "80B"), so the count must lie in
/// [published − unit/2, published + unit): consistent with either.
fn assert_published(count: i64, published: f64, unit: f64, what: &str) {
    let b = count as f64 / 1e9;
    assert!(
        b >= published - unit / 2.0 && b < published + unit,
        "{what}: {b:.4}B is not published as {published}B"
    );
}

/// Total and active parameter counts as the model cards publish them (Qwen3-30B-A3B: "30.5B in
/// total and 3.3B activated, 29.9B non-embedding"; Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B: "80B
/// / 35B in total and 3B activated"). The totals are of the model this crate builds: embeddings
/// and LM head in, MTP layers and the vision tower out (with them, Qwen3.5 would be 36B).
#[test]
fn parameter_counts_are_the_published_ones() {
    let (c, _) = counts("qwen3-30b-a3b.json");
    // model.safetensors.index.json of Qwen/Qwen3-30B-A3B: "total_size": 61064245248 (bf16).
    assert_eq!(c.total, 61_064_245_248 / 2);
    assert_published(c.total, 30.5, 0.1, "Qwen3-30B-A3B total");
    assert_published(c.non_embedding, 29.9, 0.1, "Qwen3-30B-A3B non-embedding");
    assert_published(c.active, 3.3, 0.1, "Qwen3-30B-A3B active");
    assert_eq!(c.extras, 0);

    let (c, _) = counts("qwen3-next-80b-a3b.json");
    assert_published(c.total, 80.0, 1.0, "Qwen3-Next total");
    // "3B activated" holds without the embeddings and head (3.25B); with them it is 3.87B.
    assert_published(
        c.active - (c.total - c.non_embedding),
        3.0,
        1.0,
        "Qwen3-Next active",
    );

    let (c, cfg) = counts("qwen3.5-35b-a3b.json");
    assert_published(c.total, 35.0, 1.0, "Qwen3.5-35B-A3B total");
    assert_published(c.active, 3.0, 1.0, "Qwen3.5-35B-A3B active");
    // The checkpoint also carries one MTP layer (a full MoE layer: ~0.85B) and the vision tower.
    let moe_layer = 3 * cfg.num_experts * cfg.moe_intermediate_size * cfg.hidden_size;
    assert!(c.extras > moe_layer, "{c:?}");
}

/// `train-step --plan ... --format json`, parsed, and its exit code.
fn plan_json(args: &[&str]) -> (Value, i32) {
    let out = lego()
        .args(["train-step", "--plan", "--format", "json"])
        .args(args)
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(code <= 1, "{}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), code)
}

fn u(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} in {v}"))
}

/// Doubling EP halves the expert part of the weights, gradients and optimizer state per rank
/// (ZeRO-0), and leaves the dense part alone. Under ZeRO-1 the experts' moments are sharded over
/// the world / EP ranks holding them, the dense ones over the world.
#[test]
fn expert_bytes_per_rank_halve_when_ep_doubles() {
    let cfg = configs().join("qwen3-30b-a3b.json");
    let c = cfg.to_str().unwrap();
    let plan = |e: &str, zero: &str| {
        let args = [
            "--checkpoint",
            c,
            "--world-size",
            "8",
            "--expert-parallel",
            e,
            "--zero",
            zero,
        ];
        plan_json(&args).0
    };
    let run = |e: &str| plan(e, "0");
    for (ep, twice) in [("2", "4"), ("4", "8")] {
        let (a, b) = (run(ep), run(twice));
        for part in ["weights", "gradients", "optimizer"] {
            let (x, y) = (u(&a, &[part, "experts"]), u(&b, &[part, "experts"]));
            assert!(x > 0);
            assert_eq!(2 * y, x, "{part} at EP {ep} vs {twice}");
            assert_eq!(u(&a, &[part, "dense"]), u(&b, &[part, "dense"]), "{part}");
        }
        assert!(u(&b, &["total"]) < u(&a, &["total"]));
    }
    let zero = |e: &str| plan(e, "1");
    for ep in ["2", "4", "8"] {
        let (z0, z1) = (run(ep), zero(ep));
        let e: u64 = ep.parse().unwrap();
        let (group, moments) = (8 / e, u(&z0, &["optimizer", "experts"]));
        let sharded = u(&z1, &["optimizer", "experts"]);
        // One element of padding per rank and bucket at most.
        assert!(
            sharded >= moments / group && sharded <= moments / group + 8 * 4096,
            "EP {ep}"
        );
        assert!(u(&z1, &["optimizer", "dense"]) * 8 <= u(&z0, &["optimizer", "dense"]) + 8 * 8 * 4096);
        assert_eq!(u(&z1, &["weights", "experts"]), u(&z0, &["weights", "experts"]));
    }
}

/// Checkpointing stores each layer's input instead of every layer's saved tensors, and the plan
/// follows the token budget.
#[test]
fn activation_checkpointing_and_token_budget_move_the_activations() {
    let cfg = configs().join("qwen3.5-35b-a3b.json");
    let c = cfg.to_str().unwrap();
    let act = |extra: &[&str]| {
        let mut args = vec!["--checkpoint", c, "--world-size", "8", "--expert-parallel", "8"];
        args.extend_from_slice(extra);
        u(&plan_json(&args).0, &["activations"])
    };
    let (full, ckpt) = (act(&[]), act(&["--activation-checkpointing"]));
    assert!(ckpt * 10 < full, "checkpointed {ckpt} vs full {full}");
    let (t4k, t8k) = (
        act(&["--micro-batch-tokens", "4096"]),
        act(&["--micro-batch-tokens", "8192"]),
    );
    // Linear in the micro-batch, nothing quadratic (a packed row attends sequence by sequence,
    // with no [T, T] mask); at most twice, since the chunked head's share does not grow.
    assert!(t8k > 2 * t4k - t4k / 2 && t8k <= 2 * t4k, "4k {t4k}, 8k {t8k}");
    let t128k = act(&["--micro-batch-tokens", "131072"]);
    assert!(t128k <= 16 * t8k, "8k {t8k}, 128k {t128k}");
}

/// The launches examples/slurm/README.md recommends: each `--plan` line there fits (exit 0), and
/// the figures the README prints are what the plan prints.
#[test]
fn recommended_launches_fit() {
    let readme = std::fs::read_to_string(root().join("examples/slurm/README.md")).unwrap();
    let plans: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("lego-rl train-step --plan "))
        .collect();
    assert_eq!(
        plans.len(),
        4,
        "Qwen3-30B-A3B and Qwen3.5-35B-A3B on 8 and 16 GPUs"
    );
    for line in plans {
        let args: Vec<&str> = line.split_whitespace().collect();
        let out = lego()
            .current_dir(root())
            .args(["train-step", "--plan"])
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{line}\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fits = stdout.lines().find(|l| l.starts_with("fits: ")).unwrap();
        assert!(readme.contains(fits), "README lacks `{fits}` of {line}");
    }
}

/// A configuration that does not fit exits 1 with the excess; impossible EP sizes are errors.
#[test]
fn plans_that_cannot_fit_or_cannot_be_made() {
    let cfg = configs().join("qwen3-30b-a3b.json");
    let c = cfg.to_str().unwrap();
    let out = lego()
        .args(["train-step", "--plan", "--checkpoint", c, "--world-size", "8"])
        .args(["--device-memory", "141GB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("does not fit:"), "{stdout}");
    for (world, ep, msg) in [
        ("8", "3", "does not divide the world size 8"),
        ("12", "6", "does not divide the 128 experts"),
    ] {
        let out = lego()
            .args(["train-step", "--plan", "--checkpoint", c, "--world-size", world])
            .args(["--expert-parallel", ep])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("--expert-parallel {ep}: {msg}")), "{err}");
    }
}

/// Without --plan, a step the plan says cannot fit stops before reading samples or weights: the
/// checkpoint here has only its config.json and the samples file does not exist.
#[test]
fn train_step_refuses_a_step_that_cannot_fit() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::copy(configs().join("qwen3-30b-a3b.json"), ckpt.join("config.json")).unwrap();
    let out_dir = dir.path().join("out");
    let out = lego()
        .args(["train-step", "--checkpoint"])
        .arg(&ckpt)
        .arg("-i")
        .arg(dir.path().join("missing.jsonl.zst"))
        .arg("--out")
        .arg(&out_dir)
        .args(["--device-memory", "80GB", "--dtype", "bfloat16"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not fit in --device-memory"), "{err}");
    assert!(err.contains("does not fit: "), "the plan is in the error: {err}");
    assert!(!out_dir.join("config.json").exists());
}

/// `--dtype float32` on a bf16 checkpoint keeps fp32 master weights (its saved weights stay
/// bf16, so the update would round away between train-steps without them): the plan counts
/// them, 4 bytes per parameter beside the moments' 8. The same model stored in fp32 has none.
#[test]
fn fp32_compute_of_a_bf16_checkpoint_plans_its_masters() {
    let mut cfg = raw("qwen3-30b-a3b.json");
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    let plan = |checkpoint: &Path| {
        let c = checkpoint.to_str().unwrap();
        let args = [
            "--checkpoint",
            c,
            "--world-size",
            "8",
            "--expert-parallel",
            "8",
            "--zero",
            "0",
            "--dtype",
            "float32",
        ];
        plan_json(&args).0
    };
    let up = plan(&configs().join("qwen3-30b-a3b.json"));
    for part in ["dense", "experts"] {
        let masters = u(&up, &["masters", part]);
        assert!(masters > 0, "{part}");
        assert_eq!(2 * masters, u(&up, &["optimizer", part]), "{part}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let fp32 = tmp.path().join("qwen3-30b-a3b-fp32.json");
    cfg["torch_dtype"] = "float32".into();
    std::fs::write(&fp32, cfg.to_string()).unwrap();
    let plain = plan(&fp32);
    assert_eq!(
        u(&plain, &["masters", "dense"]) + u(&plain, &["masters", "experts"]),
        0
    );
    assert!(u(&plain, &["total"]) < u(&up, &["total"]));
}

/// A sample longer than a micro-batch trains whole, alone: with --device-memory, a step whose
/// micro-batch fits but whose longest sample does not stops before loading weights, naming the
/// sample, its length and the figure. The same samples without that one pass the check (the
/// step then fails later only because the checkpoint has no weights).
#[test]
fn a_sample_too_long_to_fit_stops_the_step_by_name() {
    use lego_rl::records::{LossMask, Packed, Record, Sample};
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::copy(
        root().join("testdata/models/tiny-qwen3/config.json"),
        ckpt.join("config.json"),
    )
    .unwrap();
    let sample = |id: &str, n: usize| Sample {
        schema: Sample::SCHEMA.into(),
        id: format!("{id}#0.0"),
        trajectory_id: id.into(),
        task_id: "task".into(),
        group_id: 0,
        sample_index: 0,
        thread: 0,
        segment: 0,
        token_ids: (0..n as u32).map(|t| t % 4096).collect(),
        loss_mask: LossMask::from_dense(&(0..n).map(|t| t >= n / 2).collect::<Vec<_>>()),
        rollout_logprobs: Packed::f32_vec(&vec![-8.3; n - n / 2]),
        sampling: Vec::new(),
        routing: None,
        reward: 1.0,
        weight: 1.0,
        policy_version: 0,
        policy_versions: Vec::new(),
        metadata: Default::default(),
    };
    let run = |samples: &[Sample]| {
        let input = dir.path().join("samples.jsonl.zst");
        super::train::write_samples(&input, samples);
        let out = lego()
            .args(["train-step", "--checkpoint"])
            .arg(&ckpt)
            .arg("-i")
            .arg(&input)
            .arg("--out")
            .arg(dir.path().join("out"))
            .args(["--micro-batch-tokens", "512", "--device-memory", "2.5GB"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[sample("short", 400), sample("long", 200_000)]);
    assert!(err.contains("sample `long#0.0` has 200000 tokens"), "{err}");
    assert!(err.contains("nothing was loaded"), "{err}");
    assert!(err.contains("does not fit: "), "the plan is in the error: {err}");
    let err = run(&[sample("short", 400), sample("longer", 2000)]);
    assert!(!err.contains("has 2000 tokens"), "{err}");
    assert!(!err.contains("nothing was loaded"), "{err}");
}
