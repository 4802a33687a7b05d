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
//! Models whose per-sequence state cannot be cut at a position (the recurrent layers of hybrid
//! models) return None from [`KvCache::slice`]; `insert` then stores nothing and says so, and the
//! worker turns the cache off with a log line.

use std::collections::HashMap;

use tch::Tensor;

use crate::model::{tensor_bytes, KvCache};

/// The default budget of `--prefix-cache-bytes` (4 GiB).
pub const DEFAULT_BYTES: usize = 4 << 30;

/// Parses a byte count: a plain number of bytes, or a number with a suffix, decimal (`K`, `M`,
/// `G`, `T`, optionally with `B`) or binary (`KiB`, `MiB`, `GiB`, `TiB`): `4GiB`, `512MiB`, `2G`.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (use B, K, M, G, KiB, MiB, GiB)"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a byte count like 4GiB, 512MiB or 0"))?;
    Ok((n * scale).round() as usize)
}

/// What a lookup found: the KV and routing of the first `len` positions of the request.
pub struct Hit {
    pub len: usize,
    pub kv: KvCache,
    /// `[len, moe_layers, k]` on the CPU (None for dense models).
    pub routing: Option<Tensor>,
}

/// Why an insert stored nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The model's per-sequence state cannot be cut at a position.
    Unsliceable,
}

