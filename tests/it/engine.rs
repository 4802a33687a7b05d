//! The embedded engine on the tiny Qwen3-MoE driven directly (no proxy): stop strings on sampled
//! output, and what stays exact when generations share the engine.

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::{Backend, FinishReason, GenerateRequest};
use lego_rl::records::Sampling;
use tch::Device;

use super::proxy::chat;

fn engine() -> EmbeddedBackend {
    EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap()
}

fn request(prompt: &str, max_tokens: u32, seed: u64) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: chat().encode(prompt).unwrap(),
        sampling: Sampling {
            temperature: Some(1.0),
            max_tokens: Some(max_tokens),
            seed: Some(seed),
            ..Default::default()
        },
        return_routing: true,
        ..Default::default()
    }
}

/// A stop string taken from a sampled output: rerunning with the same seed ends right at the token
/// that completes it, with the same tokens and log-probs as before up to there.
#[tokio::test(flavor = "multi_thread")]
async fn a_sampled_generation_ends_at_the_token_completing_a_stop_string() {
    let e = engine();
    let c = chat();
    let base = request(
        "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n",
        40,
        5,
    );
    let full = e.generate(base.clone()).await.unwrap();
    assert_eq!(full.output_ids.len(), 40, "no stop token in 40 random tokens");
    // The first token k ≥ 8 whose text ends with 3 characters not seen before it.
    let text = |n: usize| c.decode(&full.output_ids[..n], true).unwrap();
    let (k, stop) = (8..40)
        .find_map(|k| {
            let (before, upto) = (text(k), text(k + 1));
            let stop: String = upto
                .chars()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let fresh = upto.find(&stop) == Some(upto.len() - stop.len());
            (upto.len() > before.len() && stop.chars().count() == 3 && fresh && !stop.contains('\u{FFFD}'))
                .then_some((k, stop))
        })
        .unwrap_or_else(|| {
            panic!(
                "no token completes a fresh 3-character string: {:?} {:?}",
                text(40),
                full.output_ids
            )
        });
    let mut req = base.clone();
    req.sampling.stop = vec!["never appears \u{1F600}".into(), stop.clone()];
    let cut = e.generate(req).await.unwrap();
    assert_eq!(cut.finish_reason, FinishReason::Stop);
    assert_eq!(cut.output_ids, full.output_ids[..=k], "stop string {stop:?}");
    assert_eq!(cut.logprobs, full.logprobs[..=k]);
    let routing = cut.routing.expect("routing");
    assert_eq!(routing.tokens, base.prompt_ids.len() + k);
}
