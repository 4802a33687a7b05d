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
#
# scripts/bench/train_memory.sh masters: the optimizer state per rank of a bf16 checkpoint (the tiny
# Qwen3-MoE in bf16: fp32 moments + fp32 master weights), measured by the step (its metrics'
# optimizer_state_bytes, from the live tensors) at world 1 and at world 2 with --zero 1, against
# the optimizer + master rows of `--plan` for the same launch.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
if [ "${1:-}" = masters ]; then
  ckpt=testdata/models/generated/tiny-qwen3-moe-bf16
  "$py" scripts/make_tiny_models.py "$ckpt"
  [ -x target/release/lego-rl ] || cargo build --release --quiet
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" 16 64 32 1 2>/dev/null
  printf 'optimizer state per rank, %s (bf16 weights, fp32 moments and masters), CPU\n' "$(basename "$ckpt")"
  for world in 1 2; do
    zero=$((world > 1 ? 1 : 0))
    target/release/lego-rl -q train-step --checkpoint "$ckpt" -i "$work/samples.jsonl" --out "$work/out-$world" \
      --metrics "$work/m-$world.jsonl.zst" --micro-batch-tokens 64 --lr 1e-5 --nproc-per-node "$world" --zero "$zero"
    target/release/lego-rl train-step --plan --format json --checkpoint "$ckpt" --world-size "$world" --zero "$zero" \
      >"$work/plan-$world.json"
    "$py" - "$work/m-$world.jsonl.zst" "$work/plan-$world.json" "$world" "$zero" <<'PY'
import json, sys, zstandard
d = zstandard.ZstdDecompressor().stream_reader(open(sys.argv[1], 'rb'), read_across_frames=True).read().decode()
m = json.loads(d.splitlines()[-1])
plan = json.load(open(sys.argv[2]))
measured = m["extra"]["optimizer_state_bytes"]
moments, masters = plan["optimizer"], plan["masters"]
planned = moments["dense"] + moments["experts"] + masters["dense"] + masters["experts"]
mib = 1 << 20
print(f"  world {sys.argv[3]}, ZeRO-{sys.argv[4]}: measured {measured / mib:8.2f} MiB, plan {planned / mib:8.2f} MiB "
      f"(moments {(moments['dense'] + moments['experts']) / mib:.2f} + masters {(masters['dense'] + masters['experts']) / mib:.2f}), "
      f"measured/plan {measured / planned:.4f}")
PY
  done
  exit 0
fi
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
