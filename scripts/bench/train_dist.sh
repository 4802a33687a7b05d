#!/usr/bin/env bash
# One train-step on 1 rank and on 2 local Gloo ranks (--nproc-per-node 2; --zero 0 and --zero 1),
# same samples, same checkpoint: optimizer-state and gradient bytes per rank, from the step
# metrics' own accounting (extra.optimizer_state_bytes, extra.gradient_bytes), the step's time
# (metrics `seconds`: the step without loading, and the whole invocation's wall time), and the
# ratios to 1 rank. Gradient bytes are the parameters' .grad (full size on every rank) plus the
# reduced 1/N chunks ZeRO-1 keeps; ZeRO-1 shards the optimizer state, not the gradients.
# Goal: ZeRO-1 optimizer state per rank ≤ 0.55× of 1 rank's at N = 2. On a
# 2-core machine two ranks share the cores, so the time ratio is reported, with no goal.
# Usage: scripts/bench/train_dist.sh [N_SEQS] [LEN] (defaults 16 sequences of 256 tokens, half
# scored, groups of 4). CKPT=DIR picks the checkpoint (default: the tiny Qwen3-MoE).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-16}
len=${2:-256}
"$py" scripts/make_tiny_models.py testdata/models/generated/tiny-qwen3-moe
ckpt=${CKPT:-testdata/models/generated/tiny-qwen3-moe}
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" "$n" "$len" $((len / 2)) 0 2>/dev/null
run() {
  local tag=$1; shift
  /usr/bin/time -f "%e" -o "$work/$tag.time" target/release/lego-rl -q train-step --checkpoint "$ckpt" \
    -i "$work/samples.jsonl" --out "$work/out-$tag" --metrics "$work/$tag.jsonl.zst" \
    --micro-batch-tokens "$len" --lr 1e-6 "$@"
  zstd -dcq "$work/$tag.jsonl.zst" |
    jq -r --arg wall "$(cat "$work/$tag.time")" \
      '"\(.extra.optimizer_state_bytes) \(.extra.gradient_bytes) \(.seconds) \($wall)"'
}
read -r one_opt one_grad one_s one_wall < <(run one)
read -r z0_opt z0_grad z0_s z0_wall < <(run zero0 --nproc-per-node 2 --zero 0)
read -r z1_opt z1_grad z1_s z1_wall < <(run zero1 --nproc-per-node 2 --zero 1)
mib() { echo "$1 / 1048576" | bc -l; }
ratio() { echo "$1 / $2" | bc -l; }
printf 'train-step, %d x %d tokens, %s, CPU (Gloo)\n' "$n" "$len" "$(basename "$ckpt")"
printf '  %-22s %16s %16s %10s %10s\n' "" "optimizer/rank" "gradients/rank" "step s" "wall s"
line() {
  printf '  %-22s %11.1f MiB %11.1f MiB %10.2f %10.2f\n' "$1" "$(mib "$2")" "$(mib "$3")" "$4" "$5"
}
line "1 rank" "$one_opt" "$one_grad" "$one_s" "$one_wall"
line "2 ranks, --zero 0" "$z0_opt" "$z0_grad" "$z0_s" "$z0_wall"
line "2 ranks, --zero 1" "$z1_opt" "$z1_grad" "$z1_s" "$z1_wall"
printf '  ratios to 1 rank: --zero 1 optimizer state %.3fx (goal <= 0.55), gradient bytes %.3fx; step time --zero 0 %.2fx, --zero 1 %.2fx\n' \
  "$(ratio "$z1_opt" "$one_opt")" "$(ratio "$z1_grad" "$one_grad")" "$(ratio "$z0_s" "$one_s")" "$(ratio "$z1_s" "$one_s")"
