#!/usr/bin/env bash
# Proof that it learns (examples/learn/README.md): a random tiny Qwen3 (real vocabulary and chat
# template) learns the "echo-word" task family through the real pipeline — mini-swe-agent in Docker,
# the capturing proxy, Harbor verifiers, align, train-step — on CPU:
#
#   make_tasks.py → filter-tasks → build-images
#   warm start: rollout --forced (the correct single tool call on 3 training tasks per word) → align →
#               40 SFT steps (~0.03 nats/token on the demonstrations)
#   GSPO: [eval held-out → rollout (train tasks, T=1.0) → align → train-step --loss gspo] × STEPS → eval
#   validate → report → table (step, train reward, held-out reward, Δ vs warm start)
#
# Checkpoint versions count every train-step, SFT ones included, so the GSPO part starts at the
# version of the warm start (the number of SFT steps) and every file of the run directory is named by the policy version that
# produced it: checkpoints/step-V/, trajectories/step-V (the batch version V sampled),
# samples/ align-stats/ likewise, eval/step-V (held-out trajectories of version V). The warm start's
# own files are under warmstart/. `report` plots train and held-out reward against V.
#
# Environment (defaults in brackets):
#   LEGO_RL_RUN          run directory [runs/learn]; rerunning resumes (finished files are kept)
#   LEGO_RL_SEED         model init seed, task order, train-step seed [1]
#   LEGO_RL_STEPS        GSPO steps [15]
#   LEGO_RL_SFT_STEPS    at most this many SFT train-steps on the demonstrations, each one optimizer
#                        update on all of them [40]
#   LEGO_RL_SFT_LOSS     stop SFT earlier once a step's loss (mean NLL per token) is below this [0: off]
#   LEGO_RL_SFT_LR       [3e-3]
#   LEGO_RL_LR           GSPO learning rate [2e-4]: at 1e-3 a fresh Adam moves every weight so far
#                        per update that the tool call's format breaks within ~4 updates (README,
#                        runs 12-14)
#   LEGO_RL_UPDATES      GSPO optimizer updates per step, each on whole groups [1]
#   LEGO_RL_WARMUP       GSPO learning-rate warmup, in optimizer updates (train-step --warmup-steps),
#                        counted from the warm start's fresh optimizer [0]. At lr 1e-3 it took 5:
#                        without them a fresh Adam's first full-size updates broke seed 2's warm
#                        start (README, run 8)
#   LEGO_RL_FREEZE       GSPO train-step --freeze REGEX: parameters the GSPO steps leave as the warm
#                        start has them, e.g. embed_tokens [none]
#   LEGO_RL_GROUP        trials per task in a GSPO batch [8]
#   LEGO_RL_TASKS        tasks (groups) per GSPO batch [3: one per word, make_tasks.py's order.txt]
#   LEGO_RL_MIN_INFORMATIVE  dynamic sampling (issue 39; rollout --min-informative-groups N): after
#                        the planned groups, each GSPO rollout draws extra groups from the training
#                        tasks until the batch holds N groups whose rewards vary, or the extra-group
#                        budget is spent; align skips the zero-variance groups, which stay in the
#                        trajectories file and count in the report [unset: off]. The pool of step s
#                        (logs/pool-step-V.jsonl.zst) is order.txt rotated to start just after the
#                        step's planned tasks, so extras continue the word-balanced order instead of
#                        repeating its first tasks every step. Group ids then step by
#                        LEGO_RL_MAX_EXTRA + 1 per version, so trajectory ids stay unique in the run.
#                        A step spends 24 + 8 × extras trials: compare with a plain run at an
#                        equal trial budget (LEGO_RL_TRIAL_BUDGET; README "Dynamic sampling").
#   LEGO_RL_MAX_EXTRA    extra groups a GSPO batch may spend (rollout --max-extra-groups) [4 × N]
#   LEGO_RL_TRIAL_BUDGET stop GSPO before the step whose planned groups would take the train trials
#                        sampled so far (every trajectory of trajectories/, dropped groups included)
#                        past this, and cap each step's extra groups to what is left [unset: off;
#                        then LEGO_RL_STEPS alone decides]. With a large LEGO_RL_STEPS it makes a
#                        plain and a dynamic-sampling run comparable at an equal trial budget.
#   LEGO_RL_EVAL_EVERY   evaluate the held-out tasks every N GSPO steps [5]
#   LEGO_RL_EVAL_SAMPLES samples per held-out task (24 tasks) at the evaluations in between [1]
#   LEGO_RL_EVAL_SAMPLES_ENDS  ... at the warm start's and the final evaluation, the two the proof
#                        compares [4: 96 samples each, a standard error of ~0.05]
#   LEGO_RL_EVAL_TEMP    held-out sampling temperature [1.0: the policy GSPO trains]
#   LEGO_RL_TOP_P        nucleus sampling (rollout --top-p) of the GSPO batches and the held-out
#                        evaluations [0.95; 1: off]. It cuts the junk-token tail that breaks a
#                        quarter of the warm start's calls at plain T=1.0, so the word is what
#                        varies (README, runs 12-14). Log-probs stay those of the untruncated policy.
#   LEGO_RL_JOBS         simultaneous trials [4]
#   LEGO_RL_SKIP_SETUP   set: do not run scripts/setup.sh first
#   LEGO_RL_BIN          the lego-rl binary [target/release/lego-rl]
# Rollout sampling itself is not seeded: members of a group must sample differently.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/examples/learn"
lego=${LEGO_RL_BIN:-$root/target/release/lego-rl}
py="$root/.venv/bin/python"
run=${LEGO_RL_RUN:-$root/runs/learn}
seed=${LEGO_RL_SEED:-1}
steps=${LEGO_RL_STEPS:-15}
sft_steps=${LEGO_RL_SFT_STEPS:-40}
sft_loss=${LEGO_RL_SFT_LOSS:-0}
sft_lr=${LEGO_RL_SFT_LR:-3e-3}
lr=${LEGO_RL_LR:-2e-4}
updates=${LEGO_RL_UPDATES:-1}
warmup=${LEGO_RL_WARMUP:-0}
freeze=()
[ -z "${LEGO_RL_FREEZE:-}" ] || freeze=(--freeze "$LEGO_RL_FREEZE")
group=${LEGO_RL_GROUP:-8}
per_step=${LEGO_RL_TASKS:-3}
min_informative=${LEGO_RL_MIN_INFORMATIVE:-}
[ -z "${LEGO_RL_MAX_EXTRA:-}" ] || [ -n "$min_informative" ] || { echo "learn: error: LEGO_RL_MAX_EXTRA needs LEGO_RL_MIN_INFORMATIVE" >&2; exit 2; }
max_extra=${LEGO_RL_MAX_EXTRA:-$((4 * ${min_informative:-0}))}
# Group id of a GSPO batch = its version × stride: dynamic sampling's extra groups take the ids
# after the batch's own (rollout --first-group + --epochs + k / pool size).
group_stride=1
[ -z "$min_informative" ] || group_stride=$((max_extra + 1))
trial_budget=${LEGO_RL_TRIAL_BUDGET:-}
eval_every=${LEGO_RL_EVAL_EVERY:-5}
eval_samples=${LEGO_RL_EVAL_SAMPLES:-1}
eval_samples_ends=${LEGO_RL_EVAL_SAMPLES_ENDS:-4}
eval_temp=${LEGO_RL_EVAL_TEMP:-1.0}
top_p=${LEGO_RL_TOP_P:-0.95}
jobs=${LEGO_RL_JOBS:-4}
harness="$here/mini-swe-agent-short.toml"
say() { printf 'learn: %s\n' "$*" >&2; }
name() { printf 'step-%06d' "$1"; }
[ -n "${LEGO_RL_SKIP_SETUP:-}" ] || "$root/scripts/setup.sh"
mkdir -p "$run"/{logs,warmstart,checkpoints,trajectories,samples,align-stats,eval}
start=$(date +%s)
# Everything a rollout shares. --max-turns 1: mini-swe-agent checks its step limit before each
# query, so a first command that does not submit ends the trial instead of asking again — one
# generation per trial, graded on what that command left in /app/answer.txt.
common=(--images "$run/images.jsonl.zst" --harness "$harness" --max-turns 1 --max-tokens 96 -j "$jobs")
# One intra-op thread: the tiny model gains nothing from more, and on a shared, oversubscribed CPU
# spinning OpenMP workers slow every forward down.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

