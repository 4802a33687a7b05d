#!/usr/bin/env bash
# align throughput (issue 6). Seeds from real captures: align's integration test drives our
# scripted harness (openai + anthropic SDKs) through the proxy and the embedded tiny MoE, and
# writes its two trajectories to a seed file; scripts/bench/align_bench.rs replicates them into a
# ~SIZE_MB (uncompressed JSONL) trajectory file. Then `lego-rl align` runs on it with 1 and 2
# threads in the same run and the script prints MB/s (uncompressed input), trajectories/s and
# the 2-thread / 1-thread ratio.
# Usage: scripts/bench/align.sh [SIZE_MB]   (default 1024)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
size_mb=${1:-1024}
cd "$root"
cargo build --release --quiet --bin lego-rl --example align_bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seed=$work/seed.jsonl.zst
LEGO_RL_ALIGN_SEED_OUT=$seed cargo test --release --quiet --test it \
  align::scripted_harness_captures_align_token_exactly >/dev/null
file=$work/traj.jsonl.zst
eval "$(target/release/examples/align_bench "$seed" "$file" "$size_mb")"
mb=$(echo "$gen_bytes / 1048576" | bc -l)
printf 'file: %d trajectories, %.0f MB uncompressed, %.0f MB on disk\n' "$gen_records" "$mb" \
  "$(echo "$(stat -c %s "$file") / 1048576" | bc -l)"
run() {
  local t0 t1
  t0=$(date +%s.%N)
  target/release/lego-rl --no-progress align -i "$file" -o "$work/samples-$1.jsonl.zst" \
    --stats "$work/stats-$1.jsonl.zst" --model testdata/tokenizer/qwen3 -j "$1"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
s1=$(run 1)
s2=$(run 2)
cmp -s "$work/samples-1.jsonl.zst" "$work/samples-2.jsonl.zst" || echo "warning: -j 1 and -j 2 outputs differ"
printf '%-16s %10s %16s %10s\n' "" "MB/s" "trajectories/s" "seconds"
row() { printf '%-16s %10.1f %16.0f %10.2f\n' "$1" "$(echo "$mb / $2" | bc -l)" "$(echo "$gen_records / $2" | bc -l)" "$2"; }
row "align -j 1" "$s1"
row "align -j 2" "$s2"
printf 'ratio -j 2 / -j 1: %.2fx\n' "$(echo "$s1 / $s2" | bc -l)"
