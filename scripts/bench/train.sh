#!/usr/bin/env bash
# CPU benchmark of one train-step on the tiny Qwen3-MoE (CKPT=testdata/models/generated/tiny-qwen3.5-moe
# or tiny-qwen3-next: the hybrid family, transformers on its pure-torch Gated DeltaNet): lego-rl vs a straightforward PyTorch
# (transformers) GSPO step on the same checkpoint and batch, in the same run. Prints tokens/s of
# both and the ratio (goal ≥ 1.0×); lego-rl runs twice, with the unchunked autograd LM head
# (--logprob-chunk 0, the trainer before the chunked head) and with the default chunked head, so
# the before/after ratios come from the same run. Both sides get the same intra-op thread count
# (OMP_NUM_THREADS, default: all cores; the peer prints torch.get_num_threads()).
# The bf16 column: the same step on the checkpoint in bfloat16 (`--dtype bfloat16`: weights and
# compute in bf16, fp32 master weights, gradients reduced and clipped in fp32) against PyTorch's
# own bf16 step with fp32 masters (train_reference.py step-bf16), same samples, same run. CPU bf16
# is slow on both sides; the ratio is the figure. BF16=0 skips it.
# The sampled column: the same samples recorded as drawn at temperature 0.7, top-k 50, top-p 0.9
# (`Sample::sampling`), so train-step recomputes that distribution (logits / T, the top-k and
# nucleus support: a sort of the vocabulary per position, src/model/sampled.rs); its ratio to the
# default column is what recomputing the behaviour policy costs. SAMPLED=0 skips it. The tiny
# model's head is all vocabulary-wide elementwise work (hidden size 64), so the ratio is a worst
# case; and a random model's distribution is nearly flat, so top-p alone (no top-k) keeps most of
# the vocabulary there, unlike a trained policy's nucleus.
# Usage: scripts/bench/train.sh [N_SEQS] [LEN]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
n=${1:-16}
len=${2:-256}
ckpt=${CKPT:-testdata/models/generated/tiny-qwen3-moe}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
"$py" scripts/make_tiny_models.py "$ckpt"
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" scripts/bench/train_reference.py make-samples "$ckpt" "$work/samples.jsonl" "$n" "$len" $((len / 2)) 0 2>/dev/null
peer=$("$py" scripts/bench/train_reference.py step "$ckpt" "$work/samples.jsonl" 2>/dev/null | tail -1)
ours() {
  rm -rf "$work/out" "$work/metrics.jsonl.zst"
  target/release/lego-rl -q train-step --checkpoint "$ckpt" -i "${samples:-$work/samples.jsonl}" --out "$work/out" \
    --metrics "$work/metrics.jsonl.zst" --micro-batch-tokens "$len" --lr 1e-6 "$@"
  "$py" -c "
import json, sys, zstandard
d = zstandard.ZstdDecompressor().stream_reader(open(sys.argv[1], 'rb'), read_across_frames=True).read().decode()
print(json.loads(d.splitlines()[-1])['tokens_per_second'])" "$work/metrics.jsonl.zst"
}
before=$(ours --logprob-chunk 0)
after=$(ours)
peer16=null
ours16=0
sampled=0
if [ "${SAMPLED:-1}" != 0 ]; then
  "$py" - "$work/samples.jsonl" "$work/sampled.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as dst:
    for line in src:
        if line.strip():
            s = json.loads(line)
            s["sampling"] = [{"start": 0, "temperature": 0.7, "top_k": 50, "top_p": 0.9}]
            dst.write(json.dumps(s) + "\n")
PY
  sampled=$(samples="$work/sampled.jsonl" ours)
fi
if [ "${BF16:-1}" != 0 ]; then
  peer16=$("$py" scripts/bench/train_reference.py step-bf16 "$ckpt" "$work/samples.jsonl" 2>/dev/null | tail -1)
  ours16=$(ours --dtype bfloat16)
fi
"$py" - "$before" "$after" "$peer" "$(basename "$ckpt")" "$peer16" "$ours16" "$sampled" <<'PY'
import json, sys
before, after = float(sys.argv[1]), float(sys.argv[2])
peer = json.loads(sys.argv[3])
p = peer["tokens_per_second"]
print(f"train-step {sys.argv[4]} CPU, {peer['threads']} torch threads both sides:")
print(f"  pytorch                         {p:8.0f} tok/s")
print(f"  lego-rl unchunked head          {before:8.0f} tok/s  ratio {before / p:.2f}x")
print(f"  lego-rl chunked head (default)  {after:8.0f} tok/s  ratio {after / p:.2f}x")
sampled = float(sys.argv[7])
if sampled:
    print(f"  lego-rl, T 0.7 top-k 50 top-p 0.9 recomputed  {sampled:8.0f} tok/s  {sampled / after:.2f}x the default")
peer16 = json.loads(sys.argv[5])
if peer16:
    p16, o16 = peer16["tokens_per_second"], float(sys.argv[6])
    print(f"  bf16 + fp32 masters: pytorch    {p16:8.0f} tok/s")
    print(f"  bf16 + fp32 masters: lego-rl    {o16:8.0f} tok/s  ratio {o16 / p16:.2f}x")
PY
