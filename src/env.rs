//! Names of the environment variables lego-rl reads, in one place.

/// Overrides the log filter (same syntax as `RUST_LOG`, which is also honoured).
pub const LOG: &str = "LEGO_RL_LOG";
/// Set to hide progress bars (same as `--no-progress`).
pub const NO_PROGRESS: &str = "LEGO_RL_NO_PROGRESS";
/// Standard: disables colours in logs.
pub const NO_COLOR: &str = "NO_COLOR";
/// Cache directory for downloads and built artefacts (default `~/.cache/lego-rl`).
pub const CACHE: &str = "LEGO_RL_CACHE";
/// The project's Python venv (default `$LEGO_RL_CACHE/venv`); its pip downloads agent-runtime wheels.
pub const VENV: &str = "LEGO_RL_VENV";
