//! Per-trial capture and the generation path shared by both APIs: thread attribution, prompt
//! building (faithful or rendered), the backend call, output parsing, and the capture record,
//! written before the response is sent. A request whose client goes away before the answer is
//! recorded as `client_disconnected`; a backend failure as `infra_error`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use super::{ProxyError, State};
use crate::chat::{
    Conversation, Message, ParsedOutput, PreviousGeneration, RenderOptions, Role, ToolCallIds,
};
use crate::engine::{EngineError, FinishReason, GenerateRequest};
use crate::records::{Generation, Packed, PromptMode, Sampling};

/// One captured generation with what faithful prompting of the next turn needs.
#[derive(Debug, Clone)]
pub struct Captured {
    pub generation: Generation,
    conversation: Conversation,
    options: RenderOptions,
    assistant: Option<Message>,
}

#[derive(Debug, Default)]
struct Inner {
    captured: Vec<Captured>,
    /// Thread keys in order of first appearance (index = thread number).
    threads: Vec<String>,
    /// Scripted continuations, forced in order (tests and demonstrations).
    script: VecDeque<String>,
    next_index: u32,
}

/// A trial's captures.
#[derive(Debug)]
pub struct Trial {
    pub id: String,
    inner: Mutex<Inner>,
}

impl Trial {
    pub(crate) fn new(id: &str) -> Self {
        Trial {
            id: id.to_string(),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("invariant: lock not poisoned")
    }

    /// Every generation captured so far, in request order.
    pub fn generations(&self) -> Vec<Generation> {
        let mut g: Vec<Generation> = self
            .lock()
            .captured
            .iter()
            .map(|c| c.generation.clone())
            .collect();
        g.sort_by_key(|g| g.index);
        g
    }

    /// Queues scripted assistant outputs (raw model text, e.g. with `<tool_call>` markup) that the
    /// next generations are forced to produce; the engine still computes their log-probs and routing.
    pub fn push_script(&self, outputs: impl IntoIterator<Item = String>) {
        self.lock().script.extend(outputs);
    }

    fn thread_of(&self, conv: &Conversation) -> u32 {
        // A thread is identified by its system prompt and first user message: side requests
        // (titles, summaries) and sub-agents differ in one of them.
        let first = |role| {
            conv.messages
                .iter()
                .find(|m| m.role == role)
                .map(|m| m.content.as_str())
                .unwrap_or("")
        };
        let key = format!("{}\u{0}{}", first(Role::System), first(Role::User));
        let mut inner = self.lock();
        match inner.threads.iter().position(|k| *k == key) {
            Some(i) => i as u32,
            None => {
                inner.threads.push(key);
                (inner.threads.len() - 1) as u32
            }
        }
    }
}

/// What the API layers need to answer.
pub(crate) struct Outcome {
    pub parsed: ParsedOutput,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    pub finish: FinishReason,
    pub index: u32,
}

/// Records `client_disconnected` when dropped before [`InFlight::done`].
struct InFlight {
    trial: Arc<Trial>,
    generation: Option<Generation>,
}

impl InFlight {
    fn done(mut self) {
        self.generation = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(mut g) = self.generation.take() {
            g.status = Some("client_disconnected".into());
            let conv = Conversation::default();
            self.trial.lock().captured.push(Captured {
                generation: g,
                conversation: conv,
                options: RenderOptions::generation(None),
                assistant: None,
            });
        }
    }
}

/// A request whose prompt is built and checked, ready for the backend.
pub(crate) struct Prepared {
    trial: Arc<Trial>,
    api: &'static str,
    conv: Conversation,
    opts: RenderOptions,
    record: Generation,
    request: GenerateRequest,
    started: Instant,
}

/// First half of the generation path: thread, prompt (faithful or rendered), context check.
/// Runs before a streaming response starts, so a prompt that cannot be served gets a plain 400.
pub(crate) fn prepare(
    state: &State,
    trial: &Arc<Trial>,
    api: &'static str,
    request: Value,
    conv: Conversation,
    opts: RenderOptions,
    sampling: Sampling,
) -> Result<Prepared, ProxyError> {
    let started = Instant::now();
    let thread = trial.thread_of(&conv);
    let (index, forced_text) = {
        let mut inner = trial.lock();
        let i = inner.next_index;
        inner.next_index += 1;
        (i, inner.script.pop_front())
    };
    let chat = &state.chat;
    let bad = |e: crate::chat::ChatError| ProxyError::BadRequest(format!("{e:#}"));

    // Prompt: faithful splice onto the thread's latest capture, else a fresh render.
    let mut extra = serde_json::Map::new();
    let mut mode = PromptMode::Rendered;
    let mut prompt_ids = None;
    if state.cfg.prompt_mode == PromptMode::Faithful {
        let inner = trial.lock();
        let prev = inner.captured.iter().rev().find(|c| {
            c.generation.thread == thread
                && c.assistant.is_some()
                && c.generation.status.as_deref() == Some("ok")
        });
        if let Some(prev) = prev {
            let p = PreviousGeneration {
                conversation: &prev.conversation,
                options: &prev.options,
                prompt_ids: &prev.generation.prompt_ids,
                output_ids: &prev.generation.output_ids,
                assistant: prev.assistant.as_ref().expect("invariant: filtered on is_some"),
            };
            match chat.faithful_prompt(&p, &conv, &opts) {
                Ok(fp) => {
                    extra.insert("reused_tokens".into(), json!(fp.reused));
                    extra.insert("spliced_after".into(), json!(prev.generation.index));
                    mode = PromptMode::Faithful;
                    prompt_ids = Some(fp.prompt_ids);
                }
                Err(brk) => {
                    extra.insert("segment_break".into(), json!(brk.to_string()));
                }
            }
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
    let forced_output = match forced_text {
        Some(text) => {
            let mut ids = chat.encode(&text).map_err(bad)?;
            if let Some(end) = special.im_end {
                if ids.last() != Some(&end) {
                    ids.push(end);
                }
            }
            Some(ids)
        }
        None => None,
    };
    if let Some(context) = state.backend.context_length() {
        if prompt_ids.len() >= context {
            return Err(ProxyError::ContextLength(format!(
                "prompt of {} tokens does not fit the model's context of {context} tokens",
                prompt_ids.len()
            )));
        }
    }
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
        extra,
        ..Default::default()
    };
    let request = GenerateRequest {
        prompt_ids,
        sampling,
        stop_token_ids,
        return_routing: state.cfg.return_routing,
        forced_output,
    };
    Ok(Prepared {
        trial: trial.clone(),
        api,
        conv,
        opts,
        record,
        request,
        started,
    })
}

/// Second half: the backend call, parsing, and the capture (written before the answer).
pub(crate) async fn run(state: &State, p: Prepared) -> Result<Outcome, ProxyError> {
    let Prepared {
        trial,
        api,
        conv,
        opts,
        mut record,
        request,
        started,
    } = p;
    let chat = &state.chat;
    let bad = |e: crate::chat::ChatError| ProxyError::BadRequest(format!("{e:#}"));
    let index = record.index;
    let trial = &trial;
    let guard = InFlight {
        trial: trial.clone(),
        generation: Some(record.clone()),
    };
    let result = state.backend.generate(request).await;
    guard.done();
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            record.status = Some("infra_error".into());
            record.error = Some(e.to_string());
            trial.lock().captured.push(Captured {
                generation: record,
                conversation: conv,
                options: opts,
                assistant: None,
            });
            return Err(match e {
                EngineError::ContextLength { .. } => ProxyError::ContextLength(e.to_string()),
                other => ProxyError::Backend(other.to_string()),
            });
        }
    };
    let prefix = if api == "anthropic" { "toolu_" } else { "call_" };
    let ids = ToolCallIds::new(trial.id.clone(), index as u64).with_prefix(prefix);
    let starts_in_reasoning = chat.starts_in_reasoning(&conv, &opts).map_err(bad)?;
    let parsed = chat
        .parse_output(&out.output_ids, ids, starts_in_reasoning, &conv.tools)
        .map_err(bad)?;

    record.output_ids = out.output_ids.clone();
    record.logprobs = Packed::f32_vec(&out.logprobs);
    record.routing = out
        .routing
        .as_ref()
        .map(|r| Packed::from_experts(vec![r.tokens, r.layers, r.top_k], &r.experts));
    if let Some(r) = &out.routing {
        if r.start != 0 {
            record.extra.insert("routing_start".into(), json!(r.start));
        }
    }
    record.finish_reason = if parsed.tool_calls.is_empty() {
        out.finish_reason.as_str().into()
    } else {
        "tool_calls".into()
    };
    record.tool_call_ids = parsed.tool_calls.iter().map(|c| c.id.clone()).collect();
    record.status = Some(
        if parsed.malformed_tool_calls > 0 {
            "malformed_tool_call"
        } else {
            "ok"
        }
        .into(),
    );
    if parsed.malformed_tool_calls > 0 {
        record
            .extra
            .insert("malformed_tool_calls".into(), json!(parsed.malformed_tool_calls));
    }
    record.timings = BTreeMap::from([
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
    trial.lock().captured.push(Captured {
        generation: record,
        conversation: conv,
        options: opts,
        assistant: Some(parsed.to_message()),
    });
    Ok(outcome)
}
