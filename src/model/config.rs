//! `Config`: the Hugging Face `config.json` of a Qwen3 / Qwen3-MoE checkpoint.
//!
//! Two key layouts exist in the wild and both load: the published one (`num_experts`, top-level
//! `rope_theta`, `torch_dtype`) and the one transformers ≥ 5 writes (`num_local_experts`,
//! `rope_parameters.rope_theta`, `dtype`). Unknown keys are ignored; a missing required key is an
//! error naming the key. The resolved struct is what the model code reads; the original file is
//! copied through unchanged when a checkpoint is saved.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::ModelError;

/// Resolved model hyper-parameters (dense when `num_experts == 0`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type` (`qwen3` or `qwen3_moe`).
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
}

/// The raw file: every key optional so that absence is reported by name, not by serde.
#[derive(Deserialize, Default)]
struct Raw {
    model_type: Option<String>,
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
        let raw: Raw = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
        fn req<T>(v: Option<T>, key: &str) -> Result<T, String> {
            v.ok_or_else(|| format!("missing required key `{key}`"))
        }
        let rope_theta = match (raw.rope_theta, &raw.rope_parameters) {
            (Some(t), _) => t,
            (None, Some(p)) => p
                .get("rope_theta")
                .and_then(Value::as_f64)
                .ok_or("`rope_parameters` has no numeric `rope_theta`")?,
            (None, None) => return Err("missing required key `rope_theta` (or `rope_parameters.rope_theta`)".into()),
        };
        for scaling in [&raw.rope_scaling, &raw.rope_parameters].into_iter().flatten() {
            let kind = scaling
                .get("rope_type")
                .or_else(|| scaling.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            if kind != "default" {
                return Err(format!("unsupported rope type `{kind}` (only `default` RoPE is implemented)"));
            }
        }
        let model_type = req(raw.model_type, "model_type")?;
        let num_experts = raw.num_experts.or(raw.num_local_experts).unwrap_or(0);
        let is_moe = model_type.contains("moe") || num_experts > 0;
        if is_moe && num_experts == 0 {
            return Err("missing required key `num_experts` (or `num_local_experts`)".into());
        }
        let hidden_size = req(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = req(raw.num_attention_heads, "num_attention_heads")?;
        let cfg = Config {
            vocab_size: req(raw.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: if is_moe {
                raw.intermediate_size.unwrap_or(0)
            } else {
                req(raw.intermediate_size, "intermediate_size")?
            },
            num_hidden_layers: req(raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw.head_dim.unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(32768),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
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
            norm_topk_prob: raw.norm_topk_prob.unwrap_or(false),
            decoder_sparse_step: raw.decoder_sparse_step.unwrap_or(1).max(1),
            mlp_only_layers: raw.mlp_only_layers.unwrap_or_default(),
            dtype: raw.dtype.or(raw.torch_dtype),
            model_type,
        };
        if cfg.num_attention_heads % cfg.num_key_value_heads.max(1) != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                cfg.num_attention_heads, cfg.num_key_value_heads
            ));
        }
        if cfg.num_experts_per_tok > cfg.num_experts {
            return Err(format!(
                "num_experts_per_tok {} exceeds num_experts {}",
                cfg.num_experts_per_tok, cfg.num_experts
            ));
        }
        Ok(cfg)
    }

    /// True when layer `i` uses a routed MoE block (transformers' rule).
    pub fn is_moe_layer(&self, i: i64) -> bool {
        self.num_experts > 0 && !self.mlp_only_layers.contains(&i) && (i + 1) % self.decoder_sparse_step == 0
    }

    /// Indices of the MoE layers, in order; routing arrays index layers by position in this list.
    pub fn moe_layers(&self) -> Vec<i64> {
        (0..self.num_hidden_layers).filter(|&i| self.is_moe_layer(i)).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED: &str = r#"{"architectures":["Qwen3MoeForCausalLM"],"model_type":"qwen3_moe","vocab_size":151936,
      "hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":48,"num_attention_heads":32,
      "num_key_value_heads":4,"head_dim":128,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"rope_scaling":null,
      "num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true,
      "decoder_sparse_step":1,"mlp_only_layers":[],"torch_dtype":"bfloat16","tie_word_embeddings":false,
      "some_future_key":{"x":1}}"#;

    #[test]
    fn both_key_layouts_resolve_to_the_same_config() {
        let published = Config::from_json(PUBLISHED).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(PUBLISHED).unwrap();
        let o = v.as_object_mut().unwrap();
        let n = o.remove("num_experts").unwrap();
        o.insert("num_local_experts".into(), n);
        o.remove("rope_theta");
        o.remove("rope_scaling");
        o.insert("rope_parameters".into(), serde_json::json!({"rope_type":"default","rope_theta":1000000.0}));
        let d = o.remove("torch_dtype").unwrap();
        o.insert("dtype".into(), d);
        let newer = Config::from_json(&v.to_string()).unwrap();
        assert_eq!(published, newer);
        assert_eq!(published.num_experts, 128);
        assert_eq!(published.rope_theta, 1e6);
        assert_eq!(published.dtype.as_deref(), Some("bfloat16"));
        assert_eq!(published.moe_layers().len(), 48);
    }

    #[test]
    fn missing_keys_are_named() {
        let err = Config::from_json(r#"{"model_type":"qwen3","vocab_size":10}"#).unwrap_err();
        assert!(err.contains("`rope_theta`"), "{err}");
        let err =
            Config::from_json(r#"{"model_type":"qwen3","vocab_size":10,"rope_theta":1e4,"hidden_size":8}"#).unwrap_err();
        assert!(err.contains("`num_attention_heads`"), "{err}");
        let err = Config::from_json(r#"{"model_type":"qwen3","rope_theta":1e4,"rope_scaling":{"rope_type":"yarn"}}"#)
            .unwrap_err();
        assert!(err.contains("yarn"), "{err}");
    }

    #[test]
    fn sparse_step_and_mlp_only_layers_pick_moe_layers() {
        let mut c = Config::tiny_moe();
        c.num_hidden_layers = 6;
        c.decoder_sparse_step = 2;
        c.mlp_only_layers = vec![3];
        assert_eq!(c.moe_layers(), vec![1, 5]);
    }
}
