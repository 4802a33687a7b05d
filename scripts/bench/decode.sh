#!/usr/bin/env bash
# Decode benchmark (issue 4): the embedded engine on the tiny Qwen3-MoE (CPU, fp32) vs transformers
# `generate()` on the same checkpoint, same prompt ids, same number of new tokens, greedy, same
# number of torch threads, same run. Also the LM head's matmul alone (memory-bound, the same work on
# both sides) and the ratio it bounds: transformers' step / head time. The engine is driven
# directly through the Backend trait (scripts/bench/decode_bench.rs: one request at a time, no
# HTTP); transformers through
# model.generate with its KV cache (scripts/bench/decode_reference.py). Both time whole generations
# (prefill + NEW_TOKENS decode steps) after a warm-up. Prints tokens/s of both, the ratio (goal:
# engine >= 2x transformers), and how many of the greedy tokens agree (same work done).
# A fifth argument TEMPERATURE > 0 measures temperature sampling on both sides instead (top_k=0
# for transformers; the tokens then differ, the work per token does not), and a sixth, TOP_P < 1,
# nucleus sampling (both sides find the nucleus; transformers sorts the whole row on every token,
# the engine sorts only as much of it as the nucleus needs). LEGO_RL_BENCH_CKPT measures another
# checkpoint: a trained policy's peaked distribution has a small nucleus (the learn benchmark's
# warm start: runs/learn/checkpoints/step-000040), the random tiny model's nearly flat one the
# largest there is.
# The engine is timed twice in the same run: with its prefix cache (the default; after the warm-up
# each run finds all of its prompt but the last token cached) and without (every run prefills the
# whole prompt, as transformers' generate does); the ratio line is printed for both.
# Then, in the same run, concurrent throughput of the engine alone: 1, 4 and 8 requests at once
# (NEW_TOKENS each), with batched decode (one forward for all decoding sequences) and with the
# decode batch capped at 1 (the former interleaving: one forward per sequence per step); prints
# tokens/s of both, batched/interleaved, each level's throughput over 1 request, and how many
# tokens both produced alike (all when greedy; sampling the random model's nearly uniform
# distribution can part on ~1e-6 log-prob noise from the batched matmuls' summation order).
# Usage: scripts/bench/decode.sh [NEW_TOKENS] [RUNS] [THREADS] [PROMPT_TOKENS] [TEMPERATURE] [TOP_P]
#        (default 128 5 1 64 0 1)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
new=${1:-128}
runs=${2:-5}
threads=${3:-1}
prompt_len=${4:-64}
temp=${5:-0}
top_p=${6:-1}
ckpt=${LEGO_RL_BENCH_CKPT:-testdata/models/generated/tiny-qwen3-moe}
[ -n "${LEGO_RL_BENCH_CKPT:-}" ] || [ -f "$ckpt/reference.json" ] || "$py" scripts/make_tiny_models.py "$ckpt"
cargo build --release --quiet --example decode_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A real prompt: a chat-formatted request tokenized with the checkpoint's tokenizer, cut to length.
"$py" - "$ckpt" "$prompt_len" > "$tmp/prompt.json" <<'PY'
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
text = tok.apply_chat_template([{"role": "user", "content": "Write a long story about a robot that learns to fix bugs in a large codebase. " * 8}], tokenize=False, add_generation_prompt=True)
print(json.dumps(tok(text)["input_ids"][-int(sys.argv[2]):]))
PY
engine=$(target/release/examples/decode_bench "$ckpt" "$tmp/prompt.json" "$new" "$runs" "$threads" "$temp" "$top_p")
hf=$("$py" scripts/bench/decode_reference.py "$ckpt" "$tmp/prompt.json" "$new" "$runs" "$threads" "$temp" "$top_p")
echo "$engine" | grep -v '^engine_ids='
echo "$hf" | grep -v '^hf_ids='
eval "$(echo "$engine" | grep -E '^(engine_(tok_per_s|nocache_tok_per_s|nocache_equal_tokens|ids)|head_ms_per_token|concurrent_[a-z_]+)=')"
eval "$(echo "$hf" | grep -E '^hf_(tok_per_s|ids)=')"
same=$(awk -v a="$engine_ids" -v b="$hf_ids" 'BEGIN { n = split(a, x, ","); split(b, y, ","); for (i = 1; i <= n && x[i] == y[i]; i++); print i - 1 }')
mode=greedy
[ "$temp" = 0 ] || mode="sampled T=$temp top-p $top_p"
awk -v e="$engine_tok_per_s" -v h="$hf_tok_per_s" -v n="$new" -v t="$threads" -v s="$same" -v p="$prompt_len" -v m="$mode" -v c="$(basename "$ckpt")" 'BEGIN {
  printf "decode %s CPU fp32 %s, %d prompt + %d new tokens, %d thread(s): engine %.0f tok/s, transformers generate %.0f tok/s, ratio %.2fx (goal >= 2x); tokens equal for the first %d of %d\n", c, m, p, n, t, e, h, e / h, s, n }'
awk -v e="$engine_tok_per_s" -v o="$engine_nocache_tok_per_s" -v h="$hf_tok_per_s" -v q="$engine_nocache_equal_tokens" 'BEGIN {
  printf "prefix cache, same run: engine with it %.0f tok/s, without %.0f tok/s, on/off %.2fx; without it vs transformers %.2fx; tokens equal with and without %s\n", e, o, e / o, o / h, q }'
awk -v hm="$head_ms_per_token" -v h="$hf_tok_per_s" -v e="$engine_tok_per_s" 'BEGIN {
  hs = 1000 / h; es = 1000 / e
  printf "LM head matmul alone (the same work on both sides): %.2f ms/token = %.0f%% of the engine step (%.2f ms), %.0f%% of transformers'"'"' (%.2f ms); bound: an engine with every other op free would be %.2fx transformers here\n", hm, 100 * hm / es, es, 100 * hm / hs, hs, hs / hm }'
awk -v l="$concurrent_levels" -v b="$concurrent_batched_tok_per_s" -v i="$concurrent_interleaved_tok_per_s" -v q="$concurrent_equal_tokens" -v n="$new" -v t="$threads" -v m="$mode" 'BEGIN {
  k = split(l, lv, ","); split(b, bv, ","); split(i, iv, ","); split(q, qv, ",")
  for (j = 1; j <= k; j++)
    printf "concurrent %s, %s x %d new tokens, %d thread(s): batched %.0f tok/s (%.2fx of 1 request), interleaved %.0f tok/s (%.2fx of 1 request), batched/interleaved %.2fx; tokens equal %s\n", m, lv[j], n, t, bv[j], bv[j] / bv[1], iv[j], iv[j] / iv[1], bv[j] / iv[j], qv[j] }'
