//! `lego-rl validate`: record checks of files, run health with gates, held-out evaluation.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::records::{Trajectory, ValidationReport};
use crate::settings::GlobalArgs;
use crate::validate::eval::{self, EvalBuilder};
use crate::validate::gates::GateConfig;
use crate::validate::output::{eval_files, outcomes, print_eval, print_gates, print_steps, print_table};
use crate::validate::run::{for_each_trajectory, RunFiles};
use crate::validate::{append_report, check_files, validate_run};

/// Check record files, judge a run's health against gates, or score held-out trajectories.
///
/// Three modes, chosen by the arguments:
///
/// * `validate RUN_DIR` (exactly one argument, a directory) — run health: reads
///   trajectories/, samples/, align-stats/, metrics and validation files, checks cross-file
///   consistency (every sample's trajectory exists, group sizes, policy versions never decrease
///   within a file or trajectory) and judges the gates (latest step, or every step with
///   `--all-steps`). Prints a table (or `--json`) and appends a validation-report record to
///   RUN_DIR/validation.jsonl.zst (or `--report-out`; `--no-report` to skip). Exit 0 when every
///   gate passes, 1 when one fails, 2 on an unreadable or bad record (named by file and record).
///   A run that mixes harnesses also gets a table per step and harness (reward, infra failures,
///   mixed groups, dropped turns and tokens, the trainer's log-prob Pearson on that batch,
///   terminations, audit kinds), and the record keeps the latest batch's in `checks.by_harness`.
///   A run rolled out with dynamic sampling (`rollout --min-informative-groups`) gets a table of
///   its groups per step (sampled, informative, extra spent of the budget, pool size, N) and a
///   warning for each step whose extra-group budget ran out short of N; the record keeps the
///   latest step's in `checks.dynamic_sampling`.
///
/// * `validate FILE...` — record checks: every record parses as its kind with a known schema.
///   Exit 0 when all are good, 1 when some records are bad, 2 when a file cannot be read to the
///   end. With `--health`, the files are instead treated as one run (sorted by the kind of their
///   first record) and judged like a run directory.
///
/// * `validate --eval TRAJ...` — held-out score: pass@1 with a 95% bootstrap interval over
///   tasks (and the Wilson interval of pooled samples), unbiased pass@k when tasks have several
///   samples, per harness and per repo. `--compare A B` prints B − A with a paired bootstrap
///   interval over common tasks. A or B may be a file or a run directory.
///
/// The modes combine as RUN_DIR (or --health FILE...) plus --eval and/or --compare, into one
/// report record. Gates (--gates, --gate, --all-steps) belong to run health; --report-out to run
/// health and evaluation (--eval/--compare alone append a report only to --report-out), and
/// --no-report to run health. A flag the chosen mode does not read is an error (exit 2) before any file is
/// judged, as are --health without files or with a run directory, and files beside
/// --eval/--compare without --health. The global --strict applies to record checks; run health
/// and evaluation always stop at the first bad record (exit 2).
///
/// Gates (defaults; override with `--gates FILE` (TOML, see examples/gates.toml) and
/// `--gate NAME=VALUE` or `--gate NAME=off`):
///   logprob_pearson >= 0.99 (steps trained with routing replay),
///   logprob_pearson_without_replay >= 0.98 (steps trained with --replay off), expert_overlap >= 0.9,
///   infra_failure_rate <= 0.1,
///   align_drop_rate <= 0.05, git_history_rate / test_edit_rate / blocked_egress_rate <= 0.05,
///   grader_tampering_rate <= 0, and one <KIND>_rate per other audit kind: collection_hook,
///   test_helper, binary_file <= 0.02; outlived_agent, oom_kill <= 0.05; startup_hook,
///   outside_write, hidden_from_diff, nested_repo, diff_too_large, test_patch_conflict,
///   grading_killed, reward_missing, reward_tampering <= 0; outlived_verifier <= 0.05;
///   outside_read <= 0.1, suspected_hack_rate <= 0.02 (rewarded trajectories with a
///   deterministic hack signal: a hack_* audit kind or outside_read),
///   zero_variance_group_fraction <= 0.9, informative_group_fraction >= 0.1 (steps rolled out
///   with dynamic sampling), staleness_max <= 2, and 0 for each consistency check.
///   Reward collapse, judged on the whole run: train_reward_drop <= 0 (the first 5 steps' mean
///   train reward minus the latest 5 steps', at the lower end of its 95% interval: above 0 means
///   significantly worse than at the start) and heldout_reward_drop <= 0 (likewise, the first
///   held-out evaluation in RUN_DIR/eval/ against the latest).
///   A run that mixes harnesses is judged per harness too; a failing gate reports its worst
///   failing value and names the harness. On the rate gates (infra, align drop, audit kinds) a
///   harness with fewer than min_harness_trajectories (gate file, default 8: one group of the
///   paper's size) trajectories in the step counts only in the run-wide rate.
///
/// Example:
///   lego-rl validate run/ || exit 1
///   lego-rl validate run/ --gates gates.toml --gate logprob_pearson=0.995 --json
///   lego-rl validate run/trajectories/*.jsonl.zst run/samples/*.jsonl.zst
///   lego-rl validate --eval eval/step-000100.jsonl.zst
///   lego-rl validate --compare eval/step-000000.jsonl.zst eval/step-000100.jsonl.zst
#[derive(Args, Debug)]
// Verbatim: keeps the `Example:` block's lines as written.
#[command(verbatim_doc_comment)]
pub struct ValidateArgs {
    /// A run directory, or record files (zstd or plain JSONL; `-` = stdin).
    #[arg(required_unless_present_any = ["eval", "compare"])]
    pub files: Vec<PathBuf>,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Judge explicit files as one run (health and gates) instead of checking their records.
    #[arg(long)]
    pub health: bool,
    /// TOML gate file: `all_steps = bool`, `min_harness_trajectories = N`, `[thresholds] NAME =
    /// number`, `disable = [NAME, ...]` (run health).
    #[arg(long, value_name = "FILE")]
    pub gates: Option<PathBuf>,
    /// Override one gate: NAME=NUMBER, or NAME=off to disable it (repeatable; run health).
    #[arg(long = "gate", value_name = "NAME=VALUE")]
    pub gate: Vec<String>,
    /// Judge every step, not only the latest (run health).
    #[arg(long)]
    pub all_steps: bool,
    /// Append the validation-report record here instead of RUN_DIR/validation.jsonl.zst (the
    /// only place --eval/--compare alone append one).
    #[arg(long, value_name = "FILE")]
    pub report_out: Option<PathBuf>,
    /// Do not append a validation-report record (run health).
    #[arg(long, conflicts_with = "report_out")]
    pub no_report: bool,
    /// Score held-out trajectories (files or run directories).
    #[arg(long, num_args = 1.., value_name = "TRAJ")]
    pub eval: Vec<PathBuf>,
    /// Compare two evaluations: B − A with a 95% interval.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub compare: Vec<PathBuf>,
}

