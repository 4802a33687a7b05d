#!/usr/bin/env python3
"""Benchmark peer for the embedded engine (scripts/bench/decode.sh): transformers `generate()` on CPU.

decode_reference.py CKPT PROMPT_IDS_JSON NEW_TOKENS RUNS THREADS [TEMPERATURE [TOP_P]]

Greedy decoding (or temperature sampling, top_k=0 and top_p=TOP_P [1], when TEMPERATURE > 0) of exactly NEW_TOKENS new tokens (min_new_tokens = max_new_tokens, no EOS stop) with
the KV cache, fp32, eager attention (the engine's own fp32 math), after one warm-up run, on THREADS torch
threads. Prints key=value lines and the generated ids of the first run.
"""
import json
import sys
import time

import torch
import transformers


def main():
    ckpt, prompt_path, new, runs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    temperature = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    top_p = float(sys.argv[7]) if len(sys.argv) > 7 else 1.0
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([json.load(open(prompt_path))], dtype=torch.long)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, eos_token_id=None,
              pad_token_id=0, attention_mask=torch.ones_like(ids))
    if temperature > 0:
        kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=top_p)
        torch.manual_seed(1)
    with torch.inference_mode():
        first = model.generate(ids, **kw)[0, ids.shape[1]:].tolist()  # warm-up
        assert len(first) == new, len(first)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            times.append(time.perf_counter() - t)
            assert out.shape[1] - ids.shape[1] == new
    print(f"hf_seconds_mean={sum(times) / runs:.4f}")
    print(f"hf_tok_per_s={new * runs / sum(times):.1f}")
    print(f"hf_tok_per_s_best={new / min(times):.1f}")
    print("hf_ids=" + ",".join(map(str, first)))


if __name__ == "__main__":
    main()
