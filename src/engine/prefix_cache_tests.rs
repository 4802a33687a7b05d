//! Unit tests of the prefix cache's tree: lookups, splits, LRU eviction under the budget, and
//! (for hybrid models) recurrent-state snapshots.

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

/// A hybrid sequence's cache: layer 0 linear attention, layer 1 full attention with [`kv`]'s
/// keys; the recurrent state after the sequence is filled with `1000·state_tag + len`, so a
/// hit's state says which insert left it and after how many positions.
fn hybrid(ids: &[u32], tag: f64, state_tag: f64) -> (KvCache, Tensor) {
    let (mut kv, r) = kv(ids, tag);
    let n = ids.len() as i64;
    *kv.linear_slot(0) = Some(crate::model::LinearState {
        conv: Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)),
        recurrent: Tensor::full(
            [2, 2, 2],
            1000.0 * state_tag + n as f64,
            (Kind::Float, Device::Cpu),
        ),
        len: n,
    });
    (kv, r)
}

fn insert_hybrid(c: &mut PrefixCache, ids: &[u32], state_tag: f64) {
    let (kv, r) = hybrid(ids, 0.0, state_tag);
    c.insert(ids, &kv, Some(&r)).unwrap();
}

/// The recurrent state a hit resumes from (its one value).
fn state(hit: &mut Hit) -> f64 {
    let s = hit
        .kv
        .linear_slot(0)
        .as_ref()
        .expect("a hybrid hit carries its states");
    assert_eq!(s.len as usize, hit.len);
    s.recurrent.mean(Kind::Float).double_value(&[])
}

#[test]
fn a_hybrid_hit_resumes_from_the_last_snapshot_before_the_divergence() {
    let mut c = PrefixCache::new(1 << 20);
    let a: Vec<u32> = (0..10).collect();
    insert_hybrid(&mut c, &a, 1.0);
    let mut hit = c.lookup(&(0..20).collect::<Vec<_>>(), 100).unwrap();
    assert_eq!(hit.len, 10);
    assert_eq!(state(&mut hit), 1010.0);
    assert_eq!(values(&hit).1, (0..10).collect::<Vec<i64>>());
    // Parting inside `a`'s edge: the keys up to the divergence are there, a state is not (the
    // one after `a` has absorbed tokens the request does not have).
    let parting: Vec<u32> = [0, 1, 2, 3, 4, 99, 98].to_vec();
    assert!(c.lookup(&parting, 100).is_none());
    assert_eq!(c.matched(&parting, 100), 5);
    assert_eq!(c.matched(&parting, 3), 3);
    // The prefill stops at the divergence and inserts there: the split's head gets the state.
    insert_hybrid(&mut c, &parting[..5], 2.0);
    let mut hit = c.lookup(&parting, 100).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (5, 2005.0));
    assert_eq!(values(&hit).0, vec![100.0, 101.0, 102.0, 103.0, 104.0]);
    // `a` still resumes after its own end; a request parting later than 5 but inside `a`
    // resumes at 5.
    let mut hit = c.lookup(&a, 100).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (10, 1010.0));
    let mut hit = c.lookup(&[0, 1, 2, 3, 4, 5, 6, 77], 100).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (5, 2005.0));
    // A lookup capped inside an edge falls back to the snapshot before the cap.
    let mut hit = c.lookup(&a, 9).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (5, 2005.0));
    assert_eq!(c.snapshots(), 2);
}

#[test]
fn snapshots_count_in_the_budget_and_a_split_head_goes_with_its_last_child() {
    let (probe, r) = hybrid(&[0], 0.0, 0.0);
    let snap = probe.snapshot().unwrap().bytes();
    let per_token = probe.bytes() - snap + tensor_bytes(&r);
    assert!(snap > 0 && per_token > 0);
    let mut c = PrefixCache::new(1 << 20);
    let a: Vec<u32> = (0..10).collect();
    let mut d: Vec<u32> = a[..4].to_vec();
    d.extend([70, 71, 72, 73]);
    insert_hybrid(&mut c, &a, 1.0);
    // Inserted without stopping at the divergence: the head 0..4 keeps no state.
    insert_hybrid(&mut c, &d, 3.0);
    assert_eq!((c.tokens(), c.snapshots()), (14, 2));
    assert_eq!(c.bytes(), 14 * per_token + 2 * snap);
    assert!(c.lookup(&d[..6], 100).is_none(), "no state at 4");
    let mut hit = c.lookup(&d, 100).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (8, 3008.0));

    // Room for 12 positions and one snapshot: `d` evicts `a`'s tail, then an unrelated entry
    // evicts `d`'s; the head 0..4 would fit beside it, but with no state and no child left it is
    // no resume point, and goes too.
    let e: Vec<u32> = (500..506).collect();
    let mut small = PrefixCache::new(12 * per_token + snap);
    insert_hybrid(&mut small, &a, 1.0);
    insert_hybrid(&mut small, &d, 3.0);
    insert_hybrid(&mut small, &e, 4.0);
    assert!(small.bytes() <= small.budget());
    assert_eq!((small.tokens(), small.snapshots()), (6, 1));
    assert_eq!(small.bytes(), 6 * per_token + snap);
    assert_eq!(small.evicted(), 3);
    assert!(small.lookup(&a, 100).is_none());
    let mut hit = small.lookup(&e, 100).unwrap();
    assert_eq!((hit.len, state(&mut hit)), (6, 4006.0));
}
