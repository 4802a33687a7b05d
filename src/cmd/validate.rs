//! `lego-rl validate`: record checks of files, run health with gates, held-out evaluation.

use std::io::Write;
use std::path::PathBuf;

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
/// Gates (defaults; override with `--gates FILE` (TOML, see examples/gates.toml) and
/// `--gate NAME=VALUE` or `--gate NAME=off`):
///   logprob_pearson >= 0.99 (steps trained with routing replay),
///   logprob_pearson_without_replay >= 0.98 (steps trained with --replay off), expert_overlap >= 0.9,
///   infra_failure_rate <= 0.1,
///   align_drop_rate <= 0.05, git_history_rate / test_edit_rate / blocked_egress_rate <= 0.05,
///   grader_tampering_rate <= 0, and one <KIND>_rate per other audit kind: collection_hook,
///   test_helper, binary_file <= 0.02; outlived_agent, oom_kill <= 0.05; startup_hook,
///   outside_write, hidden_from_diff, nested_repo, diff_too_large, test_patch_conflict,
///   grading_killed, reward_missing <= 0,
///   zero_variance_group_fraction <= 0.9, informative_group_fraction >= 0.1 (steps rolled out
///   with dynamic sampling), staleness_max <= 2, and 0 for each consistency check.
///   Reward collapse, judged on the whole run: train_reward_drop <= 0 (the first 5 steps' mean
///   train reward minus the latest 5 steps', at the lower end of its 95% interval: above 0 means
///   significantly worse than at the start) and heldout_reward_drop <= 0 (likewise, the first
///   held-out evaluation in RUN_DIR/eval/ against the latest).
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
    /// TOML gate file: `all_steps = bool`, `[thresholds] NAME = number`, `disable = [NAME, ...]`.
    #[arg(long, value_name = "FILE")]
    pub gates: Option<PathBuf>,
    /// Override one gate: NAME=NUMBER, or NAME=off to disable it (repeatable).
    #[arg(long = "gate", value_name = "NAME=VALUE")]
    pub gate: Vec<String>,
    /// Judge every step, not only the latest.
    #[arg(long)]
    pub all_steps: bool,
    /// Append the validation-report record here instead of RUN_DIR/validation.jsonl.zst.
    #[arg(long, value_name = "FILE")]
    pub report_out: Option<PathBuf>,
    /// Do not append a validation-report record.
    #[arg(long, conflicts_with = "report_out")]
    pub no_report: bool,
    /// Score held-out trajectories (files or run directories).
    #[arg(long, num_args = 1.., value_name = "TRAJ")]
    pub eval: Vec<PathBuf>,
    /// Compare two evaluations: B − A with a 95% interval.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub compare: Vec<PathBuf>,
}

/// Runs `validate`.
pub fn run(args: ValidateArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let run_dir = match args.files.as_slice() {
        [one] if one.is_dir() => Some(one.clone()),
        many => {
            if let Some(d) = many.iter().find(|p| p.is_dir()) {
                anyhow::bail!("{}: a run directory must be the only argument", d.display());
            }
            None
        }
    };
    if run_dir.is_none() && !args.health && args.eval.is_empty() && args.compare.is_empty() {
        return check_records(&args, global);
    }
    let opts = crate::io::ReadOptions {
        strict: true,
        torn_tail: crate::io::TornTail::Error,
    };
    let mut out = std::io::stdout().lock();
    let mut json = serde_json::Map::new();
    let mut report: Option<ValidationReport> = None;
    let mut outcome = Outcome::Ok;
    let mut report_path = args.report_out.clone();
    if run_dir.is_some() || (args.health && !args.files.is_empty()) {
        let files = match &run_dir {
            Some(d) => RunFiles::discover(d, false)?,
            None => RunFiles::from_files(&args.files)?,
        };
        let mut cfg = GateConfig::default();
        if let Some(p) = &args.gates {
            cfg.apply_file(p)?;
        }
        for g in &args.gate {
            cfg.apply_flag(g)?;
        }
        cfg.all_steps |= args.all_steps;
        let verdict = validate_run(&files, opts, &cfg)?;
        if !verdict.report.passed {
            outcome = Outcome::Failures;
        }
        if report_path.is_none() {
            report_path = files.default_report_path();
        }
        if !args.json {
            print_gates(&mut out, &verdict.report.gates)?;
            print_steps(&mut out, &verdict.health)?;
            crate::validate::dynamic::print(&mut out, &verdict.health.dynamic)?;
            crate::validate::by_harness::print(&mut out, &verdict.health.harnesses)?;
        }
        json.insert("health".into(), serde_json::to_value(&verdict.health)?);
        report = Some(verdict.report);
    }
    let mut eval_json = serde_json::Map::new();
    if !args.eval.is_empty() {
        let mut b = EvalBuilder::default();
        for p in &args.eval {
            for_each_trajectory(&eval_files(p)?, opts, |_, _, t: Trajectory| {
                b.add(&t, &eval::repo_of(&t))
            })?;
        }
        let e = b.finish();
        if !args.json {
            print_eval(&mut out, &e)?;
        }
        eval_json.insert("score".into(), serde_json::to_value(&e)?);
    }
    if let [a, bpath] = args.compare.as_slice() {
        let oa = outcomes(a, opts)?;
        let ob = outcomes(bpath, opts)?;
        let c = eval::compare(&oa, &ob);
        if !args.json {
            writeln!(
                out,
                "compare: {} common task(s); A {:.4}  B {:.4}  B-A {:+.4}  95% CI [{:+.4}, {:+.4}] (paired bootstrap over tasks)",
                c.common_tasks, c.a_pass_at_1, c.b_pass_at_1, c.difference, c.ci95[0], c.ci95[1]
            )?;
        }
        eval_json.insert("compare".into(), serde_json::to_value(&c)?);
    }
    if !eval_json.is_empty() {
        json.insert("eval".into(), serde_json::Value::Object(eval_json.clone()));
        let r = report.get_or_insert_with(|| ValidationReport {
            schema: <ValidationReport as crate::records::Record>::SCHEMA.into(),
            passed: true,
            ..Default::default()
        });
        r.eval = eval_json;
    }
    if let Some(r) = &report {
        json.insert("report".into(), serde_json::to_value(r)?);
    }
    if args.json {
        serde_json::to_writer_pretty(&mut out, &json)?;
        writeln!(out)?;
    }
    out.flush()?;
    if let (Some(r), Some(p), false) = (&report, &report_path, args.no_report) {
        append_report(p, r).with_context(|| format!("appending the validation report to {}", p.display()))?;
        tracing::info!("appended a validation report to {}", p.display());
    }
    Ok(outcome)
}

/// The record-check mode (`validate FILE...`).
fn check_records(args: &ValidateArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let checks = check_files(&args.files, global.strict);
    let mut out = std::io::stdout().lock();
    if args.json {
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
