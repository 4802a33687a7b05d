#!/usr/bin/env bash
# Prefix cache through the real Docker rollout (issue 26): one GSPO group of GROUP trials of the demo
# task (inflection, mini-swe-agent, --forced scripts as scripts/demo.sh uses them) on the embedded
# engine, with the prefix cache (default budget) and without it (--prefix-cache-bytes 0), same run,
# same images, ROUNDS alternating rounds (off, on, off, on, ...). Prints per mode the rollout's wall
# time (best of the rounds), the time the trials spent waiting on the model (sum over generations of
# their timings), prompt tokens received vs prefilled, and the speed-ups on/off (goal: wall >= 1.5x).
# The trials of a group start together (-j GROUP by default), so their first prompts reach the
# engine at once, as in a learning run's rollout.
# Needs Docker, the base image (scripts/bootstrap-base-image.sh), the harness runtime (cached after the
# first build-images) and a release build. CKPT=... measures another checkpoint (default the tiny
# Qwen3-MoE).
# Usage: scripts/bench/prefix_cache_rollout.sh [GROUP=8] [ROUNDS=1] [JOBS=GROUP]
set -euo pipefail
cd "$(dirname "$0")/../.."
group=${1:-8}
rounds=${2:-1}
jobs=${3:-$group}
bin=${LEGO_RL_BIN:-target/release/lego-rl}
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 2; }
model=${CKPT:-testdata/models/generated/tiny-qwen3-moe}
[[ -f $model/config.json ]] || { echo "make the tiny model first: scripts/setup.sh" >&2; exit 2; }
scripts/bootstrap-base-image.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export LEGO_RL_NO_PROGRESS=1
harness=examples/harnesses/mini-swe-agent.toml
$bin build-images -j 2 -i testdata/tasks/tasks.jsonl -o "$out/images.jsonl.zst" --harness "$harness" 2>/dev/null
run() { # MODE ROUND BYTES
  local tag=$1-$2
  local t0 t1
  t0=$(date +%s.%N)
  # The inflection task is the first of testdata/tasks/tasks.jsonl: shard 0/8 selects it alone.
  $bin rollout -i testdata/tasks/tasks.jsonl --shard 0/8 --images "$out/images.jsonl.zst" \
    --harness "$harness" --backend "embedded:$model" --chat-model testdata/tokenizer/qwen3 \
    --forced testdata/rollout/inflection.json --max-turns 6 --group-size "$group" -j "$jobs" \
    --run-id "bench-prefix-$tag-$$" --prefix-cache-bytes "$3" \
    -o "$out/$tag.jsonl.zst" 2>"$out/$tag.log" || { cat "$out/$tag.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$1 $2 $t0 $t1" >>"$out/times"
}
for ((r = 0; r < rounds; r++)); do
  run off "$r" 0
  run on "$r" 4GiB
done
python3 - "$out" <<'EOF'
import json, subprocess, sys
out = sys.argv[1]
best = {}
for line in open(f"{out}/times"):
    mode, r, t0, t1 = line.split()
    lines = subprocess.run(["zstd", "-dc", f"{out}/{mode}-{r}.jsonl.zst"], capture_output=True, text=True, check=True).stdout.splitlines()
    trajs = [json.loads(l) for l in lines if l.strip()]
    gens = [g for t in trajs for g in t["generations"]]
    model = sum(g.get("timings", {}).get("total", 0.0) for g in gens)
    prompt = sum(len(g.get("prompt_ids") or []) for g in gens)
    cached = sum((g.get("extra") or {}).get("cached_tokens", 0) for g in gens)
    rewards = [t.get("reward") for t in trajs]
    row = dict(wall=float(t1) - float(t0), model=model, prompt=prompt, prefill=prompt - cached, trials=len(trajs),
               requests=len(gens), rewards=rewards, infra=sum(bool(t.get("infra_failure")) for t in trajs))
    print(f"{mode} round {r}: wall {row['wall']:.1f}s, {row['trials']} trials ({row['infra']} infra failures), "
          f"{row['requests']} requests, model time {model:.1f}s, prompt tokens {prompt}, prefilled {prompt - cached}, "
          f"rewards {rewards}")
    if mode not in best or row["wall"] < best[mode]["wall"]:
        best[mode] = row
off, on = best["off"], best["on"]
print(f"group of {off['trials']} on the demo task through Docker rollout (best of rounds): "
      f"wall off {off['wall']:.1f}s, on {on['wall']:.1f}s, speed-up {off['wall'] / on['wall']:.2f}x (goal >= 1.5x); "
      f"model time off {off['model']:.1f}s, on {on['model']:.1f}s, {off['model'] / max(on['model'], 1e-9):.2f}x; "
      f"prefill tokens off {off['prefill']}, on {on['prefill']} of {on['prompt']} received "
      f"({100 * (1 - on['prefill'] / max(on['prompt'], 1)):.0f}% cached)")
EOF
