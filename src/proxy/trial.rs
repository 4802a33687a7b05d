//! A trial's captures: its generations in request order, its conversation threads, the scripted
//! continuations still to force, and what the retry guard needs (each thread's latest request).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::flight::Flight;
use crate::chat::{Conversation, Message, RenderOptions, Role};
use crate::records::{Generation, REPLAYS};

/// One captured generation with what faithful prompting of the next turn needs.
#[derive(Debug, Clone)]
pub struct Captured {
    pub generation: Generation,
    pub(super) conversation: Conversation,
    pub(super) options: RenderOptions,
    pub(super) assistant: Option<Message>,
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) captured: Vec<Captured>,
    /// Thread keys in order of first appearance (index = thread number).
    pub(super) threads: Vec<String>,
    /// Scripted continuations, forced in order (tests and demonstrations).
    pub(super) script: VecDeque<String>,
    pub(super) next_index: u32,
    /// Each thread's latest request body and its generation, which a retry of it is answered from.
    pub(super) last: HashMap<u32, (Value, Arc<Flight>)>,
    /// Retries answered from a recorded generation, by the generation's index.
    pub(super) replays: BTreeMap<u32, u64>,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("invariant: lock not poisoned")
    }

    /// Every generation captured so far, in request order. A generation that also answered
    /// client retries has their count in `extra.replays`.
    pub fn generations(&self) -> Vec<Generation> {
        let inner = self.lock();
        let mut g: Vec<Generation> = inner
            .captured
            .iter()
            .map(|c| {
                let mut g = c.generation.clone();
                if let Some(n) = inner.replays.get(&g.index) {
                    g.extra.insert(REPLAYS.into(), json!(n));
                }
                g
            })
            .collect();
        g.sort_by_key(|g| g.index);
        g
    }

    /// Client retries answered from a recorded generation instead of generating again.
    pub fn replays(&self) -> u64 {
        self.lock().replays.values().sum()
    }

    /// Remembers `flight` as the latest request of `thread`, with its body.
    pub(super) fn set_last(&self, thread: u32, body: Value, flight: Arc<Flight>) {
        self.lock().last.insert(thread, (body, flight));
    }

    /// The generation a request repeats, when it is a retry of its thread's latest request: the
    /// same body, or a retry the client announced (`x-stainless-retry-count` > 0, `retry`) with
    /// the same prompt. Only a generation still running or complete can answer it (one that
    /// failed or was cancelled cannot); the replay is counted.
    pub(super) fn replay_of(&self, thread: u32, body: &Value, retry: u32) -> Option<Arc<Flight>> {
        let mut inner = self.lock();
        let (prev, flight) = inner.last.get(&thread)?;
        let same_prompt = || {
            ["messages", "system", "prompt", "tools"]
                .iter()
                .all(|k| prev.get(*k) == body.get(*k))
        };
        if !(prev == body || (retry > 0 && same_prompt())) || !flight.replayable() {
            return None;
        }
        let flight = flight.clone();
        *inner.replays.entry(flight.index).or_default() += 1;
        Some(flight)
    }

    /// Queues scripted assistant outputs (raw model text, e.g. with `<tool_call>` markup) that the
    /// next generations are forced to produce; the engine still computes their log-probs and routing.
    pub fn push_script(&self, outputs: impl IntoIterator<Item = String>) {
        self.lock().script.extend(outputs);
    }

    pub(super) fn push(
        &self,
        generation: Generation,
        conversation: Conversation,
        options: RenderOptions,
        assistant: Option<Message>,
    ) {
        self.lock().captured.push(Captured {
            generation,
            conversation,
            options,
            assistant,
        });
    }

    pub(super) fn thread_of(&self, conv: &Conversation) -> u32 {
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
