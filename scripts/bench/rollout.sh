#!/usr/bin/env bash
# rollout's own overhead per trial: everything except the agent stage (where the harness and the model
# spend their time): sandbox setup, extract, evaluate (grading in a fresh container), cleanup, and rollout's
# bookkeeping between them. One group of N trials of the inflection task with mini-swe-agent on the tiny
# embedded model (forced scripts), -j 2. Printed as p50/p95, and as a ratio against a peer measured in the
# same run: the bare container lifecycle (`docker run --rm IMAGE true`) of the same task image.
# Needs the base image, Docker, PyPI access for the harness runtime (cached) and a release build.
# Usage: scripts/bench/rollout.sh [N=8]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-8}
bin=target/release/lego-rl
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 2; }
model=testdata/models/generated/tiny-qwen3-moe
[[ -f $model/config.json ]] || { echo "make the tiny model first: scripts/setup.sh" >&2; exit 2; }
scripts/bootstrap-base-image.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export LEGO_RL_NO_PROGRESS=1
$bin build-images -j 2 -i testdata/tasks/tasks.jsonl -o "$out/images.jsonl.zst" 2>/dev/null
t0=$(date +%s.%N)
# The inflection task is the first of testdata/tasks/tasks.jsonl: shard 0/8 selects it alone.
$bin rollout -i testdata/tasks/tasks.jsonl --shard 0/8 --images "$out/images.jsonl.zst" \
  --harness examples/harnesses/mini-swe-agent.toml --backend "embedded:$model" \
  --chat-model testdata/tokenizer/qwen3 --forced testdata/rollout/inflection.json --max-turns 8 \
  --group-size "$n" -j 2 -o "$out/traj.jsonl.zst" 2>"$out/rollout.log" || { cat "$out/rollout.log" >&2; exit 1; }
t1=$(date +%s.%N)
python3 - "$out/traj.jsonl.zst" "$t0" "$t1" <<'EOF'
import json, statistics, subprocess, sys, time
path, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
lines = subprocess.run(["zstd", "-dc", path], capture_output=True, text=True, check=True).stdout.splitlines()
trajs = [json.loads(l) for l in lines if l.strip()]
image = trajs[0]["metadata"]["image"]
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
over, parts = [], {k: [] for k in ("setup", "extract", "evaluate", "cleanup")}
agent, model = [], []
for t in trajs:
    st = t["stages"]
    wall = max(s["end"] for s in st.values()) - min(s["start"] for s in st.values())
    a = st["agent"]["end"] - st["agent"]["start"] if "agent" in st else 0.0
    over.append(wall - a)
    agent.append(a)
    model.append(sum(g.get("timings", {}).get("total", 0.0) for g in t["generations"]))
    for k in parts:
        if k in st:
            parts[k].append(st[k]["end"] - st[k]["start"])
peer = []
for _ in range(5):
    s = time.time()
    subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True, capture_output=True)
    peer.append(time.time() - s)
p50, p95, peer50 = statistics.median(over), pct(over, 0.95), statistics.median(peer)
print(f"rollout, {len(trajs)} trials (-j 2), wall {t1 - t0:.1f}s incl. start-up")
print(f"overhead per trial (all but the agent stage): p50 {p50:.2f}s  p95 {p95:.2f}s")
print("  by stage (p50): " + "  ".join(f"{k} {statistics.median(v):.2f}s" for k, v in parts.items() if v))
print(f"agent stage p50 {statistics.median(agent):.2f}s, of which model calls p50 {statistics.median(model):.2f}s")
print(f"peer: bare container lifecycle p50 {peer50:.2f}s -> overhead / peer = {p50 / peer50:.1f}x")
EOF
