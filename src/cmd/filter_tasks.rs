//! `lego-rl filter-tasks`: from a raw task pool to a difficulty-banded training set.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::io::is_stdio;
use crate::settings::GlobalArgs;
use crate::tasks::filter::{
    self, Decontamination, Difficulty, EvalSet, Incomplete, RuleSettings, Saturation, Settings, Stage,
    ValiditySettings,
};

/// Filter a task pool into a training set, reporting the funnel.
///
/// Inputs: SWE-bench JSONL or .json (official field names), swebench 5.x task repositories
/// (tasks/<id>/task.yaml, tests.json, gold.patch, ...), Harbor task directories (or a
/// directory of them), lego-rl task records; zstd or plain. Stages, in order, each optional and
/// each reported: rules, decontamination, validity (sandboxes), difficulty band, saturation.
/// Without --stages, rules run (unless --no-rules) plus every stage whose input is given.
///
/// Outputs: kept tasks (-o), one decision per task (--decisions), the funnel as CSV (--funnel)
/// and as a table: on stdout when -o is a file (or --dry-run), on stderr when -o is `-` (stdout
/// then carries only the tasks). Exit 1 when --keep-going recorded bad inputs.
///
/// Example:
///   lego-rl filter-tasks -i pool.jsonl.zst -o run/tasks.kept.jsonl.zst \
///       --exclude-instances swebench_verified_ids.txt --exclude-repos-of swebench_verified_ids.txt \
///       --trials ref-trials.jsonl.zst --decisions run/decisions.jsonl.zst --funnel run/funnel.csv
///   lego-rl build-images -i run/tasks.kept.jsonl -o run/images.jsonl.zst
///   lego-rl filter-tasks -i run/tasks.kept.jsonl -o run/tasks.valid.jsonl --stages validity \
///       --images run/images.jsonl.zst --validity-runs 3 -j 4 --decisions run/validity.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct FilterTasksArgs {
    /// Task pool: SWE-bench JSONL/.json, swebench task repositories, Harbor task directories,
    /// lego-rl task records.
    #[arg(short, long, required = true)]
    pub input: Vec<PathBuf>,
    /// Kept tasks as lego-rl task records (zstd unless the name ends in .jsonl).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Write one decision per task (kept or dropped, stage, reason, evidence).
    #[arg(long, value_name = "FILE")]
    pub decisions: Option<PathBuf>,
    /// Write the funnel as CSV (stage,in,out,dropped,reason,count).
    #[arg(long, value_name = "FILE")]
    pub funnel: Option<PathBuf>,
    /// Run the stages and report the funnel (and decisions) without writing kept tasks.
    #[arg(long)]
    pub dry_run: bool,
    /// Record bad records and unreadable inputs in the funnel instead of stopping (exit 1 at the end).
    #[arg(long)]
    pub keep_going: bool,
    /// Stages to run, comma-separated (default: rules plus those whose inputs are given).
    #[arg(long, value_delimiter = ',', value_name = "STAGE,...")]
    pub stages: Option<Vec<Stage>>,
    /// Skip the rules stage (when --stages is not given).
    #[arg(long, conflicts_with = "stages")]
    pub no_rules: bool,

    /// Stage settings (boxed: clap's flatten keeps the flags flat on the command line).
    #[command(flatten)]
    pub stage: Box<StageArgs>,
}

/// The flags of the individual stages.
#[derive(Args, Debug)]
pub struct StageArgs {
    /// Rules: minimum problem-statement length in characters.
    #[arg(long, default_value_t = RuleSettings::default().min_statement_chars, help_heading = "Rules")]
    pub min_statement_chars: usize,
    /// Rules: maximum problem-statement length in characters.
    #[arg(long, default_value_t = RuleSettings::default().max_statement_chars, help_heading = "Rules")]
    pub max_statement_chars: usize,
    /// Rules: minimum changed (added + removed) lines of the gold patch.
    #[arg(long, default_value_t = RuleSettings::default().min_patch_lines, help_heading = "Rules")]
    pub min_patch_lines: u32,
    /// Rules: maximum changed lines of the gold patch.
    #[arg(long, default_value_t = RuleSettings::default().max_patch_lines, help_heading = "Rules")]
    pub max_patch_lines: u32,
    /// Rules: maximum files touched by the gold patch.
    #[arg(long, default_value_t = RuleSettings::default().max_patch_files, help_heading = "Rules")]
    pub max_patch_files: u32,
    /// Rules: maximum changed lines of the test patch.
    #[arg(long, default_value_t = RuleSettings::default().max_test_patch_lines, help_heading = "Rules")]
    pub max_test_patch_lines: u32,
    /// Rules: maximum files touched by the test patch.
    #[arg(long, default_value_t = RuleSettings::default().max_test_patch_files, help_heading = "Rules")]
    pub max_test_patch_files: u32,
    /// Rules: allow test patches that touch non-test files and gold patches that touch tests.
    #[arg(long, help_heading = "Rules")]
    pub no_test_file_check: bool,
    /// Rules: allowed languages, comma-separated (record `language`, else guessed from the patch).
    #[arg(long, value_delimiter = ',', help_heading = "Rules")]
    pub languages: Vec<String>,
    /// Rules: allowed licences, comma-separated (record `license` or `license_name`).
    #[arg(long, value_delimiter = ',', help_heading = "Rules")]
    pub licenses: Vec<String>,

