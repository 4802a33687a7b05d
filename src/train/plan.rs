//! `train-step --plan`: the memory one rank needs for a training step, from `config.json` alone
//! (no weights, no device), and whether it fits a device.
//!
//! The parameter side comes from [`param_shapes`], the shapes the model builds, so its counts
//! are the model's own. What train-step keeps per rank (read from `optim.rs`, `zero.rs`,
//! `update.rs`):
//! - weights in the compute dtype (`--dtype`, else the checkpoint's); narrower than fp32 (bf16),
//!   an fp32 master copy of every parameter beside the moments (4 bytes per parameter, ZeRO-1:
//!   1/N of them), which AdamW updates;
//! - one `.grad` per trained parameter, in the parameter's dtype, alive from the first backward to
//!   the update; at the update, ZeRO-1 adds the reduce-scattered chunk (1/N of each bucket, fp32:
//!   gradients are reduced in fp32), ZeRO-0 on many ranks the all-reduced fp32 copy of every
//!   gradient;
//! - AdamW's `exp_avg` and `exp_avg_sq` in fp32 (8 bytes per parameter), ZeRO-1: 1/N of them.
//!
//! Expert parallelism (`--expert-parallel E`) gives each rank `num_experts / E` experts of every
//! MoE layer; an expert's gradient is reduced, and under ZeRO-1 its moments sharded, over the
//! `world / E` ranks holding the same experts. Everything else stays data-parallel (reduced and
//! sharded over all ranks). Tokens are assumed spread evenly over experts (an overloaded expert
//! holds more activations than planned).
//!
//! Activations are estimated per token from what autograd saves in this crate's forward
//! ([`activation_bytes`]: each block type lists its saved tensors), for one packed micro-batch of
//! `--micro-batch-tokens` tokens (every token scored: an upper bound). Without
//! `--activation-checkpointing` every layer's saved tensors are alive at the backward; with it
//! (`CausalLm::backward_checkpointed`) each layer's input plus one layer's saved tensors. The
//! no-gradient pass that recomputes π_old holds one layer at a time and is never the peak.
//! The step's peak is the larger of the backward (state + activations) and the update (state +
//! reduced gradients + the update's fp32 temporaries), plus a runtime reserve.

use serde::Serialize;
use tch::Kind;

use crate::model::shapes::{param_shapes, ParamCounts, ParamSpec};
use crate::model::{Config, LayerType};

/// Bytes of the fixed part of [`Plan::reserve`]: CUDA context, cuBLAS and NCCL workspaces.
const RESERVE_FIXED: u64 = 2 << 30;
/// Share of the planned bytes added for the caching allocator's fragmentation.
const RESERVE_SHARE: f64 = 0.05;
/// fp32 temporaries alive at once while AdamW updates one tensor (`adamw_update`: the fp32
/// parameter and gradient, the denominator, the step and the result).
const UPDATE_TEMPS: u64 = 5;
const F32: u64 = 4;

/// What the plan is for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSpec {
    pub world_size: usize,
    pub expert_parallel: usize,
    /// ZeRO stage 1 (else 0).
    pub zero: bool,
    /// Weight and compute dtype.
    pub dtype: Kind,
    /// The checkpoint's dtype (the saved weights keep it): fp32 compute of a narrower checkpoint
    /// keeps masters as well.
    pub stored_dtype: Kind,
    pub micro_batch_tokens: u64,
    pub activation_checkpointing: bool,
    /// LM-head positions per chunk (`None`: unchunked).
    pub logprob_chunk: Option<u64>,
    /// Elements per gradient bucket.
    pub bucket_elems: u64,
    /// Memory of one device, when known.
    pub device_memory: Option<u64>,
}

/// Bytes per rank, split into the dense (data-parallel) part and the routed experts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Split {
    pub dense: u64,
    pub experts: u64,
}

impl Split {
    pub fn total(&self) -> u64 {
        self.dense + self.experts
    }
}

