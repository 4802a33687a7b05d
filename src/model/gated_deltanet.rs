//! Gated DeltaNet linear attention, the token mixer of three in four layers of Qwen3-Next and
//! Qwen3.5 (transformers' `Qwen3NextGatedDeltaNet` / `Qwen3_5MoeGatedDeltaNet` with their
//! pure-torch `torch_chunk_gated_delta_rule` and `torch_recurrent_gated_delta_rule`).
//!
//! Per token: projections to `q, k` (`k_heads × k_dim`), `v, z` (`v_heads × v_dim`) and `b, a`
//! (`v_heads`); a causal depthwise conv1d (no bias) + SiLU over `[q | k | v]`; `q`, `k`
//! L2-normalised in fp32, `q` scaled by `k_dim^-½`, each key head shared by `v_heads / k_heads`
//! consecutive value heads; decay `g = −exp(A_log)·softplus(a + dt_bias)` and step `β = σ(b)`.
//! The recurrence over the fp32 state `S` (`[v_heads, k_dim, v_dim]`):
//! `S ← e^g·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq`, then a gated RMSNorm with `z`
//! (`w · norm(o) · silu(z)`, plain `w`, not `1 + w`) and `out_proj`.
//!
//! Two forms of the same recurrence live here and share the projection, conv, gating and
//! normalisation code ([`GatedDeltaNet::inputs`], [`gates`], [`prepare_qk`]):
//! - [`GatedDeltaNet::forward`] — the **chunked** form (chunks of [`CHUNK`] positions, the UT
//!   transform solved with a unit-triangular solve), for training and prefill; packed rows run
//!   each sequence separately so no state crosses a sequence boundary;
//! - [`GatedDeltaNet::decode`] — the **recurrent** form, one token of B sequences, each with its
//!   own conv state and recurrent state ([`LinearState`]), for the engine's decode step.
//!
//! Qwen3-Next stores the input projections fused per key-head group (`in_proj_qkvz`: for each
//! key head `[q | k | v of its value heads | z of its value heads]`; `in_proj_ba`: `[b | a]`).
//! The forward slices that grouped layout directly instead of reordering the weights at load:
//! the same products, and the var is the checkpoint's own tensor, so it saves byte-identical.

use tch::{nn, Kind, Tensor};

use super::cache::LinearState;
use super::layers::{linear, weight};
use super::Config;

/// Positions per chunk of the chunked form (transformers' and FLA's default).
pub const CHUNK: i64 = 64;

/// The input projections, in the checkpoint's layout.
#[derive(Debug)]
enum Proj {
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split {
        qkv: Tensor,
        z: Tensor,
        b: Tensor,
        a: Tensor,
    },
    /// Qwen3-Next: `in_proj_qkvz`, `in_proj_ba`, grouped per key head.
    Grouped { qkvz: Tensor, ba: Tensor },
}

/// Projected inputs of T tokens: `qkv` `[T, conv_dim]` (flat `[q | k | v]`, the conv's channel
/// order), `z` `[T, v_heads, v_dim]`, `b` and `a` `[T, v_heads]`.
struct Inputs {
    qkv: Tensor,
    z: Tensor,
    b: Tensor,
    a: Tensor,
}

/// One Gated DeltaNet layer (`model.layers.N.linear_attn`).
#[derive(Debug)]
pub struct GatedDeltaNet {
    proj: Proj,
    /// `[conv_dim, 1, kernel]` depthwise.
    conv1d: Tensor,
    dt_bias: Tensor,
    a_log: Tensor,
    /// Gated output norm's weight `[v_dim]` (plain `w`).
    norm: Tensor,
    out_proj: Tensor,
    eps: f64,
    k_heads: i64,
    v_heads: i64,
    k_dim: i64,
    v_dim: i64,
    kernel: i64,
}

/// The sizes of a Gated DeltaNet layer's projections, from the config (also the parameter shapes
/// `train-step --plan` counts, [`super::shapes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    pub k_heads: i64,
    pub v_heads: i64,
    pub k_dim: i64,
    pub v_dim: i64,
    /// `k_heads × k_dim`.
    pub key_dim: i64,
    /// `v_heads × v_dim`.
    pub value_dim: i64,
    /// Channels of the conv: `[q | k | v]`, `2 × key_dim + value_dim`.
    pub conv_dim: i64,
    /// Rows of the fused `in_proj_qkvz`: `2 × key_dim + 2 × value_dim`.
    pub qkvz_dim: i64,
}

