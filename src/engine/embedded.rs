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
//! One worker thread owns the model. Requests queue on a channel; the worker keeps every active
//! sequence with its own KV cache. Each iteration advances every sequence by one token: all the
//! sequences past their prompt go through ONE batched decode forward
//! ([`crate::model::CausalLm::decode_batch`]: embeddings, projections, norms, experts and the LM
//! head on `[B, hidden]`, attention per sequence over its own cache), then each new sequence's
//! prompt is prefilled in a forward of its own. A decode step is dominated by reading weights (on
//! CPU the 151936-wide LM head alone is about half of it); B sequences now read them once, not B
//! times. Sampling stays per sequence (own seeded rng, own row of log-probs); sequences join and
//! leave the batch between steps. A lone sequence computes exactly as before batching; in a batch
//! its log-probs move by summation order only (~1e-6), which can change a token drawn from a nearly
//! flat distribution now and then (a random model at T = 1). A cap of 1 on the batch
//! ([`EmbeddedBackend::start_with_decode_batch`]) is the former one-forward-per-sequence interleaving.
//! Log-probs are of the model's own distribution (temperature 1), the quantity the trainer
//! recomputes; the sampling distribution applies temperature / top-k / top-p on top.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

use super::{
    Backend, EngineError, FinishReason, GenerateOutput, GenerateRequest, Routing, RoutingShape, SampledToken,
    TokenSink,
};
use crate::chat::stop::StopStrings;
use crate::chat::{ChatTokenizer, IncrementalDecoder};
use crate::model::{ForwardInput, KvCache, Model};

const NAME: &str = "embedded";

type Reply = tokio::sync::oneshot::Sender<Result<GenerateOutput, EngineError>>;

enum Msg {
    Generate(GenerateRequest, Reply, Option<TokenSink>),
    Reload(PathBuf, tokio::sync::oneshot::Sender<Result<(), EngineError>>),
}

/// The embedded engine (see the module docs).
pub struct EmbeddedBackend {
    tx: mpsc::Sender<Msg>,
    dir: PathBuf,
    shape: Option<RoutingShape>,
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
}

#[derive(Debug, Default)]
struct Counters {
    active: AtomicUsize,
    completed: AtomicU64,
    cancelled: AtomicU64,
    forwards: AtomicU64,
    largest_decode_batch: AtomicUsize,
}

impl EmbeddedBackend {
    /// Loads the checkpoint in `dir` on `device` and starts the worker.
    pub fn start(dir: &Path, device: Device) -> Result<Self, EngineError> {
        Self::start_with_decode_batch(dir, device, usize::MAX)
    }

