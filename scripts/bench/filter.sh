#!/usr/bin/env bash
# filter-tasks throughput: rules + decontamination on a generated 1,000,000-record SWE-bench pool,
# compared with raw `zstd -dc` of the same file in the same run. Goal: within 2x of raw decode.
#
#   scripts/bench/filter.sh            # N=1000000; the pool is cached in target/bench-filter/
#   N=100000 scripts/bench/filter.sh   # smaller
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-1000000}
WORK=${WORK:-target/bench-filter}
BIN=${BIN:-target/release/lego-rl}
PY=${PY:-.venv/bin/python}
IDS=testdata/swebench/swebench_verified_ids.txt
mkdir -p "$WORK"
POOL="$WORK/pool-$N.jsonl.zst"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
if [ ! -s "$POOL" ]; then
    echo "generating $N records into $POOL ..." >&2
    "$PY" scripts/bench/gen_pool.py "$N" "$POOL.tmp" "$IDS"
    mv "$POOL.tmp" "$POOL"
fi
now() { date +%s.%N; }
# Warm the page cache so both runs read from memory.
cat "$POOL" > /dev/null

t0=$(now); zstd -dc "$POOL" > /dev/null; t1=$(now)
"$BIN" -q filter-tasks -i "$POOL" -o "$WORK/kept.jsonl.zst" --funnel "$WORK/funnel.csv" \
    --exclude-instances "$IDS" --exclude-repos-of "$IDS" > "$WORK/table.txt"
t2=$(now)

bytes=$(stat -c %s "$POOL")
raw=$(echo "$t1 - $t0" | bc -l)
filt=$(echo "$t2 - $t1" | bc -l)
cat "$WORK/table.txt"
printf 'pool: %d records, %.1f MB compressed\n' "$N" "$(echo "$bytes / 1000000" | bc -l)"
printf 'raw zstd -dc:       %6.2f s  (%.0f records/s)\n' "$raw" "$(echo "$N / $raw" | bc -l)"
printf 'rules+decontam:     %6.2f s  (%.0f records/s)\n' "$filt" "$(echo "$N / $filt" | bc -l)"
printf 'ratio filter/raw:   %6.2f   (goal <= 2.00)\n' "$(echo "$filt / $raw" | bc -l)"
