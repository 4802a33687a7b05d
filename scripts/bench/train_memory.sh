#!/usr/bin/env bash
# Activation checkpointing (train-step --activation-checkpointing) on long sequences: peak memory
# (max RSS) and time of one CPU train-step on the tiny Qwen3-MoE with and without it, same samples,
# same run; prints both and the ratios. Usage: scripts/bench/train_memory.sh [N_SEQS] [LEN]
# (defaults 2 sequences of 3072 tokens). CKPT=DIR picks the checkpoint (default: the tiny dense Qwen3,
# whose 4096-token vocabulary keeps the logits small, so layer activations dominate the peak; on
# the tiny MoE the 151936-wide logits of the scored positions dominate instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-2}
len=${2:-3072}
"$py" scripts/make_tiny_models.py testdata/models/generated/tiny-qwen3-moe
ckpt=${CKPT:-testdata/models/tiny-qwen3}
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" "$n" "$len" $((len / 2)) 0 2>/dev/null
run() {
  local tag=$1; shift
  /usr/bin/time -f "%M %e" -o "$work/$tag.time" target/release/lego-rl -q train-step --checkpoint "$ckpt" \
    -i "$work/samples.jsonl" --out "$work/out-$tag" --micro-batch-tokens "$len" --lr 1e-6 "$@"
  read -r kb secs <"$work/$tag.time"
  printf '%s %s\n' "$kb" "$secs"
}
read -r plain_kb plain_s < <(run plain)
read -r ckpt_kb ckpt_s < <(run ckpt --activation-checkpointing)
printf 'train-step %d x %d tokens, %s, CPU\n' "$n" "$len" "$(basename "$ckpt")"
printf '  plain:                  max RSS %7.0f MiB  %6.1f s\n' "$(echo "$plain_kb / 1024" | bc -l)" "$plain_s"
printf '  activation checkpoints: max RSS %7.0f MiB  %6.1f s\n' "$(echo "$ckpt_kb / 1024" | bc -l)" "$ckpt_s"
printf '  memory ratio %.2fx, time ratio %.2fx (checkpointed / plain)\n' \
  "$(echo "$ckpt_kb / $plain_kb" | bc -l)" "$(echo "$ckpt_s / $plain_s" | bc -l)"
