//! Dense building blocks of Qwen3, following transformers' `modeling_qwen3.py`: RMSNorm (computed
//! in fp32), rotate-half RoPE, grouped-query attention with per-head q/k RMSNorm, SwiGLU MLP.
//! The hybrid families (`modeling_qwen3_next.py`, `modeling_qwen3_5_moe.py`) reuse them with three
//! switches from [`Config`]: `(1 + w)` norms, RoPE on the first `partial_rotary_factor × head_dim`
//! dimensions only, and a `sigmoid(gate)` on the attention output (`q_proj` yields `[q | gate]`
//! per head).
//!
//! Var paths equal the Hugging Face tensor names (`self_attn.q_proj.weight`, ...), so safetensors
//! load and save with no renaming. Attention works on one packed row of tokens: several sequences
//! may be concatenated (block-diagonal causal mask, positions restarting per sequence), and an
//! optional slot of a [`super::KvCache`] lets an inference engine decode incrementally with the
//! same code.

use tch::{nn, Kind, Tensor};

use super::Config;

/// Standard deviation of transformers' default init (`initializer_range`).
pub(crate) const INIT_STD: f64 = 0.02;

/// A `[out, in]` weight initialised like transformers (normal, std 0.02).
pub(crate) fn weight(p: &nn::Path, out: i64, inp: i64) -> Tensor {
    p.randn("weight", &[out, inp], 0.0, INIT_STD)
}

/// `x @ w.T` for a `[out, in]` weight.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    // `at::linear` is `matmul(x, w.t())` for a bias-less weight: one call instead of two.
    x.linear(w, None::<Tensor>)
}

/// Root-mean-square norm with a learned scale; the statistics are computed in fp32 (as
/// transformers does) and the result is cast back to the input dtype before scaling.
///
/// With `offset` (the hybrid families' zero-centred norm) the scale is `1 + w`, applied in fp32
/// before the cast back (transformers' `Qwen3NextRMSNorm`: `(x·(1+w)).to(dtype)`, where Qwen3
/// does `w·x.to(dtype)`); its weights start at 0.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
    offset: bool,
}

impl RmsNorm {
    /// Creates `<p>.weight` of size `dim`, initialised to ones.
    pub fn new(p: &nn::Path, dim: i64, eps: f64) -> Self {
        RmsNorm {
            weight: p.ones("weight", &[dim]),
            eps,
            offset: false,
        }
    }

    /// [`Self::new`], or with `offset` a `(1 + w)` norm whose weight starts at zeros.
    pub fn with_offset(p: &nn::Path, dim: i64, eps: f64, offset: bool) -> Self {
        if !offset {
            return Self::new(p, dim, eps);
        }
        RmsNorm {
            weight: p.zeros("weight", &[dim]),
            eps,
            offset: true,
        }
    }

    /// Normalises over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        if self.offset {
            let dim = x.size().last().copied().unwrap_or(0);
            let scale = self.weight.to_kind(Kind::Float) + 1.0;
            return x
                .to_kind(Kind::Float)
                .rms_norm([dim], Some(&scale), self.eps)
                .to_kind(kind);
        }
        if kind == Kind::Float {
            // One fused op instead of six (decode is dominated by per-op overhead); in float32
            // it is the same arithmetic as below (checked against transformers in the model tests).
            let dim = x.size().last().copied().unwrap_or(0);
            return x.rms_norm([dim], Some(&self.weight), self.eps);
        }
        let xf = x.to_kind(Kind::Float);
        let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let normed = (xf * (var + self.eps).rsqrt()).to_kind(kind);
        &self.weight * normed
    }
}

/// RoPE's per-dimension frequencies, computed once per model (they depend on the config only):
/// recomputing them from an `arange` at every forward was a dozen tiny ops per decode step.
#[derive(Debug)]
pub struct Rope {
    /// `[head_dim]`: transformers' `inv_freq` (`1 / theta^(2i/D)`) twice, `[f, f]`.
    inv_freq2: Tensor,
    /// `[head_dim]`: -1 on the first half, +1 on the second (the sign of `rotate_half`).
    sign: Tensor,
}

