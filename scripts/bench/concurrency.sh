#!/usr/bin/env bash
# Sandbox concurrency benchmark (issue 5): how many trials this machine runs at once without
# infrastructure failures. Ramps the number of trials in flight (-j 1,2,4,8,16 by default); at each
# level it runs max(MIN_TRIALS, j) trials of one task with a trivial agent command (`true`) through
# the full lifecycle (internal network + container + proxy relay + squash, agent, extract, evaluate,
# cleanup), and prints per level: infra failures, trials/min, the throughput ratio vs -j1, and the
# setup-stage p50. Levels after BUDGET_S seconds are skipped, so the run stays around 5 minutes.
# Numbers are only meaningful on an otherwise idle machine: other load shows up as lower trials/min
# (and, past the engine's limits, as infra failures).
# "Sustains" = the highest level with 0 infra failures.
# Needs the base image (scripts/bootstrap-base-image.sh); builds the testdata task images (cache hits when present).
# Usage: scripts/bench/concurrency.sh [LEVELS] [TASK_ID] [MIN_TRIALS] [BUDGET_S]
#   (default 1,2,4,8,16 harbor__hello-world 2 240)
set -euo pipefail
cd "$(dirname "$0")/../.."
levels=${1:-1,2,4,8,16}
task=${2:-harbor__hello-world}
min_trials=${3:-2}
budget=${4:-240}
tasks=testdata/tasks/tasks.jsonl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build --release --quiet --bin lego-rl --example concurrency_bench
scripts/bootstrap-base-image.sh >/dev/null
# All testdata images (cache hits once built; task paths in the records are relative to $tasks).
LEGO_RL_NO_PROGRESS=1 target/release/lego-rl build-images -j 2 -i $tasks -o "$out/images.jsonl.zst" 2>"$out/build.log" \
  || { cat "$out/build.log" >&2; exit 2; }
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; docker $(docker version --format '{{.Server.Version}}'); task $task" >&2
target/release/examples/concurrency_bench $tasks "$out/images.jsonl.zst" "$task" "$levels" "$min_trials" "$budget" \
  | tee "$out/levels.txt"
awk '
  /^jobs=/ {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    if (base == "") base = v["trials_per_min"]
    if (v["infra"] == 0) best = v["jobs"]
    printf "-j %-3s trials %-3s infra failures %-2s %6.1f trials/min  %.2fx vs -j1  setup p50 %ss\n",
      v["jobs"], v["trials"], v["infra"], v["trials_per_min"], v["trials_per_min"] / base, v["setup_p50_s"]
  }
  END { printf "sustained without infra failures: -j %s\n", (best == "" ? "none" : best) }' "$out/levels.txt"
# Measured 2026-11-29 on the 2-core dev machine while ~5 other agents compiled (load average 13-28),
# docker 20.10, cgroup v1: -j1 8.7, -j2 9.2, -j4 9.8, -j8 9.3, -j16 9.8 trials/min (1.00/1.06/1.13/1.07/1.13x),
# 0 infra failures at every level, setup p50 2.2 s -> 27.4 s at -j16, 0 objects left: CPU-bound, no engine limit hit.