    /// Decontamination: drop tasks whose id (or gold patch) is in FILE (any accepted format or an id list).
    #[arg(long, value_name = "FILE", help_heading = "Decontamination")]
    pub exclude_instances: Option<PathBuf>,
    /// Decontamination: drop tasks from any repository of FILE's tasks.
    #[arg(long, value_name = "FILE", help_heading = "Decontamination")]
    pub exclude_repos_of: Option<PathBuf>,

    /// Validity: repetitions of the with/without-fix check; a graded test that differs between
    /// runs marks the task flaky (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Validity")]
    pub validity_runs: Option<u32>,
    /// Validity: build-images' manifest of these tasks' images (repeatable).
    #[arg(long, value_name = "FILE", help_heading = "Validity")]
    pub images: Vec<PathBuf>,
    /// Validity: sandbox runs in flight at once.
    #[arg(short, long, default_value_t = 2, value_name = "N", help_heading = "Validity")]
    pub jobs: usize,

    /// Difficulty: trajectories of k reference-policy trials per task (rollout output).
    #[arg(long, value_name = "FILE", help_heading = "Difficulty band")]
    pub trials: Vec<PathBuf>,
    /// Difficulty: keep tasks solved at least this many times of k.
    #[arg(long, default_value_t = 1, help_heading = "Difficulty band")]
    pub min_solved: u32,
    /// Difficulty: keep tasks solved at most this many times of k.
    #[arg(long, default_value_t = 3, help_heading = "Difficulty band")]
    pub max_solved: u32,
    /// Difficulty: trials per task (k).
    #[arg(long, default_value_t = 4, help_heading = "Difficulty band")]
    pub trials_per_task: u32,
    /// Difficulty and saturation: a trial with at least this reward counts as solved.
    #[arg(long, default_value_t = filter::trials::DEFAULT_SOLVED_THRESHOLD, help_heading = "Difficulty band")]
    pub solved_threshold: f64,
    /// Difficulty: tasks with fewer than k counted trials (missing or infra-failed).
    #[arg(long, value_enum, default_value_t = Incomplete::Drop, help_heading = "Difficulty band")]
    pub incomplete_trials: Incomplete,

    /// Saturation: recent training trajectories; drop tasks whose last N groups were all-solved or all-failed.
    #[arg(long, value_name = "FILE", help_heading = "Saturation")]
    pub drop_saturated: Vec<PathBuf>,
    /// Saturation: N, the number of most recent groups that must all be uniform.
    #[arg(long, default_value_t = 2, help_heading = "Saturation")]
    pub saturation_groups: u32,
}

