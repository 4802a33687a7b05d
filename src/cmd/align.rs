//! `lego-rl align`: message-level alignment of trajectories into training samples.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::align::{Files, MatchMode, RunOptions, Settings};
use crate::settings::GlobalArgs;

/// Align trajectories into token-exact training samples.
///
/// System, user and tool-result messages must match verbatim between consecutive requests of a
/// thread; assistant turns link to their captured generation by tool-call id, else by exact
/// content. Samples use the captured tokens only; what cannot be aligned is dropped and counted.
/// Threads (main agent, side requests, sub-agents) and segments (a rewritten or compacted
/// history starts one) each give their own samples; a generation shared by several segments is
/// trained once. Output is in input order and identical for every `-j`. Trajectories of groups
/// that `rollout --min-informative-groups` marked uninformative (no reward variance) are skipped
/// and counted (`skipped_uninformative` in the stats). Each trajectory's stats record names its
/// harness, the total splits every count by harness (`by_harness`), and each sample carries its
/// trajectory's harness in `metadata.harness` (train-step splits its figures by it).
///
/// Example:
///   lego-rl align -i run/trajectories/step-000000.jsonl.zst -o run/samples/step-000000.jsonl.zst \
///     --stats run/samples/step-000000.stats.jsonl.zst --model run/checkpoints/step-000000
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct AlignArgs {
    /// Trajectories (zstd JSONL); several files are read in order.
    #[arg(short, long, num_args = 1.., default_value = "-")]
    pub input: Vec<PathBuf>,
    /// Samples (zstd JSONL).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Alignment statistics: one record per trajectory, then the total.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// How an echoed assistant turn is compared with its captured generation.
    #[arg(long = "match", value_enum, default_value_t = MatchMode::Strict)]
    pub match_mode: MatchMode,
    /// Model folder with tokenizer.json (the policy's): decodes captured outputs so echoed turns
    /// are compared by content too (and re-serializations counted); without it turns link by
    /// tool-call id and by the proxy's token splice only.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Worker threads (trajectories are aligned in parallel) [default: the available cores].
    #[arg(short, long)]
    pub jobs: Option<usize>,
}

/// What the flags resolve to, checked before any work starts (a missing second input would
/// otherwise surface only after the first was aligned).
struct Resolved {
    files: Files,
    settings: Settings,
    options: RunOptions,
}

impl Resolved {
    fn from_args(args: AlignArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        if args.input.iter().filter(|p| crate::io::is_stdio(p)).count() > 1 {
            anyhow::bail!("stdin (`-`) can be given once as input");
        }
        // `exists`, not `is_file`: a FIFO such as `-i <(zstd -dc …)` or /dev/stdin is input too.
        for p in args.input.iter().filter(|p| !crate::io::is_stdio(p)) {
            anyhow::ensure!(p.exists(), "-i {}: no such file", p.display());
            anyhow::ensure!(
                !p.is_dir(),
                "-i {}: a directory, not a file of trajectories",
                p.display()
            );
        }
        anyhow::ensure!(args.jobs != Some(0), "--jobs 0: need at least 1");
        if let Some(stats) = &args.stats {
            if crate::io::is_stdio(stats) && crate::io::is_stdio(&args.output) {
                anyhow::bail!("--stats -: the samples already go to stdout; give -o FILE or --stats FILE");
            }
            if !crate::io::is_stdio(stats) && stats == &args.output {
                anyhow::bail!("--stats {}: the same file as -o", stats.display());
            }
        }
        let settings = Settings::new(args.match_mode, args.model.as_deref())?;
        let jobs = args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        Ok(Resolved {
            files: Files {
                inputs: args.input,
                output: args.output,
                stats: args.stats,
            },
            settings,
            options: RunOptions {
                jobs,
                read: global.read_options(),
                progress: crate::ui::progress_enabled(global),
            },
        })
    }
}

/// Runs `align`.
pub fn run(args: AlignArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let Resolved {
        files,
        settings,
        options,
    } = Resolved::from_args(args, global)?;
    let total = crate::align::run(&files, &settings, options)
        .with_context(|| format!("aligning into {}", files.output.display()))?;
    tracing::info!(
        trajectories = total.trajectories,
        samples = total.samples,
        aligned_turns = total.aligned_turns,
        dropped_turns = total.dropped_turns,
        tool_call_mismatches = total.tool_call_mismatches,
        resolved_by_id = total.mismatches_resolved_by_id,
        skipped_uninformative = total.skipped_uninformative,
        "aligned"
    );
    if total.by_harness.len() > 1 {
        for (harness, h) in &total.by_harness {
            tracing::info!(
                harness = harness.as_str(),
                trajectories = h.trajectories,
                samples = h.samples,
                aligned_turns = h.aligned_turns,
                dropped_turns = h.dropped_turns,
                dropped_tokens = h.dropped_tokens,
                "aligned, by harness"
            );
        }
    }
    Ok(Outcome::Ok)
}
