#!/usr/bin/env bash
# filter-tasks throughput: rules + decontamination on a generated 1,000,000-record SWE-bench pool,
# compared with raw `zstd -dc` of the same file in the same run. Goal: within 2x of raw decode.
#
#   scripts/bench/filter.sh            # N=1000000; the pool is cached in target/bench-filter/
#   N=100000 scripts/bench/filter.sh   # smaller
#   BEFORE=/path/to/older/lego-rl scripts/bench/filter.sh   # also time an older build, same run
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

IDS_ARGS=(--exclude-instances "$IDS" --exclude-repos-of "$IDS")
# timed OUT CMD...: runs CMD with stdout to OUT, prints its CPU seconds (user + system).
timed() {
    local out=$1
    shift
    /usr/bin/time -f '%U %S' -o "$WORK/cpu.txt" "$@" > "$out"
    awk '{print $1 + $2}' "$WORK/cpu.txt"
}

t0=$(now); raw_cpu=$(timed /dev/null zstd -dc "$POOL"); t1=$(now)
# The goal: rules + decontamination, funnel only (--dry-run writes no kept tasks).
dry_cpu=$(timed "$WORK/table.txt" "$BIN" -q filter-tasks -i "$POOL" --dry-run "${IDS_ARGS[@]}" --funnel "$WORK/funnel.csv")
t2=$(now)
# For reference: the same run writing the kept tasks (zstd level 3, the io layer's default).
full_cpu=$(timed /dev/null "$BIN" -q filter-tasks -i "$POOL" -o "$WORK/kept.jsonl.zst" "${IDS_ARGS[@]}")
t3=$(now)
# Optionally the same --dry-run with an older binary, to print before/after from one run.
if [ -n "${BEFORE:-}" ]; then
    before_cpu=$(timed /dev/null "$BEFORE" -q filter-tasks -i "$POOL" --dry-run "${IDS_ARGS[@]}")
    t4=$(now)
fi

bytes=$(stat -c %s "$POOL")
raw=$(echo "$t1 - $t0" | bc -l)
dry=$(echo "$t2 - $t1" | bc -l)
full=$(echo "$t3 - $t2" | bc -l)
cat "$WORK/table.txt"
printf 'pool: %d records, %.1f MB compressed\n' "$N" "$(echo "$bytes / 1000000" | bc -l)"
printf '%-34s %7.2f s wall %7.2f s cpu  %9.0f records/s\n' "raw zstd -dc" "$raw" "$raw_cpu" "$(echo "$N / $raw" | bc -l)"
printf '%-34s %7.2f s wall %7.2f s cpu  %9.0f records/s\n' "rules+decontam (--dry-run)" "$dry" "$dry_cpu" "$(echo "$N / $dry" | bc -l)"
printf '%-34s %7.2f s wall %7.2f s cpu  %9.0f records/s\n' "rules+decontam, writing kept" "$full" "$full_cpu" "$(echo "$N / $full" | bc -l)"
printf 'ratio (--dry-run)/raw:  wall %.2f  cpu %.2f   (goal: wall <= 2.00)\n' "$(echo "$dry / $raw" | bc -l)" "$(echo "$dry_cpu / $raw_cpu" | bc -l)"
printf 'ratio (writing)/raw:    wall %.2f  cpu %.2f\n' "$(echo "$full / $raw" | bc -l)" "$(echo "$full_cpu / $raw_cpu" | bc -l)"
if [ -n "${BEFORE:-}" ]; then
    before=$(echo "$t4 - $t3" | bc -l)
    printf '%-34s %7.2f s wall %7.2f s cpu  %9.0f records/s\n' "before: $BEFORE (--dry-run)" "$before" "$before_cpu" "$(echo "$N / $before" | bc -l)"
    printf 'ratio before (--dry-run)/raw: wall %.2f  cpu %.2f\n' "$(echo "$before / $raw" | bc -l)" "$(echo "$before_cpu / $raw_cpu" | bc -l)"
fi
