//! Mixed precision: a bf16 checkpoint learns like an fp32 one. Several consecutive train-steps
//! (each resumed from the last one's checkpoint, masters included) at a realistic lr on the tiny
//! bf16 MoE move the saved weights as an fp32 run from the same, bf16-exact, weights does; with
//! the masters switched off (the trainer before them) the same comparison fails, because an
//! update of about `lr` is below bf16's spacing for most weights and rounds away.
//!
//! The comparison is on the saved checkpoints: the bf16 run's weight change against the fp32
//! run's final weights rounded to bf16 (what the bf16 run would save if its forward and backward
//! were fp32 too), relative to the fp32 run's rounded change. The fp32 masters the bf16 run saves
//! are compared with the fp32 run's weights too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lego_rl::model::Model;
use lego_rl::records::Sample;
use lego_rl::train::{AdamWConfig, Settings, Trainer};
use tch::{Device, Kind, Tensor};

use crate::model::tiny_moe_bf16;
use crate::train::moe_samples;

/// Consecutive train-steps per run.
const STEPS: usize = 4;
/// Within the paper's range of learning rates (1e-6 … 2e-5).
const LR: f64 = 1e-5;

fn settings() -> Settings {
    Settings {
        micro_batch_tokens: 40,
        optim: AdamWConfig {
            lr: LR,
            ..AdamWConfig::default()
        },
        ..Settings::default()
    }
}

/// A copy of checkpoint `src` with its weights (and config dtype) in fp32.
pub fn fp32_copy(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "model.safetensors" || name == "config.json" {
            continue;
        }
        std::fs::copy(e.path(), dst.join(&name)).unwrap();
    }
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(src.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.to_kind(Kind::Float)))
        .collect();
    Tensor::write_safetensors(&tensors, dst.join("model.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace("\"bfloat16\"", "\"float32\"");
    std::fs::write(dst.join("config.json"), cfg).unwrap();
}

/// The samples of the tests (both groups carry a learning signal).
pub fn samples(ckpt: &Path) -> Vec<Sample> {
    let model = Model::load(ckpt, Device::Cpu, Some(Kind::Float)).unwrap();
    let mut samples = moe_samples(&model);
    assert_eq!(samples[4].trajectory_id, "e");
    samples[4].reward = 0.0;
    samples
}

/// [`STEPS`] train-steps from `ckpt`, each loading the last one's checkpoint (optimizer state
/// and masters from disk), into `out/step-K`, computing in `kind` (`--dtype`; the checkpoint's
/// when `None`); returns the last checkpoint.
fn train(ckpt: &Path, samples: &[Sample], out: &Path, masters: bool, kind: Option<Kind>) -> PathBuf {
    let mut from = ckpt.to_path_buf();
    for k in 0..STEPS {
        let mut t = Trainer::load(&from, Device::Cpu, kind).unwrap();
        t.opt.test_only_no_masters = !masters;
        t.step(samples, Path::new("samples"), &settings()).unwrap();
        let next = out.join(format!("step-{}", k + 1));
        t.save_atomic(&next).unwrap();
        from = next;
    }
    from
}

/// One process's optimizer state in a checkpoint (`train/state.rs`).
const FULL_STATE: &str = "optimizer/all/slice-00000-of-00001.safetensors";

/// The tensors of `file`, by name, with their saved dtypes.
fn read(file: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(file).unwrap().into_iter().collect()
}

/// ‖a − b‖ / ‖b‖ over every tensor of `b` (fp64 sums).
fn rel_err(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (name, tb) in b {
        let ta = &a[name];
        let d = (ta - tb).to_kind(Kind::Double);
        num += d.pow_tensor_scalar(2).sum(Kind::Double).double_value(&[]);
        den += tb
            .to_kind(Kind::Double)
            .pow_tensor_scalar(2)
            .sum(Kind::Double)
            .double_value(&[]);
    }
    (num / den).sqrt()
}

/// `w − w0` per tensor, in fp32.
fn delta(w: &BTreeMap<String, Tensor>, w0: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    w0.iter()
        .map(|(n, t0)| (n.clone(), w[n].to_kind(Kind::Float) - t0.to_kind(Kind::Float)))
        .collect()
}

