//! `lego-rl align`: message-level alignment of trajectories into training samples.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Align trajectories into token-exact training samples.
///
/// System, user and tool-result messages must match verbatim between consecutive requests of a
/// thread; assistant turns link to their captured generation by tool-call id, else by exact
/// content. Samples use the captured tokens only; what cannot be aligned is dropped and counted.
///
/// Example:
///   lego-rl align -i run/trajectories/step-000000.jsonl.zst -o run/samples/step-000000.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct AlignArgs {
    /// Trajectories (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub input: PathBuf,
    /// Samples (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

/// Runs `align`.
pub fn run(_args: AlignArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("align").into())
}
