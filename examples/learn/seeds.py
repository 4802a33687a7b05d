#!/usr/bin/env python3
"""Held-out reward at the warm start and at the end, per learn run and pooled over runs (seeds).

    examples/learn/seeds.py RUN|NAME=K0/N0,K1/N1 ...

    e.g. examples/learn/seeds.py runs/learn-s3 run10=38/96,50/96   # a run dir, and a run's counts

For each run directory it reads the warm start's version (RUN/warmstart/version) and compares the
held-out evaluation of that version with the run's last finished one (the highest
eval/step-V.jsonl.zst with its .done marker):
rewarded / graded samples at both ends, the difference, and its standard error
sqrt(p0 q0 / n0 + p1 q1 / n1) (two independent binomial samples). Trials the infrastructure failed
(`infra_failure`, or a termination `infra:STAGE`) and ungraded ones are left out, as in `report`.

An argument NAME=K0/N0,K1/N1 stands for a run whose directory is gone (runs are not committed): its
rewarded/graded counts at the warm start and at the end, as examples/learn/README.md records them.

The last line pools every run's samples at each end: the proof's claim over seeds, one number with
one standard error, instead of one seed's noisy difference. The seeds' warm starts differ, and a sum
of binomials with different rates varies less than one binomial at their mean rate, so the pooled
standard error errs on the large side. A run whose only finished evaluation is the warm start's
(still running) is skipped with a note.
"""
import math
import pathlib
import sys

from evalfiles import graded, records


def tally(path):
    """(rewarded, graded) over the graded, non-infra trajectories of one evaluation file."""
    rs = [r["reward"] for r in records(path) if graded(r)]
    return sum(r == 1.0 for r in rs), len(rs)


def diff(a, b):
    """(p1 - p0, its standard error) for a = (k0, n0), b = (k1, n1)."""
    (k0, n0), (k1, n1) = a, b
    p0, p1 = k0 / n0, k1 / n1
    return p1 - p0, math.sqrt(p0 * (1 - p0) / n0 + p1 * (1 - p1) / n1)


def row(name, v0, v1, a, b):
    d, se = diff(a, b)
    z = f"{d / se:+.1f}" if se > 0 else "-"
    return (f"| {name} | {v0} → {v1} | {a[0]}/{a[1]} = {a[0] / a[1]:.3f} | {b[0]}/{b[1]} = "
            f"{b[0] / b[1]:.3f} | {d:+.3f} ± {se:.3f} | {z} |")


def counts(arg):
    """(name, v0, v1, (k0, n0), (k1, n1)) of one argument, or None for a run still at its warm start."""
    if "=" in arg:
        name, _, spec = arg.partition("=")
        try:
            a, b = (tuple(int(x) for x in c.split("/")) for c in spec.split(","))
        except ValueError:
            a = b = ()
        if not all(len(c) == 2 and 0 <= c[0] <= c[1] and c[1] > 0 for c in (a, b)):
            sys.exit(f"{arg}: expected NAME=K0/N0,K1/N1 (rewarded/graded at the warm start, at the end)")
        return name, "-", "-", a, b
    run = pathlib.Path(arg)
    v0, v1, a, b = evaluations(run)
    if v1 == v0:
        print(f"{run}: only the warm start is evaluated so far; skipped", file=sys.stderr)
        return None
    return str(run), v0, v1, a, b


def evaluations(run):
    """(v0, v1, (k0, n0), (k1, n1)) of run directory `run`: the warm start's version and the last
    finished evaluation's, with the rewarded / graded samples of each; the counts are None while
    the warm start's is the only finished one, v1 == v0 (also read by arms.py)."""
    try:
        v0 = int((run / "warmstart" / "version").read_text().strip())
    except (OSError, ValueError) as e:
        sys.exit(f"{run}/warmstart/version: cannot read the warm start's version: {e}")
    # Only finished evaluations: run.sh touches eval/step-V.jsonl.zst.done after the file.
    done = sorted(int(p.name[5:11]) for p in (run / "eval").glob("step-*.jsonl.zst.done"))
    if v0 not in done:
        sys.exit(f"{run}/eval: no finished evaluation of the warm start (version {v0})")
    v1 = done[-1]
    if v1 == v0:
        return v0, v1, None, None
    a, b = (tally(run / "eval" / f"step-{v:06d}.jsonl.zst") for v in (v0, v1))
    if a[1] == 0 or b[1] == 0:
        sys.exit(f"{run}/eval: no graded samples in version {v0 if a[1] == 0 else v1}")
    return v0, v1, a, b


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [c for c in map(counts, sys.argv[1:]) if c]
    if not runs:
        sys.exit("no run has a finished final evaluation")
    print("| run | versions | warm start | end | Δ ± SE | Δ / SE |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(row(*r))
    if len(runs) > 1:
        pool = lambda i: (sum(r[i][0] for r in runs), sum(r[i][1] for r in runs))
        print(row(f"pooled ({len(runs)} runs)", "-", "-", pool(3), pool(4)))


if __name__ == "__main__":
    main()
