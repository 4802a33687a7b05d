//! `lego-rl report`: CSV tables, a self-contained HTML report, and a live trajectory UI.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::io::{ReadOptions, TornTail};
use crate::report::advisories::Thresholds;
use crate::report::assist::ask::Assist;
use crate::report::assist::review::{review, ReviewSettings};
use crate::report::assist::summarize::{summarize, SummarizeSettings};
use crate::report::assist::{Assistant, AssistantSettings, AssistantSpec, API_KEY_ENV};
use crate::report::serve::LiveOptions;
use crate::report::{serve, write_static, StaticSettings};
use crate::settings::GlobalArgs;
use crate::validate::run::RunFiles;

/// Default address of the live UI (loopback only: the page shows prompts and code).
pub const DEFAULT_BIND: &str = "127.0.0.1:8470";

/// Write CSV tables and an HTML report of a run, or serve it live.
///
/// Static mode (`-o OUT`) writes OUT/index.html — one self-contained file (inline CSS, JS and
/// SVG plots; no network) — and OUT/steps.csv, staleness.csv, tasks.csv, harnesses.csv,
/// terminations.csv, harness_steps.csv (per step and harness: reward, infra failures, mixed
/// groups, align's dropped turns and tokens, train-step's log-prob Pearson on that batch,
/// terminations, audit kinds; a run that mixes harnesses also gets them drawn on the page),
/// pool_steps.csv (per batch of a loop run with `--refilter`, from RUN/pool/: the task pool's
/// size, the tasks the re-filter dropped as all solved or all failed, and its tasks by recent
/// pass rate: never solved, hard (under 0.25), middle (0.25 to 0.75), easy, always solved, not
/// rated yet; the page draws the bands as stacked bars; empty without pool files).
/// The page embeds summaries of every step and the full detail (messages, tool calls and
/// outputs, grader, stages, per-token log-prob differences) of at most `--max-trajectories`
/// trajectories, spread over the trajectory files. Open one with `index.html#traj=<id>`.
///
/// Live mode (`--serve`) serves the same page read-only on `--bind` (loopback by default) with
/// JSON endpoints `/api/summary` and `/api/trajectory?id=<id>`; the page polls every few
/// seconds and follows files that rollout, train-step and validate are still appending to.
/// Every request's `Host` must be the bound address (a page on another name cannot reach it
/// by DNS rebinding), and a POST needs a same-origin `Origin` and a JSON body. Binding beyond
/// loopback needs `--token T`: every request then carries it, as `Authorization: Bearer T` or
/// the cookie that opening `/?token=T` once sets. The `#traj=<id>&ask` link opens the Ask box
/// and waits for a click: no link spends tokens on its own.
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
///   suspected_hack_rate > 0 (rewarded trajectories with a hack_* signal or outside_read)
///   response_tokens_growth >= 1.5 (over the run's first steps; from 3 steps on)
///   logprob_pearson_decline >= 0.002 (below the best of the 3 previous steps; from 3 steps on)
/// `audit:KIND=VALUE` sets one audit kind's threshold.
///
/// A diagnostic assistant (`--assistant`: an OpenAI-compatible URL, or embedded:CKPT served
/// in-process) adds an Ask box to every trajectory of the live UI: a question about the
/// trajectory (default: why did it fail or succeed, and what did the agent do first that
/// mattered?) answered, streaming, from a prompt built from its record within the assistant's
/// context (the page shows the exact prompt and what it left out); conversations can be saved
/// to `--conversations`. `--summarize` (static mode) asks for a one-line cause of every failed or
/// infra-failed trial and groups them into OUT/diagnosis.md and OUT/diagnosis.csv. `--review`
/// asks, of every rewarded trial with a hack signal and `--review-sample` others, whether the
/// reward was earned by a real fix (record, diff, the grader's tests and the signals in the
/// prompt) into OUT/review.md, OUT/review.csv and the page. Nothing is
/// sent anywhere without `--assistant`. The API key, if the endpoint needs one, is read from
/// the environment variable named by `--assistant-api-key-env`.
///
/// Example:
///   lego-rl report run/ -o run/report/
///   lego-rl report run/ -o run/report/ --advisory truncated_fraction=0.1 --advisory audit=off
///   lego-rl report run/ --serve --bind 127.0.0.1:8470
///   LEGO_RL_REPORT_TOKEN=$(openssl rand -hex 16) lego-rl report run/ --serve --bind 0.0.0.0:8470
///   lego-rl report run/ --serve --assistant http://127.0.0.1:8000/v1 --assistant-model Qwen/Qwen3-32B
///   lego-rl report run/ -o run/report/ --summarize --assistant embedded:run/checkpoints/step-000004
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
    #[arg(long, default_value_t = 200, conflicts_with = "serve")]
    pub max_trajectories: usize,
    /// Serve the live UI instead of writing files.
    #[arg(long, conflicts_with = "output")]
    pub serve: bool,
    /// Address to serve on (port 0 picks a free port; the address is printed on stdout).
    #[arg(long, default_value = DEFAULT_BIND, requires = "serve")]
    pub bind: String,
    /// Token every request to the live UI must carry (needed to bind beyond loopback; at
    /// least 16 characters of [A-Za-z0-9_-]). Open /?token=T once in the browser. The
    /// environment variable keeps it out of `ps`.
    #[arg(long, value_name = "T", env = crate::env::REPORT_TOKEN, hide_env_values = true)]
    pub token: Option<String>,
    /// Override a run-health advisory threshold: NAME=VALUE or NAME=off (repeatable; see above).
    #[arg(long = "advisory", value_name = "NAME=VALUE")]
    pub advisories: Vec<String>,
    /// The diagnostic assistant: an OpenAI-compatible base URL (http://host:8000/v1) or
    /// embedded:CKPT_DIR (served in-process on CPU).
    #[arg(long, value_name = "URL|embedded:CKPT")]
    pub assistant: Option<AssistantSpec>,
    /// Model name sent to an assistant URL.
    #[arg(long, requires = "assistant")]
    pub assistant_model: Option<String>,
    /// Environment variable holding the assistant URL's API key (sent as a bearer token).
    #[arg(long, default_value = API_KEY_ENV, value_name = "VAR", requires = "assistant")]
    pub assistant_api_key_env: String,
    /// Model directory with tokenizer.json (and chat template): counts prompt tokens exactly
    /// (default for embedded: the checkpoint; a URL without it gets 3 characters per token).
    #[arg(long, value_name = "DIR", requires = "assistant")]
    pub assistant_chat_model: Option<PathBuf>,
    /// The assistant's context window in tokens (default: the embedded model's, else 32768).
    #[arg(long, value_name = "TOKENS", requires = "assistant")]
    pub assistant_context: Option<usize>,
    /// Most tokens of one answer.
    #[arg(long, default_value_t = 512, value_name = "TOKENS", requires = "assistant")]
    pub assistant_max_tokens: u32,
    /// Where the live UI saves conversations (JSONL, appended; default RUN/report/conversations.jsonl).
    #[arg(long, value_name = "FILE", requires = "serve")]
    pub conversations: Option<PathBuf>,
    /// Ask the assistant for the cause of every failed or infra-failed trial; write
    /// OUT/diagnosis.md and OUT/diagnosis.csv.
    #[arg(long, requires = "assistant", conflicts_with = "serve")]
    pub summarize: bool,
    /// Requests in flight at once while summarizing.
    #[arg(long, default_value_t = 4, value_name = "N", requires = "summarize")]
    pub summarize_jobs: usize,
    /// Most prompt tokens per summarized trial.
    #[arg(long, default_value_t = 4096, value_name = "TOKENS", requires = "summarize")]
    pub summarize_tokens: usize,
    /// Retries of a failed request before the trial's cause is recorded as unknown.
    #[arg(long, default_value_t = 2, value_name = "N", requires = "summarize")]
    pub summarize_retries: u32,
    /// Ask the assistant whether each rewarded trial with a hack signal, and a sample of the
    /// others, earned its reward; write OUT/review.md and OUT/review.csv and show the verdicts
    /// on the page (advice: validate's suspected_hack_rate is the gate).
    #[arg(long, requires = "assistant", conflicts_with = "serve")]
    pub review: bool,
    /// Rewarded trials without a signal reviewed too (the same ones on every run).
    #[arg(long, default_value_t = 8, value_name = "N", requires = "review")]
    pub review_sample: usize,
}

