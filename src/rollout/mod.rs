//! Rollout: real, unmodified harnesses in sandboxes, talking to the policy through the capturing
//! proxy, in groups; one [`Trajectory`] per trial.
//!
//! For each task of the shard and each epoch, one group of `group_size` trials. A trial is a
//! sandbox ([`crate::sandbox::Trial`]: setup → agent → extract → evaluate → cleanup), a trial
//! token on the in-process [`Proxy`] (served on a unix socket that the sandbox's relay forwards
//! to; the container has no other network), and one harness run rendered from its adapter
//! ([`crate::harness`]). The harness runtime is a read-only volume built once per harness
//! ([`crate::sandbox::runtime`]).
//!
//! - **Groups are the unit of output**: a group's trajectories are appended as one zstd frame
//!   (one `write`, fsynced) when its last trial ends, so a crash (even SIGKILL) loses at most the
//!   groups in flight, and a rerun with the same output skips every (task, group, sample) already
//!   there: each key ends up in the file exactly once.
//! - **Concurrency**: at most `concurrency` trials run at once; the next group's trials start as
//!   slots free up. `run` loads, plans and starts the services; `scheduler.rs` holds the groups
//!   and trials in flight and what happens as each trial ends.
//! - **Timeouts, in order**: sandbox setup runs inside the trial's budget (setup + agent + eval +
//!   slack; a watchdog ends a trial that exceeds it as `infra:timeout`, so a hung setup never holds
//!   a slot); the proxy never times out a model call on its own (the HTTP engine clients have no
//!   deadline), so the agent stage's limit is what ends a slow agent (`agent_timeout`).
//! - **Asynchronous operation** (`follow`): before each group, if a newer checkpoint than the
//!   loaded one is complete under the root, the trials in flight finish, the backend reloads it and
//!   new trajectories carry its policy version. A group that ends more than `max_staleness`
//!   versions behind the newest checkpoint is discarded and run again with the newer policy.
//! - **Dynamic sampling** (`dynamic`): after the planned groups, extra groups from the task pool
//!   until N groups have reward variance or the extra budget is spent; every group is marked.
//! - **Several harnesses** (`harnesses`): each trial runs on the harness the assignment policy
//!   names for its (task, group, sample), a pure function of the flags, so a rerun agrees.

pub mod audit;
mod backend;
pub mod dynamic;
pub mod follow;
pub mod forced;
pub mod hack_signals;
pub mod harnesses;
pub mod judge;
pub mod plan;
mod progress;
mod scheduler;
pub mod trial;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use backend::{check_flags, server_log, BackendSpec, VllmOptions};
pub use dynamic::{DynamicConfig, DynamicSummary};
pub use forced::Forced;
pub use harnesses::{Assignment, HarnessMix};
pub use plan::{GroupPlan, Shard};

use crate::chat::ChatFormat;
use crate::engine::{Backend, PrefixCacheStats};
use crate::harness::Harness;
use backend::{check_behaviour_logprobs, is_moe, load_chat, start_backend};
use plan::{existing, usable_tasks};
use scheduler::{Scheduler, Work};

use crate::io::{read_all, AppendWriter, ReadOptions};
use crate::proxy::{HarnessSampling, Proxy, ProxyConfig};
use crate::records::{ImageRecord, Sampling, Task, Trajectory};
use crate::sandbox::Engine;

