//! `lego-rl train-step`: one GSPO update with MoE routing replay.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::c10d::{launch::run_local, Backend, ProcessGroup};
use crate::io::{read_all, AppendWriter, ReadOptions};
use crate::model::{parse_kind, ExpertLayout, DEFAULT_LOGPROB_CHUNK};
use crate::records::Sample;
use crate::settings::GlobalArgs;
use crate::train::correction::{Correction, CorrectionSettings};
use crate::train::plan::{self, Plan, PlanSpec};
use crate::train::{trainer::check_out, AdamWConfig, LossKind, Schedule, Settings, Trainer};
use crate::units::parse_bytes;

/// Update the policy with GSPO on aligned samples, replaying rollout routing.
///
/// Reads samples, recomputes old log-probs with the recorded MoE routing (R3), applies the
/// sequence-level GSPO loss with group-relative advantages, and writes a new Hugging Face
/// checkpoint (plus optimizer state and lego-rl.json, so the next step resumes exactly) and
/// appends one step-metrics record. Nothing is written to --out unless the step succeeds.
/// Samples of a mixed rollout (align writes each one's harness into `metadata.harness`) get the
/// step's figures per harness too (`by_harness`: trajectories, reward, mean advantage, log-prob
/// agreement, mixed groups); the GSPO advantage stays within each (task, group).
///
/// Many ranks (data parallel, the same update as one process on the whole batch): start N local
/// ranks with --nproc-per-node N, or start one process per GPU with torchrun or srun (RANK,
/// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; or SLURM_PROCID, SLURM_NTASKS,
/// SLURM_LOCALID and the job's first node). Rendezvous and collectives are libtorch's c10d
/// (Gloo on CPU, NCCL on CUDA); --zero 1 (the default on many ranks) shards AdamW's moments.
///
/// Example:
///   lego-rl train-step --checkpoint run/checkpoints/step-000000 -i run/samples/step-000000.jsonl.zst \
///       --out run/checkpoints/step-000001 --metrics run/metrics.jsonl.zst
///
///   # 8 GPUs of one machine; or under Slurm: srun --ntasks-per-node 8 --gpus-per-task 1 lego-rl train-step ...
///   lego-rl train-step --nproc-per-node 8 --device cuda --checkpoint ... -i ... --out ...
///
///   # Memory per rank before anything runs (config.json only; exit 1 when it does not fit):
///   lego-rl train-step --plan --checkpoint Qwen3-30B-A3B/config.json --world-size 8 \
///       --expert-parallel 8 --activation-checkpointing --device-memory 141GB
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct TrainStepArgs {
    /// Samples (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub input: PathBuf,
    /// Checkpoint to start from (Hugging Face layout); for --plan, its config.json is enough.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Directory of the new checkpoint (must not exist, or be empty).
    #[arg(long, required_unless_present = "plan")]
    pub out: Option<PathBuf>,
    /// Step-metrics file to append one record to.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype (float32, bfloat16); default: the checkpoint's. Saved weights keep the
    /// checkpoint's dtype.
    #[arg(long)]
    pub dtype: Option<String>,
    /// Objective.
    #[arg(long, value_enum, default_value = "gspo")]
    pub loss: LossKind,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    /// Final learning rate of the cosine schedule.
    #[arg(long, default_value_t = 0.0)]
    pub min_lr: f64,
    /// Linear warmup, in optimizer updates.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Schedule after warmup.
    #[arg(long, value_enum, default_value = "constant")]
    pub schedule: Schedule,
    /// Optimizer updates over which the cosine schedule decays.
    #[arg(long, default_value_t = 1000)]
    pub total_steps: u64,
    /// AdamW weight decay (not applied to norms and biases).
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Lower clip range of the sequence ratio.
    #[arg(long, default_value_t = 3e-4)]
    pub eps_low: f64,
    /// Upper clip range of the sequence ratio.
    #[arg(long, default_value_t = 4e-4)]
    pub eps_high: f64,
    /// Optimizer updates per step (mini-batches of whole groups).
    #[arg(long, default_value_t = 1)]
    pub updates: usize,
    /// Tokens per packed micro-batch (gradient accumulation over micro-batches). A longer sample
    /// trains whole, alone in its micro-batch; with --device-memory it must fit too, or the step
    /// stops before loading weights, naming it.
    #[arg(long, default_value_t = 8192)]
    pub micro_batch_tokens: usize,
    /// Recompute each layer's activations in the backward pass (per-layer activation
    /// checkpointing): activation memory of one layer instead of all, for one more forward pass.
    #[arg(long)]
    pub activation_checkpointing: bool,
    /// Positions per chunk of the LM head (0 = off: all scored positions at once).
    ///
    /// Log-probs and their gradient are computed chunk by chunk, with the softmax gradient in
    /// closed form, so at most N × vocab logits exist at a time instead of one per scored token
    /// of the micro-batch (on a 151936-token vocabulary these dominate memory). Same gradients.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LOGPROB_CHUNK)]
    pub logprob_chunk: usize,
    /// Gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Truncated importance-sampling cap on π_old/π_rollout per token (off when absent; the cap
    /// of --is-correction tis, 2.0 there when absent).
    #[arg(long)]
    pub tis_cap: Option<f64>,
    /// Off-policy corrections of the rollout/trainer mismatch, comma-separated: tis (token
    /// weight min(ρ, --tis-cap)), token-mask (IcePop: zero weight for a token whose
    /// ρ = π_old/π_rollout leaves [--is-mask-low, --is-mask-high]), seq-mask (drop a sequence with
    /// any such token), geo-mask (drop a sequence whose geometric-mean ρ leaves [--is-geo-low,
    /// --is-geo-high]). Combinable with each other and with --replay. The metrics record the
    /// masked fractions and the spread of log ρ (is_*). Example: --is-correction geo-mask,tis
    #[arg(long, value_delimiter = ',', value_name = "KINDS")]
    pub is_correction: Vec<Correction>,
    /// Lower bound of ρ kept by token-mask and seq-mask.
    #[arg(long, default_value_t = 0.5)]
    pub is_mask_low: f64,
    /// Upper bound of ρ kept by token-mask and seq-mask.
    #[arg(long, default_value_t = 2.0)]
    pub is_mask_high: f64,
    /// Lower bound of the geometric-mean ρ kept by geo-mask.
    #[arg(long, default_value_t = 0.99)]
    pub is_geo_low: f64,
    /// Upper bound of the geometric-mean ρ kept by geo-mask.
    #[arg(long, default_value_t = 1.01)]
    pub is_geo_high: f64,
    /// Parameters not to update: a regular expression matched anywhere in the Hugging Face
    /// parameter names (e.g. `embed_tokens` freezes the token embeddings, and with them a tied
    /// LM head). Matching no parameter, or all of them, is an error.
    #[arg(long, value_name = "REGEX")]
    pub freeze: Option<String>,
    /// MoE routing replay (R3): `on`, the trainer's MoE layers use the experts recorded at
    /// generation time (gates still from its own router); `off`, its router picks its own and the
    /// record is only compared with them (expert_overlap, and the log-prob agreement without R3:
    /// the paper's ablation). The metrics record which (`routing_replay`).
    #[arg(long, value_enum, default_value = "on")]
    pub replay: Replay,
    /// Seed of torch's generator.
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
    /// Start N ranks of this command on this machine (like `torchrun --standalone`): a free local
    /// port for the rendezvous, stderr lines prefixed `[rank R]`, SIGINT/SIGTERM forwarded, and
    /// all ranks ended when one fails. With --device cuda, rank R uses cuda:R.
    #[arg(long, value_name = "N", help_heading = "Distributed")]
    pub nproc_per_node: Option<usize>,
    /// ZeRO stage: 1 = each rank keeps the AdamW moments of 1/N of the parameters (gradients
    /// reduce-scatter, updated parameters all-gather); 0 = every rank keeps all (gradients
    /// all-reduce). Default: 1 on many ranks, 0 in one process. Resuming ZeRO-1 state needs the
    /// same world size (and --expert-parallel).
    #[arg(long, value_name = "STAGE", value_parser = clap::value_parser!(u8).range(0..=1), help_heading = "Distributed")]
    pub zero: Option<u8>,
    /// Seconds any rendezvous or collective may wait for the other ranks; a rank that died or
    /// hangs makes the others fail with an error after at most this long.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 600,
        help_heading = "Distributed"
    )]
    pub dist_timeout: u64,
    /// c10d backend; default: nccl with --device cuda, else gloo.
    #[arg(long, value_enum, help_heading = "Distributed")]
    pub dist_backend: Option<Backend>,
    /// Size of one gradient bucket (one all-reduce or reduce-scatter), in MiB of fp32.
    #[arg(long, value_name = "MIB", default_value_t = 25, help_heading = "Distributed")]
    pub bucket_mb: u64,
    /// Expert parallelism: split every MoE layer's experts over groups of E consecutive ranks.
    ///
    /// Each rank holds num_experts/E experts (E must divide the world size and num_experts);
    /// tokens go to the ranks holding their (replayed or routed) experts by all_to_all and come
    /// back weighted by gates from their own rank's router, so the update equals one process's.
    /// Expert gradients are summed over the ranks holding the same experts (ranks r, r+E, ...);
    /// everything else stays data parallel. The checkpoint is written as sharded safetensors,
    /// each expert once. With --zero 1 the experts' moments are sharded over the ranks holding
    /// the same experts, the rest over the world.
    ///
    ///   lego-rl train-step --nproc-per-node 8 --expert-parallel 8 --device cuda --checkpoint ...
    #[arg(long, value_name = "E", default_value_t = 1, help_heading = "Distributed")]
    pub expert_parallel: usize,
    /// How the saved checkpoint stores the routed experts: keep (as the input checkpoint),
    /// per-expert (`experts.N.gate_proj.weight`, ...) or fused (`experts.gate_up_proj`
    /// [E, 2·I, hidden] and `experts.down_proj` [E, hidden, I], as transformers ≥ 5 and
    /// Qwen3.5 store them). Converting writes sharded safetensors with an index.
    #[arg(long, value_enum, default_value = "keep")]
    pub expert_layout: ExpertLayout,
    /// Print this step's memory per rank (weights, gradients, optimizer state, activations) and
    /// exit, without compute, weights or a device (--checkpoint may be a config.json): exit 0
    /// when it fits --device-memory (or that is not given), 1 when not.
    ///
    /// The plan reads the flags that shape memory (--checkpoint, --dtype, --micro-batch-tokens,
    /// --activation-checkpointing, --logprob-chunk, --zero, --bucket-mb, --expert-parallel,
    /// --device-memory, and --world-size or --nproc-per-node) and checks the others' values; the
    /// rest (--input, --out, --metrics, --device, the loss, optimizer and correction flags) are
    /// ignored, so a step's own command line plus --plan prints that step's plan.
    #[arg(long, help_heading = "Memory plan")]
    pub plan: bool,
    /// Memory of one device (141GiB, 80GB = 8e10, 80G = 80GiB, ...): the plan's fit; without --plan, a step that
    /// would not fit stops before loading weights, with the plan in the error.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes, help_heading = "Memory plan")]
    pub device_memory: Option<u64>,
    /// Ranks the plan is for; default: WORLD_SIZE, else SLURM_NTASKS, else --nproc-per-node, else 1.
    #[arg(long, value_name = "N", requires = "plan", help_heading = "Memory plan")]
    pub world_size: Option<usize>,
    /// How --plan prints.
    #[arg(
        long,
        value_enum,
        default_value = "table",
        requires = "plan",
        help_heading = "Memory plan"
    )]
    pub format: PlanFormat,
}

