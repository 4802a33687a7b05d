//! The vLLM and SGLang clients against a small HTTP server that answers in exactly the shapes
//! those servers document (field names cited in vllm.rs / sglang.rs).

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

use super::*;
use crate::records::Sampling;

const LAYERS: usize = 2;
const TOP_K: usize = 2;

fn expert(pos: usize, layer: usize, k: usize) -> u16 {
    ((pos * 7 + layer * 3 + k) % 8) as u16
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// vLLM `/v1/completions`: echoes prompt.len() new tokens (ids prompt[i]+1), whole-sequence
/// routing minus the last token as a base64 .npy.
async fn vllm_completions(Json(req): Json<Value>) -> Json<Value> {
    assert_eq!(req["return_token_ids"], true);
    assert_eq!(req["return_tokens_as_token_ids"], true);
    assert!(
        req["max_tokens"].as_u64().is_some(),
        "max_tokens must always be sent (vLLM defaults to 16)"
    );
    let prompt: Vec<u64> = req["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let out: Vec<u64> = prompt.iter().map(|p| p + 1).collect();
    let rows = prompt.len() + out.len() - 1;
    let data: Vec<u16> = (0..rows)
        .flat_map(|t| (0..LAYERS).flat_map(move |l| (0..TOP_K).map(move |k| expert(t, l, k))))
        .collect();
    Json(json!({
        "id": "cmpl-1", "object": "text_completion", "model": "tiny",
        "choices": [{
            "index": 0, "text": "…", "finish_reason": "length",
            "token_ids": out,
            "logprobs": {
                "tokens": out.iter().map(|i| format!("token_id:{i}")).collect::<Vec<_>>(),
                "token_logprobs": out.iter().map(|i| -(*i as f64) / 100.0).collect::<Vec<_>>(),
            },
            "routed_experts": b64(&npy::write_u16(&[rows, LAYERS, TOP_K], &data, true)),
        }],
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": out.len()},
    }))
}

/// SGLang `/generate`: two new tokens, flat int32 routing from position 0.
async fn sglang_generate(Json(req): Json<Value>) -> Json<Value> {
    assert_eq!(req["return_logprob"], true);
    assert_eq!(req["sampling_params"]["skip_special_tokens"], false);
    let prompt = req["input_ids"].as_array().unwrap().len();
    let out = [11u64, 151645];
    let rows = prompt + out.len() - 1;
    let flat: Vec<u8> = (0..rows)
        .flat_map(|t| (0..LAYERS).flat_map(move |l| (0..TOP_K).map(move |k| expert(t, l, k) as i32)))
        .flat_map(|e| e.to_le_bytes())
        .collect();
    Json(json!({
        "text": "x<|im_end|>",
        "output_ids": out,
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 151645},
            "output_token_logprobs": [[-0.5, 11, "x"], [-0.25, 151645, null]],
            "routed_experts": b64(&flat),
            "routed_experts_start_len": 0,
            "e2e_latency": 0.01,
        },
    }))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn request(prompt: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        sampling: Sampling {
            max_tokens: Some(8),
            temperature: Some(1.0),
            ..Default::default()
        },
        stop_token_ids: vec![151645],
        return_routing: true,
        forced_output: None,
    }
}

#[tokio::test]
async fn vllm_client_reads_tokens_logprobs_and_npy_routing() {
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "tiny"}]})) }),
        )
        .route("/v1/completions", post(vllm_completions));
    let addr = serve(app).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}/"));
    let out = backend.generate(request(vec![5, 6, 7])).await.unwrap();
    assert_eq!(out.output_ids, vec![6, 7, 8]);
    assert_eq!(out.logprobs, vec![-0.06, -0.07, -0.08]);
    assert_eq!(out.finish_reason, FinishReason::Length);
    let r = out.routing.unwrap();
    assert_eq!((r.start, r.tokens, r.layers, r.top_k), (0, 5, LAYERS, TOP_K));
    assert_eq!(r.experts[(4 * LAYERS + 1) * TOP_K + 1], expert(4, 1, 1));
    // This server mounts no dev-mode routes, as `vllm serve` without VLLM_SERVER_DEV_MODE=1.
    let err = backend.reload(&checkpoint("ckpt")).await.unwrap_err().to_string();
    assert!(err.contains("/pause?mode=wait"), "{err}");
    assert!(err.contains("answered 404"), "{err}");
    assert!(err.contains("VLLM_SERVER_DEV_MODE=1"), "{err}");
}

