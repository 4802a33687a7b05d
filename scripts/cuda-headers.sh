#!/usr/bin/env bash
# CUDA headers for building lego-rl's CUDA paths without a CUDA toolkit: the c10d shim's NCCL path
# (src/c10d/shim.cpp with USE_C10D_NCCL) needs cuda_runtime.h, crt/ and libcu++, which the torch
# wheel's nvidia-cuda-runtime lacks. They come from PyPI, matching the CUDA runtime wheel torch
# pulls in: the runtime wheel's include/ plus nvidia-cuda-crt (crt/) and nvidia-cuda-cccl
# (libcu++), unpacked once into $LEGO_RL_CACHE/cuda-headers-<version> (a CUDA_HOME for build.rs).
#
# usage: scripts/cuda-headers.sh [PYTHON]   (default: the checkout's .venv/bin/python)
# Prints that CUDA_HOME and exits 0; exits 3 (printing nothing) when the torch wheel has no CUDA
# (a CPU-only torch): build.rs then builds the CPU-only binary. Needs network on first use only.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${LEGO_RL_CACHE:-$HOME/.cache/lego-rl}
py=${1:-$root/.venv/bin/python}
say() { printf 'cuda-headers: %s\n' "$*" >&2; }

torch=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
site=$(dirname "$torch")
runtime=$("$py" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime"))' 2>/dev/null) || {
  say "the torch wheel has no nvidia-cuda-runtime (a CPU-only torch): no CUDA headers"; exit 3; }
[ -f "$torch/lib/libtorch_cuda.so" ] || { say "no libtorch_cuda.so in $torch/lib: no CUDA headers"; exit 3; }
series=${runtime%.*}
home="$cache/cuda-headers-$runtime"
if [ ! -f "$home/.complete" ]; then
  say "CUDA $series.* headers from PyPI into $home"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip download --no-deps -q -d "$tmp" "nvidia-cuda-crt==$series.*" "nvidia-cuda-cccl==$series.*"
  rm -rf "$home" && mkdir -p "$home/include"
  cp -r "$site"/nvidia/cu*/include/. "$home/include/"
  for w in "$tmp"/*.whl; do
    "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$tmp/x"
  done
  cp -r "$tmp"/x/nvidia/cu*/include/. "$home/include/"
  touch "$home/.complete"
fi
echo "$home"
