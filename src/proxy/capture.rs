//! Per-trial capture and the generation path shared by both APIs: thread attribution, prompt
//! building (faithful or rendered), the backend call, output parsing, and the capture record,
//! written before the response is sent. A request whose client goes away before the answer is
//! recorded as `client_disconnected`; a backend failure as `infra_error`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use super::flight::Flight;
pub use super::trial::{Captured, Trial};
use super::{ProxyError, State};
use crate::chat::{
    ChatFormat, Conversation, Message, ParsedOutput, PreviousGeneration, RenderOptions, Role, ToolCallIds,
};
use crate::engine::{EngineError, FinishReason, GenerateOutput, GenerateRequest, SampledToken, TokenSink};
use crate::records::{
    CapturedCall, CapturedResponse, Generation, Packed, PromptMode, Sampling, CONTEXT_LIMIT,
    MALFORMED_TOOL_CALLS, ROUTING_MISSING,
};

/// What the API layers need to answer.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub parsed: ParsedOutput,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub finish: FinishReason,
    pub index: u32,
}

/// Records `client_disconnected` when dropped before [`InFlight::done`]: the request was
/// prepared but its answer was never completed (the client went away, so the server dropped
/// the request's future or its response stream). The record keeps the partial output: every
/// token the backend had sent before the drop, with its log-prob (no routing: the engine
/// returns routing only with a complete generation).
struct InFlight {
    trial: Arc<Trial>,
    generation: Option<Generation>,
    /// Tokens as the backend produces them (taken by the generation path).
    tokens: Option<tokio::sync::mpsc::UnboundedReceiver<SampledToken>>,
    received: Vec<SampledToken>,
}

impl InFlight {
    fn done(mut self) {
        self.generation = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(mut g) = self.generation.take() {
            // Tokens sent but not yet read when the request was dropped belong to the output too.
            if let Some(rx) = &mut self.tokens {
                while let Ok(t) = rx.try_recv() {
                    self.received.push(t);
                }
            }
            g.output_ids = self.received.iter().map(|t| t.id).collect();
            let lps: Vec<f32> = self.received.iter().map(|t| t.logprob).collect();
            g.logprobs = Packed::f32_vec(&lps);
            g.status = Some("client_disconnected".into());
            g.finish_reason = "cancelled".into();
            self.trial
                .push(g, Conversation::default(), RenderOptions::generation(None), None);
        }
    }
}

/// A request whose prompt is built and checked, ready for the backend. Dropping it unanswered
/// (the client went away before or during the generation) records `client_disconnected`.
pub(super) struct Fresh {
    pub(super) trial: Arc<Trial>,
    pub(super) api: &'static str,
    pub(super) conv: Conversation,
    opts: RenderOptions,
    pub(super) record: Generation,
    request: GenerateRequest,
    started: Instant,
    guard: InFlight,
    /// A plain-text completion: no chat parsing of the output.
    pub(super) raw: bool,
}

/// What a request is answered with: a new generation, or (a client's retry of its thread's
/// latest request) the generation already running or recorded for it.
pub(crate) enum Prepared {
    Fresh(Box<Fresh>),
    Replay(Arc<Flight>),
}

impl Prepared {
    /// The generation's index in its trial (response ids derive from it).
    pub(crate) fn index(&self) -> u32 {
        match self {
            Prepared::Fresh(p) => p.record.index,
            Prepared::Replay(f) => f.index,
        }
    }

    /// Tokens of the prompt.
    pub(crate) fn prompt_tokens(&self) -> usize {
        match self {
            Prepared::Fresh(p) => p.record.prompt_ids.len(),
            Prepared::Replay(f) => f.prompt_ids.len(),
        }
    }
}

/// First half of the generation path: thread, prompt (faithful or rendered), context check.
/// Runs before a streaming response starts, so a prompt that cannot be served gets a plain 400.
#[expect(
    clippy::too_many_arguments,
    reason = "the request's parts, as the API layers parsed them, plus its announced retry"
)]
pub(crate) fn prepare(
    state: &State,
    trial: &Arc<Trial>,
    api: &'static str,
    request: Value,
    conv: Conversation,
    opts: RenderOptions,
    sampling: Sampling,
    retry: u32,
) -> Result<Prepared, ProxyError> {
    prepare_inner(state, trial, api, request, conv, opts, sampling, None, retry)
}