/// One edge of the tree: tokens after its parent's, with their KV and routing.
struct Node {
    tokens: Vec<u32>,
    /// `[kv_heads, tokens.len(), head_dim]` per layer (None for the root).
    kv: Option<KvCache>,
    routing: Option<Tensor>,
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
            children: HashMap::new(),
            parent: 0,
            last_used: 0,
            bytes: 0,
        }
    }

    fn new(tokens: Vec<u32>, kv: KvCache, routing: Option<Tensor>, parent: usize, now: u64) -> Self {
        let bytes = kv.bytes() + routing.as_ref().map_or(0, tensor_bytes);
        Node {
            tokens,
            kv: Some(kv),
            routing,
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
        }
    }

    /// Bytes of KV and routing held now.
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
    /// (None when nothing matches). Every node on the path counts as used now.
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
        let kv = KvCache::concat(&parts)?;
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

    /// Stores the KV (`kv.len() == ids.len()` positions) and routing (`[ids.len(), L, k]` rows,
    /// None for dense models) of the sequence `ids`; only the positions not cached yet are
    /// copied. Then evicts least recently used leaves until the budget holds.
    pub fn insert(&mut self, ids: &[u32], kv: &KvCache, routing: Option<&Tensor>) -> Result<(), InsertError> {
        debug_assert_eq!(kv.len() as usize, ids.len());
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
            let node = Node::new(ids[p..].to_vec(), part, routing.map(|r| rows(r, p, len)), at, now);
            if node.bytes > self.budget {
                return Ok(());
            }
            self.bytes += node.bytes;
            let first = ids[p];
            let i = self.alloc(node);
            self.node_mut(at).children.insert(first, i);
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
        let mut tail = Node::new(old.tokens[m..].to_vec(), tail_kv, tail_r, i, last_used);
        tail.children = old.children;
        let tail_first = tail.tokens[0];
        let grandchildren: Vec<usize> = tail.children.values().copied().collect();
        let mut head = Node::new(old.tokens[..m].to_vec(), head_kv, head_r, old.parent, last_used);
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
            let node = self.nodes[leaf].take().expect("invariant: a linked node is live");
            self.node_mut(node.parent).children.remove(&node.tokens[0]);
            self.bytes -= node.bytes;
            self.free.push(leaf);
            self.evicted += 1;
        }
    }
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    const LAYERS: usize = 2;

    /// A cache whose key at (layer, position) is `position + 100·layer + 1000·id` and whose
    /// routing row of a position is the token id: what a lookup returns is checked by value.
    fn kv(ids: &[u32], tag: f64) -> (KvCache, Tensor) {
        let n = ids.len() as i64;
        let layers = (0..LAYERS)
            .map(|l| {
                let k = (Tensor::arange(n, (Kind::Float, Device::Cpu)) + (100 * l) as f64 + tag)
                    .view([1, n, 1])
                    .repeat([2, 1, 3]);
                (k.shallow_clone(), -k)
            })
            .collect();
        let routing = Tensor::from_slice(&ids.iter().map(|&t| i64::from(t)).collect::<Vec<_>>())
            .view([n, 1, 1])
            .repeat([1, 2, 2]);
        (KvCache::from_layers(layers), routing)
    }

    fn insert(c: &mut PrefixCache, ids: &[u32], tag: f64) {
        let (kv, r) = kv(ids, tag);
        c.insert(ids, &kv, Some(&r)).unwrap();
    }

    /// The keys of layer 1 at every position of a hit, and its routing's first column.
    fn values(hit: &Hit) -> (Vec<f32>, Vec<i64>) {
        assert_eq!(hit.kv.len() as usize, hit.len);
        let mut kv = hit.kv.slice(0, hit.kv.len()).unwrap();
        let (k, _) = kv.slot(1).as_ref().unwrap();
        let keys = Vec::<f32>::try_from(k.select(0, 0).select(1, 0)).unwrap();
        let routing = Vec::<i64>::try_from(hit.routing.as_ref().unwrap().select(1, 0).select(1, 0)).unwrap();
        (keys, routing)
    }

    #[test]
    fn byte_counts_parse_with_and_without_units() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("123"), Ok(123));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("4 parsecs").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn the_longest_prefix_is_found_across_edges_and_inside_one() {
        let mut c = PrefixCache::new(1 << 20);
        let a: Vec<u32> = (0..10).collect();
        insert(&mut c, &a, 0.0);
        // Continues `a`: only positions 10.. are new (a child of `a`'s node).
        let b: Vec<u32> = (0..16).collect();
        insert(&mut c, &b, 1000.0);
        assert_eq!(c.tokens(), 16);
        let hit = c.lookup(&(0..20).collect::<Vec<_>>(), 100).unwrap();
        assert_eq!(hit.len, 16);
        let (keys, routing) = values(&hit);
        // Positions 0..10 were stored by the first insert, 10..16 by the second.
        let want: Vec<f32> = (0..16)
            .map(|p| p as f32 + 100.0 + if p < 10 { 0.0 } else { 1000.0 })
            .collect();
        assert_eq!(keys, want);
        assert_eq!(routing, (0..16).collect::<Vec<i64>>());
        // Diverging inside the first edge, and capped by max_len.
        let hit = c.lookup(&[0, 1, 2, 3, 99], 100).unwrap();
        assert_eq!(hit.len, 4);
        assert_eq!(values(&hit).0, vec![100.0, 101.0, 102.0, 103.0]);
        assert_eq!(c.lookup(&b, 7).unwrap().len, 7);
        assert!(c.lookup(&[5, 6], 100).is_none());
    }

    #[test]
    fn a_diverging_insert_splits_the_edge_and_stores_the_shared_part_once() {
        let mut c = PrefixCache::new(1 << 20);
        let a: Vec<u32> = (0..12).collect();
        insert(&mut c, &a, 0.0);
        let bytes_a = c.bytes();
        let mut b = a[..5].to_vec();
        b.extend([50, 51, 52]);
        insert(&mut c, &b, 2000.0);
        // 12 + 3 positions, each stored once.
        assert_eq!(c.tokens(), 15);
        assert_eq!(c.bytes(), bytes_a / 12 * 15);
        let hit = c.lookup(&b, 100).unwrap();
        assert_eq!(hit.len, 8);
        let (keys, routing) = values(&hit);
        assert_eq!(keys[..5], [100.0, 101.0, 102.0, 103.0, 104.0]);
        assert_eq!(keys[5..], [2105.0, 2106.0, 2107.0]);
        assert_eq!(routing, vec![0, 1, 2, 3, 4, 50, 51, 52]);
        // The old continuation survived the split.
        let hit = c.lookup(&a, 100).unwrap();
        assert_eq!(hit.len, 12);
        assert_eq!(
            values(&hit).0,
            (0..12).map(|p| p as f32 + 100.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn least_recently_used_leaves_go_first_and_the_budget_holds() {
        let per_token = {
            let (kv, r) = kv(&[0], 0.0);
            kv.bytes() + tensor_bytes(&r)
        };
        // Room for 20 positions.
        let mut c = PrefixCache::new(per_token * 20);
        let shared: Vec<u32> = (0..6).collect();
        let branch = |x: u32| {
            let mut v = shared.clone();
            v.extend([x, x + 1, x + 2, x + 3]);
            v
        };
        insert(&mut c, &branch(100), 0.0);
        insert(&mut c, &branch(200), 0.0);
        insert(&mut c, &branch(300), 0.0);
        // 6 + 3 × 4 = 18 positions.
        assert_eq!(c.tokens(), 18);
        assert!(c.lookup(&branch(100), 100).is_some());
        // 4 more positions: 22 > 20, so the least recently used leaf (200's) goes.
        insert(&mut c, &branch(400), 0.0);
        assert!(c.bytes() <= c.budget());
        assert_eq!(c.evicted(), 1);
        assert_eq!(c.lookup(&branch(200), 100).unwrap().len, 6);
        for x in [100, 300, 400] {
            assert_eq!(c.lookup(&branch(x), 100).unwrap().len, 10, "branch {x}");
        }
        // An entry larger than the whole budget is not stored (and evicts nothing).
        let long: Vec<u32> = (1000..1030).collect();
        insert(&mut c, &long, 0.0);
        assert!(c.lookup(&long, 100).is_none());
        assert_eq!(c.evicted(), 1);
        c.clear();
        assert_eq!((c.bytes(), c.tokens()), (0, 0));
        assert!(c.lookup(&branch(100), 100).is_none());
    }
}