/// The memory plan of one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model_type: String,
    pub world_size: usize,
    pub expert_parallel: usize,
    pub zero_stage: u8,
    pub dtype: String,
    pub micro_batch_tokens: u64,
    pub activation_checkpointing: bool,
    pub params: ParamCounts,
    /// Parameters held by one rank.
    pub params_per_rank: Split,
    pub weights: Split,
    /// The parameters' `.grad`.
    pub gradients: Split,
    /// At the update: ZeRO-1's reduced chunks, or ZeRO-0's all-reduced copies (many ranks).
    pub reduced_gradients: Split,
    /// AdamW moments (fp32).
    pub optimizer: Split,
    /// fp32 master weights (a compute dtype narrower than fp32), sharded like the moments.
    pub masters: Split,
    pub activations: u64,
    /// fp32 temporaries (and ZeRO's flat bucket) while AdamW updates the largest tensor.
    pub update_temporaries: u64,
    /// Weights + gradients + activations + optimizer state (moments and masters).
    pub backward_peak: u64,
    /// Weights + gradients + reduced gradients + optimizer state + update temporaries.
    pub update_peak: u64,
    /// CUDA context and workspaces plus allocator slack.
    pub reserve: u64,
    /// The larger peak plus the reserve.
    pub total: u64,
    pub device_memory: Option<u64>,
    /// `total <= device_memory`, when the device memory is known.
    pub fits: Option<bool>,
}

/// A plan that cannot be made (the flags contradict the model or each other).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--expert-parallel {ep}: {msg}")]
    ExpertParallel { ep: usize, msg: String },
    #[error("--world-size 0: need at least one rank")]
    NoRanks,
}

/// Element counts a plan is made from: the model's parameters, dense vs routed experts.
#[derive(Default)]
struct Params {
    dense: u64,
    experts: u64,
    largest_dense: u64,
    largest_expert: u64,
}

impl Params {
    fn new(specs: &[ParamSpec]) -> Self {
        let mut p = Params::default();
        for s in specs {
            let n = s.numel() as u64;
            if s.is_expert() {
                p.experts += n;
                p.largest_expert = p.largest_expert.max(n);
            } else {
                p.dense += n;
                p.largest_dense = p.largest_dense.max(n);
            }
        }
        p
    }
}