impl Rope {
    /// Tables over [`Config::rotary_dim`] dimensions (the whole head unless RoPE is partial).
    pub fn new(cfg: &Config, device: tch::Device) -> Self {
        let dim = cfg.rotary_dim();
        let exponent =
            Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device)).to_kind(Kind::Float) / dim as f64;
        let inv_freq = Tensor::pow_scalar(cfg.rope_theta, &exponent).reciprocal();
        let ones = Tensor::ones([dim / 2], (Kind::Float, device));
        Rope {
            inv_freq2: Tensor::cat(&[&inv_freq, &inv_freq], 0),
            sign: Tensor::cat(&[&ones.neg(), &ones], 0),
        }
    }

    /// RoPE tables for given positions: `(cos, sin)`, each `[T, head_dim]`, in `kind`. `sin`
    /// carries the sign of transformers' `rotate_half` (its first half negated), so
    /// [`apply_rope`] needs one `roll` instead of two slices, a negation and a concatenation —
    /// the same products. Elementwise the same values as transformers' `cat(freqs, freqs)`
    /// tables (`cos(cat(f, f)) = cat(cos f, cos f)`, and a product by ±1 is exact).
    pub fn tables(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq2;
        let (cos, sin) = (freqs.cos(), freqs.sin() * &self.sign);
        if kind == Kind::Float {
            (cos, sin)
        } else {
            (cos.to_kind(kind), sin.to_kind(kind))
        }
    }
}

/// Applies RoPE to `[heads, T, D]` with [`Rope::tables`]: `x·cos + rotate_half(x)·sin`, where
/// `rotate_half(x) = [-x2, x1]` is `roll(x, R/2)` times the signs folded into `sin`. Tables
/// narrower than the head (`R < D`, partial RoPE) rotate the first `R` dimensions and pass the
/// rest through.
fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let d = x.size().last().copied().unwrap_or(0);
    let r = cos.size().last().copied().unwrap_or(0);
    if r < d {
        let rot = x.narrow(-1, 0, r);
        return Tensor::cat(&[apply_rope(&rot, cos, sin), x.narrow(-1, r, d - r)], -1);
    }
    x * cos + x.roll([d / 2], [-1]) * sin
}

/// How the tokens of one forward call may attend to each other.
pub enum AttnMask<'a> {
    /// One causal sequence (optionally continuing a cache).
    Causal,
    /// Several causal sequences packed into one row, as `(start, len)` in order, covering
    /// `0..T`. Each attends only within itself.
    ///
    /// Why segments and not a block-diagonal `[T, T]` mask: the mask is quadratic in the packed
    /// row (17 GB of booleans at 131k tokens), and an explicit mask keeps SDPA off its flash and
    /// memory-efficient kernels, so backends fall back to `heads × T × T` scores. One causal call
    /// per segment keeps attention's memory linear in T and every call on the fused kernels.
    Packed(&'a [(i64, i64)]),
}

/// Grouped-query self-attention with per-head RMSNorm on queries and keys.
#[derive(Debug)]
pub struct Attention {
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    q_bias: Option<Tensor>,
    k_bias: Option<Tensor>,
    v_bias: Option<Tensor>,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    /// `q_proj` yields `[q | gate]` per head; the output is scaled by `sigmoid(gate)`.
    output_gate: bool,
}

