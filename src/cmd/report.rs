//! `lego-rl report`: CSV tables, a self-contained HTML report, and a live trajectory UI.

use std::path::PathBuf;

use clap::Args;

use super::{NotImplemented, Outcome};
use crate::cli::GlobalArgs;

/// Write CSV tables and an HTML report of a run, or serve it live.
///
/// Example:
///   lego-rl report run/ -o run/report/
///   lego-rl report run/ --serve --bind 127.0.0.1:8470
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Run directory.
    pub run: PathBuf,
    /// Output directory for index.html and the CSV files.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Runs `report`.
pub fn run(_args: ReportArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    Err(NotImplemented("report").into())
}
