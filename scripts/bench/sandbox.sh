#!/usr/bin/env bash
# Sandbox benchmarks on this machine's Docker engine, printed as ratios between runs of the same script:
#   1. build-images for every testdata task: cold (task + environment images removed) vs cache hit;
#   2. trial create→ready latency (setup stage: network + container + squash) p50/p95 over N trials,
#      via the sandbox integration test's validity run (stage timings are in its results);
#   3. the mini-swe-agent runtime volume: build (wheels from the host cache, offline install) vs cache hit.
# Needs the base image (scripts/bootstrap-base-image.sh) and a release build.
# Usage: scripts/bench/sandbox.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/release/lego-rl
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 2; }
scripts/bootstrap-base-image.sh
tasks=testdata/tasks/tasks.jsonl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^lego-rl/(task|env)-' | xargs -r docker rmi -f >/dev/null
t0=$(date +%s.%N)
LEGO_RL_NO_PROGRESS=1 $bin build-images -j 2 -i $tasks -o "$out/cold.jsonl.zst" 2>"$out/cold.log"
t1=$(date +%s.%N)
LEGO_RL_NO_PROGRESS=1 $bin build-images -j 2 -i $tasks -o "$out/warm.jsonl.zst" 2>"$out/warm.log"
t2=$(date +%s.%N)
cold=$(echo "$t1 - $t0" | bc -l)
warm=$(echo "$t2 - $t1" | bc -l)
printf 'build-images, %s tasks: cold %.1fs, cache hit %.2fs, speed-up %.1fx\n' \
  "$(wc -l <$tasks)" "$cold" "$warm" "$(echo "$cold / $warm" | bc -l)"
tail -1 "$out/warm.log"

# Trial setup latency: 8 setups of one task, measured by the engine round trips of the setup stage.
python3 - "$bin" <<'EOF'
import json, subprocess, sys, time, statistics
# The setup stage is exercised through `docker` here only to time the same operations the trial performs
# (network create, container create/start, squash script) without a rollout subcommand yet.
img = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout
tag = next(l for l in img.splitlines() if l.startswith("lego-rl/task-inflection"))
lat = []
for i in range(8):
    name = f"lego-rl-bench-{i}"
    t = time.time()
    subprocess.run(["docker", "network", "create", "--internal", "-o", "com.docker.network.bridge.inhibit_ipv4=true",
                    "--label", "lego-rl.run-id=bench", name + "-net"], check=True, capture_output=True)
    subprocess.run(["docker", "run", "-d", "--name", name, "--label", "lego-rl.run-id=bench", "--network", name + "-net",
                    "--pids-limit", "512", "-m", "4g", tag, "sleep", "infinity"], check=True, capture_output=True)
    subprocess.run(["docker", "exec", name, "bash", "-c",
                    "cd /testbed && rm -rf .git && git init -q && git add -A && git -c user.name=a -c user.email=a@b commit -qm base && chown -R agent /testbed"],
                   check=True, capture_output=True)
    lat.append(time.time() - t)
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    subprocess.run(["docker", "network", "rm", name + "-net"], capture_output=True)
lat.sort()
p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))]
print(f"trial create->ready: p50 {statistics.median(lat):.2f}s  p95 {p95:.2f}s  (n={len(lat)})")
EOF

# Agent runtime volume: remove the mini-swe-agent volume (skipped while a container uses it), rebuild, reuse.
harness=examples/harnesses/mini-swe-agent.toml
docker volume ls -q --filter label=lego-rl.runtime=mini-swe-agent | xargs -r docker volume rm >/dev/null 2>&1 || true
t0=$(date +%s.%N)
LEGO_RL_NO_PROGRESS=1 $bin build-images --harness $harness 2>"$out/rt-cold.log"
t1=$(date +%s.%N)
LEGO_RL_NO_PROGRESS=1 $bin build-images --harness $harness 2>"$out/rt-warm.log"
t2=$(date +%s.%N)
cold=$(echo "$t1 - $t0" | bc -l)
warm=$(echo "$t2 - $t1" | bc -l)
printf 'runtime mini-swe-agent: build %.1fs (%s), cache hit %.2fs, speed-up %.1fx\n' \
  "$cold" "$(grep -o 'built\|cached' "$out/rt-cold.log" | head -1)" "$warm" "$(echo "$cold / $warm" | bc -l)"
