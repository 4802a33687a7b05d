#!/usr/bin/env python3
"""Reference numbers from transformers for a Hugging Face checkpoint directory.

Loads CKPT with transformers' own Qwen3 / Qwen3-MoE classes (float32, CPU, eager attention),
runs each sequence of IDS_JSON (``{"sequences": [{"name", "input_ids"}]}``) and writes
``next_token_logprobs[t] = log_softmax(logits[t])[ids[t+1]]`` and, for MoE models, the router's
top-k expert ids per MoE layer and position (``topk_experts[layer][pos]``, descending
probability) to OUT. A sequence with ``"sampling": {"temperature", "top_k", "top_p"}`` also gets
``processed_logprobs[t]``: the log-prob of ``ids[t+1]`` under the distribution a sampler with
those settings draws from, computed with transformers' own logits warpers (temperature, then
top-k, then top-p: generate()'s order), i.e. log_softmax(logits / T) renormalised over the kept
tokens (``null`` for a token outside them). Used by lego-rl's tests to prove that checkpoints lego-rl writes load in
transformers and compute the same function, and by make_tiny_models.py.

Usage: hf_reference.py CKPT IDS_JSON OUT [CKPT IDS_JSON OUT ...]
(several triples share one interpreter start: importing torch and transformers is the slow part)
"""
import json
import sys

import torch
import transformers


def warp(scores, sampling):
    """Applies transformers' temperature, top-k and top-p warpers to ``[N, V]`` scores."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = [TemperatureLogitsWarper(float(sampling.get("temperature", 1.0)))]
    if sampling.get("top_k"):
        warpers.append(TopKLogitsWarper(int(sampling["top_k"])))
    if sampling.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(float(sampling["top_p"])))
    for w in warpers:
        scores = w(None, scores)
    return scores


def reference(ckpt, sequences):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cfg = getattr(model.config, "text_config", model.config)
    moe = getattr(cfg, "num_experts", 0) or getattr(cfg, "num_local_experts", 0)
    captured = []
    hooks = []
    # Qwen3.5's vision-language wrapper keeps the decoder in `model.language_model`.
    layers = getattr(model.model, "language_model", model.model).layers
    if moe:
        for layer in layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                hooks.append(gate.register_forward_hook(lambda _m, _i, out: captured.append(out[2].clone())))
    out = []
    for seq in sequences:
        ids = torch.tensor([seq["input_ids"]], dtype=torch.long)
        captured.clear()
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
        lsm = torch.log_softmax(logits, dim=-1)
        lp = lsm[:-1].gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
        rec = {
            "name": seq.get("name", ""),
            "input_ids": seq["input_ids"],
            "next_token_logprobs": lp.tolist(),
            "logits_last3_first16": logits[-3:, :16].tolist(),
        }
        if seq.get("sampling"):
            warped = warp(logits[:-1], seq["sampling"])
            plsm = torch.log_softmax(warped, dim=-1)
            lp_proc = plsm.gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1).tolist()
            # A prompt token outside the support has probability 0: null (JSON has no -inf).
            rec["processed_logprobs"] = [x if x > float("-inf") else None for x in lp_proc]
        if moe:
            rec["topk_experts"] = [c.tolist() for c in captured]
        out.append(rec)
    for h in hooks:
        h.remove()
    return {
        "generated_by": "scripts/hf_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "sequences": out,
    }


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    for ckpt, ids_json, out in zip(args[0::3], args[1::3], args[2::3]):
        with open(ids_json) as f:
            sequences = json.load(f)["sequences"]
        with open(out, "w") as f:
            json.dump(reference(ckpt, sequences), f)


if __name__ == "__main__":
    main()