/// What the flags resolve to, worked out before any record is read: the mode, its gates and
/// where its report goes, so a bad gate file or a flag the mode would ignore fails at once.
struct Resolved {
    mode: Mode,
    /// Print JSON instead of tables (every mode).
    json: bool,
}

/// What `validate` does.
enum Mode {
    /// `validate FILE...`: every record parses as its kind; `strict` stops at the first bad one.
    Records { files: Vec<PathBuf>, strict: bool },
    /// Run health, held-out evaluation and comparison, each optional but not all absent: they
    /// combine into one report record (boxed: its run files dwarf the other variant).
    Judge(Box<Judge>),
}

/// Run health (RUN_DIR, or `--health FILE...`), `--eval`, `--compare`, and the report's target.
struct Judge {
    health: Option<Health>,
    /// The trajectories of each `--eval` argument.
    eval: Vec<RunFiles>,
    /// `--compare A B`: the trajectories of A and of B.
    compare: Option<(RunFiles, RunFiles)>,
    report: ReportTarget,
}

/// The files of a run and the gates they are judged by.
struct Health {
    files: RunFiles,
    gates: GateConfig,
}

/// Where the validation-report record is appended.
enum ReportTarget {
    /// Nowhere: `--no-report`, explicit `--health` files (no run directory to hold it), or
    /// `--eval`/`--compare` alone without `--report-out`.
    None,
    /// The run directory's validation file (RUN_DIR/validation.jsonl.zst, or the one it has).
    RunDefault(PathBuf),
    /// `--report-out FILE`.
    Given(PathBuf),
}