#[test]
fn bf16_checkpoint_learns_like_fp32_through_masters_and_not_without() {
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = tiny_moe_bf16();
    let fp32 = tmp.path().join("fp32-start");
    fp32_copy(&bf16, &fp32);
    let samples = samples(&fp32);
    let run32 = train(&fp32, &samples, &tmp.path().join("fp32"), true, None);
    let run16 = train(&bf16, &samples, &tmp.path().join("bf16"), true, None);
    let bare16 = train(&bf16, &samples, &tmp.path().join("bf16-no-masters"), false, None);
    // `--dtype float32` on the bf16 checkpoint: fp32 compute, bf16 saved weights.
    let up16 = train(
        &bf16,
        &samples,
        &tmp.path().join("bf16-fp32-compute"),
        true,
        Some(Kind::Float),
    );

    let w0 = read(&bf16.join("model.safetensors"));
    assert!(w0.values().all(|t| t.kind() == Kind::BFloat16));
    let w32 = read(&run32.join("model.safetensors"));
    let w16 = read(&run16.join("model.safetensors"));
    let bare = read(&bare16.join("model.safetensors"));
    // The checkpoint's dtype is kept (what transformers and vLLM load).
    for (name, t) in w16.iter().chain(&bare) {
        assert_eq!(t.kind(), Kind::BFloat16, "{name}");
    }
    // What the fp32 run's weights are in bf16: the best a bf16 checkpoint can hold.
    let w32_rounded: BTreeMap<String, Tensor> = w32
        .iter()
        .map(|(n, t)| (n.clone(), t.to_kind(Kind::BFloat16)))
        .collect();
    let want = delta(&w32_rounded, &w0);
    let moved = want
        .values()
        .map(|d| d.ne(0.0).sum(Kind::Int64).int64_value(&[]))
        .sum::<i64>() as f64
        / want.values().map(|d| d.numel() as f64).sum::<f64>();
    assert!(
        moved > 0.05,
        "the fp32 run moved only {moved:.4} of the bf16 weights"
    );
    let err_masters = rel_err(&delta(&w16, &w0), &want);
    let err_bare = rel_err(&delta(&bare, &w0), &want);
    // The masters against the fp32 run's (unrounded) weights.
    let masters: BTreeMap<String, Tensor> = read(&run16.join(FULL_STATE))
        .into_iter()
        .filter_map(|(n, t)| Some((n.strip_prefix("master.")?.to_string(), t)))
        .collect();
    assert_eq!(masters.len(), w0.len(), "a master per trained parameter");
    assert!(masters.values().all(|t| t.kind() == Kind::Float));
    let err_master_vs_fp32 = rel_err(&delta(&masters, &w0), &delta(&w32, &w0));
    assert!(
        !read(&bare16.join(FULL_STATE))
            .keys()
            .any(|n| n.starts_with("master.")),
        "the switch turns the masters off"
    );
    eprintln!(
        "{STEPS} steps at lr {LR:e}: fp32 run moved {moved:.4} of the bf16 weights; relative error of the \
         saved bf16 weight change vs the fp32 run's (rounded): with masters {err_masters:.4}, without \
         {err_bare:.4}; masters vs fp32 weights: {err_master_vs_fp32:.4}"
    );
    assert!(
        err_masters < 0.15,
        "with masters the bf16 run's weights moved unlike the fp32 run's: {err_masters}"
    );
    assert!(
        err_master_vs_fp32 < 0.1,
        "the masters moved unlike the fp32 run's weights: {err_master_vs_fp32}"
    );
    // The same comparison without masters fails (the trainer before them).
    assert!(
        err_bare > 0.5,
        "without masters the bf16 run should lose most of its updates: {err_bare}"
    );
    // fp32 compute keeps masters too: its saved bf16 weights round away as much otherwise, since
    // every train-step starts from the last one's saved (rounded) weights.
    let w_up = read(&up16.join("model.safetensors"));
    assert!(w_up.values().all(|t| t.kind() == Kind::BFloat16));
    let err_up = rel_err(&delta(&w_up, &w0), &want);
    let up_masters: BTreeMap<String, Tensor> = read(&up16.join(FULL_STATE))
        .into_iter()
        .filter_map(|(n, t)| Some((n.strip_prefix("master.")?.to_string(), t)))
        .collect();
    eprintln!("--dtype float32 on the bf16 checkpoint: relative error of the weight change {err_up:.4}");
    assert!(
        err_up < 0.15,
        "fp32 compute of the bf16 checkpoint lost its updates: {err_up}"
    );
    assert_eq!(up_masters.len(), w0.len(), "a master per trained parameter");
    let err_up_master = rel_err(&delta(&up_masters, &w0), &delta(&w32, &w0));
    assert!(
        err_up_master < 0.1,
        "masters vs the fp32 run's weights: {err_up_master}"
    );
}

