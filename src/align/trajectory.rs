//! One trajectory → threads → segments (a tree of captured generations) → samples + stats.
//!
//! Two relations are computed between the trial's generations, in request order:
//! - **message parent** (threads): request j extends request i when i's messages are a prefix of
//!   j's under [`same_message`] and the message after that prefix is i's answer, linked by
//!   [`link`]. A request that extends none either rewrites the history of the thread whose
//!   system prompt it shares (compaction, condensation: a new segment there) or opens a new
//!   thread (side requests, sub-agents).
//! - **token parent** (segments): the message parent, when j's captured prompt starts with i's
//!   prompt + output token for token (the proxy's faithful splice). Otherwise j starts a new
//!   segment (the engine saw a re-rendered history, not i's tokens).
//!
//! Token parents form a forest; each leaf gives one sample: the leaf's prompt + output, loss
//! mask 1 on the outputs of the generations on its path that no earlier sample trained (a node
//! shared by branches is trained once), their rollout log-probs, and routing per position taken
//! from the deepest generation that recorded it.

use serde_json::{json, Value};

use super::messages::{common_prefix, link, same_message, Link, MatchMode};
use super::{AlignError, Settings};
use crate::chat::{Conversation, Message, Role, ToolCallIds};
use crate::records::{
    AlignStats, Generation, LossMask, Packed, Record, Sample, SamplingRun, Trajectory, VersionRun,
    CONTEXT_LIMIT,
};

/// A generation's recorded routing, decoded.
struct Routing {
    start: usize,
    rows: usize,
    /// layers × top_k
    layers: usize,
    top_k: usize,
    ids: Vec<u16>,
}

/// A usable generation with what alignment needs.
struct Node<'a> {
    g: &'a Generation,
    conv: Conversation,
    captured: Option<Message>,
    logprobs: Vec<f32>,
    routing: Option<Routing>,
    /// Provisional thread (renumbered at the end).
    thread: usize,
    token_parent: Option<usize>,
    children: usize,
}

impl Node<'_> {
    fn seq_len(&self) -> usize {
        self.g.prompt_ids.len() + self.g.output_ids.len()
    }
}

fn bad(t: &Trajectory, pos: usize, field: &str, msg: impl Into<String>) -> AlignError {
    AlignError::BadGeneration {
        trajectory: t.id.clone(),
        position: pos,
        index: t.generations.get(pos).map_or(0, |g| g.index),
        field: field.to_string(),
        msg: msg.into(),
    }
}

/// Whether `j`'s prompt continues `i`'s prompt + output token for token.
fn tokens_chain(i: &Generation, j: &Generation) -> bool {
    let (p, o) = (i.prompt_ids.len(), i.output_ids.len());
    let q = &j.prompt_ids;
    // The output part first: it differs soonest between unrelated generations.
    q.len() > p + o && q[p..p + o] == i.output_ids[..] && q[..p] == i.prompt_ids[..]
}

fn decode_routing(t: &Trajectory, pos: usize, g: &Generation) -> Result<Option<Routing>, AlignError> {
    let Some(r) = &g.routing else { return Ok(None) };
    if r.shape.len() != 3 {
        return Err(bad(
            t,
            pos,
            "routing.shape",
            format!("{:?} is not [tokens, layers, top_k]", r.shape),
        ));
    }
    let ids = r
        .to_experts()
        .map_err(|e| bad(t, pos, "routing", e.to_string()))?;
    let start = match g.extra.get("routing_start") {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(t, pos, "extra.routing_start", format!("{v} is not a position")))?
            as usize,
    };
    let total = g.prompt_ids.len() + g.output_ids.len();
    if start + r.shape[0] > total {
        return Err(bad(
            t,
            pos,
            "routing.shape",
            format!(
                "covers positions {start}..{} but prompt + output has {total}",
                start + r.shape[0]
            ),
        ));
    }
    Ok(Some(Routing {
        start,
        rows: r.shape[0],
        layers: r.shape[1],
        top_k: r.shape[2],
        ids,
    }))
}

