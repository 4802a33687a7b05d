//! `lego-rl report`: CSV tables, a self-contained HTML report, and a live trajectory UI.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::cli::GlobalArgs;
use crate::report::advisories::Thresholds;
use crate::report::{serve, write_static, StaticSettings};

/// Default address of the live UI (loopback only: the page shows prompts and code).
pub const DEFAULT_BIND: &str = "127.0.0.1:8470";

/// Write CSV tables and an HTML report of a run, or serve it live.
///
/// Static mode (`-o OUT`) writes OUT/index.html — one self-contained file (inline CSS, JS and
/// SVG plots; no network) — and OUT/steps.csv, tasks.csv, harnesses.csv, terminations.csv.
/// The page embeds summaries of every step and the full detail (messages, tool calls and
/// outputs, grader, stages, per-token log-prob differences) of at most `--max-trajectories`
/// trajectories, spread over the trajectory files. Open one with `index.html#traj=<id>`.
///
/// Live mode (`--serve`) serves the same page read-only on `--bind` (loopback by default) with
/// JSON endpoints `/api/summary` and `/api/trajectory?id=<id>`; the page polls every few
/// seconds and follows files that rollout, train-step and validate are still appending to.
///
/// Behaviour diagnostics (re-read after edit, files viewed before the first edit, success
/// after a failed command) are inferred from the OpenAI/Anthropic requests the proxy captured;
/// the rules are in the page's "Behaviour" section and in src/report/behaviour.rs.
///
/// Run-health advisories are the soft layer under `validate`'s gates: warnings, per step, when a
/// figure crosses its threshold while the gates may still pass. They head the page and the live
/// UI and go to OUT/advisories.json. Defaults (change with `--advisory NAME=VALUE`, switch one
/// off with `NAME=off`):
///   zero_variance_group_fraction >= 0.5   truncated_fraction >= 0.25
///   infra_failure_fraction >= 0.05        malformed_tool_call_rate >= 0.1
///   staleness_mean >= 1.5                 logprob_pearson < 0.995
///   prefix_cache_hit_rate < 0.5           audit (any audit kind's trajectory fraction) > 0
///   response_tokens_growth >= 1.5 (over the run's first steps; from 3 steps on)
///   logprob_pearson_decline >= 0.002 (below the best of the 3 previous steps; from 3 steps on)
/// `audit:KIND=VALUE` sets one audit kind's threshold.
///
/// Example:
///   lego-rl report run/ -o run/report/
///   lego-rl report run/ -o run/report/ --advisory truncated_fraction=0.1 --advisory audit=off
///   lego-rl report run/ --serve --bind 127.0.0.1:8470
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct ReportArgs {
    /// Run directory.
    pub run: PathBuf,
    /// Output directory for index.html and the CSV files (default RUN/report).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Trajectories whose full detail the static page embeds.
    #[arg(long, default_value_t = 200)]
    pub max_trajectories: usize,
    /// Serve the live UI instead of writing files.
    #[arg(long, conflicts_with = "output")]
    pub serve: bool,
    /// Address to serve on (port 0 picks a free port; the address is printed on stdout).
    #[arg(long, default_value = DEFAULT_BIND, requires = "serve")]
    pub bind: String,
    /// Override a run-health advisory threshold: NAME=VALUE or NAME=off (repeatable; see above).
    #[arg(long = "advisory", value_name = "NAME=VALUE")]
    pub advisories: Vec<String>,
}

/// Runs `report`.
pub fn run(args: ReportArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if !args.run.is_dir() {
        anyhow::bail!("{}: not a directory", args.run.display());
    }
    let thresholds = Thresholds::default()
        .with_overrides(&args.advisories)
        .map_err(anyhow::Error::msg)?;
    if args.serve {
        let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        rt.block_on(serve::serve(&args.run, &args.bind, thresholds, |addr| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "serving {} on http://{addr}/", args.run.display());
            let _ = out.flush();
        }))?;
        return Ok(Outcome::Ok);
    }
    let settings = StaticSettings {
        output: args.output.clone().unwrap_or_else(|| args.run.join("report")),
        run: args.run,
        max_trajectories: args.max_trajectories,
        strict: global.strict,
        advisories: thresholds,
    };
    let w = write_static(&settings)?;
    let mut out = std::io::stdout().lock();
    for f in &w.files {
        writeln!(out, "{}", f.display())?;
    }
    tracing::info!(
        "{} trajectories summarized, {} embedded in detail",
        w.trajectories,
        w.embedded
    );
    Ok(Outcome::Ok)
}