/// What `report` does, worked out from its flags before any work starts (an embedded assistant
/// takes a while to load; a bad `--bind` or a flag the mode ignores fails before it).
struct Resolved {
    run: PathBuf,
    thresholds: Thresholds,
    assistant: Option<AssistantSettings>,
    mode: Mode,
}

/// Static files or the live UI.
enum Mode {
    /// OUT/index.html and the CSV files, after the diagnoses when `summarize` is set.
    Static {
        output: PathBuf,
        max_trajectories: usize,
        strict: bool,
        summarize: Option<SummarizeSettings>,
        review: Option<ReviewSettings>,
    },
    /// The live UI on `bind`; the assistant's conversations are saved to `conversations`.
    Serve {
        bind: String,
        conversations: PathBuf,
        token: Option<String>,
    },
}

impl Resolved {
    fn from_args(args: ReportArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        if !args.run.is_dir() {
            anyhow::bail!("{}: not a directory", args.run.display());
        }
        let thresholds = Thresholds::default()
            .with_overrides(&args.advisories)
            .map_err(anyhow::Error::msg)?;
        if args.assistant_max_tokens == 0 || args.summarize_jobs == 0 {
            anyhow::bail!("--assistant-max-tokens and --summarize-jobs must be at least 1");
        }
        anyhow::ensure!(
            args.summarize_tokens >= 1,
            "--summarize-tokens 0: need at least 1"
        );
        anyhow::ensure!(
            args.assistant_context != Some(0),
            "--assistant-context 0: need at least 1"
        );
        if args.assistant.is_some() && !args.serve && !args.summarize && !args.review {
            anyhow::bail!(
                "--assistant is used by --serve (the Ask box), --summarize or --review; give one of them"
            );
        }
        if let Some(AssistantSpec::Embedded(_)) = &args.assistant {
            if args.assistant_model.is_some() {
                anyhow::bail!(
                    "--assistant-model: only an assistant URL is sent a model name; an embedded one \
                     answers as `assistant`"
                );
            }
            if args.assistant_api_key_env != API_KEY_ENV {
                anyhow::bail!(
                    "--assistant-api-key-env: only an assistant URL is sent an API key, not an embedded one"
                );
            }
        }
        let assistant = args.assistant_settings();
        let mode = if args.serve {
            if global.strict {
                anyhow::bail!(
                    "--strict: report --serve follows files still being written and skips their bad \
                     records; --strict applies to the static report"
                );
            }
            let addrs: Vec<std::net::SocketAddr> =
                std::net::ToSocketAddrs::to_socket_addrs(args.bind.as_str())
                    .with_context(|| format!("--bind {}: expected HOST:PORT", args.bind))?
                    .collect();
            // The guard's own checks, before an embedded assistant takes its time to load.
            for a in addrs {
                crate::report::guard::Guard::new(a, args.token.clone())?;
            }
            Mode::Serve {
                token: args.token,
                conversations: args
                    .conversations
                    .unwrap_or_else(|| args.run.join("report/conversations.jsonl")),
                bind: args.bind,
            }
        } else {
            Mode::Static {
                output: args.output.unwrap_or_else(|| args.run.join("report")),
                max_trajectories: args.max_trajectories,
                strict: global.strict,
                summarize: args.summarize.then(|| SummarizeSettings {
                    concurrency: args.summarize_jobs,
                    max_prompt_tokens: args.summarize_tokens,
                    retries: args.summarize_retries,
                    progress: crate::ui::progress_enabled(global),
                }),
                review: args.review.then_some(ReviewSettings {
                    sample: args.review_sample,
                    concurrency: 4,
                    max_prompt_tokens: 4096,
                    retries: 2,
                }),
            }
        };
        Ok(Resolved {
            run: args.run,
            thresholds,
            assistant,
            mode,
        })
    }
}

