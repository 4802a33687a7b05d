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
/// Without --stages, rules run (unless --no-rules) plus every stage whose input is given. A
/// stage's flag given while that stage does not run is an error (exit 2) naming the flag and the
/// stage: `--validity-runs 3 --stages rules`, `--min-solved` without --trials, `--languages` with
/// --no-rules.
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

/// The flags of the individual stages. Each is an `Option` so that a flag given for a stage
/// that does not run is told from one left at its default (applied in [`resolve`], and shown in
/// the help text: a unit test holds the two together).
#[derive(Args, Debug)]
pub struct StageArgs {
    /// Rules: minimum problem-statement length in characters [default: 20].
    #[arg(long, help_heading = "Rules")]
    pub min_statement_chars: Option<usize>,
    /// Rules: maximum problem-statement length in characters [default: 50000].
    #[arg(long, help_heading = "Rules")]
    pub max_statement_chars: Option<usize>,
    /// Rules: minimum changed (added + removed) lines of the gold patch [default: 1].
    #[arg(long, help_heading = "Rules")]
    pub min_patch_lines: Option<u32>,
    /// Rules: maximum changed lines of the gold patch [default: 500].
    #[arg(long, help_heading = "Rules")]
    pub max_patch_lines: Option<u32>,
    /// Rules: maximum files touched by the gold patch [default: 10].
    #[arg(long, help_heading = "Rules")]
    pub max_patch_files: Option<u32>,
    /// Rules: maximum changed lines of the test patch [default: 2000].
    #[arg(long, help_heading = "Rules")]
    pub max_test_patch_lines: Option<u32>,
    /// Rules: maximum files touched by the test patch [default: 20].
    #[arg(long, help_heading = "Rules")]
    pub max_test_patch_files: Option<u32>,
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
    /// runs marks the task flaky [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Validity")]
    pub validity_runs: Option<u32>,
    /// Validity: build-images' manifest of these tasks' images (repeatable).
    #[arg(long, value_name = "FILE", help_heading = "Validity")]
    pub images: Vec<PathBuf>,
    /// Validity: sandbox runs in flight at once [default: 2].
    #[arg(short, long, value_name = "N", help_heading = "Validity")]
    pub jobs: Option<usize>,

    /// Difficulty: trajectories of k reference-policy trials per task (rollout output).
    #[arg(long, value_name = "FILE", help_heading = "Difficulty band")]
    pub trials: Vec<PathBuf>,
    /// Difficulty: keep tasks solved at least this many times of k [default: 1].
    #[arg(long, help_heading = "Difficulty band")]
    pub min_solved: Option<u32>,
    /// Difficulty: keep tasks solved at most this many times of k [default: 3].
    #[arg(long, help_heading = "Difficulty band")]
    pub max_solved: Option<u32>,
    /// Difficulty: trials per task (k) [default: 4].
    #[arg(long, help_heading = "Difficulty band")]
    pub trials_per_task: Option<u32>,
    /// Difficulty and saturation: a trial with at least this reward counts as solved [default: 1].
    #[arg(long, help_heading = "Difficulty band")]
    pub solved_threshold: Option<f64>,
    /// Difficulty: tasks with fewer than k counted trials (missing or infra-failed) [default: drop].
    #[arg(long, value_enum, help_heading = "Difficulty band")]
    pub incomplete_trials: Option<Incomplete>,

    /// Saturation: recent training trajectories; drop tasks whose last N groups were all-solved or all-failed.
    #[arg(long, value_name = "FILE", help_heading = "Saturation")]
    pub drop_saturated: Vec<PathBuf>,
    /// Saturation: N, the number of most recent groups that must all be uniform [default: 2].
    #[arg(long, help_heading = "Saturation")]
    pub saturation_groups: Option<u32>,
}

/// Defaults of the stage flags that have no library default to borrow (the rules' come from
/// [`RuleSettings::default`], the solved threshold from the trials module).
const VALIDITY_RUNS: u32 = 1;
const VALIDITY_JOBS: usize = 2;
const MIN_SOLVED: u32 = 1;
const MAX_SOLVED: u32 = 3;
const TRIALS_PER_TASK: u32 = 4;
const SATURATION_GROUPS: u32 = 2;

