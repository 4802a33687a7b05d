//! What `validate` prints: the gate table, per-step health, eval scores and record checks,
//! and how `--eval`/`--compare` arguments name trajectory files.

use std::io::Write;
use std::path::Path;

use super::eval::{self, Outcomes};
use super::gates::GATES;
use super::run::{for_each_trajectory, RunError, RunFiles};
use super::FileCheck;
use crate::records::GateResult;

/// A file of trajectories, or the trajectories of a run directory (or of a plain directory).
pub fn eval_files(p: &Path) -> Result<RunFiles, RunError> {
    if p.is_dir() {
        let f = RunFiles::discover(p, true)?;
        if !f.trajectories.is_empty() {
            return Ok(f);
        }
        let mut trajectories: Vec<_> = std::fs::read_dir(p)
            .map_err(|source| RunError::List {
                path: p.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|q| {
                let n = q.to_string_lossy();
                n.ends_with(".jsonl.zst") || n.ends_with(".jsonl")
            })
            .map(|q| (super::run::step_of(&q), q))
            .collect();
        trajectories.sort();
        return Ok(RunFiles {
            trajectories,
            ..Default::default()
        });
    }
    Ok(RunFiles {
        trajectories: vec![(None, p.to_path_buf())],
        ..Default::default()
    })
}

/// Pass/fail outcomes per task of the trajectories of `files` (what [`eval_files`] names).
pub fn outcomes(files: &RunFiles, opts: crate::io::ReadOptions) -> Result<Outcomes, RunError> {
    let mut o = Outcomes::default();
    for_each_trajectory(files, opts, |_, _, t| o.add(&t))?;
    Ok(o)
}

/// A value with 4 decimals, `-` when absent.
pub fn fmt_value(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into())
}

/// The gate table.
pub fn print_gates(out: &mut impl Write, gates: &[GateResult]) -> std::io::Result<()> {
    let w = GATES.iter().map(|g| g.0.len()).max().unwrap_or(4);
    writeln!(
        out,
        "{:<w$}  {:>10}  {:>2}  {:>9}  {:<6}  DETAIL",
        "GATE", "VALUE", "OP", "THRESHOLD", "STATUS"
    )?;
    for g in gates {
        writeln!(
            out,
            "{:<w$}  {:>10}  {:>2}  {:>9}  {:<6}  {}",
            g.name,
            fmt_value(g.value),
            g.op,
            g.threshold,
            if g.passed { "ok" } else { "FAIL" },
            g.detail.as_deref().unwrap_or("")
        )?;
    }
    let failed = gates.iter().filter(|g| !g.passed).count();
    writeln!(out, "{} gate(s), {failed} failed", gates.len())
}

/// Per-step health: trajectories, reward, infra, zero-variance groups, audit counts.
pub fn print_steps(out: &mut impl Write, h: &super::health::Health) -> std::io::Result<()> {
    if h.steps.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\n{:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>11}  {:>9}  {:>14}  {:>16}  {:>8}",
        "STEP",
        "TRAJ",
        "REWARD",
        "INFRA",
        "ZVAR",
        "GIT_HISTORY",
        "TEST_EDIT",
        "BLOCKED_EGRESS",
        "GRADER_TAMPERING",
        "DROPPED"
    )?;
    for s in h.steps.values() {
        let a = |k: &str| s.audit.get(k).copied().unwrap_or(0);
        writeln!(
            out,
            "{:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>11}  {:>9}  {:>14}  {:>16}  {:>8}",
            s.step,
            s.trajectories,
            fmt_value(s.reward_mean()),
            s.infra_failures,
            format!("{}/{}", s.zero_variance_groups, s.groups),
            a("git_history"),
            a("test_edit"),
            a("blocked_egress"),
            a("grader_tampering"),
            s.dropped_turns
        )?;
    }
    Ok(())
}

/// The held-out evaluation table.
pub fn print_eval(out: &mut impl Write, e: &eval::Eval) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<32}  {:>6}  {:>7}  {:>8}  {:<17}  {:<17}  PASS@K",
        "SCOPE", "TASKS", "SAMPLES", "PASS@1", "95% CI (boot)", "95% CI (Wilson)"
    )?;
    let line = |out: &mut dyn Write, scope: &str, s: &eval::Score| {
        let k: Vec<String> = s
            .pass_at_k
            .iter()
            .filter(|(k, _)| **k > 1)
            .map(|(k, v)| format!("@{k}={v:.4}"))
            .collect();
        writeln!(
            out,
            "{:<32}  {:>6}  {:>7}  {:>8.4}  [{:.4}, {:.4}]  [{:.4}, {:.4}]  {}",
            scope,
            s.tasks,
            s.samples,
            s.pass_at_1,
            s.ci95[0],
            s.ci95[1],
            s.wilson95[0],
            s.wilson95[1],
            k.join(" ")
        )
    };
    line(out, "all", &e.overall)?;
    for (h, s) in &e.per_harness {
        line(out, &format!("harness {h}"), s)?;
    }
    for (r, s) in &e.per_repo {
        line(out, &format!("repo {r}"), s)?;
    }
    if e.overall.excluded > 0 {
        writeln!(
            out,
            "{} infra-failed or ungraded trajectory(ies) excluded",
            e.overall.excluded
        )?;
    }
    Ok(())
}

/// The record-check table (`validate FILE...`).
pub fn print_table(out: &mut impl Write, checks: &[FileCheck]) -> std::io::Result<()> {
    let width = checks
        .iter()
        .map(|c| c.path.display().to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "{:<width$}  {:>9}  {:>6}  {:<6}  KINDS",
        "FILE", "RECORDS", "BAD", "STATUS"
    )?;
    for c in checks {
        let status = if c.fatal.is_some() {
            "ERROR"
        } else if c.bad > 0 {
            "FAIL"
        } else {
            "ok"
        };
        let kinds: Vec<String> = c.kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        writeln!(
            out,
            "{:<width$}  {:>9}  {:>6}  {:<6}  {}",
            c.path.display(),
            c.records,
            c.bad,
            status,
            kinds.join(",")
        )?;
    }
    for c in checks {
        for e in &c.errors {
            writeln!(out, "  {e}")?;
        }
        // Under --strict the first bad record is the fatal error, printed below.
        let listed = c.errors.len() + usize::from(c.fatal.is_some());
        if c.bad as usize > listed {
            writeln!(
                out,
                "  {}: {} more bad record(s)",
                c.path.display(),
                c.bad as usize - listed
            )?;
        }
        if let Some(f) = &c.fatal {
            writeln!(out, "  {f}")?;
        }
    }
    let records: u64 = checks.iter().map(|c| c.records).sum();
    let bad: u64 = checks.iter().map(|c| c.bad).sum();
    writeln!(out, "{} file(s), {records} record(s), {bad} bad", checks.len())
}
