#!/usr/bin/env python3
"""Generates the tiny Qwen3-MoE test checkpoint and its transformers reference, deterministically.

The checkpoint is 39 MB (the real 151936-token vocabulary, tied embeddings), too big to commit,
so tests and setup produce it here instead: hidden 64, 3 layers with layer 1 dense
(``mlp_only_layers``), 8 experts, top-2, ``norm_topk_prob``, float32, seeded random weights, written
by transformers in its own (newer) config layout (``num_local_experts``/``rope_parameters``/``dtype``
where the installed version writes those). ``reference.json`` holds next-token log-probs and the
router top-2 per MoE layer from transformers (see hf_reference.py).

The real Qwen3 tokenizer and chat template (testdata/tokenizer/qwen3) are copied in, as in a
published checkpoint.

Idempotent: only adds missing tokenizer files when OUT already has reference.json. Writes into a temp dir and renames,
so concurrent runs or a crash never leave a half-written OUT.

Usage: make_tiny_models.py [OUT]   (default testdata/models/generated/tiny-qwen3-moe)
"""
import os
import random
import shutil
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import reference  # noqa: E402


def build(out):
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=4096,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        # The default init leaves the router near uniform; widen it so that routing margins are
        # far above fp32 noise and a small perturbation still changes some routes.
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(out)
    rng = random.Random(0)
    sequences = [
        {"name": "random40", "input_ids": [rng.randrange(151643) for _ in range(40)]},
        {"name": "random17", "input_ids": [rng.randrange(151643) for _ in range(17)]},
        {"name": "chat", "input_ids": [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]},
    ]
    ref = reference(out, sequences)
    ref["model"] = "tiny-qwen3-moe (scripts/make_tiny_models.py)"
    import json

    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "tokenizer", "qwen3")


def add_tokenizer(out):
    """Copies the real Qwen3 tokenizer and chat template in, as a published checkpoint has them
    (rollout's embedded backend reads them from the checkpoint; train-step copies them on)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        dst = os.path.join(out, name)
        if not os.path.isfile(dst):
            shutil.copyfile(os.path.join(TOKENIZER, name), dst + ".tmp")
            os.rename(dst + ".tmp", dst)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "testdata/models/generated/tiny-qwen3-moe"
    if os.path.isfile(os.path.join(out, "reference.json")):
        add_tokenizer(out)
        return
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-", dir=parent)
    try:
        build(tmp)
        add_tokenizer(tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "reference.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
