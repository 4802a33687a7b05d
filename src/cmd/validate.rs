//! `lego-rl validate`: check record files (and, later, run-health gates).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::Outcome;
use crate::cli::GlobalArgs;
use crate::validate::{check_files, FileCheck};

/// Check that files are well-formed lego-rl records.
///
/// Reads every record of every file, checks that it parses as its kind and carries a known
/// `schema`, and prints a table (or JSON). Exit 0 when every record is good, 1 when some records
/// are bad, 2 when a file cannot be read to the end (missing, truncated, corrupt).
///
/// Example:
///   lego-rl validate run/trajectories/*.jsonl.zst run/samples/*.jsonl.zst
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Record files (zstd or plain JSONL; `-` = stdin).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `validate`.
pub fn run(args: ValidateArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
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

fn print_table(out: &mut impl Write, checks: &[FileCheck]) -> std::io::Result<()> {
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
        if c.bad as usize > c.errors.len() {
            writeln!(
                out,
                "  {}: {} more bad record(s)",
                c.path.display(),
                c.bad as usize - c.errors.len()
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