    /// [`Self::start`] with at most `max_batch` sequences (at least 1) per decode forward; more
    /// decoding sequences take several forwards per step. 1 is the engine before batched decode
    /// (one forward per sequence per step), which scripts/bench/decode.sh measures against.
    pub fn start_with_decode_batch(
        dir: &Path,
        device: Device,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let failed = |msg: String| EngineError::Failed { backend: NAME, msg };
        let model = Model::load(dir, device, None).map_err(|e| failed(e.to_string()))?;
        let moe = model.lm.moe_layers();
        let shape = (moe > 0).then(|| RoutingShape {
            layers: moe,
            top_k: model.lm.cfg.num_experts_per_tok.max(1) as usize,
        });
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
        let c = counters.clone();
        std::thread::Builder::new()
            .name("lego-rl-engine".into())
            .spawn(move || worker(model, tokenizer, rx, &c, max_batch.max(1)))
            .map_err(|e| failed(e.to_string()))?;
        Ok(EmbeddedBackend {
            tx,
            dir: dir.to_path_buf(),
            shape,
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

    /// The routing shape of the loaded model (None for dense models).
    pub fn routing_shape(&self) -> Option<RoutingShape> {
        self.shape
    }
}

impl Backend for EmbeddedBackend {
    fn id(&self) -> String {
        format!("embedded:{}", self.dir.display())
    }

    fn context_length(&self) -> Option<usize> {
        Some(self.context)
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

    fn reload(&self, checkpoint_dir: &Path) -> BoxFuture<'_, Result<(), EngineError>> {
        let dir = checkpoint_dir.to_path_buf();
        async move { self.ask(|tx| Msg::Reload(dir, tx)).await }.boxed()
    }
}

/// One sequence being generated.
struct Seq {
    req: GenerateRequest,
    reply: Reply,
    /// Receives each output token as it is produced (streaming requests).
    sink: Option<TokenSink>,
    cache: KvCache,
    /// Next token to forward (None before prefill).
    pending: Option<u32>,
    output: Vec<u32>,
    logprobs: Vec<f32>,
    routing: Vec<Tensor>,
    rng: rand::rngs::StdRng,
    start: Instant,
    finish: Option<FinishReason>,
    cancelled: bool,
    /// Decoder and matcher of the request's stop strings (None without any).
    stop: Option<(IncrementalDecoder, StopStrings)>,
}

fn worker(
    mut model: Model,
    tokenizer: Option<ChatTokenizer>,
    rx: mpsc::Receiver<Msg>,
    counters: &Counters,
    max_batch: usize,
) {
    let _guard = tch::no_grad_guard();
    let mut active: Vec<Seq> = Vec::new();
    let mut reload: Option<(PathBuf, tokio::sync::oneshot::Sender<Result<(), EngineError>>)> = None;
    // Vocabulary-sized buffers reused across steps: a fresh ~600 KB vector per token cost
    // allocation and page faults on every decode step.
    let mut scratch = Scratch::default();
    loop {
        // Take new work: block when idle, poll otherwise; no new sequences while a reload waits.
        while reload.is_none() {
            let msg = if active.is_empty() {
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            };
            match msg {
                Msg::Generate(req, reply, sink) => {
                    let layers = model.lm.cfg.num_hidden_layers as usize;
                    active.push(Seq::new(req, reply, sink, layers))
                }
                Msg::Reload(dir, done) => reload = Some((dir, done)),
            }
        }
        if active.is_empty() {
            if let Some((dir, done)) = reload.take() {
                let result = Model::load(&dir, model.device(), None)
                    .map(|m| model = m)
                    .map_err(|e| EngineError::Failed {
                        backend: NAME,
                        msg: e.to_string(),
                    });
                let _ = done.send(result);
            }
            continue;
        }
        counters.active.store(active.len(), Ordering::SeqCst);
        for seq in &mut active {
            if seq.reply.is_closed() {
                // The requester went away (client disconnected): stop computing.
                seq.finish = Some(FinishReason::Other);
                seq.cancelled = true;
            }
        }
        // One token for every sequence: the decoding ones batched, then the new ones' prompts
        // (chosen first, so a sequence prefilled now joins the batch at the next step).
        let (mut decoding, new): (Vec<&mut Seq>, Vec<&mut Seq>) = active
            .iter_mut()
            .filter(|s| s.finish.is_none())
            .partition(|s| s.pending.is_some());
        for batch in decoding.chunks_mut(max_batch) {
            decode(&model, tokenizer.as_ref(), batch, &mut scratch);
            counters.forwards.fetch_add(1, Ordering::SeqCst);
            counters
                .largest_decode_batch
                .fetch_max(batch.len(), Ordering::SeqCst);
        }
        for seq in new {
            prefill(&model, tokenizer.as_ref(), seq, &mut scratch);
            counters.forwards.fetch_add(1, Ordering::SeqCst);
        }
        let (done, rest): (Vec<Seq>, Vec<Seq>) = active.drain(..).partition(|s| s.finish.is_some());
        active = rest;
        counters.active.store(active.len(), Ordering::SeqCst);
        for seq in done {
            if seq.cancelled {
                counters.cancelled.fetch_add(1, Ordering::SeqCst);
            } else {
                // Counted before the answer leaves, so a client that has it sees the count.
                counters.completed.fetch_add(1, Ordering::SeqCst);
                seq.complete();
            }
        }
    }
}

impl Seq {
    fn new(req: GenerateRequest, reply: Reply, sink: Option<TokenSink>, layers: usize) -> Self {
        let seed = req.sampling.seed.unwrap_or_else(rand::random);
        let stops = StopStrings::new(&req.sampling.stop);
        let stop = (!stops.is_empty()).then(|| (IncrementalDecoder::new(true), stops));
        Seq {
            req,
            reply,
            sink,
            cache: KvCache::new(layers),
            pending: None,
            output: Vec::new(),
            logprobs: Vec::new(),
            routing: Vec::new(),
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            start: Instant::now(),
            finish: None,
            cancelled: false,
            stop,
        }
    }

    fn complete(self) {
        let routing = if self.req.return_routing && !self.routing.is_empty() {
            let all = Tensor::cat(&self.routing, 0);
            let size = all.size();
            let flat: Vec<i64> = Vec::<i64>::try_from(all.flatten(0, -1)).unwrap_or_default();
            Some(Routing {
                start: 0,
                tokens: size[0] as usize,
                layers: size[1] as usize,
                top_k: size[2] as usize,
                experts: flat
                    .into_iter()
                    .map(|e| e.clamp(0, u16::MAX as i64) as u16)
                    .collect(),
            })
        } else {
            None
        };
        let _ = self.reply.send(Ok(GenerateOutput {
            output_ids: self.output,
            logprobs: self.logprobs,
            routing,
            finish_reason: self.finish.unwrap_or(FinishReason::Other),
            seconds: self.start.elapsed().as_secs_f64(),
        }));
    }
}

/// Per-worker buffers of a step: the log-softmax row of a top-k / top-p sequence and the
/// probabilities of a plain-temperature one.
#[derive(Default)]
struct Scratch {
    logp: Vec<f32>,
    probs: Vec<f32>,
}

/// Copies a float tensor's elements into `buf` (resized, not reallocated once large enough).
fn copy_into(t: &Tensor, buf: &mut Vec<f32>) {
    let numel = t.numel();
    buf.resize(numel, 0.0);
    t.copy_data(&mut buf[..], numel);
}

/// Forwards the whole prompt of a new sequence (a forward of its own), then picks its first token.
fn prefill(model: &Model, tokenizer: Option<&ChatTokenizer>, seq: &mut Seq, scratch: &mut Scratch) {
    let device = model.device();
    let ids: Vec<i64> = seq.req.prompt_ids.iter().map(|&t| t as i64).collect();
    let n = ids.len() as i64;
    let tokens = Tensor::from_slice(&ids).to_device(device);
    let positions = Tensor::arange(n, (Kind::Int64, device));
    let out = model
        .lm
        .forward(&ForwardInput::causal(&tokens, &positions), Some(&mut seq.cache));
    if let Some(r) = out.routing {
        seq.routing.push(r.to_device(Device::Cpu));
    }
    pick_next(
        model,
        tokenizer,
        &mut [seq],
        &out.hidden.narrow(0, n - 1, 1),
        scratch,
    );
}

/// Forwards the pending token of every sequence in `batch` in one batched forward, then picks
/// each one's next token.
fn decode(model: &Model, tokenizer: Option<&ChatTokenizer>, batch: &mut [&mut Seq], scratch: &mut Scratch) {
    let device = model.device();
    let (ids, positions): (Vec<i64>, Vec<i64>) = batch
        .iter()
        .map(|s| {
            let pending = s
                .pending
                .expect("invariant: a decoding sequence has a pending token");
            // The pending token is the last output token, right after the prompt and the others.
            (
                pending as i64,
                (s.req.prompt_ids.len() + s.output.len() - 1) as i64,
            )
        })
        .unzip();
    let tokens = Tensor::from_slice(&ids).to_device(device);
    let positions = Tensor::from_slice(&positions).to_device(device);
    let mut caches: Vec<&mut KvCache> = batch.iter_mut().map(|s| &mut s.cache).collect();
    let out = model.lm.decode_batch(&tokens, &positions, &mut caches);
    if let Some(r) = out.routing {
        let r = r.to_device(Device::Cpu);
        for (b, seq) in batch.iter_mut().enumerate() {
            // A copy: a view would keep the whole batch's rows alive for the generation's life.
            seq.routing.push(r.narrow(0, b as i64, 1).copy());
        }
    }
    pick_next(model, tokenizer, batch, &out.hidden, scratch);
}

/// Projects `hidden` (`[B, hidden]`, row b = the last position of `seqs[b]`) through the LM head
/// in one matmul and picks each sequence's next token from its own row.
///
/// Only what a row's choice needs leaves libtorch: the vectorized argmax for greedy decoding, the
/// tempered softmax for plain temperature sampling, the whole log-softmax row only for top-k /
/// top-p. The log-prob recorded is `logit[next] − logsumexp(row)`, the same quantity as
/// `log_softmax(row)[next]` up to float rounding (~1e-6). Why not one log-softmax of every row
/// copied out and scanned in Rust, as before: on a 151936-wide vocabulary that write, the copy
/// and a scalar argmax were ~9% of a greedy decode step of the tiny model (perf), next to the
/// head's own matmul.
fn pick_next(
    model: &Model,
    tokenizer: Option<&ChatTokenizer>,
    seqs: &mut [&mut Seq],
    hidden: &Tensor,
    scratch: &mut Scratch,
) {
    let logits = model
        .lm
        .logits(hidden)
        .to_kind(Kind::Float)
        .to_device(Device::Cpu);
    let lse = Vec::<f32>::try_from(logits.logsumexp([-1], false))
        .expect("invariant: logsumexp of float rows is a 1-d float tensor");
    for (b, seq) in seqs.iter_mut().enumerate() {
        advance(tokenizer, seq, &logits.get(b as i64), lse[b], scratch);
    }
}

/// Picks the next token of `seq` from its next-token logits (`row`, a CPU float tensor, and their
/// logsumexp `lse`) — forced, or sampled with the sequence's own rng — records it and decides
/// whether the sequence is done.
fn advance(tokenizer: Option<&ChatTokenizer>, seq: &mut Seq, row: &Tensor, lse: f32, scratch: &mut Scratch) {
    let n = seq.output.len();
    let next = match &seq.req.forced_output {
        Some(forced) => match forced.get(n) {
            Some(&t) => t,
            None => {
                seq.finish = Some(FinishReason::Stop);
                return;
            }
        },
        None => match plain_temperature(&seq.req) {
            Some(t) => {
                // Vectorized by libtorch: a scalar `exp` per vocabulary entry in Rust cost more
                // than the LM head itself. softmax(logp / T) = softmax(logits / T).
                copy_into(&(row / f64::from(t)).softmax(-1, Kind::Float), &mut scratch.probs);
                sample_probs(&scratch.probs, &mut seq.rng)
            }
            None if is_greedy(&seq.req) => row.argmax(0, false).int64_value(&[]) as u32,
            None => {
                copy_into(&(row - f64::from(lse)), &mut scratch.logp);
                sample(&scratch.logp, &seq.req, &mut seq.rng)
            }
        },
    };
    let logprob = if (next as i64) < row.size()[0] {
        row.double_value(&[next as i64]) as f32 - lse
    } else {
        f32::NEG_INFINITY
    };
    seq.output.push(next);
    seq.logprobs.push(logprob);
    if let Some(sink) = &seq.sink {
        let _ = sink.send(SampledToken { id: next, logprob });
    }
    seq.pending = Some(next);
    let max = seq.req.sampling.max_tokens.unwrap_or(1024) as usize;
    let forced_done = seq
        .req
        .forced_output
        .as_ref()
        .is_some_and(|f| seq.output.len() >= f.len());
    if seq.req.stop_token_ids.contains(&next) || forced_done || hit_stop_string(tokenizer, seq, next) {
        seq.finish = Some(FinishReason::Stop);
    } else if seq.req.forced_output.is_none() && seq.output.len() >= max {
        // A forced script is authoritative: max_tokens only bounds sampled output.
        seq.finish = Some(FinishReason::Length);
    }
}

/// Whether the text of `next` completes one of the request's stop strings (also for forced
/// tokens: a scripted continuation ends where a sampled one would).
fn hit_stop_string(tokenizer: Option<&ChatTokenizer>, seq: &mut Seq, next: u32) -> bool {
    let (Some(tok), Some((decoder, stops))) = (tokenizer, seq.stop.as_mut()) else {
        return false;
    };
    match decoder.push(tok, next) {
        Ok(text) => {
            stops.push(&text);
            stops.matched().is_some()
        }
        // Undecodable ids cannot be text: nothing to match.
        Err(_) => false,
    }
}

/// Samples from `logp` with temperature, top-k and top-p (temperature 0 = greedy).
/// The temperature when sampling is plain temperature sampling (no top-k, no top-p < 1).
fn plain_temperature(req: &GenerateRequest) -> Option<f32> {
    let s = &req.sampling;
    let temperature = s.temperature.unwrap_or(1.0) as f32;
    let top_k = s.top_k.filter(|&k| k > 0);
    (temperature > 1e-6 && top_k.is_none() && s.top_p.is_none_or(|p| p >= 1.0)).then_some(temperature)
}

/// One draw from `probs` (summing to ~1): one pass, no sort. Rounding that leaves a sliver of
/// mass past the last entry gives the mode.
fn sample_probs(probs: &[f32], rng: &mut impl Rng) -> u32 {
    let mut u: f32 = rng.gen();
    for (i, &p) in probs.iter().enumerate() {
        if u < p {
            return i as u32;
        }
        u -= p;
    }
    argmax(probs)
}

/// Temperature 0 (or below 1e-6): the mode, picked by argmax.
fn is_greedy(req: &GenerateRequest) -> bool {
    req.sampling.temperature.unwrap_or(1.0) as f32 <= 1e-6
}

/// Greedy, or top-k / top-p sampling over the most likely candidates, sorted (plain temperature
/// sampling is [`sample_probs`]).
fn sample(logp: &[f32], req: &GenerateRequest, rng: &mut impl Rng) -> u32 {
    if is_greedy(req) {
        return argmax(logp);
    }
    let s = &req.sampling;
    let temperature = s.temperature.unwrap_or(1.0) as f32;
    let mut cand: Vec<(u32, f32)> = logp
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l / temperature))
        .collect();
    if let Some(k) = s.top_k.map(|k| k as usize).filter(|&k| k > 0 && k < cand.len()) {
        cand.select_nth_unstable_by(k - 1, desc);
        cand.truncate(k);
    }
    let (max, total) = softmax_norm(&cand);
    let keep = match s.top_p.filter(|&p| p < 1.0) {
        Some(top_p) => nucleus(&mut cand, max, total, top_p as f32),
        None => {
            cand.sort_unstable_by(desc);
            cand.len()
        }
    };
    let probs: Vec<f32> = cand[..keep].iter().map(|c| (c.1 - max).exp() / total).collect();
    let kept: f32 = probs.iter().sum();
    let mut u: f32 = rng.gen::<f32>() * kept;
    for (i, p) in probs.iter().enumerate() {
        if u < *p {
            return cand[i].0;
        }
        u -= p;
    }
    cand[keep - 1].0
}

/// The largest logit and `sum(exp(logit - max))`, the softmax's normalizer (summed in f64: the
/// row has ~152k terms).
fn softmax_norm(cand: &[(u32, f32)]) -> (f32, f32) {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let total = cand.iter().map(|c| f64::from((c.1 - max).exp())).sum::<f64>() as f32;
    (max, total)
}

/// Descending by (tempered) logit; equal logits by token id, so the order (and the draw) does
/// not depend on how the candidates were partitioned before the sort.
fn desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Top-p: sorts the most likely candidates to the front and returns how many of them make the
/// nucleus, the fewest whose probability (`exp(logit - max) / total`) reaches `top_p`.
///
/// A trained policy's nucleus is a handful of tokens out of ~152k, so sorting the whole row for
/// every token (what this replaced: O(V log V) per token) is mostly wasted: this sorts a prefix
/// picked by `select_nth_unstable_by` (linear) and grows it 8x while its mass falls short,
/// sorting the whole row only once the prefix would pass an eighth of it (a flat, untrained
/// distribution). `scripts/bench/decode.sh 128 5 1 64 1.0 0.95` compares it with transformers.
/// The result is the full sort's: the same candidates in the same order, the same cumulative sums.
fn nucleus(cand: &mut [(u32, f32)], max: f32, total: f32, top_p: f32) -> usize {
    let n = cand.len();
    let mut k = 64.min(n);
    loop {
        if k < n {
            cand.select_nth_unstable_by(k - 1, desc);
        }
        cand[..k].sort_unstable_by(desc);
        let mut acc = 0.0;
        if let Some(i) = cand[..k].iter().position(|c| {
            acc += (c.1 - max).exp() / total;
            acc >= top_p
        }) {
            return i + 1;
        }
        if k == n {
            return n;
        }
        k = if k * 8 > n / 8 { n } else { k * 8 };
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// The samplers' draws against their target distributions: seeded, so the chi-square values
/// are fixed numbers, and the bound (p = 0.001 for the degrees of freedom) leaves room for a
/// change of rng stream without making a wrong distribution pass.
#[cfg(test)]
mod sampling_tests {
    use super::*;
    use crate::records::Sampling;

    const P: [f64; 5] = [0.5, 0.25, 0.125, 0.0625, 0.0625];
    const DRAWS: usize = 200_000;

    fn logp() -> Vec<f32> {
        P.iter().map(|p| p.ln() as f32).collect()
    }

    /// Normalised `P[i]^(1/t)` over `keep` (the rest 0).
    fn target(t: f64, keep: usize) -> Vec<f64> {
        let w: Vec<f64> = P.iter().take(keep).map(|p| p.powf(1.0 / t)).collect();
        let total: f64 = w.iter().sum();
        let mut q: Vec<f64> = w.iter().map(|x| x / total).collect();
        q.resize(P.len(), 0.0);
        q
    }

    /// Pearson's chi-square of the draws against `q`; a draw where `q` is 0 fails at once.
    fn chi_square(mut draw: impl FnMut() -> u32, q: &[f64]) -> f64 {
        let mut counts = vec![0usize; q.len()];
        for _ in 0..DRAWS {
            counts[draw() as usize] += 1;
        }
        counts
            .iter()
            .zip(q)
            .map(|(&c, &q)| {
                if q == 0.0 {
                    assert_eq!(c, 0, "drew an entry outside the support");
                    0.0
                } else {
                    let e = q * DRAWS as f64;
                    (c as f64 - e).powi(2) / e
                }
            })
            .sum()
    }

    fn request(temperature: f64, top_k: Option<u32>, top_p: Option<f64>) -> GenerateRequest {
        GenerateRequest {
            prompt_ids: vec![1],
            sampling: Sampling {
                temperature: Some(temperature),
                top_k,
                top_p,
                ..Default::default()
            },
            stop_token_ids: vec![],
            return_routing: false,
            forced_output: None,
        }
    }

    #[test]
    fn plain_temperature_draws_follow_the_tempered_distribution() {
        let logp = logp();
        for t in [1.0, 0.5, 2.0] {
            let q = target(t, P.len());
            let probs: Vec<f32> = q.iter().map(|&x| x as f32).collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let chi2 = chi_square(|| sample_probs(&probs, &mut rng), &q);
            // 4 degrees of freedom: 18.47 at p = 0.001.
            assert!(chi2 < 18.47, "T={t}: chi-square {chi2}");
        }
        // The same tempered distribution through the libtorch softmax the engine uses.
        let t = 0.5;
        let tensor = Tensor::from_slice(&logp);
        let mut probs = Vec::new();
        copy_into(&(&tensor / t).softmax(-1, Kind::Float), &mut probs);
        for (a, b) in probs.iter().zip(target(t, P.len())) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{probs:?}");
        }
    }

    /// What `nucleus` replaced: the whole row sorted, the nucleus its shortest prefix reaching
    /// `top_p`.
    fn nucleus_by_full_sort(cand: &[(u32, f32)], max: f32, total: f32, top_p: f32) -> Vec<u32> {
        let mut all = cand.to_vec();
        all.sort_unstable_by(desc);
        let mut acc = 0.0;
        let keep = all
            .iter()
            .position(|c| {
                acc += (c.1 - max).exp() / total;
                acc >= top_p
            })
            .map_or(all.len(), |i| i + 1);
        all[..keep].iter().map(|c| c.0).collect()
    }

    #[test]
    fn nucleus_is_the_full_sorts_prefix_on_peaked_and_flat_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let n = 50_000;
        let mut sizes = Vec::new();
        // Gaussian logits (Box-Muller) times a scale: flat (1) to peaked (12), so the nucleus is
        // found in the first 64, in a grown prefix, and only by sorting the whole row.
        for scale in [1.0f32, 3.0, 6.0, 12.0] {
            let row: Vec<(u32, f32)> = (0..n)
                .map(|i| {
                    let (u, v): (f32, f32) = (rng.gen::<f32>().max(1e-12), rng.gen());
                    let z = (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos();
                    (i as u32, scale * z)
                })
                .collect();
            let (max, total) = softmax_norm(&row);
            for top_p in [0.5, 0.9, 0.95, 0.999] {
                let want = nucleus_by_full_sort(&row, max, total, top_p);
                let mut cand = row.clone();
                let keep = nucleus(&mut cand, max, total, top_p);
                let got: Vec<u32> = cand[..keep].iter().map(|c| c.0).collect();
                assert_eq!(got, want, "scale {scale}, top-p {top_p}");
                sizes.push(keep);
            }
        }
        assert!(sizes.iter().any(|&k| k <= 64), "{sizes:?}");
        assert!(sizes.iter().any(|&k| k > 64 && k <= n / 8), "{sizes:?}");
        assert!(sizes.iter().any(|&k| k > n / 8), "{sizes:?}");
    }

    #[test]
    fn top_k_top_p_and_greedy_draw_from_the_truncated_distribution() {
        let logp = logp();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // top-k 2: the two most likely, renormalised (1 degree of freedom: 10.83).
        let req = request(1.0, Some(2), None);
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng), &target(1.0, 2));
        assert!(chi2 < 10.83, "top-k: chi-square {chi2}");
        // top-p 0.8: the smallest prefix reaching 0.8 is 0.5 + 0.25 + 0.125.
        let req = request(1.0, None, Some(0.8));
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng), &target(1.0, 3));
        assert!(chi2 < 13.82, "top-p: chi-square {chi2}");
        // Temperature before truncation: at T=2 the weights flatten to .343 .243 .172 .121 .121,
        // so top-p 0.8 keeps four.
        let req = request(2.0, None, Some(0.8));
        let chi2 = chi_square(|| sample(&logp, &req, &mut rng), &target(2.0, 4));
        assert!(chi2 < 16.27, "T=2, top-p: chi-square {chi2}");
        // Temperature 0 is greedy.
        let req = request(0.0, None, None);
        assert!((0..1000).all(|_| sample(&logp, &req, &mut rng) == 0));
    }
}
