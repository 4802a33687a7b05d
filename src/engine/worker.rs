//! The embedded engine's worker thread: it owns the model, takes requests from the
//! [`super::embedded::EmbeddedBackend`]'s channel and advances every active sequence by one token
//! per step (one batched decode forward for the sequences past their prompt, one prefill forward
//! per new sequence after its cached prefix), then answers the finished ones (see
//! [`super::embedded`] for the design).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

use super::embedded::{Counters, EngineOptions, Msg, Reply, NAME};
use super::prefix_cache::PrefixCache;
use super::sampling::{choose, forced_logprob, Scratch};
use super::{EngineError, FinishReason, GenerateOutput, GenerateRequest, Routing, SampledToken, TokenSink};
use crate::chat::stop::StopStrings;
use crate::chat::{ChatTokenizer, IncrementalDecoder};
use crate::model::{ForwardInput, KvCache, LayerType, Model};

/// One sequence being generated.
struct Seq {
    req: GenerateRequest,
    reply: Reply,
    /// Receives each output token as it is produced (streaming requests).
    sink: Option<TokenSink>,
    cache: KvCache,
    /// Prompt tokens taken from the prefix cache instead of computed.
    cached: usize,
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

pub(super) fn worker(
    mut model: Model,
    tokenizer: Option<ChatTokenizer>,
    rx: mpsc::Receiver<Msg>,
    counters: &Counters,
    opts: EngineOptions,
) {
    let _guard = tch::no_grad_guard();
    let max_batch = opts.max_decode_batch.max(1);
    let mut cache = (opts.prefix_cache_bytes > 0).then(|| PrefixCache::new(opts.prefix_cache_bytes));
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
                // Never reuse KV computed by other weights (even if the load fails: the old
                // weights may be half replaced).
                if let Some(c) = cache.as_mut() {
                    c.clear();
                    counters.cache_invalidations.fetch_add(1, Ordering::SeqCst);
                    counters.cache_size(Some(c));
                }
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
            prefill(
                &model,
                tokenizer.as_ref(),
                seq,
                &mut scratch,
                &mut cache,
                counters,
            );
            counters.forwards.fetch_add(1, Ordering::SeqCst);
        }
        let (done, rest): (Vec<Seq>, Vec<Seq>) = active.drain(..).partition(|s| s.finish.is_some());
        active = rest;
        counters.active.store(active.len(), Ordering::SeqCst);
        for mut seq in done {
            // Prompt + output, for the next turn of the conversation (before the answer leaves:
            // a client that has it finds the entry).
            store(&mut cache, &mut seq, counters);
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
            cached: 0,
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
            cached_tokens: Some(self.cached),
            processed_logprobs: self.req.sampling.is_processed(),
        }));
    }
}

/// Forwards the prompt of a new sequence (a forward of its own) after its longest prefix found
/// in the prefix cache, then picks its first token. At least the last prompt token is forwarded:
/// its hidden state gives the first output token.
///
/// For a hybrid model with the cache on, the prompt is forwarded in pieces that end where a
/// later request may resume, each stored with a snapshot of the recurrent states
/// (see [`super::prefix_cache`]): up to where the prompt left the cached prefix (when that is
/// past the snapshot it resumed from), then up to its last token but one, then that token.
fn prefill(
    model: &Model,
    tokenizer: Option<&ChatTokenizer>,
    seq: &mut Seq,
    scratch: &mut Scratch,
    cache: &mut Option<PrefixCache>,
    counters: &Counters,
) {
    let n = seq.req.prompt_ids.len();
    let max_hit = n.saturating_sub(1);
    if let Some(hit) = cache
        .as_mut()
        .and_then(|c| c.lookup(&seq.req.prompt_ids, max_hit))
    {
        seq.cached = hit.len;
        seq.cache = hit.kv;
        // The routing these positions were computed with: the capture is the uncached one.
        seq.routing.extend(hit.routing);
    }
    let start = seq.cached;
    counters.prefills.fetch_add(1, Ordering::SeqCst);
    counters
        .cache_hits
        .fetch_add(u64::from(start > 0), Ordering::SeqCst);
    counters.prompt_tokens.fetch_add(n as u64, Ordering::SeqCst);
    counters
        .prefill_tokens
        .fetch_add((n - start) as u64, Ordering::SeqCst);
    let recurrent = model.lm.cfg.layer_types.contains(&LayerType::LinearAttention);
    let mut stops = Vec::new();
    if let (true, Some(c)) = (recurrent, cache.as_ref()) {
        stops.push(c.matched(&seq.req.prompt_ids, max_hit));
        stops.push(max_hit);
    }
    stops.retain(|&s| s > start);
    stops.dedup();
    let mut from = start;
    for to in stops {
        let _ = forward(model, seq, from, to);
        store(cache, seq, counters);
        from = to;
    }
    let hidden = forward(model, seq, from, n);
    if !recurrent {
        // The prompt, for the other samples of a group (often prefilled in this same step).
        store(cache, seq, counters);
    }
    pick_next(
        model,
        tokenizer,
        &mut [seq],
        &hidden.narrow(0, (n - from) as i64 - 1, 1),
        scratch,
    );
}