/// The generation's output as the proxy returned it (reasoning, text, calls with its ids; cut at
/// its stop strings).
fn decode_captured(
    chat: &crate::chat::ChatFormat,
    t: &Trajectory,
    pos: usize,
    g: &Generation,
    conv: &Conversation,
) -> Result<Message, AlignError> {
    let in_reasoning = chat
        .prompt_ends_in_reasoning(&g.prompt_ids)
        .map_err(|e| bad(t, pos, "prompt_ids", e.to_string()))?;
    let parsed = chat
        .parse_output(
            &g.output_ids,
            ToolCallIds::new(t.id.clone(), g.index as u64),
            in_reasoning,
            &conv.tools,
            // Cut where the proxy cut the answer: the harness echoes the text without the stop
            // string (and whatever the engine produced with the token that completed it).
            &g.sampling.stop,
        )
        .map_err(|e| bad(t, pos, "output_ids", e.to_string()))?;
    let mut m = parsed.to_message();
    // The ids the proxy actually handed out are recorded; they win over recomputed ones.
    for (c, id) in m.tool_calls.iter_mut().zip(&g.tool_call_ids) {
        c.id = id.clone();
    }
    Ok(m)
}

fn drop_turn(stats: &mut AlignStats, reason: &str, tokens: usize) {
    stats.dropped_turns += 1;
    stats.dropped_tokens += tokens as u64;
    *stats.dropped_by_reason.entry(reason.to_string()).or_default() += 1;
}

/// Aligns one trajectory, in four phases: the usable generations in request order become nodes
/// ([`usable_node`]), nodes are linked into threads and segments ([`link_threads`]), threads are
/// numbered main agent first ([`number_threads`]), and each leaf becomes a sample
/// ([`leaf_sample`]).
pub fn align_trajectory(t: &Trajectory, s: &Settings) -> Result<(Vec<Sample>, AlignStats), AlignError> {
    let mut stats = AlignStats {
        schema: AlignStats::SCHEMA.to_string(),
        trajectory_id: Some(t.id.clone()),
        trajectories: 1,
        ..Default::default()
    };
    let chat = s.chat_for(t);
    if chat.is_none() {
        stats.without_tokenizer = 1;
    }
    let mut nodes = Vec::new();
    for pos in request_order(t)? {
        if let Some(node) = usable_node(t, pos, chat.as_deref(), &mut stats)? {
            nodes.push(node);
        }
    }
    let threads = link_threads(&mut nodes, s.mode, &mut stats);
    let number = number_threads(&nodes, threads);
    stats.threads = threads as u64;

    // One sample per leaf, leaves in request order.
    let mut trained = vec![false; nodes.len()];
    let mut segments = vec![0u32; threads];
    let mut samples = Vec::new();
    for leaf in (0..nodes.len()).filter(|&k| nodes[k].children == 0) {
        let thread = nodes[leaf].thread;
        let (number, segment) = (number[thread], segments[thread]);
        segments[thread] += 1;
        let sample = leaf_sample(t, &nodes, leaf, (number, segment), &mut trained, &mut stats)?;
        samples.push(sample);
    }
    stats.segments = samples.len() as u64;
    stats.samples = samples.len() as u64;
    Ok((samples, stats))
}

/// The positions of `t`'s generations in request order (by `index`, which must be unique).
fn request_order(t: &Trajectory) -> Result<Vec<usize>, AlignError> {
    let mut order: Vec<usize> = (0..t.generations.len()).collect();
    order.sort_by_key(|&p| t.generations[p].index);
    if let Some(w) = order
        .windows(2)
        .find(|w| t.generations[w[0]].index == t.generations[w[1]].index)
    {
        return Err(bad(
            t,
            w[1],
            "index",
            format!("{} appears twice", t.generations[w[1]].index),
        ));
    }
    Ok(order)
}

