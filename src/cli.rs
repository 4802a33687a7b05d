//! The command-line interface (clap derive). Doc comments are the help text.

use clap::{Args, Parser, Subcommand};

use crate::cmd;

/// Harness-native reinforcement learning of coding agents.
///
/// lego-rl trains an LLM with policy-gradient RL (GSPO, MoE routing replay) while it drives real,
/// unmodified coding-agent harnesses in sandboxes, with a 0/1 executable reward. Each subcommand
/// reads and writes zstd-compressed JSON Lines, so a shell script or a Slurm job chains them:
///
///   filter-tasks → build-images → rollout → align → train-step → validate → report
///
/// File formats: man lego-rl-formats (man/lego-rl-formats.md).
#[derive(Parser, Debug)]
#[command(name = "lego-rl", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand accepts.
#[derive(Args, Debug, Clone, Default)]
pub struct GlobalArgs {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Never draw progress bars (they are hidden anyway when stderr is not a terminal).
    #[arg(long, global = true)]
    pub no_progress: bool,
    /// Fail on the first bad input record instead of skipping and counting it (build-images,
    /// rollout, align, validate, report). train-step always stops at a bad sample, and
    /// filter-tasks at a bad task unless given its own --keep-going.
    #[arg(long, global = true)]
    pub strict: bool,
}

impl GlobalArgs {
    /// Read options for input files that a finished producer wrote.
    pub fn read_options(&self) -> crate::io::ReadOptions {
        crate::io::ReadOptions {
            strict: self.strict,
            torn_tail: crate::io::TornTail::Error,
        }
    }
}

/// The subcommands, in pipeline order.
#[derive(Subcommand, Debug)]
pub enum Command {
    FilterTasks(cmd::filter_tasks::FilterTasksArgs),
    BuildImages(cmd::build_images::BuildImagesArgs),
    Rollout(cmd::rollout::RolloutArgs),
    Align(cmd::align::AlignArgs),
    TrainStep(cmd::train_step::TrainStepArgs),
    Validate(cmd::validate::ValidateArgs),
    Report(cmd::report::ReportArgs),
    Env(cmd::env::EnvArgs),
    /// Writes the man pages and shell completions (for maintainers).
    #[command(hide = true)]
    GenerateDocs(cmd::generate_docs::GenerateDocsArgs),
    /// Engine probes for scripts/gpu/check.sh (for maintainers).
    #[command(hide = true)]
    GpuProbe(cmd::gpu_probe::GpuProbeArgs),
}

impl Command {
    /// The subcommand's name as typed on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Command::FilterTasks(_) => "filter-tasks",
            Command::BuildImages(_) => "build-images",
            Command::Rollout(_) => "rollout",
            Command::Align(_) => "align",
            Command::TrainStep(_) => "train-step",
            Command::Validate(_) => "validate",
            Command::Report(_) => "report",
            Command::Env(_) => "env",
            Command::GenerateDocs(_) => "generate-docs",
            Command::GpuProbe(_) => "gpu-probe",
        }
    }
}
