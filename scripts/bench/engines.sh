#!/usr/bin/env bash
# Engines benchmark (issue 36): the embedded engine vs a real vLLM-CPU (scripts/install-vllm.sh)
# on the same head_dim-32 tiny Qwen3-MoE (fp32), same requests, same run, both through the
# Backend trait (scripts/bench/engines_bench.rs; vLLM over HTTP, started by lego-rl's supervisor
# as `rollout --backend vllm-serve` starts it). Prints prefill and decode tokens/s (1 stream and
# 8), the time to reload the checkpoint (vLLM: in place, verified with the probe, restarted when
# the check fails, which on vllm-cpu 0.32.0 it does for MoE), and vLLM/embedded ratios.
# Both engines use this machine's cores (torch's default threads; vLLM's OpenMP binding).
# Usage: scripts/bench/engines.sh [PROMPT_TOKENS] [NEW_TOKENS] [RUNS]   (default 1024 64 3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
prompt=${1:-1024}
new=${2:-64}
runs=${3:-3}
ckpt=testdata/models/generated/tiny-qwen3-moe-hd32
[ -f "$ckpt/reference.json" ] || "${LEGO_RL_PYTHON:-$root/.venv/bin/python}" scripts/make_tiny_models.py "$ckpt"
python=${LEGO_RL_VLLM:-$("$root/scripts/install-vllm.sh")}
cargo build --release --quiet --example engines_bench
out=$(target/release/examples/engines_bench "$ckpt" "$python" "$prompt" "$new" "$runs")
echo "$out"
eval "$(echo "$out" | grep -E '^[a-z0-9_]+=')"
awk -v ep="$embedded_prefill_tok_per_s" -v vp="$vllm_prefill_tok_per_s" \
    -v e1="$embedded_decode1_tok_per_s" -v v1="$vllm_decode1_tok_per_s" \
    -v e8="$embedded_decode8_tok_per_s" -v v8="$vllm_decode8_tok_per_s" \
    -v er="$embedded_reload_s" -v vr="$vllm_reload_s" -v rs="$vllm_reload_restarts" -v p="$prompt" -v n="$new" 'BEGIN {
  printf "prefill %d tokens: embedded %.0f tok/s, vLLM-CPU %.0f tok/s, vLLM/embedded %.2fx\n", p, ep, vp, vp / ep
  printf "decode %d tokens, 1 stream: embedded %.1f tok/s, vLLM-CPU %.1f tok/s, vLLM/embedded %.2fx\n", n, e1, v1, v1 / e1
  printf "decode %d tokens, 8 streams: embedded %.1f tok/s, vLLM-CPU %.1f tok/s, vLLM/embedded %.2fx\n", n, e8, v8, v8 / e8
  printf "reload: embedded %.2f s, vLLM-CPU %.2f s (%d restart(s)), vLLM/embedded %.1fx\n", er, vr, rs, vr / er }'