/// Every stage flag given on the command line, as spelled there, with the stages that read it.
fn given_stage_flags(s: &StageArgs) -> Vec<(&'static str, &'static [Stage])> {
    // Destructured without `..`: a stage flag added to StageArgs does not compile until it is
    // listed here with its stages.
    let StageArgs {
        min_statement_chars,
        max_statement_chars,
        min_patch_lines,
        max_patch_lines,
        max_patch_files,
        max_test_patch_lines,
        max_test_patch_files,
        no_test_file_check,
        languages,
        licenses,
        exclude_instances,
        exclude_repos_of,
        validity_runs,
        images,
        jobs,
        trials,
        min_solved,
        max_solved,
        trials_per_task,
        solved_threshold,
        incomplete_trials,
        drop_saturated,
        saturation_groups,
    } = s;
    const RULES: &[Stage] = &[Stage::Rules];
    const DECONTAM: &[Stage] = &[Stage::Decontamination];
    const VALIDITY: &[Stage] = &[Stage::Validity];
    const DIFFICULTY: &[Stage] = &[Stage::Difficulty];
    const SATURATION: &[Stage] = &[Stage::Saturation];
    [
        ("--min-statement-chars", min_statement_chars.is_some(), RULES),
        ("--max-statement-chars", max_statement_chars.is_some(), RULES),
        ("--min-patch-lines", min_patch_lines.is_some(), RULES),
        ("--max-patch-lines", max_patch_lines.is_some(), RULES),
        ("--max-patch-files", max_patch_files.is_some(), RULES),
        ("--max-test-patch-lines", max_test_patch_lines.is_some(), RULES),
        ("--max-test-patch-files", max_test_patch_files.is_some(), RULES),
        ("--no-test-file-check", *no_test_file_check, RULES),
        ("--languages", !languages.is_empty(), RULES),
        ("--licenses", !licenses.is_empty(), RULES),
        ("--exclude-instances", exclude_instances.is_some(), DECONTAM),
        ("--exclude-repos-of", exclude_repos_of.is_some(), DECONTAM),
        ("--validity-runs", validity_runs.is_some(), VALIDITY),
        ("--images", !images.is_empty(), VALIDITY),
        ("-j/--jobs", jobs.is_some(), VALIDITY),
        ("--trials", !trials.is_empty(), DIFFICULTY),
        ("--min-solved", min_solved.is_some(), DIFFICULTY),
        ("--max-solved", max_solved.is_some(), DIFFICULTY),
        ("--trials-per-task", trials_per_task.is_some(), DIFFICULTY),
        ("--incomplete-trials", incomplete_trials.is_some(), DIFFICULTY),
        (
            "--solved-threshold",
            solved_threshold.is_some(),
            &[Stage::Difficulty, Stage::Saturation],
        ),
        ("--drop-saturated", !drop_saturated.is_empty(), SATURATION),
        ("--saturation-groups", saturation_groups.is_some(), SATURATION),
    ]
    .into_iter()
    .filter_map(|(flag, given, stages)| given.then_some((flag, stages)))
    .collect()
}

/// The stages to run: `--stages`, else rules (unless `--no-rules`) and every stage whose input
/// is given.
fn select_stages(a: &FilterTasksArgs) -> Vec<Stage> {
    if let Some(s) = &a.stages {
        return s.clone();
    }
    let s = &a.stage;
    [
        (Stage::Rules, !a.no_rules),
        (
            Stage::Decontamination,
            s.exclude_instances.is_some() || s.exclude_repos_of.is_some(),
        ),
        (Stage::Validity, s.validity_runs.is_some() || !s.images.is_empty()),
        (Stage::Difficulty, !s.trials.is_empty()),
        (Stage::Saturation, !s.drop_saturated.is_empty()),
    ]
    .into_iter()
    .filter_map(|(stage, on)| on.then_some(stage))
    .collect()
}

/// Refuses a stage flag whose stages are all off, naming the flag, its stage and why that is off.
fn check_stage_flags(a: &FilterTasksArgs, stages: &[Stage]) -> anyhow::Result<()> {
    for (flag, owners) in given_stage_flags(&a.stage) {
        if owners.iter().any(|s| stages.contains(s)) {
            continue;
        }
        let names: Vec<&str> = owners.iter().map(|s| s.as_str()).collect();
        let mut why: Vec<String> = owners
            .iter()
            .map(|&stage| match (&a.stages, stage) {
                (Some(given), _) => format!(
                    "--stages {}",
                    given.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
                ),
                (None, Stage::Rules) => "--no-rules".into(),
                (None, Stage::Validity) => "validity runs with --images FILE".into(),
                (None, Stage::Difficulty) => "difficulty runs with --trials FILE".into(),
                (None, Stage::Saturation) => "saturation runs with --drop-saturated FILE".into(),
                (None, other) => format!("{} is not selected", other.as_str()),
            })
            .collect();
        why.dedup();
        anyhow::bail!(
            "{flag}: a flag of stage {}, which does not run ({})",
            names.join(" or "),
            why.join("; ")
        );
    }
    Ok(())
}

