//! Tests of config.json parsing (sibling file of config.rs).

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
    o.insert(
        "rope_parameters".into(),
        serde_json::json!({"rope_type":"default","rope_theta":1000000.0}),
    );
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
    let err = Config::from_json(r#"{"model_type":"qwen3","vocab_size":10,"rope_theta":1e4,"hidden_size":8}"#)
        .unwrap_err();
    assert!(err.contains("`num_attention_heads`"), "{err}");
    let err =
        Config::from_json(r#"{"model_type":"qwen3","rope_theta":1e4,"rope_scaling":{"rope_type":"yarn"}}"#)
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

fn real(name: &str) -> Config {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/models/configs")
        .join(name);
    Config::from_file(&path).unwrap()
}

#[test]
fn qwen35_nested_text_config_resolves() {
    let c = real("qwen3.5-35b-a3b.json");
    assert_eq!(c.model_type, "qwen3_5_moe");
    assert_eq!(c.text_prefix, "model.language_model");
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.head_dim), (2048, 40, 256));
    assert_eq!(c.rotary_dim(), 64, "partial_rotary_factor 0.25 of head_dim 256");
    assert_eq!(c.rope_theta, 1e7);
    assert!(c.attn_output_gate && c.norm_offset && c.norm_topk_prob);
    assert_eq!(
        (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim
        ),
        (16, 32, 128, 128)
    );
    assert_eq!(
        (
            c.num_experts,
            c.num_experts_per_tok,
            c.shared_expert_intermediate_size
        ),
        (256, 8, 512)
    );
    let full: Vec<usize> = (0..40)
        .filter(|&i| c.layer_types[i] == LayerType::FullAttention)
        .collect();
    assert_eq!(full, vec![3, 7, 11, 15, 19, 23, 27, 31, 35, 39]);
    assert_eq!(c.moe_layers().len(), 40);
    assert!(!c.tie_word_embeddings);
}

#[test]
fn qwen3_next_interval_and_fused_projections_resolve() {
    let c = real("qwen3-next-80b-a3b.json");
    assert_eq!(c.text_prefix, "model");
    assert!(c.fused_linear_proj && c.attn_output_gate && c.norm_offset);
    assert_eq!(c.rotary_dim(), 64);
    assert_eq!(
        c.layer_types
            .iter()
            .filter(|&&t| t == LayerType::FullAttention)
            .count(),
        12
    );
    assert_eq!(c.layer_types[3], LayerType::FullAttention);
    assert_eq!(c.layer_types[4], LayerType::LinearAttention);
    assert_eq!((c.num_experts, c.num_experts_per_tok), (512, 10));
}

#[test]
fn unsupported_families_and_bad_layer_types_are_named() {
    let err = Config::from_json(r#"{"model_type":"llama","rope_theta":1e4}"#).unwrap_err();
    assert!(
        err.contains("`llama` is not supported") && err.contains("qwen3_next"),
        "{err}"
    );
    let err = Config::from_json(r#"{"model_type":"qwen3","architectures":["Qwen3ForTokenClassification"]}"#)
        .unwrap_err();
    assert!(
        err.contains("`Qwen3ForTokenClassification` is not supported"),
        "{err}"
    );
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/models/configs/qwen3-next-80b-a3b.json"),
    )
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["layer_types"] = serde_json::json!(["linear_attention", "full_attention"]);
    let err = Config::from_json(&v.to_string()).unwrap_err();
    assert!(
        err.contains("`layer_types` has 2 entries, `num_hidden_layers` is 48"),
        "{err}"
    );
    v.as_object_mut().unwrap().remove("layer_types");
    v.as_object_mut().unwrap().remove("linear_num_value_heads");
    let err = Config::from_json(&v.to_string()).unwrap_err();
    assert!(
        err.contains("missing required key `linear_num_value_heads`"),
        "{err}"
    );
}