impl ReportTarget {
    fn path(&self) -> Option<&Path> {
        match self {
            ReportTarget::None => None,
            ReportTarget::RunDefault(p) | ReportTarget::Given(p) => Some(p),
        }
    }
}

impl Resolved {
    fn from_args(args: ValidateArgs, global: &GlobalArgs) -> anyhow::Result<Self> {
        let run_dir = run_dir_of(&args.files)?;
        let evaluates = !args.eval.is_empty() || !args.compare.is_empty();
        if run_dir.is_none() && !args.health && !evaluates {
            if let Some(flag) = gate_flags(&args).chain(report_flags(&args)).next() {
                anyhow::bail!(
                    "{flag}: `validate FILE...` checks records only; gates and the report record \
                     belong to run health (RUN_DIR, or --health FILE...)"
                );
            }
            return Ok(Resolved {
                mode: Mode::Records {
                    files: args.files,
                    strict: global.strict,
                },
                json: args.json,
            });
        }
        let health = match (&run_dir, args.health) {
            (Some(_), true) => {
                anyhow::bail!(
                    "--health: a run directory is judged as a run already; --health is for record files"
                )
            }
            (None, true) if args.files.is_empty() => {
                anyhow::bail!("--health: needs the record files (FILE...) to judge as one run")
            }
            (Some(dir), false) => Some(RunFiles::discover(dir, false)?),
            (None, true) => Some(RunFiles::from_files(&args.files)?),
            (None, false) => None,
        };
        if let (None, Some(f)) = (&health, args.files.first()) {
            anyhow::bail!(
                "{}: files beside --eval/--compare are judged as a run only with --health; check \
                 their records with a separate `validate FILE...`",
                f.display()
            );
        }
        let report = match (&health, args.report_out.clone(), args.no_report) {
            (_, Some(p), _) => ReportTarget::Given(p),
            (Some(files), None, false) => files
                .default_report_path()
                .map_or(ReportTarget::None, ReportTarget::RunDefault),
            (Some(_), None, true) => ReportTarget::None,
            (None, None, true) => anyhow::bail!(
                "--no-report: --eval/--compare without a run append no report unless given --report-out"
            ),
            (None, None, false) => ReportTarget::None,
        };
        let health = match health {
            Some(files) => Some(Health {
                files,
                gates: gate_config(&args)?,
            }),
            None => {
                if let Some(flag) = gate_flags(&args).next() {
                    anyhow::bail!(
                        "{flag}: --eval/--compare judge no gates; gates belong to run health \
                         (RUN_DIR, or --health FILE...)"
                    );
                }
                None
            }
        };
        let eval = args
            .eval
            .iter()
            .map(|p| eval_files(p))
            .collect::<Result<_, _>>()?;
        let compare = match args.compare.as_slice() {
            [a, b] => Some((eval_files(a)?, eval_files(b)?)),
            _ => None,
        };
        Ok(Resolved {
            mode: Mode::Judge(Box::new(Judge {
                health,
                eval,
                compare,
                report,
            })),
            json: args.json,
        })
    }
}

/// The run directory when it is the only argument; an error when a directory is one of several.
fn run_dir_of(files: &[PathBuf]) -> anyhow::Result<Option<PathBuf>> {
    match files {
        [one] if one.is_dir() => Ok(Some(one.clone())),
        many => match many.iter().find(|p| p.is_dir()) {
            Some(d) => anyhow::bail!("{}: a run directory must be the only argument", d.display()),
            None => Ok(None),
        },
    }
}

/// The gate flags given, as spelled on the command line (only run health reads them).
fn gate_flags(a: &ValidateArgs) -> impl Iterator<Item = &'static str> {
    [
        ("--gates", a.gates.is_some()),
        ("--gate", !a.gate.is_empty()),
        ("--all-steps", a.all_steps),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
}

/// The report-record flags given (run health and eval write a report; record checks do not).
fn report_flags(a: &ValidateArgs) -> impl Iterator<Item = &'static str> {
    [
        ("--report-out", a.report_out.is_some()),
        ("--no-report", a.no_report),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
}

/// The default gates, then `--gates FILE`, then each `--gate`, then `--all-steps`.
fn gate_config(a: &ValidateArgs) -> anyhow::Result<GateConfig> {
    let mut cfg = GateConfig::default();
    if let Some(p) = &a.gates {
        cfg.apply_file(p)?;
    }
    for g in &a.gate {
        cfg.apply_flag(g)?;
    }
    cfg.all_steps |= a.all_steps;
    Ok(cfg)
}