/// `--format` of `--plan`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    Table,
    Json,
}

/// `--replay`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    On,
    Off,
}

/// What the flags resolve to, worked out once before any work starts: the step and `--plan` both
/// read it, so they cannot derive a default differently.
struct Resolved {
    /// `--dtype`, parsed (None: the checkpoint's).
    dtype: Option<tch::Kind>,
    /// `--zero`, when given (None: stage 1 on many ranks, 0 in one process; see
    /// [`Resolved::zero`]).
    zero: Option<bool>,
    /// The trainer's settings, all but `zero`, which waits for the world size.
    train: Settings,
}

impl Resolved {
    /// Checks every flag that needs no file, device or process group, and derives the defaults.
    fn from_args(args: &TrainStepArgs) -> anyhow::Result<Self> {
        let dtype = args
            .dtype
            .as_deref()
            .map(|d| parse_kind(d).with_context(|| format!("--dtype {d}: expected float32 or bfloat16")))
            .transpose()?;
        for (name, low, high) in [
            (
                "--is-mask-low/--is-mask-high",
                args.is_mask_low,
                args.is_mask_high,
            ),
            ("--is-geo-low/--is-geo-high", args.is_geo_low, args.is_geo_high),
        ] {
            anyhow::ensure!(
                0.0 < low && low <= 1.0 && 1.0 <= high,
                "{name} {low}/{high}: need 0 < low <= 1 <= high (an on-policy token, ratio 1, is always kept)"
            );
        }
        anyhow::ensure!(args.expert_parallel >= 1, "--expert-parallel 0: need at least 1");
        anyhow::ensure!(
            args.nproc_per_node != Some(0),
            "--nproc-per-node 0: need at least one rank"
        );
        let train = Settings {
            loss: args.loss,
            eps_low: args.eps_low,
            eps_high: args.eps_high,
            updates: args.updates.max(1),
            micro_batch_tokens: args.micro_batch_tokens.max(1),
            activation_checkpointing: args.activation_checkpointing,
            logprob_chunk: (args.logprob_chunk > 0).then_some(args.logprob_chunk),
            max_grad_norm: args.max_grad_norm,
            tis_cap: args.tis_cap,
            correction: CorrectionSettings {
                kinds: args.is_correction.clone(),
                tis_cap: args.tis_cap.unwrap_or(2.0),
                mask_low: args.is_mask_low,
                mask_high: args.is_mask_high,
                geo_low: args.is_geo_low,
                geo_high: args.is_geo_high,
            },
            adv_eps: 1e-6,
            freeze: args.freeze.clone(),
            zero: false,
            bucket_elems: (args.bucket_mb.max(1) * 1024 * 1024 / 4) as i64,
            replay: args.replay == Replay::On,
            optim: AdamWConfig {
                lr: args.lr,
                min_lr: args.min_lr,
                warmup_steps: args.warmup_steps,
                schedule: args.schedule,
                total_steps: args.total_steps,
                weight_decay: args.weight_decay,
                ..AdamWConfig::default()
            },
        };
        Ok(Resolved {
            dtype,
            zero: args.zero.map(|z| z == 1),
            train,
        })
    }

