#!/usr/bin/env bash
# Prefix cache benchmark (issue 26): the embedded engine with its prefix cache (default budget) and
# without it (--prefix-cache-bytes 0), same run, same process, through the lego-rl proxy, on the
# tiny Qwen3-MoE (CPU) with its context raised to 65536 tokens:
#   1. a real Claude Code episode (testdata/harness-traffic/claude-code/requests.jsonl: its POST
#      requests, ~27k tokens each, replayed in order through one trial, MAX_TOKENS sampled each);
#   2. a group of GROUP trials sending the episode's first request at once (a GSPO group's
#      shared first prompt), from an empty cache.
# Prints wall time of both modes and the speed-up (goal: episode >= 3x), prefill tokens computed
# against the prompt tokens received, and the episode's unique prompt tokens (a trie of its
# prompts: what an ideal cache computes; goal: prefill <= 1.3x unique).
# Measured 2026-12-01 (2 shared CPU cores, defaults): episode of 5 requests, 137390 prompt tokens, 27676
# unique: off 75.5 s, on 23.3 s = 3.23x; prefill tokens 137390 -> 27676 = 1.00x unique. Group of 8
# (217576 prompt tokens): off 131.5 s, on 20.1 s = 6.55x; prefill tokens 217576 -> 27204.
# Usage: scripts/bench/prefix_cache.sh [MAX_TOKENS] [GROUP] [REQUESTS_JSONL]   (default 16 8 claude-code)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
max_tokens=${1:-16}
group=${2:-8}
requests=${3:-testdata/harness-traffic/claude-code/requests.jsonl}
ckpt=testdata/models/generated/tiny-qwen3-moe
[ -f "$ckpt/reference.json" ] || "$py" scripts/make_tiny_models.py "$ckpt"
cargo build --release --quiet --example prefix_cache_bench
out=$(target/release/examples/prefix_cache_bench "$ckpt" testdata/tokenizer/qwen3 "$requests" "$max_tokens" "$group")
echo "$out"
eval "$out"
awk -v n="$episode_requests" -v g="$group" \
  -v es0="$off_episode_seconds" -v es1="$on_episode_seconds" \
  -v ep="$on_episode_prompt_tokens" -v ef0="$off_episode_prefill_tokens" -v ef1="$on_episode_prefill_tokens" \
  -v eu="$on_episode_unique_tokens" \
  -v gs0="$off_group_seconds" -v gs1="$on_group_seconds" \
  -v gp="$on_group_prompt_tokens" -v gf0="$off_group_prefill_tokens" -v gf1="$on_group_prefill_tokens" 'BEGIN {
  printf "episode (%d requests, %d prompt tokens, %d unique): off %.2fs, on %.2fs, speed-up %.2fx; prefill tokens off %d, on %d = %.2fx unique\n",
    n, ep, eu, es0, es1, es0 / es1, ef0, ef1, ef1 / eu
  printf "group of %d (%d prompt tokens): off %.2fs, on %.2fs, speed-up %.2fx; prefill tokens off %d, on %d\n",
    g, gp, gs0, gs1, gs0 / gs1, gf0, gf1
}'
