//! `Config`: the Hugging Face `config.json` of a Qwen3, Qwen3-MoE, Qwen3-Next or Qwen3.5-MoE
//! checkpoint.
//!
//! Two key layouts exist in the wild and both load: the published one (`num_experts`, top-level
//! `rope_theta`, `torch_dtype`) and the one transformers ≥ 5 writes (`num_local_experts`,
//! `rope_parameters.rope_theta`, `dtype`). Unknown keys are ignored; a missing required key is an
//! error naming the key. The resolved struct is what the model code reads; the original file is
//! copied through unchanged when a checkpoint is saved.
//!
//! A family the model code does not implement is refused here, by `model_type` and
//! `architectures`, with the supported ones listed ([`SUPPORTED_MODEL_TYPES`]). The hybrid
//! families (transformers' `configuration_qwen3_next.py`, `configuration_qwen3_5_moe.py`) add the
//! per-layer token mixer (`layer_types`, or every `full_attention_interval`-th layer full
//! attention), partial RoPE, the gated attention output, the Gated DeltaNet sizes (`linear_*`) and
//! the shared expert. Qwen3.5 nests all of it in `text_config` under a vision-language wrapper
//! whose text weights live under `model.language_model.` ([`Config::text_prefix`]).

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::ModelError;

/// `model_type`s the model code implements.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// `architectures` entries the model code implements (the text model of the Qwen3.5 wrapper).
const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
];

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Softmax attention over a KV cache (gated output in the hybrid families).
    FullAttention,
    /// Gated DeltaNet linear attention (conv state + recurrent state).
    LinearAttention,
}

/// Resolved model hyper-parameters (dense when `num_experts == 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type` (`qwen3`, `qwen3_moe`, `qwen3_next`, `qwen3_5_moe`).
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    /// Dense MLP width (dense layers and `mlp_only_layers`).
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    /// Routed experts per MoE layer; 0 for a dense model.
    pub num_experts: i64,
    pub num_experts_per_tok: i64,
    pub moe_intermediate_size: i64,
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: i64,
    pub mlp_only_layers: Vec<i64>,
    /// Parameter dtype named by the checkpoint (`float32`, `bfloat16`, ...), if any.
    pub dtype: Option<String>,
    /// Token mixer per layer; all [`LayerType::FullAttention`] for Qwen3 / Qwen3-MoE.
    pub layer_types: Vec<LayerType>,
    /// Share of `head_dim` that RoPE rotates (the first dimensions); 1 for Qwen3.
    pub partial_rotary_factor: f64,
    /// `q_proj` yields `[q | gate]` per head and the attention output is scaled by `sigmoid(gate)`.
    pub attn_output_gate: bool,
    /// RMSNorms scale by `1 + w` (weights start at 0) instead of `w` (the hybrid families).
    pub norm_offset: bool,
    pub linear_num_key_heads: i64,
    pub linear_num_value_heads: i64,
    pub linear_key_head_dim: i64,
    pub linear_value_head_dim: i64,
    pub linear_conv_kernel_dim: i64,
    /// Width of the sigmoid-gated shared expert of each MoE block; 0: none.
    pub shared_expert_intermediate_size: i64,
    /// Var-name prefix of the decoder (`model`, or `model.language_model` under the Qwen3.5
    /// vision-language wrapper); `lm_head` is always at the root.
    pub text_prefix: String,
    /// Qwen3-Next: Gated DeltaNet input projections fused per key-head group (`in_proj_qkvz`,
    /// `in_proj_ba`) instead of separate (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`).
    pub fused_linear_proj: bool,
    /// Routed experts stored as 3-D `experts.gate_up_proj` / `experts.down_proj` (how
    /// transformers ≥ 5 keeps them) instead of `experts.E.{gate,up,down}_proj.weight`. Not a
    /// `config.json` key: the loader sets it from the checkpoint's tensor names, so a checkpoint
    /// is saved in the layout it came in.
    pub fused_experts: bool,
    /// Which experts of every MoE layer this process holds (expert parallelism; not a
    /// `config.json` key). Default: all of them.
    pub expert_shard: super::ExpertShard,
}

