//! The embedded engine: the tch Qwen3 / Qwen3-MoE model of [`crate::model`] serving
//! token-level generations with a KV cache, seeded sampling (temperature, top-k, top-p, stop
//! ids, stop strings, max tokens), the log-prob of every output token and the routing of every
//! forwarded position.
//!
//! Stop strings are matched on the output decoded with the checkpoint's `tokenizer.json` (special
//! tokens skipped, see [`super::stop`]). The output ids keep every token the model sampled,
//! including the one that completed the stop string (it may carry text beyond it): the capture is
//! exactly what was sampled, and the proxy cuts the text it returns.
//!
//! One worker thread ([`super::worker`]) owns the model. Requests queue on a channel; the worker
//! keeps every active sequence with its own KV cache. Each iteration advances every sequence by one token: all the
//! sequences past their prompt go through ONE batched decode forward
//! ([`crate::model::CausalLm::decode_batch`]: embeddings, projections, norms, experts and the LM
//! head on `[B, hidden]`, attention per sequence over its own cache), then each new sequence's
//! prompt is prefilled in a forward of its own. A decode step is dominated by reading weights (on
//! CPU the 151936-wide LM head alone is about half of it); B sequences now read them once, not B
//! times. Sampling stays per sequence (own seeded rng, own row of log-probs); sequences join and
//! leave the batch between steps. A lone sequence computes exactly as before batching; in a batch
//! its log-probs move by summation order only (~1e-6), which can change a token drawn from a nearly
//! flat distribution now and then (a random model at T = 1). A cap of 1 on the batch
//! ([`EngineOptions::max_decode_batch`]) is the former one-forward-per-sequence interleaving.
//! Log-probs are of the model's own distribution (temperature 1), the quantity the trainer
//! recomputes; the sampling distribution applies temperature / top-k / top-p on top
//! ([`super::sampling`]).
//!
//! A prefix cache ([`super::prefix_cache`], on by default, [`EngineOptions::prefix_cache_bytes`])
//! keeps the KV and routing of every prompt once prefilled and of every finished sequence, so a
//! prompt starting with a cached prefix (the next turn of a conversation, another sample of a
//! group) prefills only the rest. Cached positions carry the routing they were computed with, so
//! captures are those of an uncached engine; the cache is dropped when weights are reloaded.
//! Hybrid models resume from snapshots of their recurrent states kept where entries end.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use futures::future::BoxFuture;
use futures::FutureExt;
use tch::Device;

use super::prefix_cache::{self, PrefixCache};
use super::worker::worker;
use super::{Backend, EngineError, GenerateOutput, GenerateRequest, PrefixCacheStats, TokenSink};
use crate::chat::ChatTokenizer;
use crate::model::Model;

pub(super) const NAME: &str = "embedded";

pub(super) type Reply = tokio::sync::oneshot::Sender<Result<GenerateOutput, EngineError>>;

pub(super) enum Msg {
    Generate(GenerateRequest, Reply, Option<TokenSink>),
    Reload(PathBuf, tokio::sync::oneshot::Sender<Result<(), EngineError>>),
}

/// The embedded engine (see the module docs).
pub struct EmbeddedBackend {
    tx: mpsc::Sender<Msg>,
    dir: PathBuf,
    context: usize,
    counters: Arc<Counters>,
    /// Whether the checkpoint has a tokenizer (needed for stop strings).
    has_tokenizer: bool,
}

/// What the worker has done so far (tests and benchmarks read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineCounts {
    /// Sequences being generated now.
    pub active: usize,
    /// Generations answered.
    pub completed: u64,
    /// Generations abandoned because their requester went away (client disconnected).
    pub cancelled: u64,
    /// Model forward passes: one per prefill (a new sequence's prompt) and one per decode step,
    /// where a decode step forwards the pending token of every decoding sequence at once (up to
    /// the decode-batch cap). With one sequence at a time, prefill + one per output token.
    pub forwards: u64,
    /// The most sequences one decode forward has covered so far.
    pub largest_decode_batch: usize,
    /// The prefix cache's counters (prompt tokens received and computed, hits, bytes).
    pub prefix_cache: PrefixCacheStats,
}

/// How the engine runs (what `rollout`'s engine flags set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// At most this many sequences (at least 1) per decode forward; more decoding sequences
    /// take several forwards per step. 1 is the engine before batched decode (one forward per
    /// sequence per step), which scripts/bench/decode.sh measures against.
    pub max_decode_batch: usize,
    /// Budget of the prefix cache in bytes of KV, routing and recurrent-state snapshots; 0 turns
    /// it off.
    pub prefix_cache_bytes: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_decode_batch: usize::MAX,
            prefix_cache_bytes: prefix_cache::DEFAULT_BYTES,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) active: AtomicUsize,
    pub(super) completed: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) forwards: AtomicU64,
    pub(super) largest_decode_batch: AtomicUsize,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) prefill_tokens: AtomicU64,
    pub(super) prefills: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) cache_bytes: AtomicU64,
    pub(super) cache_budget: AtomicU64,
    pub(super) cache_evictions: AtomicU64,
    pub(super) cache_invalidations: AtomicU64,
}