impl ReportArgs {
    fn assistant_settings(&self) -> Option<AssistantSettings> {
        Some(AssistantSettings {
            spec: self.assistant.clone()?,
            model: self.assistant_model.clone(),
            api_key_env: self.assistant_api_key_env.clone(),
            chat_model: self.assistant_chat_model.clone(),
            context: self.assistant_context,
            max_tokens: self.assistant_max_tokens,
        })
    }
}

/// Runs `report`.
pub fn run(args: ReportArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let resolved = Resolved::from_args(args, global)?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let assistant = match &resolved.assistant {
        Some(s) => Some(Arc::new(rt.block_on(Assistant::start(s))?)),
        None => None,
    };
    let run = &resolved.run;
    match resolved.mode {
        Mode::Serve {
            bind,
            conversations,
            token,
        } => {
            let live = LiveOptions {
                token,
                assist: assistant.map(|assistant| Assist {
                    assistant,
                    conversations,
                }),
            };
            rt.block_on(serve::serve(run, &bind, resolved.thresholds, live, |addr| {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "serving {} on http://{addr}/", run.display());
                let _ = out.flush();
            }))?;
        }
        Mode::Static {
            output,
            max_trajectories,
            strict,
            summarize: summarize_settings,
            review: review_settings,
        } => {
            let mut files = Vec::new();
            let mut embed = HashSet::new();
            let mut reviews = Vec::new();
            if let (Some(s), Some(assistant)) = (review_settings, assistant.clone()) {
                let run_files = RunFiles::discover(run, false)?;
                let opts = ReadOptions {
                    strict,
                    torn_tail: TornTail::Error,
                };
                let r = rt.block_on(review(&run_files, opts, assistant, &s, &output))?;
                files.extend(r.files);
                reviews = r.reviews;
            }
            if let (Some(s), Some(assistant)) = (summarize_settings, assistant) {
                let run_files = RunFiles::discover(run, false)?;
                let opts = ReadOptions {
                    strict,
                    torn_tail: TornTail::Error,
                };
                let d = rt.block_on(summarize(&run_files, opts, assistant, &s, &output))?;
                let unknown = d.causes.iter().filter(|c| !c.answered).count();
                if unknown > 0 {
                    tracing::warn!(
                        "{unknown} of {} trials have no cause: their requests failed",
                        d.causes.len()
                    );
                }
                files.extend(d.files);
                embed.extend(d.examples);
            }
            let settings = StaticSettings {
                output,
                run: run.clone(),
                max_trajectories,
                strict,
                advisories: resolved.thresholds,
                embed,
                reviews,
            };
            let w = write_static(&settings)?;
            files.extend(w.files);
            let mut out = std::io::stdout().lock();
            for f in &files {
                writeln!(out, "{}", f.display())?;
            }
            tracing::info!(
                "{} trajectories summarized, {} embedded in detail",
                w.trajectories,
                w.embedded
            );
        }
    }
    Ok(Outcome::Ok)
}
