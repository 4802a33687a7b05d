#!/usr/bin/env python3
"""Writes the "echo-word" task family of the learning benchmark (examples/learn/README.md).

Each task is a Harbor task directory whose instruction names one word; the verifier gives reward 1
when /app/answer.txt holds exactly that word, else 0. The intended solution is one bash tool call,

    echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo <word> > /app/answer.txt

which mini-swe-agent runs and then submits (the first output line is its submit marker), so a trial
is a single generation. The only task-specific part of the answer is the word, stated in the
instruction.

Tasks are the cross product WORDS x TEMPLATES. Held-out tasks are the combinations with
(word index + template index) % len(TEMPLATES) == 0: every word and every phrasing is seen in
training, but never that word with that phrasing. The forced-scripts file (lego-rl/forced/v1) holds
the correct command for the demonstration tasks (DEMOS: training tasks covering every word twice
and every phrasing), which `rollout --forced` pushes through the proxy to make the warm-start
demonstrations.

Deterministic. Usage: make_tasks.py OUT_DIR
  OUT_DIR/train/<id>/, OUT_DIR/heldout/<id>/   Harbor task directories
  OUT_DIR/demos.forced.json                     scripted correct outputs for the demo tasks
"""
import json
import os
import sys

# Single Qwen3 tokens with a leading space, so copying the word is copying one token.
WORDS = ["red", "blue", "green"]
# Each phrasing names the word twice: a 2-layer random model has to learn to attend to it, and two
# mentions double its share of a still-uniform attention (the first design, 6 words named once,
# did not learn in 12 GSPO steps: README "Runs").
# The path is absolute: mini-swe-agent runs its commands in its own working directory, not /app.
TEMPLATES = [
    "Write the word {w} into the file /app/answer.txt. The word is {w}.",
    "Create /app/answer.txt containing only the word {w}. Only {w}, nothing else.",
    "The answer is {w}. Save {w} to /app/answer.txt and submit.",
    "Put {w} in /app/answer.txt: the file must say {w}.",
]

# The warm-start demonstrations: every word twice and every phrasing at least once, so the warm
# start knows the tool-call format under each phrasing (with demonstrations of two phrasings only,
# the held-out tasks of the other two never produced a tool call, and GSPO never saw a reward
# there to learn from).
DEMOS = ["echo-red-t1", "echo-red-t3", "echo-blue-t0", "echo-blue-t2", "echo-green-t0", "echo-green-t3"]

TASK_TOML = """version = "1.0"

[metadata]
author_name = "lego-rl"
difficulty = "easy"
category = "benchmark"
tags = ["lego-rl-learn"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory = "1G"
storage = "1G"
"""

# The harness runs as an unprivileged user: /app must be writable for it.
DOCKERFILE = "FROM lego-rl/base:trixie\n\nWORKDIR /app\nRUN chmod 0777 /app\n"

TEST_SH = """#!/bin/bash
# Reward 1 when /app/answer.txt holds exactly the word (surrounding whitespace ignored), else 0.
mkdir -p /logs/verifier
got=$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)
echo "answer.txt: '$got', expected '{w}'"
if [ "$got" = "{w}" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def command(word):
    return f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo {word} > /app/answer.txt"


def output(word):
    """The Qwen3 chat-template text of the correct single tool call."""
    call = {"name": "bash", "arguments": {"command": command(word)}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    demos = {}
    for i, w in enumerate(WORDS):
        for j, t in enumerate(TEMPLATES):
            split = "heldout" if (i + j) % len(TEMPLATES) == 0 else "train"
            tid = f"echo-{w}-t{j}"
            d = os.path.join(out, split, tid)
            write(os.path.join(d, "task.toml"), TASK_TOML)
            write(os.path.join(d, "instruction.md"), t.format(w=w) + "\n")
            write(os.path.join(d, "environment", "Dockerfile"), DOCKERFILE)
            write(os.path.join(d, "tests", "test.sh"), TEST_SH.replace("{w}", w), 0o755)
            write(os.path.join(d, "solution", "solve.sh"), f"#!/bin/bash\n{command(w)}\n", 0o755)
            if tid in DEMOS:
                assert split == "train", tid
                demos[tid] = [[output(w)]]
    write(
        os.path.join(out, "demos.forced.json"),
        json.dumps({"schema": "lego-rl/forced/v1", "tasks": demos}, indent=2) + "\n",
    )


if __name__ == "__main__":
    main()