    /// ZeRO-1 on `world` ranks: `--zero`, else on for many ranks.
    fn zero(&self, world: usize) -> bool {
        self.zero.unwrap_or(world > 1)
    }
}

/// Runs `train-step`.
pub fn run(args: TrainStepArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let resolved = Resolved::from_args(&args)?;
    if args.plan {
        return print_plan(&args, &resolved);
    }
    let out = args.out.clone().context("--out is required")?;
    // Before anything is read or launched: `--device cuda` without a GPU fails here, saying so.
    let mut device = crate::device::resolve(&args.device)?;
    if let Some(n) = args.nproc_per_node.filter(|_| std::env::var_os("RANK").is_none()) {
        if args.input == Path::new("-") {
            anyhow::bail!("--input -: every rank reads the samples itself; give a file");
        }
        return launch(n);
    }
    let backend = args.dist_backend.unwrap_or(if device.is_cuda() {
        Backend::Nccl
    } else {
        Backend::Gloo
    });
    let pg = ProcessGroup::from_env(backend, Duration::from_secs(args.dist_timeout.max(1)))?;
    if pg.world_size() > 1 {
        if args.input == Path::new("-") {
            anyhow::bail!("--input -: every rank reads the samples itself; give a file");
        }
        if args.device == "cuda" {
            // One GPU per rank: all of the node's GPUs visible (torchrun, the launcher) → the
            // local rank's; one per task (srun --gpus-per-task 1) → that one.
            let visible = tch::Cuda::device_count().max(1) as usize;
            device = tch::Device::Cuda(pg.local_rank() % visible);
        }
        tracing::info!(rank = pg.rank(), world_size = pg.world_size(), %backend, ?device, "joined the process group");
    }
    // Collectives run on the model's device (cuda:LOCAL_RANK for NCCL unless one GPU per task).
    let pg = pg.with_device(device);
    check_out(&out)?;
    // A family the model code does not implement is refused before any sample is read.
    let cfg = crate::model::Config::from_file(&args.checkpoint.join("config.json"))
        .with_context(|| format!("loading checkpoint {}", args.checkpoint.display()))?;
    if let Some(mem) = args.device_memory {
        let plan = memory_plan(&args, &resolved, &cfg, pg.world_size(), Some(mem), None)?;
        if plan.fits == Some(false) {
            anyhow::bail!(
                "this step does not fit in --device-memory ({} bytes per device); nothing was loaded. \
                 The plan (lego-rl train-step --plan):\n{}",
                mem,
                plan.table()
            );
        }
    }
    tch::manual_seed(args.seed);
    let samples: Vec<Sample> = read_all(
        &args.input,
        ReadOptions {
            strict: true,
            ..ReadOptions::default()
        },
    )?;
    // A sample longer than a micro-batch trains whole, alone in its micro-batch: with a device
    // memory given, the longest such sample must fit too, or the step stops here, naming it,
    // before any weight is loaded.
    if let Some(mem) = args.device_memory {
        let longest = samples
            .iter()
            .max_by_key(|s| s.token_ids.len())
            .filter(|s| s.token_ids.len() > resolved.train.micro_batch_tokens);
        if let Some(s) = longest {
            let n = s.token_ids.len() as u64;
            let plan = memory_plan(&args, &resolved, &cfg, pg.world_size(), Some(mem), Some(n))?;
            if plan.fits == Some(false) {
                anyhow::bail!(
                    "{}: sample `{}` has {n} tokens, more than --micro-batch-tokens {}; it trains whole, \
                     alone in its micro-batch, and that needs {} bytes per device, more than \
                     --device-memory {mem}; nothing was loaded. The plan at {n} tokens:\n{}",
                    args.input.display(),
                    s.id,
                    resolved.train.micro_batch_tokens,
                    plan.total,
                    plan.table()
                );
            }
        }
    }
    let settings = Settings {
        zero: resolved.zero(pg.world_size()),
        ..resolved.train
    };
    let mut trainer = if args.expert_parallel > 1 {
        let groups = pg.expert_groups(args.expert_parallel)?;
        Trainer::load_expert_parallel(&args.checkpoint, device, resolved.dtype, groups)
    } else {
        Trainer::load(&args.checkpoint, device, resolved.dtype)
    }
    .with_context(|| format!("loading checkpoint {}", args.checkpoint.display()))?;
    trainer.expert_layout = args.expert_layout;
    let metrics = trainer.step_on(&samples, &args.input, &settings, &pg)?;
    trainer.save_atomic_on(&out, &pg)?;
    if pg.rank() != 0 {
        return Ok(Outcome::Ok);
    }
    tracing::info!(
        step = metrics.step,
        loss = metrics.loss,
        grad_norm = metrics.grad_norm,
        tokens_per_second = metrics.tokens_per_second,
        "train-step done"
    );
    if metrics.by_harness.len() > 1 {
        for (harness, h) in &metrics.by_harness {
            tracing::info!(
                harness = harness.as_str(),
                trajectories = h.trajectories,
                reward_mean = h.reward_mean,
                advantage_mean = h.advantage_mean,
                logprob_pearson = h.logprob_pearson,
                mixed_groups = h.mixed_groups,
                "train-step, by harness"
            );
        }
    }
    if let Some(path) = &args.metrics {
        let (mut w, _) = AppendWriter::open(path)?;
        w.push(&metrics)?;
        w.commit()?;
    }
    Ok(Outcome::Ok)
}