/// Environment variable naming a [`resume_worker`]'s job: `PHASE;ZERO;EP;DIR`.
const RESUME: &str = "LEGO_RL_TEST_BF16_RESUME";

/// One rank's part of a resume test, started by [`resume_world`]: in `DIR`, from the bf16
/// checkpoint `DIR/start` (computing in fp32 when `F32` is 1, `--dtype float32`) on batches
/// `DIR/b1.jsonl.zst` then `DIR/b2.jsonl.zst`, phase `two`
/// takes both steps in this process (→ `DIR/two`), phase `one` the first (→ `DIR/one`), phase
/// `resume` the second from `DIR/one` (→ `DIR/resumed`).
#[test]
#[ignore = "a rank started by the resume tests of this module"]
fn resume_worker() {
    use lego_rl::c10d::{Backend, ProcessGroup};
    let Ok(job) = std::env::var(RESUME) else { return };
    let parts: Vec<&str> = job.splitn(5, ';').collect();
    let [phase, zero, ep, f32, dir] = parts[..] else {
        panic!("bad {RESUME} {job}")
    };
    let (zero, ep, dir) = (zero == "1", ep.parse::<usize>().unwrap(), PathBuf::from(dir));
    let kind = (f32 == "1").then_some(Kind::Float);
    let pg = ProcessGroup::from_env(Backend::Gloo, std::time::Duration::from_secs(300)).unwrap();
    let s = Settings { zero, ..settings() };
    let load = |from: &Path| {
        if ep > 1 {
            let groups = pg.expert_groups(ep).unwrap();
            Trainer::load_expert_parallel(from, Device::Cpu, kind, groups).unwrap()
        } else {
            Trainer::load(from, Device::Cpu, kind).unwrap()
        }
    };
    let batch = |k: usize| {
        let path = dir.join(format!("b{k}.jsonl.zst"));
        let samples: Vec<Sample> = lego_rl::io::read_all(&path, Default::default()).unwrap();
        (samples, path)
    };
    let step = |t: &mut Trainer, k: usize| {
        let (samples, path) = batch(k);
        t.step_on(&samples, &path, &s, &pg).unwrap();
    };
    let (from, steps, out) = match phase {
        "two" => ("start", &[1, 2][..], "two"),
        "one" => ("start", &[1][..], "one"),
        "resume" => ("one", &[2][..], "resumed"),
        "resume-legacy" => ("one-legacy", &[2][..], "resumed-legacy"),
        other => panic!("unknown phase {other}"),
    };
    let mut t = load(&dir.join(from));
    for &k in steps {
        step(&mut t, k);
    }
    t.save_atomic_on(&dir.join(out), &pg).unwrap();
    println!("phase {phase} done on rank {}", pg.rank());
}

