#!/usr/bin/env bash
# Fresh-machine set-up for lego-rl. Idempotent, no prompts, safe to run twice.
#
#  1. A Python venv (outside the checkout, in a cache dir, so every clone and CI reuse it) with
#     torch==2.11.0 from PyPI (libtorch for tch 0.24) and the Python tools the tests use as
#     references: transformers, the official openai/anthropic SDKs, zstandard.
#  2. `.libtorch` -> <venv>/…/site-packages/torch, read by .cargo/config.toml (LIBTORCH) and by
#     build.rs, which bakes an rpath so `target/release/lego-rl` runs with no exported variables.
#  3. CUDA headers from PyPI when the torch wheel has CUDA (scripts/cuda-headers.sh, cached; linked
#     at `.cuda-headers`, read by build.rs through .cargo/config.toml): the release binary then
#     links libtorch_cuda and the c10d shim's NCCL path, and the same binary runs on CPU and GPU.
#     A CPU-only torch gives a CPU-only binary (no link, no download).
#  4. The release binary.
#  5. The generated test/demo artifacts: the tiny Qwen3-MoE (fp32, bf16 and head_dim 32 for vLLM-CPU), Qwen3.5-MoE and Qwen3-Next checkpoints
#     (scripts/make_tiny_models.py, ~40 MB each,
#     deterministic, git-ignored) and the Debian base image for task containers
#     (scripts/bootstrap-base-image.sh: debootstrap + docker import; reused when present).
#
# Environment: LEGO_RL_CACHE (default ~/.cache/lego-rl), LEGO_RL_VENV (default $LEGO_RL_CACHE/venv),
# LEGO_RL_SKIP_BUILD=1 to stop before cargo, LEGO_RL_SKIP_DOCKER=1 to skip the base image.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${LEGO_RL_CACHE:-$HOME/.cache/lego-rl}
venv=${LEGO_RL_VENV:-$cache/venv}
torch_version=2.11.0
say() { printf 'setup: %s\n' "$*" >&2; }

mkdir -p "$cache"
# The loop scripts (scripts/loop.sh, demo.sh, examples/slurm) slice zstd JSONL with the zstd and jq CLIs.
missing=""
for tool in zstd jq; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
  say "installing$missing"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086 # a word list
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && apt-get install -y -qq $missing >&2
  else
    say "warning: missing$missing and no root apt-get; install them for scripts/loop.sh and demo.sh"
  fi
fi
if [ ! -x "$venv/bin/python" ]; then
  say "creating venv $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
py="$venv/bin/python"

if ! "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$torch_version' else 1)" 2>/dev/null; then
  say "installing torch==$torch_version (large download on a fresh machine)"
  "$venv/bin/pip" install -q "torch==$torch_version"
fi

req="$root/scripts/requirements.txt"
stamp="$venv/.lego-rl-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python tools from scripts/requirements.txt"
  "$venv/bin/pip" install -q -r "$req"
  echo "$want" >"$stamp"
fi

torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
ln -sfn "$torch_dir" "$root/.libtorch"
ln -sfn "$venv" "$root/.venv"
if cuda_home=$("$root/scripts/cuda-headers.sh" "$py"); then
  ln -sfn "$cuda_home" "$root/.cuda-headers"
else
  rm -f "$root/.cuda-headers"
fi

if [ "${LEGO_RL_SKIP_BUILD:-0}" != 1 ]; then
  say "building target/release/lego-rl"
  (cd "$root" && cargo build --release --locked --quiet 2>&1 | grep -v '^$' >&2 || exit "${PIPESTATUS[0]}")
fi
say "tiny Qwen3-MoE (fp32, bf16, head_dim 32 in fp32 and bf16), Qwen3.5-MoE and Qwen3-Next checkpoints (testdata/models/generated)"
for tiny in tiny-qwen3-moe tiny-qwen3-moe-bf16 tiny-qwen3-moe-hd32 tiny-qwen3-moe-hd32-bf16 tiny-qwen3.5-moe tiny-qwen3-next; do
  "$py" "$root/scripts/make_tiny_models.py" "$root/testdata/models/generated/$tiny" >&2
done

if [ "${LEGO_RL_SKIP_DOCKER:-0}" != 1 ]; then
  say "base image for task containers"
  "$root/scripts/bootstrap-base-image.sh" >&2
fi
say "ok"
