#!/usr/bin/env bash
# The training loop, asynchronous by default: rollout keeps producing batches against the newest
# checkpoint while align + train-step consume finished batches, with bounded staleness.
#
#   scripts/loop.sh --run DIR --tasks TASKS --images IMAGES --checkpoint CKPT_DIR [options]
#
# Options (defaults in brackets):
#   --steps N              training steps to run [2]
#   --max-staleness S      a batch may be sampled by a policy at most S steps older than the one it
#                          trains [1]; 0 = strictly alternating
#   --sync                 same as --max-staleness 0 (rollout, then train, then rollout ...)
#   --harness FILE         harness adapter [examples/harnesses/mini-swe-agent.toml]; repeat it to mix
#                          harnesses in one run (rollout's --harness-mix picks one per trial; pass it
#                          and one --forced per harness in --rollout-args)
#   --group-size G         trials per task [8]
#   --tasks-per-step K     tasks (groups) per batch [1]
#   --concurrency J        simultaneous trials [2]
#   --validate-every N     run the validation gates every N steps; a failed gate stops the loop [1]
#   --min-informative-groups N
#                          dynamic sampling: rollout refills each batch with extra groups drawn from
#                          the task pool until it holds N groups whose rewards vary (off)
#   --max-extra-groups M   extra groups a batch may spend [4 x N]; group ids then step by M + 1 per
#                          batch so trajectory ids stay unique across the run
#   --curriculum           with --min-informative-groups: extra groups take the pool's tasks in the
#                          middle of the difficulty band first (rollout --pool-order curriculum, by the
#                          pass rates the pool's task records carry: --refilter renews them from the
#                          finished batches; without it, the rates filter-tasks wrote into --tasks
#                          (its difficulty stage) hold for the whole run, and tasks without one count
#                          as p = 0.5, ordered by task id) (off)
#   --refilter G           before each batch after the first, drop from the pool the tasks whose last
#                          G groups in the finished batches were all solved or all failed
#                          (filter-tasks --drop-saturated); the pool and its decisions go to pool/ (off)
#   --rollout-args "..."   extra arguments for rollout (e.g. "--forced FILE --max-turns 4")
#   --train-args "..."     extra arguments for train-step (e.g. "--lr 1e-5")
#
# Run directory (the layout `validate RUN_DIR` and `report` read; man/lego-rl-formats.md):
#   checkpoints/step-NNNNNN/   trajectories/step-NNNNNN.jsonl.zst (+ .done when the batch is complete)
#   samples/step-NNNNNN.jsonl.zst   align-stats/step-NNNNNN.jsonl.zst   metrics.jsonl.zst
#   validation.jsonl.zst   logs/   report/
#   pool/step-NNNNNN.jsonl.zst (+ .decisions.jsonl.zst)   the task pool of batch N (--refilter)
#
# How the asynchrony works: batch s is rolled out by the newest checkpoint that exists when it starts,
# which is at least step s - S (the rollout side waits for it); the trainer turns batch s into
# checkpoint s+1. So with S = 1, rollout of batch s+1 overlaps train-step s. Every stage writes
# atomically or in append mode, and a finished batch is marked by a `.done` file, so killing this
# script (or any stage) and rerunning it resumes where it stopped: finished stages are skipped and a
# partial rollout continues without duplicating trials.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lego=${LEGO_RL_BIN:-$root/target/release/lego-rl}

run="" tasks="" images="" checkpoint=""
steps=2 staleness=1 harnesses=()
group_size=8 per_step=1 jobs=2 validate_every=1 rollout_args="" train_args=""
min_informative="" max_extra="" refilter="" pool_order=as-is
die() { printf 'loop: error: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --run) run=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --checkpoint) checkpoint=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --max-staleness) staleness=$2; shift 2 ;;
    --sync) staleness=0; shift ;;
    --harness) harnesses+=(--harness "$2"); shift 2 ;;
    --group-size) group_size=$2; shift 2 ;;
    --tasks-per-step) per_step=$2; shift 2 ;;
    --concurrency) jobs=$2; shift 2 ;;
    --validate-every) validate_every=$2; shift 2 ;;
    --min-informative-groups) min_informative=$2; shift 2 ;;
    --max-extra-groups) max_extra=$2; shift 2 ;;
    --refilter) refilter=$2; shift 2 ;;
    --curriculum) pool_order=curriculum; shift ;;
    --rollout-args) rollout_args=$2; shift 2 ;;
    --train-args) train_args=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$run" ] || die "--run DIR is required"