/// Plans one rank's memory for a step of `cfg` under `spec`.
pub fn plan(cfg: &Config, spec: &PlanSpec) -> Result<Plan, PlanError> {
    let (w, ep) = (spec.world_size as u64, spec.expert_parallel as u64);
    if w == 0 {
        return Err(PlanError::NoRanks);
    }
    let ep_err = |msg: String| PlanError::ExpertParallel {
        ep: spec.expert_parallel,
        msg,
    };
    if ep == 0 {
        return Err(ep_err("need at least 1".into()));
    }
    if w % ep != 0 {
        return Err(ep_err(format!("does not divide the world size {w}")));
    }
    if ep > 1 && cfg.num_experts == 0 {
        return Err(ep_err(format!("the model ({}) has no experts", cfg.model_type)));
    }
    if cfg.num_experts > 0 && cfg.num_experts as u64 % ep != 0 {
        return Err(ep_err(format!(
            "does not divide the {} experts per layer",
            cfg.num_experts
        )));
    }
    let specs = param_shapes(cfg);
    let p = Params::new(&specs);
    let b = spec.dtype.elt_size_in_bytes() as u64;
    // Ranks one parameter's gradient is reduced over (and its moments sharded over under ZeRO).
    let (dense_group, expert_group) = (w, w / ep);
    let local = Split {
        dense: p.dense,
        experts: p.experts / ep,
    };
    let bytes = |s: Split, per: u64| Split {
        dense: s.dense * per,
        experts: s.experts * per,
    };
    // ZeRO pads each bucket to a multiple of the group: at most one element per rank and bucket.
    let shard = |s: Split| Split {
        dense: s.dense.div_ceil(dense_group),
        experts: s.experts.div_ceil(expert_group),
    };
    let weights = bytes(local, b);
    let gradients = weights;
    let reduced_gradients = match (spec.zero, w) {
        (_, 1) => Split::default(),
        (true, _) => bytes(shard(local), F32),
        (false, _) => bytes(local, F32),
    };
    let held = if spec.zero { shard(local) } else { local };
    let optimizer = bytes(held, 2 * F32);
    let masters = if b < F32 || spec.stored_dtype != Kind::Float {
        bytes(held, F32)
    } else {
        Split::default()
    };
    let largest_expert_local = if cfg.fused_experts {
        p.largest_expert / ep
    } else {
        p.largest_expert
    };
    let update_temporaries = if spec.zero {
        // A bucket is at least `bucket_elems` (or one larger parameter): its flat copy (fp32
        // gradients at the reduce-scatter, no narrower than the parameters' at the all-gather),
        // and fp32 temporaries of this rank's chunk of it.
        let dense_bucket = spec.bucket_elems.max(p.largest_dense);
        let expert_bucket = spec.bucket_elems.max(largest_expert_local);
        let cost = |n: u64, group: u64| n * F32.max(b) + n.div_ceil(group) * (b + UPDATE_TEMPS * F32);
        cost(dense_bucket, dense_group).max(cost(expert_bucket, expert_group))
    } else {
        p.largest_dense.max(largest_expert_local) * UPDATE_TEMPS * F32
    };
    let activations = activation_bytes(cfg, spec);
    let state = weights.total() + gradients.total() + optimizer.total() + masters.total();
    let backward_peak = state + activations;
    let update_peak = state + reduced_gradients.total() + update_temporaries;
    let peak = backward_peak.max(update_peak);
    let reserve = RESERVE_FIXED + (peak as f64 * RESERVE_SHARE) as u64;
    let total = peak + reserve;
    Ok(Plan {
        model_type: cfg.model_type.clone(),
        world_size: spec.world_size,
        expert_parallel: spec.expert_parallel,
        zero_stage: u8::from(spec.zero),
        dtype: kind_name(spec.dtype).into(),
        micro_batch_tokens: spec.micro_batch_tokens,
        activation_checkpointing: spec.activation_checkpointing,
        params: ParamCounts::new(cfg, &specs, &[]),
        params_per_rank: local,
        weights,
        gradients,
        reduced_gradients,
        optimizer,
        masters,
        activations,
        update_temporaries,
        backward_peak,
        update_peak,
        reserve,
        total,
        device_memory: spec.device_memory,
        fits: spec.device_memory.map(|m| total <= m),
    })
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "other",
    }
}

/// Bytes autograd keeps for the backward of one micro-batch (see the module header).
///
/// Per token and block, the saved tensors are listed where they arise in the forward; `b` is
/// the compute dtype's size, fp32 tensors are the ones the code upcasts. Full attention assumes
/// a fused SDPA kernel (CUDA: no `[T, T]` scores kept): a packed micro-batch reaches it one
/// causal sequence at a time with no mask ([`crate::model::AttnMask::Packed`]), so nothing in
/// a micro-batch is quadratic in its tokens.
pub fn activation_bytes(cfg: &Config, spec: &PlanSpec) -> u64 {
    let b = spec.dtype.elt_size_in_bytes() as u64;
    let t = spec.micro_batch_tokens;
    let h = cfg.hidden_size as u64;
    let layers: Vec<u64> = (0..cfg.num_hidden_layers)
        .map(|i| {
            let mixer = match cfg.layer_types.get(i as usize) {
                Some(LayerType::LinearAttention) => linear_attention_per_token(cfg, b) * t,
                _ => attention_per_token(cfg, b) * t,
            };
            let ffn = if cfg.is_moe_layer(i) {
                moe_per_token(cfg, b, spec.expert_parallel > 1)
            } else {
                norm(h, b) + 4 * b * cfg.intermediate_size as u64
            };
            mixer + ffn * t
        })
        .collect();
    let v = cfg.vocab_size as u64;
    // The head runs on the final hidden states (kept) and hands their gradient to the decoder;
    // chunked, `[chunk, vocab]` bf16 logits, their fp32 log-softmax and bf16 softmax exist at a
    // time; unchunked, autograd keeps logits and log-softmax of every position, and the backward
    // adds their gradients.
    let head = 2 * t * h * b
        + match spec.logprob_chunk {
            Some(c) => c.min(t) * (v * (2 * b + F32) + 2 * h * b),
            None => t * v * 2 * (b + F32),
        };
    let decoder = if spec.activation_checkpointing {
        // Every layer's input (and the last output), one layer's saved tensors during its
        // recomputation, and the gradient flowing back with the recomputed input's own.
        (layers.len() as u64 + 1) * t * h * b + layers.iter().copied().max().unwrap_or(0) + 2 * t * h * b
    } else {
        layers.iter().sum::<u64>() + norm(h, b) * t
    };
    decoder + head
}

