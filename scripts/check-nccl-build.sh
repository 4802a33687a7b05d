#!/usr/bin/env bash
# Compiles the c10d shim's NCCL path (src/c10d/shim.cpp with USE_C10D_NCCL) on a machine without a
# CUDA toolkit or GPU, and checks that every NCCL symbol it needs is exported by the torch wheel's
# libtorch_cuda.so. It does not run anything on a GPU: it proves that `cargo build --features nccl`
# compiles and links against torch 2.11's ProcessGroupNCCL.
#
# The CUDA headers come from PyPI (scripts/cuda-headers.sh, which scripts/setup.sh also runs so that
# the release build links libtorch_cuda with the NCCL path). Needs scripts/setup.sh first.
#
# usage: scripts/check-nccl-build.sh          (prints the CUDA_HOME it made on success)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$root/.venv/bin/python"
torch=$(readlink -f "$root/.libtorch")
site=$(dirname "$torch")
say() { printf 'check-nccl-build: %s\n' "$*" >&2; }

[ -x "$py" ] && [ -d "$torch/include" ] || { say "run scripts/setup.sh first"; exit 2; }
home=$("$root/scripts/cuda-headers.sh" "$py") || { say "no CUDA headers (see above)"; exit 2; }

gloo=$(mktemp -d)
for name in gloo/algorithm.h gloo/common/error.h gloo/context.h gloo/rendezvous/store.h gloo/transport/device.h; do
  mkdir -p "$gloo/$(dirname "$name")"
  printf '#pragma once\n#include "%s"\n' "$root/src/c10d/gloo_decls.h" >"$gloo/$name"
done
obj=$(mktemp --suffix=.o)
say "compiling src/c10d/shim.cpp with USE_C10D_NCCL"
g++ -c -O1 -fPIC -Wno-interference-size -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DGLOG_USE_GLOG_EXPORT -DUSE_C10D_GLOO \
  -DUSE_C10D_NCCL -DLEGO_RL_NCCL -I"$torch/include" -I"$torch/include/torch/csrc/api/include" -I"$gloo" \
  -I"$home/include" -I"$home/include/cccl" -I"$site/nvidia/nccl/include" "$root/src/c10d/shim.cpp" -o "$obj"
missing=0
exported=$(nm -D --defined-only "$torch/lib/libtorch_cuda.so" | awk '{print $3}')
for sym in $(nm -u "$obj" | awk '{print $2}' | grep -i nccl); do
  if ! grep -qxF "$sym" <<<"$exported"; then
    say "missing in libtorch_cuda.so: $(echo "$sym" | c++filt)"
    missing=1
  fi
done
rm -rf "$gloo" "$obj"
[ "$missing" = 0 ] || exit 1
say "ok: the NCCL path compiles and its symbols resolve in libtorch_cuda.so"
echo "$home"
