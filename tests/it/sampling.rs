//! The behaviour policy exactly: in train mode (`--harness-sampling pin`) a harness's own
//! temperature / top_p cannot bend rollout's sampling, and the override is recorded and counted.

use std::path::Path;
use std::sync::Arc;

use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::proxy::{HarnessSampling, Proxy, ProxyConfig};
use lego_rl::records::Generation;
use serde_json::{json, Value};
use tch::Device;

use super::proxy::chat;

async fn start(harness_sampling: HarnessSampling) -> (Proxy, String) {
    let backend = Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), Device::Cpu).unwrap());
    let mut cfg = ProxyConfig {
        harness_sampling,
        ..ProxyConfig::default()
    };
    cfg.sampling.max_tokens = Some(24);
    let proxy = Proxy::new(chat(), backend, cfg);
    let (addr, _) = proxy.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (proxy, format!("http://{addr}"))
}

/// mini-swe-agent's first request from the captured traffic, as it sent it.
fn harness_request() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/harness-traffic/mini-swe-agent/requests.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["path"], "/v1/chat/completions");
    serde_json::from_str(first["body_raw"].as_str().unwrap()).unwrap()
}

/// Sends `bodies` in order on one trial of a fresh proxy; returns the captures.
async fn captures(mode: HarnessSampling, bodies: &[Value]) -> Vec<Generation> {
    let (proxy, base) = start(mode).await;
    let (token, trial) = proxy.register_trial("sampling/0/0");
    let client = reqwest::Client::new();
    for body in bodies {
        let r = client
            .post(format!("{base}/t/{token}/v1/chat/completions"))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
    trial.generations()
}

/// A harness request with `temperature: 0.3, top_p: 0.5` in train mode is sampled at rollout's
/// settings (temperature 1, full vocabulary): the same tokens and log-probs as the request without
/// them, under the same seed; the ignored values are recorded on the generation. With `honor`
/// (what train mode did before pinning) the same request samples a different distribution.
#[tokio::test(flavor = "multi_thread")]
async fn pinned_sampling_ignores_a_harness_temperature_and_top_p_and_records_them() {
    let mut plain = harness_request();
    plain["seed"] = json!(5);
    assert!(plain.get("temperature").is_none() && plain.get("top_p").is_none());
    let mut bent = plain.clone();
    bent["temperature"] = json!(0.3);
    bent["top_p"] = json!(0.5);

    let pinned = captures(HarnessSampling::Pin, &[plain.clone(), bent.clone()]).await;
    let (reference, overridden) = (&pinned[0], &pinned[1]);
    assert!(
        reference.ignored_sampling.is_empty(),
        "{:?}",
        reference.ignored_sampling
    );
    assert_eq!(
        serde_json::to_value(&overridden.ignored_sampling).unwrap(),
        json!({"temperature": 0.3, "top_p": 0.5})
    );
    assert!(overridden.sampling_overridden());
    assert_eq!(
        (overridden.sampling.temperature, overridden.sampling.top_p),
        (Some(1.0), None)
    );
    assert_eq!(
        overridden.request["temperature"],
        json!(0.3),
        "the request is kept as sent"
    );
    assert_eq!(overridden.prompt_ids, reference.prompt_ids);
    assert_eq!(
        overridden.output_ids, reference.output_ids,
        "sampled at rollout's settings"
    );
    // The same distribution: log-probs equal up to summation order (the second prompt comes
    // from the prefix cache).
    let (a, b) = (
        overridden.logprobs.to_f32().unwrap(),
        reference.logprobs.to_f32().unwrap(),
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-4),
        "{a:?} vs {b:?}"
    );

    let honored = captures(HarnessSampling::Honor, &[bent]).await;
    assert!(honored[0].ignored_sampling.is_empty());
    assert_eq!(
        (honored[0].sampling.temperature, honored[0].sampling.top_p),
        (Some(0.3), Some(0.5))
    );
    assert_ne!(
        honored[0].output_ids, reference.output_ids,
        "at T = 0.3 over the nucleus the tiny model samples differently"
    );
}
