# Shared settings for the lego-rl Slurm examples; every job sources this file. Edit it for your cluster.
#
# RUN: the run directory, on a filesystem every node mounts (checkpoints, trajectories, samples, metrics).
# LEGO_RL: the lego-rl binary (built once with scripts/setup.sh on a login node; its RUNPATH points at the
#   venv's torch/lib, so keep that venv on the shared filesystem too, or put a torch 2.11 install's
#   torch/lib and nvidia/*/lib first on LD_LIBRARY_PATH on the GPU nodes).
# TASKS / IMAGES: the filtered task list and the build-images manifest (images must exist on every CPU
#   node's Docker engine: run build-images on each node once, or point DOCKER_HOST at a shared engine).
# HARNESS: the harness adapter; SHARDS: rollout array size; GROUP_SIZE: trials per task.
# TRAIN_NODES / TRAIN_TASKS_PER_NODE: train-step on TRAIN_NODES nodes × TRAIN_TASKS_PER_NODE GPUs
#   (one rank per GPU, data parallel with ZeRO-1; see `man lego-rl-train-step`); 1 × 1 by default.
# BACKEND: where rollout nodes get tokens: the vLLM server job writes its URL to $RUN/server.url;
#   set LEGO_RL_BACKEND (e.g. embedded:$RUN/checkpoints/step-000000) to use the embedded engine instead.
: "${LEGO_RL_HOME:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
: "${LEGO_RL:=$LEGO_RL_HOME/target/release/lego-rl}"
: "${RUN:=$PWD/run}"
: "${TASKS:=$RUN/tasks.kept.jsonl.zst}"
: "${IMAGES:=$RUN/images.jsonl.zst}"
: "${HARNESS:=$LEGO_RL_HOME/examples/harnesses/mini-swe-agent.toml}"
: "${SHARDS:=8}"
: "${GROUP_SIZE:=8}"
: "${ROLLOUT_ARGS:=}"
: "${TRAIN_ARGS:=}"
: "${TRAIN_DEVICE:=cuda}"
: "${TRAIN_NODES:=1}"
: "${TRAIN_TASKS_PER_NODE:=1}"
step_name() { printf 'step-%06d' "$1"; }
backend() {
  if [ -n "${LEGO_RL_BACKEND:-}" ]; then
    echo "$LEGO_RL_BACKEND"
  else
    echo "vllm:$(cat "$RUN/server.url")"
  fi
}
