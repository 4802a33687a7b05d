//! The name, shape and role of every parameter the model builds for a [`Config`], without
//! building it: what `train-step --plan` sizes memory from, and what parameter counts are
//! checked against the published ones.
//!
//! [`param_shapes`] mirrors the constructors (`CausalLm::new`, `DecoderLayer::new`,
//! `Attention::new`, `GatedDeltaNet::new`, `SparseMoe::new`, `Mlp::new`) var for var, in both
//! expert layouts ([`Config::fused_experts`]); tests/it/plan.rs builds models of every family and
//! asserts `named_variables()` equals this list exactly, so the two cannot drift apart.
//!
//! [`checkpoint_extras`] lists tensors a published checkpoint carries that the model does not
//! build (the multi-token-prediction layers of Qwen3.5, its vision tower), when their shapes
//! follow from `config.json`; they are never trained here and only explain a checkpoint's size.

use serde_json::Value;

use super::config::LayerType;
use super::Config;

/// What a parameter is, for counting and for placing it under expert parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ParamRole {
    /// Input token embeddings.
    Embedding,
    /// Output projection (absent when tied to the embeddings).
    LmHead,
    /// An RMSNorm scale.
    Norm,
    /// Softmax attention projections (and biases).
    Attention,
    /// Gated DeltaNet projections, conv, decay and gated-norm parameters.
    LinearAttention,
    /// A dense SwiGLU MLP (dense models, `mlp_only_layers`).
    DenseMlp,
    /// The router of an MoE layer (`mlp.gate`).
    Router,
    /// Routed expert weights of MoE layer `layer` (decoder index): expert `expert` alone, or all
    /// of the layer's experts in one fused 3-D tensor (`expert: None`, experts on dim 0).
    Expert { layer: i64, expert: Option<i64> },
    /// The shared expert and its sigmoid gate (Qwen3-Next, Qwen3.5).
    SharedExpert,
    /// Multi-token-prediction layers (checkpoint only, not built).
    Mtp,
    /// Vision tower (checkpoint only, not built).
    Vision,
}

/// One parameter: its Hugging Face name, shape and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<i64>,
    pub role: ParamRole,
}

impl ParamSpec {
    /// Number of elements.
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }

    /// True for routed expert weights (split across ranks by expert parallelism).
    pub fn is_expert(&self) -> bool {
        matches!(self.role, ParamRole::Expert { .. })
    }
}

/// Collects specs under a name prefix.
struct Specs(Vec<ParamSpec>);

impl Specs {
    fn add(&mut self, name: String, shape: &[i64], role: ParamRole) {
        self.0.push(ParamSpec {
            name,
            shape: shape.to_vec(),
            role,
        });
    }

    /// `Mlp::new`: `<p>.{gate,up,down}_proj.weight`.
    fn mlp(&mut self, p: &str, hidden: i64, inter: i64, role: ParamRole) {
        self.add(format!("{p}.gate_proj.weight"), &[inter, hidden], role);
        self.add(format!("{p}.up_proj.weight"), &[inter, hidden], role);
        self.add(format!("{p}.down_proj.weight"), &[hidden, inter], role);
    }

