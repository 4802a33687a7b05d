#!/usr/bin/env bash
# The README's test command: all set-up on a fresh machine (scripts/setup.sh), then every test.
# Tests run in the release profile so they reuse the dependencies setup.sh already built.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
# Headless Chromium for the report tests (Debian package; idempotent).
"$root/scripts/install-test-deps.sh" >&2
cargo fmt --check
cargo test --release --locked "$@"
