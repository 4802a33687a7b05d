#!/usr/bin/env bash
# Installs what the report tests need beyond scripts/setup.sh: headless Chromium (Debian package
# `chromium`), used by tests/it/report.rs to open the generated HTML. Idempotent; needs root or
# passwordless sudo (never prompts).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "chromium already installed: $(command -v chromium || command -v chromium-browser)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "install-test-deps: need root or passwordless sudo to apt-get install chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
command -v chromium
