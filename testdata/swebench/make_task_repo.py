#!/usr/bin/env python3
"""Writes testdata/swebench/task-repo: the records of swebench_full_test__swe-agent-debug.jsonl in the
swebench 5.x task-repository layout (sweb.yaml; tasks/<instance_id>/ with task.yaml, tests.json,
problem_statement.md, hints.md when non-empty, gold.patch, test.patch, eval.sh, Dockerfile).

The record fields are the real ones, unchanged. What a record does not carry is made up here and
marked so: eval.sh and Dockerfile are stand-ins, `image` follows swebench's naming convention, and
every task is in split `test` of dataset SWE-bench/SWE-bench. task.yaml is written the way
swebench writes it (PyYAML, keys sorted, block style, multi-line strings as literal blocks).

Usage: .venv/bin/python testdata/swebench/make_task_repo.py
"""
import json
import pathlib
import shutil

import yaml

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "task-repo"
AS_FILE = {"patch": "gold.patch", "test_patch": "test.patch", "problem_statement": "problem_statement.md"}


class Dumper(yaml.SafeDumper):
    pass


Dumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "tasks").mkdir(parents=True)
    (OUT / "sweb.yaml").write_text(yaml.safe_dump({"datasets": ["SWE-bench/SWE-bench"], "splits": ["test"]}))
    for line in (HERE / "swebench_full_test__swe-agent-debug.jsonl").read_text().splitlines():
        rec = json.loads(line)
        iid = rec["instance_id"]
        d = OUT / "tasks" / iid
        d.mkdir()
        for column, name in AS_FILE.items():
            with open(d / name, "w", newline="") as fh:
                fh.write(rec.pop(column))
        hints = rec.pop("hints_text")
        if hints:
            with open(d / "hints.md", "w", newline="") as fh:
                fh.write(hints)
        tests = {k: rec.pop(k) for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
        (d / "tests.json").write_text(json.dumps(tests, indent=2, ensure_ascii=False) + "\n")
        image = "swebench/sweb.eval.x86_64.%s:latest" % iid.replace("__", "_1776_")
        meta = dict(rec, split="test", datasets=["SWE-bench/SWE-bench"], image=image)
        (d / "task.yaml").write_text(
            yaml.dump(meta, Dumper=Dumper, sort_keys=True, allow_unicode=True, default_flow_style=False)
        )
        (d / "eval.sh").write_text("#!/bin/bash\n# fixture stand-in for the generated eval script\nset -uxo pipefail\n")
        (d / "Dockerfile").write_text(f"FROM {image}\n")


if __name__ == "__main__":
    main()