/// Forwards prompt positions `from .. to` of `seq` over its cache (which holds the ones before),
/// recording their routing; returns their hidden states.
fn forward(model: &Model, seq: &mut Seq, from: usize, to: usize) -> Tensor {
    let device = model.device();
    let ids: Vec<i64> = seq.req.prompt_ids[from..to].iter().map(|&t| t as i64).collect();
    let tokens = Tensor::from_slice(&ids).to_device(device);
    let positions = Tensor::arange_start(from as i64, to as i64, (Kind::Int64, device));
    let out = model
        .lm
        .forward(&ForwardInput::causal(&tokens, &positions), Some(&mut seq.cache));
    if let Some(r) = out.routing {
        seq.routing.push(r.to_device(Device::Cpu));
    }
    out.hidden
}

/// Inserts what `seq` has forwarded so far (its KV's positions: the prompt, then every output
/// token but the last; for a hybrid model with its recurrent states at the end) into the
/// prefix cache. A cache that cannot be stored turns the cache off, once, with a warning.
fn store(cache: &mut Option<PrefixCache>, seq: &mut Seq, counters: &Counters) {
    let Some(c) = cache.as_mut() else {
        return;
    };
    let len = seq.cache.len() as usize;
    let prompt = &seq.req.prompt_ids;
    if len == 0 || len > prompt.len() + seq.output.len() {
        return;
    }
    let ids: Vec<u32> = prompt.iter().chain(&seq.output).take(len).copied().collect();
    if seq.routing.len() > 1 {
        // One tensor from here on: also what `complete` would concatenate.
        seq.routing = vec![Tensor::cat(&seq.routing, 0)];
    }
    let routing = seq.routing.first();
    if routing.is_some_and(|r| r.size()[0] != len as i64) {
        tracing::warn!("prefix cache: routing rows do not match the cached positions; not stored");
        return;
    }
    if c.insert(&ids, &seq.cache, routing).is_err() {
        tracing::warn!(
            "prefix cache off: a sequence's cache holds no keys and values to store; every \
             prompt is prefilled from its first token"
        );
        *cache = None;
        counters.cache_budget.store(0, Ordering::SeqCst);
    }
    counters.cache_size(cache.as_ref());
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
/// top-p. The log-prob recorded is that of the distribution the token was drawn from: for the
/// model's own (temperature 1, the whole vocabulary) `logit[next] − logsumexp(row)`, the same
/// quantity as `log_softmax(row)[next]` up to float rounding (~1e-6); for a tempered or
/// truncated one, the sampler's own (src/engine/sampling.rs). Why not one log-softmax of every row
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
    let (next, processed) = match &seq.req.forced_output {
        Some(forced) => match forced.get(n) {
            Some(&t) => (t, forced_logprob(&seq.req, row, t)),
            None => {
                seq.finish = Some(FinishReason::Stop);
                return;
            }
        },
        None => choose(&seq.req, row, &mut seq.rng, scratch),
    };
    let logprob = match processed {
        Some(lp) => lp,
        None if (next as i64) < row.size()[0] => row.double_value(&[next as i64]) as f32 - lse,
        None => f32::NEG_INFINITY,
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
