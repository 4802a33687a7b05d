//! Generations that outlive their request, so that a client's retry never forks a turn.
//!
//! The official OpenAI and Anthropic SDKs retry a request on timeouts, connection errors and 5xx
//! (announcing it with `x-stainless-retry-count`). Were the retry a new generation, align would
//! find two candidates for one assistant message. So every generation runs in its own task (a
//! [`Flight`]) and the request only watches it: a retry of a thread's latest request (see
//! `Trial::replay_of`) watches the same flight, and is answered with the same output, streamed
//! again when it streams, without a new capture. When no request watches a flight any more (the
//! client went away) it keeps running for [`super::ProxyConfig::retry_grace`], the window in which
//! the SDKs retry; then it is cancelled, and the capture records `client_disconnected` as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use super::capture::{run_with, tool_call_ids, Fresh, Outcome, Prepared, Trial};
use super::{ProxyError, State};
use crate::chat::{StreamEvent, ToolSpec};

/// What a streaming answer is made of: parsed pieces of the output as the tokens come, then the
/// outcome (the capture is written before it is sent).
pub(crate) enum Progress {
    Event(StreamEvent),
    Done(Result<Outcome, ProxyError>),
}

/// The tokens a generation has produced so far, and its outcome once it has one.
#[derive(Default)]
struct SoFar {
    tokens: Vec<u32>,
    result: Option<Result<Outcome, ProxyError>>,
}

/// One generation, running or finished, with what answering from it needs.
pub(crate) struct Flight {
    /// The generation's index in its trial.
    pub index: u32,
    pub prompt_ids: Vec<u32>,
    trial: Arc<Trial>,
    api: &'static str,
    raw: bool,
    tools: Vec<ToolSpec>,
    stop: Vec<String>,
    so_far: Mutex<SoFar>,
    changed: watch::Sender<()>,
    watchers: AtomicUsize,
    cancel: Notify,
    grace: Duration,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight")
            .field("index", &self.index)
            .field("watchers", &self.watchers)
            .field("done", &self.done())
            .finish_non_exhaustive()
    }
}

impl Flight {
    fn lock(&self) -> std::sync::MutexGuard<'_, SoFar> {
        self.so_far.lock().expect("invariant: lock not poisoned")
    }

    /// Whether a retry can be answered from it: still running, or finished with an answer.
    pub(super) fn replayable(&self) -> bool {
        matches!(self.lock().result, None | Some(Ok(_)))
    }

    fn done(&self) -> bool {
        self.lock().result.is_some()
    }

    /// The tokens after the first `seen`, and the outcome if there is one (read together: every
    /// token is in before the outcome).
    fn since(&self, seen: usize) -> (Vec<u32>, Option<Result<Outcome, ProxyError>>) {
        let s = self.lock();
        (s.tokens[seen.min(s.tokens.len())..].to_vec(), s.result.clone())
    }

    fn push(&self, id: u32) {
        self.lock().tokens.push(id);
        self.changed.send_replace(());
    }

    fn finish(&self, result: Result<Outcome, ProxyError>) {
        self.lock().result = Some(result);
        self.changed.send_replace(());
    }

    /// The outcome, once there is one.
    async fn outcome(&self) -> Result<Outcome, ProxyError> {
        let mut changes = self.changed.subscribe();
        loop {
            if let Some(r) = &self.lock().result {
                return r.clone();
            }
            if changes.changed().await.is_err() {
                return Err(ProxyError::Backend("the generation was dropped".into()));
            }
        }
    }
}

/// A request watching a flight. The last one to go (its client went away) leaves the flight
/// running for the retry grace, then cancels it unless another request has started watching.
struct Watch(Arc<Flight>);

impl Watch {
    fn new(flight: Arc<Flight>) -> Self {
        flight.watchers.fetch_add(1, Ordering::SeqCst);
        Watch(flight)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let f = &self.0;
        if f.watchers.fetch_sub(1, Ordering::SeqCst) != 1 || f.done() {
            return;
        }
        let abandoned = |f: &Flight| f.watchers.load(Ordering::SeqCst) == 0 && !f.done();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if !f.grace.is_zero() => {
                let f = f.clone();
                rt.spawn(async move {
                    tokio::time::sleep(f.grace).await;
                    if abandoned(&f) {
                        f.cancel.notify_one();
                    }
                });
            }
            _ => f.cancel.notify_one(),
        }
    }
}

