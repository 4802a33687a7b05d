//! Per-sequence inference state: [`KvCache`] holds, for each layer of one sequence, the past keys
//! and values of a full-attention layer or the Gated DeltaNet state of a linear-attention one,
//! so an inference engine decodes incrementally with the training forward's code.
//!
//! For the engine's prefix cache, keys and values can be cut at any position
//! ([`KvCache::slice`], [`KvCache::concat`]); a recurrent state cannot, so it is copied whole at
//! the positions a later request may resume from ([`KvCache::snapshot`] → [`StateSnapshot`],
//! put back with [`KvCache::restore`]).

use tch::Tensor;

/// Past keys and values of every layer, for incremental decoding of one sequence; for the
/// hybrid families, each linear-attention layer holds its Gated DeltaNet state instead.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

/// One layer's share of a [`KvCache`]. A slot starts as an empty `Kv` and becomes `Linear` the
/// first time a linear-attention layer uses it, so `KvCache::new(layers)` serves every family.
#[derive(Debug)]
pub(crate) enum LayerCache {
    /// `(k, v)`, each `[kv_heads, past, head_dim]` after RoPE.
    Kv(Option<(Tensor, Tensor)>),
    /// Gated DeltaNet state after the cached positions.
    Linear(Option<LinearState>),
}

/// The per-sequence state of one Gated DeltaNet layer: the last `kernel − 1` conv inputs
/// (`[conv_dim, kernel − 1]`, model dtype) and the recurrent state (`[v_heads, k_dim, v_dim]`,
/// fp32), plus how many positions it has absorbed.
#[derive(Debug)]
pub struct LinearState {
    pub conv: Tensor,
    pub recurrent: Tensor,
    pub len: i64,
}

/// The states of every linear-attention layer of one sequence after its first [`Self::len`]
/// positions ([`KvCache::snapshot`]): what a prefix cache keeps beside the keys and values of a
/// hybrid model, at the positions a later request may resume from.
#[derive(Debug)]
pub struct StateSnapshot {
    /// `(layer index, state)`.
    layers: Vec<(usize, LinearState)>,
}

impl StateSnapshot {
    /// Positions the states have absorbed.
    pub fn len(&self) -> i64 {
        self.layers.first().map_or(0, |(_, s)| s.len)
    }

    /// True for a snapshot of no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the conv and recurrent states.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(_, s)| tensor_bytes(&s.conv) + tensor_bytes(&s.recurrent))
            .sum()
    }
}

