#!/usr/bin/env bash
# Installs what the tests need beyond scripts/setup.sh:
# - headless Chromium (Debian package `chromium`), used by tests/it/report.rs to open the generated
#   HTML; needs root or passwordless sudo (never prompts);
# - a git older than 2.42 (Debian bookworm's 2.39 package, unpacked, not installed) under
#   ~/.cache/lego-rl/old-git: the adversarial suite grades a `.gitattributes` trick on it, since
#   SWE-bench images ship git 2.34, which ignores GIT_ATTR_SOURCE (tests/it/adversarial.rs);
# - a pytest 9 wheel (PyPI, by the set-up venv's pip) under ~/.cache/lego-rl/pytest9: the adversarial
#   suite installs it offline in an image derived from a task's, since pytest >= 9 reads pytest.toml
#   and .pytest.toml and the base image pins pytest 8 (tests/it/adversarial_fourth.rs).
# Idempotent.
set -euo pipefail

old_git() {
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/lego-rl/old-git"
    if [ -x "$dir/x/usr/bin/git" ]; then
        return
    fi
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    # bookworm's git is 2.39; the pin keeps a newer host release from passing it off as old.
    local get="apt-get download -q -o APT::Sandbox::User=root git=1:2.39.*"
    # A fresh machine may have no package lists yet.
    if ! (cd "$dir.tmp" && $get >/dev/null 2>&1); then
        if [ "$(id -u)" -eq 0 ]; then apt-get update -qq; else sudo -n apt-get update -qq; fi
        (cd "$dir.tmp" && $get >/dev/null)
    fi
    (cd "$dir.tmp" && dpkg-deb -x git_*.deb x)
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    echo "install-test-deps: $("$dir/x/usr/bin/git" --version 2>/dev/null || echo '(unpacked)') in $dir"
}
old_git

pytest9() {
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/lego-rl/pytest9"
    if ls "$dir"/pytest-9.2.0-*.whl >/dev/null 2>&1; then
        return
    fi
    local cache="${LEGO_RL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lego-rl}"
    local pip="${LEGO_RL_VENV:-$cache/venv}/bin/pip"
    mkdir -p "$dir"
    "$pip" download -q --no-deps --only-binary=:all: pytest==9.2.0 -d "$dir"
    echo "install-test-deps: $(ls "$dir") in $dir"
}
pytest9

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