/// [`prepare`] for a plain-text completion (`/v1/completions`): the prompt is the client's text
/// (or token ids) as is, with no chat template, and the output is returned as raw text.
pub(crate) fn prepare_raw(
    state: &State,
    trial: &Arc<Trial>,
    api: &'static str,
    request: Value,
    prompt_ids: Vec<u32>,
    sampling: Sampling,
    retry: u32,
) -> Result<Prepared, ProxyError> {
    // The thread key of a plain completion is its prompt.
    let text = state.chat.decode(&prompt_ids, false).unwrap_or_default();
    let conv = Conversation {
        messages: vec![Message::text(Role::User, text)],
        ..Default::default()
    };
    let opts = RenderOptions::generation(None);
    prepare_inner(
        state,
        trial,
        api,
        request,
        conv,
        opts,
        sampling,
        Some(prompt_ids),
        retry,
    )
}

/// The seed of call `index` of trial `trial_id` under the configured seed `seed` (FNV-1a over
/// the three, then a SplitMix64 finaliser; stable across platforms and releases).
pub fn call_seed(seed: u64, trial_id: &str, index: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = seed
        .to_le_bytes()
        .into_iter()
        .chain(trial_id.bytes())
        .chain([0])
        .chain(index.to_le_bytes());
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[allow(clippy::too_many_arguments)]
fn prepare_inner(
    state: &State,
    trial: &Arc<Trial>,
    api: &'static str,
    request: Value,
    conv: Conversation,
    opts: RenderOptions,
    sampling: Sampling,
    raw_prompt: Option<Vec<u32>>,
    retry: u32,
) -> Result<Prepared, ProxyError> {
    let started = Instant::now();
    let raw = raw_prompt.is_some();
    let thread = trial.thread_of(&conv);
    if let Some(flight) = trial.replay_of(thread, &request, retry) {
        tracing::debug!(trial = %trial.id, index = flight.index, "a retry answered from its generation");
        return Ok(Prepared::Replay(flight));
    }
    let (index, forced_text) = {
        let mut inner = trial.lock();
        let i = inner.next_index;
        inner.next_index += 1;
        (i, inner.script.pop_front())
    };
    // A configured seed (`rollout --seed`) is mixed with the trial id and the call index: a run is
    // reproducible, yet the members of a group and a trial's successive calls sample differently
    // (one seed for every call would make a group's identical first prompts sample identically).
    // A seed the request sends itself is used as is under honor (under pin `enforce` resets it).
    let mut sampling = sampling;
    let ignored_sampling = super::harness_sampling::enforce(
        state.cfg.harness_sampling,
        &state.cfg.sampling,
        &request,
        &mut sampling,
    );
    if sampling.seed.is_some() && sampling.seed == state.cfg.sampling.seed {
        sampling.seed = sampling.seed.map(|s| call_seed(s, &trial.id, index));
    }
    let chat = &state.chat;
    let bad = |e: crate::chat::ChatError| ProxyError::BadRequest(format!("{e:#}"));

    // Prompt: faithful splice onto the thread's latest capture, else a fresh render.
    let mut extra = serde_json::Map::new();
    let mut mode = PromptMode::Rendered;
    let mut prompt_ids = raw_prompt;
    if !raw && state.cfg.prompt_mode == PromptMode::Faithful {
        if let Some(ids) = faithful_splice(chat, trial, thread, &conv, &opts, &mut extra) {
            mode = PromptMode::Faithful;
            prompt_ids = Some(ids);
        }
    }
    let prompt_ids = match prompt_ids {
        Some(p) => p,
        None => chat.prompt_ids(&conv, &opts).map_err(bad)?,
    };
    let special = chat.special();
    let stop_token_ids: Vec<u32> = [special.im_end, special.endoftext]
        .into_iter()
        .flatten()
        .collect();
    let forced_output = match &forced_text {
        Some(text) => Some(forced_ids(chat, text).map_err(bad)?),
        None => None,
    };
    let backend_id = state.backend.id();
    let policy_version = state.policy_version.load(std::sync::atomic::Ordering::SeqCst);
    let record = Generation {
        thread,
        index,
        api: api.to_string(),
        request,
        prompt_mode: mode,
        prompt_ids: prompt_ids.clone(),
        backend: Some(backend_id),
        policy_version,
        sampling: sampling.clone(),
        ignored_sampling,
        extra,
        ..Default::default()
    };
    let context = match (state.backend.context_length(), state.cfg.max_context) {
        (Some(b), Some(c)) => Some(b.min(c)),
        (b, c) => b.or(c),
    };
    if let Some(context) = context {
        if record.prompt_ids.len() >= context {
            // Recorded so that rollout can end the trial as `context_limit` (when the harness
            // does not recover). A scripted output was not used: it goes to the next request.
            let err = ProxyError::ContextLength {
                prompt: record.prompt_ids.len(),
                context,
            };
            let mut record = record;
            record.status = Some(CONTEXT_LIMIT.into());
            record.finish_reason = CONTEXT_LIMIT.into();
            record.error = Some(err.to_string());
            if let Some(text) = forced_text {
                trial.lock().script.push_front(text);
            }
            trial.push(record, conv, opts, None);
            return Err(err);
        }
    }
    let mut record = record;
    if let (Some(context), Some(max)) = (context, sampling.max_tokens) {
        // What fits is served, and said: an engine that shortens max_tokens on its own (vLLM
        // does) would leave a `length` finish unexplained.
        let room = (context - record.prompt_ids.len()) as u32;
        if max > room {
            sampling.max_tokens = Some(room);
            record.extra.insert(
                "max_tokens_capped".into(),
                json!({"requested": max, "served": room, "context": context}),
            );
        }
    }
    let request = GenerateRequest {
        prompt_ids,
        sampling,
        stop_token_ids,
        return_routing: state.cfg.return_routing,
        forced_output,
    };
    let guard = InFlight {
        trial: trial.clone(),
        generation: Some(record.clone()),
        tokens: None,
        received: Vec::new(),
    };
    Ok(Prepared::Fresh(Box::new(Fresh {
        trial: trial.clone(),
        api,
        conv,
        opts,
        record,
        request,
        started,
        guard,
        raw,
    })))
}

/// The prompt as the thread's latest good capture's tokens plus the new messages (the faithful
/// splice), noting in `extra` what was reused or why it could not be; `None` when there is no
/// such capture or the splice broke.
fn faithful_splice(
    chat: &ChatFormat,
    trial: &Trial,
    thread: u32,
    conv: &Conversation,
    opts: &RenderOptions,
    extra: &mut serde_json::Map<String, Value>,
) -> Option<Vec<u32>> {
    let inner = trial.lock();
    let prev = inner.captured.iter().rev().find(|c| {
        c.generation.thread == thread && c.assistant.is_some() && c.generation.status.as_deref() == Some("ok")
    })?;
    let p = PreviousGeneration {
        conversation: &prev.conversation,
        options: &prev.options,
        prompt_ids: &prev.generation.prompt_ids,
        output_ids: &prev.generation.output_ids,
        assistant: prev.assistant.as_ref().expect("invariant: filtered on is_some"),
    };
    match chat.faithful_prompt(&p, conv, opts) {
        Ok(fp) => {
            extra.insert("reused_tokens".into(), json!(fp.reused));
            extra.insert("spliced_after".into(), json!(prev.generation.index));
            Some(fp.prompt_ids)
        }
        Err(brk) => {
            extra.insert("segment_break".into(), json!(brk.to_string()));
            None
        }
    }
}

/// A scripted output's tokens, ending with the end-of-turn token.
fn forced_ids(chat: &ChatFormat, text: &str) -> Result<Vec<u32>, crate::chat::ChatError> {
    let mut ids = chat.encode(text)?;
    if let Some(end) = chat.special().im_end {
        if ids.last() != Some(&end) {
            ids.push(end);
        }
    }
    Ok(ids)
}

pub(super) fn tool_call_ids(trial: &Trial, api: &str, index: u32) -> ToolCallIds {
    let prefix = if api == "anthropic" { "toolu_" } else { "call_" };
    ToolCallIds::new(trial.id.clone(), index as u64).with_prefix(prefix)
}

/// Second half: the backend call, parsing, and the capture (written before the answer); each
/// token goes to `tokens` as it comes. Dropping the future mid-generation cancels it and records
/// `client_disconnected` (see [`super::flight`], which decides when).
pub(super) async fn run_with(
    state: &State,
    p: Fresh,
    tokens: Option<TokenSink>,
) -> Result<Outcome, ProxyError> {
    let Fresh {
        trial,
        api,
        conv,
        opts,
        mut record,
        request,
        started,
        mut guard,
        raw,
    } = p;
    let chat = &state.chat;
    let index = record.index;
    let trial = &trial;
    let prepared_s = started.elapsed().as_secs_f64();
    // Every request streams from the backend, so that a request dropped mid-generation (the
    // client went away) still records the tokens generated so far; `tokens` (streaming answers)
    // gets each one forwarded.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    guard.tokens = Some(rx);
    // The weights stay as they are until this generation ends (`Proxy::swap_weights`), and the
    // version is read under the same lock: the capture names the weights that produced it.
    let serving = state.serving.read().await;
    record.policy_version = state.policy_version.load(std::sync::atomic::Ordering::SeqCst);
    if let Some(g) = guard.generation.as_mut() {
        g.policy_version = record.policy_version;
    }
    let generation = state.backend.generate_streaming(request, tx);
    tokio::pin!(generation);
    let result = loop {
        let rx = guard.tokens.as_mut().expect("invariant: set above");
        tokio::select! {
            biased;
            Some(t) = rx.recv() => {
                guard.received.push(t);
                if let Some(sink) = &tokens {
                    let _ = sink.send(t);
                }
            }
            res = &mut generation => break res,
        }
    };
    drop(serving);
    // Tokens sent just before the generation finished.
    if let Some(rx) = &mut guard.tokens {
        while let Ok(t) = rx.try_recv() {
            if let Some(sink) = &tokens {
                let _ = sink.send(t);
            }
        }
    }
    // From here on the capture is written below whatever happens (the client may still go away
    // while the answer is being sent; the generation is complete and recorded as such).
    guard.done();
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            let err = match e {
                EngineError::ContextLength { prompt, context } => {
                    ProxyError::ContextLength { prompt, context }
                }
                e => ProxyError::Backend(e.to_string()),
            };
            let context = matches!(err, ProxyError::ContextLength { .. });
            record.status = Some(if context { CONTEXT_LIMIT } else { "infra_error" }.into());
            record.error = Some(err.to_string());
            trial.push(record, conv, opts, None);
            return Err(err);
        }
    };
    let ids = tool_call_ids(trial, api, index);
    let parser = if raw {
        Ok(None)
    } else {
        chat.prompt_ends_in_reasoning(&record.prompt_ids)
            .map(|r| Some(chat.stream_parser(ids, r).with_tools(&conv.tools)))
    };
    let parsed = parser.and_then(|p| chat.parse_text(&out.output_ids, p, &record.sampling.stop));
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => {
            // The tokens were generated: keep them, and tell the client it was our fault.
            record.output_ids = out.output_ids;
            record.logprobs = Packed::f32_vec(&out.logprobs);
            record.status = Some("infra_error".into());
            record.error = Some(format!("cannot parse the output: {e:#}"));
            trial.push(record, conv, opts, None);
            return Err(ProxyError::Backend(format!(
                "cannot parse the model output: {e:#}"
            )));
        }
    };

    record_output(&mut record, &out, &parsed, state.cfg.return_routing);
    record.timings = BTreeMap::from([
        ("prepare".to_string(), prepared_s),
        ("engine".to_string(), out.seconds),
        ("total".to_string(), started.elapsed().as_secs_f64()),
    ]);
    let outcome = Outcome {
        prompt_tokens: record.prompt_ids.len(),
        output_tokens: record.output_ids.len(),
        finish: out.finish_reason,
        index,
        parsed: parsed.clone(),
    };
    // The capture is complete before the harness sees a byte of the answer.
    // Plain completions are never spliced onto (no assistant message to match).
    let assistant = (!raw).then(|| parsed.to_message());
    trial.push(record, conv, opts, assistant);
    Ok(outcome)
}

