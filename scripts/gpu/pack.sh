#!/usr/bin/env bash
# Prepares the folder carried to a GPU machine (at most 64 MiB; that machine has a CUDA torch 2.11,
# no Rust, no transformers, no network): the stripped release binary, scripts/gpu/check.sh and its
# helper, the tiny Qwen3-MoE cast to bf16 (the fp32 one would not fit beside the binary), and
# Qwen3-30B-A3B's config (the check makes random weights of that shape on the machine). There:
#   OUT=/some/dir DEST/check.sh
# usage: scripts/gpu/pack.sh [DEST]   (default target/gpu-pack; after scripts/setup.sh)
# Prints the folder's size in bytes; exits 1 when it is over the budget.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:-$root/target/gpu-pack}
budget=$((64 * 1024 * 1024))
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
say() { printf 'gpu-pack: %s\n' "$*" >&2; }

bin=$root/target/release/lego-rl
[ -x "$bin" ] || { say "no $bin: run scripts/setup.sh first"; exit 2; }
tiny=$root/testdata/models/generated/tiny-qwen3-moe
[ -f "$tiny/config.json" ] || { say "no $tiny: run scripts/setup.sh first"; exit 2; }
rm -rf "$dest"
mkdir -p "$dest/models"
strip --strip-all -o "$dest/lego-rl" "$bin"
cp "$root/scripts/gpu/check.sh" "$root/scripts/gpu/check_helper.py" "$dest/"
cp "$root/testdata/models/configs/qwen3-30b-a3b.json" "$dest/models/"
"$py" "$root/scripts/gpu/check_helper.py" cast "$tiny" "$dest/models/tiny-qwen3-moe-bf16" bf16
size=$(du -sb "$dest" | cut -f1)
say "$dest: $size bytes of at most $budget"
echo "$size"
[ "$size" -le "$budget" ] || { say "over the 64 MiB budget"; exit 1; }
