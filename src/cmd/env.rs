//! `lego-rl env`: what this binary was built with and what it can use here.

use std::io::Write;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::device::report::{collect, ENV_SCHEMA};
use crate::settings::GlobalArgs;

/// Report the torch, CUDA and NCCL this binary uses, the GPUs and the threads.
///
/// Like `torch.utils.collect_env` or `vllm collect-env`: torch's version and the CUDA it was built
/// for, the libtorch folder this process loaded (LD_LIBRARY_PATH first, then the path baked in at
/// build time), whether libtorch_cuda and the c10d shim's NCCL path were built in, whether CUDA
/// and NCCL are usable, each GPU with its memory (from the NVIDIA driver), and torch's intra-op
/// thread count. Always exits 0 when it could report: a machine without a GPU says so.
///
/// Example:
///   lego-rl env
///   lego-rl env --json | jq .cuda_available
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct EnvArgs {
    /// One JSON object on stdout (schema `lego-rl/env/v1`) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `env`.
pub fn run(args: EnvArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let report = collect();
    let text = if args.json {
        let mut s = serde_json::to_string(&report).context("serializing the env report")?;
        s.push('\n');
        s
    } else {
        report.table()
    };
    debug_assert_eq!(report.schema, ENV_SCHEMA);
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("writing to stdout")?;
    Ok(Outcome::Ok)
}