    /// `Attention::new` under `<p>` (= `...self_attn`).
    fn attention(&mut self, p: &str, cfg: &Config) {
        let (h, kvh, d, hid) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        );
        let q_out = if cfg.attn_output_gate { 2 * h * d } else { h * d };
        let a = ParamRole::Attention;
        self.add(format!("{p}.q_proj.weight"), &[q_out, hid], a);
        self.add(format!("{p}.k_proj.weight"), &[kvh * d, hid], a);
        self.add(format!("{p}.v_proj.weight"), &[kvh * d, hid], a);
        self.add(format!("{p}.o_proj.weight"), &[hid, h * d], a);
        if cfg.attention_bias {
            self.add(format!("{p}.q_proj.bias"), &[q_out], a);
            self.add(format!("{p}.k_proj.bias"), &[kvh * d], a);
            self.add(format!("{p}.v_proj.bias"), &[kvh * d], a);
        }
        self.add(format!("{p}.q_norm.weight"), &[d], ParamRole::Norm);
        self.add(format!("{p}.k_norm.weight"), &[d], ParamRole::Norm);
    }

    /// `GatedDeltaNet::new` under `<p>` (= `...linear_attn`).
    fn linear_attention(&mut self, p: &str, cfg: &Config) {
        let d = super::gated_deltanet::LinearDims::of(cfg);
        let (nv, dv, value_dim, conv_dim) = (d.v_heads, d.v_dim, d.value_dim, d.conv_dim);
        let h = cfg.hidden_size;
        let r = ParamRole::LinearAttention;
        if cfg.fused_linear_proj {
            self.add(format!("{p}.in_proj_qkvz.weight"), &[d.qkvz_dim, h], r);
            self.add(format!("{p}.in_proj_ba.weight"), &[2 * nv, h], r);
        } else {
            self.add(format!("{p}.in_proj_qkv.weight"), &[conv_dim, h], r);
            self.add(format!("{p}.in_proj_z.weight"), &[value_dim, h], r);
            self.add(format!("{p}.in_proj_b.weight"), &[nv, h], r);
            self.add(format!("{p}.in_proj_a.weight"), &[nv, h], r);
        }
        self.add(
            format!("{p}.conv1d.weight"),
            &[conv_dim, 1, cfg.linear_conv_kernel_dim],
            r,
        );
        self.add(format!("{p}.dt_bias"), &[nv], r);
        self.add(format!("{p}.A_log"), &[nv], r);
        self.add(format!("{p}.norm.weight"), &[dv], r);
        self.add(format!("{p}.out_proj.weight"), &[h, value_dim], r);
    }

    /// `SparseMoe::new` under `<p>` (= `...mlp`) of decoder layer `layer`.
    fn moe(&mut self, p: &str, cfg: &Config, layer: i64) {
        let (h, inter, n) = (cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts);
        if cfg.fused_experts {
            let role = ParamRole::Expert { layer, expert: None };
            self.add(format!("{p}.experts.gate_up_proj"), &[n, 2 * inter, h], role);
            self.add(format!("{p}.experts.down_proj"), &[n, h, inter], role);
        } else {
            for e in 0..n {
                let role = ParamRole::Expert {
                    layer,
                    expert: Some(e),
                };
                self.mlp(&format!("{p}.experts.{e}"), h, inter, role);
            }
        }
        if cfg.shared_expert_intermediate_size > 0 {
            let s = ParamRole::SharedExpert;
            self.mlp(
                &format!("{p}.shared_expert"),
                h,
                cfg.shared_expert_intermediate_size,
                s,
            );
            self.add(format!("{p}.shared_expert_gate.weight"), &[1, h], s);
        }
        self.add(format!("{p}.gate.weight"), &[n, h], ParamRole::Router);
    }

    /// `DecoderLayer::new` for layer `i` under `<p>`; `mixer` overrides the layer's token mixer
    /// (the MTP layers are full attention whatever `layer_types` says).
    fn decoder_layer(&mut self, p: &str, cfg: &Config, i: i64, mixer: LayerType, moe: bool) {
        let h = cfg.hidden_size;
        self.add(format!("{p}.input_layernorm.weight"), &[h], ParamRole::Norm);
        self.add(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            ParamRole::Norm,
        );
        match mixer {
            LayerType::FullAttention => self.attention(&format!("{p}.self_attn"), cfg),
            LayerType::LinearAttention => self.linear_attention(&format!("{p}.linear_attn"), cfg),
        }
        if moe {
            self.moe(&format!("{p}.mlp"), cfg, i);
        } else {
            self.mlp(&format!("{p}.mlp"), h, cfg.intermediate_size, ParamRole::DenseMlp);
        }
    }
}

/// Every parameter `CausalLm::new` creates for `cfg`, with the names `named_variables()` gives.
pub fn param_shapes(cfg: &Config) -> Vec<ParamSpec> {
    let mut s = Specs(Vec::new());
    let m = &cfg.text_prefix;
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    s.add(format!("{m}.embed_tokens.weight"), &[v, h], ParamRole::Embedding);
    for i in 0..cfg.num_hidden_layers {
        let mixer = cfg
            .layer_types
            .get(i as usize)
            .copied()
            .unwrap_or(LayerType::FullAttention);
        s.decoder_layer(&format!("{m}.layers.{i}"), cfg, i, mixer, cfg.is_moe_layer(i));
    }
    s.add(format!("{m}.norm.weight"), &[h], ParamRole::Norm);
    if !cfg.tie_word_embeddings {
        s.add("lm_head.weight".into(), &[v, h], ParamRole::LmHead);
    }
    s.0
}

