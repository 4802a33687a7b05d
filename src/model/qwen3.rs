//! `CausalLm`: Qwen3ForCausalLM and Qwen3MoeForCausalLM (transformers' `modeling_qwen3.py` and
//! `modeling_qwen3_moe.py`) over one packed row of tokens.
//!
//! The forward takes token ids, their positions, how they attend ([`AttnMask`]), an optional
//! routing to replay (`[T, moe_layers, k]`, -1 rows route normally) and an optional [`KvCache`];
//! it returns the final-normed hidden states and, for MoE models, the routing it used and the
//! router's own choice. Logits are computed separately ([`CausalLm::logits`]) so the trainer can
//! project only the positions it needs through the 151936-wide head, in chunks (`head.rs`).
//! [`CausalLm::decode_batch`] advances B sequences, each with its own cache, by one token in one
//! forward: everything but attention on `[B, hidden]` rows (the inference engine's decode step).

use tch::{nn, Kind, Tensor};

use super::layers::{Attention, AttnMask, KvCache, Mlp, RmsNorm, Rope, INIT_STD};
use super::moe::{MoeRouting, SparseMoe};
use super::Config;

/// Dense MLP or routed experts.
#[derive(Debug)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(SparseMoe),
}

/// One pre-norm decoder layer (`model.layers.N`).
#[derive(Debug)]
pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

impl DecoderLayer {
    /// Creates layer `i` under `<p>`.
    pub fn new(p: &nn::Path, cfg: &Config, i: i64) -> Self {
        let mlp = if cfg.is_moe_layer(i) {
            FeedForward::Moe(SparseMoe::new(&(p / "mlp"), cfg))
        } else {
            FeedForward::Dense(Mlp::new(&(p / "mlp"), cfg.hidden_size, cfg.intermediate_size))
        };
        DecoderLayer {
            input_layernorm: RmsNorm::new(&(p / "input_layernorm"), cfg.hidden_size, cfg.rms_norm_eps),
            self_attn: Attention::new(&(p / "self_attn"), cfg),
            post_attention_layernorm: RmsNorm::new(
                &(p / "post_attention_layernorm"),
                cfg.hidden_size,
                cfg.rms_norm_eps,
            ),
            mlp,
        }
    }

    /// `x + attn(norm(x))`, then `+ mlp(norm(·))`; the routing when the layer is MoE (`replay`:
    /// this layer's `[T, k]` recorded expert ids).
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        slot: Option<&mut Option<(Tensor, Tensor)>>,
        replay: Option<&Tensor>,
    ) -> (Tensor, Option<MoeRouting>) {
        self.forward_with(x, |attn, h| attn.forward(h, cos, sin, mask, slot), replay)
    }

    /// [`Self::forward`] with the attention given as `attend(self_attn, norm(x))`.
    fn forward_with(
        &self,
        x: &Tensor,
        attend: impl FnOnce(&Attention, &Tensor) -> Tensor,
        replay: Option<&Tensor>,
    ) -> (Tensor, Option<MoeRouting>) {
        let h = attend(&self.self_attn, &self.input_layernorm.forward(x));
        // Out of place: autograd saved `x` for the norm's backward (`+=` would be in place).
        let x = x + h;
        let hn = self.post_attention_layernorm.forward(&x);
        let (h, routing) = match &self.mlp {
            FeedForward::Dense(mlp) => (mlp.forward(&hn), None),
            FeedForward::Moe(moe) => {
                let (out, routing) = moe.forward(&hn, replay);
                (out, Some(routing))
            }
        };
        (&x + h, routing)
    }
}

/// What a forward returns.
#[derive(Debug)]
pub struct ForwardOutput {
    /// `[T, hidden]` after the final norm.
    pub hidden: Tensor,
    /// MoE only: `[T, moe_layers, k]` expert ids used.
    pub routing: Option<Tensor>,
    /// MoE only: `[T, moe_layers, k]` the router's own top-k (equals `routing` without replay).
    pub router_topk: Option<Tensor>,
}

