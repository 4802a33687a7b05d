#!/usr/bin/env bash
# Expert parallelism memory (issue 25): bytes of routed-expert weights, gradients and AdamW state
# per rank, measured from the live tensors of a real CPU train-step (the metrics' extra
# expert_weight_bytes / expert_gradient_bytes / expert_optimizer_state_bytes), one process
# (EP=1) vs 2 ranks with --expert-parallel 2, same samples, same run, and the ratios (goal:
# <= 0.55x at EP=2). Also the whole optimizer state and gradients per rank, for scale, and a third
# column: 4 ranks at EP=2 with ZeRO-1 (dense moments sharded over 4 ranks, each expert's over the
# 2 ranks holding it), its ratio against EP=1.
# Usage: scripts/bench/ep_memory.sh [N_SEQS] [LEN]   (default 8 sequences of 256 tokens, 2 groups)
# CKPT=DIR picks an MoE checkpoint (default: the tiny Qwen3-MoE, 8 experts).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-8}
len=${2:-256}
"$py" scripts/make_tiny_models.py testdata/models/generated/tiny-qwen3-moe
ckpt=${CKPT:-testdata/models/generated/tiny-qwen3-moe}
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" "$n" "$len" $((len / 2)) 1 2>/dev/null
run() {
  local tag=$1; shift
  OMP_NUM_THREADS=1 target/release/lego-rl -q train-step --checkpoint "$ckpt" -i "$work/samples.jsonl" \
    --out "$work/out-$tag" --metrics "$work/$tag.jsonl.zst" --micro-batch-tokens "$len" --lr 1e-6 "$@"
  zstd -dcq "$work/$tag.jsonl.zst" | jq -r '.extra | [.expert_weight_bytes, .expert_gradient_bytes,
    .expert_optimizer_state_bytes, .gradient_bytes, .optimizer_state_bytes] | @tsv'
}
read -r w1 g1 o1 tg1 to1 < <(run ep1)
read -r w2 g2 o2 tg2 to2 < <(run ep2 --nproc-per-node 2 --expert-parallel 2 --zero 0)
read -r w3 g3 o3 tg3 to3 < <(run ep2z1 --nproc-per-node 4 --expert-parallel 2 --zero 1)
printf 'train-step %d x %d tokens, %s, bytes per rank (rank 0)\n' "$n" "$len" "$(basename "$ckpt")"
printf '  %-24s %12s %12s %7s %16s %7s\n' "" "EP=1" "EP=2" "ratio" "EP=2 ZeRO-1 x4" "ratio"
ratio() { echo "$2 / $1" | bc -l; }
row() { printf '  %-24s %12d %12d %6.3fx %16d %6.3fx\n' "$1" "$2" "$3" "$(ratio "$2" "$3")" "$4" "$(ratio "$2" "$4")"; }
row "expert weights" "$w1" "$w2" "$w3"
row "expert gradients" "$g1" "$g2" "$g3"
row "expert optimizer state" "$o1" "$o2" "$o3"
row "expert total" $((w1 + g1 + o1)) $((w2 + g2 + o2)) $((w3 + g3 + o3))
row "all gradients" "$tg1" "$tg2" "$tg3"
row "all optimizer state" "$to1" "$to2" "$to3"
echo '  (goal: expert total <= 0.55x at EP=2)'