/// The node for generation `pos`, or `None` when the turn is dropped or was a context refusal
/// (counted in `stats`); an error when the record itself is inconsistent.
fn usable_node<'a>(
    t: &'a Trajectory,
    pos: usize,
    chat: Option<&crate::chat::ChatFormat>,
    stats: &mut AlignStats,
) -> Result<Option<Node<'a>>, AlignError> {
    let g = &t.generations[pos];
    let logprobs = g
        .logprobs
        .to_f32()
        .map_err(|e| bad(t, pos, "logprobs", e.to_string()))?;
    let status = g.status.as_deref().unwrap_or("ok");
    if status == CONTEXT_LIMIT && g.output_ids.is_empty() {
        stats.context_refusals += 1;
        return Ok(None);
    }
    if !matches!(status, "ok" | "malformed_tool_call") {
        drop_turn(stats, &format!("status:{status}"), g.output_ids.len());
        return Ok(None);
    }
    stats.malformed_tool_calls += g.malformed_tool_calls();
    if logprobs.len() != g.output_ids.len() {
        return Err(bad(
            t,
            pos,
            "logprobs",
            format!(
                "{} values for {} output tokens",
                logprobs.len(),
                g.output_ids.len()
            ),
        ));
    }
    let routing = decode_routing(t, pos, g)?;
    if g.output_ids.is_empty() {
        drop_turn(stats, "empty_output", 0);
        return Ok(None);
    }
    // The recorded log-probs must be the behaviour policy's: greedy decoding has none, and a
    // tempered or truncated sampling whose engine recorded the model's own log-probs (SGLang,
    // vLLM without `--logprobs-mode processed_logprobs`, forced tokens on vLLM) has the wrong
    // ones. Neither is guessed.
    if let Some(reason) = unfaithful_sampling(g) {
        drop_turn(stats, reason, g.output_ids.len());
        return Ok(None);
    }
    if g.prompt_ids.is_empty() {
        return Err(bad(t, pos, "prompt_ids", "empty for a generation with output"));
    }
    let conv = match Conversation::from_api_request(&g.api, &g.request) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("trajectory {} generation {}: request: {e:#}", t.id, g.index);
            drop_turn(stats, "unparseable_request", g.output_ids.len());
            return Ok(None);
        }
    };
    let captured = match chat {
        Some(chat) => Some(decode_captured(chat, t, pos, g, &conv)?),
        None => None,
    };
    Ok(Some(Node {
        g,
        conv,
        captured,
        logprobs,
        routing,
        thread: 0,
        token_parent: None,
        children: 0,
    }))
}

/// Whether some generation among `nodes` produced `m` (ids or exact content, no token check).
fn captured_by_any(nodes: &[Node], m: &Message, mode: MatchMode) -> bool {
    nodes
        .iter()
        .any(|n| link(m, &n.g.tool_call_ids, n.captured.as_ref(), false, mode).is_some())
}

/// Sets each node's provisional thread and token parent (counting segment breaks, mismatches,
/// compactions and unlinked assistant turns in `stats`); returns the number of threads.
fn link_threads(nodes: &mut [Node], mode: MatchMode, stats: &mut AlignStats) -> usize {
    let mut threads = 0usize;
    for j in 0..nodes.len() {
        let (parent, apparent_mismatch) = message_parent(nodes, j, mode);
        let first_new = match parent {
            Some((i, l, chain)) => {
                if let Link::ById { differs: true } = l {
                    stats.tool_call_mismatches += 1;
                    stats.mismatches_resolved_by_id += 1;
                }
                nodes[j].thread = nodes[i].thread;
                if chain {
                    nodes[j].token_parent = Some(i);
                    nodes[i].children += 1;
                    if nodes[i].children > 1 {
                        segment_break(stats, "branch");
                    }
                } else {
                    segment_break(stats, "prompt_not_token_continuation");
                }
                nodes[i].conv.messages.len() + 1
            }
            None => {
                if apparent_mismatch {
                    stats.tool_call_mismatches += 1;
                }
                match rewritten_thread(nodes, j, mode) {
                    Some(i) => {
                        // History rewritten (compaction): count the messages of the thread's
                        // latest request that the new history no longer holds anywhere.
                        let (prev, now) = (&nodes[i].conv.messages, &nodes[j].conv.messages);
                        stats.compacted_messages += prev
                            .iter()
                            .filter(|m| !now.iter().any(|n| same_message(m, n, mode)))
                            .count() as u64;
                        let first_new = common_prefix(prev, now, mode);
                        nodes[j].thread = nodes[i].thread;
                        segment_break(stats, "history_rewritten");
                        first_new
                    }
                    None => {
                        nodes[j].thread = threads;
                        threads += 1;
                        0
                    }
                }
            }
        };
        // Assistant turns in the new part of the request that no captured generation produced.
        let messages = &nodes[j].conv.messages;
        for m in &messages[first_new.min(messages.len())..] {
            if m.role == Role::Assistant && !captured_by_any(&nodes[..j], m, mode) {
                stats.unlinked_assistant_messages += 1;
            }
        }
    }
    threads
}

fn segment_break(stats: &mut AlignStats, reason: &str) {
    *stats.segment_breaks.entry(reason.into()).or_default() += 1;
}

