#!/usr/bin/env bash
# Submits one training step: an array of rollout shards, then align + train-step on a GPU once all
# shards succeeded (--dependency=afterok). Usage: examples/slurm/submit-step.sh STEP [AFTER_JOB_ID]
# With AFTER_JOB_ID (the previous step's train job), the shards wait for that checkpoint — a strictly
# synchronous chain; leave it out to roll out step STEP against the newest checkpoint (async, the
# trajectories then carry their policy version and train-step weighs staleness).
set -euo pipefail
source "${LEGO_RL_HOME:-$(cd "$(dirname "$0")/../.." && pwd)}/examples/slurm/env.sh"
step=${1:?usage: submit-step.sh STEP [AFTER_JOB_ID]}
here=$LEGO_RL_HOME/examples/slurm
dep=()
[ -n "${2:-}" ] && dep=(--dependency="afterok:$2")
array=$(sbatch --parsable "${dep[@]}" --array="0-$((SHARDS - 1))" --export="ALL,STEP=$step" \
  "$here/rollout-array.sbatch")
array=${array%%;*}
train_opts=()
if [ "$((TRAIN_NODES * TRAIN_TASKS_PER_NODE))" -gt 1 ]; then
  # One task per GPU on every node; train.sbatch starts train-step with srun on all of them.
  train_opts=(--nodes="$TRAIN_NODES" --ntasks-per-node="$TRAIN_TASKS_PER_NODE" --gres="gpu:$TRAIN_TASKS_PER_NODE")
fi
train=$(sbatch --parsable "${train_opts[@]}" --dependency="afterok:$array" --export="ALL,STEP=$step" \
  "$here/train.sbatch")
echo "step $step: rollout array $array, train $train"
echo "$train" >"$RUN/step-$step.jobid"
