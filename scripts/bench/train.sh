#!/usr/bin/env bash
# CPU benchmark of one train-step on the tiny Qwen3-MoE: lego-rl vs a straightforward PyTorch
# (transformers) GSPO step on the same checkpoint and batch, in the same run. Prints tokens/s of
# both and the ratio (goal ≥ 1.0×). Usage: scripts/bench/train.sh [N_SEQS] [LEN]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-16}
len=${2:-256}
ckpt=testdata/models/generated/tiny-qwen3-moe
"$py" scripts/make_tiny_models.py "$ckpt"
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" "$n" "$len" $((len / 2)) 0 2>/dev/null
peer=$("$py" scripts/bench/train_reference.py step "$ckpt" "$work/samples.jsonl" 2>/dev/null | tail -1)
target/release/lego-rl train-step --checkpoint "$ckpt" -i "$work/samples.jsonl" --out "$work/out" \
  --metrics "$work/metrics.jsonl.zst" --micro-batch-tokens "$len" --lr 1e-6
ours=$("$py" -c "
import json, sys, zstandard
d = zstandard.ZstdDecompressor().stream_reader(open(sys.argv[1], 'rb')).read().decode()
print(json.loads(d.splitlines()[-1])['tokens_per_second'])" "$work/metrics.jsonl.zst")
"$py" - "$ours" "$peer" <<'PY'
import json, sys
ours = float(sys.argv[1]); peer = json.loads(sys.argv[2])["tokens_per_second"]
print(f"train-step tiny-qwen3-moe CPU: lego-rl {ours:.0f} tok/s, pytorch {peer:.0f} tok/s, ratio {ours / peer:.2f}x")
PY