say "tasks and model (seed $seed) into $run"
[ -f "$run/tasks/order.txt" ] || python3 "$here/make_tasks.py" "$run/tasks" "$seed"
"$py" "$here/make_model.py" "$run/model" "$seed"
for split in train heldout; do
  [ -f "$run/tasks.$split.jsonl.zst" ] || "$lego" -q filter-tasks -i "$run/tasks/$split" \
    -o "$run/tasks.$split.jsonl.zst" --funnel "$run/logs/funnel.$split.csv" >/dev/null
done
if [ ! -f "$run/images.jsonl.zst" ]; then
  zstd -dcq "$run/tasks.train.jsonl.zst" "$run/tasks.heldout.jsonl.zst" | zstd -qf -o "$run/tasks.all.jsonl.zst"
  "$lego" -q build-images -i "$run/tasks.all.jsonl.zst" -o "$run/images.jsonl.zst.tmp" -j "$jobs" \
    --harness "$harness" --log-dir "$run/logs/build"
  mv "$run/images.jsonl.zst.tmp" "$run/images.jsonl.zst"
fi
# Training order: make_tasks.py's order.txt (seeded; every consecutive triple has one task of each
# word), batch s takes the next LEGO_RL_TASKS of them.
if [ ! -f "$run/tasks.order.jsonl.zst" ]; then
  zstd -dcq "$run/tasks.train.jsonl.zst" | jq -sc --rawfile order "$run/tasks/order.txt" \
    'INDEX(.id) as $t | $order | split("\n")[] | select(. != "") | $t[.]' \
    | zstd -qf -o "$run/tasks.order.jsonl.zst"
