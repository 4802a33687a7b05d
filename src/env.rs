//! Names of the environment variables lego-rl reads, in one place.

/// Overrides the log filter (same syntax as `RUST_LOG`, which is also honoured).
pub const LOG: &str = "LEGO_RL_LOG";
/// Set to hide progress bars (same as `--no-progress`).
pub const NO_PROGRESS: &str = "LEGO_RL_NO_PROGRESS";
/// Standard: disables colours in logs.
pub const NO_COLOR: &str = "NO_COLOR";
