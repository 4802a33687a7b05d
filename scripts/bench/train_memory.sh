#!/usr/bin/env bash
# Peak memory (max RSS) and time of one CPU train-step on long sequences, same samples, same run,
# in three configurations:
#   unchunked head    --logprob-chunk 0: all scored positions' [positions, vocab] logits at once,
#                     differentiated by autograd (the trainer before the chunked head)
#   chunked head      --logprob-chunk N (default 256): graph-free head, N × vocab logits at most
#   + checkpointing   chunked head and --activation-checkpointing (one layer's activations)
# and the ratios to the first. Usage: scripts/bench/train_memory.sh [N_SEQS] [LEN] [CHUNK]
# (defaults 2 sequences of 3072 tokens, half of them scored, chunk 256; one sequence per
# micro-batch). CKPT=DIR picks the checkpoint (default: the tiny Qwen3-MoE, whose 151936-token
# vocabulary makes the head's logits the largest tensors; CKPT=testdata/models/tiny-qwen3, 4096
# tokens, shows the activation side instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-2}
len=${2:-3072}
chunk=${3:-256}
"$py" scripts/make_tiny_models.py testdata/models/generated/tiny-qwen3-moe
ckpt=${CKPT:-testdata/models/generated/tiny-qwen3-moe}
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
read -r plain_kb plain_s < <(run plain --logprob-chunk 0)
read -r chunk_kb chunk_s < <(run chunk --logprob-chunk "$chunk")
read -r both_kb both_s < <(run both --logprob-chunk "$chunk" --activation-checkpointing)
mib() { echo "$1 / 1024" | bc -l; }
printf 'train-step %d x %d tokens (%d scored each), %s, CPU\n' "$n" "$len" $((len / 2)) "$(basename "$ckpt")"
printf '  unchunked head:                  max RSS %7.0f MiB  %6.1f s\n' "$(mib "$plain_kb")" "$plain_s"
printf '  chunked head (%5d):            max RSS %7.0f MiB  %6.1f s   memory %.2fx, time %.2fx\n' \
  "$chunk" "$(mib "$chunk_kb")" "$chunk_s" "$(echo "$chunk_kb / $plain_kb" | bc -l)" "$(echo "$chunk_s / $plain_s" | bc -l)"
printf '  chunked + activation checkpoints: max RSS %7.0f MiB  %6.1f s   memory %.2fx, time %.2fx\n' \
  "$(mib "$both_kb")" "$both_s" "$(echo "$both_kb / $plain_kb" | bc -l)" "$(echo "$both_s / $plain_s" | bc -l)"
echo '  (ratios: configuration / unchunked head)'