fi

ws="$run/warmstart"
if [ ! -f "$ws/version" ]; then
  say "warm start: forced demonstrations through the proxy, then SFT (lr $sft_lr) until loss < $sft_loss (at most $sft_steps steps)"
  ids=$(jq -r '.tasks | keys[]' "$run/tasks/demos.forced.json")
  zstd -dcq "$run/tasks.train.jsonl.zst" | jq -c --arg ids "$ids" 'select(.id as $i | ($ids | split("\n")) | index($i))' \
    | zstd -qf -o "$ws/tasks.demos.jsonl.zst"
  rm -f "$ws/demos.jsonl.zst"
  "$lego" -q rollout -i "$ws/tasks.demos.jsonl.zst" "${common[@]}" --backend "embedded:$run/model" \
    --group-size 1 --forced "$run/tasks/demos.forced.json" -o "$ws/demos.jsonl.zst" 2>>"$run/logs/rollout.log"
  bad=$(zstd -dcq "$ws/demos.jsonl.zst" | jq -s '[.[] | select(.reward != 1)] | length')
  [ "$bad" -eq 0 ] || { say "error: $bad forced demonstrations did not earn reward 1 (logs/rollout.log)"; exit 1; }
  # One optimizer update per SFT step on all demonstrations together (--updates 1): the words'
  # unconditional pulls cancel within the batch, and what is left is the format and the copying.
  "$lego" -q align -i "$ws/demos.jsonl.zst" -o "$ws/samples.jsonl.zst" --stats "$ws/align-stats.jsonl.zst"
  rm -rf "$ws/sft" "$ws/metrics.jsonl.zst" && mkdir -p "$ws/sft" && cp -r "$run/model" "$ws/sft/$(name 0)"
  k=0
  while [ "$k" -lt "$sft_steps" ]; do
    "$lego" -q train-step --loss sft --lr "$sft_lr" --updates 1 --seed "$seed" --checkpoint "$ws/sft/$(name "$k")" \
      -i "$ws/samples.jsonl.zst" --out "$ws/sft/$(name $((k + 1)))" --metrics "$ws/metrics.jsonl.zst"
    # Only the newest SFT checkpoint is needed (with Adam's state, each is ~3x the weights).
    rm -rf "${ws:?}/sft/$(name "$k")"
    k=$((k + 1))
    loss=$(zstd -dcq "$ws/metrics.jsonl.zst" | tail -n 1 | jq .loss)
    say "SFT step $k: loss $loss"
    if jq -en --argjson l "$loss" --argjson t "$sft_loss" '$l < $t' >/dev/null; then break; fi
  done
  rm -rf "$run/checkpoints/$(name "$k").tmp"
  cp -r "$ws/sft/$(name "$k")" "$run/checkpoints/$(name "$k").tmp"
  # GSPO starts with a fresh optimizer: SFT's second moments are of a different loss's gradients.
  rm -f "$run/checkpoints/$(name "$k").tmp/optimizer.safetensors" "$run/checkpoints/$(name "$k").tmp/trainer_state.json"
  mv "$run/checkpoints/$(name "$k").tmp" "$run/checkpoints/$(name "$k")"
  echo "$k" >"$ws/version"