impl KvCache {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> Self {
        KvCache {
            layers: (0..layers).map(|_| LayerCache::Kv(None)).collect(),
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> i64 {
        self.layers
            .iter()
            .find_map(|l| match l {
                LayerCache::Kv(Some((k, _))) => Some(k.size()[1]),
                LayerCache::Linear(Some(s)) => Some(s.len),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn layers_len(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i`'s keys and values (a full-attention layer).
    pub(crate) fn slot(&mut self, i: usize) -> &mut Option<(Tensor, Tensor)> {
        if !matches!(self.layers[i], LayerCache::Kv(_)) {
            self.layers[i] = LayerCache::Kv(None);
        }
        match &mut self.layers[i] {
            LayerCache::Kv(slot) => slot,
            LayerCache::Linear(_) => unreachable!("invariant: slot {i} was just made Kv"),
        }
    }

    /// Layer `i`'s Gated DeltaNet state (a linear-attention layer).
    pub(crate) fn linear_slot(&mut self, i: usize) -> &mut Option<LinearState> {
        if !matches!(self.layers[i], LayerCache::Linear(_)) {
            self.layers[i] = LayerCache::Linear(None);
        }
        match &mut self.layers[i] {
            LayerCache::Linear(slot) => slot,
            LayerCache::Kv(_) => unreachable!("invariant: slot {i} was just made Linear"),
        }
    }

    /// Drops every position from `len` on (e.g. to roll back rejected draft tokens). A recurrent
    /// state cannot be rolled back: when a linear-attention layer holds more than `len`
    /// positions, the whole cache is emptied (`len()` is then 0 and the caller prefills again).
    pub fn truncate(&mut self, len: i64) {
        let linear_past = self
            .layers
            .iter()
            .any(|l| matches!(l, LayerCache::Linear(Some(s)) if s.len > len));
        if linear_past {
            *self = KvCache::new(self.layers.len());
            return;
        }
        for l in &mut self.layers {
            if let LayerCache::Kv(Some((k, v))) = l {
                *k = k.narrow(1, 0, len.min(k.size()[1]));
                *v = v.narrow(1, 0, len.min(v.size()[1]));
            }
        }
    }

    /// A cache holding the given per-layer `(k, v)`, each `[kv_heads, positions, head_dim]`.
    pub fn from_layers(layers: Vec<(Tensor, Tensor)>) -> Self {
        KvCache {
            layers: layers.into_iter().map(|kv| LayerCache::Kv(Some(kv))).collect(),
        }
    }

    /// A copy (own storage, not a view) of positions `start .. start + len` of every
    /// full-attention layer, for a prefix cache. A linear-attention layer's state cannot be cut
    /// at a position: its slot comes back empty, and a prefix cache keeps whole states apart
    /// ([`Self::snapshot`]). None when some attention layer holds nothing yet.
    pub fn slice(&self, start: i64, len: i64) -> Option<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Kv(Some((k, v))) => {
                    let cut = |t: &Tensor| t.narrow(1, start, len).contiguous().copy();
                    Some(LayerCache::Kv(Some((cut(k), cut(v)))))
                }
                LayerCache::Linear(_) => Some(LayerCache::Linear(None)),
                LayerCache::Kv(None) => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(KvCache { layers })
    }

    /// The caches of consecutive position ranges joined into one (`parts` in position order,
    /// all with the same layers; linear-attention slots come back empty, as from
    /// [`Self::slice`]); None when `parts` is empty or one of them cannot be joined.
    pub fn concat(parts: &[&KvCache]) -> Option<KvCache> {
        let first = parts.first()?;
        if parts.len() == 1 {
            return first.slice(0, first.len());
        }
        let layers = (0..first.layers.len())
            .map(|i| {
                if parts
                    .iter()
                    .all(|p| matches!(p.layers.get(i), Some(LayerCache::Linear(_))))
                {
                    return Some(LayerCache::Linear(None));
                }
                let (ks, vs): (Vec<&Tensor>, Vec<&Tensor>) = parts
                    .iter()
                    .map(|p| match p.layers.get(i)? {
                        LayerCache::Kv(Some((k, v))) => Some((k, v)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?
                    .into_iter()
                    .unzip();
                Some(LayerCache::Kv(Some((Tensor::cat(&ks, 1), Tensor::cat(&vs, 1)))))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(KvCache { layers })
    }

    /// True when some layer holds a recurrent (Gated DeltaNet) state.
    pub fn has_recurrent_state(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerCache::Linear(Some(_))))
    }

    /// A copy (own storage) of every linear-attention layer's state, for a prefix cache to
    /// resume from this exact position later; None when no layer holds one.
    pub fn snapshot(&self) -> Option<StateSnapshot> {
        let layers: Vec<(usize, LinearState)> = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                LayerCache::Linear(Some(s)) => Some((
                    i,
                    LinearState {
                        conv: s.conv.copy(),
                        recurrent: s.recurrent.copy(),
                        len: s.len,
                    },
                )),
                _ => None,
            })
            .collect();
        (!layers.is_empty()).then_some(StateSnapshot { layers })
    }

    /// Puts the states of `snapshot` into their linear-attention layers. They share the
    /// snapshot's storage: a forward never writes a state in place, it replaces it.
    pub fn restore(&mut self, snapshot: &StateSnapshot) {
        for (i, s) in &snapshot.layers {
            if let Some(slot) = self.layers.get_mut(*i) {
                *slot = LayerCache::Linear(Some(LinearState {
                    conv: s.conv.shallow_clone(),
                    recurrent: s.recurrent.shallow_clone(),
                    len: s.len,
                }));
            }
        }
    }

    /// Bytes held by the cached keys and values (and recurrent states).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Kv(Some((k, v))) => tensor_bytes(k) + tensor_bytes(v),
                LayerCache::Linear(Some(s)) => tensor_bytes(&s.conv) + tensor_bytes(&s.recurrent),
                _ => 0,
            })
            .sum()
    }
}

/// Bytes of a tensor's elements.
pub fn tensor_bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}
