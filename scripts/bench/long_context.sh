#!/usr/bin/env bash
# Long-context memory of one CPU train-step (issue 55). For each total length T (default 4096,
# 16384 and 65536 tokens) one train-step of the tiny Qwen3 (testdata/models/tiny-qwen3, fp32)
# runs on
#   one sequence of T tokens, and
#   8 sequences of T/8 tokens packed into one micro-batch (--micro-batch-tokens T),
# half of each sequence scored, with `--loss sft` (a group of one sequence has advantage 0 and
# GSPO would skip its backward; the passes and what autograd keeps are the same). Beside each,
# the same forward + backward in plain PyTorch:
# transformers' Qwen3 with `F.scaled_dot_product_attention` (attn_implementation="sdpa"), one
# call per sequence, in the same run. Printed per row: max RSS; the step's own memory (max RSS
# less a 256-token step's, i.e. less libtorch and the weights) per token; time per token;
# lego-rl / torch ratios; and `--plan`'s backward peak for the launch (less its 256-token one)
# against the step's own memory. Memory per token flat as T grows is the goal: a packed
# micro-batch attends segment by segment (no [T, T] mask), and the head is chunked.
# Usage: scripts/bench/long_context.sh [LENGTHS...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
ckpt=testdata/models/tiny-qwen3
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(4096 16384 65536)
[ -x target/release/lego-rl ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Samples: random token ids; the rollout log-probs are a constant (the step's arithmetic and
# memory do not depend on their values; scoring 64k tokens with an eager reference would not fit).
make_samples() {
  "$py" - "$1" "$2" "$3" <<'PY'
import base64, json, random, struct, sys
out, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
prompt = length // 2
with open(out, "w") as f:
    for i in range(n):
        lp = struct.pack(f"<{length - prompt}f", *([-8.3] * (length - prompt)))
        f.write(json.dumps({
            "schema": "lego-rl/sample/v1", "id": f"t{i}#0.0", "trajectory_id": f"t{i}",
            "task_id": "task0", "group_id": 0, "sample_index": i,
            "token_ids": [rng.randrange(4096) for _ in range(length)],
            "loss_mask": [prompt, length - prompt],
            "rollout_logprobs": {"dtype": "f32", "shape": [length - prompt], "data": base64.b64encode(lp).decode()},
            "reward": float(i % 2), "weight": 1.0, "policy_version": 0,
        }) + "\n")
PY
}

step() { # N LEN T: max RSS (KiB) and seconds of one train-step
  make_samples "$work/s.jsonl" "$1" "$2"
  /usr/bin/time -f "%M %e" -o "$work/lego.time" target/release/lego-rl -q train-step --checkpoint "$ckpt" \
    -i "$work/s.jsonl" --out "$work/out" --micro-batch-tokens "$3" --lr 1e-6 --logprob-chunk 256 --loss sft
  rm -rf "$work/out"
  cat "$work/lego.time"
}
plan_peak() { # T: the plan's backward peak in bytes
  target/release/lego-rl train-step --plan --format json --checkpoint "$ckpt" --micro-batch-tokens "$1" \
    --logprob-chunk 256 | "$py" -c 'import json,sys; print(json.load(sys.stdin)["backward_peak"])'
}

# Plain torch: forward + backward of the same sequences, one sdpa call per sequence and layer.
torch_peer() {
  TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 /usr/bin/time -f "%M %e" -o "$work/torch.time" "$py" - "$ckpt" "$1" "$2" <<'PY' >/dev/null
import sys, torch, transformers
ckpt, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="sdpa").train()
g = torch.Generator().manual_seed(0)
for _ in range(n):
    ids = torch.randint(0, 4096, (1, length), generator=g)
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[0, length // 2 - 1 : -1]
    # Chunked head, as lego-rl's: never the whole [tokens, vocab] logits at once.
    loss = 0.0
    for c in hidden.split(256):
        loss = loss + torch.log_softmax(model.lm_head(c), -1)[:, 0].sum()
    loss.backward()
PY
  cat "$work/torch.time"
}

read -r base_kb _ < <(step 1 256 256)
base_plan=$(plan_peak 256)
printf 'one train-step, %s (fp32), CPU, %s threads; half of each sequence scored; a 256-token step: %.0f MiB\n' \
  "$(basename "$ckpt")" "$(nproc)" "$(echo "$base_kb / 1024" | bc -l)"
printf '%-14s %9s %10s %8s %8s %10s %7s %7s %10s %9s\n' layout "RSS MiB" "step MiB" "KiB/tok" "ms/tok" \
  "torch MiB" "mem x" "time x" "plan MiB" "plan/step"
for t in "${lengths[@]}"; do
  for n in 1 8; do
    len=$((t / n))
    read -r kb secs < <(step "$n" "$len" "$t")
    read -r tkb tsecs < <(torch_peer "$n" "$len")
    plan=$(( $(plan_peak "$t") - base_plan ))
    own=$((kb - base_kb))
    printf '%-14s %9.0f %10.0f %8.2f %8.3f %10.0f %7.2f %7.2f %10.0f %9.2f\n' "$n x $len" \
      "$(echo "$kb / 1024" | bc -l)" "$(echo "$own / 1024" | bc -l)" "$(echo "$own / $t" | bc -l)" \
      "$(echo "$secs * 1000 / $t" | bc -l)" "$(echo "$tkb / 1024" | bc -l)" "$(echo "$kb / $tkb" | bc -l)" \
      "$(echo "$secs / $tsecs" | bc -l)" "$(echo "$plan / 1048576" | bc -l)" "$(echo "$plan / 1024 / $own" | bc -l)"
  done
done
echo '  (step MiB: max RSS less the 256-token step'"'"'s; KiB/tok flat as T grows = linear memory;'
echo '   mem x, time x: lego-rl / plain torch (whole max RSS, wall time) in the same run)'
