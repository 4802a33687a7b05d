#!/usr/bin/env bash
# Dynamic sampling benchmark (issue 39): on the echo-word task of examples/learn, learning with and
# without dynamic sampling at the same budget of sampled trials, over several seeds. It runs the
# simulation examples/learn/simulate.py --arms fixed,dynamic (the same random model, real tokenizer,
# chat template and prompts, SFT warm start, then group-relative RL on the word alone; minutes per
# seed), not the real pipeline (about an hour per run here; examples/learn/run.sh with
# LEGO_RL_MIN_INFORMATIVE runs that comparison). Per seed both arms start from the same warm start
# and random state:
#   fixed    one training task per word × GROUP samples, one update per batch; a zero-variance group
#            (all samples right or all wrong) gets zero advantage
#   dynamic  the same planned groups, then extra groups from the training pool until the batch holds
#            N informative groups or M extra groups are spent; zero-variance groups are dropped
# Every sampled trial counts against the budget, those of dropped groups included. Prints per seed
# held-out and train p(correct word) at the budget checkpoints, then per arm the mean over seeds of
# held-out p(correct) at the full budget, the ratio dynamic / fixed, trials spent, updates made and
# the fraction of sampled groups with zero variance (dropped by `dynamic`, trained on with weight 0
# by `fixed`).
# Usage: scripts/bench/dynamic_sampling.sh [BUDGET] [SEEDS]   (default 960 1,2,3)
# Environment: LEGO_RL_PYTHON [.venv/bin/python, made by scripts/setup.sh]; LEGO_RL_DYN_N [3],
# LEGO_RL_DYN_MAX_EXTRA [4 x N, rollout's default]; LEGO_RL_DYN_SFT_STEPS [40, run.sh's];
# LEGO_RL_DYN_CHECKPOINTS [8]; LEGO_RL_DYN_JOBS seeds run at once [1], each on one torch thread.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${LEGO_RL_PYTHON:-$root/.venv/bin/python}
budget=${1:-960}
seeds=${2:-1,2,3}
n=${LEGO_RL_DYN_N:-3}
m=${LEGO_RL_DYN_MAX_EXTRA:-$((4 * n))}
sft=${LEGO_RL_DYN_SFT_STEPS:-40}
checkpoints=${LEGO_RL_DYN_CHECKPOINTS:-8}
jobs=${LEGO_RL_DYN_JOBS:-1}
[ -x "$py" ] || { echo "dynamic_sampling: $py not found (run scripts/setup.sh or set LEGO_RL_PYTHON)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error
start=$(date +%s)
echo "budget $budget trials per arm, seeds $seeds, N=$n informative groups, M=$m extra groups, $sft SFT steps" >&2
pids=()
for seed in ${seeds//,/ }; do
  "$py" examples/learn/simulate.py --seed "$seed" --sft-steps "$sft" --arms fixed,dynamic --budget "$budget" \
    --checkpoints "$checkpoints" --min-informative "$n" --max-extra "$m" >"$out/seed-$seed.txt" 2>"$out/seed-$seed.err" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || { cat "$out"/seed-*.err >&2; exit 1; }
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || { cat "$out"/seed-*.err >&2; exit 1; }; done
"$py" - "$out" "$seeds" <<'EOF'
import statistics, sys
out, seeds = sys.argv[1], sys.argv[2].split(",")
kv = lambda line: dict(x.split("=", 1) for x in line.split()[1:])
res, ckpt = {}, {}
for s in seeds:
    for line in open(f"{out}/seed-{s}.txt"):
        if line.startswith("result "):
            r = kv(line)
            res[(s, r["arm"])] = r
        elif line.startswith("ckpt "):
            r = kv(line)
            ckpt[(s, r["arm"], int(r["budget"]))] = r
arms = ["fixed", "dynamic"]
marks = sorted({b for (_, _, b) in ckpt})
for s in seeds:
    print(f"seed {s}: p(correct word) by trials sampled (held-out / train; updates made)")
    print(f"{'trials':>7} " + " ".join(f"{a:>24}" for a in arms))
    for b in marks:
        cell = lambda a: (lambda r: f"{float(r['heldout']):.3f} / {float(r['train']):.3f} ({r['updates']:>3})")(ckpt[(s, a, b)])
        print(f"{b:>7} " + " ".join(f"{cell(a):>24}" for a in arms))
    for a in arms:
        r = res[(s, a)]
        print(f"  {a:>7}: {r['trials']} trials, {r['batches']} batches, {r['updates']} updates, {r['groups']} groups, "
              f"zero-variance {float(r['zero_variance']):.3f}, extra groups {r['extra']}, "
              f"batches short of N {r['short_batches']}, sampled reward {float(r['sampled_reward']):.3f}, "
              f"held-out by word {r['heldout_by_word']}")
    print()
mean = lambda xs: sum(xs) / len(xs)
print(f"mean over seeds {','.join(seeds)}: held-out p(correct) by trials sampled")
print(f"{'trials':>7} {'fixed':>8} {'dynamic':>8} {'dyn/fixed':>9}")
for b in marks:
    f_, d_ = (mean([float(ckpt[(s, a, b)]["heldout"]) for s in seeds]) for a in arms)
    print(f"{b:>7} {f_:>8.3f} {d_:>8.3f} {d_ / f_:>9.3f}")
print()
print(f"{'arm':>8} {'held-out':>8} {'sd':>6} {'train':>6} {'trials':>7} {'updates':>7} {'zero-var groups':>15} {'extra groups':>12}")
final = {}
for a in arms:
    h = [float(res[(s, a)]["heldout"]) for s in seeds]
    final[a] = mean(h)
    sd = statistics.stdev(h) if len(h) > 1 else 0.0
    groups = sum(int(res[(s, a)]["groups"]) for s in seeds)
    zero = sum(int(res[(s, a)]["groups"]) - int(res[(s, a)]["informative"]) for s in seeds)
    print(f"{a:>8} {final[a]:>8.3f} {sd:>6.3f} {mean([float(res[(s, a)]['train']) for s in seeds]):>6.3f} "
          f"{mean([int(res[(s, a)]['trials']) for s in seeds]):>7.0f} {mean([int(res[(s, a)]['updates']) for s in seeds]):>7.1f} "
          f"{zero / groups:>15.3f} {mean([int(res[(s, a)]['extra']) for s in seeds]):>12.1f}")
print(f"held-out p(correct) at the full budget, dynamic / fixed: {final['dynamic'] / final['fixed']:.3f}")
EOF
echo "dynamic_sampling: $(($(date +%s) - start)) s" >&2
