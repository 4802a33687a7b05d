//! The options every subcommand accepts, below both the command line (`cli`, which flattens
//! them into `Cli`) and the subcommands (`cmd`, which read them), so neither points back at the
//! other: `cli` → `cmd` → `settings`, and `ui` reads them too.

use clap::Args;

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
    /// Fail on the first bad input record instead of skipping and counting it (build-images
    /// with --input, rollout, align, validate, report without --serve; an error where no records
    /// are read). train-step always stops at a bad sample, and filter-tasks at a bad task unless
    /// given its own --keep-going: there it changes nothing.
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