/// The raw file: every key optional so that absence is reported by name, not by serde.
#[derive(Deserialize, Default)]
struct Raw {
    vocab_size: Option<i64>,
    hidden_size: Option<i64>,
    intermediate_size: Option<i64>,
    num_hidden_layers: Option<i64>,
    num_attention_heads: Option<i64>,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    max_position_embeddings: Option<i64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    num_experts: Option<i64>,
    num_local_experts: Option<i64>,
    num_experts_per_tok: Option<i64>,
    moe_intermediate_size: Option<i64>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<i64>,
    mlp_only_layers: Option<Vec<i64>>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<i64>,
    partial_rotary_factor: Option<f64>,
    attn_output_gate: Option<bool>,
    linear_num_key_heads: Option<i64>,
    linear_num_value_heads: Option<i64>,
    linear_key_head_dim: Option<i64>,
    linear_value_head_dim: Option<i64>,
    linear_conv_kernel_dim: Option<i64>,
    shared_expert_intermediate_size: Option<i64>,
}

/// The wrapper keys read beside `text_config`.
#[derive(Deserialize, Default)]
struct Outer {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    text_config: Option<Value>,
    tie_word_embeddings: Option<bool>,
}

impl Config {
    /// Reads and resolves `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|msg| ModelError::Config {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Parses `config.json` text; the error message names the offending key.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let outer: Outer = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
        let family = supported_family(&outer)?;
        let wrapped = family == "qwen3_5_moe";
        let raw: Raw = match (&outer.text_config, wrapped) {
            (Some(tc), true) => {
                serde_json::from_value(tc.clone()).map_err(|e| format!("invalid `text_config`: {e}"))?
            }
            (None, true) => return Err("missing required key `text_config` (model_type qwen3_5_moe)".into()),
            _ => serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?,
        };
        let key = |k: &str| {
            if wrapped {
                format!("text_config.{k}")
            } else {
                k.to_string()
            }
        };
        let req = |v: Option<i64>, k: &str| v.ok_or_else(|| format!("missing required key `{}`", key(k)));
        let hybrid = matches!(family.as_str(), "qwen3_next" | "qwen3_5_moe" | "qwen3_5_moe_text");
        let rope_theta = rope_theta(&raw)?;
        let num_experts = raw.num_experts.or(raw.num_local_experts).unwrap_or(0);
        let is_moe = family.contains("moe") || family == "qwen3_next" || num_experts > 0;
        if is_moe && num_experts == 0 {
            return Err(format!(
                "missing required key `{}` (or `num_local_experts`)",
                key("num_experts")
            ));
        }
        let hidden_size = req(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = req(raw.num_attention_heads, "num_attention_heads")?;
        let num_hidden_layers = req(raw.num_hidden_layers, "num_hidden_layers")?;
        let layer_types = if hybrid {
            hybrid_layer_types(&raw, num_hidden_layers, &key)?
        } else {
            vec![LayerType::FullAttention; num_hidden_layers.max(0) as usize]
        };
        let partial_rotary_factor = raw
            .partial_rotary_factor
            .or_else(|| {
                raw.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("partial_rotary_factor"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(1.0);
        let linear = |v: Option<i64>, k: &str| if hybrid { req(v, k) } else { Ok(0) };
        let cfg = Config {
            vocab_size: req(raw.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: if is_moe {
                raw.intermediate_size.unwrap_or(0)
            } else {
                req(raw.intermediate_size, "intermediate_size")?
            },
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw.head_dim.unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(32768),
            tie_word_embeddings: outer
                .tie_word_embeddings
                .filter(|_| wrapped)
                .or(raw.tie_word_embeddings)
                .unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(false),
            num_experts,
            num_experts_per_tok: if is_moe {
                req(raw.num_experts_per_tok, "num_experts_per_tok")?
            } else {
                0
            },
            moe_intermediate_size: if is_moe {
                req(raw.moe_intermediate_size, "moe_intermediate_size")?
            } else {
                0
            },
            // Qwen3.5's router always renormalises its top-k (it has no such key).
            norm_topk_prob: raw.norm_topk_prob.unwrap_or(false) || family.starts_with("qwen3_5"),
            decoder_sparse_step: raw.decoder_sparse_step.unwrap_or(1).max(1),
            // Qwen3.5 has no dense layers; an `mlp_only_layers` there would be ignored by transformers.
            mlp_only_layers: if family.starts_with("qwen3_5") {
                vec![]
            } else {
                raw.mlp_only_layers.unwrap_or_default()
            },
            dtype: raw.dtype.or(raw.torch_dtype),
            layer_types,
            partial_rotary_factor,
            attn_output_gate: hybrid && raw.attn_output_gate.unwrap_or(true),
            norm_offset: hybrid,
            linear_num_key_heads: linear(raw.linear_num_key_heads, "linear_num_key_heads")?,
            linear_num_value_heads: linear(raw.linear_num_value_heads, "linear_num_value_heads")?,
            linear_key_head_dim: linear(raw.linear_key_head_dim, "linear_key_head_dim")?,
            linear_value_head_dim: linear(raw.linear_value_head_dim, "linear_value_head_dim")?,
            linear_conv_kernel_dim: if hybrid {
                raw.linear_conv_kernel_dim.unwrap_or(4)
            } else {
                0
            },
            shared_expert_intermediate_size: raw.shared_expert_intermediate_size.unwrap_or(0),
            text_prefix: if wrapped { "model.language_model" } else { "model" }.into(),
            fused_linear_proj: family == "qwen3_next",
            fused_experts: false,
            expert_shard: Default::default(),
            model_type: family,
        };
        cfg.check(hybrid, &key)?;
        Ok(cfg)
    }

    /// The consistency checks of a parsed configuration (`key` names a key as the file spells
    /// it).
    fn check(&self, hybrid: bool, key: &dyn Fn(&str) -> String) -> Result<(), String> {
        if self.num_attention_heads % self.num_key_value_heads.max(1) != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err(format!(
                "num_experts_per_tok {} exceeds num_experts {}",
                self.num_experts_per_tok, self.num_experts
            ));
        }
        if hybrid && self.linear_num_value_heads % self.linear_num_key_heads.max(1) != 0 {
            return Err(format!(
                "`{}` {} is not a multiple of `{}` {}",
                key("linear_num_value_heads"),
                self.linear_num_value_heads,
                key("linear_num_key_heads"),
                self.linear_num_key_heads
            ));
        }
        let rot = self.rotary_dim();
        if rot <= 0 || rot > self.head_dim || rot % 2 != 0 {
            return Err(format!(
                "`partial_rotary_factor` {} of head_dim {} gives {rot} rotary dimensions (must be even, 2..=head_dim)",
                self.partial_rotary_factor, self.head_dim
            ));
        }
        Ok(())
    }

    /// Dimensions of each head that RoPE rotates (transformers: `int(head_dim × factor)`).
    pub fn rotary_dim(&self) -> i64 {
        (self.head_dim as f64 * self.partial_rotary_factor) as i64
    }

    /// True when layer `i` uses a routed MoE block (transformers' rule).
    pub fn is_moe_layer(&self, i: i64) -> bool {
        self.num_experts > 0 && !self.mlp_only_layers.contains(&i) && (i + 1) % self.decoder_sparse_step == 0
    }

    /// Indices of the MoE layers, in order; routing arrays index layers by position in this list.
    pub fn moe_layers(&self) -> Vec<i64> {
        (0..self.num_hidden_layers)
            .filter(|&i| self.is_moe_layer(i))
            .collect()
    }

    /// A tiny dense config for unit tests (vocab 64, hidden 32, 2 layers).
    pub fn tiny() -> Self {
        Config {
            model_type: "qwen3".into(),
            vocab_size: 64,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            max_position_embeddings: 512,
            tie_word_embeddings: false,
            attention_bias: false,
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: false,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            dtype: Some("float32".into()),
            layer_types: vec![LayerType::FullAttention; 2],
            partial_rotary_factor: 1.0,
            attn_output_gate: false,
            norm_offset: false,
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            shared_expert_intermediate_size: 0,
            text_prefix: "model".into(),
            fused_linear_proj: false,
            fused_experts: false,
            expert_shard: Default::default(),
        }
    }

    /// [`Config::tiny`] with 4 experts, top-2, renormalised.
    pub fn tiny_moe() -> Self {
        Config {
            model_type: "qwen3_moe".into(),
            num_experts: 4,
            num_experts_per_tok: 2,
            moe_intermediate_size: 16,
            norm_topk_prob: true,
            ..Self::tiny()
        }
    }
}

/// `model_type`, when lego-rl implements it and every listed architecture.
fn supported_family(outer: &Outer) -> Result<String, String> {
    let family = outer
        .model_type
        .clone()
        .ok_or("missing required key `model_type`")?;
    if !SUPPORTED_MODEL_TYPES.contains(&family.as_str()) {
        return Err(format!(
            "model_type `{family}` is not supported; supported: {}",
            SUPPORTED_MODEL_TYPES.join(", ")
        ));
    }
    if let Some(arch) = outer
        .architectures
        .iter()
        .flatten()
        .find(|a| !SUPPORTED_ARCHITECTURES.contains(&a.as_str()))
    {
        return Err(format!(
            "architecture `{arch}` is not supported; supported: {}",
            SUPPORTED_ARCHITECTURES.join(", ")
        ));
    }
    Ok(family)
}

/// RoPE's base (`rope_theta`, or transformers ≥ 5's `rope_parameters.rope_theta`); any RoPE
/// scaling but the default is refused.
fn rope_theta(raw: &Raw) -> Result<f64, String> {
    let rope_theta = match (raw.rope_theta, &raw.rope_parameters) {
        (Some(t), _) => t,
        (None, Some(p)) => p
            .get("rope_theta")
            .and_then(Value::as_f64)
            .ok_or("`rope_parameters` has no numeric `rope_theta`")?,
        (None, None) => {
            return Err("missing required key `rope_theta` (or `rope_parameters.rope_theta`)".into())
        }
    };
    for scaling in [&raw.rope_scaling, &raw.rope_parameters].into_iter().flatten() {
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return Err(format!(
                "unsupported rope type `{kind}` (only `default` RoPE is implemented)"
            ));
        }
    }
    Ok(rope_theta)
}

/// `layer_types` when given (its length must be `num_hidden_layers`), else every
/// `full_attention_interval`-th layer full attention (transformers' default, interval 4).
fn hybrid_layer_types(
    raw: &Raw,
    layers: i64,
    key: &dyn Fn(&str) -> String,
) -> Result<Vec<LayerType>, String> {
    match &raw.layer_types {
        Some(types) => {
            if types.len() as i64 != layers {
                return Err(format!(
                    "`{}` has {} entries, `{}` is {layers}",
                    key("layer_types"),
                    types.len(),
                    key("num_hidden_layers")
                ));
            }
            types
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    "full_attention" => Ok(LayerType::FullAttention),
                    "linear_attention" => Ok(LayerType::LinearAttention),
                    other => Err(format!(
                        "`{}[{i}]` is `{other}`; supported: full_attention, linear_attention",
                        key("layer_types")
                    )),
                })
                .collect()
        }
        None => {
            let every = raw.full_attention_interval.unwrap_or(4).max(1);
            Ok((0..layers)
                .map(|i| {
                    if (i + 1) % every == 0 {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect())
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