/// An RMSNorm over `dim`: its fp32 upcast and its output.
fn norm(dim: u64, b: u64) -> u64 {
    (F32 + b) * dim
}

/// `input_layernorm` + full attention (`Attention::forward`).
fn attention_per_token(cfg: &Config, b: u64) -> u64 {
    let (heads, d, h) = (
        cfg.num_attention_heads as u64,
        cfg.head_dim as u64,
        cfg.hidden_size as u64,
    );
    let q = heads * d;
    let kv = cfg.num_key_value_heads as u64 * d;
    let q_out = if cfg.attn_output_gate { 2 * q } else { q };
    norm(h, b)
        + b * q_out // q_proj output ([q | gate] when gated)
        + norm(q, b) + norm(kv, b) // q_norm, k_norm
        + b * kv // v
        + 2 * b * (q + kv) // RoPE: the rolled copies, and q, k as SDPA gets them
        + b * q + F32 * heads // SDPA output and its log-sum-exp
        + if cfg.attn_output_gate { 2 * b * q } else { 0 } // sigmoid(gate), o_proj input
}

/// `input_layernorm` + Gated DeltaNet (`GatedDeltaNet::forward`, the chunked form).
fn linear_attention_per_token(cfg: &Config, b: u64) -> u64 {
    let (nk, dk, nv, dv) = (
        cfg.linear_num_key_heads as u64,
        cfg.linear_key_head_dim as u64,
        cfg.linear_num_value_heads as u64,
        cfg.linear_value_head_dim as u64,
    );
    let h = cfg.hidden_size as u64;
    let (kd, vd) = (nk * dk, nv * dv);
    let conv = 2 * kd + vd;
    let c = crate::model::DELTA_CHUNK as u64;
    norm(h, b)
        + b * (conv + vd + 2 * nv) // input projections: qkv, z, b, a
        + 3 * b * conv // conv1d input (state ‖ qkvᵀ), its output, the SiLU output
        + F32 * (2 * kd + 5 * nv * dk) // prepare_qk: fp32 q, k; repeated to v heads, normalised, q scaled
        + F32 * nv * (2 * dk + dv) // chunked: heads-first fp32 q, k, v
        + F32 * nv * (dk + dv) // k·β, v·β
        + 4 * F32 * nv * c // [C, C] per chunk: decay, k·β·kᵀ·D, q·kᵀ, q·kᵀ·D
        + F32 * nv * (dv + 2 * dk) // u, w and k·β·e^G (triangular solves)
        + 2 * F32 * nv * dk // q·e^G, k·e^(G_last − G)
        + F32 * nv * dk * dv / c // one recurrent state [H, dk, dv] per chunk
        + 3 * F32 * nv * dv // v', the per-chunk outputs, the stacked output
        + 4 * F32 * nv // β, g and their inputs
        + (4 * F32 + 3 * b) * vd // gated norm: fp32 o, normed, w·normed, silu(z); o, normed, out_proj input
}

