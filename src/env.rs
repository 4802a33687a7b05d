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
/// Set (to anything) only by the tests that show each attack on the live UI works without its
/// guard (`report --serve`'s Host, Origin, content-type and token checks, src/report/guard.rs):
/// the unguarded twins of the guard's tests. The server warns on stderr when it is set.
pub const UNGUARDED_UI_FOR_TESTS: &str = "LEGO_RL_UNGUARDED_UI_FOR_TESTS";
/// `report --serve --token`: the token every request to the live UI must carry.
pub const REPORT_TOKEN: &str = "LEGO_RL_REPORT_TOKEN";
