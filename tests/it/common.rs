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

/// The checkout's root (testdata/, examples/, scripts/).
pub fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with transformers: `LEGO_RL_PYTHON`, else the checkout's `.venv` (scripts/setup.sh).
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LEGO_RL_PYTHON") {
        return p.into();
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// True when the Docker Engine answers; outside CI a missing engine skips the test (with a
/// message), under CI it fails loudly.
pub fn docker_available() -> bool {
    let ok = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CI").is_some() {
        panic!("Docker is required under CI");
    }
    if !ok {
        eprintln!("SKIPPED: no Docker engine");
    }
    ok
}