/// `post_attention_layernorm` + the MoE block (`SparseMoe::forward`) for one token, its k routed
/// copies (each: the gathered input, gate and up outputs, SiLU, their product, the expert output
/// scaled by its gate), the router, the shared expert, and under expert parallelism the
/// all-to-all send and receive buffers of the k copies.
fn moe_per_token(cfg: &Config, b: u64, ep: bool) -> u64 {
    let (h, e, k) = (
        cfg.hidden_size as u64,
        cfg.num_experts as u64,
        cfg.num_experts_per_tok as u64,
    );
    let inter = cfg.moe_intermediate_size as u64;
    let shared = cfg.shared_expert_intermediate_size as u64;
    norm(h, b)
        + (b + F32) * e // router logits, fp32 softmax
        + k * (2 * F32 + 2 * 8) // gates (gathered, renormalised), expert ids
        + k * (2 * b * h + 4 * b * inter)
        + if ep { 2 * k * b * h } else { 0 }
        + if shared > 0 { 4 * b * shared + b * h + 2 * b } else { 0 }
}

const GIB: f64 = (1u64 << 30) as f64;

fn gib(x: u64) -> String {
    format!("{:.2} GiB", x as f64 / GIB)
}

fn billions(x: i64) -> String {
    format!("{:.2}B", x as f64 / 1e9)
}

impl Plan {
    /// The plan as a table for people (what `--plan` prints).
    pub fn table(&self) -> String {
        let mut o = String::new();
        let mut line = |s: String| {
            o.push_str(&s);
            o.push('\n');
        };
        line(format!(
            "memory plan per rank: {} on {} rank(s), expert parallel {}, ZeRO-{}, {} weights, {} tokens per micro-batch, activation checkpointing {}",
            self.model_type,
            self.world_size,
            self.expert_parallel,
            self.zero_stage,
            self.dtype,
            self.micro_batch_tokens,
            if self.activation_checkpointing { "on" } else { "off" },
        ));
        let p = &self.params;
        line(format!(
            "parameters: {} total ({} without embeddings), {} active per token, {} routed-expert; {} dense + {} expert per rank",
            billions(p.total),
            billions(p.non_embedding),
            billions(p.active),
            billions(p.experts),
            billions(self.params_per_rank.dense as i64),
            billions(self.params_per_rank.experts as i64),
        ));
        line(format!(
            "{:<38}{:>14}{:>14}{:>14}",
            "", "dense", "experts", "total"
        ));
        let rows = [
            (format!("weights ({})", self.dtype), self.weights),
            ("gradients (.grad)".to_string(), self.gradients),
            (
                if self.zero_stage == 1 {
                    "reduced gradient shards (update)".to_string()
                } else {
                    "all-reduced gradients (update)".to_string()
                },
                self.reduced_gradients,
            ),
            ("optimizer (fp32 exp_avg, exp_avg_sq)".to_string(), self.optimizer),
            ("fp32 master weights".to_string(), self.masters),
        ];
        for (name, s) in rows {
            line(format!(
                "{name:<38}{:>14}{:>14}{:>14}",
                gib(s.dense),
                gib(s.experts),
                gib(s.total())
            ));
        }
        for (name, v) in [
            ("activations (backward)", self.activations),
            ("update temporaries", self.update_temporaries),
            ("peak at the backward", self.backward_peak),
            ("peak at the update", self.update_peak),
            ("runtime reserve", self.reserve),
            ("total", self.total),
        ] {
            line(format!("{name:<38}{:>42}", gib(v)));
        }
        match (self.device_memory, self.fits) {
            (Some(m), Some(true)) => line(format!(
                "fits: {} of {} device memory ({:.0}%)",
                gib(self.total),
                gib(m),
                100.0 * self.total as f64 / m as f64
            )),
            (Some(m), _) => line(format!(
                "does not fit: {} needed, {} device memory ({} over)",
                gib(self.total),
                gib(m),
                gib(self.total - m)
            )),
            (None, _) => line("device memory not given (--device-memory): fit not checked".into()),
        }
        o
    }
}