impl LinearDims {
    pub fn of(cfg: &Config) -> Self {
        let (nk, nv, dk, dv) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        );
        let (key_dim, value_dim) = (nk * dk, nv * dv);
        LinearDims {
            k_heads: nk,
            v_heads: nv,
            k_dim: dk,
            v_dim: dv,
            key_dim,
            value_dim,
            conv_dim: 2 * key_dim + value_dim,
            qkvz_dim: 2 * key_dim + 2 * value_dim,
        }
    }
}

impl GatedDeltaNet {
    /// Creates the vars under `<p>` (= `model.layers.N.linear_attn`), initialised like transformers.
    pub fn new(p: &nn::Path, cfg: &Config) -> Self {
        let d = LinearDims::of(cfg);
        let (nk, nv, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
        let (value_dim, conv_dim) = (d.value_dim, d.conv_dim);
        let h = cfg.hidden_size;
        let proj = if cfg.fused_linear_proj {
            Proj::Grouped {
                qkvz: weight(&(p / "in_proj_qkvz"), d.qkvz_dim, h),
                ba: weight(&(p / "in_proj_ba"), 2 * nv, h),
            }
        } else {
            Proj::Split {
                qkv: weight(&(p / "in_proj_qkv"), conv_dim, h),
                z: weight(&(p / "in_proj_z"), value_dim, h),
                b: weight(&(p / "in_proj_b"), nv, h),
                a: weight(&(p / "in_proj_a"), nv, h),
            }
        };
        let k = cfg.linear_conv_kernel_dim;
        let bound = 1.0 / (k as f64).sqrt();
        GatedDeltaNet {
            proj,
            conv1d: (p / "conv1d").uniform("weight", &[conv_dim, 1, k], -bound, bound),
            dt_bias: p.ones("dt_bias", &[nv]),
            // transformers: log(U(0.01, 16)); a fixed mid value is enough for a random model.
            a_log: p.zeros("A_log", &[nv]),
            norm: (p / "norm").ones("weight", &[dv]),
            out_proj: weight(&(p / "out_proj"), h, value_dim),
            eps: cfg.rms_norm_eps,
            k_heads: nk,
            v_heads: nv,
            k_dim: dk,
            v_dim: dv,
            kernel: k,
        }
    }

    fn conv_dim(&self) -> i64 {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// Projections of `x` (`[T, hidden]`).
    fn inputs(&self, x: &Tensor) -> Inputs {
        let t = x.size()[0];
        let (nk, nv, dk, dv) = (self.k_heads, self.v_heads, self.k_dim, self.v_dim);
        match &self.proj {
            Proj::Split { qkv, z, b, a } => Inputs {
                qkv: linear(x, qkv),
                z: linear(x, z).view([t, nv, dv]),
                b: linear(x, b),
                a: linear(x, a),
            },
            Proj::Grouped { qkvz, ba } => {
                let r = nv / nk;
                let g = linear(x, qkvz).view([t, nk, 2 * dk + 2 * r * dv]);
                let flat = |start: i64, len: i64| g.narrow(2, start, len).reshape([t, nk * len]);
                let qkv = Tensor::cat(&[flat(0, dk), flat(dk, dk), flat(2 * dk, r * dv)], 1);
                let z = g.narrow(2, 2 * dk + r * dv, r * dv).reshape([t, nv, dv]);
                let ba = linear(x, ba).view([t, nk, 2 * r]);
                Inputs {
                    qkv,
                    z,
                    b: ba.narrow(2, 0, r).reshape([t, nv]),
                    a: ba.narrow(2, r, r).reshape([t, nv]),
                }
            }
        }
    }

    /// Causal depthwise conv + SiLU of `qkv` (`[T, conv_dim]`) continuing `prev`
    /// (`[conv_dim, kernel − 1]`, zeros at a sequence start): the outputs `[T, conv_dim]` and
    /// the new conv state.
    fn conv(&self, qkv: &Tensor, prev: Option<&Tensor>) -> (Tensor, Tensor) {
        let t = qkv.size()[0];
        let c = self.conv_dim();
        let prev = match prev {
            Some(p) => p.shallow_clone(),
            None => Tensor::zeros([c, self.kernel - 1], (qkv.kind(), qkv.device())),
        };
        let full = Tensor::cat(&[prev, qkv.tr()], 1);
        let out = full
            .unsqueeze(0)
            .conv1d(&self.conv1d, None::<Tensor>, [1], [0], [1], c)
            .silu()
            .squeeze_dim(0)
            .tr();
        let state = full.narrow(1, t, self.kernel - 1).contiguous();
        (out, state)
    }

    /// Splits conv outputs `[T, conv_dim]` into `q`, `k` `[T, k_heads, k_dim]` and `v`
    /// `[T, v_heads, v_dim]`.
    fn split(&self, mixed: &Tensor) -> (Tensor, Tensor, Tensor) {
        let t = mixed.size()[0];
        let key_dim = self.k_heads * self.k_dim;
        let q = mixed.narrow(1, 0, key_dim).reshape([t, self.k_heads, self.k_dim]);
        let k = mixed
            .narrow(1, key_dim, key_dim)
            .reshape([t, self.k_heads, self.k_dim]);
        let v =
            mixed
                .narrow(1, 2 * key_dim, self.v_heads * self.v_dim)
                .reshape([t, self.v_heads, self.v_dim]);
        (q, k, v)
    }

    /// `out_proj(w · rmsnorm(o) · silu(z))` for the core output `o` (`[T, v_heads, v_dim]`,
    /// fp32), in the model dtype (transformers' `RMSNormGated`: norm in fp32, cast, scale by
    /// `w`, gate in fp32, cast).
    fn output(&self, o: &Tensor, z: &Tensor) -> Tensor {
        let t = o.size()[0];
        let kind = z.kind();
        let o = o.to_kind(kind).to_kind(Kind::Float);
        let normed = o.rms_norm([self.v_dim], None::<Tensor>, self.eps).to_kind(kind);
        let gated = (&self.norm * normed).to_kind(Kind::Float) * z.to_kind(Kind::Float).silu();
        linear(
            &gated.to_kind(kind).reshape([t, self.v_heads * self.v_dim]),
            &self.out_proj,
        )
    }

    /// The chunked form over `x` (`[T, hidden]`): `segments` (`(start, len)`, covering `0..T`)
    /// are independent sequences; with `state` (one segment only), the sequence continues it and
    /// its new state is written back.
    pub fn forward(
        &self,
        x: &Tensor,
        segments: &[(i64, i64)],
        state: Option<&mut Option<LinearState>>,
    ) -> Tensor {
        let inp = self.inputs(x);
        let (beta, g) = gates(&inp.b, &inp.a, &self.a_log, &self.dt_bias);
        let Some(slot) = state else {
            let outs: Vec<Tensor> = segments
                .iter()
                .map(|&(s, n)| {
                    let (mixed, _) = self.conv(&inp.qkv.narrow(0, s, n), None);
                    let (q, k, v) = self.split(&mixed);
                    let (q, k) = prepare_qk(&q, &k, self.v_heads);
                    chunked(&q, &k, &v, &g.narrow(0, s, n), &beta.narrow(0, s, n), None).0
                })
                .collect();
            let o = if outs.len() == 1 {
                outs.into_iter().next().expect("invariant: one segment")
            } else {
                Tensor::cat(&outs, 0)
            };
            return self.output(&o, &inp.z);
        };
        assert_eq!(
            segments.len(),
            1,
            "a cached Gated DeltaNet forward covers one sequence"
        );
        let prev = slot.take();
        let (mixed, conv) = self.conv(&inp.qkv, prev.as_ref().map(|s| &s.conv));
        let (q, k, v) = self.split(&mixed);
        let (q, k) = prepare_qk(&q, &k, self.v_heads);
        let (o, recurrent) = chunked(&q, &k, &v, &g, &beta, prev.as_ref().map(|s| &s.recurrent));
        *slot = Some(LinearState {
            conv,
            recurrent,
            len: prev.map_or(0, |s| s.len) + x.size()[0],
        });
        self.output(&o, &inp.z)
    }

    /// The recurrent form: one token of B sequences, row b of `x` (`[B, hidden]`) continuing
    /// the state in `slots[b]` (empty: a sequence start). Projections run on all B rows; the
    /// states are stacked for the step and handed back per sequence.
    pub fn decode(&self, x: &Tensor, mut slots: Vec<&mut Option<LinearState>>) -> Tensor {
        let inp = self.inputs(x);
        let (beta, g) = gates(&inp.b, &inp.a, &self.a_log, &self.dt_bias);
        let c = self.conv_dim();
        let (dev, kind) = (x.device(), x.kind());
        let prev: Vec<Option<LinearState>> = slots.iter_mut().map(|s| s.take()).collect();
        let convs: Vec<Tensor> = prev
            .iter()
            .map(|p| match p {
                Some(s) => s.conv.shallow_clone(),
                None => Tensor::zeros([c, self.kernel - 1], (kind, dev)),
            })
            .collect();
        let states: Vec<Tensor> = prev
            .iter()
            .map(|p| match p {
                Some(s) => s.recurrent.shallow_clone(),
                None => Tensor::zeros([self.v_heads, self.k_dim, self.v_dim], (Kind::Float, dev)),
            })
            .collect();
        // [B, C, kernel]: each sequence's last kernel−1 inputs and its new one.
        let full = Tensor::cat(&[Tensor::stack(&convs, 0), inp.qkv.unsqueeze(-1)], 2);
        let mixed = full
            .conv1d(&self.conv1d, None::<Tensor>, [1], [0], [1], c)
            .silu()
            .squeeze_dim(-1);
        let (q, k, v) = self.split(&mixed);
        let (q, k) = prepare_qk(&q, &k, self.v_heads);
        let (o, s) = recurrent_step(&q, &k, &v, &g, &beta, &Tensor::stack(&states, 0));
        for (b, (slot, p)) in slots.into_iter().zip(prev).enumerate() {
            let b = b as i64;
            *slot = Some(LinearState {
                conv: full.get(b).narrow(1, 1, self.kernel - 1).contiguous(),
                recurrent: s.get(b),
                len: p.map_or(0, |s| s.len) + 1,
            });
        }
        self.output(&o, &inp.z)
    }
}

/// `β = σ(b)` and `g = −exp(A_log)·softplus(a + dt_bias)`, both fp32 `[T, v_heads]`.
pub(crate) fn gates(b: &Tensor, a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> (Tensor, Tensor) {
    let beta = b.sigmoid().to_kind(Kind::Float);
    let g = -a_log.to_kind(Kind::Float).exp() * (a.to_kind(Kind::Float) + dt_bias).softplus();
    (beta, g)
}

/// `q`, `k` (`[T, k_heads, k_dim]`) → fp32 `[T, v_heads, k_dim]`: each key head repeated for its
/// value heads, L2-normalised (ε 1e-6 inside the root, as FLA), `q` scaled by `k_dim^-½`.
pub(crate) fn prepare_qk(q: &Tensor, k: &Tensor, v_heads: i64) -> (Tensor, Tensor) {
    let heads = q.size()[1];
    let dk = q.size()[2];
    let prep = |x: &Tensor| {
        let x = x.to_kind(Kind::Float);
        let x = if v_heads != heads {
            x.repeat_interleave_self_int(v_heads / heads, 1, None::<i64>)
        } else {
            x
        };
        let inv = ((&x * &x).sum_dim_intlist(-1, true, Kind::Float) + 1e-6).rsqrt();
        x * inv
    };
    (prep(q) * (dk as f64).powf(-0.5), prep(k))
}

/// The chunked gated delta rule over one sequence: `q`, `k` `[T, H, dk]` (prepared), `v`
/// `[T, H, dv]`, `g`, `beta` `[T, H]`; starting from `state` (`[H, dk, dv]`, zeros if none).
/// Returns the outputs `[T, H, dv]` and the final state, both fp32.
///
/// Within a chunk, the delta-rule updates are condensed by the UT transform: with
/// `A = I + tril₋₁((β k) kᵀ ⊙ D)` (`D[i,j] = e^{G_i − G_j}`, `G` the in-chunk cumulative decay),
/// `u = A⁻¹ (β v)` and `w = A⁻¹ (β k e^G)`; then, chunk after chunk,
/// `v' = u − w S`, `o = (q e^G) S + (q kᵀ ⊙ D)_causal v'`, `S ← e^{G_last} S + (k e^{G_last − G})ᵀ v'`.
pub(crate) fn chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: Option<&Tensor>,
) -> (Tensor, Tensor) {
    let (t, h, dk) = (q.size()[0], q.size()[1], q.size()[2]);
    let dv = v.size()[2];
    let dev = q.device();
    let pad = (CHUNK - t % CHUNK) % CHUNK;
    let n = (t + pad) / CHUNK;
    // [H, N, C, d] / [H, N, C], zero-padded at the end (β = 0, g = 0: no effect on real rows).
    let heads_first = |x: &Tensor, d: i64| {
        x.to_kind(Kind::Float)
            .transpose(0, 1)
            .constant_pad_nd([0, 0, 0, pad])
            .reshape([h, n, CHUNK, d])
    };
    let (q, k, v) = (heads_first(q, dk), heads_first(k, dk), heads_first(v, dv));
    let flat = |x: &Tensor| x.tr().constant_pad_nd([0, pad]).reshape([h, n, CHUNK]);
    let (beta, g) = (flat(beta), flat(g));
    let k_beta = &k * beta.unsqueeze(-1);
    let v_beta = &v * beta.unsqueeze(-1);
    let cum = g.cumsum(-1, Kind::Float);
    let upper = Tensor::ones([CHUNK, CHUNK], (Kind::Bool, dev)).triu(1);
    let decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2))
        .masked_fill(&upper, f64::NEG_INFINITY)
        .exp();
    let kt = k.transpose(-1, -2);
    let ut = k_beta.matmul(&kt) * &decay;
    let intra = q.matmul(&kt) * &decay;
    let u = ut.linalg_solve_triangular(&v_beta, false, true, true);
    let w = ut.linalg_solve_triangular(&(&k_beta * cum.exp().unsqueeze(-1)), false, true, true);
    let qd = &q * cum.exp().unsqueeze(-1);
    let last = cum.narrow(-1, CHUNK - 1, 1);
    let kd = &k * (&last - &cum).exp().unsqueeze(-1);
    let chunk_decay = last.exp().unsqueeze(-1); // [H, N, 1, 1]
    let mut s = match state {
        Some(s) => s.to_kind(Kind::Float),
        None => Tensor::zeros([h, dk, dv], (Kind::Float, dev)),
    };
    let mut outs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = |x: &Tensor| x.select(1, i);
        let v_new = at(&u) - at(&w).matmul(&s);
        outs.push(at(&qd).matmul(&s) + at(&intra).matmul(&v_new));
        s = &s * at(&chunk_decay) + at(&kd).transpose(-1, -2).matmul(&v_new);
    }
    // [H, N·C, dv] → [T, H, dv]
    let o = Tensor::stack(&outs, 1)
        .reshape([h, n * CHUNK, dv])
        .narrow(1, 0, t)
        .transpose(0, 1);
    (o, s)
}

