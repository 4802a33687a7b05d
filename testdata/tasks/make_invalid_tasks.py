#!/usr/bin/env python3
"""Writes invalid.jsonl: two deliberately invalid tasks derived from inflection__ordinal-teens in
tasks.jsonl, the fixtures of filter-tasks' validity stage (same repository bundle, base commit and
gold patch, so they reuse its environment image).

- inflection__broken-grader: FAIL_TO_PASS names a regression test that does not exercise the bug
  (it passes without the fix), so the grader accepts the unfixed code.
- inflection__flaky-order: the test patch adds a test that relies on the iteration order of a
  set of strings, which follows PYTHONHASHSEED (random per interpreter start); its 16 cases are
  in PASS_TO_PASS, so repeated runs disagree.

Run from anywhere: python3 testdata/tasks/make_invalid_tasks.py
"""
import hashlib
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = "inflection__ordinal-teens"

FLAKY = '''"""Deliberately flaky (filter-tasks validity fixture): each case assumes a two-element set of
strings iterates in insertion order, which depends on PYTHONHASHSEED (random per interpreter)."""
import pytest


@pytest.mark.parametrize("case", range(16))
def test_set_keeps_insertion_order(case):
    names = {f"first-{case}", f"second-{case}"}
    assert next(iter(names)) == f"first-{case}"
'''


def new_file_diff(path: str, text: str) -> str:
    blob = text.encode()
    sha = hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..{sha[:7]}\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def main() -> None:
    tasks = [json.loads(line) for line in (HERE / "tasks.jsonl").read_text().splitlines() if line.strip()]
    src = next(t for t in tasks if t["id"] == SOURCE)

    broken = json.loads(json.dumps(src))
    broken["id"] = "inflection__broken-grader"
    broken["fail_to_pass"] = ["tests_lego/test_regression.py::test_other_suffixes_unchanged"]
    broken["pass_to_pass"] = [t for t in src["pass_to_pass"] if t not in broken["fail_to_pass"]]
    broken["metadata"] = {**src["metadata"], "derived_from": SOURCE, "defect": "grader passes without the fix"}

    flaky = json.loads(json.dumps(src))
    flaky["id"] = "inflection__flaky-order"
    flaky["test_patch"] = src["test_patch"] + new_file_diff("tests_lego/test_flaky.py", FLAKY)
    flaky["grader"]["test_files"] = src["grader"]["test_files"] + ["tests_lego/test_flaky.py"]
    flaky["pass_to_pass"] = src["pass_to_pass"] + [
        f"tests_lego/test_flaky.py::test_set_keeps_insertion_order[{i}]" for i in range(16)
    ]
    flaky["metadata"] = {**src["metadata"], "derived_from": SOURCE, "defect": "flaky PASS_TO_PASS test"}

    with open(HERE / "invalid.jsonl", "w") as f:
        for t in (broken, flaky):
            f.write(json.dumps(t, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
