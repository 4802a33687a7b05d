#!/usr/bin/env python3
"""Benchmark peer for `lego-rl train-step`: a straightforward PyTorch GSPO step.

make-samples CKPT OUT.jsonl N LEN PROMPT SEED
    Writes N samples (groups of 4, LEN tokens, the first PROMPT tokens are prompt) whose rollout
    log-probs and routing come from transformers on CKPT, in lego-rl's sample format.
step CKPT SAMPLES.jsonl
    Runs the same step as lego-rl in plain PyTorch on transformers' Qwen3-MoE: π_old recomputed
    without gradients, sequence-level GSPO loss (eps 3e-4/4e-4, group-normalised advantages),
    forward+backward over the batch, grad clip 1.0, AdamW. Prints tokens/s (all tokens of the
    batch over the step's wall time, as lego-rl's step metrics count them). No routing replay:
    transformers has none, which only makes this peer cheaper.
step-bf16 CKPT SAMPLES.jsonl
    The same step with the model in bfloat16 and fp32 master weights, as mixed precision does it
    in PyTorch (Megatron, FSDP): AdamW on fp32 copies of the parameters, gradients upcast to fp32
    and clipped there, the bf16 weights copied from the updated masters. The bf16 column of
    scripts/bench/train.sh.
"""
import base64
import json
import random
import sys
import time

import numpy as np
import torch
import transformers


def load(ckpt, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager")


def make_samples(ckpt, out, n, length, prompt, seed):
    model = load(ckpt).eval()
    rng = random.Random(seed)
    captured = []
    # Qwen3.5's vision-language wrapper keeps the decoder in `model.language_model`.
    for layer in getattr(model.model, "language_model", model.model).layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            gate.register_forward_hook(lambda _m, _i, o: captured.append(o[2].clone()))
    with open(out, "w") as f:
        for i in range(n):
            ids = [rng.randrange(min(151643, getattr(model.config, "text_config", model.config).vocab_size)) for _ in range(length)]
            captured.clear()
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            lp = torch.log_softmax(logits.float(), -1)[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
            rollout = lp[prompt - 1 :].numpy().astype("<f4")
            routing = torch.stack(captured, 1).numpy().astype("u1")
            group, member = divmod(i, 4)
            rec = {
                "schema": "lego-rl/sample/v1",
                "id": f"t{i}#0.0",
                "trajectory_id": f"t{i}",
                "task_id": f"task{group}",
                "group_id": group,
                "sample_index": member,
                "token_ids": ids,
                "loss_mask": [prompt, length - prompt],
                "rollout_logprobs": {"dtype": "f32", "shape": [len(rollout)], "data": base64.b64encode(rollout.tobytes()).decode()},
                "routing": {"dtype": "u8", "shape": list(routing.shape), "data": base64.b64encode(routing.tobytes()).decode()},
                "reward": float(rng.random() < 0.5),
                "weight": 1.0,
                "policy_version": 0,
            }
            f.write(json.dumps(rec) + "\n")


def step(ckpt, samples_path, bf16=False):
    model = load(ckpt, torch.bfloat16 if bf16 else torch.float32).train()
    samples = [json.loads(line) for line in open(samples_path)]
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone().requires_grad_(True) for p in params] if bf16 else params
    opt = torch.optim.AdamW(masters, lr=1e-6, weight_decay=0.01)
    t0 = time.perf_counter()
    ids = torch.tensor([s["token_ids"] for s in samples])
    prompt = samples[0]["loss_mask"][0]
    rewards = torch.tensor([s["reward"] for s in samples]).view(-1, 4)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=False, keepdim=True) + 1e-6)).view(-1)

    def policy_logprobs():
        logits = model(input_ids=ids, use_cache=False).logits[:, prompt - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(2, ids[:, prompt:].unsqueeze(2)).squeeze(2)

    with torch.no_grad():
        old = policy_logprobs()
    lp = policy_logprobs()
    s = torch.exp((lp - old).mean(1))
    loss = -torch.min(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv).mean()
    loss.backward()
    if bf16:
        for m, p in zip(masters, params):
            m.grad = None if p.grad is None else p.grad.float()
    torch.nn.utils.clip_grad_norm_(masters, 1.0)
    opt.step()
    if bf16:
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"tokens_per_second": ids.numel() / elapsed, "seconds": elapsed, "loss": loss.item(), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["make-samples"]:
        a = sys.argv[2:]
        make_samples(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    elif sys.argv[1:2] == ["step"]:
        step(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["step-bf16"]:
        step(sys.argv[2], sys.argv[3], bf16=True)
    else:
        sys.exit(__doc__)
