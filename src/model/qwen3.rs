//! `CausalLm`: Qwen3ForCausalLM and Qwen3MoeForCausalLM (transformers' `modeling_qwen3.py` and
//! `modeling_qwen3_moe.py`), and the hybrid Qwen3NextForCausalLM and the text model of
//! Qwen3_5MoeForConditionalGeneration (`modeling_qwen3_next.py`, `modeling_qwen3_5_moe.py`),
//! over one packed row of tokens. Each layer's token mixer is a [`Mixer`] arm: full attention
//! (`self_attn`) or Gated DeltaNet (`linear_attn`); the rest of the layer is shared.
//!
//! The forward takes token ids, their positions, how they attend ([`AttnMask`]), an optional
//! routing to replay (`[T, moe_layers, k]`, -1 rows route normally) and an optional [`KvCache`];
//! it returns the final-normed hidden states and, for MoE models, the routing it used and the
//! router's own choice. Logits are computed separately ([`CausalLm::logits`]) so the trainer can
//! project only the positions it needs through the 151936-wide head, in chunks (`head.rs`).
//! [`CausalLm::decode_batch`] advances B sequences, each with its own cache, by one token in one
//! forward: everything but attention on `[B, hidden]` rows (the inference engine's decode step).

use tch::{nn, Kind, Tensor};

use super::cache::KvCache;
use super::config::LayerType;
use super::gated_deltanet::GatedDeltaNet;
use super::layers::{Attention, AttnMask, Mlp, RmsNorm, Rope, INIT_STD};
use super::moe::{MoeRouting, SparseMoe};
use super::Config;

/// The token mixer of one layer.
#[derive(Debug)]
pub enum Mixer {
    /// `self_attn`: softmax attention (gated output in the hybrid families).
    FullAttention(Attention),
    /// `linear_attn`: Gated DeltaNet.
    GatedDeltaNet(GatedDeltaNet),
}

/// What every layer's token mixer of one forward shares: RoPE tables, the mask, and the
/// sequences of the packed row as `(start, len)` (the linear-attention layers run each alone).
pub(crate) struct MixCtx<'a> {
    cos: Tensor,
    sin: Tensor,
    mask: &'a AttnMask<'a>,
    segments: Vec<(i64, i64)>,
}

impl Mixer {
    /// The mixer over a whole row (training, prefill); `cache` is the sequence's cache and `i`
    /// this layer's index in it.
    fn forward(&self, h: &Tensor, ctx: &MixCtx, cache: Option<(&mut KvCache, usize)>) -> Tensor {
        match self {
            Mixer::FullAttention(a) => {
                a.forward(h, &ctx.cos, &ctx.sin, ctx.mask, cache.map(|(c, i)| c.slot(i)))
            }
            Mixer::GatedDeltaNet(g) => g.forward(h, &ctx.segments, cache.map(|(c, i)| c.linear_slot(i))),
        }
    }
}