/// Checkpoint tensors the model does not build, from the raw `config.json`: Qwen3.5's MTP layers
/// (`mtp_num_hidden_layers`; each a full-attention MoE decoder layer plus the `fc` that joins
/// embedding and hidden state, sharing the main embeddings) and its vision tower
/// (`vision_config`, the Qwen3-VL encoder). Empty for configs that name neither (Qwen3-Next's
/// published config does not state its MTP depth, so none is listed for it).
pub fn checkpoint_extras(raw: &Value, cfg: &Config) -> Vec<ParamSpec> {
    let text = raw.get("text_config").unwrap_or(raw);
    let mut s = Specs(Vec::new());
    let mtp = text
        .get("mtp_num_hidden_layers")
        .or_else(|| text.get("num_nextn_predict_layers"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let h = cfg.hidden_size;
    if mtp > 0 {
        s.add("mtp.fc.weight".into(), &[h, 2 * h], ParamRole::Mtp);
        for name in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"] {
            s.add(format!("mtp.{name}.weight"), &[h], ParamRole::Mtp);
        }
        for i in 0..mtp {
            let moe = cfg.num_experts > 0;
            s.decoder_layer(&format!("mtp.layers.{i}"), cfg, i, LayerType::FullAttention, moe);
        }
    }
    let mut specs: Vec<ParamSpec> =
        s.0.into_iter()
            .map(|p| ParamSpec {
                role: ParamRole::Mtp,
                ..p
            })
            .collect();
    if let Some(vc) = raw.get("vision_config") {
        specs.extend(vision_tower(vc));
    }
    specs
}

/// The Qwen3-VL vision encoder of a Qwen3.5 checkpoint (`model.visual.*`): patch embedding,
/// learned position embedding, `depth` pre-LayerNorm ViT blocks and the patch merger, as
/// transformers' `Qwen3_5MoeVisionModel` builds them (tests/it/plan.rs compares).
fn vision_tower(vc: &Value) -> Vec<ParamSpec> {
    let get = |k: &str, default: i64| vc.get(k).and_then(Value::as_i64).unwrap_or(default);
    let (h, inter, depth) = (
        get("hidden_size", 0),
        get("intermediate_size", 0),
        get("depth", 0),
    );
    if h == 0 || depth == 0 {
        return Vec::new();
    }
    let (ps, tps, inc) = (
        get("patch_size", 16),
        get("temporal_patch_size", 2),
        get("in_channels", 3),
    );
    let merge = get("spatial_merge_size", 2);
    let out = get("out_hidden_size", h);
    let merged = h * merge * merge;
    let mut s = Specs(Vec::new());
    let r = ParamRole::Vision;
    let p = "model.visual";
    let linear = |s: &mut Specs, name: String, o: i64, i: i64| {
        s.add(format!("{name}.weight"), &[o, i], r);
        s.add(format!("{name}.bias"), &[o], r);
    };
    s.add(format!("{p}.patch_embed.proj.weight"), &[h, inc, tps, ps, ps], r);
    s.add(format!("{p}.patch_embed.proj.bias"), &[h], r);
    s.add(
        format!("{p}.pos_embed.weight"),
        &[get("num_position_embeddings", 0), h],
        r,
    );
    for b in 0..depth {
        let q = format!("{p}.blocks.{b}");
        for n in ["norm1", "norm2"] {
            s.add(format!("{q}.{n}.weight"), &[h], r);
            s.add(format!("{q}.{n}.bias"), &[h], r);
        }
        linear(&mut s, format!("{q}.attn.qkv"), 3 * h, h);
        linear(&mut s, format!("{q}.attn.proj"), h, h);
        linear(&mut s, format!("{q}.mlp.linear_fc1"), inter, h);
        linear(&mut s, format!("{q}.mlp.linear_fc2"), h, inter);
    }
    // Qwen3.5's encoder has no "deepstack" mergers (transformers builds none whatever
    // `deepstack_visual_indexes` says): one merger.
    let q = format!("{p}.merger");
    s.add(format!("{q}.norm.weight"), &[h], r);
    s.add(format!("{q}.norm.bias"), &[h], r);
    linear(&mut s, format!("{q}.linear_fc1"), merged, merged);
    linear(&mut s, format!("{q}.linear_fc2"), out, merged);
    s.0
}

/// Parameter counts of a model (elements, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ParamCounts {
    /// Every parameter the model builds (embeddings and LM head included).
    pub total: i64,
    /// `total` without the token embeddings and the LM head.
    pub non_embedding: i64,
    /// Routed expert weights (all experts of all layers).
    pub experts: i64,
    /// Parameters one token goes through: everything but the routed experts, plus
    /// `num_experts_per_tok` of each MoE layer's experts (embeddings and LM head included).
    pub active: i64,
    /// Checkpoint-only tensors ([`checkpoint_extras`]).
    pub extras: i64,
}

impl ParamCounts {
    /// Counts `specs` (from [`param_shapes`]) and `extras` (from [`checkpoint_extras`]).
    pub fn new(cfg: &Config, specs: &[ParamSpec], extras: &[ParamSpec]) -> Self {
        let sum = |f: &dyn Fn(&ParamSpec) -> bool| specs.iter().filter(|p| f(p)).map(ParamSpec::numel).sum();
        let total: i64 = sum(&|_| true);
        let embedding: i64 = sum(&|p| matches!(p.role, ParamRole::Embedding | ParamRole::LmHead));
        let experts: i64 = sum(&|p| p.is_expert());
        // Every expert of a layer has the same size, so top-k of E is k/E of the layer's share.
        let active_experts = if cfg.num_experts > 0 {
            experts / cfg.num_experts * cfg.num_experts_per_tok
        } else {
            0
        };
        ParamCounts {
            total,
            non_embedding: total - embedding,
            experts,
            active: total - experts + active_experts,
            extras: extras.iter().map(ParamSpec::numel).sum(),
        }
    }
}
