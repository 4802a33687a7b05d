#!/usr/bin/env python3
"""Writes a deterministic synthetic SWE-bench-style pool (zstd JSONL) for scripts/bench/filter.sh.

Usage: gen_pool.py N OUT.jsonl.zst [IDS.txt]

Records carry the official fields with realistic sizes (statement ~1 KB, gold patch ~0.6 KB,
test patch ~0.8 KB, a few dozen PASS_TO_PASS entries) and a mix of rule failures (~8%),
duplicates (~2%) and, when IDS.txt is given, instance ids from that evaluation set (~1 in 2000).
"""
import json
import random
import sys

import zstandard

WORDS = ("value error function return module config parse output input index cache "
         "request response handler test expected actual wrong raise type list dict "
         "string number default option field model query field format path file").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def patch(rng, path, lines):
    body = "".join(f"-    old_{words(rng, 3).replace(' ', '_')}()\n+    new_{words(rng, 3).replace(' ', '_')}()\n"
                   for _ in range(lines))
    return (f"diff --git a/{path} b/{path}\nindex 1a2b3c4..5d6e7f8 100644\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -10,{lines + 2} +10,{lines + 2} @@ def f():\n     ctx\n{body}     ctx\n")


def main():
    n = int(sys.argv[1])
    out = sys.argv[2]
    eval_ids = open(sys.argv[3]).read().split() if len(sys.argv) > 3 else []
    rng = random.Random(1234)
    repos = [f"org{i}/project{i}" for i in range(300)]
    # Pre-generated pieces keep generation fast; ids, commits and paths stay unique per record.
    statements = [words(rng, rng.randint(60, 250)) for _ in range(4000)]
    hints = [words(rng, rng.randint(0, 40)) for _ in range(1000)]
    bodies = {}

    def fast_patch(path, lines):
        key = (lines, rng.randrange(50))
        if key not in bodies:
            bodies[key] = patch(rng, "@@PATH@@", lines)
        return bodies[key].replace("@@PATH@@", path)

    cctx = zstandard.ZstdCompressor(level=3, threads=-1)
    prev = None
    with open(out, "wb") as fh, cctx.stream_writer(fh) as w:
        buf = []
        for i in range(n):
            repo = rng.choice(repos)
            owner, name = repo.split("/")
            iid = f"{owner}__{name}-{i}"
            if eval_ids and i % 2000 == 7:
                iid = eval_ids[(i // 2000) % len(eval_ids)]
                repo = iid.split("__")[0] + "/" + iid.split("__")[1].rsplit("-", 1)[0]
            mod = f"{name}/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{i}.py"
            rec = {
                "repo": repo,
                "instance_id": iid,
                "base_commit": "%040x" % rng.getrandbits(160),
                "patch": fast_patch(mod, rng.randint(1, 8)),
                "test_patch": fast_patch(f"tests/test_{rng.choice(WORDS)}_{i % 89}.py", rng.randint(2, 12)),
                "problem_statement": f"Issue {i}: " + rng.choice(statements),
                "hints_text": rng.choice(hints),
                "created_at": "2023-05-01T12:00:00Z",
                "version": rng.choice(["0.20", "1.1", "4.2", "5.0"]),
                "FAIL_TO_PASS": json.dumps([f"tests/test_x.py::test_{i}_{k}" for k in range(rng.randint(1, 3))]),
                "PASS_TO_PASS": json.dumps([f"tests/test_x.py::test_keep_{k}" for k in range(rng.randint(0, 40))]),
                "environment_setup_commit": "%040x" % rng.getrandbits(160),
            }
            r = rng.random()
            if r < 0.03:
                rec["problem_statement"] = "short"
            elif r < 0.05:
                rec["test_patch"] = fast_patch(f"{name}/setup.py", 2)
            elif r < 0.07:
                rec["patch"] = fast_patch(mod, 400)
            elif r < 0.08:
                rec["FAIL_TO_PASS"] = "[]"
            elif r < 0.10 and prev is not None:
                dup = dict(prev)
                dup["instance_id"] = iid
                rec = dup
            prev = rec
            buf.append(json.dumps(rec))
            if len(buf) >= 10000:
                w.write(("\n".join(buf) + "\n").encode())
                buf = []
        if buf:
            w.write(("\n".join(buf) + "\n").encode())


if __name__ == "__main__":
    main()