impl Counters {
    fn prefix_cache(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            prompt_tokens: self.prompt_tokens.load(Ordering::SeqCst),
            prefill_tokens: self.prefill_tokens.load(Ordering::SeqCst),
            requests: self.prefills.load(Ordering::SeqCst),
            hits: self.cache_hits.load(Ordering::SeqCst),
            bytes: self.cache_bytes.load(Ordering::SeqCst),
            budget: self.cache_budget.load(Ordering::SeqCst),
            evictions: self.cache_evictions.load(Ordering::SeqCst),
            invalidations: self.cache_invalidations.load(Ordering::SeqCst),
        }
    }

    /// Publishes the cache's size after a change.
    pub(super) fn cache_size(&self, cache: Option<&PrefixCache>) {
        let (bytes, evicted) = cache.map_or((0, 0), |c| (c.bytes() as u64, c.evicted()));
        self.cache_bytes.store(bytes, Ordering::SeqCst);
        self.cache_evictions.store(evicted, Ordering::SeqCst);
    }
}

impl EmbeddedBackend {
    /// Loads the checkpoint in `dir` on `device` and starts the worker with the default options.
    pub fn start(dir: &Path, device: Device) -> Result<Self, EngineError> {
        Self::start_with(dir, device, EngineOptions::default())
    }

    /// [`Self::start`] with the given options.
    pub fn start_with(dir: &Path, device: Device, opts: EngineOptions) -> Result<Self, EngineError> {
        let failed = |msg: String| EngineError::Failed { backend: NAME, msg };
        let model = Model::load(dir, device, None).map_err(|e| failed(e.to_string()))?;
        let context = model.lm.cfg.max_position_embeddings as usize;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Some(ChatTokenizer::from_file(&tok_path).map_err(|e| failed(format!("{e:#}")))?)
        } else {
            None
        };
        let has_tokenizer = tokenizer.is_some();
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        counters
            .cache_budget
            .store(opts.prefix_cache_bytes as u64, Ordering::SeqCst);
        let c = counters.clone();
        std::thread::Builder::new()
            .name("lego-rl-engine".into())
            .spawn(move || worker(model, tokenizer, rx, &c, opts))
            .map_err(|e| failed(e.to_string()))?;
        Ok(EmbeddedBackend {
            tx,
            dir: dir.to_path_buf(),
            context,
            counters,
            has_tokenizer,
        })
    }

    /// The worker's counters.
    pub fn counts(&self) -> EngineCounts {
        let c = &self.counters;
        EngineCounts {
            active: c.active.load(Ordering::SeqCst),
            completed: c.completed.load(Ordering::SeqCst),
            cancelled: c.cancelled.load(Ordering::SeqCst),
            forwards: c.forwards.load(Ordering::SeqCst),
            largest_decode_batch: c.largest_decode_batch.load(Ordering::SeqCst),
            prefix_cache: c.prefix_cache(),
        }
    }

    /// Sends one message to the worker and waits for its answer.
    async fn ask<T>(
        &self,
        msg: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, EngineError>>) -> Msg,
    ) -> Result<T, EngineError> {
        let worker_gone = || EngineError::Failed {
            backend: NAME,
            msg: "engine worker stopped".into(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send(msg(tx)).map_err(|_| worker_gone())?;
        rx.await.map_err(|_| worker_gone())?
    }

    async fn submit(
        &self,
        req: GenerateRequest,
        sink: Option<TokenSink>,
    ) -> Result<GenerateOutput, EngineError> {
        if req.prompt_ids.len() >= self.context {
            return Err(EngineError::ContextLength {
                prompt: req.prompt_ids.len(),
                context: self.context,
            });
        }
        if !self.has_tokenizer && req.sampling.stop.iter().any(|s| !s.is_empty()) {
            return Err(EngineError::Failed {
                backend: NAME,
                msg: format!(
                    "stop strings need the tokenizer, but {} has no tokenizer.json",
                    self.dir.display()
                ),
            });
        }
        self.ask(|tx| Msg::Generate(req, tx, sink)).await
    }
}

impl Backend for EmbeddedBackend {
    fn id(&self) -> String {
        format!("embedded:{}", self.dir.display())
    }

    fn context_length(&self) -> Option<usize> {
        Some(self.context)
    }

    fn processed_logprobs(&self) -> Option<bool> {
        Some(true)
    }

    fn generate(&self, req: GenerateRequest) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.submit(req, None).boxed()
    }

    fn generate_streaming(
        &self,
        req: GenerateRequest,
        tokens: TokenSink,
    ) -> BoxFuture<'_, Result<GenerateOutput, EngineError>> {
        self.submit(req, Some(tokens)).boxed()
    }

    fn prefix_cache_stats(&self) -> Option<PrefixCacheStats> {
        Some(self.counters.prefix_cache())
    }

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<super::ReloadReport, EngineError>> {
        let dir = checkpoint_dir.to_path_buf();
        async move {
            let start = std::time::Instant::now();
            self.ask(|tx| Msg::Reload(dir, tx)).await?;
            // The engine loads the checkpoint itself with the trainer's code: nothing to verify.
            Ok(super::ReloadReport::took(start.elapsed()))
        }
        .boxed()
    }
}
