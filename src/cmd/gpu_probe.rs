//! `lego-rl gpu-probe` (hidden): the embedded engine's steps of scripts/gpu/check.sh, which runs
//! on a GPU machine that has this binary and a bare torch but no Rust toolchain.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::Outcome;
use crate::device::probe::{decode_rate, engine_samples, Shape};
use crate::io::AtomicWriter;
use crate::settings::GlobalArgs;

/// Engine probes for the GPU check (for scripts/gpu/check.sh).
#[derive(Args, Debug)]
pub struct GpuProbeArgs {
    #[command(subcommand)]
    pub what: Probe,
    /// Checkpoint folder (config.json + safetensors) the embedded engine serves.
    #[arg(long, global = true, default_value = ".")]
    pub checkpoint: PathBuf,
    /// Device of the engine: cpu, cuda or cuda:N.
    #[arg(long, global = true, default_value = "cpu")]
    pub device: String,
    /// Sequences generated at once.
    #[arg(long, global = true, default_value_t = 8)]
    pub sequences: usize,
    /// Random prompt tokens per sequence.
    #[arg(long, global = true, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// Tokens generated per sequence.
    #[arg(long, global = true, default_value_t = 64)]
    pub new_tokens: u32,
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
}

/// Which probe.
#[derive(Subcommand, Debug)]
pub enum Probe {
    /// Samples (zstd JSONL) whose rollout log-probs and routing are the engine's captures.
    Samples {
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Decode throughput: prints `{"streams":N,"tokens_per_second":X}`.
    Decode,
    /// Prints a JSONL file's lines, zstd or plain (the GPU machine's Python has no zstandard).
    Cat { file: PathBuf },
}

/// Runs `gpu-probe`.
pub fn run(args: GpuProbeArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if let Probe::Cat { file } = &args.what {
        let mut lines = crate::io::open_lines(file, crate::io::TornTail::Error)?;
        let mut out = std::io::stdout().lock();
        while let Some((_, line)) = lines.next_line()? {
            writeln!(out, "{line}").with_context(|| format!("writing {}", file.display()))?;
        }
        return Ok(Outcome::Ok);
    }
    let device = crate::device::resolve(&args.device)?;
    let shape = Shape {
        sequences: args.sequences.max(1),
        prompt_tokens: args.prompt_tokens.max(1),
        new_tokens: args.new_tokens.max(1),
        seed: args.seed,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match args.what {
        Probe::Samples { output } => {
            let samples = rt.block_on(engine_samples(&args.checkpoint, device, shape))?;
            let mut w = AtomicWriter::create(&output)?;
            w.write_all(&samples)?;
            w.finish()?;
        }
        // Printed above, before a device or a runtime is needed.
        Probe::Cat { .. } => {}
        Probe::Decode => {
            let rate = rt.block_on(decode_rate(&args.checkpoint, device, shape))?;
            println!(
                "{}",
                serde_json::json!({"streams": shape.sequences, "tokens_per_second": rate})
            );
        }
    }
    Ok(Outcome::Ok)
}