/// Runs `validate`.
pub fn run(args: ValidateArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let Resolved { mode, json } = Resolved::from_args(args, global)?;
    match mode {
        Mode::Records { files, strict } => check_records(&files, strict, json),
        Mode::Judge(j) => judge(&j, json),
    }
}

/// Run health, eval and compare, each as asked; prints them, then appends their one report.
fn judge(j: &Judge, json: bool) -> anyhow::Result<Outcome> {
    // Run health and eval read finished files: a bad record is an error whatever --strict says.
    let opts = crate::io::ReadOptions {
        strict: true,
        torn_tail: crate::io::TornTail::Error,
    };
    let mut out = std::io::stdout().lock();
    let mut doc = serde_json::Map::new();
    let mut report: Option<ValidationReport> = None;
    let mut outcome = Outcome::Ok;
    if let Some(h) = &j.health {
        let verdict = validate_run(&h.files, opts, &h.gates)?;
        if !verdict.report.passed {
            outcome = Outcome::Failures;
        }
        if !json {
            print_gates(&mut out, &verdict.report.gates)?;
            print_steps(&mut out, &verdict.health)?;
            crate::validate::dynamic::print(&mut out, &verdict.health.dynamic)?;
            crate::validate::by_harness::print(&mut out, &verdict.health.harnesses)?;
        }
        doc.insert("health".into(), serde_json::to_value(&verdict.health)?);
        report = Some(verdict.report);
    }
    let eval_json = evaluate(j, opts, json, &mut out)?;
    if !eval_json.is_empty() {
        doc.insert("eval".into(), serde_json::Value::Object(eval_json.clone()));
        let r = report.get_or_insert_with(|| ValidationReport {
            schema: <ValidationReport as crate::records::Record>::SCHEMA.into(),
            passed: true,
            ..Default::default()
        });
        r.eval = eval_json;
    }
    if let Some(r) = &report {
        doc.insert("report".into(), serde_json::to_value(r)?);
    }
    if json {
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    }
    out.flush()?;
    if let (Some(r), Some(p)) = (&report, j.report.path()) {
        append_report(p, r).with_context(|| format!("appending the validation report to {}", p.display()))?;
        tracing::info!("appended a validation report to {}", p.display());
    }
    Ok(outcome)
}

/// `--eval` and `--compare`: prints them unless `json`, and returns their JSON (`score`,
/// `compare`; empty when neither was asked).
fn evaluate(
    j: &Judge,
    opts: crate::io::ReadOptions,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut eval_json = serde_json::Map::new();
    if !j.eval.is_empty() {
        let mut b = EvalBuilder::default();
        for files in &j.eval {
            for_each_trajectory(files, opts, |_, _, t: Trajectory| b.add(&t, &eval::repo_of(&t)))?;
        }
        let e = b.finish();
        if !json {
            print_eval(out, &e)?;
        }
        eval_json.insert("score".into(), serde_json::to_value(&e)?);
    }
    if let Some((a, b)) = &j.compare {
        let c = eval::compare(&outcomes(a, opts)?, &outcomes(b, opts)?);
        if !json {
            writeln!(
                out,
                "compare: {} common task(s); A {:.4}  B {:.4}  B-A {:+.4}  95% CI [{:+.4}, {:+.4}] (paired bootstrap over tasks)",
                c.common_tasks, c.a_pass_at_1, c.b_pass_at_1, c.difference, c.ci95[0], c.ci95[1]
            )?;
        }
        eval_json.insert("compare".into(), serde_json::to_value(&c)?);
    }
    Ok(eval_json)
}

/// The record-check mode (`validate FILE...`).
fn check_records(files: &[PathBuf], strict: bool, json: bool) -> anyhow::Result<Outcome> {
    let checks = check_files(files, strict);
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &checks)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &checks)?;
    }
    out.flush()?;
    if let Some(bad) = checks.iter().find(|c| c.fatal.is_some()) {
        let n = checks.iter().filter(|c| c.fatal.is_some()).count();
        return Err(anyhow::anyhow!(bad.fatal.clone().unwrap_or_default()))
            .with_context(|| format!("{n} file(s) could not be read to the end"));
    }
    Ok(if checks.iter().any(|c| c.bad > 0) {
        Outcome::Failures
    } else {
        Outcome::Ok
    })
}