/// Every request a fake vLLM dev-mode server received: path with query, and body.
type DevLog = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// vLLM's dev-mode endpoints, answering in the shapes of vllm/entrypoints/serve/{rlhf,rpc,cache}/
/// api_router.py; `/collective_rpc` answers `rpc_status` with `rpc_body`.
fn vllm_dev_server(log: DevLog, rpc_status: u16, rpc_body: &'static str) -> Router {
    vllm_dev_server_with(log, rpc_status, rpc_body, "")
}

/// [`vllm_dev_server`] whose `/reset_prefix_cache` answers `reset_body`.
fn vllm_dev_server_with(
    log: DevLog,
    rpc_status: u16,
    rpc_body: &'static str,
    reset_body: &'static str,
) -> Router {
    use axum::extract::State;
    use axum::http::{StatusCode, Uri};
    async fn record(State(log): State<DevLog>, uri: Uri, body: String) -> (StatusCode, String) {
        log.lock().unwrap().push((uri.to_string(), body));
        let answer = match uri.path() {
            "/pause" => r#"{"status":"paused"}"#,
            "/resume" => r#"{"status":"resumed"}"#,
            _ => "",
        };
        (StatusCode::OK, answer.to_string())
    }
    Router::new()
        .route("/pause", post(record))
        .route(
            "/reset_prefix_cache",
            post(move |State(log): State<DevLog>, uri: Uri| async move {
                log.lock().unwrap().push((uri.to_string(), String::new()));
                reset_body
            }),
        )
        .route("/resume", post(record))
        .route(
            "/collective_rpc",
            post(
                move |State(log): State<DevLog>, uri: Uri, body: String| async move {
                    log.lock().unwrap().push((uri.to_string(), body));
                    (StatusCode::from_u16(rpc_status).unwrap(), rpc_body)
                },
            ),
        )
        .with_state(log)
}

/// The logged requests with their bodies parsed (`Null` for none).
fn sent(log: &DevLog) -> Vec<(String, Value)> {
    log.lock()
        .unwrap()
        .iter()
        .map(|(uri, body)| {
            let v = if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(body).unwrap()
            };
            (uri.clone(), v)
        })
        .collect()
}