fi
v0=$(cat "$ws/version")

# evaluate V SAMPLES: the held-out tasks × SAMPLES with version V, once (a rerun keeps a finished file).
evaluate() {
  local v=$1 k=$2 out="$run/eval/$(name "$1").jsonl.zst"
  [ -f "$out.done" ] && return 0
  say "eval: held-out tasks × $k with $(name "$v") (T=$eval_temp, top-p $top_p)"
  "$lego" -q rollout -i "$run/tasks.heldout.jsonl.zst" "${common[@]}" --mode eval --temperature "$eval_temp" --top-p "$top_p" \
    --backend "embedded:$run/checkpoints/$(name "$v")" --group-size "$k" --first-group "$v" \
    -o "$out" 2>>"$run/logs/rollout.log"
  touch "$out.done"
}

# spent_before V: train trials sampled by the GSPO batches of versions below V.
spent_before() {
  local f k=0 ver
  for f in "$run"/trajectories/step-*.jsonl.zst; do
    [ -f "$f" ] || continue
    ver=${f##*/step-} ver=$((10#${ver%%.*}))
    [ "$ver" -lt "$1" ] && k=$((k + $(zstd -dcq "$f" | grep -c .)))
  done
  echo "$k"
}

for ((s = 0; s < steps; s++)); do
  v=$((v0 + s)) n=$(name $((v0 + s))) next=$(name $((v0 + s + 1)))
  step_extra=$max_extra
  if [ -n "$trial_budget" ]; then
    # Before the in-between evaluation: a budget that ends here leaves this version to the final one.
    left=$((trial_budget - $(spent_before "$v") - per_step * group))
    if [ "$left" -lt 0 ]; then
      say "trial budget $trial_budget: $(spent_before "$v") train trials sampled, stopping before GSPO step $s"
      steps=$s
      break
    fi
    [ $((left / group)) -ge "$step_extra" ] || step_extra=$((left / group))
  fi
  if [ "$s" -eq 0 ]; then evaluate "$v" "$eval_samples_ends"
  elif [ $((s % eval_every)) -eq 0 ]; then evaluate "$v" "$eval_samples"; fi
  [ -f "$run/checkpoints/$next/config.json" ] && continue
  traj="$run/trajectories/$n.jsonl.zst"
  if [ ! -f "$traj.done" ]; then
    zstd -dcq "$run/tasks.order.jsonl.zst" | awk -v s="$s" -v k="$per_step" 'NF { t[n++] = $0 } END {
      for (i = 0; i < k; i++) print t[(s * k + i) % n] }' | zstd -qf -o "$run/logs/tasks-$n.jsonl.zst"
    dyn=()
    if [ -n "$min_informative" ]; then
      # The pool of extra groups: every training task, order.txt rotated past this step's tasks.
      pool="$run/logs/pool-$n.jsonl.zst"
      if [ ! -f "$pool" ]; then
        zstd -dcq "$run/tasks.order.jsonl.zst" | awk -v s="$s" -v k="$per_step" 'NF { t[n++] = $0 } END {
          for (i = 0; i < n; i++) print t[(s * k + k + i) % n] }' | zstd -qf -o "$pool.tmp"
        mv "$pool.tmp" "$pool"
      fi
      dyn=(--min-informative-groups "$min_informative" --max-extra-groups "$step_extra" --task-pool "$pool")
    fi
    say "GSPO step $s: rollout ($per_step tasks × $group, T=1.0, top-p $top_p${min_informative:+; until $min_informative informative groups, at most $step_extra extra}) with $n"
    # One rollout for all tasks of the step (the trainer's groups are (task, group id), so the
    # tasks sharing group id v stay separate groups); a rerun after a crash skips the groups
    # already in the file.
    "$lego" -q rollout -i "$run/logs/tasks-$n.jsonl.zst" "${common[@]}" --backend "embedded:$run/checkpoints/$n" --top-p "$top_p" \
      --group-size "$group" --first-group $((v * group_stride)) "${dyn[@]}" -o "$traj" 2>>"$run/logs/rollout.log"
    touch "$traj.done"
  fi
  "$lego" -q align -i "$traj" -o "$run/samples/$n.jsonl.zst" --stats "$run/align-stats/$n.jsonl.zst"
  rm -rf "$run/checkpoints/$next" "$run/checkpoints/$next.tmp"
  if [ -n "$(zstd -dcq "$run/samples/$n.jsonl.zst" | head -c 1)" ]; then
    "$lego" -q train-step --loss gspo --lr "$lr" --warmup-steps "$warmup" --updates "$updates" --seed "$seed" \
      "${freeze[@]}" --checkpoint "$run/checkpoints/$n" \
      -i "$run/samples/$n.jsonl.zst" --out "$run/checkpoints/$next" --metrics "$run/metrics.jsonl.zst"
  else
    # No samples: with dynamic sampling, no group of the batch had reward variance and align skipped
    # them all (or every trial was an infra failure); train-step refuses an empty batch. There is
    # nothing to learn from, so the next version is this one's weights and optimizer state, one
    # policy version on.
    say "GSPO step $s: no informative group in the batch; $next = $n's weights, no update"
    cp -r "$run/checkpoints/$n" "$run/checkpoints/$next.tmp"
    # Its weight probe names the old version; a follower would ignore it with a warning.
    rm -f "$run/checkpoints/$next.tmp/probe.json"
    # (Without lego-rl.json the version is read from the directory's name, already right.)
    [ ! -f "$run/checkpoints/$n/lego-rl.json" ] ||
      jq -c --arg p "$run/checkpoints/$n" '.policy_version += 1 | .parent_checkpoint = $p | .samples_this_step = 0' \
        "$run/checkpoints/$n/lego-rl.json" >"$run/checkpoints/$next.tmp/lego-rl.json"
    mv "$run/checkpoints/$next.tmp" "$run/checkpoints/$next"
  fi
  # Only the newest checkpoint's optimizer state is needed to go on; keep the weights of all.
  if [ "$s" -gt 0 ]; then rm -f "$run/checkpoints/$n/optimizer.safetensors"; fi
