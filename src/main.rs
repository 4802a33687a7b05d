//! The `lego-rl` binary: parse → init logging → run → exit code.

use std::process::ExitCode;

use clap::Parser;
use lego_rl::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    lego_rl::ui::init_logging(&cli.global);
    match cli.run() {
        Ok(code) => code.into(),
        Err(err) if lego_rl::cmd::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            lego_rl::stderr_line!("lego-rl: error: {}", lego_rl::cmd::error_line(&err));
            if let Some(hint) = lego_rl::cmd::hint(&err) {
                lego_rl::stderr_line!("hint: {hint}");
            }
            ExitCode::from(2)
        }
    }
}