/// Everything a rollout run needs (the CLI fills it from its flags).
#[derive(Debug, Clone)]
pub struct RolloutConfig {
    pub tasks: PathBuf,
    pub images: PathBuf,
    /// The harness adapters (`--harness`, once or more), and how trials are spread over them.
    pub harnesses: Vec<PathBuf>,
    pub harness_mix: HarnessMix,
    pub backend: BackendSpec,
    /// Tokenizer + chat template directory (default: the embedded checkpoint).
    pub chat_model: Option<PathBuf>,
    pub output: PathBuf,
    pub group_size: u32,
    pub concurrency: usize,
    pub shard: Shard,
    pub epochs: u64,
    /// Group id of the first epoch (later epochs count up from it).
    pub first_group: u64,
    pub max_trajectories: Option<u64>,
    pub follow: Option<PathBuf>,
    pub max_staleness: u64,
    /// Load a newer checkpoint between the generations of the trials in flight instead of after
    /// them (`rollout --reload-in-flight`; the proxy's [`Proxy::swap_weights`] keeps each
    /// generation on one version and records it).
    pub reload_in_flight: bool,
    pub sampling: Sampling,
    /// Whether requests' own temperature/top_p/top_k are ignored (`Pin`, train mode) or used.
    pub harness_sampling: HarnessSampling,
    /// Overrides the adapter's turn budget.
    pub max_turns: Option<u32>,
    /// Overrides the tasks' agent time limit.
    pub agent_timeout: Option<Duration>,
    /// Forced scripts: none, one for every harness, or one per harness in `harnesses` order.
    pub forced: Vec<PathBuf>,
    pub run_id: Option<String>,
    /// `train` or `eval` (recorded in every trajectory).
    pub mode: String,
    /// Image the harness runtime is installed with.
    pub base_image: String,
    /// Where runtime build state is cached.
    pub cache_dir: PathBuf,
    /// Device of the embedded engine (`cpu`, `cuda`, `cuda:N`).
    pub device: String,
    /// Context window offered to the harnesses (None: the backend's).
    pub max_context: Option<usize>,
    /// Budget of the embedded engine's prefix cache in bytes (0: off).
    pub prefix_cache_bytes: usize,
    /// `vllm-serve` and reload verification on vLLM.
    pub vllm: VllmOptions,
    /// Draw progress bars (the caller decides: TTY, not quiet).
    pub progress: bool,
    /// Fail on the first bad task or image record (the global `--strict`) instead of skipping
    /// and counting it.
    pub strict: bool,
    /// Dynamic sampling (`--min-informative-groups`, `--max-extra-groups`).
    pub dynamic: Option<DynamicConfig>,
    /// Tasks extra groups are drawn from (`--task-pool`; default: `tasks`).
    pub task_pool: Option<PathBuf>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Trajectories already in the output before this run.
    pub existing: u64,
    pub written: u64,
    pub groups: u64,
    pub infra_failures: u64,
    /// Mean reward of this run's graded trajectories.
    pub reward_mean: Option<f64>,
    /// Tasks of the shard skipped because their image is missing or failed to build.
    pub tasks_without_image: u64,
    /// Groups discarded for staleness and run again.
    pub stale_groups: u64,
    pub reloads: u64,
    /// Seconds the reloads took in all (verification and restarts included), and the server
    /// restarts they needed.
    pub reload_seconds: f64,
    pub reload_restarts: u64,
    /// Generations whose request asked for sampling it was not served with (pinned in train mode).
    pub sampling_overrides: u64,
    /// The first infra failure's trajectory id and cause, so that the summary says why.
    pub first_infra_cause: Option<String>,
    /// The backend's prefix-cache counters at the end, when it keeps them (the embedded engine).
    pub prefix_cache: Option<PrefixCacheStats>,
    /// Dynamic sampling's figures over the whole output, when it is on.
    pub dynamic: Option<DynamicSummary>,
}