/// Runs `phase` of [`resume_worker`] on `world` ranks.
fn resume_world(world: usize, phase: &str, zero: bool, ep: usize, f32: bool, dir: &Path) {
    let job = format!(
        "{phase};{};{ep};{};{}",
        u8::from(zero),
        u8::from(f32),
        dir.display()
    );
    let out = crate::dist::start_ranks("train_bf16::resume_worker", RESUME, world, &job);
    for (r, o) in out.iter().enumerate() {
        assert!(
            o.status.success() && crate::dist::stdout(o).contains(&format!("phase {phase} done on rank {r}")),
            "{phase}, rank {r} of {world}: {}\n{}",
            crate::dist::stdout(o),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Every `.safetensors` file under `dir`, by path relative to it.
fn safetensors_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "safetensors") {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Rewrites checkpoint `dir`'s optimizer state into the layout train-step wrote before
/// `optimizer/manifest.json` (one of the four `src/train/state.rs` still reads): full state in
/// `optimizer.safetensors` and `optimizer-ep-RRRRR-of-EEEEE.safetensors`, ZeRO-1 state in
/// `optimizer/zero.json` + `optimizer/rank-RRRRR.safetensors` and the same per expert folder.
/// The tensors inside the files are the same in both layouts.
fn to_legacy_layout(dir: &Path) {
    let root = dir.join("optimizer");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("manifest.json")).unwrap()).unwrap();
    for g in manifest["groups"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        let slices: Vec<&str> = g["slices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["file"].as_str().unwrap())
            .collect();
        let experts = name.strip_prefix("experts-");
        if g["storage"] == "full" {
            let to = experts.map_or_else(
                || dir.join("optimizer.safetensors"),
                |e| dir.join(format!("optimizer-ep-{e}.safetensors")),
            );
            std::fs::rename(root.join(slices[0]), to).unwrap();
            continue;
        }
        let folder = experts.map_or_else(|| root.clone(), |_| root.join(name));
        std::fs::rename(root.join(name).join("group.json"), folder.join("zero.json")).unwrap();
        for (i, f) in slices.iter().enumerate() {
            std::fs::rename(root.join(f), folder.join(format!("rank-{i:05}.safetensors"))).unwrap();
        }
    }
    std::fs::remove_file(root.join("manifest.json")).unwrap();
    for e in std::fs::read_dir(&root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && std::fs::read_dir(&p).unwrap().next().is_none() {
            std::fs::remove_dir(&p).unwrap();
        }
    }
    if std::fs::read_dir(&root).unwrap().next().is_none() {
        std::fs::remove_dir(&root).unwrap();
    }
}

/// Two steps in one process against one step plus one resumed step, on `world` ranks (computing
/// in fp32 when `f32`): the same weights, moments and masters, bit for bit, in every file, and
/// the weights saved in the checkpoint's bf16. The resumed step runs twice: from the first
/// step's checkpoint as written, and from a copy rewritten into the layout before the manifest
/// ([`to_legacy_layout`]), which must still resume bit for bit.
fn resumes_bit_exactly(world: usize, zero: bool, ep: usize, f32: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let start = dir.join("start");
    let bf16 = tiny_moe_bf16();
    std::fs::create_dir_all(&start).unwrap();
    for e in std::fs::read_dir(&bf16).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), start.join(e.file_name())).unwrap();
    }
    let fp32 = dir.join("fp32");
    fp32_copy(&bf16, &fp32);
    let b1 = samples(&fp32);
    let mut b2 = b1.clone();
    for (i, s) in b2.iter_mut().enumerate() {
        s.reward = (i % 2) as f64;
        s.weight = 1.0;
    }
    // The second segment of trajectory `a` keeps its first segment's reward.
    b2[5].reward = b2[0].reward;
    crate::train::write_samples(&dir.join("b1.jsonl.zst"), &b1);
    crate::train::write_samples(&dir.join("b2.jsonl.zst"), &b2);
    for phase in ["two", "one", "resume"] {
        resume_world(world, phase, zero, ep, f32, dir);
    }
    let legacy = dir.join("one-legacy");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(dir.join("one"))
        .arg(&legacy)
        .status()
        .unwrap();
    assert!(copied.success());
    to_legacy_layout(&legacy);
    assert!(!legacy.join("optimizer/manifest.json").exists());
    resume_world(world, "resume-legacy", zero, ep, f32, dir);
    let two = dir.join("two");
    let files = safetensors_files(&two);
    let (mut tensors, mut masters) = (0, 0);
    for resumed in [dir.join("resumed"), dir.join("resumed-legacy")] {
        assert_eq!(files, safetensors_files(&resumed), "the same files");
        (tensors, masters) = same_tensors(&two, &resumed, &files);
    }
    let w0 = read(&start.join("model.safetensors"));
    let weights_moved = files
        .iter()
        .filter(|f| f.to_string_lossy().starts_with("model"))
        .flat_map(|f| read(&two.join(f)))
        .inspect(|(n, t)| assert_eq!(t.kind(), w0[n].kind(), "`{n}` saved in the checkpoint's dtype"))
        .any(|(n, t)| !t.equal(&w0[&n]));
    eprintln!(
        "world {world}, ZeRO {}, EP {ep}, fp32 compute {f32}: {} files, {tensors} tensors ({masters} masters) \
         equal bit for bit, resumed from this layout and from the one before the manifest",
        u8::from(zero),
        files.len()
    );
    assert!(masters > 0, "the optimizer state holds masters");
    assert!(weights_moved, "the steps moved the weights");
    // The weight probe: written where the trainer holds the whole model in the saved dtype (not
    // under expert parallelism, not with fp32 compute over bf16 weights), equal to scoring the
    // saved checkpoint, and resumed bit for bit like the weights.
    let written = ep == 1 && !f32;
    for d in [&two, &dir.join("one"), &dir.join("resumed")] {
        assert_eq!(d.join("probe.json").is_file(), written, "{}", d.display());
    }
    if written {
        let lp = crate::train::probe_matches_checkpoint(&two);
        assert_eq!(
            Some(lp),
            lego_rl::model::probe::read(&dir.join("resumed")).unwrap()
        );
    }
}