/// Request `j`'s message parent, the latest earlier request whose messages and answer `j`'s
/// history extends, as (parent, how the echo links, whether the tokens chain too); and whether
/// some earlier history matched up to its answer but the echo was nobody's (a mismatch).
fn message_parent(nodes: &[Node], j: usize, mode: MatchMode) -> (Option<(usize, Link, bool)>, bool) {
    let mut apparent_mismatch = false;
    for i in (0..j).rev() {
        let (a, b) = (&nodes[i], &nodes[j]);
        let n = a.conv.messages.len();
        if b.conv.messages.len() <= n || common_prefix(&a.conv.messages, &b.conv.messages[..n], mode) < n {
            continue;
        }
        let echo = &b.conv.messages[n];
        if echo.role != Role::Assistant {
            continue;
        }
        let chain = tokens_chain(a.g, b.g);
        match link(echo, &a.g.tool_call_ids, a.captured.as_ref(), chain, mode) {
            Some(l) => return (Some((i, l, chain)), apparent_mismatch),
            // The history matches up to i's answer, but the echo is not i's answer as
            // captured — unless it is another generation's (turns dropped in between).
            None => apparent_mismatch |= !captured_by_any(&nodes[..j], echo, mode),
        }
    }
    (None, apparent_mismatch)
}

/// For a request `j` that extends no earlier one: the latest earlier request with the same
/// system prompt, whose thread `j` rewrites the history of; `None` when `j` opens a new thread.
fn rewritten_thread(nodes: &[Node], j: usize, mode: MatchMode) -> Option<usize> {
    let sys = nodes[j]
        .conv
        .messages
        .first()
        .filter(|m| m.role == Role::System)?;
    (0..j).rev().find(|&i| {
        nodes[i]
            .conv
            .messages
            .first()
            .is_some_and(|m| same_message(m, sys, mode))
    })
}

/// Each thread's number: the main agent (the thread with most generations, ties: earliest) is 0,
/// the others follow by first request.
fn number_threads(nodes: &[Node], threads: usize) -> Vec<u32> {
    let mut count = vec![0usize; threads];
    let mut first = vec![usize::MAX; threads];
    for (k, n) in nodes.iter().enumerate() {
        count[n.thread] += 1;
        first[n.thread] = first[n.thread].min(k);
    }
    let mut rank: Vec<usize> = (0..threads).collect();
    rank.sort_by_key(|&th| first[th]);
    if let Some(main) = (0..threads).max_by_key(|&th| (count[th], std::cmp::Reverse(first[th]))) {
        rank.retain(|&th| th != main);
        rank.insert(0, main);
    }
    let mut number = vec![0u32; threads];
    for (k, &th) in rank.iter().enumerate() {
        number[th] = k as u32;
    }
    number
}