/// Errors of a rollout run (each names its file or component).
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error(transparent)]
    Harness(#[from] crate::harness::HarnessError),
    #[error(transparent)]
    Forced(#[from] forced::ForcedError),
    #[error(transparent)]
    Follow(#[from] follow::FollowError),
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("{path}: loading the chat format: {msg}")]
    Chat { path: PathBuf, msg: String },
    #[error("starting the {backend} backend: {msg}")]
    Backend { backend: String, msg: String },
    #[error("reloading {dir}: {msg}")]
    Reload { dir: PathBuf, msg: String },
    #[error("{0}")]
    Invalid(String),
    #[error("serving the proxy on {path}: {source}")]
    Serve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// State shared by all trials of a run.
pub struct Shared {
    pub engine: Engine,
    pub proxy: Proxy,
    pub chat: Arc<ChatFormat>,
    /// The tokenizer and chat template folder, absolute (recorded in every trajectory).
    pub chat_dir: PathBuf,
    pub harness: Harness,
    pub forced: Forced,
    pub run_id: String,
    pub task_root: PathBuf,
    pub socket: PathBuf,
    pub binds: Vec<String>,
    pub backend_id: String,
    pub sampling: Sampling,
    pub harness_sampling: HarnessSampling,
    pub mode: String,
    pub agent_timeout: Option<Duration>,
}

/// The default run id: a stable hash of the output's absolute path, so a rerun after a crash
/// recognises (and removes) the sandboxes its killed predecessor left behind.
pub fn default_run_id(output: &Path) -> String {
    use sha2::Digest;
    let abs = std::path::absolute(output).unwrap_or_else(|_| output.to_path_buf());
    let h = sha2::Sha256::digest(abs.to_string_lossy().as_bytes());
    format!("rollout-{}", &hex::encode(h)[..12])
}

fn task_root(tasks: &Path) -> PathBuf {
    tasks
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The backend's own checkpoint directory (embedded engine, `vllm-serve`), if it has one.
fn served_dir(cfg: &RolloutConfig) -> Option<&PathBuf> {
    match &cfg.backend {
        BackendSpec::Embedded(dir) | BackendSpec::VllmServe(dir) => Some(dir),
        _ => None,
    }
}

/// What a run reads before it plans: the harnesses, and the shard's tasks that have an image.
struct Inputs {
    harnesses: Vec<Harness>,
    forced: Vec<Forced>,
    tasks: Vec<Task>,
    /// Dynamic sampling's pool (empty when it is off).
    pool: Vec<Task>,
    image_of: HashMap<String, String>,
    assignment: Assignment,
    tasks_without_image: u64,
}

/// Loads the harnesses, forced scripts, tasks and images (and the task pool), and keeps the
/// shard's tasks that have an image.
fn load_inputs(cfg: &RolloutConfig) -> Result<Inputs, RolloutError> {
    let harnesses = harnesses::load(&cfg.harnesses, cfg.max_turns)?;
    let forced = harnesses::load_forced(&cfg.forced, harnesses.len())?;
    let inputs = ReadOptions {
        strict: cfg.strict,
        ..ReadOptions::default()
    };
    let tasks: Vec<Task> = read_all(&cfg.tasks, inputs)?;
    let images: Vec<ImageRecord> = read_all(&cfg.images, inputs)?;
    let shard_tasks = cfg.shard.select(&tasks);
    let (usable, tasks_without_image) = usable_tasks(shard_tasks, &images);
    let mut image_of: HashMap<String, String> =
        usable.iter().map(|(t, i)| (t.id.clone(), i.clone())).collect();
    let tasks: Vec<Task> = usable.into_iter().map(|(t, _)| t).collect();
    // Dynamic sampling's pool: the shard's tasks of --task-pool (default the input) with an image.
    let pool: Vec<Task> = match (&cfg.dynamic, &cfg.task_pool) {
        (None, _) => Vec::new(),
        (Some(_), None) => tasks.clone(),
        (Some(_), Some(path)) => dynamic::load_pool(path, cfg.shard, &images, inputs, &mut image_of)?,
    };
    let names: Vec<String> = harnesses.iter().map(|h| h.config.name.clone()).collect();
    let assignment = Assignment::new(cfg.harness_mix, &names, &tasks, &pool)?;
    Ok(Inputs {
        harnesses,
        forced,
        tasks,
        pool,
        image_of,
        assignment,
        tasks_without_image,
    })
}

/// Opens the output for appending (cutting a torn final frame) and reads what it already holds.
fn open_output(output: &Path) -> Result<(AppendWriter, Vec<Trajectory>), RolloutError> {
    if let Some(dir) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| crate::io::IoError::Write {
            path: output.to_path_buf(),
            source,
        })?;
    }
    let (writer, cut) = AppendWriter::open(output)?;
    if cut > 0 {
        tracing::warn!("{}: cut a torn final frame of {cut} bytes", output.display());
    }
    Ok((writer, existing(output)?))
}

/// What a run starts before its first trial: the backend, the proxy serving it on a unix socket,
/// and one [`Shared`] per harness.
struct Services {
    backend: Arc<dyn Backend>,
    proxy: Proxy,
    /// One per harness, in `--harness` order (the assignment's indices).
    shared: Vec<Arc<Shared>>,
    /// The proxy's server task, stopped when the run ends.
    server: tokio::task::JoinHandle<()>,
    /// The folder of the proxy's socket, removed when the run ends.
    _sock_dir: tempfile::TempDir,
    /// The served checkpoint's policy version.
    policy_version: u64,
}

/// Sweeps the sandboxes an earlier run with this id left, builds the harness runtimes, starts the
/// backend and serves the proxy.
async fn start_services(
    cfg: &RolloutConfig,
    harnesses: Vec<Harness>,
    forced: Vec<Forced>,
) -> Result<Services, RolloutError> {
    let engine = Engine::connect().await?;
    let run_id = cfg.run_id.clone().unwrap_or_else(|| default_run_id(&cfg.output));
    let swept = engine.sweep(Some(&run_id)).await?;
    if swept > 0 {
        tracing::warn!("removed {swept} sandbox objects left by an earlier run {run_id}");
    }
    crate::sandbox::trial::install_signal_sweep(engine.clone(), run_id.clone());
    let binds = harnesses::runtime_binds(&engine, &harnesses, &cfg.base_image, &cfg.cache_dir).await?;

    let (backend, chat_dir) = start_backend(cfg).await?;
    check_behaviour_logprobs(
        &cfg.mode,
        cfg.harness_sampling,
        &cfg.sampling,
        &backend.id(),
        backend.processed_logprobs(),
    )?;
    let chat = Arc::new(load_chat(&chat_dir)?);
    // The served checkpoint's version: the embedded directory's, else the chat model directory's
    // (an HTTP engine is normally serving the checkpoint whose tokenizer it was given).
    let policy_dir = served_dir(cfg).unwrap_or(&chat_dir);
    let policy_version = follow::policy_version(policy_dir)?;
    let proxy = Proxy::new(
        chat.clone(),
        backend.clone(),
        ProxyConfig {
            sampling: cfg.sampling.clone(),
            harness_sampling: cfg.harness_sampling,
            max_context: cfg.max_context,
            // Routing is asked of the backend only for an MoE policy, so that a missing one
            // can be recorded as missing.
            return_routing: is_moe(policy_dir),
            ..ProxyConfig::default()
        },
    );
    let sock_dir = tempfile::Builder::new()
        .prefix("lego-rl-proxy-")
        .tempdir()
        .map_err(|source| RolloutError::Serve {
            path: std::env::temp_dir(),
            source,
        })?;
    let socket = sock_dir.path().join("proxy.sock");
    let server = proxy
        .serve_unix(&socket)
        .await
        .map_err(|source| RolloutError::Serve {
            path: socket.clone(),
            source,
        })?;

    // One shared state per harness (its adapter, forced scripts and runtime volume): a trial runs
    // on the one the assignment names, and its trajectory records that harness.
    let chat_dir = std::path::absolute(&chat_dir).unwrap_or(chat_dir);
    let shared: Vec<Arc<Shared>> = harnesses
        .into_iter()
        .zip(forced)
        .zip(binds)
        .map(|((harness, forced), bind)| {
            Arc::new(Shared {
                engine: engine.clone(),
                proxy: proxy.clone(),
                chat: chat.clone(),
                chat_dir: chat_dir.clone(),
                backend_id: backend.id(),
                harness,
                forced,
                run_id: run_id.clone(),
                task_root: task_root(&cfg.tasks),
                socket: socket.clone(),
                binds: vec![bind],
                sampling: cfg.sampling.clone(),
                harness_sampling: cfg.harness_sampling,
                mode: cfg.mode.clone(),
                agent_timeout: cfg.agent_timeout,
            })
        })
        .collect();
    Ok(Services {
        backend,
        proxy,
        shared,
        server,
        _sock_dir: sock_dir,
        policy_version,
    })
}

/// Runs a rollout to completion (or until `max_trajectories`), appending to `cfg.output`.
pub async fn run(cfg: &RolloutConfig) -> Result<Summary, RolloutError> {
    if cfg.group_size == 0 {
        return Err(RolloutError::Invalid("--group-size must be at least 1".into()));
    }
    let inputs = load_inputs(cfg)?;
    let (writer, before) = open_output(&cfg.output)?;
    let done: BTreeSet<plan::Key> = before
        .iter()
        .map(|t| (t.task_id.clone(), t.group_id, t.sample_index))
        .collect();
    let mut summary = Summary {
        existing: done.len() as u64,
        tasks_without_image: inputs.tasks_without_image,
        ..Default::default()
    };
    let pending: VecDeque<GroupPlan> =
        plan::plan(&inputs.tasks, cfg.epochs, cfg.first_group, cfg.group_size, &done).into();
    let pool = inputs.pool;
    let oversampler = cfg
        .dynamic
        .map(|d| dynamic::Oversampler::new(d, pool, cfg.first_group + cfg.epochs, cfg.group_size, &before));
    drop(before);
    summary.dynamic = oversampler.as_ref().map(dynamic::Oversampler::summary);
    if pending.is_empty() && oversampler.as_ref().is_none_or(|o| !o.wants_more(0)) {
        return Ok(summary);
    }

    let services = start_services(cfg, inputs.harnesses, inputs.forced).await?;
    let work = Work {
        pending,
        oversampler,
        image_of: inputs.image_of,
        assignment: inputs.assignment,
    };
    let mut scheduler = Scheduler::new(cfg, services, work, writer, summary);
    loop {
        if let Some(group) = scheduler.next_group() {
            scheduler.start_group(group).await?;
        } else if !scheduler.join_one().await? {
            break;
        }
    }
    Ok(scheduler.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_run_id_is_stable_per_output() {
        let a = default_run_id(Path::new("/x/traj.jsonl.zst"));
        assert_eq!(a, default_run_id(Path::new("/x/traj.jsonl.zst")));
        assert_ne!(a, default_run_id(Path::new("/y/traj.jsonl.zst")));
    }
}