/// The sequences of a row as `(start, len)`: the whole row for a causal one.
fn segments(mask: &AttnMask, t: i64) -> Vec<(i64, i64)> {
    match mask {
        AttnMask::Causal => vec![(0, t)],
        AttnMask::Packed(segments) => segments.to_vec(),
    }
}

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
    mixer: Mixer,
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
        let mixer = match cfg.layer_types.get(i as usize) {
            Some(LayerType::LinearAttention) => {
                Mixer::GatedDeltaNet(GatedDeltaNet::new(&(p / "linear_attn"), cfg))
            }
            _ => Mixer::FullAttention(Attention::new(&(p / "self_attn"), cfg)),
        };
        let norm = |name: &str| {
            RmsNorm::with_offset(&(p / name), cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        };
        DecoderLayer {
            input_layernorm: norm("input_layernorm"),
            mixer,
            post_attention_layernorm: norm("post_attention_layernorm"),
            mlp,
        }
    }

    /// `x + mixer(norm(x))`, then `+ mlp(norm(·))`; the routing when the layer is MoE (`replay`:
    /// this layer's `[T, k]` recorded expert ids).
    fn forward(
        &self,
        x: &Tensor,
        ctx: &MixCtx,
        cache: Option<(&mut KvCache, usize)>,
        replay: Option<&Tensor>,
    ) -> (Tensor, Option<MoeRouting>) {
        self.forward_with(x, |mixer, h| mixer.forward(h, ctx, cache), replay)
    }

    /// [`Self::forward`] with the token mixing given as `mix(mixer, norm(x))`.
    fn forward_with(
        &self,
        x: &Tensor,
        mix: impl FnOnce(&Mixer, &Tensor) -> Tensor,
        replay: Option<&Tensor>,
    ) -> (Tensor, Option<MoeRouting>) {
        let h = mix(&self.mixer, &self.input_layernorm.forward(x));
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
        let m = cfg.text_prefix.split('.').fold(p.clone(), |p, part| p / part);
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
            norm: RmsNorm::with_offset(&(&m / "norm"), cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset),
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
        let ctx = self.ctx(input.tokens, input.positions, &input.mask);
        self.run(input.tokens, input.replay, |i, mixer, h| {
            mixer.forward(h, &ctx, cache.as_deref_mut().map(|c| (c, i)))
        })
    }

    /// RoPE tables and sequences of one forward.
    fn ctx<'a>(&self, tokens: &Tensor, positions: &Tensor, mask: &'a AttnMask<'a>) -> MixCtx<'a> {
        let kind = self.embed_tokens.kind();
        let (cos, sin) = self.rope.tables(positions, kind);
        let t = tokens.size()[0];
        MixCtx {
            cos,
            sin,
            mask,
            segments: segments(mask, t),
        }
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
        let mask = AttnMask::Causal;
        let ctx = self.ctx(tokens, positions, &mask);
        self.run(tokens, None, |i, mixer, h| match mixer {
            Mixer::FullAttention(a) => a.decode(
                h,
                &ctx.cos,
                &ctx.sin,
                caches.iter_mut().map(|c| c.slot(i)).collect(),
            ),
            Mixer::GatedDeltaNet(g) => g.decode(h, caches.iter_mut().map(|c| c.linear_slot(i)).collect()),
        })
    }

    /// A cache made for another layer count starts over (empty) for this model.
    fn fit_cache(&self, cache: &mut KvCache) {
        if cache.layers_len() != self.layers.len() {
            *cache = KvCache::new(self.layers.len());
        }
    }

    /// Embeddings → layers → final norm, with each layer's token mixing done by
    /// `mix(layer index, mixer, normed input)`.
    fn run(
        &self,
        tokens: &Tensor,
        replay: Option<&Tensor>,
        mut mix: impl FnMut(usize, &Mixer, &Tensor) -> Tensor,
    ) -> ForwardOutput {
        let mut x = Tensor::embedding(&self.embed_tokens, tokens, -1, false, false);
        let mut used = Vec::new();
        let mut own = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let replay = replay.map(|r| r.select(1, used.len() as i64));
            let (y, routing) = layer.forward_with(&x, |m, h| mix(i, m, h), replay.as_ref());
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
    pub fn backward_checkpointed<R>(
        &self,
        input: &ForwardInput,
        head: impl FnOnce(&Tensor) -> Result<R, tch::TchError>,
    ) -> Result<R, tch::TchError> {
        let ctx = self.ctx(input.tokens, input.positions, &input.mask);
        let (inputs, last) = {
            let _g = tch::no_grad_guard();
            let mut x = Tensor::embedding(&self.embed_tokens, input.tokens, -1, false, false);
            let mut inputs = Vec::with_capacity(self.layers.len());
            let mut moe = 0;
            for layer in &self.layers {
                let replay = self.replay_slice(layer, input, &mut moe);
                let (y, _) = layer.forward(&x, &ctx, None, replay.as_ref());
                inputs.push(x);
                x = y;
            }
            (inputs, x)
        };
        let leaf = last.detach().set_requires_grad(true);
        let value = head(&self.norm.forward(&leaf))?;
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
            let (y, _) = layer.forward(&x, &ctx, None, replay.as_ref());
            (y * &grad).sum(Kind::Float).f_backward()?;
            grad = x.grad();
        }
        let emb = Tensor::embedding(&self.embed_tokens, input.tokens, -1, false, false);
        (emb * grad).sum(Kind::Float).f_backward()?;
        Ok(value)
    }

    /// Makes every MoE layer exchange tokens with the other ranks of `comm`'s group
    /// (expert parallelism; the model must have been built with its [`Config::expert_shard`]).
    pub fn attach_expert_comm(&mut self, comm: std::sync::Arc<super::ExpertComm>) {
        for l in &mut self.layers {
            if let FeedForward::Moe(m) = &mut l.mlp {
                m.attach(comm.clone());
            }
        }
    }

    /// This rank's part in the expert exchanges of one forward (and, with `grad`, its backward;
    /// `checkpointed`: in the order of [`Self::backward_checkpointed`]) of a micro-batch it does
    /// not have: another rank of its expert-parallel group is computing one, and this rank holds
    /// experts its tokens need. No tokens of its own go anywhere.
    pub fn expert_idle_pass(&self, grad: bool, checkpointed: bool) -> Result<(), tch::TchError> {
        let moe: Vec<&SparseMoe> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mlp {
                FeedForward::Moe(m) => Some(m),
                FeedForward::Dense(_) => None,
            })
            .collect();
        let empty = || {
            Tensor::zeros(
                [0, self.cfg.hidden_size],
                (self.embed_tokens.kind(), self.embed_tokens.device()),
            )
        };
        if !grad || checkpointed {
            // Forward without a graph (π_old, or the checkpointed backward's first pass).
            let _g = tch::no_grad_guard();
            let mut x = empty();
            for m in &moe {
                x = m.idle(&x);
            }
        }
        if !grad {
            return Ok(());
        }
        if checkpointed {
            // Each layer recomputed and back-propagated alone, last first.
            for m in moe.iter().rev() {
                let x = empty().set_requires_grad(true);
                m.idle(&x).sum(Kind::Float).f_backward()?;
            }
            return Ok(());
        }
        // One graph through every layer, so the backward visits them last first.
        let x0 = empty().set_requires_grad(true);
        let mut x = x0.shallow_clone();
        for m in &moe {
            x = m.idle(&x);
        }
        x.sum(Kind::Float).f_backward()
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
