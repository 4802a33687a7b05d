#!/usr/bin/env bash
# Proxy overhead benchmark (issue 4): decode throughput of the embedded engine on the tiny
# Qwen3-MoE (CPU), called directly through the Backend trait vs through the lego-rl proxy
# (streaming OpenAI chat completions over HTTP, render + parse + capture), same prompts, same
# seeded sampling, same concurrency, alternating rounds in the same run. Prints tokens/s of both and the ratio (goal: the
# proxy path keeps >= 0.9x of direct engine throughput).
# Usage: scripts/bench/proxy.sh [CLIENTS] [REQUESTS_PER_CLIENT] [MAX_TOKENS]   (default 16 2 32)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
clients=${1:-16}
per_client=${2:-2}
max_tokens=${3:-32}
ckpt=testdata/models/generated/tiny-qwen3-moe
[ -f "$ckpt/reference.json" ] || "$py" scripts/make_tiny_models.py "$ckpt"
cargo build --release --quiet --example proxy_bench
out=$(target/release/examples/proxy_bench "$ckpt" testdata/tokenizer/qwen3 "$clients" "$per_client" "$max_tokens")
echo "$out"
eval "$out"
awk -v d="$direct_tok_per_s" -v p="$proxy_tok_per_s" -v c="$clients" -v n="$requests" 'BEGIN {
  printf "decode tiny-qwen3-moe CPU, %d clients, %d requests: direct engine %.0f tok/s, through the proxy %.0f tok/s, ratio %.2fx\n", c, n, d, p, p / d }'
