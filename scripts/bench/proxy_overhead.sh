#!/usr/bin/env bash
# Proxy overhead (issue 4): the lego-rl proxy vs the LiteLLM proxy (PyPI `litellm[proxy]`), each in front
# of the same fast fake backend, same load, same run. The backend (scripts/bench/proxy_overhead.rs `fake`)
# answers at once with the same TOKENS-token answer in two shapes: vLLM's token-id `/v1/completions`
# (what lego-rl's `vllm:` backend calls) and OpenAI's streaming chat (what LiteLLM's `openai/` provider
# calls). The load (same driver, `load`): CLIENTS concurrent clients sending streaming chat completions back
# to back for SECONDS; latency = request sent → `data: [DONE]`. Added latency = proxy p50/p99 minus the
# p50/p99 of the same load sent straight to the fake backend's chat endpoint. lego-rl does more per request
# than LiteLLM (renders the chat template, tokenizes, detokenizes and parses the output, records the capture).
# LiteLLM runs in its own venv (~/.cache/lego-rl/bench-venvs/litellm, created on first use), one worker, as
# `litellm --config`; its telemetry and remote cost-map fetch are off, and no master key is set (no
# authentication, its cheapest set-up; lego-rl's plain paths check nothing either).
# Usage: scripts/bench/proxy_overhead.sh [CLIENTS] [SECONDS] [TOKENS]   (default 64 10 16)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
clients=${1:-64}
seconds=${2:-10}
tokens=${3:-16}
venv=${LEGO_RL_LITELLM_VENV:-$HOME/.cache/lego-rl/bench-venvs/litellm}
if [ ! -x "$venv/bin/litellm" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'litellm[proxy]'
fi
cargo build --release --quiet --example proxy_overhead
bin=target/release/examples/proxy_overhead
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 1500); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done; echo "not up: $1 (log: $2)" >&2; cat "$2" >&2; exit 2; }

fake_port=$(port)
"$bin" fake "$fake_port" "$tokens" > "$tmp/fake.log" 2>&1 & pids+=($!)
wait_up "http://127.0.0.1:$fake_port/v1/models" "$tmp/fake.log"
lego_port=$(port)
"$bin" lego "$lego_port" "http://127.0.0.1:$fake_port" testdata/tokenizer/qwen3 > "$tmp/lego.log" 2>&1 & pids+=($!)
wait_up "http://127.0.0.1:$lego_port/v1/models" "$tmp/lego.log"
litellm_port=$(port)
cat > "$tmp/litellm.yaml" <<YAML
model_list:
  - model_name: fake
    litellm_params:
      model: openai/fake
      api_base: http://127.0.0.1:$fake_port/v1
      api_key: sk-fake
litellm_settings:
  telemetry: false
YAML
LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY=true LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False LITELLM_LOG=ERROR \
  "$venv/bin/litellm" --config "$tmp/litellm.yaml" --host 127.0.0.1 --port "$litellm_port" --num_workers 1 \
  > "$tmp/litellm.log" 2>&1 & pids+=($!)
wait_up "http://127.0.0.1:$litellm_port/health/liveliness" "$tmp/litellm.log"

run() { "$bin" load "$1" "$clients" "$seconds" | sed "s/^/$2_/"; }
direct=$(run "http://127.0.0.1:$fake_port/v1/chat/completions" direct)
lego=$(run "http://127.0.0.1:$lego_port/v1/chat/completions" lego)
litellm=$(run "http://127.0.0.1:$litellm_port/v1/chat/completions" litellm)
printf '%s\n%s\n%s\n' "$direct" "$lego" "$litellm"
eval "$direct"; eval "$lego"; eval "$litellm"
awk -v c="$clients" -v t="$tokens" \
  -v d50="$direct_p50_ms" -v d99="$direct_p99_ms" -v drps="$direct_req_per_s" \
  -v g50="$lego_p50_ms" -v g99="$lego_p99_ms" -v grps="$lego_req_per_s" \
  -v l50="$litellm_p50_ms" -v l99="$litellm_p99_ms" -v lrps="$litellm_req_per_s" 'BEGIN {
  ga50 = g50 - d50; ga99 = g99 - d99; la50 = l50 - d50; la99 = l99 - d99
  printf "proxy overhead, %d concurrent streaming clients, %d-token answers from a fake backend (direct: p50 %.2f ms, p99 %.2f ms, %.0f req/s)\n", c, t, d50, d99, drps
  printf "  lego-rl: added p50 %.2f ms, p99 %.2f ms, %.0f req/s\n", ga50, ga99, grps
  printf "  LiteLLM: added p50 %.2f ms, p99 %.2f ms, %.0f req/s\n", la50, la99, lrps
  printf "  ratios: added latency lego-rl/LiteLLM p50 %.3f, p99 %.3f (goal <= 0.1); throughput lego-rl/LiteLLM %.1fx (goal >= 10x)\n", ga50 / la50, ga99 / la99, grps / lrps }'