/// Inputs of one forward over a packed row.
pub struct ForwardInput<'a> {
    /// `[T]` int64 token ids.
    pub tokens: &'a Tensor,
    /// `[T]` int64 RoPE positions.
    pub positions: &'a Tensor,
    pub mask: AttnMask<'a>,
    /// `[T, moe_layers, k]` int64 expert ids to replay; rows of -1 route normally.
    pub replay: Option<&'a Tensor>,
}

impl<'a> ForwardInput<'a> {
    /// One causal sequence starting at position 0, no replay.
    pub fn causal(tokens: &'a Tensor, positions: &'a Tensor) -> Self {
        ForwardInput {
            tokens,
            positions,
            mask: AttnMask::Causal,
            replay: None,
        }
    }
}

/// A Qwen3 (dense or MoE) causal language model.
#[derive(Debug)]
pub struct CausalLm {
    pub cfg: Config,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Option<Tensor>,
    rope: Rope,
}

impl CausalLm {
    /// Creates every var under `p` (the VarStore root), randomly initialised like transformers.
    pub fn new(p: &nn::Path, cfg: &Config) -> Self {
        let m = p / "model";
        let embed_tokens =
            (&m / "embed_tokens").randn("weight", &[cfg.vocab_size, cfg.hidden_size], 0.0, INIT_STD);
        let lp = &m / "layers";
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(&(&lp / i), cfg, i))
            .collect();
        let lm_head = (!cfg.tie_word_embeddings)
            .then(|| super::layers::weight(&(p / "lm_head"), cfg.vocab_size, cfg.hidden_size));
        CausalLm {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm: RmsNorm::new(&(&m / "norm"), cfg.hidden_size, cfg.rms_norm_eps),
            lm_head,
            rope: Rope::new(cfg, p.device()),
        }
    }

    /// Number of MoE layers (the middle dimension of routing arrays).
    pub fn moe_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.mlp, FeedForward::Moe(_)))
            .count()
    }

    /// Runs the decoder; `cache` must only be used with [`AttnMask::Causal`].
    pub fn forward(&self, input: &ForwardInput, mut cache: Option<&mut KvCache>) -> ForwardOutput {
        if let Some(c) = cache.as_deref_mut() {
            self.fit_cache(c);
        }
        self.run(
            input.tokens,
            input.positions,
            input.replay,
            |i, attn, h, cos, sin| {
                let slot = cache.as_deref_mut().map(|c| c.slot(i));
                attn.forward(h, cos, sin, &input.mask, slot)
            },
        )
    }

    /// One decode step of B sequences in one forward: row b of `tokens` and `positions` (`[B]`
    /// int64) is the next token of the sequence whose cache is `caches[b]`, at its position.
    /// Embeddings, projections, norms, MLP / experts (the grouped MoE dispatch for B > 1) run on
    /// `[B, hidden]`; attention runs per sequence over its own cache (`Attention::decode`).
    /// Returns hidden `[B, hidden]` and, for MoE models, routing `[B, moe_layers, k]`: row b is
    /// what a one-token [`Self::forward`] of sequence b alone gives, up to float summation order.
    pub fn decode_batch(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> ForwardOutput {
        for c in caches.iter_mut() {
            self.fit_cache(c);
        }
        self.run(tokens, positions, None, |i, attn, h, cos, sin| {
            let slots = caches.iter_mut().map(|c| c.slot(i)).collect();
            attn.decode(h, cos, sin, slots)
        })
    }

    /// A cache made for another layer count starts over (empty) for this model.
    fn fit_cache(&self, cache: &mut KvCache) {
        if cache.layers_len() != self.layers.len() {
            *cache = KvCache::new(self.layers.len());
        }
    }

    /// Embeddings → layers → final norm, with each layer's attention done by
    /// `attend(layer index, self_attn, normed input, cos, sin)`.
    fn run(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        replay: Option<&Tensor>,
        mut attend: impl FnMut(usize, &Attention, &Tensor, &Tensor, &Tensor) -> Tensor,
    ) -> ForwardOutput {
        let mut x = Tensor::embedding(&self.embed_tokens, tokens, -1, false, false);
        let (cos, sin) = self.rope.tables(positions, x.kind());
        let mut used = Vec::new();
        let mut own = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let replay = replay.map(|r| r.select(1, used.len() as i64));
            let (y, routing) = layer.forward_with(&x, |a, h| attend(i, a, h, &cos, &sin), replay.as_ref());
            x = y;
            if let Some(r) = routing {
                used.push(r.used);
                own.push(r.own);
            }
        }
        let hidden = self.norm.forward(&x);
        let stack = |v: Vec<Tensor>| (!v.is_empty()).then(|| Tensor::stack(&v, 1));
        ForwardOutput {
            hidden,
            routing: stack(used),
            router_topk: stack(own),
        }
    }

    /// Backward through the decoder with per-layer activation checkpointing, starting from
    /// `head`, which receives the final-normed hidden states and must itself backpropagate
    /// from them (e.g. [`CausalLm::backward_logprobs`]); its result is returned. The forward
    /// pass runs without a graph and keeps only each layer's input; the backward pass recomputes
    /// one layer at a time from its input and back-propagates the incoming gradient through it,
    /// so at most one layer's activations are alive. Parameter gradients accumulate exactly as
    /// with `forward(..).hidden` + the same head (same arithmetic, recomputed; MoE layers
    /// recompute with the same replayed routing, so the expert choice cannot differ).
    pub fn backward_checkpointed<R>(&self, input: &ForwardInput, head: impl FnOnce(&Tensor) -> R) -> R {
        let (cos, sin, inputs, last) = {
            let _g = tch::no_grad_guard();
            let mut x = Tensor::embedding(&self.embed_tokens, input.tokens, -1, false, false);
            let (cos, sin) = self.rope.tables(input.positions, x.kind());
            let mut inputs = Vec::with_capacity(self.layers.len());
            let mut moe = 0;
            for layer in &self.layers {
                let replay = self.replay_slice(layer, input, &mut moe);
                let (y, _) = layer.forward(&x, &cos, &sin, &input.mask, None, replay.as_ref());
                inputs.push(x);
                x = y;
            }
            (cos, sin, inputs, x)
        };
        let leaf = last.detach().set_requires_grad(true);
        let value = head(&self.norm.forward(&leaf));
        let mut grad = leaf.grad();
        let mut moe = self.moe_layers();
        for (layer, x) in self.layers.iter().zip(inputs).rev() {
            let replay = match layer.mlp {
                FeedForward::Moe(_) => {
                    moe -= 1;
                    input.replay.map(|r| r.select(1, moe as i64))
                }
                FeedForward::Dense(_) => None,
            };
            let x = x.set_requires_grad(true);
            let (y, _) = layer.forward(&x, &cos, &sin, &input.mask, None, replay.as_ref());
            (y * &grad).sum(Kind::Float).backward();
            grad = x.grad();
        }
        let emb = Tensor::embedding(&self.embed_tokens, input.tokens, -1, false, false);
        (emb * grad).sum(Kind::Float).backward();
        value
    }

    fn replay_slice(&self, layer: &DecoderLayer, input: &ForwardInput, moe: &mut usize) -> Option<Tensor> {
        match layer.mlp {
            FeedForward::Moe(_) => {
                let r = input.replay.map(|r| r.select(1, *moe as i64));
                *moe += 1;
                r
            }
            FeedForward::Dense(_) => None,
        }
    }

    /// The `[vocab, hidden]` output projection (the embedding when tied).
    pub(super) fn head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