[ -n "$tasks" ] && [ -f "$tasks" ] || die "--tasks FILE is required and must exist"
[ -n "$images" ] && [ -f "$images" ] || die "--images FILE is required and must exist"
[ -x "$lego" ] || die "$lego not built (run scripts/setup.sh)"
[ ${#harnesses[@]} -gt 0 ] || harnesses=(--harness "$root/examples/harnesses/mini-swe-agent.toml")
[ -z "$max_extra" ] || [ -n "$min_informative" ] || die "--max-extra-groups needs --min-informative-groups"
[ "$pool_order" = as-is ] || [ -n "$min_informative" ] || die "--curriculum needs --min-informative-groups"
if [ -n "$min_informative" ]; then
  [ -n "$max_extra" ] || max_extra=$((4 * min_informative))
  group_stride=$((max_extra + 1))
else
  group_stride=1
fi
say() { printf 'loop: %s\n' "$*" >&2; }
step_name() { printf 'step-%06d' "$1"; }

mkdir -p "$run"/{checkpoints,trajectories,samples,align-stats,logs,pool}
first="$run/checkpoints/$(step_name 0)"
if [ ! -f "$first/config.json" ]; then
  [ -n "$checkpoint" ] && [ -f "$checkpoint/config.json" ] || die "--checkpoint DIR (HF layout) is required for a new run"
  rm -rf "$first.tmp" && cp -r "$checkpoint" "$first.tmp" && mv "$first.tmp" "$first"
fi

# Newest complete checkpoint step (a checkpoint dir appears atomically: train-step renames it in place).
newest() {
  local best=0 d n
  for d in "$run"/checkpoints/step-*; do
    [ -f "$d/config.json" ] || continue
    n=$((10#${d##*step-}))
    [ "$n" -gt "$best" ] && best=$n
  done
  echo "$best"
}

# The task pool of batch s: the task list, or with --refilter the previous batch's pool minus the tasks
# saturated in the finished batches (filter-tasks --drop-saturated; its decisions are kept beside it
# for the report). A re-filter that would leave nothing keeps the previous pool.
pool_of() {
  local s=$1 out prev d done_trajs=()
  if [ -z "$refilter" ] || [ "$s" -eq 0 ]; then echo "$tasks"; return; fi
  out="$run/pool/$(step_name "$s").jsonl.zst"
  [ -f "$out" ] && { echo "$out"; return; }
  prev=$(pool_of $((s - 1)))
  for d in "$run"/trajectories/step-*.jsonl.zst; do
    [ -f "$d.done" ] && done_trajs+=(--drop-saturated "$d")
  done
  if [ ${#done_trajs[@]} -eq 0 ]; then echo "$prev"; return; fi
  "$lego" -q filter-tasks -i "$prev" -o "$out.tmp" --stages saturation --saturation-groups "$refilter" \
    "${done_trajs[@]}" --decisions "${out%.jsonl.zst}.decisions.jsonl.zst" >/dev/null \
    2>>"$run/logs/filter.log" || { say "re-filter for batch $s failed (logs/filter.log)"; return 1; }
  if [ -z "$(zstd -dcf "$out.tmp" | head -c 1)" ]; then
    say "re-filter for batch $s dropped every task; keeping the previous pool"
    zstd -dcf "$prev" | zstd -qf -o "$out.tmp"
  fi
  mv "$out.tmp" "$out"
  say "pool of batch $s: $(zstd -dcf "$out" | grep -c .) tasks"
  echo "$out"
}

# Tasks of batch s: a deterministic slice of its pool, cycling, never a task twice (a pool smaller than
# --tasks-per-step gives a smaller batch); one group per task, group id = batch number times the group
# stride, so trajectory ids stay unique across the run.
batch_tasks() {
  local s=$1 out=$2 pool=$3
  zstd -dcf "$pool" | awk -v s="$s" -v k="$per_step" 'NF { t[n++] = $0 } END {
    for (i = 0; i < k && i < n; i++) print t[(s * k + i) % n] }' | zstd -qf -o "$out.tmp" && mv "$out.tmp" "$out"
}

rollout_loop() {
  local s ckpt traj pool dyn
  for ((s = 0; s < steps; s++)); do
    traj="$run/trajectories/$(step_name "$s").jsonl.zst"
    [ -f "$traj.done" ] && continue
    while [ "$(newest)" -lt $((s - staleness)) ]; do
      [ -f "$run/logs/stop" ] && return 0
      sleep 2
    done
    ckpt="$run/checkpoints/$(step_name "$(newest)")"
    pool=$(pool_of "$s") || return 1
    batch_tasks "$s" "$run/logs/tasks-$(step_name "$s").jsonl.zst" "$pool"
    dyn=()
    [ -z "$min_informative" ] ||
      dyn=(--min-informative-groups "$min_informative" --max-extra-groups "$max_extra" --task-pool "$pool"
        --pool-order "$pool_order")
    say "rollout batch $s with $(basename "$ckpt")"
    # shellcheck disable=SC2086 # rollout_args is a word list by design
    "$lego" -q rollout -i "$run/logs/tasks-$(step_name "$s").jsonl.zst" --images "$images" \
      "${harnesses[@]}" --backend "embedded:$ckpt" --group-size "$group_size" -j "$jobs" \
      --first-group $((s * group_stride)) "${dyn[@]}" -o "$traj" $rollout_args 2>>"$run/logs/rollout.log" || { say "rollout batch $s failed (logs/rollout.log)"; return 1; }
    touch "$traj.done"
  done
}

train_loop() {
  local s name traj
  for ((s = 0; s < steps; s++)); do
    name=$(step_name "$s")
    traj="$run/trajectories/$name.jsonl.zst"
    [ -f "$run/checkpoints/$(step_name $((s + 1)))/config.json" ] && continue
    while [ ! -f "$traj.done" ]; do
      kill -0 "$rollout_pid" 2>/dev/null || [ -f "$traj.done" ] || { say "rollout stopped before batch $s"; return 1; }
      sleep 2
    done
    say "align batch $s"
    "$lego" -q align -i "$traj" -o "$run/samples/$name.jsonl.zst" --stats "$run/align-stats/$name.jsonl.zst"
    say "train-step $s -> $(step_name $((s + 1)))"
    rm -rf "$run/checkpoints/$(step_name $((s + 1)))"
    # shellcheck disable=SC2086
    "$lego" -q train-step --checkpoint "$run/checkpoints/$name" -i "$run/samples/$name.jsonl.zst" \
      --out "$run/checkpoints/$(step_name $((s + 1)))" --metrics "$run/metrics.jsonl.zst" $train_args
    if [ $(((s + 1) % validate_every)) -eq 0 ]; then
      if ! "$lego" -q validate "$run" >"$run/logs/validate-$name.txt"; then
        say "validation gates failed after step $s (logs/validate-$name.txt); stopping"
        cat "$run/logs/validate-$name.txt" >&2
        return 1
      fi
    fi
  done
}

rm -f "$run/logs/stop"
start=$(date +%s)
rollout_loop &
rollout_pid=$!
trap 'touch "$run/logs/stop"; kill "$rollout_pid" 2>/dev/null || true' EXIT
status=0
train_loop || status=$?
touch "$run/logs/stop"
wait "$rollout_pid" || [ "$status" -ne 0 ] || status=1
trap - EXIT
[ "$status" -eq 0 ] || exit "$status"
"$lego" -q report "$run" -o "$run/report" >/dev/null
say "done: $steps steps in $(($(date +%s) - start)) s (max staleness $staleness); report: $run/report/index.html"