/// One step of the recurrent gated delta rule for B sequences: `q`, `k` `[B, H, dk]` (prepared),
/// `v` `[B, H, dv]`, `g`, `beta` `[B, H]`, `state` `[B, H, dk, dv]` fp32. Returns the outputs
/// `[B, H, dv]` and the new states.
pub(crate) fn recurrent_step(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
) -> (Tensor, Tensor) {
    let v = v.to_kind(Kind::Float);
    let s = state * g.exp().unsqueeze(-1).unsqueeze(-1);
    let k_col = k.unsqueeze(-1);
    let kv_mem = (&s * &k_col).sum_dim_intlist(-2, false, Kind::Float);
    let delta = (v - kv_mem) * beta.unsqueeze(-1);
    let s = s + k_col * delta.unsqueeze(-2);
    let o = (&s * q.unsqueeze(-1)).sum_dim_intlist(-2, false, Kind::Float);
    (o, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked form equals the token-by-token recurrence (fp32), across chunk boundaries and
    /// from a non-zero initial state; this is the kernel the engine's decode and the trainer's
    /// forward each use.
    #[test]
    fn chunked_equals_recurrent() {
        tch::manual_seed(7);
        let (t, h, dk, dv) = (150, 4, 8, 6);
        let q = Tensor::randn([t, h / 2, dk], (Kind::Float, tch::Device::Cpu));
        let k = Tensor::randn([t, h / 2, dk], (Kind::Float, tch::Device::Cpu));
        let (q, k) = prepare_qk(&q, &k, h);
        let v = Tensor::randn([t, h, dv], (Kind::Float, tch::Device::Cpu));
        let b = Tensor::randn([t, h], (Kind::Float, tch::Device::Cpu));
        let a = Tensor::randn([t, h], (Kind::Float, tch::Device::Cpu));
        let a_log = Tensor::randn([h], (Kind::Float, tch::Device::Cpu));
        let dt_bias = Tensor::ones([h], (Kind::Float, tch::Device::Cpu));
        let (beta, g) = gates(&b, &a, &a_log, &dt_bias);
        let s0 = Tensor::randn([h, dk, dv], (Kind::Float, tch::Device::Cpu)) * 0.1;
        let (o_chunk, s_chunk) = chunked(&q, &k, &v, &g, &beta, Some(&s0));
        let mut s = s0.unsqueeze(0);
        let mut outs = Vec::new();
        for i in 0..t {
            let row = |x: &Tensor| x.narrow(0, i, 1);
            let (o, s2) = recurrent_step(&row(&q), &row(&k), &row(&v), &row(&g), &row(&beta), &s);
            outs.push(o);
            s = s2;
        }
        let o_rec = Tensor::cat(&outs, 0);
        let d = (&o_chunk - &o_rec).abs().max().double_value(&[]);
        assert!(d < 1e-5, "outputs differ by {d}");
        let d = (&s_chunk - s.squeeze_dim(0)).abs().max().double_value(&[]);
        assert!(d < 1e-5, "final states differ by {d}");
        assert!(
            o_rec.abs().max().double_value(&[]) > 0.1,
            "a trivial output proves nothing"
        );
    }
}
