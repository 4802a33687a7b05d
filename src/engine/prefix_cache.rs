//! The embedded engine's prefix cache: a radix tree over token ids whose edges carry the KV of
//! their positions and the MoE routing those positions were computed with.
//!
//! An agent episode is a chain of requests, each prompt extending the last, and a GSPO group's
//! samples share their prompt: without a cache every request prefills from token 0. Here a new
//! request takes the KV of its longest cached prefix ([`PrefixCache::lookup`]) and prefills only
//! the rest; the worker inserts every prompt once prefilled and every finished sequence
//! (prompt + output), so the next turn of a conversation and the other samples of a group find
//! it ([`PrefixCache::insert`]).
//!
//! - **Captures stay exact.** An edge keeps the routing its positions were computed with, so a
//!   request served from the cache reports the routing a from-scratch prefill records, and its
//!   log-probs differ only by float summation order (the suffix attends over cached keys instead
//!   of recomputed ones).
//! - **No duplication.** Shared prefixes are stored once: a request diverging inside an edge
//!   splits it (SGLang's radix cache, not vLLM's block hashing: no block size to tune, and no
//!   partly filled last block recomputed).
//! - **Memory**: LRU eviction of leaves under a byte budget (the KV and routing tensors' bytes).
//!   A lookup touches every node on its path, so a parent is never older than its children and
//!   a leaf is always the least recently used of its branch.
//! - **Invalidation**: the worker [`PrefixCache::clear`]s it when weights are reloaded: KV from
//!   another policy version is never reused.
//!
//! **Hybrid models** (Qwen3.5, Qwen3-Next): a Gated DeltaNet layer's recurrent state cannot be
//! cut at a position, so an edge also keeps a [`StateSnapshot`] of every linear-attention
//! layer's conv and fp32 recurrent state *after its last position*, and a lookup resumes from
//! the deepest fully matched edge that has one — never from a state that has absorbed tokens
//! past the request's own. Every insert of a hybrid sequence snapshots its end, so edges end
//! where the worker stops to insert: at the last prompt token but one (where the other samples
//! of a group resume: the last token is always forwarded), at the end of a finished sequence
//! (the next turn of the conversation), and where a prompt left a cached prefix (so the next
//! request parting there resumes there: [`PrefixCache::matched`]). A split creates a head edge
//! without a snapshot; its keys and values still serve the edges below it, and it is dropped
//! with its last child. Snapshot bytes count in the budget; a leaf is always a resume point.

use std::collections::HashMap;

use tch::Tensor;

use crate::model::{tensor_bytes, KvCache, StateSnapshot};

/// The default budget of `--prefix-cache-bytes` (4 GiB).
pub const DEFAULT_BYTES: usize = 4 << 30;

/// What a lookup found: the KV (and, for hybrid models, the recurrent states) and routing of
/// the first `len` positions of the request.
pub struct Hit {
    pub len: usize,
    pub kv: KvCache,
    /// `[len, moe_layers, k]` on the CPU (None for dense models).
    pub routing: Option<Tensor>,
}

/// Why an insert stored nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The sequence's cache holds no keys and values to store.
    Unsliceable,
}

/// One edge of the tree: tokens after its parent's, with their KV and routing.
struct Node {
    tokens: Vec<u32>,
    /// `[kv_heads, tokens.len(), head_dim]` per layer (None for the root).
    kv: Option<KvCache>,
    routing: Option<Tensor>,
    /// Recurrent states after the edge's last position (hybrid models; None on a split's head).
    snapshot: Option<StateSnapshot>,
    /// First token of a child's edge → the child.
    children: HashMap<u32, usize>,
    parent: usize,
    last_used: u64,
    bytes: usize,
}

impl Node {
    fn root() -> Self {
        Node {
            tokens: Vec::new(),
            kv: None,
            routing: None,
            snapshot: None,
            children: HashMap::new(),
            parent: 0,
            last_used: 0,
            bytes: 0,
        }
    }

    fn new(
        tokens: Vec<u32>,
        (kv, routing, snapshot): (KvCache, Option<Tensor>, Option<StateSnapshot>),
        parent: usize,
        now: u64,
    ) -> Self {
        let bytes = kv.bytes()
            + routing.as_ref().map_or(0, tensor_bytes)
            + snapshot.as_ref().map_or(0, StateSnapshot::bytes);
        Node {
            tokens,
            kv: Some(kv),
            routing,
            snapshot,
            children: HashMap::new(),
            parent,
            last_used: now,
            bytes,
        }
    }
}

/// A radix tree of cached prefixes under a byte budget (see the module docs).
pub struct PrefixCache {
    budget: usize,
    /// Arena; index 0 is the root; freed slots are None and listed in `free`.
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    bytes: usize,
    clock: u64,
    evicted: u64,
    /// The sequences hold recurrent states: a hit must end on an edge with a snapshot.
    recurrent: bool,
}

