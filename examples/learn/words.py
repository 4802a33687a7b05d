#!/usr/bin/env python3
"""Which word the policy wrote, per task word, in each held-out evaluation of a learn run.

    examples/learn/words.py RUN [VERSION ...]     # default: every finished evaluation of RUN

For each evaluation file (eval/step-V.jsonl.zst; without VERSIONs, those with their .done marker)
it decodes every sample's output tokens with the run's own tokenizer
(RUN/model/tokenizer.json), takes the last `echo WORD > /app/answer.txt` in it (the word the
verifier reads), and prints, per task word (from the task id `echo-WORD-pNN`), how many samples
wrote each word, how many wrote none (no parsable command), and how many were rewarded. Trials the
infrastructure failed and ungraded ones are left out, as in seeds.py and `report`. This is the
table behind "learned, by narrowing" in README.md: a rising reward can come from writing one word
for every task, which this separates from copying the task's word.
"""
import pathlib
import re
import sys
from collections import Counter, defaultdict

import tokenizers

from evalfiles import graded, records

WORDS = ("blue", "green", "red")
WRITE = re.compile(r"echo\s+(\w+)\s*>\s*/app/answer\.txt")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    run = pathlib.Path(sys.argv[1])
    tok = tokenizers.Tokenizer.from_file(str(run / "model" / "tokenizer.json"))
    wanted = {int(v) for v in sys.argv[2:]}
    files = sorted((run / "eval").glob("step-*.jsonl.zst"))
    files = [f for f in files if int(f.name[5:11]) in wanted] if wanted else [
        f for f in files if f.with_name(f.name + ".done").exists()]
    if not files:
        sys.exit(f"{run}/eval: no evaluation files")
    print("| version | task word | " + " / ".join(WORDS) + " / none | rewarded |")
    print("|---|---|---|---|")
    for f in files:
        written = defaultdict(Counter)
        rewarded = Counter()
        for r in records(f):
            if not graded(r):
                continue
            word = r["task_id"].split("-")[1]
            text = "".join(tok.decode(g["output_ids"], skip_special_tokens=False) for g in r["generations"])
            found = WRITE.findall(text)
            written[word][found[-1] if found and found[-1] in WORDS else "none"] += 1
            rewarded[word] += r.get("reward") == 1.0
        version = int(f.name[5:11])
        for word in sorted(written):
            c = written[word]
            n = sum(c.values())
            counts = " / ".join(str(c[w]) for w in (*WORDS, "none"))
            print(f"| {version} | {word} | {counts} | {rewarded[word]}/{n} |")


if __name__ == "__main__":
    main()