/// Fills the capture of a generation that ended well: its tokens, log-probs and routing (or that
/// routing asked for is missing), why it finished, and what parsing found.
fn record_output(record: &mut Generation, out: &GenerateOutput, parsed: &ParsedOutput, return_routing: bool) {
    record.output_ids = out.output_ids.clone();
    record.logprobs = Packed::f32_vec(&out.logprobs);
    record.processed_logprobs = out.processed_logprobs && record.sampling.is_processed();
    record.routing = out
        .routing
        .as_ref()
        .map(|r| Packed::from_experts(vec![r.tokens, r.layers, r.top_k], &r.experts));
    match &out.routing {
        Some(r) if r.start != 0 => {
            record.extra.insert("routing_start".into(), json!(r.start));
        }
        Some(_) => {}
        // Asked for (an MoE policy) and not returned: align and train-step count these tokens
        // as unreplayable instead of training them with the trainer's own routing unseen.
        None if return_routing => {
            record.extra.insert(ROUTING_MISSING.into(), json!(true));
        }
        None => {}
    }
    if let Some(n) = out.cached_tokens {
        record.extra.insert("cached_tokens".into(), json!(n));
    }
    record.finish_reason = if parsed.tool_calls.is_empty() {
        out.finish_reason.as_str().into()
    } else {
        "tool_calls".into()
    };
    record.tool_call_ids = parsed.tool_calls.iter().map(|c| c.id.clone()).collect();
    record.response = Some(CapturedResponse {
        text: parsed.content.clone(),
        reasoning: parsed.reasoning.clone(),
        tool_calls: parsed
            .tool_calls
            .iter()
            .map(|c| CapturedCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
    });
    record.status = Some(
        if parsed.malformed_tool_calls > 0 {
            "malformed_tool_call"
        } else {
            "ok"
        }
        .into(),
    );
    if let Some(s) = &parsed.stop {
        record.extra.insert("stop_string".into(), json!(s));
    }
    if parsed.malformed_tool_calls > 0 {
        record
            .extra
            .insert(MALFORMED_TOOL_CALLS.into(), json!(parsed.malformed_tool_calls));
    }
}