/// Rows `start .. start + len` of a routing tensor, in storage of their own.
fn rows(t: &Tensor, start: usize, len: usize) -> Tensor {
    t.narrow(0, start as i64, len as i64).copy()
}

impl PrefixCache {
    /// An empty cache holding at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            budget,
            nodes: vec![Some(Node::root())],
            free: Vec::new(),
            bytes: 0,
            clock: 0,
            evicted: 0,
            recurrent: false,
        }
    }

    /// Bytes of KV, routing and state snapshots held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Nodes evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Cached positions (the tokens on all edges).
    pub fn tokens(&self) -> usize {
        self.nodes.iter().flatten().map(|n| n.tokens.len()).sum()
    }

    /// Recurrent-state snapshots held (hybrid models).
    pub fn snapshots(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .filter(|n| n.snapshot.is_some())
            .count()
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("invariant: a linked node is live")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("invariant: a linked node is live")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Drops everything (weights changed).
    pub fn clear(&mut self) {
        *self = PrefixCache {
            evicted: self.evicted,
            ..PrefixCache::new(self.budget)
        };
    }

    /// The KV and routing of the longest cached prefix of `ids`, at most `max_len` positions
    /// (None when nothing matches); for hybrid models, the longest that ends on a snapshot, with
    /// its recurrent states in the hit's cache. Every node on the path counts as used now.
    pub fn lookup(&mut self, ids: &[u32], max_len: usize) -> Option<Hit> {
        let ids = &ids[..max_len.min(ids.len())];
        let now = self.tick();
        let mut path: Vec<(usize, usize)> = Vec::new();
        let (mut at, mut p) = (0, 0);
        while p < ids.len() {
            let Some(&child) = self.node(at).children.get(&ids[p]) else {
                break;
            };
            let edge = &self.node(child).tokens;
            let m = common(edge, &ids[p..]);
            path.push((child, m));
            self.node_mut(child).last_used = now;
            p += m;
            if m < self.node(child).tokens.len() {
                break;
            }
            at = child;
        }
        if self.recurrent {
            // A recurrent state is known only after an edge's last position: resume from the
            // deepest whole edge on the path that kept one.
            let last = path
                .iter()
                .rposition(|&(i, m)| m == self.node(i).tokens.len() && self.node(i).snapshot.is_some())?;
            path.truncate(last + 1);
            p = path.iter().map(|&(_, m)| m).sum();
        }
        if p == 0 {
            return None;
        }
        // Only the last node on the path can be matched in part: it gives a slice of its own.
        let (&(last, last_m), full) = path.split_last().expect("invariant: p > 0");
        let last_node = self.node(last);
        let last_kv = last_node.kv.as_ref().expect("invariant: non-root nodes hold KV");
        let partial = if last_m < last_node.tokens.len() {
            Some(last_kv.slice(0, last_m as i64)?)
        } else {
            None
        };
        let mut parts: Vec<&KvCache> = full
            .iter()
            .map(|&(i, _)| {
                self.node(i)
                    .kv
                    .as_ref()
                    .expect("invariant: non-root nodes hold KV")
            })
            .collect();
        parts.push(partial.as_ref().unwrap_or(last_kv));
        let mut kv = KvCache::concat(&parts)?;
        if let (None, Some(s)) = (&partial, &last_node.snapshot) {
            kv.restore(s);
        }
        let routing_parts: Vec<Tensor> = path
            .iter()
            .filter_map(|&(i, m)| {
                let r = self.node(i).routing.as_ref()?;
                Some(if m == self.node(i).tokens.len() {
                    r.shallow_clone()
                } else {
                    rows(r, 0, m)
                })
            })
            .collect();
        let routing = (routing_parts.len() == path.len()).then(|| Tensor::cat(&routing_parts, 0));
        Some(Hit { len: p, kv, routing })
    }

    /// Length of the longest cached prefix of `ids` (at most `max_len`), whether or not a
    /// lookup can resume there: a hybrid model's prefill stops there to leave a snapshot.
    pub fn matched(&self, ids: &[u32], max_len: usize) -> usize {
        let ids = &ids[..max_len.min(ids.len())];
        let (mut at, mut p) = (0, 0);
        while let Some(&child) = ids.get(p).and_then(|t| self.node(at).children.get(t)) {
            let m = common(&self.node(child).tokens, &ids[p..]);
            p += m;
            if m < self.node(child).tokens.len() {
                break;
            }
            at = child;
        }
        p
    }

    /// Stores the KV (`kv.len() == ids.len()` positions) and routing (`[ids.len(), L, k]` rows,
    /// None for dense models) of the sequence `ids`; only the positions not cached yet are
    /// copied. A hybrid model's recurrent states (after all of `ids`) are kept as a snapshot at
    /// the end of the sequence's edge. Then evicts least recently used leaves until the budget
    /// holds.
    pub fn insert(&mut self, ids: &[u32], kv: &KvCache, routing: Option<&Tensor>) -> Result<(), InsertError> {
        debug_assert_eq!(kv.len() as usize, ids.len());
        self.recurrent |= kv.has_recurrent_state();
        let now = self.tick();
        let (mut at, mut p) = (0, 0);
        while p < ids.len() {
            let Some(&child) = self.node(at).children.get(&ids[p]) else {
                break;
            };
            let m = common(&self.node(child).tokens, &ids[p..]);
            if m < self.node(child).tokens.len() {
                self.split(child, m)?;
            }
            self.node_mut(child).last_used = now;
            // After a split, `child` holds the shared part and `at` moves onto it.
            at = child;
            p += m;
        }
        if p < ids.len() {
            let len = ids.len() - p;
            let part = kv.slice(p as i64, len as i64).ok_or(InsertError::Unsliceable)?;
            let parts = (part, routing.map(|r| rows(r, p, len)), kv.snapshot());
            let node = Node::new(ids[p..].to_vec(), parts, at, now);
            if node.bytes > self.budget {
                return Ok(());
            }
            self.bytes += node.bytes;
            let first = ids[p];
            let i = self.alloc(node);
            self.node_mut(at).children.insert(first, i);
        } else if at != 0 && self.node(at).snapshot.is_none() {
            // The sequence ends where a cached edge ends (e.g. where a split left a head
            // without a state): resuming here saves the next request recomputing up to it.
            if let Some(s) = kv.snapshot() {
                self.bytes += s.bytes();
                let node = self.node_mut(at);
                node.bytes += s.bytes();
                node.snapshot = Some(s);
            }
        }
        self.evict();
        Ok(())
    }

    /// Splits node `i` after its first `m` tokens: `i` keeps them (same parent, same key), a
    /// new child of `i` takes the rest and `i`'s former children.
    fn split(&mut self, i: usize, m: usize) -> Result<(), InsertError> {
        let node = self.node(i);
        let n = node.tokens.len();
        let kv = node.kv.as_ref().expect("invariant: non-root nodes hold KV");
        let (head_kv, tail_kv) = (
            kv.slice(0, m as i64).ok_or(InsertError::Unsliceable)?,
            kv.slice(m as i64, (n - m) as i64)
                .ok_or(InsertError::Unsliceable)?,
        );
        let (head_r, tail_r) = match &node.routing {
            Some(r) => (Some(rows(r, 0, m)), Some(rows(r, m, n - m))),
            None => (None, None),
        };
        let last_used = node.last_used;
        let old = self.nodes[i].take().expect("invariant: a linked node is live");
        // The tail ends where the old edge did: the snapshot stays with it.
        let mut tail = Node::new(
            old.tokens[m..].to_vec(),
            (tail_kv, tail_r, old.snapshot),
            i,
            last_used,
        );
        tail.children = old.children;
        let tail_first = tail.tokens[0];
        let grandchildren: Vec<usize> = tail.children.values().copied().collect();
        let mut head = Node::new(
            old.tokens[..m].to_vec(),
            (head_kv, head_r, None),
            old.parent,
            last_used,
        );
        self.bytes = self.bytes - old.bytes + head.bytes + tail.bytes;
        let t = self.alloc(tail);
        for g in grandchildren {
            self.node_mut(g).parent = t;
        }
        head.children.insert(tail_first, t);
        self.nodes[i] = Some(head);
        Ok(())
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Removes least recently used leaves until the bytes fit the budget.
    fn evict(&mut self) {
        while self.bytes > self.budget {
            let Some(leaf) = self
                .nodes
                .iter()
                .enumerate()
                .skip(1)
                .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
                .filter(|(_, n)| n.children.is_empty())
                .min_by_key(|(_, n)| n.last_used)
                .map(|(i, _)| i)
            else {
                return;
            };
            let mut parent = self.remove(leaf);
            // For hybrid models, a leaf without a snapshot (a split's head) is no resume point
            // and serves no edge below it any more.
            while self.recurrent && parent != 0 && self.useless(parent) {
                parent = self.remove(parent);
            }
        }
    }

    /// Whether node `i` is a leaf without a snapshot.
    fn useless(&self, i: usize) -> bool {
        let n = self.node(i);
        n.children.is_empty() && n.snapshot.is_none()
    }

    /// Unlinks and frees leaf `i`; returns its parent.
    fn remove(&mut self, i: usize) -> usize {
        let node = self.nodes[i].take().expect("invariant: a linked node is live");
        self.node_mut(node.parent).children.remove(&node.tokens[0]);
        self.bytes -= node.bytes;
        self.free.push(i);
        self.evicted += 1;
        node.parent
    }
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod tests;