done
evaluate $((v0 + steps)) "$eval_samples_ends"

say "validate (gates of the GSPO steps) and report"
"$lego" -q validate "$run" >"$run/logs/validate.txt" || say "some validation gates failed (logs/validate.txt)"
"$lego" -q report "$run" -o "$run/report" >/dev/null
say "done in $(($(date +%s) - start)) s; report: $run/report/index.html"

# The table: per policy version, train batch reward (T=1.0) and held-out reward, Δ vs the warm start.
python3 - "$run/report/steps.csv" "$v0" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
v0 = int(sys.argv[2])
f = lambda x: f"{float(x):.3f}" if x else "-"
base = next((float(r["eval_reward_mean"]) for r in rows if int(r["step"]) == v0 and r.get("eval_reward_mean")), None)
# With dynamic sampling (LEGO_RL_MIN_INFORMATIVE) also the batch's informative / sampled groups and
# the train trials sampled before the version (every dropped group's included): what its held-out
# reward cost, the budget to compare at.
dynamic = any(r.get("informative_groups") for r in rows)
extra = f" {'inf/groups':>10} {'trials before':>13}" if dynamic else ""
print(f"{'version':>7} {'gspo step':>9} {'train reward':>12} {'n':>3} {'held-out reward':>15} {'n':>3} {'vs warm start':>13}{extra}")
spent = 0
for r in rows:
    v = int(r["step"])
    if r["trajectories"] == "0" and r.get("eval_trajectories", "0") == "0":
        continue
    e = r.get("eval_reward_mean")
    d = f"{float(e) - base:+.3f}" if e and base is not None else "-"
    extra = ""
    if dynamic:
        g = f"{r['informative_groups'] or '-'}/{r['groups']}"
        extra = f" {g:>10} {spent:>13}"
        spent += int(r["trajectories"])
    print(f"{v:>7} {v - v0:>9} {f(r['reward_mean']):>12} {r['trajectories']:>3} {f(e):>15} {r.get('eval_trajectories', '-'):>3} {d:>13}{extra}")
EOF