impl Attention {
    /// Creates the vars under `<p>` (= `model.layers.N.self_attn`).
    pub fn new(p: &nn::Path, cfg: &Config) -> Self {
        let (h, kvh, d, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let bias = |name: &str, n: i64| cfg.attention_bias.then(|| (p / name).zeros("bias", &[n]));
        let q_out = if cfg.attn_output_gate { 2 * h * d } else { h * d };
        Attention {
            q_proj: weight(&(p / "q_proj"), q_out, hid),
            k_proj: weight(&(p / "k_proj"), kvh * d, hid),
            v_proj: weight(&(p / "v_proj"), kvh * d, hid),
            o_proj: weight(&(p / "o_proj"), hid, h * d),
            q_bias: bias("q_proj", q_out),
            k_bias: bias("k_proj", kvh * d),
            v_bias: bias("v_proj", kvh * d),
            q_norm: RmsNorm::with_offset(&(p / "q_norm"), d, cfg.rms_norm_eps, cfg.norm_offset),
            k_norm: RmsNorm::with_offset(&(p / "k_norm"), d, cfg.rms_norm_eps, cfg.norm_offset),
            heads: h,
            kv_heads: kvh,
            head_dim: d,
            output_gate: cfg.attn_output_gate,
        }
    }

    fn project(x: &Tensor, w: &Tensor, b: &Option<Tensor>) -> Tensor {
        let y = linear(x, w);
        match b {
            Some(b) => y + b,
            None => y,
        }
    }

    /// `x`: `[T, hidden]` → `[T, hidden]`. `cache` is one layer's slot of a [`super::KvCache`].
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttnMask,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Tensor {
        let (q, k, v, gate) = self.qkv(x, cos, sin);
        self.output(self.attend(&q, k, v, mask, cache), gate)
    }

    /// `o_proj(attn · sigmoid(gate))`, or `o_proj(attn)` without an output gate.
    fn output(&self, attn: Tensor, gate: Option<Tensor>) -> Tensor {
        match gate {
            Some(g) => linear(&(attn * g.sigmoid()), &self.o_proj),
            None => linear(&attn, &self.o_proj),
        }
    }

    /// One decode step of B sequences: row b of `x` (`[B, hidden]`, `cos`/`sin` `[B, head_dim]`)
    /// is the next token of the sequence whose cache slot is `slots[b]`. The projections run on
    /// all B rows at once; attention runs per sequence over its own cache.
    ///
    /// Why a loop and not a padded `[B, heads, max_past, D]` attention: the caches have different
    /// lengths, and padding would copy every cache into a fresh padded block at every layer of
    /// every step (the caches are grown by concatenation, not preallocated), and would change
    /// each row's softmax summation (masked slots) so a sequence's output would depend on its
    /// batch. The loop does exactly the one-sequence arithmetic, and one token's attention is
    /// a small share of a decode step next to the matmuls that batching shares.
    pub fn decode(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        slots: Vec<&mut Option<(Tensor, Tensor)>>,
    ) -> Tensor {
        let (q, k, v, gate) = self.qkv(x, cos, sin);
        let rows: Vec<Tensor> = slots
            .into_iter()
            .enumerate()
            .map(|(b, slot)| {
                let row = |t: &Tensor| t.narrow(1, b as i64, 1);
                self.attend(&row(&q), row(&k), row(&v), &AttnMask::Causal, Some(slot))
            })
            .collect();
        self.output(Tensor::cat(&rows, 0), gate)
    }

    /// Queries, keys and values of `x` (`[T, hidden]`) after the q/k norms and RoPE:
    /// `[heads, T, D]`, `[kv_heads, T, D]`, `[kv_heads, T, D]`; and the output gate `[T, heads·D]`.
    fn qkv(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> (Tensor, Tensor, Tensor, Option<Tensor>) {
        let t = x.size()[0];
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let (q, gate) = if self.output_gate {
            let qg = Self::project(x, &self.q_proj, &self.q_bias).view([t, h, 2 * d]);
            (qg.narrow(2, 0, d), Some(qg.narrow(2, d, d).reshape([t, h * d])))
        } else {
            (Self::project(x, &self.q_proj, &self.q_bias).view([t, h, d]), None)
        };
        let k = Self::project(x, &self.k_proj, &self.k_bias).view([t, kvh, d]);
        let v = Self::project(x, &self.v_proj, &self.v_bias).view([t, kvh, d]);
        let q = apply_rope(&self.q_norm.forward(&q).transpose(0, 1), cos, sin);
        let k = apply_rope(&self.k_norm.forward(&k).transpose(0, 1), cos, sin);
        (q, k, v.transpose(0, 1), gate)
    }

    /// Attention of the T queries `q` over the keys and values `k`, `v` (appended to `cache`
    /// first): `[T, heads·D]`, before the output projection.
    fn attend(
        &self,
        q: &Tensor,
        mut k: Tensor,
        mut v: Tensor,
        mask: &AttnMask,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Tensor {
        let t = q.size()[1];
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let mut past = 0;
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.as_ref() {
                past = pk.size()[1];
                k = Tensor::cat(&[pk, &k], 1);
                v = Tensor::cat(&[pv, &v], 1);
            }
            *slot = Some((k.shallow_clone(), v.shallow_clone()));
        }
        // Grouped-query attention without copying: sdpa's `enable_gqa` lets each group of
        // `heads / kv_heads` query heads read one key/value head (transformers'
        // `repeat_kv` made the copies explicit; the products are the same).
        let gqa = h != kvh;
        let (q, k, v) = (q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0));
        let scale = (d as f64).powf(-0.5);
        let out = match mask {
            AttnMask::Causal if past == 0 => sdpa(&q, &k, &v, None, true, scale, gqa),
            AttnMask::Causal if t == 1 => sdpa(&q, &k, &v, None, false, scale, gqa),
            AttnMask::Causal => {
                // Continuing a cache: query i (absolute past+i) sees keys 0..=past+i.
                let dev = q.device();
                let qpos = Tensor::arange(t, (Kind::Int64, dev)).unsqueeze(1) + past;
                let kpos = Tensor::arange(past + t, (Kind::Int64, dev)).unsqueeze(0);
                let m = kpos.le_tensor(&qpos);
                sdpa(&q, &k, &v, Some(m), false, scale, gqa)
            }
            AttnMask::Packed(segments) => {
                assert_eq!(past, 0, "invariant: a packed row does not continue a cache");
                let outs: Vec<Tensor> = segments
                    .iter()
                    .map(|&(start, len)| {
                        let part = |x: &Tensor| x.narrow(2, start, len);
                        sdpa(&part(&q), &part(&k), &part(&v), None, true, scale, gqa)
                    })
                    .collect();
                Tensor::cat(&outs, 2)
            }
        };
        out.squeeze_dim(0).transpose(0, 1).reshape([t, h * d])
    }
}

/// Every attention of the model goes through here: SDPA on `[1, heads, T, D]`, with an explicit
/// boolean mask only when continuing a cache (`[t, past + t]`, t the new tokens). Tests record
/// the largest mask it was given, to show packed rows never reach it with one.
fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<Tensor>,
    causal: bool,
    scale: f64,
    gqa: bool,
) -> Tensor {
    #[cfg(test)]
    tests::LARGEST_MASK.with(|m| {
        let n = mask.as_ref().map_or(0, |x| x.numel());
        m.set(m.get().max(n));
    });
    Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, gqa)
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`. Also one MoE expert.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
}

impl Mlp {
    /// Creates `<p>.{gate,up,down}_proj.weight`.
    pub fn new(p: &nn::Path, hidden: i64, inter: i64) -> Self {
        Mlp {
            gate_proj: weight(&(p / "gate_proj"), inter, hidden),
            up_proj: weight(&(p / "up_proj"), inter, hidden),
            down_proj: weight(&(p / "down_proj"), hidden, inter),
        }
    }

    /// `[N, hidden]` → `[N, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let g = linear(x, &self.gate_proj).silu();
        linear(&(g * linear(x, &self.up_proj)), &self.down_proj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Elements of the largest mask [`sdpa`] was given on this thread.
        pub(super) static LARGEST_MASK: Cell<usize> = const { Cell::new(0) };
    }

    /// A packed row of three sequences (lengths that are not multiples of each other) attends
    /// without any mask reaching SDPA, and each sequence's output equals its own causal
    /// forward (what a block-diagonal mask gave).
    #[test]
    fn packed_rows_reach_sdpa_with_no_mask_and_equal_separate_rows() {
        tch::manual_seed(3);
        let cfg = Config::tiny();
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(&(vs.root() / "attn"), &cfg);
        let rope = Rope::new(&cfg, tch::Device::Cpu);
        let lens = [5i64, 17, 8];
        let t: i64 = lens.iter().sum();
        let x = Tensor::randn([t, cfg.hidden_size], (Kind::Float, tch::Device::Cpu));
        let mut segments = Vec::new();
        let mut positions = Vec::new();
        for &len in &lens {
            segments.push((positions.len() as i64, len));
            positions.extend(0..len);
        }
        let (cos, sin) = rope.tables(&Tensor::from_slice(&positions), Kind::Float);
        LARGEST_MASK.with(|m| m.set(0));
        let packed = attn.forward(&x, &cos, &sin, &AttnMask::Packed(&segments), None);
        assert_eq!(
            LARGEST_MASK.with(Cell::get),
            0,
            "a packed row reached SDPA with a mask"
        );
        for &(start, len) in &segments {
            let part = |z: &Tensor| z.narrow(0, start, len);
            let alone = attn.forward(&part(&x), &part(&cos), &part(&sin), &AttnMask::Causal, None);
            let d = (part(&packed) - &alone).abs().max().double_value(&[]);
            assert!(d < 1e-6, "segment at {start}: packed vs alone |Δ| {d}");
        }
        // The check can fail: a cache continuation does pass a mask.
        let mut slot = None;
        let first = |z: &Tensor| z.narrow(0, 0, 4);
        let rest = |z: &Tensor| z.narrow(0, 4, 3);
        let _ = attn.forward(
            &first(&x),
            &first(&cos),
            &first(&sin),
            &AttnMask::Causal,
            Some(&mut slot),
        );
        let _ = attn.forward(
            &rest(&x),
            &rest(&cos),
            &rest(&sin),
            &AttnMask::Causal,
            Some(&mut slot),
        );
        assert_eq!(LARGEST_MASK.with(Cell::get), 3 * 7);
    }
}
