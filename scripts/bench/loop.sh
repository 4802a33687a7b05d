#!/usr/bin/env bash
# Asynchronous vs synchronous loop (issue: the whole loop). Runs scripts/loop.sh twice on the demo
# configuration — the tiny model, the testdata task with scripted continuations, mini-swe-agent in
# local Docker — once with --max-staleness 1 (rollout of batch s+1 overlaps train-step s) and once
# with --sync (strictly alternating), same steps, same seeds, in the same run, and prints steps per
# hour of each and the ratio (the paper: ~1.0 h vs 1.9 h per step at scale).
# Usage: scripts/bench/loop.sh [STEPS] [GROUP_SIZE]   (defaults 3, 8). Needs scripts/setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
steps=${1:-3}
group=${2:-8}
lego="$root/target/release/lego-rl"
forced="$root/testdata/rollout/inflection.json"
harness="$root/examples/harnesses/mini-swe-agent.toml"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$lego" -q filter-tasks -i "$root/testdata/tasks/tasks.jsonl" -o "$work/kept.jsonl.zst"
ids=$(jq -r '.tasks | keys[]' "$forced")
zstd -dc "$work/kept.jsonl.zst" | jq -c --arg ids "$ids" 'select(.id as $i | ($ids | split("\n")) | index($i))' \
  >"$work/tasks.jsonl"
"$lego" -q build-images -i "$work/tasks.jsonl" -o "$work/images.jsonl.zst" --harness "$harness"

run_mode() {
  local mode=$1 t0 t1
  t0=$(date +%s.%N)
  "$root/scripts/loop.sh" --run "$work/$mode" --tasks "$work/tasks.jsonl" --images "$work/images.jsonl.zst" \
    --checkpoint "$root/testdata/models/generated/tiny-qwen3-moe" --steps "$steps" --group-size "$group" \
    --harness "$harness" --rollout-args "--forced $forced --max-turns 6 --seed 1" \
    $([ "$mode" = sync ] && echo --sync) 2>"$work/$mode.log" >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
async_s=$(run_mode async)
sync_s=$(run_mode sync)
printf 'loop bench: %d steps, group %d\n' "$steps" "$group"
printf '  async (max staleness 1): %8.1f s  %6.1f steps/h\n' "$async_s" "$(echo "$steps * 3600 / $async_s" | bc -l)"
printf '  sync:                    %8.1f s  %6.1f steps/h\n' "$sync_s" "$(echo "$steps * 3600 / $sync_s" | bc -l)"
printf '  async / sync throughput: %.2fx\n' "$(echo "$sync_s / $async_s" | bc -l)"
