#!/usr/bin/env python3
"""Writes the random dense Qwen3 of the learning benchmark (examples/learn/README.md), deterministically.

Hidden 128, 2 layers, 4 heads (2 KV heads), head_dim 32, MLP 384, the real 151936-token Qwen3
vocabulary with tied embeddings (the real tokenizer and chat template are copied in), float32,
weights from torch.manual_seed(SEED). About 20 M parameters (80 MB), so it is generated at run time,
not committed. Writes into a temp dir and renames; does nothing when OUT already has config.json.

Usage: make_model.py OUT [SEED]   (SEED default 0)
"""
import os
import shutil
import sys
import tempfile

import torch
import transformers

TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "tokenizer", "qwen3")


def config():
    """The model's transformers config (simulate.py builds the same model)."""
    return transformers.Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def build(out, seed):
    torch.manual_seed(seed)
    transformers.Qwen3ForCausalLM(config()).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(os.path.join(TOKENIZER, name), os.path.join(out, name))


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) == 3 else 0
    if os.path.isfile(os.path.join(out, "config.json")):
        return
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".learn-model-", dir=parent)
    try:
        build(tmp, seed)
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
