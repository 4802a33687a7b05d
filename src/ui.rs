//! Logging and progress bars: logs and bars go to stderr, bars only on a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::EnvFilter;

use crate::env;
use crate::settings::GlobalArgs;

/// `eprintln!` that ignores a failed write. With stderr gone (the read end of a pipe closed: a
/// killed parent, an orphaned process) `eprintln!` panics, and a panic on the main thread turns a
/// clean exit (0, 1, 2 or 130) into 101; in the interrupt sweep's task it left the process hanging.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// Installs the tracing subscriber: `-q` error, default warn, `-v` info, `-vv` debug, `-vvv`
/// trace; `RUST_LOG` or `LEGO_RL_LOG` override.
pub fn init_logging(global: &GlobalArgs) {
    let level = match (global.quiet, global.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = std::env::var(env::LOG)
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("lego_rl={level},{level}")));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os(env::NO_COLOR).is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        // By default a failed write is reported with `eprintln!`, which panics when stderr is
        // gone (see `stderr_line!`): a log line must never decide the exit code.
        .log_internal_errors(false)
        .try_init();
}

/// Whether progress bars should be drawn.
pub fn progress_enabled(global: &GlobalArgs) -> bool {
    !global.no_progress
        && !global.quiet
        && std::env::var_os(env::NO_PROGRESS).is_none()
        && std::io::stderr().is_terminal()
}

/// A progress bar on stderr, hidden when progress is disabled or stderr is not a terminal.
pub fn bar(enabled: bool, len: u64, what: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:<12} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
            .expect("invariant: valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}