/// Asserts every tensor of `files` is equal in checkpoints `a` and `b`; returns (tensors,
/// masters) compared.
fn same_tensors(two: &Path, resumed: &Path, files: &[PathBuf]) -> (usize, usize) {
    let (mut tensors, mut masters) = (0, 0);
    for f in files {
        let (a, b) = (read(&two.join(f)), read(&resumed.join(f)));
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "{}",
            f.display()
        );
        for (name, ta) in &a {
            assert!(
                ta.equal(&b[name]),
                "{} of {}: `{name}` differs",
                f.display(),
                resumed.display()
            );
            tensors += 1;
            masters += usize::from(name.starts_with("master."));
        }
    }
    (tensors, masters)
}

#[test]
fn bf16_resume_is_bit_exact_on_one_rank() {
    resumes_bit_exactly(1, false, 1, false);
}

#[test]
fn bf16_resume_is_bit_exact_on_two_ranks_with_zero1() {
    resumes_bit_exactly(2, true, 1, false);
}

/// `--dtype float32` over the bf16 checkpoint under ZeRO-1: each rank keeps fp32 masters for its
/// slice although it computes in fp32, so the saved bf16 weights round from them and a resumed
/// run continues bit for bit.
#[test]
fn fp32_compute_of_bf16_resumes_bit_exactly_on_two_ranks_with_zero1() {
    resumes_bit_exactly(2, true, 1, true);
}

#[test]
fn bf16_resume_is_bit_exact_at_expert_parallel_2_on_four_ranks() {
    resumes_bit_exactly(4, true, 2, false);
}

/// Expert parallelism without ZeRO: each rank's experts keep full state (written by the first
/// rank holding them), the dense parameters' is written by rank 0.
#[test]
fn bf16_resume_is_bit_exact_at_expert_parallel_2_without_zero() {
    resumes_bit_exactly(2, false, 2, false);
}

/// `--zero 0` on 2 ranks sums a bf16 model's gradients in fp32 copies that stay alive, beside the
/// bf16 `.grad`s, until the update ends: `gradient_bytes` counts them, as `--plan`'s gradients
/// plus reduced gradients do (all but the gradients no rank has: experts no token reached).
#[test]
fn bf16_zero0_on_two_ranks_counts_its_fp32_gradient_copies_like_the_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tiny_moe_bf16();
    let fp32 = tmp.path().join("fp32");
    fp32_copy(&ckpt, &fp32);
    let input = tmp.path().join("b.jsonl.zst");
    crate::train::write_samples(&input, &samples(&fp32));
    let metrics = tmp.path().join("m.jsonl.zst");
    let two = ["--nproc-per-node", "2", "--zero", "0"];
    let opts = ["--micro-batch-tokens", "40", "--lr", "1e-5"];
    let o = crate::dist_train::run_train_step(&opts, &ckpt, &input, &tmp.path().join("out"), &metrics, &two);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = crate::train::read_metrics(&metrics).pop().unwrap();
    let measured = m.extra["gradient_bytes"].as_u64().unwrap();
    let plan = crate::common::lego()
        .args([
            "train-step",
            "--plan",
            "--format",
            "json",
            "--world-size",
            "2",
            "--zero",
            "0",
        ])
        .arg("--checkpoint")
        .arg(&ckpt)
        .output()
        .unwrap();
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let part = |k: &str| plan[k]["dense"].as_u64().unwrap() + plan[k]["experts"].as_u64().unwrap();
    let (grads, reduced) = (part("gradients"), part("reduced_gradients"));
    let ratio = measured as f64 / (grads + reduced) as f64;
    eprintln!(
        "world 2, ZeRO-0, bf16: gradient_bytes {measured} against the plan's {grads} (.grad) + {reduced} \
         (fp32 sums): {ratio:.4}"
    );
    // The bf16 `.grad`s alone are a third of the plan's figure.
    assert_eq!(reduced, 2 * grads, "fp32 sums of bf16 gradients");
    assert!((0.95..=1.0).contains(&ratio), "measured/plan {ratio}");
}
