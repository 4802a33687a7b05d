//! The embedded engine's parts of the GPU check (scripts/gpu/check.sh), which has only this
//! binary and a bare torch on the GPU machine: samples whose rollout log-probs and routing are
//! the engine's own captures (train-step then recomputes them: the rollout-vs-trainer agreement,
//! with and without routing replay), and decode throughput with one stream and with many.

use std::path::Path;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use tch::Device;

use crate::engine::embedded::{EmbeddedBackend, EngineOptions};
use crate::engine::{Backend, EngineError, GenerateOutput, GenerateRequest};
use crate::records::{LossMask, Packed, Record, Sample, Sampling};

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("starting the embedded engine on {ckpt}")]
    Start {
        ckpt: String,
        #[source]
        source: EngineError,
    },
    #[error("generating sequence {index}")]
    Generate {
        index: usize,
        #[source]
        source: EngineError,
    },
    #[error("reading {path}: {message}")]
    Config { path: String, message: String },
    #[error("sequence {index}: the engine's routing covers positions {start}..{end}, not 0..{want}")]
    Routing {
        index: usize,
        start: usize,
        end: usize,
        want: usize,
    },
}

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub sequences: usize,
    pub prompt_tokens: usize,
    pub new_tokens: u32,
    pub seed: u64,
}

fn engine(ckpt: &Path, device: Device) -> Result<EmbeddedBackend, ProbeError> {
    // No prefix cache: every prompt is prefilled whole, so each capture's routing starts at 0.
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        ..EngineOptions::default()
    };
    EmbeddedBackend::start_with(ckpt, device, opts).map_err(|source| ProbeError::Start {
        ckpt: ckpt.display().to_string(),
        source,
    })
}

/// Random prompts (seeded, within the vocabulary) and sampling requests at temperature 1.
fn requests(ckpt: &Path, shape: Shape) -> Result<Vec<GenerateRequest>, ProbeError> {
    let path = ckpt.join("config.json");
    let cfg = crate::model::Config::from_file(&path).map_err(|e| ProbeError::Config {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(shape.seed);
    Ok((0..shape.sequences)
        .map(|i| GenerateRequest {
            prompt_ids: (0..shape.prompt_tokens)
                .map(|_| rng.gen_range(0..cfg.vocab_size as u32))
                .collect(),
            sampling: Sampling {
                temperature: Some(1.0),
                max_tokens: Some(shape.new_tokens),
                seed: Some(shape.seed + i as u64),
                ..Default::default()
            },
            return_routing: true,
            ..Default::default()
        })
        .collect())
}

/// Generates `shape.sequences` sequences (all in flight at once) and turns each into a sample:
/// the captured log-probs as rollout log-probs, the captured routing for positions 0..T−1, in
/// groups of 4 with rewards 1, 0, 1, 0.
pub async fn engine_samples(ckpt: &Path, device: Device, shape: Shape) -> Result<Vec<Sample>, ProbeError> {
    let backend = engine(ckpt, device)?;
    let reqs = requests(ckpt, shape)?;
    let outs = futures::future::join_all(reqs.iter().map(|r| backend.generate(r.clone()))).await;
    let mut samples = Vec::new();
    for (index, (req, out)) in reqs.iter().zip(outs).enumerate() {
        let out = out.map_err(|source| ProbeError::Generate { index, source })?;
        samples.push(to_sample(index, req, out)?);
    }
    Ok(samples)
}

fn to_sample(index: usize, req: &GenerateRequest, out: GenerateOutput) -> Result<Sample, ProbeError> {
    let prompt = req.prompt_ids.len();
    let mut tokens = req.prompt_ids.clone();
    tokens.extend(&out.output_ids);
    let mask: Vec<bool> = (0..tokens.len()).map(|t| t >= prompt).collect();
    let rows = tokens.len() - 1;
    let routing = match out.routing {
        None => None,
        Some(r) if r.start == 0 && r.tokens >= rows => {
            let w = r.layers * r.top_k;
            Some(Packed::from_experts(
                vec![rows, r.layers, r.top_k],
                &r.experts[..rows * w],
            ))
        }
        Some(r) => {
            return Err(ProbeError::Routing {
                index,
                start: r.start,
                end: r.start + r.tokens,
                want: rows,
            })
        }
    };
    let group = (index / 4) as u64;
    Ok(Sample {
        schema: Sample::SCHEMA.into(),
        id: format!("probe-{index}#0.0"),
        trajectory_id: format!("probe-{index}"),
        task_id: format!("probe-task-{group}"),
        group_id: group,
        sample_index: (index % 4) as u32,
        thread: 0,
        segment: 0,
        token_ids: tokens,
        loss_mask: LossMask::from_dense(&mask),
        rollout_logprobs: Packed::f32_vec(&out.logprobs),
        // Temperature 1 over the whole vocabulary: the model's own distribution.
        sampling: Vec::new(),
        routing,
        reward: if index % 2 == 0 { 1.0 } else { 0.0 },
        weight: 1.0,
        policy_version: 0,
        policy_versions: Vec::new(),
        metadata: Default::default(),
    })
}

/// Decode throughput: output tokens per second of `streams` requests sent at once (after a
/// warm-up with the same requests), prefill included, as a user of the engine sees it.
pub async fn decode_rate(ckpt: &Path, device: Device, shape: Shape) -> Result<f64, ProbeError> {
    let backend = engine(ckpt, device)?;
    let reqs = requests(ckpt, shape)?;
    let run = || futures::future::join_all(reqs.iter().map(|r| backend.generate(r.clone())));
    for (index, out) in run().await.into_iter().enumerate() {
        out.map_err(|source| ProbeError::Generate { index, source })?;
    }
    let t = Instant::now();
    let mut tokens = 0;
    for (index, out) in run().await.into_iter().enumerate() {
        tokens += out
            .map_err(|source| ProbeError::Generate { index, source })?
            .output_ids
            .len();
    }
    Ok(tokens as f64 / t.elapsed().as_secs_f64())
}
