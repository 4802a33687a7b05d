//! The command-line interface (clap derive). Doc comments are the help text.

use clap::{CommandFactory, Parser, Subcommand};

use crate::cmd::{self, Outcome};
use crate::settings::GlobalArgs;

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

impl Cli {
    /// Runs the parsed command line.
    pub fn run(self) -> anyhow::Result<Outcome> {
        let global = self.global;
        match self.command {
            Command::FilterTasks(args) => cmd::filter_tasks::run(args, &global),
            Command::BuildImages(args) => cmd::build_images::run(args, &global),
            Command::Rollout(args) => cmd::rollout::run(args, &global),
            Command::Align(args) => cmd::align::run(args, &global),
            Command::TrainStep(args) => cmd::train_step::run(args, &global),
            Command::Validate(args) => cmd::validate::run(args, &global),
            Command::Report(args) => cmd::report::run(args, &global),
            Command::Env(args) => cmd::env::run(args, &global),
            Command::GenerateDocs(args) => cmd::generate_docs::run(args, &Cli::command()),
            Command::GpuProbe(args) => cmd::gpu_probe::run(args, &global),
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