/// Starts a new generation in its own task and makes it its thread's latest request.
fn launch(state: Arc<State>, p: Fresh) -> Arc<Flight> {
    let (changed, _) = watch::channel(());
    let flight = Arc::new(Flight {
        index: p.record.index,
        prompt_ids: p.record.prompt_ids.clone(),
        trial: p.trial.clone(),
        api: p.api,
        raw: p.raw,
        tools: p.conv.tools.clone(),
        stop: p.record.sampling.stop.clone(),
        so_far: Mutex::new(SoFar::default()),
        changed,
        watchers: AtomicUsize::new(0),
        cancel: Notify::new(),
        grace: state.cfg.retry_grace,
    });
    p.trial
        .set_last(p.record.thread, p.record.request.clone(), flight.clone());
    let f = flight.clone();
    tokio::spawn(async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut generation = Box::pin(run_with(&state, p, Some(tx)));
        let result = loop {
            tokio::select! {
                biased;
                _ = f.cancel.notified() => break None,
                Some(t) = rx.recv() => f.push(t.id),
                res = &mut generation => break Some(res),
            }
        };
        let result = match result {
            Some(r) => r,
            None => {
                // Dropping the generation cancels it; its capture records `client_disconnected`.
                drop(generation);
                Err(ProxyError::Backend("the client went away".into()))
            }
        };
        while let Ok(t) = rx.try_recv() {
            f.push(t.id);
        }
        f.finish(result);
    });
    flight
}

fn flight(state: &Arc<State>, p: Prepared) -> Arc<Flight> {
    match p {
        Prepared::Fresh(p) => launch(state.clone(), *p),
        Prepared::Replay(f) => f,
    }
}

/// The answer of a non-streaming request: the generation's outcome (the capture is written
/// before it). If the request is dropped, the generation goes on for the retry grace.
pub(crate) async fn run(state: &Arc<State>, p: Prepared) -> Result<Outcome, ProxyError> {
    let f = flight(state, p);
    let _watch = Watch::new(f.clone());
    f.outcome().await
}

/// Streams parsed output events as the generation produces tokens (from the first token on, for
/// a retry that joins a running or finished generation), then the outcome. When the receiver is
/// dropped (the client went away), the generation goes on for the retry grace, then stops.
pub(crate) fn run_streaming(state: Arc<State>, p: Prepared) -> mpsc::Receiver<Progress> {
    let f = flight(&state, p);
    let watch = Watch::new(f.clone());
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let _watch = watch;
        let ids = tool_call_ids(&f.trial, f.api, f.index);
        let starts_in_reasoning = !f.raw
            && state
                .chat
                .prompt_ends_in_reasoning(&f.prompt_ids)
                .unwrap_or(false);
        let chat_parser = (!f.raw).then(|| {
            state
                .chat
                .stream_parser(ids, starts_in_reasoning)
                .with_tools(&f.tools)
        });
        let mut parser = state.chat.output_stream(chat_parser, &f.stop);
        let mut parse_failed = false;
        let mut feed = |events: Result<Vec<StreamEvent>, crate::chat::ChatError>| match events {
            Ok(ev) if !parse_failed => ev,
            // The final outcome reports the failure; stop previewing.
            _ => {
                parse_failed = true;
                Vec::new()
            }
        };
        let mut changes = f.changed.subscribe();
        let mut seen = 0;
        let result = loop {
            let (tokens, result) = f.since(seen);
            seen += tokens.len();
            let mut events = Vec::new();
            for id in tokens {
                events.extend(feed(parser.push(id)));
            }
            for ev in events {
                if tx.send(Progress::Event(ev)).await.is_err() {
                    return;
                }
            }
            if let Some(r) = result {
                break r;
            }
            tokio::select! {
                biased;
                _ = tx.closed() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        };
        for ev in feed(parser.finish()) {
            if tx.send(Progress::Event(ev)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Progress::Done(result)).await;
    });
    rx
}
