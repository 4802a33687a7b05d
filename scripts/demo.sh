#!/usr/bin/env bash
# The README's main job: all set-up, then the pipeline on embedded defaults into one run directory.
# Stages that have not landed yet are skipped with a note (they exit 2 rather than fake output).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
lego="$root/target/release/lego-rl"
run=${LEGO_RL_RUN:-$root/runs/demo}
mkdir -p "$run"
echo "demo: run directory $run" >&2
"$lego" validate "$root"/testdata/records/*.jsonl
echo "demo: done; run directory: $run" >&2
