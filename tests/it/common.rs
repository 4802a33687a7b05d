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
