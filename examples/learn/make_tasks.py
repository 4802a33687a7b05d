#!/usr/bin/env python3
"""Writes the "echo-word" task family of the learning benchmark (examples/learn/README.md).

Each task is a Harbor task directory whose instruction names one word; the verifier gives reward 1
when /app/answer.txt holds exactly that word, else 0. The intended solution is one bash tool call,

    echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo <word> > /app/answer.txt

which mini-swe-agent runs and then submits (the first output line is its submit marker), so a trial
is a single generation. The only task-specific part of the answer is the word, stated in the
instruction.

Tasks are WORDS x phrasings(), the phrasings being OPENERS x CLOSERS (64) followed by the word said
REPEAT more times. Held-out tasks are the 8 phrasings (opener i, closer i): every held-out phrasing is
new (its words were seen, in other combinations), so a policy that only memorised its training
phrasings gains nothing there. Train: the other 56 phrasings x 3 words = 168 tasks. The
forced-scripts file (lego-rl/forced/v1) holds the correct command for the demonstration tasks
(DEMOS per word, spread over the phrasings), which `rollout --forced` pushes through the proxy to make
the warm-start demonstrations. `order.txt` is the GSPO task order: seeded, one task of each word per
consecutive triple, so a batch of 3 tasks has every word once.

Deterministic. Usage: make_tasks.py OUT_DIR [SEED]
  OUT_DIR/train/<id>/, OUT_DIR/heldout/<id>/   Harbor task directories
  OUT_DIR/demos.forced.json                     scripted correct outputs for the demo tasks
  OUT_DIR/order.txt                             training task ids in GSPO order (SEED, default 1)
"""
import json
import os
import random
import sys

# Single Qwen3 tokens with a leading space, so copying the word is copying one token.
WORDS = ["red", "blue", "green"]
# The path is absolute: mini-swe-agent runs its commands in its own working directory, not /app.
OPENERS = [
    "Write the word {w} into /app/answer.txt.",
    "Create /app/answer.txt containing only {w}.",
    "The answer is {w}.",
    "Put {w} in /app/answer.txt.",
    "Your task: save {w} to /app/answer.txt.",
    "Please store the word {w} in the file /app/answer.txt.",
    "We need {w} written to /app/answer.txt.",
    "Record {w} as the answer in /app/answer.txt.",
]
CLOSERS = [
    "The word is {w}.",
    "Only {w}, nothing else.",
    "Save {w} and submit.",
    "The file must say {w}.",
    "Remember: {w}.",
    "Write {w} and then submit.",
    "It has to be exactly {w}.",
    "Then submit; the answer is {w}.",
]
# The word is then said REPEAT more times. Why: a random 2-layer model attends almost uniformly
# over the ~200 prompt tokens, and the word's share of that attention decides whether copying is
# found at all. Measured outside the pipeline (transformers, the same model and prompts): with the
# word named twice, SFT on all 168 training tasks stayed at chance (p(correct word) 0.33 after 130
# steps); with 16 more mentions, SFT on 9 demonstrations reached 0.69 on unseen phrasings after 40
# steps, and word-level group-relative RL from a 30-step warm start went 0.32 -> 0.90 in 60 steps.
REPEAT = 16
# Warm-start demonstrations per word (phrasings spread over the training set).
DEMOS_PER_WORD = 3


def phrasings(repeat=REPEAT):
    """The 64 instruction templates ({w} = the word); phrasing j is (opener j // 8, closer j % 8)."""
    return [o + " " + c + " " + " ".join(["{w}"] * repeat) for o in OPENERS for c in CLOSERS]


def heldout(j):
    """Phrasing j is held out when its opener and closer index agree."""
    return j // len(CLOSERS) == j % len(CLOSERS)


def task_id(word, j):
    return f"echo-{word}-p{j:02d}"


def train_ids(word):
    return [task_id(word, j) for j in range(len(OPENERS) * len(CLOSERS)) if not heldout(j)]


def demo_ids():
    """DEMOS_PER_WORD training tasks per word, spread out, on different phrasings for each word."""
    out = []
    for i, w in enumerate(WORDS):
        ids = train_ids(w)
        step = len(ids) // DEMOS_PER_WORD
        out += [ids[(k * step + i * 7) % len(ids)] for k in range(DEMOS_PER_WORD)]
    return out


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
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    demos = {tid: None for tid in demo_ids()}
    for i, w in enumerate(WORDS):
        for j, t in enumerate(phrasings()):
            split = "heldout" if heldout(j) else "train"
            tid = task_id(w, j)
            d = os.path.join(out, split, tid)
            write(os.path.join(d, "task.toml"), TASK_TOML)
            write(os.path.join(d, "instruction.md"), t.format(w=w) + "\n")
            write(os.path.join(d, "environment", "Dockerfile"), DOCKERFILE)
            write(os.path.join(d, "tests", "test.sh"), TEST_SH.replace("{w}", w), 0o755)
            write(os.path.join(d, "solution", "solve.sh"), f"#!/bin/bash\n{command(w)}\n", 0o755)
            if tid in demos:
                demos[tid] = [[output(w)]]
    write(
        os.path.join(out, "demos.forced.json"),
        json.dumps({"schema": "lego-rl/forced/v1", "tasks": demos}, indent=2) + "\n",
    )
    rng = random.Random(seed)
    train = {w: train_ids(w) for w in WORDS}
    for w in WORDS:
        rng.shuffle(train[w])
    order = [train[w][k] for k in range(len(train[WORDS[0]])) for w in WORDS]
    write(os.path.join(out, "order.txt"), "\n".join(order) + "\n")


if __name__ == "__main__":
    main()
