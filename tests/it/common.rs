//! Helpers shared by the integration tests.

use assert_cmd::Command;

/// The lego-rl binary under test, with progress bars and colours off.
pub fn lego() -> Command {
    let mut cmd = Command::cargo_bin("lego-rl").expect("binary built by cargo");
    cmd.env("NO_COLOR", "1")
        .env("LEGO_RL_NO_PROGRESS", "1")
        .env_remove("RUST_LOG");
    cmd
}

/// The Python with transformers: `LEGO_RL_PYTHON`, else the checkout's `.venv` (scripts/setup.sh).
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LEGO_RL_PYTHON") {
        return p.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}