/// `--nproc-per-node N`: this command line, minus that option, on N local ranks.
fn launch(n: usize) -> anyhow::Result<Outcome> {
    let mut args: Vec<OsString> = Vec::new();
    let mut skip = false;
    for a in std::env::args_os().skip(1) {
        if std::mem::take(&mut skip) {
            continue;
        }
        match a.to_str() {
            Some("--nproc-per-node") => skip = true,
            Some(s) if s.starts_with("--nproc-per-node=") => {}
            _ => args.push(a),
        }
    }
    let outcome = run_local(n, &args)?;
    if let Some(sig) = outcome.interrupted {
        anyhow::bail!("train-step on {n} ranks was interrupted (signal {sig}, forwarded to every rank)");
    }
    match (outcome.code, outcome.first_failure) {
        (0, _) => Ok(Outcome::Ok),
        (1, _) => Ok(Outcome::Failures),
        (_, Some((rank, how))) => anyhow::bail!("train-step on {n} ranks failed: rank {rank} {how}"),
        (_, None) => anyhow::bail!("train-step on {n} ranks was interrupted"),
    }
}

/// The memory plan of this step for `world` ranks, from the same resolved settings as the step.
fn memory_plan(
    args: &TrainStepArgs,
    resolved: &Resolved,
    cfg: &crate::model::Config,
    world: usize,
    device_memory: Option<u64>,
    tokens: Option<u64>,
) -> anyhow::Result<Plan> {
    let stored_dtype = cfg
        .dtype
        .as_deref()
        .map(|d| parse_kind(d).with_context(|| format!("dtype {d}: expected float32 or bfloat16")))
        .transpose()?
        .unwrap_or(tch::Kind::Float);
    let t = &resolved.train;
    let spec = PlanSpec {
        world_size: world,
        expert_parallel: args.expert_parallel,
        zero: resolved.zero(world),
        dtype: resolved.dtype.unwrap_or(stored_dtype),
        stored_dtype,
        micro_batch_tokens: tokens.unwrap_or(t.micro_batch_tokens as u64),
        activation_checkpointing: t.activation_checkpointing,
        logprob_chunk: t.logprob_chunk.map(|c| c as u64),
        bucket_elems: t.bucket_elems as u64,
        device_memory,
    };
    Ok(plan::plan(cfg, &spec)?)
}

/// `--plan`: prints the plan of `--checkpoint`'s config.json; exit 1 when it does not fit.
fn print_plan(args: &TrainStepArgs, resolved: &Resolved) -> anyhow::Result<Outcome> {
    let path = if args.checkpoint.is_file() {
        args.checkpoint.clone()
    } else {
        args.checkpoint.join("config.json")
    };
    let cfg = crate::model::Config::from_file(&path)?;
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let world = args
        .world_size
        .or_else(|| env("WORLD_SIZE"))
        .or_else(|| env("SLURM_NTASKS"))
        .or(args.nproc_per_node)
        .unwrap_or(1);
    let plan = memory_plan(args, resolved, &cfg, world, args.device_memory, None)?;
    let text = match args.format {
        PlanFormat::Table => plan.table(),
        PlanFormat::Json => serde_json::to_string_pretty(&plan)? + "\n",
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(if plan.fits == Some(false) {
        Outcome::Failures
    } else {
        Outcome::Ok
    })
}