#[tokio::test]
async fn vllm_reload_pauses_loads_resets_prefix_cache_and_resumes() {
    let log = DevLog::default();
    let addr = serve(vllm_dev_server(log.clone(), 200, r#"{"results":[null,null]}"#)).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}/"));
    let ckpt = checkpoint("step-000001");
    backend.reload(&ckpt).await.unwrap();
    assert_eq!(
        sent(&log),
        vec![
            (
                "/pause?mode=wait&wait_for_inflight_requests=true".to_string(),
                Value::Null
            ),
            (
                "/collective_rpc".to_string(),
                json!({"method": "reload_weights", "kwargs": {"weights_path": ckpt.to_str().unwrap()}}),
            ),
            ("/reset_prefix_cache".to_string(), Value::Null),
            ("/resume".to_string(), Value::Null),
        ]
    );

    // The server resolves paths against its own working directory, so a relative one is sent
    // absolute; an empty 200 (the engine returned nothing) is a success too.
    let log = DevLog::default();
    let addr = serve(vllm_dev_server(log.clone(), 200, "")).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}"));
    backend
        .reload(std::path::Path::new("testdata/models/tiny-qwen3"))
        .await
        .unwrap();
    let want = std::env::current_dir()
        .unwrap()
        .join("testdata/models/tiny-qwen3");
    assert_eq!(sent(&log)[1].1["kwargs"]["weights_path"], want.to_str().unwrap());
    assert_eq!(sent(&log).len(), 4);
}

#[tokio::test]
async fn vllm_reload_failure_leaves_the_server_paused_and_says_why() {
    // What a vLLM older than vllm-project/vllm#32133 answers: its reload_weights takes no arguments.
    let log = DevLog::default();
    let answer = r#"{"error":{"message":"Worker.reload_weights() got an unexpected keyword argument 'weights_path'","code":500}}"#;
    let addr = serve(vllm_dev_server(log.clone(), 500, answer)).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}"));
    let err = backend
        .reload(&checkpoint("step-000001"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/collective_rpc answered HTTP 500"), "{err}");
    assert!(err.contains("stays paused"), "{err}");
    assert!(err.contains("vllm-project/vllm#32133"), "{err}");
    let paths: Vec<String> = sent(&log).into_iter().map(|(uri, _)| uri).collect();
    assert_eq!(
        paths,
        [
            "/pause?mode=wait&wait_for_inflight_requests=true",
            "/collective_rpc"
        ],
        "no cache reset and no resume after a failed load"
    );

    // A 200 that is not the documented `{"results": [...]}` is not taken for a reload either.
    let log = DevLog::default();
    let addr = serve(vllm_dev_server(log.clone(), 200, r#"{"detail":"?"}"#)).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}"));
    let err = backend.reload(&checkpoint("ckpt")).await.unwrap_err().to_string();
    assert!(err.contains("no `results` list"), "{err}");
    assert_eq!(sent(&log).len(), 2);

    // `{"success": false}` from /reset_prefix_cache: old-weight KV would be reused.
    let log = DevLog::default();
    let addr = serve(vllm_dev_server_with(
        log.clone(),
        200,
        "",
        r#"{"success": false}"#,
    ))
    .await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}"));
    let err = backend.reload(&checkpoint("ckpt")).await.unwrap_err().to_string();
    assert!(err.contains("prefix cache was not reset"), "{err}");
    assert_eq!(sent(&log).len(), 3, "no resume");

    // A directory without a checkpoint never reaches the server (vLLM would take it for a Hub
    // repo id, fail, and die on the next request).
    let log = DevLog::default();
    let addr = serve(vllm_dev_server(log.clone(), 200, "")).await;
    let backend = vllm::VllmBackend::new(&format!("http://{addr}"));
    let missing = checkpoint("ckpt").join("missing");
    let err = backend.reload(&missing).await.unwrap_err().to_string();
    assert!(err.contains("is not a checkpoint"), "{err}");
    assert!(sent(&log).is_empty());
}

/// A directory with a `config.json` (all a reload checks before it calls the server).
fn checkpoint(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("lego-rl-engine-tests-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    dir
}

#[tokio::test]
async fn sglang_client_reads_triples_and_flat_routing_and_reloads() {
    let app = Router::new().route("/generate", post(sglang_generate)).route(
        "/update_weights_from_disk",
        post(|Json(v): Json<Value>| async move {
            Json(json!({"success": v["model_path"] == "/ckpt/step-1", "message": "ok"}))
        }),
    );
    let addr = serve(app).await;
    let backend = sglang::SglangBackend::new(
        &format!("http://{addr}"),
        Some(RoutingShape {
            layers: LAYERS,
            top_k: TOP_K,
        }),
    );
    let out = backend.generate(request(vec![1, 2, 3, 4])).await.unwrap();
    assert_eq!(out.output_ids, vec![11, 151645]);
    assert_eq!(out.logprobs, vec![-0.5, -0.25]);
    // SGLang's log-probs are the model's own whatever the sampling: said so, so that align drops
    // a tempered or truncated turn instead of training it against the wrong behaviour policy.
    assert!(!out.processed_logprobs);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    let r = out.routing.unwrap();
    assert_eq!((r.start, r.tokens), (0, 5));
    assert_eq!(r.experts[(3 * LAYERS) * TOP_K], expert(3, 0, 0));
    backend
        .reload(std::path::Path::new("/ckpt/step-1"))
        .await
        .unwrap();
    assert!(backend.reload(std::path::Path::new("/other")).await.is_err());
}

#[tokio::test]
async fn server_errors_and_unreachable_servers_are_reported() {
    let app = Router::new().route(
        "/generate",
        post(|| async {
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "CUDA out of memory",
            )
        }),
    );
    let addr = serve(app).await;
    let backend = sglang::SglangBackend::new(&format!("http://{addr}"), None);
    let err = backend.generate(request(vec![1])).await.unwrap_err();
    assert!(
        matches!(&err, EngineError::Status { status: 500, body, .. } if body.contains("out of memory")),
        "{err}"
    );
    // A port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let backend = vllm::VllmBackend::new(&format!("http://{dead}"));
    let err = backend.generate(request(vec![1])).await.unwrap_err();
    assert!(matches!(err, EngineError::Unavailable { .. }), "{err}");
}

#[test]
fn npy_round_trip_and_errors() {
    let data: Vec<u16> = (0..24).collect();
    for as_u8 in [true, false] {
        let bytes = npy::write_u16(&[3, 4, 2], &data, as_u8);
        assert_eq!(
            bytes.len() % 64,
            (24 * if as_u8 { 1 } else { 2 }) % 64,
            "header is 64-byte aligned"
        );
        let arr = npy::parse(&bytes).unwrap();
        assert_eq!(arr.shape, vec![3, 4, 2]);
        assert_eq!(arr.data, (0..24).collect::<Vec<u32>>());
    }
    assert!(npy::parse(b"not npy at all").is_err());
    let mut short = npy::write_u16(&[3, 4, 2], &data, false);
    short.truncate(short.len() - 1);
    assert!(npy::parse(&short).unwrap_err().contains("needs"));
}
