#!/usr/bin/env bash
# IO benchmark (issue: foundation). On a generated ~1 GB (uncompressed) file of trajectory-like records,
# measures lego-rl's reader and writer side by side, in the same run, with
#   - raw decompression: `zstd -dc FILE | wc -l`
#   - a typical user script: Python zstandard + json.loads per line
#   - lego-rl's reader on the same records recompressed as one streaming frame (`zstd -3`, as
#     most other tools write): one decoder thread, the peer of the parallel frame decoding that
#     lego-rl's own multi-frame files get (src/io/parallel.rs)
# and prints throughput (MB/s of uncompressed JSON, records/s) and the ratios.
# Goals: read >= 0.7x raw zstd -dc, >= 5x the Python script.
# Usage: scripts/bench/io.sh [SIZE_MB]   (default 1024)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
size_mb=${1:-1024}
cd "$root"
py=${LEGO_RL_VENV:-$HOME/.cache/lego-rl/venv}/bin/python
cargo build --release --quiet --example io_bench
bench=target/release/examples/io_bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
file=$work/traj.jsonl.zst

gen_out=$($bench gen "$file" "$size_mb")
eval "$gen_out"
bytes=$write_bytes
records=$write_records
eval "$($bench read "$file")"
single=$work/traj.single.jsonl.zst
zstd -dcq "$file" | zstd -3 -q -o "$single"
single_seconds=$($bench read "$single" | sed -n 's/^read_seconds=//p')

t0=$(date +%s.%N); lines=$(zstd -dc "$file" | wc -l); t1=$(date +%s.%N)
raw_seconds=$(echo "$t1 - $t0" | bc -l)

py_seconds=$("$py" - "$file" <<'PY'
import io, json, sys, time, zstandard
t = time.perf_counter()
n = 0
with open(sys.argv[1], "rb") as f:
    r = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
    for line in io.TextIOWrapper(r, encoding="utf-8"):
        if line.strip():
            json.loads(line); n += 1
print(f"{time.perf_counter() - t:.3f}")
PY
)

mb=$(echo "$bytes / 1048576" | bc -l)
printf 'file: %d records, %.0f MB uncompressed, %.0f MB on disk\n' "$records" "$mb" "$(echo "$(stat -c %s "$file") / 1048576" | bc -l)"
printf '%-28s %10s %12s\n' "" "MB/s" "records/s"
row() { printf '%-28s %10.1f %12.0f\n' "$1" "$(echo "$mb / $2" | bc -l)" "$(echo "$records / $2" | bc -l)"; }
row "lego-rl write (zstd, typed)" "$write_seconds"
row "lego-rl read (typed)" "$read_seconds"
row "  ... one-frame file" "$single_seconds"
row "zstd -dc | wc -l" "$raw_seconds"
row "python zstandard + json" "$py_seconds"
[ "$lines" = "$records" ] || echo "warning: zstd -dc saw $lines lines, expected $records"
printf 'ratio read / raw zstd -dc:   %.2fx  (goal >= 0.7)\n' "$(echo "$raw_seconds / $read_seconds" | bc -l)"
printf 'ratio read / python script:  %.2fx  (goal >= 5)\n' "$(echo "$py_seconds / $read_seconds" | bc -l)"
printf 'ratio read / one-frame read: %.2fx  (parallel frame decoding on %d cores)\n' \
  "$(echo "$single_seconds / $read_seconds" | bc -l)" "$(nproc)"
