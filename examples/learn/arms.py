#!/usr/bin/env python3
"""Plain GSPO against dynamic sampling at an equal trial budget, per seed and pooled (issue 39).

    examples/learn/arms.py PLAIN_RUN DYN_RUN [PLAIN_RUN DYN_RUN ...]

    e.g. examples/learn/arms.py runs/cmp-s1-plain runs/cmp-s1-dyn runs/cmp-s2-plain runs/cmp-s2-dyn

Each pair is one seed's two learn runs (run.sh with LEGO_RL_TRIAL_BUDGET, the second with
LEGO_RL_MIN_INFORMATIVE), started from the same warm start: the same seed, or one warm-start run
copied into both directories. Per arm it reads the held-out evaluations of the warm start and of the
last finished version (as seeds.py), the train trials sampled (every trajectory of trajectories/,
those of dropped zero-variance groups included: the budget's currency), the groups sampled and the
share of them whose graded rewards do not vary (no GSPO gradient: dynamic sampling drops them, the
plain arm trains on them with zero advantage), the extra groups dynamic sampling drew, and the
optimizer updates made (lines of metrics.jsonl.zst; a batch with no informative group makes none).

The last lines pool the seeds: each arm's held-out reward at the end over all its samples, the
difference dynamic - plain with its standard error (independent binomials, as seeds.py), and the
ratio dynamic / plain, the figure scripts/bench/dynamic_sampling.sh prints for the simulation.
"""
import collections
import math
import pathlib
import sys

from evalfiles import graded, records
from seeds import diff, evaluations


def batches(run):
    """(trials, groups, zero-variance groups, extra groups) over the run's GSPO batches."""
    trials = groups = flat = extra = 0
    for path in sorted((run / "trajectories").glob("step-*.jsonl.zst")):
        by_group = collections.defaultdict(list)
        for r in records(path):
            trials += 1
            by_group[(r["task_id"], r["group_id"])].append(r)
        for rs in by_group.values():
            groups += 1
            rewards = {r["reward"] for r in rs if graded(r)}
            flat += len(rewards) < 2
            extra += (rs[0].get("dynamic_sampling") or {}).get("extra_group") is not None
    return trials, groups, flat, extra


def updates(run):
    path = run / "metrics.jsonl.zst"
    return sum(1 for _ in records(path)) if path.exists() else 0


def arm(run):
    run = pathlib.Path(run)
    v0, v1, a, b = evaluations(run)
    if v1 == v0:
        sys.exit(f"{run}/eval: needs finished evaluations of the warm start (version {v0}) and of a later version")
    return dict(run=run, v0=v0, v1=v1, start=a, end=b, batches=batches(run), updates=updates(run))


def rate(c):
    return f"{c[0]}/{c[1]} = {c[0] / c[1]:.3f}"


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    pairs = [(arm(p), arm(d)) for p, d in zip(args[::2], args[1::2])]
    print("| arm | run | versions | warm start | end | Δ ± SE | train trials | groups | zero-variance | extra groups | updates |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pair in pairs:
        for name, x in zip(("plain", "dynamic"), pair):
            d, se = diff(x["start"], x["end"])
            t, g, flat, extra = x["batches"]
            print(f"| {name} | {x['run'].name} | {x['v0']} → {x['v1']} | {rate(x['start'])} | {rate(x['end'])} | "
                  f"{d:+.3f} ± {se:.3f} | {t} | {g} | {flat} ({flat / max(g, 1):.2f}) | {extra} | {x['updates']} |")
    pool = lambda i, key: tuple(sum(p[i][key][j] for p in pairs) for j in (0, 1))
    plain, dyn = pool(0, "end"), pool(1, "end")
    d, se = diff(plain, dyn)
    print()
    print(f"pooled over {len(pairs)} seed(s), held-out reward at the end: plain {rate(plain)}, dynamic {rate(dyn)}")
    z = f"{d / se:+.1f} SE" if se > 0 else "-"
    ratio = (dyn[0] / dyn[1]) / (plain[0] / plain[1]) if plain[0] else math.inf
    print(f"dynamic - plain: {d:+.3f} ± {se:.3f} ({z}); dynamic / plain: {ratio:.3f}")


if __name__ == "__main__":
    main()