fn resolve(a: &FilterTasksArgs) -> anyhow::Result<Settings> {
    let has_validity = a.stage.validity_runs.is_some() || !a.stage.images.is_empty();
    let has_decontam = a.stage.exclude_instances.is_some() || a.stage.exclude_repos_of.is_some();
    let stages: Vec<Stage> = match &a.stages {
        Some(s) => s.clone(),
        None => {
            let mut s = Vec::new();
            if !a.no_rules {
                s.push(Stage::Rules);
            }
            if has_decontam {
                s.push(Stage::Decontamination);
            }
            if has_validity {
                s.push(Stage::Validity);
            }
            if !a.stage.trials.is_empty() {
                s.push(Stage::Difficulty);
            }
            if !a.stage.drop_saturated.is_empty() {
                s.push(Stage::Saturation);
            }
            s
        }
    };
    let on = |st: Stage| stages.contains(&st);
    if on(Stage::Decontamination) && !has_decontam {
        anyhow::bail!("stage decontamination needs --exclude-instances and/or --exclude-repos-of");
    }
    if on(Stage::Difficulty) && a.stage.trials.is_empty() {
        anyhow::bail!("stage difficulty needs --trials FILE");
    }
    if on(Stage::Validity) && a.stage.images.is_empty() {
        anyhow::bail!("stage validity needs --images FILE (build-images' manifest of these tasks)");
    }
    if on(Stage::Saturation) && a.stage.drop_saturated.is_empty() {
        anyhow::bail!("stage saturation needs --drop-saturated FILE");
    }
    if a.stage.min_solved > a.stage.max_solved || a.stage.max_solved > a.stage.trials_per_task {
        anyhow::bail!(
            "difficulty band --min-solved {} --max-solved {} must satisfy min ≤ max ≤ --trials-per-task {}",
            a.stage.min_solved,
            a.stage.max_solved,
            a.stage.trials_per_task
        );
    }
    if a.stage.min_statement_chars > a.stage.max_statement_chars {
        anyhow::bail!("--min-statement-chars is above --max-statement-chars");
    }
    let lower = |v: &[String]| {
        v.iter()
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let validity = on(Stage::Validity).then(|| ValiditySettings {
        runs: a.stage.validity_runs.unwrap_or(1),
        images: a.stage.images.clone(),
        jobs: a.stage.jobs.max(1),
    });
    let load_set =
        |p: &PathBuf, what: &str| EvalSet::load(p).with_context(|| format!("loading {what} {}", p.display()));
    Ok(Settings {
        inputs: a.input.clone(),
        output: a.output.clone(),
        decisions: a.decisions.clone(),
        funnel_csv: a.funnel.clone(),
        dry_run: a.dry_run,
        keep_going: a.keep_going,
        rules: on(Stage::Rules).then(|| RuleSettings {
            min_statement_chars: a.stage.min_statement_chars,
            max_statement_chars: a.stage.max_statement_chars,
            min_patch_lines: a.stage.min_patch_lines,
            max_patch_lines: a.stage.max_patch_lines,
            max_patch_files: a.stage.max_patch_files,
            max_test_patch_lines: a.stage.max_test_patch_lines,
            max_test_patch_files: a.stage.max_test_patch_files,
            check_test_files: !a.stage.no_test_file_check,
            languages: lower(&a.stage.languages),
            licenses: lower(&a.stage.licenses),
        }),
        decontamination: if on(Stage::Decontamination) {
            Some(Decontamination {
                instances: a
                    .stage
                    .exclude_instances
                    .as_ref()
                    .map(|p| load_set(p, "--exclude-instances"))
                    .transpose()?,
                repos: a
                    .stage
                    .exclude_repos_of
                    .as_ref()
                    .map(|p| load_set(p, "--exclude-repos-of"))
                    .transpose()?,
            })
        } else {
            None
        },
        validity,
        difficulty: if on(Stage::Difficulty) {
            Some(
                Difficulty::load(
                    &a.stage.trials,
                    a.stage.min_solved,
                    a.stage.max_solved,
                    a.stage.trials_per_task,
                    a.stage.solved_threshold,
                    a.stage.incomplete_trials,
                )
                .context("loading --trials")?,
            )
        } else {
            None
        },
        saturation: if on(Stage::Saturation) {
            Some(
                Saturation::load(
                    &a.stage.drop_saturated,
                    a.stage.saturation_groups,
                    a.stage.solved_threshold,
                )
                .context("loading --drop-saturated")?,
            )
        } else {
            None
        },
    })
}

/// Runs `filter-tasks`.
pub fn run(args: FilterTasksArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let settings = resolve(&args)?;
    let progress = if crate::ui::progress_enabled(global) {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message("filtering");
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let summary = filter::run(&settings, &progress)?;
    progress.finish_and_clear();
    let table = summary.funnel.to_table();
    if is_stdio(&settings.output) && !settings.dry_run {
        if !global.quiet {
            let _ = std::io::stderr().write_all(table.as_bytes());
        }
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(table.as_bytes())?;
        out.flush()?;
    }
    tracing::info!("kept {} task(s)", summary.kept);
    if summary.errors > 0 {
        tracing::warn!(
            "{} bad input(s) recorded in the funnel (--keep-going)",
            summary.errors
        );
        return Ok(Outcome::Failures);
    }
    Ok(Outcome::Ok)
}