/// The sample for `leaf`, segment `segment` of thread `number`: the leaf's prompt + output,
/// trained on the generations of its token path that no earlier sample trained (marked in
/// `trained`).
fn leaf_sample(
    t: &Trajectory,
    nodes: &[Node],
    leaf: usize,
    (number, segment): (u32, u32),
    trained: &mut [bool],
    stats: &mut AlignStats,
) -> Result<Sample, AlignError> {
    let mut path = vec![leaf];
    while let Some(p) = nodes[*path.last().expect("invariant: non-empty")].token_parent {
        path.push(p);
    }
    path.reverse();
    let lg = nodes[leaf].g;
    let tokens: Vec<u32> = lg.prompt_ids.iter().chain(&lg.output_ids).copied().collect();
    let exact = path.iter().all(|&k| {
        let g = nodes[k].g;
        let p = g.prompt_ids.len();
        tokens[..p] == g.prompt_ids[..] && tokens[p..p + g.output_ids.len()] == g.output_ids[..]
    });
    if !exact {
        return Err(AlignError::Invariant(format!(
            "trajectory {}: segment ending at generation {} is not a token chain",
            t.id, lg.index
        )));
    }
    stats.token_exact_samples += 1;
    let mut mask = vec![false; tokens.len()];
    let mut lps = Vec::new();
    let mut sampling: Vec<SamplingRun> = Vec::new();
    let mut versions: Vec<VersionRun> = Vec::new();
    let mut trained_here = Vec::new();
    for &k in &path {
        if trained[k] {
            continue;
        }
        trained[k] = true;
        let n = &nodes[k];
        let p = n.g.prompt_ids.len();
        mask[p..n.seq_len()].fill(true);
        push_run(&mut sampling, SamplingRun::of(&n.g.sampling, lps.len() as u32));
        push_version(
            &mut versions,
            t.policy_version,
            n.g.policy_version,
            lps.len() as u32,
        );
        lps.extend_from_slice(&n.logprobs);
        trained_here.push(n.g.index);
        stats.aligned_turns += 1;
        stats.policy_tokens += n.g.output_ids.len() as u64;
    }
    let routing = sample_routing(nodes, &path, tokens.len());
    // An MoE sample: some generation recorded routing, or said the backend returned none.
    let routed = |k: usize| {
        nodes[k].routing.is_some()
            || nodes[k].g.extra.get(crate::records::ROUTING_MISSING) == Some(&serde_json::Value::Bool(true))
    };
    if routing.is_none() && path.iter().any(|&k| routed(k)) {
        stats.samples_without_routing += 1;
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert(
        "generations".into(),
        Value::from(path.iter().map(|&k| nodes[k].g.index).collect::<Vec<_>>()),
    );
    metadata.insert("trained".into(), json!(trained_here));
    let weight = if t.is_infra_failure() || t.reward.is_none() {
        0.0
    } else {
        1.0
    };
    Ok(Sample {
        schema: Sample::SCHEMA.to_string(),
        id: format!("{}#{}.{}", t.id, number, segment),
        trajectory_id: t.id.clone(),
        task_id: t.task_id.clone(),
        group_id: t.group_id,
        sample_index: t.sample_index,
        thread: number,
        segment,
        token_ids: tokens,
        loss_mask: LossMask::from_dense(&mask),
        rollout_logprobs: Packed::f32_vec(&lps),
        sampling,
        routing,
        reward: t.reward.unwrap_or(0.0),
        weight,
        policy_version: t.policy_version,
        policy_versions: versions,
        metadata,
    })
}

/// Why a generation's log-probs are not those of the distribution its tokens were drawn from
/// (a drop reason), or `None` when they are.
fn unfaithful_sampling(g: &Generation) -> Option<&'static str> {
    if g.sampling.is_greedy() {
        Some("greedy_decoding")
    } else if g.sampling.is_processed() && !g.processed_logprobs {
        Some("logprobs_not_of_sampling")
    } else {
        None
    }
}

/// Appends `run` to a sample's sampling runs where the distribution changes; runs of the model's
/// own distribution before the first processed one are left out (the default).
fn push_run(runs: &mut Vec<SamplingRun>, run: SamplingRun) {
    match runs.last() {
        Some(last) if last.same_distribution(&run) => {}
        None if run.is_model() => {}
        _ => runs.push(run),
    }
}

/// Appends a run for a generation of policy `version` whose tokens start at policy token
/// `start`, in a trajectory that started on `first`. No runs while every token is `first`'s (the
/// usual case); once one differs, the runs cover every token from 0. A generation can never be
/// older than its trajectory (versions only grow), so an older or absent one (0, a record from a
/// producer that does not fill it) counts as `first`.
fn push_version(runs: &mut Vec<VersionRun>, first: u64, version: u64, start: u32) {
    let version = version.max(first);
    match runs.last() {
        Some(last) if last.version == version => {}
        None if version == first => {}
        None => {
            if start > 0 {
                runs.push(VersionRun {
                    start: 0,
                    version: first,
                });
            }
            runs.push(VersionRun { start, version });
        }
        Some(_) => runs.push(VersionRun { start, version }),
    }
}

/// Routing rows for positions 0..T−1 (the last token is never forwarded), each from the deepest
/// generation on the path that recorded it; `None` when some position has none.
fn sample_routing(nodes: &[Node], path: &[usize], t: usize) -> Option<Packed> {
    let first = path.iter().rev().find_map(|&k| nodes[k].routing.as_ref())?;
    let (layers, top_k) = (first.layers, first.top_k);
    let w = layers * top_k;
    let rows = t - 1;
    let mut ids = vec![0u16; rows * w];
    let mut filled = vec![false; rows];
    let mut missing = rows;
    for &k in path.iter().rev() {
        let Some(r) = &nodes[k].routing else { continue };
        if r.layers != layers || r.top_k != top_k {
            continue;
        }
        for row in 0..r.rows {
            let p = r.start + row;
            if p < rows && !filled[p] {
                filled[p] = true;
                missing -= 1;
                ids[p * w..(p + 1) * w].copy_from_slice(&r.ids[row * w..(row + 1) * w]);
            }
        }
        if missing == 0 {
            break;
        }
    }
    (missing == 0).then(|| Packed::from_experts(vec![rows, layers, top_k], &ids))
}