/// The rules stage's settings: the flags given, the defaults for the rest.
fn rule_settings(s: &StageArgs) -> anyhow::Result<RuleSettings> {
    let d = RuleSettings::default();
    let lower = |v: &[String]| {
        v.iter()
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let r = RuleSettings {
        min_statement_chars: s.min_statement_chars.unwrap_or(d.min_statement_chars),
        max_statement_chars: s.max_statement_chars.unwrap_or(d.max_statement_chars),
        min_patch_lines: s.min_patch_lines.unwrap_or(d.min_patch_lines),
        max_patch_lines: s.max_patch_lines.unwrap_or(d.max_patch_lines),
        max_patch_files: s.max_patch_files.unwrap_or(d.max_patch_files),
        max_test_patch_lines: s.max_test_patch_lines.unwrap_or(d.max_test_patch_lines),
        max_test_patch_files: s.max_test_patch_files.unwrap_or(d.max_test_patch_files),
        check_test_files: !s.no_test_file_check,
        languages: lower(&s.languages),
        licenses: lower(&s.licenses),
    };
    anyhow::ensure!(
        r.min_statement_chars <= r.max_statement_chars,
        "--min-statement-chars {} is above --max-statement-chars {}",
        r.min_statement_chars,
        r.max_statement_chars
    );
    Ok(r)
}

/// The difficulty band's trials, loaded and counted.
fn difficulty(s: &StageArgs) -> anyhow::Result<Difficulty> {
    let (min, max) = (
        s.min_solved.unwrap_or(MIN_SOLVED),
        s.max_solved.unwrap_or(MAX_SOLVED),
    );
    let k = s.trials_per_task.unwrap_or(TRIALS_PER_TASK);
    anyhow::ensure!(
        min <= max && max <= k,
        "difficulty band --min-solved {min} --max-solved {max} must satisfy min ≤ max ≤ --trials-per-task {k}"
    );
    Difficulty::load(
        &s.trials,
        min,
        max,
        k,
        solved_threshold(s),
        s.incomplete_trials.unwrap_or(Incomplete::Drop),
    )
    .context("loading --trials")
}

/// The decontamination stage's id and repository sets.
fn decontamination(s: &StageArgs) -> anyhow::Result<Decontamination> {
    let load =
        |p: &PathBuf, what: &str| EvalSet::load(p).with_context(|| format!("loading {what} {}", p.display()));
    Ok(Decontamination {
        instances: (s.exclude_instances.as_ref())
            .map(|p| load(p, "--exclude-instances"))
            .transpose()?,
        repos: (s.exclude_repos_of.as_ref())
            .map(|p| load(p, "--exclude-repos-of"))
            .transpose()?,
    })
}

/// The saturation stage's recent groups per task.
fn saturation(s: &StageArgs) -> anyhow::Result<Saturation> {
    Saturation::load(
        &s.drop_saturated,
        s.saturation_groups.unwrap_or(SATURATION_GROUPS),
        solved_threshold(s),
    )
    .context("loading --drop-saturated")
}

/// A trial with at least this reward counts as solved (difficulty and saturation).
fn solved_threshold(s: &StageArgs) -> f64 {
    s.solved_threshold
        .unwrap_or(filter::trials::DEFAULT_SOLVED_THRESHOLD)
}

/// The filter's settings: the stages to run, each with its flags (or their defaults) and its
/// inputs loaded, checked before the first task is read.
fn resolve(a: &FilterTasksArgs) -> anyhow::Result<Settings> {
    let stages = select_stages(a);
    let on = |st: Stage| stages.contains(&st);
    let s = &a.stage;
    if on(Stage::Decontamination) && s.exclude_instances.is_none() && s.exclude_repos_of.is_none() {
        anyhow::bail!("stage decontamination needs --exclude-instances and/or --exclude-repos-of");
    }
    if on(Stage::Difficulty) && s.trials.is_empty() {
        anyhow::bail!("stage difficulty needs --trials FILE");
    }
    if on(Stage::Validity) && s.images.is_empty() {
        anyhow::bail!("stage validity needs --images FILE (build-images' manifest of these tasks)");
    }
    if on(Stage::Saturation) && s.drop_saturated.is_empty() {
        anyhow::bail!("stage saturation needs --drop-saturated FILE");
    }
    check_stage_flags(a, &stages)?;
    anyhow::ensure!(s.jobs != Some(0), "--jobs 0: need at least 1");
    Ok(Settings {
        inputs: a.input.clone(),
        output: a.output.clone(),
        decisions: a.decisions.clone(),
        funnel_csv: a.funnel.clone(),
        dry_run: a.dry_run,
        keep_going: a.keep_going,
        rules: on(Stage::Rules).then(|| rule_settings(s)).transpose()?,
        decontamination: on(Stage::Decontamination)
            .then(|| decontamination(s))
            .transpose()?,
        validity: on(Stage::Validity).then(|| ValiditySettings {
            runs: s.validity_runs.unwrap_or(VALIDITY_RUNS),
            images: s.images.clone(),
            jobs: s.jobs.unwrap_or(VALIDITY_JOBS),
        }),
        difficulty: on(Stage::Difficulty).then(|| difficulty(s)).transpose()?,
        saturation: on(Stage::Saturation).then(|| saturation(s)).transpose()?,
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

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;

    fn parse(argv: &[&str]) -> FilterTasksArgs {
        let m = FilterTasksArgs::augment_args(Command::new("filter-tasks"))
            .try_get_matches_from(["filter-tasks", "-i", "pool.jsonl"].iter().chain(argv))
            .unwrap();
        <FilterTasksArgs as clap::FromArgMatches>::from_arg_matches(&m).unwrap()
    }

    /// The defaults the help text states are the ones resolve applies (they are written in the
    /// doc comments because an `Option` flag has no clap default to show).
    #[test]
    fn help_states_the_defaults_that_resolve_applies() {
        let cmd = FilterTasksArgs::augment_args(Command::new("filter-tasks"));
        let help = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_help().unwrap().to_string()
        };
        let r = RuleSettings::default();
        let expect = [
            ("min_statement_chars", r.min_statement_chars.to_string()),
            ("max_statement_chars", r.max_statement_chars.to_string()),
            ("min_patch_lines", r.min_patch_lines.to_string()),
            ("max_patch_lines", r.max_patch_lines.to_string()),
            ("max_patch_files", r.max_patch_files.to_string()),
            ("max_test_patch_lines", r.max_test_patch_lines.to_string()),
            ("max_test_patch_files", r.max_test_patch_files.to_string()),
            ("validity_runs", VALIDITY_RUNS.to_string()),
            ("jobs", VALIDITY_JOBS.to_string()),
            ("min_solved", MIN_SOLVED.to_string()),
            ("max_solved", MAX_SOLVED.to_string()),
            ("trials_per_task", TRIALS_PER_TASK.to_string()),
            (
                "solved_threshold",
                filter::trials::DEFAULT_SOLVED_THRESHOLD.to_string(),
            ),
            ("incomplete_trials", "drop".to_string()),
            ("saturation_groups", SATURATION_GROUPS.to_string()),
        ];
        for (id, value) in expect {
            let h = help(id);
            assert!(h.ends_with(&format!("[default: {value}]")), "--{id}: {h}");
        }
        let settings = resolve(&parse(&["--no-rules"])).unwrap();
        assert!(settings.rules.is_none());
        assert_eq!(resolve(&parse(&[])).unwrap().rules, Some(r));
    }

    /// A flag of a stage that runs is taken; a flag of one that does not names the flag, the
    /// stage and why it is off.
    #[test]
    fn stage_flags_need_their_stage() {
        let err = |argv: &[&str]| resolve(&parse(argv)).unwrap_err().to_string();
        assert_eq!(
            err(&[
                "--stages",
                "rules,saturation",
                "--drop-saturated",
                "x",
                "--min-solved",
                "2"
            ]),
            "--min-solved: a flag of stage difficulty, which does not run (--stages rules,saturation)"
        );
        assert_eq!(
            err(&["--no-rules", "--languages", "python"]),
            "--languages: a flag of stage rules, which does not run (--no-rules)"
        );
        assert_eq!(
            err(&["--solved-threshold", "0.5"]),
            "--solved-threshold: a flag of stage difficulty or saturation, which does not run \
             (difficulty runs with --trials FILE; saturation runs with --drop-saturated FILE)"
        );
        assert_eq!(
            err(&["-j", "4"]),
            "-j/--jobs: a flag of stage validity, which does not run (validity runs with --images FILE)"
        );
        let s = resolve(&parse(&["--max-patch-lines", "7", "--no-test-file-check"])).unwrap();
        let rules = s.rules.unwrap();
        assert_eq!((rules.max_patch_lines, rules.check_test_files), (7, false));
    }
}
